/* The seeded Fisher–Yates shuffle behind dataset_split and every epoch's order. */
#include "datasets/datasets_internal.h"

#include "common/rng.h"

/* Uniform in [0, n): the high bits of a 64x64 product (bias below n / 2^64). */
static int64_t rng_below(struct rng *r, int64_t n) {
    return (int64_t)(((unsigned __int128)rng_next(r) * (uint64_t)n) >> 64);
}

void shuffle_indices(int64_t *order, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) order[i] = i;
    struct rng rng;
    rng_seed(&rng, seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = rng_below(&rng, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}
