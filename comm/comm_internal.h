/* What comm/ shares between its files: the file store, name checks, the
 * transports' table, the Gloo shim's C interface (comm/gloo_shim.cpp, the only C++ here)
 * and the NCCL transport (comm/nccl.c, in builds with NCCL only). */
#ifndef SMELT_COMM_INTERNAL_H
#define SMELT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "common/clock.h" /* mono_ms, sleep_ms: deadlines and polling */

/* The "file:DIR" store (comm/store_file.c): one file per key, DIR/<job>.<key escaped>,
 * written through a temporary and renamed, so a reader sees a whole value or none. */
int comm_store_file_create(const char *dir, const char *job, struct comm_store **out,
                           struct smelt_error *err);

/* The "smeltd:ENDPOINT" store (comm/store_smeltd.c): a CURVE client of smeltd's
 * rendezvous with keys' worker keypair (refused without keys). */
int comm_store_smeltd_create(const char *endpoint, const char *job, const struct curve_job_keys *keys,
                             struct comm_store **out, struct smelt_error *err);

/* A job or communicator name: 1..64 bytes of letters, digits, '-', '_', '.', not
 * starting with '.'. field names the option in the error. */
int comm_name_check(const char *name, const char *field, struct smelt_error *err);

/* ---- the communicator's queue (comm/comm.c), shared with comm/ops.c ---- */
enum comm_kind { COMM_K_ALL_REDUCE, COMM_K_REDUCE_SCATTER, COMM_K_ALL_GATHER, COMM_K_BROADCAST,
                 COMM_K_BARRIER };
struct comm_request {
    struct comm *comm;
    enum comm_kind kind;
    const void *send; /* borrowed from the caller until comm_wait */
    void *recv;
    size_t count;
    enum comm_dtype dtype;
    enum comm_reduce op;
    int root;
    uint64_t seq;
    /* NCCL: recorded on the communicator's stream after the operation (a cudaEvent_t);
     * NULL for Gloo and for a request that failed or had nothing to do. */
    struct CUevent_st *event;
    /* Set by the communicator's thread (Gloo) or by the waiting thread (NCCL) under the
     * communicator's lock. */
    bool done;
    int rc;
    struct smelt_error err;
    struct comm_request *next;
};
struct gloo_ctx;
struct nccl_ctx;
struct comm;
/* What differs between transports; comm.c holds Gloo's, comm/nccl.c NCCL's. */
struct comm_transport {
    const char *name; /* "Gloo", "NCCL": quoted before the library's own message */
    /* Connects comm (allocated, options checked) to the other ranks. */
    int (*connect)(struct comm *comm, const struct comm_options *options,
                   struct smelt_error *err);
    /* Takes req (the transport owns it until it is done); with an error it was not
     * taken and the caller frees it. */
    int (*issue)(struct comm *comm, struct comm_request *req, struct smelt_error *err);
    /* Returns once req is done (its timeout bounds this); does not free it. */
    void (*wait)(struct comm *comm, struct comm_request *req);
    /* Ends whatever the operations left running, then frees the transport's state. */
    void (*close)(struct comm *comm);
};
#ifdef SMELT_NCCL
extern const struct comm_transport comm_nccl_transport;
#endif
struct comm {
    int rank, size, timeout_ms;
    char name[65];
    struct comm_store *store; /* borrowed */
    const struct comm_transport *transport;
    struct gloo_ctx *gloo;
    struct nccl_ctx *nccl;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;      /* the thread waits here for requests */
    pthread_cond_t finished;  /* comm_wait waits here */
    /* Gloo: the requests not yet run; NCCL: those issued and not yet seen finished. */
    struct comm_request *head, *tail;
    bool stopping;
    bool broken;
    struct smelt_error broken_err; /* the first failure */
    /* size flags, set by comm_name_faults before broken is: the ranks named dead or stuck */
    bool *at_fault;
    uint64_t next_seq;
};
/* Hands req (malloc'd) to the transport, which owns it until done; with out NULL also
 * waits for it and frees it. Returns SMELT_OK or the operation's failure. */
int comm_submit(struct comm *comm, struct comm_request *req, struct comm_request **out,
                struct smelt_error *err);
/* Runs req on the Gloo context (on the communicator's thread). */
int comm_run(struct comm *comm, struct comm_request *req, struct smelt_error *err);
const char *comm_kind_name(enum comm_kind kind);
/* After operation seq failed with err (comm/fault.c): publishes this rank's failure in
 * the store, waits a grace period for the other ranks' reports, and rewrites err to
 * name the ranks that sent none (dead or stuck), quoting the transport's message, and
 * flags them in comm->at_fault. Returns err's code. */
int comm_name_faults(struct comm *comm, uint64_t seq, const char *what,
                     struct smelt_error *err);

/* ---- Gloo shim ---- */
struct gloo_ctx;

/* Connects rank to size-1 peers through store, keys under prefix. */
int gloo_ctx_create(struct comm_store *store, const char *prefix, int rank, int size,
                    const char *host, int timeout_ms, struct gloo_ctx **out,
                    struct smelt_error *err);
void gloo_ctx_destroy(struct gloo_ctx *ctx);
/* Each call runs one collective with its own timeout; tag keeps concurrent ones apart.
 * Failures are SMELT_EBACKEND with Gloo's message. */
int gloo_all_reduce(struct gloo_ctx *ctx, void *buf, size_t count, enum comm_dtype dtype,
                    enum comm_reduce op, uint32_t tag, int timeout_ms, struct smelt_error *err);
/* recv gets every rank's counts[r] elements in rank order; send is this rank's part. */
int gloo_all_gather(struct gloo_ctx *ctx, const void *send, void *recv, const size_t *counts,
                    enum comm_dtype dtype, uint32_t tag, int timeout_ms,
                    struct smelt_error *err);
/* recv gets this rank's part (counts[rank] elements at offsets[rank]) of the reduction of
 * every rank's send (the sum of counts elements): a ring, each part's partial sum passed
 * rank to rank, so each rank sends and receives (size - 1) / size of the data and holds
 * two parts' worth of buffers. */
int gloo_reduce_scatter(struct gloo_ctx *ctx, const void *send, void *recv, const size_t *offsets,
                        const size_t *counts, enum comm_dtype dtype, enum comm_reduce op, uint32_t tag,
                        int timeout_ms, struct smelt_error *err);
int gloo_broadcast(struct gloo_ctx *ctx, void *buf, size_t count, enum comm_dtype dtype,
                   int root, uint32_t tag, int timeout_ms, struct smelt_error *err);
int gloo_barrier(struct gloo_ctx *ctx, uint32_t tag, int timeout_ms, struct smelt_error *err);

#ifdef __cplusplus
}
#endif

#endif
