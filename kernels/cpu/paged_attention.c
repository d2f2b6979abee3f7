/* The paged KV cache in fp32: appending new tokens' keys and values, and causal
 * attention of query tokens over what the cache holds.
 *
 * Layout: k_cache, v_cache [n_blocks, block_size, Hkv, D], so slot
 * block * block_size + offset is row `slot` of a [n_slots, Hkv, D] array. A sequence's
 * position p lives in block block_tables[s][p / block_size] at offset p % block_size.
 *
 * The append splits each token row's columns between threads (as the embedding
 * backward does), and every thread walks the tokens in order: a slot given twice keeps
 * the last token's row, for any thread count.
 *
 * The attention computes one query row (token, head) start to finish, like
 * kernels/cpu/attention.c and with its arithmetic in its order (fixed-lane dot
 * products, max, exp, sum and weighted sum over keys in position order, one division),
 * reading key j through the block table instead of from a packed array. A sequence
 * attended through the cache therefore gives ops_attention's numbers; only the row of
 * scores is sized by the context instead of the packed sequence. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Below this much work a thread team costs more than it saves (attention.c's and
 * embedding.c's cut-offs: multiply-adds, floats copied). */
#define PAGED_PARALLEL_MIN_WORK 16384
#define APPEND_PARALLEL_MIN_FLOATS 32768

/* ---- append ---- */

int cpu_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                  const struct tensor *v, const struct tensor *slot_mapping,
                  struct smelt_error *err) {
    int64_t tokens = k->shape[0], width = k->shape[1] * k->shape[2];
    int64_t blocks = k_cache->shape[0], block_size = k_cache->shape[1];
    int64_t slots = blocks * block_size;
    const int32_t *slot = slot_mapping->data;
    /* All slots first: a refused call writes nothing. */
    for (int64_t t = 0; t < tokens; t++)
        if (slot[t] >= slots)
            return error_set(err, SMELT_EINVAL,
                             "ops_kv_append: slot_mapping[%lld] is %d, outside the pool of %lld slots "
                             "(%lld blocks of %lld)",
                             (long long)t, slot[t], (long long)slots, (long long)blocks,
                             (long long)block_size);
    float *kc = k_cache->data, *vc = v_cache->data;
    const float *kp = k->data, *vp = v->data;
    enum { COLUMNS = 64 };
    int64_t chunks = (width + COLUMNS - 1) / COLUMNS;
#pragma omp parallel for schedule(static) if (tokens * width >= APPEND_PARALLEL_MIN_FLOATS)
    for (int64_t b = 0; b < chunks; b++) {
        int64_t c0 = b * COLUMNS, n = c0 + COLUMNS < width ? COLUMNS : width - c0;
        for (int64_t t = 0; t < tokens; t++) {
            if (slot[t] < 0) continue; /* a padding token: not cached */
            int64_t dst = (int64_t)slot[t] * width + c0, src = t * width + c0;
            memcpy(kc + dst, kp + src, (size_t)n * sizeof *kc);
            memcpy(vc + dst, vp + src, (size_t)n * sizeof *vc);
        }
    }
    return SMELT_OK;
}

/* ---- attention ---- */

/* The shapes of one call, read once from the validated tensors. */
struct paged_dims {
    int64_t tokens, hq, hkv, dim;
    int64_t group;                  /* q heads per kv head */
    int64_t nseq;                   /* S: cu_q has S + 1 entries */
    int64_t n_blocks, block_size, max_blocks;
    int64_t max_context;            /* longest context: the row of scores */
    const int32_t *cu, *context_lens, *tables;
};

static struct paged_dims paged_dims_of(const struct tensor *q, const struct tensor *k_cache,
                                       const struct tensor *block_tables, const struct tensor *cu_q,
                                       const struct tensor *context_lens) {
    struct paged_dims d = {
        .tokens = q->shape[0], .hq = q->shape[1], .hkv = k_cache->shape[2], .dim = q->shape[2],
        .nseq = tensor_numel(cu_q) - 1, .n_blocks = k_cache->shape[0],
        .block_size = k_cache->shape[1], .max_blocks = block_tables->shape[1],
        .cu = cu_q->data, .context_lens = context_lens->data, .tables = block_tables->data,
    };
    d.group = d.hq / d.hkv;
    for (int64_t s = 0; s < d.nseq; s++)
        if (d.context_lens[s] > d.max_context) d.max_context = d.context_lens[s];
    return d;
}

/* Block ids in the used part of each row (the blocks holding positions
 * 0 .. context_lens[s] - 1) must name blocks of the pool; the rest is ignored. */
