/* What the parts of smeltd share (private to server/). */
#ifndef SMELT_SERVER_INTERNAL_H
#define SMELT_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/msg.h"
#include "server/http.h"
#include "server/server.h"
#include "server/store.h"

#define SERVER_PATH_BYTES 1024

struct server {
    struct server_config config;
    char data_dir[SERVER_PATH_BYTES];      /* absolute */
    char models_dir[SERVER_PATH_BYTES];    /* absolute */
    char files_dir[SERVER_PATH_BYTES];
    char jobs_dir[SERVER_PATH_BYTES];
    char trainer_path[SERVER_PATH_BYTES];  /* smelt-trainer, absolute */
    char tinker_path[SERVER_PATH_BYTES];   /* smelt-tinker (beside smelt-trainer), absolute */
    char web_dir[SERVER_PATH_BYTES];
    struct store *store;
    /* Set once HTTP serves, cleared before it stops; read by HTTP handlers and the
     * control loop (events wake SSE followers), so atomic. */
    _Atomic(struct http_server *) http;
    void *zmq;                             /* the ZeroMQ context */
    struct curve_keypair curve;            /* smeltd's CURVE keys (<data>/server.key, made once) */
    struct zap_handler *zap;               /* who may connect to smeltd's CURVE sockets */
    int64_t started_at;
    atomic_int kick;                       /* HTTP threads ask the control loop to look now */
    /* counters for /metrics that are not in the store */
    atomic_llong job_retries_total;
    atomic_llong schedule_fires_total;
    atomic_int grader_python_runs;         /* graders routes in a python sandbox now (api_graders.c) */
    /* the control loop (control.c) */
    pthread_t control_thread;
    bool control_started;
    atomic_int control_stop;
    void *agent_router;                    /* ROUTER: inproc for the embedded agent (+ tcp) */
    struct agent_link *agent_link;         /* its CURVE, senders and routes (agent_link.c) */
    pthread_t agent_thread;
    bool agent_started;
    atomic_int agent_stop;                 /* set by control_stop, read by the agent thread */
    /* the Tinker dispatch thread (tinker_dispatch.c): its ROUTER, queues and thread */
    char tinker_endpoint[256];             /* where session workers connect (ZMQ_LAST_ENDPOINT) */
    struct tinker_dispatch *tinker;        /* NULL until tinker_dispatch_start */
    /* the rendezvous (rendezvous.c): where a job's ranks meet */
    char rendezvous_endpoint[256];         /* ZMQ_LAST_ENDPOINT; trainers get "smeltd:" + it */
    struct rendezvous *rendezvous;         /* NULL until rendezvous_start */
    struct tinker_api *tinker_api;         /* the API handlers' state (api_tinker.c) */
    atomic_bool tinker_futures_failed;     /* futures failed in a control-loop transaction not
                                              yet woken (tinker_futures_wake_failed) */
};

/* ---- small helpers (server/util.c) ---- */

int64_t server_now(void);
/* prefix + 24 random hex characters ("ftjob-" -> "ftjob-3f9c..."). */
void server_new_id(const char *prefix, char *out, size_t cap);
/* A failure code of server/ alone, beside common/error.h's: the object's state does not allow
 * the request (an agent that has a live credential already, a credential revoked already). */
#define SERVER_ESTATE (-64)
/* An HTTP error response for a failed smelt call: 404 for SMELT_ENOTFOUND, 400 for
 * SMELT_EINVAL / SMELT_EFORMAT, 409 for SERVER_ESTATE, 500 otherwise; param may be NULL. */
void server_reply_failure(struct http_response *res, const struct smelt_error *err,
                          const char *param);
/* Parses the request body as a JSON object; on failure replies 400 and returns NULL. */
json_t *server_body_object(const struct http_request *req, struct http_response *res);
/* Reads ?limit= (default def, 1..max) and ?after= (an id: http_is_id); replies 400 and
 * returns -1 when bad. */
/* A cursor that is a row number: 1 to 18 decimal digits (no sign, no space, so never
 * past INT64_MAX); -1 for anything else. The document says {"type": "integer",
 * "minimum": 0, "maximum": 999999999999999999}. */
int64_t server_parse_row_number(const char *text);
/* An event id as a job's events take it (Last-Event-ID, ?after=): "ftevent-12" or "12" -> 12;
 * -1 when neither (the document's pattern ^(ftevent-)?[0-9]{1,18}$). In server_internal.h
 * for tests/fuzz/fuzz_sse_resume.c (api_jobs.c is its only caller). */
