/* The job spec: one JSON document, validated field by field before anything loads.
 * docs/job-spec.md is the reference; keep the two in step. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"

/* A section's prefix for messages: "spec.json: hyperparameters". */
static void section(char *dst, size_t n, const char *where, const char *name) {
    snprintf(dst, n, "%s: %s", where, name);
}

/* A name that a lookup (backend_from_name, ...) refused: the message says where, err
 * names the field. sep joins where and key as the message has them ("." in a section). */
static int refused_name(struct smelt_error *err, int rc, const char *where, const char *sep,
                        const char *key) {
    error_wrap(err, rc, "%s%s%s", where, sep, key);
    return error_in_field(err, rc, key);
}

static int copy_string(char *dst, size_t cap, const char *src, const char *where,
                       const char *field, struct smelt_error *err) {
    size_t len = strlen(src);
    if (len >= cap)
        return error_set_field(err, SMELT_EINVAL, field, "%s.%s: longer than %zu bytes", where, field, cap - 1);
    memcpy(dst, src, len + 1);
    return SMELT_OK;
}

/* A string field into a fixed buffer; "" when absent and not required. */
static int string_field(const json_t *obj, const char *key, bool required, char *dst, size_t cap,
                        const char *where, struct smelt_error *err) {
    const char *s = NULL;
    TRY(json_field_string(obj, key, required, "", &s, where, err));
    if (required && !*s) return error_set_field(err, SMELT_EINVAL, key, "%s.%s: must not be empty", where, key);
    return copy_string(dst, cap, s, where, key, err);
}

/* An optional object member: NULL when absent or null, SMELT_EINVAL when not an object. */
static int object_field(const json_t *root, const char *key, const json_t **out,
                        const char *where, struct smelt_error *err) {
    const json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_object(v))
        return error_set_field(err, SMELT_EINVAL, key, "%s: %s: expected an object", where, key);
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
        return error_set_field(err, SMELT_EINVAL, "validation_fraction",
                               "%s.validation_fraction: give a validation file or a fraction, not both", w);
    TRY(json_field_int(obj, "max_seq_len", false, 0, 2, 1 << 24, &s->data.max_seq_len, w, err));
    const char *name;
    TRY(json_field_string(obj, "truncation", false, "error", &name, w, err));
    TRY(refused_name(err, dataset_truncation_from_name(name, &s->data.truncation, err), w, ".", "truncation"));
    TRY(json_field_string(obj, "loss_on", false, "completion", &name, w, err));
    TRY(refused_name(err, dataset_loss_on_from_name(name, &s->data.loss_on, err), w, ".", "loss_on"));
    TRY(json_field_bool(obj, "add_bos", false, true, &s->data.add_bos, w, err));
    TRY(json_field_bool(obj, "shuffle", false, true, &s->data.shuffle, w, err));
    return SMELT_OK;
}

/* ---- spec.hyperparameters: the table ---- */

static int lr_schedule_parse(const char *name, void *value, struct smelt_error *err) {
    return lr_schedule_from_name(name, value, err);
}

static const char *lr_schedule_format(const void *value) {
    return lr_schedule_name(*(const enum lr_schedule_kind *)value);
}

static int pref_loss_parse(const char *name, void *value, struct smelt_error *err) {
    return pref_loss_from_name(name, value, err);
}

static const char *pref_loss_format(const void *value) {
    return pref_loss_name(*(const enum pref_loss_type *)value);
}

/* offsetof a hyperparameter, refusing at compile time a member whose type is not T (the
 * table's kind decides how the member is read and written). */
#define HP_AT(member, T) \
    (offsetof(struct job_spec, hp.member) + 0 * sizeof(_Generic(((struct job_spec *)0)->hp.member, T: 1)))
