/* The "smeltd:ENDPOINT" store: the rendezvous smeltd serves for the jobs it runs
 * (server/rendezvous.c, common/msg.h's rdzv.*). One DEALER, a CURVE client with the job
 * attempt's worker keypair, talks to smeltd's ROUTER; smeltd scopes every key to the
 * attempt those keys prove, so the `job` name only keeps the job's own users apart
 * ("trainer/<key>").
 *
 * One request at a time under a lock (the socket is not thread-safe); a get that waits
 * long is asked in slices of SLICE_MS, the lock let go between them, so a set from
 * another thread of this process is never held back for long. A reply that does not
 * come within its wait plus REPLY_SLACK_MS (smeltd gone, or these keys refused at the
 * handshake) is an error naming the endpoint; a late reply to an earlier request is
 * recognised by its id and dropped. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "comm/comm_internal.h"
#include "common/curve.h"
#include "common/msg.h"

#define SLICE_MS 200
#define REPLY_SLACK_MS 5000

struct smeltd_store {
    struct comm_store base;
    void *ctx, *sock;
    pthread_mutex_t lock;
    unsigned long long next_id;
    char job[65];
    char endpoint[256];
};

/* The reply to request id within wait_ms: 0 with *out (its msg, the caller frees) or an
 * error. Replies to other ids are dropped. */
static int await_reply(struct smeltd_store *s, const char *id, int64_t wait_ms, struct msg *out,
                       struct smelt_error *err) {
    int64_t deadline = mono_ms() + wait_ms;
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            return error_set_field(err, SMELT_EIO, "rendezvous",
                                   "rendezvous: smeltd at %s did not answer within %lld ms (not running, or these "
                                   "are not a running attempt's keys)", s->endpoint, (long long)wait_ms);
        int rc = msg_recv(s->sock, false, (int)left, out, err);
        if (rc == SMELT_ENOTFOUND) continue;
        if (rc) return error_wrap(err, rc, "rendezvous: smeltd at %s", s->endpoint);
        const char *got = json_string_value(json_object_get(out->header, "id"));
        if (strcmp(out->type, MSG_RDZV_REPLY) == 0 && got && strcmp(got, id) == 0) return SMELT_OK;
        msg_free(out);
    }
}

/* smeltd's refusal as an error: "not_found" is SMELT_ENOTFOUND, the others SMELT_EINVAL
 * (a request at fault, a limit) or SMELT_EIO (the attempt ended), with smeltd's field. */
static int refusal(const struct msg *m, struct smelt_error *err) {
    json_t *e = json_object_get(m->header, "error");
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *field = json_string_value(json_object_get(e, "field"));
    const char *message = json_string_value(json_object_get(e, "message"));
    int rc = !code ? SMELT_EFORMAT : strcmp(code, "not_found") == 0 ? SMELT_ENOTFOUND
           : strcmp(code, "ended") == 0 ? SMELT_EIO : SMELT_EINVAL;
    return error_set_field(err, rc, field ? field : "rendezvous", "%s",
                           message ? message : "smeltd refused the request");
}

/* One request and its reply; *value (get) is the value frame, malloc'd. */
static int request(struct smeltd_store *s, const char *type, const char *key, int timeout_ms, const void *data,
                   size_t len, void **value, size_t *value_len, struct smelt_error *err) {
    char full[COMM_KEY_BYTES + 80], id[32];
    snprintf(full, sizeof full, "%s/%s", s->job, key);
    pthread_mutex_lock(&s->lock);
    snprintf(id, sizeof id, "%llu", ++s->next_id);
    json_t *h = json_pack("{s:s, s:s}", "id", id, "key", full);
    if (h && timeout_ms >= 0) json_object_set_new(h, "timeout_ms", json_integer(timeout_ms));
    struct msg_array a = {(void *)data, len};
    struct msg m = {0};
    int rc = h ? msg_send(s->sock, NULL, 0, type, h, &a, data ? 1 : 0, err)
               : error_set(err, SMELT_ENOMEM, "rendezvous: out of memory");
    json_decref(h);
    if (!rc) rc = await_reply(s, id, (timeout_ms > 0 ? timeout_ms : 0) + REPLY_SLACK_MS, &m, err);
    pthread_mutex_unlock(&s->lock);
    if (rc) return rc;
    if (!json_is_true(json_object_get(m.header, "ok"))) rc = refusal(&m, err);
    else if (value && m.n_arrays != 1) rc = error_set(err, SMELT_EFORMAT, "rendezvous: a reply without the value");
    else if (value) {
        *value = m.arrays[0].data;
        *value_len = m.arrays[0].bytes;
        m.arrays[0].data = NULL;
    }
    msg_free(&m);
    return rc;
}