int64_t server_event_number(const char *text);
int server_page_args(const struct http_request *req, struct http_response *res, int64_t def,
                     int64_t max, int64_t *limit, const char **after);
/* Replies a list page {"object": "list", "data", "has_more"} (plus first_id / last_id when
 * ids is set) from rows fetched with LIMIT limit + 1: the first limit rows, each made an
 * API object by fn(ctx, row). Takes rows. */
void server_reply_list(struct http_response *res, json_t *rows, int64_t limit,
                       json_t *(*fn)(void *ctx, json_t *row), void *ctx, bool ids);
/* A store connection or a 503 reply. */
struct store_conn *server_conn(struct server *s, struct http_response *res);

/* ---- request bodies against their schema in the document (server/body_rules.c) ---- */

/* What a JSON body's key holds, as server/web/openapi.json says it: a table of rules ends with
 * {NULL} (whose check, if any, looks at the object as a whole: one field or another); a rule
 * keyed "*" takes every key no other rule names (additionalProperties), which are refused
 * without one. null counts as absent (the document types an optional field
 * [T, "null"]). */
enum body_kind { BODY_STRING = 1, BODY_INT, BODY_NUMBER, BODY_BOOL, BODY_OBJECT, BODY_ARRAY, BODY_JSON };
struct body_rule {
    const char *key;
    enum body_kind kind;
    bool required;
    double min, max;                /* INT, NUMBER: the range, inclusive */
    const char *const *values;      /* STRING: the allowed values, NULL-terminated (NULL: any) */
    const struct body_rule *fields; /* OBJECT: its keys (NULL: any keys, with JSON values) */
    const struct body_rule *items;  /* ARRAY: the rule of every item, which may not be null (NULL: JSON values) */
    /* anything further the schema says (a union, a length): SMELT_EINVAL naming path */
    int (*check)(const json_t *v, const char *path, struct smelt_error *err);
};
/* obj against rules: an unknown key, a required one missing, or a value of another type, out of
 * its range or not among its values is SMELT_EINVAL naming the field ("where.key", "key" when
 * where is ""; items "key[i]"). */
int body_check(const json_t *obj, const struct body_rule *rules, const char *where, struct smelt_error *err);
/* An integer, or a real with an integral value under 9e15 (4.0 is 4, as JSON Schema counts it):
 * what a rule of kind BODY_INT takes; json_number_value gives its value. */
bool body_integral(const json_t *v);
/* A free-form JSON value (the document's JsonValue): its numbers are within [-2^63, 2^63), as
 * integers always are once jansson has read them (it refuses larger ones). */
int body_check_json(const json_t *v, const char *path, struct smelt_error *err);

/* ---- jobs (server/jobs.c) ---- */

/* Creates a job from an OpenAI-style create request (already a JSON object) for
 * project; *job_out: the job object as the API returns it. On refusal replies through
 * res and returns non-zero. idempotency_key may be NULL. */
int jobs_create(struct server *s, const char *project, json_t *request,
                const char *idempotency_key, const char *schedule_id, json_t **job_out,
                struct http_response *res);
/* Checks a create request as jobs_create would, creating nothing (schedule templates). */
int jobs_validate(struct server *s, const char *project, json_t *request, struct http_response *res);
/* jobs_validate's plan without a reply: 0 and *spec (new reference), or the refusal in err
 * (SMELT_EINVAL naming the request's field in err->field). For tests/fuzz/fuzz_job_create.c. */
int jobs_plan_spec(struct server *s, const char *project, const json_t *request, json_t **spec,
                   struct smelt_error *err);
