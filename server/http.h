/* The HTTP layer of smeltd (private to server/): libmicrohttpd with an internal thread
 * pool on epoll, a route table, whole-body reads under a size limit, multipart parsing,
 * JSON replies with OpenAI's error envelope, Server-Sent Events, bearer-key auth, and
 * the request counters /metrics reports.
 *
 * A handler runs on an HTTP thread with the request's body already read in whole. It
 * fills a struct http_response and returns; it must not block for long (no process
 * control, no waiting on agents).
 *
 * Ownership: the request and everything it points to belong to the HTTP layer and live
 * for the handler call. What a handler puts into the response (body, json, stream
 * context) passes to the HTTP layer, which frees it once sent. */
#ifndef SMELT_SERVER_HTTP_H
#define SMELT_SERVER_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define HTTP_MAX_PARAMS 4
#define HTTP_ID_BYTES 128

/* Who is calling: filled from "Authorization: Bearer <key>" before a non-public route's
 * handler runs (a missing or unknown key never reaches the handler: 401). */
struct http_identity {
    int64_t key_id;
    char project[HTTP_ID_BYTES];   /* the key's project; everything it sees is scoped to it */
    bool admin;                    /* admin keys may manage keys and projects */
};

struct http_request {
    const char *method;                    /* "GET", "POST", "DELETE", ... */
    const char *path;                      /* decoded path without the query */
    const char *params[HTTP_MAX_PARAMS];   /* the route's {placeholders}, in order */
    int n_params;
    const char *body;                      /* NUL-terminated copy; "" when none */
    size_t body_len;
    struct http_identity identity;         /* valid on non-public routes */
    void *connection;                      /* struct MHD_Connection *, for the lookups below */
};

/* A query argument / request header (case-insensitive name), or NULL. */
const char *http_query(const struct http_request *req, const char *key);
const char *http_header(const struct http_request *req, const char *name);

/* One part of a multipart/form-data body. Pointers are into the request body. */
struct http_part {
    char name[128];
    char filename[256];              /* "" when the part is not a file */
    char content_type[128];
    const char *data;
    size_t len;
};

/* Splits a multipart/form-data body (boundary from Content-Type). At most max parts;
 * SMELT_EFORMAT naming what is malformed. */
int http_multipart_parse(const struct http_request *req, struct http_part *parts, int max,
                         int *n, struct smelt_error *err);

/* Server-Sent Events: the HTTP layer calls next() whenever the client can take more.
 * next writes at most cap bytes of complete "id:/event:/data:" records into buf and
 * returns how many; 0 means nothing new yet (the connection is suspended until
 * http_streams_wake is called, or a keep-alive comment is due after 15 s); -1 ends the
 * stream. free_ctx releases ctx when the stream ends for any reason. */
typedef long (*http_stream_next)(void *ctx, char *buf, size_t cap);

/* A deferred answer (a long poll): a handler that cannot answer yet sets res->deferred
 * instead of a body. The connection is then suspended (no thread waits, no polling) and
 * fn is asked again, on an HTTP thread, after each http_deferred_wake that names its key
 * (or all keys), and once more with last = true when the deadline passes. fn fills res
 * (any plain response: not another deferral, not a stream) and returns true, or returns
 * false for "still waiting" (ignored when last: a last call that fills nothing is a 500).
 * res is zeroed before each call. free_ctx releases ctx exactly once, after the answer
 * or when the client leaves or the server stops first. The deadline is honoured to
 * within the SSE ticker's tick (HTTP_SSE_TICK_MS, 250 ms). */
struct http_response;
typedef bool (*http_deferred_fn)(void *ctx, bool last, struct http_response *res);

#define HTTP_MAX_HEADERS 4

struct http_response {
    int status;
    char *body;                       /* malloc'd, owned by the response */
    size_t body_len;
    char content_type[64];
    struct { char name[64]; char value[256]; } headers[HTTP_MAX_HEADERS];
    int n_headers;
    http_stream_next stream;          /* non-NULL: an SSE response; body is ignored */
    void *stream_ctx;
    void (*stream_free)(void *ctx);
    http_deferred_fn deferred;        /* non-NULL: answer later (above); body is ignored */
    void *deferred_ctx;
    void (*deferred_free)(void *ctx);
    int deferred_deadline_ms;         /* from now; the last call comes then */
    char deferred_key[HTTP_ID_BYTES]; /* what wakes it ("" : every wake) */
};

