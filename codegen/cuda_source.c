/* CUDA source generation (see cuda_source.h). */
#include <stdlib.h>

#include "codegen/cuda_source.h"
#include "codegen/emit_c.h"
#include "codegen/expr_source.h"
#include "base/diag.h"

/* templates/cuda/: common.cu around one of the attention kernels, embedded */
extern const char kpt_tmpl_cuda_common[];
extern const char kpt_tmpl_cuda_attention[];
extern const char kpt_tmpl_cuda_attention_sm90[];

static void emit_config(kpt_strbuf *sb, const kpt_kernel_plan *pl)
{
    kpt_sb_printf(sb, "// shape class: %s, Dqk %d, Dv %d, sm_%d%s\n",
                  kpt_dtype_name(pl->cfg.dtype), pl->cfg.dqk, pl->cfg.dv, pl->cfg.sm,
                  pl->cfg.wgmma ? "a" : "");
    kpt_sb_printf(sb, "#define KPT_WGMMA %d\n", pl->cfg.wgmma);
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

kpt_status kpt_cuda_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const kpt_c_dialect *d, char **out, kpt_diag *diag)
{
    kpt_strbuf cfg = {0};
    emit_config(&cfg, plan);
    kpt_status st =
        kpt_cpp_kernel_source(p, d, kpt_tmpl_cuda_common,
                              plan->cfg.wgmma ? kpt_tmpl_cuda_attention_sm90
                                              : kpt_tmpl_cuda_attention,
                              &cfg, out, diag);
    kpt_sb_free(&cfg);
    return st;
}
