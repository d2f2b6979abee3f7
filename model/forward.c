/* The transformer's forward and backward passes, written only against kernels/ops.h.
 * One layer function serves Llama, Mistral, Qwen2, Qwen3 and GPT-2; the config picks
 * the norm (RMSNorm / LayerNorm), q/k norms, rope or learned positions, and the MLP
 * (SwiGLU / GELU). Backward ops accumulate, so the residual gradient `dres` is one
 * buffer that each branch adds into. */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct tensor *opt(const struct tensor *t) { return t->data ? t : NULL; }
static struct tensor *opt_mut(struct tensor *t) { return t->data ? t : NULL; }

/* ---- adapter hooks ---- */

static int adapt_fwd(const struct model *m, int64_t layer, enum model_linear linear,
                     const struct tensor *x, struct tensor *y, struct smelt_error *err) {
    const struct model_adapter *ad = m->adapter;
    return ad ? ad->forward(ad->ctx, layer, linear, x, y, err) : SMELT_OK;
}

static int adapt_bwd(const struct model *m, int64_t layer, enum model_linear linear,
                     const struct tensor *x, const struct tensor *dy, struct tensor *dx,
                     struct smelt_error *err) {
    const struct model_adapter *ad = m->adapter;
    return ad ? ad->backward(ad->ctx, layer, linear, x, dy, dx, err) : SMELT_OK;
}

/* ---- activation buffers ---- */

static int buf(struct tensor *t, enum backend be, enum dtype dt, int64_t rows, int64_t cols,
               struct smelt_error *err) {
    int64_t shape[2] = {rows, cols};
    return tensor_alloc(t, be, dt, 2, shape, err);
}

