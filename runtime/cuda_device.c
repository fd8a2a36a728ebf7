/* The CUDA backend (see cuda_device.h). */
#include <math.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda_source.h"
#include "target/target.h"
#include "base/diag.h"
#include "base/clock.h"
#include "runtime/attention_args.h"
#include "runtime/kernel_args.h"
#include "runtime/paged_args.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_tma.h"
#include "runtime/backward_grid.h"
#include "runtime/forward_grid.h"

bool kpt_cuda_wgmma_enabled(int device_sm, int target_sm)
{
    const char *e = getenv("KPT_CUDA_WGMMA");
    return device_sm == 90 && target_sm == 90 && !(e && !strcmp(e, "0"));
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
    KPT_CU_TRY(diag,
               cu->DeviceGetAttribute(&dev->smem_per_sm, KPT_CU_ATTR_SMEM_PER_SM, dev->dev));
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

/* An entry point that takes `bytes` of dynamic shared memory. */
static kpt_status get_function_smem(kpt_cuda_kernel *k, CUfunction *f, const char *name,
                                    size_t bytes, kpt_diag *diag)
{
    const kpt_cu_api *cu = k->dev->cu;
    CUresult r = cu->ModuleGetFunction(f, k->module, name);
    if (r)
        return kpt_cu_fail(diag, name, r);
    if ((r = cu->FuncSetAttribute(*f, KPT_CU_FUNC_MAX_DYNAMIC_SMEM, (int)bytes)))
        return kpt_cu_fail(diag, "cuFuncSetAttribute(max dynamic shared memory)", r);
    return KPT_OK;
}

/* An entry point that takes the plan's dynamic shared memory. */
static kpt_status get_big_function(kpt_cuda_kernel *k, CUfunction *f, const char *name,
                                   kpt_diag *diag)
{
    return get_function_smem(k, f, name, k->plan.smem_bytes, diag);
}

static kpt_status load_attention(kpt_cuda_kernel *k, kpt_diag *diag)
{
    return get_big_function(k, &k->attention, KPT_CUDA_ATTENTION_ENTRY, diag);
}

static kpt_status load_backward(kpt_cuda_kernel *k, kpt_diag *diag)
{
    CUresult r = k->dev->cu->ModuleGetFunction(&k->bwd_prep, k->module, KPT_CUDA_BWD_PREP_ENTRY);
    if (r)
        return kpt_cu_fail(diag, KPT_CUDA_BWD_PREP_ENTRY, r);
    r = k->dev->cu->ModuleGetFunction(&k->bwd_daux, k->module, KPT_CUDA_BWD_DAUX_ENTRY);
    if (r)
        return kpt_cu_fail(diag, KPT_CUDA_BWD_DAUX_ENTRY, r);
    r = k->dev->cu->ModuleGetFunction(&k->bwd_dsinks, k->module, KPT_CUDA_BWD_DSINKS_ENTRY);
    if (r)
        return kpt_cu_fail(diag, KPT_CUDA_BWD_DSINKS_ENTRY, r);
    if (k->plan.cfg.wgmma &&
        (r = k->dev->cu->ModuleGetFunction(&k->bwd_dq_store, k->module, KPT_CUDA_BWD_DQ_STORE_ENTRY)))
        return kpt_cu_fail(diag, KPT_CUDA_BWD_DQ_STORE_ENTRY, r);
    kpt_status st = get_big_function(k, &k->bwd_dkdv, KPT_CUDA_BWD_DKDV_ENTRY, diag);
    if (!st && k->plan.aux_grads)
        st = get_big_function(k, &k->bwd_dkdv_aux, KPT_CUDA_BWD_DKDV_AUX_ENTRY, diag);
    return st ? st
              : get_function_smem(k, &k->bwd_dq, KPT_CUDA_BWD_DQ_ENTRY, k->plan.dq_smem_bytes,
                                  diag);
}

/* Whether a kernel's second launch goes as a programmatic dependent of its first (sm_90
 * kernels on sm_90 devices, a driver with cuLaunchKernelEx, KPT_CUDA_PDL not "0" when the
 * kernel is loaded): the serving combine after the attention, the backward's dQ (or its
 * conversion) after kpt_bwd_dkdv. Its CTAs are then scheduled while the first kernel's last
 * CTAs run; where it reads that kernel's results it waits for them in the kernel (kpt_grid_wait,
 * templates/cuda/common.cu, or per kv head: kpt_count_wait in hopper.cu), so the launch gap
 * between the two goes, and kpt_bwd_dq, which needs nothing of kpt_bwd_dkdv, fills the SMs its
 * last CTAs leave idle. */
static bool want_pdl(const kpt_cuda_kernel *k)
{
    const char *e = getenv("KPT_CUDA_PDL");
    return k->dev->sm >= 90 && k->plan.cfg.sm >= 90 && k->dev->cu->LaunchKernelEx &&
           !(e && !strcmp(e, "0"));
}

/* Launches f with one launch attribute (cuLaunchKernelEx). */
static CUresult launch_with(const kpt_cu_api *cu, CUfunction f, const unsigned grid[3],
                           unsigned threads, unsigned smem, CUstream stream, void **params,
                           kpt_cu_launch_attr attr)
{
    kpt_cu_launch_config cfg = {.grid = {grid[0], grid[1], grid[2]}, .block = {threads, 1, 1},
                                .shared_bytes = smem, .stream = stream, .attrs = &attr,
                                .num_attrs = 1};
    return cu->LaunchKernelEx(&cfg, f, params, NULL);
}

/* Launches f after the stream's last kernel, as its programmatic dependent where k->pdl. */
static CUresult launch_dependent(const kpt_cuda_kernel *k, CUfunction f, const unsigned grid[3],
                                 unsigned threads, unsigned smem, CUstream stream, void **params)
{
    const kpt_cu_api *cu = k->dev->cu;
    if (!k->pdl)
        return cu->LaunchKernel(f, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream, params,
                                NULL);
    return launch_with(cu, f, grid, threads, smem, stream, params,
                       (kpt_cu_launch_attr){.id = KPT_CU_LAUNCH_PROGRAMMATIC, .value.i = 1});
}

/* The fewest CTAs of a serving kernel an SM holds, at the plain ring's shared memory (the deeper
 * ring runs only where a plan keeps one CTA an SM); 1 where the driver cannot say. */
static int paged_per_sm(const kpt_cuda_kernel *k)
{
    const kpt_cu_api *cu = k->dev->cu;
    int least = 0;
    for (int i = 0; i < 3; i++) {
        int n = 0;
        if (!cu->OccupancyMaxActiveBlocksPerMultiprocessor ||
            cu->OccupancyMaxActiveBlocksPerMultiprocessor(&n, k->paged[i], k->plan.warps * 32,
                                                          k->plan.smem_bytes) ||
            n < 1)
            return 1;
        least = i == 0 || n < least ? n : least;
    }
    return least;
}

static kpt_status load_paged(kpt_cuda_kernel *k, kpt_diag *diag)
{
    static const char *const names[] = KPT_CUDA_PAGED_ENTRIES;
    /* launches take plan.smem_bytes, or deep_smem_bytes for the deeper ring */
    const size_t smem = k->plan.deep_smem_bytes > k->plan.smem_bytes ? k->plan.deep_smem_bytes
                                                                      : k->plan.smem_bytes;
    for (int i = 0; i < 3; i++) {
        kpt_status st = get_function_smem(k, &k->paged[i], names[i], smem, diag);
        if (st)
            return st;
    }
    k->paged_per_sm = paged_per_sm(k);
    /* clusters of more than 8 CTAs are "non-portable": allowed per function */
    k->paged_cluster = k->plan.cfg.wgmma && k->dev->cu->LaunchKernelEx &&
                       !k->dev->cu->FuncSetAttribute(k->paged[0], KPT_CU_FUNC_NON_PORTABLE_CLUSTER,
                                                     1);
    CUresult r = k->dev->cu->ModuleGetFunction(&k->paged_combine, k->module,
                                               KPT_CUDA_PAGED_COMBINE_ENTRY);
    return r ? kpt_cu_fail(diag, KPT_CUDA_PAGED_COMBINE_ENTRY, r) : KPT_OK;
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
    k->pdl = want_pdl(k);
    const kpt_cu_api *cu = dev->cu;
    double t0 = kpt_now_ms();
    CUresult r = cu->ModuleLoadData(&k->module, cubin);
    if (r)
        st = kpt_cu_fail(diag, "cuModuleLoadData", r);
    if (!st)
        st = plan->cfg.kind == KPT_KERNEL_BACKWARD ? load_backward(k, diag)
             : plan->cfg.kind == KPT_KERNEL_PAGED  ? load_paged(k, diag)
                                                   : load_attention(k, diag);
    if (!st && plan->has_blockmap &&
        (r = cu->ModuleGetFunction(&k->blockmap, k->module, KPT_CUDA_BLOCKMAP_ENTRY)))
        st = kpt_cu_fail(diag, "cuModuleGetFunction(blockmap)", r);
    if (!st && plan->has_blockmap && plan->cfg.wgmma &&
        (r = cu->ModuleGetFunction(&k->blockmap_order, k->module, KPT_CUDA_BLOCKMAP_ORDER_ENTRY)))
        st = kpt_cu_fail(diag, "cuModuleGetFunction(blockmap order)", r);
    if (!st && plan->mask_bits &&
        (r = cu->ModuleGetFunction(&k->blockmap_bits, k->module, KPT_CUDA_BLOCKMAP_BITS_ENTRY)))
        st = kpt_cu_fail(diag, "cuModuleGetFunction(blockmap bits)", r);
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
    c.wgmma = c.wgmma || kpt_cuda_wgmma_enabled(dev->sm, c.sm);
    const kpt_target *t = kpt_target_for(KPT_BACKEND_CUDA, &c);
    if (!t)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED, "no CUDA target for sm_%d%s", c.sm,
                            c.wgmma ? "a" : "");
    kpt_kernel_request rq = {.kind = c.kind, .dtype = c.dtype, .dqk = c.dqk, .dv = c.dv,
                             .smem_limit = dev->smem_optin, .tall = c.tall};
    double t0 = kpt_now_ms();
    kpt_kernel_plan plan;
    char *src = NULL;
    kpt_status st = kpt_kernel_generate(t, p, &rq, &plan, &src, diag);
    double codegen_ms = kpt_now_ms() - t0;
    kpt_rtc_output nv = {0};
    if (!st)
        st = kpt_kernel_compile(t, src, &plan, KPT_RTC_VERBOSE, &nv, diag);
    free(src);
    if (!st)
        st = kpt_cuda_kernel_load(dev, p, &plan, nv.binary, out, diag);
    if (!st) {
        (*out)->codegen_ms = codegen_ms;
        (*out)->nvrtc_ms = nv.ms;
        keep_ptxas_info(*out, nv.log);
    }
    kpt_rtc_output_free(&nv);
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

kpt_status kpt_cuda_blockmap_size(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                  size_t *bytes, kpt_diag *diag)
{
    *bytes = 0;
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    kpt_kernel_args a;
    kpt_status st = kpt_kernel_args_pack(k->pattern, &k->plan, "CUDA", args, &a, diag);
    *bytes = st ? 0 : kpt_kernel_args_map_bytes(&k->plan, &a);
    return st;
}

static kpt_status launch_blockmap(const kpt_cuda_kernel *k, kpt_kernel_args *a, CUstream stream,
                                  kpt_diag *diag)
{
    if (a->n_qt == 0 || a->n_kt == 0)
        return KPT_OK;
    void *params[] = {a};
    int64_t pairs = (int64_t)a->n_qt * a->n_kt, ctas = (pairs + 7) / 8; /* one warp a pair */
    if (ctas > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "block map too large (%lld tile pairs)",
                            (long long)pairs);
    const unsigned rows_h = k->plan.bm_per_h ? (unsigned)a->Hq : 1;
    const unsigned rows_b = k->plan.bm_per_b ? (unsigned)a->B : 1;
    KPT_CU_TRY(diag, k->dev->cu->LaunchKernel(k->blockmap, (unsigned)ctas, rows_h, rows_b, 256, 1,
                                              1, 0, stream, params, NULL));
    /* the sm_90a kernel's CTA order, one CTA per map row (and the slots of keep bits) */
    if (k->blockmap_order)
        KPT_CU_TRY(diag, k->dev->cu->LaunchKernel(k->blockmap_order, 1, rows_h, rows_b, 1024, 1,
                                                  1, 0, stream, params, NULL));
    /* the keep bits: a CTA per line and group of 8 tiles along it, per layout */
    const int64_t groups = kpt_kernel_bits_ctas(&k->plan, a);
    if (k->blockmap_bits && groups > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "block map too large (%lld tile groups)",
                            (long long)groups);
    if (k->blockmap_bits)
        KPT_CU_TRY(diag, k->dev->cu->LaunchKernel(k->blockmap_bits, (unsigned)groups, rows_h,
                                                  rows_b, 256, 1, 1, 0, stream, params, NULL));
    return KPT_OK;
}

kpt_status kpt_cuda_blockmap_build(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                   CUdeviceptr map, CUstream stream, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    if (!k->plan.has_blockmap)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "pattern '%s' needs no block map on this kernel (its mask reads no "
                            "aux tensor and its partial tiles keep no bits)",
                            k->pattern->name);
    if (!map)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "block map pointer is NULL");
    kpt_kernel_args a;
    kpt_status st = kpt_kernel_args_pack(k->pattern, &k->plan, "CUDA", args, &a, diag);
    if (st)
        return st;
    a.blockmap = map;
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    return launch_blockmap(k, &a, stream, diag);
}

