/* smelt-tinker's worker (tinker/tinker.h) on the tiny llama fixture: the ops called in
 * process (two LoRA models on one base trained side by side = each trained alone, bit for
 * bit; gradient accumulation; every loss against its closed form from the forward's
 * logprobs; save -> load -> the same next losses; bad input refused naming the field;
 * sampled logprobs == a forward's, memcmp) and the ZeroMQ loop (hello, requests
 * answered, garbage answered with an error while the worker keeps serving). */
#include "tests/unit/testutil.h"

#include <math.h>
#include <stdatomic.h>
#include <unistd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/file.h"
#include "model/model.h"
#include "tinker/tinker.h"
#include "tinker/tinker_internal.h"

#define FIXTURE "tests/data/parity/llama"

static struct tinker_worker *worker_with_metrics(const char *metrics) {
    struct model *m;
    struct smelt_error err = {0};
    TEST_OK(model_load(FIXTURE, BACKEND_CPU, &m, &err), &err);
    struct tinker_config c = {.backend = BACKEND_CPU, .kv_cache_bytes = 4 << 20, .seed = 7, .metrics_path = metrics};
    struct tinker_worker *w;
    TEST_OK(tinker_worker_create_on(m, FIXTURE, &c, &w, &err), &err);
    return w;
}

static struct tinker_worker *worker_new(void) { return worker_with_metrics(NULL); }

/* ---- building requests ---- */

/* One datum: n tokens, their targets, and up to two float inputs (weights, or logprobs
 * and advantages). */
struct td {
    int n;
    const int32_t *tokens, *targets;
    const float *f1, *f2;
};

static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    cr_assert(q);
    if (n) memcpy(q, p, n);
    return q;
}

static struct msg request(const char *op, json_t *header) {
    struct msg m = {0};
    snprintf(m.type, sizeof m.type, "%s", MSG_TINKER_REQUEST);
    json_object_set_new(header, "v", json_integer(MSG_VERSION));
    json_object_set_new(header, "id", json_string("req"));
    json_object_set_new(header, "op", json_string(op));
    m.header = header;
    return m;
}

static json_t *input(const char *dtype, int n, int64_t off) {
    return json_pack("{s:s, s:[i], s:I}", "dtype", dtype, "shape", n, "offset", (json_int_t)off);
}

/* forward / forward_backward of data through loss (config may be NULL). */
static struct msg fwd_request(const char *op, const char *model, const char *loss, json_t *config,
                              const struct td *d, int n_data) {
    bool ce = strcmp(loss, "cross_entropy") == 0;
    int total = 0;
    for (int i = 0; i < n_data; i++) total += d[i].n;
    int32_t *tok = malloc((size_t)total * 4), *ints = malloc((size_t)total * 4);
    float *fl = malloc((size_t)total * 8 + 4);
    json_t *data = json_array();
    int off = 0, foff = 0;
    for (int i = 0; i < n_data; i++) {
        memcpy(tok + off, d[i].tokens, (size_t)d[i].n * 4);
        memcpy(ints + off, d[i].targets, (size_t)d[i].n * 4);
        json_t *in = json_pack("{s:o}", "target_tokens", input("int64", d[i].n, off));
        json_object_set_new(in, ce ? "weights" : "logprobs", input("float32", d[i].n, foff));
        memcpy(fl + foff, d[i].f1, (size_t)d[i].n * 4);
        foff += d[i].n;
        if (!ce && d[i].f2) {
            json_object_set_new(in, "advantages", input("float32", d[i].n, foff));
            memcpy(fl + foff, d[i].f2, (size_t)d[i].n * 4);
            foff += d[i].n;
        }
        json_array_append_new(data, json_pack("{s:i, s:o}", "n_tokens", d[i].n, "inputs", in));
        off += d[i].n;
    }
    json_t *h = json_pack("{s:s, s:s, s:o, s:o}", "model_id", model, "loss_fn", loss, "loss_fn_config",
                          config ? config : json_object(), "data", data);
    struct msg m = request(op, h);
    m.arrays[0] = (struct msg_array){tok, (size_t)total * 4};
    m.arrays[1] = (struct msg_array){ints, (size_t)total * 4};
    m.arrays[2] = (struct msg_array){fl, (size_t)foff * 4};
    m.n_arrays = 3;
    return m;
}

/* Runs a request that must succeed; the caller frees the reply. */
static struct tinker_reply ok(struct tinker_worker *w, struct msg m) {
    struct tinker_reply r;
    struct smelt_error err = {0};
    int rc = tinker_handle(w, &m, &r, &err);
    cr_assert_eq(rc, 0, "%s failed: %s", json_string_value(json_object_get(m.header, "op")), err.message);
    msg_free(&m);
    return r;
}

/* Runs a request that must fail with code and the field named. */
static void refused(struct tinker_worker *w, struct msg m, int code, const char *field, const char *text) {
    struct tinker_reply r;
    struct smelt_error err = {0};
    int rc = tinker_handle(w, &m, &r, &err);
    cr_expect_eq(rc, code, "expected %s, got %s: %s", error_code_name(code), error_code_name(rc), err.message);
    cr_expect_str_eq(err.field, field, "field of \"%s\"", err.message);
    if (text) cr_expect(strstr(err.message, text), "\"%s\" not in \"%s\"", text, err.message);
    cr_expect_str_eq(tinker_error_category(rc), "user");
    msg_free(&m);
}

static void create(struct tinker_worker *w, const char *id, int rank, int seed) {
    json_t *h = json_pack("{s:s, s:{s:i, s:i, s:b, s:b, s:b}}", "model_id", id, "lora", "rank", rank, "seed", seed,
                          "train_attn", 1, "train_mlp", 1, "train_unembed", 0);
    struct tinker_reply r = ok(w, request("create_model", h));
    tinker_reply_free(&r);
}

