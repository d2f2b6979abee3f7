/* comm/'s NCCL backend on device buffers: the checks of the Gloo tests
 * (tests/unit/comm_testutil.h: every collective in f32 and bf16, sizes that divide by
 * the ranks and sizes that do not, a barrier, two requests waited for in reverse order),
 * with the buffers in device memory, and a rank killed or stopped mid-operation named by
 * the others within the timeout.
 *
 * Each rank is a forked process that picks GPU rank % device count. NCCL refuses two
 * ranks of one communicator on one device ("Duplicate GPU detected"), so the tests of 2
 * ranks need 2 GPUs and report themselves skipped with fewer; the 1-rank test runs on
 * one GPU (the whole path through NCCL: unique id through the store, non-blocking
 * initialisation, a launch per operation, events, finalize). Without a GPU, or in a
 * build without NCCL, every test reports itself skipped. */
#include "tests/unit/comm_testutil.h"

#ifndef SMELT_NCCL

Test(gpu_comm, needs_nccl) {
    cr_skip_test("a build without NCCL (the NCCL backend needs CUDA=1 and nccl.h)");
}

#else

#include <cuda_runtime.h>

/* NCCL's initialisation (bootstrap, topology search) takes seconds on a busy machine. */
#define TIMEOUT_MS 10000
#define FAULT_TIMEOUT_MS 5000

/* The number of CUDA devices, asked in a child: this process must not initialise CUDA,
 * since its children are the ranks and a CUDA context does not survive fork. */
static int device_count(void) {
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

static void require_gpus(int ranks) {
    int n = device_count();
    if (n == 0) cr_skip_test("no CUDA device");
    if (n < ranks)
        cr_skip_test("%d ranks need %d GPUs: NCCL refuses two ranks of one communicator on "
                     "one device (%d found)", ranks, ranks, n);
}

static int pick_device(int rank, char *msg, size_t bytes) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) e = cudaSetDevice(rank % n);
    if (e == cudaSuccess) e = cudaFree(NULL); /* the context now, not inside the timeout */
    COMM_TEST_CHECK(e == cudaSuccess, "picking a GPU: %s", cudaGetErrorString(e));
    return 0;
}

static const struct comm_test_setup NCCL_RANKS = {
    .backend = COMM_BACKEND_NCCL, .timeout_ms = TIMEOUT_MS, .before = pick_device};
static const struct comm_test_setup NCCL_FAULT = {
    .backend = COMM_BACKEND_NCCL, .timeout_ms = FAULT_TIMEOUT_MS, .before = pick_device};

static void *device_put(const void *host, size_t bytes) {
    void *buf = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) return NULL;
    if (cudaMemcpy(buf, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(buf);
        return NULL;
    }
    return buf;
}

static int device_get(void *host, const void *buf, size_t bytes) {
    return cudaMemcpy(host, buf, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

static void device_release(void *buf) { cudaFree(buf); }

static const struct comm_test_mem DEVICE = {device_put, device_get, device_release};

static int every_op(struct comm *c, char *msg, size_t bytes) {
    return comm_test_every_op(&DEVICE, c, msg, bytes);
}

static int overlap(struct comm *c, char *msg, size_t bytes) {
    return comm_test_overlap(&DEVICE, c, msg, bytes);
}

/* A host buffer is refused by name before anything is launched (the communicator
 * stays usable); then every operation. */
static int refuses_host_memory(struct comm *c, char *msg, size_t bytes) {
    float host[4] = {1, 2, 3, 4};
    struct smelt_error err;
    int rc = comm_all_reduce(c, host, 4, COMM_F32, COMM_SUM, NULL, &err);
    COMM_TEST_CHECK(rc == SMELT_EINVAL && strcmp(err.field, "buf") == 0 &&
                    strstr(err.message, "host memory"), "host buffer: rc %d field '%s': %s", rc,
                    err.field, err.message);
    COMM_TEST_CHECK(!comm_is_broken(c, NULL), "broken by a refused call");
    return every_op(c, msg, bytes);
}

Test(gpu_comm, every_op_1_rank, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    require_gpus(1);
    comm_test_run_all_ok(&NCCL_RANKS, 1, refuses_host_memory, 120000);
}

Test(gpu_comm, every_op_2_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    require_gpus(2);
    comm_test_run_all_ok(&NCCL_RANKS, 2, every_op, 120000);
}

Test(gpu_comm, async_overlap_out_of_order, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    require_gpus(2);
    comm_test_run_all_ok(&NCCL_RANKS, 2, overlap, 120000);
}

/* ---- failures ---------------------------------------------------------------------- */

static int never_runs(struct comm *c, char *msg, size_t bytes) {
    (void)c;
    COMM_TEST_CHECK(false, "the communicator was made without rank 1");
}

/* Rank 1 of 2 never comes: rank 0's comm_create fails at the timeout naming it (before
 * NCCL's own initialisation, which would only time out). One GPU is enough. */
Test(gpu_comm, missing_rank_is_named_at_creation, .init = test_tmp_setup,
     .fini = test_tmp_teardown) {
    require_gpus(1);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) comm_test_rank_main(&NCCL_FAULT, 0, 2, never_runs);
    int code = comm_test_reap(pid, mono_ms() + FAULT_TIMEOUT_MS + 15000);
    char out[1024];
    comm_test_read_out(0, out, sizeof out);
    cr_expect_eq(code, 10, "exit %d: %s", code, out);
    cr_expect(strstr(out, "rank 1 did not join within"), "%s", out);
}

#define VICTIM 1

static int until_failure(struct comm *c, char *msg, size_t bytes) {
    enum { N = 1 << 22 };
    void *buf = NULL;
    COMM_TEST_CHECK(cudaMalloc(&buf, N * sizeof(float)) == cudaSuccess, "cudaMalloc");
    COMM_TEST_CHECK(cudaMemset(buf, 0, N * sizeof(float)) == cudaSuccess, "cudaMemset");
    int rc = comm_test_until_failure(c, buf, N, VICTIM, msg, bytes);
    cudaFree(buf);
    return rc;
}

/* The survivor fails within the timeout (an NCCL error or no progress), then waits up to
 * the naming grace: twice the timeout, plus slack for the abort and a busy machine. */
Test(gpu_comm, killed_rank_is_named, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    require_gpus(2);
    comm_test_fault(&NCCL_FAULT, 2, VICTIM, until_failure, SIGKILL, 8000);
}

Test(gpu_comm, stopped_rank_is_named_at_timeout, .init = test_tmp_setup,
     .fini = test_tmp_teardown) {
    require_gpus(2);
    comm_test_fault(&NCCL_FAULT, 2, VICTIM, until_failure, SIGSTOP, 8000);
}

#endif
