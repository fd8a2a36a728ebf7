/* opt_fold: constant folding.
 *
 * Walks the live nodes in topological order (kpt_pattern_rewrite); a node whose operands are all
 * CONST is evaluated with kpt_ir_apply, the interpreter's own op semantics, and replaced by a
 * CONST. f32 results are rounded to float, as a kernel would hold them. Leaves, SCALAR and LOAD
 * are never folded.
 */
#include <stdio.h>

#include "compiler/passes.h"
#include "ir/ir_eval.h"

typedef struct fold_state {
    bool progress;
} fold_state;

static kpt_ir_ref fold_node(kpt_ir_graph *g, const kpt_ir_node *old, const kpt_ir_ref *args,
                            void *ctx)
{
    fold_state *st = ctx;
    if (old->nargs == 0 || old->op == KPT_IR_LOAD)
        return kpt_rewrite_copy(g, old, args);
    kpt_ir_value vals[3];
    for (int i = 0; i < old->nargs; i++) {
        const kpt_ir_node *a = kpt_ir_node_get(g, args[i]);
        if (a->op != KPT_IR_CONST)
            return kpt_rewrite_copy(g, old, args);
        vals[i] = kpt_ir_const_value(a);
    }
    kpt_ir_type argtype = kpt_ir_type_of(g, args[0]);
    kpt_ir_value v = kpt_ir_apply((kpt_ir_op)old->op, (kpt_ir_type)old->type, argtype, vals);
    st->progress = true;
    switch ((kpt_ir_type)old->type) {
    case KPT_IR_F32: return kpt_ir_const_f32(g, (float)v.f);
    case KPT_IR_BOOL: return kpt_ir_const_bool(g, v.i != 0);
    default: return kpt_ir_const_i32(g, v.i);
    }
}

kpt_status kpt_opt_fold(kpt_pattern *p, bool *progress, kpt_diag *diag)
{
    fold_state st = {false};
    kpt_status status = kpt_pattern_rewrite(p, fold_node, &st, diag);
    if (status)
        return status;
    *progress = st.progress;
    return KPT_OK;
}
