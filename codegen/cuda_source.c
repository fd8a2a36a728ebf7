/* CUDA source generation (see cuda_source.h). */
#include <stdlib.h>

#include "codegen/cuda_source.h"
#include "codegen/emit_c.h"
#include "codegen/template.h"
#include "ir/diag.h"

extern const char kpt_tmpl_cuda_attention[]; /* templates/cuda/attention.cu, embedded */

static void emit_config(kpt_strbuf *sb, const kpt_kernel_plan *pl)
{
    kpt_sb_printf(sb, "// shape class: %s, Dqk %d, Dv %d, sm_%d\n",
                  kpt_dtype_name(pl->cfg.dtype), pl->cfg.dqk, pl->cfg.dv, pl->cfg.sm);
    kpt_sb_printf(sb, "#define KPT_BF16 %d\n", pl->cfg.dtype == KPT_DTYPE_BF16);
    kpt_sb_printf(sb, "#define KPT_DQK %d\n#define KPT_DV %d\n", pl->cfg.dqk, pl->cfg.dv);
    kpt_sb_printf(sb, "#define KPT_BM %d\n#define KPT_BN %d\n", pl->bm, pl->bn);
    kpt_sb_printf(sb, "#define KPT_WARPS %d\n#define KPT_MT %d\n", pl->warps, pl->mt);
    kpt_sb_printf(sb, "#define KPT_STAGES %d\n#define KPT_Q_IN_REGS %d\n", pl->stages,
                  pl->q_in_regs);
    kpt_sb_printf(sb, "#define KPT_HAS_MASK %d\n#define KPT_HAS_SCORE %d\n", pl->has_mask,
                  pl->has_score);
    kpt_sb_printf(sb, "#define KPT_HAS_BLOCKMAP %d\n", pl->has_blockmap);
    kpt_sb_printf(sb, "#define KPT_MASK_UNROLL _Pragma(\"unroll%s\")", pl->mask_rolled ? " 1" : "");
}

kpt_status kpt_cuda_source(const kpt_pattern *p, const kpt_kernel_plan *plan, char **out,
                           kpt_diag *diag)
{
    kpt_strbuf cfg = {0}, score = {0}, mask = {0}, tile = {0}, src = {0}, ufields = {0}, uinit = {0};
    emit_config(&cfg, plan);
    kpt_emit_uniform(&ufields, &uinit, p, &kpt_dialect_cuda);
    kpt_emit_score_body(&score, p, &kpt_dialect_cuda);
    kpt_emit_mask_body(&mask, p, &kpt_dialect_cuda);
    kpt_emit_tile_body(&tile, p, &kpt_dialect_cuda);
    kpt_status st = KPT_OK;
    char err[256];
    if (cfg.failed || score.failed || mask.failed || tile.failed || ufields.failed || uinit.failed) {
        st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (CUDA codegen)");
    } else {
        const kpt_hole holes[] = {
            {"CONFIG", cfg.data},          {"SCORE", score.data},        {"MASK", mask.data},
            {"TILE", tile.data},           {"UNIFORM_FIELDS", ufields.data},
            {"UNIFORM_INIT", uinit.data},
        };
        if (!kpt_template_fill(&src, kpt_tmpl_cuda_attention, holes, 6, err, sizeof(err)))
            st = kpt_diag_set(diag, KPT_ERR_INTERNAL, "CUDA template: %s", err);
    }
    kpt_sb_free(&cfg);
    kpt_sb_free(&score);
    kpt_sb_free(&mask);
    kpt_sb_free(&tile);
    kpt_sb_free(&ufields);
    kpt_sb_free(&uinit);
    if (st) {
        kpt_sb_free(&src);
        return st;
    }
    *out = kpt_sb_take(&src);
    if (!*out)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (CUDA codegen)");
    return KPT_OK;
}
