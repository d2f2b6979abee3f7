/* Trainer rank 0's client of smelt-rollout workers (rollout.h's last section): batches of
 * generation requests spread over the workers and their results filed by (request,
 * sample), and the ZeroMQ transport of weightsync/ (begin, buckets and end on the same
 * DEALER sockets, acks gathered by the same wait loop that files results). Every wait
 * goes through pump(), which bounds it by a deadline and declares a silent worker dead. */
#include "rollout/rollout.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/json.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "comm/comm.h"
#include "common/msg.h"
#include "lora/lora.h"
#include "weightsync/weightsync.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gen.request's and gen.result's arrays are little-endian and are read as the host holds them"
#endif

/* Messages queued to one worker before sends wait: bounds the memory a weight sync
 * holds in the sender's queue (this many buckets per worker). */
#define SEND_QUEUE_MESSAGES 64
/* The longest one zmq_poll sleeps, so liveness is looked at that often. */
#define POLL_SLICE_MS 50

struct client_worker {
    char endpoint[ROLLOUT_CLIENT_ENDPOINT_BYTES];
    void *socket;
    int64_t last_heard_ms;        /* the last message from it (or when it was given work) */
    int64_t asked_ms;             /* when health.request went out unanswered; 0: none */
    int64_t samples_owed;         /* of the batch in flight */
    bool sync_owed;               /* the answer to the sync in progress */
    struct weightsync_ack ack;    /* its answer, once in */
    uint64_t resets;              /* times its socket was replaced (it died) */
};

struct client_request {
    int64_t slot;                 /* its first sample's */
    int n, done, worker;
};

enum batch_state { BATCH_NONE, BATCH_ACTIVE, BATCH_DONE };

struct rollout_client {
    struct rollout_client_config config;  /* endpoints points at the workers' copies */
    void *ctx;
    bool own_ctx;
    struct client_worker *workers;
    int n_workers;
    int next_worker;              /* where the least-loaded search starts (round robin on ties) */
    /* The batch in flight. */
    enum batch_state batch;
    uint64_t batch_seq;
    struct client_request *reqs;
    int n_reqs;
    struct rollout_client_results out;
    uint8_t *filled;              /* [n_samples] */
    int64_t n_samples, n_filled;
    int64_t poll_mark;            /* n_filled when the current poll began */
    bool batch_failed;
    struct smelt_error batch_error;
    /* The sync in progress. */
    int64_t sync_version;
    int64_t sync_deadline_ms;
    bool sync_failed, sync_begun, sync_ended;
    struct smelt_error sync_error;
    /* The broadcast transport (config.weights_comm set): the store, the communicator
     * (NULL until the first sync, and after a failed one), its name's generation, and the
     * sync in progress's bucket hashes for weights.end. */
    char comm_spec[ROLLOUT_CLIENT_ENDPOINT_BYTES], comm_job[WEIGHTSYNC_COMM_NAME_BYTES];
    struct comm_store *store;
    struct comm *comm;
    int comm_generation;
    uint64_t *hashes;
    int64_t hashes_cap;
    /* CURVE (config.curve_keys set): the keys every socket is made with. */
    bool curve;
    struct curve_keypair curve_keys;
    char curve_server_key[CURVE_KEY_BYTES];
};

/* ---- sockets ---- */

static int open_socket(struct rollout_client *c, struct client_worker *w, struct smelt_error *err) {
    void *s = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!s) return error_set(err, SMELT_EIO, "rollout client: zmq_socket: %s", zmq_strerror(zmq_errno()));
    /* Unbounded receive queue: a worker that finds this client's queue full counts it as
     * gone and drops its requests. Bounded send queue: a sync waits rather than holding
     * the whole model in ZeroMQ's queues. Linger 0: a closed socket drops what it had. */
    int zero = 0, hwm = SEND_QUEUE_MESSAGES;
    int rc = SMELT_OK;
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) || zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm))
        rc = error_set(err, SMELT_EIO, "rollout client: worker %s: %s", w->endpoint, zmq_strerror(zmq_errno()));
    else if (c->curve && curve_socket_client(s, &c->curve_keys, c->curve_server_key, err))
        rc = error_wrap(err, err->code, "rollout client: worker %s: CURVE", w->endpoint);
    else if (zmq_connect(s, w->endpoint))
        rc = error_set(err, SMELT_EIO, "rollout client: worker %s: %s", w->endpoint, zmq_strerror(zmq_errno()));
    if (rc) {
        zmq_close(s);
        return rc;
    }
    w->socket = s;
    return SMELT_OK;
}

/* A dead worker's socket is replaced: what was queued for it is dropped, and whatever
 * the old connection still delivers can no longer reach this client. */
static void reset_worker(struct rollout_client *c, struct client_worker *w) {
    zmq_close(w->socket);
    w->socket = NULL;
    w->resets++;
    w->samples_owed = 0;
    w->sync_owed = false;
    w->asked_ms = 0;
    struct smelt_error err = {0};
    if (open_socket(c, w, &err)) log_error("%s (the worker stays unreachable)", err.message);
}

/* One attempt that never waits: *sent tells whether the message went (false: the
 * worker's queue is full). header stays the caller's. */
static int try_send(struct client_worker *w, const char *type, json_t *header, const struct msg_array *arrays,
                    int n_arrays, bool *sent, struct smelt_error *err) {
    *sent = false;
    if (!w->socket) return error_set(err, SMELT_EIO, "rollout client: worker %s has no socket", w->endpoint);
    zmq_pollitem_t item = {.socket = w->socket, .events = ZMQ_POLLOUT};
    int n = zmq_poll(&item, 1, 0);
    if (n < 0 && zmq_errno() != EINTR)
        return error_set(err, SMELT_EIO, "rollout client: worker %s: zmq_poll: %s", w->endpoint,
                         zmq_strerror(zmq_errno()));
    if (n <= 0) return SMELT_OK;
    /* Room for one message: its first frame goes, and the rest with it. */
    int rc = msg_send(w->socket, NULL, 0, type, header, arrays, n_arrays, err);
    if (rc) return error_wrap(err, rc, "rollout client: worker %s", w->endpoint);
    *sent = true;
    return SMELT_OK;
}

