/* server/tinker_dispatch.c: the dispatcher against fake session workers (DEALER sockets
 * in the test speaking common/msg.h's tinker.* messages over the real tcp endpoint).
 * Requests wait for the worker's hello and keep their submit order; a submit after the
 * hello goes out at once (woken, not at the next poll); results are stored; a stale
 * attempt's worker gets nothing and its results are dropped; garbage is ignored. The
 * ROUTER is a CURVE server: a worker gets in only with its attempt's keys (jobs.
 * worker_public_key), and a message under another routing id than the one its keys prove
 * is dropped. */
#include "tests/unit/tinker_testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "common/msg.h"
#include "server/tinker_api.h"

#define JOB "ftjob-tinker1"
#define SLOW_MS 240 /* under the dispatcher's poll interval: only a wake-up is this fast */

static void dispatch_setup(void) {
    tinker_setup();
    tinker_s.zmq = zmq_ctx_new();
    cr_assert(tinker_s.zmq);
    tinker_s.config.tinker_bind = "tcp://127.0.0.1:*";
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&tinker_s.curve, &err), &err);
    TEST_OK(zap_handler_start(tinker_s.zmq, &tinker_s.zap, &err), &err);
}

TestSuite(tinker_dispatch, .init = dispatch_setup, .fini = tinker_teardown, .timeout = 60);

static void start(void) {
    struct smelt_error err = {0};
    TEST_OK(tinker_dispatch_start(&tinker_s, &err), &err);
    cr_assert(strncmp(tinker_s.tinker_endpoint, "tcp://127.0.0.1:", 16) == 0, "%s", tinker_s.tinker_endpoint);
}

/* The keys control.c's launch gives job's current attempt: a fresh keypair whose public
 * key is stored as the job's worker_public_key (replacing an earlier attempt's). */
static struct curve_keypair launch_keys(const char *job) {
    struct curve_keypair k;
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&k, &err), &err);
    struct store_conn *c = tinker_conn();
    cr_assert(store_exec(c, &err, "UPDATE jobs SET worker_public_key = ? WHERE id = ?", "ss", k.public_key, job) == 1,
              "%s", err.message);
    store_release(tinker_s.store, c);
    return k;
}

/* A DEALER with routing id `route` showing keys (NULL: no CURVE), connected to the dispatcher. */
static void *worker_with(const char *route, const struct curve_keypair *keys) {
    void *w = zmq_socket(tinker_s.zmq, ZMQ_DEALER);
    cr_assert(w);
    int linger = 0;
    struct smelt_error err = {0};
    zmq_setsockopt(w, ZMQ_LINGER, &linger, sizeof linger);
    cr_assert_eq(zmq_setsockopt(w, ZMQ_ROUTING_ID, route, strlen(route)), 0);
    if (keys) TEST_OK(curve_socket_client(w, keys, tinker_s.curve.public_key, &err), &err);
    cr_assert_eq(zmq_connect(w, tinker_s.tinker_endpoint), 0);
    return w;
}

/* The worker of job's current attempt as smeltd launches it: its keys, its routing id. */
static void *worker(const char *job, const char *route) {
    struct curve_keypair k = launch_keys(job);
    return worker_with(route, &k);
}

static void send_msg(void *w, const char *type, json_t *header) {
    struct smelt_error err = {0};
    TEST_OK(msg_send(w, NULL, 0, type, header, NULL, 0, &err), &err);
    json_decref(header);
}

static void hello(void *w, const char *job, int64_t attempt) {
    send_msg(w, MSG_TINKER_HELLO, json_pack("{s:s, s:I, s:i, s:s, s:i, s:i}", "job_id", job, "attempt",
                                            (json_int_t)attempt, "pid", 4242, "model", "/models/tiny", "vocab_size",
                                            64, "max_context", 128));
}

static void submit(const char *future, const char *op, const int32_t *tokens, int n_tokens) {
    json_t *h = json_pack("{s:s, s:s, s:i}", "op", op, "model_id", "m1", "v", 99);
    struct msg_array a = {(void *)tokens, (size_t)n_tokens * sizeof *tokens};
    struct smelt_error err = {0};
    TEST_OK(tinker_dispatch_submit(&tinker_s, JOB, future, h, &a, tokens ? 1 : 0, &err), &err);
    json_decref(h);
}

