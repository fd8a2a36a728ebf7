/* The Lua front end: the expression surface traced into IR (checked by evaluating the IR against
 * the same formula in C), params and runtime scalars, aux tensors, composition with built-ins,
 * errors with the script's line, and the sandbox against escape attempts and runaway scripts. */
#include "tests/testutil.h"

#include <time.h>
#include <unistd.h>

#include "compiler/parse_lua.h"
#include "ir/ir_eval.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static kpt_status compile(const char *src, const kpt_lua_params *prm, kpt_pattern **p,
                          kpt_diag *d)
{
    kpt_lua_params local = {.name = "t.lua"};
    if (!prm)
        prm = &local;
    memset(d, 0, sizeof(*d));
    return kpt_pattern_from_lua(src, strlen(src), prm, p, d);
}

static kpt_pattern *must_compile(const char *src)
{
    kpt_pattern *p;
    kpt_diag d;
    if (compile(src, NULL, &p, &d) != KPT_OK)
        fail_msg("script failed: %s\n--- script ---\n%s", d.message, src);
    return p;
}

/* Expects failure with `status`, a message containing `needle`, on `line` (0: any). */
static void expect_error(const char *src, kpt_status status, const char *needle, int line)
{
    kpt_pattern *p;
    kpt_diag d;
    kpt_status st = compile(src, NULL, &p, &d);
    if (st == KPT_OK) {
        kpt_pattern_destroy(&p);
        fail_msg("expected an error containing '%s' from:\n%s", needle, src);
    }
    assert_null(p);
    if (st != status || !strstr(d.message, needle) || (line && d.line != line))
        fail_msg("wanted status %d, line %d, '%s'; got status %d, line %d:\n%s", status, line,
                 needle, st, d.line, d.message);
}

static kpt_ir_env env_at(double s, int b, int h, int q, int k)
{
    kpt_ir_env e = {.s = s, .b = b, .h = h, .q = q, .k = k, .sq = 100, .skv = 120, .hq = 8};
    return e;
}

static double score_at(const kpt_pattern *p, double s, int b, int h, int q, int k)
{
    if (!p->score)
        return s;
    kpt_ir_env e = env_at(s, b, h, q, k);
    kpt_ir_value v;
    assert_true(kpt_ir_eval(&p->g, p->score, &e, &v));
    return v.f;
}

static bool mask_at(const kpt_pattern *p, int b, int h, int q, int k)
{
    if (!p->mask)
        return true;
    kpt_ir_env e = env_at(0, b, h, q, k);
    kpt_ir_value v;
    assert_true(kpt_ir_eval(&p->g, p->mask, &e, &v));
    return v.i != 0;
}

static double lua_floor_div(double a, double b)
{
    return floor(a / b);
}

static int64_t lua_imod(int64_t a, int64_t b)
{
    int64_t m = a % b;
    return m != 0 && (m ^ b) < 0 ? m + b : m;
}

/* ---- the expression surface ------------------------------------------------------------------ */

static void test_arithmetic(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{ score = function(s, b, h, q, k)\n"
        "  return s * 2 + (q - k) / 4 - (q // 3) + (k % 5) + 0.5 ^ (h - 2) + -s\n"
        "end }");
    for (int q = 0; q < 40; q += 7)
        for (int k = 0; k < 40; k += 5)
            for (int h = 0; h < 4; h++) {
                double s = 0.25 * q - 0.5 * k;
                double want = s * 2 + (q - k) / 4.0 - (q / 3) + (k % 5) + pow(0.5, h - 2) - s;
                assert_true(fabs(score_at(p, s, 0, h, q, k) - want) < 1e-6);
            }
    kpt_pattern_destroy(&p);

    /* floor division and modulo follow Lua on negative operands, for i32 and f32 */
    p = must_compile("return kpt.pattern{ score = function(s, b, h, q, k)\n"
                     "  return kpt.float((q - k) // 4 * 100 + (q - k) % 7) + (s // 0.75) + s % 0.75\n"
                     "end }");
    for (int q = 0; q < 20; q += 3)
        for (int k = 0; k < 20; k += 2) {
            double s = 0.3 * q - 0.7 * k;
            /* f32 ops in float, as the kernels compute them (docs/architecture.md) */
            float fs = (float)s, fq = floorf(fs / 0.75f);
            double want = (double)(lua_floor_div(q - k, 4) * 100 + (double)lua_imod(q - k, 7)) +
                          fq + (fs - fq * 0.75f);
            assert_true(fabs(score_at(p, s, 0, 0, q, k) - want) < 1e-6 * fmax(1.0, fabs(want)));
        }
    kpt_pattern_destroy(&p);
}