static void check_liveness(struct rollout_client *c, int64_t now);
static void drain(struct rollout_client *c, int k);

/* Sends when the worker's queue has room, waiting until deadline_ms at most; meanwhile
 * what the workers send is handled and their liveness watched, so a worker that dies
 * while its queue is full is named at once. header is released. */
static int send_to(struct rollout_client *c, struct client_worker *w, const char *type, json_t *header,
                   const struct msg_array *arrays, int n_arrays, int64_t deadline_ms, struct smelt_error *err) {
    if (!header) return error_set(err, SMELT_ENOMEM, "rollout client: out of memory for %s", type);
    uint64_t resets = w->resets;
    zmq_pollitem_t items[ROLLOUT_CLIENT_MAX_WORKERS];
    int rc = SMELT_OK;
    for (;;) {
        bool sent;
        if ((rc = try_send(w, type, header, arrays, n_arrays, &sent, err)) != 0 || sent) break;
        int64_t now = mono_ms();
        if (now >= deadline_ms) {
            rc = error_set(err, SMELT_EIO, "rollout client: worker %s takes no %s: its queue stayed full until the "
                           "deadline", w->endpoint, type);
            break;
        }
        for (int k = 0; k < c->n_workers; k++)
            items[k] = (zmq_pollitem_t){.socket = c->workers[k].socket,
                                        .events = c->workers[k].socket ? ZMQ_POLLIN : 0};
        items[w - c->workers].events |= ZMQ_POLLOUT; /* wake as soon as there is room */
        int64_t slice = deadline_ms - now < POLL_SLICE_MS ? deadline_ms - now : POLL_SLICE_MS;
        if (zmq_poll(items, c->n_workers, (long)slice) > 0)
            for (int k = 0; k < c->n_workers; k++)
                if (items[k].revents & ZMQ_POLLIN) drain(c, k);
        check_liveness(c, mono_ms());
        if (w->resets != resets) {
            rc = error_set(err, SMELT_EIO, "rollout client: worker %s died while %s waited to be sent", w->endpoint,
                           type);
            break;
        }
    }
    json_decref(header);
    return rc;
}

static bool owes(const struct client_worker *w) { return w->samples_owed > 0 || w->sync_owed; }

/* Work given to a worker that owed nothing starts its quiet clock now. */
static void owe_from_now(struct client_worker *w) {
    if (!owes(w)) {
        w->last_heard_ms = mono_ms();
        w->asked_ms = 0;
    }
}

/* ---- failures ---- */

static void fail_batch(struct rollout_client *c, const struct smelt_error *why) {
    if (c->batch != BATCH_ACTIVE || c->batch_failed) return;
    c->batch_failed = true;
    c->batch_error = *why;
}

static void fail_sync(struct rollout_client *c, const struct smelt_error *why) {
    if (c->sync_failed) return;
    c->sync_failed = true;
    c->sync_error = *why;
}

/* What a dead or misbehaving worker owed fails: the batch, the sync, or both. */
static void fail_worker(struct rollout_client *c, struct client_worker *w, const struct smelt_error *why) {
    if (w->samples_owed > 0) fail_batch(c, why);
    if (w->sync_owed) fail_sync(c, why);
    reset_worker(c, w);
}

static void describe_owed(const struct rollout_client *c, const struct client_worker *w, char *buf, size_t bytes) {
    if (w->samples_owed > 0 && w->sync_owed)
        snprintf(buf, bytes, "%lld samples and the weights of version %lld", (long long)w->samples_owed,
                 (long long)c->sync_version);
    else if (w->sync_owed) snprintf(buf, bytes, "the weights of version %lld", (long long)c->sync_version);
    else snprintf(buf, bytes, "%lld samples", (long long)w->samples_owed);
}

/* A worker that owes something and went quiet gets a health.request; one that stays
 * silent after it is dead. */
static void check_liveness(struct rollout_client *c, int64_t now) {
    for (int k = 0; k < c->n_workers; k++) {
        struct client_worker *w = &c->workers[k];
        if (!owes(w)) continue;
        if (c->config.alive && !c->config.alive(c->config.alive_ctx, k)) {
            struct smelt_error err = {0};
            error_set(&err, SMELT_EIO, "rollout client: worker %s is gone (its caller says so)", w->endpoint);
            log_error("%s", err.message);
            fail_worker(c, w, &err);
        } else if (!w->asked_ms && now - w->last_heard_ms >= c->config.quiet_ms) {
            /* A full queue: asked again next time (sending waits are bounded by themselves). */
            struct smelt_error err = {0};
            json_t *h = json_object();
            bool sent = false;
            int rc = h ? try_send(w, MSG_HEALTH_REQUEST, h, NULL, 0, &sent, &err)
                       : error_set(&err, SMELT_ENOMEM, "rollout client: out of memory");
            json_decref(h);
            if (rc) fail_worker(c, w, &err);
            else if (sent) w->asked_ms = now;
        } else if (w->asked_ms && now - w->asked_ms >= c->config.health_timeout_ms) {
            char owed[128];
            describe_owed(c, w, owed, sizeof owed);
            struct smelt_error err = {0};
            error_set(&err, SMELT_EIO, "rollout client: worker %s stopped answering: silent for %lld ms, health.request "
                      "unanswered for %lld ms (it owes %s)", w->endpoint, (long long)(now - w->last_heard_ms),
                      (long long)(now - w->asked_ms), owed);
            log_error("%s", err.message);
            fail_worker(c, w, &err);
        }
    }
}

/* ---- messages from the workers ---- */

static const char *finish_reason(const char *s) {
    if (!s) return NULL;
    if (strcmp(s, ROLLOUT_FINISH_STOP) == 0) return ROLLOUT_FINISH_STOP;
    if (strcmp(s, ROLLOUT_FINISH_LENGTH) == 0) return ROLLOUT_FINISH_LENGTH;
    if (strcmp(s, ROLLOUT_FINISH_ABORT) == 0) return ROLLOUT_FINISH_ABORT;
    return NULL;
}

