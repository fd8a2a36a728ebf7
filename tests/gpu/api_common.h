/* What the GPU programs that drive only the public API (runtime_check, backward_check) share:
 * the failure count and CHECK, random inputs, device buffers. Header-only; each program includes
 * it once. */
#ifndef KPT_TESTS_GPU_API_COMMON_H
#define KPT_TESTS_GPU_API_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include <kpt/kpt.h>

static int failures;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        if (!(cond)) {                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);       \
            printf(__VA_ARGS__);                              \
            printf("\n");                                     \
            failures++;                                       \
        }                                                     \
    } while (0)

static float uniform(void) /* in [-1, 1] */
{
    return (float)((double)rand() / RAND_MAX * 2 - 1);
}

/* A device buffer of n bytes holding src's (src NULL: uninitialised). */
static kpt_buffer *upload(kpt_context *ctx, const void *src, size_t n)
{
    kpt_buffer *b = NULL;
    kpt_diag d = {0};
    kpt_status st = kpt_buffer_create(ctx, n, &b, &d);
    if (!st && src)
        st = kpt_buffer_write(b, 0, src, n, &d);
    CHECK(!st, "buffer: %s", d.message);
    return b;
}

#endif
