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

#include "base/diag.h"
#include "compiler/plan_tiles.h"

const int kpt_cuda_head_dims[] = {32, 64, 96, 128, 256};
const int kpt_cuda_num_head_dims = 5;

bool kpt_cuda_head_dim_ok(int d)
{
    for (int i = 0; i < kpt_cuda_num_head_dims; i++)
        if (kpt_cuda_head_dims[i] == d)
            return true;
    return false;
}

static bool wgmma_dim(int d)
{
    return d == 64 || d == 128 || d == 256;
}

/* Whether an sm_90a kernel stores partial tiles' keep bits (plan.mask_bits): for masks that read
 * aux data (which have a block map anyway) or have KPT_MASK_BITS_MIN_NODES nodes. *nodes: the
 * mask's. */
static bool mask_bits(const kpt_pattern *p, const kpt_kernel_plan *pl, uint32_t *nodes)
{
    bool loads = false;
    *nodes = pl->has_mask ? kpt_plan_cone_size(&p->g, p->mask, &loads) : 0;
    return pl->has_mask && (*nodes >= KPT_MASK_BITS_MIN_NODES || pl->has_blockmap);
}

/* The backward kernels (templates/cuda/attention_bwd.cu): 64 x 64 tiles, four warps of 16 rows
 * (keys in kpt_bwd_dkdv, queries in kpt_bwd_dq), one stage. dK and dV (or dQ) accumulate in
 * registers, dqk / 2 + dv / 2 a thread; past head dim 128 they alone would take all 255, so
 * there the CTA has eight warps in two column parts: warps w and w + 4 own the same 16 rows,
 * each accumulates half of the gradient's columns and computes the rows' scores and dP over
 * half of the head dim, the halves summed through shared memory. Shared memory holds K, V, Q
 * and dO tiles and two row vectors (and at head dim 256 the exchange: 152 KB, which sm_86/89,
 * 99 KB, cannot give; 215 KB with two stages of Q and dO, below).
 *
 * On sm_90a with head dims 64 and 128 (templates/cuda/attention_bwd_sm90.cu): 128 x 128 tiles
 * (tile classes and block maps use them), two warpgroups of 64 rows, warpgroup MMA. kpt_bwd_dkdv
 * keeps K and V of its 128 keys and streams 64-query halves of Q and dO through two stages
 * (filled by TMA from a producer warpgroup besides, KPT_BWD_PRODUCER_WARPS);
 * kpt_bwd_dq keeps Q and dO of its 128 queries and streams 128-key tiles of K and V through two
 * stages, the same way. Each launch takes its own dynamic shared memory (plan.smem_bytes,
 * plan.dq_smem_bytes): kpt_bwd_dkdv's with aux staging (226 KB at D = 128) leaves no room for
 * kpt_bwd_dq's static tile classes. Past head dim 128 on sm_90a (Dqk and Dv multiples of 128):
 * 64 x 64 tiles, both warpgroups of kpt_bwd_dkdv on the same 64 rows, each half of dK's and
 * dV's columns (KPT_BWD_SPLIT there), no keep bits and no dQ sums (dq_tiles 0); kpt_bwd_dq
 * takes two q tiles a CTA (dq_rows 128), a warpgroup 64 queries and all of dQ's columns, with
 * one kv tile (192 KB at 256 / 256), or, for masks with a block map (slower on that kernel),
 * one q tile with dQ's columns split as kpt_bwd_dkdv's. */
#define KPT_BWD_AUX_CHUNK 8 /* KPT_AUX_CHUNK in templates/cuda/attention_bwd.cu */
#define KPT_BWD_DAUX_TAB 16960 /* sizeof(kpt_daux_tab) there: a CTA's sums of small aux gradients */
/* the sm_80 backward kernels' static shared memory, at most (kpt_bwd_dq's tile classes: 2064
 * bytes), besides plan.smem_bytes */
#define KPT_BWD_STATIC_SMEM 4096

/* kpt_bwd_dkdv's dQ staging tiles a warpgroup (sm_90a): two, taken by step parity, so a step
 * waits only for the TMA's read of the tile two steps back (H100, bf16, D = 128, kernel time:
 * full and causal 16k and full 4k 2-3 % less) -- but not beside aux-gradient staging (no room),
 * nor for patterns that read aux data or a block map: the 32 KB more of shared memory leave L1
 * 28 KB instead of 60 (the driver's carveout), and a document mask's kernel took 6-11 % longer. */
