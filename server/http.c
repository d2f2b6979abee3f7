/* The HTTP server: libmicrohttpd's thread pool on epoll, requests routed by the table,
 * auth and size limits checked from the headers alone (so a refused upload is never
 * read), the body gathered in whole, the handler called once, and its response checked
 * before it is sent. Streams live in http_sse.c, deferred answers in http_deferred.c,
 * multipart parsing in http_multipart.c, the reply helpers in http_reply.c.
 *
 * One request's life (MHD's access handler is called several times per request):
 *   first call   route, authenticate, check Content-Length; refusals are answered here
 *   body calls   append to the body, or only count once it passed the limit
 *   last call    413 or the handler's response (or its deferral: suspended, then
 *                called again on each resume until the deferred fn answers)
 *   completed    latency recorded, one debug log line, the request's state freed */
#include "server/http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"

const double HTTP_LATENCY_BOUNDS[HTTP_N_LATENCY_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
};

/* Idle connections (and stalled uploads) are closed after this long. It must exceed
 * HTTP_SSE_KEEPALIVE_S: a resumed stream is timed from its last write. */
#define HTTP_CONNECTION_TIMEOUT_S 60
/* Per connection: request headers, MHD's read/write buffers. Headers larger than what
 * is left get 431 from MHD. */
#define HTTP_CONNECTION_MEMORY_BYTES (128 * 1024)
#define HTTP_MAX_KEY_BYTES 512

struct http_server {
    struct MHD_Daemon *daemon;
    struct http_config config;   /* routes and app are the caller's, borrowed */
    int port;
    struct http_streams streams;
    pthread_mutex_t stats_mutex;
    struct http_stats stats;
};

/* One request, from the access handler's first call to the completed callback. */
struct request_state {
    double start_s;
    char method[16];
    char *path;                          /* decoded path, NUL-terminated */
    char *scratch;                       /* copy of path that params point into */
    const struct http_route *route;
    const char *params[HTTP_MAX_PARAMS];
    int n_params;
    int bad_index;                       /* a capture that is not an id (404 after auth), */
    char bad_param[64];                  /* and its name; -1 and "" when none */
    struct http_identity identity;
    size_t limit;                        /* body bytes allowed on this route */
    char *body;                          /* body_len bytes and a NUL */
    size_t body_len, body_cap;
    bool too_large;                      /* body passed limit: no longer stored */
    bool close_after;                    /* answer with Connection: close */
    bool responded;
    bool is_stream;
    int status;
    struct http_deferred *deferred;      /* the handler deferred its answer */
    uint64_t deferred_seen;              /* deferred_seq before the handler ran */
};

/* ------------------------------------------------------------------ lookups ---- */

const char *http_query(const struct http_request *req, const char *key) {
    if (!req || !req->connection) return NULL;
    return MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, key);
}

const char *http_header(const struct http_request *req, const char *name) {
    if (!req || !req->connection) return NULL;
    return MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND, name);
}

/* ------------------------------------------------------------------ routing ---- */

/* Finds the route (http_route.c); 0, or -1 with res filled: 404, 405 with Allow, or 204
 * with Allow for OPTIONS (answered on every routed path, without a key: it tells only
 * which methods the table has). Every method the table lacks (TRACE, PROPFIND, BREW) is
 * a 405 like a known one. */
static int route_request(const struct http_server *server, struct request_state *st,
                         struct http_response *res) {
    struct http_route_match m;
    http_route_find(server->config.routes, server->config.n_routes, st->method, st->path,
                    st->scratch, &m);
    if (!m.allow[0]) {
        http_reply_error(res, 404, NULL, "not_found", "Invalid URL (%s %s)", st->method,
                         st->path);
        return -1;
    }
    if (strcmp(st->method, "OPTIONS") == 0) {
        res->status = 204;
        http_add_header(res, "Allow", m.allow);
        return -1;
    }
    if (!m.route) {
        http_reply_error(res, 405, NULL, "method_not_allowed",
                         "%s is not allowed on %s (allowed: %s)", st->method, st->path,
                         m.allow);
        http_add_header(res, "Allow", m.allow);
        return -1;
    }
    st->route = m.route;
    memcpy(st->params, m.params, sizeof st->params);
    st->n_params = m.n_params;
    st->bad_index = m.bad_index;
    snprintf(st->bad_param, sizeof st->bad_param, "%s", m.bad_param);
    return 0;
}

