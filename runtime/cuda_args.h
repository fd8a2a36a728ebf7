/* The kernel argument block of the CUDA attention and block-map kernels: the host twin of
 * `struct kpt_args` in templates/cuda/attention.cu. Both sides assert the size; change them
 * together. */
#ifndef KPT_RUNTIME_CUDA_ARGS_H
#define KPT_RUNTIME_CUDA_ARGS_H

#include <stdint.h>

typedef struct kpt_cuda_aux_arg {
    uint64_t ptr;
    int64_t stride[3];
    int32_t dim[3];
    int32_t pad;
} kpt_cuda_aux_arg;

typedef struct kpt_cuda_args {
    uint64_t q, k, v, o, lse, blockmap;
    int64_t qs[4], ks[4], vs[4], os[4];
    int64_t lses[3];
    int64_t bm_sb, bm_sh, bm_sq;
    int32_t B, Hq, Hkv, Sq, Skv, group;
    int32_t n_qt, n_kt;
    float scale, scale_log2;
    uint32_t scalars[32];
    kpt_cuda_aux_arg aux[16];
} kpt_cuda_args;

_Static_assert(sizeof(kpt_cuda_aux_arg) == 48, "kpt_cuda_aux_arg layout");
_Static_assert(sizeof(kpt_cuda_args) == 1160, "kpt_cuda_args layout");

#endif
