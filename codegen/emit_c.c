/* The shared C-like expression emitter (see emit_c.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/emit_c.h"

#define C_FAMILY(name_, from_bits)                                                            \
    {.name = name_, .type_int = "int", .type_float = "float", .type_bool = "bool",               \
     .float_lit = "%af", .float_from_bits = from_bits, .to_int_open = "(int)",                   \
     .to_int_close = "", .to_float_open = "(float)", .to_float_close = "",                       \
     .aux_load = "kpt_aux_%s(A.aux[%u], ", .iv_load = "kpt_iv_load<%s>(A.aux[%u], ",             \
     .fdiv = "kpt_fdiv", .tile_class = "    return i%1$u.h == 0 ? 0 : (i%1$u.l == 1 ? 2 : 1);"}

const kpt_c_dialect kpt_dialect_cuda = C_FAMILY("cuda", "__uint_as_float");
/* HIP's own __uint_as_float comes from its headers, which kernels compiled with clang
 * -nogpuinc do not have: the template defines kpt_u2f. */
const kpt_c_dialect kpt_dialect_hip = C_FAMILY("hip", "kpt_u2f");
/* GLSL has no hex floats, casts are constructors, 64-bit comparisons need an extension
 * (kpt_iv_class in the template avoids them) */
const kpt_c_dialect kpt_dialect_glsl = {
    .name = "glsl", .type_int = "int", .type_float = "float", .type_bool = "bool",
    .float_lit = "%.9e", .float_from_bits = "uintBitsToFloat", .to_int_open = "int(",
    .to_int_close = ")", .to_float_open = "float(", .to_float_close = ")",
    .aux_load = "kpt_aux%.0s%u(", .iv_load = "kpt_iv_load%.0s%u(", .fdiv = NULL,
    .tile_class = "    return kpt_iv_class(i%u);"};

static const char *type_name(kpt_ir_type t, const kpt_c_dialect *d)
{
    switch (t) {
    case KPT_IR_F32: return d->type_float;
    case KPT_IR_BOOL: return d->type_bool;
    default: return d->type_int;
    }
}

static void emit_float(kpt_strbuf *sb, float f, const kpt_c_dialect *d)
{
    if (isfinite(f)) {
        /* hex floats are exact; GLSL has none, and nine significant digits round-trip a float */
        kpt_sb_printf(sb, d->float_lit, (double)f);
        return;
    }
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    kpt_sb_printf(sb, "%s(0x%08xu)", d->float_from_bits, (unsigned)bits);
}

static void emit_int(kpt_strbuf *sb, int32_t v)
{
    if (v == INT32_MIN)
        kpt_sb_puts(sb, "(-2147483647 - 1)");
    else
        kpt_sb_printf(sb, "%d", (int)v);
}

/* The suffix of the C loaders kpt_aux_<suffix> for an aux dtype. */
static const char *aux_suffix(kpt_dtype t)
{
    switch (t) {
    case KPT_DTYPE_I32: return "i32";
    case KPT_DTYPE_F32: return "f32";
    case KPT_DTYPE_F16: return "f16";
    case KPT_DTYPE_BF16: return "bf16";
    default: return "bool";
    }
}

/* A load's indices as the templates' loaders take them: always KPT_AUX_MAX_RANK of them, the
 * node `<prefix><ref>` of each operand and `pad` for the dimensions the tensor lacks. */
static void emit_indices(kpt_strbuf *sb, const kpt_ir_node *n, const char *prefix, const char *pad)
{
    for (int i = 0; i < KPT_AUX_MAX_RANK; i++) {
        if (i)
            kpt_sb_puts(sb, ", ");
        if (i < n->nargs)
            kpt_sb_printf(sb, "%s%u", prefix, (unsigned)n->arg[i]);
        else
            kpt_sb_puts(sb, pad);
    }
}