/* A capture that is not an id names nothing that exists: 404 naming it, after auth so a
 * caller without a key learns nothing more than from any other path of the route. */
static void reply_bad_id(const struct request_state *st, struct http_response *res) {
    http_reply_error(res, 404, st->bad_param, "not_found",
                     "No such %s: '%s' is not an id (1 to %d of A-Z a-z 0-9 . _ : -)",
                     st->bad_param, st->params[st->bad_index], HTTP_ID_BYTES - 1);
}

/* --------------------------------------------------------------------- auth ---- */

/* The key of "Authorization: Bearer <key>" copied into key; false when absent. */
static bool bearer_key(const char *header, char key[HTTP_MAX_KEY_BYTES], bool *too_long) {
    *too_long = false;
    if (!header) return false;
    while (*header == ' ' || *header == '\t') header++;
    if (strncasecmp(header, "Bearer", 6) != 0 || (header[6] != ' ' && header[6] != '\t'))
        return false;
    const char *k = header + 6;
    while (*k == ' ' || *k == '\t') k++;
    size_t len = strlen(k);
    while (len && (k[len - 1] == ' ' || k[len - 1] == '\t')) len--;
    if (len == 0) return false;
    if (len >= HTTP_MAX_KEY_BYTES) {
        *too_long = true;
        return true;
    }
    memcpy(key, k, len);
    key[len] = '\0';
    return true;
}

/* The Tinker SDK's "X-API-Key: tml-<key>" on /api/v1/ routes (docs/tinker.md): the SDK
 * refuses keys without its "tml-" prefix, so users put it in front of a smelt key and it
 * is taken off here. */
static bool tinker_key(struct MHD_Connection *conn, const struct request_state *st,
                       char key[HTTP_MAX_KEY_BYTES], bool *too_long) {
    *too_long = false;
    if (strncmp(st->route->pattern, "/api/v1/", 8) != 0) return false;
    const char *k = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-API-Key");
    if (!k || !*k) return false;
    if (strncmp(k, "tml-", 4) == 0) k += 4;
    size_t len = strlen(k);
    if (len == 0) return false;
    if (len >= HTTP_MAX_KEY_BYTES) {
        *too_long = true;
        return true;
    }
    memcpy(key, k, len + 1);
    return true;
}

/* 0 with st->identity filled, or -1 with res filled (401, 403, 500). */
static int authenticate(const struct http_server *server, struct MHD_Connection *conn,
                        struct request_state *st, struct http_response *res) {
    char key[HTTP_MAX_KEY_BYTES];
    bool too_long;
    const char *header =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!bearer_key(header, key, &too_long) && !tinker_key(conn, st, key, &too_long)) {
        http_reply_error(res, 401, NULL, "missing_api_key",
                         "You didn't provide an API key: send 'Authorization: Bearer <key>'.");
        http_add_header(res, "WWW-Authenticate", "Bearer");
        return -1;
    }
    struct http_identity id;
    memset(&id, 0, sizeof id);
    int rc = too_long || !server->config.auth
                 ? SMELT_ENOTFOUND
                 : server->config.auth(server->config.app, key, &id);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 401, NULL, "invalid_api_key", "Incorrect API key provided.");
        http_add_header(res, "WWW-Authenticate", "Bearer error=\"invalid_token\"");
        return -1;
    }
    if (rc != 0) {
        log_error("http: checking an API key failed (%s) on %s %s", error_code_name(rc),
                  st->method, st->route->pattern);
        http_reply_error(res, 500, NULL, "auth_failed", "The API key could not be checked.");
        return -1;
    }
    if ((st->route->flags & HTTP_ADMIN) && !id.admin) {
        http_reply_error(res, 403, NULL, "admin_key_required",
                         "This endpoint needs an admin API key.");
        return -1;
    }
    st->identity = id;
    return 0;
}

/* ------------------------------------------------------------------ sending ---- */

static bool header_name_ok(const char *name) {
    if (!name[0]) return false;
    for (const char *c = name; *c; c++)
        if (*c <= ' ' || *c >= 127 || strchr("()<>@,;:\\\"/[]?={}", *c)) return false;
    return true;
}

