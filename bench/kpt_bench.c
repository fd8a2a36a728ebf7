/* A thin C ABI over the CUDA backend for the benchmark's Python front (ctypes). It stands in
 * until the public runtime API ("Embeddable runtime") exists; the Python side passes torch
 * tensors' device pointers, element strides and the current stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kpt/kpt.h>

#include "compiler/parse_pattern.h"
#include "runtime/cuda_backend.h"

#define API __attribute__((visibility("default")))

typedef struct kptb_kernel {
    kpt_pattern *p;
    kpt_cuda_kernel *k;
} kptb_kernel;

static kpt_cuda_device dev;
static bool dev_open;

static int fail(char *err, int n, const kpt_diag *d)
{
    snprintf(err, (size_t)n, "%s", d->message);
    return -1;
}

API void *kptb_kernel_create(const char *pattern, int bf16, int dqk, int dv, char *err, int n)
{
    kpt_diag d = {0};
    if (!dev_open) {
        if (kpt_cuda_device_open(0, &dev, &d)) {
            fail(err, n, &d);
            return NULL;
        }
        dev_open = true;
    }
    kptb_kernel *kb = calloc(1, sizeof(*kb));
    if (!kb || kpt_pattern_parse(pattern, &kb->p, &d)) {
        fail(err, n, &d);
        free(kb);
        return NULL;
    }
    kpt_kernel_config cfg = {.dtype = bf16 ? KPT_DTYPE_BF16 : KPT_DTYPE_F16, .dqk = dqk, .dv = dv};
    if (kpt_cuda_kernel_create(&dev, kb->p, &cfg, &kb->k, &d)) {
        fail(err, n, &d);
        kpt_pattern_destroy(&kb->p);
        free(kb);
        return NULL;
    }
    return kb;
}

API double kptb_compile_ms(const void *h)
{
    const kptb_kernel *kb = h;
    return kb->k->codegen_ms + kb->k->nvrtc_ms + kb->k->load_ms;
}

API const char *kptb_ptxas_info(const void *h)
{
    return ((const kptb_kernel *)h)->k->ptxas_info;
}

API void kptb_kernel_destroy(void *h)
{
    kptb_kernel *kb = h;
    if (!kb)
        return;
    kpt_cuda_kernel_destroy(&kb->k);
    kpt_pattern_destroy(&kb->p);
    free(kb);
}

static kpt_tensor t4(uint64_t ptr, kpt_dtype dt, const int64_t *shape, const int64_t *stride)
{
    kpt_tensor t = {.data = (void *)(uintptr_t)ptr, .dtype = dt, .rank = 4};
    for (int i = 0; i < 4; i++) {
        t.shape[i] = shape[i];
        t.stride[i] = stride[i];
    }
    return t;
}

/* ptrs: q k v o lse; shapes/strides: 4 x 4 (q k v o), lse strides 3. Aux: names, pointers,
 * dtypes (kpt_dtype), ranks, shapes (3 each), strides (3 each). */
static int build_args(const kptb_kernel *kb, const uint64_t *ptrs, const int64_t *shapes,
                      const int64_t *strides, const int64_t *lse_strides, double scale,
                      const char **snames, const double *svals, int ns, const char **anames,
                      const uint64_t *aptrs, const int *adtypes, const int *aranks,
                      const int64_t *ashapes, const int64_t *astrides, int na,
                      kpt_attention_args *a, kpt_scalar_value *sv, kpt_aux_tensor *av)
{
    kpt_dtype dt = kb->k->plan.cfg.dtype;
    memset(a, 0, sizeof(*a));
    a->q = t4(ptrs[0], dt, shapes + 0, strides + 0);
    a->k = t4(ptrs[1], dt, shapes + 4, strides + 4);
    a->v = t4(ptrs[2], dt, shapes + 8, strides + 8);
    a->o = t4(ptrs[3], dt, shapes + 12, strides + 12);
    if (ptrs[4]) {
        a->lse.data = (void *)(uintptr_t)ptrs[4];
        a->lse.dtype = KPT_DTYPE_F32;
        a->lse.rank = 3;
        for (int i = 0; i < 3; i++) {
            a->lse.shape[i] = shapes[i];
            a->lse.stride[i] = lse_strides[i];
        }
    }
    a->scale = scale;
    if (ns > KPT_MAX_SCALARS || na > KPT_MAX_AUX)
        return -1;
    for (int i = 0; i < ns; i++)
        sv[i] = (kpt_scalar_value){snames[i], svals[i]};
    for (int i = 0; i < na; i++) {
        av[i].name = anames[i];
        kpt_tensor *t = &av[i].tensor;
        memset(t, 0, sizeof(*t));
        t->data = (void *)(uintptr_t)aptrs[i];
        t->dtype = (kpt_dtype)adtypes[i];
        t->rank = aranks[i];
        for (int d = 0; d < aranks[i]; d++) {
            t->shape[d] = ashapes[3 * i + d];
            t->stride[d] = astrides[3 * i + d];
        }
    }
    a->scalars = sv;
    a->num_scalars = ns;
    a->aux = av;
    a->num_aux = na;
    return 0;
}

#define ARGS_DECL                                                                            \
    void *h, const uint64_t *ptrs, const int64_t *shapes, const int64_t *strides,            \
        const int64_t *lse_strides, double scale, const char **snames, const double *svals,  \
        int ns, const char **anames, const uint64_t *aptrs, const int *adtypes,              \
        const int *aranks, const int64_t *ashapes, const int64_t *astrides, int na
#define ARGS_PASS                                                                             \
    kb, ptrs, shapes, strides, lse_strides, scale, snames, svals, ns, anames, aptrs, adtypes, \
        aranks, ashapes, astrides, na, &a, sv, av

API int kptb_attention(ARGS_DECL, uint64_t blockmap, uint64_t stream, char *err, int n)
{
    kptb_kernel *kb = h;
    kpt_attention_args a;
    kpt_scalar_value sv[KPT_MAX_SCALARS];
    kpt_aux_tensor av[KPT_MAX_AUX];
    kpt_diag d = {0};
    if (build_args(ARGS_PASS)) {
        snprintf(err, (size_t)n, "too many scalars or aux tensors");
        return -1;
    }
    if (kpt_cuda_attention(kb->k, &a, blockmap, (CUstream)(uintptr_t)stream, &d))
        return fail(err, n, &d);
    return 0;
}

API long long kptb_blockmap_size(ARGS_DECL, char *err, int n)
{
    kptb_kernel *kb = h;
    kpt_attention_args a;
    kpt_scalar_value sv[KPT_MAX_SCALARS];
    kpt_aux_tensor av[KPT_MAX_AUX];
    kpt_diag d = {0};
    size_t bytes = 0;
    if (build_args(ARGS_PASS) || kpt_cuda_blockmap_size(kb->k, &a, &bytes, &d))
        return fail(err, n, &d);
    return (long long)bytes;
}

API int kptb_blockmap_build(ARGS_DECL, uint64_t blockmap, uint64_t stream, char *err, int n)
{
    kptb_kernel *kb = h;
    kpt_attention_args a;
    kpt_scalar_value sv[KPT_MAX_SCALARS];
    kpt_aux_tensor av[KPT_MAX_AUX];
    kpt_diag d = {0};
    if (build_args(ARGS_PASS) ||
        kpt_cuda_blockmap_build(kb->k, &a, blockmap, (CUstream)(uintptr_t)stream, &d))
        return fail(err, n, &d);
    return 0;
}
