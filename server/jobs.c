/* Jobs: an OpenAI fine-tuning create request becomes a trainer job spec (docs/api.md
 * lists how each field maps), the job row, and its event stream. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"
#include "trainer/trainer.h"

/* learning_rate_multiplier scales this (smelt's default peak learning rate). */
#define JOBS_BASE_LEARNING_RATE 1e-4
#define JOBS_AUTO_EPOCHS 3
#define JOBS_AUTO_BATCH_SIZE 8
#define JOBS_MAX_SUFFIX 40

bool jobs_status_final(const char *status) {
    return strcmp(status, "succeeded") == 0 || strcmp(status, "failed") == 0 ||
           strcmp(status, "cancelled") == 0;
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
    if (rc >= 0 && s->http) http_streams_wake(s->http);
    return rc < 0 ? rc : 0;
}

/* ---- the create request ---- */

struct create_error {
    int status;
    char param[128];
    char message[600];
};

static int refuse(struct create_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct create_error *e, const char *param, const char *fmt, ...) {
    e->status = 400;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static bool is_auto(const json_t *v) {
    return !v || json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0);
}

/* OpenAI's hyperparameters plus smelt's own, into spec.hyperparameters. The resolved
 * OpenAI view goes to *shown (what the job object reports). */
static int map_hyperparameters(const json_t *hp, const char *where, json_t *spec_hp, json_t *shown,
                               struct create_error *e) {
    static const char *const trainer_keys[] = {
        "learning_rate", "batch_tokens", "grad_accum", "max_steps", "lr_schedule", "warmup_steps",
        "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps", "max_grad_norm", "recompute", NULL};
    char param[128];
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)hp, key, value) {
        bool known = strcmp(key, "n_epochs") == 0 || strcmp(key, "batch_size") == 0 ||
                     strcmp(key, "learning_rate_multiplier") == 0;
        for (int i = 0; !known && trainer_keys[i]; i++) known = strcmp(key, trainer_keys[i]) == 0;
        if (!known) {
            snprintf(param, sizeof param, "%s.%s", where, key);
            return refuse(e, param, "%s: unknown hyperparameter", param);
        }
        if (strcmp(key, "n_epochs") != 0 && strcmp(key, "batch_size") != 0 &&
            strcmp(key, "learning_rate_multiplier") != 0)
            json_object_set(spec_hp, key, value);
    }
    json_t *v = json_object_get(hp, "n_epochs");
    int64_t epochs = JOBS_AUTO_EPOCHS;
    if (!is_auto(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000) {
            snprintf(param, sizeof param, "%s.n_epochs", where);
            return refuse(e, param, "%s: \"auto\" or an integer in [1, 1000] is expected", param);
        }
        epochs = json_integer_value(v);
    }
    v = json_object_get(hp, "batch_size");
    int64_t batch = JOBS_AUTO_BATCH_SIZE;
    if (!is_auto(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536) {
            snprintf(param, sizeof param, "%s.batch_size", where);
            return refuse(e, param, "%s: \"auto\" or an integer in [1, 65536] is expected", param);
        }
        batch = json_integer_value(v);
    }
    v = json_object_get(hp, "learning_rate_multiplier");
    double mult = 1.0;
    if (!is_auto(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1e4) {
            snprintf(param, sizeof param, "%s.learning_rate_multiplier", where);
            return refuse(e, param, "%s: \"auto\" or a number in (0, 10000] is expected", param);
        }
        mult = json_number_value(v);
        if (json_object_get(hp, "learning_rate")) {
            snprintf(param, sizeof param, "%s.learning_rate", where);
            return refuse(e, param, "%s: give learning_rate or learning_rate_multiplier, not both", param);
        }
    }
    json_object_set_new(spec_hp, "epochs", json_integer(epochs));
    json_object_set_new(spec_hp, "batch_size", json_integer(batch));
    if (!json_object_get(spec_hp, "learning_rate"))
        json_object_set_new(spec_hp, "learning_rate", json_real(JOBS_BASE_LEARNING_RATE * mult));
    json_object_set_new(shown, "n_epochs", json_integer(epochs));
    json_object_set_new(shown, "batch_size", json_integer(batch));
    json_t *lr = json_object_get(spec_hp, "learning_rate");
    json_object_set_new(shown, "learning_rate_multiplier",
                        json_is_number(lr) ? json_real(json_number_value(lr) / JOBS_BASE_LEARNING_RATE)
                                           : json_real(mult));
    return 0;
}

