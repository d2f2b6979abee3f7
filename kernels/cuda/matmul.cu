/* Matmul and its backward on cuBLAS (cublasGemmStridedBatchedEx), fp32 compute
 * (CUBLAS_COMPUTE_32F: true fp32 for f32 operands, no TF32; bf16 operands on the tensor
 * cores with fp32 accumulation, and reduced-precision split-K reductions disallowed).
 *
 * Row-major through a column-major library. A row-major R x C matrix with row length ld
 * is, byte for byte, the column-major C x R matrix (its transpose) with leading
 * dimension ld. So the row-major product C[m,n] = op(A)[m,k] op(B)[k,n] is computed as
 * the column-major product C^T[n,m] = op(B)^T[n,k] op(A)^T[k,m]: cuBLAS gets
 * (m', n', k') = (n, m, k), its first operand is our B and its second our A, each with
 * the transpose flag we were given:
 *   B not transposed: stored [k, n] row-major = [n, k] col-major, ld n: CUBLAS_OP_N;
 *   B transposed:     stored [n, k] row-major = [k, n] col-major, ld k: CUBLAS_OP_T;
 *   A not transposed: stored [m, k] row-major = [k, m] col-major, ld k: CUBLAS_OP_N;
 *   A transposed:     stored [k, m] row-major = [m, k] col-major, ld m: CUBLAS_OP_T;
 *   C: [m, n] row-major = [n, m] col-major, ld n.
 *
 * Batches: strided batches, stride 0 for an operand shared by every batch; when a
 * batched, untransposed A meets a shared B (x [B, T, C] @ W^T), the batches are one
 * [B*T, C] matrix and become a single GEMM. Gradients of a shared operand sum over the
 * batches: one GEMM over the concatenated inner dimension when the layout allows,
 * otherwise one GEMM per batch with beta = 1, in batch order (deterministic).
 *
 * bias: out is first set to bias + beta * out by a small kernel and the GEMM then runs
 * with beta = 1 (for bf16 that rounds bias + beta * out once before the product is
 * added). dbias is a deterministic column sum (colsum.cuh).
 *
 * The cuBLAS handle is created on first use and lives for the process; cuBLAS runs on
 * the default stream like everything else here, and gives bit-identical results run to
 * run on one GPU model and library version. */
#include "kernels/cuda/colsum.cuh" // defines: colsum_accumulate, colsum_value_term
#include "kernels/cuda/cuda.cuh"

#include <cublas_v2.h>
#include <limits.h>

struct cublas_state {
    cublasHandle_t handle = nullptr;
    cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
};

/* Thread-safe creation (a function-local static). Never destroyed: destroying a handle
 * during exit, after the CUDA runtime may have shut down, can crash. */
static const cublas_state &cublas_get(void) {
    static const cublas_state state = [] {
        cublas_state s;
        s.status = cublasCreate(&s.handle);
        if (s.status == CUBLAS_STATUS_SUCCESS)
            s.status = cublasSetMathMode(s.handle, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        return s;
    }();
    return state;
}

static int cublas_error(const char *op, const char *call, cublasStatus_t st, struct smelt_error *err) {
    (void)cudaGetLastError();
    return error_set(err, st == CUBLAS_STATUS_ALLOC_FAILED ? SMELT_ENOMEM : SMELT_EBACKEND,
                     "%s: %s failed: %s", op, call, cublasGetStatusString(st));
}

/* out[r, c] = bias[c] (or 0) + beta * out[r, c]; beta = 0 never reads out (NaN there
 * is ignored, as ops.h promises). Also the whole product when k = 0. */
template <typename T>
__global__ void bias_prefill_kernel(T *out, const T *__restrict__ bias, int64_t rows, int64_t cols, float beta) {
    int64_t n = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = bias ? to_f32(bias[i % cols]) : 0.0f;
        if (beta != 0.0f) v += beta * to_f32(out[i]);
        out[i] = from_f32<T>(v);
    }
}

/* One row-major (strided-batched) GEMM: c = alpha * op(a) op(b) + beta * c, with op(a)
 * [m, k], op(b) [k, n], c [m, n] per batch; strides in elements, 0 for a shared operand.
 * c is contiguous across batches (stride m * n) or batch is 1. */
