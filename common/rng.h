/* A small seeded random generator (xoshiro256**, seeded through splitmix64): the same
 * seed gives the same stream on every machine, and its whole state is 32 bytes that a
 * checkpoint can save. Not for cryptography. */
#ifndef SMELT_COMMON_RNG_H
#define SMELT_COMMON_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

void rng_seed(struct rng *rng, uint64_t seed);
uint64_t rng_next(struct rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(struct rng *rng);
/* Standard normal (Box-Muller; one value per call, no cached state). */
double rng_normal(struct rng *rng);

#endif
