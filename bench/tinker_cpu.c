/* tinker_cpu: multi-tenant LoRA in one smelt-tinker worker (tinker/), in process, on the
 * CPU. Prints a table (and, with --json, one JSON object):
 *
 *   (a) memory: the process's peak RSS (VmHWM of /proc/self/status) after the worker
 *       holds the base alone, then after 4 LoRA models (rank --rank, attention + MLP +
 *       lm_head) each did one forward_backward and one optim_step, next to the bytes
 *       they need by count: base weights, and per model adapter + gradients + AdamW's
 *       two moments (4 f32 per adapter parameter);
 *   (b) sampling: 4 models x --prompts prompts x --samples samples x --tokens tokens at
 *       temperature 1 (the model's eos may end a sample early: tokens are counted as
 *       generated), all batched in one engine run (tinker_sample_batch: S-LoRA style),
 *       one model after another (a batch per model), and one request after another (the
 *       worker before batching); tokens/s and the ratios, each mode's best of --rounds
 *       (the modes interleaved: a busy machine's stalls hit each alike);
 *   (c) the worker's forward_backward of one request (--fb-data sequences of --fb-tokens
 *       tokens, cross_entropy) through tinker_handle, median of --reps.
 *
 *   tinker_cpu [--model DIR | --random-config DIR] [--rank R] [--prompts N] [--samples N]
 *              [--tokens N] [--fb-data N] [--fb-tokens N] [--reps N] [--rounds N] [--kv-cache-mb MB]
 *              [--json]
 *
 * Defaults: examples/tiny's config with random weights (seed 1: nearly uniform logits,
 * so samples rarely meet eos and run their --tokens; tests/data/tinker/addition-base,
 * trained, answers in a few tokens), rank 8, 8 prompts, 4 samples, 32 tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "model/model.h"
#include "lora/lora.h"
#include "tinker/tinker.h"

#define N_MODELS 4
#define MAX_REQS 256

struct options {
    const char *model_dir;      /* NULL: random weights from random_config */
    const char *random_config;
    int64_t rank, prompts, samples, tokens, fb_data, fb_tokens, reps, rounds, kv_cache_mb;
    bool json;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* VmHWM of this process, bytes (-1 when /proc says nothing). */
static int64_t peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){.random_config = "examples/tiny", .rank = 8, .prompts = 8, .samples = 4,
                          .tokens = 32, .fb_data = 8, .fb_tokens = 32, .reps = 5, .rounds = 3,
                          .kv_cache_mb = 64};
    struct {
        const char *flag;
        int64_t *field, max;
    } ints[] = {{"--rank", &o->rank, 256},       {"--prompts", &o->prompts, MAX_REQS / N_MODELS},
                {"--samples", &o->samples, 256}, {"--tokens", &o->tokens, 1 << 16},
                {"--fb-data", &o->fb_data, 256}, {"--fb-tokens", &o->fb_tokens, 1 << 16},
                {"--reps", &o->reps, 1000},      {"--rounds", &o->rounds, 1000},
                {"--kv-cache-mb", &o->kv_cache_mb, 1 << 20}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        TRY(args_value(argc, argv, &i, &v, err));
        bool known = false;
        for (size_t k = 0; k < sizeof ints / sizeof *ints && !known; k++)
            if (strcmp(a, ints[k].flag) == 0) {
                TRY(args_int(a, v, 1, ints[k].max, ints[k].field, err));
                known = true;
            }
        if (!known && strcmp(a, "--model") == 0) o->model_dir = v, known = true;
        if (!known && strcmp(a, "--random-config") == 0) o->random_config = v, known = true;
        if (!known) return error_set(err, SMELT_EINVAL, "unknown option %s", a);
    }
    return SMELT_OK;
}

/* ---- requests, as smeltd sends them ---- */

static struct msg request(const char *op, json_t *header) {
    struct msg m = {0};
    snprintf(m.type, sizeof m.type, "%s", MSG_TINKER_REQUEST);
    json_object_set_new(header, "v", json_integer(MSG_VERSION));
    json_object_set_new(header, "id", json_string(op));
    json_object_set_new(header, "op", json_string(op));
    m.header = header;
    return m;
}