/* The next tinker.request within timeout_ms: its future id; "" when none came. */
static const char *next_request(void *w, int timeout_ms, char *id, size_t cap, struct msg *out) {
    struct msg m;
    struct smelt_error err = {0};
    id[0] = 0;
    if (msg_recv(w, false, timeout_ms, &m, &err) != 0) return id;
    cr_expect_str_eq(m.type, MSG_TINKER_REQUEST);
    cr_expect_eq(json_integer_value(json_object_get(m.header, "v")), MSG_VERSION, "the protocol's v, not the caller's");
    snprintf(id, cap, "%s", json_string_value(json_object_get(m.header, "id")) ?: "?");
    if (out) *out = m;
    else msg_free(&m);
    return id;
}

static void wait_status(const char *future, const char *want) {
    char status[32] = "";
    for (int64_t deadline = mono_ms() + 5000; mono_ms() < deadline; sleep_ms(10))
        if (strcmp(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", future, "status", status,
                               sizeof status), want) == 0)
            return;
    cr_assert_fail("future %s is %s, not %s", future, status, want);
}

Test(tinker_dispatch, requests_wait_for_the_hello_and_keep_their_submit_order) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    start();
    const int32_t tokens[3] = {5, 6, 7};
    submit("fut-1", "forward_backward", tokens, 3);
    submit("fut-2", "optim_step", NULL, 0);
    submit("fut-3", "forward", tokens, 2);
    void *w = worker(JOB, JOB ".1");
    char id[64];
    cr_expect_str_eq(next_request(w, 300, id, sizeof id, NULL), "", "a request before the worker's hello");
    hello(w, JOB, 1);
    struct msg first;
    cr_assert_str_eq(next_request(w, 3000, id, sizeof id, &first), "fut-1");
    cr_expect_str_eq(json_string_value(json_object_get(first.header, "op")), "forward_backward");
    cr_expect_str_eq(json_string_value(json_object_get(first.header, "model_id")), "m1");
    cr_assert_eq(first.n_arrays, 1);
    cr_expect_eq(first.arrays[0].bytes, sizeof tokens);
    cr_expect_eq(memcmp(first.arrays[0].data, tokens, sizeof tokens), 0, "the array as submitted");
    msg_free(&first);
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-2");
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-3");
    int64_t t0 = mono_ms();
    submit("fut-4", "forward", tokens, 1);
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-4");
    cr_expect_lt(mono_ms() - t0, SLOW_MS, "a submit after the hello waited for the poll (%lld ms)",
                 (long long)(mono_ms() - t0));
    char message[256];
    tinker_text("SELECT message FROM events WHERE job_id = ? ORDER BY id DESC LIMIT 1", JOB, "message", message,
                sizeof message);
    cr_expect(strstr(message, "Session worker ready (pid 4242)"), "event: %s", message);
    zmq_close(w);
}

Test(tinker_dispatch, a_result_is_stored_for_its_own_jobs_future_only) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    tinker_insert_job("ftjob-other", "default", "running", 1, 0);
    tinker_insert_future("fut-mine", JOB, "pending", 0);
    tinker_insert_future("fut-theirs", "ftjob-other", "pending", 0);
    start();
    void *w = worker(JOB, JOB ".1");
    hello(w, JOB, 1);
    send_msg(w, MSG_TINKER_RESULT, json_pack("{s:s, s:b}", "id", "fut-theirs", "ok", 1));
    send_msg(w, MSG_TINKER_RESULT, json_pack("{s:s, s:b, s:{s:{s:f}}}", "id", "fut-mine", "ok", 1, "result",
                                             "metrics", "loss:sum", 1.5));
    wait_status("fut-mine", "done");
    json_t *row = tinker_row("SELECT result AS result__json FROM tinker_futures WHERE id = ?", "fut-mine");
    cr_expect_eq(json_real_value(json_object_get(json_object_get(json_object_get(row, "result"), "metrics"),
                                                 "loss:sum")), 1.5);
    json_decref(row);
    char status[32];
    cr_expect_str_eq(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", "fut-theirs", "status", status,
                                 sizeof status), "pending", "another job's future answered by this worker");
    zmq_close(w);
}

