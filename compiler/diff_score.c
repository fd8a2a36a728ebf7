/* diff_score: symbolic derivatives of the score mod, for the backward pass.
 *
 * The backward needs, per kept pair, dS = dS' * d s'/d s, and for each float aux load L of the
 * score mod, the contribution dS' * d s'/d L to the gradient of the loaded element. Both are
 * forward-mode derivatives of the score expression: one sweep over the score's nodes in
 * topological order with respect to one variable (s, or one load node), building the derivative
 * of each node from its operands' values and derivatives with the chain rule. A derivative of 0
 * is "no node", so constants, integer and boolean nodes, and everything independent of the
 * variable cost nothing. The new nodes share the graph (and by interning, subexpressions) with
 * the score; the pipeline's folding and simplification then tidy them.
 *
 * Conventions where the function has no derivative (they are measure-zero sets, chosen as
 * PyTorch's autograd does so gradients agree with FlexAttention's): abs'(0) = 0, floor, integer
 * conversions and comparisons have derivative 0, min/max send the derivative to the first operand
 * on ties (a <= b for min, a >= b for max), select differentiates the branch taken. Masks are not
 * differentiated: they decide which pairs exist, not their values.
 */
#include <math.h>
#include <stdlib.h>

#include "base/diag.h"
#include "compiler/passes.h"
#include "compiler/pipeline.h"
#include "ir/ir_eval.h"

typedef struct diff_state {
    kpt_ir_graph *g;
    kpt_ir_ref *d; /* d[r]: the derivative of old node r; 0 = zero */
} diff_state;

static kpt_ir_ref cf(kpt_ir_graph *g, float v)
{
    return kpt_ir_const_f32(g, v);
}

static bool const_f32(kpt_ir_graph *g, kpt_ir_ref r, float *v)
{
    const kpt_ir_node *n = kpt_ir_node_get(g, r);
    if (n->op != KPT_IR_CONST || n->type != KPT_IR_F32)
        return false;
    *v = n->imm.f;
    return true;
}

static bool is_one(kpt_ir_graph *g, kpt_ir_ref r)
{
    float v;
    return const_f32(g, r, &v) && v == 1.0f;
}

/* x when m is x * k or k * x with k a constant (its value in *k), else 0. */
static kpt_ir_ref const_factor(kpt_ir_graph *g, kpt_ir_ref m, float *k)
{
    const kpt_ir_node *n = kpt_ir_node_get(g, m);
    if (n->op != KPT_IR_MUL)
        return 0;
    if (const_f32(g, n->arg[0], k))
        return n->arg[1];
    return const_f32(g, n->arg[1], k) ? n->arg[0] : 0;
}

static kpt_ir_ref mul(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b);

/* c * (x * k) as x * (c k), the constants multiplied first (in f32), where c k is a normal
 * number; else 0. */
static kpt_ir_ref mul_consts(kpt_ir_graph *g, float c, kpt_ir_ref m)
{
    float k;
    kpt_ir_ref x = const_factor(g, m, &k);
    if (!x)
        return 0;
    const float ck = c * k;
    if (!isnormal(ck))
        return 0;
    return mul(g, x, cf(g, ck));
}

/* Products and sums where an operand may be zero (0) or one. A constant times a product with a
 * constant factor multiplies the two constants first: softcap's c tanh(s / c) then has the
 * derivative 1 - tanh^2 instead of c ((1 - tanh^2) (1 / c)), two multiplications a pair fewer
 * (c (1 / c) rounds to 1 in f32 here). The derivative's value moves by a rounding at most; the
 * kernels and the reference evaluate the same nodes, so they still agree. */
static kpt_ir_ref mul(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    if (!a || !b)
        return 0;
    if (is_one(g, a))
        return b;
    if (is_one(g, b))
        return a;
    float c;
    kpt_ir_ref folded = 0;
    if (const_f32(g, a, &c))
        folded = mul_consts(g, c, b);
    else if (const_f32(g, b, &c))
        folded = mul_consts(g, c, a);
    return folded ? folded : kpt_ir_binop(g, KPT_IR_MUL, a, b);
}

