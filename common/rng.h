/* A small seeded random generator (xoshiro256**, seeded through splitmix64): the same
 * seed gives the same stream on every machine, and its whole state is 32 bytes that a
 * checkpoint can save. Not for cryptography. */
#ifndef SMELT_COMMON_RNG_H
#define SMELT_COMMON_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s[4];
};

/* The golden-ratio increment of splitmix64: added before mixing so that 0 and nearby
 * inputs land far apart. */
#define RNG_GOLDEN 0x9e3779b97f4a7c15ull

/* splitmix64's finaliser: a bijective 64-bit mixer. Seeds derived from (seed, index)
 * pairs go through it so that neighbouring inputs give unrelated streams. */
static inline uint64_t rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(struct rng *rng, uint64_t seed);
uint64_t rng_next(struct rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(struct rng *rng);
/* Standard normal (Box-Muller; one value per call, no cached state). */
double rng_normal(struct rng *rng);

#endif