static void optim(struct tinker_worker *w, const char *id, double lr) {
    json_t *h = json_pack("{s:s, s:{s:f, s:f, s:f, s:f, s:f, s:f}}", "model_id", id, "adam", "learning_rate", lr,
                          "beta1", 0.9, "beta2", 0.95, "eps", 1e-12, "weight_decay", 0.01, "grad_clip_norm", 1.0);
    struct tinker_reply r = ok(w, request("optim_step", h));
    cr_expect(json_real_value(json_object_get(json_object_get(r.result, "metrics"), "grad_norm:mean")) > 0);
    tinker_reply_free(&r);
}

static double loss_of(const struct tinker_reply *r) {
    return json_real_value(json_object_get(json_object_get(r->result, "metrics"), "loss:sum"));
}

/* forward_backward (or forward) with cross-entropy; returns the loss and copies the first
 * datum's logprobs into lp when given. */
static double ce(struct tinker_worker *w, const char *op, const char *id, const struct td *d, int n, float *lp) {
    struct tinker_reply r = ok(w, fwd_request(op, id, "cross_entropy", NULL, d, n));
    if (lp) memcpy(lp, r.arrays[0].data, (size_t)d[0].n * 4);
    double l = loss_of(&r);
    tinker_reply_free(&r);
    return l;
}

/* ---- a little data ---- */

static const int32_t TOK_A[] = {1, 5, 9, 13, 17, 21, 25}, TGT_A[] = {5, 9, 13, 17, 21, 25, 29};
static const int32_t TOK_B[] = {2, 40, 41, 42, 43}, TGT_B[] = {40, 41, 42, 43, 44};
static const int32_t TOK_C[] = {3, 60, 70, 80, 90, 7}, TGT_C[] = {60, 70, 80, 90, 7, 11};
static const float W7[] = {0, 0, 1, 1, 1, 1, 1}, W5[] = {0, 1, 1, 1, 1}, W6[] = {1, 1, 1, 1, 1, 0.5f};

static const struct td DA = {7, TOK_A, TGT_A, W7, NULL}, DB = {5, TOK_B, TGT_B, W5, NULL},
                       DC = {6, TOK_C, TGT_C, W6, NULL};

/* ---- tests ---- */

TestSuite(tinker_worker, .init = test_tmp_setup, .fini = test_tmp_teardown);

/* Models A and B trained in turns in one worker have the losses each has alone. */
Test(tinker_worker, two_models_on_one_base_match_each_alone) {
    struct tinker_worker *both = worker_new(), *alone_a = worker_new(), *alone_b = worker_new();
    create(both, "a", 4, 1), create(both, "b", 2, 2);
    create(alone_a, "a", 4, 1), create(alone_b, "b", 2, 2);
    double first = 0;
    for (int step = 0; step < 3; step++) {
        double la = ce(both, "forward_backward", "a", &DA, 1, NULL);
        if (step == 0) first = la;
        double lb = ce(both, "forward_backward", "b", &DB, 1, NULL);
        optim(both, "b", 1e-2), optim(both, "a", 1e-2);
        double la1 = ce(alone_a, "forward_backward", "a", &DA, 1, NULL);
        optim(alone_a, "a", 1e-2);
        double lb1 = ce(alone_b, "forward_backward", "b", &DB, 1, NULL);
        optim(alone_b, "b", 1e-2);
        cr_expect(memcmp(&la, &la1, sizeof la) == 0, "step %d: a %.17g alone %.17g", step, la, la1);
        cr_expect(memcmp(&lb, &lb1, sizeof lb) == 0, "step %d: b %.17g alone %.17g", step, lb, lb1);
    }
    /* training changed the adapter: the loss went down */
    double last = ce(both, "forward", "a", &DA, 1, NULL);
    cr_expect(last < first - 1e-3, "loss %.9g after training, %.9g before", last, first);
    tinker_worker_free(both), tinker_worker_free(alone_a), tinker_worker_free(alone_b);
}

/* Two forward_backward calls then one optim_step = one forward_backward of the union. */
Test(tinker_worker, gradients_accumulate_until_optim_step) {
    char metrics[256];
    test_tmp_path(metrics, sizeof metrics, "metrics.jsonl");
    struct tinker_worker *w = worker_with_metrics(metrics);
    create(w, "x", 4, 3), create(w, "y", 4, 3);
    ce(w, "forward_backward", "x", &DA, 1, NULL);
    ce(w, "forward_backward", "x", &DB, 1, NULL);
    struct td both[2] = {DA, DB};
    ce(w, "forward_backward", "y", both, 2, NULL);
    optim(w, "x", 1e-2), optim(w, "y", 1e-2);
    float lx[6], ly[6];
    double x = ce(w, "forward", "x", &DC, 1, lx), y = ce(w, "forward", "y", &DC, 1, ly);
    cr_expect(fabs(x - y) <= 1e-5 * fabs(y), "accumulated %.9g, union %.9g", x, y);
    /* and the step used them up: a forward_backward after it starts from zero again */
    double before = ce(w, "forward", "x", &DA, 1, NULL);
    ce(w, "forward_backward", "x", &DA, 1, NULL);
    optim(w, "x", 0.0); /* lr 0: no change, but the gradients are consumed */
    cr_expect_eq(ce(w, "forward", "x", &DA, 1, NULL), before);
    tinker_worker_free(w);
    /* one line per forward_backward (4) and optim_step (3), the step counting */
    FILE *f = fopen(metrics, "r");
    cr_assert(f);
    char line[1024];
    int n = 0, steps = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        cr_assert(j, "not JSON: %s", line);
        cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "tinker");
        if (strcmp(json_string_value(json_object_get(j, "op")), "optim_step") == 0) steps++;
        else cr_expect(json_object_get(json_object_get(j, "metrics"), "loss:sum"));
        if (n == 6) cr_expect_eq(json_integer_value(json_object_get(j, "step")), 2, "%s", line);
        json_decref(j);
        n++;
    }
    fclose(f);
    cr_expect_eq(n, 7);
    cr_expect_eq(steps, 3);
}

