/* Shared by the HTTP layer's own files (http.c, http_sse.c, http_multipart.c); nothing
 * outside them includes it. */
#ifndef SMELT_SERVER_HTTP_INTERNAL_H
#define SMELT_SERVER_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/http.h"

/* An idle stream gets a comment line this often, so proxies and clients keep it open. */
#define HTTP_SSE_KEEPALIVE_S 15.0
/* How often the ticker looks for due keep-alives and for clients that hung up while
 * their stream was suspended (MHD itself cannot see those). */
#define HTTP_SSE_TICK_MS 250

struct http_stream;

/* The SSE streams of one server. mutex guards the list, each stream's suspended /
 * peer_gone / last_write_s, wake_seq and stopping. */
struct http_streams {
    pthread_mutex_t mutex;
    pthread_cond_t tick;            /* signalled on stop, so the ticker ends at once */
    pthread_t ticker;
    bool ticker_running;
    struct http_stream *head;       /* every stream whose MHD response exists */
    uint64_t wake_seq;              /* bumped by each wake: a reader whose next() raced a
                                       wake asks again instead of suspending */
    bool stopping;                  /* set once by shutdown: streams end, none suspends */
};

int http_streams_init(struct http_streams *streams, struct smelt_error *err);
/* Resumes every suspended stream so its next() is asked again. */
void http_streams_resume_all(struct http_streams *streams);
/* Ends every stream at its next read, resumes the suspended ones and joins the ticker:
 * afterwards no connection stays suspended, so MHD_stop_daemon may run. */
void http_streams_shutdown(struct http_streams *streams);
/* After MHD_stop_daemon (every stream freed). */
void http_streams_destroy(struct http_streams *streams);

/* The MHD response of an SSE reply (text/event-stream, no-cache). Takes res's stream
 * context: stream_free runs exactly once, when the response is destroyed, or here when
 * no response could be made (NULL). */
struct MHD_Response *http_stream_response(struct http_streams *streams,
                                          struct MHD_Connection *connection,
                                          struct http_response *res);

/* Whether the client shut its sending side or the socket failed (never blocks). */
bool http_peer_hung_up(int fd);

/* Monotonic clock in seconds. */
double http_now_s(void);

#endif
