/* The CPU reference: hand-checked cases, softmax sums, GQA, document+causal against an explicit
 * mask, fully masked rows, input rounding, layouts, Dqk != Dv, and argument validation. */
#include "tests/testutil.h"

#include <kpt/reference.h>

#include "base/numeric.h"

typedef struct problem {
    int64_t B, Hq, Hkv, Sq, Skv, Dqk, Dv;
    double *q, *k, *v, *o, *lse;
} problem;

static void problem_init(problem *pr, uint64_t seed)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, seed);
    size_t nq = (size_t)(pr->B * pr->Hq * pr->Sq * pr->Dqk);
    size_t nk = (size_t)(pr->B * pr->Hkv * pr->Skv * pr->Dqk);
    size_t nv = (size_t)(pr->B * pr->Hkv * pr->Skv * pr->Dv);
    size_t no = (size_t)(pr->B * pr->Hq * pr->Sq * pr->Dv);
    pr->q = malloc(nq * sizeof(double));
    pr->k = malloc(nk * sizeof(double));
    pr->v = malloc(nv * sizeof(double));
    pr->o = malloc(no * sizeof(double));
    pr->lse = malloc((size_t)(pr->B * pr->Hq * pr->Sq) * sizeof(double));
    for (size_t i = 0; i < nq; i++) pr->q[i] = kpt_rng_normal(&rng);
    for (size_t i = 0; i < nk; i++) pr->k[i] = kpt_rng_normal(&rng);
    for (size_t i = 0; i < nv; i++) pr->v[i] = kpt_rng_normal(&rng);
    /* poison: every output must be overwritten */
    for (size_t i = 0; i < no; i++) pr->o[i] = NAN;
    for (int64_t i = 0; i < pr->B * pr->Hq * pr->Sq; i++) pr->lse[i] = NAN;
}

static void problem_free(problem *pr)
{
    free(pr->q);
    free(pr->k);
    free(pr->v);
    free(pr->o);
    free(pr->lse);
}

static kpt_tensor t4(void *data, kpt_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return kpt_tensor_contiguous(data, dt, 4, (int64_t[]){b, h, s, d});
}

static kpt_attention_args args_of(problem *pr)
{
    kpt_attention_args a = {
        .q = t4(pr->q, KPT_DTYPE_F64, pr->B, pr->Hq, pr->Sq, pr->Dqk),
        .k = t4(pr->k, KPT_DTYPE_F64, pr->B, pr->Hkv, pr->Skv, pr->Dqk),
        .v = t4(pr->v, KPT_DTYPE_F64, pr->B, pr->Hkv, pr->Skv, pr->Dv),
        .o = t4(pr->o, KPT_DTYPE_F64, pr->B, pr->Hq, pr->Sq, pr->Dv),
        .lse = kpt_tensor_contiguous(pr->lse, KPT_DTYPE_F64, 3, (int64_t[]){pr->B, pr->Hq, pr->Sq}),
    };
    return a;
}

static kpt_pattern *parse(const char *text)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    if (kpt_pattern_parse(text, &p, &d) != KPT_OK)
        fail_msg("%s", d.message);
    return p;
}

static void run(const kpt_pattern *p, const kpt_attention_args *a)
{
    kpt_diag d = {0};
    if (kpt_reference_attention(p, a, &d) != KPT_OK)
        fail_msg("%s", d.message);
}

