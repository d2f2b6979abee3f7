/* CPU matmul and its backward: OpenBLAS sgemm for every product (sgemv for one row), OpenMP for the
 * bias/beta pass and the bias gradient. In batch-invariant mode the forward product runs
 * in matmul_invariant.c instead (the backward stays on OpenBLAS: gradients never feed a
 * logprob that must match another process's).
 *
 * Every product is issued as an accumulating GEMM (BLAS beta = 1). The forward first
 * prepares out = bias + beta * out itself, so beta = 0 overwrites stale NaN/inf instead
 * of trusting the BLAS to skip reading C; the backward's `+=` contract is then BLAS's
 * own beta = 1.
 *
 * Batches are described by strides (0 = one matrix shared by every batch) and
 * gemm_accumulate collapses them into a single GEMM where the memory allows it: a
 * non-transposed batched x [B, T, C] next to a shared weight is one [B*T, C] matrix, so
 * the linear layer (forward and dx) runs as one large GEMM instead of B small ones, and
 * the weight gradient summed over batches becomes one GEMM with inner dimension B*T. */
#include "kernels/cpu/cpu.h" /* defines: cpu_matmul, cpu_matmul_backward */

#include <cblas.h>  /* cblas_sgemm (OpenBLAS) */
#include <limits.h>
#include <string.h>

static bool fits_blasint(int64_t x) { return x >= 0 && x <= INT_MAX; }

/* Batches of a non-transposed A that follow each other as row blocks, with B shared
 * and C's batches consecutive row blocks too, are one tall GEMM. */
static bool collapse_rows(struct cpu_gemm *g) {
    if (g->batch < 2 || g->trans_a || g->b_stride != 0) return false;
    if (g->a_stride != g->m * g->lda || g->c_stride == 0 || g->c_stride != g->m * g->ldc)
        return false;
    if (!fits_blasint(g->batch * g->m)) return false;
    g->m *= g->batch;
    g->batch = 1;
    return true;
}

/* Batches summed into one shared C whose inner dimension is contiguous rows of both
 * operands (A stored [k, m] and transposed, B stored [k, n]) are one deep GEMM over
 * batch*k: the weight gradient of a linear layer. */
static bool collapse_inner(struct cpu_gemm *g) {
    if (g->batch < 2 || g->c_stride != 0 || !g->trans_a || g->trans_b) return false;
    if (g->a_stride != g->k * g->lda || g->b_stride != g->k * g->ldb) return false;
    if (!fits_blasint(g->batch * g->k)) return false;
    g->k *= g->batch;
    g->batch = 1;
    return true;
}

static int gemm_accumulate(struct cpu_gemm g, const char *op, struct smelt_error *err) {
    /* BLAS rejects k = 0 with lda = 0 (and prints to stderr); an empty product adds
     * nothing anyway. */
    if (g.batch == 0 || g.m == 0 || g.n == 0 || g.k == 0) return SMELT_OK;
    if (!collapse_rows(&g)) collapse_inner(&g);
    const int64_t dims[6] = {g.m, g.n, g.k, g.lda, g.ldb, g.ldc};
    for (int i = 0; i < 6; i++)
        if (!fits_blasint(dims[i]))
            return error_set(err, SMELT_EUNSUPPORTED,
                             "%s: GEMM size %lld (m %lld, n %lld, k %lld) exceeds OpenBLAS's "
                             "32-bit index",
                             op, (long long)dims[i], (long long)g.m, (long long)g.n,
                             (long long)g.k);
    if (g.m == 1) {
        /* A single row (decode at batch 1): GEMV reads B once, where GEMM would first
         * repack all of B for one row of output. */
        for (int64_t i = 0; i < g.batch; i++) {
            const float *x = g.a + i * g.a_stride;
            int incx = g.trans_a ? (int)g.lda : 1;
            if (g.trans_b)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)g.n, (int)g.k, g.alpha, g.b + i * g.b_stride,
                            (int)g.ldb, x, incx, 1.0f, g.c + i * g.c_stride, 1);
            else
                cblas_sgemv(CblasRowMajor, CblasTrans, (int)g.k, (int)g.n, g.alpha, g.b + i * g.b_stride,
                            (int)g.ldb, x, incx, 1.0f, g.c + i * g.c_stride, 1);
        }
        return SMELT_OK;
    }
    for (int64_t i = 0; i < g.batch; i++)
        cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                    g.trans_b ? CblasTrans : CblasNoTrans, (int)g.m, (int)g.n, (int)g.k, g.alpha,
                    g.a + i * g.a_stride, (int)g.lda, g.b + i * g.b_stride, (int)g.ldb, 1.0f,
                    g.c + i * g.c_stride, (int)g.ldc);
    return SMELT_OK;
}

