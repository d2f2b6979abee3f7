/* generate_gpu: generation speed of the rollout engine on one device, and how close a
 * decode step comes to the device's memory bandwidth (bench/gpu/README.md).
 *
 *   generate_gpu --model 0.5b|1.5b|tiny [--backend cpu|cuda] [--batch 1,32,256]
 *                [--prompt-len 128] [--new-tokens 256] [--copy-mb 1024] [--seed S] [--json]
 *
 * First the device copy rate: tensor_copy of a --copy-mb buffer of random bytes to
 * another on the backend, one warm-up then COPY_REPEATS copies, median; bytes read +
 * written / time. One "copy" row.
 *
 * Then for each batch B, on one model with random weights: a fresh engine (max_seqs B,
 * a whole batch's prompts in one prefill step, KV pool sized for every sequence at its
 * full length, so nothing is preempted), one untimed warm-up wave (B requests, 8 new
 * tokens), then one timed wave of B requests of --prompt-len random ids, greedy, no stop
 * ids (eos ignored), --new-tokens each (checked). Every engine step is timed with the
 * device idle on both sides. A step that prefills nothing is a decode step; its bytes
 * are the weights once plus the keys and values of the batch at the mean context,
 * prompt + new / 2. One "gen" row per batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu.h"
#include "bench/gpu/rollout_wave.h"
#include "common/common.h"
#include "model/model.h"
#include "rollout/rollout.h"

#define COPY_REPEATS 7
#define WARMUP_NEW_TOKENS 8

struct options {
    const char *model;
    enum backend backend;
    int32_t *batches;
    int64_t n_batches, prompt_len, new_tokens, copy_mb, seed;
    bool json;
};

static void usage(FILE *f) {
    fprintf(f, "usage: generate_gpu --model 0.5b|1.5b|tiny [--backend cpu|cuda] [--batch 1,32,256]\n"
               "                    [--prompt-len 128] [--new-tokens 256] [--copy-mb 1024] [--seed S] [--json]\n"
               "  --model M         Qwen2.5-0.5B or -1.5B shapes, or a tiny Qwen2 for CPU checks (default 0.5b)\n"
               "  --backend B       cpu or cuda (default cuda)\n"
               "  --batch LIST      requests submitted at once, one row each (default 1,32,256)\n"
               "  --prompt-len N    random prompt ids per request (default 128)\n"
               "  --new-tokens N    tokens every request generates (default 256)\n"
               "  --copy-mb MB      buffer of the copy-rate measurement (default 1024)\n"
               "  --seed S          weights and prompts (default 1)\n"
               "  --json            JSON lines instead of key=value text\n");
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    static const char *const value_flags[] = {"--model", "--backend", "--batch", "--prompt-len", "--new-tokens",
                                              "--copy-mb", "--seed", NULL};
    *o = (struct options){.model = "0.5b", .backend = BACKEND_CUDA, .prompt_len = 128, .new_tokens = 256,
                          .copy_mb = 1024, .seed = 1};
    const char *batches = "1,32,256";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = bench_next_arg(argc, argv, &i, value_flags, usage, &o->json, &v, err);
        if (rc) return rc;
        if (!v) continue; /* --json */
        if (strcmp(a, "--model") == 0) rc = bench_model_flag(v, &o->model, err);
        else if (strcmp(a, "--backend") == 0) rc = bench_backend_flag(v, &o->backend, err);
        else if (strcmp(a, "--batch") == 0) batches = v;
        else if (strcmp(a, "--prompt-len") == 0) rc = args_int(a, v, 1, 1 << 20, &o->prompt_len, err);
        else if (strcmp(a, "--new-tokens") == 0) rc = args_int(a, v, 2, 1 << 20, &o->new_tokens, err);
        else if (strcmp(a, "--copy-mb") == 0) rc = args_int(a, v, 1, 1 << 20, &o->copy_mb, err);
        else if (strcmp(a, "--seed") == 0) rc = args_int(a, v, 0, INT64_MAX, &o->seed, err);
        else rc = error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    int rc = args_int_list("--batch", batches, 1, 256, &o->batches, &o->n_batches, err);
    if (rc) return rc;
    const struct bench_model_shape *s = bench_model_find(o->model);
    if (o->prompt_len + o->new_tokens > s->max_pos)
        return error_set(err, SMELT_EINVAL, "--prompt-len + --new-tokens: %lld exceeds the model's context %lld",
                         (long long)(o->prompt_len + o->new_tokens), (long long)s->max_pos);
    return SMELT_OK;
}

/* ---- the device copy rate ---- */

