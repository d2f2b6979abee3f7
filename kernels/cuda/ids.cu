/* Range checks of index tensors that live on the device (token ids, targets). The ids
 * are read where they are; only the first offending position and its value come back,
 * so the caller can refuse the call before touching any output. The host waits for the
 * answer: ops that take ids synchronise once per call. */
#include "kernels/cuda/cuda.cuh"

/* *first = min position i with ids[i] outside [lo, hi). atomicMin on a position is
 * order-independent, so the answer is the same on every run. */
__global__ void find_bad_id_kernel(const int32_t *ids, int64_t n, int64_t lo, int64_t hi,
                                   unsigned long long *first) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t id = ids[i];
        if (id < lo || id >= hi) {
            atomicMin(first, (unsigned long long)i);
            return; /* later positions of this thread are larger */
        }
    }
}

int cuda_find_bad_id(const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool *found,
                     int64_t *pos, int32_t *value, const char *op, struct smelt_error *err) {
    *found = false;
    if (n <= 0) return SMELT_OK;
    cuda_scratch first;
    if (int rc = first.alloc(sizeof(unsigned long long), op, err)) return rc;
    CUDA_TRY(err, op, cudaMemsetAsync(first.ptr, 0xff, sizeof(unsigned long long), 0));
    find_bad_id_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
        ids, n, lo, hi, first.as<unsigned long long>());
    CUDA_CHECK_LAUNCH(err, op, "find_bad_id_kernel");
    unsigned long long at = 0;
    CUDA_TRY(err, op, cudaMemcpy(&at, first.ptr, sizeof at, cudaMemcpyDeviceToHost));
    if (at == ~0ull) return SMELT_OK;
    *found = true;
    *pos = (int64_t)at;
    CUDA_TRY(err, op, cudaMemcpy(value, ids + at, sizeof *value, cudaMemcpyDeviceToHost));
    return SMELT_OK;
}
