/* comm/: collectives over Gloo between forked ranks on loopback, through a file store in
 * a temporary folder (tests/unit/comm_testutil.h). Values are small integers so that
 * every sum is exact in f32 and bf16. A rank killed or stopped mid-operation must make
 * the others fail, naming it, within the timeout (plus the naming grace); no child
 * outlives its test. The NCCL backend's tests: tests/gpu/test_gpu_comm.c. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "kernels/ops.h"
#include "tests/unit/comm_testutil.h"

#define TIMEOUT_MS 1000

static const struct comm_test_setup GLOO = {.backend = COMM_BACKEND_GLOO,
                                            .timeout_ms = TIMEOUT_MS};

/* ---- helpers ---------------------------------------------------------------------- */

static float get_val(const void *buf, enum comm_dtype dt, size_t i) {
    return dt == COMM_F32 ? ((const float *)buf)[i] : bf16_to_f32(((const uint16_t *)buf)[i]);
}

static void set_val(void *buf, enum comm_dtype dt, size_t i, float v) {
    if (dt == COMM_F32) ((float *)buf)[i] = v;
    else ((uint16_t *)buf)[i] = f32_to_bf16(v);
}

static void *alloc_buf(size_t n, enum comm_dtype dt) {
    return calloc(n ? n : 1, dt == COMM_F32 ? 4 : 2);
}

static void run_all_ok(int size, comm_test_fn fn) {
    comm_test_run_all_ok(&GLOO, size, fn, 15000);
}

/* ---- every operation, values checked exactly ----------------------------------------- */

#define CHECK COMM_TEST_CHECK

static int check_all_reduce(struct comm *c, enum comm_dtype dt, size_t n, char *msg,
                            size_t bytes) {
    int r = comm_rank(c), size = comm_size(c);
    void *sum = alloc_buf(n, dt), *mx = alloc_buf(n, dt);
    for (size_t i = 0; i < n; i++) {
        set_val(sum, dt, i, (float)(r + 1 + (int)(i % 5)));
        set_val(mx, dt, i, (float)((r * 7 + (int)i) % 11));
    }
    struct smelt_error err;
    int rc = comm_all_reduce(c, sum, n, dt, COMM_SUM, NULL, &err);
    if (!rc) rc = comm_all_reduce(c, mx, n, dt, COMM_MAX, NULL, &err);
    for (size_t i = 0; !rc && i < n; i++) {
        float want_sum = (float)(size * (size + 1) / 2 + size * (int)(i % 5)), want_max = 0;
        for (int q = 0; q < size; q++)
            if ((q * 7 + (int)i) % 11 > want_max) want_max = (float)((q * 7 + (int)i) % 11);
        if (get_val(sum, dt, i) != want_sum || get_val(mx, dt, i) != want_max) {
            snprintf(msg, bytes, "all_reduce dt %d n %zu [%zu]: sum %g (want %g) max %g (want %g)",
                     dt, n, i, get_val(sum, dt, i), want_sum, get_val(mx, dt, i), want_max);
            rc = 1;
        }
    }
    if (rc > 1 || rc < 0) snprintf(msg, bytes, "all_reduce: %s", err.message);
    free(sum);
    free(mx);
    return rc ? 1 : 0;
}

static int check_reduce_scatter(struct comm *c, enum comm_dtype dt, size_t n, char *msg,
                                size_t bytes) {
    int r = comm_rank(c), size = comm_size(c);
    size_t off, len;
    comm_shard(n, size, r, &off, &len);
    void *send = alloc_buf(n, dt), *recv = alloc_buf(len, dt);
    for (size_t i = 0; i < n; i++) set_val(send, dt, i, (float)(r + (int)(i % 3)));
    struct smelt_error err;
    int rc = comm_reduce_scatter(c, send, recv, n, dt, COMM_SUM, NULL, &err);
    if (rc) snprintf(msg, bytes, "reduce_scatter: %s", err.message);
    for (size_t j = 0; !rc && j < len; j++) {
        float want = (float)(size * (size - 1) / 2 + size * (int)((off + j) % 3));
        if (get_val(recv, dt, j) != want) {
            snprintf(msg, bytes, "reduce_scatter dt %d n %zu [%zu]: %g, want %g", dt, n, j,
                     get_val(recv, dt, j), want);
            rc = 1;
        }
    }
    free(send);
    free(recv);
    return rc ? 1 : 0;
}

static int check_all_gather(struct comm *c, enum comm_dtype dt, size_t n, char *msg,
                            size_t bytes) {
    size_t off, len;
    comm_shard(n, comm_size(c), comm_rank(c), &off, &len);
    void *send = alloc_buf(len, dt), *recv = alloc_buf(n, dt);
    for (size_t j = 0; j < len; j++) set_val(send, dt, j, (float)((off + j) % 200));
    struct smelt_error err;
    int rc = comm_all_gather(c, send, recv, n, dt, NULL, &err);
    if (rc) snprintf(msg, bytes, "all_gather: %s", err.message);
    for (size_t i = 0; !rc && i < n; i++)
        if (get_val(recv, dt, i) != (float)(i % 200)) {
            snprintf(msg, bytes, "all_gather dt %d n %zu [%zu]: %g", dt, n, i,
                     get_val(recv, dt, i));
            rc = 1;
        }
    free(send);
    free(recv);
    return rc ? 1 : 0;
}

