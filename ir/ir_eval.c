/* The IR interpreter (see ir_eval.h). Integers are computed in 64 bits and wrapped to 32, so every
 * i32 op matches two's-complement hardware. f32 values are held in a double but are always floats:
 * every f32 leaf (s, a scalar, an aux load, a constant) and every f32 result is rounded to float,
 * as a kernel holds it. An op is computed in double and then rounded, which gives the correctly
 * rounded float for + - * / and sqrt, and the float nearest the exact value for the functions;
 * so floor(log(n / 8) / log(16) * 8) is 2 at n = 16 here as in every kernel, where rounding
 * once at the end gave 1 (docs/architecture.md, "The reference's arithmetic"). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "ir/ir_eval.h"
#include "base/numeric.h"

static int32_t wrap(int64_t v)
{
    return (int32_t)(uint32_t)(uint64_t)v;
}

static int32_t floor_div(int32_t a, int32_t b)
{
    if (b == 0)
        return 0;
    if (b == -1)
        return wrap(-(int64_t)a);
    int32_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

static int32_t floor_mod(int32_t a, int32_t b)
{
    if (b == 0 || b == -1)
        return 0;
    int32_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0)))
        r += b;
    return r;
}

static int32_t floor_to_i32(double v)
{
    if (isnan(v))
        return 0;
    v = floor(v);
    if (v <= (double)INT32_MIN)
        return INT32_MIN;
    if (v >= (double)INT32_MAX)
        return INT32_MAX;
    return (int32_t)v;
}

static int32_t ilog2(int32_t v)
{
    if (v <= 0)
        return -1;
    int32_t r = 0;
    while (v >>= 1)
        r++;
    return r;
}

/* The IR's shifts: counts outside 0..31 shift every bit out. */
static int32_t shift(kpt_ir_op op, int32_t a, int32_t n)
{
    uint32_t u = (uint32_t)a;
    bool out = n < 0 || n > 31;
    switch (op) {
    case KPT_IR_SHL: return out ? 0 : (int32_t)(u << n);
    case KPT_IR_SHRU: return out ? 0 : (int32_t)(u >> n);
    default: /* SHR, arithmetic: the sign fills in (written without C's signed >>) */
        if (a >= 0)
            return out ? 0 : (int32_t)(u >> n);
        return out ? -1 : (int32_t)~(~u >> n);
    }
}

static double f32(double v)
{
    return (double)(float)v;
}

static double lua_fmod(double a, double b)
{
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0)))
        m += b;
    return m;
}

