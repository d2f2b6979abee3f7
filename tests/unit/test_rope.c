/* rope: forward against a float64 rotation by the transformers f32 angle, the f32-angle
 * convention itself at positions in the thousands, backward against float64 finite
 * differences, accumulation, aliasing, packed and decode positions, and the errors bad
 * calls get. */
#include <string.h>

#include "tests/unit/testutil.h"

/* inv_freq as transformers computes it: 1.0 / (base ** (arange(0, dim, 2).float() / dim))
 * in f32, the power taken accurately and rounded. */
static float ref_inv_freq(int64_t i, int64_t dim, float theta) {
    float exponent = (float)(2 * i) / (float)dim;
    return 1.0f / (float)pow((double)theta, (double)exponent);
}

/* The model of one call: y = R(angle) x, with angles from `angle`, per (token, pair). */
struct rope_ref {
    double *x, *g;      /* [T, H, D] */
    double *cs, *sn;    /* [T, D/2]: cos and sin of each angle */
    int64_t tokens, heads, dim;
};

/* The f32 angle of transformers: (float)pos * inv_freq[i], rounded to f32. */
static double f32_angle(int32_t pos, int64_t i, int64_t dim, float theta) {
    return (double)((float)pos * ref_inv_freq(i, dim, theta));
}

/* The same angle with nothing rounded to f32: what an all-double rope would use. */
static double f64_angle(int32_t pos, int64_t i, int64_t dim, float theta) {
    return (double)pos * pow((double)theta, -(double)(2 * i) / (double)dim);
}

static void ref_init(struct rope_ref *p, const float *x, const int32_t *pos, int64_t tokens,
                     int64_t heads, int64_t dim, float theta,
                     double (*angle)(int32_t, int64_t, int64_t, float)) {
    int64_t n = tokens * heads * dim, half = dim / 2;
    p->tokens = tokens, p->heads = heads, p->dim = dim;
    p->x = test_to_f64(x, n);
    p->g = NULL;
    p->cs = malloc((size_t)(tokens * half) * sizeof(double));
    p->sn = malloc((size_t)(tokens * half) * sizeof(double));
    cr_assert(p->cs && p->sn);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            double a = angle(pos[t], i, dim, theta);
            p->cs[t * half + i] = cos(a);
            p->sn[t * half + i] = sin(a);
        }
}

static void ref_free(struct rope_ref *p) { free(p->x), free(p->g), free(p->cs), free(p->sn); }

static double ref_y(const struct rope_ref *p, int64_t t, int64_t h, int64_t d) {
    int64_t half = p->dim / 2, i = d < half ? d : d - half, base = (t * p->heads + h) * p->dim;
    double c = p->cs[t * half + i], s = p->sn[t * half + i];
    double x0 = p->x[base + i], x1 = p->x[base + i + half];
    return d < half ? x0 * c - x1 * s : x1 * c + x0 * s;
}

static double *ref_forward(const struct rope_ref *p) {
    int64_t n = p->tokens * p->heads * p->dim;
    double *y = malloc((size_t)n * sizeof *y);
    cr_assert(y);
    for (int64_t t = 0; t < p->tokens; t++)
        for (int64_t h = 0; h < p->heads; h++)
            for (int64_t d = 0; d < p->dim; d++) y[(t * p->heads + h) * p->dim + d] = ref_y(p, t, h, d);
    return y;
}

/* L = sum(g * y). Rotations do not mix tokens or heads, so only the perturbed element's
 * (token, head) block changes; the loss still sums everything so the check is honest. */
static double rope_loss(void *ctx) {
    const struct rope_ref *p = ctx;
    double loss = 0;
    for (int64_t t = 0; t < p->tokens; t++)
        for (int64_t h = 0; h < p->heads; h++)
            for (int64_t d = 0; d < p->dim; d++) loss += p->g[(t * p->heads + h) * p->dim + d] * ref_y(p, t, h, d);
    return loss;
}

static int32_t *rand_positions(struct test_rng *rng, int64_t n, int32_t max) {
    int32_t *pos = malloc((size_t)(n > 0 ? n : 1) * sizeof *pos);
    cr_assert(pos);
    for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)(test_rng_next(rng) % (uint64_t)(max + 1));
    return pos;
}

struct rope_shape {
    int64_t tokens, heads, dim;
};

/* Odd token and head counts, head dims whose half is odd, and the usual 64/128. */
static const struct rope_shape shapes[] = {
    {1, 1, 2}, {3, 2, 6}, {17, 1, 64}, {3, 5, 130}, {17, 3, 10}, {5, 2, 128},
};

