/* The sm_90a backward's dQ placement: see backward_grid.h. */
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "compiler/analyze_mask.h"
#include "runtime/backward_grid.h"

/* Past this many waves of CTAs the grid is taken as balanced: no CTA's work is then more than
 * about an eighth of an SM's share (for a causal mask the first kv tile's CTA has twice the mean
 * work), and the estimate stays at tens of microseconds for calls whose shapes change. */
#define MAX_SIMULATED_WAVES 16

/* The live q tiles of each kv tile (live[kt], n_kt of them), from each q tile's live kv range;
 * every pair where there is no mask or the analysis fails. */
static void live_per_kv_tile(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                             int64_t skv, int64_t hq, const kpt_ir_value *scalars, int64_t *live,
                             int64_t n_qt, int64_t n_kt)
{
    kpt_mask_analysis *a = NULL;
    if (p->mask) {
        const kpt_mask_env env = {.sq = (int32_t)sq, .skv = (int32_t)skv, .hq = (int32_t)hq,
                                  .scalars = scalars};
        a = kpt_analyze_mask(p, &env);
    }
    /* a difference array over the kv tiles: +1 at each range's first tile, -1 past its last */
    memset(live, 0, (size_t)(n_kt + 1) * sizeof(*live));
    for (int64_t qt = 0; qt < n_qt; qt++) {
        int64_t first = 0, last = n_kt - 1;
        if (a && !kpt_mask_kv_range(a, qt * pl->bm, (qt + 1) * pl->bm, pl->bn, &first, &last))
            continue;
        live[first]++;
        live[last + 1]--;
    }
    for (int64_t kt = 1; kt < n_kt; kt++)
        live[kt] += live[kt - 1];
    kpt_mask_analysis_free(&a);
}

/* A binary min-heap of the SMs' free times. */
static void sift_down(int64_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (l + 1 < n && h[l + 1] < h[m])
            m = l + 1;
        if (m == i)
            return;
        int64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

int kpt_backward_busy_pct(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                          int64_t skv, int64_t hq, int64_t hkv, int64_t batch, int64_t sms,
                          const kpt_ir_value *scalars)
{
    const int64_t n_qt = (sq + pl->bm - 1) / pl->bm, n_kt = (skv + pl->bn - 1) / pl->bn;
    const int64_t rows = batch * hkv, group = hkv > 0 ? hq / hkv : 0;
    /* a mask that reads aux data (a block map's) is balanced as far as the host can tell: its
     * live tiles are known only on the device */
    if (n_qt <= 0 || n_kt <= 0 || rows <= 0 || sms <= 0 ||
        rows * n_kt > MAX_SIMULATED_WAVES * sms || pl->mask_loads)
        return 100;
    int64_t *live = malloc((size_t)(n_kt + 1 + sms) * sizeof(*live));
    if (!live)
        return 100;
    int64_t *heap = live + n_kt + 1;
    live_per_kv_tile(p, pl, sq, skv, hq, scalars, live, n_qt, n_kt);
    /* two steps (64-query halves) a live q tile and head, one for the CTA's own costs; each
     * CTA to the SM free first */
    memset(heap, 0, (size_t)sms * sizeof(*heap));
    int64_t total = 0, end = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t kt = 0; kt < n_kt; kt++) {
            const int64_t w = 2 * group * live[kt] + 1, t = heap[0] + w;
            heap[0] = t;
            sift_down(heap, sms, 0);
            total += w;
            end = t > end ? t : end;
        }
    free(live);
    return (int)(total * 100 / (sms * end));
}

bool kpt_backward_dq_sums(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                          int64_t skv, int64_t hq, int64_t hkv, int64_t batch, int64_t sms,
                          const kpt_ir_value *scalars)
{
    return kpt_backward_busy_pct(p, pl, sq, skv, hq, hkv, batch, sms, scalars) >=
           KPT_BWD_DQ_SUMS_MIN_PCT;
}

int kpt_backward_dq_sums_forced(void)
{
    const char *e = getenv("KPT_CUDA_DQ_SUMS");
    return e && (!strcmp(e, "0") || !strcmp(e, "1")) ? *e - '0' : -1;
}

uint64_t kpt_backward_key(int64_t sq, int64_t skv, int64_t hq, int64_t hkv, int64_t batch,
                          const uint32_t *bits, int n)
{
    const int64_t words[5] = {sq, skv, hq, hkv, batch};
    return kpt_key_words(words, 5, bits, n);
}
