/* The sm_90a forward's grid choice (runtime/forward_grid.c): which calls have short work items
 * (the persistent grid) for their lengths, masks and runtime scalars, and how many CTAs the
 * choice and KPT_CUDA_PERSISTENT give. No GPU: the functions are pure. */
#include <string.h>

#include "tests/testutil.h"

#include "compiler/plan_tiles.h"
#include "runtime/forward_grid.h"

/* Whether pattern `text` at Sq = Skv = s (w: its first runtime scalar, when it has one) has
 * short items under the sm_90a plan at head dim 128. */
static bool items_short(const char *text, int64_t s, int32_t w)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse(text, &p, &d), KPT_OK);
    const kpt_kernel_config cfg = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = 128, .dv = 128, .sm = 90, .wgmma = true};
    kpt_kernel_plan pl;
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 232448, &pl, &d), KPT_OK);
    assert_true(pl.cfg.wgmma);
    /* the scalars as the kernel argument block carries them */
    uint32_t bits[KPT_MAX_SCALARS] = {(uint32_t)w};
    kpt_ir_value scalars[KPT_MAX_SCALARS] = {{0}};
    kpt_forward_scalars(p, bits, scalars);
    bool r = kpt_forward_items_short(p, &pl, s, s, 16, scalars);
    kpt_pattern_destroy(&p);
    return r;
}

static void test_short_items(void **state)
{
    (void)state;
    /* up to 64 kv tiles of 128 keys, with a block map too */
    assert_true(items_short("full", 8192, 0));
    assert_true(items_short("causal", 8192, 0));
    assert_true(items_short("document", 8192, 0));
    assert_false(items_short("document", 8193, 0));
    /* past them: long ranges are not short, nor are block maps or unmasked patterns */
    assert_false(items_short("full", 8193, 0));
    assert_false(items_short("causal", 16384, 0));
    assert_false(items_short("prefix_lm(200)", 16384, 0));
    assert_false(items_short("document", 16384, 0));
    /* windows: by their width, a runtime one by its value */
    assert_true(items_short("sliding_window(1024)", 16384, 0));
    assert_true(items_short("sliding_window(1024)", 65536, 0));
    assert_true(items_short("chunked(2048)", 65536, 0));
    assert_false(items_short("sliding_window(8192)", 16384, 0));
    assert_true(items_short("sliding_window($w=256)", 16384, 7000));
    assert_false(items_short("sliding_window($w=256)", 16384, 9000));
    /* a block map made only for keep bits (a mask of 8+ nodes without aux data) is no block
     * map here: its mask's live range decides */
    assert_true(items_short("chunked(4096)+sliding_window(1024)", 65536, 0));
    assert_true(items_short("chunked(4096)+sliding_window(1024)", 8192, 0));
    assert_false(items_short("chunked(16384)+sliding_window(12000)", 16384, 0));
}

static void test_key(void **state)
{
    (void)state;
    const uint32_t a[2] = {1024, 0}, b[2] = {1025, 0};
    const uint64_t k = kpt_forward_key(16384, 16384, 16, a, 1);
    assert_true(k != 0);
    assert_true(k == kpt_forward_key(16384, 16384, 16, a, 1));
    assert_true(k != kpt_forward_key(16384, 16384, 16, b, 1));
    assert_true(k != kpt_forward_key(16384, 16383, 16, a, 1));
    assert_true(k != kpt_forward_key(16384, 16384, 32, a, 1));
    assert_true(kpt_forward_key(1, 1, 1, a, 0) != 0);
}

static void test_ctas(void **state)
{
    (void)state;
    unsetenv("KPT_CUDA_PERSISTENT");
    assert_int_equal(kpt_forward_ctas(2048, 132, true), 132);
    assert_int_equal(kpt_forward_ctas(2048, 132, false), 2048);
    assert_int_equal(kpt_forward_ctas(100, 132, true), 100);
    assert_int_equal(kpt_forward_ctas(2048, 0, true), 2048);
    setenv("KPT_CUDA_PERSISTENT", "0", 1);
    assert_int_equal(kpt_forward_ctas(2048, 132, true), 2048);
    setenv("KPT_CUDA_PERSISTENT", "1", 1);
    assert_int_equal(kpt_forward_ctas(2048, 132, false), 132);
    setenv("KPT_CUDA_PERSISTENT", "3", 1);
    assert_int_equal(kpt_forward_ctas(2048, 132, false), 3);
    assert_int_equal(kpt_forward_ctas(2, 132, false), 2);
    setenv("KPT_CUDA_PERSISTENT", "yes", 1); /* not a number: the runtime's choice */
    assert_int_equal(kpt_forward_ctas(2048, 132, false), 2048);
    unsetenv("KPT_CUDA_PERSISTENT");
}

/* The sm_90a forward plan of pattern p at head dim d (the tall variant when tall). */
static void plan_p(const kpt_pattern *p, int d, bool tall, kpt_kernel_plan *pl)
{
    kpt_diag dg = {0};
    const kpt_kernel_config cfg = {.kind = KPT_KERNEL_FORWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = d, .dv = d, .sm = 90, .wgmma = true, .tall = tall};
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 232448, pl, &dg), KPT_OK);
}

static kpt_pattern *plan_d(const char *text, int d, bool tall, kpt_kernel_plan *pl)
{
    kpt_pattern *p = NULL;
    kpt_diag dg = {0};
    assert_int_equal(kpt_pattern_parse(text, &p, &dg), KPT_OK);
    plan_p(p, d, tall, pl);
    return p;
}

