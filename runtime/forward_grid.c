/* The sm_90a forward's grid: see forward_grid.h. Measured (H200, bf16, D = 128; docs/BENCHMARKS.md,
 * "Short sequences: a persistent grid"): persistent, causal at 1k runs 402 against 341 TFLOP/s,
 * at 4k 592 against 539, at 8k 631 against 601 (full 663 against 613, alibi+causal 568 against
 * 507); at 16k one CTA per item is level or ahead (the hardware balances the items dynamically,
 * a static share cannot: GQA causal 607 against 578), and so it is for block maps from 8k
 * (document 419 against 380); sliding windows at 8k-64k, few live tiles an item, run 7-12 %
 * faster persistent. */
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "compiler/analyze_mask.h"
#include "runtime/forward_grid.h"

bool kpt_forward_short_by_length(int64_t n_kt)
{
    return n_kt <= KPT_PERSISTENT_KV_TILES;
}

bool kpt_forward_items_short(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                             int64_t skv, int64_t hq, const kpt_ir_value *scalars)
{
    const int64_t bm = pl->bm, bn = pl->bn;
    const int64_t n_qt = (sq + bm - 1) / bm, n_kt = (skv + bn - 1) / bn;
    if (kpt_forward_short_by_length(n_kt))
        return true;
    if (!p->mask || pl->mask_loads || n_qt <= 0)
        return false;
    const kpt_mask_env env = {.sq = (int32_t)sq, .skv = (int32_t)skv, .hq = (int32_t)hq,
                              .scalars = scalars};
    kpt_mask_analysis *a = kpt_analyze_mask(p, &env);
    if (!a)
        return false;
    const int64_t samples[3] = {0, n_qt / 2, n_qt - 1};
    bool short_items = true;
    for (int i = 0; i < 3 && short_items; i++) {
        const int64_t q0 = samples[i] * bm;
        int64_t first, last;
        if (kpt_mask_kv_range(a, q0, q0 + bm, bn, &first, &last))
            short_items = last - first + 1 <= KPT_PERSISTENT_KV_TILES;
    }
    kpt_mask_analysis_free(&a);
    return short_items;
}

/* The products of q tiles of bm rows, counted in 64-row blocks times live kv tiles (of bn keys),
 * from the live ranges of the call's 64-row blocks (first[i]..last[i]; first > last where a
 * block has none). Every block of a tile walks the tile's range; blocks past Sq take none (the
 * kernel's idle consumers). *longest: the longest range of a tile. */
static int64_t tile_products(const int64_t *first, const int64_t *last, int64_t blocks,
                             int64_t bm, int64_t *longest)
{
    const int64_t per = bm / 64;
    int64_t sum = 0;
    for (int64_t t = 0; t < blocks; t += per) {
        int64_t lo = INT64_MAX, hi = -1, n = 0;
        for (int64_t i = t; i < t + per && i < blocks; i++, n++) {
            if (first[i] > last[i])
                continue;
            lo = first[i] < lo ? first[i] : lo;
            hi = last[i] > hi ? last[i] : hi;
        }
        if (hi < lo)
            continue;
        sum += (hi - lo + 1) * n;
        *longest = hi - lo + 1 > *longest ? hi - lo + 1 : *longest;
    }
    return sum;
}

static bool tall_by_mask(const kpt_pattern *p, const kpt_kernel_plan *pl,
                         const kpt_kernel_plan *tall, int64_t sq, int64_t skv, int64_t hq,
                         const kpt_ir_value *scalars)
{
    const kpt_mask_env env = {.sq = (int32_t)sq, .skv = (int32_t)skv, .hq = (int32_t)hq,
                              .scalars = scalars};
    /* past a million queries, the first million (their tiles' shapes repeat; the analysis
     * stays a few milliseconds) */
    const int64_t blocks = (sq < (1 << 20) ? sq + 63 : 1 << 20) / 64;
    int64_t *first = malloc(2 * (size_t)blocks * sizeof(*first)), *last = first + blocks;
    kpt_mask_analysis *a = first ? kpt_analyze_mask(p, &env) : NULL;
    bool pays = false;
    if (a) {
        for (int64_t i = 0; i < blocks; i++)
            kpt_mask_kv_range(a, i * 64, i * 64 + 64, pl->bn, &first[i], &last[i]);
        int64_t longest = 0;
        const int64_t base = tile_products(first, last, blocks, pl->bm, &longest);
        const int64_t more = tile_products(first, last, blocks, tall->bm, &longest);
        pays = longest >= KPT_TALL_MIN_KV_TILES &&
               more * 100 <= base * (100 + KPT_TALL_MAX_EXTRA_PCT);
    }
    kpt_mask_analysis_free(&a);
    free(first);
    return pays;
}

int kpt_forward_tall_forced(void)
{
    const char *e = getenv("KPT_CUDA_TALL");
    return e && (!strcmp(e, "0") || !strcmp(e, "1")) ? *e - '0' : -1;
}

bool kpt_forward_tall_pays(const kpt_pattern *p, const kpt_kernel_plan *pl,
                           const kpt_kernel_plan *tall, int64_t sq, int64_t skv, int64_t hq,
                           const kpt_ir_value *scalars)
{
    if (!p->mask || pl->mask_loads || sq < KPT_TALL_MIN_SQ || skv <= 0 || tall->bm % 64 ||
        pl->bm % 64 || tall->bn != pl->bn)
        return false;
    return tall_by_mask(p, pl, tall, sq, skv, hq, scalars);
}

void kpt_forward_scalars(const kpt_pattern *p, const uint32_t *bits, kpt_ir_value *out)
{
    for (int i = 0; i < p->num_scalars; i++) {
        if (p->scalars[i].type == KPT_IR_F32) {
            float f;
            memcpy(&f, &bits[i], sizeof(f));
            out[i].f = f;
        } else {
            out[i].i = (int32_t)bits[i];
        }
    }
}

uint64_t kpt_forward_key(int64_t sq, int64_t skv, int64_t hq, const uint32_t *bits, int n)
{
    const int64_t words[3] = {sq, skv, hq};
    return kpt_key_words(words, 3, bits, n);
}

int64_t kpt_forward_ctas(int64_t items, int64_t sms, bool short_items)
{
    int64_t ctas = sms > 0 ? sms : items;
    bool persistent = short_items;
    const char *e = getenv("KPT_CUDA_PERSISTENT");
    char *end;
    long n = e ? strtol(e, &end, 10) : -1;
    if (e && *e && !*end && n >= 0) {
        persistent = n > 0;
        if (n > 1 && n < ctas)
            ctas = n;
    }
    return persistent && items > ctas ? ctas : items;
}
