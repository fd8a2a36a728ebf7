/* The CUDA backend: a device (primary context), kernels compiled for a pattern and shape class
 * (generated CUDA C -> NVRTC -> CUBIN -> module), the block-map kernel of data-dependent masks,
 * and launches on a caller's stream. The embeddable runtime ("context", the kernel cache) sits on
 * top of this; kptc and tests/gpu use it directly.
 *
 * Thread-safety: a device and its kernels may be used from several threads (launches only read
 * them); creating and destroying are not concurrent with use of the same object. */
#ifndef KPT_RUNTIME_CUDA_DEVICE_H
#define KPT_RUNTIME_CUDA_DEVICE_H

#include <kpt/reference.h>
#include <kpt/serving.h>

#include "compiler/plan_tiles.h"
#include <stdatomic.h>
#include <stdint.h>

#include "vendor/api_cuda.h"

typedef struct kpt_cuda_device {
    const kpt_cu_api *cu;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context, retained */
    int ordinal;
    int sm;        /* compute capability x 10 */
    int sm_count;
    int smem_optin;
    int smem_per_sm;
    char name[128];
} kpt_cuda_device;

typedef struct kpt_cuda_kernel {
    const kpt_cuda_device *dev;
    const kpt_pattern *pattern; /* not owned: must outlive the kernel */
    kpt_kernel_plan plan;
    CUmodule module;
    CUfunction attention, blockmap, blockmap_order; /* the last only for sm_90a kernels */
    CUfunction blockmap_bits; /* sm_90a kernels with plan.mask_bits */
    CUfunction bwd_prep, bwd_dkdv, bwd_dq, bwd_daux, bwd_dsinks; /* backward (no attention) */
    CUfunction bwd_dkdv_aux; /* plan.aux_grads: kpt_bwd_dkdv with the aux gradients' terms */
    CUfunction bwd_dq_store; /* sm_90a: dq from its atomic sums */
    CUfunction paged[3], paged_combine; /* serving kernels: 16, 32 and 64 rows a CTA */
    bool paged_cluster; /* paged[0] launches in clusters of up to 16 (cluster_combine) */
    int paged_per_sm;   /* CTAs of every serving kernel an SM holds at once (at least 1) */
    /* the serving combine and the backward's dQ are programmatic dependent launches
     * (cuda_device.c, want_pdl) */
    bool pdl;
    double codegen_ms, nvrtc_ms, load_ms;
    char ptxas_info[512]; /* ptxas's figures for the attention kernel */
    /* sm_90a forward: whether the last call's lengths and scalars gave short work items
     * (runtime/forward_grid.h): kpt_forward_key with bit 0 the answer, 0 when none yet */
    _Atomic uint64_t grid_memo;
    /* sm_90a forward, a plan with a tall variant (plan.tall_variant): that variant's kernel, set
     * by kpt_cuda_kernel_pair (NULL: none), and whether the last call's lengths and scalars
     * took it (as grid_memo) */
    _Atomic(const struct kpt_cuda_kernel *) tall;
    _Atomic uint64_t tall_memo;
    /* sm_90a backward: whether the last call's shape had the default mode sum dQ in
     * kpt_bwd_dkdv (runtime/backward_grid.h), as grid_memo */
    _Atomic uint64_t dq_memo;
} kpt_cuda_kernel;

/* Whether kernels for a device of compute capability `device_sm` compiled for `target_sm` use
 * the sm_90a kernel (TMA, wgmma, warp specialisation): yes on sm_90 devices for sm_90 targets,
 * unless the environment sets KPT_CUDA_WGMMA=0 (the sm_80 kernel, for comparison or as a way
 * around a problem). */
bool kpt_cuda_wgmma_enabled(int device_sm, int target_sm);

/* Opens device `ordinal`, retaining its primary context and making it current on this thread. */
kpt_status kpt_cuda_device_open(int ordinal, kpt_cuda_device *dev, kpt_diag *diag);
void kpt_cuda_device_close(kpt_cuda_device *dev);

