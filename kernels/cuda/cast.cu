/* Casts between f32, bf16 and f16. Every value goes through f32 (exact for bf16 and
 * f16) with the conversions of common.cuh, which reproduce kernels/tensor.c bit for bit:
 * a cast on the GPU gives the same bits as the same cast on the CPU. */
#include "kernels/cuda/cuda.cuh"

template <typename From, typename To>
__global__ void cast_kernel(To *__restrict__ out, const From *__restrict__ in, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = from_f32<To>(to_f32(in[i]));
}

int cuda_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err) {
    int64_t n = tensor_numel(in);
    if (n == 0) return SMELT_OK;
    if (in->dtype == out->dtype) {
        if (out->data == in->data) return SMELT_OK;
        CUDA_TRY(err, "ops_cast", cudaMemcpy(out->data, in->data, tensor_nbytes(in), cudaMemcpyDeviceToDevice));
        return SMELT_OK;
    }
    return with_float_type(in->dtype, [&](auto from_tag) -> int {
        using From = decltype(from_tag);
        return with_float_type(out->dtype, [&](auto to_tag) -> int {
            using To = decltype(to_tag);
            cast_kernel<From, To><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
                (To *)out->data, (const From *)in->data, n);
            CUDA_CHECK_LAUNCH(err, "ops_cast", "cast_kernel");
            return SMELT_OK;
        });
    });
}
