/* sft_gpu: SFT training speed on one device — a Qwen2-shaped model with random weights,
 * full fine-tune or LoRA, steps over one fixed packed batch; median step time,
 * tokens/s and MFU as one JSON line (bench/gpu/README.md).
 *
 *   sft_gpu --model 0.5b|1.5b|tiny --mode full|lora|lora,full [--backend cpu|cuda] [--tokens N]
 *           [--seq-len L] [--steps K] [--warmup W] [--peak-tflops P] [--seed S] [--json]
 *
 * One row per mode. Both modes share one model (building a 1.5B model's random weights
 * takes half a minute of host time): LoRA runs first, since it leaves the base weights
 * as they were and allocates no base gradients; then its adapter, optimizer and
 * activations are freed and the full fine-tune gets the model.
 *
 * A step is what trainer/sft.c's train_step does for one micro-batch, through the same
 * public calls: zero the trained gradients, model_forward to the targets' logprobs,
 * copy them to the host for the loss, copy dL/dlogprob = -1 per trained token to the
 * device, model_backward, optimizer_step (AdamW, global-norm clipping at 1.0, the
 * gradient scaled by 1 / trained tokens). train_step itself is static and needs a whole
 * struct trainer_run (job spec, tokenizer, dataset loader), so it is not called.
 *
 * The batch: N / L sequences of L random ids (fixed seed), every token trained on the
 * next one in its sequence (the last of each has no target): L - 1 targets a sequence,
 * what a causal LM loss over rows of L tokens trains. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu.h"
#include "common/common.h"
#include "lora/lora.h"
#include "model/model.h"
#include "trainer/trainer.h" /* optimizer_init, optimizer_step */

#define LORA_RANK 16
#define LORA_ALPHA 32.0f
#define LR 1e-5
#define MAX_GRAD_NORM 1.0

struct options {
    const char *model;
    bool lora, full;      /* the modes asked for */
    enum backend backend;
    int64_t tokens, seq_len, steps, warmup, seed;
    double peak_tflops;   /* 0: no MFU */
    bool json;
};

static void usage(FILE *f) {
    fprintf(f, "usage: sft_gpu --model 0.5b|1.5b|tiny --mode full|lora|lora,full [--backend cpu|cuda] [--tokens N]\n"
               "               [--seq-len L] [--steps K] [--warmup W] [--peak-tflops P] [--seed S] [--json]\n"
               "  --model M         Qwen2.5-0.5B or -1.5B shapes, or a tiny Qwen2 for CPU checks (default 0.5b)\n"
               "  --mode M          full fine-tune, LoRA r=16 alpha=32 on every linear, or both on one\n"
               "                    model, LoRA first (default full)\n"
               "  --backend B       cpu or cuda (default cuda)\n"
               "  --tokens N        tokens per step, a multiple of --seq-len (default 8192; 4096 for 1.5b; 256 tiny)\n"
               "  --seq-len L       tokens per packed sequence (default 1024; 64 tiny)\n"
               "  --steps K         timed steps (default 5)\n"
               "  --warmup W        untimed steps first (default 2)\n"
               "  --peak-tflops P   the device's peak for MFU (default 0: MFU not reported)\n"
               "  --seed S          weights and batch (default 1)\n"
               "  --json            one JSON line instead of key=value text\n");
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    static const char *const value_flags[] = {"--model", "--mode", "--backend", "--tokens", "--seq-len", "--steps",
                                              "--warmup", "--seed", "--peak-tflops", NULL};
    *o = (struct options){.model = "0.5b", .full = true, .backend = BACKEND_CUDA, .steps = 5, .warmup = 2, .seed = 1};
    int64_t tokens = 0, seq_len = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = bench_next_arg(argc, argv, &i, value_flags, usage, &o->json, &v, err);
        if (rc) return rc;
        if (!v) continue; /* --json */
        if (strcmp(a, "--model") == 0) rc = bench_model_flag(v, &o->model, err);
        else if (strcmp(a, "--mode") == 0) {
            o->full = strcmp(v, "full") == 0 || strcmp(v, "lora,full") == 0 || strcmp(v, "full,lora") == 0;
            o->lora = strcmp(v, "lora") == 0 || strcmp(v, "lora,full") == 0 || strcmp(v, "full,lora") == 0;
            if (!o->full && !o->lora) rc = error_set(err, SMELT_EINVAL, "--mode: '%s' is not full, lora or lora,full", v);
        } else if (strcmp(a, "--backend") == 0) rc = bench_backend_flag(v, &o->backend, err);
        else if (strcmp(a, "--tokens") == 0) rc = args_int(a, v, 2, INT64_C(1) << 24, &tokens, err);
        else if (strcmp(a, "--seq-len") == 0) rc = args_int(a, v, 2, INT64_C(1) << 20, &seq_len, err);
        else if (strcmp(a, "--steps") == 0) rc = args_int(a, v, 1, 10000, &o->steps, err);
        else if (strcmp(a, "--warmup") == 0) rc = args_int(a, v, 0, 10000, &o->warmup, err);
        else if (strcmp(a, "--seed") == 0) rc = args_int(a, v, 0, INT64_MAX, &o->seed, err);
        else if (strcmp(a, "--peak-tflops") == 0) rc = args_double(a, v, 0, 1e6, &o->peak_tflops, err);
        else rc = error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    bool tiny = strcmp(o->model, "tiny") == 0;
    o->seq_len = seq_len ? seq_len : tiny ? 64 : 1024;
    o->tokens = tokens ? tokens : tiny ? 256 : strcmp(o->model, "1.5b") == 0 ? 4096 : 8192;
    if (o->tokens % o->seq_len)
        return error_set(err, SMELT_EINVAL, "--tokens: %lld is not a multiple of --seq-len %lld", (long long)o->tokens,
                         (long long)o->seq_len);
    const struct bench_model_shape *s = bench_model_find(o->model);
    if (o->seq_len > s->max_pos)
        return error_set(err, SMELT_EINVAL, "--seq-len: %lld exceeds the model's context %lld", (long long)o->seq_len,
                         (long long)s->max_pos);
    return SMELT_OK;
}

