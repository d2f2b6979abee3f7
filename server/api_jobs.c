/* /v1/fine_tuning/jobs: create, list, retrieve, cancel, pause, resume, events (list and
 * Server-Sent Events), checkpoints, metrics and logs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server_internal.h"

#define JOBS_LOG_TAIL_DEFAULT 65536
#define JOBS_LOG_TAIL_MAX (8 << 20)

void api_jobs_create(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    const char *key = http_header(req, "Idempotency-Key");
    if (key && (strlen(key) == 0 || strlen(key) > 255)) {
        json_decref(body);
        http_reply_error(res, 400, "Idempotency-Key", "invalid_value", "Idempotency-Key: 1 to 255 characters");
        return;
    }
    json_t *job = NULL;
    if (jobs_create(s, req->identity.project, body, key, NULL, &job, res) == 0)
        http_reply_json(res, 200, job);
    json_decref(body);
}

/* The job row of the caller's project, or a 404 reply. */
static json_t *job_row(struct server *s, struct http_request *req, struct http_response *res) {
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return NULL;
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, &err, "SELECT * FROM jobs WHERE id = ? AND project_id = ?", "ss",
                             req->params[0], req->identity.project);
    store_release(s->store, conn);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, "fine_tuning_job_id", "not_found", "No such fine-tuning job: %s",
                         req->params[0]);
        return NULL;
    }
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return NULL;
    }
    return row;
}

static void reply_job(struct server *s, struct http_request *req, struct http_response *res) {
    json_t *row = job_row(s, req, res);
    if (!row) return;
    http_reply_json(res, 200, jobs_object(s, row));
    json_decref(row);
}

void api_jobs_get(void *app, struct http_request *req, struct http_response *res) {
    reply_job(app, req, res);
}

static json_t *job_list_object(void *ctx, json_t *row) {
    return jobs_object(ctx, row);
}

static bool valid_status(const char *st) {
    static const char *const all[] = {"validating_files", "queued", "running", "succeeded", "failed",
                                      "cancelled", "paused", NULL};
    for (int i = 0; all[i]; i++)
        if (strcmp(st, all[i]) == 0) return true;
    return false;
}

void api_jobs_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 20, 1000, &limit, &after) != 0) return;
    const char *status = http_query(req, "status");
    if (status && !valid_status(status)) {
        http_reply_error(res, 400, "status", "invalid_value", "status: one of validating_files, queued, "
                         "running, succeeded, failed, cancelled, paused");
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err,
                         "SELECT * FROM jobs WHERE project_id = ? AND (? IS NULL OR status = ?) AND "
                         "(? IS NULL OR seq < (SELECT seq FROM jobs WHERE id = ?)) ORDER BY seq DESC LIMIT ?",
                         "sssssi", req->identity.project, status, status, after, after, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    server_reply_list(res, rows, limit, job_list_object, s, false);
}

/* A state change under one transaction: from the statuses allowed, to the new status
 * and desired action; 409 names the current status otherwise. */
