/* IR: builder interning, type errors, printer/reader round trip, interpreter semantics. */
#include "tests/testutil.h"

static kpt_ir_value eval_i(kpt_ir_graph *g, kpt_ir_ref r)
{
    kpt_ir_env env = {.q = 7, .k = 3, .sq = 100, .skv = 120, .hq = 12};
    kpt_ir_value v;
    assert_true(kpt_ir_eval(g, r, &env, &v));
    return v;
}

static void test_interning(void **state)
{
    (void)state;
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_ir_graph *g = &p->g;
    kpt_ir_ref q = kpt_ir_var(g, KPT_IR_Q), k = kpt_ir_var(g, KPT_IR_K);
    assert_int_equal(q, kpt_ir_var(g, KPT_IR_Q));
    kpt_ir_ref a = kpt_ir_binop(g, KPT_IR_ADD, q, k);
    assert_int_equal(a, kpt_ir_binop(g, KPT_IR_ADD, k, q)); /* commutative */
    assert_int_not_equal(kpt_ir_binop(g, KPT_IR_SUB, q, k), kpt_ir_binop(g, KPT_IR_SUB, k, q));
    assert_int_equal(kpt_ir_const_i32(g, 5), kpt_ir_const_i32(g, 5));
    assert_int_not_equal(kpt_ir_const_i32(g, 5), kpt_ir_const_i32(g, 6));
    assert_int_not_equal(kpt_ir_const_f32(g, 0.0f), kpt_ir_const_f32(g, -0.0f));
    assert_int_not_equal(kpt_ir_const_i32(g, 1), kpt_ir_const_bool(g, true)); /* types differ */
    uint32_t before = g->count;
    /* a whole subexpression built twice is one node */
    kpt_ir_ref e1 = kpt_ir_binop(g, KPT_IR_LT, kpt_ir_binop(g, KPT_IR_SUB, q, k), kpt_ir_const_i32(g, 9));
    uint32_t mid = g->count;
    kpt_ir_ref e2 = kpt_ir_binop(g, KPT_IR_LT, kpt_ir_binop(g, KPT_IR_SUB, q, k), kpt_ir_const_i32(g, 9));
    assert_int_equal(e1, e2);
    assert_int_equal(mid, g->count);
    assert_true(mid > before);
    /* many nodes: the table grows and keeps interning */
    kpt_ir_ref acc = q;
    for (int i = 0; i < 5000; i++)
        acc = kpt_ir_binop(g, KPT_IR_ADD, acc, kpt_ir_const_i32(g, i));
    kpt_ir_ref acc2 = q;
    for (int i = 0; i < 5000; i++)
        acc2 = kpt_ir_binop(g, KPT_IR_ADD, acc2, kpt_ir_const_i32(g, i));
    assert_int_equal(acc, acc2);
    char msg[200];
    assert_true(kpt_ir_validate(g, msg, sizeof(msg)));
    kpt_pattern_destroy(&p);
    assert_null(p);
}

