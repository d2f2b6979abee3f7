/* The model layer on the CUDA backend: the Hugging Face parity fixtures with the model
 * on the device, forward and backward of every model type against the CPU backend with
 * the same weights (full and LoRA), SFT runs through trainer_run on both backends, and
 * greedy generation (the rollout engine, the reference generator) on both backends.
 *
 * The device backend is GPU_TEST_BACKEND (BACKEND_CUDA unless the build says
 * otherwise). Building this file with -DGPU_TEST_BACKEND=BACKEND_CPU runs every case
 * CPU against CPU, which checks the harness itself on machines without a GPU
 * (tests/gpu/README.md says how). Without the device every test reports itself
 * skipped.
 *
 * Tolerances (|got - want| <= rtol |want| + atol, atol a fraction of the largest
 * |want| of the tensor compared), with their reasons:
 *  - HF fixtures: the CPU test's own (tests/unit/test_model.c): logits and logprobs
 *    1e-4 / 1e-5, gradients 1e-3 / 1e-4. The device computes in f32 like the CPU and
 *    differs from transformers only in the order of f32 sums, as the CPU does.
 *  - Device against CPU, one forward/backward: 1e-4 relative, 1e-4 of the tensor's
 *    scale: the same f32 arithmetic summed in another order (cuBLAS, block
 *    reductions); a sum of K terms carries ~K * 6e-8 relative rounding, K <= a few
 *    hundred here, and gradients pass through a few layers of such sums.
 *  - SFT over SFT_STEPS steps: SFT_LOSS_TOL and SFT_WEIGHT_TOL below, measured on
 *    the CPU by perturbing a run, since rounding differences grow through AdamW.
 *  - Rollout: token ids identical; logprobs within 1e-4 (the CPU engine's own
 *    tolerance against the reference generator, a different order of sums too). */
#include "tests/unit/lora_testutil.h"
#include "tests/unit/trainer_testutil.h"
#include "tests/unit/rollout_testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lora/lora.h"
#include "model/model.h"
#include "rollout/rollout.h"
#include "trainer/trainer.h"

#ifndef GPU_TEST_BACKEND
#define GPU_TEST_BACKEND BACKEND_CUDA
#endif

#define SKIP_WITHOUT_DEVICE()                                                  \
    do {                                                                       \
        if (!backend_available(GPU_TEST_BACKEND)) cr_skip_test("no CUDA device"); \
    } while (0)

static const char *const model_types[] = {"llama", "mistral", "qwen2", "qwen3", "gpt2"};
#define N_MODEL_TYPES (sizeof model_types / sizeof *model_types)

/* ---- tensors between the host and the device ---------------------------------------- */

/* A zeroed f32 tensor on the device backend. */
static struct tensor device_zeros(int ndim, const int64_t *shape) {
    struct smelt_error err = {0};
    struct tensor t;
    TEST_OK(tensor_alloc(&t, GPU_TEST_BACKEND, DTYPE_F32, ndim, shape, &err), &err);
    return t;
}

/* An f32 tensor on the device backend holding host values. */
static struct tensor device_f32(const float *host, int ndim, const int64_t *shape) {
    struct smelt_error err = {0};
    struct tensor t = device_zeros(ndim, shape);
    struct tensor h = tensor_f32((float *)host, ndim, shape);
    TEST_OK(tensor_copy(&t, &h, &err), &err);
    return t;
}

/* A host copy of an f32 tensor on any backend (malloc'd; the caller frees). */
static float *host_copy(const struct tensor *t) {
    struct smelt_error err = {0};
    int64_t n = tensor_numel(t);
    float *h = test_zeros_f32(n);
    struct tensor dst = tensor_f32(h, 1, &n), src = tensor_make(t->backend, DTYPE_F32, t->data, 1, &n);
    TEST_OK(tensor_copy(&dst, &src, &err), &err);
    return h;
}

/* |got - want| <= rtol |want| + atol_frac * max |want| (+ 1e-7 for all-zero tensors),
 * naming the worst element. */
static void expect_close(const char *what, const float *got, const float *want, int64_t n, double rtol,
                         double atol_frac) {
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    double *want64 = test_to_f64(want, n);
    test_expect_close(what, got, want64, n, rtol, atol_frac * scale + 1e-7);
    free(want64);
}

/* Every parameter of two flat buffers laid out like model->weights, compared one by
 * one so that a failure names the parameter and its scale is its own. */
static void expect_params_close(const char *label, const struct model *m, const float *got, const float *want,
                                double rtol, double atol_frac) {
    char what[256];
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *p = &m->params[i];
        snprintf(what, sizeof what, "%s: %s", label, p->name);
        expect_close(what, got + p->offset, want + p->offset, p->numel, rtol, atol_frac);
    }
}

/* ---- 1. the Hugging Face parity fixtures with the model on the device -------------- */

