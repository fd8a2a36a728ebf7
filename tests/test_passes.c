/* Passes: opt_fold and opt_simplify preserve meaning (evaluated before and after at random
 * points), actually simplify, and the pipeline validates and dumps. */
#include "tests/testutil.h"
#include "compiler/passes.h"

static kpt_pattern *clone(const kpt_pattern *p)
{
    char *t = kpt_pattern_print(p);
    assert_non_null(t);
    kpt_diag d = {0};
    kpt_pattern *c = kpt_pattern_read(t, &d);
    free(t);
    assert_non_null(c);
    return c;
}

static void check_same_meaning(const kpt_pattern *a, const kpt_pattern *b, kpt_rng *rng,
                               double tol, int points)
{
    kpt_ir_value sc[1];
    for (int n = 0; n < points; n++) {
        sc[0].i = (int32_t)kpt_rng_range(rng, -5, 50);
        kpt_ir_env env = gen_env(rng, sc);
        for (int root = 0; root < 2; root++) {
            kpt_ir_ref ra = root ? a->mask : a->score, rb = root ? b->mask : b->score;
            kpt_ir_value va, vb;
            /* a missing root means s / true */
            if (ra) assert_true(kpt_ir_eval(&a->g, ra, &env, &va));
            else if (root) va.i = 1;
            else va.f = env.s;
            if (rb) assert_true(kpt_ir_eval(&b->g, rb, &env, &vb));
            else if (root) vb.i = 1;
            else vb.f = env.s;
            kpt_ir_type t = root ? KPT_IR_BOOL : KPT_IR_F32;
            if (!value_close(t, va, vb, tol)) {
                char *ta = kpt_pattern_print(a), *tb = kpt_pattern_print(b);
                fail_msg("meaning changed (%s) at q=%d k=%d s=%g: %g/%d vs %g/%d\nbefore:\n%s\nafter:\n%s",
                         root ? "mask" : "score", env.q, env.k, env.s, va.f, va.i, vb.f, vb.i, ta, tb);
            }
        }
    }
}

static void run_random(bool exact_float, uint64_t seed0, int count, double tol)
{
    for (int i = 0; i < count; i++) {
        gen G = {0};
        kpt_rng_seed(&G.rng, seed0 + (uint64_t)i);
        G.exact_float = exact_float;
        G.p = kpt_pattern_new("random");
        char err[100];
        assert_int_equal(kpt_pattern_scalar(G.p, "w", KPT_IR_I32, false, 0, err, sizeof(err)), 0);
        G.p->score = gen_expr(&G, KPT_IR_F32, 6);
        G.p->mask = gen_expr(&G, KPT_IR_BOOL, 6);
        assert_false(G.p->g.failed);
        kpt_pattern *before = clone(G.p);
        kpt_diag d = {0};
        assert_int_equal(kpt_pipeline_run(G.p, NULL, &d), KPT_OK);
        check_same_meaning(before, G.p, &G.rng, tol, 60);
        kpt_pattern_destroy(&before);
        kpt_pattern_destroy(&G.p);
    }
}

static void test_random_exact(void **state)
{
    (void)state;
    /* f32 is evaluated in float: folding and reassociating constants may move a result by an
     * ulp or two (the kernels and the reference both run the optimised IR) */
    run_random(true, 1, 1500, 1e-6);
}

static void test_random_transcendental(void **state)
{
    (void)state;
    /* folding rounds f32 constants to float, so allow float noise; the generator avoids
     * float -> int conversions and float comparisons, where rounding would flip a branch */
    for (int i = 0; i < 400; i++) {
        gen G = {0};
        kpt_rng_seed(&G.rng, 50000 + (uint64_t)i);
        G.continuous = true;
        G.p = kpt_pattern_new("random");
        G.p->score = gen_expr(&G, KPT_IR_F32, 5);
        assert_false(G.p->g.failed);
        kpt_pattern *before = clone(G.p);
        kpt_diag d = {0};
        assert_int_equal(kpt_pipeline_run(G.p, NULL, &d), KPT_OK);
        check_same_meaning(before, G.p, &G.rng, 1e-4, 40);
        kpt_pattern_destroy(&before);
        kpt_pattern_destroy(&G.p);
    }
}

/* Expected rewrites: what goes in, what must come out. */
static void expect_ir(const char *in, const char *out_nodes)
{
    kpt_diag d = {0};
    kpt_pattern *p = kpt_pattern_read(in, &d);
    if (!p)
        fail_msg("%s", d.message);
    assert_int_equal(kpt_pipeline_run(p, NULL, &d), KPT_OK);
    char *t = kpt_pattern_print(p);
    const char *body = strchr(strchr(t, '\n') + 1, '\n') + 1; /* skip header and name */
    if (strcmp(body, out_nodes) != 0)
        fail_msg("for\n%s\ngot\n%s\nwanted\n%s", in, body, out_nodes);
    free(t);
    kpt_pattern_destroy(&p);
}

