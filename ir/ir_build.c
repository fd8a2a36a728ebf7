/* The hash-consing builder.
 *
 * Nodes are interned in an open-addressing table keyed on (op, type, immediate, operands), so a
 * structurally equal node is built once. Commutative operands are put in ref order first, making
 * a+b and b+a the same node. Each new node is typed by kpt_ir_result_type; an ill-typed request
 * records the first error in the graph and returns 0, and every call after a failure returns 0
 * (a sticky flag, so callers check once at the end).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

void kpt_ir_graph_init(kpt_ir_graph *g)
{
    memset(g, 0, sizeof(*g));
}

void kpt_ir_graph_free(kpt_ir_graph *g)
{
    free(g->nodes);
    free(g->table);
    kpt_ir_graph_init(g);
}

void kpt_ir_fail(kpt_ir_graph *g, const char *fmt, ...)
{
    if (g->failed)
        return;
    g->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof(g->error), fmt, ap);
    va_end(ap);
}

static uint32_t hash_node(const kpt_ir_node *n)
{
    /* FNV-1a over the fields that define a node; only used in-process for interning. */
    uint32_t h = 2166136261u;
    uint32_t words[2 + KPT_IR_MAX_ARGS] = {
        (uint32_t)n->op | (uint32_t)n->type << 8 | (uint32_t)n->nargs << 16, n->imm.bits};
    for (int i = 0; i < KPT_IR_MAX_ARGS; i++)
        words[2 + i] = n->arg[i];
    for (int i = 0; i < 2 + KPT_IR_MAX_ARGS; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (words[i] >> (8 * b)) & 0xff;
            h *= 16777619u;
        }
    return h;
}

static bool same(const kpt_ir_node *a, const kpt_ir_node *b)
{
    return a->op == b->op && a->type == b->type && a->nargs == b->nargs &&
           a->imm.bits == b->imm.bits && memcmp(a->arg, b->arg, sizeof(a->arg)) == 0;
}

kpt_ir_ref kpt_ir_find(const kpt_ir_graph *g, const kpt_ir_node *n)
{
    if (!g->table_cap)
        return 0;
    uint32_t mask = g->table_cap - 1;
    for (uint32_t i = hash_node(n) & mask;; i = (i + 1) & mask) {
        uint32_t r = g->table[i];
        if (r == 0)
            return 0;
        if (same(&g->nodes[r], n))
            return r;
    }
}

static bool grow_table(kpt_ir_graph *g)
{
    uint32_t cap = g->table_cap ? g->table_cap * 2 : 64;
    uint32_t *t = calloc(cap, sizeof(*t));
    if (!t)
        return false;
    for (kpt_ir_ref r = 1; r < g->count; r++) {
        uint32_t i = hash_node(&g->nodes[r]) & (cap - 1);
        while (t[i])
            i = (i + 1) & (cap - 1);
        t[i] = r;
    }
    free(g->table);
    g->table = t;
    g->table_cap = cap;
    return true;
}

static kpt_ir_ref intern(kpt_ir_graph *g, const kpt_ir_node *n)
{
    kpt_ir_ref found = kpt_ir_find(g, n);
    if (found)
        return found;
    uint32_t limit = g->max_nodes ? g->max_nodes : KPT_IR_DEFAULT_MAX_NODES;
    if (g->count >= limit) {
        g->over_limit = !g->failed;
        kpt_ir_fail(g, "expression too large (more than %u nodes)", limit);
        return 0;
    }
    if (g->count == 0)
        g->count = 1; /* reserve nodes[0] */
    if (g->count + 1 > g->cap) {
        uint32_t cap = g->cap ? g->cap * 2 : 64;
        kpt_ir_node *nodes = realloc(g->nodes, cap * sizeof(*nodes));
        if (!nodes)
            goto oom;
        if (g->cap == 0)
            memset(&nodes[0], 0, sizeof(nodes[0]));
        g->nodes = nodes;
        g->cap = cap;
    }
    /* keep the table at most half full */
    if ((g->count + 1) * 2 > g->table_cap && !grow_table(g))
        goto oom;
    kpt_ir_ref r = g->count++;
    g->nodes[r] = *n;
    uint32_t mask = g->table_cap - 1;
    uint32_t i = hash_node(n) & mask;
    while (g->table[i])
        i = (i + 1) & mask;
    g->table[i] = r;
    return r;
oom:
    g->out_of_memory = true;
    kpt_ir_fail(g, "out of memory");
    return 0;
}

