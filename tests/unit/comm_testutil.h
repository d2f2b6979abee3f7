/* Helpers shared by the collectives' tests: tests/unit/test_comm.c (Gloo, host buffers)
 * and tests/gpu/test_gpu_comm.c (NCCL, device buffers). Each rank is a forked child on a
 * file store in the test's temporary folder; it writes its message to out.<rank> and
 * exits with its code. The checks build their values on the host and move them through
 * a struct comm_test_mem (host or device memory); values are small integers, so every
 * sum is exact in f32 and bf16 and is compared exactly. A killed or stopped rank must
 * make the others fail, naming it, within the timeout plus the naming grace; no child
 * outlives its test. */
#ifndef SMELT_TESTS_COMM_TESTUTIL_H
#define SMELT_TESTS_COMM_TESTUTIL_H

#include "common/clock.h"
#include "tests/unit/testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/file.h"
#include "kernels/ops.h"

#define COMM_TEST_MAX_RANKS 4

/* A rank's body: returns 0 or a failure with its message in msg. */
typedef int (*comm_test_fn)(struct comm *comm, char *msg, size_t bytes);

struct comm_test_setup {
    enum comm_backend backend;
    int timeout_ms;
    /* Run in each child before its communicator is made (the NCCL test picks the
     * rank's GPU); NULL for none. Returns 0 or a failure with its message in msg. */
    int (*before)(int rank, char *msg, size_t bytes);
};

/* Sets msg and returns 1 from a rank's body when cond is false. */
#define COMM_TEST_CHECK(cond, ...)                          \
    do {                                                    \
        if (!(cond)) {                                      \
            snprintf(msg, bytes, __VA_ARGS__);              \
            return 1;                                       \
        }                                                   \
    } while (0)

/* Child body: connect as rank, run fn, write its message to out.<rank>, exit with its
 * code (never returns). */
static inline _Noreturn void comm_test_rank_main(const struct comm_test_setup *setup, int rank,
                                                 int size, comm_test_fn fn) {
    char msg[1024] = "";
    struct smelt_error err = {0};
    struct comm_store *store = NULL;
    struct comm *comm = NULL;
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    int code = 0;
    struct comm_options o = {.rank = rank, .size = size, .name = "world", .host = "127.0.0.1",
                             .timeout_ms = setup->timeout_ms, .backend = setup->backend};
    if (setup->before && setup->before(rank, msg, sizeof msg)) {
        code = 11;
    } else if (comm_store_open(spec, "job-1", &store, &err) ||
               comm_create(store, &o, &comm, &err)) {
        snprintf(msg, sizeof msg, "setup: %s", err.message);
        code = 10;
    } else {
        code = fn(comm, msg, sizeof msg);
    }
    comm_destroy(comm);
    comm_store_close(store);
    char path[256], name[32];
    snprintf(name, sizeof name, "out.%d", rank);
    test_tmp_path(path, sizeof path, name);
    file_write_atomic(path, msg, strlen(msg), NULL);
    _exit(code);
}

static inline void comm_test_spawn(const struct comm_test_setup *setup, int size,
                                   comm_test_fn fn, pid_t *pids) {
    for (int r = 0; r < size; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) comm_test_rank_main(setup, r, size, fn);
    }
}

/* Reaps pid by deadline (ms); kills it (and fails) past it. Returns its exit code. */
static inline int comm_test_reap(pid_t pid, int64_t deadline) {
    int status;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid) break;
        if (mono_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("rank pid %d did not finish in time", (int)pid);
            return -1;
        }
        sleep_ms(5);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline void comm_test_read_out(int rank, char *buf, size_t bytes) {
    char path[256], name[32], *data = NULL;
    size_t len;
    snprintf(name, sizeof name, "out.%d", rank);
    test_tmp_path(path, sizeof path, name);
    buf[0] = '\0';
    if (file_read_all(path, &data, &len, NULL) == 0) snprintf(buf, bytes, "%s", data);
    free(data);
}