/* Runs one request; the reply is freed unless out takes it. */
static int handle(struct tinker_worker *w, struct msg m, struct tinker_reply *out, struct smelt_error *err) {
    struct tinker_reply r;
    int rc = m.header ? tinker_handle(w, &m, &r, err) : error_set(err, SMELT_ENOMEM, "out of memory");
    msg_free(&m);
    if (rc) return error_wrap(err, rc, "%s", "request");
    if (out) *out = r;
    else tinker_reply_free(&r);
    return SMELT_OK;
}

static int create(struct tinker_worker *w, const char *id, int64_t rank, int seed, struct smelt_error *err) {
    json_t *h = json_pack("{s:s, s:{s:I, s:i, s:b, s:b, s:b}}", "model_id", id, "lora", "rank", (json_int_t)rank,
                          "seed", seed, "train_attn", 1, "train_mlp", 1, "train_unembed", 1);
    return handle(w, request("create_model", h), NULL, err);
}

static json_t *tensor_ref(const char *dtype, int64_t n, int64_t off) {
    return json_pack("{s:s, s:[I], s:I}", "dtype", dtype, "shape", (json_int_t)n, "offset", (json_int_t)off);
}

/* forward_backward of n_data sequences of T byte tokens, every target weighted 1. */
static struct msg fb_request(const char *model, int64_t n_data, int64_t T, struct rng *rng) {
    int64_t total = n_data * T;
    int32_t *tok = malloc((size_t)total * 4), *tgt = malloc((size_t)total * 4);
    float *wts = malloc((size_t)total * 4);
    json_t *data = json_array();
    for (int64_t d = 0; tok && tgt && wts && d < n_data; d++) {
        for (int64_t t = 0; t < T; t++) {
            tok[d * T + t] = (int32_t)(rng_next(rng) % 256);
            wts[d * T + t] = 1.0f;
        }
        for (int64_t t = 0; t < T; t++) tgt[d * T + t] = t + 1 < T ? tok[d * T + t + 1] : (int32_t)(rng_next(rng) % 256);
        json_t *in = json_pack("{s:o, s:o}", "target_tokens", tensor_ref("int64", T, d * T), "weights",
                               tensor_ref("float32", T, d * T));
        json_array_append_new(data, json_pack("{s:I, s:o}", "n_tokens", (json_int_t)T, "inputs", in));
    }
    struct msg m = request("forward_backward", json_pack("{s:s, s:s, s:{}, s:o}", "model_id", model, "loss_fn",
                                                         "cross_entropy", "loss_fn_config", "data", data));
    m.arrays[0] = (struct msg_array){tok, (size_t)total * 4};
    m.arrays[1] = (struct msg_array){tgt, (size_t)total * 4};
    m.arrays[2] = (struct msg_array){wts, (size_t)total * 4};
    m.n_arrays = 3;
    if (!tok || !tgt || !wts) json_decref(m.header), m.header = NULL;
    return m;
}

static int train_once(struct tinker_worker *w, const char *model, struct rng *rng, const struct options *o,
                      struct smelt_error *err) {
    TRY(handle(w, fb_request(model, o->fb_data, o->fb_tokens, rng), NULL, err));
    json_t *h = json_pack("{s:s, s:{s:f, s:f, s:f, s:f, s:f, s:f}}", "model_id", model, "adam", "learning_rate", 1e-3,
                          "beta1", 0.9, "beta2", 0.95, "eps", 1e-8, "weight_decay", 0.0, "grad_clip_norm", 1.0);
    return handle(w, request("optim_step", h), NULL, err);
}

/* ---- (b) sampling ---- */

