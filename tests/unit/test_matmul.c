/* matmul: forward against a float64 reference for every transpose combination, 2D,
 * batched, shared-operand, bias and alpha/beta cases; backward against float64 finite
 * differences of L = sum(w * out) with dout = w; accumulation, NULL gradients, empty
 * inner dimension, determinism, and the errors bad calls get. */
#include <string.h>

#include "tests/unit/testutil.h"

struct mm_case {
    const char *name;
    int64_t batch, m, n, k;
    bool a_batched, b_batched, has_bias;
    double alpha, beta;
};

/* Small enough for finite differences of every element in all four transpose modes. */
static const struct mm_case grad_cases[] = {
    {"2d", 1, 3, 4, 5, false, false, true, 1.0, 0.0},
    {"ones", 1, 1, 1, 1, false, false, true, 1.0, 0.0},
    {"2d odd", 1, 17, 33, 3, false, false, true, 0.5, 0.25},
    {"batched", 3, 5, 7, 17, true, true, true, 1.5, 0.0},
    {"batch of one", 1, 3, 1, 33, true, true, false, 1.0, 0.0},
    {"shared b", 4, 17, 9, 6, true, false, true, 1.0, 0.5},
    {"shared b tall", 2, 33, 5, 17, true, false, false, 1.0, 0.0},
    /* m == k: a transposed batch has the same stride as an untransposed one. */
    {"shared b square", 3, 8, 5, 8, true, false, true, 1.0, 0.0},
    {"shared a", 3, 6, 5, 7, false, true, false, -0.75, 1.0},
    /* one row: the GEMV path (decode at batch 1) */
    {"one row", 1, 1, 9, 7, false, false, true, 1.0, 0.0},
    {"one row batched", 3, 1, 6, 5, true, true, true, 1.0, 0.5},
    {"one row shared a", 2, 1, 5, 4, false, true, false, 0.5, 0.0},
    {"shared a bias", 2, 1, 3, 33, false, true, true, 2.0, 0.0},
};

/* Large enough for OpenBLAS to thread and block; checked against float64 references. */
static const struct mm_case big_cases[] = {
    {"big 2d", 1, 128, 96, 200, false, false, true, 1.0, 0.0},
    {"big shared b", 3, 65, 129, 257, true, false, true, 1.0, 0.0},
    {"big shared a", 3, 65, 129, 257, false, true, false, 0.5, 1.0},
    {"big batched", 2, 64, 64, 130, true, true, true, 1.0, -0.5},
    {"big one row", 2, 1, 300, 257, true, true, true, 1.0, 0.0},
};

/* One case in one transpose mode, in float64: inputs, the old out, and the loss weights. */
struct mm_ref {
    const struct mm_case *c;
    bool ta, tb;
    double *a, *b, *bias, *out0, *w;
};

static int64_t a_numel(const struct mm_case *c) { return (c->a_batched ? c->batch : 1) * c->m * c->k; }
static int64_t b_numel(const struct mm_case *c) { return (c->b_batched ? c->batch : 1) * c->k * c->n; }
static int64_t out_numel(const struct mm_case *c) { return c->batch * c->m * c->n; }

/* Storage index of op(a)[bi][i][p] and op(b)[bi][p][j]. */
static int64_t a_index(const struct mm_ref *r, int64_t bi, int64_t i, int64_t p) {
    const struct mm_case *c = r->c;
    int64_t base = c->a_batched ? bi * c->m * c->k : 0;
    return base + (r->ta ? p * c->m + i : i * c->k + p);
}
static int64_t b_index(const struct mm_ref *r, int64_t bi, int64_t p, int64_t j) {
    const struct mm_case *c = r->c;
    int64_t base = c->b_batched ? bi * c->k * c->n : 0;
    return base + (r->tb ? j * c->k + p : p * c->n + j);
}

static void ref_forward(const struct mm_ref *r, double *out) {
    const struct mm_case *c = r->c;
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < c->k; p++)
                    s += r->a[a_index(r, bi, i, p)] * r->b[b_index(r, bi, p, j)];
                int64_t o = (bi * c->m + i) * c->n + j;
                double v = c->alpha * s;
                if (r->bias) v += r->bias[j];
                if (c->beta != 0.0) v += c->beta * r->out0[o]; /* beta = 0: out0 may be NaN */
                out[o] = v;
            }
}