Test(tinker_dispatch, a_stale_attempts_worker_gets_nothing_and_its_results_are_dropped) {
    tinker_insert_job(JOB, "default", "running", 2, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    start();
    struct curve_keypair old = launch_keys(JOB); /* attempt 1's, */
    struct curve_keypair now = launch_keys(JOB); /* replaced by attempt 2's launch */
    void *stale = worker_with(JOB ".1", &old);
    hello(stale, JOB, 1);
    send_msg(stale, MSG_TINKER_RESULT, json_pack("{s:s, s:b}", "id", "fut-1", "ok", 1));
    submit("fut-1", "forward", NULL, 0);
    char id[64];
    cr_expect_str_eq(next_request(stale, 500, id, sizeof id, NULL), "", "the stale worker got a request");
    char status[32];
    cr_expect_str_eq(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", "fut-1", "status", status,
                                 sizeof status), "pending", "the stale worker's result was stored");
    void *current = worker_with(JOB ".2", &now);
    hello(current, JOB, 2);
    cr_expect_str_eq(next_request(current, 3000, id, sizeof id, NULL), "fut-1");
    send_msg(current, MSG_TINKER_RESULT, json_pack("{s:s, s:b, s:{s:s, s:s}}", "id", "fut-1", "ok", 0, "error",
                                                   "message", "loss_fn: unknown \"foo\"", "category", "user"));
    wait_status("fut-1", "failed");
    zmq_close(stale);
    zmq_close(current);
}

/* Raw frames, for what msg_send would never send. */
static void send_frames(void *w, const char *const *frames, int n) {
    for (int i = 0; i < n; i++)
        cr_assert(zmq_send(w, frames[i], strlen(frames[i]), i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

Test(tinker_dispatch, garbage_is_ignored_and_the_dispatcher_keeps_serving) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    start();
    struct curve_keypair k = launch_keys(JOB);
    void *w = worker_with(JOB ".1", &k), *nameless = worker_with("no-attempt", &k);
    send_frames(w, (const char *const[]){"junk"}, 1);
    send_frames(w, (const char *const[]){MSG_TINKER_HELLO, "{not json"}, 2);
    send_frames(w, (const char *const[]){MSG_TINKER_HELLO, "[1, 2]"}, 2);
    send_frames(w, (const char *const[]){MSG_TINKER_HELLO, "{\"v\": 99, \"job_id\": \"" JOB "\", \"attempt\": 1}"}, 2);
    send_frames(w, (const char *const[]){"tinker.bogus", "{\"v\": 1}"}, 2);
    send_frames(w, (const char *const[]){MSG_TINKER_RESULT, "{\"v\": 1, \"id\": 7}"}, 2);
    send_msg(w, MSG_TINKER_HELLO, json_pack("{s:s, s:i}", "job_id", "ftjob-else", "attempt", 1));
    hello(nameless, JOB, 1);
    submit("fut-1", "forward", NULL, 0);
    char id[64];
    cr_expect_str_eq(next_request(w, 400, id, sizeof id, NULL), "", "a request after garbage alone");
    cr_expect_str_eq(next_request(nameless, 100, id, sizeof id, NULL), "", "a peer that is no job's worker");
    hello(w, JOB, 1);
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-1");
    send_msg(w, MSG_TINKER_RESULT, json_pack("{s:s, s:b, s:{}}", "id", "fut-1", "ok", 1, "result"));
    wait_status("fut-1", "done");
    zmq_close(w);
    zmq_close(nameless);
}

/* A worker with another job's keys passing for this job (its routing id), a worker with
 * this job's earlier attempt's keys, with keys of no job, or with none: none of them gets
 * a request or has a result stored. */
Test(tinker_dispatch, only_the_attempts_own_keys_get_in) {
    tinker_insert_job(JOB, "default", "running", 2, 0);
    tinker_insert_job("ftjob-other", "default", "running", 1, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    start();
    struct curve_keypair earlier = launch_keys(JOB), theirs = launch_keys("ftjob-other"), stranger;
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&stranger, &err), &err);
    launch_keys(JOB); /* attempt 2's launch replaced `earlier` */
    void *impostor = worker_with(JOB ".2", &theirs);
    void *old = worker_with(JOB ".1", &earlier), *nobody = worker_with(JOB ".2", &stranger);
    void *plain = worker_with(JOB ".2", NULL);
    void *all[] = {impostor, old, nobody, plain};
    for (int i = 0; i < 4; i++) {
        hello(all[i], JOB, i == 1 ? 1 : 2);
        send_msg(all[i], MSG_TINKER_RESULT, json_pack("{s:s, s:b, s:{}}", "id", "fut-1", "ok", 1, "result"));
    }
    submit("fut-1", "forward", NULL, 0);
    char id[64];
    for (int i = 0; i < 4; i++)
        cr_expect_str_eq(next_request(all[i], i ? 100 : 600, id, sizeof id, NULL), "", "worker %d got a request", i);
    char status[32];
    cr_expect_str_eq(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", "fut-1", "status", status,
                                 sizeof status), "pending", "a result from a worker without the attempt's keys");
    long allowed, refused;
    zap_handler_counts(tinker_s.zap, &allowed, &refused);
    cr_expect_eq(allowed, 1, "only the other job's own worker passes the handshake (as itself)");
    cr_expect_geq(refused, 2, "the earlier attempt's key and the stranger's are refused");
    for (int i = 0; i < 4; i++) zmq_close(all[i]);
}