/* Every loss against its formula on the forward's own logprobs. */
static double closed(const char *loss, float lp, float q, float a, double lo, double hi, double beta) {
    double r = exp((double)lp - q);
    if (strcmp(loss, "importance_sampling") == 0) return -r * a;
    if (strcmp(loss, "ppo") == 0) return -fmin(r * a, fmin(fmax(r, lo), hi) * a);
    if (strcmp(loss, "cispo") == 0) return -fmin(fmax(r, lo), hi) * a * lp;
    return -((double)a * lp - 0.5 * beta * ((double)lp - q) * ((double)lp - q)); /* dro */
}

Test(tinker_worker, losses_match_their_closed_forms) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 5);
    float lp[7];
    double ce_loss = ce(w, "forward", "m", &DA, 1, lp), want = 0;
    for (int t = 0; t < 7; t++) want += -(double)W7[t] * lp[t];
    cr_expect(fabs(ce_loss - want) <= 1e-6 * fabs(want), "cross_entropy %.9g, closed form %.9g", ce_loss, want);
    /* sampler logprobs near the model's, advantages of both signs: clipping happens */
    float q[7], adv[7];
    for (int t = 0; t < 7; t++) q[t] = lp[t] + (t % 3 - 1) * 0.35f, adv[t] = (t % 2 ? -1.0f : 1.5f) * (t + 1) / 4;
    const char *losses[] = {"importance_sampling", "ppo", "cispo", "dro", "ppo", "cispo"};
    for (int k = 0; k < 6; k++) {
        double lo = k == 2 ? 0.0 : 0.8, hi = k == 2 ? 4.0 : 1.2, beta = 0.25; /* Tinker's defaults */
        json_t *cfg = json_object();
        if (strcmp(losses[k], "dro") == 0) json_object_set_new(cfg, "beta", json_real(beta));
        if (k >= 4) { /* custom thresholds */
            lo = 0.9, hi = 1.05;
            json_object_set_new(cfg, "clip_low_threshold", json_real(lo));
            json_object_set_new(cfg, "clip_high_threshold", json_real(hi));
        }
        struct td d = {7, TOK_A, TGT_A, q, adv};
        struct tinker_reply r = ok(w, fwd_request("forward", "m", losses[k], cfg, &d, 1));
        const float *out = r.arrays[0].data; /* logprobs [7], then elementwise_loss [7] */
        cr_assert_eq(r.arrays[0].bytes, 14 * sizeof(float));
        cr_expect(memcmp(out, lp, sizeof lp) == 0, "%s: logprobs differ from cross_entropy's forward", losses[k]);
        double sum = 0;
        for (int t = 0; t < 7; t++) {
            double l = closed(losses[k], lp[t], q[t], adv[t], lo, hi, beta);
            cr_expect(fabs(out[7 + t] - l) <= 1e-5 * fmax(1, fabs(l)), "%s token %d: %g vs %g", losses[k], t,
                      (double)out[7 + t], l);
            sum += l;
        }
        cr_expect(fabs(loss_of(&r) - sum) <= 1e-9 * fmax(1, fabs(sum)), "%s: loss:sum %.12g, closed form %.12g",
                  losses[k], loss_of(&r), sum);
        tinker_reply_free(&r);
    }
    tinker_worker_free(w);
}

/* save_weights -> a new model -> load_weights: the next steps' losses are identical. */
Test(tinker_worker, save_then_load_resumes_with_the_same_losses) {
    struct tinker_worker *w = worker_new();
    create(w, "orig", 4, 9);
    ce(w, "forward_backward", "orig", &DA, 1, NULL);
    optim(w, "orig", 1e-2);
    char path[256], sampler[256];
    test_tmp_path(path, sizeof path, "ckpt");
    test_tmp_path(sampler, sizeof sampler, "sampler");
    struct tinker_reply r = ok(w, request("save_weights", json_pack("{s:s, s:s, s:b}", "model_id", "orig", "path",
                                                                    path, "optimizer", 1)));
    tinker_reply_free(&r);
    r = ok(w, request("save_weights_for_sampler", json_pack("{s:s, s:s}", "model_id", "orig", "path", sampler)));
    tinker_reply_free(&r);
    char f[300];
    snprintf(f, sizeof f, "%s/adapter/adapter_config.json", path);
    cr_expect(access(f, R_OK) == 0);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", sampler);
    cr_expect(access(f, R_OK) == 0);
    create(w, "copy", 4, 123); /* another init: load_weights must replace it */
    r = ok(w, request("load_weights", json_pack("{s:s, s:s, s:b}", "model_id", "copy", "path", path, "optimizer", 1)));
    tinker_reply_free(&r);
    for (int step = 0; step < 2; step++) {
        double a = ce(w, "forward_backward", "orig", &DB, 1, NULL), b = ce(w, "forward_backward", "copy", &DB, 1, NULL);
        cr_expect(memcmp(&a, &b, sizeof a) == 0, "step %d: %.17g vs %.17g", step, a, b);
        optim(w, "orig", 1e-2), optim(w, "copy", 1e-2);
    }
    create(w, "rank8", 8, 1);
    refused(w, request("load_weights", json_pack("{s:s, s:s}", "model_id", "rank8", "path", path)), SMELT_EINVAL,
            "lora.rank", NULL);
    refused(w, request("save_weights", json_pack("{s:s, s:s}", "model_id", "orig", "path", "relative/dir")),
            SMELT_EINVAL, "path", NULL);
    tinker_worker_free(w);
}

