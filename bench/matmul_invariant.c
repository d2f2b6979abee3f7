/* The batch-invariant forward matmul (ops_set_batch_invariant) against the default
 * OpenBLAS path, on the linear layers of the two benchmark models at the row counts the
 * engine and the trainer use: 1, 8 and 64 rows (decode steps), 2048 (a packed training
 * batch, a prefill). Each row times one layer's seven projections (q, k, v, o, gate, up,
 * down) and, separately, the lm_head, both as ops_matmul calls (x @ W^T, beta = 0),
 * calls of the two modes interleaved; median of enough calls for about 0.2 s each.
 * ratio = invariant time / default time (above 1: slower). Whole run: about 20 s on 2
 * cores. Run with `make bench`, or alone:
 *   make CUDA=0 BUILD=build-cpu build-cpu/bench/matmul_invariant && build-cpu/bench/matmul_invariant */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/ops.h" /* ops_matmul, ops_set_batch_invariant, tensor_alloc */

#define TARGET_S 0.2
#define MAX_RUNS 200

struct model_shape {
    const char *name;
    int64_t c, kv, f, v; /* hidden, k/v width (heads_kv x head_dim), MLP, vocabulary */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *x, int64_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

/* out [m, n] = x [m, k] @ w [n, k]^T for every (n, k) in the list. */
struct linears {
    int count;
    int64_t n[8], k[8];
    struct tensor x[8], w[8], out[8];
};

static int linears_alloc(struct linears *l, int64_t m, struct smelt_error *err) {
    for (int i = 0; i < l->count; i++) {
        int64_t sx[2] = {m, l->k[i]}, sw[2] = {l->n[i], l->k[i]}, so[2] = {m, l->n[i]};
        TRY(tensor_alloc(&l->x[i], BACKEND_CPU, DTYPE_F32, 2, sx, err));
        TRY(tensor_alloc(&l->w[i], BACKEND_CPU, DTYPE_F32, 2, sw, err));
        TRY(tensor_alloc(&l->out[i], BACKEND_CPU, DTYPE_F32, 2, so, err));
        fill(l->x[i].data, m * l->k[i], (uint64_t)(2 * i + 1));
        fill(l->w[i].data, l->n[i] * l->k[i], (uint64_t)(2 * i + 2));
    }
    return SMELT_OK;
}

static void linears_free(struct linears *l) {
    for (int i = 0; i < l->count; i++) tensor_free(&l->x[i]), tensor_free(&l->w[i]), tensor_free(&l->out[i]);
}

static int linears_run(struct linears *l, bool invariant, struct smelt_error *err) {
    TRY(ops_set_batch_invariant(BACKEND_CPU, invariant, err));
    for (int i = 0; i < l->count; i++)
        TRY(ops_matmul(&l->out[i], &l->x[i], &l->w[i], NULL, false, true, 1.0f, 0.0f, err));
    return SMELT_OK;
}

/* Median seconds of one call in each mode, calls interleaved. */
static int time_modes(struct linears *l, double *def_s, double *inv_s, struct smelt_error *err) {
    double t0 = now_s();
    TRY(linears_run(l, false, err));
    TRY(linears_run(l, true, err));
    double warm = now_s() - t0;
    int n = (int)(TARGET_S / (warm > 1e-9 ? warm : 1e-9)) + 1;
    if (n < 5) n = 5;
    if (n > MAX_RUNS) n = MAX_RUNS;
    double times[2][MAX_RUNS];
    for (int r = 0; r < n; r++)
        for (int mode = 0; mode < 2; mode++) {
            double s = now_s();
            TRY(linears_run(l, mode == 1, err));
            times[mode][r] = now_s() - s;
        }
    qsort(times[0], (size_t)n, sizeof(double), cmp_double);
    qsort(times[1], (size_t)n, sizeof(double), cmp_double);
    *def_s = times[0][n / 2];
    *inv_s = times[1][n / 2];
    return SMELT_OK;
}

static void bench_row(const struct model_shape *ms, const char *what, struct linears *l, int64_t m) {
    struct smelt_error err;
    error_clear(&err);
    double def_s = 0, inv_s = 0, flops = 0;
    for (int i = 0; i < l->count; i++) flops += 2.0 * (double)m * (double)l->n[i] * (double)l->k[i];
    int rc = linears_alloc(l, m, &err);
    if (!rc) rc = time_modes(l, &def_s, &inv_s, &err);
    printf("%-10s %-8s %6lld ", ms->name, what, (long long)m);
    if (rc)
        printf("error: %s\n", err.message);
    else
        printf("%10.3f %10.3f %8.1f %8.1f %7.2f\n", def_s * 1e3, inv_s * 1e3, flops / def_s * 1e-9,
               flops / inv_s * 1e-9, inv_s / def_s);
    linears_free(l);
}

int main(int argc, char **argv) {
    (void)argc;
    backend_cpu_select_kernels(argv);
    char host[64] = "?";
    gethostname(host, sizeof host);
    printf("matmul_invariant: %d threads, OpenBLAS kernels %s, host %s\n", omp_get_max_threads(),
           backend_cpu_blas_kernels(), host);
    static const struct model_shape models[] = {
        {"tiny", 128, 128, 384, 320},        /* examples/tiny */
        {"llama-22m", 384, 128, 1024, 32000}, /* bench/sft_cpu's 22M config */
    };
    static const int64_t rows[] = {1, 8, 64, 2048};
    printf("%-10s %-8s %6s %10s %10s %8s %8s %7s\n", "model", "product", "rows", "sgemm ms", "invar ms",
           "sgemm GF", "invar GF", "ratio");
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        const struct model_shape *ms = &models[mi];
        for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
            struct linears layer = {.count = 7,
                                    .n = {ms->c, ms->kv, ms->kv, ms->c, ms->f, ms->f, ms->c},
                                    .k = {ms->c, ms->c, ms->c, ms->c, ms->c, ms->c, ms->f}};
            bench_row(ms, "layer", &layer, rows[ri]);
            struct linears head = {.count = 1, .n = {ms->v}, .k = {ms->c}};
            bench_row(ms, "lm_head", &head, rows[ri]);
        }
    }
    struct smelt_error err;
    return ops_set_batch_invariant(BACKEND_CPU, false, &err) ? 1 : 0;
}