static int check_broadcast(struct comm *c, enum comm_dtype dt, size_t n, char *msg,
                           size_t bytes) {
    int root = comm_size(c) - 1;
    void *buf = alloc_buf(n, dt);
    for (size_t i = 0; i < n; i++)
        set_val(buf, dt, i, comm_rank(c) == root ? (float)(i % 100) : -1.0f);
    struct smelt_error err;
    int rc = comm_broadcast(c, buf, n, dt, root, NULL, &err);
    if (rc) snprintf(msg, bytes, "broadcast: %s", err.message);
    for (size_t i = 0; !rc && i < n; i++)
        if (get_val(buf, dt, i) != (float)(i % 100)) {
            snprintf(msg, bytes, "broadcast dt %d n %zu [%zu]: %g", dt, n, i, get_val(buf, dt, i));
            rc = 1;
        }
    free(buf);
    return rc ? 1 : 0;
}

static int every_op(struct comm *c, char *msg, size_t bytes) {
    static const size_t SIZES[] = {1, 7, 1001, 70001};
    for (int dt = COMM_F32; dt <= COMM_BF16; dt++)
        for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++) {
            size_t n = SIZES[k];
            if (check_all_reduce(c, dt, n, msg, bytes) || check_reduce_scatter(c, dt, n, msg, bytes) ||
                check_all_gather(c, dt, n, msg, bytes) || check_broadcast(c, dt, n, msg, bytes))
                return 1;
        }
    struct smelt_error err;
    CHECK(comm_barrier(c, NULL, &err) == 0, "barrier: %s", err.message);
    CHECK(!comm_is_broken(c, NULL), "broken after success");
    return 0;
}

Test(comm, every_op_2_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(2, every_op);
}

Test(comm, every_op_4_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(4, every_op);
}

