/* rollout/client.c: trainer rank 0's client of smelt-rollout workers. Workers serve on
 * threads behind inproc ROUTERs (one on a forked process over ipc, to be killed); the
 * client spreads a batch over them and files every sample at its (request, sample) slot,
 * equal to what a local engine makes of the request; a refused request fails the batch
 * naming it; a worker stopped, killed or silent mid-batch fails the call naming its
 * endpoint within the time the test sets; a push to two workers waits for both and names
 * the one that refuses.
 *
 * Every wait here is bounded by the client's timeouts or msg_recv's, not by Criterion's
 * .timeout (whose runner leaks an allocation under --jobs 2 that LeakSanitizer reports). */
#include "tests/unit/rollout_testutil.h"
#include "common/clock.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/msg.h"
#include "weightsync/weightsync.h"

#define MAX_TOKENS 64
#define MAX_SAMPLES 160

static const char *const endpoints[2] = {"inproc://client-w0", "inproc://client-w1"};

static struct rollout_client *client_of(void *ctx, const char *const *eps, int n, int64_t quiet_ms,
                                        int64_t health_ms) {
    struct rollout_client_config cfg = {.endpoints = eps, .n_endpoints = n, .zmq_ctx = ctx, .timeout_ms = 30000,
                                        .quiet_ms = quiet_ms, .health_timeout_ms = health_ms};
    struct rollout_client *c;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_create(&cfg, &c, &err), &err);
    return c;
}

/* ---- batches ---- */

struct batch {
    int32_t ids[MAX_SAMPLES * MAX_TOKENS];
    float logprobs[MAX_SAMPLES * MAX_TOKENS];
    int64_t n_tokens[MAX_SAMPLES], version[MAX_SAMPLES];
    const char *reason[MAX_SAMPLES];
    int worker[MAX_SAMPLES];
};

static struct rollout_client_results results_of(struct batch *b) {
    for (int i = 0; i < MAX_SAMPLES; i++) {
        b->n_tokens[i] = b->version[i] = -1;
        b->reason[i] = NULL;
        b->worker[i] = -1;
    }
    return (struct rollout_client_results){.max_tokens = MAX_TOKENS, .ids = b->ids, .logprobs = b->logprobs,
                                           .n_tokens = b->n_tokens, .policy_version = b->version,
                                           .finish_reason = b->reason, .worker = b->worker};
}

enum { N_REQ = 5 };
static const int64_t prompt_lens[N_REQ] = {3, 8, 13, 5, 20};
static const int samples_of[N_REQ] = {1, 2, 3, 1, 2};

static void make_requests(int32_t prompts[N_REQ][24], struct rollout_request *r, int64_t V) {
    for (int i = 0; i < N_REQ; i++) {
        rollout_test_prompt(prompts[i], prompt_lens[i], i + 1, V);
        r[i] = (struct rollout_request){.prompt = prompts[i], .n_prompt = prompt_lens[i], .n = samples_of[i],
                                        .sampling = {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f},
                                        .seed = (uint64_t)(7 * i + 1), .max_new_tokens = 12,
                                        .stop_ids = {2, 17}, .n_stop_ids = 2};
    }
}

/* Every slot holds what a local engine makes of its request: tokens exactly, logprobs to
 * 1e-5 (the workers batch requests together, the local engine runs each alone). */
