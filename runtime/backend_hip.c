/* The HIP backend behind the backend interface (backend.h): its target (target/) generates HIP
 * C++ and compiles it to an AMD code object with hipRTC, or clang for archs the local hipRTC
 * lacks (vendor/rtc_hiprtc.c); this file loads and launches it through the HIP module API
 * (vendor/api_hip.c). Kernel memory is plain device memory (hipMalloc); launches go on the
 * caller's hipStream_t (NULL: the null stream).
 *
 * No AMD GPU has run this file yet (docs/hip.md): what CI checks is that it builds, refuses
 * cleanly without ROCm or a device, and compiles offline. Thread-safety: HIP's current device is
 * per thread, so every operation that touches the device selects it first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/hip_source.h"
#include "base/diag.h"
#include "runtime/backend.h"
#include "vendor/api_hip.h"
#include "runtime/kernel_args.h"

typedef struct hip_backend {
    kpt_backend base;
    const kpt_hip_api *hip; /* NULL offline */
    int ordinal;
} hip_backend;

typedef struct hip_kernel {
    const kpt_pattern *pattern; /* not owned */
    kpt_kernel_plan plan;
    hipModule_t module;
    hipFunction_t attention, blockmap;
} hip_kernel;

static hip_backend *hb(kpt_backend *b)
{
    return (hip_backend *)b;
}

static kpt_status offline_error(kpt_backend *b, kpt_diag *diag)
{
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                        "this context compiles offline for %s: it has no device", b->target);
}

/* Makes the backend's device current on this thread (or fails offline). */
static kpt_status use_device(kpt_backend *b, kpt_diag *diag)
{
    if (b->offline)
        return offline_error(b, diag);
    KPT_HIP_TRY(diag, hb(b)->hip->SetDevice(hb(b)->ordinal));
    return KPT_OK;
}

static void hip_destroy(kpt_backend *b)
{
    free(b);
}

static void hip_unload(kpt_backend *b, void *kernel)
{
    hip_kernel *k = kernel;
    if (!k)
        return;
    if (k->module && !use_device(b, NULL))
        hb(b)->hip->ModuleUnload(k->module);
    free(k);
}

static kpt_status hip_load(kpt_backend *b, const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const void *binary, size_t size, void **kernel, kpt_diag *diag)
{
    *kernel = NULL;
    kpt_status st = use_device(b, diag);
    if (st)
        return st;
    hip_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    k->pattern = p;
    k->plan = *plan;
    const kpt_hip_api *hip = hb(b)->hip;
    hipError_t r = hip->ModuleLoadData(&k->module, binary);
    if (r)
        st = kpt_hip_fail(diag, "hipModuleLoadData", r);
    if (!st && (r = hip->ModuleGetFunction(&k->attention, k->module, KPT_HIP_ATTENTION_ENTRY)))
        st = kpt_hip_fail(diag, "hipModuleGetFunction(attention)", r);
    if (!st && plan->has_blockmap &&
        (r = hip->ModuleGetFunction(&k->blockmap, k->module, KPT_HIP_BLOCKMAP_ENTRY)))
        st = kpt_hip_fail(diag, "hipModuleGetFunction(blockmap)", r);
    if (st) {
        hip_unload(b, k);
        return st;
    }
    *kernel = k;
    return KPT_OK;
}

static kpt_status pack(const hip_kernel *k, const kpt_attention_args *args, kpt_kernel_args *a,
                       kpt_diag *diag)
{
    return kpt_kernel_args_pack(k->pattern, &k->plan, "HIP", args, a, diag);
}

/* One wavefront per tile pair, four to a workgroup (kpt_blockmap in the template). */
static kpt_status launch_blockmap(kpt_backend *b, const hip_kernel *k, kpt_kernel_args *a,
                                  hipStream_t stream, kpt_diag *diag)
{
    if (a->n_qt == 0 || a->n_kt == 0)
        return KPT_OK;
    int64_t pairs = (int64_t)a->n_qt * a->n_kt, groups = (pairs + 3) / 4;
    if (groups > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "block map too large (%lld tile pairs)",
                            (long long)pairs);
    void *params[] = {a};
    KPT_HIP_TRY(diag, hb(b)->hip->ModuleLaunchKernel(
                          k->blockmap, (unsigned)groups, k->plan.bm_per_h ? (unsigned)a->Hq : 1,
                          k->plan.bm_per_b ? (unsigned)a->B : 1, 256, 1, 1, 0, stream, params,
                          NULL));
    return KPT_OK;
}

