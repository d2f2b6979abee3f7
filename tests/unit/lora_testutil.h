/* Helpers shared by the LoRA tests: the parity fixtures' packed inputs, random adapter
 * weights, and forward passes to logits / a weighted logprob loss. */
#ifndef SMELT_TESTS_LORA_TESTUTIL_H
#define SMELT_TESTS_LORA_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <string.h>

#include "lora/lora.h"
#include "model/model.h"

#define LORA_PARITY_DIR "tests/data/parity"

/* Both sequences of a fixture's inputs.json packed in one row. */
struct lora_packed {
    int64_t T;
    int n_seqs;
    int32_t ids[64], targets[64], cu[8];
    float weights[64]; /* dL/dlogprob per token */
    int64_t len[8];
};

static inline void lora_load_inputs(const char *type, struct lora_packed *p) {
    char path[256];
    snprintf(path, sizeof path, LORA_PARITY_DIR "/%s/inputs.json", type);
    json_t *root;
    struct smelt_error err;
    cr_assert_eq(json_load_path(path, &root, &err), 0, "%s", err.message);
    json_t *seqs = json_object_get(root, "sequences"), *ws = json_object_get(root, "loss_weights");
    memset(p, 0, sizeof *p);
    p->n_seqs = (int)json_array_size(seqs);
    cr_assert(p->n_seqs > 0 && p->n_seqs < 8);
    for (int s = 0; s < p->n_seqs; s++) {
        json_t *seq = json_array_get(seqs, (size_t)s), *w = json_array_get(ws, (size_t)s);
        int64_t n = (int64_t)json_array_size(seq);
        p->len[s] = n;
        p->cu[s] = (int32_t)p->T;
        for (int64_t t = 0; t < n; t++) {
            int64_t i = p->T + t;
            cr_assert(i < 64);
            p->ids[i] = (int32_t)json_integer_value(json_array_get(seq, (size_t)t));
            p->targets[i] = t + 1 < n ? (int32_t)json_integer_value(json_array_get(seq, (size_t)t + 1)) : -1;
            p->weights[i] = t + 1 < n ? (float)json_real_value(json_array_get(w, (size_t)t)) : 0.0f;
        }
        p->T += n;
    }
    p->cu[p->n_seqs] = (int32_t)p->T;
    json_decref(root);
}

static inline struct model_batch lora_batch_of(const struct lora_packed *p) {
    return (struct model_batch){.n_tokens = p->T, .n_seqs = p->n_seqs, .ids = p->ids,
                                .cu_seqlens = p->cu, .targets = p->targets};
}

/* Every adapter weight ~ U(-scale, scale): B non-zero so the adapter matters. */
static inline void lora_fill_random(struct lora *lora, uint64_t seed, double scale) {
    struct test_rng rng = {seed};
    float *w = lora->weights.data;
    for (int64_t i = 0; i < lora->n_weights; i++) w[i] = (float)test_rng_uniform(&rng, -scale, scale);
}

/* Forward to logits [T, V] (and logprobs [T] when lp is not NULL). */
static inline void lora_forward(struct model *m, struct model_acts *acts, const struct lora_packed *p,
                                float *logits, float *lp) {
    int64_t shape[2] = {p->T, m->config.vocab_size};
    struct tensor tl = tensor_f32(logits, 2, shape), tlp = tensor_f32(lp, 1, &p->T);
    struct model_batch b = lora_batch_of(p);
    struct smelt_error err;
    cr_assert_eq(model_forward(m, acts, &b, lp ? &tlp : NULL, logits ? &tl : NULL, NULL, &err), 0, "%s",
                 err.message);
}

/* L = sum_t weights[t] * logprob[t], in double. */
static inline double lora_loss(struct model *m, struct model_acts *acts, const struct lora_packed *p) {
    float lp[64];
    lora_forward(m, acts, p, NULL, lp);
    double s = 0;
    for (int64_t t = 0; t < p->T; t++) s += (double)p->weights[t] * lp[t];
    return s;
}

static inline void lora_backward(struct model *m, struct model_acts *acts, struct lora_packed *p) {
    struct tensor dlp = tensor_f32(p->weights, 1, &p->T);
    struct smelt_error err;
    cr_assert_eq(model_backward(m, acts, &dlp, NULL, &err), 0, "%s", err.message);
}

#endif
