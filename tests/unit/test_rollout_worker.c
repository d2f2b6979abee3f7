/* rollout/worker.c: the serve loop on a thread behind an inproc ROUTER, a DEALER client
 * in the test. Results equal the engine's (greedy, seeded n > 1, with a LoRA adapter);
 * refused requests name the field and the worker goes on; abort; health and stats; text
 * prompts and stop strings with a tokenizer; a vanished client; stopping with requests in
 * flight. Messages the worker must see before its first step are queued before its
 * thread starts, so what it does with them does not depend on timing. */
#include "tests/unit/rollout_testutil.h"

#include <pthread.h>
#include <unistd.h>
#include <zmq.h>

#include "common/msg.h"
#include "lora/lora.h"

#define ENDPOINT "inproc://rollout-worker"

struct harness {
    void *ctx, *router, *client;
    struct model *model;
    const struct tokenizer *tok;
    struct rollout_engine *engine;
    pthread_t thread;
    atomic_int stop;  /* set by the test's thread, read by serve's */
    bool running;
    int rc;
    struct smelt_error err;
};

static void *serve_main(void *arg) {
    struct harness *h = arg;
    h->rc = rollout_worker_serve(h->engine, h->model, h->tok, h->router, &h->stop, &h->err);
    return NULL;
}

static void *connect_client(struct harness *h) {
    void *s = zmq_socket(h->ctx, ZMQ_DEALER);
    int zero = 0;
    cr_assert(s && zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_connect(s, ENDPOINT), 0, "connect: %s", zmq_strerror(zmq_errno()));
    return s;
}

