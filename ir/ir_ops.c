/* The op table expanded from ir_ops.h, and name lookups. */
#include <string.h>

#include "ir/ir.h"

const kpt_ir_op_info kpt_ir_op_table[KPT_IR_OP_COUNT] = {
#define KPT_IR_INFO(name, text, nargs, rule, flags) {text, nargs, rule, flags},
    KPT_IR_OPS(KPT_IR_INFO)
#undef KPT_IR_INFO
};

const char *kpt_ir_op_name(kpt_ir_op op)
{
    return (unsigned)op < KPT_IR_OP_COUNT ? kpt_ir_op_table[op].name : "?";
}

kpt_ir_op kpt_ir_op_from_name(const char *name, size_t len)
{
    for (int op = 0; op < KPT_IR_OP_COUNT; op++) {
        const char *n = kpt_ir_op_table[op].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return (kpt_ir_op)op;
    }
    return KPT_IR_OP_COUNT;
}

const char *kpt_ir_type_name(kpt_ir_type t)
{
    switch (t) {
    case KPT_IR_I32: return "i32";
    case KPT_IR_F32: return "f32";
    case KPT_IR_BOOL: return "bool";
    default: return "void";
    }
}
