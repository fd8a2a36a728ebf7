/* The passes over a pattern's IR. Each lives in the file named after it; each rewrites the
 * pattern in place (through kpt_pattern_rewrite) and reports whether it changed anything. */
#ifndef KPT_COMPILER_PASSES_H
#define KPT_COMPILER_PASSES_H

#include "ir/pattern.h"

/* Returns KPT_OK, or the failure's status with its message in diag (the driver prefixes the
 * pass's name); *progress says whether the IR changed. */
typedef kpt_status (*kpt_pass_fn)(kpt_pattern *p, bool *progress, kpt_diag *diag);

/* Replaces every operation whose operands are all constants by its value (computed by the
 * interpreter, so folding can never disagree with it). */
kpt_status kpt_opt_fold(kpt_pattern *p, bool *progress, kpt_diag *diag);

/* Algebraic identities that hold exactly under the IR's semantics (i32 wrap-around, IEEE f32
 * with NaN and signed zeros): x+0, x*1, x&&true, not(not x), select on a constant, ... and
 * comparison canonicalisation (a > b becomes b < a). */
kpt_status kpt_opt_simplify(kpt_pattern *p, bool *progress, kpt_diag *diag);

/* Not a pipeline pass but run on a derived copy for backward kernels (diff_score.c): adds the
 * gradient roots (kpt_pattern.dscore, dloads) of the score mod, then runs the pipeline over
 * them. Marks p derived. */
kpt_status kpt_diff_score(kpt_pattern *p, kpt_diag *diag);

#endif
