/* Every CUDA op against the CPU backend (llama.cpp's test-backend-ops idea).
 *
 * Each case draws random inputs, runs the op on the CPU backend in f32 and on CUDA in
 * f32 and in bf16, copies the CUDA results back and compares them element by element,
 * forward and backward. For a bf16 case the inputs are rounded to bf16 on the host
 * first, so both backends see identical values and the differences come only from the
 * bf16 outputs and the order of fp32 sums. Gradients start from random values on both
 * sides, so the tests also check that backward ops accumulate (+=).
 *
 * Tolerances (|got - want| <= atol + rtol |want|), stated per op:
 *  - f32 elementwise: 1e-5 relative and absolute (libm ulps, FMA contraction).
 *  - f32 reductions (matmul, norm gradients, dw/db over many rows): 1e-4, because the
 *    backends add the same terms in different orders; each sum of K terms of size ~1
 *    carries ~K * 6e-8 of rounding.
 *  - bf16 outputs: 2e-2 relative and absolute: one bf16 rounding is 2^-9 of the value,
 *    and a few of them meet in gradients accumulated into bf16 buffers of size ~1.
 *  - f32 statistics (rstd, mean, lse, logprobs) are computed in fp32 from identical
 *    inputs in both modes: 1e-5.
 * Without a CUDA device every test reports itself skipped. */
#include "tests/unit/testutil.h"

#include <string.h>

static const enum dtype gpu_dtypes[] = {DTYPE_F32, DTYPE_BF16};
#define N_GPU_DTYPES (sizeof gpu_dtypes / sizeof *gpu_dtypes)

struct tol {
    double rtol, atol;
};

static const struct tol TOL_EXACT = {0, 0};
static const struct tol TOL_F32 = {1e-5, 1e-5};
static const struct tol TOL_F32_SUM = {1e-4, 1e-4};
static const struct tol TOL_BF16 = {2e-2, 2e-2};
static const struct tol TOL_STAT = {1e-5, 1e-5};

static struct tol tol_for(enum dtype dtype, struct tol f32) { return dtype == DTYPE_BF16 ? TOL_BF16 : f32; }

static float round_to(enum dtype dtype, float x) {
    return dtype == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

/* ---- a tensor on both backends ----------------------------------------------------- */

/* The same values on the host (f32, what the CPU backend reads and writes) and on the
 * device (in `dtype`). */
struct twin {
    enum dtype dtype;
    int64_t n;
    float *host;
    struct tensor cpu, gpu;
};

static void twin_upload(struct twin *t) {
    struct smelt_error err;
    if (t->dtype == DTYPE_F32) {
        TEST_OK(tensor_copy(&t->gpu, &t->cpu, &err), &err);
        return;
    }
    uint16_t *bits = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *bits);
    cr_assert(bits);
    for (int64_t i = 0; i < t->n; i++) bits[i] = f32_to_bf16(t->host[i]);
    struct tensor staged = tensor_make(BACKEND_CPU, DTYPE_BF16, bits, t->cpu.ndim, t->cpu.shape);
    TEST_OK(tensor_copy(&t->gpu, &staged, &err), &err);
    free(bits);
}

/* Random values in [lo, hi) rounded to dtype, or zeros when rng is NULL. */
static struct twin twin_new(enum dtype dtype, int ndim, const int64_t *shape, struct test_rng *rng,
                            double lo, double hi) {
    struct twin t = {.dtype = dtype};
    struct smelt_error err;
    t.cpu = tensor_f32(NULL, ndim, shape);
    t.n = tensor_numel(&t.cpu);
    t.host = rng ? test_rand_f32(rng, t.n, lo, hi) : test_zeros_f32(t.n);
    for (int64_t i = 0; i < t.n; i++) t.host[i] = round_to(dtype, t.host[i]);
    t.cpu.data = t.host;
    TEST_OK(tensor_alloc(&t.gpu, BACKEND_CUDA, dtype, ndim, shape, &err), &err);
    twin_upload(&t);
    return t;
}

static void twin_fill(struct twin *t, float value) {
    for (int64_t i = 0; i < t->n; i++) t->host[i] = value;
    twin_upload(t);
}

/* The device values as f32 (malloc'd; the caller frees). */
static float *twin_download(const struct twin *t) {
    struct smelt_error err;
    float *out = test_zeros_f32(t->n);
    if (t->dtype == DTYPE_F32) {
        struct tensor h = tensor_f32(out, t->gpu.ndim, t->gpu.shape);
        TEST_OK(tensor_copy(&h, &t->gpu, &err), &err);
        return out;
    }
    uint16_t *bits = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *bits);
    cr_assert(bits);
    struct tensor h = tensor_make(BACKEND_CPU, DTYPE_BF16, bits, t->gpu.ndim, t->gpu.shape);
    TEST_OK(tensor_copy(&h, &t->gpu, &err), &err);
    for (int64_t i = 0; i < t->n; i++) out[i] = bf16_to_f32(bits[i]);
    free(bits);
    return out;
}

static void twin_free(struct twin *t) {
    free(t->host);
    tensor_free(&t->gpu);
}

/* Reports the worst element; NaN matches NaN (both backends must produce it). */
static void expect_close(const char *what, const float *got, const float *want, int64_t n, struct tol tol) {
    int64_t worst = -1;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) && isnan(want[i])) continue;
        double excess = fabs((double)got[i] - want[i]) - (tol.atol + tol.rtol * fabs((double)want[i]));
        if (!(excess <= 0) && (worst < 0 || !(excess <= worst_excess))) {
            worst = i;
            worst_excess = excess;
        }
    }
    cr_expect(worst < 0, "%s: element %lld of %lld is %.9g on cuda, %.9g on cpu (rtol %g, atol %g)", what,
              (long long)worst, (long long)n, worst >= 0 ? (double)got[worst] : 0.0,
              worst >= 0 ? (double)want[worst] : 0.0, tol.rtol, tol.atol);
}

/* CUDA result of t against the CPU result in t->host. */
static void twin_expect(const char *label, const char *name, const struct twin *t, struct tol tol) {
    char what[256];
    snprintf(what, sizeof what, "%s: %s", label, name);
    float *got = twin_download(t);
    expect_close(what, got, t->host, t->n, tol);
    free(got);
}

/* The device values are still those uploaded (an op that failed touched nothing). */
static void twin_expect_unchanged(const char *label, const struct twin *t) {
    float *got = twin_download(t);
    cr_expect(memcmp(got, t->host, (size_t)t->n * sizeof *got) == 0, "%s: failed call changed its output", label);
    free(got);
}

/* An i32 tensor on both backends. */
struct twin_ids {
    int32_t *host;
    struct tensor cpu, gpu;
};

static struct twin_ids ids_new(const int32_t *values, int ndim, const int64_t *shape) {
    struct twin_ids t;
    struct smelt_error err;
    t.cpu = tensor_i32(NULL, ndim, shape);
    int64_t n = tensor_numel(&t.cpu);
    t.host = malloc((size_t)(n > 0 ? n : 1) * sizeof *t.host);
    cr_assert(t.host);
    memcpy(t.host, values, (size_t)n * sizeof *t.host);
    t.cpu.data = t.host;
    TEST_OK(tensor_alloc(&t.gpu, BACKEND_CUDA, DTYPE_I32, ndim, shape, &err), &err);
    TEST_OK(tensor_copy(&t.gpu, &t.cpu, &err), &err);
    return t;
}

static void ids_free(struct twin_ids *t) {
    free(t->host);
    tensor_free(&t->gpu);
}

static int32_t *rand_ids(struct test_rng *rng, int64_t n, int32_t lo, int32_t hi) {
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    cr_assert(ids);
    for (int64_t i = 0; i < n; i++) ids[i] = lo + (int32_t)(test_rng_next(rng) % (uint64_t)(hi - lo));
    return ids;
}

/* Downloads a device tensor's raw bytes (malloc'd). */
static void *download_bytes(const struct tensor *gpu) {
    struct smelt_error err;
    size_t bytes = tensor_nbytes(gpu);
    void *out = malloc(bytes ? bytes : 1);
    cr_assert(out);
    struct tensor h = tensor_make(BACKEND_CPU, gpu->dtype, out, gpu->ndim, gpu->shape);
    TEST_OK(tensor_copy(&h, gpu, &err), &err);
    return out;
}