void model_layer_acts_free(struct layer_acts *a) {
    struct tensor *all[] = {&a->x_in, &a->h1, &a->mean1, &a->rstd1, &a->q_raw, &a->k_raw,
                            &a->qn_rstd, &a->kn_rstd, &a->q, &a->k, &a->v, &a->att, &a->lse,
                            &a->x_mid, &a->h2, &a->mean2, &a->rstd2, &a->gate, &a->up, &a->act};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

/* Everything but x_in, which the caller owns the policy for. */
int model_layer_acts_alloc(const struct model *m, struct layer_acts *a, int64_t T,
                                 struct smelt_error *err) {
    struct dims d = model_dims(m);
    const struct model_config *c = &m->config;
    enum backend be = m->backend;
    bool ln = c->norm == MODEL_NORM_LAYERNORM, swiglu = c->mlp == MODEL_MLP_SWIGLU;
    TRY(buf(&a->h1, be, DTYPE_F32, T, d.C, err));
    if (ln) TRY(buf(&a->mean1, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->rstd1, be, DTYPE_F32, T, 1, err));
    if (c->qk_norm) {
        TRY(buf(&a->q_raw, be, DTYPE_F32, T, d.QD, err));
        TRY(buf(&a->k_raw, be, DTYPE_F32, T, d.KD, err));
        TRY(buf(&a->qn_rstd, be, DTYPE_F32, T * d.Hq, 1, err));
        TRY(buf(&a->kn_rstd, be, DTYPE_F32, T * d.Hkv, 1, err));
    }
    TRY(buf(&a->q, be, DTYPE_F32, T, d.QD, err));
    TRY(buf(&a->k, be, DTYPE_F32, T, d.KD, err));
    TRY(buf(&a->v, be, DTYPE_F32, T, d.KD, err));
    TRY(buf(&a->att, be, DTYPE_F32, T, d.QD, err));
    TRY(buf(&a->lse, be, DTYPE_F32, T, d.Hq, err));
    TRY(buf(&a->x_mid, be, DTYPE_F32, T, d.C, err));
    TRY(buf(&a->h2, be, DTYPE_F32, T, d.C, err));
    if (ln) TRY(buf(&a->mean2, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->rstd2, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->gate, be, DTYPE_F32, T, d.F, err));
    if (swiglu) TRY(buf(&a->up, be, DTYPE_F32, T, d.F, err));
    TRY(buf(&a->act, be, DTYPE_F32, T, d.F, err));
    return SMELT_OK;
}

static int acts_alloc_all(const struct model *m, struct model_acts *a, struct smelt_error *err) {
    struct dims d = model_dims(m);
    const struct model_config *c = &m->config;
    enum backend be = m->backend;
    int64_t T = a->max_tokens;
    for (int64_t l = 0; l < c->n_layers; l++) {
        TRY(buf(&a->layers[l].x_in, be, DTYPE_F32, T, d.C, err));
        if (!a->recompute) TRY(model_layer_acts_alloc(m, &a->layers[l], T, err));
    }
    if (a->recompute) TRY(model_layer_acts_alloc(m, &a->scratch, T, err));
    TRY(buf(&a->x_final, be, DTYPE_F32, T, d.C, err));
    TRY(buf(&a->hf, be, DTYPE_F32, T, d.C, err));
    if (c->norm == MODEL_NORM_LAYERNORM) TRY(buf(&a->meanf, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->rstdf, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->ids, be, DTYPE_I32, T, 1, err));
    TRY(buf(&a->positions, be, DTYPE_I32, T, 1, err));
    TRY(buf(&a->targets, be, DTYPE_I32, T, 1, err));
    TRY(buf(&a->lse, be, DTYPE_F32, T, 1, err));
    TRY(buf(&a->logits_chunk, be, DTYPE_F32, a->chunk_rows, d.V, err));
    TRY(buf(&a->dres, be, DTYPE_F32, T, d.C, err));
    TRY(buf(&a->dh, be, DTYPE_F32, T, d.C, err));
    TRY(buf(&a->dq_a, be, DTYPE_F32, T, d.QD, err));
    TRY(buf(&a->dq_b, be, DTYPE_F32, T, d.QD, err));
    TRY(buf(&a->dk_a, be, DTYPE_F32, T, d.KD, err));
    TRY(buf(&a->dk_b, be, DTYPE_F32, T, d.KD, err));
    TRY(buf(&a->dv, be, DTYPE_F32, T, d.KD, err));
    TRY(buf(&a->datt, be, DTYPE_F32, T, d.QD, err));
    TRY(buf(&a->dgate, be, DTYPE_F32, T, d.F, err));
    TRY(buf(&a->dup, be, DTYPE_F32, T, d.F, err));
    TRY(buf(&a->dact, be, DTYPE_F32, T, d.F, err));
    TRY(buf(&a->dlogits_chunk, be, DTYPE_F32, a->chunk_rows, d.V, err));
    return SMELT_OK;
}

void model_acts_free(struct model_acts *a) {
    if (!a) return;
    if (a->layers) {
        for (int64_t l = 0; l < a->n_layers_allocated; l++) model_layer_acts_free(&a->layers[l]);
        free(a->layers);
    }
    model_layer_acts_free(&a->scratch);
    struct tensor *all[] = {&a->x_final, &a->hf, &a->meanf, &a->rstdf, &a->ids, &a->positions,
                            &a->targets, &a->lse, &a->logits_chunk, &a->dres, &a->dh, &a->dq_a,
                            &a->dq_b, &a->dk_a, &a->dk_b, &a->dv, &a->datt, &a->dgate, &a->dup,
                            &a->dact, &a->dlogits_chunk};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
    free(a->host_positions);
    free(a->host_cu);
    free(a);
}

int model_acts_alloc(const struct model *m, int64_t max_tokens, bool recompute,
                     struct model_acts **out, struct smelt_error *err) {
    if (max_tokens < 1)
        return error_set(err, SMELT_EINVAL, "model_acts_alloc: max_tokens %lld must be >= 1",
                         (long long)max_tokens);
    struct model_acts *a = calloc(1, sizeof *a);
    if (!a) return error_set(err, SMELT_ENOMEM, "model_acts_alloc: out of memory");
    a->max_tokens = max_tokens;
    a->recompute = recompute;
    /* Logits are never held for all tokens at once: chunks of about 16M values. */
    int64_t V = m->config.vocab_size;
    a->chunk_rows = (1 << 24) / V;
    if (a->chunk_rows < 1) a->chunk_rows = 1;
    if (a->chunk_rows > max_tokens) a->chunk_rows = max_tokens;
    a->layers = calloc((size_t)m->config.n_layers, sizeof *a->layers);
    a->n_layers_allocated = m->config.n_layers;
    a->host_positions = malloc((size_t)max_tokens * sizeof *a->host_positions);
    int rc = a->layers && a->host_positions ? acts_alloc_all(m, a, err)
                                            : error_set(err, SMELT_ENOMEM, "model_acts_alloc: out of memory");
    if (rc) {
        model_acts_free(a);
        return error_wrap(err, rc, "activations for %lld tokens", (long long)max_tokens);
    }
    *out = a;
    return SMELT_OK;
}

/* ---- norms ---- */

int model_norm_forward(const struct model *m, struct tensor *y, struct tensor *mean,
                        struct tensor *rstd, const struct tensor *x, const struct tensor *w,
                        const struct tensor *b, struct smelt_error *err) {
    float eps = (float)m->config.norm_eps;
    if (m->config.norm == MODEL_NORM_LAYERNORM) return ops_layernorm(y, mean, rstd, x, w, b, eps, err);
    return ops_rmsnorm(y, rstd, x, w, eps, err);
}

static int norm_backward(const struct model *m, struct tensor *dx, struct tensor *dw,
                         struct tensor *db, const struct tensor *dy, const struct tensor *x,
                         const struct tensor *w, const struct tensor *mean,
                         const struct tensor *rstd, struct smelt_error *err) {
    if (m->config.norm == MODEL_NORM_LAYERNORM)
        return ops_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, err);
    return ops_rmsnorm_backward(dx, dw, dy, x, w, rstd, err);
}

/* ---- one layer ---- */

