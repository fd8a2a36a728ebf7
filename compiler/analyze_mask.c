/* analyze_mask: tile classification of a mask, exact for affine masks.
 *
 * Algorithm. The mask (a bool IR expression) is first turned into a formula over *atoms*:
 * AND/OR/NOT nodes whose leaves are constants, opaque leaves (anything not understood: aux loads,
 * float comparisons, unknown b/h), and affine atoms `L(q, k) >= 0`, where L is an integer affine
 * combination of q, k and floor-divisions (m*q + a) // d, (m*k + a) // d by constants. Everything
 * that does not depend on q or k (sq, skv, hq, runtime scalars, and b/h when known) is evaluated
 * with the interpreter first, so it is a number by then. Comparisons a < b, a <= b, ... become one
 * atom; a == b becomes two.
 *
 * For one query row q, an atom's set of kept keys is an interval of k (a half-line: L is monotone
 * in k when k appears either plainly or in a single floor-division), so the formula's kept set is
 * a finite union of intervals, computed exactly by interval-set AND/OR/complement. Each formula
 * node carries two sets per row, `must` (surely kept) and `may` (possibly kept); they are equal
 * for understood nodes, and must = {} / may = everything for opaque ones; NOT swaps and
 * complements them. So the result is always sound, and exact when every leaf was understood:
 *
 *   tile empty  <=> for every row, may  ∩ tile = {}
 *   tile full   <=> for every row, must ⊇ tile
 *
 * Sweeping rows costs O(rows x formula size) per tile, with no materialised mask: cost grows with
 * the tile, not the sequence. Linear forms whose coefficients could overflow i32 over the
 * [0, sq) x [0, skv) domain are treated as opaque, so the IR's wrap-around never misleads us.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/analyze_mask.h"

#define MAX_TERMS 2      /* floor-division terms per variable in one linear form */
#define MAX_FNODES 512   /* formula size; larger masks are treated as opaque */
#define MAX_IVALS 8      /* intervals per row set */
#define COEF_LIMIT (1LL << 20)
#define CONST_LIMIT (1LL << 40)

typedef struct fdterm { /* coef * floor((mul * v + add) / div), div > 0 */
    int64_t coef, mul, add, div;
} fdterm;

typedef struct lin {
    int64_t c0, cq, ck;
    int nq, nk;
    fdterm tq[MAX_TERMS], tk[MAX_TERMS];
} lin;

enum fkind { F_CONST, F_OPAQUE, F_ATOM, F_AND, F_OR, F_NOT };

typedef struct fnode {
    uint8_t kind;
    bool value; /* F_CONST */
    int a, b;   /* children (F_AND, F_OR: a, b; F_NOT: a) */
    int atom;   /* F_ATOM: index into atoms */
} fnode;

struct kpt_mask_analysis {
    kpt_mask_env env;
    bool has_mask;
    int root; /* formula node; -1 when the pattern has no mask */
    fnode *f;
    int nf, capf;
    lin *atoms;
    int natoms, capatoms;
    int nopaque, ninexact_atoms;
    bool failed; /* out of memory while building */
    char summary[128];
};

/* ---- building ------------------------------------------------------------------------------- */

typedef struct builder {
    kpt_mask_analysis *a;
    const kpt_pattern *p;
    uint16_t *deps;
    int *memo; /* IR ref -> formula node + 1 */
    uint16_t known;
    kpt_ir_env ienv;
    kpt_ir_value *vals; /* scratch for the interpreter */
    kpt_ir_prog prog;
} builder;

static int add_fnode(builder *bd, fnode n)
{
    kpt_mask_analysis *a = bd->a;
    if (a->nf >= MAX_FNODES)
        return -1;
    if (a->nf == a->capf) {
        int cap = a->capf ? a->capf * 2 : 16;
        fnode *f = realloc(a->f, (size_t)cap * sizeof(*f));
        if (!f) {
            a->failed = true;
            return -1;
        }
        a->f = f;
        a->capf = cap;
    }
    a->f[a->nf] = n;
    return a->nf++;
}

static int mk_const(builder *bd, bool v)
{
    return add_fnode(bd, (fnode){.kind = F_CONST, .value = v});
}