/* The step recorded in a checkpoint's state.json (-1 when it cannot be read). */
static int64_t saved_step(const char *dir) {
    char p[300];
    json_t *st = NULL;
    struct smelt_error err = {0};
    snprintf(p, sizeof p, "%s/state.json", dir);
    if (json_load_path(p, &st, &err)) return -1;
    int64_t step = json_is_integer(json_object_get(st, "step")) ? json_integer_value(json_object_get(st, "step")) : -1;
    json_decref(st);
    return step;
}

/* A save onto an existing checkpoint (smeltd no longer empties it first) replaces it whole, leaving no partial copy. */
Test(tinker_worker, save_onto_an_existing_checkpoint_replaces_it) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 2);
    char path[256], partial[300];
    test_tmp_path(path, sizeof path, "ckpt");
    snprintf(partial, sizeof partial, "%s.partial", path);
    for (int step = 0; step < 2; step++) {
        ce(w, "forward_backward", "m", &DA, 1, NULL);
        optim(w, "m", 1e-2);
        if (step == 1) /* unasked, an existing checkpoint stays (two saves of one new name raced) */
            refused(w, request("save_weights", json_pack("{s:s, s:s, s:b}", "model_id", "m", "path", path,
                                                         "optimizer", 1)), SMELT_EINVAL, "path", "exists");
        struct tinker_reply r = ok(w, request("save_weights", json_pack("{s:s, s:s, s:b, s:b}", "model_id", "m",
                                                                        "path", path, "optimizer", 1, "overwrite",
                                                                        step == 1)));
        tinker_reply_free(&r);
        cr_expect_eq(saved_step(path), step + 1, "save %d: state.json says step %lld", step,
                     (long long)saved_step(path));
        cr_expect(!path_exists(partial), "save %d left %s", step, partial);
    }
    create(w, "copy", 4, 7);
    struct tinker_reply r = ok(w, request("load_weights", json_pack("{s:s, s:s, s:b}", "model_id", "copy", "path",
                                                                    path, "optimizer", 1)));
    tinker_reply_free(&r);
    tinker_worker_free(w);
}

Test(tinker_worker, bad_requests_are_refused_naming_the_field) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 1);
    /* a target list longer than the input */
    struct td d = DA;
    struct msg m = fwd_request("forward_backward", "m", "cross_entropy", NULL, &d, 1);
    json_t *tt = json_object_get(json_object_get(json_array_get(json_object_get(m.header, "data"), 0), "inputs"),
                                 "target_tokens");
    json_object_set_new(tt, "shape", json_pack("[i]", 8));
    refused(w, m, SMELT_EINVAL, "data[0].loss_fn_inputs.target_tokens", "length 8, model_input has 7 tokens");
    /* a token id outside the vocabulary (96) */
    int32_t bad[7];
    memcpy(bad, TOK_A, sizeof bad);
    bad[5] = 70000;
    d.tokens = bad;
    refused(w, fwd_request("forward", "m", "cross_entropy", NULL, &d, 1), SMELT_EINVAL, "data",
            "data[0].model_input.tokens[5]: token id 70000 outside the vocabulary (0..95)");
    d = DA;
    refused(w, fwd_request("forward", "m", "foo", NULL, &d, 1), SMELT_EINVAL, "loss_fn", "unknown \"foo\"");
    refused(w, fwd_request("forward", "x", "cross_entropy", NULL, &d, 1), SMELT_ENOTFOUND, "model_id",
            "no model \"x\" in this worker");
    /* a wrong dtype, an input the loss does not take, a non-finite weight */
    m = fwd_request("forward", "m", "cross_entropy", NULL, &d, 1);
    json_t *in = json_object_get(json_array_get(json_object_get(m.header, "data"), 0), "inputs");
    json_object_set_new(json_object_get(in, "weights"), "dtype", json_string("int64"));
    refused(w, m, SMELT_EINVAL, "data[0].loss_fn_inputs.weights", "dtype int64, expected float32");
    m = fwd_request("forward", "m", "cross_entropy", NULL, &d, 1);
    in = json_object_get(json_array_get(json_object_get(m.header, "data"), 0), "inputs");
    json_object_set_new(in, "advantages", input("float32", 7, 0));
    refused(w, m, SMELT_EINVAL, "data[0].loss_fn_inputs.advantages", "not an input of loss_fn cross_entropy");
    float wnan[7] = {1, 1, 1, NAN, 1, 1, 1};
    d.f1 = wnan;
    refused(w, fwd_request("forward", "m", "cross_entropy", NULL, &d, 1), SMELT_EINVAL, "data",
            "weights[3]: nan is not finite");
    /* the RL losses need the sampler's logprobs and advantages; dro needs beta */
    d = DA;
    d.f2 = W7;
    refused(w, fwd_request("forward", "m", "dro", NULL, &d, 1), SMELT_EINVAL, "loss_fn_config.beta", NULL);
    refused(w, fwd_request("forward", "m", "ppo", json_pack("{s:f}", "epsilon", 0.1), &d, 1), SMELT_EINVAL,
            "loss_fn_config", "\"epsilon\" is not a setting of ppo");
    /* create_model: duplicate id; lm_head until lora/ has it */
    refused(w, request("create_model", json_pack("{s:s, s:{s:i}}", "model_id", "m", "lora", "rank", 4)), SMELT_EINVAL,
            "model_id", "already exists");
    refused(w, request("create_model", json_pack("{s:s, s:{s:i}}", "model_id", "r0", "lora", "rank", 0)), SMELT_EINVAL,
            "lora.rank", NULL);
    struct tinker_reply r;
    struct smelt_error err = {0};
    struct msg u = request("create_model", json_pack("{s:s, s:{s:i, s:b, s:b}}", "model_id", "u", "lora", "rank", 2,
                                                     "train_attn", 0, "train_mlp", 0));
    if (tinker_handle(w, &u, &r, &err)) cr_expect_str_eq(err.field, "lora.train_unembed", "%s", err.message);
    else tinker_reply_free(&r);
    msg_free(&u);
    refused(w, request("launch_rockets", json_object()), SMELT_EINVAL, "op", NULL);
    refused(w, request("optim_step", json_pack("{s:s, s:{s:f}}", "model_id", "m", "adam", "learning_rate", 0.1)),
            SMELT_EINVAL, "adam.beta1", NULL);
    /* the worker still serves */
    ce(w, "forward_backward", "m", &DA, 1, NULL);
    r = ok(w, request("unload_model", json_pack("{s:s}", "model_id", "m")));
    tinker_reply_free(&r);
    refused(w, fwd_request("forward", "m", "cross_entropy", NULL, &d, 1), SMELT_ENOTFOUND, "model_id", NULL);
    tinker_worker_free(w);
}

