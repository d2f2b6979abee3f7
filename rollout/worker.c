/* smelt-rollout's serving loop (rollout.h's worker section; the messages are common/msg.h's):
 * take what clients sent, step the engine, send each finished sample to the client that
 * asked for it. Weight syncs (weights.*) go to worker_weights.c, which applies them
 * between two steps. One thread, one socket: nothing here locks. */
#include "rollout/worker_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "lora/lora.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gen.result's arrays are little-endian and go out as the host holds them"
#endif

/* How long the engine still waits for the rest of a batch (0: it does not). */
static int64_t hold_left_ms(const struct worker *w) {
    int64_t left = w->hold_until_ms ? w->hold_until_ms - mono_ms() : 0;
    return left > 0 ? left : 0;
}

/* ---- requests in flight ---- */

static int find_request(const struct worker *w, const char *route, size_t route_len, const char *id) {
    for (int i = 0; i < w->n_reqs; i++) {
        const struct inflight *q = &w->reqs[i];
        if (q->route_len == route_len && memcmp(q->route, route, route_len) == 0 && strcmp(q->id, id) == 0) return i;
    }
    return -1;
}

static int find_engine_id(const struct worker *w, uint64_t engine_id) {
    for (int i = 0; i < w->n_reqs; i++)
        if (w->reqs[i].engine_id == engine_id) return i;
    return -1;
}

static void drop_request(struct worker *w, int i) { w->reqs[i] = w->reqs[--w->n_reqs]; }

static int track(struct worker *w, const struct msg *m, const struct worker_request *req, uint64_t engine_id,
                 struct smelt_error *err) {
    if (w->n_reqs == w->cap_reqs) {
        int cap = w->cap_reqs ? 2 * w->cap_reqs : 64;
        struct inflight *grown = realloc(w->reqs, (size_t)cap * sizeof *grown);
        if (!grown) return error_set(err, SMELT_ENOMEM, "rollout worker: out of memory");
        w->reqs = grown;
        w->cap_reqs = cap;
    }
    struct inflight *q = &w->reqs[w->n_reqs++];
    memset(q, 0, sizeof *q);
    memcpy(q->id, req->id, sizeof q->id);
    memcpy(q->route, m->route, m->route_len);
    q->route_len = m->route_len;
    q->engine_id = engine_id;
    q->n = req->r.n;
    return SMELT_OK;
}

/* A client that cannot take a message (gone, or its send queue full) loses its requests
 * in flight: nobody would read their results, so they stop costing compute. The engine's
 * results for them are dropped when they come out. */
static void drop_client(struct worker *w, const char *route, size_t route_len) {
    char gone[MSG_ROUTE_BYTES];
    memcpy(gone, route, route_len); /* route may live in w->reqs, which changes below */
    for (int i = 0; i < w->n_reqs;) {
        struct inflight *q = &w->reqs[i];
        if (q->route_len != route_len || memcmp(q->route, gone, route_len) != 0) {
            i++;
            continue;
        }
        log_warn("rollout worker: request '%s' aborted: its client cannot take results", q->id);
        rollout_engine_abort(w->engine, q->engine_id);
        drop_request(w, i);
    }
}

/* ---- sending ---- */

int worker_send(struct worker *w, const char *route, size_t route_len, const char *type, json_t *header,
                const struct msg_array *arrays, int n_arrays) {
    struct smelt_error err = {0};
    int rc = header ? msg_send(w->socket, route, route_len, type, header, arrays, n_arrays, &err)
                    : error_set(&err, SMELT_ENOMEM, "%s: out of memory", type);
    json_decref(header);
    if (rc) {
        log_warn("rollout worker: %s not delivered: %s", type, err.message);
        drop_client(w, route, route_len);
    }
    return rc;
}

/* gen.error; id and field may be NULL (field null: not the fault of a request field; "" is
 * the empty key's name). */