static void expect_like_local(const struct batch *b, const struct rollout_request *r, int n_req) {
    struct model *m = rollout_test_load("llama");
    struct smelt_error err = {0};
    int64_t slot = 0;
    for (int i = 0; i < n_req; i++) {
        struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 16, 256);
        struct rollout_request q = r[i];
        q.id = 0;
        TEST_OK(rollout_engine_add(e, &q, &err), &err);
        struct rollout_test_collected *c = rollout_test_run_all(e);
        for (int s = 0; s < r[i].n; s++, slot++) {
            const struct rollout_result *w = &c->r[0][s];
            cr_assert(b->reason[slot], "request %d sample %d: never filed", i, s);
            cr_expect_eq(b->n_tokens[slot], w->n, "request %d sample %d: %lld tokens, the engine's %lld", i, s,
                         (long long)b->n_tokens[slot], (long long)w->n);
            int64_t n = b->n_tokens[slot] < w->n ? b->n_tokens[slot] : w->n;
            cr_expect_eq(memcmp(b->ids + slot * MAX_TOKENS, w->ids, (size_t)n * 4), 0,
                         "request %d sample %d: tokens differ from the engine's", i, s);
            for (int64_t t = 0; t < n; t++)
                cr_expect_float_eq(b->logprobs[slot * MAX_TOKENS + t], w->logprobs[t], 1e-5,
                                   "request %d sample %d token %lld", i, s, (long long)t);
            cr_expect_str_eq(b->reason[slot], w->finish_reason, "request %d sample %d", i, s);
            cr_expect_eq(b->version[slot], 0);
        }
        rollout_test_free_collected(c);
        rollout_engine_free(e);
    }
    model_free(m);
}

Test(rollout_client, a_batch_over_two_workers_is_filed_by_request_and_sample) {
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker w[2];
    for (int k = 0; k < 2; k++) rollout_test_serve_own(&w[k], ctx, endpoints[k], 16);
    struct rollout_client *c = client_of(ctx, endpoints, 2, 0, 0);
    int32_t prompts[N_REQ][24];
    struct rollout_request r[N_REQ];
    make_requests(prompts, r, w[0].own_model->config.vocab_size);
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    struct smelt_error err = {0};
    TEST_OK(rollout_client_generate(c, r, N_REQ, &out, &err), &err);
    bool used[2] = {false, false};
    for (int s = 0; s < 9; s++) {
        cr_assert(b.worker[s] == 0 || b.worker[s] == 1, "slot %d: worker %d", s, b.worker[s]);
        used[b.worker[s]] = true;
    }
    cr_expect(used[0] && used[1], "the batch went to one worker only");
    cr_expect_eq(b.reason[9], NULL, "a slot past the batch was written");
    /* Samples of one request stay on one worker (they share the prompt's blocks). */
    cr_expect_eq(b.worker[1], b.worker[2]);
    cr_expect(b.worker[3] == b.worker[4] && b.worker[4] == b.worker[5]);
    /* The same client runs the next batch. */
    TEST_OK(rollout_client_generate(c, r, N_REQ, &out, &err), &err);
    rollout_client_free(c);
    for (int k = 0; k < 2; k++) rollout_test_unserve(&w[k]);
    zmq_ctx_term(ctx);
    expect_like_local(&b, r, N_REQ);
}

Test(rollout_client, a_refused_request_fails_the_batch_naming_it) {
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker w;
    rollout_test_serve_own(&w, ctx, endpoints[0], 16);
    struct rollout_client *c = client_of(ctx, endpoints, 1, 0, 0);
    int32_t prompts[N_REQ][24];
    struct rollout_request r[N_REQ];
    make_requests(prompts, r, w.own_model->config.vocab_size);
    int32_t outside[3] = {4, 500, 6}; /* the vocabulary has 96 ids */
    struct rollout_request bad[2] = {r[0], r[1]};
    bad[1].prompt = outside;
    bad[1].n_prompt = 3;
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(rollout_client_generate(c, bad, 2, &out, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "request 1") && strstr(err.message, endpoints[0]) &&
              strstr(err.message, "(field prompt)"), "the error should name the request, the worker and the field: %s",
              err.message);
    /* The next batch is whole and right: nothing of the failed one lands in it. */
    TEST_OK(rollout_client_generate(c, r, N_REQ, &out, &err), &err);
    rollout_client_free(c);
    rollout_test_unserve(&w);
    zmq_ctx_term(ctx);
    expect_like_local(&b, r, N_REQ);
}

