/* Token logprobs (fused log-softmax + gather): forward against a float64 log-softmax,
 * backward against float64 finite differences (small vocabularies) or the float64
 * closed form (real vocabularies), ignored targets, accumulation, thread-count
 * independence and the errors bad calls get. */
#include "tests/unit/testutil.h"

#include <omp.h>
#include <string.h>

/* L = sum_t w[t] * logprob[t], with logprob 0 for negative targets. */
struct lp_ctx {
    double *x, *w;
    const int32_t *targets;
    int64_t rows, vocab;
};

static double ref_lse(const double *x, int64_t n) {
    double m = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < n; v++) m = x[v] > m ? x[v] : m;
    for (int64_t v = 0; v < n; v++) s += exp(x[v] - m);
    return m + log(s);
}

static double lp_loss(void *p) {
    struct lp_ctx *c = p;
    double total = 0.0;
    for (int64_t t = 0; t < c->rows; t++) {
        if (c->targets[t] < 0) continue;
        const double *row = c->x + t * c->vocab;
        total += c->w[t] * (row[c->targets[t]] - ref_lse(row, c->vocab));
    }
    return total;
}

/* dL/dx in closed form: w[t] * (1[v == target] - softmax[v]). */
static void ref_grad(const struct lp_ctx *c, double *grad) {
    for (int64_t t = 0; t < c->rows; t++) {
        const double *row = c->x + t * c->vocab;
        double l = ref_lse(row, c->vocab);
        for (int64_t v = 0; v < c->vocab; v++) {
            double g = 0.0;
            if (c->targets[t] >= 0) g = c->w[t] * ((v == c->targets[t]) - exp(row[v] - l));
            grad[t * c->vocab + v] = g;
        }
    }
}

/* Random targets in [0, V), with every fifth row ignored (-1 or -100, HF's ignore_index). */
static int32_t *rand_targets(struct test_rng *rng, int64_t rows, int64_t vocab) {
    int32_t *t = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *t);
    cr_assert(t);
    for (int64_t i = 0; i < rows; i++) {
        t[i] = (int32_t)(test_rng_next(rng) % (uint64_t)vocab);
        if (i % 5 == 3) t[i] = (i % 2) ? -1 : -100;
    }
    return t;
}

struct lp_case {
    int64_t rows, vocab;
    double lo, hi;   /* logits uniform in [lo, hi) */
    bool fd;         /* finite differences (else closed form) for the backward */
    double grad_rtol, grad_atol;
};

static void run_case(const struct lp_case *k, uint64_t seed) {
    struct test_rng rng = {seed};
    struct smelt_error err;
    const int64_t n = k->rows * k->vocab;
    int64_t shape[2] = {k->rows, k->vocab}, rshape[1] = {k->rows};
    float *x = test_rand_f32(&rng, n, k->lo, k->hi);
    float *w = test_rand_f32(&rng, k->rows, -1, 1);
    float *init = test_rand_f32(&rng, n, -1, 1); /* dlogits starts nonzero: += is checked */
    float *dx = malloc((size_t)n * sizeof *dx);
    cr_assert(dx);
    memcpy(dx, init, (size_t)n * sizeof *dx);
    float *lp = test_zeros_f32(k->rows), *lse = test_zeros_f32(k->rows);
    int32_t *tg = rand_targets(&rng, k->rows, k->vocab);

    struct tensor tx = tensor_f32(x, 2, shape), tdx = tensor_f32(dx, 2, shape);
    struct tensor tlp = tensor_f32(lp, 1, rshape), tlse = tensor_f32(lse, 1, rshape);
    struct tensor tw = tensor_f32(w, 1, rshape), ttg = tensor_i32(tg, 1, rshape);
    struct lp_ctx c = {test_to_f64(x, n), test_to_f64(w, k->rows), tg, k->rows, k->vocab};

    double *want_lp = malloc((size_t)k->rows * sizeof *want_lp);
    double *want_lse = malloc((size_t)k->rows * sizeof *want_lse);
    cr_assert(want_lp && want_lse);
    for (int64_t t = 0; t < k->rows; t++) {
        want_lse[t] = ref_lse(c.x + t * k->vocab, k->vocab);
        want_lp[t] = tg[t] < 0 ? 0.0 : c.x[t * k->vocab + tg[t]] - want_lse[t];
    }
    TEST_OK(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), &err);
    test_expect_close("logprobs", lp, want_lp, k->rows, 1e-6, 2e-6);
    test_expect_close("lse", lse, want_lse, k->rows, 1e-6, 1e-6);
    for (int64_t t = 0; t < k->rows; t++)
        if (tg[t] < 0) cr_expect(lp[t] == 0.0f, "row %lld has no target but logprob %g", (long long)t, lp[t]);

    TEST_OK(ops_logprobs_backward(&tdx, &tw, &tx, &ttg, &tlse, &err), &err);
    double *grad = malloc((size_t)n * sizeof *grad);
    cr_assert(grad);
    if (k->fd) test_fd_gradient(lp_loss, &c, c.x, n, 1e-6, grad);
    else ref_grad(&c, grad);
    for (int64_t i = 0; i < n; i++) grad[i] += init[i];
    test_expect_close("dlogits (initial + gradient)", dx, grad, n, k->grad_rtol, k->grad_atol);
    for (int64_t t = 0; t < k->rows; t++) {
        if (tg[t] >= 0) continue;
        cr_expect(memcmp(dx + t * k->vocab, init + t * k->vocab, (size_t)k->vocab * sizeof *dx) == 0,
                  "row %lld has no target but its dlogits changed", (long long)t);
    }

    free(x), free(w), free(init), free(dx), free(lp), free(lse), free(tg);
    free(c.x), free(c.w), free(want_lp), free(want_lse), free(grad);
}

