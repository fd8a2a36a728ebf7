/* Serving calls (include/kpt/serving.h): validation of kpt_paged_args against a pattern, the
 * plan (how a batch's lengths become a launch grid) and the argument blocks of the CUDA paged
 * kernels. Shared by the CPU reference and every backend, so they accept and refuse the same
 * calls with the same messages. */
#ifndef KPT_RUNTIME_PAGED_ARGS_H
#define KPT_RUNTIME_PAGED_ARGS_H

#include <stdbool.h>

#include <kpt/serving.h>

#include "runtime/attention_args.h"
#include "runtime/kernel_args.h"

/* Keys per tile of the paged kernels from head dim 65 to 128 (the twin of KPT_BN in the paged
 * plan; up to 64 the kernels take 128-key tiles, past 128 32-key tiles, and the split count
 * still goes by 64 keys: each part keeps at least 128) and the most rows (query tokens times a
 * kv head's query heads) of one CTA (the twin of KPT_PG_ROWS in paged.cu). */
#define KPT_PAGED_TILE 64
#define KPT_PAGED_ROWS 64
#define KPT_PAGED_MAX_PAGE 256
#define KPT_PAGED_MAX_SPLITS 256
/* tiles a part keeps at least where a plan splits for two CTAs an SM (kpt_paged_plan_sms) */
#define KPT_PAGED_TWO_TILES 64
/* tenths of the SMs a plan must keep busy, or it splits for a wave of several CTAs an SM (a thin
 * wave); and the most CTAs an SM such a plan counts on (the most measured: 3, at head dim 64) */
#define KPT_PAGED_THIN 9
#define KPT_PAGED_THIN_PER_SM 4
/* where three or more CTAs fit an SM (head dim 64) every plan is made for that many, as long
 * as each part keeps this many tiles (kpt_paged_plan_sms) */
#define KPT_PAGED_WIDE_TILES 4

typedef struct kpt_paged_binding {
    int64_t B, T, Hq, Hkv, Dqk, Dv;
    int64_t num_pages, page_size, max_pages; /* max_pages: page-table columns (0: not paged) */
    bool paged;
    kpt_attn_binding bind; /* scale, scalars, aux; shape Sq = Skv = the longest kv length */
} kpt_paged_binding;

/* Checks what the host can see of a serving call's tensors (ranks, shapes, strides, dtypes;
 * not the contents of the length arrays) into out (its binding cleared). */
kpt_status kpt_paged_bind_tensors(const kpt_paged_args *a, kpt_paged_binding *out,
                                  kpt_diag *diag);
/* Binds the call's scale, scalars and aux tensors into out->bind, for sequences of at most
 * max_kv keys (out from kpt_paged_bind_tensors). */
kpt_status kpt_paged_bind_extras(const kpt_pattern *p, const kpt_paged_args *a, int64_t max_kv,
                                 kpt_paged_binding *out, kpt_diag *diag);
/* Both. */
kpt_status kpt_paged_bind(const kpt_pattern *p, const kpt_paged_args *a, int64_t max_kv,
                          kpt_paged_binding *out, kpt_diag *diag);

/* A plan for shape `s`: `slots` is how many CTAs of the kernel the device runs at once (0: no
 * device, as on the CPU backend: never split), `group_max` the largest GQA ratio the kernel
 * takes (0: any), `dv` its value head dim (for the workspace). */
kpt_status kpt_paged_plan_compute(const kpt_paged_shape *s, int slots, int group_max, int dv,
                                  kpt_paged_plan *out, kpt_diag *diag);

/* A plan for a device of `sms` SMs, one CTA each (kpt_paged_plan_compute with sms slots); where
 * `two_wide`, a plan whose CTAs hold more than 32 rows and split anyway is made for two CTAs an
 * SM instead, as long as each part keeps KPT_PAGED_TWO_TILES tiles (the CUDA 64-row warpgroup
 * kernel: cuda_device.c, kpt_cuda_paged_plan). Before that, a plan whose CTAs keep fewer
 * than KPT_PAGED_THIN of every 10 SMs busy, or fewer than all of them unsplit, is made for
 * `per_sm` CTAs an SM (the CTAs of each serving kernel an SM holds, at most
 * KPT_PAGED_THIN_PER_SM) where that is 2 or more, if that splits it further within one such
 * wave; and where `per_sm` is 3 or more, every plan is, in parts of KPT_PAGED_WIDE_TILES
 * tiles at least. */
