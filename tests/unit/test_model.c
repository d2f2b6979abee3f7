/* The transformer against Hugging Face transformers: tiny random models of each
 * supported type built by tests/parity/make_fixtures.py, with the logits, token
 * logprobs and parameter gradients transformers computed for two sequences. smelt packs
 * both sequences into one row. Also: recompute equals no recompute, save/load round
 * trip, finite differences through the whole model, and bad batches. */
#include "tests/unit/parity_testutil.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"

static void check_parity(const char *type) {
    char dir[256];
    struct smelt_error err;
    struct model *m = parity_model_load(type, "");
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t V = m->config.vocab_size, T = p.T;
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, 64, false, &acts, &err), &err);
    float *logits = test_zeros_f32(T * V), *lp = test_zeros_f32(T);
    int64_t sl[2] = {T, V};
    struct tensor tl = tensor_f32(logits, 2, sl), tlp = tensor_f32(lp, 1, &T);
    struct model_batch b = parity_batch_of(&p);
    TEST_OK(model_forward(m, acts, &b, &tlp, &tl, NULL, &err), &err);

    struct safetensors *st;
    snprintf(dir, sizeof dir, PARITY_DIR "/%s/expected.safetensors", type);
    TEST_OK(safetensors_open(dir, &st, &err), &err);
    parity_expect_outputs(st, &p, logits, lp, V);

    TEST_OK(model_grads_alloc(m, &err), &err);
    struct tensor dlp = tensor_f32(p.weights, 1, &T);
    TEST_OK(model_backward(m, acts, &dlp, NULL, &err), &err);
    struct model_hf_tensor *g;
    int n;
    TEST_OK(model_hf_tensors(m, m->grads.data, &g, &n, &err), &err);
    parity_expect_grads(st, g, n);
    model_hf_tensors_free(g, n);
    safetensors_close(st);
    free(logits), free(lp);
    model_acts_free(acts);
    model_free(m);
}

Test(model, parity_llama) { check_parity("llama"); }
Test(model, parity_mistral) { check_parity("mistral"); }
Test(model, parity_qwen2) { check_parity("qwen2"); }
Test(model, parity_qwen3) { check_parity("qwen3"); }
Test(model, parity_gpt2) { check_parity("gpt2"); }
Test(model, parity_llama_mlp_bias) { check_parity("llama-mlp-bias"); } /* attention_bias and mlp_bias */
/* Scaled rope (model/rope.c), on positions past original_max_position_embeddings. */
Test(model, parity_llama_rope_llama3) { check_parity("llama-rope-llama3"); }
Test(model, parity_qwen2_rope_yarn) { check_parity("qwen2-rope-yarn"); }
Test(model, parity_mistral_rope_linear) { check_parity("mistral-rope-linear"); }

/* Forward+backward with and without activation recompute: identical bits. */
static void check_recompute(const char *type) {
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct smelt_error err;
    struct parity_packed p;
    parity_load_inputs(type, &p);
    float *grads[2], lps[2][64];
    for (int r = 0; r < 2; r++) {
        struct model *m;
        struct model_acts *acts;
        TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
        TEST_OK(model_grads_alloc(m, &err), &err);
        TEST_OK(model_acts_alloc(m, p.T, r == 1, &acts, &err), &err);
        struct tensor tlp = tensor_f32(lps[r], 1, &p.T), dlp = tensor_f32(p.weights, 1, &p.T);
        struct model_batch b = parity_batch_of(&p);
        TEST_OK(model_forward(m, acts, &b, &tlp, NULL, NULL, &err), &err);
        TEST_OK(model_backward(m, acts, &dlp, NULL, &err), &err);
        grads[r] = malloc((size_t)m->n_weights * sizeof(float));
        memcpy(grads[r], m->grads.data, (size_t)m->n_weights * sizeof(float));
        if (r == 1) {
            cr_expect(memcmp(lps[0], lps[1], (size_t)p.T * sizeof(float)) == 0, "%s: logprobs differ with recompute", type);
            cr_expect(memcmp(grads[0], grads[1], (size_t)m->n_weights * sizeof(float)) == 0, "%s: grads differ with recompute", type);
        }
        model_acts_free(acts);
        model_free(m);
    }
    free(grads[0]), free(grads[1]);
}

