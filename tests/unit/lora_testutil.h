/* Helpers shared by the LoRA tests: the parity fixtures' packed inputs, random adapter
 * weights, and forward passes to logits / a weighted logprob loss. */
#ifndef SMELT_TESTS_LORA_TESTUTIL_H
#define SMELT_TESTS_LORA_TESTUTIL_H

#include "tests/unit/parity_testutil.h"

#include <string.h>

#include "lora/lora.h"
#include "model/model.h"

/* Every adapter weight ~ U(-scale, scale): B non-zero so the adapter matters. */
static inline void lora_fill_random(struct lora *lora, uint64_t seed, double scale) {
    struct test_rng rng = {seed};
    float *w = lora->weights.data;
    for (int64_t i = 0; i < lora->n_weights; i++) w[i] = (float)test_rng_uniform(&rng, -scale, scale);
}

/* Forward to logits [T, V] (and logprobs [T] when lp is not NULL). */
static inline void lora_forward(struct model *m, struct model_acts *acts, const struct parity_packed *p,
                                float *logits, float *lp) {
    int64_t shape[2] = {p->T, m->config.vocab_size};
    struct tensor tl = tensor_f32(logits, 2, shape), tlp = tensor_f32(lp, 1, &p->T);
    struct model_batch b = parity_batch_of(p);
    struct smelt_error err;
    cr_assert_eq(model_forward(m, acts, &b, lp ? &tlp : NULL, logits ? &tl : NULL, NULL, &err), 0, "%s",
                 err.message);
}

/* L = sum_t weights[t] * logprob[t], in double. */
static inline double lora_loss(struct model *m, struct model_acts *acts, const struct parity_packed *p) {
    float lp[64];
    lora_forward(m, acts, p, NULL, lp);
    double s = 0;
    for (int64_t t = 0; t < p->T; t++) s += (double)p->weights[t] * lp[t];
    return s;
}

static inline void lora_backward(struct model *m, struct model_acts *acts, struct parity_packed *p) {
    struct tensor dlp = tensor_f32(p->weights, 1, &p->T);
    struct smelt_error err;
    cr_assert_eq(model_backward(m, acts, &dlp, NULL, &err), 0, "%s", err.message);
}

#endif
