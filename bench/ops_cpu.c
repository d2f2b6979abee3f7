/* CPU backend benchmark: ops_matmul against a plain cblas_sgemm of the same shape in
 * the same run (the ratio is what our layer costs on top of OpenBLAS), then causal
 * attention forward and backward. Each row: one warm-up call, then enough calls for
 * about 0.3 s (at least 5 unless one call takes 0.5 s), median reported. An op that fails
 * prints its error message in place of a time. Run with `make bench`. */
#include <cblas.h> /* cblas_sgemm, openblas_get_num_threads, openblas_get_config */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/ops.h" /* ops_matmul, ops_attention, tensor_alloc */

#define TARGET_S 0.3     /* time spent per measured row, after the warm-up */
#define MIN_RUNS 5
#define MAX_RUNS 200
#define BUDGET_S 50.0    /* rows after this are skipped, so the bench ends in < 60 s */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double bench_start_s;

static bool over_budget(void) { return now_s() - bench_start_s > BUDGET_S; }

/* One timed thing: returns 0 or an error code with err filled. */
struct workload {
    int (*run)(void *ctx, struct smelt_error *err);
    void *ctx;
};

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, compare_double);
    return x[n / 2];
}

/* Times one or two workloads, interleaving their calls so drift in clock speed hits
 * both alike. medians_s[i] gets workload i's median seconds per call. */
static int time_workloads(const struct workload *w, int count, double *medians_s, int *runs,
                          struct smelt_error *err) {
    SMELT_ASSERT(count >= 1 && count <= 2);
    double warm_s = 0;
    for (int i = 0; i < count; i++) {
        double t0 = now_s();
        int rc = w[i].run(w[i].ctx, err);
        if (rc) return rc;
        warm_s += now_s() - t0;
    }
    int n = (int)(TARGET_S / (warm_s > 1e-9 ? warm_s : 1e-9)) + 1;
    if (n < MIN_RUNS && warm_s < 0.5 * count) n = MIN_RUNS; /* fewer: a median of noise */
    if (n > MAX_RUNS) n = MAX_RUNS;
    double times[2][MAX_RUNS];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < count; i++) {
            double t0 = now_s();
            int rc = w[i].run(w[i].ctx, err);
            if (rc) return rc;
            times[i][r] = now_s() - t0;
        }
    for (int i = 0; i < count; i++) medians_s[i] = median(times[i], n);
    *runs = n;
    return SMELT_OK;
}

static void fill_random(float *x, int64_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

static int alloc_random(struct tensor *t, int ndim, const int64_t *shape, uint64_t seed,
                        struct smelt_error *err) {
    int rc = tensor_alloc(t, BACKEND_CPU, DTYPE_F32, ndim, shape, err);
    if (rc) return rc;
    fill_random(t->data, tensor_numel(t), seed);
    return SMELT_OK;
}

/* ---- matmul ---------------------------------------------------------------------- */

/* out = a @ op(b), with a [batch, m, k] (2D when batch is 0) and b [k, n] or [n, k]. */
struct mm_bench {
    const char *label;
    int64_t batch, m, n, k;
    bool trans_b, backward;
    struct tensor a, b, out, da, db;
};

static int run_ours(void *p, struct smelt_error *err) {
    struct mm_bench *c = p;
    if (c->backward)
        return ops_matmul_backward(&c->da, &c->db, NULL, &c->out, &c->a, &c->b, false, c->trans_b,
                                   1.0f, err);
    return ops_matmul(&c->out, &c->a, &c->b, NULL, false, c->trans_b, 1.0f, 0.0f, err);
}

/* The same arithmetic as one or two bare OpenBLAS calls: the floor ops_matmul is
 * measured against. */
static int run_plain(void *p, struct smelt_error *err) {
    (void)err;
    struct mm_bench *c = p;
    int m = (int)((c->batch ? c->batch : 1) * c->m), n = (int)c->n, k = (int)c->k;
    const float *a = c->a.data, *b = c->b.data;
    float *out = c->out.data;
    int ldb = c->trans_b ? k : n;
    CBLAS_TRANSPOSE tb = c->trans_b ? CblasTrans : CblasNoTrans;
    if (!c->backward) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0f, a, k, b, ldb, 0.0f, out, n);
        return SMELT_OK;
    }
    /* da += dout @ op(b)^T; db += a^T @ dout (or its transpose when b is [n, k]). */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, c->trans_b ? CblasNoTrans : CblasTrans, m, k, n,
                1.0f, out, n, b, ldb, 1.0f, c->da.data, k);
    if (c->trans_b)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, out, n, a, k, 1.0f,
                    c->db.data, k);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f, a, k, out, n, 1.0f,
                    c->db.data, n);
    return SMELT_OK;
}

