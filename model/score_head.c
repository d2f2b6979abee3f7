/* A reward model's scalar head on kernels/ops.h: the scored rows are gathered with
 * ops_embedding (a row gather, as the paged forward gathers each sequence's last row),
 * the dot products are one ops_matmul, and the backward scatters back with
 * ops_embedding_backward. Only the [S] positions are computed on the host. */
#include "model/model_internal.h"
#include "model/score_head.h"

#include <stdlib.h>

static int check_batch(const struct model *m, const struct model_batch *b, const char *fn,
                       struct smelt_error *err) {
    if (!m->config.score_head)
        return error_set(err, SMELT_EINVAL,
                         "%s: %s has no score head (a causal LM: model_classifier_from_lm "
                         "adds one)",
                         fn, m->config.architecture);
    if (!b || !b->ids || !b->cu_seqlens || b->n_seqs < 1 || b->n_tokens < 1)
        return error_set(err, SMELT_EINVAL, "%s: the batch needs ids, cu_seqlens and a sequence", fn);
    const int32_t *cu = b->cu_seqlens;
    bool ok = cu[0] == 0 && cu[b->n_seqs] == b->n_tokens;
    for (int s = 0; ok && s < b->n_seqs; s++) ok = cu[s + 1] > cu[s];
    if (!ok)
        return error_set(err, SMELT_EINVAL,
                         "%s: cu_seqlens must rise from 0 to n_tokens (%lld) with no empty sequence",
                         fn, (long long)b->n_tokens);
    return SMELT_OK;
}

/* f32, numel rows * cols, on the model's backend: what the ops below need. */
static int check_tensor(const struct model *m, const char *fn, const char *name,
                        const struct tensor *t, int64_t rows, int64_t cols, struct smelt_error *err) {
    if (!t) return SMELT_OK;
    if (t->dtype != DTYPE_F32 || tensor_numel(t) != rows * cols || t->backend != m->backend)
        return error_set(err, SMELT_EINVAL, "%s: %s must be f32 with %lld x %lld elements on the %s backend",
                         fn, name, (long long)rows, (long long)cols, backend_name(m->backend));
    return SMELT_OK;
}

int model_score_positions(const struct model *m, const struct model_batch *b, int32_t *pos,
                          struct smelt_error *err) {
    TRY(check_batch(m, b, "model_score_positions", err));
    int64_t pad = m->config.pad_token_id;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t first = b->cu_seqlens[s], last = b->cu_seqlens[s + 1] - 1;
        if (pad < 0) {
            pos[s] = last;
            continue;
        }
        int32_t t = last;
        while (t >= first && b->ids[t] == pad) t--;
        pos[s] = t >= first ? t : first;
    }
    return SMELT_OK;
}

/* The scored rows of hidden, gathered: rows [S, C], and the positions on the backend. */
struct gathered {
    struct tensor pos, rows;
};

static void gathered_free(struct gathered *g) {
    tensor_free(&g->pos);
    tensor_free(&g->rows);
}

static int gather(const struct model *m, const struct model_batch *b, const struct tensor *hidden,
                  struct gathered *g, struct smelt_error *err) {
    int64_t S = b->n_seqs, C = m->config.hidden_size;
    int32_t *host = malloc((size_t)S * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "score head: out of memory");
    int64_t rows_shape[2] = {S, C}, table_shape[2] = {b->n_tokens, C};
    struct tensor host_pos = tensor_i32(host, 1, &S);
    struct tensor table = tensor_make(hidden->backend, DTYPE_F32, hidden->data, 2, table_shape);
    int rc = model_score_positions(m, b, host, err);
    if (!rc) rc = tensor_alloc(&g->pos, m->backend, DTYPE_I32, 1, &S, err);
    if (!rc) rc = tensor_copy(&g->pos, &host_pos, err);
    if (!rc) rc = tensor_alloc(&g->rows, m->backend, DTYPE_F32, 2, rows_shape, err);
    if (!rc) rc = ops_embedding(&g->rows, &g->pos, &table, err);
    free(host);
    if (rc) gathered_free(g);
    return rc;
}

int model_score_forward(const struct model *m, const struct model_batch *b,
                        const struct tensor *hidden, struct tensor *scores,
                        struct smelt_error *err) {
    const char *fn = "model_score_forward";
    TRY(check_batch(m, b, fn, err));
    int64_t S = b->n_seqs, C = m->config.hidden_size;
    if (!hidden || !scores) return error_set(err, SMELT_EINVAL, "%s: hidden and scores are required", fn);
    TRY(check_tensor(m, fn, "hidden", hidden, b->n_tokens, C, err));
    TRY(check_tensor(m, fn, "scores", scores, S, 1, err));
    struct gathered g = {0};
    TRY(gather(m, b, hidden, &g, err));
    int64_t out_shape[2] = {S, 1};
    struct tensor out = tensor_make(scores->backend, DTYPE_F32, scores->data, 2, out_shape);
    int rc = ops_matmul(&out, &g.rows, &m->w.score, NULL, false, true, 1.0f, 0.0f, err);
    gathered_free(&g);
    return rc;
}

