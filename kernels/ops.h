/* kernels/ops.h — the compute core's one interface: tensors, backends, and every
 * operation the models and trainers call, each with its backward.
 *
 * Conventions (read these once; every op below follows them):
 *
 *  - A tensor is contiguous row-major memory with a dtype, up to 4 dims, and the backend
 *    that owns the memory. Tensors never own memory by themselves: tensor_alloc'd data is
 *    freed with tensor_free by whoever allocated it; tensor_make wraps memory it does
 *    not own.
 *  - Every op returns 0 or a negative SMELT_E* code and fills `err`. Shapes, dtypes and
 *    backends are checked before any work: a mismatch is SMELT_EINVAL (or
 *    SMELT_EUNSUPPORTED for a dtype the backend lacks) naming the op and the tensor.
 *    Data-dependent checks (token ids in range) are done by the backend.
 *  - All tensors given to one op live on the same backend, except `cu_seqlens`, which
 *    is always host (BACKEND_CPU) memory: schedulers build it on the host and kernels
 *    need it to size their work.
 *  - "Compute" tensors (activations, weights) share one dtype per call: f32 on the CPU
 *    backend; f32 or bf16 on CUDA. Saved statistics (rstd, mean, lse), logprobs, and the
 *    AdamW state are always f32. Index tensors (ids, targets, positions, cu_seqlens)
 *    are i32.
 *  - Backward ops ACCUMULATE: every gradient output gets `+=`, never `=`. Callers zero
 *    gradient buffers (tensor_zero) when a fresh gradient is wanted. This makes residual
 *    branches and shared weights free. Gradient outputs may be NULL when not needed
 *    (a frozen weight), and must not alias any input of the same call.
 *  - Forward outputs must not alias inputs unless the op says so.
 *  - Results are deterministic: the same inputs on the same backend and thread count
 *    give bit-identical outputs (reductions run in a fixed order).
 */
#ifndef SMELT_KERNELS_OPS_H
#define SMELT_KERNELS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

enum dtype { DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_I32, DTYPE_COUNT };
enum backend { BACKEND_CPU, BACKEND_CUDA, BACKEND_COUNT };

#define TENSOR_MAX_DIMS 4

struct tensor {
    enum dtype dtype;
    enum backend backend;
    int ndim;                         /* 1..TENSOR_MAX_DIMS */
    int64_t shape[TENSOR_MAX_DIMS];   /* shape[i] >= 1 for i < ndim; unused dims are 1 */
    void *data;                       /* contiguous, row-major; not owned by the struct */
};

/* ---- dtypes, backends ------------------------------------------------------------ */

size_t dtype_size(enum dtype dtype);
const char *dtype_name(enum dtype dtype);     /* "f32", "bf16", "f16", "i32" */
const char *backend_name(enum backend backend); /* "cpu", "cuda" */

/* Whether the backend was compiled in and has a device (CPU: always). */
bool backend_available(enum backend backend);

/* "cpu", "cuda", or "auto" (CUDA when available, else CPU). SMELT_EINVAL for an unknown
 * name, SMELT_EUNSUPPORTED for a backend this build or machine lacks. */
int backend_from_name(const char *name, enum backend *out, struct smelt_error *err);

/* The CPU backend's GEMM kernels. Call backend_cpu_select_kernels(argv) first thing in
 * main(): where OpenBLAS would run kernels far below the CPU's abilities (its fallback on
 * cores it does not know), it re-executes the program once with OPENBLAS_CORETYPE set
 * from the CPU's features; it returns when nothing needs doing, when the variable is
 * already set (always respected), or when re-executing failed (a warning on stderr).
 * backend_cpu_blas_kernels names the set in use ("Haswell", "SkylakeX", ...) for logs,
 * job events and benchmark output. */
void backend_cpu_select_kernels(char **argv);
const char *backend_cpu_blas_kernels(void);
/* The threads the CPU backend's parallel regions use: one OpenMP pool, which OpenBLAS's
 * GEMMs share (it is linked in its OpenMP build); OMP_NUM_THREADS sets it. */
int backend_cpu_threads(void);

/* Waits until every op issued so far on the backend has finished, and reports a fault
 * an asynchronous kernel raised meanwhile (SMELT_EBACKEND). Ops on a device backend
 * may return before their work is done; benchmarks call this before reading a clock.
 * The CPU backend is synchronous: a no-op. */
int backend_sync(enum backend backend, struct smelt_error *err);

