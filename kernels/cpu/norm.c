/* RMSNorm and LayerNorm over the last dim, and their backward passes.
 *
 * Numerics follow Hugging Face op by op in f32 (LlamaRMSNorm: variance = mean(x^2),
 * x * rsqrt(variance + eps), then * weight; torch.nn.LayerNorm: biased variance): the
 * statistic is rounded to f32, eps is added in f32, rstd = 1 / sqrtf(...), and
 * y = (x * rstd) * w, or ((x - mean) * rstd) * w + b. Only the row sums run in double:
 * a float running sum over a 4096..8192-wide row drifts by up to C ulps, while a double
 * sum rounded once is the correctly rounded f32 statistic that torch's cascaded float
 * sum approximates. The loops are memory bound, so the wider adds cost nothing visible.
 * LayerNorm's variance is taken in two passes around the double mean, which stays
 * exact for rows far from zero (a one-pass E[x^2] - mean^2 cancels).
 *
 * RMSNorm is LayerNorm without centering, so both share one backward with mean = 0:
 *   xhat = (x - mean) * rstd, g = dy * w,
 *   dx += rstd * (g - mean(g) - xhat * mean(g * xhat))   (mean(g) term: LayerNorm only)
 *   dw += sum over rows of dy * xhat,  db += sum over rows of dy.
 * dw and db are reductions over rows. Rows are cut into at most NORM_MAX_CHUNKS chunks
 * whose size depends only on the row count; each chunk sums its rows in order, in double,
 * into its own slice of a scratch buffer, and then every column adds the chunk partials
 * in chunk order. Any thread count gives bit-identical dw and db.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

/* Elements below which a parallel region costs more than it saves. */
#define NORM_PARALLEL_MIN 32768
/* Upper bound on row chunks in the backward: enough to keep many cores busy, few enough
 * that the scratch (chunks * C doubles per weight gradient) stays small. */
#define NORM_MAX_CHUNKS 64

/* ---- forward --------------------------------------------------------------------- */

/* One row: writes y (which may be x) and returns the row's statistics. center = false
 * is RMSNorm (mean fixed at 0, variance = mean(x^2)); b may be NULL. */
static void norm_forward_row(float *y, float *mean_out, float *rstd_out, const float *x,
                             const float *w, const float *b, int64_t c, float eps,
                             bool center) {
    double mean = 0.0;
    if (center) {
        double sum = 0.0;
        for (int64_t j = 0; j < c; j++) sum += x[j];
        mean = sum / (double)c;
    }
    double ss = 0.0;
    for (int64_t j = 0; j < c; j++) {
        double d = (double)x[j] - mean;
        ss += d * d;
    }
    float m = (float)mean;
    float var = (float)(ss / (double)c);
    float rs = 1.0f / sqrtf(var + eps);
    for (int64_t j = 0; j < c; j++) {
        float xhat = (x[j] - m) * rs;
        y[j] = b ? xhat * w[j] + b[j] : xhat * w[j];
    }
    *mean_out = m;
    *rstd_out = rs;
}

static void norm_forward(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                         const struct tensor *x, const struct tensor *w, const struct tensor *b,
                         float eps, bool center) {
    int64_t c = x->shape[x->ndim - 1], rows = tensor_rows(x);
    float *out = y->data, *mean_out = mean ? mean->data : NULL;
    float *rstd_out = rstd ? rstd->data : NULL;
    const float *in = x->data, *wd = w->data, *bd = b ? b->data : NULL;
#pragma omp parallel for schedule(static) if (rows * c > NORM_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float m, rs;
        norm_forward_row(out + r * c, &m, &rs, in + r * c, wd, bd, c, eps, center);
        if (mean_out) mean_out[r] = m;
        if (rstd_out) rstd_out[r] = rs;
    }
}

int cpu_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                const struct tensor *w, float eps, struct smelt_error *err) {
    (void)err;
    norm_forward(y, NULL, rstd, x, w, NULL, eps, false);
    return SMELT_OK;
}

int cpu_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                  const struct tensor *x, const struct tensor *w, const struct tensor *b,
                  float eps, struct smelt_error *err) {
    (void)err;
    norm_forward(y, mean, rstd, x, w, b, eps, true);
    return SMELT_OK;
}

/* ---- backward -------------------------------------------------------------------- */

/* One backward call. Outputs may be NULL; mean is NULL for RMSNorm. */
struct norm_grad {
    float *dx, *dw, *db;               /* [rows, c], [c], [c] */
    const float *dy, *x, *w;           /* [rows, c], [rows, c], [c] */
    const float *mean, *rstd;          /* [rows] */
    int64_t rows, c;
};

