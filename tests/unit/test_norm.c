/* rmsnorm, layernorm: forward and saved statistics against float64 references, the
 * Hugging Face f32 op order, backward against float64 finite differences (x, w, b),
 * accumulation, aliasing, NULL outputs, thread-count independence, and the errors bad
 * calls get. */
#include <omp.h>
#include <string.h>

#include "tests/unit/testutil.h"

#define EPS 1e-5f

/* The float64 model of one norm call; L = sum(g * y). b is NULL for RMSNorm. */
struct norm_ref {
    double *x, *w, *b, *g;
    int64_t rows, c;
    double eps;
    bool center;
};

/* Statistics of row r. */
static void ref_stats(const struct norm_ref *p, int64_t r, double *mean, double *rstd) {
    const double *x = p->x + r * p->c;
    double m = 0, ss = 0;
    if (p->center) {
        for (int64_t j = 0; j < p->c; j++) m += x[j];
        m /= (double)p->c;
    }
    for (int64_t j = 0; j < p->c; j++) ss += (x[j] - m) * (x[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt(ss / (double)p->c + p->eps);
}

static double ref_y(const struct norm_ref *p, int64_t r, int64_t j, double mean, double rstd) {
    double y = (p->x[r * p->c + j] - mean) * rstd * p->w[j];
    return p->b ? y + p->b[j] : y;
}

static double norm_loss(void *ctx) {
    const struct norm_ref *p = ctx;
    double loss = 0;
    for (int64_t r = 0; r < p->rows; r++) {
        double m, rs;
        ref_stats(p, r, &m, &rs);
        for (int64_t j = 0; j < p->c; j++) loss += p->g[r * p->c + j] * ref_y(p, r, j, m, rs);
    }
    return loss;
}

/* x values with |x| in [0.25, 2] plus an offset, so RMSNorm rows of one channel stay
 * away from 0 (where sqrt(x^2 + eps) is too curved for finite differences) and
 * LayerNorm has a mean to remove. */
static float *rand_x(struct test_rng *rng, int64_t n, double offset) {
    float *x = test_rand_f32(rng, n, 0.25, 2.0);
    for (int64_t i = 0; i < n; i++)
        if (test_rng_next(rng) & 1) x[i] = -x[i];
    for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] + offset);
    return x;
}

static double *fd_grad(struct norm_ref *p, double *wrt, int64_t n, const float *pre) {
    double *grad = malloc((size_t)n * sizeof *grad);
    cr_assert(grad);
    test_fd_gradient(norm_loss, p, wrt, n, 1e-6, grad);
    for (int64_t i = 0; i < n; i++) grad[i] += pre[i]; /* the op accumulates onto pre */
    return grad;
}

