/* GLSL 4.50 compute source for a pattern's fused attention kernel and, when the mask reads aux
 * tensors, its block-map kernel (the same text compiled with KPT_ENTRY_SECOND defined), or for
 * its serving kernel (kind paged: KPT_ENTRY_PAGED; the second entry is then the combine of a run
 * split over the keys): the template templates/glsl/attention.comp
 * filled with the plan's constants, one storage buffer and loader per aux tensor, and the
 * pattern's expressions (emit_c.c's GLSL dialect). Byte-identical for the same pattern IR and
 * plan; no user text reaches it.
 *
 * The descriptor set every kernel uses (set 0): bindings 0-5 are Q, K, V, O, LSE and the block
 * map, 6 the geometry block (runtime/vulkan_args.h), 7 the sinks, 8-10 the serving kernel's
 * page table, cu_seqlens_q and kv_lens, 11 its workspace (partial results), 12 + i aux tensor
 * i. */
#ifndef KPT_CODEGEN_GLSL_SOURCE_H
#define KPT_CODEGEN_GLSL_SOURCE_H

#include <kpt/status.h>

#include "codegen/emit_c.h"
#include "compiler/plan_tiles.h"

enum {
    KPT_GLSL_BIND_Q = 0,
    KPT_GLSL_BIND_K,
    KPT_GLSL_BIND_V,
    KPT_GLSL_BIND_O,
    KPT_GLSL_BIND_LSE,
    KPT_GLSL_BIND_BLOCKMAP,
    KPT_GLSL_BIND_GEOMETRY,
    KPT_GLSL_BIND_SINKS, /* f32 [Hq], or a dummy (geometry's so is then KPT_VK_NO_SINK) */
    KPT_GLSL_BIND_PAGE_TABLE, /* the serving kernel's i32 arrays (other kernels: a dummy) */
    KPT_GLSL_BIND_CU_Q,
    KPT_GLSL_BIND_KV_LENS,
    KPT_GLSL_BIND_WORKSPACE, /* f32: a split serving run's partial results (else a dummy) */
    KPT_GLSL_BIND_AUX0,  /* aux tensor i at KPT_GLSL_BIND_AUX0 + i */
};

/* The workgroup size of the block-map kernel (one invocation per tile pair). */
#define KPT_GLSL_BLOCKMAP_GROUP 64

/* Returns malloc'ed source in *out (caller frees); d is the target's dialect (kpt_dialect_glsl). */
kpt_status kpt_glsl_source(const kpt_pattern *p, const kpt_kernel_plan *plan,
                           const kpt_c_dialect *d, char **out, kpt_diag *diag);

#endif
