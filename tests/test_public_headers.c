/* The public headers compile alone, in any order, and libkpt exports what they declare. */
#include <kpt/reference.h>
#include <kpt/kpt.h>
#include <kpt/tensor.h>
#include <kpt/status.h>
#include <kpt/pattern.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

static void test_link(void **state)
{
    (void)state;
    kpt_pattern *p = NULL;
    kpt_diag d;
    assert_int_equal(kpt_pattern_parse("causal", &p, &d), KPT_OK);
    assert_string_equal(kpt_pattern_name(p), "causal");
    kpt_pattern_destroy(&p);
    assert_null(p);
    assert_int_equal(kpt_pattern_parse("causl", &p, &d), KPT_ERR_PARSE);
    assert_non_null(strstr(d.message, "did you mean 'causal'"));
    assert_non_null(kpt_version());
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_link)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