/* The API object of a job row (SELECT * FROM jobs). New reference. */
json_t *jobs_object(struct server *s, json_t *row);
/* Appends an event to a job's stream and wakes SSE followers. data may be NULL. */
int jobs_event(struct server *s, struct store_conn *conn, const char *job_id, const char *level,
               const char *type, json_t *data, struct smelt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
bool jobs_status_final(const char *status);
/* reward_models.c: every reward_model grader of grader (the grader object, or a multi's
 * sub-graders) gets "model_dir", its "model" resolved as models_resolve resolves a
 * job's model. path is the grader's path in the request ("method.reinforcement.grader")
 * for errors (SMELT_EINVAL naming "<path>.model" for no such model, "<path>.model_dir"
 * when the request gives one). grader is changed in place: pass the spec's copy. */
int jobs_resolve_reward_models(struct server *s, struct store_conn *conn, const char *project, json_t *grader,
                               const char *path, struct smelt_error *err);
/* grader as the job object shows it: every "model_dir" (the tree's, a multi's sub-graders')
 * removed in place, so no server path reaches a client; the trainer's spec keeps them. */
void jobs_grader_shown(json_t *grader);
/* The head of the model a job of method.type `type` makes ("lm"; reward models will say
 * "reward"), or NULL for a type smelt does not run. */
const char *jobs_method_head(const char *type);

/* ---- the control loop (server/control.c): agents, scheduling, cron ---- */

int control_start(struct server *s, struct smelt_error *err);
void control_stop(struct server *s);
/* Ends job id as failed with error {code, message} and an event saying so. */
void control_job_fail(struct server *s, struct store_conn *c, const char *id, const char *code,
                      const char *message);

/* ---- the agents socket's security (server/agent_link.c; control thread only) ---- */

/* Before the agents socket binds: CURVE with smeltd's keys and the "agents" ZAP domain
 * (unless config.insecure_agents, which is logged), and a monitor of failed handshakes. */
int agent_link_open(struct server *s, struct smelt_error *err);
void agent_link_close(struct server *s);
bool agent_link_secure(const struct server *s);
/* Logs the handshakes that failed since the last call (rate-limited). */
void agent_link_poll(struct server *s);
/* The agent id of m's sender: its live credential's agent (CURVE), the embedded agent
 * (inproc), or the routing id (insecure); remembers the route to answer it on. Non-zero:
 * drop the message (logged at WARN). */
int agent_link_sender(struct server *s, struct store_conn *c, const struct msg *m, char *agent_id, size_t cap);
/* Where messages to agent_id go; false when it has not been heard from on a live route. */
bool agent_link_route(struct server *s, const char *agent_id, const void **route, size_t *len);
/* The agents whose last message came on a credential revoked since (at most max). */
int agent_link_revoked(struct server *s, struct store_conn *c, char (*out)[MSG_ROUTE_BYTES], int max);
void agent_link_forget(struct server *s, const char *agent_id);

/* ---- agent credentials (server/agent_credentials.c; docs/security.md) ----
 * An enrolled agent's CURVE keypair: the store keeps its public key, the agent's key file
 * (mode 0600) the secret. On the agents socket the ZAP user id of a connection is its
 * credential's id; the control loop maps it to the agent id on every message. */

#define AGENT_LOCAL_ID "local" /* the embedded agent (inproc: no CURVE, no credential) */

struct agent_credential_request {
    const char *agent_id;          /* create: 1..63 of [A-Za-z0-9._-], not "local" */
    const char *description;       /* create: NULL or at most 256 bytes */
    const char *server_public_key; /* smeltd's, written into the key file */
    const char *endpoint;          /* NULL or the agents endpoint, written into the key file */
};
/* SMELT_EINVAL naming "agent_id" when agent_id is not a valid credential's agent id. */
int agent_credential_check_id(const char *agent_id, struct smelt_error *err);
/* A new credential for r->agent_id (refused while that agent has a live one). *object_out:
 * the credential as the API shows it; *key_file_out: the key file's JSON, the only copy of
 * the secret key ({credential_id, agent_id, public_key, secret_key, server_public_key,
 * endpoint?}). Both new references. Runs its own transaction on c. */
int agent_credential_create(struct store_conn *c, const struct agent_credential_request *r, json_t **object_out,
                            json_t **key_file_out, struct smelt_error *err);
/* Revokes credential id (SMELT_ENOTFOUND, or SMELT_EINVAL when already revoked); the control
 * loop then treats the agent connected with it as lost. Own transaction. */
int agent_credential_revoke(struct store_conn *c, const char *id, json_t **object_out, struct smelt_error *err);
/* A new credential for id's agent (r's agent_id and description are ignored) and id revoked,
 * in one transaction; outputs as agent_credential_create's. */
int agent_credential_rotate(struct store_conn *c, const char *id, const struct agent_credential_request *r,
                            json_t **object_out, json_t **key_file_out, struct smelt_error *err);
/* Every credential, oldest first, as the API shows them (no secrets). New reference. */
int agent_credential_list(struct store_conn *c, json_t **list_out, struct smelt_error *err);
/* The agent id of a live credential; SMELT_ENOTFOUND when unknown or revoked. */
int agent_credential_agent(struct store_conn *c, const char *credential_id, char *agent_id, size_t cap,
                           struct smelt_error *err);
/* The ZAP callback of the "agents" domain (arg: struct server *): a key of a live credential
 * is admitted with the credential's id as user id. Thread-safe (a store connection of its own). */
bool agent_credentials_authorize(void *arg, const char *address, const char *client_public_key, char *user_id,
                                 size_t user_id_cap, char *why, size_t why_cap);

/* ---- Tinker session jobs (server/tinker_jobs.c; the API's shared part: tinker_internal.h) ----
 * A session job is a jobs row of method {"type": "tinker"} whose worker (smelt-tinker) holds
 * one base model and the LoRA models made on it in memory: it is never retried. */

bool tinker_job_is_session(const json_t *job_row);
/* The worker's argv (a new array) for a session job row launched as attempt on devices of
 * kind device_kind ("cpu" or "cuda"). */
json_t *tinker_worker_argv(struct server *s, const json_t *job_row, int64_t attempt, const char *device_kind,
                           const char *metrics_path);
/* A session job's worker is gone (how: "exited with code 1: <log tail>", ...): its queued
 * requests are dropped, its pending futures fail, its live models are lost, and the job
 * ends: succeeded after a release that smeltd asked for ended with exit 0, else failed. */
void tinker_job_worker_gone(struct server *s, struct store_conn *c, const json_t *job_row, int exit_code,
                            const char *how);
/* A session worker's metrics line (type "tinker"): a metrics row, and an event for an
 * optim_step; a line at or before the last offset seen (a file read again) is dropped. */
void tinker_job_metrics_line(struct server *s, struct store_conn *c, const json_t *job_row, const json_t *event);
/* Every control tick: idle session jobs released (their models "released", the worker
 * stopped through send_stops); a running one whose worker said no tinker.hello within
 * TINKER_HELLO_DEADLINE_S of its start failed like a dead worker's (its futures failed,
 * its worker stopped through send_stops); pending futures of ended session jobs failed. */
void tinker_jobs_tick(struct server *s, struct store_conn *c);
/* At start, before the control loop: session jobs left from the last run end (their
 * models lived in memory): failed, pending futures failed, live models lost. */
int tinker_jobs_recover(struct server *s, struct smelt_error *err);
/* Drops the queued requests of job_id (its worker is gone). */
void tinker_dispatch_forget(struct server *s, const char *job_id);
/* Whether the worker of job_id's attempt has said tinker.hello (false without a dispatcher). */
bool tinker_dispatch_said_hello(struct server *s, const char *job_id, int64_t attempt);

/* ---- job channels (server/job_channels.c): smeltd's CURVE ROUTERs for job attempts ---- */
/* router (made and configured by the caller) becomes a CURVE server with smeltd's keys whose
 * handshakes fn(s, ...) decides under ZAP domain `domain`, bound to `bind` (a failure names
 * `field`); its endpoint (ZMQ_LAST_ENDPOINT) goes to endpoint[cap]. */
int server_curve_bind(struct server *s, void *router, const char *bind, const char *domain, zap_authorize_fn fn,
                      const char *field, char *endpoint, size_t cap, struct smelt_error *err);
/* A handshake by job attempt: true with user_id "<job_id>.<attempt>" when key is the
 * worker_public_key of a running job's current attempt (sessions_only: of a Tinker session
 * job); false with why otherwise. For zap_authorize_fn callbacks (the ZAP thread). */
bool server_attempt_of_key(struct server *s, const char *key, bool sessions_only, char *user_id, size_t cap,
                           char *why, size_t why_cap);

/* ---- the rendezvous (server/rendezvous.c; messages: common/msg.h's rdzv.*) ---- */
#define RDZV_DEFAULT_MAX_KEYS 1024
#define RDZV_DEFAULT_MAX_BYTES ((size_t)4 << 20)
/* Binds the rendezvous ROUTER (config.rendezvous_bind), a CURVE server (ZAP domain "rdzv")
 * that admits the worker keys of running attempts, records the endpoint in
 * s->rendezvous_endpoint and starts its thread. Needs s->zmq, s->curve, s->zap, s->store.
 * After a failure rendezvous_free still frees what was made. */
int rendezvous_start(struct server *s, struct smelt_error *err);
/* Stops the thread, closes the socket (before zap_handler_stop) and frees every table. */
void rendezvous_free(struct server *s);
/* How many keys attempt user_id ("<job_id>.<attempt>") holds now (0: no table). */
size_t rendezvous_keys_held(struct server *s, const char *user_id);

/* ---- schedules (server/schedules.c) ---- */

/* Fires a schedule row now (trigger "cron" or "manual") under its concurrency policy;
 * records the run. *job_id receives the created job's id ("" when none). */
int schedules_fire(struct server *s, json_t *schedule, const char *trigger, int64_t scheduled_for,
                   char *job_id, size_t cap, struct smelt_error *err);
/* Fires every schedule that is due (a firing missed while smeltd was down fires once). */
void schedules_tick(struct server *s);

/* ---- HTTP handlers (server/api_*.c) and the route table (server/routes.c) ---- */

extern const struct http_route SERVER_ROUTES[];
extern const int SERVER_N_ROUTES;
int server_auth(void *app, const char *key, struct http_identity *out);
/* Creates the first admin key when the store has none. */
int server_auth_bootstrap(struct server *s, struct smelt_error *err);

void api_healthz(void *app, struct http_request *req, struct http_response *res);
void api_metrics(void *app, struct http_request *req, struct http_response *res);
void api_openapi(void *app, struct http_request *req, struct http_response *res);
void api_static(void *app, struct http_request *req, struct http_response *res);

void api_files_create(void *app, struct http_request *req, struct http_response *res);
void api_files_list(void *app, struct http_request *req, struct http_response *res);
void api_files_get(void *app, struct http_request *req, struct http_response *res);
void api_files_delete(void *app, struct http_request *req, struct http_response *res);
void api_files_content(void *app, struct http_request *req, struct http_response *res);

void api_jobs_create(void *app, struct http_request *req, struct http_response *res);
void api_jobs_list(void *app, struct http_request *req, struct http_response *res);
void api_jobs_get(void *app, struct http_request *req, struct http_response *res);
void api_jobs_cancel(void *app, struct http_request *req, struct http_response *res);
void api_jobs_pause(void *app, struct http_request *req, struct http_response *res);
void api_jobs_resume(void *app, struct http_request *req, struct http_response *res);
void api_jobs_events(void *app, struct http_request *req, struct http_response *res);
void api_jobs_checkpoints(void *app, struct http_request *req, struct http_response *res);
void api_jobs_metrics(void *app, struct http_request *req, struct http_response *res);
void api_jobs_logs(void *app, struct http_request *req, struct http_response *res);

/* OpenAI's grader endpoints (api_graders.c): a grader read as a job reads it; one run on
 * a sample and an item. */
void api_graders_validate(void *app, struct http_request *req, struct http_response *res);
void api_graders_run(void *app, struct http_request *req, struct http_response *res);

void api_models_list(void *app, struct http_request *req, struct http_response *res);
void api_models_get(void *app, struct http_request *req, struct http_response *res);

void api_schedules_create(void *app, struct http_request *req, struct http_response *res);
void api_schedules_list(void *app, struct http_request *req, struct http_response *res);
void api_schedules_get(void *app, struct http_request *req, struct http_response *res);
void api_schedules_update(void *app, struct http_request *req, struct http_response *res);
void api_schedules_delete(void *app, struct http_request *req, struct http_response *res);
void api_schedules_trigger(void *app, struct http_request *req, struct http_response *res);
void api_schedules_runs(void *app, struct http_request *req, struct http_response *res);

void api_cluster(void *app, struct http_request *req, struct http_response *res);

/* /v1/cluster/agent_credentials (admin; api_agent_credentials.c) */
void api_agent_credentials_create(void *app, struct http_request *req, struct http_response *res);
void api_agent_credentials_list(void *app, struct http_request *req, struct http_response *res);
void api_agent_credentials_revoke(void *app, struct http_request *req, struct http_response *res);
void api_agent_credentials_rotate(void *app, struct http_request *req, struct http_response *res);

void api_keys_create(void *app, struct http_request *req, struct http_response *res);
void api_keys_list(void *app, struct http_request *req, struct http_response *res);
void api_keys_delete(void *app, struct http_request *req, struct http_response *res);

/* Resolves a job's `model` for project: a base model name under models_dir or a model a
 * job of the project produced. path receives its directory; kind "base", "full" or
 * "lora". SMELT_ENOTFOUND when it is neither. */
int models_resolve(struct server *s, struct store_conn *conn, const char *project,
                   const char *model, char *path, size_t cap, char *kind, size_t kind_cap,
                   struct smelt_error *err);

#endif
