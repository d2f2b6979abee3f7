/* A sync's metadata from the parameter tables that already describe the flat buffers:
 * the model's (model->params) and the adapter's (lora->params). Both tile their buffer
 * back to back, so the packed stream is the buffer itself. */
#include "weightsync/weightsync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *weightsync_kind_name(enum weightsync_kind kind) { return kind == WEIGHTSYNC_LORA ? "lora" : "full"; }

const char *weightsync_via_name(enum weightsync_via via) { return via == WEIGHTSYNC_VIA_BROADCAST ? "broadcast" : "zmq"; }

static int check_bucket_bytes(int64_t *bucket_bytes, struct smelt_error *err) {
    if (*bucket_bytes == 0) *bucket_bytes = WEIGHTSYNC_DEFAULT_BUCKET_BYTES;
    if (*bucket_bytes < 4 || *bucket_bytes > WEIGHTSYNC_MAX_BUCKET_BYTES || *bucket_bytes % 4 != 0)
        return error_set_field(err, SMELT_EINVAL, "bucket_bytes",
                               "bucket_bytes: %lld is not a multiple of 4 in [4, %lld]", (long long)*bucket_bytes,
                               (long long)WEIGHTSYNC_MAX_BUCKET_BYTES);
    return SMELT_OK;
}

/* An empty meta of n tensors; the caller fills them and calls finish_layout. */
static int meta_alloc(enum weightsync_kind kind, int64_t version, int64_t bucket_bytes, int n,
                      struct weightsync_meta *out, struct smelt_error *err) {
    *out = (struct weightsync_meta){.kind = kind, .version = version, .bucket_bytes = bucket_bytes, .n_tensors = n};
    out->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *out->tensors);
    if (!out->tensors) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory");
    return SMELT_OK;
}

static void set_tensor(struct weightsync_tensor *t, const char *name, int ndim, const int64_t *shape,
                       int64_t offset, int64_t numel) {
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = DTYPE_F32;
    t->ndim = ndim;
    t->shape[0] = shape[0];
    t->shape[1] = ndim == 2 ? shape[1] : 1;
    t->offset_bytes = offset * (int64_t)sizeof(float);
    t->bytes = numel * (int64_t)sizeof(float);
}

static void finish_layout(struct weightsync_meta *m, int64_t n_elements) {
    m->total_bytes = n_elements * (int64_t)sizeof(float);
    m->n_buckets = (m->total_bytes + m->bucket_bytes - 1) / m->bucket_bytes;
}

int weightsync_meta_model(const struct model *model, int64_t version, int64_t bucket_bytes,
                          struct weightsync_meta *out, struct smelt_error *err) {
    TRY(check_bucket_bytes(&bucket_bytes, err));
    TRY(meta_alloc(WEIGHTSYNC_FULL, version, bucket_bytes, model->n_params, out, err));
    for (int i = 0; i < model->n_params; i++) {
        const struct model_param *p = &model->params[i];
        set_tensor(&out->tensors[i], p->name, p->ndim, p->shape, p->offset, p->numel);
    }
    finish_layout(out, model->n_weights);
    return SMELT_OK;
}

int weightsync_meta_lora(const struct lora *adapter, int64_t version, int64_t bucket_bytes,
                         struct weightsync_meta *out, struct smelt_error *err) {
    TRY(check_bucket_bytes(&bucket_bytes, err));
    TRY(meta_alloc(WEIGHTSYNC_LORA, version, bucket_bytes, adapter->n_params, out, err));
    for (int i = 0; i < adapter->n_params; i++) {
        const struct lora_param *p = &adapter->params[i];
        set_tensor(&out->tensors[i], p->name, 2, p->shape, p->offset, p->numel);
    }
    out->lora.rank = adapter->config.rank;
    out->lora.alpha = adapter->config.alpha;
    out->lora.use_rslora = adapter->config.use_rslora;
    finish_layout(out, adapter->n_weights);
    return SMELT_OK;
}

void weightsync_meta_free(struct weightsync_meta *meta) {
    if (!meta) return;
    free(meta->tensors);
    meta->tensors = NULL;
    meta->n_tensors = 0;
}

int64_t weightsync_bucket_size(const struct weightsync_meta *meta, int64_t index) {
    if (index < 0 || index >= meta->n_buckets) return 0;
    int64_t start = index * meta->bucket_bytes, left = meta->total_bytes - start;
    return left < meta->bucket_bytes ? left : meta->bucket_bytes;
}
