/* The Tinker dispatcher: one thread owns the ROUTER that session workers (smelt-tinker,
 * DEALER, routing id "<job_id>.<attempt>") connect to. HTTP threads queue tinker.request
 * messages per session job (tinker_dispatch_submit) and wake the thread through an
 * eventfd polled beside the socket, so a request goes out at once. A job's queue is sent,
 * in submit order, only to the worker of the job's current attempt, once its
 * tinker.hello arrived; tinker.result messages are stored through tinker_future_complete.
 * Anything else (another attempt's worker, a future of another job, garbage) is logged
 * and dropped: nothing a peer sends stops the thread.
 *
 * Who may connect (docs/security.md "Job channels"): the ROUTER is a CURVE server with
 * smeltd's keys, ZAP domain "tinker". A worker is let in only when it shows the keypair
 * of a running session job's current attempt (jobs.worker_public_key, made at launch and
 * handed to that worker alone), and its connection's user id is then "<job_id>.<attempt>";
 * a message whose routing id is not its connection's user id (a worker passing for
 * another job) is dropped with a warning. A worker without keys never gets in. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/common.h"
#include "server/tinker_internal.h"

#define TINKER_DEFAULT_BIND "tcp://127.0.0.1:*"
#define TINKER_POLL_MS 250
#define TINKER_SWEEP_MS 1000 /* how often queues of jobs that ended are looked for */
/* A queue whose job row is not found is dropped only this long after it was made: a session
 * job is inserted, and its first requests queued, inside the HTTP thread's transaction,
 * which the sweep's own connection cannot see until it commits. */
#define TINKER_UNSEEN_MS 30000
#define TINKER_HWM 100000

struct tinker_request {
    char future_id[HTTP_ID_BYTES];
    json_t *header;                            /* owned; "id" set */
    struct msg_array arrays[MSG_MAX_ARRAYS];   /* owned copies */
    int n_arrays;
    char job_id[HTTP_ID_BYTES], why[SMELT_ERROR_MESSAGE_BYTES]; /* set once it is unsent */
    struct tinker_request *next;
};

/* A session job's queue and its worker, once that worker said hello. */
struct tinker_session {
    char job_id[HTTP_ID_BYTES];
    int64_t attempt;                           /* the connected worker's; 0: none yet */
    int64_t hello_attempt;                     /* the last attempt that said hello (kept when a send fails) */
    int64_t made_ms;                           /* mono_ms() when the queue was made */
    struct tinker_request *head, *tail;
    struct tinker_session *next;
};

struct tinker_dispatch {
    void *router;
    int wake_fd;                               /* eventfd: a submit or a stop */
    pthread_t thread;
    bool started;
    atomic_int stop;
    bool closed;                               /* the thread stopped: submits refused (under lock) */
    pthread_mutex_t lock;                      /* guards sessions and closed (HTTP threads vs the thread) */
    struct tinker_session *sessions;
    struct tinker_request *unsent;             /* requests no send can ever take: failed by the thread */
};

/* ---- queues (callers hold d->lock) ---- */

static void request_free(struct tinker_request *r) {
    if (!r) return;
    json_decref(r->header);
    for (int i = 0; i < r->n_arrays; i++) free(r->arrays[i].data);
    free(r);
}

static struct tinker_session *session_find(struct tinker_dispatch *d, const char *job_id) {
    for (struct tinker_session *q = d->sessions; q; q = q->next)
        if (strcmp(q->job_id, job_id) == 0) return q;
    return NULL;
}

static struct tinker_session *session_get(struct tinker_dispatch *d, const char *job_id) {
    struct tinker_session *q = session_find(d, job_id);
    if (q) return q;
    q = calloc(1, sizeof *q);
    if (!q) return NULL;
    snprintf(q->job_id, sizeof q->job_id, "%s", job_id);
    q->made_ms = mono_ms();
    q->next = d->sessions;
    d->sessions = q;
    return q;
}

static void session_remove(struct tinker_dispatch *d, const char *job_id) {
    for (struct tinker_session **p = &d->sessions; *p; p = &(*p)->next) {
        if (strcmp((*p)->job_id, job_id) != 0) continue;
        struct tinker_session *q = *p;
        *p = q->next;
        while (q->head) {
            struct tinker_request *r = q->head;
            q->head = r->next;
            request_free(r);
        }
        free(q);
        return;
    }
}

