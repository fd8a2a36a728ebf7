/* Serving plans (runtime/paged_args.c), which the CUDA and Vulkan backends share: how lengths and
 * the device's size become row blocks, splits over the keys and a workspace, and what the plan
 * refuses, and the row checks of the tensors they take. No GPU: the functions are pure. */
#include "tests/testutil.h"

#include "runtime/paged_args.h"

static int split(int64_t tiles, int64_t longest, int64_t items, int heads, int64_t slots)
{
    const kpt_paged_work w = {.tiles = tiles, .longest = longest, .items = items};
    return kpt_paged_split_work(&w, heads, slots);
}

static void test_split_work(void **state)
{
    (void)state;
    /* enough parts to fill the slots once: one decoding sequence of 8 kv heads over 512 tiles,
     * 264 slots */
    assert_int_equal(split(512, 512, 1, 8, 264), 33);
    /* each part keeps two tiles at least */
    assert_int_equal(split(4, 4, 1, 8, 264), 2);
    assert_int_equal(split(2, 2, 1, 8, 264), 1);
    /* a batch that fills the device is not split; neither is an empty one */
    assert_int_equal(split(64 * 512, 512, 64, 8, 264), 1);
    assert_int_equal(split(0, 512, 0, 8, 264), 1);
    assert_int_equal(split(0, 0, 0, 8, 264), 1);
    /* at most KPT_PAGED_MAX_SPLITS */
    assert_int_equal(split(1 << 18, 1 << 18, 1, 1, 100000), KPT_PAGED_MAX_SPLITS);
    /* uniform batches split by the fill alone: their waves are whole (8 x 1 x 4k, 132 SMs) */
    assert_int_equal(split(8 * 64, 64, 8, 8, 132), 2);
    assert_int_equal(split(8 * 512, 512, 8, 8, 132), 2);
    /* a ragged batch splits for its tail: 64 decodes over 1k to 32k keys (8950 tiles, the
     * longest 512) fill 132 SMs unsplit, but the longest may start last: sqrt((512 - 140) *
     * 132 / (3 * 512)) = 5.65 */
    assert_int_equal(split(8950, 512, 64, 8, 132), 6);
    /* lengths close together (64 decodes over 3000 to 4096 keys, a mean of 55 tiles): the tail
     * is short next to a part's cost, sqrt(9 * 132 / (3 * 512)) = 0.88 */
    assert_int_equal(split(64 * 55, 64, 64, 8, 132), 1);
    /* a chunked prefill of 128 blocks over 64 tiles beside 63 decodes over 128: the same */
    assert_int_equal(split(128 * 64 + 63 * 128, 128, 191, 8, 132), 1);
    /* the fill decides where it asks for more: 512 tiles among 3273 a kv head over 32 items */
    assert_int_equal(split(3273, 512, 32, 8, 264), 12);
}

/* The rule's properties over random work: uniform items split by the fill alone, ragged ones
 * at least as much, and never past the bounds. */
static void test_split_random(void **state)
{
    (void)state;
    kpt_rng r;
    kpt_rng_seed(&r, 7);
    for (int it = 0; it < 5000; it++) {
        const int64_t items = 1 + (int64_t)(kpt_rng_next(&r) % 600);
        const int64_t longest = 1 + (int64_t)(kpt_rng_next(&r) % 2000);
        const int heads = 1 + (int)(kpt_rng_next(&r) % 16);
        const int64_t slots = 1 + (int64_t)(kpt_rng_next(&r) % 600);
        /* uniform: every item `longest` tiles */
        int64_t fill = slots * longest / (items * longest * heads);
        fill = fill > longest / 2 ? longest / 2 : fill;
        fill = fill > KPT_PAGED_MAX_SPLITS ? KPT_PAGED_MAX_SPLITS : fill;
        fill = fill > 1 ? fill : 1;
        assert_int_equal(split(items * longest, longest, items, heads, slots), fill);
        /* ragged: the others shorter */
        const int64_t rest = (int64_t)(kpt_rng_next(&r) % (uint64_t)((items - 1) * longest + 1));
        const int n = split(longest + rest, longest, items, heads, slots);
        int64_t rfill = slots * longest / ((longest + rest) * heads);
        rfill = rfill > longest / 2 ? longest / 2 : rfill;
        rfill = rfill > KPT_PAGED_MAX_SPLITS ? KPT_PAGED_MAX_SPLITS : rfill;
        assert_true(n >= 1 && n >= rfill);
        assert_true(n == 1 || (n <= longest / 2 && n <= KPT_PAGED_MAX_SPLITS));
    }
}

