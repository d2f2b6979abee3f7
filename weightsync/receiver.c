/* The receiver: a sync is checked against this receiver's own layout at begin, its
 * buckets land in a staging buffer as they arrive, and only a sync whose every bucket
 * arrived once, whole and with its checksum is handed over to be applied. Nothing of a
 * refused sync reaches the weights: that is what the staging buffer buys (the model's
 * bytes again in host memory, kept between syncs). */
#include "weightsync/weightsync.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int weightsync_receiver_init(struct weightsync_receiver *rx, const struct model *model, const struct lora *adapter,
                             struct smelt_error *err) {
    memset(rx, 0, sizeof *rx);
    TRY(weightsync_meta_model(model, 0, 0, &rx->full, err));
    if (adapter) {
        int rc = weightsync_meta_lora(adapter, 0, 0, &rx->lora, err);
        if (rc) {
            weightsync_meta_free(&rx->full);
            return rc;
        }
        rx->has_adapter = true;
    }
    return SMELT_OK;
}

void weightsync_receiver_free(struct weightsync_receiver *rx) {
    if (!rx) return;
    weightsync_meta_free(&rx->full);
    weightsync_meta_free(&rx->lora);
    weightsync_meta_free(&rx->meta);
    free(rx->staging);
    free(rx->arrived);
    memset(rx, 0, sizeof *rx);
}

bool weightsync_receiver_busy(const struct weightsync_receiver *rx) { return rx->state != WEIGHTSYNC_RX_IDLE; }

/* Over: later messages of this version are ignored (the sender has its answer). */
static int refuse(struct weightsync_receiver *rx, int64_t version, int rc) {
    weightsync_receiver_abandon(rx);
    rx->refused = true;
    rx->refused_version = version;
    return rc;
}

void weightsync_receiver_refuse(struct weightsync_receiver *rx) {
    if (rx->state != WEIGHTSYNC_RX_IDLE) refuse(rx, rx->meta.version, SMELT_OK);
}

void weightsync_receiver_abandon(struct weightsync_receiver *rx) {
    weightsync_meta_free(&rx->meta);
    rx->state = WEIGHTSYNC_RX_IDLE;
    rx->n_arrived = rx->bytes_arrived = 0;
}

/* ---- begin: the metadata against this receiver's layout ---- */

static int find_tensor(const struct weightsync_meta *have, const char *name, int hint) {
    if (hint < have->n_tensors && strcmp(have->tensors[hint].name, name) == 0) return hint;
    for (int j = 0; j < have->n_tensors; j++)
        if (strcmp(have->tensors[j].name, name) == 0) return j;
    return -1;
}

static int check_tensor(const struct weightsync_meta *have, const struct weightsync_tensor *t, int i, bool *seen,
                        struct smelt_error *err) {
    char field[48];
    snprintf(field, sizeof field, "tensors[%d]", i);
    int j = find_tensor(have, t->name, i);
    if (j < 0)
        return error_set_field(err, SMELT_EINVAL, field, "%s: unknown tensor '%s' (this worker's %s has no such "
                               "parameter)", field, t->name, have->kind == WEIGHTSYNC_LORA ? "adapter" : "model");
    const struct weightsync_tensor *h = &have->tensors[j];
    if (seen[j]) return error_set_field(err, SMELT_EINVAL, field, "%s: tensor '%s' twice", field, t->name);
    seen[j] = true;
    if (t->dtype != h->dtype)
        return error_set_field(err, SMELT_EINVAL, field, "%s: tensor '%s' is %s, this worker holds %s", field, t->name,
                               dtype_name(t->dtype), dtype_name(h->dtype));
    if (t->ndim != h->ndim || t->shape[0] != h->shape[0] || t->shape[1] != h->shape[1])
        return error_set_field(err, SMELT_EINVAL, field, "%s: tensor '%s' has shape [%lld, %lld], this worker's "
                               "[%lld, %lld]", field, t->name, (long long)t->shape[0], (long long)t->shape[1],
                               (long long)h->shape[0], (long long)h->shape[1]);
    if (t->offset_bytes != h->offset_bytes || t->bytes != h->bytes)
        return error_set_field(err, SMELT_EINVAL, field, "%s: tensor '%s' at bytes [%lld, +%lld), this worker's at "
                               "[%lld, +%lld)", field, t->name, (long long)t->offset_bytes, (long long)t->bytes,
                               (long long)h->offset_bytes, (long long)h->bytes);
    return SMELT_OK;
}