/* Batch-invariant mode: a token's numbers do not depend on the batch it runs in.
 *
 * By default the CPU backend's forward matmul is OpenBLAS, whose result for one row
 * depends on how many rows the call has (its microkernels differ for row remainders, and
 * one row goes through sgemv): the rollout engine, which decodes as many rows as it has
 * sequences running, and the trainer, which scores the same tokens in packed batches,
 * then agree only to about 1e-7. With the mode on, every element of ops_matmul's forward
 * output is one dot product in a fixed order (kernels/cpu/matmul_invariant.c) that
 * depends on nothing but the element's own row and column: not on the row count, the
 * thread count, or the row's place in the batch. Every other op of the forward pass is
 * already computed row by row in a fixed order, so with the mode on a token's logprob has
 * the same bits in a decode step, a prefill chunk or a training batch: the engine's
 * logprobs equal the trainer's, and the first update's KL to the sampling policy is 0.
 * Backward ops keep OpenBLAS. The price: the forward products run on smelt's own kernel
 * (kernels/README.md gives the measured speed).
 *
 * The setting is per backend and per process, read by every op call: the trainer and a
 * colocated engine in one process share it; a smelt-rollout worker takes
 * --batch-invariant. Set it before ops run (a switch while another thread runs ops gives
 * those either arithmetic). Turning it on where the backend has no such mode (CUDA) is
 * SMELT_EUNSUPPORTED; turning it off always succeeds on an available backend. */
int ops_set_batch_invariant(enum backend backend, bool on, struct smelt_error *err);
bool ops_batch_invariant(enum backend backend);

/* Host scalar conversions with the rounding ops_cast uses (round to nearest even). */
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float x);

/* ---- tensors --------------------------------------------------------------------- */

/* Wraps memory the caller owns. SMELT_ASSERTs ndim in range (a programming error). */
struct tensor tensor_make(enum backend backend, enum dtype dtype, void *data, int ndim,
                          const int64_t *shape);
/* Host f32 view: the form tests and CPU code use most. */
struct tensor tensor_f32(float *data, int ndim, const int64_t *shape);
struct tensor tensor_i32(int32_t *data, int ndim, const int64_t *shape);

int64_t tensor_numel(const struct tensor *t);
size_t tensor_nbytes(const struct tensor *t);
/* Rows when the last dim is the row: numel / shape[ndim-1]. */
int64_t tensor_rows(const struct tensor *t);
bool tensor_same_shape(const struct tensor *a, const struct tensor *b);
/* "[4, 7]" into buf; returns buf. */
const char *tensor_shape_str(const struct tensor *t, char *buf, size_t buf_bytes);

/* Allocates zeroed memory on the backend (64-byte aligned on the CPU). Free with
 * tensor_free, which accepts a tensor whose data is NULL and sets data to NULL. */
int tensor_alloc(struct tensor *t, enum backend backend, enum dtype dtype, int ndim,
                 const int64_t *shape, struct smelt_error *err);
void tensor_free(struct tensor *t);

/* Sets every byte to zero. */
int tensor_zero(struct tensor *t, struct smelt_error *err);

/* Copies bytes between tensors of the same dtype and numel, across backends too
 * (host<->device). */
int tensor_copy(struct tensor *dst, const struct tensor *src, struct smelt_error *err);

/* ---- matmul ---------------------------------------------------------------------- */

/* out = alpha * op(a) @ op(b) + bias + beta * out, op(x) = x or x^T.
 *   a: [M, K] ([K, M] when trans_a), or batched [B, M, K];
 *   b: [K, N] ([N, K] when trans_b), or batched [B, K, N];
 *   out: [M, N] or [B, M, N]; bias: [N] or NULL (added to every row).
 * A 2D operand next to a batched one is shared by every batch (the usual linear layer:
 * x [B, T, C] @ W^T with W [N, C]). beta = 0 ignores the old content of out
 * (NaN in it included). */
int ops_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
               const struct tensor *bias, bool trans_a, bool trans_b, float alpha,
               float beta, struct smelt_error *err);

/* Given dout = dL/dout for ops_matmul's out (same a, b, trans, alpha): da += dL/da,
 * db += dL/db (summed over batches when b was shared), dbias += column sums of dout. */
int ops_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                        const struct tensor *dout, const struct tensor *a,
                        const struct tensor *b, bool trans_a, bool trans_b, float alpha,
                        struct smelt_error *err);

/* ---- embedding ------------------------------------------------------------------- */

/* out[t, :] = table[ids[t], :]. ids: i32, any shape, T = numel; table [V, C]; out
 * [T, C] (or ids' shape + [C]). An id outside [0, V) is SMELT_EINVAL naming it and
 * its position. */