/* Two operations in flight while the caller computes, waited for in reverse order. */
static int overlap(struct comm *c, char *msg, size_t bytes) {
    enum { N = 300001 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    CHECK(a && b, "out of memory");
    for (int i = 0; i < N; i++) a[i] = 1, b[i] = (float)(i % 4);
    struct comm_request *ra, *rb;
    struct smelt_error err;
    CHECK(comm_all_reduce(c, a, N, COMM_F32, COMM_SUM, &ra, &err) == 0, "issue a: %s", err.message);
    CHECK(comm_all_reduce(c, b, N, COMM_F32, COMM_MAX, &rb, &err) == 0, "issue b: %s", err.message);
    volatile double busy = 0; /* the caller's compute meanwhile */
    for (int i = 0; i < 1000000; i++) busy += i * 0.5;
    CHECK(comm_wait(rb, &err) == 0, "wait b: %s", err.message);
    CHECK(comm_wait(ra, &err) == 0, "wait a: %s", err.message);
    for (int i = 0; i < N; i++)
        CHECK(a[i] == (float)comm_size(c) && b[i] == (float)(i % 4), "[%d]: %g %g", i, a[i], b[i]);
    free(a);
    free(b);
    return 0;
}

Test(comm, async_overlap_out_of_order, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(2, overlap);
}

/* ---- failures ---------------------------------------------------------------------- */

#define VICTIM 2
#define FAULT_RANKS 4

/* All-reduces until one fails (comm_test_until_failure). */
static int until_failure(struct comm *c, char *msg, size_t bytes) {
    enum { N = 1 << 18 };
    float *buf = calloc(N, sizeof *buf);
    CHECK(buf, "out of memory");
    int rc = comm_test_until_failure(c, buf, N, VICTIM, msg, bytes);
    free(buf);
    return rc;
}

/* The timeout, the naming grace (as long) and slack for 2 busy cores. */
static void fault(int sig) {
    comm_test_fault(&GLOO, FAULT_RANKS, VICTIM, until_failure, sig, 3000);
}

Test(comm, killed_rank_is_named, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    fault(SIGKILL);
}

Test(comm, stopped_rank_is_named_at_timeout, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    fault(SIGSTOP);
}

/* ---- rendezvous and arguments ------------------------------------------------------- */

Test(comm, file_store_set_get_wait, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s/rdv", test_tmp_dir);
    struct comm_store *a, *b;
    struct smelt_error err;
    cr_assert_eq(comm_store_open(spec, "job-a", &a, &err), 0, "%s", err.message);
    cr_assert_eq(comm_store_open(spec, "job-b", &b, &err), 0, "%s", err.message);
    cr_assert_eq(a->ops->set(a->impl, "w/x.y", "hello", 5, &err), 0, "%s", err.message);
    void *data;
    size_t len;
    cr_assert_eq(a->ops->get(a->impl, "w/x.y", 0, &data, &len, &err), 0, "%s", err.message);
    cr_expect(len == 5 && memcmp(data, "hello", 5) == 0);
    free(data);
    /* Another job's keys are apart; a missing key fails at its deadline. */
    int64_t t0 = comm_now_ms();
    cr_expect_eq(b->ops->get(b->impl, "w/x.y", 50, &data, &len, &err), SMELT_ENOTFOUND);
    cr_expect(comm_now_ms() - t0 >= 50);
    cr_expect(strstr(err.message, "w/x.y"), "%s", err.message);
    const char *keys[] = {"w/x.y", "w/z"};
    cr_expect_eq(a->ops->wait(a->impl, keys, 2, 30, &err), SMELT_ENOTFOUND);
    cr_expect(strstr(err.message, "'w/z'"), "%s", err.message);
    cr_assert_eq(a->ops->set(a->impl, "w/z", "", 0, &err), 0, "%s", err.message);
    cr_expect_eq(a->ops->wait(a->impl, keys, 2, 30, &err), 0, "%s", err.message);
    comm_store_close(a);
    comm_store_close(b);
}

Test(comm, bad_arguments_name_the_field, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct comm_store *store;
    struct smelt_error err;
    cr_expect_eq(comm_store_open("tcp:1.2.3.4:5", "j", &store, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rendezvous");
    cr_expect_eq(comm_store_open("file:/tmp", "../x", &store, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "job");
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    cr_assert_eq(comm_store_open(spec, "j", &store, &err), 0, "%s", err.message);
    struct comm *comm;
    struct comm_options o = {.rank = 2, .size = 2, .name = "w", .timeout_ms = 100};
    cr_expect_eq(comm_create(store, &o, &comm, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rank");
    o.rank = 0;
    o.name = "a/b";
    cr_expect_eq(comm_create(store, &o, &comm, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "name");
    /* Rank 1 never comes: creation fails at the timeout, naming its key. */
    o.name = "w";
    o.timeout_ms = 300;
    int64_t t0 = comm_now_ms();
    cr_expect_neq(comm_create(store, &o, &comm, &err), 0);
    cr_expect(comm_now_ms() - t0 < 3000);
    cr_expect(strstr(err.message, "w/gloo/1"), "%s", err.message);
    /* A communicator of one rank needs no peer. */
    o.size = 1;
    o.name = "solo";
    cr_assert_eq(comm_create(store, &o, &comm, &err), 0, "%s", err.message);
    float x[3] = {1, 2, 3}, y[3];
    cr_expect_eq(comm_all_reduce(comm, x, 3, COMM_F32, COMM_SUM, NULL, &err), 0, "%s", err.message);
    cr_expect_eq(comm_reduce_scatter(comm, x, y, 3, COMM_F32, COMM_SUM, NULL, &err), 0, "%s",
                 err.message);
    cr_expect(y[0] == 1 && y[2] == 3);
    cr_expect_eq(comm_broadcast(comm, x, 3, COMM_F32, 1, NULL, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "root");
    cr_expect_eq(comm_all_reduce(comm, x, 3, 7, COMM_SUM, NULL, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "dtype");
    comm_destroy(comm);
    comm_store_close(store);
}

/* The NCCL backend exists only in builds with CUDA and NCCL; elsewhere it is refused by
 * name, as an unknown backend is, before anything is connected. */
Test(comm, backend_not_built_is_refused_by_name, .init = test_tmp_setup,
     .fini = test_tmp_teardown) {
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    struct comm_store *store;
    struct smelt_error err;
    cr_assert_eq(comm_store_open(spec, "j", &store, &err), 0, "%s", err.message);
    struct comm *comm = NULL;
    struct comm_options o = {.rank = 0, .size = 1, .name = "w", .timeout_ms = 100,
                             .backend = (enum comm_backend)7};
    cr_expect_eq(comm_create(store, &o, &comm, &err), SMELT_EUNSUPPORTED);
    cr_expect_str_eq(err.field, "backend");
    cr_expect(strstr(err.message, "backend 7 (unknown)"), "%s", err.message);
    o.backend = COMM_BACKEND_NCCL;
#ifdef SMELT_NCCL
    comm_store_close(store);
    cr_skip_test("this build has NCCL: tests/gpu/test_gpu_comm.c tests that backend");
#else
    cr_expect_eq(comm_create(store, &o, &comm, &err), SMELT_EUNSUPPORTED);
    cr_expect_str_eq(err.field, "backend");
    cr_expect(strstr(err.message, "NCCL") && strstr(err.message, "not built"), "%s",
              err.message);
    cr_expect_null(comm);
    comm_store_close(store);
#endif
}
