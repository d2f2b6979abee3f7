/* /v1/fine_tuning/schedules: a cron expression (UTC) and a job template; the control
 * loop fires due schedules under their concurrency policy (allow, forbid, replace). A
 * firing missed while smeltd was down fires once when it starts, then the next time is
 * computed from now. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/cron.h"
#include "server/server_internal.h"

static json_t *schedule_object(json_t *row) {
    return json_pack("{s:O, s:s, s:O, s:O, s:O, s:O, s:b, s:O, s:O, s:O}", "id", json_object_get(row, "id"), "object",
                     "fine_tuning.schedule", "name", json_object_get(row, "name"), "cron",
                     json_object_get(row, "cron"), "job", json_object_get(row, "template"),
                     "concurrency_policy", json_object_get(row, "concurrency"), "suspended",
                     json_integer_value(json_object_get(row, "suspended")) != 0, "next_run_at",
                     json_object_get(row, "next_fire_at"), "last_run_at", json_object_get(row, "last_fire_at"),
                     "created_at", json_object_get(row, "created_at"));
}

static json_t *schedule_list_object(void *ctx, json_t *row) {
    (void)ctx;
    return schedule_object(row);
}

#define SCHEDULE_COLUMNS "id, project_id, name, cron, template AS template__json, concurrency, suspended, " \
                         "next_fire_at, last_fire_at, created_at"

static bool policy_ok(const char *p) {
    return strcmp(p, "allow") == 0 || strcmp(p, "forbid") == 0 || strcmp(p, "replace") == 0;
}

/* Validates the fields present in body; for create, cron and job are required. */
static int read_fields(struct server *s, struct http_request *req, struct http_response *res, json_t *body,
                       bool create, struct cron_expr *expr) {
    static const char *const keys[] = {"name", "cron", "job", "concurrency_policy", "suspended", NULL};
    const char *key = json_unknown_key(body, keys);
    if (key) {
        http_reply_error(res, 400, key, "unknown_parameter", "%s: unknown parameter", key);
        return -1;
    }
    json_t *v = json_object_get(body, "name");
    if (v && !json_is_null(v) && (!json_is_string(v) || json_string_length(v) > 200)) {
        http_reply_error(res, 400, "name", "invalid_value", "name: a string of at most 200 characters");
        return -1;
    }
    v = json_object_get(body, "cron");
    if (create || v) {
        if (!json_is_string(v)) {
            http_reply_error(res, 400, "cron", "invalid_value", "cron: a cron expression (5 fields, UTC) is required");
            return -1;
        }
        struct smelt_error err = {0};
        if (cron_parse(json_string_value(v), expr, &err) != 0) {
            http_reply_error(res, 400, "cron", "invalid_value", "%s", err.message);
            return -1;
        }
        if (cron_next(expr, server_now()) < 0) {
            http_reply_error(res, 400, "cron", "invalid_value", "cron: the expression never fires within 5 years");
            return -1;
        }
    }
    v = json_object_get(body, "job");
    if (create || v) {
        if (!json_is_object(v)) {
            http_reply_error(res, 400, "job", "invalid_value", "job: a fine-tuning job create request is required");
            return -1;
        }
        if (jobs_validate(s, req->identity.project, v, res) != 0) {
            /* name the template in the error's param */
            json_t *e = res->body ? json_loadb(res->body, res->body_len, 0, NULL) : NULL;
            const char *param = json_string_value(json_object_get(json_object_get(e, "error"), "param"));
            const char *message = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
            char p[160], m[700];
            snprintf(p, sizeof p, "job%s%s", param ? "." : "", param ? param : "");
            snprintf(m, sizeof m, "job: %s", message ? message : "invalid");
            int status = res->status;
            free(res->body);
            res->body = NULL;
            res->body_len = 0;
            http_reply_error(res, status, p, "invalid_value", "%s", m);
            json_decref(e);
            return -1;
        }
    }
    v = json_object_get(body, "concurrency_policy");
    if (v && (!json_is_string(v) || !policy_ok(json_string_value(v)))) {
        http_reply_error(res, 400, "concurrency_policy", "invalid_value",
                         "concurrency_policy: one of allow, forbid, replace");
        return -1;
    }
    v = json_object_get(body, "suspended");
    if (v && !json_is_boolean(v)) {
        http_reply_error(res, 400, "suspended", "invalid_value", "suspended: true or false");
        return -1;
    }
    return 0;
}