static int check_tensors(const struct weightsync_meta *have, const struct weightsync_meta *got,
                         struct smelt_error *err) {
    bool *seen = calloc((size_t)(have->n_tensors > 0 ? have->n_tensors : 1), sizeof *seen);
    if (!seen) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory");
    int rc = SMELT_OK;
    for (int i = 0; i < got->n_tensors && !rc; i++) rc = check_tensor(have, &got->tensors[i], i, seen, err);
    for (int j = 0; j < have->n_tensors && !rc; j++)
        if (!seen[j])
            rc = error_set_field(err, SMELT_EINVAL, "tensors", "tensors: '%s' is missing (%d of this worker's %d "
                                 "tensors given)", have->tensors[j].name, got->n_tensors, have->n_tensors);
    free(seen);
    return rc;
}

static int check_lora_config(const struct weightsync_meta *have, const struct weightsync_meta *got,
                             struct smelt_error *err) {
    if (got->lora.rank != have->lora.rank || got->lora.alpha != have->lora.alpha ||
        got->lora.use_rslora != have->lora.use_rslora)
        return error_set_field(err, SMELT_EINVAL, "lora", "lora: rank %d, alpha %g, use_rslora %s; this worker's "
                               "adapter has rank %d, alpha %g, use_rslora %s", got->lora.rank, (double)got->lora.alpha,
                               got->lora.use_rslora ? "true" : "false", have->lora.rank, (double)have->lora.alpha,
                               have->lora.use_rslora ? "true" : "false");
    return SMELT_OK;
}

static int check_meta(const struct weightsync_receiver *rx, const struct weightsync_meta *m, int64_t current,
                      struct smelt_error *err) {
    if (m->version <= current)
        return error_set_field(err, SMELT_EINVAL, "version", "version: %lld is not newer than this worker's policy "
                               "version %lld", (long long)m->version, (long long)current);
    if (m->kind == WEIGHTSYNC_LORA && !rx->has_adapter)
        return error_set_field(err, SMELT_EINVAL, "kind", "kind: \"lora\", but this worker has no adapter (start it "
                               "with --adapter, an adapter of the trainer's configuration)");
    const struct weightsync_meta *have = m->kind == WEIGHTSYNC_LORA ? &rx->lora : &rx->full;
    if (m->kind == WEIGHTSYNC_LORA) TRY(check_lora_config(have, m, err));
    if (m->total_bytes != have->total_bytes)
        return error_set_field(err, SMELT_EINVAL, "total_bytes", "total_bytes: %lld, this worker's %s holds %lld",
                               (long long)m->total_bytes, m->kind == WEIGHTSYNC_LORA ? "adapter" : "model",
                               (long long)have->total_bytes);
    if (m->bucket_bytes < 4 || m->bucket_bytes % 4 != 0 || m->bucket_bytes > WEIGHTSYNC_MAX_BUCKET_BYTES)
        return error_set_field(err, SMELT_EINVAL, "bucket_bytes", "bucket_bytes: %lld is not a multiple of 4 in "
                               "[4, %lld]", (long long)m->bucket_bytes, (long long)WEIGHTSYNC_MAX_BUCKET_BYTES);
    int64_t n = (m->total_bytes + m->bucket_bytes - 1) / m->bucket_bytes;
    if (m->n_buckets != n)
        return error_set_field(err, SMELT_EINVAL, "n_buckets", "n_buckets: %lld, but %lld bytes in buckets of %lld "
                               "make %lld", (long long)m->n_buckets, (long long)m->total_bytes,
                               (long long)m->bucket_bytes, (long long)n);
    return check_tensors(have, m, err);
}

