/* TMA tensor maps for the sm_90a kernel (see cuda_tma.h). */
#include <stdio.h>
#include <string.h>

#include "base/diag.h"
#include "runtime/cuda_tma.h"

enum {
    KPT_TM_F16 = 6,          /* CU_TENSOR_MAP_DATA_TYPE_FLOAT16 */
    KPT_TM_F32 = 7,          /* CU_TENSOR_MAP_DATA_TYPE_FLOAT32 */
    KPT_TM_BF16 = 9,         /* CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 */
    KPT_TM_SWIZZLE_128B = 3, /* CU_TENSOR_MAP_SWIZZLE_128B */
    KPT_TM_L2_256B = 3,      /* CU_TENSOR_MAP_L2_PROMOTION_L2_256B */
};

/* One tensor of es-byte elements: dims (d, s, heads, batch) over its element strides (batch,
 * head, seq, dim; the dim's is 1, checked by kpt_kernel_args_pack), in boxes of cols x rows. A
 * head or batch dim with stride 0 is a broadcast: the map gets extent 1 there and the kernel
 * multiplies that coordinate by 0. */
static kpt_status encode_box(const kpt_cu_api *cu, kpt_tensor_map *map, const char *name,
                             uint64_t ptr, const int64_t *stride, int64_t d, int64_t s,
                             int64_t heads, int64_t batch, unsigned cols, unsigned rows, int dtype,
                             uint64_t es, int32_t *hf, int32_t *bf, kpt_diag *diag)
{
    if (stride[2] <= 0 && s > 1)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "tensor %s: the sm_90a kernel needs a positive sequence stride "
                            "(not %lld); target cuda:sm_90 (or KPT_CUDA_WGMMA=0) uses the "
                            "mma.sync kernel", name, (long long)stride[2]);
    if (stride[0] < 0 || stride[1] < 0)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "tensor %s: the sm_90a kernel needs non-negative strides; target "
                            "cuda:sm_90 (or KPT_CUDA_WGMMA=0) uses the mma.sync kernel", name);
    uint64_t dim[4] = {(uint64_t)d, s > 0 ? (uint64_t)s : 1, (uint64_t)heads, (uint64_t)batch};
    uint64_t str[3] = {(uint64_t)stride[2] * es, (uint64_t)stride[1] * es,
                       (uint64_t)stride[0] * es};
    if (!str[0])
        str[0] = (uint64_t)d * es; /* one row: any valid stride */
    *hf = *bf = 1;
    if (!str[1] || heads == 1) {
        dim[2] = 1;
        str[1] = str[0];
        *hf = 0;
    }
    if (!str[2] || batch == 1) {
        dim[3] = 1;
        str[2] = str[1];
        *bf = 0;
    }
    const unsigned box[4] = {cols, rows, 1, 1}, ones[4] = {1, 1, 1, 1};
    CUresult r = cu->TensorMapEncodeTiled(map, dtype, 4, (void *)(uintptr_t)ptr, dim, str, box,
                                          ones, 0, KPT_TM_SWIZZLE_128B, KPT_TM_L2_256B, 0);
    if (r) {
        char what[64];
        snprintf(what, sizeof(what), "cuTensorMapEncodeTiled (tensor %s)", name);
        return kpt_cu_fail(diag, what, r);
    }
    return KPT_OK;
}

/* A 16-bit tensor in boxes of 64 columns (the kernels' tiles). */
static kpt_status encode(const kpt_cu_api *cu, kpt_tensor_map *map, const char *name,
                         uint64_t ptr, const int64_t *stride, int64_t d, int64_t s, int64_t heads,
                         int64_t batch, unsigned rows, int dtype, int32_t *hf, int32_t *bf,
                         kpt_diag *diag)
{
    return encode_box(cu, map, name, ptr, stride, d, s, heads, batch, 64, rows, dtype, 2, hf, bf,
                      diag);
}

static kpt_status have_tma(const kpt_cu_api *cu, kpt_diag *diag)
{
    if (cu->TensorMapEncodeTiled)
        return KPT_OK;
    return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                        "the NVIDIA driver lacks cuTensorMapEncodeTiled (TMA), which the "
                        "sm_90a kernels need; update the driver or use target cuda:sm_90");
}

