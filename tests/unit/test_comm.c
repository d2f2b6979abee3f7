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

/* ---- every operation, values checked exactly (tests/unit/comm_testutil.h) ------------- */

static void *host_put(const void *host, size_t bytes) {
    void *buf = malloc(bytes);
    if (buf) memcpy(buf, host, bytes);
    return buf;
}

static int host_get(void *host, const void *buf, size_t bytes) {
    memcpy(host, buf, bytes);
    return 0;
}

static const struct comm_test_mem HOST = {host_put, host_get, free};

#define CHECK COMM_TEST_CHECK

static void run_all_ok(int size, comm_test_fn fn) {
    comm_test_run_all_ok(&GLOO, size, fn, 15000);
}

static int every_op(struct comm *c, char *msg, size_t bytes) {
    return comm_test_every_op(&HOST, c, msg, bytes);
}

Test(comm, every_op_2_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(2, every_op);
}

Test(comm, every_op_4_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(4, every_op);
}

/* An odd ring: the reduce_scatter's parts travel 2 steps, some of them empty (1 element). */
Test(comm, every_op_3_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    run_all_ok(3, every_op);
}

static int overlap(struct comm *c, char *msg, size_t bytes) {
    return comm_test_overlap(&HOST, c, msg, bytes);
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
    int64_t t0 = mono_ms();
    cr_expect_eq(b->ops->get(b->impl, "w/x.y", 50, &data, &len, &err), SMELT_ENOTFOUND);
    cr_expect(mono_ms() - t0 >= 50);
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
    int64_t t0 = mono_ms();
    cr_expect_neq(comm_create(store, &o, &comm, &err), 0);
    cr_expect(mono_ms() - t0 < 3000);
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
