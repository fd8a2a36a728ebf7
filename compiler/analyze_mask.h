/* analyze_mask: which (q-tile, kv-tile) rectangles of a pattern's mask are empty, full or partial.
 * See analyze_mask.c for the algorithm. */
#ifndef KPT_COMPILER_ANALYZE_MASK_H
#define KPT_COMPILER_ANALYZE_MASK_H

#include "ir/ir_eval.h"
#include "ir/pattern.h"

typedef enum kpt_tile_class {
    KPT_TILE_EMPTY = 0,   /* no element kept: skip the tile (no loads, no math) */
    KPT_TILE_FULL = 1,    /* every element kept: no mask evaluation */
    KPT_TILE_PARTIAL = 2, /* mixed, or not known: evaluate the mask per element */
} kpt_tile_class;

/* The values the analysis may rely on. sq, skv and hq are always known; b and h only when the
 * caller fixes them (a kernel's tile map for one batch row / head); scalars when given. */
typedef struct kpt_mask_env {
    int32_t sq, skv, hq;
    int32_t b, h;
    bool b_known, h_known;
    const kpt_ir_value *scalars; /* by scalar index; NULL: runtime scalars are unknown */
} kpt_mask_env;

typedef struct kpt_mask_analysis kpt_mask_analysis;

/* Prepares the analysis of p's mask under env. Returns NULL only when out of memory. */
kpt_mask_analysis *kpt_analyze_mask(const kpt_pattern *p, const kpt_mask_env *env);
void kpt_mask_analysis_free(kpt_mask_analysis **a);

/* True when every part of the mask was understood, so classifications are exact (never
 * PARTIAL for a tile that is really empty or full). */
bool kpt_mask_analysis_exact(const kpt_mask_analysis *a);

/* Classifies the rectangle q in [q0, q1), k in [k0, k1); only the part inside [0, sq) x [0, skv)
 * counts (bounds are the kernel's business), and a rectangle with no element inside is EMPTY.
 * Sound always: EMPTY and FULL are only returned when true. */
kpt_tile_class kpt_mask_classify(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t k0,
                                 int64_t k1);

/* The kv tiles (of tile_k keys) that can hold a kept element for queries [q0, q1): tiles
 * *first..*last inclusive. Returns false (and first > last) when there are none. Exact when the
 * analysis is exact: both end tiles really hold a kept element. */
bool kpt_mask_kv_range(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t tile_k,
                       int64_t *first, int64_t *last);

/* Classifies every kv tile for queries [q0, q1) in one sweep: out[t] for t in
 * [0, ceil(skv / tile_k)). Equal to calling kpt_mask_classify per tile, but faster. */
void kpt_mask_classify_row(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t tile_k,
                           kpt_tile_class *out);

/* A one-line description of how the mask was understood, for dumps:
 * "3 affine atoms, exact" or "1 affine atom, 1 opaque (aux load)". Valid while a lives. */
const char *kpt_mask_analysis_summary(const kpt_mask_analysis *a);

#endif