/* ---- memory ------------------------------------------------------------------------ */

Test(gpu_memory, alloc_copy_zero) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {1};
    int64_t shape[2] = {3, 37}, n = 3 * 37;
    struct tensor a, b;
    TEST_OK(tensor_alloc(&a, BACKEND_CUDA, DTYPE_F32, 2, shape, &err), &err);
    TEST_OK(tensor_alloc(&b, BACKEND_CUDA, DTYPE_F32, 2, shape, &err), &err);
    float *zeros = test_zeros_f32(n), *got = download_bytes(&a);
    cr_expect(memcmp(got, zeros, (size_t)n * 4) == 0, "tensor_alloc memory is not zeroed");
    free(got);

    float *x = test_rand_f32(&rng, n, -1, 1);
    struct tensor hx = tensor_f32(x, 2, shape);
    TEST_OK(tensor_copy(&a, &hx, &err), &err);
    TEST_OK(tensor_copy(&b, &a, &err), &err);
    got = download_bytes(&b);
    cr_expect(memcmp(got, x, (size_t)n * 4) == 0, "host -> device -> device -> host changed the bytes");
    free(got);

    /* Overlapping device-to-device copy: memmove semantics, as on the CPU. */
    int64_t part[1] = {n - 5};
    struct tensor dst = tensor_make(BACKEND_CUDA, DTYPE_F32, (float *)a.data + 5, 1, part);
    struct tensor src = tensor_make(BACKEND_CUDA, DTYPE_F32, a.data, 1, part);
    TEST_OK(tensor_copy(&dst, &src, &err), &err);
    memmove(x + 5, x, (size_t)(n - 5) * 4);
    got = download_bytes(&a);
    cr_expect(memcmp(got, x, (size_t)n * 4) == 0, "overlapping copy is not a memmove");
    free(got);

    TEST_OK(tensor_zero(&b, &err), &err);
    got = download_bytes(&b);
    cr_expect(memcmp(got, zeros, (size_t)n * 4) == 0, "tensor_zero left non-zero bytes");
    free(got);

    tensor_free(&a);
    tensor_free(&b);
    cr_expect(a.data == NULL, "tensor_free did not clear data");
    free(x);
    free(zeros);
}

Test(gpu_memory, out_of_memory) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    int64_t shape[1] = {(int64_t)1 << 42}; /* 16 TiB of f32 */
    struct tensor t;
    TEST_EXPECT_ERROR(tensor_alloc(&t, BACKEND_CUDA, DTYPE_F32, 1, shape, &err), SMELT_ENOMEM, &err);
    /* The failure is not left behind for the next call to report. */
    int64_t small[1] = {16};
    TEST_OK(tensor_alloc(&t, BACKEND_CUDA, DTYPE_F32, 1, small, &err), &err);
    TEST_OK(tensor_zero(&t, &err), &err);
    tensor_free(&t);
}

/* ---- casts -------------------------------------------------------------------------- */

/* Every pair of float dtypes, bit for bit equal to the CPU cast, specials included. */
Test(gpu_ops, cast) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {2};
    enum { N = 1000 };
    float *x = test_rand_f32(&rng, N, -70000, 70000);
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65520.0f, 65519.0f,
                              1e-8f, -3e-7f, 6.1e-5f, 1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, 1e38f, 3e-39f};
    memcpy(x, specials, sizeof specials);
    for (int i = (int)(sizeof specials / sizeof *specials); i < N; i += 3) x[i] *= 1e-4f; /* small values too */
    int64_t shape[1] = {N};
    const enum dtype kinds[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (int from = 0; from < 3; from++) {
        /* The source values in `from`, made on the CPU. */
        struct tensor hx = tensor_f32(x, 1, shape), src_host, src_gpu;
        TEST_OK(tensor_alloc(&src_host, BACKEND_CPU, kinds[from], 1, shape, &err), &err);
        TEST_OK(ops_cast(&src_host, &hx, &err), &err);
        TEST_OK(tensor_alloc(&src_gpu, BACKEND_CUDA, kinds[from], 1, shape, &err), &err);
        TEST_OK(tensor_copy(&src_gpu, &src_host, &err), &err);
        for (int to = 0; to < 3; to++) {
            struct tensor want, out;
            TEST_OK(tensor_alloc(&want, BACKEND_CPU, kinds[to], 1, shape, &err), &err);
            TEST_OK(tensor_alloc(&out, BACKEND_CUDA, kinds[to], 1, shape, &err), &err);
            TEST_OK(ops_cast(&want, &src_host, &err), &err);
            TEST_OK(ops_cast(&out, &src_gpu, &err), &err);
            void *got = download_bytes(&out);
            size_t bytes = tensor_nbytes(&want);
            const unsigned char *g = got, *w = want.data;
            size_t bad = bytes;
            for (size_t i = 0; i < bytes && bad == bytes; i++)
                if (g[i] != w[i]) bad = i;
            cr_expect(bad == bytes, "cast %s -> %s: byte %zu differs from the CPU (element %zu)",
                      dtype_name(kinds[from]), dtype_name(kinds[to]), bad, bad / dtype_size(kinds[to]));
            free(got);
            tensor_free(&want);
            tensor_free(&out);
        }
        tensor_free(&src_host);
        tensor_free(&src_gpu);
    }
    free(x);
}

/* ---- elementwise ---------------------------------------------------------------------- */

enum elem_op { ELEM_ADD, ELEM_SWIGLU, ELEM_GELU };

static void check_elementwise(enum elem_op which, enum dtype dtype, int64_t rows, int64_t cols) {
    struct smelt_error err;
    struct test_rng rng = {100 + (uint64_t)which * 7 + (uint64_t)cols};
    int64_t shape[2] = {rows, cols};
    char label[128];
    static const char *names[] = {"add", "swiglu", "gelu"};
    snprintf(label, sizeof label, "%s %s [%lld, %lld]", names[which], dtype_name(dtype), (long long)rows,
             (long long)cols);
    struct twin a = twin_new(dtype, 2, shape, &rng, -4, 4), b = twin_new(dtype, 2, shape, &rng, -2, 2);
    struct twin out = twin_new(dtype, 2, shape, NULL, 0, 0), dout = twin_new(dtype, 2, shape, &rng, -1, 1);
    struct twin da = twin_new(dtype, 2, shape, &rng, -1, 1), db = twin_new(dtype, 2, shape, &rng, -1, 1);
    switch (which) {
    case ELEM_ADD:
        TEST_OK(ops_add(&out.cpu, &a.cpu, &b.cpu, &err), &err);
        TEST_OK(ops_add(&out.gpu, &a.gpu, &b.gpu, &err), &err);
        TEST_OK(ops_add_backward(&da.cpu, &db.cpu, &dout.cpu, &err), &err);
        TEST_OK(ops_add_backward(&da.gpu, &db.gpu, &dout.gpu, &err), &err);
        break;
    case ELEM_SWIGLU:
        TEST_OK(ops_swiglu(&out.cpu, &a.cpu, &b.cpu, &err), &err);
        TEST_OK(ops_swiglu(&out.gpu, &a.gpu, &b.gpu, &err), &err);
        TEST_OK(ops_swiglu_backward(&da.cpu, &db.cpu, &dout.cpu, &a.cpu, &b.cpu, &err), &err);
        TEST_OK(ops_swiglu_backward(&da.gpu, &db.gpu, &dout.gpu, &a.gpu, &b.gpu, &err), &err);
        break;
    case ELEM_GELU:
        TEST_OK(ops_gelu(&out.cpu, &a.cpu, &err), &err);
        TEST_OK(ops_gelu(&out.gpu, &a.gpu, &err), &err);
        TEST_OK(ops_gelu_backward(&da.cpu, &dout.cpu, &a.cpu, &err), &err);
        TEST_OK(ops_gelu_backward(&da.gpu, &dout.gpu, &a.gpu, &err), &err);
        break;
    }
    struct tol tol = tol_for(dtype, TOL_F32);
    twin_expect(label, "out", &out, tol);
    twin_expect(label, "grad a", &da, tol);
    twin_expect(label, "grad b", &db, tol);

    /* In place: out aliases the first input. */
    if (which == ELEM_ADD) TEST_OK(ops_add(&a.gpu, &a.gpu, &b.gpu, &err), &err);
    if (which == ELEM_SWIGLU) TEST_OK(ops_swiglu(&a.gpu, &a.gpu, &b.gpu, &err), &err);
    if (which == ELEM_GELU) TEST_OK(ops_gelu(&a.gpu, &a.gpu, &err), &err);
    memcpy(a.host, out.host, (size_t)a.n * sizeof *a.host);
    twin_expect(label, "in-place out", &a, tol);

    twin_free(&a), twin_free(&b), twin_free(&out), twin_free(&dout), twin_free(&da), twin_free(&db);
}

