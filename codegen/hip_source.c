/* HIP source generation (see hip_source.h). */
#include <stdlib.h>

#include "codegen/emit_c.h"
#include "codegen/expr_source.h"
#include "codegen/hip_source.h"
#include "base/diag.h"

extern const char kpt_tmpl_hip_attention[]; /* templates/hip/attention.hip, embedded */

static void emit_config(kpt_strbuf *sb, const kpt_kernel_plan *pl)
{
    kpt_sb_printf(sb, "// shape class: %s, Dqk %d, Dv %d, gfx%x\n",
                  kpt_dtype_name(pl->cfg.dtype), pl->cfg.dqk, pl->cfg.dv, (unsigned)pl->cfg.gfx);
    kpt_sb_printf(sb, "#define KPT_BF16 %d\n", pl->cfg.dtype == KPT_DTYPE_BF16);
    kpt_sb_printf(sb, "#define KPT_DQK %d\n#define KPT_DV %d\n", pl->cfg.dqk, pl->cfg.dv);
    kpt_sb_printf(sb, "#define KPT_BM %d\n#define KPT_BN %d\n", pl->bm, pl->bn);
    kpt_sb_printf(sb, "#define KPT_WAVES %d\n", pl->warps);
    kpt_sb_printf(sb, "#define KPT_HAS_MASK %d\n#define KPT_HAS_SCORE %d\n", pl->has_mask,
                  pl->has_score);
    kpt_sb_printf(sb, "#define KPT_HAS_BLOCKMAP %d\n", pl->has_blockmap);
}

kpt_status kpt_hip_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                          const kpt_c_dialect *d, char **out, kpt_diag *diag)
{
    kpt_strbuf cfg = {0};
    emit_config(&cfg, plan);
    kpt_status st =
        kpt_cpp_kernel_source(p, d, kpt_tmpl_hip_attention, NULL, &cfg, out, diag);
    kpt_sb_free(&cfg);
    return st;
}
