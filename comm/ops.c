/* The collectives' entry points: argument checks, then a request for the communicator's
 * thread (comm/comm.c), which runs it here through the Gloo shim. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

const char *comm_kind_name(enum comm_kind kind) {
    static const char *const NAMES[] = {"all_reduce", "reduce_scatter", "all_gather",
                                        "broadcast", "barrier"};
    return NAMES[kind];
}

void comm_shard(size_t count, int size, int rank, size_t *offset, size_t *len) {
    size_t n = (size_t)size, r = (size_t)rank, base = count / n, extra = count % n;
    *len = base + (r < extra ? 1 : 0);
    *offset = r * base + (r < extra ? r : extra);
}

static size_t dtype_bytes(enum comm_dtype dtype) { return dtype == COMM_BF16 ? 2 : 4; }

static int check_args(const struct comm *comm, const char *what, size_t count,
                      enum comm_dtype dtype, struct smelt_error *err) {
    if (!comm) return error_set(err, SMELT_EINVAL, "%s: no communicator", what);
    if (dtype != COMM_F32 && dtype != COMM_BF16)
        return error_set_field(err, SMELT_EINVAL, "dtype", "%s: dtype %d is not f32 or bf16",
                               what, (int)dtype);
    if (count > (size_t)INT32_MAX)
        return error_set_field(err, SMELT_EINVAL, "count", "%s: count %zu is over %d", what,
                               count, INT32_MAX);
    return SMELT_OK;
}

static int check_reduce(const char *what, enum comm_reduce op, struct smelt_error *err) {
    if (op != COMM_SUM && op != COMM_MAX)
        return error_set_field(err, SMELT_EINVAL, "op", "%s: reduction %d is not sum or max",
                               what, (int)op);
    return SMELT_OK;
}

static int submit(struct comm *comm, const struct comm_request *args,
                  struct comm_request **out, struct smelt_error *err) {
    struct comm_request *req = malloc(sizeof *req);
    if (!req) return error_set(err, SMELT_ENOMEM, "%s: out of memory", comm_kind_name(args->kind));
    *req = *args;
    return comm_submit(comm, req, out, err);
}

int comm_all_reduce(struct comm *comm, void *buf, size_t count, enum comm_dtype dtype,
                    enum comm_reduce op, struct comm_request **req, struct smelt_error *err) {
    TRY(check_args(comm, "all_reduce", count, dtype, err));
    TRY(check_reduce("all_reduce", op, err));
    if (!buf && count) return error_set_field(err, SMELT_EINVAL, "buf", "all_reduce: no buffer");
    struct comm_request r = {.kind = COMM_K_ALL_REDUCE, .recv = buf, .count = count,
                             .dtype = dtype, .op = op};
    return submit(comm, &r, req, err);
}

int comm_reduce_scatter(struct comm *comm, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_reduce op,
                        struct comm_request **req, struct smelt_error *err) {
    TRY(check_args(comm, "reduce_scatter", count, dtype, err));
    TRY(check_reduce("reduce_scatter", op, err));
    if ((!send || !recv) && count)
        return error_set_field(err, SMELT_EINVAL, send ? "recv" : "send",
                               "reduce_scatter: no buffer");
    struct comm_request r = {.kind = COMM_K_REDUCE_SCATTER, .send = send, .recv = recv,
                             .count = count, .dtype = dtype, .op = op};
    return submit(comm, &r, req, err);
}

int comm_all_gather(struct comm *comm, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, struct comm_request **req, struct smelt_error *err) {
    TRY(check_args(comm, "all_gather", count, dtype, err));
    if (!recv && count)
        return error_set_field(err, SMELT_EINVAL, "recv", "all_gather: no buffer");
    struct comm_request r = {.kind = COMM_K_ALL_GATHER, .send = send, .recv = recv,
                             .count = count, .dtype = dtype};
    return submit(comm, &r, req, err);
}

int comm_broadcast(struct comm *comm, void *buf, size_t count, enum comm_dtype dtype, int root,
                   struct comm_request **req, struct smelt_error *err) {
    TRY(check_args(comm, "broadcast", count, dtype, err));
    if (root < 0 || root >= comm->size)
        return error_set_field(err, SMELT_EINVAL, "root", "broadcast: root %d is outside 0..%d",
                               root, comm->size - 1);
    if (!buf && count) return error_set_field(err, SMELT_EINVAL, "buf", "broadcast: no buffer");
    struct comm_request r = {.kind = COMM_K_BROADCAST, .recv = buf, .count = count,
                             .dtype = dtype, .root = root};
    return submit(comm, &r, req, err);
}

int comm_barrier(struct comm *comm, struct comm_request **req, struct smelt_error *err) {
    if (!comm) return error_set(err, SMELT_EINVAL, "barrier: no communicator");
    struct comm_request r = {.kind = COMM_K_BARRIER};
    return submit(comm, &r, req, err);
}

/* The ring over comm_shard's layout (see comm.h); one rank keeps its own shard. */
static int run_reduce_scatter(struct comm *comm, struct comm_request *req, uint32_t tag,
                              struct smelt_error *err) {
    size_t bytes = dtype_bytes(req->dtype);
    if (comm->size == 1) {
        memcpy(req->recv, req->send, req->count * bytes);
        return SMELT_OK;
    }
    size_t *offsets = malloc((size_t)comm->size * sizeof *offsets), *counts = malloc((size_t)comm->size * sizeof *counts);
    int rc = offsets && counts ? 0 : error_set(err, SMELT_ENOMEM, "reduce_scatter: out of memory");
    for (int r = 0; !rc && r < comm->size; r++) comm_shard(req->count, comm->size, r, &offsets[r], &counts[r]);
    if (!rc)
        rc = gloo_reduce_scatter(comm->gloo, req->send, req->recv, offsets, counts, req->dtype, req->op, tag,
                                 comm->timeout_ms, err);
    free(offsets);
    free(counts);
    return rc;
}