static void test_type_errors(void **state)
{
    (void)state;
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_ir_graph *g = &p->g;
    kpt_ir_ref s = kpt_ir_var(g, KPT_IR_S), q = kpt_ir_var(g, KPT_IR_Q);
    kpt_ir_ref t = kpt_ir_const_bool(g, true);
    assert_int_equal(kpt_ir_binop(g, KPT_IR_ADD, s, t), 0);
    assert_true(g->failed);
    assert_string_equal(g->error,
                        "type error: 'add' needs operands of one numeric type (i32 or f32), got f32 and bool");
    /* sticky: later calls fail too */
    assert_int_equal(kpt_ir_var(g, KPT_IR_K), 0);
    kpt_pattern_destroy(&p);

    struct {
        kpt_ir_op op;
        kpt_ir_type a, b;
        const char *msg;
    } cases[] = {
        {KPT_IR_ADD, KPT_IR_I32, KPT_IR_F32, "'add' needs operands of one numeric type (i32 or f32), got i32 and f32"},
        {KPT_IR_DIV, KPT_IR_I32, KPT_IR_I32, "'div' needs f32 operands, got i32 and i32"},
        {KPT_IR_AND, KPT_IR_BOOL, KPT_IR_I32, "'and' needs bool operands, got bool and i32"},
        {KPT_IR_LT, KPT_IR_BOOL, KPT_IR_BOOL, "'lt' needs operands of one numeric type (i32 or f32), got bool and bool"},
        {KPT_IR_EQ, KPT_IR_F32, KPT_IR_I32, "'eq' needs operands of one type, got f32 and i32"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char msg[200] = "";
        kpt_ir_type args[2] = {cases[i].a, cases[i].b};
        assert_int_equal(kpt_ir_result_type(cases[i].op, 2, args, msg, sizeof(msg)), KPT_IR_VOID);
        assert_string_equal(msg, cases[i].msg);
    }
    char msg[200];
    kpt_ir_type one[1] = {KPT_IR_I32};
    assert_int_equal(kpt_ir_result_type(KPT_IR_TANH, 1, one, msg, sizeof(msg)), KPT_IR_VOID);
    assert_string_equal(msg, "'tanh' needs an f32 operand, got i32");
    kpt_ir_type three[3] = {KPT_IR_I32, KPT_IR_F32, KPT_IR_F32};
    assert_int_equal(kpt_ir_result_type(KPT_IR_SELECT, 3, three, msg, sizeof(msg)), KPT_IR_VOID);
    assert_string_equal(msg, "'select' needs a bool condition and two values of one type, got i32, f32 and f32");

    /* loads: f32 index refused, unknown aux refused */
    p = kpt_pattern_new("t");
    kpt_aux_decl d = {.name = "doc", .dtype = KPT_DTYPE_I32, .rank = 1, .dims = {KPT_DIM_SQ}};
    char err[100];
    assert_int_equal(kpt_pattern_add_aux(p, &d, err, sizeof(err)), 0);
    kpt_ir_ref fs = kpt_ir_var(&p->g, KPT_IR_S);
    assert_int_equal(kpt_ir_load(&p->g, 0, 1, &fs), 0);
    assert_string_equal(p->g.error, "type error: 'load' needs i32 indices, got f32");
    kpt_pattern_destroy(&p);
    p = kpt_pattern_new("t");
    q = kpt_ir_var(&p->g, KPT_IR_Q);
    assert_int_equal(kpt_ir_load(&p->g, 3, 1, &q), 0);
    assert_string_equal(p->g.error, "'load' of unknown aux tensor 3");
    kpt_pattern_destroy(&p);
}

static void test_interpreter(void **state)
{
    (void)state;
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_ir_graph *g = &p->g;
#define I(v) kpt_ir_const_i32(g, v)
#define F(v) kpt_ir_const_f32(g, v)
    struct {
        kpt_ir_op op;
        int32_t a, b, want;
    } ints[] = {
        {KPT_IR_IDIV, 7, 2, 3},     {KPT_IR_IDIV, -7, 2, -4},  {KPT_IR_IDIV, 7, -2, -4},
        {KPT_IR_IDIV, -7, -2, 3},   {KPT_IR_IDIV, -8, 2, -4},  {KPT_IR_IDIV, 5, 0, 0},
        {KPT_IR_MOD, 7, 3, 1},      {KPT_IR_MOD, -7, 3, 2},    {KPT_IR_MOD, 7, -3, -2},
        {KPT_IR_MOD, -7, -3, -1},   {KPT_IR_MOD, -6, 3, 0},    {KPT_IR_MOD, 5, 0, 0},
        {KPT_IR_IDIV, INT32_MIN, -1, INT32_MIN},               {KPT_IR_MOD, INT32_MIN, -1, 0},
        {KPT_IR_ADD, INT32_MAX, 1, INT32_MIN},                 {KPT_IR_MUL, 65536, 65536, 0},
        {KPT_IR_SUB, INT32_MIN, 1, INT32_MAX},                 {KPT_IR_MIN, -3, 2, -3},
        {KPT_IR_MAX, -3, 2, 2},
        /* bits: two's complement; shift counts outside 0..31 shift every bit out */
        {KPT_IR_BAND, 12, 10, 8},   {KPT_IR_BOR, 12, 10, 14},  {KPT_IR_BXOR, 12, 10, 6},
        {KPT_IR_BAND, -1, 77, 77},  {KPT_IR_BXOR, -1, 0, -1},
        {KPT_IR_SHL, 1, 31, INT32_MIN},                        {KPT_IR_SHL, 3, 32, 0},
        {KPT_IR_SHL, 3, -1, 0},     {KPT_IR_SHL, -1, 4, -16},
        {KPT_IR_SHR, -16, 2, -4},   {KPT_IR_SHR, -16, 40, -1}, {KPT_IR_SHR, 16, 40, 0},
        {KPT_IR_SHR, -1, 31, -1},   {KPT_IR_SHR, INT32_MIN, 31, -1},
        {KPT_IR_SHRU, -16, 28, 15}, {KPT_IR_SHRU, -1, 32, 0},  {KPT_IR_SHRU, INT32_MIN, 31, 1},
        {KPT_IR_SHRU, 40, -3, 0},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        kpt_ir_ref r = kpt_ir_binop(g, ints[i].op, I(ints[i].a), I(ints[i].b));
        assert_int_equal(eval_i(g, r).i, ints[i].want);
    }
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_NEG, I(INT32_MIN))).i, INT32_MIN);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_ILOG2, I(12))).i, 3);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_ILOG2, I(16))).i, 4);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_ILOG2, I(0))).i, -1);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_BNOT, I(0))).i, -1);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_BNOT, I(INT32_MIN))).i, INT32_MAX);
    assert_true(eval_i(g, kpt_ir_unop(g, KPT_IR_ERF, F(0.5f))).f == (double)(float)erf(0.5));
    assert_true(eval_i(g, kpt_ir_unop(g, KPT_IR_ERF, F(-INFINITY))).f == -1.0);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_TO_I32, F(-2.5f))).i, -3);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_TO_I32, F(3e10f))).i, INT32_MAX);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_TO_I32, F(-3e10f))).i, INT32_MIN);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_TO_I32, F(NAN))).i, 0);
    assert_int_equal(eval_i(g, kpt_ir_unop(g, KPT_IR_TO_I32, kpt_ir_const_bool(g, true))).i, 1);
    assert_true(eval_i(g, kpt_ir_binop(g, KPT_IR_IDIV, F(-7.0f), F(2.0f))).f == -4.0);
    assert_true(eval_i(g, kpt_ir_binop(g, KPT_IR_MOD, F(-7.0f), F(3.0f))).f == 2.0);
    assert_true(eval_i(g, kpt_ir_binop(g, KPT_IR_MOD, F(7.5f), F(-2.0f))).f == -0.5);
    assert_true(eval_i(g, kpt_ir_binop(g, KPT_IR_POW, F(2.0f), F(-3.0f))).f == 0.125);
    assert_false(eval_i(g, kpt_ir_binop(g, KPT_IR_LT, F(NAN), F(1.0f))).i);
    assert_true(eval_i(g, kpt_ir_binop(g, KPT_IR_NE, F(NAN), F(NAN))).i);
    /* variables and a compound: (q - k) // 3 with q=7, k=3 -> 1; k - q = -4 -> -4 // 3 = -2 */
    kpt_ir_ref q = kpt_ir_var(g, KPT_IR_Q), k = kpt_ir_var(g, KPT_IR_K);
    assert_int_equal(eval_i(g, kpt_ir_binop(g, KPT_IR_IDIV, kpt_ir_binop(g, KPT_IR_SUB, k, q), I(3))).i, -2);
    assert_int_equal(eval_i(g, kpt_ir_binop(g, KPT_IR_MOD, kpt_ir_binop(g, KPT_IR_SUB, k, q), I(3))).i, 2);
    assert_int_equal(eval_i(g, kpt_ir_var(g, KPT_IR_HQ)).i, 12);
