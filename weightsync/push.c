/* The sender: metadata, every bucket back to back, the end. Nothing here waits for a
 * receiver between buckets; a transport that queues (ZeroMQ's I/O thread) sends bucket k
 * while the next is packed, and the receiver copies k while k + 1 is on the wire. */
#include "weightsync/weightsync_internal.h"

#include <stdlib.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bucket index of the stream in host memory: a pointer into source on the CPU, else a
 * copy into host (one bucket's worth, reused). */
int weightsync_source_bucket(const struct weightsync_meta *meta, const struct tensor *source, int64_t index,
                             float *host, const void **out, struct smelt_error *err) {
    int64_t start = index * meta->bucket_bytes / (int64_t)sizeof(float);
    int64_t n = weightsync_bucket_size(meta, index) / (int64_t)sizeof(float);
    const float *base = (const float *)source->data + start;
    if (source->backend == BACKEND_CPU) {
        *out = base;
        return SMELT_OK;
    }
    struct tensor src = tensor_make(source->backend, DTYPE_F32, (void *)base, 1, &n);
    struct tensor dst = tensor_f32(host, 1, &n);
    TRY(tensor_copy(&dst, &src, err));
    *out = host;
    return SMELT_OK;
}

int weightsync_check_source(const struct weightsync_meta *meta, const struct tensor *source, struct smelt_error *err) {
    if (source->dtype != DTYPE_F32 || (int64_t)tensor_nbytes(source) != meta->total_bytes)
        return error_set(err, SMELT_EINVAL, "weightsync: the source holds %zu bytes of %s, the metadata says %lld of f32",
                         tensor_nbytes(source), dtype_name(source->dtype), (long long)meta->total_bytes);
    if (meta->bucket_bytes < 4 || meta->bucket_bytes % 4 != 0 || meta->bucket_bytes > WEIGHTSYNC_MAX_BUCKET_BYTES)
        return error_set_field(err, SMELT_EINVAL, "bucket_bytes", "weightsync: bucket_bytes %lld is not a multiple "
                               "of 4 in [4, %lld]", (long long)meta->bucket_bytes, (long long)WEIGHTSYNC_MAX_BUCKET_BYTES);
    return SMELT_OK;
}

int weightsync_push(const struct weightsync_transport *t, const struct weightsync_meta *meta,
                    const struct tensor *source, struct weightsync_report *report, struct smelt_error *err) {
    TRY(weightsync_check_source(meta, source, err));
    *report = (struct weightsync_report){.version = meta->version, .kind = meta->kind, .bytes = meta->total_bytes,
                                         .buckets = meta->n_buckets};
    float *host = NULL;
    if (source->backend != BACKEND_CPU && meta->n_buckets > 0) {
        host = malloc((size_t)(meta->total_bytes < meta->bucket_bytes ? meta->total_bytes : meta->bucket_bytes));
        if (!host) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory for a bucket");
    }
    double t0 = now_seconds();
    int rc = t->begin(t->ctx, meta, err);
    if (!rc && t->stream) rc = t->stream(t->ctx, meta, source, err);
    for (int64_t k = 0; !rc && !t->stream && k < meta->n_buckets; k++) {
        struct weightsync_bucket b = {.version = meta->version, .index = k, .bytes = weightsync_bucket_size(meta, k)};
        rc = weightsync_source_bucket(meta, source, k, host, &b.data, err);
        if (!rc) {
            b.hash = weightsync_hash(b.data, (size_t)b.bytes);
            rc = t->bucket(t->ctx, &b, err);
        }
    }
    report->send_seconds = now_seconds() - t0;
    if (!rc) rc = t->finish(t->ctx, meta, report, err);
    report->seconds = now_seconds() - t0;
    free(host);
    return rc;
}
