/* The parameter table of a transformer: which tensors a config implies, their names
 * and shapes, where they sit in the flat buffers, and how each maps onto a tensor of a
 * Hugging Face checkpoint (GPT-2's q/k/v are thirds of a transposed, fused c_attn). */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Visits every parameter in checkpoint order. For each: its name, shape, the views
 * in w and g to bind, and its checkpoint source. */
struct param_visit {
    struct model *model;
    int count;
    int64_t offset;
    bool bind;        /* fill views (and, for every unit, the table) */
    int64_t unit;     /* the unit being visited (model_unit_range) */
    int64_t only;     /* bind only this unit's views; -1: every parameter */
    float *wbase, *gbase; /* the memory bound: element base_off sits at wbase[0] */
    int64_t base_off;
};

/* The next parameters belong to unit u; the layout pass records where it starts. */
static void enter_unit(struct param_visit *v, int64_t u) {
    v->unit = u;
    if (!v->bind && v->model->unit_offsets) v->model->unit_offsets[u] = v->offset;
}

static void fill_table(struct param_visit *v, const char *name, int ndim, int64_t d0, int64_t d1,
                       const char *hf_name, int hf_part, int hf_parts, bool hf_transposed) {
    struct model_param *p = &v->model->params[v->count];
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->hf_name, sizeof p->hf_name, "%s", hf_name ? hf_name : name);
    p->hf_part = hf_part;
    p->hf_parts = hf_parts;
    p->hf_transposed = hf_transposed;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->offset = v->offset;
    p->numel = ndim == 1 ? d0 : d0 * d1;
}

static void visit(struct param_visit *v, struct tensor *wview, struct tensor *gview,
                  const char *name, int ndim, int64_t d0, int64_t d1,
                  const char *hf_name, int hf_part, int hf_parts, bool hf_transposed) {
    int64_t numel = ndim == 1 ? d0 : d0 * d1;
    if (v->bind && (v->only < 0 || v->only == v->unit)) {
        struct model *m = v->model;
        if (v->only < 0) fill_table(v, name, ndim, d0, d1, hf_name, hf_part, hf_parts, hf_transposed);
        int64_t shape[2] = {d0, d1}, at = v->offset - v->base_off;
        *wview = tensor_make(m->backend, DTYPE_F32, v->wbase ? v->wbase + at : NULL, ndim, shape);
        /* The whole-model pass leaves g alone without a gradient buffer (frozen base). */
        if (v->gbase || v->only >= 0)
            *gview = tensor_make(m->backend, DTYPE_F32, v->gbase ? v->gbase + at : NULL, ndim, shape);
    }
    v->count++;
    v->offset += numel;
}

#define NAME_BYTES 96

/* The output head: a sequence classifier's score [1, C] (transformers' *ForSequence-
 * Classification have no lm_head), else lm_head unless it is the tied embedding. */
static void visit_head(struct param_visit *v) {
    struct model *m = v->model;
    const struct model_config *c = &m->config;
    int64_t C = c->hidden_size, V = c->vocab_size;
    if (c->score_head)
        visit(v, &m->w.score, &m->g.score, "score.weight", 2, 1, C, NULL, 0, 1, false);
    else if (!c->tie_word_embeddings)
        visit(v, &m->w.lm_head, &m->g.lm_head, "lm_head.weight", 2, V, C, NULL, 0, 1, false);
}