/* ---- the run ---- */

/* The model and the batch, shared by the modes. */
struct run {
    struct model *model;
    float *host_logprobs, *host_dlogprobs;
    int32_t *ids, *targets, *cu_seqlens;
    struct model_batch batch;
    int64_t n_targets;
};

/* What one mode trains and keeps: freed before the next mode. */
struct trainee {
    bool lora;
    struct lora *adapter;               /* LoRA only */
    struct tensor *params, *grads;      /* the adapter's, or the model's */
    struct optimizer opt;               /* zeroed until optimizer_init: optimizer_free is safe */
    struct model_acts *acts;
    struct tensor logprobs, dlogprobs;  /* f32 [N] on the backend */
};

static void trainee_free(struct trainee *t) {
    tensor_free(&t->logprobs);
    tensor_free(&t->dlogprobs);
    model_acts_free(t->acts);
    optimizer_free(&t->opt);
    lora_free(t->adapter);
    memset(t, 0, sizeof *t);
}

static void run_free(struct run *r) {
    free(r->host_logprobs);
    free(r->host_dlogprobs);
    free(r->ids);
    free(r->targets);
    free(r->cu_seqlens);
    model_free(r->model);
}

/* The SFT forward needs ops_attention and its backward at the model's head size; a
 * backend without them (CUDA before its attention kernels) is found out here, in a
 * fraction of a second, rather than after building a model of a billion parameters. */
static int probe_attention(enum backend b, int64_t head_dim, struct smelt_error *err) {
    int64_t shape[3] = {2, 1, head_dim}, cu_shape = 2, lse_shape[2] = {2, 1};
    int32_t cu[2] = {0, 2};
    struct tensor q = {0}, o = {0}, lse = {0}, dq = {0};
    struct tensor cus = tensor_i32(cu, 1, &cu_shape);
    int rc = tensor_alloc(&q, b, DTYPE_F32, 3, shape, err);
    if (!rc) rc = tensor_alloc(&o, b, DTYPE_F32, 3, shape, err);
    if (!rc) rc = tensor_alloc(&dq, b, DTYPE_F32, 3, shape, err);
    if (!rc) rc = tensor_alloc(&lse, b, DTYPE_F32, 2, lse_shape, err);
    if (!rc) rc = ops_attention(&o, &lse, &q, &q, &q, &cus, 1.0f, err);
    if (!rc) rc = ops_attention_backward(&dq, NULL, NULL, &o, &q, &q, &q, &o, &lse, &cus, 1.0f, err);
    tensor_free(&q);
    tensor_free(&o);
    tensor_free(&lse);
    tensor_free(&dq);
    return error_wrap(err, rc, "the %s backend cannot train (probe of ops_attention)", backend_name(b));
}

