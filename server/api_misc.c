/* /healthz, /metrics (Prometheus text), /v1/openapi.json, /v1/cluster and the web
 * page's static files. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

#define CHART_JS_PATH "/usr/share/javascript/chart.js/chart.min.js"
#define CHART_JS_FALLBACK "/usr/share/javascript/chart.js/Chart.min.js"

void api_healthz(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    (void)req;
    http_reply_json(res, 200, json_pack("{s:s, s:I}", "status", "ok", "uptime_seconds",
                                        (json_int_t)(server_now() - s->started_at)));
}

/* ---- /metrics ---- */

struct text {
    char *buf;
    size_t len, cap;
    bool failed;
};

static void text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(struct text *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->failed = true;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

void api_metrics(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    (void)req;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *statuses = NULL, *queue = NULL, *agents = NULL, *alloc = NULL;
    int rc = store_query(conn, &statuses, &err, "SELECT status, count(*) AS n FROM jobs GROUP BY status", "");
    if (!rc)
        rc = store_query_one(conn, &queue, &err, "SELECT count(*) AS n, coalesce(max(? - queued_at), 0) AS oldest, "
                             "coalesce(sum(? - queued_at), 0) AS total FROM jobs WHERE status = 'queued'", "ii",
                             server_now(), server_now());
    if (!rc)
        rc = store_query(conn, &agents, &err, "SELECT id, status, devices AS devices__json FROM agents", "");
    if (!rc)
        rc = store_query(conn, &alloc, &err, "SELECT agent_id, devices AS devices__json FROM jobs "
                         "WHERE devices IS NOT NULL", "");
    store_release(s->store, conn);
    if (rc) {
        json_decref(statuses);
        json_decref(queue);
        json_decref(agents);
        json_decref(alloc);
        server_reply_failure(res, &err, NULL);
        return;
    }
    struct text t = {0};
    static const char *const all[] = {"validating_files", "queued", "running", "succeeded", "failed",
                                      "cancelled", "paused", NULL};
    text_add(&t, "# HELP smelt_jobs Jobs by status.\n# TYPE smelt_jobs gauge\n");
    for (int i = 0; all[i]; i++) {
        int64_t n = 0;
        size_t k;
        json_t *row;
        json_array_foreach(statuses, k, row) {
            if (strcmp(json_string_value(json_object_get(row, "status")), all[i]) == 0)
                n = json_integer_value(json_object_get(row, "n"));
        }
        text_add(&t, "smelt_jobs{status=\"%s\"} %lld\n", all[i], (long long)n);
    }
    text_add(&t, "# HELP smelt_queue_length Jobs waiting for devices.\n# TYPE smelt_queue_length gauge\n"
                 "smelt_queue_length %lld\n", (long long)json_integer_value(json_object_get(queue, "n")));
    text_add(&t, "# HELP smelt_queue_oldest_wait_seconds How long the oldest queued job has waited.\n"
                 "# TYPE smelt_queue_oldest_wait_seconds gauge\nsmelt_queue_oldest_wait_seconds %lld\n",
             (long long)json_integer_value(json_object_get(queue, "oldest")));
    text_add(&t, "# HELP smelt_queue_wait_seconds_total Sum of the waits of the queued jobs so far.\n"
                 "# TYPE smelt_queue_wait_seconds_total gauge\nsmelt_queue_wait_seconds_total %lld\n",
             (long long)json_integer_value(json_object_get(queue, "total")));
    int64_t devices = 0, allocated = 0, online = 0;
    size_t k;
    json_t *row;
    json_array_foreach(agents, k, row) {
        if (strcmp(json_string_value(json_object_get(row, "status")), "online") != 0) continue;
        online++;
        devices += (int64_t)json_array_size(json_object_get(row, "devices"));
    }
    json_array_foreach(alloc, k, row) allocated += (int64_t)json_array_size(json_object_get(row, "devices"));
    text_add(&t, "# HELP smelt_agents_online Agents heard from recently.\n# TYPE smelt_agents_online gauge\n"
                 "smelt_agents_online %lld\n", (long long)online);
    text_add(&t, "# HELP smelt_devices Devices of online agents by state.\n# TYPE smelt_devices gauge\n"
                 "smelt_devices{state=\"free\"} %lld\nsmelt_devices{state=\"allocated\"} %lld\n",
             (long long)(devices - allocated > 0 ? devices - allocated : 0), (long long)allocated);
    text_add(&t, "# HELP smelt_job_retries_total Jobs restarted from a checkpoint after their worker was lost.\n"
                 "# TYPE smelt_job_retries_total counter\nsmelt_job_retries_total %lld\n",
             (long long)atomic_load(&s->job_retries_total));
    text_add(&t, "# HELP smelt_schedule_fires_total Jobs created by schedules.\n"
                 "# TYPE smelt_schedule_fires_total counter\nsmelt_schedule_fires_total %lld\n",
             (long long)atomic_load(&s->schedule_fires_total));
    struct http_stats hs = {0};
    struct http_server *http = atomic_load(&s->http);
    if (http) http_server_stats(http, &hs); /* NULL: a request in before server_run published it */
    text_add(&t, "# HELP smelt_http_requests_total HTTP responses by status class.\n"
                 "# TYPE smelt_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        text_add(&t, "smelt_http_requests_total{code=\"%dxx\"} %llu\n", c,
                 (unsigned long long)hs.requests_by_class[c]);
    text_add(&t, "# HELP smelt_http_request_duration_seconds HTTP request latency.\n"
                 "# TYPE smelt_http_request_duration_seconds histogram\n");
    for (int b = 0; b < HTTP_N_LATENCY_BUCKETS; b++)
        text_add(&t, "smelt_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n", HTTP_LATENCY_BOUNDS[b],
                 (unsigned long long)hs.latency_buckets[b]);
    text_add(&t, "smelt_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
                 "smelt_http_request_duration_seconds_sum %.6f\nsmelt_http_request_duration_seconds_count %llu\n",
             (unsigned long long)hs.latency_count, hs.latency_sum_s, (unsigned long long)hs.latency_count);
    json_decref(statuses);
    json_decref(queue);
    json_decref(agents);
    json_decref(alloc);
    if (t.failed) {
        free(t.buf);
        http_reply_error(res, 500, NULL, "out_of_memory", "out of memory");
        return;
    }
    res->status = 200;
    res->body = t.buf;
    res->body_len = t.len;
    snprintf(res->content_type, sizeof res->content_type, "text/plain; version=0.0.4");
}

/* ---- static files ---- */

static const char *content_type_of(const char *path) {
    const char *dot = strrchr(path, '.');
    if (!dot) return "application/octet-stream";
    if (strcmp(dot, ".html") == 0) return "text/html; charset=utf-8";
    if (strcmp(dot, ".js") == 0) return "text/javascript; charset=utf-8";
    if (strcmp(dot, ".css") == 0) return "text/css; charset=utf-8";
    if (strcmp(dot, ".json") == 0) return "application/json";
    if (strcmp(dot, ".svg") == 0) return "image/svg+xml";
    if (strcmp(dot, ".png") == 0) return "image/png";
    return "application/octet-stream";
}

static void send_file(struct http_response *res, const char *path, const char *what) {
    struct smelt_error err = {0};
    char *data = NULL;
    size_t len = 0;
    if (!path_exists(path) || path_is_dir(path) || file_read_all(path, &data, &len, &err) != 0) {
        http_reply_error(res, 404, NULL, "not_found", "No such page: %s", what);
        return;
    }
    res->status = 200;
    res->body = data;
    res->body_len = len;
    snprintf(res->content_type, sizeof res->content_type, "%s", content_type_of(path));
    http_add_header(res, "Cache-Control", "no-cache");
}

void api_static(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    const char *rest = req->n_params > 0 ? req->params[req->n_params - 1] : "";
    if (!rest || !*rest) rest = "index.html";
    if (strcmp(rest, "vendor/chart.js") == 0) {
        send_file(res, path_exists(CHART_JS_PATH) ? CHART_JS_PATH : CHART_JS_FALLBACK, rest);
        return;
    }
    /* The HTTP layer refuses "..", "//" and odd characters; refuse hidden files too. */
    if (!s->web_dir[0] || rest[0] == '.' || rest[0] == '/' || strstr(rest, "/.") || strstr(rest, "..") ||
        strncmp(rest, "v1/", 3) == 0) {
        http_reply_error(res, 404, NULL, "not_found", "No such page: %s", rest);
        return;
    }
    char path[SERVER_PATH_BYTES * 2];
    if (snprintf(path, sizeof path, "%s/%s", s->web_dir, rest) >= (int)sizeof path) {
        http_reply_error(res, 404, NULL, "not_found", "No such page");
        return;
    }
    send_file(res, path, rest);
}

void api_openapi(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    (void)req;
    char path[SERVER_PATH_BYTES + 32];
    if (!s->web_dir[0]) {
        http_reply_error(res, 404, NULL, "not_found", "openapi.json is not installed");
        return;
    }
    snprintf(path, sizeof path, "%s/openapi.json", s->web_dir);
    send_file(res, path, "openapi.json");
}