static void check_parity_on_device(const char *type) {
    struct smelt_error err = {0};
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct model *m;
    TEST_OK(model_load(dir, GPU_TEST_BACKEND, &m, &err), &err);
    cr_assert_eq(m->backend, GPU_TEST_BACKEND);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t V = m->config.vocab_size, T = p.T, sl[2] = {T, V};
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, T, false, &acts, &err), &err);
    struct tensor dl = device_zeros(2, sl), dlp = device_zeros(1, &T);
    struct model_batch b = parity_batch_of(&p);
    TEST_OK(model_forward(m, acts, &b, &dlp, &dl, NULL, &err), &err);
    float *logits = host_copy(&dl), *lp = host_copy(&dlp);

    struct safetensors *st;
    snprintf(dir, sizeof dir, PARITY_DIR "/%s/expected.safetensors", type);
    TEST_OK(safetensors_open(dir, &st, &err), &err);
    parity_expect_outputs(st, &p, logits, lp, V);

    TEST_OK(model_grads_alloc(m, &err), &err);
    struct tensor dw = device_f32(p.weights, 1, &T);
    TEST_OK(model_backward(m, acts, &dw, NULL, &err), &err);
    float *grads = host_copy(&m->grads);
    struct model_hf_tensor *g;
    int n;
    TEST_OK(model_hf_tensors(m, grads, &g, &n, &err), &err);
    parity_expect_grads(st, g, n);
    model_hf_tensors_free(g, n);
    safetensors_close(st);
    free(logits), free(lp), free(grads);
    tensor_free(&dl), tensor_free(&dlp), tensor_free(&dw);
    model_acts_free(acts);
    model_free(m);
}

Test(gpu_model, parity_llama) { SKIP_WITHOUT_DEVICE(); check_parity_on_device("llama"); }
Test(gpu_model, parity_mistral) { SKIP_WITHOUT_DEVICE(); check_parity_on_device("mistral"); }
Test(gpu_model, parity_qwen2) { SKIP_WITHOUT_DEVICE(); check_parity_on_device("qwen2"); }
Test(gpu_model, parity_qwen3) { SKIP_WITHOUT_DEVICE(); check_parity_on_device("qwen3"); }
Test(gpu_model, parity_gpt2) { SKIP_WITHOUT_DEVICE(); check_parity_on_device("gpt2"); }

/* PEFT's adapters on the device: logits, logprobs and adapter gradients as PEFT
 * computed them (tolerances of tests/unit/test_lora_peft.c). */
static void check_peft_on_device(const char *type) {
    struct smelt_error err = {0};
    char base[256], adapter[256], path[512], name[256];
    snprintf(base, sizeof base, PARITY_DIR "/%s", type);
    snprintf(adapter, sizeof adapter, PARITY_DIR "/%s-lora", type);
    struct model *m;
    struct lora *l;
    TEST_OK(model_load(base, GPU_TEST_BACKEND, &m, &err), &err);
    TEST_OK(lora_load(m, adapter, &l, &err), &err);
    cr_assert_eq(l->weights.backend, GPU_TEST_BACKEND);
    TEST_OK(lora_attach(l, &err), &err);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t V = m->config.vocab_size, T = p.T, sl[2] = {T, V};
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, T, false, &acts, &err), &err);
    struct tensor dl = device_zeros(2, sl), dlp = device_zeros(1, &T), dw = device_f32(p.weights, 1, &T);
    struct model_batch b = parity_batch_of(&p);
    TEST_OK(model_forward(m, acts, &b, &dlp, &dl, NULL, &err), &err);
    TEST_OK(model_backward(m, acts, &dw, NULL, &err), &err);
    float *logits = host_copy(&dl), *lp = host_copy(&dlp), *g = host_copy(&l->grads);

    struct safetensors *st;
    snprintf(path, sizeof path, "%s/expected.safetensors", adapter);
    TEST_OK(safetensors_open(path, &st, &err), &err);
    parity_expect_outputs(st, &p, logits, lp, V);
    for (int i = 0; i < l->n_params; i++) {
        snprintf(name, sizeof name, "grad.%s", l->params[i].name);
        parity_expect_matches(st, name, g + l->params[i].offset, l->params[i].numel, 1e-3, 1e-4);
    }
    safetensors_close(st);
    free(logits), free(lp), free(g);
    tensor_free(&dl), tensor_free(&dlp), tensor_free(&dw);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(gpu_model, peft_parity_llama) { SKIP_WITHOUT_DEVICE(); check_peft_on_device("llama"); }
Test(gpu_model, peft_parity_gpt2) { SKIP_WITHOUT_DEVICE(); check_peft_on_device("gpt2"); }
Test(gpu_model, peft_parity_qwen3) { SKIP_WITHOUT_DEVICE(); check_peft_on_device("qwen3"); }

/* ---- 2. device against CPU: forward and backward of random models ------------------ */

#define FB_TOL 1e-4

/* Three packed sequences of random tokens, random targets (some "none"), random
 * dL/dlogprob and dL/dhidden. */
struct fb_batch {
    int64_t T;
    int n_seqs;
    int32_t ids[64], targets[64], cu[4];
    float dlogprobs[64];
    float *dhidden; /* [T, C] */
};