static void send_error(struct worker *w, const char *route, size_t route_len, const char *id, const char *field,
                       const char *message) {
    log_debug("rollout worker: gen.error to request '%s' (%s): %s", id ? id : "?", field ? field : "-", message);
    json_t *h = json_pack("{s:{s:o, s:o}}", "error", "message", json_string_lossy(message, strlen(message)), "field",
                          field ? json_string_lossy(field, strlen(field)) : json_null());
    if (h && id && json_object_set_new(h, "id", json_string(id))) {
        json_decref(h);
        h = NULL;
    }
    worker_send(w, route, route_len, MSG_GEN_ERROR, h, NULL, 0);
}

/* The sample's text, when the tokenizer has a token for each id and the text holds no
 * NUL (headers are read without JSON_ALLOW_NUL: a client would refuse the message). */
static void add_text(const struct worker *w, json_t *h, const struct rollout_result *r) {
    char *text = NULL;
    size_t len = 0;
    struct smelt_error err = {0};
    if (tokenizer_decode(w->limits.tok, r->ids, (size_t)r->n, true, &text, &len, &err)) {
        log_debug("rollout worker: a result goes without text: %s", err.message);
        return;
    }
    json_t *t = len && memchr(text, 0, len) ? NULL : json_string_lossy(text, len);
    if (t) json_object_set_new(h, "text", t);
    free(text);
}

/* Sends one sample; the request is done when its last sample went out. */
static void deliver(struct worker *w, int i, const struct rollout_result *r) {
    struct inflight *q = &w->reqs[i];
    int s = r->sample_index;
    if (s < 0 || s >= q->n || (q->sent[s / 8] >> (s % 8)) & 1) {
        log_error("rollout worker: the engine gave sample %d of request '%s' (n = %d) twice or out of range", s,
                  q->id, q->n);
        return;
    }
    json_t *h = json_pack("{s:s, s:i, s:s, s:I, s:I}", "id", q->id, "index", s, "finish_reason", r->finish_reason,
                          "policy_version", (json_int_t)r->policy_version, "n_tokens", (json_int_t)r->n);
    if (h && w->limits.tok) add_text(w, h, r);
    int32_t none = 0; /* frames of 0 bytes still need a pointer */
    struct msg_array arrays[2] = {{r->n ? (void *)r->ids : &none, (size_t)r->n * sizeof *r->ids},
                                  {r->n ? (void *)r->logprobs : &none, (size_t)r->n * sizeof *r->logprobs}};
    if (worker_send(w, q->route, q->route_len, MSG_GEN_RESULT, h, arrays, 2)) return;
    q->sent[s / 8] |= (uint8_t)(1u << (s % 8));
    if (++q->n_sent == q->n) {
        w->requests_served++;
        drop_request(w, i);
    }
}

/* Everything the engine finished since the last call goes out. */
static void deliver_finished(struct worker *w) {
    struct rollout_result *res = NULL;
    int n = 0;
    struct smelt_error err = {0};
    if (rollout_engine_take(w->engine, &res, &n, &err)) {
        log_error("rollout worker: taking results: %s", err.message);
        return;
    }
    for (int k = 0; k < n; k++) {
        int i = find_engine_id(w, res[k].request_id);
        if (i >= 0) deliver(w, i, &res[k]); /* else failed, or its client is gone */
    }
    rollout_results_free(res, n);
}

/* Answers every request in flight with gen.error and ends it in the engine. */
static void fail_all(struct worker *w, const char *message) {
    while (w->n_reqs > 0) {
        struct inflight q = w->reqs[--w->n_reqs];
        rollout_engine_abort(w->engine, q.engine_id);
        send_error(w, q.route, q.route_len, q.id, NULL, message);
    }
    struct rollout_result *res = NULL;
    int n = 0;
    struct smelt_error ignore = {0};
    if (!rollout_engine_take(w->engine, &res, &n, &ignore)) rollout_results_free(res, n);
}

/* ---- messages ---- */