static kpt_status launch_attention(kpt_backend *b, const hip_kernel *k, kpt_kernel_args *a,
                                   hipStream_t stream, kpt_diag *diag)
{
    void *params[] = {a};
    /* the template's LDS is static: no dynamic shared memory */
    KPT_HIP_TRY(diag, hb(b)->hip->ModuleLaunchKernel(
                          k->attention, (unsigned)a->n_qt, (unsigned)a->Hq, (unsigned)a->B,
                          (unsigned)(k->plan.warps * 64), 1, 1, 0, stream, params, NULL));
    return KPT_OK;
}

static kpt_status hip_launch(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                             uint64_t blockmap, void *stream, kpt_diag *diag)
{
    const hip_kernel *k = kernel;
    kpt_kernel_args a;
    kpt_status st = pack(k, args, &a, diag);
    if (st || a.Sq == 0 || a.B == 0 || a.Hq == 0)
        return st;
    if ((st = use_device(b, diag)))
        return st;
    const kpt_hip_api *hip = hb(b)->hip;
    a.blockmap = blockmap;
    size_t bytes = k->plan.has_blockmap && !blockmap ? kpt_kernel_args_map_bytes(&k->plan, &a) : 0;
    if (!bytes)
        return launch_attention(b, k, &a, stream, diag);
    /* a temporary block map: built, used and freed once the stream has finished with it
     * (hipFree would not wait for work queued on a stream) */
    void *tmp = NULL;
    KPT_HIP_TRY(diag, hip->Malloc(&tmp, bytes));
    a.blockmap = (uint64_t)(uintptr_t)tmp;
    st = launch_blockmap(b, k, &a, stream, diag);
    if (!st)
        st = launch_attention(b, k, &a, stream, diag);
    hipError_t r = hip->StreamSynchronize(stream);
    if (!st && r)
        st = kpt_hip_fail(diag, "hipStreamSynchronize", r);
    hip->Free(tmp);
    return st;
}

static kpt_status hip_blockmap_size(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                    size_t *bytes, kpt_diag *diag)
{
    const hip_kernel *k = kernel;
    kpt_kernel_args a;
    kpt_status st = pack(k, args, &a, diag);
    *bytes = st ? 0 : kpt_kernel_args_map_bytes(&k->plan, &a);
    return st;
}

static kpt_status hip_blockmap_build(kpt_backend *b, void *kernel, const kpt_attention_args *args,
                                     uint64_t mem, void *stream, kpt_diag *diag)
{
    const hip_kernel *k = kernel;
    kpt_kernel_args a;
    kpt_status st = pack(k, args, &a, diag);
    if (!st)
        st = use_device(b, diag);
    if (st)
        return st;
    a.blockmap = mem;
    return launch_blockmap(b, k, &a, stream, diag);
}

static kpt_status hip_mem_alloc(kpt_backend *b, size_t bytes, uint64_t *mem, kpt_diag *diag)
{
    kpt_status st = use_device(b, diag);
    if (st)
        return st;
    void *p = NULL;
    KPT_HIP_TRY(diag, hb(b)->hip->Malloc(&p, bytes ? bytes : 1));
    *mem = (uint64_t)(uintptr_t)p;
    return KPT_OK;
}

static void hip_mem_free(kpt_backend *b, uint64_t mem)
{
    if (mem && !use_device(b, NULL))
        hb(b)->hip->Free((void *)(uintptr_t)mem);
}

static kpt_status hip_mem_write(kpt_backend *b, uint64_t mem, const void *src, size_t n,
                                kpt_diag *diag)
{
    kpt_status st = use_device(b, diag);
    if (st)
        return st;
    KPT_HIP_TRY(diag, hb(b)->hip->MemcpyHtoD((void *)(uintptr_t)mem, (void *)src, n));
    return KPT_OK;
}

static kpt_status hip_mem_read(kpt_backend *b, void *dst, uint64_t mem, size_t n, kpt_diag *diag)
{
    kpt_status st = use_device(b, diag);
    if (st)
        return st;
    KPT_HIP_TRY(diag, hb(b)->hip->MemcpyDtoH(dst, (void *)(uintptr_t)mem, n));
    return KPT_OK;
}

