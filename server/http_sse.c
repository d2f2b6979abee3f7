/* Server-Sent Events on libmicrohttpd. A stream's reader asks the handler's next() for
 * records; when there is nothing new it suspends the connection (MHD then neither polls
 * nor times it out, so an idle stream costs no CPU) and http_streams_resume_all wakes
 * it. Suspended connections are invisible to MHD, so a ticker thread does what MHD
 * cannot: resumes streams whose keep-alive is due and those whose client hung up, and
 * (http_deferred_tick) deferred answers past their deadline. */
#include "server/http_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

static const char KEEPALIVE[] = ": keep-alive\n\n";

struct http_stream {
    struct http_streams *streams;
    struct MHD_Connection *connection;
    int fd;                          /* the client socket, polled for hang-ups */
    http_stream_next next;
    void *ctx;
    void (*free_ctx)(void *ctx);
    bool suspended;                  /* guarded by streams->mutex, as are the two below */
    bool peer_gone;
    double last_write_s;
    struct http_stream *prev, *next_stream;
    struct http_stream *resume_link; /* scratch list of streams being resumed */
};

double http_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void lock(struct http_streams *streams) { pthread_mutex_lock(&streams->mutex); }
static void unlock(struct http_streams *streams) { pthread_mutex_unlock(&streams->mutex); }

bool http_peer_hung_up(int fd) {
    if (fd < 0) return false;
    struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
    int rc = poll(&pfd, 1, 0);
    return rc > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Marks the stream resumed and links it into *chain; the caller resumes the chain after
 * dropping the mutex. A stream in the chain is still suspended inside MHD, so it cannot
 * be freed before its own MHD_resume_connection. */
static void chain_for_resume(struct http_stream *s, struct http_stream **chain) {
    s->suspended = false;
    s->resume_link = *chain;
    *chain = s;
}

static void resume_chain(struct http_stream *chain) {
    while (chain) {
        struct http_stream *next = chain->resume_link; /* chain may be freed once resumed */
        MHD_resume_connection(chain->connection);
        chain = next;
    }
}

void http_streams_resume_all(struct http_streams *streams) {
    struct http_stream *chain = NULL;
    lock(streams);
    streams->wake_seq++;
    for (struct http_stream *s = streams->head; s; s = s->next_stream)
        if (s->suspended) chain_for_resume(s, &chain);
    unlock(streams);
    resume_chain(chain);
}

static void *ticker_main(void *arg) {
    struct http_streams *streams = arg;
    lock(streams);
    while (!streams->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += HTTP_SSE_TICK_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        int rc = 0;
        while (!streams->stopping && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&streams->tick, &streams->mutex, &until);
        if (streams->stopping) break;

        struct http_stream *chain = NULL;
        double now = http_now_s();
        for (struct http_stream *s = streams->head; s; s = s->next_stream) {
            if (!s->suspended) continue;
            if (http_peer_hung_up(s->fd)) s->peer_gone = true;
            if (s->peer_gone || now - s->last_write_s >= HTTP_SSE_KEEPALIVE_S)
                chain_for_resume(s, &chain);
        }
        unlock(streams);
        resume_chain(chain);
        http_deferred_tick(streams);
        lock(streams);
    }
    unlock(streams);
    return NULL;
}

int http_streams_init(struct http_streams *streams, struct smelt_error *err) {
    memset(streams, 0, sizeof *streams);
    pthread_condattr_t attr;
    if (pthread_mutex_init(&streams->mutex, NULL) != 0)
        return error_set(err, SMELT_ENOMEM, "http: cannot create the streams mutex");
    if (pthread_condattr_init(&attr) != 0) goto fail_mutex;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&streams->tick, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0) goto fail_mutex;
    rc = pthread_create(&streams->ticker, NULL, ticker_main, streams);
    if (rc != 0) {
        pthread_cond_destroy(&streams->tick);
        pthread_mutex_destroy(&streams->mutex);
        return error_set(err, SMELT_ENOMEM, "http: cannot start the SSE ticker thread: %s",
                         strerror(rc));
    }
    streams->ticker_running = true;
    return SMELT_OK;
fail_mutex:
    pthread_mutex_destroy(&streams->mutex);
    return error_set(err, SMELT_ENOMEM, "http: cannot create the SSE ticker's condition");
}

