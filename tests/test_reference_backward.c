/* The CPU reference backward against central finite differences of the reference forward, element
 * by element, on small problems: GQA, Dqk != Dv, fully masked rows, score mods (softcap, ALiBi,
 * a Lua score with abs, min, max, exp, log, sqrt, pow, a select and division) and a learnable
 * float aux bias; plus determinism and argument validation. The loss is sum(o * dO) for a random
 * dO, so its gradient is exactly what a backward given dO returns. */
#include "tests/testutil.h"

#include <kpt/reference.h>

#include "runtime/reference_util.h"

typedef struct prob {
    int64_t B, Hq, Hkv, Sq, Skv, Dqk, Dv;
    double *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    double *bias, *dbias; /* [Hq, 8] aux bias (f32 in the pattern), its gradient (f64) */
    float *biasf;
    bool with_sinks;      /* sinks [Hq] (f64) and their gradient */
    double *sinks, *dsinks;
} prob;

static kpt_pattern *parse_or_fail(const char *text)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    if (kpt_pattern_parse(text, &p, &d) != KPT_OK)
        fail_msg("%s", d.message);
    return p;
}

static size_t nq(const prob *p) { return (size_t)(p->B * p->Hq * p->Sq * p->Dqk); }
static size_t nk(const prob *p) { return (size_t)(p->B * p->Hkv * p->Skv * p->Dqk); }
static size_t nv(const prob *p) { return (size_t)(p->B * p->Hkv * p->Skv * p->Dv); }
static size_t no(const prob *p) { return (size_t)(p->B * p->Hq * p->Sq * p->Dv); }

static double *normals(size_t n, kpt_rng *rng)
{
    double *x = malloc(n * sizeof(double));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = kpt_rng_normal(rng);
    return x;
}

static void prob_init(prob *p, uint64_t seed)
{
    kpt_rng rng;
    kpt_rng_seed(&rng, seed);
    p->q = normals(nq(p), &rng);
    p->k = normals(nk(p), &rng);
    p->v = normals(nv(p), &rng);
    p->dout = normals(no(p), &rng);
    p->o = calloc(no(p), sizeof(double));
    p->dq = malloc(nq(p) * sizeof(double));
    p->dk = malloc(nk(p) * sizeof(double));
    p->dv = malloc(nv(p) * sizeof(double));
    p->biasf = malloc((size_t)p->Hq * 8 * sizeof(float));
    p->dbias = malloc((size_t)p->Hq * 8 * sizeof(double));
    for (int64_t i = 0; i < p->Hq * 8; i++)
        p->biasf[i] = (float)(kpt_rng_normal(&rng) * 0.5);
    /* poison: every gradient must be written */
    for (size_t i = 0; i < nq(p); i++) p->dq[i] = NAN;
    for (size_t i = 0; i < nk(p); i++) p->dk[i] = NAN;
    for (size_t i = 0; i < nv(p); i++) p->dv[i] = NAN;
    for (int64_t i = 0; i < p->Hq * 8; i++) p->dbias[i] = NAN;
    p->sinks = normals((size_t)p->Hq, &rng);
    p->dsinks = malloc((size_t)p->Hq * sizeof(double));
    for (int64_t i = 0; i < p->Hq; i++) p->dsinks[i] = NAN;
}

static void prob_free(prob *p)
{
    free(p->q), free(p->k), free(p->v), free(p->o), free(p->dout);
    free(p->dq), free(p->dk), free(p->dv), free(p->biasf), free(p->dbias);
    free(p->sinks), free(p->dsinks);
}

static kpt_tensor t4(double *d, int64_t b, int64_t h, int64_t s, int64_t e)
{
    return kpt_tensor_contiguous(d, KPT_DTYPE_F64, 4, (int64_t[]){b, h, s, e});
}

static kpt_aux_tensor bias_aux(prob *p)
{
    return (kpt_aux_tensor){"bias", kpt_tensor_contiguous(p->biasf, KPT_DTYPE_F32, 2,
                                                          (int64_t[]){p->Hq, 8})};
}