static int dq_tiles(const kpt_pattern *p, const kpt_kernel_plan *pl, size_t aux_staging)
{
    return aux_staging || p->num_aux || pl->has_blockmap ? 1 : 2;
}

/* Transcendentals: an exponential-family function, whose per-score evaluations queue at the
 * special-function units (MUFU) beside the softmax's own exponentials. */
static bool transcendental(kpt_ir_op op)
{
    return op == KPT_IR_EXP || op == KPT_IR_LOG || op == KPT_IR_TANH || op == KPT_IR_SQRT ||
           op == KPT_IR_POW || op == KPT_IR_ERF;
}

/* The work of a score modification per score: the nodes of its cone (with grad, of its
 * derivative's too) that depend on s, q or k (a per-head slope is computed once a tile), erf
 * counting as the dozen instructions it expands to. *special: whether one of them is a
 * transcendental. */
static uint32_t score_cost(const kpt_pattern *p, bool grad, bool *special)
{
    const kpt_ir_graph *g = &p->g;
    uint16_t *deps = malloc(g->count * sizeof(*deps));
    uint8_t *live = malloc(g->count);
    uint32_t cost = 0;
    *special = false;
    if (!deps || !live) {
        cost = UINT32_MAX; /* out of memory: no variant */
    } else {
        const kpt_ir_ref roots[2] = {p->score, p->dscore};
        kpt_ir_deps(g, deps);
        kpt_ir_mark_live(g, roots, grad && p->dscore ? 2 : 1, live);
        for (kpt_ir_ref r = 1; r < g->count; r++) {
            const kpt_ir_op op = kpt_ir_node_get(g, r)->op;
            if (!live[r] || !(deps[r] & (KPT_DEP_S | KPT_DEP_Q | KPT_DEP_K)))
                continue;
            cost += op == KPT_IR_ERF ? 12 : 1;
            *special = *special || transcendental(op);
        }
    }
    free(deps);
    free(live);
    return cost;
}

/* Whether an sm_90a forward plan (head dims up to dmax) has a tall variant (plan.tall_variant):
 * for masks without a block map (the keep bits are laid out for 128-row tiles) and scores of
 * per-score work up to KPT_TALL_SCORE_MAX_COST. With costlier score modifications the softmax,
 * not the tensor cores, bounds the kernel, and the tall tiles' extra products and 160-register
 * consumers do not pay (H100, bf16, D = 64, 4k / 16k: softcap+causal, cost 4, 280 / 309 ->
 * 286 / 326 TFLOP/s; alibi+causal, cost 7, 355 / 386 -> 347 / 393, its consumers spilling;
 * gelu_scores.lua, cost 17, 133 / 146 -> 122-133 / 143-146). */
static bool tall_offered(const kpt_pattern *p, const kpt_kernel_plan *pl, int dmax)
{
    bool special;
    return dmax <= 64 && pl->has_mask && !pl->has_blockmap &&
           (!pl->has_score || score_cost(p, false, &special) <= KPT_TALL_SCORE_MAX_COST);
}

/* A 64 x 64 tile of 16-bit P^T, dS^T or dS that the sm_90a backward's two consumer warpgroups
 * exchange past head dim 128 (templates/cuda/attention_bwd_sm90.cu, KPT_BWD_SPLIT) */
#define KPT_BWD_SPLIT_TILE (64 * 64 * 2)

/* The sm_90a kpt_bwd_dkdv's shared memory but for its alignment: K and V, the stages of Q and dO
 * and their row vectors (LSE and delta), and where it sums dQ two dS^T tiles and the
 * warpgroups' f32 dQ tiles (64 columns each), past head dim 128 two pairs of P^T and dS^T
 * tiles; aux gradients' staging. row: the bytes of a Q and a dO row. */
static size_t bwd_dkdv_smem(const kpt_kernel_plan *pl, bool wide, size_t row, size_t aux)
{
    size_t steps = (size_t)pl->stages * KPT_BWD_STEP_ROWS;
    size_t x = pl->dq_tiles ? 2 * (size_t)pl->bn * KPT_BWD_STEP_ROWS * 2 +
                                  2 * (size_t)KPT_BWD_STEP_ROWS * 64 * sizeof(float) * pl->dq_tiles
               : wide ? 4 * KPT_BWD_SPLIT_TILE
                      : 0;
    return (size_t)pl->bn * row + steps * row + steps * 2 * sizeof(float) + x + aux;
}