static void test_functions(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{ score = function(s, b, h, q, k)\n"
        "  local x = kpt.exp(s / 8) + kpt.log(kpt.abs(s) + 1) + kpt.tanh(s) + kpt.sqrt(kpt.abs(s))\n"
        "  local y = kpt.min(s, 1, q) + kpt.max(s, -1) + kpt.floor(s) + kpt.clamp(s, -0.5, 0.5)\n"
        "  local z = kpt.float(kpt.abs(q - k)) + kpt.float(kpt.int(s * 3)) + kpt.float(q:ge(k))\n"
        "  return x + y + z + kpt.where(q:lt(k), s, -s)\n"
        "end }");
    for (int q = 0; q < 12; q += 3)
        for (int k = 0; k < 12; k += 4) {
            double s = 0.9 * q - 1.3 * k;
            double x = exp(s / 8) + log(fabs(s) + 1) + tanh(s) + sqrt(fabs(s));
            double y = fmin(fmin(s, 1), q) + fmax(s, -1) + floor(s) + fmin(fmax(s, -0.5), 0.5);
            double z = fabs((double)(q - k)) + floor(s * 3) + (q >= k);
            double want = x + y + z + (q < k ? s : -s);
            double got = score_at(p, s, 0, 0, q, k);
            if (fabs(got - want) > 1e-4 * (1 + fabs(want)))
                fail_msg("q=%d k=%d: %g, wanted %g", q, k, got, want);
        }
    kpt_pattern_destroy(&p);

    /* on plain numbers the functions compute at once (the pattern has no score mod left) */
    p = must_compile("local c = kpt.exp(0) + kpt.max(1, 2, 3) + kpt.min(4, 5) + kpt.abs(-2) + "
                     "kpt.floor(2.5) + kpt.clamp(9, 0, 3) + kpt.int(2.9) + kpt.float(1)\n"
                     "assert(c == 1 + 3 + 4 + 2 + 2 + 3 + 2 + 1, c)\n"
                     "assert(kpt.where(true, 1, 2) == 1 and kpt.lt(1, 2) == true and "
                     "kpt.ge(1, 2) == false and kpt.ne(1, 1) == false)\n"
                     "return kpt.pattern{ score = function(s) return s * (c - 17) end }");
    assert_int_equal(p->score, 0);
    kpt_pattern_destroy(&p);
}

static void test_comparisons_and_logic(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{ mask = function(b, h, q, k)\n"
        "  local a = q:lt(k) | q:le(k - 3) | q:gt(k + 10)\n"
        "  local c = q:ge(5) & k:ne(7) & ~(q:eq(9))\n"
        "  return (a ~ c) | (kpt.lt(30, q) & kpt.eq(true, k:gt(25)))\n"
        "end }");
    for (int q = 0; q < 40; q++)
        for (int k = 0; k < 40; k++) {
            bool a = q < k || q <= k - 3 || q > k + 10;
            bool c = q >= 5 && k != 7 && !(q == 9);
            bool want = (a != c) || (30 < q && k > 25);
            assert_int_equal(mask_at(p, 0, 0, q, k), want);
        }
    kpt_pattern_destroy(&p);
}

/* Lua's integer bit operators on traced i32 values (Lua 5.4's own & | ~ << >>; >> is logical,
 * x:ashr(n) arithmetic), against the same operations in C; and erf. */
static void test_bits_and_erf(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{ mask = function(b, h, q, k)\n"
        "  local x = ((q ~ k) & 5) | (q << 2) | (~k >> 28)\n"
        "  local y = (q - k):ashr(1) ~ ((q - k) >> 30) ~ (q << (k - 3))\n"
        "  return ((x + y) & 3):eq(1)\n"
        "end, score = function(s, b, h, q, k)\n"
        "  return kpt.erf(s) + kpt.erf(1)\n"
        "end }");
    for (int q = 0; q < 40; q++)
        for (int k = 0; k < 40; k++) {
            uint32_t uq = (uint32_t)q, uk = (uint32_t)k, d = (uint32_t)(q - k);
            uint32_t x = ((uq ^ uk) & 5) | (uq << 2) | (~uk >> 28);
            int32_t ashr = (q - k) < 0 ? ~(int32_t)(~d >> 1) : (int32_t)(d >> 1);
            uint32_t shl = k - 3 >= 0 && k - 3 < 32 ? uq << (k - 3) : 0;
            uint32_t y = (uint32_t)ashr ^ (d >> 30) ^ shl;
            bool want = ((x + y) & 3) == 1;
            if (mask_at(p, 0, 0, q, k) != want)
                fail_msg("q=%d k=%d: wanted %d", q, k, want);
        }
    for (double s = -3; s <= 3; s += 0.37) {
        double want = (double)(float)erf((double)(float)s) + (double)(float)erf(1.0);
        assert_true(fabs(score_at(p, s, 0, 0, 3, 4) - want) < 1e-6);
    }
    kpt_pattern_destroy(&p);
    /* on plain numbers Lua computes them itself */
    p = must_compile("assert((6 & 3) == 2 and kpt.erf(0) == 0)\nreturn kpt.pattern{}");
    kpt_pattern_destroy(&p);
}

