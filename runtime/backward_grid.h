/* The sm_90a backward's choice of where the default mode sums dQ: in kpt_bwd_dkdv (bulk
 * reductions into f32 sums, converted by kpt_bwd_dq_store), or in kpt_bwd_dq (one CTA per q
 * tile, as the deterministic mode does), which recomputes S and dP but runs beside
 * kpt_bwd_dkdv's last wave. Pure functions of the plan and the call, tested without a GPU. */
#ifndef KPT_RUNTIME_BACKWARD_GRID_H
#define KPT_RUNTIME_BACKWARD_GRID_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir_eval.h"
#include "ir/pattern.h"
#include "ir/plan.h"

/* kpt_bwd_dkdv's grid is a CTA per (kv tile, kv head, batch row), each walking the live q tiles
 * of its group's heads. Under a causal mask with few kv heads the CTAs of the first kv tiles
 * walk far more steps than the rest, and the SMs idle while they finish; where the grid,
 * scheduled in order onto the SMs, keeps them busy less than KPT_BWD_DQ_SUMS_MIN_PCT percent of
 * its span, the default mode sums dQ in kpt_bwd_dq instead. H100, bf16, D = 128, 16k tokens, the
 * backward's time deterministic / default (docs/BENCHMARKS.md, "Backward: where dQ is summed,
 * by the grid's balance"): causal with 2 kv heads (the grid's estimate 61-69 %) 0.63-0.85, with
 * 4 (77-81 %) 0.74-0.97, with 8 (87-89 %) 0.77-1.07, with 16 (93-95 %) 0.92-1.14; full
 * attention (97 %) 1.03-1.12; a 512-key sliding window with 2 kv heads (69-94 %) 0.67-1.08. */
#define KPT_BWD_DQ_SUMS_MIN_PCT 83

/* The estimate above, in percent: kpt_bwd_dkdv's CTAs in grid order (kv tiles fastest, then kv
 * heads, then batch rows) each going to the SM that frees first, a CTA's work its group's heads
 * times its live q tiles (from the mask analysis's live kv range of each q tile, for the call's
 * lengths and runtime scalars) plus one step for its fixed costs. 100 where the mask reads aux
 * data (the host cannot see its block map) or the grid has more than 16 waves of CTAs. */
int kpt_backward_busy_pct(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                          int64_t skv, int64_t hq, int64_t hkv, int64_t batch, int64_t sms,
                          const kpt_ir_value *scalars);

/* Whether the default mode sums dQ in kpt_bwd_dkdv for this call (the rule above). Costs a
 * simulation of the grid: callers memoise it (kpt_backward_key). */
bool kpt_backward_dq_sums(const kpt_pattern *p, const kpt_kernel_plan *pl, int64_t sq,
                          int64_t skv, int64_t hq, int64_t hkv, int64_t batch, int64_t sms,
                          const kpt_ir_value *scalars);

/* KPT_CUDA_DQ_SUMS in the environment, which forces the choice for comparisons and tests: 1 the
 * sums in kpt_bwd_dkdv, 0 kpt_bwd_dq; -1 when unset or neither: the rule. */
int kpt_backward_dq_sums_forced(void);

/* A key for memoising kpt_backward_dq_sums per kernel: kpt_key_words of the lengths, heads,
 * batch and scalar bits. */
uint64_t kpt_backward_key(int64_t sq, int64_t skv, int64_t hq, int64_t hkv, int64_t batch,
                          const uint32_t *bits, int n);

#endif