struct layer_views model_layer_views(const struct model *m, const struct layer_acts *a,
                                      const struct tensor *x_out, int64_t T) {
    struct dims d = model_dims(m);
    struct layer_views v = {
        .x_in = rows2(&a->x_in, T, d.C), .h1 = rows2(&a->h1, T, d.C),
        .mean1 = rows1(&a->mean1, T), .rstd1 = rows1(&a->rstd1, T),
        .q_raw = rows2(&a->q_raw, T, d.QD), .k_raw = rows2(&a->k_raw, T, d.KD),
        .qn_rstd = rows1(&a->qn_rstd, T * d.Hq), .kn_rstd = rows1(&a->kn_rstd, T * d.Hkv),
        .q = rows2(&a->q, T, d.QD), .k = rows2(&a->k, T, d.KD), .v = rows2(&a->v, T, d.KD),
        .q3 = rows3(&a->q, T, d.Hq, d.D), .k3 = rows3(&a->k, T, d.Hkv, d.D),
        .v3 = rows3(&a->v, T, d.Hkv, d.D), .att = rows2(&a->att, T, d.QD),
        .att3 = rows3(&a->att, T, d.Hq, d.D), .lse = rows2(&a->lse, T, d.Hq),
        .x_mid = rows2(&a->x_mid, T, d.C), .h2 = rows2(&a->h2, T, d.C),
        .mean2 = rows1(&a->mean2, T), .rstd2 = rows1(&a->rstd2, T),
        .gate = rows2(&a->gate, T, d.F), .up = rows2(&a->up, T, d.F),
        .act = rows2(&a->act, T, d.F), .x_out = rows2(x_out, T, d.C)};
    /* q/k norms work per head: rows of D. */
    v.q_raw3 = rows2(&a->q_raw, T * d.Hq, d.D);
    v.k_raw3 = rows2(&a->k_raw, T * d.Hkv, d.D);
    return v;
}

int model_layer_forward(const struct model *m, int64_t l, const struct layer_weights *w,
                        struct layer_views *v, const struct tensor *positions,
                        const struct tensor *cu_seqlens, const struct paged_attn *paged,
                        struct smelt_error *err) {
    const struct model_config *c = &m->config;
    struct dims d = model_dims(m);
    float scale = (float)(1.0 / sqrt((double)d.D));
    struct ops_rope_freqs rope = {m->rope_inv_freq, d.D / 2, m->rope_scale};
    TRY(model_norm_forward(m, &v->h1, opt_mut(&v->mean1), &v->rstd1, &v->x_in, &w->attn_norm_w,
                     opt(&w->attn_norm_b), err));
    struct tensor *qp = c->qk_norm ? &v->q_raw : &v->q, *kp = c->qk_norm ? &v->k_raw : &v->k;
    TRY(ops_matmul(qp, &v->h1, &w->q_w, opt(&w->q_b), false, true, 1.0f, 0.0f, err));
    TRY(ops_matmul(kp, &v->h1, &w->k_w, opt(&w->k_b), false, true, 1.0f, 0.0f, err));
    TRY(ops_matmul(&v->v, &v->h1, &w->v_w, opt(&w->v_b), false, true, 1.0f, 0.0f, err));
    TRY(adapt_fwd(m, l, MODEL_LINEAR_Q, &v->h1, qp, err));
    TRY(adapt_fwd(m, l, MODEL_LINEAR_K, &v->h1, kp, err));
    TRY(adapt_fwd(m, l, MODEL_LINEAR_V, &v->h1, &v->v, err));
    if (c->qk_norm) {
        struct tensor qn = rows2(&v->q, v->q.shape[0] * d.Hq, d.D);
        struct tensor kn = rows2(&v->k, v->k.shape[0] * d.Hkv, d.D);
        TRY(ops_rmsnorm(&qn, &v->qn_rstd, &v->q_raw3, &w->q_norm_w, (float)c->norm_eps, err));
        TRY(ops_rmsnorm(&kn, &v->kn_rstd, &v->k_raw3, &w->k_norm_w, (float)c->norm_eps, err));
    }
    if (c->positions == MODEL_POS_ROPE) {
        TRY(ops_rope_with(&v->q3, &v->q3, positions, &rope, err));
        TRY(ops_rope_with(&v->k3, &v->k3, positions, &rope, err));
    }
    if (paged) {
        TRY(ops_kv_append(paged->k_cache, paged->v_cache, &v->k3, &v->v3, paged->slot_mapping, err));
        TRY(ops_paged_attention(&v->att3, &v->q3, paged->k_cache, paged->v_cache, paged->block_tables,
                                paged->cu_q, paged->context_lens, scale, err));
    } else {
        TRY(ops_attention(&v->att3, &v->lse, &v->q3, &v->k3, &v->v3, cu_seqlens, scale, err));
    }
    /* x_mid = x_in + att @ o^T (+ b): copy the residual, then accumulate the GEMM. */
    TRY(tensor_copy(&v->x_mid, &v->x_in, err));
    TRY(ops_matmul(&v->x_mid, &v->att, &w->o_w, opt(&w->o_b), false, true, 1.0f, 1.0f, err));
    TRY(adapt_fwd(m, l, MODEL_LINEAR_O, &v->att, &v->x_mid, err));
    TRY(model_norm_forward(m, &v->h2, opt_mut(&v->mean2), &v->rstd2, &v->x_mid, &w->mlp_norm_w,
                     opt(&w->mlp_norm_b), err));
    TRY(tensor_copy(&v->x_out, &v->x_mid, err));
    if (c->mlp == MODEL_MLP_SWIGLU) {
        TRY(ops_matmul(&v->gate, &v->h2, &w->gate_w, opt(&w->gate_b), false, true, 1.0f, 0.0f, err));
        TRY(ops_matmul(&v->up, &v->h2, &w->up_w, opt(&w->up_b), false, true, 1.0f, 0.0f, err));
        TRY(adapt_fwd(m, l, MODEL_LINEAR_GATE, &v->h2, &v->gate, err));
        TRY(adapt_fwd(m, l, MODEL_LINEAR_UP, &v->h2, &v->up, err));
        TRY(ops_swiglu(&v->act, &v->gate, &v->up, err));
        TRY(ops_matmul(&v->x_out, &v->act, &w->down_w, opt(&w->down_b), false, true, 1.0f, 1.0f, err));
        TRY(adapt_fwd(m, l, MODEL_LINEAR_DOWN, &v->act, &v->x_out, err));
    } else {
        TRY(ops_matmul(&v->gate, &v->h2, &w->fc_w, opt(&w->fc_b), false, true, 1.0f, 0.0f, err));
        TRY(adapt_fwd(m, l, MODEL_LINEAR_FC, &v->h2, &v->gate, err));
        TRY(ops_gelu(&v->act, &v->gate, err));
        TRY(ops_matmul(&v->x_out, &v->act, &w->proj_w, opt(&w->proj_b), false, true, 1.0f, 1.0f, err));
        TRY(adapt_fwd(m, l, MODEL_LINEAR_PROJ, &v->act, &v->x_out, err));
    }
    return SMELT_OK;
}

