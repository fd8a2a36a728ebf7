/* The pattern-string parser: every error kind with its exact column, names, scalars, ALiBi. */
#include "tests/testutil.h"
#include "compiler/builtins.h"

static void expect_error(const char *text, int col, const char *msg)
{
    kpt_diag d = {0};
    kpt_pattern *p = NULL;
    kpt_status st = kpt_pattern_parse(text, &p, &d);
    assert_null(p);
    if (st != KPT_ERR_PARSE || d.column != col || d.line != 1 || !strstr(d.message, msg))
        fail_msg("pattern '%s': got status %d at column %d: %s\n(wanted column %d: %s)", text, st,
                 d.column, d.message, col, msg);
    /* the message shows the text and a caret under the column */
    const char *nl = strchr(d.message, '\n');
    assert_non_null(nl);
    const char *caret = strrchr(d.message, '\n');
    assert_non_null(caret);
    int spaces = 0;
    for (const char *c = caret + 1; *c == ' '; c++)
        spaces++;
    assert_int_equal(caret[1 + spaces], '^');
    assert_int_equal(spaces, 2 + col - 1); /* two spaces of indent */
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("", 1, "empty pattern");
    expect_error("   ", 4, "empty pattern");
    expect_error("causal+sliding_windw(128)", 8,
                 "unknown pattern 'sliding_windw'; did you mean 'sliding_window'?");
    expect_error("casual", 1, "did you mean 'causal'?");
    expect_error("docment+causal", 1, "did you mean 'document'?");
    expect_error("zebra", 1, "unknown pattern 'zebra' (kptc patterns lists the built-ins)");
    expect_error("sliding_window", 15, "'sliding_window' takes 1 argument: write sliding_window(W)");
    expect_error("sliding_window()", 16, "'sliding_window' takes 1 argument (sliding_window(W)), got 0");
    expect_error("sliding_window(1, 2)", 19, "'sliding_window' takes 1 argument (sliding_window(W)), got more");
    expect_error("local(1)", 8, "'local' takes 2 arguments (local(L, R)), got 1");
    expect_error("causal(3)", 7, "'causal' takes no arguments");
    expect_error("sliding_window(abc)", 16, "expected a number or a runtime scalar ($name), found 'a'");
    expect_error("sliding_window(1.5)", 16, "W of sliding_window must be an integer, got 1.5");
    expect_error("sliding_window(0)", 16, "W of sliding_window must be an integer in [1,");
    expect_error("sliding_window(12x)", 18, "malformed number");
    expect_error("sliding_window(1.)", 18, "expected digits after the decimal point");
    expect_error("softcap(0)", 9, "C of softcap must be > 0, got 0");
    expect_error("softcap(1e999)", 9, "number is out of range");
    expect_error("prefix_lm(-1)", 11, "P of prefix_lm must be an integer in [0,");
    expect_error("causal)", 7, "unexpected ')' after 'causal'; terms are joined with '+'");
    expect_error("causal causal", 8, "unexpected 'c' after 'causal'; terms are joined with '+'");
    expect_error("causal+", 8, "expected a pattern name such as 'causal' before the end of the pattern");
    expect_error("+causal", 1, "expected a pattern name such as 'causal' before '+'");
    expect_error("causal++full", 8, "expected a pattern name such as 'causal' before '+'");
    expect_error("sliding_window(8", 17, "expected ',' or ')' in the arguments of 'sliding_window'");
    expect_error("sliding_window($)", 17, "expected a scalar name after '$', found ')'");
    expect_error("sliding_window($w)+softcap($w)", 28, "runtime scalar '$w' is used as f32 here but as i32 before");
    expect_error("sliding_window($w=5)+local($w=6, 0)", 28, "runtime scalar '$w' has two different defaults");
    expect_error("sliding_window($w=0)", 19, "W of sliding_window must be an integer in [1,");
    expect_error("causal+\x01", 8, "found 0x01");
}