/* A kernel's memo of a yes or no for the last call's lengths and scalars (grid_memo, tall_memo,
 * dq_memo): its key (kpt_forward_key, kpt_backward_key) with the answer in bit 0, 0 when none
 * yet. A cache, not part of the kernel's meaning, so updated through a const kernel. memo_find:
 * whether the slot holds the answer for key (in *answer); memo_keep stores it and returns it. */
static bool memo_find(const _Atomic uint64_t *slot, uint64_t key, bool *answer)
{
    const uint64_t memo = atomic_load_explicit((_Atomic uint64_t *)slot, memory_order_relaxed);
    *answer = memo & 1;
    return (memo | 1) == (key | 1);
}

static bool memo_keep(const _Atomic uint64_t *slot, uint64_t key, bool answer)
{
    atomic_store_explicit((_Atomic uint64_t *)slot, (key & ~1ull) | answer, memory_order_relaxed);
    return answer;
}

/* The sm_90a forward's CTAs (runtime/forward_grid.h). Where the kv length alone does not make
 * the items short, the mask's live ranges decide, memoised per kernel for the last lengths and
 * scalars (a relaxed atomic: two threads at worst both compute it). */
static unsigned forward_ctas(const kpt_cuda_kernel *k, const kpt_kernel_args *a)
{
    const int64_t items = (int64_t)a->n_qt * a->Hq * a->B;
    bool short_items = kpt_forward_short_by_length(a->n_kt);
    if (!short_items && k->plan.has_mask && !k->plan.mask_loads && items > k->dev->sm_count) {
        const kpt_pattern *p = k->pattern;
        const uint64_t key = kpt_forward_key(a->Sq, a->Skv, a->Hq, a->scalars, p->num_scalars);
        if (!memo_find(&k->grid_memo, key, &short_items)) {
            kpt_ir_value scalars[KPT_MAX_SCALARS] = {{0}};
            kpt_forward_scalars(p, a->scalars, scalars);
            short_items = memo_keep(&k->grid_memo, key,
                                    kpt_forward_items_short(p, &k->plan, a->Sq, a->Skv, a->Hq,
                                                            scalars));
        }
    }
    return (unsigned)kpt_forward_ctas(items, k->dev->sm_count, short_items);
}