/* dres holds dL/dx_out on entry and dL/dx_in on return. */
static int layer_backward(const struct model *m, int64_t l, const struct layer_weights *w,
                          struct layer_weights *g, const struct layer_views *v,
                          struct model_acts *a, const struct tensor *positions,
                          const struct tensor *cu_seqlens, struct smelt_error *err) {
    const struct model_config *c = &m->config;
    struct dims d = model_dims(m);
    int64_t T = v->x_in.shape[0];
    float scale = (float)(1.0 / sqrt((double)d.D));
    struct ops_rope_freqs rope = {m->rope_inv_freq, d.D / 2, m->rope_scale};
    struct tensor dres = rows2(&a->dres, T, d.C), dh = rows2(&a->dh, T, d.C);
    struct tensor dgate = rows2(&a->dgate, T, d.F), dup = rows2(&a->dup, T, d.F);
    struct tensor dact = rows2(&a->dact, T, d.F);

    /* MLP branch: x_out = x_mid + mlp(norm(x_mid)). */
    TRY(tensor_zero(&dact, err));
    TRY(tensor_zero(&dgate, err));
    TRY(tensor_zero(&dh, err));
    if (c->mlp == MODEL_MLP_SWIGLU) {
        TRY(ops_matmul_backward(&dact, opt_mut(&g->down_w), opt_mut(&g->down_b), &dres, &v->act, &w->down_w, false,
                                true, 1.0f, err));
        TRY(adapt_bwd(m, l, MODEL_LINEAR_DOWN, &v->act, &dres, &dact, err));
        TRY(tensor_zero(&dup, err));
        TRY(ops_swiglu_backward(&dgate, &dup, &dact, &v->gate, &v->up, err));
        TRY(ops_matmul_backward(&dh, opt_mut(&g->gate_w), opt_mut(&g->gate_b), &dgate, &v->h2, &w->gate_w, false,
                                true, 1.0f, err));
        TRY(ops_matmul_backward(&dh, opt_mut(&g->up_w), opt_mut(&g->up_b), &dup, &v->h2, &w->up_w, false, true, 1.0f,
                                err));
        TRY(adapt_bwd(m, l, MODEL_LINEAR_GATE, &v->h2, &dgate, &dh, err));
        TRY(adapt_bwd(m, l, MODEL_LINEAR_UP, &v->h2, &dup, &dh, err));
    } else {
        TRY(ops_matmul_backward(&dact, opt_mut(&g->proj_w), opt_mut(&g->proj_b), &dres, &v->act, &w->proj_w, false, true, 1.0f, err));
        TRY(adapt_bwd(m, l, MODEL_LINEAR_PROJ, &v->act, &dres, &dact, err));
        TRY(ops_gelu_backward(&dgate, &dact, &v->gate, err));
        TRY(ops_matmul_backward(&dh, opt_mut(&g->fc_w), opt_mut(&g->fc_b), &dgate, &v->h2, &w->fc_w, false, true, 1.0f, err));
        TRY(adapt_bwd(m, l, MODEL_LINEAR_FC, &v->h2, &dgate, &dh, err));
    }
    TRY(norm_backward(m, &dres, opt_mut(&g->mlp_norm_w), opt_mut(&g->mlp_norm_b), &dh, &v->x_mid,
                      &w->mlp_norm_w, opt(&v->mean2), &v->rstd2, err));

    /* Attention branch: x_mid = x_in + o(attn(q, k, v)). */
    struct tensor datt = rows2(&a->datt, T, d.QD), datt3 = rows3(&a->datt, T, d.Hq, d.D);
    struct tensor dq3 = rows3(&a->dq_a, T, d.Hq, d.D), dk3 = rows3(&a->dk_a, T, d.Hkv, d.D);
    struct tensor dv3 = rows3(&a->dv, T, d.Hkv, d.D), dv = rows2(&a->dv, T, d.KD);
    TRY(tensor_zero(&datt, err));
    TRY(ops_matmul_backward(&datt, opt_mut(&g->o_w), opt_mut(&g->o_b), &dres, &v->att, &w->o_w, false, true, 1.0f, err));
    TRY(adapt_bwd(m, l, MODEL_LINEAR_O, &v->att, &dres, &datt, err));
    TRY(tensor_zero(&dq3, err));
    TRY(tensor_zero(&dk3, err));
    TRY(tensor_zero(&dv3, err));
    TRY(ops_attention_backward(&dq3, &dk3, &dv3, &datt3, &v->q3, &v->k3, &v->v3, &v->att3, &v->lse,
                               cu_seqlens, scale, err));
    /* Walk q and k back through rope and the q/k norms, ping-ponging two buffers. */
    struct tensor *dq_cur = &a->dq_a, *dq_next = &a->dq_b, *dk_cur = &a->dk_a, *dk_next = &a->dk_b;
    if (c->positions == MODEL_POS_ROPE) {
        struct tensor qn = rows3(dq_next, T, d.Hq, d.D), kn = rows3(dk_next, T, d.Hkv, d.D);
        TRY(tensor_zero(&qn, err));
        TRY(tensor_zero(&kn, err));
        TRY(ops_rope_with_backward(&qn, &dq3, positions, &rope, err));
        TRY(ops_rope_with_backward(&kn, &dk3, positions, &rope, err));
        struct tensor *t = dq_cur; dq_cur = dq_next; dq_next = t;
        t = dk_cur; dk_cur = dk_next; dk_next = t;
    }
    if (c->qk_norm) {
        struct tensor dy_q = rows2(dq_cur, T * d.Hq, d.D), dx_q = rows2(dq_next, T * d.Hq, d.D);
        struct tensor dy_k = rows2(dk_cur, T * d.Hkv, d.D), dx_k = rows2(dk_next, T * d.Hkv, d.D);
        TRY(tensor_zero(&dx_q, err));
        TRY(tensor_zero(&dx_k, err));
        TRY(ops_rmsnorm_backward(&dx_q, opt_mut(&g->q_norm_w), &dy_q, &v->q_raw3, &w->q_norm_w, &v->qn_rstd, err));
        TRY(ops_rmsnorm_backward(&dx_k, opt_mut(&g->k_norm_w), &dy_k, &v->k_raw3, &w->k_norm_w, &v->kn_rstd, err));
        struct tensor *t = dq_cur; dq_cur = dq_next; dq_next = t;
        t = dk_cur; dk_cur = dk_next; dk_next = t;
    }
    struct tensor dq = rows2(dq_cur, T, d.QD), dk = rows2(dk_cur, T, d.KD);
    TRY(tensor_zero(&dh, err));
    TRY(ops_matmul_backward(&dh, opt_mut(&g->q_w), opt_mut(&g->q_b), &dq, &v->h1, &w->q_w, false, true, 1.0f, err));
    TRY(ops_matmul_backward(&dh, opt_mut(&g->k_w), opt_mut(&g->k_b), &dk, &v->h1, &w->k_w, false, true, 1.0f, err));
    TRY(ops_matmul_backward(&dh, opt_mut(&g->v_w), opt_mut(&g->v_b), &dv, &v->h1, &w->v_w, false, true, 1.0f, err));
    TRY(adapt_bwd(m, l, MODEL_LINEAR_Q, &v->h1, &dq, &dh, err));
    TRY(adapt_bwd(m, l, MODEL_LINEAR_K, &v->h1, &dk, &dh, err));
    TRY(adapt_bwd(m, l, MODEL_LINEAR_V, &v->h1, &dv, &dh, err));
    TRY(norm_backward(m, &dres, opt_mut(&g->attn_norm_w), opt_mut(&g->attn_norm_b), &dh, &v->x_in,
                      &w->attn_norm_w, opt(&v->mean1), &v->rstd1, err));
    return SMELT_OK;
}

