/* The paged KV cache: appending new tokens' keys and values, and causal attention of
 * query tokens over what the cache holds (layout in kernels/ops.h and
 * kernels/cpu/paged_attention.c).
 *
 * Append: one block per token copies its [Hkv, D] row of k and of v to its slot.
 * Slots are checked on the device first (negative: skipped; past the pool: the call is
 * refused before anything is written), which costs one host wait. Slots in one call
 * are meant to be distinct: where one repeats, which token's row lands is unspecified
 * here (the CPU keeps the last).
 *
 * Attention: one block of PAGED_WARPS warps per (query token, q head). Warp w takes
 * keys w, w + PAGED_WARPS, ... of the query's causal range: the lanes split D for the
 * dot product (warp_sum, fixed order), then the warp folds the key into its online
 * softmax (running max m, running sum l, accumulator acc[D] rescaled when m grows).
 * The warps' partial results are merged in warp order at the end, so the result does
 * not depend on scheduling: deterministic run to run. Everything is f32; bf16 storage
 * is loaded with to_f32 and the output rounded once.
 *
 * cu_q and context_lens are host arrays: they go to the device in one copy per call
 * (with a little scratch for the block-id check). Block ids in the used part of each
 * table row are checked on the device before the attention runs (one host wait); a bad
 * one refuses the call and leaves out untouched. */
#include "kernels/cuda/cuda.cuh"

#include <stdlib.h>

enum { PAGED_WARPS = 4, PAGED_THREADS = PAGED_WARPS * 32 };

/* ---- append ---- */

template <typename T>
__global__ void kv_append_kernel(T *__restrict__ k_cache, T *__restrict__ v_cache,
                                 const T *__restrict__ k, const T *__restrict__ v,
                                 const int32_t *__restrict__ slots, int64_t tokens, int64_t width) {
    for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
        int64_t slot = slots[t];
        if (slot < 0) continue; /* a padding token: not cached */
        for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
            k_cache[slot * width + c] = k[t * width + c];
            v_cache[slot * width + c] = v[t * width + c];
        }
    }
}

int cuda_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                   const struct tensor *v, const struct tensor *slot_mapping,
                   struct smelt_error *err) {
    const char *op = "ops_kv_append";
    int64_t tokens = k->shape[0], width = k->shape[1] * k->shape[2];
    int64_t blocks = k_cache->shape[0], block_size = k_cache->shape[1], slots = blocks * block_size;
    bool found;
    int64_t pos;
    int32_t value;
    if (int rc = cuda_find_bad_id((const int32_t *)slot_mapping->data, tokens, INT32_MIN, slots, &found,
                                  &pos, &value, op, err))
        return rc;
    if (found)
        return error_set(err, SMELT_EINVAL,
                         "%s: slot_mapping[%lld] is %d, outside the pool of %lld slots (%lld blocks of %lld)",
                         op, (long long)pos, value, (long long)slots, (long long)blocks, (long long)block_size);
    if (tokens == 0 || width == 0) return SMELT_OK;
    return with_compute_type(k->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        unsigned grid = (unsigned)(tokens < 65536 ? tokens : 65536);
        kv_append_kernel<T><<<grid, cuda_row_threads(width, 256)>>>(
            (T *)k_cache->data, (T *)v_cache->data, (const T *)k->data, (const T *)v->data,
            (const int32_t *)slot_mapping->data, tokens, width);
        CUDA_CHECK_LAUNCH(err, op, "kv_append_kernel");
        return SMELT_OK;
    });
}

/* ---- block-id check ---- */

/* *first = the smallest flat index s * max_blocks + j with j inside sequence s's used
 * blocks and tables[s][j] outside [0, n_blocks). */
__global__ void find_bad_block_kernel(const int32_t *__restrict__ tables,
                                      const int32_t *__restrict__ context_lens, int64_t nseq,
                                      int64_t max_blocks, int64_t block_size, int64_t n_blocks,
                                      unsigned long long *first) {
    int64_t n = nseq * max_blocks, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t s = i / max_blocks, j = i % max_blocks;
        int64_t used = ((int64_t)context_lens[s] + block_size - 1) / block_size;
        int64_t block = tables[i];
        if (j < used && (block < 0 || block >= n_blocks)) {
            atomicMin(first, (unsigned long long)i);
            return; /* later indices of this thread are larger */
        }
    }
}