static void test_hand_checked(void **state)
{
    (void)state;
    /* one query, two keys, D = 1, scale 1: scores 0 and ln 3 -> weights 1/4, 3/4 */
    double q[1] = {1}, k[2] = {0, log(3.0)}, v[2] = {4, 8}, o[1] = {NAN}, lse[1] = {NAN};
    kpt_attention_args a = {
        .q = t4(q, KPT_DTYPE_F64, 1, 1, 1, 1), .k = t4(k, KPT_DTYPE_F64, 1, 1, 2, 1),
        .v = t4(v, KPT_DTYPE_F64, 1, 1, 2, 1), .o = t4(o, KPT_DTYPE_F64, 1, 1, 1, 1),
        .lse = kpt_tensor_contiguous(lse, KPT_DTYPE_F64, 3, (int64_t[]){1, 1, 1}), .scale = 1,
    };
    kpt_pattern *p = parse("full");
    run(p, &a);
    assert_true(fabs(o[0] - 7.0) < 1e-14);
    assert_true(fabs(lse[0] - log(4.0)) < 1e-14);
    kpt_pattern_destroy(&p);
    /* causal on one query row q=0: only key 0 -> O = 4, LSE = 0 */
    p = parse("causal");
    run(p, &a);
    assert_true(o[0] == 4.0);
    assert_true(lse[0] == 0.0);
    kpt_pattern_destroy(&p);
    /* softcap(1) turns ln 3 into tanh(ln 3) = 0.8 -> weights 1 : e^0.8 */
    p = parse("softcap(1)");
    run(p, &a);
    double w = exp(0.8);
    assert_true(fabs(o[0] - (4 + 8 * w) / (1 + w)) < 1e-7);
    kpt_pattern_destroy(&p);
    /* alibi with one head: slope 2^-8, key 1 is 1 away: s1 = ln 3 + 1/256 */
    p = parse("alibi");
    run(p, &a);
    double s1 = log(3.0) + 1.0 / 256;
    assert_true(fabs(lse[0] - log(1 + exp(s1))) < 1e-6); /* the score mod runs in f32 */
    kpt_pattern_destroy(&p);
}

/* With V the identity, O's rows are the softmax weights: they sum to 1 and vanish where masked. */
static void test_rows_sum_to_one(void **state)
{
    (void)state;
    const char *pats[] = {"full", "causal", "sliding_window(5)+alibi", "prefix_lm(7)+softcap(4)",
                          "chunked(6)", "local(2, 9)"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        problem pr = {.B = 2, .Hq = 3, .Hkv = 1, .Sq = 20, .Skv = 20, .Dqk = 8, .Dv = 20};
        problem_init(&pr, 5 + i);
        for (int64_t b = 0; b < pr.B; b++)
            for (int64_t k = 0; k < pr.Skv; k++)
                for (int64_t d = 0; d < pr.Dv; d++)
                    pr.v[(b * pr.Skv + k) * pr.Dv + d] = k == d;
        kpt_pattern *p = parse(pats[i]);
        kpt_attention_args a = args_of(&pr);
        run(p, &a);
        for (int64_t r = 0; r < pr.B * pr.Hq * pr.Sq; r++) {
            double sum = 0;
            int64_t q = r % pr.Sq;
            for (int64_t d = 0; d < pr.Dv; d++) {
                double wgt = pr.o[r * pr.Dv + d];
                assert_true(wgt >= 0);
                sum += wgt;
                kpt_ir_env env = {.q = (int32_t)q, .k = (int32_t)d, .sq = 20, .skv = 20, .hq = 3};
                kpt_ir_value keep = {.i = 1};
                if (p->mask)
                    assert_true(kpt_ir_eval(&p->g, p->mask, &env, &keep));
                if (!keep.i)
                    assert_true(wgt == 0);
            }
            assert_true(fabs(sum - 1) < 1e-12);
        }
        kpt_pattern_destroy(&p);
        problem_free(&pr);
    }
}

static void test_gqa_equals_repeated(void **state)
{
    (void)state;
    problem g = {.B = 2, .Hq = 6, .Hkv = 2, .Sq = 13, .Skv = 17, .Dqk = 8, .Dv = 4};
    problem_init(&g, 11);
    problem r = g;
    r.Hkv = 6;
    problem_init(&r, 11);
    memcpy(r.q, g.q, (size_t)(g.B * g.Hq * g.Sq * g.Dqk) * sizeof(double));
    for (int64_t b = 0; b < g.B; b++)
        for (int64_t h = 0; h < 6; h++) {
            int64_t hk = h / 3;
            memcpy(r.k + ((b * 6 + h) * g.Skv) * g.Dqk, g.k + ((b * 2 + hk) * g.Skv) * g.Dqk,
                   (size_t)(g.Skv * g.Dqk) * sizeof(double));
            memcpy(r.v + ((b * 6 + h) * g.Skv) * g.Dv, g.v + ((b * 2 + hk) * g.Skv) * g.Dv,
                   (size_t)(g.Skv * g.Dv) * sizeof(double));
        }
    kpt_pattern *p = parse("causal_bottom_right+alibi");
    kpt_attention_args ag = args_of(&g), ar = args_of(&r);
    run(p, &ag);
    run(p, &ar);
    assert_memory_equal(g.o, r.o, (size_t)(g.B * g.Hq * g.Sq * g.Dv) * sizeof(double));
    assert_memory_equal(g.lse, r.lse, (size_t)(g.B * g.Hq * g.Sq) * sizeof(double));
    kpt_pattern_destroy(&p);
    problem_free(&g);
    problem_free(&r);
}