static kpt_status plan_backward(const kpt_pattern *p, const kpt_kernel_config *cfg,
                                int smem_limit, kpt_kernel_plan *out, kpt_diag *diag)
{
    const bool wide = cfg->dqk > 128 || cfg->dv > 128; /* two column parts (above) */
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    /* past 128 the sm_90a kernels split columns too (templates/cuda/attention_bwd_sm90.cu,
     * KPT_BWD_SPLIT): each warpgroup's half of dK's, dV's and dQ's columns a whole wgmma of 64
     * or 128 */
    pl.cfg.wgmma = cfg->wgmma && cfg->sm == 90 &&
                   (wide ? cfg->dqk % 128 == 0 && cfg->dv % 128 == 0
                         : cfg->dqk % 64 == 0 && cfg->dv % 64 == 0);
    /* Two warpgroups a CTA rather than one (64 x 64 tiles, two CTAs an SM): H100, bf16,
     * D = 128, 16k, full 352 against 311 TFLOP/s, causal 359 against 318. */
    pl.warps = pl.cfg.wgmma || wide ? 8 : 4;
    pl.mt = 1;
    pl.bm = pl.cfg.wgmma && !wide ? 128 : 64;
    pl.bn = pl.bm;
    pl.stages = pl.cfg.wgmma ? 2 : 1;
    kpt_status st = kpt_plan_mask(p, &pl, diag);
    if (st)
        return st;
    size_t row = 2 * (size_t)(cfg->dqk + cfg->dv); /* bytes of a Q and a dO row, or K and V */
    /* kpt_bwd_aux's staging of (s, g) pairs (templates/cuda/attention_bwd.cu, KPT_AUX_CHUNK),
     * where the score has aux gradients */
    size_t aux =
        p->num_dloads ? (size_t)pl.warps * KPT_BWD_AUX_CHUNK * 32 * 8 + KPT_BWD_DAUX_TAB : 0;
    pl.aux_grads = p->num_dloads > 0;
    if (pl.cfg.wgmma) {
        /* Partial tiles read keep bits, in two layouts: kpt_bwd_dkdv's (keys as rows; a kv
         * tile's partial tiles take consecutive slots, in the order its producer walks them)
         * and the deterministic mode's kpt_bwd_dq's (queries as rows, as the forward's). */
        /* (not past head dim 128: the bits' layouts are those of 128 x 128 tiles) */
        uint32_t nodes;
        pl.mask_bits = !wide && mask_bits(p, &pl, &nodes);
        pl.has_blockmap = pl.has_blockmap || pl.mask_bits;
        /* past 128 kpt_bwd_dkdv never sums dQ (a 64 x 256 f32 staging tile a warpgroup does not
         * fit beside its two stages): both modes run kpt_bwd_dq */
        pl.dq_tiles = wide ? 0 : dq_tiles(p, &pl, aux);
        /* kpt_bwd_dkdv's consumers take turns issuing their first products (ping-pong, as
         * kpt_bwd_dq's always do) at head dims 128 where the score mod adds transcendentals a
         * score: there one warpgroup's exponentials hide under the other's products. Without
         * them the turns only hold the warpgroups back, and at head dim 64 the default mode
         * (its dQ sums a CTA-wide barrier a step) loses more than the deterministic one gains
         * (H200, bf16, 16k, kpt_bwd_dkdv default / deterministic, us: D = 128 softcap+causal
         * 5599 / 3759 -> 5493 / 3591, causal 4991 / 3294 -> 5019 / 3540; D = 64 softcap+causal
         * 7339 / 5289 -> 8198 / 5116, causal 6720 / 4989 -> 7250 / 5033; docs/BENCHMARKS.md) */
        bool special = false; /* (stays false where score_cost runs out of memory) */
        if (cfg->dqk == 128 && cfg->dv == 128 && pl.has_score)
            score_cost(p, true, &special);
        pl.dkdv_turns = special;
        size_t dkdv = bwd_dkdv_smem(&pl, wide, row, aux);
        /* (its static shared memory: mbarriers and step records, under 256 bytes) */
        if (wide && 1024 + dkdv + 256 > 227 * 1024) { /* with aux staging */
            pl.stages = 1;
            dkdv = bwd_dkdv_smem(&pl, wide, row, aux);
        }
        /* kpt_bwd_dq: Q and dO, two stages of K and V, past 128 with a block map two dS
         * tiles; past 128 without one Q and dO of two q tiles and one tile of K and V (its
         * parts handed back one by one) */
        const bool wide_dq = wide && !pl.has_blockmap;
        pl.dq_rows = wide_dq ? 2 * pl.bm : pl.bm;
        size_t dq = wide_dq ? (size_t)pl.dq_rows * row + (size_t)pl.bn * row
                            : (size_t)pl.bm * row + 2 * (size_t)pl.bn * row +
                                  (wide ? 2 * KPT_BWD_SPLIT_TILE : 0);
        pl.dq_smem_bytes = 1024 + dq; /* + the 1024-byte alignment */
        pl.smem_bytes = 1024 + (dq > dkdv ? dq : dkdv);
        *out = pl;
        return KPT_OK;
    }
    /* a pair of tiles kept, a pair streamed a stage (kpt_bwd_dkdv: K and V, then Q and dO);
     * their row vectors; kpt_bwd_pair_sum's exchange with two parts (16 floats a thread,
     * KPT_BWD_XH) */
    size_t pair = 2 * (size_t)pl.bm * (size_t)(cfg->dqk + 8 + cfg->dv + 8);
    size_t xchg = wide ? (size_t)pl.warps * 32 * 16 * sizeof(float) : 0;
    size_t fixed = pair + xchg + aux;
    size_t stage = pair + 2 * (size_t)pl.bm * sizeof(float);
    /* Two stages at head dim 256 where shared memory holds them (H100, 227 KB: 215 KB; not
     * with aux gradients' staging, nor on sm_80's 163 KB; offline, for sm_90 only, whose
     * devices all have 227 KB: sm_120's have 99 KB): one CTA an SM otherwise waits for each q
     * tile's copies. At 128 and below the 70 KB of one stage keep three CTAs an SM, which hide
     * the copies. */
    size_t limit = smem_limit > 0 ? (size_t)smem_limit : cfg->sm == 90 ? 227 * 1024 : 0;
    pl.stages = wide && fixed + 2 * stage + KPT_BWD_STATIC_SMEM <= limit ? 2 : 1;
    pl.smem_bytes = fixed + (size_t)pl.stages * stage;
    pl.dq_smem_bytes = pl.smem_bytes;
    pl.dq_rows = pl.bm;
    if (smem_limit > 0 && pl.smem_bytes + KPT_BWD_STATIC_SMEM > (size_t)smem_limit)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the CUDA backward needs %zu bytes of "
                            "shared memory a CTA%s; this device allows %d", cfg->dqk, cfg->dv,
                            pl.smem_bytes + KPT_BWD_STATIC_SMEM, aux ? " (with aux gradients)" : "",
                            smem_limit);
    *out = pl;
    return KPT_OK;
}

