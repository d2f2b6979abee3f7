/* AdamW against a float64 re-implementation of torch.optim.AdamW (steps 1..5, weight
 * decay, grad_scale, bias correction), its invalid configurations, and the
 * sum-of-squares reduction behind global gradient clipping. */
#include "tests/unit/testutil.h"

#include <omp.h>
#include <string.h>

/* torch.optim.AdamW's _single_tensor_adamw, in double, one element:
 *   param.mul_(1 - lr * wd); exp_avg.lerp_(grad, 1 - b1);
 *   exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2);
 *   denom = exp_avg_sq.sqrt() / sqrt(1 - b2^t) + eps;
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - b1^t)). */
static void ref_adamw(double *p, double *m, double *v, double grad, const struct adamw_config *c) {
    double lr = c->lr, b1 = c->beta1, b2 = c->beta2, eps = c->eps, t = (double)c->step;
    double g = (double)c->grad_scale * grad;
    *p *= 1.0 - lr * (double)c->weight_decay;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    double denom = sqrt(*v) / sqrt(1.0 - pow(b2, t)) + eps;
    *p -= lr / (1.0 - pow(b1, t)) * *m / denom;
}

/* Runs steps 1..5 with fresh gradients each step. Before each step the reference
 * starts from the kernel's current f32 state, so each step is checked on its own and
 * f32 rounding does not compound across steps. */
static void run_adamw(int64_t n, struct adamw_config config, double grad_magnitude, uint64_t seed) {
    struct test_rng rng = {seed};
    struct smelt_error err;
    int64_t shape[1] = {n};
    float *p = test_rand_f32(&rng, n, -1, 1), *m = test_zeros_f32(n), *v = test_zeros_f32(n);
    struct tensor tp = tensor_f32(p, 1, shape), tm = tensor_f32(m, 1, shape), tv = tensor_f32(v, 1, shape);
    double *wp = malloc((size_t)n * sizeof *wp), *wm = malloc((size_t)n * sizeof *wm);
    double *wv = malloc((size_t)n * sizeof *wv);
    cr_assert(wp && wm && wv);
    for (int64_t step = 1; step <= 5; step++) {
        float *g = test_rand_f32(&rng, n, -grad_magnitude, grad_magnitude);
        if (n > 3) g[3] = 0.0f; /* a parameter with no gradient still decays */
        struct tensor tg = tensor_f32(g, 1, shape);
        for (int64_t i = 0; i < n; i++) {
            wp[i] = p[i], wm[i] = m[i], wv[i] = v[i];
            config.step = step;
            ref_adamw(&wp[i], &wm[i], &wv[i], g[i], &config);
        }
        config.step = step;
        TEST_OK(ops_adamw(&tp, &tm, &tv, &tg, &config, &err), &err);
        double gs = grad_magnitude * config.grad_scale;
        char what[64];
        snprintf(what, sizeof what, "params after step %lld", (long long)step);
        test_expect_close(what, p, wp, n, 1e-6, 1e-9);
        snprintf(what, sizeof what, "m after step %lld", (long long)step);
        test_expect_close(what, m, wm, n, 1e-6, 1e-7 * gs);
        snprintf(what, sizeof what, "v after step %lld", (long long)step);
        test_expect_close(what, v, wv, n, 1e-6, 1e-7 * gs * gs);
        free(g);
    }
    free(p), free(m), free(v), free(wp), free(wm), free(wv);
}

Test(adamw, torch_defaults_with_decay_and_scale) {
    struct adamw_config c = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .grad_scale = 0.5f};
    run_adamw(1000, c, 1.0, 1);
}

Test(adamw, other_betas_no_decay) {
    struct adamw_config c = {.lr = 3e-4f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f,
                             .weight_decay = 0.0f, .grad_scale = 1.0f};
    run_adamw(33, c, 3.0, 2);
}

/* Gradients of the size of eps: the eps term matters in the denominator. */
Test(adamw, tiny_gradients_eps_matters) {
    struct adamw_config c = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f,
                             .weight_decay = 0.01f, .grad_scale = 2.0f};
    run_adamw(7, c, 1e-6, 3);
}

/* Above the parallel threshold: the same closed form. */
Test(adamw, large_buffer) {
    struct adamw_config c = {.lr = 5e-3f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                             .weight_decay = 0.05f, .grad_scale = 0.25f};
    run_adamw(40000, c, 1.0, 4);
}

/* Independent of the reference above: Adam's first step moves every parameter by
 * about lr * sign(grad) (m_hat = g, v_hat = g^2), after decay. */
Test(adamw, first_step_is_lr_times_sign) {
    struct smelt_error err;
    float p[4] = {1.0f, -2.0f, 0.5f, 0.0f}, m[4] = {0}, v[4] = {0}, g[4] = {3.0f, -0.01f, 100.0f, -7.0f};
    int64_t shape[1] = {4};
    struct tensor tp = tensor_f32(p, 1, shape), tm = tensor_f32(m, 1, shape);
    struct tensor tv = tensor_f32(v, 1, shape), tg = tensor_f32(g, 1, shape);
    struct adamw_config c = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                             .weight_decay = 0.5f, .grad_scale = 1.0f, .step = 1};
    TEST_OK(ops_adamw(&tp, &tm, &tv, &tg, &c, &err), &err);
    const double want[4] = {1.0 * 0.95 - 0.1, -2.0 * 0.95 + 0.1, 0.5 * 0.95 - 0.1, 0.0 + 0.1};
    test_expect_close("first step", p, want, 4, 1e-5, 1e-6);
}

