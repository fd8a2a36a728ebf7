/* Test helpers: random IR expressions and environments. Header-only; each test includes it. */
#ifndef KPT_TESTS_TESTUTIL_H
#define KPT_TESTS_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compiler/analyze_mask.h"
#include "compiler/parse_pattern.h"
#include "compiler/pipeline.h"
#include "ir/ir_eval.h"
#include "ir/pattern.h"
#include "tools/rng.h"

/* A random i32/f32/bool expression over q, k, sq, skv, b, h, hq, s and the pattern's first
 * scalar (if any). `exact_float` keeps f32 arithmetic to operations that are exact on small
 * integers, so folding (which rounds to f32) cannot change comparisons. */
typedef struct gen {
    kpt_rng rng;
    kpt_pattern *p;
    bool exact_float;
    bool affine_only; /* i32: only q, k, constants, +, -, * const, // const */
    bool continuous;  /* no float -> int or float comparisons: rounding cannot flip a branch */
} gen;

static inline int64_t gr(gen *G, int64_t lo, int64_t hi)
{
    return kpt_rng_range(&G->rng, lo, hi);
}

/* A random environment for evaluating such expressions: small positions and lengths, s of
 * magnitude about 3, the given scalars. */
static inline kpt_ir_env gen_env(kpt_rng *rng, const kpt_ir_value *scalars)
{
    kpt_ir_env env = {
        .s = kpt_rng_normal(rng) * 3,
        .b = (int32_t)kpt_rng_range(rng, 0, 3),
        .h = (int32_t)kpt_rng_range(rng, 0, 11),
        .q = (int32_t)kpt_rng_range(rng, 0, 200),
        .k = (int32_t)kpt_rng_range(rng, 0, 200),
        .sq = (int32_t)kpt_rng_range(rng, 1, 201),
        .skv = (int32_t)kpt_rng_range(rng, 1, 201),
        .hq = (int32_t)kpt_rng_range(rng, 1, 12),
        .scalars = scalars,
    };
    return env;
}

static kpt_ir_ref gen_expr(gen *G, kpt_ir_type t, int depth);