static kpt_attention_args args_of(prob *p, const kpt_pattern *pat, kpt_aux_tensor *aux)
{
    kpt_attention_args a = {
        .q = t4(p->q, p->B, p->Hq, p->Sq, p->Dqk),
        .k = t4(p->k, p->B, p->Hkv, p->Skv, p->Dqk),
        .v = t4(p->v, p->B, p->Hkv, p->Skv, p->Dv),
        .o = t4(p->o, p->B, p->Hq, p->Sq, p->Dv),
    };
    if (p->with_sinks)
        a.sinks = kpt_tensor_contiguous(p->sinks, KPT_DTYPE_F64, 1, (int64_t[]){p->Hq});
    if (kpt_pattern_aux_count(pat)) {
        *aux = bias_aux(p);
        a.aux = aux;
        a.num_aux = 1;
    }
    return a;
}

static double loss(prob *p, const kpt_pattern *pat)
{
    kpt_aux_tensor aux;
    kpt_attention_args a = args_of(p, pat, &aux);
    kpt_diag d = {0};
    assert_int_equal(kpt_reference_attention(pat, &a, &d), KPT_OK);
    double l = 0;
    for (size_t i = 0; i < no(p); i++)
        l += p->o[i] * p->dout[i];
    return l;
}

/* The reference backward of p into its gradients; with delta from `o` where not NULL
 * (kpt_ref_backward_stored_o). */
static kpt_status backward_with(prob *p, const kpt_pattern *pat, const kpt_tensor *o,
                                kpt_diag *d)
{
    kpt_aux_tensor aux;
    kpt_attention_args a = args_of(p, pat, &aux);
    kpt_aux_tensor daux = {"bias", kpt_tensor_contiguous(p->dbias, KPT_DTYPE_F64, 2,
                                                         (int64_t[]){p->Hq, 8})};
    kpt_attention_grads g = {
        .dout = t4(p->dout, p->B, p->Hq, p->Sq, p->Dv),
        .dq = t4(p->dq, p->B, p->Hq, p->Sq, p->Dqk),
        .dk = t4(p->dk, p->B, p->Hkv, p->Skv, p->Dqk),
        .dv = t4(p->dv, p->B, p->Hkv, p->Skv, p->Dv),
        .daux = &daux,
        .num_daux = a.num_aux,
    };
    if (p->with_sinks)
        g.dsinks = kpt_tensor_contiguous(p->dsinks, KPT_DTYPE_F64, 1, (int64_t[]){p->Hq});
    return o ? kpt_ref_backward_stored_o(pat, &a, o, &g, d)
             : kpt_reference_attention_backward(pat, &a, &g, d);
}

static void backward(prob *p, const kpt_pattern *pat)
{
    kpt_diag d = {0};
    if (backward_with(p, pat, NULL, &d))
        fail_msg("%s: %s", kpt_pattern_name(pat), d.message);
}

/* Every element of x: the analytic gradient g against (L(x + h) - L(x - h)) / 2h. The score
 * mods are evaluated in f32 as the kernels do (so L has f32 noise near 1e-7 relative); h is
 * large enough for that and small enough for the curvature. */
static void check_elems(prob *p, const kpt_pattern *pat, const char *what, double *x,
                        const double *g, size_t n)
{
    const double h = 3e-3;
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(p, pat);
        x[i] = x0 - h;
        double lm = loss(p, pat);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        if (!isfinite(g[i]) || fabs(fd - g[i]) > 2e-4 + 2e-3 * fabs(fd))
            fail_msg("%s: d%s[%zu] = %.9g, finite differences %.9g", kpt_pattern_name(pat), what,
                     i, g[i], fd);
    }
}