/* Op spellings, indexed by op: the i32 helper and the f32 function of each arithmetic op (the
 * templates define the same names in every dialect). */
static const char *const int_fns[KPT_IR_OP_COUNT] = {
    [KPT_IR_NEG] = "kpt_ineg",
    [KPT_IR_ABS] = "kpt_iabs",
    [KPT_IR_ILOG2] = "kpt_ilog2",
    [KPT_IR_ADD] = "kpt_iadd",
    [KPT_IR_SUB] = "kpt_isub",
    [KPT_IR_MUL] = "kpt_imul",
    [KPT_IR_IDIV] = "kpt_idiv",
    [KPT_IR_MOD] = "kpt_imod",
    [KPT_IR_MIN] = "kpt_imin",
    [KPT_IR_MAX] = "kpt_imax",
    [KPT_IR_BNOT] = "kpt_ibnot",
    [KPT_IR_BAND] = "kpt_iband",
    [KPT_IR_BOR] = "kpt_ibor",
    [KPT_IR_BXOR] = "kpt_ibxor",
    [KPT_IR_SHL] = "kpt_ishl",
    [KPT_IR_SHR] = "kpt_ishr",
    [KPT_IR_SHRU] = "kpt_ishru",
};

static const char *const float_fns[KPT_IR_OP_COUNT] = {
    [KPT_IR_ABS] = "fabsf",
    [KPT_IR_EXP] = "kpt_fexp",
    [KPT_IR_LOG] = "logf",
    [KPT_IR_TANH] = "kpt_ftanh",
    [KPT_IR_ERF] = "kpt_ferf",
    [KPT_IR_SQRT] = "sqrtf",
    [KPT_IR_FLOOR] = "floorf",
    [KPT_IR_POW] = "powf",
    [KPT_IR_MIN] = "fminf",
    [KPT_IR_MAX] = "fmaxf",
    [KPT_IR_MOD] = "kpt_ffmod",
};

/* Infix operators, the same in every dialect. */
static const char *const infix_ops[KPT_IR_OP_COUNT] = {
    [KPT_IR_ADD] = "+",
    [KPT_IR_SUB] = "-",
    [KPT_IR_MUL] = "*",
    [KPT_IR_DIV] = "/",
    [KPT_IR_LT] = "<",
    [KPT_IR_LE] = "<=",
    [KPT_IR_GT] = ">",
    [KPT_IR_GE] = ">=",
    [KPT_IR_EQ] = "==",
    [KPT_IR_NE] = "!=",
    [KPT_IR_AND] = "&&",
    [KPT_IR_OR] = "||",
};

/* Float division in the C dialects. IEEE division (what `/` means to NVRTC) is a dozen
 * instructions with a slow-path call per element; score mods divide by constants (softcap's
 * s / cap) or scalars, where 2 ulp is far inside the output budget (docs/architecture.md,
 * "Transcendentals"). A constant divisor becomes a product with its rounded reciprocal; any
 * other divisor goes through kpt_fdiv, a reciprocal approximation and a product (the compiler
 * hoists the reciprocal of a uniform value out of the element loop). GLSL's `/` is already
 * approximate. */
static void emit_fdiv(kpt_strbuf *sb, const kpt_ir_graph *g, kpt_ir_ref x, kpt_ir_ref y,
                      const kpt_c_dialect *d)
{
    const kpt_ir_node *ny = kpt_ir_node_get(g, y);
    if (ny->op == KPT_IR_CONST && isfinite(ny->imm.f) && ny->imm.f != 0.0f) {
        float r = (float)(1.0 / (double)ny->imm.f);
        if (isnormal(r)) {
            kpt_sb_printf(sb, "(v%u * ", (unsigned)x);
            emit_float(sb, r, d);
            kpt_sb_puts(sb, ")");
            return;
        }
    }
    kpt_sb_printf(sb, "%s(v%u, v%u)", d->fdiv, (unsigned)x, (unsigned)y);
}

