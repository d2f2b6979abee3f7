/* Private to kernels/cuda/: deterministic column sums, dst[c] += sum over rows r of
 * term(r, c). Parameter gradients are such sums (matmul dbias, norm dw and db), and
 * atomics would add rows in a different order each run. Two passes instead:
 *   1. the rows are cut into chunks fixed by the shape alone; each block sums a 32-column
 *      tile of one chunk (8 row lanes, then the lanes in order) into partial[chunk][c];
 *   2. one thread per column adds its chunks' partials in chunk order, then adds the
 *      total to dst with a single rounding to dst's dtype.
 * Sums run in double, as the CPU backend's do: thousands of rows summed in f32 would
 * drift by that many ulps; a double sum rounded once is the correctly rounded f32.
 * Reads are coalesced: a warp covers 32 consecutive columns of one row. */
#ifndef SMELT_KERNELS_CUDA_COLSUM_CUH
#define SMELT_KERNELS_CUDA_COLSUM_CUH

#include "kernels/cuda/common.cuh"

enum { COLSUM_TILE = 32, COLSUM_LANES = 8, COLSUM_MAX_CHUNKS = 1024, COLSUM_MIN_ROWS = 256 };

template <typename Term>
__global__ void colsum_partial_kernel(double *__restrict__ partial, int64_t rows, int64_t cols,
                                      int64_t rows_per_chunk, Term term) {
    __shared__ double lanes[COLSUM_LANES][COLSUM_TILE + 1];
    int64_t c = (int64_t)blockIdx.x * COLSUM_TILE + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    double s = 0.0;
    if (c < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += COLSUM_LANES) s += term(r, c);
    lanes[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        double total = 0.0;
        for (int l = 0; l < COLSUM_LANES; l++) total += lanes[l][threadIdx.x];
        partial[(int64_t)blockIdx.y * cols + c] = total;
    }
}

template <typename T>
__global__ void colsum_finish_kernel(T *dst, const double *__restrict__ partial, int64_t chunks,
                                     int64_t cols) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double total = 0.0;
    for (int64_t k = 0; k < chunks; k++) total += partial[k * cols + c];
    dst[c] = from_f32<T>(to_f32(dst[c]) + (float)total);
}

/* The plain sum: term(r, c) = v[r][c] (matmul dbias, layernorm db). */
template <typename T> struct colsum_value_term {
    const T *v;
    int64_t cols;
    __device__ double operator()(int64_t r, int64_t c) const { return to_f32(v[r * cols + c]); }
};

/* dst (T [cols], device) += column sums of term over rows x cols. term is a device
 * functor: double operator()(int64_t row, int64_t col) const. */
template <typename T, typename Term>
int colsum_accumulate(T *dst, int64_t rows, int64_t cols, Term term, const char *op,
                      struct smelt_error *err) {
    if (cols == 0 || rows == 0) return SMELT_OK;
    int64_t rows_per_chunk = (rows + COLSUM_MAX_CHUNKS - 1) / COLSUM_MAX_CHUNKS;
    if (rows_per_chunk < COLSUM_MIN_ROWS) rows_per_chunk = COLSUM_MIN_ROWS;
    int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    cuda_scratch partial;
    if (int rc = partial.alloc((size_t)(chunks * cols) * sizeof(double), op, err)) return rc;
    int64_t tiles = (cols + COLSUM_TILE - 1) / COLSUM_TILE;
    if (tiles > INT32_MAX)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %lld columns is too many", op, (long long)cols);
    dim3 grid((unsigned)tiles, (unsigned)chunks), block(COLSUM_TILE, COLSUM_LANES);
    colsum_partial_kernel<Term><<<grid, block>>>(partial.as<double>(), rows, cols, rows_per_chunk, term);
    CUDA_CHECK_LAUNCH(err, op, "colsum_partial_kernel");
    colsum_finish_kernel<T><<<(unsigned)((cols + CUDA_THREADS - 1) / CUDA_THREADS), CUDA_THREADS>>>(
        dst, partial.as<double>(), chunks, cols);
    CUDA_CHECK_LAUNCH(err, op, "colsum_finish_kernel");
    return SMELT_OK;
}

#endif