static void check_rope_case(struct rope_shape s, float theta, uint64_t seed) {
    struct test_rng rng = {seed};
    struct smelt_error err;
    int64_t n = s.tokens * s.heads * s.dim, shape[3] = {s.tokens, s.heads, s.dim}, ts[1] = {s.tokens};
    float *x = test_rand_f32(&rng, n, -1, 1), *g = test_rand_f32(&rng, n, -1, 1);
    float *y = test_zeros_f32(n), *dx = test_rand_f32(&rng, n, -1, 1);
    int32_t *pos = rand_positions(&rng, s.tokens, 4000);
    double *dx0 = test_to_f64(dx, n);
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape);
    struct tensor tg = tensor_f32(g, 3, shape), tdx = tensor_f32(dx, 3, shape);
    struct tensor tpos = tensor_i32(pos, 1, ts);

    struct rope_ref p;
    ref_init(&p, x, pos, s.tokens, s.heads, s.dim, theta, f32_angle);
    p.g = test_to_f64(g, n);
    double *want = ref_forward(&p);
    TEST_OK(ops_rope(&ty, &tx, &tpos, theta, &err), &err);
    test_expect_close("rope y", y, want, n, 0, 1e-6);

    /* Onto random starting values: the backward must add, not assign. */
    TEST_OK(ops_rope_backward(&tdx, &tg, &tpos, theta, &err), &err);
    double *grad = malloc((size_t)n * sizeof *grad);
    cr_assert(grad);
    test_fd_gradient(rope_loss, &p, p.x, n, 1e-6, grad);
    for (int64_t i = 0; i < n; i++) grad[i] += dx0[i];
    test_expect_close("rope dx", dx, grad, n, 1e-5, 1e-6);

    free(x), free(g), free(y), free(dx), free(pos), free(dx0), free(want), free(grad);
    ref_free(&p);
}

Test(rope, forward_and_gradient) {
    uint64_t seed = 100;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        check_rope_case(shapes[i], 10000.0f, seed++);
        check_rope_case(shapes[i], 1000000.0f, seed++); /* Qwen2/3's rope_theta */
    }
}

/* Positions in the thousands: the op rotates by the f32 angle of transformers, and that
 * angle is measurably different from the exact one, so this test tells them apart. */
Test(rope, f32_angle_convention) {
    enum { T = 64, H = 2, D = 128 };
    const float thetas[2] = {10000.0f, 500000.0f};
    struct test_rng rng = {7};
    struct smelt_error err;
    int64_t n = T * H * D, shape[3] = {T, H, D}, ts[1] = {T};
    float *x = test_rand_f32(&rng, n, -1, 1), *y = test_zeros_f32(n);
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = 1000 + 61 * t + (int32_t)(test_rng_next(&rng) % 61); /* 1000..4903 */
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape), tpos = tensor_i32(pos, 1, ts);
    for (int k = 0; k < 2; k++) {
        struct rope_ref f32ref, f64ref;
        ref_init(&f32ref, x, pos, T, H, D, thetas[k], f32_angle);
        ref_init(&f64ref, x, pos, T, H, D, thetas[k], f64_angle);
        double *want = ref_forward(&f32ref), *exact = ref_forward(&f64ref);
        TEST_OK(ops_rope(&ty, &tx, &tpos, thetas[k], &err), &err);
        test_expect_close("rope y with the f32 angle", y, want, n, 0, 1e-6);
        double gap = 0;
        for (int64_t i = 0; i < n; i++) gap = fmax(gap, fabs(want[i] - exact[i]));
        cr_expect(gap > 2e-5, "theta %g: f32 and f64 angles differ by only %g; the test cannot tell them apart",
                  thetas[k], gap);
        free(want), free(exact);
        ref_free(&f32ref), ref_free(&f64ref);
    }
    free(x), free(y);
}

/* Pair 0 turns by exactly (float)pos radians (inv_freq[0] = 1), pair i by the f32
 * product with inv_freq[i]: a few values worked out independently of the kernel. */