/* The right-hand side of node r's value statement. */
static void emit_value(kpt_strbuf *sb, const kpt_pattern *p, kpt_ir_ref r, const kpt_c_dialect *d)
{
    const kpt_ir_graph *g = &p->g;
    const kpt_ir_node *n = kpt_ir_node_get(g, r);
    kpt_ir_op op = (kpt_ir_op)n->op;
    kpt_ir_type at = n->nargs ? kpt_ir_type_of(g, n->arg[0]) : KPT_IR_VOID;
    const uint32_t *a = n->arg;
    switch (op) {
    case KPT_IR_CONST:
        if (n->type == KPT_IR_F32)
            emit_float(sb, n->imm.f, d);
        else if (n->type == KPT_IR_BOOL)
            kpt_sb_puts(sb, n->imm.i ? "true" : "false");
        else
            emit_int(sb, n->imm.i);
        return;
    case KPT_IR_S: kpt_sb_puts(sb, "s"); return;
    case KPT_IR_B: kpt_sb_puts(sb, "b"); return;
    case KPT_IR_H: kpt_sb_puts(sb, "h"); return;
    case KPT_IR_Q: kpt_sb_puts(sb, "q"); return;
    case KPT_IR_K: kpt_sb_puts(sb, "k"); return;
    case KPT_IR_SQ: kpt_sb_puts(sb, "A.Sq"); return;
    case KPT_IR_SKV: kpt_sb_puts(sb, "A.Skv"); return;
    case KPT_IR_HQ: kpt_sb_puts(sb, "A.Hq"); return;
    case KPT_IR_SCALAR:
        if (n->type == KPT_IR_F32)
            kpt_sb_printf(sb, "%s(A.scalars[%u])", d->float_from_bits, (unsigned)n->imm.index);
        else
            kpt_sb_printf(sb, "%sA.scalars[%u]%s", d->to_int_open, (unsigned)n->imm.index,
                          d->to_int_close);
        return;
    case KPT_IR_LOAD:
        kpt_sb_printf(sb, d->aux_load, aux_suffix(p->aux[n->imm.index].dtype),
                      (unsigned)n->imm.index);
        kpt_sb_printf(sb, "%d, ", n->nargs);
        emit_indices(sb, n, "v", "0");
        kpt_sb_puts(sb, ")");
        return;
    case KPT_IR_NOT: kpt_sb_printf(sb, "!v%u", (unsigned)a[0]); return;
    case KPT_IR_NEG:
        if (at == KPT_IR_F32) { kpt_sb_printf(sb, "-v%u", (unsigned)a[0]); return; }
        break;
    case KPT_IR_TO_F32:
        if (at == KPT_IR_BOOL) kpt_sb_printf(sb, "(v%u ? 1.0f : 0.0f)", (unsigned)a[0]);
        else kpt_sb_printf(sb, "%sv%u%s", d->to_float_open, (unsigned)a[0], d->to_float_close);
        return;
    case KPT_IR_TO_I32:
        if (at == KPT_IR_BOOL)
            kpt_sb_printf(sb, "%sv%u%s", d->to_int_open, (unsigned)a[0], d->to_int_close);
        else kpt_sb_printf(sb, "kpt_f2i(v%u)", (unsigned)a[0]);
        return;
    case KPT_IR_IDIV:
        if (at == KPT_IR_F32) {
            kpt_sb_printf(sb, "floorf(v%u / v%u)", (unsigned)a[0], (unsigned)a[1]);
            return;
        }
        break;
    case KPT_IR_SELECT:
        kpt_sb_printf(sb, "(v%u ? v%u : v%u)", (unsigned)a[0], (unsigned)a[1], (unsigned)a[2]);
        return;
    case KPT_IR_DIV:
        if (at == KPT_IR_F32 && d->fdiv) {
            emit_fdiv(sb, g, a[0], a[1], d);
            return;
        }
        break;
    default: break;
    }
    const char *fn = at == KPT_IR_F32 ? float_fns[op] : int_fns[op];
    bool is_cmp_or_logic = op >= KPT_IR_LT && op <= KPT_IR_OR;
    if (fn && !is_cmp_or_logic) {
        kpt_sb_printf(sb, "%s(v%u", fn, (unsigned)a[0]);
        if (n->nargs > 1) kpt_sb_printf(sb, ", v%u", (unsigned)a[1]);
        kpt_sb_puts(sb, ")");
        return;
    }
    const char *o = infix_ops[op];
    if (o && n->nargs == 2) {
        kpt_sb_printf(sb, "(v%u %s v%u)", (unsigned)a[0], o, (unsigned)a[1]);
        return;
    }
    /* Every op is covered above; a new op that is not fails the NVRTC build loudly. */
    kpt_sb_printf(sb, "KPT_UNSUPPORTED_OP_%s", kpt_ir_op_name(op));
}

