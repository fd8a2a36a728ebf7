/* A small deterministic PRNG (splitmix64 seeding a xoshiro256** state) for test inputs and
 * kptc's random data: the same seed gives the same numbers on every machine. */
#ifndef KPT_TOOLS_RNG_H
#define KPT_TOOLS_RNG_H

#include <stdint.h>

typedef struct kpt_rng {
    uint64_t s[4];
} kpt_rng;

void kpt_rng_seed(kpt_rng *r, uint64_t seed);
uint64_t kpt_rng_next(kpt_rng *r);
/* Uniform in [0, 1). */
double kpt_rng_uniform(kpt_rng *r);
/* Uniform integer in [lo, hi] (inclusive; lo <= hi). */
int64_t kpt_rng_range(kpt_rng *r, int64_t lo, int64_t hi);
/* Standard normal (Box-Muller). */
double kpt_rng_normal(kpt_rng *r);

#endif
