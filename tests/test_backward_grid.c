/* The sm_90a backward's dQ placement (runtime/backward_grid.c): the grid's estimated balance for
 * lengths, masks and kv heads, and the choice it makes. No GPU: the functions are pure. */
#include <stdlib.h>

#include "tests/testutil.h"

#include "compiler/plan_tiles.h"
#include "runtime/backward_grid.h"

/* The estimate for pattern `text` (no runtime scalars) at Sq = Skv = s, 16k tokens (B = 16k / s)
 * of hq query heads on hkv, on 132 SMs, under the sm_90a backward plan at head dim 128. */
static int busy(const char *text, int64_t s, int64_t hq, int64_t hkv)
{
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse(text, &p, &d), KPT_OK);
    const kpt_kernel_config cfg = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = 128, .dv = 128, .sm = 90, .wgmma = true};
    kpt_kernel_plan pl;
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 232448, &pl, &d), KPT_OK);
    assert_true(pl.cfg.wgmma);
    int r = kpt_backward_busy_pct(p, &pl, s, s, hq, hkv, 16384 / s, 132, NULL);
    kpt_pattern_destroy(&p);
    return r;
}

static void test_busy(void **state)
{
    (void)state;
    /* causal: the first kv tiles' CTAs walk the most; few kv heads leave the SMs idle */
    assert_in_range(busy("causal", 4096, 16, 16), 92, 96);
    assert_in_range(busy("causal", 4096, 32, 8), 86, 90);
    assert_in_range(busy("causal", 4096, 32, 4), 76, 80);
    assert_in_range(busy("causal", 4096, 16, 2), 61, 65);
    /* full attention: every CTA alike */
    assert_in_range(busy("full", 4096, 16, 2), 95, 99);
    /* a window: alike but at the ends, fewer and shorter CTAs at short lengths */
    assert_in_range(busy("sliding_window(512)", 1024, 16, 2), 71, 75);
    assert_in_range(busy("sliding_window(512)", 4096, 16, 2), 89, 93);
    /* many waves of CTAs even out, and are not simulated (16 x 132 CTAs and more) */
    assert_int_equal(busy("causal", 1024, 32, 32), 100);
    /* a mask that reads aux data: its block map is the device's, taken as balanced */
    assert_int_equal(busy("document+causal", 4096, 16, 2), 100);
}

static void test_choice(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d = {0};
    assert_int_equal(kpt_pattern_parse("causal", &p, &d), KPT_OK);
    const kpt_kernel_config cfg = {.kind = KPT_KERNEL_BACKWARD, .dtype = KPT_DTYPE_BF16,
                                   .dqk = 128, .dv = 128, .sm = 90, .wgmma = true};
    kpt_kernel_plan pl;
    assert_int_equal(kpt_plan_tiles_cuda(p, &cfg, 232448, &pl, &d), KPT_OK);
    assert_true(kpt_backward_dq_sums(p, &pl, 4096, 4096, 16, 16, 4, 132, NULL));
    assert_false(kpt_backward_dq_sums(p, &pl, 4096, 4096, 16, 2, 4, 132, NULL));
    /* fewer CTAs than SMs: kpt_bwd_dq's CTAs fill the rest */
    assert_false(kpt_backward_dq_sums(p, &pl, 1000, 1000, 4, 2, 2, 132, NULL));
    unsetenv("KPT_CUDA_DQ_SUMS");
    assert_int_equal(kpt_backward_dq_sums_forced(), -1);
    setenv("KPT_CUDA_DQ_SUMS", "1", 1);
    assert_int_equal(kpt_backward_dq_sums_forced(), 1);
    setenv("KPT_CUDA_DQ_SUMS", "0", 1);
    assert_int_equal(kpt_backward_dq_sums_forced(), 0);
    setenv("KPT_CUDA_DQ_SUMS", "2", 1);
    assert_int_equal(kpt_backward_dq_sums_forced(), -1);
    unsetenv("KPT_CUDA_DQ_SUMS");
    /* degenerate shapes count as balanced */
    assert_int_equal(kpt_backward_busy_pct(p, &pl, 0, 4096, 16, 16, 4, 132, NULL), 100);
    assert_int_equal(kpt_backward_busy_pct(p, &pl, 4096, 4096, 16, 16, 4, 0, NULL), 100);
    /* the key tells the batch and kv heads apart */
    assert_true(kpt_backward_key(4096, 4096, 16, 2, 4, NULL, 0) !=
                kpt_backward_key(4096, 4096, 16, 4, 2, NULL, 0));
    kpt_pattern_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_busy),
        cmocka_unit_test(test_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