static uint8_t *live_set(const kpt_pattern *p, const kpt_ir_ref *roots, int nroots)
{
    uint8_t *live = calloc(p->g.count ? p->g.count : 1, 1);
    if (live)
        kpt_ir_mark_live(&p->g, roots, nroots, live);
    return live;
}

/* Uniform values: nodes that depend on neither the score, q, k nor aux data (ALiBi's slope(h),
 * a scalar's reciprocal) are computed once per CTA by kpt_uniform_init, not once per element.
 * "Boundary" nodes are the uniform ones a per-element node reads; only they are stored. */
typedef struct uniform_info {
    uint8_t *live;     /* live in score or mask */
    uint8_t *invariant; /* per node: depends on neither s, q, k nor aux data */
    uint8_t *uniform;  /* invariant and worth hoisting (not a leaf or constant) */
    uint8_t *boundary; /* invariant and read by a per-element node (or a root) */
} uniform_info;

static void uniform_free(uniform_info *u)
{
    free(u->live);
    free(u->invariant);
    free(u->uniform);
    free(u->boundary);
}

static bool uniform_analyse(const kpt_pattern *p, uniform_info *u)
{
    size_t n = p->g.count ? p->g.count : 1;
    kpt_ir_ref roots[KPT_MAX_ROOTS]; /* on derived patterns, the score's derivatives too */
    int nroots = kpt_pattern_roots(p, roots);
    u->live = calloc(n, 1);
    u->invariant = calloc(n, 1);
    u->uniform = calloc(n, 1);
    u->boundary = calloc(n, 1);
    uint16_t *deps = calloc(n, sizeof(*deps));
    if (!u->live || !u->invariant || !u->uniform || !u->boundary || !deps) {
        free(deps);
        return false;
    }
    kpt_ir_mark_live(&p->g, roots, nroots, u->live);
    kpt_ir_deps(&p->g, deps);
    const uint16_t varying = KPT_DEP_S | KPT_DEP_Q | KPT_DEP_K | KPT_DEP_AUX;
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        const kpt_ir_node *nd = kpt_ir_node_get(&p->g, r);
        u->invariant[r] = u->live[r] && !(deps[r] & varying);
        u->uniform[r] = u->invariant[r] && nd->nargs > 0;
    }
    /* boundary[r]: an invariant node read by per-element code (or a root) */
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        const kpt_ir_node *nd = kpt_ir_node_get(&p->g, r);
        if (!u->live[r] || u->invariant[r])
            continue;
        for (int i = 0; i < nd->nargs; i++)
            if (u->invariant[nd->arg[i]])
                u->boundary[nd->arg[i]] = 1;
    }
    for (int i = 0; i < nroots; i++)
        if (roots[i] && u->invariant[roots[i]])
            u->boundary[roots[i]] = 1;
    free(deps);
    return true;
}