static int mk_opaque(builder *bd)
{
    bd->a->nopaque++;
    return add_fnode(bd, (fnode){.kind = F_OPAQUE});
}

static int mk_op(builder *bd, enum fkind k, int x, int y)
{
    if (x < 0 || (k != F_NOT && y < 0))
        return -1;
    return add_fnode(bd, (fnode){.kind = (uint8_t)k, .a = x, .b = y});
}

static bool in_range(int64_t v, int64_t limit)
{
    return v >= -limit && v <= limit;
}

/* Evaluates a node independent of q and k. */
static kpt_ir_value eval_const(builder *bd, kpt_ir_ref r)
{
    kpt_ir_prog_free(&bd->prog);
    kpt_ir_value v = {0};
    if (!kpt_ir_prog_init(&bd->prog, &bd->p->g, &r, 1)) {
        bd->a->failed = true;
        return v;
    }
    kpt_ir_prog_run(&bd->prog, &bd->ienv, bd->vals);
    return bd->vals[r];
}

static bool is_known(builder *bd, kpt_ir_ref r)
{
    uint16_t d = bd->deps[r];
    return (d & (KPT_DEP_Q | KPT_DEP_K)) == 0 && (d & ~bd->known) == 0;
}

/* The range of a floor-division term over v in [0, n), in 128 bits (coef * u may exceed 64). */
static void term_range(const fdterm *t, int64_t n, __int128 *lo, __int128 *hi)
{
    int64_t x0 = t->add, x1 = t->mul * (n - 1) + t->add; /* |mul| <= 2^20, n <= 2^31 */
    int64_t u0 = x0 >= 0 ? x0 / t->div : -((-x0 + t->div - 1) / t->div);
    int64_t u1 = x1 >= 0 ? x1 / t->div : -((-x1 + t->div - 1) / t->div);
    int64_t umin = u0 < u1 ? u0 : u1, umax = u0 < u1 ? u1 : u0;
    *lo = t->coef >= 0 ? (__int128)t->coef * umin : (__int128)t->coef * umax;
    *hi = t->coef >= 0 ? (__int128)t->coef * umax : (__int128)t->coef * umin;
}

/* Whether the form stays inside i32 over the whole [0, sq) x [0, skv) domain (so the IR's
 * wrap-around cannot differ from exact arithmetic) and its numbers inside our limits, which keep
 * every per-row evaluation (atom_row) inside int64. */
static bool lin_ok(const lin *l, const kpt_mask_env *env)
{
    if (!in_range(l->c0, CONST_LIMIT) || !in_range(l->cq, COEF_LIMIT) ||
        !in_range(l->ck, COEF_LIMIT))
        return false;
    int64_t nq = env->sq > 0 ? env->sq : 1, nk = env->skv > 0 ? env->skv : 1;
    __int128 lo = l->c0, hi = l->c0;
    lo += l->cq < 0 ? (__int128)l->cq * (nq - 1) : 0;
    hi += l->cq > 0 ? (__int128)l->cq * (nq - 1) : 0;
    lo += l->ck < 0 ? (__int128)l->ck * (nk - 1) : 0;
    hi += l->ck > 0 ? (__int128)l->ck * (nk - 1) : 0;
    for (int side = 0; side < 2; side++) {
        int n = side ? l->nk : l->nq;
        const fdterm *t = side ? l->tk : l->tq;
        for (int i = 0; i < n; i++) {
            if (!in_range(t[i].coef, COEF_LIMIT) || !in_range(t[i].mul, COEF_LIMIT) ||
                !in_range(t[i].add, CONST_LIMIT) || t[i].div <= 0 || t[i].div > INT32_MAX)
                return false;
            __int128 tl, th;
            term_range(&t[i], side ? nk : nq, &tl, &th);
            if (tl < -CONST_LIMIT || th > CONST_LIMIT)
                return false;
            lo += tl;
            hi += th;
        }
    }
    return lo >= INT32_MIN && hi <= INT32_MAX;
}

