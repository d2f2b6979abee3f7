/* rollout_cpu: generation speed of the rollout engine on the CPU, printed as one JSON
 * object (bench/rollout_cpu.py runs it next to Hugging Face generate).
 *
 *   rollout_cpu [--model DIR | --random-config DIR] [--prompts FILE] [--batch N]
 *               [--waves W] [--max-new-tokens N] [--kv-memory-mb MB]
 *               [--max-batch-tokens T] [--prefill-chunk T] [--seed S] [--print-ids]
 *
 * A wave submits --batch requests at once (greedy, no stop ids, so every sequence
 * generates exactly --max-new-tokens) and steps the engine until idle; wave w takes
 * prompts [w*N, (w+1)*N) of the list, wrapping around. One untimed warm-up wave (the
 * first wave's prompts, at most 8 new tokens) comes first; the timed waves count every
 * step, prefill included, as HF's generate does.
 *
 * With no arguments (what `make bench` runs): examples/tiny's config with random
 * weights, 8 generated prompts of 8..24 tokens, 32 new tokens each — under a second.
 * Without --prompts, --batch * --waves prompts of 8..24 random ids are made from --seed. */
#include <cblas.h> /* openblas_get_num_threads */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/rollout_wave.h" /* wave_run, bench_prompts: shared with bench/gpu/generate_gpu.c */
#include "common/common.h"    /* args_*, json_load_path, rng */
#include "model/model.h"      /* model_load, model_init_random */
#include "rollout/rollout.h"  /* rollout_engine_*, ROLLOUT_KV_BLOCK_TOKENS */

#define WARMUP_MAX_NEW 8

struct options {
    const char *model_dir;      /* NULL: random weights from random_config */
    const char *random_config;
    const char *prompts_path;   /* NULL: generated */
    int64_t batch, waves, max_new_tokens, kv_memory_mb, max_batch_tokens, prefill_chunk, seed;
    bool print_ids;
};

/* What the timed waves did. */
struct run_totals {
    struct wave_totals waves;
    double wall_s;
    int32_t **outputs;   /* [batch * waves][max_new_tokens] when --print-ids, else NULL */
};

static void usage(FILE *f) {
    fprintf(f, "usage: rollout_cpu [--model DIR | --random-config DIR] [--prompts FILE] [--batch N]\n"
               "         [--waves W] [--max-new-tokens N] [--kv-memory-mb MB] [--max-batch-tokens T]\n"
               "         [--prefill-chunk T] [--seed S] [--print-ids]\n"
               "  --model DIR           a Hugging Face model directory with weights\n"
               "  --random-config DIR   without --model: this config.json, random weights from --seed\n"
               "                        (default examples/tiny)\n"
               "  --prompts FILE        JSON list of lists of token ids (default: --batch * --waves\n"
               "                        prompts of 8..24 random ids from --seed)\n"
               "  --batch N             requests submitted at once, the engine's max_seqs (default 8)\n"
               "  --waves W             timed rounds of --batch requests (default 1)\n"
               "  --max-new-tokens N    tokens every sequence generates (default 32)\n"
               "  --kv-memory-mb MB     the KV cache's budget (default 256)\n"
               "  --max-batch-tokens T  tokens per engine step (default 4096)\n"
               "  --prefill-chunk T     prompt tokens of one sequence per step (default 512)\n"
               "  --seed S              random weights and prompts (default 1)\n"
               "  --print-ids           add every generated sequence to the JSON (\"outputs\")\n");
}

/* ---- options ---- */

/* The option for flag a taking an integer, or NULL. */
static int64_t *int_option(struct options *o, const char *a, int64_t *min, int64_t *max) {
    struct {
        const char *flag;
        int64_t *field, min, max;
    } table[] = {
        {"--batch", &o->batch, 1, 4096},
        {"--waves", &o->waves, 1, 1 << 20},
        {"--max-new-tokens", &o->max_new_tokens, 1, 1 << 20},
        {"--kv-memory-mb", &o->kv_memory_mb, 1, 1 << 20},
        {"--max-batch-tokens", &o->max_batch_tokens, 1, 1 << 20},
        {"--prefill-chunk", &o->prefill_chunk, 1, 1 << 20},
        {"--seed", &o->seed, 0, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strcmp(a, table[i].flag) == 0) {
            *min = table[i].min;
            *max = table[i].max;
            return table[i].field;
        }
    return NULL;
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){.random_config = "examples/tiny", .batch = 8, .waves = 1, .max_new_tokens = 32,
                          .kv_memory_mb = 256, .max_batch_tokens = 4096, .prefill_chunk = 512, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--print-ids") == 0) {
            o->print_ids = true;
            continue;
        }
        int rc = args_value(argc, argv, &i, &v, err);
        if (rc) return rc;
        int64_t min, max, *field = int_option(o, a, &min, &max);
        if (field) rc = args_int(a, v, min, max, field, err);
        else if (strcmp(a, "--model") == 0) o->model_dir = v;
        else if (strcmp(a, "--random-config") == 0) o->random_config = v;
        else if (strcmp(a, "--prompts") == 0) o->prompts_path = v;
        else return error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    return SMELT_OK;
}