/* Whether a failed send may go through later: the worker is not connected now (ROUTER_MANDATORY) or its queue is
 * full. Anything else (out of memory, a message zmq refuses) would fail every time. */
static bool send_may_retry(int rc, int zmq_err) {
    return rc == SMELT_EIO && (zmq_err == EHOSTUNREACH || zmq_err == EAGAIN);
}

/* Sends q's queue to its worker while the socket takes it. A send that fails for now (the
 * worker went away) keeps the request and waits for the next hello; one that can never go
 * is moved to d->unsent, whose futures the thread fails (fail_unsent). Dispatch thread only. */
static void session_flush(struct tinker_dispatch *d, struct tinker_session *q) {
    char route[MSG_ROUTE_BYTES];
    int n = snprintf(route, sizeof route, "%s.%lld", q->job_id, (long long)q->attempt);
    while (q->attempt > 0 && q->head) {
        struct tinker_request *r = q->head;
        struct smelt_error err = {0};
        int rc = msg_send(d->router, route, (size_t)n, MSG_TINKER_REQUEST, r->header, r->arrays, r->n_arrays, &err);
        int zmq_err = zmq_errno();
        if (rc != 0 && send_may_retry(rc, zmq_err)) {
            log_warn("tinker: %s for %s: %s; held until the worker says hello again", r->future_id, route,
                     err.message);
            q->attempt = 0;
            return;
        }
        q->head = r->next;
        if (!q->head) q->tail = NULL;
        if (rc == 0) {
            request_free(r);
            continue;
        }
        snprintf(r->job_id, sizeof r->job_id, "%s", q->job_id);
        snprintf(r->why, sizeof r->why, "%s", err.message);
        r->next = d->unsent;
        d->unsent = r;
    }
}

/* ---- submit (HTTP threads) ---- */

static int request_new(const char *future_id, json_t *header, const struct msg_array *arrays, int n_arrays,
                       struct tinker_request **out, struct smelt_error *err) {
    if (!future_id || strlen(future_id) >= HTTP_ID_BYTES || !json_is_object(header) || n_arrays < 0 ||
        n_arrays > MSG_MAX_ARRAYS || (n_arrays > 0 && !arrays))
        return error_set(err, SMELT_EINVAL, "tinker_dispatch_submit: bad arguments");
    struct tinker_request *r = calloc(1, sizeof *r);
    if (!r) return error_set(err, SMELT_ENOMEM, "out of memory");
    snprintf(r->future_id, sizeof r->future_id, "%s", future_id);
    r->header = json_deep_copy(header);
    if (r->header) json_object_del(r->header, "v"); /* msg_send sets this protocol's */
    bool ok = r->header && json_object_set_new(r->header, "id", json_string(future_id)) == 0;
    for (int i = 0; ok && i < n_arrays; i++) {
        r->arrays[i].data = malloc(arrays[i].bytes ? arrays[i].bytes : 1);
        ok = r->arrays[i].data != NULL;
        if (ok && arrays[i].bytes) memcpy(r->arrays[i].data, arrays[i].data, arrays[i].bytes);
        r->arrays[i].bytes = arrays[i].bytes;
        r->n_arrays = i + 1;
    }
    if (!ok) {
        request_free(r);
        return error_set(err, SMELT_ENOMEM, "out of memory");
    }
    *out = r;
    return 0;
}

static void wake(struct tinker_dispatch *d) {
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("tinker: waking the dispatcher: %s", strerror(errno));
}

int tinker_dispatch_submit(struct server *s, const char *job_id, const char *future_id, json_t *header,
                           const struct msg_array *arrays, int n_arrays, struct smelt_error *err) {
    struct tinker_dispatch *d = s->tinker;
    if (!d) return error_set(err, SMELT_EIO, "the Tinker dispatcher is not running");
    if (!job_id || strlen(job_id) >= HTTP_ID_BYTES)
        return error_set(err, SMELT_EINVAL, "tinker_dispatch_submit: bad job id");
    struct tinker_request *r = NULL;
    TRY(request_new(future_id, header, arrays, n_arrays, &r, err));
    pthread_mutex_lock(&d->lock);
    bool closed = d->closed;
    struct tinker_session *q = closed ? NULL : session_get(d, job_id);
    if (q) {
        if (q->tail) q->tail->next = r;
        else q->head = r;
        q->tail = r;
    }
    pthread_mutex_unlock(&d->lock);
    if (!q) {
        request_free(r);
        return closed ? error_set(err, SMELT_EIO, "the Tinker dispatcher has stopped (smeltd is shutting down)")
                      : error_set(err, SMELT_ENOMEM, "out of memory");
    }
    wake(d);
    return 0;
}