/* The request index of an id "<batch>:<i>" of the batch in flight, else -1 (another
 * batch's: stale). */
static int request_of(const struct rollout_client *c, const char *id) {
    if (!id || c->batch != BATCH_ACTIVE) return -1;
    char *end;
    errno = 0;
    unsigned long long seq = strtoull(id, &end, 10);
    if (errno || *end != ':' || seq != c->batch_seq) return -1;
    long i = strtol(end + 1, &end, 10);
    return *end == 0 && i >= 0 && i < c->n_reqs ? (int)i : -1;
}

static void protocol_error(struct rollout_client *c, struct client_worker *w, const char *what) {
    struct smelt_error err = {0};
    error_set(&err, SMELT_EFORMAT, "rollout client: worker %s sent %s", w->endpoint, what);
    log_error("%s", err.message);
    fail_worker(c, w, &err);
}

/* The sample's header fields and frames, checked; then its slot. */
static void on_result(struct rollout_client *c, int k, const struct msg *m) {
    struct client_worker *w = &c->workers[k];
    int i = request_of(c, json_string_value(json_object_get(m->header, "id")));
    if (i < 0) return; /* an earlier batch's, or aborted */
    struct client_request *q = &c->reqs[i];
    json_t *index = json_object_get(m->header, "index"), *n = json_object_get(m->header, "n_tokens");
    json_t *version = json_object_get(m->header, "policy_version");
    const char *reason = finish_reason(json_string_value(json_object_get(m->header, "finish_reason")));
    if (!json_is_integer(index) || json_integer_value(index) < 0 || json_integer_value(index) >= q->n || !reason ||
        !json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > c->out.max_tokens ||
        !json_is_integer(version) || m->n_arrays != 2 ||
        m->arrays[0].bytes != (size_t)json_integer_value(n) * sizeof(int32_t) ||
        m->arrays[1].bytes != (size_t)json_integer_value(n) * sizeof(float))
        return protocol_error(c, w, "a gen.result with bad fields or frames");
    int64_t slot = q->slot + json_integer_value(index), tokens = json_integer_value(n);
    if (c->filled[slot]) return protocol_error(c, w, "a sample twice");
    if (tokens) {
        memcpy(c->out.ids + slot * c->out.max_tokens, m->arrays[0].data, m->arrays[0].bytes);
        memcpy(c->out.logprobs + slot * c->out.max_tokens, m->arrays[1].data, m->arrays[1].bytes);
    }
    c->out.n_tokens[slot] = tokens;
    c->out.policy_version[slot] = json_integer_value(version);
    c->out.finish_reason[slot] = reason;
    if (c->out.worker) c->out.worker[slot] = k;
    c->filled[slot] = 1;
    c->n_filled++;
    q->done++;
    if (w->samples_owed > 0) w->samples_owed--;
}

static void error_of(const struct msg *m, const char **message, const char **field) {
    json_t *e = json_object_get(m->header, "error");
    *message = json_string_value(json_object_get(e, "message"));
    *field = json_string_value(json_object_get(e, "field"));
    if (!*message) *message = "(no message)";
}

static void on_gen_error(struct rollout_client *c, int k, const struct msg *m) {
    struct client_worker *w = &c->workers[k];
    const char *message, *field, *id = json_string_value(json_object_get(m->header, "id"));
    error_of(m, &message, &field);
    int i = request_of(c, id);
    struct smelt_error err = {0};
    if (i >= 0) {
        error_set(&err, SMELT_EIO, "rollout client: request %d failed on worker %s: %s%s%s%s", i, w->endpoint, message,
                  field ? " (field " : "", field ? field : "", field ? ")" : "");
        fail_batch(c, &err);
    } else if (!id) {
        error_set(&err, SMELT_EFORMAT, "rollout client: worker %s refused a message: %s%s%s%s", w->endpoint, message,
                  field ? " (field " : "", field ? field : "", field ? ")" : "");
        if (w->samples_owed > 0) fail_batch(c, &err);
        else log_warn("%s", err.message);
    }
}

static void on_weights_answer(struct rollout_client *c, int k, const struct msg *m) {
    struct client_worker *w = &c->workers[k];
    int64_t version = weightsync_header_version(m);
    if (!w->sync_owed || (version >= 0 && version != c->sync_version)) return; /* an earlier sync's */
    struct smelt_error err = {0};
    if (strcmp(m->type, MSG_WEIGHTS_ERROR) == 0) {
        const char *message, *field;
        error_of(m, &message, &field);
        error_set(&err, SMELT_EINVAL, "rollout client: worker %s refused the weights of version %lld: %s%s%s%s",
                  w->endpoint, (long long)c->sync_version, message, field ? " (field " : "", field ? field : "",
                  field ? ")" : "");
        fail_sync(c, &err);
    } else if (weightsync_ack_read(m, &w->ack, &err)) {
        error_wrap(&err, err.code, "rollout client: worker %s", w->endpoint);
        fail_sync(c, &err);
    }
    w->sync_owed = false;
}

static void on_message(struct rollout_client *c, int k, const struct msg *m) {
    struct client_worker *w = &c->workers[k];
    w->last_heard_ms = mono_ms();
    w->asked_ms = 0;
    if (strcmp(m->type, MSG_GEN_RESULT) == 0) on_result(c, k, m);
    else if (strcmp(m->type, MSG_GEN_ERROR) == 0) on_gen_error(c, k, m);
    else if (strcmp(m->type, MSG_WEIGHTS_ACK) == 0 || strcmp(m->type, MSG_WEIGHTS_ERROR) == 0)
        on_weights_answer(c, k, m);
    else if (strcmp(m->type, MSG_HEALTH_REPLY) != 0)
        log_debug("rollout client: worker %s sent %s; ignored", w->endpoint, m->type);
}