/* Why a handler's response cannot be sent, or NULL when it can. */
static const char *response_defect(const struct http_response *res) {
    if (res->status < 100 || res->status > 599) return "no valid status";
    if (!res->stream && !res->body && res->status != 204) return "no body";
    if (res->stream && res->deferred) return "both a stream and a deferral";
    if (res->n_headers < 0 || res->n_headers > HTTP_MAX_HEADERS)
        return "more headers than HTTP_MAX_HEADERS or one too long";
    if (!memchr(res->content_type, '\0', sizeof res->content_type))
        return "an unterminated content_type";
    for (int i = 0; i < res->n_headers; i++) {
        if (!memchr(res->headers[i].name, '\0', sizeof res->headers[i].name) ||
            !memchr(res->headers[i].value, '\0', sizeof res->headers[i].value) ||
            !header_name_ok(res->headers[i].name) || strpbrk(res->headers[i].value, "\r\n"))
            return "an invalid header";
    }
    return NULL;
}

/* Frees what the response owns (body, stream context) and resets it. */
static void response_release(struct http_response *res) {
    free(res->body);
    if (res->stream && res->stream_free) res->stream_free(res->stream_ctx);
    if (res->deferred && res->deferred_free) res->deferred_free(res->deferred_ctx);
    memset(res, 0, sizeof *res);
}

static void reply_internal_error(struct http_response *res) {
    response_release(res);
    http_reply_error(res, 500, NULL, "internal_error",
                     "The server failed to produce a response for this request.");
}

/* The MHD response for res; takes the body or stream context (freed on failure). */
static struct MHD_Response *build_response(struct http_server *server,
                                           struct MHD_Connection *conn,
                                           struct http_response *res) {
    struct MHD_Response *mr;
    if (res->stream) {
        free(res->body);
        mr = http_stream_response(&server->streams, conn, res);
    } else {
        mr = MHD_create_response_from_buffer(res->body_len, res->body, MHD_RESPMEM_MUST_FREE);
        if (!mr) free(res->body);
        if (mr && res->body && res->content_type[0] &&
            MHD_add_response_header(mr, "Content-Type", res->content_type) != MHD_YES) {
            MHD_destroy_response(mr);
            mr = NULL;
        }
    }
    res->body = NULL;
    res->stream = NULL;
    if (!mr) return NULL;
    for (int i = 0; i < res->n_headers; i++) {
        if (MHD_add_response_header(mr, res->headers[i].name, res->headers[i].value) != MHD_YES) {
            log_error("http: libmicrohttpd refused the header '%s'", res->headers[i].name);
            MHD_destroy_response(mr);
            return NULL;
        }
    }
    return mr;
}

static void count_status(struct http_server *server, int status) {
    pthread_mutex_lock(&server->stats_mutex);
    server->stats.requests_by_class[status / 100]++;
    pthread_mutex_unlock(&server->stats_mutex);
}

/* Queues res (taking what it owns). A response MHD cannot build or take becomes a 500,
 * or, when even that fails, a closed connection (MHD_NO). */
static enum MHD_Result respond(struct http_server *server, struct MHD_Connection *conn,
                               struct request_state *st, struct http_response *res) {
    bool is_stream = res->stream != NULL;
    struct MHD_Response *mr = build_response(server, conn, res);
    if (!mr) {
        reply_internal_error(res);
        is_stream = false;
        mr = build_response(server, conn, res);
        if (!mr) return MHD_NO;
    }
    /* A client that sent its request and then shut its side down (FIN) wants the
     * connection closed after the answer. MHD on edge-triggered epoll may have read that
     * FIN with the request and never look again, leaving the connection open until the
     * idle timeout; saying "close" here ends it after the response. */
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if ((st->close_after || (info && http_peer_hung_up(info->connect_fd))) &&
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close") != MHD_YES)
        log_warn("http: could not mark a response Connection: close");
    enum MHD_Result queued = MHD_queue_response(conn, (unsigned)res->status, mr);
    MHD_destroy_response(mr);
    if (queued != MHD_YES) return MHD_NO;
    st->responded = true;
    st->is_stream = is_stream;
    st->status = res->status;
    count_status(server, res->status);
    return MHD_YES;
}

/* ------------------------------------------------------------------ request ---- */

static void request_state_free(struct request_state *st) {
    http_deferred_free(st->deferred);
    free(st->path);
    free(st->scratch);
    free(st->body);
    free(st);
}

static struct request_state *request_state_new(const char *url, const char *method) {
    struct request_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->start_s = http_now_s();
    snprintf(st->method, sizeof st->method, "%s", method);
    st->path = strdup(url);
    st->scratch = strdup(url);
    if (!st->path || !st->scratch) {
        request_state_free(st);
        return NULL;
    }
    return st;
}

/* The first call: everything that can be refused from the request line and headers is
 * refused here, before MHD reads (or says 100 Continue to) the body. */
static enum MHD_Result begin_request(struct http_server *server, struct MHD_Connection *conn,
                                     struct request_state *st) {
    struct http_response res;
    memset(&res, 0, sizeof res);
    if (route_request(server, st, &res) != 0) return respond(server, conn, st, &res);
    if (!(st->route->flags & HTTP_PUBLIC) && authenticate(server, conn, st, &res) != 0)
        return respond(server, conn, st, &res);
    if (st->bad_index >= 0) {
        reply_bad_id(st, &res);
        return respond(server, conn, st, &res);
    }

    st->limit = (st->route->flags & HTTP_LARGE_BODY) ? server->config.max_upload_bytes
                                                     : server->config.max_body_bytes;
    const char *length =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length) {
        errno = 0;
        char *end;
        unsigned long long n = strtoull(length, &end, 10);
        bool valid = errno == 0 && end != length && *end == '\0';
        if (valid && n > st->limit) {
            http_reply_error(&res, 413, NULL, "request_too_large",
                             "The request body is %llu bytes; this endpoint takes at most %zu.",
                             n, st->limit);
            return respond(server, conn, st, &res);
        }
        if (valid && n > 0) {
            st->body = malloc((size_t)n + 1);
            if (!st->body) return MHD_NO;
            st->body_cap = (size_t)n + 1;
        }
    }
    return MHD_YES;
}