/* ---- prompts ---- */

static int prompt_from_json(const json_t *list, const char *path, int64_t i, struct bench_prompts *p,
                            struct smelt_error *err) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return error_set(err, SMELT_EINVAL, "%s: prompt %lld is not a non-empty list of token ids", path, (long long)i);
    p->lens[i] = (int64_t)json_array_size(list);
    p->ids[i] = malloc((size_t)p->lens[i] * sizeof *p->ids[i]);
    if (!p->ids[i]) return error_set(err, SMELT_ENOMEM, "prompts: out of memory");
    for (int64_t t = 0; t < p->lens[i]; t++) {
        const json_t *v = json_array_get(list, (size_t)t);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return error_set(err, SMELT_EINVAL, "%s: prompt %lld token %lld is not a token id", path, (long long)i,
                             (long long)t);
        p->ids[i][t] = (int32_t)json_integer_value(v);
    }
    return SMELT_OK;
}

static int prompts_load(const char *path, struct bench_prompts *p, struct smelt_error *err) {
    json_t *root;
    int rc = json_load_path(path, &root, err);
    if (rc) return rc;
    if (!json_is_array(root) || json_array_size(root) == 0)
        rc = error_set(err, SMELT_EINVAL, "%s: expected a non-empty list of prompts", path);
    if (!rc) rc = bench_prompts_alloc(p, (int64_t)json_array_size(root), err);
    for (int64_t i = 0; !rc && i < p->n; i++) rc = prompt_from_json(json_array_get(root, (size_t)i), path, i, p, err);
    json_decref(root);
    return rc;
}

/* Every sequence must be able to generate all its tokens: the engine would stop it at
 * the model's context, and the tokens/s would count less work than asked for. */
static int prompts_check_fit(const struct bench_prompts *p, int64_t max_new, int64_t max_seq_len, struct smelt_error *err) {
    for (int64_t i = 0; i < p->n; i++)
        if (p->lens[i] + max_new > max_seq_len)
            return error_set(err, SMELT_EINVAL,
                             "prompt %lld: %lld tokens + --max-new-tokens %lld exceed the model's context of %lld",
                             (long long)i, (long long)p->lens[i], (long long)max_new, (long long)max_seq_len);
    return SMELT_OK;
}

/* ---- the engine ---- */

/* The untimed warm-up wave (pages in the weights, grows the buffers, starts the thread
 * pools), then the timed waves; before and after bracket the timed part. */
static int run_timed(struct rollout_engine *e, const struct options *o, const struct bench_prompts *p,
                     struct run_totals *totals, struct rollout_stats *before, struct rollout_stats *after,
                     struct smelt_error *err) {
    struct wave_totals warm = {0};
    int64_t warm_new = o->max_new_tokens < WARMUP_MAX_NEW ? o->max_new_tokens : WARMUP_MAX_NEW;
    int rc = wave_run(e, p, 0, o->batch, warm_new, &warm, NULL, NULL, err);
    if (rc) return error_wrap(err, rc, "warm-up");
    *before = rollout_engine_stats(e);
    double t0 = bench_now_s();
    for (int64_t w = 0; !rc && w < o->waves; w++) {
        int32_t **outputs = totals->outputs ? totals->outputs + w * o->batch : NULL;
        rc = wave_run(e, p, w * o->batch, o->batch, o->max_new_tokens, &totals->waves, outputs, NULL, err);
    }
    totals->wall_s = bench_now_s() - t0;
    *after = rollout_engine_stats(e);
    return rc;
}

static int outputs_alloc(struct run_totals *t, int64_t n, int64_t len, struct smelt_error *err) {
    t->outputs = calloc((size_t)n, sizeof *t->outputs);
    if (!t->outputs) return error_set(err, SMELT_ENOMEM, "outputs: out of memory");
    for (int64_t i = 0; i < n; i++) {
        t->outputs[i] = malloc((size_t)len * sizeof *t->outputs[i]);
        if (!t->outputs[i]) return error_set(err, SMELT_ENOMEM, "outputs: out of memory");
    }
    return SMELT_OK;
}

static void outputs_free(struct run_totals *t, int64_t n) {
    for (int64_t i = 0; t->outputs && i < n; i++) free(t->outputs[i]);
    free(t->outputs);
    t->outputs = NULL;
}

/* ---- report ---- */

