/* analyze_range: interval arithmetic over the f32 nodes of an expression.
 *
 * The backward kernels multiply dS' by the score mod's derivative d s'/d s for every pair of a
 * tile, dropped pairs included (their P is 0). Where the derivative can be infinite or NaN at a
 * finite score (1/s, sqrt, log) 0 * inf would poison dS, so the kernels select 0 for dropped
 * pairs, two instructions a pair; where it is bounded (softcap's 1 - tanh^2) that guard can go.
 * This analysis decides which, from the expression alone.
 *
 * One sweep in topological order gives each node a range [lo, hi] (in double) and a flag that it
 * may be NaN. s is [-inf, inf] and never NaN: a NaN score comes from a NaN input, whose rows are
 * NaN anyway. Integer and boolean nodes are finite (their range is i32's, which to_f32 keeps);
 * float scalars and float aux loads can be anything. Each f32 result is widened outward by a
 * relative 2^-8 and saturates to infinity past half of FLT_MAX, which covers the f32 rounding of
 * every step and the kernels' approximate exp, tanh and erf. Ops without a rule here (pow, mod,
 * floor division of floats) are [-inf, inf] and may be NaN: the answer stays sound, only less
 * useful.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "compiler/analyze_range.h"

static const kpt_range ANY = {-INFINITY, INFINITY, true};

/* r widened outward for rounding and approximation, saturating to +-inf */
static kpt_range settle(kpt_range r)
{
    if (isnan(r.lo) || isnan(r.hi))
        return ANY;
    const double widen = 1.0 / 256, big = FLT_MAX / 2;
    r.lo -= fabs(r.lo) * widen;
    r.hi += fabs(r.hi) * widen;
    if (r.lo < -big)
        r.lo = -INFINITY;
    if (r.hi > big)
        r.hi = INFINITY;
    return r;
}

static bool has_inf(kpt_range a)
{
    return isinf(a.lo) || isinf(a.hi);
}

static bool has_zero(kpt_range a)
{
    return a.lo <= 0 && a.hi >= 0;
}

/* The hull of f over the four corners; NaN at a corner (inf - inf, 0 * inf) makes it ANY. */
static kpt_range corners(double (*f)(double, double), kpt_range a, kpt_range b)
{
    const double v[4] = {f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)};
    kpt_range r = {v[0], v[0], a.nan || b.nan};
    for (int i = 0; i < 4; i++) {
        if (isnan(v[i]))
            return ANY;
        r.lo = fmin(r.lo, v[i]);
        r.hi = fmax(r.hi, v[i]);
    }
    return r;
}

static double add(double x, double y) { return x + y; }
static double mul(double x, double y) { return x * y; }
static double quo(double x, double y) { return x / y; }

static kpt_range monotone(double (*f)(double), kpt_range a)
{
    return (kpt_range){f(a.lo), f(a.hi), a.nan};
}

static kpt_range unary(kpt_ir_op op, kpt_range a)
{
    switch (op) {
    case KPT_IR_NEG: return (kpt_range){-a.hi, -a.lo, a.nan};
    case KPT_IR_ABS:
        return (kpt_range){has_zero(a) ? 0 : fmin(fabs(a.lo), fabs(a.hi)),
                           fmax(fabs(a.lo), fabs(a.hi)), a.nan};
    case KPT_IR_EXP: return monotone(exp, a);
    case KPT_IR_TANH: return monotone(tanh, a);
    case KPT_IR_ERF: return monotone(erf, a);
    case KPT_IR_FLOOR: return monotone(floor, a);
    case KPT_IR_SQRT:
        return a.lo < 0 ? (kpt_range){0, sqrt(fmax(a.hi, 0)), true} : monotone(sqrt, a);
    case KPT_IR_LOG:
        return (kpt_range){a.lo <= 0 ? -INFINITY : log(a.lo), a.hi <= 0 ? -INFINITY : log(a.hi),
                           a.nan || a.lo < 0};
    default: return ANY;
    }
}