static float *copy_f32(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    cr_assert(y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* One shape, one kind: forward, statistics, and gradients accumulated onto random
 * starting values, all against the float64 model. */
static void check_norm_case(bool layer, int ndim, const int64_t *shape, uint64_t seed) {
    struct test_rng rng = {seed};
    struct smelt_error err;
    int64_t c = shape[ndim - 1], n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    int64_t rows = n / c;
    float *x = rand_x(&rng, n, layer ? 0.7 : 0.0), *g = test_rand_f32(&rng, n, -1, 1);
    float *w = test_rand_f32(&rng, c, -1.5, 1.5), *b = test_rand_f32(&rng, c, -1, 1);
    float *y = test_zeros_f32(n), *mean = test_zeros_f32(rows), *rstd = test_zeros_f32(rows);
    float *dx = test_rand_f32(&rng, n, -1, 1), *dw = test_rand_f32(&rng, c, -1, 1);
    float *db = test_rand_f32(&rng, c, -1, 1);
    float *dx0 = copy_f32(dx, n), *dw0 = copy_f32(dw, c), *db0 = copy_f32(db, c);
    int64_t cshape[1] = {c}, rshape[1] = {rows};
    struct tensor tx = tensor_f32(x, ndim, shape), ty = tensor_f32(y, ndim, shape);
    struct tensor tg = tensor_f32(g, ndim, shape), tdx = tensor_f32(dx, ndim, shape);
    struct tensor tw = tensor_f32(w, 1, cshape), tb = tensor_f32(b, 1, cshape);
    struct tensor tdw = tensor_f32(dw, 1, cshape), tdb = tensor_f32(db, 1, cshape);
    struct tensor tmean = tensor_f32(mean, 1, rshape), trstd = tensor_f32(rstd, 1, rshape);

    struct norm_ref p = {test_to_f64(x, n), test_to_f64(w, c), layer ? test_to_f64(b, c) : NULL,
                         test_to_f64(g, n), rows, c, EPS, layer};
    double *want_y = malloc((size_t)n * sizeof *want_y);
    double *want_mean = malloc((size_t)rows * sizeof *want_mean);
    double *want_rstd = malloc((size_t)rows * sizeof *want_rstd);
    cr_assert(want_y && want_mean && want_rstd);
    for (int64_t r = 0; r < rows; r++) {
        ref_stats(&p, r, &want_mean[r], &want_rstd[r]);
        for (int64_t j = 0; j < c; j++) want_y[r * c + j] = ref_y(&p, r, j, want_mean[r], want_rstd[r]);
    }

    if (layer) {
        TEST_OK(ops_layernorm(&ty, &tmean, &trstd, &tx, &tw, &tb, EPS, &err), &err);
        test_expect_close("layernorm mean", mean, want_mean, rows, 1e-6, 1e-7);
        TEST_OK(ops_layernorm_backward(&tdx, &tdw, &tdb, &tg, &tx, &tw, &tmean, &trstd, &err), &err);
    } else {
        TEST_OK(ops_rmsnorm(&ty, &trstd, &tx, &tw, EPS, &err), &err);
        TEST_OK(ops_rmsnorm_backward(&tdx, &tdw, &tg, &tx, &tw, &trstd, &err), &err);
    }
    test_expect_close("y", y, want_y, n, 1e-5, 1e-6);
    test_expect_close("rstd", rstd, want_rstd, rows, 1e-6, 0);

    double *gx = fd_grad(&p, p.x, n, dx0), *gw = fd_grad(&p, p.w, c, dw0);
    test_expect_close("dx", dx, gx, n, 1e-4, 1e-5);
    test_expect_close("dw", dw, gw, c, 1e-4, 1e-5);
    if (layer) {
        double *gb = fd_grad(&p, p.b, c, db0);
        test_expect_close("db", db, gb, c, 1e-4, 1e-5);
        free(gb);
    } else {
        cr_expect(memcmp(db, db0, (size_t)c * sizeof *db) == 0, "rmsnorm touched no bias gradient");
    }
    free(x), free(g), free(w), free(b), free(y), free(mean), free(rstd);
    free(dx), free(dw), free(db), free(dx0), free(dw0), free(db0);
    free(p.x), free(p.w), free(p.b), free(p.g), free(want_y), free(want_mean), free(want_rstd);
    free(gx), free(gw);
}

static const int64_t test_rows[] = {1, 3, 17};
static const int64_t test_channels[] = {1, 5, 64, 129};

static void check_norm_shapes(bool layer) {
    uint64_t seed = layer ? 1000 : 2000;
    for (size_t ri = 0; ri < sizeof test_rows / sizeof *test_rows; ri++)
        for (size_t ci = 0; ci < sizeof test_channels / sizeof *test_channels; ci++) {
            int64_t shape[2] = {test_rows[ri], test_channels[ci]};
            check_norm_case(layer, 2, shape, seed++);
        }
}

Test(norm, rmsnorm) { check_norm_shapes(false); }
Test(norm, layernorm) { check_norm_shapes(true); }

/* Qwen3's q/k norm: one RMSNorm over each head of [T, H, D], weight [D]; statistics per
 * (token, head). 4D activations reduce over the last dim the same way. */
Test(norm, per_head_shapes) {
    int64_t qk[3] = {5, 3, 16}, four[4] = {2, 3, 2, 7};
    check_norm_case(false, 3, qk, 31);
    check_norm_case(true, 3, qk, 32);
    check_norm_case(false, 4, four, 33);
    check_norm_case(true, 4, four, 34);
}

/* A hand-checked row: x = [3, 4], w = 1, eps = 0 -> rms = sqrt(12.5). */
Test(norm, known_values) {
    float x[2] = {3, 4}, w[2] = {1, 1}, b[2] = {0.5f, -0.5f}, y[2], mean[1], rstd[1];
    int64_t s2[1] = {2}, s1[1] = {1};
    struct tensor tx = tensor_f32(x, 1, s2), tw = tensor_f32(w, 1, s2), tb = tensor_f32(b, 1, s2);
    struct tensor ty = tensor_f32(y, 1, s2), tm = tensor_f32(mean, 1, s1), tr = tensor_f32(rstd, 1, s1);
    struct smelt_error err;
    TEST_OK(ops_rmsnorm(&ty, &tr, &tx, &tw, 0.0f, &err), &err);
    double want[2] = {3 / sqrt(12.5), 4 / sqrt(12.5)}, want_r = 1 / sqrt(12.5);
    test_expect_close("rmsnorm y", y, want, 2, 1e-6, 0);
    test_expect_close("rmsnorm rstd", rstd, &want_r, 1, 1e-6, 0);
    /* LayerNorm: mean 3.5, biased variance 0.25 -> xhat = [-1, 1]. */
    TEST_OK(ops_layernorm(&ty, &tm, &tr, &tx, &tw, &tb, 0.0f, &err), &err);
    double want_ln[2] = {-0.5, 0.5}, want_m = 3.5, want_lr = 2.0;
    test_expect_close("layernorm y", y, want_ln, 2, 1e-6, 0);
    test_expect_close("layernorm mean", mean, &want_m, 1, 0, 0);
    test_expect_close("layernorm rstd", rstd, &want_lr, 1, 0, 0);
}

/* Hugging Face's f32 op order, given the saved statistics: y = (x * rstd) * w for
 * LlamaRMSNorm, ((x - mean) * rstd) * w + b for LayerNorm, bit for bit; and rstd is the
 * f32 reciprocal square root of (the f32 statistic + eps), as torch.rsqrt sees it. */
Test(norm, hf_op_order) {
    struct test_rng rng = {77};
    struct smelt_error err;
    enum { ROWS = 4, C = 96 };
    float *x = rand_x(&rng, ROWS * C, 0.3), *w = test_rand_f32(&rng, C, -2, 2);
    float *b = test_rand_f32(&rng, C, -1, 1), *y = test_zeros_f32(ROWS * C);
    float mean[ROWS], rstd[ROWS];
    int64_t shape[2] = {ROWS, C}, cs[1] = {C}, rs[1] = {ROWS};
    struct tensor tx = tensor_f32(x, 2, shape), ty = tensor_f32(y, 2, shape);
    struct tensor tw = tensor_f32(w, 1, cs), tb = tensor_f32(b, 1, cs);
    struct tensor tm = tensor_f32(mean, 1, rs), tr = tensor_f32(rstd, 1, rs);
    for (int layer = 0; layer < 2; layer++) {
        if (layer) TEST_OK(ops_layernorm(&ty, &tm, &tr, &tx, &tw, &tb, EPS, &err), &err);
        else TEST_OK(ops_rmsnorm(&ty, &tr, &tx, &tw, EPS, &err), &err);
        int64_t bad = -1;
        for (int64_t r = 0; r < ROWS; r++) {
            const float *xr = x + r * C;
            double m = 0, ss = 0;
            if (layer) {
                for (int j = 0; j < C; j++) m += xr[j];
                m /= C;
            }
            for (int j = 0; j < C; j++) ss += ((double)xr[j] - m) * ((double)xr[j] - m);
            float want_r = 1.0f / sqrtf((float)(ss / C) + EPS);
            cr_expect(rstd[r] == want_r, "%s row %lld: rstd %.9g, f32 rsqrt of the f32 statistic is %.9g",
                      layer ? "layernorm" : "rmsnorm", (long long)r, rstd[r], want_r);
            float mf = layer ? mean[r] : 0.0f;
            for (int j = 0; j < C; j++) {
                float want = layer ? ((xr[j] - mf) * rstd[r]) * w[j] + b[j] : (xr[j] * rstd[r]) * w[j];
                if (y[r * C + j] != want && bad < 0) bad = r * C + j;
            }
        }
        cr_expect(bad < 0, "%s: y[%lld] differs from the HF op order", layer ? "layernorm" : "rmsnorm",
                  (long long)bad);
    }
    free(x), free(w), free(b), free(y);
}

/* y may alias x: the in-place result equals the out-of-place one bit for bit. */
Test(norm, in_place) {
    struct test_rng rng = {5};
    struct smelt_error err;
    enum { ROWS = 7, C = 129 };
    float *x = rand_x(&rng, ROWS * C, 0.5), *w = test_rand_f32(&rng, C, -1, 1);
    float *b = test_rand_f32(&rng, C, -1, 1), *y = test_zeros_f32(ROWS * C);
    int64_t shape[2] = {ROWS, C}, cs[1] = {C};
    struct tensor tw = tensor_f32(w, 1, cs), tb = tensor_f32(b, 1, cs), ty = tensor_f32(y, 2, shape);
    for (int layer = 0; layer < 2; layer++) {
        float *inout = copy_f32(x, ROWS * C);
        struct tensor tx = tensor_f32(x, 2, shape), tio = tensor_f32(inout, 2, shape);
        if (layer) {
            TEST_OK(ops_layernorm(&ty, NULL, NULL, &tx, &tw, &tb, EPS, &err), &err);
            TEST_OK(ops_layernorm(&tio, NULL, NULL, &tio, &tw, &tb, EPS, &err), &err);
        } else {
            TEST_OK(ops_rmsnorm(&ty, NULL, &tx, &tw, EPS, &err), &err);
            TEST_OK(ops_rmsnorm(&tio, NULL, &tio, &tw, EPS, &err), &err);
        }
        cr_expect(memcmp(inout, y, sizeof(float) * ROWS * C) == 0, "%s in place differs",
                  layer ? "layernorm" : "rmsnorm");
        free(inout);
    }
    free(x), free(w), free(b), free(y);
}

/* Shared state for the NULL-output and thread-count tests: a layernorm/rmsnorm problem
 * and its full backward. */
struct norm_problem {
    int64_t rows, c;
    float *x, *w, *b, *g, *mean, *rstd;
};

static void problem_init(struct norm_problem *p, int64_t rows, int64_t c, uint64_t seed) {
    struct test_rng rng = {seed};
    p->rows = rows, p->c = c;
    p->x = rand_x(&rng, rows * c, 0.4);
    p->g = test_rand_f32(&rng, rows * c, -1, 1);
    p->w = test_rand_f32(&rng, c, -1, 1);
    p->b = test_rand_f32(&rng, c, -1, 1);
    p->mean = test_zeros_f32(rows);
    p->rstd = test_zeros_f32(rows);
}

static void problem_free(struct norm_problem *p) {
    free(p->x), free(p->g), free(p->w), free(p->b), free(p->mean), free(p->rstd);
}

/* Runs forward into y (statistics into p) and backward into the non-NULL gradients. */
static void problem_run(struct norm_problem *p, bool layer, float *y, float *dx, float *dw, float *db) {
    struct smelt_error err;
    int64_t shape[2] = {p->rows, p->c}, cs[1] = {p->c}, rs[1] = {p->rows};
    struct tensor tx = tensor_f32(p->x, 2, shape), tg = tensor_f32(p->g, 2, shape);
    struct tensor tw = tensor_f32(p->w, 1, cs), tb = tensor_f32(p->b, 1, cs);
    struct tensor tm = tensor_f32(p->mean, 1, rs), tr = tensor_f32(p->rstd, 1, rs);
    struct tensor ty = tensor_f32(y, 2, shape), tdx = tensor_f32(dx, 2, shape);
    struct tensor tdw = tensor_f32(dw, 1, cs), tdb = tensor_f32(db, 1, cs);
    if (layer) {
        TEST_OK(ops_layernorm(&ty, &tm, &tr, &tx, &tw, &tb, EPS, &err), &err);
        TEST_OK(ops_layernorm_backward(dx ? &tdx : NULL, dw ? &tdw : NULL, db ? &tdb : NULL, &tg, &tx,
                                       &tw, &tm, &tr, &err), &err);
    } else {
        TEST_OK(ops_rmsnorm(&ty, &tr, &tx, &tw, EPS, &err), &err);
        TEST_OK(ops_rmsnorm_backward(dx ? &tdx : NULL, dw ? &tdw : NULL, &tg, &tx, &tw, &tr, &err), &err);
    }
}

static void expect_same(const char *what, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0) i++;
    cr_expect(i == n, "%s: element %lld is %.9g vs %.9g", what, (long long)i, i < n ? a[i] : 0.0f,
              i < n ? b[i] : 0.0f);
}

/* Optional outputs: leaving statistics or any gradient out changes nothing else. Large
 * enough to run threaded. */
Test(norm, null_outputs) {
    struct norm_problem p;
    problem_init(&p, 300, 130, 9);
    int64_t n = p.rows * p.c, c = p.c;
    for (int layer = 0; layer < 2; layer++) {
        float *y = test_zeros_f32(n), *dx = test_zeros_f32(n), *dw = test_zeros_f32(c), *db = test_zeros_f32(c);
        problem_run(&p, layer, y, dx, dw, db);
        float *y1 = test_zeros_f32(n), *dx1 = test_zeros_f32(n), *dw1 = test_zeros_f32(c), *db1 = test_zeros_f32(c);
        struct smelt_error err;
        int64_t shape[2] = {p.rows, p.c}, cs[1] = {c};
        struct tensor tx = tensor_f32(p.x, 2, shape), ty1 = tensor_f32(y1, 2, shape);
        struct tensor tw = tensor_f32(p.w, 1, cs), tb = tensor_f32(p.b, 1, cs);
        if (layer) TEST_OK(ops_layernorm(&ty1, NULL, NULL, &tx, &tw, &tb, EPS, &err), &err);
        else TEST_OK(ops_rmsnorm(&ty1, NULL, &tx, &tw, EPS, &err), &err);
        expect_same("y without statistics", y1, y, n);
        problem_run(&p, layer, y1, dx1, NULL, NULL);
        problem_run(&p, layer, y1, NULL, dw1, NULL);
        if (layer) problem_run(&p, layer, y1, NULL, NULL, db1);
        expect_same("dx alone", dx1, dx, n);
        expect_same("dw alone", dw1, dw, c);
        if (layer) expect_same("db alone", db1, db, c);
        problem_run(&p, layer, y1, NULL, NULL, NULL); /* nothing wanted: a no-op, not an error */
        free(y), free(dx), free(dw), free(db), free(y1), free(dx1), free(dw1), free(db1);
    }
    problem_free(&p);
}

/* Backward accumulates: a second call adds the same gradient again. */
Test(norm, accumulates) {
    struct norm_problem p;
    problem_init(&p, 17, 64, 10);
    int64_t n = p.rows * p.c, c = p.c;
    for (int layer = 0; layer < 2; layer++) {
        float *y = test_zeros_f32(n), *dx = test_zeros_f32(n), *dw = test_zeros_f32(c), *db = test_zeros_f32(c);
        problem_run(&p, layer, y, dx, dw, db);
        double *twice_dx = malloc((size_t)n * sizeof(double)), *twice_dw = malloc((size_t)c * sizeof(double));
        double *twice_db = malloc((size_t)c * sizeof(double));
        cr_assert(twice_dx && twice_dw && twice_db);
        for (int64_t i = 0; i < n; i++) twice_dx[i] = 2.0 * dx[i];
        for (int64_t j = 0; j < c; j++) twice_dw[j] = 2.0 * dw[j], twice_db[j] = 2.0 * db[j];
        problem_run(&p, layer, y, dx, dw, db);
        test_expect_close("dx after two calls", dx, twice_dx, n, 1e-6, 1e-7);
        test_expect_close("dw after two calls", dw, twice_dw, c, 1e-6, 1e-7);
        if (layer) test_expect_close("db after two calls", db, twice_db, c, 1e-6, 1e-7);
        free(y), free(dx), free(dw), free(db), free(twice_dx), free(twice_dw), free(twice_db);
    }
    problem_free(&p);
}

/* Same inputs, 1, 2 or 3 threads: bit-identical outputs, dw and db (row reductions)
 * included. */
Test(norm, thread_count_independent) {
    struct norm_problem p;
    problem_init(&p, 1000, 48, 11);
    int64_t n = p.rows * p.c, c = p.c;
    for (int layer = 0; layer < 2; layer++) {
        float *out[3][4];
        for (int k = 0; k < 3; k++) {
            omp_set_num_threads(k + 1);
            out[k][0] = test_zeros_f32(n), out[k][1] = test_zeros_f32(n);
            out[k][2] = test_zeros_f32(c), out[k][3] = test_zeros_f32(c);
            problem_run(&p, layer, out[k][0], out[k][1], out[k][2], out[k][3]);
        }
        for (int k = 1; k < 3; k++) {
            expect_same("y", out[k][0], out[0][0], n);
            expect_same("dx", out[k][1], out[0][1], n);
            expect_same("dw", out[k][2], out[0][2], c);
            expect_same("db", out[k][3], out[0][3], c);
        }
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 4; i++) free(out[k][i]);
    }
    problem_free(&p);
}