/* Handles every message already waiting on worker k. */
static void drain(struct rollout_client *c, int k) {
    struct client_worker *w = &c->workers[k];
    for (;;) {
        struct msg m;
        struct smelt_error err = {0};
        int rc = w->socket ? msg_recv(w->socket, false, 0, &m, &err) : SMELT_ENOTFOUND;
        if (rc == SMELT_ENOTFOUND) return;
        if (rc == SMELT_EFORMAT) {
            msg_free(&m);
            error_wrap(&err, rc, "rollout client: worker %s sent a malformed message", w->endpoint);
            fail_worker(c, w, &err);
            return;
        }
        if (rc) {
            error_wrap(&err, rc, "rollout client: worker %s", w->endpoint);
            fail_worker(c, w, &err);
            return;
        }
        on_message(c, k, &m);
        msg_free(&m);
    }
}

typedef bool (*pump_done_fn)(const struct rollout_client *c);

/* Receives and handles messages until done(c), or deadline_ms (then timed_out is set
 * when given, else it is an error naming the workers that still owe something). */
static int pump(struct rollout_client *c, int64_t deadline_ms, pump_done_fn done, bool *timed_out,
                struct smelt_error *err) {
    zmq_pollitem_t items[ROLLOUT_CLIENT_MAX_WORKERS];
    for (;;) {
        if (done(c)) return SMELT_OK;
        int64_t now = mono_ms();
        check_liveness(c, now);
        if (done(c)) return SMELT_OK;
        if (now >= deadline_ms) break;
        for (int k = 0; k < c->n_workers; k++)
            items[k] = (zmq_pollitem_t){.socket = c->workers[k].socket, .events = c->workers[k].socket ? ZMQ_POLLIN : 0};
        int64_t slice = deadline_ms - now < POLL_SLICE_MS ? deadline_ms - now : POLL_SLICE_MS;
        int n = zmq_poll(items, c->n_workers, (long)slice);
        if (n < 0 && zmq_errno() != EINTR)
            return error_set(err, SMELT_EIO, "rollout client: zmq_poll: %s", zmq_strerror(zmq_errno()));
        for (int k = 0; n > 0 && k < c->n_workers; k++)
            if (items[k].revents & ZMQ_POLLIN) drain(c, k);
    }
    if (timed_out) {
        *timed_out = true;
        return SMELT_OK;
    }
    int at = error_set(err, SMELT_EIO, "rollout client: timed out after %lld ms;", (long long)c->config.timeout_ms);
    for (int k = 0; k < c->n_workers; k++) {
        const struct client_worker *w = &c->workers[k];
        if (!owes(w)) continue;
        char owed[128];
        describe_owed(c, w, owed, sizeof owed);
        size_t len = strlen(err->message);
        snprintf(err->message + len, sizeof err->message - len, " worker %s owes %s;", w->endpoint, owed);
    }
    return at;
}

/* ---- batches ---- */

static int check_request(const struct rollout_request *r, int i, int64_t max_tokens, struct smelt_error *err) {
    char f[48];
    const char *bad = NULL;
    if (!r->prompt || r->n_prompt < 1) bad = "prompt";
    else if (r->n < 1 || r->n > 256) bad = "n";
    else if (r->max_new_tokens < 1 || r->max_new_tokens > max_tokens) bad = "max_new_tokens";
    else if (r->seed > (uint64_t)INT64_MAX) bad = "seed";
    else if (r->n_stop_ids < 0 || r->n_stop_ids > ROLLOUT_MAX_STOP) bad = "stop_ids";
    else if (r->n_stop_strings < 0 || r->n_stop_strings > ROLLOUT_MAX_STOP) bad = "stop_strings";
    if (!bad) return SMELT_OK;
    snprintf(f, sizeof f, "requests[%d].%s", i, bad);
    return error_set_field(err, SMELT_EINVAL, f, "rollout client: %s: out of range (prompt: non-empty; n: 1..256; "
                           "max_new_tokens: 1..the results' max_tokens %lld; seed: <= 2^63-1; at most %d stop ids and "
                           "strings)", f, (long long)max_tokens, ROLLOUT_MAX_STOP);
}

/* The request's stop ids and strings as JSON arrays (NULL when out of memory). */
static json_t *stop_arrays(const struct rollout_request *r, json_t **stop) {
    json_t *ids = json_array();
    *stop = json_array();
    bool ok = ids && *stop;
    for (int k = 0; ok && k < r->n_stop_ids; k++) ok = json_array_append_new(ids, json_integer(r->stop_ids[k])) == 0;
    for (int k = 0; ok && k < r->n_stop_strings; k++)
        ok = json_array_append_new(*stop, json_string(r->stop_strings[k])) == 0;
    if (ok) return ids;
    json_decref(ids);
    json_decref(*stop);
    return *stop = NULL;
}

/* gen.request's header: every sampling field as the engine takes it, and ignore_eos, so
 * that the worker stops on the request's stop ids alone, as the engine does; "more" when
 * another request of the batch goes to the same worker after it. */
static json_t *request_header(const struct rollout_client *c, const struct rollout_request *r, int i, bool more) {
    char id[48];
    snprintf(id, sizeof id, "%" PRIu64 ":%d", c->batch_seq, i);
    json_t *stop, *stop_ids = stop_arrays(r, &stop);
    if (!stop_ids) return NULL;
    json_t *h = json_pack("{s:s, s:i, s:I, s:f, s:I, s:f, s:f, s:I, s:o, s:o, s:b}", "id", id, "n", r->n,
                          "max_new_tokens", (json_int_t)r->max_new_tokens, "temperature",
                          (double)r->sampling.temperature, "top_k", (json_int_t)r->sampling.top_k, "top_p",
                          (double)r->sampling.top_p, "min_p", (double)r->sampling.min_p, "seed", (json_int_t)r->seed,
                          "stop_token_ids", stop_ids, "stop", stop, "ignore_eos", 1);
    if (h && more && json_object_set_new(h, "more", json_true())) {
        json_decref(h);
        return NULL;
    }
    return h; /* json_pack's "o" took both arrays, also when it failed */
}

