/* The sm_90a forward's grid: see forward_grid.h. Measured (H200, bf16, D = 128; docs/BENCHMARKS.md,
 * "Short sequences: a persistent grid"): persistent, causal at 1k runs 402 against 341 TFLOP/s,
 * at 4k 592 against 539, at 8k 631 against 601 (full 663 against 613, alibi+causal 568 against
 * 507); at 16k one CTA per item is level or ahead (the hardware balances the items dynamically,
 * a static share cannot: GQA causal 607 against 578), and so it is for block maps from 8k
 * (document 419 against 380); sliding windows at 8k-64k, few live tiles an item, run 7-12 %
 * faster persistent. */
#include <stdlib.h>
#include <string.h>

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
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the words */
    const uint64_t words[3] = {(uint64_t)sq, (uint64_t)skv, (uint64_t)hq};
    for (int i = 0; i < 3 + n; i++) {
        h ^= i < 3 ? words[i] : bits[i - 3];
        h *= 0x100000001b3ull;
    }
    return h ? h : 1;
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