/* The statements of the nodes in `live`; a node with inputs[r] = i + 1 is not computed but read
 * from kv[i] (the key values of a split mask, below). */
static void emit_live(kpt_strbuf *sb, const kpt_pattern *p, const uint8_t *live,
                      const uint8_t *inputs, const kpt_c_dialect *d)
{
    uniform_info u = {0};
    if (!uniform_analyse(p, &u)) {
        uniform_free(&u);
        sb->failed = true;
        return;
    }
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        if (!live[r] || (u.invariant[r] && !u.boundary[r]))
            continue;
        kpt_ir_type t = kpt_ir_type_of(&p->g, r);
        kpt_sb_printf(sb, "    const %s v%u = ", type_name(t, d), (unsigned)r);
        if (inputs && inputs[r])
            kpt_sb_printf(sb, t == KPT_IR_BOOL ? "kv[%d] != 0" : "kv[%d]", inputs[r] - 1);
        else if (u.uniform[r])
            kpt_sb_printf(sb, "U.u%u", (unsigned)r);
        else
            emit_value(sb, p, r, d);
        kpt_sb_puts(sb, ";\n");
    }
    uniform_free(&u);
}

static void emit_values(kpt_strbuf *sb, const kpt_pattern *p, const kpt_ir_ref *roots,
                        int nroots, const kpt_c_dialect *d)
{
    uint8_t *live = live_set(p, roots, nroots);
    if (!live) {
        sb->failed = true;
        return;
    }
    emit_live(sb, p, live, NULL, d);
    free(live);
}

void kpt_emit_uniform(kpt_strbuf *fields, kpt_strbuf *init, const kpt_pattern *p,
                      const kpt_c_dialect *d)
{
    uniform_info u = {0};
    if (!uniform_analyse(p, &u)) {
        uniform_free(&u);
        fields->failed = init->failed = true;
        return;
    }
    kpt_sb_puts(fields, "    int unused_;");
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        if (!u.invariant[r])
            continue;
        kpt_sb_printf(init, "    const %s v%u = ", type_name(kpt_ir_type_of(&p->g, r), d), (unsigned)r);
        emit_value(init, p, r, d);
        kpt_sb_puts(init, ";\n");
        if (u.boundary[r] && u.uniform[r]) {
            kpt_sb_printf(fields, "\n    %s u%u;", type_name(kpt_ir_type_of(&p->g, r), d), (unsigned)r);
            kpt_sb_printf(init, "    U.u%u = v%u;\n", (unsigned)r, (unsigned)r);
        }
    }
    kpt_sb_puts(init, "    U.unused_ = 0;");
    uniform_free(&u);
}

/* The body of a per-element function: `fallback` when the pattern has no such root. */
static void emit_root_body(kpt_strbuf *sb, const kpt_pattern *p, kpt_ir_ref root,
                           const char *fallback, const kpt_c_dialect *d)
{
    if (!root) {
        kpt_sb_printf(sb, "    return %s;", fallback);
        return;
    }
    emit_values(sb, p, &root, 1, d);
    kpt_sb_printf(sb, "    return v%u;", (unsigned)root);
}

void kpt_emit_score_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d)
{
    emit_root_body(sb, p, p->score, "s", d);
}

void kpt_emit_mask_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d)
{
    emit_root_body(sb, p, p->mask, "true", d);
}

/* ---- masks split into key values and a pair test --------------------------------------------- */

/* Key nodes: live in the mask, computed from k (and b, h, lengths, scalars) but not from q or the
 * score, and not aux loads (their data may change per call: kept out for simplicity). The key
 * values are the key nodes a per-pair node reads (or the mask itself, when it is one). */