void api_schedules_create(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    struct cron_expr expr;
    if (read_fields(s, req, res, body, true, &expr) != 0) {
        json_decref(body);
        return;
    }
    char id[HTTP_ID_BYTES];
    server_new_id("ftsched-", id, sizeof id);
    const char *policy = json_string_value(json_object_get(body, "concurrency_policy"));
    bool suspended = json_is_true(json_object_get(body, "suspended"));
    int64_t now = server_now();
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(body);
        return;
    }
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_exec(conn, &err, "INSERT INTO schedules (id, project_id, name, cron, template, concurrency, "
                        "suspended, next_fire_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", "ssssjsiii", id,
                        req->identity.project, json_string_value(json_object_get(body, "name")),
                        json_string_value(json_object_get(body, "cron")), json_object_get(body, "job"),
                        policy ? policy : "allow", (int64_t)suspended, cron_next(&expr, now), now);
    if (rc >= 0)
        rc = store_query_one(conn, &row, &err, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE id = ?", "s", id);
    store_release(s->store, conn);
    json_decref(body);
    if (rc < 0) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    http_reply_json(res, 200, schedule_object(row));
    json_decref(row);
}

static json_t *schedule_row(struct server *s, struct http_request *req, struct http_response *res) {
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return NULL;
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, &err, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE id = ? AND "
                             "project_id = ? AND deleted = 0", "ss", req->params[0], req->identity.project);
    store_release(s->store, conn);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, "schedule_id", "not_found", "No such schedule: %s", req->params[0]);
        return NULL;
    }
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return NULL;
    }
    return row;
}

void api_schedules_get(void *app, struct http_request *req, struct http_response *res) {
    json_t *row = schedule_row(app, req, res);
    if (!row) return;
    http_reply_json(res, 200, schedule_object(row));
    json_decref(row);
}

void api_schedules_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 100, 1000, &limit, &after) != 0) return;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE project_id = ? AND "
                         "deleted = 0 AND (? IS NULL OR rowid > (SELECT rowid FROM schedules WHERE id = ?)) "
                         "ORDER BY rowid LIMIT ?", "sssi", req->identity.project, after, after, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    server_reply_list(res, rows, limit, schedule_list_object, NULL, false);
}

void api_schedules_update(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = schedule_row(s, req, res);
    if (!row) return;
    json_t *body = server_body_object(req, res);
    if (!body) {
        json_decref(row);
        return;
    }
    struct cron_expr expr;
    if (read_fields(s, req, res, body, false, &expr) != 0) {
        json_decref(body);
        json_decref(row);
        return;
    }
    json_t *cron = json_object_get(body, "cron");
    const char *cron_text = cron ? json_string_value(cron) : json_string_value(json_object_get(row, "cron"));
    struct smelt_error err = {0};
    if (!cron && cron_parse(cron_text, &expr, &err) != 0) {
        json_decref(body);
        json_decref(row);
        server_reply_failure(res, &err, "cron");
        return;
    }
    json_t *name = json_object_get(body, "name");
    json_t *job = json_object_get(body, "job");
    const char *policy = json_string_value(json_object_get(body, "concurrency_policy"));
    json_t *susp = json_object_get(body, "suspended");
    int64_t suspended = susp ? json_is_true(susp) : json_integer_value(json_object_get(row, "suspended"));
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(body);
        json_decref(row);
        return;
    }
    int rc = store_exec(conn, &err, "UPDATE schedules SET name = coalesce(?, name), cron = ?, template = "
                        "coalesce(?, template), concurrency = coalesce(?, concurrency), suspended = ?, next_fire_at = ? "
                        "WHERE id = ?", "ssjsiis", name ? json_string_value(name) : NULL, cron_text, job, policy,
                        suspended, cron_next(&expr, server_now()), req->params[0]);
    store_release(s->store, conn);
    json_decref(body);
    json_decref(row);
    if (rc < 0) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    api_schedules_get(app, req, res);
}

