/* The rendezvous smeltd serves for the jobs it runs (docs/distributed.md "Rendezvous"):
 * a key/value table with wait per job attempt, on a ROUTER of its own
 * (--rendezvous-bind) that the ranks of a job reach through comm/'s "smeltd:ENDPOINT"
 * store. Messages: common/msg.h's rdzv.*.
 *
 * Who may connect (docs/security.md "Job channels"): the ROUTER is a CURVE server with
 * smeltd's keys, ZAP domain "rdzv"; a client gets in only with the worker keypair of a
 * running job's current attempt, and its connection's user id is then
 * "<job_id>.<attempt>". That user id is the table: a message only ever reads and writes
 * the table of the attempt its keys prove, so no job or attempt sees another's keys.
 * Every message is also checked against the store (the attempt must still be the job's
 * running one), and once a second the tables of attempts that ended are freed, their
 * waiters answered with an error.
 *
 * One thread owns the socket and the tables; a get that waits is a record with a
 * deadline, answered when its key is set or the deadline passes, so no waiter holds the
 * thread. Each attempt holds at most max_keys keys, max_bytes bytes of keys and values,
 * and RDZV_MAX_WAITERS waiting gets; beyond, a request is refused naming the limit. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/common.h"
#include "server/server_internal.h"

#define RDZV_DEFAULT_BIND "tcp://127.0.0.1:*"
#define RDZV_POLL_MS 250
#define RDZV_SWEEP_MS 1000
#define RDZV_MAX_WAITERS 1024
#define RDZV_MAX_TIMEOUT_MS 3600000
#define RDZV_ID_BYTES 65

struct rdzv_entry {
    char *key;
    void *data;
    size_t len;
    struct rdzv_entry *next;
};

struct rdzv_waiter {
    char route[MSG_ROUTE_BYTES];
    size_t route_len;
    char id[RDZV_ID_BYTES];
    char *key;
    int64_t deadline;
    struct rdzv_waiter *next;
};

/* One attempt's table: its keys and the gets waiting on them. */
struct rdzv_scope {
    char user_id[CURVE_USER_ID_BYTES];          /* "<job_id>.<attempt>" */
    struct rdzv_entry *entries;
    size_t n_keys, bytes, n_waiters;
    struct rdzv_waiter *waiters;
    struct rdzv_scope *next;
};

struct rendezvous {
    void *router;
    pthread_t thread;
    bool started;
    atomic_int stop;
    pthread_mutex_t lock;                       /* scopes: the thread vs rendezvous_keys_held */
    struct rdzv_scope *scopes;
    size_t max_keys, max_bytes;
};

/* ---- tables (the thread; d->lock held where they change) ---- */

static void waiter_free(struct rdzv_waiter *w) {
    if (!w) return;
    free(w->key);
    free(w);
}

static void scope_free(struct rdzv_scope *sc) {
    while (sc->entries) {
        struct rdzv_entry *e = sc->entries;
        sc->entries = e->next;
        free(e->key);
        free(e->data);
        free(e);
    }
    while (sc->waiters) {
        struct rdzv_waiter *w = sc->waiters;
        sc->waiters = w->next;
        waiter_free(w);
    }
    free(sc);
}

static struct rdzv_scope *scope_find(struct rendezvous *d, const char *user_id) {
    for (struct rdzv_scope *sc = d->scopes; sc; sc = sc->next)
        if (strcmp(sc->user_id, user_id) == 0) return sc;
    return NULL;
}

static struct rdzv_scope *scope_get(struct rendezvous *d, const char *user_id) {
    struct rdzv_scope *sc = scope_find(d, user_id);
    if (sc) return sc;
    if (!(sc = calloc(1, sizeof *sc))) return NULL;
    snprintf(sc->user_id, sizeof sc->user_id, "%s", user_id);
    pthread_mutex_lock(&d->lock);
    sc->next = d->scopes;
    d->scopes = sc;
    pthread_mutex_unlock(&d->lock);
    return sc;
}

