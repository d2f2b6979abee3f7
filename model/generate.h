/* The reference generator: plain recompute (the whole sequence through the model at
 * every step, no KV cache). Slow by design and simple enough to trust; the paged rollout
 * engine is checked against it token for token. */
#ifndef SMELT_MODEL_GENERATE_H
#define SMELT_MODEL_GENERATE_H

#include <stdint.h>

#include "common/rng.h"
#include "model/transformer.h"

/* The sampling rule, shared by the reference generator and the rollout engine so that
 * both pick the same token from the same logits and random stream. */
struct sample_params {
    float temperature;       /* 0: greedy (argmax, lowest id on ties) */
    int64_t top_k;           /* 0: off */
    float top_p;             /* (0, 1]; 1: off */
    float min_p;             /* [0, 1); 0: off */
};

struct sample_candidate {
    float prob;
    int32_t id;
};

/* SMELT_EINVAL naming the field: temperature >= 0 and finite, top_k >= 0, top_p in
 * (0, 1], min_p in [0, 1). */
int sample_params_check(const struct sample_params *p, struct smelt_error *err);

/* Picks a token from logits[0..V): softmax at the temperature, then top-k, then min-p
 * (drop tokens below min_p times the top probability), then top-p (the smallest prefix
 * by probability whose mass reaches top_p), one uniform from rng over what is left
 * (none when greedy), walked in order of probability when a filter is on and in id order
 * when none is. work: room for V candidates (no allocation per token). */
int32_t sample_token(const float *logits, int64_t V, const struct sample_params *p, struct rng *rng,
                     struct sample_candidate *work);

/* log p(id) under log_softmax(logits) — the unscaled distribution, what RL needs. */
float sample_logprob(const float *logits, int64_t V, int32_t id);

/* The random stream of sample `index` of a request seeded with seed; sample 0's stream
 * is rng_seed(seed), the reference generator's. */
void sample_stream_seed(struct rng *rng, uint64_t seed, uint64_t index);

struct generate_params {
    int64_t max_new_tokens;  /* >= 1 */
    float temperature;       /* 0: greedy (argmax, lowest id on ties) */
    int64_t top_k;           /* 0: off */
    float top_p;             /* (0, 1]; 1: off */
    float min_p;             /* [0, 1); 0: off */
    uint64_t seed;
    const int32_t *stop_ids; /* generation ends after emitting one of these */
    int n_stop_ids;
};

#define GENERATE_FINISH_STOP   "stop"
#define GENERATE_FINISH_LENGTH "length"

struct generate_result {
    int32_t *ids;            /* [n] generated tokens; malloc'd, freed by generate_result_free */
    float *logprobs;         /* [n] log p(token) under the model's unscaled distribution */
    int64_t n;
    const char *finish_reason; /* GENERATE_FINISH_STOP or _LENGTH (static strings) */
};

/* Validates params (errors name the field) and generates after prompt[0..n_prompt).
 * Stops at max_new_tokens, a stop id, or the model's context length. */
int model_generate_reference(struct model *model, const int32_t *prompt, int64_t n_prompt,
                             const struct generate_params *params, struct generate_result *out,
                             struct smelt_error *err);
void generate_result_free(struct generate_result *result);

#endif