#undef I
#undef F
    kpt_pattern_destroy(&p);
}

/* f32 IR is evaluated in f32 (rounded after every op), as the kernels compute it: Hugging Face's
 * T5 bucket floor(log(n / 8) / log(16) * 8) is 2 at n = 16, 32 (...), where double gives 1. */
static void test_interpreter_f32(void **state)
{
    (void)state;
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_ir_graph *g = &p->g;
    kpt_ir_ref n = kpt_ir_unop(g, KPT_IR_TO_F32, kpt_ir_var(g, KPT_IR_Q));
    kpt_ir_ref n8 = kpt_ir_binop(g, KPT_IR_DIV, n, kpt_ir_const_f32(g, 8));
    kpt_ir_ref l16 = kpt_ir_unop(g, KPT_IR_LOG, kpt_ir_const_f32(g, 16));
    kpt_ir_ref r = kpt_ir_binop(g, KPT_IR_DIV, kpt_ir_unop(g, KPT_IR_LOG, n8), l16);
    kpt_ir_ref bucket = kpt_ir_unop(g, KPT_IR_TO_I32, kpt_ir_binop(g, KPT_IR_MUL, r,
                                                                   kpt_ir_const_f32(g, 8)));
    static const struct { int n, want; } cases[] = {{16, 2}, {32, 4}, {128, 8}, {9, 0}, {100, 7}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kpt_ir_env env = {.q = cases[i].n};
        kpt_ir_value v;
        assert_true(kpt_ir_eval(g, bucket, &env, &v));
        assert_int_equal(v.i, cases[i].want);
        /* what a float program computes, op by op */
        float fl = floorf(logf((float)cases[i].n / 8.0f) / logf(16.0f) * 8.0f);
        assert_int_equal(v.i, (int)fl);
    }
    /* leaves are floats too: s and f32 scalars are rounded on entry */
    kpt_ir_env env = {.s = 0.1};
    kpt_ir_value v;
    assert_true(kpt_ir_eval(g, kpt_ir_var(g, KPT_IR_S), &env, &v));
    assert_true(v.f == (double)0.1f);
    kpt_pattern_destroy(&p);
}