/* A body call: stores the bytes while the total stays under the limit. A chunked body
 * that passes it is no longer stored, only read to its end, then answered with 413. */
static enum MHD_Result body_append(struct request_state *st, const char *data, size_t len) {
    if (st->too_large) return MHD_YES;
    if (len > st->limit - st->body_len) {
        st->too_large = true;
        free(st->body);
        st->body = NULL;
        st->body_cap = 0;
        return MHD_YES;
    }
    size_t need = st->body_len + len + 1;
    if (need > st->body_cap) {
        size_t cap = st->body_cap ? st->body_cap : 4096;
        while (cap < need) cap *= 2;
        if (cap > st->limit + 1) cap = st->limit + 1;
        char *grown = realloc(st->body, cap);
        if (!grown) return MHD_NO;
        st->body = grown;
        st->body_cap = cap;
    }
    memcpy(st->body + st->body_len, data, len);
    st->body_len += len;
    st->body[st->body_len] = '\0';
    return MHD_YES;
}

/* Asks the deferred fn (at once when ask) and sends its answer, or leaves the connection
 * suspended; MHD_NO closes a connection whose client left or whose server stops. */
static enum MHD_Result deferred_step(struct http_server *server, struct MHD_Connection *conn,
                                     struct request_state *st, bool ask) {
    struct http_response res;
    bool gone;
    if (!http_deferred_run(st->deferred, st->deferred_seen, ask, &res, &gone))
        return gone ? MHD_NO : MHD_YES;
    const char *defect = res.deferred || res.stream ? "a deferral or stream as its answer"
                                                    : response_defect(&res);
    if (defect) {
        log_error("http: the deferred answer of %s %s has %s; answering 500",
                  st->route->method, st->route->pattern, defect);
        reply_internal_error(&res);
    }
    return respond(server, conn, st, &res);
}

/* The handler deferred its answer: the deferral moves into st->deferred. */
static enum MHD_Result defer(struct http_server *server, struct MHD_Connection *conn,
                             struct request_state *st, struct http_response *res) {
    free(res->body);
    res->body = NULL;
    st->deferred = http_deferred_new(&server->streams, conn, res);
    if (!st->deferred) {
        reply_internal_error(res);
        return respond(server, conn, st, res);
    }
    return deferred_step(server, conn, st, false);
}

