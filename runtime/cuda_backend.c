/* The CUDA backend (see cuda_backend.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda_source.h"
#include "ir/diag.h"
#include "runtime/clock.h"
#include "runtime/attention_args.h"
#include "runtime/cuda_args.h"
#include "runtime/cuda_backend.h"
#include "runtime/nvrtc.h"

int kpt_cuda_target_sm(const char *t)
{
    static const char *const known[] = {"cuda:sm_80", "cuda:sm_86", "cuda:sm_89", "cuda:sm_90"};
    static const int sms[] = {80, 86, 89, 90};
    for (int i = 0; i < 4; i++)
        if (t && !strcmp(t, known[i]))
            return sms[i];
    return -1;
}

kpt_status kpt_cuda_device_open(int ordinal, kpt_cuda_device *dev, kpt_diag *diag)
{
    memset(dev, 0, sizeof(*dev));
    const kpt_cu_api *cu = kpt_cu_load(diag);
    if (!cu)
        return KPT_ERR_NO_DEVICE;
    int count = 0;
    KPT_CU_TRY(diag, cu->DeviceGetCount(&count));
    if (ordinal < 0 || ordinal >= count)
        return kpt_diag_set(diag, KPT_ERR_NO_DEVICE, "CUDA device %d does not exist (%d found)",
                            ordinal, count);
    KPT_CU_TRY(diag, cu->DeviceGet(&dev->dev, ordinal));
    int major = 0, minor = 0;
    KPT_CU_TRY(diag, cu->DeviceGetAttribute(&major, KPT_CU_ATTR_CC_MAJOR, dev->dev));
    KPT_CU_TRY(diag, cu->DeviceGetAttribute(&minor, KPT_CU_ATTR_CC_MINOR, dev->dev));
    KPT_CU_TRY(diag, cu->DeviceGetAttribute(&dev->sm_count, KPT_CU_ATTR_SM_COUNT, dev->dev));
    KPT_CU_TRY(diag, cu->DeviceGetAttribute(&dev->smem_optin, KPT_CU_ATTR_SMEM_OPTIN, dev->dev));
    KPT_CU_TRY(diag, cu->DeviceGetName(dev->name, (int)sizeof(dev->name) - 1, dev->dev));
    dev->sm = major * 10 + minor;
    if (dev->sm < 80)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "CUDA device %d (%s) is sm_%d; kpt needs sm_80 or newer", ordinal,
                            dev->name, dev->sm);
    KPT_CU_TRY(diag, cu->DevicePrimaryCtxRetain(&dev->ctx, dev->dev));
    CUresult r = cu->CtxSetCurrent(dev->ctx);
    if (r) {
        cu->DevicePrimaryCtxRelease(dev->dev);
        dev->ctx = NULL;
        return kpt_cu_fail(diag, "cuCtxSetCurrent", r);
    }
    dev->cu = cu;
    dev->ordinal = ordinal;
    return KPT_OK;
}

void kpt_cuda_device_close(kpt_cuda_device *dev)
{
    if (dev->cu && dev->ctx)
        dev->cu->DevicePrimaryCtxRelease(dev->dev);
    memset(dev, 0, sizeof(*dev));
}

/* The line of ptxas -v output about the attention kernel's registers and spills. */
static void keep_ptxas_info(kpt_cuda_kernel *k, const char *log)
{
    const char *entry = log ? strstr(log, "Function properties for " KPT_CUDA_ATTENTION_ENTRY) : NULL;
    if (!entry)
        return;
    const char *end = strstr(entry, "Compile time");
    size_t n = end ? (size_t)(end - entry) : strlen(entry);
    if (n >= sizeof(k->ptxas_info))
        n = sizeof(k->ptxas_info) - 1;
    memcpy(k->ptxas_info, entry, n);
    k->ptxas_info[n] = 0;
}

kpt_status kpt_cuda_make_current(const kpt_cuda_device *dev, kpt_diag *diag)
{
    CUcontext cur = NULL;
    KPT_CU_TRY(diag, dev->cu->CtxGetCurrent(&cur));
    if (cur != dev->ctx)
        KPT_CU_TRY(diag, dev->cu->CtxSetCurrent(dev->ctx));
    return KPT_OK;
}

