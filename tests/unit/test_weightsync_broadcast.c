/* weightsync's broadcast transport (weightsync/broadcast.c) through the rollout client
 * (group rank 0) and workers on threads (ranks 1..N), a file store in a temporary
 * folder: full and LoRA syncs land byte for byte, in buckets whose last one is short,
 * and the workers' greedy outputs equal a local engine's on the trainer's weights; a
 * hash that does not match is refused naming "hash"; a worker started without the comm
 * flags refuses a broadcast begin naming "transport"; a worker killed or stopped (its own
 * process) fails the push within the comm timeout and its naming grace, naming it.
 *
 * Every wait here is bounded by the client's or comm's timeouts, or msg_recv's. */
#include "tests/unit/rollout_testutil.h"
#include "common/clock.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "comm/comm.h"
#include "common/msg.h"
#include "lora/lora.h"
#include "weightsync/weightsync.h"

#define COMM_TIMEOUT_MS 3000
#define MAX_TOKENS 32

static const char *const endpoints[2] = {"inproc://wsb-0", "inproc://wsb-1"};
static char store_spec[96];

static void perturb(float *w, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        w[i] += (float)((double)(seed >> 40) / (double)(1ull << 24) - 0.5) * 0.05f;
    }
}

/* A worker on endpoint as group rank `rank` of size, in the store. */
static void serve_at(struct rollout_test_worker *s, void *ctx, const char *endpoint, struct model *m,
                     struct lora *adapter, int rank, int size) {
    rollout_test_prepare(s, ctx, endpoint, m, adapter, 16);
    s->setup.weights_comm = store_spec;
    s->setup.weights_comm_name = "job";
    s->setup.weights_comm_rank = rank;
    s->setup.weights_comm_size = size;
    rollout_test_start(s);
}

/* Worker k (group rank k + 1 of size) serving on endpoints[k]. */
static void serve(struct rollout_test_worker *s, void *ctx, int k, struct model *m, struct lora *adapter, int size) {
    serve_at(s, ctx, endpoints[k], m, adapter, k + 1, size);
}

static struct rollout_client *client_of(void *ctx, const char *const *eps, int n, int64_t bucket_bytes) {
    struct rollout_client_config cfg = {.endpoints = eps, .n_endpoints = n, .zmq_ctx = ctx, .timeout_ms = 30000,
                                        .bucket_bytes = bucket_bytes, .weights_comm = store_spec,
                                        .weights_comm_name = "job", .comm_timeout_ms = COMM_TIMEOUT_MS};
    struct rollout_client *c;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_create(&cfg, &c, &err), &err);
    return c;
}

static void store_setup(void) {
    test_tmp_setup();
    snprintf(store_spec, sizeof store_spec, "file:%s/store", test_tmp_dir);
}

