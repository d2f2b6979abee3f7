/* Tensors and backends: allocation, zeroing, copies, shape helpers, dtype and backend
 * names, backend selection by name, and the errors malformed tensors get. */
#include "tests/unit/testutil.h"

#include <string.h>

Test(tensor, dtype_and_backend_names) {
    cr_expect_eq(dtype_size(DTYPE_F32), 4);
    cr_expect_eq(dtype_size(DTYPE_BF16), 2);
    cr_expect_eq(dtype_size(DTYPE_F16), 2);
    cr_expect_eq(dtype_size(DTYPE_I32), 4);
    cr_expect_eq(dtype_size(DTYPE_COUNT), 0);
    cr_expect_str_eq(dtype_name(DTYPE_F32), "f32");
    cr_expect_str_eq(dtype_name(DTYPE_BF16), "bf16");
    cr_expect_str_eq(dtype_name(DTYPE_F16), "f16");
    cr_expect_str_eq(dtype_name(DTYPE_I32), "i32");
    cr_expect_str_eq(dtype_name((enum dtype)99), "invalid-dtype");
    cr_expect_str_eq(backend_name(BACKEND_CPU), "cpu");
    cr_expect_str_eq(backend_name(BACKEND_CUDA), "cuda");
    cr_expect_str_eq(backend_name((enum backend)-1), "invalid-backend");
    cr_expect(backend_available(BACKEND_CPU));
}