static void test_builtins_compose(void **state)
{
    (void)state;
    /* a script that says what a pattern string says compiles to the same IR */
    kpt_pattern *a = must_compile(
        "return kpt.pattern{ name = 'x',\n"
        "  mask = function(b, h, q, k) return kpt.builtin('causal') & kpt.builtin('sliding_window(64)') end,\n"
        "  score = function(s) return kpt.builtin_score('softcap(30)', s) end }");
    kpt_pattern *b = NULL;
    kpt_diag d;
    assert_int_equal(kpt_pattern_parse("causal+sliding_window(64)+softcap(30)", &b, &d), KPT_OK);
    for (int q = 0; q < 100; q += 3)
        for (int k = 0; k < 100; k += 2) {
            assert_int_equal(mask_at(a, 0, 0, q, k), mask_at(b, 0, 0, q, k));
            double s = 0.7 * q - 0.6 * k;
            assert_true(score_at(a, s, 0, 0, q, k) == score_at(b, s, 0, 0, q, k));
        }
    assert_int_equal(a->g.count, b->g.count); /* the same nodes, perhaps in another order */
    kpt_pattern_destroy(&a);
    kpt_pattern_destroy(&b);

    /* runtime scalars and aux tensors of built-ins join the script's */
    a = must_compile("return kpt.pattern{ mask = function(b, h, q, k)\n"
                     "  return kpt.builtin('document') | kpt.builtin('sliding_window($w=32)') end }");
    assert_int_equal(a->num_scalars, 1);
    assert_string_equal(a->scalars[0].name, "w");
    assert_int_equal(a->num_aux, 2);
    kpt_pattern_destroy(&a);
    expect_error("return kpt.pattern{ mask = function() return kpt.builtin('softcap(3)') end }",
                 KPT_ERR_TYPE, "modifies the score", 1);
    expect_error("return kpt.pattern{ mask = function() return kpt.builtin('causl') end }",
                 KPT_ERR_PARSE, "did you mean 'causal'", 1);
}

/* Lua's and/or/if drop traced conditions; what they leave unused is reported with its line. */
static void test_dropped_conditions(void **state)
{
    (void)state;
    expect_error("return kpt.pattern{ mask = function(b, h, q, k)\n"
                 "  return q:ge(k) and (q - k):lt(8)\n"
                 "end }", KPT_ERR_TYPE, "never used by the mask or score", 2);
    expect_error("return kpt.pattern{ mask = function(b, h, q, k)\n"
                 "  if q:ge(k) then return true end\n"
                 "  return false\n"
                 "end }", KPT_ERR_TYPE, "kpt.where", 2);
    expect_error("return kpt.pattern{ score = function(s, b, h, q, k)\n"
                 "  local far = (q - k):gt(64)\n"
                 "  return far and s - 1 or s\n"
                 "end }", KPT_ERR_TYPE, "never used", 2);
}

static void test_params_and_runtime(void **state)
{
    (void)state;
    const char *src =
        "return kpt.pattern{\n"
        "  params = { W = 16, scale = 0.5, on = true, c = kpt.runtime('cap', 30.0) },\n"
        "  mask = function(b, h, q, k, p)\n"
        "    if p.on then return (q - k):lt(p.W) end\n"
        "    return true\n"
        "  end,\n"
        "  score = function(s, b, h, q, k, p) return p.c * kpt.tanh(s * p.scale / p.c) end,\n"
        "}";
    kpt_pattern *p = must_compile(src);
    assert_int_equal(p->num_scalars, 1);
    assert_true(p->scalars[0].type == KPT_IR_F32 && p->scalars[0].def == 30.0);
    assert_true(mask_at(p, 0, 0, 20, 5) && !mask_at(p, 0, 0, 21, 5));
    kpt_pattern_destroy(&p);

    kpt_param_value vals[] = {{"W", 4}, {"on", 1}, {"c", 12.5}};
    kpt_lua_params prm = {.name = "t.lua", .params = vals, .num_params = 3};
    kpt_diag d;
    assert_int_equal(compile(src, &prm, &p, &d), KPT_OK);
    assert_true(mask_at(p, 0, 0, 8, 5) && !mask_at(p, 0, 0, 9, 5));
    assert_true(p->scalars[0].def == 12.5);
    kpt_pattern_destroy(&p);

    kpt_param_value off[] = {{"on", 0}};
    prm = (kpt_lua_params){.name = "t.lua", .params = off, .num_params = 1};
    assert_int_equal(compile(src, &prm, &p, &d), KPT_OK);
    assert_int_equal(p->mask, 0); /* the script returned true: no mask */
    kpt_pattern_destroy(&p);

    kpt_param_value bad[] = {{"Wx", 3}};
    prm = (kpt_lua_params){.name = "t.lua", .params = bad, .num_params = 1};
    assert_int_equal(compile(src, &prm, &p, &d), KPT_ERR_NOT_FOUND);
    assert_non_null(strstr(d.message, "no param 'Wx'"));
    assert_non_null(strstr(d.message, "W"));
    kpt_param_value frac[] = {{"W", 2.5}};
    prm = (kpt_lua_params){.name = "t.lua", .params = frac, .num_params = 1};
    assert_int_equal(compile(src, &prm, &p, &d), KPT_ERR_TYPE);
    assert_non_null(strstr(d.message, "is an integer"));
}