#define HP_INT(member, d, lo, hi) \
    {.name = #member, .kind = JOB_FIELD_INT, .offset = HP_AT(member, int64_t), .def = d, .min = lo, .max = hi}
#define HP_NUMBER(member, d, lo, hi) \
    {.name = #member, .kind = JOB_FIELD_NUMBER, .offset = HP_AT(member, double), .def = d, .min = lo, .max = hi}
#define HP_BOOL(member, d) \
    {.name = #member, .kind = JOB_FIELD_BOOL, .offset = HP_AT(member, bool), .def = d, .min = 0, .max = 1}

/* The order is the order of checking: the first bad field is the one reported. */
const struct job_hp_field JOB_HP_FIELDS[] = {
    HP_INT(epochs, 1, 1, 1000),
    HP_INT(max_steps, 0, 0, 0x1p40),
    HP_INT(batch_size, 8, 1, 65536),
    HP_INT(batch_tokens, 0, 0, 0x1p30),
    HP_INT(grad_accum, 1, 1, 4096),
    {.name = "learning_rate", .kind = JOB_FIELD_NUMBER, .offset = HP_AT(learning_rate, double), .def = 1e-4,
     .min = 0.0, .max = 10.0, .min_excluded = true},
    {.name = "lr_schedule", .kind = JOB_FIELD_NAME, .offset = HP_AT(lr_schedule, enum lr_schedule_kind),
     .def_name = "cosine", .from_name = lr_schedule_parse, .to_name = lr_schedule_format},
    HP_INT(warmup_steps, 0, 0, 0x1p40),
    HP_NUMBER(min_lr_ratio, 0.0, 0.0, 1.0),
    HP_NUMBER(weight_decay, 0.0, 0.0, 1.0),
    HP_NUMBER(beta1, 0.9, 0.0, 0.999999),
    HP_NUMBER(beta2, 0.999, 0.0, 0.999999999),
    HP_NUMBER(eps, 1e-8, 1e-30, 1.0),
    HP_NUMBER(max_grad_norm, 1.0, 0.0, 1e9),
    HP_BOOL(recompute, false),
    /* DPO. label_smoothing's table range is [0, 0.5]; a DPO job refuses 0.5 itself
     * (pref_config_check: the loss's own rules). */
    {.name = "beta", .kind = JOB_FIELD_NUMBER, .offset = HP_AT(beta, double), .def = 0.1, .min = 0.0,
     .max = 1000.0, .min_excluded = true},
    {.name = "loss_type", .kind = JOB_FIELD_NAME, .offset = HP_AT(loss_type, enum pref_loss_type),
     .def_name = "sigmoid", .from_name = pref_loss_parse, .to_name = pref_loss_format},
    HP_NUMBER(label_smoothing, 0.0, 0.0, 0.5),
    HP_NUMBER(rpo_alpha, 0.0, 0.0, 1000.0),
    HP_NUMBER(simpo_gamma, 0.5, -1000.0, 1000.0),
    HP_BOOL(precompute_ref, true),
    /* Reward model (TRL RewardTrainer; 0 = off, TRL's None). */
    HP_NUMBER(center_rewards_coefficient, 0.0, 0.0, 1000.0),
    HP_INT(zero_stage, 1, 0, 3),
    HP_NUMBER(comm_timeout_s, TRAINER_COMM_TIMEOUT_MS / 1000.0, 0.1, 604800.0),
};
#define N_HP_FIELDS ((int)(sizeof JOB_HP_FIELDS / sizeof JOB_HP_FIELDS[0]))
const int JOB_N_HP_FIELDS = N_HP_FIELDS;

const struct job_hp_field *job_field_in(const struct job_hp_field *fields, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(fields[i].name, name) == 0) return &fields[i];
    return NULL;
}

const struct job_hp_field *job_hp_field_find(const char *name) { return job_field_in(JOB_HP_FIELDS, N_HP_FIELDS, name); }

static int parse_number(const json_t *obj, const struct job_hp_field *f, double *value, const char *w,
                        struct smelt_error *err) {
    TRY(json_field_double(obj, f->name, false, f->def, f->min, f->max, value, w, err));
    if (f->min_excluded && !(*value > f->min))
        return error_set_field(err, SMELT_EINVAL, f->name, "%s.%s: must be in (%g, %g], got %g", w, f->name,
                               f->min, f->max, *value);
    return SMELT_OK;
}

static int parse_hp_field(const json_t *obj, const struct job_hp_field *f, struct job_spec *s,
                          const char *w, struct smelt_error *err) {
    void *value = (char *)s + f->offset;
    const char *name;
    switch (f->kind) {
    case JOB_FIELD_INT:
        return json_field_int(obj, f->name, false, (int64_t)f->def, (int64_t)f->min, (int64_t)f->max, value, w,
                              err);
    case JOB_FIELD_NUMBER: return parse_number(obj, f, value, w, err);
    case JOB_FIELD_BOOL: return json_field_bool(obj, f->name, false, f->def != 0, value, w, err);
    case JOB_FIELD_NAME:
        TRY(json_field_string(obj, f->name, false, f->def_name, &name, w, err));
        return refused_name(err, f->from_name(name, value, err), w, ".", f->name);
    }
    SMELT_ASSERT(!"a hyperparameter of unknown kind");
    return SMELT_EINVAL;
}

int job_parse_fields(const json_t *obj, const struct job_hp_field *fields, int n, const char *const *extra_keys,
                     const char *w, struct job_spec *s, struct smelt_error *err) {
    if (!json_is_object(obj)) return error_set(err, SMELT_EINVAL, "%s: expected a JSON object", w);
    const char *unknown = NULL;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        bool known = job_field_in(fields, n, key) != NULL;
        for (int i = 0; extra_keys && extra_keys[i] && !known; i++) known = strcmp(extra_keys[i], key) == 0;
        if (!known) {
            unknown = key;
            break;
        }
    }
    if (unknown) return error_set_field(err, SMELT_EINVAL, unknown, "%s: unknown field '%s'", w, unknown);
    for (int i = 0; i < n; i++) TRY(parse_hp_field(obj, &fields[i], s, w, err));
    return SMELT_OK;
}

static int parse_hyperparameters(const json_t *obj, const char *where, struct job_spec *s,
                                 struct smelt_error *err) {
    char w[256];
    section(w, sizeof w, where, "hyperparameters");
    return job_parse_fields(obj, JOB_HP_FIELDS, N_HP_FIELDS, NULL, w, s, err);
}

json_t *job_field_json(const struct job_hp_field *f, const struct job_spec *s) {
    const void *value = (const char *)s + f->offset;
    switch (f->kind) {
    case JOB_FIELD_INT: return json_integer(*(const int64_t *)value);
    case JOB_FIELD_NUMBER: return json_real(*(const double *)value);
    case JOB_FIELD_BOOL: return json_boolean(*(const bool *)value);
    case JOB_FIELD_NAME: return json_string(f->to_name(value));
    }
    return NULL;
}

/* ---- the other sections ---- */

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

static const char *const JOB_TYPE_NAMES[] = {[JOB_SFT] = "sft", [JOB_DPO] = "dpo", [JOB_REWARD] = "reward_model",
                                             [JOB_GRPO] = "grpo", [JOB_PPO] = "ppo"};

const char *job_type_name(enum job_type type) { return JOB_TYPE_NAMES[type]; }

/* type, model, model_init, tokenizer, chat_template. */
static int parse_model(const json_t *root, const char *where, struct job_spec *s, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(root, "type", true, NULL, &name, where, err));
    size_t t = 0;
    while (t < sizeof JOB_TYPE_NAMES / sizeof *JOB_TYPE_NAMES && strcmp(name, JOB_TYPE_NAMES[t]) != 0) t++;
    if (t == sizeof JOB_TYPE_NAMES / sizeof *JOB_TYPE_NAMES)
        return error_set_field(err, SMELT_EINVAL, "type",
                               "%s: type: \"%s\" is not a job type this trainer runs (sft, dpo, reward_model, grpo, "
                               "ppo)", where, name);
    s->type = (enum job_type)t;
    TRY(string_field(root, "model", true, s->model, sizeof s->model, where, err));
    TRY(json_field_string(root, "model_init", false, "pretrained", &name, where, err));
    if (strcmp(name, "random") == 0) s->model_init_random = true;
    else if (strcmp(name, "pretrained") != 0)
        return error_set_field(err, SMELT_EINVAL, "model_init",
                               "%s: model_init: expected \"pretrained\" or \"random\", got \"%s\"", where, name);
    TRY(string_field(root, "tokenizer", false, s->tokenizer, sizeof s->tokenizer, where, err));
    TRY(string_field(root, "chat_template", false, s->chat_template, sizeof s->chat_template, where, err));
    if (!s->chat_template[0]) return SMELT_OK;
    enum chat_template_kind kind;
    return refused_name(err, chat_template_from_name(s->chat_template, &kind, err), where, ": ", "chat_template");
}

