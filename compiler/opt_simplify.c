/* opt_simplify: algebraic simplification.
 *
 * Each rule is an identity that holds for every input under the IR's semantics, NaN, infinities
 * and signed zeros included; rules that hold only for integers say so. A rule looks at the node's
 * operands in the new graph and either returns an existing node or builds a simpler one; anything
 * else is copied. Rules never loosen a mask: they are exact rewrites.
 *
 *   x + 0, x - 0, x * 1, x // 1 (i32)       -> x          x * 0, x % 1, x - x (i32) -> 0
 *   f32: x * 1, x / 1, x - 0, x + -0.0     -> x
 *   neg(neg x), not(not x)                  -> x
 *   min(x, x), max(x, x), x & x, x | x      -> x
 *   x & true, x | false                     -> x          x & false -> false, x | true -> true
 *   x & ~x -> false, x | ~x -> true (also for complementary integer comparisons)
 *   select(true, a, b) -> a, select(false, a, b) -> b, select(c, a, a) -> a,
 *   select(~c, a, b) -> select(c, b, a)
 *   a > b -> b < a, a >= b -> b <= a        (exact for f32 too: both are false on NaN)
 *   i32/bool: x == x -> true, x != x, x < x -> false, x <= x -> true,
 *             ~(a < b) -> b <= a, ~(a <= b) -> b < a, ~(a == b) -> a != b, ~(a != b) -> a == b
 *   i32: (x + c1) + c2 -> x + (c1 + c2)     (wrap-around addition is associative)
 */
#include <string.h>

#include "compiler/passes.h"

typedef struct simp_state {
    bool progress;
} simp_state;

static const kpt_ir_node *N(kpt_ir_graph *g, kpt_ir_ref r)
{
    return kpt_ir_node_get(g, r);
}

static bool is_const_i(kpt_ir_graph *g, kpt_ir_ref r, int32_t v)
{
    const kpt_ir_node *n = N(g, r);
    return n->op == KPT_IR_CONST && n->type != KPT_IR_F32 && n->imm.i == v;
}

static bool is_const_f_bits(kpt_ir_graph *g, kpt_ir_ref r, float v)
{
    const kpt_ir_node *n = N(g, r);
    return n->op == KPT_IR_CONST && n->type == KPT_IR_F32 && memcmp(&n->imm.f, &v, sizeof(v)) == 0;
}

static bool is_not_of(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    const kpt_ir_node *n = N(g, a);
    return n->op == KPT_IR_NOT && n->arg[0] == b;
}

/* Whether a and b are each other's negation: not(b), or integer comparisons that are exact
 * complements (a < b vs b <= a, a == b vs a != b), which is how opt_simplify leaves negations. */
static bool complementary(kpt_ir_graph *g, kpt_ir_ref a, kpt_ir_ref b)
{
    if (is_not_of(g, a, b) || is_not_of(g, b, a))
        return true;
    const kpt_ir_node *x = N(g, a), *y = N(g, b);
    if (x->nargs != 2 || y->nargs != 2 || kpt_ir_type_of(g, x->arg[0]) == KPT_IR_F32 ||
        kpt_ir_type_of(g, y->arg[0]) == KPT_IR_F32)
        return false;
    bool swapped = x->arg[0] == y->arg[1] && x->arg[1] == y->arg[0];
    bool same_args = x->arg[0] == y->arg[0] && x->arg[1] == y->arg[1];
    if (((x->op == KPT_IR_LT && y->op == KPT_IR_LE) || (x->op == KPT_IR_LE && y->op == KPT_IR_LT)))
        return swapped;
    if ((x->op == KPT_IR_EQ && y->op == KPT_IR_NE) || (x->op == KPT_IR_NE && y->op == KPT_IR_EQ))
        return same_args;
    return false;
}

