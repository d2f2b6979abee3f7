/* Jobs: an OpenAI fine-tuning create request becomes a trainer job spec (docs/api.md
 * lists how each field maps), the job row, and its event stream. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "server/server_internal.h"
#include "trainer/trainer.h"

/* The request's own limits (the trainer's fields have theirs in trainer/job_spec.c). */
#define JOBS_MAX_SUFFIX 40
#define JOBS_MAX_SEED INT64_C(2147483647)
#define JOBS_RANDOM_SEED_HEX_DIGITS 7 /* 28 random bits: always within JOBS_MAX_SEED */
#define JOBS_MAX_METADATA_KEYS 16
#define JOBS_MAX_METADATA_KEY_BYTES 64
#define JOBS_MAX_METADATA_VALUE_BYTES 512
#define JOBS_MIN_PRIORITY (-100)
#define JOBS_MAX_PRIORITY 100
#define JOBS_DEFAULT_RETRIES 1
#define JOBS_MAX_RETRIES 100
#define JOBS_MAX_RUNTIME_SECONDS INT64_C(31536000) /* one year */
#define JOBS_MAX_DEVICES 64
#define JOBS_ONE_PROCESS_DEVICES 1 /* a job asking for nothing: one trainer rank */

bool jobs_status_final(const char *status) {
    return strcmp(status, "succeeded") == 0 || strcmp(status, "failed") == 0 ||
           strcmp(status, "cancelled") == 0;
}

/* SSE streams of events: woken once the event's row is visible to their connections. */
static void wake_streams(void *http) {
    http_streams_wake(http);
}

int jobs_event(struct server *s, struct store_conn *conn, const char *job_id, const char *level,
               const char *type, json_t *data, struct smelt_error *err, const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    int rc = store_exec(conn, err,
                        "INSERT INTO events (job_id, created_at, level, type, message, data) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        "sisssj", job_id, server_now(), level, type, message, data);
    struct http_server *http = atomic_load(&s->http);
    if (rc >= 0 && http) store_after_commit(conn, wake_streams, http);
    return rc < 0 ? rc : 0;
}

/* ---- the create request ----
 *
 * plan_job turns a request into the trainer's job spec in named steps. A refusal is
 * SMELT_EINVAL with err->field naming the request's field (the reply's `param`); any
 * other code is the server's own failure (500). */

static bool is_auto(const json_t *v) {
    return !v || json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0);
}

/* obj[key] = value, taking the reference (also on failure, as jansson does). */
static int set_member(json_t *obj, const char *key, json_t *value, struct smelt_error *err) {
    if (!value || json_object_set_new(obj, key, value) != 0)
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", key);
    return SMELT_OK;
}

/* OpenAI's hyperparameter names and the trainer's field each one sets, in the spec's
 * hyperparameters, rl or eval section. "auto" (or null) leaves the field out, so the
 * trainer's default applies; a multiplier scales the trainer's default (an integer field
 * takes the product rounded). Every other name is the trainer's own and goes through as
 * is. */
enum hp_section { IN_HYPERPARAMETERS, IN_RL, IN_EVAL };

struct openai_hp {
    const char *name, *field;
    bool multiplies_default;
    enum hp_section section;
};

#define OPENAI_COMMON_HPS \
    {"n_epochs", "epochs", false, IN_HYPERPARAMETERS}, {"batch_size", "batch_size", false, IN_HYPERPARAMETERS}, \
    {"learning_rate_multiplier", "learning_rate", true, IN_HYPERPARAMETERS}

static const struct openai_hp COMMON_HPS[] = {OPENAI_COMMON_HPS};
static const struct openai_hp DPO_HPS[] = {{"beta", "beta", false, IN_HYPERPARAMETERS}, OPENAI_COMMON_HPS};
/* OpenAI's reinforcement method on the GRPO loop (docs/api.md): batch_size prompts per
 * iteration; compute_multiplier scales the samples per prompt ("rollouts per step");
 * eval_interval is the optimizer steps between evaluations; eval_samples the held-out
 * prompts each evaluation generates for (one greedy completion each). reasoning_effort
 * is read apart (reasoning_effort_ok). */
static const struct openai_hp REINFORCEMENT_HPS[] = {
    OPENAI_COMMON_HPS,
    {"compute_multiplier", "num_generations", true, IN_RL},
    {"eval_interval", "every_steps", false, IN_EVAL},
    {"eval_samples", "accuracy_examples", false, IN_EVAL},
};
/* A grpo job's group: at least 2 samples per prompt (trainer/job_spec_rl.c, check_grpo). */
#define JOBS_MIN_GROUP 2

/* A method smelt runs: the trainer's job type, the rows its files must hold, and the
 * OpenAI hyperparameter names it takes (the job object shows them resolved). */
struct job_method {
    const char *type;      /* method.type, also the member of method holding its settings */
    const char *spec_type; /* the job spec's type */
    const char *data_kind; /* dataset_kind_name of its files' rows (the files table's kind) */
    const char *rows;      /* the same, for messages */
    const char *head;      /* what its model's head does (GET /v1/models' head) */
    const struct openai_hp *hps;
    int n_hps;
    /* An RL method: the member of its settings holding the reward, hyperparameters of
     * the spec's rl section going there. "reward" is a reward spec as it is; "grader" one
     * OpenAI grader, run as the reward spec {"grader": G}. NULL: not an RL method. */
    const char *reward_key;
};

#define METHOD_HPS(t) (t), (int)(sizeof(t) / sizeof(t)[0])
static const struct job_method METHODS[] = {
    {"supervised", "sft", "sft", "SFT rows (messages or prompt/completion)", "lm", METHOD_HPS(COMMON_HPS), NULL},
    {"dpo", "dpo", "preference", "preference rows (prompt, chosen, rejected)", "lm", METHOD_HPS(DPO_HPS), NULL},
    {"reward_model", "reward_model", "preference", "preference rows (prompt, chosen, rejected, optional margin)",
     "reward", METHOD_HPS(COMMON_HPS), NULL},
    {"grpo", "grpo", "prompts", "prompts rows (prompt, optional answer and metadata)", "lm", METHOD_HPS(COMMON_HPS),
     "reward"},
    {"ppo", "ppo", "prompts", "prompts rows (prompt, optional answer and metadata)", "lm", METHOD_HPS(COMMON_HPS),
     "reward"},
    {"reinforcement", "grpo", "prompts", "prompts rows (OpenAI's: messages ending with a user turn, plus any "
     "fields the grader reads)", "lm", METHOD_HPS(REINFORCEMENT_HPS), "grader"},
};
#define SUPERVISED (&METHODS[0]) /* a request without method; the legacy top-level hyperparameters' */

static const struct job_method *method_named(const char *type) {
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (strcmp(METHODS[i].type, type) == 0) return &METHODS[i];
    return NULL;
}

const char *jobs_method_head(const char *type) {
    const struct job_method *m = method_named(type);
    return m ? m->head : NULL;
}

static bool takes_grader(const struct job_method *m) { return m->reward_key && strcmp(m->reward_key, "grader") == 0; }

static const struct openai_hp *openai_hp_named(const struct job_method *m, const char *name) {
    for (int i = 0; i < m->n_hps; i++)
        if (strcmp(m->hps[i].name, name) == 0) return &m->hps[i];
    return NULL;
}

