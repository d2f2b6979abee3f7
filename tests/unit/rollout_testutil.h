/* Helpers shared by the rollout tests: the parity fixtures' models, an engine sized in
 * tokens, deterministic prompts, a run to idle that sorts the results by request and
 * sample, and an in-process smelt-rollout worker (rollout_worker_run on a thread behind
 * a ROUTER socket) for the client and weight-sync tests. */
#ifndef SMELT_TESTS_ROLLOUT_TESTUTIL_H
#define SMELT_TESTS_ROLLOUT_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "model/model.h"
#include "rollout/rollout.h"

/* tests/data/parity/<type> (llama, mistral, qwen2, qwen3, gpt2) on the CPU. */
static inline struct model *rollout_test_load(const char *type) {
    char dir[128];
    snprintf(dir, sizeof dir, "tests/data/parity/%s", type);
    struct model *m;
    struct smelt_error err = {0};
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    return m;
}

/* An engine whose KV pool holds kv_tokens tokens; tok may be NULL. */
static inline struct rollout_engine *rollout_test_engine(struct model *m, const struct tokenizer *tok,
                                                         int64_t kv_tokens, int64_t batch_tokens, int max_seqs,
                                                         int64_t chunk) {
    struct rollout_config c = {.kv_memory_bytes = kv_tokens * model_kv_bytes_per_token(m),
                               .max_batch_tokens = batch_tokens, .max_seqs = max_seqs, .prefill_chunk = chunk};
    struct rollout_engine *e;
    struct smelt_error err = {0};
    TEST_OK(rollout_engine_create(m, tok, &c, &e, &err), &err);
    return e;
}

/* A deterministic prompt of n ids in [0, V). */
static inline void rollout_test_prompt(int32_t *ids, int64_t n, int seed, int64_t V) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7 + seed * 13 + 3) % V);
}

/* Results of a run to idle, by request id and sample index. */
#define ROLLOUT_TEST_MAX_REQ 64
#define ROLLOUT_TEST_MAX_SAMPLES 8
struct rollout_test_collected {
    struct rollout_result r[ROLLOUT_TEST_MAX_REQ][ROLLOUT_TEST_MAX_SAMPLES];
    bool have[ROLLOUT_TEST_MAX_REQ][ROLLOUT_TEST_MAX_SAMPLES];
};

/* Steps the engine until idle; c is malloc'd and filled (free with
 * rollout_test_free_collected). */
static inline struct rollout_test_collected *rollout_test_run_all(struct rollout_engine *e) {
    struct smelt_error err = {0};
    struct rollout_test_collected *c = calloc(1, sizeof *c);
    cr_assert(c);
    for (int guard = 0; !rollout_engine_idle(e); guard++) {
        cr_assert(guard < 100000, "the engine does not finish");
        TEST_OK(rollout_engine_step(e, &err), &err);
        struct rollout_result *res;
        int n;
        TEST_OK(rollout_engine_take(e, &res, &n, &err), &err);
        for (int i = 0; i < n; i++) {
            uint64_t q = res[i].request_id;
            int s = res[i].sample_index;
            cr_assert(q < ROLLOUT_TEST_MAX_REQ && s >= 0 && s < ROLLOUT_TEST_MAX_SAMPLES);
            cr_assert(!c->have[q][s], "a sample finished twice");
            c->r[q][s] = res[i];
            c->have[q][s] = true;
        }
        free(res); /* the arrays inside now belong to c */
    }
    return c;
}

static inline void rollout_test_free_collected(struct rollout_test_collected *c) {
    for (int i = 0; i < ROLLOUT_TEST_MAX_REQ; i++)
        for (int s = 0; s < ROLLOUT_TEST_MAX_SAMPLES; s++)
            if (c->have[i][s]) {
                free(c->r[i][s].ids);
                free(c->r[i][s].logprobs);
            }
    free(c);
}

/* ---- a worker on a thread ----
 *
 * rollout_worker_run serving a fresh engine of model m (and adapter, or NULL) on a ROUTER
 * bound to endpoint in the caller's ZeroMQ context, on a thread of its own until
 * rollout_test_halt. The test keeps m and the adapter; the worker owns its engine and
 * socket, freed by rollout_test_unserve (with m too when own_model is set). */
struct rollout_test_worker {
    struct model *own_model; /* freed by rollout_test_unserve when set (rollout_test_serve_own) */
    void *router;
    struct rollout_engine *engine;
    struct rollout_worker_setup setup;
    pthread_t thread;
    atomic_int stop; /* set by the test's thread, read by the worker's */
    bool running;
    int rc;
    struct smelt_error err;
};

static inline void *rollout_test_worker_main(void *arg) {
    struct rollout_test_worker *s = arg;
    s->rc = rollout_worker_run(&s->setup, &s->err);
    return NULL;
}

/* rollout_test_serve in two halves, for a test that sets more of s->setup (the broadcast
 * transport's fields) before the thread starts. */
static inline void rollout_test_prepare(struct rollout_test_worker *s, void *ctx, const char *endpoint,
                                        struct model *m, struct lora *adapter, int max_seqs) {
    memset(s, 0, sizeof *s);
    s->engine = rollout_test_engine(m, NULL, 1024, 256, max_seqs, 256);
    s->router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    cr_assert(s->router && zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_bind(s->router, endpoint), 0, "bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    s->setup = (struct rollout_worker_setup){.engine = s->engine, .model = m, .adapter = adapter,
                                             .router = s->router, .stop = &s->stop};
}

static inline void rollout_test_start(struct rollout_test_worker *s) {
    cr_assert_eq(pthread_create(&s->thread, NULL, rollout_test_worker_main, s), 0);
    s->running = true;
}

/* The worker's engine: rollout_test_engine(m, NULL, 1024, 256, max_seqs, 256). */
static inline void rollout_test_serve(struct rollout_test_worker *s, void *ctx, const char *endpoint,
                                      struct model *m, struct lora *adapter, int max_seqs) {
    rollout_test_prepare(s, ctx, endpoint, m, adapter, max_seqs);
    rollout_test_start(s);
}

/* A worker of its own model (the parity Llama), freed with the worker. */
static inline void rollout_test_serve_own(struct rollout_test_worker *s, void *ctx, const char *endpoint,
                                          int max_seqs) {
    struct model *m = rollout_test_load("llama");
    rollout_test_serve(s, ctx, endpoint, m, NULL, max_seqs);
    s->own_model = m;
}

/* Stops the thread (no-op when stopped); the worker must have ended without error. */
static inline void rollout_test_halt(struct rollout_test_worker *s) {
    if (!s->running) return;
    atomic_store(&s->stop, 1);
    cr_assert_eq(pthread_join(s->thread, NULL), 0);
    s->running = false;
    cr_expect_eq(s->rc, 0, "rollout_worker_run failed: %s", s->err.message);
}

static inline void rollout_test_unserve(struct rollout_test_worker *s) {
    rollout_test_halt(s);
    if (s->router) zmq_close(s->router);
    rollout_engine_free(s->engine);
    model_free(s->own_model);
    memset(s, 0, sizeof *s);
}

#endif