kpt_status kpt_cuda_tma_pack(const kpt_cu_api *cu, const kpt_kernel_plan *pl,
                             const kpt_kernel_args *a, kpt_kernel_tma *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = have_tma(cu, diag);
    if (st)
        return st;
    const int dt = pl->cfg.dtype == KPT_DTYPE_BF16 ? KPT_TM_BF16 : KPT_TM_F16;
    if ((st = encode(cu, &out->q, "q", a->q, a->qs, pl->cfg.dqk, a->Sq, a->Hq, a->B,
                     (unsigned)pl->bm, dt, &out->hq, &out->bq, diag)) ||
        (st = encode(cu, &out->k, "k", a->k, a->ks, pl->cfg.dqk, a->Skv, a->Hkv, a->B,
                     (unsigned)pl->bn, dt, &out->hk, &out->bk, diag)) ||
        (st = encode(cu, &out->v, "v", a->v, a->vs, pl->cfg.dv, a->Skv, a->Hkv, a->B,
                     (unsigned)pl->bn, dt, &out->hv, &out->bv, diag)))
        return st;
    /* O through TMA stores, in boxes of a consumer's 64 rows */
    if (pl->o_tma)
        return encode(cu, &out->o, "o", a->o, a->os, pl->cfg.dv, a->Sq, a->Hq, a->B, 64, dt,
                      &out->ho, &out->bo, diag);
    return KPT_OK;
}

kpt_status kpt_cuda_tma_pack_bwd(const kpt_cu_api *cu, const kpt_kernel_plan *pl,
                                 const kpt_kernel_args *a, const kpt_kernel_gargs *g,
                                 kpt_kernel_bwd_tma *out, kpt_diag *diag)
{
    memset(out, 0, sizeof(*out));
    kpt_status st = have_tma(cu, diag);
    if (st)
        return st;
    const int dt = pl->cfg.dtype == KPT_DTYPE_BF16 ? KPT_TM_BF16 : KPT_TM_F16;
    const int64_t dqk = pl->cfg.dqk, dv = pl->cfg.dv;
    const unsigned step = KPT_BWD_STEP_ROWS;
    if ((st = encode(cu, &out->q, "q", a->q, a->qs, dqk, a->Sq, a->Hq, a->B, step, dt, &out->hq,
                     &out->bq, diag)) ||
        (st = encode(cu, &out->o, "dout", g->dout, g->dos, dv, a->Sq, a->Hq, a->B, step, dt,
                     &out->ho, &out->bo, diag)) ||
        (st = encode(cu, &out->k, "k", a->k, a->ks, dqk, a->Skv, a->Hkv, a->B, (unsigned)pl->bn,
                     dt, &out->hk, &out->bk, diag)) ||
        (st = encode(cu, &out->v, "v", a->v, a->vs, dv, a->Skv, a->Hkv, a->B, (unsigned)pl->bn,
                     dt, &out->hv, &out->bv, diag)) ||
        (st = encode(cu, &out->dk, "dk", g->dk, g->dks, dqk, a->Skv, a->Hkv, a->B, 64, dt,
                     &out->hdk, &out->bdk, diag)) ||
        (st = encode(cu, &out->dv, "dv", g->dv, g->dvs, dv, a->Skv, a->Hkv, a->B, 64, dt,
                     &out->hdv, &out->bdv, diag)))
        return st;
    if (!g->dqacc) /* the deterministic mode */
        return KPT_OK;
    /* the f32 dQ accumulator [B, Hq, Sq, Dqk] (contiguous), in boxes of 32 columns: the
     * 128-byte swizzle's span */
    const int64_t acc[3] = {a->Hq * a->Sq * dqk, a->Sq * dqk, dqk};
    int32_t hf, bf;
    return encode_box(cu, &out->dq, "dq (accumulator)", g->dqacc, acc, dqk, a->Sq, a->Hq, a->B,
                      32, (unsigned)KPT_BWD_STEP_ROWS, KPT_TM_F32, 4, &hf, &bf, diag);
}