/* The OpenAI name through which the request set a trainer field of a section, or NULL. */
static const struct openai_hp *openai_hp_for(const struct job_method *m, const json_t *hp, enum hp_section section,
                                             const char *field) {
    for (int i = 0; i < m->n_hps; i++)
        if (m->hps[i].section == section && strcmp(m->hps[i].field, field) == 0 &&
            !is_auto(json_object_get(hp, m->hps[i].name)))
            return &m->hps[i];
    return NULL;
}

/* The request's method and where its hyperparameters are: the object (NULL when none)
 * and its path. */
struct hp_source {
    const struct job_method *method;
    const json_t *hp;
    const json_t *reward; /* an RL method's method.<type>.<reward_key> (NULL when not given) */
    const json_t *eval;   /* the request's own eval section (NULL when not given) */
    char where[64]; /* "hyperparameters" or "method.<type>.hyperparameters" */
};

/* The rl section's field called name, or NULL. */
static const struct job_hp_field *rl_field_named(const char *name) {
    for (int i = 0; i < JOB_N_RL_FIELDS; i++)
        if (strcmp(JOB_RL_FIELDS[i].name, name) == 0) return &JOB_RL_FIELDS[i];
    return NULL;
}

/* An RL method's hyperparameter that belongs to the spec's rl section (its table wins
 * where both tables have the name: beta and loss_type mean the RL ones there). */
static bool is_rl_field(const struct job_method *m, const char *name) {
    return m->reward_key && rl_field_named(name) != NULL;
}

/* The table entry of a field an OpenAI name maps onto (eval's fields have none). */
static const struct job_hp_field *mapped_field(const struct openai_hp *o) {
    switch (o->section) {
    case IN_HYPERPARAMETERS: return job_hp_field_find(o->field);
    case IN_RL: return rl_field_named(o->field);
    case IN_EVAL: break;
    }
    return NULL;
}

/* The trainer's default times the request's multiplier; an integer field (the samples per
 * prompt) takes the product rounded and must stay a group of JOBS_MIN_GROUP or more. */
static int multiplied(const struct hp_source *src, const struct openai_hp *o, const json_t *v, json_t **out,
                      struct smelt_error *err) {
    if (!json_is_number(v))
        return error_set_field(err, SMELT_EINVAL, o->name, "%s.%s: \"auto\" or a number is expected", src->where,
                               o->name);
    const struct job_hp_field *f = mapped_field(o);
    SMELT_ASSERT(f && (f->kind == JOB_FIELD_NUMBER || f->kind == JOB_FIELD_INT));
    double m = json_number_value(v), x = f->def * m;
    if (f->kind == JOB_FIELD_NUMBER) { /* the trainer judges the product's range */
        *out = json_real(x);
        return SMELT_OK;
    }
    double lo = JOBS_MIN_GROUP, hi = f->max;
    if (!(x >= lo - 0.5 && x < hi + 0.5))
        return error_set_field(err, SMELT_EINVAL, o->name, "%s.%s: %g gives %s = round(%g x %g) = %.0f; it must be "
                               "in [%g, %g]: give a value in [%g, %g)", src->where, o->name, m, o->field, f->def, m,
                               round(x), lo, hi, (lo - 0.5) / f->def, (hi + 0.5) / f->def);
    *out = json_integer((json_int_t)llround(x));
    return SMELT_OK;
}

/* Errors name fields relative to src->where (error_in_field adds it). to: the spec's
 * section the field is in. */
static int map_openai_hp(const struct hp_source *src, const struct openai_hp *o, json_t *to,
                         struct smelt_error *err) {
    json_t *v = json_object_get(src->hp, o->name);
    if (is_auto(v)) return SMELT_OK;
    if (o->section == IN_EVAL && json_object_get(src->eval, o->field))
        return error_set_field(err, SMELT_EINVAL, o->name, "%s.%s: give it or eval.%s, not both", src->where,
                               o->name, o->field);
    if (o->section != IN_EVAL && strcmp(o->name, o->field) != 0 && json_object_get(src->hp, o->field))
        return error_set_field(err, SMELT_EINVAL, o->name, "%s.%s: give %s or %s, not both", src->where,
                               o->name, o->field, o->name);
    if (!o->multiplies_default) return set_member(to, o->field, json_incref(v), err);
    json_t *value = NULL;
    TRY(multiplied(src, o, v, &value, err));
    return set_member(to, o->field, value, err);
}

/* OpenAI's reasoning_effort: smelt's models answer at once, with no reasoning phase whose
 * length could be set, so only "default" (or "auto", null) is honoured; the others are
 * refused by name rather than ignored. */
static int reasoning_effort_ok(const struct hp_source *src, const json_t *v, struct smelt_error *err) {
    if (is_auto(v) || (json_is_string(v) && strcmp(json_string_value(v), "default") == 0)) return SMELT_OK;
    return error_set_field(err, SMELT_EINVAL, "reasoning_effort", "%s.reasoning_effort: only \"default\" is "
                           "possible: smelt's models are not reasoning models (they answer without a reasoning "
                           "phase whose effort could be set)", src->where);
}

/* The spec's section for a hyperparameter: OpenAI's name's, or, for the trainer's own
 * names, rl for an RL method's rl fields, else hyperparameters. */
static int section_for(json_t *spec, const struct openai_hp *o, bool rl_name, json_t **to, struct smelt_error *err) {
    const char *key = o ? (o->section == IN_RL ? "rl" : o->section == IN_EVAL ? "eval" : "hyperparameters")
                        : rl_name ? "rl" : "hyperparameters";
    *to = json_object_get(spec, key);
    if (*to) return SMELT_OK;
    TRY(set_member(spec, key, json_object(), err));
    *to = json_object_get(spec, key);
    return SMELT_OK;
}

/* The request's hyperparameters into the spec: OpenAI's names mapped, the rest copied for
 * the trainer to judge (its parser is the one definition of names, ranges and
 * defaults). */
static int map_hyperparameters(const struct hp_source *src, json_t *spec, struct smelt_error *err) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)src->hp, key, value) {
        int rc;
        if (takes_grader(src->method) && strcmp(key, "reasoning_effort") == 0) {
            rc = reasoning_effort_ok(src, value, err);
        } else if (strcmp(src->method->spec_type, "ppo") == 0 && strcmp(key, "critic_model") == 0) {
            rc = SMELT_OK; /* resolve_critic's */
        } else {
            const struct openai_hp *o = openai_hp_named(src->method, key);
            json_t *to = NULL;
            rc = section_for(spec, o, is_rl_field(src->method, key), &to, err);
            if (!rc) rc = o ? map_openai_hp(src, o, to, err) : set_member(to, key, json_incref(value), err);
        }
        TRY(error_in_field(err, rc, src->where));
    }
    return SMELT_OK;
}

/* A trainer field's path ("hyperparameters.epochs") as the request's ("method.supervised.
 * hyperparameters.n_epochs"): the one place the API knows the two namings differ. The
 * spec's type comes from method.type; an RL method's reward from its reward_key (the
 * reward spec itself, or the grader inside {"grader": G}); the other sections (data,
 * lora, eval, ...) have the same paths in both, but for fields an OpenAI name set. */