/* ---- the whole model ---- */

static const struct tensor *layer_output(const struct model_acts *a, int64_t l, int64_t n_layers) {
    return l + 1 < n_layers ? &a->layers[l + 1].x_in : &a->x_final;
}

static int check_batch(const struct model *m, const struct model_acts *a,
                       const struct model_batch *b, struct smelt_error *err) {
    if (!b || !b->ids || !b->cu_seqlens)
        return error_set(err, SMELT_EINVAL, "model_forward: batch needs ids and cu_seqlens");
    if (b->n_tokens < 1 || b->n_tokens > a->max_tokens)
        return error_set(err, SMELT_EINVAL, "model_forward: batch has %lld tokens; activations hold 1..%lld",
                         (long long)b->n_tokens, (long long)a->max_tokens);
    if (b->n_seqs < 1 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_seqs] != b->n_tokens)
        return error_set(err, SMELT_EINVAL, "model_forward: cu_seqlens must run from 0 to n_tokens (%lld) over %d sequences",
                         (long long)b->n_tokens, b->n_seqs);
    for (int s = 0; s < b->n_seqs; s++) {
        int64_t len = (int64_t)b->cu_seqlens[s + 1] - b->cu_seqlens[s];
        if (len < 0)
            return error_set(err, SMELT_EINVAL, "model_forward: cu_seqlens decreases at sequence %d", s);
        if (!b->positions && len > m->config.max_seq_len)
            return error_set(err, SMELT_EINVAL, "model_forward: sequence %d has %lld tokens; the model handles at most %lld",
                             s, (long long)len, (long long)m->config.max_seq_len);
    }
    if (b->positions)
        for (int64_t t = 0; t < b->n_tokens; t++)
            if (b->positions[t] < 0 || b->positions[t] >= m->config.max_seq_len)
                return error_set(err, SMELT_EINVAL, "model_forward: position %d at token %lld is outside [0, %lld)",
                                 b->positions[t], (long long)t, (long long)m->config.max_seq_len);
    return SMELT_OK;
}