/* "v" and no field outside allowed; field names the one at fault. */
static int check_header(const struct msg *m, const char *const *allowed, const char **field,
                        struct smelt_error *err) {
    *field = "v";
    TRY(error_wrap(err, msg_check_version(m, err), "%s", m->type));
    const char *key = json_unknown_key(m->header, allowed);
    if (!key) return SMELT_OK;
    *field = key;
    return error_set(err, SMELT_EINVAL, "%s: unknown field '%.64s'", m->type, key);
}

static void on_request(struct worker *w, const struct msg *m) {
    struct worker_request req;
    struct worker_field field;
    struct smelt_error err = {0};
    if (worker_request_parse(m, &w->limits, &req, &field, &err)) {
        send_error(w, m->route, m->route_len, worker_header_id(m), field.named ? field.name : NULL, err.message);
        return;
    }
    w->hold_until_ms = req.more ? mono_ms() + ROLLOUT_WORKER_HOLD_MS : 0;
    int rc = SMELT_OK;
    const char *at_fault = NULL;
    uint64_t engine_id = w->next_engine_id++;
    req.r.id = engine_id;
    if (find_request(w, m->route, m->route_len, req.id) >= 0) {
        rc = error_set(&err, SMELT_EINVAL, "gen.request: id '%s' is already in flight", req.id);
        at_fault = "id";
    }
    if (!rc) rc = track(w, m, &req, engine_id, &err);
    if (!rc && (rc = rollout_engine_add(w->engine, &req.r, &err)) != 0) {
        /* Checked above; what is left is the engine's own trouble (memory). */
        drop_request(w, w->n_reqs - 1);
        error_wrap(&err, rc, "gen.request");
    }
    if (rc) send_error(w, m->route, m->route_len, req.id, at_fault, err.message);
    worker_request_free(&req);
}

static void on_abort(struct worker *w, const struct msg *m) {
    static const char *const allowed[] = {"v", "id", NULL};
    const char *field, *id = worker_header_id(m);
    struct smelt_error err = {0};
    if (!check_header(m, allowed, &field, &err) && !id) {
        field = "id";
        error_set(&err, SMELT_EINVAL, "gen.abort: field 'id' must be a string of 1..%d bytes", WORKER_ID_BYTES);
    }
    if (err.code) {
        send_error(w, m->route, m->route_len, id, field, err.message);
        return;
    }
    int i = find_request(w, m->route, m->route_len, id);
    if (i < 0) return; /* finished already, or never was: nothing to end */
    uint64_t engine_id = w->reqs[i].engine_id;
    rollout_engine_abort(w->engine, engine_id);
    deliver_finished(w);
}

static void on_health(struct worker *w, const struct msg *m) {
    static const char *const allowed[] = {"v", NULL};
    const char *field;
    struct smelt_error err = {0};
    if (check_header(m, allowed, &field, &err)) {
        send_error(w, m->route, m->route_len, NULL, field, err.message);
        return;
    }
    json_t *h = json_pack("{s:s, s:I}", "status", w->last_error[0] ? "failing" : "ok", "policy_version",
                          (json_int_t)rollout_engine_stats(w->engine).policy_version);
    if (h && w->last_error[0]) json_object_set_new(h, "error", json_string_lossy(w->last_error, strlen(w->last_error)));
    worker_send(w, m->route, m->route_len, MSG_HEALTH_REPLY, h, NULL, 0);
}

static void on_stats(struct worker *w, const struct msg *m) {
    static const char *const allowed[] = {"v", NULL};
    const char *field;
    struct smelt_error err = {0};
    if (check_header(m, allowed, &field, &err)) {
        send_error(w, m->route, m->route_len, NULL, field, err.message);
        return;
    }
    struct rollout_stats st = rollout_engine_stats(w->engine);
    json_t *h = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                          "n_blocks", (json_int_t)st.n_blocks, "free_blocks", (json_int_t)st.free_blocks,
                          "running", (json_int_t)st.running, "waiting", (json_int_t)st.waiting,
                          "preemptions", (json_int_t)st.preemptions, "steps", (json_int_t)st.steps,
                          "prefill_tokens", (json_int_t)st.prefill_tokens, "decode_tokens",
                          (json_int_t)st.decode_tokens, "policy_version", (json_int_t)st.policy_version,
                          "kv_bytes_per_token", (json_int_t)st.kv_bytes_per_token, "requests_served",
                          (json_int_t)w->requests_served, "requests_in_flight", (json_int_t)w->n_reqs,
                          "step_errors", (json_int_t)w->step_errors, "weight_syncs", (json_int_t)w->weight_syncs,
                          "weight_bytes", (json_int_t)w->weight_bytes);
    worker_send(w, m->route, m->route_len, MSG_STATS_REPLY, h, NULL, 0);
}

