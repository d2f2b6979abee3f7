/* server/jobs: a create request against a real store (a temporary data directory with a
 * base model and a processed file), answered as the HTTP API answers it. The heart is
 * that the trainer owns the job spec: every hyperparameter of the trainer's table is
 * accepted through the API, and every out-of-range value is refused with the trainer's
 * own error and a `param` naming the request's field, wherever the request put it. */
#include "tests/unit/testutil.h"

#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "server/server_internal.h"
#include "trainer/trainer.h"

#define PROJECT "default"
#define TRAIN_FILE "file-train"
#define PREF_FILE "file-pref" /* preference rows (prompt, chosen, rejected) */

static struct server g_s;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot create %s", path);
    fputs(text, f);
    fclose(f);
}

static void jobs_setup(void) {
    test_tmp_setup();
    memset(&g_s, 0, sizeof g_s);
    char path[SERVER_PATH_BYTES + 64];
    snprintf(g_s.jobs_dir, sizeof g_s.jobs_dir, "%s/jobs", test_tmp_dir);
    snprintf(g_s.models_dir, sizeof g_s.models_dir, "%s/models", test_tmp_dir);
    cr_assert(mkdir(g_s.jobs_dir, 0700) == 0 && mkdir(g_s.models_dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/tiny", g_s.models_dir);
    cr_assert(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/tiny/config.json", g_s.models_dir);
    write_file(path, "{}");
    struct smelt_error err = {0};
    TEST_OK(store_open(test_tmp_path(path, sizeof path, "smelt.db"), &g_s.store, &err), &err);
    struct store_conn *conn = store_acquire(g_s.store, &err);
    cr_assert(conn, "%s", err.message);
    int rc = store_exec(conn, &err, "INSERT INTO files (id, project_id, filename, purpose, bytes, created_at, "
                        "path, status, kind, report) VALUES (?, ?, 'train.jsonl', 'fine-tune', 1, 0, "
                        "'/nowhere/train.jsonl', 'processed', 'sft', '{}'), (?, ?, 'pref.jsonl', 'fine-tune', 1, "
                        "0, '/nowhere/pref.jsonl', 'processed', 'preference', '{}')", "ssss", TRAIN_FILE, PROJECT,
                        PREF_FILE, PROJECT);
    cr_assert(rc >= 0, "%s", err.message);
    store_release(g_s.store, conn);
}

static void jobs_teardown(void) {
    if (g_s.store) store_close(g_s.store);
    test_tmp_teardown();
}

/* {"model": "tiny", "training_file": ..., <where>: {name: value}} (takes value). */
static json_t *request_with(const char *where, const char *name, json_t *value) {
    json_t *hp = json_object();
    json_object_set_new(hp, name, value);
    json_t *r = json_pack("{s:s, s:s}", "model", "tiny", "training_file", TRAIN_FILE);
    if (strcmp(where, "hyperparameters") == 0)
        json_object_set_new(r, "hyperparameters", hp);
    else
        json_object_set_new(r, "method", json_pack("{s:s, s:{s:o}}", "type", "supervised", "supervised",
                                                   "hyperparameters", hp));
    cr_assert(r);
    return r;
}

/* jobs_validate's answer: NULL when accepted, else the reply's "error" object (new
 * reference) and *status. Takes request. */
static json_t *validate(json_t *request, int *status) {
    struct http_response res = {0};
    int rc = jobs_validate(&g_s, PROJECT, request, &res);
    json_decref(request);
    *status = res.status;
    json_t *body = res.body ? json_loadb(res.body, res.body_len, 0, NULL) : NULL;
    free(res.body);
    if (rc == 0) {
        json_decref(body);
        return NULL;
    }
    cr_assert(body, "a refusal without a JSON body");
    json_t *error = json_incref(json_object_get(body, "error"));
    json_decref(body);
    return error;
}

static const char *error_param(const json_t *error) {
    return json_string_value(json_object_get(error, "param"));
}

static const char *error_message(const json_t *error) {
    return json_string_value(json_object_get(error, "message")) ?: "";
}

/* The trainer's own refusal of hyperparameters.<name> = value, without its "job: "
 * prefix: what the API must say. */
static void trainer_refusal(const char *name, json_t *value, char *message, size_t cap) {
    json_t *spec = json_pack("{s:s, s:s, s:{s:s}, s:s, s:{s:O}}", "type", "sft", "model", "m", "data", "train",
                             "t", "output_dir", "o", "hyperparameters", name, value);
    struct job_spec js;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(job_spec_from_json(spec, "job", &js, &err), SMELT_EINVAL, &err);
    json_decref(spec);
    char want[128];
    snprintf(want, sizeof want, "hyperparameters.%s", name);
    cr_expect_str_eq(err.field, want, "the trainer names the field");
    cr_assert(strncmp(err.message, "job: ", 5) == 0, "%s", err.message);
    memcpy(message, err.message + 5, strlen(err.message + 5) + 1 < cap ? strlen(err.message + 5) + 1 : cap);
    message[cap - 1] = 0;
}

static const char *const WHERES[] = {"hyperparameters", "method.supervised.hyperparameters"};

/* Values the trainer's table allows (a NAME field: its default). */
static int accepted_values(const struct job_hp_field *f, json_t **out) {
    switch (f->kind) {
    case JOB_FIELD_INT:
        out[0] = json_integer((json_int_t)f->def);
        out[1] = json_integer((json_int_t)f->max);
        out[2] = json_integer((json_int_t)f->min);
        return 3;
    case JOB_FIELD_NUMBER:
        out[0] = json_real(f->def);
        out[1] = json_real(f->max);
        if (f->min_excluded) return 2;
        out[2] = json_real(f->min);
        return 3;
    case JOB_FIELD_BOOL:
        out[0] = json_true();
        out[1] = json_false();
        return 2;
    case JOB_FIELD_NAME: out[0] = json_string(f->def_name); return 1;
    }
    return 0;
}

/* Values the trainer's table refuses: past each end of the range, or of the wrong kind. */
static int refused_values(const struct job_hp_field *f, json_t **out) {
    switch (f->kind) {
    case JOB_FIELD_INT:
        out[0] = json_integer((json_int_t)f->min - 1);
        out[1] = json_integer((json_int_t)f->max + 1);
        return 2;
    case JOB_FIELD_NUMBER:
        out[0] = json_real(f->min_excluded ? f->min : f->min - 1);
        out[1] = json_real(f->max * 2 + 1);
        return 2;
    case JOB_FIELD_BOOL: out[0] = json_string("yes"); return 1;
    case JOB_FIELD_NAME: out[0] = json_string("no-such-name"); return 1;
    }
    return 0;
}

TestSuite(jobs, .init = jobs_setup, .fini = jobs_teardown);

Test(jobs, every_trainer_hyperparameter_is_accepted) {
    cr_assert_gt(JOB_N_HP_FIELDS, 0);
    for (int i = 0; i < JOB_N_HP_FIELDS; i++) {
        const struct job_hp_field *f = &JOB_HP_FIELDS[i];
        for (size_t w = 0; w < 2; w++) {
            json_t *values[3];
            int n = accepted_values(f, values);
            for (int k = 0; k < n; k++) {
                char *text = json_dumps(values[k], JSON_ENCODE_ANY);
                int status;
                json_t *error = validate(request_with(WHERES[w], f->name, values[k]), &status);
                cr_expect_null(error, "%s.%s = %s refused: %s", WHERES[w], f->name, text, error_message(error));
                json_decref(error);
                free(text);
            }
        }
    }
}

Test(jobs, every_trainer_hyperparameter_is_refused_with_its_own_error) {
    for (int i = 0; i < JOB_N_HP_FIELDS; i++) {
        const struct job_hp_field *f = &JOB_HP_FIELDS[i];
        for (size_t w = 0; w < 2; w++) {
            json_t *values[2];
            int n = refused_values(f, values);
            for (int k = 0; k < n; k++) {
                char *text = json_dumps(values[k], JSON_ENCODE_ANY);
                char want_message[SMELT_ERROR_MESSAGE_BYTES], want_param[128];
                trainer_refusal(f->name, values[k], want_message, sizeof want_message);
                snprintf(want_param, sizeof want_param, "%s.%s", WHERES[w], f->name);
                int status;
                json_t *error = validate(request_with(WHERES[w], f->name, values[k]), &status);
                cr_assert(error, "%s.%s = %s accepted", WHERES[w], f->name, text);
                cr_expect_eq(status, 400);
                cr_expect_str_eq(error_param(error) ?: "(null)", want_param, "%s = %s", f->name, text);
                cr_expect(strstr(error_message(error), want_message) != NULL, "%s = %s: '%s' lacks '%s'", f->name,
                          text, error_message(error), want_message);
                json_decref(error);
                free(text);
            }
        }
    }
}

/* OpenAI's names are renamings of trainer fields: their errors are the trainer's, their
 * param the name the request used. */
Test(jobs, openai_names_map_onto_trainer_fields) {
    static const struct { const char *name, *field; double refused; } cases[] = {
        {"n_epochs", "epochs", 0},
        {"batch_size", "batch_size", 0},
        {"learning_rate_multiplier", "learning_rate", 1e9},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cr_assert(job_hp_field_find(cases[c].field), "%s is a trainer field", cases[c].field);
        for (size_t w = 0; w < 2; w++) {
            int status;
            json_t *v = strcmp(cases[c].name, "learning_rate_multiplier") == 0 ? json_real(cases[c].refused)
                                                                              : json_integer((json_int_t)cases[c].refused);
            json_t *error = validate(request_with(WHERES[w], cases[c].name, v), &status);
            cr_assert(error, "%s accepted", cases[c].name);
            char want_param[128], want_field[64];
            snprintf(want_param, sizeof want_param, "%s.%s", WHERES[w], cases[c].name);
            snprintf(want_field, sizeof want_field, "field '%s'", cases[c].field);
            cr_expect_str_eq(error_param(error) ?: "(null)", want_param);
            cr_expect(strstr(error_message(error), want_field) != NULL, "the trainer's error: %s",
                      error_message(error));
            json_decref(error);
            error = validate(request_with(WHERES[w], cases[c].name, json_string("auto")), &status);
            cr_expect_null(error, "\"auto\" refused for %s", cases[c].name);
            json_decref(error);
        }
    }
}

Test(jobs, an_openai_name_and_its_trainer_field_are_not_both_given) {
    json_t *r = request_with("hyperparameters", "n_epochs", json_integer(2));
    json_object_set_new(json_object_get(r, "hyperparameters"), "epochs", json_integer(3));
    int status;
    json_t *error = validate(r, &status);
    cr_assert(error);
    cr_expect_str_eq(error_param(error), "hyperparameters.n_epochs");
    json_decref(error);
}

/* "auto" is the trainer's default, and the job object shows the resolved numbers. */
Test(jobs, auto_is_the_trainers_default) {
    json_t *r = request_with("hyperparameters", "n_epochs", json_string("auto"));
    json_object_set_new(json_object_get(r, "hyperparameters"), "learning_rate_multiplier", json_real(2.0));
    struct http_response res = {0};
    json_t *job = NULL;
    int rc = jobs_create(&g_s, PROJECT, r, NULL, NULL, &job, &res);
    cr_assert_eq(rc, 0, "refused: %.*s", (int)res.body_len, res.body ? res.body : "");
    json_t *hp = json_object_get(job, "hyperparameters");
    const struct job_hp_field *epochs = job_hp_field_find("epochs"), *batch = job_hp_field_find("batch_size"),
                              *lr = job_hp_field_find("learning_rate");
    cr_expect_eq(json_integer_value(json_object_get(hp, "n_epochs")), (json_int_t)epochs->def);
    cr_expect_eq(json_integer_value(json_object_get(hp, "batch_size")), (json_int_t)batch->def);
    cr_expect_float_eq(json_number_value(json_object_get(hp, "learning_rate_multiplier")), 2.0, 1e-12);
    json_t *spec_hp = json_object_get(json_object_get(job, "spec"), "hyperparameters");
    cr_expect_null(json_object_get(spec_hp, "epochs"), "\"auto\" leaves the trainer's default");
    cr_expect_float_eq(json_number_value(json_object_get(spec_hp, "learning_rate")), 2.0 * lr->def, 1e-15);
    json_decref(job);
    json_decref(r);
    free(res.body);
}

/* The param comes from the error's field, also where the old text parsing lost it. */
Test(jobs, params_name_the_request_field) {
    static const struct { const char *body, *param; } cases[] = {
        {"{\"hyperparameters\": {\"momentum\": 0.9}}", "hyperparameters.momentum"},
        {"{\"method\": {\"type\": \"supervised\", \"supervised\": {\"hyperparameters\": {\"momentum\": 1}}}}",
         "method.supervised.hyperparameters.momentum"},
        {"{\"data\": {\"train\": null}}", "data.train"}, /* "missing required field" */
        {"{\"data\": {\"max_seq_len\": 1}}", "data.max_seq_len"},
        {"{\"data\": {\"truncation\": \"chop\"}}", "data.truncation"},
        {"{\"lora\": {\"rank\": 0}}", "lora.rank"},
        {"{\"lora\": {\"bogus\": 1}}", "lora.bogus"},
        {"{\"eval\": {\"every_steps\": -1}}", "eval.every_steps"},
        {"{\"backend\": \"abacus\"}", "backend"},
        {"{\"save_merged\": true}", "save_merged"},
        {"{\"hyperparameters\": {\"batch_tokens\": 16}, \"data\": {\"max_seq_len\": 32}}",
         "hyperparameters.batch_tokens"},
        {"{\"suffix\": \"a b\"}", "suffix"},
        {"{\"resources\": {\"devices\": 0}}", "resources.devices"},
        /* two ranks, but one micro-batch per step: nothing for the second rank */
        {"{\"resources\": {\"trainer\": {\"devices\": 2}}}", "resources.trainer.devices"},
        {"{\"resources\": {\"devices\": 2}}", "resources.trainer.devices"},
        {"{\"resources\": {\"devices\": 2, \"trainer\": {\"devices\": 4}}, \"hyperparameters\": "
         "{\"grad_accum\": 4}}", "resources.devices"},
        {"{\"nonsense\": 1}", "nonsense"},
        /* an empty key is named "" (fuzz_job_create found it refused with an empty param) */
        {"{\"\": 1}", "\"\""},
        {"{\"method\": {\"type\": \"supervised\", \"\": {}}}", "method.\"\""},
        {"{\"hyperparameters\": 3}", "hyperparameters"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *r = json_loads(cases[c].body, 0, NULL);
        cr_assert(r, "%s", cases[c].body);
        json_object_set_new(r, "model", json_string("tiny"));
        json_object_set_new(r, "training_file", json_string(TRAIN_FILE));
        int status;
        json_t *error = validate(r, &status);
        cr_assert(error, "%s accepted", cases[c].body);
        cr_expect_eq(status, 400, "%s", cases[c].body);
        cr_expect_str_eq(error_param(error) ?: "(null)", cases[c].param, "%s: %s", cases[c].body,
                         error_message(error));
        json_decref(error);
    }
}

/* ---- method dpo: OpenAI's shape, the trainer's DPO fields beside OpenAI's ---- */

#define DPO_WHERE "method.dpo.hyperparameters"

/* {"model": "tiny", "training_file": PREF_FILE, "method": {"type": "dpo", "dpo":
 * {"hyperparameters": hp}}} (takes hp; none when NULL). */
static json_t *dpo_request(json_t *hp) {
    json_t *r = json_pack("{s:s, s:s, s:{s:s, s:{}}}", "model", "tiny", "training_file", PREF_FILE, "method", "type",
                          "dpo", "dpo");
    cr_assert(r);
    if (hp) json_object_set_new(json_object_get(json_object_get(r, "method"), "dpo"), "hyperparameters", hp);
    return r;
}

/* jobs_create's job object for request (taken); fails the test on a refusal. */
static json_t *create(json_t *request) {
    struct http_response res = {0};
    json_t *job = NULL;
    int rc = jobs_create(&g_s, PROJECT, request, NULL, NULL, &job, &res);
    cr_assert_eq(rc, 0, "refused: %.*s", (int)res.body_len, res.body ? res.body : "");
    json_decref(request);
    free(res.body);
    return job;
}

static double field_default(const char *name) {
    const struct job_hp_field *f = job_hp_field_find(name);
    cr_assert(f, "the trainer has a field %s", name);
    return f->def;
}

Test(jobs, dpo_takes_openais_fields_and_shows_them_resolved) {
    json_t *job = create(dpo_request(json_pack("{s:f, s:i, s:i, s:f}", "beta", 0.25, "n_epochs", 2, "batch_size", 4,
                                               "learning_rate_multiplier", 0.5)));
    json_t *method = json_object_get(job, "method");
    cr_expect_str_eq(json_string_value(json_object_get(method, "type")), "dpo");
    json_t *hp = json_object_get(json_object_get(method, "dpo"), "hyperparameters");
    cr_expect_float_eq(json_number_value(json_object_get(hp, "beta")), 0.25, 1e-12);
    cr_expect_eq(json_integer_value(json_object_get(hp, "n_epochs")), 2);
    cr_expect_eq(json_integer_value(json_object_get(hp, "batch_size")), 4);
    cr_expect_float_eq(json_number_value(json_object_get(hp, "learning_rate_multiplier")), 0.5, 1e-12);
    cr_expect(json_equal(hp, json_object_get(job, "hyperparameters")), "the top-level copy is the same");
    json_t *spec = json_object_get(job, "spec");
    cr_expect_str_eq(json_string_value(json_object_get(spec, "type")), "dpo");
    json_t *spec_hp = json_object_get(spec, "hyperparameters");
    cr_expect_float_eq(json_number_value(json_object_get(spec_hp, "beta")), 0.25, 1e-12);
    cr_expect_eq(json_integer_value(json_object_get(spec_hp, "epochs")), 2);
    cr_expect_float_eq(json_number_value(json_object_get(spec_hp, "learning_rate")),
                       0.5 * field_default("learning_rate"), 1e-15);
    json_decref(job);
}

/* "auto" beta is the trainer's default: left out of the spec, shown resolved. */
Test(jobs, dpo_auto_is_the_trainers_default) {
    json_t *job = create(dpo_request(json_pack("{s:s, s:s, s:s, s:s}", "beta", "auto", "n_epochs", "auto",
                                               "batch_size", "auto", "learning_rate_multiplier", "auto")));
    json_t *hp = json_object_get(json_object_get(json_object_get(job, "method"), "dpo"), "hyperparameters");
    cr_expect_float_eq(json_number_value(json_object_get(hp, "beta")), field_default("beta"), 1e-15);
    cr_expect_eq(json_integer_value(json_object_get(hp, "n_epochs")), (json_int_t)field_default("epochs"));
    cr_expect_float_eq(json_number_value(json_object_get(hp, "learning_rate_multiplier")), 1.0, 1e-15);
    cr_expect_eq(json_object_size(json_object_get(json_object_get(job, "spec"), "hyperparameters")), 0,
                 "\"auto\" leaves every field to the trainer");
    json_decref(job);
    job = create(dpo_request(NULL)); /* no hyperparameters at all */
    hp = json_object_get(json_object_get(json_object_get(job, "method"), "dpo"), "hyperparameters");
    cr_expect_float_eq(json_number_value(json_object_get(hp, "beta")), field_default("beta"), 1e-15);
    json_decref(job);
}

/* smelt's extra DPO hyperparameters sit beside OpenAI's and reach the spec as given. */
Test(jobs, dpo_takes_the_trainers_preference_fields) {
    json_t *job = create(dpo_request(json_pack("{s:f, s:s, s:f, s:f, s:f, s:b, s:I}", "beta", 0.1, "loss_type", "ipo",
                                               "label_smoothing", 0.1, "rpo_alpha", 0.5, "simpo_gamma", 1.0,
                                               "precompute_ref", 1, "max_steps", (json_int_t)3)));
    json_t *spec_hp = json_object_get(json_object_get(job, "spec"), "hyperparameters");
    cr_expect_str_eq(json_string_value(json_object_get(spec_hp, "loss_type")), "ipo");
    cr_expect_float_eq(json_number_value(json_object_get(spec_hp, "label_smoothing")), 0.1, 1e-15);
    cr_expect_float_eq(json_number_value(json_object_get(spec_hp, "rpo_alpha")), 0.5, 1e-15);
    cr_expect(json_is_true(json_object_get(spec_hp, "precompute_ref")));
    cr_expect_eq(json_integer_value(json_object_get(spec_hp, "max_steps")), 3);
    json_decref(job);
}

/* Every field of the trainer's table, out of range under method.dpo: the trainer's own
 * error, param the request's path. */
Test(jobs, dpo_refusals_name_the_request_path) {
    for (int i = 0; i < JOB_N_HP_FIELDS; i++) {
        const struct job_hp_field *f = &JOB_HP_FIELDS[i];
        json_t *values[2];
        int n = refused_values(f, values);
        for (int k = 0; k < n; k++) {
            char *text = json_dumps(values[k], JSON_ENCODE_ANY);
            char want_message[SMELT_ERROR_MESSAGE_BYTES], want_param[128];
            trainer_refusal(f->name, values[k], want_message, sizeof want_message);
            snprintf(want_param, sizeof want_param, DPO_WHERE ".%s", f->name);
            int status;
            json_t *error = validate(dpo_request(json_pack("{s:O}", f->name, values[k])), &status);
            cr_assert(error, "dpo %s = %s accepted", f->name, text);
            cr_expect_eq(status, 400);
            cr_expect_str_eq(error_param(error) ?: "(null)", want_param, "%s = %s", f->name, text);
            cr_expect(strstr(error_message(error), want_message) != NULL, "%s = %s: '%s' lacks '%s'", f->name, text,
                      error_message(error), want_message);
            json_decref(error);
            json_decref(values[k]);
            free(text);
        }
    }
}

/* Refusals of the method's shape and of DPO's own rules, each with its param. */
Test(jobs, dpo_method_params) {
    static const struct { const char *method, *param, *says; } cases[] = {
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"beta\": 0}}}", DPO_WHERE ".beta", "beta"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"beta\": \"high\"}}}", DPO_WHERE ".beta", "beta"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"label_smoothing\": 0.5}}}",
         DPO_WHERE ".label_smoothing", "label_smoothing"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"loss_type\": \"bogus\"}}}", DPO_WHERE ".loss_type",
         "loss_type"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"n_epochs\": 0}}}", DPO_WHERE ".n_epochs", "epochs"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": {\"momentum\": 1}}}", DPO_WHERE ".momentum", "momentum"},
        {"{\"type\": \"dpo\", \"dpo\": {\"hyperparameters\": 3}}", DPO_WHERE, "object"},
        {"{\"type\": \"dpo\", \"dpo\": 3}", "method.dpo", "object"},
        {"{\"type\": \"dpo\", \"dpo\": {\"beta\": 0.1}}", "method.dpo", "unknown"},
        {"{\"type\": \"dpo\", \"supervised\": {}}", "method.supervised", "method.dpo"},
        {"{\"type\": \"ppo\"}", "training_file", "a ppo job needs prompts rows"},
        {"{\"type\": \"grpo\"}", "training_file", "a grpo job needs prompts rows"},
        {"{\"type\": \"grpo\", \"grpo\": {\"grader\": {}}}", "method.grpo", "grader"},
        {"{\"type\": \"dpo\", \"dpo\": {\"reward\": {}}}", "method.dpo", "reward"},
        {"{\"type\": \"grpo\", \"grpo\": {\"reward\": {\"weights\": [1e300]}}}", "method.grpo.reward.weights[0]",
         "outside"},
        {"{\"type\": \"reward_model\", \"reward_model\": {\"hyperparameters\": {\"center_rewards_coefficient\": -1}}}",
         "method.reward_model.hyperparameters.center_rewards_coefficient", "center_rewards_coefficient"},
        {"{\"type\": \"reinforcement\"}", "method.reinforcement.grader", "required"},
        {"{\"type\": \"dpo!\"}", "method.type", "not a method"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *r = dpo_request(NULL), *method = json_loads(cases[c].method, 0, NULL);
        cr_assert(method, "%s", cases[c].method);
        json_object_set_new(r, "method", method);
        int status;
        json_t *error = validate(r, &status);
        cr_assert(error, "%s accepted", cases[c].method);
        cr_expect_eq(status, 400);
        cr_expect_str_eq(error_param(error) ?: "(null)", cases[c].param, "%s: %s", cases[c].method,
                         error_message(error));
        cr_expect(strstr(error_message(error), cases[c].says), "%s: '%s' lacks '%s'", cases[c].method,
                  error_message(error), cases[c].says);
        json_decref(error);
    }
}

/* The top level is the legacy place of supervised jobs' hyperparameters only. */
Test(jobs, dpo_refuses_top_level_hyperparameters) {
    json_t *r = dpo_request(NULL);
    json_object_set_new(r, "hyperparameters", json_pack("{s:f}", "beta", 0.1));
    int status;
    json_t *error = validate(r, &status);
    cr_assert(error);
    cr_expect_str_eq(error_param(error), "hyperparameters");
    cr_expect(strstr(error_message(error), DPO_WHERE), "%s", error_message(error));
    json_decref(error);
}

/* A file's kind (stored at upload) must be the method's: refused at create, naming the
 * file, its field and its kind. */
Test(jobs, a_file_of_the_wrong_kind_is_refused) {
    static const struct { const char *type, *train, *validation, *param, *says; } cases[] = {
        {"dpo", TRAIN_FILE, NULL, "training_file", TRAIN_FILE " holds sft rows; a dpo job needs preference rows"},
        {"dpo", PREF_FILE, TRAIN_FILE, "validation_file", TRAIN_FILE " holds sft rows"},
        {"supervised", PREF_FILE, NULL, "training_file", PREF_FILE " holds preference rows; a supervised job needs "
                                                         "SFT rows"},
        {"supervised", TRAIN_FILE, PREF_FILE, "validation_file", PREF_FILE " holds preference rows"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *r = json_pack("{s:s, s:s, s:{s:s}}", "model", "tiny", "training_file", cases[c].train, "method",
                              "type", cases[c].type);
        if (cases[c].validation) json_object_set_new(r, "validation_file", json_string(cases[c].validation));
        int status;
        json_t *error = validate(r, &status);
        cr_assert(error, "case %zu accepted", c);
        cr_expect_eq(status, 400);
        cr_expect_str_eq(error_param(error) ?: "(null)", cases[c].param);
        cr_expect(strstr(error_message(error), cases[c].says), "'%s' lacks '%s'", error_message(error),
                  cases[c].says);
        json_decref(error);
    }
}

/* GET /v1/models' head: what a job's method makes, and "lm" for the rows written before
 * the column existed (the migration's default: every earlier model was an SFT output). */
Test(jobs, model_heads) {
    cr_expect_str_eq(jobs_method_head("supervised"), "lm");
    cr_expect_str_eq(jobs_method_head("dpo"), "lm");
    cr_expect_str_eq(jobs_method_head("ppo"), "lm");
    cr_expect_null(jobs_method_head("magic"), "no such method");
    struct smelt_error err = {0};
    struct store_conn *conn = store_acquire(g_s.store, &err);
    cr_assert(conn, "%s", err.message);
    int rc = store_exec(conn, &err, "INSERT INTO models (id, project_id, job_id, path, kind, base_model, created_at) "
                        "VALUES ('ft:tiny:old:1', ?, 'ftjob-1', '/nowhere', 'full', 'tiny', 0)", "s", PROJECT);
    cr_assert(rc >= 0, "%s", err.message);
    json_t *row = NULL;
    TEST_OK(store_query_one(conn, &row, &err, "SELECT head FROM models WHERE id = 'ft:tiny:old:1'", ""), &err);
    cr_expect_str_eq(json_string_value(json_object_get(row, "head")), "lm");
    json_decref(row);
    store_release(g_s.store, conn);
}
