/* rollout/: the generation engine (vLLM's design, docs/architecture.md §6): keys and values in a
 * pool of 16-token blocks, a block table per sequence, the n samples of a prompt sharing
 * its blocks (copy-on-write), continuous batching with chunked prefill, preemption by
 * recompute when the pool runs out, per-sample random streams, and weights replaced in
 * place between steps.
 *
 * Usage: create an engine on a loaded model, add requests, call rollout_engine_step
 * until idle, taking finished samples with rollout_engine_take as they come.
 *
 * Weight updates: rollout_engine_set_weights[_version] copies new weights in between
 * steps and sets the policy version (the trainer's iteration, or the old one plus one);
 * rollout_engine_weights_changed does the same for weights the caller changed in place
 * (colocated trainer, LoRA adapter). Every sample not yet finished is RE-RUN from its prompt on
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
    /* The LoRA adapter this request samples from (borrowed: it must outlive the
     * request, and be an adapter of the engine's model, not attached to it), or NULL:
     * the model as it is (with whatever adapter is attached to it, if any). Requests of
     * several adapters share the engine's steps (S-LoRA / Punica): a step's sequences are
     * grouped by adapter and each adapter's hooks run on its own rows only (the
     * segmented adapter, model/transformer.h), so on the CPU in batch-invariant mode a
     * request's samples are bit for bit those it gets alone with its adapter attached.
     * A step whose requests name none runs exactly as before. */
    struct lora *adapter;
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
struct lora;

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
 * steps and makes version the policy version (SMELT_EINVAL naming "version", nothing
 * changed, unless it is newer than the engine's); see the header comment for what
 * happens to unfinished samples. The split placement's weight sync (weightsync/) ends
 * here. A copy that fails half-way (a device error) leaves the weights undefined. */
int rollout_engine_set_weights_version(struct rollout_engine *engine, const float *weights, int64_t n,
                                       int64_t version, struct smelt_error *err);
/* The same with the engine's version plus one. */
int rollout_engine_set_weights(struct rollout_engine *engine, const float *weights, int64_t n,
                               struct smelt_error *err);

/* The caller changed the weights the engine runs on itself (the model's, or an attached
 * adapter's): the colocated placement, where trainer and engine share one model and
 * nothing is copied (call it after the optimizer step), or a LoRA sync that copied into
 * the adapter's buffer. Makes version (newer than the engine's, else SMELT_EINVAL
 * naming "version") the policy version and re-runs every unfinished sample, as
 * set_weights does. Call it between steps, never with weights half-written. */
int rollout_engine_weights_changed(struct rollout_engine *engine, int64_t version, struct smelt_error *err);

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
 * A request with "more" (the rest of its client's batch for this worker follows: the
 * rollout client sets it) holds the engine's next step until a request without it
 * arrives, or ROLLOUT_WORKER_HOLD_MS pass: the engine's first step then sees the whole
 * batch, as a local engine given every request before stepping does, so a worker makes
 * the same batches, hence the same logprobs, whatever the network's timing.
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
/* The longest the engine waits for the rest of a batch after a request saying "more"
 * (a client that dies half-way through sending must not stall the worker). */
#define ROLLOUT_WORKER_HOLD_MS 1000
#define ROLLOUT_WORKER_MAX_DRAIN 256

/* The worker also takes new weights (weights.begin / bucket / end, common/msg.h) on the
 * same socket: "full" syncs into the model through rollout_engine_set_weights_version,
 * "lora" syncs into adapter's buffer (then rollout_engine_weights_changed); either is
 * applied whole between two steps once every bucket arrived and checked, and answered
 * with weights.ack, or refused with weights.error and the old weights kept. */
struct rollout_worker_setup {
    struct rollout_engine *engine;
    const struct model *model;   /* the engine's */
    const struct tokenizer *tok; /* NULL: id prompts only, results without text */
    struct lora *adapter;        /* the adapter attached to model (lora_attach), or NULL:
                                    "lora" syncs are refused */
    void *router;
    const atomic_int *stop;
    /* Broadcast syncs (weights.begin with "transport": "broadcast"): the rendezvous store
     * spec ("file:DIR"), the job id in it, this worker's group rank (>= 1; the trainer is
     * 0) and the group's size. weights_comm NULL: such syncs are refused (field
     * "transport"). The communicator is made at the first broadcast sync, and again when
     * a begin names another one. */
    const char *weights_comm, *weights_comm_name;
    int weights_comm_rank, weights_comm_size;
};

int rollout_worker_run(const struct rollout_worker_setup *setup, struct smelt_error *err);
/* rollout_worker_run without an adapter. */
int rollout_worker_serve(struct rollout_engine *engine, const struct model *model,
                         const struct tokenizer *tok, void *router, const atomic_int *stop,
                         struct smelt_error *err);

/* ---- trainer rank 0's side: a client of one or more smelt-rollout workers (rollout/client.c) ----
 *
 * One DEALER socket per worker endpoint. A batch of rollout_requests (prompt ids, n,
 * sampling, seed, max_new_tokens, stop ids and strings: what rollout_engine_add takes,
 * and meaning the same: ignore_eos is sent, so only the request's own stop ids end a
 * sample, as in the engine) is spread over the workers — each request whole on the
 * worker owing the fewest samples — and every sample's result is filed, in whatever order
 * it comes, into caller-owned arrays at its slot: sample s of request i goes to slot
 * requests[0].n + ... + requests[i-1].n + s. A request's id field is not used: requests
 * go on the wire as "<batch>:<i>", so results of an earlier, failed batch never land in a
 * later one.
 *
 * Weights: rollout_client_push_* sends a weight sync (weightsync/) to every worker over
 * the same sockets and waits for every ack; results of a batch in flight that arrive
 * meanwhile are filed as usual (a sync in the middle of generation re-runs the workers'
 * unfinished samples on the new weights: a sample never mixes versions, and carries the
 * version that made it).
 *
 * Never hangs: every call waits at most timeout_ms. A worker that owes an answer and
 * has sent nothing for quiet_ms gets a health.request; if it still sends nothing for
 * health_timeout_ms (a health.request waits behind whatever was sent to the worker before
 * it: allow for the longest engine step), it is dead and the call fails naming its
 * endpoint; its socket is reopened (queued messages dropped) for the next call. A
 * gen.error fails the batch naming the request (its index) and the worker; a
 * weights.error fails the push naming the worker and the field. A failed batch is
 * ended: its requests still running on other workers are aborted (gen.abort).
 *
 * Ownership: endpoints are copied; zmq_ctx (when given) and the result arrays of a batch
 * are borrowed, the arrays until the batch is collected or failed. Not thread-safe: one
 * thread drives a client. */
#define ROLLOUT_CLIENT_MAX_WORKERS 256
#define ROLLOUT_CLIENT_ENDPOINT_BYTES 256
#define ROLLOUT_CLIENT_DEFAULT_TIMEOUT_MS 600000
#define ROLLOUT_CLIENT_DEFAULT_QUIET_MS 5000
#define ROLLOUT_CLIENT_DEFAULT_HEALTH_TIMEOUT_MS 60000
/* A broadcast waits for a worker to finish its engine step before it joins: allow for
 * the longest one, as health_timeout_ms does. */
#define ROLLOUT_CLIENT_DEFAULT_COMM_TIMEOUT_MS 60000

struct curve_keypair;

struct rollout_client_config {
    const char *const *endpoints; /* [n_endpoints]: the workers' ROUTER endpoints */
    int n_endpoints;              /* 1..ROLLOUT_CLIENT_MAX_WORKERS */
    void *zmq_ctx;                /* NULL: the client makes its own (inproc:// needs the worker's) */
    int64_t timeout_ms;           /* 0: ROLLOUT_CLIENT_DEFAULT_TIMEOUT_MS */
    int64_t quiet_ms;             /* 0: ROLLOUT_CLIENT_DEFAULT_QUIET_MS */
    int64_t health_timeout_ms;    /* 0: ROLLOUT_CLIENT_DEFAULT_HEALTH_TIMEOUT_MS */
    int64_t bucket_bytes;         /* weight sync buckets; 0: WEIGHTSYNC_DEFAULT_BUCKET_BYTES */
    /* Optional, for a caller that knows more than the network can tell (the trainer
     * owns its workers' processes): asked about each worker that owes an answer, every
     * time liveness is checked; false means worker k (endpoint index) is gone, and what
     * it owes fails at once instead of after the health timeout. NULL: health checks only. */
    bool (*alive)(void *ctx, int worker);
    void *alive_ctx;
    /* Weight syncs by broadcast (weightsync's broadcast transport) when weights_comm is
     * set: the rendezvous store spec ("file:DIR") and the job id in it that the workers
     * were started with (smelt-rollout --weights-comm / --weights-comm-name, worker k as
     * group rank k + 1 of n_endpoints + 1; this client is rank 0). The communicator is
     * made at the first sync and again, under a new name, after a failed one. NULL: the
     * bytes go as weights.bucket messages. */
    const char *weights_comm, *weights_comm_name;
    int64_t comm_timeout_ms;      /* every broadcast and the connection; 0: ROLLOUT_CLIENT_DEFAULT_COMM_TIMEOUT_MS */
    /* CURVE (common/curve.h): when curve_keys is set, every socket is a CURVE client with
     * this keypair that talks only to workers holding curve_server_key's secret (a job's
     * workers: the job's own keypair on both sides, docs/security.md "Job channels"); a
     * worker that is not, or that does not admit this key, never answers. NULL: plain
     * sockets. Both copied. */
    const struct curve_keypair *curve_keys;
    const char *curve_server_key;
};

/* Where a batch's samples land: n_samples = the sum of the requests' n slots. */
struct rollout_client_results {
    int64_t max_tokens;           /* tokens per slot, >= every request's max_new_tokens */
    int32_t *ids;                 /* [n_samples * max_tokens]: slot k at k * max_tokens */
    float *logprobs;              /* [n_samples * max_tokens] */
    int64_t *n_tokens;            /* [n_samples]; ids and logprobs past it are untouched */
    int64_t *policy_version;      /* [n_samples]: the version that made the sample */
    const char **finish_reason;   /* [n_samples]: ROLLOUT_FINISH_* (static strings) */
    int *worker;                  /* [n_samples] or NULL: the endpoint index that made it */
};

struct rollout_client;
struct weightsync_meta;
struct weightsync_report;

int rollout_client_create(const struct rollout_client_config *config, struct rollout_client **out,
                          struct smelt_error *err);
/* Aborts a batch still in flight (best effort, without waiting). */
void rollout_client_free(struct rollout_client *client);

/* Sends a batch (one at a time: SMELT_EINVAL while another is in flight). Requests are
 * checked first (errors name "requests[i].<field>"); nothing is sent when one is bad. */
int rollout_client_submit(struct rollout_client *client, const struct rollout_request *requests,
                          int n_requests, const struct rollout_client_results *out,
                          struct smelt_error *err);
/* Files what arrives until at least one more sample is in, or wait_ms passed (0: only
 * what is there already), and tells how many of the batch's samples are in (*finished;
 * all of them: the batch is complete). */
int rollout_client_poll(struct rollout_client *client, int64_t wait_ms, int64_t *finished,
                        struct smelt_error *err);
/* Waits until every sample of the batch is in. */
int rollout_client_collect(struct rollout_client *client, struct smelt_error *err);
/* submit + collect. */
int rollout_client_generate(struct rollout_client *client, const struct rollout_request *requests,
                            int n_requests, const struct rollout_client_results *out,
                            struct smelt_error *err);

/* Pushes source (f32, laid out as meta says, on any backend) to every worker as policy
 * version meta->version and waits for every ack; by broadcast when the client was made
 * with weights_comm (meta->via is then the client's, whatever the caller set). A broadcast
 * that fails names the worker at fault ("rollout worker K (endpoint)": comm's group rank
 * K + 1), within the comm timeout for a dead or stopped one. report (may be NULL) gets the bytes
 * moved and the times. */
int rollout_client_push(struct rollout_client *client, const struct weightsync_meta *meta,
                        const struct tensor *source, struct weightsync_report *report,
                        struct smelt_error *err);
/* The model's whole flat weights ("full"), or only the adapter's ("lora": the bytes moved
 * are the adapter's size), as policy version version. */
int rollout_client_push_model(struct rollout_client *client, const struct model *model, int64_t version,
                              struct weightsync_report *report, struct smelt_error *err);
int rollout_client_push_lora(struct rollout_client *client, const struct lora *adapter, int64_t version,
                             struct weightsync_report *report, struct smelt_error *err);

#endif
