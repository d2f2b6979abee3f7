/* The worker's side of a weight sync (weightsync/; messages in common/msg.h): begin,
 * buckets and end feed the receiver, which stages and checks the bytes; the end applies
 * them here, between two engine steps (the loop is single-threaded: a message is handled
 * only between steps), and answers weights.ack. Generation goes on while the buckets
 * arrive; only the apply changes what the engine runs on. A refused sync is answered
 * once with weights.error naming the field, and the old weights stay. */
#include "rollout/worker_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "lora/lora.h"

bool worker_weights_message(const char *type) {
    return strcmp(type, MSG_WEIGHTS_BEGIN) == 0 || strcmp(type, MSG_WEIGHTS_BUCKET) == 0 ||
           strcmp(type, MSG_WEIGHTS_END) == 0;
}

/* weights.error {version?, error: {message, field}}; version < 0 when unknown. */
static void send_error(struct worker *w, const char *route, size_t route_len, int64_t version,
                       const struct smelt_error *why) {
    log_warn("rollout worker: weights refused (version %lld, field %s): %s", (long long)version,
             why->field[0] ? why->field : "-", why->message);
    json_t *h = json_pack("{s:{s:o, s:o}}", "error", "message", json_string_lossy(why->message, strlen(why->message)),
                          "field", why->field[0] ? json_string_lossy(why->field, strlen(why->field)) : json_null());
    if (h && version >= 0 && json_object_set_new(h, "version", json_integer(version))) {
        json_decref(h);
        h = NULL;
    }
    worker_send(w, route, route_len, MSG_WEIGHTS_ERROR, h, NULL, 0);
}

static bool from_owner(const struct worker *w, const struct msg *m) {
    return m->route_len == w->sync_route_len && memcmp(m->route, w->sync_route, m->route_len) == 0;
}

static int64_t engine_version(const struct worker *w) { return rollout_engine_stats(w->engine).policy_version; }

/* The sync in progress is over for a reason of the worker's (superseded, stopping): its
 * sender hears why. */
static void end_in_progress(struct worker *w, const char *why) {
    if (!weightsync_receiver_busy(&w->rx)) return;
    struct smelt_error err = {0};
    error_set(&err, SMELT_EINVAL, "the sync of version %lld is abandoned: %s", (long long)w->rx.meta.version, why);
    send_error(w, w->sync_route, w->sync_route_len, w->rx.meta.version, &err);
    weightsync_receiver_abandon(&w->rx);
}

void worker_weights_stop(struct worker *w, const char *why) { end_in_progress(w, why); }

/* ---- broadcast syncs: the bytes come through comm/, right after the begin ---- */

void worker_weights_free(struct worker *w) {
    comm_destroy(w->comm);
    comm_store_close(w->store);
    free(w->landed);
    w->comm = NULL;
    w->store = NULL;
    w->landed = NULL;
}

/* The communicator the begin names (a new name after a failure: the old one is dropped). */
static int ensure_comm(struct worker *w, const struct weightsync_meta *meta, struct smelt_error *err) {
    if (w->comm && strcmp(w->comm_name, meta->via.comm) == 0 && !comm_is_broken(w->comm, NULL)) return SMELT_OK;
    comm_destroy(w->comm);
    w->comm = NULL;
    const struct rollout_worker_setup *s = w->setup;
    if (!w->store) TRY(comm_store_open(s->weights_comm, s->weights_comm_name, &w->store, err));
    struct comm_options o = {.rank = s->weights_comm_rank, .size = s->weights_comm_size, .name = meta->via.comm,
                             .timeout_ms = meta->via.timeout_ms, .backend = COMM_BACKEND_GLOO};
    TRY(comm_create(w->store, &o, &w->comm, err));
    snprintf(w->comm_name, sizeof w->comm_name, "%s", meta->via.comm);
    return SMELT_OK;
}

