/* adapter_config.json as PEFT writes and reads it.
 *
 * Reading sorts PEFT's keys into three groups: what smelt uses (peft_type, task_type,
 * r, lora_alpha, lora_dropout, use_rslora, target_modules, bias, fan_in_fan_out,
 * modules_to_save: a classifier's head only), what
 * cannot change the forward pass (init options, names, versions), and features that
 * would change it and smelt does not implement (DoRA, per-module ranks, layer subsets,
 * extra trainable modules, ...): those must be off (null, false, {} or []). A key
 * smelt does not know is accepted only when it is off too, so a newer PEFT's feature
 * is refused rather than ignored. */
#include "lora/lora_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const used_keys[] = {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout",
                                        "use_rslora", "target_modules", "bias", "fan_in_fan_out",
                                        "modules_to_save", NULL};

/* Initialisation, bookkeeping and runtime options: no effect on the maths of a loaded
 * adapter. */
static const char *const inert_keys[] = {
    "peft_version", "auto_mapping", "base_model_name_or_path", "revision", "inference_mode",
    "init_lora_weights", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
    "megatron_core", "qalora_group_size", "runtime_config", "layers_pattern",
    "ensure_weight_tying", NULL};

static bool in_list(const char *const *list, const char *key) {
    for (; *list; list++)
        if (strcmp(*list, key) == 0) return true;
    return false;
}

static bool is_off(const json_t *v) {
    return json_is_null(v) || json_is_false(v) || (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0);
}

static int check_features_off(const json_t *root, const char *path, struct smelt_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        if (in_list(used_keys, key) || in_list(inert_keys, key) || is_off(v)) continue;
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: field '%s' is set; smelt does not implement it and will not ignore it",
                         path, key);
    }
    return SMELT_OK;
}

static int check_string_is(const json_t *root, const char *key, bool required, const char *want,
                           const char *path, struct smelt_error *err) {
    const char *got;
    int rc = json_field_string(root, key, required, want, &got, path, err);
    if (rc) return rc;
    if (got && strcmp(got, want) != 0)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: field '%s' is '%s'; smelt loads only '%s'",
                         path, key, got, want);
    return SMELT_OK;
}

static int read_targets(const json_t *root, struct lora_file_config *fc, const char *path,
                        struct smelt_error *err) {
    const json_t *t = json_object_get(root, "target_modules");
    if (json_is_string(t)) {
        if (strcmp(json_string_value(t), "all-linear") != 0)
            return error_set(err, SMELT_EUNSUPPORTED,
                             "%s: field 'target_modules' is the regular expression '%s'; smelt reads a list of names or \"all-linear\"",
                             path, json_string_value(t));
        fc->targets = malloc(sizeof *fc->targets);
        if (!fc->targets) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
        fc->targets[fc->n_targets++] = json_string_value(t);
        return SMELT_OK;
    }
    if (!json_is_array(t) || json_array_size(t) == 0)
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' must be a non-empty list of module names",
                         path);
    fc->targets = malloc(json_array_size(t) * sizeof *fc->targets);
    if (!fc->targets) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    size_t i;
    const json_t *v;
    json_array_foreach(t, i, v) {
        if (!json_is_string(v))
            return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' must list strings", path);
        fc->targets[fc->n_targets++] = json_string_value(v);
    }
    return SMELT_OK;
}

/* task_type: CAUSAL_LM (or absent), or SEQ_CLS, a sequence classifier's adapter,
 * which carries the head. */
static int read_task(const json_t *root, struct lora_file_config *fc, const char *path, struct smelt_error *err) {
    const char *task;
    TRY(json_field_string(root, "task_type", false, "CAUSAL_LM", &task, path, err));
    fc->seq_cls = task && strcmp(task, "SEQ_CLS") == 0;
    if (!task || fc->seq_cls || strcmp(task, "CAUSAL_LM") == 0) return SMELT_OK;
    return error_set(err, SMELT_EUNSUPPORTED, "%s: field 'task_type' is '%s'; smelt loads 'CAUSAL_LM' and 'SEQ_CLS'",
                     path, task);
}