static void test_names_and_scalars(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("  causal +  sliding_window( 128 ) ", &p, &d), KPT_OK);
    assert_string_equal(kpt_pattern_name(p), "causal+sliding_window(128)");
    assert_true(kpt_pattern_has_mask(p));
    assert_false(kpt_pattern_has_score_mod(p));
    kpt_pattern_destroy(&p);

    assert_int_equal(kpt_pattern_parse("sliding_window($w=256)+softcap($cap)+local($w, 3)", &p, &d), KPT_OK);
    assert_int_equal(kpt_pattern_scalar_count(p), 2);
    kpt_scalar_info si;
    assert_int_equal(kpt_pattern_scalar_info(p, 0, &si), KPT_OK);
    assert_string_equal(si.name, "w");
    assert_int_equal(si.dtype, KPT_DTYPE_I32);
    assert_true(si.has_default);
    assert_true(si.default_value == 256);
    assert_int_equal(kpt_pattern_scalar_info(p, 1, &si), KPT_OK);
    assert_string_equal(si.name, "cap");
    assert_int_equal(si.dtype, KPT_DTYPE_F32);
    assert_false(si.has_default);
    assert_int_equal(kpt_pattern_scalar_info(p, 2, &si), KPT_ERR_INVALID_ARGUMENT);
    kpt_pattern_destroy(&p);

    assert_int_equal(kpt_pattern_parse("document+causal", &p, &d), KPT_OK);
    assert_int_equal(kpt_pattern_aux_count(p), 2);
    kpt_aux_info ai;
    assert_int_equal(kpt_pattern_aux_info(p, 0, &ai), KPT_OK);
    assert_string_equal(ai.name, "doc_q");
    assert_int_equal(ai.rank, 2);
    assert_int_equal(ai.dims[0], KPT_DIM_B);
    assert_int_equal(ai.dims[1], KPT_DIM_SQ);
    kpt_pattern_destroy(&p);

    /* full is no mask at all; causal+causal is one comparison */
    assert_int_equal(kpt_pattern_parse("full", &p, &d), KPT_OK);
    assert_false(kpt_pattern_has_mask(p));
    assert_false(kpt_pattern_has_score_mod(p));
    kpt_pattern_destroy(&p);
    assert_int_equal(kpt_pattern_parse("causal+causal", &p, &d), KPT_OK);
    char *text = kpt_pattern_ir_text(p);
    assert_non_null(text);
    assert_string_equal(text, "kpt-ir 1\npattern \"causal+causal\"\n%1 = i32 q\n%2 = i32 k\n"
                              "%3 = bool le %2 %1\nmask %3\n");
    kpt_free(text);
    kpt_pattern_destroy(&p);

    /* NULL handling */
    assert_int_equal(kpt_pattern_parse(NULL, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_int_equal(kpt_pattern_parse("causal", NULL, NULL), KPT_ERR_INVALID_ARGUMENT);
    kpt_pattern_destroy(NULL);
    assert_null(kpt_pattern_name(NULL));
    /* a long pattern is refused, not parsed */
    char *big = malloc(5000);
    memset(big, 'a', 4999);
    big[4999] = 0;
    assert_int_equal(kpt_pattern_parse(big, &p, &d), KPT_ERR_LIMIT);
    free(big);
}

/* Slopes from the ALiBi paper's reference code: for 8 heads 1/2, 1/4, ..., 1/256; for 12 heads
 * the 8-head slopes followed by every other slope of the 16-head sequence. */
static void test_alibi_slopes(void **state)
{
    (void)state;
    for (int h = 0; h < 8; h++)
        assert_true(fabs(kpt_alibi_slope(h, 8) - pow(2.0, -(h + 1))) < 1e-15);
    double s16[16];
    for (int i = 0; i < 16; i++)
        s16[i] = pow(2.0, -0.5 * (i + 1));
    for (int h = 0; h < 12; h++) {
        double want = h < 8 ? pow(2.0, -(h + 1)) : s16[2 * (h - 8)];
        assert_true(fabs(kpt_alibi_slope(h, 12) - want) < 1e-15);
    }
    /* the IR expression agrees with the closed form for many head counts */
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_ir_ref r = kpt_build_alibi_slope(&p->g);
    assert_false(p->g.failed);
    for (int hq = 1; hq <= 80; hq++)
        for (int h = 0; h < hq; h++) {
            kpt_ir_env env = {.h = h, .hq = hq};
            kpt_ir_value v;
            assert_true(kpt_ir_eval(&p->g, r, &env, &v));
            assert_true(fabs(v.f - kpt_alibi_slope(h, hq)) <= 1e-6 * kpt_alibi_slope(h, hq));
        }
    kpt_pattern_destroy(&p);
}

/* Every built-in's IR means what the table says, at random points. */
static void test_builtin_meaning(void **state)
{
    (void)state;
    kpt_rng rng;
    kpt_rng_seed(&rng, 7);
    struct {
        const char *text;
        int id;
    } pats[] = {{"causal", 0}, {"causal_bottom_right", 1}, {"sliding_window(7)", 2},
                {"local(3, 5)", 3}, {"chunked(6)", 4}, {"prefix_lm(9)", 5},
                {"softcap(2.5)", 6}, {"alibi", 7}, {"full", 8}};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        assert_int_equal(kpt_pattern_parse(pats[i].text, &p, &d), KPT_OK);
        for (int n = 0; n < 2000; n++) {
            kpt_ir_env env = {.q = (int32_t)kpt_rng_range(&rng, 0, 40),
                              .k = (int32_t)kpt_rng_range(&rng, 0, 40),
                              .sq = 30, .skv = 41, .hq = 6,
                              .h = (int32_t)kpt_rng_range(&rng, 0, 5),
                              .s = kpt_rng_normal(&rng) * 4};
            int q = env.q, k = env.k;
            bool keep = true;
            double s = env.s;
            switch (pats[i].id) {
            case 0: keep = q >= k; break;
            case 1: keep = q + 41 - 30 >= k; break;
            case 2: keep = q >= k && q - k < 7; break;
            case 3: keep = k - q <= 5 && q - k <= 3; break;
            case 4: keep = q / 6 == k / 6; break;
            case 5: keep = k < 9 || q >= k; break;
            case 6: s = 2.5 * tanh(s / 2.5); break;
            case 7: s = s + kpt_alibi_slope(env.h, 6) * (k - q); break;
            default: break;
            }
            kpt_ir_value v;
            if (p->mask) {
                assert_true(kpt_ir_eval(&p->g, p->mask, &env, &v));
                assert_int_equal(v.i, keep);
            }
            if (p->score) {
                assert_true(kpt_ir_eval(&p->g, p->score, &env, &v));
                assert_true(fabs(v.f - s) < 1e-5 * (1 + fabs(s)));
            } else {
                assert_true(s == env.s);
            }
        }
        kpt_pattern_destroy(&p);
    }
}