static void visit_llama(struct param_visit *v) {
    struct model *m = v->model;
    const struct model_config *c = &m->config;
    int64_t C = c->hidden_size, D = c->head_dim, F = c->intermediate_size, V = c->vocab_size;
    int64_t QD = c->n_heads * D, KD = c->n_kv_heads * D;
    char n[NAME_BYTES];
    enter_unit(v, MODEL_UNIT_EMBED);
    visit(v, &m->w.wte, &m->g.wte, "model.embed_tokens.weight", 2, V, C, NULL, 0, 1, false);
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->w.layers[l], *g = &m->g.layers[l];
        enter_unit(v, model_unit_layer(l));
#define P(field, suffix, ...)                                                     \
    snprintf(n, sizeof n, "model.layers.%lld.%s", (long long)l, suffix);          \
    visit(v, &w->field, &g->field, n, __VA_ARGS__, NULL, 0, 1, false)
        P(attn_norm_w, "input_layernorm.weight", 1, C, 0);
        P(q_w, "self_attn.q_proj.weight", 2, QD, C);
        if (c->qkv_bias) { P(q_b, "self_attn.q_proj.bias", 1, QD, 0); }
        P(k_w, "self_attn.k_proj.weight", 2, KD, C);
        if (c->qkv_bias) { P(k_b, "self_attn.k_proj.bias", 1, KD, 0); }
        P(v_w, "self_attn.v_proj.weight", 2, KD, C);
        if (c->qkv_bias) { P(v_b, "self_attn.v_proj.bias", 1, KD, 0); }
        P(o_w, "self_attn.o_proj.weight", 2, C, QD);
        if (c->o_bias) { P(o_b, "self_attn.o_proj.bias", 1, C, 0); }
        if (c->qk_norm) {
            P(q_norm_w, "self_attn.q_norm.weight", 1, D, 0);
            P(k_norm_w, "self_attn.k_norm.weight", 1, D, 0);
        }
        P(mlp_norm_w, "post_attention_layernorm.weight", 1, C, 0);
        P(gate_w, "mlp.gate_proj.weight", 2, F, C);
        if (c->mlp_bias) { P(gate_b, "mlp.gate_proj.bias", 1, F, 0); }
        P(up_w, "mlp.up_proj.weight", 2, F, C);
        if (c->mlp_bias) { P(up_b, "mlp.up_proj.bias", 1, F, 0); }
        P(down_w, "mlp.down_proj.weight", 2, C, F);
        if (c->mlp_bias) { P(down_b, "mlp.down_proj.bias", 1, C, 0); }
#undef P
    }
    enter_unit(v, model_unit_head(m));
    visit(v, &m->w.final_norm_w, &m->g.final_norm_w, "model.norm.weight", 1, C, 0, NULL, 0, 1, false);
    visit_head(v);
}