bool tinker_dispatch_cancel(struct server *s, const char *job_id, const char *future_id) {
    struct tinker_dispatch *d = s->tinker;
    if (!d || !job_id || !future_id) return false;
    pthread_mutex_lock(&d->lock);
    struct tinker_session *q = session_find(d, job_id);
    struct tinker_request *r = NULL, *prev = NULL;
    for (r = q ? q->head : NULL; r && strcmp(r->future_id, future_id) != 0; r = r->next) prev = r;
    if (r) {
        if (prev) prev->next = r->next;
        else q->head = r->next;
        if (q->tail == r) q->tail = prev;
    }
    pthread_mutex_unlock(&d->lock);
    request_free(r);
    return r != NULL;
}

void tinker_dispatch_forget(struct server *s, const char *job_id) {
    struct tinker_dispatch *d = s->tinker;
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    session_remove(d, job_id);
    pthread_mutex_unlock(&d->lock);
}

/* ---- who may connect (the ZAP thread) ---- */

/* A routing id printable in the log: itself when it is text, else dots. */
static const char *text_or_dot(const struct msg *m) {
    for (size_t i = 0; i < m->route_len; i++)
        if (m->route[i] < 0x20 || m->route[i] > 0x7e) return "................................................";
    return m->route;
}

/* A session worker's handshake: its key must be the worker key of a running session
 * job's current attempt; the user id is then that attempt, "<job_id>.<attempt>". Runs on
 * the ZAP thread, with a store connection of its own. */
static bool authorize_worker(void *arg, const char *address, const char *client_public_key, char *user_id,
                             size_t user_id_cap, char *why, size_t why_cap) {
    (void)address;
    return server_attempt_of_key(arg, client_public_key, true, user_id, user_id_cap, why, why_cap);
}

/* ---- the worker's messages (the dispatch thread) ---- */

/* "<job_id>.<attempt>" -> its parts; false when the routing id is not one. */
static bool parse_route(const struct msg *m, char *job_id, size_t cap, int64_t *attempt) {
    char route[MSG_ROUTE_BYTES + 1];
    memcpy(route, m->route, m->route_len);
    route[m->route_len] = 0;
    if (strlen(route) != m->route_len) return false;
    char *dot = strrchr(route, '.');
    if (!dot || dot == route || (size_t)(dot - route) >= cap || !dot[1]) return false;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(dot + 1, &end, 10);
    if (*end || errno || n < 1) return false;
    *dot = 0;
    memcpy(job_id, route, strlen(route) + 1);
    *attempt = n;
    return true;
}

/* Whether attempt is the running attempt of session job job_id. */
static bool is_current(struct store_conn *c, const char *job_id, int64_t attempt) {
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (store_query_one(c, &row, &err, "SELECT attempt FROM jobs WHERE id = ? AND status = 'running' AND "
                        "devices IS NOT NULL AND json_extract(method, '$.type') = 'tinker'", "s", job_id) != 0)
        return false;
    bool current = json_integer_value(json_object_get(row, "attempt")) == attempt;
    json_decref(row);
    return current;
}