static double ref_loss(void *p) {
    const struct mm_ref *r = p;
    int64_t n = out_numel(r->c);
    double *out = malloc((size_t)n * sizeof *out);
    cr_assert(out);
    ref_forward(r, out);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += r->w[i] * out[i];
    free(out);
    return s;
}

/* The exact gradient of L = sum(w * out), by the chain rule through ref_forward's own
 * index maps (independent of the op's transpose logic): for the big cases, where finite
 * differences would be slow. */
static void ref_gradients(const struct mm_ref *r, double *ga, double *gb, double *gbias) {
    const struct mm_case *c = r->c;
    memset(ga, 0, (size_t)a_numel(c) * sizeof *ga);
    memset(gb, 0, (size_t)b_numel(c) * sizeof *gb);
    memset(gbias, 0, (size_t)c->n * sizeof *gbias);
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double w = r->w[(bi * c->m + i) * c->n + j];
                gbias[j] += w;
                for (int64_t p = 0; p < c->k; p++) {
                    ga[a_index(r, bi, i, p)] += c->alpha * w * r->b[b_index(r, bi, p, j)];
                    gb[b_index(r, bi, p, j)] += c->alpha * w * r->a[a_index(r, bi, i, p)];
                }
            }
}

/* Float inputs and tensors for one case and transpose mode. */
struct mm_run {
    struct mm_ref ref;
    float *a, *b, *bias, *out, *w, *da, *db, *dbias;
    struct tensor ta, tb, tbias, tout, tw, tda, tdb, tdbias;
};

static struct tensor shaped(float *data, bool batched, int64_t batch, int64_t rows, int64_t cols) {
    int64_t shape[3] = {batch, rows, cols};
    return batched ? tensor_f32(data, 3, shape) : tensor_f32(data, 2, shape + 1);
}

static void mm_run_init(struct mm_run *run, const struct mm_case *c, bool ta, bool tb,
                        struct test_rng *rng) {
    int64_t na = a_numel(c), nb = b_numel(c), no = out_numel(c);
    run->a = test_rand_f32(rng, na, -1, 1);
    run->b = test_rand_f32(rng, nb, -1, 1);
    run->bias = c->has_bias ? test_rand_f32(rng, c->n, -1, 1) : NULL;
    run->w = test_rand_f32(rng, no, -1, 1);
    run->out = test_rand_f32(rng, no, -1, 1);
    if (c->beta == 0.0) /* the old content must be ignored, NaN included */
        for (int64_t i = 0; i < no; i++) run->out[i] = NAN;
    run->da = test_zeros_f32(na);
    run->db = test_zeros_f32(nb);
    run->dbias = test_zeros_f32(c->n);

    run->ref = (struct mm_ref){c, ta, tb, test_to_f64(run->a, na), test_to_f64(run->b, nb),
                               c->has_bias ? test_to_f64(run->bias, c->n) : NULL,
                               test_to_f64(run->out, no), test_to_f64(run->w, no)};

    bool out_batched = c->a_batched || c->b_batched;
    run->ta = shaped(run->a, c->a_batched, c->batch, ta ? c->k : c->m, ta ? c->m : c->k);
    run->tb = shaped(run->b, c->b_batched, c->batch, tb ? c->n : c->k, tb ? c->k : c->n);
    run->tda = shaped(run->da, c->a_batched, c->batch, ta ? c->k : c->m, ta ? c->m : c->k);
    run->tdb = shaped(run->db, c->b_batched, c->batch, tb ? c->n : c->k, tb ? c->k : c->n);
    run->tout = shaped(run->out, out_batched, c->batch, c->m, c->n);
    run->tw = shaped(run->w, out_batched, c->batch, c->m, c->n);
    int64_t nshape[1] = {c->n};
    run->tbias = tensor_f32(run->bias, 1, nshape);
    run->tdbias = tensor_f32(run->dbias, 1, nshape);
}

static void mm_run_free(struct mm_run *run) {
    free(run->a), free(run->b), free(run->bias), free(run->out), free(run->w);
    free(run->da), free(run->db), free(run->dbias);
    free(run->ref.a), free(run->ref.b), free(run->ref.bias), free(run->ref.out0), free(run->ref.w);
}