/* The worker owing the fewest samples, searching from next_worker (so ties rotate). */
static int least_loaded(struct rollout_client *c) {
    int best = -1;
    for (int j = 0; j < c->n_workers; j++) {
        int k = (c->next_worker + j) % c->n_workers;
        if (best < 0 || c->workers[k].samples_owed < c->workers[best].samples_owed) best = k;
    }
    c->next_worker = (best + 1) % c->n_workers;
    return best;
}

/* Each request's worker, chosen before anything is sent (so that each request can say
 * whether more follow to its worker): the one owing the fewest samples at that point. */
static void assign_workers(struct rollout_client *c, const struct rollout_request *requests, int n_requests) {
    for (int i = 0; i < n_requests; i++) {
        c->reqs[i].worker = least_loaded(c);
        c->workers[c->reqs[i].worker].samples_owed += requests[i].n;
    }
    for (int i = 0; i < n_requests; i++) c->workers[c->reqs[i].worker].samples_owed -= requests[i].n;
}

/* Ends a failed batch: what still runs is aborted (its results are another batch's from
 * now on and are dropped when they come). */
static void end_batch(struct rollout_client *c, enum batch_state state) {
    for (int i = 0; state == BATCH_NONE && i < c->n_reqs; i++) {
        struct client_request *q = &c->reqs[i];
        struct client_worker *w = &c->workers[q->worker];
        if (q->done == q->n || !w->socket) continue;
        char id[48];
        snprintf(id, sizeof id, "%" PRIu64 ":%d", c->batch_seq, i);
        struct smelt_error ignore = {0};
        json_t *h = json_pack("{s:s}", "id", id);
        bool sent;
        if (h) try_send(w, MSG_GEN_ABORT, h, NULL, 0, &sent, &ignore); /* best effort: never waits */
        json_decref(h);
    }
    for (int k = 0; k < c->n_workers; k++) c->workers[k].samples_owed = 0;
    free(c->reqs);
    free(c->filled);
    c->reqs = NULL;
    c->filled = NULL;
    c->n_reqs = 0;
    c->batch = state;
}

static int batch_alloc(struct rollout_client *c, const struct rollout_request *requests, int n_requests,
                       struct smelt_error *err) {
    c->reqs = calloc((size_t)n_requests, sizeof *c->reqs);
    int64_t n_samples = 0;
    for (int i = 0; c->reqs && i < n_requests; i++) {
        c->reqs[i] = (struct client_request){.slot = n_samples, .n = requests[i].n};
        n_samples += requests[i].n;
    }
    c->filled = calloc((size_t)(n_samples > 0 ? n_samples : 1), 1);
    if (!c->reqs || !c->filled) {
        free(c->reqs);
        free(c->filled);
        c->reqs = NULL;
        c->filled = NULL;
        return error_set(err, SMELT_ENOMEM, "rollout client: out of memory");
    }
    c->n_reqs = n_requests;
    c->n_samples = n_samples;
    c->n_filled = 0;
    return SMELT_OK;
}

int rollout_client_submit(struct rollout_client *c, const struct rollout_request *requests, int n_requests,
                          const struct rollout_client_results *out, struct smelt_error *err) {
    if (c->batch == BATCH_ACTIVE) return error_set(err, SMELT_EINVAL, "rollout client: a batch is already in flight");
    if (n_requests < 1 || !requests || !out || out->max_tokens < 1 || !out->ids || !out->logprobs || !out->n_tokens ||
        !out->policy_version || !out->finish_reason)
        return error_set(err, SMELT_EINVAL, "rollout client: submit needs requests and every result array");
    for (int i = 0; i < n_requests; i++) TRY(check_request(&requests[i], i, out->max_tokens, err));
    TRY(batch_alloc(c, requests, n_requests, err));
    c->batch = BATCH_ACTIVE;
    c->batch_seq++;
    c->batch_failed = false;
    c->out = *out;
    int64_t deadline = mono_ms() + c->config.timeout_ms;
    assign_workers(c, requests, n_requests);
    int rc = SMELT_OK;
    for (int i = 0; i < n_requests && !rc; i++) {
        const struct rollout_request *r = &requests[i];
        int k = c->reqs[i].worker;
        struct client_worker *w = &c->workers[k];
        struct msg_array prompt = {(void *)r->prompt, (size_t)r->n_prompt * sizeof(int32_t)};
        bool more = false;
        for (int j = i + 1; j < n_requests && !more; j++) more = c->reqs[j].worker == k;
        rc = send_to(c, w, MSG_GEN_REQUEST, request_header(c, r, i, more), &prompt, 1, deadline, err);
        if (rc) break;
        owe_from_now(w);
        w->samples_owed += r->n;
    }
    if (rc) end_batch(c, BATCH_NONE);
    return rc;
}

static bool batch_over(const struct rollout_client *c) {
    return c->batch != BATCH_ACTIVE || c->batch_failed || c->n_filled == c->n_samples;
}

/* After a wait: a failed batch is ended and its error returned; a complete one is done. */
static int batch_outcome(struct rollout_client *c, struct smelt_error *err) {
    if (c->batch == BATCH_ACTIVE && c->batch_failed) {
        *err = c->batch_error;
        end_batch(c, BATCH_NONE);
        return err->code ? err->code : SMELT_EIO;
    }
    if (c->batch == BATCH_ACTIVE && c->n_filled == c->n_samples) end_batch(c, BATCH_DONE);
    return SMELT_OK;
}

static bool batch_progressed(const struct rollout_client *c) {
    return batch_over(c) || c->n_filled > c->poll_mark;
}

