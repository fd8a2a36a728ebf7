/* Number formats and .npy reading. */
#include "tests/testutil.h"

#include "base/numeric.h"
#include "tools/npy.h"

static void test_f16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kpt_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true(((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff));
            assert_true(isnan(kpt_f16_to_f32(kpt_f32_to_f16(f))));
            continue;
        }
        assert_int_equal(kpt_f32_to_f16(f), h); /* every half round-trips */
    }
    assert_true(kpt_f16_to_f32(0x3c00) == 1.0f);
    assert_true(kpt_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_int_equal(kpt_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(kpt_f32_to_f16(65520.0f), 0x7c00); /* rounds to infinity */
    assert_int_equal(kpt_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
    assert_int_equal(kpt_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    assert_int_equal(kpt_f32_to_f16(ldexpf(1, -25)), 0x0000);        /* tie to even: 0 */
    assert_int_equal(kpt_f32_to_f16(ldexpf(3, -26)), 0x0001);
    assert_int_equal(kpt_f32_to_f16(-2.0f), 0xc000);
}

static void test_bf16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kpt_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(kpt_f32_to_bf16(f), h);
    }
    assert_int_equal(kpt_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
    assert_int_equal(kpt_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82);
    assert_true(isnan(kpt_bf16_to_f32(kpt_f32_to_bf16(NAN))));
}

static size_t npy_bytes(unsigned char *buf, const char *header, const void *data, size_t n)
{
    size_t hl = strlen(header);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hl & 0xff);
    buf[9] = (unsigned char)(hl >> 8);
    memcpy(buf + 10, header, hl);
    memcpy(buf + 10 + hl, data, n);
    return 10 + hl + n;
}

static void test_npy(void **state)
{
    (void)state;
    unsigned char buf[512];
    int32_t ints[6] = {0, 0, 1, 1, 2, -7};
    size_t n = npy_bytes(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }   \n",
                         ints, sizeof(ints));
    kpt_npy npy;
    kpt_diag d = {0};
    assert_int_equal(kpt_npy_parse(buf, n, &npy, &d), KPT_OK);
    assert_int_equal(npy.rank, 2);
    assert_int_equal(npy.shape[0], 2);
    assert_int_equal(npy.shape[1], 3);
    assert_true(npy.integral);
    assert_true(npy.values[5] == -7);
    kpt_npy_free(&npy);
    int64_t longs[3] = {5, 6, 7};
    n = npy_bytes(buf, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }\n", longs, sizeof(longs));
    assert_int_equal(kpt_npy_parse(buf, n, &npy, &d), KPT_OK);
    assert_int_equal(npy.rank, 1);
    assert_true(npy.values[2] == 7);
    kpt_npy_free(&npy);
    /* errors: truncated data, bad magic, big-endian, fortran order, every prefix of a file */
    n = npy_bytes(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }\n", ints, sizeof(ints));
    assert_int_equal(kpt_npy_parse(buf, n - 1, &npy, &d), KPT_ERR_PARSE);
    assert_non_null(strstr(d.message, ".npy data has 23 bytes, but the shape needs 24"));
    for (size_t cut = 0; cut < n; cut++)
        assert_int_not_equal(kpt_npy_parse(buf, cut, &npy, &d), KPT_OK);
    assert_int_equal(kpt_npy_parse("hello world", 11, &npy, &d), KPT_ERR_PARSE);
    n = npy_bytes(buf, "{'descr': '>i4', 'fortran_order': False, 'shape': (2, 3), }\n", ints, sizeof(ints));
    assert_int_equal(kpt_npy_parse(buf, n, &npy, &d), KPT_ERR_UNSUPPORTED);
    n = npy_bytes(buf, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }\n", ints, sizeof(ints));
    assert_int_equal(kpt_npy_parse(buf, n, &npy, &d), KPT_ERR_UNSUPPORTED);
    n = npy_bytes(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999, 3), }\n", ints, 0);
    assert_int_equal(kpt_npy_parse(buf, n, &npy, &d), KPT_ERR_LIMIT);
    assert_int_equal(kpt_npy_load("/nonexistent/file.npy", &npy, &d), KPT_ERR_IO);
    /* random bytes after a valid magic never crash */
    kpt_rng rng;
    kpt_rng_seed(&rng, 5);
    for (int i = 0; i < 2000; i++) {
        size_t len = (size_t)kpt_rng_range(&rng, 0, 200);
        memcpy(buf, "\x93NUMPY", 6);
        for (size_t j = 6; j < len; j++)
            buf[j] = (unsigned char)kpt_rng_next(&rng);
        if (kpt_npy_parse(buf, len, &npy, &d) == KPT_OK)
            kpt_npy_free(&npy);
    }
}

static void test_dtypes(void **state)
{
    (void)state;
    assert_int_equal(kpt_dtype_size(KPT_DTYPE_BF16), 2);
    assert_int_equal(kpt_dtype_size(KPT_DTYPE_INVALID), 0);
    assert_string_equal(kpt_dtype_name(KPT_DTYPE_F16), "f16");
    assert_int_equal(kpt_dtype_from_name("fp16"), KPT_DTYPE_F16);
    assert_int_equal(kpt_dtype_from_name("bfloat16"), KPT_DTYPE_BF16);
    assert_int_equal(kpt_dtype_from_name("f17"), KPT_DTYPE_INVALID);
    assert_int_equal(kpt_dtype_from_name(NULL), KPT_DTYPE_INVALID);
    assert_string_equal(kpt_status_string(KPT_ERR_PARSE), "parse error");
    assert_string_equal(kpt_status_string((kpt_status)-99), "unknown status");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_exhaustive), cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_npy), cmocka_unit_test(test_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