void kpt_cuda_kernel_pair(kpt_cuda_kernel *k, const kpt_cuda_kernel *tall)
{
    atomic_store_explicit(&k->tall, tall, memory_order_release);
}

/* Whether a call (its arguments packed for k) takes k's tall variant, memoised as the grid. */
static bool take_tall(const kpt_cuda_kernel *k, const kpt_cuda_kernel *tall,
                      const kpt_kernel_args *a)
{
    const int forced = kpt_forward_tall_forced();
    if (forced >= 0)
        return forced;
    const kpt_pattern *p = k->pattern;
    const uint64_t key = kpt_forward_key(a->Sq, a->Skv, a->Hq, a->scalars, p->num_scalars);
    bool pays;
    if (memo_find(&k->tall_memo, key, &pays))
        return pays;
    kpt_ir_value scalars[KPT_MAX_SCALARS] = {{0}};
    kpt_forward_scalars(p, a->scalars, scalars);
    return memo_keep(&k->tall_memo, key,
                     kpt_forward_tall_pays(p, &k->plan, &tall->plan, a->Sq, a->Skv, a->Hq,
                                           scalars));
}

kpt_status kpt_cuda_attention(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                              CUdeviceptr map, CUstream stream, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    if (k->plan.cfg.kind != KPT_KERNEL_FORWARD)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "this is a %s kernel, not a forward one",
                            k->plan.cfg.kind == KPT_KERNEL_PAGED ? "serving" : "backward");
    kpt_kernel_args a;
    kpt_status st = kpt_kernel_args_pack(k->pattern, &k->plan, "CUDA", args, &a, diag);
    if (st)
        return st;
    /* the tall variant has no block map (plan.tall_variant): a call with one keeps k */
    const kpt_cuda_kernel *tall = atomic_load_explicit(&k->tall, memory_order_acquire);
    if (tall && !map && a.Sq > 0 && take_tall(k, tall, &a)) {
        k = tall;
        if ((st = kpt_kernel_args_pack(k->pattern, &k->plan, "CUDA", args, &a, diag)))
            return st;
    }
    if (a.Sq == 0 || a.B == 0 || a.Hq == 0)
        return KPT_OK;
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    const kpt_cu_api *cu = k->dev->cu;
    /* the sm_90a kernel numbers its CTAs in 32 bits (kpt_cta_tile) */
    if (k->plan.cfg.wgmma && (int64_t)a.n_qt * a.Hq * a.B > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT, "too many q tiles (%lld) for one launch",
                            (long long)a.n_qt * a.Hq * a.B);
    /* the sm_90a kernel reads q, k and v through TMA maps, its second parameter */
    kpt_kernel_tma tma;
    if (k->plan.cfg.wgmma && (st = kpt_cuda_tma_pack(cu, &k->plan, &a, &tma, diag)))
        return st;
    CUdeviceptr tmp = 0;
    if (k->plan.has_blockmap && !map) {
        size_t bytes = kpt_kernel_args_map_bytes(&k->plan, &a);
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
    void *params[] = {&a, &tma};
    unsigned gx = (unsigned)a.n_qt, gy = (unsigned)a.Hq, gz = (unsigned)a.B;
    if (k->plan.cfg.wgmma) {
        gx = forward_ctas(k, &a);
        gy = gz = 1;
    }
    CUresult r = cu->LaunchKernel(k->attention, gx, gy, gz, (unsigned)(k->plan.warps * 32), 1, 1,
                                  (unsigned)k->plan.smem_bytes, stream, params, NULL);
    if (tmp)
        cu->MemFreeAsync(tmp, stream);
    if (r)
        return kpt_cu_fail(diag, "cuLaunchKernel(attention)", r);
    return KPT_OK;
}