static void test_plan(void **state)
{
    (void)state;
    kpt_diag d = {0};
    kpt_paged_plan pl;
    /* one sequence decoding over 32k keys, GQA 32:8, on a device of 264 slots */
    kpt_paged_shape s = {.batch = 1, .max_q = 1, .max_kv = 32768, .num_heads_q = 32,
                         .num_heads_kv = 8};
    assert_int_equal(kpt_paged_plan_compute(&s, 264, 64, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.q_per_block, 4);
    assert_int_equal(pl.rows, 16);
    assert_int_equal(pl.q_blocks, 1);
    assert_int_equal(pl.splits, 33);
    /* partial O (f32, 128 columns) of 64 rows per part and kv head, 256-aligned, then LSEs */
    size_t slots = 33 * 8 * 64, lse_off = 0;
    assert_int_equal(pl.workspace_bytes, slots * 128 * 4 + slots * 4);
    assert_int_equal(kpt_paged_workspace_bytes(&pl, KPT_PAGED_ROWS, 128, &lse_off),
                     pl.workspace_bytes);
    assert_int_equal(lse_off, slots * 128 * 4);
    /* ragged lengths: the longest sequence's 33 queries of 4 heads need three 64-row blocks */
    const int32_t cu[4] = {0, 0, 1, 34}, kv[3] = {0, 700, 5000};
    s = (kpt_paged_shape){.batch = 3, .cu_seqlens_q = cu, .kv_lens = kv, .num_heads_q = 16,
                          .num_heads_kv = 4};
    assert_int_equal(kpt_paged_plan_compute(&s, 264, 64, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.max_q, 33);
    assert_int_equal(pl.max_kv, 5000);
    assert_int_equal(pl.q_per_block, 16);
    /* packed (blocks from cu_seqlens_q): 4 blocks rather than 3 x 3; sequence 2's from block
     * (1 + 2 * 15) / 16 = 1, its three the longest items (79 tiles) of 3 * 79 + 11 in all */
    assert_int_equal(pl.q_blocks, 0);
    assert_int_equal(pl.blocks, 4);
    assert_int_equal(pl.max_tokens, 34);
    assert_true(kpt_paged_plan_ok(&pl, KPT_PAGED_ROWS, 128));
    assert_int_equal(pl.splits, 21); /* 264 * 79 / (248 * 4 kv heads) */
    assert_int_equal(pl.workspace_bytes, kpt_paged_workspace_bytes(&pl, KPT_PAGED_ROWS, 128,
                                                                   NULL));
    /* no device (the CPU backend): one block a sequence, nothing split, no workspace */
    assert_int_equal(kpt_paged_plan_compute(&s, 0, 0, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 1);
    assert_int_equal(pl.q_blocks, 1);
    assert_int_equal(pl.rows, 33 * 4);
    assert_int_equal(pl.workspace_bytes, 0);
}

static void test_plan_packed(void **state)
{
    (void)state;
    kpt_diag d = {0};
    kpt_paged_plan pl;
    /* a chunk of 2048 queries beside 63 decodes (GQA 32:8, 64 rows a CTA, 16 queries): 191
     * packed blocks, not 64 x 128 */
    int32_t cu[65], kv[64];
    cu[0] = 0;
    for (int b = 0; b < 64; b++) {
        cu[b + 1] = cu[b] + (b == 0 ? 2048 : 1);
        kv[b] = b == 0 ? 4096 : 8192;
    }
    kpt_paged_shape s = {.batch = 64, .cu_seqlens_q = cu, .kv_lens = kv, .num_heads_q = 32,
                         .num_heads_kv = 8};
    assert_int_equal(kpt_paged_plan_compute(&s, 264, 64, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.rows, 64);
    assert_int_equal(pl.q_blocks, 0);
    assert_int_equal(pl.blocks, (2111 + 64 * 15) / 16);
    assert_int_equal(pl.max_tokens, 2111);
    /* 128 * 64 + 63 * 128 tiles fill the slots; the tail (the decodes' 128 tiles against a
     * mean of 85) asks for sqrt(42.7 * 264 / (3 * 1528)) = 1.57 parts, and on 132 SMs 1.1 */
    assert_int_equal(pl.splits, 2);
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 1);
    /* one long decode among short prefills: the long one's keys are split though the blocks
     * outnumber the slots (8 sequences: 300 queries over 9000 keys, 7 over 32768 and short
     * ones) */
    const int32_t cu2[9] = {0, 0, 1, 1, 17, 18, 318, 319, 326};
    const int32_t kv2[8] = {0, 1, 700, 16, 5000, 9000, 64, 32768};
    s = (kpt_paged_shape){.batch = 8, .cu_seqlens_q = cu2, .kv_lens = kv2, .num_heads_q = 32,
                          .num_heads_kv = 8};
    assert_int_equal(kpt_paged_plan_compute(&s, 264, 64, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.q_blocks, 0);
    assert_int_equal(pl.blocks, (326 + 8 * 15) / 16);
    /* 19 * 141 + 512 + 79 + 1 + 1 + 1 = 3273 tiles a kv head in 24 blocks: the fill asks for
     * 264 * 512 / (3273 * 8) = 5 parts, the tail for sqrt((512 - 136) * 264 / (3 * 192)) =
     * 13.1 */
    assert_int_equal(pl.splits, 13);
    /* on 132 SMs: 9.3 parts; 13 for two CTAs an SM would leave parts under 64 tiles */
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 9);
    /* equal query counts stay uniform: packing would not save a block */
    const int32_t cu3[3] = {0, 16, 32}, kv3[2] = {4096, 4096};
    s = (kpt_paged_shape){.batch = 2, .cu_seqlens_q = cu3, .kv_lens = kv3, .num_heads_q = 32,
                          .num_heads_kv = 8};
    assert_int_equal(kpt_paged_plan_compute(&s, 264, 64, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.q_blocks, 1);
    assert_int_equal(pl.blocks, 2);
    assert_int_equal(pl.max_tokens, 0);
    assert_true(kpt_paged_plan_ok(&pl, KPT_PAGED_ROWS, 128));
    /* a plan whose workspace is for other columns, or whose blocks disagree with its other
     * fields (the workspace made to match), or with no split count, is not one kpt made */
    assert_true(pl.splits > 1);
    assert_false(kpt_paged_plan_ok(&pl, KPT_PAGED_ROWS, 64));
    kpt_paged_plan bad = pl;
    bad.blocks = 3;
    bad.workspace_bytes = kpt_paged_workspace_bytes(&bad, KPT_PAGED_ROWS, 128, NULL);
    assert_false(kpt_paged_plan_ok(&bad, KPT_PAGED_ROWS, 128));
    bad = pl;
    bad.splits = 0;
    assert_false(kpt_paged_plan_ok(&bad, KPT_PAGED_ROWS, 128));
}

/* Random ragged batches: a packed plan gives every sequence its blocks in order, within the
 * launch's, by the rule include/kpt/serving.h states (sequence b's first block is
 * (cu[b] + b (p - 1)) / p); a uniform one covers each sequence's queries; splits stay in range. */
static void test_plan_random(void **state)
{
    (void)state;
    kpt_rng r;
    kpt_rng_seed(&r, 29);
    int packed = 0;
    for (int it = 0; it < 2000; it++) {
        const int B = 1 + (int)(kpt_rng_next(&r) % 40), group = 1 << (kpt_rng_next(&r) % 4);
        int32_t cu[41], kv[40];
        cu[0] = 0;
        for (int b = 0; b < B; b++) {
            const uint64_t x = kpt_rng_next(&r);
            const int q = (int)(x % 4 == 0 ? (x >> 8) % 3000 : (x >> 8) % 3);
            cu[b + 1] = cu[b] + q;
            kv[b] = q + (int)((x >> 20) % 40000);
        }
        kpt_paged_shape s = {.batch = B, .cu_seqlens_q = cu, .kv_lens = kv,
                             .num_heads_q = 8 * group, .num_heads_kv = 8};
        kpt_paged_plan pl;
        kpt_diag d = {0};
        const int per_sm = 1 + it % 3;
        kpt_paged_plan one;
        if (kpt_paged_plan_sms(&s, 132, it % 2, per_sm, 128, &pl, &d) ||
            kpt_paged_plan_sms(&s, 132, it % 2, 1, 128, &one, &d))
            fail_msg("%s", d.message);
        assert_true(kpt_paged_plan_ok(&pl, KPT_PAGED_ROWS, 128));
        /* CTAs an SM only ever add splits, and those stay within one wave of them */
        assert_true(pl.splits >= one.splits);
        if (pl.splits != one.splits)
            assert_true((int64_t)pl.blocks * pl.splits * pl.num_heads_kv <= 132 * per_sm);
        assert_true(pl.splits >= 1 && pl.splits <= KPT_PAGED_MAX_SPLITS);
        const int p = pl.q_per_block;
        for (int b = 0; b < B; b++) {
            const int q = cu[b + 1] - cu[b], need = (q + p - 1) / p;
            if (pl.q_blocks) {
                assert_true(pl.q_blocks * p >= q);
                continue;
            }
            const int64_t first = ((int64_t)cu[b] + (int64_t)b * (p - 1)) / p;
            const int64_t next = b + 1 < B ? ((int64_t)cu[b + 1] + (int64_t)(b + 1) * (p - 1)) / p
                                           : pl.blocks;
            assert_true(first + need <= next);
        }
        packed += pl.q_blocks == 0;
        if (pl.splits > 1)
            assert_int_equal(pl.workspace_bytes,
                             kpt_paged_workspace_bytes(&pl, KPT_PAGED_ROWS, 128, NULL));
    }
    assert_true(packed > 100); /* the batches above mix long and short sequences */
}

static void test_plan_two_wide(void **state)
{
    (void)state;
    kpt_diag d = {0};
    kpt_paged_plan pl;
    /* 16 tokens of 8 sequences over 32k keys, GQA 32:8 (64 rows a CTA), 132 SMs: two CTAs an
     * SM for the wide kernel (4 parts of 128 tiles), one otherwise */
    kpt_paged_shape s = {.batch = 8, .max_q = 16, .max_kv = 32768, .num_heads_q = 32,
                         .num_heads_kv = 8};
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.rows, 64);
    assert_int_equal(pl.splits, 4);
    assert_false(kpt_paged_one_per_sm(&pl, 132));
    assert_int_equal(kpt_paged_plan_sms(&s, 132, false, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 2);
    assert_true(kpt_paged_one_per_sm(&pl, 132));
    /* parts shorter than KPT_PAGED_TWO_TILES tiles keep one CTA an SM: one sequence (33
     * parts of 16 tiles), or 4k keys (4 parts of 16) */
    s.batch = 1;
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 16);
    s.batch = 8;
    s.max_kv = 4096;
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 2);
    /* CTAs of 16 rows (4 tokens) keep one an SM; so does a batch that is not split */
    s.max_kv = 32768;
    s.max_q = 4;
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.rows, 16);
    assert_int_equal(pl.splits, 2);
    s.max_q = 16;
    s.batch = 64;
    assert_int_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
    assert_int_equal(pl.splits, 1);
    assert_false(kpt_paged_one_per_sm(&pl, 132));
    /* refusals pass through */
    s.num_heads_q = 30;
    assert_int_not_equal(kpt_paged_plan_sms(&s, 132, true, 1, 128, &pl, &d), KPT_OK);
}

static void test_plan_thin_wave(void **state)
{
    (void)state;
    /* GQA 32:8 on 132 SMs: sequences, queries and keys each, the CTAs of a serving kernel an SM
     * holds, the value head dim; the plan's rows and split count */
    static const struct {
        int batch, q, kv, per_sm, dv, rows, splits;
        const char *why;
    } cases[] = {
        {9, 1, 32768, 1, 128, 16, 1, "72 items, 55 % of the SMs: one an SM is all there is"},
        {9, 1, 32768, 2, 128, 16, 3, "a wave of two an SM: 216 CTAs"},
        {12, 1, 32768, 2, 128, 16, 2, "96 items, 73 %"},
        {14, 1, 32768, 2, 128, 16, 2, "112 items, 85 %"},
        {1, 1, 32768, 2, 128, 16, 16, "128 CTAs, 97 %: kept"},
        {5, 1, 32768, 2, 128, 16, 3, "120 CTAs, 91 %: kept"},
        {16, 1, 32768, 2, 128, 16, 2, "unsplit, 128 CTAs: a wave of two an SM too"},
        {8, 1, 32768, 2, 128, 16, 2, "split, 128 CTAs: kept"},
        {20, 1, 32768, 2, 128, 16, 1, "more items than SMs: kept"},
        {9, 8, 32768, 2, 128, 32, 3, "32 rows"},
        {9, 16, 32768, 2, 128, 64, 3, "64 rows"},
        {9, 1, 200, 2, 128, 16, 2, "4 tiles: parts of two at least"},
        {9, 1, 32768, 3, 64, 16, 5, "three an SM: 360 CTAs"},
        {9, 1, 32768, 8, 64, 16, 7, "eight count as KPT_PAGED_THIN_PER_SM: 504 CTAs"},
        {8, 1, 32768, 3, 64, 16, 6, "three an SM split full waves too (2 parts one an SM)"},
        {8, 1, 32768, 2, 64, 16, 2, "two an SM leave full waves alone"},
        {1, 1, 32768, 3, 64, 16, 49, "392 CTAs"},
        {1, 1, 4096, 3, 64, 16, 16, "parts of 4 tiles at least: kept (32 would leave 2)"},
        {2, 1, 4096, 3, 64, 16, 16, "parts of 4 tiles: 16, not 24"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kpt_paged_shape s = {.batch = cases[i].batch, .max_q = cases[i].q,
                             .max_kv = cases[i].kv, .num_heads_q = 32, .num_heads_kv = 8};
        kpt_paged_plan pl;
        kpt_diag d = {0};
        if (kpt_paged_plan_sms(&s, 132, true, cases[i].per_sm, cases[i].dv, &pl, &d))
            fail_msg("case %zu: %s", i, d.message);
        if (pl.rows != cases[i].rows || pl.splits != cases[i].splits)
            fail_msg("case %zu (%s): %d rows in %d parts, expected %d in %d", i, cases[i].why,
                     pl.rows, pl.splits, cases[i].rows, cases[i].splits);
        assert_true(kpt_paged_plan_ok(&pl, KPT_PAGED_ROWS, cases[i].dv));
    }
}

/* `call` (which reports into d_) fails with a message holding `text` */
#define EXPECT_FAIL(call, text)                                                                  \
    do {                                                                                         \
        kpt_diag d_ = {0};                                                                       \
        assert_int_not_equal((call), KPT_OK);                                                    \
        if (!strstr(d_.message, (text)))                                                         \
            fail_msg("got '%s', expected '%s'", d_.message, (text));                             \
    } while (0)

#define EXPECT_PLAN(s, text)                                                                     \
    do {                                                                                         \
        kpt_paged_plan p_;                                                                       \
        EXPECT_FAIL(kpt_paged_plan_compute(&(s), 264, 64, 128, &p_, &d_), (text));               \
    } while (0)

static void test_refusals(void **state)
{
    (void)state;
    int32_t cu[3] = {0, 2, 1}, kv[2] = {4, 4};
    kpt_paged_shape s = {.batch = 2, .cu_seqlens_q = cu, .kv_lens = kv, .num_heads_q = 8,
                         .num_heads_kv = 2};
    EXPECT_PLAN(s, "cu_seqlens_q decreases at sequence 1 (2, then 1)");
    cu[2] = 3;
    kv[0] = 1;
    EXPECT_PLAN(s, "sequence 0 has 2 queries but 1 keys");
    kv[0] = 4;
    s.num_heads_q = 7;
    EXPECT_PLAN(s, "Hq a multiple of Hkv");
    s.num_heads_q = 256;
    s.num_heads_kv = 2;
    EXPECT_PLAN(s, "GQA ratio 128: the serving kernels take up to 64");
}

/* The row checks of the kernels' tensors: q, k and v (and the forward's o) need 16-byte rows
 * for their vector copies; the serving kernels' o only the element's alignment. */
static void test_row_checks(void **state)
{
    (void)state;
    static _Alignas(16) uint16_t buf[4 * 2 * 129 + 8];
    kpt_tensor t = {.data = buf, .dtype = KPT_DTYPE_BF16, .rank = 3, .shape = {4, 2, 128},
                    .stride = {2 * 129, 129, 1}};
    kpt_diag d = {0};
    EXPECT_FAIL(kpt_kernel_check_rows(&t, "o", KPT_DTYPE_BF16, 128, &d_),
                "tensor o: stride 0 (258) must be a multiple of 8 elements");
    assert_int_equal(kpt_kernel_check_elems(&t, "o", KPT_DTYPE_BF16, 128, &d), KPT_OK);
    t.data = (char *)buf + 1;
    EXPECT_FAIL(kpt_kernel_check_elems(&t, "o", KPT_DTYPE_BF16, 128, &d_),
                "tensor o: the data pointer must be aligned to its element size");
    t.data = buf + 1;
    t.stride[0] = 256;
    t.stride[1] = 128;
    assert_int_equal(kpt_kernel_check_elems(&t, "o", KPT_DTYPE_BF16, 128, &d), KPT_OK);
    EXPECT_FAIL(kpt_kernel_check_rows(&t, "q", KPT_DTYPE_BF16, 128, &d_),
                "tensor q: the data pointer must be 16-byte aligned");
    t.stride[2] = 2;
    EXPECT_FAIL(kpt_kernel_check_elems(&t, "o", KPT_DTYPE_BF16, 128, &d_),
                "the head dim must be contiguous");
    t.stride[2] = 1;
    EXPECT_FAIL(kpt_kernel_check_elems(&t, "o", KPT_DTYPE_F16, 128, &d_),
                "tensor o is bf16; this kernel was compiled for f16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_work),
        cmocka_unit_test(test_split_random),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_plan_packed),
        cmocka_unit_test(test_plan_random),
        cmocka_unit_test(test_plan_two_wide),
        cmocka_unit_test(test_plan_thin_wave),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_row_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