static int copy_meta(struct weightsync_meta *dst, const struct weightsync_meta *src, struct smelt_error *err) {
    *dst = *src;
    dst->tensors = malloc((size_t)(src->n_tensors > 0 ? src->n_tensors : 1) * sizeof *dst->tensors);
    if (!dst->tensors) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory");
    if (src->n_tensors) memcpy(dst->tensors, src->tensors, (size_t)src->n_tensors * sizeof *dst->tensors);
    return SMELT_OK;
}

/* Staging for the whole stream and a flag per bucket; kept from sync to sync. */
static int reserve(struct weightsync_receiver *rx, const struct weightsync_meta *m, struct smelt_error *err) {
    if (m->total_bytes > rx->staging_bytes) {
        uint8_t *s = realloc(rx->staging, (size_t)m->total_bytes);
        if (!s) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory staging %lld bytes", (long long)m->total_bytes);
        rx->staging = s;
        rx->staging_bytes = m->total_bytes;
    }
    uint8_t *a = realloc(rx->arrived, (size_t)(m->n_buckets > 0 ? m->n_buckets : 1));
    if (!a) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory");
    rx->arrived = a;
    memset(rx->arrived, 0, (size_t)(m->n_buckets > 0 ? m->n_buckets : 1));
    return SMELT_OK;
}

int weightsync_receiver_begin(struct weightsync_receiver *rx, const struct weightsync_meta *meta,
                              int64_t current_version, struct smelt_error *err) {
    weightsync_receiver_abandon(rx); /* a begin supersedes whatever was in progress */
    rx->refused = false;
    int rc = check_meta(rx, meta, current_version, err);
    if (!rc) rc = reserve(rx, meta, err);
    if (!rc) rc = copy_meta(&rx->meta, meta, err);
    if (rc) return refuse(rx, meta->version, rc);
    rx->state = WEIGHTSYNC_RX_RECEIVING;
    rx->begin_seconds = now_seconds();
    return SMELT_OK;
}

/* ---- buckets ---- */

/* A message of version that comes while no sync of that version is in progress: ignored
 * when that sync was refused already (its sender has the answer), refused when there
 * is no sync at all, answered without harm to the sync in progress otherwise. */
static int not_in_progress(struct weightsync_receiver *rx, int64_t version, const char *what,
                           struct smelt_error *err) {
    if (rx->refused && rx->refused_version == version && rx->state == WEIGHTSYNC_RX_IDLE) return WEIGHTSYNC_IGNORED;
    if (rx->state == WEIGHTSYNC_RX_IDLE)
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, "version", "%s for version %lld without a "
                                                   "weights.begin", what, (long long)version));
    /* A stray message: answered, but the sync in progress goes on. */
    return error_set_field(err, SMELT_EINVAL, "version", "%s for version %lld while version %lld is being received",
                           what, (long long)version, (long long)rx->meta.version);
}

int weightsync_receiver_bucket_dst(struct weightsync_receiver *rx, int64_t version, int64_t index, void **dst,
                                   int64_t *bytes, struct smelt_error *err) {
    if (rx->state != WEIGHTSYNC_RX_RECEIVING || rx->meta.version != version)
        return not_in_progress(rx, version, "weights.bucket", err);
    if (index < 0 || index >= rx->meta.n_buckets)
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, "index", "index: bucket %lld of a sync of %lld "
                                                   "buckets", (long long)index, (long long)rx->meta.n_buckets));
    if (rx->arrived[index])
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, "index", "index: bucket %lld arrived twice",
                                                   (long long)index));
    *dst = rx->staging + index * rx->meta.bucket_bytes;
    *bytes = weightsync_bucket_size(&rx->meta, index);
    return SMELT_OK;
}