/* A worker (not started) on m whose KV pool holds kv_tokens tokens, and one client. */
static void harness_init(struct harness *h, struct model *m, const struct tokenizer *tok, int64_t kv_tokens,
                         int max_seqs) {
    memset(h, 0, sizeof *h);
    h->model = m;
    h->tok = tok;
    h->engine = rollout_test_engine(m, tok, kv_tokens, 256, max_seqs, 256);
    h->ctx = zmq_ctx_new();
    cr_assert(h->ctx);
    h->router = zmq_socket(h->ctx, ZMQ_ROUTER);
    int zero = 0;
    cr_assert(h->router && zmq_setsockopt(h->router, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_bind(h->router, ENDPOINT), 0, "bind: %s", zmq_strerror(zmq_errno()));
    h->client = connect_client(h);
}

static void harness_start(struct harness *h) {
    cr_assert_eq(pthread_create(&h->thread, NULL, serve_main, h), 0);
    h->running = true;
}

static void harness_stop(struct harness *h) {
    if (!h->running) return;
    atomic_store(&h->stop, 1);
    cr_assert_eq(pthread_join(h->thread, NULL), 0);
    h->running = false;
    cr_expect_eq(h->rc, 0, "rollout_worker_serve failed: %s", h->err.message);
}

static void harness_free(struct harness *h) {
    harness_stop(h);
    if (h->client) zmq_close(h->client);
    zmq_close(h->router);
    zmq_ctx_term(h->ctx);
    rollout_engine_free(h->engine);
}

/* ---- messages ---- */

/* Sends type with a header written as JSON (msg_send adds "v" when it is missing) and,
 * when frame is not NULL, one array frame of frame_bytes. */
static void send_json(void *s, const char *type, const char *header, const void *frame, size_t frame_bytes) {
    json_error_t jerr;
    json_t *h = json_loads(header, 0, &jerr);
    cr_assert(h, "test header %s: %s", header, jerr.text);
    struct msg_array a = {(void *)(frame ? frame : ""), frame_bytes};
    struct smelt_error err = {0};
    TEST_OK(msg_send(s, NULL, 0, type, h, &a, frame ? 1 : 0, &err), &err);
    json_decref(h);
}

/* Frames exactly as given (a header msg_send would fix, or no JSON at all). */
static void send_raw(void *s, const char *type, const char *header) {
    cr_assert(zmq_send(s, type, strlen(type), ZMQ_SNDMORE) >= 0);
    cr_assert(zmq_send(s, header, strlen(header), 0) >= 0);
}

static void recv_msg(void *s, struct msg *m) {
    struct smelt_error err = {0};
    int rc = msg_recv(s, false, 10000, m, &err);
    cr_assert_eq(rc, 0, "no message from the worker: %s", err.message);
    cr_expect_eq(json_integer_value(json_object_get(m->header, "v")), MSG_VERSION);
}

static const char *str_field(const struct msg *m, const char *key) {
    return json_string_value(json_object_get(m->header, key));
}

static int64_t int_field(const struct msg *m, const char *key) {
    json_t *v = json_object_get(m->header, key);
    cr_assert(json_is_integer(v), "%s: no integer field %s", m->type, key);
    return json_integer_value(v);
}

/* Receives the next message, which must be type. */
static void expect_msg(void *s, const char *type, struct msg *m) {
    recv_msg(s, m);
    char *h = json_dumps(m->header, JSON_COMPACT);
    cr_assert_str_eq(m->type, type, "expected %s, got %s %s", type, m->type, h);
    free(h);
}

/* The next message is gen.error for id (NULL: the reply has no id) naming field. */
static void expect_refusal(void *s, const char *id, const char *field, const char *what) {
    struct msg m;
    recv_msg(s, &m);
    char *h = json_dumps(m.header, JSON_COMPACT);
    cr_expect_str_eq(m.type, MSG_GEN_ERROR, "%s: expected gen.error, got %s %s", what, m.type, h);
    json_t *e = json_object_get(m.header, "error");
    const char *got_field = json_string_value(json_object_get(e, "field"));
    const char *message = json_string_value(json_object_get(e, "message"));
    cr_expect(got_field && strcmp(got_field, field) == 0, "%s: field should be %s: %s", what, field, h);
    cr_expect(message && message[0], "%s: no message: %s", what, h);
    if (id) cr_expect(str_field(&m, "id") && strcmp(str_field(&m, "id"), id) == 0, "%s: id should be %s: %s", what, id, h);
    else cr_expect(!json_object_get(m.header, "id"), "%s: an id where none could be read: %s", what, h);
    free(h);
    msg_free(&m);
}

/* A gen.result is the engine's result r: tokens, logprobs (bit for bit), finish reason. */
static void expect_same_result(const struct msg *m, const struct rollout_result *r, const char *what) {
    cr_assert_str_eq(m->type, MSG_GEN_RESULT);
    cr_assert_eq(m->n_arrays, 2, "%s: %d array frames", what, m->n_arrays);
    int64_t n = int_field(m, "n_tokens");
    cr_expect_eq(n, r->n, "%s: %lld tokens, the engine %lld", what, (long long)n, (long long)r->n);
    cr_assert_eq(m->arrays[0].bytes, (size_t)n * 4, "%s: ids frame of %zu bytes", what, m->arrays[0].bytes);
    cr_assert_eq(m->arrays[1].bytes, (size_t)n * 4, "%s: logprobs frame of %zu bytes", what, m->arrays[1].bytes);
    if (n == r->n) {
        cr_expect_eq(memcmp(m->arrays[0].data, r->ids, (size_t)n * 4), 0, "%s: tokens differ from the engine's", what);
        cr_expect_eq(memcmp(m->arrays[1].data, r->logprobs, (size_t)n * 4), 0, "%s: logprobs differ", what);
    }
    cr_expect_str_eq(str_field(m, "finish_reason"), r->finish_reason, "%s", what);
    cr_expect_eq(int_field(m, "policy_version"), r->policy_version, "%s", what);
}

/* The request the worker builds by default: the model's eos ids stop a sample. */
static struct rollout_request engine_request(const struct model *m, uint64_t id, const int32_t *prompt, int64_t n,
                                             int samples, float temperature, uint64_t seed, int64_t max_new) {
    struct rollout_request r = {.id = id, .prompt = prompt, .n_prompt = n, .n = samples,
                                .sampling = {.temperature = temperature, .top_p = 1}, .seed = seed,
                                .max_new_tokens = max_new};
    for (int i = 0; i < m->config.n_eos_token_ids; i++) r.stop_ids[r.n_stop_ids++] = (int32_t)m->config.eos_token_ids[i];
    return r;
}

/* ---- tests ---- */

Test(rollout_worker, greedy_results_equal_the_engine) {
    struct model *m = rollout_test_load("llama");
    int64_t V = m->config.vocab_size, lens[3] = {5, 17, 33};
    int32_t prompts[3][40];
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    for (int i = 0; i < 3; i++) {
        rollout_test_prompt(prompts[i], lens[i], i, V);
        char header[128];
        snprintf(header, sizeof header, "{\"id\": \"p%d\", \"max_new_tokens\": 20, \"temperature\": 0}", i);
        send_json(h.client, MSG_GEN_REQUEST, header, prompts[i], (size_t)lens[i] * 4);
    }
    harness_start(&h);
    struct msg got[3];
    bool have[3] = {false};
    for (int k = 0; k < 3; k++) {
        struct msg m1;
        expect_msg(h.client, MSG_GEN_RESULT, &m1);
        int i = -1;
        sscanf(str_field(&m1, "id"), "p%d", &i);
        cr_assert(i >= 0 && i < 3 && !have[i], "unexpected result for %s", str_field(&m1, "id"));
        cr_expect_eq(int_field(&m1, "index"), 0);
        cr_expect(!json_object_get(m1.header, "text"), "text without a tokenizer");
        got[i] = m1;
        have[i] = true;
    }
    harness_stop(&h);

    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 16, 256);
    struct smelt_error err = {0};
    for (int i = 0; i < 3; i++) {
        struct rollout_request r = engine_request(m, (uint64_t)i, prompts[i], lens[i], 1, 0, 0, 20);
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
    struct rollout_test_collected *c = rollout_test_run_all(e);
    for (int i = 0; i < 3; i++) {
        char what[32];
        snprintf(what, sizeof what, "prompt %d", i);
        cr_assert(c->have[i][0]);
        expect_same_result(&got[i], &c->r[i][0], what);
        msg_free(&got[i]);
    }
    rollout_test_free_collected(c);
    rollout_engine_free(e);
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, seeded_samples_arrive_with_their_indexes) {
    struct model *m = rollout_test_load("qwen2");
    int32_t prompt[9];
    rollout_test_prompt(prompt, 9, 4, m->config.vocab_size);
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"s\", \"n\": 4, \"seed\": 11, \"temperature\": 1, \"max_new_tokens\": 12}",
              prompt, sizeof prompt);
    harness_start(&h);
    struct msg got[4];
    bool have[4] = {false};
    for (int k = 0; k < 4; k++) {
        struct msg m1;
        expect_msg(h.client, MSG_GEN_RESULT, &m1);
        cr_assert_str_eq(str_field(&m1, "id"), "s");
        int64_t i = int_field(&m1, "index");
        cr_assert(i >= 0 && i < 4 && !have[i], "index %lld twice or out of range", (long long)i);
        got[i] = m1;
        have[i] = true;
    }
    harness_stop(&h);

    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 16, 256);
    struct smelt_error err = {0};
    struct rollout_request r = engine_request(m, 0, prompt, 9, 4, 1, 11, 12);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *c = rollout_test_run_all(e);
    for (int i = 0; i < 4; i++) {
        char what[32];
        snprintf(what, sizeof what, "sample %d", i);
        expect_same_result(&got[i], &c->r[0][i], what);
        msg_free(&got[i]);
    }
    rollout_test_free_collected(c);
    rollout_engine_free(e);
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, bad_requests_are_refused_naming_the_field) {
    struct model *m = rollout_test_load("llama"); /* vocab 96, context 64, no tokenizer */
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    int32_t ids[64], bad_id[3] = {1, 96, 2};
    rollout_test_prompt(ids, 64, 1, m->config.vocab_size);
    /* A request in flight and the same id again from the same client, then its abort. */
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"busy\", \"max_new_tokens\": 40, \"ignore_eos\": true}", ids, 16);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"busy\"}", ids, 16);
    send_json(h.client, MSG_GEN_ABORT, "{\"id\": \"busy\"}", NULL, 0);
    harness_start(&h);
    expect_refusal(h.client, "busy", "id", "duplicate id in flight");
    struct msg aborted;
    expect_msg(h.client, MSG_GEN_RESULT, &aborted);
    cr_expect_str_eq(str_field(&aborted, "finish_reason"), "abort");
    msg_free(&aborted);

    struct {
        const char *header;
        const void *frame;
        size_t bytes;
        const char *id, *field, *what;
    } cases[] = {
        {"{\"id\": \"b1\", \"bogus\": 1}", ids, 16, "b1", "bogus", "unknown field"},
        {"{\"id\": \"b2\", \"n\": \"2\"}", ids, 16, "b2", "n", "n of the wrong type"},
        {"{\"id\": \"b3\", \"n\": 0}", ids, 16, "b3", "n", "n = 0"},
        {"{\"id\": \"b4\", \"n\": 257}", ids, 16, "b4", "n", "n = 257"},
        {"{\"id\": \"b5\", \"top_p\": 1.5}", ids, 16, "b5", "top_p", "top_p > 1"},
        {"{\"id\": \"b6\", \"top_p\": 0}", ids, 16, "b6", "top_p", "top_p = 0"},
        {"{\"id\": \"b7\", \"temperature\": -0.5}", ids, 16, "b7", "temperature", "temperature < 0"},
        {"{\"id\": \"b8\", \"prompt\": \"hi\"}", NULL, 0, "b8", "prompt", "text prompt without a tokenizer"},
        {"{\"id\": \"b9\", \"prompt\": \"hi\"}", ids, 16, "b9", "prompt", "text and ids"},
        {"{\"id\": \"b10\"}", NULL, 0, "b10", "prompt", "neither text nor ids"},
        {"{\"id\": \"b11\"}", ids, 7, "b11", "prompt", "ids frame of 7 bytes"},
        {"{\"id\": \"b12\"}", ids, 0, "b12", "prompt", "empty ids frame"},
        {"{\"id\": \"b13\"}", ids, 64 * 4, "b13", "prompt", "prompt as long as the context"},
        {"{\"id\": \"b14\"}", bad_id, sizeof bad_id, "b14", "prompt", "token id outside the vocabulary"},
        {"{\"id\": \"b15\", \"stop_token_ids\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", ids, 16, "b15",
         "stop_token_ids", "17 stop ids"},
        {"{\"id\": \"b16\", \"stop_token_ids\": [96]}", ids, 16, "b16", "stop_token_ids", "stop id outside the vocabulary"},
        {"{\"id\": \"b17\", \"stop\": [\"a\"]}", ids, 16, "b17", "stop", "stop strings without a tokenizer"},
        {"{\"id\": \"b18\", \"max_new_tokens\": 0}", ids, 16, "b18", "max_new_tokens", "max_new_tokens = 0"},
        {"{\"id\": \"b19\", \"min_p\": 1}", ids, 16, "b19", "min_p", "min_p = 1"},
        {"{\"id\": \"b20\", \"seed\": -1}", ids, 16, "b20", "seed", "negative seed"},
        {"{\"id\": \"b21\", \"ignore_eos\": 1}", ids, 16, "b21", "ignore_eos", "ignore_eos not a bool"},
        {"{\"id\": \"b22\", \"v\": 2}", ids, 16, "b22", "v", "protocol version 2"},
        /* an unknown empty key is named as itself: "" (null would mean the engine's fault) */
        {"{\"id\": \"b23\", \"\": 1}", ids, 16, "b23", "", "unknown empty key"},
        {"{\"id\": \"\"}", ids, 16, NULL, "id", "empty id"},
        {"{\"n\": 1}", ids, 16, NULL, "id", "no id"},
        {"{\"id\": 7}", ids, 16, NULL, "id", "id not a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        send_json(h.client, MSG_GEN_REQUEST, cases[i].header, cases[i].frame, cases[i].bytes);
        expect_refusal(h.client, cases[i].id, cases[i].field, cases[i].what);
    }
    send_raw(h.client, MSG_GEN_REQUEST, "{\"id\": \"r1\"}");
    expect_refusal(h.client, "r1", "v", "no protocol version");
    send_raw(h.client, MSG_GEN_REQUEST, "{\"id\": ");
    expect_refusal(h.client, NULL, "header", "header not JSON");
    send_raw(h.client, "gen.bogus", "{\"v\": 1}");
    expect_refusal(h.client, NULL, "type", "unknown message type");
    send_json(h.client, MSG_GEN_ABORT, "{\"id\": \"busy\", \"why\": 1}", NULL, 0);
    expect_refusal(h.client, "busy", "why", "gen.abort with an unknown field");
    send_json(h.client, MSG_GEN_ABORT, "{\"id\": \"busy\", \"\": 1}", NULL, 0);
    expect_refusal(h.client, "busy", "", "gen.abort with an unknown empty key");

    /* The worker still serves. */
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"good\", \"max_new_tokens\": 3}", ids, 16);
    struct msg good;
    expect_msg(h.client, MSG_GEN_RESULT, &good);
    cr_expect_str_eq(str_field(&good, "id"), "good");
    msg_free(&good);
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, requests_that_cannot_fit_the_cache_are_refused) {
    struct model *m = rollout_test_load("llama");
    struct harness h;
    harness_init(&h, m, NULL, 32, 4); /* two blocks of 16 tokens */
    int32_t ids[40];
    rollout_test_prompt(ids, 40, 2, m->config.vocab_size);
    harness_start(&h);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"long\", \"max_new_tokens\": 40}", ids, 10 * 4);
    expect_refusal(h.client, "long", "max_new_tokens", "prompt plus max_new_tokens beyond the cache");
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"big\", \"max_new_tokens\": 1}", ids, 40 * 4);
    expect_refusal(h.client, "big", "prompt", "prompt beyond the cache");
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"fits\", \"max_new_tokens\": 22, \"ignore_eos\": true}", ids, 10 * 4);
    struct msg r;
    expect_msg(h.client, MSG_GEN_RESULT, &r);
    cr_expect_eq(int_field(&r, "n_tokens"), 22);
    msg_free(&r);
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, abort_ends_every_sample) {
    struct model *m = rollout_test_load("llama");
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    int32_t ids[6];
    rollout_test_prompt(ids, 6, 3, m->config.vocab_size);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"a\", \"n\": 3, \"max_new_tokens\": 40}", ids, sizeof ids);
    send_json(h.client, MSG_GEN_ABORT, "{\"id\": \"a\"}", NULL, 0);
    send_json(h.client, MSG_GEN_ABORT, "{\"id\": \"not-in-flight\"}", NULL, 0); /* ignored, no reply */
    send_json(h.client, MSG_STATS_REQUEST, "{}", NULL, 0);
    harness_start(&h);
    bool have[3] = {false};
    for (int k = 0; k < 3; k++) {
        struct msg r;
        expect_msg(h.client, MSG_GEN_RESULT, &r);
        cr_expect_str_eq(str_field(&r, "id"), "a");
        cr_expect_str_eq(str_field(&r, "finish_reason"), "abort");
        int64_t i = int_field(&r, "index");
        cr_assert(i >= 0 && i < 3 && !have[i], "index %lld twice or out of range", (long long)i);
        have[i] = true;
        cr_expect_eq(r.arrays[0].bytes, (size_t)int_field(&r, "n_tokens") * 4);
        msg_free(&r);
    }
    struct msg st;
    expect_msg(h.client, MSG_STATS_REPLY, &st);
    cr_expect_eq(int_field(&st, "requests_in_flight"), 0);
    cr_expect_eq(int_field(&st, "free_blocks"), int_field(&st, "n_blocks"), "an aborted request kept blocks");
    msg_free(&st);
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, health_and_stats_reply) {
    struct model *m = rollout_test_load("llama");
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    harness_start(&h);
    struct msg r;
    send_json(h.client, MSG_HEALTH_REQUEST, "{}", NULL, 0);
    expect_msg(h.client, MSG_HEALTH_REPLY, &r);
    cr_expect_str_eq(str_field(&r, "status"), "ok");
    cr_expect_eq(int_field(&r, "policy_version"), 0);
    msg_free(&r);
    int32_t ids[4] = {5, 6, 7, 8};
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"x\", \"max_new_tokens\": 5, \"ignore_eos\": true}", ids, sizeof ids);
    expect_msg(h.client, MSG_GEN_RESULT, &r);
    msg_free(&r);
    send_json(h.client, MSG_STATS_REQUEST, "{}", NULL, 0);
    expect_msg(h.client, MSG_STATS_REPLY, &r);
    struct rollout_stats want = rollout_engine_stats(h.engine); /* n_blocks and bytes per token never change */
    cr_expect_eq(int_field(&r, "n_blocks"), want.n_blocks);
    cr_expect_eq(int_field(&r, "free_blocks"), want.n_blocks);
    cr_expect_eq(int_field(&r, "kv_bytes_per_token"), want.kv_bytes_per_token);
    cr_expect_eq(int_field(&r, "requests_served"), 1);
    cr_expect_eq(int_field(&r, "requests_in_flight"), 0);
    cr_expect_eq(int_field(&r, "prefill_tokens"), 4);
    cr_expect_eq(int_field(&r, "decode_tokens"), 4);
    cr_expect(int_field(&r, "steps") >= 5);
    cr_expect_eq(int_field(&r, "running") + int_field(&r, "waiting") + int_field(&r, "step_errors"), 0);
    cr_expect_eq(int_field(&r, "preemptions") + int_field(&r, "policy_version"), 0);
    msg_free(&r);
    send_json(h.client, MSG_HEALTH_REQUEST, "{\"v\": 3}", NULL, 0);
    expect_refusal(h.client, NULL, "v", "health.request of another protocol version");
    harness_free(&h);
    model_free(m);
}