static struct rdzv_entry *entry_find(struct rdzv_scope *sc, const char *key) {
    for (struct rdzv_entry *e = sc->entries; e; e = e->next)
        if (strcmp(e->key, key) == 0) return e;
    return NULL;
}

/* ---- replies ---- */

static void reply_ok(struct rendezvous *d, const void *route, size_t route_len, const char *id,
                     const struct rdzv_entry *e) {
    json_t *h = json_pack("{s:s, s:b}", "id", id, "ok", 1);
    struct msg_array a = {e ? e->data : NULL, e ? e->len : 0};
    struct smelt_error err = {0};
    if (!h || msg_send(d->router, route, route_len, MSG_RDZV_REPLY, h, &a, e ? 1 : 0, &err) != 0)
        log_warn("rendezvous: answering %s: %s", id, h ? err.message : "out of memory");
    json_decref(h);
}

/* code: "invalid" (field names the header field), "limit" (field names the limit),
 * "not_found" (the key did not appear in time), "ended" (the attempt is not running). */
static void reply_error(struct rendezvous *d, const void *route, size_t route_len, const char *id,
                        const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void reply_error(struct rendezvous *d, const void *route, size_t route_len, const char *id,
                        const char *code, const char *field, const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    json_t *h = json_pack("{s:s?, s:b, s:{s:s, s:s?, s:s}}", "id", id && *id ? id : NULL, "ok", 0, "error",
                          "message", message, "field", field, "code", code);
    struct smelt_error err = {0};
    if (!h || msg_send(d->router, route, route_len, MSG_RDZV_REPLY, h, NULL, 0, &err) != 0)
        log_warn("rendezvous: answering %s: %s", id ? id : "?", h ? err.message : "out of memory");
    json_decref(h);
}

/* ---- who may connect (the ZAP thread) ---- */

/* A rank's handshake: its key must be the worker key of a running job's current attempt. */
static bool authorize_rank(void *arg, const char *address, const char *client_public_key, char *user_id,
                           size_t user_id_cap, char *why, size_t why_cap) {
    (void)address;
    return server_attempt_of_key(arg, client_public_key, false, user_id, user_id_cap, why, why_cap);
}

/* Whether user id "<job_id>.<attempt>" is still its job's running attempt. */
static bool attempt_running(struct server *s, const char *user_id) {
    char job_id[CURVE_USER_ID_BYTES];
    snprintf(job_id, sizeof job_id, "%s", user_id);
    char *dot = strrchr(job_id, '.');
    if (!dot) return false;
    *dot = 0;
    long long attempt = strtoll(dot + 1, NULL, 10);
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    json_t *row = NULL;
    int rc = c ? store_query_one(c, &row, &err, "SELECT attempt FROM jobs WHERE id = ? AND status = 'running' AND "
                                 "devices IS NOT NULL", "s", job_id) : SMELT_EIO;
    if (c) store_release(s->store, c);
    if (rc && rc != SMELT_ENOTFOUND) log_error("rendezvous: the store: %s", err.message);
    bool running = !rc && json_integer_value(json_object_get(row, "attempt")) == attempt;
    json_decref(row);
    return running;
}

/* ---- requests (the thread) ---- */

/* The header's id (1..64 bytes) and key (1..RDZV_KEY_BYTES-1 printable bytes). */
static bool read_id_key(struct rendezvous *d, const struct msg *m, char *id, const char **key) {
    const char *i = json_string_value(json_object_get(m->header, "id"));
    id[0] = 0;
    if (!i || !*i || strlen(i) >= RDZV_ID_BYTES) {
        reply_error(d, m->route, m->route_len, NULL, "invalid", "id", "%s: id must be a string of 1..%d bytes",
                    m->type, RDZV_ID_BYTES - 1);
        return false;
    }
    snprintf(id, RDZV_ID_BYTES, "%s", i);
    const char *k = json_string_value(json_object_get(m->header, "key"));
    size_t n = k ? strlen(k) : 0;
    bool printable = n > 0 && n < RDZV_KEY_BYTES;
    for (size_t j = 0; printable && j < n; j++) printable = k[j] > 0x20 && k[j] < 0x7f;
    if (!printable) {
        reply_error(d, m->route, m->route_len, id, "invalid", "key",
                    "%s: key must be 1..%d printable bytes without spaces", m->type, RDZV_KEY_BYTES - 1);
        return false;
    }
    *key = k;
    return true;
}

/* Answers and removes the waiters of key (NULL: every waiter whose deadline passed, or
 * all of them when ended). */
static void wake_waiters(struct rendezvous *d, struct rdzv_scope *sc, const char *key, bool ended) {
    int64_t now = mono_ms();
    for (struct rdzv_waiter **p = &sc->waiters; *p;) {
        struct rdzv_waiter *w = *p;
        struct rdzv_entry *e = key && strcmp(w->key, key) == 0 ? entry_find(sc, key) : NULL;
        if (e) reply_ok(d, w->route, w->route_len, w->id, e);
        else if (ended)
            reply_error(d, w->route, w->route_len, w->id, "ended", NULL, "rendezvous: attempt %s has ended",
                        sc->user_id);
        else if (!key && now >= w->deadline)
            reply_error(d, w->route, w->route_len, w->id, "not_found", "key",
                        "rendezvous key '%.300s' not set in time", w->key);
        else {
            p = &w->next;
            continue;
        }
        *p = w->next;
        sc->n_waiters--;
        waiter_free(w);
    }
}

static void on_set(struct rendezvous *d, struct rdzv_scope *sc, const struct msg *m) {
    char id[RDZV_ID_BYTES];
    const char *key;
    if (!read_id_key(d, m, id, &key)) return;
    if (m->n_arrays != 1) {
        reply_error(d, m->route, m->route_len, id, "invalid", "frames", "rdzv.set: one value frame, not %d",
                    m->n_arrays);
        return;
    }
    struct rdzv_entry *e = entry_find(sc, key);
    size_t len = m->arrays[0].bytes, old = e ? e->len : 0, add = e ? 0 : strlen(key) + 1;
    if (!e && sc->n_keys >= d->max_keys) {
        reply_error(d, m->route, m->route_len, id, "limit", "rendezvous_max_keys",
                    "rdzv.set '%.300s': attempt %s holds %zu keys already (rendezvous_max_keys)", key, sc->user_id,
                    sc->n_keys);
        return;
    }
    if (sc->bytes - old + add + len > d->max_bytes) {
        reply_error(d, m->route, m->route_len, id, "limit", "rendezvous_max_bytes",
                    "rdzv.set '%.300s': %zu bytes more would pass attempt %s's %zu (rendezvous_max_bytes)", key,
                    len + add, sc->user_id, d->max_bytes);
        return;
    }
    void *data = malloc(len ? len : 1);
    struct rdzv_entry *fresh = e ? NULL : calloc(1, sizeof *fresh);
    char *key_copy = e ? NULL : strdup(key);
    if (!data || (!e && (!fresh || !key_copy))) {
        free(data);
        free(fresh);
        free(key_copy);
        reply_error(d, m->route, m->route_len, id, "invalid", NULL, "rdzv.set: smeltd is out of memory");
        return;
    }
    if (len) memcpy(data, m->arrays[0].data, len);
    pthread_mutex_lock(&d->lock);
    if (!e) {
        *fresh = (struct rdzv_entry){.key = key_copy, .next = sc->entries};
        sc->entries = e = fresh;
        sc->n_keys++;
    }
    free(e->data);
    e->data = data;
    e->len = len;
    sc->bytes = sc->bytes - old + add + len;
    pthread_mutex_unlock(&d->lock);
    reply_ok(d, m->route, m->route_len, id, NULL);
    wake_waiters(d, sc, key, false);
}

static void on_get(struct rendezvous *d, struct rdzv_scope *sc, const struct msg *m) {
    char id[RDZV_ID_BYTES];
    const char *key;
    if (!read_id_key(d, m, id, &key)) return;
    json_t *t = json_object_get(m->header, "timeout_ms");
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > RDZV_MAX_TIMEOUT_MS) {
        reply_error(d, m->route, m->route_len, id, "invalid", "timeout_ms",
                    "rdzv.get: timeout_ms must be an integer in [0, %d]", RDZV_MAX_TIMEOUT_MS);
        return;
    }
    struct rdzv_entry *e = entry_find(sc, key);
    if (e || json_integer_value(t) == 0) {
        if (e) reply_ok(d, m->route, m->route_len, id, e);
        else reply_error(d, m->route, m->route_len, id, "not_found", "key", "rendezvous key '%.300s' is not set", key);
        return;
    }
    if (sc->n_waiters >= RDZV_MAX_WAITERS) {
        reply_error(d, m->route, m->route_len, id, "limit", "waiters",
                    "rdzv.get '%.300s': attempt %s has %d gets waiting already", key, sc->user_id, RDZV_MAX_WAITERS);
        return;
    }
    struct rdzv_waiter *w = calloc(1, sizeof *w);
    if (!w || !(w->key = strdup(key))) {
        free(w);
        reply_error(d, m->route, m->route_len, id, "invalid", NULL, "rdzv.get: smeltd is out of memory");
        return;
    }
    memcpy(w->route, m->route, m->route_len);
    w->route_len = m->route_len;
    snprintf(w->id, sizeof w->id, "%s", id);
    w->deadline = mono_ms() + json_integer_value(t);
    w->next = sc->waiters;
    sc->waiters = w;
    sc->n_waiters++;
}