/* Copies the batch's host arrays into the activations' backend tensors (ids, positions,
 * targets) and keeps cu_seqlens on the host, as ops_attention wants it. The host
 * staging is the activations' own, so a step allocates nothing. */
static int stage_batch(struct model_acts *a, const struct model_batch *b, struct smelt_error *err) {
    int64_t T = b->n_tokens, ncu = (int64_t)b->n_seqs + 1;
    if (ncu > a->host_cu_cap) {
        int32_t *grown = realloc(a->host_cu, (size_t)ncu * sizeof *grown);
        if (!grown) return error_set(err, SMELT_ENOMEM, "model_forward: out of memory");
        a->host_cu = grown;
        a->host_cu_cap = ncu;
    }
    int32_t *cu = a->host_cu, *pos = a->host_positions;
    memcpy(cu, b->cu_seqlens, (size_t)ncu * sizeof *cu);
    for (int s = 0; s < b->n_seqs; s++)
        for (int32_t t = cu[s]; t < cu[s + 1]; t++) pos[t] = b->positions ? b->positions[t] : t - cu[s];
    a->cu_seqlens = tensor_i32(cu, 1, &ncu);
    struct tensor hpos = tensor_i32(pos, 1, &T), hids = tensor_i32((int32_t *)b->ids, 1, &T);
    struct tensor dpos = rows1(&a->positions, T), dids = rows1(&a->ids, T);
    int rc = tensor_copy(&dpos, &hpos, err);
    if (!rc) rc = tensor_copy(&dids, &hids, err);
    if (!rc && b->targets) {
        struct tensor ht = tensor_i32((int32_t *)b->targets, 1, &T), dt = rows1(&a->targets, T);
        rc = tensor_copy(&dt, &ht, err);
    }
    a->n_tokens = T;
    a->n_seqs = b->n_seqs;
    a->has_targets = b->targets != NULL;
    return rc;
}

/* Outputs and output gradients are used by ops on the model's backend, so they must
 * live there; hidden states are only copied, so they may also be host memory (any
 * backend). */
static int check_out(const char *fn, const char *name, const struct tensor *t, int64_t rows, int64_t cols,
                     bool any_backend, enum backend backend, struct smelt_error *err) {
    if (!t) return SMELT_OK;
    if (t->dtype != DTYPE_F32 || tensor_numel(t) != rows * cols)
        return error_set(err, SMELT_EINVAL, "%s: %s must be f32 with %lld x %lld elements",
                         fn, name, (long long)rows, (long long)cols);
    if (!any_backend && t->backend != backend)
        return error_set(err, SMELT_EINVAL, "%s: %s is on backend %s; it must be on the model's (%s)",
                         fn, name, backend_name(t->backend), backend_name(backend));
    return SMELT_OK;
}

/* lm_head is wte: the head's logits need the embedding unit too. */
static bool tied_head(const struct model *m) {
    return m->config.tie_word_embeddings && !m->config.score_head;
}

static int embed_forward(struct model *m, struct model_acts *a, int64_t T, struct smelt_error *err) {
    struct dims d = model_dims(m);
    struct tensor ids = rows1(&a->ids, T), positions = rows1(&a->positions, T);
    struct tensor x0 = rows2(m->config.n_layers > 0 ? &a->layers[0].x_in : &a->x_final, T, d.C);
    TRY(ops_embedding(&x0, &ids, &m->w.wte, err));
    if (m->config.positions == MODEL_POS_LEARNED) {
        struct tensor pe = rows2(&a->hf, T, d.C); /* hf is free until the final norm */
        TRY(ops_embedding(&pe, &positions, &m->w.wpe, err));
        TRY(ops_add(&x0, &x0, &pe, err));
    }
    return SMELT_OK;
}

static int layer_forward_unit(struct model *m, struct model_acts *a, int64_t l, int64_t T,
                              struct smelt_error *err) {
    struct layer_acts *la = &a->layers[l];
    struct tensor positions = rows1(&a->positions, T);
    if (a->recompute) {
        a->scratch.x_in = la->x_in; /* borrowed: scratch never frees x_in */
        la = &a->scratch;
    }
    struct layer_views v = model_layer_views(m, la, layer_output(a, l, m->config.n_layers), T);
    int rc = model_unit_acquire(m, model_unit_layer(l), false, err);
    if (!rc) {
        rc = model_layer_forward(m, l, &m->w.layers[l], &v, &positions, &a->cu_seqlens, NULL, err);
        rc = model_unit_done(m, model_unit_layer(l), rc, err);
    }
    if (a->recompute) a->scratch.x_in = (struct tensor){0};
    return rc ? error_wrap(err, rc, "layer %lld", (long long)l) : SMELT_OK;
}