static void request_param(const char *spec_field, const struct hp_source *src, char *param, size_t cap) {
    const struct job_method *m = src->method;
    if (strcmp(spec_field, "type") == 0) {
        snprintf(param, cap, "method.type");
        return;
    }
    if (m->reward_key && strncmp(spec_field, "rl.reward", 9) == 0 &&
        (spec_field[9] == 0 || spec_field[9] == '.' || spec_field[9] == '[')) {
        const char *rest = spec_field + 9; /* "", ".verifiers[0]...", ".grader.graders..." */
        if (takes_grader(m) && strncmp(rest, ".grader", 7) == 0) rest += 7;
        snprintf(param, cap, "method.%.16s.%s%.96s", m->type, m->reward_key, rest);
        return;
    }
    const char *name = NULL;
    enum hp_section section = IN_HYPERPARAMETERS;
    if (m->reward_key && strncmp(spec_field, "rl.", 3) == 0) {
        name = spec_field + 3;
        section = IN_RL;
    } else if (strncmp(spec_field, "eval.", 5) == 0) {
        name = spec_field + 5;
        section = IN_EVAL;
    } else if (strncmp(spec_field, "hyperparameters", 15) == 0 && (spec_field[15] == '.' || spec_field[15] == 0)) {
        name = spec_field[15] ? spec_field + 16 : "";
    }
    const struct openai_hp *o = name ? openai_hp_for(m, src->hp, section, name) : NULL;
    if (!name || (section == IN_EVAL && !o)) {
        snprintf(param, cap, "%s", spec_field);
        return;
    }
    if (section == IN_RL) { /* an RL method's hyperparameters are always the method's */
        snprintf(param, cap, "method.%.16s.hyperparameters.%.64s", m->type, o ? o->name : name);
        return;
    }
    snprintf(param, cap, "%.48s%s%.64s", src->where, *name ? "." : "", o ? o->name : name);
}

/* The first row of a file that cannot be read as the method's kind, as "; read as <kind>
 * rows, line N: field: why" (nothing when none is found). The upload decided the file's
 * kind by its first row; OpenAI checks a file against the job's method at creation, so
 * the refusal names the row, as OpenAI's does. */
static void wrong_kind_detail(const char *path, const struct job_method *m, char *out, size_t cap) {
    out[0] = 0;
    enum dataset_kind kind;
    struct smelt_error e = {0};
    if (dataset_kind_from_name(m->data_kind, &kind, &e) != SMELT_OK) return;
    struct dataset_report *r = calloc(1, sizeof *r);
    if (!r) return;
    if (dataset_validate_file(path, kind, r, &e) == SMELT_EFORMAT && r->n_issues > 0)
        snprintf(out, cap, "; read as %s rows, line %lld: %s%s%s", m->data_kind, (long long)r->issues[0].line,
                 r->issues[0].field, r->issues[0].field[0] ? ": " : "", r->issues[0].message);
    free(r);
}

/* The path of an uploaded file the method can train on: processed (its report says why
 * not) and of the method's kind (files.kind, from the upload's validation). */
static int file_path(struct store_conn *conn, const char *project, const struct job_method *m, const char *param,
                     const char *id, char *path, size_t cap, struct smelt_error *err) {
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, err,
                             "SELECT path, status, kind, report AS report__json FROM files "
                             "WHERE id = ? AND project_id = ? AND deleted = 0", "ss", id, project);
    if (rc == SMELT_ENOTFOUND) return error_set_field(err, SMELT_EINVAL, param, "%s: no such file: %s", param, id);
    if (rc) return rc;
    if (strcmp(json_string_value(json_object_get(row, "status")), "processed") != 0) {
        json_t *first = json_array_get(json_object_get(json_object_get(row, "report"), "errors"), 0);
        const char *field = json_string_value(json_object_get(first, "field")) ?: "";
        rc = error_set_field(err, SMELT_EINVAL, param, "%s: %s failed validation: line %lld: %s%s%s", param, id,
                             (long long)json_integer_value(json_object_get(first, "line")), field,
                             *field ? ": " : "",
                             json_string_value(json_object_get(first, "message")) ?: "invalid");
    } else if (strcmp(json_string_value(json_object_get(row, "kind")) ?: "", m->data_kind) != 0) {
        char detail[400];
        wrong_kind_detail(json_string_value(json_object_get(row, "path")), m, detail, sizeof detail);
        rc = error_set_field(err, SMELT_EINVAL, param, "%s: %s holds %s rows; a %s job needs %s%s", param, id,
                             json_string_value(json_object_get(row, "kind")) ?: "unknown", m->type, m->rows, detail);
    } else {
        snprintf(path, cap, "%s", json_string_value(json_object_get(row, "path")));
    }
    json_decref(row);
    return rc;
}

/* Copies the smelt sections that map one to one onto the spec (data, eval, checkpoint). */
static int copy_section(const json_t *request, const char *key, json_t *spec, struct smelt_error *err) {
    json_t *v = json_object_get(request, key);
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_object(v)) return error_set_field(err, SMELT_EINVAL, key, "%s: an object is expected", key);
    json_t *target = json_object_get(spec, key);
    if (target) return json_object_update(target, v) ? error_set(err, SMELT_ENOMEM, "%s: out of memory", key) : 0;
    return set_member(spec, key, json_incref(v), err);
}

