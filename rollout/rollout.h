/* rollout/: the generation engine (vLLM's design, docs/architecture.md §6): keys and values in a
 * pool of 16-token blocks, a block table per sequence, the n samples of a prompt sharing
 * its blocks (copy-on-write), continuous batching with chunked prefill, preemption by
 * recompute when the pool runs out, per-sample random streams, and weights replaced in
 * place between steps.
 *
 * Usage: create an engine on a loaded model, add requests, call rollout_engine_step
 * until idle, taking finished samples with rollout_engine_take as they come.
 *
 * Weight updates: rollout_engine_set_weights copies new weights in between steps and
 * bumps the policy version. Every sample not yet finished is RE-RUN from its prompt on
 * the new weights (its stream restarts), so every result comes entirely from the one
 * policy version it carries — what PPO/GRPO's importance ratios assume.
 *
 * Ownership: the engine borrows the model (and tokenizer) and must be freed before
 * them. Results handed out by rollout_engine_take belong to the caller
 * (rollout_results_free). */
#ifndef SMELT_ROLLOUT_H
#define SMELT_ROLLOUT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* Tokens per KV block: the unit the cache is allocated, shared and copied in. Pool sizes
 * are whole blocks, so callers sizing a cache round to it. */
#define ROLLOUT_KV_BLOCK_TOKENS 16

struct rollout_config {
    int64_t kv_memory_bytes;   /* the cache's budget; blocks = bytes / (ROLLOUT_KV_BLOCK_TOKENS * bytes per token) */
    int64_t max_batch_tokens;  /* tokens per step, prefill and decode together (>= 1) */
    int max_seqs;              /* sequences running at once (>= 1) */
    int64_t prefill_chunk;     /* most prompt tokens of one sequence per step (>= 1) */
};

#define ROLLOUT_MAX_STOP 16

struct rollout_request {
    uint64_t id;                         /* the caller's; results carry it */
    const int32_t *prompt;               /* copied */
    int64_t n_prompt;
    int n;                               /* samples, 1..256 */
    struct sample_params sampling;
    uint64_t seed;                       /* sample i uses sample_stream_seed(seed, i) */
    int64_t max_new_tokens;              /* >= 1 */
    int32_t stop_ids[ROLLOUT_MAX_STOP];
    int n_stop_ids;
    const char *stop_strings[ROLLOUT_MAX_STOP]; /* copied; need the engine's tokenizer */
    int n_stop_strings;
};

#define ROLLOUT_FINISH_STOP "stop"
#define ROLLOUT_FINISH_LENGTH "length"
#define ROLLOUT_FINISH_ABORT "abort"

struct rollout_result {
    uint64_t request_id;
    int sample_index;
    int32_t *ids;                /* generated tokens */
    float *logprobs;             /* log p(token) under the unscaled distribution */
    int64_t n;
    const char *finish_reason;   /* ROLLOUT_FINISH_* (static) */
    int64_t policy_version;
};

struct rollout_stats {
    int64_t n_blocks, free_blocks;
    int64_t running, waiting;
    int64_t preemptions;          /* sequences preempted so far */
    int64_t steps, prefill_tokens, decode_tokens;
    int64_t policy_version;
    int64_t kv_bytes_per_token;
};

struct rollout_engine;

/* tok may be NULL (then stop strings are refused). */
int rollout_engine_create(struct model *model, const struct tokenizer *tok,
                          const struct rollout_config *config, struct rollout_engine **out,
                          struct smelt_error *err);
void rollout_engine_free(struct rollout_engine *engine);

/* Validates (errors name the field: prompt, n, max_new_tokens, sampling fields,
 * stop_ids, stop_strings) and queues the request. */
int rollout_engine_add(struct rollout_engine *engine, const struct rollout_request *request,
                       struct smelt_error *err);

/* One step: schedule, run the model once, sample. */
int rollout_engine_step(struct rollout_engine *engine, struct smelt_error *err);

bool rollout_engine_idle(const struct rollout_engine *engine);

/* Finished samples since the last call, in finishing order; *results is malloc'd (NULL
 * when none). */
int rollout_engine_take(struct rollout_engine *engine, struct rollout_result **results, int *n,
                        struct smelt_error *err);
void rollout_results_free(struct rollout_result *results, int n);

/* Ends a request's unfinished samples now (finish reason "abort", tokens so far; each
 * aborted sample gets its own result, empty for samples whose prompt was still prefilling).
 * Returns how many samples were aborted (0: unknown or already finished). */
int rollout_engine_abort(struct rollout_engine *engine, uint64_t request_id);

/* Replaces the model's weights (f32, laid out like model->weights, host memory) between
 * steps; see the header comment for what happens to unfinished samples. */
int rollout_engine_set_weights(struct rollout_engine *engine, const float *weights, int64_t n,
                               struct smelt_error *err);

struct rollout_stats rollout_engine_stats(const struct rollout_engine *engine);

/* ---- smelt-rollout: the engine behind a ZeroMQ ROUTER (rollout/worker.c) ----
 *
 * rollout_worker_serve answers common/msg.h's gen.request, gen.abort, health.request
 * and stats.request on router until *stop becomes non-zero (atomic: set by another
 * thread, or by a signal handler, which may run on any thread). Between engine steps it
 * takes every message already waiting (at most ROLLOUT_WORKER_MAX_DRAIN), blocking up to
 * ROLLOUT_WORKER_IDLE_POLL_MS only when the engine is idle; each finished sample goes
 * back at once to the client that asked for it.
 *
 * Requests are checked whole before the engine sees them; a refused one is answered
 * with gen.error naming the field and the worker goes on. Client ids are scoped by
 * client (routing id); the engine sees its own uint64 ids. A client that can no longer
 * take a message (gone, or a full send queue) loses its requests in flight: they are
 * aborted so they stop costing compute. A failed engine step fails every request in
 * flight with gen.error (field null); later requests are served normally.
 *
 * serve sets ZMQ_ROUTER_MANDATORY on router (so that a send to a vanished client fails
 * at once instead of vanishing). Returns 0 when stopped, after answering each request
 * still in flight with gen.error; an error only when the socket fails.
 *
 * Ownership: engine, model (the engine's model: its vocabulary, context and eos ids
 * bound the requests), tok (NULL: id prompts only, results without text) and router are
 * borrowed; router is used only by the calling thread while serve runs. */

#define ROLLOUT_WORKER_IDLE_POLL_MS 50
#define ROLLOUT_WORKER_MAX_DRAIN 256

int rollout_worker_serve(struct rollout_engine *engine, const struct model *model,
                         const struct tokenizer *tok, void *router, const atomic_int *stop,
                         struct smelt_error *err);

#endif
