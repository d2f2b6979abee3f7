/* RMSNorm and LayerNorm over the last dim, forward and backward.
 *
 * Numerics are kernels/cpu/norm.c's, step by step: the row sums run in double (on
 * Hopper a double add costs about what the memory traffic already does), the statistic
 * is rounded to f32, eps is added in f32, rstd = 1 / sqrtf(var + eps), and
 * y = ((x - mean) * rstd) * w (+ b). LayerNorm's variance is a second pass around the
 * double mean (the row is still in L1/L2), never E[x^2] - mean^2, which cancels.
 * RMSNorm is LayerNorm without centering (mean = 0), so the two share kernels:
 *   xhat = (x - mean) * rstd, g = dy * w,
 *   dx += rstd * (g - mean(g) - xhat * mean(g * xhat))   (mean(g): LayerNorm only)
 *   dw += sum over rows of dy * xhat, db += sum over rows of dy.
 *
 * Forward and dx: one block per row (blocks loop when rows outnumber them), sums by
 * block_sum in a fixed order. dw and db: column sums (colsum.cuh), deterministic.
 * y may alias x: a thread writes only the elements it read itself, after the block's
 * sums have finished reading the row. */
#include "kernels/cuda/colsum.cuh" // defines: colsum_accumulate, colsum_value_term
#include "kernels/cuda/cuda.cuh"

enum { NORM_MAX_THREADS = 512 };

static unsigned norm_blocks(int64_t rows) { return (unsigned)(rows < (1 << 20) ? rows : (1 << 20)); }

/* CENTER: LayerNorm (b given); otherwise RMSNorm (mean 0, b null, mean_out null). */
template <typename T, bool CENTER>
__global__ void norm_kernel(T *y, float *mean_out, float *rstd_out, const T *x, const T *__restrict__ w,
                            const T *__restrict__ b, int64_t rows, int64_t cols, float eps) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = x + row * cols;
        T *yr = y + row * cols;
        double mean = 0.0;
        if (CENTER) {
            double s = 0.0;
            for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(xr[c]);
            mean = block_sum(s) / (double)cols;
        }
        double ss = 0.0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            double d = (double)to_f32(xr[c]) - mean;
            ss += d * d;
        }
        ss = block_sum(ss);
        float m = (float)mean, var = (float)(ss / (double)cols);
        float rs = 1.0f / sqrtf(var + eps);
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[row] = m;
            if (rstd_out) rstd_out[row] = rs;
        }
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = (to_f32(xr[c]) - m) * rs;
            yr[c] = from_f32<T>(CENTER ? xhat * to_f32(w[c]) + to_f32(b[c]) : xhat * to_f32(w[c]));
        }
    }
}

/* dx only (dw, db: colsum). mean is null for RMSNorm. */
template <typename T, bool CENTER>
__global__ void norm_backward_kernel(T *__restrict__ dx, const T *__restrict__ dy, const T *__restrict__ x,
                                     const T *__restrict__ w, const float *__restrict__ mean,
                                     const float *__restrict__ rstd, int64_t rows, int64_t cols) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = x + row * cols, *dyr = dy + row * cols;
        T *dxr = dx + row * cols;
        float m = CENTER ? mean[row] : 0.0f, rs = rstd[row];
        double sum_g = 0.0, sum_gxhat = 0.0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = (to_f32(xr[c]) - m) * rs, g = to_f32(dyr[c]) * to_f32(w[c]);
            if (CENTER) sum_g += g;
            sum_gxhat += (double)g * xhat;
        }
        float mean_g = CENTER ? (float)(block_sum(sum_g) / (double)cols) : 0.0f;
        float mean_gxhat = (float)(block_sum(sum_gxhat) / (double)cols);
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = (to_f32(xr[c]) - m) * rs;
            float g = rs * (to_f32(dyr[c]) * to_f32(w[c]) - mean_g - xhat * mean_gxhat);
            dxr[c] = from_f32<T>(to_f32(dxr[c]) + g);
        }
    }
}

/* dw's column-sum term: dy * xhat (mean null for RMSNorm). */
template <typename T> struct norm_dw_term {
    const T *dy, *x;
    const float *mean, *rstd;
    int64_t cols;
    __device__ double operator()(int64_t r, int64_t c) const {
        float m = mean ? mean[r] : 0.0f;
        return (double)to_f32(dy[r * cols + c]) * ((to_f32(x[r * cols + c]) - m) * rstd[r]);
    }
};

template <bool CENTER>
static int norm_forward(struct tensor *y, struct tensor *mean, struct tensor *rstd, const struct tensor *x,
                        const struct tensor *w, const struct tensor *b, float eps, const char *op,
                        struct smelt_error *err) {
    int64_t cols = x->shape[x->ndim - 1], rows = tensor_rows(x);
    if (rows == 0) return SMELT_OK;
    return with_compute_type(x->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        norm_kernel<T, CENTER><<<norm_blocks(rows), cuda_row_threads(cols, NORM_MAX_THREADS)>>>(
            (T *)y->data, mean ? (float *)mean->data : nullptr, rstd ? (float *)rstd->data : nullptr,
            (const T *)x->data, (const T *)w->data, b ? (const T *)b->data : nullptr, rows, cols, eps);
        CUDA_CHECK_LAUNCH(err, op, "norm_kernel");
        return SMELT_OK;
    });
}

template <bool CENTER>
static int norm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w, const struct tensor *mean,
                         const struct tensor *rstd, const char *op, struct smelt_error *err) {
    int64_t cols = x->shape[x->ndim - 1], rows = tensor_rows(x);
    if (rows == 0) return SMELT_OK;
    return with_compute_type(x->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        const T *dyp = (const T *)dy->data, *xp = (const T *)x->data;
        const float *mu = mean ? (const float *)mean->data : nullptr, *rs = (const float *)rstd->data;
        if (dx) {
            norm_backward_kernel<T, CENTER><<<norm_blocks(rows), cuda_row_threads(cols, NORM_MAX_THREADS)>>>(
                (T *)dx->data, dyp, xp, (const T *)w->data, mu, rs, rows, cols);
            CUDA_CHECK_LAUNCH(err, op, "norm_backward_kernel");
        }
        if (dw)
            if (int rc = colsum_accumulate((T *)dw->data, rows, cols, norm_dw_term<T>{dyp, xp, mu, rs, cols}, op, err))
                return rc;
        if (db) return colsum_accumulate((T *)db->data, rows, cols, colsum_value_term<T>{dyp, cols}, op, err);
        return SMELT_OK;
    });
}

int cuda_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                 const struct tensor *w, float eps, struct smelt_error *err) {
    return norm_forward<false>(y, nullptr, rstd, x, w, nullptr, eps, "ops_rmsnorm", err);
}

int cuda_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                          const struct tensor *x, const struct tensor *w,
                          const struct tensor *rstd, struct smelt_error *err) {
    return norm_backward<false>(dx, dw, nullptr, dy, x, w, nullptr, rstd, "ops_rmsnorm_backward", err);
}

int cuda_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                   const struct tensor *x, const struct tensor *w, const struct tensor *b,
                   float eps, struct smelt_error *err) {
    return norm_forward<true>(y, mean, rstd, x, w, b, eps, "ops_layernorm", err);
}

int cuda_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                            const struct tensor *dy, const struct tensor *x,
                            const struct tensor *w, const struct tensor *mean,
                            const struct tensor *rstd, struct smelt_error *err) {
    return norm_backward<true>(dx, dw, db, dy, x, w, mean, rstd, "ops_layernorm_backward", err);
}
