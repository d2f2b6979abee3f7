/* PEFT adapter directories: adapter_config.json + adapter_model.safetensors with
 * PEFT's tensor names (base_model.model.<module path>.lora_A.weight [r, in],
 * .lora_B.weight [out, r]; a classifier's head as base_model.model.score.weight), and
 * the base model an adapter directory names. */
#include "lora/lora_internal.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <stdlib.h>
#include <string.h>

#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"

int lora_save(const struct lora *lora, const char *dir, const char *base_model_name_or_path,
              struct smelt_error *err) {
    char weights_path[4096], config_path[4096];
    int rc = dir_create_all(dir, err);
    if (!rc) rc = path_join(weights_path, sizeof weights_path, dir, WEIGHTS_FILE, err);
    if (!rc) rc = path_join(config_path, sizeof config_path, dir, CONFIG_FILE, err);
    if (rc) return rc;
    float *host = malloc((size_t)lora->n_weights * sizeof *host);
    struct safetensors_tensor_desc *desc = calloc((size_t)lora->n_params, sizeof *desc);
    if (!host || !desc) rc = error_set(err, SMELT_ENOMEM, "lora_save: out of memory");
    if (!rc) {
        struct tensor dst = tensor_f32(host, 1, &lora->n_weights);
        rc = tensor_copy(&dst, &lora->weights, err);
    }
    for (int i = 0; !rc && i < lora->n_params; i++) {
        const struct lora_param *p = &lora->params[i];
        desc[i] = (struct safetensors_tensor_desc){
            .name = p->name, .tensor = tensor_f32(host + p->offset, 2, p->shape), .file_dtype = DTYPE_F32};
    }
    /* PEFT and transformers expect format=pt in the metadata. */
    const struct safetensors_kv meta[] = {{"format", "pt"}};
    if (!rc) rc = safetensors_write(weights_path, desc, (size_t)lora->n_params, meta, 1, err);
    if (!rc) rc = lora_file_config_save(lora, config_path, base_model_name_or_path, err);
    free(host);
    free(desc);
    return rc;
}

/* PEFT saves the base layer of a targeted lm_head too (save_embedding_layers "auto"
 * turns on when target_modules names an embedding layer), and its loader writes it
 * into the model. smelt never replaces base weights from an adapter: the tensor is
 * accepted when it is the model's own lm_head, bit for bit, and refused otherwise. */
#define LM_HEAD_BASE_NAME "base_model.model.lm_head.base_layer.weight"

static int check_lm_head_base(const struct lora *lora, const struct safetensors *st, struct smelt_error *err) {
    const struct tensor *w = &lora->model->w.lm_head;
    if (lora->state->head_module < 0 || !w->data)
        return error_set(err, SMELT_EFORMAT, "%s: tensor '%s' is not part of this adapter (it does not wrap lm_head)",
                         st->path, LM_HEAD_BASE_NAME);
    int64_t n = tensor_numel(w);
    float *file = malloc((size_t)n * sizeof *file), *own = malloc((size_t)n * sizeof *own);
    int rc = file && own ? SMELT_OK : error_set(err, SMELT_ENOMEM, "lora_load: out of memory");
    if (!rc) rc = safetensors_read_f32(st, LM_HEAD_BASE_NAME, file, 2, w->shape, err);
    struct tensor host = tensor_f32(own, 2, w->shape);
    if (!rc) rc = tensor_copy(&host, w, err);
    if (!rc && memcmp(file, own, (size_t)n * sizeof *own) != 0)
        rc = error_set(err, SMELT_EUNSUPPORTED, "%s: tensor '%s' (PEFT's copy of the base lm_head) differs from this "
                       "model's lm_head: smelt does not replace base weights from an adapter; load the adapter on the "
                       "base it was saved with", st->path, LM_HEAD_BASE_NAME);
    free(file), free(own);
    return rc;
}

/* Reads every parameter from st into host and refuses tensors the adapter lacks. */
static int read_tensors(const struct lora *lora, const struct safetensors *st, float *host,
                        struct smelt_error *err) {
    bool *used = calloc(st->n_entries ? st->n_entries : 1, sizeof *used);
    if (!used) return error_set(err, SMELT_ENOMEM, "lora_load: out of memory");
    int rc = SMELT_OK;
    for (int i = 0; !rc && i < lora->n_params; i++) {
        const struct lora_param *p = &lora->params[i];
        const struct safetensors_entry *e = safetensors_find(st, p->name);
        if (!e) {
            rc = error_set(err, SMELT_ENOTFOUND, "%s: tensor '%s' is missing", st->path, p->name);
            break;
        }
        used[e - st->entries] = true;
        rc = safetensors_read_f32(st, p->name, host + p->offset, 2, p->shape, err);
    }
    for (size_t i = 0; !rc && i < st->n_entries; i++)
        if (!used[i] && strcmp(st->entries[i].name, LM_HEAD_BASE_NAME) == 0)
            rc = check_lm_head_base(lora, st, err);
        else if (!used[i])
            rc = error_set(err, SMELT_EFORMAT,
                           "%s: tensor '%s' is not part of this adapter (r %d, target_modules as in %s)",
                           st->path, st->entries[i].name, lora->config.rank, CONFIG_FILE);
    free(used);
    return rc;
}