static int file_path(struct store_conn *conn, const char *project, const char *param,
                     const char *id, char *path, size_t cap, struct create_error *e) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = store_query_one(conn, &row, &err,
                             "SELECT path, status, kind, report AS report__json FROM files "
                             "WHERE id = ? AND project_id = ? AND deleted = 0", "ss", id, project);
    if (rc == SMELT_ENOTFOUND) return refuse(e, param, "%s: no such file: %s", param, id);
    if (rc) {
        e->status = 500;
        snprintf(e->message, sizeof e->message, "%s", err.message);
        return -1;
    }
    int out = 0;
    if (strcmp(json_string_value(json_object_get(row, "status")), "processed") != 0) {
        json_t *first = json_array_get(json_object_get(json_object_get(row, "report"), "errors"), 0);
        out = refuse(e, param, "%s: %s failed validation: line %lld: %s%s%s", param, id,
                     (long long)json_integer_value(json_object_get(first, "line")),
                     json_string_value(json_object_get(first, "field")) ?: "",
                     *(json_string_value(json_object_get(first, "field")) ?: "") ? ": " : "",
                     json_string_value(json_object_get(first, "message")) ?: "invalid");
    } else if (strcmp(json_string_value(json_object_get(row, "kind")), "sft") != 0) {
        out = refuse(e, param, "%s: %s holds %s rows; a supervised job needs SFT rows (messages or "
                     "prompt/completion)", param, id, json_string_value(json_object_get(row, "kind")));
    } else {
        snprintf(path, cap, "%s", json_string_value(json_object_get(row, "path")));
    }
    json_decref(row);
    return out;
}

