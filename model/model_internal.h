/* Private to model/: the pieces the transformer files share. */
#ifndef SMELT_MODEL_INTERNAL_H
#define SMELT_MODEL_INTERNAL_H

#include <math.h>

#include "model/transformer.h"

/* A model with its parameter table laid out and zeroed weights. */
int model_create(const struct model_config *config, enum backend backend, struct model **out,
                 struct smelt_error *err);
/* (Re)binds the views of w and g (g only when grads are allocated). */
void model_bind_views(struct model *m);

/* What one layer's forward keeps for its backward. Buffers are sized for max_tokens;
 * ops get views of the first T rows. */
struct layer_acts {
    struct tensor x_in;                 /* [T, C] the layer's input (residual stream) */
    struct tensor h1, mean1, rstd1;     /* attention-norm output [T, C], stats [T] */
    struct tensor q_raw, k_raw;         /* [T, Hq*D], [T, Hkv*D] before q/k norm (qk_norm) */
    struct tensor qn_rstd, kn_rstd;     /* [T*Hq], [T*Hkv] (qk_norm) */
    struct tensor q, k, v;              /* [T, Hq*D], [T, Hkv*D] x2, after norm and rope */
    struct tensor att, lse;             /* [T, Hq*D], [T, Hq] */
    struct tensor x_mid;                /* [T, C] residual after attention */
    struct tensor h2, mean2, rstd2;     /* MLP-norm output and stats */
    struct tensor gate, up, act;        /* [T, F]; GPT-2 uses gate (fc output) and act */
};

struct model_acts {
    int64_t max_tokens;
    bool recompute;
    struct layer_acts *layers;          /* [n_layers]; only x_in allocated when recompute */
    int64_t n_layers_allocated;
    struct layer_acts scratch;          /* the recomputed layer (recompute only) */
    struct tensor x_final;              /* [T, C] output of the last layer */
    struct tensor hf, meanf, rstdf;     /* final norm output and stats */
    struct tensor ids, positions, targets; /* i32 [T] on the model's backend */
    struct tensor lse;                  /* f32 [T] log-sum-exp of each row of logits */
    struct tensor logits_chunk;         /* [chunk, V]: logits are computed chunk by chunk */
    int64_t chunk_rows;
    /* gradient scratch */
    struct tensor dres, dh;             /* [T, C] */
    struct tensor dq_a, dq_b, dk_a, dk_b, dv, datt; /* [T, Hq*D] / [T, Hkv*D] */
    struct tensor dgate, dup, dact;     /* [T, F] */
    struct tensor dlogits_chunk;        /* [chunk, V] */
    /* the batch of the last forward */
    int64_t n_tokens;
    int n_seqs;
    struct tensor cu_seqlens;           /* host i32 [S + 1]: a view of host_cu */
    /* Host staging of the batch, reused by every forward (the ids and targets are
     * copied straight from the caller's arrays). */
    int32_t *host_positions;            /* [max_tokens] */
    int32_t *host_cu;                   /* [host_cu_cap], grown when a batch has more sequences */
    int64_t host_cu_cap;
    bool has_targets;
    bool forward_done;
};

/* ---- the parameter provider's seam (provider.c) ---- */

/* A pass begins: the provider's begin, nothing without one. */
int model_pass_begin(struct model *m, bool backward, struct smelt_error *err);
/* Releases unit after a step that returned rc; returns rc when it failed (the release's
 * own error then dropped), else the release's result. */
int model_unit_done(struct model *m, int64_t unit, int rc, struct smelt_error *err);
/* The unit's backward is complete: the provider's grads_ready when the base trains. */
int model_unit_grads_ready(struct model *m, int64_t unit, struct smelt_error *err);

/* ---- shared by forward.c (training) and forward_paged.c (generation) ---- */

/* lm_head.c: logits y = x lm_head^T, plus the adapter's head hook when it has one
 * (x: final-norm hidden states [n, C] from batch row row0, y: [n, V]); and its
 * backward: dx += dy lm_head (and the lm_head gradient when the base trains), and the
 * adapter's head backward. Every path that computes logits goes through these. */