Test(model, recompute_llama) { check_recompute("llama"); }
Test(model, recompute_qwen3) { check_recompute("qwen3"); }
Test(model, recompute_gpt2) { check_recompute("gpt2"); }

/* Saving (f32) and loading again gives the same weights, bit for bit. */
static void check_save_load(const char *type) {
    char dir[256], out[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    snprintf(out, sizeof out, "/tmp/smelt-test-save-%s-%d", type, (int)getpid());
    struct smelt_error err;
    struct parity_packed p;
    parity_load_inputs(type, &p);
    struct model *a, *b2;
    TEST_OK(model_load(dir, BACKEND_CPU, &a, &err), &err);
    TEST_OK(model_save(a, out, false, &err), &err);
    TEST_OK(model_load(out, BACKEND_CPU, &b2, &err), &err);
    cr_expect_eq(a->n_weights, b2->n_weights);
    cr_expect(memcmp(a->weights.data, b2->weights.data, (size_t)a->n_weights * sizeof(float)) == 0,
              "%s: weights changed through save/load", type);
    cr_expect(model_rope_scaling_equal(&a->config.rope_scaling, &b2->config.rope_scaling),
              "%s: the rope scaling changed through save/load", type);
    model_free(b2);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/model.safetensors", out);
    unlink(cmd);
    snprintf(cmd, sizeof cmd, "%s/config.json", out);
    unlink(cmd);
    rmdir(out);
    model_free(a);
}

Test(model, save_load_llama) { check_save_load("llama"); }
Test(model, save_load_qwen2) { check_save_load("qwen2"); }
Test(model, save_load_qwen3) { check_save_load("qwen3"); }
Test(model, save_load_gpt2) { check_save_load("gpt2"); }
Test(model, save_load_llama_mlp_bias) { check_save_load("llama-mlp-bias"); }
Test(model, save_load_qwen2_rope_yarn) { check_save_load("qwen2-rope-yarn"); }

/* Finite differences through the whole model (f32, so a loose tolerance) on random
 * coordinates of every parameter, from a random init. */
struct fd_case {
    struct model *m;
    struct model_acts *acts;
    const struct parity_packed *p;
};

static double fd_loss(void *ctx) {
    const struct fd_case *c = ctx;
    const struct parity_packed *p = c->p;
    float lp[64];
    struct tensor tlp = tensor_f32(lp, 1, &p->T);
    struct model_batch b = parity_batch_of(p);
    struct smelt_error err;
    cr_assert_eq(model_forward(c->m, c->acts, &b, &tlp, NULL, NULL, &err), 0, "%s", err.message);
    double s = 0;
    for (int64_t t = 0; t < p->T; t++) s += (double)p->weights[t] * lp[t];
    return s;
}

static void check_fd(const char *type) {
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct smelt_error err;
    struct model_config cfg;
    TEST_OK(model_config_load(dir, &cfg, &err), &err);
    struct model *m;
    TEST_OK(model_init_random(&cfg, 7, BACKEND_CPU, &m, &err), &err);
    /* Larger weights than the 0.02 init so every path carries gradient. */
    float *w = m->weights.data;
    struct test_rng rng = {11};
    for (int64_t i = 0; i < m->n_weights; i++) w[i] += (float)test_rng_uniform(&rng, -0.2, 0.2);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    struct model_acts *acts;
    TEST_OK(model_grads_alloc(m, &err), &err);
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    struct fd_case c = {m, acts, &p};
    fd_loss(&c);
    struct tensor dlp = tensor_f32(p.weights, 1, &p.T);
    TEST_OK(model_backward(m, acts, &dlp, NULL, &err), &err);
    parity_expect_fd_grads(m, fd_loss, &c, &rng, 3, type);
    model_acts_free(acts);
    model_free(m);
}

Test(model, fd_llama) { check_fd("llama"); }
Test(model, fd_qwen2) { check_fd("qwen2"); }
Test(model, fd_qwen3) { check_fd("qwen3"); }
Test(model, fd_gpt2) { check_fd("gpt2"); }

Test(model, bad_batches) {
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &m, &err), &err);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, 8, false, &acts, &err), &err);
    int32_t ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, cu[2] = {0, 10}, cu_bad[2] = {0, 3};
    float lp[10];
    int64_t T = 10;
    struct tensor tlp = tensor_f32(lp, 1, &T);
    struct model_batch b = {.n_tokens = 10, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
    TEST_EXPECT_ERROR(model_forward(m, acts, &b, NULL, NULL, NULL, &err), SMELT_EINVAL, &err); /* > max_tokens */
    b.n_tokens = 3;
    b.cu_seqlens = cu_bad;
    TEST_EXPECT_ERROR(model_forward(m, acts, &b, &tlp, NULL, NULL, &err), SMELT_EINVAL, &err); /* no targets */
    ids[1] = 96; /* vocab is 96 */
    TEST_EXPECT_ERROR(model_forward(m, acts, &b, NULL, NULL, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "96") != NULL, "%s", err.message);
    TEST_EXPECT_ERROR(model_backward(m, acts, NULL, NULL, &err), SMELT_EINVAL, &err); /* no forward */
    model_acts_free(acts);
    model_free(m);
}

