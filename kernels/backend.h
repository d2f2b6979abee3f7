/* Private to kernels/: the table each backend fills. ops.c validates every call
 * (shapes, dtypes, same backend) and then calls the table of the tensors' backend, so
 * backend functions may assume well-formed arguments and check only what depends on
 * data (token ids in range) or on the device (launch failures). A NULL entry means the
 * backend lacks the op; ops.c reports SMELT_EUNSUPPORTED. */
#ifndef SMELT_KERNELS_BACKEND_H
#define SMELT_KERNELS_BACKEND_H

#include "kernels/ops.h"

struct backend_ops {
    const char *name;
    /* Bit (1u << dtype) set for each dtype accepted as a compute dtype. */
    unsigned compute_dtypes;

    int (*alloc)(void **ptr, size_t bytes, struct smelt_error *err); /* zeroed */
    void (*free)(void *ptr);
    int (*zero)(void *ptr, size_t bytes, struct smelt_error *err);
    /* Copies between this backend's memory and the host, or within this backend. */
    int (*copy_to_host)(void *host_dst, const void *src, size_t bytes, struct smelt_error *err);
    int (*copy_from_host)(void *dst, const void *host_src, size_t bytes, struct smelt_error *err);
    int (*copy_within)(void *dst, const void *src, size_t bytes, struct smelt_error *err);
    /* Waits for the backend's queued work; NULL for a synchronous backend. */
    int (*sync)(struct smelt_error *err);
    /* Batch-invariant mode (ops_set_batch_invariant): switch and state. NULL for a
     * backend without it; ops.c then refuses to turn it on. */
    int (*set_batch_invariant)(bool on, struct smelt_error *err);
    bool (*batch_invariant)(void);

    int (*matmul)(struct tensor *out, const struct tensor *a, const struct tensor *b,
                  const struct tensor *bias, bool trans_a, bool trans_b, float alpha,
                  float beta, struct smelt_error *err);
    int (*matmul_backward)(struct tensor *da, struct tensor *db, struct tensor *dbias,
                           const struct tensor *dout, const struct tensor *a,
                           const struct tensor *b, bool trans_a, bool trans_b, float alpha,
                           struct smelt_error *err);
    int (*embedding)(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                     struct smelt_error *err);
    int (*embedding_backward)(struct tensor *dtable, const struct tensor *dout,
                              const struct tensor *ids, struct smelt_error *err);
    int (*rmsnorm)(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                   const struct tensor *w, float eps, struct smelt_error *err);
    int (*rmsnorm_backward)(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                            const struct tensor *x, const struct tensor *w,
                            const struct tensor *rstd, struct smelt_error *err);
    int (*layernorm)(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                     const struct tensor *x, const struct tensor *w, const struct tensor *b,
                     float eps, struct smelt_error *err);
    int (*layernorm_backward)(struct tensor *dx, struct tensor *dw, struct tensor *db,
                              const struct tensor *dy, const struct tensor *x,
                              const struct tensor *w, const struct tensor *mean,
                              const struct tensor *rstd, struct smelt_error *err);
    int (*rope)(struct tensor *y, const struct tensor *x, const struct tensor *positions,
                const struct ops_rope_freqs *f, struct smelt_error *err);
    int (*rope_backward)(struct tensor *dx, const struct tensor *dy,
                         const struct tensor *positions, const struct ops_rope_freqs *f,
                         struct smelt_error *err);
    int (*attention)(struct tensor *out, struct tensor *lse, const struct tensor *q,
                     const struct tensor *k, const struct tensor *v,
                     const struct tensor *cu_seqlens, float scale, struct smelt_error *err);
    int (*attention_backward)(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                              const struct tensor *dout, const struct tensor *q,
                              const struct tensor *k, const struct tensor *v,
                              const struct tensor *out, const struct tensor *lse,
                              const struct tensor *cu_seqlens, float scale,
                              struct smelt_error *err);
    /* Paged KV cache: slots and block ids are data, checked by the backend before any
     * write. */
    int (*kv_append)(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                     const struct tensor *v, const struct tensor *slot_mapping,
                     struct smelt_error *err);
    int (*paged_attention)(struct tensor *out, const struct tensor *q,
                           const struct tensor *k_cache, const struct tensor *v_cache,
                           const struct tensor *block_tables, const struct tensor *cu_q,
                           const struct tensor *context_lens, float scale,
                           struct smelt_error *err);
    int (*swiglu)(struct tensor *out, const struct tensor *gate, const struct tensor *up,
                  struct smelt_error *err);
    int (*swiglu_backward)(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                           const struct tensor *gate, const struct tensor *up,
                           struct smelt_error *err);
    int (*gelu)(struct tensor *out, const struct tensor *x, struct smelt_error *err);
    int (*gelu_backward)(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                         struct smelt_error *err);
    int (*add)(struct tensor *out, const struct tensor *a, const struct tensor *b,
               struct smelt_error *err);
    /* dst += src, same shape: the add backward and gradient accumulation. */
    int (*accumulate)(struct tensor *dst, const struct tensor *src, struct smelt_error *err);
    int (*logprobs)(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                    const struct tensor *targets, struct smelt_error *err);
    int (*logprobs_backward)(struct tensor *dlogits, const struct tensor *dlogprobs,
                             const struct tensor *logits, const struct tensor *targets,
                             const struct tensor *lse, struct smelt_error *err);
    int (*argmax)(struct tensor *ids, const struct tensor *logits, struct smelt_error *err);
    int (*adamw)(struct tensor *params, struct tensor *m, struct tensor *v,
                 const struct tensor *grads, const struct adamw_config *config,
                 struct smelt_error *err);
    int (*sum_squares)(double *out, const struct tensor *x, struct smelt_error *err);
    int (*cast)(struct tensor *out, const struct tensor *in, struct smelt_error *err);
};

/* The table of an available backend, or NULL. */
const struct backend_ops *backend_ops_get(enum backend backend);

/* Defined by kernels/cpu/ (always) and kernels/cuda/ (when built with CUDA). */
extern const struct backend_ops cpu_backend_ops;
#ifdef SMELT_CUDA
extern const struct backend_ops cuda_backend_ops;
/* Whether a CUDA device is usable; called once by backend_available. */
bool cuda_backend_probe(void);
#endif

#endif
