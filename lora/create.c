/* An adapter's layout (one flat buffer: for each layer, each wrapped module, A then B;
 * then a classifier's head when it carries one), PEFT's initialisation, attaching to
 * the model, and freeing. */
#include "lora/lora_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tensor lora_param_view(const struct lora *lora, const struct tensor *flat, int param) {
    const struct lora_param *p = &lora->params[param];
    float *base = flat->data;
    return tensor_make(flat->backend, DTYPE_F32, base + p->offset, 2, p->shape);
}

static void set_param(struct lora *lora, int index, const char *path, const char *which,
                      int64_t rows, int64_t cols, int64_t *offset) {
    struct lora_param *p = &lora->params[index];
    snprintf(p->name, sizeof p->name, "base_model.model.%s.%s.weight", path, which);
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->offset = *offset;
    p->numel = rows * cols;
    *offset += p->numel;
}

struct tensor lora_model_score(const struct model *model) {
    const struct model_param *p = model_param_find(model, "score.weight");
    SMELT_ASSERT(p && p->ndim == 2);
    return tensor_make(model->weights.backend, DTYPE_F32, (float *)model->weights.data + p->offset, 2, p->shape);
}

/* The classifier head's copy after the LoRA pairs: [1, C] at *offset. */
static void add_head(struct lora *lora, int64_t *offset) {
    struct lora_param *p = &lora->params[lora->n_params++];
    snprintf(p->name, sizeof p->name, "%s", LORA_SCORE_NAME);
    p->shape[0] = 1;
    p->shape[1] = lora->model->config.hidden_size;
    p->offset = *offset;
    p->numel = p->shape[1];
    *offset += p->numel;
}

/* lm_head's module after every block's: A [r, C], B [V, r]. */
static void add_lm_head(struct lora *lora, int64_t *offset) {
    struct lora_state *s = lora->state;
    const struct model_config *c = &lora->model->config;
    struct lora_module *mod = &s->modules[s->n_modules];
    *mod = (struct lora_module){.layer = c->n_layers, .kind = LORA_HEAD_KIND, .param_a = 2 * s->n_modules,
                                .in = c->hidden_size, .out = c->vocab_size};
    set_param(lora, mod->param_a, LORA_HEAD_PATH, "lora_A", lora->config.rank, mod->in, offset);
    set_param(lora, mod->param_a + 1, LORA_HEAD_PATH, "lora_B", mod->out, lora->config.rank, offset);
    if (mod->in > s->max_in) s->max_in = mod->in;
    s->head_module = s->n_modules++;
    lora->adapter.head_forward = lora_hook_head_forward;
    lora->adapter.head_backward = lora_hook_head_backward;
}

/* Modules and parameters in layer order, then kind order; lm_head's after them; a
 * classifier's head last. */
static int build_table(struct lora *lora, bool head, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    const struct model *m = lora->model;
    int n_kinds;
    const struct lora_kind *kinds = lora_kinds(m, &n_kinds);
    const struct lora_selection *sel = &s->selection;
    int n = sel->lm_head;
    for (int64_t i = 0; i < sel->n_layers * n_kinds; i++) n += sel->wrapped[i];
    s->head_module = -1;
    s->modules = calloc((size_t)n, sizeof *s->modules);
    lora->params = calloc((size_t)n * 2 + head, sizeof *lora->params);
    s->hooks = malloc((size_t)(sel->n_layers * MODEL_LINEAR_COUNT) * sizeof *s->hooks);
    if (!s->modules || !lora->params || !s->hooks)
        return error_set(err, SMELT_ENOMEM, "lora: out of memory");
    for (int64_t i = 0; i < sel->n_layers * MODEL_LINEAR_COUNT; i++)
        s->hooks[i] = (struct lora_hook){.module = -1};
    int64_t r = lora->config.rank, offset = 0;
    char block[64], path[128];
    for (int64_t l = 0; l < sel->n_layers; l++)
        for (int k = 0; k < n_kinds; k++) {
            if (!sel->wrapped[l * n_kinds + k]) continue;
            const struct lora_kind *kind = &kinds[k];
            struct lora_module *mod = &s->modules[s->n_modules];
            *mod = (struct lora_module){.layer = l, .kind = k, .param_a = 2 * s->n_modules,
                                        .in = lora_dim(m, kind->in), .out = lora_dim(m, kind->out)};
            snprintf(block, sizeof block, lora_block_prefix(m), (long long)l);
            snprintf(path, sizeof path, "%s%s", block, kind->path);
            set_param(lora, mod->param_a, path, "lora_A", r, mod->in, &offset);
            set_param(lora, mod->param_a + 1, path, "lora_B", mod->out, r, &offset);
            int64_t rows = mod->out / kind->n_linears;
            for (int j = 0; j < kind->n_linears; j++)
                s->hooks[l * MODEL_LINEAR_COUNT + kind->linears[j]] =
                    (struct lora_hook){.module = s->n_modules, .row0 = j * rows, .rows = rows};
            if (mod->in > s->max_in) s->max_in = mod->in;
            s->n_modules++;
        }
    if (sel->lm_head) add_lm_head(lora, &offset);
    lora->n_params = 2 * s->n_modules;
    if (head) add_head(lora, &offset);
    lora->n_weights = offset;
    return SMELT_OK;
}