/* The sampler's logprobs are a forward's, bit for bit (batch-invariant kernels). */
Test(tinker_worker, sampled_logprobs_equal_forward_logprobs) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 11);
    ce(w, "forward_backward", "m", &DA, 1, NULL);
    optim(w, "m", 5e-2); /* a non-zero adapter, so it matters */
    int32_t prompt[] = {1, 17, 33, 49, 65};
    struct msg m = request("sample", json_pack("{s:s, s:i, s:i, s:f, s:i, s:b}", "model_id", "m", "num_samples", 3,
                                               "max_tokens", 8, "temperature", 1.0, "seed", 5, "prompt_logprobs", 1));
    json_object_set_new(m.header, "topk_prompt_logprobs", json_integer(3));
    m.arrays[0] = (struct msg_array){dup_bytes(prompt, sizeof prompt), sizeof prompt};
    m.n_arrays = 1;
    struct tinker_reply r = ok(w, m);
    const json_t *seqs = json_object_get(r.result, "sequences");
    cr_assert_eq(json_array_size(seqs), 3);
    cr_assert_eq(r.n_arrays, 5);
    const int32_t *ids = r.arrays[0].data, *tk = r.arrays[3].data;
    const float *lps = r.arrays[1].data, *plp = r.arrays[2].data, *tkl = r.arrays[4].data;
    cr_expect(isnan(plp[0]));
    cr_assert_eq(r.arrays[3].bytes, 5 * 3 * sizeof(int32_t));
    cr_expect(tk[0] == -1 && isnan(tkl[0]));
    for (int t = 1; t < 5; t++) { /* sorted, and the prompt's own token agrees with prompt_logprobs */
        cr_expect(tkl[3 * t] >= tkl[3 * t + 1] && tkl[3 * t + 1] >= tkl[3 * t + 2]);
        cr_expect(tkl[3 * t] >= plp[t] - 1e-5f);
        for (int j = 0; j < 3; j++)
            if (tk[3 * t + j] == prompt[t]) cr_expect(fabsf(tkl[3 * t + j] - plp[t]) < 1e-5f, "position %d", t);
    }
    int64_t off = 0;
    for (size_t s = 0; s < 3; s++) {
        int n = (int)json_integer_value(json_object_get(json_array_get(seqs, s), "n_tokens"));
        const char *why = json_string_value(json_object_get(json_array_get(seqs, s), "stop_reason"));
        cr_expect(strcmp(why, "length") == 0 ? n == 8 : strcmp(why, "stop") == 0, "%s after %d tokens", why, n);
        /* forward of prompt + completion: input full[:-1], targets full[1:] */
        int32_t full[13], tok[12], tgt[12];
        float wts[12], lp[12];
        memcpy(full, prompt, sizeof prompt);
        memcpy(full + 5, ids + off, (size_t)n * 4);
        int T = 5 + n - 1;
        for (int t = 0; t < T; t++) tok[t] = full[t], tgt[t] = full[t + 1], wts[t] = 1;
        struct td d = {T, tok, tgt, wts, NULL};
        ce(w, "forward", "m", &d, 1, lp);
        cr_expect(memcmp(lp + 4, lps + off, (size_t)n * 4) == 0, "sample %zu: sampled logprobs differ from the "
                  "forward's (first: %.9g vs %.9g)", s, (double)lps[off], (double)lp[4]);
        cr_expect(memcmp(lp, plp + 1, 4 * sizeof(float)) == 0, "prompt logprobs differ from the forward's");
        off += n;
    }
    tinker_reply_free(&r);
    tinker_worker_free(w);
}

/* A sample request: model (NULL: the base), 2 samples of 8 tokens at temperature 1. */
static struct msg sample_msg(const char *model, int seed, int first_token, bool prompt_lps) {
    json_t *h = json_pack("{s:i, s:i, s:f, s:i, s:b}", "num_samples", 2, "max_tokens", 8, "temperature", 1.0,
                          "seed", seed, "prompt_logprobs", prompt_lps);
    if (model) json_object_set_new(h, "model_id", json_string(model));
    int32_t prompt[] = {first_token, 17, 33, 49, 65, 3};
    struct msg m = request("sample", h);
    m.arrays[0] = (struct msg_array){dup_bytes(prompt, sizeof prompt), sizeof prompt};
    m.n_arrays = 1;
    return m;
}

