/* The serving reference (kpt_reference_paged_attention) against the dense reference: ragged
 * sequences over shuffled pages give, row for row, what kpt_reference_attention gives for each
 * sequence laid out densely with its queries as the last positions; sinks join the
 * denominator; bad calls are refused with a message. */
#include "tests/testutil.h"

#include <kpt/serving.h>

enum { B = 3, HQ = 4, HKV = 2, D = 16, PAGE = 8, MAXP = 16 };
static const int32_t QL[B] = {1, 4, 0}, KVL[B] = {37, 100, 5};

typedef struct paged {
    int32_t cu[B + 1], kv[B], pt[B * MAXP];
    int T, P;
    double *q, *k, *v, *o, *lse;
    float sinks[HQ];
} paged;

static void paged_init(paged *pg, uint64_t seed)
{
    kpt_rng r;
    kpt_rng_seed(&r, seed);
    pg->cu[0] = 0;
    for (int b = 0; b < B; b++) {
        pg->cu[b + 1] = pg->cu[b] + QL[b];
        pg->kv[b] = KVL[b];
    }
    pg->T = pg->cu[B];
    pg->P = B * MAXP;
    /* page j of sequence b is page (b * MAXP + j) * 7 % P: shuffled, never shared */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < MAXP; j++)
            pg->pt[b * MAXP + j] = (b * MAXP + j) * 7 % pg->P;
    size_t nkv = (size_t)pg->P * PAGE * HKV * D;
    pg->q = malloc(sizeof(double) * (size_t)pg->T * HQ * D);
    pg->k = malloc(sizeof(double) * nkv);
    pg->v = malloc(sizeof(double) * nkv);
    pg->o = malloc(sizeof(double) * (size_t)pg->T * HQ * D);
    pg->lse = malloc(sizeof(double) * (size_t)pg->T * HQ);
    for (size_t i = 0; i < (size_t)pg->T * HQ * D; i++)
        pg->q[i] = kpt_rng_normal(&r);
    for (size_t i = 0; i < nkv; i++) {
        pg->k[i] = kpt_rng_normal(&r);
        pg->v[i] = kpt_rng_normal(&r);
    }
    for (int h = 0; h < HQ; h++)
        pg->sinks[h] = (float)kpt_rng_normal(&r);
}

static void paged_free(paged *pg)
{
    free(pg->q);
    free(pg->k);
    free(pg->v);
    free(pg->o);
    free(pg->lse);
}

static kpt_paged_args paged_args(paged *pg, bool sinks)
{
    kpt_paged_args a = {0};
    int64_t q3[3] = {pg->T, HQ, D}, l2[2] = {pg->T, HQ}, c4[4] = {pg->P, PAGE, HKV, D};
    int64_t pt2[2] = {B, MAXP}, cu1[1] = {B + 1}, kv1[1] = {B}, s1[1] = {HQ};
    a.q = kpt_tensor_contiguous(pg->q, KPT_DTYPE_F64, 3, q3);
    a.o = kpt_tensor_contiguous(pg->o, KPT_DTYPE_F64, 3, q3);
    a.lse = kpt_tensor_contiguous(pg->lse, KPT_DTYPE_F64, 2, l2);
    a.k = kpt_tensor_contiguous(pg->k, KPT_DTYPE_F64, 4, c4);
    a.v = kpt_tensor_contiguous(pg->v, KPT_DTYPE_F64, 4, c4);
    a.page_table = kpt_tensor_contiguous(pg->pt, KPT_DTYPE_I32, 2, pt2);
    a.cu_seqlens_q = kpt_tensor_contiguous(pg->cu, KPT_DTYPE_I32, 1, cu1);
    a.kv_lens = kpt_tensor_contiguous(pg->kv, KPT_DTYPE_I32, 1, kv1);
    if (sinks)
        a.sinks = kpt_tensor_contiguous(pg->sinks, KPT_DTYPE_F32, 1, s1);
    return a;
}

/* Sequence b densely ([1, H, kv, D], its queries the last rows, earlier rows zero) through the
 * dense reference; each of its rows compared with the paged result. */