/* Runs fn on size ranks; every rank must exit 0 within budget_ms. */
static inline void comm_test_run_all_ok(const struct comm_test_setup *setup, int size,
                                        comm_test_fn fn, int budget_ms) {
    pid_t pids[COMM_TEST_MAX_RANKS];
    comm_test_spawn(setup, size, fn, pids);
    int64_t deadline = mono_ms() + budget_ms;
    for (int r = 0; r < size; r++) {
        int code = comm_test_reap(pids[r], deadline);
        char out[1024];
        comm_test_read_out(r, out, sizeof out);
        cr_expect_eq(code, 0, "rank %d exited %d: %s", r, code, out);
    }
}

/* Does msg ("...: ranks 1, 2 dead or not answering ...") name rank among the silent
 * ones? The dead rank is always among them; a healthy rank too slow to report on an
 * overloaded machine may be named beside it (comm/README.md). */
static inline bool comm_test_names_rank(const char *msg, int rank) {
    const char *end = strstr(msg, " dead or not answering");
    const char *p = end ? strstr(msg, ": rank") : NULL;
    if (!p || p > end) return false;
    for (p += strlen(": rank"); p < end; p++)
        if (*p >= '0' && *p <= '9') {
            char *next;
            if (strtol(p, &next, 10) == rank) return true;
            p = next - 1;
        }
    return false;
}

/* Rank body for the fault tests: all-reduces buf (count f32) until one fails; rank
 * victim writes the marker victim-looping once it is in the loop. Returns 0 when the
 * failure names victim and the communicator fails at once afterwards. */
static inline int comm_test_until_failure(struct comm *c, void *buf, size_t count, int victim,
                                          char *msg, size_t bytes) {
    struct smelt_error err;
    for (int iter = 0;; iter++) {
        if (iter == 3 && comm_rank(c) == victim) {
            char path[256];
            test_tmp_path(path, sizeof path, "victim-looping");
            file_write_atomic(path, "", 0, NULL);
        }
        if (comm_all_reduce(c, buf, count, COMM_F32, COMM_SUM, NULL, &err)) break;
    }
    int64_t t0 = mono_ms();
    struct smelt_error again;
    int rc = comm_barrier(c, NULL, &again);
    COMM_TEST_CHECK(rc != 0 && comm_is_broken(c, NULL) && mono_ms() - t0 < 100,
                    "not broken after: %s", err.message);
    snprintf(msg, bytes, "%s", err.message);
    int at_fault[COMM_TEST_MAX_RANKS];
    int n = comm_fault_ranks(c, at_fault, COMM_TEST_MAX_RANKS);
    COMM_TEST_CHECK(n == 1 && at_fault[0] == victim, "comm_fault_ranks gave %d ranks (first %d), not rank %d: %s", n,
                    n ? at_fault[0] : -1, victim, err.message);
    return comm_test_names_rank(err.message, victim) ? 0 : 1;
}

/* Starts size ranks running fn (which loops on comm_test_until_failure), sends sig to
 * victim once it loops, and expects every other rank to exit 0 within twice the timeout
 * (the operation's, then the naming grace) plus slack_ms. */
static inline void comm_test_fault(const struct comm_test_setup *setup, int size, int victim,
                                   comm_test_fn fn, int sig, int slack_ms) {
    pid_t pids[COMM_TEST_MAX_RANKS];
    comm_test_spawn(setup, size, fn, pids);
    char marker[256];
    test_tmp_path(marker, sizeof marker, "victim-looping");
    int64_t give_up = mono_ms() + 10000 + slack_ms;
    while (!path_exists(marker) && mono_ms() < give_up) sleep_ms(2);
    if (!path_exists(marker))
        for (int r = 0; r < size; r++) kill(pids[r], SIGKILL);
    cr_assert(path_exists(marker), "the victim never started its loop");
    kill(pids[victim], sig);
    int64_t t0 = mono_ms();
    int64_t deadline = t0 + 2 * setup->timeout_ms + slack_ms;
    for (int r = 0; r < size; r++) {
        if (r == victim) continue;
        int code = comm_test_reap(pids[r], deadline);
        char out[1024];
        comm_test_read_out(r, out, sizeof out);
        cr_expect_eq(code, 0, "rank %d exited %d: %s", r, code, out);
        cr_log_info("rank %d after %lld ms: %s", r, (long long)(mono_ms() - t0), out);
    }
    kill(pids[victim], SIGKILL);
    int status;
    cr_assert_eq(waitpid(pids[victim], &status, 0), pids[victim]);
}