Test(logprobs, small_vocabularies_fd) {
    const struct lp_case cases[] = {
        {4, 1, -4, 4, true, 1e-4, 1e-6},   /* V = 1: logprob 0, gradient 0 */
        {5, 3, -4, 4, true, 1e-4, 1e-6},
        {7, 17, -8, 8, true, 1e-4, 1e-6},
        {2, 1000, -6, 6, true, 1e-4, 1e-6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], 100 + i);
}

/* A naive exp(x) overflows at x > 88; offsets of ±1000 must change nothing but lse.
 * The backward reads lse back as f32, whose rounding at 1000 (3e-5) bounds the
 * probabilities' relative error, hence the looser rtol. */
Test(logprobs, large_magnitude_logits) {
    const struct lp_case cases[] = {
        {6, 9, 997, 1003, true, 2e-4, 1e-6},
        {6, 9, -1003, -997, true, 2e-4, 1e-6},
        {6, 9, -1000, 1000, true, 2e-4, 1e-6},
        {3, 500, 995, 1005, true, 2e-4, 1e-6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], 200 + i);
}

/* GPT-2 (50257) and Qwen (151936) vocabularies on a couple of rows. */
Test(logprobs, real_vocabularies) {
    const struct lp_case cases[] = {
        {2, 50257, -12, 12, false, 1e-4, 1e-7},
        {3, 151936, -20, 20, false, 1e-4, 1e-7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], 300 + i);
}

Test(logprobs, batched_3d_logits) {
    struct test_rng rng = {7};
    struct smelt_error err;
    enum { B = 2, T = 3, V = 11 };
    int64_t shape[3] = {B, T, V}, tshape[2] = {B, T};
    float *x = test_rand_f32(&rng, B * T * V, -3, 3);
    int32_t tg[B * T] = {0, 10, 5, -1, 3, 7};
    float lp[B * T], lse[B * T];
    struct tensor tx = tensor_make(BACKEND_CPU, DTYPE_F32, x, 3, shape);
    struct tensor ttg = tensor_i32(tg, 2, tshape);
    struct tensor tlp = tensor_f32(lp, 2, tshape), tlse = tensor_f32(lse, 2, tshape);
    TEST_OK(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), &err);
    double row[V];
    for (int t = 0; t < B * T; t++) {
        for (int v = 0; v < V; v++) row[v] = x[t * V + v];
        double l = ref_lse(row, V), want = tg[t] < 0 ? 0.0 : row[tg[t]] - l;
        cr_expect(fabs(lp[t] - want) <= 1e-6 * (1 + fabs(want)), "row %d: %g vs %g", t, lp[t], want);
        cr_expect(fabs(lse[t] - l) <= 1e-6 * (1 + fabs(l)), "row %d lse: %g vs %g", t, lse[t], l);
    }
    free(x);
}

/* Masked vocabulary entries (-inf) contribute nothing, even as a row's first entries,
 * and get exactly zero gradient. */