int model_score_backward(const struct model *m, const struct model_batch *b,
                         const struct tensor *hidden, const struct tensor *dscores,
                         struct tensor *dweight, struct tensor *dhidden,
                         struct smelt_error *err) {
    const char *fn = "model_score_backward";
    TRY(check_batch(m, b, fn, err));
    int64_t S = b->n_seqs, C = m->config.hidden_size;
    if (!hidden || !dscores) return error_set(err, SMELT_EINVAL, "%s: hidden and dscores are required", fn);
    TRY(check_tensor(m, fn, "hidden", hidden, b->n_tokens, C, err));
    TRY(check_tensor(m, fn, "dscores", dscores, S, 1, err));
    TRY(check_tensor(m, fn, "dweight", dweight, 1, C, err));
    TRY(check_tensor(m, fn, "dhidden", dhidden, b->n_tokens, C, err));
    struct gathered g = {0};
    TRY(gather(m, b, hidden, &g, err));
    int64_t ds_shape[2] = {S, 1}, w_shape[2] = {1, C}, h_shape[2] = {b->n_tokens, C};
    struct tensor ds = tensor_make(dscores->backend, DTYPE_F32, dscores->data, 2, ds_shape);
    struct tensor dw = dweight ? tensor_make(dweight->backend, DTYPE_F32, dweight->data, 2, w_shape)
                               : (struct tensor){0};
    struct tensor drows = {0};
    int rc = tensor_alloc(&drows, m->backend, DTYPE_F32, 2, g.rows.shape, err);
    if (!rc)
        rc = ops_matmul_backward(&drows, dweight ? &dw : NULL, NULL, &ds, &g.rows, &m->w.score,
                                 false, true, 1.0f, err);
    if (!rc && dhidden) {
        struct tensor dh = tensor_make(dhidden->backend, DTYPE_F32, dhidden->data, 2, h_shape);
        rc = tensor_zero(&dh, err);
        if (!rc) rc = ops_embedding_backward(&dh, &drows, &g.pos, err);
    }
    tensor_free(&drows);
    gathered_free(&g);
    return rc;
}

/* ---- the value head: every row of hidden ---- */

/* hidden is [T, C] with T >= 1, on the model's backend, and the model has a head: *T. */
static int value_rows(const struct model *m, const char *fn, const struct tensor *hidden, int64_t *T,
                      struct smelt_error *err) {
    if (!m->config.score_head)
        return error_set(err, SMELT_EINVAL, "%s: %s has no score head (a causal LM: model_classifier_from_lm adds one)",
                         fn, m->config.architecture);
    if (!hidden || hidden->ndim != 2 || hidden->shape[0] < 1 || hidden->shape[1] != m->config.hidden_size)
        return error_set(err, SMELT_EINVAL, "%s: hidden must be [T, %lld] with T >= 1", fn,
                         (long long)m->config.hidden_size);
    *T = hidden->shape[0];
    return check_tensor(m, fn, "hidden", hidden, *T, m->config.hidden_size, err);
}

int model_value_forward(const struct model *m, const struct tensor *hidden, struct tensor *values,
                        struct smelt_error *err) {
    const char *fn = "model_value_forward";
    int64_t T;
    TRY(value_rows(m, fn, hidden, &T, err));
    if (!values) return error_set(err, SMELT_EINVAL, "%s: values is required", fn);
    TRY(check_tensor(m, fn, "values", values, T, 1, err));
    int64_t shape[2] = {T, 1};
    struct tensor out = tensor_make(values->backend, DTYPE_F32, values->data, 2, shape);
    return ops_matmul(&out, hidden, &m->w.score, NULL, false, true, 1.0f, 0.0f, err);
}

int model_value_backward(const struct model *m, const struct tensor *hidden, const struct tensor *dvalues,
                         struct tensor *dweight, struct tensor *dhidden, struct smelt_error *err) {
    const char *fn = "model_value_backward";
    int64_t T, C = m->config.hidden_size;
    TRY(value_rows(m, fn, hidden, &T, err));
    if (!dvalues) return error_set(err, SMELT_EINVAL, "%s: dvalues is required", fn);
    TRY(check_tensor(m, fn, "dvalues", dvalues, T, 1, err));
    TRY(check_tensor(m, fn, "dweight", dweight, 1, C, err));
    TRY(check_tensor(m, fn, "dhidden", dhidden, T, C, err));
    int64_t dv_shape[2] = {T, 1}, w_shape[2] = {1, C};
    struct tensor dv = tensor_make(dvalues->backend, DTYPE_F32, dvalues->data, 2, dv_shape);
    struct tensor dw = dweight ? tensor_make(dweight->backend, DTYPE_F32, dweight->data, 2, w_shape)
                               : (struct tensor){0};
    struct tensor dh = dhidden ? tensor_make(dhidden->backend, DTYPE_F32, dhidden->data, 2, hidden->shape)
                               : (struct tensor){0};
    if (dhidden) TRY(tensor_zero(&dh, err)); /* ops_matmul_backward accumulates */
    if (!dweight && !dhidden) return SMELT_OK;
    return ops_matmul_backward(dhidden ? &dh : NULL, dweight ? &dw : NULL, NULL, &dv, hidden, &m->w.score, false,
                               true, 1.0f, err);
}