static void change_state(struct server *s, struct http_request *req, struct http_response *res,
                         const char *action) {
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_begin(conn, &err);
    if (rc == 0)
        rc = store_query_one(conn, &row, &err, "SELECT * FROM jobs WHERE id = ? AND project_id = ?", "ss",
                             req->params[0], req->identity.project);
    if (rc == SMELT_ENOTFOUND) {
        store_rollback(conn);
        store_release(s->store, conn);
        http_reply_error(res, 404, "fine_tuning_job_id", "not_found", "No such fine-tuning job: %s",
                         req->params[0]);
        return;
    }
    if (rc) {
        store_rollback(conn);
        store_release(s->store, conn);
        server_reply_failure(res, &err, NULL);
        return;
    }
    char status[32];
    snprintf(status, sizeof status, "%s", json_string_value(json_object_get(row, "status")));
    const char *id = req->params[0];
    bool has_worker = !json_is_null(json_object_get(row, "devices"));
    int64_t now = server_now();
    const char *refusal = NULL;
    if (strcmp(action, "cancel") == 0) {
        if (jobs_status_final(status)) refusal = "it has already ended";
        else {
            rc = store_exec(conn, &err, "UPDATE jobs SET status = 'cancelled', desired = 'cancel', "
                            "finished_at = ? WHERE id = ?", "is", now, id);
            if (rc >= 0)
                rc = jobs_event(s, conn, id, "info", "message", NULL, &err, "%s",
                                has_worker ? "Job cancelled; stopping its worker" : "Job cancelled");
        }
    } else if (strcmp(action, "pause") == 0) {
        if (tinker_job_is_session(row))
            refusal = "a Tinker session job cannot be paused: its models live in its worker's memory (cancel it, "
                      "or let it be released when idle)";
        else if (strcmp(status, "running") != 0 && strcmp(status, "queued") != 0)
            refusal = "only a queued or running job can be paused";
        else {
            rc = store_exec(conn, &err, "UPDATE jobs SET status = 'paused', desired = 'pause' WHERE id = ?",
                            "s", id);
            if (rc >= 0)
                rc = jobs_event(s, conn, id, "info", "message", NULL, &err, "%s",
                                has_worker ? "Job paused; its worker checkpoints and stops"
                                           : "Job paused");
        }
    } else { /* resume */
        if (strcmp(status, "paused") != 0) refusal = "only a paused job can be resumed";
        else {
            rc = store_exec(conn, &err, "UPDATE jobs SET status = 'queued', desired = 'run', queued_at = ? "
                            "WHERE id = ?", "is", now, id);
            if (rc >= 0)
                rc = jobs_event(s, conn, id, "info", "message", NULL, &err,
                                "Job resumed; queued to continue from its last checkpoint");
        }
    }
    json_decref(row);
    if (refusal) {
        store_rollback(conn);
        store_release(s->store, conn);
        http_reply_error(res, 409, NULL, "invalid_state", "Cannot %s job %s: its status is %s and %s",
                         action, id, status, refusal);
        return;
    }
    if (rc >= 0) rc = store_commit(conn, &err);
    else store_rollback(conn);
    store_release(s->store, conn);
    if (rc < 0) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    atomic_store(&s->kick, 1);
    reply_job(s, req, res);
}

void api_jobs_cancel(void *app, struct http_request *req, struct http_response *res) {
    change_state(app, req, res, "cancel");
}
void api_jobs_pause(void *app, struct http_request *req, struct http_response *res) {
    change_state(app, req, res, "pause");
}
void api_jobs_resume(void *app, struct http_request *req, struct http_response *res) {
    change_state(app, req, res, "resume");
}

/* ---- events ---- */

static json_t *event_object(json_t *row) {
    char id[48];
    snprintf(id, sizeof id, "ftevent-%lld", (long long)json_integer_value(json_object_get(row, "id")));
    return json_pack("{s:s, s:s, s:O, s:O, s:O, s:O, s:O?}", "object", "fine_tuning.job.event", "id", id,
                     "created_at", json_object_get(row, "created_at"), "level", json_object_get(row, "level"),
                     "message", json_object_get(row, "message"), "type", json_object_get(row, "type"),
                     "data", json_object_get(row, "data"));
}

static json_t *event_list_object(void *ctx, json_t *row) {
    (void)ctx;
    return event_object(row);
}

int64_t server_event_number(const char *text) {
    if (!text) return -1;
    if (strncmp(text, "ftevent-", 8) == 0) text += 8;
    return server_parse_row_number(text);
}

struct event_stream {
    struct server *server;
    char job_id[HTTP_ID_BYTES];
    int64_t last_id;
    bool ended;
    char pending[16384];       /* a record that did not fit the last buffer */
    size_t pending_len, pending_off;
};

static void event_stream_free(void *ctx) {
    free(ctx);
}

