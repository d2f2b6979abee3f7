/* Tinker session jobs: one jobs row (method {"type": "tinker"}) per project and base
 * model, placed by the scheduler like any job (one device or CPU slot); its worker,
 * smelt-tinker, holds the base model and every LoRA model made on it in memory. So a
 * session job is never retried: when its worker ends, its pending futures fail and its
 * models are lost (their saved checkpoints stay). Idle ones are released through the
 * control loop's stop path, and a restart of smeltd ends the ones it finds. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_internal.h"

#define TINKER_DEFAULT_IDLE_SECONDS 600
/* A session worker that has not said tinker.hello this long after its job started running
 * (it crashed before connecting, or hangs loading its base model) is taken as dead: the
 * futures waiting for it fail and the job fails. Loading a large base takes minutes at
 * most; docs/tinker.md. */
#define TINKER_HELLO_DEADLINE_S 600
#define TINKER_METHOD "{\"type\":\"tinker\"}"

/* Find-or-create is one critical section, so two requests for the same base made at once
 * share one job (callers run it outside a transaction or inside a store_begin one). */
static pthread_mutex_t session_job_lock = PTHREAD_MUTEX_INITIALIZER;

static void logged(const char *what, int rc, const struct smelt_error *err) {
    if (rc < 0) log_error("tinker: %s: %s", what, err->message);
}

bool tinker_job_is_session(const json_t *job_row) {
    json_t *method = json_loads(json_string_value(json_object_get(job_row, "method")) ?: "", 0, NULL);
    const char *type = json_string_value(json_object_get(method, "type"));
    bool yes = type && strcmp(type, "tinker") == 0;
    json_decref(method);
    return yes;
}

static int insert_session_job(struct server *s, struct store_conn *c, const char *project, const char *base_name,
                              const char *base_dir, const char *id, struct smelt_error *err) {
    json_t *spec = json_pack("{s:s, s:s, s:s}", "type", "tinker", "model", base_dir, "model_name", base_name);
    json_t *request = json_pack("{s:s, s:{s:s}}", "model", base_name, "method", "type", "tinker");
    int64_t now = server_now();
    int rc = spec && request ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
    if (rc == 0)
        rc = store_exec(c, err, "INSERT INTO jobs (id, project_id, created_at, status, request, spec, model, method, "
                        "training_file, seed, priority, devices_wanted, max_retries, queued_at) VALUES "
                        "(?, ?, ?, 'queued', ?, ?, ?, ?, '', 0, 0, 1, 0, ?)", "ssijjssi", id, project, now, request,
                        spec, base_name, TINKER_METHOD, now);
    json_decref(spec);
    json_decref(request);
    if (rc < 0) return rc;
    return jobs_event(s, c, id, "info", "message", NULL, err, "Tinker session job queued for base model %.200s",
                      base_name);
}

int tinker_session_job(struct server *s, struct store_conn *c, const char *project, const char *base_name,
                       const char *base_dir, char *job_id, size_t cap, struct smelt_error *err) {
    if (!project || !base_name || !base_dir || cap < HTTP_ID_BYTES)
        return error_set(err, SMELT_EINVAL, "tinker_session_job: bad arguments");
    pthread_mutex_lock(&session_job_lock);
    json_t *row = NULL;
    /* A job being released (desired 'release') takes no new work: its models are gone. */
    int rc = store_query_one(c, &row, err, "SELECT id FROM jobs WHERE project_id = ? AND status IN ('queued', "
                             "'running') AND desired = 'run' AND json_extract(method, '$.type') = 'tinker' AND "
                             "json_extract(spec, '$.model') = ? ORDER BY seq LIMIT 1", "ss", project, base_dir);
    if (rc == 0) snprintf(job_id, cap, "%s", json_string_value(json_object_get(row, "id")));
    json_decref(row);
    if (rc == SMELT_ENOTFOUND) {
        error_clear(err);
        server_new_id("ftjob-", job_id, cap);
        rc = insert_session_job(s, c, project, base_name, base_dir, job_id, err);
        if (rc == 0) atomic_store(&s->kick, 1);
    }
    pthread_mutex_unlock(&session_job_lock);
    return rc < 0 ? rc : 0;
}

