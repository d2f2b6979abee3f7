/* The job spec: one JSON document, validated field by field before anything loads.
 * docs/job-spec.md is the reference; keep the two in step. */
#include "trainer/trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

#define TRY(expr)                 \
    do {                          \
        int rc_ = (expr);         \
        if (rc_) return rc_;      \
    } while (0)

/* A section's prefix for messages: "spec.json: hyperparameters". */
static void section(char *dst, size_t n, const char *where, const char *name) {
    snprintf(dst, n, "%s: %s", where, name);
}

static int copy_string(char *dst, size_t cap, const char *src, const char *where,
                       const char *field, struct smelt_error *err) {
    size_t len = strlen(src);
    if (len >= cap)
        return error_set(err, SMELT_EINVAL, "%s.%s: longer than %zu bytes", where, field, cap - 1);
    memcpy(dst, src, len + 1);
    return SMELT_OK;
}

/* A string field into a fixed buffer; "" when absent and not required. */
static int string_field(const json_t *obj, const char *key, bool required, char *dst, size_t cap,
                        const char *where, struct smelt_error *err) {
    const char *s = NULL;
    TRY(json_field_string(obj, key, required, "", &s, where, err));
    if (required && !*s) return error_set(err, SMELT_EINVAL, "%s.%s: must not be empty", where, key);
    return copy_string(dst, cap, s, where, key, err);
}

/* An optional object member: NULL when absent or null, SMELT_EINVAL when not an object. */
static int object_field(const json_t *root, const char *key, const json_t **out,
                        const char *where, struct smelt_error *err) {
    const json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_object(v)) return error_set(err, SMELT_EINVAL, "%s: %s: expected an object", where, key);
    *out = v;
    return SMELT_OK;
}

static const json_t *empty_object(void) {
    static json_t *empty; /* one shared empty object; never freed (process lifetime) */
    if (!empty) empty = json_object();
    return empty;
}

static int parse_data(const json_t *obj, const char *where, struct job_spec *s,
                      struct smelt_error *err) {
    static const char *const keys[] = {"train", "validation", "validation_fraction", "max_seq_len",
                                       "truncation", "loss_on", "add_bos", "shuffle", NULL};
    char w[256];
    section(w, sizeof w, where, "data");
    TRY(json_check_keys(obj, keys, w, err));
    TRY(string_field(obj, "train", true, s->data.train, sizeof s->data.train, w, err));
    TRY(string_field(obj, "validation", false, s->data.validation, sizeof s->data.validation, w, err));
    TRY(json_field_double(obj, "validation_fraction", false, 0.0, 0.0, 0.5,
                          &s->data.validation_fraction, w, err));
    if (s->data.validation[0] && s->data.validation_fraction > 0)
        return error_set(err, SMELT_EINVAL, "%s.validation_fraction: give a validation file or a fraction, not both", w);
    TRY(json_field_int(obj, "max_seq_len", false, 0, 2, 1 << 24, &s->data.max_seq_len, w, err));
    const char *name;
    TRY(json_field_string(obj, "truncation", false, "error", &name, w, err));
    if (dataset_truncation_from_name(name, &s->data.truncation, err))
        return error_wrap(err, "%s.truncation", w);
    TRY(json_field_string(obj, "loss_on", false, "completion", &name, w, err));
    if (dataset_loss_on_from_name(name, &s->data.loss_on, err)) return error_wrap(err, "%s.loss_on", w);
    TRY(json_field_bool(obj, "add_bos", false, true, &s->data.add_bos, w, err));
    TRY(json_field_bool(obj, "shuffle", false, true, &s->data.shuffle, w, err));
    return SMELT_OK;
}