/* The last call: the whole body is in; answer 413 or run the handler. */
static enum MHD_Result finish_request(struct http_server *server, struct MHD_Connection *conn,
                                      struct request_state *st) {
    struct http_response res;
    memset(&res, 0, sizeof res);
    if (st->too_large) {
        st->close_after = true; /* a client that sends too much is not kept */
        http_reply_error(&res, 413, NULL, "request_too_large",
                         "The request body is larger than %zu bytes, the most this endpoint "
                         "takes.", st->limit);
        return respond(server, conn, st, &res);
    }
    struct http_request req = {
        .method = st->method,
        .path = st->path,
        .n_params = st->n_params,
        .body = st->body ? st->body : "",
        .body_len = st->body_len,
        .identity = st->identity,
        .connection = conn,
    };
    memcpy(req.params, st->params, sizeof req.params);
    st->deferred_seen = http_deferred_seq(&server->streams);
    st->route->handler(server->config.app, &req, &res);
    if (res.deferred && !res.stream) return defer(server, conn, st, &res);
    const char *defect = response_defect(&res);
    if (defect) {
        log_error("http: the handler of %s %s left a response with %s; answering 500",
                  st->route->method, st->route->pattern, defect);
        reply_internal_error(&res);
    }
    return respond(server, conn, st, &res);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
    (void)version;
    struct http_server *server = cls;
    struct request_state *st = *con_cls;
    if (!st) {
        st = request_state_new(url, method);
        if (!st) {
            log_error("http: out of memory for a new request; closing the connection");
            return MHD_NO;
        }
        *con_cls = st;
        return begin_request(server, conn, st);
    }
    if (*upload_data_size) {
        size_t len = *upload_data_size;
        *upload_data_size = 0;
        return body_append(st, upload_data, len);
    }
    if (st->responded) return MHD_YES;
    if (st->deferred) return deferred_step(server, conn, st, true); /* resumed */
    return finish_request(server, conn, st);
}

/* Printable ASCII only, so a client cannot forge log lines with %0a in its path. */
static void copy_for_log(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    for (; *src && n + 1 < cap; src++) dst[n++] = (*src >= ' ' && *src < 127) ? *src : '?';
    dst[n] = '\0';
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    struct http_server *server = cls;
    struct request_state *st = *con_cls;
    if (!st) return;
    *con_cls = NULL;
    double elapsed_s = http_now_s() - st->start_s;
    /* A stream's life and a long poll's wait are no latency; their status still counts
     * (respond). */
    if (st->responded && !st->is_stream && !st->deferred) {
        pthread_mutex_lock(&server->stats_mutex);
        for (int i = 0; i < HTTP_N_LATENCY_BUCKETS; i++)
            if (elapsed_s <= HTTP_LATENCY_BOUNDS[i]) server->stats.latency_buckets[i]++;
        server->stats.latency_count++;
        server->stats.latency_sum_s += elapsed_s;
        pthread_mutex_unlock(&server->stats_mutex);
    }
    if (log_get_level() <= LOG_LEVEL_DEBUG) {
        char method[16], path[256];
        copy_for_log(method, sizeof method, st->method);
        copy_for_log(path, sizeof path, st->path);
        log_debug("%s %s %d %.1f ms%s", method, path, st->status, elapsed_s * 1e3,
                  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (ended early)");
    }
    request_state_free(st);
}

/* ------------------------------------------------------------------- daemon ---- */

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* MHD's %HH decoding of the path and query, except that "%00" stays encoded: a NUL
 * would cut the path short behind routing's back ("a%00.txt" must not become "a"). */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls;
    (void)conn;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hex_value(r[1])) >= 0 && (lo = hex_value(r[2])) >= 0 &&
            (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    log_debug("libmicrohttpd: %s", line);
}

static int check_routes(const struct http_config *config, struct smelt_error *err) {
    if (config->n_routes < 0 || (config->n_routes > 0 && !config->routes))
        return error_set(err, SMELT_EINVAL, "http: routes missing (n_routes %d)",
                         config->n_routes);
    for (int i = 0; i < config->n_routes; i++) {
        const struct http_route *r = &config->routes[i];
        if (!r->method || !r->pattern || !r->handler || r->pattern[0] != '/')
            return error_set(err, SMELT_EINVAL,
                             "http: route %d needs a method, a handler and a pattern starting "
                             "with '/'", i);
        int n = 0;
        for (const char *p = r->pattern; *p; p++) {
            if (*p == '{' || (*p == '*' && p[-1] == '/')) n++;
            if (*p == '*' && (p[-1] != '/' || p[1] != '\0'))
                return error_set(err, SMELT_EINVAL,
                                 "http: route '%s': '*' must be the whole last segment",
                                 r->pattern);
        }
        if (n > HTTP_MAX_PARAMS)
            return error_set(err, SMELT_EINVAL, "http: route '%s' has more than %d params",
                             r->pattern, HTTP_MAX_PARAMS);
    }
    return SMELT_OK;
}