/* The sequences' metadata on the device: [cu_q (S + 1) | context_lens (S)]. */
struct paged_meta {
    cuda_scratch buffer;
    const int32_t *cu_q() const { return buffer.as<int32_t>(); }
    const int32_t *context_lens(int64_t nseq) const { return buffer.as<int32_t>() + nseq + 1; }
};

static int meta_upload(paged_meta *meta, const struct tensor *cu_q, const struct tensor *context_lens,
                       int64_t nseq, const char *op, struct smelt_error *err) {
    size_t cu_bytes = (size_t)(nseq + 1) * sizeof(int32_t), len_bytes = (size_t)nseq * sizeof(int32_t);
    if (int rc = meta->buffer.alloc(cu_bytes + len_bytes, op, err)) return rc;
    char *dst = meta->buffer.as<char>();
    /* Synchronous copies: the host arrays belong to the caller once we return. */
    CUDA_TRY(err, op, cudaMemcpy(dst, cu_q->data, cu_bytes, cudaMemcpyHostToDevice));
    if (len_bytes) CUDA_TRY(err, op, cudaMemcpy(dst + cu_bytes, context_lens->data, len_bytes, cudaMemcpyHostToDevice));
    return SMELT_OK;
}

static int check_block_ids(const struct tensor *block_tables, const struct tensor *context_lens,
                           const paged_meta &meta, int64_t nseq, int64_t block_size, int64_t n_blocks,
                           const char *op, struct smelt_error *err) {
    int64_t max_blocks = block_tables->shape[1], n = nseq * max_blocks;
    if (n == 0) return SMELT_OK;
    cuda_scratch first;
    if (int rc = first.alloc(sizeof(unsigned long long), op, err)) return rc;
    CUDA_TRY(err, op, cudaMemsetAsync(first.ptr, 0xff, sizeof(unsigned long long), 0));
    const int32_t *tables = (const int32_t *)block_tables->data;
    find_bad_block_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
        tables, meta.context_lens(nseq), nseq, max_blocks, block_size, n_blocks,
        first.as<unsigned long long>());
    CUDA_CHECK_LAUNCH(err, op, "find_bad_block_kernel");
    unsigned long long at = 0;
    CUDA_TRY(err, op, cudaMemcpy(&at, first.ptr, sizeof at, cudaMemcpyDeviceToHost));
    if (at == ~0ull) return SMELT_OK;
    int32_t value = 0;
    CUDA_TRY(err, op, cudaMemcpy(&value, tables + at, sizeof value, cudaMemcpyDeviceToHost));
    int64_t s = (int64_t)at / max_blocks, j = (int64_t)at % max_blocks;
    int64_t used = ((int64_t)((const int32_t *)context_lens->data)[s] + block_size - 1) / block_size;
    return error_set(err, SMELT_EINVAL,
                     "%s: block_tables[%lld][%lld] is %d, outside the pool [0, %lld) (sequence %lld reads %lld blocks)",
                     op, (long long)s, (long long)j, value, (long long)n_blocks, (long long)s, (long long)used);
}

/* ---- attention ---- */

struct paged_shape {
    int64_t tokens, hq, hkv, dim, nseq, block_size, max_blocks;
    float scale;
};

/* Shared memory: q row [D] | acc [PAGED_WARPS][D] | m [PAGED_WARPS] | l [PAGED_WARPS]. */
static size_t paged_shared_bytes(int64_t dim) {
    return ((size_t)(PAGED_WARPS + 1) * (size_t)dim + 2 * PAGED_WARPS) * sizeof(float);
}