static int parse_hyperparameters(const json_t *obj, const char *where, struct job_spec *s,
                                 struct smelt_error *err) {
    static const char *const keys[] = {"epochs", "max_steps", "batch_size", "batch_tokens",
                                       "grad_accum", "learning_rate", "lr_schedule",
                                       "warmup_steps", "min_lr_ratio", "weight_decay", "beta1",
                                       "beta2", "eps", "max_grad_norm", "recompute", NULL};
    char w[256];
    section(w, sizeof w, where, "hyperparameters");
    TRY(json_check_keys(obj, keys, w, err));
    TRY(json_field_int(obj, "epochs", false, 1, 1, 1000, &s->hp.epochs, w, err));
    TRY(json_field_int(obj, "max_steps", false, 0, 0, INT64_C(1) << 40, &s->hp.max_steps, w, err));
    TRY(json_field_int(obj, "batch_size", false, 8, 1, 65536, &s->hp.batch_size, w, err));
    TRY(json_field_int(obj, "batch_tokens", false, 0, 0, INT64_C(1) << 30, &s->hp.batch_tokens, w, err));
    TRY(json_field_int(obj, "grad_accum", false, 1, 1, 4096, &s->hp.grad_accum, w, err));
    TRY(json_field_double(obj, "learning_rate", false, 1e-4, 0.0, 10.0, &s->hp.learning_rate, w, err));
    if (!(s->hp.learning_rate > 0))
        return error_set(err, SMELT_EINVAL, "%s.learning_rate: must be in (0, 10], got %g", w, s->hp.learning_rate);
    const char *name;
    TRY(json_field_string(obj, "lr_schedule", false, "cosine", &name, w, err));
    if (lr_schedule_from_name(name, &s->hp.lr_schedule, err)) return error_wrap(err, "%s.lr_schedule", w);
    TRY(json_field_int(obj, "warmup_steps", false, 0, 0, INT64_C(1) << 40, &s->hp.warmup_steps, w, err));
    TRY(json_field_double(obj, "min_lr_ratio", false, 0.0, 0.0, 1.0, &s->hp.min_lr_ratio, w, err));
    TRY(json_field_double(obj, "weight_decay", false, 0.0, 0.0, 1.0, &s->hp.weight_decay, w, err));
    TRY(json_field_double(obj, "beta1", false, 0.9, 0.0, 0.999999, &s->hp.beta1, w, err));
    TRY(json_field_double(obj, "beta2", false, 0.999, 0.0, 0.999999999, &s->hp.beta2, w, err));
    TRY(json_field_double(obj, "eps", false, 1e-8, 1e-30, 1.0, &s->hp.eps, w, err));
    TRY(json_field_double(obj, "max_grad_norm", false, 1.0, 0.0, 1e9, &s->hp.max_grad_norm, w, err));
    TRY(json_field_bool(obj, "recompute", false, false, &s->hp.recompute, w, err));
    return SMELT_OK;
}

static int parse_eval(const json_t *obj, const char *where, struct job_spec *s,
                      struct smelt_error *err) {
    static const char *const keys[] = {"every_steps", "accuracy_examples", "max_new_tokens", NULL};
    char w[256];
    section(w, sizeof w, where, "eval");
    TRY(json_check_keys(obj, keys, w, err));
    TRY(json_field_int(obj, "every_steps", false, 0, 0, INT64_C(1) << 40, &s->eval.every_steps, w, err));
    TRY(json_field_int(obj, "accuracy_examples", false, 0, 0, 1000000, &s->eval.accuracy_examples, w, err));
    TRY(json_field_int(obj, "max_new_tokens", false, 64, 1, 1 << 20, &s->eval.max_new_tokens, w, err));
    return SMELT_OK;
}

static int parse_checkpoint(const json_t *obj, const char *where, struct job_spec *s,
                            struct smelt_error *err) {
    static const char *const keys[] = {"every_steps", "keep_last", NULL};
    char w[256];
    section(w, sizeof w, where, "checkpoint");
    TRY(json_check_keys(obj, keys, w, err));
    TRY(json_field_int(obj, "every_steps", false, 0, 0, INT64_C(1) << 40, &s->checkpoint.every_steps, w, err));
    TRY(json_field_int(obj, "keep_last", false, 0, 0, 1000000, &s->checkpoint.keep_last, w, err));
    return SMELT_OK;
}