static int mm_bench_alloc(struct mm_bench *c, struct smelt_error *err) {
    int64_t sa[3] = {c->batch, c->m, c->k}, so[3] = {c->batch, c->m, c->n};
    int64_t sb[2] = {c->trans_b ? c->n : c->k, c->trans_b ? c->k : c->n};
    int nd = c->batch ? 3 : 2, off = c->batch ? 0 : 1;
    int rc = alloc_random(&c->a, nd, sa + off, 1, err);
    if (!rc) rc = alloc_random(&c->b, 2, sb, 2, err);
    if (!rc) rc = alloc_random(&c->out, nd, so + off, 3, err);
    if (!rc && c->backward) rc = tensor_alloc(&c->da, BACKEND_CPU, DTYPE_F32, nd, sa + off, err);
    if (!rc && c->backward) rc = tensor_alloc(&c->db, BACKEND_CPU, DTYPE_F32, 2, sb, err);
    return rc;
}

static void mm_bench_free(struct mm_bench *c) {
    tensor_free(&c->a), tensor_free(&c->b), tensor_free(&c->out);
    tensor_free(&c->da), tensor_free(&c->db);
}

static void bench_matmul_row(struct mm_bench *c) {
    struct smelt_error err;
    error_clear(&err);
    printf("%-38s ", c->label);
    fflush(stdout);
    if (over_budget()) {
        printf("skipped: over the %.0f s budget\n", BUDGET_S);
        return;
    }
    int rc = mm_bench_alloc(c, &err);
    double med[2];
    int runs = 0;
    if (!rc) {
        struct workload w[2] = {{run_ours, c}, {run_plain, c}};
        rc = time_workloads(w, 2, med, &runs, &err);
    }
    if (rc) {
        printf("error: %s\n", err.message);
    } else {
        double flops = 2.0 * (double)(c->batch ? c->batch : 1) * (double)c->m * (double)c->n *
                       (double)c->k * (c->backward ? 2.0 : 1.0);
        double ours = flops / med[0] * 1e-9, plain = flops / med[1] * 1e-9;
        printf("%9.3f %9.1f %9.1f %7.3f %5d\n", med[0] * 1e3, ours, plain, ours / plain, runs);
    }
    mm_bench_free(c);
}

static void bench_matmul(void) {
    struct mm_bench cases[] = {
        {"128x128x128", 0, 128, 128, 128, false, false, {0}, {0}, {0}, {0}, {0}},
        {"512x512x512", 0, 512, 512, 512, false, false, {0}, {0}, {0}, {0}, {0}},
        {"1024x1024x1024", 0, 1024, 1024, 1024, false, false, {0}, {0}, {0}, {0}, {0}},
        {"2048x768x768", 0, 2048, 768, 768, false, false, {0}, {0}, {0}, {0}, {0}},
        {"4096x3072x768", 0, 4096, 3072, 768, false, false, {0}, {0}, {0}, {0}, {0}},
        {"linear x[4,1024,768] @ W[3072,768]^T", 4, 1024, 3072, 768, true, false,
         {0}, {0}, {0}, {0}, {0}},
        {"linear backward dx, dW", 4, 1024, 3072, 768, true, true, {0}, {0}, {0}, {0}, {0}},
    };
    printf("\nmatmul (M x N x K; GFLOP/s = 2MNK / time; backward does 2 GEMMs)\n");
    printf("%-38s %9s %9s %9s %7s %5s\n", "shape", "ms", "ours", "sgemm", "ratio", "runs");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) bench_matmul_row(&cases[i]);
}

/* ---- attention ------------------------------------------------------------------- */

struct attn_bench {
    const char *label;
    int64_t t, hq, hkv, d;
    int seqs; /* equal-length sequences packed in t */
    struct tensor q, k, v, out, lse, dout, dq, dk, dv, cu;
    int32_t cu_data[65];
    float scale;
};

static int run_attn_fwd(void *p, struct smelt_error *err) {
    struct attn_bench *c = p;
    return ops_attention(&c->out, &c->lse, &c->q, &c->k, &c->v, &c->cu, c->scale, err);
}

static int run_attn_bwd(void *p, struct smelt_error *err) {
    struct attn_bench *c = p;
    return ops_attention_backward(&c->dq, &c->dk, &c->dv, &c->dout, &c->q, &c->k, &c->v, &c->out,
                                  &c->lse, &c->cu, c->scale, err);
}

