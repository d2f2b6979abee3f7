/* ZeroMQ messages (docs/architecture.md §8): every message is a multipart message
 *
 *   [routing id]            only on ROUTER sockets (added / removed by msg_send/msg_recv)
 *   frame 0  type           e.g. "gen.request" (ASCII, no terminator)
 *   frame 1  header         a JSON object, always with "v": MSG_VERSION
 *   frame 2.. arrays        raw little-endian arrays (int32 token ids, float32 logprobs)
 *
 * This file is the list of every message type and its header fields. A receiver
 * refuses a message whose "v" differs, answering with the error message of its
 * protocol (gen.error, agent.error) that names the field.
 *
 * Ownership: msg_send copies nothing it does not need to (frames are sent from the
 * caller's buffers, which may be reused when it returns); msg_recv fills a struct msg
 * that owns its header and arrays until msg_free. */
#ifndef SMELT_COMMON_MSG_H
#define SMELT_COMMON_MSG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define MSG_VERSION 1
#define MSG_TYPE_BYTES 32
#define MSG_MAX_ARRAYS 8
#define MSG_ROUTE_BYTES 256
/* The most a header frame may hold; larger ones are refused before parsing. */
#define MSG_MAX_HEADER_BYTES (1 << 20)

/* ---- rollout worker (smelt-rollout, ROUTER; clients are DEALER or REQ-less DEALER) ----
 *
 * gen.request   {v, id: string (the client's, 1..64 bytes, unique among the sender's
 *                requests in flight), prompt?: string (text, needs a tokenizer; encoded as
 *                plain text: no special tokens, no bos added), n?: 1..256 (1),
 *                max_new_tokens?: >= 1 (16), temperature?: >= 0 (1), top_k?: >= 0
 *                (0 = off), top_p?: (0, 1] (1), min_p?: [0, 1) (0), seed?: uint (0),
 *                stop?: [string of 1..256 bytes] (<= 16, needs a tokenizer),
 *                stop_token_ids?: [int] (<= 16 together with the eos ids),
 *                ignore_eos?: bool (false: the model's eos ids, from config.json and the
 *                tokenizer, end a sample too), more?: bool (false; true: more requests of
 *                this client's batch follow to this worker, and the engine holds its next
 *                step until the last one arrives or ROLLOUT_WORKER_HOLD_MS pass, so a batch
 *                is scheduled as a local engine given all of it would schedule it)}
 *               frame 2 (optional): int32 prompt token ids; exactly one of "prompt" or
 *               frame 2 is given. Unknown fields are refused, and so is a request whose
 *               prompt plus max_new_tokens cannot fit the worker's KV cache.
 * gen.result    {v, id, index: sample 0..n-1, finish_reason: "stop"|"length"|"abort",
 *                policy_version, n_tokens, text?: string (when the worker has a tokenizer
 *                with a token for every id; special tokens left out, bytes that are not
 *                UTF-8 as U+FFFD)}
 *               frame 2: int32 generated ids [n_tokens]; frame 3: float32 logprobs
 *               [n_tokens]. One message per sample, sent as each sample finishes.
 * gen.error     {v, id?: the request's id when it could be read, error: {message, field}}
 *               A refused request (field: the header field at fault, "" for an unknown
 *               empty key, "prompt" for frame 2 too; "type", "header" or "frames" for a
 *               message that could not be read),
 *               or one that will not finish (field null: the engine failed, or the worker
 *               is stopping). The worker keeps serving. A client that cannot take its
 *               messages (gone, or its send queue full) loses its requests in flight.
 * gen.abort     {v, id}: end the sender's request's unfinished samples (they arrive as
 *               "abort" with the tokens so far); an id not in flight is ignored.
 * health.request {v}                     -> health.reply {v, status: "ok" | "failing" (the
 *                last engine step failed), policy_version, error?: string (when failing)}
 * stats.request  {v}                     -> stats.reply {v, n_blocks, free_blocks, running,
 *                waiting, preemptions, steps, prefill_tokens, decode_tokens,
 *                policy_version, kv_bytes_per_token, requests_served, requests_in_flight,
 *                step_errors, weight_syncs (applied), weight_bytes (their payload)}
 *
 * Weight sync (weightsync/weightsync.h; trainer rank 0's DEALER -> the worker's ROUTER, on
 * the gen.* connection). The sender sends begin, every bucket and end back to back,
 * without waiting; the worker keeps generating while the buckets arrive, stages them, and
 * at end (all checked) swaps the weights in between two engine steps: every sample
 * finished after that carries the new policy_version, and unfinished ones are re-run
 * from their prompt, so no sample mixes versions.
 * weights.begin {v, version: int > the worker's policy_version (the trainer's iteration),
 *                kind: "full" (the model's f32 weights) | "lora" (only the adapter's: the
 *                worker must have been started with an adapter of this configuration),
 *                total_bytes, bucket_bytes (a multiple of 4, <= 2^30), n_buckets
 *                (ceil(total_bytes / bucket_bytes)), tensors: [{name, dtype: "f32",
 *                shape: [int] (1 or 2 sizes), offset (bytes into the stream), bytes}]
 *                (exactly the worker's tensors, in its order and layout: smelt's
 *                parameter names for "full", PEFT's for "lora"), lora?: {r, lora_alpha,
 *                use_rslora} (kind "lora" only; must equal the worker's adapter's)}
 *               No reply unless refused. A begin while another sync is in progress ends
 *               that one (its sender gets weights.error).
 * weights.bucket {v, version, index: 0..n_buckets-1, hash: XXH64 of the bytes as 16
 *                lower-case hex digits}
 *               frame 2: the bytes [offset index * bucket_bytes of the stream; bucket_bytes,
 *               the last one what is left]. Any order, each once.
 * weights.end   {v, version, n_buckets, total_bytes}
 *               -> weights.ack {v, version, kind, bytes (payload received), buckets,
 *               seconds (begin to weights in use)} once the weights are in use.
 * weights.error {v, version?: the sync's when it could be read, error: {message, field}}
 *               The sync is refused and the old weights stay. field: the header field at
 *               fault ("version": not newer, or no sync of that version in progress;
 *               "kind", "total_bytes", "bucket_bytes", "n_buckets" (also: a bucket
 *               missing at end), "tensors[i]" (unknown tensor, wrong dtype, shape or
 *               layout) or "tensors" (one missing), "lora", "index" (out of range,
 *               twice), "bytes" (frame 2's size), "hash" (the bytes do not match), "v"),
 *               or null (the engine could not take the weights). Sent once per sync: the
 *               refused sync's later messages are dropped silently. The worker keeps
 *               serving.
 */
