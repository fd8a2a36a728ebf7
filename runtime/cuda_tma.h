/* The TMA tensor maps of the sm_90a kernels (templates/cuda/attention_sm90.cu's kpt_attention,
 * templates/cuda/attention_bwd_sm90.cu's kpt_bwd_dkdv): a parameter of theirs, built on every
 * launch from the packed call. */
#ifndef KPT_RUNTIME_CUDA_TMA_H
#define KPT_RUNTIME_CUDA_TMA_H

#include <stdint.h>

#include "compiler/plan_tiles.h"
#include "vendor/api_cuda.h"
#include "runtime/kernel_args.h"

/* CUtensorMap: 128 opaque bytes, 64-byte aligned. */
typedef struct kpt_tensor_map {
    _Alignas(64) uint64_t w[16];
} kpt_tensor_map;

/* The twin of struct kpt_tma in the kernel: maps of q, k and v over (D, S, heads, batch) with
 * boxes of 64 columns x plan rows in the 128-byte swizzle, and per tensor the factors of the
 * head and batch coordinates (0 where a zero stride broadcasts the tensor over that dim); o's
 * map, with boxes of 64 rows, where the plan stores O through TMA (plan.o_tma). */
typedef struct kpt_kernel_tma {
    kpt_tensor_map q, k, v, o;
    int32_t hq, bq, hk, bk, hv, bv, ho, bo;
} kpt_kernel_tma;

_Static_assert(sizeof(kpt_kernel_tma) == 576, "kpt_kernel_tma layout");

/* The twin of struct kpt_bwd_tma (templates/cuda/attention_bwd_sm90.cu): maps of q and dout
 * with boxes of 64 rows (kpt_bwd_dkdv's steps), k and v with boxes of plan.bn rows, the f32 dq
 * accumulator (where the call is not deterministic) with boxes of 32 columns x 64 rows, dk and
 * dv with boxes of 64 rows (kpt_bwd_dkdv's TMA stores), and the head and batch factors of q,
 * dout, k, v, dk and dv. */
typedef struct kpt_kernel_bwd_tma {
    kpt_tensor_map q, o, k, v, dq, dk, dv;
    int32_t hq, bq, ho, bo, hk, bk, hv, bv, hdk, bdk, hdv, bdv;
} kpt_kernel_bwd_tma;

_Static_assert(sizeof(kpt_kernel_bwd_tma) == 960, "kpt_kernel_bwd_tma layout");

/* Fills `out` for a call packed by kpt_kernel_args_pack. Fails with a clear error where the
 * driver lacks TMA or a tensor's layout is one TMA cannot describe (a zero or negative
 * sequence stride, negative strides; o's too where the plan stores O through TMA). */
kpt_status kpt_cuda_tma_pack(const kpt_cu_api *cu, const kpt_kernel_plan *plan,
                             const kpt_kernel_args *a, kpt_kernel_tma *out, kpt_diag *diag);

/* The same for the sm_90a backward (kpt_kernel_bwd_pack's a and g). */
kpt_status kpt_cuda_tma_pack_bwd(const kpt_cu_api *cu, const kpt_kernel_plan *plan,
                                 const kpt_kernel_args *a, const kpt_kernel_gargs *g,
                                 kpt_kernel_bwd_tma *out, kpt_diag *diag);

#endif
