/* Fused causal attention over packed sequences, forward and backward: the launches of
 * the kernels in attention_kernels.cuh (read its opening comment for the algorithm).
 *
 * cu_seqlens is host memory (ops.h), so the host cuts every sequence into row tiles and
 * sends the tile list in one copy per call; empty sequences give no tile. A kernel is
 * picked by the smallest head-size bound DMAX in {64, 128, 256} that holds D (D above
 * 256 is SMELT_EUNSUPPORTED): it fixes the per-thread accumulators. Rows per thread R
 * is 4 (forward, dq) and 2 (dk/dv) up to D 128, halved at 256, which keeps the
 * accumulators at 64 floats a thread and the shared memory under 140 KiB.
 *
 * The backward runs three kernels: delta = rowsum(dout * out), then dq by query tiles
 * and dk/dv by key tiles, each with one writer per gradient element (no atomics). */
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda.cuh"

#include <stdlib.h>

/* ---- tiles ------------------------------------------------------------------------- */

/* The tile list on the device: every sequence cut into tiles of `rows` rows. */
struct attn_tiles {
    cuda_scratch buffer;
    int64_t count = 0;
    const attn_tile *device() const { return buffer.as<attn_tile>(); }
};

static int attn_tiles_build(attn_tiles *out, const struct tensor *cu_seqlens, int rows, const char *op,
                            struct smelt_error *err) {
    const int32_t *cu = (const int32_t *)cu_seqlens->data;
    int64_t nseq = tensor_numel(cu_seqlens) - 1, count = attn_tile_count(cu, nseq, rows);
    out->count = count;
    if (count == 0) return SMELT_OK;
    if (count > INT32_MAX)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %lld tiles exceed one grid", op, (long long)count);
    attn_tile *host = (attn_tile *)malloc((size_t)count * sizeof *host);
    if (!host)
        return error_set(err, SMELT_ENOMEM, "%s: cannot allocate the tile list (%lld tiles)", op, (long long)count);
    attn_tiles_fill(host, cu, nseq, rows);
    int rc = out->buffer.alloc((size_t)count * sizeof *host, op, err);
    if (!rc) {
        /* Synchronous: the host list is freed right after. */
        cudaError_t e = cudaMemcpy(out->buffer.ptr, host, (size_t)count * sizeof *host, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cuda_error(err, op, "cudaMemcpy(tile list)", e);
    }
    free(host);
    return rc;
}

/* ---- launch helpers --------------------------------------------------------------- */

/* Raises the kernel's dynamic shared-memory limit to the launch's (above 48 KiB needs
 * the opt-in), or refuses when the device cannot give that much. */
template <typename K>
static int attn_shared_limit(K kernel, const attn_launch &launch, const char *op, const char *name,
                             struct smelt_error *err) {
    size_t bytes = launch.shared_bytes;
    int device = 0, optin = 0;
    CUDA_TRY(err, op, cudaGetDevice(&device));
    CUDA_TRY(err, op, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)optin)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %s needs %zu bytes of shared memory; this device gives %d",
                         op, name, bytes, optin);
    CUDA_TRY(err, op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return SMELT_OK;
}

static attn_shape attn_shape_of(const struct tensor *q, const struct tensor *k, float scale) {
    return attn_shape{(int)q->shape[1], (int)k->shape[1], (int)q->shape[2], scale};
}

/* Heads go to the grid's y dimension. (Token counts fit int: cu_seqlens is i32.) */
static int attn_check_dims(const struct tensor *q, const char *op, struct smelt_error *err) {
    if (q->shape[1] > 65535)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %lld heads; the CUDA kernels take at most 65535", op,
                         (long long)q->shape[1]);
    return SMELT_OK;
}

/* ---- forward ---------------------------------------------------------------------- */

