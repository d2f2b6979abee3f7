/* ops_argmax on the CPU: the greedy choice, its tie and NaN rules, and refusals. */
#include "tests/unit/testutil.h"

#include <string.h>

static void argmax_rows(const float *logits, int64_t rows, int64_t vocab, int32_t *ids) {
    struct smelt_error err;
    int64_t shape[2] = {rows, vocab}, n = rows;
    struct tensor tl = tensor_f32((float *)logits, 2, shape), ti = tensor_i32(ids, 1, &n);
    TEST_OK(ops_argmax(&ti, &tl, &err), &err);
}

Test(argmax, matches_a_scan_on_random_rows) {
    struct test_rng rng = {5};
    int64_t rows = 37, vocab = 1003;
    float *x = test_rand_f32(&rng, rows * vocab, -5, 5);
    int32_t ids[37];
    argmax_rows(x, rows, vocab, ids);
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (x[r * vocab + v] > x[r * vocab + best]) best = v;
        cr_expect_eq(ids[r], best, "row %lld: %d, expected %lld", (long long)r, ids[r], (long long)best);
    }
    free(x);
}

Test(argmax, ties_nan_and_infinities) {
    const float nan = NAN, inf = INFINITY;
    const float x[][5] = {
        {1, 3, 3, 2, 3},            /* tie: the first */
        {nan, 1, nan, 2, 0},        /* NaN never beats a number */
        {nan, nan, nan, nan, nan},  /* nothing but NaN: 0 */
        {-inf, -inf, -inf, -inf, -inf},
        {-inf, -inf, -2, -inf, -1},
        {0, inf, 1, inf, nan},
    };
    const int32_t want[] = {1, 3, 0, 0, 4, 1};
    int32_t ids[6];
    argmax_rows(&x[0][0], 6, 5, ids);
    for (int r = 0; r < 6; r++) cr_expect_eq(ids[r], want[r], "row %d: %d, expected %d", r, ids[r], want[r]);
}

Test(argmax, one_element_vocabulary) {
    float x[3] = {nan(""), -1, 7};
    int32_t ids[3] = {9, 9, 9};
    argmax_rows(x, 3, 1, ids);
    for (int r = 0; r < 3; r++) cr_expect_eq(ids[r], 0);
}

Test(argmax, refuses_bad_tensors) {
    struct smelt_error err;
    float x[6] = {0};
    int32_t ids[3];
    int64_t shape[2] = {2, 3}, n2 = 2, n3 = 3, empty[2] = {2, 0};
    struct tensor tl = tensor_f32(x, 2, shape), ti = tensor_i32(ids, 1, &n2);
    struct tensor wrong_count = tensor_i32(ids, 1, &n3), f32_ids = tensor_f32(x, 1, &n2);
    struct tensor no_vocab = tensor_f32(x, 2, empty);
    TEST_EXPECT_ERROR(ops_argmax(&wrong_count, &tl, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "ids") != NULL, "%s", err.message);
    TEST_EXPECT_ERROR(ops_argmax(&f32_ids, &tl, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_argmax(&ti, &no_vocab, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "vocabulary") != NULL, "%s", err.message);
}
