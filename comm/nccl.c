/* The NCCL transport: device buffers, one CUDA stream per communicator, and a request
 * that is an event recorded on that stream after its operation.
 *
 * Nothing here may hang. NCCL's communicator is non-blocking (config.blocking = 0): any
 * call may answer ncclInProgress, and its state is then polled (ncclCommGetAsyncError)
 * to a deadline before the next call. comm_wait polls the oldest unfinished request's
 * event and the communicator's asynchronous error; at the timeout or at an error the
 * NCCL communicator is aborted (ncclCommAbort ends its kernels, so the stream drains),
 * and comm/fault.c names the ranks at fault through the store, as for Gloo.
 *
 * Rendezvous: rank 0 puts ncclGetUniqueId's id in the store under <name>/nccl/id; every
 * rank announces itself under <name>/nccl/rank/<r> and waits for the others first, so a
 * rank that never comes is named (NCCL's own initialisation would only time out).
 *
 * Compiled in builds with CUDA and NCCL only (the Makefile's NCCL=1, SMELT_NCCL). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

struct nccl_ctx {
    ncclComm_t nc;        /* NULL once aborted or destroyed */
    cudaStream_t stream;  /* the communicator's own, non-blocking */
    cudaEvent_t ready;    /* recorded on the legacy default stream at each issue */
    float *scratch;       /* device: one float, the barrier's all-reduce */
    int device;
    /* When the oldest unfinished operation may have started: the end of the one before
     * it, or its issue when none was in flight. */
    int64_t progress_ms;
};

/* ---- errors --------------------------------------------------------------------------- */