static kpt_range binary(kpt_ir_op op, kpt_range a, kpt_range b)
{
    const kpt_range nb = {-b.hi, -b.lo, b.nan};
    switch (op) {
    case KPT_IR_ADD: return corners(add, a, b);
    case KPT_IR_SUB: return corners(add, a, nb);
    case KPT_IR_MUL: /* 0 * inf can hide inside the intervals, not only at their corners */
        if ((has_zero(a) && has_inf(b)) || (has_inf(a) && has_zero(b)))
            return ANY;
        return corners(mul, a, b);
    case KPT_IR_DIV: /* the kernels take x * rcp(y), and rcp flushes to 0 past 2^126 */
        if (has_zero(b) || (has_inf(a) && fmax(fabs(b.lo), fabs(b.hi)) >= 0x1p126))
            return ANY;
        return corners(quo, a, b);
    case KPT_IR_MIN:
    case KPT_IR_MAX: { /* with a NaN operand, min and max give the other one */
        kpt_range r = op == KPT_IR_MIN ? (kpt_range){fmin(a.lo, b.lo), fmin(a.hi, b.hi), false}
                                       : (kpt_range){fmax(a.lo, b.lo), fmax(a.hi, b.hi), false};
        if (a.nan || b.nan)
            r = (kpt_range){fmin(r.lo, fmin(a.lo, b.lo)), fmax(r.hi, fmax(a.hi, b.hi)), true};
        return r;
    }
    default: return ANY;
    }
}

/* The range of node r, its operands' ranges in v. */
static kpt_range range_of(const kpt_ir_graph *g, kpt_ir_ref r, const kpt_range *v)
{
    const kpt_ir_node *n = kpt_ir_node_get(g, r);
    if (n->type != KPT_IR_F32) /* i32 and bool, and to_f32 of one (2^31 - 1 rounds up) */
        return (kpt_range){-0x1p31, 0x1p31, false};
    switch ((kpt_ir_op)n->op) {
    case KPT_IR_CONST: return (kpt_range){n->imm.f, n->imm.f, isnan(n->imm.f)};
    case KPT_IR_S: return (kpt_range){-INFINITY, INFINITY, false};
    case KPT_IR_TO_F32: return v[n->arg[0]];
    case KPT_IR_SELECT: {
        const kpt_range a = v[n->arg[1]], b = v[n->arg[2]];
        return (kpt_range){fmin(a.lo, b.lo), fmax(a.hi, b.hi), a.nan || b.nan};
    }
    default: break;
    }
    if (n->nargs == 1)
        return settle(unary((kpt_ir_op)n->op, v[n->arg[0]]));
    if (n->op == KPT_IR_MUL && n->arg[0] == n->arg[1]) { /* a square: never 0 * inf */
        const kpt_range a = v[n->arg[0]];
        const double l2 = a.lo * a.lo, h2 = a.hi * a.hi;
        return settle((kpt_range){has_zero(a) ? 0 : fmin(l2, h2), fmax(l2, h2), a.nan});
    }
    if (n->nargs == 2)
        return settle(binary((kpt_ir_op)n->op, v[n->arg[0]], v[n->arg[1]]));
    return ANY; /* float scalars and loads */
}

bool kpt_analyze_range(const kpt_ir_graph *g, kpt_ir_ref root, kpt_range *out)
{
    *out = ANY;
    if (!root)
        return true;
    kpt_range *v = malloc((size_t)(root + 1) * sizeof(*v));
    if (!v)
        return false;
    for (kpt_ir_ref r = 1; r <= root; r++) /* operands precede their users */
        v[r] = range_of(g, r, v);
    *out = v[root];
    free(v);
    return true;
}

bool kpt_range_finite(const kpt_range *r)
{
    return !r->nan && r->lo >= -FLT_MAX && r->hi <= FLT_MAX;
}