static int make_batch(struct run *r, const struct options *o, int64_t vocab, struct smelt_error *err) {
    int64_t N = o->tokens, L = o->seq_len, S = N / L;
    r->ids = malloc((size_t)N * sizeof *r->ids);
    r->targets = malloc((size_t)N * sizeof *r->targets);
    r->cu_seqlens = malloc((size_t)(S + 1) * sizeof *r->cu_seqlens);
    r->host_logprobs = malloc((size_t)N * sizeof *r->host_logprobs);
    r->host_dlogprobs = malloc((size_t)N * sizeof *r->host_dlogprobs);
    if (!r->ids || !r->targets || !r->cu_seqlens || !r->host_logprobs || !r->host_dlogprobs)
        return error_set(err, SMELT_ENOMEM, "batch: out of memory");
    struct rng rng;
    rng_seed(&rng, (uint64_t)o->seed ^ 0xba7c4u);
    for (int64_t t = 0; t < N; t++) r->ids[t] = (int32_t)(rng_next(&rng) % (uint64_t)vocab);
    r->n_targets = 0;
    for (int64_t s = 0; s <= S; s++) r->cu_seqlens[s] = (int32_t)(s * L);
    for (int64_t t = 0; t < N; t++) {
        bool last = (t + 1) % L == 0;
        r->targets[t] = last ? -1 : r->ids[t + 1];
        r->host_dlogprobs[t] = last ? 0.0f : -1.0f; /* trainer/sft.c's set_dlogprobs */
        r->n_targets += !last;
    }
    r->batch = (struct model_batch){.n_tokens = N, .n_seqs = (int)S, .ids = r->ids, .cu_seqlens = r->cu_seqlens,
                                    .targets = r->targets};
    return SMELT_OK;
}

static int setup_model(struct run *r, const struct options *o, const struct model_config *config,
                       struct smelt_error *err) {
    int rc = model_init_random(config, (uint64_t)o->seed, o->backend, &r->model, err);
    if (!rc) rc = make_batch(r, o, config->vocab_size, err);
    return error_wrap(err, rc, "model %s", o->model);
}