static void test_aux_load(void **state)
{
    (void)state;
    kpt_pattern *p = kpt_pattern_new("t");
    kpt_aux_decl d = {.name = "bias", .dtype = KPT_DTYPE_F32, .rank = 2, .dims = {KPT_DIM_ANY, KPT_DIM_ANY}};
    char err[100];
    assert_int_equal(kpt_pattern_add_aux(p, &d, err, sizeof(err)), 0);
    kpt_ir_ref idx[2] = {kpt_ir_var(&p->g, KPT_IR_Q), kpt_ir_var(&p->g, KPT_IR_K)};
    kpt_ir_ref r = kpt_ir_load(&p->g, 0, 2, idx);
    assert_int_equal(kpt_ir_type_of(&p->g, r), KPT_IR_F32);
    float data[6] = {1, 2, 3, 4, 5, 6};
    kpt_ir_auxview view = {.data = data, .dtype = KPT_DTYPE_F32, .rank = 2, .shape = {2, 3}, .stride = {3, 1}};
    kpt_ir_env env = {.q = 1, .k = 2, .aux = &view};
    kpt_ir_value v;
    assert_true(kpt_ir_eval(&p->g, r, &env, &v));
    assert_true(v.f == 6.0);
    env.k = 3; /* out of range reads 0 */
    assert_true(kpt_ir_eval(&p->g, r, &env, &v));
    assert_true(v.f == 0.0);
    env.k = -1;
    assert_true(kpt_ir_eval(&p->g, r, &env, &v));
    assert_true(v.f == 0.0);
    kpt_pattern_destroy(&p);
}