Test(tensor, backend_from_name) {
    struct smelt_error err;
    enum backend b = BACKEND_COUNT;
    TEST_OK(backend_from_name("cpu", &b, &err), &err);
    cr_expect_eq(b, BACKEND_CPU);
    b = BACKEND_COUNT;
    TEST_OK(backend_from_name("auto", &b, &err), &err);
    cr_expect_eq(b, backend_available(BACKEND_CUDA) ? BACKEND_CUDA : BACKEND_CPU);
    if (backend_available(BACKEND_CUDA)) {
        TEST_OK(backend_from_name("cuda", &b, &err), &err);
        cr_expect_eq(b, BACKEND_CUDA);
    } else {
        b = BACKEND_CPU;
        TEST_EXPECT_ERROR(backend_from_name("cuda", &b, &err), SMELT_EUNSUPPORTED, &err);
        cr_expect(strstr(err.message, "cuda") != NULL, "message: %s", err.message);
        cr_expect_eq(b, BACKEND_CPU, "out written on failure");
    }
    TEST_EXPECT_ERROR(backend_from_name("tpu", &b, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'tpu'") != NULL, "message names the backend: %s", err.message);
    TEST_EXPECT_ERROR(backend_from_name("", &b, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(backend_from_name("cpu ", &b, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(backend_from_name(NULL, &b, &err), SMELT_EINVAL, &err);
}

Test(tensor, make_and_shape_helpers) {
    int64_t s2[2] = {4, 7}, s3[3] = {2, 3, 5}, s1[1] = {9};
    struct tensor a = tensor_f32(NULL, 2, s2), b = tensor_make(BACKEND_CPU, DTYPE_BF16, NULL, 3, s3);
    struct tensor c = tensor_i32(NULL, 1, s1);
    cr_expect(a.dtype == DTYPE_F32 && a.backend == BACKEND_CPU && a.ndim == 2);
    cr_expect(a.shape[2] == 1 && a.shape[3] == 1, "unused dims are 1");
    cr_expect(c.dtype == DTYPE_I32);
    cr_expect_eq(tensor_numel(&a), 28);
    cr_expect_eq(tensor_numel(&b), 30);
    cr_expect_eq(tensor_nbytes(&a), 112);
    cr_expect_eq(tensor_nbytes(&b), 60);
    cr_expect_eq(tensor_rows(&a), 4);
    cr_expect_eq(tensor_rows(&b), 6);
    cr_expect_eq(tensor_rows(&c), 1);
    int64_t z0[2] = {0, 7}, z1[2] = {3, 0};
    struct tensor e0 = tensor_f32(NULL, 2, z0), e1 = tensor_f32(NULL, 2, z1);
    cr_expect_eq(tensor_rows(&e0), 0);
    cr_expect_eq(tensor_rows(&e1), 0);
    cr_expect_eq(tensor_numel(&e1), 0);

    int64_t s2t[2] = {7, 4}, s2x[3] = {4, 7, 1};
    struct tensor at = tensor_f32(NULL, 2, s2t), ax = tensor_f32(NULL, 3, s2x);
    cr_expect(tensor_same_shape(&a, &a));
    cr_expect(!tensor_same_shape(&a, &at));
    cr_expect(!tensor_same_shape(&a, &ax), "a trailing 1 is still another ndim");

    char buf[64];
    cr_expect_str_eq(tensor_shape_str(&a, buf, sizeof buf), "[4, 7]");
    cr_expect_str_eq(tensor_shape_str(&c, buf, sizeof buf), "[9]");
    int64_t s4[4] = {2, 3, 4, 123456789012LL};
    struct tensor d = tensor_f32(NULL, 4, s4);
    cr_expect_str_eq(tensor_shape_str(&d, buf, sizeof buf), "[2, 3, 4, 123456789012]");
}

/* A buffer too small for the shape: truncated, NUL-terminated, nothing written past it. */
Test(tensor, shape_str_truncates) {
    int64_t s4[4] = {1000, 2000, 3000, 4000};
    struct tensor d = tensor_f32(NULL, 4, s4);
    for (size_t size = 1; size <= 26; size++) {
        char buf[32];
        memset(buf, 'x', sizeof buf);
        const char *s = tensor_shape_str(&d, buf, size);
        cr_expect(s == buf);
        cr_expect(memchr(buf, '\0', size) != NULL, "size %zu: not NUL-terminated", size);
        for (size_t i = size; i < sizeof buf; i++) cr_expect(buf[i] == 'x', "size %zu: wrote byte %zu", size, i);
        cr_expect(strncmp(buf, "[1000, 2000, 3000, 4000]", strlen(buf)) == 0, "size %zu: '%s'", size, buf);
    }
}

Test(tensor, alloc_zero_copy_free) {
    struct smelt_error err;
    int64_t shape[2] = {3, 5};
    struct tensor a, b;
    TEST_OK(tensor_alloc(&a, BACKEND_CPU, DTYPE_F32, 2, shape, &err), &err);
    cr_assert(a.data != NULL);
    cr_expect(((uintptr_t)a.data & 63) == 0, "CPU memory is 64-byte aligned");
    cr_expect(a.dtype == DTYPE_F32 && a.ndim == 2 && a.shape[0] == 3 && a.shape[1] == 5 && a.shape[2] == 1);
    float *x = a.data;
    for (int i = 0; i < 15; i++) cr_expect(x[i] == 0.0f, "tensor_alloc memory is zeroed");
    for (int i = 0; i < 15; i++) x[i] = (float)i + 0.5f;

    int64_t flat[1] = {15};
    TEST_OK(tensor_alloc(&b, BACKEND_CPU, DTYPE_F32, 1, flat, &err), &err);
    TEST_OK(tensor_copy(&b, &a, &err), &err); /* same numel, another shape */
    cr_expect(memcmp(a.data, b.data, 15 * sizeof(float)) == 0, "copy differs");

    TEST_OK(tensor_zero(&a, &err), &err);
    for (int i = 0; i < 15; i++) cr_expect(x[i] == 0.0f, "tensor_zero left %g at %d", x[i], i);
    cr_expect(((float *)b.data)[14] == 14.5f, "zeroing a touched its copy");

    tensor_free(&a);
    cr_expect(a.data == NULL, "tensor_free sets data to NULL");
    tensor_free(&a); /* twice: harmless */
    tensor_free(&b);
    tensor_free(NULL);
}

Test(tensor, alloc_every_dtype_and_empty) {
    struct smelt_error err;
    for (int d = 0; d < DTYPE_COUNT; d++) {
        int64_t shape[4] = {2, 1, 3, 5};
        struct tensor t;
        TEST_OK(tensor_alloc(&t, BACKEND_CPU, (enum dtype)d, 4, shape, &err), &err);
        cr_expect_eq(tensor_nbytes(&t), 30 * dtype_size((enum dtype)d));
        const unsigned char *p = t.data;
        for (size_t i = 0; i < tensor_nbytes(&t); i++) cr_expect(p[i] == 0, "%s byte %zu not zero", dtype_name(d), i);
        tensor_free(&t);
    }
    /* Zero elements: no memory, and zero/copy are no-ops. */
    int64_t empty[2] = {0, 4};
    struct tensor e, f;
    TEST_OK(tensor_alloc(&e, BACKEND_CPU, DTYPE_F32, 2, empty, &err), &err);
    cr_expect(e.data == NULL && tensor_numel(&e) == 0);
    TEST_OK(tensor_alloc(&f, BACKEND_CPU, DTYPE_F32, 2, empty, &err), &err);
    TEST_OK(tensor_zero(&e, &err), &err);
    TEST_OK(tensor_copy(&f, &e, &err), &err);
    tensor_free(&e);
    tensor_free(&f);
}

Test(tensor, alloc_errors) {
    struct smelt_error err;
    struct tensor t;
    int64_t shape[5] = {2, 3, 4, 5, 6};
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_F32, 0, shape, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "ndim 0") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_F32, 5, shape, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_F32, -1, shape, &err), SMELT_EINVAL, &err);
    int64_t negative[2] = {3, -2};
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_F32, 2, negative, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "-2") != NULL, "message names the dimension: %s", err.message);
    cr_expect(t.data == NULL, "failed alloc leaves data NULL");
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_COUNT, 2, shape, &err), SMELT_EINVAL, &err);
    int64_t huge[3] = {1LL << 40, 1LL << 40, 16};
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CPU, DTYPE_F32, 3, huge, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "too large") != NULL, "message: %s", err.message);
    if (!backend_available(BACKEND_CUDA))
        TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CUDA, DTYPE_F32, 2, shape, &err), SMELT_EUNSUPPORTED, &err);
}