static const int64_t elem_shapes[][2] = {{1, 1}, {3, 7}, {33, 1000}, {1, 70001}};

static void run_elementwise(enum elem_op which) {
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (size_t s = 0; s < sizeof elem_shapes / sizeof *elem_shapes; s++)
            check_elementwise(which, gpu_dtypes[d], elem_shapes[s][0], elem_shapes[s][1]);
}

Test(gpu_ops, add) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    run_elementwise(ELEM_ADD);
}

Test(gpu_ops, swiglu) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    run_elementwise(ELEM_SWIGLU);
}

Test(gpu_ops, gelu) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    run_elementwise(ELEM_GELU);
}

/* ---- matmul ------------------------------------------------------------------------- */

/* batch_a / batch_b: 0 for a 2D operand, else the batch size. */
struct matmul_case {
    int64_t batch_a, batch_b, m, k, n;
};

static const struct matmul_case matmul_cases[] = {
    {0, 0, 1, 1, 1},    {0, 0, 7, 13, 5},  {0, 0, 33, 64, 17}, /* plain 2D, odd sizes */
    {3, 3, 5, 9, 6},                                           /* both batched */
    {2, 0, 7, 16, 11},                                         /* shared b: the linear layer */
    {0, 3, 4, 6, 5},                                           /* shared a */
};

static void matmul_operand_shape(int64_t batch, int64_t rows, int64_t cols, bool trans, int *ndim,
                                 int64_t shape[3]) {
    int i = 0;
    if (batch) shape[i++] = batch;
    shape[i++] = trans ? cols : rows;
    shape[i++] = trans ? rows : cols;
    *ndim = i;
}

static void check_matmul(const struct matmul_case *mc, enum dtype dtype, bool ta, bool tb, bool with_bias,
                         float beta) {
    struct smelt_error err;
    struct test_rng rng = {200 + (uint64_t)(mc->m * 31 + mc->k * 7 + mc->n) + ta * 2 + tb};
    char label[160];
    snprintf(label, sizeof label, "matmul %s a%s[%lld: %lld x %lld] b%s[%lld: %lld x %lld]%s beta %g",
             dtype_name(dtype), ta ? "^T" : "", (long long)mc->batch_a, (long long)mc->m, (long long)mc->k,
             tb ? "^T" : "", (long long)mc->batch_b, (long long)mc->k, (long long)mc->n,
             with_bias ? " +bias" : "", beta);
    int na, nb;
    int64_t sa[3], sb[3], so[3], sbias[1] = {mc->n};
    matmul_operand_shape(mc->batch_a, mc->m, mc->k, ta, &na, sa);
    matmul_operand_shape(mc->batch_b, mc->k, mc->n, tb, &nb, sb);
    int64_t batch = mc->batch_a ? mc->batch_a : mc->batch_b;
    int no = 0;
    if (batch) so[no++] = batch;
    so[no++] = mc->m;
    so[no++] = mc->n;
    const float alpha = 0.75f;

    struct twin a = twin_new(dtype, na, sa, &rng, -1, 1), b = twin_new(dtype, nb, sb, &rng, -1, 1);
    struct twin bias = twin_new(dtype, 1, sbias, &rng, -1, 1), out = twin_new(dtype, no, so, &rng, -1, 1);
    if (beta == 0) twin_fill(&out, NAN); /* beta = 0 must ignore what out holds */
    const struct tensor *bc = with_bias ? &bias.cpu : NULL, *bg = with_bias ? &bias.gpu : NULL;
    TEST_OK(ops_matmul(&out.cpu, &a.cpu, &b.cpu, bc, ta, tb, alpha, beta, &err), &err);
    TEST_OK(ops_matmul(&out.gpu, &a.gpu, &b.gpu, bg, ta, tb, alpha, beta, &err), &err);
    twin_expect(label, "out", &out, tol_for(dtype, TOL_F32_SUM));

    struct twin dout = twin_new(dtype, no, so, &rng, -1, 1);
    struct twin da = twin_new(dtype, na, sa, &rng, -1, 1), db = twin_new(dtype, nb, sb, &rng, -1, 1);
    struct twin dbias = twin_new(dtype, 1, sbias, &rng, -1, 1);
    TEST_OK(ops_matmul_backward(&da.cpu, &db.cpu, with_bias ? &dbias.cpu : NULL, &dout.cpu, &a.cpu, &b.cpu,
                                ta, tb, alpha, &err), &err);
    TEST_OK(ops_matmul_backward(&da.gpu, &db.gpu, with_bias ? &dbias.gpu : NULL, &dout.gpu, &a.gpu, &b.gpu,
                                ta, tb, alpha, &err), &err);
    twin_expect(label, "da", &da, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "db", &db, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "dbias", &dbias, tol_for(dtype, TOL_F32_SUM));

    /* Only one gradient wanted: the other stays as it was. */
    float *db_before = twin_download(&db);
    TEST_OK(ops_matmul_backward(&da.gpu, NULL, NULL, &dout.gpu, &a.gpu, &b.gpu, ta, tb, alpha, &err), &err);
    float *db_after = twin_download(&db);
    cr_expect(memcmp(db_before, db_after, (size_t)db.n * sizeof *db_after) == 0, "%s: db changed with db NULL", label);
    free(db_before), free(db_after);

    twin_free(&a), twin_free(&b), twin_free(&bias), twin_free(&out);
    twin_free(&dout), twin_free(&da), twin_free(&db), twin_free(&dbias);
}

Test(gpu_ops, matmul) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (size_t c = 0; c < sizeof matmul_cases / sizeof *matmul_cases; c++)
            for (int t = 0; t < 4; t++) {
                bool ta = t & 1, tb = t & 2;
                bool with_bias = (c + (size_t)t) % 2 == 0;
                float beta = t == 3 ? 0.5f : 0.0f;
                check_matmul(&matmul_cases[c], gpu_dtypes[d], ta, tb, with_bias, beta);
            }
}

/* ---- embedding ------------------------------------------------------------------------ */

static void check_embedding(enum dtype dtype, int64_t vocab, int64_t rows, int64_t cols, int64_t channels) {
    struct smelt_error err;
    struct test_rng rng = {300 + (uint64_t)(vocab + channels)};
    char label[128];
    snprintf(label, sizeof label, "embedding %s V %lld ids [%lld, %lld] C %lld", dtype_name(dtype),
             (long long)vocab, (long long)rows, (long long)cols, (long long)channels);
    int64_t st[2] = {vocab, channels}, si[2] = {rows, cols}, so[3] = {rows, cols, channels};
    int32_t *idv = rand_ids(&rng, rows * cols, 0, (int32_t)vocab); /* few ids: many repeats */
    struct twin_ids ids = ids_new(idv, 2, si);
    struct twin table = twin_new(dtype, 2, st, &rng, -1, 1), out = twin_new(dtype, 3, so, NULL, 0, 0);
    TEST_OK(ops_embedding(&out.cpu, &ids.cpu, &table.cpu, &err), &err);
    TEST_OK(ops_embedding(&out.gpu, &ids.gpu, &table.gpu, &err), &err);
    twin_expect(label, "out", &out, TOL_EXACT); /* a copy of rows */

    struct twin dout = twin_new(dtype, 3, so, &rng, -1, 1), dtable = twin_new(dtype, 2, st, &rng, -1, 1);
    TEST_OK(ops_embedding_backward(&dtable.cpu, &dout.cpu, &ids.cpu, &err), &err);
    TEST_OK(ops_embedding_backward(&dtable.gpu, &dout.gpu, &ids.gpu, &err), &err);
    /* A row sums up to rows*cols tokens in a different association than the CPU. */
    twin_expect(label, "dtable", &dtable, tol_for(dtype, TOL_F32_SUM));
    ids_free(&ids), free(idv);
    twin_free(&table), twin_free(&out), twin_free(&dout), twin_free(&dtable);
}