static int run_all_gather(struct comm *comm, struct comm_request *req, uint32_t tag,
                          struct smelt_error *err) {
    size_t *counts = malloc((size_t)comm->size * sizeof *counts), off;
    if (!counts) return error_set(err, SMELT_ENOMEM, "all_gather: out of memory");
    for (int r = 0; r < comm->size; r++) comm_shard(req->count, comm->size, r, &off, &counts[r]);
    int rc = gloo_all_gather(comm->gloo, req->send, req->recv, counts, req->dtype, tag,
                             comm->timeout_ms, err);
    free(counts);
    return rc;
}

int comm_run(struct comm *comm, struct comm_request *req, struct smelt_error *err) {
    uint32_t tag = (uint32_t)req->seq;
    bool nothing = req->count == 0 && req->kind != COMM_K_BARRIER;
    if (nothing || (comm->size == 1 && req->kind != COMM_K_REDUCE_SCATTER &&
                    req->kind != COMM_K_ALL_GATHER))
        return SMELT_OK; /* every rank skips it alike: nothing to exchange */
    switch (req->kind) {
    case COMM_K_ALL_REDUCE:
        return gloo_all_reduce(comm->gloo, req->recv, req->count, req->dtype, req->op, tag,
                               comm->timeout_ms, err);
    case COMM_K_REDUCE_SCATTER: return run_reduce_scatter(comm, req, tag, err);
    case COMM_K_ALL_GATHER: return run_all_gather(comm, req, tag, err);
    case COMM_K_BROADCAST:
        return gloo_broadcast(comm->gloo, req->recv, req->count, req->dtype, req->root, tag,
                              comm->timeout_ms, err);
    case COMM_K_BARRIER: return gloo_barrier(comm->gloo, tag, comm->timeout_ms, err);
    }
    return error_set(err, SMELT_EINVAL, "unknown operation %d", (int)req->kind);
}
