/* Token embedding lookup and its scatter-add backward. */
#include "kernels/cpu/cpu.h"

#include <string.h>

/* Ids come from datasets and requests: checked here, where the data is readable. */
static int check_ids(const char *op, const int32_t *ids, int64_t n, int64_t vocab,
                     struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= vocab)
            return error_set(err, SMELT_EINVAL, "%s: token id %d at position %lld is outside the vocabulary [0, %lld)",
                             op, ids[t], (long long)t, (long long)vocab);
    return SMELT_OK;
}

int cpu_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                  struct smelt_error *err) {
    int64_t n = tensor_numel(ids), vocab = table->shape[0], c = table->shape[1];
    const int32_t *id = ids->data;
    int rc = check_ids("ops_embedding", id, n, vocab, err);
    if (rc) return rc;
    float *o = out->data;
    const float *w = table->data;
#pragma omp parallel for schedule(static) if (n * c > 32768)
    for (int64_t t = 0; t < n; t++) memcpy(o + t * c, w + (int64_t)id[t] * c, (size_t)c * sizeof(float));
    return SMELT_OK;
}

int cpu_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                           const struct tensor *ids, struct smelt_error *err) {
    int64_t n = tensor_numel(ids), vocab = dtable->shape[0], c = dtable->shape[1];
    const int32_t *id = ids->data;
    int rc = check_ids("ops_embedding_backward", id, n, vocab, err);
    if (rc) return rc;
    float *dw = dtable->data;
    const float *d = dout->data;
    /* Threads split the channels, so repeated ids never race and every row sums its
     * tokens in position order: deterministic for any thread count. */
    enum { BLOCK = 64 };
    int64_t blocks = (c + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n * c > 32768)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j0 = b * BLOCK, j1 = j0 + BLOCK < c ? j0 + BLOCK : c;
        for (int64_t t = 0; t < n; t++) {
            float *row = dw + (int64_t)id[t] * c;
            const float *src = d + t * c;
            for (int64_t j = j0; j < j1; j++) row[j] += src[j];
        }
    }
    return SMELT_OK;
}