/* The final norm, then the outputs asked for. */
static int head_forward(struct model *m, struct model_acts *a, int64_t T, struct tensor *logprobs,
                        struct tensor *logits, struct tensor *hidden, struct smelt_error *err) {
    struct dims d = model_dims(m);
    struct tensor xf = rows2(&a->x_final, T, d.C), hf = rows2(&a->hf, T, d.C);
    struct tensor meanf = rows1(&a->meanf, T), rstdf = rows1(&a->rstdf, T);
    TRY(model_norm_forward(m, &hf, opt_mut(&meanf), &rstdf, &xf, &m->w.final_norm_w, opt(&m->w.final_norm_b), err));
    if (hidden) TRY(tensor_copy(hidden, &hf, err));
    if (logits) {
        struct tensor lv = rows2(logits, T, d.V);
        TRY(model_lm_head_forward(m, 0, &lv, &hf, err));
    }
    if (logprobs) {
        for (int64_t r0 = 0; r0 < T; r0 += a->chunk_rows) {
            int64_t n = T - r0 < a->chunk_rows ? T - r0 : a->chunk_rows;
            struct tensor h = slice_rows(&a->hf, r0, n, d.C), lg = rows2(&a->logits_chunk, n, d.V);
            struct tensor lp = slice_rows(logprobs, r0, n, 1), lse = slice_rows(&a->lse, r0, n, 1);
            struct tensor tg = slice_rows(&a->targets, r0, n, 1);
            lp = rows1(&lp, n), lse = rows1(&lse, n), tg = rows1(&tg, n);
            TRY(model_lm_head_forward(m, r0, &lg, &h, err));
            TRY(ops_logprobs(&lp, &lse, &lg, &tg, err));
        }
    }
    return SMELT_OK;
}

static int head_forward_unit(struct model *m, struct model_acts *a, int64_t T, struct tensor *logprobs,
                             struct tensor *logits, struct tensor *hidden, struct smelt_error *err) {
    int64_t head = model_unit_head(m);
    bool tied = tied_head(m) && (logits || logprobs);
    TRY(model_unit_acquire(m, head, false, err));
    int rc = tied ? model_unit_acquire(m, MODEL_UNIT_EMBED, false, err) : SMELT_OK;
    if (!rc) {
        rc = head_forward(m, a, T, logprobs, logits, hidden, err);
        if (tied) rc = model_unit_done(m, MODEL_UNIT_EMBED, rc, err);
    }
    return model_unit_done(m, head, rc, err);
}

static int check_weights(const struct model *m, const char *fn, struct smelt_error *err) {
    if (m->provider || m->weights.data) return SMELT_OK;
    return error_set(err, SMELT_EINVAL, "%s: the model holds no weights (its parameters were sharded "
                     "and their provider removed)", fn);
}

int model_forward(struct model *m, struct model_acts *a, const struct model_batch *b,
                  struct tensor *logprobs, struct tensor *logits, struct tensor *hidden,
                  struct smelt_error *err) {
    struct dims d = model_dims(m);
    a->forward_done = false;
    TRY(check_weights(m, "model_forward", err));
    TRY(check_batch(m, a, b, err));
    int64_t T = b->n_tokens;
    TRY(check_out("model_forward", "logprobs", logprobs, T, 1, false, m->backend, err));
    TRY(check_out("model_forward", "logits", logits, T, d.V, false, m->backend, err));
    TRY(check_out("model_forward", "hidden", hidden, T, d.C, true, m->backend, err));
    if (logprobs && !b->targets)
        return error_set(err, SMELT_EINVAL, "model_forward: logprobs need batch targets");
    if (logprobs || logits) TRY(model_check_lm_head(m, "model_forward", err));
    TRY(stage_batch(a, b, err));
    TRY(model_pass_begin(m, false, err));
    TRY(model_unit_acquire(m, MODEL_UNIT_EMBED, false, err));
    TRY(model_unit_done(m, MODEL_UNIT_EMBED, embed_forward(m, a, T, err), err));
    for (int64_t l = 0; l < m->config.n_layers; l++) TRY(layer_forward_unit(m, a, l, T, err));
    TRY(head_forward_unit(m, a, T, logprobs, logits, hidden, err));
    a->forward_done = true;
    return SMELT_OK;
}

/* dL/d(final norm input) into dres. Logits are recomputed chunk by chunk, never stored
 * whole. */
static int head_backward(struct model *m, struct model_acts *a, const struct tensor *dlogprobs,
                         const struct tensor *dhidden, struct smelt_error *err) {
    struct dims d = model_dims(m);
    int64_t T = a->n_tokens;
    struct tensor dh = rows2(&a->dh, T, d.C), dres = rows2(&a->dres, T, d.C);
    TRY(tensor_zero(&dh, err));
    if (dhidden) {
        struct tensor dhv = rows2(dhidden, T, d.C);
        TRY(ops_add_backward(&dh, NULL, &dhv, err));
    }
    if (dlogprobs) {
        for (int64_t r0 = 0; r0 < T; r0 += a->chunk_rows) {
            int64_t n = T - r0 < a->chunk_rows ? T - r0 : a->chunk_rows;
            struct tensor h = slice_rows(&a->hf, r0, n, d.C), lg = rows2(&a->logits_chunk, n, d.V);
            struct tensor dlg = rows2(&a->dlogits_chunk, n, d.V), dhc = slice_rows(&a->dh, r0, n, d.C);
            struct tensor dlp = slice_rows(dlogprobs, r0, n, 1), lse = slice_rows(&a->lse, r0, n, 1);
            struct tensor tg = slice_rows(&a->targets, r0, n, 1);
            dlp = rows1(&dlp, n), lse = rows1(&lse, n), tg = rows1(&tg, n);
            TRY(model_lm_head_forward(m, r0, &lg, &h, err));
            TRY(tensor_zero(&dlg, err));
            TRY(ops_logprobs_backward(&dlg, &dlp, &lg, &tg, &lse, err));
            TRY(model_lm_head_backward(m, r0, &dhc, &dlg, &h, err));
        }
    }
    struct tensor xf = rows2(&a->x_final, T, d.C);
    struct tensor meanf = rows1(&a->meanf, T), rstdf = rows1(&a->rstdf, T);
    TRY(tensor_zero(&dres, err));
    return norm_backward(m, &dres, opt_mut(&m->g.final_norm_w), opt_mut(&m->g.final_norm_b), &dh, &xf,
                         &m->w.final_norm_w, opt(&meanf), &rstdf, err);
}