static void on_hello(struct server *s, struct store_conn *c, const struct msg *m, const char *job_id,
                     int64_t attempt) {
    struct tinker_dispatch *d = s->tinker;
    const char *hj = json_string_value(json_object_get(m->header, "job_id"));
    json_t *ha = json_object_get(m->header, "attempt");
    if (!hj || strcmp(hj, job_id) != 0 || !json_is_integer(ha) || json_integer_value(ha) != attempt) {
        log_warn("tinker: hello from %s.%lld names another job_id/attempt; ignored", job_id, (long long)attempt);
        return;
    }
    if (!is_current(c, job_id, attempt)) {
        log_warn("tinker: hello from %s.%lld, not the job's running attempt; ignored", job_id, (long long)attempt);
        return;
    }
    pthread_mutex_lock(&d->lock);
    struct tinker_session *q = session_get(d, job_id);
    bool first = q && q->attempt != attempt;
    if (q) {
        q->attempt = q->hello_attempt = attempt;
        session_flush(d, q);
    }
    pthread_mutex_unlock(&d->lock);
    if (!first) return;
    struct smelt_error err = {0};
    if (jobs_event(s, c, job_id, "info", "message", NULL, &err, "Session worker ready (pid %lld): base model %.300s, "
                   "vocabulary %lld, context %lld", (long long)json_integer_value(json_object_get(m->header, "pid")),
                   json_string_value(json_object_get(m->header, "model")) ?: "?",
                   (long long)json_integer_value(json_object_get(m->header, "vocab_size")),
                   (long long)json_integer_value(json_object_get(m->header, "max_context"))) != 0)
        log_error("tinker: event for %s: %s", job_id, err.message);
}

/* Whether future fid is job_id's (a worker answers only its own job's futures). */
static bool future_of_job(struct store_conn *c, const char *fid, const char *job_id) {
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (store_query_one(c, &row, &err, "SELECT job_id FROM tinker_futures WHERE id = ?", "s", fid) != 0) return false;
    const char *owner = json_string_value(json_object_get(row, "job_id"));
    bool mine = owner && strcmp(owner, job_id) == 0;
    json_decref(row);
    return mine;
}

/* Storing a result failed (the store refused it): the future still ends, failed with why, in a transaction of
 * its own, so its poll never waits for an answer that came and was lost. */
static void result_not_stored(struct server *s, struct store_conn *c, const char *fid, const char *job_id,
                              const struct smelt_error *why) {
    char message[700];
    snprintf(message, sizeof message, "the worker answered but storing its result failed: %.600s", why->message);
    struct smelt_error err = {0};
    int rc = store_begin(c, &err);
    if (rc == 0) {
        rc = tinker_future_fail(s, c, fid, job_id, message, &err);
        if (rc == 0) rc = store_commit(c, &err);
        else store_rollback(c);
    }
    if (rc) log_error("tinker: failing future %s after its result was lost: %s", fid, err.message);
    else tinker_futures_wake(s, fid);
}

static void on_result(struct server *s, struct store_conn *c, const struct msg *m, const char *job_id,
                      int64_t attempt) {
    const char *fid = json_string_value(json_object_get(m->header, "id"));
    if (!fid) {
        log_warn("tinker: result from %s.%lld without an id; dropped", job_id, (long long)attempt);
        return;
    }
    struct smelt_error err = {0};
    if (store_begin(c, &err) != 0) {
        log_error("tinker: result %s: %s", fid, err.message);
        result_not_stored(s, c, fid, job_id, &err);
        return;
    }
    bool mine = false;
    int rc = 0;
    if (!is_current(c, job_id, attempt))
        log_warn("tinker: result %s from %s.%lld, not the job's running attempt; dropped", fid, job_id,
                 (long long)attempt);
    else if (!(mine = future_of_job(c, fid, job_id)))
        log_warn("tinker: result %s from %s.%lld: no such future of that job; dropped", fid, job_id,
                 (long long)attempt);
    else if ((rc = tinker_future_complete(s, c, m, &err)) == SMELT_ENOTFOUND) {
        log_warn("tinker: result %s from %s.%lld: %s", fid, job_id, (long long)attempt, err.message);
        rc = 0; /* already finished (e.g. failed with its job): nothing changed */
    }
    if (rc == 0 && store_commit(c, &err) == 0) {
        tinker_futures_wake(s, fid);
        return;
    }
    if (rc) store_rollback(c); /* a failed commit has rolled back already */
    log_error("tinker: result %s from %s.%lld not stored: %s", fid, job_id, (long long)attempt, err.message);
    if (mine) result_not_stored(s, c, fid, job_id, &err);
}

/* Whether m's routing id is the identity its sender proved (the ZAP user id). */
static bool route_is_sender(const struct msg *m) {
    return m->route_len == strlen(m->user_id) && memcmp(m->route, m->user_id, m->route_len) == 0;
}