static void fb_batch_make(struct fb_batch *b, int64_t V, int64_t C, uint64_t seed) {
    static const int lens[3] = {7, 19, 12};
    struct test_rng rng = {seed};
    memset(b, 0, sizeof *b);
    b->n_seqs = 3;
    for (int s = 0; s < 3; s++) {
        b->cu[s] = (int32_t)b->T;
        for (int t = 0; t < lens[s]; t++) {
            int64_t i = b->T + t;
            b->ids[i] = (int32_t)(test_rng_next(&rng) % (uint64_t)V);
            bool none = t + 1 == lens[s] || test_rng_next(&rng) % 5 == 0;
            b->targets[i] = none ? -1 : (int32_t)(test_rng_next(&rng) % (uint64_t)V);
            b->dlogprobs[i] = none ? 0.0f : (float)test_rng_uniform(&rng, -1, 1);
        }
        b->T += lens[s];
    }
    b->cu[3] = (int32_t)b->T;
    b->dhidden = test_rand_f32(&rng, b->T * C, -0.1, 0.1);
}

/* What one forward + backward produced, on the host. */
struct fb_out {
    float *logits, *logprobs, *hidden, *grads; /* grads: the model's, or the adapter's */
};

static void fb_out_free(struct fb_out *o) { free(o->logits), free(o->logprobs), free(o->hidden), free(o->grads); }

/* Forward and backward of b on m (with l attached when not NULL; then the base is
 * frozen and the adapter's gradients are returned). */
static struct fb_out forward_backward(struct model *m, struct lora *l, const struct fb_batch *fb, bool recompute) {
    struct smelt_error err = {0};
    int64_t T = fb->T, V = m->config.vocab_size, C = m->config.hidden_size;
    int64_t sl[2] = {T, V}, sh[2] = {T, C};
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, T, recompute, &acts, &err), &err);
    struct tensor logits, lp, hidden, dlp, dh;
    TEST_OK(tensor_alloc(&logits, m->backend, DTYPE_F32, 2, sl, &err), &err);
    TEST_OK(tensor_alloc(&lp, m->backend, DTYPE_F32, 1, &T, &err), &err);
    TEST_OK(tensor_alloc(&hidden, m->backend, DTYPE_F32, 2, sh, &err), &err);
    TEST_OK(tensor_alloc(&dlp, m->backend, DTYPE_F32, 1, &T, &err), &err);
    TEST_OK(tensor_alloc(&dh, m->backend, DTYPE_F32, 2, sh, &err), &err);
    struct tensor h_dlp = tensor_f32((float *)fb->dlogprobs, 1, &T), h_dh = tensor_f32(fb->dhidden, 2, sh);
    TEST_OK(tensor_copy(&dlp, &h_dlp, &err), &err);
    TEST_OK(tensor_copy(&dh, &h_dh, &err), &err);
    struct model_batch b = {.n_tokens = T, .n_seqs = fb->n_seqs, .ids = fb->ids, .cu_seqlens = fb->cu,
                            .targets = fb->targets};
    if (l) {
        TEST_OK(lora_attach(l, &err), &err);
        TEST_OK(tensor_zero(&l->grads, &err), &err);
    } else {
        TEST_OK(model_grads_alloc(m, &err), &err);
        TEST_OK(tensor_zero(&m->grads, &err), &err);
    }
    TEST_OK(model_forward(m, acts, &b, &lp, &logits, &hidden, &err), &err);
    TEST_OK(model_backward(m, acts, &dlp, &dh, &err), &err);
    struct fb_out o = {.logits = host_copy(&logits), .logprobs = host_copy(&lp), .hidden = host_copy(&hidden),
                       .grads = host_copy(l ? &l->grads : &m->grads)};
    if (l) lora_detach(l);
    tensor_free(&logits), tensor_free(&lp), tensor_free(&hidden), tensor_free(&dlp), tensor_free(&dh);
    model_acts_free(acts);
    return o;
}

static void expect_fb_close(const char *label, const struct fb_batch *fb, const struct model *m,
                            const struct lora *l, const struct fb_out *got, const struct fb_out *want) {
    char what[512];
    int64_t T = fb->T;
    snprintf(what, sizeof what, "%s: logits", label);
    expect_close(what, got->logits, want->logits, T * m->config.vocab_size, FB_TOL, FB_TOL);
    snprintf(what, sizeof what, "%s: logprobs", label);
    expect_close(what, got->logprobs, want->logprobs, T, FB_TOL, FB_TOL);
    snprintf(what, sizeof what, "%s: hidden", label);
    expect_close(what, got->hidden, want->hidden, T * m->config.hidden_size, FB_TOL, FB_TOL);
    if (!l) {
        expect_params_close(label, m, got->grads, want->grads, FB_TOL, FB_TOL);
        return;
    }
    for (int i = 0; i < l->n_params; i++) {
        const struct lora_param *p = &l->params[i];
        snprintf(what, sizeof what, "%s: grad %s", label, p->name);
        expect_close(what, got->grads + p->offset, want->grads + p->offset, p->numel, FB_TOL, FB_TOL);
    }
}

/* One forward + backward on the CPU against the device's, without and with activation
 * recompute on the device. */
static void compare_forward_backward(const char *label, struct model *cpu, struct lora *lc, struct model *dev,
                                     struct lora *ld, const struct fb_batch *fb) {
    struct fb_out want = forward_backward(cpu, lc, fb, false);
    char what[128];
    for (int recompute = 0; recompute < 2; recompute++) {
        struct fb_out got = forward_backward(dev, ld, fb, recompute);
        snprintf(what, sizeof what, "%s%s", label, recompute ? " (recompute)" : "");
        expect_fb_close(what, fb, cpu, lc, &got, &want);
        fb_out_free(&got);
    }
    fb_out_free(&want);
}