#define MSG_GEN_REQUEST "gen.request"
#define MSG_GEN_RESULT "gen.result"
#define MSG_GEN_ERROR "gen.error"
#define MSG_GEN_ABORT "gen.abort"
#define MSG_HEALTH_REQUEST "health.request"
#define MSG_HEALTH_REPLY "health.reply"
#define MSG_STATS_REQUEST "stats.request"
#define MSG_STATS_REPLY "stats.reply"
#define MSG_WEIGHTS_BEGIN "weights.begin"
#define MSG_WEIGHTS_BUCKET "weights.bucket"
#define MSG_WEIGHTS_END "weights.end"
#define MSG_WEIGHTS_ACK "weights.ack"
#define MSG_WEIGHTS_ERROR "weights.error"

/* ---- agents (smelt-agent DEALER -> smeltd ROUTER) ----
 *
 * agent.register  {v, agent_id, hostname, devices: [{index, kind: "cpu"|"cuda", name,
 *                  memory_bytes}], running: [{job_id, attempt}]}
 *                 -> agent.registered {v, heartbeat_ms}
 * agent.heartbeat {v, agent_id, running: [{job_id, attempt}]}
 *                 -> agent.registered {v, heartbeat_ms}: smeltd answers every heartbeat; an
 *                 agent that hears nothing for 5 heartbeats registers again
 * worker.launch   (smeltd -> agent) {v, job_id, attempt, argv: [string], env: {k: v},
 *                  workdir, log_path, metrics_path, devices: [index], secrets?: {the
 *                  attempt's keys, common/curve.h's struct curve_job_keys as JSON}}
 *                  The agent execv()s argv[0] (no shell) in workdir with env added,
 *                  stdout+stderr appended to log_path, CUDA_VISIBLE_DEVICES set from
 *                  devices for "cuda" devices, secrets through an inherited pipe
 *                  (common/secret_fd.h: never argv, env values or files); it tails
 *                  metrics_path and relays lines.
 * worker.stop     (smeltd -> agent) {v, job_id, attempt, grace_ms, reason}
 *                  SIGTERM, then SIGKILL after grace_ms.
 * worker.started  {v, agent_id, job_id, attempt, pid}
 * worker.event    {v, agent_id, job_id, attempt, offset, line: object}: one metrics.jsonl
 *                  line and its byte offset in the file (the receiver drops repeats)
 * worker.exited   {v, agent_id, job_id, attempt, exit_code (-1 if signalled),
 *                  signal (0 if exited), error?: string (launch failed)}
 * agent.error     {v, error: {message, field}}: a message the receiver refused
 */