static bool add_term(fdterm *ts, int *n, fdterm t)
{
    for (int i = 0; i < *n; i++)
        if (ts[i].mul == t.mul && ts[i].add == t.add && ts[i].div == t.div) {
            ts[i].coef += t.coef;
            return true;
        }
    if (*n == MAX_TERMS)
        return false;
    ts[(*n)++] = t;
    return true;
}

/* Scales every coefficient by c; false on int64 overflow (then the caller goes opaque). */
static bool lin_scale(lin *l, int64_t c)
{
    bool over = __builtin_mul_overflow(l->c0, c, &l->c0);
    over |= __builtin_mul_overflow(l->cq, c, &l->cq);
    over |= __builtin_mul_overflow(l->ck, c, &l->ck);
    for (int i = 0; i < l->nq; i++)
        over |= __builtin_mul_overflow(l->tq[i].coef, c, &l->tq[i].coef);
    for (int i = 0; i < l->nk; i++)
        over |= __builtin_mul_overflow(l->tk[i].coef, c, &l->tk[i].coef);
    return !over;
}

static bool lin_add(lin *x, const lin *y)
{
    x->c0 += y->c0;
    x->cq += y->cq;
    x->ck += y->ck;
    for (int i = 0; i < y->nq; i++)
        if (!add_term(x->tq, &x->nq, y->tq[i]))
            return false;
    for (int i = 0; i < y->nk; i++)
        if (!add_term(x->tk, &x->nk, y->tk[i]))
            return false;
    return true;
}

static bool lin_is_const(const lin *l)
{
    return l->cq == 0 && l->ck == 0 && l->nq == 0 && l->nk == 0;
}

/* Linear form of an i32 node; false when it is not (then the caller goes opaque). */
static bool linearize(builder *bd, kpt_ir_ref r, lin *out, int depth)
{
    const kpt_ir_graph *g = &bd->p->g;
    const kpt_ir_node *n = kpt_ir_node_get(g, r);
    memset(out, 0, sizeof(*out));
    if (depth > 64 || n->type != KPT_IR_I32)
        return false;
    if (is_known(bd, r)) {
        out->c0 = eval_const(bd, r).i;
        return !bd->a->failed;
    }
    lin x, y;
    switch ((kpt_ir_op)n->op) {
    case KPT_IR_Q: out->cq = 1; break;
    case KPT_IR_K: out->ck = 1; break;
    case KPT_IR_ADD:
    case KPT_IR_SUB:
        if (!linearize(bd, n->arg[0], &x, depth + 1) || !linearize(bd, n->arg[1], &y, depth + 1))
            return false;
        if ((n->op == KPT_IR_SUB && !lin_scale(&y, -1)) || !lin_add(&x, &y))
            return false;
        *out = x;
        break;
    case KPT_IR_NEG:
        if (!linearize(bd, n->arg[0], out, depth + 1) || !lin_scale(out, -1))
            return false;
        break;
    case KPT_IR_MUL:
        if (!linearize(bd, n->arg[0], &x, depth + 1) || !linearize(bd, n->arg[1], &y, depth + 1))
            return false;
        if (lin_is_const(&y)) {
            if (!lin_scale(&x, y.c0))
                return false;
            *out = x;
        } else if (lin_is_const(&x)) {
            if (!lin_scale(&y, x.c0))
                return false;
            *out = y;
        } else {
            return false;
        }
        break;
    case KPT_IR_IDIV: {
        if (!linearize(bd, n->arg[0], &x, depth + 1) || !linearize(bd, n->arg[1], &y, depth + 1))
            return false;
        if (!lin_is_const(&y) || y.c0 == 0 || x.nq || x.nk || (x.cq && x.ck))
            return false; /* numerator: one variable, no nested divisions */
        fdterm t = {1, x.cq ? x.cq : x.ck, x.c0, y.c0};
        if (t.div < 0) { /* floor(v / d) == floor(-v / -d) */
            t.mul = -t.mul;
            t.add = -t.add;
            t.div = -t.div;
        }
        if (x.cq)
            out->tq[out->nq++] = t;
        else
            out->tk[out->nk++] = t;
        break;
    }
    default:
        return false;
    }
    return lin_ok(out, &bd->a->env);
}