/* The greedy sample of prompt through the client equals a local engine's on want. */
static void expect_greedy(struct rollout_client *c, struct model *want, int64_t version, const char *what) {
    int32_t prompt[9], ids[MAX_TOKENS];
    float logprobs[MAX_TOKENS];
    int64_t n_tokens, got_version;
    const char *reason;
    rollout_test_prompt(prompt, 9, 5, want->config.vocab_size);
    struct rollout_request r = {.prompt = prompt, .n_prompt = 9, .n = 1, .sampling = {.temperature = 0, .top_p = 1},
                                .max_new_tokens = 20};
    struct rollout_client_results out = {.max_tokens = MAX_TOKENS, .ids = ids, .logprobs = logprobs,
                                         .n_tokens = &n_tokens, .policy_version = &got_version,
                                         .finish_reason = &reason};
    struct smelt_error err = {0};
    TEST_OK(rollout_client_generate(c, &r, 1, &out, &err), &err);
    cr_expect_eq(got_version, version, "%s: policy version %lld", what, (long long)got_version);
    struct rollout_engine *e = rollout_test_engine(want, NULL, 1024, 256, 16, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *local = rollout_test_run_all(e);
    rollout_engine_free(e);
    const struct rollout_result *x = &local->r[0][0];
    cr_expect_eq(n_tokens, x->n, "%s: %lld tokens, locally %lld", what, (long long)n_tokens, (long long)x->n);
    for (int64_t t = 0; t < x->n && t < n_tokens; t++) {
        cr_expect_eq(ids[t], x->ids[t], "%s: token %lld", what, (long long)t);
        cr_expect_eq(logprobs[t], x->logprobs[t], "%s: logprob %lld", what, (long long)t);
    }
    rollout_test_free_collected(local);
}

Test(weightsync_broadcast, a_full_sync_lands_byte_exact_on_two_workers, .init = store_setup,
     .fini = test_tmp_teardown) {
    struct model *trainer = rollout_test_load("llama");
    struct model *w0 = rollout_test_load("llama"), *w1 = rollout_test_load("llama");
    perturb(trainer->weights.data, trainer->n_weights, 7);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s0, s1;
    serve(&s0, ctx, 0, w0, NULL, 3);
    serve(&s1, ctx, 1, w1, NULL, 3);
    const int64_t bucket = 4004; /* not a divisor of the model's bytes: the last bucket is short */
    cr_assert_neq(trainer->n_weights * 4 % bucket, 0);
    struct rollout_client *c = client_of(ctx, endpoints, 2, bucket);
    struct weightsync_report rep;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_push_model(c, trainer, 1, &rep, &err), &err);
    cr_expect_eq(rep.buckets, (trainer->n_weights * 4 + bucket - 1) / bucket);
    cr_expect_eq(rep.receivers, 2);
    cr_expect_eq(rep.bytes, trainer->n_weights * 4);
    cr_expect(rep.seconds > 0 && rep.receiver_seconds > 0);
    cr_expect_eq(memcmp(w0->weights.data, trainer->weights.data, (size_t)trainer->n_weights * 4), 0, "worker 0");
    cr_expect_eq(memcmp(w1->weights.data, trainer->weights.data, (size_t)trainer->n_weights * 4), 0, "worker 1");
    expect_greedy(c, trainer, 1, "after the first sync");
    /* A second sync on the same communicator. */
    perturb(trainer->weights.data, trainer->n_weights, 8);
    TEST_OK(rollout_client_push_model(c, trainer, 2, &rep, &err), &err);
    cr_expect_eq(memcmp(w1->weights.data, trainer->weights.data, (size_t)trainer->n_weights * 4), 0, "sync 2");
    expect_greedy(c, trainer, 2, "after the second sync");
    rollout_client_free(c);
    rollout_test_unserve(&s0);
    rollout_test_unserve(&s1);
    zmq_ctx_term(ctx);
    model_free(trainer);
    model_free(w0);
    model_free(w1);
}

Test(weightsync_broadcast, a_lora_sync_moves_the_adapter_byte_exact, .init = store_setup,
     .fini = test_tmp_teardown) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    struct lora *la, *lw;
    struct smelt_error err = {0};
    TEST_OK(lora_load(trainer, "tests/data/parity/llama-lora", &la, &err), &err);
    TEST_OK(lora_load(worker, "tests/data/parity/llama-lora", &lw, &err), &err);
    TEST_OK(lora_attach(la, &err), &err);
    TEST_OK(lora_attach(lw, &err), &err);
    perturb(la->weights.data, la->n_weights, 9);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    serve(&s, ctx, 0, worker, lw, 2);
    const int64_t bucket = 1004;
    cr_assert_neq(la->n_weights * 4 % bucket, 0);
    struct rollout_client *c = client_of(ctx, endpoints, 1, bucket);
    struct weightsync_report rep;
    TEST_OK(rollout_client_push_lora(c, la, 1, &rep, &err), &err);
    cr_expect_eq(rep.kind, WEIGHTSYNC_LORA);
    cr_expect_eq(rep.bytes, la->n_weights * 4);
    cr_expect_eq(rep.buckets, (la->n_weights * 4 + bucket - 1) / bucket);
    cr_expect_eq(memcmp(lw->weights.data, la->weights.data, (size_t)la->n_weights * 4), 0, "the adapter");
    expect_greedy(c, trainer, 1, "after the LoRA sync");
    rollout_client_free(c);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);
    lora_free(la);
    lora_free(lw);
    model_free(trainer);
    model_free(worker);
}