static int mask_key_values(const kpt_pattern *p, const uint8_t *live, kpt_ir_ref *vals,
                           int *key_nodes)
{
    const kpt_ir_graph *g = &p->g;
    uint16_t *deps = calloc(g->count ? g->count : 1, sizeof(*deps));
    uint8_t *key = calloc(g->count ? g->count : 1, 1), *val = calloc(g->count ? g->count : 1, 1);
    int n = -1;
    if (!deps || !key || !val)
        goto out;
    kpt_ir_deps(g, deps);
    n = 0;
    *key_nodes = 0;
    if (deps[p->mask] & KPT_DEP_AUX)
        goto out;
    for (kpt_ir_ref r = 1; r < g->count; r++) {
        const kpt_ir_node *nd = kpt_ir_node_get(g, r);
        key[r] = live[r] && nd->nargs > 0 && (deps[r] & KPT_DEP_K) &&
                 !(deps[r] & (KPT_DEP_Q | KPT_DEP_S));
        *key_nodes += key[r];
    }
    for (kpt_ir_ref r = 1; r < g->count; r++) {
        const kpt_ir_node *nd = kpt_ir_node_get(g, r);
        if (!live[r] || key[r] || !(deps[r] & KPT_DEP_Q))
            continue;
        for (int i = 0; i < nd->nargs; i++)
            val[nd->arg[i]] |= key[nd->arg[i]];
    }
    val[p->mask] |= key[p->mask];
    for (kpt_ir_ref r = 1; r < g->count && n <= KPT_MASK_KEY_VALUES; r++)
        if (val[r]) {
            if (kpt_ir_type_of(g, r) == KPT_IR_F32 || n == KPT_MASK_KEY_VALUES) {
                n = 0; /* floats or too many values: no split */
                break;
            }
            vals[n++] = r;
        }
out:
    free(deps);
    free(key);
    free(val);
    return n;
}

int kpt_emit_mask_split(kpt_strbuf *keys, kpt_strbuf *pair, const kpt_pattern *p,
                        const kpt_c_dialect *d)
{
    kpt_ir_ref vals[KPT_MASK_KEY_VALUES];
    int key_nodes = 0, n = 0;
    uint8_t *live = p->mask ? live_set(p, &p->mask, 1) : NULL;
    uint8_t *inputs = p->mask ? calloc(p->g.count, 1) : NULL;
    if (p->mask && (!live || !inputs ||
                    (n = mask_key_values(p, live, vals, &key_nodes)) < 0)) {
        keys->failed = pair->failed = true;
        n = 0;
    }
    /* each value costs a shuffle per key: worth it only when it saves several nodes */
    if (n > 0 && key_nodes >= 4 * n) {
        emit_values(keys, p, vals, n, d);
        for (int i = 0; i < n; i++) {
            kpt_sb_printf(keys, "    kv[%d] = (int)v%u;\n", i, (unsigned)vals[i]);
            inputs[vals[i]] = (uint8_t)(i + 1);
        }
        /* the pair test's nodes: the mask's cone, cut at the key values */
        memset(live, 0, p->g.count);
        live[p->mask] = 1;
        for (kpt_ir_ref r = p->mask; r > 0; r--) {
            const kpt_ir_node *nd = kpt_ir_node_get(&p->g, r);
            if (live[r] && !inputs[r])
                for (int i = 0; i < nd->nargs; i++)
                    live[nd->arg[i]] = 1;
        }
        kpt_sb_puts(pair, "    (void)A, (void)U, (void)b, (void)h, (void)q, (void)k, (void)kv;\n");
        emit_live(pair, p, live, inputs, d);
        kpt_sb_printf(pair, "    return v%u;", (unsigned)p->mask);
    } else {
        n = 0;
        kpt_sb_puts(pair, "    (void)A, (void)U, (void)b, (void)h, (void)q, (void)k, (void)kv;\n"
                          "    return true;");
    }
    kpt_sb_puts(keys, "    (void)A, (void)U, (void)b, (void)h, (void)k, (void)kv;");
    free(live);
    free(inputs);
    return n;
}

