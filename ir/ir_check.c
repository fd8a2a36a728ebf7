/* Type rules and graph validation.
 *
 * kpt_ir_result_type is the single statement of the typing rules (see kpt_ir_rule): the builder
 * calls it for every node it creates, and kpt_ir_validate re-derives every node's type with it, so
 * a graph edited by a pass cannot drift from the rules unnoticed. Messages name the operation and
 * the operand types: "'add' needs operands of one numeric type, got f32 and bool".
 */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

static bool is_num(kpt_ir_type t)
{
    return t == KPT_IR_I32 || t == KPT_IR_F32;
}

static void describe(char *msg, size_t size, kpt_ir_op op, const char *need, int nargs,
                     const kpt_ir_type *args)
{
    if (!msg || !size)
        return;
    char got[64] = "";
    for (int i = 0; i < nargs; i++) {
        size_t len = strlen(got);
        snprintf(got + len, sizeof(got) - len, "%s%s", i == 0 ? "" : (i == nargs - 1 ? " and " : ", "),
                 kpt_ir_type_name(args[i]));
    }
    snprintf(msg, size, "'%s' needs %s, got %s", kpt_ir_op_name(op), need, got);
}

static bool all_same(int nargs, const kpt_ir_type *args)
{
    for (int i = 1; i < nargs; i++)
        if (args[i] != args[0])
            return false;
    return true;
}

kpt_ir_type kpt_ir_result_type(kpt_ir_op op, int nargs, const kpt_ir_type *args, char *msg,
                               size_t msg_size)
{
    if ((unsigned)op >= KPT_IR_OP_COUNT) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "unknown op %d", (int)op);
        return KPT_IR_VOID;
    }
    const kpt_ir_op_info *info = &kpt_ir_op_table[op];
    if (op != KPT_IR_LOAD && nargs != info->nargs) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "'%s' takes %d operand%s, got %d", info->name, info->nargs,
                     info->nargs == 1 ? "" : "s", nargs);
        return KPT_IR_VOID;
    }
    switch (info->rule) {
    case RULE_VAR_F32: return KPT_IR_F32;
    case RULE_VAR_I32: return KPT_IR_I32;
    case RULE_IMM: return KPT_IR_VOID; /* typed by the builder */
    case RULE_LOAD:
        if (nargs < 1 || nargs > KPT_IR_MAX_ARGS) {
            if (msg && msg_size)
                snprintf(msg, msg_size, "'load' takes 1 to %d indices, got %d", KPT_IR_MAX_ARGS,
                         nargs);
            return KPT_IR_VOID;
        }
        for (int i = 0; i < nargs; i++)
            if (args[i] != KPT_IR_I32) {
                describe(msg, msg_size, op, "i32 indices", nargs, args);
                return KPT_IR_VOID;
            }
        return KPT_IR_VOID; /* typed by the aux tensor */
    case RULE_NUM:
        if (is_num(args[0]) && all_same(nargs, args))
            return args[0];
        describe(msg, msg_size, op,
                 nargs == 1 ? "an i32 or f32 operand" : "operands of one numeric type (i32 or f32)",
                 nargs, args);
        return KPT_IR_VOID;
    case RULE_INT:
        if (args[0] == KPT_IR_I32 && all_same(nargs, args))
            return KPT_IR_I32;
        describe(msg, msg_size, op, nargs == 1 ? "an i32 operand" : "i32 operands", nargs, args);
        return KPT_IR_VOID;
    case RULE_FLOAT:
        if (args[0] == KPT_IR_F32 && all_same(nargs, args))
            return KPT_IR_F32;
        describe(msg, msg_size, op, nargs == 1 ? "an f32 operand" : "f32 operands", nargs, args);
        return KPT_IR_VOID;
    case RULE_BOOL:
        if (args[0] == KPT_IR_BOOL && all_same(nargs, args))
            return KPT_IR_BOOL;
        describe(msg, msg_size, op, nargs == 1 ? "a bool operand" : "bool operands", nargs, args);
        return KPT_IR_VOID;
    case RULE_ORDER:
        if (is_num(args[0]) && args[1] == args[0])
            return KPT_IR_BOOL;
        describe(msg, msg_size, op, "operands of one numeric type (i32 or f32)", nargs, args);
        return KPT_IR_VOID;
    case RULE_EQUAL:
        if (args[0] != KPT_IR_VOID && args[1] == args[0])
            return KPT_IR_BOOL;
        describe(msg, msg_size, op, "operands of one type", nargs, args);
        return KPT_IR_VOID;
    case RULE_TO_F32:
        if (args[0] == KPT_IR_I32 || args[0] == KPT_IR_BOOL)
            return KPT_IR_F32;
        describe(msg, msg_size, op, "an i32 or bool operand", nargs, args);
        return KPT_IR_VOID;
    case RULE_TO_I32:
        if (args[0] == KPT_IR_F32 || args[0] == KPT_IR_BOOL)
            return KPT_IR_I32;
        describe(msg, msg_size, op, "an f32 or bool operand", nargs, args);
        return KPT_IR_VOID;
    case RULE_SELECT:
        if (args[0] == KPT_IR_BOOL && args[1] != KPT_IR_VOID && args[1] == args[2])
            return args[1];
        describe(msg, msg_size, op, "a bool condition and two values of one type", nargs, args);
        return KPT_IR_VOID;
    }
    return KPT_IR_VOID;
}