int lora_build(struct model *model, const struct lora_config *config,
               struct lora_selection *selection, bool head, struct lora **out, struct smelt_error *err) {
    if (head && !model->config.score_head) {
        lora_selection_free(selection);
        return error_set(err, SMELT_EINVAL, "lora: %s has no score head for the adapter to carry",
                         model->config.architecture);
    }
    struct lora *lora = calloc(1, sizeof *lora);
    struct lora_state *s = calloc(1, sizeof *s);
    if (!lora || !s) {
        free(lora), free(s);
        lora_selection_free(selection);
        return error_set(err, SMELT_ENOMEM, "lora: out of memory");
    }
    s->selection = *selection;
    *selection = (struct lora_selection){0};
    lora->state = s;
    lora->model = model;
    lora->config = *config;
    bool uniform;
    lora_selection_names(model, &s->selection, lora->config.targets, LORA_MAX_TARGETS,
                         &lora->config.n_targets, &uniform);
    float r = (float)config->rank;
    lora->scaling = config->alpha / (config->use_rslora ? sqrtf(r) : r);
    lora->adapter = (struct model_adapter){.ctx = lora, .forward = lora_hook_forward,
                                           .backward = lora_hook_backward};
    int rc = build_table(lora, head, err);
    /* Every target matched a module, so the buffers are never empty. */
    if (!rc) rc = tensor_alloc(&lora->weights, model->backend, DTYPE_F32, 1, &lora->n_weights, err);
    if (!rc) rc = tensor_alloc(&lora->grads, model->backend, DTYPE_F32, 1, &lora->n_weights, err);
    if (!rc && head) {
        lora->score = lora_param_view(lora, &lora->weights, lora->n_params - 1);
        lora->score_grad = lora_param_view(lora, &lora->grads, lora->n_params - 1);
    }
    if (rc) {
        lora_free(lora);
        return error_wrap(err, rc, "lora");
    }
    *out = lora;
    return SMELT_OK;
}

/* PEFT's init: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0. */
static int init_weights(struct lora *lora, uint64_t seed, struct smelt_error *err) {
    float *host = calloc((size_t)lora->n_weights, sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "lora_create: out of memory");
    struct rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < lora->state->n_modules; i++) {
        const struct lora_param *a = &lora->params[lora->state->modules[i].param_a];
        double bound = 1.0 / sqrt((double)a->shape[1]);
        for (int64_t j = 0; j < a->numel; j++)
            host[a->offset + j] = (float)((2.0 * rng_uniform(&rng) - 1.0) * bound);
    }
    struct tensor src = tensor_f32(host, 1, &lora->n_weights);
    int rc = tensor_copy(&lora->weights, &src, err);
    free(host);
    return rc;
}

