/* Tile planning for the HIP kernel on AMD Instinct GPUs (see plan_tiles.h). */
#include "base/diag.h"
#include "compiler/plan_tiles.h"

kpt_status kpt_plan_tiles_hip(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                              kpt_kernel_plan *out, kpt_diag *diag)
{
    if (cfg->gfx != 0x90a && cfg->gfx != 0x940 && cfg->gfx != 0x942)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "AMD target gfx%x: kpt generates MFMA kernels for gfx90a, gfx940 and "
                            "gfx942", (unsigned)cfg->gfx);
    if (cfg->dtype != KPT_DTYPE_F16 && cfg->dtype != KPT_DTYPE_BF16)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the HIP backend (f16 or bf16)",
                            kpt_dtype_name(cfg->dtype));
    if (!kpt_cuda_head_dim_ok(cfg->dqk) || !kpt_cuda_head_dim_ok(cfg->dv))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the HIP backend supports 32, 64, 96, "
                            "128 and 256", cfg->dqk, cfg->dv);
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    pl.cfg.sm = 0;
    pl.warps = 4; /* wavefronts of 64, 16 query rows each */
    pl.mt = 1;
    pl.bm = 64;
    pl.bn = cfg->dqk > 128 || cfg->dv > 128 ? 32 : 64;
    pl.stages = 1;
    /* K row-major and V transposed, rows padded by 4 elements (templates/hip/attention.hip) */
    pl.smem_bytes = (size_t)pl.bn * (size_t)(cfg->dqk + 4) * 2 +
                    (size_t)cfg->dv * (size_t)(pl.bn + 4) * 2;
    kpt_status st = kpt_plan_mask(p, &pl, diag);
    if (st)
        return st;
    *out = pl;
    return KPT_OK;
}