static void on_message(struct server *s, const struct msg *m) {
    char job_id[HTTP_ID_BYTES];
    int64_t attempt = 0;
    struct smelt_error err = {0};
    if (!route_is_sender(m)) {
        log_warn("tinker: a %.32s under routing id \"%.*s\" from the worker of %s (its keys); dropped", m->type,
                 (int)m->route_len, text_or_dot(m), m->user_id[0] ? m->user_id : "(no keys)");
        return;
    }
    if (!parse_route(m, job_id, sizeof job_id, &attempt)) {
        log_warn("tinker: a %s from a peer whose routing id is not <job_id>.<attempt>; ignored", m->type);
        return;
    }
    if (msg_check_version(m, &err) != 0) {
        log_warn("tinker: %s from %s.%lld: %s; ignored", m->type, job_id, (long long)attempt, err.message);
        return;
    }
    bool hello = strcmp(m->type, MSG_TINKER_HELLO) == 0, result = strcmp(m->type, MSG_TINKER_RESULT) == 0;
    if (!hello && !result) {
        log_warn("tinker: unknown message type %.32s from %s.%lld; ignored", m->type, job_id, (long long)attempt);
        return;
    }
    struct store_conn *c = store_acquire(s->store, &err);
    if (!c) {
        log_error("tinker: %s", err.message);
        return;
    }
    if (hello) on_hello(s, c, m, job_id, attempt);
    else on_result(s, c, m, job_id, attempt);
    store_release(s->store, c);
}

/* Queues of jobs that are no longer running and whose worker never connected (a submit
 * that raced the job's end) are dropped: their futures are failed with the job. A job not
 * found may be one whose transaction has not committed yet (TINKER_UNSEEN_MS). */
static void sweep(struct server *s) {
    struct tinker_dispatch *d = s->tinker;
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    if (!c) return;
    pthread_mutex_lock(&d->lock);
    for (struct tinker_session *q = d->sessions, *next; q; q = next) {
        next = q->next;
        json_t *row = NULL;
        int rc = store_query_one(c, &row, &err, "SELECT status FROM jobs WHERE id = ?", "s", q->job_id);
        bool ended = (rc == SMELT_ENOTFOUND && mono_ms() - q->made_ms >= TINKER_UNSEEN_MS) ||
                     (rc == 0 && jobs_status_final(json_string_value(json_object_get(row, "status"))));
        error_clear(&err);
        json_decref(row);
        if (ended) session_remove(d, q->job_id);
    }
    pthread_mutex_unlock(&d->lock);
    store_release(s->store, c);
}

/* The futures of requests that could not be sent end failed, each with an event on its job. */
static void fail_unsent(struct server *s) {
    struct tinker_dispatch *d = s->tinker;
    pthread_mutex_lock(&d->lock);
    struct tinker_request *list = d->unsent;
    d->unsent = NULL;
    pthread_mutex_unlock(&d->lock);
    if (!list) return;
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    for (struct tinker_request *r = list, *next; r; r = next) {
        next = r->next;
        char message[SMELT_ERROR_MESSAGE_BYTES + 64];
        snprintf(message, sizeof message, "sending the request to the session worker failed: %s", r->why);
        if (!c || tinker_future_fail(s, c, r->future_id, r->job_id, message, &err) != 0)
            log_error("tinker: failing future %s (%s): %s", r->future_id, message, err.message);
        else tinker_futures_wake(s, r->future_id);
        request_free(r);
    }
    if (c) store_release(s->store, c);
}

static void flush_all(struct server *s) {
    struct tinker_dispatch *d = s->tinker;
    pthread_mutex_lock(&d->lock);
    for (struct tinker_session *q = d->sessions; q; q = q->next) session_flush(d, q);
    pthread_mutex_unlock(&d->lock);
    fail_unsent(s);
}

bool tinker_dispatch_said_hello(struct server *s, const char *job_id, int64_t attempt) {
    struct tinker_dispatch *d = s->tinker;
    if (!d) return false;
    pthread_mutex_lock(&d->lock);
    struct tinker_session *q = session_find(d, job_id);
    bool said = q && q->hello_attempt == attempt;
    pthread_mutex_unlock(&d->lock);
    return said;
}