static void on_message(struct server *s, const struct msg *m) {
    struct rendezvous *d = s->rendezvous;
    struct smelt_error err = {0};
    if (!m->user_id[0]) {
        log_warn("rendezvous: a %.32s from a connection without keys; dropped", m->type);
        return;
    }
    if (msg_check_version(m, &err) != 0) {
        reply_error(d, m->route, m->route_len, json_string_value(json_object_get(m->header, "id")), "invalid", "v",
                    "%s", err.message);
        return;
    }
    bool set = strcmp(m->type, MSG_RDZV_SET) == 0, get = strcmp(m->type, MSG_RDZV_GET) == 0;
    if (!set && !get) {
        reply_error(d, m->route, m->route_len, NULL, "invalid", "type", "unknown message type '%.32s' (rdzv.set, "
                    "rdzv.get)", m->type);
        return;
    }
    if (!attempt_running(s, m->user_id)) {
        reply_error(d, m->route, m->route_len, json_string_value(json_object_get(m->header, "id")), "ended", NULL,
                    "rendezvous: attempt %s is not its job's running attempt", m->user_id);
        return;
    }
    struct rdzv_scope *sc = scope_get(d, m->user_id);
    if (!sc) reply_error(d, m->route, m->route_len, NULL, "invalid", NULL, "smeltd is out of memory");
    else if (set) on_set(d, sc, m);
    else on_get(d, sc, m);
}