/* Copies the smelt sections that map one to one onto the spec (data, eval, checkpoint). */
static int copy_section(const json_t *request, const char *key, json_t *spec, struct create_error *e) {
    json_t *v = json_object_get(request, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return refuse(e, key, "%s: an object is expected", key);
    json_t *target = json_object_get(spec, key);
    if (target) json_object_update(target, v);
    else json_object_set(spec, key, v);
    return 0;
}

static int int_field(const json_t *request, const char *key, int64_t def, int64_t min, int64_t max,
                     int64_t *out, struct create_error *e) {
    json_t *v = json_object_get(request, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return refuse(e, key, "%s: an integer in [%lld, %lld] is expected", key, (long long)min,
                      (long long)max);
    *out = json_integer_value(v);
    return 0;
}

struct job_plan {
    json_t *spec;          /* the trainer's job spec */
    json_t *method;        /* as the job object shows it (resolved hyperparameters) */
    json_t *shown_hp;
    const char *model, *training_file, *validation_file, *suffix;
    json_t *metadata;
    int64_t seed, priority, devices, max_retries, max_runtime;
};

static int plan_job(struct server *s, struct store_conn *conn, const char *project, json_t *request,
                    const char *job_dir, struct job_plan *p, struct create_error *e) {
    static const char *const keys[] = {
        "model", "training_file", "validation_file", "hyperparameters", "method", "suffix", "seed",
        "metadata", "integrations", "lora", "resources", "priority", "max_retries",
        "max_runtime_seconds", "model_init", "data", "eval", "checkpoint", "save_merged",
        "save_dtype", "backend", NULL};
    const char *key;
    json_t *value;
    json_object_foreach(request, key, value) {
        bool known = false;
        for (int i = 0; keys[i] && !known; i++) known = strcmp(key, keys[i]) == 0;
        if (!known) return refuse(e, key, "%s: unknown parameter", key);
    }
    json_t *v = json_object_get(request, "model");
    if (!json_is_string(v) || !json_string_length(v))
        return refuse(e, "model", "model: a model id is required (GET /v1/models lists them)");
    p->model = json_string_value(v);
    v = json_object_get(request, "training_file");
    if (!json_is_string(v) || !json_string_length(v))
        return refuse(e, "training_file", "training_file: a file id is required");
    p->training_file = json_string_value(v);
    v = json_object_get(request, "validation_file");
    if (v && !json_is_null(v) && (!json_is_string(v) || !json_string_length(v)))
        return refuse(e, "validation_file", "validation_file: a file id or null is expected");
    p->validation_file = json_is_string(v) ? json_string_value(v) : NULL;
    v = json_object_get(request, "suffix");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > JOBS_MAX_SUFFIX)
            return refuse(e, "suffix", "suffix: a string of 1 to %d characters is expected", JOBS_MAX_SUFFIX);
        for (const char *c = json_string_value(v); *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  *c == '-' || *c == '_' || *c == '.'))
                return refuse(e, "suffix", "suffix: only letters, digits, '-', '_' and '.' are allowed");
        p->suffix = json_string_value(v);
    }
    if (int_field(request, "seed", -1, 0, INT64_C(2147483647), &p->seed, e)) return -1;
    if (p->seed < 0) {
        char id[HTTP_ID_BYTES];
        server_new_id("", id, sizeof id); /* random hex: the first 7 digits make the seed */
        id[7] = 0;
        p->seed = strtoll(id, NULL, 16);
    }
    v = json_object_get(request, "metadata");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v) || json_object_size(v) > 16)
            return refuse(e, "metadata", "metadata: an object of at most 16 string values is expected");
        json_t *mv;
        json_object_foreach(v, key, mv) {
            if (strlen(key) > 64 || !json_is_string(mv) || json_string_length(mv) > 512)
                return refuse(e, "metadata", "metadata.%.64s: keys up to 64 and string values up to "
                              "512 characters", key);
        }
        p->metadata = v;
    }
    v = json_object_get(request, "integrations");
    if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
        return refuse(e, "integrations", "integrations: not supported by smelt (use [] or leave it out)");
    if (int_field(request, "priority", 0, -100, 100, &p->priority, e)) return -1;
    if (int_field(request, "max_retries", 1, 0, 100, &p->max_retries, e)) return -1;
    if (int_field(request, "max_runtime_seconds", 0, 0, INT64_C(31536000), &p->max_runtime, e)) return -1;
    p->devices = 1;
    v = json_object_get(request, "resources");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) return refuse(e, "resources", "resources: an object is expected");
        json_object_foreach(v, key, value) {
            if (strcmp(key, "devices") != 0)
                return refuse(e, "resources", "resources.%.64s: unknown field (devices)", key);
        }
        if (int_field(v, "devices", 1, 1, 64, &p->devices, e)) {
            snprintf(e->param, sizeof e->param, "resources.devices");
            return -1;
        }
        if (p->devices != 1)
            return refuse(e, "resources.devices", "resources.devices: supervised jobs run on one "
                          "device in this version of smelt");
    }

    /* method, or the legacy top-level hyperparameters */
    json_t *hp = json_object_get(request, "hyperparameters");
    const char *type = "supervised";
    json_t *method = json_object_get(request, "method");
    if (method && !json_is_null(method)) {
        if (!json_is_object(method)) return refuse(e, "method", "method: an object is expected");
        v = json_object_get(method, "type");
        if (!json_is_string(v))
            return refuse(e, "method.type", "method.type: one of supervised, dpo, reinforcement, ppo, "
                          "grpo, reward_model");
        type = json_string_value(v);
        if (strcmp(type, "dpo") == 0 || strcmp(type, "reinforcement") == 0 || strcmp(type, "ppo") == 0 ||
            strcmp(type, "grpo") == 0 || strcmp(type, "reward_model") == 0)
            return refuse(e, "method.type", "method.type: '%s' jobs are not available in this version "
                          "of smelt yet (supervised is)", type);
        if (strcmp(type, "supervised") != 0)
            return refuse(e, "method.type", "method.type: '%.40s' is not a method (supervised, dpo, "
                          "reinforcement, ppo, grpo, reward_model)", type);
        json_object_foreach(method, key, value) {
            if (strcmp(key, "type") != 0 && strcmp(key, "supervised") != 0)
                return refuse(e, "method", "method.%.64s: unknown field", key);
        }
        json_t *sup = json_object_get(method, "supervised");
        if (sup && !json_is_null(sup)) {
            if (!json_is_object(sup)) return refuse(e, "method.supervised", "method.supervised: an object is expected");
            json_object_foreach(sup, key, value) {
                if (strcmp(key, "hyperparameters") != 0)
                    return refuse(e, "method.supervised", "method.supervised.%.64s: unknown field", key);
            }
            json_t *mhp = json_object_get(sup, "hyperparameters");
            if (mhp && !json_is_null(mhp)) {
                if (hp && !json_is_null(hp))
                    return refuse(e, "hyperparameters", "hyperparameters: give them in "
                                  "method.supervised.hyperparameters or at the top level, not both");
                hp = mhp;
            }
        }
    }
    const char *hp_where = hp == json_object_get(request, "hyperparameters")
                               ? "hyperparameters" : "method.supervised.hyperparameters";
    if (hp && !json_is_null(hp) && !json_is_object(hp))
        return refuse(e, hp_where, "%s: an object is expected", hp_where);

    /* the spec */
    char model_path[SERVER_PATH_BYTES], kind[16];
    struct smelt_error err = {0};
    int rc = models_resolve(s, conn, project, p->model, model_path, sizeof model_path, kind, sizeof kind, &err);
    if (rc == SMELT_ENOTFOUND) return refuse(e, "model", "model: no such model: %s (GET /v1/models lists them)", p->model);
    if (rc) {
        e->status = 500;
        snprintf(e->message, sizeof e->message, "%s", err.message);
        return -1;
    }
    char train_path[SERVER_PATH_BYTES], val_path[SERVER_PATH_BYTES] = "";
    if (file_path(conn, project, "training_file", p->training_file, train_path, sizeof train_path, e)) return -1;
    if (p->validation_file &&
        file_path(conn, project, "validation_file", p->validation_file, val_path, sizeof val_path, e))
        return -1;

    p->spec = json_pack("{s:s, s:s, s:{s:s}, s:{}, s:s, s:I, s:i}", "type", "sft", "model", model_path,
                        "data", "train", train_path, "hyperparameters", "output_dir", job_dir,
                        "seed", (json_int_t)p->seed, "log_every_steps", 1);
    p->shown_hp = json_object();
    if (!p->spec || !p->shown_hp) return refuse(e, NULL, "out of memory");
    if (val_path[0]) json_object_set_new(json_object_get(p->spec, "data"), "validation", json_string(val_path));
    if (map_hyperparameters(hp && json_is_object(hp) ? hp : json_object_get(p->spec, "hyperparameters"),
                            hp_where, json_object_get(p->spec, "hyperparameters"), p->shown_hp, e))
        return -1;
    if (copy_section(request, "data", p->spec, e) || copy_section(request, "eval", p->spec, e) ||
        copy_section(request, "checkpoint", p->spec, e))
        return -1;
    static const char *const passthrough[] = {"lora", "model_init", "save_merged", "save_dtype", "backend", NULL};
    for (int i = 0; passthrough[i]; i++) {
        v = json_object_get(request, passthrough[i]);
        if (v && !json_is_null(v)) json_object_set(p->spec, passthrough[i], v);
    }
    /* The trainer's own validation decides every remaining field; its messages carry the
     * field path, which is the request's path too. */
    struct job_spec js;
    if (job_spec_from_json(p->spec, "job", &js, &err) != 0) {
        const char *msg = strncmp(err.message, "job: ", 5) == 0 ? err.message + 5 : err.message;
        const char *colon = strstr(msg, ": ");
        char param[128] = "";
        if (colon && colon - msg < (int)sizeof param) snprintf(param, sizeof param, "%.*s", (int)(colon - msg), msg);
        /* the typed readers say "section: field 'name' ..." */
        const char *field = colon ? strstr(colon, ": field '") : NULL;
        if (field == colon && strchr(field + 9, '\'') && strlen(param) + 1 + 64 < sizeof param) {
            const char *name = field + 9, *end = strchr(name, '\'');
            snprintf(param + strlen(param), sizeof param - strlen(param), ".%.*s", (int)(end - name), name);
        }
        return refuse(e, param[0] ? param : NULL, "%s", msg);
    }
    p->method = json_pack("{s:s, s:{s:O}}", "type", "supervised", "supervised", "hyperparameters", p->shown_hp);
    if (!p->method) return refuse(e, NULL, "out of memory");
    return 0;
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
    struct create_error ce = {0};
    if (plan_job(s, conn, project, request, job_dir, &plan, &ce) != 0) {
        store_release(s->store, conn);
        plan_free(&plan);
        http_reply_error(res, ce.status ? ce.status : 400, ce.param[0] ? ce.param : NULL,
                         ce.status == 500 ? "server_error" : "invalid_value", "%s", ce.message);
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
    struct create_error ce = {0};
    int rc = plan_job(s, conn, project, request, dir, &plan, &ce);
    store_release(s->store, conn);
    plan_free(&plan);
    if (rc != 0)
        http_reply_error(res, ce.status ? ce.status : 400, ce.param[0] ? ce.param : NULL,
                         ce.status == 500 ? "server_error" : "invalid_value", "%s", ce.message);
    return rc;
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
    json_t *hp = json_object_get(json_object_get(method, "supervised"), "hyperparameters");
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
    json_object_set_new(o, "resources", json_pack("{s:O}", "devices", json_object_get(row, "devices_wanted")));
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