static void check_bias(prob *p, const kpt_pattern *pat)
{
    const double h = 1.0 / 64; /* exact in f32 around values of size ~1 */
    for (int64_t i = 0; i < p->Hq * 8; i++) {
        float x0 = p->biasf[i];
        p->biasf[i] = x0 + (float)h;
        double lp = loss(p, pat);
        p->biasf[i] = x0 - (float)h;
        double lm = loss(p, pat);
        p->biasf[i] = x0;
        double fd = (lp - lm) / (2 * h);
        if (!isfinite(p->dbias[i]) || fabs(fd - p->dbias[i]) > 5e-4 + 5e-3 * fabs(fd))
            fail_msg("%s: dbias[%lld] = %.9g, finite differences %.9g", kpt_pattern_name(pat),
                     (long long)i, p->dbias[i], fd);
    }
}

static void check_pattern(const kpt_pattern *pat, prob shape, uint64_t seed)
{
    prob p = shape;
    prob_init(&p, seed);
    backward(&p, pat);
    double *dq = malloc(nq(&p) * sizeof(double)), *dk = malloc(nk(&p) * sizeof(double));
    double *dv = malloc(nv(&p) * sizeof(double));
    memcpy(dq, p.dq, nq(&p) * sizeof(double));
    memcpy(dk, p.dk, nk(&p) * sizeof(double));
    memcpy(dv, p.dv, nv(&p) * sizeof(double));
    check_elems(&p, pat, "q", p.q, dq, nq(&p));
    check_elems(&p, pat, "k", p.k, dk, nk(&p));
    check_elems(&p, pat, "v", p.v, dv, nv(&p));
    if (kpt_pattern_aux_count(pat))
        check_bias(&p, pat);
    if (p.with_sinks) {
        double *ds = malloc((size_t)p.Hq * sizeof(double));
        memcpy(ds, p.dsinks, (size_t)p.Hq * sizeof(double));
        check_elems(&p, pat, "sinks", p.sinks, ds, (size_t)p.Hq);
        free(ds);
    }
    free(dq), free(dk), free(dv);
    prob_free(&p);
}

static const prob small = {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 5, .Skv = 7, .Dqk = 6, .Dv = 3};

static void test_builtins(void **state)
{
    (void)state;
    const char *pats[] = {"full", "causal+softcap(2)", "alibi+causal", "sliding_window(3)+alibi",
                          "local(1, 2)+softcap(1.5)", "prefix_lm(2)"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        kpt_pattern *p = parse_or_fail(pats[i]);
        check_pattern(p, small, 100 + i);
        kpt_pattern_destroy(&p);
    }
}

/* causal_bottom_right with Sq > Skv: the first Sq - Skv rows keep nothing, their dq is 0 and
 * they add nothing to dk and dv. */
/* Sinks: the forward by its definition (O scaled by exp(LSE - LSE'), LSE' = logaddexp(LSE,
 * sink)), the gradients of q, k, v and the sinks by finite differences, rows with nothing kept
 * (O = 0, LSE = sink, no gradient) included. */
static void test_sinks(void **state)
{
    (void)state;
    const char *pats[] = {"full", "causal+softcap(2)", "alibi+causal", "causal_bottom_right"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        kpt_pattern *pat = parse_or_fail(pats[i]);
        prob shape = small;
        if (i == 3)
            shape.Sq = 9; /* Sq > Skv: two rows keep nothing */
        shape.with_sinks = true;
        prob p = shape;
        prob_init(&p, 300 + i);
        int64_t rows = p.B * p.Hq * p.Sq;
        double *lse = malloc((size_t)rows * sizeof(double)), *o0 = malloc(no(&p) * sizeof(double));
        double *lse0 = malloc((size_t)rows * sizeof(double));
        kpt_aux_tensor aux;
        kpt_attention_args a = args_of(&p, pat, &aux);
        a.lse = kpt_tensor_contiguous(lse, KPT_DTYPE_F64, 3, (int64_t[]){p.B, p.Hq, p.Sq});
        assert_int_equal(kpt_reference_attention(pat, &a, NULL), KPT_OK);
        memcpy(o0, p.o, no(&p) * sizeof(double));
        a.sinks.data = NULL;
        a.lse.data = lse0;
        assert_int_equal(kpt_reference_attention(pat, &a, NULL), KPT_OK);
        for (int64_t r = 0; r < rows; r++) {
            double sk = p.sinks[r / p.Sq % p.Hq], l0 = lse0[r];
            double want = l0 == -INFINITY ? sk : fmax(l0, sk) + log(exp(l0 - fmax(l0, sk)) + exp(sk - fmax(l0, sk)));
            assert_true(fabs(lse[r] - want) < 1e-12 * fmax(1, fabs(want)));
            for (int64_t e = 0; e < p.Dv; e++) {
                double w = l0 == -INFINITY ? 0 : p.o[r * p.Dv + e] * exp(l0 - want);
                assert_true(fabs(o0[r * p.Dv + e] - w) < 1e-12);
            }
        }
        free(lse), free(lse0), free(o0);
        prob_free(&p);
        check_pattern(pat, shape, 300 + i);
        kpt_pattern_destroy(&pat);
    }
}