static json_t *report_json(const struct options *o, const struct model *m, const struct run_totals *t,
                           const struct rollout_stats *before, const struct rollout_stats *after) {
    json_t *r = json_object();
    if (!r) return NULL;
    int64_t kv_tok = after->kv_bytes_per_token;
    json_object_set_new(r, "model", json_string(o->model_dir ? o->model_dir : o->random_config));
    json_object_set_new(r, "weights", json_string(o->model_dir ? "loaded" : "random"));
    json_object_set_new(r, "params", json_integer(m->n_weights));
    json_object_set_new(r, "batch", json_integer(o->batch));
    json_object_set_new(r, "waves", json_integer(o->waves));
    json_object_set_new(r, "max_new_tokens", json_integer(o->max_new_tokens));
    json_object_set_new(r, "prompt_tokens", json_integer(t->waves.prompt_tokens));
    json_object_set_new(r, "generated_tokens", json_integer(t->waves.generated_tokens));
    json_object_set_new(r, "wall_s", json_real(t->wall_s));
    json_object_set_new(r, "tokens_per_s", json_real(t->wall_s > 0 ? (double)t->waves.generated_tokens / t->wall_s : 0));
    json_object_set_new(r, "steps", json_integer(after->steps - before->steps));
    json_object_set_new(r, "kv_bytes_per_token", json_integer(kv_tok));
    json_object_set_new(r, "kv_blocks", json_integer(after->n_blocks));
    json_object_set_new(r, "kv_block_tokens", json_integer(ROLLOUT_KV_BLOCK_TOKENS));
    json_object_set_new(r, "peak_blocks_used", json_integer(t->waves.peak_blocks_used));
    json_object_set_new(r, "peak_kv_bytes", json_integer(t->waves.peak_blocks_used * ROLLOUT_KV_BLOCK_TOKENS * kv_tok));
    json_object_set_new(r, "preemptions", json_integer(after->preemptions - before->preemptions));
    json_object_set_new(r, "omp_threads", json_integer(omp_get_max_threads()));
    json_object_set_new(r, "openblas_threads", json_integer(openblas_get_num_threads()));
    json_object_set_new(r, "blas_kernels", json_string(backend_cpu_blas_kernels()));
    if (t->outputs) {
        json_t *all = json_array();
        for (int64_t i = 0; all && i < o->batch * o->waves; i++) {
            json_t *ids = json_array();
            for (int64_t k = 0; ids && k < o->max_new_tokens; k++) json_array_append_new(ids, json_integer(t->outputs[i][k]));
            json_array_append_new(all, ids);
        }
        json_object_set_new(r, "outputs", all);
    }
    return r;
}

static int print_report(const struct options *o, const struct model *m, const struct run_totals *t,
                        const struct rollout_stats *before, const struct rollout_stats *after, struct smelt_error *err) {
    json_t *r = report_json(o, m, t, before, after);
    char *text = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(r);
    if (!text) return error_set(err, SMELT_ENOMEM, "report: out of memory");
    puts(text);
    free(text);
    return SMELT_OK;
}

/* ---- main ---- */

static int load_model(const struct options *o, struct model **m, struct smelt_error *err) {
    if (o->model_dir) return model_load(o->model_dir, BACKEND_CPU, m, err);
    struct model_config config;
    int rc = model_config_load(o->random_config, &config, err);
    if (!rc) rc = model_init_random(&config, (uint64_t)o->seed, BACKEND_CPU, m, err);
    return rc;
}

static int run(const struct options *o, struct smelt_error *err) {
    struct model *m = NULL;
    struct bench_prompts p = {0};
    struct rollout_engine *e = NULL;
    struct run_totals totals = {0};
    int64_t n_out = o->batch * o->waves;
    int rc = load_model(o, &m, err);
    if (!rc && o->prompts_path) rc = prompts_load(o->prompts_path, &p, err);
    else if (!rc) rc = bench_prompts_random(n_out, 8, 24, m->config.vocab_size, (uint64_t)o->seed, &p, err);
    if (!rc) rc = prompts_check_fit(&p, o->max_new_tokens, m->config.max_seq_len, err);
    if (!rc) {
        struct rollout_config c = {.kv_memory_bytes = o->kv_memory_mb << 20, .max_batch_tokens = o->max_batch_tokens,
                                   .max_seqs = (int)o->batch, .prefill_chunk = o->prefill_chunk};
        rc = rollout_engine_create(m, NULL, &c, &e, err);
    }
    if (!rc && o->print_ids) rc = outputs_alloc(&totals, n_out, o->max_new_tokens, err);
    struct rollout_stats before = {0}, after = {0};
    if (!rc) rc = run_timed(e, o, &p, &totals, &before, &after, err);
    if (!rc) rc = print_report(o, m, &totals, &before, &after, err);
    outputs_free(&totals, n_out);
    rollout_engine_free(e);
    bench_prompts_free(&p);
    model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv);
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (rc) {
        fprintf(stderr, "rollout_cpu: %s\n", err.message);
        usage(stderr);
        return 2;
    }
    rc = run(&o, &err);
    if (rc) {
        fprintf(stderr, "rollout_cpu: %s\n", err.message);
        return 1;
    }
    return 0;
}