/* Returns the simplified node, or 0 when no rule applies. */
static kpt_ir_ref simplify(kpt_ir_graph *g, const kpt_ir_node *old, const kpt_ir_ref *a)
{
    kpt_ir_type t = (kpt_ir_type)old->type;
    kpt_ir_type at = old->nargs ? kpt_ir_type_of(g, a[0]) : KPT_IR_VOID;
    bool ints = at == KPT_IR_I32 || at == KPT_IR_BOOL; /* no NaN among the operands */
    kpt_ir_ref x = a[0], y = a[1];
    switch ((kpt_ir_op)old->op) {
    case KPT_IR_ADD:
        if (t == KPT_IR_I32) {
            if (is_const_i(g, y, 0)) return x;
            if (is_const_i(g, x, 0)) return y;
            /* (z + c1) + c2 -> z + (c1 + c2) */
            for (int side = 0; side < 2; side++) {
                kpt_ir_ref c2 = side ? x : y, inner = side ? y : x;
                const kpt_ir_node *in = N(g, inner);
                if (N(g, c2)->op != KPT_IR_CONST || in->op != KPT_IR_ADD)
                    continue;
                for (int j = 0; j < 2; j++)
                    if (N(g, in->arg[j])->op == KPT_IR_CONST) {
                        int32_t sum = (int32_t)((uint32_t)N(g, in->arg[j])->imm.i +
                                                (uint32_t)N(g, c2)->imm.i);
                        return kpt_ir_binop(g, KPT_IR_ADD, in->arg[!j], kpt_ir_const_i32(g, sum));
                    }
            }
        } else {
            if (is_const_f_bits(g, y, -0.0f)) return x;
            if (is_const_f_bits(g, x, -0.0f)) return y;
        }
        return 0;
    case KPT_IR_SUB:
        if (t == KPT_IR_I32) {
            if (is_const_i(g, y, 0)) return x;
            if (x == y) return kpt_ir_const_i32(g, 0);
        } else if (is_const_f_bits(g, y, 0.0f)) {
            return x;
        }
        return 0;
    case KPT_IR_MUL:
        if (t == KPT_IR_I32) {
            if (is_const_i(g, y, 1)) return x;
            if (is_const_i(g, x, 1)) return y;
            if (is_const_i(g, x, 0) || is_const_i(g, y, 0)) return kpt_ir_const_i32(g, 0);
        } else {
            if (is_const_f_bits(g, y, 1.0f)) return x;
            if (is_const_f_bits(g, x, 1.0f)) return y;
        }
        return 0;
    case KPT_IR_DIV:
        return is_const_f_bits(g, y, 1.0f) ? x : 0;
    case KPT_IR_IDIV:
        return t == KPT_IR_I32 && is_const_i(g, y, 1) ? x : 0;
    case KPT_IR_MOD:
        return t == KPT_IR_I32 && is_const_i(g, y, 1) ? kpt_ir_const_i32(g, 0) : 0;
    case KPT_IR_NEG:
        return N(g, x)->op == KPT_IR_NEG ? N(g, x)->arg[0] : 0;
    case KPT_IR_NOT:
        if (N(g, x)->op == KPT_IR_NOT)
            return N(g, x)->arg[0];
        break; /* comparison inversion below */
    case KPT_IR_MIN:
    case KPT_IR_MAX:
        return x == y ? x : 0;
    case KPT_IR_AND:
    case KPT_IR_OR: {
        bool is_and = old->op == KPT_IR_AND;
        if (x == y) return x;
        for (int side = 0; side < 2; side++) {
            kpt_ir_ref c = side ? x : y, other = side ? y : x;
            if (is_const_i(g, c, is_and ? 1 : 0)) return other;
            if (is_const_i(g, c, is_and ? 0 : 1)) return c;
        }
        if (complementary(g, x, y)) return kpt_ir_const_bool(g, !is_and);
        return 0;
    }
    case KPT_IR_SELECT: {
        kpt_ir_ref c = a[0];
        if (is_const_i(g, c, 1)) return a[1];
        if (is_const_i(g, c, 0)) return a[2];
        if (a[1] == a[2]) return a[1];
        if (N(g, c)->op == KPT_IR_NOT) return kpt_ir_select(g, N(g, c)->arg[0], a[2], a[1]);
        return 0;
    }
    case KPT_IR_GT: return kpt_ir_binop(g, KPT_IR_LT, y, x);
    case KPT_IR_GE: return kpt_ir_binop(g, KPT_IR_LE, y, x);
    case KPT_IR_LT:
    case KPT_IR_NE:
        return ints && x == y ? kpt_ir_const_bool(g, false) : 0;
    case KPT_IR_LE:
    case KPT_IR_EQ:
        return ints && x == y ? kpt_ir_const_bool(g, true) : 0;
    default: break;
    }
    if (old->op == KPT_IR_NOT) {
        const kpt_ir_node *in = N(g, x);
        bool in_ints = in->nargs == 2 && kpt_ir_type_of(g, in->arg[0]) != KPT_IR_F32;
        if (!in_ints)
            return 0;
        switch ((kpt_ir_op)in->op) {
        case KPT_IR_LT: return kpt_ir_binop(g, KPT_IR_LE, in->arg[1], in->arg[0]);
        case KPT_IR_LE: return kpt_ir_binop(g, KPT_IR_LT, in->arg[1], in->arg[0]);
        case KPT_IR_EQ: return kpt_ir_binop(g, KPT_IR_NE, in->arg[0], in->arg[1]);
        case KPT_IR_NE: return kpt_ir_binop(g, KPT_IR_EQ, in->arg[0], in->arg[1]);
        default: return 0;
        }
    }
    return 0;
}

static kpt_ir_ref simplify_node(kpt_ir_graph *g, const kpt_ir_node *old, const kpt_ir_ref *args,
                                void *ctx)
{
    simp_state *st = ctx;
    kpt_ir_ref r = g->failed ? 0 : simplify(g, old, args);
    if (r) {
        st->progress = true;
        return r;
    }
    return kpt_rewrite_copy(g, old, args);
}

kpt_status kpt_opt_simplify(kpt_pattern *p, bool *progress, kpt_diag *diag)
{
    simp_state st = {false};
    kpt_status status = kpt_pattern_rewrite(p, simplify_node, &st, diag);
    if (status)
        return status;
    *progress = st.progress;
    return KPT_OK;
}