/* The listen address as a sockaddr; MHD_USE_IPv6 added to *flags for IPv6. */
static int listen_sockaddr(const struct http_config *config, struct sockaddr_storage *addr,
                           unsigned *flags, struct smelt_error *err) {
    memset(addr, 0, sizeof *addr);
    const char *host = config->listen_address ? config->listen_address : "127.0.0.1";
    if (config->port < 0 || config->port > 65535)
        return error_set(err, SMELT_EINVAL, "http: port %d is outside 0..65535", config->port);
    struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)addr;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)config->port);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)config->port);
        *flags |= MHD_USE_IPv6;
    } else {
        return error_set(err, SMELT_EINVAL,
                         "http: listen_address '%s' is not an IPv4 or IPv6 address", host);
    }
    return SMELT_OK;
}

static int bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (info && info->port) return info->port;
    info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    if (!info || getsockname(info->listen_fd, (struct sockaddr *)&addr, &len) != 0) return -1;
    if (addr.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    return ntohs(((struct sockaddr_in *)&addr)->sin_port);
}

int http_server_start(const struct http_config *config, struct http_server **out,
                      struct smelt_error *err) {
    *out = NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    struct sockaddr_storage addr;
    int rc = check_routes(config, err);
    if (!rc) rc = listen_sockaddr(config, &addr, &flags, err);
    if (rc) return rc;

    struct http_server *server = calloc(1, sizeof *server);
    if (!server) return error_set(err, SMELT_ENOMEM, "http: out of memory");
    server->config = *config;
    if (pthread_mutex_init(&server->stats_mutex, NULL) != 0) {
        free(server);
        return error_set(err, SMELT_ENOMEM, "http: cannot create the stats mutex");
    }
    rc = http_streams_init(&server->streams, err);
    if (rc) {
        pthread_mutex_destroy(&server->stats_mutex);
        free(server);
        return rc;
    }
    /* The logger first, so MHD's complaints about later options reach it too; no pool
     * option for one thread (MHD warns that it ignores it). Function pointers travel in
     * the value field, as MHD_OPTION_ARRAY prescribes. */
    struct MHD_OptionItem options[] = {
        {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)mhd_log, NULL},
        {MHD_OPTION_SOCK_ADDR, 0, &addr},
        {MHD_OPTION_CONNECTION_TIMEOUT, HTTP_CONNECTION_TIMEOUT_S, NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_CONNECTION_MEMORY_BYTES, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, server},
        {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape, NULL},
        {config->threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END,
         config->threads, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    errno = 0;
    server->daemon = MHD_start_daemon(flags, (uint16_t)config->port, NULL, NULL, on_access,
                                      server, MHD_OPTION_ARRAY, options, MHD_OPTION_END);
    if (!server->daemon) {
        int saved = errno;
        http_streams_shutdown(&server->streams);
        http_streams_destroy(&server->streams);
        pthread_mutex_destroy(&server->stats_mutex);
        free(server);
        return error_set(err, SMELT_EIO, "http: cannot listen on %s port %d: %s",
                         config->listen_address ? config->listen_address : "127.0.0.1",
                         config->port, saved ? strerror(saved) : "libmicrohttpd refused");
    }
    server->port = bound_port(server->daemon);
    *out = server;
    return SMELT_OK;
}

int http_server_port(const struct http_server *server) { return server->port; }

void http_server_stats(struct http_server *server, struct http_stats *out) {
    pthread_mutex_lock(&server->stats_mutex);
    *out = server->stats;
    pthread_mutex_unlock(&server->stats_mutex);
}

void http_streams_wake(struct http_server *server) { http_streams_resume_all(&server->streams); }

void http_deferred_wake(struct http_server *server, const char *key) {
    http_deferred_resume(&server->streams, key);
}

void http_server_stop(struct http_server *server) {
    if (!server) return;
    /* No new connections; then no suspended stream (MHD must not stop with one); then
     * MHD closes every connection and joins its threads, handlers included. The listen
     * socket quiesce hands back is ours to close, after the threads are gone. */
    MHD_socket listen_fd = MHD_quiesce_daemon(server->daemon);
    http_streams_shutdown(&server->streams);
    MHD_stop_daemon(server->daemon);
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd);
    http_streams_destroy(&server->streams);
    pthread_mutex_destroy(&server->stats_mutex);
    free(server);
}