Test(tensor, zero_and_copy_errors) {
    struct smelt_error err;
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0};
    int32_t ids[6] = {0};
    int64_t s6[1] = {6}, s5[1] = {5}, s23[2] = {2, 3}, neg[2] = {-2, 3};
    struct tensor ta = tensor_f32(a, 1, s6), tb = tensor_f32(b, 2, s23);
    struct tensor t5 = tensor_f32(b, 1, s5), ti = tensor_i32(ids, 1, s6);

    TEST_EXPECT_ERROR(tensor_copy(&tb, &ti, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "i32") && strstr(err.message, "f32"), "message: %s", err.message);
    TEST_EXPECT_ERROR(tensor_copy(&t5, &ta, &err), SMELT_EINVAL, &err);
    struct tensor nodata = tensor_f32(NULL, 1, s6);
    TEST_EXPECT_ERROR(tensor_copy(&nodata, &ta, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tensor_copy(&ta, &nodata, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tensor_zero(&nodata, &err), SMELT_EINVAL, &err);
    struct tensor negative = tensor_f32(a, 2, neg);
    TEST_EXPECT_ERROR(tensor_zero(&negative, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tensor_copy(&tb, &negative, &err), SMELT_EINVAL, &err);
    struct tensor bad_ndim = ta;
    bad_ndim.ndim = 0;
    TEST_EXPECT_ERROR(tensor_zero(&bad_ndim, &err), SMELT_EINVAL, &err);
    bad_ndim.ndim = 5;
    TEST_EXPECT_ERROR(tensor_copy(&tb, &bad_ndim, &err), SMELT_EINVAL, &err);
    struct tensor bad_dtype = ta;
    bad_dtype.dtype = DTYPE_COUNT;
    TEST_EXPECT_ERROR(tensor_zero(&bad_dtype, &err), SMELT_EINVAL, &err);
    if (!backend_available(BACKEND_CUDA)) {
        struct tensor cuda = tensor_make(BACKEND_CUDA, DTYPE_F32, b, 1, s6);
        TEST_EXPECT_ERROR(tensor_copy(&cuda, &ta, &err), SMELT_EUNSUPPORTED, &err);
        TEST_EXPECT_ERROR(tensor_zero(&cuda, &err), SMELT_EUNSUPPORTED, &err);
    }
    for (int i = 0; i < 6; i++) cr_expect(a[i] == (float)(i + 1) && b[i] == 0.0f, "data changed by a failed call");
}
