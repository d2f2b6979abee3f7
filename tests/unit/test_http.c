/* server/http: a real server on 127.0.0.1 (ephemeral port) with dummy handlers, driven
 * over raw POSIX sockets so hostile requests can be sent as bytes: routing and params,
 * 404/405 (Allow from the table, OPTIONS 204, bad ids 404 on their own route), path traversal, auth (401/403), 413 by Content-Length and by chunked
 * body, multipart (binary parts, malformed bodies), handler bugs answered with 500,
 * SSE (events, suspension without busy looping, wake, disconnect, stop with a stream
 * open), deferred answers (woken by key from another thread, at the deadline, a client
 * leaving, many waiting on two threads beside a plain GET), stats, and survival after
 * garbage and half-closed connections. */
#include <criterion/criterion.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "server/http.h"
#include "server/sha256.h"

#define MAX_BODY 1024
#define MAX_UPLOAD (64 * 1024)

static struct http_server *g_server;
static atomic_int g_events_available; /* the SSE handler's counter */
static atomic_int g_events_end;       /* 1: next() ends the stream */
static atomic_int g_stream_frees;
static atomic_long g_stream_nexts;

/* ------------------------------------------------------------- handlers ---- */

static void h_echo(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    json_t *params = json_array();
    for (int i = 0; i < req->n_params; i++) json_array_append_new(params, json_string(req->params[i]));
    http_reply_json(res, 200,
                    json_pack("{s:s, s:s, s:o, s:s%, s:s?, s:s?, s:I, s:s, s:b}", "method",
                              req->method, "path", req->path, "params", params, "body",
                              req->body, req->body_len, "q", http_query(req, "q"), "h",
                              http_header(req, "X-Test"), "key_id",
                              (json_int_t)req->identity.key_id, "project",
                              req->identity.project, "admin", req->identity.admin));
}

static void h_static(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    cr_assert_eq(req->n_params, 1);
    http_reply_text(res, 200, "text/plain", req->params[0], strlen(req->params[0]));
    http_add_header(res, "X-Static", "yes");
}

static void h_upload(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    struct http_part parts[4];
    int n = -1;
    struct smelt_error err;
    error_clear(&err);
    if (http_multipart_parse(req, parts, 4, &n, &err) != 0) {
        cr_assert_eq(err.code, SMELT_EFORMAT);
        http_reply_error(res, 400, "file", "invalid_multipart", "%s", err.message);
        return;
    }
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        char hex[65];
        sha256_hex(parts[i].data, parts[i].len, hex);
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:I, s:s}", "name", parts[i].name,
                                              "filename", parts[i].filename, "content_type",
                                              parts[i].content_type, "len",
                                              (json_int_t)parts[i].len, "sha256", hex));
    }
    http_reply_json(res, 200, json_pack("{s:o}", "parts", list));
}

static void h_empty(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req, (void)res;
}

static void h_no_status(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req;
    http_reply_text(res, 0, "text/plain", "x", 1);
}

static void h_many_headers(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req;
    http_reply_text(res, 200, "text/plain", "x", 1);
    for (int i = 0; i <= HTTP_MAX_HEADERS; i++) http_add_header(res, "X-Many", "1");
}

struct events_ctx {
    int sent;
};

static long events_next(void *ctx, char *buf, size_t cap) {
    struct events_ctx *c = ctx;
    atomic_fetch_add(&g_stream_nexts, 1);
    if (atomic_load(&g_events_end)) return -1;
    if (c->sent >= atomic_load(&g_events_available)) return 0;
    int n = snprintf(buf, cap, "id: %d\nevent: tick\ndata: {\"n\":%d}\n\n", c->sent, c->sent);
    cr_assert(n > 0 && (size_t)n < cap);
    c->sent++;
    return n;
}

static void events_free(void *ctx) {
    atomic_fetch_add(&g_stream_frees, 1);
    free(ctx);
}

static void h_events(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req;
    struct events_ctx *c = calloc(1, sizeof *c);
    cr_assert(c);
    res->status = 200;
    res->stream = events_next;
    res->stream_ctx = c;
    res->stream_free = events_free;
}

/* A deferred answer: "ready:<key>" once g_deferred_ready is set and it is woken,
 * "deadline:<key>" at its deadline (?ms=, default 5000). */
static atomic_int g_deferred_ready;
static atomic_int g_deferred_calls;
static atomic_int g_deferred_frees;

struct wait_ctx {
    char key[64];
};

static bool wait_answer(void *ctx, bool last, struct http_response *res) {
    struct wait_ctx *w = ctx;
    atomic_fetch_add(&g_deferred_calls, 1);
    bool ready = atomic_load(&g_deferred_ready);
    if (!ready && !last) return false;
    char text[128];
    int n = snprintf(text, sizeof text, "%s:%s", ready ? "ready" : "deadline", w->key);
    http_reply_text(res, 200, "text/plain", text, (size_t)n);
    return true;
}

static void wait_free(void *ctx) {
    atomic_fetch_add(&g_deferred_frees, 1);
    free(ctx);
}

static void h_wait(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    struct wait_ctx *w = calloc(1, sizeof *w);
    cr_assert(w);
    snprintf(w->key, sizeof w->key, "%s", req->params[0]);
    const char *ms = http_query(req, "ms");
    res->deferred = wait_answer;
    res->deferred_ctx = w;
    res->deferred_free = wait_free;
    res->deferred_deadline_ms = ms ? atoi(ms) : 5000;
    snprintf(res->deferred_key, sizeof res->deferred_key, "%s", w->key);
}

static int auth(void *app, const char *key, struct http_identity *out) {
    (void)app;
    if (strcmp(key, "sk-user") == 0) {
        out->key_id = 1;
        snprintf(out->project, sizeof out->project, "proj-a");
        return 0;
    }
    if (strcmp(key, "sk-admin") == 0) {
        out->key_id = 2;
        snprintf(out->project, sizeof out->project, "ops");
        out->admin = true;
        return 0;
    }
    return SMELT_ENOTFOUND;
}

static const struct http_route ROUTES[] = {
    {"GET", "/healthz", h_echo, HTTP_PUBLIC},
    {"GET", "/v1/items/{a}/sub/{b}", h_echo, 0},
    {"DELETE", "/v1/items/{a}/sub/{b}", h_echo, 0},
    {"POST", "/v1/echo", h_echo, 0},
    {"GET", "/v1/admin/thing", h_echo, HTTP_ADMIN},
    {"POST", "/v1/files", h_upload, HTTP_LARGE_BODY},
    {"GET", "/v1/empty", h_empty, 0},
    {"GET", "/v1/no_status", h_no_status, 0},
    {"GET", "/v1/many_headers", h_many_headers, 0},
    {"GET", "/v1/events", h_events, 0},
    {"GET", "/v1/wait/{key}", h_wait, 0},
    {"GET", "/static/*", h_static, HTTP_PUBLIC},
    {"POST", "/api/v1/echo", h_echo, 0},
};

static void server_start(int threads) {
    log_set_level(LOG_LEVEL_OFF);
    struct http_config config = {
        .listen_address = "127.0.0.1",
        .port = 0,
        .threads = threads,
        .max_body_bytes = MAX_BODY,
        .max_upload_bytes = MAX_UPLOAD,
        .routes = ROUTES,
        .n_routes = (int)(sizeof ROUTES / sizeof ROUTES[0]),
        .auth = auth,
    };
    struct smelt_error err;
    error_clear(&err);
    int rc = http_server_start(&config, &g_server, &err);
    cr_assert_eq(rc, 0, "http_server_start: %s", err.message);
    cr_assert_gt(http_server_port(g_server), 0);
}

static void server_up(void) { server_start(4); }

static void server_down(void) {
    http_server_stop(g_server);
    g_server = NULL;
}

