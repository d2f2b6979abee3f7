/* What comm/ shares between its files: the file store, name checks, the clock, and the
 * Gloo shim's C interface (comm/gloo_shim.cpp, the only C++ here). */
#ifndef SMELT_COMM_INTERNAL_H
#define SMELT_COMM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The "file:DIR" store (comm/store_file.c): one file per key, DIR/<job>.<key escaped>,
 * written through a temporary and renamed, so a reader sees a whole value or none. */
int comm_store_file_create(const char *dir, const char *job, struct comm_store **out,
                           struct smelt_error *err);

/* A job or communicator name: 1..64 bytes of letters, digits, '-', '_', '.', not
 * starting with '.'. field names the option in the error. */
int comm_name_check(const char *name, const char *field, struct smelt_error *err);

/* Monotonic milliseconds, and a sleep, for deadlines and polling. */
int64_t comm_now_ms(void);
void comm_sleep_ms(int ms);

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
    /* Set by the communicator's thread under its lock. */
    bool done;
    int rc;
    struct smelt_error err;
    struct comm_request *next;
};
struct gloo_ctx;
struct comm {
    int rank, size, timeout_ms;
    char name[65];
    struct comm_store *store; /* borrowed */
    struct gloo_ctx *gloo;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;      /* the thread waits here for requests */
    pthread_cond_t finished;  /* comm_wait waits here */
    struct comm_request *head, *tail;
    bool stopping;
    bool broken;
    struct smelt_error broken_err; /* the first failure */
    uint64_t next_seq;
};
/* Hands req to the communicator's thread (which owns it until done), or when wait, also
 * waits for it and frees it. Returns SMELT_OK or the operation's failure. */
int comm_submit(struct comm *comm, struct comm_request *req, struct comm_request **out,
                struct smelt_error *err);
/* Runs req on the Gloo context (on the communicator's thread). */
int comm_run(struct comm *comm, struct comm_request *req, struct smelt_error *err);
const char *comm_kind_name(enum comm_kind kind);
/* After operation seq failed with err (comm/fault.c): publishes this rank's failure in
 * the store, waits a grace period for the other ranks' reports, and rewrites err to
 * name the ranks that sent none (dead or stuck). Returns err's code. */
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
int gloo_broadcast(struct gloo_ctx *ctx, void *buf, size_t count, enum comm_dtype dtype,
                   int root, uint32_t tag, int timeout_ms, struct smelt_error *err);
int gloo_barrier(struct gloo_ctx *ctx, uint32_t tag, int timeout_ms, struct smelt_error *err);

#ifdef __cplusplus
}
#endif

#endif
