/* The forward pass for generation: the same blocks as training (model_layer_forward),
 * with attention over a paged KV cache, and logits only for each sequence's last token. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

struct model_step_buffers {
    int64_t max_tokens;
    int max_seqs, max_blocks;
    struct layer_acts layer;             /* one layer's activations, reused by every layer */
    struct tensor x_a, x_b;              /* [T, C] the residual stream, ping-pong */
    struct tensor last, last_norm;       /* [S, C] each sequence's last hidden state */
    struct tensor rstd, mean;            /* [S] */
    struct tensor logits;                /* [S, V] */
    struct tensor ids, positions, slots; /* i32 [T] on the backend */
    struct tensor block_tables;          /* i32 [S, max_blocks] on the backend */
    struct tensor last_rows;             /* i32 [S] on the backend: each sequence's last token */
    int32_t *host_positions;             /* [T] */
    int32_t *host_last_rows;             /* [S] */
    int n_seqs;                          /* of the last step */
};

int64_t model_kv_bytes_per_token(const struct model *m) {
    const struct model_config *c = &m->config;
    return 2 * c->n_layers * c->n_kv_heads * c->head_dim * (int64_t)sizeof(float);
}

void model_kv_cache_free(struct model_kv_cache *cache) {
    if (!cache) return;
    for (int64_t l = 0; cache->k && l < cache->n_layers; l++) tensor_free(&cache->k[l]);
    for (int64_t l = 0; cache->v && l < cache->n_layers; l++) tensor_free(&cache->v[l]);
    free(cache->k);
    free(cache->v);
    memset(cache, 0, sizeof *cache);
}

int model_kv_cache_alloc(const struct model *m, int64_t n_blocks, int64_t block_size,
                         struct model_kv_cache *out, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    if (n_blocks < 1 || block_size < 1)
        return error_set(err, SMELT_EINVAL, "kv cache: %lld blocks of %lld tokens", (long long)n_blocks,
                         (long long)block_size);
    const struct model_config *c = &m->config;
    out->n_blocks = n_blocks;
    out->block_size = block_size;
    out->n_layers = c->n_layers;
    out->k = calloc((size_t)c->n_layers, sizeof *out->k);
    out->v = calloc((size_t)c->n_layers, sizeof *out->v);
    int rc = out->k && out->v ? SMELT_OK : error_set(err, SMELT_ENOMEM, "kv cache: out of memory");
    int64_t shape[4] = {n_blocks, block_size, c->n_kv_heads, c->head_dim};
    for (int64_t l = 0; !rc && l < c->n_layers; l++) {
        rc = tensor_alloc(&out->k[l], m->backend, DTYPE_F32, 4, shape, err);
        if (!rc) rc = tensor_alloc(&out->v[l], m->backend, DTYPE_F32, 4, shape, err);
    }
    if (rc) {
        model_kv_cache_free(out);
        return error_wrap(err, rc, "kv cache of %lld blocks", (long long)n_blocks);
    }
    return SMELT_OK;
}

int model_kv_cache_copy_block(struct model_kv_cache *cache, int32_t src, int32_t dst,
                              struct smelt_error *err) {
    if (src < 0 || dst < 0 || src >= cache->n_blocks || dst >= cache->n_blocks)
        return error_set(err, SMELT_EINVAL, "kv cache: copy of block %d to %d outside [0, %lld)", src, dst,
                         (long long)cache->n_blocks);
    for (int64_t l = 0; l < cache->n_layers; l++) {
        struct tensor *caches[2] = {&cache->k[l], &cache->v[l]};
        for (int i = 0; i < 2; i++) {
            struct tensor *t = caches[i];
            int64_t per_block = tensor_numel(t) / cache->n_blocks;
            char *base = t->data;
            size_t bytes = (size_t)per_block * dtype_size(t->dtype);
            struct tensor from = tensor_make(t->backend, t->dtype, base + (size_t)src * bytes, 1, &per_block);
            struct tensor to = tensor_make(t->backend, t->dtype, base + (size_t)dst * bytes, 1, &per_block);
            TRY(tensor_copy(&to, &from, err));
        }
    }
    return SMELT_OK;
}

void model_step_buffers_free(struct model_step_buffers *b) {
    if (!b) return;
    model_layer_acts_free(&b->layer);
    struct tensor *all[] = {&b->x_a, &b->x_b, &b->last, &b->last_norm, &b->rstd, &b->mean, &b->logits,
                            &b->ids, &b->positions, &b->slots, &b->block_tables, &b->last_rows};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
    free(b->host_positions);
    free(b->host_last_rows);
    free(b);
}