kpt_status kpt_cuda_generate(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                             kpt_kernel_plan *plan, char **source, kpt_diag *diag)
{
    *source = NULL;
    kpt_status st = kpt_plan_tiles(p, cfg, plan, diag);
    if (st)
        return st;
    if (smem_limit > 0 && plan->smem_bytes > (size_t)smem_limit)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "the kernel needs %zu bytes of shared memory; the device allows %d",
                            plan->smem_bytes, smem_limit);
    return kpt_cuda_source(p, plan, source, diag);
}

kpt_status kpt_cuda_kernel_load(const kpt_cuda_device *dev, const kpt_pattern *p,
                                const kpt_kernel_plan *plan, const void *cubin,
                                kpt_cuda_kernel **out, kpt_diag *diag)
{
    *out = NULL;
    kpt_status st = kpt_cuda_make_current(dev, diag);
    if (st)
        return st;
    kpt_cuda_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    k->dev = dev;
    k->pattern = p;
    k->plan = *plan;
    const kpt_cu_api *cu = dev->cu;
    double t0 = kpt_now_ms();
    CUresult r = cu->ModuleLoadData(&k->module, cubin);
    if (r)
        st = kpt_cu_fail(diag, "cuModuleLoadData", r);
    if (!st && (r = cu->ModuleGetFunction(&k->attention, k->module, KPT_CUDA_ATTENTION_ENTRY)))
        st = kpt_cu_fail(diag, "cuModuleGetFunction(attention)", r);
    if (!st && plan->has_blockmap &&
        (r = cu->ModuleGetFunction(&k->blockmap, k->module, KPT_CUDA_BLOCKMAP_ENTRY)))
        st = kpt_cu_fail(diag, "cuModuleGetFunction(blockmap)", r);
    if (!st && (r = cu->FuncSetAttribute(k->attention, KPT_CU_FUNC_MAX_DYNAMIC_SMEM,
                                         (int)plan->smem_bytes)))
        st = kpt_cu_fail(diag, "cuFuncSetAttribute(max dynamic shared memory)", r);
    k->load_ms = kpt_now_ms() - t0;
    if (st) {
        kpt_cuda_kernel_destroy(&k);
        return st;
    }
    *out = k;
    return KPT_OK;
}

kpt_status kpt_cuda_kernel_create(const kpt_cuda_device *dev, const kpt_pattern *p,
                                  const kpt_kernel_config *cfg, kpt_cuda_kernel **out,
                                  kpt_diag *diag)
{
    *out = NULL;
    if (!dev || !dev->cu || !p || !cfg)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel_create: NULL argument");
    kpt_kernel_config c = *cfg;
    if (!c.sm)
        c.sm = dev->sm >= 90 ? 90 : dev->sm;
    double t0 = kpt_now_ms();
    kpt_kernel_plan plan;
    char *src = NULL;
    kpt_status st = kpt_cuda_generate(p, &c, dev->smem_optin, &plan, &src, diag);
    double codegen_ms = kpt_now_ms() - t0;
    kpt_nvrtc_output nv = {0};
    if (!st)
        st = kpt_nvrtc_compile(src, c.sm, true, true, &nv, diag);
    free(src);
    if (!st)
        st = kpt_cuda_kernel_load(dev, p, &plan, nv.cubin, out, diag);
    if (!st) {
        (*out)->codegen_ms = codegen_ms;
        (*out)->nvrtc_ms = nv.ms;
        keep_ptxas_info(*out, nv.log);
    }
    kpt_nvrtc_output_free(&nv);
    return st;
}

void kpt_cuda_kernel_destroy(kpt_cuda_kernel **kp)
{
    kpt_cuda_kernel *k = *kp;
    if (!k)
        return;
    if (k->module && !kpt_cuda_make_current(k->dev, NULL))
        k->dev->cu->ModuleUnload(k->module);
    free(k);
    *kp = NULL;
}

/* ---- arguments ------------------------------------------------------------------------------ */