void http_streams_shutdown(struct http_streams *streams) {
    struct http_stream *chain = NULL;
    lock(streams);
    streams->stopping = true;
    pthread_cond_broadcast(&streams->tick);
    for (struct http_stream *s = streams->head; s; s = s->next_stream)
        if (s->suspended) chain_for_resume(s, &chain);
    unlock(streams);
    resume_chain(chain);
    http_deferred_resume(streams, NULL); /* stopping: each closes its connection */
    if (streams->ticker_running) {
        pthread_join(streams->ticker, NULL);
        streams->ticker_running = false;
    }
}

void http_streams_destroy(struct http_streams *streams) {
    SMELT_ASSERT(!streams->head && !streams->deferred); /* MHD_stop_daemon ended every request */
    pthread_cond_destroy(&streams->tick);
    pthread_mutex_destroy(&streams->mutex);
}

/* MHD's content reader: one call per chunk MHD can send. Returns bytes written, 0 after
 * suspending, or MHD_CONTENT_READER_END_* to end the response. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct http_stream *s = cls;
    struct http_streams *streams = s->streams;
    for (;;) {
        lock(streams);
        bool stopping = streams->stopping, gone = s->peer_gone;
        uint64_t seen = streams->wake_seq;
        bool keepalive_due = http_now_s() - s->last_write_s >= HTTP_SSE_KEEPALIVE_S;
        unlock(streams);
        if (stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (gone) return MHD_CONTENT_READER_END_WITH_ERROR;

        long n = s->next(s->ctx, buf, max);
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n == 0 && keepalive_due && max >= sizeof KEEPALIVE - 1) {
            memcpy(buf, KEEPALIVE, sizeof KEEPALIVE - 1);
            n = (long)(sizeof KEEPALIVE - 1);
        }
        if ((size_t)n > max) {
            log_error("http: an SSE stream's next() returned %ld bytes for a %zu-byte buffer; "
                      "ending the stream", n, max);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (n > 0) {
            lock(streams);
            s->last_write_s = http_now_s();
            unlock(streams);
            return n;
        }
        if (http_peer_hung_up(s->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;

        lock(streams);
        if (streams->stopping || streams->wake_seq != seen) { /* woken while next() ran */
            unlock(streams);
            continue;
        }
        /* Suspending under the mutex: a wake that comes after sees suspended and resumes. */
        s->suspended = true;
        MHD_suspend_connection(s->connection);
        unlock(streams);
        return 0;
    }
}

/* MHD destroys the response: once per stream, whatever ended it. */
static void stream_destroy(void *cls) {
    struct http_stream *s = cls;
    struct http_streams *streams = s->streams;
    lock(streams);
    if (s->prev) s->prev->next_stream = s->next_stream;
    else streams->head = s->next_stream;
    if (s->next_stream) s->next_stream->prev = s->prev;
    unlock(streams);
    if (s->free_ctx) s->free_ctx(s->ctx);
    free(s);
}

struct MHD_Response *http_stream_response(struct http_streams *streams,
                                          struct MHD_Connection *connection,
                                          struct http_response *res) {
    struct http_stream *s = calloc(1, sizeof *s);
    if (!s) {
        log_error("http: out of memory starting an SSE stream");
        if (res->stream_free) res->stream_free(res->stream_ctx);
        return NULL;
    }
    s->streams = streams;
    s->connection = connection;
    s->next = res->stream;
    s->ctx = res->stream_ctx;
    s->free_ctx = res->stream_free;
    s->last_write_s = http_now_s();
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = info ? info->connect_fd : -1;

    /* The reader's buffer: MHD hands at most this much (less when its write buffer is
     * fuller), so next() sees room for several records. */
    struct MHD_Response *response =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, stream_read, s,
                                          stream_destroy);
    if (!response) {
        log_error("http: libmicrohttpd could not create an SSE response");
        if (s->free_ctx) s->free_ctx(s->ctx);
        free(s);
        return NULL;
    }
    lock(streams);
    s->next_stream = streams->head;
    if (streams->head) streams->head->prev = s;
    streams->head = s;
    unlock(streams);
    if (MHD_add_response_header(response, "Content-Type", "text/event-stream") != MHD_YES ||
        MHD_add_response_header(response, "Cache-Control", "no-cache") != MHD_YES ||
        MHD_add_response_header(response, "X-Accel-Buffering", "no") != MHD_YES) {
        log_error("http: out of memory adding SSE headers");
        MHD_destroy_response(response); /* stream_destroy unlinks and frees the stream */
        return NULL;
    }
    return response;
}
