/* The backend interface: what the context (runtime/context.c) needs from each target. A backend
 * instance is one device (or the CPU, or an offline compile target). Kernels go through three
 * steps so the caches can sit between them:
 *
 *   generate  pattern + shape class -> plan and source text (target/: kpt_kernel_generate for
 *             the backend's target; deterministic; no device needed)
 *   compile   source -> binary (target/: kpt_kernel_compile; may run without a device)
 *   load      binary -> loaded kernel (the backend; needs the device)
 *
 * Backends never plan, emit or compile themselves: they name their target (NULL for the CPU,
 * which runs the reference and compiles nothing) and the shared memory its plans may use.
 *
 * Thread-safety: every operation may be called from several threads at once. */
#ifndef KPT_RUNTIME_BACKEND_H
#define KPT_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/runtime.h>
#include <kpt/serving.h>

#include "target/target.h"

typedef struct kpt_backend kpt_backend;

typedef struct kpt_backend_ops {
    kpt_backend_kind kind;
    void (*destroy)(kpt_backend *b);
    /* Refuses shape classes this device cannot run although its target can (a Vulkan device
     * without 16-bit storage and f16), before anything is generated. May be NULL. */
    kpt_status (*accepts)(kpt_backend *b, const kpt_kernel_desc *desc, kpt_diag *diag);
    /* Binary (NULL for the CPU backend) -> a loaded kernel. p outlives the kernel. */
    kpt_status (*load)(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                       const void *binary, size_t size, void **kernel, kpt_diag *diag);
    void (*unload)(kpt_backend *b, void *kernel);
    kpt_status (*launch)(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                         uint64_t blockmap, void *stream, kpt_diag *diag);
    /* A forward kernel whose plan has a tall variant (plan.tall_variant) and that variant's
     * kernel: launches of `kernel` take `tall` where a call favours it. NULL where the backend's
     * planner offers no such variant. */
    void (*pair)(kpt_backend *b, void *kernel, void *tall);
    /* Backward kernels (NULL where the backend has none): the workspace a call needs, and the
     * launch (workspace 0: the backend allocates a temporary one). */
    kpt_status (*backward_workspace)(kpt_backend *b, void *kernel,
                                     const kpt_attention_args *args,
                                     const kpt_attention_grads *grads, size_t *bytes,
                                     kpt_diag *diag);
    kpt_status (*launch_backward)(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                  const kpt_attention_grads *grads, uint64_t blockmap,
                                  uint64_t workspace, size_t workspace_bytes, void *stream,
                                  kpt_diag *diag);
    /* Serving kernels (NULL where the backend has none): the plan of a batch shape on this
     * device, and a run under it (workspace 0: the backend allocates a temporary one; else
     * kpt_paged_run has checked it holds the plan's workspace_bytes). */
    kpt_status (*paged_plan)(kpt_backend *b, void *kernel, const kpt_paged_shape *shape,
                             kpt_paged_plan *out, kpt_diag *diag);
    kpt_status (*launch_paged)(kpt_backend *b, void *kernel, const kpt_paged_plan *plan,
                               const kpt_paged_args *args, uint64_t workspace, void *stream,
                               kpt_diag *diag);
    /* Device memory (host memory for the CPU backend), for kpt_buffer and block maps. Reads
     * and writes are synchronous; synchronize waits for all work of the device. */
    kpt_status (*mem_alloc)(kpt_backend *b, size_t bytes, uint64_t *mem, kpt_diag *diag);
    void (*mem_free)(kpt_backend *b, uint64_t mem);
    kpt_status (*mem_write)(kpt_backend *b, uint64_t mem, const void *src, size_t n,
                            kpt_diag *diag);
    kpt_status (*mem_read)(kpt_backend *b, void *dst, uint64_t mem, size_t n, kpt_diag *diag);
    kpt_status (*synchronize)(kpt_backend *b, kpt_diag *diag);
    /* Block maps (NULL when the backend never needs them). */
    kpt_status (*blockmap_size)(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                size_t *bytes, kpt_diag *diag);
    kpt_status (*blockmap_build)(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                 uint64_t mem, void *stream, kpt_diag *diag);
} kpt_backend_ops;

struct kpt_backend {
    const kpt_backend_ops *ops;
    const kpt_target *tgt; /* what its kernels are generated for; NULL: the CPU backend */
    int smem_limit;        /* shared memory a workgroup may use; 0: the target's default */
    char target[32];       /* "cuda:sm_90", "cpu" */
    char compiler[64];     /* "nvrtc 13.0"; "" when the backend cannot compile here */
    char driver[64];       /* "cuda driver 13000"; "none" offline */
    char device_name[128]; /* "" offline */
    bool offline;          /* can compile, cannot load or launch */
};

/* Opens each backend per the context params (kind already resolved, never AUTO). */
kpt_status kpt_backend_cuda_open(const kpt_context_params *p, kpt_backend **out,
                                 kpt_diag *diag);
kpt_status kpt_backend_hip_open(const kpt_context_params *p, kpt_backend **out, kpt_diag *diag);
kpt_status kpt_backend_cpu_open(const kpt_context_params *p, kpt_backend **out, kpt_diag *diag);

#endif