Test(gpu_ops, embedding) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        check_embedding(gpu_dtypes[d], 1, 1, 1, 1);
        check_embedding(gpu_dtypes[d], 11, 2, 20, 7);
        check_embedding(gpu_dtypes[d], 50, 3, 33, 300);
    }
}

Test(gpu_ops, embedding_bad_ids) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {301};
    int64_t st[2] = {5, 3}, si[1] = {6}, so[2] = {6, 3};
    const int32_t bad_values[] = {5, -1, 1 << 30};
    for (size_t k = 0; k < sizeof bad_values / sizeof *bad_values; k++) {
        int32_t idv[6] = {0, 1, 4, 2, 3, 1};
        idv[4] = bad_values[k];
        struct twin_ids ids = ids_new(idv, 1, si);
        struct twin table = twin_new(DTYPE_F32, 2, st, &rng, -1, 1), out = twin_new(DTYPE_F32, 2, so, &rng, -1, 1);
        struct twin dtable = twin_new(DTYPE_F32, 2, st, &rng, -1, 1);
        TEST_EXPECT_ERROR(ops_embedding(&out.gpu, &ids.gpu, &table.gpu, &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, "position 4") != NULL, "message names the position: %s", err.message);
        twin_expect_unchanged("embedding with a bad id: out", &out);
        TEST_EXPECT_ERROR(ops_embedding_backward(&dtable.gpu, &out.gpu, &ids.gpu, &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, "position 4") != NULL, "message names the position: %s", err.message);
        twin_expect_unchanged("embedding backward with a bad id: dtable", &dtable);
        ids_free(&ids), twin_free(&table), twin_free(&out), twin_free(&dtable);
    }
}

/* ---- normalisation -------------------------------------------------------------------- */

static const int64_t norm_shapes[][2] = {{1, 1}, {5, 7}, {12, 300}, {600, 40}}; /* rows, channels */

static void check_norm(bool layer, enum dtype dtype, int64_t rows, int64_t cols) {
    struct smelt_error err;
    struct test_rng rng = {400 + (uint64_t)(rows * 3 + cols) + layer};
    char label[128];
    snprintf(label, sizeof label, "%s %s [%lld, %lld]", layer ? "layernorm" : "rmsnorm", dtype_name(dtype),
             (long long)rows, (long long)cols);
    int64_t sx[2] = {rows, cols}, sw[1] = {cols}, sr[1] = {rows};
    const float eps = 1e-5f;
    struct twin x = twin_new(dtype, 2, sx, &rng, -2, 2), w = twin_new(dtype, 1, sw, &rng, 0.5, 1.5);
    struct twin b = twin_new(dtype, 1, sw, &rng, -1, 1), y = twin_new(dtype, 2, sx, NULL, 0, 0);
    struct twin mean = twin_new(DTYPE_F32, 1, sr, NULL, 0, 0), rstd = twin_new(DTYPE_F32, 1, sr, NULL, 0, 0);
    if (layer) {
        TEST_OK(ops_layernorm(&y.cpu, &mean.cpu, &rstd.cpu, &x.cpu, &w.cpu, &b.cpu, eps, &err), &err);
        TEST_OK(ops_layernorm(&y.gpu, &mean.gpu, &rstd.gpu, &x.gpu, &w.gpu, &b.gpu, eps, &err), &err);
        twin_expect(label, "mean", &mean, TOL_STAT);
    } else {
        TEST_OK(ops_rmsnorm(&y.cpu, &rstd.cpu, &x.cpu, &w.cpu, eps, &err), &err);
        TEST_OK(ops_rmsnorm(&y.gpu, &rstd.gpu, &x.gpu, &w.gpu, eps, &err), &err);
    }
    twin_expect(label, "y", &y, tol_for(dtype, TOL_F32));
    twin_expect(label, "rstd", &rstd, TOL_STAT);

    /* The backward reads the CPU's statistics on both sides, so it is tested alone. */
    twin_upload(&mean), twin_upload(&rstd);
    struct twin dy = twin_new(dtype, 2, sx, &rng, -1, 1), dx = twin_new(dtype, 2, sx, &rng, -1, 1);
    struct twin dw = twin_new(dtype, 1, sw, &rng, -1, 1), db = twin_new(dtype, 1, sw, &rng, -1, 1);
    if (layer) {
        TEST_OK(ops_layernorm_backward(&dx.cpu, &dw.cpu, &db.cpu, &dy.cpu, &x.cpu, &w.cpu, &mean.cpu, &rstd.cpu, &err), &err);
        TEST_OK(ops_layernorm_backward(&dx.gpu, &dw.gpu, &db.gpu, &dy.gpu, &x.gpu, &w.gpu, &mean.gpu, &rstd.gpu, &err), &err);
        twin_expect(label, "db", &db, tol_for(dtype, TOL_F32_SUM));
    } else {
        TEST_OK(ops_rmsnorm_backward(&dx.cpu, &dw.cpu, &dy.cpu, &x.cpu, &w.cpu, &rstd.cpu, &err), &err);
        TEST_OK(ops_rmsnorm_backward(&dx.gpu, &dw.gpu, &dy.gpu, &x.gpu, &w.gpu, &rstd.gpu, &err), &err);
    }
    twin_expect(label, "dx", &dx, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "dw", &dw, tol_for(dtype, TOL_F32_SUM));

    /* In place (y aliases x) matches the out-of-place CPU result. */
    if (layer) TEST_OK(ops_layernorm(&x.gpu, NULL, NULL, &x.gpu, &w.gpu, &b.gpu, eps, &err), &err);
    else TEST_OK(ops_rmsnorm(&x.gpu, NULL, &x.gpu, &w.gpu, eps, &err), &err);
    memcpy(x.host, y.host, (size_t)x.n * sizeof *x.host);
    twin_expect(label, "in-place y", &x, tol_for(dtype, TOL_F32));

    twin_free(&x), twin_free(&w), twin_free(&b), twin_free(&y), twin_free(&mean), twin_free(&rstd);
    twin_free(&dy), twin_free(&dx), twin_free(&dw), twin_free(&db);
}

Test(gpu_ops, rmsnorm) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
            check_norm(false, gpu_dtypes[d], norm_shapes[s][0], norm_shapes[s][1]);
}

Test(gpu_ops, layernorm) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (size_t s = 0; s < sizeof norm_shapes / sizeof *norm_shapes; s++)
            check_norm(true, gpu_dtypes[d], norm_shapes[s][0], norm_shapes[s][1]);
}

/* ---- rope ------------------------------------------------------------------------------- */

static void check_rope(enum dtype dtype, int64_t tokens, int64_t heads, int64_t dim, float theta, int32_t max_pos) {
    struct smelt_error err;
    struct test_rng rng = {500 + (uint64_t)(tokens + heads + dim)};
    char label[128];
    snprintf(label, sizeof label, "rope %s [%lld, %lld, %lld] theta %g", dtype_name(dtype), (long long)tokens,
             (long long)heads, (long long)dim, theta);
    int64_t sx[3] = {tokens, heads, dim}, sp[1] = {tokens};
    int32_t *pv = rand_ids(&rng, tokens, 0, max_pos);
    struct twin_ids pos = ids_new(pv, 1, sp);
    struct twin x = twin_new(dtype, 3, sx, &rng, -2, 2), y = twin_new(dtype, 3, sx, NULL, 0, 0);
    TEST_OK(ops_rope(&y.cpu, &x.cpu, &pos.cpu, theta, &err), &err);
    TEST_OK(ops_rope(&y.gpu, &x.gpu, &pos.gpu, theta, &err), &err);
    /* Same f32 angles; sin/cos within 2 ulp of glibc's. */
    twin_expect(label, "y", &y, tol_for(dtype, TOL_F32));

    struct twin dy = twin_new(dtype, 3, sx, &rng, -1, 1), dx = twin_new(dtype, 3, sx, &rng, -1, 1);
    TEST_OK(ops_rope_backward(&dx.cpu, &dy.cpu, &pos.cpu, theta, &err), &err);
    TEST_OK(ops_rope_backward(&dx.gpu, &dy.gpu, &pos.gpu, theta, &err), &err);
    twin_expect(label, "dx", &dx, tol_for(dtype, TOL_F32));

    TEST_OK(ops_rope(&x.gpu, &x.gpu, &pos.gpu, theta, &err), &err);
    memcpy(x.host, y.host, (size_t)x.n * sizeof *x.host);
    twin_expect(label, "in-place y", &x, tol_for(dtype, TOL_F32));
    ids_free(&pos), free(pv);
    twin_free(&x), twin_free(&y), twin_free(&dy), twin_free(&dx);
}

