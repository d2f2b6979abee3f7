/* The reference generator: plain recompute (the whole sequence through the model at
 * every step, no KV cache). Slow by design and simple enough to trust; the paged rollout
 * engine is checked against it token for token. */
#ifndef SMELT_MODEL_GENERATE_H
#define SMELT_MODEL_GENERATE_H

#include <stdint.h>

#include "model/transformer.h"

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
