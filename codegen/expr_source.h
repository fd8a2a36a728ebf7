/* The part of the C++ kernel sources (CUDA, HIP) that does not depend on the target: the launch
 * arguments, the expression helpers and the pattern's generated functions
 * (templates/common/expr.inc), filled for one pattern in one dialect. Each target's template
 * takes the result in its @EXPR@ hole, after defining the primitives expr.inc lists. */
#ifndef KPT_CODEGEN_EXPR_SOURCE_H
#define KPT_CODEGEN_EXPR_SOURCE_H

#include <kpt/status.h>

#include "codegen/emit_c.h"
#include "base/strbuf.h"

/* Appends the filled fragment to `out`. */
kpt_status kpt_expr_source(kpt_strbuf *out, const kpt_pattern *p, const kpt_c_dialect *d,
                           kpt_diag *diag);

/* A whole C++ kernel source: `tmpl` (a target's template, holes CONFIG and EXPR, and KERNEL
 * when `kernel` is not NULL) filled with `config`, the fragment above in dialect `d` and the
 * kernel text. Returns malloc'ed source in *out. */
kpt_status kpt_cpp_kernel_source(const kpt_pattern *p, const kpt_c_dialect *d, const char *tmpl,
                                 const char *kernel, const kpt_strbuf *config, char **out,
                                 kpt_diag *diag);

#endif