static void on_message(struct worker *w, const struct msg *m) {
    if (strcmp(m->type, MSG_GEN_REQUEST) == 0) on_request(w, m);
    else if (strcmp(m->type, MSG_GEN_ABORT) == 0) on_abort(w, m);
    else if (strcmp(m->type, MSG_HEALTH_REQUEST) == 0) on_health(w, m);
    else if (strcmp(m->type, MSG_STATS_REQUEST) == 0) on_stats(w, m);
    else if (worker_weights_message(m->type)) worker_on_weights(w, m);
    else {
        char message[256];
        snprintf(message, sizeof message, "unknown message type '%s' (this worker serves %s, %s, %s, %s, %s, %s, %s)",
                 m->type, MSG_GEN_REQUEST, MSG_GEN_ABORT, MSG_HEALTH_REQUEST, MSG_STATS_REQUEST, MSG_WEIGHTS_BEGIN,
                 MSG_WEIGHTS_BUCKET, MSG_WEIGHTS_END);
        send_error(w, m->route, m->route_len, NULL, "type", message);
    }
}

/* msg_recv refused the message (and consumed it); answer the sender when known. */
static void on_malformed(struct worker *w, const struct msg *m, int rc, const struct smelt_error *why) {
    if (!m->route_len) {
        log_warn("rollout worker: dropped a malformed message: %s", why->message);
        return;
    }
    const char *field = NULL;
    if (rc == SMELT_EFORMAT) field = !m->type[0] ? "type" : strncmp(why->message, "more than", 9) == 0 ? "frames" : "header";
    char message[SMELT_ERROR_MESSAGE_BYTES + 32];
    snprintf(message, sizeof message, "malformed message: %s", why->message);
    send_error(w, m->route, m->route_len, NULL, field, message);
}

/* Handles what is waiting: blocks up to the idle poll for the first message when the
 * engine has nothing to do or waits for the rest of a batch, never otherwise. Fails
 * only when the socket does. */
static int drain(struct worker *w, const atomic_int *stop, struct smelt_error *err) {
    int64_t hold = hold_left_ms(w);
    if (hold > ROLLOUT_WORKER_IDLE_POLL_MS) hold = ROLLOUT_WORKER_IDLE_POLL_MS;
    int timeout_ms = rollout_engine_idle(w->engine) ? ROLLOUT_WORKER_IDLE_POLL_MS : (int)hold;
    for (int k = 0; k < ROLLOUT_WORKER_MAX_DRAIN && !atomic_load(stop); k++) {
        struct msg m;
        struct smelt_error why = {0};
        int rc = msg_recv(w->socket, true, k == 0 ? timeout_ms : 0, &m, &why);
        if (rc == SMELT_ENOTFOUND) return SMELT_OK;
        if (rc == SMELT_EIO) {
            if (atomic_load(stop)) return SMELT_OK; /* a signal interrupted the receive */
            return error_set(err, SMELT_EIO, "rollout worker: receiving: %s", why.message);
        }
        if (rc) on_malformed(w, &m, rc, &why);
        else on_message(w, &m);
        msg_free(&m);
    }
    return SMELT_OK;
}