int rollout_client_poll(struct rollout_client *c, int64_t wait_ms, int64_t *finished, struct smelt_error *err) {
    if (c->batch == BATCH_NONE) return error_set(err, SMELT_EINVAL, "rollout client: no batch in flight");
    bool timed_out = false;
    int64_t wait = wait_ms < c->config.timeout_ms ? wait_ms : c->config.timeout_ms;
    c->poll_mark = c->n_filled;
    int rc = pump(c, mono_ms() + (wait > 0 ? wait : 0), batch_progressed, &timed_out, err);
    if (!rc) rc = batch_outcome(c, err);
    if (finished) *finished = c->n_filled;
    return rc;
}

int rollout_client_collect(struct rollout_client *c, struct smelt_error *err) {
    if (c->batch == BATCH_NONE) return error_set(err, SMELT_EINVAL, "rollout client: no batch in flight");
    int rc = pump(c, mono_ms() + c->config.timeout_ms, batch_over, NULL, err);
    if (rc) {
        /* Timed out: the batch is over too. */
        end_batch(c, BATCH_NONE);
        return rc;
    }
    return batch_outcome(c, err);
}

int rollout_client_generate(struct rollout_client *c, const struct rollout_request *requests, int n_requests,
                            const struct rollout_client_results *out, struct smelt_error *err) {
    TRY(rollout_client_submit(c, requests, n_requests, out, err));
    return rollout_client_collect(c, err);
}

/* ---- weights: weightsync's transport over the workers' sockets ---- */

/* Sends to every worker the sync still counts on. One that cannot take it fails the sync
 * (named) but the others go on: they may still succeed, and each owes one answer. */
static int send_all(struct rollout_client *c, const char *type, json_t *header, const struct msg_array *arrays,
                    int n_arrays, struct smelt_error *err) {
    if (!header) return error_set(err, SMELT_ENOMEM, "rollout client: out of memory for %s", type);
    for (int k = 0; k < c->n_workers; k++) {
        struct client_worker *w = &c->workers[k];
        if (!w->sync_owed) continue; /* refused already, or dead */
        struct smelt_error why = {0};
        if (send_to(c, w, type, json_incref(header), arrays, n_arrays, c->sync_deadline_ms, &why) &&
            w->sync_owed) /* still owed: send_to did not fail it already (died meanwhile) */
            fail_worker(c, w, &why);
    }
    json_decref(header);
    return SMELT_OK;
}

static int transport_begin(void *ctx, const struct weightsync_meta *meta, struct smelt_error *err) {
    struct rollout_client *c = ctx;
    c->sync_begun = true;
    return send_all(c, MSG_WEIGHTS_BEGIN, weightsync_begin_header(meta), NULL, 0, err);
}

static int transport_bucket(void *ctx, const struct weightsync_bucket *b, struct smelt_error *err) {
    struct rollout_client *c = ctx;
    /* Between buckets, take in what came back (results, an early refusal). */
    for (int k = 0; k < c->n_workers; k++) drain(c, k);
    struct msg_array bytes = {(void *)b->data, (size_t)b->bytes};
    return send_all(c, MSG_WEIGHTS_BUCKET, weightsync_bucket_header(b), &bytes, 1, err);
}

/* ---- the broadcast transport: begin and end as above, the bytes through comm/ ---- */

static const uint64_t *broadcast_hashes(const struct rollout_client *c, const struct weightsync_meta *meta) {
    return meta->via.kind == WEIGHTSYNC_VIA_BROADCAST ? c->hashes : NULL;
}

static void comm_name(const struct rollout_client *c, char *out, size_t cap) {
    snprintf(out, cap, "sync-%d", c->comm_generation);
}

/* A broken communicator is dropped; the next sync makes one under a new name. */
static void drop_broken_comm(struct rollout_client *c) {
    if (c->comm && !comm_is_broken(c->comm, NULL)) return;
    if (c->comm) c->comm_generation++;
    comm_destroy(c->comm);
    c->comm = NULL;
}

/* The workers a failed collective named dead or stuck (comm_fault_ranks: group ranks,
 * worker R - 1 here). */
static void name_workers(const struct rollout_client *c, char *out, size_t cap, bool *named) {
    out[0] = 0;
    int ranks[ROLLOUT_CLIENT_MAX_WORKERS + 1];
    int n = c->comm ? comm_fault_ranks(c->comm, ranks, ROLLOUT_CLIENT_MAX_WORKERS + 1) : 0;
    size_t len = 0;
    for (int i = 0; i < n && i <= ROLLOUT_CLIENT_MAX_WORKERS && len < cap; i++) {
        int k = ranks[i] - 1;
        if (k < 0 || k >= c->n_workers) continue;
        len += (size_t)snprintf(out + len, cap - len, "%srollout worker %d (%s)", len ? ", " : "", k,
                                c->workers[k].endpoint);
        named[k] = true;
    }
}

/* The workers at fault are failed here (their sockets reset), so that the end which
 * follows waits only for the others' answers, not for a stopped worker's health timeout. */
static int broadcast_failed(struct rollout_client *c, int rc, struct smelt_error *err) {
    char who[400] = "";
    bool named[ROLLOUT_CLIENT_MAX_WORKERS] = {false};
    for (int k = 0; c->config.alive && k < c->n_workers; k++) /* a process known to be gone says most */
        if (!c->config.alive(c->config.alive_ctx, k) && (named[k] = true) && strlen(who) < 200)
            snprintf(who + strlen(who), sizeof who - strlen(who), "%srollout worker %d (%s) is gone", who[0] ? ", " : "",
                     k, c->workers[k].endpoint);
    if (!who[0]) {
        char listed[300];
        name_workers(c, listed, sizeof listed, named);
        if (listed[0]) snprintf(who, sizeof who, "%s dead or not answering", listed);
    }
    char cause[SMELT_ERROR_MESSAGE_BYTES];
    snprintf(cause, sizeof cause, "%s", err->message);
    drop_broken_comm(c);
    error_set(err, rc, "rollout client: weight sync by broadcast failed%s%s (group rank k + 1 is rollout worker k): %s",
              who[0] ? ": " : "", who, cause);
    for (int k = 0; k < c->n_workers; k++)
        if (named[k] && c->workers[k].sync_owed) fail_worker(c, &c->workers[k], err);
    return rc;
}