int cuda_attention(struct tensor *out, struct tensor *lse, const struct tensor *q, const struct tensor *k,
                   const struct tensor *v, const struct tensor *cu_seqlens, float scale, struct smelt_error *err) {
    const char *op = "ops_attention";
    if (q->shape[0] == 0 || q->shape[1] == 0) return SMELT_OK;
    if (int rc = attn_check_dims(q, op, err)) return rc;
    attn_shape sh = attn_shape_of(q, k, scale);
    if (sh.dim == 0) {
        /* Every score is 0: the output is empty and lse = log(keys seen). Rare enough to
         * refuse rather than special-case in the kernel. */
        return error_set(err, SMELT_EUNSUPPORTED, "%s: head_dim 0", op);
    }
    return attn_with_head_bound(sh.dim, op, err, [&](auto dmax, auto rq) -> int {
        constexpr int DMAX = decltype(dmax)::value, R = decltype(rq)::value;
        attn_tiles tiles;
        if (int rc = attn_tiles_build(&tiles, cu_seqlens, attn_tile_rows(R), op, err)) return rc;
        if (tiles.count == 0) return SMELT_OK;
        return with_compute_type(q->dtype, [&](auto tag) -> int {
            using T = decltype(tag);
            auto kernel = attention_forward_kernel<T, DMAX, R>;
            attn_launch l = attn_forward_launch(tiles.count, sh, R);
            if (int rc = attn_shared_limit(kernel, l, op, "attention_forward_kernel", err)) return rc;
            kernel<<<l.grid, l.threads, l.shared_bytes>>>((T *)out->data, lse ? (float *)lse->data : nullptr,
                                                          (const T *)q->data, (const T *)k->data,
                                                          (const T *)v->data, tiles.device(), sh);
            CUDA_CHECK_LAUNCH(err, op, "attention_forward_kernel");
            return SMELT_OK;
        });
    });
}

/* ---- backward --------------------------------------------------------------------- */

int cuda_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv, const struct tensor *dout,
                            const struct tensor *q, const struct tensor *k, const struct tensor *v,
                            const struct tensor *out, const struct tensor *lse, const struct tensor *cu_seqlens,
                            float scale, struct smelt_error *err) {
    const char *op = "ops_attention_backward";
    if (q->shape[0] == 0 || q->shape[1] == 0 || (!dq && !dk && !dv)) return SMELT_OK;
    if (int rc = attn_check_dims(q, op, err)) return rc;
    attn_shape sh = attn_shape_of(q, k, scale);
    if (sh.dim == 0) return SMELT_OK; /* empty gradients */
    int64_t rows = q->shape[0] * q->shape[1];
    return attn_with_head_bound(sh.dim, op, err, [&](auto dmax, auto rq) -> int {
        constexpr int DMAX = decltype(dmax)::value, RQ = decltype(rq)::value, RK = RQ / 2;
        return with_compute_type(q->dtype, [&](auto tag) -> int {
            using T = decltype(tag);
            cuda_scratch delta;
            if (int rc = delta.alloc((size_t)rows * sizeof(float), op, err)) return rc;
            attn_launch dl = attn_delta_launch(rows);
            attention_delta_kernel<T><<<dl.grid, dl.threads, dl.shared_bytes>>>(
                delta.as<float>(), (const T *)dout->data, (const T *)out->data, rows, sh.dim);
            CUDA_CHECK_LAUNCH(err, op, "attention_delta_kernel");

            if (dq) {
                attn_tiles tiles;
                if (int rc = attn_tiles_build(&tiles, cu_seqlens, attn_tile_rows(RQ), op, err)) return rc;
                if (tiles.count > 0) {
                    auto kernel = attention_dq_kernel<T, DMAX, RQ>;
                    attn_launch l = attn_dq_launch(tiles.count, sh, RQ);
                    if (int rc = attn_shared_limit(kernel, l, op, "attention_dq_kernel", err)) return rc;
                    kernel<<<l.grid, l.threads, l.shared_bytes>>>(
                        (T *)dq->data, (const T *)dout->data, (const T *)q->data, (const T *)k->data,
                        (const T *)v->data, (const float *)lse->data, delta.as<float>(), tiles.device(), sh);
                    CUDA_CHECK_LAUNCH(err, op, "attention_dq_kernel");
                }
            }
            if (dk || dv) {
                attn_tiles tiles;
                if (int rc = attn_tiles_build(&tiles, cu_seqlens, attn_tile_rows(RK), op, err)) return rc;
                if (tiles.count > 0) {
                    auto kernel = attention_dkv_kernel<T, DMAX, RK>;
                    attn_launch l = attn_dkv_launch(tiles.count, sh, RK);
                    if (int rc = attn_shared_limit(kernel, l, op, "attention_dkv_kernel", err)) return rc;
                    kernel<<<l.grid, l.threads, l.shared_bytes>>>(
                        dk ? (T *)dk->data : nullptr, dv ? (T *)dv->data : nullptr, (const T *)dout->data,
                        (const T *)q->data, (const T *)k->data, (const T *)v->data, (const float *)lse->data,
                        delta.as<float>(), tiles.device(), sh);
                    CUDA_CHECK_LAUNCH(err, op, "attention_dkv_kernel");
                }
            }
            return SMELT_OK;
        });
    });
}
