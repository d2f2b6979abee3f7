/* Tensors, dtypes, scalar conversions and backend selection: the parts of ops.h that
 * are not operations. */
#include "kernels/backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

size_t dtype_size(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: return 2;
    case DTYPE_F16: return 2;
    case DTYPE_I32: return 4;
    default: return 0;
    }
}

const char *dtype_name(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_F32: return "f32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_F16: return "f16";
    case DTYPE_I32: return "i32";
    default: return "invalid-dtype";
    }
}

const char *backend_name(enum backend backend) {
    switch (backend) {
    case BACKEND_CPU: return "cpu";
    case BACKEND_CUDA: return "cuda";
    default: return "invalid-backend";
    }
}

bool backend_available(enum backend backend) {
    if (backend == BACKEND_CPU) return true;
#ifdef SMELT_CUDA
    if (backend == BACKEND_CUDA) {
        static int probed = -1; /* benign race: every thread computes the same answer */
        if (probed < 0) probed = cuda_backend_probe() ? 1 : 0;
        return probed == 1;
    }
#endif
    return false;
}

int backend_from_name(const char *name, enum backend *out, struct smelt_error *err) {
    if (!name) return error_set(err, SMELT_EINVAL, "backend name is missing");
    if (strcmp(name, "auto") == 0) {
        *out = backend_available(BACKEND_CUDA) ? BACKEND_CUDA : BACKEND_CPU;
        return SMELT_OK;
    }
    for (int b = 0; b < BACKEND_COUNT; b++) {
        if (strcmp(name, backend_name((enum backend)b)) != 0) continue;
        if (!backend_available((enum backend)b))
#ifdef SMELT_CUDA
            return error_set(err, SMELT_EUNSUPPORTED, "backend '%s': no usable device found", name);
#else
            return error_set(err, SMELT_EUNSUPPORTED,
                             "backend '%s': this build has no CUDA support (rebuild with CUDA=1)", name);
#endif
        *out = (enum backend)b;
        return SMELT_OK;
    }
    return error_set(err, SMELT_EINVAL, "unknown backend '%s' (expected cpu, cuda or auto)", name);
}

/* ---- scalar conversions ---- */

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float bf16_to_f32(uint16_t bits) { return f32_from_bits((uint32_t)bits << 16); }

uint16_t f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((abs >> 13) & 0x3ffu); /* NaN */
    if (abs >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (abs < 0x38800000u) {
        /* below the smallest normal half (2^-14): subnormal or zero. Scale so that the
         * half's mantissa LSB (2^-24) is 1.0 and let the FPU round to nearest even. */
        float a = f32_from_bits(abs);
        float scaled = a * 0x1p24f;
        uint32_t m = (uint32_t)lrintf(scaled);
        return sign | (uint16_t)m; /* m == 0x400 rounds up to the smallest normal: same bits */
    }
    uint32_t mant = abs & 0x7fffffu;
    uint32_t exp = (abs >> 23) - 112u;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carries into exp correctly */
    return sign | (uint16_t)h;
}

/* ---- tensors ---- */

struct tensor tensor_make(enum backend backend, enum dtype dtype, void *data, int ndim,
                          const int64_t *shape) {
    SMELT_ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS);
    struct tensor t = {.dtype = dtype, .backend = backend, .ndim = ndim, .data = data};
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t.shape[i] = i < ndim ? shape[i] : 1;
    return t;
}

struct tensor tensor_f32(float *data, int ndim, const int64_t *shape) {
    return tensor_make(BACKEND_CPU, DTYPE_F32, data, ndim, shape);
}

struct tensor tensor_i32(int32_t *data, int ndim, const int64_t *shape) {
    return tensor_make(BACKEND_CPU, DTYPE_I32, data, ndim, shape);
}