/* ---- every operation, values checked exactly ----------------------------------------- */

/* Where a backend's buffers live. put returns a buffer holding a copy of host (NULL when
 * it cannot); get copies one back. */
struct comm_test_mem {
    void *(*put)(const void *host, size_t bytes);
    int (*get)(void *host, const void *buf, size_t bytes);
    void (*release)(void *buf);
};

static inline float comm_test_get(const void *buf, enum comm_dtype dt, size_t i) {
    return dt == COMM_F32 ? ((const float *)buf)[i] : bf16_to_f32(((const uint16_t *)buf)[i]);
}

static inline void comm_test_set(void *buf, enum comm_dtype dt, size_t i, float v) {
    if (dt == COMM_F32) ((float *)buf)[i] = v;
    else ((uint16_t *)buf)[i] = f32_to_bf16(v);
}

static inline size_t comm_test_bytes(size_t n, enum comm_dtype dt) {
    return (n ? n : 1) * (dt == COMM_F32 ? 4 : 2);
}

/* A host array of n elements of dt, zeroed. */
static inline void *comm_test_host(size_t n, enum comm_dtype dt) {
    return calloc(1, comm_test_bytes(n, dt));
}

/* Runs one collective on copies of the host arrays in mem (a and b, n_a and n_b elements;
 * b may be NULL) and copies the results back into them. */
typedef int (*comm_test_op)(struct comm *c, void *a, void *b, const void *arg,
                            struct smelt_error *err);
static inline int comm_test_through(const struct comm_test_mem *mem, struct comm *c,
                                    comm_test_op op, const void *arg, void *a, size_t bytes_a,
                                    void *b, size_t bytes_b, struct smelt_error *err) {
    void *da = mem->put(a, bytes_a), *db = b ? mem->put(b, bytes_b) : NULL;
    int rc = !da || (b && !db) ? error_set(err, SMELT_ENOMEM, "test buffers") : SMELT_OK;
    if (!rc) rc = op(c, da, db, arg, err);
    if (!rc && mem->get(a, da, bytes_a)) rc = error_set(err, SMELT_EIO, "copy back");
    if (!rc && b && mem->get(b, db, bytes_b)) rc = error_set(err, SMELT_EIO, "copy back");
    if (da) mem->release(da);
    if (db) mem->release(db);
    return rc;
}

struct comm_test_args {
    size_t n;
    enum comm_dtype dt;
    enum comm_reduce op;
    int root;
};

static inline int comm_test_op_all_reduce(struct comm *c, void *a, void *b, const void *arg,
                                          struct smelt_error *err) {
    const struct comm_test_args *x = arg;
    (void)b;
    return comm_all_reduce(c, a, x->n, x->dt, x->op, NULL, err);
}

static inline int comm_test_op_reduce_scatter(struct comm *c, void *a, void *b,
                                              const void *arg, struct smelt_error *err) {
    const struct comm_test_args *x = arg;
    return comm_reduce_scatter(c, a, b, x->n, x->dt, x->op, NULL, err);
}

static inline int comm_test_op_all_gather(struct comm *c, void *a, void *b, const void *arg,
                                          struct smelt_error *err) {
    const struct comm_test_args *x = arg;
    return comm_all_gather(c, a, b, x->n, x->dt, NULL, err);
}

static inline int comm_test_op_broadcast(struct comm *c, void *a, void *b, const void *arg,
                                         struct smelt_error *err) {
    const struct comm_test_args *x = arg;
    (void)b;
    return comm_broadcast(c, a, x->n, x->dt, x->root, NULL, err);
}