void api_schedules_delete(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = schedule_row(s, req, res);
    if (!row) return;
    json_decref(row);
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    int rc = store_exec(conn, &err, "UPDATE schedules SET deleted = 1 WHERE id = ?", "s", req->params[0]);
    store_release(s->store, conn);
    if (rc < 0) server_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s, s:s, s:b}", "id", req->params[0], "object",
                                             "fine_tuning.schedule", "deleted", 1));
}

static json_t *run_object(json_t *row) {
    return json_pack("{s:O, s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:O}", "id", json_object_get(row, "id"), "object",
                     "fine_tuning.schedule.run", "schedule_id", json_object_get(row, "schedule_id"), "scheduled_for",
                     json_object_get(row, "scheduled_for"), "fired_at", json_object_get(row, "fired_at"), "trigger",
                     json_object_get(row, "trigger"), "job_id", json_object_get(row, "job_id"), "outcome",
                     json_object_get(row, "outcome"), "message", json_object_get(row, "message"));
}

static json_t *run_list_object(void *ctx, json_t *row) {
    (void)ctx;
    return run_object(row);
}

int schedules_fire(struct server *s, json_t *schedule, const char *trigger, int64_t scheduled_for, char *job_id,
                   size_t cap, struct smelt_error *err) {
    job_id[0] = 0;
    const char *id = json_string_value(json_object_get(schedule, "id"));
    const char *project = json_string_value(json_object_get(schedule, "project_id"));
    const char *policy = json_string_value(json_object_get(schedule, "concurrency"));
    struct store_conn *conn = store_acquire(s->store, err);
    if (!conn) return err->code;
    json_t *active = NULL;
    int rc = store_query(conn, &active, err, "SELECT id FROM jobs WHERE schedule_id = ? AND status IN "
                         "('validating_files', 'queued', 'running', 'paused')", "s", id);
    if (rc) {
        store_release(s->store, conn);
        return rc;
    }
    const char *outcome = "created";
    char message[700] = "";
    if (json_array_size(active) > 0 && strcmp(policy, "forbid") == 0) {
        outcome = "skipped";
        snprintf(message, sizeof message, "job %s of this schedule has not ended (concurrency_policy forbid)",
                 json_string_value(json_object_get(json_array_get(active, 0), "id")));
    } else if (json_array_size(active) > 0 && strcmp(policy, "replace") == 0) {
        size_t i;
        json_t *a;
        json_array_foreach(active, i, a) {
            const char *jid = json_string_value(json_object_get(a, "id"));
            store_exec(conn, err, "UPDATE jobs SET status = 'cancelled', desired = 'cancel', finished_at = ? "
                       "WHERE id = ?", "is", server_now(), jid);
            jobs_event(s, conn, jid, "info", "message", NULL, err, "Job cancelled: schedule %s replaced it", id);
        }
        error_clear(err);
    }
    json_decref(active);
    store_release(s->store, conn);
    if (strcmp(outcome, "created") == 0) {
        struct http_response res = {0};
        json_t *job = NULL;
        if (jobs_create(s, project, json_object_get(schedule, "template"), NULL, id, &job, &res) == 0) {
            snprintf(job_id, cap, "%s", json_string_value(json_object_get(job, "id")));
            atomic_fetch_add(&s->schedule_fires_total, 1);
        } else {
            outcome = "failed";
            json_t *e = res.body ? json_loadb(res.body, res.body_len, 0, NULL) : NULL;
            snprintf(message, sizeof message, "%s",
                     json_string_value(json_object_get(json_object_get(e, "error"), "message")) ?: "job not created");
            json_decref(e);
        }
        json_decref(job);
        free(res.body);
    }
    conn = store_acquire(s->store, err);
    if (!conn) return err->code;
    rc = store_exec(conn, err, "INSERT INTO schedule_runs (schedule_id, scheduled_for, fired_at, trigger, job_id, "
                    "outcome, message) VALUES (?, ?, ?, ?, ?, ?, ?)", "siissss", id, scheduled_for, server_now(),
                    trigger, job_id[0] ? job_id : NULL, outcome, message[0] ? message : NULL);
    store_release(s->store, conn);
    log_info("schedule %s fired (%s): %s%s%s", id, trigger, outcome, job_id[0] ? " " : "", job_id);
    return rc < 0 ? rc : 0;
}