/* The serving kernels (templates/cuda/paged.cu): a CTA of four warps holds up to 64 query rows (the
 * query tokens of one sequence times the query heads of one kv head, so each K/V byte is read once)
 * and streams tiles of 64 keys (128 up to head dim 64, 32 past 128: below) through a ring of
 * cp.async stages; the warps split the rows (16 each) and, where rows are fewer, the keys of each
 * tile. Decoding is bound by memory, and what keeps the memory system busy is CTAs per SM more than
 * depth: with two stages (87 KB at D = 128) two CTAs share an SM and stream the cache faster than
 * one CTA with five (H100, bf16, B = 8, 32k keys, GQA 32:8: 2585 GB/s against 2477; with 16-row
 * pages 2498 against 1714, where one CTA's page lookups stalled its own loads) — where a batch
 * gives more CTAs than SMs; a plan's split aims at one CTA an SM (kpt_cuda_paged_plan). Tiles are
 * classified by interval analysis only: masks that read aux data are evaluated per element in every
 * tile a sequence's length leaves (no block map: the lengths live on the device). */
static kpt_status plan_paged(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                             kpt_kernel_plan *out, kpt_diag *diag)
{
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    /* sm_90a, head dims 64 and 128: the tiles are laid out in TMA's 128-byte swizzle and the
     * 64-row kernel's products are warpgroup MMA (templates/cuda/paged.cu, KPT_PG_WG). H100,
     * bf16, D = 128, GQA 32:8, 32k keys: speculative decoding (16 tokens) 2672 -> 2870 GB/s at 8
     * sequences; and the swizzled, unpadded ring alone took one-token decoding of 8 sequences
     * from 2778 to 2946 (docs/BENCHMARKS.md, "Serving: warpgroup MMA ...") */
    pl.cfg.wgmma = cfg->wgmma && cfg->sm == 90 && cfg->dqk == cfg->dv &&
                   (cfg->dqk == 64 || cfg->dqk == 128);
    pl.warps = 4;
    pl.mt = 1;
    pl.bm = 64;
    /* past Dv = 128, 32-key tiles, so that two stages fit beside a second CTA an SM; up to head
     * dim 64, 128-key tiles: a tile's fixed work (its barrier, its wait, the softmax's row
     * bookkeeping) then carries as many bytes as a 64-key tile at 128 does, the shape that
     * reads at the copy bandwidth (64-key tiles at D = 64 left one-token decoding at 0.82-0.96x
     * cuDNN on the H200, three CTAs an SM included: docs/BENCHMARKS.md, "Serving: 128-key
     * tiles at head dim 64") */
    const int dmax = cfg->dqk > cfg->dv ? cfg->dqk : cfg->dv;
    pl.bn = dmax > 128 ? 32 : dmax <= 64 ? 128 : 64;
    pl.q_in_regs = true;
    kpt_status st = kpt_plan_mask(p, &pl, diag);
    if (st)
        return st;
    pl.has_blockmap = false;
    pl.bm_per_b = false;
    /* rows padded by 16 bytes, or swizzled (no padding, 1024-byte aligned: the slack below) */
    const size_t pad = pl.cfg.wgmma ? 0 : 8, align = pl.cfg.wgmma ? 1024 : 0;
    size_t q = 2 * (size_t)pl.bm * (size_t)(cfg->dqk + pad);
    size_t stage = 2 * (size_t)pl.bn * (size_t)(cfg->dqk + pad + cfg->dv + pad);
    /* Two stages: 87 KB at most up to D = 128, plus 11 KB static, which every sm_80+ device
     * takes. Past Dv = 128 the tiles have 32 keys: two stages of 64-key tiles of 256 columns
     * (169 KB) held one CTA an SM, two CTAs of one such stage (101 KB each) streamed the cache
     * 1.6x faster (H200, bf16, heads 16:8, B = 8, 32k keys: 2389 GB/s against 1519), and two
     * stages of 32-key tiles in the same 101 KB let each CTA load a tile while it computes the
     * last (H100: 1 x 1 x 32k 1653-1690 -> 2099-2105 GB/s, 8 x 16 x 4k 1532-1916 -> 2204-2220,
     * 8 x 1 x 32k 2198-2260 -> 2413-2417); sm_86/89 (99 KB) hold neither: refused below, with
     * the numbers. */
    const size_t fixed = KPT_PAGED_STATIC_SMEM + KPT_KERNEL_ARGS_BYTES; /* besides smem_bytes */
    pl.stages = 2;
    if (smem_limit > 0 && align + q + 2 * stage + fixed + 1024 > (size_t)smem_limit)
        pl.stages = 1;
    /* after the ring, the warps merge their states in the same bytes: 16 rows of O (Dv + 8
     * floats each: paged.cu's KPT_PG_OS), m and l a warp (paged.cu's scratch), more than one
     * stage holds where Dv is well above Dqk */
    size_t ring = (size_t)pl.stages * stage,
           scratch = (size_t)pl.warps * (16 * ((size_t)cfg->dv + 8) + 32) * 4;
    pl.smem_bytes = align + q + (ring > scratch ? ring : scratch);
    /* sm_90a: a ring of three stages, which the same kernels take at run time (pargs.stages)
     * for runs over paged caches (pages under a tile) that a split leaves one CTA an SM: each
     * 64-key tile is several page lookups, and a third stage keeps them ahead (H100, bf16,
     * D = 128, GQA 32:8, page 16, sustained: 8 x 16 x 32k 2755 -> 2872 GB/s, 8 x 4 x 32k
     * 2865-2879 -> 2919-2921; the contiguous cache and runs of two CTAs an SM lost 1-7 % with
     * it: docs/BENCHMARKS.md, "Serving: a third stage for paged caches"). Its 3 x 32 KB at
     * D = 128 leave room for one CTA an SM only. */
    const size_t deep = 3 * stage;
    if (pl.cfg.wgmma && pl.stages == 2 &&
        (smem_limit <= 0 || align + q + deep + fixed + 1024 <= (size_t)smem_limit)) {
        pl.stages_deep = 3;
        pl.deep_smem_bytes = align + q + (deep > scratch ? deep : scratch);
    }
    if (smem_limit > 0 && pl.smem_bytes + fixed > (size_t)smem_limit)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the serving kernel needs %zu bytes of "
                            "shared memory a CTA; this device allows %d", cfg->dqk, cfg->dv,
                            pl.smem_bytes + fixed, smem_limit);
    *out = pl;
    return KPT_OK;
}