/* An independent naive attention with an explicit mask array. */
static void naive(const problem *pr, const uint8_t *mask /* [B][Sq][Skv] */, double *o, double *lse)
{
    double scale = 1 / sqrt((double)pr->Dqk);
    for (int64_t b = 0; b < pr->B; b++)
        for (int64_t h = 0; h < pr->Hq; h++)
            for (int64_t q = 0; q < pr->Sq; q++) {
                int64_t hk = h / (pr->Hq / pr->Hkv);
                double m = -INFINITY, *s = malloc((size_t)pr->Skv * sizeof(double));
                for (int64_t k = 0; k < pr->Skv; k++) {
                    double x = 0;
                    for (int64_t d = 0; d < pr->Dqk; d++)
                        x += pr->q[((b * pr->Hq + h) * pr->Sq + q) * pr->Dqk + d] *
                             pr->k[((b * pr->Hkv + hk) * pr->Skv + k) * pr->Dqk + d];
                    s[k] = x * scale;
                    if (mask[(b * pr->Sq + q) * pr->Skv + k] && s[k] > m)
                        m = s[k];
                }
                double sum = 0;
                double *orow = o + ((b * pr->Hq + h) * pr->Sq + q) * pr->Dv;
                for (int64_t d = 0; d < pr->Dv; d++)
                    orow[d] = 0;
                for (int64_t k = 0; k < pr->Skv; k++) {
                    if (!mask[(b * pr->Sq + q) * pr->Skv + k])
                        continue;
                    double w = exp(s[k] - m);
                    sum += w;
                    for (int64_t d = 0; d < pr->Dv; d++)
                        orow[d] += w * pr->v[((b * pr->Hkv + hk) * pr->Skv + k) * pr->Dv + d];
                }
                for (int64_t d = 0; d < pr->Dv; d++)
                    orow[d] = sum > 0 ? orow[d] / sum : 0;
                lse[(b * pr->Hq + h) * pr->Sq + q] = sum > 0 ? m + log(sum) : -INFINITY;
                free(s);
            }
}

static void test_document_causal_explicit(void **state)
{
    (void)state;
    problem pr = {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 37, .Skv = 37, .Dqk = 16, .Dv = 8};
    problem_init(&pr, 21);
    int32_t doc[2][37];
    uint8_t mask[2 * 37 * 37];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 37; i++)
            doc[b][i] = b == 0 ? i / 10 : (i < 3 ? 0 : i < 30 ? 1 : 2);
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 37; q++)
            for (int k = 0; k < 37; k++)
                mask[(b * 37 + q) * 37 + k] = doc[b][q] == doc[b][k] && q >= k;
    double *o = malloc((size_t)(pr.B * pr.Hq * pr.Sq * pr.Dv) * sizeof(double));
    double lse[2 * 4 * 37];
    naive(&pr, mask, o, lse);
    kpt_pattern *p = parse("document+causal");
    kpt_attention_args a = args_of(&pr);
    kpt_aux_tensor aux[2] = {
        {"doc_q", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){2, 37})},
        {"doc_kv", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){2, 37})},
    };
    a.aux = aux;
    a.num_aux = 2;
    run(p, &a);
    for (int64_t i = 0; i < pr.B * pr.Hq * pr.Sq * pr.Dv; i++)
        assert_true(fabs(o[i] - pr.o[i]) < 1e-12);
    for (int64_t i = 0; i < pr.B * pr.Hq * pr.Sq; i++)
        assert_true(fabs(lse[i] - pr.lse[i]) < 1e-12);
    /* the same ids for every batch row through a batch stride of 0 */
    aux[0].tensor.stride[0] = 0;
    aux[1].tensor.stride[0] = 0;
    for (int q = 0; q < 37; q++)
        for (int k = 0; k < 37; k++)
            mask[(37 + q) * 37 + k] = mask[q * 37 + k];
    naive(&pr, mask, o, lse);
    run(p, &a);
    for (int64_t i = 0; i < pr.B * pr.Hq * pr.Sq * pr.Dv; i++)
        assert_true(fabs(o[i] - pr.o[i]) < 1e-12);
    free(o);
    kpt_pattern_destroy(&p);
    problem_free(&pr);
}