/* An optional section parsed by parse (an absent one as {}); errors name the section. */
static int parse_section(const json_t *root, const char *key, const char *where, struct job_spec *s,
                         int (*parse)(const json_t *, const char *, struct job_spec *, struct smelt_error *),
                         struct smelt_error *err) {
    const json_t *obj;
    TRY(object_field(root, key, &obj, where, err));
    return error_in_field(err, parse(obj ? obj : empty_object(), where, s, err), key);
}

static int parse_lora(const json_t *root, const char *where, struct job_spec *s, struct smelt_error *err) {
    const json_t *obj;
    TRY(object_field(root, "lora", &obj, where, err));
    if (!obj) return SMELT_OK;
    char lw[256];
    section(lw, sizeof lw, where, "lora");
    TRY(error_in_field(err, lora_config_from_json(obj, lw, &s->lora, err), "lora"));
    s->has_lora = true;
    if (s->model_init_random)
        return error_set_field(err, SMELT_EINVAL, "lora",
                               "%s: lora: a LoRA job needs a pretrained base on disk (model_init is \"random\")",
                               where);
    return SMELT_OK;
}

void job_pref_config(const struct job_spec *s, struct pref_config *out) {
    *out = (struct pref_config){.type = s->hp.loss_type, .beta = s->hp.beta,
                                .label_smoothing = s->hp.label_smoothing, .rpo_alpha = s->hp.rpo_alpha,
                                .simpo_gamma = s->hp.simpo_gamma};
}