Test(gpu_ops, rope) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        check_rope(gpu_dtypes[d], 1, 1, 2, 10000.0f, 1);
        check_rope(gpu_dtypes[d], 5, 3, 8, 10000.0f, 64);
        check_rope(gpu_dtypes[d], 7, 2, 130, 1000000.0f, 40000); /* long contexts: large angles */
    }
}

/* A scaled table (model/rope.c: llama3, yarn) and yarn's factor on cos and sin. */
Test(gpu_ops, rope_scaled_table) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {502};
    int64_t sx[3] = {9, 3, 16}, sp[1] = {9};
    float inv_freq[8];
    ops_rope_default_freqs(inv_freq, 16, 500000.0f);
    for (int i = 4; i < 8; i++) inv_freq[i] /= 8.0f;
    struct ops_rope_freqs f = {inv_freq, 8, 1.1386294f};
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        int32_t *pv = rand_ids(&rng, 9, 0, 9000);
        struct twin_ids pos = ids_new(pv, 1, sp);
        struct twin x = twin_new(gpu_dtypes[d], 3, sx, &rng, -2, 2), y = twin_new(gpu_dtypes[d], 3, sx, NULL, 0, 0);
        TEST_OK(ops_rope_with(&y.cpu, &x.cpu, &pos.cpu, &f, &err), &err);
        TEST_OK(ops_rope_with(&y.gpu, &x.gpu, &pos.gpu, &f, &err), &err);
        twin_expect("rope scaled table", "y", &y, tol_for(gpu_dtypes[d], TOL_F32));
        struct twin dy = twin_new(gpu_dtypes[d], 3, sx, &rng, -1, 1), dx = twin_new(gpu_dtypes[d], 3, sx, &rng, -1, 1);
        TEST_OK(ops_rope_with_backward(&dx.cpu, &dy.cpu, &pos.cpu, &f, &err), &err);
        TEST_OK(ops_rope_with_backward(&dx.gpu, &dy.gpu, &pos.gpu, &f, &err), &err);
        twin_expect("rope scaled table", "dx", &dx, tol_for(gpu_dtypes[d], TOL_F32));
        ids_free(&pos), free(pv);
        twin_free(&x), twin_free(&y), twin_free(&dy), twin_free(&dx);
    }
}

Test(gpu_ops, rope_negative_position) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {501};
    int64_t sx[3] = {4, 2, 6}, sp[1] = {4};
    int32_t pv[4] = {0, 1, -3, 2};
    struct twin_ids pos = ids_new(pv, 1, sp);
    struct twin x = twin_new(DTYPE_F32, 3, sx, &rng, -1, 1), y = twin_new(DTYPE_F32, 3, sx, &rng, -1, 1);
    TEST_EXPECT_ERROR(ops_rope(&y.gpu, &x.gpu, &pos.gpu, 10000.0f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "positions[2]") != NULL, "message names the position: %s", err.message);
    twin_expect_unchanged("rope with a negative position: y", &y);
    TEST_EXPECT_ERROR(ops_rope_backward(&y.gpu, &x.gpu, &pos.gpu, 10000.0f, &err), SMELT_EINVAL, &err);
    twin_expect_unchanged("rope backward with a negative position: dx", &y);
    ids_free(&pos), twin_free(&x), twin_free(&y);
}

/* ---- logprobs ---------------------------------------------------------------------------- */

static void check_logprobs(enum dtype dtype, int64_t rows, int64_t vocab) {
    struct smelt_error err;
    struct test_rng rng = {600 + (uint64_t)(rows + vocab)};
    char label[128];
    snprintf(label, sizeof label, "logprobs %s [%lld, %lld]", dtype_name(dtype), (long long)rows, (long long)vocab);
    int64_t sl[2] = {rows, vocab}, sr[1] = {rows};
    int32_t *tv = rand_ids(&rng, rows, 0, (int32_t)vocab);
    for (int64_t r = 1; r < rows; r += 3) tv[r] = -1; /* no target: logprob 0, no gradient */
    struct twin_ids targets = ids_new(tv, 1, sr);
    struct twin logits = twin_new(dtype, 2, sl, &rng, -8, 8);
    struct twin lp = twin_new(DTYPE_F32, 1, sr, NULL, 0, 0), lse = twin_new(DTYPE_F32, 1, sr, NULL, 0, 0);
    TEST_OK(ops_logprobs(&lp.cpu, &lse.cpu, &logits.cpu, &targets.cpu, &err), &err);
    TEST_OK(ops_logprobs(&lp.gpu, &lse.gpu, &logits.gpu, &targets.gpu, &err), &err);
    twin_expect(label, "logprobs", &lp, TOL_STAT);
    twin_expect(label, "lse", &lse, TOL_STAT);

    twin_upload(&lse); /* the backward reads the CPU's lse on both sides */
    struct twin dlp = twin_new(DTYPE_F32, 1, sr, &rng, -1, 1), dlogits = twin_new(dtype, 2, sl, &rng, -1, 1);
    TEST_OK(ops_logprobs_backward(&dlogits.cpu, &dlp.cpu, &logits.cpu, &targets.cpu, &lse.cpu, &err), &err);
    TEST_OK(ops_logprobs_backward(&dlogits.gpu, &dlp.gpu, &logits.gpu, &targets.gpu, &lse.gpu, &err), &err);
    twin_expect(label, "dlogits", &dlogits, tol_for(dtype, TOL_F32));
    ids_free(&targets), free(tv);
    twin_free(&logits), twin_free(&lp), twin_free(&lse), twin_free(&dlp), twin_free(&dlogits);
}

Test(gpu_ops, logprobs) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        check_logprobs(gpu_dtypes[d], 1, 1);
        check_logprobs(gpu_dtypes[d], 5, 7);
        check_logprobs(gpu_dtypes[d], 9, 1000);
        check_logprobs(gpu_dtypes[d], 3, 50257); /* GPT-2's vocabulary: many elements a thread */
    }
}

Test(gpu_ops, logprobs_bad_targets) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {601};
    int64_t sl[2] = {4, 9}, sr[1] = {4};
    int32_t tv[4] = {0, -1, 9, 3}; /* 9 == V */
    struct twin_ids targets = ids_new(tv, 1, sr);
    struct twin logits = twin_new(DTYPE_F32, 2, sl, &rng, -1, 1), lp = twin_new(DTYPE_F32, 1, sr, &rng, -1, 1);
    struct twin lse = twin_new(DTYPE_F32, 1, sr, &rng, -1, 1), dlogits = twin_new(DTYPE_F32, 2, sl, &rng, -1, 1);
    TEST_EXPECT_ERROR(ops_logprobs(&lp.gpu, &lse.gpu, &logits.gpu, &targets.gpu, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "row 2") != NULL, "message names the row: %s", err.message);
    twin_expect_unchanged("logprobs with a bad target: logprobs", &lp);
    TEST_EXPECT_ERROR(ops_logprobs_backward(&dlogits.gpu, &lp.gpu, &logits.gpu, &targets.gpu, &lse.gpu, &err),
                      SMELT_EINVAL, &err);
    twin_expect_unchanged("logprobs backward with a bad target: dlogits", &dlogits);
    ids_free(&targets), twin_free(&logits), twin_free(&lp), twin_free(&lse), twin_free(&dlogits);
}

/* ---- optimizer and reductions ------------------------------------------------------------ */

