/* The IR interpreter: evaluates expressions in double precision with the IR's integer semantics
 * (ir_ops.h). It is the executable definition of what every op means: constant folding calls
 * kpt_ir_apply, and the CPU reference evaluates masks and score mods with kpt_ir_prog_run. */
#ifndef KPT_IR_EVAL_H
#define KPT_IR_EVAL_H

#include <kpt/tensor.h>

#include "ir/ir.h"

typedef union kpt_ir_value {
    double f;  /* f32 values (carried in double) */
    int32_t i; /* i32 values, and bool as 0 or 1 */
} kpt_ir_value;

/* A bound aux tensor: element offsets are sum(index[d] * stride[d]); an index outside
 * [0, shape[d]) reads 0 (false for bool). */
typedef struct kpt_ir_auxview {
    const void *data;
    kpt_dtype dtype;
    int rank;
    int64_t shape[KPT_IR_MAX_ARGS];
    int64_t stride[KPT_IR_MAX_ARGS];
} kpt_ir_auxview;

typedef struct kpt_ir_env {
    double s;
    int32_t b, h, q, k, sq, skv, hq;
    const kpt_ir_value *scalars; /* by scalar index, typed as the SCALAR nodes say */
    const kpt_ir_auxview *aux;   /* by aux index */
} kpt_ir_env;

/* Applies a non-leaf op (not CONST, a variable, SCALAR or LOAD) to operand values.
 * `type` is the result type, `argtype` the first operand's type. */
kpt_ir_value kpt_ir_apply(kpt_ir_op op, kpt_ir_type type, kpt_ir_type argtype,
                          const kpt_ir_value *args);

/* The value of a CONST node. */
kpt_ir_value kpt_ir_const_value(const kpt_ir_node *n);

/* A straight-line program: the nodes reachable from some roots, in topological order. */
typedef struct kpt_ir_prog {
    const kpt_ir_graph *g;
    kpt_ir_ref *order;
    uint32_t len;
} kpt_ir_prog;

/* Returns false when out of memory. Roots equal to 0 are ignored. */
bool kpt_ir_prog_init(kpt_ir_prog *p, const kpt_ir_graph *g, const kpt_ir_ref *roots, int nroots);
void kpt_ir_prog_free(kpt_ir_prog *p);
/* Evaluates every node of the program; values has g->count entries, values[r] is node r's. */
void kpt_ir_prog_run(const kpt_ir_prog *p, const kpt_ir_env *env, kpt_ir_value *values);

/* One-shot evaluation of `root` (allocates; for tests and tools). Returns false when out of
 * memory. */
bool kpt_ir_eval(const kpt_ir_graph *g, kpt_ir_ref root, const kpt_ir_env *env,
                 kpt_ir_value *out);

#endif