/* One operand's storage: rows x cols per batch, and its batch stride (0 when 2D). */
struct operand {
    const float *data;
    int64_t rows, cols, stride;
};

static struct operand operand_of(const struct tensor *t) {
    int r = t->ndim - 2;
    struct operand o = {t->data, t->shape[r], t->shape[r + 1], 0};
    if (t->ndim == 3) o.stride = o.rows * o.cols;
    return o;
}

/* The product's sizes, from operands ops.c has already checked. */
struct mm_shape {
    int64_t batch, m, n, k;
};

static struct mm_shape mm_shape_of(const struct tensor *a, const struct tensor *b, bool trans_a,
                                   bool trans_b) {
    struct operand oa = operand_of(a), ob = operand_of(b);
    struct mm_shape s;
    s.batch = a->ndim == 3 ? a->shape[0] : b->ndim == 3 ? b->shape[0] : 1;
    s.m = trans_a ? oa.cols : oa.rows;
    s.k = trans_a ? oa.rows : oa.cols;
    s.n = trans_b ? ob.rows : ob.cols;
    return s;
}

/* out = bias + beta * out over rows x n, written so that beta = 0 never reads out. */
static void prepare_out(float *out, const float *bias, float beta, int64_t rows, int64_t n) {
    if (rows * n == 0 || (!bias && beta == 1.0f)) return;
    if (!bias && beta == 0.0f) {
        memset(out, 0, (size_t)(rows * n) * sizeof *out);
        return;
    }
#pragma omp parallel for schedule(static) if (rows * n > 32768)
    for (int64_t r = 0; r < rows; r++) {
        float *row = out + r * n;
        if (beta == 0.0f)
            for (int64_t j = 0; j < n; j++) row[j] = bias[j];
        else if (bias)
            for (int64_t j = 0; j < n; j++) row[j] = bias[j] + beta * row[j];
        else
            for (int64_t j = 0; j < n; j++) row[j] *= beta;
    }
}

int cpu_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
               const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
               struct smelt_error *err) {
    struct mm_shape s = mm_shape_of(a, b, trans_a, trans_b);
    struct operand oa = operand_of(a), ob = operand_of(b);
    prepare_out(out->data, bias ? bias->data : NULL, beta, s.batch * s.m, s.n);
    struct cpu_gemm g = {
        .batch = s.batch, .m = s.m, .n = s.n, .k = s.k, .alpha = alpha,
        .a = oa.data, .a_stride = oa.stride, .lda = oa.cols, .trans_a = trans_a,
        .b = ob.data, .b_stride = ob.stride, .ldb = ob.cols, .trans_b = trans_b,
        .c = out->data, .c_stride = s.m * s.n, .ldc = s.n,
    };
    if (cpu_batch_invariant()) {
        collapse_rows(&g); /* one tall product: the same elements, fewer parallel regions */
        return cpu_gemm_invariant(&g, "cpu_matmul", err);
    }
    return gemm_accumulate(g, "cpu_matmul", err);
}

/* da += alpha * dout @ op(b)^T, or its transpose (op(b) @ dout^T) when a is stored
 * transposed. A shared a (stride 0) receives the sum over batches. */