static inline kpt_ir_ref gen_i32(gen *G, int depth)
{
    kpt_ir_graph *g = &G->p->g;
    if (depth <= 0 || gr(G, 0, 3) == 0) {
        switch (gr(G, 0, G->affine_only ? 3 : 8)) {
        case 0: case 1: return kpt_ir_var(g, KPT_IR_Q);
        case 2: return kpt_ir_var(g, KPT_IR_K);
        case 3: return kpt_ir_const_i32(g, (int32_t)gr(G, -8, 40));
        case 4: return kpt_ir_var(g, KPT_IR_SQ);
        case 5: return kpt_ir_var(g, KPT_IR_SKV);
        case 6: return kpt_ir_var(g, KPT_IR_B);
        case 7: return kpt_ir_var(g, KPT_IR_H);
        default:
            if (G->p->num_scalars && G->p->scalars[0].type == KPT_IR_I32)
                return kpt_ir_scalar(g, 0, KPT_IR_I32);
            return kpt_ir_var(g, KPT_IR_HQ);
        }
    }
    kpt_ir_ref a = gen_i32(G, depth - 1);
    if (G->affine_only) {
        switch (gr(G, 0, 4)) {
        case 0: return kpt_ir_binop(g, KPT_IR_ADD, a, gen_i32(G, depth - 1));
        case 1: return kpt_ir_binop(g, KPT_IR_SUB, a, gen_i32(G, depth - 1));
        case 2: return kpt_ir_binop(g, KPT_IR_MUL, a, kpt_ir_const_i32(g, (int32_t)gr(G, -3, 3)));
        case 3: {
            int32_t d = (int32_t)gr(G, -9, 9);
            return kpt_ir_binop(g, KPT_IR_IDIV, a, kpt_ir_const_i32(g, d ? d : 4));
        }
        default: return kpt_ir_unop(g, KPT_IR_NEG, a);
        }
    }
    switch (gr(G, 0, 13)) {
    case 12: {
        static const kpt_ir_op bits[] = {KPT_IR_BAND, KPT_IR_BOR, KPT_IR_BXOR};
        return kpt_ir_binop(g, bits[gr(G, 0, 2)], a, gen_i32(G, depth - 1));
    }
    case 13: {
        static const kpt_ir_op shifts[] = {KPT_IR_SHL, KPT_IR_SHR, KPT_IR_SHRU};
        if (gr(G, 0, 3) == 0)
            return kpt_ir_unop(g, KPT_IR_BNOT, a);
        kpt_ir_ref n = gr(G, 0, 1) ? gen_i32(G, depth - 1) /* counts out of 0..31 too */
                                   : kpt_ir_const_i32(g, (int32_t)gr(G, -2, 34));
        return kpt_ir_binop(g, shifts[gr(G, 0, 2)], a, n);
    }
    case 0: return kpt_ir_binop(g, KPT_IR_ADD, a, gen_i32(G, depth - 1));
    case 1: return kpt_ir_binop(g, KPT_IR_SUB, a, gen_i32(G, depth - 1));
    case 2: return kpt_ir_binop(g, KPT_IR_MUL, a, gen_i32(G, depth - 1));
    case 3: return kpt_ir_binop(g, KPT_IR_IDIV, a, gen_i32(G, depth - 1));
    case 4: return kpt_ir_binop(g, KPT_IR_MOD, a, gen_i32(G, depth - 1));
    case 5: return kpt_ir_binop(g, gr(G, 0, 1) ? KPT_IR_MIN : KPT_IR_MAX, a, gen_i32(G, depth - 1));
    case 6: return kpt_ir_unop(g, gr(G, 0, 1) ? KPT_IR_NEG : KPT_IR_ABS, a);
    case 7:
        if (G->continuous)
            return kpt_ir_unop(g, KPT_IR_NEG, a);
        return kpt_ir_unop(g, KPT_IR_TO_I32, gen_expr(G, KPT_IR_F32, depth - 1));
    case 8: return kpt_ir_select(g, gen_expr(G, KPT_IR_BOOL, depth - 1), a, gen_i32(G, depth - 1));
    case 9: return kpt_ir_unop(g, KPT_IR_ILOG2, a);
    default: return kpt_ir_binop(g, KPT_IR_IDIV, a, kpt_ir_const_i32(g, (int32_t)gr(G, -7, 7)));
    }
}

static inline kpt_ir_ref gen_f32(gen *G, int depth)
{
    kpt_ir_graph *g = &G->p->g;
    if (depth <= 0 || gr(G, 0, 3) == 0) {
        switch (gr(G, 0, 2)) {
        case 0: return kpt_ir_var(g, KPT_IR_S);
        case 1: return kpt_ir_const_f32(g, (float)gr(G, -6, 6) * 0.5f);
        default: return kpt_ir_unop(g, KPT_IR_TO_F32, gen_i32(G, depth - 1));
        }
    }
    kpt_ir_ref a = gen_f32(G, depth - 1);
    int choice = (int)gr(G, 0, G->exact_float ? 6 : 12);
    switch (choice) {
    case 0: return kpt_ir_binop(g, KPT_IR_ADD, a, gen_f32(G, depth - 1));
    case 1: return kpt_ir_binop(g, KPT_IR_SUB, a, gen_f32(G, depth - 1));
    case 2: return kpt_ir_binop(g, KPT_IR_MUL, a, gen_f32(G, depth - 1));
    case 3: return kpt_ir_unop(g, gr(G, 0, 1) ? KPT_IR_NEG : KPT_IR_ABS, a);
    case 4: return kpt_ir_unop(g, G->continuous ? KPT_IR_NEG : KPT_IR_FLOOR, a);
    case 5: return kpt_ir_binop(g, gr(G, 0, 1) ? KPT_IR_MIN : KPT_IR_MAX, a, gen_f32(G, depth - 1));
    case 6: return kpt_ir_select(g, gen_expr(G, KPT_IR_BOOL, depth - 1), a, gen_f32(G, depth - 1));
    case 7: return kpt_ir_unop(g, KPT_IR_TANH, a);
    case 8: return kpt_ir_binop(g, KPT_IR_DIV, a, gen_f32(G, depth - 1));
    case 9: return kpt_ir_unop(g, KPT_IR_EXP, kpt_ir_unop(g, KPT_IR_TANH, a));
    case 10:
    case 11:
        if (G->continuous)
            return kpt_ir_binop(g, KPT_IR_MUL, a, gen_f32(G, depth - 1));
        return kpt_ir_binop(g, choice == 10 ? KPT_IR_IDIV : KPT_IR_MOD, a, gen_f32(G, depth - 1));
    default:
        if (gr(G, 0, 1))
            return kpt_ir_unop(g, KPT_IR_ERF, a);
        return kpt_ir_unop(g, KPT_IR_SQRT, kpt_ir_unop(g, KPT_IR_ABS, a));
    }
}

