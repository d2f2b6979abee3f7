/* add, swiglu, gelu: forward against float64 references, backward against float64
 * finite differences, and the errors bad calls get. */
#include "tests/unit/testutil.h"

static const int64_t sizes[] = {1, 7, 33, 1000};

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* L = sum(w * f(a, b)) for the op under test. */
struct elem_ctx {
    double *a, *b, *w;
    int64_t n;
    int which; /* 0 add, 1 swiglu, 2 gelu */
};

static double elem_ref(const struct elem_ctx *c, int64_t i) {
    switch (c->which) {
    case 0: return c->a[i] + c->b[i];
    case 1: return ref_silu(c->a[i]) * c->b[i];
    default: return ref_gelu(c->a[i]);
    }
}

static double elem_loss(void *p) {
    struct elem_ctx *c = p;
    double s = 0;
    for (int64_t i = 0; i < c->n; i++) s += c->w[i] * elem_ref(c, i);
    return s;
}

static void run_elementwise(int which) {
    struct test_rng rng = {42 + (uint64_t)which};
    struct smelt_error err;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int64_t n = sizes[si];
        int64_t shape[2] = {1, n};
        float *a = test_rand_f32(&rng, n, -4, 4), *b = test_rand_f32(&rng, n, -2, 2);
        float *w = test_rand_f32(&rng, n, -1, 1), *out = test_zeros_f32(n);
        float *da = test_zeros_f32(n), *db = test_zeros_f32(n);
        struct tensor ta = tensor_f32(a, 2, shape), tb = tensor_f32(b, 2, shape);
        struct tensor tw = tensor_f32(w, 2, shape), to = tensor_f32(out, 2, shape);
        struct tensor tda = tensor_f32(da, 2, shape), tdb = tensor_f32(db, 2, shape);
        struct elem_ctx c = {test_to_f64(a, n), test_to_f64(b, n), test_to_f64(w, n), n, which};
        double *want = malloc((size_t)n * sizeof *want);
        for (int64_t i = 0; i < n; i++) want[i] = elem_ref(&c, i);

        if (which == 0) TEST_OK(ops_add(&to, &ta, &tb, &err), &err);
        if (which == 1) TEST_OK(ops_swiglu(&to, &ta, &tb, &err), &err);
        if (which == 2) TEST_OK(ops_gelu(&to, &ta, &err), &err);
        test_expect_close("forward", out, want, n, 1e-5, 1e-6);

        if (which == 0) TEST_OK(ops_add_backward(&tda, &tdb, &tw, &err), &err);
        if (which == 1) TEST_OK(ops_swiglu_backward(&tda, &tdb, &tw, &ta, &tb, &err), &err);
        if (which == 2) TEST_OK(ops_gelu_backward(&tda, &tw, &ta, &err), &err);
        double *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
        test_fd_gradient(elem_loss, &c, c.a, n, 1e-6, ga);
        test_fd_gradient(elem_loss, &c, c.b, n, 1e-6, gb);
        test_expect_close("grad a", da, ga, n, 1e-4, 1e-5);
        if (which != 2) test_expect_close("grad b", db, gb, n, 1e-4, 1e-5);

        /* Accumulation: a second backward doubles the gradient. */
        if (which == 1) {
            TEST_OK(ops_swiglu_backward(&tda, NULL, &tw, &ta, &tb, &err), &err);
            for (int64_t i = 0; i < n; i++) ga[i] *= 2;
            test_expect_close("accumulated grad a", da, ga, n, 1e-4, 1e-5);
        }
        free(a), free(b), free(w), free(out), free(da), free(db);
        free(c.a), free(c.b), free(c.w), free(want), free(ga), free(gb);
    }
}

Test(elementwise, add) { run_elementwise(0); }
Test(elementwise, swiglu) { run_elementwise(1); }
Test(elementwise, gelu) { run_elementwise(2); }

Test(elementwise, gelu_in_place) {
    float x[5] = {-3, -0.5f, 0, 0.5f, 3};
    double want[5];
    for (int i = 0; i < 5; i++) want[i] = ref_gelu(x[i]);
    int64_t shape[1] = {5};
    struct tensor t = tensor_f32(x, 1, shape);
    struct smelt_error err;
    TEST_OK(ops_gelu(&t, &t, &err), &err);
    test_expect_close("in place", x, want, 5, 1e-6, 1e-7);
}

Test(elementwise, errors) {
    float a[6] = {0}, b[6] = {0};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    struct tensor ta = tensor_f32(a, 2, s23), tb = tensor_f32(b, 2, s32);
    struct smelt_error err;
    TEST_EXPECT_ERROR(ops_add(&ta, &ta, &tb, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "[3, 2]") != NULL, "message names the shape: %s", err.message);
    struct tensor bf = tensor_make(BACKEND_CPU, DTYPE_BF16, a, 2, s23);
    TEST_EXPECT_ERROR(ops_gelu(&bf, &bf, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "bf16") != NULL, "message names the dtype: %s", err.message);
    TEST_EXPECT_ERROR(ops_swiglu(&ta, NULL, &ta, &err), SMELT_EINVAL, &err);
    struct tensor nodata = tensor_f32(NULL, 2, s23);
    TEST_EXPECT_ERROR(ops_add(&ta, &nodata, &ta, &err), SMELT_EINVAL, &err);
    struct tensor ids = tensor_i32((int32_t *)a, 2, s23);
    TEST_EXPECT_ERROR(ops_add(&ta, &ids, &ta, &err), SMELT_EUNSUPPORTED, &err);
}
