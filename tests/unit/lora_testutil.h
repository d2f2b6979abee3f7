/* Helpers shared by the LoRA tests: the parity fixtures' packed inputs, random adapter
 * weights, and forward passes to logits / a weighted logprob loss. */
#ifndef SMELT_TESTS_LORA_TESTUTIL_H
#define SMELT_TESTS_LORA_TESTUTIL_H

#include "tests/unit/parity_testutil.h"

#include <string.h>

#include "lora/lora.h"
#include "model/model.h"

/* A random model of tests/data/parity/<type>'s config, with weights large enough that
 * every path carries gradient. */
static inline struct model *lora_test_model(const char *type, uint64_t seed) {
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct smelt_error err;
    struct model_config cfg;
    TEST_OK(model_config_load(dir, &cfg, &err), &err);
    struct model *m;
    TEST_OK(model_init_random(&cfg, seed, BACKEND_CPU, &m, &err), &err);
    /* Larger weights than the 0.02 init so every path carries gradient. */
    float *w = m->weights.data;
    struct test_rng rng = {seed + 100};
    for (int64_t i = 0; i < m->n_weights; i++) w[i] += (float)test_rng_uniform(&rng, -0.2, 0.2);
    return m;
}

static inline struct lora_config lora_test_config(const char *const *targets, int n, float dropout) {
    struct lora_config c = {.rank = 4, .alpha = 8.0f, .dropout = dropout, .n_targets = n};
    for (int i = 0; i < n; i++) snprintf(c.targets[i], sizeof c.targets[i], "%s", targets[i]);
    return c;
}

/* Every adapter weight ~ U(-scale, scale): B non-zero so the adapter matters. */
static inline void lora_fill_random(struct lora *lora, uint64_t seed, double scale) {
    struct test_rng rng = {seed};
    float *w = lora->weights.data;
    for (int64_t i = 0; i < lora->n_weights; i++) w[i] = (float)test_rng_uniform(&rng, -scale, scale);
}

/* An attached adapter on targets with random A and B ~ U(-scale, scale). */
static inline struct lora *lora_test_adapter(struct model *m, const char *const *targets, int n, float dropout,
                                             uint64_t seed, double scale) {
    struct smelt_error err;
    struct lora_config c = lora_test_config(targets, n, dropout);
    struct lora *l;
    TEST_OK(lora_create(m, &c, seed, &l, &err), &err);
    lora_fill_random(l, seed + 1, scale);
    TEST_OK(lora_attach(l, &err), &err);
    return l;
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

/* The adapter's gradient of lora_loss against central finite differences, at three
 * random elements of every parameter; the base stays without gradients. */
static inline void lora_expect_fd(struct model *m, struct lora *l, struct model_acts *acts, struct parity_packed *p,
                                  const char *label) {
    struct smelt_error err;
    lora_loss(m, acts, p);
    TEST_OK(tensor_zero(&l->grads, &err), &err);
    lora_backward(m, acts, p);
    cr_expect(m->grads.data == NULL, "%s: the backward allocated base gradients", label);
    float *w = l->weights.data;
    const float *g = l->grads.data;
    struct test_rng rng = {5};
    double grad_mass = 0;
    for (int i = 0; i < l->n_params; i++) {
        const struct lora_param *par = &l->params[i];
        for (int k = 0; k < 3; k++) {
            int64_t j = par->offset + (int64_t)(test_rng_next(&rng) % (uint64_t)par->numel);
            float saved = w[j];
            const float h = 1e-2f;
            w[j] = saved + h;
            double lp = lora_loss(m, acts, p);
            w[j] = saved - h;
            double lm = lora_loss(m, acts, p);
            w[j] = saved;
            double fd = (lp - lm) / (2.0 * (double)h);
            grad_mass += fabs(fd);
            cr_expect(fabs(fd - g[j]) <= 2e-2 * fabs(fd) + 2e-3, "%s: %s[%lld]: backward %.6g, finite difference %.6g",
                      label, par->name, (long long)(j - par->offset), (double)g[j], fd);
        }
    }
    cr_expect(grad_mass > 1e-2 * l->n_params, "%s: the adapter barely affects the loss (%g)", label, grad_mass);
}

#endif