static int check_block_ids(const struct paged_dims *d, struct smelt_error *err) {
    for (int64_t s = 0; s < d->nseq; s++) {
        int64_t used = (d->context_lens[s] + d->block_size - 1) / d->block_size;
        const int32_t *row = d->tables + s * d->max_blocks;
        for (int64_t j = 0; j < used; j++)
            if (row[j] < 0 || row[j] >= d->n_blocks)
                return error_set(err, SMELT_EINVAL,
                                 "ops_paged_attention: block_tables[%lld][%lld] is %d, outside the pool "
                                 "[0, %lld) (sequence %lld reads %lld blocks)",
                                 (long long)s, (long long)j, row[j], (long long)d->n_blocks,
                                 (long long)s, (long long)used);
    }
    return SMELT_OK;
}


/* Keys query token t of sequence s attends to: positions 0 .. its own. */
static int64_t keys_of(const struct paged_dims *d, int64_t s, int64_t t) {
    int64_t queries = (int64_t)d->cu[s + 1] - d->cu[s];
    return (int64_t)d->context_lens[s] - queries + (t - d->cu[s]) + 1;
}

/* Work estimate for the parallel cut-off: every (query, key) pair of every q head. */
static bool paged_worth_threads(const struct paged_dims *d) {
    double pairs = 0;
    for (int64_t s = 0; s < d->nseq; s++) {
        double queries = (double)d->cu[s + 1] - d->cu[s], first = (double)d->context_lens[s] - queries + 1;
        pairs += queries * first + queries * (queries - 1) / 2;
    }
    return pairs * (double)d->hq * (double)(d->dim + 1) >= PAGED_PARALLEL_MIN_WORK;
}

/* Row (position pos, kv head kvh) of a cache, through a sequence's block table. */
static inline const float *cache_row(const struct paged_dims *d, const float *cache,
                                     const int32_t *table, int64_t pos, int64_t kvh) {
    int64_t slot = (int64_t)table[pos / d->block_size] * d->block_size + pos % d->block_size;
    return cache + (slot * d->hkv + kvh) * d->dim;
}

/* out[t, h] for one query row; scores has room for the longest context. */
static void paged_row_forward(const struct paged_dims *d, int64_t t, int64_t h, const float *q,
                              const float *k_cache, const float *v_cache, float scale, float *out,
                              float *scores) {
    int64_t s = cpu_seq_of(d->cu, d->nseq, t), n = keys_of(d, s, t), dim = d->dim, kvh = h / d->group;
    const int32_t *table = d->tables + s * d->max_blocks;
    const float *qi = q + (t * d->hq + h) * dim;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        scores[j] = scale * cpu_dot(qi, cache_row(d, k_cache, table, j, kvh), dim);
        if (scores[j] > m) m = scores[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - m);
        sum += scores[j];
    }
    float *oi = out + (t * d->hq + h) * dim;
    for (int64_t c = 0; c < dim; c++) oi[c] = 0.0f;
    for (int64_t j = 0; j < n; j++) cpu_axpy(oi, scores[j], cache_row(d, v_cache, table, j, kvh), dim);
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < dim; c++) oi[c] *= inv;
}

int cpu_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                        const struct tensor *v_cache, const struct tensor *block_tables,
                        const struct tensor *cu_q, const struct tensor *context_lens,
                        float scale, struct smelt_error *err) {
    struct paged_dims d = paged_dims_of(q, k_cache, block_tables, cu_q, context_lens);
    int rc = check_block_ids(&d, err);
    if (rc) return rc;
    int64_t rows = d.tokens * d.hq;
    if (rows == 0 || d.dim == 0) return SMELT_OK;
    /* One row of scores per thread, each a multiple of 64 bytes (no shared cache lines). */
    int64_t stride = d.max_context > 0 ? (d.max_context + 15) / 16 * 16 : 16;
    int64_t bytes = stride * (int64_t)omp_get_max_threads() * (int64_t)sizeof(float);
    float *scratch = malloc((size_t)bytes);
    if (!scratch)
        return error_set(err, SMELT_ENOMEM, "ops_paged_attention: cannot allocate %lld bytes of scratch",
                         (long long)bytes);
    const float *qp = q->data, *kp = k_cache->data, *vp = v_cache->data;
    float *op = out->data;
#pragma omp parallel if (paged_worth_threads(&d))
    {
        float *scores = scratch + omp_get_thread_num() * stride;
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; r++)
            paged_row_forward(&d, r / d.hq, r % d.hq, qp, kp, vp, scale, op, scores);
    }
    free(scratch);
    return SMELT_OK;
}