template <typename T>
__global__ void paged_attention_kernel(T *__restrict__ out, const T *__restrict__ q,
                                       const T *__restrict__ k_cache, const T *__restrict__ v_cache,
                                       const int32_t *__restrict__ tables, const int32_t *__restrict__ cu,
                                       const int32_t *__restrict__ context_lens, paged_shape sh) {
    extern __shared__ float shared[];
    int64_t dim = sh.dim;
    float *q_row = shared, *acc_all = shared + dim;
    float *m_all = acc_all + PAGED_WARPS * dim, *l_all = m_all + PAGED_WARPS;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *acc = acc_all + warp * dim;
    int64_t group = sh.hq / sh.hkv, rows = sh.tokens * sh.hq;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t t = row / sh.hq, h = row % sh.hq, kvh = h / group;
        int64_t lo = 0, hi = sh.nseq - 1; /* the sequence of t: the last s with cu[s] <= t */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if (cu[mid] <= t) lo = mid;
            else hi = mid - 1;
        }
        int64_t s = lo, queries = (int64_t)cu[s + 1] - cu[s];
        int64_t keys = (int64_t)context_lens[s] - queries + (t - cu[s]) + 1; /* positions 0 .. own */
        const int32_t *table = tables + s * sh.max_blocks;

        __syncthreads(); /* the previous row's merge has read q_row and acc */
        for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) q_row[d] = to_f32(q[row * dim + d]);
        for (int64_t d = lane; d < dim; d += 32) acc[d] = 0.0f;
        __syncthreads();

        float m = -INFINITY, l = 0.0f;
        for (int64_t j = warp; j < keys; j += PAGED_WARPS) {
            int64_t slot = (int64_t)table[j / sh.block_size] * sh.block_size + j % sh.block_size;
            int64_t base = (slot * sh.hkv + kvh) * dim;
            float part = 0.0f;
            for (int64_t d = lane; d < dim; d += 32) part += q_row[d] * to_f32(k_cache[base + d]);
            float score = sh.scale * warp_sum(part);
            float m_new = fmaxf(m, score);
            float rescale = expf(m - m_new), p = expf(score - m_new); /* expf(-inf) = 0 at the first key */
            l = l * rescale + p;
            for (int64_t d = lane; d < dim; d += 32) acc[d] = acc[d] * rescale + p * to_f32(v_cache[base + d]);
            m = m_new;
        }
        if (lane == 0) m_all[warp] = m, l_all[warp] = l;
        __syncthreads();

        /* Merge in warp order; a warp that saw no key has m = -inf and adds nothing. */
        float m_max = -INFINITY;
        for (int w = 0; w < PAGED_WARPS; w++) m_max = fmaxf(m_max, m_all[w]);
        float total = 0.0f;
        for (int w = 0; w < PAGED_WARPS; w++)
            if (m_all[w] != -INFINITY) total += l_all[w] * expf(m_all[w] - m_max);
        for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < PAGED_WARPS; w++)
                if (m_all[w] != -INFINITY) o += acc_all[w * dim + d] * expf(m_all[w] - m_max);
            out[row * dim + d] = from_f32<T>(o / total);
        }
    }
}

int cuda_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                         const struct tensor *v_cache, const struct tensor *block_tables,
                         const struct tensor *cu_q, const struct tensor *context_lens, float scale,
                         struct smelt_error *err) {
    const char *op = "ops_paged_attention";
    paged_shape sh = {q->shape[0], q->shape[1], k_cache->shape[2], q->shape[2], tensor_numel(cu_q) - 1,
                      k_cache->shape[1], block_tables->shape[1], scale};
    size_t shared_bytes = paged_shared_bytes(sh.dim);
    if (shared_bytes > 48 * 1024)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: head_dim %lld needs %zu bytes of shared memory; at most 48 KiB",
                         op, (long long)sh.dim, shared_bytes);
    paged_meta meta;
    if (int rc = meta_upload(&meta, cu_q, context_lens, sh.nseq, op, err)) return rc;
    if (int rc = check_block_ids(block_tables, context_lens, meta, sh.nseq, sh.block_size, k_cache->shape[0], op, err))
        return rc;
    int64_t rows = sh.tokens * sh.hq;
    if (rows == 0 || sh.dim == 0) return SMELT_OK;
    return with_compute_type(q->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        unsigned grid = (unsigned)(rows < (1 << 20) ? rows : (1 << 20));
        paged_attention_kernel<T><<<grid, PAGED_THREADS, shared_bytes>>>(
            (T *)out->data, (const T *)q->data, (const T *)k_cache->data, (const T *)v_cache->data,
            (const int32_t *)block_tables->data, meta.cu_q(), meta.context_lens(sh.nseq), sh);
        CUDA_CHECK_LAUNCH(err, op, "paged_attention_kernel");
        return SMELT_OK;
    });
}