static void test_rules(void **state)
{
    (void)state;
    /* folding */
    expect_ir("kpt-ir 1\n%1 = i32 const 6\n%2 = i32 const -4\n%3 = i32 idiv %1 %2\n%4 = i32 q\n"
              "%5 = bool lt %4 %3\nmask %5\n",
              "%1 = i32 const -2\n%2 = i32 q\n%3 = bool lt %2 %1\nmask %3\n");
    /* x + 0, x * 1 (i32) and and(x, true) disappear; true mask means no mask */
    expect_ir("kpt-ir 1\n%1 = i32 q\n%2 = i32 const 0\n%3 = i32 add %1 %2\n%4 = i32 const 1\n"
              "%5 = i32 mul %3 %4\n%6 = i32 k\n%7 = bool ge %5 %6\n%8 = bool const true\n"
              "%9 = bool and %7 %8\nmask %9\n",
              "%1 = i32 q\n%2 = i32 k\n%3 = bool le %2 %1\nmask %3\n");
    expect_ir("kpt-ir 1\n%1 = bool const true\nmask %1\n", "");
    /* f32: s * 1 -> s, s + 0.0 stays (s = -0 would change), s - 0 -> s */
    expect_ir("kpt-ir 1\n%1 = f32 s\n%2 = f32 const 1\n%3 = f32 mul %1 %2\nscore %3\n", "");
    expect_ir("kpt-ir 1\n%1 = f32 s\n%2 = f32 const 0\n%3 = f32 add %1 %2\nscore %3\n",
              "%1 = f32 s\n%2 = f32 const 0\n%3 = f32 add %1 %2\nscore %3\n");
    expect_ir("kpt-ir 1\n%1 = f32 s\n%2 = f32 const 0\n%3 = f32 sub %1 %2\nscore %3\n", "");
    /* f32 x == x is not folded (NaN), i32 is */
    expect_ir("kpt-ir 1\n%1 = f32 s\n%2 = bool eq %1 %1\nmask %2\n",
              "%1 = f32 s\n%2 = bool eq %1 %1\nmask %2\n");
    expect_ir("kpt-ir 1\n%1 = i32 q\n%2 = bool lt %1 %1\nmask %2\n",
              "%1 = bool const false\nmask %1\n");
    /* not(not x), not(q < k) -> k <= q, x & ~x -> false */
    expect_ir("kpt-ir 1\n%1 = i32 q\n%2 = i32 k\n%3 = bool lt %1 %2\n%4 = bool not %3\n"
              "%5 = bool not %4\n%6 = bool not %5\nmask %6\n",
              "%1 = i32 q\n%2 = i32 k\n%3 = bool le %2 %1\nmask %3\n");
    expect_ir("kpt-ir 1\n%1 = i32 q\n%2 = i32 k\n%3 = bool lt %1 %2\n%4 = bool not %3\n"
              "%5 = bool and %3 %4\nmask %5\n",
              "%1 = bool const false\nmask %1\n");
    /* (q + 3) + 4 -> q + 7 */
    expect_ir("kpt-ir 1\n%1 = i32 q\n%2 = i32 const 3\n%3 = i32 add %1 %2\n%4 = i32 const 4\n"
              "%5 = i32 add %3 %4\n%6 = i32 k\n%7 = bool lt %5 %6\nmask %7\n",
              "%1 = i32 q\n%2 = i32 const 7\n%3 = i32 add %1 %2\n%4 = i32 k\n%5 = bool lt %3 %4\nmask %5\n");
    /* select on a constant and on a negated condition */
    expect_ir("kpt-ir 1\n%1 = f32 s\n%2 = f32 const 2\n%3 = bool const false\n"
              "%4 = f32 select %3 %1 %2\nscore %4\n",
              "%1 = f32 const 2\nscore %1\n");
    /* ALiBi with hq folded: only the slope arithmetic's h dependence stays */
}

static int dumps;
static void count_dump(void *ud, const char *pass, int round, const char *text)
{
    (void)ud;
    (void)round;
    assert_non_null(strstr(text, "kpt-ir 1"));
    assert_true(!strcmp(pass, "parse") || !strcmp(pass, "opt_fold") || !strcmp(pass, "opt_simplify"));
    dumps++;
}

static void test_pipeline_dump_and_validation(void **state)
{
    (void)state;
    kpt_diag d = {0};
    kpt_pattern *p = kpt_parse_pattern("causal+softcap(30)", &d);
    assert_non_null(p);
    kpt_pipeline_opts o = {.dump_after = "all", .dump = count_dump};
    dumps = 0;
    assert_int_equal(kpt_pipeline_run(p, &o, &d), KPT_OK);
    assert_true(dumps >= 3);
    kpt_pattern_destroy(&p);
    p = kpt_parse_pattern("causal", &d);
    o.dump_after = "opt_fold";
    dumps = 0;
    assert_int_equal(kpt_pipeline_run(p, &o, &d), KPT_OK);
    assert_true(dumps >= 1);
    /* a corrupted graph is caught by validation between passes */
    p->g.nodes[p->mask].type = KPT_IR_I32;
    assert_int_equal(kpt_pipeline_run(p, NULL, &d), KPT_ERR_INTERNAL);
    assert_non_null(strstr(d.message, "invalid IR after parse"));
    kpt_pattern_destroy(&p);
    assert_true(kpt_pipeline_is_stage("opt_simplify"));
    assert_false(kpt_pipeline_is_stage("opt_nothing"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_exact),
        cmocka_unit_test(test_random_transcendental),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_pipeline_dump_and_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