json_t *tinker_worker_argv(struct server *s, const json_t *job_row, int64_t attempt, const char *device_kind,
                           const char *metrics_path) {
    json_t *spec = json_loads(json_string_value(json_object_get(job_row, "spec")) ?: "", 0, NULL);
    const char *model = json_string_value(json_object_get(spec, "model"));
    char attempt_text[24];
    snprintf(attempt_text, sizeof attempt_text, "%lld", (long long)attempt);
    json_t *argv = model ? json_pack("[s, s, s, s, s, s, s, s, s, s, s, s, s]", s->tinker_path, "--model", model,
                                     "--server", s->tinker_endpoint, "--job",
                                     json_string_value(json_object_get(job_row, "id")), "--attempt", attempt_text,
                                     "--metrics", metrics_path, "--backend",
                                     device_kind && strcmp(device_kind, "cuda") == 0 ? "cuda" : "cpu")
                         : NULL;
    json_decref(spec);
    return argv;
}

/* ---- the worker's end ---- */

static void end_succeeded(struct server *s, struct store_conn *c, const char *id) {
    struct smelt_error err = {0};
    logged("job succeeded", store_exec(c, &err, "UPDATE jobs SET status = 'succeeded', finished_at = ? WHERE id = ?",
                                       "is", server_now(), id), &err);
    logged("event", jobs_event(s, c, id, "info", "message", NULL, &err, "%s",
                               "Session released: its worker stopped; saved checkpoints stay"), &err);
}

void tinker_job_worker_gone(struct server *s, struct store_conn *c, const json_t *job_row, int exit_code,
                            const char *how) {
    const char *id = json_string_value(json_object_get(job_row, "id"));
    const char *status = json_string_value(json_object_get(job_row, "status"));
    const char *desired = json_string_value(json_object_get(job_row, "desired"));
    struct smelt_error err = {0};
    tinker_dispatch_forget(s, id);
    char message[1024];
    snprintf(message, sizeof message, "the Tinker session worker %.900s", how);
    logged("futures", tinker_futures_fail_job(s, c, id, message, &err), &err);
    if (strcmp(status, "running") != 0) {
        logged("event", jobs_event(s, c, id, "info", "message", NULL, &err, "Session worker %.900s; its device is "
                                   "free", how), &err);
        return;
    }
    if (exit_code == 0 && desired && strcmp(desired, "release") == 0) end_succeeded(s, c, id);
    else control_job_fail(s, c, id, "worker_failed", message);
}

/* ---- metrics lines ---- */

static void optim_step_event(struct server *s, struct store_conn *c, const char *id, const json_t *line) {
    json_t *data = json_pack("{s:O?, s:O?, s:O?, s:O?}", "model_id", json_object_get(line, "model_id"), "step",
                             json_object_get(line, "step"), "metrics", json_object_get(line, "metrics"), "ms",
                             json_object_get(line, "ms"));
    struct smelt_error err = {0};
    logged("event", jobs_event(s, c, id, "info", "metrics", data, &err, "Model %.100s: optimizer step %lld",
                               json_string_value(json_object_get(line, "model_id")) ?: "?",
                               (long long)json_integer_value(json_object_get(line, "step"))), &err);
    json_decref(data);
}

/* A session job has one attempt, so the byte offset of its lines (jobs.event_offset: the
 * last one recorded) tells a line read again from one not yet seen; the (type, step)
 * rule of trainers cannot: several models and calls share a step. */
void tinker_job_metrics_line(struct server *s, struct store_conn *c, const json_t *job_row, const json_t *event) {
    const char *id = json_string_value(json_object_get(job_row, "id"));
    json_t *line = json_object_get(event, "line"), *offset = json_object_get(event, "offset");
    json_t *step = json_object_get(line, "step");
    if (!json_is_integer(offset) || !json_is_integer(step) ||
        json_integer_value(offset) <= json_integer_value(json_object_get(job_row, "event_offset")))
        return;
    struct smelt_error err = {0};
    logged("offset", store_exec(c, &err, "UPDATE jobs SET event_offset = ? WHERE id = ?", "is",
                                (int64_t)json_integer_value(offset), id), &err);
    logged("metrics row", store_exec(c, &err, "INSERT INTO metrics (job_id, attempt, step, type, data) VALUES "
                                     "(?, ?, ?, 'tinker', ?)", "siij", id,
                                     (int64_t)json_integer_value(json_object_get(event, "attempt")),
                                     (int64_t)json_integer_value(step), line), &err);
    const char *op = json_string_value(json_object_get(line, "op"));
    if (op && strcmp(op, "optim_step") == 0) optim_step_event(s, c, id, line);
}