static int load_weights(struct lora *lora, const char *path, struct smelt_error *err) {
    if (!path_exists(path))
        return error_set(err, SMELT_ENOTFOUND, "%s: not found (smelt reads adapters in the safetensors format)", path);
    struct safetensors *st;
    int rc = safetensors_open(path, &st, err);
    if (rc) return rc;
    float *host = malloc((size_t)lora->n_weights * sizeof *host);
    if (!host) rc = error_set(err, SMELT_ENOMEM, "lora_load: out of memory");
    if (!rc) rc = read_tensors(lora, st, host, err);
    if (!rc) {
        struct tensor src = tensor_f32(host, 1, &lora->n_weights);
        rc = tensor_copy(&lora->weights, &src, err);
    }
    free(host);
    safetensors_close(st);
    return rc;
}

int lora_load(struct model *model, const char *dir, struct lora **out, struct smelt_error *err) {
    char weights_path[4096], config_path[4096];
    int rc = path_join(weights_path, sizeof weights_path, dir, WEIGHTS_FILE, err);
    if (!rc) rc = path_join(config_path, sizeof config_path, dir, CONFIG_FILE, err);
    if (rc) return rc;
    struct lora_file_config fc;
    if ((rc = lora_file_config_load(config_path, &fc, err))) return rc;
    struct lora_selection sel;
    struct lora *lora = NULL;
    if (fc.seq_cls && !model->config.score_head)
        rc = error_set(err, SMELT_EINVAL,
                       "%s: a sequence classifier's adapter (task_type SEQ_CLS, with its head) cannot go on %s, "
                       "which has no score head: a causal LM becomes the classifier first (lora_load_with_base; "
                       "smelt-model score and the trainer do that)",
                       config_path, model->config.architecture);
    if (!rc) rc = lora_select(model, fc.targets, fc.n_targets, config_path, &sel, err);
    if (!rc) rc = lora_build(model, &fc.config, &sel, fc.seq_cls, &lora, err);
    lora_file_config_free(&fc);
    if (!rc) rc = load_weights(lora, weights_path, err);
    if (rc) {
        lora_free(lora);
        return rc;
    }
    *out = lora;
    return SMELT_OK;
}

int lora_dir_info(const char *dir, struct lora_dir_info *out, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    char config_path[4096];
    TRY(path_join(config_path, sizeof config_path, dir, CONFIG_FILE, err));
    struct lora_file_config fc;
    TRY(lora_file_config_load(config_path, &fc, err));
    out->seq_cls = fc.seq_cls;
    const char *base = NULL;
    int rc = json_field_string(fc.root, "base_model_name_or_path", false, NULL, &base, config_path, err);
    if (!rc && base && base[0]) {
        int n = base[0] == '/' ? snprintf(out->base_path, sizeof out->base_path, "%s", base)
                               : snprintf(out->base_path, sizeof out->base_path, "%s/%s", dir, base);
        /* PEFT reads a relative path from the working directory: so does smelt when
         * the adapter's own directory holds no such base. */
        if (n >= 0 && (size_t)n < sizeof out->base_path && base[0] != '/' && !path_is_dir(out->base_path) &&
            path_is_dir(base))
            n = snprintf(out->base_path, sizeof out->base_path, "%s", base);
        if (n < 0 || (size_t)n >= sizeof out->base_path)
            rc = error_set(err, SMELT_EINVAL, "%s: base_model_name_or_path is too long", config_path);
    }
    lora_file_config_free(&fc);
    return rc;
}

/* A causal LM made the classifier a SEQ_CLS adapter goes on (its head's values do not
 * matter: the adapter's copy replaces them). */
static int as_classifier(struct model **model, int64_t pad_token_id, struct smelt_error *err) {
    if ((*model)->config.score_head) return SMELT_OK;
    struct model *rm;
    TRY(model_classifier_from_lm(*model, pad_token_id, 0.02, 0, &rm, err));
    model_free(*model);
    *model = rm;
    return SMELT_OK;
}

int lora_load_with_base(const char *dir, const char *base_dir, enum backend backend, int64_t pad_token_id,
                        struct model **model, struct lora **adapter, struct smelt_error *err) {
    struct lora_dir_info info;
    TRY(lora_dir_info(dir, &info, err));
    const char *base = base_dir ? base_dir : info.base_path;
    if (!base[0])
        return error_set(err, SMELT_EINVAL, "%s/%s names no base_model_name_or_path: give the base model", dir,
                         CONFIG_FILE);
    if (!path_is_dir(base))
        return error_set(err, SMELT_ENOTFOUND, "%s: the base model %s is not a directory", dir, base);
    struct model *m;
    TRY(error_wrap(err, model_load(base, backend, &m, err), "base model"));
    int rc = info.seq_cls ? as_classifier(&m, pad_token_id, err) : SMELT_OK;
    if (!rc) rc = lora_load(m, dir, adapter, err);
    if (rc) {
        model_free(m);
        return rc;
    }
    *model = m;
    return SMELT_OK;
}