/* The tiny random Llama of tests/data/tiny with the byte tokenizer. */
static struct model *tiny_model(struct tokenizer **tok) {
    struct model_config cfg;
    struct model *m;
    struct smelt_error err = {0};
    TEST_OK(model_config_load("tests/data/tiny/config.json", &cfg, &err), &err);
    TEST_OK(model_init_random(&cfg, 1, BACKEND_CPU, &m, &err), &err);
    TEST_OK(tokenizer_create_bytes(NULL, 0, tok, &err), &err);
    return m;
}

Test(rollout_worker, text_prompts_and_stop_strings_with_a_tokenizer) {
    struct tokenizer *tok;
    struct model *m = tiny_model(&tok);
    struct smelt_error err = {0};
    int32_t *ids;
    size_t n;
    TEST_OK(tokenizer_encode(tok, "hello", 5, false, &ids, &n, &err), &err);
    struct harness h;
    harness_init(&h, m, tok, 1024, 16);
    harness_start(&h);
    struct msg text, by_ids;
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"t\", \"prompt\": \"hello\", \"temperature\": 0, \"max_new_tokens\": 8}",
              NULL, 0);
    expect_msg(h.client, MSG_GEN_RESULT, &text);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"i\", \"temperature\": 0, \"max_new_tokens\": 8}", ids, n * 4);
    expect_msg(h.client, MSG_GEN_RESULT, &by_ids);
    int64_t k = int_field(&text, "n_tokens");
    cr_assert(k >= 1);
    cr_expect_eq(int_field(&by_ids, "n_tokens"), k);
    cr_expect_eq(memcmp(text.arrays[0].data, by_ids.arrays[0].data, (size_t)k * 4), 0,
                 "a text prompt and its ids give different tokens");
    char *decoded;
    size_t len;
    TEST_OK(tokenizer_decode(tok, text.arrays[0].data, (size_t)k, true, &decoded, &len, &err), &err);
    json_t *want = json_stringn(decoded, len);
    cr_assert(want, "the greedy continuation of this fixed model should decode to valid UTF-8");
    cr_expect_str_eq(str_field(&text, "text"), json_string_value(want));
    json_decref(want);
    free(decoded);

    /* The first generated token's text as a stop string ends the sample right there. */
    TEST_OK(tokenizer_decode(tok, text.arrays[0].data, 1, true, &decoded, &len, &err), &err);
    json_t *stop = json_pack("{s:s, s:s, s:f, s:i, s:[s]}", "id", "stop", "prompt", "hello", "temperature", 0.0,
                             "max_new_tokens", 8, "stop", decoded);
    cr_assert(stop);
    char *header = json_dumps(stop, JSON_COMPACT);
    send_json(h.client, MSG_GEN_REQUEST, header, NULL, 0);
    struct msg stopped;
    expect_msg(h.client, MSG_GEN_RESULT, &stopped);
    cr_expect_str_eq(str_field(&stopped, "finish_reason"), "stop");
    cr_expect_eq(int_field(&stopped, "n_tokens"), 1);
    free(header);
    json_decref(stop);
    free(decoded);
    msg_free(&stopped);
    msg_free(&text);
    msg_free(&by_ids);
    free(ids);
    harness_free(&h);
    tokenizer_free(tok);
    model_free(m);
}