static kpt_status hip_synchronize(kpt_backend *b, kpt_diag *diag)
{
    if (b->offline)
        return KPT_OK;
    kpt_status st = use_device(b, diag);
    if (st)
        return st;
    KPT_HIP_TRY(diag, hb(b)->hip->DeviceSynchronize());
    return KPT_OK;
}

static const kpt_backend_ops hip_ops = {
    .kind = KPT_BACKEND_HIP,
    .destroy = hip_destroy,
    .load = hip_load,
    .unload = hip_unload,
    .launch = hip_launch,
    .mem_alloc = hip_mem_alloc,
    .mem_free = hip_mem_free,
    .mem_write = hip_mem_write,
    .mem_read = hip_mem_read,
    .synchronize = hip_synchronize,
    .blockmap_size = hip_blockmap_size,
    .blockmap_build = hip_blockmap_build,
};

/* The device (its arch must be one kpt generates for) and the target: the device's own arch,
 * or a requested one that must equal it (AMD code objects run only on their exact arch). */
static kpt_status open_device(hip_backend *h, const kpt_context_params *p, kpt_diag *diag)
{
    if (!(h->hip = kpt_hip_load(diag)))
        return KPT_ERR_NO_DEVICE;
    int count = 0;
    hipError_t r = h->hip->GetDeviceCount(&count);
    if (r == KPT_HIP_ERR_NO_DEVICE)
        count = 0;
    else if (r)
        return kpt_hip_fail(diag, "hipGetDeviceCount", r);
    if (p->device >= count)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "HIP device %d does not exist (%d found)",
                            p->device, count);
    h->ordinal = p->device;
    int dev = 0;
    KPT_HIP_TRY(diag, h->hip->DeviceGet(&dev, h->ordinal));
    KPT_HIP_TRY(diag, h->hip->DeviceGetName(h->base.device_name,
                                            (int)sizeof(h->base.device_name) - 1, dev));
    char arch[64], target[80];
    kpt_status st = kpt_hip_device_arch(h->hip, h->ordinal, arch, sizeof(arch), diag);
    if (st)
        return st;
    snprintf(target, sizeof(target), "hip:%s", arch);
    char list[256];
    if (!(h->base.tgt = kpt_target_find(target)))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "HIP device %d (%s) is %s; kpt generates MFMA kernels for %s",
                            h->ordinal, h->base.device_name, arch,
                            kpt_target_list(KPT_BACKEND_HIP, list, sizeof(list)));
    if (p->target && strcmp(p->target, target))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "target %s cannot run on %s (%s)",
                            p->target, h->base.device_name, arch);
    int v = 0;
    if (!h->hip->RuntimeGetVersion(&v))
        snprintf(h->base.driver, sizeof(h->base.driver), "hip runtime %d", v);
    return KPT_OK;
}

kpt_status kpt_backend_hip_open(const kpt_context_params *p, kpt_backend **out, kpt_diag *diag)
{
    *out = NULL;
    const kpt_target *t = kpt_target_find(p->target);
    char list[256];
    if (p->target && (!t || t->backend != KPT_BACKEND_HIP))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "target '%s': expected %s",
                            p->target, kpt_target_list(KPT_BACKEND_HIP, list, sizeof(list)));
    hip_backend *h = calloc(1, sizeof(*h));
    if (!h)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    h->base.ops = &hip_ops;
    h->base.offline = p->flags & KPT_CONTEXT_OFFLINE;
    kpt_status st = KPT_OK;
    if (h->base.offline) {
        if (!p->target)
            st = kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                              "an offline HIP context needs a target: %s",
                              kpt_target_list(KPT_BACKEND_HIP, list, sizeof(list)));
        h->base.tgt = t;
        snprintf(h->base.driver, sizeof(h->base.driver), "none");
    } else {
        st = open_device(h, p, diag);
    }
    if (st) {
        hip_destroy(&h->base);
        return st;
    }
    snprintf(h->base.target, sizeof(h->base.target), "%s", h->base.tgt->name);
    h->base.tgt->rtc->identity(h->base.compiler, sizeof(h->base.compiler));
    *out = &h->base;
    return KPT_OK;
}