static void receive_all(struct server *s) {
    for (;;) {
        struct msg m;
        struct smelt_error err = {0};
        int rc = msg_recv(s->tinker->router, true, 0, &m, &err);
        if (rc == SMELT_ENOTFOUND) return;
        if (rc == 0) on_message(s, &m);
        else if (rc == SMELT_EFORMAT) log_warn("tinker: a malformed message: %s; ignored", err.message);
        else log_error("tinker: %s", err.message);
        msg_free(&m);
        if (rc == SMELT_EIO) return;
    }
}

static void *dispatch_main(void *arg) {
    struct server *s = arg;
    struct tinker_dispatch *d = s->tinker;
    int64_t last_sweep = mono_ms();
    while (!atomic_load(&d->stop)) {
        zmq_pollitem_t items[2] = {{.socket = d->router, .events = ZMQ_POLLIN},
                                   {.fd = d->wake_fd, .events = ZMQ_POLLIN}};
        if (zmq_poll(items, 2, TINKER_POLL_MS) < 0 && zmq_errno() != EINTR) {
            log_error("tinker: zmq_poll: %s", zmq_strerror(zmq_errno()));
            sleep_ms(TINKER_POLL_MS);
        }
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t n;
            if (read(d->wake_fd, &n, sizeof n) < 0 && errno != EAGAIN) log_warn("tinker: %s", strerror(errno));
        }
        if (items[0].revents & ZMQ_POLLIN) receive_all(s);
        flush_all(s);
        if (mono_ms() - last_sweep >= TINKER_SWEEP_MS) {
            sweep(s);
            last_sweep = mono_ms();
        }
    }
    return NULL;
}

/* ---- start / stop ---- */

static int bind_router(struct server *s, struct tinker_dispatch *d, struct smelt_error *err) {
    const char *bind = s->config.tinker_bind ? s->config.tinker_bind : TINKER_DEFAULT_BIND;
    d->router = zmq_socket(s->zmq, ZMQ_ROUTER);
    if (!d->router) return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = 0, mandatory = 1, hwm = TINKER_HWM;
    /* an unroutable request (its worker gone) fails instead of vanishing: it is kept */
    if (zmq_setsockopt(d->router, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(d->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) != 0 ||
        zmq_setsockopt(d->router, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(d->router, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0)
        return error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    return server_curve_bind(s, d->router, bind, "tinker", authorize_worker, "tinker_bind", s->tinker_endpoint,
                             sizeof s->tinker_endpoint, err);
}

int tinker_dispatch_start(struct server *s, struct smelt_error *err) {
    struct tinker_dispatch *d = calloc(1, sizeof *d);
    if (!d) return error_set(err, SMELT_ENOMEM, "out of memory");
    d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&d->lock, NULL);
    s->tinker = d;
    if (d->wake_fd < 0) return error_set(err, SMELT_EIO, "eventfd: %s", strerror(errno));
    TRY(bind_router(s, d, err));
    if (pthread_create(&d->thread, NULL, dispatch_main, s) != 0)
        return error_set(err, SMELT_EIO, "starting the Tinker dispatch thread failed");
    d->started = true;
    log_info("tinker: session workers connect to %s", s->tinker_endpoint);
    return 0;
}

void tinker_dispatch_stop(struct server *s) {
    struct tinker_dispatch *d = s->tinker;
    if (!d) return;
    if (d->started) {
        atomic_store(&d->stop, 1);
        wake(d);
        pthread_join(d->thread, NULL);
        d->started = false;
    }
    pthread_mutex_lock(&d->lock);
    d->closed = true;
    pthread_mutex_unlock(&d->lock);
}

void tinker_dispatch_free(struct server *s) {
    struct tinker_dispatch *d = s->tinker;
    if (!d) return;
    tinker_dispatch_stop(s);
    if (d->router) zmq_close(d->router);
    if (d->wake_fd >= 0) close(d->wake_fd);
    while (d->sessions) session_remove(d, d->sessions->job_id);
    while (d->unsent) {
        struct tinker_request *r = d->unsent;
        d->unsent = r->next;
        request_free(r);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
    s->tinker = NULL;
}
