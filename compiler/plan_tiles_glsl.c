/* Tile planning for the Vulkan (GLSL) kernels: the portable scalar kernel and the
 * cooperative-matrix one (see plan_tiles.h). */
#include "base/diag.h"
#include "compiler/plan_tiles.h"

/* Shared memory of the cooperative-matrix GLSL kernel (templates/glsl/attention.comp, its
 * KPT_COOPMAT part): Q staging / K and V tiles in f16 with rows padded by 8, S (f32, rows of
 * bn + 4) and P (f16, rows of bn + 8) of 16 rows per subgroup. */
size_t kpt_glsl_coopmat_kv_elems(int dqk, int dv)
{
    size_t ks = (size_t)dqk + 8, vs = (size_t)dv + 8, q = 64 * ks, kv = 32 * (ks + vs);
    return q > kv ? q : kv;
}

static size_t glsl_coopmat_smem(int dqk, int dv)
{
    return kpt_glsl_coopmat_kv_elems(dqk, dv) * 2 + 4 * 16 * (32 + 4) * 4 + 4 * 16 * (32 + 8) * 2;
}

int kpt_glsl_chunk(int dqk, int dv)
{
    int d = dqk > dv ? dqk : dv;
    return d <= 128 ? 16 : (d / 8 + 15) / 16 * 16;
}

int64_t kpt_glsl_loop_iterations(const kpt_kernel_plan *pl, int64_t n_kt)
{
    /* a KPT_DLOOP over N: N / KPT_CH chunks and the exit test; a key loop: bn keys and its test */
    const int64_t ch = kpt_glsl_chunk(pl->cfg.dqk, pl->cfg.dv);
    const int64_t lq = pl->cfg.dqk / ch + 1, lv = pl->cfg.dv / ch + 1, keys = pl->bn + 1;
    const int64_t per_tile = 1 + lq + lv + keys * (1 + lq) + lv + keys * (1 + lv);
    /* once: the Q row, the accumulator's start and end, kpt_check_loops (2 and its test) */
    const int64_t once = 2 * (int64_t)pl->cfg.dqk + 2 * (int64_t)pl->cfg.dv + 8;
    return n_kt * per_tile + once;
}

int64_t kpt_glsl_paged_loop_iterations(const kpt_kernel_plan *pl, int64_t n_kt, int splits,
                                       int group)
{
    /* the tile class's loop over the workgroup's query heads, and the NaN loop's exit test */
    const bool classes = pl->has_mask && !pl->mask_loads;
    const int64_t per_class = pl->bm_per_h && !pl->mask_loads ? group : 0;
    const int64_t walk = (n_kt + splits - 1) / (splits > 0 ? splits : 1);
    /* the live-range scan (kpt_pg_live): a run of n_kt / bm + 1 tiles an invocation, one class
     * for the run and one for each of its tiles */
    const int64_t scan = classes ? (n_kt / pl->bm + 2) * (1 + per_class) : 0;
    return kpt_glsl_loop_iterations(pl, walk) + walk * per_class + scan + 1;
}

int64_t kpt_glsl_combine_loop_iterations(const kpt_kernel_plan *pl, int splits)
{
    /* two passes over the splits' LSEs, then a pass over them per chunk of KPT_CH columns, and
     * kpt_check_loops (2 and its test) */
    const int64_t ch = kpt_glsl_chunk(pl->cfg.dqk, pl->cfg.dv);
    const int64_t chunks = (pl->cfg.dv + ch - 1) / ch;
    return 2 * ((int64_t)splits + 1) + (chunks + 1) + chunks * ((int64_t)splits + 1) + 3;
}

static kpt_status plan_glsl(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag)
{
    if (cfg->dtype != KPT_DTYPE_F16 && cfg->dtype != KPT_DTYPE_BF16 && cfg->dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the Vulkan backend (f16, bf16 or f32)",
                            kpt_dtype_name(cfg->dtype));
    if (cfg->dqk < 1 || cfg->dqk > KPT_GLSL_MAX_HEAD_DIM || cfg->dv < 1 ||
        cfg->dv > KPT_GLSL_MAX_HEAD_DIM)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the Vulkan backend supports 1 to %d",
                            cfg->dqk, cfg->dv, KPT_GLSL_MAX_HEAD_DIM);
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    pl.cfg.sm = 0;
    /* what the shared memory holds, less room for the compiler's own shared variables */
    size_t avail = smem_limit > 1024 ? (size_t)smem_limit - 1024 : 0;
    pl.cfg.coopmat = cfg->coopmat && cfg->dtype == KPT_DTYPE_F16 && cfg->dqk % 16 == 0 &&
                     cfg->dv % 16 == 0 && cfg->dqk <= 128 && cfg->dv <= 128 &&
                     glsl_coopmat_smem(cfg->dqk, cfg->dv) <= avail;
    if (pl.cfg.coopmat) {
        pl.smem_bytes = glsl_coopmat_smem(cfg->dqk, cfg->dv);
        pl.bm = 64;
        pl.bn = 32;
        pl.warps = 4;
        pl.stages = 1;
        kpt_status st = kpt_plan_mask(p, &pl, diag);
        if (!st)
            *out = pl;
        return st;
    }
    pl.bm = 32;
    /* K and V rows of a tile in fp32 */
    size_t row = (size_t)(cfg->dqk + cfg->dv) * 4;
    for (pl.bn = 32; pl.bn > 1 && (size_t)pl.bn * row > avail; pl.bn /= 2)
        ;
    pl.smem_bytes = (size_t)pl.bn * row;
    if (pl.smem_bytes > avail)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims %d/%d need %zu bytes of shared memory; the device allows %d",
                            cfg->dqk, cfg->dv, pl.smem_bytes + 1024, smem_limit);
    pl.stages = 1;
    kpt_status st = kpt_plan_mask(p, &pl, diag);
    if (st)
        return st;
    *out = pl;
    return KPT_OK;
}


/* The cooperative-matrix kernel is the device's own, planned for all its shared memory; every
 * other kernel (other devices, and shapes that kernel does not take) is planned for at most
 * KPT_GLSL_PLAN_SMEM, so one source text serves every device with at least that much. */
kpt_status kpt_plan_tiles_glsl(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag)
{
    int portable = smem_limit > KPT_GLSL_PLAN_SMEM ? KPT_GLSL_PLAN_SMEM : smem_limit;
    if (cfg->coopmat && cfg->kind == KPT_KERNEL_FORWARD) {
        kpt_status st = plan_glsl(p, cfg, smem_limit, out, diag);
        if (st || out->cfg.coopmat)
            return st;
    }
    kpt_kernel_config c = *cfg;
    c.coopmat = false;
    kpt_status st = plan_glsl(p, &c, portable, out, diag);
    if (!st && cfg->kind == KPT_KERNEL_PAGED) {
        /* the serving kernel (templates/glsl/attention.comp, KPT_ENTRY_PAGED) is the scalar
         * kernel's loop over a sequence's rows: no block map (the lengths live on the device),
         * masks that read aux data are evaluated per element */
        out->has_blockmap = false;
        out->bm_per_b = false;
    }
    return st;
}