static int cuda_fail(struct smelt_error *err, const char *what, const char *call,
                     cudaError_t e) {
    (void)cudaGetLastError(); /* so that the CUDA backend does not report it again */
    return error_set(err, e == cudaErrorMemoryAllocation ? SMELT_ENOMEM : SMELT_EBACKEND,
                     "%s: %s failed: %s (%s)", what, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

static int nccl_fail(struct smelt_error *err, ncclComm_t nc, const char *what,
                     ncclResult_t r) {
    const char *last = ncclGetLastError(nc);
    return error_set(err, SMELT_EBACKEND, "%s: %s%s%s%s", what, ncclGetErrorString(r),
                     last && *last ? " (" : "", last ? last : "", last && *last ? ")" : "");
}

/* Polls while a call is in progress; the first spins are cheap, then 1 ms sleeps. */
static void pause_poll(int spins) {
    if (spins < 200) sched_yield();
    else sleep_ms(1);
}

/* After a call that answered r: waits until the communicator is no longer busy with it,
 * up to deadline. */
static int settle(ncclComm_t nc, ncclResult_t r, int64_t deadline, const char *what,
                  struct smelt_error *err) {
    for (int spins = 0; r == ncclInProgress; spins++) {
        if (mono_ms() > deadline)
            return error_set(err, SMELT_EBACKEND, "%s: still in progress at the timeout", what);
        pause_poll(spins);
        ncclResult_t q = ncclCommGetAsyncError(nc, &r);
        if (q != ncclSuccess) r = q;
    }
    return r == ncclSuccess ? SMELT_OK : nccl_fail(err, nc, what, r);
}

/* ---- connecting ----------------------------------------------------------------------- */

static void ctx_free(struct nccl_ctx *ctx) {
    if (!ctx) return;
    if (ctx->scratch) (void)cudaFree(ctx->scratch);
    if (ctx->ready) (void)cudaEventDestroy(ctx->ready);
    if (ctx->stream) (void)cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError();
    free(ctx);
}

static int ctx_device_setup(struct nccl_ctx *ctx, struct smelt_error *err) {
    const char *what = "NCCL backend";
    cudaError_t e = cudaGetDevice(&ctx->device);
    if (e != cudaSuccess) return cuda_fail(err, what, "cudaGetDevice (no usable device?)", e);
    if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(err, what, "cudaStreamCreateWithFlags", e);
    if ((e = cudaEventCreateWithFlags(&ctx->ready, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(err, what, "cudaEventCreateWithFlags", e);
    if ((e = cudaMalloc((void **)&ctx->scratch, sizeof *ctx->scratch)) != cudaSuccess)
        return cuda_fail(err, what, "cudaMalloc", e);
    return SMELT_OK;
}

/* Rank 0 makes the id and publishes it; the others read it (waiting to deadline). */
static int share_id(struct comm *comm, ncclUniqueId *id, int64_t deadline,
                    struct smelt_error *err) {
    char key[COMM_KEY_BYTES];
    snprintf(key, sizeof key, "%s/nccl/id", comm->name);
    struct comm_store *st = comm->store;
    if (comm->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess) return nccl_fail(err, NULL, "ncclGetUniqueId", r);
        return st->ops->set(st->impl, key, id, sizeof *id, err);
    }
    int64_t left = deadline - mono_ms();
    void *data;
    size_t len;
    int rc = st->ops->get(st->impl, key, left > 0 ? (int)left : 0, &data, &len, err);
    if (rc) return error_wrap(err, rc, "rank 0 did not publish the NCCL id");
    if (len == sizeof *id) memcpy(id, data, sizeof *id);
    free(data);
    if (len != sizeof *id)
        return error_set(err, SMELT_EFORMAT, "store key '%s' holds %zu bytes, not an NCCL id "
                         "(%zu)", key, len, sizeof *id);
    return SMELT_OK;
}

/* Announces this rank, then waits to deadline for the others, naming the missing ones. */
static int join(struct comm *comm, int64_t deadline, struct smelt_error *err) {
    char key[COMM_KEY_BYTES], missing[160] = "";
    struct comm_store *st = comm->store;
    snprintf(key, sizeof key, "%s/nccl/rank/%d", comm->name, comm->rank);
    TRY(st->ops->set(st->impl, key, "", 0, err));
    int n = 0;
    size_t used = 0;
    for (int r = 0; r < comm->size; r++) {
        snprintf(key, sizeof key, "%s/nccl/rank/%d", comm->name, r);
        int64_t left = deadline - mono_ms();
        struct smelt_error ignored;
        if (!st->ops->wait(st->impl, (const char *const[]){key}, 1, left > 0 ? (int)left : 0,
                           &ignored))
            continue;
        if (used < sizeof missing)
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                     n ? ", " : "", r);
        n++;
    }
    if (n)
        return error_set(err, SMELT_ENOTFOUND, "rank%s %s did not join within %d ms",
                         n > 1 ? "s" : "", missing, comm->timeout_ms);
    return SMELT_OK;
}

static int init_comm(struct nccl_ctx *ctx, struct comm *comm, ncclUniqueId id,
                     int64_t deadline, struct smelt_error *err) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&ctx->nc, comm->size, id, comm->rank, &config);
    int rc = r == ncclSuccess || r == ncclInProgress
                 ? settle(ctx->nc, r, deadline, "ncclCommInitRankConfig", err)
                 : nccl_fail(err, NULL, "ncclCommInitRankConfig", r);
    if (rc && ctx->nc) {
        (void)ncclCommAbort(ctx->nc);
        ctx->nc = NULL;
    }
    return rc;
}

static int nccl_connect(struct comm *comm, const struct comm_options *options,
                        struct smelt_error *err) {
    (void)options;
    int64_t deadline = mono_ms() + comm->timeout_ms;
    struct nccl_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return error_set(err, SMELT_ENOMEM, "NCCL backend: out of memory");
    ncclUniqueId id;
    int rc = ctx_device_setup(ctx, err);
    if (!rc) rc = share_id(comm, &id, deadline, err);
    if (!rc) rc = join(comm, deadline, err);
    if (!rc) rc = init_comm(ctx, comm, id, deadline, err);
    if (rc) {
        ctx_free(ctx);
        return rc;
    }
    comm->nccl = ctx;
    return SMELT_OK;
}

/* ---- issuing -------------------------------------------------------------------------- */

static ncclDataType_t nccl_dtype(enum comm_dtype dtype) {
    return dtype == COMM_BF16 ? ncclBfloat16 : ncclFloat32;
}

static size_t dtype_bytes(enum comm_dtype dtype) { return dtype == COMM_BF16 ? 2 : 4; }

/* Unequal shards (count % size != 0): NCCL's reduce_scatter and all_gather take equal
 * ones, so then one reduce (all_gather: one broadcast) per shard to (from) its owner, in
 * a group. */
typedef ncclResult_t (*shard_fn)(struct nccl_ctx *ctx, const struct comm *comm,
                                 const struct comm_request *req, int owner, size_t off,
                                 size_t len);

static ncclResult_t per_shard(struct nccl_ctx *ctx, const struct comm *comm,
                              const struct comm_request *req, shard_fn fn) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (int r = 0; r < comm->size; r++) {
        size_t off, len;
        comm_shard(req->count, comm->size, r, &off, &len);
        ncclResult_t x = len ? fn(ctx, comm, req, r, off, len) : ncclSuccess;
        if (first == ncclSuccess) first = x;
    }
    ncclResult_t end = ncclGroupEnd();
    return first != ncclSuccess ? first : end;
}

