/* Turning a causal LM into a reward model: the same body under a one-label
 * *ForSequenceClassification config, a fresh score head in place of lm_head. */
#include "model/model_internal.h"
#include "model/score_head.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const classifier_class[MODEL_TYPE_COUNT] = {
    [MODEL_TYPE_LLAMA] = "LlamaForSequenceClassification",
    [MODEL_TYPE_MISTRAL] = "MistralForSequenceClassification",
    [MODEL_TYPE_QWEN2] = "Qwen2ForSequenceClassification",
    [MODEL_TYPE_QWEN3] = "Qwen3ForSequenceClassification",
    [MODEL_TYPE_GPT2] = "GPT2ForSequenceClassification",
};

const char *model_classifier_architecture(enum model_type type) {
    return (unsigned)type < MODEL_TYPE_COUNT ? classifier_class[type] : NULL;
}

/* The config of the classifier: the LM's, with the class, the head and a pad id. */
static int classifier_config(const struct model_config *lm, int64_t pad_token_id,
                             struct model_config *out, struct smelt_error *err) {
    const char *arch = model_classifier_architecture(lm->type);
    if (!arch)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "model type %s cannot be saved as a sequence classifier",
                         model_type_name(lm->type));
    if (lm->score_head)
        return error_set(err, SMELT_EINVAL, "%s already has a score head", lm->architecture);
    *out = *lm;
    out->score_head = true;
    snprintf(out->architecture, sizeof out->architecture, "%s", arch);
    if (pad_token_id < 0) pad_token_id = lm->pad_token_id;
    if (pad_token_id < 0 && lm->n_eos_token_ids > 0) pad_token_id = lm->eos_token_ids[0];
    if (pad_token_id < 0)
        return error_set(err, SMELT_EINVAL,
                         "%s: no pad_token_id (none given, none in the config, no eos): "
                         "transformers needs one to find each sequence's last token",
                         arch);
    if (pad_token_id >= lm->vocab_size)
        return error_set(err, SMELT_EINVAL, "pad_token_id %lld is outside the vocabulary (%lld)",
                         (long long)pad_token_id, (long long)lm->vocab_size);
    out->pad_token_id = pad_token_id;
    return SMELT_OK;
}

/* Every parameter of the classifier but its head, copied by name from the LM. */
static int copy_body(const struct model *lm, struct model *m, struct smelt_error *err) {
    for (int i = 0; i < m->n_params; i++) {
        const struct model_param *p = &m->params[i];
        if (strcmp(p->name, "score.weight") == 0) continue;
        const struct model_param *q = model_param_find(lm, p->name);
        if (!q || q->numel != p->numel)
            return error_set(err, SMELT_EINVAL, "model_classifier_from_lm: the LM has no %s of %lld elements",
                             p->name, (long long)p->numel);
        struct tensor src = tensor_make(lm->backend, DTYPE_F32, (float *)lm->weights.data + q->offset, 1, &q->numel);
        struct tensor dst = tensor_make(m->backend, DTYPE_F32, (float *)m->weights.data + p->offset, 1, &p->numel);
        TRY(tensor_copy(&dst, &src, err));
    }
    return SMELT_OK;
}

static int init_head(struct model *m, double init_std, uint64_t seed, struct smelt_error *err) {
    int64_t C = m->config.hidden_size;
    float *host = malloc((size_t)C * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "score head: out of memory");
    struct rng rng;
    rng_seed(&rng, seed);
    for (int64_t j = 0; j < C; j++) host[j] = (float)(init_std * rng_normal(&rng));
    struct tensor src = tensor_f32(host, 2, m->w.score.shape);
    int rc = tensor_copy(&m->w.score, &src, err);
    free(host);
    return rc;
}

int model_classifier_from_lm(const struct model *lm, int64_t pad_token_id, double init_std,
                             uint64_t seed, struct model **out, struct smelt_error *err) {
    if (!lm || !out) return error_set(err, SMELT_EINVAL, "model_classifier_from_lm: NULL argument");
    if (!(init_std > 0.0 && init_std < 1e3))
        return error_set(err, SMELT_EINVAL, "model_classifier_from_lm: init_std %g must be > 0", init_std);
    struct model_config cfg;
    TRY(classifier_config(&lm->config, pad_token_id, &cfg, err));
    struct model *m;
    TRY(model_create(&cfg, lm->backend, &m, err));
    int rc = copy_body(lm, m, err);
    if (!rc) rc = init_head(m, init_std, seed, err);
    if (rc) {
        model_free(m);
        return rc;
    }
    *out = m;
    return SMELT_OK;
}