Test(tinker_dispatch, a_forgotten_jobs_queue_is_dropped) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    start();
    submit("fut-1", "forward", NULL, 0);
    tinker_dispatch_forget(&tinker_s, JOB);
    submit("fut-2", "forward", NULL, 0);
    void *w = worker(JOB, JOB ".1");
    hello(w, JOB, 1);
    char id[64];
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-2", "fut-1 was forgotten");
    cr_expect_str_eq(next_request(w, 300, id, sizeof id, NULL), "");
    zmq_close(w);
}

/* A session job is inserted and its first requests queued inside the HTTP thread's
 * transaction; the sweep, on a connection of its own, cannot see the row until the commit.
 * The queue must outlive sweeps until then (it once dropped create_model, and the load_weights
 * after it found no model). */
Test(tinker_dispatch, a_queue_outlives_sweeps_until_its_jobs_row_commits) {
    start();
    submit("fut-1", "create_model", NULL, 0);
    sleep_ms(2500); /* two sweeps, the job not found */
    submit("fut-2", "load_weights", NULL, 0);
    tinker_insert_job(JOB, "default", "running", 1, 0);
    void *w = worker(JOB, JOB ".1");
    hello(w, JOB, 1);
    char id[64];
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-1", "the request sent before the commit");
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-2");
    zmq_close(w);
}

Test(tinker_dispatch, submit_without_a_dispatcher_is_an_error) {
    struct smelt_error err = {0};
    json_t *h = json_pack("{s:s}", "op", "forward");
    TEST_EXPECT_ERROR(tinker_dispatch_submit(&tinker_s, JOB, "fut-1", h, NULL, 0, &err), SMELT_EIO, &err);
    json_decref(h);
}

/* smeltd stops the dispatcher before its HTTP server: a handler's submit after that is refused, not queued. */
Test(tinker_dispatch, submit_after_stop_is_an_error) {
    start();
    tinker_dispatch_stop(&tinker_s);
    struct smelt_error err = {0};
    json_t *h = json_pack("{s:s}", "op", "forward");
    TEST_EXPECT_ERROR(tinker_dispatch_submit(&tinker_s, JOB, "fut-1", h, NULL, 0, &err), SMELT_EIO, &err);
    cr_assert(strstr(err.message, "stopped"), "%s", err.message);
    json_decref(h);
}

static void exec_sql(const char *sql) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_exec(c, &err, sql, "") >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

/* The store refuses the worker's answer (a trigger stands in for a full disk): the future
 * still ends, failed with why, and the job gets an event, so retrieve_future does not wait forever. */
Test(tinker_dispatch, a_result_the_store_refuses_fails_its_future) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    exec_sql("CREATE TRIGGER no_done BEFORE UPDATE OF status ON tinker_futures WHEN NEW.status = 'done' "
             "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END");
    start();
    void *w = worker(JOB, JOB ".1");
    hello(w, JOB, 1);
    send_msg(w, MSG_TINKER_RESULT, json_pack("{s:s, s:b, s:{s:{s:f}}}", "id", "fut-1", "ok", 1, "result",
                                             "metrics", "loss:sum", 1.5));
    wait_status("fut-1", "failed");
    json_t *row = tinker_row("SELECT error AS error__json FROM tinker_futures WHERE id = ?", "fut-1");
    json_t *e = json_object_get(row, "error");
    cr_expect_str_eq(json_string_value(json_object_get(e, "category")), "server");
    const char *message = json_string_value(json_object_get(e, "error"));
    cr_expect(message && strstr(message, "storing its result failed") && strstr(message, "disk is full"), "%s",
              message);
    json_decref(row);
    cr_expect(tinker_event_says(JOB, "Request fut-1 failed"));
    zmq_close(w);
}

