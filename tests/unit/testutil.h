/* Shared helpers for the C unit tests: a seeded RNG, float64 finite differences and
 * closeness checks that report the worst element. */
#ifndef SMELT_TESTS_TESTUTIL_H
#define SMELT_TESTS_TESTUTIL_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/ops.h"

struct test_rng {
    uint64_t state;
};

static inline uint64_t test_rng_next(struct test_rng *r) { /* splitmix64 */
    return rng_mix64(r->state += RNG_GOLDEN);
}

/* Uniform in [lo, hi). */
static inline double test_rng_uniform(struct test_rng *r, double lo, double hi) {
    return lo + (hi - lo) * (double)(test_rng_next(r) >> 11) * 0x1p-53;
}

/* malloc'd arrays of n random values; the test frees them. A float array and its exact
 * double copy come from test_rand_pair so references see the same inputs. */
static inline float *test_rand_f32(struct test_rng *r, int64_t n, double lo, double hi) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)test_rng_uniform(r, lo, hi);
    return x;
}

static inline double *test_to_f64(const float *x, int64_t n) {
    double *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    cr_assert(y);
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static inline float *test_zeros_f32(int64_t n) {
    float *x = calloc((size_t)(n > 0 ? n : 1), sizeof *x);
    cr_assert(x);
    return x;
}

/* Central finite differences of a float64 scalar function: grad[i] = dL/dx[i]. x is
 * perturbed in place and restored; loss reads x through ctx. */
static inline void test_fd_gradient(double (*loss)(void *ctx), void *ctx, double *x, int64_t n,
                                    double h, double *grad) {
    for (int64_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double lp = loss(ctx);
        x[i] = saved - h;
        double lm = loss(ctx);
        x[i] = saved;
        grad[i] = (lp - lm) / (2.0 * h);
    }
}

/* Expects |got - want| <= atol + rtol * |want| everywhere; on failure names the worst
 * element. */
static inline void test_expect_close(const char *what, const float *got, const double *want,
                                     int64_t n, double rtol, double atol) {
    int64_t worst = -1;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        double excess = diff - (atol + rtol * fabs(want[i]));
        if (!(excess <= 0.0) && (worst < 0 || !(excess <= worst_excess))) {
            worst = i;
            worst_excess = excess;
        }
    }
    cr_expect(worst < 0, "%s: element %lld is %.9g, expected %.9g (rtol %g, atol %g, n %lld)", what,
              (long long)worst, worst >= 0 ? (double)got[worst] : 0.0,
              worst >= 0 ? want[worst] : 0.0, rtol, atol, (long long)n);
}

/* A temporary directory per test: `.init = test_tmp_setup, .fini = test_tmp_teardown`
 * creates /tmp/smelt-test-XXXXXX into test_tmp_dir and removes it with its contents. */
__attribute__((unused)) static char test_tmp_dir[64];

static inline void test_tmp_setup(void) {
    snprintf(test_tmp_dir, sizeof test_tmp_dir, "/tmp/smelt-test-XXXXXX");
    cr_assert(mkdtemp(test_tmp_dir) != NULL, "mkdtemp failed");
}

static inline int test_remove_entry(const char *path, const struct stat *st, int flag,
                                    struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void test_tmp_teardown(void) {
    if (test_tmp_dir[0]) nftw(test_tmp_dir, test_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* test_tmp_dir/name into buf; returns buf. */
static inline const char *test_tmp_path(char *buf, size_t size, const char *name) {
    int n = snprintf(buf, size, "%s/%s", test_tmp_dir, name);
    cr_assert(n > 0 && (size_t)n < size);
    return buf;
}

/* The program `name` built beside these tests (BUILD/tests/unit_tests -> BUILD/name) into
 * out; fails the test when it is not there. Returns out. */
static inline const char *test_built_program(const char *name, char *out, size_t cap) {
    char exe[600];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = 0;
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(exe, '/');
        cr_assert(slash);
        *slash = 0;
    }
    int len = snprintf(out, cap, "%s/%s", exe, name);
    cr_assert(len > 0 && (size_t)len < cap);
    cr_assert(access(out, X_OK) == 0, "%s is missing: these tests run the built program (make BUILD=... all)", out);
    return out;
}

/* Expects an op call to fail with code and a non-empty message. */
#define TEST_EXPECT_ERROR(call, want_code, errp)                                         \
    do {                                                                              \
        error_clear(errp);                                                            \
        int rc_ = (call);                                                             \
        cr_expect_eq(rc_, (want_code), "%s returned %s, expected %s (%s)", #call,    \
                     error_code_name(rc_), error_code_name(want_code), (errp)->message); \
        cr_expect((errp)->message[0] != '\0', "%s gave no error message", #call);   \
    } while (0)

#define TEST_OK(call, errp)                                                            \
    do {                                                                              \
        error_clear(errp);                                                            \
        int rc_ = (call);                                                             \
        cr_assert_eq(rc_, 0, "%s failed: %s", #call, (errp)->message);              \
    } while (0)

#endif