/* modules_to_save: off, or for SEQ_CLS the classifier's head, which PEFT adds itself
 * for that task (its list is ["classifier", "score"] whatever the user gave; every
 * supported architecture calls its head "score"). Any other module trained in full is
 * a feature smelt does not implement. */
static int read_modules_to_save(const json_t *root, const struct lora_file_config *fc, const char *path,
                                struct smelt_error *err) {
    const json_t *list = json_object_get(root, "modules_to_save");
    if (!list || is_off(list)) return SMELT_OK;
    if (!json_is_array(list))
        return error_set(err, SMELT_EINVAL, "%s: field 'modules_to_save' must be a list of module names", path);
    size_t i;
    const json_t *v;
    json_array_foreach(list, i, v) {
        const char *name = json_string_value(v);
        if (!name) return error_set(err, SMELT_EINVAL, "%s: field 'modules_to_save' must list strings", path);
        if (fc->seq_cls && (strcmp(name, "score") == 0 || strcmp(name, "classifier") == 0)) continue;
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: field 'modules_to_save' names '%s'; smelt trains in full only a sequence classifier's "
                         "head (\"score\", with task_type SEQ_CLS)", path, name);
    }
    return SMELT_OK;
}

static int read_config(const json_t *root, struct lora_file_config *fc, const char *path,
                       struct smelt_error *err) {
    if (!json_is_object(root)) return error_set(err, SMELT_EFORMAT, "%s: expected a JSON object", path);
    int rc;
    if ((rc = check_string_is(root, "peft_type", true, "LORA", path, err))) return rc;
    if ((rc = read_task(root, fc, path, err))) return rc;
    if ((rc = read_modules_to_save(root, fc, path, err))) return rc;
    if ((rc = check_string_is(root, "bias", false, "none", path, err))) return rc;
    if ((rc = check_features_off(root, path, err))) return rc;
    /* PEFT sets fan_in_fan_out itself from the layer type (true for GPT-2's Conv1D);
     * A and B have the same shapes either way. Only its type is checked. */
    bool fan_in_fan_out;
    if ((rc = json_field_bool(root, "fan_in_fan_out", false, false, &fan_in_fan_out, path, err))) return rc;
    int64_t r;
    double alpha, dropout;
    struct lora_config *c = &fc->config;
    /* Absent values take LoraConfig's defaults. */
    if ((rc = json_field_int(root, "r", false, 8, 1, LORA_MAX_RANK, &r, path, err))) return rc;
    if ((rc = json_field_double(root, "lora_alpha", false, 8.0, -INFINITY, INFINITY, &alpha, path, err)))
        return rc;
    if (!(alpha > 0.0) || !isfinite((float)alpha))
        return error_set(err, SMELT_EINVAL, "%s: field 'lora_alpha' is %g; it must be a finite number > 0",
                         path, alpha);
    if ((rc = json_field_double(root, "lora_dropout", false, 0.0, -INFINITY, INFINITY, &dropout, path, err)))
        return rc;
    if (!(dropout >= 0.0 && (float)dropout < 1.0f))
        return error_set(err, SMELT_EINVAL, "%s: field 'lora_dropout' is %g; it must be in [0, 1)", path, dropout);
    if ((rc = json_field_bool(root, "use_rslora", false, false, &c->use_rslora, path, err))) return rc;
    c->rank = (int)r;
    c->alpha = (float)alpha;
    c->dropout = (float)dropout;
    if ((rc = lora_config_check(c, path, err))) return rc;
    return read_targets(root, fc, path, err);
}

void lora_file_config_free(struct lora_file_config *fc) {
    free(fc->targets);
    json_decref(fc->root);
    memset(fc, 0, sizeof *fc);
}

int lora_file_config_load(const char *path, struct lora_file_config *out,
                          struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    int rc = json_load_path(path, &out->root, err);
    if (rc) return rc;
    if ((rc = read_config(out->root, out, path, err))) lora_file_config_free(out);
    return rc;
}

