/* Folding an adapter into the base: W += s B A for every wrapped linear (GPT-2's q, k
 * and v each take their row block of c_attn's B), with ops_matmul so it runs where the
 * weights live; lm_head takes W += s B A the same way, but not when it is the tied
 * embedding: that would change the input embeddings too (PEFT merges it anyway, with a
 * warning that it "can lead to complications"; smelt refuses it before touching any
 * weight). A classifier's head is not a delta but a trained copy, so it replaces the
 * model's own. */
#include "lora/lora_internal.h"

static struct tensor *base_weight(struct layer_weights *w, enum model_linear linear) {
    switch (linear) {
    case MODEL_LINEAR_Q: return &w->q_w;
    case MODEL_LINEAR_K: return &w->k_w;
    case MODEL_LINEAR_V: return &w->v_w;
    case MODEL_LINEAR_O: return &w->o_w;
    case MODEL_LINEAR_GATE: return &w->gate_w;
    case MODEL_LINEAR_UP: return &w->up_w;
    case MODEL_LINEAR_DOWN: return &w->down_w;
    case MODEL_LINEAR_FC: return &w->fc_w;
    case MODEL_LINEAR_PROJ: return &w->proj_w;
    case MODEL_LINEAR_COUNT: break;
    }
    return NULL;
}

/* W_lm_head += s B A. */
static int merge_lm_head(const struct lora *lora, const struct lora_module *mod, struct smelt_error *err) {
    struct tensor a = lora_param_view(lora, &lora->weights, mod->param_a);
    struct tensor b = lora_param_view(lora, &lora->weights, mod->param_a + 1);
    struct tensor *w = &lora->model->w.lm_head;
    SMELT_ASSERT(w->shape[0] == mod->out && w->shape[1] == mod->in);
    int rc = ops_matmul(w, &b, &a, NULL, false, false, lora->scaling, 1.0f, err);
    return rc ? error_wrap(err, rc, "lora_merge: %s", lora->params[mod->param_a].name) : SMELT_OK;
}

int lora_merge_check(const struct lora *lora, struct smelt_error *err) {
    if (lora->state->head_module >= 0 && lora->model->config.tie_word_embeddings)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "lora_merge: the adapter wraps lm_head, which is tied to the token embeddings "
                         "(tie_word_embeddings): merging it would change the embeddings too; use the adapter "
                         "unmerged, or untie the base model first");
    return SMELT_OK;
}

int lora_merge(const struct lora *lora, struct smelt_error *err) {
    struct model *m = lora->model;
    if (m->adapter == &lora->adapter)
        return error_set(err, SMELT_EINVAL, "lora_merge: detach the adapter first (merged and attached, it would count twice)");
    TRY(lora_merge_check(lora, err));
    const struct lora_state *s = lora->state;
    int n_kinds;
    const struct lora_kind *kinds = lora_kinds(m, &n_kinds);
    for (int i = 0; i < s->n_modules; i++) {
        const struct lora_module *mod = &s->modules[i];
        if (mod->kind == LORA_HEAD_KIND) {
            TRY(merge_lm_head(lora, mod, err));
            continue;
        }
        const struct lora_kind *kind = &kinds[mod->kind];
        struct tensor a = lora_param_view(lora, &lora->weights, mod->param_a);
        struct tensor b = lora_param_view(lora, &lora->weights, mod->param_a + 1);
        int64_t r = lora->config.rank, rows = mod->out / kind->n_linears;
        for (int j = 0; j < kind->n_linears; j++) {
            struct tensor *w = base_weight(&m->w.layers[mod->layer], kind->linears[j]);
            SMELT_ASSERT(w && w->shape[0] == rows && w->shape[1] == mod->in);
            int64_t shape[2] = {rows, r};
            struct tensor block = tensor_make(b.backend, DTYPE_F32, (float *)b.data + j * rows * r, 2, shape);
            int rc = ops_matmul(w, &block, &a, NULL, false, false, lora->scaling, 1.0f, err);
            if (rc) return error_wrap(err, rc, "lora_merge: %s", lora->params[mod->param_a].name);
        }
    }
    if (!lora->score.data) return SMELT_OK;
    struct tensor own = lora_model_score(m);
    return error_wrap(err, tensor_copy(&own, &lora->score, err), "lora_merge: %s", LORA_SCORE_NAME);
}
