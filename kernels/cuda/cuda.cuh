/* Private to kernels/cuda/: the CUDA backend's functions, gathered into
 * cuda_backend_ops by backend.cu. bf16 or f32 storage, fp32 accumulation, cuBLAS for
 * GEMM. Arguments arrive validated by kernels/ops.c; these check only what depends on
 * data (ids in range) or on the device. */
#ifndef SMELT_KERNELS_CUDA_CUDA_CUH
#define SMELT_KERNELS_CUDA_CUDA_CUH

#include "kernels/cuda/common.cuh"

int cuda_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
                const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
                struct smelt_error *err);
int cuda_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                         const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                         bool trans_a, bool trans_b, float alpha, struct smelt_error *err);
int cuda_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                   struct smelt_error *err);
int cuda_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                            const struct tensor *ids, struct smelt_error *err);
int cuda_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                 const struct tensor *w, float eps, struct smelt_error *err);
int cuda_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                          const struct tensor *x, const struct tensor *w,
                          const struct tensor *rstd, struct smelt_error *err);
int cuda_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                   const struct tensor *x, const struct tensor *w, const struct tensor *b,
                   float eps, struct smelt_error *err);
int cuda_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                            const struct tensor *dy, const struct tensor *x,
                            const struct tensor *w, const struct tensor *mean,
                            const struct tensor *rstd, struct smelt_error *err);
int cuda_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
              const struct ops_rope_freqs *f, struct smelt_error *err);
int cuda_rope_backward(struct tensor *dx, const struct tensor *dy, const struct tensor *positions,
                       const struct ops_rope_freqs *f, struct smelt_error *err);
int cuda_attention(struct tensor *out, struct tensor *lse, const struct tensor *q, const struct tensor *k,
                   const struct tensor *v, const struct tensor *cu_seqlens, float scale, struct smelt_error *err);
int cuda_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv, const struct tensor *dout,
                            const struct tensor *q, const struct tensor *k, const struct tensor *v,
                            const struct tensor *out, const struct tensor *lse, const struct tensor *cu_seqlens,
                            float scale, struct smelt_error *err);
int cuda_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                   const struct tensor *v, const struct tensor *slot_mapping,
                   struct smelt_error *err);
int cuda_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                         const struct tensor *v_cache, const struct tensor *block_tables,
                         const struct tensor *cu_q, const struct tensor *context_lens, float scale,
                         struct smelt_error *err);
int cuda_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
                struct smelt_error *err);
int cuda_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                         const struct tensor *gate, const struct tensor *up,
                         struct smelt_error *err);
int cuda_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err);
int cuda_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                       struct smelt_error *err);
int cuda_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
             struct smelt_error *err);
int cuda_accumulate(struct tensor *dst, const struct tensor *src, struct smelt_error *err);
int cuda_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err);
int cuda_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                  const struct tensor *targets, struct smelt_error *err);
int cuda_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                           const struct tensor *logits, const struct tensor *targets,
                           const struct tensor *lse, struct smelt_error *err);
int cuda_adamw(struct tensor *params, struct tensor *m, struct tensor *v,
               const struct tensor *grads, const struct adamw_config *config,
               struct smelt_error *err);
int cuda_sum_squares(double *out, const struct tensor *x, struct smelt_error *err);
int cuda_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err);

#endif