static int int_field(const json_t *request, const char *key, int64_t def, int64_t min, int64_t max,
                     int64_t *out, struct smelt_error *err) {
    json_t *v = json_object_get(request, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return SMELT_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return error_set_field(err, SMELT_EINVAL, key, "%s: an integer in [%lld, %lld] is expected", key,
                               (long long)min, (long long)max);
    *out = json_integer_value(v);
    return SMELT_OK;
}

struct job_plan {
    json_t *spec;          /* the trainer's job spec */
    json_t *method;        /* as the job object shows it (resolved hyperparameters) */
    json_t *shown_hp;
    const char *model, *training_file, *validation_file, *suffix;
    json_t *metadata;
    int64_t seed, priority, devices, max_retries, max_runtime;
    int64_t rollout_devices;   /* resources.rollout.devices; -1: not given */
    int64_t trainer_devices;   /* resources.trainer.devices: the trainer's ranks; -1: not given */
    bool devices_given;        /* resources.devices was in the request */
};

static int check_request_keys(const json_t *request, struct smelt_error *err) {
    static const char *const keys[] = {
        "model", "training_file", "validation_file", "hyperparameters", "method", "suffix", "seed",
        "metadata", "integrations", "lora", "resources", "priority", "max_retries",
        "max_runtime_seconds", "model_init", "data", "eval", "checkpoint", "save_merged",
        "save_dtype", "backend", "chat_template", NULL};
    const char *key = json_unknown_key(request, keys);
    if (!key) return SMELT_OK;
    const char *name = json_key_name(key);
    return error_set_field(err, SMELT_EINVAL, name, "%s: unknown parameter", name);
}

/* model, training_file, validation_file: the ids (resolve_inputs finds them). */
static int read_ids(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    json_t *v = json_object_get(request, "model");
    if (!json_is_string(v) || !json_string_length(v))
        return error_set_field(err, SMELT_EINVAL, "model", "model: a model id is required (GET /v1/models lists them)");
    p->model = json_string_value(v);
    v = json_object_get(request, "training_file");
    if (!json_is_string(v) || !json_string_length(v))
        return error_set_field(err, SMELT_EINVAL, "training_file", "training_file: a file id is required");
    p->training_file = json_string_value(v);
    v = json_object_get(request, "validation_file");
    if (v && !json_is_null(v) && (!json_is_string(v) || !json_string_length(v)))
        return error_set_field(err, SMELT_EINVAL, "validation_file", "validation_file: a file id or null is expected");
    p->validation_file = json_is_string(v) ? json_string_value(v) : NULL;
    return SMELT_OK;
}

static bool suffix_char_ok(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

static int read_suffix(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    json_t *v = json_object_get(request, "suffix");
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > JOBS_MAX_SUFFIX)
        return error_set_field(err, SMELT_EINVAL, "suffix", "suffix: a string of 1 to %d characters is expected",
                               JOBS_MAX_SUFFIX);
    for (const char *c = json_string_value(v); *c; c++)
        if (!suffix_char_ok(*c))
            return error_set_field(err, SMELT_EINVAL, "suffix",
                                   "suffix: only letters, digits, '-', '_' and '.' are allowed");
    p->suffix = json_string_value(v);
    return SMELT_OK;
}

static int read_seed(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    TRY(int_field(request, "seed", -1, 0, JOBS_MAX_SEED, &p->seed, err));
    if (p->seed >= 0) return SMELT_OK;
    char id[HTTP_ID_BYTES];
    server_new_id("", id, sizeof id); /* random hex */
    id[JOBS_RANDOM_SEED_HEX_DIGITS] = 0;
    p->seed = strtoll(id, NULL, 16);
    return SMELT_OK;
}

static int read_metadata(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    json_t *v = json_object_get(request, "metadata");
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_object(v) || json_object_size(v) > JOBS_MAX_METADATA_KEYS)
        return error_set_field(err, SMELT_EINVAL, "metadata",
                               "metadata: an object of at most %d string values is expected", JOBS_MAX_METADATA_KEYS);
    const char *key;
    json_t *mv;
    json_object_foreach(v, key, mv) {
        if (strlen(key) > JOBS_MAX_METADATA_KEY_BYTES || !json_is_string(mv) ||
            json_string_length(mv) > JOBS_MAX_METADATA_VALUE_BYTES)
            return error_set_field(err, SMELT_EINVAL, "metadata", "metadata.%.64s: keys up to %d and string values "
                                   "up to %d characters", key, JOBS_MAX_METADATA_KEY_BYTES,
                                   JOBS_MAX_METADATA_VALUE_BYTES);
    }
    p->metadata = v;
    return SMELT_OK;
}

static int check_integrations(const json_t *request, struct smelt_error *err) {
    json_t *v = json_object_get(request, "integrations");
    if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
        return error_set_field(err, SMELT_EINVAL, "integrations",
                               "integrations: not supported by smelt (use [] or leave it out)");
    return SMELT_OK;
}

/* resources: {"devices": N} (the job's devices, all on one agent) or, for an RL job,
 * {"trainer": {"devices": 1}, "rollout": {"devices": R}}: R rollout workers in the split
 * placement (each on a device of its own) beside the trainer, gang-allocated together. */
static int read_role(const json_t *resources, const char *role, int64_t min, int64_t max, int64_t *out,
                     struct smelt_error *err) {
    char field[48];
    snprintf(field, sizeof field, "resources.%s", role);
    json_t *v = json_object_get(resources, role);
    if (!json_is_object(v)) return error_set_field(err, SMELT_EINVAL, field, "%s: an object is expected", field);
    static const char *const keys[] = {"devices", NULL};
    const char *key = json_unknown_key(v, keys);
    if (key) return error_set_field(err, SMELT_EINVAL, field, "%s.%.64s: unknown field (devices)", field, key);
    return error_in_field(err, int_field(v, "devices", min, min, max, out, err), field);
}

static int read_resources(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    p->devices = JOBS_ONE_PROCESS_DEVICES;
    p->rollout_devices = p->trainer_devices = -1;
    json_t *v = json_object_get(request, "resources");
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_object(v)) return error_set_field(err, SMELT_EINVAL, "resources", "resources: an object is expected");
    static const char *const keys[] = {"devices", "trainer", "rollout", NULL};
    const char *key = json_unknown_key(v, keys);
    if (key)
        return error_set_field(err, SMELT_EINVAL, "resources",
                               "resources.%.64s: unknown field (devices, trainer, rollout)", key);
    p->devices_given = json_object_get(v, "devices") != NULL;
    TRY(error_in_field(err, int_field(v, "devices", 1, 1, JOBS_MAX_DEVICES, &p->devices, err), "resources"));
    if (json_object_get(v, "trainer"))
        TRY(read_role(v, "trainer", 1, JOBS_MAX_DEVICES, &p->trainer_devices, err));
    if (json_object_get(v, "rollout"))
        TRY(read_role(v, "rollout", 1, JOBS_MAX_DEVICES - JOBS_ONE_PROCESS_DEVICES, &p->rollout_devices, err));
    return SMELT_OK;
}

/* The devices a job takes, once its spec is known: the trainer's ranks (one device each,
 * each rank taking a share of every step's micro-batches), then an RL job's rollout
 * workers in the split placement (one device each). A resources.devices the request gave
 * must agree. */
static int settle_devices(const struct job_spec *js, struct job_plan *p, struct smelt_error *err) {
    bool rl = job_type_is_rl(js->type);
    int64_t workers = rl && js->rl.placement == RL_PLACEMENT_SPLIT ? js->rl.rollout_workers : 0;
    int64_t ranks = p->trainer_devices > 0 ? p->trainer_devices
                    : p->devices_given     ? (p->devices - workers > 1 ? p->devices - workers : 1)
                                           : 1;
    if (!rl && ranks > js->hp.grad_accum)
        return error_set_field(err, SMELT_EINVAL, "resources.trainer.devices", "resources.trainer.devices: %lld "
                               "ranks share each step's micro-batches, but hyperparameters.grad_accum is %lld; "
                               "raise grad_accum to at least %lld (a multiple of the ranks keeps them equally busy)",
                               (long long)ranks, (long long)js->hp.grad_accum, (long long)ranks);
    if (ranks > 1 && js->backend != BACKEND_CPU)
        return error_set_field(err, SMELT_EINVAL, "resources.trainer.devices", "resources.trainer.devices: %lld ranks "
                               "need backend \"cpu\" in this version (their collectives are Gloo's, on host memory; "
                               "the NCCL transport is built but not yet used by the trainer)", (long long)ranks);
    if (rl && ranks > 1 && js->hp.zero_stage == 3)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.zero_stage", "hyperparameters.zero_stage: an RL "
                               "job on several trainer ranks runs at ZeRO stage 0, 1 or 2 in this version");
    int64_t want = ranks + workers;
    if (p->devices_given && p->devices != want)
        return error_set_field(err, SMELT_EINVAL, "resources.devices",
                               "resources.devices: the job runs on %lld device(s) (%lld trainer rank%s%s), not %lld",
                               (long long)want, (long long)ranks, ranks > 1 ? "s" : "",
                               workers ? " and one per rollout worker" : "", (long long)p->devices);
    p->devices = want;
    return SMELT_OK;
}

