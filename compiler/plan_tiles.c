/* Tile planning for the sm_80+ (mma.sync) path.
 *
 * Each warp owns mt m16 row blocks and the whole kv tile, so softmax statistics stay in the warp.
 * Two row blocks per warp (bm = 128 with 4 warps) halve the shared-memory traffic of K and V per
 * flop against one, which is what keeps mma.sync fed on sm_80/sm_90 (the loads of one 64-key
 * tile are reused by 32 rows). The registers bound the rest: the O accumulator takes
 * mt * dv / 2 registers per thread and the scores mt * bn / 2, so dv = 256 drops to one row
 * block and 32-key tiles. Q stays in registers only when it is small (dqk <= 64); above that it is
 * re-read from shared memory with ldmatrix each kv tile, as FlashAttention-2 does.
 */
#include <stdlib.h>
#include <string.h>

#include "compiler/plan_tiles.h"
#include "base/diag.h"
#include "ir/ir.h"

const int kpt_cuda_head_dims[] = {32, 64, 96, 128, 256};
const int kpt_cuda_num_head_dims = 5;

static bool supported_dim(int d)
{
    for (int i = 0; i < kpt_cuda_num_head_dims; i++)
        if (kpt_cuda_head_dims[i] == d)
            return true;
    return false;
}

/* Unrolled, a partial tile evaluates the mask 64 times over in straight-line code, which lets
 * the compiler share work between elements of one row or column: a win for short arithmetic
 * masks (causal, windows), but for masks that load aux data or run long it multiplies NVRTC's
 * time (document_logical.lua took 3.8 s) for no measurable gain. */
#define KPT_MASK_UNROLL_MAX_NODES 24

static uint32_t cone_size(const kpt_ir_graph *g, kpt_ir_ref root, bool *loads)
{
    uint8_t *seen = calloc(g->count, 1);
    if (!seen)
        return UINT32_MAX;
    uint32_t n = 0;
    seen[root] = 1;
    for (kpt_ir_ref r = root; r > 0; r--) { /* operands precede their users */
        if (!seen[r])
            continue;
        const kpt_ir_node *nd = kpt_ir_node_get(g, r);
        n += nd->op != KPT_IR_CONST;
        *loads = *loads || nd->op == KPT_IR_LOAD;
        for (int a = 0; a < nd->nargs; a++)
            seen[nd->arg[a]] = 1;
    }
    free(seen);
    return n;
}

/* What the plan needs to know of the score mod and mask: whether they exist, whether tiles are
 * classified by a block-map kernel (masks that read aux data) and per what. */
static kpt_status plan_mask(const kpt_pattern *p, kpt_kernel_plan *pl, kpt_diag *diag)
{
    pl->has_mask = p->mask != 0;
    pl->has_score = p->score != 0;
    if (pl->has_mask) {
        uint16_t *deps = calloc(p->g.count, sizeof(*deps));
        if (!deps)
            return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (planning)");
        kpt_ir_deps(&p->g, deps);
        uint16_t d = deps[p->mask];
        free(deps);
        pl->has_blockmap = (d & KPT_DEP_AUX) != 0;
        pl->bm_per_b = (d & KPT_DEP_B) != 0;
        pl->bm_per_h = (d & KPT_DEP_H) != 0;
        bool loads = false;
        pl->mask_rolled = cone_size(&p->g, p->mask, &loads) > KPT_MASK_UNROLL_MAX_NODES || loads;
    }
    return KPT_OK;
}

static bool wgmma_dim(int d)
{
    return d == 64 || d == 128 || d == 256;
}