static int mk_atom(builder *bd, const lin *l)
{
    kpt_mask_analysis *a = bd->a;
    if (a->natoms == a->capatoms) {
        int cap = a->capatoms ? a->capatoms * 2 : 8;
        lin *at = realloc(a->atoms, (size_t)cap * sizeof(*at));
        if (!at) {
            a->failed = true;
            return -1;
        }
        a->atoms = at;
        a->capatoms = cap;
    }
    if (l->nk > 1 || (l->nk == 1 && l->ck != 0))
        a->ninexact_atoms++; /* k both plain and divided: not an interval per row */
    a->atoms[a->natoms] = *l;
    int i = add_fnode(bd, (fnode){.kind = F_ATOM, .atom = a->natoms});
    if (i >= 0)
        a->natoms++;
    return i;
}

/* Atom for x - y + bias >= 0. */
static int cmp_atom(builder *bd, kpt_ir_ref x, kpt_ir_ref y, int64_t bias)
{
    lin lx, ly;
    if (!linearize(bd, x, &lx, 0) || !linearize(bd, y, &ly, 0))
        return mk_opaque(bd);
    if (!lin_scale(&ly, -1) || !lin_add(&lx, &ly))
        return mk_opaque(bd);
    lx.c0 += bias;
    if (!in_range(lx.c0, CONST_LIMIT))
        return mk_opaque(bd);
    return mk_atom(bd, &lx);
}

static int formula(builder *bd, kpt_ir_ref r, int depth);

static int formula_uncached(builder *bd, kpt_ir_ref r, int depth)
{
    const kpt_ir_node *n = kpt_ir_node_get(&bd->p->g, r);
    if (is_known(bd, r))
        return mk_const(bd, eval_const(bd, r).i != 0);
    kpt_ir_ref x = n->arg[0], y = n->arg[1];
    bool ints = n->nargs >= 2 && kpt_ir_type_of(&bd->p->g, x) == KPT_IR_I32;
    bool bools = n->nargs >= 2 && kpt_ir_type_of(&bd->p->g, x) == KPT_IR_BOOL;
    switch ((kpt_ir_op)n->op) {
    case KPT_IR_AND: return mk_op(bd, F_AND, formula(bd, x, depth + 1), formula(bd, y, depth + 1));
    case KPT_IR_OR: return mk_op(bd, F_OR, formula(bd, x, depth + 1), formula(bd, y, depth + 1));
    case KPT_IR_NOT: return mk_op(bd, F_NOT, formula(bd, x, depth + 1), 0);
    case KPT_IR_SELECT: {
        int c = formula(bd, n->arg[0], depth + 1);
        int t = mk_op(bd, F_AND, c, formula(bd, n->arg[1], depth + 1));
        int e = mk_op(bd, F_AND, mk_op(bd, F_NOT, c, 0), formula(bd, n->arg[2], depth + 1));
        return mk_op(bd, F_OR, t, e);
    }
    case KPT_IR_GE: if (ints) return cmp_atom(bd, x, y, 0); break;
    case KPT_IR_GT: if (ints) return cmp_atom(bd, x, y, -1); break;
    case KPT_IR_LE: if (ints) return cmp_atom(bd, y, x, 0); break;
    case KPT_IR_LT: if (ints) return cmp_atom(bd, y, x, -1); break;
    case KPT_IR_EQ:
    case KPT_IR_NE: {
        int eq;
        if (ints) {
            eq = mk_op(bd, F_AND, cmp_atom(bd, x, y, 0), cmp_atom(bd, y, x, 0));
        } else if (bools) {
            int fx = formula(bd, x, depth + 1), fy = formula(bd, y, depth + 1);
            int both = mk_op(bd, F_AND, fx, fy);
            int none = mk_op(bd, F_AND, mk_op(bd, F_NOT, fx, 0), mk_op(bd, F_NOT, fy, 0));
            eq = mk_op(bd, F_OR, both, none);
        } else {
            break;
        }
        return n->op == KPT_IR_EQ ? eq : mk_op(bd, F_NOT, eq, 0);
    }
    default: break;
    }
    return mk_opaque(bd);
}