Test(tinker_worker, samples_of_four_models_batched_equal_each_alone) {
    struct tinker_worker *w = worker_new();
    const char *ids[4] = {"m0", "m1", "m2", "m3"};
    const struct td *data[4] = {&DA, &DB, &DC, &DA};
    for (int i = 0; i < 4; i++) {
        create(w, ids[i], 4 + 4 * (i % 2), 20 + i);
        ce(w, "forward_backward", ids[i], data[i], 1, NULL);
        optim(w, ids[i], 5e-2 * (i + 1)); /* four different non-zero adapters */
    }
    /* The four models and the base, all with the same prompt and seed: only the adapter differs. */
    enum { N = 5 };
    struct msg reqs[N];
    const struct msg *ptrs[N];
    for (int i = 0; i < N; i++) reqs[i] = sample_msg(i < 4 ? ids[i] : NULL, 9, 1, i == 2), ptrs[i] = &reqs[i];
    struct tinker_reply outs[N];
    int rcs[N];
    struct smelt_error errs[N];
    memset(errs, 0, sizeof errs);
    TEST_OK(tinker_sample_batch(w, ptrs, N, outs, rcs, errs), &errs[0]);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(rcs[i], 0, "request %d: %s", i, errs[i].message);
        struct tinker_reply alone = ok(w, sample_msg(i < 4 ? ids[i] : NULL, 9, 1, i == 2));
        cr_assert_eq(alone.n_arrays, outs[i].n_arrays, "request %d", i);
        char *a = json_dumps(alone.result, JSON_SORT_KEYS), *b = json_dumps(outs[i].result, JSON_SORT_KEYS);
        cr_expect_str_eq(a, b, "request %d: sequences differ", i);
        free(a), free(b);
        for (int k = 0; k < alone.n_arrays; k++)
            cr_expect(alone.arrays[k].bytes == outs[i].arrays[k].bytes &&
                          memcmp(alone.arrays[k].data, outs[i].arrays[k].data, alone.arrays[k].bytes) == 0,
                      "request %d frame %d: batched differs from alone", i, k + 2);
        tinker_reply_free(&alone);
    }
    /* Each adapter shows: the first sampled logprob differs from the base's. */
    for (int i = 0; i < 4; i++)
        cr_expect(memcmp(outs[i].arrays[1].data, outs[4].arrays[1].data, sizeof(float)) != 0, "model %d = base", i);
    for (int i = 0; i < N; i++) tinker_reply_free(&outs[i]), msg_free(&reqs[i]);
    tinker_worker_free(w);
}

Test(tinker_worker, a_bad_request_in_a_batch_fails_alone) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 11);
    struct msg reqs[3] = {sample_msg("m", 1, 1, false), sample_msg("nobody", 1, 1, false),
                          fwd_request("forward", "m", "cross_entropy", NULL, &DA, 1)};
    const struct msg *ptrs[3] = {&reqs[0], &reqs[1], &reqs[2]};
    struct tinker_reply outs[3];
    int rcs[3];
    struct smelt_error errs[3];
    memset(errs, 0, sizeof errs);
    TEST_OK(tinker_sample_batch(w, ptrs, 3, outs, rcs, errs), &errs[0]);
    cr_expect_eq(rcs[0], 0, "%s", errs[0].message);
    cr_expect_eq(rcs[1], SMELT_ENOTFOUND, "%s", errs[1].message);
    cr_expect_str_eq(errs[1].field, "model_id");
    cr_expect_eq(rcs[2], SMELT_EINVAL, "%s", errs[2].message);
    cr_expect_str_eq(errs[2].field, "op");
    cr_expect_eq(outs[1].n_arrays, 0);
    for (int i = 0; i < 3; i++) tinker_reply_free(&outs[i]), msg_free(&reqs[i]);
    tinker_worker_free(w);
}

/* prompt_logprobs alone (no top-k), as the SDK's compute_logprobs asks: a forward's logprobs
 * after the first position's none. */
Test(tinker_worker, prompt_logprobs_without_topk) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 12);
    int32_t prompt[] = {1, 17, 33, 49, 65};
    struct msg m = request("sample", json_pack("{s:s, s:i, s:i, s:b}", "model_id", "m", "num_samples", 1,
                                               "max_tokens", 1, "prompt_logprobs", 1));
    m.arrays[0] = (struct msg_array){dup_bytes(prompt, sizeof prompt), sizeof prompt};
    m.n_arrays = 1;
    struct tinker_reply r = ok(w, m);
    cr_assert_eq(r.n_arrays, 3);
    const float *plp = r.arrays[2].data;
    cr_assert_eq(r.arrays[2].bytes, 5 * sizeof(float));
    cr_expect(isnan(plp[0]));
    int32_t tok[4] = {1, 17, 33, 49}, tgt[4] = {17, 33, 49, 65};
    float wts[4] = {1, 1, 1, 1}, lp[4];
    struct td d = {4, tok, tgt, wts, NULL};
    ce(w, "forward", "m", &d, 1, lp);
    cr_expect(memcmp(lp, plp + 1, sizeof lp) == 0, "prompt logprobs differ from the forward's");
    tinker_reply_free(&r);
    tinker_worker_free(w);
}

/* ---- the ZeroMQ loop ---- */

struct served {
    struct tinker_worker *w;
    void *dealer;
    atomic_int stop;
    int rc;
};

static void *serve_thread(void *p) {
    struct served *s = p;
    struct smelt_error err = {0};
    s->rc = tinker_serve(s->w, s->dealer, "job-1", 2, &s->stop, &err);
    return NULL;
}

