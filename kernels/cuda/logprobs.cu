/* Fused log-softmax + gather (token logprobs) and its backward, never materialising the
 * probabilities: the vocabulary row is read once forward and once backward.
 *
 * One block per row. Forward: each thread keeps an online (max, sum of exp(x - max))
 * over its strided slice of the row; the block then takes the row max and rescales and
 * sums the threads' sums (block_max, block_sum: fixed order, deterministic). As in
 * kernels/cpu/logprobs.c, exp(x - max) is taken in f32 and summed in double (150k terms
 * in f32 would lose ~1e-3), lse is written for every row, and a -inf logit (a masked
 * vocabulary entry) adds exactly 0.
 * Backward: dlogits += dlogprob * (onehot(target) - exp(logit - lse)), with the lse
 * saved by the forward. Targets are checked on the device before any output is written:
 * a target >= V is SMELT_EINVAL and leaves every output untouched. */
#include "kernels/cuda/cuda.cuh"

enum { LOGPROBS_THREADS = 512 };

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows < (1 << 20) ? rows : (1 << 20)); }

template <typename T>
__global__ void logprobs_kernel(float *__restrict__ logprobs, float *__restrict__ lse_out,
                                const T *__restrict__ logits, const int32_t *__restrict__ targets,
                                int64_t rows, int64_t vocab) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *lr = logits + row * vocab;
        float m = -INFINITY;
        double s = 0.0;
        for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
            float x = to_f32(lr[v]);
            if (x > m) {
                s = s * exp((double)m - (double)x) + 1.0; /* exp(-inf) = 0 on the first */
                m = x;
            } else if (x != -INFINITY) {
                s += (double)expf(x - m); /* a NaN logit lands here and makes the sum NaN */
            }
        }
        float row_max = block_max(m);
        double scaled = m == -INFINITY ? 0.0 : s * exp((double)m - (double)row_max);
        double total = block_sum(scaled);
        if (threadIdx.x == 0) {
            double lse = row_max == -INFINITY ? -INFINITY : (double)row_max + log(total);
            if (lse_out) lse_out[row] = (float)lse;
            int32_t target = targets[row];
            /* From the double lse, so the logprob is not rounded twice. */
            logprobs[row] = target >= 0 ? (float)((double)to_f32(lr[target]) - lse) : 0.0f;
        }
    }
}

template <typename T>
__global__ void logprobs_backward_kernel(T *__restrict__ dlogits, const float *__restrict__ dlogprobs,
                                         const T *__restrict__ logits, const int32_t *__restrict__ targets,
                                         const float *__restrict__ lse, int64_t rows, int64_t vocab) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int32_t target = targets[row];
        if (target < 0) continue; /* no target: no gradient */
        float d = dlogprobs[row], l = lse[row];
        const T *lr = logits + row * vocab;
        T *dr = dlogits + row * vocab;
        for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
            float p = expf(to_f32(lr[v]) - l);
            float g = d * ((v == target ? 1.0f : 0.0f) - p);
            dr[v] = from_f32<T>(to_f32(dr[v]) + g);
        }
    }
}

/* Negative targets mean "none"; only targets >= vocab are errors. */
static int check_targets(const struct tensor *targets, int64_t rows, int64_t vocab, const char *op,
                         struct smelt_error *err) {
    bool found;
    int64_t pos;
    int32_t value;
    if (int rc = cuda_find_bad_id((const int32_t *)targets->data, rows, INT32_MIN, vocab, &found, &pos,
                                  &value, op, err))
        return rc;
    if (found)
        return error_set(err, SMELT_EINVAL, "%s: target %d at row %lld is outside the vocabulary [0, %lld) "
                         "(negative targets mean \"no target\")",
                         op, value, (long long)pos, (long long)vocab);
    return SMELT_OK;
}

int cuda_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                  const struct tensor *targets, struct smelt_error *err) {
    const char *op = "ops_logprobs";
    int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    if (rows == 0) return SMELT_OK;
    if (int rc = check_targets(targets, rows, vocab, op, err)) return rc;
    return with_compute_type(logits->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        logprobs_kernel<T><<<row_blocks(rows), cuda_row_threads(vocab, LOGPROBS_THREADS)>>>(
            (float *)logprobs->data, lse ? (float *)lse->data : nullptr, (const T *)logits->data,
            (const int32_t *)targets->data, rows, vocab);
        CUDA_CHECK_LAUNCH(err, op, "logprobs_kernel");
        return SMELT_OK;
    });
}

int cuda_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                           const struct tensor *logits, const struct tensor *targets,
                           const struct tensor *lse, struct smelt_error *err) {
    const char *op = "ops_logprobs_backward";
    int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    if (rows == 0) return SMELT_OK;
    if (int rc = check_targets(targets, rows, vocab, op, err)) return rc;
    return with_compute_type(logits->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        logprobs_backward_kernel<T><<<row_blocks(rows), cuda_row_threads(vocab, LOGPROBS_THREADS)>>>(
            (T *)dlogits->data, (const float *)dlogprobs->data, (const T *)logits->data,
            (const int32_t *)targets->data, (const float *)lse->data, rows, vocab);
        CUDA_CHECK_LAUNCH(err, op, "logprobs_backward_kernel");
        return SMELT_OK;
    });
}

/* ---- argmax ---- */

/* (value, index) with the rule of kernels/cpu/logprobs.c: larger wins, a number beats
 * NaN, and ties (NaN with NaN too) go to the smaller index. */
struct argmax_pair {
    float value;
    int64_t index;
};

__device__ __forceinline__ bool argmax_better(float a, int64_t ia, float b, int64_t ib) {
    if (isnan(a) != isnan(b)) return isnan(b);
    if (a != b && !isnan(a)) return a > b;
    return ia < ib;
}

/* One block per row: each thread scans a strided slice, then the block reduces the
 * threads' pairs through shared memory in a fixed tree. */
template <typename T>
__global__ void argmax_kernel(int32_t *__restrict__ ids, const T *__restrict__ logits, int64_t rows,
                              int64_t vocab) {
    __shared__ float best_value[LOGPROBS_THREADS];
    __shared__ int64_t best_index[LOGPROBS_THREADS];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *lr = logits + row * vocab;
        float value = NAN;
        int64_t index = vocab; /* loses every tie with a real element */
        for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
            float x = to_f32(lr[v]);
            if (argmax_better(x, v, value, index)) value = x, index = v;
        }
        __syncthreads(); /* the previous row's reduction has finished reading */
        best_value[threadIdx.x] = value;
        best_index[threadIdx.x] = index;
        __syncthreads();
        for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) {
                unsigned other = threadIdx.x + half;
                if (argmax_better(best_value[other], best_index[other], best_value[threadIdx.x],
                                  best_index[threadIdx.x])) {
                    best_value[threadIdx.x] = best_value[other];
                    best_index[threadIdx.x] = best_index[other];
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) ids[row] = (int32_t)(best_index[0] < vocab ? best_index[0] : 0);
    }
}

/* blockDim must be a power of two for the tree: 32..512. */
static int argmax_threads(int64_t vocab) {
    int t = 32;
    while (t < LOGPROBS_THREADS && t < vocab) t *= 2;
    return t;
}

int cuda_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err) {
    const char *op = "ops_argmax";
    int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    if (rows == 0) return SMELT_OK;
    return with_compute_type(logits->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        argmax_kernel<T><<<row_blocks(rows), argmax_threads(vocab)>>>((int32_t *)ids->data,
                                                                     (const T *)logits->data, rows, vocab);
        CUDA_CHECK_LAUNCH(err, op, "argmax_kernel");
        return SMELT_OK;
    });
}