/* priority, max_retries, max_runtime_seconds, resources. */
static int read_scheduling(const json_t *request, struct job_plan *p, struct smelt_error *err) {
    TRY(int_field(request, "priority", 0, JOBS_MIN_PRIORITY, JOBS_MAX_PRIORITY, &p->priority, err));
    TRY(int_field(request, "max_retries", JOBS_DEFAULT_RETRIES, 0, JOBS_MAX_RETRIES, &p->max_retries, err));
    TRY(int_field(request, "max_runtime_seconds", 0, 0, JOBS_MAX_RUNTIME_SECONDS, &p->max_runtime, err));
    return read_resources(request, p, err);
}

/* method.type: a method smelt runs. */
static int read_method_type(const json_t *method, const struct job_method **out, struct smelt_error *err) {
    json_t *v = json_object_get(method, "type");
    if (!json_is_string(v))
        return error_set_field(err, SMELT_EINVAL, "method.type",
                               "method.type: one of supervised, dpo, reinforcement, ppo, grpo, reward_model");
    const char *type = json_string_value(v);
    if (strcmp(type, "tinker") == 0)
        return error_set_field(err, SMELT_EINVAL, "method.type", "method.type: 'tinker' jobs are Tinker sessions, "
                               "made through the Tinker API under /api/v1/ (docs/tinker.md), not created here");
    if (!(*out = method_named(type)))
        return error_set_field(err, SMELT_EINVAL, "method.type", "method.type: '%.40s' is not a method "
                               "(supervised, dpo, reinforcement, ppo, grpo, reward_model)", type);
    return SMELT_OK;
}

/* method.<type>.hyperparameters (NULL when not given); the method's settings are in the
 * member named after its type, as OpenAI has them. */
static int method_hyperparameters(const json_t *method, struct hp_source *src, const json_t **hp,
                                  struct smelt_error *err) {
    *hp = NULL;
    if (!json_is_object(method)) return error_set_field(err, SMELT_EINVAL, "method", "method: an object is expected");
    TRY(read_method_type(method, &src->method, err));
    const char *type = src->method->type;
    const char *const method_keys[] = {"type", type, NULL};
    const char *const settings_keys[] = {"hyperparameters", src->method->reward_key, NULL};
    char field[64];
    snprintf(field, sizeof field, "method.%s", type);
    const char *key = json_unknown_key(method, method_keys);
    if (key) {
        char unknown[SMELT_ERROR_FIELD_BYTES];
        snprintf(unknown, sizeof unknown, "method.%.64s", json_key_name(key));
        return error_set_field(err, SMELT_EINVAL, unknown, "%s: unknown field (a %s job's settings go in %s)",
                               unknown, type, field);
    }
    json_t *settings = json_object_get(method, type);
    if (settings && !json_is_null(settings)) {
        if (!json_is_object(settings))
            return error_set_field(err, SMELT_EINVAL, field, "%s: an object is expected", field);
        if ((key = json_unknown_key(settings, settings_keys)))
            return error_set_field(err, SMELT_EINVAL, field, "%s.%.64s: unknown field", field, key);
        TRY(body_check_json(settings, field, err)); /* the document's JsonValue: numbers within 64 bits */
        json_t *v = json_object_get(settings, "hyperparameters");
        *hp = v && !json_is_null(v) ? v : NULL;
        v = src->method->reward_key ? json_object_get(settings, src->method->reward_key) : NULL;
        src->reward = v && !json_is_null(v) ? v : NULL;
    }
    /* OpenAI requires the grader; the trainer would name its reward spec instead. */
    if (takes_grader(src->method) && !src->reward)
        return error_set_field(err, SMELT_EINVAL, "method.reinforcement.grader", "method.reinforcement.grader: "
                               "required: the grader that scores each sample (OpenAI's grader object: "
                               "docs/rewards.md)");
    return SMELT_OK;
}

/* The method (supervised when none is given) and its hyperparameters: in
 * method.<type>.hyperparameters, or, for supervised jobs only, the legacy top level. */
static int find_hyperparameters(const json_t *request, struct hp_source *src, struct smelt_error *err) {
    const json_t *top = json_object_get(request, "hyperparameters"), *in_method = NULL;
    if (top && json_is_null(top)) top = NULL;
    src->method = SUPERVISED;
    const json_t *method = json_object_get(request, "method");
    if (method && !json_is_null(method)) TRY(method_hyperparameters(method, src, &in_method, err));
    const char *type = src->method->type;
    src->eval = json_object_get(request, "eval");
    if (top && in_method)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters", "hyperparameters: give them in "
                               "method.%s.hyperparameters or at the top level, not both", type);
    if (top && src->method != SUPERVISED)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters", "hyperparameters: the top level is the "
                               "legacy place of supervised jobs' hyperparameters; a %s job takes them in "
                               "method.%s.hyperparameters", type, type);
    src->hp = in_method ? in_method : top;
    if (in_method) snprintf(src->where, sizeof src->where, "method.%s.hyperparameters", type);
    else snprintf(src->where, sizeof src->where, "hyperparameters");
    if (src->hp && !json_is_object(src->hp))
        return error_set_field(err, SMELT_EINVAL, src->where, "%s: an object is expected", src->where);
    return SMELT_OK;
}

/* The model's and the files' paths on disk. */
struct job_inputs {
    char model[SERVER_PATH_BYTES], train[SERVER_PATH_BYTES], validation[SERVER_PATH_BYTES];
    char critic[SERVER_PATH_BYTES]; /* a ppo job's critic_model ("": none) */
};

/* A ppo job's hyperparameter critic_model names a model as `model` does (a reward-model
 * job's output, or a base model); the spec gets its directory, never a path from the
 * request. The trainer then checks it is a classifier of the policy's vocabulary. */
static int resolve_critic(struct server *s, struct store_conn *conn, const char *project,
                          const struct hp_source *src, struct job_inputs *in, struct smelt_error *err) {
    in->critic[0] = 0;
    json_t *v = json_object_get(src->hp, "critic_model");
    if (!v || json_is_null(v) || strcmp(src->method->spec_type, "ppo") != 0) return SMELT_OK;
    char field[96], kind[16];
    snprintf(field, sizeof field, "%s.critic_model", src->where);
    if (!json_is_string(v))
        return error_set_field(err, SMELT_EINVAL, field, "%s: a model name is expected (GET /v1/models)", field);
    int rc = models_resolve(s, conn, project, json_string_value(v), in->critic, sizeof in->critic, kind,
                            sizeof kind, err);
    if (rc == SMELT_ENOTFOUND)
        return error_set_field(err, SMELT_EINVAL, field, "%s: no such model: %.200s (GET /v1/models lists them)",
                               field, json_string_value(v));
    return rc;
}