/* Sum and max over the ranks, against the values computed here. */
static inline int comm_test_all_reduce(const struct comm_test_mem *mem, struct comm *c,
                                       enum comm_dtype dt, size_t n, char *msg, size_t bytes) {
    int r = comm_rank(c), size = comm_size(c), bad = 0;
    void *sum = comm_test_host(n, dt), *mx = comm_test_host(n, dt);
    COMM_TEST_CHECK(sum && mx, "out of memory");
    for (size_t i = 0; i < n; i++) {
        comm_test_set(sum, dt, i, (float)(r + 1 + (int)(i % 5)));
        comm_test_set(mx, dt, i, (float)((r * 7 + (int)i) % 11));
    }
    struct smelt_error err;
    struct comm_test_args as = {n, dt, COMM_SUM, 0}, am = {n, dt, COMM_MAX, 0};
    int rc = comm_test_through(mem, c, comm_test_op_all_reduce, &as, sum, comm_test_bytes(n, dt),
                               NULL, 0, &err);
    if (!rc) rc = comm_test_through(mem, c, comm_test_op_all_reduce, &am, mx,
                                    comm_test_bytes(n, dt), NULL, 0, &err);
    if (rc) snprintf(msg, bytes, "all_reduce: %s", err.message);
    for (size_t i = 0; !rc && !bad && i < n; i++) {
        float want_sum = (float)(size * (size + 1) / 2 + size * (int)(i % 5)), want_max = 0;
        for (int q = 0; q < size; q++)
            if ((q * 7 + (int)i) % 11 > want_max) want_max = (float)((q * 7 + (int)i) % 11);
        float got_sum = comm_test_get(sum, dt, i), got_max = comm_test_get(mx, dt, i);
        if (got_sum != want_sum || got_max != want_max)
            bad = snprintf(msg, bytes, "all_reduce dt %d n %zu [%zu]: sum %g (want %g) max %g "
                           "(want %g)", dt, n, i, got_sum, want_sum, got_max, want_max);
    }
    free(sum);
    free(mx);
    return rc || bad ? 1 : 0;
}

static inline int comm_test_reduce_scatter(const struct comm_test_mem *mem, struct comm *c,
                                           enum comm_dtype dt, size_t n, char *msg,
                                           size_t bytes) {
    int r = comm_rank(c), size = comm_size(c), bad = 0;
    size_t off, len;
    comm_shard(n, size, r, &off, &len);
    void *send = comm_test_host(n, dt), *recv = comm_test_host(len, dt);
    COMM_TEST_CHECK(send && recv, "out of memory");
    for (size_t i = 0; i < n; i++) comm_test_set(send, dt, i, (float)(r + (int)(i % 3)));
    struct smelt_error err;
    struct comm_test_args a = {n, dt, COMM_SUM, 0};
    int rc = comm_test_through(mem, c, comm_test_op_reduce_scatter, &a, send,
                               comm_test_bytes(n, dt), recv, comm_test_bytes(len, dt), &err);
    if (rc) snprintf(msg, bytes, "reduce_scatter: %s", err.message);
    for (size_t j = 0; !rc && !bad && j < len; j++) {
        float want = (float)(size * (size - 1) / 2 + size * (int)((off + j) % 3));
        if (comm_test_get(recv, dt, j) != want)
            bad = snprintf(msg, bytes, "reduce_scatter dt %d n %zu [%zu]: %g, want %g", dt, n,
                           j, comm_test_get(recv, dt, j), want);
    }
    free(send);
    free(recv);
    return rc || bad ? 1 : 0;
}

static inline int comm_test_all_gather(const struct comm_test_mem *mem, struct comm *c,
                                       enum comm_dtype dt, size_t n, char *msg, size_t bytes) {
    size_t off, len;
    int bad = 0;
    comm_shard(n, comm_size(c), comm_rank(c), &off, &len);
    void *send = comm_test_host(len, dt), *recv = comm_test_host(n, dt);
    COMM_TEST_CHECK(send && recv, "out of memory");
    for (size_t j = 0; j < len; j++) comm_test_set(send, dt, j, (float)((off + j) % 200));
    struct smelt_error err;
    struct comm_test_args a = {n, dt, COMM_SUM, 0};
    int rc = comm_test_through(mem, c, comm_test_op_all_gather, &a, send,
                               comm_test_bytes(len, dt), recv, comm_test_bytes(n, dt), &err);
    if (rc) snprintf(msg, bytes, "all_gather: %s", err.message);
    for (size_t i = 0; !rc && !bad && i < n; i++)
        if (comm_test_get(recv, dt, i) != (float)(i % 200))
            bad = snprintf(msg, bytes, "all_gather dt %d n %zu [%zu]: %g", dt, n, i,
                           comm_test_get(recv, dt, i));
    free(send);
    free(recv);
    return rc || bad ? 1 : 0;
}