static void test_aux(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{\n"
        "  aux = {\n"
        "    doc = { dtype = 'int32', shape = {'b', 'sq'}, fill = kpt.segments() },\n"
        "    offsets = { dtype = 'int32', shape = {'b', 64}, fill = kpt.range(0, 9) },\n"
        "    dist = { dtype = 'int32', shape = {'b', 'sq', 'skv'} },\n"
        "    bias = { dtype = 'bf16', shape = {'hq', 'any'}, fill = function(shape) return {} end },\n"
        "    flag = { dtype = 'bool', shape = {'skv'} },\n"
        "  },\n"
        "  score = function(s, b, h, q, k, p)\n"
        "    return s + p.bias[h][q - k + kpt.skv] + kpt.float(p.dist[b][q][k])\n"
        "  end,\n"
        "  mask = function(b, h, q, k, p)\n"
        "    return (q - p.offsets[b][p.doc[b][q]]):ge(0) & p.flag[k]\n"
        "  end,\n"
        "}");
    /* declared sorted by name, whatever Lua's table order */
    const char *names[] = {"bias", "dist", "doc", "flag", "offsets"};
    assert_int_equal(p->num_aux, 5);
    for (int i = 0; i < 5; i++)
        assert_string_equal(p->aux[i].name, names[i]);
    assert_int_equal(p->aux[0].dtype, KPT_DTYPE_BF16);
    assert_int_equal(p->aux[0].fill, KPT_FILL_SCRIPT);
    assert_int_equal(p->aux[2].fill, KPT_FILL_SEGMENTS);
    assert_true(p->aux[4].fill == KPT_FILL_RANGE && p->aux[4].fill_hi == 9 &&
                p->aux[4].dims[1] == 64);
    assert_true(p->aux[1].rank == 3 && p->aux[1].dims[2] == KPT_DIM_SKV);
    kpt_pattern_destroy(&p);
}

/* Rank 4 ([B, N, N, K] edge features): four indices make one load of four operands, in order. */
static void test_aux_rank4(void **state)
{
    (void)state;
    kpt_pattern *p = must_compile(
        "return kpt.pattern{\n"
        "  aux = { edge = { dtype = 'float32', shape = {'b', 'sq', 'skv', 3} } },\n"
        "  score = function(s, b, h, q, k, p) return s + p.edge[b][q][k][h % 3] end,\n"
        "}");
    assert_true(p->num_aux == 1 && p->aux[0].rank == 4 && p->aux[0].dims[3] == 3 &&
                p->aux[0].dims[2] == KPT_DIM_SKV);
    int loads = 0;
    for (kpt_ir_ref r = 1; r < p->g.count; r++) {
        const kpt_ir_node *n = kpt_ir_node_get(&p->g, r);
        if (n->op != KPT_IR_LOAD)
            continue;
        loads++;
        assert_int_equal(n->nargs, 4);
        assert_int_equal(kpt_ir_node_get(&p->g, n->arg[0])->op, KPT_IR_B);
        assert_int_equal(kpt_ir_node_get(&p->g, n->arg[1])->op, KPT_IR_Q);
        assert_int_equal(kpt_ir_node_get(&p->g, n->arg[2])->op, KPT_IR_K);
        assert_int_equal(kpt_ir_node_get(&p->g, n->arg[3])->op, KPT_IR_MOD);
    }
    assert_int_equal(loads, 1);
    kpt_aux_info info;
    assert_int_equal(kpt_pattern_aux_info(p, 0, &info), KPT_OK);
    assert_true(info.rank == 4 && info.dims[0] == KPT_DIM_B && info.dims[3] == 3);
    kpt_pattern_destroy(&p);
}

static void test_fill(void **state)
{
    (void)state;
    const char *src = "return kpt.pattern{ aux = { t = { dtype = 'float32', shape = {'b', 'sq'},\n"
                      "  fill = function(shape, seed)\n"
                      "    local out = {}\n"
                      "    for i = 1, shape[1] * shape[2] do out[i] = i * 10 + seed end\n"
                      "    return out\n"
                      "  end } } }";
    int64_t shape[2] = {2, 3};
    double out[6];
    kpt_diag d;
    assert_int_equal(kpt_lua_fill_aux(src, strlen(src), NULL, "t", 2, shape, 5, out, &d), KPT_OK);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == (i + 1) * 10 + 5);
    shape[1] = 4;
    double big[8];
    const char *short_src = "return kpt.pattern{ aux = { t = { dtype = 'int32', shape = {'b'},\n"
                            "  fill = function(shape) return {1, 2} end } } }";
    shape[0] = 3;
    assert_int_equal(kpt_lua_fill_aux(short_src, strlen(short_src), NULL, "t", 1, shape, 1, big, &d),
                     KPT_ERR_TYPE);
    assert_non_null(strstr(d.message, "returned 2 values"));
    /* a list larger than a script's 64 MiB (Graphormer's distances over 2000 nodes): the
     * sandbox grows with the tensor's size */
    const char *big_src = "return kpt.pattern{ aux = { t = { dtype = 'int32', shape = {'b', 'sq', "
                          "'skv'},\n  fill = function(shape)\n    local out = {}\n"
                          "    for i = 1, shape[1] * shape[2] * shape[3] do out[i] = i * 10 end\n"
                          "    return out\n  end } } }";
    int64_t graph[3] = {1, 2000, 2000};
    double *dist = malloc(sizeof(double) * 4000000);
    assert_non_null(dist);
    assert_int_equal(kpt_lua_fill_aux(big_src, strlen(big_src), NULL, "t", 3, graph, 0, dist, &d),
                     KPT_OK);
    assert_true(dist[3999999] == 40000000.0);
    free(dist);
}

