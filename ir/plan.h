/* Kernel plans: what one kernel is specialised for (its shape class and target) and how it is
 * tiled. The types sit beside the IR because every layer above it reads them: the planners
 * (compiler/plan_tiles*.c) fill them in, codegen turns them into constants, the runtime derives
 * launch geometry and shared memory from them, and kptc prints them. */
#ifndef KPT_IR_PLAN_H
#define KPT_IR_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/tensor.h>

/* What a kernel computes. Part of every kernel's identity (plans, cache keys) from the first
 * kind on, so the kinds that follow (backward, decode, split-KV combine) are new rows, not new
 * paths. */
typedef enum kpt_kernel_kind {
    KPT_KERNEL_FORWARD = 0, /* O and LSE of attention (and the block map it needs) */
    KPT_KERNEL_BACKWARD,    /* dQ, dK, dV from dO, O and LSE (and the block map it needs) */
    KPT_KERNEL_PAGED,       /* serving: ragged queries over a paged (or contiguous) KV cache,
                               split over the keys, and the combine of the splits */
    KPT_KERNEL_NUM_KINDS
} kpt_kernel_kind;

/* The kind's name in messages and keys: "forward", "backward", "paged". */
const char *kpt_kernel_kind_name(kpt_kernel_kind kind);

/* A shape class: what a kernel is specialised for (sequence lengths, batch and head counts are
 * launch arguments, never part of it). */
typedef struct kpt_kernel_config {
    kpt_kernel_kind kind;
    kpt_dtype dtype; /* F16 or BF16 (F32 on Vulkan) */
    int dqk, dv;     /* head dims */
    int sm;          /* target compute capability times ten: 80, 86, 89, 90 */
    bool wgmma;      /* sm_90a: the Hopper kernel (wgmma); sm is 90. The planner clears it for
                        shape classes that kernel does not cover (they take the sm_80 kernel) */
    int gfx;         /* AMD targets: the gfx name's digits as hex (0x90a, 0x940, 0x942); else 0 */
    bool coopmat;    /* Vulkan: the device has 16x16x16 f16 cooperative matrices (NV), subgroups
                        of 32 and shaderFloat16; f16 kernels then use them where they fit */
    bool tall;       /* sm_90a forward: the variant of 192-row q tiles (three consumer
                        warpgroups) of a plan that offers one (plan.tall_variant) */
} kpt_kernel_config;

/* The keep bits of a block map (plan.mask_bits) hold at most this many partial tiles of 2048
 * bytes (16 MB), shared out between the map's rows; tiles beyond evaluate their mask. */
#define KPT_MASK_BITS_TILES 8192

typedef struct kpt_kernel_plan {
    kpt_kernel_config cfg;
    int bm, bn;        /* q rows and kv rows per tile */
    int warps, mt;     /* warps per CTA; m16 row blocks per warp (bm = warps * mt * 16, but for
                        * wgmma: 128 rows on two consumer warpgroups, plus the producer) */
    int stages;        /* kv tiles in flight (cp.async ring) */
    bool q_in_regs;    /* Q fragments kept in registers across the kv loop */
    bool has_mask, has_score;
    /* backward: the score mod's derivative d s'/d s is finite at every score that is not NaN
     * (compiler/analyze_range.c), so dS needs no guard against 0 * inf on dropped pairs */
    bool ds_finite;
    bool has_blockmap; /* tiles are classified by a block-map kernel: the mask reads aux tensors,
                          or mask_bits */
    bool mask_loads;   /* the mask reads aux tensors (the paged kernels classify tiles without a
                          block map, a warp at a time: kpt_iv_load is a warp's collective) */
    bool bm_per_b, bm_per_h; /* the block map differs per batch row / per head */
    /* Partial tiles evaluate the mask in a loop rather than unrolled per element: for masks that
     * load aux data or are long, unrolling buys little and costs seconds of NVRTC time. */
    bool mask_rolled;
    /* sm_90a forward and backward: the block map also holds each partial tile's keep bits,
     * computed once per map row by the block-map kernels (shared by every head the mask does not
     * depend on), so the attention kernel loads 8 bytes a thread instead of evaluating the mask
     * there. For masks that read aux data or have KPT_MASK_BITS_MIN_NODES nodes; implies
     * has_blockmap. A forward's bits go by q tile ("lines" of kv tiles); a backward's map has
     * them by kv tile (kpt_bwd_dkdv's), then by q tile (kpt_bwd_dq's). */
    bool mask_bits;
    /* backward, sm_90a: the f32 dQ staging tiles a consumer warpgroup of kpt_bwd_dkdv takes in
     * turn (1 or 2); 0 past head dim 128, where kpt_bwd_dkdv does not sum dQ and both modes
     * run kpt_bwd_dq */
    int dq_tiles;
    /* backward, sm_90a, head dims 128: kpt_bwd_dkdv's two consumer warpgroups take turns issuing
     * a step's products S^T and dP^T (ping-pong: named barriers), for score mods that evaluate
     * transcendentals per score (compiler/plan_tiles_cuda.c); in calls that sum dQ there only
     * (the deterministic mode's launch runs without them) */
    bool dkdv_turns;
    /* backward: the score has aux gradients, and the module holds a second dK/dV kernel with
     * their terms (KPT_CUDA_BWD_DKDV_AUX_ENTRY), launched for calls that ask for any */
    bool aux_grads;
    /* sm_90a forward: O leaves through staging tiles in shared memory and TMA stores (Dv up to
     * 128; at 256 the tiles would not fit beside Q and the ring) */
    bool o_tma;
    /* sm_90a forward, head dims up to 64, masked, no block map: a second plan of 192-row q tiles
     * and three consumer warpgroups exists (cfg.tall asks for it). Its products under a causal
     * mask are as fast as the unmasked kernel's, but it takes more of them on short sequences
     * and banded masks, so the runtime holds both modules and picks one a call
     * (runtime/forward_grid.h, kpt_forward_tall_pays). */
    bool tall_variant;
    /* serving, sm_90a: a deeper ring (0: none) that the serving kernels take, with its dynamic
     * shared memory, for runs over paged caches split to one CTA an SM, where the page lookups
     * leave the two-stage ring waiting (runtime/cuda_device.c, kpt_cuda_paged) */
    int stages_deep;
    size_t deep_smem_bytes;
    size_t smem_bytes; /* dynamic shared memory of the attention kernel */
    int dq_rows; /* backward: the queries of a kpt_bwd_dq CTA (bm; 2 bm past head dim 128 on
                  * sm_90a, where a CTA takes two q tiles) */
    size_t dq_smem_bytes; /* backward: kpt_bwd_dq's (smem_bytes is the larger of it and
                             kpt_bwd_dkdv's; the launch of each takes its own, so the static
                             shared memory of either fits beside it) */
} kpt_kernel_plan;

/* Whether the block map ends with a kv tile order, a row of n_kt tiles per map row (the sm_90a
 * backward's kpt_kv_order_row): codegen's KPT_KV_ORDER and the map's size ask this one question. */
static inline bool kpt_plan_kv_order(const kpt_kernel_plan *pl)
{
    return pl->has_blockmap && pl->cfg.wgmma && pl->cfg.kind == KPT_KERNEL_BACKWARD;
}

#endif