kpt_status kpt_cuda_backward_workspace(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                       const kpt_attention_grads *grads, size_t *bytes,
                                       kpt_diag *diag)
{
    *bytes = 0;
    kpt_kernel_args a;
    kpt_kernel_gargs ga;
    kpt_bwd_workspace ws;
    kpt_status st = grads ? kpt_kernel_bwd_pack(k->pattern, &k->plan, "CUDA", args, grads, &a,
                                                &ga, &ws, diag)
                          : kpt_kernel_args_pack(k->pattern, &k->plan, "CUDA", args, &a, diag);
    if (!st)
        *bytes = grads ? ws.bytes : kpt_kernel_args_bwd_workspace(&k->plan, &a, false);
    return st;
}

/* kpt_bwd_dq's CTAs along a head: one per plan.dq_rows queries (a q tile, or two) */
static unsigned dq_ctas(const kpt_kernel_plan *pl, const kpt_kernel_args *a)
{
    const int tiles = pl->dq_rows / pl->bm;
    return (unsigned)((a->n_qt + tiles - 1) / tiles);
}

/* The backward launches (attention_bwd.cu), in order on the stream: the accumulators zeroed,
 * delta, dK/dV (and the aux terms, and dQ's atomic sums), dQ (or its sums converted), then each
 * aux gradient out of its accumulators. */