static int resolve_inputs(struct server *s, struct store_conn *conn, const char *project,
                          const struct job_method *m, const struct job_plan *p, struct job_inputs *in,
                          struct smelt_error *err) {
    char kind[16];
    int rc = models_resolve(s, conn, project, p->model, in->model, sizeof in->model, kind, sizeof kind, err);
    if (rc == SMELT_ENOTFOUND)
        return error_set_field(err, SMELT_EINVAL, "model", "model: no such model: %s (GET /v1/models lists them)",
                               p->model);
    TRY(rc);
    TRY(file_path(conn, project, m, "training_file", p->training_file, in->train, sizeof in->train, err));
    in->validation[0] = 0;
    if (!p->validation_file) return SMELT_OK;
    return file_path(conn, project, m, "validation_file", p->validation_file, in->validation,
                     sizeof in->validation, err);
}

/* Files reach a job only as uploaded file ids (training_file, validation_file): a path in
 * the request would let a caller train on, and so read back through the model, any file
 * the server can read. */
static int refuse_data_paths(const json_t *request, struct smelt_error *err) {
    static const char *const paths[] = {"train", "validation"};
    json_t *data = json_object_get(request, "data");
    for (size_t i = 0; json_is_object(data) && i < sizeof paths / sizeof *paths; i++)
        if (json_object_get(data, paths[i])) {
            char field[32];
            snprintf(field, sizeof field, "data.%s", paths[i]);
            return error_set_field(err, SMELT_EINVAL, field, "%s: not accepted; upload the file and pass its id "
                                   "as %s_file", field, i == 0 ? "training" : "validation");
        }
    return SMELT_OK;
}

/* The smelt fields that are the trainer's own, copied into the spec as they are. */
static int copy_trainer_fields(const json_t *request, json_t *spec, struct smelt_error *err) {
    TRY(refuse_data_paths(request, err));
    TRY(copy_section(request, "data", spec, err));
    TRY(copy_section(request, "eval", spec, err));
    TRY(copy_section(request, "checkpoint", spec, err));
    static const char *const as_is[] = {"lora", "model_init", "save_merged", "save_dtype", "backend",
                                        "chat_template", NULL};
    for (int i = 0; as_is[i]; i++) {
        json_t *v = json_object_get(request, as_is[i]);
        if (v && !json_is_null(v)) TRY(set_member(spec, as_is[i], json_incref(v), err));
    }
    return SMELT_OK;
}

/* resources.rollout.devices: the split placement with that many workers, in the spec's
 * rl section (where the hyperparameters may say the same, never something else). */
static int place_rollout(const struct hp_source *src, const struct job_plan *p, json_t *rl, struct smelt_error *err) {
    if (p->rollout_devices < 0) return SMELT_OK;
    if (!rl)
        return error_set_field(err, SMELT_EINVAL, "resources.rollout", "resources.rollout: a %s job has no "
                               "rollout workers (only RL methods do)", src->method->type);
    json_t *placement = json_object_get(rl, "placement"), *workers = json_object_get(rl, "rollout_workers");
    if (placement && !(json_is_string(placement) && strcmp(json_string_value(placement), "split") == 0))
        return error_set_field(err, SMELT_EINVAL, "resources.rollout", "resources.rollout: rollout devices mean "
                               "the split placement; %s.placement says otherwise", src->where);
    if (workers && !(json_is_integer(workers) && json_integer_value(workers) == p->rollout_devices))
        return error_set_field(err, SMELT_EINVAL, "resources.rollout", "resources.rollout: %lld device(s) run "
                               "%lld rollout worker(s); %s.rollout_workers says otherwise",
                               (long long)p->rollout_devices, (long long)p->rollout_devices, src->where);
    TRY(set_member(rl, "placement", json_string("split"), err));
    return set_member(rl, "rollout_workers", json_integer(p->rollout_devices), err);
}

/* The reward_model graders of an RL method's reward get their model's directory, in the
 * spec's own copy of the reward (the request stays as it came). */
static int resolve_reward_models(struct server *s, struct store_conn *conn, const char *project,
                                 const struct hp_source *src, json_t *spec, struct smelt_error *err) {
    json_t *rl = json_object_get(spec, "rl");
    json_t *reward = json_deep_copy(json_object_get(rl, "reward"));
    if (!reward) return SMELT_OK; /* none given (the trainer names it), or out of memory (it fails there too) */
    TRY(set_member(rl, "reward", reward, err));
    char path[64];
    snprintf(path, sizeof path, "method.%.16s.%s", src->method->type,
             takes_grader(src->method) ? "grader" : "reward.grader");
    return jobs_resolve_reward_models(s, conn, project, json_object_get(reward, "grader"), path, err);
}

static int build_spec(const json_t *request, const struct job_inputs *in, const char *job_dir,
                      const struct hp_source *src, struct job_plan *p, struct smelt_error *err) {
    p->spec = json_pack("{s:s, s:s, s:{s:s}, s:{}, s:s, s:I, s:i}", "type", src->method->spec_type, "model",
                        in->model, "data", "train", in->train, "hyperparameters", "output_dir", job_dir,
                        "seed", (json_int_t)p->seed, "log_every_steps", 1);
    if (!p->spec) return error_set(err, SMELT_ENOMEM, "out of memory");
    if (in->validation[0])
        TRY(set_member(json_object_get(p->spec, "data"), "validation", json_string(in->validation), err));
    json_t *rl = NULL;
    if (src->method->reward_key) {
        TRY(set_member(p->spec, "rl", json_object(), err));
        rl = json_object_get(p->spec, "rl");
        if (src->reward) /* reinforcement: OpenAI's grader is the reward spec {"grader": G} */
            TRY(set_member(rl, "reward", takes_grader(src->method) ? json_pack("{s:O}", "grader", src->reward)
                                                                   : json_incref((json_t *)src->reward), err));
    }
    if (src->hp) TRY(map_hyperparameters(src, p->spec, err));
    if (in->critic[0]) TRY(set_member(rl, "critic_model", json_string(in->critic), err));
    TRY(place_rollout(src, p, rl, err));
    return copy_trainer_fields(request, p->spec, err);
}

/* One OpenAI hyperparameter's value as the parsed spec resolved it (a multiplier as the
 * factor of the trainer's default), or NULL when the trainer has no such numeric field:
 * the trainer accepted the spec, so it runs this method, and a table without the field is
 * a trainer and smeltd out of step. */
static json_t *resolved_hp(const struct openai_hp *o, const struct job_spec *js) {
    if (o->section == IN_EVAL)
        return strcmp(o->field, "every_steps") == 0         ? json_integer(js->eval.every_steps)
               : strcmp(o->field, "accuracy_examples") == 0 ? json_integer(js->eval.accuracy_examples)
                                                            : NULL;
    const struct job_hp_field *f = mapped_field(o);
    if (!f || (f->kind != JOB_FIELD_INT && f->kind != JOB_FIELD_NUMBER)) return NULL;
    const void *value = (const char *)js + f->offset;
    double x = f->kind == JOB_FIELD_INT ? (double)*(const int64_t *)value : *(const double *)value;
    if (o->multiplies_default) return json_real(x / f->def);
    return f->kind == JOB_FIELD_INT ? json_integer(*(const int64_t *)value) : json_real(x);
}

/* The job object's hyperparameters under OpenAI's names, resolved from the parsed spec:
 * {"type": T, T: {"hyperparameters": {...}}}, as OpenAI shows a job's method; an RL
 * method's reward (grpo) or grader (reinforcement) beside them, as the request gave it
 * (the spec keeps it so) less the model directories smeltd added. */