static ncclResult_t reduce_shard(struct nccl_ctx *ctx, const struct comm *comm,
                                 const struct comm_request *req, int owner, size_t off,
                                 size_t len) {
    (void)comm;
    const char *send = (const char *)req->send + off * dtype_bytes(req->dtype);
    /* Only the owner writes its recvbuff; the others pass theirs, untouched. */
    return ncclReduce(send, req->recv, len, nccl_dtype(req->dtype),
                      req->op == COMM_MAX ? ncclMax : ncclSum, owner, ctx->nc, ctx->stream);
}

static ncclResult_t gather_shard(struct nccl_ctx *ctx, const struct comm *comm,
                                 const struct comm_request *req, int owner, size_t off,
                                 size_t len) {
    char *dst = (char *)req->recv + off * dtype_bytes(req->dtype);
    const void *src = owner == comm->rank ? req->send : dst; /* read on the owner only */
    return ncclBroadcast(src, dst, len, nccl_dtype(req->dtype), owner, ctx->nc, ctx->stream);
}

static ncclResult_t launch(struct nccl_ctx *ctx, const struct comm *comm,
                           const struct comm_request *req) {
    ncclDataType_t dt = nccl_dtype(req->dtype);
    ncclRedOp_t op = req->op == COMM_MAX ? ncclMax : ncclSum;
    bool equal = req->count % (size_t)comm->size == 0;
    size_t shard = req->count / (size_t)comm->size;
    switch (req->kind) {
    case COMM_K_ALL_REDUCE:
        return ncclAllReduce(req->recv, req->recv, req->count, dt, op, ctx->nc, ctx->stream);
    case COMM_K_REDUCE_SCATTER:
        return equal ? ncclReduceScatter(req->send, req->recv, shard, dt, op, ctx->nc,
                                         ctx->stream)
                     : per_shard(ctx, comm, req, reduce_shard);
    case COMM_K_ALL_GATHER:
        return equal ? ncclAllGather(req->send, req->recv, shard, dt, ctx->nc, ctx->stream)
                     : per_shard(ctx, comm, req, gather_shard);
    case COMM_K_BROADCAST:
        return ncclBroadcast(req->recv, req->recv, req->count, dt, req->root, ctx->nc,
                             ctx->stream);
    case COMM_K_BARRIER:
        return ncclAllReduce(ctx->scratch, ctx->scratch, 1, ncclFloat32, ncclSum, ctx->nc,
                             ctx->stream);
    }
    return ncclInvalidArgument;
}

/* Orders the operation after the default stream's work, launches it on the
 * communicator's stream and records req's event after it. */