int ops_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                  struct smelt_error *err);
/* dtable[ids[t], :] += dout[t, :]. */
int ops_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                           const struct tensor *ids, struct smelt_error *err);

/* ---- normalisation --------------------------------------------------------------- */

/* Per row of C = last dim: rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w.
 * x, y: [..., C]; w: [C]; rstd: f32 [rows] or NULL (not saved). y may alias x. */
int ops_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                const struct tensor *w, float eps, struct smelt_error *err);
int ops_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w,
                         const struct tensor *rstd, struct smelt_error *err);

/* Per row: mean, rstd = 1/sqrt(var + eps) (biased variance), y = (x - mean) * rstd * w + b.
 * mean, rstd: f32 [rows] or NULL. y may alias x. */
int ops_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                  const struct tensor *x, const struct tensor *w, const struct tensor *b,
                  float eps, struct smelt_error *err);
int ops_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                           const struct tensor *dy, const struct tensor *x,
                           const struct tensor *w, const struct tensor *mean,
                           const struct tensor *rstd, struct smelt_error *err);

/* ---- rotary position embedding --------------------------------------------------- */

/* Hugging Face "rotate_half" layout: for head dim D (even) and i < D/2, the pair
 * (x[i], x[i + D/2]) is rotated by angle pos * inv_freq[i], where
 * inv_freq[i] = 1 / theta^(2i/D) computed in f32 and the angle in f32, as
 * transformers does. x, y: [T, H, D]; positions: i32 [T] (per token, so packed
 * sequences restart at 0 and decode steps pass their offset). y may alias x. */
int ops_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
             float theta, struct smelt_error *err);
/* dx += R(-angle) dy. */
int ops_rope_backward(struct tensor *dx, const struct tensor *dy,
                      const struct tensor *positions, float theta, struct smelt_error *err);

/* Scaled rope (model/rope.h computes the table of each rope_type): inv_freq [n] on the
 * host, n = head_dim / 2, and scale, the factor cos and sin are multiplied by in f32
 * (transformers' attention_scaling: yarn's and longrope's; 1 otherwise). */
struct ops_rope_freqs {
    const float *inv_freq;
    int64_t n;
    float scale;
};
/* inv_freq[i] = 1 / theta^((float)(2i) / head_dim) for i < head_dim / 2, in f32 as
 * transformers computes the unscaled table. */
void ops_rope_default_freqs(float *inv_freq, int64_t head_dim, float theta);
/* y = scale * R(pos * inv_freq) x; the backward dx += scale * R(-angle) dy. */
int ops_rope_with(struct tensor *y, const struct tensor *x, const struct tensor *positions,
                  const struct ops_rope_freqs *f, struct smelt_error *err);
int ops_rope_with_backward(struct tensor *dx, const struct tensor *dy, const struct tensor *positions,
                           const struct ops_rope_freqs *f, struct smelt_error *err);

/* ---- attention ------------------------------------------------------------------- */

/* Causal self-attention over sequences packed in one token axis.
 *   q, out: [T, Hq, D]; k, v: [T, Hkv, D], Hq a multiple of Hkv; query head h reads
 *   kv head h / (Hq / Hkv) (grouped-query attention).
 *   cu_seqlens: host i32 [S + 1], cu[0] = 0, nondecreasing, cu[S] = T; sequence s is
 *   tokens [cu[s], cu[s+1]) and attends only within itself, causally.
 *   scale: usually 1/sqrt(D).
 *   lse: f32 [T, Hq] or NULL: log-sum-exp of the scaled scores of each query, saved
 *   for the backward (which recomputes probabilities from it). */
int ops_attention(struct tensor *out, struct tensor *lse, const struct tensor *q,
                  const struct tensor *k, const struct tensor *v,
                  const struct tensor *cu_seqlens, float scale, struct smelt_error *err);
int ops_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                           const struct tensor *dout, const struct tensor *q,
                           const struct tensor *k, const struct tensor *v,
                           const struct tensor *out, const struct tensor *lse,
                           const struct tensor *cu_seqlens, float scale,
                           struct smelt_error *err);

/* ---- paged KV cache (the rollout engine) ----------------------------------------- */

/* One layer's cache is a pool of blocks: k_cache, v_cache [n_blocks, block_size, Hkv, D].
 * A token's slot is block * block_size + offset; a sequence's block table lists its
 * blocks in order, so its token at position p lives in block_table[p / block_size] at
 * offset p % block_size.
 *
 * ops_kv_append writes k, v [T, Hkv, D] (the new tokens' keys and values, after rope)
 * to slots slot_mapping (i32 [T], on the tensors' backend; a negative slot skips the
 * token). A slot outside the pool is SMELT_EINVAL naming it. */