Test(gpu_ops, adamw) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {700};
    const int64_t sizes[] = {1, 1000, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t shape[1] = {sizes[s]};
        char label[64];
        snprintf(label, sizeof label, "adamw [%lld]", (long long)sizes[s]);
        struct twin p = twin_new(DTYPE_F32, 1, shape, &rng, -1, 1), m = twin_new(DTYPE_F32, 1, shape, &rng, -0.1, 0.1);
        struct twin v = twin_new(DTYPE_F32, 1, shape, &rng, 0, 0.01), g = twin_new(DTYPE_F32, 1, shape, &rng, -1, 1);
        struct adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 3};
        for (int step = 0; step < 2; step++, cfg.step++) {
            TEST_OK(ops_adamw(&p.cpu, &m.cpu, &v.cpu, &g.cpu, &cfg, &err), &err);
            TEST_OK(ops_adamw(&p.gpu, &m.gpu, &v.gpu, &g.gpu, &cfg, &err), &err);
        }
        /* Same formula in f32; the device fuses some multiply-adds. */
        twin_expect(label, "params", &p, (struct tol){1e-5, 1e-7});
        twin_expect(label, "m", &m, (struct tol){1e-5, 1e-7});
        twin_expect(label, "v", &v, (struct tol){1e-5, 1e-9});
        twin_free(&p), twin_free(&m), twin_free(&v), twin_free(&g);
    }
}

Test(gpu_ops, sum_squares) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {800};
    const int64_t sizes[] = {1, 1000, 300001, 5000000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t shape[1] = {sizes[s]};
        struct twin x = twin_new(DTYPE_F32, 1, shape, &rng, -3, 3);
        double want, got, again;
        TEST_OK(ops_sum_squares(&want, &x.cpu, &err), &err);
        TEST_OK(ops_sum_squares(&got, &x.gpu, &err), &err);
        TEST_OK(ops_sum_squares(&again, &x.gpu, &err), &err);
        /* Exact squares summed in double in another order: ~n * 1e-16 relative. */
        cr_expect(fabs(got - want) <= 1e-9 * fabs(want), "sum_squares [%lld]: cuda %.17g, cpu %.17g",
                  (long long)sizes[s], got, want);
        cr_expect(memcmp(&got, &again, sizeof got) == 0, "sum_squares [%lld] differs between runs",
                  (long long)sizes[s]);
        twin_free(&x);
    }
}

/* ---- determinism ------------------------------------------------------------------------- */

/* The reductions that would be tempting to do with atomics give the same bits twice. */
Test(gpu_ops, deterministic_reductions) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {900};
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        enum dtype dtype = gpu_dtypes[d];
        /* Embedding backward with heavily repeated ids. */
        int64_t st[2] = {3, 64}, si[1] = {5000}, so[2] = {5000, 64};
        int32_t *idv = rand_ids(&rng, 5000, 0, 3);
        struct twin_ids ids = ids_new(idv, 1, si);
        struct twin dout = twin_new(dtype, 2, so, &rng, -1, 1);
        struct twin t1 = twin_new(dtype, 2, st, NULL, 0, 0), t2 = twin_new(dtype, 2, st, NULL, 0, 0);
        TEST_OK(ops_embedding_backward(&t1.gpu, &dout.gpu, &ids.gpu, &err), &err);
        TEST_OK(ops_embedding_backward(&t2.gpu, &dout.gpu, &ids.gpu, &err), &err);
        void *b1 = download_bytes(&t1.gpu), *b2 = download_bytes(&t2.gpu);
        cr_expect(memcmp(b1, b2, tensor_nbytes(&t1.gpu)) == 0, "embedding backward %s differs between runs",
                  dtype_name(dtype));
        free(b1), free(b2);

        /* LayerNorm dw, db over many rows (several column-sum chunks) and matmul dbias. */
        int64_t sx[2] = {3000, 48}, sw[1] = {48}, sr[1] = {3000};
        struct twin x = twin_new(dtype, 2, sx, &rng, -2, 2), w = twin_new(dtype, 1, sw, &rng, 0.5, 1.5);
        struct twin dy = twin_new(dtype, 2, sx, &rng, -1, 1);
        struct twin mean = twin_new(DTYPE_F32, 1, sr, &rng, -0.1, 0.1), rstd = twin_new(DTYPE_F32, 1, sr, &rng, 0.5, 2);
        struct twin dw1 = twin_new(dtype, 1, sw, NULL, 0, 0), dw2 = twin_new(dtype, 1, sw, NULL, 0, 0);
        struct twin db1 = twin_new(dtype, 1, sw, NULL, 0, 0), db2 = twin_new(dtype, 1, sw, NULL, 0, 0);
        TEST_OK(ops_layernorm_backward(NULL, &dw1.gpu, &db1.gpu, &dy.gpu, &x.gpu, &w.gpu, &mean.gpu, &rstd.gpu, &err), &err);
        TEST_OK(ops_layernorm_backward(NULL, &dw2.gpu, &db2.gpu, &dy.gpu, &x.gpu, &w.gpu, &mean.gpu, &rstd.gpu, &err), &err);
        b1 = download_bytes(&dw1.gpu), b2 = download_bytes(&dw2.gpu);
        cr_expect(memcmp(b1, b2, tensor_nbytes(&dw1.gpu)) == 0, "layernorm dw %s differs between runs", dtype_name(dtype));
        free(b1), free(b2);
        b1 = download_bytes(&db1.gpu), b2 = download_bytes(&db2.gpu);
        cr_expect(memcmp(b1, b2, tensor_nbytes(&db1.gpu)) == 0, "layernorm db %s differs between runs", dtype_name(dtype));
        free(b1), free(b2);

        int64_t sb[2] = {48, 48};
        struct twin wm = twin_new(dtype, 2, sb, &rng, -1, 1);
        struct twin dbias1 = twin_new(dtype, 1, sw, NULL, 0, 0), dbias2 = twin_new(dtype, 1, sw, NULL, 0, 0);
        TEST_OK(ops_matmul_backward(NULL, NULL, &dbias1.gpu, &dy.gpu, &x.gpu, &wm.gpu, false, false, 1.0f, &err), &err);
        TEST_OK(ops_matmul_backward(NULL, NULL, &dbias2.gpu, &dy.gpu, &x.gpu, &wm.gpu, false, false, 1.0f, &err), &err);
        b1 = download_bytes(&dbias1.gpu), b2 = download_bytes(&dbias2.gpu);
        cr_expect(memcmp(b1, b2, tensor_nbytes(&dbias1.gpu)) == 0, "matmul dbias %s differs between runs", dtype_name(dtype));
        free(b1), free(b2);

        ids_free(&ids), free(idv);
        twin_free(&dout), twin_free(&t1), twin_free(&t2), twin_free(&x), twin_free(&w), twin_free(&dy);
        twin_free(&mean), twin_free(&rstd), twin_free(&dw1), twin_free(&dw2), twin_free(&db1), twin_free(&db2);
        twin_free(&wm), twin_free(&dbias1), twin_free(&dbias2);
    }
}

/* ---- argmax ------------------------------------------------------------------------------ */

/* Random rows (plus planted ties, NaN and -inf rows) give the CPU's ids exactly, in both
 * storage dtypes: bf16 rounding makes ties common, which tests the smallest-index rule. */
Test(gpu_ops, argmax) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    static const int64_t vocabs[] = {1, 5, 33, 1000, 151936};
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) {
            int64_t vocab = vocabs[i], rows = vocab > 1000 ? 3 : 9, shape[2] = {rows, vocab}, n = rows;
            struct test_rng rng = {700 + (uint64_t)i};
            struct twin x = twin_new(gpu_dtypes[d], 2, shape, &rng, -3, 3);
            if (vocab >= 5) {
                x.host[0 * vocab + vocab - 1] = x.host[0 * vocab + 2] = 9.0f; /* tie: index 2 */
                for (int64_t v = 0; v < vocab; v++) x.host[1 * vocab + v] = v % 3 ? NAN : -1.0f;
                for (int64_t v = 0; v < vocab; v++) x.host[2 * vocab + v] = -INFINITY;
                twin_upload(&x);
            }
            int32_t *zeros = calloc((size_t)rows, sizeof *zeros);
            cr_assert(zeros);
            struct twin_ids ids = ids_new(zeros, 1, &n);
            TEST_OK(ops_argmax(&ids.cpu, &x.cpu, &err), &err);
            TEST_OK(ops_argmax(&ids.gpu, &x.gpu, &err), &err);
            int32_t *got = download_bytes(&ids.gpu);
            for (int64_t r = 0; r < rows; r++)
                cr_expect_eq(got[r], ids.host[r], "argmax %s V %lld row %lld: %d on cuda, %d on cpu",
                             dtype_name(gpu_dtypes[d]), (long long)vocab, (long long)r, got[r], ids.host[r]);
            free(got), free(zeros);
            twin_free(&x), ids_free(&ids);
        }
}

