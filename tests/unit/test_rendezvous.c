/* server/rendezvous.c through comm/'s "smeltd:ENDPOINT" store (comm/store_smeltd.c), over
 * the real CURVE ROUTER on loopback: set/get, a get that waits for a set from another
 * connection, a timeout (and the thread answering others while a get waits), a retried
 * attempt's and another job's keys invisible, the ended attempt refused, a stranger's
 * keys refused at the handshake, the key and byte limits refused by name, and an
 * attempt's table freed (its waiter answered) when the attempt ends. */
#include "tests/unit/tinker_testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "common/curve.h"

#define JOB "ftjob-rdzv1"
#define JOB2 "ftjob-rdzv2"

static void rdzv_setup(void) {
    tinker_setup();
    tinker_s.zmq = zmq_ctx_new();
    cr_assert(tinker_s.zmq);
    tinker_s.config.rendezvous_bind = "tcp://127.0.0.1:*";
    tinker_s.config.rendezvous_max_keys = 4;
    tinker_s.config.rendezvous_max_bytes = 512;
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&tinker_s.curve, &err), &err);
    TEST_OK(zap_handler_start(tinker_s.zmq, &tinker_s.zap, &err), &err);
    TEST_OK(rendezvous_start(&tinker_s, &err), &err);
    cr_assert(strncmp(tinker_s.rendezvous_endpoint, "tcp://127.0.0.1:", 16) == 0, "%s", tinker_s.rendezvous_endpoint);
}

static void rdzv_teardown(void) {
    rendezvous_free(&tinker_s); /* its socket before the ZAP handler stops */
    tinker_teardown();
}

TestSuite(rendezvous, .init = rdzv_setup, .fini = rdzv_teardown, .timeout = 60);

static void exec_sql(const char *sql, const char *a, const char *b) {
    struct smelt_error err = {0};
    struct store_conn *c = tinker_conn();
    cr_assert(store_exec(c, &err, sql, "ss", a, b) >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

/* The keys control.c's launch gives job's current attempt (stored as worker_public_key). */
static struct curve_job_keys launch_keys(const char *job) {
    struct curve_job_keys k = {.present = true};
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&k.worker, &err), &err);
    memcpy(k.server_public_key, tinker_s.curve.public_key, CURVE_KEY_BYTES);
    exec_sql("UPDATE jobs SET worker_public_key = ? WHERE id = ?", k.worker.public_key, job);
    return k;
}

static struct comm_store *open_store(const struct curve_job_keys *k) {
    char spec[300];
    snprintf(spec, sizeof spec, "smeltd:%s", tinker_s.rendezvous_endpoint);
    struct comm_store *st = NULL;
    struct smelt_error err = {0};
    TEST_OK(comm_store_open_keys(spec, "trainer", k, &st, &err), &err);
    return st;
}

static int get_text(struct comm_store *st, const char *key, int timeout_ms, char *out, size_t cap,
                    struct smelt_error *err) {
    void *data = NULL;
    size_t len = 0;
    int rc = st->ops->get(st->impl, key, timeout_ms, &data, &len, err);
    if (!rc) snprintf(out, cap, "%.*s", (int)len, (const char *)data);
    free(data);
    return rc;
}

static void set_text(struct comm_store *st, const char *key, const char *text) {
    struct smelt_error err = {0};
    TEST_OK(st->ops->set(st->impl, key, text, strlen(text), &err), &err);
}

struct later_set {
    struct comm_store *st;
    const char *key, *text;
    int after_ms;
};

static void *set_later(void *arg) {
    struct later_set *l = arg;
    sleep_ms(l->after_ms);
    set_text(l->st, l->key, l->text);
    return NULL;
}

Test(rendezvous, set_get_and_wait_across_connections) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    struct curve_job_keys k = launch_keys(JOB);
    struct comm_store *rank0 = open_store(&k), *rank1 = open_store(&k);
    set_text(rank0, "addr/0", "tcp://10.0.0.1:7000");
    char text[128];
    struct smelt_error err = {0};
    TEST_OK(get_text(rank1, "addr/0", 0, text, sizeof text, &err), &err);
    cr_expect_str_eq(text, "tcp://10.0.0.1:7000");
    /* a get that waits is answered as soon as another rank sets the key */
    struct later_set l = {rank0, "addr/1", "tcp://10.0.0.2:7000", 300};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, set_later, &l), 0);
    int64_t t0 = mono_ms();
    TEST_OK(get_text(rank1, "addr/1", 10000, text, sizeof text, &err), &err);
    int64_t took = mono_ms() - t0;
    pthread_join(t, NULL);
    cr_expect_str_eq(text, "tcp://10.0.0.2:7000");
    cr_expect(took >= 250 && took < 3000, "waited %lld ms", (long long)took);
    const char *both[] = {"addr/0", "addr/1"};
    TEST_OK(rank0->ops->wait(rank0->impl, both, 2, 1000, &err), &err);
    cr_expect_eq(rendezvous_keys_held(&tinker_s, JOB ".1"), 2);
    comm_store_close(rank0);
    comm_store_close(rank1);
}

struct waiting_get {
    struct comm_store *st;
    int timeout_ms, rc;
    struct smelt_error err;
    int64_t took;
};

static void *get_in_thread(void *arg) {
    struct waiting_get *g = arg;
    char text[64];
    int64_t t0 = mono_ms();
    g->rc = get_text(g->st, "never", g->timeout_ms, text, sizeof text, &g->err);
    g->took = mono_ms() - t0;
    return NULL;
}

