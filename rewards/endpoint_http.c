/* The endpoint grader's HTTP client: one JSON POST through libcurl (an easy handle per
 * request, made and freed here), bounded in time (connect and total, per attempt), in
 * attempts (connection errors, 429 and 5xx retried with a backoff, Retry-After honoured
 * up to timeout_s) and in the reply's size. Locked down: http and https only, redirects
 * not followed, no signals (CURLOPT_NOSIGNAL: the trainer has threads, and libcurl's
 * alarm-based DNS timeout would interrupt them; Debian's libcurl resolves names in a
 * thread, so timeouts hold during DNS too), SIGPIPE kept from the process (below).
 * Proxies: the environment's (http_proxy, https_proxy, all_proxy, no_proxy) as curl
 * reads them, except that the loopback names never go through one (so a service on the
 * trainer's own machine, and the tests' servers, are reached directly whatever the
 * environment says). */
#include "rewards/endpoint_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define CONNECT_TIMEOUT_S 10.0 /* at most: timeout_s when that is shorter */
#define BACKOFF_FIRST_S 0.25   /* then doubled per attempt */
#define BACKOFF_MAX_S 5.0
#define LOOPBACK_NAMES "localhost,127.0.0.1,::1"

/* ---- the process's libcurl ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init = CURLE_FAILED_INIT;

static void init_once(void) { g_init = curl_global_init(CURL_GLOBAL_DEFAULT); }

int endpoint_http_init(char *why, size_t why_n) {
    if (pthread_once(&g_once, init_once) != 0) {
        snprintf(why, why_n, "libcurl could not be set up (pthread_once failed)");
        return SMELT_EBACKEND;
    }
    if (g_init == CURLE_OK) return SMELT_OK;
    snprintf(why, why_n, "libcurl could not be set up: %s", curl_easy_strerror(g_init));
    return SMELT_EBACKEND;
}

/* ---- the target ---- */

static bool printable_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f) return false;
    return true;
}

/* The parts of a parsed URL that decide whether smelt takes it. */
static void check_parts(CURLU *u, char *why, size_t why_n, int *rc) {
    char *host = NULL, *user = NULL, *password = NULL;
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host || !host[0])
        snprintf(why, why_n, "has no host");
    else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
             curl_url_get(u, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK)
        snprintf(why, why_n, "holds a user name or password: give credentials in \"headers\" (Authorization)");
    else *rc = SMELT_OK;
    curl_free(host);
    curl_free(user);
    curl_free(password);
}

int endpoint_url_check(const char *url, char *why, size_t why_n) {
    if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0) {
        snprintf(why, why_n, "\"%.40s\" is not an http:// or https:// URL", url);
        return SMELT_EINVAL;
    }
    if (!printable_ascii(url)) {
        snprintf(why, why_n, "holds a space, a control character or a non-ASCII byte (percent-encode it)");
        return SMELT_EINVAL;
    }
    CURLU *u = curl_url();
    if (!u) return SMELT_ENOMEM;
    int rc = SMELT_EINVAL;
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
    if (uc == CURLUE_OUT_OF_MEMORY) rc = SMELT_ENOMEM;
    else if (uc != CURLUE_OK) snprintf(why, why_n, "not a URL libcurl can use: %s", curl_url_strerror(uc));
    else check_parts(u, why, why_n, &rc);
    curl_url_cleanup(u);
    return rc;
}

static int append_line(struct curl_slist **list, const char *line) {
    struct curl_slist *l = curl_slist_append(*list, line);
    if (!l) return SMELT_ENOMEM;
    *list = l;
    return SMELT_OK;
}

int endpoint_target_add_header(struct endpoint_target *t, const char *name, const char *value) {
    /* "Name;" is how libcurl sends an empty value ("Name:" would remove the header). */
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = malloc(n);
    if (!line) return SMELT_ENOMEM;
    if (value[0]) snprintf(line, n, "%s: %s", name, value);
    else snprintf(line, n, "%s;", name);
    int rc = append_line(&t->headers, line);
    free(line);
    return rc;
}

/* The environment's no_proxy with the loopback names added ("*" stays alone: it means
 * every host already, and libcurl reads it only alone). */
static char *noproxy_list(void) {
    const char *env = getenv("no_proxy");
    if (!env || !env[0]) env = getenv("NO_PROXY");
    if (env && strcmp(env, "*") == 0) return strdup("*");
    if (!env || !env[0]) return strdup(LOOPBACK_NAMES);
    size_t n = strlen(env) + sizeof LOOPBACK_NAMES + 1;
    char *list = malloc(n);
    if (list) snprintf(list, n, "%s,%s", env, LOOPBACK_NAMES);
    return list;
}

int endpoint_target_finish(struct endpoint_target *t) {
    TRY(append_line(&t->headers, "Content-Type: application/json"));
    TRY(append_line(&t->headers, "Expect:")); /* no 100-continue round trip for large bodies */
    t->noproxy = noproxy_list();
    return t->noproxy ? SMELT_OK : SMELT_ENOMEM;
}

void endpoint_target_free(struct endpoint_target *t) {
    free(t->url);
    free(t->noproxy);
    curl_slist_free_all(t->headers);
    memset(t, 0, sizeof *t);
}

/* ---- one POST ---- */

struct sink {
    struct reward_buf *buf;
    bool too_large, nomem;
};