static int show_hyperparameters(const struct job_method *m, const struct job_spec *js, struct job_plan *p,
                                struct smelt_error *err) {
    p->shown_hp = json_object();
    if (!p->shown_hp) return error_set(err, SMELT_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_hps; i++) {
        const struct openai_hp *o = &m->hps[i];
        json_t *shown = resolved_hp(o, js);
        if (!shown)
            return error_set(err, SMELT_EUNSUPPORTED, "the trainer has no numeric field '%s' (for %s)", o->field,
                             o->name);
        TRY(set_member(p->shown_hp, o->name, shown, err));
    }
    if (takes_grader(m)) TRY(set_member(p->shown_hp, "reasoning_effort", json_string("default"), err));
    p->method = json_pack("{s:s, s:{s:O}}", "type", m->type, m->type, "hyperparameters", p->shown_hp);
    if (p->method && m->reward_key) { /* the reward as the request gave it */
        void *full = NULL;
        if (job_spec_to_json(js, &full, err)) return SMELT_ENOMEM;
        json_t *reward = json_object_get(json_object_get(full, "rl"), "reward");
        jobs_grader_shown(json_object_get(reward, "grader")); /* full is this function's: changed in place */
        json_object_set(json_object_get(p->method, m->type), m->reward_key,
                        takes_grader(m) ? json_object_get(reward, "grader") : reward);
        json_decref(full);
    }
    return p->method ? SMELT_OK : error_set(err, SMELT_ENOMEM, "out of memory");
}

/* The trainer's parser decides every field it owns; its errors name the field, which
 * becomes the request's path. */
static int check_spec(const struct hp_source *src, struct job_plan *p, struct smelt_error *err) {
    static const char where[] = "job";
    struct job_spec js;
    struct smelt_error spec_err = {0};
    int rc = job_spec_from_json(p->spec, where, &js, &spec_err);
    if (rc == SMELT_ENOMEM) return error_set(err, rc, "%s", spec_err.message);
    if (rc == SMELT_OK) {
        TRY(settle_devices(&js, p, err));
        return show_hyperparameters(src->method, &js, p, err);
    }
    const char *message = spec_err.message;
    if (strncmp(message, where, strlen(where)) == 0 && strncmp(message + strlen(where), ": ", 2) == 0)
        message += strlen(where) + 2;
    char param[SMELT_ERROR_FIELD_BYTES];
    request_param(spec_err.field, src, param, sizeof param);
    if (strcmp(param, spec_err.field) == 0 || !param[0])
        return error_set_field(err, SMELT_EINVAL, param, "%s", message);
    /* "rl.reward.grader.x: why" reads "method.reinforcement.grader.x: why": the request's
     * path in place of the spec's. */
    size_t n = strlen(spec_err.field);
    if (n && strncmp(message, spec_err.field, n) == 0 && strncmp(message + n, ": ", 2) == 0) message += n + 2;
    return error_set_field(err, SMELT_EINVAL, param, "%s: %s", param, message);
}

/* A job wanting more devices than the largest online agent has would hold the head of
 * the queue forever (gang allocation on one agent): refused while some agent is online
 * (with none online, nothing is known yet and the job waits). */
static int check_fits(struct store_conn *conn, const struct job_plan *p, struct smelt_error *err) {
    json_t *agents = NULL;
    struct smelt_error qerr = {0};
    if (store_query(conn, &agents, &qerr, "SELECT id, devices AS devices__json FROM agents WHERE status = 'online'",
                    "") != 0)
        return error_set(err, SMELT_EIO, "reading the agents: %s", qerr.message);
    size_t largest = 0, i;
    json_t *agent;
    json_array_foreach(agents, i, agent) {
        size_t n = json_array_size(json_object_get(agent, "devices"));
        if (n > largest) largest = n;
    }
    bool online = json_array_size(agents) > 0;
    json_decref(agents);
    if (!online || (int64_t)largest >= p->devices) return SMELT_OK;
    return error_set_field(err, SMELT_EINVAL, "resources", "resources: the job needs %lld devices on one agent "
                           "(the trainer%s); the largest online agent has %zu (smeltd/smelt-agent --cpu-slots N "
                           "offers more CPU slots; fewer rollout workers, or the colocated placement, need fewer)",
                           (long long)p->devices, p->devices > 1 ? " and one per rollout worker" : "", largest);
}

static int plan_job(struct server *s, struct store_conn *conn, const char *project, const json_t *request,
                    const char *job_dir, struct job_plan *p, struct smelt_error *err) {
    TRY(check_request_keys(request, err));
    TRY(read_ids(request, p, err));
    TRY(read_suffix(request, p, err));
    TRY(read_seed(request, p, err));
    TRY(read_metadata(request, p, err));
    TRY(check_integrations(request, err));
    TRY(read_scheduling(request, p, err));
    struct hp_source src = {0};
    TRY(find_hyperparameters(request, &src, err));
    struct job_inputs in;
    TRY(resolve_inputs(s, conn, project, src.method, p, &in, err));
    TRY(resolve_critic(s, conn, project, &src, &in, err));
    TRY(build_spec(request, &in, job_dir, &src, p, err));
    TRY(resolve_reward_models(s, conn, project, &src, p->spec, err));
    TRY(check_spec(&src, p, err));
    return check_fits(conn, p, err);
}

/* A refusal (400, `param` from err->field) or the server's own failure (500). */
static void reply_plan_error(struct http_response *res, const struct smelt_error *err) {
    bool refused = err->code == SMELT_EINVAL;
    if (!refused) log_error("job create failed: %s", err->message);
    http_reply_error(res, refused ? 400 : 500, refused && err->field[0] ? err->field : NULL,
                     refused ? "invalid_value" : "server_error", "%s", err->message);
}

static void plan_free(struct job_plan *p) {
    json_decref(p->spec);
    json_decref(p->method);
    json_decref(p->shown_hp);
}