Test(rollout_client, calls_check_their_arguments) {
    void *ctx = zmq_ctx_new();
    struct smelt_error err = {0};
    struct rollout_client *c;
    struct rollout_client_config cfg = {.endpoints = endpoints, .n_endpoints = 0, .zmq_ctx = ctx};
    TEST_EXPECT_ERROR(rollout_client_create(&cfg, &c, &err), SMELT_EINVAL, &err);
    cfg.n_endpoints = 1;
    cfg.bucket_bytes = 6;
    TEST_EXPECT_ERROR(rollout_client_create(&cfg, &c, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "bucket_bytes");
    const char *empty[1] = {""};
    cfg = (struct rollout_client_config){.endpoints = empty, .n_endpoints = 1, .zmq_ctx = ctx};
    TEST_EXPECT_ERROR(rollout_client_create(&cfg, &c, &err), SMELT_EINVAL, &err);

    c = client_of(ctx, endpoints, 1, 0, 0); /* nobody serves there: nothing is sent below */
    int32_t prompts[N_REQ][24];
    struct rollout_request r[N_REQ];
    make_requests(prompts, r, 96);
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    TEST_EXPECT_ERROR(rollout_client_collect(c, &err), SMELT_EINVAL, &err);
    struct rollout_request q = r[2];
    q.max_new_tokens = MAX_TOKENS + 1;
    TEST_EXPECT_ERROR(rollout_client_submit(c, &q, 1, &out, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "requests[0].max_new_tokens");
    struct rollout_request two[2] = {r[0], r[1]};
    two[1].n = 0;
    TEST_EXPECT_ERROR(rollout_client_submit(c, two, 2, &out, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "requests[1].n");
    two[1] = r[1];
    two[1].n_prompt = 0;
    TEST_EXPECT_ERROR(rollout_client_submit(c, two, 2, &out, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "requests[1].prompt");
    two[1] = r[1];
    two[1].seed = UINT64_MAX;
    TEST_EXPECT_ERROR(rollout_client_submit(c, two, 2, &out, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "requests[1].seed");
    out.finish_reason = NULL;
    TEST_EXPECT_ERROR(rollout_client_submit(c, r, 1, &out, &err), SMELT_EINVAL, &err);
    out = results_of(&b);
    TEST_OK(rollout_client_submit(c, r, 1, &out, &err), &err);
    TEST_EXPECT_ERROR(rollout_client_submit(c, r, 1, &out, &err), SMELT_EINVAL, &err);
    rollout_client_free(c); /* with the batch in flight */
    zmq_ctx_term(ctx);
}

/* A long batch: 64 samples of 50 tokens, two at a time on each worker. */
static void long_requests(struct rollout_request *r, const int32_t *prompt) {
    for (int i = 0; i < 2; i++)
        r[i] = (struct rollout_request){.prompt = prompt, .n_prompt = 4, .n = 64,
                                        .sampling = {.temperature = 1, .top_p = 1}, .seed = (uint64_t)i,
                                        .max_new_tokens = 50};
}

/* Polls until some sample of the batch is in. */
static void wait_first(struct rollout_client *c) {
    struct smelt_error err = {0};
    int64_t finished = 0;
    for (int tries = 0; finished == 0 && tries < 600; tries++)
        TEST_OK(rollout_client_poll(c, 50, &finished, &err), &err);
    cr_assert(finished > 0, "no sample came within 30 s");
}

Test(rollout_client, a_worker_stopped_mid_batch_fails_it_naming_the_worker) {
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker w[2];
    for (int k = 0; k < 2; k++) rollout_test_serve_own(&w[k], ctx, endpoints[k], 2);
    /* Health checks well inside the bound below: on a loaded machine worker 1 may be
     * halted before it has read its request, and then only its silence tells. */
    struct rollout_client *c = client_of(ctx, endpoints, 2, 500, 3000);
    int32_t prompt[4] = {3, 1, 4, 1};
    struct rollout_request r[2];
    long_requests(r, prompt);
    /* Request 0 (on worker 0) is over at once: worker 0 then idles, and ThreadSanitizer
     * can still name the sender of every message the test reads late. Request 1 (on
     * worker 1) is long. */
    r[0].n = 1;
    r[0].max_new_tokens = 2;
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    struct smelt_error err = {0};
    TEST_OK(rollout_client_submit(c, r, 2, &out, &err), &err);
    wait_first(c);
    rollout_test_halt(&w[1]);
    int64_t t0 = mono_ms();
    TEST_EXPECT_ERROR(rollout_client_collect(c, &err), SMELT_EIO, &err);
    cr_expect_lt(mono_ms() - t0, 10000, "the failure took %lld ms to be noticed", (long long)(mono_ms() - t0));
    cr_expect(strstr(err.message, endpoints[1]) != NULL, "the error should name %s: %s", endpoints[1], err.message);
    rollout_client_free(c);
    for (int k = 0; k < 2; k++) rollout_test_unserve(&w[k]);
    zmq_ctx_term(ctx);
}

/* Waits (30 s at most) until a worker answers on endpoint: a worker still loading is
 * silent, and the client's short timeouts below would take it for dead. */
static void wait_ready(void *ctx, const char *endpoint) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    cr_assert(d && zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero) == 0 && zmq_connect(d, endpoint) == 0);
    json_t *h = json_object();
    struct smelt_error err = {0};
    TEST_OK(msg_send(d, NULL, 0, MSG_HEALTH_REQUEST, h, NULL, 0, &err), &err);
    json_decref(h);
    struct msg m;
    cr_assert_eq(msg_recv(d, false, 30000, &m, &err), 0, "the worker did not come up: %s", err.message);
    cr_assert_str_eq(m.type, MSG_HEALTH_REPLY);
    msg_free(&m);
    zmq_close(d);
}

/* The worker in a process of its own, on ipc, killed with SIGKILL mid-batch: no goodbye,
 * so only the client's health check can tell. The fork comes before this process has a
 * ZeroMQ context or an OpenMP pool (a child of a threaded process may only exec). */
Test(rollout_client, a_killed_worker_fails_the_batch_naming_it_without_hanging, .init = test_tmp_setup,
     .fini = test_tmp_teardown) {
    char endpoint[128];
    cr_assert_lt(snprintf(endpoint, sizeof endpoint, "ipc://%s/worker.sock", test_tmp_dir), (int)sizeof endpoint);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        void *ctx = zmq_ctx_new();
        struct rollout_test_worker s;
        rollout_test_serve_own(&s, ctx, endpoint, 2);
        pthread_join(s.thread, NULL);
        _exit(0);
    }
    void *ctx = zmq_ctx_new();
    wait_ready(ctx, endpoint);
    const char *eps[1] = {endpoint};
    /* Generous for a loaded machine (and ThreadSanitizer): a worker that is merely slow
     * must not pass for dead. */
    int64_t quiet_ms = 500, health_ms = 3000;
    struct rollout_client *c = client_of(ctx, eps, 1, quiet_ms, health_ms);
    int32_t prompt[4] = {2, 7, 1, 8};
    struct rollout_request r[2];
    long_requests(r, prompt);
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    struct smelt_error err = {0};
    int rc = rollout_client_submit(c, r, 2, &out, &err);
    int64_t finished = 0;
    for (int tries = 0; !rc && finished == 0 && tries < 600; tries++) rc = rollout_client_poll(c, 50, &finished, &err);
    cr_expect_eq(rc, 0, "%s", err.message);
    cr_expect(finished > 0, "the worker never answered");
    kill(child, SIGKILL);
    int status;
    cr_expect_eq(waitpid(child, &status, 0), child);
    int64_t t0 = mono_ms();
    TEST_EXPECT_ERROR(rollout_client_collect(c, &err), SMELT_EIO, &err);
    int64_t took = mono_ms() - t0;
    cr_expect_lt(took, quiet_ms + health_ms + 3000, "the dead worker was noticed after %lld ms", (long long)took);
    cr_expect(strstr(err.message, endpoint) && strstr(err.message, "stopped answering"),
              "the error should name %s: %s", endpoint, err.message);
    rollout_client_free(c);
    zmq_ctx_term(ctx);
}

/* A ROUTER that takes everything and answers nothing. */
Test(rollout_client, a_silent_worker_is_declared_dead) {
    void *ctx = zmq_ctx_new();
    void *hole = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    cr_assert(hole && zmq_setsockopt(hole, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_bind(hole, endpoints[0]), 0);
    int64_t quiet_ms = 100, health_ms = 400;
    struct rollout_client *c = client_of(ctx, endpoints, 1, quiet_ms, health_ms);
    int32_t prompts[N_REQ][24];
    struct rollout_request r[N_REQ];
    make_requests(prompts, r, 96);
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    struct smelt_error err = {0};
    int64_t t0 = mono_ms();
    TEST_EXPECT_ERROR(rollout_client_generate(c, r, 2, &out, &err), SMELT_EIO, &err);
    int64_t took = mono_ms() - t0;
    cr_expect(took >= quiet_ms + health_ms && took < quiet_ms + health_ms + 2000, "declared dead after %lld ms",
              (long long)took);
    cr_expect(strstr(err.message, endpoints[0]) && strstr(err.message, "owes 3 samples"), "%s", err.message);
    /* A push to it fails the same way. */
    struct model *m = rollout_test_load("llama");
    t0 = mono_ms();
    TEST_EXPECT_ERROR(rollout_client_push_model(c, m, 1, NULL, &err), SMELT_EIO, &err);
    took = mono_ms() - t0;
    cr_expect_lt(took, quiet_ms + health_ms + 2000, "declared dead after %lld ms", (long long)took);
    cr_expect(strstr(err.message, endpoints[0]) && strstr(err.message, "the weights of version 1"), "%s",
              err.message);
    model_free(m);
    rollout_client_free(c);
    zmq_close(hole);
    zmq_ctx_term(ctx);
}

Test(rollout_client, a_push_to_two_workers_waits_for_both_and_names_a_refusal) {
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker w[2];
    for (int k = 0; k < 2; k++) rollout_test_serve_own(&w[k], ctx, endpoints[k], 16);
    struct model *trainer = rollout_test_load("llama");
    float *tw = trainer->weights.data;
    for (int64_t i = 0; i < trainer->n_weights; i++) tw[i] *= 1.25f;
    struct smelt_error err = {0};
    struct weightsync_report rep;
    /* Worker 1 alone goes to version 5 first. */
    struct rollout_client *one = client_of(ctx, endpoints + 1, 1, 0, 0);
    TEST_OK(rollout_client_push_model(one, trainer, 5, &rep, &err), &err);
    rollout_client_free(one);
    struct rollout_client *c = client_of(ctx, endpoints, 2, 0, 0);
    TEST_EXPECT_ERROR(rollout_client_push_model(c, trainer, 3, &rep, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, endpoints[1]) && strstr(err.message, "(field version)") &&
              !strstr(err.message, endpoints[0]), "the error should name worker 1 and the field: %s", err.message);
    /* Worker 0 took version 3 all the same; a batch shows both versions. */
    int32_t prompts[N_REQ][24];
    struct rollout_request r[N_REQ];
    make_requests(prompts, r, trainer->config.vocab_size);
    static struct batch b;
    struct rollout_client_results out = results_of(&b);
    TEST_OK(rollout_client_generate(c, r, 2, &out, &err), &err);
    for (int s = 0; s < 3; s++)
        cr_expect_eq(b.version[s], b.worker[s] == 0 ? 3 : 5, "slot %d from worker %d: version %lld", s, b.worker[s],
                     (long long)b.version[s]);
    TEST_OK(rollout_client_push_model(c, trainer, 6, &rep, &err), &err);
    cr_expect_eq(rep.receivers, 2);
    cr_expect_eq(rep.bytes, trainer->n_weights * 4);
    cr_expect_eq(rep.bytes_sent, 2 * rep.bytes);
    rollout_client_free(c);
    for (int k = 0; k < 2; k++) {
        rollout_test_halt(&w[k]);
        cr_expect_eq(memcmp(w[k].own_model->weights.data, tw, (size_t)trainer->n_weights * 4), 0,
                     "worker %d does not hold the trainer's weights", k);
        cr_expect_eq(rollout_engine_stats(w[k].engine).policy_version, 6);
        rollout_test_unserve(&w[k]);
    }
    model_free(trainer);
    zmq_ctx_term(ctx);
}
