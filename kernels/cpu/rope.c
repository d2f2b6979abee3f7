/* Rotary position embedding in Hugging Face's rotate_half layout, and its backward.
 *
 * For head dim D and i < D/2 the pair (x[i], x[i + D/2]) turns by angle a:
 *   y[i] = x[i] cos a - x[i + D/2] sin a,   y[i + D/2] = x[i + D/2] cos a + x[i] sin a.
 * The angle is the one transformers computes, every step in f32:
 *   inv_freq[i] = 1 / theta^((float)(2i) / D),  a = (float)pos * inv_freq[i]
 * (or a scaled table from model/rope.c), and cos a, sin a multiplied by the table's
 * scale in f32 as transformers multiplies them by attention_scaling.
 * The f32 rounding is part of the model: at position 4096 one f32 ulp of the angle is
 * 4.9e-4 rad, so an angle taken in double would rotate long contexts differently from
 * the way the checkpoint was trained and is evaluated in transformers.
 *
 * pow, cos and sin are evaluated in double and rounded to f32. That gives the correctly
 * rounded f32 value (barring a double-rounding tie), which glibc's powf/cosf, torch's
 * vectorised Sleef and CUDA's accurate cosf each approximate within about an ulp; so it
 * is one target every backend can hit, and it does not depend on the libm linked. The cost is one cos/sin
 * per (token, pair), shared by all heads.
 *
 * The backward is the inverse rotation: dx += R(-a) dy, the same loop with sin negated.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>

#define ROPE_PARALLEL_MIN 32768 /* elements below which threads cost more than they save */

/* Positions come from the scheduler and datasets: checked here, where they are read. */
static int check_positions(const char *op, const int32_t *pos, int64_t n,
                           struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (pos[t] < 0)
            return error_set(err, SMELT_EINVAL, "%s: positions[%lld] is %d; positions must be >= 0",
                             op, (long long)t, pos[t]);
    return SMELT_OK;
}

/* out (=, or += when accumulate) = R(sign * angle) in, for x laid out [tokens, heads, dim].
 * out may be in when not accumulating: each pair is read before it is written. */
static void rope_rotate(float *out, const float *in, const int32_t *pos, const float *inv_freq, float scale,
                        int64_t tokens, int64_t heads, int64_t dim, float sign, bool accumulate) {
    int64_t half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * dim > ROPE_PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        float p = (float)pos[t];
        for (int64_t i = 0; i < half; i++) {
            float angle = p * inv_freq[i];
            float cs = (float)cos((double)angle) * scale, sn = sign * ((float)sin((double)angle) * scale);
            for (int64_t h = 0; h < heads; h++) {
                int64_t at = (t * heads + h) * dim + i;
                float x0 = in[at], x1 = in[at + half];
                float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
                if (accumulate) {
                    out[at] += y0;
                    out[at + half] += y1;
                } else {
                    out[at] = y0;
                    out[at + half] = y1;
                }
            }
        }
    }
}

static int rope_run(const char *op, float *out, const float *in, const struct tensor *shape_of,
                    const struct tensor *positions, const struct ops_rope_freqs *f, float sign, bool accumulate,
                    struct smelt_error *err) {
    int64_t tokens = shape_of->shape[0], heads = shape_of->shape[1], dim = shape_of->shape[2];
    int rc = check_positions(op, positions->data, tokens, err);
    if (rc) return rc;
    if (tokens * heads * dim == 0) return SMELT_OK;
    rope_rotate(out, in, positions->data, f->inv_freq, f->scale, tokens, heads, dim, sign, accumulate);
    return SMELT_OK;
}

int cpu_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
             const struct ops_rope_freqs *f, struct smelt_error *err) {
    return rope_run("ops_rope", y->data, x->data, x, positions, f, 1.0f, false, err);
}

int cpu_rope_backward(struct tensor *dx, const struct tensor *dy,
                      const struct tensor *positions, const struct ops_rope_freqs *f,
                      struct smelt_error *err) {
    return rope_run("ops_rope_backward", dx->data, dy->data, dy, positions, f, -1.0f, true, err);
}