/* Prompt p of model k: byte ids, 8..16 long, the same in every mode. */
static struct msg sample_request(const char *model, int64_t p, const struct options *o) {
    json_t *h = json_pack("{s:s, s:I, s:I, s:f, s:I}", "model_id", model, "num_samples", (json_int_t)o->samples,
                          "max_tokens", (json_int_t)o->tokens, "temperature", 1.0, "seed", (json_int_t)(1000 + p));
    int64_t n = 8 + p % 9;
    int32_t *ids = malloc((size_t)n * 4);
    struct msg m = request("sample", h);
    for (int64_t t = 0; ids && t < n; t++) ids[t] = (int32_t)('0' + (p * 7 + t * 3) % 10);
    m.arrays[0] = (struct msg_array){ids, (size_t)n * 4};
    m.n_arrays = 1;
    if (!ids) json_decref(m.header), m.header = NULL;
    return m;
}

enum mode { ALL_BATCHED, PER_MODEL, ONE_BY_ONE, N_MODES };
static const char *const MODE_NAMES[N_MODES] = {"4 models batched", "one model after another",
                                                "one request after another"};

/* Runs reqs[from, to) as one batch; replies land in outs. */
static int run_batch(struct tinker_worker *w, struct msg *reqs, int from, int to, struct tinker_reply *outs,
                     struct smelt_error *err) {
    const struct msg *ptrs[MAX_REQS];
    int rcs[MAX_REQS];
    struct smelt_error errs[MAX_REQS];
    for (int i = from; i < to; i++) ptrs[i - from] = &reqs[i];
    tinker_sample_batch(w, ptrs, to - from, outs + from, rcs, errs);
    for (int i = 0; i < to - from; i++)
        if (rcs[i]) {
            *err = errs[i];
            return error_wrap(err, rcs[i], "sample %d", from + i);
        }
    return SMELT_OK;
}

/* Every request of the grid in the mode's grouping; *tokens generated, *secs taken. */
static int sample_mode(struct tinker_worker *w, enum mode mode, const struct options *o, struct tinker_reply *outs,
                       int64_t *tokens, double *secs, struct smelt_error *err) {
    int n = (int)(N_MODELS * o->prompts), per = mode == ALL_BATCHED ? n : mode == PER_MODEL ? (int)o->prompts : 1;
    struct msg reqs[MAX_REQS];
    char id[16];
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof id, "m%d", (int)(i / o->prompts));
        reqs[i] = sample_request(id, i % o->prompts, o);
    }
    double t0 = now_s();
    int rc = SMELT_OK;
    for (int i = 0; !rc && i < n; i += per) rc = run_batch(w, reqs, i, i + per, outs, err);
    *secs = now_s() - t0;
    *tokens = 0;
    for (int i = 0; i < n; i++) {
        if (!rc) *tokens += (int64_t)(outs[i].arrays[0].bytes / 4);
        msg_free(&reqs[i]);
    }
    return rc;
}

/* Whether two modes' replies are the same bits (they must be: batch-invariant kernels). */
static bool same_replies(const struct tinker_reply *a, const struct tinker_reply *b, int n) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (a[i].arrays[k].bytes != b[i].arrays[k].bytes ||
                memcmp(a[i].arrays[k].data, b[i].arrays[k].data, a[i].arrays[k].bytes) != 0)
                return false;
    return true;
}

struct sampling {
    int64_t tokens[N_MODES];
    double secs[N_MODES];
    bool identical;
};

static int sampling_bench(struct tinker_worker *w, const struct options *o, struct sampling *s,
                          struct smelt_error *err) {
    int n = (int)(N_MODELS * o->prompts);
    static struct tinker_reply outs[N_MODES][MAX_REQS];
    int64_t warm_tokens;
    double warm_secs;
    int rc = sample_mode(w, PER_MODEL, o, outs[0], &warm_tokens, &warm_secs, err); /* warm-up, untimed */
    for (int i = 0; i < n; i++) tinker_reply_free(&outs[0][i]);
    s->identical = true;
    for (int64_t r = 0; !rc && r < o->rounds; r++) {
        for (int m = 0; !rc && m < N_MODES; m++) {
            double secs;
            rc = sample_mode(w, (enum mode)m, o, outs[m], &s->tokens[m], &secs, err);
            if (r == 0 || secs < s->secs[m]) s->secs[m] = secs;
        }
        s->identical &= !rc && same_replies(outs[ALL_BATCHED], outs[PER_MODEL], n) &&
                        same_replies(outs[ALL_BATCHED], outs[ONE_BY_ONE], n);
        for (int m = 0; m < N_MODES; m++)
            for (int i = 0; i < n; i++) tinker_reply_free(&outs[m][i]);
    }
    return rc;
}