/* A request the dispatcher cannot take (here: it is not running) fails its future at once, with an event. */
Test(tinker_dispatch, a_request_that_cannot_be_sent_fails_its_future) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    struct smelt_error err = {0};
    TEST_OK(tinker_api_start(&tinker_s, &err), &err);
    struct store_conn *c = tinker_conn();
    char fut[HTTP_ID_BYTES];
    cr_expect_neq(tinker_submit_quiet(&tinker_s, c, "default", "m1", JOB, "unload_model", NULL, json_object(), fut,
                                      sizeof fut, &err), 0);
    store_release(tinker_s.store, c);
    tinker_api_stop(&tinker_s);
    json_t *row = tinker_row("SELECT status, error AS error__json FROM tinker_futures WHERE id = ?", fut);
    cr_assert(row, "no future %s", fut);
    cr_expect_str_eq(json_string_value(json_object_get(row, "status")), "failed");
    json_t *e = json_object_get(row, "error");
    cr_expect_str_eq(json_string_value(json_object_get(e, "category")), "server");
    const char *message = json_string_value(json_object_get(e, "error"));
    cr_expect(message && strstr(message, "could not be sent"), "%s", message);
    json_decref(row);
    char text[HTTP_ID_BYTES + 32];
    snprintf(text, sizeof text, "Request %s failed", fut);
    cr_expect(tinker_event_says(JOB, text));
}

static void tick(void) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    TEST_OK(store_begin(c, &err), &err);
    tinker_jobs_tick(&tinker_s, c);
    TEST_OK(store_commit(c, &err), &err);
    store_release(tinker_s.store, c);
}

static void wait_hello(const char *job, int64_t attempt) {
    for (int64_t deadline = mono_ms() + 5000; mono_ms() < deadline; sleep_ms(10))
        if (tinker_dispatch_said_hello(&tinker_s, job, attempt)) return;
    cr_assert_fail("no hello from %s.%lld", job, (long long)attempt);
}

/* A worker that never says hello (crashed before connecting, or hung loading) past the
 * deadline: its job fails and the futures waiting for it fail; a worker that said hello,
 * or one just started, is left alone. */
Test(tinker_dispatch, a_worker_silent_past_the_hello_deadline_fails_its_job_and_futures) {
    int64_t now = server_now();
    tinker_insert_job("ftjob-silent", "default", "running", 1, now - 3600);
    tinker_insert_future("fut-silent", "ftjob-silent", "pending", now);
    tinker_insert_job("ftjob-ready", "default", "running", 1, now - 3600);
    tinker_insert_future("fut-ready", "ftjob-ready", "pending", now);
    tinker_insert_job("ftjob-young", "default", "running", 1, now);
    start();
    void *w = worker("ftjob-ready", "ftjob-ready.1");
    hello(w, "ftjob-ready", 1);
    wait_hello("ftjob-ready", 1);
    tick();
    char v[512];
    cr_expect_str_eq(tinker_text("SELECT status FROM jobs WHERE id = ?", "ftjob-silent", "status", v, sizeof v),
                     "failed");
    cr_expect(strstr(tinker_text("SELECT error FROM jobs WHERE id = ?", "ftjob-silent", "error", v, sizeof v),
                     "no tinker.hello"), "%s", v);
    cr_expect_str_eq(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", "fut-silent", "status", v,
                                 sizeof v), "failed");
    cr_expect(strstr(tinker_text("SELECT error FROM tinker_futures WHERE id = ?", "fut-silent", "error", v,
                                 sizeof v), "no tinker.hello"), "%s", v);
    cr_expect_str_eq(tinker_text("SELECT status FROM jobs WHERE id = ?", "ftjob-ready", "status", v, sizeof v),
                     "running");
    cr_expect_str_eq(tinker_text("SELECT status FROM tinker_futures WHERE id = ?", "fut-ready", "status", v,
                                 sizeof v), "pending");
    cr_expect_str_eq(tinker_text("SELECT status FROM jobs WHERE id = ?", "ftjob-young", "status", v, sizeof v),
                     "running");
    zmq_close(w);
}

/* The control loop's idle release, holding its transaction open a while (as a busy tick would). */
static atomic_int release_ticked;
static void *slow_release_tick(void *arg) {
    (void)arg;
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_begin(c, &err) == 0, "%s", err.message);
    tinker_jobs_tick(&tinker_s, c);
    atomic_store(&release_ticked, 1);
    sleep_ms(300);
    cr_assert(store_commit(c, &err) == 0, "%s", err.message);
    store_release(tinker_s.store, c);
    return NULL;
}

