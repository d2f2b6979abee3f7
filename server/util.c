/* Small helpers the handlers share: time, ids, error replies, paging. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/common.h"
#include "server/server_internal.h"

int64_t server_now(void) {
    return (int64_t)time(NULL);
}

void server_new_id(const char *prefix, char *out, size_t cap) {
    unsigned char bytes[12];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
        SMELT_ASSERT(n > 0); /* getrandom on the kernel's pool only fails on a broken system */
        got += (size_t)n;
    }
    char hex[2 * sizeof bytes + 1];
    for (size_t i = 0; i < sizeof bytes; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    snprintf(out, cap, "%s%s", prefix, hex);
}

void server_reply_failure(struct http_response *res, const struct smelt_error *err,
                          const char *param) {
    int status = 500;
    const char *code = NULL;
    switch (err->code) {
    case SMELT_ENOTFOUND: status = 404; code = "not_found"; break;
    case SMELT_EINVAL:
    case SMELT_EFORMAT: status = 400; code = "invalid_value"; break;
    case SMELT_EUNSUPPORTED: status = 400; code = "unsupported"; break;
    case SERVER_ESTATE: status = 409; code = "invalid_state"; break;
    default: break;
    }
    if (status == 500) log_error("request failed: %s", err->message);
    http_reply_error(res, status, param, code, "%s", err->message);
}

json_t *server_body_object(const struct http_request *req, struct http_response *res) {
    if (req->body_len == 0) {
        http_reply_error(res, 400, NULL, "missing_body", "the request needs a JSON object body");
        return NULL;
    }
    json_error_t jerr;
    json_t *v = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!v) {
        http_reply_error(res, 400, NULL, "invalid_json", "body: invalid JSON at line %d column %d: %s",
                         jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        http_reply_error(res, 400, NULL, "invalid_json", "body: a JSON object is expected");
        return NULL;
    }
    return v;
}

int64_t server_parse_row_number(const char *text) {
    if (!text || !isdigit((unsigned char)text[0]) || strlen(text) > 18) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    return *end || errno ? -1 : (int64_t)v;
}

int server_page_args(const struct http_request *req, struct http_response *res, int64_t def,
                     int64_t max, int64_t *limit, const char **after) {
    *limit = def;
    *after = http_query(req, "after");
    const char *text = http_query(req, "limit");
    if (text) {
        char *end = NULL;
        long long v = strtoll(text, &end, 10);
        if (!*text || *end || v < 1 || v > max) {
            http_reply_error(res, 400, "limit", "invalid_value",
                             "limit: an integer in [1, %lld] is expected, got '%.40s'",
                             (long long)max, text);
            return -1;
        }
        *limit = v;
    }
    if (*after && !http_is_id(*after, strlen(*after))) {
        http_reply_error(res, 400, "after", "invalid_value",
                         "after: not an id (1 to %d of A-Z a-z 0-9 . _ : -), got '%.40s'",
                         HTTP_ID_BYTES - 1, *after);
        return -1;
    }
    return 0;
}

struct store_conn *server_conn(struct server *s, struct http_response *res) {
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    if (!c) http_reply_error(res, 503, NULL, "store_unavailable", "%s", err.message);
    return c;
}

void server_reply_list(struct http_response *res, json_t *rows, int64_t limit,
                       json_t *(*fn)(void *ctx, json_t *row), void *ctx, bool ids) {
    json_t *data = json_array();
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if ((int64_t)i == limit) break;
        json_t *o = fn(ctx, row);
        if (o) json_array_append_new(data, o);
    }
    bool more = (int64_t)json_array_size(rows) > limit;
    json_decref(rows);
    json_t *page = json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", more);
    size_t n = json_array_size(data);
    if (page && ids) {
        json_object_set(page, "first_id", n ? json_object_get(json_array_get(data, 0), "id") : json_null());
        json_object_set(page, "last_id", n ? json_object_get(json_array_get(data, n - 1), "id") : json_null());
    }
    if (!page) {
        http_reply_error(res, 500, NULL, "out_of_memory", "out of memory");
        return;
    }
    http_reply_json(res, 200, page);
}