static void visit_gpt2(struct param_visit *v) {
    struct model *m = v->model;
    const struct model_config *c = &m->config;
    int64_t C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t P_ = c->max_position_embeddings;
    char n[NAME_BYTES], hf[NAME_BYTES];
    enter_unit(v, MODEL_UNIT_EMBED);
    visit(v, &m->w.wte, &m->g.wte, "transformer.wte.weight", 2, V, C, NULL, 0, 1, false);
    visit(v, &m->w.wpe, &m->g.wpe, "transformer.wpe.weight", 2, P_, C, NULL, 0, 1, false);
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct layer_weights *w = &m->w.layers[l], *g = &m->g.layers[l];
        enter_unit(v, model_unit_layer(l));
        /* Conv1D weights are stored [in, out] in the checkpoint: transposed here. */
#define P(field, suffix, hf_suffix, part, parts, transposed, ...)                           \
    snprintf(n, sizeof n, "transformer.h.%lld.%s", (long long)l, suffix);                     \
    snprintf(hf, sizeof hf, "transformer.h.%lld.%s", (long long)l, hf_suffix);                \
    visit(v, &w->field, &g->field, n, __VA_ARGS__, hf, part, parts, transposed)
        P(attn_norm_w, "ln_1.weight", "ln_1.weight", 0, 1, false, 1, C, 0);
        P(attn_norm_b, "ln_1.bias", "ln_1.bias", 0, 1, false, 1, C, 0);
        P(q_w, "attn.q.weight", "attn.c_attn.weight", 0, 3, true, 2, C, C);
        P(k_w, "attn.k.weight", "attn.c_attn.weight", 1, 3, true, 2, C, C);
        P(v_w, "attn.v.weight", "attn.c_attn.weight", 2, 3, true, 2, C, C);
        P(q_b, "attn.q.bias", "attn.c_attn.bias", 0, 3, false, 1, C, 0);
        P(k_b, "attn.k.bias", "attn.c_attn.bias", 1, 3, false, 1, C, 0);
        P(v_b, "attn.v.bias", "attn.c_attn.bias", 2, 3, false, 1, C, 0);
        P(o_w, "attn.c_proj.weight", "attn.c_proj.weight", 0, 1, true, 2, C, C);
        P(o_b, "attn.c_proj.bias", "attn.c_proj.bias", 0, 1, false, 1, C, 0);
        P(mlp_norm_w, "ln_2.weight", "ln_2.weight", 0, 1, false, 1, C, 0);
        P(mlp_norm_b, "ln_2.bias", "ln_2.bias", 0, 1, false, 1, C, 0);
        P(fc_w, "mlp.c_fc.weight", "mlp.c_fc.weight", 0, 1, true, 2, F, C);
        P(fc_b, "mlp.c_fc.bias", "mlp.c_fc.bias", 0, 1, false, 1, F, 0);
        P(proj_w, "mlp.c_proj.weight", "mlp.c_proj.weight", 0, 1, true, 2, C, F);
        P(proj_b, "mlp.c_proj.bias", "mlp.c_proj.bias", 0, 1, false, 1, C, 0);
#undef P
    }
    enter_unit(v, model_unit_head(m));
    visit(v, &m->w.final_norm_w, &m->g.final_norm_w, "transformer.ln_f.weight", 1, C, 0, NULL, 0, 1, false);
    visit(v, &m->w.final_norm_b, &m->g.final_norm_b, "transformer.ln_f.bias", 1, C, 0, NULL, 0, 1, false);
    visit_head(v);
}

static void visit_all(struct param_visit *v) {
    if (v->model->config.type == MODEL_TYPE_GPT2)
        visit_gpt2(v);
    else
        visit_llama(v);
    struct model *m = v->model;
    if (v->bind && m->config.tie_word_embeddings && !m->config.score_head) {
        m->w.lm_head = m->w.wte;
        m->g.lm_head = m->g.wte;
    }
}

void model_bind_views(struct model *m) {
    struct param_visit v = {.model = m, .bind = true, .only = -1, .wbase = m->weights.data,
                            .gbase = m->grads.data};
    visit_all(&v);
    SMELT_ASSERT(v.count == m->n_params && v.offset == m->n_weights);
}

int64_t model_unit_head(const struct model *m) { return m->config.n_layers + 1; }
int64_t model_unit_count(const struct model *m) { return m->config.n_layers + 2; }

void model_unit_range(const struct model *m, int64_t unit, int64_t *offset, int64_t *numel) {
    SMELT_ASSERT(unit >= 0 && unit < model_unit_count(m));
    *offset = m->unit_offsets[unit];
    *numel = m->unit_offsets[unit + 1] - m->unit_offsets[unit];
}

void model_unit_bind(struct model *m, int64_t unit, float *w, float *g) {
    struct tensor score_w = m->w.score, score_g = m->g.score;
    int64_t offset, numel;
    model_unit_range(m, unit, &offset, &numel);
    struct param_visit v = {.model = m, .bind = true, .only = unit, .wbase = w, .gbase = g,
                            .base_off = offset};
    visit_all(&v);
    if (m->adapter) {
        m->w.score = score_w;
        m->g.score = score_g;
    }
}