/* ---- errors name the script and the line --------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    expect_error("return kpt.pattern{\n score = function(s, b, h, q, k)\n  return s + q:ge(k)\n end }",
                 KPT_ERR_TYPE, "cannot add an f32 expression and a boolean expression", 3);
    expect_error("return kpt.pattern{ aux = { t = { dtype = 'int32', shape = {'sq'} } },\n"
                 " mask = function(b, h, q, k, p)\n  return p.t[kpt.float(q) * 0.5]:eq(1) end }",
                 KPT_ERR_TYPE, "index 1 of aux tensor 't' must be an integer, got an f32", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return kpt.float(q) end }",
                 KPT_ERR_TYPE, "mask must return a boolean expression", 2);
    expect_error("return kpt.pattern{\n score = function(s, b, h, q, k)\n  return q:lt(k) end }",
                 KPT_ERR_TYPE, "score must return a number expression", 2);
    expect_error("return kpt.pattern{ mask = function() end }", KPT_ERR_TYPE,
                 "mask must return one value, it returned 0", 1);
    expect_error("return 42", KPT_ERR_INVALID_ARGUMENT, "must end with `return kpt.pattern{...}`",
                 0);
    expect_error("local x = 1", KPT_ERR_INVALID_ARGUMENT, "returned nothing", 0);
    expect_error("return kpt.pattern{ aux = { doc = { dtype = 'int32', shape = {'sq'} } },\n"
                 " mask = function(b, h, q, k, p)\n  return p.dco[q]:eq(0) end }",
                 KPT_ERR_NOT_FOUND, "unknown aux tensor or param 'dco' (this pattern declares: doc)",
                 3);
    expect_error("return kpt.pattern{ aux = { d = { dtype = 'int32', shape = {'b', 'sq'} } },\n"
                 " mask = function(b, h, q, k, p)\n\n  return p.d[b][q][k]:eq(0) end }",
                 KPT_ERR_TYPE, "too many indices: aux tensor 'd' has rank 2", 4);
    expect_error("return kpt.pattern{ aux = { d = { dtype = 'int32', shape = {'b', 'sq'} } },\n"
                 " mask = function(b, h, q, k, p)\n  return p.d[b] + 1 end }",
                 KPT_ERR_TYPE, "aux tensor 'd' has rank 2 but was given 1 index", 3);
    expect_error("return kpt.pattern{ aux = { e = { dtype = 'float32', shape = {'b', 'sq', 'skv', 2} } },\n"
                 " score = function(s, b, h, q, k, p)\n  return s + p.e[b][q][k][0][1] end }",
                 KPT_ERR_TYPE, "too many indices: aux tensor 'e' has rank 4", 3);
    expect_error("return kpt.pattern{ aux = { e = { dtype = 'float32', shape = {'b', 'sq', 'skv', 2} } },\n"
                 " score = function(s, b, h, q, k, p)\n  return s + p.e[b][q][k] end }",
                 KPT_ERR_TYPE, "aux tensor 'e' has rank 4 but was given 3 indices", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return q < k end }",
                 KPT_ERR_TYPE, "write a:lt(b)", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return q == k end }",
                 KPT_ERR_TYPE, "write a:eq(b)", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return q & kpt.float(k) end }",
                 KPT_ERR_TYPE, "& takes booleans (masks) or integers, got an f32 expression", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return (q & k:lt(2)):eq(0) end }",
                 KPT_ERR_TYPE, "& takes two booleans (masks) or two integers", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return q:lt(k) << 2 end }",
                 KPT_ERR_TYPE, "<< takes integers", 3);
    expect_error("return kpt.pattern{\n mask = function(b, h, q, k)\n  return (q & 2.5):eq(0) end }",
                 KPT_ERR_TYPE, "& takes booleans (masks) or integers, got the number 2.5", 3);
    expect_error("return kpt.pattern{ mask = function(b, h, q, k)\n  return (q + 3000000000):lt(k) end }",
                 KPT_ERR_TYPE, "does not fit in i32", 2);
    expect_error("return kpt.pattern{ mask = function(b, h, q, k)\n  return q:foo(k) end }",
                 KPT_ERR_NOT_FOUND, "no method 'foo'", 2);
    expect_error("return kpt.pattern{ maks = function() end }", KPT_ERR_INVALID_ARGUMENT,
                 "unknown field 'maks'", 1);
    expect_error("return kpt.pattern{ aux = { d = { dtype = 'int64', shape = {'sq'} } } }",
                 KPT_ERR_INVALID_ARGUMENT, "dtype must be", 1);
    expect_error("return kpt.pattern{ aux = { d = { dtype = 'int32', shape = {'b','b','b','b','b'} } } }",
                 KPT_ERR_INVALID_ARGUMENT, "rank 5 is not supported", 1);
    expect_error("\n\nlocal x = = 2", KPT_ERR_PARSE, "unexpected symbol", 3);
    expect_error("return kpt.pattern{ mask = function() error('my own message') end }",
                 KPT_ERR_INVALID_ARGUMENT, "my own message", 1);
    expect_error("return kpt.pattern{ mask = function()\n error({code = 1}) end }",
                 KPT_ERR_INVALID_ARGUMENT, "error object is a table value", 2);
    /* an error object with a __tostring that would run forever is never converted */
    expect_error("error(setmetatable({}, {__tostring = function() while true do end end}))",
                 KPT_ERR_INVALID_ARGUMENT, "error object is a table value", 1);
    expect_error("return kpt.pattern{ params = { w = kpt.runtime('w w', 3) } }",
                 KPT_ERR_INVALID_ARGUMENT, "not a valid scalar name", 1);
}

