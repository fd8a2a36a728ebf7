/* Mask analysis against brute force: over thousands of random (pattern, tile size, sq, skv,
 * scalar) combinations the analysis never calls a tile empty or full when an element disagrees,
 * and calls causal / window / prefix / chunked / local / bottom-right tiles exactly. */
#include "tests/testutil.h"

typedef struct truth {
    uint8_t *bits; /* sq * skv */
    int sq, skv;
} truth;

static void brute(const kpt_pattern *p, const kpt_mask_env *me, truth *t)
{
    t->sq = me->sq;
    t->skv = me->skv;
    t->bits = malloc((size_t)(t->sq * t->skv) + 1);
    kpt_ir_value *vals = calloc(p->g.count + 1, sizeof(*vals));
    kpt_ir_prog prog;
    assert_true(kpt_ir_prog_init(&prog, &p->g, &p->mask, 1));
    kpt_ir_env env = {.sq = me->sq, .skv = me->skv, .hq = me->hq, .b = me->b, .h = me->h,
                      .scalars = me->scalars};
    for (int q = 0; q < t->sq; q++)
        for (int k = 0; k < t->skv; k++) {
            env.q = q;
            env.k = k;
            bool keep = true;
            if (p->mask) {
                kpt_ir_prog_run(&prog, &env, vals);
                keep = vals[p->mask].i;
            }
            t->bits[q * t->skv + k] = keep;
        }
    kpt_ir_prog_free(&prog);
    free(vals);
}

static kpt_tile_class true_class(const truth *t, int q0, int q1, int k0, int k1)
{
    bool any = false, all = true, some = false;
    for (int q = q0 < 0 ? 0 : q0; q < q1 && q < t->sq; q++)
        for (int k = k0 < 0 ? 0 : k0; k < k1 && k < t->skv; k++) {
            some = true;
            any |= t->bits[q * t->skv + k];
            all &= t->bits[q * t->skv + k];
        }
    if (!some || !any)
        return KPT_TILE_EMPTY;
    return all ? KPT_TILE_FULL : KPT_TILE_PARTIAL;
}

static const char *class_name(kpt_tile_class c)
{
    return c == KPT_TILE_EMPTY ? "empty" : c == KPT_TILE_FULL ? "full" : "partial";
}

/* Checks every tile of a tq x tk grid, the row sweep and the kv ranges. Returns whether the
 * analysis was exact. */
static bool check_grid(const kpt_pattern *p, const kpt_mask_env *me, int tq, int tk, bool want_exact)
{
    truth t;
    brute(p, me, &t);
    kpt_mask_analysis *a = kpt_analyze_mask(p, me);
    assert_non_null(a);
    bool exact = kpt_mask_analysis_exact(a);
    if (want_exact && !exact)
        fail_msg("pattern '%s' should be analysed exactly: %s", p->name, kpt_mask_analysis_summary(a));
    int ntk = (me->skv + tk - 1) / tk;
    kpt_tile_class *row = malloc((size_t)(ntk + 1) * sizeof(*row));
    for (int q0 = 0; q0 < me->sq; q0 += tq) {
        kpt_mask_classify_row(a, q0, q0 + tq, tk, row);
        int64_t first, last;
        bool nonempty = kpt_mask_kv_range(a, q0, q0 + tq, tk, &first, &last);
        int true_first = -1, true_last = -1;
        for (int kt = 0; kt < ntk; kt++) {
            int k0 = kt * tk;
            kpt_tile_class want = true_class(&t, q0, q0 + tq, k0, k0 + tk);
            kpt_tile_class got = kpt_mask_classify(a, q0, q0 + tq, k0, k0 + tk);
            if (want != KPT_TILE_EMPTY) {
                if (true_first < 0)
                    true_first = kt;
                true_last = kt;
            }
            bool bad = (got != KPT_TILE_PARTIAL && got != want) || (exact && got != want);
            if (bad || row[kt] != got) {
                char *ir = kpt_pattern_print(p);
                fail_msg("pattern '%s' sq=%d skv=%d tile %dx%d at q0=%d k0=%d: analysis says %s "
                         "(row sweep %s), truth is %s (exact=%d)\n%s",
                         p->name, me->sq, me->skv, tq, tk, q0, k0, class_name(got),
                         class_name(row[kt]), class_name(want), exact, ir);
            }
        }
        /* kv range: a superset of the non-empty tiles, equal to them when exact */
        if (true_first >= 0) {
            assert_true(nonempty);
            assert_true(first <= true_first && last >= true_last);
            if (exact) {
                assert_int_equal(first, true_first);
                assert_int_equal(last, true_last);
            }
        } else if (exact) {
            assert_false(nonempty);
        }
    }
    /* odd rectangles, including ones hanging over the edges */
    kpt_rng rng;
    kpt_rng_seed(&rng, (uint64_t)me->sq * 31 + (uint64_t)me->skv);
    for (int n = 0; n < 20; n++) {
        int q0 = (int)kpt_rng_range(&rng, -5, me->sq + 2), k0 = (int)kpt_rng_range(&rng, -5, me->skv + 2);
        int q1 = q0 + (int)kpt_rng_range(&rng, 0, 40), k1 = k0 + (int)kpt_rng_range(&rng, 0, 40);
        kpt_tile_class want = true_class(&t, q0, q1, k0, k1);
        kpt_tile_class got = kpt_mask_classify(a, q0, q1, k0, k1);
        assert_true(got == want || (!exact && got == KPT_TILE_PARTIAL));
    }
    free(row);
    free(t.bits);
    kpt_mask_analysis_free(&a);
    assert_null(a);
    return exact;
}