Test(rendezvous, timeout_and_others_served_meanwhile) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    struct curve_job_keys k = launch_keys(JOB);
    struct comm_store *a = open_store(&k), *b = open_store(&k);
    struct waiting_get g = {.st = a, .timeout_ms = 1500};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, get_in_thread, &g), 0);
    sleep_ms(100);
    int64_t t0 = mono_ms();
    set_text(b, "x", "1");
    char text[16];
    struct smelt_error err = {0};
    TEST_OK(get_text(b, "x", 0, text, sizeof text, &err), &err);
    cr_expect(mono_ms() - t0 < 1000, "a waiting get held the server %lld ms", (long long)(mono_ms() - t0));
    pthread_join(t, NULL);
    cr_expect_eq(g.rc, SMELT_ENOTFOUND, "%d %s", g.rc, g.err.message);
    cr_expect(strstr(g.err.message, "'never' not set within 1500 ms"), "%s", g.err.message);
    cr_expect(g.took >= 1400 && g.took < 4000, "took %lld ms", (long long)g.took);
    comm_store_close(a);
    comm_store_close(b);
}

Test(rendezvous, other_attempts_and_jobs_see_nothing) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    tinker_insert_job(JOB2, "p1", "running", 1, 0);
    struct curve_job_keys k1 = launch_keys(JOB), other = launch_keys(JOB2);
    struct comm_store *first = open_store(&k1), *job2 = open_store(&other);
    set_text(first, "secret", "attempt-1");
    char text[64];
    struct smelt_error err = {0};
    cr_expect_eq(get_text(job2, "secret", 0, text, sizeof text, &err), SMELT_ENOTFOUND, "%s", err.message);
    /* the job is retried: attempt 2 with new keys sees nothing of attempt 1 */
    exec_sql("UPDATE jobs SET attempt = ? WHERE id = ?", "2", JOB);
    struct curve_job_keys k2 = launch_keys(JOB);
    struct comm_store *second = open_store(&k2);
    cr_expect_eq(get_text(second, "secret", 0, text, sizeof text, &err), SMELT_ENOTFOUND, "%s", err.message);
    /* attempt 1's connection is still open, but its attempt is no longer running */
    cr_expect_eq(first->ops->set(first->impl, "late", "x", 1, &err), SMELT_EIO);
    cr_expect(strstr(err.message, JOB ".1 is not its job's running attempt"), "%s", err.message);
    comm_store_close(first);
    comm_store_close(second);
    comm_store_close(job2);
}

Test(rendezvous, stranger_and_keyless_refused) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    launch_keys(JOB);
    struct curve_job_keys stranger = {.present = true};
    struct smelt_error err = {0};
    TEST_OK(curve_keypair_new(&stranger.worker, &err), &err);
    memcpy(stranger.server_public_key, tinker_s.curve.public_key, CURVE_KEY_BYTES);
    struct comm_store *st = open_store(&stranger);
    char text[16];
    cr_expect_eq(get_text(st, "anything", 0, text, sizeof text, &err), SMELT_EIO);
    cr_expect(strstr(err.message, "did not answer"), "%s", err.message);
    long allowed = 0, refused = 0;
    zap_handler_counts(tinker_s.zap, &allowed, &refused);
    cr_expect_gt(refused, 0);
    cr_expect_eq(allowed, 0);
    comm_store_close(st);
    char spec[300];
    snprintf(spec, sizeof spec, "smeltd:%s", tinker_s.rendezvous_endpoint);
    struct comm_store *none = NULL;
    cr_expect_eq(comm_store_open_keys(spec, "trainer", NULL, &none, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rendezvous");
}

Test(rendezvous, limits_refused_by_name) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    struct curve_job_keys k = launch_keys(JOB);
    struct comm_store *st = open_store(&k);
    char key[16];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        set_text(st, key, "v");
    }
    struct smelt_error err = {0};
    cr_expect_eq(st->ops->set(st->impl, "k4", "v", 1, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rendezvous_max_keys");
    set_text(st, "k0", "replaced"); /* a key set again is no new key */
    char big[600];
    memset(big, 'b', sizeof big);
    cr_expect_eq(st->ops->set(st->impl, "k1", big, sizeof big, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rendezvous_max_bytes");
    char text[32];
    TEST_OK(get_text(st, "k1", 0, text, sizeof text, &err), &err);
    cr_expect_str_eq(text, "v", "a refused set leaves the old value");
    comm_store_close(st);
}

Test(rendezvous, freed_when_the_attempt_ends) {
    tinker_insert_job(JOB, "p1", "running", 1, 0);
    struct curve_job_keys k = launch_keys(JOB);
    struct comm_store *st = open_store(&k), *waiter = open_store(&k);
    set_text(st, "a", "1");
    set_text(st, "b", "2");
    cr_expect_eq(rendezvous_keys_held(&tinker_s, JOB ".1"), 2);
    struct waiting_get g = {.st = waiter, .timeout_ms = 20000};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, get_in_thread, &g), 0);
    sleep_ms(100);
    exec_sql("UPDATE jobs SET status = ? WHERE id = ?", "failed", JOB);
    int64_t deadline = mono_ms() + 5000;
    while (rendezvous_keys_held(&tinker_s, JOB ".1") > 0 && mono_ms() < deadline) sleep_ms(20);
    cr_expect_eq(rendezvous_keys_held(&tinker_s, JOB ".1"), 0);
    pthread_join(t, NULL);
    cr_expect_eq(g.rc, SMELT_EIO, "%d %s", g.rc, g.err.message);
    cr_expect(g.took < 5000, "the waiter was told after %lld ms", (long long)g.took);
    comm_store_close(st);
    comm_store_close(waiter);
}
