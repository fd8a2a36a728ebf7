/* The TMA tensor maps of the sm_90a attention kernel (templates/cuda/attention_sm90.cu): its
 * second parameter, built on every launch from the packed call. */
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
 * head and batch coordinates (0 where a zero stride broadcasts the tensor over that dim). */
typedef struct kpt_kernel_tma {
    kpt_tensor_map q, k, v;
    int32_t hq, bq, hk, bk, hv, bv;
} kpt_kernel_tma;

_Static_assert(sizeof(kpt_kernel_tma) == 448, "kpt_kernel_tma layout");

/* Fills `out` for a call packed by kpt_kernel_args_pack. Fails with a clear error where the
 * driver lacks TMA or a tensor's layout is one TMA cannot describe (a zero or negative
 * sequence stride, negative strides). */
kpt_status kpt_cuda_tma_pack(const kpt_cu_api *cu, const kpt_kernel_plan *plan,
                             const kpt_kernel_args *a, kpt_kernel_tma *out, kpt_diag *diag);

#endif
