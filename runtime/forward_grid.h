/* The sm_90a forward's grid (templates/cuda/attention_sm90.cu, kpt_item): one CTA per work item
 * (q tile, head, batch row), the hardware scheduling them, or a persistent grid of one CTA per SM
 * walking its share of the items, where items are short. Pure functions of the plan and the
 * call, so they are tested without a GPU. */
#ifndef KPT_RUNTIME_FORWARD_GRID_H
#define KPT_RUNTIME_FORWARD_GRID_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/pattern.h"
#include "ir/plan.h"
#include "ir/ir_eval.h"

/* The most kv tiles that may hold a kept pair for an item to count as short. With a block map of
 * a mask that reads aux data the kv length alone decides (the host cannot see the map): short
 * up to the same 64 tiles (8k keys at D = 128; H100, bf16, persistent against one CTA per item
 * at 8k: twelve documents 303 / 223 TFLOP/s, document 523 / 457, document_logical 511 / 389),
 * not at 16k, where such items vary too much for a static share (document 397 / 573). A block
 * map made only for keep bits (plan.mask_bits without aux data) counts as none: its mask is the
 * host's to analyse. */
#define KPT_PERSISTENT_KV_TILES 64

/* Whether the kv length alone makes a call's items short. */
bool kpt_forward_short_by_length(int64_t n_kt);

/* Whether the items of a call are short: by length (kpt_forward_short_by_length), or, for a
 * mask that reads no aux data (tiles classified by interval analysis, or keep bits), at most
 * KPT_PERSISTENT_KV_TILES tiles in the live range of sampled q tiles (first, middle, last) for
 * the call's lengths and runtime scalars (by the pattern's scalar index) — sliding windows,
 * chunks and local masks over long sequences. Longer block maps and unmasked patterns are not
 * short: their items vary too much, or are long. The analysis costs tens of microseconds at 64k
 * keys: callers memoise it (kpt_forward_key). */
bool kpt_forward_items_short(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                             int64_t skv, int64_t hq, const kpt_ir_value *scalars);

/* The runtime scalars of a kernel argument block as the analysis takes them. */
void kpt_forward_scalars(const kpt_pattern *p, const uint32_t *bits, kpt_ir_value *out);

/* A key for memoising kpt_forward_items_short per kernel: kpt_key_words of the lengths, heads
 * and scalar bits. */
uint64_t kpt_forward_key(int64_t sq, int64_t skv, int64_t hq, const uint32_t *bits, int n);

/* The tall variant of a plan (plan.tall_variant: 192-row q tiles, three consumer warpgroups)
 * pays for calls of at least KPT_TALL_MIN_SQ queries whose longest live range holds at least
 * KPT_TALL_MIN_KV_TILES kv tiles and where the tall tiles' products (64-row blocks times live kv
 * tiles) are at most KPT_TALL_MAX_EXTRA_PCT percent more than the default tiles'. H100, bf16,
 * D = 64 (docs/BENCHMARKS.md, "Head dim 64: 192-row q tiles for masked patterns"): causal
 * 386 -> 438 TFLOP/s at 3k (4 % more products), 404 -> 438 at 4k, 443 -> 496 at 16k, prefix-LM
 * 436 -> 518 at 16k; at 1k-2k (5-11 % more products; the persistent grid's pairs of q tiles come
 * out uneven) causal lost 6-12 %; sliding windows of 1k lost 2-8 %, 2k-token chunks 6-30 %. */
#define KPT_TALL_MIN_SQ 3072
#define KPT_TALL_MIN_KV_TILES 16
#define KPT_TALL_MAX_EXTRA_PCT 4

/* Whether a call takes the tall variant `tall` of plan `pl` (see above), for the call's lengths
 * and runtime scalars. Costs an analysis of the mask per 64 rows: callers memoise it
 * (kpt_forward_key). */
bool kpt_forward_tall_pays(const kpt_pattern *p, const kpt_kernel_plan *pl,
                           const kpt_kernel_plan *tall, int64_t sq, int64_t skv, int64_t hq,
                           const kpt_ir_value *scalars);

/* KPT_CUDA_TALL in the environment, which forces the choice for comparisons and tests: 0 never
 * the tall variant, 1 always (where there is one); -1 when unset or neither: the rule. */
int kpt_forward_tall_forced(void);

/* The number of CTAs: `items` (one per item), or at most `sms` where the items are short and
 * outnumber them. KPT_CUDA_PERSISTENT in the environment forces the choice, for comparisons and
 * tests: 0 one CTA per item, 1 persistent, N > 1 persistent on at most N CTAs. */
int64_t kpt_forward_ctas(int64_t items, int64_t sms, bool short_items);

#endif