int job_spec_from_json(const void *json, const char *where, struct job_spec *s,
                       struct smelt_error *err) {
    static const char *const keys[] = {"type", "model", "model_init", "tokenizer", "chat_template",
                                       "data", "hyperparameters", "lora", "eval", "checkpoint",
                                       "output_dir", "save_merged", "save_dtype", "seed",
                                       "backend", "log_every_steps", NULL};
    const json_t *root = json;
    memset(s, 0, sizeof *s);
    if (!json_is_object(root)) return error_set(err, SMELT_EINVAL, "%s: the spec must be a JSON object", where);
    TRY(json_check_keys(root, keys, where, err));
    const char *name;
    TRY(json_field_string(root, "type", true, NULL, &name, where, err));
    if (strcmp(name, "sft") != 0)
        return error_set(err, SMELT_EINVAL, "%s: type: \"%s\" is not a job type this trainer runs (sft)", where, name);
    s->type = JOB_SFT;
    TRY(string_field(root, "model", true, s->model, sizeof s->model, where, err));
    TRY(json_field_string(root, "model_init", false, "pretrained", &name, where, err));
    if (strcmp(name, "random") == 0) s->model_init_random = true;
    else if (strcmp(name, "pretrained") != 0)
        return error_set(err, SMELT_EINVAL, "%s: model_init: expected \"pretrained\" or \"random\", got \"%s\"", where, name);
    TRY(string_field(root, "tokenizer", false, s->tokenizer, sizeof s->tokenizer, where, err));
    TRY(string_field(root, "chat_template", false, s->chat_template, sizeof s->chat_template, where, err));
    if (s->chat_template[0]) {
        enum chat_template_kind kind;
        if (chat_template_from_name(s->chat_template, &kind, err))
            return error_wrap(err, "%s: chat_template", where);
    }

    const json_t *obj;
    TRY(object_field(root, "data", &obj, where, err));
    if (!obj) return error_set(err, SMELT_EINVAL, "%s: data: missing (needs at least data.train)", where);
    TRY(parse_data(obj, where, s, err));
    TRY(object_field(root, "hyperparameters", &obj, where, err));
    TRY(parse_hyperparameters(obj ? obj : empty_object(), where, s, err));
    if (s->hp.batch_tokens > 0 && s->data.max_seq_len > s->hp.batch_tokens)
        return error_set(err, SMELT_EINVAL, "%s: hyperparameters.batch_tokens: %lld is below data.max_seq_len %lld",
                         where, (long long)s->hp.batch_tokens, (long long)s->data.max_seq_len);
    TRY(object_field(root, "lora", &obj, where, err));
    if (obj) {
        char lw[256];
        section(lw, sizeof lw, where, "lora");
        TRY(lora_config_from_json(obj, lw, &s->lora, err));
        s->has_lora = true;
        if (s->model_init_random)
            return error_set(err, SMELT_EINVAL, "%s: lora: a LoRA job needs a pretrained base on disk (model_init is \"random\")", where);
    }
    TRY(object_field(root, "eval", &obj, where, err));
    TRY(parse_eval(obj ? obj : empty_object(), where, s, err));
    TRY(object_field(root, "checkpoint", &obj, where, err));
    TRY(parse_checkpoint(obj ? obj : empty_object(), where, s, err));

    TRY(string_field(root, "output_dir", true, s->output_dir, sizeof s->output_dir, where, err));
    TRY(json_field_bool(root, "save_merged", false, false, &s->save_merged, where, err));
    if (s->save_merged && !s->has_lora)
        return error_set(err, SMELT_EINVAL, "%s: save_merged: only a LoRA job has an adapter to merge", where);
    TRY(json_field_string(root, "save_dtype", false, "f32", &name, where, err));
    if (strcmp(name, "bf16") == 0) s->save_bf16 = true;
    else if (strcmp(name, "f32") != 0)
        return error_set(err, SMELT_EINVAL, "%s: save_dtype: expected \"f32\" or \"bf16\", got \"%s\"", where, name);
    int64_t seed;
    TRY(json_field_int(root, "seed", false, 0, 0, INT64_MAX, &seed, where, err));
    s->seed = (uint64_t)seed;
    TRY(json_field_string(root, "backend", false, "cpu", &name, where, err));
    if (backend_from_name(name, &s->backend, err)) return error_wrap(err, "%s: backend", where);
    TRY(json_field_int(root, "log_every_steps", false, 1, 1, INT64_C(1) << 40, &s->log_every_steps, where, err));
    return SMELT_OK;
}

int job_spec_load(const char *path, struct job_spec *out, struct smelt_error *err) {
    json_t *root;
    TRY(json_load_path(path, &root, err));
    int rc = job_spec_from_json(root, path, out, err);
    json_decref(root);
    return rc;
}

/* ---- back to JSON ---- */

static int set(json_t *obj, const char *key, json_t *value) {
    return value ? json_object_set_new(obj, key, value) : -1;
}

static json_t *string_or_null(const char *s) { return *s ? json_string(s) : json_null(); }