static void test_suggest(void **state)
{
    (void)state;
    assert_string_equal(kpt_builtin_suggest("sliding", 7), "sliding_window");
    assert_string_equal(kpt_builtin_suggest("softcapp", 8), "softcap");
    assert_string_equal(kpt_builtin_suggest("alibj", 5), "alibi");
    assert_null(kpt_builtin_suggest("xyzzy", 5));
    assert_int_equal(kpt_builtin_count(), kpt_num_builtins);
    assert_null(kpt_builtin_get(kpt_num_builtins));
    assert_null(kpt_builtin_get(-1));
    assert_string_equal(kpt_builtin_get(0)->name, "full");
}

/* Every row's examples parse, name the term, and (with scalars) declare one scalar per param. */
static void test_builtin_examples(void **state)
{
    (void)state;
    for (int i = 0; i < kpt_num_builtins; i++) {
        const kpt_builtin *b = &kpt_builtins[i];
        const char *ex[2] = {b->example, b->scalar_example};
        assert_non_null(b->example);
        assert_true((b->scalar_example != NULL) == (b->nparams > 0));
        for (int e = 0; e < 2 && ex[e]; e++) {
            assert_non_null(strstr(ex[e], b->info.name));
            kpt_pattern *p = NULL;
            kpt_diag d = {0};
            if (kpt_pattern_parse(ex[e], &p, &d))
                print_message("%s: %s\n", ex[e], d.message);
            assert_non_null(p);
            assert_int_equal(p->num_scalars, e ? b->nparams : 0);
            kpt_pattern_destroy(&p);
        }
    }
}

/* Random strings and mutations of valid patterns: never a crash; an error always has a position
 * inside the text (or just after it) and a caret line. */
static void test_fuzz(void **state)
{
    (void)state;
    static const char *seeds[] = {"document+causal+softcap($c=30.5)", "local(3, 4)+alibi",
                                  "sliding_window($w=1024)+prefix_lm(7)", "chunked(64)"};
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz_$()+,=.-0123456789 e\t\x01\xff";
    kpt_rng rng;
    kpt_rng_seed(&rng, 99);
    char buf[80];
    for (int i = 0; i < 20000; i++) {
        size_t len;
        if (i % 2) {
            len = (size_t)kpt_rng_range(&rng, 0, 40);
            for (size_t j = 0; j < len; j++)
                buf[j] = alphabet[kpt_rng_range(&rng, 0, sizeof(alphabet) - 2)];
        } else {
            const char *s = seeds[kpt_rng_range(&rng, 0, 3)];
            len = strlen(s);
            memcpy(buf, s, len);
            for (int m = (int)kpt_rng_range(&rng, 1, 3); m > 0; m--) {
                size_t at = (size_t)kpt_rng_range(&rng, 0, (int64_t)len - 1);
                buf[at] = alphabet[kpt_rng_range(&rng, 0, sizeof(alphabet) - 2)];
            }
        }
        buf[len] = 0;
        kpt_pattern *p = NULL;
        kpt_diag d = {0};
        kpt_status st = kpt_pattern_parse(buf, &p, &d);
        if (st == KPT_OK) {
            assert_non_null(p);
            kpt_pattern_destroy(&p);
            continue;
        }
        assert_null(p);
        assert_int_equal(st, KPT_ERR_PARSE);
        assert_true(d.line >= 1 && d.column >= 1 && (size_t)d.column <= len + 1);
        assert_non_null(strchr(d.message, '^'));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_names_and_scalars),
        cmocka_unit_test(test_alibi_slopes),  cmocka_unit_test(test_builtin_meaning),
        cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_builtin_examples),       cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
