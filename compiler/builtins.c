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
    kpt_build_add_mask(ctx, BIN(GE, VAR(Q), VAR(K)));
    return !G->failed;
}

static bool build_causal_br(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    /* q + skv - sq >= k: the last query sees the last key */
    kpt_ir_ref shift = BIN(SUB, VAR(SKV), VAR(SQ));
    kpt_build_add_mask(ctx, BIN(GE, BIN(ADD, VAR(Q), shift), VAR(K)));
    return !G->failed;
}

static bool build_sliding_window(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_build_add_mask(ctx, BIN(AND, BIN(GE, q, k), BIN(LT, BIN(SUB, q, k), a[0].ref)));
    return !G->failed;
}

static bool build_local(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_ir_ref left = BIN(LE, BIN(SUB, q, k), a[0].ref);
    kpt_ir_ref right = BIN(LE, BIN(SUB, k, q), a[1].ref);
    kpt_build_add_mask(ctx, BIN(AND, right, left));
    return !G->failed;
}

static bool build_chunked(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_build_add_mask(ctx, BIN(EQ, BIN(IDIV, VAR(Q), a[0].ref), BIN(IDIV, VAR(K), a[0].ref)));
    return !G->failed;
}

static bool build_prefix_lm(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref q = VAR(Q), k = VAR(K);
    kpt_build_add_mask(ctx, BIN(OR, BIN(LT, k, a[0].ref), BIN(GE, q, k)));
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
    kpt_ir_ref iq[2] = {VAR(B), VAR(Q)};
    kpt_ir_ref ik[2] = {VAR(B), VAR(K)};
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
     * the 2m sequence: 2^(-8(2(h-m)+1)/(2m)). Folds to constants once hq is known. */
    kpt_ir_ref two = kpt_ir_const_f32(g, 2.0f);
    kpt_ir_ref one_i = kpt_ir_const_i32(g, 1);
    kpt_ir_ref h = kpt_ir_var(g, KPT_IR_H);
    kpt_ir_ref lg = kpt_ir_unop(g, KPT_IR_ILOG2, kpt_ir_var(g, KPT_IR_HQ));
    kpt_ir_ref mf = kpt_ir_binop(g, KPT_IR_POW, two, kpt_ir_unop(g, KPT_IR_TO_F32, lg));
    kpt_ir_ref mi = kpt_ir_unop(g, KPT_IR_TO_I32, mf);
    kpt_ir_ref hp1 = kpt_ir_unop(g, KPT_IR_TO_F32, kpt_ir_binop(g, KPT_IR_ADD, h, one_i));
    kpt_ir_ref e_lo = kpt_ir_binop(g, KPT_IR_DIV,
                                   kpt_ir_binop(g, KPT_IR_MUL, kpt_ir_const_f32(g, -8.0f), hp1), mf);
    kpt_ir_ref odd = kpt_ir_binop(
        g, KPT_IR_ADD,
        kpt_ir_binop(g, KPT_IR_MUL, kpt_ir_const_i32(g, 2), kpt_ir_binop(g, KPT_IR_SUB, h, mi)),
        one_i);
    kpt_ir_ref e_hi = kpt_ir_binop(
        g, KPT_IR_DIV,
        kpt_ir_binop(g, KPT_IR_MUL, kpt_ir_const_f32(g, -4.0f), kpt_ir_unop(g, KPT_IR_TO_F32, odd)),
        mf);
    kpt_ir_ref e = kpt_ir_select(g, kpt_ir_binop(g, KPT_IR_LT, h, mi), e_lo, e_hi);
    return kpt_ir_binop(g, KPT_IR_POW, two, e);
}

static bool build_alibi(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref dist = kpt_ir_unop(G, KPT_IR_TO_F32, BIN(SUB, VAR(K), VAR(Q)));
    ctx->score = BIN(ADD, ctx->score, BIN(MUL, kpt_build_alibi_slope(G), dist));
    return !G->failed;
}

static bool build_softcap(kpt_build_ctx *ctx, const kpt_term_arg *a)
{
    kpt_ir_ref c = a[0].ref;
    ctx->score = BIN(MUL, c, kpt_ir_unop(G, KPT_IR_TANH, BIN(DIV, ctx->score, c)));
    return !G->failed;
}

#define P_INT(n, lo) {n, KPT_PARAM_INT, lo, false}
#define P_POS(n) {n, KPT_PARAM_FLOAT, 0, true}

const kpt_builtin kpt_builtins[] = {
    {{"full", "full", "no mask"}, 0, {{0}}, build_full},
    {{"causal", "causal", "q >= k (top-left aligned)"}, 0, {{0}}, build_causal},
    {{"causal_bottom_right", "causal_bottom_right", "q + skv - sq >= k (decoding with a KV cache)"},
     0, {{0}}, build_causal_br},
    {{"sliding_window", "sliding_window(W)", "q >= k and q - k < W"}, 1, {P_INT("W", 1)},
     build_sliding_window},
    {{"local", "local(L, R)", "k - q <= R and q - k <= L (bidirectional band)"}, 2,
     {P_INT("L", 0), P_INT("R", 0)}, build_local},
    {{"chunked", "chunked(C)", "q // C == k // C"}, 1, {P_INT("C", 1)}, build_chunked},
    {{"prefix_lm", "prefix_lm(P)", "k < P or q >= k"}, 1, {P_INT("P", 0)}, build_prefix_lm},
    {{"document", "document", "doc_q[b][q] == doc_kv[b][k] (aux i32 tensors [B, Sq], [B, Skv])"},
     0, {{0}}, build_document},
    {{"alibi", "alibi", "s + slope(h) * (k - q), the ALiBi paper's slopes for hq heads"}, 0, {{0}},
     build_alibi},
    {{"softcap", "softcap(C)", "C * tanh(s / C)"}, 1, {P_POS("C")}, build_softcap},
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
