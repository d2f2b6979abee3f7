/* The Tinker API's HTTP side inside smeltd (private to server/; docs/tinker.md): the
 * SDK's protobuf bodies turned into common/msg.h's tinker.request, and the worker's
 * tinker.result turned into the SDK's result objects. Shared parts with the session
 * jobs and dispatch are in server/tinker_internal.h. */
#ifndef SMELT_SERVER_TINKER_API_H
#define SMELT_SERVER_TINKER_API_H

#include <stdbool.h>
#include <stdint.h>

#include "server/tinker_internal.h"

#define TINKER_ID_BYTES 128

/* A forward / forward_backward request decoded from the SDK's ForwardBackwardRequest
 * protobuf and checked field by field: header is msg.h's tinker.request header (no "v",
 * no "id"), arrays its frames 2..4 (tokens int32, int64 inputs as int32, float32
 * inputs). Owned: tinker_fwdbwd_free. */
struct tinker_fwdbwd {
    char model_id[TINKER_ID_BYTES];
    int64_t seq_id;
    json_t *header;
    struct msg_array arrays[3];
    int n_arrays;
};

/* Decodes and checks body (every failure SMELT_EINVAL / SMELT_EUNSUPPORTED naming the
 * field, e.g. "data[2].loss_fn_inputs.weights"); a refused body still leaves model_id and
 * seq_id set when they could be read (nothing else to free). Token ids are not checked against a
 * vocabulary here: tinker_fwdbwd_check_tokens does that once the model is known. */
int tinker_fwdbwd_decode(const void *body, size_t len, struct tinker_fwdbwd *out, struct smelt_error *err);
/* Every input token and every target_tokens value in [0, vocab_size); else SMELT_EINVAL
 * naming the datum, the field and the index. */
int tinker_fwdbwd_check_tokens(const struct tinker_fwdbwd *r, int64_t vocab_size, struct smelt_error *err);
void tinker_fwdbwd_free(struct tinker_fwdbwd *r);

/* The SDK's result object of a worker's successful tinker.result for op: base (what the
 * API decided at submission, e.g. {"type":"save_weights","path":"tinker://..."}; may be
 * NULL) with the worker's answer added. For forward(_backward) and sample it is the JSON
 * form of the protobuf answer, which tinker_result_proto encodes; floats are kept as
 * doubles so they convert back to the same f32. New reference in *out. SMELT_EFORMAT
 * naming the field when the worker's answer does not fit msg.h. */
int tinker_result_object(const char *op, const json_t *base, const struct msg *result, json_t **out,
                         struct smelt_error *err);
/* The protobuf body of a stored forward(_backward) or sample result (malloc'd, *len). */
int tinker_result_proto(const char *op, const json_t *result, uint8_t **out, size_t *len,
                        struct smelt_error *err);
/* true for the ops whose results the SDK takes only as protobuf. */
bool tinker_op_is_proto(const char *op);

/* ---- per-model request order (server/tinker_order.c) ----
 * Requests of one model reach the worker in seq_id order whatever order they arrive in;
 * early ones wait. All calls are thread-safe. */
struct tinker_order;
#define TINKER_ORDER_REPEATED 1
/* Called (under the order's lock, on the submitting thread) for each request that is
 * due, in order; takes payload. ctx is the submit call's. */
typedef void (*tinker_order_send_fn)(void *ctx, void *payload, const char *future_id);
int tinker_order_new(tinker_order_send_fn send, void (*free_payload)(void *), struct tinker_order **out,
                     struct smelt_error *err);
void tinker_order_free(struct tinker_order *o);
/* model_id's next due seq is next_seq (create_model and create-via-load: 1); anything
 * waiting for it is dropped. A model never opened expects 1. */
int tinker_order_open(struct tinker_order *o, const char *model_id, int64_t next_seq, struct smelt_error *err);
/* Queues payload (taken on 0) as model_id's request seq with future_id and sends what is
 * due. TINKER_ORDER_REPEATED (payload not taken) when seq was submitted before: first_id
 * gets that request's future id. SMELT_EINVAL naming "seq_id" for a seq already passed, below 1, or more than 1024
 * past the next due one. */
int tinker_order_submit(struct tinker_order *o, const char *model_id, int64_t seq, const char *future_id,
                        void *payload, void *ctx, char *first_id, size_t cap, struct smelt_error *err);