/* ---- refusals, sent by hand: the test is rank 0 ---- */

static void send_header(void *d, const char *type, json_t *h) {
    cr_assert(h);
    struct smelt_error err = {0};
    TEST_OK(msg_send(d, NULL, 0, type, h, NULL, 0, &err), &err);
    json_decref(h);
}

static void expect_refused(void *d, const char *field, const char *what) {
    struct msg m;
    struct smelt_error err = {0};
    cr_assert_eq(msg_recv(d, false, 10000, &m, &err), 0, "%s: no answer: %s", what, err.message);
    char *h = json_dumps(m.header, JSON_COMPACT);
    const char *got = json_string_value(json_object_get(json_object_get(m.header, "error"), "field"));
    cr_expect(strcmp(m.type, MSG_WEIGHTS_ERROR) == 0 && got && strcmp(got, field) == 0,
              "%s: expected weights.error naming %s: %s %s", what, field, m.type, h);
    free(h);
    msg_free(&m);
}

static void *dealer_to(void *ctx, const char *endpoint) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    cr_assert(d && zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_connect(d, endpoint), 0);
    return d;
}

static void *dealer(void *ctx) { return dealer_to(ctx, endpoints[0]); }

Test(weightsync_broadcast, a_bad_hash_and_a_worker_without_comm_flags_are_refused, .init = store_setup,
     .fini = test_tmp_teardown) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    struct model *orig = rollout_test_load("llama");
    perturb(trainer->weights.data, trainer->n_weights, 3);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    serve(&s, ctx, 0, worker, NULL, 2);
    void *d = dealer(ctx);
    struct weightsync_meta meta;
    struct smelt_error err = {0};
    TEST_OK(weightsync_meta_model(trainer, 1, 8192, &meta, &err), &err);
    meta.via.kind = WEIGHTSYNC_VIA_BROADCAST;
    meta.via.timeout_ms = COMM_TIMEOUT_MS;
    snprintf(meta.via.comm, sizeof meta.via.comm, "hand-1");
    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta));
    struct comm_store *store;
    struct comm *comm;
    TEST_OK(comm_store_open(store_spec, "job", &store, &err), &err);
    struct comm_options o = {.rank = 0, .size = 2, .name = "hand-1", .timeout_ms = COMM_TIMEOUT_MS};
    TEST_OK(comm_create(store, &o, &comm, &err), &err);
    uint64_t *hashes = calloc((size_t)meta.n_buckets, sizeof *hashes);
    cr_assert(hashes);
    TEST_OK(weightsync_broadcast_send(comm, 0, &meta, &trainer->weights, hashes, &err), &err);
    hashes[meta.n_buckets - 1] ^= 1; /* the last bucket's, short */
    send_header(d, MSG_WEIGHTS_END, weightsync_end_header(&meta, hashes));
    expect_refused(d, "hash", "a bucket whose hash does not match");
    /* Missing hashes: refused too (the next version: the refused one's messages are ignored). */
    meta.version = 2;
    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta));
    TEST_OK(weightsync_broadcast_send(comm, 0, &meta, &trainer->weights, hashes, &err), &err);
    send_header(d, MSG_WEIGHTS_END, weightsync_end_header(&meta, NULL));
    expect_refused(d, "hashes", "an end without hashes");
    comm_destroy(comm);
    comm_store_close(store);
    free(hashes);
    cr_expect_eq(memcmp(worker->weights.data, orig->weights.data, (size_t)orig->n_weights * 4), 0,
                 "a refused sync changed the weights");
    zmq_close(d);
    rollout_test_unserve(&s);

    /* A worker without --weights-comm cannot join: it says so, naming the field. (Another
     * endpoint: a closed socket's inproc name is released by ZeroMQ's reaper, later.) */
    rollout_test_serve(&s, ctx, "inproc://wsb-plain", worker, NULL, 2);
    d = dealer_to(ctx, "inproc://wsb-plain");
    meta.version = 3;
    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta));
    expect_refused(d, "transport", "a broadcast begin to a worker without comm flags");
    zmq_close(d);
    rollout_test_unserve(&s);
    weightsync_meta_free(&meta);
    zmq_ctx_term(ctx);
    model_free(trainer);
    model_free(worker);
    model_free(orig);
}

