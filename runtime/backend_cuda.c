/* The CUDA backend behind the backend interface (backend.h): its target (target/) generates CUDA
 * C and NVRTC compiles it to CUBIN; the driver API loads and launches it (cuda_device.c, the
 * device layer kptc and tests/gpu also use directly). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "runtime/backend.h"
#include "runtime/cuda_device.h"

typedef struct cuda_backend {
    kpt_backend base;
    kpt_cuda_device dev; /* unopened when offline */
} cuda_backend;

static cuda_backend *cb(kpt_backend *b)
{
    return (cuda_backend *)b;
}

static void cuda_destroy(kpt_backend *b)
{
    if (!b)
        return;
    kpt_cuda_device_close(&cb(b)->dev);
    free(b);
}

static kpt_status cuda_load(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                            const void *binary, size_t size, void **kernel, kpt_diag *diag)
{
    if (b->offline)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "this context compiles offline for %s: it cannot load kernels",
                            b->target);
    return kpt_cuda_kernel_load(&cb(b)->dev, p, plan, binary, (kpt_cuda_kernel **)kernel, diag);
}

static void cuda_unload(kpt_backend *b, void *kernel)
{
    kpt_cuda_kernel *k = kernel;
    kpt_cuda_kernel_destroy(&k);
}

static kpt_status cuda_launch(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                              uint64_t blockmap, void *stream, kpt_diag *diag)
{
    return kpt_cuda_attention(kernel, args, blockmap, stream, diag);
}

static void cuda_pair(kpt_backend *b, void *kernel, void *tall)
{
    (void)b;
    kpt_cuda_kernel_pair(kernel, tall);
}

static kpt_status cuda_backward_workspace(kpt_backend *b, void *kernel,
                                          const kpt_attention_args *args,
                                          const kpt_attention_grads *grads, size_t *bytes,
                                          kpt_diag *diag)
{
    return kpt_cuda_backward_workspace(kernel, args, grads, bytes, diag);
}

static kpt_status cuda_launch_backward(kpt_backend *b, void *kernel,
                                       const kpt_attention_args *args,
                                       const kpt_attention_grads *grads, uint64_t blockmap,
                                       uint64_t workspace, size_t workspace_bytes, void *stream,
                                       kpt_diag *diag)
{
    return kpt_cuda_attention_backward(kernel, args, grads, blockmap, workspace, workspace_bytes,
                                       stream, diag);
}

static kpt_status cuda_paged_plan(kpt_backend *b, void *kernel, const kpt_paged_shape *shape,
                                  kpt_paged_plan *out, kpt_diag *diag)
{
    return kpt_cuda_paged_plan(kernel, shape, out, diag);
}

static kpt_status cuda_launch_paged(kpt_backend *b, void *kernel, const kpt_paged_plan *plan,
                                    const kpt_paged_args *args, uint64_t workspace, void *stream,
                                    kpt_diag *diag)
{
    return kpt_cuda_paged(kernel, plan, args, workspace, stream, diag);
}

static kpt_status cuda_blockmap_size(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                     size_t *bytes, kpt_diag *diag)
{
    return kpt_cuda_blockmap_size(kernel, args, bytes, diag);
}

static kpt_status offline_error(kpt_backend *b, kpt_diag *diag)
{
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                        "this context compiles offline for %s: it has no device", b->target);
}

static kpt_status cuda_mem_alloc(kpt_backend *b, size_t bytes, uint64_t *mem, kpt_diag *diag)
{
    if (b->offline)
        return offline_error(b, diag);
    const kpt_cuda_device *dev = &cb(b)->dev;
    kpt_status st = kpt_cuda_make_current(dev, diag);
    if (st)
        return st;
    CUdeviceptr p = 0;
    KPT_CU_TRY(diag, dev->cu->MemAlloc(&p, bytes ? bytes : 1));
    *mem = p;
    return KPT_OK;
}

static void cuda_mem_free(kpt_backend *b, uint64_t mem)
{
    const kpt_cuda_device *dev = &cb(b)->dev;
    if (mem && !b->offline && !kpt_cuda_make_current(dev, NULL))
        dev->cu->MemFree(mem);
}

static kpt_status cuda_mem_write(kpt_backend *b, uint64_t mem, const void *src, size_t n,
                                 kpt_diag *diag)
{
    const kpt_cuda_device *dev = &cb(b)->dev;
    kpt_status st = b->offline ? offline_error(b, diag) : kpt_cuda_make_current(dev, diag);
    if (st)
        return st;
    KPT_CU_TRY(diag, dev->cu->MemcpyHtoD(mem, src, n));
    return KPT_OK;
}

