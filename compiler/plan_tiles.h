/* The tile planners: how a pattern's kernel is tiled for one shape class and target, one file
 * per kernel family (plan_tiles_cuda.c, plan_tiles_hip.c, plan_tiles_glsl.c) with one
 * signature, so the target table (target/target.c) names each target's planner. The rules live
 * here, one place, so codegen, the runtime (launch geometry, shared memory) and kptc agree. */
#ifndef KPT_COMPILER_PLAN_TILES_H
#define KPT_COMPILER_PLAN_TILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kpt/status.h>

#include "ir/pattern.h"
#include "ir/plan.h"

/* A planner: fills *out for p and cfg, or says why the target cannot take the shape class.
 * smem_limit: the bytes of shared memory a workgroup may use (0: the target's own limit). */
typedef kpt_status (*kpt_planner)(const kpt_pattern *p, const kpt_kernel_config *cfg,
                                  int smem_limit, kpt_kernel_plan *out, kpt_diag *diag);

/* sm_80+ (mma.sync) and sm_90a (wgmma) kernels; f16 or bf16; the head dims below. */
kpt_status kpt_plan_tiles_cuda(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag);

/* The head dims the CUDA and HIP planners accept (kptc and the tests enumerate them). */
extern const int kpt_cuda_head_dims[];
extern const int kpt_cuda_num_head_dims;
bool kpt_cuda_head_dim_ok(int d);

/* The GLSL (Vulkan) kernel: one invocation per query row, bm rows per workgroup, K and V tiles of
 * bn rows in fp32 shared memory, bn as large as the shared memory allows (at most 32). cfg->sm
 * is 0; dtype F16, BF16 (as 16-bit storage, widened in the shader) or F32; head dims 1..256. With cfg->coopmat, f16 and head dims that are
 * multiples of 16 up to 128 get the cooperative-matrix kernel instead (4 subgroups of 32, bm 64,
 * bn 32; plan.warps = 4), planned for all of smem_limit; cfg->coopmat stays set only when that
 * kernel is planned. Every other plan uses at most KPT_GLSL_PLAN_SMEM bytes: one plan (and so
 * one source text and cache key) for every device with at least 32 KiB, so kernels compiled
 * offline or on one device are found on the others. */
#define KPT_GLSL_MAX_HEAD_DIM 256
#define KPT_GLSL_PLAN_SMEM 32768
kpt_status kpt_plan_tiles_glsl(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                               kpt_kernel_plan *out, kpt_diag *diag);
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
/* The same for the serving kernel (kind paged): n_kt tiles of a sequence split into `splits`
 * parts, `group` query heads per kv head. Rows past the plan's, which it fills with NaN, are
 * not counted (the lengths live on the device): kpt_check_loops reports a launch they push past
 * the limit. */
int64_t kpt_glsl_paged_loop_iterations(const kpt_kernel_plan *pl, int64_t n_kt, int splits,
                                       int group);
/* The same for its combine of `splits` partial results. */
int64_t kpt_glsl_combine_loop_iterations(const kpt_kernel_plan *pl, int splits);

/* The CUDA serving kernel's shared memory besides the plan's smem_bytes: its static tile
 * classes, page ids, live-tile range and rows (templates/cuda/paged.cu: s_cls, s_pt, s_lo,
 * s_hi and s_rows, 12 bytes for each of up to 64 rows; unmasked kernels have no classes or
 * range, so this is a bound), and its copy of the argument block, kpt_args
 * (runtime/kernel_args.h asserts the host twin's size). */
#define KPT_PAGED_STATIC_SMEM (2048 + 8192 + 8 + 768)
#define KPT_KERNEL_ARGS_BYTES 1304

/* The sm_90a backward kernels (templates/cuda/attention_bwd_sm90.cu): kpt_bwd_dkdv's steps of 64
 * query rows (KPT_BWD_SUB; the rows of the TMA boxes of Q and dO), and in both kpt_bwd_dkdv and
 * kpt_bwd_dq a producer warpgroup beside the plan's two consumer warpgroups (KPT_BWD_THREADS),
 * so they run plan.warps + 4 warps. */
#define KPT_BWD_STEP_ROWS 64
#define KPT_BWD_PRODUCER_WARPS 4
/* kpt_bwd_prep and kpt_bwd_dq_store (templates/cuda/attention_bwd*.cu): query rows a CTA of 256
 * threads, eight lanes a row */
#define KPT_BWD_PREP_ROWS 32

/* The HIP kernel (templates/hip/attention.hip) for cfg->gfx: 4 wavefronts of 16 query rows,
 * kv tiles of 64 keys (32 for head dims over 128) in LDS; f16 or bf16; the CUDA head dims. */
kpt_status kpt_plan_tiles_hip(const kpt_pattern *p, const kpt_kernel_config *cfg, int smem_limit,
                              kpt_kernel_plan *out, kpt_diag *diag);

/* ---- shared by the planners (plan_mask.c) ---- */

/* Masks of more IR nodes than this are evaluated in a loop in partial tiles (plan.mask_rolled). */
#define KPT_MASK_UNROLL_MAX_NODES 24
/* The sm_90a kernels store the keep bits of partial tiles (plan.mask_bits) for masks of at
 * least this many nodes (and for those that read aux data): a dilated window (9) has partial
 * tiles only; causal (3), windows, prefixes and chunks (at most 7) have few, and an affine
 * compare per score costs less than building a block map for them on every call. */
#define KPT_MASK_BITS_MIN_NODES 8
/* The sm_90a forward offers 192-row q tiles for masked patterns (plan.tall_variant) whose score
 * modification costs at most this much a score (plan_tiles_cuda.c, score_cost): softcap's tanh
 * (4), not ALiBi's bias (7) nor an erf GELU (17). */
#define KPT_TALL_SCORE_MAX_COST 5
/* Non-constant nodes in the cone of root; *loads is set when one of them loads aux data. */
uint32_t kpt_plan_cone_size(const kpt_ir_graph *g, kpt_ir_ref root, bool *loads);
/* has_mask, has_score, has_blockmap (and per what) and mask_rolled of pl from p. */
kpt_status kpt_plan_mask(const kpt_pattern *p, kpt_kernel_plan *pl, kpt_diag *diag);

#endif
