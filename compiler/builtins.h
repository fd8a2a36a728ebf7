/* The built-in pattern terms (DESIGN §3): the table the parser, kptc and the docs share. Each
 * term builds its mask (AND-ed into the pattern's) and/or rewrites the running score. */
#ifndef KPT_COMPILER_BUILTINS_H
#define KPT_COMPILER_BUILTINS_H

#include "ir/pattern.h"

typedef enum kpt_param_kind {
    KPT_PARAM_INT,   /* i32; constants must be integers >= min */
    KPT_PARAM_FLOAT, /* f32; constants must be > min when min_exclusive, else >= min */
} kpt_param_kind;

typedef struct kpt_param_spec {
    const char *name; /* "W" */
    kpt_param_kind kind;
    double min;
    bool min_exclusive;
} kpt_param_spec;

/* An argument as written: a constant, or a runtime scalar node. `ref` is its IR node, already of
 * the parameter's type. */
typedef struct kpt_term_arg {
    kpt_ir_ref ref;
    bool is_scalar;
    double value; /* the constant, when !is_scalar */
} kpt_term_arg;

typedef struct kpt_build_ctx {
    kpt_pattern *p;
    kpt_ir_ref score; /* the running score: starts as `s` */
    kpt_ir_ref mask;  /* the running mask: 0 until a term adds one */
    char err[200];    /* set by a builder that fails for a reason other than the graph's */
} kpt_build_ctx;

typedef struct kpt_builtin {
    kpt_builtin_info info;
    /* Pattern strings using the term, for the docs and for tests that iterate over the table:
     * with constant arguments, and with every argument a runtime scalar (i32 and f32 scalars
     * reach every target's code this way); the second is NULL for terms without arguments. */
    const char *example, *scalar_example;
    int nparams;
    kpt_param_spec params[2];
    /* false on failure (graph failed, or ctx->err set) */
    bool (*build)(kpt_build_ctx *ctx, const kpt_term_arg *args);
} kpt_builtin;

extern const kpt_builtin kpt_builtins[];
extern const int kpt_num_builtins;

const kpt_builtin *kpt_builtin_find(const char *name, size_t len);

/* AND `m` into ctx->mask. */
void kpt_build_add_mask(kpt_build_ctx *ctx, kpt_ir_ref m);

/* The ALiBi slope of head h for hq heads (the paper's geometric sequence, extended for head
 * counts that are not powers of two by interleaving the next power's slopes), as an f32 IR
 * expression of the variables h and hq. */
kpt_ir_ref kpt_build_alibi_slope(kpt_ir_graph *g);
/* The same slope computed directly, for tests and docs. */
double kpt_alibi_slope(int h, int hq);

#endif
