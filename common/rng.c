#include "common/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) { return rng_mix64(*x += RNG_GOLDEN); }

void rng_seed(struct rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(struct rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double rng_uniform(struct rng *rng) { return (double)(rng_next(rng) >> 11) * 0x1p-53; }

double rng_normal(struct rng *rng) {
    double u1 = 1.0 - rng_uniform(rng); /* (0, 1]: log is finite */
    double u2 = rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