#define MSG_AGENT_REGISTER "agent.register"
#define MSG_AGENT_REGISTERED "agent.registered"
#define MSG_AGENT_HEARTBEAT "agent.heartbeat"
#define MSG_AGENT_ERROR "agent.error"
#define MSG_WORKER_LAUNCH "worker.launch"
#define MSG_WORKER_STOP "worker.stop"
#define MSG_WORKER_STARTED "worker.started"
#define MSG_WORKER_EVENT "worker.event"
#define MSG_WORKER_EXITED "worker.exited"

/* ---- Tinker session worker (smelt-tinker, DEALER, routing id "<job_id>.<attempt>";
 * smeltd's tinker ROUTER, docs/tinker.md) ----
 *
 * smeltd turns the Tinker API's requests into these after validating them (the worker
 * still refuses what it cannot do, naming the field), sends each model's requests in the
 * order the client sequenced them, and keeps each answer as the future's result. Arrays
 * are little-endian and packed: "offset" fields count elements into their frame.
 *
 * tinker.hello    worker -> smeltd {v, job_id, attempt, pid, model: the base model's
 *                 directory, vocab_size, max_context}. Sent when the worker is ready and
 *                 every TINKER_HELLO_MS after (liveness; no answer).
 * tinker.request  smeltd -> worker {v, id: the future's id, op, model_id?, ...}; per op:
 *   create_model      {model_id, lora: {rank, alpha, seed, train_attn, train_mlp,
 *                     train_unembed}}
 *   forward, forward_backward
 *                     {model_id, loss_fn: "cross_entropy"|"importance_sampling"|"ppo"|
 *                     "cispo"|"dro", loss_fn_config: {name: number} (may be empty), data:
 *                     [{n_tokens, inputs: {name: {dtype: "int64"|"float32", shape: [int],
 *                     offset}}}]}
 *                     frame 2: int32 input tokens of every datum in order; frame 3: int32
 *                     values of every int64 input; frame 4: float32 values of every
 *                     float32 input (offset: into frame 3 or 4 by dtype). forward_backward
 *                     adds to the model's gradients (kept until optim_step).
 *   optim_step        {model_id, adam: {learning_rate, beta1, beta2, eps, weight_decay,
 *                     grad_clip_norm (0: none)}}
 *   save_weights      {model_id, path: a directory smeltd made, optimizer: true, overwrite?:
 *                     bool (false: an existing path is refused, naming "path")}
 *   load_weights      {model_id, path, optimizer: bool}
 *   save_weights_for_sampler {model_id, path, overwrite?}: a PEFT adapter directory
 *   unload_model      {model_id}
 *   sample            {model_id? (a live model's adapter) | adapter_path? (a sampler
 *                     checkpoint's directory) | neither (the base), num_samples,
 *                     max_tokens, temperature, top_k, top_p, seed, stop_token_ids: [int],
 *                     stop_strings: [string], prompt_logprobs: bool,
 *                     topk_prompt_logprobs: int}
 *                     frame 2: int32 prompt tokens.
 * tinker.result   worker -> smeltd {v, id, ok: true, result: {...}} with arrays, or
 *                 {v, id, ok: false, error: {message, field?, category: "user"|"server"}}
 *                 ("user": the request was at fault; "server": the worker failed).
 *   forward(_backward) {metrics: {"name:reduction": number}, outputs: [[[name, n], ...]
 *                     per datum]}; frame 2: float32 values of every output of every datum
 *                     in that order (e.g. logprobs [n], elementwise_loss [n]).
 *   optim_step        {metrics: {...}}
 *   sample            {sequences: [{n_tokens, stop_reason: "stop"|"length"}]}; frame 2:
 *                     int32 tokens of every sequence; frame 3: float32 their logprobs;
 *                     frame 4 (prompt_logprobs): float32 [n_prompt] (the first NaN: it has
 *                     no logprob); frame 5 (topk_prompt_logprobs = k > 0): int32 ids and
 *                     frame 6: float32 logprobs, [n_prompt * k] each.
 *   others            {}
 */