static kpt_status check_tensor(const kpt_tensor *t, const char *name, kpt_dtype want, int64_t d,
                               kpt_diag *diag)
{
    if (t->dtype != want)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s is %s; this kernel was compiled for %s", name,
                            kpt_dtype_name(t->dtype), kpt_dtype_name(want));
    if (t->shape[3] != d)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s has head dim %lld; this kernel was compiled for %lld", name,
                            (long long)t->shape[3], (long long)d);
    if (t->stride[3] != 1)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the head dim must be contiguous (stride 1, not %lld)", name,
                            (long long)t->stride[3]);
    for (int i = 0; i < 3; i++)
        if (t->stride[i] % 8)
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "tensor %s: stride %d (%lld) must be a multiple of 8 elements "
                                "(16-byte rows)", name, i, (long long)t->stride[i]);
    if ((uintptr_t)t->data % 16)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "tensor %s: the data pointer must be 16-byte aligned", name);
    return KPT_OK;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Validates the call against the kernel and fills the argument block. */
static kpt_status pack_args(const kpt_cuda_kernel *k, const kpt_attention_args *a,
                            kpt_cuda_args *out, kpt_diag *diag)
{
    if (!a)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "attention args are NULL");
    kpt_attn_binding bind;
    kpt_status st = kpt_attn_bind(k->pattern, a, &bind, diag);
    if (st)
        return st;
    const kpt_kernel_plan *pl = &k->plan;
    kpt_dtype dt = pl->cfg.dtype;
    if ((st = check_tensor(&a->q, "q", dt, pl->cfg.dqk, diag)) ||
        (st = check_tensor(&a->k, "k", dt, pl->cfg.dqk, diag)) ||
        (st = check_tensor(&a->v, "v", dt, pl->cfg.dv, diag)) ||
        (st = check_tensor(&a->o, "o", dt, pl->cfg.dv, diag)))
        return st;
    if (a->lse.data && a->lse.dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "tensor lse must be f32 on CUDA");
    const kpt_attn_shape *s = &bind.shape;
    if (s->Sq > INT32_MAX - 256 || s->Skv > INT32_MAX - 256 || s->B > 65535 || s->Hq > 65535)
        return kpt_diag_set(diag, KPT_ERR_LIMIT,
                            "shape too large for the CUDA kernel (Sq, Skv < 2^31; B, Hq <= 65535)");
    memset(out, 0, sizeof(*out));
    out->q = (uint64_t)(uintptr_t)a->q.data;
    out->k = (uint64_t)(uintptr_t)a->k.data;
    out->v = (uint64_t)(uintptr_t)a->v.data;
    out->o = (uint64_t)(uintptr_t)a->o.data;
    out->lse = (uint64_t)(uintptr_t)a->lse.data;
    for (int i = 0; i < 4; i++) {
        out->qs[i] = a->q.stride[i];
        out->ks[i] = a->k.stride[i];
        out->vs[i] = a->v.stride[i];
        out->os[i] = a->o.stride[i];
    }
    for (int i = 0; i < 3; i++)
        out->lses[i] = a->lse.data ? a->lse.stride[i] : 0;
    out->B = (int32_t)s->B;
    out->Hq = (int32_t)s->Hq;
    out->Hkv = (int32_t)s->Hkv;
    out->Sq = (int32_t)s->Sq;
    out->Skv = (int32_t)s->Skv;
    out->group = (int32_t)(s->Hq / s->Hkv);
    out->n_qt = (int32_t)((s->Sq + pl->bm - 1) / pl->bm);
    out->n_kt = (int32_t)((s->Skv + pl->bn - 1) / pl->bn);
    out->scale = (float)bind.scale;
    out->scale_log2 = (float)(bind.scale * 1.4426950408889634);
    const kpt_pattern *p = k->pattern;
    for (int i = 0; i < p->num_scalars; i++)
        out->scalars[i] = p->scalars[i].type == KPT_IR_F32 ? float_bits((float)bind.scalars[i].f)
                                                           : (uint32_t)bind.scalars[i].i;
    for (int i = 0; i < p->num_aux; i++) {
        const kpt_ir_auxview *v = &bind.aux[i];
        if ((uintptr_t)v->data % (uintptr_t)kpt_dtype_size(v->dtype))
            return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                                "aux tensor '%s': data pointer not aligned to its element size",
                                p->aux[i].name);
        out->aux[i].ptr = (uint64_t)(uintptr_t)v->data;
        for (int d = 0; d < 3; d++) {
            if (d < v->rank && v->shape[d] > INT32_MAX)
                return kpt_diag_set(diag, KPT_ERR_LIMIT, "aux tensor '%s' is too large",
                                    p->aux[i].name);
            out->aux[i].dim[d] = d < v->rank ? (int32_t)v->shape[d] : 1;
            out->aux[i].stride[d] = d < v->rank ? v->stride[d] : 0;
        }
    }
    /* block map layout [b?][h?][q tile][kv tile] */
    int64_t per_q = out->n_kt, per_h = per_q * out->n_qt;
    int64_t per_b = per_h * (pl->bm_per_h ? s->Hq : 1);
    out->bm_sq = per_q;
    out->bm_sh = pl->bm_per_h ? per_h : 0;
    out->bm_sb = pl->bm_per_b ? per_b : 0;
    return KPT_OK;
}

