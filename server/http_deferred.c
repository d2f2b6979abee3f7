/* Deferred answers (http.h): a long poll that holds no thread. The handler's deferral
 * suspends the connection; a wake naming its key, its deadline (seen by the SSE ticker)
 * or the client's hang-up resumes it, and MHD then calls the access handler again,
 * which asks fn once more (http.c). A wake that comes while fn runs or before the
 * suspension bumps deferred_seq, so the connection is asked again instead of sleeping
 * through it. Like a stream, a deferred answer being resumed is still suspended inside
 * MHD and cannot be freed before its own MHD_resume_connection. */
#include "server/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct http_deferred {
    struct http_streams *streams;
    struct MHD_Connection *connection;
    int fd;                           /* the client socket, polled for hang-ups */
    http_deferred_fn fn;
    void *ctx;
    void (*free_ctx)(void *ctx);
    double deadline_s;                /* monotonic (http_now_s) */
    char key[HTTP_ID_BYTES];
    bool suspended;                   /* guarded by streams->mutex, as is peer_gone */
    bool peer_gone;
    struct http_deferred *prev, *next;
    struct http_deferred *resume_link; /* scratch list of answers being resumed */
};

static void lock(struct http_streams *streams) { pthread_mutex_lock(&streams->mutex); }
static void unlock(struct http_streams *streams) { pthread_mutex_unlock(&streams->mutex); }

uint64_t http_deferred_seq(struct http_streams *streams) {
    lock(streams);
    uint64_t seq = streams->deferred_seq;
    unlock(streams);
    return seq;
}

struct http_deferred *http_deferred_new(struct http_streams *streams,
                                        struct MHD_Connection *connection,
                                        struct http_response *res) {
    struct http_deferred *d = calloc(1, sizeof *d);
    if (!d) {
        log_error("http: out of memory deferring an answer");
        if (res->deferred_free) res->deferred_free(res->deferred_ctx);
        res->deferred = NULL;
        return NULL;
    }
    d->streams = streams;
    d->connection = connection;
    d->fn = res->deferred;
    d->ctx = res->deferred_ctx;
    d->free_ctx = res->deferred_free;
    int ms = res->deferred_deadline_ms > 0 ? res->deferred_deadline_ms : 0;
    d->deadline_s = http_now_s() + ms / 1000.0;
    /* The key is a fixed array: copied up to its size whether or not it is terminated. */
    snprintf(d->key, sizeof d->key, "%.*s", (int)sizeof res->deferred_key - 1, res->deferred_key);
    res->deferred = NULL;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    d->fd = info ? info->connect_fd : -1;
    lock(streams);
    d->next = streams->deferred;
    if (streams->deferred) streams->deferred->prev = d;
    streams->deferred = d;
    unlock(streams);
    return d;
}

void http_deferred_free(struct http_deferred *d) {
    if (!d) return;
    struct http_streams *streams = d->streams;
    lock(streams);
    if (d->prev) d->prev->next = d->next;
    else streams->deferred = d->next;
    if (d->next) d->next->prev = d->prev;
    unlock(streams);
    if (d->free_ctx) d->free_ctx(d->ctx);
    free(d);
}

/* What fn left behind when it said "still waiting". */
static void discard(struct http_response *res) {
    free(res->body);
    if (res->stream_free) res->stream_free(res->stream_ctx);
    if (res->deferred_free) res->deferred_free(res->deferred_ctx);
    memset(res, 0, sizeof *res);
}

bool http_deferred_run(struct http_deferred *d, uint64_t seen, bool ask,
                       struct http_response *res, bool *gone) {
    struct http_streams *streams = d->streams;
    *gone = false;
    for (;;) {
        bool hung_up = http_peer_hung_up(d->fd);
        lock(streams);
        bool last = http_now_s() >= d->deadline_s;
        if (streams->stopping || d->peer_gone || hung_up) {
            unlock(streams);
            *gone = true;
            return false;
        }
        if (!ask && !last && streams->deferred_seq == seen) {
            /* Suspending under the mutex: a wake that comes after sees suspended. */
            d->suspended = true;
            MHD_suspend_connection(d->connection);
            unlock(streams);
            return false;
        }
        seen = streams->deferred_seq;
        unlock(streams);
        ask = false;
        memset(res, 0, sizeof *res);
        if (d->fn(d->ctx, last, res) || last) return true; /* a last call left empty: 500 */
        discard(res);
    }
}

/* Marks d resumed and links it into *chain; the caller resumes after the mutex. */
static void chain_for_resume(struct http_deferred *d, struct http_deferred **chain) {
    d->suspended = false;
    d->resume_link = *chain;
    *chain = d;
}

static void resume_chain(struct http_deferred *chain) {
    while (chain) {
        struct http_deferred *next = chain->resume_link; /* chain may be freed once resumed */
        MHD_resume_connection(chain->connection);
        chain = next;
    }
}

void http_deferred_resume(struct http_streams *streams, const char *key) {
    struct http_deferred *chain = NULL;
    lock(streams);
    streams->deferred_seq++;
    for (struct http_deferred *d = streams->deferred; d; d = d->next)
        if (d->suspended && (!key || !d->key[0] || strcmp(d->key, key) == 0))
            chain_for_resume(d, &chain);
    unlock(streams);
    resume_chain(chain);
}

void http_deferred_tick(struct http_streams *streams) {
    struct http_deferred *chain = NULL;
    lock(streams);
    double now = http_now_s();
    for (struct http_deferred *d = streams->deferred; d; d = d->next) {
        if (!d->suspended) continue;
        if (http_peer_hung_up(d->fd)) d->peer_gone = true;
        if (d->peer_gone || now >= d->deadline_s) chain_for_resume(d, &chain);
    }
    unlock(streams);
    resume_chain(chain);
}
