/* AdamW on f32 master parameters, and the squared-norm reduction behind global
 * gradient clipping.
 *
 * AdamW follows kernels/cpu/optimizer.c operation for operation: bias corrections are
 * computed on the host in double and rounded to f32, as torch computes them from Python
 * floats; the kernel is elementwise. (The device may fuse a multiply and an add into one
 * FMA where the CPU rounds twice: differences stay within an ulp or two.)
 *
 * sum_squares is deterministic: a grid whose size depends only on n accumulates x^2 in
 * double per thread, each block sums its threads in a fixed order into partial[block],
 * and one block adds the partials in order. */
#include "kernels/cuda/cuda.cuh"

#include <math.h>

struct adamw_step {
    float b1, b2, eps, scale, decay, step_size, bc2_sqrt;
};

__global__ void adamw_kernel(float *__restrict__ p, float *__restrict__ m, float *__restrict__ v,
                             const float *__restrict__ g, int64_t n, adamw_step s) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gi = g[i] * s.scale;
        float mi = s.b1 * m[i] + (1.0f - s.b1) * gi;
        float vi = s.b2 * v[i] + (1.0f - s.b2) * gi * gi;
        float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * s.decay - s.step_size * mi / denom;
    }
}

int cuda_adamw(struct tensor *params, struct tensor *m, struct tensor *v,
               const struct tensor *grads, const struct adamw_config *config,
               struct smelt_error *err) {
    int64_t n = tensor_numel(params);
    if (n == 0) return SMELT_OK;
    adamw_step s;
    s.b1 = config->beta1;
    s.b2 = config->beta2;
    s.eps = config->eps;
    s.scale = config->grad_scale;
    s.decay = 1.0f - config->lr * config->weight_decay;
    float bc1 = (float)(1.0 - pow((double)config->beta1, (double)config->step));
    s.bc2_sqrt = (float)sqrt(1.0 - pow((double)config->beta2, (double)config->step));
    s.step_size = config->lr / bc1;
    adamw_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS>>>(
        (float *)params->data, (float *)m->data, (float *)v->data, (const float *)grads->data, n, s);
    CUDA_CHECK_LAUNCH(err, "ops_adamw", "adamw_kernel");
    return SMELT_OK;
}

enum { SUMSQ_THREADS = 256, SUMSQ_MAX_BLOCKS = 1024, SUMSQ_PER_THREAD = 8 };

__global__ void sum_squares_partial_kernel(double *__restrict__ partial, const float *__restrict__ x,
                                           int64_t n) {
    double s = 0.0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double xi = x[i];
        s += xi * xi; /* exact: a 24-bit mantissa squared fits in 53 */
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_finish_kernel(double *__restrict__ out, const double *__restrict__ partial,
                                          int blocks) {
    double s = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

int cuda_sum_squares(double *out, const struct tensor *x, struct smelt_error *err) {
    const char *op = "ops_sum_squares";
    int64_t n = tensor_numel(x);
    if (n == 0) {
        *out = 0.0;
        return SMELT_OK;
    }
    int64_t want = (n + SUMSQ_THREADS * SUMSQ_PER_THREAD - 1) / (SUMSQ_THREADS * SUMSQ_PER_THREAD);
    int blocks = (int)(want < SUMSQ_MAX_BLOCKS ? want : (int64_t)SUMSQ_MAX_BLOCKS);
    cuda_scratch partial;
    if (int rc = partial.alloc((size_t)(blocks + 1) * sizeof(double), op, err)) return rc;
    double *partials = partial.as<double>(), *total = partials + blocks;
    sum_squares_partial_kernel<<<blocks, SUMSQ_THREADS>>>(partials, (const float *)x->data, n);
    CUDA_CHECK_LAUNCH(err, op, "sum_squares_partial_kernel");
    sum_squares_finish_kernel<<<1, SUMSQ_THREADS>>>(total, partials, blocks);
    CUDA_CHECK_LAUNCH(err, op, "sum_squares_finish_kernel");
    CUDA_TRY(err, op, cudaMemcpy(out, total, sizeof *out, cudaMemcpyDeviceToHost));
    return SMELT_OK;
}