static long event_stream_next(void *ctx, char *buf, size_t cap) {
    struct event_stream *st = ctx;
    size_t used = 0;
    if (st->pending_off < st->pending_len) {
        size_t n = st->pending_len - st->pending_off;
        if (n > cap) n = cap;
        memcpy(buf, st->pending + st->pending_off, n);
        st->pending_off += n;
        return (long)n;
    }
    if (st->ended) return -1;
    struct smelt_error err = {0};
    struct store_conn *conn = store_acquire(st->server->store, &err);
    if (!conn) return 0;
    json_t *rows = NULL, *job = NULL;
    /* The job's state first, then its events: a job seen ended has all its events in
     * (the control loop writes an ending and its events in one transaction). */
    int rc = store_query_one(conn, &job, &err, "SELECT status, devices FROM jobs WHERE id = ?", "s", st->job_id);
    if (rc == 0)
        rc = store_query(conn, &rows, &err,
                         "SELECT id, created_at, level, type, message, data AS data__json FROM events "
                         "WHERE job_id = ? AND id > ? ORDER BY id LIMIT 100", "si", st->job_id, st->last_id);
    store_release(st->server->store, conn);
    if (rc == 0 && json_array_size(rows) > 0) {
        json_decref(job);
        job = NULL;
    }
    if (rc) {
        json_decref(rows);
        json_decref(job);
        return rc == SMELT_ENOTFOUND ? -1 : 0;
    }
    if (job) {
        /* Nothing new: the stream ends once the job has ended and its worker is gone. */
        bool done = jobs_status_final(json_string_value(json_object_get(job, "status"))) &&
                    json_is_null(json_object_get(job, "devices"));
        json_decref(job);
        json_decref(rows);
        if (!done) return 0;
        st->ended = true;
        int n = snprintf(st->pending, sizeof st->pending, "event: end\ndata: {}\n\n");
        st->pending_len = (size_t)n;
        st->pending_off = 0;
        return event_stream_next(ctx, buf, cap);
    }
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        json_t *ev = event_object(row);
        char *text = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
        json_decref(ev);
        if (!text) break;
        int n = snprintf(st->pending, sizeof st->pending, "id: ftevent-%lld\nevent: fine_tuning.job.event\n"
                         "data: %s\n\n", (long long)json_integer_value(json_object_get(row, "id")), text);
        free(text);
        if (n < 0 || (size_t)n >= sizeof st->pending) { /* an event too large for one record: skip it */
            st->last_id = json_integer_value(json_object_get(row, "id"));
            continue;
        }
        if (used + (size_t)n > cap) {
            if (used > 0) break; /* the next call takes it */
            st->pending_len = (size_t)n;
            st->pending_off = 0;
            st->last_id = json_integer_value(json_object_get(row, "id"));
            json_decref(rows);
            return event_stream_next(ctx, buf, cap);
        }
        memcpy(buf + used, st->pending, (size_t)n);
        used += (size_t)n;
        st->last_id = json_integer_value(json_object_get(row, "id"));
    }
    json_decref(rows);
    return (long)used;
}

void api_jobs_events(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = job_row(s, req, res);
    if (!row) return;
    json_decref(row);
    /* checked whichever form is asked for, as the document's pattern says; only the stream reads it */
    const char *last = http_header(req, "Last-Event-ID");
    if (last && server_event_number(last) < 0) {
        http_reply_error(res, 400, "Last-Event-ID", "invalid_value",
                         "Last-Event-ID: an event id (ftevent-N) is expected");
        return;
    }
    const char *accept = http_header(req, "Accept");
    if (accept && strstr(accept, "text/event-stream")) {
        if (!last) last = http_query(req, "after");
        int64_t last_id = 0;
        if (last) {
            last_id = server_event_number(last);
            if (last_id < 0) {
                http_reply_error(res, 400, "after", "invalid_value", "after: an event id (ftevent-N) is expected");
                return;
            }
        }
        struct event_stream *st = calloc(1, sizeof *st);
        if (!st) {
            http_reply_error(res, 500, NULL, "out_of_memory", "out of memory");
            return;
        }
        st->server = s;
        snprintf(st->job_id, sizeof st->job_id, "%s", req->params[0]);
        st->last_id = last_id;
        res->status = 200;
        res->stream = event_stream_next;
        res->stream_ctx = st;
        res->stream_free = event_stream_free;
        return;
    }
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 20, 1000, &limit, &after) != 0) return;
    int64_t before = INT64_MAX;
    if (after) {
        before = server_event_number(after);
        if (before < 0) {
            http_reply_error(res, 400, "after", "invalid_value", "after: an event id (ftevent-N) is expected");
            return;
        }
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err,
                         "SELECT id, created_at, level, type, message, data AS data__json FROM events "
                         "WHERE job_id = ? AND id < ? ORDER BY id DESC LIMIT ?", "sii", req->params[0],
                         before, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    server_reply_list(res, rows, limit, event_list_object, NULL, false);
}

/* ---- checkpoints, metrics, logs ---- */