static int alloc2(struct tensor *t, enum backend be, enum dtype dt, int64_t rows, int64_t cols,
                  struct smelt_error *err) {
    int64_t shape[2] = {rows, cols};
    return tensor_alloc(t, be, dt, 2, shape, err);
}

int model_step_buffers_alloc(const struct model *m, int64_t max_tokens, int max_seqs, int max_blocks,
                             struct model_step_buffers **out, struct smelt_error *err) {
    if (max_tokens < 1 || max_seqs < 1 || max_blocks < 1)
        return error_set(err, SMELT_EINVAL, "step buffers: max_tokens, max_seqs and max_blocks must be >= 1");
    TRY(model_check_lm_head(m, "step buffers", err));
    struct model_step_buffers *b = calloc(1, sizeof *b);
    if (!b) return error_set(err, SMELT_ENOMEM, "step buffers: out of memory");
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->max_blocks = max_blocks;
    struct dims d = model_dims(m);
    enum backend be = m->backend;
    int rc = model_layer_acts_alloc(m, &b->layer, max_tokens, err);
    if (!rc) rc = alloc2(&b->x_a, be, DTYPE_F32, max_tokens, d.C, err);
    if (!rc) rc = alloc2(&b->x_b, be, DTYPE_F32, max_tokens, d.C, err);
    if (!rc) rc = alloc2(&b->last, be, DTYPE_F32, max_seqs, d.C, err);
    if (!rc) rc = alloc2(&b->last_norm, be, DTYPE_F32, max_seqs, d.C, err);
    if (!rc) rc = alloc2(&b->rstd, be, DTYPE_F32, max_seqs, 1, err);
    if (!rc) rc = alloc2(&b->mean, be, DTYPE_F32, max_seqs, 1, err);
    if (!rc) rc = alloc2(&b->logits, be, DTYPE_F32, max_seqs, d.V, err);
    if (!rc) rc = alloc2(&b->ids, be, DTYPE_I32, max_tokens, 1, err);
    if (!rc) rc = alloc2(&b->positions, be, DTYPE_I32, max_tokens, 1, err);
    if (!rc) rc = alloc2(&b->slots, be, DTYPE_I32, max_tokens, 1, err);
    if (!rc) rc = alloc2(&b->block_tables, be, DTYPE_I32, max_seqs, max_blocks, err);
    if (!rc) rc = alloc2(&b->last_rows, be, DTYPE_I32, max_seqs, 1, err);
    if (!rc && (!(b->host_positions = malloc((size_t)max_tokens * sizeof *b->host_positions)) ||
                !(b->host_last_rows = malloc((size_t)max_seqs * sizeof *b->host_last_rows))))
        rc = error_set(err, SMELT_ENOMEM, "step buffers: out of memory");
    if (rc) {
        model_step_buffers_free(b);
        return error_wrap(err, rc, "step buffers for %lld tokens", (long long)max_tokens);
    }
    *out = b;
    return SMELT_OK;
}

static int check_paged_batch(const struct model *m, const struct model_step_buffers *b,
                             const struct model_kv_cache *cache, const struct model_paged_batch *pb,
                             struct smelt_error *err) {
    if (pb->n_tokens < 1 || pb->n_tokens > b->max_tokens || pb->n_seqs < 1 || pb->n_seqs > b->max_seqs ||
        pb->max_blocks < 1 || pb->max_blocks > b->max_blocks)
        return error_set(err, SMELT_EINVAL, "model_forward_paged: %lld tokens, %d sequences, %d blocks per sequence exceed the buffers (%lld, %d, %d)",
                         (long long)pb->n_tokens, pb->n_seqs, pb->max_blocks, (long long)b->max_tokens,
                         b->max_seqs, b->max_blocks);
    if (cache->n_layers != m->config.n_layers)
        return error_set(err, SMELT_EINVAL, "model_forward_paged: the cache has %lld layers, the model %lld",
                         (long long)cache->n_layers, (long long)m->config.n_layers);
    if (pb->cu_q[0] != 0 || pb->cu_q[pb->n_seqs] != pb->n_tokens)
        return error_set(err, SMELT_EINVAL, "model_forward_paged: cu_q must run from 0 to %lld", (long long)pb->n_tokens);
    for (int s = 0; s < pb->n_seqs; s++) {
        int32_t n = pb->cu_q[s + 1] - pb->cu_q[s];
        if (n < 1 || pb->context_lens[s] < n || pb->context_lens[s] > m->config.max_seq_len)
            return error_set(err, SMELT_EINVAL, "model_forward_paged: sequence %d adds %d tokens to a context of %d (model context %lld)",
                             s, n, pb->context_lens[s], (long long)m->config.max_seq_len);
    }
    return SMELT_OK;
}

