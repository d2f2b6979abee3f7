/* The sampling rule (temperature, top-k, min-p, top-p) shared by the reference
 * generator and the rollout engine. */
#include "model/generate.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

int sample_params_check(const struct sample_params *p, struct smelt_error *err) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return error_set(err, SMELT_EINVAL, "temperature must be >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return error_set(err, SMELT_EINVAL, "top_k must be >= 0 (got %lld)", (long long)p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return error_set(err, SMELT_EINVAL, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0 && p->min_p < 1)) return error_set(err, SMELT_EINVAL, "min_p must be in [0, 1) (got %g)", p->min_p);
    return SMELT_OK;
}

static int by_prob_desc(const void *a, const void *b) {
    const struct sample_candidate *x = a, *y = b;
    if (x->prob != y->prob) return x->prob < y->prob ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id; /* deterministic order on ties */
}

int32_t sample_token(const float *logits, int64_t V, const struct sample_params *p, struct rng *rng,
                     struct sample_candidate *work) {
    if (p->temperature == 0) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return (int32_t)best;
    }
    float max = logits[0];
    for (int64_t v = 1; v < V; v++) max = fmaxf(max, logits[v]);
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        float e = expf((logits[v] - max) / p->temperature);
        work[v] = (struct sample_candidate){e, (int32_t)v};
        sum += e;
    }
    for (int64_t v = 0; v < V; v++) work[v].prob = (float)(work[v].prob / sum);
    /* Only the filters need the candidates in order of probability; without one, the draw
     * walks them in id order (a sort of the whole vocabulary per token costs more than
     * the model's step on a small model with a large vocabulary). */
    bool filtered = (p->top_k > 0 && p->top_k < V) || p->min_p > 0 || p->top_p < 1;
    if (filtered) qsort(work, (size_t)V, sizeof *work, by_prob_desc);
    int64_t keep = V;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    if (p->min_p > 0) {
        float floor_p = p->min_p * work[0].prob;
        int64_t k = 1;
        while (k < keep && work[k].prob >= floor_p) k++;
        keep = k;
    }
    if (p->top_p < 1) {
        double mass = 0;
        int64_t k = 0;
        while (k < keep) {
            mass += work[k++].prob;
            if (mass >= p->top_p) break;
        }
        keep = k;
    }
    double total = 0;
    for (int64_t k = 0; k < keep; k++) total += work[k].prob;
    double u = rng_uniform(rng) * total, acc = 0;
    for (int64_t k = 0; k < keep; k++) {
        acc += work[k].prob;
        if (u < acc) return work[k].id;
    }
    return work[keep - 1].id;
}

/* ops_logprobs of the one row on the host: the trainer's own arithmetic for the same
 * token (its log-sum-exp order, on the CPU backend), so in batch-invariant mode the
 * engine's logprob of a sampled token has the trainer's bits, and the reference
 * generator's the engine's. */
float sample_logprob(const float *logits, int64_t V, int32_t id) {
    int64_t shape[2] = {1, V}, one = 1;
    float out = 0.0f;
    struct tensor lg = tensor_f32((float *)logits, 2, shape), tg = tensor_i32(&id, 1, &one);
    struct tensor lp = tensor_f32(&out, 1, &one);
    struct smelt_error err;
    int rc = ops_logprobs(&lp, NULL, &lg, &tg, &err);
    SMELT_ASSERT(rc == SMELT_OK); /* id < V: the sampler chose it from these logits */
    return out;
}

void sample_stream_seed(struct rng *rng, uint64_t seed, uint64_t index) {
    if (index == 0) {
        rng_seed(rng, seed);
        return;
    }
    rng_seed(rng, rng_mix64(seed + index * RNG_GOLDEN));
}
