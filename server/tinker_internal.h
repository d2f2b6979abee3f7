/* The Tinker API's parts inside smeltd (docs/tinker.md). */
#ifndef SMELT_SERVER_TINKER_INTERNAL_H
#define SMELT_SERVER_TINKER_INTERNAL_H

#include "server/server_internal.h"
#include "common/msg.h"
/* ---- S1: futures and results (server/tinker_futures.c) ---- */
/* A save's checkpoint rides in its future's partial result under this key until the worker answers:
 * {"kind": "training"|"sampler", "name", "dir", "base_model"} (the path is the result's "path"). The key is taken
 * off the SDK's result; the checkpoint is listed (tinker_checkpoints, and a sampler's models row) only when the save
 * succeeds, in the same transaction. */
#define TINKER_FUTURE_CHECKPOINT "smelt_checkpoint"
/* A new pending future of op for model_id (may be NULL) on session job job_id; id_out gets "fut-<24 hex>". */
int tinker_future_create(struct store_conn *c, const char *project, const char *model_id, const char *job_id,
                         const char *op, char *id_out, size_t cap, struct smelt_error *err);
/* The worker's tinker.result for a future: converted to the SDK's result object for the future's op and stored
 * (status done; a save's checkpoint rows inserted), or its error stored (status failed). Unknown or finished
 * futures: SMELT_ENOTFOUND, nothing changed. */
int tinker_future_complete(struct server *s, struct store_conn *c, const struct msg *result, struct smelt_error *err);
/* Fails pending future future_id with a server-category error (message says why: a result that could not be
 * stored, a request that could not be sent) and writes a warning event on job_id (may be NULL: none). The caller
 * wakes its polls (tinker_futures_wake) after its commit. SMELT_ENOTFOUND when it is not pending. */
int tinker_future_fail(struct server *s, struct store_conn *c, const char *future_id, const char *job_id,
                       const char *message, struct smelt_error *err);
/* Fails pending future future_id as cancelled by the client (category user; no event). SMELT_ENOTFOUND when it is
 * not pending. The caller took its request back first (tinker_order_cancel / tinker_dispatch_cancel). */
int tinker_future_cancel(struct store_conn *c, const char *future_id, struct smelt_error *err);
/* Fails every pending future of job_id with a server-category error (the worker is gone), marks the job's
 * live models "lost" and frees its models' order state (tinker_api_forget_job). Their polls are woken by tinker_futures_wake_failed after the caller's commit. */
int tinker_futures_fail_job(struct server *s, struct store_conn *c, const char *job_id, const char *message,
                            struct smelt_error *err);
/* Wakes retrieve_future's waiting polls of future_id (NULL: all of them); called after the commit that finished
 * it, so the woken poll reads the new row. */
void tinker_futures_wake(struct server *s, const char *future_id);
/* Wakes every waiting poll when tinker_futures_fail_job failed some futures since the last call (the control loop
 * calls it after each of its commits). */
void tinker_futures_wake_failed(struct server *s);
/* ---- S2: session jobs and dispatch (server/tinker_dispatch.c, server/tinker_jobs.c) ---- */
/* Binds the tinker ROUTER (s->config.tinker_bind, default "tcp://127.0.0.1:*"), records the endpoint workers
 * connect to in s->tinker_endpoint, starts the dispatch thread. */
int tinker_dispatch_start(struct server *s, struct smelt_error *err);
/* Stops (joins) the dispatch thread: later submits fail with SMELT_EIO. Called before the HTTP server stops, as the
 * thread wakes its long polls; tinker_dispatch_free (after HTTP: handlers still submit) frees what is left. */
void tinker_dispatch_stop(struct server *s);
void tinker_dispatch_free(struct server *s);
/* Queues a tinker.request for the worker of session job job_id: header is the request header without "v"/"id"
 * (the dispatcher adds id = future_id); arrays copied. Sent in submit order once the worker's hello arrived. */
int tinker_dispatch_submit(struct server *s, const char *job_id, const char *future_id, json_t *header,
                           const struct msg_array *arrays, int n_arrays, struct smelt_error *err);
/* Takes back future_id's request while it waits in job_id's queue (its worker has not said hello, or the socket
 * has not taken it): true; false once it was sent (or is unknown). */
bool tinker_dispatch_cancel(struct server *s, const char *job_id, const char *future_id);
/* The session job of project serving base model base_dir (its model name base_name): a running or queued one,
 * else a new queued jobs row (method "tinker") that the scheduler places like any job. job_id gets its id. */
int tinker_session_job(struct server *s, struct store_conn *c, const char *project, const char *base_name,
                       const char *base_dir, char *job_id, size_t cap, struct smelt_error *err);

#endif