/* ---- (a) memory, (c) forward_backward ---- */

struct memory {
    int64_t rss_base, rss_one, rss_models; /* VmHWM after the base, after 1 and 4 trained models */
    int64_t base_bytes, model_bytes;     /* by count: base weights; per model adapter + grads + 2 moments */
    int64_t adapter_params;
};

/* The adapter's parameter count: the same LoRA on a second copy of the base (loaded
 * after the RSS readings, so it does not count in them). */
static int load_base(const struct options *o, struct model **out, struct smelt_error *err) {
    if (o->model_dir) return model_load(o->model_dir, BACKEND_CPU, out, err);
    struct model_config c;
    TRY(model_config_load(o->random_config, &c, err));
    return model_init_random(&c, 1, BACKEND_CPU, out, err);
}

static int adapter_params(const struct options *o, int64_t *out, struct smelt_error *err) {
    struct model *m;
    TRY(load_base(o, &m, err));
    struct lora_config c = {.rank = (int)o->rank, .alpha = TINKER_LORA_ALPHA, .n_targets = 2};
    snprintf(c.targets[0], sizeof c.targets[0], "all-linear");
    snprintf(c.targets[1], sizeof c.targets[1], "lm_head");
    struct lora *l;
    int rc = lora_create(m, &c, 0, &l, err);
    if (!rc) *out = l->n_weights, lora_free(l);
    model_free(m);
    return rc;
}

