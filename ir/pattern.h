/* The compiled form of a pattern: an IR graph with two roots (score, mask) and the declarations
 * of the runtime scalars and aux tensors its SCALAR and LOAD nodes name by index. This is the
 * definition of the public, opaque `struct kpt_pattern`. */
#ifndef KPT_IR_PATTERN_H
#define KPT_IR_PATTERN_H

#include <kpt/pattern.h>

#include "ir/ir.h"

#define KPT_NAME_MAX 32    /* identifiers: scalar and aux names, at most 31 characters */
#define KPT_MAX_SCALARS 32
#define KPT_MAX_AUX 16
#define KPT_MAX_DLOADS 16 /* differentiable aux loads in one score mod (backward kernels) */

typedef struct kpt_scalar_decl {
    char name[KPT_NAME_MAX];
    kpt_ir_type type; /* KPT_IR_I32 or KPT_IR_F32 */
    bool has_default;
    double def;
} kpt_scalar_decl;

/* How `kptc check` fills an aux tensor when no file is given. */
typedef enum kpt_fill_kind {
    KPT_FILL_RANGE,    /* uniform random values in [lo, hi] (integers for i32, 0/1 for bool) */
    KPT_FILL_SEGMENTS, /* sorted ids along the last dimension: segments of random lengths */
    KPT_FILL_SCRIPT,   /* the Lua script's fill function (kpt_lua_fill_aux) */
} kpt_fill_kind;

typedef struct kpt_aux_decl {
    char name[KPT_NAME_MAX];
    kpt_dtype dtype; /* I32, F32, BOOL, F16, BF16 */
    int rank;                       /* 1..KPT_AUX_MAX_RANK */
    int64_t dims[KPT_AUX_MAX_RANK]; /* kpt_dim (<= 0) or a fixed size */
    kpt_fill_kind fill;
    double fill_lo, fill_hi;
} kpt_aux_decl;

_Static_assert(KPT_AUX_MAX_RANK <= KPT_IR_MAX_ARGS, "a load takes one index per dimension");

/* A float aux load of the score mod and the score's derivative with respect to its value: the
 * backward adds dS' * deriv into the gradient of aux[load's index] at the load's indices. */
typedef struct kpt_dload {
    kpt_ir_ref load;  /* a LOAD node of f32 type, live in the score */
    kpt_ir_ref deriv; /* f32: d score / d load */
} kpt_dload;

struct kpt_pattern {
    char *name;       /* normalised source text; owned */
    kpt_ir_graph g;
    kpt_ir_ref score; /* f32 expression of s; 0 = s unchanged */
    kpt_ir_ref mask;  /* bool expression; 0 = keep everything */
    /* Gradient roots, present only on the derived copies kpt_diff_score makes for backward
     * kernels and the reference backward (never printed or read: the IR text of a pattern is
     * its forward definition). */
    bool derived;
    kpt_ir_ref dscore; /* f32: d score / d s; 0 = 1 (no score mod, or one that adds to s) */
    int num_dloads;
    kpt_dload dloads[KPT_MAX_DLOADS];
    int num_scalars;
    kpt_scalar_decl scalars[KPT_MAX_SCALARS];
    int num_aux;
    kpt_aux_decl aux[KPT_MAX_AUX];
    uint8_t aux_types[KPT_MAX_AUX]; /* IR types of the aux tensors; g.aux_types points here */
};

/* A new, empty pattern (no mask, no score mod), or NULL when out of memory. */
kpt_pattern *kpt_pattern_new(const char *name);
/* Replaces the pattern's name (copied). Returns false when out of memory. */
bool kpt_pattern_set_name(kpt_pattern *p, const char *name);

/* The IR type an aux dtype loads as (bool, i32 or f32); KPT_IR_VOID for others. */
kpt_ir_type kpt_aux_ir_type(kpt_dtype dtype);

/* Declares a runtime scalar, or finds the one of that name. Returns its index, or -1 with a
 * message in `err` (type clash, too many, bad name). */
int kpt_pattern_scalar(kpt_pattern *p, const char *name, kpt_ir_type type, bool has_default,
                       double def, char *err, size_t err_size);
/* Index of a scalar / an aux tensor by name, or -1. */
int kpt_pattern_find_scalar(const kpt_pattern *p, const char *name);
int kpt_pattern_find_aux(const kpt_pattern *p, const char *name);
/* Declares an aux tensor (name must be new). Returns its index or -1 with a message. */
int kpt_pattern_add_aux(kpt_pattern *p, const kpt_aux_decl *decl, char *err, size_t err_size);

/* Every root of p, in a fixed order: score, mask, dscore, then each dload's load and deriv (0
 * for absent ones). Returns the count; `roots` has room for KPT_MAX_ROOTS. */
#define KPT_MAX_ROOTS (3 + 2 * KPT_MAX_DLOADS)
int kpt_pattern_roots(const kpt_pattern *p, kpt_ir_ref *roots);

/* A deep copy (graph, declarations, gradient roots), or NULL when out of memory. */
kpt_pattern *kpt_pattern_clone(const kpt_pattern *p);

/* Rewriting: rebuild the live part of the graph into a fresh graph, node by node in topological
 * order. `fn` receives the new graph, the old node and its operands already mapped into the new
 * graph; it returns the replacement (0 with the graph failed on error). Dead nodes disappear;
 * every root (score, mask and the gradient roots) is kept and mapped. */
typedef kpt_ir_ref (*kpt_rewrite_fn)(kpt_ir_graph *ng, const kpt_ir_node *old,
                                     const kpt_ir_ref *args, void *ctx);
/* Rebuilds p through fn. On failure p is unchanged and the status says why: KPT_ERR_NO_MEMORY,
 * KPT_ERR_LIMIT (the rewrite outgrew max_nodes) or KPT_ERR_INTERNAL (fn built a bad node), with
 * the graph's message in diag. */
kpt_status kpt_pattern_rewrite(kpt_pattern *p, kpt_rewrite_fn fn, void *ctx, kpt_diag *diag);
/* The default rewrite: the same node over the new operands. */
kpt_ir_ref kpt_rewrite_copy(kpt_ir_graph *ng, const kpt_ir_node *old, const kpt_ir_ref *args);

/* Checks the graph (kpt_ir_validate) and the pattern around it: roots' types, SCALAR and LOAD
 * nodes against the declarations. On failure writes a message and returns false. */
bool kpt_pattern_validate(const kpt_pattern *p, char *msg, size_t msg_size);

/* Dimension names in IR text: "any", "b", "hq", "hkv", "sq", "skv"; NULL for a fixed size. */
const char *kpt_dim_name(int64_t dim);

/* Text form (ir_print.c / ir_read.c). The printer numbers live nodes densely, so equal patterns
 * print equal text; reading printed text and printing it again gives the same text. */
char *kpt_pattern_print(const kpt_pattern *p); /* malloc'ed; NULL when out of memory */
/* Parses IR text. On error returns NULL and fills diag (line and column). */
kpt_pattern *kpt_pattern_read(const char *text, kpt_diag *diag);

#endif