int model_lm_head_forward(const struct model *m, int64_t row0, struct tensor *y, const struct tensor *x,
                          struct smelt_error *err);
int model_lm_head_backward(struct model *m, int64_t row0, struct tensor *dx, const struct tensor *dy,
                           const struct tensor *x, struct smelt_error *err);

/* Logits need an lm_head; a sequence classifier (reward model) has only its score. */
static inline int model_check_lm_head(const struct model *m, const char *fn, struct smelt_error *err) {
    /* The config, not the view: under a provider the view is empty between uses. */
    if (!m->config.score_head) return SMELT_OK;
    return error_set(err, SMELT_EINVAL,
                     "%s: %s is a sequence classifier: it has a score head and no lm_head, so no "
                     "logits (score hidden states with model_score_forward)",
                     fn, m->config.architecture);
}

/* ---- views ---- */

/* The first `rows` rows of a buffer, shaped [rows, cols]. */
static inline struct tensor rows2(const struct tensor *buf, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return tensor_make(buf->backend, buf->dtype, buf->data, 2, shape);
}

static inline struct tensor rows3(const struct tensor *buf, int64_t rows, int64_t heads, int64_t dim) {
    int64_t shape[3] = {rows, heads, dim};
    return tensor_make(buf->backend, buf->dtype, buf->data, 3, shape);
}

static inline struct tensor rows1(const struct tensor *buf, int64_t n) {
    return tensor_make(buf->backend, buf->dtype, buf->data, 1, &n);
}

/* Rows [r0, r0 + n) of a [*, cols] buffer. */
static inline struct tensor slice_rows(const struct tensor *buf, int64_t r0, int64_t n, int64_t cols) {
    int64_t shape[2] = {n, cols};
    char *base = (char *)buf->data + (size_t)(r0 * cols) * dtype_size(buf->dtype);
    return tensor_make(buf->backend, buf->dtype, base, 2, shape);
}

struct dims {
    int64_t C, QD, KD, F, V, Hq, Hkv, D;
};

static inline struct dims model_dims(const struct model *m) {
    const struct model_config *c = &m->config;
    return (struct dims){.C = c->hidden_size, .QD = c->n_heads * c->head_dim,
                         .KD = c->n_kv_heads * c->head_dim, .F = c->intermediate_size,
                         .V = c->vocab_size, .Hq = c->n_heads, .Hkv = c->n_kv_heads,
                         .D = c->head_dim};
}

/* Views of a layer's activations for T tokens. */
struct layer_views {
    struct tensor x_in, h1, mean1, rstd1, q_raw, k_raw, qn_rstd, kn_rstd;
    struct tensor q, k, v, q3, k3, v3, q_raw3, k_raw3, att, att3, lse;
    struct tensor x_mid, h2, mean2, rstd2, gate, up, act, x_out;
};

/* The paged-KV attention of one layer (generation): keys and values go to the cache,
 * attention reads it. See ops_kv_append / ops_paged_attention. */
struct paged_attn {
    struct tensor *k_cache, *v_cache;
    const struct tensor *slot_mapping, *block_tables, *cu_q, *context_lens;
};

struct layer_views model_layer_views(const struct model *m, const struct layer_acts *a,
                                     const struct tensor *x_out, int64_t T);
/* One block: x_in -> x_out through attention (ops_attention over cu_seqlens, or the
 * paged cache when paged is not NULL) and the MLP, adapter hooks included. */
int model_layer_forward(const struct model *m, int64_t l, const struct layer_weights *w,
                        struct layer_views *v, const struct tensor *positions,
                        const struct tensor *cu_seqlens, const struct paged_attn *paged,
                        struct smelt_error *err);
/* Everything of a layer's activations but x_in, for T tokens. */
int model_layer_acts_alloc(const struct model *m, struct layer_acts *a, int64_t T,
                           struct smelt_error *err);
void model_layer_acts_free(struct layer_acts *a);
int model_norm_forward(const struct model *m, struct tensor *y, struct tensor *mean,
                       struct tensor *rstd, const struct tensor *x, const struct tensor *w,
                       const struct tensor *b, struct smelt_error *err);

#endif