static void check_round_trip(kpt_pattern *p)
{
    char *t1 = kpt_pattern_print(p);
    assert_non_null(t1);
    kpt_diag d = {0};
    kpt_pattern *r = kpt_pattern_read(t1, &d);
    if (!r)
        fail_msg("read failed: %s\n%s", d.message, t1);
    char *t2 = kpt_pattern_print(r);
    assert_non_null(t2);
    assert_string_equal(t1, t2);
    char msg[200];
    assert_true(kpt_pattern_validate(r, msg, sizeof(msg)));
    free(t1);
    free(t2);
    kpt_pattern_destroy(&r);
}

static void test_round_trip_builtins(void **state)
{
    (void)state;
    const char *pats[] = {"full", "causal", "causal_bottom_right", "sliding_window(128)",
                          "local(3, 5)", "chunked(64)", "prefix_lm(100)", "document", "alibi",
                          "softcap(30)", "document+causal+softcap($c=20.5)+alibi",
                          "sliding_window($w)+local($w, 0)"};
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        kpt_diag d = {0};
        kpt_pattern *raw = kpt_parse_pattern(pats[i], &d);
        assert_non_null(raw);
        check_round_trip(raw);
        kpt_pattern_destroy(&raw);
        kpt_pattern *p = NULL;
        assert_int_equal(kpt_pattern_parse(pats[i], &p, &d), KPT_OK);
        check_round_trip(p);
        kpt_pattern_destroy(&p);
    }
}

static void test_round_trip_random(void **state)
{
    (void)state;
    for (int i = 0; i < 300; i++) {
        gen G = {0};
        kpt_rng_seed(&G.rng, 1000 + (uint64_t)i);
        G.p = kpt_pattern_new("random \"quoted\" \\ name");
        char err[100];
        assert_true(kpt_pattern_scalar(G.p, "w", KPT_IR_I32, i % 2, 17, err, sizeof(err)) == 0);
        G.p->score = gen_expr(&G, KPT_IR_F32, 5);
        G.p->mask = gen_expr(&G, KPT_IR_BOOL, 5);
        assert_false(G.p->g.failed);
        check_round_trip(G.p);
        kpt_pattern_destroy(&G.p);
    }
}

static void expect_read_error(const char *text, int line, int col, const char *needle)
{
    kpt_diag d = {0};
    kpt_pattern *p = kpt_pattern_read(text, &d);
    assert_null(p);
    assert_int_equal(d.status, KPT_ERR_PARSE);
    if (d.line != line || d.column != col || !strstr(d.message, needle))
        fail_msg("for %s: got %d:%d '%s', want %d:%d '%s'", text, d.line, d.column, d.message,
                 line, col, needle);
}

static void test_reader_errors(void **state)
{
    (void)state;
    expect_read_error("hello", 1, 1, "expected the header 'kpt-ir 1'");
    expect_read_error("kpt-ir 2\n", 1, 8, "unsupported IR version 2");
    expect_read_error("kpt-ir 1\n%1 = i32 q\n%2 = i32 add %1 %3\n", 3, 17, "used before it is defined");
    expect_read_error("kpt-ir 1\n%1 = i32 q\n%1 = i32 k\n", 3, 1, "defined twice");
    expect_read_error("kpt-ir 1\n%1 = i32 frob\n", 2, 10, "unknown operation 'frob'");
    expect_read_error("kpt-ir 1\n%1 = f32 s\n%2 = bool const true\n%3 = f32 add %1 %2\n", 4, 10,
                      "'add' needs operands of one numeric type");
    expect_read_error("kpt-ir 1\n%1 = f32 q\n", 2, 10, "'q' here has type i32, not f32");
    expect_read_error("kpt-ir 1\n%1 = i32 q\nmask %1\n", 3, 6, "the mask must be bool, not i32");
    expect_read_error("kpt-ir 1\n%1 = i32 scalar w\n", 2, 17, "unknown scalar 'w'");
    expect_read_error("kpt-ir 1\naux d i64 [sq] segments\n", 2, 7, "unsupported aux dtype");
    expect_read_error("kpt-ir 1\n%1 = i32 const 1.5\n", 2, 16, "expected an integer");
    expect_read_error("kpt-ir 1\n%1 = i32 q %1\n", 2, 12, "used before it is defined");
    expect_read_error("kpt-ir 1\npattern \"abc\n", 2, 13, "unterminated string");
    /* a load takes exactly as many indices as its tensor has dimensions */
    expect_read_error("kpt-ir 1\naux d i32 [b, sq] segments\n%1 = i32 q\n%2 = i32 load d %1\n", 4,
                      10, "takes 2 indices (its rank), not 1");
    expect_read_error("kpt-ir 1\naux d f32 [b, sq, skv, 2, 2] range -1 1\n", 2, 26,
                      "at most 4 dimensions");
}