/* ---- the sandbox -------------------------------------------------------------------------- */

static void test_sandbox_escapes(void **state)
{
    (void)state;
    static const struct {
        const char *src;
        const char *needle;
    } cases[] = {
        {"os.execute('touch /tmp/kpt_pwned')", "global 'os'"},
        {"io.open('/etc/passwd')", "global 'io'"},
        {"require('os')", "global 'require'"},
        {"load('return 1')", "global 'load'"},
        {"loadfile('/etc/passwd')", "global 'loadfile'"},
        {"dofile('/etc/passwd')", "global 'dofile'"},
        {"debug.getregistry()", "global 'debug'"},
        {"package.loadlib('libc.so.6', 'system')", "global 'package'"},
        {"collectgarbage('stop')", "global 'collectgarbage'"},
        {"string.dump(function() end)", "field 'dump'"},
        {"string.find(('a'):rep(40), ('a*'):rep(40) .. 'b')", "field 'find'"},
        {"getmetatable('').__index = {}", "index a boolean value"},
        {"setmetatable(kpt.sq, {})", "table expected"},
        {"getmetatable(kpt.sq).__add = print", "index a boolean value"},
        {"coroutine.wrap(print)", "global 'coroutine'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kpt_pattern *p;
        kpt_diag d;
        kpt_status st = compile(cases[i].src, NULL, &p, &d);
        if (st == KPT_OK || !strstr(d.message, cases[i].needle))
            fail_msg("'%s': status %d, message: %s", cases[i].src, st, d.message);
    }
    /* bytecode is refused before Lua sees it */
    const char bytecode[] = "\x1bLua\x54\x00\x19\x93\r\n\x1a\n";
    kpt_pattern *p;
    kpt_diag d;
    assert_int_equal(kpt_pattern_from_lua(bytecode, sizeof(bytecode) - 1, NULL, &p, &d),
                     KPT_ERR_PARSE);
    assert_non_null(strstr(d.message, "bytecode is refused"));
    /* nothing ran */
    FILE *f = fopen("/tmp/kpt_pwned", "r");
    assert_null(f);
}

static void expect_limit(const char *src, const kpt_lua_params *prm, const char *needle)
{
    kpt_pattern *p;
    kpt_diag d;
    kpt_status st = compile(src, prm, &p, &d);
    if (st != KPT_ERR_LIMIT || !strstr(d.message, needle))
        fail_msg("'%s': status %d, message: %s", src, st, d.message);
    assert_null(p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Expects failure with `status` and a message containing `needle`, the script named t.lua. */
static void expect_error_with(const char *src, const kpt_lua_params *prm, kpt_status status,
                              const char *needle)
{
    kpt_lua_params named = {.name = "t.lua"};
    kpt_pattern *p;
    kpt_diag d;
    kpt_status st = compile(src, prm ? prm : &named, &p, &d);
    if (st != status || !strstr(d.message, needle))
        fail_msg("'%s': wanted status %d and '%s'; got %d: %s", src, status, needle, st,
                 d.message);
    assert_null(p);
}

static void test_sandbox_limits(void **state)
{
    (void)state;
    /* a wall-clock limit far above the budget's time: these check the budget, and under a
     * loaded machine (sanitizers, parallel tests) 5 s once ran out first */
    kpt_lua_params prm = {.name = "t.lua", .max_memory = 8 << 20, .max_instructions = 20000000,
                          .max_seconds = 120};
    expect_limit("while true do end", &prm, "instruction budget exhausted");
    expect_limit("local x = 0\nfor i = 1, 1e12 do x = x + i end", &prm, "t.lua:2");
    /* catching the budget's error does not help */
    expect_limit("while true do pcall(function() while true do end end) end", &prm,
                 "instruction budget");
    expect_limit("while true do xpcall(function() while true do end end, function() end) end",
                 &prm, "instruction budget");
    expect_limit("local s = string.rep(string.rep('x', 1 << 16), 1 << 12)", &prm, "memory limit");
    /* work done in C functions counts too (found by fuzzing: the first was a timeout) */
    expect_limit("for i = 1, 1/0 do string.rep('x', i) end", &prm, "instruction budget");
    expect_limit("local s = string.rep('', 1e15)", &prm, "instruction budget");
    expect_limit("local s = ('ab'):rep(1e6):upper()\nwhile true do s:upper() end", &prm,
                 "instruction budget");
    expect_limit("local t = {}\nfor i = 1, 1e5 do t[i] = -i end\nwhile true do table.sort(t) end",
                 &prm, "instruction budget");
    expect_limit("local t = {}\nfor i = 1, 1e5 do t[i] = 'x' end\n"
                 "while true do table.concat(t) table.insert(t, 1, 'y') table.remove(t, 1) end",
                 &prm, "instruction budget");
    kpt_pattern *p;
    kpt_diag d;
    /* refused before it starts: its cost alone is over the budget */
    assert_int_equal(compile("local s = string.rep('x', 1 << 62)", &prm, &p, &d), KPT_ERR_LIMIT);
    assert_non_null(strstr(d.message, "instruction budget"));
    expect_limit("local s = 'x'\nwhile true do s = s .. s end", &prm, "memory limit");
    expect_limit("local t = {}\nfor i = 1, 1e9 do t[i] = {i} end", &prm, "memory limit");
    expect_limit("local ok = true\nwhile ok do ok = pcall(string.rep, ('x'):rep(1 << 16), 1 << 12) end", &prm,
                 "memory limit");
    /* finalizers run with Lua's hooks off, out of the budget's reach: refused */
    kpt_status st = compile("setmetatable({}, {__gc = function() while true do end end})\n"
                            "return kpt.pattern{}", &prm, &p, &d);
    assert_int_equal(st, KPT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(d.message, "finalizers (__gc) are not allowed"));
    /* adding __gc to a metatable later does not make a finalizer (Lua's rule) */
    assert_int_equal(compile("local mt = {}\nlocal t = setmetatable({}, mt)\n"
                             "mt.__gc = function() while true do end end\nt = nil\n"
                             "return kpt.pattern{}", &prm, &p, &d), KPT_OK);
    kpt_pattern_destroy(&p);
    /* to-be-closed variables run under the budget */
    expect_limit("do local x <close> = setmetatable({}, {__close = function() while true do end "
                 "end}) end", &prm, "instruction budget");
    /* deep recursion: Lua's stack limit, Lua's C-call limit through metamethods */
    st = compile("local function f(n) return f(n + 1) + 1 end\nf(1)", &prm, &p, &d);
    /* the stack outgrows the 8 MiB limit before Lua's own limit */
    assert_true((st == KPT_ERR_INVALID_ARGUMENT && strstr(d.message, "stack overflow")) ||
                (st == KPT_ERR_LIMIT && strstr(d.message, "memory limit")));
    prm.max_memory = 0;
    st = compile("local function f(n) return f(n + 1) + 1 end\nf(1)", &prm, &p, &d);
    assert_true(st == KPT_ERR_INVALID_ARGUMENT && strstr(d.message, "t.lua:1: error: stack overflow"));
    st = compile("local t = setmetatable({}, {})\ngetmetatable(t).__index = function(t, k) "
                 "return t[k] end\nlocal x = t.x", &prm, &p, &d);
    assert_true(st != KPT_OK && strstr(d.message, "stack overflow"));
    /* an xpcall handler is not run for the budget's end: raised from the count hook, it would
     * run with hooks off, out of any budget's reach */
    expect_limit("xpcall(function() while true do end end, function(e) while true do end end)",
                 &prm, "instruction budget");
    /* C work charged by size: copies of long strings, parsing and comparing them, long ranges
     * of table functions, kpt's own functions */
    expect_limit("local s = ('x'):rep(1 << 20)\nwhile true do local t = s .. s end", &prm,
                 "t.lua:2: error: instruction budget");
    expect_limit("local s = (' '):rep(1 << 20)\nwhile true do tonumber(s) end", &prm,
                 "instruction budget");
    expect_limit("local s, t = ('x'):rep(1 << 20), ('x'):rep(1 << 20)\n"
                 "while true do rawequal(s, t) end", &prm, "instruction budget");
    expect_limit("local t = setmetatable({}, {__name = ('x'):rep(1 << 20)})\n"
                 "while true do tostring(t) end", &prm, "instruction budget");
    expect_limit("table.move({}, 1, 1 << 50, 1)", &prm, "instruction budget");
    expect_limit("table.concat({}, 'x', 1, 1 << 50)", &prm, "instruction budget");
    expect_limit("while true do kpt.builtin('causal') kpt.builtin_score('softcap(30)', 1.0) end",
                 &prm, "instruction budget");
    /* an instruction that takes long (comparing two 4 MiB strings) is stopped by the clock */
    kpt_lua_params timed = {.name = "t.lua", .max_instructions = UINT64_MAX / 2,
                            .max_seconds = 0.25};
    double t0 = now_s();
    expect_limit("local s = ('x'):rep(1 << 22)\nlocal t = s .. 'y'\n"
                 "while true do local _ = s < t end", &timed, "t.lua:3: error: time limit exhausted");
    assert_true(now_s() - t0 < 3); /* generous: a loaded CI machine under sanitizers */
    t0 = now_s();
    expect_limit("while true do pcall(function() while true do end end) end", &timed,
                 "time limit exhausted (0.25 s");
    assert_true(now_s() - t0 < 3);
    /* library errors keep the script's line and name the function */
    expect_error_with("local x = 1\nstring.rep()", NULL, KPT_ERR_INVALID_ARGUMENT,
                      "t.lua:2: error: bad argument #1 to 'string.rep' (string expected");
    expect_error_with("local x = 1\n\ntable.concat({{}})", NULL, KPT_ERR_INVALID_ARGUMENT,
                      "t.lua:3: error: invalid value (table) at index 1 in table for 'concat'");
    expect_error_with("local function f() return tostring(setmetatable({}, {__tostring = f})) end"
                      "\nf()", NULL, KPT_ERR_INVALID_ARGUMENT, "t.lua:1: error: C stack overflow");
    /* expressions as large as the node limit */
    expect_limit("return kpt.pattern{ score = function(s, b, h, q, k)\n"
                 "  for i = 1, 100000 do s = s * 1.0001 + i end\n  return s end }",
                 NULL, "expression too large");
    /* a script that catches the node limit and goes on still fails */
    expect_limit("return kpt.pattern{ score = function(s)\n"
                 "  pcall(function() for i = 1, 100000 do s = s + i end end)\n  return s end }",
                 NULL, "expression too large");
}

static void test_determinism(void **state)
{
    (void)state;
    const char *src = "local r = math.random(1000000)\n"
                      "return kpt.pattern{ aux = { z = { dtype = 'int32', shape = {'sq'} },\n"
                      "  a = { dtype = 'int32', shape = {'sq'} }, m = { dtype = 'bool', shape = {'sq'} } },\n"
                      "  mask = function(b, h, q, k, p) return (q - k):lt(r) & p.m[q] end }";
    kpt_pattern *p1, *p2;
    kpt_diag d;
    assert_int_equal(compile(src, NULL, &p1, &d), KPT_OK);
    assert_int_equal(compile(src, NULL, &p2, &d), KPT_OK);
    char *t1 = kpt_pattern_print(p1), *t2 = kpt_pattern_print(p2);
    assert_string_equal(t1, t2); /* math.random is seeded the same every run; aux sorted */
    free(t1);
    free(t2);
    kpt_pattern_destroy(&p1);
    kpt_pattern_destroy(&p2);
}

static void record_print(void *user, const char *text)
{
    snprintf(user, 256, "%s", text);
}

static void test_print(void **state)
{
    (void)state;
    char got[256] = "";
    kpt_lua_params prm = {.name = "t.lua", .print = record_print, .print_user = got};
    kpt_pattern *p;
    kpt_diag d;
    assert_int_equal(compile("print('hello', 1, kpt.sq)\nreturn kpt.pattern{}", &prm, &p, &d),
                     KPT_OK);
    assert_string_equal(got, "hello\t1\tkpt.expr(i32)");
    kpt_pattern_destroy(&p);
}

static void test_api_arguments(void **state)
{
    (void)state;
    kpt_pattern *p = (kpt_pattern *)1;
    kpt_diag d;
    assert_int_equal(kpt_pattern_from_lua(NULL, 0, NULL, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_int_equal(kpt_pattern_from_lua("", 0, NULL, NULL, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_int_equal(kpt_pattern_from_lua_file("/nonexistent/x.lua", NULL, &p, &d), KPT_ERR_IO);
    assert_int_equal(kpt_pattern_from_lua_file(NULL, NULL, &p, NULL), KPT_ERR_INVALID_ARGUMENT);
    /* an empty script returns nothing */
    assert_int_equal(kpt_pattern_from_lua("", 0, NULL, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(d.message, "script:"));
    /* the default name comes from the file name */
    char path[] = "/tmp/kpt_test_luaXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *src = "return kpt.pattern{ mask = function(b, h, q, k) return q:ge(k) end }";
    assert_true(write(fd, src, strlen(src)) == (ssize_t)strlen(src));
    close(fd);
    assert_int_equal(kpt_pattern_from_lua_file(path, NULL, &p, &d), KPT_OK);
    assert_string_equal(kpt_pattern_name(p), strrchr(path, '/') + 1);
    kpt_pattern_destroy(&p);
    unlink(path);
    /* params: a NULL array with a count, a negative count, a name twice, values beyond f32 */
    const char *w = "return kpt.pattern{ name = 'w', params = { w = kpt.runtime('w', 8.5) },\n"
                    "  mask = function(b, h, q, k, P) return (q - k):lt(P.w) end }";
    kpt_lua_params bad = {.params = NULL, .num_params = 2};
    assert_int_equal(kpt_pattern_from_lua(w, strlen(w), &bad, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_non_null(strstr(d.message, "NULL array"));
    kpt_param_value twice[] = {{"w", 3}, {"w", 4}};
    bad = (kpt_lua_params){.params = twice, .num_params = -1};
    assert_int_equal(kpt_pattern_from_lua(w, strlen(w), &bad, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    bad.num_params = 2;
    assert_int_equal(kpt_pattern_from_lua(w, strlen(w), &bad, &p, &d), KPT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(d.message, "given twice"));
    kpt_param_value huge[] = {{"w", 1e300}};
    bad = (kpt_lua_params){.params = huge, .num_params = 1};
    assert_int_equal(kpt_pattern_from_lua(w, strlen(w), &bad, &p, &d), KPT_ERR_TYPE);
    assert_non_null(strstr(d.message, "beyond the f32 range"));
    const char *nan_def = "return kpt.pattern{ params = { w = kpt.runtime('w', 0/0) },\n"
                          "  mask = function(b, h, q, k, P) return (q - k):lt(P.w) end }";
    assert_int_equal(kpt_pattern_from_lua(nan_def, strlen(nan_def), NULL, &p, &d), KPT_ERR_TYPE);
    assert_non_null(strstr(d.message, "not a finite"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arithmetic),
        cmocka_unit_test(test_functions),
        cmocka_unit_test(test_comparisons_and_logic),
        cmocka_unit_test(test_bits_and_erf),
        cmocka_unit_test(test_builtins_compose),
        cmocka_unit_test(test_dropped_conditions), cmocka_unit_test(test_params_and_runtime),
        cmocka_unit_test(test_aux),
        cmocka_unit_test(test_aux_rank4),
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sandbox_escapes),
        cmocka_unit_test(test_sandbox_limits),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_api_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