static int ensure_comm(struct rollout_client *c, const struct weightsync_meta *meta, struct smelt_error *err) {
    if (c->comm) return SMELT_OK;
    if (!c->store) TRY(comm_store_open(c->comm_spec, c->comm_job, &c->store, err));
    struct comm_options o = {.rank = 0, .size = c->n_workers + 1, .name = meta->via.comm,
                             .timeout_ms = meta->via.timeout_ms, .backend = COMM_BACKEND_GLOO};
    int rc = comm_create(c->store, &o, &c->comm, err);
    if (rc) c->comm_generation++; /* its keys may be half written: never reused */
    return rc;
}

static int transport_stream(void *ctx, const struct weightsync_meta *meta, const struct tensor *source,
                            struct smelt_error *err) {
    struct rollout_client *c = ctx;
    if (meta->n_buckets > c->hashes_cap) {
        uint64_t *h = realloc(c->hashes, (size_t)meta->n_buckets * sizeof *h);
        if (!h) return error_set(err, SMELT_ENOMEM, "rollout client: out of memory");
        c->hashes = h;
        c->hashes_cap = meta->n_buckets;
    }
    int rc = ensure_comm(c, meta, err);
    if (!rc) rc = weightsync_broadcast_send(c->comm, 0, meta, source, c->hashes, err);
    return rc ? broadcast_failed(c, rc, err) : SMELT_OK;
}

static bool sync_answered(const struct rollout_client *c) {
    for (int k = 0; k < c->n_workers; k++)
        if (c->workers[k].sync_owed) return false;
    return true;
}

static int transport_finish(void *ctx, const struct weightsync_meta *meta, struct weightsync_report *report,
                            struct smelt_error *err) {
    struct rollout_client *c = ctx;
    c->sync_ended = true;
    TRY(send_all(c, MSG_WEIGHTS_END, weightsync_end_header(meta, broadcast_hashes(c, meta)), NULL, 0, err));
    TRY(pump(c, c->sync_deadline_ms, sync_answered, NULL, err));
    if (c->sync_failed) {
        *err = c->sync_error;
        return err->code ? err->code : SMELT_EIO;
    }
    report->receivers = c->n_workers;
    report->bytes_sent = meta->total_bytes * c->n_workers;
    for (int k = 0; k < c->n_workers; k++) {
        const struct weightsync_ack *a = &c->workers[k].ack;
        if (a->version != meta->version || a->bytes != meta->total_bytes || a->buckets != meta->n_buckets)
            return error_set(err, SMELT_EFORMAT, "rollout client: worker %s acknowledged version %lld, %lld bytes in "
                             "%lld buckets; %lld, %lld and %lld were sent", c->workers[k].endpoint,
                             (long long)a->version, (long long)a->bytes, (long long)a->buckets,
                             (long long)meta->version, (long long)meta->total_bytes, (long long)meta->n_buckets);
        if (a->seconds > report->receiver_seconds) report->receiver_seconds = a->seconds;
    }
    return SMELT_OK;
}

int rollout_client_push(struct rollout_client *c, const struct weightsync_meta *given, const struct tensor *source,
                        struct weightsync_report *report, struct smelt_error *err) {
    struct weightsync_report ignored;
    if (!report) report = &ignored;
    struct weightsync_meta copy = *given, *meta = &copy; /* shares the tensor table: not freed here */
    memset(&copy.via, 0, sizeof copy.via); /* WEIGHTSYNC_VIA_ZMQ */
    if (c->comm_spec[0]) {
        drop_broken_comm(c);
        copy.via.kind = WEIGHTSYNC_VIA_BROADCAST;
        copy.via.timeout_ms = (int)c->config.comm_timeout_ms;
        comm_name(c, copy.via.comm, sizeof copy.via.comm);
    }
    c->sync_version = meta->version;
    c->sync_deadline_ms = mono_ms() + c->config.timeout_ms;
    c->sync_failed = false;
    for (int k = 0; k < c->n_workers; k++) {
        owe_from_now(&c->workers[k]);
        c->workers[k].sync_owed = true;
        c->workers[k].ack = (struct weightsync_ack){.version = -1};
    }
    struct weightsync_transport t = {.ctx = c, .begin = transport_begin, .bucket = transport_bucket,
                                     .finish = transport_finish,
                                     .stream = c->comm_spec[0] ? transport_stream : NULL};
    c->sync_begun = c->sync_ended = false;
    int rc = weightsync_push(&t, meta, source, report, err);
    if (rc && c->sync_begun && !sync_answered(c)) {
        /* Failed half-way here (a device copy, memory): the end goes anyway, so each
         * worker refuses the incomplete sync now and no answer of it arrives later, in
         * a later push's place. Workers still silent at the deadline get new sockets,
         * for the same reason. */
        struct smelt_error ignore = {0};
        if (!c->sync_ended) send_all(c, MSG_WEIGHTS_END, weightsync_end_header(meta, NULL), NULL, 0, &ignore);
        if (pump(c, c->sync_deadline_ms, sync_answered, NULL, &ignore))
            for (int k = 0; k < c->n_workers; k++)
                if (c->workers[k].sync_owed) reset_worker(c, &c->workers[k]);
    }
    for (int k = 0; k < c->n_workers; k++) c->workers[k].sync_owed = false;
    return rc;
}

int rollout_client_push_model(struct rollout_client *c, const struct model *model, int64_t version,
                              struct weightsync_report *report, struct smelt_error *err) {
    struct weightsync_meta meta;
    TRY(weightsync_meta_model(model, version, c->config.bucket_bytes, &meta, err));
    int rc = rollout_client_push(c, &meta, &model->weights, report, err);
    weightsync_meta_free(&meta);
    return rc;
}

int rollout_client_push_lora(struct rollout_client *c, const struct lora *adapter, int64_t version,
                             struct weightsync_report *report, struct smelt_error *err) {
    struct weightsync_meta meta;
    TRY(weightsync_meta_lora(adapter, version, c->config.bucket_bytes, &meta, err));
    int rc = rollout_client_push(c, &meta, &adapter->weights, report, err);
    weightsync_meta_free(&meta);
    return rc;
}