/* Loads compiled kernels (a CUBIN made by kpt_kernel_compile from the source generated for `plan`). */
kpt_status kpt_cuda_kernel_load(const kpt_cuda_device *dev, const kpt_pattern *p,
                                const kpt_kernel_plan *plan, const void *cubin,
                                kpt_cuda_kernel **out, kpt_diag *diag);

/* Makes the device's context current on the calling thread when it is not (no synchronisation). */
kpt_status kpt_cuda_make_current(const kpt_cuda_device *dev, kpt_diag *diag);

/* Generates, compiles and loads the kernels of `p` for `cfg` (cfg->sm = 0: the device's arch). */
kpt_status kpt_cuda_kernel_create(const kpt_cuda_device *dev, const kpt_pattern *p,
                                  const kpt_kernel_config *cfg, kpt_cuda_kernel **out,
                                  kpt_diag *diag);
void kpt_cuda_kernel_destroy(kpt_cuda_kernel **k);

/* Bytes of the block map for these arguments (0 when the pattern needs none). */
kpt_status kpt_cuda_blockmap_size(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                  size_t *bytes, kpt_diag *diag);
/* Builds the block map into `map` (device memory of kpt_cuda_blockmap_size bytes) on `stream`.
 * It depends on the aux tensors' contents, the runtime scalars and the lengths: the caller may
 * reuse it for calls where those are unchanged. */
kpt_status kpt_cuda_blockmap_build(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                   CUdeviceptr map, CUstream stream, kpt_diag *diag);

/* Launches attention on `stream`. Tensor data pointers are device addresses. `map`: a block map
 * built by kpt_cuda_blockmap_build, or 0 to build a temporary one on the stream when the pattern
 * needs it. Asynchronous: errors of the kernel itself surface at the next synchronisation. */
/* Makes `tall` (the module of k's plan's tall variant) the kernel that k's calls take where
 * their lengths favour it (kpt_forward_tall_pays). Neither owns the other; both live as long as
 * their context. */
void kpt_cuda_kernel_pair(kpt_cuda_kernel *k, const kpt_cuda_kernel *tall);

kpt_status kpt_cuda_attention(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                              CUdeviceptr map, CUstream stream, kpt_diag *diag);

/* The plan of a serving batch on this device (include/kpt/serving.h). */
kpt_status kpt_cuda_paged_plan(const kpt_cuda_kernel *k, const kpt_paged_shape *shape,
                               kpt_paged_plan *out, kpt_diag *diag);
/* A serving run under `plan` on `stream` (workspace 0: a temporary one, stream-ordered). */
kpt_status kpt_cuda_paged(const kpt_cuda_kernel *k, const kpt_paged_plan *plan,
                          const kpt_paged_args *args, CUdeviceptr workspace, CUstream stream,
                          kpt_diag *diag);

/* Bytes of workspace kpt_cuda_attention_backward needs for these arguments and gradients
 * (grads NULL: without aux gradients; otherwise validated as the launch does). */
kpt_status kpt_cuda_backward_workspace(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                       const kpt_attention_grads *grads, size_t *bytes,
                                       kpt_diag *diag);

/* Launches the backward kernels (a kernel of kind "backward") on `stream`: dq, dk, dv of `g`
 * from args (q, k, v, o, lse of the forward) and g->dout. `workspace`: device memory of at least
 * kpt_cuda_backward_workspace bytes, or 0 for a temporary one (stream-ordered allocation); `map`
 * as for kpt_cuda_attention, built by this kernel. */
kpt_status kpt_cuda_attention_backward(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                       const kpt_attention_grads *g, CUdeviceptr map,
                                       CUdeviceptr workspace, size_t workspace_bytes,
                                       CUstream stream, kpt_diag *diag);

#endif
