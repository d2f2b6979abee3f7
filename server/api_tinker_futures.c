/* retrieve_future and cancel_future (docs/tinker.md): a future's result once the worker
 * answered (protobuf for forward(_backward) and sample, JSON otherwise), its failure as
 * {"error", "category"}, or — after a long poll of up to TINKER_POLL_S — try_again, which
 * the SDK re-polls at once. No store connection is held while waiting. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/tinker_api.h"

#define TINKER_POLL_S 25
#define TINKER_POLL_STEP_MS 50

static json_t *future_row(struct server *s, struct http_response *res, const char *project, const char *id) {
    struct store_conn *c = server_conn(s, res);
    if (!c) return NULL;
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = store_query_one(c, &row, &err, "SELECT op, status, result AS result__json, error AS error__json FROM "
                             "tinker_futures WHERE id = ? AND project_id = ?", "ss", id, project);
    store_release(s->store, c);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "request_id", "not_found", "request_id: no such future: %.200s", id);
    else if (rc) tinker_reply_failure(res, &err, NULL);
    return rc ? NULL : row;
}

static void reply_done(struct http_response *res, const json_t *row) {
    const char *op = json_string_value(json_object_get(row, "op"));
    const json_t *result = json_object_get(row, "result");
    if (!tinker_op_is_proto(op)) {
        http_reply_json(res, 200, json_incref((json_t *)result));
        return;
    }
    uint8_t *body = NULL;
    size_t len = 0;
    struct smelt_error err = {0};
    if (tinker_result_proto(op, result, &body, &len, &err) != 0) {
        http_reply_json(res, 200, json_pack("{s:s, s:s}", "error", err.message, "category", "server"));
        return;
    }
    http_reply_text(res, 200, "application/x-protobuf", (const char *)body, len);
    free(body);
}

void api_tinker_retrieve_future(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = tinker_body(req, res);
    if (!body) return;
    const char *id = json_string_value(json_object_get(body, "request_id"));
    if (!id) {
        http_reply_error(res, 400, "request_id", "invalid_value", "request_id: required");
        json_decref(body);
        return;
    }
    struct timespec start, now, step = {0, TINKER_POLL_STEP_MS * 1000000L};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        json_t *row = future_row(s, res, req->identity.project, id);
        if (!row) break;
        const char *status = json_string_value(json_object_get(row, "status"));
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool waited = now.tv_sec - start.tv_sec >= TINKER_POLL_S;
        if (strcmp(status, "done") == 0) reply_done(res, row);
        else if (strcmp(status, "pending") != 0) {
            json_t *e = json_object_get(row, "error");
            http_reply_json(res, 200, json_is_object(e) ? json_incref(e)
                                                        : json_pack("{s:s, s:s}", "error", "the request was cancelled",
                                                                    "category", "user"));
        } else if (waited)
            http_reply_json(res, 200, json_pack("{s:s, s:s, s:s}", "type", "try_again", "request_id", id,
                                                "queue_state", "active"));
        bool again = strcmp(status, "pending") == 0 && !waited;
        json_decref(row);
        if (!again) break;
        nanosleep(&step, NULL);
    }
    json_decref(body);
}

void api_tinker_cancel_future(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req;
    /* A running request cannot be taken back from the worker; its result is just never read. */
    http_reply_json(res, 200, json_object());
}