/* ---- life cycle ---- */

void rollout_client_free(struct rollout_client *c) {
    if (!c) return;
    if (c->batch == BATCH_ACTIVE) end_batch(c, BATCH_NONE);
    for (int k = 0; k < c->n_workers; k++)
        if (c->workers[k].socket) zmq_close(c->workers[k].socket);
    free(c->workers);
    comm_destroy(c->comm);
    comm_store_close(c->store);
    free(c->hashes);
    explicit_bzero(&c->curve_keys, sizeof c->curve_keys);
    if (c->own_ctx && c->ctx)
        while (zmq_ctx_term(c->ctx) != 0 && zmq_errno() == EINTR) {
        }
    free(c);
}

static int check_config(const struct rollout_client_config *cfg, struct smelt_error *err) {
    if (!cfg || !cfg->endpoints || cfg->n_endpoints < 1 || cfg->n_endpoints > ROLLOUT_CLIENT_MAX_WORKERS)
        return error_set_field(err, SMELT_EINVAL, "endpoints", "rollout client: 1..%d endpoints needed",
                               ROLLOUT_CLIENT_MAX_WORKERS);
    for (int k = 0; k < cfg->n_endpoints; k++)
        if (!cfg->endpoints[k] || !cfg->endpoints[k][0] || strlen(cfg->endpoints[k]) >= ROLLOUT_CLIENT_ENDPOINT_BYTES)
            return error_set_field(err, SMELT_EINVAL, "endpoints", "rollout client: endpoint %d is empty or longer "
                                   "than %d bytes", k, ROLLOUT_CLIENT_ENDPOINT_BYTES - 1);
    if (cfg->timeout_ms < 0 || cfg->quiet_ms < 0 || cfg->health_timeout_ms < 0)
        return error_set(err, SMELT_EINVAL, "rollout client: timeouts must be >= 0 (0: the default)");
    if (cfg->comm_timeout_ms < 0 || cfg->comm_timeout_ms > INT32_MAX)
        return error_set_field(err, SMELT_EINVAL, "comm_timeout_ms", "rollout client: comm_timeout_ms must be in "
                               "[0, %d] (0: the default)", INT32_MAX);
    if (cfg->weights_comm && (strlen(cfg->weights_comm) >= ROLLOUT_CLIENT_ENDPOINT_BYTES || !cfg->weights_comm_name ||
                              strlen(cfg->weights_comm_name) >= WEIGHTSYNC_COMM_NAME_BYTES))
        return error_set_field(err, SMELT_EINVAL, "weights_comm", "rollout client: weights_comm needs a store spec "
                               "under %d bytes and a weights_comm_name under %d", ROLLOUT_CLIENT_ENDPOINT_BYTES,
                               WEIGHTSYNC_COMM_NAME_BYTES);
    if (cfg->curve_keys && !curve_key_valid(cfg->curve_server_key))
        return error_set_field(err, SMELT_EINVAL, "curve_server_key", "rollout client: curve_keys without a "
                               "curve_server_key (40 Z85 characters)");
    int64_t b = cfg->bucket_bytes;
    if (b && (b < 4 || b % 4 != 0 || b > WEIGHTSYNC_MAX_BUCKET_BYTES))
        return error_set_field(err, SMELT_EINVAL, "bucket_bytes", "rollout client: bucket_bytes %lld is not a "
                               "multiple of 4 in [4, %lld]", (long long)b, (long long)WEIGHTSYNC_MAX_BUCKET_BYTES);
    return SMELT_OK;
}

int rollout_client_create(const struct rollout_client_config *config, struct rollout_client **out,
                          struct smelt_error *err) {
    TRY(check_config(config, err));
    struct rollout_client *c = calloc(1, sizeof *c);
    if (!c) return error_set(err, SMELT_ENOMEM, "rollout client: out of memory");
    c->config = *config;
    if (!c->config.timeout_ms) c->config.timeout_ms = ROLLOUT_CLIENT_DEFAULT_TIMEOUT_MS;
    if (!c->config.quiet_ms) c->config.quiet_ms = ROLLOUT_CLIENT_DEFAULT_QUIET_MS;
    if (!c->config.health_timeout_ms) c->config.health_timeout_ms = ROLLOUT_CLIENT_DEFAULT_HEALTH_TIMEOUT_MS;
    if (!c->config.comm_timeout_ms) c->config.comm_timeout_ms = ROLLOUT_CLIENT_DEFAULT_COMM_TIMEOUT_MS;
    if (config->weights_comm) {
        snprintf(c->comm_spec, sizeof c->comm_spec, "%s", config->weights_comm);
        snprintf(c->comm_job, sizeof c->comm_job, "%s", config->weights_comm_name);
    }
    c->config.endpoints = NULL;
    c->config.weights_comm = c->config.weights_comm_name = NULL; /* the copies above */
    if (config->curve_keys) {
        c->curve = true;
        c->curve_keys = *config->curve_keys;
        memcpy(c->curve_server_key, config->curve_server_key, CURVE_KEY_BYTES);
    }
    c->config.curve_keys = NULL;
    c->config.curve_server_key = NULL;
    c->n_workers = config->n_endpoints;
    c->workers = calloc((size_t)c->n_workers, sizeof *c->workers);
    c->ctx = config->zmq_ctx;
    if (!c->ctx) {
        c->ctx = zmq_ctx_new();
        c->own_ctx = true;
    }
    int rc = c->workers && c->ctx ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rollout client: out of memory");
    for (int k = 0; !rc && k < c->n_workers; k++) {
        snprintf(c->workers[k].endpoint, sizeof c->workers[k].endpoint, "%s", config->endpoints[k]);
        rc = open_socket(c, &c->workers[k], err);
    }
    if (rc) {
        rollout_client_free(c);
        return rc;
    }
    *out = c;
    return SMELT_OK;
}