/* seq was refused at submission: it is passed over, so later ones are not held for it. */
int tinker_order_skip(struct tinker_order *o, const char *model_id, int64_t seq, void *ctx);
/* Forgets model_id (its job ended, or its create_model never reached the worker), dropping what waits. */
void tinker_order_close(struct tinker_order *o, const char *model_id);
/* Takes back future_id's request of model_id while it waits here for an earlier seq (its seq is passed over):
 * true; false when it is not waiting (sent already, or unknown). */
bool tinker_order_cancel(struct tinker_order *o, const char *model_id, const char *future_id);
/* How many models have order state (open, or seen by a submit and not closed). */
size_t tinker_order_count(struct tinker_order *o);

/* ---- the HTTP handlers (server/api_tinker*.c; routes in server/routes.c) ---- */

/* Makes / frees s->tinker_api (the order of requests and a cache of base models). */
int tinker_api_start(struct server *s, struct smelt_error *err);
void tinker_api_stop(struct server *s);
/* The order of model requests (s->tinker_api's). */
struct tinker_order *tinker_api_order(struct server *s);
/* Session job job_id ended (its worker gone, released, failed, or left over from the last run): the order state of
 * every model it held is freed. Nothing without s->tinker_api. */
void tinker_api_forget_job(struct server *s, struct store_conn *c, const char *job_id);

/* Checkpoint names and tinker:// paths (server/api_tinker_runs.c). */
/* true for a save name: [A-Za-z0-9._-]{1,64}, not starting with '.'. */
bool tinker_name_ok(const char *name);
/* "tinker://<model_id>/<segment>/<name>" for kind "training" (segment weights) or
 * "sampler" (sampler_weights). SMELT_EINVAL when it does not fit. */
int tinker_checkpoint_path(const char *model_id, const char *kind, const char *name, char *out, size_t cap,
                           struct smelt_error *err);
/* Its directory: DATA/tinker/<model_id>/<segment>/<name>. */
int tinker_checkpoint_dir(const char *data_dir, const char *model_id, const char *kind, const char *name, char *out,
                          size_t cap, struct smelt_error *err);

void api_tinker_healthz(void *app, struct http_request *req, struct http_response *res);
void api_tinker_client_config(void *app, struct http_request *req, struct http_response *res);
void api_tinker_dynamic_config(void *app, struct http_request *req, struct http_response *res);
void api_tinker_telemetry(void *app, struct http_request *req, struct http_response *res);
void api_tinker_create_session(void *app, struct http_request *req, struct http_response *res);
void api_tinker_heartbeat(void *app, struct http_request *req, struct http_response *res);
void api_tinker_finish(void *app, struct http_request *req, struct http_response *res);
void api_tinker_capabilities(void *app, struct http_request *req, struct http_response *res);
void api_tinker_create_model(void *app, struct http_request *req, struct http_response *res);
void api_tinker_get_info(void *app, struct http_request *req, struct http_response *res);
void api_tinker_forward_backward(void *app, struct http_request *req, struct http_response *res);
void api_tinker_optim_step(void *app, struct http_request *req, struct http_response *res);
void api_tinker_save_weights(void *app, struct http_request *req, struct http_response *res);
void api_tinker_save_for_sampler(void *app, struct http_request *req, struct http_response *res);
void api_tinker_load_weights(void *app, struct http_request *req, struct http_response *res);
void api_tinker_unload_model(void *app, struct http_request *req, struct http_response *res);
void api_tinker_create_sampler(void *app, struct http_request *req, struct http_response *res);
void api_tinker_get_sampler(void *app, struct http_request *req, struct http_response *res);
void api_tinker_asample(void *app, struct http_request *req, struct http_response *res);
void api_tinker_retrieve_future(void *app, struct http_request *req, struct http_response *res);
void api_tinker_cancel_future(void *app, struct http_request *req, struct http_response *res);
void api_tinker_runs_list(void *app, struct http_request *req, struct http_response *res);
void api_tinker_run_get(void *app, struct http_request *req, struct http_response *res);
void api_tinker_checkpoints(void *app, struct http_request *req, struct http_response *res);
void api_tinker_checkpoint_delete(void *app, struct http_request *req, struct http_response *res);
void api_tinker_weights_info(void *app, struct http_request *req, struct http_response *res);

/* ---- what the handlers share (server/api_tinker.c) ---- */

