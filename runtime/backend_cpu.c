/* The CPU backend: the double-precision reference (reference.c) behind the backend interface.
 * It compiles nothing and runs synchronously on host memory; it exists so that applications and
 * tests can use one API everywhere, and check GPU backends against it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "runtime/backend.h"
#include "runtime/paged_args.h"

typedef struct cpu_kernel {
    const kpt_pattern *pattern;
    kpt_kernel_config cfg;
} cpu_kernel;

static void cpu_destroy(kpt_backend *b)
{
    free(b);
}

static kpt_status cpu_accepts(kpt_backend *b, const kpt_kernel_desc *d, kpt_diag *diag)
{
    if (d->dtype != KPT_DTYPE_F16 && d->dtype != KPT_DTYPE_BF16 && d->dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the CPU backend (f16, bf16 or f32)",
                            kpt_dtype_name(d->dtype));
    return KPT_OK;
}

static kpt_status cpu_load(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const void *binary, size_t size, void **kernel, kpt_diag *diag)
{
    cpu_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    k->pattern = p;
    k->cfg = plan->cfg;
    *kernel = k;
    return KPT_OK;
}

static void cpu_unload(kpt_backend *b, void *kernel)
{
    free(kernel);
}

static kpt_status check(const kpt_tensor *t, const char *name, kpt_dtype dt, int64_t d,
                        kpt_diag *diag)
{
    if (t->dtype != dt)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s is %s; this kernel was made for %s", name,
                            kpt_dtype_name(t->dtype), kpt_dtype_name(dt));
    if (t->rank == 4 && t->shape[3] != d)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s has head dim %lld; this kernel was made for %lld", name,
                            (long long)t->shape[3], (long long)d);
    return KPT_OK;
}

static kpt_status check_inputs(const cpu_kernel *k, const kpt_attention_args *a, kpt_diag *diag)
{
    kpt_status st;
    if ((st = check(&a->q, "q", k->cfg.dtype, k->cfg.dqk, diag)) ||
        (st = check(&a->k, "k", k->cfg.dtype, k->cfg.dqk, diag)) ||
        (st = check(&a->v, "v", k->cfg.dtype, k->cfg.dv, diag)))
        return st;
    if (a->o.rank == 4 && a->o.shape[3] != k->cfg.dv)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor o has head dim %lld; this kernel was made for %d",
                            (long long)a->o.shape[3], k->cfg.dv);
    return KPT_OK;
}

static kpt_status cpu_launch(kpt_backend *b, void *kernel, const kpt_attention_args *a,
                             uint64_t blockmap, void *stream, kpt_diag *diag)
{
    const cpu_kernel *k = kernel;
    if (k->cfg.kind != KPT_KERNEL_FORWARD)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "this is a %s kernel: launch it with %s",
                            k->cfg.kind == KPT_KERNEL_PAGED ? "serving" : "backward",
                            k->cfg.kind == KPT_KERNEL_PAGED ? "kpt_paged_run" : "the backward");
    kpt_status st = check_inputs(k, a, diag);
    return st ? st : kpt_reference_attention(k->pattern, a, diag);
}

static kpt_status cpu_backward_workspace(kpt_backend *b, void *kernel,
                                         const kpt_attention_args *args,
                                         const kpt_attention_grads *grads, size_t *bytes,
                                         kpt_diag *diag)
{
    *bytes = 0; /* the reference allocates its own scratch */
    return KPT_OK;
}

static kpt_status cpu_launch_backward(kpt_backend *b, void *kernel, const kpt_attention_args *a,
                                      const kpt_attention_grads *g, uint64_t blockmap,
                                      uint64_t workspace, size_t workspace_bytes, void *stream,
                                      kpt_diag *diag)
{
    const cpu_kernel *k = kernel;
    kpt_status st = check_inputs(k, a, diag);
    if (!st && g && g->dout.data)
        st = check(&g->dout, "dout", k->cfg.dtype, k->cfg.dv, diag);
    return st ? st : kpt_reference_attention_backward(k->pattern, a, g, diag);
}