/* ---- a dead receiver ---- */

static pid_t child_pid;
static bool child_alive(void *ctx, int k) {
    (void)ctx;
    (void)k;
    return waitpid(child_pid, NULL, WNOHANG) == 0;
}

/* The worker in a process of its own (forked before this one has a ZeroMQ context or an
 * OpenMP pool), killed (or stopped) between two syncs: the next push fails within the
 * comm timeout and its naming grace, naming it. */
static void expect_push_fails_naming_the_worker(int sig) {
    char endpoint[128];
    cr_assert_lt(snprintf(endpoint, sizeof endpoint, "ipc://%s/worker.sock", test_tmp_dir), (int)sizeof endpoint);
    child_pid = fork();
    cr_assert(child_pid >= 0);
    if (child_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        void *ctx = zmq_ctx_new();
        struct rollout_test_worker s;
        serve_at(&s, ctx, endpoint, rollout_test_load("llama"), NULL, 1, 2);
        pthread_join(s.thread, NULL);
        _exit(0);
    }
    struct model *trainer = rollout_test_load("llama");
    void *ctx = zmq_ctx_new();
    const char *eps[1] = {endpoint};
    struct rollout_client_config cfg = {.endpoints = eps, .n_endpoints = 1, .zmq_ctx = ctx, .timeout_ms = 60000,
                                        .bucket_bytes = 65536, .weights_comm = store_spec,
                                        .weights_comm_name = "job", .comm_timeout_ms = COMM_TIMEOUT_MS,
                                        .alive = child_alive};
    struct rollout_client *c;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_create(&cfg, &c, &err), &err);
    TEST_OK(rollout_client_push_model(c, trainer, 1, NULL, &err), &err);
    kill(child_pid, sig);
    int64_t t0 = mono_ms();
    int rc = rollout_client_push_model(c, trainer, 2, NULL, &err);
    int64_t took = mono_ms() - t0;
    fprintf(stderr, "weightsync_broadcast: a push to a killed or stopped worker failed after %lld ms: %s\n", (long long)took,
            err.message);
    cr_expect_neq(rc, 0, "a push to a dead worker succeeded");
    cr_expect_lt(took, 2 * COMM_TIMEOUT_MS + 1000, "the dead worker was noticed after %lld ms", (long long)took);
    cr_expect(strstr(err.message, "rollout worker 0") && strstr(err.message, endpoint),
              "the error should name rollout worker 0 (%s): %s", endpoint, err.message);
    int status;
    if (sig != SIGKILL) kill(child_pid, SIGKILL);
    waitpid(child_pid, &status, 0);
    rollout_client_free(c);
    zmq_ctx_term(ctx);
    model_free(trainer);
}

Test(weightsync_broadcast, a_killed_worker_fails_the_push_naming_it, .init = store_setup,
     .fini = test_tmp_teardown) {
    expect_push_fails_naming_the_worker(SIGKILL);
}

Test(weightsync_broadcast, a_stopped_worker_fails_the_push_naming_it, .init = store_setup,
     .fini = test_tmp_teardown) {
    expect_push_fails_naming_the_worker(SIGSTOP);
}