static int fb_bench(struct tinker_worker *w, const struct options *o, double *median_ms, struct smelt_error *err) {
    double ms[1000];
    struct rng rng;
    rng_seed(&rng, 77);
    for (int64_t r = 0; r < o->reps; r++) {
        struct msg m = fb_request("m0", o->fb_data, o->fb_tokens, &rng);
        double t0 = now_s();
        TRY(handle(w, m, NULL, err));
        ms[r] = (now_s() - t0) * 1e3;
    }
    for (int64_t i = 1; i < o->reps; i++) /* insertion sort: a handful of values */
        for (int64_t j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            double t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    *median_ms = ms[o->reps / 2];
    return SMELT_OK;
}

/* ---- the run ---- */

/* The 4 models, each created and trained once; *rss_one: VmHWM after the first (its
 * activations and the engine's scratch are paid once, by whichever model runs first). */
static int setup_models(struct tinker_worker *w, const struct options *o, int64_t *rss_one, struct smelt_error *err) {
    struct rng rng;
    rng_seed(&rng, 5);
    char id[16];
    for (int k = 0; k < N_MODELS; k++) {
        snprintf(id, sizeof id, "m%d", k);
        TRY(create(w, id, o->rank, 10 + k, err));
        TRY(train_once(w, id, &rng, o, err));
        if (k == 0) *rss_one = peak_rss();
    }
    return SMELT_OK;
}

static double mib(int64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static void print_table(const struct options *o, const struct memory *m, const struct sampling *s, double fb_ms) {
    int64_t want = m->base_bytes + N_MODELS * m->model_bytes;
    printf("tinker_cpu: %s%s, %d LoRA models of rank %lld (attention, MLP, lm_head: %lld parameters each)\n",
           o->model_dir ? o->model_dir : o->random_config, o->model_dir ? "" : " (random weights)", N_MODELS,
           (long long)o->rank, (long long)m->adapter_params);
    printf("(a) memory                                   MiB\n");
    printf("    peak RSS, worker with the base alone     %8.1f\n", mib(m->rss_base));
    printf("    peak RSS, + 1 trained model              %8.1f  (+%.1f: its state and the one-time activations)\n",
           mib(m->rss_one), mib(m->rss_one - m->rss_base));
    printf("    peak RSS, + %d trained models             %8.1f  (+%.1f; the last %d: +%.1f)\n", N_MODELS,
           mib(m->rss_models), mib(m->rss_models - m->rss_base), N_MODELS - 1, mib(m->rss_models - m->rss_one));
    printf("    by count: base weights                   %8.1f\n", mib(m->base_bytes));
    printf("    by count: %d x (adapter+grads+2 moments)  %8.1f\n", N_MODELS, mib(N_MODELS * m->model_bytes));
    printf("    by count: base + %d models                %8.1f  (the last %d models: measured / counted %.2f)\n",
           N_MODELS, mib(want), N_MODELS - 1,
           (double)(m->rss_models - m->rss_one) / (double)((N_MODELS - 1) * m->model_bytes));
    printf("(b) sampling, %d models x %lld prompts x %lld samples x <= %lld tokens, temperature 1, best of %lld\n",
           N_MODELS, (long long)o->prompts, (long long)o->samples, (long long)o->tokens, (long long)o->rounds);
    for (int k = 0; k < N_MODES; k++)
        printf("    %-28s %7lld tokens %8.3f s %9.1f tok/s  x%.2f\n", MODE_NAMES[k], (long long)s->tokens[k],
               s->secs[k], (double)s->tokens[k] / s->secs[k], s->secs[k] / s->secs[ALL_BATCHED]);
    printf("    (x: time / the batched run's; every mode gave the same tokens and logprobs: %s)\n",
           s->identical ? "yes" : "NO");
    printf("(c) forward_backward, %lld x %lld tokens, tinker_handle in process: %.2f ms (median of %lld)\n",
           (long long)o->fb_data, (long long)o->fb_tokens, fb_ms, (long long)o->reps);
}

static void print_json(const struct options *o, const struct memory *m, const struct sampling *s, double fb_ms) {
    printf("{\"model\": \"%s\", \"rank\": %lld, \"adapter_params\": %lld, \"rss_base\": %lld, \"rss_one\": %lld, \"rss_models\": %lld, "
           "\"base_bytes\": %lld, \"model_bytes\": %lld, \"sample_tok_s\": {\"batched\": %.1f, \"per_model\": %.1f, "
           "\"one_by_one\": %.1f}, \"identical\": %s, \"forward_backward_ms\": %.3f}\n",
           o->model_dir ? o->model_dir : o->random_config, (long long)o->rank, (long long)m->adapter_params, (long long)m->rss_base,
           (long long)m->rss_one, (long long)m->rss_models, (long long)m->base_bytes, (long long)m->model_bytes,
           (double)s->tokens[0] / s->secs[0], (double)s->tokens[1] / s->secs[1], (double)s->tokens[2] / s->secs[2],
           s->identical ? "true" : "false", fb_ms);
}

static int run(const struct options *o, struct smelt_error *err) {
    struct tinker_config c = {.model_dir = o->model_dir, .backend = BACKEND_CPU,
                              .kv_cache_bytes = o->kv_cache_mb << 20, .seed = 1};
    struct tinker_worker *w;
    struct model *base;
    TRY(load_base(o, &base, err));
    TRY(tinker_worker_create_on(base, o->model_dir ? o->model_dir : o->random_config, &c, &w, err));
    struct memory m = {.rss_base = peak_rss(), .base_bytes = tinker_worker_model(w)->n_weights * 4};
    struct sampling s = {0};
    double fb_ms = 0;
    int rc = setup_models(w, o, &m.rss_one, err);
    m.rss_models = peak_rss();
    if (!rc) rc = sampling_bench(w, o, &s, err);
    if (!rc) rc = fb_bench(w, o, &fb_ms, err);
    tinker_worker_free(w);
    if (!rc) rc = adapter_params(o, &m.adapter_params, err);
    m.model_bytes = 4 * 4 * m.adapter_params; /* f32 weights, grads, AdamW m and v */
    if (rc) return rc;
    if (o->json) print_json(o, &m, &s, fb_ms);
    else print_table(o, &m, &s, fb_ms);
    return s.identical ? SMELT_OK : error_set(err, SMELT_EBACKEND, "the modes' samples differ");
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (!rc) rc = run(&o, &err);
    if (rc) {
        fprintf(stderr, "tinker_cpu: %s\n", err.message);
        return 1;
    }
    return 0;
}