static struct cpu_gemm grad_a_gemm(float *da, const struct operand *oa, const float *dout,
                                   const struct operand *ob, const struct mm_shape *s,
                                   bool trans_a, bool trans_b, float alpha) {
    int64_t dout_stride = s->m * s->n;
    int64_t da_stride = oa->stride;
    if (!trans_a)
        return (struct cpu_gemm){
            .batch = s->batch, .m = s->m, .n = s->k, .k = s->n, .alpha = alpha,
            .a = dout, .a_stride = dout_stride, .lda = s->n, .trans_a = false,
            .b = ob->data, .b_stride = ob->stride, .ldb = ob->cols, .trans_b = !trans_b,
            .c = da, .c_stride = da_stride, .ldc = s->k,
        };
    return (struct cpu_gemm){
        .batch = s->batch, .m = s->k, .n = s->m, .k = s->n, .alpha = alpha,
        .a = ob->data, .a_stride = ob->stride, .lda = ob->cols, .trans_a = trans_b,
        .b = dout, .b_stride = dout_stride, .ldb = s->n, .trans_b = true,
        .c = da, .c_stride = da_stride, .ldc = s->m,
    };
}

/* db += alpha * op(a)^T @ dout, or its transpose (dout^T @ op(a)) when b is stored
 * transposed. A shared b receives the sum over batches. */
static struct cpu_gemm grad_b_gemm(float *db, const struct operand *ob, const float *dout,
                                   const struct operand *oa, const struct mm_shape *s,
                                   bool trans_a, bool trans_b, float alpha) {
    int64_t dout_stride = s->m * s->n;
    int64_t db_stride = ob->stride;
    if (!trans_b)
        return (struct cpu_gemm){
            .batch = s->batch, .m = s->k, .n = s->n, .k = s->m, .alpha = alpha,
            .a = oa->data, .a_stride = oa->stride, .lda = oa->cols, .trans_a = !trans_a,
            .b = dout, .b_stride = dout_stride, .ldb = s->n, .trans_b = false,
            .c = db, .c_stride = db_stride, .ldc = s->n,
        };
    return (struct cpu_gemm){
        .batch = s->batch, .m = s->n, .n = s->k, .k = s->m, .alpha = alpha,
        .a = dout, .a_stride = dout_stride, .lda = s->n, .trans_a = true,
        .b = oa->data, .b_stride = oa->stride, .ldb = oa->cols, .trans_b = trans_a,
        .c = db, .c_stride = db_stride, .ldc = s->k,
    };
}

#define COLSUM_BLOCK 64

/* dbias[j] += sum over rows of dout[r, j]. Each block of columns is summed in double,
 * row by row, by one thread: the order is fixed whatever the thread count. */
static void add_column_sums(float *dbias, const float *dout, int64_t rows, int64_t n) {
    int64_t blocks = (n + COLSUM_BLOCK - 1) / COLSUM_BLOCK;
#pragma omp parallel for schedule(static) if (rows * n > 32768)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t j0 = blk * COLSUM_BLOCK;
        int64_t width = n - j0 < COLSUM_BLOCK ? n - j0 : COLSUM_BLOCK;
        double acc[COLSUM_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *row = dout + r * n + j0;
            for (int64_t j = 0; j < width; j++) acc[j] += row[j];
        }
        for (int64_t j = 0; j < width; j++) dbias[j0 + j] += (float)acc[j];
    }
}

int cpu_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                        const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                        bool trans_a, bool trans_b, float alpha, struct smelt_error *err) {
    struct mm_shape s = mm_shape_of(a, b, trans_a, trans_b);
    struct operand oa = operand_of(a), ob = operand_of(b);
    int rc;
    if (da) {
        rc = gemm_accumulate(grad_a_gemm(da->data, &oa, dout->data, &ob, &s, trans_a, trans_b,
                                         alpha),
                             "cpu_matmul_backward (da)", err);
        if (rc) return rc;
    }
    if (db) {
        rc = gemm_accumulate(grad_b_gemm(db->data, &ob, dout->data, &oa, &s, trans_a, trans_b,
                                         alpha),
                             "cpu_matmul_backward (db)", err);
        if (rc) return rc;
    }
    if (dbias) add_column_sums(dbias->data, dout->data, s.batch * s.m, s.n);
    return SMELT_OK;
}
