/* What the fuzz targets share: the input as a C string, and the IR text round trip. */
#ifndef KPT_TESTS_FUZZ_UTIL_H
#define KPT_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/pattern.h"

/* The input bytes as a NUL-terminated string (malloc'ed), or NULL when out of memory. */
static inline char *kpt_fuzz_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = 0;
    }
    return text;
}

/* Aborts unless p prints as IR text that reads back to the same text. */
static inline void kpt_fuzz_round_trip(const kpt_pattern *p)
{
    char *ir = kpt_pattern_print(p);
    kpt_diag rd = {0};
    kpt_pattern *back = ir ? kpt_pattern_read(ir, &rd) : NULL;
    char *again = back ? kpt_pattern_print(back) : NULL;
    if (ir && (!again || strcmp(ir, again) != 0))
        abort(); /* the IR text round trip is broken */
    free(again);
    free(ir);
    kpt_pattern_destroy(&back);
}

#endif