/* Replies err: 404 SMELT_ENOTFOUND, 400 bad input, 500 otherwise; param defaults to err's field. */
void tinker_reply_failure(struct http_response *res, const struct smelt_error *err, const char *param);
/* A base model's vocab_size and max context (model/config.h; cached per directory). */
int tinker_base_info(struct server *s, const char *base_dir, int64_t *vocab_size, int64_t *max_context,
                     struct smelt_error *err);
/* The project's tinker_models row of model_id (new reference) or a reply: 404 naming
 * model_id when unknown or another project's; 410 when live is wanted and it is not. */
json_t *tinker_model_row(struct store_conn *c, struct http_response *res, const char *project, const char *model_id,
                         bool live);
/* A future of op for the project (model_id may be NULL) on job_id with base (may be
 * NULL) as its result's start; header (taken) and arrays go to the worker: in seq order
 * for a model's ordered requests (seq >= 1), at once for seq < 0. Replies
 * {"request_id", "model_id"?} (plus extra's keys, taken; may be NULL), or the failure.
 * Takes base and header (NULL: out of memory). */
void tinker_submit(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                   const char *model_id, int64_t seq, const char *job_id, const char *op, json_t *base, json_t *header,
                   const struct msg_array *arrays, int n_arrays, json_t *extra);
/* The same at once and without a reply: fut gets the future's id; takes header, not base. A failed dispatch fails
 * the future it made. */
int tinker_submit_quiet(struct server *s, struct store_conn *c, const char *project, const char *model_id,
                        const char *job_id, const char *op, json_t *base, json_t *header, char *fut, size_t cap,
                        struct smelt_error *err);
/* The JSON request bodies' rules (server/tinker_rules.c; the document's Tinker* schemas). */
#define TINKER_MAX_TOPK 20 /* topk_prompt_logprobs: the worker keeps k logprobs per prompt token */
extern const struct body_rule TINKER_CLIENT_CONFIG[], TINKER_TELEMETRY[], TINKER_CREATE_SESSION[],
    TINKER_FINISH_SESSION[], TINKER_HEARTBEAT[],
    TINKER_CREATE_MODEL[], TINKER_GET_INFO[], TINKER_OPTIM_STEP[], TINKER_SAVE_WEIGHTS[], TINKER_SAVE_FOR_SAMPLER[],
    TINKER_LOAD_WEIGHTS[], TINKER_CREATE_SAMPLER[], TINKER_SAMPLE[], TINKER_RETRIEVE_FUTURE[], TINKER_CANCEL_FUTURE[],
    TINKER_WEIGHTS_INFO[];
/* A body JSON object that keeps rules (body_check), or a 400 reply naming the field (NULL). */
json_t *tinker_body(const struct http_request *req, struct http_response *res, const struct body_rule *rules);
/* The same for a route whose body may be left out (the SDK's config and telemetry): 0 when
 * there is none or it keeps rules, else a 400 reply (non-zero). */
int tinker_optional_body(const struct http_request *req, struct http_response *res, const struct body_rule *rules);
/* A handler's work on its JSON body with a store connection (project: the key's). */
typedef void (*tinker_body_fn)(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                               const json_t *body);
/* A handler's work as one write transaction (BEGIN IMMEDIATE): a session job's pick, or a model's liveness check,
 * commits with the future made for it, so the control loop's idle release (tinker_jobs_tick, one transaction of
 * its own) comes wholly before it (the request sees the job released: a new job, or 410 for its model) or wholly
 * after (the release sees the new future and keeps the job). Begin replies 503 on failure (non-zero); end commits,
 * replying 500 when that fails. */
int tinker_txn_begin(struct store_conn *c, struct http_response *res);
void tinker_txn_end(struct store_conn *c, struct http_response *res);
/* Runs fn with the request's body, once it keeps rules, and a store connection, in one transaction
 * (tinker_txn_begin; replies 400 / 503 without them). A refused body of a live model's ordered request
 * (model_id, seq_id) passes its seq over, so the model's later requests do not wait for it. */
void tinker_with_body(void *app, struct http_request *req, struct http_response *res, const struct body_rule *rules,
                      tinker_body_fn fn);
/* The project's session job for base model name (resolved like a job's model); fills
 * base_dir. Replies on failure (non-zero). */
int tinker_job_for_base(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                        const char *base_model, const char *field, char *base_dir, size_t dir_cap, char *job_id,
                        size_t job_cap);

#endif