static kpt_status launch_backward(const kpt_cuda_kernel *k, kpt_kernel_args *a,
                                  kpt_kernel_gargs *g, const kpt_bwd_workspace *ws,
                                  CUdeviceptr base, CUstream stream, kpt_diag *diag)
{
    const kpt_cu_api *cu = k->dev->cu;
    /* the sm_90a kpt_bwd_dkdv and kpt_bwd_dq read q, dout, k and v through TMA maps, their
     * third parameter, and have a producer warpgroup besides the plan's warps */
    kpt_kernel_bwd_tma tma;
    const bool wg = k->plan.cfg.wgmma;
    kpt_status st = wg ? kpt_cuda_tma_pack_bwd(cu, &k->plan, a, g, &tma, diag) : KPT_OK;
    if (st)
        return st;
    void *params[] = {a, g, &tma};
    const unsigned threads = (unsigned)(k->plan.warps * 32), smem = (unsigned)k->plan.smem_bytes;
    const unsigned big_threads = threads + (wg ? KPT_BWD_PRODUCER_WARPS * 32 : 0);
    /* the aux gradients' sums (kpt_bwd_prep zeroes dq's sums and counts as it reads O and dO) */
    if (ws->bytes > ws->zero_from)
        KPT_CU_TRY(diag, cu->MemsetD8Async(base + ws->zero_from, 0, ws->bytes - ws->zero_from,
                                           stream));
    const unsigned prep_x = (unsigned)((a->Sq + KPT_BWD_PREP_ROWS - 1) / KPT_BWD_PREP_ROWS);
    KPT_CU_TRY(diag, cu->LaunchKernel(k->bwd_prep, prep_x, (unsigned)a->Hq, (unsigned)a->B, 256, 1,
                                      1, 0, stream, params, NULL));
    /* the kernel without the aux gradients' terms unless the call asks for some the score has
     * (the rest are zeros): those terms made the main path spill */
    CUfunction dkdv = g->daux_on && k->plan.aux_grads ? k->bwd_dkdv_aux : k->bwd_dkdv;
    KPT_CU_TRY(diag, cu->LaunchKernel(dkdv, (unsigned)a->n_kt, (unsigned)a->Hkv,
                                      (unsigned)a->B, big_threads, 1, 1, smem, stream, params,
                                      NULL));
    /* dQ's conversion waits for each kv head's kpt_bwd_dkdv CTAs in the kernel (G.dqdone);
     * kpt_bwd_dq reads nothing of it; both run beside its last CTAs (launch_dependent) */
    if (g->dqacc)
        KPT_CU_TRY(diag, launch_dependent(k, k->bwd_dq_store,
                                          (const unsigned[3]){prep_x, (unsigned)a->Hq,
                                                              (unsigned)a->B},
                                          256, 0, stream, params));
    else
        KPT_CU_TRY(diag, launch_dependent(k, k->bwd_dq,
                                          (const unsigned[3]){dq_ctas(&k->plan, a),
                                                              (unsigned)a->Hq, (unsigned)a->B},
                                          big_threads, (unsigned)k->plan.dq_smem_bytes, stream,
                                          params));
    if (g->dsinks) /* after delta; reads lse and delta only */
        KPT_CU_TRY(diag, cu->LaunchKernel(k->bwd_dsinks, (unsigned)a->Hq, 1, 1, 256, 1, 1, 0,
                                          stream, params, NULL));
    for (int i = 0; i < KPT_MAX_AUX; i++) {
        if (!g->dacc[i])
            continue;
        kpt_kernel_daux_out o = ws->out[i];
        o.acc = g->dacc[i];
        o.flag = g->dflag[i];
        const uint64_t n = (uint64_t)kpt_kernel_daux_count(&o);
        void *p[] = {&o};
        KPT_CU_TRY(diag, cu->LaunchKernel(k->bwd_daux, (unsigned)((n + 255) / 256), 1, 1, 256, 1, 1,
                                          0, stream, p, NULL));
    }
    return KPT_OK;
}