static inline kpt_ir_ref gen_bool(gen *G, int depth)
{
    kpt_ir_graph *g = &G->p->g;
    static const kpt_ir_op cmps[] = {KPT_IR_LT, KPT_IR_LE, KPT_IR_GT,
                                     KPT_IR_GE, KPT_IR_EQ, KPT_IR_NE};
    if (depth <= 0 || gr(G, 0, 2) == 0) {
        if (gr(G, 0, 12) == 0)
            return kpt_ir_const_bool(g, gr(G, 0, 1));
        kpt_ir_op op = cmps[gr(G, 0, 5)];
        if (!G->affine_only && !G->continuous && gr(G, 0, 4) == 0)
            return kpt_ir_binop(g, op, gen_f32(G, depth - 1), gen_f32(G, depth - 1));
        return kpt_ir_binop(g, op, gen_i32(G, depth), gen_i32(G, depth));
    }
    switch (gr(G, 0, 5)) {
    case 0: case 1: return kpt_ir_binop(g, KPT_IR_AND, gen_bool(G, depth - 1), gen_bool(G, depth - 1));
    case 2: case 3: return kpt_ir_binop(g, KPT_IR_OR, gen_bool(G, depth - 1), gen_bool(G, depth - 1));
    case 4: return kpt_ir_unop(g, KPT_IR_NOT, gen_bool(G, depth - 1));
    default:
        return kpt_ir_binop(g, gr(G, 0, 1) ? KPT_IR_EQ : KPT_IR_NE, gen_bool(G, depth - 1),
                            gen_bool(G, depth - 1));
    }
}

static kpt_ir_ref gen_expr(gen *G, kpt_ir_type t, int depth)
{
    return t == KPT_IR_I32 ? gen_i32(G, depth) : t == KPT_IR_F32 ? gen_f32(G, depth)
                                                                  : gen_bool(G, depth);
}

/* Values compare equal: bool/i32 exactly, f32 within rel_tol, NaN == NaN, inf == inf. */
static inline bool value_close(kpt_ir_type t, kpt_ir_value a, kpt_ir_value b, double rel_tol)
{
    if (t != KPT_IR_F32)
        return a.i == b.i;
    if (isnan(a.f) || isnan(b.f))
        return isnan(a.f) && isnan(b.f);
    if (isinf(a.f) || isinf(b.f))
        return a.f == b.f || fabs(a.f - b.f) <= rel_tol * fmax(fabs(a.f), fabs(b.f));
    return fabs(a.f - b.f) <= rel_tol * fmax(1.0, fmax(fabs(a.f), fabs(b.f)));
}

#endif