/* The fixture's architecture with random weights: init_random plus uniform noise on
 * every parameter, so norm gains and biases are not 1 and 0 and their paths matter. */
static struct model *random_model(const char *type, enum backend backend) {
    struct smelt_error err = {0};
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct model_config c;
    TEST_OK(model_config_load(dir, &c, &err), &err);
    struct model *m;
    TEST_OK(model_init_random(&c, 11, backend, &m, &err), &err);
    float *w = host_copy(&m->weights);
    struct test_rng rng = {23};
    for (int64_t i = 0; i < m->n_weights; i++) w[i] += (float)test_rng_uniform(&rng, -0.05, 0.05);
    struct tensor hw = tensor_f32(w, 1, &m->n_weights);
    TEST_OK(tensor_copy(&m->weights, &hw, &err), &err);
    free(w);
    return m;
}

Test(gpu_model, forward_backward_matches_cpu_for_every_model_type) {
    SKIP_WITHOUT_DEVICE();
    for (size_t k = 0; k < N_MODEL_TYPES; k++) {
        const char *type = model_types[k];
        struct model *cpu = random_model(type, BACKEND_CPU), *dev = random_model(type, GPU_TEST_BACKEND);
        cr_assert_eq(dev->backend, GPU_TEST_BACKEND);
        struct fb_batch fb;
        fb_batch_make(&fb, cpu->config.vocab_size, cpu->config.hidden_size, 100 + k);
        compare_forward_backward(type, cpu, NULL, dev, NULL, &fb);
        /* Outputs the device's ops would use must be on its backend; a host tensor is
         * refused naming it (on the CPU harness both are host memory: nothing to see). */
        if (GPU_TEST_BACKEND != BACKEND_CPU) {
            struct smelt_error err = {0};
            struct model_acts *acts;
            TEST_OK(model_acts_alloc(dev, fb.T, false, &acts, &err), &err);
            float host_lp[64];
            struct tensor tlp = tensor_f32(host_lp, 1, &fb.T);
            struct model_batch b = {.n_tokens = fb.T, .n_seqs = fb.n_seqs, .ids = fb.ids, .cu_seqlens = fb.cu,
                                    .targets = fb.targets};
            TEST_EXPECT_ERROR(model_forward(dev, acts, &b, &tlp, NULL, NULL, &err), SMELT_EINVAL, &err);
            cr_expect(strstr(err.message, "logprobs"), "%s", err.message);
            model_acts_free(acts);
        }
        free(fb.dhidden);
        model_free(cpu);
        model_free(dev);
    }
}

/* A LoRA adapter with random A and B (copied from the CPU's to the device's) and
 * dropout on, so the device path that stages masks through the host runs too. */
static struct lora *random_adapter(struct model *m, const struct lora *like, const char *const *targets,
                                   int n_targets) {
    struct smelt_error err = {0};
    struct lora_config c = {.rank = 4, .alpha = 8, .dropout = 0.1f, .n_targets = n_targets};
    for (int i = 0; i < n_targets; i++) snprintf(c.targets[i], sizeof c.targets[i], "%s", targets[i]);
    struct lora *l;
    TEST_OK(lora_create(m, &c, 5, &l, &err), &err);
    if (like) {
        cr_assert_eq(like->n_weights, l->n_weights);
        TEST_OK(tensor_copy(&l->weights, &like->weights, &err), &err);
    } else {
        lora_fill_random(l, 31, 0.2);
    }
    lora_set_training(l, true);
    lora_set_dropout_seed(l, 77);
    return l;
}

static void check_lora_against_cpu(const char *type, const char *const *targets, int n_targets) {
    struct model *cpu = random_model(type, BACKEND_CPU), *dev = random_model(type, GPU_TEST_BACKEND);
    struct lora *lc = random_adapter(cpu, NULL, targets, n_targets);
    struct lora *ld = random_adapter(dev, lc, targets, n_targets);
    struct fb_batch fb;
    fb_batch_make(&fb, cpu->config.vocab_size, cpu->config.hidden_size, 200);
    char label[96];
    snprintf(label, sizeof label, "%s lora", type);
    compare_forward_backward(label, cpu, lc, dev, ld, &fb);
    /* Merged into the base on the device, the weights are the CPU's merge. */
    struct smelt_error err = {0};
    TEST_OK(lora_merge(lc, &err), &err);
    TEST_OK(lora_merge(ld, &err), &err);
    float *wc = host_copy(&cpu->weights), *wd = host_copy(&dev->weights);
    snprintf(label, sizeof label, "%s merged", type);
    expect_params_close(label, cpu, wd, wc, FB_TOL, FB_TOL);
    free(wc), free(wd);
    free(fb.dhidden);
    lora_free(lc), lora_free(ld);
    model_free(cpu), model_free(dev);
}