static int formula(builder *bd, kpt_ir_ref r, int depth)
{
    if (bd->memo[r])
        return bd->memo[r] - 1;
    int f = depth > 200 ? mk_opaque(bd) : formula_uncached(bd, r, depth);
    if (f < 0)
        return -1;
    bd->memo[r] = f + 1;
    return f;
}

kpt_mask_analysis *kpt_analyze_mask(const kpt_pattern *p, const kpt_mask_env *env)
{
    kpt_mask_analysis *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->env = *env;
    a->root = -1;
    a->has_mask = p->mask != 0;
    if (!a->has_mask) {
        snprintf(a->summary, sizeof(a->summary), "no mask");
        return a;
    }
    builder bd = {.a = a, .p = p};
    uint32_t n = p->g.count;
    bd.deps = calloc(n, sizeof(*bd.deps));
    bd.memo = calloc(n, sizeof(*bd.memo));
    bd.vals = calloc(n, sizeof(*bd.vals));
    if (!bd.deps || !bd.memo || !bd.vals) {
        a->failed = true;
    } else {
        kpt_ir_deps(&p->g, bd.deps);
        bd.known = KPT_DEP_SQ | KPT_DEP_SKV | KPT_DEP_HQ;
        if (env->scalars)
            bd.known |= KPT_DEP_SCALAR;
        if (env->b_known)
            bd.known |= KPT_DEP_B;
        if (env->h_known)
            bd.known |= KPT_DEP_H;
        bd.ienv = (kpt_ir_env){.sq = env->sq, .skv = env->skv, .hq = env->hq, .b = env->b,
                               .h = env->h, .scalars = env->scalars};
        a->root = formula(&bd, p->mask, 0);
        if (a->root < 0 && !a->failed) {
            /* too large to analyse: one opaque leaf keeps us sound */
            a->nf = 0;
            a->natoms = 0;
            a->nopaque = 0;
            a->ninexact_atoms = 0;
            a->root = mk_opaque(&bd);
        }
    }
    kpt_ir_prog_free(&bd.prog);
    free(bd.deps);
    free(bd.memo);
    free(bd.vals);
    if (a->failed || a->root < 0) {
        kpt_mask_analysis_free(&a);
        return NULL;
    }
    snprintf(a->summary, sizeof(a->summary), "%d affine atom%s, %d opaque lea%s: %s",
             a->natoms, a->natoms == 1 ? "" : "s", a->nopaque, a->nopaque == 1 ? "f" : "ves",
             kpt_mask_analysis_exact(a) ? "exact" : "conservative");
    return a;
}

void kpt_mask_analysis_free(kpt_mask_analysis **pa)
{
    if (!pa || !*pa)
        return;
    free((*pa)->f);
    free((*pa)->atoms);
    free(*pa);
    *pa = NULL;
}

bool kpt_mask_analysis_exact(const kpt_mask_analysis *a)
{
    return a->nopaque == 0 && a->ninexact_atoms == 0;
}

const char *kpt_mask_analysis_summary(const kpt_mask_analysis *a)
{
    return a->summary;
}

/* ---- interval sets over one row's key domain [lo, hi] -------------------------------------- */

typedef struct iset {
    int n;
    int64_t lo[MAX_IVALS], hi[MAX_IVALS]; /* sorted, disjoint, inclusive */
} iset;

/* Appends [lo, hi]; on overflow keeps the set an over-approximation (`over`: merge the closest
 * pair) or an under-approximation (drop the smallest interval). Input must be in order. */
static void iset_push(iset *s, int64_t lo, int64_t hi, bool over)
{
    if (lo > hi)
        return;
    if (s->n && lo <= s->hi[s->n - 1] + 1) {
        if (hi > s->hi[s->n - 1])
            s->hi[s->n - 1] = hi;
        return;
    }
    if (s->n == MAX_IVALS) {
        if (over) {
            int best = 0;
            for (int i = 1; i < s->n - 1; i++)
                if (s->lo[i + 1] - s->hi[i] < s->lo[best + 1] - s->hi[best])
                    best = i;
            s->hi[best] = s->hi[best + 1];
            memmove(&s->lo[best + 1], &s->lo[best + 2], (size_t)(s->n - best - 2) * sizeof(int64_t));
            memmove(&s->hi[best + 1], &s->hi[best + 2], (size_t)(s->n - best - 2) * sizeof(int64_t));
            s->n--;
        } else {
            int small = 0;
            for (int i = 1; i < s->n; i++)
                if (s->hi[i] - s->lo[i] < s->hi[small] - s->lo[small])
                    small = i;
            if (hi - lo <= s->hi[small] - s->lo[small])
                return;
            memmove(&s->lo[small], &s->lo[small + 1], (size_t)(s->n - small - 1) * sizeof(int64_t));
            memmove(&s->hi[small], &s->hi[small + 1], (size_t)(s->n - small - 1) * sizeof(int64_t));
            s->n--;
        }
    }
    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->n++;
}