/* ---- fused attention ----------------------------------------------------------------------- */

/* Packed causal attention, forward and backward, against the CPU's: out within
 * TOL_F32_SUM (online softmax over tiles vs the CPU's two passes), lse TOL_STAT, and the
 * gradients (accumulated into random starting values) TOL_F32_SUM, or TOL_BF16. The
 * sequence lengths straddle the kernels' tiles (16 x R query rows, 32 keys); an empty
 * sequence and a single token are included. CUDA also gives the same bits twice. */
static void check_attention(enum dtype dtype, int64_t hq, int64_t hkv, int64_t dim, int nseq, const int32_t *len) {
    struct smelt_error err;
    struct test_rng rng = {3000 + (uint64_t)(hq * 31 + hkv * 7 + dim + nseq)};
    char label[160];
    snprintf(label, sizeof label, "attention %s Hq %lld Hkv %lld D %lld, %d sequences", dtype_name(dtype),
             (long long)hq, (long long)hkv, (long long)dim, nseq);
    int32_t cu[17] = {0};
    cr_assert(nseq <= 16);
    for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + len[s];
    int64_t tokens = cu[nseq], sq[3] = {tokens, hq, dim}, skv[3] = {tokens, hkv, dim}, slse[2] = {tokens, hq};
    int64_t scu[1] = {nseq + 1};
    struct tensor tcu = tensor_i32(cu, 1, scu);
    float scale = 1.0f / sqrtf((float)dim);
    struct twin q = twin_new(dtype, 3, sq, &rng, -2, 2), k = twin_new(dtype, 3, skv, &rng, -2, 2);
    struct twin v = twin_new(dtype, 3, skv, &rng, -1, 1), dout = twin_new(dtype, 3, sq, &rng, -1, 1);
    struct twin out = twin_new(dtype, 3, sq, NULL, 0, 0), lse = twin_new(DTYPE_F32, 2, slse, NULL, 0, 0);
    struct twin dq = twin_new(dtype, 3, sq, &rng, -1, 1), dk = twin_new(dtype, 3, skv, &rng, -1, 1);
    struct twin dv = twin_new(dtype, 3, skv, &rng, -1, 1);
    twin_fill(&out, NAN); /* every element must be written */

    TEST_OK(ops_attention(&out.cpu, &lse.cpu, &q.cpu, &k.cpu, &v.cpu, &tcu, scale, &err), &err);
    TEST_OK(ops_attention(&out.gpu, &lse.gpu, &q.gpu, &k.gpu, &v.gpu, &tcu, scale, &err), &err);
    twin_expect(label, "out", &out, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "lse", &lse, TOL_STAT);
    void *first = download_bytes(&out.gpu);
    TEST_OK(ops_attention(&out.gpu, &lse.gpu, &q.gpu, &k.gpu, &v.gpu, &tcu, scale, &err), &err);
    void *again = download_bytes(&out.gpu);
    cr_expect(memcmp(first, again, tensor_nbytes(&out.gpu)) == 0, "%s: out differs between runs", label);
    free(first), free(again);

    /* The backward reads the forward's out and lse: give both backends the CPU's (the
     * bf16 device copy rounded), so the gradients differ only by the backward itself. */
    twin_upload(&out);
    twin_upload(&lse);
    TEST_OK(ops_attention_backward(&dq.cpu, &dk.cpu, &dv.cpu, &dout.cpu, &q.cpu, &k.cpu, &v.cpu, &out.cpu, &lse.cpu,
                                   &tcu, scale, &err), &err);
    TEST_OK(ops_attention_backward(&dq.gpu, &dk.gpu, &dv.gpu, &dout.gpu, &q.gpu, &k.gpu, &v.gpu, &out.gpu, &lse.gpu,
                                   &tcu, scale, &err), &err);
    twin_expect(label, "dq", &dq, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "dk", &dk, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "dv", &dv, tol_for(dtype, TOL_F32_SUM));

    /* Only some gradients wanted: the others are NULL and the given ones still right. */
    twin_upload(&dk);
    twin_upload(&dv);
    TEST_OK(ops_attention_backward(NULL, &dk.cpu, NULL, &dout.cpu, &q.cpu, &k.cpu, &v.cpu, &out.cpu, &lse.cpu, &tcu,
                                   scale, &err), &err);
    TEST_OK(ops_attention_backward(NULL, &dk.gpu, NULL, &dout.gpu, &q.gpu, &k.gpu, &v.gpu, &out.gpu, &lse.gpu, &tcu,
                                   scale, &err), &err);
    twin_expect(label, "dk alone", &dk, tol_for(dtype, TOL_F32_SUM));
    twin_expect(label, "dv untouched", &dv, TOL_EXACT);

    twin_free(&q), twin_free(&k), twin_free(&v), twin_free(&dout), twin_free(&out), twin_free(&lse);
    twin_free(&dq), twin_free(&dk), twin_free(&dv);
}

Test(gpu_ops, attention) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    static const int32_t mixed[] = {33, 0, 1, 64, 70, 5}, long_seqs[] = {300, 257};
    for (size_t d = 0; d < N_GPU_DTYPES; d++) {
        check_attention(gpu_dtypes[d], 4, 2, 8, 6, mixed);    /* GQA, tiny head */
        check_attention(gpu_dtypes[d], 3, 3, 40, 6, mixed);   /* D not a multiple of 8 */
        check_attention(gpu_dtypes[d], 14, 2, 64, 2, long_seqs); /* Qwen2-0.5B heads */
        check_attention(gpu_dtypes[d], 12, 2, 128, 2, long_seqs); /* Qwen2-1.5B heads */
        check_attention(gpu_dtypes[d], 4, 1, 200, 6, mixed);  /* the 256 bound, MQA */
    }
}

Test(gpu_ops, attention_head_dim_above_256) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    int32_t cu[2] = {0, 3};
    int64_t s[3] = {3, 2, 300}, slse[2] = {3, 2}, scu[1] = {2};
    struct tensor tcu = tensor_i32(cu, 1, scu);
    struct twin q = twin_new(DTYPE_F32, 3, s, NULL, 0, 0), out = twin_new(DTYPE_F32, 3, s, NULL, 0, 0);
    struct twin lse = twin_new(DTYPE_F32, 2, slse, NULL, 0, 0);
    TEST_EXPECT_ERROR(ops_attention(&out.gpu, &lse.gpu, &q.gpu, &q.gpu, &q.gpu, &tcu, 0.1f, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "head_dim 300") != NULL, "message: %s", err.message);
    twin_free(&q), twin_free(&out), twin_free(&lse);
}

/* ---- paged KV cache ------------------------------------------------------------------------ */

/* Sequences s of context len[s] whose last n[s] tokens are new: those are appended to
 * a pool of random "old" values through shuffled block tables (plus one padding token
 * with slot -1), on both backends; the caches must then agree bit for bit, and the
 * paged attention of the new tokens within TOL_F32_SUM (the CPU takes a two-pass
 * softmax, CUDA an online one merged across warps) or TOL_BF16. CUDA also gives the
 * same bits twice. */