/* A rank-4 aux tensor ([B, N, N, K] edge features) and its four-index load read and round-trip. */
static void test_rank4_aux(void **state)
{
    (void)state;
    kpt_diag d = {0};
    kpt_pattern *p = kpt_pattern_read("kpt-ir 1\naux e f32 [b, sq, skv, 3] range -1 1\n"
                                      "%1 = i32 b\n%2 = i32 q\n%3 = i32 k\n%4 = i32 h\n"
                                      "%5 = f32 load e %1 %2 %3 %4\n%6 = f32 s\n"
                                      "%7 = f32 add %6 %5\nscore %7\n", &d);
    if (!p)
        fail_msg("%s", d.message);
    assert_true(p->aux[0].rank == 4 && p->aux[0].dims[3] == 3);
    const kpt_ir_node *ld = kpt_ir_node_get(&p->g, kpt_ir_node_get(&p->g, p->score)->arg[1]);
    if (ld->op != KPT_IR_LOAD)
        ld = kpt_ir_node_get(&p->g, kpt_ir_node_get(&p->g, p->score)->arg[0]);
    assert_true(ld->op == KPT_IR_LOAD && ld->nargs == 4);
    assert_int_equal(kpt_ir_node_get(&p->g, ld->arg[3])->op, KPT_IR_H);
    check_round_trip(p);
    kpt_pattern_destroy(&p);
}

/* Mutated IR text never crashes the reader; whatever it accepts validates and round-trips. */
static void test_reader_fuzz(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("document+causal+softcap($c=3)+alibi", &p, &d), KPT_OK);
    char *text = kpt_pattern_print(p);
    kpt_pattern_destroy(&p);
    size_t len = strlen(text);
    char *buf = malloc(len + 1);
    static const char alphabet[] = "%0123456789 \n=-.abcdefgiklmnopqrstuvwxyz\"[],#";
    kpt_rng rng;
    kpt_rng_seed(&rng, 4);
    for (int i = 0; i < 5000; i++) {
        memcpy(buf, text, len + 1);
        for (int m = (int)kpt_rng_range(&rng, 1, 4); m > 0; m--)
            buf[kpt_rng_range(&rng, 0, (int64_t)len - 1)] =
                alphabet[kpt_rng_range(&rng, 0, sizeof(alphabet) - 2)];
        kpt_pattern *r = kpt_pattern_read(buf, &d);
        if (!r) {
            assert_int_equal(d.status, KPT_ERR_PARSE);
            assert_true(d.line >= 1);
            continue;
        }
        char msg[200];
        assert_true(kpt_pattern_validate(r, msg, sizeof(msg)));
        check_round_trip(r);
        kpt_pattern_destroy(&r);
    }
    free(buf);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interning),         cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_interpreter),
        cmocka_unit_test(test_interpreter_f32),
        cmocka_unit_test(test_aux_load),
        cmocka_unit_test(test_round_trip_builtins), cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_rank4_aux),     cmocka_unit_test(test_reader_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
