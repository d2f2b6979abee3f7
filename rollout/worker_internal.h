/* Private to rollout/worker*.c: a gen.request (common/msg.h) read and checked into an
 * engine request. */
#ifndef SMELT_ROLLOUT_WORKER_INTERNAL_H
#define SMELT_ROLLOUT_WORKER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/msg.h"
#include "rollout/rollout.h"

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
};

/* The id of a gen.request / gen.abort header when it is a usable one (a string of 1..64
 * bytes without NUL), else NULL. Borrowed from m. */
const char *worker_header_id(const struct msg *m);

/* Reads and checks every field of a gen.request. On a refusal: SMELT_EINVAL with
 * field (WORKER_FIELD_BYTES) set to the protocol's name of the field at fault, and
 * nothing to free; on success free out with worker_request_free. */
int worker_request_parse(const struct msg *m, const struct worker_limits *limits,
                         struct worker_request *out, char *field, struct smelt_error *err);
void worker_request_free(struct worker_request *r);

#endif