Test(rollout_worker, an_attached_lora_adapter_is_used) {
    struct model *m = rollout_test_load("llama");
    struct lora *adapter;
    struct smelt_error err = {0};
    TEST_OK(lora_load(m, "tests/data/parity/llama-lora", &adapter, &err), &err);
    TEST_OK(lora_attach(adapter, &err), &err);
    int32_t prompt[12];
    rollout_test_prompt(prompt, 12, 5, m->config.vocab_size);
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"l\", \"temperature\": 0, \"max_new_tokens\": 16}", prompt,
              sizeof prompt);
    harness_start(&h);
    struct msg got;
    expect_msg(h.client, MSG_GEN_RESULT, &got);
    harness_stop(&h);

    struct rollout_request r = engine_request(m, 0, prompt, 12, 1, 0, 0, 16);
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 16, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *with = rollout_test_run_all(e);
    rollout_engine_free(e);
    expect_same_result(&got, &with->r[0][0], "with the adapter");

    lora_detach(adapter);
    e = rollout_test_engine(m, NULL, 1024, 256, 16, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *without = rollout_test_run_all(e);
    rollout_engine_free(e);
    const struct rollout_result *a = &with->r[0][0], *b = &without->r[0][0];
    bool differ = a->n != b->n || memcmp(a->ids, b->ids, (size_t)a->n * 4) != 0;
    for (int64_t t = 0; !differ && t < a->n; t++) differ = fabsf(a->logprobs[t] - b->logprobs[t]) > 1e-4f;
    cr_expect(differ, "the adapter changed nothing: the test cannot tell whether it was applied");
    msg_free(&got);
    rollout_test_free_collected(with);
    rollout_test_free_collected(without);
    harness_free(&h);
    lora_free(adapter);
    model_free(m);
}

