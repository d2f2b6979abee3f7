/* Collectives between the ranks of a job: all_reduce (sum, max), reduce_scatter,
 * all_gather, broadcast and barrier on f32 and bf16 buffers, asynchronous with a wait.
 * Transports (comm_options.backend): Gloo over TCP for host buffers (comm/gloo_shim.cpp),
 * NCCL for device buffers (comm/nccl.c; builds with CUDA and NCCL).
 *
 * Ranks find each other through a rendezvous store (struct comm_store): a key/value
 * table with wait, scoped to one job. `file:DIR` is the standalone store (a shared
 * folder); `smeltd:ENDPOINT` is the one smeltd serves for the jobs it runs, reached with
 * the job attempt's CURVE keys and scoped by smeltd to that attempt.
 *
 * Every operation has a timeout. A dead peer (killed) or a stuck one (stopped) makes the
 * operation fail on every other rank, with a message naming the ranks that did not report
 * the failure themselves (the dead or stuck ones), never a hang. After one failure the
 * communicator is broken: every later operation fails at once with the first error, and
 * the job builds a new communicator (another comm_options.name) or exits. */
#ifndef SMELT_COMM_COMM_H
#define SMELT_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- rendezvous store ---------------------------------------------------------------- */

/* A job-scoped key/value table with wait. Keys are printable strings (at most
 * COMM_KEY_BYTES - 1 bytes); values are bytes. Implementations must be safe to call from
 * several threads. */
#define COMM_KEY_BYTES 256
struct comm_store_ops {
    int (*set)(void *impl, const char *key, const void *data, size_t len,
               struct smelt_error *err);
    /* Waits up to timeout_ms (0: do not wait) for key; *data is malloc'd (the caller
     * frees). A key still missing at the deadline is SMELT_ENOTFOUND naming it. */
    int (*get)(void *impl, const char *key, int timeout_ms, void **data, size_t *len,
               struct smelt_error *err);
    /* Waits up to timeout_ms until every key exists; SMELT_ENOTFOUND naming a missing one. */
    int (*wait)(void *impl, const char *const *keys, size_t nkeys, int timeout_ms,
                struct smelt_error *err);
    void (*close)(void *impl);
};
struct comm_store {
    const struct comm_store_ops *ops;
    void *impl;
};

/* Opens a store from a spec: "file:DIR" (DIR is created when missing) or
 * "smeltd:ENDPOINT" (smeltd's rendezvous, e.g. smeltd:tcp://127.0.0.1:5601; needs keys).
 * Every key is put under `job` (letters, digits, '-', '_', '.'; at most 64 bytes), so one
 * folder can serve many jobs. keys (borrowed, read during the call only; NULL or not
 * present: none) are the job attempt's CURVE keys (common/curve.h), which smeltd checks.
 * *out is the caller's; comm_store_close frees it. */
struct curve_job_keys;
int comm_store_open_keys(const char *spec, const char *job, const struct curve_job_keys *keys,
                         struct comm_store **out, struct smelt_error *err);
/* comm_store_open_keys without keys. */
int comm_store_open(const char *spec, const char *job, struct comm_store **out,
                    struct smelt_error *err);
void comm_store_close(struct comm_store *store);

/* ---- communicator -------------------------------------------------------------------- */

enum comm_dtype { COMM_F32 = 0, COMM_BF16 = 1 };
enum comm_reduce { COMM_SUM = 0, COMM_MAX = 1 };
/* GLOO: host buffers, always built. NCCL: device buffers (the current CUDA device's
 * memory), in builds with CUDA and NCCL only; elsewhere comm_create refuses it naming
 * the field `backend`. */
enum comm_backend { COMM_BACKEND_GLOO = 0, COMM_BACKEND_NCCL = 1 };

struct comm_options {
    int rank;           /* 0 .. size-1 */
    int size;           /* >= 1 */
    /* Distinguishes the communicators of one job in its store ("world", "retry-1"):
     * a new communicator after a failure needs a new name. Same rules as a job name. */
    const char *name;
    /* Address this rank listens on, e.g. "127.0.0.1" or an interface's address; NULL is
     * loopback. */
    const char *host;
    int timeout_ms;     /* per operation and for the connection; >= 1 */
    enum comm_backend backend;
};