/* The next message on router that is not a hello. */
static struct msg next_result(void *router) {
    for (;;) {
        struct msg m = {0};
        struct smelt_error err = {0};
        TEST_OK(msg_recv(router, true, 10000, &m, &err), &err);
        if (strcmp(m.type, MSG_TINKER_HELLO) != 0) {
            cr_assert_str_eq(m.type, MSG_TINKER_RESULT);
            return m;
        }
        msg_free(&m);
    }
}

static struct msg roundtrip(void *router, const struct msg *hello, struct msg req) {
    struct smelt_error err = {0};
    TEST_OK(msg_send(router, hello->route, hello->route_len, req.type, req.header, req.arrays, req.n_arrays, &err),
            &err);
    msg_free(&req);
    return next_result(router);
}

Test(tinker_worker, zeromq_loop_answers_and_survives_garbage) {
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    cr_assert(router);
    cr_assert_eq(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    cr_assert_eq(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    struct served s = {.w = worker_new(), .dealer = zmq_socket(ctx, ZMQ_DEALER)};
    cr_assert_eq(zmq_setsockopt(s.dealer, ZMQ_ROUTING_ID, "job-1.2", 7), 0);
    cr_assert_eq(zmq_connect(s.dealer, ep), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, serve_thread, &s), 0);
    struct msg hello = {0};
    struct smelt_error err = {0};
    TEST_OK(msg_recv(router, true, 10000, &hello, &err), &err);
    cr_assert_str_eq(hello.type, MSG_TINKER_HELLO);
    cr_expect_str_eq(json_string_value(json_object_get(hello.header, "job_id")), "job-1");
    cr_expect_eq(json_integer_value(json_object_get(hello.header, "attempt")), 2);
    cr_expect_eq(json_integer_value(json_object_get(hello.header, "vocab_size")), 96);
    cr_expect_eq(hello.route_len, 7);

    struct msg res = roundtrip(router, &hello, request("create_model", json_pack("{s:s, s:{s:i, s:b}}", "model_id",
                                                                                 "m", "lora", "rank", 2,
                                                                                 "train_unembed", 0)));
    cr_expect(json_is_true(json_object_get(res.header, "ok")));
    cr_expect_str_eq(json_string_value(json_object_get(res.header, "id")), "req");
    msg_free(&res);
    res = roundtrip(router, &hello, fwd_request("forward_backward", "m", "cross_entropy", NULL, &DA, 1));
    cr_expect(json_is_true(json_object_get(res.header, "ok")));
    cr_expect_eq(res.n_arrays, 1);
    cr_expect_eq(res.arrays[0].bytes, 14 * sizeof(float));
    msg_free(&res);
    /* garbage: a header that is not JSON, then a type the worker does not take */
    zmq_send(router, hello.route, hello.route_len, ZMQ_SNDMORE);
    zmq_send(router, MSG_TINKER_REQUEST, strlen(MSG_TINKER_REQUEST), ZMQ_SNDMORE);
    zmq_send(router, "{not json", 9, 0);
    res = next_result(router);
    cr_expect(json_is_false(json_object_get(res.header, "ok")));
    cr_expect(json_is_null(json_object_get(res.header, "id")));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res.header, "error"), "category")), "user");
    msg_free(&res);
    struct msg other = request("forward", json_object());
    snprintf(other.type, sizeof other.type, "gen.request");
    res = roundtrip(router, &hello, other);
    cr_expect(json_is_false(json_object_get(res.header, "ok")));
    msg_free(&res);
    /* still serving */
    res = roundtrip(router, &hello, request("optim_step", json_pack("{s:s, s:{s:f, s:f, s:f, s:f, s:f, s:f}}",
        "model_id", "m", "adam", "learning_rate", 1e-3, "beta1", 0.9, "beta2", 0.95, "eps", 1e-12, "weight_decay", 0.0,
        "grad_clip_norm", 0.0)));
    cr_expect(json_is_true(json_object_get(res.header, "ok")), "%s", json_dumps(res.header, 0));
    msg_free(&res);
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    cr_expect_eq(s.rc, 0);
    msg_free(&hello);
    zmq_close(s.dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
    tinker_worker_free(s.w);
}

/* Requests sent back to back: the samples waiting together run as one batch, a request
 * of another op ends the batch and runs after it, every result comes in order and each
 * sample's equals what the request gives alone. */