static void test_fully_masked_rows(void **state)
{
    (void)state;
    kpt_pattern *pat = parse_or_fail("causal_bottom_right+softcap(3)");
    prob p = {.B = 1, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 4, .Dqk = 4, .Dv = 5};
    prob_init(&p, 7);
    backward(&p, pat);
    for (int64_t h = 0; h < 2; h++)
        for (int64_t q = 0; q < 3; q++)
            for (int64_t d = 0; d < 4; d++)
                assert_true(p.dq[((h * 7) + q) * 4 + d] == 0.0);
    prob_free(&p);
    check_pattern(pat, (prob){.B = 1, .Hq = 2, .Hkv = 1, .Sq = 7, .Skv = 4, .Dqk = 4, .Dv = 5}, 8);
    kpt_pattern_destroy(&pat);
}

static kpt_pattern *lua_or_fail(const char *src)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    if (kpt_pattern_from_lua(src, strlen(src), NULL, &p, &d))
        fail_msg("lua: %s", d.message);
    return p;
}

/* Every differentiable op of the IR through one score mod, and a learnable bias read at two
 * places (both add into its gradient). The kinks of abs, min and max sit far from the scores
 * (|s| < 5 here), where finite differences would straddle them. */
static void test_lua_score_and_bias(void **state)
{
    (void)state;
    static const char src[] =
        "return kpt.pattern{ name = 'grad_ops',\n"
        "  aux = { bias = { dtype = 'float32', shape = {'hq', 8} } },\n"
        "  score = function(s, b, h, q, k, p)\n"
        "    local t = kpt.abs(s - 9) + kpt.exp(s / 4) + kpt.log(s * s + 1) + kpt.sqrt(s * s + 2)\n"
        "    local u = kpt.min(s, 9) - kpt.max(s * 0.5, -9) + (s * s + 1) ^ 0.75\n"
        "    local w = kpt.where(q:ge(k), s * 2, s / (kpt.abs(s + 9) + 1)) + kpt.tanh(s)\n"
        "    local bias = p.bias[h][(k - q) % 8] * p.bias[h][q % 8]\n"
        "    return t * 0.25 + u - w * s / 3 + bias * s + bias\n"
        "  end }";
    kpt_pattern *pat = lua_or_fail(src);
    check_pattern(pat, small, 31);
    kpt_pattern_destroy(&pat);
}

/* Delta from a given O (what the kernels do with the O they stored): with the exact O, the exact
 * gradients; with O moved, dv stays (it does not read delta), and as every pair reads one of the
 * bias's elements, their gradients sum to sum(delta - dO . O') over the rows instead of 0. */
