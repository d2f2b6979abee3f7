/* What the parts of smeltd share (private to server/). */
#ifndef SMELT_SERVER_INTERNAL_H
#define SMELT_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

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
    pthread_t agent_thread;
    bool agent_started;
    atomic_int agent_stop;                 /* set by control_stop, read by the agent thread */
    /* the Tinker dispatch thread (tinker_dispatch.c): its ROUTER, queues and thread */
    char tinker_endpoint[256];             /* where session workers connect (ZMQ_LAST_ENDPOINT) */
    struct tinker_dispatch *tinker;        /* NULL until tinker_dispatch_start */
    struct tinker_api *tinker_api;         /* the API handlers' state (api_tinker.c) */
    atomic_bool tinker_futures_failed;     /* futures failed in a control-loop transaction not
                                              yet woken (tinker_futures_wake_failed) */
};

/* ---- small helpers (server/util.c) ---- */

int64_t server_now(void);
/* prefix + 24 random hex characters ("ftjob-" -> "ftjob-3f9c..."). */
void server_new_id(const char *prefix, char *out, size_t cap);
/* An HTTP error response for a failed smelt call: 404 for SMELT_ENOTFOUND, 400 for
 * SMELT_EINVAL / SMELT_EFORMAT, 500 otherwise; param may be NULL. */
void server_reply_failure(struct http_response *res, const struct smelt_error *err,
                          const char *param);
/* Parses the request body as a JSON object; on failure replies 400 and returns NULL. */
json_t *server_body_object(const struct http_request *req, struct http_response *res);
/* Reads ?limit= (default def, 1..max) and ?after=; replies 400 and returns -1 when bad. */
int server_page_args(const struct http_request *req, struct http_response *res, int64_t def,
                     int64_t max, int64_t *limit, const char **after);
/* Replies a list page {"object": "list", "data", "has_more"} (plus first_id / last_id when
 * ids is set) from rows fetched with LIMIT limit + 1: the first limit rows, each made an
 * API object by fn(ctx, row). Takes rows. */
void server_reply_list(struct http_response *res, json_t *rows, int64_t limit,
                       json_t *(*fn)(void *ctx, json_t *row), void *ctx, bool ids);
/* A store connection or a 503 reply. */
struct store_conn *server_conn(struct server *s, struct http_response *res);

/* ---- jobs (server/jobs.c) ---- */

/* Creates a job from an OpenAI-style create request (already a JSON object) for
 * project; *job_out: the job object as the API returns it. On refusal replies through
 * res and returns non-zero. idempotency_key may be NULL. */
int jobs_create(struct server *s, const char *project, json_t *request,
                const char *idempotency_key, const char *schedule_id, json_t **job_out,
                struct http_response *res);
/* Checks a create request as jobs_create would, creating nothing (schedule templates). */
int jobs_validate(struct server *s, const char *project, json_t *request, struct http_response *res);
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
/* The head of the model a job of method.type `type` makes ("lm"; reward models will say
 * "reward"), or NULL for a type smelt does not run. */
const char *jobs_method_head(const char *type);

/* ---- the control loop (server/control.c): agents, scheduling, cron ---- */

int control_start(struct server *s, struct smelt_error *err);
void control_stop(struct server *s);
/* Ends job id as failed with error {code, message} and an event saying so. */
void control_job_fail(struct server *s, struct store_conn *c, const char *id, const char *code,
                      const char *message);

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