int model_create(const struct model_config *config, enum backend backend, struct model **out,
                 struct smelt_error *err) {
    struct model *m = calloc(1, sizeof *m);
    if (!m) return error_set(err, SMELT_ENOMEM, "model: out of memory");
    m->config = *config;
    m->backend = backend;
    m->w.layers = calloc((size_t)config->n_layers, sizeof *m->w.layers);
    m->g.layers = calloc((size_t)config->n_layers, sizeof *m->g.layers);
    if (!m->w.layers || !m->g.layers) {
        model_free(m);
        return error_set(err, SMELT_ENOMEM, "model: out of memory");
    }
    m->unit_offsets = calloc((size_t)model_unit_count(m) + 1, sizeof *m->unit_offsets);
    if (!m->unit_offsets) {
        model_free(m);
        return error_set(err, SMELT_ENOMEM, "model: out of memory");
    }
    if (config->positions == MODEL_POS_ROPE) {
        m->rope_inv_freq = malloc((size_t)(config->head_dim / 2 + 1) * sizeof *m->rope_inv_freq);
        int rc = m->rope_inv_freq ? model_rope_table(config, m->rope_inv_freq, &m->rope_scale, err)
                                  : error_set(err, SMELT_ENOMEM, "model: out of memory");
        if (rc) {
            model_free(m);
            return rc;
        }
    }
    struct param_visit count = {.model = m, .only = -1};
    visit_all(&count);
    m->n_params = count.count;
    m->n_weights = count.offset;
    m->unit_offsets[model_unit_count(m)] = m->n_weights;
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    if (!m->params) {
        model_free(m);
        return error_set(err, SMELT_ENOMEM, "model: out of memory");
    }
    int64_t shape[1] = {m->n_weights};
    int rc = tensor_alloc(&m->weights, backend, DTYPE_F32, 1, shape, err);
    if (rc) {
        long long n_weights = (long long)m->n_weights;
        model_free(m);
        return error_wrap(err, rc, "model: %lld parameters", n_weights);
    }
    model_bind_views(m);
    *out = m;
    return SMELT_OK;
}

int model_grads_alloc(struct model *m, struct smelt_error *err) {
    if (m->grads.data) return SMELT_OK;
    if (m->provider)
        return error_set(err, SMELT_EINVAL, "model_grads_alloc: a parameter provider serves this "
                         "model's gradients (ZeRO-3): no whole gradient buffer");
    int64_t shape[1] = {m->n_weights};
    int rc = tensor_alloc(&m->grads, m->backend, DTYPE_F32, 1, shape, err);
    if (rc) return error_wrap(err, rc, "model gradients");
    model_bind_views(m);
    return SMELT_OK;
}

void model_free(struct model *m) {
    if (!m) return;
    tensor_free(&m->weights);
    tensor_free(&m->grads);
    free(m->params);
    free(m->unit_offsets);
    free(m->rope_inv_freq);
    free(m->w.layers);
    free(m->g.layers);
    free(m);
}

const struct model_param *model_param_find(const struct model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

/* Parameters are all weights except norm gains (1) and biases (0): the usual init
 * for training from scratch. */
int model_init_random(const struct model_config *config, uint64_t seed, enum backend backend,
                      struct model **out, struct smelt_error *err) {
    struct model *m;
    int rc = model_create(config, backend, &m, err);
    if (rc) return rc;
    float *host = malloc((size_t)m->n_weights * sizeof *host);
    if (!host) {
        model_free(m);
        return error_set(err, SMELT_ENOMEM, "model_init_random: out of memory");
    }
    struct rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *p = &m->params[i];
        float *dst = host + p->offset;
        bool is_bias = strstr(p->name, ".bias") != NULL;
        bool is_norm = p->ndim == 1 && !is_bias;
        for (int64_t j = 0; j < p->numel; j++)
            dst[j] = is_bias ? 0.0f : is_norm ? 1.0f : (float)(0.02 * rng_normal(&rng));
    }
    struct tensor src = tensor_f32(host, 1, &m->n_weights);
    rc = tensor_copy(&m->weights, &src, err);
    free(host);
    if (rc) {
        model_free(m);
        return rc;
    }
    *out = m;
    return SMELT_OK;
}
