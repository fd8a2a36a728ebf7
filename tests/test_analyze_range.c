/* analyze_range: the ranges of hand-picked expressions and derivatives (which backward kernels
 * may drop the guard of dS for), and soundness over random expressions: every value the
 * interpreter computes, at scores from 0 to +-inf, lies inside the range found, and NaN only where
 * the range allows it. */
#include "tests/testutil.h"
#include "compiler/analyze_range.h"
#include "compiler/passes.h"
#include "compiler/plan_tiles.h"

static kpt_range score_range(const char *ir)
{
    kpt_diag d = {0};
    kpt_pattern *p = kpt_pattern_read(ir, &d);
    if (!p)
        fail_msg("%s: %s", ir, d.message);
    kpt_range r;
    assert_true(kpt_analyze_range(&p->g, p->score, &r));
    kpt_pattern_destroy(&p);
    return r;
}

/* The backward's derived pattern of a pattern string (kpt_diff_score). */
static kpt_pattern *derived(const char *source)
{
    kpt_diag d = {0};
    kpt_pattern *p = NULL;
    if (kpt_pattern_parse(source, &p, &d) != KPT_OK)
        fail_msg("%s: %s", source, d.message);
    assert_int_equal(kpt_diff_score(p, &d), KPT_OK);
    return p;
}

/* The range of a pattern's d score / d s, which must be a node, and that node's op. */
static kpt_range dscore_range(const char *source, kpt_ir_op *root_op)
{
    kpt_pattern *p = derived(source);
    assert_true(p->dscore != 0);
    kpt_range r;
    assert_true(kpt_analyze_range(&p->g, p->dscore, &r));
    *root_op = (kpt_ir_op)kpt_ir_node_get(&p->g, p->dscore)->op;
    kpt_pattern_destroy(&p);
    return r;
}

/* Expressions of s (IR text), whether their range is finite and whether it may hold NaN, and a
 * bound the range must lie within (0: none checked). */
static const struct {
    const char *ir;
    bool finite, nan;
    double bound;
} fixed[] = {
    {"%1 = f32 s\n%2 = f32 tanh %1\nscore %2\n", true, false, 1.05},
    /* s * 2, s / s (inf / inf), 1 / s (0), s * 0 (inf * 0): not finite */
    {"%1 = f32 s\n%2 = f32 const 2\n%3 = f32 mul %1 %2\nscore %3\n", false, false, 0},
    {"%1 = f32 s\n%2 = f32 div %1 %1\nscore %2\n", false, true, 0},
    {"%1 = f32 s\n%2 = f32 const 1\n%3 = f32 div %2 %1\nscore %3\n", false, true, 0},
    {"%1 = f32 s\n%2 = f32 const 0\n%3 = f32 mul %1 %2\nscore %3\n", false, true, 0},
    /* s / 1e38: the kernels' reciprocal of 1e38 flushes to 0, and inf * 0 is NaN */
    {"%1 = f32 s\n%2 = f32 const 1e38\n%3 = f32 div %1 %2\nscore %3\n", false, true, 0},
    {"%1 = f32 s\n%2 = f32 tanh %1\n%3 = f32 const 1e38\n%4 = f32 div %2 %3\nscore %4\n", true,
     false, 0},
    /* a square is never NaN; exp(-s^2) is bounded: erf's derivative */
    {"%1 = f32 s\n%2 = f32 mul %1 %1\n%3 = f32 neg %2\n%4 = f32 exp %3\nscore %4\n", true, false,
     1.05},
    /* exp(s) overflows; sqrt of a negative is NaN */
    {"%1 = f32 s\n%2 = f32 exp %1\nscore %2\n", false, false, 0},
    {"%1 = f32 s\n%2 = f32 sqrt %1\nscore %2\n", false, true, 0},
    /* positions are finite, and so is anything bounded made of them and tanh */
    {"%1 = i32 q\n%2 = i32 k\n%3 = i32 sub %1 %2\n%4 = f32 to_f32 %3\n%5 = f32 s\n"
     "%6 = f32 tanh %5\n%7 = f32 mul %4 %6\nscore %7\n", true, false, 0},
    /* float aux data can be anything: tanh of NaN data is NaN */
    {"aux bias f32 [16] range -1 1\n%1 = i32 const 3\n%2 = f32 load bias %1\n%3 = f32 s\n"
     "%4 = f32 add %3 %2\n%5 = f32 tanh %4\nscore %5\n", false, true, 1.05},
};

static void test_fixed(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        char ir[512];
        snprintf(ir, sizeof(ir), "kpt-ir 1\n%s", fixed[i].ir);
        const kpt_range r = score_range(ir);
        if (kpt_range_finite(&r) != fixed[i].finite || r.nan != fixed[i].nan)
            fail_msg("%s: [%g, %g] NaN %d", ir, r.lo, r.hi, r.nan);
        if (fixed[i].bound && (r.lo < -fixed[i].bound || r.hi > fixed[i].bound))
            fail_msg("%s: [%g, %g] is wider than +-%g", ir, r.lo, r.hi, fixed[i].bound);
    }
}