static void test_stored_o(void **state)
{
    (void)state;
    static const char src[] =
        "return kpt.pattern{ name = 'bias_by_distance',\n"
        "  aux = { bias = { dtype = 'float32', shape = {'hq', 8} } },\n"
        "  score = function(s, b, h, q, k, p) return s + p.bias[h][(k - q) % 8] end }";
    kpt_pattern *pat = lua_or_fail(src);
    prob p = small;
    prob_init(&p, 41);
    loss(&p, pat); /* p.o: the exact O */
    backward(&p, pat);
    const size_t nb = (size_t)p.Hq * 8;
    double *want[4] = {malloc(nq(&p) * 8), malloc(nk(&p) * 8), malloc(nv(&p) * 8), malloc(nb * 8)};
    double *got[4] = {p.dq, p.dk, p.dv, p.dbias};
    const size_t n[4] = {nq(&p), nk(&p), nv(&p), nb};
    for (int i = 0; i < 4; i++)
        memcpy(want[i], got[i], n[i] * sizeof(double));
    double *o = malloc(no(&p) * sizeof(double));
    memcpy(o, p.o, no(&p) * sizeof(double));
    kpt_tensor ot = t4(o, p.B, p.Hq, p.Sq, p.Dv);
    kpt_diag d = {0};
    assert_int_equal(backward_with(&p, pat, &ot, &d), KPT_OK);
    for (int i = 0; i < 4; i++)
        for (size_t j = 0; j < n[i]; j++)
            assert_true(fabs(got[i][j] - want[i][j]) <= 1e-12 * (1 + fabs(want[i][j])));
    double moved = 0; /* sum over rows of dO . (O' - O) */
    for (size_t j = 0; j < no(&p); j++) {
        const double step = 1e-2 * (double)((j * 7) % 5) - 2e-2;
        o[j] += step;
        moved += p.dout[j] * step;
    }
    assert_int_equal(backward_with(&p, pat, &ot, &d), KPT_OK);
    assert_memory_equal(p.dv, want[2], nv(&p) * sizeof(double));
    double sum = 0, sum_exact = 0;
    for (size_t j = 0; j < nb; j++)
        sum += p.dbias[j], sum_exact += want[3][j];
    assert_true(fabs(sum_exact) < 1e-12);
    assert_true(fabs(moved) > 1e-2);
    assert_true(fabs(sum + moved) < 1e-12);
    /* aux gradients alone: the same bits as beside dq, dk and dv */
    kpt_aux_tensor aux;
    kpt_attention_args a = args_of(&p, pat, &aux);
    kpt_aux_tensor daux = {"bias", kpt_tensor_contiguous(p.dbias, KPT_DTYPE_F64, 2,
                                                         (int64_t[]){p.Hq, 8})};
    kpt_attention_grads only = {.dout = t4(p.dout, p.B, p.Hq, p.Sq, p.Dv), .daux = &daux,
                                .num_daux = 1};
    assert_int_equal(kpt_reference_attention_backward(pat, &a, &only, &d), KPT_OK);
    assert_memory_equal(p.dbias, want[3], nb * sizeof(double));
    ot.shape[2] = p.Sq + 1; /* the stored O's shape must be o's */
    assert_int_equal(backward_with(&p, pat, &ot, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(d.message, "stored O"));
    for (int i = 0; i < 4; i++)
        free(want[i]);
    free(o);
    prob_free(&p);
    kpt_pattern_destroy(&pat);
}

/* Same inputs, same bits: the reference's sums have a fixed order whatever the thread count. */
static void test_deterministic(void **state)
{
    (void)state;
    kpt_pattern *pat = parse_or_fail("causal+alibi");
    prob a = {.B = 3, .Hq = 4, .Hkv = 2, .Sq = 33, .Skv = 40, .Dqk = 8, .Dv = 8}, b = a;
    prob_init(&a, 5);
    prob_init(&b, 5);
    setenv("KPT_REFERENCE_THREADS", "1", 1);
    backward(&a, pat);
    setenv("KPT_REFERENCE_THREADS", "5", 1);
    backward(&b, pat);
    unsetenv("KPT_REFERENCE_THREADS");
    assert_memory_equal(a.dq, b.dq, nq(&a) * sizeof(double));
    assert_memory_equal(a.dk, b.dk, nk(&a) * sizeof(double));
    assert_memory_equal(a.dv, b.dv, nv(&a) * sizeof(double));
    prob_free(&a);
    prob_free(&b);
    kpt_pattern_destroy(&pat);
}

static void expect_error(const kpt_pattern *pat, const kpt_attention_args *a,
                         const kpt_attention_grads *g, const char *needle)
{
    kpt_diag d = {0};
    assert_int_not_equal(kpt_reference_attention_backward(pat, a, g, &d), KPT_OK);
    if (!strstr(d.message, needle))
        fail_msg("expected '%s' in: %s", needle, d.message);
}

static void test_validation(void **state)
{
    (void)state;
    kpt_pattern *pat = lua_or_fail(
        "return kpt.pattern{ name = 'b', aux = { bias = { dtype = 'float32', shape = {'hq', 8} },"
        " ids = { dtype = 'int32', shape = {8} } },"
        " score = function(s, b, h, q, k, p) return s + p.bias[h][p.ids[k % 8]] end }");
    prob p = small;
    prob_init(&p, 1);
    int32_t ids[8] = {0};
    kpt_aux_tensor aux[2] = {bias_aux(&p),
                             {"ids", kpt_tensor_contiguous(ids, KPT_DTYPE_I32, 1, (int64_t[]){8})}};
    kpt_attention_args a = {
        .q = t4(p.q, p.B, p.Hq, p.Sq, p.Dqk),
        .k = t4(p.k, p.B, p.Hkv, p.Skv, p.Dqk),
        .v = t4(p.v, p.B, p.Hkv, p.Skv, p.Dv),
        .o = t4(p.o, p.B, p.Hq, p.Sq, p.Dv),
        .aux = aux,
        .num_aux = 2,
    };
    kpt_attention_grads g = {.dout = t4(p.dout, p.B, p.Hq, p.Sq, p.Dv),
                             .dq = t4(p.dq, p.B, p.Hq, p.Sq, p.Dqk)};
    expect_error(pat, &a, NULL, "grads is NULL");
    g.dq.shape[2] = 4;
    expect_error(pat, &a, &g, "tensor dq must have the shape of q");
    g.dq.shape[2] = p.Sq;
    g.dout.data = NULL;
    expect_error(pat, &a, &g, "tensor dout has no data");
    g.dout.data = p.dout;
    kpt_aux_tensor daux = {"ids", kpt_tensor_contiguous(p.dbias, KPT_DTYPE_F64, 1,
                                                        (int64_t[]){8})};
    g.daux = &daux;
    g.num_daux = 1;
    expect_error(pat, &a, &g, "only float aux tensors have gradients");
    daux.name = "nope";
    expect_error(pat, &a, &g, "gradient of unknown aux tensor 'nope'");
    daux.name = "bias";
    expect_error(pat, &a, &g, "must have rank 2, not 1");
    daux.tensor = kpt_tensor_contiguous(p.dbias, KPT_DTYPE_F64, 2, (int64_t[]){p.Hq, 7});
    expect_error(pat, &a, &g, "dimension 1 has size 7, expected 8");
    daux.tensor = kpt_tensor_contiguous(p.dbias, KPT_DTYPE_I32, 2, (int64_t[]){p.Hq, 8});
    expect_error(pat, &a, &g, "must be f32 or f64, not i32");
    kpt_aux_tensor two[2] = {{"bias", kpt_tensor_contiguous(p.dbias, KPT_DTYPE_F64, 2,
                                                            (int64_t[]){p.Hq, 8})}};
    two[1] = two[0];
    g.daux = two;
    g.num_daux = 2;
    expect_error(pat, &a, &g, "given twice");
    /* errors leave outputs untouched */
    assert_true(isnan(p.dq[0]));
    g.num_daux = 1;
    kpt_diag d = {0};
    assert_int_equal(kpt_reference_attention_backward(pat, &a, &g, &d), KPT_OK);
    assert_false(isnan(p.dq[0]));
    assert_false(isnan(p.dbias[0]));
    prob_free(&p);
    kpt_pattern_destroy(&pat);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins),
        cmocka_unit_test(test_fully_masked_rows),
        cmocka_unit_test(test_sinks),
        cmocka_unit_test(test_lua_score_and_bias),
        cmocka_unit_test(test_stored_o),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
