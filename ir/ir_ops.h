/* The expression IR's op table, defined once.
 *
 * OP(NAME, mnemonic, nargs, rule, flags)
 *   nargs  number of operands; LOAD takes 1..4 (its own check)
 *   rule   the typing rule (enum kpt_ir_rule), shared by the builder and the checker
 *   flags  KPT_IR_COMMUTATIVE: the builder orders operands so a+b and b+a are one node
 *
 * Semantics (ir_eval.c is the executable definition; every backend must agree):
 *   i32 arithmetic wraps (two's complement); IDIV floors and MOD takes the divisor's sign
 *   (Lua's // and %); x // 0 == 0 and x % 0 == 0 for i32; f32 IDIV is floor(a / b) and f32 MOD is
 *   a - floor(a / b) * b. TO_I32 floors an f32 and saturates to the i32 range (NaN gives 0);
 *   ILOG2 is floor(log2(x)) for x > 0 and -1 otherwise. BAND, BOR, BXOR and BNOT act on the
 *   two's-complement bits of i32; SHL, SHRU (logical) and SHR (arithmetic) shift by b in 0..31,
 *   and any other count (negative or >= 32) shifts every bit out: 0, or for SHR of a negative a,
 *   -1. ERF is the error function. f32 values are IEEE floats in kernels and doubles rounded to
 *   float in the interpreter.
 */
#ifndef KPT_IR_OPS_H
#define KPT_IR_OPS_H

#define KPT_IR_OPS(OP)                                              \
    /* leaves */                                                    \
    OP(CONST, "const", 0, RULE_IMM, 0)                              \
    OP(S, "s", 0, RULE_VAR_F32, 0)                                  \
    OP(B, "b", 0, RULE_VAR_I32, 0)                                  \
    OP(H, "h", 0, RULE_VAR_I32, 0)                                  \
    OP(Q, "q", 0, RULE_VAR_I32, 0)                                  \
    OP(K, "k", 0, RULE_VAR_I32, 0)                                  \
    OP(SQ, "sq", 0, RULE_VAR_I32, 0)                                \
    OP(SKV, "skv", 0, RULE_VAR_I32, 0)                              \
    OP(HQ, "hq", 0, RULE_VAR_I32, 0)                                \
    OP(SCALAR, "scalar", 0, RULE_IMM, 0)                            \
    OP(LOAD, "load", 4, RULE_LOAD, 0)                               \
    /* unary */                                                     \
    OP(NEG, "neg", 1, RULE_NUM, 0)                                  \
    OP(ABS, "abs", 1, RULE_NUM, 0)                                  \
    OP(NOT, "not", 1, RULE_BOOL, 0)                                 \
    OP(EXP, "exp", 1, RULE_FLOAT, 0)                                \
    OP(LOG, "log", 1, RULE_FLOAT, 0)                                \
    OP(TANH, "tanh", 1, RULE_FLOAT, 0)                              \
    OP(SQRT, "sqrt", 1, RULE_FLOAT, 0)                              \
    OP(FLOOR, "floor", 1, RULE_FLOAT, 0)                            \
    OP(ILOG2, "ilog2", 1, RULE_INT, 0)                              \
    OP(TO_F32, "to_f32", 1, RULE_TO_F32, 0)                         \
    OP(TO_I32, "to_i32", 1, RULE_TO_I32, 0)                         \
    OP(BNOT, "bnot", 1, RULE_INT, 0)                                \
    OP(ERF, "erf", 1, RULE_FLOAT, 0)                                \
    /* binary */                                                    \
    OP(ADD, "add", 2, RULE_NUM, KPT_IR_COMMUTATIVE)                 \
    OP(SUB, "sub", 2, RULE_NUM, 0)                                  \
    OP(MUL, "mul", 2, RULE_NUM, KPT_IR_COMMUTATIVE)                 \
    OP(DIV, "div", 2, RULE_FLOAT, 0)                                \
    OP(IDIV, "idiv", 2, RULE_NUM, 0)                                \
    OP(MOD, "mod", 2, RULE_NUM, 0)                                  \
    OP(POW, "pow", 2, RULE_FLOAT, 0)                                \
    OP(MIN, "min", 2, RULE_NUM, KPT_IR_COMMUTATIVE)                 \
    OP(MAX, "max", 2, RULE_NUM, KPT_IR_COMMUTATIVE)                 \
    OP(LT, "lt", 2, RULE_ORDER, 0)                                  \
    OP(LE, "le", 2, RULE_ORDER, 0)                                  \
    OP(GT, "gt", 2, RULE_ORDER, 0)                                  \
    OP(GE, "ge", 2, RULE_ORDER, 0)                                  \
    OP(EQ, "eq", 2, RULE_EQUAL, KPT_IR_COMMUTATIVE)                 \
    OP(NE, "ne", 2, RULE_EQUAL, KPT_IR_COMMUTATIVE)                 \
    OP(AND, "and", 2, RULE_BOOL, KPT_IR_COMMUTATIVE)                \
    OP(OR, "or", 2, RULE_BOOL, KPT_IR_COMMUTATIVE)                  \
    OP(BAND, "band", 2, RULE_INT, KPT_IR_COMMUTATIVE)               \
    OP(BOR, "bor", 2, RULE_INT, KPT_IR_COMMUTATIVE)                 \
    OP(BXOR, "bxor", 2, RULE_INT, KPT_IR_COMMUTATIVE)               \
    OP(SHL, "shl", 2, RULE_INT, 0)                                  \
    OP(SHR, "shr", 2, RULE_INT, 0)                                  \
    OP(SHRU, "shru", 2, RULE_INT, 0)                                \
    /* ternary */                                                   \
    OP(SELECT, "select", 3, RULE_SELECT, 0)

#endif