void api_jobs_checkpoints(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *job = job_row(s, req, res);
    if (!job) return;
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 10, 1000, &limit, &after) != 0) {
        json_decref(job);
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(job);
        return;
    }
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err,
                         "SELECT id, job_id, step, created_at, path, metrics AS metrics__json FROM checkpoints "
                         "WHERE job_id = ? AND (? IS NULL OR step < (SELECT step FROM checkpoints WHERE id = ?)) "
                         "ORDER BY step DESC LIMIT ?", "sssi", req->params[0], after, after, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        json_decref(job);
        server_reply_failure(res, &err, NULL);
        return;
    }
    const char *model = json_string_value(json_object_get(job, "fine_tuned_model"));
    json_t *data = json_array();
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if ((int64_t)i == limit) break;
        char name[256];
        snprintf(name, sizeof name, "%s:ckpt-step-%lld", model ? model : req->params[0],
                 (long long)json_integer_value(json_object_get(row, "step")));
        json_array_append_new(data, json_pack("{s:s, s:O, s:O, s:s, s:O, s:O, s:O}", "object",
                                              "fine_tuning.job.checkpoint", "id", json_object_get(row, "id"),
                                              "created_at", json_object_get(row, "created_at"),
                                              "fine_tuned_model_checkpoint", name,
                                              "fine_tuning_job_id", json_object_get(row, "job_id"),
                                              "step_number", json_object_get(row, "step"),
                                              "metrics", json_object_get(row, "metrics")));
    }
    bool more = (int64_t)json_array_size(rows) > limit;
    json_decref(rows);
    json_decref(job);
    json_t *first = json_array_size(data) ? json_object_get(json_array_get(data, 0), "id") : NULL;
    json_t *last = json_array_size(data) ? json_object_get(json_array_get(data, json_array_size(data) - 1), "id")
                                         : NULL;
    http_reply_json(res, 200, json_pack("{s:s, s:o, s:b, s:O?, s:O?}", "object", "list", "data", data,
                                        "has_more", more, "first_id", first, "last_id", last));
}

void api_jobs_metrics(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *job = job_row(s, req, res);
    if (!job) return;
    json_decref(job);
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 10000, 100000, &limit, &after) != 0) return;
    int64_t after_id = 0;
    if (after) {
        after_id = server_parse_row_number(after);
        if (after_id < 0) {
            http_reply_error(res, 400, "after", "invalid_value", "after: a metrics row id (integer) is expected");
            return;
        }
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err,
                         "SELECT id, attempt, step, type, data AS data__json FROM metrics WHERE job_id = ? "
                         "AND id > ? ORDER BY id LIMIT ?", "sii", req->params[0], after_id, limit + 1);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    bool more = (int64_t)json_array_size(rows) > limit;
    if (more) json_array_remove(rows, json_array_size(rows) - 1);
    http_reply_json(res, 200, json_pack("{s:s, s:o, s:b}", "object", "list", "data", rows, "has_more", more));
}

void api_jobs_logs(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *job = job_row(s, req, res);
    if (!job) return;
    json_decref(job);
    int64_t tail = JOBS_LOG_TAIL_DEFAULT;
    const char *text = http_query(req, "tail");
    if (text) {
        char *end = NULL;
        tail = strtoll(text, &end, 10);
        if (!*text || *end || tail < 1 || tail > JOBS_LOG_TAIL_MAX) {
            http_reply_error(res, 400, "tail", "invalid_value", "tail: bytes in [1, %d]", JOBS_LOG_TAIL_MAX);
            return;
        }
    }
    char path[SERVER_PATH_BYTES + 64];
    snprintf(path, sizeof path, "%s/%s/log.txt", s->jobs_dir, req->params[0]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        http_reply_text(res, 200, "text/plain; charset=utf-8", "", 0);
        return;
    }
    struct stat stbuf;
    char *buf = NULL;
    ssize_t got = 0;
    if (fstat(fd, &stbuf) == 0) {
        off_t start = stbuf.st_size > tail ? stbuf.st_size - tail : 0;
        size_t want = (size_t)(stbuf.st_size - start);
        buf = malloc(want + 1);
        if (buf) got = pread(fd, buf, want, start);
    }
    close(fd);
    if (!buf || got < 0) {
        free(buf);
        http_reply_error(res, 500, NULL, "storage_error", "reading the job's log failed");
        return;
    }
    res->status = 200;
    res->body = buf;
    res->body_len = (size_t)got;
    snprintf(res->content_type, sizeof res->content_type, "text/plain; charset=utf-8");
}