kpt_status kpt_plan_tiles(const kpt_pattern *p, const kpt_kernel_config *cfg, kpt_kernel_plan *out,
                          kpt_diag *diag)
{
    if (cfg->dtype != KPT_DTYPE_F16 && cfg->dtype != KPT_DTYPE_BF16)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the CUDA backend (f16 or bf16)",
                            kpt_dtype_name(cfg->dtype));
    if (!supported_dim(cfg->dqk) || !supported_dim(cfg->dv))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the CUDA backend supports 32, 64, 96, "
                            "128 and 256", cfg->dqk, cfg->dv);
    if (cfg->sm < 80)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "sm_%d: the CUDA backend needs sm_80 or newer (mma.sync bf16)", cfg->sm);
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    int dmax = cfg->dqk > cfg->dv ? cfg->dqk : cfg->dv;
    pl.warps = 4;
    pl.stages = 2;
    kpt_status st = plan_mask(p, &pl, diag);
    if (st)
        return st;
    /* sm_90a (templates/cuda/attention_sm90.cu): a producer warpgroup (TMA) and two consumer
     * warpgroups of 64 rows, a ring of two stages of swizzled K and V; head dims 64, 128 and 256
     * (the 128-byte swizzle atoms are 64 elements wide). 128-key tiles, or 64 where a head dim
     * is 256: Q and two stages of 128-key K and V tiles would need 256 KB of shared memory, and
     * O (128 registers a thread) leaves room for the scores of 64 keys only. Other head dims
     * take the sm_80 kernel. */
    pl.cfg.wgmma = cfg->wgmma && cfg->sm == 90 && wgmma_dim(cfg->dqk) && wgmma_dim(cfg->dv);
    if (pl.cfg.wgmma) {
        /* Masks that read aux data unroll too: the mask runs in its own loop after S is
         * ready, and unrolled, the loads of a row's or a key's value are shared across the
         * tile instead of repeated per score (H100, bf16, D = 128, 16k: document 381 TFLOP/s
         * against 127 rolled). */
        bool loads = false;
        if (pl.has_mask)
            pl.mask_rolled = cone_size(&p->g, p->mask, &loads) > KPT_MASK_UNROLL_MAX_NODES;
        pl.warps = 12;
        pl.mt = 1;
        pl.bm = 128;
        pl.bn = dmax == 256 ? 64 : 128;
        pl.q_in_regs = false;
        pl.smem_bytes = 1024 + 2 * ((size_t)pl.bm * (size_t)cfg->dqk +
                                    (size_t)pl.stages * pl.bn * (size_t)(cfg->dqk + cfg->dv));
        *out = pl;
        return KPT_OK;
    }
    if (dmax <= 64) {
        pl.mt = 2;
        pl.bn = 64;
    } else if (dmax <= 128) {
        /* Unmasked, 32-key tiles free the 32 score registers that let ptxas load the next K
         * fragments ahead of their products (H100, bf16, D = 128, 16k: 348 TFLOP/s against
         * 326 with 64-key tiles); with a mask, 64-key tiles win (325 against 300 causal): the
         * per-tile work outside the products (tile classes, partial-tile masks) halves. */
        pl.mt = 2;
        pl.bn = pl.has_mask ? 64 : 32;
    } else {
        pl.mt = 1;
        pl.bn = 32;
    }
    pl.bm = pl.warps * pl.mt * 16;
    pl.q_in_regs = cfg->dqk <= 64;
    size_t rows_q = (size_t)pl.bm * (size_t)(cfg->dqk + 8);
    size_t rows_kv = (size_t)pl.bn * (size_t)(cfg->dqk + 8 + cfg->dv + 8);
    pl.smem_bytes = 2 * (rows_q + (size_t)pl.stages * rows_kv);
    *out = pl;
    return KPT_OK;
}

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

kpt_status kpt_plan_tiles_glsl(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag)
{
    if (cfg->dtype != KPT_DTYPE_F16 && cfg->dtype != KPT_DTYPE_F32)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the Vulkan backend (f16 or f32)",
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
        kpt_status st = plan_mask(p, &pl, diag);
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
    kpt_status st = plan_mask(p, &pl, diag);
    if (st)
        return st;
    *out = pl;
    return KPT_OK;
}

int kpt_hip_target_gfx(const char *target)
{
    static const struct { const char *name; int gfx; } archs[] = {
        {"hip:gfx90a", 0x90a}, {"hip:gfx940", 0x940}, {"hip:gfx942", 0x942}};
    for (size_t i = 0; target && i < sizeof(archs) / sizeof(archs[0]); i++)
        if (!strcmp(target, archs[i].name))
            return archs[i].gfx;
    return -1;
}

kpt_status kpt_plan_tiles_hip(const kpt_pattern *p, const kpt_kernel_config *cfg,
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
    bool dims_ok = false, dv_ok = false;
    for (int i = 0; i < kpt_cuda_num_head_dims; i++) {
        dims_ok |= cfg->dqk == kpt_cuda_head_dims[i];
        dv_ok |= cfg->dv == kpt_cuda_head_dims[i];
    }
    if (!dims_ok || !dv_ok)
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
    kpt_status st = plan_mask(p, &pl, diag);
    if (st)
        return st;
    *out = pl;
    return KPT_OK;
}
