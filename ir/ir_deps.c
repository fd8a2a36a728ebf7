/* Per-node facts derived in one forward sweep (operands precede users): which variables a node
 * depends on, and which nodes are reachable from a set of roots. */
#include <string.h>

#include "ir/ir.h"

void kpt_ir_deps(const kpt_ir_graph *g, uint16_t *deps)
{
    if (g->count)
        deps[0] = 0;
    for (kpt_ir_ref r = 1; r < g->count; r++) {
        const kpt_ir_node *n = &g->nodes[r];
        uint16_t d = 0;
        switch ((kpt_ir_op)n->op) {
        case KPT_IR_S: d = KPT_DEP_S; break;
        case KPT_IR_B: d = KPT_DEP_B; break;
        case KPT_IR_H: d = KPT_DEP_H; break;
        case KPT_IR_Q: d = KPT_DEP_Q; break;
        case KPT_IR_K: d = KPT_DEP_K; break;
        case KPT_IR_SQ: d = KPT_DEP_SQ; break;
        case KPT_IR_SKV: d = KPT_DEP_SKV; break;
        case KPT_IR_HQ: d = KPT_DEP_HQ; break;
        case KPT_IR_SCALAR: d = KPT_DEP_SCALAR; break;
        case KPT_IR_LOAD: d = KPT_DEP_AUX; break;
        default: break;
        }
        for (int i = 0; i < n->nargs; i++)
            d |= deps[n->arg[i]];
        deps[r] = d;
    }
}

void kpt_ir_mark_live(const kpt_ir_graph *g, const kpt_ir_ref *roots, int nroots, uint8_t *live)
{
    if (!g->count)
        return;
    memset(live, 0, g->count);
    for (int i = 0; i < nroots; i++)
        if (roots[i] && roots[i] < g->count)
            live[roots[i]] = 1;
    /* users follow operands, so one backward sweep propagates liveness */
    for (kpt_ir_ref r = g->count - 1; r >= 1; r--) {
        if (!live[r])
            continue;
        const kpt_ir_node *n = &g->nodes[r];
        for (int i = 0; i < n->nargs; i++)
            live[n->arg[i]] = 1;
    }
}
