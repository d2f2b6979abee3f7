/* Private to kernels/cuda/: what every .cu file of the CUDA backend shares.
 *   - the C headers, included with C linkage;
 *   - error helpers: CUDA_TRY / CUDA_CHECK_LAUNCH turn a failed runtime call into
 *     SMELT_EBACKEND (SMELT_ENOMEM for an allocation) naming the op and the call;
 *   - storage types and their f32 load/store: float, bf16 and f16 (bit-exact ports of
 *     kernels/tensor.c's scalar conversions, so a GPU cast equals a CPU cast);
 *   - dispatch from enum dtype to a template parameter;
 *   - launch sizing, warp/block sums (fixed shuffle order: deterministic), and scratch
 *     memory from the stream-ordered allocator.
 *
 * Everything runs on the legacy default stream (stream 0): ops are ordered with each
 * other and with cudaMemcpy, and a caller that wants overlap has to wait for streams to
 * be threaded through ops.h. Kernel faults are asynchronous: they surface as
 * SMELT_EBACKEND from the next call that synchronises (a copy to the host, a data check).
 */
#ifndef SMELT_KERNELS_CUDA_COMMON_CUH
#define SMELT_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/backend.h"
}

/* ---- errors ----------------------------------------------------------------------- */

/* Fills err from a failed runtime call and clears the runtime's last-error slot, so a
 * later launch check does not report this failure again. */
inline int cuda_error(struct smelt_error *err, const char *op, const char *call, cudaError_t e) {
    (void)cudaGetLastError();
    int code = e == cudaErrorMemoryAllocation ? SMELT_ENOMEM : SMELT_EBACKEND;
    return error_set(err, code, "%s: %s failed: %s (%s)", op, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

#define CUDA_TRY(err, op, call)                                              \
    do {                                                                     \
        cudaError_t e_ = (call);                                             \
        if (e_ != cudaSuccess) return cuda_error((err), (op), #call, e_);    \
    } while (0)

/* After every <<<>>>: a bad launch configuration is reported at once; a fault inside the
 * kernel comes later (see above). */
#define CUDA_CHECK_LAUNCH(err, op, kernel)                                                  \
    do {                                                                                    \
        cudaError_t e_ = cudaGetLastError();                                                \
        if (e_ != cudaSuccess) return cuda_error((err), (op), "launching " kernel, e_);     \
    } while (0)

/* ---- storage types ---------------------------------------------------------------- */

/* bf16 and f16 are held as raw bits: the conversions below define their rounding. */
struct bf16 {
    uint16_t bits;
};
struct f16 {
    uint16_t bits;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float((uint32_t)x.bits << 16); }
__device__ __forceinline__ float to_f32(f16 x) {
    uint32_t sign = (uint32_t)(x.bits & 0x8000u) << 16;
    uint32_t exp = (x.bits >> 10) & 0x1fu;
    uint32_t mant = x.bits & 0x3ffu;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* from_f32<T>(x): round to nearest even, NaN stays NaN (payload kept as the CPU does). */
template <typename T> __device__ __forceinline__ T from_f32(float x);

template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }

template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(uint16_t)((u >> 16) | 0x0040u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(uint16_t)(u >> 16)};
}

template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
    uint32_t u = __float_as_uint(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return f16{(uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
    if (abs >= 0x477ff000u) return f16{(uint16_t)(sign | 0x7c00u)}; /* rounds to >= 65520 */
    if (abs < 0x38800000u) {
        /* subnormal half: scale so its LSB (2^-24) is 1.0 and round to nearest even */
        uint32_t m = __float2uint_rn(__uint_as_float(abs) * 0x1p24f);
        return f16{(uint16_t)(sign | m)};
    }
    uint32_t mant = abs & 0x7fffffu;
    uint32_t exp = (abs >> 23) - 112u;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return f16{(uint16_t)(sign | h)};
}

/* ---- dtype dispatch --------------------------------------------------------------- */

/* Calls f(T{}) with T the storage type of a compute dtype (f32 or bf16; ops.c has already
 * refused the others). Use as: with_compute_type(x->dtype, [&](auto tag) {
 * using T = decltype(tag); ... }). */
template <typename F> int with_compute_type(enum dtype dtype, F f) {
    if (dtype == DTYPE_BF16) return f(bf16{});
    return f(float{});
}

/* The same over every float dtype (casts). */
template <typename F> int with_float_type(enum dtype dtype, F f) {
    if (dtype == DTYPE_BF16) return f(bf16{});
    if (dtype == DTYPE_F16) return f(f16{});
    return f(float{});
}

/* ---- launches --------------------------------------------------------------------- */

enum { CUDA_THREADS = 256 };

/* Blocks for a grid-stride loop over n items: one item per thread up to a cap, beyond
 * which threads loop. Never 0, so empty launches are still valid. */
inline unsigned cuda_blocks_for(int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > (1 << 20)) blocks = 1 << 20;
    return (unsigned)blocks;
}

/* Threads for a one-block-per-row kernel over rows of `cols`: a multiple of 32 covering
 * the row when it is short, up to `max_threads`. */
inline int cuda_row_threads(int64_t cols, int max_threads) {
    int64_t t = (cols + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > max_threads) t = max_threads;
    return (int)t;
}

/* ---- reductions ------------------------------------------------------------------- */

/* Butterfly sum: every lane ends with the same value, added in the same order each run. */
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 and
 * every thread must call it. The leading barrier lets callers use it several times in a
 * row: no warp overwrites `partial` while another still reads the previous result. */
template <typename A> __device__ A block_sum(A v) {
    __shared__ A partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        A w = lane < warps ? partial[lane] : A(0);
        w = warp_sum(w);
        if (lane == 0) partial[0] = w;
    }
    __syncthreads();
    return partial[0];
}

/* Max over the block (float), same contract as block_sum. fmaxf ignores NaN, so callers
 * that must propagate NaN do it through their sums. */
__device__ inline float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? partial[lane] : -INFINITY;
        w = warp_max(w);
        if (lane == 0) partial[0] = w;
    }
    __syncthreads();
    return partial[0];
}

/* ---- scratch memory --------------------------------------------------------------- */

/* Temporary device memory from the stream-ordered pool (cudaMallocAsync on stream 0):
 * cheap to take per call, and freed in stream order when the owner goes out of scope,
 * so early error returns cannot leak it. */
struct cuda_scratch {
    void *ptr = nullptr;
    cuda_scratch() = default;
    cuda_scratch(const cuda_scratch &) = delete;
    cuda_scratch &operator=(const cuda_scratch &) = delete;
    ~cuda_scratch() {
        if (ptr) (void)cudaFreeAsync(ptr, 0);
    }
    int alloc(size_t bytes, const char *op, struct smelt_error *err) {
        CUDA_TRY(err, op, cudaMallocAsync(&ptr, bytes ? bytes : 1, 0));
        return SMELT_OK;
    }
    template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

/* ---- data checks ------------------------------------------------------------------ */

/* Finds the first i < n with ids[i] outside [lo, hi) (device ids, checked on the device;
 * only the answer crosses to the host, which waits for it). *found is false when all
 * are in range; otherwise *pos and *value name the first offender. */
int cuda_find_bad_id(const int32_t *ids, int64_t n, int64_t lo, int64_t hi, bool *found,
                     int64_t *pos, int32_t *value, const char *op, struct smelt_error *err);

#endif