/* create_model arriving while the idle release of its base's job is being decided: it must
 * not be put on the job being released (its worker about to stop) but start a new one. */
Test(tinker_dispatch, create_model_racing_the_idle_release_gets_a_new_job) {
    char dir[SERVER_PATH_BYTES + 32], job[HTTP_ID_BYTES];
    snprintf(dir, sizeof dir, "%s/tiny", tinker_s.models_dir);
    cr_assert(mkdir(dir, 0700) == 0);
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/config.json");
    FILE *f = fopen(dir, "w");
    cr_assert(f && fputs("{\"architectures\": [\"LlamaForCausalLM\"]}", f) >= 0 && fclose(f) == 0);
    *strrchr(dir, '/') = 0;
    struct smelt_error err = {0};
    struct store_conn *c = tinker_conn();
    TEST_OK(tinker_session_job(&tinker_s, c, "default", "tiny", dir, job, sizeof job, &err), &err);
    int64_t now = server_now();
    cr_assert(store_exec(c, &err, "UPDATE jobs SET status = 'running', attempt = 1, devices = '[0]', "
                         "run_started_at = ? WHERE id = ?", "is", now - 3600, job) == 1, "%s", err.message);
    store_release(tinker_s.store, c);
    tinker_insert_model("m-old", "sess-1", job, now - 3600); /* the session silent past the idle window */
    tinker_s.config.tinker_idle_seconds = 60;
    TEST_OK(tinker_api_start(&tinker_s, &err), &err);
    start();
    char route[HTTP_ID_BYTES + 8];
    snprintf(route, sizeof route, "%s.1", job);
    void *w = worker(job, route);
    hello(w, job, 1);
    wait_hello(job, 1);
    pthread_t t;
    atomic_store(&release_ticked, 0);
    cr_assert(pthread_create(&t, NULL, slow_release_tick, NULL) == 0);
    while (!atomic_load(&release_ticked)) sleep_ms(1);
    const char *body = "{\"session_id\": \"sess-1\", \"model_seq_id\": 1, \"base_model\": \"tiny\", "
                       "\"lora_config\": {\"rank\": 8}}";
    struct http_request req = {.method = "POST", .body = body, .body_len = strlen(body)};
    snprintf(req.identity.project, sizeof req.identity.project, "default");
    struct http_response res = {0};
    api_tinker_create_model(&tinker_s, &req, &res);
    pthread_join(t, NULL);
    cr_expect_eq(res.status, 200, "%.*s", (int)res.body_len, res.body);
    free(res.body);
    char v[HTTP_ID_BYTES];
    cr_expect_str_eq(tinker_text("SELECT desired FROM jobs WHERE id = ?", job, "desired", v, sizeof v), "release");
    tinker_text("SELECT job_id FROM tinker_models WHERE id = ?", "sess-1:train:1", "job_id", v, sizeof v);
    cr_expect(v[0] && strcmp(v, job) != 0, "the new model went to %s, the job being released", v);
    tinker_api_stop(&tinker_s);
    zmq_close(w);
}

/* A request queued before its worker's hello is taken back (never sent); once sent it cannot be. */
Test(tinker_dispatch, a_request_cancelled_before_the_hello_is_never_sent) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    start();
    submit("fut-1", "optim_step", NULL, 0);
    submit("fut-2", "optim_step", NULL, 0);
    submit("fut-3", "optim_step", NULL, 0);
    cr_expect(tinker_dispatch_cancel(&tinker_s, JOB, "fut-2"));
    cr_expect(tinker_dispatch_cancel(&tinker_s, JOB, "fut-3"), "the queue's tail");
    cr_expect(!tinker_dispatch_cancel(&tinker_s, JOB, "fut-2"), "taken back twice");
    cr_expect(!tinker_dispatch_cancel(&tinker_s, "ftjob-other", "fut-1"), "another job's queue");
    submit("fut-4", "optim_step", NULL, 0); /* after the tail was taken: the queue still links */
    void *w = worker(JOB, JOB ".1");
    hello(w, JOB, 1);
    char id[64];
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-1");
    cr_expect_str_eq(next_request(w, 3000, id, sizeof id, NULL), "fut-4");
    cr_expect_str_eq(next_request(w, 300, id, sizeof id, NULL), "");
    cr_expect(!tinker_dispatch_cancel(&tinker_s, JOB, "fut-1"), "sent already");
    zmq_close(w);
}