static int head_backward_unit(struct model *m, struct model_acts *a, const struct tensor *dlogprobs,
                              const struct tensor *dhidden, struct smelt_error *err) {
    int64_t head = model_unit_head(m);
    bool tied = tied_head(m) && dlogprobs;
    TRY(model_unit_acquire(m, head, true, err));
    int rc = tied ? model_unit_acquire(m, MODEL_UNIT_EMBED, true, err) : SMELT_OK;
    if (!rc) {
        rc = head_backward(m, a, dlogprobs, dhidden, err);
        if (tied) {
            if (!rc) rc = model_unit_grads_ready(m, MODEL_UNIT_EMBED, err);
            rc = model_unit_done(m, MODEL_UNIT_EMBED, rc, err);
        }
    }
    if (!rc) rc = model_unit_grads_ready(m, head, err);
    return model_unit_done(m, head, rc, err);
}

/* With recompute the layer is re-run from its saved input first. Its output is not
 * needed (the next layer's input is saved), so it goes to hf, free once the head's
 * backward is done. */
static int layer_backward_unit(struct model *m, struct model_acts *a, int64_t l, struct smelt_error *err) {
    int64_t T = a->n_tokens, unit = model_unit_layer(l);
    struct tensor positions = rows1(&a->positions, T);
    struct layer_acts *la = &a->layers[l];
    struct tensor scratch_out = a->hf;
    if (a->recompute) {
        a->scratch.x_in = la->x_in;
        la = &a->scratch;
    }
    struct layer_views v = model_layer_views(m, la, a->recompute ? &scratch_out : layer_output(a, l, m->config.n_layers), T);
    int rc = model_unit_acquire(m, unit, true, err);
    if (!rc) {
        if (a->recompute) rc = model_layer_forward(m, l, &m->w.layers[l], &v, &positions, &a->cu_seqlens, NULL, err);
        if (!rc) rc = layer_backward(m, l, &m->w.layers[l], &m->g.layers[l], &v, a, &positions, &a->cu_seqlens, err);
        if (!rc) rc = model_unit_grads_ready(m, unit, err);
        rc = model_unit_done(m, unit, rc, err);
    }
    if (a->recompute) a->scratch.x_in = (struct tensor){0};
    return rc ? error_wrap(err, rc, "layer %lld backward", (long long)l) : SMELT_OK;
}

static int embed_backward(struct model *m, struct model_acts *a, struct smelt_error *err) {
    struct dims d = model_dims(m);
    int64_t T = a->n_tokens;
    struct tensor ids = rows1(&a->ids, T), positions = rows1(&a->positions, T);
    struct tensor dres = rows2(&a->dres, T, d.C);
    TRY(ops_embedding_backward(&m->g.wte, &dres, &ids, err));
    if (m->config.positions == MODEL_POS_LEARNED) TRY(ops_embedding_backward(&m->g.wpe, &dres, &positions, err));
    return model_unit_grads_ready(m, MODEL_UNIT_EMBED, err);
}

int model_backward(struct model *m, struct model_acts *a, const struct tensor *dlogprobs,
                   const struct tensor *dhidden, struct smelt_error *err) {
    struct dims d = model_dims(m);
    if (!a->forward_done) return error_set(err, SMELT_EINVAL, "model_backward: no forward pass to differentiate");
    TRY(check_weights(m, "model_backward", err));
    if (!model_base_trains(m) && !m->adapter)
        return error_set(err, SMELT_EINVAL, "model_backward: gradients are not allocated (model_grads_alloc) and no adapter is attached");
    int64_t T = a->n_tokens;
    if (dlogprobs && !a->has_targets)
        return error_set(err, SMELT_EINVAL, "model_backward: dlogprobs given but the forward had no targets");
    TRY(check_out("model_backward", "dlogprobs", dlogprobs, T, 1, false, m->backend, err));
    TRY(check_out("model_backward", "dhidden", dhidden, T, d.C, false, m->backend, err));
    if (dlogprobs) TRY(model_check_lm_head(m, "model_backward", err));
    TRY(model_pass_begin(m, true, err));
    TRY(head_backward_unit(m, a, dlogprobs, dhidden, err));
    for (int64_t l = m->config.n_layers - 1; l >= 0; l--) TRY(layer_backward_unit(m, a, l, err));
    if (model_base_trains(m)) {
        TRY(model_unit_acquire(m, MODEL_UNIT_EMBED, true, err));
        TRY(model_unit_done(m, MODEL_UNIT_EMBED, embed_backward(m, a, err), err));
    }
    /* hf was overwritten by recompute; a second backward needs a new forward. */
    if (a->recompute) a->forward_done = false;
    return SMELT_OK;
}
