/* A stand-in for CUDA's cuda_runtime.h that lets kernels/cuda/ device code compile with a
 * host C++20 compiler, so tests/emu/ can run the kernels' logic on the CPU (see
 * tests/emu/README.md). It emulates only what the kernels it is used with need: the
 * built-in indices, __syncthreads, __shfl_xor_sync and the bit casts; launches go through
 * emu_launch in cuda_emu.h, one host thread per CUDA thread. Not a CUDA runtime: memory
 * calls are plain malloc/free, and nothing here runs on a GPU. */
#ifndef SMELT_TESTS_EMU_CUDA_RUNTIME_H
#define SMELT_TESTS_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)

using std::max;
using std::min;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

/* The running thread's indices, set by emu_launch before it calls the kernel. */
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotSupported = 801,
} cudaError_t;

inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
typedef void *cudaStream_t;
inline cudaError_t cudaMallocAsync(void **p, size_t bytes, int) {
    *p = malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeAsync(void *p, int) {
    free(p);
    return cudaSuccess;
}

inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
inline unsigned __float2uint_rn(float f) { return (unsigned)nearbyintf(f); }

/* Barrier of the running block, and the exchange of one value between the lanes of a
 * warp (both in cuda_emu.cpp). */
void __syncthreads(void);
uint64_t emu_warp_exchange(uint64_t value, int src_lane);

template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    (void)mask;
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wide type");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = emu_warp_exchange(bits, (int)((threadIdx.x & 31u) ^ (unsigned)lane_mask));
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

#endif