static void step(struct worker *w) {
    struct smelt_error err = {0};
    if (!rollout_engine_step(w->engine, &err)) {
        w->last_error[0] = 0;
        return;
    }
    w->step_errors++;
    snprintf(w->last_error, sizeof w->last_error, "%s", err.message);
    log_error("rollout worker: engine step failed: %s; failing the %d requests in flight", err.message, w->n_reqs);
    deliver_finished(w); /* samples that finished before the failure still count */
    char message[SMELT_ERROR_MESSAGE_BYTES + 32];
    snprintf(message, sizeof message, "generation failed: %s", err.message);
    fail_all(w, message);
}

/* The ids that end a sample unless the request sets ignore_eos. */
static void eos_ids(const struct model *model, const struct tokenizer *tok, struct worker_limits *lim) {
    int64_t V = model->config.vocab_size;
    int64_t cand[MODEL_CONFIG_MAX_EOS + 1];
    int n = 0;
    for (int i = 0; i < model->config.n_eos_token_ids; i++) cand[n++] = model->config.eos_token_ids[i];
    if (tok) cand[n++] = tokenizer_special_ids(tok)->eos;
    for (int i = 0; i < n; i++) {
        bool have = cand[i] < 0 || cand[i] >= V;
        for (int k = 0; k < lim->n_eos && !have; k++) have = lim->eos[k] == cand[i];
        if (!have) lim->eos[lim->n_eos++] = (int32_t)cand[i];
    }
}

int rollout_worker_run(const struct rollout_worker_setup *setup, struct smelt_error *err) {
    const struct rollout_worker_setup *s = setup;
    if (!s || !s->engine || !s->model || !s->router || !s->stop)
        return error_set(err, SMELT_EINVAL, "rollout_worker_run: engine, model, router and stop are required");
    if (s->adapter && s->model->adapter != &s->adapter->adapter)
        return error_set(err, SMELT_EINVAL, "rollout_worker_run: the adapter is not the one attached to the model");
    int mandatory = 1;
    if (zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory))
        return error_set(err, SMELT_EIO, "rollout worker: ZMQ_ROUTER_MANDATORY: %s", zmq_strerror(zmq_errno()));
    if (s->weights_comm && (!s->weights_comm_name || s->weights_comm_size < 2 || s->weights_comm_rank < 1 ||
                            s->weights_comm_rank >= s->weights_comm_size))
        return error_set_field(err, SMELT_EINVAL, "weights_comm", "rollout_worker_run: weights_comm needs a name, a "
                               "size >= 2 and a rank in 1..size-1 (rank 0 is the trainer)");
    struct worker w = {.engine = s->engine, .socket = s->router, .adapter = s->adapter, .setup = s,
                       .limits = {.model = s->model, .tok = s->tok,
                                  .pool_tokens = rollout_engine_stats(s->engine).n_blocks * ROLLOUT_KV_BLOCK_TOKENS}};
    eos_ids(s->model, s->tok, &w.limits);
    TRY(error_wrap(err, weightsync_receiver_init(&w.rx, s->model, s->adapter, err), "rollout worker"));
    int rc = SMELT_OK;
    while (!atomic_load(s->stop) && !rc) {
        rc = drain(&w, s->stop, err);
        bool holding = hold_left_ms(&w) > 0; /* the rest of a batch is on its way */
        if (!rc && !atomic_load(s->stop) && !rollout_engine_idle(s->engine) && !holding) step(&w);
        deliver_finished(&w);
    }
    const char *why = rc ? "the worker's socket failed" : "the worker is stopping";
    worker_weights_stop(&w, why);
    fail_all(&w, rc ? "the worker's socket failed; the request did not finish"
                    : "the worker is stopping; the request did not finish");
    free(w.reqs);
    worker_weights_free(&w);
    weightsync_receiver_free(&w.rx);
    return rc;
}

int rollout_worker_serve(struct rollout_engine *engine, const struct model *model, const struct tokenizer *tok,
                         void *router, const atomic_int *stop, struct smelt_error *err) {
    struct rollout_worker_setup s = {.engine = engine, .model = model, .tok = tok, .router = router, .stop = stop};
    return rollout_worker_run(&s, err);
}
