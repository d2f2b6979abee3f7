/* bench/gpu/bench_gpu.h — what the GPU benchmarks (sft_gpu, generate_gpu, attention_gpu)
 * share: the Qwen2 shapes they run, a clock read after the device is idle, medians, the
 * FLOP counts, and their JSON output lines. Each bench is one .c file linked alone
 * against libsmelt.a (the Makefile's rule for bench/gpu/NAME.c), hence static inline.
 *
 * Output: one JSON object per line on stdout. Every line has "bench", "impl" ("smelt"),
 * "status" — "ok"; "unsupported" for SMELT_EUNSUPPORTED (no CUDA device, or an op the
 * backend lacks); "error" for anything else — and, when not ok, "error" with the
 * message. bench/gpu/peers.py writes the same fields for PyTorch; bench/gpu/report.py
 * reads both. */
#ifndef SMELT_BENCH_GPU_H
#define SMELT_BENCH_GPU_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "kernels/ops.h"
#include "model/config.h"

/* Exit codes: numbers measured, a row marked unsupported, a row marked error, bad flags. */
enum { BENCH_EXIT_OK = 0, BENCH_EXIT_ERROR = 1, BENCH_EXIT_USAGE = 2, BENCH_EXIT_UNSUPPORTED = 3 };

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The clock once every op issued on the backend has finished: device ops return before
 * their work is done, so a clock read without this times the launches. */
static inline int bench_sync_clock(enum backend backend, double *t, struct smelt_error *err) {
    int rc = backend_sync(backend, err);
    if (rc) return error_wrap(err, rc, "waiting for the %s backend", backend_name(backend));
    *t = bench_now_s();
    return SMELT_OK;
}

static inline int bench_compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of x[0..n) (n >= 1); sorts x. Even n: the mean of the two middle values. */
static inline double bench_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, bench_compare_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- models ---- */

/* Qwen2.5-0.5B and Qwen2.5-1.5B as their config.json files give them (tied embeddings,
 * q/k/v biases, rope theta 1e6, no sliding window), and a tiny model of the same kind
 * for CPU checks. bench/gpu/peers.py's MODELS holds the same shapes for transformers. */
struct bench_model_shape {
    const char *name;
    int64_t hidden, layers, heads, kv_heads, intermediate, vocab, max_pos;
};

static const struct bench_model_shape bench_models[] = {
    {"0.5b", 896, 24, 14, 2, 4864, 151936, 32768},
    {"1.5b", 1536, 28, 12, 2, 8960, 151936, 32768},
    {"tiny", 64, 2, 4, 2, 176, 1024, 4096},
};

static inline const struct bench_model_shape *bench_model_find(const char *name) {
    for (size_t i = 0; i < sizeof bench_models / sizeof *bench_models; i++)
        if (strcmp(name, bench_models[i].name) == 0) return &bench_models[i];
    return NULL;
}

/* --model's value: one of bench_models. */
static inline int bench_model_flag(const char *v, const char **out, struct smelt_error *err) {
    if (!bench_model_find(v)) return error_set(err, SMELT_EINVAL, "--model: unknown model '%s' (0.5b, 1.5b, tiny)", v);
    *out = v;
    return SMELT_OK;
}

/* The model's config through the same reader a Hugging Face config.json goes through. */
static inline int bench_model_config(const char *name, struct model_config *out, struct smelt_error *err) {
    const struct bench_model_shape *s = bench_model_find(name);
    if (!s) return error_set(err, SMELT_EINVAL, "--model: unknown model '%s' (0.5b, 1.5b, tiny)", name);
    json_t *cfg = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b, s:b, s:s}",
                            "architectures", "Qwen2ForCausalLM", "model_type", "qwen2",
                            "hidden_size", (json_int_t)s->hidden, "num_hidden_layers", (json_int_t)s->layers,
                            "num_attention_heads", (json_int_t)s->heads,
                            "num_key_value_heads", (json_int_t)s->kv_heads,
                            "intermediate_size", (json_int_t)s->intermediate, "vocab_size", (json_int_t)s->vocab,
                            "max_position_embeddings", (json_int_t)s->max_pos, "rms_norm_eps", 1e-6,
                            "rope_theta", 1000000.0, "tie_word_embeddings", 1, "use_sliding_window", 0,
                            "hidden_act", "silu");
    if (!cfg) return error_set(err, SMELT_ENOMEM, "model config: out of memory");
    int rc = model_config_from_json(cfg, name, out, err);
    json_decref(cfg);
    return rc;
}

/* Parameters that take part in a matrix product: every linear of every layer and the
 * lm_head (V x C). Norm gains, biases and (when untied) the input embedding, a lookup,
 * are left out; trainer/setup.c counts the same. */
static inline double bench_matmul_params(const struct model_config *c) {
    double C = (double)c->hidden_size, F = (double)c->intermediate_size;
    double qd = (double)(c->n_heads * c->head_dim), kd = (double)(c->n_kv_heads * c->head_dim);
    double mlp = c->mlp == MODEL_MLP_SWIGLU ? 3 * C * F : 2 * C * F;
    return (double)c->n_layers * (C * qd + 2 * C * kd + qd * C + mlp) + (double)c->vocab_size * C;
}