Test(rope, known_values) {
    float x[4] = {1, 0.5f, 0, -2}; /* one token, one head, D = 4: pairs (x0, x2), (x1, x3) */
    float y[4];
    int32_t pos[1] = {3000};
    int64_t shape[3] = {1, 1, 4}, ts[1] = {1};
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape), tpos = tensor_i32(pos, 1, ts);
    struct smelt_error err;
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);
    /* inv_freq[1] = 1 / 10000^0.5 = f32(0.01); angle = f32(3000 * f32(0.01)). */
    double a1 = (double)(3000.0f * 0.01f);
    double want[4] = {cos(3000.0), 0.5 * cos(a1) + 2 * sin(a1), sin(3000.0), -2 * cos(a1) + 0.5 * sin(a1)};
    test_expect_close("rope known values", y, want, 4, 0, 5e-7);
}

/* y may alias x; and position 0 is the identity, bit for bit. */
Test(rope, in_place_and_position_zero) {
    enum { T = 9, H = 3, D = 34 };
    struct test_rng rng = {8};
    struct smelt_error err;
    int64_t n = T * H * D, shape[3] = {T, H, D}, ts[1] = {T};
    float *x = test_rand_f32(&rng, n, -1, 1), *y = test_zeros_f32(n), *io = malloc(n * sizeof(float));
    cr_assert(io);
    memcpy(io, x, n * sizeof(float));
    int32_t *pos = rand_positions(&rng, T, 3000);
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape), tio = tensor_f32(io, 3, shape);
    struct tensor tpos = tensor_i32(pos, 1, ts);
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);
    TEST_OK(ops_rope(&tio, &tio, &tpos, 10000.0f, &err), &err);
    cr_expect(memcmp(io, y, n * sizeof(float)) == 0, "in-place rope differs from out-of-place");
    for (int t = 0; t < T; t++) pos[t] = 0;
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);
    cr_expect(memcmp(x, y, n * sizeof(float)) == 0, "position 0 changed x");
    free(x), free(y), free(io), free(pos);
}

/* A packed batch restarts positions per sequence: rotating the packed tokens equals
 * rotating each sequence alone; and a decode step at offset p equals token p of the
 * full sequence. All bit for bit. */
Test(rope, packed_and_decode_positions) {
    enum { H = 2, D = 16, LA = 3, LB = 5, T = LA + LB };
    struct test_rng rng = {9};
    struct smelt_error err;
    int64_t row = H * D;
    float *x = test_rand_f32(&rng, T * row, -1, 1), *packed = test_zeros_f32(T * row);
    float *alone = test_zeros_f32(T * row), *step = test_zeros_f32(row);
    int32_t pos[T] = {0, 1, 2, 0, 1, 2, 3, 4};
    int64_t sp[3] = {T, H, D}, sa[3] = {LA, H, D}, sb[3] = {LB, H, D}, s1[3] = {1, H, D};
    int64_t tp[1] = {T}, ta[1] = {LA}, tb[1] = {LB}, t1[1] = {1};
    struct tensor tx = tensor_f32(x, 3, sp), ty = tensor_f32(packed, 3, sp), tpos = tensor_i32(pos, 1, tp);
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);

    struct tensor xa = tensor_f32(x, 3, sa), ya = tensor_f32(alone, 3, sa), pa = tensor_i32(pos, 1, ta);
    struct tensor xb = tensor_f32(x + LA * row, 3, sb), yb = tensor_f32(alone + LA * row, 3, sb);
    struct tensor pb = tensor_i32(pos + LA, 1, tb);
    TEST_OK(ops_rope(&ya, &xa, &pa, 10000.0f, &err), &err);
    TEST_OK(ops_rope(&yb, &xb, &pb, 10000.0f, &err), &err);
    cr_expect(memcmp(packed, alone, sizeof(float) * T * row) == 0, "packed rope differs from per-sequence rope");

    int32_t offset[1] = {4};
    struct tensor x4 = tensor_f32(x + 7 * row, 3, s1), y4 = tensor_f32(step, 3, s1), p4 = tensor_i32(offset, 1, t1);
    TEST_OK(ops_rope(&y4, &x4, &p4, 10000.0f, &err), &err);
    cr_expect(memcmp(step, packed + 7 * row, sizeof(float) * row) == 0, "decode step at offset 4 differs");
    free(x), free(packed), free(alone), free(step);
}

/* Backward accumulates (a second call adds the same again), and undoes the forward:
 * the rotation is orthogonal, so rope_backward(rope(x)) = x. */
