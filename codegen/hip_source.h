/* HIP C++ for a pattern's fused attention kernel (and its block-map kernel when the mask reads
 * aux tensors) on AMD Instinct GPUs: templates/hip/attention.hip with the plan's constants and the
 * pattern's expressions (templates/common/expr.inc in the HIP dialect). Needs no headers, so
 * hipRTC and clang -nogpuinc both compile it; byte-identical for the same pattern IR and plan. */
#ifndef KPT_CODEGEN_HIP_SOURCE_H
#define KPT_CODEGEN_HIP_SOURCE_H

#include <kpt/status.h>

#include "codegen/emit_c.h"
#include "compiler/plan_tiles.h"

#define KPT_HIP_ATTENTION_ENTRY "kpt_attention"
#define KPT_HIP_BLOCKMAP_ENTRY "kpt_blockmap"

/* Returns malloc'ed source in *out (caller frees); d is the target's dialect (kpt_dialect_hip). */
kpt_status kpt_hip_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                          const kpt_c_dialect *d, char **out, kpt_diag *diag);

#endif