/* ---- the control tick ---- */

static int64_t idle_seconds(const struct server *s) {
    return s->config.tinker_idle_seconds > 0 ? s->config.tinker_idle_seconds : TINKER_DEFAULT_IDLE_SECONDS;
}

/* Running session jobs with no pending future, none made in the idle window, and whose
 * models' and samplers' sessions all were silent that long (a job just placed gets the
 * window too). */
static json_t *idle_jobs(struct store_conn *c, int64_t cutoff) {
    struct smelt_error err = {0};
    json_t *rows = NULL;
    if (store_query(c, &rows, &err, "SELECT j.id FROM jobs j WHERE j.status = 'running' AND j.desired = 'run' AND "
                    "j.devices IS NOT NULL AND json_extract(j.method, '$.type') = 'tinker' AND j.run_started_at < ? "
                    "AND NOT EXISTS (SELECT 1 FROM tinker_futures f WHERE f.job_id = j.id AND (f.status = 'pending' "
                    "OR f.created_at >= ?)) "
                    "AND NOT EXISTS (SELECT 1 FROM tinker_models m JOIN tinker_sessions t ON t.id = m.session_id "
                    "WHERE m.job_id = j.id AND m.status = 'live' AND t.last_seen >= ?) "
                    "AND NOT EXISTS (SELECT 1 FROM tinker_samplers p JOIN tinker_sessions t ON t.id = p.session_id "
                    "WHERE p.job_id = j.id AND t.last_seen >= ?)", "iiii", cutoff, cutoff, cutoff, cutoff) != 0) {
        log_error("tinker: idle session jobs: %s", err.message);
        return NULL;
    }
    return rows;
}

static void release(struct server *s, struct store_conn *c, const char *id, int64_t idle) {
    struct smelt_error err = {0};
    logged("release", store_exec(c, &err, "UPDATE jobs SET desired = 'release' WHERE id = ?", "s", id), &err);
    logged("models released", store_exec(c, &err, "UPDATE tinker_models SET status = 'released' WHERE job_id = ? "
                                         "AND status = 'live'", "s", id), &err);
    logged("event", jobs_event(s, c, id, "info", "message", NULL, &err, "Releasing the session job: no session of its "
                               "models was heard from for %lld s (--tinker-idle-seconds) and no request is pending; "
                               "its models are released, their saved checkpoints stay", (long long)idle), &err);
}

/* Pending futures of session jobs that ended without a worker to fail them (cancelled
 * while queued, or a request that raced the end). */
static void fail_orphans(struct server *s, struct store_conn *c) {
    struct smelt_error err = {0};
    json_t *rows = NULL;
    if (store_query(c, &rows, &err, "SELECT DISTINCT f.job_id, j.status FROM tinker_futures f JOIN jobs j ON j.id = "
                    "f.job_id WHERE f.status = 'pending' AND j.status IN ('succeeded', 'failed', 'cancelled')", "")
        != 0) {
        log_error("tinker: futures of ended jobs: %s", err.message);
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        char message[160];
        snprintf(message, sizeof message, "the Tinker session job %.40s has %.20s",
                 json_string_value(json_object_get(row, "job_id")),
                 strcmp(json_string_value(json_object_get(row, "status")), "cancelled") == 0 ? "been cancelled"
                                                                                              : "ended");
        logged("futures", tinker_futures_fail_job(s, c, json_string_value(json_object_get(row, "job_id")), message,
                                                  &err), &err);
    }
    json_decref(rows);
}

/* A released job whose stop the agent never confirmed (send_stops freed its device after
 * the grace) has no worker left to report: it ends here. */