Test(rollout_worker, a_vanished_client_does_not_stall_the_worker) {
    struct model *m = rollout_test_load("llama");
    struct harness h;
    harness_init(&h, m, NULL, 1024, 16);
    int32_t ids[4] = {9, 10, 11, 12};
    /* Client A asks for a lot and goes away before any of it is sent. */
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"x\", \"n\": 8, \"max_new_tokens\": 50, \"ignore_eos\": true}", ids,
              sizeof ids);
    harness_start(&h);
    zmq_close(h.client);
    h.client = connect_client(&h);
    /* Client B, with the same request id (ids belong to their client), is served. */
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"x\", \"max_new_tokens\": 4}", ids, sizeof ids);
    struct msg r;
    expect_msg(h.client, MSG_GEN_RESULT, &r);
    cr_expect_str_eq(str_field(&r, "id"), "x");
    msg_free(&r);
    /* A's request ends one way or the other (finished, or aborted when its results bounce). */
    int64_t in_flight = -1, free_blocks = -1, n_blocks = 0;
    for (int tries = 0; tries < 200 && (in_flight != 0 || free_blocks != n_blocks); tries++) {
        send_json(h.client, MSG_STATS_REQUEST, "{}", NULL, 0);
        expect_msg(h.client, MSG_STATS_REPLY, &r);
        in_flight = int_field(&r, "requests_in_flight");
        free_blocks = int_field(&r, "free_blocks");
        n_blocks = int_field(&r, "n_blocks");
        msg_free(&r);
        if (in_flight) usleep(5000);
    }
    cr_expect_eq(in_flight, 0, "the vanished client's request is still in flight");
    cr_expect_eq(free_blocks, n_blocks, "the vanished client's request kept blocks");
    harness_free(&h);
    model_free(m);
}

