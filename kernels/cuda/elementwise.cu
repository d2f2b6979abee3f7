/* Elementwise ops: residual add, gradient accumulation, SwiGLU, GELU (tanh form).
 * One grid-stride loop each, math in f32 with the CPU backend's formulas (precise expf
 * and tanhf: the build does not use --use_fast_math). Outputs may alias inputs: each
 * element is read and written by the same thread, so no __restrict__ here. */
#include "kernels/cuda/cuda.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

#define GRID_STRIDE(i, n)                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);          \
         i += (int64_t)gridDim.x * blockDim.x)

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T> __global__ void accumulate_kernel(T *dst, const T *src, int64_t n) {
    GRID_STRIDE(i, n) dst[i] = from_f32<T>(to_f32(dst[i]) + to_f32(src[i]));
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_kernel(T *out, const T *gate, const T *up, int64_t n) {
    GRID_STRIDE(i, n) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g * sigmoid(g) * to_f32(up[i]));
    }
}

/* dgate or dup may be null (a frozen branch). */
template <typename T>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate,
                                       const T *up, int64_t n) {
    GRID_STRIDE(i, n) {
        float g = to_f32(gate[i]), d = to_f32(dout[i]);
        float s = sigmoid(g);
        if (dup) dup[i] = from_f32<T>(to_f32(dup[i]) + d * g * s);
        /* d silu / dg = s + g s (1 - s) */
        if (dgate) dgate[i] = from_f32<T>(to_f32(dgate[i]) + d * to_f32(up[i]) * (s + g * s * (1.0f - s)));
    }
}

template <typename T> __global__ void gelu_kernel(T *out, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        float v = to_f32(x[i]);
        out[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v))));
    }
}

template <typename T>
__global__ void gelu_backward_kernel(T *dx, const T *dout, const T *x, int64_t n) {
    GRID_STRIDE(i, n) {
        float v = to_f32(x[i]);
        float t = tanhf(GELU_K * (v + GELU_C * v * v * v));
        float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        float g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
        dx[i] = from_f32<T>(to_f32(dx[i]) + to_f32(dout[i]) * g);
    }
}

int cuda_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
             struct smelt_error *err) {
    int64_t n = tensor_numel(out);
    if (n == 0) return SMELT_OK;
    return with_compute_type(out->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        add_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)out->data, (const T *)a->data, (const T *)b->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_add", "add_kernel");
        return SMELT_OK;
    });
}

int cuda_accumulate(struct tensor *dst, const struct tensor *src, struct smelt_error *err) {
    int64_t n = tensor_numel(dst);
    if (n == 0) return SMELT_OK;
    return with_compute_type(dst->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        accumulate_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)dst->data, (const T *)src->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_add_backward", "accumulate_kernel");
        return SMELT_OK;
    });
}

int cuda_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
                struct smelt_error *err) {
    int64_t n = tensor_numel(out);
    if (n == 0) return SMELT_OK;
    return with_compute_type(out->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        swiglu_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)out->data, (const T *)gate->data, (const T *)up->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_swiglu", "swiglu_kernel");
        return SMELT_OK;
    });
}

int cuda_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                         const struct tensor *gate, const struct tensor *up,
                         struct smelt_error *err) {
    int64_t n = tensor_numel(dout);
    if (n == 0 || (!dgate && !dup)) return SMELT_OK;
    return with_compute_type(dout->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        swiglu_backward_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            dgate ? (T *)dgate->data : nullptr, dup ? (T *)dup->data : nullptr,
            (const T *)dout->data, (const T *)gate->data, (const T *)up->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_swiglu_backward", "swiglu_backward_kernel");
        return SMELT_OK;
    });
}

int cuda_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err) {
    int64_t n = tensor_numel(out);
    if (n == 0) return SMELT_OK;
    return with_compute_type(out->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        gelu_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)out->data, (const T *)x->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_gelu", "gelu_kernel");
        return SMELT_OK;
    });
}

int cuda_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                       struct smelt_error *err) {
    int64_t n = tensor_numel(x);
    if (n == 0) return SMELT_OK;
    return with_compute_type(x->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        gelu_backward_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)dx->data, (const T *)dout->data, (const T *)x->data, n);
        CUDA_CHECK_LAUNCH(err, "ops_gelu_backward", "gelu_backward_kernel");
        return SMELT_OK;
    });
}