/* What a DPO job alone asks of its hyperparameters: the loss's own rules, and a
 * reference it can compute. Per-batch reference logprobs need the reference's weights
 * beside the policy's: a LoRA job has them (its base), a full fine-tune would need a
 * second copy of the model, which smelt does not keep. */
static int check_dpo(const struct job_spec *s, const char *where, struct smelt_error *err) {
    if (s->type != JOB_DPO) return SMELT_OK;
    struct pref_config c;
    job_pref_config(s, &c);
    int rc = pref_config_check(&c, err);
    if (rc) {
        error_wrap(err, rc, "%s: hyperparameters", where);
        return error_in_field(err, rc, "hyperparameters");
    }
    if (!s->hp.precompute_ref && !s->has_lora && pref_loss_needs_reference(c.type))
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.precompute_ref",
                               "%s: hyperparameters.precompute_ref: false (the reference recomputed every batch) "
                               "needs the reference's weights beside the policy's: only a LoRA job has them (its "
                               "base); a full fine-tune precomputes them (true)", where);
    return SMELT_OK;
}

/* data, hyperparameters, lora, eval, checkpoint. */
static int parse_sections(const json_t *root, const char *where, struct job_spec *s, struct smelt_error *err) {
    const json_t *obj;
    TRY(object_field(root, "data", &obj, where, err));
    if (!obj)
        return error_set_field(err, SMELT_EINVAL, "data", "%s: data: missing (needs at least data.train)", where);
    TRY(error_in_field(err, parse_data(obj, where, s, err), "data"));
    TRY(parse_section(root, "hyperparameters", where, s, parse_hyperparameters, err));
    if (s->hp.batch_tokens > 0 && s->data.max_seq_len > s->hp.batch_tokens)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.batch_tokens",
                               "%s: hyperparameters.batch_tokens: %lld is below data.max_seq_len %lld", where,
                               (long long)s->hp.batch_tokens, (long long)s->data.max_seq_len);
    TRY(parse_section(root, "rl", where, s, job_parse_rl, err));
    if (job_type_is_rl(s->type) && s->hp.max_steps > 0)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.max_steps",
                               "%s: hyperparameters.max_steps: a %s job counts iterations: set rl.max_iterations",
                               where, job_type_name(s->type));
    TRY(parse_lora(root, where, s, err));
    TRY(check_dpo(s, where, err));
    TRY(parse_section(root, "eval", where, s, parse_eval, err));
    return parse_section(root, "checkpoint", where, s, parse_checkpoint, err);
}