/* dx for row r, and the row's dw/db terms added into the chunk partials pw/pb (each
 * [c] doubles, or NULL). */
static void norm_backward_row(const struct norm_grad *g, int64_t r, double *pw, double *pb) {
    int64_t c = g->c;
    const float *x = g->x + r * c, *dy = g->dy + r * c, *w = g->w;
    float m = g->mean ? g->mean[r] : 0.0f, rs = g->rstd[r];
    if (g->dx) {
        double sum_g = 0.0, sum_gxhat = 0.0;
        for (int64_t j = 0; j < c; j++) {
            float xhat = (x[j] - m) * rs, gj = dy[j] * w[j];
            sum_g += gj;
            sum_gxhat += (double)gj * xhat;
        }
        float mean_g = g->mean ? (float)(sum_g / (double)c) : 0.0f;
        float mean_gxhat = (float)(sum_gxhat / (double)c);
        float *dx = g->dx + r * c;
        for (int64_t j = 0; j < c; j++) {
            float xhat = (x[j] - m) * rs;
            dx[j] += rs * (dy[j] * w[j] - mean_g - xhat * mean_gxhat);
        }
    }
    if (pw)
        for (int64_t j = 0; j < c; j++) pw[j] += (double)dy[j] * ((x[j] - m) * rs);
    if (pb)
        for (int64_t j = 0; j < c; j++) pb[j] += dy[j];
}

static int norm_backward(const struct norm_grad *g, const char *op, struct smelt_error *err) {
    int64_t rows = g->rows, c = g->c;
    if (rows == 0 || c == 0) return SMELT_OK;
    int64_t chunk_rows = (rows + NORM_MAX_CHUNKS - 1) / NORM_MAX_CHUNKS;
    int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    /* Per chunk: [dw partial (c)][db partial (c)], each present only when wanted. */
    int64_t db_at = g->dw ? c : 0, stride = db_at + (g->db ? c : 0);
    double *partial = NULL;
    if (stride > 0) {
        partial = calloc((size_t)(chunks * stride), sizeof *partial);
        if (!partial)
            return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %lld bytes for weight-gradient partial sums",
                             op, (long long)(chunks * stride * (int64_t)sizeof *partial));
    }
#pragma omp parallel for schedule(static) if (rows * c > NORM_PARALLEL_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        double *pw = g->dw ? partial + k * stride : NULL;
        double *pb = g->db ? partial + k * stride + db_at : NULL;
        int64_t r1 = (k + 1) * chunk_rows < rows ? (k + 1) * chunk_rows : rows;
        for (int64_t r = k * chunk_rows; r < r1; r++) norm_backward_row(g, r, pw, pb);
    }
    if (!partial) return SMELT_OK;
#pragma omp parallel for schedule(static) if (chunks * c > NORM_PARALLEL_MIN)
    for (int64_t j = 0; j < c; j++) {
        double sw = 0.0, sb = 0.0;
        for (int64_t k = 0; k < chunks; k++) {
            if (g->dw) sw += partial[k * stride + j];
            if (g->db) sb += partial[k * stride + db_at + j];
        }
        if (g->dw) g->dw[j] += (float)sw;
        if (g->db) g->db[j] += (float)sb;
    }
    free(partial);
    return SMELT_OK;
}

int cpu_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w,
                         const struct tensor *rstd, struct smelt_error *err) {
    struct norm_grad g = {
        .dx = dx ? dx->data : NULL, .dw = dw ? dw->data : NULL, .db = NULL,
        .dy = dy->data, .x = x->data, .w = w->data, .mean = NULL, .rstd = rstd->data,
        .rows = tensor_rows(x), .c = x->shape[x->ndim - 1],
    };
    return norm_backward(&g, "ops_rmsnorm_backward", err);
}

int cpu_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                           const struct tensor *dy, const struct tensor *x,
                           const struct tensor *w, const struct tensor *mean,
                           const struct tensor *rstd, struct smelt_error *err) {
    struct norm_grad g = {
        .dx = dx ? dx->data : NULL, .dw = dw ? dw->data : NULL, .db = db ? db->data : NULL,
        .dy = dy->data, .x = x->data, .w = w->data, .mean = mean->data, .rstd = rstd->data,
        .rows = tensor_rows(x), .c = x->shape[x->ndim - 1],
    };
    return norm_backward(&g, "ops_layernorm_backward", err);
}
