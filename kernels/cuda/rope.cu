/* Rotary position embedding, Hugging Face "rotate_half" layout (see ops.h): the pair
 * (x[i], x[i + D/2]) of each head turns by angle a = pos * inv_freq[i].
 *
 * The angle convention is kernels/cpu/rope.c's, every step in f32 as transformers does:
 * a = (float)pos * inv_freq[i] with the caller's table (ops.h struct ops_rope_freqs), then
 * cos and sin of a evaluated in double, rounded to f32 (the correctly rounded value, which
 * every backend can hit) and multiplied by the table's scale in f32. The table is passed
 * to the kernel by value (no copy, no sync); head dims beyond it (D > 2 * ROPE_TABLE,
 * unseen in practice) are refused.
 * One thread per (token, pair) computes its cos/sin once and turns that pair in every
 * head; neighbouring threads touch neighbouring elements.
 *
 * Positions must be >= 0, as on the CPU: they are checked on the device first, which
 * costs one host wait per call. y may alias x (a thread reads its pair, then writes it). */
#include "kernels/cuda/cuda.cuh"

#include <math.h>

enum { ROPE_TABLE = 512 }; /* 2 KiB of kernel parameters */

struct rope_freqs {
    float inv_freq[ROPE_TABLE];
};

/* Forward: out = R(a) in. Backward: out += R(-a) in (R is orthogonal). */
template <typename T, bool BACKWARD>
__global__ void rope_kernel(T *out, const T *in, const int32_t *__restrict__ positions, int64_t tokens,
                            int64_t heads, int64_t dim, float scale, const rope_freqs freqs) {
    int64_t half = dim / 2, pairs = tokens * half;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += stride) {
        int64_t t = p / half, i = p % half;
        float angle = (float)positions[t] * freqs.inv_freq[i];
        double s, c;
        sincos((double)angle, &s, &c);
        float cs = (float)c * scale, sn = (float)s * scale;
        if (BACKWARD) sn = -sn;
        for (int64_t h = 0; h < heads; h++) {
            int64_t lo = (t * heads + h) * dim + i, hi = lo + half;
            float x0 = to_f32(in[lo]), x1 = to_f32(in[hi]);
            float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
            if (BACKWARD) {
                out[lo] = from_f32<T>(to_f32(out[lo]) + y0);
                out[hi] = from_f32<T>(to_f32(out[hi]) + y1);
            } else {
                out[lo] = from_f32<T>(y0);
                out[hi] = from_f32<T>(y1);
            }
        }
    }
}

template <bool BACKWARD>
static int rope_launch(struct tensor *out, const struct tensor *in, const struct tensor *positions,
                       const struct ops_rope_freqs *f, const char *op, struct smelt_error *err) {
    int64_t tokens = in->shape[0], heads = in->shape[1], dim = in->shape[2];
    if (dim / 2 > ROPE_TABLE)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: head_dim %lld is above the CUDA rope's %d", op,
                         (long long)dim, 2 * ROPE_TABLE);
    bool found;
    int64_t pos;
    int32_t value;
    if (int rc = cuda_find_bad_id((const int32_t *)positions->data, tokens, 0, (int64_t)INT32_MAX + 1,
                                  &found, &pos, &value, op, err))
        return rc;
    if (found)
        return error_set(err, SMELT_EINVAL, "%s: positions[%lld] is %d; positions must be >= 0", op,
                         (long long)pos, value);
    int64_t pairs = tokens * (dim / 2);
    if (pairs == 0 || heads == 0) return SMELT_OK;
    rope_freqs freqs = {};
    for (int64_t i = 0; i < dim / 2; i++) freqs.inv_freq[i] = f->inv_freq[i];
    return with_compute_type(in->dtype, [&](auto tag) -> int {
        using T = decltype(tag);
        rope_kernel<T, BACKWARD><<<cuda_blocks_for(pairs, CUDA_THREADS), CUDA_THREADS>>>(
            (T *)out->data, (const T *)in->data, (const int32_t *)positions->data, tokens, heads, dim,
            f->scale, freqs);
        CUDA_CHECK_LAUNCH(err, op, "rope_kernel");
        return SMELT_OK;
    });
}

int cuda_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
              const struct ops_rope_freqs *f, struct smelt_error *err) {
    return rope_launch<false>(y, x, positions, f, "ops_rope", err);
}

int cuda_rope_backward(struct tensor *dx, const struct tensor *dy, const struct tensor *positions,
                       const struct ops_rope_freqs *f, struct smelt_error *err) {
    return rope_launch<true>(dx, dy, positions, f, "ops_rope_backward", err);
}
