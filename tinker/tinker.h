/* tinker/: smelt-tinker, the Tinker API's session worker (docs/tinker.md, DESIGN.md
 * §7a). One process holds ONE base model and serves any number of LoRA "models" created
 * on it (multi-tenant LoRA): each has its own adapter, gradient buffer (the adapter's
 * grads, accumulated across forward_backward calls until optim_step), AdamW state and
 * step count. The base never changes: a model's adapter is attached for its request
 * and detached after.
 *
 * Requests are common/msg.h's tinker.request (section "Tinker session worker"), run one
 * at a time in arrival order, except that sample requests waiting together run as one
 * batch (tinker_sample_batch); each gets a tinker.result. A request at fault gets ok:false
 * with category "user" and a message naming the field; a failure of the worker itself
 * gets category "server". Nothing a request holds kills the worker.
 *
 * Sampling uses the rollout engine (rollout/) on the shared base, each request with its
 * model's adapter (several adapters in one engine step); the worker turns on the CPU backend's batch-invariant kernels
 * (tinker_worker_create), so a sample's logprobs equal a later forward's bit for bit.
 *
 * Ownership: tinker_worker_create loads and owns the base model, its tokenizer and the
 * engine; tinker_worker_free frees every model on it. A struct tinker_reply owns its
 * result and arrays (tinker_reply_free). Not thread-safe: one thread drives a worker. */
#ifndef SMELT_TINKER_H
#define SMELT_TINKER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"
#include "common/msg.h"
#include "kernels/ops.h"

/* LoRA alpha of every model (Tinker's LoraConfig has no alpha; docs/tinker.md says why
 * 32). */
#define TINKER_LORA_ALPHA 32.0f
/* The Tinker defaults of loss_fn_config's clip thresholds: ppo's (epsilon 0.2 either
 * side) and cispo's (no floor, a cap of 4). */
#define TINKER_PPO_CLIP_LOW 0.8
#define TINKER_PPO_CLIP_HIGH 1.2
#define TINKER_CISPO_CLIP_LOW 0.0
#define TINKER_CISPO_CLIP_HIGH 4.0
/* Longest model_id / path the worker takes. */
#define TINKER_ID_BYTES 128
#define TINKER_PATH_BYTES 4096

struct tinker_config {
    const char *model_dir;      /* the base model (HF directory); its tokenizer.json, if any,
                                   serves stop strings */
    enum backend backend;
    int64_t kv_cache_bytes;     /* the engine's KV cache budget */
    uint64_t seed;              /* seeds the fresh seeds of sample requests that give none */
    const char *metrics_path;   /* NULL: no metrics file; else JSON lines appended */
};

struct tinker_worker;
struct model;

/* Loads the base (and tokenizer), makes the engine, turns on batch invariance on the CPU
 * backend (process-wide; a backend without it, CUDA, goes on without: logprobs then
 * agree closely, not bitwise). Errors name the flag at fault. */
int tinker_worker_create(const struct tinker_config *config, struct tinker_worker **out,
                         struct smelt_error *err);
/* The same on a model already made (tests: model_init_random). model is adopted: the
 * worker frees it. base_name is what checkpoints record as their base
 * (base_model_name_or_path; the model's directory in production). */
int tinker_worker_create_on(struct model *model, const char *base_name, const struct tinker_config *config,
                            struct tinker_worker **out, struct smelt_error *err);
void tinker_worker_free(struct tinker_worker *w);

/* The worker's base: what tinker.hello carries. */
const struct model *tinker_worker_model(const struct tinker_worker *w);
const char *tinker_worker_base_name(const struct tinker_worker *w);

/* What one request produced: result (the "result" object) and arrays (the frames after
 * the header, msg.h's "frame 2" first). */
struct tinker_reply {
    json_t *result;
    struct msg_array arrays[MSG_MAX_ARRAYS];
    int n_arrays;
};
void tinker_reply_free(struct tinker_reply *r);

/* Runs one tinker.request (header and arrays as msg_recv gives them). On failure
 * err->code, message and field say why and *out is empty. */
int tinker_handle(struct tinker_worker *w, const struct msg *request, struct tinker_reply *out,
                  struct smelt_error *err);

/* Sample requests of any models batched in one engine run (S-LoRA / Punica: each
 * request's adapter on its own rows of every step): requests[i] must be a tinker.request
 * with op "sample" (else it is refused naming "op"); outs[i], rcs[i] and errs[i] are
 * what tinker_handle gives for it alone, bit for bit on the CPU (batch-invariant
 * kernels), seeds included (requests without one draw theirs in order). One request's
 * failure is its own; a failed engine step fails every request still in it. */
int tinker_sample_batch(struct tinker_worker *w, const struct msg *const *requests, int n, struct tinker_reply *outs,
                        int *rcs, struct smelt_error *errs);
/* Whether m is a tinker.request whose op is "sample" (what tinker_serve batches). */
bool tinker_is_sample(const struct msg *m);
/* The most sample requests tinker_serve takes into one batch. */
#define TINKER_MAX_SAMPLE_BATCH 64

/* "user" when a request at fault explains rc (bad value, unknown name, unsupported
 * feature, malformed data), "server" otherwise. */
const char *tinker_error_category(int rc);

/* The tinker.result header for request id (NULL: unknown; JSON null): {id, ok: true,
 * result} when rc is 0 (reply's result is borrowed), else {id, ok: false, error:
 * {message, field?, category}}. NULL when out of memory. */
json_t *tinker_result_header(const char *id, int rc, const struct tinker_reply *reply,
                             const struct smelt_error *err);

/* The loop: connected DEALER `dealer` (routing id "<job_id>.<attempt>"); sends
 * tinker.hello at once and every TINKER_HELLO_MS, answers every tinker.request with a
 * tinker.result, and anything else (a malformed message, another type) with an ok:false
 * tinker.result (id null when unreadable) and goes on. Returns 0 once *stop is non-zero
 * (checked between requests: the request in hand is finished and answered first); an
 * error only when the socket fails. */
int tinker_serve(struct tinker_worker *w, void *dealer, const char *job_id, int64_t attempt, const atomic_int *stop,
                 struct smelt_error *err);

#endif
