/* What every planner needs to know of a pattern's score mod and mask (see plan_tiles.h). */
#include <stdlib.h>

#include "base/diag.h"
#include "compiler/analyze_range.h"
#include "compiler/plan_tiles.h"
#include "ir/ir.h"

uint32_t kpt_plan_cone_size(const kpt_ir_graph *g, kpt_ir_ref root, bool *loads)
{
    uint8_t *seen = calloc(g->count, 1);
    if (!seen)
        return UINT32_MAX;
    uint32_t n = 0;
    seen[root] = 1;
    for (kpt_ir_ref r = root; r > 0; r--) { /* operands precede their users */
        if (!seen[r])
            continue;
        const kpt_ir_node *nd = kpt_ir_node_get(g, r);
        n += nd->op != KPT_IR_CONST;
        *loads = *loads || nd->op == KPT_IR_LOAD;
        for (int a = 0; a < nd->nargs; a++)
            seen[nd->arg[a]] = 1;
    }
    free(seen);
    return n;
}

/* What the plan needs to know of the score mod and mask: whether they exist, whether tiles are
 * classified by a block-map kernel (masks that read aux data) and per what. */
/* Unrolled, a partial tile evaluates the mask 64 times over in straight-line code, which lets
 * the compiler share work between elements of one row or column: a win for short arithmetic
 * masks (causal, windows), but for masks that load aux data or run long it multiplies NVRTC's
 * time (document_logical.lua took 3.8 s) for no measurable gain: such masks are rolled. */
kpt_status kpt_plan_mask(const kpt_pattern *p, kpt_kernel_plan *pl, kpt_diag *diag)
{
    pl->has_mask = p->mask != 0;
    pl->has_score = p->score != 0;
    kpt_range dr = {0, 0, false};
    if (p->dscore && !kpt_analyze_range(&p->g, p->dscore, &dr))
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    pl->ds_finite = kpt_range_finite(&dr);
    if (pl->has_mask) {
        uint16_t *deps = calloc(p->g.count, sizeof(*deps));
        if (!deps)
            return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory (planning)");
        kpt_ir_deps(&p->g, deps);
        uint16_t d = deps[p->mask];
        free(deps);
        pl->has_blockmap = (d & KPT_DEP_AUX) != 0;
        pl->mask_loads = pl->has_blockmap;
        pl->bm_per_b = (d & KPT_DEP_B) != 0;
        pl->bm_per_h = (d & KPT_DEP_H) != 0;
        bool loads = false;
        uint32_t n = kpt_plan_cone_size(&p->g, p->mask, &loads);
        pl->mask_rolled = n > KPT_MASK_UNROLL_MAX_NODES || loads;
    }
    return KPT_OK;
}

