/* kpt's expression IR: typed nodes in a hash-consed graph.
 *
 * A graph owns an array of nodes; a node is named by its index (kpt_ir_ref, 0 = none). Operands
 * always precede their users, so index order is a topological order. The builder interns nodes:
 * building a structurally equal node returns the existing one, so common subexpressions are one
 * node for free. The builder checks types as it goes (ir_check.c holds the rules); the first error
 * is kept in the graph (`failed`, `error`) and every later build call returns 0, so front ends check
 * once at the end, not after every call.
 */
#ifndef KPT_IR_IR_H
#define KPT_IR_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir/ir_ops.h"

typedef uint32_t kpt_ir_ref;

/* The most operands a node has: LOAD's indices into a rank-4 aux tensor. */
#define KPT_IR_MAX_ARGS 4

typedef enum kpt_ir_type {
    KPT_IR_VOID = 0, /* no type: only for "no node" */
    KPT_IR_I32,
    KPT_IR_F32,
    KPT_IR_BOOL,
} kpt_ir_type;

enum { KPT_IR_COMMUTATIVE = 1 << 0 };

typedef enum kpt_ir_rule {
    RULE_IMM,     /* CONST, SCALAR: type given by the builder */
    RULE_VAR_F32, /* s */
    RULE_VAR_I32, /* b h q k sq skv hq */
    RULE_LOAD,    /* i32 indices; type from the aux tensor's dtype */
    RULE_NUM,     /* operands i32 or f32, all the same; result that type */
    RULE_INT,     /* i32 operands -> i32 */
    RULE_FLOAT,   /* f32 operands -> f32 */
    RULE_BOOL,    /* bool operands -> bool */
    RULE_ORDER,   /* two numeric operands of one type -> bool */
    RULE_EQUAL,   /* two operands of one type (bool allowed) -> bool */
    RULE_TO_F32,  /* i32 or bool -> f32 */
    RULE_TO_I32,  /* f32 or bool -> i32 */
    RULE_SELECT,  /* bool, T, T -> T */
} kpt_ir_rule;

typedef enum kpt_ir_op {
#define KPT_IR_ENUM(name, text, nargs, rule, flags) KPT_IR_##name,
    KPT_IR_OPS(KPT_IR_ENUM)
#undef KPT_IR_ENUM
    KPT_IR_OP_COUNT
} kpt_ir_op;

typedef struct kpt_ir_op_info {
    const char *name; /* mnemonic, as printed */
    int nargs;
    kpt_ir_rule rule;
    unsigned flags;
} kpt_ir_op_info;

extern const kpt_ir_op_info kpt_ir_op_table[KPT_IR_OP_COUNT];

typedef struct kpt_ir_node {
    uint8_t op;    /* kpt_ir_op */
    uint8_t type;  /* kpt_ir_type */
    uint8_t nargs;
    uint8_t pad;
    union {
        int32_t i;      /* CONST i32 / bool (0 or 1) */
        float f;        /* CONST f32 */
        uint32_t index; /* SCALAR: scalar index; LOAD: aux index */
        uint32_t bits;  /* for hashing and comparison */
    } imm;
    kpt_ir_ref arg[KPT_IR_MAX_ARGS];
} kpt_ir_node;

#define KPT_IR_ERROR_MAX 256

typedef struct kpt_ir_graph {
    kpt_ir_node *nodes; /* nodes[0] is unused, so that ref 0 means "none" */
    uint32_t count;     /* including nodes[0] */
    uint32_t cap;
    uint32_t *table;    /* open-addressing hash of node refs (0 = empty) */
    uint32_t table_cap; /* power of two */
    uint32_t max_nodes; /* limit; 0 = KPT_IR_DEFAULT_MAX_NODES */
    /* The types of LOAD results, by aux index, so the builder can type loads. */
    const uint8_t *aux_types;
    uint32_t num_aux;
    bool failed;
    bool out_of_memory;
    bool over_limit; /* the first error was max_nodes */
    char error[KPT_IR_ERROR_MAX];
} kpt_ir_graph;

#define KPT_IR_DEFAULT_MAX_NODES (1u << 20)

