/* The ZAP handler of common/curve.h: libzmq asks it, over the fixed inproc endpoint of
 * RFC 27, whether a CURVE client may complete its handshake; the answer's user id is then
 * stamped on every message of that connection. */
#include "common/curve.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_FRAMES 7 /* version, request id, domain, address, identity, mechanism, credentials */
#define ZAP_POLL_MS 100

struct zap_domain {
    char name[64];
    zap_authorize_fn fn;
    void *arg;
};

struct zap_handler {
    void *rep;
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t lock; /* domains and counts */
    struct zap_domain domains[ZAP_MAX_DOMAINS];
    int n_domains;
    long allowed, refused;
};

struct zap_request {
    zmq_msg_t frames[ZAP_FRAMES];
    int n;
};

/* Reads one request whole; false when the socket has nothing (timeout) or failed. */
static bool read_request(void *rep, struct zap_request *r) {
    r->n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, rep, 0) < 0) {
            zmq_msg_close(&part);
            for (int i = 0; i < r->n; i++) zmq_msg_close(&r->frames[i]);
            r->n = 0;
            return false;
        }
        more = zmq_msg_more(&part);
        if (r->n < ZAP_FRAMES) r->frames[r->n++] = part;
        else zmq_msg_close(&part);
    }
    return true;
}

static void frame_text(zmq_msg_t *m, char *out, size_t cap) {
    size_t len = zmq_msg_size(m);
    if (len >= cap) len = cap - 1;
    memcpy(out, zmq_msg_data(m), len);
    out[len] = 0;
}

static void send_text(void *rep, const char *s, bool more) {
    zmq_send(rep, s, strlen(s), more ? ZMQ_SNDMORE : 0);
}

/* Always answers (a REP socket takes no request before it has answered the last one);
 * request_id NULL: a request too short to have one. */
static void reply(void *rep, zmq_msg_t *request_id, bool ok, const char *status_text, const char *user_id) {
    send_text(rep, "1.0", true);
    if (request_id) zmq_send(rep, zmq_msg_data(request_id), zmq_msg_size(request_id), ZMQ_SNDMORE);
    else zmq_send(rep, "", 0, ZMQ_SNDMORE);
    send_text(rep, ok ? "200" : "400", true);
    send_text(rep, status_text, true);
    send_text(rep, ok ? user_id : "", true);
    zmq_send(rep, "", 0, 0); /* metadata: none */
}

/* The domain's verdict on one CURVE request; fills user_id and why. */
static bool decide(struct zap_handler *h, const char *domain, const char *address, zmq_msg_t *mechanism,
                   zmq_msg_t *credentials, char *user_id, char *why, size_t why_cap) {
    char mech[16];
    frame_text(mechanism, mech, sizeof mech);
    if (strcmp(mech, "CURVE") != 0 || zmq_msg_size(credentials) != 32) {
        snprintf(why, why_cap, "mechanism %s (CURVE needed)", mech);
        return false;
    }
    char key[CURVE_KEY_BYTES];
    if (!zmq_z85_encode(key, zmq_msg_data(credentials), 32)) {
        snprintf(why, why_cap, "key not encodable");
        return false;
    }
    zap_authorize_fn fn = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&h->lock);
    for (int i = 0; i < h->n_domains; i++)
        if (strcmp(h->domains[i].name, domain) == 0) fn = h->domains[i].fn, arg = h->domains[i].arg;
    pthread_mutex_unlock(&h->lock);
    if (!fn) {
        snprintf(why, why_cap, "no such domain");
        return false;
    }
    user_id[0] = 0;
    if (!fn(arg, address, key, user_id, CURVE_USER_ID_BYTES, why, why_cap)) return false;
    if (!user_id[0]) {
        snprintf(why, why_cap, "no user id given");
        return false;
    }
    return true;
}