Test(gpu_model, lora_forward_backward_matches_cpu) {
    SKIP_WITHOUT_DEVICE();
    static const char *const all[] = {"all-linear"}, *const gpt2[] = {"c_attn", "c_proj", "c_fc"};
    check_lora_against_cpu("llama", all, 1);
    check_lora_against_cpu("qwen3", all, 1);
    check_lora_against_cpu("gpt2", gpt2, 3);
}

/* ---- 3. SFT through trainer_run on both backends ----------------------------------- */

#define SFT_STEPS 20
/* The losses and the final weights carry the rounding differences of each step
 * through AdamW, whose update divides by sqrt(v): on elements whose gradient is near
 * zero a rounding difference can flip the sign of a whole lr-sized step. So the final weights are compared by the relative
 * norm of the difference per tensor (||got - want|| / ||want||), which a few such
 * elements do not dominate, and the losses relatively. The bounds come from running
 * these jobs on the CPU twice, the second time with every initial weight (full) or
 * base weight (LoRA) multiplied by 1 + 1e-6 u, u ~ U(-1, 1) (a change well above f32
 * rounding): losses moved by <= 1.1e-7 relative, weights by <= 4e-6 (full) and 1.1e-5
 * (adapter) in relative norm; with 1e-5: 1.1e-6 and 1.2e-4 / 1.0e-4. */
#define SFT_LOSS_TOL 1e-4
#define SFT_WEIGHT_TOL 2e-3

/* ||got - want|| <= tol ||want|| (in double), naming the tensor. */
static void expect_norm_close(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    cr_expect(sqrt(diff) <= tol * sqrt(norm) + 1e-12, "%s: ||got - want|| / ||want|| is %.3g (tolerance %g, %lld elements)",
              what, norm > 0 ? sqrt(diff / norm) : sqrt(diff), tol, (long long)n);
}

static void write_lines(const char *dst, const char *src, int n) {
    FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
    cr_assert(in && out, "cannot copy %s to %s", src, dst);
    char line[1024];
    int copied = 0;
    while (copied < n && fgets(line, sizeof line, in)) {
        fputs(line, out);
        copied++;
    }
    cr_assert_eq(copied, n, "%s has fewer than %d lines", src, n);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
}

/* The train losses of metrics.jsonl, by step (1-based; [0] unused); returns the last step. */
struct sft_paths {
    char train[600], val[600], spec[600];
};

static void sft_setup(struct sft_paths *p) {
    test_tmp_setup();
    test_tmp_path(p->train, sizeof p->train, "train.jsonl");
    test_tmp_path(p->val, sizeof p->val, "val.jsonl");
    test_tmp_path(p->spec, sizeof p->spec, "spec.json");
    write_lines(p->train, "examples/data/addition_train.jsonl", 160);
    write_lines(p->val, "examples/data/addition_val.jsonl", 16);
}

/* Runs a job (hp: the spec's extra fields) on a backend into out; returns the result
 * and the per-step losses. */