static int setup_trainee(struct run *r, const struct options *o, struct trainee *t, struct smelt_error *err) {
    int rc;
    if (t->lora) {
        struct lora_config lc = {.rank = LORA_RANK, .alpha = LORA_ALPHA, .n_targets = 7};
        const char *targets[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < 7; i++) snprintf(lc.targets[i], sizeof lc.targets[i], "%s", targets[i]);
        rc = lora_create(r->model, &lc, (uint64_t)o->seed ^ 0x10aa1234u, &t->adapter, err);
        if (!rc) rc = lora_attach(t->adapter, err);
        if (rc) return error_wrap(err, rc, "LoRA");
        lora_set_training(t->adapter, true);
        t->params = &t->adapter->weights;
        t->grads = &t->adapter->grads;
    } else {
        rc = model_grads_alloc(r->model, err);
        if (rc) return error_wrap(err, rc, "gradients");
        t->params = &r->model->weights;
        t->grads = &r->model->grads;
    }
    rc = optimizer_init(&t->opt, t->params, err);
    if (rc) return error_wrap(err, rc, "optimizer");
    rc = model_acts_alloc(r->model, o->tokens, false, &t->acts, err);
    int64_t n = o->tokens;
    if (!rc) rc = tensor_alloc(&t->logprobs, o->backend, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_alloc(&t->dlogprobs, o->backend, DTYPE_F32, 1, &n, err);
    return rc;
}

/* One optimizer step over the batch; *loss = mean negative logprob of the targets. */
static int train_step(struct run *r, struct trainee *tr, int64_t step, double *loss, double *grad_norm,
                      struct smelt_error *err) {
    int64_t N = r->batch.n_tokens;
    int rc = tensor_zero(tr->grads, err);
    if (tr->adapter) lora_set_dropout_seed(tr->adapter, (uint64_t)step);
    if (!rc) rc = model_forward(r->model, tr->acts, &r->batch, &tr->logprobs, NULL, NULL, err);
    struct tensor host_lp = tensor_f32(r->host_logprobs, 1, &N), host_dlp = tensor_f32(r->host_dlogprobs, 1, &N);
    if (!rc) rc = tensor_copy(&host_lp, &tr->logprobs, err);
    double nll = 0;
    for (int64_t t = 0; !rc && t < N; t++)
        if (r->targets[t] >= 0) nll -= r->host_logprobs[t];
    if (!rc) rc = tensor_copy(&tr->dlogprobs, &host_dlp, err);
    if (!rc) rc = model_backward(r->model, tr->acts, &tr->dlogprobs, NULL, err);
    if (!rc)
        rc = optimizer_step(&tr->opt, tr->params, tr->grads, 1.0 / (double)r->n_targets, MAX_GRAD_NORM, LR, 0.9,
                            0.999, 1e-8, 0.0, grad_norm, err);
    *loss = nll / (double)r->n_targets;
    if (!rc && !isfinite(*loss)) rc = error_set(err, SMELT_EBACKEND, "step %lld: the loss is %g", (long long)step, *loss);
    return error_wrap(err, rc, "step %lld", (long long)step);
}

struct timing {
    double *step_s;     /* [steps] */
    double loss_first, loss_last, grad_norm_last;
};

static int run_steps(struct run *r, struct trainee *tr, const struct options *o, struct timing *t,
                     struct smelt_error *err) {
    for (int64_t k = 0; k < o->warmup + o->steps; k++) {
        double t0 = 0, t1 = 0, loss = 0, norm = 0;
        int rc = bench_sync_clock(o->backend, &t0, err);
        if (!rc) rc = train_step(r, tr, k + 1, &loss, &norm, err);
        if (!rc) rc = bench_sync_clock(o->backend, &t1, err);
        if (rc) return rc;
        if (k == 0) t->loss_first = loss;
        t->loss_last = loss;
        t->grad_norm_last = norm;
        if (k >= o->warmup) t->step_s[k - o->warmup] = t1 - t0;
    }
    return SMELT_OK;
}

static void add_config(json_t *row, const struct options *o, bool lora) {
    json_object_set_new(row, "model", json_string(o->model));
    json_object_set_new(row, "mode", json_string(lora ? "lora" : "full"));
    json_object_set_new(row, "backend", json_string(backend_name(o->backend)));
    /* What the model computes in: f32 weights, activations and GEMMs on every backend
     * today (no TF32). MFU is against --peak-tflops whatever that peak's dtype. */
    json_object_set_new(row, "dtype", json_string("f32"));
    json_object_set_new(row, "tokens", json_integer(o->tokens));
    json_object_set_new(row, "seq_len", json_integer(o->seq_len));
    json_object_set_new(row, "steps", json_integer(o->steps));
    json_object_set_new(row, "warmup", json_integer(o->warmup));
    if (lora) {
        json_object_set_new(row, "lora_rank", json_integer(LORA_RANK));
        json_object_set_new(row, "lora_alpha", json_real(LORA_ALPHA));
    }
}

static void add_results(json_t *row, const struct options *o, const struct run *r, const struct trainee *tr,
                        struct timing *t) {
    double step_s = bench_median(t->step_s, (int)o->steps);
    double adapter = tr->adapter ? (double)tr->adapter->n_weights : 0;
    double flops = bench_sft_flops(&r->model->config, tr->lora, adapter, o->tokens, o->seq_len);
    double achieved = flops / step_s / 1e12;
    json_object_set_new(row, "params", json_integer(r->model->n_weights));
    json_object_set_new(row, "matmul_params", json_real(bench_matmul_params(&r->model->config)));
    json_object_set_new(row, "trainable_params", json_integer(tensor_numel(tr->params)));
    json_object_set_new(row, "step_ms", json_real(1e3 * step_s));
    json_object_set_new(row, "step_ms_min", json_real(1e3 * t->step_s[0]));
    json_object_set_new(row, "step_ms_max", json_real(1e3 * t->step_s[o->steps - 1]));
    json_object_set_new(row, "tokens_per_s", json_real((double)o->tokens / step_s));
    json_object_set_new(row, "flops_per_step", json_real(flops));
    json_object_set_new(row, "tflops", json_real(achieved));
    json_object_set_new(row, "peak_tflops", o->peak_tflops > 0 ? json_real(o->peak_tflops) : json_null());
    json_object_set_new(row, "mfu", o->peak_tflops > 0 ? json_real(achieved / o->peak_tflops) : json_null());
    json_object_set_new(row, "loss_first", bench_real(t->loss_first));
    json_object_set_new(row, "loss_last", bench_real(t->loss_last));
    json_object_set_new(row, "grad_norm_last", bench_real(t->grad_norm_last));
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "sft_gpu: %s\n", err.message);
        usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    struct run r = {0};
    struct timing t = {.step_s = calloc((size_t)o.steps, sizeof(double))};
    int rc = t.step_s ? SMELT_OK : error_set(&err, SMELT_ENOMEM, "out of memory");
    struct model_config config;
    if (!rc) rc = bench_backend_ready(o.backend, &err);
    if (!rc) rc = bench_model_config(o.model, &config, &err);
    if (!rc) rc = probe_attention(o.backend, config.head_dim, &err);
    if (!rc) rc = setup_model(&r, &o, &config, &err);
    /* A failure so far is every mode's row; after it, each mode's own. */
    int worst = rc;
    bool modes[2] = {o.lora, o.full};
    for (int i = 0; i < 2; i++) {
        if (!modes[i]) continue;
        json_t *row = bench_row_new("sft");
        if (row) add_config(row, &o, i == 0);
        struct trainee tr = {.lora = i == 0};
        int mrc = rc;
        if (!mrc) mrc = setup_trainee(&r, &o, &tr, &err);
        if (!mrc) mrc = run_steps(&r, &tr, &o, &t, &err);
        if (!mrc && row) add_results(row, &o, &r, &tr, &t);
        bench_row_emit(row, mrc, &err, o.json);
        if (mrc) fprintf(stderr, "sft_gpu: %s\n", err.message);
        if (mrc && !worst) worst = mrc;
        if (!rc) error_clear(&err);
        trainee_free(&tr);
    }
    free(t.step_s);
    run_free(&r);
    return bench_exit_code(worst);
}