struct gemm_args {
    const void *a, *b;
    void *c;
    bool trans_a, trans_b;
    int64_t m, n, k, batch;
    int64_t stride_a, stride_b, stride_c;
    float alpha, beta;
};

struct gemm_type {
    enum dtype dtype;
    cudaDataType_t cuda;
    size_t bytes;
};

static gemm_type gemm_type_of(enum dtype dtype) {
    if (dtype == DTYPE_BF16) return {dtype, CUDA_R_16BF, 2};
    return {DTYPE_F32, CUDA_R_32F, 4};
}

static int gemm_run(const gemm_args &g, const gemm_type &type, const char *op, struct smelt_error *err) {
    if (g.m == 0 || g.n == 0 || g.batch == 0) return SMELT_OK;
    if (g.k == 0) {
        if (g.beta == 1.0f) return SMELT_OK;
        int64_t rows = g.batch * g.m;
        return with_compute_type(type.dtype, [&](auto tag) -> int {
            using T = decltype(tag);
            bias_prefill_kernel<T><<<cuda_blocks_for(rows * g.n, CUDA_THREADS), CUDA_THREADS>>>(
                (T *)g.c, nullptr, rows, g.n, g.beta);
            CUDA_CHECK_LAUNCH(err, op, "bias_prefill_kernel");
            return SMELT_OK;
        });
    }
    int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n, ldc = g.n;
    if (g.m > INT_MAX || g.n > INT_MAX || g.k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        g.batch > INT_MAX)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: GEMM of %lld batches of [%lld x %lld] @ [%lld x %lld] exceeds cuBLAS's int dimensions",
                         op, (long long)g.batch, (long long)g.m, (long long)g.k, (long long)g.k, (long long)g.n);
    const cublas_state &cublas = cublas_get();
    if (cublas.status != CUBLAS_STATUS_SUCCESS) return cublas_error(op, "cublasCreate", cublas.status, err);
    /* Swapped operands and dimensions: see the comment at the top. */
    cublasStatus_t st = cublasGemmStridedBatchedEx(
        cublas.handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)g.n, (int)g.m, (int)g.k, &g.alpha, g.b, type.cuda, (int)ldb, g.stride_b, g.a, type.cuda,
        (int)lda, g.stride_a, &g.beta, g.c, type.cuda, (int)ldc, g.stride_c, (int)g.batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cublas_error(op, "cublasGemmStridedBatchedEx", st, err);
    return SMELT_OK;
}

/* A GEMM input: its memory, whether it has a batch dim (else shared by all batches),
 * and whether op() transposes it. */
struct operand {
    const void *data;
    bool batched, trans;
};

/* out (+)= alpha * op(x) op(y) for each of `batch` batches: op(x) [m, k], op(y) [k, n].
 * A batched out gets one product per batch; a shared out (a gradient of a shared
 * operand) gets the sum over batches. */
static int product(void *out, bool out_batched, operand x, operand y, int64_t batch, int64_t m,
                   int64_t n, int64_t k, float alpha, float beta, const gemm_type &type,
                   const char *op, struct smelt_error *err) {
    gemm_args g = {x.data, y.data, out, x.trans, y.trans, m, n, k, 1, 0, 0, 0, alpha, beta};
    if (!x.batched && !y.batched) return gemm_run(g, type, op, err);
    if (out_batched) {
        if (x.batched && !x.trans && !y.batched) {
            g.m = batch * m; /* [batch, m, k] is [batch * m, k] */
            return gemm_run(g, type, op, err);
        }
        g.batch = batch;
        g.stride_a = x.batched ? m * k : 0;
        g.stride_b = y.batched ? k * n : 0;
        g.stride_c = m * n;
        return gemm_run(g, type, op, err);
    }
    if (x.batched && y.batched && x.trans && !y.trans) {
        /* sum_b x_b^T y_b with x_b [k, m], y_b [k, n]: stacked, x is [batch * k, m] and y
         * [batch * k, n], one product over the longer inner dimension. */
        g.k = batch * k;
        return gemm_run(g, type, op, err);
    }
    for (int64_t b = 0; b < batch; b++) {
        g.a = (const char *)x.data + (x.batched ? (size_t)(b * m * k) * type.bytes : 0);
        g.b = (const char *)y.data + (y.batched ? (size_t)(b * k * n) * type.bytes : 0);
        g.beta = b == 0 ? beta : 1.0f;
        if (int rc = gemm_run(g, type, op, err)) return rc;
    }
    return SMELT_OK;
}