static int reserve_landed(struct worker *w, int64_t n, struct smelt_error *err) {
    if (n <= w->landed_cap) return SMELT_OK;
    uint64_t *h = realloc(w->landed, (size_t)n * sizeof *h);
    if (!h) return error_set(err, SMELT_ENOMEM, "rollout worker: out of memory");
    w->landed = h;
    w->landed_cap = n;
    return SMELT_OK;
}

/* Joins the sync's broadcasts (the loop waits meanwhile: the comm timeout bounds it),
 * also when the begin was refused, so that the trainer's collectives complete. A failure
 * refuses the sync, if it was still on. */
static void join_broadcast(struct worker *w, const struct weightsync_meta *meta, const struct msg *m) {
    struct smelt_error err = {0};
    int rc = ensure_comm(w, meta, &err);
    if (!rc) rc = reserve_landed(w, meta->n_buckets, &err);
    if (!rc) rc = weightsync_broadcast_receive(w->comm, 0, &w->rx, meta, w->landed, &err);
    if (!rc) return;
    if (w->comm && comm_is_broken(w->comm, NULL)) {
        comm_destroy(w->comm);
        w->comm = NULL;
    }
    if (weightsync_receiver_busy(&w->rx) && w->rx.meta.version == meta->version) {
        weightsync_receiver_refuse(&w->rx);
        error_wrap(&err, rc, "broadcast of communicator '%s'", meta->via.comm);
        send_error(w, m->route, m->route_len, meta->version, &err);
    }
}

/* weights.end of a broadcast sync: its hashes against those of what landed. */
static int check_landed(struct worker *w, const struct msg *m, int64_t version, int64_t n_buckets,
                        struct smelt_error *err) {
    struct weightsync_receiver *rx = &w->rx;
    if (rx->state != WEIGHTSYNC_RX_RECEIVING || rx->meta.version != version ||
        rx->meta.via.kind != WEIGHTSYNC_VIA_BROADCAST || n_buckets != rx->meta.n_buckets)
        return SMELT_OK; /* weightsync_receiver_end answers those */
    uint64_t *want = malloc((size_t)(n_buckets > 0 ? n_buckets : 1) * sizeof *want);
    int rc = want ? weightsync_end_hashes(m, n_buckets, want, err)
                  : error_set(err, SMELT_ENOMEM, "rollout worker: out of memory");
    if (rc) weightsync_receiver_refuse(rx);
    for (int64_t k = 0; !rc && k < n_buckets; k++) rc = weightsync_receiver_landed_hashed(rx, version, k, w->landed[k],
                                                                                         want[k], err);
    free(want);
    return rc;
}

static void on_begin(struct worker *w, const struct msg *m) {
    struct weightsync_meta meta;
    struct smelt_error err = {0};
    if (weightsync_begin_read(m, &meta, &err)) {
        send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
        return;
    }
    end_in_progress(w, "a newer weights.begin arrived");
    bool broadcast = meta.via.kind == WEIGHTSYNC_VIA_BROADCAST;
    if (broadcast && !w->setup->weights_comm) {
        error_set_field(&err, SMELT_EINVAL, "transport", "transport: \"broadcast\", but this worker was started "
                        "without --weights-comm (its rendezvous store, name, rank and size): it cannot join");
        send_error(w, m->route, m->route_len, meta.version, &err);
        weightsync_meta_free(&meta);
        return;
    }
    if (weightsync_receiver_begin(&w->rx, &meta, engine_version(w), &err)) {
        send_error(w, m->route, m->route_len, meta.version, &err);
    } else {
        memcpy(w->sync_route, m->route, m->route_len);
        w->sync_route_len = m->route_len;
        log_debug("rollout worker: receiving %s weights of version %lld: %lld bytes in %lld buckets",
                  weightsync_kind_name(meta.kind), (long long)meta.version, (long long)meta.total_bytes,
                  (long long)meta.n_buckets);
    }
    if (broadcast) join_broadcast(w, &meta, m);
    weightsync_meta_free(&meta);
}

/* A weights.bucket or weights.end from a client other than the sync's: answered without
 * touching the sync in progress. */
