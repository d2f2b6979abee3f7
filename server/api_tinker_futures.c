/* retrieve_future and cancel_future (docs/tinker.md): a future's result once the worker
 * answered (protobuf for forward(_backward) and sample, JSON otherwise), its failure as
 * {"error", "category"}, or — after a long poll of up to TINKER_POLL_S — try_again, which
 * the SDK re-polls at once. The long poll is a deferred answer (http.h): no HTTP thread
 * and no store connection is held while it waits, and the store is read again only when
 * the future's key is woken (tinker_futures_woken: a result stored, futures failed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

#define TINKER_POLL_S 25

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

/* The poll's state while its connection waits; freed by the HTTP layer. */
struct poll {
    struct server *s;
    char project[HTTP_ID_BYTES];
    char id[HTTP_ID_BYTES];
};

/* Fills res from the future's row (true), or leaves it empty while the future is pending
 * and last is false. */
static bool poll_answer(void *ctx, bool last, struct http_response *res) {
    struct poll *p = ctx;
    json_t *row = future_row(p->s, res, p->project, p->id);
    if (!row) return true;
    const char *status = json_string_value(json_object_get(row, "status"));
    bool pending = strcmp(status, "pending") == 0;
    if (strcmp(status, "done") == 0) reply_done(res, row);
    else if (!pending) {
        json_t *e = json_object_get(row, "error");
        http_reply_json(res, 200, json_is_object(e) ? json_incref(e)
                                                    : json_pack("{s:s, s:s}", "error", "the request was cancelled",
                                                                "category", "user"));
    } else if (last)
        http_reply_json(res, 200, json_pack("{s:s, s:s, s:s}", "type", "try_again", "request_id", p->id,
                                            "queue_state", "active"));
    json_decref(row);
    return !pending || last;
}

void api_tinker_retrieve_future(void *app, struct http_request *req, struct http_response *res) {
    json_t *body = tinker_body(req, res, TINKER_RETRIEVE_FUTURE);
    if (!body) return;
    const char *id = json_string_value(json_object_get(body, "request_id"));
    struct poll *p = id ? calloc(1, sizeof *p) : NULL;
    if (!id) http_reply_error(res, 400, "request_id", "invalid_value", "request_id: required");
    else if (strlen(id) >= sizeof p->id)
        http_reply_error(res, 404, "request_id", "not_found", "request_id: no such future: %.200s", id);
    else if (!p) http_reply_error(res, 500, NULL, NULL, "out of memory");
    if (!p || strlen(id) >= sizeof p->id) {
        free(p);
        json_decref(body);
        return;
    }
    p->s = app;
    snprintf(p->project, sizeof p->project, "%s", req->identity.project);
    snprintf(p->id, sizeof p->id, "%s", id);
    json_decref(body);
    if (poll_answer(p, false, res)) {
        free(p);
        return;
    }
    res->deferred = poll_answer;
    res->deferred_ctx = p;
    res->deferred_free = free;
    res->deferred_deadline_ms = TINKER_POLL_S * 1000;
    snprintf(res->deferred_key, sizeof res->deferred_key, "%s", p->id);
}

/* Takes a pending future's request back from wherever it waits before the worker (the model's seq order first: it
 * moves from there to the dispatcher, never back) and fails the future; true when it did. */
static bool cancel_unsent(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                          const char *id) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = store_query_one(c, &row, &err, "SELECT status, model_id, job_id FROM tinker_futures WHERE id = ? AND "
                             "project_id = ?", "ss", id, project);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "request_id", "not_found", "request_id: no such future: %.200s", id);
    else if (rc) tinker_reply_failure(res, &err, NULL);
    const char *model_id = json_string_value(json_object_get(row, "model_id"));
    bool taken = !rc && strcmp(json_string_value(json_object_get(row, "status")), "pending") == 0 &&
                 ((model_id && tinker_order_cancel(tinker_api_order(s), model_id, id)) ||
                  tinker_dispatch_cancel(s, json_string_value(json_object_get(row, "job_id")), id));
    if (taken && tinker_future_cancel(c, id, &err) != 0) log_error("tinker: cancelling %s: %s", id, err.message);
    if (!rc) http_reply_json(res, 200, json_object());
    json_decref(row);
    return taken;
}

/* A request still waiting in smeltd (its model's earlier seqs, or its worker not yet connected) is taken back and
 * its future fails, category user; one already sent runs and answers as usual (a worker cannot be interrupted). */
void api_tinker_cancel_future(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = tinker_body(req, res, TINKER_CANCEL_FUTURE);
    if (!body) return;
    const char *id = json_string_value(json_object_get(body, "request_id"));
    struct store_conn *c = id ? server_conn(s, res) : NULL;
    if (!id) http_reply_error(res, 400, "request_id", "invalid_value", "request_id: required");
    else if (c && tinker_txn_begin(c, res) == 0) {
        bool taken = cancel_unsent(s, c, res, req->identity.project, id);
        struct smelt_error err = {0};
        if (store_commit(c, &err) != 0) {
            /* its request is gone: the future must not stay pending */
            log_error("tinker: committing the cancel of %s: %s", id, err.message);
            store_rollback(c);
            if (taken && tinker_future_cancel(c, id, &err) != 0) log_error("tinker: %s stays pending", id);
        }
        if (taken) tinker_futures_wake(s, id);
    }
    if (c) store_release(s->store, c);
    json_decref(body);
}