int lora_create(struct model *model, const struct lora_config *config, uint64_t seed,
                struct lora **out, struct smelt_error *err) {
    int rc = lora_config_check(config, "lora", err);
    if (rc) return rc;
    const char *names[LORA_MAX_TARGETS];
    for (int i = 0; i < config->n_targets; i++) names[i] = config->targets[i];
    struct lora_selection sel;
    if ((rc = lora_select(model, names, config->n_targets, "lora", &sel, err))) return rc;
    struct lora *lora;
    if ((rc = lora_build(model, config, &sel, model->config.score_head, &lora, err))) return rc;
    rc = init_weights(lora, seed, err);
    /* PEFT's ModulesToSaveWrapper starts its copy from the module itself. */
    if (!rc && lora->score.data) {
        struct tensor own = lora_model_score(model);
        rc = tensor_copy(&lora->score, &own, err);
    }
    if (rc) {
        lora_free(lora);
        return rc;
    }
    *out = lora;
    return SMELT_OK;
}

int lora_attach(struct lora *lora, struct smelt_error *err) {
    struct model *m = lora->model;
    if (m->adapter == &lora->adapter) return SMELT_OK;
    if (m->adapter)
        return error_set(err, SMELT_EINVAL, "lora_attach: the model already has an adapter attached");
    m->adapter = &lora->adapter;
    /* The head's hook: model/ reads the head only through this view. */
    if (lora->score.data) m->w.score = lora->score;
    return SMELT_OK;
}

void lora_detach(struct lora *lora) {
    if (!lora || !lora->model || lora->model->adapter != &lora->adapter) return;
    lora->model->adapter = NULL;
    if (lora->score.data) lora->model->w.score = lora_model_score(lora->model);
}

void lora_set_training(struct lora *lora, bool training) { lora->state->training = training; }

void lora_set_dropout_seed(struct lora *lora, uint64_t seed) { lora->state->dropout_seed = seed; }

static void scratch_free(struct lora_state *s, bool wide) {
    if (wide) {
        tensor_free(&s->x_drop);
        tensor_free(&s->dx_drop);
        free(s->host_a), free(s->host_b);
        s->host_a = s->host_b = NULL;
        s->cap_wide_rows = 0;
    } else {
        tensor_free(&s->u);
        tensor_free(&s->du);
        s->cap_rows = 0;
    }
}

/* The [rows, max_in] buffers exist only while dropout is on: they are as large as a
 * layer's MLP activations. */
int lora_scratch_reserve(struct lora *lora, int64_t rows, bool wide, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    enum backend be = lora->model->backend;
    int rc = SMELT_OK;
    if (rows > s->cap_rows) {
        scratch_free(s, false);
        int64_t n = rows * lora->config.rank;
        rc = tensor_alloc(&s->u, be, DTYPE_F32, 1, &n, err);
        if (!rc) rc = tensor_alloc(&s->du, be, DTYPE_F32, 1, &n, err);
        if (!rc) s->cap_rows = rows;
    }
    if (!rc && wide && rows > s->cap_wide_rows) {
        scratch_free(s, true);
        int64_t n = rows * s->max_in;
        rc = tensor_alloc(&s->x_drop, be, DTYPE_F32, 1, &n, err);
        if (!rc) rc = tensor_alloc(&s->dx_drop, be, DTYPE_F32, 1, &n, err);
        if (!rc && be != BACKEND_CPU) {
            s->host_a = malloc((size_t)n * sizeof *s->host_a);
            s->host_b = malloc((size_t)n * sizeof *s->host_b);
            if (!s->host_a || !s->host_b) rc = error_set(err, SMELT_ENOMEM, "lora: out of memory");
        }
        if (!rc) s->cap_wide_rows = rows;
    }
    if (rc) return error_wrap(err, rc, "lora scratch for %lld rows", (long long)rows);
    return SMELT_OK;
}

void lora_free(struct lora *lora) {
    if (!lora) return;
    lora_detach(lora);
    struct lora_state *s = lora->state;
    if (s) {
        scratch_free(s, true);
        scratch_free(s, false);
        free(s->modules);
        free(s->hooks);
        lora_selection_free(&s->selection);
        free(s);
    }
    tensor_free(&lora->weights);
    tensor_free(&lora->grads);
    free(lora->params);
    free(lora);
}
