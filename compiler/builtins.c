/* The built-in pattern terms. Each builder states its term's meaning (docs/patterns.md) in IR;
 * the running score starts as `s` and score mods apply left to right, masks AND together. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/builtins.h"

void kpt_build_add_mask(kpt_build_ctx *ctx, kpt_ir_ref m)
{
    ctx->mask = ctx->mask ? kpt_ir_binop(&ctx->p->g, KPT_IR_AND, ctx->mask, m) : m;
}

#define G (&ctx->p->g)
#define VAR(v) kpt_ir_var(G, KPT_IR_##v)
#define BIN(op, a, b) kpt_ir_binop(G, KPT_IR_##op, a, b)

static bool build_full(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    (void)ctx;
    (void)a;
    return true;
}

static bool build_causal(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K); /* declarators are sequenced: q is built first */
    kpt_build_add_mask(ctx, BIN(GE, q, k));
    return !G->failed;
}

static bool build_causal_br(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    /* q + skv - sq >= k: the last query sees the last key */
    kpt_ir_ref q = VAR(Q), k = VAR(K), skv = VAR(SKV), sq = VAR(SQ);
    kpt_ir_ref shift = BIN(SUB, skv, sq);
    kpt_ir_ref qs = BIN(ADD, q, shift);
    kpt_build_add_mask(ctx, BIN(GE, qs, k));
    return !G->failed;
}

static bool build_sliding_window(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref causal = BIN(GE, q, k), d = BIN(SUB, q, k);
    kpt_build_add_mask(ctx, BIN(AND, causal, BIN(LT, d, a[0].ref)));
    return !G->failed;
}

static bool build_local(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref qk = BIN(SUB, q, k), kq = BIN(SUB, k, q);
    kpt_ir_ref left = BIN(LE, qk, a[0].ref), right = BIN(LE, kq, a[1].ref);
    kpt_build_add_mask(ctx, BIN(AND, right, left));
    return !G->failed;
}

static bool build_chunked(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref cq = BIN(IDIV, q, a[0].ref), ck = BIN(IDIV, k, a[0].ref);
    kpt_build_add_mask(ctx, BIN(EQ, cq, ck));
    return !G->failed;
}

static bool build_prefix_lm(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref prefix = BIN(LT, k, a[0].ref), causal = BIN(GE, q, k);
    kpt_build_add_mask(ctx, BIN(OR, prefix, causal));
    return !G->failed;
}

static int doc_aux(kpt_build_ctx *ctx, const char *name, int64_t len_dim)
{
    int i = kpt_pattern_find_aux(ctx->p, name);
    if (i >= 0) {
        const kpt_aux_decl *d = &ctx->p->aux[i];
        if (d->dtype != KPT_DTYPE_I32 || d->rank != 2 || d->dims[1] != len_dim) {
            snprintf(ctx->err, sizeof(ctx->err), "aux tensor '%s' is already declared differently",
                     name);
            return -1;
        }
        return i;
    }
    kpt_aux_decl d;
    memset(&d, 0, sizeof(d));
    snprintf(d.name, sizeof(d.name), "%s", name);
    d.dtype = KPT_DTYPE_I32;
    d.rank = 2;
    d.dims[0] = KPT_DIM_B;
    d.dims[1] = len_dim;
    d.fill = KPT_FILL_SEGMENTS;
    return kpt_pattern_add_aux(ctx->p, &d, ctx->err, sizeof(ctx->err));
}

static bool build_document(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    int dq = doc_aux(ctx, "doc_q", KPT_DIM_SQ);
    int dkv = dq < 0 ? -1 : doc_aux(ctx, "doc_kv", KPT_DIM_SKV);
    if (dkv < 0)
        return false;
    kpt_ir_ref b = VAR(B), q = VAR(Q), k = VAR(K);
    kpt_ir_ref iq[2] = {b, q}, ik[2] = {b, k};
    kpt_ir_ref lq = kpt_ir_load(G, (uint32_t)dq, 2, iq);
    kpt_ir_ref lk = kpt_ir_load(G, (uint32_t)dkv, 2, ik);
    kpt_build_add_mask(ctx, BIN(EQ, lq, lk));
    return !G->failed;
}

double kpt_alibi_slope(int h, int hq)
{
    int m = 1;
    while (m * 2 <= hq)
        m *= 2;
    if (h < m)
        return pow(2.0, -8.0 * (h + 1) / m);
    return pow(2.0, -4.0 * (2 * (h - m) + 1) / m);
}