static inline int comm_test_broadcast(const struct comm_test_mem *mem, struct comm *c,
                                      enum comm_dtype dt, size_t n, char *msg, size_t bytes) {
    int root = comm_size(c) - 1, bad = 0;
    void *buf = comm_test_host(n, dt);
    COMM_TEST_CHECK(buf, "out of memory");
    for (size_t i = 0; i < n; i++)
        comm_test_set(buf, dt, i, comm_rank(c) == root ? (float)(i % 100) : -1.0f);
    struct smelt_error err;
    struct comm_test_args a = {n, dt, COMM_SUM, root};
    int rc = comm_test_through(mem, c, comm_test_op_broadcast, &a, buf, comm_test_bytes(n, dt),
                               NULL, 0, &err);
    if (rc) snprintf(msg, bytes, "broadcast: %s", err.message);
    for (size_t i = 0; !rc && !bad && i < n; i++)
        if (comm_test_get(buf, dt, i) != (float)(i % 100))
            bad = snprintf(msg, bytes, "broadcast dt %d n %zu [%zu]: %g", dt, n, i,
                           comm_test_get(buf, dt, i));
    free(buf);
    return rc || bad ? 1 : 0;
}

/* Every collective in f32 and bf16 at sizes that divide by the ranks or not (1 < 2
 * ranks: empty shards), then a barrier; the communicator must not be broken after. */
static inline int comm_test_every_op(const struct comm_test_mem *mem, struct comm *c, char *msg,
                                     size_t bytes) {
    static const size_t SIZES[] = {1, 7, 1001, 70001, 65536};
    for (int dt = COMM_F32; dt <= COMM_BF16; dt++)
        for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++) {
            size_t n = SIZES[k];
            if (comm_test_all_reduce(mem, c, dt, n, msg, bytes) ||
                comm_test_reduce_scatter(mem, c, dt, n, msg, bytes) ||
                comm_test_all_gather(mem, c, dt, n, msg, bytes) ||
                comm_test_broadcast(mem, c, dt, n, msg, bytes))
                return 1;
        }
    struct smelt_error err;
    COMM_TEST_CHECK(comm_barrier(c, NULL, &err) == 0, "barrier: %s", err.message);
    COMM_TEST_CHECK(!comm_is_broken(c, NULL), "broken after success");
    return 0;
}

/* Two all-reduces in flight while the caller computes, waited for in reverse order. */
static inline int comm_test_overlap(const struct comm_test_mem *mem, struct comm *c, char *msg,
                                    size_t bytes) {
    enum { N = 300001 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    COMM_TEST_CHECK(a && b, "out of memory");
    for (int i = 0; i < N; i++) a[i] = 1, b[i] = (float)(i % 4);
    void *da = mem->put(a, N * sizeof *a), *db = mem->put(b, N * sizeof *b);
    COMM_TEST_CHECK(da && db, "test buffers");
    struct comm_request *ra, *rb;
    struct smelt_error err;
    COMM_TEST_CHECK(comm_all_reduce(c, da, N, COMM_F32, COMM_SUM, &ra, &err) == 0, "issue a: %s",
                    err.message);
    COMM_TEST_CHECK(comm_all_reduce(c, db, N, COMM_F32, COMM_MAX, &rb, &err) == 0, "issue b: %s",
                    err.message);
    volatile double busy = 0; /* the caller's compute meanwhile */
    for (int i = 0; i < 1000000; i++) busy += i * 0.5;
    COMM_TEST_CHECK(comm_wait(rb, &err) == 0, "wait b: %s", err.message);
    COMM_TEST_CHECK(comm_wait(ra, &err) == 0, "wait a: %s", err.message);
    COMM_TEST_CHECK(!mem->get(a, da, N * sizeof *a) && !mem->get(b, db, N * sizeof *b),
                    "copy back");
    for (int i = 0; i < N; i++)
        COMM_TEST_CHECK(a[i] == (float)comm_size(c) && b[i] == (float)(i % 4), "[%d]: %g %g", i,
                        a[i], b[i]);
    mem->release(da);
    mem->release(db);
    free(a);
    free(b);
    return 0;
}

#endif