static void check_sequence(const kpt_pattern *p, const paged *pg, int b, bool sinks)
{
    int kv = KVL[b], ql = QL[b];
    double *q = calloc((size_t)HQ * kv * D + 1, sizeof(double));
    double *k = calloc((size_t)HKV * kv * D + 1, sizeof(double));
    double *v = calloc((size_t)HKV * kv * D + 1, sizeof(double));
    double *o = calloc((size_t)HQ * kv * D + 1, sizeof(double));
    double *lse = calloc((size_t)HQ * kv + 1, sizeof(double));
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < ql; i++)
            memcpy(q + ((size_t)h * kv + kv - ql + i) * D,
                   pg->q + ((size_t)(pg->cu[b] + i) * HQ + h) * D, sizeof(double) * D);
    for (int hk = 0; hk < HKV; hk++)
        for (int j = 0; j < kv; j++) {
            int page = pg->pt[b * MAXP + j / PAGE], row = j % PAGE;
            size_t src = (((size_t)page * PAGE + row) * HKV + hk) * D, dst = ((size_t)hk * kv + j) * D;
            memcpy(k + dst, pg->k + src, sizeof(double) * D);
            memcpy(v + dst, pg->v + src, sizeof(double) * D);
        }
    int64_t qs[4] = {1, HQ, kv, D}, ks[4] = {1, HKV, kv, D}, ls[3] = {1, HQ, kv};
    kpt_attention_args a = {.q = kpt_tensor_contiguous(q, KPT_DTYPE_F64, 4, qs),
                            .k = kpt_tensor_contiguous(k, KPT_DTYPE_F64, 4, ks),
                            .v = kpt_tensor_contiguous(v, KPT_DTYPE_F64, 4, ks),
                            .o = kpt_tensor_contiguous(o, KPT_DTYPE_F64, 4, qs),
                            .lse = kpt_tensor_contiguous(lse, KPT_DTYPE_F64, 3, ls)};
    kpt_diag d = {0};
    assert_int_equal(kpt_reference_attention(p, &a, &d), KPT_OK);
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < ql; i++) {
            double l = lse[(size_t)h * kv + kv - ql + i], scale = 1.0;
            if (sinks) { /* the sink joins the denominator */
                double s = pg->sinks[h], m = fmax(l, s);
                double tot = m + log(exp(l - m) + exp(s - m));
                scale = l == -INFINITY ? 0.0 : exp(l - tot);
                l = tot;
            }
            size_t row = (size_t)(pg->cu[b] + i) * HQ + h;
            double got_l = pg->lse[row];
            if (l == -INFINITY)
                assert_true(got_l == -INFINITY);
            else
                assert_true(fabs(got_l - l) < 1e-12 * fmax(1, fabs(l)));
            for (int e = 0; e < D; e++) {
                double want = o[((size_t)h * kv + kv - ql + i) * D + e] * scale;
                assert_true(fabs(pg->o[row * D + e] - want) < 1e-12);
            }
        }
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
}

static void test_matches_dense(void **state)
{
    (void)state;
    static const char *const pats[] = {"full", "causal", "sliding_window(30)", "alibi+causal",
                                       "softcap(20)+causal", "causal_bottom_right"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++)
        for (int sinks = 0; sinks < 2; sinks++) {
            kpt_pattern *p = NULL;
            kpt_diag d = {0};
            assert_int_equal(kpt_pattern_parse(pats[i], &p, &d), KPT_OK);
            paged pg;
            paged_init(&pg, 11 + i);
            kpt_paged_args a = paged_args(&pg, sinks);
            assert_int_equal(kpt_reference_paged_attention(p, &a, &d), KPT_OK);
            for (int b = 0; b < B; b++)
                check_sequence(p, &pg, b, sinks);
            paged_free(&pg);
            kpt_pattern_destroy(&p);
        }
}

static void expect_error(const kpt_pattern *p, kpt_paged_args *a, const char *text)
{
    kpt_diag d = {0};
    assert_int_not_equal(kpt_reference_paged_attention(p, a, &d), KPT_OK);
    if (!strstr(d.message, text))
        fail_msg("expected '%s' in: %s", text, d.message);
}

static void test_refusals(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    assert_int_equal(kpt_pattern_parse("causal", &p, NULL), KPT_OK);
    paged pg;
    paged_init(&pg, 5);
    kpt_paged_args a = paged_args(&pg, false);
    pg.kv[1] = 3; /* fewer keys than its 4 queries */
    expect_error(p, &a, "keys");
    pg.kv[1] = KVL[1];
    pg.kv[0] = PAGE * MAXP + 1; /* past its page-table row */
    expect_error(p, &a, "page-table row");
    pg.kv[0] = KVL[0];
    pg.cu[2] = 0; /* decreasing */
    expect_error(p, &a, "must not decrease");
    pg.cu[2] = QL[0] + QL[1];
    a.page_table.dtype = KPT_DTYPE_F32;
    expect_error(p, &a, "page_table");
    a.page_table.dtype = KPT_DTYPE_I32;
    a.k.shape[1] = a.v.shape[1] = 300;
    expect_error(p, &a, "page size");
    a.k.shape[1] = a.v.shape[1] = PAGE;
    a.q.shape[1] = 3; /* not a multiple of the kv heads */
    expect_error(p, &a, "");
    a.q.shape[1] = HQ;
    a.sinks = a.lse; /* f64 sinks */
    expect_error(p, &a, "sinks");
    paged_free(&pg);
    kpt_pattern_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_dense),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
