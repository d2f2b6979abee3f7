/* Casts between f32, bf16 and f16 with the scalar conversions of kernels/tensor.c. */
#include "kernels/cpu/cpu.h"

#include <string.h>

static float load(const void *p, enum dtype dtype, int64_t i) {
    switch (dtype) {
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store(void *p, enum dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case DTYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16(x); break;
    case DTYPE_F16: ((uint16_t *)p)[i] = f32_to_f16(x); break;
    default: ((float *)p)[i] = x; break;
    }
}

int cpu_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err) {
    (void)err;
    int64_t n = tensor_numel(in);
    if (in->dtype == out->dtype) {
        memmove(out->data, in->data, tensor_nbytes(in));
        return SMELT_OK;
    }
    /* f32 is exact for bf16 and f16 values, so every cast goes through it. */
    const void *src = in->data;
    void *dst = out->data;
    enum dtype from = in->dtype, to = out->dtype;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) store(dst, to, i, load(src, from, i));
    return SMELT_OK;
}