static struct trainer_result sft_run(const struct sft_paths *p, const char *model, const char *hp, const char *out,
                                     enum backend backend, const struct trainer_options *options, double *losses) {
    char text[4096];
    snprintf(text, sizeof text,
             "{\"type\":\"sft\",\"model\":\"%s\",%s\"data\":{\"train\":\"%s\",\"validation\":\"%s\",\"max_seq_len\":32},"
             "\"eval\":{\"accuracy_examples\":4,\"max_new_tokens\":4},\"output_dir\":\"%s\",\"seed\":3,"
             "\"log_every_steps\":1}",
             model, hp, p->train, p->val, out);
    FILE *f = fopen(p->spec, "w");
    cr_assert(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    struct smelt_error err = {0};
    struct job_spec spec;
    TEST_OK(job_spec_load(p->spec, &spec, &err), &err);
    spec.backend = backend; /* "cuda" in the file would be refused on a machine without one */
    struct trainer_result res;
    struct trainer_options quiet = {.quiet = true};
    TEST_OK(trainer_run(&spec, options ? options : &quiet, &res, &err), &err);
    if (losses && !res.stopped) cr_assert_eq(test_read_losses(out, losses, SFT_STEPS + 2), SFT_STEPS);
    return res;
}

static void expect_losses_close(const char *label, const double *got, const double *want) {
    for (int s = 1; s <= SFT_STEPS; s++) {
        cr_expect(fabs(got[s] - want[s]) <= SFT_LOSS_TOL * fabs(want[s]), "%s step %d: loss %.9g on the device, %.9g on the cpu",
                  label, s, got[s], want[s]);
    }
    cr_expect(want[SFT_STEPS] < want[1], "%s: the loss did not fall (%g -> %g)", label, want[1], want[SFT_STEPS]);
}

static void expect_models_close(const char *label, const char *dir_got, const char *dir_want, double tol) {
    struct smelt_error err = {0};
    struct model *got, *want;
    TEST_OK(model_load(dir_got, BACKEND_CPU, &got, &err), &err);
    TEST_OK(model_load(dir_want, BACKEND_CPU, &want, &err), &err);
    cr_assert_eq(got->n_weights, want->n_weights);
    const float *wg = got->weights.data, *ww = want->weights.data;
    char what[256];
    for (int i = 0; i < want->n_params; i++) {
        const struct model_param *p = &want->params[i];
        snprintf(what, sizeof what, "%s: %s", label, p->name);
        expect_norm_close(what, wg + p->offset, ww + p->offset, p->numel, tol);
    }
    model_free(got);
    model_free(want);
}

static const char *const sft_full_hp =
    "\"model_init\":\"random\",\"hyperparameters\":{\"max_steps\":20,\"batch_size\":8,\"learning_rate\":0.001,"
    "\"warmup_steps\":5,\"max_grad_norm\":1.0},";

Test(gpu_model, sft_full_tracks_cpu_and_resumes_exactly, .fini = test_tmp_teardown) {
    SKIP_WITHOUT_DEVICE();
    struct sft_paths p;
    sft_setup(&p);
    char out_cpu[600], out_dev[600], out_dev2[600], a[700], b[700];
    test_tmp_path(out_cpu, sizeof out_cpu, "cpu");
    test_tmp_path(out_dev, sizeof out_dev, "dev");
    test_tmp_path(out_dev2, sizeof out_dev2, "dev2");
    double want[SFT_STEPS + 2], got[SFT_STEPS + 2], resumed[SFT_STEPS + 2];
    struct trainer_result rc = sft_run(&p, "examples/tiny", sft_full_hp, out_cpu, BACKEND_CPU, NULL, want);
    struct trainer_result rd = sft_run(&p, "examples/tiny", sft_full_hp, out_dev, GPU_TEST_BACKEND, NULL, got);
    expect_losses_close("full", got, want);
    cr_expect(fabs(rd.val_loss - rc.val_loss) <= SFT_LOSS_TOL * fabs(rc.val_loss), "val_loss %.9g vs %.9g",
              rd.val_loss, rc.val_loss);
    /* Greedy accuracy ran through the reference generator on the device. */
    cr_expect_eq(rd.accuracy_examples, 4);
    cr_expect_eq(rc.accuracy_examples, 4);
    snprintf(a, sizeof a, "%s/output", out_dev);
    snprintf(b, sizeof b, "%s/output", out_cpu);
    expect_models_close("full fine-tune weights", a, b, SFT_WEIGHT_TOL);

    /* Stopped after step 8 and resumed (checkpoint written from and restored to the
     * device): the same losses to the bit as the uninterrupted device run. */
    struct trainer_options stop = {.quiet = true, .stop_after_step = 8}, resume = {.quiet = true, .resume = "latest"};
    struct trainer_result rs = sft_run(&p, "examples/tiny", sft_full_hp, out_dev2, GPU_TEST_BACKEND, &stop, NULL);
    cr_expect(rs.stopped && rs.steps == 8);
    sft_run(&p, "examples/tiny", sft_full_hp, out_dev2, GPU_TEST_BACKEND, &resume, resumed);
    for (int s = 1; s <= SFT_STEPS; s++)
        cr_expect_eq(resumed[s], got[s], "resumed step %d: %.17g vs %.17g uninterrupted", s, resumed[s], got[s]);
}

static const char *const sft_lora_hp =
    "\"hyperparameters\":{\"max_steps\":20,\"batch_size\":8,\"learning_rate\":0.002,\"warmup_steps\":5},"
    "\"lora\":{\"rank\":4,\"alpha\":8,\"dropout\":0.1,\"target_modules\":\"all-linear\"},\"save_merged\":true,";

/* The adapters of two LoRA outputs, tensor by tensor. */
static void expect_adapters_close(const char *dir_got, const char *dir_want, double tol) {
    struct smelt_error err = {0};
    char pg[1024], pw[1024];
    snprintf(pg, sizeof pg, "%s/adapter_model.safetensors", dir_got);
    snprintf(pw, sizeof pw, "%s/adapter_model.safetensors", dir_want);
    struct safetensors *g, *w;
    TEST_OK(safetensors_open(pg, &g, &err), &err);
    TEST_OK(safetensors_open(pw, &w, &err), &err);
    cr_assert_eq(g->n_entries, w->n_entries);
    for (size_t i = 0; i < w->n_entries; i++) {
        const struct safetensors_entry *e = &w->entries[i];
        float *vg = test_zeros_f32(e->numel), *vw = test_zeros_f32(e->numel);
        TEST_OK(safetensors_read_f32(g, e->name, vg, e->ndim, e->shape, &err), &err);
        TEST_OK(safetensors_read_f32(w, e->name, vw, e->ndim, e->shape, &err), &err);
        expect_norm_close(e->name, vg, vw, e->numel, tol);
        free(vg), free(vw);
    }
    safetensors_close(g);
    safetensors_close(w);
}

Test(gpu_model, sft_lora_tracks_cpu, .fini = test_tmp_teardown) {
    SKIP_WITHOUT_DEVICE();
    struct sft_paths p;
    sft_setup(&p);
    char base_out[600], base[700], out_cpu[600], out_dev[600], a[700], b[700];
    test_tmp_path(base_out, sizeof base_out, "base");
    snprintf(base, sizeof base, "%s/output", base_out);
    test_tmp_path(out_cpu, sizeof out_cpu, "cpu");
    test_tmp_path(out_dev, sizeof out_dev, "dev");
    /* A trained base (on the CPU) for both adapters. */
    sft_run(&p, "examples/tiny", sft_full_hp, base_out, BACKEND_CPU, NULL, NULL);
    double want[SFT_STEPS + 2], got[SFT_STEPS + 2];
    struct trainer_result rc = sft_run(&p, base, sft_lora_hp, out_cpu, BACKEND_CPU, NULL, want);
    struct trainer_result rd = sft_run(&p, base, sft_lora_hp, out_dev, GPU_TEST_BACKEND, NULL, got);
    cr_expect(rc.base_unchanged && rd.base_unchanged);
    expect_losses_close("lora", got, want);
    cr_expect(fabs(rd.val_loss - rc.val_loss) <= SFT_LOSS_TOL * fabs(rc.val_loss), "val_loss %.9g vs %.9g",
              rd.val_loss, rc.val_loss);
    snprintf(a, sizeof a, "%s/output", out_dev);
    snprintf(b, sizeof b, "%s/output", out_cpu);
    expect_adapters_close(a, b, SFT_WEIGHT_TOL);
    snprintf(a, sizeof a, "%s/output/merged", out_dev);
    snprintf(b, sizeof b, "%s/output/merged", out_cpu);
    expect_models_close("lora merged weights", a, b, SFT_WEIGHT_TOL);
}

/* ---- 4. rollout: greedy generation on both backends -------------------------------- */

#define N_PROMPTS 4
#define MAX_NEW 32

/* Greedy ids can only match if no step is a near tie. The prompts (rollout_test_prompt
 * of the lengths and seeds below) were chosen on the CPU so that along every greedy
 * path compared here the top two logits differ by at least 5e-3 (both weight versions,
 * and with the adapter), about a thousand times the device-vs-CPU logit differences. */
struct rollout_case {
    int32_t prompts[N_PROMPTS][64];
    int64_t lens[N_PROMPTS];
    int seeds[N_PROMPTS];
};

static void make_prompts(struct rollout_case *rc, int64_t V) {
    for (int i = 0; i < N_PROMPTS; i++) rollout_test_prompt(rc->prompts[i], rc->lens[i], rc->seeds[i], V);
}

/* Prompts of different lengths; request 1 asks for two samples (they share its
 * blocks, and the first decode step copies the shared block). */
static void add_requests(struct rollout_engine *e, const struct model *m, const struct rollout_case *rc,
                         uint64_t id0) {
    struct smelt_error err = {0};
    for (int i = 0; i < N_PROMPTS; i++) {
        int64_t room = m->config.max_seq_len - rc->lens[i];
        struct rollout_request r = {.id = id0 + (uint64_t)i, .prompt = rc->prompts[i], .n_prompt = rc->lens[i],
                                    .n = i == 1 ? 2 : 1, .sampling = {.temperature = 0, .top_p = 1},
                                    .max_new_tokens = room < MAX_NEW ? room : MAX_NEW};
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
}

/* An engine with a small pool (preemption), short prefill chunks and a batch budget
 * that packs several sequences per step. */
static struct rollout_engine *small_engine(struct model *m) { return rollout_test_engine(m, NULL, 10 * 16, 24, 4, 8); }

static void expect_same_generation(const char *label, const struct rollout_test_collected *got,
                                   const struct rollout_test_collected *want, uint64_t id0) {
    for (int i = 0; i < N_PROMPTS; i++)
        for (int s = 0; s < (i == 1 ? 2 : 1); s++) {
            uint64_t q = id0 + (uint64_t)i;
            cr_assert(got->have[q][s] && want->have[q][s], "%s: request %d sample %d did not finish", label, i, s);
            const struct rollout_result *g = &got->r[q][s], *w = &want->r[q][s];
            cr_expect_eq(g->n, w->n, "%s: request %d: %lld tokens on the device, %lld on the cpu", label, i,
                         (long long)g->n, (long long)w->n);
            cr_expect_str_eq(g->finish_reason, w->finish_reason);
            cr_expect_eq(g->policy_version, w->policy_version);
            for (int64_t t = 0; t < g->n && t < w->n; t++) {
                cr_expect_eq(g->ids[t], w->ids[t], "%s: request %d sample %d token %lld: %d on the device, %d on the cpu",
                             label, i, s, (long long)t, g->ids[t], w->ids[t]);
                if (g->ids[t] != w->ids[t]) break;
                cr_expect(fabsf(g->logprobs[t] - w->logprobs[t]) <= 1e-4f, "%s: request %d token %lld: logprob %.9g vs %.9g",
                          label, i, (long long)t, g->logprobs[t], w->logprobs[t]);
            }
        }
}

/* Runs the requests on both engines and compares; returns nothing, frees what it took. */
static void run_and_compare(const char *label, struct rollout_engine *ec, struct rollout_engine *ed,
                            const struct model *m, const struct rollout_case *rc, uint64_t id0) {
    add_requests(ec, m, rc, id0);
    add_requests(ed, m, rc, id0);
    struct rollout_test_collected *want = rollout_test_run_all(ec), *got = rollout_test_run_all(ed);
    expect_same_generation(label, got, want, id0);
    rollout_test_free_collected(want);
    rollout_test_free_collected(got);
}

static void check_rollout(const char *type) {
    struct smelt_error err = {0};
    char dir[256], label[128];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct model *mc = rollout_test_load(type), *md;
    TEST_OK(model_load(dir, GPU_TEST_BACKEND, &md, &err), &err);
    struct rollout_case rc = {.lens = {30, 13, 5, 26}, .seeds = {0, 1, 2, 3}};
    make_prompts(&rc, mc->config.vocab_size);
    struct rollout_engine *ec = small_engine(mc), *ed = small_engine(md);
    run_and_compare(type, ec, ed, mc, &rc, 0);
    struct rollout_stats sc = rollout_engine_stats(ec), sd = rollout_engine_stats(ed);
    cr_expect(sc.preemptions > 0, "%s: the small pool caused no preemption", type);
    cr_expect_eq(sd.free_blocks, sd.n_blocks, "%s: blocks leaked on the device", type);

    /* New weights (the old ones scaled by 1.25) pushed into both engines between steps. */
    float *w = host_copy(&mc->weights);
    for (int64_t i = 0; i < mc->n_weights; i++) w[i] *= 1.25f;
    TEST_OK(rollout_engine_set_weights(ec, w, mc->n_weights, &err), &err);
    TEST_OK(rollout_engine_set_weights(ed, w, md->n_weights, &err), &err);
    free(w);
    snprintf(label, sizeof label, "%s after new weights", type);
    run_and_compare(label, ec, ed, mc, &rc, 10);
    rollout_engine_free(ec);
    rollout_engine_free(ed);
    model_free(mc);
    model_free(md);
}

Test(gpu_model, rollout_greedy_matches_cpu_for_every_model_type) {
    SKIP_WITHOUT_DEVICE();
    for (size_t k = 0; k < N_MODEL_TYPES; k++) check_rollout(model_types[k]);
}

/* The plain-recompute reference generator (smelt-generate, the trainer's accuracy) on
 * the device. Apart from the engine's test because it runs the training forward
 * (ops_attention), the engine the paged one. */
Test(gpu_model, reference_generator_matches_cpu) {
    SKIP_WITHOUT_DEVICE();
    struct smelt_error err = {0};
    for (size_t k = 0; k < N_MODEL_TYPES; k++) {
        const char *type = model_types[k];
        char dir[256];
        snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
        struct model *mc = rollout_test_load(type), *md;
        TEST_OK(model_load(dir, GPU_TEST_BACKEND, &md, &err), &err);
        struct rollout_case rc = {.lens = {30, 13, 5, 26}, .seeds = {0, 1, 2, 3}};
        make_prompts(&rc, mc->config.vocab_size);
        struct generate_params gp = {.max_new_tokens = MAX_NEW, .temperature = 0, .top_p = 1};
        for (int i = 0; i < N_PROMPTS; i++) {
            struct generate_result got, want;
            TEST_OK(model_generate_reference(md, rc.prompts[i], rc.lens[i], &gp, &got, &err), &err);
            TEST_OK(model_generate_reference(mc, rc.prompts[i], rc.lens[i], &gp, &want, &err), &err);
            cr_expect_eq(got.n, want.n, "%s prompt %d: %lld tokens on the device, %lld on the cpu", type, i,
                         (long long)got.n, (long long)want.n);
            for (int64_t t = 0; t < got.n && t < want.n; t++) {
                cr_expect_eq(got.ids[t], want.ids[t], "%s prompt %d token %lld: %d on the device, %d on the cpu", type, i,
                             (long long)t, got.ids[t], want.ids[t]);
                if (got.ids[t] != want.ids[t]) break;
                cr_expect(fabsf(got.logprobs[t] - want.logprobs[t]) <= 1e-4f, "%s prompt %d token %lld: logprob %.9g vs %.9g",
                          type, i, (long long)t, got.logprobs[t], want.logprobs[t]);
            }
            generate_result_free(&got);
            generate_result_free(&want);
        }
        model_free(mc);
        model_free(md);
    }
}

/* smelt-rollout --adapter: a PEFT adapter applied unmerged on both backends. */
Test(gpu_model, rollout_with_adapter_matches_cpu) {
    SKIP_WITHOUT_DEVICE();
    struct smelt_error err = {0};
    struct model *mc = rollout_test_load("llama"), *md;
    TEST_OK(model_load(PARITY_DIR "/llama", GPU_TEST_BACKEND, &md, &err), &err);
    struct lora *lc, *ld;
    TEST_OK(lora_load(mc, PARITY_DIR "/llama-lora", &lc, &err), &err);
    TEST_OK(lora_load(md, PARITY_DIR "/llama-lora", &ld, &err), &err);
    TEST_OK(lora_attach(lc, &err), &err);
    TEST_OK(lora_attach(ld, &err), &err);
    struct rollout_case rc = {.lens = {2, 12, 17, 30}, .seeds = {7, 12, 5, 3}};
    make_prompts(&rc, mc->config.vocab_size);
    struct rollout_engine *ec = small_engine(mc), *ed = small_engine(md);
    run_and_compare("llama with adapter", ec, ed, mc, &rc, 0);
    rollout_engine_free(ec);
    rollout_engine_free(ed);
    lora_free(lc), lora_free(ld);
    model_free(mc), model_free(md);
}