Test(rope, accumulates_and_inverts) {
    enum { T = 11, H = 3, D = 24 };
    struct test_rng rng = {10};
    struct smelt_error err;
    int64_t n = T * H * D, shape[3] = {T, H, D}, ts[1] = {T};
    float *x = test_rand_f32(&rng, n, -1, 1), *y = test_zeros_f32(n), *back = test_zeros_f32(n);
    int32_t *pos = rand_positions(&rng, T, 2000);
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape), tb = tensor_f32(back, 3, shape);
    struct tensor tpos = tensor_i32(pos, 1, ts);
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);
    TEST_OK(ops_rope_backward(&tb, &ty, &tpos, 10000.0f, &err), &err);
    double *want = test_to_f64(x, n);
    test_expect_close("rope_backward(rope(x))", back, want, n, 0, 1e-6);
    TEST_OK(ops_rope_backward(&tb, &ty, &tpos, 10000.0f, &err), &err);
    for (int64_t i = 0; i < n; i++) want[i] *= 2;
    test_expect_close("after two backward calls", back, want, n, 0, 2e-6);
    free(x), free(y), free(back), free(pos), free(want);
}

/* Threaded sizes give the same bits as one thread (no reduction, but pinned anyway). */
Test(rope, large_threaded) {
    enum { T = 257, H = 4, D = 64 };
    struct test_rng rng = {12};
    struct smelt_error err;
    int64_t n = T * H * D, shape[3] = {T, H, D}, ts[1] = {T};
    float *x = test_rand_f32(&rng, n, -1, 1), *y = test_zeros_f32(n);
    int32_t *pos = rand_positions(&rng, T, 100000);
    struct tensor tx = tensor_f32(x, 3, shape), ty = tensor_f32(y, 3, shape), tpos = tensor_i32(pos, 1, ts);
    TEST_OK(ops_rope(&ty, &tx, &tpos, 10000.0f, &err), &err);
    struct rope_ref p;
    ref_init(&p, x, pos, T, H, D, 10000.0f, f32_angle);
    double *want = ref_forward(&p);
    test_expect_close("rope y, large", y, want, n, 0, 1e-6);
    free(x), free(y), free(pos), free(want);
    ref_free(&p);
}

Test(rope, errors) {
    float x[30] = {0}, dx[30];
    for (int i = 0; i < 30; i++) x[i] = (float)i, dx[i] = -1.0f;
    int32_t pos[3] = {0, 1, 2}, neg[3] = {0, 5, -1};
    int64_t s326[3] = {3, 2, 5}, s316[3] = {3, 1, 6}, s236[3] = {2, 3, 5}, s2d[2] = {3, 6};
    int64_t p3[1] = {3}, p2[1] = {2};
    struct tensor odd = tensor_f32(x, 3, s326), tx = tensor_f32(x, 3, s316), tdx = tensor_f32(dx, 3, s316);
    struct tensor other = tensor_f32(dx, 3, s236), flat = tensor_f32(x, 2, s2d);
    struct tensor tpos = tensor_i32(pos, 1, p3), tpos2 = tensor_i32(pos, 1, p2), tneg = tensor_i32(neg, 1, p3);
    struct tensor fpos = tensor_f32((float *)pos, 1, p3);
    struct smelt_error err;

    TEST_EXPECT_ERROR(ops_rope(&odd, &odd, &tpos, 10000.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "even head_dim") != NULL, "names the head dim: %s", err.message);
    TEST_EXPECT_ERROR(ops_rope_backward(&odd, &odd, &tpos, 10000.0f, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rope(&tx, &tx, &tpos2, 10000.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "positions") != NULL, "names positions: %s", err.message);
    TEST_EXPECT_ERROR(ops_rope(&tx, &tx, &fpos, 10000.0f, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rope(&tx, &tx, NULL, 10000.0f, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rope(&flat, &flat, &tpos, 10000.0f, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rope(&tx, &tx, &tpos, 0.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "theta") != NULL, "names theta: %s", err.message);
    TEST_EXPECT_ERROR(ops_rope(&other, &odd, &tpos, 10000.0f, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_rope_backward(&other, &tx, &tpos, 10000.0f, &err), SMELT_EINVAL, &err);

    /* Negative positions are data errors found by the backend; nothing is written. */
    TEST_EXPECT_ERROR(ops_rope(&tx, &tx, &tneg, 10000.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "positions[2] is -1") != NULL, "names the index: %s", err.message);
    TEST_EXPECT_ERROR(ops_rope_backward(&tdx, &tx, &tneg, 10000.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "positions[2]") != NULL, "names the index: %s", err.message);
    for (int i = 0; i < 18; i++) {
        cr_expect(x[i] == (float)i, "x[%d] was modified", i);
        cr_expect(dx[i] == -1.0f, "dx[%d] was modified", i);
    }
}