Test(adamw, invalid_configs) {
    struct smelt_error err;
    float p[3] = {0}, m[3] = {0}, v[3] = {0}, g[3] = {1, 2, 3};
    int64_t shape[1] = {3}, short_shape[1] = {2};
    struct tensor tp = tensor_f32(p, 1, shape), tm = tensor_f32(m, 1, shape);
    struct tensor tv = tensor_f32(v, 1, shape), tg = tensor_f32(g, 1, shape);
    const struct adamw_config good = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                      .weight_decay = 0.0f, .grad_scale = 1.0f, .step = 1};
    struct adamw_config bad[12];
    for (int i = 0; i < 12; i++) bad[i] = good;
    bad[0].lr = -1e-3f;
    bad[1].beta1 = 1.0f;
    bad[2].beta2 = 1.0f;
    bad[3].beta1 = -0.1f;
    bad[4].eps = 0.0f;
    bad[5].eps = -1e-8f;
    bad[6].step = 0;
    bad[7].step = -3;
    bad[8].weight_decay = -0.1f;
    bad[9].grad_scale = -1.0f;
    bad[10].lr = NAN;
    bad[11].eps = NAN;
    for (int i = 0; i < 12; i++) {
        TEST_EXPECT_ERROR(ops_adamw(&tp, &tm, &tv, &tg, &bad[i], &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, "ops_adamw") != NULL, "config %d: message %s", i, err.message);
    }
    for (int i = 0; i < 3; i++) cr_expect(p[i] == 0.0f && m[i] == 0.0f && v[i] == 0.0f, "state changed");
    TEST_EXPECT_ERROR(ops_adamw(&tp, &tm, &tv, &tg, NULL, &err), SMELT_EINVAL, &err);

    struct tensor g_short = tensor_f32(g, 1, short_shape);
    TEST_EXPECT_ERROR(ops_adamw(&tp, &tm, &tv, &g_short, &good, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "grads") != NULL, "message: %s", err.message);
    struct tensor v_short = tensor_f32(v, 1, short_shape);
    TEST_EXPECT_ERROR(ops_adamw(&tp, &tm, &v_short, &tg, &good, &err), SMELT_EINVAL, &err);
    struct tensor m_i32 = tensor_i32((int32_t *)m, 1, shape);
    TEST_EXPECT_ERROR(ops_adamw(&tp, &m_i32, &tv, &tg, &good, &err), SMELT_EINVAL, &err);
    struct tensor p_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, p, 1, shape);
    TEST_EXPECT_ERROR(ops_adamw(&p_bf16, &tm, &tv, &tg, &good, &err), SMELT_EUNSUPPORTED, &err);
    TEST_EXPECT_ERROR(ops_adamw(&tp, &tm, NULL, &tg, &good, &err), SMELT_EINVAL, &err);
}

/* ---- sum of squares ---- */

static double ref_sum_squares(const float *x, int64_t n) {
    long double s = 0.0L; /* wider than the kernel's double: the reference's own error is negligible */
    for (int64_t i = 0; i < n; i++) s += (long double)x[i] * x[i];
    return (double)s;
}

Test(adamw, sum_squares_sizes) {
    struct smelt_error err;
    const int64_t sizes[] = {0, 1, 4095, 4096, 4097, 100000};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        struct test_rng rng = {50 + k};
        int64_t n = sizes[k], shape[2] = {1, n};
        float *x = test_rand_f32(&rng, n, -3, 3);
        struct tensor tx = tensor_f32(n ? x : NULL, 2, shape);
        double got = -1.0, want = ref_sum_squares(x, n);
        TEST_OK(ops_sum_squares(&got, &tx, &err), &err);
        cr_expect(fabs(got - want) <= 1e-13 * want, "n %lld: %.17g vs %.17g", (long long)n, got, want);
        free(x);
    }
}

/* Chunks summed in a fixed order: the same bits with 1 or 2 threads. */
Test(adamw, sum_squares_thread_count_independent) {
    struct smelt_error err;
    struct test_rng rng = {60};
    const int64_t sizes[] = {4097, 100000, 262147};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k], shape[1] = {n};
        float *x = test_rand_f32(&rng, n, -1e3, 1e3);
        struct tensor tx = tensor_f32(x, 1, shape);
        double got[2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            TEST_OK(ops_sum_squares(&got[t], &tx, &err), &err);
        }
        cr_expect(memcmp(&got[0], &got[1], sizeof got[0]) == 0, "n %lld: %.17g (1 thread) vs %.17g (2)",
                  (long long)n, got[0], got[1]);
        free(x);
    }
}

Test(adamw, sum_squares_errors) {
    struct smelt_error err;
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    struct tensor tx = tensor_f32(x, 1, shape);
    TEST_EXPECT_ERROR(ops_sum_squares(NULL, &tx, &err), SMELT_EINVAL, &err);
    double out;
    TEST_EXPECT_ERROR(ops_sum_squares(&out, NULL, &err), SMELT_EINVAL, &err);
    struct tensor nodata = tensor_f32(NULL, 1, shape);
    TEST_EXPECT_ERROR(ops_sum_squares(&out, &nodata, &err), SMELT_EINVAL, &err);
    struct tensor xi = tensor_i32((int32_t *)x, 1, shape);
    TEST_EXPECT_ERROR(ops_sum_squares(&out, &xi, &err), SMELT_EUNSUPPORTED, &err);
}
