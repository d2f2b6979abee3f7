/* The worker's side of a weight sync (weightsync/; messages in common/msg.h): begin,
 * buckets and end feed the receiver, which stages and checks the bytes; the end applies
 * them here, between two engine steps (the loop is single-threaded: a message is handled
 * only between steps), and answers weights.ack. Generation goes on while the buckets
 * arrive; only the apply changes what the engine runs on. A refused sync is answered
 * once with weights.error naming the field, and the old weights stay. */
#include "rollout/worker_internal.h"

#include <stdio.h>
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

static void on_begin(struct worker *w, const struct msg *m) {
    struct weightsync_meta meta;
    struct smelt_error err = {0};
    if (weightsync_begin_read(m, &meta, &err)) {
        send_error(w, m->route, m->route_len, weightsync_header_version(m), &err);
        return;
    }
    end_in_progress(w, "a newer weights.begin arrived");
    if (weightsync_receiver_begin(&w->rx, &meta, engine_version(w), &err)) {
        send_error(w, m->route, m->route_len, meta.version, &err);
    } else {
        memcpy(w->sync_route, m->route, m->route_len);
        w->sync_route_len = m->route_len;
        log_debug("rollout worker: receiving %s weights of version %lld: %lld bytes in %lld buckets",
                  weightsync_kind_name(meta.kind), (long long)meta.version, (long long)meta.total_bytes,
                  (long long)meta.n_buckets);
    }
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
    struct weightsync_ack ack = weightsync_receiver_done(&w->rx);
    w->weight_syncs++;
    w->weight_bytes += ack.bytes;
    log_info("rollout worker: %s weights of version %lld in use: %lld bytes in %.3f s", weightsync_kind_name(ack.kind),
             (long long)ack.version, (long long)ack.bytes, ack.seconds);
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
