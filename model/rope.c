/* The rotary table of a model: inv_freq for each channel pair and the factor cos/sin are
 * multiplied by, for each rope_type smelt implements, computed the way transformers'
 * modeling_rope_utils does (the _compute_*_parameters functions): the same operations in
 * the same order, f32 wherever transformers holds a float32 tensor, double wherever it
 * holds a Python float. Python scalars meet f32 tensors as torch does: the scalar is
 * rounded to f32 and the operation runs in f32; `scalar / tensor` is torch's
 * `tensor.reciprocal() * scalar`. */
#include "model/transformer.h"

#include <math.h>

static float f32_pow(double base, float exponent) {
    return (float)pow((double)(float)base, (double)exponent);
}

/* linear: the unscaled table divided by factor. */
static void rope_linear(const struct model_rope_scaling *s, float *inv_freq, int64_t half) {
    for (int64_t i = 0; i < half; i++) inv_freq[i] = inv_freq[i] / (float)s->factor;
}

/* llama3: low frequencies (wavelength above original / low_freq_factor) divided by factor,
 * high ones (below original / high_freq_factor) kept, the band between blended. */
static void rope_llama3(const struct model_rope_scaling *s, float *inv_freq, int64_t half) {
    double old_len = (double)s->original_max_position_embeddings;
    /* compared with an f32 tensor: rounded to f32 first, as torch promotes */
    float low_wavelen = (float)(old_len / s->low_freq_factor), high_wavelen = (float)(old_len / s->high_freq_factor);
    float factor = (float)s->factor, two_pi = (float)(2.0 * M_PI);
    float lf = (float)s->low_freq_factor, span = (float)(s->high_freq_factor - s->low_freq_factor);
    for (int64_t i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = (1.0f / f) * two_pi;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        float smooth = ((1.0f / wavelen) * (float)old_len - lf) / span;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos) {
    return ((double)dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

/* yarn: per pair, a ramp between the interpolated (divided by factor) and the original
 * frequency over the correction range of beta_fast..beta_slow rotations. */
static float rope_yarn(const struct model_config *c, float *inv_freq, int64_t dim) {
    const struct model_rope_scaling *s = &c->rope_scaling;
    double factor = s->factor, attention = s->attention_factor;
    if (attention <= 0)
        attention = s->mscale != 0 && s->mscale_all_dim != 0
                        ? yarn_mscale(factor, s->mscale) / yarn_mscale(factor, s->mscale_all_dim)
                        : yarn_mscale(factor, 1.0);
    double max_pos = (double)s->original_max_position_embeddings;
    double low = yarn_correction_dim(s->beta_fast, dim, c->rope_theta, max_pos);
    double high = yarn_correction_dim(s->beta_slow, dim, c->rope_theta, max_pos);
    if (s->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = fmax(low, 0.0);
    high = fmin(high, (double)(dim - 1));
    if (low == high) high += 0.001;
    float lo32 = (float)low, width = (float)(high - low), factor32 = (float)factor;
    for (int64_t i = 0; i < dim / 2; i++) {
        float pos_freq = f32_pow(c->rope_theta, (float)(2 * i) / (float)dim);
        float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (factor32 * pos_freq);
        float ramp = ((float)i - lo32) / width;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* inv_freq_extrapolation_factor */
        inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
    }
    return (float)attention;
}

int model_rope_table(const struct model_config *c, float *inv_freq, float *scale, struct smelt_error *err) {
    int64_t dim = c->head_dim;
    if (c->positions != MODEL_POS_ROPE || dim < 2 || dim % 2 != 0 || !(c->rope_theta > 0))
        return error_set(err, SMELT_EINVAL, "model_rope_table: not a rope model (head_dim %lld, rope_theta %g)",
                         (long long)dim, c->rope_theta);
    *scale = 1.0f;
    ops_rope_default_freqs(inv_freq, dim, (float)c->rope_theta);
    switch (c->rope_scaling.type) {
    case MODEL_ROPE_DEFAULT: break;
    case MODEL_ROPE_LINEAR: rope_linear(&c->rope_scaling, inv_freq, dim / 2); break;
    case MODEL_ROPE_LLAMA3: rope_llama3(&c->rope_scaling, inv_freq, dim / 2); break;
    case MODEL_ROPE_YARN: *scale = rope_yarn(c, inv_freq, dim); break;
    default: return error_set(err, SMELT_EINVAL, "model_rope_table: unknown rope type %d", (int)c->rope_scaling.type);
    }
    return SMELT_OK;
}