static const int tiles[] = {1, 2, 3, 7, 8, 16, 32, 64};

static kpt_mask_env random_env(kpt_rng *rng, const kpt_ir_value *scalars)
{
    kpt_mask_env me = {.sq = (int32_t)kpt_rng_range(rng, 1, 90),
                       .skv = (int32_t)kpt_rng_range(rng, 1, 90),
                       .hq = (int32_t)kpt_rng_range(rng, 1, 16),
                       .b = (int32_t)kpt_rng_range(rng, 0, 3),
                       .h = (int32_t)kpt_rng_range(rng, 0, 15),
                       .b_known = true, .h_known = true, .scalars = scalars};
    return me;
}

/* The built-ins with random arguments, alone and composed: always exact (but document). */
static void test_builtins_exact(void **state)
{
    (void)state;
    kpt_rng rng;
    kpt_rng_seed(&rng, 42);
    for (int i = 0; i < 1200; i++) {
        char text[200];
        int w = (int)kpt_rng_range(&rng, 1, 40), l = (int)kpt_rng_range(&rng, 0, 20),
            r = (int)kpt_rng_range(&rng, 0, 20), c = (int)kpt_rng_range(&rng, 1, 30),
            pf = (int)kpt_rng_range(&rng, 0, 60);
        const char *terms[] = {"causal", "causal_bottom_right", "sliding_window(%d)", "local(%d, %d)",
                               "chunked(%d)", "prefix_lm(%d)", "full", "softcap(3)", "alibi"};
        int n = (int)kpt_rng_range(&rng, 1, 3);
        text[0] = 0;
        for (int t = 0; t < n; t++) {
            int which = (int)kpt_rng_range(&rng, 0, 8);
            char term[40];
            switch (which) {
            case 2: snprintf(term, sizeof(term), terms[2], w); break;
            case 3: snprintf(term, sizeof(term), terms[3], l, r); break;
            case 4: snprintf(term, sizeof(term), terms[4], c); break;
            case 5: snprintf(term, sizeof(term), terms[5], pf); break;
            default: snprintf(term, sizeof(term), "%s", terms[which]); break;
            }
            strcat(text, t ? "+" : "");
            strcat(text, term);
        }
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        if (kpt_pattern_parse(text, &p, &d) != KPT_OK)
            fail_msg("%s: %s", text, d.message);
        kpt_mask_env me = random_env(&rng, NULL);
        me.b_known = me.h_known = (i % 2) == 0; /* built-ins do not depend on b/h */
        check_grid(p, &me, tiles[kpt_rng_range(&rng, 0, 7)], tiles[kpt_rng_range(&rng, 0, 7)], true);
        kpt_pattern_destroy(&p);
    }
}

/* Runtime scalars: exact when their values are given, sound when they are not. */
static void test_runtime_scalars(void **state)
{
    (void)state;
    kpt_rng rng;
    kpt_rng_seed(&rng, 43);
    for (int i = 0; i < 300; i++) {
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        assert_int_equal(kpt_pattern_parse("sliding_window($w)+prefix_lm($p)", &p, &d), KPT_OK);
        kpt_ir_value sc[2] = {{.i = (int32_t)kpt_rng_range(&rng, -3, 50)},
                              {.i = (int32_t)kpt_rng_range(&rng, -3, 50)}};
        kpt_mask_env me = random_env(&rng, sc);
        check_grid(p, &me, tiles[kpt_rng_range(&rng, 0, 7)], tiles[kpt_rng_range(&rng, 0, 7)], true);
        kpt_pattern_destroy(&p);
    }
}