Test(tinker_worker, zeromq_loop_batches_waiting_samples_in_order) {
    void *ctx = zmq_ctx_new(), *router = zmq_socket(ctx, ZMQ_ROUTER);
    cr_assert(router);
    cr_assert_eq(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t len = sizeof ep;
    cr_assert_eq(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    struct served s = {.w = worker_new(), .dealer = zmq_socket(ctx, ZMQ_DEALER)};
    create(s.w, "a", 4, 1), create(s.w, "b", 8, 2);
    ce(s.w, "forward_backward", "a", &DA, 1, NULL), optim(s.w, "a", 5e-2);
    ce(s.w, "forward_backward", "b", &DB, 1, NULL), optim(s.w, "b", 5e-2);
    cr_assert_eq(zmq_setsockopt(s.dealer, ZMQ_ROUTING_ID, "job-1.2", 7), 0);
    cr_assert_eq(zmq_connect(s.dealer, ep), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, serve_thread, &s), 0);
    struct msg hello = {0};
    struct smelt_error err = {0};
    TEST_OK(msg_recv(router, true, 10000, &hello, &err), &err);
    /* a forward_backward first keeps the worker busy while the rest queue up */
    enum { N = 7 };
    const char *ids[N] = {"fb", "s0", "s1", "s2", "f", "s3", "s4"};
    const char *model[N] = {"a", "a", "b", NULL, "b", "b", "a"};
    for (int i = 0; i < N; i++) {
        struct msg q = ids[i][0] == 's' ? sample_msg(model[i], 30 + i, 2 + i, false)
                                        : fwd_request(i ? "forward" : "forward_backward", model[i], "cross_entropy",
                                                      NULL, &DA, 1);
        json_object_set_new(q.header, "id", json_string(ids[i]));
        TEST_OK(msg_send(router, hello.route, hello.route_len, q.type, q.header, q.arrays, q.n_arrays, &err), &err);
        msg_free(&q);
    }
    struct msg res[N];
    for (int i = 0; i < N; i++) {
        res[i] = next_result(router);
        cr_expect_str_eq(json_string_value(json_object_get(res[i].header, "id")), ids[i], "result %d out of order", i);
        cr_expect(json_is_true(json_object_get(res[i].header, "ok")), "%s", json_dumps(res[i].header, 0));
    }
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    cr_expect_eq(s.rc, 0);
    for (int i = 0; i < N; i++) {
        if (ids[i][0] == 's') {
            struct tinker_reply alone = ok(s.w, sample_msg(model[i], 30 + i, 2 + i, false));
            cr_assert_eq(alone.n_arrays, res[i].n_arrays);
            for (int k = 0; k < alone.n_arrays; k++)
                cr_expect(alone.arrays[k].bytes == res[i].arrays[k].bytes &&
                              memcmp(alone.arrays[k].data, res[i].arrays[k].data, alone.arrays[k].bytes) == 0,
                          "%s frame %d differs from the request alone", ids[i], k + 2);
            tinker_reply_free(&alone);
        }
        msg_free(&res[i]);
    }
    msg_free(&hello);
    zmq_close(s.dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
    tinker_worker_free(s.w);
}

/* A sampler checkpoint's adapter from its path (as smeltd sends it), seed 9. */
static struct tinker_reply sample_path(struct tinker_worker *w, const char *path) {
    struct msg m = sample_msg(NULL, 9, 1, false);
    json_object_set_new(m.header, "adapter_path", json_string(path));
    return ok(w, m);
}

static int cached_adapters(const struct tinker_worker *w) {
    int n = 0;
    for (const struct tinker_cached_adapter *a = w->adapters; a; a = a->next) n++;
    return n;
}

/* An RL loop saves a sampler checkpoint every iteration: the worker keeps only the most
 * recently used ones; a checkpoint written again under the same path is loaded again. */
Test(tinker_worker, sampler_adapters_cached_bounded_and_reloaded_when_rewritten) {
    struct tinker_worker *w = worker_new();
    create(w, "m", 4, 13);
    char paths[TINKER_CACHED_ADAPTERS + 2][256];
    for (int i = 0; i < TINKER_CACHED_ADAPTERS + 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "sampler-%d", i);
        test_tmp_path(paths[i], sizeof paths[i], name);
        struct tinker_reply r = ok(w, request("save_weights_for_sampler", json_pack("{s:s, s:s}", "model_id", "m",
                                                                                    "path", paths[i])));
        tinker_reply_free(&r);
        r = sample_path(w, paths[i]);
        tinker_reply_free(&r);
        cr_expect_leq(cached_adapters(w), TINKER_CACHED_ADAPTERS, "after %d checkpoints", i + 1);
    }
    struct tinker_reply before = sample_path(w, paths[0]);
    ce(w, "forward_backward", "m", &DA, 1, NULL);
    optim(w, "m", 5e-2);
    struct smelt_error err = {0};
    TEST_OK(dir_remove_all(paths[0], &err), &err); /* smeltd clears an overwritten checkpoint's directory */
    struct tinker_reply r = ok(w, request("save_weights_for_sampler", json_pack("{s:s, s:s}", "model_id", "m", "path",
                                                                                paths[0])));
    tinker_reply_free(&r);
    struct tinker_reply after = sample_path(w, paths[0]);
    cr_expect(memcmp(before.arrays[1].data, after.arrays[1].data, sizeof(float)) != 0,
              "the rewritten checkpoint's new weights were not used");
    tinker_reply_free(&before), tinker_reply_free(&after);
    tinker_worker_free(w);
}

/* The reference: k passes over the row, each taking the best id not taken yet (ties: the lower id). */
static void topk_brute(const float *row, int64_t V, int64_t k, int32_t *ids) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t v = 0; v < V; v++) {
            bool taken = false;
            for (int64_t i = 0; i < j && !taken; i++) taken = ids[i] == v;
            if (!taken && (best < 0 || row[v] > row[best])) best = v;
        }
        ids[j] = (int32_t)best;
    }
}

Test(tinker_worker, row_topk_matches_a_brute_force_reference_with_ties) {
    srand(25);
    float row[300];
    int32_t got[24], want[24];
    float lps[24];
    for (int trial = 0; trial < 400; trial++) {
        int64_t V = 1 + rand() % 300, k = 1 + rand() % 20;
        int levels = 1 + rand() % 8; /* few distinct values: many ties */
        for (int64_t v = 0; v < V; v++) row[v] = (float)(rand() % levels) * 0.5f - 1.0f;
        tinker_row_topk(row, V, k, got, lps);
        int64_t kept = k < V ? k : V;
        topk_brute(row, V, kept, want);
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
        for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        for (int64_t j = 0; j < kept; j++) {
            cr_assert_eq(got[j], want[j], "trial %d (V %lld, k %lld): place %lld is id %d, not %d", trial,
                         (long long)V, (long long)k, (long long)j, got[j], want[j]);
            cr_assert_eq(lps[j], (float)((double)row[want[j]] - (mx + log(sum))));
        }
        for (int64_t j = kept; j < k; j++) cr_assert(got[j] == -1 && isnan(lps[j]), "k past V: id %d", got[j]);
    }
}