struct tensor model_step_logits(const struct model_step_buffers *b) {
    int64_t shape[2] = {b->n_seqs, b->logits.shape[1]};
    return tensor_make(b->logits.backend, DTYPE_F32, b->logits.data, 2, shape);
}

int model_forward_paged(struct model *m, struct model_step_buffers *b, struct model_kv_cache *cache,
                        const struct model_paged_batch *pb, struct smelt_error *err) {
    b->n_seqs = 0;
    if (m->provider || !m->weights.data)
        return error_set(err, SMELT_EUNSUPPORTED, "model_forward_paged: the model's parameters are sharded "
                         "(ZeRO-3); generation needs a whole model (gather it first)");
    TRY(check_paged_batch(m, b, cache, pb, err));
    const struct model_config *c = &m->config;
    struct dims d = model_dims(m);
    int64_t T = pb->n_tokens, S = pb->n_seqs;
    for (int64_t s = 0; s < S; s++)
        for (int32_t t = pb->cu_q[s]; t < pb->cu_q[s + 1]; t++)
            b->host_positions[t] = pb->context_lens[s] - (pb->cu_q[s + 1] - t);
    struct tensor ids = rows1(&b->ids, T), pos = rows1(&b->positions, T), slots = rows1(&b->slots, T);
    int64_t bt_shape[2] = {S, pb->max_blocks};
    struct tensor bt = tensor_make(b->block_tables.backend, DTYPE_I32, b->block_tables.data, 2, bt_shape);
    struct tensor h_ids = tensor_i32((int32_t *)pb->ids, 1, &T), h_pos = tensor_i32(b->host_positions, 1, &T);
    struct tensor h_slots = tensor_i32((int32_t *)pb->slot_mapping, 1, &T);
    struct tensor h_bt = tensor_i32((int32_t *)pb->block_tables, 2, bt_shape);
    TRY(tensor_copy(&ids, &h_ids, err));
    TRY(tensor_copy(&pos, &h_pos, err));
    TRY(tensor_copy(&slots, &h_slots, err));
    TRY(tensor_copy(&bt, &h_bt, err));
    int64_t S1 = S + 1;
    struct tensor cu_q = tensor_i32((int32_t *)pb->cu_q, 1, &S1), ctx = tensor_i32((int32_t *)pb->context_lens, 1, &S);

    struct tensor x = rows2(&b->x_a, T, d.C), x_next = rows2(&b->x_b, T, d.C);
    TRY(ops_embedding(&x, &ids, &m->w.wte, err));
    if (c->positions == MODEL_POS_LEARNED) {
        struct tensor pe = rows2(&b->x_b, T, d.C);
        TRY(ops_embedding(&pe, &pos, &m->w.wpe, err));
        TRY(ops_add(&x, &x, &pe, err));
    }
    for (int64_t l = 0; l < c->n_layers; l++) {
        b->layer.x_in = x; /* borrowed for the views; never freed through layer */
        struct layer_views v = model_layer_views(m, &b->layer, &x_next, T);
        struct paged_attn pa = {.k_cache = &cache->k[l], .v_cache = &cache->v[l], .slot_mapping = &slots,
                                .block_tables = &bt, .cu_q = &cu_q, .context_lens = &ctx};
        int rc = model_layer_forward(m, l, &m->w.layers[l], &v, &pos, NULL, &pa, err);
        b->layer.x_in = (struct tensor){0};
        if (rc) return error_wrap(err, rc, "layer %lld", (long long)l);
        struct tensor t = x;
        x = x_next;
        x_next = t;
    }
    /* Each sequence's last token only: one gather (not a copy per sequence: on a device
     * each copy would be a synchronous call), final norm, lm_head. */
    for (int64_t s = 0; s < S; s++) b->host_last_rows[s] = pb->cu_q[s + 1] - 1;
    struct tensor last_rows = rows1(&b->last_rows, S), h_last_rows = tensor_i32(b->host_last_rows, 1, &S);
    struct tensor last = rows2(&b->last, S, d.C), hn = rows2(&b->last_norm, S, d.C);
    TRY(tensor_copy(&last_rows, &h_last_rows, err));
    TRY(ops_embedding(&last, &last_rows, &x, err));
    struct tensor rstd = rows1(&b->rstd, S), mean = rows1(&b->mean, S);
    TRY(model_norm_forward(m, &hn, c->norm == MODEL_NORM_LAYERNORM ? &mean : NULL, &rstd, &last, &m->w.final_norm_w,
                           m->w.final_norm_b.data ? &m->w.final_norm_b : NULL, err));
    struct tensor lg = rows2(&b->logits, S, d.V);
    TRY(model_lm_head_forward(m, 0, &lg, &hn, err));
    b->n_seqs = (int)S;
    return SMELT_OK;
}