/* Random affine masks (q, k, constants, + - * //, & | ~): sound always; exact when no atom
 * mixes k with a division of k. Random general masks (mod, min, abs, f32, b, h): sound. */
static void run_random(bool affine, uint64_t seed, int count, int *exact_count)
{
    for (int i = 0; i < count; i++) {
        gen G = {0};
        kpt_rng_seed(&G.rng, seed + (uint64_t)i);
        G.affine_only = affine;
        G.exact_float = true;
        G.p = kpt_pattern_new("random");
        char err[100];
        assert_int_equal(kpt_pattern_scalar(G.p, "w", KPT_IR_I32, false, 0, err, sizeof(err)), 0);
        G.p->mask = gen_expr(&G, KPT_IR_BOOL, (int)kpt_rng_range(&G.rng, 1, 4));
        assert_false(G.p->g.failed);
        kpt_diag d = {0};
        assert_int_equal(kpt_pipeline_run(G.p, NULL, &d), KPT_OK);
        kpt_ir_value sc[1] = {{.i = (int32_t)kpt_rng_range(&G.rng, -10, 60)}};
        kpt_mask_env me = random_env(&G.rng, sc);
        if (kpt_rng_range(&G.rng, 0, 3) == 0)
            me.b_known = me.h_known = false;
        if (kpt_rng_range(&G.rng, 0, 5) == 0)
            me.scalars = NULL;
        *exact_count += check_grid(G.p, &me, tiles[kpt_rng_range(&G.rng, 0, 7)],
                                   tiles[kpt_rng_range(&G.rng, 0, 7)], false);
        kpt_pattern_destroy(&G.p);
    }
}

static void test_random_affine(void **state)
{
    (void)state;
    int exact = 0;
    run_random(true, 1000, 1500, &exact);
    /* most affine masks are exact; if this drops, the analysis lost power */
    assert_true(exact > 1200);
}

static void test_random_general(void **state)
{
    (void)state;
    int exact = 0;
    run_random(false, 90000, 1500, &exact);
}

/* Aux-dependent masks (document) are never called full or empty wrongly, and masks that do not
 * depend on q or k become constants. */
static void test_document_and_constants(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("document+causal", &p, &d), KPT_OK);
    kpt_mask_env me = {.sq = 100, .skv = 100, .hq = 1};
    kpt_mask_analysis *a = kpt_analyze_mask(p, &me);
    assert_non_null(a);
    assert_false(kpt_mask_analysis_exact(a));
    /* above the diagonal is still known empty through the causal atom */
    assert_int_equal(kpt_mask_classify(a, 0, 16, 32, 48), KPT_TILE_EMPTY);
    assert_int_equal(kpt_mask_classify(a, 32, 48, 0, 16), KPT_TILE_PARTIAL);
    kpt_mask_analysis_free(&a);
    kpt_pattern_destroy(&p);

    /* a mask of h only: known h makes it a constant */
    kpt_pattern *c = kpt_pattern_read("kpt-ir 1\n%1 = i32 h\n%2 = i32 const 2\n%3 = bool lt %1 %2\nmask %3\n", &d);
    assert_non_null(c);
    kpt_mask_env e2 = {.sq = 10, .skv = 10, .hq = 4, .h = 1, .h_known = true};
    a = kpt_analyze_mask(c, &e2);
    assert_true(kpt_mask_analysis_exact(a));
    assert_int_equal(kpt_mask_classify(a, 0, 10, 0, 10), KPT_TILE_FULL);
    kpt_mask_analysis_free(&a);
    e2.h = 3;
    a = kpt_analyze_mask(c, &e2);
    assert_int_equal(kpt_mask_classify(a, 0, 10, 0, 10), KPT_TILE_EMPTY);
    kpt_mask_analysis_free(&a);
    e2.h_known = false;
    a = kpt_analyze_mask(c, &e2);
    assert_false(kpt_mask_analysis_exact(a));
    assert_int_equal(kpt_mask_classify(a, 0, 10, 0, 10), KPT_TILE_PARTIAL);
    kpt_mask_analysis_free(&a);
    kpt_pattern_destroy(&c);
}