static void iset_all(iset *s, int64_t lo, int64_t hi)
{
    s->n = 0;
    iset_push(s, lo, hi, true);
}

static void iset_and(const iset *x, const iset *y, iset *out, bool over)
{
    iset r = {0};
    for (int i = 0, j = 0; i < x->n && j < y->n;) {
        int64_t lo = x->lo[i] > y->lo[j] ? x->lo[i] : y->lo[j];
        int64_t hi = x->hi[i] < y->hi[j] ? x->hi[i] : y->hi[j];
        iset_push(&r, lo, hi, over);
        if (x->hi[i] < y->hi[j])
            i++;
        else
            j++;
    }
    *out = r;
}

static void iset_or(const iset *x, const iset *y, iset *out, bool over)
{
    iset r = {0};
    int i = 0, j = 0;
    while (i < x->n || j < y->n) {
        bool take_x = j >= y->n || (i < x->n && x->lo[i] <= y->lo[j]);
        if (take_x) {
            iset_push(&r, x->lo[i], x->hi[i], over);
            i++;
        } else {
            iset_push(&r, y->lo[j], y->hi[j], over);
            j++;
        }
    }
    *out = r;
}

static void iset_not(const iset *x, int64_t lo, int64_t hi, iset *out, bool over)
{
    iset r = {0};
    int64_t at = lo;
    for (int i = 0; i < x->n; i++) {
        iset_push(&r, at, x->lo[i] - 1, over);
        at = x->hi[i] + 1;
    }
    iset_push(&r, at, hi, over);
    *out = r;
}

/* ---- per-row evaluation --------------------------------------------------------------------- */

static int64_t floor_div64(int64_t a, int64_t b) /* b > 0 */
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

static int64_t ceil_div64(int64_t a, int64_t b) /* b > 0 */
{
    return -floor_div64(-a, b);
}

/* Thresholds beyond +-2^62 are as good as infinite for keys below 2^31; clamping keeps the
 * divisions in solve_linear free of overflow. */
static int64_t clamp128(__int128 v)
{
    const int64_t big = (int64_t)1 << 62;
    return v > big ? big : v < -big ? -big : (int64_t)v;
}

static int64_t term_value(const fdterm *t, int64_t v)
{
    return t->coef * floor_div64(t->mul * v + t->add, t->div);
}

/* Keys k in [lo, hi] with m*k >= t (ge) or m*k <= t (!ge), as an interval [*a, *b]. */
static void solve_linear(int64_t m, int64_t t, bool ge, int64_t lo, int64_t hi, int64_t *a,
                         int64_t *b)
{
    *a = lo;
    *b = hi;
    if (m == 0) {
        bool ok = ge ? 0 >= t : 0 <= t;
        if (!ok)
            *a = hi + 1;
        return;
    }
    bool lower = (m > 0) == ge; /* the solution is k >= bound */
    int64_t am = m > 0 ? m : -m, tt = m > 0 ? t : -t;
    /* m*k >= t with m<0 is |m|*k <= -t, and so on */
    if (lower) {
        int64_t bound = ceil_div64(tt, am);
        if (bound > *a)
            *a = bound;
    } else {
        int64_t bound = floor_div64(tt, am);
        if (bound < *b)
            *b = bound;
    }
}