#define MSG_TINKER_HELLO "tinker.hello"
#define MSG_TINKER_REQUEST "tinker.request"
#define MSG_TINKER_RESULT "tinker.result"
#define TINKER_HELLO_MS 2000

/* ---- rendezvous (comm/'s "smeltd:ENDPOINT" store, DEALER -> smeltd's rendezvous ROUTER,
 * server/rendezvous.c; docs/distributed.md) ----
 *
 * The connection's keys are the table: a client gets in only with the worker keypair of
 * a running job's current attempt, and reads and writes that attempt's keys alone.
 * id: the client's, 1..64 bytes, echoed in the reply. key: 1..RDZV_KEY_BYTES-1
 * printable bytes, no spaces.
 * rdzv.set   {v, id, key} frame 2: the value (any bytes; set again replaces it)
 *            -> rdzv.reply {v, id, ok: true}
 * rdzv.get   {v, id, key, timeout_ms: 0..3600000}
 *            -> rdzv.reply {v, id, ok: true} frame 2: the value, at once or as soon as
 *            the key is set within timeout_ms
 * rdzv.reply {v, id?, ok: false, error: {message, field?, code}} when refused; code:
 *            "not_found" (the key was not set within timeout_ms; field "key"),
 *            "invalid" (field: the header field at fault: "id", "key", "timeout_ms",
 *            "frames", "type", "v", "header"), "limit" (field: "rendezvous_max_keys",
 *            "rendezvous_max_bytes" (keys and values of one attempt), "waiters" (gets
 *            waiting at once)), "ended" (the attempt is no longer its job's running one:
 *            its table is gone). */
#define MSG_RDZV_SET "rdzv.set"
#define MSG_RDZV_GET "rdzv.get"
#define MSG_RDZV_REPLY "rdzv.reply"
#define RDZV_KEY_BYTES 384
struct msg_array {
    void *data;
    size_t bytes;
};

struct msg {
    char route[MSG_ROUTE_BYTES];  /* ROUTER routing id (binary) */
    size_t route_len;             /* 0 when not received on a ROUTER socket */
    /* The ZAP user id of the sender's connection on a CURVE socket (common/curve.h): who
     * the sender proved to be, whatever its header says; "" on sockets without ZAP. */
    char user_id[128];
    char type[MSG_TYPE_BYTES];    /* NUL-terminated */
    json_t *header;               /* owned */
    struct msg_array arrays[MSG_MAX_ARRAYS]; /* owned (malloc'd) */
    int n_arrays;
};

/* Sends one message. route/route_len: the peer's routing id on a ROUTER socket (NULL, 0
 * otherwise). header gets "v" set if it lacks one; it stays the caller's. Never blocks
 * for long: a peer that cannot take the message (ZMQ_DONTWAIT would block) is an
 * SMELT_EIO error, so one slow client cannot stall a worker. */
int msg_send(void *socket, const void *route, size_t route_len, const char *type,
             json_t *header, const struct msg_array *arrays, int n_arrays,
             struct smelt_error *err);

/* Receives one message, waiting at most timeout_ms (-1: forever). Returns 0 with a
 * message, SMELT_ENOTFOUND on timeout, SMELT_EFORMAT for a malformed message (which is
 * consumed whole; out->route is still filled so the sender can be answered, and
 * out->type when it could be read), SMELT_EIO when the socket fails. router: the socket
 * is a ROUTER (the first frame is the routing id). */
int msg_recv(void *socket, bool router, int timeout_ms, struct msg *out, struct smelt_error *err);
void msg_free(struct msg *m);

/* Header "v" check: SMELT_EINVAL naming the field "v" when missing or different. */
int msg_check_version(const struct msg *m, struct smelt_error *err);

#endif