/* Tables of attempts no longer running are freed (their waiters told); deadlines passed are answered. */
static void sweep(struct server *s, bool check_attempts) {
    struct rendezvous *d = s->rendezvous;
    for (struct rdzv_scope **p = &d->scopes; *p;) {
        struct rdzv_scope *sc = *p;
        if (!check_attempts || attempt_running(s, sc->user_id)) {
            wake_waiters(d, sc, NULL, false);
            p = &sc->next;
            continue;
        }
        wake_waiters(d, sc, NULL, true);
        log_info("rendezvous: attempt %s ended: its %zu keys (%zu bytes) freed", sc->user_id, sc->n_keys, sc->bytes);
        pthread_mutex_lock(&d->lock);
        *p = sc->next;
        pthread_mutex_unlock(&d->lock);
        scope_free(sc);
    }
}

/* How long the thread may sleep: until the nearest deadline, at most RDZV_POLL_MS. */
static long poll_ms(struct rendezvous *d) {
    int64_t now = mono_ms(), wait = RDZV_POLL_MS;
    for (struct rdzv_scope *sc = d->scopes; sc; sc = sc->next)
        for (struct rdzv_waiter *w = sc->waiters; w; w = w->next)
            if (w->deadline - now < wait) wait = w->deadline - now;
    return wait < 0 ? 0 : (long)wait;
}

