/* The CPU backend's table and its memory functions. */
#include "kernels/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

static int cpu_alloc(void **ptr, size_t bytes, struct smelt_error *err) {
    /* 64-byte alignment for AVX-512 loads; aligned_alloc wants a multiple of it. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (!p) return error_set(err, SMELT_ENOMEM, "cpu: cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    *ptr = p;
    return SMELT_OK;
}

static void cpu_free(void *ptr) { free(ptr); }

static int cpu_zero(void *ptr, size_t bytes, struct smelt_error *err) {
    (void)err;
    memset(ptr, 0, bytes);
    return SMELT_OK;
}

static int cpu_copy(void *dst, const void *src, size_t bytes, struct smelt_error *err) {
    (void)err;
    memmove(dst, src, bytes);
    return SMELT_OK;
}

const struct backend_ops cpu_backend_ops = {
    .name = "cpu",
    .compute_dtypes = 1u << DTYPE_F32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy_to_host = cpu_copy,
    .copy_from_host = cpu_copy,
    .copy_within = cpu_copy,
    .set_batch_invariant = cpu_set_batch_invariant,
    .batch_invariant = cpu_batch_invariant,
    .matmul = cpu_matmul,
    .matmul_backward = cpu_matmul_backward,
    .embedding = cpu_embedding,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .layernorm = cpu_layernorm,
    .layernorm_backward = cpu_layernorm_backward,
    .rope = cpu_rope,
    .rope_backward = cpu_rope_backward,
    .attention = cpu_attention,
    .attention_backward = cpu_attention_backward,
    .kv_append = cpu_kv_append,
    .paged_attention = cpu_paged_attention,
    .swiglu = cpu_swiglu,
    .swiglu_backward = cpu_swiglu_backward,
    .gelu = cpu_gelu,
    .gelu_backward = cpu_gelu_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .logprobs = cpu_logprobs,
    .argmax = cpu_argmax,
    .logprobs_backward = cpu_logprobs_backward,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .cast = cpu_cast,
};