/* Whether a default-mode call (its arguments packed for k) sums dQ in kpt_bwd_dkdv, memoised as
 * the forward's grid; if not, kpt_bwd_dq computes it as in the deterministic mode. */
static bool dq_sums(const kpt_cuda_kernel *k, const kpt_kernel_args *a)
{
    const int forced = kpt_backward_dq_sums_forced();
    if (forced >= 0)
        return forced;
    const kpt_pattern *p = k->pattern;
    const uint64_t key =
        kpt_backward_key(a->Sq, a->Skv, a->Hq, a->Hkv, a->B, a->scalars, p->num_scalars);
    bool sums;
    if (memo_find(&k->dq_memo, key, &sums))
        return sums;
    kpt_ir_value scalars[KPT_MAX_SCALARS] = {{0}};
    kpt_forward_scalars(p, a->scalars, scalars);
    return memo_keep(&k->dq_memo, key,
                     kpt_backward_dq_sums(p, &k->plan, a->Sq, a->Skv, a->Hq, a->Hkv, a->B,
                                          k->dev->sm_count, scalars));
}

kpt_status kpt_cuda_attention_backward(const kpt_cuda_kernel *k, const kpt_attention_args *args,
                                       const kpt_attention_grads *g, CUdeviceptr map,
                                       CUdeviceptr workspace, size_t workspace_bytes,
                                       CUstream stream, kpt_diag *diag)
{
    if (!k)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "kernel is NULL");
    if (k->plan.cfg.kind != KPT_KERNEL_BACKWARD)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "a forward kernel cannot run the backward: get the kernel with "
                            "KPT_DESC_BACKWARD");
    kpt_kernel_args a;
    kpt_kernel_gargs ga;
    kpt_bwd_workspace ws;
    kpt_status st =
        kpt_kernel_bwd_pack(k->pattern, &k->plan, "CUDA", args, g, &a, &ga, &ws, diag);
    if (st)
        return st;
    if (workspace && workspace_bytes < ws.bytes)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the workspace has %zu bytes; this call needs %zu "
                            "(kpt_kernel_backward_workspace)", workspace_bytes, ws.bytes);
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    const kpt_cu_api *cu = k->dev->cu;
    CUdeviceptr tmp_ws = 0, tmp_map = 0;
    if (!workspace)
        KPT_CU_TRY(diag, cu->MemAllocAsync(&tmp_ws, ws.bytes, stream));
    const CUdeviceptr base = workspace ? workspace : tmp_ws;
    ga.delta = base;
    /* the workspace keeps room for dQ's sums either way (its size does not depend on this) */
    const bool sums = ws.dqacc && dq_sums(k, &a);
    ga.dqacc = sums ? base + ws.dqacc : 0;
    ga.dqdone = sums ? base + ws.dqdone : 0;
    for (int i = 0; i < KPT_MAX_AUX; i++)
        if (ws.acc[i]) {
            ga.dacc[i] = base + ws.acc[i];
            ga.dflag[i] = base + ws.flag[i];
        }
    a.blockmap = map;
    if (k->plan.has_blockmap && !map) {
        size_t bytes = kpt_kernel_args_map_bytes(&k->plan, &a);
        CUresult r = cu->MemAllocAsync(&tmp_map, bytes, stream);
        if (r)
            st = kpt_cu_fail(diag, "cuMemAllocAsync(block map)", r);
        a.blockmap = tmp_map;
        if (!st)
            st = launch_blockmap(k, &a, stream, diag);
    }
    if (!st)
        st = launch_backward(k, &a, &ga, &ws, base, stream, diag);
    if (tmp_map)
        cu->MemFreeAsync(tmp_map, stream);
    if (tmp_ws)
        cu->MemFreeAsync(tmp_ws, stream);
    return st;
}

/* ---- serving ----------------------------------------------------------------------------- */