/* The pattern's mask evaluated pair by pair with the IR interpreter: [B][Sq][Skv]. */
static uint8_t *mask_of(const kpt_pattern *p, const problem *pr)
{
    uint8_t *m = malloc((size_t)(pr->B * pr->Sq * pr->Skv));
    for (int64_t b = 0; b < pr->B; b++)
        for (int64_t q = 0; q < pr->Sq; q++)
            for (int64_t k = 0; k < pr->Skv; k++) {
                kpt_ir_env e = {.b = (int32_t)b, .q = (int32_t)q, .k = (int32_t)k,
                                .sq = (int32_t)pr->Sq, .skv = (int32_t)pr->Skv,
                                .hq = (int32_t)pr->Hq};
                kpt_ir_value v = {.i = 1};
                if (p->mask)
                    assert_true(kpt_ir_eval(&p->g, p->mask, &e, &v));
                m[(b * pr->Sq + q) * pr->Skv + k] = v.i != 0;
            }
    return m;
}

/* Key tiles skipped by the mask analysis and rows split over threads give what evaluating
 * every pair on one thread gives: against the naive attention, and bit for bit between thread
 * counts (B = 1 with one kv head: every core gets rows of the same pair). */
static void test_skipping_and_threads(void **state)
{
    (void)state;
    static const char *const patterns[] = {"causal", "sliding_window(40)", "prefix_lm(70)",
                                           "local(20, 90)", "chunked(64)", "causal_bottom_right"};
    problem pr = {.B = 1, .Hq = 4, .Hkv = 1, .Sq = 300, .Skv = 333, .Dqk = 16, .Dv = 16};
    problem_init(&pr, 77);
    size_t no = (size_t)(pr.B * pr.Hq * pr.Sq * pr.Dv), nl = (size_t)(pr.B * pr.Hq * pr.Sq);
    double *o = malloc(no * sizeof(double)), *lse = malloc(nl * sizeof(double));
    double *o1 = malloc(no * sizeof(double)), *lse1 = malloc(nl * sizeof(double));
    for (size_t i = 0; i < sizeof(patterns) / sizeof(patterns[0]); i++) {
        kpt_pattern *p = parse(patterns[i]);
        uint8_t *mask = mask_of(p, &pr);
        naive(&pr, mask, o, lse);
        kpt_attention_args a = args_of(&pr);
        setenv("KPT_REFERENCE_THREADS", "1", 1);
        run(p, &a);
        memcpy(o1, pr.o, no * sizeof(double));
        memcpy(lse1, pr.lse, nl * sizeof(double));
        for (size_t j = 0; j < no; j++)
            if (!(fabs(o[j] - pr.o[j]) < 1e-12))
                fail_msg("%s: o[%zu] = %g, naive %g", patterns[i], j, pr.o[j], o[j]);
        for (size_t j = 0; j < nl; j++)
            assert_true(lse[j] == pr.lse[j] || fabs(lse[j] - pr.lse[j]) < 1e-12);
        setenv("KPT_REFERENCE_THREADS", "7", 1);
        for (size_t j = 0; j < no; j++)
            pr.o[j] = NAN;
        run(p, &a);
        assert_memory_equal(o1, pr.o, no * sizeof(double));
        assert_memory_equal(lse1, pr.lse, nl * sizeof(double));
        free(mask);
        kpt_pattern_destroy(&p);
    }
    unsetenv("KPT_REFERENCE_THREADS");
    free(o);
    free(lse);
    free(o1);
    free(lse1);
    problem_free(&pr);
}

