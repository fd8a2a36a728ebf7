/* CUDA source generation (see cuda_source.h). */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/cuda_source.h"
#include "codegen/emit_c.h"
#include "codegen/expr_source.h"
#include "codegen/template.h"
#include "base/diag.h"

/* templates/cuda/: common.cu around one of the attention kernels, embedded */
extern const char kpt_tmpl_cuda_common[];
extern const char kpt_tmpl_cuda_attention[];
extern const char kpt_tmpl_cuda_attention_sm90[];
extern const char kpt_tmpl_cuda_attention_bwd[];
extern const char kpt_tmpl_cuda_attention_bwd_sm90[];
extern const char kpt_tmpl_cuda_hopper[];
extern const char kpt_tmpl_cuda_paged[];

static void emit_config(kpt_strbuf *sb, const kpt_pattern *p, const kpt_kernel_plan *pl)
{
    kpt_sb_printf(sb, "// shape class: %s, Dqk %d, Dv %d, sm_%d%s%s\n",
                  kpt_dtype_name(pl->cfg.dtype), pl->cfg.dqk, pl->cfg.dv, pl->cfg.sm,
                  pl->cfg.wgmma ? "a" : "",
                  pl->cfg.kind == KPT_KERNEL_BACKWARD ? ", backward"
                  : pl->cfg.kind == KPT_KERNEL_PAGED  ? ", paged"
                                                      : "");
    kpt_sb_printf(sb, "#define KPT_WGMMA %d\n", pl->cfg.wgmma);
    kpt_sb_printf(sb, "#define KPT_BF16 %d\n", pl->cfg.dtype == KPT_DTYPE_BF16);
    kpt_sb_printf(sb, "#define KPT_DQK %d\n#define KPT_DV %d\n", pl->cfg.dqk, pl->cfg.dv);
    kpt_sb_printf(sb, "#define KPT_BM %d\n#define KPT_BN %d\n", pl->bm, pl->bn);
    kpt_sb_printf(sb, "#define KPT_WARPS %d\n#define KPT_MT %d\n", pl->warps, pl->mt);
    kpt_sb_printf(sb, "#define KPT_STAGES %d\n#define KPT_Q_IN_REGS %d\n", pl->stages,
                  pl->q_in_regs);
    kpt_sb_printf(sb, "#define KPT_O_TMA %d\n", pl->o_tma);
    kpt_sb_printf(sb, "#define KPT_HAS_MASK %d\n#define KPT_HAS_SCORE %d\n", pl->has_mask,
                  pl->has_score);
    kpt_sb_printf(sb, "#define KPT_HAS_BLOCKMAP %d\n", pl->has_blockmap);
    kpt_sb_printf(sb, "#define KPT_KV_ORDER %d\n", kpt_plan_kv_order(pl));
    kpt_sb_printf(sb, "#define KPT_MASK_ROLLED %d\n", pl->mask_rolled);
    kpt_sb_printf(sb, "#define KPT_MASK_AUX %d\n#define KPT_MASK_BITS %d\n", pl->mask_loads,
                  pl->mask_bits);
    if (pl->mask_bits) /* the backward's map holds two layouts of bits */
        kpt_sb_printf(sb, "#define KPT_BITS_TILES %d\n#define KPT_BITS_BWD %d\n",
                      KPT_MASK_BITS_TILES, pl->cfg.kind == KPT_KERNEL_BACKWARD);
    kpt_sb_printf(sb, "#define KPT_MASK_UNROLL _Pragma(\"unroll%s\")", pl->mask_rolled ? " 1" : "");
    if (pl->cfg.kind == KPT_KERNEL_BACKWARD) /* the sm_90a kernels' shape, as the runtime's */
        kpt_sb_printf(sb, "\n#define KPT_BWD_SUB %d\n#define KPT_BWD_PRODUCER_WARPS %d"
                      "\n#define KPT_BWD_DQ_TILES %d\n#define KPT_PREP_ROWS %d"
                      "\n#define KPT_DS_FINITE %d\n#define KPT_BWD_DKDV_TURNS %d",
                      KPT_BWD_STEP_ROWS, KPT_BWD_PRODUCER_WARPS, pl->dq_tiles, KPT_BWD_PREP_ROWS,
                      pl->ds_finite, pl->dkdv_turns);
    if (pl->cfg.kind == KPT_KERNEL_PAGED) /* rows of one CTA span heads: classify per head? */
        kpt_sb_printf(sb, "\n#define KPT_MASK_PER_H %d\n#define KPT_NUM_AUX %d", pl->bm_per_h,
                      p->num_aux);
}

/* The backward kernels' text: templates/cuda/attention_bwd.cu with the score mod's gradient,
 * followed on sm_90a by the warpgroup-MMA kpt_bwd_dkdv and kpt_bwd_dq
 * (templates/cuda/attention_bwd_sm90.cu), which replace its mma.sync ones. */
static kpt_status backward_kernel(const kpt_pattern *p, const kpt_kernel_plan *pl,
                                  const kpt_c_dialect *d, kpt_strbuf *src, kpt_diag *diag)
{
    kpt_strbuf grad = {0}, auxg = {0};
    char err[256], ndaux[16];
    kpt_emit_score_grad_body(&grad, p, d);
    kpt_emit_aux_grad_body(&auxg, p, d);
    snprintf(ndaux, sizeof(ndaux), "%d", p->num_dloads);
    kpt_status st = KPT_OK;
    const kpt_hole holes[] = {{"GRAD", grad.data}, {"AUXGRAD", auxg.data}, {"NDAUX", ndaux}};
    if (grad.failed || auxg.failed)
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (cuda codegen)");
    else if (!kpt_template_fill(src, kpt_tmpl_cuda_attention_bwd, holes, 3, err, sizeof(err)))
        st = kpt_diag_set(diag, KPT_ERR_INTERNAL, "cuda backward template: %s", err);
    if (!st && pl->cfg.wgmma)
        kpt_sb_puts(src, kpt_tmpl_cuda_attention_bwd_sm90);
    kpt_sb_free(&grad);
    kpt_sb_free(&auxg);
    return st;
}

/* The text of the KERNEL hole: the kernel kind's template, after the Hopper primitives on
 * sm_90a. */
static kpt_status kernel_text(const kpt_pattern *p, const kpt_kernel_plan *pl,
                              const kpt_c_dialect *d, kpt_strbuf *k, kpt_diag *diag)
{
    if (pl->cfg.wgmma)
        kpt_sb_puts(k, kpt_tmpl_cuda_hopper);
    if (pl->cfg.kind == KPT_KERNEL_BACKWARD)
        return backward_kernel(p, pl, d, k, diag);
    kpt_sb_puts(k, pl->cfg.kind == KPT_KERNEL_PAGED ? kpt_tmpl_cuda_paged
                   : pl->cfg.wgmma                 ? kpt_tmpl_cuda_attention_sm90
                                                   : kpt_tmpl_cuda_attention);
    return KPT_OK;
}

kpt_status kpt_cuda_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const kpt_c_dialect *d, char **out, kpt_diag *diag)
{
    kpt_strbuf cfg = {0}, kernel = {0};
    emit_config(&cfg, p, plan);
    kpt_status st = kernel_text(p, plan, d, &kernel, diag);
    if (!st && kernel.failed)
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (cuda codegen)");
    if (!st)
        st = kpt_cpp_kernel_source(p, d, kpt_tmpl_cuda_common, kernel.data, &cfg, out, diag);
    kpt_sb_free(&kernel);
    kpt_sb_free(&cfg);
    return st;
}