kpt_status kpt_cuda_paged_plan(const kpt_cuda_kernel *k, const kpt_paged_shape *shape,
                               kpt_paged_plan *out, kpt_diag *diag)
{
    if (!k || k->plan.cfg.kind != KPT_KERNEL_PAGED)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a serving kernel (get it with KPT_DESC_PAGED)");
    /* Split until the CTAs fill the SMs once, one CTA each. A CTA's fixed costs (its start,
     * the merge of its warps, the combine's share) are paid once per part, and two parts per
     * SM, as this was, streamed up to 12 % slower than one longer part (H100, bf16, D = 128,
     * 32:8: 1 x 1 x 4k 765 -> 817 GB/s, 1 x 16 x 4k 519 -> 584; docs/BENCHMARKS.md, "The
     * CTA's end"); counts between one and two an SM were slower than either (the SMs with two
     * CTAs finish last). Where a batch has more work items than SMs nothing is split, and two
     * CTAs an SM run at once (plan_paged sizes them for that).
     * The 64-row warpgroup kernel is the exception: its one warpgroup computes S, the softmax
     * and P V of a tile in series, four times the work a byte of the 16-row kernel's, and one
     * CTA an SM left the loads waiting on it. Split for two an SM, each SM then overlaps one
     * CTA's products with the other's softmax (H200, bf16, D = 128, 32:8, 8 x 16 x 32k,
     * sustained: 3466-3478 -> 4071-4079 GB/s contiguous, page 16 3268-3281 -> 3838-3855;
     * docs/BENCHMARKS.md, "Serving: two CTAs an SM for 64 rows"). Only where each part keeps
     * KPT_PAGED_TWO_TILES tiles: shorter parts were level on the H200 (1 x 16 x 32k, 8 x 16 x
     * 4k), and there the fixed costs above decide.
     * Before both: where the batch has too few work items for one CTA an SM (under 90 % of the SMs
     * busy: 9 sequences x 8 kv heads, unsplit, left 60 of 132 SMs idle; or unsplit with any SM
     * idle: 16 x 8 kv heads, 16 x 1 x 32k 509 -> 480 us, 16 x 16 x 32k 584 -> 494), it is split for
     * one wave of as many CTAs an SM as fit (paged_per_sm: 2 at head dims 64 to 256; 3 at 64 while
     * its tiles had 64 keys): a CTA streams at most ~40 GB/s at D = 128 (its ring's loads in
     * flight), less at 64, so the bandwidth needs more CTAs than a thin wave has (H200, bf16, 32:8,
     * page 16, us in CUDA graphs: 9 x 1 x 32k 435 -> 280 at 3 parts, 12 x 1 x 32k 443 -> 370, 10 x
     * 1 x 8k 115 -> 86, 14 x 1 x 16k 239 -> 220, 9 x 16 x 32k 575 -> 291; D = 64: 9 x 1 x 32k 336
     * -> 150 at 5 parts, 12 x 1 x 8k 92 -> 57; docs/BENCHMARKS.md, "Serving: split counts for thin
     * waves"). Where three CTAs fit an SM (head dim 64 with 64-key tiles, whose CTA streamed ~10-20
     * GB/s), full waves of one CTA an SM fall short too, and every plan is made for the three,
     * while each part keeps 4 tiles (8 x 1 x 32k 160 -> 131 us at 6 parts, 16 x 1 x 32k 359 -> 251,
     * 2 x 1 x 8k 17.5 -> 14.4; one sequence of 4k keys keeps 16 parts, 9.8 us, where 32 ran 10.1).
     */
    return kpt_paged_plan_sms(shape, k->dev->sm_count, k->plan.cfg.wgmma, k->paged_per_sm,
                              k->plan.cfg.dv, out, diag);
}

/* Whether a split run of the 16-row kernel (fi 0) launches each block's splits as one thread
 * block cluster that combines their results in distributed shared memory (templates/cuda/
 * paged.cu, kpt_pg_cluster_combine) instead of a combine launch. Pairs only, in one wave: a
 * cluster's CTAs start together on one GPC, and larger clusters in a full wave lost more to that
 * than the combine launch costs. H200, bf16, D = 128, 32:8, us a run in CUDA graphs, combine
 * launch / cluster: 8 x 1 x 4k in 2 splits 39.7 / 38.0 (page 16: 40.6 / 38.3), 8 x 4 x 4k 41.3
 * / 40.0; 4 x 1 x 8k in 4 splits 39.8 / 40.9; 2 x 4 x 16k in 8 splits 41.1 / 43.8; 1 x 1 x 4k
 * in 16 splits 10.3 / 11.3 (docs/BENCHMARKS.md, "Serving: the combine in a cluster").
 * KPT_CUDA_CLUSTER in the environment: 0 never, 1 wherever the kernel allows it (2 to 16
 * splits, any grid: the tests' way to run the cluster combine everywhere). */
#define KPT_CLUSTER_MAX_SPLITS 2
#define KPT_CLUSTER_MAX_CTAS 16 /* the largest cluster (non-portable) */
static bool cluster_combine(const kpt_cuda_kernel *k, const kpt_paged_plan *plan, int fi)
{
    const char *e = getenv("KPT_CUDA_CLUSTER");
    if (!k->paged_cluster || fi != 0 || plan->splits < 2 || plan->splits > KPT_CLUSTER_MAX_CTAS ||
        (e && !strcmp(e, "0")))
        return false;
    if (e && !strcmp(e, "1"))
        return true;
    return plan->splits <= KPT_CLUSTER_MAX_SPLITS && kpt_paged_one_per_sm(plan, k->dev->sm_count);
}

