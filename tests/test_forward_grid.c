/* The sm_90a forward's grid choice (runtime/forward_grid.c): which calls have short work items
 * (the persistent grid) for their lengths, masks and runtime scalars, and how many CTAs the
 * choice and KPT_CUDA_PERSISTENT give. No GPU: the functions are pure. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_items),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_ctas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