kpt_status kpt_paged_plan_sms(const kpt_paged_shape *s, int sms, bool two_wide, int per_sm,
                              int dv, kpt_paged_plan *out, kpt_diag *diag);

/* Whether `plan`'s split count, blocks and workspace are ones kpt_paged_plan_compute makes
 * (the block count its other fields give; the workspace of partial results of `rows` rows and
 * `dv` columns). The backends check their own rows. */
bool kpt_paged_plan_ok(const kpt_paged_plan *plan, int rows, int dv);

/* Whether `plan`'s CTAs (query blocks x splits x kv heads) fit `sms` SMs one each. */
bool kpt_paged_one_per_sm(const kpt_paged_plan *plan, int sms);

/* Whether a call bound as `pb` fits `plan` (batch and head counts). */
kpt_status kpt_paged_check_plan(const kpt_paged_plan *plan, const kpt_paged_binding *pb,
                                kpt_diag *diag);

/* The CUDA paged kernels' argument blocks for a call that fits `plan`: `out` takes q, k, v, o
 * and lse with their strides (q, o, lse per token and head; k and v per page, row and head),
 * the scale, scalars and aux tensors; `pout` the rest. Workspace pointers stay 0. */
kpt_status kpt_kernel_paged_pack(const kpt_pattern *p, const kpt_kernel_plan *pl,
                                 const char *backend, const kpt_paged_plan *plan,
                                 const kpt_paged_args *a, kpt_kernel_args *out,
                                 kpt_kernel_pargs *pout, kpt_diag *diag);

/* A CTA's fixed costs (its start, its end and its share of the combine), in tiles of keys
 * streamed: what one more part of a split costs. Fitted on the H200 (bf16, D = 128, 32:8; the
 * best split counts of ragged batches, docs/BENCHMARKS.md, "Serving: splits for ragged
 * batches"). */
#define KPT_PAGED_CTA_TILES 3

/* The work of a plan's blocks, one kv head: tiles of keys in all, the longest block's, and the
 * blocks that have keys and queries (work items). */
typedef struct kpt_paged_work {
    int64_t tiles, longest, items;
} kpt_paged_work;

/* The work of plan pl's blocks for shape s in tiles of `tile` keys (over the bounds, or each
 * sequence's own blocks and keys where s has host lengths). */
void kpt_paged_plan_work(const kpt_paged_shape *s, const kpt_paged_plan *pl, int tile,
                         kpt_paged_work *out);
/* How many parts each sequence's keys are split into for work `w` of `heads` kv heads on
 * `slots` (work items the device runs at once): enough that the work fills the slots once in
 * parts no longer than the average share and, where the items differ in length, that the
 * longest item's parts leave a short tail (KPT_PAGED_CTA_TILES weighs each part's cost). 1 to
 * KPT_PAGED_MAX_SPLITS, each part at least two tiles. */
int kpt_paged_split_work(const kpt_paged_work *w, int heads, int64_t slots);

/* The workspace of a split plan whose work items have `rows` rows: the partial results' O (f32,
 * dv a row), then their LSEs (log2 units) from *lse_offset (256-byte aligned; may be NULL).
 * Slot of row r of split s of query block x (b q_blocks + qb, or packed, the block's index in
 * the launch) and kv head hk: ((x splits + s) Hkv + hk) rows + r. Returns the bytes in all. */
size_t kpt_paged_workspace_bytes(const kpt_paged_plan *plan, int rows, int dv,
                                 size_t *lse_offset);
/* A plan's workspace_bytes: kpt_paged_workspace_bytes where it splits, else 0. */
size_t kpt_paged_plan_workspace(const kpt_paged_plan *plan, int rows, int dv);

#endif