kpt_ir_ref kpt_build_alibi_slope(kpt_ir_graph *g)
{
    /* m = 2^floor(log2(hq)); heads below m take 2^(-8(h+1)/m), the rest take the odd terms of
     * the 2m sequence: 2^(-8(2(h-m)+1)/(2m)). Folds to constants once hq is known. One builder
     * call per statement, so the node order does not depend on argument evaluation order. */
    kpt_ir_ref two = kpt_ir_const_f32(g, 2.0f);
    kpt_ir_ref one = kpt_ir_const_i32(g, 1);
    kpt_ir_ref h = kpt_ir_var(g, KPT_IR_H);
    kpt_ir_ref hq = kpt_ir_var(g, KPT_IR_HQ);
    kpt_ir_ref lg = kpt_ir_unop(g, KPT_IR_ILOG2, hq);
    kpt_ir_ref lgf = kpt_ir_unop(g, KPT_IR_TO_F32, lg);
    kpt_ir_ref mf = kpt_ir_binop(g, KPT_IR_POW, two, lgf);
    kpt_ir_ref mi = kpt_ir_unop(g, KPT_IR_TO_I32, mf);
    /* low heads: -8 (h + 1) / m */
    kpt_ir_ref h1 = kpt_ir_binop(g, KPT_IR_ADD, h, one);
    kpt_ir_ref h1f = kpt_ir_unop(g, KPT_IR_TO_F32, h1);
    kpt_ir_ref m8 = kpt_ir_const_f32(g, -8.0f);
    kpt_ir_ref lo_num = kpt_ir_binop(g, KPT_IR_MUL, m8, h1f);
    kpt_ir_ref e_lo = kpt_ir_binop(g, KPT_IR_DIV, lo_num, mf);
    /* high heads: -4 (2 (h - m) + 1) / m */
    kpt_ir_ref hm = kpt_ir_binop(g, KPT_IR_SUB, h, mi);
    kpt_ir_ref c2 = kpt_ir_const_i32(g, 2);
    kpt_ir_ref hm2 = kpt_ir_binop(g, KPT_IR_MUL, c2, hm);
    kpt_ir_ref odd = kpt_ir_binop(g, KPT_IR_ADD, hm2, one);
    kpt_ir_ref oddf = kpt_ir_unop(g, KPT_IR_TO_F32, odd);
    kpt_ir_ref m4 = kpt_ir_const_f32(g, -4.0f);
    kpt_ir_ref hi_num = kpt_ir_binop(g, KPT_IR_MUL, m4, oddf);
    kpt_ir_ref e_hi = kpt_ir_binop(g, KPT_IR_DIV, hi_num, mf);
    kpt_ir_ref low = kpt_ir_binop(g, KPT_IR_LT, h, mi);
    kpt_ir_ref e = kpt_ir_select(g, low, e_lo, e_hi);
    return kpt_ir_binop(g, KPT_IR_POW, two, e);
}

static bool build_alibi(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref dist = kpt_ir_unop(G, KPT_IR_TO_F32, BIN(SUB, k, q));
    kpt_ir_ref slope = kpt_build_alibi_slope(G);
    ctx->score = BIN(ADD, ctx->score, BIN(MUL, slope, dist));
    return !G->failed;
}

static bool build_softcap(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref c = a[0].ref;
    kpt_ir_ref t = kpt_ir_unop(G, KPT_IR_TANH, BIN(DIV, ctx->score, c));
    ctx->score = BIN(MUL, c, t);
    return !G->failed;
}

#define P_INT(n, lo) {n, KPT_PARAM_INT, lo, false}
#define P_POS(n) {n, KPT_PARAM_FLOAT, 0, true}

/* One row per term: {name, signature, meaning}, example, scalar example, params, builder. */
const kpt_builtin kpt_builtins[] = {
    {{"full", "full", "no mask"}, "full", NULL, 0, {{0}}, build_full},
    {{"causal", "causal", "q >= k (top-left aligned)"}, "causal", NULL, 0, {{0}}, build_causal},
    {{"causal_bottom_right", "causal_bottom_right", "q + skv - sq >= k (decoding with a KV cache)"},
     "causal_bottom_right", NULL, 0, {{0}}, build_causal_br},
    {{"sliding_window", "sliding_window(W)", "q >= k and q - k < W"},
     "sliding_window(1024)", "sliding_window($w=256)", 1, {P_INT("W", 1)}, build_sliding_window},
    {{"local", "local(L, R)", "k - q <= R and q - k <= L (bidirectional band)"},
     "local(64, 32)", "local($l=64, $r=32)", 2, {P_INT("L", 0), P_INT("R", 0)}, build_local},
    {{"chunked", "chunked(C)", "q // C == k // C"},
     "chunked(128)", "chunked($c=128)", 1, {P_INT("C", 1)}, build_chunked},
    {{"prefix_lm", "prefix_lm(P)", "k < P or q >= k"},
     "prefix_lm(100)", "prefix_lm($p=100)", 1, {P_INT("P", 0)}, build_prefix_lm},
    {{"document", "document", "doc_q[b][q] == doc_kv[b][k] (aux i32 tensors [B, Sq], [B, Skv])"},
     "document", NULL, 0, {{0}}, build_document},
    {{"alibi", "alibi", "s + slope(h) * (k - q), the ALiBi paper's slopes for hq heads"},
     "alibi", NULL, 0, {{0}}, build_alibi},
    {{"softcap", "softcap(C)", "C * tanh(s / C)"},
     "softcap(30)", "softcap($c=30)", 1, {P_POS("C")}, build_softcap},
};
const int kpt_num_builtins = (int)(sizeof(kpt_builtins) / sizeof(kpt_builtins[0]));

const kpt_builtin *kpt_builtin_find(const char *name, size_t len)
{
    for (int i = 0; i < kpt_num_builtins; i++)
        if (strlen(kpt_builtins[i].info.name) == len &&
            memcmp(kpt_builtins[i].info.name, name, len) == 0)
            return &kpt_builtins[i];
    return NULL;
}

int kpt_builtin_count(void)
{
    return kpt_num_builtins;
}

const kpt_builtin_info *kpt_builtin_get(int index)
{
    return index >= 0 && index < kpt_num_builtins ? &kpt_builtins[index].info : NULL;
}
