/* The backend interface: what the context (runtime/context.c) needs from each target. A backend
 * instance is one device (or the CPU, or an offline compile target). Kernels go through three
 * steps so the caches can sit between them:
 *
 *   generate  pattern + shape class -> plan and source text (deterministic; no device needed)
 *   compile   source -> binary (may run without a device; NULL for backends with no binary)
 *   load      binary -> loaded kernel (needs the device)
 *
 * Thread-safety: every operation may be called from several threads at once. */
#ifndef KPT_RUNTIME_BACKEND_H
#define KPT_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/runtime.h>

#include "compiler/plan_tiles.h"

typedef struct kpt_backend kpt_backend;

typedef struct kpt_backend_ops {
    kpt_backend_kind kind;
    void (*destroy)(kpt_backend *b);
    /* Plans the kernel of p for desc (defaults filled in) and writes its source (malloc'ed; NULL
     * for backends that compile nothing). */
    kpt_status (*generate)(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_desc *desc,
                           kpt_kernel_plan *plan, char **source, kpt_diag *diag);
    /* Source -> malloc'ed binary. NULL when the backend has no compile step. */
    kpt_status (*compile)(kpt_backend *b, const char *source, const kpt_kernel_plan *plan,
                          void **binary, size_t *size, kpt_diag *diag);
    /* Binary (NULL for backends without one) -> a loaded kernel. p outlives the kernel. */
    kpt_status (*load)(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                       const void *binary, size_t size, void **kernel, kpt_diag *diag);
    void (*unload)(kpt_backend *b, void *kernel);
    kpt_status (*launch)(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                         uint64_t blockmap, void *stream, kpt_diag *diag);
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