static kpt_status cuda_mem_read(kpt_backend *b, void *dst, uint64_t mem, size_t n, kpt_diag *diag)
{
    const kpt_cuda_device *dev = &cb(b)->dev;
    kpt_status st = b->offline ? offline_error(b, diag) : kpt_cuda_make_current(dev, diag);
    if (st)
        return st;
    KPT_CU_TRY(diag, dev->cu->MemcpyDtoH(dst, mem, n));
    return KPT_OK;
}

static kpt_status cuda_synchronize(kpt_backend *b, kpt_diag *diag)
{
    const kpt_cuda_device *dev = &cb(b)->dev;
    kpt_status st = b->offline ? KPT_OK : kpt_cuda_make_current(dev, diag);
    if (st || b->offline)
        return st;
    KPT_CU_TRY(diag, dev->cu->CtxSynchronize());
    return KPT_OK;
}

static kpt_status cuda_blockmap_build(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                      uint64_t mem, void *stream, kpt_diag *diag)
{
    return kpt_cuda_blockmap_build(kernel, args, mem, stream, diag);
}

static const kpt_backend_ops cuda_ops = {
    .kind = KPT_BACKEND_CUDA,
    .destroy = cuda_destroy,
    .load = cuda_load,
    .unload = cuda_unload,
    .launch = cuda_launch,
    .pair = cuda_pair,
    .backward_workspace = cuda_backward_workspace,
    .launch_backward = cuda_launch_backward,
    .paged_plan = cuda_paged_plan,
    .launch_paged = cuda_launch_paged,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_write = cuda_mem_write,
    .mem_read = cuda_mem_read,
    .synchronize = cuda_synchronize,
    .blockmap_size = cuda_blockmap_size,
    .blockmap_build = cuda_blockmap_build,
};

/* The target a device runs: its own arch (sm_90a on sm_90 devices, unless KPT_CUDA_WGMMA=0),
 * or a requested one of the same major version and no newer minor (an sm_86 device runs sm_80
 * code). */
static kpt_status pick_target(cuda_backend *c, const char *target, kpt_diag *diag)
{
    char list[256];
    if (!target) {
        int dev_sm = c->dev.sm >= 90 ? 90 : c->dev.sm;
        kpt_kernel_config cfg = {.sm = dev_sm, .wgmma = kpt_cuda_wgmma_enabled(c->dev.sm, dev_sm)};
        c->base.tgt = kpt_target_for(KPT_BACKEND_CUDA, &cfg);
        if (!c->base.tgt) /* sm_87 and the like: the sm_80 code runs there */
            c->base.tgt = kpt_target_find(dev_sm >= 90 ? "cuda:sm_90" : "cuda:sm_80");
        return KPT_OK;
    }
    const kpt_target *t = kpt_target_find(target);
    if (!t || t->backend != KPT_BACKEND_CUDA)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "target '%s': expected %s", target,
                            kpt_target_list(KPT_BACKEND_CUDA, list, sizeof(list)));
    int sm = t->base.sm;
    if (sm / 10 != c->dev.sm / 10 || sm > c->dev.sm)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "target %s cannot run on %s (sm_%d)", target, c->dev.name, c->dev.sm);
    c->base.tgt = t;
    return KPT_OK;
}

kpt_status kpt_backend_cuda_open(const kpt_context_params *p, kpt_backend **out, kpt_diag *diag)
{
    *out = NULL;
    cuda_backend *c = calloc(1, sizeof(*c));
    if (!c)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    c->base.ops = &cuda_ops;
    c->base.offline = p->flags & KPT_CONTEXT_OFFLINE;
    kpt_status st = KPT_OK;
    if (c->base.offline) {
        const kpt_target *t = kpt_target_find(p->target);
        char list[256];
        if (!t || t->backend != KPT_BACKEND_CUDA)
            st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                              "an offline CUDA context needs a target: %s (not '%s')",
                              kpt_target_list(KPT_BACKEND_CUDA, list, sizeof(list)),
                              p->target ? p->target : "");
        c->base.tgt = t;
        snprintf(c->base.driver, sizeof(c->base.driver), "none");
    } else {
        st = kpt_cuda_device_open(p->device, &c->dev, diag);
        if (!st)
            st = pick_target(c, p->target, diag);
        int v = 0;
        if (!st && !c->dev.cu->DriverGetVersion(&v))
            snprintf(c->base.driver, sizeof(c->base.driver), "cuda driver %d", v);
        snprintf(c->base.device_name, sizeof(c->base.device_name), "%s", c->dev.name);
        c->base.smem_limit = c->dev.smem_optin;
    }
    if (st) {
        cuda_destroy(&c->base);
        return st;
    }
    snprintf(c->base.target, sizeof(c->base.target), "%s", c->base.tgt->name);
    c->base.tgt->rtc->identity(c->base.compiler, sizeof(c->base.compiler));
    *out = &c->base;
    return KPT_OK;
}
