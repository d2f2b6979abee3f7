/* Elementwise ops: residual add, gradient accumulation, SwiGLU, GELU (tanh). */
#include "kernels/cpu/cpu.h"

#include <math.h>

int cpu_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
            struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(out);
    float *o = out->data;
    const float *x = a->data, *y = b->data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    return SMELT_OK;
}

int cpu_accumulate(struct tensor *dst, const struct tensor *src, struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(dst);
    float *d = dst->data;
    const float *s = src->data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
    return SMELT_OK;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

int cpu_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
               struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(out);
    float *o = out->data;
    const float *g = gate->data, *u = up->data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) o[i] = g[i] * sigmoidf(g[i]) * u[i];
    return SMELT_OK;
}

int cpu_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                        const struct tensor *gate, const struct tensor *up,
                        struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(dout);
    const float *g = gate->data, *u = up->data, *d = dout->data;
    float *dg = dgate ? dgate->data : NULL, *du = dup ? dup->data : NULL;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
        float s = sigmoidf(g[i]);
        float silu = g[i] * s;
        if (du) du[i] += d[i] * silu;
        /* d silu / dg = s + g s (1 - s) */
        if (dg) dg[i] += d[i] * u[i] * (s + g[i] * s * (1.0f - s));
    }
    return SMELT_OK;
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

int cpu_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(out);
    float *o = out->data;
    const float *in = x->data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
        float v = in[i];
        o[i] = 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v)));
    }
    return SMELT_OK;
}

int cpu_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                      struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(x);
    float *g = dx->data;
    const float *in = x->data, *d = dout->data;
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
        float v = in[i];
        float u = GELU_K * (v + GELU_C * v * v * v);
        float t = tanhf(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        g[i] += d[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
    return SMELT_OK;
}