static void check_paged(enum dtype dtype, int64_t block_size, int64_t hq, int64_t hkv, int64_t dim, int nseq,
                        const int32_t *len, const int32_t *n) {
    struct smelt_error err;
    struct test_rng rng = {1000 + (uint64_t)(block_size * 7 + hq * 5 + dim + len[0])};
    char label[160];
    snprintf(label, sizeof label, "paged %s block_size %lld Hq %lld Hkv %lld D %lld, %d sequences, first %d/%d",
             dtype_name(dtype), (long long)block_size, (long long)hq, (long long)hkv, (long long)dim, nseq, n[0],
             len[0]);
    int64_t used = 0, max_blocks = 1, tokens = 0;
    for (int s = 0; s < nseq; s++) {
        int64_t b = (len[s] + block_size - 1) / block_size;
        used += b;
        if (b + 1 > max_blocks) max_blocks = b + 1;
        tokens += n[s];
    }
    int64_t n_blocks = used + 2;
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm), *tables = malloc((size_t)(nseq * max_blocks) * sizeof *tables);
    int32_t *slots = malloc((size_t)(tokens + 1) * sizeof *slots), cu_q[9] = {0}, ctx[8];
    cr_assert(perm && tables && slots && nseq <= 8);
    memcpy(ctx, len, (size_t)nseq * sizeof *ctx);
    for (int64_t i = 0; i < n_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(test_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int s = 0, next = 0; s < nseq; s++) {
        int64_t b = (len[s] + block_size - 1) / block_size;
        for (int64_t j = 0; j < max_blocks; j++) tables[s * max_blocks + j] = j < b ? perm[next++] : -1;
        cu_q[s + 1] = cu_q[s] + n[s];
        for (int32_t i = 0; i < n[s]; i++) {
            int32_t p = len[s] - n[s] + i;
            slots[cu_q[s] + i] = tables[s * max_blocks + p / block_size] * (int32_t)block_size + p % (int32_t)block_size;
        }
    }
    slots[tokens] = -1;

    int64_t scache[4] = {n_blocks, block_size, hkv, dim}, skv[3] = {tokens + 1, hkv, dim}, sslots[1] = {tokens + 1};
    int64_t sq[3] = {tokens, hq, dim}, stab[2] = {nseq, max_blocks}, scu[1] = {nseq + 1}, sctx[1] = {nseq};
    struct twin k_cache = twin_new(dtype, 4, scache, &rng, -2, 2), v_cache = twin_new(dtype, 4, scache, &rng, -1, 1);
    struct twin k = twin_new(dtype, 3, skv, &rng, -2, 2), v = twin_new(dtype, 3, skv, &rng, -1, 1);
    struct twin_ids slot_mapping = ids_new(slots, 1, sslots), block_tables = ids_new(tables, 2, stab);
    TEST_OK(ops_kv_append(&k_cache.cpu, &v_cache.cpu, &k.cpu, &v.cpu, &slot_mapping.cpu, &err), &err);
    TEST_OK(ops_kv_append(&k_cache.gpu, &v_cache.gpu, &k.gpu, &v.gpu, &slot_mapping.gpu, &err), &err);
    twin_expect(label, "k_cache after append", &k_cache, TOL_EXACT);
    twin_expect(label, "v_cache after append", &v_cache, TOL_EXACT);

    struct twin q = twin_new(dtype, 3, sq, &rng, -2, 2), out = twin_new(dtype, 3, sq, NULL, 0, 0);
    struct tensor tcu = tensor_i32(cu_q, 1, scu), tctx = tensor_i32(ctx, 1, sctx);
    float scale = 1.0f / sqrtf((float)dim);
    TEST_OK(ops_paged_attention(&out.cpu, &q.cpu, &k_cache.cpu, &v_cache.cpu, &block_tables.cpu, &tcu, &tctx, scale, &err), &err);
    TEST_OK(ops_paged_attention(&out.gpu, &q.gpu, &k_cache.gpu, &v_cache.gpu, &block_tables.gpu, &tcu, &tctx, scale, &err), &err);
    twin_expect(label, "out", &out, tol_for(dtype, TOL_F32_SUM));
    void *first = download_bytes(&out.gpu);
    TEST_OK(ops_paged_attention(&out.gpu, &q.gpu, &k_cache.gpu, &v_cache.gpu, &block_tables.gpu, &tcu, &tctx, scale, &err), &err);
    void *again = download_bytes(&out.gpu);
    cr_expect(memcmp(first, again, tensor_nbytes(&out.gpu)) == 0, "%s: out differs between runs", label);
    free(first), free(again);

    twin_free(&k_cache), twin_free(&v_cache), twin_free(&k), twin_free(&v), twin_free(&q), twin_free(&out);
    ids_free(&slot_mapping), ids_free(&block_tables);
    free(perm), free(tables), free(slots);
}

Test(gpu_ops, paged_attention) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    static const int32_t len[] = {7, 0, 37, 1, 300}, prefill[] = {7, 0, 37, 1, 300};
    static const int32_t chunk[] = {3, 0, 20, 1, 64}, decode[] = {1, 0, 1, 1, 1};
    const int32_t *queries[] = {prefill, chunk, decode};
    for (size_t d = 0; d < N_GPU_DTYPES; d++)
        for (int kind = 0; kind < 3; kind++) {
            check_paged(gpu_dtypes[d], 16, 4, 2, 8, 5, len, queries[kind]);
            check_paged(gpu_dtypes[d], 4, 2, 2, 16, 5, len, queries[kind]);
            check_paged(gpu_dtypes[d], 16, 8, 2, 64, 5, len, queries[kind]);
            check_paged(gpu_dtypes[d], 5, 6, 3, 40, 5, len, queries[kind]); /* D not a multiple of 32 */
            check_paged(gpu_dtypes[d], 32, 14, 2, 128, 5, len, queries[kind]);
        }
    /* A long decode: many keys a warp. */
    static const int32_t long_len[] = {2000, 513}, long_decode[] = {1, 1};
    for (size_t d = 0; d < N_GPU_DTYPES; d++) check_paged(gpu_dtypes[d], 16, 8, 2, 128, 2, long_len, long_decode);
}

/* Bad slots and block ids are refused before anything is written. */
Test(gpu_ops, paged_bad_data) {
    if (!backend_available(BACKEND_CUDA)) cr_skip_test("no CUDA device");
    struct smelt_error err;
    struct test_rng rng = {1100};
    int64_t scache[4] = {3, 4, 1, 8}, skv[3] = {2, 1, 8}, ss[1] = {2}, sq[3] = {2, 2, 8}, stab[2] = {2, 2};
    int64_t scu[1] = {3}, sctx[1] = {2};
    int32_t slots[2] = {3, 12}, tables[4] = {2, 0, 3, -1}, cu_q[3] = {0, 1, 2}, ctx[2] = {5, 2};
    struct twin k_cache = twin_new(DTYPE_F32, 4, scache, &rng, -1, 1), v_cache = twin_new(DTYPE_F32, 4, scache, &rng, -1, 1);
    struct twin k = twin_new(DTYPE_F32, 3, skv, &rng, -1, 1), v = twin_new(DTYPE_F32, 3, skv, &rng, -1, 1);
    struct twin q = twin_new(DTYPE_F32, 3, sq, &rng, -1, 1), out = twin_new(DTYPE_F32, 3, sq, &rng, -1, 1);
    struct twin_ids slot_mapping = ids_new(slots, 1, ss), block_tables = ids_new(tables, 2, stab);
    struct tensor tcu = tensor_i32(cu_q, 1, scu), tctx = tensor_i32(ctx, 1, sctx);
    TEST_EXPECT_ERROR(ops_kv_append(&k_cache.gpu, &v_cache.gpu, &k.gpu, &v.gpu, &slot_mapping.gpu, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "slot_mapping[1] is 12") != NULL, "message names the slot: %s", err.message);
    twin_expect_unchanged("append with a bad slot: k_cache", &k_cache);
    twin_expect_unchanged("append with a bad slot: v_cache", &v_cache);
    /* Block 3 is outside the pool of 3 blocks; sequence 1 reads its first entry. */
    TEST_EXPECT_ERROR(ops_paged_attention(&out.gpu, &q.gpu, &k_cache.gpu, &v_cache.gpu, &block_tables.gpu, &tcu, &tctx,
                                          0.5f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "block_tables[1][0] is 3") != NULL, "message names the entry: %s", err.message);
    twin_expect_unchanged("paged attention with a bad block: out", &out);
    /* The same on the CPU, for the same words. */
    TEST_EXPECT_ERROR(ops_paged_attention(&out.cpu, &q.cpu, &k_cache.cpu, &v_cache.cpu, &block_tables.cpu, &tcu, &tctx,
                                          0.5f, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "block_tables[1][0] is 3") != NULL, "cpu message names the entry: %s", err.message);
    twin_free(&k_cache), twin_free(&v_cache), twin_free(&k), twin_free(&v), twin_free(&q), twin_free(&out);
    ids_free(&slot_mapping), ids_free(&block_tables);
}