TestSuite(http, .init = server_up, .fini = server_down, .timeout = 20);

/* --------------------------------------------------------------- client ---- */

struct reply {
    int status;
    char head[8192];   /* status line and headers */
    char *body;        /* de-chunked, NUL-terminated */
    size_t body_len;
    json_t *json;      /* body parsed when it is JSON */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)http_server_port(g_server)),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

static void send_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        cr_assert(n > 0, "send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

/* Everything until the server closes (or 5 s pass); NUL-terminated. */
static char *read_all(int fd, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    cr_assert(buf);
    for (;;) {
        if (cap - n < 2048) buf = realloc(buf, cap *= 2);
        cr_assert(buf);
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got <= 0) break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static const char *header_value(const char *head, const char *name, char *out, size_t cap) {
    size_t nlen = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        const char *l = line + 2;
        if (strncasecmp(l, name, nlen) == 0 && l[nlen] == ':') {
            const char *v = l + nlen + 1;
            while (*v == ' ') v++;
            size_t vlen = strcspn(v, "\r\n");
            if (vlen >= cap) vlen = cap - 1;
            memcpy(out, v, vlen);
            out[vlen] = '\0';
            return out;
        }
    }
    return NULL;
}

static void dechunk(struct reply *r, const char *p, const char *end) {
    r->body = malloc((size_t)(end - p) + 1);
    cr_assert(r->body);
    r->body_len = 0;
    while (p < end) {
        char *after;
        unsigned long size = strtoul(p, &after, 16);
        const char *data = strstr(after, "\r\n");
        if (!data || size == 0) break;
        data += 2;
        cr_assert(data + size <= end, "chunk runs past the response");
        memcpy(r->body + r->body_len, data, size);
        r->body_len += size;
        p = data + size + 2;
    }
    r->body[r->body_len] = '\0';
}

static void parse_reply(const char *raw, size_t len, struct reply *r) {
    memset(r, 0, sizeof *r);
    const char *end_head = strstr(raw, "\r\n\r\n");
    cr_assert(end_head, "no complete response head in %zu bytes: '%.200s'", len, raw);
    size_t hlen = (size_t)(end_head - raw);
    cr_assert_lt(hlen, sizeof r->head);
    memcpy(r->head, raw, hlen);
    r->head[hlen] = '\0';
    cr_assert_eq(sscanf(raw, "HTTP/1.%*d %d", &r->status), 1, "status line: %.80s", raw);
    const char *body = end_head + 4, *end = raw + len;
    char te[64];
    if (header_value(r->head, "Transfer-Encoding", te, sizeof te) && strstr(te, "chunked")) {
        dechunk(r, body, end);
    } else {
        r->body_len = (size_t)(end - body);
        r->body = malloc(r->body_len + 1);
        cr_assert(r->body);
        memcpy(r->body, body, r->body_len);
        r->body[r->body_len] = '\0';
    }
    r->json = json_loadb(r->body, r->body_len, 0, NULL);
}

static void reply_free(struct reply *r) {
    free(r->body);
    json_decref(r->json);
    memset(r, 0, sizeof *r);
}

/* Sends raw bytes on a new connection and reads the response until the server closes. */
static void exchange(const char *raw, size_t len, struct reply *r) {
    int fd = connect_server();
    send_all(fd, raw, len);
    size_t n;
    char *buf = read_all(fd, &n);
    close(fd);
    parse_reply(buf, n, r);
    free(buf);
}

static void request(const char *method, const char *path, const char *key, struct reply *r) {
    char raw[4096];
    int n = snprintf(raw, sizeof raw, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s%s%s\r\n",
                     method, path, key ? "Authorization: Bearer " : "", key ? key : "",
                     key ? "\r\n" : "");
    exchange(raw, (size_t)n, r);
}

static const char *json_str(const json_t *obj, const char *path) {
    /* "a.b" walks objects */
    char key[64];
    const json_t *v = obj;
    while (v && *path) {
        size_t len = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)len, path);
        v = json_object_get(v, key);
        path += len + (path[len] == '.');
    }
    return json_string_value(v);
}

/* The OpenAI envelope with the given status, type and code. */
static void expect_error(const struct reply *r, int status, const char *type, const char *code) {
    cr_assert_eq(r->status, status, "status %d (want %d): %s", r->status, status, r->body);
    cr_assert(r->json, "error body is not JSON: %s", r->body);
    const json_t *e = json_object_get(r->json, "error");
    cr_assert(json_is_object(e), "no error object: %s", r->body);
    cr_assert(json_is_string(json_object_get(e, "message")));
    cr_assert_gt(strlen(json_string_value(json_object_get(e, "message"))), 0);
    cr_assert_str_eq(json_str(e, "type"), type, "%s", r->body);
    cr_assert(json_object_get(e, "param"), "param must be present (null allowed)");
    const json_t *c = json_object_get(e, "code");
    if (code) cr_assert_str_eq(json_string_value(c), code, "%s", r->body);
    char ctype[128];
    cr_assert(header_value(r->head, "Content-Type", ctype, sizeof ctype));
    cr_assert_str_eq(ctype, "application/json");
}

static void expect_status(const char *method, const char *path, const char *key, int status) {
    struct reply r;
    request(method, path, key, &r);
    cr_assert_eq(r.status, status, "%s %s: %d, want %d (%s)", method, path, r.status, status,
                 r.body);
    reply_free(&r);
}

/* ---------------------------------------------------------------- tests ---- */