/* The exact key set of atom L(q, k) >= 0 for row q; false if this atom is not an interval. */
static bool atom_row(const lin *l, int64_t q, int64_t lo, int64_t hi, int64_t *a, int64_t *b)
{
    int64_t rest = l->c0 + l->cq * q;
    for (int i = 0; i < l->nq; i++)
        rest += term_value(&l->tq[i], q);
    if (l->nk == 0) {
        solve_linear(l->ck, -rest, true, lo, hi, a, b);
        return true;
    }
    if (l->nk > 1 || l->ck != 0)
        return false;
    /* e * floor((m k + c) / d) + rest >= 0 */
    const fdterm *t = &l->tk[0];
    int64_t e = t->coef, m = t->mul, c = t->add, d = t->div;
    if (e == 0) {
        solve_linear(0, -rest, true, lo, hi, a, b);
        return true;
    }
    if (e > 0) { /* u >= U  <=>  m k + c >= U d */
        int64_t U = ceil_div64(-rest, e);
        solve_linear(m, clamp128((__int128)U * d - c), true, lo, hi, a, b);
    } else { /* u <= U  <=>  m k + c <= U d + d - 1 */
        int64_t U = floor_div64(rest, -e);
        solve_linear(m, clamp128((__int128)U * d + d - 1 - c), false, lo, hi, a, b);
    }
    return true;
}

typedef struct rowsets {
    iset *must, *may; /* one per formula node */
} rowsets;

/* Computes must/may for every formula node for row q over keys [lo, hi]; nodes are in
 * topological order (children first) by construction. */
static void eval_row(const kpt_mask_analysis *a, rowsets *rs, int64_t q, int64_t lo, int64_t hi)
{
    for (int i = 0; i < a->nf; i++) {
        const fnode *f = &a->f[i];
        iset *mu = &rs->must[i], *ma = &rs->may[i];
        switch (f->kind) {
        case F_CONST:
            mu->n = ma->n = 0;
            if (f->value) {
                iset_all(mu, lo, hi);
                iset_all(ma, lo, hi);
            }
            break;
        case F_OPAQUE:
            mu->n = 0;
            iset_all(ma, lo, hi);
            break;
        case F_ATOM: {
            int64_t x, y;
            if (atom_row(&a->atoms[f->atom], q, lo, hi, &x, &y)) {
                mu->n = ma->n = 0;
                iset_push(mu, x, y, false);
                iset_push(ma, x, y, true);
            } else {
                mu->n = 0;
                iset_all(ma, lo, hi);
            }
            break;
        }
        case F_AND:
            iset_and(&rs->must[f->a], &rs->must[f->b], mu, false);
            iset_and(&rs->may[f->a], &rs->may[f->b], ma, true);
            break;
        case F_OR:
            iset_or(&rs->must[f->a], &rs->must[f->b], mu, false);
            iset_or(&rs->may[f->a], &rs->may[f->b], ma, true);
            break;
        case F_NOT: {
            iset nmu, nma;
            iset_not(&rs->may[f->a], lo, hi, &nmu, false);
            iset_not(&rs->must[f->a], lo, hi, &nma, true);
            *mu = nmu;
            *ma = nma;
            break;
        }
        }
    }
}

static bool rowsets_init(const kpt_mask_analysis *a, rowsets *rs)
{
    size_t n = a->nf > 0 ? (size_t)a->nf : 1;
    rs->must = malloc(n * sizeof(iset));
    rs->may = malloc(n * sizeof(iset));
    return rs->must && rs->may;
}

static void rowsets_free(rowsets *rs)
{
    free(rs->must);
    free(rs->may);
}

static void clip(const kpt_mask_analysis *a, int64_t *q0, int64_t *q1, int64_t *k0, int64_t *k1)
{
    if (*q0 < 0) *q0 = 0;
    if (*k0 < 0) *k0 = 0;
    if (*q1 > a->env.sq) *q1 = a->env.sq;
    if (*k1 > a->env.skv) *k1 = a->env.skv;
}