Test(rollout_worker, stopping_answers_requests_in_flight) {
    struct model *m = rollout_test_load("llama");
    struct harness h;
    harness_init(&h, m, NULL, 1024, 2);
    int32_t ids[4] = {3, 1, 4, 1};
    /* 64 samples two at a time: far more steps than the first result takes. */
    send_json(h.client, MSG_GEN_REQUEST, "{\"id\": \"long\", \"n\": 64, \"max_new_tokens\": 50, \"ignore_eos\": true}",
              ids, sizeof ids);
    harness_start(&h);
    struct msg r;
    expect_msg(h.client, MSG_GEN_RESULT, &r);
    msg_free(&r);
    harness_stop(&h);
    /* Results finished in the step before the stop may come first. */
    for (;;) {
        recv_msg(h.client, &r);
        if (strcmp(r.type, MSG_GEN_RESULT) != 0) break;
        msg_free(&r);
    }
    cr_expect_str_eq(r.type, MSG_GEN_ERROR);
    cr_expect_str_eq(str_field(&r, "id"), "long");
    cr_expect(json_is_null(json_object_get(json_object_get(r.header, "error"), "field")),
              "a stop is not the fault of a request field");
    msg_free(&r);
    cr_expect(rollout_engine_idle(h.engine), "the stopped worker left work in the engine");
    harness_free(&h);
    model_free(m);
}