void schedules_tick(struct server *s) {
    struct smelt_error err = {0};
    struct store_conn *conn = store_acquire(s->store, &err);
    if (!conn) return;
    int64_t now = server_now();
    json_t *due = NULL;
    int rc = store_query(conn, &due, &err, "SELECT " SCHEDULE_COLUMNS " FROM schedules WHERE deleted = 0 AND "
                         "suspended = 0 AND next_fire_at IS NOT NULL AND next_fire_at <= ?", "i", now);
    if (rc == 0) {
        size_t i;
        json_t *row;
        json_array_foreach(due, i, row) {
            struct cron_expr expr;
            int64_t next = -1;
            if (cron_parse(json_string_value(json_object_get(row, "cron")), &expr, &err) == 0)
                next = cron_next(&expr, now);
            /* Move the schedule on first, so a crash while firing never fires it twice. */
            store_exec(conn, &err, "UPDATE schedules SET next_fire_at = ?, last_fire_at = ? WHERE id = ?", "iis",
                       next, now, json_string_value(json_object_get(row, "id")));
            store_release(s->store, conn);
            char job_id[HTTP_ID_BYTES];
            if (schedules_fire(s, row, "cron", json_integer_value(json_object_get(row, "next_fire_at")), job_id,
                               sizeof job_id, &err) != 0)
                log_error("schedule: %s", err.message);
            conn = store_acquire(s->store, &err);
            if (!conn) break;
        }
        json_decref(due);
    }
    if (conn) store_release(s->store, conn);
}

void api_schedules_trigger(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = schedule_row(s, req, res);
    if (!row) return;
    struct smelt_error err = {0};
    char job_id[HTTP_ID_BYTES];
    int rc = schedules_fire(s, row, "manual", server_now(), job_id, sizeof job_id, &err);
    json_decref(row);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    json_t *run = NULL;
    rc = store_query_one(conn, &run, &err, "SELECT * FROM schedule_runs WHERE schedule_id = ? ORDER BY id DESC "
                         "LIMIT 1", "s", req->params[0]);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    http_reply_json(res, 200, run_object(run));
    json_decref(run);
}

void api_schedules_runs(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = schedule_row(s, req, res);
    if (!row) return;
    json_decref(row);
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 20, 1000, &limit, &after) != 0) return;
    int64_t before = INT64_MAX;
    if (after) {
        before = server_parse_row_number(after);
        if (before < 0) {
            http_reply_error(res, 400, "after", "invalid_value",
                             "after: a run id (an integer of 0 or more) is expected");
            return;
        }
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err, "SELECT * FROM schedule_runs WHERE schedule_id = ? AND id < ? "
                         "ORDER BY id DESC LIMIT ?", "sii", req->params[0], before, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    server_reply_list(res, rows, limit, run_list_object, NULL, false);
}