/* Helpers filling a response. http_reply_json takes ownership of value (json_decref). */
void http_reply_json(struct http_response *res, int status, json_t *value);
void http_reply_text(struct http_response *res, int status, const char *content_type,
                     const char *text, size_t len);
/* OpenAI's envelope: {"error":{"message","type","param","code"}}. type is derived from
 * status when NULL ("invalid_request_error" for 4xx, "authentication_error" for 401,
 * "permission_error" for 403, "not_found_error" for 404, "conflict_error" for 409,
 * "rate_limit_error" for 429, "server_error" for 5xx); param and code may be NULL. */
void http_reply_error(struct http_response *res, int status, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void http_add_header(struct http_response *res, const char *name, const char *value);

typedef void (*http_handler)(void *app, struct http_request *req, struct http_response *res);

enum http_route_flags {
    HTTP_PUBLIC = 1,        /* no key needed (/healthz, the page's static files) */
    HTTP_ADMIN = 2,         /* an admin key is needed (403 otherwise) */
    HTTP_LARGE_BODY = 4,    /* body up to http_config.max_upload_bytes (file uploads) */
};

/* What an id is, in a path or a paging cursor: 1..HTTP_ID_BYTES-1 of [A-Za-z0-9._:-].
 * HTTP_ID_PATTERN is the same rule as the OpenAPI document states it (tests/e2e/
 * test_openapi.py holds the document to it; test_http.c holds http_is_id to it). */
#define HTTP_ID_PATTERN "^[A-Za-z0-9._:-]{1,127}$"
bool http_is_id(const char *s, size_t len);

/* pattern: "/v1/fine_tuning/jobs/{id}/cancel"; a {name} matches one path segment that is
 * an id (http_is_id); "*" as the last segment matches the rest of
 * the path (static files) and is passed as the last param. Routes are tried in order. */
struct http_route {
    const char *method;
    const char *pattern;
    http_handler handler;
    int flags;
};

/* Looks a bearer key up: 0 and *out filled when it is valid, SMELT_ENOTFOUND when not. */
typedef int (*http_auth_fn)(void *app, const char *key, struct http_identity *out);

struct http_config {
    const char *listen_address;   /* "127.0.0.1" */
    int port;                     /* 0: pick a free port (http_server_port tells which) */
    int threads;                  /* the pool's size */
    size_t max_body_bytes;        /* JSON bodies; larger: 413 */
    size_t max_upload_bytes;      /* HTTP_LARGE_BODY routes; larger: 413 */
    const struct http_route *routes;
    int n_routes;
    http_auth_fn auth;
    void *app;                    /* passed to handlers and auth */
};

/* Counters for /metrics (monotonic since start). Latency buckets in seconds:
 * HTTP_LATENCY_BOUNDS; count[i] counts requests that took <= bound[i]. */
#define HTTP_N_LATENCY_BUCKETS 10
extern const double HTTP_LATENCY_BOUNDS[HTTP_N_LATENCY_BUCKETS];
struct http_stats {
    uint64_t requests_by_class[6];          /* [status / 100], 1xx..5xx */
    uint64_t latency_buckets[HTTP_N_LATENCY_BUCKETS];
    uint64_t latency_count;
    double latency_sum_s;
};

struct http_server;

int http_server_start(const struct http_config *config, struct http_server **out,
                      struct smelt_error *err);
int http_server_port(const struct http_server *server);
void http_server_stats(struct http_server *server, struct http_stats *out);
/* Resumes every suspended SSE stream so its next() is asked again (new events). */
void http_streams_wake(struct http_server *server);
/* Asks every suspended deferred answer whose key is key (NULL: all of them) again. Safe
 * from any thread; a wake that races a handler's decision to defer is not lost. */
void http_deferred_wake(struct http_server *server, const char *key);
/* Stops accepting, ends streams, waits for handlers, frees. */
void http_server_stop(struct http_server *server);

#endif