static bool offers_tall_p(kpt_pattern *p, int d)
{
    kpt_kernel_plan pl, tall;
    plan_p(p, d, false, &pl);
    plan_p(p, d, true, &tall);
    kpt_pattern_destroy(&p);
    /* the tall plan is the default one unless the variant is offered */
    assert_int_equal(tall.bm, pl.tall_variant ? 192 : pl.bm);
    assert_int_equal(tall.warps, pl.tall_variant ? 16 : pl.warps);
    assert_int_equal(tall.cfg.tall, pl.tall_variant);
    assert_false(pl.cfg.tall);
    return pl.tall_variant;
}

static bool offers_tall(const char *text, int d)
{
    kpt_pattern *p = NULL;
    kpt_diag dg = {0};
    assert_int_equal(kpt_pattern_parse(text, &p, &dg), KPT_OK);
    return offers_tall_p(p, d);
}

/* The same for a Lua script's pattern: -1 where kpt was built without Lua. */
static int offers_tall_lua(const char *src)
{
    kpt_pattern *p = NULL;
    kpt_diag dg = {0};
    kpt_status st = kpt_pattern_from_lua(src, strlen(src), NULL, &p, &dg);
    if (st == KPT_ERR_UNSUPPORTED)
        return -1;
    assert_int_equal(st, KPT_OK);
    return offers_tall_p(p, 64);
}

static void test_tall_offered(void **state)
{
    (void)state;
    assert_true(offers_tall("causal", 64));
    assert_true(offers_tall("causal", 32) == false); /* D = 32 takes the sm_80 kernel */
    assert_true(offers_tall("sliding_window(1024)", 64));
    assert_true(offers_tall("causal+softcap(30)", 64));
    assert_true(offers_tall("prefix_lm(200)", 64));
    /* 192-row tiles already (unmasked), 128 keep theirs, block maps (aux data, keep bits) */
    assert_false(offers_tall("full", 64));
    assert_false(offers_tall("causal", 128));
    assert_false(offers_tall("document", 64));
    assert_false(offers_tall("chunked(4096)+sliding_window(1024)", 64));
    /* scores: by their work a score (softcap's tanh, not ALiBi's bias nor an erf GELU) */
    assert_false(offers_tall("causal+alibi", 64));
    const char *gelu = "return kpt.pattern{ name = 'gelu', mask = function(b, h, q, k) "
                       "return q:ge(k) end, score = function(s) "
                       "return s * 0.5 * (1 + kpt.erf(s / math.sqrt(2))) end }";
    const char *scaled = "return kpt.pattern{ name = 'scaled', mask = function(b, h, q, k) "
                         "return q:ge(k) end, score = function(s) return s * 0.5 end }";
    int lua = offers_tall_lua(scaled);
    if (lua >= 0) {
        assert_int_equal(lua, 1); /* s * 0.5: one node a score */
        assert_int_equal(offers_tall_lua(gelu), 0);
    }
}

/* Whether pattern `text` at Sq = Skv = s takes the tall variant at head dim 64. */
static bool tall_pays(const char *text, int64_t s)
{
    kpt_kernel_plan pl, tall;
    kpt_pattern *p = plan_d(text, 64, false, &pl);
    kpt_pattern *tp = plan_d(text, 64, true, &tall);
    assert_true(pl.tall_variant);
    kpt_ir_value scalars[KPT_MAX_SCALARS] = {{0}};
    bool r = kpt_forward_tall_pays(p, &pl, &tall, s, s, 16, scalars);
    kpt_pattern_destroy(&p);
    kpt_pattern_destroy(&tp);
    return r;
}

static void test_tall_pays(void **state)
{
    (void)state;
    unsetenv("KPT_CUDA_TALL");
    /* causal-shaped masks from 3k (the tall tiles' extra products 4 % or less) */
    assert_false(tall_pays("causal", 1024));
    assert_false(tall_pays("causal", 2048));
    assert_false(tall_pays("causal", 3000));
    assert_true(tall_pays("causal", 3072));
    assert_true(tall_pays("causal", 4096));
    assert_true(tall_pays("causal", 16384));
    assert_true(tall_pays("causal", 100000));
    assert_true(tall_pays("prefix_lm(200)", 16384));
    assert_true(tall_pays("causal+softcap(30)", 8192));
    /* short live ranges: windows */
    assert_false(tall_pays("sliding_window(1024)", 16384));
    assert_false(tall_pays("sliding_window(1024)", 65536));
    assert_true(tall_pays("sliding_window(8192)", 65536));
    assert_false(tall_pays("chunked(2048)+causal", 4096)); /* 192 rows straddle the chunks */
    /* forced */
    unsetenv("KPT_CUDA_TALL");
    assert_int_equal(kpt_forward_tall_forced(), -1);
    setenv("KPT_CUDA_TALL", "1", 1);
    assert_int_equal(kpt_forward_tall_forced(), 1);
    setenv("KPT_CUDA_TALL", "0", 1);
    assert_int_equal(kpt_forward_tall_forced(), 0);
    setenv("KPT_CUDA_TALL", "yes", 1); /* neither: the rule */
    assert_int_equal(kpt_forward_tall_forced(), -1);
    unsetenv("KPT_CUDA_TALL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_items),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_ctas),
        cmocka_unit_test(test_tall_offered),
        cmocka_unit_test(test_tall_pays),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
