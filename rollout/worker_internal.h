/* Private to rollout/worker*.c: the serving loop's state (worker.c), a gen.request
 * (common/msg.h) read and checked into an engine request (worker_request.c), and the
 * weights.* messages that replace the engine's weights (worker_weights.c). */
#ifndef SMELT_ROLLOUT_WORKER_INTERNAL_H
#define SMELT_ROLLOUT_WORKER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/msg.h"
#include "rollout/rollout.h"
#include "weightsync/weightsync.h"

#define WORKER_ID_BYTES 64           /* a client's request id, at most */
#define WORKER_FIELD_BYTES 64        /* a refused field's name as reported (truncated) */
#define WORKER_STOP_STRING_BYTES 256 /* one stop string, at most */

/* What bounds a request: the engine's model and tokenizer, its KV pool, the eos ids. */
struct worker_limits {
    const struct model *model;
    const struct tokenizer *tok;  /* NULL: id prompts only */
    int64_t pool_tokens;          /* the KV pool's size in tokens */
    int32_t eos[ROLLOUT_MAX_STOP];/* the model's and tokenizer's eos ids, deduplicated */
    int n_eos;
};

struct worker_request {
    char id[WORKER_ID_BYTES + 1];
    /* id unset (the worker numbers requests); prompt points at prompt_owned or into the
     * message's ids frame, stop_strings into the message's header: valid while both
     * live. */
    struct rollout_request r;
    int32_t *prompt_owned;        /* the encoded text prompt (malloc'd), or NULL */
    bool more;                    /* the client's batch has more requests for this worker */
};

/* The id of a gen.request / gen.abort header when it is a usable one (a string of 1..64
 * bytes without NUL), else NULL. Borrowed from m. */
const char *worker_header_id(const struct msg *m);

/* The field a refusal names: named is false when none is at fault (the name may be empty:
 * an unknown key "" is named as itself). */
struct worker_field {
    char name[WORKER_FIELD_BYTES];
    bool named;
};
/* Reads and checks every field of a gen.request. On a refusal: SMELT_EINVAL with field
 * naming the protocol's field at fault, and nothing to free; on success free out with
 * worker_request_free. */
int worker_request_parse(const struct msg *m, const struct worker_limits *limits,
                         struct worker_request *out, struct worker_field *field, struct smelt_error *err);
void worker_request_free(struct worker_request *r);

/* A request in flight: whose it is and which of its samples went out. */
struct inflight {
    char id[WORKER_ID_BYTES + 1];  /* the client's */
    char route[MSG_ROUTE_BYTES];   /* the client's routing id */
    size_t route_len;
    uint64_t engine_id;
    int n, n_sent;
    uint8_t sent[256 / 8];         /* bit i: sample i went out */
};

struct worker {
    struct rollout_engine *engine;
    struct worker_limits limits;
    struct lora *adapter;          /* attached to the engine's model, or NULL */
    void *socket;
    struct inflight *reqs;         /* [n_reqs], any order */
    int n_reqs, cap_reqs;
    uint64_t next_engine_id;
    int64_t requests_served, step_errors;
    /* Monotonic ms until which the engine waits for the rest of a batch (a request said
     * "more"); 0: no wait. */
    int64_t hold_until_ms;
    char last_error[SMELT_ERROR_MESSAGE_BYTES]; /* "" unless the last engine step failed */
    /* Weight sync: one at a time, owned by the client that began it. */
    struct weightsync_receiver rx;
    char sync_route[MSG_ROUTE_BYTES];
    size_t sync_route_len;
    int64_t weight_syncs, weight_bytes; /* applied, and their payload */
    /* Broadcast syncs (rollout_worker_setup's weights_comm*; store NULL until the first
     * one): the communicator named by the last broadcast begin, and the hashes of what
     * landed in the sync in progress, checked against weights.end's. */
    const struct rollout_worker_setup *setup;
    struct comm_store *store;
    struct comm *comm;
    char comm_name[WEIGHTSYNC_COMM_NAME_BYTES];
    uint64_t *landed;              /* [landed_cap] */
    int64_t landed_cap;
};

/* Sends and releases header (NULL: it could not be built). When the client cannot take
 * the message its requests are dropped: callers must not keep pointers into w->reqs
 * across a failed send. */
int worker_send(struct worker *w, const char *route, size_t route_len, const char *type, json_t *header,
                const struct msg_array *arrays, int n_arrays);

/* weights.begin / weights.bucket / weights.end (worker_weights.c): answered with
 * weights.ack once the weights are in use, or weights.error naming the field. */
bool worker_weights_message(const char *type);
void worker_on_weights(struct worker *w, const struct msg *m);
/* A sync still in progress when the worker stops is answered with weights.error (why). */
void worker_weights_stop(struct worker *w, const char *why);
/* Frees the broadcast transport's communicator, store and hashes. */
void worker_weights_free(struct worker *w);

#endif
