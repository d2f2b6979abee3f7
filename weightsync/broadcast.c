/* The broadcast transport's bytes: every bucket one comm_broadcast from the sender's
 * group rank, two in flight at most, so each side hashes bucket k while k + 1 moves (the
 * communicator runs its operations on a thread of its own, in issue order). The
 * metadata, the end (which carries the sender's hashes) and the acks are the caller's:
 * they go over ZeroMQ like every other sync's. */
#include "weightsync/weightsync_internal.h"

#include <stdlib.h>

/* Waits for every request still in flight (comm_destroy needs them waited for); the
 * first error is the one kept. */
static int wait_all(struct comm_request **reqs, int n, int rc, struct smelt_error *err) {
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        struct smelt_error e = {0};
        int r = comm_wait(reqs[i], &e);
        reqs[i] = NULL;
        if (r && !rc) {
            *err = e;
            rc = r;
        }
    }
    return rc;
}

static size_t elements(int64_t bytes) { return (size_t)bytes / sizeof(float); }

/* ---- sending ---- */

int weightsync_broadcast_send(struct comm *comm, int root, const struct weightsync_meta *meta,
                              const struct tensor *source, uint64_t *hashes, struct smelt_error *err) {
    TRY(weightsync_check_source(meta, source, err));
    float *host[2] = {NULL, NULL};
    int64_t room = meta->total_bytes < meta->bucket_bytes ? meta->total_bytes : meta->bucket_bytes;
    for (int i = 0; source->backend != BACKEND_CPU && i < 2 && meta->n_buckets > 0; i++)
        if (!(host[i] = malloc((size_t)room))) {
            free(host[0]);
            return error_set(err, SMELT_ENOMEM, "weightsync: out of memory for two buckets");
        }
    struct comm_request *reqs[2] = {NULL, NULL};
    int rc = SMELT_OK;
    for (int64_t k = 0; !rc && k < meta->n_buckets; k++) {
        int slot = (int)(k % 2);
        rc = wait_all(&reqs[slot], 1, rc, err); /* bucket k - 2 left this slot's buffer */
        const void *data = NULL;
        if (!rc) rc = weightsync_source_bucket(meta, source, k, host[slot], &data, err);
        int64_t bytes = weightsync_bucket_size(meta, k);
        if (!rc) hashes[k] = weightsync_hash(data, (size_t)bytes); /* while bucket k - 1 moves */
        /* The root's buffer is only read by a broadcast. */
        if (!rc) rc = comm_broadcast(comm, (void *)data, elements(bytes), COMM_F32, root, &reqs[slot], err);
    }
    rc = wait_all(reqs, 2, rc, err);
    free(host[0]);
    free(host[1]);
    return rc;
}

/* ---- receiving ---- */

/* Where bucket k lands: rx's staging while rx receives meta's version, else scratch (a
 * bucket's room, allocated on first use). */
static int landing_of(struct weightsync_receiver *rx, const struct weightsync_meta *meta, int64_t k,
                      uint8_t **scratch, void **dst, struct smelt_error *err) {
    int64_t bytes;
    bool mine = rx->state == WEIGHTSYNC_RX_RECEIVING && rx->meta.version == meta->version;
    if (mine) return weightsync_receiver_bucket_dst(rx, meta->version, k, dst, &bytes, err);
    if (!*scratch) {
        int64_t room = meta->total_bytes < meta->bucket_bytes ? meta->total_bytes : meta->bucket_bytes;
        if (!(*scratch = malloc((size_t)room * 2)))
            return error_set(err, SMELT_ENOMEM, "weightsync: out of memory for two buckets");
    }
    *dst = *scratch + (k % 2) * (meta->total_bytes < meta->bucket_bytes ? meta->total_bytes : meta->bucket_bytes);
    return SMELT_OK;
}

static int issue(struct comm *comm, int root, struct weightsync_receiver *rx, const struct weightsync_meta *meta,
                 int64_t k, uint8_t **scratch, void **dst, struct comm_request **req, struct smelt_error *err) {
    TRY(landing_of(rx, meta, k, scratch, dst, err));
    return comm_broadcast(comm, *dst, elements(weightsync_bucket_size(meta, k)), COMM_F32, root, req, err);
}

int weightsync_broadcast_receive(struct comm *comm, int root, struct weightsync_receiver *rx,
                                 const struct weightsync_meta *meta, uint64_t *got, struct smelt_error *err) {
    if (meta->bucket_bytes < 4 || meta->bucket_bytes % 4 != 0 || meta->bucket_bytes > WEIGHTSYNC_MAX_BUCKET_BYTES ||
        meta->total_bytes % 4 != 0)
        return error_set_field(err, SMELT_EINVAL, "bucket_bytes", "weightsync: buckets of %lld bytes over %lld bytes "
                               "are not whole f32 elements", (long long)meta->bucket_bytes,
                               (long long)meta->total_bytes);
    uint8_t *scratch = NULL;
    void *dst[2] = {NULL, NULL};
    struct comm_request *reqs[2] = {NULL, NULL};
    int rc = meta->n_buckets > 0 ? issue(comm, root, rx, meta, 0, &scratch, &dst[0], &reqs[0], err) : SMELT_OK;
    for (int64_t k = 0; !rc && k < meta->n_buckets; k++) {
        int slot = (int)(k % 2), next = 1 - slot;
        if (k + 1 < meta->n_buckets) rc = issue(comm, root, rx, meta, k + 1, &scratch, &dst[next], &reqs[next], err);
        rc = wait_all(&reqs[slot], 1, rc, err);
        if (!rc) got[k] = weightsync_hash(dst[slot], (size_t)weightsync_bucket_size(meta, k)); /* while k + 1 moves */
    }
    rc = wait_all(reqs, 2, rc, err);
    free(scratch);
    return rc;
}