Test(http, routes_and_params) {
    log_set_level(LOG_LEVEL_DEBUG); /* the per-request line path runs too */
    struct reply r;
    const char raw[] = "GET /v1/items/abc.1/sub/x:y-z_Q?q=hello%20world&other=1 HTTP/1.1\r\n"
                       "Host: t\r\nConnection: close\r\nAuthorization: Bearer sk-user\r\n"
                       "X-Test: yes\r\n\r\n";
    exchange(raw, sizeof raw - 1, &r);
    log_set_level(LOG_LEVEL_OFF);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(json_str(r.json, "method"), "GET");
    cr_assert_str_eq(json_str(r.json, "path"), "/v1/items/abc.1/sub/x:y-z_Q");
    json_t *params = json_object_get(r.json, "params");
    cr_assert_eq(json_array_size(params), 2);
    cr_assert_str_eq(json_string_value(json_array_get(params, 0)), "abc.1");
    cr_assert_str_eq(json_string_value(json_array_get(params, 1)), "x:y-z_Q");
    cr_assert_str_eq(json_str(r.json, "q"), "hello world");
    cr_assert_str_eq(json_str(r.json, "h"), "yes");
    cr_assert_str_eq(json_str(r.json, "project"), "proj-a");
    cr_assert_eq(json_integer_value(json_object_get(r.json, "key_id")), 1);
    cr_assert(json_is_false(json_object_get(r.json, "admin")));
    cr_assert_str_eq(json_str(r.json, "body"), "");
    reply_free(&r);

    request("DELETE", "/v1/items/a/sub/b", "sk-user", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(json_str(r.json, "method"), "DELETE");
    reply_free(&r);
}

Test(http, params_must_be_ids) {
    /* 1..HTTP_ID_BYTES-1 characters. */
    char longest[HTTP_ID_BYTES], too_long[HTTP_ID_BYTES + 1], path[2 * HTTP_ID_BYTES + 64];
    memset(longest, 'a', HTTP_ID_BYTES - 1);
    longest[HTTP_ID_BYTES - 1] = '\0';
    memset(too_long, 'b', HTTP_ID_BYTES);
    too_long[HTTP_ID_BYTES] = '\0';
    snprintf(path, sizeof path, "/v1/items/%s/sub/x", longest);
    expect_status("GET", path, "sk-user", 200);
    snprintf(path, sizeof path, "/v1/items/%s/sub/x", too_long);
    expect_status("GET", path, "sk-user", 404);
    const char *bad[] = {"/v1/items/a$b/sub/x", "/v1/items/a%2Fb/sub/x", "/v1/items/a%20b/sub/x",
                         "/v1/items//sub/x",    "/v1/items/%C3%A9/sub/x", "/v1/items/a/sub/x/",
                         "/v1/items/a/sub",     "/v1/items/a%00/sub/x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct reply r;
        request("GET", bad[i], "sk-user", &r);
        expect_error(&r, 404, "not_found_error", "not_found");
        reply_free(&r);
    }
}

Test(http, not_found_and_405_with_allow) {
    struct reply r;
    request("GET", "/v1/nothing", "sk-user", &r);
    expect_error(&r, 404, "not_found_error", "not_found");
    reply_free(&r);

    request("POST", "/v1/items/a/sub/b", "sk-user", &r);
    expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
    char allow[128];
    cr_assert(header_value(r.head, "Allow", allow, sizeof allow), "no Allow header: %s", r.head);
    cr_assert_str_eq(allow, "GET, DELETE");
    reply_free(&r);

    request("PATCH", "/healthz", NULL, &r);
    expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
    cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET");
    reply_free(&r);

    /* A method no route has is refused like a known one: 405 with the path's Allow. */
    const char *unknown[] = {"BREW", "TRACE", "PROPFIND", "PUT"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        request(unknown[i], "/healthz", NULL, &r);
        expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
        cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET");
        reply_free(&r);
        request(unknown[i], "/v1/items/a/sub/b", "sk-user", &r);
        expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
        cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET, DELETE");
        reply_free(&r);
    }
    request("TRACE", "/v1/nothing", NULL, &r);
    expect_error(&r, 404, "not_found_error", "not_found");
    reply_free(&r);

    /* HEAD runs the GET route; the head has the length, there is no body. */
    request("HEAD", "/healthz", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(r.body_len, 0);
    reply_free(&r);
}

/* OPTIONS answers every routed path with the same Allow a 405 would carry, without a key. */
Test(http, options_answers_allow) {
    struct reply r;
    char allow[128];
    request("OPTIONS", "/v1/items/a/sub/b", NULL, &r);
    cr_assert_eq(r.status, 204, "%s", r.body);
    cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET, DELETE");
    cr_assert_eq(r.body_len, 0);
    reply_free(&r);

    request("OPTIONS", "/v1/echo", "sk-user", &r);
    cr_assert_eq(r.status, 204);
    cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "POST");
    reply_free(&r);

    request("OPTIONS", "/v1/items/%C3%A9/sub/b", NULL, &r);
    cr_assert_eq(r.status, 204, "a bad id's path still has the route's methods");
    cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET, DELETE");
    reply_free(&r);

    request("OPTIONS", "/v1/nothing", NULL, &r);
    expect_error(&r, 404, "not_found_error", "not_found");
    reply_free(&r);
}

/* A path of a route's shape whose id is outside the alphabet: 404 naming the placeholder on
 * that route, for each of its methods, after the key is checked. */
Test(http, bad_ids_are_404_on_their_route) {
    struct reply r;
    const char *methods[] = {"GET", "DELETE"};
    for (int i = 0; i < 2; i++) {
        request(methods[i], "/v1/items/Y%C2%80x/sub/b", "sk-user", &r);
        expect_error(&r, 404, "not_found_error", "not_found");
        cr_assert_str_eq(json_str(r.json, "error.param"), "a", "%s", r.body);
        cr_assert(strstr(json_str(r.json, "error.message"), "'Y\xC2\x80x'"),
                  "the message quotes the id: %s", r.body);
        reply_free(&r);
    }
    request("GET", "/v1/items/ok/sub/null%2Cnull", "sk-user", &r);
    expect_error(&r, 404, "not_found_error", "not_found");
    cr_assert_str_eq(json_str(r.json, "error.param"), "b", "%s", r.body);
    cr_assert(strstr(json_str(r.json, "error.message"), "'null,null'"), "%s", r.body);
    reply_free(&r);

    request("POST", "/v1/items/Y%C2%80x/sub/b", "sk-user", &r);
    expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
    char allow[128];
    cr_assert_str_eq(header_value(r.head, "Allow", allow, sizeof allow), "GET, DELETE");
    reply_free(&r);

    expect_status("GET", "/v1/items/Y%C2%80x/sub/b", NULL, 401);
    expect_status("GET", "/v1/wait/a%24b", "sk-user", 404);
}

static const struct http_route SITE_ROUTES[] = {
    {"POST", "/v1/files", h_echo, 0},
    {"GET", "/v1/files/{file_id}", h_echo, 0},
    {"DELETE", "/v1/files/{file_id}", h_echo, 0},
    {"GET", "/healthz", h_echo, HTTP_PUBLIC},
    {"GET", "/", h_echo, HTTP_PUBLIC},
    {"GET", "/*", h_static, HTTP_PUBLIC},
};

/* smeltd's shape: the page's files under a catch-all route. A path under a route's first
 * segment never reaches it (a bad id is the route's 404, not the catch-all's 405). */
Test(http, catch_all_never_takes_api_paths) {
    server_down();
    struct http_config config = {.listen_address = "127.0.0.1", .threads = 2,
                                 .max_body_bytes = MAX_BODY, .max_upload_bytes = MAX_UPLOAD,
                                 .routes = SITE_ROUTES,
                                 .n_routes = (int)(sizeof SITE_ROUTES / sizeof SITE_ROUTES[0]),
                                 .auth = auth};
    struct smelt_error err;
    error_clear(&err);
    cr_assert_eq(http_server_start(&config, &g_server, &err), 0, "%s", err.message);
    struct reply r;
    char v[128];
    const char *methods[] = {"GET", "DELETE"};
    for (int i = 0; i < 2; i++) {
        request(methods[i], "/v1/files/Y%C2%80x", "sk-user", &r);
        expect_error(&r, 404, "not_found_error", "not_found");
        cr_assert_str_eq(json_str(r.json, "error.param"), "file_id", "%s", r.body);
        cr_assert_null(header_value(r.head, "X-Static", v, sizeof v));
        reply_free(&r);
    }
    request("TRACE", "/v1/files/Y%C2%80x", "sk-user", &r);
    expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
    cr_assert_str_eq(header_value(r.head, "Allow", v, sizeof v), "GET, DELETE");
    reply_free(&r);
    const char *api[] = {"/v1/unknown", "/v1/files/a/b", "/v1/files/", "/healthz/x", "/v1"};
    for (size_t i = 0; i < sizeof api / sizeof api[0]; i++) {
        request("GET", api[i], "sk-user", &r);
        expect_error(&r, 404, "not_found_error", "not_found");
        cr_assert_null(header_value(r.head, "X-Static", v, sizeof v), "%s went static", api[i]);
        reply_free(&r);
    }
    request("GET", "/app.js", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "app.js");
    reply_free(&r);
    request("DELETE", "/vendor/chart.js", NULL, &r);
    expect_error(&r, 405, "invalid_request_error", "method_not_allowed");
    cr_assert_str_eq(header_value(r.head, "Allow", v, sizeof v), "GET");
    reply_free(&r);
    request("OPTIONS", "/", NULL, &r);
    cr_assert_eq(r.status, 204);
    cr_assert_str_eq(header_value(r.head, "Allow", v, sizeof v), "GET");
    reply_free(&r);
}

Test(http, static_paths_refuse_traversal) {
    struct reply r;
    request("GET", "/static/css/site.css", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "css/site.css");
    char v[16];
    cr_assert_str_eq(header_value(r.head, "X-Static", v, sizeof v), "yes");
    reply_free(&r);

    request("GET", "/static/", NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_str_eq(r.body, "");
    reply_free(&r);

    const char *hostile[] = {"/static/../x",         "/static/%2e%2e/x",  "/static/%2E%2E/secret",
                             "/static/a/../../etc",  "/static/..",        "/static//etc/passwd",
                             "/static/a//b",         "/static/./x",       "/static/a\\b",
                             "/static/a%5c..%5cb",   "/static/a%00b",     "/static/a%2f..%2fb",
                             "//static/x",           "/static/a/%2e%2e"};
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        request("GET", hostile[i], NULL, &r);
        cr_assert_eq(r.status, 404, "%s: %d %s", hostile[i], r.status, r.body);
        expect_error(&r, 404, "not_found_error", "not_found");
        reply_free(&r);
    }
}

Test(http, auth_401_403) {
    struct reply r;
    request("GET", "/v1/items/a/sub/b", NULL, &r);
    expect_error(&r, 401, "authentication_error", "missing_api_key");
    reply_free(&r);

    request("GET", "/v1/items/a/sub/b", "sk-wrong", &r);
    expect_error(&r, 401, "authentication_error", "invalid_api_key");
    reply_free(&r);

    const char basic[] = "GET /v1/items/a/sub/b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                         "Authorization: Basic dXNlcjpwdw==\r\n\r\n";
    exchange(basic, sizeof basic - 1, &r);
    expect_error(&r, 401, "authentication_error", "missing_api_key");
    reply_free(&r);

    const char lower[] = "GET /v1/items/a/sub/b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                         "authorization: bearer   sk-user  \r\n\r\n";
    exchange(lower, sizeof lower - 1, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    reply_free(&r);

    request("GET", "/v1/admin/thing", "sk-user", &r);
    expect_error(&r, 403, "permission_error", "admin_key_required");
    reply_free(&r);

    request("GET", "/v1/admin/thing", "sk-admin", &r);
    cr_assert_eq(r.status, 200);
    cr_assert(json_is_true(json_object_get(r.json, "admin")));
    cr_assert_str_eq(json_str(r.json, "project"), "ops");
    reply_free(&r);

    expect_status("GET", "/healthz", NULL, 200);
    /* An unknown route says 404 before asking for a key. */
    expect_status("GET", "/v1/unknown", NULL, 404);
}

/* The Tinker SDK's "X-API-Key: tml-<key>" counts on /api/v1/ routes only. */
Test(http, tinker_sdk_key_header) {
    struct reply r;
    const char tinker[] = "POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                          "X-API-Key: tml-sk-user\r\nContent-Length: 0\r\n\r\n";
    exchange(tinker, sizeof tinker - 1, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(json_str(r.json, "project"), "proj-a");
    reply_free(&r);

    const char wrong[] = "POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                         "X-API-Key: tml-sk-wrong\r\nContent-Length: 0\r\n\r\n";
    exchange(wrong, sizeof wrong - 1, &r);
    expect_error(&r, 401, "authentication_error", "invalid_api_key");
    reply_free(&r);

    const char elsewhere[] = "POST /v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                             "X-API-Key: tml-sk-user\r\nContent-Length: 0\r\n\r\n";
    exchange(elsewhere, sizeof elsewhere - 1, &r);
    expect_error(&r, 401, "authentication_error", "missing_api_key");
    reply_free(&r);
}

Test(http, post_body_reaches_handler) {
    struct reply r;
    const char raw[] = "POST /v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                       "Authorization: Bearer sk-user\r\nContent-Type: application/json\r\n"
                       "Content-Length: 14\r\n\r\n{\"model\":\"m1\"}";
    exchange(raw, sizeof raw - 1, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(json_str(r.json, "body"), "{\"model\":\"m1\"}");
    reply_free(&r);

    /* A body on GET is read and ignored. */
    const char get[] = "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                       "Content-Length: 5\r\n\r\nhello";
    exchange(get, sizeof get - 1, &r);
    cr_assert_eq(r.status, 200);
    reply_free(&r);

    /* Exactly the limit is fine. */
    char *big = malloc(MAX_BODY + 256);
    cr_assert(big);
    int head = snprintf(big, 256, "POST /v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                  "Authorization: Bearer sk-user\r\nContent-Length: %d\r\n\r\n",
                        MAX_BODY);
    memset(big + head, 'z', MAX_BODY);
    exchange(big, (size_t)head + MAX_BODY, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(strlen(json_str(r.json, "body")), MAX_BODY);
    reply_free(&r);
    free(big);
}

Test(http, too_large_by_content_length) {
    /* Refused from the headers: no body is ever sent, the answer still comes at once. */
    struct reply r;
    double t0 = now_s();
    const char raw[] = "POST /v1/echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-user\r\n"
                       "Content-Length: 100000\r\n\r\n";
    exchange(raw, sizeof raw - 1, &r);
    expect_error(&r, 413, "invalid_request_error", "request_too_large");
    cr_assert_lt(now_s() - t0, 2.0);
    reply_free(&r);

    const char expect[] = "POST /v1/echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-user\r\n"
                          "Expect: 100-continue\r\nContent-Length: 100000\r\n\r\n";
    exchange(expect, sizeof expect - 1, &r);
    cr_assert_eq(r.status, 413, "no 100 Continue before the refusal: %s", r.head);
    reply_free(&r);

    /* The upload route takes more than max_body_bytes, but not more than its own limit. */
    char raw2[256];
    int n = snprintf(raw2, sizeof raw2, "POST /v1/files HTTP/1.1\r\nHost: t\r\n"
                                        "Authorization: Bearer sk-user\r\n"
                                        "Content-Type: multipart/form-data; boundary=x\r\n"
                                        "Content-Length: %d\r\n\r\n", MAX_UPLOAD + 1);
    exchange(raw2, (size_t)n, &r);
    expect_error(&r, 413, "invalid_request_error", "request_too_large");
    reply_free(&r);
}

static size_t append_chunk(char *dst, const char *data, size_t len) {
    int n = sprintf(dst, "%zx\r\n", len);
    memcpy(dst + n, data, len);
    memcpy(dst + n + len, "\r\n", 2);
    return (size_t)n + len + 2;
}

Test(http, too_large_by_chunked_body) {
    char *raw = malloc(16384);
    cr_assert(raw);
    char chunk[500];
    memset(chunk, 'c', sizeof chunk);
    /* A keep-alive request: the server still closes after refusing it. */
    size_t n = (size_t)sprintf(raw, "POST /v1/echo HTTP/1.1\r\nHost: t\r\n"
                                    "Authorization: Bearer sk-user\r\n"
                                    "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 5; i++) n += append_chunk(raw + n, chunk, sizeof chunk); /* 2500 > 1024 */
    n += (size_t)sprintf(raw + n, "0\r\n\r\n");
    struct reply r;
    double t0 = now_s();
    exchange(raw, n, &r);
    cr_assert_lt(now_s() - t0, 2.0, "the connection stayed open after the 413");
    expect_error(&r, 413, "invalid_request_error", "request_too_large");
    char conn[32];
    cr_assert_str_eq(header_value(r.head, "Connection", conn, sizeof conn), "close");
    reply_free(&r);

    /* Under the limit, the chunks are joined. */
    n = (size_t)sprintf(raw, "POST /v1/echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                             "Authorization: Bearer sk-user\r\nTransfer-Encoding: chunked\r\n\r\n");
    n += append_chunk(raw + n, "hello ", 6);
    n += append_chunk(raw + n, "world", 5);
    n += (size_t)sprintf(raw + n, "0\r\n\r\n");
    exchange(raw, n, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(json_str(r.json, "body"), "hello world");
    reply_free(&r);
    free(raw);
}

/* POSTs a multipart body to /v1/files with the given Content-Type. */
static void post_multipart(const char *content_type, const char *body, size_t len,
                           struct reply *r) {
    char *raw = malloc(len + 512);
    cr_assert(raw);
    int head = snprintf(raw, 512, "POST /v1/files HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                  "Authorization: Bearer sk-user\r\nContent-Type: %s\r\n"
                                  "Content-Length: %zu\r\n\r\n", content_type, len);
    memcpy(raw + head, body, len);
    exchange(raw, (size_t)head + len, r);
    free(raw);
}

static size_t put(char *dst, const void *src, size_t len) {
    memcpy(dst, src, len);
    return len;
}

#define PUTS(dst, s) put((dst), (s), sizeof(s) - 1)

Test(http, multipart_binary_file) {
    /* The file holds NULs, CRLFs, "--", and "CRLF--boundary" followed by other text
     * (not a delimiter), which must all come through unchanged. */
    static const char b[] = "a1b2c3boundary";
    unsigned char file[6000];
    for (size_t i = 0; i < sizeof file; i++) file[i] = (unsigned char)((i * 31 + 7) % 256);
    memcpy(file + 10, "\0\0\r\n--\r\n\r\n--", 12);
    memcpy(file + 100, "\r\n--a1b2c3boundaryX", 19);
    memcpy(file + 200, "\r\n--a1b2c3bound\r\n", 17);
    memcpy(file + sizeof file - 4, "\r\n--", 4); /* ends in a delimiter-like tail */

    char *body = malloc(sizeof file + 1024);
    cr_assert(body);
    size_t n = 0;
    n += PUTS(body + n, "--a1b2c3boundary\r\n"
                        "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                        "fine-tune\r\n"
                        "--a1b2c3boundary\r\n"
                        "Content-Disposition: form-data; name=\"file\"; filename=\"train.jsonl\"\r\n"
                        "Content-Type: application/octet-stream\r\n\r\n");
    n += put(body + n, file, sizeof file);
    n += PUTS(body + n, "\r\n--a1b2c3boundary--\r\n");

    struct reply r;
    char ctype[128];
    snprintf(ctype, sizeof ctype, "multipart/form-data; boundary=%s", b);
    post_multipart(ctype, body, n, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *parts = json_object_get(r.json, "parts");
    cr_assert_eq(json_array_size(parts), 2, "%s", r.body);
    json_t *p0 = json_array_get(parts, 0), *p1 = json_array_get(parts, 1);
    cr_assert_str_eq(json_str(p0, "name"), "purpose");
    cr_assert_str_eq(json_str(p0, "filename"), "");
    cr_assert_str_eq(json_str(p0, "content_type"), "");
    char hex[65];
    sha256_hex("fine-tune", 9, hex);
    cr_assert_str_eq(json_str(p0, "sha256"), hex);
    cr_assert_str_eq(json_str(p1, "name"), "file");
    cr_assert_str_eq(json_str(p1, "filename"), "train.jsonl");
    cr_assert_str_eq(json_str(p1, "content_type"), "application/octet-stream");
    cr_assert_eq(json_integer_value(json_object_get(p1, "len")), (json_int_t)sizeof file);
    sha256_hex(file, sizeof file, hex);
    cr_assert_str_eq(json_str(p1, "sha256"), hex);
    reply_free(&r);

    /* Quoted boundary, a preamble, an empty part, padding after a delimiter, escaped
     * quotes in a filename, an epilogue. */
    n = 0;
    n += PUTS(body + n, "preamble to ignore\r\n"
                        "--q:b=1   \r\n"
                        "content-disposition: form-data; name=empty\r\n\r\n"
                        "\r\n--q:b=1\r\n"
                        "Content-Disposition: form-data; name=\"f\"; filename=\"a \\\"b\\\".txt\"\r\n"
                        "Content-Type: text/plain\r\n\r\n"
                        "x\r\n--q:b=1--\r\nepilogue");
    post_multipart("multipart/form-data; charset=utf-8; boundary=\"q:b=1\"", body, n, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    parts = json_object_get(r.json, "parts");
    cr_assert_eq(json_array_size(parts), 2, "%s", r.body);
    cr_assert_str_eq(json_str(json_array_get(parts, 0), "name"), "empty");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(parts, 0), "len")), 0);
    cr_assert_str_eq(json_str(json_array_get(parts, 1), "filename"), "a \"b\".txt");
    cr_assert_str_eq(json_str(json_array_get(parts, 1), "content_type"), "text/plain");
    reply_free(&r);
    free(body);
}

Test(http, multipart_large_upload_and_ext_filename) {
    /* Near max_upload_bytes: far past max_body_bytes and MHD's per-connection memory. */
    size_t file_len = MAX_UPLOAD - 512;
    char *body = malloc(MAX_UPLOAD);
    cr_assert(body);
    size_t n = 0;
    n += PUTS(body + n, "--zz\r\nContent-Disposition: form-data; name=\"file\"; "
                        "filename*=UTF-8''d%C3%A9j%C3%A0%20vu.jsonl\r\n\r\n");
    for (size_t i = 0; i < file_len; i++) body[n + i] = (char)('a' + i % 26);
    char hex[65];
    sha256_hex(body + n, file_len, hex);
    n += file_len;
    n += PUTS(body + n, "\r\n--zz--\r\n");
    cr_assert_leq(n, MAX_UPLOAD);
    struct reply r;
    post_multipart("multipart/form-data; boundary=zz", body, n, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *part = json_array_get(json_object_get(r.json, "parts"), 0);
    cr_assert_str_eq(json_str(part, "filename"), "d\xc3\xa9j\xc3\xa0 vu.jsonl");
    cr_assert_eq(json_integer_value(json_object_get(part, "len")), (json_int_t)file_len);
    cr_assert_str_eq(json_str(part, "sha256"), hex);
    reply_free(&r);
    free(body);
}

static void expect_multipart_error(const char *ctype, const char *body, const char *says) {
    struct reply r;
    post_multipart(ctype, body, strlen(body), &r);
    expect_error(&r, 400, "invalid_request_error", "invalid_multipart");
    const char *msg = json_str(r.json, "error.message");
    cr_assert(strstr(msg, says), "'%s' does not say '%s'", msg, says);
    reply_free(&r);
}

Test(http, multipart_malformed) {
    const char *ok_ctype = "multipart/form-data; boundary=XX";
    expect_multipart_error("multipart/form-data", "--XX\r\n", "no boundary parameter");
    expect_multipart_error("application/json", "{}", "not multipart/form-data");
    expect_multipart_error("multipart/form-data; boundary=\"XX", "--XX\r\n", "unterminated");
    expect_multipart_error(ok_ctype, "no delimiter at all", "no '--XX' boundary line");
    expect_multipart_error(ok_ctype,
                           "--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nabc",
                           "no boundary after its data");
    expect_multipart_error(ok_ctype,
                           "--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nabc\r\n--XXY",
                           "no boundary after its data");
    expect_multipart_error(ok_ctype, "--XX\r\nContent-Disposition: form-data\r\n\r\nabc\r\n--XX--",
                           "has no name");
    expect_multipart_error(ok_ctype, "--XX\r\nContent-Type: text/plain\r\n\r\nabc\r\n--XX--",
                           "no Content-Disposition");
    expect_multipart_error(ok_ctype, "--XX\r\n\r\nabc\r\n--XX--", "no Content-Disposition");
    expect_multipart_error(ok_ctype, "--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n",
                           "blank line");
    expect_multipart_error(ok_ctype, "--XX\r\nno colon here\r\n\r\nabc\r\n--XX--", "without 'Name:'");
    expect_multipart_error(ok_ctype, "--XX\r\nContent-Disposition: attachment; name=a\r\n\r\n\r\n--XX--",
                           "not form-data");
    char many[1024] = "";
    for (int i = 0; i < 5; i++)
        strcat(many, "--XX\r\nContent-Disposition: form-data; name=\"p\"\r\n\r\nv\r\n");
    strcat(many, "--XX--");
    expect_multipart_error(ok_ctype, many, "more than 4 parts");
    char long_name[400];
    snprintf(long_name, sizeof long_name,
             "--XX\r\nContent-Disposition: form-data; name=\"%0200d\"\r\n\r\nv\r\n--XX--", 0);
    expect_multipart_error(ok_ctype, long_name, "name is longer than 127 bytes");

    /* No Content-Type header at all. */
    struct reply r;
    const char raw[] = "POST /v1/files HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                       "Authorization: Bearer sk-user\r\nContent-Length: 4\r\n\r\n--XX";
    exchange(raw, sizeof raw - 1, &r);
    expect_error(&r, 400, "invalid_request_error", "invalid_multipart");
    reply_free(&r);
}

Test(http, handler_bugs_become_500) {
    struct reply r;
    request("GET", "/v1/empty", "sk-user", &r);
    expect_error(&r, 500, "server_error", "internal_error");
    reply_free(&r);
    request("GET", "/v1/no_status", "sk-user", &r);
    expect_error(&r, 500, "server_error", "internal_error");
    reply_free(&r);
    request("GET", "/v1/many_headers", "sk-user", &r);
    expect_error(&r, 500, "server_error", "internal_error");
    reply_free(&r);
    expect_status("GET", "/healthz", NULL, 200);
}

/* Reads from fd into buf (appending at *len) until needle appears or timeout_s pass. */
static bool read_until(int fd, char *buf, size_t cap, size_t *len, const char *needle,
                       double timeout_s) {
    double deadline = now_s() + timeout_s;
    while (!strstr(buf, needle)) {
        double left = deadline - now_s();
        if (left <= 0) return false;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t n = recv(fd, buf + *len, cap - *len - 1, 0);
        if (n <= 0) return false;
        *len += (size_t)n;
        buf[*len] = '\0';
    }
    return true;
}

static int open_stream(char *buf, size_t cap, size_t *len) {
    int fd = connect_server();
    const char raw[] = "GET /v1/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-user\r\n"
                       "Accept: text/event-stream\r\n\r\n";
    send_all(fd, raw, sizeof raw - 1);
    *len = 0;
    buf[0] = '\0';
    cr_assert(read_until(fd, buf, cap, len, "\r\n\r\n", 2.0), "no stream head: %s", buf);
    cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%s", buf);
    char v[64];
    cr_assert_str_eq(header_value(buf, "Content-Type", v, sizeof v), "text/event-stream");
    cr_assert_str_eq(header_value(buf, "Cache-Control", v, sizeof v), "no-cache");
    return fd;
}

static double cpu_seconds(void) {
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Waits until *counter reaches want; whether it is exactly want then. */
static bool wait_for_count(atomic_int *counter, int want, double timeout_s) {
    double deadline = now_s() + timeout_s;
    while (atomic_load(counter) < want && now_s() < deadline) usleep(10000);
    return atomic_load(counter) == want;
}

static bool wait_for_frees(int want, double timeout_s) {
    return wait_for_count(&g_stream_frees, want, timeout_s);
}

Test(http, sse_events_suspend_and_wake) {
    atomic_store(&g_events_available, 2);
    char buf[16384];
    size_t len;
    int fd = open_stream(buf, sizeof buf, &len);
    cr_assert(read_until(fd, buf, sizeof buf, &len, "data: {\"n\":1}\n\n", 2.0), "%s", buf);
    cr_assert(strstr(buf, "id: 0\nevent: tick\ndata: {\"n\":0}\n\n"), "%s", buf);

    /* Nothing new: the connection is suspended, next() is not asked again and the
     * process stays idle. */
    usleep(50000);
    long nexts = atomic_load(&g_stream_nexts);
    double cpu0 = cpu_seconds(), t0 = now_s();
    usleep(300000);
    double cpu = cpu_seconds() - cpu0, wall = now_s() - t0;
    cr_assert_eq(atomic_load(&g_stream_nexts), nexts, "next() was polled while idle");
    cr_assert_lt(cpu, 0.05, "%.3f s of CPU in %.3f s idle", cpu, wall);

    atomic_store(&g_events_available, 3);
    http_streams_wake(g_server);
    cr_assert(read_until(fd, buf, sizeof buf, &len, "id: 2\n", 2.0), "no event after wake: %s",
              buf);
    /* A wake with nothing new suspends again. */
    http_streams_wake(g_server);
    usleep(50000);
    cr_assert_eq(atomic_load(&g_stream_frees), 0);

    close(fd);
    cr_assert(wait_for_frees(1, 2.0), "stream_free not called after the client left");
    usleep(300000);
    cr_assert_eq(atomic_load(&g_stream_frees), 1, "stream_free called more than once");
    expect_status("GET", "/healthz", NULL, 200);
}

Test(http, sse_stream_ends_when_next_says_so) {
    atomic_store(&g_events_available, 1);
    char buf[8192];
    size_t len;
    int fd = open_stream(buf, sizeof buf, &len);
    cr_assert(read_until(fd, buf, sizeof buf, &len, "id: 0\n", 2.0));
    atomic_store(&g_events_end, 1);
    http_streams_wake(g_server);
    cr_assert(read_until(fd, buf, sizeof buf, &len, "\r\n0\r\n\r\n", 2.0),
              "no final chunk: %s", buf);
    close(fd);
    cr_assert(wait_for_frees(1, 2.0));
}

Test(http, sse_many_streams_and_disconnects) {
    enum { N = 6 };
    atomic_store(&g_events_available, 1);
    int fds[N];
    char buf[8192];
    size_t len;
    for (int i = 0; i < N; i++) {
        fds[i] = open_stream(buf, sizeof buf, &len);
        cr_assert(read_until(fds[i], buf, sizeof buf, &len, "id: 0\n", 2.0));
    }
    /* Suspended streams whose clients leave are noticed without any wake. */
    for (int i = 0; i < N / 2; i++) close(fds[i]);
    cr_assert(wait_for_frees(N / 2, 2.0), "%d of %d freed", atomic_load(&g_stream_frees), N / 2);
    atomic_store(&g_events_available, 2);
    http_streams_wake(g_server);
    for (int i = N / 2; i < N; i++) {
        len = 0;
        buf[0] = '\0';
        cr_assert(read_until(fds[i], buf, sizeof buf, &len, "id: 1\n", 2.0), "stream %d", i);
        close(fds[i]);
    }
    cr_assert(wait_for_frees(N, 2.0));
}

Test(http, stop_with_open_stream_is_prompt) {
    atomic_store(&g_events_available, 0);
    char buf[4096];
    size_t len;
    int fd = open_stream(buf, sizeof buf, &len); /* headers come before any event */
    usleep(50000);
    double t0 = now_s();
    http_server_stop(g_server);
    g_server = NULL;
    cr_assert_lt(now_s() - t0, 1.0, "stop took %.2f s", now_s() - t0);
    cr_assert_eq(atomic_load(&g_stream_frees), 1);
    close(fd);
}

/* ------------------------------------------------------ deferred answers ---- */

static int send_wait(const char *key, int ms) {
    int fd = connect_server();
    char raw[256];
    int n = snprintf(raw, sizeof raw, "GET /v1/wait/%s?ms=%d HTTP/1.1\r\nHost: t\r\n"
                     "Connection: close\r\nAuthorization: Bearer sk-user\r\n\r\n", key, ms);
    send_all(fd, raw, (size_t)n);
    return fd;
}

/* The answer's body on fd (read until the server closes). */
static void expect_answer(int fd, const char *body) {
    size_t n;
    char *buf = read_all(fd, &n);
    close(fd);
    struct reply r;
    parse_reply(buf, n, &r);
    free(buf);
    cr_assert_eq(r.status, 200, "%s", r.head);
    cr_assert_str_eq(r.body, body);
    reply_free(&r);
}

static bool readable_within(int fd, int ms) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    return poll(&pfd, 1, ms) > 0;
}

static bool wait_for_deferred_frees(int want, double timeout_s) {
    return wait_for_count(&g_deferred_frees, want, timeout_s);
}

static void *wake_later(void *arg) {
    (void)arg;
    usleep(100000);
    atomic_store(&g_deferred_ready, 1);
    http_deferred_wake(g_server, "k1");
    return NULL;
}

Test(http, deferred_woken_by_another_thread) {
    int fd = send_wait("k1", 5000);
    cr_assert_not(readable_within(fd, 300), "a deferred request was answered before its wake");
    /* Suspended: fn is not polled, and a wake for another key leaves it alone. */
    int calls = atomic_load(&g_deferred_calls);
    http_deferred_wake(g_server, "other");
    usleep(200000);
    cr_assert_eq(atomic_load(&g_deferred_calls), calls, "fn was asked while nothing woke it");
    cr_assert_not(readable_within(fd, 0));

    pthread_t t;
    double t0 = now_s();
    cr_assert_eq(pthread_create(&t, NULL, wake_later, NULL), 0);
    expect_answer(fd, "ready:k1");
    pthread_join(t, NULL);
    cr_assert_lt(now_s() - t0, 1.0, "the woken answer took %.2f s", now_s() - t0);
    cr_assert(wait_for_deferred_frees(1, 2.0));
}

Test(http, deferred_answers_at_its_deadline) {
    double t0 = now_s();
    int fd = send_wait("k2", 600);
    expect_answer(fd, "deadline:k2");
    double took = now_s() - t0;
    cr_assert(took >= 0.55 && took < 1.5, "answered after %.2f s for a 0.6 s deadline", took);
    cr_assert(wait_for_deferred_frees(1, 2.0));
}

Test(http, deferred_client_leaving_frees_its_context) {
    int fd = send_wait("k3", 10000);
    usleep(100000);
    close(fd);
    cr_assert(wait_for_deferred_frees(1, 2.0), "ctx not freed after the client left");
    /* Stopping with one still waiting ends it at once and frees it too. */
    fd = send_wait("k4", 10000);
    usleep(100000);
    double t0 = now_s();
    http_server_stop(g_server);
    g_server = NULL;
    cr_assert_lt(now_s() - t0, 1.0, "stop took %.2f s", now_s() - t0);
    cr_assert_eq(atomic_load(&g_deferred_frees), 2);
    close(fd);
}

Test(http, deferred_many_leave_the_pool_free) {
    enum { N = 16 };
    http_server_stop(g_server);
    server_start(2);
    int fds[N];
    for (int i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "m%d", i);
        fds[i] = send_wait(key, 10000);
    }
    usleep(200000);
    double t0 = now_s();
    expect_status("GET", "/healthz", NULL, 200);
    cr_assert_lt(now_s() - t0, 0.5, "a plain GET waited %.2f s behind deferred requests", now_s() - t0);
    for (int i = 0; i < N; i++) cr_assert_not(readable_within(fds[i], 0), "request %d answered early", i);
    atomic_store(&g_deferred_ready, 1);
    http_deferred_wake(g_server, NULL);
    for (int i = 0; i < N; i++) {
        char body[32];
        snprintf(body, sizeof body, "ready:m%d", i);
        expect_answer(fds[i], body);
    }
    cr_assert(wait_for_deferred_frees(N, 2.0));
}

Test(http, stats_count_responses) {
    expect_status("GET", "/healthz", NULL, 200);
    expect_status("GET", "/nope", NULL, 404);
    expect_status("GET", "/v1/items/a/sub/b", NULL, 401);
    expect_status("GET", "/v1/empty", "sk-user", 500);
    struct http_stats s;
    double deadline = now_s() + 2.0;
    do {
        http_server_stats(g_server, &s);
    } while (s.latency_count < 4 && now_s() < deadline && usleep(5000) == 0);
    cr_assert_eq(s.requests_by_class[2], 1);
    cr_assert_eq(s.requests_by_class[4], 2);
    cr_assert_eq(s.requests_by_class[5], 1);
    cr_assert_eq(s.latency_count, 4);
    cr_assert(s.latency_sum_s > 0 && s.latency_sum_s < 4.0);
    for (int i = 1; i < HTTP_N_LATENCY_BUCKETS; i++) {
        cr_assert_leq(s.latency_buckets[i - 1], s.latency_buckets[i], "buckets are cumulative");
        cr_assert_lt(HTTP_LATENCY_BOUNDS[i - 1], HTTP_LATENCY_BOUNDS[i]);
    }
    cr_assert_leq(s.latency_buckets[HTTP_N_LATENCY_BUCKETS - 1], s.latency_count);
    cr_assert_gt(s.latency_buckets[HTTP_N_LATENCY_BUCKETS - 1], 0, "local requests take < 1 s");
}

/* Reads whatever comes within timeout_s (or until the server closes); returns the
 * status of a response among it, or 0. */
static int drain(int fd, double timeout_s) {
    char buf[4096];
    size_t len = 0;
    buf[0] = '\0';
    read_until(fd, buf, sizeof buf, &len, "\r\n\r\n", timeout_s);
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = 0;
    return status;
}

Test(http, survives_garbage_and_half_closed) {
    /* MHD answers what it can parse with 4xx/5xx itself; for the rest it waits for more
     * (until the connection timeout). Either way the server goes on serving. */
    static const struct { const char *raw; int status; } garbage[] = {
        {"\x16\x03\x01\x02\x01\x01\x02\x01\xfc\x03\x03 tls hello\r\n\r\n", 400},
        {"GET /healthz HTTP/9.9\r\n\r\n", 505},
        {"GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n", 400},
        {"GET /healthz HTTP/1.1\r\nHost: t\r\nNo colon header\r\n\r\n", 400},
        {"GET\r\n\r\n", 0},
        {"\r\n\r\n\r\n", 0},
    };
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        int fd = connect_server();
        send_all(fd, garbage[i].raw, strlen(garbage[i].raw));
        int status = drain(fd, garbage[i].status ? 2.0 : 0.2);
        if (garbage[i].status) cr_assert_eq(status, garbage[i].status, "garbage %zu", i);
        close(fd);
    }
    /* Binary junk with NULs. */
    int fd = connect_server();
    char junk[300];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 13);
    send_all(fd, junk, sizeof junk);
    drain(fd, 0.2);
    close(fd);

    /* Half a body, then the client stops writing but stays. */
    int half = connect_server();
    const char partial[] = "POST /v1/echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-user\r\n"
                           "Content-Length: 50\r\n\r\nonly part";
    send_all(half, partial, sizeof partial - 1);
    shutdown(half, SHUT_WR);
    /* Whole keep-alive requests, then a half-close: the answer comes and the server
     * closes at once (with epoll, MHD alone may miss a FIN that came with the request). */
    const char *whole[] = {"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
                           "POST /v1/echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-user\r\n"
                           "Content-Length: 2\r\n\r\n{}"};
    for (int i = 0; i < 20; i++) {
        fd = connect_server();
        send_all(fd, whole[i % 2], strlen(whole[i % 2]));
        shutdown(fd, SHUT_WR);
        double t0 = now_s();
        size_t n;
        char *all = read_all(fd, &n);
        cr_assert_lt(now_s() - t0, 2.0, "request %d: no close after a half-close", i);
        cr_assert(strncmp(all, "HTTP/1.1 200", 12) == 0, "%s", all);
        free(all);
        close(fd);
    }

    /* A client that connects and leaves at once, and one that sends nothing. */
    close(connect_server());
    int idle = connect_server();

    expect_status("GET", "/healthz", NULL, 200);
    close(idle);
    close(half);
    expect_status("GET", "/healthz", NULL, 200);
}

Test(http, keep_alive_serves_several_requests) {
    int fd = connect_server();
    const char two[] = "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
                       "GET /static/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    send_all(fd, two, sizeof two - 1);
    size_t n;
    char *all = read_all(fd, &n);
    close(fd);
    cr_assert(strstr(all, "HTTP/1.1 200"), "%s", all);
    char *second = strstr(strstr(all, "HTTP/1.1 200") + 1, "HTTP/1.1 200");
    cr_assert(second, "second response missing: %s", all);
    cr_assert(strstr(second, "\r\n\r\nx"), "%s", second);
    free(all);
}

struct hammer_arg {
    int ok;
};

static void *hammer(void *arg) {
    struct hammer_arg *a = arg;
    for (int i = 0; i < 20; i++) {
        struct reply r;
        request("GET", "/v1/items/a/sub/b", "sk-user", &r);
        a->ok += r.status == 200;
        reply_free(&r);
    }
    return NULL;
}

Test(http, concurrent_clients) {
    enum { T = 8 };
    pthread_t threads[T];
    struct hammer_arg args[T];
    memset(args, 0, sizeof args);
    for (int i = 0; i < T; i++) cr_assert_eq(pthread_create(&threads[i], NULL, hammer, &args[i]), 0);
    int ok = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(threads[i], NULL);
        ok += args[i].ok;
    }
    cr_assert_eq(ok, T * 20);
    struct http_stats s;
    http_server_stats(g_server, &s);
    cr_assert_eq(s.requests_by_class[2], T * 20);
}

/* ----------------------------------------------------- without a server ---- */

Test(http_reply, error_envelope_types_and_utf8) {
    struct http_response res;
    static const struct { int status; const char *type; } cases[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
        {404, "not_found_error"},       {409, "conflict_error"},       {429, "rate_limit_error"},
        {413, "invalid_request_error"}, {500, "server_error"},         {503, "server_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&res, 0, sizeof res);
        http_reply_error(&res, cases[i].status, "field", "some_code", "bad %s", "thing");
        json_t *v = json_loadb(res.body, res.body_len, 0, NULL);
        cr_assert(v, "%s", res.body);
        cr_assert_eq(res.status, cases[i].status);
        cr_assert_str_eq(res.content_type, "application/json");
        cr_assert_str_eq(json_str(v, "error.type"), cases[i].type);
        cr_assert_str_eq(json_str(v, "error.message"), "bad thing");
        cr_assert_str_eq(json_str(v, "error.param"), "field");
        cr_assert_str_eq(json_str(v, "error.code"), "some_code");
        json_decref(v);
        free(res.body);
    }
    /* Invalid UTF-8 from a client is replaced, never dropping the envelope; NULL param and
     * code are JSON nulls; a second reply replaces the first body. */
    memset(&res, 0, sizeof res);
    http_reply_text(&res, 200, "text/plain", "first", 5);
    http_reply_error(&res, 404, NULL, NULL, "no file %s", "a\xff\xc3(b\xe2\x82");
    json_t *v = json_loadb(res.body, res.body_len, 0, NULL);
    cr_assert(v, "%s", res.body);
    cr_assert_str_eq(json_str(v, "error.message"), "no file a?" "?(b?" "?");
    cr_assert(json_is_null(json_object_get(json_object_get(v, "error"), "param")));
    cr_assert(json_is_null(json_object_get(json_object_get(v, "error"), "code")));
    json_decref(v);
    free(res.body);
}

Test(http_reply, json_text_and_headers) {
    struct http_response res;
    memset(&res, 0, sizeof res);
    http_reply_json(&res, 201, json_pack("{s:i}", "a", 1));
    cr_assert_eq(res.status, 201);
    cr_assert_str_eq(res.body, "{\"a\":1}");
    cr_assert_eq(res.body_len, 7);
    http_reply_json(&res, 200, NULL); /* a failed json_pack leaves no body: a 500 later */
    cr_assert_null(res.body);
    http_reply_text(&res, 200, "text/plain", "a\0b", 3);
    cr_assert_eq(res.body_len, 3);
    cr_assert_eq(memcmp(res.body, "a\0b", 4), 0);
    free(res.body);

    memset(&res, 0, sizeof res);
    for (int i = 0; i < HTTP_MAX_HEADERS; i++) http_add_header(&res, "X-A", "v");
    cr_assert_eq(res.n_headers, HTTP_MAX_HEADERS);
    http_add_header(&res, "X-B", "v");
    cr_assert_gt(res.n_headers, HTTP_MAX_HEADERS, "overflow is marked, not dropped");
}

Test(http_server, start_errors_and_ports) {
    struct http_server *s = NULL;
    struct smelt_error err;
    struct http_config config = {.listen_address = "not-an-address", .threads = 1,
                                 .routes = ROUTES, .n_routes = 1, .max_body_bytes = 10};
    error_clear(&err);
    cr_assert_eq(http_server_start(&config, &s, &err), SMELT_EINVAL);
    cr_assert(strstr(err.message, "not-an-address"), "%s", err.message);
    cr_assert_null(s);

    static const struct http_route bad_star[] = {{"GET", "/a/*/b", h_echo, 0}};
    config.listen_address = "127.0.0.1";
    config.routes = bad_star;
    cr_assert_eq(http_server_start(&config, &s, &err), SMELT_EINVAL);

    /* Two servers on ephemeral ports; the second cannot take the first one's port. */
    config.routes = ROUTES;
    error_clear(&err);
    cr_assert_eq(http_server_start(&config, &s, &err), 0, "%s", err.message);
    struct http_server *again = NULL;
    config.port = http_server_port(s);
    cr_assert_eq(http_server_start(&config, &again, &err), SMELT_EIO);
    cr_assert_null(again);
    http_server_stop(s);
    http_server_stop(NULL);

    config.listen_address = "::1";
    config.port = 0;
    error_clear(&err);
    if (http_server_start(&config, &s, &err) == 0) { /* hosts without IPv6 skip this */
        cr_assert_gt(http_server_port(s), 0);
        http_server_stop(s);
    }
}

/* The router's id rule and HTTP_ID_PATTERN (what the OpenAPI document states; tests/e2e/
 * test_openapi.py holds the document to it) agree on every byte and on the lengths at the
 * edges, so the document cannot promise an id the router refuses or the reverse. */
Test(http_server, id_rule_is_the_documented_pattern) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)HTTP_ID_PATTERN, PCRE2_ZERO_TERMINATED,
                                   PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
    cr_assert(re, "HTTP_ID_PATTERN does not compile at %zu", (size_t)at);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    cr_assert(md);
    char s[HTTP_ID_BYTES + 2];
    for (int c = 1; c < 256; c++) {
        for (size_t len = 1; len <= 3; len++) {
            memset(s, 'a', len);
            s[len / 2] = (char)c;
            bool doc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, md, NULL) >= 0;
            cr_assert_eq(http_is_id(s, len), doc, "byte 0x%02x at %zu of %zu: router %d, pattern %d",
                         c, len / 2, len, http_is_id(s, len), doc);
        }
    }
    size_t lens[] = {0, 1, HTTP_ID_BYTES - 1, HTTP_ID_BYTES};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        memset(s, 'z', lens[i]);
        bool doc = pcre2_match(re, (PCRE2_SPTR)s, lens[i], 0, 0, md, NULL) >= 0;
        cr_assert_eq(http_is_id(s, lens[i]), doc, "length %zu", lens[i]);
    }
    memcpy(s, "ab\n", 3);
    cr_assert(!http_is_id(s, 3));
    cr_assert_lt(pcre2_match(re, (PCRE2_SPTR)s, 3, 0, 0, md, NULL), 0);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
}