int job_spec_to_json(const struct job_spec *s, void **out, struct smelt_error *err) {
    json_t *root = json_object(), *data = json_object(), *hp = json_object(), *ev = json_object(),
           *ck = json_object();
    int bad = !root || !data || !hp || !ev || !ck;
    bad |= set(root, "type", json_string("sft"));
    bad |= set(root, "model", json_string(s->model));
    bad |= set(root, "model_init", json_string(s->model_init_random ? "random" : "pretrained"));
    bad |= set(root, "tokenizer", string_or_null(s->tokenizer));
    bad |= set(root, "chat_template", string_or_null(s->chat_template));
    bad |= set(data, "train", json_string(s->data.train));
    bad |= set(data, "validation", string_or_null(s->data.validation));
    bad |= set(data, "validation_fraction", json_real(s->data.validation_fraction));
    bad |= set(data, "max_seq_len", s->data.max_seq_len ? json_integer(s->data.max_seq_len) : json_null());
    bad |= set(data, "truncation", json_string(dataset_truncation_name(s->data.truncation)));
    bad |= set(data, "loss_on", json_string(dataset_loss_on_name(s->data.loss_on)));
    bad |= set(data, "add_bos", json_boolean(s->data.add_bos));
    bad |= set(data, "shuffle", json_boolean(s->data.shuffle));
    bad |= set(hp, "epochs", json_integer(s->hp.epochs));
    bad |= set(hp, "max_steps", json_integer(s->hp.max_steps));
    bad |= set(hp, "batch_size", json_integer(s->hp.batch_size));
    bad |= set(hp, "batch_tokens", json_integer(s->hp.batch_tokens));
    bad |= set(hp, "grad_accum", json_integer(s->hp.grad_accum));
    bad |= set(hp, "learning_rate", json_real(s->hp.learning_rate));
    bad |= set(hp, "lr_schedule", json_string(lr_schedule_name(s->hp.lr_schedule)));
    bad |= set(hp, "warmup_steps", json_integer(s->hp.warmup_steps));
    bad |= set(hp, "min_lr_ratio", json_real(s->hp.min_lr_ratio));
    bad |= set(hp, "weight_decay", json_real(s->hp.weight_decay));
    bad |= set(hp, "beta1", json_real(s->hp.beta1));
    bad |= set(hp, "beta2", json_real(s->hp.beta2));
    bad |= set(hp, "eps", json_real(s->hp.eps));
    bad |= set(hp, "max_grad_norm", json_real(s->hp.max_grad_norm));
    bad |= set(hp, "recompute", json_boolean(s->hp.recompute));
    if (s->has_lora) {
        json_t *lora = json_object(), *targets = json_array();
        bad |= !lora || !targets;
        bad |= set(lora, "rank", json_integer(s->lora.rank));
        bad |= set(lora, "alpha", json_real(s->lora.alpha));
        bad |= set(lora, "dropout", json_real(s->lora.dropout));
        bad |= set(lora, "use_rslora", json_boolean(s->lora.use_rslora));
        for (int i = 0; i < s->lora.n_targets; i++)
            bad |= json_array_append_new(targets, json_string(s->lora.targets[i]));
        if (s->lora.n_targets) bad |= set(lora, "target_modules", targets);
        else json_decref(targets);
        bad |= set(root, "lora", lora);
    } else {
        bad |= set(root, "lora", json_null());
    }
    bad |= set(ev, "every_steps", json_integer(s->eval.every_steps));
    bad |= set(ev, "accuracy_examples", json_integer(s->eval.accuracy_examples));
    bad |= set(ev, "max_new_tokens", json_integer(s->eval.max_new_tokens));
    bad |= set(ck, "every_steps", json_integer(s->checkpoint.every_steps));
    bad |= set(ck, "keep_last", json_integer(s->checkpoint.keep_last));
    bad |= set(root, "data", data);
    bad |= set(root, "hyperparameters", hp);
    bad |= set(root, "eval", ev);
    bad |= set(root, "checkpoint", ck);
    bad |= set(root, "output_dir", json_string(s->output_dir));
    bad |= set(root, "save_merged", json_boolean(s->save_merged));
    bad |= set(root, "save_dtype", json_string(s->save_bf16 ? "bf16" : "f32"));
    bad |= set(root, "seed", json_integer((json_int_t)s->seed));
    bad |= set(root, "backend", json_string(backend_name(s->backend)));
    bad |= set(root, "log_every_steps", json_integer(s->log_every_steps));
    if (bad) {
        json_decref(root);
        return error_set(err, SMELT_ENOMEM, "job_spec_to_json: out of memory");
    }
    *out = root;
    return SMELT_OK;
}