static void test_fully_masked_rows(void **state)
{
    (void)state;
    /* bottom-right causal with Sq > Skv: the first Sq - Skv rows see nothing */
    problem pr = {.B = 1, .Hq = 2, .Hkv = 2, .Sq = 10, .Skv = 4, .Dqk = 8, .Dv = 8};
    problem_init(&pr, 3);
    kpt_pattern *p = parse("causal_bottom_right");
    kpt_attention_args a = args_of(&pr);
    run(p, &a);
    for (int64_t h = 0; h < 2; h++)
        for (int64_t q = 0; q < 10; q++) {
            double l = pr.lse[h * 10 + q];
            for (int64_t d = 0; d < 8; d++) {
                double v = pr.o[(h * 10 + q) * 8 + d];
                if (q < 6)
                    assert_true(v == 0 && !signbit(v));
                else
                    assert_true(isfinite(v));
            }
            assert_true(q < 6 ? l == -INFINITY : isfinite(l));
        }
    kpt_pattern_destroy(&p);
    /* a window of $w = 0 keeps nothing anywhere: all zeros, never NaN */
    p = parse("sliding_window($w)");
    kpt_scalar_value sv = {"w", 0};
    a.scalars = &sv;
    a.num_scalars = 1;
    run(p, &a);
    for (int64_t i = 0; i < 2 * 10 * 8; i++)
        assert_true(pr.o[i] == 0);
    kpt_pattern_destroy(&p);
    problem_free(&pr);
}

/* f16/bf16 inputs give exactly the result of f64 inputs rounded through that format. */
static void test_input_rounding(void **state)
{
    (void)state;
    kpt_dtype types[2] = {KPT_DTYPE_BF16, KPT_DTYPE_F16};
    for (int t = 0; t < 2; t++) {
        problem pr = {.B = 1, .Hq = 2, .Hkv = 1, .Sq = 9, .Skv = 11, .Dqk = 8, .Dv = 8};
        problem_init(&pr, 77);
        size_t nq = 2 * 9 * 8, nk = 11 * 8;
        uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2);
        size_t changed = 0;
        for (size_t i = 0; i < nq; i++) {
            kpt_store_double(q16, types[t], (int64_t)i, pr.q[i]);
            double r = kpt_load_as_double(q16, types[t], (int64_t)i);
            changed += r != pr.q[i];
            pr.q[i] = r;
        }
        for (size_t i = 0; i < nk; i++) {
            kpt_store_double(k16, types[t], (int64_t)i, pr.k[i]);
            pr.k[i] = kpt_load_as_double(k16, types[t], (int64_t)i);
            kpt_store_double(v16, types[t], (int64_t)i, pr.v[i]);
            pr.v[i] = kpt_load_as_double(v16, types[t], (int64_t)i);
        }
        assert_true(changed > nq / 2); /* the inputs really were rounded */
        kpt_pattern *p = parse("causal+softcap(5)");
        kpt_attention_args a = args_of(&pr);
        run(p, &a);
        double *o_ref = malloc(2 * 9 * 8 * sizeof(double));
        memcpy(o_ref, pr.o, 2 * 9 * 8 * sizeof(double));
        a.q = t4(q16, types[t], 1, 2, 9, 8);
        a.k = t4(k16, types[t], 1, 1, 11, 8);
        a.v = t4(v16, types[t], 1, 1, 11, 8);
        for (int i = 0; i < 2 * 9 * 8; i++)
            pr.o[i] = NAN;
        run(p, &a);
        assert_memory_equal(o_ref, pr.o, 2 * 9 * 8 * sizeof(double));
        /* f16 and bf16 outputs are the f64 result rounded */
        uint16_t o16[2 * 9 * 8];
        a.o = t4(o16, types[t], 1, 2, 9, 8);
        run(p, &a);
        for (int i = 0; i < 2 * 9 * 8; i++)
            assert_int_equal(o16[i], types[t] == KPT_DTYPE_BF16 ? kpt_f32_to_bf16((float)o_ref[i])
                                                                : kpt_f32_to_f16((float)o_ref[i]));
        free(o_ref);
        free(q16);
        free(k16);
        free(v16);
        kpt_pattern_destroy(&p);
        problem_free(&pr);
    }
}