kpt_status kpt_cuda_paged(const kpt_cuda_kernel *k, const kpt_paged_plan *plan,
                          const kpt_paged_args *args, CUdeviceptr workspace,
                          CUstream stream, kpt_diag *diag)
{
    if (!k || k->plan.cfg.kind != KPT_KERNEL_PAGED)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "not a serving kernel (get it with KPT_DESC_PAGED)");
    kpt_kernel_args a;
    kpt_kernel_pargs pa;
    kpt_status st = kpt_kernel_paged_pack(k->pattern, &k->plan, "CUDA", plan, args, &a, &pa, diag);
    if (st)
        return st;
    if (plan->rows > KPT_PAGED_ROWS || plan->rows < 1 ||
        !kpt_paged_plan_ok(plan, KPT_PAGED_ROWS, k->plan.cfg.dv))
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT,
                            "the plan was not made by kpt_paged_plan_make for this kernel");
    /* the kernel's row offsets, and page offsets where there are pages, are 32-bit products */
    const int64_t lim = INT32_MAX;
    const int64_t page_k = pa.paged ? a.ks[0] : 0, page_v = pa.paged ? a.vs[0] : 0;
    if (a.ks[1] > lim || a.vs[1] > lim || page_k > lim || page_v > lim)
        return kpt_diag_set(diag, KPT_ERR_LIMIT,
                            "the cache's page and row strides (k: %lld, %lld; v: %lld, %lld "
                            "elements) must be below 2^31 on CUDA",
                            (long long)a.ks[0], (long long)a.ks[1], (long long)a.vs[0],
                            (long long)a.vs[1]);
    if (workspace % 256)
        return kpt_diag_set(diag, KPT_ERR_INVALID_ARGUMENT, "workspace must be 256-byte aligned");
    const int64_t blocks = plan->blocks;
    if (blocks <= 0 || plan->batch == 0)
        return KPT_OK;
    /* the combine's CTAs: 4, 2 or 1 rows each (kpt_pg_cwpr in templates/cuda/paged.cu) */
    const int combine_rows = plan->splits >= 16 ? 1 : plan->splits >= 8 ? 2 : 4;
    const int64_t combine_ctas = blocks * ((plan->rows + combine_rows - 1) / combine_rows);
    if (plan->splits > 1 && combine_ctas > INT32_MAX)
        return kpt_diag_set(diag, KPT_ERR_LIMIT,
                            "%lld query blocks: too many to combine split results in one launch",
                            (long long)blocks);
    if ((st = kpt_cuda_make_current(k->dev, diag)))
        return st;
    const kpt_cu_api *cu = k->dev->cu;
    CUdeviceptr tmp = 0;
    if (plan->workspace_bytes && !workspace) {
        KPT_CU_TRY(diag, cu->MemAllocAsync(&tmp, plan->workspace_bytes, stream));
        workspace = tmp;
    }
    if (plan->splits > 1) {
        size_t lse_off;
        kpt_paged_workspace_bytes(plan, KPT_PAGED_ROWS, k->plan.cfg.dv, &lse_off);
        pa.part_o = workspace;
        pa.part_lse = workspace + lse_off;
    }
    const int wr = (plan->rows + 15) / 16, fi = wr <= 1 ? 0 : wr <= 2 ? 1 : 2; /* row blocks */
    /* the deeper ring where pages are smaller than a tile and the split leaves one CTA an SM
     * (plan_paged, stages_deep); its shared memory would keep a second CTA off the SM where
     * the plan has two (page 16, 8 x 16 x 32k on the H200: 2960-3053 GB/s with the third
     * stage, 3838-3855 without) */
    const bool deep = k->plan.stages_deep && pa.paged && pa.page_size < k->plan.bn &&
                      plan->splits > 1 && kpt_paged_one_per_sm(plan, k->dev->sm_count);
    CUfunction f = k->paged[fi];
    pa.stages = deep ? k->plan.stages_deep : k->plan.stages;
    const size_t smem = deep ? k->plan.deep_smem_bytes : k->plan.smem_bytes;
    void *params[] = {&a, &pa};
    const unsigned grid[3] = {(unsigned)(blocks * plan->splits), (unsigned)a.Hkv, 1};
    const unsigned threads = k->plan.warps * 32u;
    CUresult r = 1;
    if (cluster_combine(k, plan, fi)) {
        pa.cluster = 1;
        r = launch_with(cu, f, grid, threads, (unsigned)smem, stream, params,
                        (kpt_cu_launch_attr){.id = KPT_CU_LAUNCH_CLUSTER_DIM,
                                             .value.dim = {(unsigned)plan->splits, 1, 1}});
        /* refused (no room for such a cluster): the combine launch instead */
        pa.cluster = r == 0;
    }
    if (!pa.cluster)
        r = cu->LaunchKernel(f, grid[0], grid[1], grid[2], threads, 1, 1, (unsigned)smem, stream,
                             params, NULL);
    if (!r && plan->splits > 1 && !pa.cluster)
        r = launch_dependent(k, k->paged_combine,
                             (const unsigned[3]){(unsigned)combine_ctas, (unsigned)a.Hkv, 1}, 128,
                             0, stream, params);
    if (tmp)
        cu->MemFreeAsync(tmp, stream);
    if (r)
        return kpt_cu_fail(diag, "cuLaunchKernel(paged)", r);
    return KPT_OK;
}
