/* Private to kernels/cpu/: the CPU backend's functions, gathered into
 * cpu_backend_ops by backend.c. fp32 compute, OpenBLAS for GEMM, OpenMP for the rest.
 * Arguments arrive validated by kernels/ops.c. */
#ifndef SMELT_KERNELS_CPU_H
#define SMELT_KERNELS_CPU_H

#include "kernels/backend.h"

/* What decides the BLAS kernel set (blas.c); a value for tests to set. */
struct cpu_features {
    bool avx512;      /* F, BW, VL and DQ */
    bool avx512_bf16;
    bool avx2_fma;
    bool amd;
};
/* The OPENBLAS_CORETYPE a CPU with features f should run instead of current (the set
 * the library chose), or NULL when current suits it. */
const char *cpu_blas_kernels_for(const struct cpu_features *f, const char *current);

int cpu_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
               const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
               struct smelt_error *err);
int cpu_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                        const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                        bool trans_a, bool trans_b, float alpha, struct smelt_error *err);

/* C[i] += alpha * op(A[i]) @ op(B[i]) for i < batch; C[i] is [m, n], op(A[i]) [m, k],
 * op(B[i]) [k, n], all row-major with leading dimensions ld*. A stride of 0 means the
 * matrix is shared by every batch; for C that means the batches are summed into it.
 * matmul.c runs it through OpenBLAS; matmul_invariant.c in the batch-invariant order. */
struct cpu_gemm {
    int64_t batch, m, n, k;
    float alpha;
    const float *a;
    int64_t a_stride, lda;
    bool trans_a;
    const float *b;
    int64_t b_stride, ldb;
    bool trans_b;
    float *c;
    int64_t c_stride, ldc;
};

/* Batch-invariant mode (ops_set_batch_invariant; matmul_invariant.c): a process-wide
 * switch that cpu_matmul reads at every call. */
int cpu_set_batch_invariant(bool on, struct smelt_error *err);
bool cpu_batch_invariant(void);
/* g in the batch-invariant order: every element c[i, j] += alpha * cpu_dot(row i of
 * op(A), column j of op(B), k), bit for bit whatever m, the thread count or the row's
 * place (a shared C, c_stride 0, gets the batches added in batch order). SMELT_ENOMEM
 * when an operand not laid out along k cannot be repacked. */
int cpu_gemm_invariant(const struct cpu_gemm *g, const char *op, struct smelt_error *err);

int cpu_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                  struct smelt_error *err);
int cpu_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                           const struct tensor *ids, struct smelt_error *err);
int cpu_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                const struct tensor *w, float eps, struct smelt_error *err);
int cpu_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w,
                         const struct tensor *rstd, struct smelt_error *err);
int cpu_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                  const struct tensor *x, const struct tensor *w, const struct tensor *b,
                  float eps, struct smelt_error *err);
int cpu_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                           const struct tensor *dy, const struct tensor *x,
                           const struct tensor *w, const struct tensor *mean,
                           const struct tensor *rstd, struct smelt_error *err);
int cpu_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
             const struct ops_rope_freqs *f, struct smelt_error *err);
int cpu_rope_backward(struct tensor *dx, const struct tensor *dy,
                      const struct tensor *positions, const struct ops_rope_freqs *f,
                      struct smelt_error *err);
int cpu_attention(struct tensor *out, struct tensor *lse, const struct tensor *q,
                  const struct tensor *k, const struct tensor *v,
                  const struct tensor *cu_seqlens, float scale, struct smelt_error *err);
int cpu_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                           const struct tensor *dout, const struct tensor *q,
                           const struct tensor *k, const struct tensor *v,
                           const struct tensor *out, const struct tensor *lse,
                           const struct tensor *cu_seqlens, float scale,
                           struct smelt_error *err);
int cpu_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                  const struct tensor *v, const struct tensor *slot_mapping,
                  struct smelt_error *err);
int cpu_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                        const struct tensor *v_cache, const struct tensor *block_tables,
                        const struct tensor *cu_q, const struct tensor *context_lens,
                        float scale, struct smelt_error *err);
int cpu_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
               struct smelt_error *err);
int cpu_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                        const struct tensor *gate, const struct tensor *up,
                        struct smelt_error *err);
int cpu_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err);
int cpu_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                      struct smelt_error *err);
int cpu_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
            struct smelt_error *err);
int cpu_accumulate(struct tensor *dst, const struct tensor *src, struct smelt_error *err);
int cpu_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err);
int cpu_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                 const struct tensor *targets, struct smelt_error *err);
int cpu_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                          const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *lse, struct smelt_error *err);
int cpu_adamw(struct tensor *params, struct tensor *m, struct tensor *v,
              const struct tensor *grads, const struct adamw_config *config,
              struct smelt_error *err);
int cpu_sum_squares(double *out, const struct tensor *x, struct smelt_error *err);
int cpu_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err);

/* Shared by attention.c, paged_attention.c and matmul_invariant.c: the same summation
 * order is what makes attention through the paged cache give ops_attention's numbers,
 * and the batch-invariant matmul's every element. */
#define DOT_LANES 8

/* sum a[i] * b[i] in a fixed order: DOT_LANES partial sums (vectorisable without
 * reassociation), a scalar tail, then the lanes combined pairwise. */
static inline float cpu_dot(const float *a, const float *b, int64_t n) {
    float acc[DOT_LANES] = {0};
    int64_t i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    return s + tail;
}

/* y += alpha * x. The pragma vectorises it at -O2 (whose cost model would not, for an
 * unknown n); every element is computed alone, so the bits do not change. */
static inline void cpu_axpy(float *restrict y, float alpha, const float *restrict x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* The sequence holding token t of a packed row: the last s with cu[s] <= t (empty
 * sequences before it share its start, and the last of them is t's own). */
static inline int64_t cpu_seq_of(const int32_t *cu, int64_t nseq, int64_t t) {
    int64_t lo = 0, hi = nseq - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

#endif