/* Rows and channels of zero size are legal empty work. */
Test(norm, empty_rows) {
    float w[4] = {1, 1, 1, 1}, b[4] = {0}, dw[4] = {0}, db[4] = {0};
    int64_t shape[2] = {0, 4}, cs[1] = {4}, rs[1] = {0};
    struct tensor tx = tensor_f32(NULL, 2, shape), ty = tensor_f32(NULL, 2, shape);
    struct tensor tdy = tensor_f32(NULL, 2, shape), tdx = tensor_f32(NULL, 2, shape);
    struct tensor tw = tensor_f32(w, 1, cs), tb = tensor_f32(b, 1, cs);
    struct tensor tm = tensor_f32(NULL, 1, rs), tr = tensor_f32(NULL, 1, rs);
    struct tensor tdw = tensor_f32(dw, 1, cs), tdb = tensor_f32(db, 1, cs);
    struct smelt_error err;
    TEST_OK(ops_rmsnorm(&ty, &tr, &tx, &tw, EPS, &err), &err);
    TEST_OK(ops_rmsnorm_backward(&tdx, &tdw, &tdy, &tx, &tw, &tr, &err), &err);
    TEST_OK(ops_layernorm(&ty, &tm, &tr, &tx, &tw, &tb, EPS, &err), &err);
    TEST_OK(ops_layernorm_backward(&tdx, &tdw, &tdb, &tdy, &tx, &tw, &tm, &tr, &err), &err);
    for (int j = 0; j < 4; j++) cr_expect(dw[j] == 0.0f && db[j] == 0.0f, "channel %d got a gradient", j);
}

