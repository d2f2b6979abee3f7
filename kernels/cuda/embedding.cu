/* Token embedding lookup and its scatter-add backward.
 *
 * The backward must be deterministic, so it cannot scatter with atomics (repeated ids
 * would add in a different order each run). Instead the ids come to the host (they are
 * small: 4 bytes a token, and their range has to be checked anyway), are sorted by
 * (id, position) into segments of equal ids, and one block column per segment sums its
 * tokens in position order, one thread per channel, and adds the sum to the table row
 * once. llm.c's encoder backward uses the same host-built buckets. */
#include "kernels/cuda/cuda.cuh"

#include <stdlib.h>

/* One block per row (grid-stride over rows), threads across channels. */
template <typename T>
__global__ void embedding_kernel(T *__restrict__ out, const int32_t *__restrict__ ids,
                                 const T *__restrict__ table, int64_t tokens, int64_t channels) {
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        const T *row = table + (int64_t)ids[t] * channels;
        T *dst = out + t * channels;
        for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) dst[c] = row[c];
    }
}

/* Segment s covers order[start[s] .. start[s+1]), all tokens with id seg_id[s], in
 * position order. blockIdx.y strides the channels. */
template <typename T>
__global__ void embedding_backward_kernel(T *__restrict__ dtable, const T *__restrict__ dout,
                                          const int32_t *__restrict__ order,
                                          const int32_t *__restrict__ start,
                                          const int32_t *__restrict__ seg_id, int64_t channels) {
    int64_t s = blockIdx.x;
    int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    float sum = 0.0f;
    for (int32_t k = start[s]; k < start[s + 1]; k++) sum += to_f32(dout[(int64_t)order[k] * channels + c]);
    T *row = dtable + (int64_t)seg_id[s] * channels;
    row[c] = from_f32<T>(to_f32(row[c]) + sum);
}

static int bad_id(const char *op, int64_t pos, int32_t id, int64_t vocab, struct smelt_error *err) {
    return error_set(err, SMELT_EINVAL, "%s: token id %d at position %lld is outside the vocabulary [0, %lld)",
                     op, id, (long long)pos, (long long)vocab);
}

int cuda_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                   struct smelt_error *err) {
    const char *op = "ops_embedding";
    int64_t tokens = tensor_numel(ids), vocab = table->shape[0], channels = table->shape[1];
    if (tokens == 0 || channels == 0) return SMELT_OK;
    bool found;
    int64_t pos;
    int32_t id;
    if (int rc = cuda_find_bad_id((const int32_t *)ids->data, tokens, 0, vocab, &found, &pos, &id, op, err))
        return rc;
    if (found) return bad_id(op, pos, id, vocab, err);
    return with_compute_type(table->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        unsigned blocks = (unsigned)(tokens < 65536 ? tokens : 65536);
        embedding_kernel<T><<<blocks, cuda_row_threads(channels, 256)>>>(
            (T *)out->data, (const int32_t *)ids->data, (const T *)table->data, tokens, channels);
        CUDA_CHECK_LAUNCH(err, op, "embedding_kernel");
        return SMELT_OK;
    });
}

struct id_pos {
    int32_t id, pos;
};

static int by_id_then_pos(const void *pa, const void *pb) {
    const struct id_pos *a = (const struct id_pos *)pa, *b = (const struct id_pos *)pb;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Host side of the backward: ids in range, then the segment layout
 * [order (tokens) | start (segments + 1) | seg_id (segments)] in `layout`. */
static int build_segments(const int32_t *ids, int64_t tokens, int64_t vocab, int32_t *layout,
                          int64_t *segments_out, const char *op, struct smelt_error *err) {
    for (int64_t t = 0; t < tokens; t++)
        if (ids[t] < 0 || ids[t] >= vocab) return bad_id(op, t, ids[t], vocab, err);
    struct id_pos *pairs = (struct id_pos *)malloc((size_t)tokens * sizeof *pairs);
    if (!pairs) return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %lld sort entries", op, (long long)tokens);
    for (int64_t t = 0; t < tokens; t++) pairs[t] = {ids[t], (int32_t)t};
    qsort(pairs, (size_t)tokens, sizeof *pairs, by_id_then_pos);
    int32_t *order = layout, *start = layout + tokens;
    int64_t segments = 0;
    for (int64_t k = 0; k < tokens; k++) {
        order[k] = pairs[k].pos;
        if (k == 0 || pairs[k].id != pairs[k - 1].id) start[segments++] = (int32_t)k;
    }
    start[segments] = (int32_t)tokens;
    int32_t *seg_id = start + segments + 1;
    for (int64_t s = 0; s < segments; s++) seg_id[s] = pairs[start[s]].id;
    free(pairs);
    *segments_out = segments;
    return SMELT_OK;
}

int cuda_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                            const struct tensor *ids, struct smelt_error *err) {
    const char *op = "ops_embedding_backward";
    int64_t tokens = tensor_numel(ids), vocab = dtable->shape[0], channels = dtable->shape[1];
    if (tokens == 0) return SMELT_OK;
    if (tokens > INT32_MAX / 3)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %lld tokens in one call; at most %d", op,
                         (long long)tokens, INT32_MAX / 3);
    /* host: [ids (tokens) | layout (at most 3 tokens + 1)] */
    size_t host_ints = (size_t)(4 * tokens + 1);
    int32_t *host = (int32_t *)malloc(host_ints * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %lld host ids", op, (long long)tokens);
    int32_t *host_ids = host, *layout = host + tokens;
    int64_t segments = 0;
    cudaError_t e = cudaMemcpy(host_ids, ids->data, (size_t)tokens * sizeof *host_ids, cudaMemcpyDeviceToHost);
    int rc = e != cudaSuccess ? cuda_error(err, op, "cudaMemcpy(ids to host)", e)
                              : build_segments(host_ids, tokens, vocab, layout, &segments, op, err);
    size_t layout_bytes = (size_t)(tokens + 2 * segments + 1) * sizeof *layout;
    cuda_scratch device_layout;
    if (!rc && channels > 0) rc = device_layout.alloc(layout_bytes, op, err);
    if (!rc && channels > 0) {
        e = cudaMemcpy(device_layout.ptr, layout, layout_bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cuda_error(err, op, "cudaMemcpy(segments to device)", e);
    }
    free(host);
    if (rc || channels == 0) return rc;
    const int32_t *order = device_layout.as<int32_t>(), *start = order + tokens, *seg_id = start + segments + 1;
    return with_compute_type(dtable->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        int threads = cuda_row_threads(channels, 256);
        dim3 grid((unsigned)segments, (unsigned)((channels + threads - 1) / threads));
        embedding_backward_kernel<T><<<grid, threads>>>((T *)dtable->data, (const T *)dout->data,
                                                        order, start, seg_id, channels);
        CUDA_CHECK_LAUNCH(err, op, "embedding_backward_kernel");
        return SMELT_OK;
    });
}