static bool foreign(struct worker *w, const struct msg *m) {
    if (!weightsync_receiver_busy(&w->rx) || from_owner(w, m)) return false;
    struct smelt_error err = {0};
    error_set_field(&err, SMELT_EINVAL, "version", "%s: another client's sync (version %lld) is in progress", m->type,
                    (long long)w->rx.meta.version);
    send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
    return true;
}

static void on_bucket(struct worker *w, const struct msg *m) {
    if (foreign(w, m)) return;
    struct weightsync_bucket b;
    struct smelt_error err = {0};
    int rc = weightsync_bucket_read(m, &b, &err);
    if (rc && weightsync_receiver_busy(&w->rx)) weightsync_receiver_refuse(&w->rx); /* the sync cannot complete */
    if (!rc) rc = weightsync_receiver_bucket(&w->rx, &b, &err);
    if (rc < 0) send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
}

/* The staged stream into the engine: the model's weights, or the attached adapter's. */
static int apply(struct worker *w, struct smelt_error *err) {
    const struct weightsync_meta *meta = &w->rx.meta;
    const void *stream = weightsync_receiver_stream(&w->rx);
    int64_t n = meta->total_bytes / (int64_t)sizeof(float);
    if (meta->kind == WEIGHTSYNC_FULL) return rollout_engine_set_weights_version(w->engine, stream, n, meta->version, err);
    if (meta->version <= engine_version(w)) /* before a byte changes */
        return error_set_field(err, SMELT_EINVAL, "version", "version: %lld is not newer than this worker's %lld",
                               (long long)meta->version, (long long)engine_version(w));
    struct tensor host = tensor_f32((float *)stream, 1, &n);
    TRY(tensor_copy(&w->adapter->weights, &host, err));
    return rollout_engine_weights_changed(w->engine, meta->version, err);
}

static void on_end(struct worker *w, const struct msg *m) {
    if (foreign(w, m)) return;
    int64_t version, n_buckets, total_bytes;
    struct smelt_error err = {0};
    int rc = weightsync_end_read(m, &version, &n_buckets, &total_bytes, &err);
    if (rc && weightsync_receiver_busy(&w->rx)) weightsync_receiver_refuse(&w->rx);
    if (!rc) rc = check_landed(w, m, version, n_buckets, &err);
    if (!rc) rc = weightsync_receiver_end(&w->rx, version, n_buckets, total_bytes, &err);
    if (rc == WEIGHTSYNC_IGNORED) return;
    if (!rc && (rc = apply(w, &err)) != 0) {
        error_wrap(&err, rc, "applying the weights of version %lld", (long long)version);
        weightsync_receiver_refuse(&w->rx);
    }
    if (rc) {
        send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
        return;
    }
    enum weightsync_via via = w->rx.meta.via.kind;
    struct weightsync_ack ack = weightsync_receiver_done(&w->rx);
    w->weight_syncs++;
    w->weight_bytes += ack.bytes;
    log_info("rollout worker: %s weights of version %lld in use (by %s): %lld bytes in %.3f s",
             weightsync_kind_name(ack.kind), (long long)ack.version, weightsync_via_name(via), (long long)ack.bytes,
             ack.seconds);
    worker_send(w, m->route, m->route_len, MSG_WEIGHTS_ACK, weightsync_ack_header(&ack), NULL, 0);
}

void worker_on_weights(struct worker *w, const struct msg *m) {
    struct smelt_error err = {0};
    if (msg_check_version(m, &err)) {
        if (weightsync_receiver_busy(&w->rx) && from_owner(w, m)) weightsync_receiver_refuse(&w->rx);
        char why[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", err.message);
        error_set_field(&err, SMELT_EINVAL, "v", "%s: %s", m->type, why);
        send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
        return;
    }
    if (strcmp(m->type, MSG_WEIGHTS_BEGIN) == 0) on_begin(w, m);
    else if (strcmp(m->type, MSG_WEIGHTS_BUCKET) == 0) on_bucket(w, m);
    else on_end(w, m);
}
