/* AdamW and the squared-norm reduction used for global gradient clipping. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

int cpu_adamw(struct tensor *params, struct tensor *m, struct tensor *v,
              const struct tensor *grads, const struct adamw_config *config,
              struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(params);
    float *p = params->data, *mm = m->data, *vv = v->data;
    const float *g = grads->data;
    const float b1 = config->beta1, b2 = config->beta2, lr = config->lr, eps = config->eps;
    const float scale = config->grad_scale;
    const float decay = 1.0f - config->lr * config->weight_decay;
    /* Bias corrections in double, then rounded, as torch computes them from Python floats. */
    const float bc1 = (float)(1.0 - pow((double)b1, (double)config->step));
    const float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, (double)config->step));
    const float step_size = lr / bc1;
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * scale;
        mm[i] = b1 * mm[i] + (1.0f - b1) * gi;
        vv[i] = b2 * vv[i] + (1.0f - b2) * gi * gi;
        float denom = sqrtf(vv[i]) / bc2_sqrt + eps;
        p[i] = p[i] * decay - step_size * mm[i] / denom;
    }
    return SMELT_OK;
}

int cpu_sum_squares(double *out, const struct tensor *x, struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(x);
    const float *d = x->data;
    /* Fixed chunks summed in order: the result does not depend on the thread count. */
    enum { CHUNK = 4096 };
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
    double total = 0.0;
    if (chunks <= 1) {
        for (int64_t i = 0; i < n; i++) total += (double)d[i] * d[i];
        *out = total;
        return SMELT_OK;
    }
    double *partial = malloc((size_t)chunks * sizeof *partial);
    if (!partial) return error_set(err, SMELT_ENOMEM, "ops_sum_squares: out of memory");
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * CHUNK, i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        double s = 0.0;
        for (int64_t i = i0; i < i1; i++) s += (double)d[i] * d[i];
        partial[c] = s;
    }
    for (int64_t c = 0; c < chunks; c++) total += partial[c];
    free(partial);
    *out = total;
    return SMELT_OK;
}