static size_t on_data(char *p, size_t size, size_t nmemb, void *user) {
    struct sink *s = user;
    size_t n = size * nmemb;
    if (s->buf->n + n > ENDPOINT_MAX_REPLY_BYTES) {
        s->too_large = true;
        return 0; /* libcurl stops with CURLE_WRITE_ERROR */
    }
    if (reward_buf_append(s->buf, p, n)) {
        s->nomem = true;
        return 0;
    }
    return n;
}

static bool set_options(CURL *h, const struct endpoint_target *t, const char *body, size_t n, struct sink *sink,
                        char *errbuf) {
    long timeout_ms = lround(t->timeout_s * 1000.0);
    long connect_ms = lround(fmin(t->timeout_s, CONNECT_TIMEOUT_S) * 1000.0);
    bool bad = false;
    bad |= curl_easy_setopt(h, CURLOPT_URL, t->url) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_NOPROXY, t->noproxy) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_HTTPHEADER, t->headers) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_USERAGENT, "smelt-reward-endpoint") != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_POST, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_POSTFIELDS, body) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)ENDPOINT_MAX_REPLY_BYTES) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_WRITEDATA, sink) != CURLE_OK;
    bad |= curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf) != CURLE_OK;
    return !bad;
}

static bool connected(CURL *h) {
    curl_off_t us = 0;
    return curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &us) == CURLE_OK && us > 0;
}

/* Failures worth another attempt: no connection, or one that broke. A timeout after the
 * connection was made is final: the service is too slow, and asking again would
 * multiply the wait of every batch. */
static bool retryable(CURL *h, CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return true;
    case CURLE_OPERATION_TIMEDOUT:
        return !connected(h);
    default:
        return false;
    }
}

static void describe(CURLcode c, const char *errbuf, const struct sink *sink, const struct endpoint_target *t,
                     int attempts, char *why, size_t why_n) {
    const char *s = attempts == 1 ? "" : "s";
    if (sink->too_large || c == CURLE_FILESIZE_EXCEEDED)
        snprintf(why, why_n, "the reply is larger than %u bytes", ENDPOINT_MAX_REPLY_BYTES);
    else if (c == CURLE_OPERATION_TIMEDOUT)
        snprintf(why, why_n, "no reply within timeout_s %g s (%d attempt%s): %.100s", t->timeout_s, attempts, s,
                 errbuf[0] ? errbuf : curl_easy_strerror(c));
    else
        snprintf(why, why_n, "no reply (%d attempt%s): %.120s", attempts, s, errbuf[0] ? errbuf : curl_easy_strerror(c));
}

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The wait before attempt `attempts` + 1 after a 429 or 5xx: the reply's Retry-After
 * (seconds or a date; libcurl reads both) up to timeout_s, else the backoff. */
static double retry_wait(CURL *h, const struct endpoint_target *t, double backoff) {
    curl_off_t after = 0;
    if (curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &after) == CURLE_OK && after > 0)
        return fmin((double)after, t->timeout_s);
    return backoff;
}

/* SIGPIPE: a write to a connection the service closed raises it (OpenSSL writes with
 * write(2), not send(MSG_NOSIGNAL)), its default action ends the process, and with
 * CURLOPT_NOSIGNAL libcurl leaves it to the caller. So it is blocked in this thread for
 * the request, and one raised meanwhile is taken before it is unblocked. The process's
 * disposition is left alone: children the trainer starts inherit an ignored signal. */
struct sigpipe_guard {
    sigset_t old;
    bool was_pending;
};

static void sigpipe_block(struct sigpipe_guard *g) {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

static void sigpipe_restore(const struct sigpipe_guard *g) {
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    struct timespec zero = {0};
    if (!g->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
        }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static int post_with_retries(CURL *h, const struct endpoint_target *t, struct sink *sink, struct endpoint_reply *r,
                             char *errbuf, char *why, size_t why_n) {
    for (r->attempts = 1;; r->attempts++) {
        errbuf[0] = '\0';
        r->body.n = 0;
        r->status = 0;
        CURLcode c = curl_easy_perform(h);
        if (sink->nomem) return SMELT_ENOMEM;
        double wait = fmin(BACKOFF_FIRST_S * pow(2.0, r->attempts - 1), BACKOFF_MAX_S);
        bool last = r->attempts > t->max_retries;
        if (c != CURLE_OK) {
            describe(c, errbuf, sink, t, r->attempts, why, why_n);
            if (last || sink->too_large || !retryable(h, c)) return ENDPOINT_NO_ANSWER;
        } else {
            if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status) != CURLE_OK) r->status = 0;
            if (last || !(r->status == 429 || r->status >= 500)) return SMELT_OK;
            wait = retry_wait(h, t, wait);
        }
        sleep_s(wait);
    }
}

int endpoint_http_post(const struct endpoint_target *t, const char *body, size_t n, struct endpoint_reply *r,
                       char *why, size_t why_n) {
    memset(r, 0, sizeof *r);
    CURL *h = curl_easy_init();
    if (!h) return SMELT_ENOMEM;
    char errbuf[CURL_ERROR_SIZE] = "";
    struct sink sink = {.buf = &r->body};
    int rc;
    if (set_options(h, t, body, n, &sink, errbuf)) {
        struct sigpipe_guard guard;
        sigpipe_block(&guard);
        rc = post_with_retries(h, t, &sink, r, errbuf, why, why_n);
        sigpipe_restore(&guard);
    } else {
        snprintf(why, why_n, "libcurl %s refused an option smelt needs (7.85 or later is needed)", curl_version());
        rc = ENDPOINT_NO_ANSWER;
    }
    curl_easy_cleanup(h);
    return rc;
}
