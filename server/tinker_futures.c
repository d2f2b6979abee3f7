/* Tinker futures in the store (tinker_futures): one per request, pending until the
 * worker's tinker.result arrives; then its SDK result object (status done) or its error
 * {"error": message, "category": "user"|"server"} (status failed), which is exactly the
 * failure shape retrieve_future answers. */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

int tinker_future_create(struct store_conn *c, const char *project, const char *model_id, const char *job_id,
                         const char *op, char *id_out, size_t cap, struct smelt_error *err) {
    server_new_id("fut-", id_out, cap);
    int rc = store_exec(c, err,
                        "INSERT INTO tinker_futures (id, project_id, model_id, job_id, op, status, created_at) "
                        "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                        "sssssi", id_out, project, model_id, job_id, op, server_now());
    return rc < 0 ? rc : 0;
}

/* The failure object the SDK raises as RequestFailedError(message, category). */
static json_t *failure_object(const char *message, const char *field, const char *category) {
    json_t *e = json_pack("{s:s, s:s}", "error", message, "category", category);
    if (e && field && field[0]) json_object_set_new(e, "param", json_string(field));
    return e;
}

static int finish(struct store_conn *c, const char *id, const char *status, json_t *result, json_t *error,
                  struct smelt_error *err) {
    int rc = store_exec(c, err,
                        "UPDATE tinker_futures SET status = ?, result = ?, error = ?, finished_at = ? "
                        "WHERE id = ? AND status = 'pending'",
                        "sjjis", status, result, error, server_now(), id);
    if (rc == 0) return error_set(err, SMELT_ENOTFOUND, "no pending future %s", id);
    return rc < 0 ? rc : 0;
}

/* A worker's {ok:false, error:{message, field?, category}}: the message names the field. */
static json_t *worker_failure(const json_t *e) {
    const char *message = json_string_value(json_object_get(e, "message"));
    const char *field = json_string_value(json_object_get(e, "field"));
    const char *category = json_string_value(json_object_get(e, "category"));
    if (!category || (strcmp(category, "user") && strcmp(category, "server"))) category = "server";
    return failure_object(message ? message : "the worker failed without a message", field, category);
}

/* A finished save's checkpoint (TINKER_FUTURE_CHECKPOINT) listed: its tinker_checkpoints row and, for a sampler
 * checkpoint (a PEFT adapter), its models row, so /v1/models lists it and a job can use it as its model. */
static int checkpoint_insert(struct store_conn *c, const json_t *future, const char *tpath, const json_t *ck,
                             struct smelt_error *err) {
    const char *project = json_string_value(json_object_get(future, "project_id"));
    const char *model_id = json_string_value(json_object_get(future, "model_id"));
    const char *kind = json_string_value(json_object_get(ck, "kind"));
    const char *name = json_string_value(json_object_get(ck, "name"));
    const char *dir = json_string_value(json_object_get(ck, "dir"));
    if (!project || !model_id || !tpath || !kind || !name || !dir)
        return error_set_field(err, SMELT_EFORMAT, TINKER_FUTURE_CHECKPOINT, "a save's future lacks its checkpoint");
    int rc = store_exec(c, err, "INSERT OR REPLACE INTO tinker_checkpoints (id, project_id, model_id, kind, name, "
                        "path, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)", "ssssssi", tpath, project, model_id, kind,
                        name, dir, server_now());
    if (rc < 0 || strcmp(kind, "sampler") != 0) return rc < 0 ? rc : 0;
    char id[HTTP_ID_BYTES * 2];
    snprintf(id, sizeof id, "ft:tinker:%s:%s", model_id, name);
    rc = store_exec(c, err, "INSERT OR REPLACE INTO models (id, project_id, job_id, path, kind, base_model, "
                    "created_at) VALUES (?, ?, ?, ?, 'lora', ?, ?)", "sssssi", id, project,
                    json_string_value(json_object_get(future, "job_id")), dir,
                    json_string_value(json_object_get(ck, "base_model")), server_now());
    return rc < 0 ? rc : 0;
}

/* Stores the done result; a save's checkpoint, taken off out, is listed with it. */
static int finish_done(struct store_conn *c, const char *id, const json_t *future, json_t *out,
                       struct smelt_error *err) {
    json_t *ck = json_incref(json_object_get(out, TINKER_FUTURE_CHECKPOINT));
    json_object_del(out, TINKER_FUTURE_CHECKPOINT);
    int rc = finish(c, id, "done", out, NULL, err);
    if (!rc && ck) rc = checkpoint_insert(c, future, json_string_value(json_object_get(out, "path")), ck, err);
    json_decref(ck);
    return rc;
}

int tinker_future_complete(struct server *s, struct store_conn *c, const struct msg *result,
                           struct smelt_error *err) {
    (void)s;
    const char *id = json_string_value(json_object_get(result->header, "id"));
    if (!id) return error_set_field(err, SMELT_EFORMAT, "id", "tinker.result without an id");
    json_t *row = NULL;
    TRY(store_query_one(c, &row, err, "SELECT op, project_id, model_id, job_id, result AS result__json FROM "
                        "tinker_futures WHERE id = ? AND status = 'pending'", "s", id));
    const char *op = json_string_value(json_object_get(row, "op"));
    json_t *out = NULL, *failure = NULL;
    int rc = 0;
    if (!json_is_true(json_object_get(result->header, "ok"))) {
        failure = worker_failure(json_object_get(result->header, "error"));
    } else {
        struct smelt_error cerr = {0};
        if (tinker_result_object(op, json_object_get(row, "result"), result, &out, &cerr) != 0)
            failure = failure_object(cerr.message, cerr.field, "server");
    }
    if (!out && !failure) rc = error_set(err, SMELT_ENOMEM, "out of memory storing a result");
    else rc = out ? finish_done(c, id, row, out, err) : finish(c, id, "failed", NULL, failure, err);
    json_decref(out);
    json_decref(failure);
    json_decref(row);
    return rc;
}

int tinker_future_fail(struct server *s, struct store_conn *c, const char *future_id, const char *job_id,
                       const char *message, struct smelt_error *err) {
    json_t *failure = failure_object(message, NULL, "server");
    if (!failure) return error_set(err, SMELT_ENOMEM, "out of memory failing future %s", future_id);
    int rc = finish(c, future_id, "failed", NULL, failure, err);
    json_decref(failure);
    if (rc || !job_id) return rc;
    return jobs_event(s, c, job_id, "warn", "message", NULL, err, "Request %.40s failed: %.900s", future_id,
                      message);
}

int tinker_future_cancel(struct store_conn *c, const char *future_id, struct smelt_error *err) {
    json_t *failure = failure_object("cancelled (cancel_future) before it reached the session worker", NULL, "user");
    if (!failure) return error_set(err, SMELT_ENOMEM, "out of memory cancelling future %s", future_id);
    int rc = finish(c, future_id, "failed", NULL, failure, err);
    json_decref(failure);
    return rc;
}

void tinker_futures_wake(struct server *s, const char *future_id) {
    struct http_server *http = atomic_load(&s->http);
    if (http) http_deferred_wake(http, future_id);
}

void tinker_futures_wake_failed(struct server *s) {
    if (atomic_exchange(&s->tinker_futures_failed, false)) tinker_futures_wake(s, NULL);
}

int tinker_futures_fail_job(struct server *s, struct store_conn *c, const char *job_id, const char *message,
                            struct smelt_error *err) {
    json_t *failure = failure_object(message, NULL, "server");
    if (!failure) return error_set(err, SMELT_ENOMEM, "out of memory failing futures");
    int rc = store_exec(c, err,
                        "UPDATE tinker_futures SET status = 'failed', error = ?, finished_at = ? "
                        "WHERE job_id = ? AND status = 'pending'",
                        "jis", failure, server_now(), job_id);
    json_decref(failure);
    if (rc < 0) return rc;
    if (rc > 0) atomic_store(&s->tinker_futures_failed, true);
    tinker_api_forget_job(s, c, job_id);
    rc = store_exec(c, err, "UPDATE tinker_models SET status = 'lost' WHERE job_id = ? AND status = 'live'", "s",
                    job_id);
    return rc < 0 ? rc : 0;
}