void kpt_emit_score_grad_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d)
{
    if (!p->score) {
        kpt_sb_puts(sb, "    ds = 1.0f;\n    return s;");
        return;
    }
    kpt_ir_ref roots[2] = {p->score, p->dscore};
    emit_values(sb, p, roots, p->dscore ? 2 : 1, d);
    if (p->dscore)
        kpt_sb_printf(sb, "    ds = v%u;\n", (unsigned)p->dscore);
    else
        kpt_sb_puts(sb, "    ds = 1.0f;\n");
    kpt_sb_printf(sb, "    return v%u;", (unsigned)p->score);
}

void kpt_emit_aux_grad_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d)
{
    kpt_ir_ref roots[KPT_MAX_DLOADS * 4];
    int n = 0;
    for (int i = 0; i < p->num_dloads; i++) {
        const kpt_ir_node *ld = kpt_ir_node_get(&p->g, p->dloads[i].load);
        roots[n++] = p->dloads[i].deriv;
        for (int a = 0; a < ld->nargs; a++)
            roots[n++] = ld->arg[a];
    }
    if (n)
        emit_values(sb, p, roots, n, d);
    for (int i = 0; i < p->num_dloads; i++) {
        const kpt_ir_node *ld = kpt_ir_node_get(&p->g, p->dloads[i].load);
        kpt_sb_printf(sb, "    kpt_daux_add(A, G, dt, %u, %d, ", (unsigned)ld->imm.index, ld->nargs);
        emit_indices(sb, ld, "v", "0");
        kpt_sb_puts(sb, ", ");
        /* g = 0 (a dropped pair) adds nothing, whatever the derivative there */
        kpt_sb_printf(sb, "g != 0.0f ? g * v%u : 0.0f);\n", (unsigned)p->dloads[i].deriv);
    }
    kpt_sb_puts(sb, "    (void)A, (void)U, (void)G, (void)dt, (void)s, (void)b, (void)h, (void)q, "
                    "(void)k, (void)g;");
}

/* ---- intervals ------------------------------------------------------------------------------ */

/* Interval helpers (templates/common/expr.inc and the GLSL template). */
static const char *const iv_fns[KPT_IR_OP_COUNT] = {
    [KPT_IR_NEG] = "kpt_iv_neg",
    [KPT_IR_ABS] = "kpt_iv_abs",
    [KPT_IR_ILOG2] = "kpt_iv_ilog2",
    [KPT_IR_NOT] = "kpt_iv_not",
    [KPT_IR_ADD] = "kpt_iv_add",
    [KPT_IR_SUB] = "kpt_iv_sub",
    [KPT_IR_MUL] = "kpt_iv_mul",
    [KPT_IR_IDIV] = "kpt_iv_idiv",
    [KPT_IR_MOD] = "kpt_iv_mod",
    [KPT_IR_MIN] = "kpt_iv_min",
    [KPT_IR_MAX] = "kpt_iv_max",
    [KPT_IR_LT] = "kpt_iv_lt",
    [KPT_IR_LE] = "kpt_iv_le",
    [KPT_IR_GT] = "kpt_iv_gt",
    [KPT_IR_GE] = "kpt_iv_ge",
    [KPT_IR_EQ] = "kpt_iv_eq",
    [KPT_IR_NE] = "kpt_iv_ne",
    [KPT_IR_AND] = "kpt_iv_and",
    [KPT_IR_OR] = "kpt_iv_or",
    [KPT_IR_SELECT] = "kpt_iv_select",
    [KPT_IR_BNOT] = "kpt_iv_bnot",
    [KPT_IR_BAND] = "kpt_iv_band",
    [KPT_IR_BOR] = "kpt_iv_bor",
    [KPT_IR_BXOR] = "kpt_iv_bxor",
    [KPT_IR_SHL] = "kpt_iv_shl",
    [KPT_IR_SHR] = "kpt_iv_shr",
    [KPT_IR_SHRU] = "kpt_iv_shru",
};