int ops_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                  const struct tensor *v, const struct tensor *slot_mapping,
                  struct smelt_error *err);

/* Causal attention of new query tokens over the cached keys and values.
 *   q, out: [T, Hq, D], sequences packed: sequence s owns query tokens
 *   [cu_q[s], cu_q[s+1]) — the LAST n_s = cu_q[s+1] - cu_q[s] tokens of a context of
 *   context_lens[s] tokens whose keys/values (the new ones included) are already in the
 *   cache. Query i of sequence s sits at position context_lens[s] - n_s + i and attends
 *   to positions 0..itself. A prefill is n_s = context_len (or a chunk of it), a decode
 *   step n_s = 1.
 *   block_tables: i32 [S, max_blocks] on the tensors' backend (unused entries ignored).
 *   cu_q: host i32 [S + 1]; context_lens: host i32 [S]; GQA as ops_attention.
 * Forward only (generation needs no gradient). Gives ops_attention's output for the
 * same tokens up to float rounding. */
int ops_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                        const struct tensor *v_cache, const struct tensor *block_tables,
                        const struct tensor *cu_q, const struct tensor *context_lens,
                        float scale, struct smelt_error *err);

/* ---- activations and residuals --------------------------------------------------- */

/* out = silu(gate) * up, silu(x) = x / (1 + exp(-x)). All the same shape; out may alias
 * gate or up. */
int ops_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
               struct smelt_error *err);
int ops_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                        const struct tensor *gate, const struct tensor *up,
                        struct smelt_error *err);

/* GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * out may alias x. */
int ops_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err);
int ops_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                      struct smelt_error *err);

/* out = a + b, same shapes; out may alias a or b. */
int ops_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
            struct smelt_error *err);
/* da += dout, db += dout (either may be NULL). */
int ops_add_backward(struct tensor *da, struct tensor *db, const struct tensor *dout,
                     struct smelt_error *err);

/* ---- token logprobs -------------------------------------------------------------- */

/* Fused log-softmax + gather: logprobs[t] = logits[t, targets[t]] - logsumexp(logits[t]).
 * logits [T, V] (or [..., V]); targets i32 with T elements; logprobs f32 [T];
 * lse f32 [T] or NULL (saved for the backward). A negative target means "no target":
 * its logprob is 0 and it gets no gradient. A target >= V is SMELT_EINVAL. */
int ops_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                 const struct tensor *targets, struct smelt_error *err);
/* dlogits[t, v] += dlogprobs[t] * (1[v == targets[t]] - softmax(logits[t])[v]),
 * never materialising the probabilities. */
int ops_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                          const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *lse, struct smelt_error *err);

/* ids[t] = the index of the largest of logits[t, 0..V): greedy decoding, on the
 * logits' backend so only the ids cross to the host. Ties go to the smallest index (as a
 * left-to-right scan with `>` keeps the first). A NaN logit is never chosen over a
 * number; a row of NaN only gives 0. logits [T, V] (or [..., V]), V >= 1; ids i32 with
 * T elements. */
int ops_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err);

/* ---- optimizer and reductions ---------------------------------------------------- */

struct adamw_config {
    float lr;
    float beta1, beta2;
    float eps;
    float weight_decay; /* decoupled: params *= 1 - lr * weight_decay */
    float grad_scale;   /* gradients are multiplied by this first (clipping, averaging) */
    int64_t step;       /* 1-based step count, for bias correction */
};

/* One AdamW step as torch.optim.AdamW computes it:
 *   g = grad_scale * grads; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   params *= 1 - lr wd; params -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
 * params, m, v, grads: f32, same numel. Updates params, m, v in place. */
int ops_adamw(struct tensor *params, struct tensor *m, struct tensor *v,
              const struct tensor *grads, const struct adamw_config *config,
              struct smelt_error *err);

/* *out = sum of x^2 over every element (f32 input, accumulated in double): the piece
 * of a global gradient norm each buffer contributes. */
int ops_sum_squares(double *out, const struct tensor *x, struct smelt_error *err);

/* ---- casts ----------------------------------------------------------------------- */

/* out = in converted between f32, bf16 and f16 (round to nearest even; NaN stays NaN,
 * overflow to f16 becomes inf). Same numel; same dtype is a copy. */
int ops_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err);

#endif