void kpt_ir_graph_init(kpt_ir_graph *g);
void kpt_ir_graph_free(kpt_ir_graph *g);
/* Records the first error (printf-style) and sets `failed`. Later errors are ignored. */
void kpt_ir_fail(kpt_ir_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline const kpt_ir_node *kpt_ir_node_get(const kpt_ir_graph *g, kpt_ir_ref r)
{
    return &g->nodes[r];
}
static inline kpt_ir_type kpt_ir_type_of(const kpt_ir_graph *g, kpt_ir_ref r)
{
    return r ? (kpt_ir_type)g->nodes[r].type : KPT_IR_VOID;
}

const char *kpt_ir_type_name(kpt_ir_type t);
const char *kpt_ir_op_name(kpt_ir_op op);
/* Looks a mnemonic up; returns KPT_IR_OP_COUNT when unknown. */
kpt_ir_op kpt_ir_op_from_name(const char *name, size_t len);

/* Typing: the result type of `op` applied to operands of the given types, or KPT_IR_VOID with a
 * message naming the operation and the types in `msg` (may be NULL). LOAD and the leaves are typed
 * by their builders. One rule table serves the builder and the checker. */
kpt_ir_type kpt_ir_result_type(kpt_ir_op op, int nargs, const kpt_ir_type *args, char *msg,
                               size_t msg_size);

/* --- builder (ir_build.c) ----------------------------------------------------------------- */

kpt_ir_ref kpt_ir_const_i32(kpt_ir_graph *g, int32_t v);
kpt_ir_ref kpt_ir_const_f32(kpt_ir_graph *g, float v);
kpt_ir_ref kpt_ir_const_bool(kpt_ir_graph *g, bool v);
/* A leaf variable: KPT_IR_S, B, H, Q, K, SQ, SKV or HQ. */
kpt_ir_ref kpt_ir_var(kpt_ir_graph *g, kpt_ir_op var);
kpt_ir_ref kpt_ir_scalar(kpt_ir_graph *g, uint32_t index, kpt_ir_type type);
/* aux[index][i0][i1][i2] with 1..3 i32 indices; typed by g->aux_types[index]. */
kpt_ir_ref kpt_ir_load(kpt_ir_graph *g, uint32_t index, int nidx, const kpt_ir_ref *idx);
kpt_ir_ref kpt_ir_unop(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_ref a);
kpt_ir_ref kpt_ir_binop(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_ref a, kpt_ir_ref b);
kpt_ir_ref kpt_ir_select(kpt_ir_graph *g, kpt_ir_ref c, kpt_ir_ref a, kpt_ir_ref b);
/* Generic entry: any op with its operands and immediate (used by the reader and by passes that
 * rebuild nodes). `type` is used only for CONST and SCALAR. */
kpt_ir_ref kpt_ir_build(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_type type, uint32_t imm_bits,
                        int nargs, const kpt_ir_ref *args);

/* The ref of the interned node equal to *n, or 0 if the graph has none. */
kpt_ir_ref kpt_ir_find(const kpt_ir_graph *g, const kpt_ir_node *n);

/* --- checking (ir_check.c) ------------------------------------------------------------------ */

/* Validates the whole graph: operand refs precede users, op and type codes are known, every
 * node's type follows the rules, no two nodes are equal (interning holds). On failure writes a
 * message to `msg` and returns false. */
bool kpt_ir_validate(const kpt_ir_graph *g, char *msg, size_t msg_size);

/* --- analysis helpers (ir_deps.c) ----------------------------------------------------------- */

enum {
    KPT_DEP_S = 1 << 0,
    KPT_DEP_B = 1 << 1,
    KPT_DEP_H = 1 << 2,
    KPT_DEP_Q = 1 << 3,
    KPT_DEP_K = 1 << 4,
    KPT_DEP_SQ = 1 << 5,
    KPT_DEP_SKV = 1 << 6,
    KPT_DEP_HQ = 1 << 7,
    KPT_DEP_SCALAR = 1 << 8,
    KPT_DEP_AUX = 1 << 9,
};
/* deps[r] = the set of variables node r depends on, for every node; `deps` has g->count entries. */
void kpt_ir_deps(const kpt_ir_graph *g, uint16_t *deps);
/* Marks the nodes reachable from the roots (live[r] = 1); `live` has g->count entries. */
void kpt_ir_mark_live(const kpt_ir_graph *g, const kpt_ir_ref *roots, int nroots, uint8_t *live);

#endif