static void end_unconfirmed_releases(struct server *s, struct store_conn *c) {
    struct smelt_error err = {0};
    json_t *rows = NULL;
    if (store_query(c, &rows, &err, "SELECT id FROM jobs WHERE status = 'running' AND desired = 'release' AND "
                    "devices IS NULL AND json_extract(method, '$.type') = 'tinker'", "") != 0)
        return;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *id = json_string_value(json_object_get(row, "id"));
        tinker_dispatch_forget(s, id);
        logged("futures", tinker_futures_fail_job(s, c, id, "the Tinker session was released", &err), &err);
        end_succeeded(s, c, id);
    }
    json_decref(rows);
}

/* Running session jobs whose worker said no hello within TINKER_HELLO_DEADLINE_S of the
 * run's start. Only with a dispatcher: it is what hears hellos. */
static void fail_silent_workers(struct server *s, struct store_conn *c) {
    if (!s->tinker) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    if (store_query(c, &rows, &err, "SELECT id, attempt FROM jobs WHERE status = 'running' AND desired = 'run' AND "
                    "devices IS NOT NULL AND json_extract(method, '$.type') = 'tinker' AND run_started_at < ?", "i",
                    server_now() - TINKER_HELLO_DEADLINE_S) != 0) {
        log_error("tinker: session jobs waiting for their worker: %s", err.message);
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *id = json_string_value(json_object_get(row, "id"));
        if (tinker_dispatch_said_hello(s, id, json_integer_value(json_object_get(row, "attempt")))) continue;
        char message[256];
        snprintf(message, sizeof message, "the Tinker session worker did not connect (no tinker.hello) within %d s "
                 "of its start", TINKER_HELLO_DEADLINE_S);
        tinker_dispatch_forget(s, id);
        logged("futures", tinker_futures_fail_job(s, c, id, message, &err), &err);
        control_job_fail(s, c, id, "worker_failed", message);
    }
    json_decref(rows);
}

void tinker_jobs_tick(struct server *s, struct store_conn *c) {
    end_unconfirmed_releases(s, c);
    fail_silent_workers(s, c);
    int64_t idle = idle_seconds(s);
    json_t *rows = idle_jobs(c, server_now() - idle);
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) release(s, c, json_string_value(json_object_get(row, "id")), idle);
    json_decref(rows);
    fail_orphans(s, c);
}

/* ---- restart ---- */

static int end_left_over(struct server *s, struct store_conn *c, const char *id, struct smelt_error *err) {
    static const char message[] = "smeltd restarted; the session's models lived in its worker's memory (load the "
                                  "last save_weights into a new training client)";
    json_t *error = json_pack("{s:s, s:s, s:n}", "code", "server_restarted", "message", message, "param");
    int rc = error ? store_exec(c, err, "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? WHERE id = ?",
                                "ijs", server_now(), error, id)
                   : error_set(err, SMELT_ENOMEM, "out of memory");
    json_decref(error);
    if (rc >= 0) rc = tinker_futures_fail_job(s, c, id, "smeltd restarted", err);
    if (rc >= 0) rc = jobs_event(s, c, id, "error", "message", NULL, err, "Job failed: %s", message);
    return rc < 0 ? rc : 0;
}

int tinker_jobs_recover(struct server *s, struct smelt_error *err) {
    struct store_conn *c = store_acquire(s->store, err);
    if (!c) return err->code;
    json_t *rows = NULL;
    int rc = store_begin(c, err);
    if (rc == 0)
        rc = store_query(c, &rows, err, "SELECT id FROM jobs WHERE status IN ('queued', 'running', 'paused') AND "
                         "json_extract(method, '$.type') = 'tinker'", "");
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if (rc == 0) rc = end_left_over(s, c, json_string_value(json_object_get(row, "id")), err);
    }
    size_t n = json_array_size(rows);
    json_decref(rows);
    if (rc == 0) rc = store_commit(c, err);
    else store_rollback(c);
    if (rc == 0 && n) log_info("tinker: %zu session job(s) of the last run ended", n);
    store_release(s->store, c);
    return rc;
}
