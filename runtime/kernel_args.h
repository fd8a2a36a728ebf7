/* The argument block of the generated C++ kernels (CUDA and HIP alike): the host twin of
 * `struct kpt_args` in templates/common/expr.inc. Both sides assert the size; change them
 * together. kpt_kernel_args_pack validates a call against a kernel and fills the block, so the
 * two backends accept and refuse exactly the same calls. */
#ifndef KPT_RUNTIME_KERNEL_ARGS_H
#define KPT_RUNTIME_KERNEL_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/reference.h>

#include "compiler/plan_tiles.h"
#include "runtime/attention_args.h"

typedef struct kpt_kernel_aux_arg {
    uint64_t ptr;
    int64_t stride[KPT_AUX_MAX_RANK];
    int32_t dim[KPT_AUX_MAX_RANK]; /* unused dimensions: 1 (stride 0) */
} kpt_kernel_aux_arg;

typedef struct kpt_kernel_args {
    uint64_t q, k, v, o, lse, blockmap;
    int64_t qs[4], ks[4], vs[4], os[4];
    int64_t lses[3];
    int64_t bm_sb, bm_sh, bm_sq;
    int32_t B, Hq, Hkv, Sq, Skv, group;
    int32_t n_qt, n_kt;
    float scale, scale_log2;
    uint32_t scalars[32];
    kpt_kernel_aux_arg aux[16];
    uint64_t sinks; /* f32 [Hq], or 0 */
    int64_t sink_stride;
} kpt_kernel_args;

_Static_assert(sizeof(kpt_kernel_aux_arg) == 56, "kpt_kernel_aux_arg layout");
_Static_assert(sizeof(kpt_kernel_args) == KPT_KERNEL_ARGS_BYTES, "kpt_kernel_args layout");
/* the serving kernel copies the block without its unused aux slots (KPT_ARGS_AUX_AT, _TAIL_AT) */
_Static_assert(offsetof(kpt_kernel_args, aux) == 392 && offsetof(kpt_kernel_args, sinks) == 1288,
               "kpt_kernel_args offsets");

/* The gradient arguments of the backward kernels: the host twin of `struct kpt_gargs` in
 * templates/cuda/attention_bwd.cu. */
typedef struct kpt_kernel_gargs {
    uint64_t dout, dq, dk, dv, delta;
    int64_t dos[4], dqs[4], dks[4], dvs[4];
    uint64_t dacc[16], dflag[16]; /* per aux slot: fixed-point accumulators and flags, or 0 */
    int32_t daux_on, pad;
    uint64_t dsinks; /* f32 [Hq], or 0 */
    int64_t dsinks_stride;
    uint64_t dqacc; /* sm_90a, not deterministic: f32 [B, Hq, Sq, Dqk], zeroed first; or 0 */
    uint64_t dqdone; /* with dqacc: u32 [B, Hkv], kpt_bwd_dkdv's warpgroups done, zeroed first */
} kpt_kernel_gargs;

_Static_assert(sizeof(kpt_kernel_gargs) == 464, "kpt_kernel_gargs layout");

/* A 16-bit tensor of the kernel's dtype `want` whose last dimension (of size d, the head dim) is
 * contiguous, whose other strides are multiples of 8 elements and whose data is 16-byte
 * aligned: what the kernels' 16-byte row copies need. */
kpt_status kpt_kernel_check_rows(const kpt_tensor *t, const char *name, kpt_dtype want,
                                 int64_t d, kpt_diag *diag);

/* The same for a tensor the kernels write element by element where its rows are not aligned:
 * the dtype, the contiguous head dim of size d and data aligned to the element; any strides. */
kpt_status kpt_kernel_check_elems(const kpt_tensor *t, const char *name, kpt_dtype want,
                                  int64_t d, kpt_diag *diag);

/* The row checks of q, k, v and o (kpt_kernel_check_rows against the plan's dtype and head
 * dims; kpt_kernel_check_elems for o where o_any_rows) and lse (f32 where given), then `out`
 * zeroed and their pointers and strides (as many as each tensor's rank) filled in: what the
 * forward, backward and serving packs share. */
kpt_status kpt_kernel_args_pack_tensors(const kpt_kernel_plan *pl, const char *backend,
                                        const kpt_tensor *q, const kpt_tensor *k,
                                        const kpt_tensor *v, const kpt_tensor *o,
                                        const kpt_tensor *lse, bool o_any_rows,
                                        kpt_kernel_args *out, kpt_diag *diag);

/* The scale, runtime scalars and aux tensors of a binding into `out` (the rest untouched). */
kpt_status kpt_kernel_args_pack_extras(const kpt_pattern *p, const kpt_attn_binding *bind,
                                       kpt_kernel_args *out, kpt_diag *diag);

/* The serving arguments of the paged kernels: the host twin of `struct kpt_pargs` in
 * templates/cuda/paged.cu. */