kpt_ir_value kpt_ir_apply(kpt_ir_op op, kpt_ir_type type, kpt_ir_type argtype,
                          const kpt_ir_value *a)
{
    kpt_ir_value r = {0};
    bool fl = argtype == KPT_IR_F32;
    switch (op) {
    case KPT_IR_NEG:
        if (fl) r.f = -a[0].f; else r.i = wrap(-(int64_t)a[0].i);
        break;
    case KPT_IR_ABS:
        if (fl) r.f = fabs(a[0].f); else r.i = wrap(llabs((int64_t)a[0].i));
        break;
    case KPT_IR_NOT: r.i = !a[0].i; break;
    case KPT_IR_EXP: r.f = exp(a[0].f); break;
    case KPT_IR_LOG: r.f = log(a[0].f); break;
    case KPT_IR_TANH: r.f = tanh(a[0].f); break;
    case KPT_IR_SQRT: r.f = sqrt(a[0].f); break;
    case KPT_IR_FLOOR: r.f = floor(a[0].f); break;
    case KPT_IR_ILOG2: r.i = ilog2(a[0].i); break;
    case KPT_IR_TO_F32: r.f = (double)a[0].i; break;
    case KPT_IR_TO_I32: r.i = argtype == KPT_IR_BOOL ? a[0].i : floor_to_i32(a[0].f); break;
    case KPT_IR_BNOT: r.i = (int32_t)~(uint32_t)a[0].i; break;
    case KPT_IR_ERF: r.f = erf(a[0].f); break;
    case KPT_IR_BAND: r.i = (int32_t)((uint32_t)a[0].i & (uint32_t)a[1].i); break;
    case KPT_IR_BOR: r.i = (int32_t)((uint32_t)a[0].i | (uint32_t)a[1].i); break;
    case KPT_IR_BXOR: r.i = (int32_t)((uint32_t)a[0].i ^ (uint32_t)a[1].i); break;
    case KPT_IR_SHL:
    case KPT_IR_SHR:
    case KPT_IR_SHRU: r.i = shift(op, a[0].i, a[1].i); break;
    case KPT_IR_ADD:
        if (fl) r.f = a[0].f + a[1].f; else r.i = wrap((int64_t)a[0].i + a[1].i);
        break;
    case KPT_IR_SUB:
        if (fl) r.f = a[0].f - a[1].f; else r.i = wrap((int64_t)a[0].i - a[1].i);
        break;
    case KPT_IR_MUL:
        if (fl) r.f = a[0].f * a[1].f; else r.i = wrap((int64_t)a[0].i * a[1].i);
        break;
    case KPT_IR_DIV: r.f = a[0].f / a[1].f; break;
    case KPT_IR_IDIV:
        if (fl) r.f = floor(f32(a[0].f / a[1].f)); else r.i = floor_div(a[0].i, a[1].i);
        break;
    case KPT_IR_MOD:
        if (fl) r.f = lua_fmod(a[0].f, a[1].f); else r.i = floor_mod(a[0].i, a[1].i);
        break;
    case KPT_IR_POW: r.f = pow(a[0].f, a[1].f); break;
    case KPT_IR_MIN:
        if (fl) r.f = fmin(a[0].f, a[1].f); else r.i = a[0].i < a[1].i ? a[0].i : a[1].i;
        break;
    case KPT_IR_MAX:
        if (fl) r.f = fmax(a[0].f, a[1].f); else r.i = a[0].i > a[1].i ? a[0].i : a[1].i;
        break;
    case KPT_IR_LT: r.i = fl ? a[0].f < a[1].f : a[0].i < a[1].i; break;
    case KPT_IR_LE: r.i = fl ? a[0].f <= a[1].f : a[0].i <= a[1].i; break;
    case KPT_IR_GT: r.i = fl ? a[0].f > a[1].f : a[0].i > a[1].i; break;
    case KPT_IR_GE: r.i = fl ? a[0].f >= a[1].f : a[0].i >= a[1].i; break;
    case KPT_IR_EQ: r.i = fl ? a[0].f == a[1].f : a[0].i == a[1].i; break;
    case KPT_IR_NE: r.i = fl ? a[0].f != a[1].f : a[0].i != a[1].i; break;
    case KPT_IR_AND: r.i = a[0].i && a[1].i; break;
    case KPT_IR_OR: r.i = a[0].i || a[1].i; break;
    case KPT_IR_SELECT: r = a[0].i ? a[1] : a[2]; break;
    default: break; /* leaves are not applied */
    }
    if (type == KPT_IR_F32)
        r.f = f32(r.f);
    return r;
}

kpt_ir_value kpt_ir_const_value(const kpt_ir_node *n)
{
    kpt_ir_value v = {0};
    if (n->type == KPT_IR_F32)
        v.f = f32(n->imm.f);
    else
        v.i = n->imm.i;
    return v;
}