static size_t map_bytes(const kpt_cuda_kernel *k, const kpt_cuda_args *a)
{
    if (!k->plan.has_blockmap)
        return 0;
    return (size_t)a->n_qt * (size_t)a->n_kt * (size_t)(k->plan.bm_per_h ? a->Hq : 1) *
           (size_t)(k->plan.bm_per_b ? a->B : 1);
}

kpt_status kpt_cuda_blockmap_size(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                  size_t *bytes, kpt_diag *diag)
{
    *bytes = 0;
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    kpt_cuda_args a;
    kpt_status st = pack_args(k, args, &a, diag);
    *bytes = st ? 0 : map_bytes(k, &a);
    return st;
}

static kpt_status launch_blockmap(const kpt_cuda_kernel *k, kpt_cuda_args *a, CUstream stream,
                                  kpt_diag *diag)
{
    if (a->n_qt == 0 || a->n_kt == 0)
        return KPT_OK;
    void *params[] = {a};
    int64_t pairs = (int64_t)a->n_qt * a->n_kt, ctas = (pairs + 7) / 8; /* one warp a pair */
    if (ctas > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "block map too large (%lld tile pairs)",
                            (long long)pairs);
    KPT_CU_TRY(diag, k->dev->cu->LaunchKernel(k->blockmap, (unsigned)ctas,
                                              k->plan.bm_per_h ? (unsigned)a->Hq : 1,
                                              k->plan.bm_per_b ? (unsigned)a->B : 1, 256, 1, 1, 0,
                                              stream, params, NULL));
    return KPT_OK;
}

kpt_status kpt_cuda_blockmap_build(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                   CUdeviceptr map, CUstream stream, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    if (!k->plan.has_blockmap)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "pattern '%s' needs no block map (its mask reads no aux tensor)",
                            k->pattern->name);
    if (!map)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "block map pointer is NULL");
    kpt_cuda_args a;
    kpt_status st = pack_args(k, args, &a, diag);
    if (st)
        return st;
    a.blockmap = map;
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    return launch_blockmap(k, &a, stream, diag);
}

kpt_status kpt_cuda_attention(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                              CUdeviceptr map, CUstream stream, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    kpt_cuda_args a;
    kpt_status st = pack_args(k, args, &a, diag);
    if (st)
        return st;
    if (a.Sq == 0 || a.B == 0 || a.Hq == 0)
        return KPT_OK;
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    const kpt_cu_api *cu = k->dev->cu;
    CUdeviceptr tmp = 0;
    if (k->plan.has_blockmap && !map) {
        size_t bytes = map_bytes(k, &a);
        if (bytes) {
            KPT_CU_TRY(diag, cu->MemAllocAsync(&tmp, bytes, stream));
            a.blockmap = tmp;
            if ((st = launch_blockmap(k, &a, stream, diag))) {
                cu->MemFreeAsync(tmp, stream);
                return st;
            }
        }
    } else {
        a.blockmap = map;
    }
    void *params[] = {&a};
    CUresult r = cu->LaunchKernel(k->attention, (unsigned)a.n_qt, (unsigned)a.Hq, (unsigned)a.B,
                                  (unsigned)(k->plan.warps * 32), 1, 1,
                                  (unsigned)k->plan.smem_bytes, stream, params, NULL);
    if (tmp)
        cu->MemFreeAsync(tmp, stream);
    if (r)
        return kpt_cu_fail(diag, "cuLaunchKernel(attention)", r);
    return KPT_OK;
}