kpt_tile_class kpt_mask_classify(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t k0,
                                 int64_t k1)
{
    clip(a, &q0, &q1, &k0, &k1);
    if (q0 >= q1 || k0 >= k1)
        return KPT_TILE_EMPTY;
    if (!a->has_mask)
        return KPT_TILE_FULL;
    rowsets rs;
    if (!rowsets_init(a, &rs)) {
        rowsets_free(&rs);
        return KPT_TILE_PARTIAL; /* sound without memory */
    }
    bool any = false, all = true;
    for (int64_t q = q0; q < q1 && (all || !any); q++) {
        eval_row(a, &rs, q, k0, k1 - 1);
        const iset *mu = &rs.must[a->root], *ma = &rs.may[a->root];
        any |= ma->n > 0;
        all &= mu->n == 1 && mu->lo[0] == k0 && mu->hi[0] == k1 - 1;
    }
    rowsets_free(&rs);
    return !any ? KPT_TILE_EMPTY : all ? KPT_TILE_FULL : KPT_TILE_PARTIAL;
}

void kpt_mask_classify_row(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t tile_k,
                           kpt_tile_class *out)
{
    int64_t ntiles = tile_k > 0 ? (a->env.skv + tile_k - 1) / tile_k : 0;
    int64_t k0 = 0, k1 = a->env.skv;
    clip(a, &q0, &q1, &k0, &k1);
    for (int64_t t = 0; t < ntiles; t++)
        out[t] = q0 < q1 ? KPT_TILE_FULL : KPT_TILE_EMPTY; /* no mask: every tile is full */
    if (q0 >= q1 || !a->has_mask || ntiles == 0)
        return;
    rowsets rs;
    bool *any = calloc((size_t)ntiles, sizeof(bool));
    bool *all = malloc((size_t)ntiles * sizeof(bool));
    if (!rowsets_init(a, &rs) || !any || !all) {
        for (int64_t t = 0; t < ntiles; t++)
            out[t] = KPT_TILE_PARTIAL;
        goto done;
    }
    for (int64_t t = 0; t < ntiles; t++)
        all[t] = true;
    for (int64_t q = q0; q < q1; q++) {
        eval_row(a, &rs, q, 0, a->env.skv - 1);
        const iset *mu = &rs.must[a->root], *ma = &rs.may[a->root];
        /* any: tiles touched by a may interval; all: tiles inside one must interval */
        for (int i = 0; i < ma->n; i++)
            for (int64_t t = ma->lo[i] / tile_k; t <= ma->hi[i] / tile_k; t++)
                any[t] = true;
        int i = 0;
        for (int64_t t = 0; t < ntiles; t++) {
            int64_t start = t * tile_k, end = (t + 1) * tile_k - 1;
            if (end > a->env.skv - 1)
                end = a->env.skv - 1;
            while (i < mu->n && mu->hi[i] < start)
                i++;
            if (!(i < mu->n && mu->lo[i] <= start && mu->hi[i] >= end))
                all[t] = false;
        }
    }
    for (int64_t t = 0; t < ntiles; t++)
        out[t] = !any[t] ? KPT_TILE_EMPTY : all[t] ? KPT_TILE_FULL : KPT_TILE_PARTIAL;
done:
    rowsets_free(&rs);
    free(any);
    free(all);
}

bool kpt_mask_kv_range(const kpt_mask_analysis *a, int64_t q0, int64_t q1, int64_t tile_k,
                       int64_t *first, int64_t *last)
{
    int64_t k0 = 0, k1 = a->env.skv;
    clip(a, &q0, &q1, &k0, &k1);
    *first = 0;
    *last = -1;
    if (q0 >= q1 || k0 >= k1 || tile_k <= 0)
        return false;
    if (!a->has_mask) {
        *last = (k1 - 1) / tile_k;
        return true;
    }
    rowsets rs;
    if (!rowsets_init(a, &rs)) {
        rowsets_free(&rs);
        *last = (k1 - 1) / tile_k; /* sound without memory */
        return true;
    }
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t q = q0; q < q1; q++) {
        eval_row(a, &rs, q, k0, k1 - 1);
        const iset *ma = &rs.may[a->root];
        if (ma->n) {
            if (ma->lo[0] < lo) lo = ma->lo[0];
            if (ma->hi[ma->n - 1] > hi) hi = ma->hi[ma->n - 1];
        }
    }
    rowsets_free(&rs);
    if (hi < 0)
        return false;
    *first = lo / tile_k;
    *last = hi / tile_k;
    return true;
}