/* The interval of an i32 or bool node. f32 nodes have none: anything computed from a float is the
 * whole range of its type. */
static void emit_interval(kpt_strbuf *sb, const kpt_pattern *p, kpt_ir_ref r,
                          const kpt_c_dialect *d)
{
    const kpt_ir_graph *g = &p->g;
    const kpt_ir_node *n = kpt_ir_node_get(g, r);
    kpt_ir_op op = (kpt_ir_op)n->op;
    const char *any = n->type == KPT_IR_BOOL ? "kpt_iv_anyb()" : "kpt_iv_any()";
    for (int i = 0; i < n->nargs; i++)
        if (op != KPT_IR_LOAD && kpt_ir_type_of(g, n->arg[i]) == KPT_IR_F32 &&
            !(op == KPT_IR_SELECT && i == 0)) {
            kpt_sb_puts(sb, any);
            return;
        }
    switch (op) {
    case KPT_IR_CONST: kpt_sb_printf(sb, "kpt_iv_pt(%d)", (int)n->imm.i); return;
    case KPT_IR_B: kpt_sb_puts(sb, "kpt_iv_pt(b)"); return;
    case KPT_IR_H: kpt_sb_puts(sb, "kpt_iv_pt(h)"); return;
    case KPT_IR_Q: kpt_sb_puts(sb, "kpt_iv_mk(q0, q1)"); return;
    case KPT_IR_K: kpt_sb_puts(sb, "kpt_iv_mk(k0, k1)"); return;
    case KPT_IR_SQ: kpt_sb_puts(sb, "kpt_iv_pt(A.Sq)"); return;
    case KPT_IR_SKV: kpt_sb_puts(sb, "kpt_iv_pt(A.Skv)"); return;
    case KPT_IR_HQ: kpt_sb_puts(sb, "kpt_iv_pt(A.Hq)"); return;
    case KPT_IR_SCALAR:
        kpt_sb_printf(sb, "kpt_iv_pt(%sA.scalars[%u]%s)", d->to_int_open, (unsigned)n->imm.index,
                      d->to_int_close);
        return;
    case KPT_IR_LOAD: /* the range of the data over the index box */
        kpt_sb_printf(sb, d->iv_load, n->type == KPT_IR_BOOL ? "true" : "false",
                      (unsigned)n->imm.index);
        kpt_sb_printf(sb, "%d, ", n->nargs);
        emit_indices(sb, n, "i", "kpt_iv_pt(0)");
        kpt_sb_puts(sb, ")");
        return;
    case KPT_IR_TO_I32: kpt_sb_printf(sb, "i%u", (unsigned)n->arg[0]); return; /* from bool */
    default: break;
    }
    const char *fn = iv_fns[op];
    if (!fn) {
        kpt_sb_puts(sb, any);
        return;
    }
    kpt_sb_printf(sb, "%s(i%u", fn, (unsigned)n->arg[0]);
    for (int i = 1; i < n->nargs; i++)
        kpt_sb_printf(sb, ", i%u", (unsigned)n->arg[i]);
    kpt_sb_puts(sb, ")");
}

void kpt_emit_tile_body(kpt_strbuf *sb, const kpt_pattern *p, const kpt_c_dialect *d)
{
    if (!p->mask) {
        kpt_sb_puts(sb, "    return 2;");
        return;
    }
    uint8_t *live = live_set(p, &p->mask, 1);
    if (!live) {
        sb->failed = true;
        return;
    }
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        if (!live[r] || kpt_ir_type_of(&p->g, r) == KPT_IR_F32)
            continue;
        kpt_sb_printf(sb, "    const kpt_iv i%u = ", (unsigned)r);
        emit_interval(sb, p, r, d);
        kpt_sb_puts(sb, ";\n");
    }
    free(live);
    kpt_sb_printf(sb, d->tile_class, (unsigned)p->mask);
}