static int attn_bench_alloc(struct attn_bench *c, struct smelt_error *err) {
    int64_t sq[3] = {c->t, c->hq, c->d}, skv[3] = {c->t, c->hkv, c->d}, sl[2] = {c->t, c->hq};
    int64_t scu[1] = {c->seqs + 1};
    for (int s = 0; s <= c->seqs; s++) c->cu_data[s] = (int32_t)(c->t * s / c->seqs);
    c->cu = tensor_i32(c->cu_data, 1, scu);
    c->scale = 1.0f / sqrtf((float)c->d);
    int rc = alloc_random(&c->q, 3, sq, 11, err);
    if (!rc) rc = alloc_random(&c->k, 3, skv, 12, err);
    if (!rc) rc = alloc_random(&c->v, 3, skv, 13, err);
    if (!rc) rc = alloc_random(&c->dout, 3, sq, 14, err);
    if (!rc) rc = tensor_alloc(&c->out, BACKEND_CPU, DTYPE_F32, 3, sq, err);
    if (!rc) rc = tensor_alloc(&c->lse, BACKEND_CPU, DTYPE_F32, 2, sl, err);
    if (!rc) rc = tensor_alloc(&c->dq, BACKEND_CPU, DTYPE_F32, 3, sq, err);
    if (!rc) rc = tensor_alloc(&c->dk, BACKEND_CPU, DTYPE_F32, 3, skv, err);
    if (!rc) rc = tensor_alloc(&c->dv, BACKEND_CPU, DTYPE_F32, 3, skv, err);
    return rc;
}

static void attn_bench_free(struct attn_bench *c) {
    struct tensor *ts[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) tensor_free(ts[i]);
}

/* Causal FLOPs of the forward: QK^T and PV over the lower triangle of each sequence. */
static double attn_fwd_flops(const struct attn_bench *c) {
    double pairs = 0;
    for (int s = 0; s < c->seqs; s++) {
        double len = c->cu_data[s + 1] - c->cu_data[s];
        pairs += len * (len + 1) / 2;
    }
    return 2.0 * 2.0 * (double)c->d * (double)c->hq * pairs;
}

static void print_attn_result(const char *pass, const struct attn_bench *c, int rc,
                              const struct smelt_error *err, double med_s, int runs,
                              double flops) {
    char label[64];
    snprintf(label, sizeof label, "%s %s", c->label, pass);
    printf("%-38s ", label);
    if (rc)
        printf("error: %s\n", err->message);
    else
        printf("%9.3f %9.1f %5d\n", med_s * 1e3, flops / med_s * 1e-9, runs);
}

static void bench_attention_row(struct attn_bench *c) {
    struct smelt_error err;
    error_clear(&err);
    if (over_budget()) {
        printf("%-38s skipped: over the %.0f s budget\n", c->label, BUDGET_S);
        return;
    }
    int rc = attn_bench_alloc(c, &err);
    double med = 0;
    int runs = 0;
    struct workload fwd = {run_attn_fwd, c}, bwd = {run_attn_bwd, c};
    if (!rc) rc = time_workloads(&fwd, 1, &med, &runs, &err);
    print_attn_result("fwd", c, rc, &err, med, runs, attn_fwd_flops(c));
    if (rc) {
        printf("%-38s skipped: the forward failed\n", "");
    } else {
        rc = time_workloads(&bwd, 1, &med, &runs, &err);
        print_attn_result("bwd", c, rc, &err, med, runs, 2.5 * attn_fwd_flops(c));
    }
    attn_bench_free(c);
}

static void bench_attention(void) {
    struct attn_bench cases[] = {
        {.label = "T=512 Hq=8 Hkv=2 D=64", .t = 512, .hq = 8, .hkv = 2, .d = 64, .seqs = 1},
        {.label = "T=1024 Hq=8 Hkv=2 D=64", .t = 1024, .hq = 8, .hkv = 2, .d = 64, .seqs = 1},
        {.label = "T=1024 (4x256) Hq=8 Hkv=2 D=64", .t = 1024, .hq = 8, .hkv = 2, .d = 64, .seqs = 4},
    };
    printf("\nattention, causal (GFLOP/s: fwd = 4 D Hq sum L(L+1)/2, bwd = 2.5 x fwd)\n");
    printf("%-38s %9s %9s %5s\n", "shape", "ms", "GFLOP/s", "runs");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) bench_attention_row(&cases[i]);
}

/* ---- header ---------------------------------------------------------------------- */

static void cpu_model(char *buf, size_t bytes) {
    snprintf(buf, bytes, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(buf, bytes, "%s", colon);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

int main(int argc, char **argv) {
    (void)argc;
    backend_cpu_select_kernels(argv);
    bench_start_s = now_s();
    char model[256];
    cpu_model(model, sizeof model);
    printf("smelt CPU op benchmark\n");
    printf("cpu: %s, %ld online cores\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    static const char *const pools[] = {"sequential", "its own pthreads pool", "the OpenMP pool"};
    int parallel = openblas_get_parallel();
    printf("threads: OpenMP %d, OpenBLAS %d in %s; BLAS kernels: %s (%s)\n", omp_get_max_threads(),
           openblas_get_num_threads(), parallel >= 0 && parallel <= 2 ? pools[parallel] : "?",
           backend_cpu_blas_kernels(), openblas_get_config());
    bench_matmul();
    bench_attention();
    printf("\ntotal %.1f s\n", now_s() - bench_start_s);
    return 0;
}