int jobs_create(struct server *s, const char *project, json_t *request, const char *idempotency_key,
                const char *schedule_id, json_t **job_out, struct http_response *res) {
    *job_out = NULL;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return -1;
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (idempotency_key) {
        int rc = store_query_one(conn, &row, &err,
                                 "SELECT jobs.*, jobs.request AS request__json FROM idempotency JOIN jobs "
                                 "ON jobs.id = idempotency.job_id WHERE idempotency.project_id = ? "
                                 "AND idempotency.key = ?", "ss", project, idempotency_key);
        if (rc == 0) {
            store_release(s->store, conn);
            if (!json_equal(json_object_get(row, "request"), request)) {
                json_decref(row);
                http_reply_error(res, 409, "Idempotency-Key", "idempotency_key_reused",
                                 "Idempotency-Key was used for a different request");
                return -1;
            }
            *job_out = jobs_object(s, row);
            json_decref(row);
            return 0;
        }
        error_clear(&err);
    }

    char id[HTTP_ID_BYTES], job_dir[SERVER_PATH_BYTES];
    server_new_id("ftjob-", id, sizeof id);
    if (snprintf(job_dir, sizeof job_dir, "%s/%s", s->jobs_dir, id) >= (int)sizeof job_dir) {
        store_release(s->store, conn);
        http_reply_error(res, 500, NULL, "server_error", "the data directory path is too long");
        return -1;
    }
    struct job_plan plan = {0};
    if (plan_job(s, conn, project, request, job_dir, &plan, &err) != 0) {
        store_release(s->store, conn);
        plan_free(&plan);
        reply_plan_error(res, &err);
        return -1;
    }
    int64_t now = server_now();
    int rc = store_begin(conn, &err);
    if (rc == 0)
        rc = store_exec(conn, &err,
                        "INSERT INTO jobs (id, project_id, created_at, status, request, spec, model, method, "
                        "training_file, validation_file, suffix, seed, metadata, priority, devices_wanted, "
                        "max_retries, max_runtime_seconds, queued_at, schedule_id) VALUES "
                        "(?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        "ssijjsjsssijiiiiis", id, project, now, request, plan.spec, plan.model, plan.method,
                        plan.training_file, plan.validation_file, plan.suffix, plan.seed, plan.metadata,
                        plan.priority, plan.devices, plan.max_retries, plan.max_runtime, now, schedule_id);
    if (rc >= 0 && idempotency_key)
        rc = store_exec(conn, &err, "INSERT INTO idempotency (project_id, key, job_id, created_at) "
                        "VALUES (?, ?, ?, ?)", "sssi", project, idempotency_key, id, now);
    if (rc >= 0)
        rc = jobs_event(s, conn, id, "info", "message", NULL, &err, "Validated training file: %s",
                        plan.training_file);
    if (rc >= 0)
        rc = jobs_event(s, conn, id, "info", "message", NULL, &err, "Job queued");
    if (rc >= 0) rc = store_commit(conn, &err);
    plan_free(&plan);
    if (rc < 0) {
        store_rollback(conn);
        store_release(s->store, conn);
        /* A concurrent create with the same key won the race: answer with its job. */
        if (idempotency_key && strstr(err.message, "UNIQUE"))
            return jobs_create(s, project, request, idempotency_key, schedule_id, job_out, res);
        server_reply_failure(res, &err, NULL);
        return -1;
    }
    rc = store_query_one(conn, &row, &err, "SELECT * FROM jobs WHERE id = ?", "s", id);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return -1;
    }
    *job_out = jobs_object(s, row);
    json_decref(row);
    atomic_store(&s->kick, 1);
    return 0;
}

int jobs_validate(struct server *s, const char *project, json_t *request, struct http_response *res) {
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return -1;
    char dir[SERVER_PATH_BYTES + 32];
    snprintf(dir, sizeof dir, "%s/validate", s->jobs_dir);
    struct job_plan plan = {0};
    struct smelt_error err = {0};
    int rc = plan_job(s, conn, project, request, dir, &plan, &err);
    store_release(s->store, conn);
    plan_free(&plan);
    if (rc != 0) reply_plan_error(res, &err);
    return rc;
}

/* resources as a request gives them: the devices, and for an RL job in the split
 * placement the trainer's and the rollout workers' share. */
static json_t *resources_shown(json_t *row, json_t *spec) {
    json_t *devices = json_object_get(row, "devices_wanted");
    json_t *rl = json_object_get(spec, "rl");
    json_t *placement = json_object_get(rl, "placement");
    if (!placement || strcmp(json_string_value(placement) ?: "", "split") != 0)
        return json_pack("{s:O, s:{s:O}}", "devices", devices, "trainer", "devices", devices);
    json_int_t workers = json_integer_value(json_object_get(rl, "rollout_workers"));
    if (!workers) workers = 1;
    json_int_t ranks = json_integer_value(devices) - workers;
    return json_pack("{s:O, s:{s:I}, s:{s:I}}", "devices", devices, "trainer", "devices", ranks > 1 ? ranks : 1,
                     "rollout", "devices", workers);
}

static json_t *parse_text(json_t *row, const char *key) {
    const char *text = json_string_value(json_object_get(row, key));
    if (!text) return json_null();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    return v ? v : json_null();
}

json_t *jobs_object(struct server *s, json_t *row) {
    (void)s;
    json_t *method = parse_text(row, "method");
    const char *type = json_string_value(json_object_get(method, "type")) ?: "supervised";
    json_t *hp = json_object_get(json_object_get(method, type), "hyperparameters");
    json_t *spec = parse_text(row, "spec");
    json_t *o = json_pack(
        "{s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O, s:O?, s:O, s:O?, s:O, s:O, s:[], s:[], s:n}",
        "object", "fine_tuning.job", "id", json_object_get(row, "id"), "model", json_object_get(row, "model"),
        "created_at", json_object_get(row, "created_at"), "finished_at", json_object_get(row, "finished_at"),
        "fine_tuned_model", json_object_get(row, "fine_tuned_model"),
        "organization_id", json_object_get(row, "project_id"), "status", json_object_get(row, "status"),
        "training_file", json_object_get(row, "training_file"),
        "validation_file", json_object_get(row, "validation_file"),
        "seed", json_object_get(row, "seed"), "hyperparameters", hp,
        "trained_tokens", json_object_get(row, "trained_tokens"),
        "user_provided_suffix", json_object_get(row, "suffix"), "result_files", "integrations",
        "estimated_finish");
    if (!o) {
        json_decref(method);
        json_decref(spec);
        return json_pack("{s:s, s:O}", "object", "fine_tuning.job", "id", json_object_get(row, "id"));
    }
    json_object_set_new(o, "method", method);
    json_t *error = parse_text(row, "error");
    json_object_set_new(o, "error", error);
    json_t *metadata = parse_text(row, "metadata");
    json_object_set_new(o, "metadata", metadata);
    /* smelt's additions */
    json_object_set(o, "lora", json_object_get(spec, "lora") ?: json_null());
    json_object_set_new(o, "resources", resources_shown(row, spec));
    json_object_set(o, "priority", json_object_get(row, "priority"));
    json_object_set(o, "max_retries", json_object_get(row, "max_retries"));
    json_object_set(o, "max_runtime_seconds", json_object_get(row, "max_runtime_seconds"));
    json_object_set(o, "retries", json_object_get(row, "retries"));
    json_object_set(o, "attempt", json_object_get(row, "attempt"));
    json_object_set(o, "started_at", json_object_get(row, "started_at"));
    json_object_set(o, "agent", json_object_get(row, "agent_id"));
    json_object_set_new(o, "devices", parse_text(row, "devices"));
    json_object_set(o, "schedule_id", json_object_get(row, "schedule_id"));
    json_object_set_new(o, "spec", spec);
    return o;
}

int jobs_plan_spec(struct server *s, const char *project, const json_t *request, json_t **spec,
                   struct smelt_error *err) {
    *spec = NULL;
    struct store_conn *conn = store_acquire(s->store, err);
    if (!conn) return err->code ? err->code : SMELT_EIO;
    char dir[SERVER_PATH_BYTES + 32];
    snprintf(dir, sizeof dir, "%s/validate", s->jobs_dir);
    struct job_plan plan = {0};
    int rc = plan_job(s, conn, project, request, dir, &plan, err);
    store_release(s->store, conn);
    if (rc == 0) *spec = json_incref(plan.spec);
    plan_free(&plan);
    return rc;
}