kpt_status kpt_plan_tiles_cuda(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag)
{
    if (cfg->dtype != KPT_DTYPE_F16 && cfg->dtype != KPT_DTYPE_BF16)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "dtype %s is not supported by the CUDA backend (f16 or bf16)",
                            kpt_dtype_name(cfg->dtype));
    if (!kpt_cuda_head_dim_ok(cfg->dqk) || !kpt_cuda_head_dim_ok(cfg->dv))
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "head dims Dqk = %d, Dv = %d: the CUDA backend supports 32, 64, 96, "
                            "128 and 256", cfg->dqk, cfg->dv);
    if (cfg->sm < 80)
        return kpt_diag_set(diag, KPT_ERR_UNSUPPORTED,
                            "sm_%d: the CUDA backend needs sm_80 or newer (mma.sync bf16)", cfg->sm);
    if (cfg->kind == KPT_KERNEL_BACKWARD)
        return plan_backward(p, cfg, smem_limit, out, diag);
    if (cfg->kind == KPT_KERNEL_PAGED)
        return plan_paged(p, cfg, smem_limit, out, diag);
    kpt_kernel_plan pl = {0};
    pl.cfg = *cfg;
    pl.cfg.tall = false; /* where the variant is offered, below */
    int dmax = cfg->dqk > cfg->dv ? cfg->dqk : cfg->dv;
    pl.warps = 4;
    pl.stages = 2;
    kpt_status st = kpt_plan_mask(p, &pl, diag);
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
        uint32_t nodes;
        pl.mask_bits = mask_bits(p, &pl, &nodes);
        pl.mask_rolled = nodes > KPT_MASK_UNROLL_MAX_NODES;
        pl.warps = 12;
        pl.mt = 1;
        pl.bm = 128;
        pl.bn = dmax == 256 ? 64 : 128;
        pl.q_in_regs = false;
        /* Partial tiles of costly masks read bits the block-map kernels computed once for all
         * heads (kpt_blockmap_bits): natten_morton at 16k evaluated its 60-node mask in 1012
         * tiles a head, half the kernel's instructions. A thread's bits of a tile are one
         * 64-bit word (half of it with the 64-key tiles of head dim 256). */
        pl.has_blockmap = pl.has_blockmap || pl.mask_bits;
        /* Head dims up to 64 without a mask: three consumer warpgroups, 192-row q tiles. Their
         * products take half the time of head dim 128's while the softmax takes as long, so
         * with two warpgroups the tensor cores waited on it (H100, bf16, D = 64, full: 1k 408 ->
         * 439 TFLOP/s, 4k 461 -> 539, 16k 459 -> 539). Not for masks: under a causal mask the
         * 192-row tiles' granularity (at 1k 10 % more products; the last tile of 64 rows on one
         * consumer) and the persistent grid's q-tile pairs, uneven with an odd count of tiles,
         * cost 6-12 % at 1k-2k though they gained 10-20 % at 4k-16k (docs/BENCHMARKS.md, "Head
         * dim 64: three consumer warpgroups"); nor block maps, whose keep bits are laid out for
         * 128-row tiles. */
        if (dmax <= 64 && !pl.has_mask) {
            pl.warps = 16;
            pl.bm = 192;
        }
        /* Masked, the same tiles as a second plan, which the runtime takes for the calls whose
         * lengths and mask favour them (kpt_forward_tall_pays): causal-shaped masks from 3k
         * queries, where the tiles' extra products cost less than a third consumer gains. */
        pl.tall_variant = tall_offered(p, &pl, dmax);
        pl.cfg.tall = cfg->tall && pl.tall_variant;
        if (pl.cfg.tall) {
            pl.warps = 16;
            pl.bm = 192;
        }
        /* O through TMA stores: stored from registers, a thread's 4-byte pieces of rows made
         * warp stores of 8 rows' 16 bytes each, which the consumers waited for before the next
         * item (H100, bf16, D = 128, 1k tokens: 553 -> 595 TFLOP/s full, 402 -> 445 causal) */
        pl.o_tma = cfg->dv <= 128;
        pl.smem_bytes = 1024 + 2 * ((size_t)pl.bm * (size_t)cfg->dqk +
                                    (size_t)pl.stages * pl.bn * (size_t)(cfg->dqk + cfg->dv) +
                                    (pl.o_tma ? (size_t)pl.bm * (size_t)cfg->dv : 0));
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

