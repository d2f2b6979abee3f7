/* Helpers shared by the collectives' tests: tests/unit/test_comm.c (Gloo, host buffers)
 * and tests/gpu/test_gpu_comm.c (NCCL, device buffers). Each rank is a forked child on a
 * file store in the test's temporary folder; it writes its message to out.<rank> and
 * exits with its code. A killed or stopped rank must make the others fail, naming it,
 * within the timeout plus the naming grace; no child outlives its test. */
#ifndef SMELT_TESTS_COMM_TESTUTIL_H
#define SMELT_TESTS_COMM_TESTUTIL_H

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

static inline int64_t comm_test_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void comm_test_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

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
        if (comm_test_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("rank pid %d did not finish in time", (int)pid);
            return -1;
        }
        comm_test_sleep_ms(5);
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
    int64_t deadline = comm_test_now_ms() + budget_ms;
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
    int64_t t0 = comm_test_now_ms();
    struct smelt_error again;
    int rc = comm_barrier(c, NULL, &again);
    COMM_TEST_CHECK(rc != 0 && comm_is_broken(c, NULL) && comm_test_now_ms() - t0 < 100,
                    "not broken after: %s", err.message);
    snprintf(msg, bytes, "%s", err.message);
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
    int64_t give_up = comm_test_now_ms() + 10000 + slack_ms;
    while (!path_exists(marker) && comm_test_now_ms() < give_up) comm_test_sleep_ms(2);
    if (!path_exists(marker))
        for (int r = 0; r < size; r++) kill(pids[r], SIGKILL);
    cr_assert(path_exists(marker), "the victim never started its loop");
    kill(pids[victim], sig);
    int64_t t0 = comm_test_now_ms();
    int64_t deadline = t0 + 2 * setup->timeout_ms + slack_ms;
    for (int r = 0; r < size; r++) {
        if (r == victim) continue;
        int code = comm_test_reap(pids[r], deadline);
        char out[1024];
        comm_test_read_out(r, out, sizeof out);
        cr_expect_eq(code, 0, "rank %d exited %d: %s", r, code, out);
        cr_log_info("rank %d after %lld ms: %s", r, (long long)(comm_test_now_ms() - t0), out);
    }
    kill(pids[victim], SIGKILL);
    int status;
    cr_assert_eq(waitpid(pids[victim], &status, 0), pids[victim]);
}

#endif