Test(logprobs, negative_infinity_logits) {
    struct smelt_error err;
    float x[2][5] = {{-INFINITY, -INFINITY, 1.0f, 2.0f, 0.5f}, {3.0f, -INFINITY, -1.0f, -INFINITY, 0.0f}};
    int32_t tg[2] = {3, 0};
    float lp[2], lse[2], w[2] = {0.5f, -2.0f}, dx[2][5] = {{0}};
    int64_t shape[2] = {2, 5}, rshape[1] = {2};
    struct tensor tx = tensor_f32(&x[0][0], 2, shape), tdx = tensor_f32(&dx[0][0], 2, shape);
    struct tensor ttg = tensor_i32(tg, 1, rshape), tlp = tensor_f32(lp, 1, rshape);
    struct tensor tlse = tensor_f32(lse, 1, rshape), tw = tensor_f32(w, 1, rshape);
    TEST_OK(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), &err);
    double r0 = log(exp(1.0) + exp(2.0) + exp(0.5)), r1 = log(exp(3.0) + exp(-1.0) + exp(0.0));
    cr_expect(fabs(lse[0] - r0) < 1e-6 && fabs(lse[1] - r1) < 1e-6, "lse %g %g vs %g %g", lse[0], lse[1], r0, r1);
    cr_expect(fabs(lp[0] - (2.0 - r0)) < 1e-6 && fabs(lp[1] - (3.0 - r1)) < 1e-6, "logprobs %g %g", lp[0], lp[1]);
    TEST_OK(ops_logprobs_backward(&tdx, &tw, &tx, &ttg, &tlse, &err), &err);
    cr_expect(dx[0][0] == 0.0f && dx[0][1] == 0.0f && dx[1][1] == 0.0f && dx[1][3] == 0.0f,
              "masked entries got gradient: %g %g %g %g", dx[0][0], dx[0][1], dx[1][1], dx[1][3]);
    double want = 0.5 * (1.0 - exp(2.0 - r0));
    cr_expect(fabs(dx[0][3] - want) < 1e-6, "target gradient %g vs %g", dx[0][3], want);
}

/* Without lse the forward still gives every logprob; a second backward adds again. */
Test(logprobs, no_lse_and_repeated_backward) {
    struct test_rng rng = {11};
    struct smelt_error err;
    enum { T = 4, V = 37 };
    int64_t shape[2] = {T, V}, rshape[1] = {T};
    float *x = test_rand_f32(&rng, T * V, -5, 5), *dx1 = test_zeros_f32(T * V), *dx2 = test_zeros_f32(T * V);
    int32_t tg[T] = {36, -1, 0, 17};
    float lp_a[T], lp_b[T], lse[T], w[T] = {1.0f, 2.0f, -0.25f, 3.0f};
    struct tensor tx = tensor_f32(x, 2, shape), ttg = tensor_i32(tg, 1, rshape);
    struct tensor ta = tensor_f32(lp_a, 1, rshape), tb = tensor_f32(lp_b, 1, rshape);
    struct tensor tlse = tensor_f32(lse, 1, rshape), tw = tensor_f32(w, 1, rshape);
    struct tensor td1 = tensor_f32(dx1, 2, shape), td2 = tensor_f32(dx2, 2, shape);
    TEST_OK(ops_logprobs(&ta, NULL, &tx, &ttg, &err), &err);
    TEST_OK(ops_logprobs(&tb, &tlse, &tx, &ttg, &err), &err);
    cr_expect(memcmp(lp_a, lp_b, sizeof lp_a) == 0, "logprobs depend on whether lse is saved");
    TEST_OK(ops_logprobs_backward(&td1, &tw, &tx, &ttg, &tlse, &err), &err);
    TEST_OK(ops_logprobs_backward(&td2, &tw, &tx, &ttg, &tlse, &err), &err);
    TEST_OK(ops_logprobs_backward(&td2, &tw, &tx, &ttg, &tlse, &err), &err);
    double *twice = malloc(T * V * sizeof *twice);
    cr_assert(twice);
    for (int i = 0; i < T * V; i++) twice[i] = 2.0 * dx1[i];
    test_expect_close("two backwards", dx2, twice, T * V, 1e-6, 1e-7);
    free(x), free(dx1), free(dx2), free(twice);
}

/* Rows are reduced sequentially, each by one thread: bit-identical for 1 and 2 threads. */
Test(logprobs, thread_count_independent) {
    struct test_rng rng = {13};
    struct smelt_error err;
    enum { T = 9, V = 20011 };
    int64_t shape[2] = {T, V}, rshape[1] = {T};
    float *x = test_rand_f32(&rng, T * V, -10, 10);
    int32_t *tg = rand_targets(&rng, T, V);
    float *w = test_rand_f32(&rng, T, -1, 1);
    float lp[2][T], lse[2][T];
    float *dx[2] = {test_zeros_f32(T * V), test_zeros_f32(T * V)};
    struct tensor tx = tensor_f32(x, 2, shape), ttg = tensor_i32(tg, 1, rshape), tw = tensor_f32(w, 1, rshape);
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        struct tensor tlp = tensor_f32(lp[k], 1, rshape), tlse = tensor_f32(lse[k], 1, rshape);
        struct tensor tdx = tensor_f32(dx[k], 2, shape);
        TEST_OK(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), &err);
        TEST_OK(ops_logprobs_backward(&tdx, &tw, &tx, &ttg, &tlse, &err), &err);
    }
    cr_expect(memcmp(lp[0], lp[1], sizeof lp[0]) == 0, "logprobs differ between 1 and 2 threads");
    cr_expect(memcmp(lse[0], lse[1], sizeof lse[0]) == 0, "lse differs between 1 and 2 threads");
    cr_expect(memcmp(dx[0], dx[1], T * V * sizeof(float)) == 0, "dlogits differ between 1 and 2 threads");
    free(x), free(tg), free(w), free(dx[0]), free(dx[1]);
}