/* Causal attention of n_seqs sequences of seq_len tokens, forward only: QK^T and PV over
 * the lower triangle, 2 * 2 * D * Hq * s^2 / 2 per sequence and layer. */
static inline double bench_attention_forward_flops(int64_t n_layers, int64_t heads, int64_t head_dim,
                                                   int64_t n_seqs, int64_t seq_len) {
    double s = (double)seq_len;
    return (double)n_layers * 4.0 * (double)heads * (double)head_dim * (double)n_seqs * s * s / 2.0;
}

/* Model FLOPs of one training step (README.md, "FLOPs"): full fine-tune 6 N T (forward
 * 2 N T, backward 4 N T) plus attention forward + backward (3x forward); LoRA 4 N T
 * (the frozen weights get no gradient) plus 6 A T for the adapter's A parameters, plus
 * the same attention. */
static inline double bench_sft_flops(const struct model_config *c, bool lora, double adapter_params,
                                     int64_t tokens, int64_t seq_len) {
    double N = bench_matmul_params(c), T = (double)tokens;
    double attn = 3.0 * bench_attention_forward_flops(c->n_layers, c->n_heads, c->head_dim, tokens / seq_len, seq_len);
    return lora ? 4.0 * N * T + 6.0 * adapter_params * T + attn : 6.0 * N * T + attn;
}

/* ---- flags ---- */

/* Reads the argument at *i: --help or -h prints usage to stdout and exits 0; --json
 * sets *json (and *value = NULL); a flag of value_flags (NULL-terminated) takes the next
 * argument as *value (advancing *i); anything else is "unknown option", named as such
 * even when it is the last argument. */
static inline int bench_next_arg(int argc, char **argv, int *i, const char *const *value_flags,
                                 void (*usage)(FILE *), bool *json, const char **value, struct smelt_error *err) {
    const char *a = argv[*i];
    *value = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        usage(stdout);
        exit(0);
    }
    if (strcmp(a, "--json") == 0) {
        *json = true;
        return SMELT_OK;
    }
    for (const char *const *f = value_flags; *f; f++)
        if (strcmp(a, *f) == 0) return args_value(argc, argv, i, value, err);
    return error_set(err, SMELT_EINVAL, "unknown option %s (--help lists them)", a);
}

/* "cpu" or "cuda". Whether the backend has a device is found out when the bench runs,
 * so that a missing GPU becomes an "unsupported" row, not a usage error. */
static inline int bench_backend_flag(const char *v, enum backend *out, struct smelt_error *err) {
    if (strcmp(v, "cpu") == 0) *out = BACKEND_CPU;
    else if (strcmp(v, "cuda") == 0) *out = BACKEND_CUDA;
    else return error_set(err, SMELT_EINVAL, "--backend: '%s' is not cpu or cuda", v);
    return SMELT_OK;
}

/* The backend, or SMELT_EUNSUPPORTED when this build or machine lacks it. */
static inline int bench_backend_ready(enum backend b, struct smelt_error *err) {
    enum backend got;
    return backend_from_name(backend_name(b), &got, err);
}

/* ---- output ---- */

static inline json_t *bench_row_new(const char *bench) {
    json_t *row = json_object();
    if (row) {
        json_object_set_new(row, "bench", json_string(bench));
        json_object_set_new(row, "impl", json_string("smelt"));
    }
    return row;
}

static inline const char *bench_status(int rc) {
    return rc == SMELT_OK ? "ok" : rc == SMELT_EUNSUPPORTED ? "unsupported" : "error";
}

static inline int bench_exit_code(int rc) {
    return rc == SMELT_OK ? BENCH_EXIT_OK : rc == SMELT_EUNSUPPORTED ? BENCH_EXIT_UNSUPPORTED : BENCH_EXIT_ERROR;
}

/* Adds "status" (and "error" when rc is not 0), prints the row and frees it: one JSON
 * line with json, else one "key=value ..." line for a person. A row that cannot be
 * built or printed is reported on stderr. */
static inline void bench_row_emit(json_t *row, int rc, const struct smelt_error *err, bool json) {
    if (!row) {
        fprintf(stderr, "bench: out of memory building a result row\n");
        return;
    }
    json_object_set_new(row, "status", json_string(bench_status(rc)));
    if (rc) json_object_set_new(row, "error", json_string(err->message));
    if (json) {
        char *text = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        if (text) puts(text);
        else fprintf(stderr, "bench: could not print a result row\n");
        free(text);
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(row, key, v) {
            char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
            printf("%s=%s ", key, text ? text : "?");
            free(text);
        }
        putchar('\n');
    }
    fflush(stdout);
    json_decref(row);
}

/* NaN and inf are not JSON: they become null. */
static inline json_t *bench_real(double x) { return isfinite(x) ? json_real(x) : json_null(); }

#endif