static bool fail(char *msg, size_t size, const char *fmt, kpt_ir_ref r, const char *detail)
{
    if (msg && size)
        snprintf(msg, size, fmt, (unsigned)r, detail);
    return false;
}

bool kpt_ir_validate(const kpt_ir_graph *g, char *msg, size_t msg_size)
{
    char why[160];
    if (g->failed)
        return fail(msg, msg_size, "graph failed at node %u: %s", g->count, g->error);
    for (kpt_ir_ref r = 1; r < g->count; r++) {
        const kpt_ir_node *n = &g->nodes[r];
        if (n->op >= KPT_IR_OP_COUNT)
            return fail(msg, msg_size, "%%%u: unknown op%s", r, "");
        if (n->nargs > KPT_IR_MAX_ARGS)
            return fail(msg, msg_size, "%%%u: too many operands%s", r, "");
        kpt_ir_type at[KPT_IR_MAX_ARGS] = {0};
        for (int i = 0; i < KPT_IR_MAX_ARGS; i++) {
            if (i >= n->nargs) {
                if (n->arg[i] != 0)
                    return fail(msg, msg_size, "%%%u: stray operand%s", r, "");
                continue;
            }
            if (n->arg[i] == 0 || n->arg[i] >= r)
                return fail(msg, msg_size, "%%%u: operand does not precede its user%s", r, "");
            at[i] = (kpt_ir_type)g->nodes[n->arg[i]].type;
        }
        const kpt_ir_op_info *info = &kpt_ir_op_table[n->op];
        kpt_ir_type want;
        why[0] = 0;
        if (info->rule == RULE_IMM) {
            want = (n->op == KPT_IR_CONST || n->type == KPT_IR_I32 || n->type == KPT_IR_F32)
                       ? (kpt_ir_type)n->type
                       : KPT_IR_VOID;
            if (want == KPT_IR_VOID)
                snprintf(why, sizeof(why), "'%s' has type %s", info->name,
                         kpt_ir_type_name((kpt_ir_type)n->type));
        } else {
            want = kpt_ir_result_type((kpt_ir_op)n->op, n->nargs, at, why, sizeof(why));
            if (n->op == KPT_IR_LOAD && want == KPT_IR_VOID && !why[0]) {
                if (n->imm.index >= g->num_aux || !g->aux_types)
                    snprintf(why, sizeof(why), "'load' of unknown aux tensor %u", n->imm.index);
                else
                    want = (kpt_ir_type)g->aux_types[n->imm.index];
            }
        }
        if (want == KPT_IR_VOID)
            return fail(msg, msg_size, "%%%u: %s", r, why);
        if (want != n->type)
            return fail(msg, msg_size, "%%%u: recorded type disagrees with the rules%s", r, "");
        if (n->op == KPT_IR_CONST && n->type == KPT_IR_BOOL && (n->imm.bits > 1))
            return fail(msg, msg_size, "%%%u: bool constant is neither 0 nor 1%s", r, "");
        if (info->flags & KPT_IR_COMMUTATIVE && n->arg[0] > n->arg[1])
            return fail(msg, msg_size, "%%%u: commutative operands out of order%s", r, "");
    }
    /* Interning: the hash table must lead every node to itself, so no two nodes are equal. */
    for (kpt_ir_ref r = 1; r < g->count; r++)
        if (kpt_ir_find(g, &g->nodes[r]) != r)
            return fail(msg, msg_size, "%%%u: duplicate or unindexed node (interning broken)%s", r,
                        "");
    return true;
}