Test(model, load_errors) {
    struct smelt_error err;
    struct model *m;
    TEST_EXPECT_ERROR(model_load("tests/data/does-not-exist", BACKEND_CPU, &m, &err), SMELT_ENOTFOUND, &err);
    /* A config of one type with the weights of another. */
    char out[256];
    snprintf(out, sizeof out, "/tmp/smelt-test-mixed-%d", (int)getpid());
    struct model_config cfg;
    TEST_OK(model_config_load(PARITY_DIR "/qwen2", &cfg, &err), &err);
    struct model *q;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &q, &err), &err);
    TEST_OK(model_save(q, out, false, &err), &err);
    TEST_OK(model_config_save(&cfg, out, &err), &err);
    int rc = model_load(out, BACKEND_CPU, &m, &err);
    cr_expect(rc != 0, "a qwen2 config over llama weights must not load");
    cr_expect(strstr(err.message, "model.safetensors") != NULL, "error names the file: %s", err.message);
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", out);
    unlink(path);
    rmdir(out);
    model_free(q);
}

/* The value/reward-head path: a loss on the final hidden states only. */
static double hidden_loss(struct model *m, struct model_acts *acts, const struct parity_packed *p,
                          const float *wh, float *hidden) {
    int64_t C = m->config.hidden_size, shape[2] = {p->T, C};
    struct tensor th = tensor_f32(hidden, 2, shape);
    struct model_batch b = parity_batch_of(p);
    struct smelt_error err;
    cr_assert_eq(model_forward(m, acts, &b, NULL, NULL, &th, &err), 0, "%s", err.message);
    double s = 0;
    for (int64_t i = 0; i < p->T * C; i++) s += (double)wh[i] * hidden[i];
    return s;
}

Test(model, fd_hidden_gradient) {
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(PARITY_DIR "/qwen3", BACKEND_CPU, &m, &err), &err);
    struct parity_packed p;
    parity_load_inputs("qwen3", &p);
    int64_t C = m->config.hidden_size, n = p.T * C, shape[2] = {p.T, C};
    struct test_rng rng = {5};
    float *wh = test_rand_f32(&rng, n, -1, 1), *hidden = test_zeros_f32(n);
    struct model_acts *acts;
    TEST_OK(model_grads_alloc(m, &err), &err);
    TEST_OK(model_acts_alloc(m, p.T, true, &acts, &err), &err);
    hidden_loss(m, acts, &p, wh, hidden);
    struct tensor dh = tensor_f32(wh, 2, shape);
    TEST_OK(model_backward(m, acts, NULL, &dh, &err), &err);
    float *w = m->weights.data;
    const float *g = m->grads.data;
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *par = &m->params[i];
        int64_t j = par->offset + (int64_t)(test_rng_next(&rng) % (uint64_t)par->numel);
        float saved = w[j];
        const float h = 1e-2f;
        w[j] = saved + h;
        double lp = hidden_loss(m, acts, &p, wh, hidden);
        w[j] = saved - h;
        double lm = hidden_loss(m, acts, &p, wh, hidden);
        w[j] = saved;
        double fd = (lp - lm) / (2.0 * (double)h);
        cr_expect(fabs(fd - g[j]) <= 2e-2 * fabs(fd) + 2e-3, "%s[%lld]: backward %.6g, finite difference %.6g",
                  par->name, (long long)(j - par->offset), (double)g[j], fd);
    }
    free(wh), free(hidden);
    model_acts_free(acts);
    model_free(m);
}