static int check_key(const char *key, struct smelt_error *err) {
    if (!key || !*key || strlen(key) >= COMM_KEY_BYTES)
        return error_set_field(err, SMELT_EINVAL, "key", "store key is empty or over %d bytes", COMM_KEY_BYTES - 1);
    return SMELT_OK;
}

static int smeltd_set(void *impl, const char *key, const void *data, size_t len, struct smelt_error *err) {
    TRY(check_key(key, err));
    static const char empty = 0;
    return error_wrap(err, request(impl, MSG_RDZV_SET, key, -1, len ? data : &empty, len, NULL, NULL, err),
                      "rendezvous set '%s'", key);
}

/* Asks in slices until the key comes or timeout_ms pass. */
static int smeltd_get(void *impl, const char *key, int timeout_ms, void **data, size_t *len,
                      struct smelt_error *err) {
    *data = NULL;
    *len = 0;
    TRY(check_key(key, err));
    int64_t deadline = mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int64_t left = deadline - mono_ms();
        int slice = left <= 0 ? 0 : left < SLICE_MS ? (int)left : SLICE_MS;
        int rc = request(impl, MSG_RDZV_GET, key, slice, NULL, 0, data, len, err);
        if (rc != SMELT_ENOTFOUND || mono_ms() >= deadline) {
            if (rc == SMELT_ENOTFOUND)
                return error_set(err, SMELT_ENOTFOUND, "rendezvous key '%s' not set within %d ms", key, timeout_ms);
            return rc;
        }
    }
}

static int smeltd_wait(void *impl, const char *const *keys, size_t nkeys, int timeout_ms, struct smelt_error *err) {
    int64_t deadline = mono_ms() + timeout_ms;
    for (size_t i = 0; i < nkeys; i++) {
        int64_t left = deadline - mono_ms();
        void *data = NULL;
        size_t len = 0;
        int rc = smeltd_get(impl, keys[i], left > 0 ? (int)left : 0, &data, &len, err);
        free(data);
        if (rc == SMELT_ENOTFOUND)
            return error_set(err, SMELT_ENOTFOUND, "rendezvous key '%s' not set within %d ms", keys[i], timeout_ms);
        TRY(rc);
    }
    return SMELT_OK;
}

static void smeltd_close(void *impl) {
    struct smeltd_store *s = impl;
    if (s->sock) zmq_close(s->sock);
    if (s->ctx) zmq_ctx_term(s->ctx);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct comm_store_ops SMELTD_OPS = {smeltd_set, smeltd_get, smeltd_wait, smeltd_close};

static int connect_socket(struct smeltd_store *s, const struct curve_job_keys *keys, struct smelt_error *err) {
    if (!(s->ctx = zmq_ctx_new()) || !(s->sock = zmq_socket(s->ctx, ZMQ_DEALER)))
        return error_set(err, SMELT_EIO, "rendezvous: zmq: %s", zmq_strerror(zmq_errno()));
    int linger = 0;
    if (zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger) != 0)
        return error_set(err, SMELT_EIO, "rendezvous: zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    TRY(error_wrap(err, curve_socket_client(s->sock, &keys->worker, keys->server_public_key, err), "rendezvous"));
    if (zmq_connect(s->sock, s->endpoint) != 0)
        return error_set_field(err, SMELT_EINVAL, "rendezvous", "rendezvous: connecting to smeltd at %s: %s",
                               s->endpoint, zmq_strerror(zmq_errno()));
    return SMELT_OK;
}

int comm_store_smeltd_create(const char *endpoint, const char *job, const struct curve_job_keys *keys,
                             struct comm_store **out, struct smelt_error *err) {
    if (!keys || !keys->present)
        return error_set_field(err, SMELT_EINVAL, "rendezvous",
                               "rendezvous 'smeltd:%.64s' needs the job attempt's keys (a process smeltd started)",
                               endpoint);
    if (strlen(endpoint) >= sizeof ((struct smeltd_store *)0)->endpoint)
        return error_set_field(err, SMELT_EINVAL, "rendezvous", "rendezvous endpoint is over 255 bytes");
    struct smeltd_store *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, SMELT_ENOMEM, "rendezvous store: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    snprintf(s->job, sizeof s->job, "%s", job);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    int rc = connect_socket(s, keys, err);
    if (rc) {
        smeltd_close(s);
        return rc;
    }
    s->base.ops = &SMELTD_OPS;
    s->base.impl = s;
    *out = &s->base;
    return SMELT_OK;
}