static void scale(double *x, int64_t n, double s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static void check_forward(struct mm_run *run, const char *what) {
    const struct mm_case *c = run->ref.c;
    struct smelt_error err;
    int64_t no = out_numel(c);
    double *want = malloc((size_t)no * sizeof *want);
    cr_assert(want);
    ref_forward(&run->ref, want);
    TEST_OK(ops_matmul(&run->tout, &run->ta, &run->tb, c->has_bias ? &run->tbias : NULL,
                       run->ref.ta, run->ref.tb, (float)c->alpha, (float)c->beta, &err),
            &err);
    /* f32 dot products of k terms in [-1, 1]: error grows with k. */
    double atol = 2e-7 * (double)(c->k + 4) * (fabs(c->alpha) + 1.0);
    test_expect_close(what, run->out, want, no, 1e-5, atol);
    free(want);
}

/* Runs the backward twice with dout = w, checking the gradients after one call and
 * their doubles after the second. */
static void check_backward(struct mm_run *run, const double *ga, const double *gb,
                           const double *gbias, const char *what) {
    const struct mm_case *c = run->ref.c;
    struct smelt_error err;
    int64_t na = a_numel(c), nb = b_numel(c);
    double *twice_a = malloc((size_t)na * sizeof *twice_a);
    double *twice_b = malloc((size_t)nb * sizeof *twice_b);
    double *twice_bias = malloc((size_t)c->n * sizeof *twice_bias);
    cr_assert(twice_a && twice_b && twice_bias);
    memcpy(twice_a, ga, (size_t)na * sizeof *ga);
    memcpy(twice_b, gb, (size_t)nb * sizeof *gb);
    memcpy(twice_bias, gbias, (size_t)c->n * sizeof *gbias);
    scale(twice_a, na, 2), scale(twice_b, nb, 2), scale(twice_bias, c->n, 2);

    /* Batches summed into a shared operand's gradient: k terms per batch. */
    double atol = 2e-7 * (double)(c->batch * (c->m + c->n) + 4) * (fabs(c->alpha) + 1.0);
    char label[160];
    for (int call = 1; call <= 2; call++) {
        TEST_OK(ops_matmul_backward(&run->tda, &run->tdb, &run->tdbias, &run->tw, &run->ta,
                                    &run->tb, run->ref.ta, run->ref.tb, (float)c->alpha, &err),
                &err);
        snprintf(label, sizeof label, "%s, backward call %d: da", what, call);
        test_expect_close(label, run->da, call == 1 ? ga : twice_a, na, 1e-5, atol);
        snprintf(label, sizeof label, "%s, backward call %d: db", what, call);
        test_expect_close(label, run->db, call == 1 ? gb : twice_b, nb, 1e-5, atol);
        snprintf(label, sizeof label, "%s, backward call %d: dbias", what, call);
        test_expect_close(label, run->dbias, call == 1 ? gbias : twice_bias, c->n, 1e-5, atol);
    }
    free(twice_a), free(twice_b), free(twice_bias);
}

static void label_of(char *buf, size_t bytes, const struct mm_case *c, bool ta, bool tb) {
    snprintf(buf, bytes, "%s (batch %lld, m %lld, n %lld, k %lld, trans_a %d, trans_b %d)",
             c->name, (long long)c->batch, (long long)c->m, (long long)c->n, (long long)c->k, ta,
             tb);
}

static void run_grad_case(const struct mm_case *c, bool ta, bool tb, struct test_rng *rng) {
    struct mm_run run;
    char what[160];
    label_of(what, sizeof what, c, ta, tb);
    mm_run_init(&run, c, ta, tb, rng);
    check_forward(&run, what);

    int64_t na = a_numel(c), nb = b_numel(c);
    double *ga = malloc((size_t)na * sizeof *ga), *gb = malloc((size_t)nb * sizeof *gb);
    double *gbias = calloc((size_t)c->n, sizeof *gbias);
    cr_assert(ga && gb && gbias);
    test_fd_gradient(ref_loss, &run.ref, run.ref.a, na, 1e-3, ga);
    test_fd_gradient(ref_loss, &run.ref, run.ref.b, nb, 1e-3, gb);
    /* Without a bias the op still fills dbias with dout's column sums: the gradient a
     * bias would get. Finite differences need a bias vector to perturb. */
    double *zero_bias = calloc((size_t)c->n, sizeof *zero_bias);
    cr_assert(zero_bias);
    double *saved_bias = run.ref.bias;
    if (!run.ref.bias) run.ref.bias = zero_bias;
    test_fd_gradient(ref_loss, &run.ref, run.ref.bias, c->n, 1e-3, gbias);
    run.ref.bias = saved_bias;
    check_backward(&run, ga, gb, gbias, what);
    free(ga), free(gb), free(gbias), free(zero_bias);
    mm_run_free(&run);
}

static void run_big_case(const struct mm_case *c, bool ta, bool tb, struct test_rng *rng) {
    struct mm_run run;
    char what[160];
    label_of(what, sizeof what, c, ta, tb);
    mm_run_init(&run, c, ta, tb, rng);
    check_forward(&run, what);
    int64_t na = a_numel(c), nb = b_numel(c);
    double *ga = malloc((size_t)na * sizeof *ga), *gb = malloc((size_t)nb * sizeof *gb);
    double *gbias = malloc((size_t)c->n * sizeof *gbias);
    cr_assert(ga && gb && gbias);
    ref_gradients(&run.ref, ga, gb, gbias);
    check_backward(&run, ga, gb, gbias, what);
    free(ga), free(gb), free(gbias);
    mm_run_free(&run);
}

static void for_each_transpose(const struct mm_case *cases, size_t n, uint64_t seed,
                               void (*run)(const struct mm_case *, bool, bool, struct test_rng *)) {
    struct test_rng rng = {seed};
    for (size_t i = 0; i < n; i++)
        for (int t = 0; t < 4; t++) run(&cases[i], t & 1, (t >> 1) & 1, &rng);
}

Test(matmul, finite_differences_all_transposes) {
    for_each_transpose(grad_cases, sizeof grad_cases / sizeof *grad_cases, 7, run_grad_case);
}

Test(matmul, large_against_float64) {
    for_each_transpose(big_cases, sizeof big_cases / sizeof *big_cases, 11, run_big_case);
}

/* The sanity check the reference itself relies on: a hand-computed product. */
Test(matmul, hand_computed) {
    float a[6] = {1, 2, 3, 4, 5, 6};        /* [2, 3] */
    float b[6] = {7, 8, 9, 10, 11, 12};     /* [3, 2] */
    float bias[2] = {0.5f, -1};
    float out[4] = {NAN, NAN, NAN, NAN};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s22[2] = {2, 2}, s2[1] = {2};
    struct tensor ta = tensor_f32(a, 2, s23), tb = tensor_f32(b, 2, s32);
    struct tensor to = tensor_f32(out, 2, s22), tbias = tensor_f32(bias, 1, s2);
    struct smelt_error err;
    TEST_OK(ops_matmul(&to, &ta, &tb, &tbias, false, false, 1, 0, &err), &err);
    double want[4] = {58.5, 63, 139.5, 153};
    test_expect_close("product", out, want, 4, 0, 0);
    /* out = 2 a b + bias + 0.5 out */
    TEST_OK(ops_matmul(&to, &ta, &tb, &tbias, false, false, 2, 0.5f, &err), &err);
    double want2[4] = {58.5 * 0.5 + 116 + 0.5, 63 * 0.5 + 128 - 1, 139.5 * 0.5 + 278 + 0.5,
                       153 * 0.5 + 308 - 1};
    test_expect_close("alpha, beta", out, want2, 4, 0, 0);
}

Test(matmul, null_gradients_are_skipped) {
    const struct mm_case c = {"partial", 2, 4, 3, 5, true, false, true, 1.0, 0.0};
    struct test_rng rng = {3};
    struct mm_run run;
    mm_run_init(&run, &c, false, true, &rng);
    int64_t na = a_numel(&c), nb = b_numel(&c);
    double *ga = malloc((size_t)na * sizeof *ga), *gb = malloc((size_t)nb * sizeof *gb);
    double *gbias = malloc((size_t)c.n * sizeof *gbias);
    cr_assert(ga && gb && gbias);
    ref_gradients(&run.ref, ga, gb, gbias);
    double *zeros = calloc((size_t)(na + nb + c.n), sizeof *zeros);
    cr_assert(zeros);
    struct smelt_error err;

    TEST_OK(ops_matmul_backward(&run.tda, NULL, NULL, &run.tw, &run.ta, &run.tb, false, true, 1,
                                &err),
            &err);
    test_expect_close("da alone", run.da, ga, na, 1e-5, 1e-5);
    test_expect_close("db untouched", run.db, zeros, nb, 0, 0);
    test_expect_close("dbias untouched", run.dbias, zeros, c.n, 0, 0);

    TEST_OK(ops_matmul_backward(NULL, &run.tdb, NULL, &run.tw, &run.ta, &run.tb, false, true, 1,
                                &err),
            &err);
    test_expect_close("db alone", run.db, gb, nb, 1e-5, 1e-5);
    test_expect_close("dbias still untouched", run.dbias, zeros, c.n, 0, 0);

    TEST_OK(ops_matmul_backward(NULL, NULL, &run.tdbias, &run.tw, &run.ta, &run.tb, false, true,
                                1, &err),
            &err);
    test_expect_close("dbias alone", run.dbias, gbias, c.n, 1e-5, 1e-5);
    test_expect_close("da once", run.da, ga, na, 1e-5, 1e-5);
    free(ga), free(gb), free(gbias), free(zeros);
    mm_run_free(&run);
}

/* k = 0: the product is empty, so out = bias (+ beta out) and only dbias gets a
 * gradient. BLAS would reject the zero leading dimensions. */
Test(matmul, empty_inner_dimension) {
    float bias[4] = {1, -2, 3, -4};
    float out[12], dout[12], dbias[4] = {0};
    for (int i = 0; i < 12; i++) out[i] = NAN, dout[i] = (float)i;
    int64_t sa[2] = {3, 0}, sb[2] = {0, 4}, so[2] = {3, 4}, sn[1] = {4};
    struct tensor ta = tensor_f32(NULL, 2, sa), tb = tensor_f32(NULL, 2, sb);
    struct tensor da = tensor_f32(NULL, 2, sa), db = tensor_f32(NULL, 2, sb);
    struct tensor to = tensor_f32(out, 2, so), td = tensor_f32(dout, 2, so);
    struct tensor tbias = tensor_f32(bias, 1, sn), tdbias = tensor_f32(dbias, 1, sn);
    struct smelt_error err;
    TEST_OK(ops_matmul(&to, &ta, &tb, &tbias, false, false, 1, 0, &err), &err);
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = bias[i % 4];
    test_expect_close("out = bias", out, want, 12, 0, 0);
    TEST_OK(ops_matmul_backward(&da, &db, &tdbias, &td, &ta, &tb, false, false, 1, &err), &err);
    double want_dbias[4] = {0 + 4 + 8, 1 + 5 + 9, 2 + 6 + 10, 3 + 7 + 11};
    test_expect_close("dbias", dbias, want_dbias, 4, 0, 0);
}

/* Same inputs, same outputs, bit for bit: forward and every gradient. */
Test(matmul, deterministic) {
    const struct mm_case c = {"repeat", 3, 70, 90, 110, true, false, true, 1.0, 0.0};
    struct test_rng rng = {5};
    struct mm_run run;
    mm_run_init(&run, &c, false, true, &rng);
    int64_t na = a_numel(&c), nb = b_numel(&c), no = out_numel(&c);
    float *first[4];
    struct smelt_error err;
    for (int rep = 0; rep < 2; rep++) {
        memset(run.da, 0, (size_t)na * sizeof *run.da);
        memset(run.db, 0, (size_t)nb * sizeof *run.db);
        memset(run.dbias, 0, (size_t)c.n * sizeof *run.dbias);
        TEST_OK(ops_matmul(&run.tout, &run.ta, &run.tb, &run.tbias, false, true, 1, 0, &err), &err);
        TEST_OK(ops_matmul_backward(&run.tda, &run.tdb, &run.tdbias, &run.tw, &run.ta, &run.tb,
                                    false, true, 1, &err),
                &err);
        float *now[4] = {run.out, run.da, run.db, run.dbias};
        int64_t sizes[4] = {no, na, nb, c.n};
        for (int i = 0; i < 4; i++) {
            if (rep == 0) {
                first[i] = malloc((size_t)sizes[i] * sizeof(float));
                cr_assert(first[i]);
                memcpy(first[i], now[i], (size_t)sizes[i] * sizeof(float));
            } else {
                cr_expect(memcmp(first[i], now[i], (size_t)sizes[i] * sizeof(float)) == 0,
                          "output %d differs between identical calls", i);
                free(first[i]);
            }
        }
    }
    mm_run_free(&run);
}

static void expect_message_has(const struct smelt_error *err, const char *a, const char *b) {
    cr_expect(strstr(err->message, a) != NULL, "message names %s: %s", a, err->message);
    if (b) cr_expect(strstr(err->message, b) != NULL, "message names %s: %s", b, err->message);
}

Test(matmul, errors) {
    float buf[256] = {0};
    int64_t s34[2] = {3, 4}, s56[2] = {5, 6}, s46[2] = {4, 6}, s35[2] = {3, 5}, s36[2] = {3, 6};
    int64_t s5[1] = {5}, s234[3] = {2, 3, 4}, s346[3] = {3, 4, 6}, s4[1] = {4};
    struct tensor a = tensor_f32(buf, 2, s34), b_bad = tensor_f32(buf, 2, s56);
    struct tensor b = tensor_f32(buf, 2, s46), out_bad = tensor_f32(buf, 2, s35);
    struct tensor out = tensor_f32(buf, 2, s36), bias_bad = tensor_f32(buf, 1, s5);
    struct tensor a3 = tensor_f32(buf, 3, s234), b3 = tensor_f32(buf, 3, s346);
    struct tensor vec = tensor_f32(buf, 1, s4);
    struct smelt_error err;

    TEST_EXPECT_ERROR(ops_matmul(&out, &a, &b_bad, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "[3, 4]", "[5, 6]");
    TEST_EXPECT_ERROR(ops_matmul(&out_bad, &a, &b, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "[3, 5]", "[3, 6]");
    TEST_EXPECT_ERROR(ops_matmul(&out, &a, &b, &bias_bad, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "bias", "[5]");
    TEST_EXPECT_ERROR(ops_matmul(&out, &a3, &b3, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "[2, 3, 4]", "[3, 4, 6]");
    /* a transposed is [4, 3]: inner 3 against b's 4 rows. */
    TEST_EXPECT_ERROR(ops_matmul(&out, &a, &b, NULL, true, false, 1, 0, &err), SMELT_EINVAL, &err);
    expect_message_has(&err, "[3, 4]", "transposed");
    TEST_EXPECT_ERROR(ops_matmul(&out, &vec, &b, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "[4]", NULL);
    TEST_EXPECT_ERROR(ops_matmul(&out, &a, NULL, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);

    struct tensor a_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, buf, 2, s34);
    TEST_EXPECT_ERROR(ops_matmul(&out, &a_bf16, &b, NULL, false, false, 1, 0, &err),
                      SMELT_EUNSUPPORTED, &err);
    expect_message_has(&err, "bf16", NULL);
    struct tensor b_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, buf, 2, s46);
    TEST_EXPECT_ERROR(ops_matmul(&out, &a, &b_bf16, NULL, false, false, 1, 0, &err), SMELT_EINVAL,
                      &err);
    expect_message_has(&err, "bf16", NULL);

    /* Backward: gradients must match their operands, dout the product. */
    TEST_EXPECT_ERROR(ops_matmul_backward(&out, NULL, NULL, &out, &a, &b, false, false, 1, &err),
                      SMELT_EINVAL, &err);
    expect_message_has(&err, "da", "[3, 6]");
    TEST_EXPECT_ERROR(ops_matmul_backward(NULL, &a, NULL, &out, &a, &b, false, false, 1, &err),
                      SMELT_EINVAL, &err);
    expect_message_has(&err, "db", "[4, 6]");
    TEST_EXPECT_ERROR(ops_matmul_backward(NULL, NULL, &bias_bad, &out, &a, &b, false, false, 1,
                                          &err),
                      SMELT_EINVAL, &err);
    expect_message_has(&err, "dbias", "[5]");
    TEST_EXPECT_ERROR(ops_matmul_backward(&a, &b, NULL, &out_bad, &a, &b, false, false, 1, &err),
                      SMELT_EINVAL, &err);
    expect_message_has(&err, "[3, 5]", "[3, 6]");
    TEST_EXPECT_ERROR(ops_matmul_backward(NULL, NULL, NULL, &out, &a, &b_bad, false, false, 1,
                                          &err),
                      SMELT_EINVAL, &err);
    expect_message_has(&err, "[3, 4]", "[5, 6]");
    struct tensor dout_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, buf, 2, s36);
    TEST_EXPECT_ERROR(ops_matmul_backward(NULL, NULL, NULL, &dout_bf16, &a, &b, false, false, 1,
                                          &err),
                      SMELT_EUNSUPPORTED, &err);
    expect_message_has(&err, "bf16", NULL);
}