Test(norm, errors) {
    float x[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, y[12], w[5] = {1, 1, 1, 1, 1};
    float b[5] = {0}, st[5] = {0}, st2[5] = {0}, dw[5] = {0};
    int32_t ist[3] = {0};
    int64_t s34[2] = {3, 4}, s43[2] = {4, 3}, c4[1] = {4}, c5[1] = {5}, r3[1] = {3}, r4[1] = {4};
    struct tensor tx = tensor_f32(x, 2, s34), ty = tensor_f32(y, 2, s34), ty43 = tensor_f32(y, 2, s43);
    struct tensor tw = tensor_f32(w, 1, c4), tw5 = tensor_f32(w, 1, c5), tb = tensor_f32(b, 1, c4);
    struct tensor tb5 = tensor_f32(b, 1, c5), tdw5 = tensor_f32(dw, 1, c5);
    struct tensor tm = tensor_f32(st, 1, r3), tr = tensor_f32(st2, 1, r3), tr4 = tensor_f32(st2, 1, r4);
    struct tensor tri = tensor_i32(ist, 1, r3);
    struct smelt_error err;

    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tr, &tx, &tw5, EPS, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "w has shape [5]") != NULL, "names w: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tr4, &tx, &tw, EPS, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "rstd") != NULL, "names rstd: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tri, &tx, &tw, EPS, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "i32") != NULL, "names the dtype: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty43, &tr, &tx, &tw, EPS, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tr, &tx, &tw, -1.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "eps") != NULL, "names eps: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tr, &tx, &tw, NAN, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rmsnorm(&ty, &tr, &tx, NULL, EPS, &err), SMELT_EINVAL, &err);

    TEST_EXPECT_ERROR(ops_rmsnorm_backward(&ty, NULL, &tx, &tx, &tw, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "rstd") != NULL, "names rstd: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm_backward(&ty, NULL, &tx, &tx, &tw, &tr4, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rmsnorm_backward(&ty, &tdw5, &tx, &tx, &tw, &tr, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "dw") != NULL, "names dw: %s", err.message);
    TEST_EXPECT_ERROR(ops_rmsnorm_backward(&ty43, NULL, &tx, &tx, &tw, &tr, &err), SMELT_EINVAL, &err);

    TEST_EXPECT_ERROR(ops_layernorm(&ty, &tm, &tr, &tx, &tw, NULL, EPS, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "b is missing") != NULL, "names b: %s", err.message);
    TEST_EXPECT_ERROR(ops_layernorm(&ty, &tm, &tr, &tx, &tw, &tb5, EPS, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_layernorm(&ty, &tr4, &tr, &tx, &tw, &tb, EPS, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "mean") != NULL, "names mean: %s", err.message);
    TEST_EXPECT_ERROR(ops_layernorm(&ty, &tm, &tr, &tx, &tw5, &tb, EPS, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_layernorm_backward(&ty, NULL, NULL, &tx, &tx, &tw, NULL, &tr, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "mean") != NULL, "names mean: %s", err.message);
    TEST_EXPECT_ERROR(ops_layernorm_backward(&ty, NULL, NULL, &tx, &tx, &tw, &tm, NULL, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_layernorm_backward(&ty, NULL, &tb5, &tx, &tx, &tw, &tm, &tr, &err), SMELT_EINVAL, &err);

    struct tensor bf = tensor_make(BACKEND_CPU, DTYPE_BF16, x, 2, s34);
    TEST_EXPECT_ERROR(ops_rmsnorm(&bf, &tr, &bf, &tw, EPS, &err), SMELT_EUNSUPPORTED, &err);
    /* Failed calls wrote nothing. */
    for (int i = 0; i < 12; i++) cr_expect(x[i] == (float)(i + 1), "x[%d] was modified", i);
}