static void handle(struct zap_handler *h, struct zap_request *r) {
    char version[8] = "", domain[64] = "", address[64] = "", user_id[CURVE_USER_ID_BYTES] = "";
    char why[160] = "malformed request";
    bool ok = false;
    if (r->n == ZAP_FRAMES) {
        frame_text(&r->frames[0], version, sizeof version);
        frame_text(&r->frames[2], domain, sizeof domain);
        frame_text(&r->frames[3], address, sizeof address);
        if (strcmp(version, "1.0") == 0)
            ok = decide(h, domain, address, &r->frames[5], &r->frames[6], user_id, why, sizeof why);
    }
    reply(h->rep, r->n >= 2 ? &r->frames[1] : NULL, ok, ok ? "OK" : why, user_id);
    pthread_mutex_lock(&h->lock);
    if (ok) h->allowed++;
    else h->refused++;
    pthread_mutex_unlock(&h->lock);
    if (!ok) {
        char key[CURVE_KEY_BYTES] = "";
        if (r->n == ZAP_FRAMES && zmq_msg_size(&r->frames[6]) == 32)
            zmq_z85_encode(key, zmq_msg_data(&r->frames[6]), 32);
        log_warn("curve: refused a %s connection from %s (key %.8s...): %s", domain[0] ? domain : "?",
                 address[0] ? address : "inproc", key[0] ? key : "none", why);
    }
    for (int i = 0; i < r->n; i++) zmq_msg_close(&r->frames[i]);
}

static void *zap_thread(void *arg) {
    struct zap_handler *h = arg;
    while (!atomic_load(&h->stop)) {
        struct zap_request r;
        if (read_request(h->rep, &r)) handle(h, &r);
        else if (zmq_errno() == ETERM) break;
    }
    return NULL;
}

int zap_handler_start(void *zmq_context, struct zap_handler **out, struct smelt_error *err) {
    *out = NULL;
    struct zap_handler *h = calloc(1, sizeof *h);
    if (!h) return error_set(err, SMELT_ENOMEM, "zap handler: out of memory");
    pthread_mutex_init(&h->lock, NULL);
    int timeout = ZAP_POLL_MS, linger = 0;
    h->rep = zmq_socket(zmq_context, ZMQ_REP);
    int rc = 0;
    if (!h->rep) rc = error_set(err, SMELT_EIO, "zap handler: zmq_socket: %s", zmq_strerror(zmq_errno()));
    else if (zmq_setsockopt(h->rep, ZMQ_RCVTIMEO, &timeout, sizeof timeout) ||
             zmq_setsockopt(h->rep, ZMQ_LINGER, &linger, sizeof linger) || zmq_bind(h->rep, ZAP_ENDPOINT))
        rc = error_set(err, SMELT_EIO, "zap handler: %s: %s", ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
    else if ((errno = pthread_create(&h->thread, NULL, zap_thread, h)) != 0)
        rc = error_set(err, SMELT_EIO, "zap handler: pthread_create: %s", strerror(errno));
    if (rc) {
        if (h->rep) zmq_close(h->rep);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return rc;
    }
    *out = h;
    return 0;
}

int zap_handler_add_domain(struct zap_handler *h, const char *domain, zap_authorize_fn fn, void *arg,
                           struct smelt_error *err) {
    if (!domain[0] || strlen(domain) >= sizeof h->domains[0].name)
        return error_set(err, SMELT_EINVAL, "zap domain: 1..%zu bytes", sizeof h->domains[0].name - 1);
    pthread_mutex_lock(&h->lock);
    int rc = 0;
    if (h->n_domains == ZAP_MAX_DOMAINS) rc = error_set(err, SMELT_EINVAL, "zap: more than %d domains", ZAP_MAX_DOMAINS);
    for (int i = 0; !rc && i < h->n_domains; i++)
        if (strcmp(h->domains[i].name, domain) == 0) rc = error_set(err, SMELT_EINVAL, "zap: domain %s twice", domain);
    if (!rc) {
        struct zap_domain *d = &h->domains[h->n_domains++];
        snprintf(d->name, sizeof d->name, "%s", domain);
        d->fn = fn;
        d->arg = arg;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

void zap_handler_counts(struct zap_handler *h, long *allowed, long *refused) {
    pthread_mutex_lock(&h->lock);
    *allowed = h->allowed;
    *refused = h->refused;
    pthread_mutex_unlock(&h->lock);
}

void zap_handler_stop(struct zap_handler *h) {
    if (!h) return;
    atomic_store(&h->stop, true);
    pthread_join(h->thread, NULL);
    zmq_close(h->rep);
    pthread_mutex_destroy(&h->lock);
    free(h);
}