static void receive_all(struct server *s) {
    for (;;) {
        struct msg m;
        struct smelt_error err = {0};
        int rc = msg_recv(s->rendezvous->router, true, 0, &m, &err);
        if (rc == SMELT_ENOTFOUND) return;
        if (rc == 0) on_message(s, &m);
        else if (rc == SMELT_EFORMAT && m.user_id[0])
            reply_error(s->rendezvous, m.route, m.route_len, NULL, "invalid", "header", "%s", err.message);
        else log_warn("rendezvous: %s", err.message);
        msg_free(&m);
        if (rc == SMELT_EIO) return;
    }
}

static void *rendezvous_main(void *arg) {
    struct server *s = arg;
    struct rendezvous *d = s->rendezvous;
    int64_t last_sweep = mono_ms();
    while (!atomic_load(&d->stop)) {
        zmq_pollitem_t item = {.socket = d->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, poll_ms(d)) < 0 && zmq_errno() != EINTR) {
            log_error("rendezvous: zmq_poll: %s", zmq_strerror(zmq_errno()));
            sleep_ms(RDZV_POLL_MS);
        }
        if (item.revents & ZMQ_POLLIN) receive_all(s);
        bool check = mono_ms() - last_sweep >= RDZV_SWEEP_MS;
        sweep(s, check);
        if (check) last_sweep = mono_ms();
    }
    return NULL;
}

/* ---- start / stop ---- */

static int bind_router(struct server *s, struct rendezvous *d, struct smelt_error *err) {
    const char *bind = s->config.rendezvous_bind ? s->config.rendezvous_bind : RDZV_DEFAULT_BIND;
    if (!(d->router = zmq_socket(s->zmq, ZMQ_ROUTER)))
        return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = 0;
    if (zmq_setsockopt(d->router, ZMQ_LINGER, &linger, sizeof linger) != 0)
        return error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    return server_curve_bind(s, d->router, bind, "rdzv", authorize_rank, "rendezvous_bind", s->rendezvous_endpoint,
                             sizeof s->rendezvous_endpoint, err);
}

int rendezvous_start(struct server *s, struct smelt_error *err) {
    struct rendezvous *d = calloc(1, sizeof *d);
    if (!d) return error_set(err, SMELT_ENOMEM, "out of memory");
    pthread_mutex_init(&d->lock, NULL);
    d->max_keys = s->config.rendezvous_max_keys > 0 ? (size_t)s->config.rendezvous_max_keys : RDZV_DEFAULT_MAX_KEYS;
    d->max_bytes = s->config.rendezvous_max_bytes > 0 ? s->config.rendezvous_max_bytes : RDZV_DEFAULT_MAX_BYTES;
    s->rendezvous = d;
    TRY(bind_router(s, d, err));
    if (pthread_create(&d->thread, NULL, rendezvous_main, s) != 0)
        return error_set(err, SMELT_EIO, "starting the rendezvous thread failed");
    d->started = true;
    log_info("rendezvous: the ranks of jobs meet at %s", s->rendezvous_endpoint);
    return 0;
}

size_t rendezvous_keys_held(struct server *s, const char *user_id) {
    struct rendezvous *d = s->rendezvous;
    if (!d) return 0;
    pthread_mutex_lock(&d->lock);
    struct rdzv_scope *sc = scope_find(d, user_id);
    size_t n = sc ? sc->n_keys : 0;
    pthread_mutex_unlock(&d->lock);
    return n;
}

void rendezvous_free(struct server *s) {
    struct rendezvous *d = s->rendezvous;
    if (!d) return;
    if (d->started) {
        atomic_store(&d->stop, 1);
        pthread_join(d->thread, NULL);
    }
    if (d->router) zmq_close(d->router);
    while (d->scopes) {
        struct rdzv_scope *sc = d->scopes;
        d->scopes = sc->next;
        scope_free(sc);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
    s->rendezvous = NULL;
}