static kpt_status cpu_paged_plan(kpt_backend *b, void *kernel, const kpt_paged_shape *shape,
                                 kpt_paged_plan *out, kpt_diag *diag)
{
    return kpt_paged_plan_compute(shape, 0, 0, ((cpu_kernel *)kernel)->cfg.dv, out, diag);
}

static kpt_status cpu_launch_paged(kpt_backend *b, void *kernel, const kpt_paged_plan *plan,
                                   const kpt_paged_args *a, uint64_t workspace, void *stream,
                                   kpt_diag *diag)
{
    const cpu_kernel *k = kernel;
    kpt_paged_binding pb;
    kpt_status st = kpt_paged_bind_tensors(a, &pb, diag);
    if (!st)
        st = kpt_paged_check_plan(plan, &pb, diag);
    if (!st && (a->q.dtype != k->cfg.dtype || a->k.dtype != k->cfg.dtype ||
                a->v.dtype != k->cfg.dtype))
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                          "tensors q, k and v must be %s: this kernel was made for it",
                          kpt_dtype_name(k->cfg.dtype));
    if (!st && (pb.Dqk != k->cfg.dqk || pb.Dv != k->cfg.dv))
        st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                          "head dims %lld, %lld; this kernel was made for %d, %d",
                          (long long)pb.Dqk, (long long)pb.Dv, k->cfg.dqk, k->cfg.dv);
    return st ? st : kpt_reference_paged_attention(k->pattern, a, diag);
}

static kpt_status cpu_mem_alloc(kpt_backend *b, size_t bytes, uint64_t *mem, kpt_diag *diag)
{
    /* 64-byte aligned, like device allocations, so alignment rules are the same everywhere;
     * sizes whose rounding would wrap are refused, not allocated small */
    if (bytes > SIZE_MAX - 128)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (%zu bytes)", bytes);
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (%zu bytes)", bytes);
    *mem = (uint64_t)(uintptr_t)p;
    return KPT_OK;
}

static void cpu_mem_free(kpt_backend *b, uint64_t mem)
{
    free((void *)(uintptr_t)mem);
}

static kpt_status cpu_mem_write(kpt_backend *b, uint64_t mem, const void *src, size_t n,
                                kpt_diag *diag)
{
    memcpy((void *)(uintptr_t)mem, src, n);
    return KPT_OK;
}

static kpt_status cpu_mem_read(kpt_backend *b, void *dst, uint64_t mem, size_t n, kpt_diag *diag)
{
    memcpy(dst, (const void *)(uintptr_t)mem, n);
    return KPT_OK;
}

static kpt_status cpu_synchronize(kpt_backend *b, kpt_diag *diag)
{
    return KPT_OK; /* launches run synchronously */
}

static const kpt_backend_ops cpu_ops = {
    .kind = KPT_BACKEND_CPU,
    .destroy = cpu_destroy,
    .accepts = cpu_accepts,
    .load = cpu_load,
    .unload = cpu_unload,
    .launch = cpu_launch,
    .backward_workspace = cpu_backward_workspace,
    .launch_backward = cpu_launch_backward,
    .paged_plan = cpu_paged_plan,
    .launch_paged = cpu_launch_paged,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_write = cpu_mem_write,
    .mem_read = cpu_mem_read,
    .synchronize = cpu_synchronize,
};

kpt_status kpt_backend_cpu_open(const kpt_context_params *p, kpt_backend **out, kpt_diag *diag)
{
    *out = NULL;
    if (p->flags & KPT_CONTEXT_OFFLINE)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the CPU backend compiles nothing: KPT_CONTEXT_OFFLINE needs CUDA");
    if (p->target && strcmp(p->target, "cpu"))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "target '%s' is not the CPU backend's ('cpu')", p->target);
    if (p->device != 0)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "the CPU backend has one device (0), not %d",
                            p->device);
    kpt_backend *b = calloc(1, sizeof(*b));
    if (!b)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    b->ops = &cpu_ops;
    strcpy(b->target, "cpu");
    strcpy(b->driver, "none");
    strcpy(b->device_name, "CPU (reference)");
    *out = b;
    return KPT_OK;
}