static kpt_ir_ref add(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    return kpt_ir_binop(g, KPT_IR_ADD, a, b);
}

static kpt_ir_ref neg(kpt_ir_graph *g, kpt_ir_ref a)
{
    return a ? kpt_ir_unop(g, KPT_IR_NEG, a) : 0;
}

static kpt_ir_ref sub(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    if (!b)
        return a;
    if (!a)
        return neg(g, b);
    return kpt_ir_binop(g, KPT_IR_SUB, a, b);
}

/* a / b, computed now when both are constants (softcap's d(s / c) = 1 / c), so that mul's
 * constant factors see a constant. */
static kpt_ir_ref dquot(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    if (!a)
        return 0;
    float x, y;
    if (const_f32(g, a, &x) && const_f32(g, b, &y)) {
        const kpt_ir_value v[3] = {{.f = x}, {.f = y}, {.f = 0}};
        return cf(g, (float)kpt_ir_apply(KPT_IR_DIV, KPT_IR_F32, KPT_IR_F32, v).f);
    }
    return kpt_ir_binop(g, KPT_IR_DIV, a, b);
}

/* select(c, da, db) with zeros spelled as constants where only one side is zero. */
static kpt_ir_ref choose(kpt_ir_graph *g, kpt_ir_ref c, kpt_ir_ref da, kpt_ir_ref db)
{
    if (!da && !db)
        return 0;
    return kpt_ir_select(g, c, da ? da : cf(g, 0.0f), db ? db : cf(g, 0.0f));
}

/* The derivative of node r (an old node, its operands' derivatives known). */
static kpt_ir_ref derive_node(diff_state *st, kpt_ir_ref r)
{
    kpt_ir_graph *g = st->g;
    const kpt_ir_node n = *kpt_ir_node_get(g, r); /* a copy: building may move the array */
    if (n.type != KPT_IR_F32 || n.nargs == 0 || n.op == KPT_IR_LOAD)
        return 0;
    const kpt_ir_ref a = n.arg[0], b = n.arg[1];
    const kpt_ir_ref da = st->d[a], db = n.nargs > 1 ? st->d[b] : 0;
    if (!da && !db && n.op != KPT_IR_SELECT)
        return 0;
    switch ((kpt_ir_op)n.op) {
    case KPT_IR_NEG: return neg(g, da);
    case KPT_IR_ABS: /* sign(a) * da, sign(0) = 0 */
        return choose(g, kpt_ir_binop(g, KPT_IR_LT, cf(g, 0.0f), a), da,
                      choose(g, kpt_ir_binop(g, KPT_IR_LT, a, cf(g, 0.0f)), neg(g, da), 0));
    case KPT_IR_EXP: return mul(g, r, da);
    case KPT_IR_LOG: return dquot(g, da, a);
    case KPT_IR_TANH: /* (1 - t^2) da */
        return mul(g, kpt_ir_binop(g, KPT_IR_SUB, cf(g, 1.0f), kpt_ir_binop(g, KPT_IR_MUL, r, r)),
                   da);
    case KPT_IR_SQRT: return dquot(g, da, kpt_ir_binop(g, KPT_IR_MUL, cf(g, 2.0f), r));
    case KPT_IR_ERF: /* 2 / sqrt(pi) exp(-a^2) da */
        return mul(g, mul(g, cf(g, 1.12837917f),
                          kpt_ir_unop(g, KPT_IR_EXP,
                                      kpt_ir_unop(g, KPT_IR_NEG, kpt_ir_binop(g, KPT_IR_MUL, a, a)))),
                   da);
    case KPT_IR_ADD: return add(g, da, db);
    case KPT_IR_SUB: return sub(g, da, db);
    case KPT_IR_MUL: return add(g, mul(g, da, b), mul(g, a, db));
    case KPT_IR_DIV: /* (da - (a / b) db) / b */
        return dquot(g, sub(g, da, mul(g, r, db)), b);
    case KPT_IR_MOD: /* a - floor(a / b) b */
        return sub(g, da, mul(g, kpt_ir_binop(g, KPT_IR_IDIV, a, b), db));
    case KPT_IR_POW: { /* b a^(b-1) da + a^b log(a) db */
        kpt_ir_ref t = 0;
        if (da) {
            kpt_ir_ref e = kpt_ir_binop(g, KPT_IR_SUB, b, cf(g, 1.0f));
            t = mul(g, mul(g, b, kpt_ir_binop(g, KPT_IR_POW, a, e)), da);
        }
        return add(g, t, db ? mul(g, mul(g, r, kpt_ir_unop(g, KPT_IR_LOG, a)), db) : 0);
    }
    case KPT_IR_MIN: return choose(g, kpt_ir_binop(g, KPT_IR_LE, a, b), da, db);
    case KPT_IR_MAX: return choose(g, kpt_ir_binop(g, KPT_IR_LE, b, a), da, db);
    case KPT_IR_SELECT: return choose(g, a, st->d[b], st->d[n.arg[2]]);
    default: return 0; /* floor, f32 floor division, conversions: piecewise constant */
    }
}