int weightsync_receiver_landed(struct weightsync_receiver *rx, int64_t version, int64_t index, uint64_t hash,
                               struct smelt_error *err) {
    void *dst;
    int64_t bytes;
    TRY(weightsync_receiver_bucket_dst(rx, version, index, &dst, &bytes, err));
    return weightsync_receiver_landed_hashed(rx, version, index, weightsync_hash(dst, (size_t)bytes), hash, err);
}

int weightsync_receiver_landed_hashed(struct weightsync_receiver *rx, int64_t version, int64_t index, uint64_t got,
                                      uint64_t want, struct smelt_error *err) {
    void *dst;
    int64_t bytes;
    TRY(weightsync_receiver_bucket_dst(rx, version, index, &dst, &bytes, err));
    if (got != want)
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, "hash", "hash: bucket %lld's bytes hash to "
                                                   "%016llx, the sender's is %016llx", (long long)index,
                                                   (unsigned long long)got, (unsigned long long)want));
    rx->arrived[index] = 1;
    rx->n_arrived++;
    rx->bytes_arrived += bytes;
    return SMELT_OK;
}

int weightsync_receiver_bucket(struct weightsync_receiver *rx, const struct weightsync_bucket *b,
                               struct smelt_error *err) {
    void *dst;
    int64_t bytes;
    TRY(weightsync_receiver_bucket_dst(rx, b->version, b->index, &dst, &bytes, err));
    if (b->bytes != bytes)
        return refuse(rx, b->version, error_set_field(err, SMELT_EINVAL, "bytes", "bytes: bucket %lld holds %lld "
                                                      "bytes, %lld expected", (long long)b->index,
                                                      (long long)b->bytes, (long long)bytes));
    memcpy(dst, b->data, (size_t)bytes);
    return weightsync_receiver_landed(rx, b->version, b->index, b->hash, err);
}

/* ---- end ---- */

int weightsync_receiver_end(struct weightsync_receiver *rx, int64_t version, int64_t n_buckets, int64_t total_bytes,
                            struct smelt_error *err) {
    if (rx->state != WEIGHTSYNC_RX_RECEIVING || rx->meta.version != version)
        return not_in_progress(rx, version, "weights.end", err);
    const struct weightsync_meta *m = &rx->meta;
    if (n_buckets != m->n_buckets || total_bytes != m->total_bytes)
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, n_buckets != m->n_buckets ? "n_buckets" :
                                                   "total_bytes", "weights.end says %lld buckets of %lld bytes, "
                                                   "weights.begin %lld of %lld", (long long)n_buckets,
                                                   (long long)total_bytes, (long long)m->n_buckets,
                                                   (long long)m->total_bytes));
    if (rx->n_arrived != m->n_buckets) {
        int64_t missing = 0;
        while (missing < m->n_buckets && rx->arrived[missing]) missing++;
        return refuse(rx, version, error_set_field(err, SMELT_EINVAL, "n_buckets", "n_buckets: %lld of %lld buckets "
                                                   "arrived; bucket %lld is missing", (long long)rx->n_arrived,
                                                   (long long)m->n_buckets, (long long)missing));
    }
    rx->state = WEIGHTSYNC_RX_COMPLETE;
    return SMELT_OK;
}

const void *weightsync_receiver_stream(const struct weightsync_receiver *rx) {
    return rx->state == WEIGHTSYNC_RX_COMPLETE ? rx->staging : NULL;
}

struct weightsync_ack weightsync_receiver_done(struct weightsync_receiver *rx) {
    struct weightsync_ack ack = {.version = rx->meta.version, .kind = rx->meta.kind, .bytes = rx->bytes_arrived,
                                 .buckets = rx->n_arrived, .seconds = now_seconds() - rx->begin_seconds};
    weightsync_receiver_abandon(rx);
    return ack;
}