/* The NCCL backend, beyond the above:
 *  - The communicator uses the CUDA device current on the thread that creates it; every
 *    later call must come from a thread with the same current device (refused naming
 *    the device otherwise), and every buffer must be device memory (refused naming it).
 *  - An operation waits for the work already queued on the legacy default stream (where
 *    smelt's CUDA backend runs) when it is issued, then runs on the communicator's own
 *    stream; comm_wait returns once it has finished on the device. Work queued after the
 *    issue overlaps with it.
 *  - timeout_ms bounds comm_create and each comm_wait: the oldest unfinished operation
 *    has that long to finish, counted from the later of the wait's start and the
 *    previous operation's end. At the timeout, or at an asynchronous NCCL error (a peer's
 *    connection lost), the NCCL communicator is aborted (ncclCommAbort) and the ranks at
 *    fault are named as for Gloo.
 *  - host is not used: NCCL chooses its interfaces (NCCL_SOCKET_IFNAME sets them). */

struct comm;
/* A request for an operation in flight; comm_wait frees it. */
struct comm_request;

/* Connects to every other rank through store (borrowed: it must outlive the comm, which
 * uses it again to name the ranks at fault after a failure). Fails after
 * options->timeout_ms when a rank does not show up, naming the missing ones.
 * The first comm_create sets SIGPIPE to ignored when the program left it at its default
 * (Gloo writes to sockets without MSG_NOSIGNAL: a peer's death would otherwise kill this
 * process instead of failing the operation). */
int comm_create(struct comm_store *store, const struct comm_options *options,
                struct comm **out, struct smelt_error *err);
/* Runs out the operations still queued (each bounded by its timeout), then frees. Every
 * request must have been waited for first (comm_wait frees it). NULL ok. */
void comm_destroy(struct comm *comm);
int comm_rank(const struct comm *comm);
int comm_size(const struct comm *comm);
/* True once an operation has failed; *why (when non-NULL) gets the first error. */
bool comm_is_broken(const struct comm *comm, struct smelt_error *why);
/* Once broken: how many ranks the failure named dead or stuck (those that sent no failure
 * report), the first cap of them written to ranks in increasing order; 0 when none was
 * named (every rank failed alike, or the store failed too) or the comm is not broken. */
int comm_fault_ranks(const struct comm *comm, int *ranks, int cap);

/* Where rank's shard of count elements starts and how long it is: the first count % size
 * ranks get one element more. reduce_scatter and all_gather use this layout. */
void comm_shard(size_t count, int size, int rank, size_t *offset, size_t *len);

/* Every operation is issued in the same order on every rank. The buffers are borrowed
 * until the request is waited for (the caller must neither free nor touch them). With
 * req NULL the call waits itself; otherwise *req is the caller's and comm_wait ends it.
 * Operations run one after the other on the communicator's thread, in issue order;
 * requests may be waited for in any order.
 *
 * bf16 is reduced pairwise in f32 and rounded back to bf16 after each addition (as NCCL
 * does), so a sum of N bf16 values may differ in the last bit from the f32 sum rounded
 * once; sums of small integers are exact. */

/* buf (count elements) becomes the element-wise reduction over the ranks. */
int comm_all_reduce(struct comm *comm, void *buf, size_t count, enum comm_dtype dtype,
                    enum comm_reduce op, struct comm_request **req, struct smelt_error *err);
/* send holds count elements on every rank; recv gets this rank's shard of their
 * reduction (comm_shard's length). Over Gloo, a ring: each rank sends and receives
 * (size - 1) / size of the data and holds two shards' worth of buffers. */
int comm_reduce_scatter(struct comm *comm, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_reduce op,
                        struct comm_request **req, struct smelt_error *err);
/* send is this rank's shard (comm_shard's length of count); recv gets all count elements. */
int comm_all_gather(struct comm *comm, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype, struct comm_request **req, struct smelt_error *err);
/* buf (count elements) becomes root's buf on every rank. */
int comm_broadcast(struct comm *comm, void *buf, size_t count, enum comm_dtype dtype, int root,
                   struct comm_request **req, struct smelt_error *err);
int comm_barrier(struct comm *comm, struct comm_request **req, struct smelt_error *err);

/* Waits until the operation has finished or failed (its timeout bounds it), returns its
 * result and frees req. */
int comm_wait(struct comm_request *req, struct smelt_error *err);

#ifdef __cplusplus
}
#endif

#endif