/* Fills t (f32, on any backend) with random bits, a chunk at a time through the host. */
static int fill_random(struct tensor *t, uint64_t seed, struct smelt_error *err) {
    const int64_t chunk = INT64_C(1) << 22; /* floats: 16 MiB */
    float *host = malloc((size_t)chunk * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "copy buffer: out of memory");
    struct rng rng;
    rng_seed(&rng, seed);
    int64_t n = tensor_numel(t);
    int rc = SMELT_OK;
    for (int64_t i = 0; !rc && i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        for (int64_t j = 0; j < m; j++) host[j] = (float)rng_uniform(&rng) - 0.5f;
        struct tensor src = tensor_f32(host, 1, &m);
        struct tensor dst = tensor_make(t->backend, DTYPE_F32, (float *)t->data + i, 1, &m);
        rc = tensor_copy(&dst, &src, err);
    }
    free(host);
    return rc;
}

static int measure_copy(const struct options *o, double *gbps, json_t *row, struct smelt_error *err) {
    int64_t n = o->copy_mb * (INT64_C(1) << 20) / (int64_t)sizeof(float);
    struct tensor a = {0}, b = {0};
    double times[COPY_REPEATS];
    int rc = tensor_alloc(&a, o->backend, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_alloc(&b, o->backend, DTYPE_F32, 1, &n, err);
    if (!rc) rc = fill_random(&a, (uint64_t)o->seed ^ 0xc0b1u, err);
    if (!rc) rc = tensor_copy(&b, &a, err); /* warm-up */
    for (int k = 0; !rc && k < COPY_REPEATS; k++) {
        double t0 = 0, t1 = 0;
        rc = bench_sync_clock(o->backend, &t0, err);
        if (!rc) rc = tensor_copy(k % 2 ? &a : &b, k % 2 ? &b : &a, err);
        if (!rc) rc = bench_sync_clock(o->backend, &t1, err);
        times[k] = t1 - t0;
    }
    tensor_free(&a);
    tensor_free(&b);
    if (rc) return error_wrap(err, rc, "copy rate");
    double bytes = 2.0 * (double)n * sizeof(float), s = bench_median(times, COPY_REPEATS);
    *gbps = bytes / s / 1e9;
    json_object_set_new(row, "bytes", json_real(bytes));
    json_object_set_new(row, "repeats", json_integer(COPY_REPEATS));
    json_object_set_new(row, "ms", json_real(1e3 * s));
    json_object_set_new(row, "gbps", json_real(*gbps));
    return SMELT_OK;
}

/* ---- one batch ---- */

/* What the step hook collects during the timed wave. */
struct step_log {
    double *decode_s;       /* [cap] */
    int64_t n_decode, cap;
    int64_t decode_tokens;
    double prefill_s, decode_total_s;
    int64_t prefill_steps;
};

static void on_step(void *ctx, double seconds, const struct rollout_stats *before, const struct rollout_stats *after) {
    struct step_log *log = ctx;
    if (after->prefill_tokens > before->prefill_tokens) {
        log->prefill_steps++;
        log->prefill_s += seconds;
        return;
    }
    log->decode_total_s += seconds;
    log->decode_tokens += after->decode_tokens - before->decode_tokens;
    if (log->n_decode < log->cap) log->decode_s[log->n_decode++] = seconds;
}

static int run_batch(struct model *m, const struct options *o, int64_t batch, double copy_gbps, json_t *row,
                     struct smelt_error *err) {
    /* Every sequence at its full length, in whole blocks, plus one spare block each. */
    int64_t kv_tok = model_kv_bytes_per_token(m);
    int64_t blocks = batch * ((o->prompt_len + o->new_tokens + ROLLOUT_KV_BLOCK_TOKENS - 1) / ROLLOUT_KV_BLOCK_TOKENS + 1);
    struct rollout_config c = {.kv_memory_bytes = blocks * ROLLOUT_KV_BLOCK_TOKENS * kv_tok,
                               .max_batch_tokens = batch * o->prompt_len, .max_seqs = (int)batch,
                               .prefill_chunk = o->prompt_len};
    struct rollout_engine *e = NULL;
    struct bench_prompts p = {0};
    struct step_log log = {.cap = o->new_tokens + 8};
    log.decode_s = calloc((size_t)log.cap, sizeof *log.decode_s);
    int rc = log.decode_s ? SMELT_OK : error_set(err, SMELT_ENOMEM, "out of memory");
    if (!rc) rc = bench_prompts_random(batch, o->prompt_len, o->prompt_len, m->config.vocab_size,
                                       (uint64_t)o->seed + (uint64_t)batch, &p, err);
    if (!rc) rc = rollout_engine_create(m, NULL, &c, &e, err);
    struct wave_totals warm = {0}, timed = {0};
    if (!rc) rc = wave_run(e, &p, 0, batch, WARMUP_NEW_TOKENS, &warm, NULL, NULL, err);
    if (rc) error_wrap(err, rc, "warm-up");
    struct rollout_stats before = {0}, after = {0};
    double t0 = 0, t1 = 0;
    struct wave_step_hook hook = {.fn = on_step, .ctx = &log, .backend = o->backend};
    if (!rc) {
        before = rollout_engine_stats(e);
        rc = bench_sync_clock(o->backend, &t0, err);
    }
    if (!rc) rc = wave_run(e, &p, 0, batch, o->new_tokens, &timed, NULL, &hook, err);
    if (!rc) rc = bench_sync_clock(o->backend, &t1, err);
    if (!rc && log.n_decode == 0) rc = error_set(err, SMELT_EINVAL, "no decode step was seen");
    if (!rc) {
        after = rollout_engine_stats(e);
        double wall = t1 - t0, step_s = bench_median(log.decode_s, (int)log.n_decode);
        double weight_bytes = (double)m->n_weights * (double)dtype_size(m->weights.dtype);
        double mean_ctx = (double)o->prompt_len + (double)o->new_tokens / 2.0;
        double step_bytes = weight_bytes + (double)batch * mean_ctx * (double)kv_tok;
        double gbps = step_bytes / step_s / 1e9;
        json_object_set_new(row, "params", json_integer(m->n_weights));
        json_object_set_new(row, "generated_tokens", json_integer(timed.generated_tokens));
        json_object_set_new(row, "wall_s", json_real(wall));
        json_object_set_new(row, "tokens_per_s", json_real((double)timed.generated_tokens / wall));
        json_object_set_new(row, "steps", json_integer(after.steps - before.steps));
        json_object_set_new(row, "prefill_steps", json_integer(log.prefill_steps));
        json_object_set_new(row, "prefill_ms", json_real(1e3 * log.prefill_s));
        json_object_set_new(row, "decode_steps", json_integer(log.n_decode));
        json_object_set_new(row, "decode_step_ms", json_real(1e3 * step_s));
        json_object_set_new(row, "decode_tokens_per_s", json_real((double)log.decode_tokens / log.decode_total_s));
        json_object_set_new(row, "weight_bytes", json_real(weight_bytes));
        json_object_set_new(row, "kv_bytes_per_token", json_integer(kv_tok));
        json_object_set_new(row, "mean_context", json_real(mean_ctx));
        json_object_set_new(row, "decode_bytes_per_step", json_real(step_bytes));
        json_object_set_new(row, "decode_gbps", json_real(gbps));
        json_object_set_new(row, "copy_gbps", bench_real(copy_gbps));
        json_object_set_new(row, "bw_fraction", copy_gbps > 0 ? json_real(gbps / copy_gbps) : json_null());
        json_object_set_new(row, "peak_kv_bytes", json_integer(timed.peak_blocks_used * ROLLOUT_KV_BLOCK_TOKENS * kv_tok));
        json_object_set_new(row, "preemptions", json_integer(after.preemptions - before.preemptions));
    }
    rollout_engine_free(e);
    bench_prompts_free(&p);
    free(log.decode_s);
    return error_wrap(err, rc, "batch %lld", (long long)batch);
}

/* ---- main ---- */

static json_t *gen_row(const struct options *o, int64_t batch) {
    json_t *row = bench_row_new("gen");
    if (!row) return NULL;
    json_object_set_new(row, "model", json_string(o->model));
    json_object_set_new(row, "backend", json_string(backend_name(o->backend)));
    json_object_set_new(row, "dtype", json_string("f32")); /* weights, KV cache and compute */
    json_object_set_new(row, "batch", json_integer(batch));
    json_object_set_new(row, "prompt_len", json_integer(o->prompt_len));
    json_object_set_new(row, "new_tokens", json_integer(o->new_tokens));
    return row;
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "generate_gpu: %s\n", err.message);
        usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    /* The copy row, then the model once for every batch. A failure before the batches
     * (no device, no memory for the model) is reported in every batch's row. */
    json_t *copy = bench_row_new("copy");
    if (copy) {
        json_object_set_new(copy, "backend", json_string(backend_name(o.backend)));
        json_object_set_new(copy, "mb", json_integer(o.copy_mb));
    }
    double copy_gbps = 0;
    int rc = bench_backend_ready(o.backend, &err);
    if (!rc && copy) rc = measure_copy(&o, &copy_gbps, copy, &err);
    bench_row_emit(copy, rc, &err, o.json);
    struct model *m = NULL;
    if (!rc) {
        struct model_config config;
        rc = bench_model_config(o.model, &config, &err);
        if (!rc) rc = model_init_random(&config, (uint64_t)o.seed, o.backend, &m, &err);
        if (rc) error_wrap(&err, rc, "model %s", o.model);
    }
    int worst = rc;
    for (int64_t i = 0; i < o.n_batches; i++) {
        json_t *row = gen_row(&o, o.batches[i]);
        int brc = rc ? rc : row ? run_batch(m, &o, o.batches[i], copy_gbps, row, &err)
                                : error_set(&err, SMELT_ENOMEM, "out of memory");
        bench_row_emit(row, brc, &err, o.json);
        if (brc) fprintf(stderr, "generate_gpu: %s\n", err.message);
        if (brc && !worst) worst = brc;
        if (!rc) error_clear(&err); /* a batch's error is its own; a setup error is every row's */
    }
    model_free(m);
    free(o.batches);
    return bench_exit_code(worst);
}