typedef struct kpt_kernel_pargs {
    uint64_t page_table, cu_q, kv_lens, sinks, part_o, part_lse;
    int64_t pt_stride, sink_stride;
    int32_t page_size, page_shift, num_pages, max_pages;
    int32_t T, splits, q_blocks, q_per_block, rows, paged;
    int32_t stages; /* the ring's depth: plan.stages or plan.stages_deep (kpt_cuda_paged) */
    int32_t packed; /* blocks follow cu_q (a packed plan); q_blocks is then the launch's */
    int32_t cluster; /* a block's splits are a thread block cluster and combine there */
    int32_t reserved;
} kpt_kernel_pargs;

_Static_assert(sizeof(kpt_kernel_pargs) == 120, "kpt_kernel_pargs layout");

/* Validates `a` against the pattern and plan of a kernel (dtypes, head dims, strides, alignment,
 * sizes; `backend` names the backend in messages) and fills `out`; out->blockmap stays 0. */
kpt_status kpt_kernel_args_pack(const kpt_pattern *p, const kpt_kernel_plan *plan,
                                const char *backend, const kpt_attention_args *a,
                                kpt_kernel_args *out, kpt_diag *diag);

/* The argument of kpt_bwd_daux (one aux gradient out of its accumulators): the host twin of
 * `struct kpt_daux_out`. */
typedef struct kpt_kernel_daux_out {
    uint64_t acc, flag, out;
    int64_t stride[KPT_AUX_MAX_RANK];
    int32_t dim[KPT_AUX_MAX_RANK]; /* unused dimensions: 1 */
} kpt_kernel_daux_out;

_Static_assert(sizeof(kpt_kernel_daux_out) == 72, "kpt_kernel_daux_out layout");

/* The number of elements of an aux gradient (its kpt_bwd_daux launch covers them all);
 * INT64_MAX where it would overflow (broadcast tensors may have huge sizes). */
static inline int64_t kpt_kernel_daux_count(const kpt_kernel_daux_out *o)
{
    int64_t n = 1;
    for (int d = 0; d < KPT_AUX_MAX_RANK; d++) {
        if (o->dim[d] > 0 && n > INT64_MAX / o->dim[d])
            return INT64_MAX;
        n *= o->dim[d];
    }
    return n;
}

/* The backward's workspace, at offsets from its start (each 256-byte aligned): delta (f32
 * [B, Hq, Sq]), dq's f32 accumulator where the plan sums dq with atomics (sm_90a, not
 * deterministic: [B, Hq, Sq, Dqk]) and then its counts of finished kpt_bwd_dkdv warpgroups (u32
 * [B, Hkv]), then for each aux gradient wanted its accumulators (16 bytes an element) and flags
 * (4 bytes an element). The launch zeroes [zero_from, bytes) first; kpt_bwd_prep zeroes dq's
 * accumulator and counts as it goes. */
typedef struct kpt_bwd_workspace {
    size_t bytes;                              /* the whole */
    size_t zero_from;                          /* the aux accumulators and flags: to bytes */
    size_t dqacc;                              /* dq's accumulator, or 0: none */
    size_t dqdone;                             /* with dqacc: its counts */
    size_t acc[KPT_MAX_AUX], flag[KPT_MAX_AUX]; /* by aux slot; acc 0: no gradient wanted */
    kpt_kernel_daux_out out[KPT_MAX_AUX];      /* by aux slot; acc and flag set at launch */
} kpt_bwd_workspace;

/* kpt_kernel_args_pack for a backward call (into `pa`, `a` bound once), then its gradients
 * validated against the kernel (dout, dq, dk, dv of the kernel's dtype and head dims, all
 * present; lse present in `a`; aux gradients f32, of float aux tensors): fills `out` and the
 * workspace layout `ws`; out->delta, dacc and dflag stay 0 (the launch adds the workspace's
 * address to ws's offsets). */
kpt_status kpt_kernel_bwd_pack(const kpt_pattern *p, const kpt_kernel_plan *plan,
                               const char *backend, const kpt_attention_args *a,
                               const kpt_attention_grads *g, kpt_kernel_args *pa,
                               kpt_kernel_gargs *out, kpt_bwd_workspace *ws, kpt_diag *diag);

/* Whether a backward of this plan sums dq with atomics (sm_90a up to head dim 128 unless
 * deterministic). */
bool kpt_kernel_bwd_atomic_dq(const kpt_kernel_plan *plan, bool deterministic);

/* The workspace of a packed call without aux gradients: delta, and dq's accumulator and counts
 * where the plan sums dq with atomics (kpt_kernel_bwd_atomic_dq). */
size_t kpt_kernel_args_bwd_workspace(const kpt_kernel_plan *plan, const kpt_kernel_args *a,
                                     bool deterministic);

/* Bytes of the block map for a packed call (0 when the plan needs none). */
size_t kpt_kernel_args_map_bytes(const kpt_kernel_plan *plan, const kpt_kernel_args *a);
/* CTAs of the block map's keep-bits kernel (kpt_blockmap_bits), 0 without plan.mask_bits: per
 * layout of bits, one per line of tiles and group of 8 tiles along it. */
int64_t kpt_kernel_bits_ctas(const kpt_kernel_plan *plan, const kpt_kernel_args *a);

#endif
