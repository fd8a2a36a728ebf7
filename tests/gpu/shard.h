/* --shard K/N of the GPU checkers (gpu_check, paged_check): N processes share one matrix, each
 * running the cases whose index is K modulo N. Header-only. */
#ifndef KPT_TESTS_GPU_SHARD_H
#define KPT_TESTS_GPU_SHARD_H

#include <stdbool.h>
#include <stdio.h>

typedef struct shard {
    int k, n;
} shard;

#define SHARD_ALL ((shard){0, 1})
#define SHARD_USAGE "[--shard K/N (0 <= K < N)]"

/* *s from "K/N"; false (s unchanged) unless 0 <= K < N. */
static inline bool shard_parse(const char *text, shard *s)
{
    int k, n;
    if (sscanf(text, "%d/%d", &k, &n) != 2 || n < 1 || k < 0 || k >= n)
        return false;
    *s = (shard){k, n};
    return true;
}

/* Whether case i is this shard's. */
static inline bool shard_has(shard s, int i)
{
    return i % s.n == s.k;
}

#endif