static kpt_ir_value load(const kpt_ir_node *n, const kpt_ir_env *env, const kpt_ir_value *vals)
{
    kpt_ir_value r = {0};
    const kpt_ir_auxview *a = env->aux ? &env->aux[n->imm.index] : NULL;
    if (!a || !a->data || a->rank != n->nargs)
        return r;
    int64_t off = 0;
    for (int d = 0; d < n->nargs; d++) {
        int64_t i = vals[n->arg[d]].i;
        if (i < 0 || i >= a->shape[d])
            return r; /* out of range reads 0 */
        off += i * a->stride[d];
    }
    double v = kpt_load_as_double(a->data, a->dtype, off);
    if (n->type == KPT_IR_F32)
        r.f = f32(v);
    else if (n->type == KPT_IR_BOOL)
        r.i = v != 0;
    else
        r.i = (int32_t)v;
    return r;
}

static kpt_ir_value eval_node(const kpt_ir_graph *g, kpt_ir_ref ref, const kpt_ir_env *env,
                              const kpt_ir_value *vals)
{
    const kpt_ir_node *n = &g->nodes[ref];
    kpt_ir_value r = {0};
    switch ((kpt_ir_op)n->op) {
    case KPT_IR_CONST: return kpt_ir_const_value(n);
    case KPT_IR_S: r.f = f32(env->s); return r;
    case KPT_IR_B: r.i = env->b; return r;
    case KPT_IR_H: r.i = env->h; return r;
    case KPT_IR_Q: r.i = env->q; return r;
    case KPT_IR_K: r.i = env->k; return r;
    case KPT_IR_SQ: r.i = env->sq; return r;
    case KPT_IR_SKV: r.i = env->skv; return r;
    case KPT_IR_HQ: r.i = env->hq; return r;
    case KPT_IR_SCALAR:
        if (!env->scalars)
            return r;
        r = env->scalars[n->imm.index];
        if (n->type == KPT_IR_F32)
            r.f = f32(r.f);
        return r;
    case KPT_IR_LOAD: return load(n, env, vals);
    default: {
        kpt_ir_value args[KPT_IR_MAX_ARGS];
        for (int i = 0; i < n->nargs; i++)
            args[i] = vals[n->arg[i]];
        return kpt_ir_apply((kpt_ir_op)n->op, (kpt_ir_type)n->type,
                            (kpt_ir_type)g->nodes[n->arg[0]].type, args);
    }
    }
}

bool kpt_ir_prog_init(kpt_ir_prog *p, const kpt_ir_graph *g, const kpt_ir_ref *roots, int nroots)
{
    p->g = g;
    p->order = NULL;
    p->len = 0;
    uint8_t *live = calloc(g->count ? g->count : 1, 1);
    if (!live)
        return false;
    kpt_ir_mark_live(g, roots, nroots, live);
    uint32_t n = 0;
    for (kpt_ir_ref r = 1; r < g->count; r++)
        n += live[r];
    p->order = malloc((n ? n : 1) * sizeof(*p->order));
    if (!p->order) {
        free(live);
        return false;
    }
    for (kpt_ir_ref r = 1; r < g->count; r++)
        if (live[r])
            p->order[p->len++] = r;
    free(live);
    return true;
}

void kpt_ir_prog_free(kpt_ir_prog *p)
{
    free(p->order);
    p->order = NULL;
    p->len = 0;
}

void kpt_ir_prog_run(const kpt_ir_prog *p, const kpt_ir_env *env, kpt_ir_value *values)
{
    for (uint32_t i = 0; i < p->len; i++) {
        kpt_ir_ref r = p->order[i];
        values[r] = eval_node(p->g, r, env, values);
    }
}

bool kpt_ir_eval(const kpt_ir_graph *g, kpt_ir_ref root, const kpt_ir_env *env,
                 kpt_ir_value *out)
{
    kpt_ir_prog p;
    if (!kpt_ir_prog_init(&p, g, &root, 1))
        return false;
    kpt_ir_value *vals = calloc(g->count ? g->count : 1, sizeof(*vals));
    if (!vals) {
        kpt_ir_prog_free(&p);
        return false;
    }
    kpt_ir_prog_run(&p, env, vals);
    *out = vals[root];
    free(vals);
    kpt_ir_prog_free(&p);
    return true;
}