/* [B, S, H, D] through strides gives the same numbers as [B, H, S, D]; Dqk != Dv. */
static void test_layouts_and_dv(void **state)
{
    (void)state;
    problem pr = {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 7, .Skv = 12, .Dqk = 16, .Dv = 8};
    problem_init(&pr, 99);
    kpt_pattern *p = parse("local(2, 3)+alibi");
    kpt_attention_args a = args_of(&pr);
    run(p, &a);
    /* transpose everything into BSHD */
    problem t = pr;
    problem_init(&t, 1);
#define TR(dst, src, H, S, D)                                                                      \
    for (int64_t b = 0; b < pr.B; b++)                                                             \
        for (int64_t h = 0; h < H; h++)                                                            \
            for (int64_t s = 0; s < S; s++)                                                        \
                for (int64_t d = 0; d < D; d++)                                                    \
                    dst[((b * S + s) * H + h) * D + d] = src[((b * H + h) * S + s) * D + d];
    TR(t.q, pr.q, pr.Hq, pr.Sq, pr.Dqk);
    TR(t.k, pr.k, pr.Hkv, pr.Skv, pr.Dqk);
    TR(t.v, pr.v, pr.Hkv, pr.Skv, pr.Dv);
    kpt_attention_args bt = args_of(&t);
    kpt_tensor *ts[4] = {&bt.q, &bt.k, &bt.v, &bt.o};
    for (int i = 0; i < 4; i++) {
        kpt_tensor *x = ts[i];
        int64_t H = x->shape[1], S = x->shape[2], D = x->shape[3];
        x->stride[0] = S * H * D;
        x->stride[1] = D;
        x->stride[2] = H * D;
        x->stride[3] = 1;
    }
    run(p, &bt);
    double *o2 = malloc((size_t)(pr.B * pr.Hq * pr.Sq * pr.Dv) * sizeof(double));
    TR(o2, pr.o, pr.Hq, pr.Sq, pr.Dv);
#undef TR
    assert_memory_equal(o2, t.o, (size_t)(pr.B * pr.Hq * pr.Sq * pr.Dv) * sizeof(double));
    free(o2);
    kpt_pattern_destroy(&p);
    problem_free(&pr);
    problem_free(&t);
}

static void expect_bad(const kpt_pattern *p, kpt_attention_args a, kpt_status want, const char *needle,
                       const double *o, size_t n)
{
    kpt_diag d = {0};
    kpt_status st = kpt_reference_attention(p, &a, &d);
    if (st != want || !strstr(d.message, needle))
        fail_msg("got %d '%s', wanted %d '%s'", st, d.message, want, needle);
    for (size_t i = 0; i < n; i++)
        assert_true(isnan(o[i])); /* untouched */
}

