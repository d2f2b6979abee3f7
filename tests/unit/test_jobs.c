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
                        "'/nowhere/train.jsonl', 'processed', 'sft', '{}')", "ss", TRAIN_FILE, PROJECT);
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
        {"{\"nonsense\": 1}", "nonsense"},
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