static int enqueue(struct nccl_ctx *ctx, const struct comm *comm, struct comm_request *req,
                   struct smelt_error *err) {
    const char *what = comm_kind_name(req->kind);
    cudaError_t e = cudaEventRecord(ctx->ready, cudaStreamLegacy);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(ctx->stream, ctx->ready, 0);
    if (e != cudaSuccess) return cuda_fail(err, what, "ordering after the default stream", e);
    TRY(settle(ctx->nc, launch(ctx, comm, req), mono_ms() + comm->timeout_ms, what, err));
    cudaEvent_t done;
    if ((e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(err, what, "cudaEventCreateWithFlags", e);
    req->event = done;
    if ((e = cudaEventRecord(done, ctx->stream)) != cudaSuccess)
        return cuda_fail(err, what, "cudaEventRecord", e);
    return SMELT_OK;
}

/* A buffer of the communicator's device, or SMELT_EINVAL naming field. */
static int check_buffer(const struct nccl_ctx *ctx, const void *p, const char *what,
                        const char *field, struct smelt_error *err) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return error_set_field(err, SMELT_EINVAL, field, "%s: %s is not CUDA memory (%s)", what,
                               field, cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return error_set_field(err, SMELT_EINVAL, field, "%s: %s is host memory; the NCCL "
                               "backend takes device buffers", what, field);
    if (a.type == cudaMemoryTypeDevice && a.device != ctx->device)
        return error_set_field(err, SMELT_EINVAL, field, "%s: %s is on CUDA device %d, the "
                               "communicator on device %d", what, field, a.device, ctx->device);
    return SMELT_OK;
}

/* The calling thread's device must be the communicator's (the default stream that the
 * operation is ordered after is the current device's), and the buffers on it. */
static int check_call(const struct nccl_ctx *ctx, const struct comm *comm,
                      const struct comm_request *req, struct smelt_error *err) {
    const char *what = comm_kind_name(req->kind);
    int device;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return cuda_fail(err, what, "cudaGetDevice", e);
    if (device != ctx->device)
        return error_set(err, SMELT_EINVAL, "%s: called with CUDA device %d current; the "
                         "communicator is on device %d", what, device, ctx->device);
    size_t off, len;
    comm_shard(req->count, comm->size, comm->rank, &off, &len);
    bool whole = req->count > 0, shard = len > 0;
    switch (req->kind) {
    case COMM_K_ALL_REDUCE:
    case COMM_K_BROADCAST: return whole ? check_buffer(ctx, req->recv, what, "buf", err) : 0;
    case COMM_K_REDUCE_SCATTER:
        if (whole) TRY(check_buffer(ctx, req->send, what, "send", err));
        return shard ? check_buffer(ctx, req->recv, what, "recv", err) : 0;
    case COMM_K_ALL_GATHER:
        if (shard) TRY(check_buffer(ctx, req->send, what, "send", err));
        return whole ? check_buffer(ctx, req->recv, what, "recv", err) : 0;
    case COMM_K_BARRIER: return SMELT_OK;
    }
    return SMELT_OK;
}

/* ---- failing -------------------------------------------------------------------------- */

static void finish(struct comm_request *req, int rc, const struct smelt_error *err) {
    req->rc = rc;
    if (rc) req->err = *err;
    req->done = true;
}

/* Under the lock, after operation seq failed with err: aborts the NCCL communicator
 * (its kernels end, so nothing more runs on the stream), names the ranks at fault, and
 * fails every request in flight with that. The communicator is broken after. */
static void break_locked(struct comm *comm, uint64_t seq, const char *what,
                         struct smelt_error *err) {
    struct nccl_ctx *ctx = comm->nccl;
    if (ctx->nc) {
        (void)ncclCommAbort(ctx->nc);
        ctx->nc = NULL;
    }
    int rc = comm_name_faults(comm, seq, what, err);
    comm->broken = true;
    comm->broken_err = *err;
    for (struct comm_request *req = comm->head, *next; req; req = next) {
        next = req->next;
        finish(req, rc, err);
    }
    comm->head = comm->tail = NULL;
}

static int nccl_issue(struct comm *comm, struct comm_request *req, struct smelt_error *err) {
    struct nccl_ctx *ctx = comm->nccl;
    TRY(check_call(ctx, comm, req, err));
    pthread_mutex_lock(&comm->lock);
    req->seq = comm->next_seq++;
    struct smelt_error failure = {0};
    if (comm->broken) {
        finish(req, comm->broken_err.code, &comm->broken_err);
    } else if (req->count == 0 && req->kind != COMM_K_BARRIER) {
        finish(req, SMELT_OK, NULL); /* every rank skips it alike */
    } else if (enqueue(ctx, comm, req, &failure)) {
        /* The other ranks may have launched their part: the communicator cannot go on. */
        break_locked(comm, req->seq, comm_kind_name(req->kind), &failure);
        finish(req, failure.code, &failure);
    } else {
        if (!comm->head) ctx->progress_ms = mono_ms();
        if (comm->tail) comm->tail->next = req;
        else comm->head = req;
        comm->tail = req;
    }
    pthread_mutex_unlock(&comm->lock);
    return SMELT_OK;
}

/* ---- waiting -------------------------------------------------------------------------- */

/* Under the lock: marks the finished requests done, oldest first; at an asynchronous
 * error, or when the oldest unfinished one made no progress within the timeout
 * (counted from the later of wait_start and the previous one's end), breaks the
 * communicator. */
static void poll_locked(struct comm *comm, int64_t wait_start) {
    struct nccl_ctx *ctx = comm->nccl;
    struct smelt_error err = {0};
    while (comm->head) {
        struct comm_request *req = comm->head;
        cudaError_t e = cudaEventQuery(req->event);
        if (e == cudaErrorNotReady) break;
        if (e != cudaSuccess) {
            cuda_fail(&err, comm_kind_name(req->kind), "cudaEventQuery", e);
            break_locked(comm, req->seq, comm_kind_name(req->kind), &err);
            return;
        }
        comm->head = req->next;
        if (!comm->head) comm->tail = NULL;
        finish(req, SMELT_OK, NULL);
        ctx->progress_ms = mono_ms();
    }
    struct comm_request *oldest = comm->head;
    if (!oldest) return;
    const char *what = comm_kind_name(oldest->kind);
    ncclResult_t state;
    ncclResult_t r = ncclCommGetAsyncError(ctx->nc, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        nccl_fail(&err, ctx->nc, "NCCL's asynchronous error", r != ncclSuccess ? r : state);
        break_locked(comm, oldest->seq, what, &err);
        return;
    }
    int64_t from = ctx->progress_ms > wait_start ? ctx->progress_ms : wait_start;
    if (mono_ms() - from > comm->timeout_ms) {
        error_set(&err, SMELT_EBACKEND, "not finished within the timeout (%d ms)",
                  comm->timeout_ms);
        break_locked(comm, oldest->seq, what, &err);
    }
}

static void nccl_wait(struct comm *comm, struct comm_request *req) {
    int64_t start = mono_ms();
    for (int spins = 0;; spins++) {
        pthread_mutex_lock(&comm->lock);
        if (!req->done) poll_locked(comm, start);
        bool done = req->done;
        pthread_mutex_unlock(&comm->lock);
        if (done) break;
        pause_poll(spins);
    }
    if (req->event) {
        (void)cudaEventDestroy(req->event);
        (void)cudaGetLastError();
        req->event = NULL;
    }
}

/* ---- closing -------------------------------------------------------------------------- */

/* Finalizes (flushes NCCL's work, bounded by the timeout) and destroys; aborts when
 * that fails. */
static void end_comm(struct comm *comm, struct nccl_ctx *ctx) {
    struct smelt_error err;
    ncclResult_t r = ncclCommFinalize(ctx->nc);
    bool ok = (r == ncclSuccess || r == ncclInProgress) &&
              !settle(ctx->nc, r, mono_ms() + comm->timeout_ms, "ncclCommFinalize", &err);
    if (ok) (void)ncclCommDestroy(ctx->nc);
    else (void)ncclCommAbort(ctx->nc);
    ctx->nc = NULL;
}

static void nccl_close(struct comm *comm) {
    struct nccl_ctx *ctx = comm->nccl;
    if (!ctx) return;
    /* Requests not waited for (a caller's bug) are run out first, bounded as a wait. */
    pthread_mutex_lock(&comm->lock);
    struct comm_request *last = comm->tail;
    pthread_mutex_unlock(&comm->lock);
    if (last) nccl_wait(comm, last);
    if (ctx->nc) end_comm(comm, ctx);
    ctx_free(ctx);
    comm->nccl = NULL;
}

const struct comm_transport comm_nccl_transport = {
    .name = "NCCL", .connect = nccl_connect, .issue = nccl_issue, .wait = nccl_wait,
    .close = nccl_close};