int64_t tensor_numel(const struct tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t tensor_nbytes(const struct tensor *t) {
    return (size_t)tensor_numel(t) * dtype_size(t->dtype);
}

int64_t tensor_rows(const struct tensor *t) {
    int64_t last = t->shape[t->ndim - 1];
    return last > 0 ? tensor_numel(t) / last : 0;
}

bool tensor_same_shape(const struct tensor *a, const struct tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *tensor_shape_str(const struct tensor *t, char *buf, size_t buf_bytes) {
    size_t used = 0;
    int n = snprintf(buf, buf_bytes, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < t->ndim && used < buf_bytes; i++) {
        n = snprintf(buf + used, buf_bytes - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        if (n > 0) used += (size_t)n;
    }
    if (used < buf_bytes) snprintf(buf + used, buf_bytes - used, "]");
    return buf;
}

int backend_sync(enum backend backend, struct smelt_error *err) {
    const struct backend_ops *ops = backend_ops_get(backend);
    if (!ops)
        return error_set(err, SMELT_EUNSUPPORTED, "backend_sync: backend %s is not available",
                         backend_name(backend));
    return ops->sync ? ops->sync(err) : SMELT_OK;
}

const struct backend_ops *backend_ops_get(enum backend backend) {
    if (backend == BACKEND_CPU) return &cpu_backend_ops;
#ifdef SMELT_CUDA
    if (backend == BACKEND_CUDA && backend_available(BACKEND_CUDA)) return &cuda_backend_ops;
#endif
    return NULL;
}


static int check_tensor_form(const char *what, const struct tensor *t, struct smelt_error *err) {
    if (t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS)
        return error_set(err, SMELT_EINVAL, "%s: ndim %d outside [1, %d]", what, t->ndim, TENSOR_MAX_DIMS);
    if ((unsigned)t->dtype >= DTYPE_COUNT)
        return error_set(err, SMELT_EINVAL, "%s: invalid dtype %d", what, (int)t->dtype);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0)
            return error_set(err, SMELT_EINVAL, "%s: negative dimension %lld", what, (long long)t->shape[i]);
    if (!backend_ops_get(t->backend))
        return error_set(err, SMELT_EUNSUPPORTED, "%s: backend %s is not available", what,
                         backend_name(t->backend));
    return SMELT_OK;
}

int tensor_alloc(struct tensor *t, enum backend backend, enum dtype dtype, int ndim,
                 const int64_t *shape, struct smelt_error *err) {
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS)
        return error_set(err, SMELT_EINVAL, "tensor_alloc: ndim %d outside [1, %d]", ndim, TENSOR_MAX_DIMS);
    *t = tensor_make(backend, dtype, NULL, ndim, shape);
    int rc = check_tensor_form("tensor_alloc", t, err);
    if (rc) return rc;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > 0 && numel > INT64_MAX / 16 / shape[i])
            return error_set(err, SMELT_EINVAL, "tensor_alloc: shape too large");
        numel *= shape[i];
    }
    size_t bytes = (size_t)numel * dtype_size(dtype);
    if (bytes == 0) return SMELT_OK;
    return backend_ops_get(backend)->alloc(&t->data, bytes, err);
}

void tensor_free(struct tensor *t) {
    if (!t || !t->data) return;
    const struct backend_ops *ops = backend_ops_get(t->backend);
    if (ops) ops->free(t->data);
    t->data = NULL;
}

int tensor_zero(struct tensor *t, struct smelt_error *err) {
    int rc = check_tensor_form("tensor_zero", t, err);
    if (rc) return rc;
    size_t bytes = tensor_nbytes(t);
    if (bytes == 0) return SMELT_OK;
    if (!t->data) return error_set(err, SMELT_EINVAL, "tensor_zero: tensor has no data");
    return backend_ops_get(t->backend)->zero(t->data, bytes, err);
}

int tensor_copy(struct tensor *dst, const struct tensor *src, struct smelt_error *err) {
    int rc = check_tensor_form("tensor_copy: dst", dst, err);
    if (!rc) rc = check_tensor_form("tensor_copy: src", src, err);
    if (rc) return rc;
    if (dst->dtype != src->dtype || tensor_numel(dst) != tensor_numel(src))
        return error_set(err, SMELT_EINVAL, "tensor_copy: src is %s x %lld, dst is %s x %lld",
                         dtype_name(src->dtype), (long long)tensor_numel(src),
                         dtype_name(dst->dtype), (long long)tensor_numel(dst));
    size_t bytes = tensor_nbytes(src);
    if (bytes == 0) return SMELT_OK;
    if (!dst->data || !src->data) return error_set(err, SMELT_EINVAL, "tensor_copy: tensor has no data");
    if (dst->backend == src->backend)
        return backend_ops_get(src->backend)->copy_within(dst->data, src->data, bytes, err);
    if (dst->backend == BACKEND_CPU)
        return backend_ops_get(src->backend)->copy_to_host(dst->data, src->data, bytes, err);
    if (src->backend == BACKEND_CPU)
        return backend_ops_get(dst->backend)->copy_from_host(dst->data, src->data, bytes, err);
    return error_set(err, SMELT_EUNSUPPORTED, "tensor_copy: %s to %s", backend_name(src->backend),
                     backend_name(dst->backend));
}
