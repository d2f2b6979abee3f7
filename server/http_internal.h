/* Shared by the HTTP layer's own files (http.c, http_route.c, http_sse.c, http_deferred.c,
 * http_multipart.c); nothing outside them includes it but the tests. */
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
struct http_deferred;

/* The SSE streams and deferred answers of one server (both suspend their connections;
 * one ticker serves both). mutex guards the lists, each stream's suspended / peer_gone /
 * last_write_s, each deferred answer's suspended / peer_gone, the wake counters and
 * stopping. */
struct http_streams {
    pthread_mutex_t mutex;
    pthread_cond_t tick;            /* signalled on stop, so the ticker ends at once */
    pthread_t ticker;
    bool ticker_running;
    struct http_stream *head;       /* every stream whose MHD response exists */
    uint64_t wake_seq;              /* bumped by each wake: a reader whose next() raced a
                                       wake asks again instead of suspending */
    bool stopping;                  /* set once by shutdown: streams end, none suspends */
    struct http_deferred *deferred; /* every deferred answer not yet given */
    uint64_t deferred_seq;          /* bumped by each http_deferred_wake, like wake_seq */
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

/* Deferred answers (http_deferred.c). A deferred answer lives from the handler's
 * deferral to the request's end (http_deferred_free in the completed callback). */
uint64_t http_deferred_seq(struct http_streams *streams);
/* Takes res's deferral (deferred_free runs exactly once: in http_deferred_free, or here
 * when NULL is returned for want of memory). */
struct http_deferred *http_deferred_new(struct http_streams *streams,
                                        struct MHD_Connection *connection,
                                        struct http_response *res);
/* Asks fn (at once when ask, else only if a wake came after seen) until it answers
 * (true, res filled) or the connection is suspended to wait (false). *gone is set instead
 * when the client left or the server stops: the connection is to be closed. */
bool http_deferred_run(struct http_deferred *d, uint64_t seen, bool ask,
                       struct http_response *res, bool *gone);
/* Unlinks and frees d and its context; NULL is fine. */
void http_deferred_free(struct http_deferred *d);
/* The ticker's part: resumes deferred answers past their deadline or whose client left. */
void http_deferred_tick(struct http_streams *streams);
/* Resumes every suspended deferred answer with key (NULL: all), bumping deferred_seq. */
void http_deferred_resume(struct http_streams *streams, const char *key);

/* What routing found for a request (http_route.c). */
struct http_route_match {
    const struct http_route *route;      /* serves the method on this path; NULL: none */
    const char *params[HTTP_MAX_PARAMS]; /* the route's captures, into the caller's scratch */
    int n_params;
    int bad_index;                       /* the first capture that is not an id (404
                                            naming it), -1 when all are */
    char bad_param[64];                  /* its placeholder's name ("file_id") */
    char allow[128];                     /* the table's methods for this path ("GET,
                                            DELETE"); "" when no route has it (404) */
};

/* Routes method on path (HEAD as GET). scratch is a writable copy of path that the
 * captures point into. A path a route has the shape of never reaches another route. */
void http_route_find(const struct http_route *routes, int n, const char *method,
                     const char *path, char *scratch, struct http_route_match *m);

/* Whether the client shut its sending side or the socket failed (never blocks). */
bool http_peer_hung_up(int fd);

/* Monotonic clock in seconds. */
double http_now_s(void);

/* http_multipart_parse on a Content-Type value (NULL: none) and a body of body_len bytes,
 * not a request's: what tests/fuzz/fuzz_multipart.c feeds without a connection. */
int http_multipart_parse_body(const char *ctype, const char *body, size_t body_len,
                              struct http_part *parts, int max, int *n, struct smelt_error *err);

#endif