static void test_derivatives(void **state)
{
    (void)state;
    kpt_ir_op op;
    /* softcap: c tanh(s / c) has the derivative 1 - tanh^2 (the root a subtraction, no product
     * by c or 1 / c after it), c * (1 / c) folded to 1 */
    kpt_range r = dscore_range("causal+softcap(30)", &op);
    assert_true(kpt_range_finite(&r));
    assert_true(r.lo >= -0.05 && r.hi <= 1.05); /* widened for the rounding */
    assert_int_equal(op, KPT_IR_SUB);
    r = dscore_range("softcap(41)", &op); /* 41 * (1 / 41) is not 1 in f32: one product stays */
    assert_true(kpt_range_finite(&r));
    assert_int_equal(op, KPT_IR_MUL);
    r = dscore_range("softcap($c=30)", &op); /* a runtime cap may be 0: 1 / c unbounded */
    assert_false(kpt_range_finite(&r));
}

/* The backward plan carries the answer (KPT_DS_FINITE in the kernel). */
static bool plan_ds_finite(const char *source)
{
    kpt_pattern *p = derived(source);
    kpt_diag d = {0};
    kpt_kernel_config c = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16, .dqk = 128,
                           .dv = 128, .sm = 90, .wgmma = true};
    kpt_kernel_plan plan;
    assert_int_equal(kpt_plan_tiles_cuda(p, &c, 0, &plan, &d), KPT_OK);
    kpt_pattern_destroy(&p);
    return plan.ds_finite;
}

static void test_plan(void **state)
{
    (void)state;
    assert_true(plan_ds_finite("causal+softcap(30)"));
    assert_true(plan_ds_finite("alibi+causal")); /* d s'/d s = 1 */
    assert_true(plan_ds_finite("causal"));       /* no score mod */
    assert_false(plan_ds_finite("causal+softcap($c=30)")); /* 1 / c of a runtime cap */
}

/* Soundness: the interpreter's value of random expressions (and of their derivatives) at random
 * points, scores of every magnitude and +-inf among them, lies inside the range. */
static void check_point(const kpt_pattern *p, kpt_ir_ref root, const kpt_range *r,
                        const kpt_ir_env *env)
{
    kpt_ir_value v;
    assert_true(kpt_ir_eval(&p->g, root, env, &v));
    const double x = v.f;
    if (isnan(x) ? !r->nan : x < r->lo || x > r->hi) {
        char *t = kpt_pattern_print(p);
        fail_msg("s = %g: value %g outside [%g, %g] (NaN %d)\n%s", env->s, x, r->lo, r->hi,
                 r->nan, t);
    }
}

static void test_random_sound(void **state)
{
    (void)state;
    static const double specials[] = {0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, 88.0, -88.0,
                                      1e4, -1e4};
    kpt_ir_value sc[1];
    int finite = 0, dfinite = 0; /* bounded ranges met: the test is not all [-inf, inf] */
    for (int i = 0; i < 3000; i++) {
        gen G = {0};
        kpt_rng_seed(&G.rng, 7100 + (uint64_t)i);
        G.p = kpt_pattern_new("random");
        char err[100];
        assert_int_equal(kpt_pattern_scalar(G.p, "w", KPT_IR_I32, false, 0, err, sizeof(err)), 0);
        G.p->score = gen_expr(&G, KPT_IR_F32, 5);
        assert_false(G.p->g.failed);
        kpt_diag d = {0};
        assert_int_equal(kpt_diff_score(G.p, &d), KPT_OK);
        if (!G.p->score) { /* simplified to s */
            kpt_pattern_destroy(&G.p);
            continue;
        }
        kpt_range rs, rd = {1, 1, false};
        assert_true(kpt_analyze_range(&G.p->g, G.p->score, &rs));
        if (G.p->dscore)
            assert_true(kpt_analyze_range(&G.p->g, G.p->dscore, &rd));
        finite += kpt_range_finite(&rs);
        dfinite += G.p->dscore && kpt_range_finite(&rd);
        for (int n = 0; n < 40; n++) {
            sc[0].i = (int32_t)kpt_rng_range(&G.rng, -5, 50);
            kpt_ir_env env = gen_env(&G.rng, sc);
            if (n < 2)
                env.s = n ? -INFINITY : INFINITY;
            else if (n < 12)
                env.s = specials[n - 2];
            else
                env.s = kpt_rng_normal(&G.rng) * pow(10.0, (double)kpt_rng_range(&G.rng, -3, 6));
            env.s = (float)env.s;
            check_point(G.p, G.p->score, &rs, &env);
            if (G.p->dscore)
                check_point(G.p, G.p->dscore, &rd, &env);
        }
        kpt_pattern_destroy(&G.p);
    }
    printf("finite ranges: %d scores, %d derivatives of 3000\n", finite, dfinite);
    assert_true(finite > 300 && dfinite > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_derivatives),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_random_sound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