Test(logprobs, errors) {
    struct smelt_error err;
    enum { T = 3, V = 7 };
    float x[T * V] = {0}, dx[T * V], lp[T], lse[T], w[T] = {1, 1, 1};
    int32_t tg[T] = {0, 6, 7}; /* row 2 is out of range */
    int64_t shape[2] = {T, V}, rshape[1] = {T}, short_shape[1] = {T - 1};
    for (int i = 0; i < T * V; i++) dx[i] = 5.0f;
    for (int i = 0; i < T; i++) lp[i] = lse[i] = 123.0f;
    struct tensor tx = tensor_f32(x, 2, shape), tdx = tensor_f32(dx, 2, shape);
    struct tensor ttg = tensor_i32(tg, 1, rshape), tlp = tensor_f32(lp, 1, rshape);
    struct tensor tlse = tensor_f32(lse, 1, rshape), tw = tensor_f32(w, 1, rshape);

    /* target >= V: names the row and the value, and writes nothing. */
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "row 2") && strstr(err.message, "7"), "message: %s", err.message);
    for (int i = 0; i < T; i++)
        cr_expect(lp[i] == 123.0f && lse[i] == 123.0f, "outputs written despite the error (row %d)", i);
    TEST_EXPECT_ERROR(ops_logprobs_backward(&tdx, &tw, &tx, &ttg, &tlse, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "row 2") != NULL, "message: %s", err.message);
    for (int i = 0; i < T * V; i++) cr_expect(dx[i] == 5.0f, "dlogits written despite the error");
    tg[2] = 6;
    TEST_OK(ops_logprobs(&tlp, &tlse, &tx, &ttg, &err), &err);

    /* targets of the wrong length or dtype. */
    struct tensor tshort = tensor_i32(tg, 1, short_shape);
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &tlse, &tx, &tshort, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "targets") != NULL, "message: %s", err.message);
    struct tensor tg_f32 = tensor_f32(w, 1, rshape);
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &tlse, &tx, &tg_f32, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &tlse, &tx, NULL, &err), SMELT_EINVAL, &err);

    /* logprobs / lse of the wrong dtype or length. */
    struct tensor lp_i32 = tensor_i32((int32_t *)lp, 1, rshape);
    TEST_EXPECT_ERROR(ops_logprobs(&lp_i32, &tlse, &tx, &ttg, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "logprobs") && strstr(err.message, "i32"), "message: %s", err.message);
    struct tensor lse_short = tensor_f32(lse, 1, short_shape);
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &lse_short, &tx, &ttg, &err), SMELT_EINVAL, &err);
    struct tensor lp_short = tensor_f32(lp, 1, short_shape);
    TEST_EXPECT_ERROR(ops_logprobs(&lp_short, &tlse, &tx, &ttg, &err), SMELT_EINVAL, &err);

    /* logits on a dtype the CPU backend does not compute in. */
    struct tensor x_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, x, 2, shape);
    TEST_EXPECT_ERROR(ops_logprobs(&tlp, &tlse, &x_bf16, &ttg, &err), SMELT_EUNSUPPORTED, &err);

    /* backward: lse is required; dlogits must match logits; dlogprobs one per row. */
    TEST_EXPECT_ERROR(ops_logprobs_backward(&tdx, &tw, &tx, &ttg, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "lse") != NULL, "message: %s", err.message);
    int64_t tshape[2] = {V, T};
    struct tensor dx_t = tensor_f32(dx, 2, tshape);
    TEST_EXPECT_ERROR(ops_logprobs_backward(&dx_t, &tw, &tx, &ttg, &tlse, &err), SMELT_EINVAL, &err);
    struct tensor w_short = tensor_f32(w, 1, short_shape);
    TEST_EXPECT_ERROR(ops_logprobs_backward(&tdx, &w_short, &tx, &ttg, &tlse, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_logprobs_backward(&tdx, &tw, &tx, &tshort, &tlse, &err), SMELT_EINVAL, &err);
    for (int i = 0; i < T * V; i++) cr_expect(dx[i] == 5.0f, "dlogits written by a rejected call");
}