/* output_dir, save_merged, save_dtype, seed, backend, log_every_steps. */
static int parse_run(const json_t *root, const char *where, struct job_spec *s, struct smelt_error *err) {
    TRY(string_field(root, "output_dir", true, s->output_dir, sizeof s->output_dir, where, err));
    TRY(json_field_bool(root, "save_merged", false, false, &s->save_merged, where, err));
    if (s->save_merged && !s->has_lora)
        return error_set_field(err, SMELT_EINVAL, "save_merged",
                               "%s: save_merged: only a LoRA job has an adapter to merge", where);
    const char *name;
    TRY(json_field_string(root, "save_dtype", false, "f32", &name, where, err));
    if (strcmp(name, "bf16") == 0) s->save_bf16 = true;
    else if (strcmp(name, "f32") != 0)
        return error_set_field(err, SMELT_EINVAL, "save_dtype", "%s: save_dtype: expected \"f32\" or \"bf16\", got \"%s\"",
                               where, name);
    int64_t seed;
    TRY(json_field_int(root, "seed", false, 0, 0, INT64_MAX, &seed, where, err));
    s->seed = (uint64_t)seed;
    TRY(json_field_string(root, "backend", false, "cpu", &name, where, err));
    TRY(refused_name(err, backend_from_name(name, &s->backend, err), where, ": ", "backend"));
    return json_field_int(root, "log_every_steps", false, 1, 1, INT64_C(1) << 40, &s->log_every_steps, where, err);
}

int job_spec_from_json(const void *json, const char *where, struct job_spec *s,
                       struct smelt_error *err) {
    static const char *const keys[] = {"type", "model", "model_init", "tokenizer", "chat_template",
                                       "data", "hyperparameters", "rl", "lora", "eval", "checkpoint",
                                       "output_dir", "save_merged", "save_dtype", "seed",
                                       "backend", "log_every_steps", NULL};
    const json_t *root = json;
    memset(s, 0, sizeof *s);
    if (!json_is_object(root)) return error_set(err, SMELT_EINVAL, "%s: the spec must be a JSON object", where);
    TRY(json_check_keys(root, keys, where, err));
    TRY(parse_model(root, where, s, err));
    TRY(parse_sections(root, where, s, err));
    return parse_run(root, where, s, err);
}

int job_spec_load(const char *path, struct job_spec *out, struct smelt_error *err) {
    json_t *root;
    TRY(json_load_path(path, &root, err));
    int rc = job_spec_from_json(root, path, out, err);
    json_decref(root);
    return rc;
}

int trainer_comm_timeout_ms(const struct job_spec *spec) {
    double ms = spec->hp.comm_timeout_s * 1000.0; /* the table bounds it to [100, 604,800,000] */
    return ms < 1 ? 1 : ms > INT32_MAX ? INT32_MAX : (int)ms;
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
    bad |= set(root, "type", json_string(JOB_TYPE_NAMES[s->type]));
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
    for (int i = 0; i < N_HP_FIELDS; i++)
        bad |= set(hp, JOB_HP_FIELDS[i].name, job_field_json(&JOB_HP_FIELDS[i], s));
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
    if (job_type_is_rl(s->type)) {
        json_t *rl;
        if (job_rl_to_json(s, &rl, err)) {
            json_decref(root);
            return SMELT_ENOMEM;
        }
        bad |= set(root, "rl", rl);
    }
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
