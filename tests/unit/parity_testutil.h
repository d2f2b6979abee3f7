/* Helpers shared by the tests that compare with the Hugging Face fixtures of
 * tests/data/parity (tests/parity/make_fixtures.py, make_lora_fixtures.py,
 * make_reward_fixtures.py): loading a fixture model, the packed inputs of a fixture, an
 * elementwise comparison with an expected tensor, and the whole-model finite-difference
 * check of a backward. */
#ifndef SMELT_TESTS_PARITY_TESTUTIL_H
#define SMELT_TESTS_PARITY_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"

#define PARITY_DIR "tests/data/parity"

/* The fixture model PARITY_DIR/<type><suffix> (suffix "" or "-rm"), on the CPU. */
static inline struct model *parity_model_load(const char *type, const char *suffix) {
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s%s", type, suffix);
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    return m;
}

struct parity_packed {
    int64_t T;
    int n_seqs;
    int32_t ids[64], targets[64], cu[8];
    float weights[64]; /* dL/dlogprob per token */
    int64_t len[8];
};

static inline void parity_load_inputs(const char *type, struct parity_packed *p) {
    char path[256];
    snprintf(path, sizeof path, PARITY_DIR "/%s/inputs.json", type);
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

static inline struct model_batch parity_batch_of(const struct parity_packed *p) {
    return (struct model_batch){.n_tokens = p->T, .n_seqs = p->n_seqs, .ids = p->ids,
                                .cu_seqlens = p->cu, .targets = p->targets};
}

/* Compares a float buffer with an f32 tensor of the expected file, elementwise. */
static inline void parity_expect_matches(const struct safetensors *st, const char *name, const float *got,
                           int64_t n, double rtol, double atol_frac) {
    const struct safetensors_entry *e = safetensors_find(st, name);
    cr_assert(e, "expected tensor %s missing", name);
    cr_assert_eq(e->numel, n, "%s: %lld elements expected, smelt has %lld", name, (long long)e->numel, (long long)n);
    float *want = malloc((size_t)n * sizeof *want);
    struct smelt_error err;
    cr_assert_eq(safetensors_read_f32(st, name, want, e->ndim, e->shape, &err), 0, "%s", err.message);
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    double *want64 = test_to_f64(want, n);
    test_expect_close(name, got, want64, n, rtol, atol_frac * scale + 1e-7);
    free(want);
    free(want64);
}

/* The model's logits [T, V] and logprobs [T] (host) against the expected file's
 * logits.<s> and logprobs.<s>, sequence by sequence. */
static inline void parity_expect_outputs(const struct safetensors *st, const struct parity_packed *p,
                                         const float *logits, const float *logprobs, int64_t V) {
    char name[64];
    for (int s = 0; s < p->n_seqs; s++) {
        snprintf(name, sizeof name, "logits.%d", s);
        parity_expect_matches(st, name, logits + (int64_t)p->cu[s] * V, p->len[s] * V, 1e-4, 1e-5);
        snprintf(name, sizeof name, "logprobs.%d", s);
        parity_expect_matches(st, name, logprobs + p->cu[s], p->len[s] - 1, 1e-4, 1e-5);
    }
}

/* Central finite differences (step 1e-2 in f32, so a loose tolerance) of loss(ctx) at
 * per_param random coordinates of every parameter of m, against the gradient the test's
 * backward left in m->grads: the whole-model check, whatever the loss reads (logprobs,
 * scores). */
static inline void parity_expect_fd_grads(struct model *m, double (*loss)(void *ctx), void *ctx,
                                          struct test_rng *rng, int per_param, const char *what) {
    float *w = m->weights.data;
    const float *g = m->grads.data;
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *par = &m->params[i];
        for (int k = 0; k < per_param; k++) {
            int64_t j = par->offset + (int64_t)(test_rng_next(rng) % (uint64_t)par->numel);
            float saved = w[j];
            w[j] = saved + 1e-2f;
            double lp = loss(ctx);
            w[j] = saved - 1e-2f;
            double lm = loss(ctx);
            w[j] = saved;
            double fd = (lp - lm) / 2e-2;
            cr_expect(fabs(fd - g[j]) <= 2e-2 * fabs(fd) + 2e-3, "%s: %s[%lld]: backward %.6g, finite difference %.6g",
                      what, par->name, (long long)(j - par->offset), (double)g[j], fd);
        }
    }
}

/* Gradients in checkpoint layout against the expected file's grad.<name>. */
static inline void parity_expect_grads(const struct safetensors *st, const struct model_hf_tensor *g, int n) {
    char name[128];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "grad.%s", g[i].name);
        parity_expect_matches(st, name, g[i].data, g[i].shape[0] * g[i].shape[1], 1e-3, 1e-4);
    }
}

#endif