static void test_validation(void **state)
{
    (void)state;
    problem pr = {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 5, .Skv = 6, .Dqk = 8, .Dv = 8};
    problem_init(&pr, 1);
    size_t no = 4 * 5 * 8;
    kpt_pattern *p = parse("sliding_window($w)+document");
    int32_t doc[6] = {0};
    kpt_aux_tensor aux[2] = {{"doc_q", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){1, 5})},
                             {"doc_kv", kpt_tensor_contiguous(doc, KPT_DTYPE_I32, 2, (int64_t[]){1, 6})}};
    kpt_scalar_value sv = {"w", 3};
    kpt_attention_args good = args_of(&pr);
    good.aux = aux;
    good.num_aux = 2;
    good.scalars = &sv;
    good.num_scalars = 1;
    kpt_attention_args a = good;
    a.k.shape[1] = 3;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "kv heads differs: k has 3, v has 2", pr.o, no);
    a = good;
    a.q.shape[1] = 3;
    a.o.shape[1] = 3;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "query heads (3) must be a multiple of kv heads (2)", pr.o, no);
    a = good;
    a.q.dtype = KPT_DTYPE_I32;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "tensor q has dtype i32", pr.o, no);
    a = good;
    a.v.data = NULL;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "tensor v has no data", pr.o, no);
    a = good;
    a.k.rank = 3;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "tensor k must have rank 4, not 3", pr.o, no);
    a = good;
    a.num_scalars = 0;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "runtime scalar '$w' has no value and no default", pr.o, no);
    kpt_scalar_value bad_sv[2] = {{"w", 3}, {"x", 1}};
    a = good;
    a.scalars = bad_sv;
    a.num_scalars = 2;
    expect_bad(p, a, KPT_ERR_NOT_FOUND, "unknown runtime scalar '$x'", pr.o, no);
    kpt_scalar_value frac = {"w", 2.5};
    a = good;
    a.scalars = &frac;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "is i32 but the value 2.5", pr.o, no);
    a = good;
    a.num_aux = 1;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "needs aux tensor 'doc_kv'", pr.o, no);
    kpt_aux_tensor wrong[2] = {aux[0], aux[1]};
    wrong[1].tensor.dtype = KPT_DTYPE_F32;
    a = good;
    a.aux = wrong;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "aux tensor 'doc_kv' must be i32, not f32", pr.o, no);
    wrong[1] = aux[1];
    wrong[1].tensor.shape[1] = 5;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "aux tensor 'doc_kv': dimension 1 has size 5, expected 6 (skv)", pr.o, no);
    wrong[1] = aux[1];
    wrong[1].name = "docs";
    expect_bad(p, a, KPT_ERR_NOT_FOUND, "unknown aux tensor 'docs'", pr.o, no);
    a = good;
    a.scale = INFINITY;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "scale is not finite", pr.o, no);
    a = good;
    a.scale = -1e-31;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "scale -1e-31 is out of range", pr.o, no);
    a = good;
    a.lse.shape[2] = 4;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "query length differs: q has 5, lse has 4", pr.o, no);
    /* negative strides are refused (issue: they crashed the reference), on tensors and aux */
    a = good;
    a.k.stride[2] = -a.k.stride[2];
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "tensor k: stride 2 is -8; strides must be >= 0", pr.o, no);
    wrong[1] = aux[1];
    wrong[1].tensor.stride[1] = -1;
    a = good;
    a.aux = wrong;
    expect_bad(p, a, KPT_ERR_INVALID_ARGUMENT, "aux tensor 'doc_kv': stride 1 is -1", pr.o, no);
    /* stride-0 K and V of 2^31 - 1 keys at D = 2^30: the scratch size would wrap */
    a = good;
    a.k.shape[2] = a.v.shape[2] = INT32_MAX;
    a.k.shape[3] = a.q.shape[3] = 1 << 30;
    a.v.shape[3] = a.o.shape[3] = 1 << 30;
    for (int i = 0; i < 4; i++)
        a.q.stride[i] = a.k.stride[i] = a.v.stride[i] = a.o.stride[i] = 0;
    a.num_aux = 0;
    a.num_scalars = 0;
    kpt_pattern *full = parse("full");
    expect_bad(full, a, KPT_ERR_LIMIT, "Skv x (Dqk + Dv) = 4611686016279904256 is past its limit", pr.o, no);
    kpt_pattern_destroy(&full);
    kpt_diag d = {0};
    assert_int_equal(kpt_reference_attention(NULL, &good, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_int_equal(kpt_reference_attention(p, NULL, NULL), KPT_ERR_INVALID_ARGUMENT);
    /* and the good call works and overwrites every poisoned output */
    run(p, &good);
    for (size_t i = 0; i < no; i++)
        assert_false(isnan(pr.o[i]));
    kpt_pattern_destroy(&p);
    problem_free(&pr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_checked),      cmocka_unit_test(test_rows_sum_to_one),
        cmocka_unit_test(test_gqa_equals_repeated), cmocka_unit_test(test_document_causal_explicit),
        cmocka_unit_test(test_skipping_and_threads),
        cmocka_unit_test(test_fully_masked_rows), cmocka_unit_test(test_input_rounding),
        cmocka_unit_test(test_layouts_and_dv),    cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