kpt_ir_ref kpt_ir_build(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_type type, uint32_t imm_bits,
                        int nargs, const kpt_ir_ref *args)
{
    if (g->failed)
        return 0;
    if ((unsigned)op >= KPT_IR_OP_COUNT || nargs < 0 || nargs > KPT_IR_MAX_ARGS) {
        kpt_ir_fail(g, "internal: bad op %d with %d operands", (int)op, nargs);
        return 0;
    }
    kpt_ir_node n;
    memset(&n, 0, sizeof(n));
    n.op = (uint8_t)op;
    n.nargs = (uint8_t)nargs;
    n.imm.bits = imm_bits;
    kpt_ir_type at[KPT_IR_MAX_ARGS] = {0};
    for (int i = 0; i < nargs; i++) {
        if (args[i] == 0 || args[i] >= g->count) {
            kpt_ir_fail(g, "internal: '%s' operand %d is not a node", kpt_ir_op_name(op), i + 1);
            return 0;
        }
        n.arg[i] = args[i];
        at[i] = (kpt_ir_type)g->nodes[args[i]].type;
    }
    if ((kpt_ir_op_table[op].flags & KPT_IR_COMMUTATIVE) && n.arg[0] > n.arg[1]) {
        kpt_ir_ref t = n.arg[0];
        n.arg[0] = n.arg[1];
        n.arg[1] = t;
    }
    char msg[160];
    kpt_ir_type rt;
    switch (kpt_ir_op_table[op].rule) {
    case RULE_IMM:
        if (op == KPT_IR_CONST ? type == KPT_IR_VOID || type > KPT_IR_BOOL
                               : type != KPT_IR_I32 && type != KPT_IR_F32) {
            kpt_ir_fail(g, "'%s' cannot have type %s", kpt_ir_op_name(op), kpt_ir_type_name(type));
            return 0;
        }
        if (op == KPT_IR_CONST && type == KPT_IR_BOOL)
            n.imm.bits = imm_bits != 0;
        rt = type;
        break;
    case RULE_LOAD:
        /* the rules check arity and index types; the element type comes from the aux table */
        msg[0] = 0;
        kpt_ir_result_type(op, nargs, at, msg, sizeof(msg));
        if (msg[0]) {
            kpt_ir_fail(g, "type error: %s", msg);
            return 0;
        }
        if (!g->aux_types || imm_bits >= g->num_aux) {
            kpt_ir_fail(g, "'load' of unknown aux tensor %u", imm_bits);
            return 0;
        }
        rt = (kpt_ir_type)g->aux_types[imm_bits];
        break;
    default:
        msg[0] = 0;
        rt = kpt_ir_result_type(op, nargs, at, msg, sizeof(msg));
        if (rt == KPT_IR_VOID) {
            kpt_ir_fail(g, "type error: %s", msg);
            return 0;
        }
    }
    n.type = (uint8_t)rt;
    return intern(g, &n);
}

kpt_ir_ref kpt_ir_const_i32(kpt_ir_graph *g, int32_t v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return kpt_ir_build(g, KPT_IR_CONST, KPT_IR_I32, bits, 0, NULL);
}

kpt_ir_ref kpt_ir_const_f32(kpt_ir_graph *g, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return kpt_ir_build(g, KPT_IR_CONST, KPT_IR_F32, bits, 0, NULL);
}

kpt_ir_ref kpt_ir_const_bool(kpt_ir_graph *g, bool v)
{
    return kpt_ir_build(g, KPT_IR_CONST, KPT_IR_BOOL, v ? 1 : 0, 0, NULL);
}

kpt_ir_ref kpt_ir_var(kpt_ir_graph *g, kpt_ir_op var)
{
    kpt_ir_rule rule = (unsigned)var < KPT_IR_OP_COUNT ? kpt_ir_op_table[var].rule : RULE_IMM;
    if (rule != RULE_VAR_F32 && rule != RULE_VAR_I32) {
        kpt_ir_fail(g, "internal: '%s' is not a variable", kpt_ir_op_name(var));
        return 0;
    }
    return kpt_ir_build(g, var, KPT_IR_VOID, 0, 0, NULL);
}

kpt_ir_ref kpt_ir_scalar(kpt_ir_graph *g, uint32_t index, kpt_ir_type type)
{
    return kpt_ir_build(g, KPT_IR_SCALAR, type, index, 0, NULL);
}

kpt_ir_ref kpt_ir_load(kpt_ir_graph *g, uint32_t index, int nidx, const kpt_ir_ref *idx)
{
    return kpt_ir_build(g, KPT_IR_LOAD, KPT_IR_VOID, index, nidx, idx);
}

kpt_ir_ref kpt_ir_unop(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_ref a)
{
    return kpt_ir_build(g, op, KPT_IR_VOID, 0, 1, &a);
}

kpt_ir_ref kpt_ir_binop(kpt_ir_graph *g, kpt_ir_op op, kpt_ir_ref a, kpt_ir_ref b)
{
    kpt_ir_ref args[2] = {a, b};
    return kpt_ir_build(g, op, KPT_IR_VOID, 0, 2, args);
}

kpt_ir_ref kpt_ir_select(kpt_ir_graph *g, kpt_ir_ref c, kpt_ir_ref a, kpt_ir_ref b)
{
    kpt_ir_ref args[3] = {c, a, b};
    return kpt_ir_build(g, KPT_IR_SELECT, KPT_IR_VOID, 0, 3, args);
}