/* A float as JSON with the fewest digits that read back as the same float: alpha 16
 * as 16, dropout 0.05 as 0.05 (jansson prints doubles with 17 digits otherwise). */
static json_t *short_real(float v) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *alpha_json(float alpha) {
    /* PEFT's lora_alpha is an int in the usual case; write it as one when it is. */
    if (alpha == floorf(alpha) && fabsf(alpha) < 16777216.0f) return json_integer((json_int_t)alpha);
    return short_real(alpha);
}

/* The names when they give the selection; otherwise every wrapped module's full path,
 * as PEFT writes an "all-linear" selection. */
static json_t *targets_json(const struct lora *lora) {
    json_t *list = json_array();
    if (!list) return NULL;
    char names[LORA_MAX_TARGETS][32];
    int n;
    bool uniform;
    lora_selection_names(lora->model, &lora->state->selection, names, LORA_MAX_TARGETS, &n, &uniform);
    for (int i = 0; uniform && i < n; i++)
        if (json_array_append_new(list, json_string(names[i]))) goto fail;
    static const char prefix[] = "base_model.model.", suffix[] = ".lora_A.weight";
    for (int i = 0; !uniform && i < lora->state->n_modules; i++) {
        const char *name = lora->params[lora->state->modules[i].param_a].name + strlen(prefix);
        int len = (int)(strlen(name) - strlen(suffix));
        if (json_array_append_new(list, json_stringn(name, (size_t)len))) goto fail;
    }
    return list;
fail:
    json_decref(list);
    return NULL;
}

int lora_file_config_save(const struct lora *lora, const char *path,
                          const char *base_model_name_or_path, struct smelt_error *err) {
    const struct lora_config *c = &lora->config;
    json_t *base = base_model_name_or_path ? json_string(base_model_name_or_path) : json_null();
    /* A classifier's adapter as PEFT writes one: its SEQ_CLS task and the modules it
     * trains in full for that task, in its order. */
    bool head = lora->score.data != NULL;
    /* PEFT's keys of long standing, so older PEFT versions load the file too. */
    const struct {
        const char *key;
        json_t *value;
    } fields[] = {
        {"alpha_pattern", json_object()},
        {"auto_mapping", json_null()},
        {"base_model_name_or_path", base},
        {"bias", json_string("none")},
        /* What PEFT's file ends up saying: it sets the flag module by module, true at a
         * Conv1D (GPT-2's blocks), false at a Linear, and lm_head comes last. */
        {"fan_in_fan_out", json_boolean(lora->model->config.type == MODEL_TYPE_GPT2 && lora->state->head_module < 0)},
        {"inference_mode", json_true()},
        {"init_lora_weights", json_true()},
        {"layers_pattern", json_null()},
        {"layers_to_transform", json_null()},
        {"lora_alpha", alpha_json(c->alpha)},
        {"lora_dropout", short_real(c->dropout)},
        {"modules_to_save", head ? json_pack("[s, s]", "classifier", "score") : json_null()},
        {"peft_type", json_string("LORA")},
        {"r", json_integer(c->rank)},
        {"rank_pattern", json_object()},
        {"revision", json_null()},
        {"target_modules", targets_json(lora)},
        {"task_type", json_string(head ? "SEQ_CLS" : "CAUSAL_LM")},
        {"use_dora", json_false()},
        {"use_rslora", json_boolean(c->use_rslora)},
    };
    json_t *root = json_object();
    bool ok = root != NULL;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (ok) ok = fields[i].value && json_object_set_new(root, fields[i].key, fields[i].value) == 0;
        else json_decref(fields[i].value);
    }
    if (!ok) {
        json_decref(root);
        return error_set(err, SMELT_ENOMEM, "%s: cannot build the adapter config (out of memory, or "
                         "base_model_name_or_path is not UTF-8)", path);
    }
    int rc = json_save_atomic(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9), path, err);
    json_decref(root);
    return rc;
}
