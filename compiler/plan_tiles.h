/* The kernel plan: how a pattern's attention kernel is tiled for one shape class and target.
 * The rules live here, one place, so codegen, the runtime (launch geometry, shared memory) and
 * kptc agree. */
#ifndef KPT_COMPILER_PLAN_TILES_H
#define KPT_COMPILER_PLAN_TILES_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/status.h>
#include <kpt/tensor.h>

#include "ir/pattern.h"

/* A shape class: what a kernel is specialised for (sequence lengths, batch and head counts are
 * launch arguments, never part of it). */
typedef struct kpt_kernel_config {
    kpt_dtype dtype; /* F16 or BF16 */
    int dqk, dv;     /* head dims */
    int sm;          /* target compute capability times ten: 80, 86, 89, 90 */
    bool wgmma;      /* sm_90a: the Hopper kernel (wgmma); sm is 90. The planner clears it for
                        shape classes that kernel does not cover (they take the sm_80 kernel) */
    int gfx;         /* AMD targets: the gfx name's digits as hex (0x90a, 0x940, 0x942); else 0 */
    bool coopmat;    /* Vulkan: the device has 16x16x16 f16 cooperative matrices (NV), subgroups
                        of 32 and shaderFloat16; f16 kernels then use them where they fit */
} kpt_kernel_config;

typedef struct kpt_kernel_plan {
    kpt_kernel_config cfg;
    int bm, bn;        /* q rows and kv rows per tile */
    int warps, mt;     /* warps per CTA; m16 row blocks per warp (bm = warps * mt * 16, but for
                        * wgmma: 128 rows on two consumer warpgroups, plus the producer) */
    int stages;        /* kv tiles in flight (cp.async ring) */
    bool q_in_regs;    /* Q fragments kept in registers across the kv loop */
    bool has_mask, has_score;
    bool has_blockmap; /* the mask reads aux tensors: tiles are classified by a block-map kernel */
    bool bm_per_b, bm_per_h; /* the block map differs per batch row / per head */
    /* Partial tiles evaluate the mask in a loop rather than unrolled per element: for masks that
     * load aux data or are long, unrolling buys little and costs seconds of NVRTC time. */
    bool mask_rolled;
    size_t smem_bytes; /* dynamic shared memory of the attention kernel */
} kpt_kernel_plan;

/* The head dims kptc and the tests enumerate: every (dqk, dv) the planner accepts is one of
 * these sizes. */
extern const int kpt_cuda_head_dims[];
extern const int kpt_cuda_num_head_dims;

kpt_status kpt_plan_tiles(const kpt_pattern *p, const kpt_kernel_config *cfg, kpt_kernel_plan *out,
                          kpt_diag *diag);

/* The GLSL (Vulkan) kernel: one invocation per query row, bm rows per workgroup, K and V tiles of
 * bn rows in fp32 shared memory, bn as large as `smem_limit` bytes allow (at most 32). cfg->sm
 * is 0; dtype F16 or F32; head dims 1..256. With cfg->coopmat, f16 and head dims that are
 * multiples of 16 up to 128 get the cooperative-matrix kernel instead (4 subgroups of 32, bm 64,
 * bn 32; plan.warps = 4); cfg->coopmat stays set only when that kernel is planned. */
#define KPT_GLSL_MAX_HEAD_DIM 256
/* f16 elements of the cooperative-matrix kernel's Q/K/V shared array (KPT_KV_ELEMS). */
size_t kpt_glsl_coopmat_kv_elems(int dqk, int dv);
/* The scalar GLSL kernel runs its head-dim loops in unrolled chunks of this many iterations
 * (KPT_CH in templates/glsl/attention.comp): 16, and an eighth of the larger head dim rounded up
 * to a multiple of 16 beyond 128 (longer chunks: fewer iterations, slower compiles on lavapipe). */
int kpt_glsl_chunk(int dqk, int dv);
/* An upper bound on the loop iterations (back-edges and exit tests of every dynamic loop) one
 * invocation of the scalar GLSL kernel of plan `pl` runs over n_kt kv tiles: what Mesa's
 * llvmpipe limits (runtime/backend_vulkan.c). */
int64_t kpt_glsl_loop_iterations(const kpt_kernel_plan *pl, int64_t n_kt);
kpt_status kpt_plan_tiles_glsl(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag);

/* The HIP kernel (templates/hip/attention.hip) for cfg->gfx: 4 wavefronts of 16 query rows,
 * kv tiles of 64 keys (32 for head dims over 128) in LDS; f16 or bf16; the CUDA head dims. */
kpt_status kpt_plan_tiles_hip(const kpt_pattern *p, const kpt_kernel_config *cfg,
                              kpt_kernel_plan *out, kpt_diag *diag);
/* "hip:gfx90a" -> 0x90a (also gfx940, gfx942); -1 for anything else. */
int kpt_hip_target_gfx(const char *target);

#endif
