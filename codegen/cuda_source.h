/* CUDA C for a pattern's fused attention kernel (and its block-map kernel when the mask reads aux
 * tensors): the sm_80+ template (templates/cuda/attention.cu) filled with the plan's constants
 * and the pattern's expressions. The source needs no headers and is byte-identical for the same
 * pattern IR and plan. */
#ifndef KPT_CODEGEN_CUDA_SOURCE_H
#define KPT_CODEGEN_CUDA_SOURCE_H

#include <kpt/status.h>

#include "codegen/emit_c.h"
#include "compiler/plan_tiles.h"

/* The kernels' entry points. */
#define KPT_CUDA_ATTENTION_ENTRY "kpt_attention"
#define KPT_CUDA_BLOCKMAP_ENTRY "kpt_blockmap"
#define KPT_CUDA_PAGED_ENTRIES {"kpt_paged_r1", "kpt_paged_r2", "kpt_paged_r4"}
#define KPT_CUDA_PAGED_COMBINE_ENTRY "kpt_paged_combine"
/* the backward kernels (kind "backward") */
#define KPT_CUDA_BWD_PREP_ENTRY "kpt_bwd_prep"
#define KPT_CUDA_BWD_DKDV_ENTRY "kpt_bwd_dkdv"
#define KPT_CUDA_BWD_DKDV_AUX_ENTRY "kpt_bwd_dkdv_aux" /* plan.aux_grads */
#define KPT_CUDA_BWD_DQ_ENTRY "kpt_bwd_dq"
#define KPT_CUDA_BWD_DQ_STORE_ENTRY "kpt_bwd_dq_store" /* sm_90a: dq from its atomic sums */
#define KPT_CUDA_BWD_DAUX_ENTRY "kpt_bwd_daux"
#define KPT_CUDA_BWD_DSINKS_ENTRY "kpt_bwd_dsinks"
/* sm_90a kernels with a block map: sorts each map row's q tiles by work (the CTA order) */
#define KPT_CUDA_BLOCKMAP_ORDER_ENTRY "kpt_blockmap_order"
/* and, where the plan has mask_bits, the partial tiles' keep bits */
#define KPT_CUDA_BLOCKMAP_BITS_ENTRY "kpt_blockmap_bits"

/* Returns malloc'ed source in *out (caller frees); d is the target's dialect (kpt_dialect_cuda). */
kpt_status kpt_cuda_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const kpt_c_dialect *d, char **out, kpt_diag *diag);

#endif