/* The shape of a matmul call (ops.c has checked that it is consistent). */
struct matmul_shape {
    int64_t batch, m, n, k;
    bool a_batched, b_batched;
};

static matmul_shape matmul_shape_of(const struct tensor *a, const struct tensor *b, bool trans_a, bool trans_b) {
    matmul_shape s;
    s.a_batched = a->ndim == 3;
    s.b_batched = b->ndim == 3;
    s.batch = s.a_batched ? a->shape[0] : s.b_batched ? b->shape[0] : 1;
    int ra = a->ndim - 2, rb = b->ndim - 2;
    s.m = trans_a ? a->shape[ra + 1] : a->shape[ra];
    s.k = trans_a ? a->shape[ra] : a->shape[ra + 1];
    s.n = trans_b ? b->shape[rb] : b->shape[rb + 1];
    return s;
}

int cuda_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
                const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
                struct smelt_error *err) {
    const char *op = "ops_matmul";
    matmul_shape s = matmul_shape_of(a, b, trans_a, trans_b);
    gemm_type type = gemm_type_of(out->dtype);
    bool out_batched = s.a_batched || s.b_batched;
    int64_t rows = s.batch * s.m;
    if (rows == 0 || s.n == 0) return SMELT_OK;
    if (bias) {
        int rc = with_compute_type(out->dtype, [&](auto tag) -> int {
            using T = decltype(tag);
            bias_prefill_kernel<T><<<cuda_blocks_for(rows * s.n, CUDA_THREADS), CUDA_THREADS>>>(
                (T *)out->data, (const T *)bias->data, rows, s.n, beta);
            CUDA_CHECK_LAUNCH(err, op, "bias_prefill_kernel");
            return SMELT_OK;
        });
        if (rc) return rc;
        beta = 1.0f;
    }
    return product(out->data, out_batched, operand{a->data, s.a_batched, trans_a},
                   operand{b->data, s.b_batched, trans_b}, s.batch, s.m, s.n, s.k, alpha, beta, type, op, err);
}

/* With C = alpha op(A) op(B):
 *   dA += alpha dC op(B)^T   (A [m, k]),   dA += alpha op(B) dC^T   (A stored [k, m]);
 *   dB += alpha op(A)^T dC   (B [k, n]),   dB += alpha dC^T op(A)   (B stored [n, k]). */
int cuda_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                         const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                         bool trans_a, bool trans_b, float alpha, struct smelt_error *err) {
    const char *op = "ops_matmul_backward";
    matmul_shape s = matmul_shape_of(a, b, trans_a, trans_b);
    gemm_type type = gemm_type_of(dout->dtype);
    bool out_batched = s.a_batched || s.b_batched;
    operand A = {a->data, s.a_batched, false}, B = {b->data, s.b_batched, false};
    operand dC = {dout->data, out_batched, false};
    if (da) {
        int rc;
        if (!trans_a)
            rc = product(da->data, s.a_batched, dC, operand{B.data, B.batched, !trans_b}, s.batch, s.m,
                         s.k, s.n, alpha, 1.0f, type, op, err);
        else
            rc = product(da->data, s.a_batched, operand{B.data, B.batched, trans_b},
                         operand{dC.data, dC.batched, true}, s.batch, s.k, s.m, s.n, alpha, 1.0f, type, op, err);
        if (rc) return rc;
    }
    if (db) {
        int rc;
        if (!trans_b)
            rc = product(db->data, s.b_batched, operand{A.data, A.batched, !trans_a}, dC, s.batch, s.k,
                         s.n, s.m, alpha, 1.0f, type, op, err);
        else
            rc = product(db->data, s.b_batched, operand{dC.data, dC.batched, true},
                         operand{A.data, A.batched, trans_a}, s.batch, s.n, s.k, s.m, alpha, 1.0f, type, op, err);
        if (rc) return rc;
    }
    if (dbias) {
        return with_compute_type(dout->dtype, [&](auto tag) -> int {
            using T = decltype(tag);
            return colsum_accumulate((T *)dbias->data, s.batch * s.m, s.n,
                                     colsum_value_term<T>{(const T *)dout->data, s.n}, op, err);
        });
    }
    return SMELT_OK;
}