/* Sliding-window cost grows with the window, not the sequence: the kv range of a q tile is
 * exactly the tiles the window touches, at 64k tokens. */
static void test_window_at_scale(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("sliding_window(1024)", &p, &d), KPT_OK);
    kpt_mask_env me = {.sq = 65536, .skv = 65536, .hq = 8};
    kpt_mask_analysis *a = kpt_analyze_mask(p, &me);
    int64_t first, last;
    assert_true(kpt_mask_kv_range(a, 40000, 40128, 128, &first, &last));
    /* keys 40000-1023 = 38977 .. 40127 -> tiles 304 .. 313 */
    assert_int_equal(first, 38977 / 128);
    assert_int_equal(last, 40127 / 128);
    assert_int_equal(kpt_mask_classify(a, 40000, 40128, 39168, 39296), KPT_TILE_FULL);
    assert_int_equal(kpt_mask_classify(a, 40000, 40128, 39040, 39168), KPT_TILE_PARTIAL);
    assert_int_equal(kpt_mask_classify(a, 40000, 40128, 38912, 39040), KPT_TILE_PARTIAL);
    assert_int_equal(kpt_mask_classify(a, 40000, 40128, 0, 128), KPT_TILE_EMPTY);
    kpt_mask_analysis_free(&a);
    kpt_pattern_destroy(&p);
}

/* Large coefficients: forms that would overflow i32 (the IR wraps) or int64 must go opaque, not
 * mislead; checked for soundness against the wrapping brute force (and UBSan in CI). */
static void test_large_constants(void **state)
{
    (void)state;
    const char *masks[] = {
        "%1 = i32 q\n%2 = i32 const 2000000000\n%3 = i32 mul %1 %2\n%4 = i32 k\n%5 = bool lt %3 %4\n",
        "%1 = i32 k\n%2 = i32 const 1048576\n%3 = i32 mul %1 %2\n%4 = i32 const 3\n"
        "%5 = i32 idiv %3 %4\n%6 = i32 q\n%7 = i32 const 300000\n%8 = i32 mul %6 %7\n"
        "%9 = bool ge %5 %8\n",
        "%1 = i32 q\n%2 = i32 const 2147483647\n%3 = i32 add %1 %2\n%4 = i32 k\n%5 = bool ge %3 %4\n",
        "%1 = i32 k\n%2 = i32 const -2147483648\n%3 = i32 idiv %1 %2\n%4 = i32 q\n%5 = bool le %3 %4\n",
        "%1 = i32 q\n%2 = i32 const 1000000\n%3 = i32 mul %1 %2\n%4 = i32 mul %3 %2\n"
        "%5 = i32 mul %4 %2\n%6 = i32 k\n%7 = bool lt %5 %6\n",
        "%1 = i32 k\n%2 = i32 const 7\n%3 = i32 idiv %1 %2\n%4 = i32 const 1000000\n"
        "%5 = i32 mul %3 %4\n%6 = i32 q\n%7 = i32 mul %6 %4\n%8 = bool ge %7 %5\n",
    };
    for (size_t i = 0; i < sizeof(masks) / sizeof(masks[0]); i++) {
        char text[600];
        int n = snprintf(text, sizeof(text), "kpt-ir 1\n%s", masks[i]);
        /* the last node is the mask */
        const char *last = strrchr(masks[i], '%');
        while (last > masks[i] && last[-1] != '\n')
            last--;
        int label = atoi(last + 1);
        snprintf(text + n, sizeof(text) - (size_t)n, "mask %%%d\n", label);
        kpt_diag d = {0};
        kpt_pattern *p = kpt_pattern_read(text, &d);
        if (!p)
            fail_msg("%s\n%s", d.message, text);
        kpt_mask_env me = {.sq = 70, .skv = 90, .hq = 1};
        for (int t = 0; t < 4; t++)
            check_grid(p, &me, tiles[t + 2], tiles[t + 3], false);
        kpt_pattern_destroy(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins_exact),    cmocka_unit_test(test_runtime_scalars),
        cmocka_unit_test(test_random_affine),     cmocka_unit_test(test_random_general),
        cmocka_unit_test(test_document_and_constants), cmocka_unit_test(test_window_at_scale),
        cmocka_unit_test(test_large_constants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