/* d score / d var over the score's nodes (var: the S leaf or one LOAD node). 0 means zero. */
static kpt_ir_ref derive(kpt_pattern *p, kpt_ir_ref var, kpt_diag *diag, kpt_status *st)
{
    uint32_t n = p->g.count;
    uint8_t *live = calloc(n, 1);
    kpt_ir_ref *d = calloc(n, sizeof(*d));
    kpt_ir_ref out = 0;
    if (!live || !d) {
        *st = kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    } else {
        kpt_ir_mark_live(&p->g, &p->score, 1, live);
        diff_state ds = {&p->g, d};
        d[var] = cf(&p->g, 1.0f);
        for (kpt_ir_ref r = 1; r < n && !p->g.failed; r++)
            if (live[r] && r != var)
                d[r] = derive_node(&ds, r);
        out = d[p->score];
    }
    free(live);
    free(d);
    return out;
}

kpt_status kpt_diff_score(kpt_pattern *p, kpt_diag *diag)
{
    p->derived = true;
    p->dscore = 0;
    p->num_dloads = 0;
    if (!p->score)
        return KPT_OK;
    kpt_status st = KPT_OK;
    kpt_ir_ref s = 0;
    kpt_ir_node leaf = {.op = KPT_IR_S, .type = KPT_IR_F32};
    if ((s = kpt_ir_find(&p->g, &leaf)) != 0)
        p->dscore = derive(p, s, diag, &st);
    /* The loads to differentiate are found before any derivative node is built. */
    uint8_t *live = calloc(p->g.count, 1);
    if (!live)
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    kpt_ir_mark_live(&p->g, &p->score, 1, live);
    uint32_t count = p->g.count;
    for (kpt_ir_ref r = 1; r < count && !st && !p->g.failed; r++) {
        const kpt_ir_node *nd = kpt_ir_node_get(&p->g, r);
        if (!live[r] || nd->op != KPT_IR_LOAD || nd->type != KPT_IR_F32)
            continue;
        if (p->num_dloads == KPT_MAX_DLOADS) {
            st = kpt_diag_set(diag, KPT_ERR_LIMIT,
                              "the score mod of '%.80s' reads float aux data at more than %d "
                              "places: too many to differentiate",
                              p->name, KPT_MAX_DLOADS);
            break;
        }
        kpt_ir_ref dr = derive(p, r, diag, &st);
        p->dloads[p->num_dloads++] = (kpt_dload){.load = r, .deriv = dr ? dr : cf(&p->g, 0.0f)};
    }
    free(live);
    if (!st && p->g.failed)
        st = kpt_diag_set(diag, p->g.out_of_memory ? KPT_ERR_NO_MEMORY : KPT_ERR_LIMIT, "%s",
                          p->g.error);
    if (st)
        return st;
    /* Zero derivatives are 0 in the roots; a constant 1 derivative of s is none at all. */
    if (!p->dscore)
        p->dscore = cf(&p->g, 0.0f);
    st = kpt_pipeline_run(p, NULL, diag);
    if (!st && is_one(&p->g, p->dscore))
        p->dscore = 0;
    return st;
}
