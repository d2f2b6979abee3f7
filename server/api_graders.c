/* POST /v1/fine_tuning/alpha/graders/validate and /run: OpenAI's grader endpoints, so a
 * user can check a grader and try it on a sample before spending a job on it.
 *
 * Same grader, same score: both read the grader as a reinforcement job does (the reward
 * spec {"grader": G} through reward_stage_create, every error naming the field as
 * "grader.graders.acc.operation"), and /run reads its item as the job reads a training
 * row (dataset_openai_item: its fields but messages and tools, a string answer) and
 * scores the sample with reward_stage_score. A python grader runs in its bubblewrap
 * sandbox, on the HTTP thread: the server has no queue for slow work, so at most half
 * the HTTP threads run python graders at once and the rest of the API stays served
 * (429 beyond). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "rewards/rewards.h"
#include "server/server_internal.h"

/* OpenAI's metadata.errors flags, all written (false unless raised). */
static const char *const ERROR_FLAGS[] = {
    "formula_parse_error",      "invalid_variable_error",      "model_grader_parse_error",
    "model_grader_refusal_error", "model_grader_server_error",  "other_error",
    "python_grader_runtime_error", "python_grader_server_error", "sample_parse_error",
    "truncated_observation_error", "unresponsive_reward_error", NULL};
static const char *const ERROR_DETAILS[] = {"model_grader_server_error_details", "python_grader_runtime_error_details",
                                            "python_grader_server_error_type", NULL};

/* ---- the grader ---- */

/* The grader's error as OpenAI's envelope: 400 naming the field (a grader smelt cannot
 * run here, no sandbox, is the request's problem to fix too: grader.type), 500 for
 * memory. Messages drop the "body." that reward_stage_create was given as their start,
 * so they begin with the field as param names it. */
static void reply_grader_error(struct http_response *res, struct smelt_error *err) {
    const char *msg = strncmp(err->message, "body.", 5) == 0 ? err->message + 5 : err->message;
    if (err->code == SMELT_ENOMEM) {
        http_reply_error(res, 500, NULL, "out_of_memory", "%s", msg);
        return;
    }
    const char *code = err->code == SMELT_EINVAL || err->code == SMELT_EFORMAT ? "invalid_value" : "unsupported";
    http_reply_error(res, 400, err->field[0] ? err->field : "grader", code, "%s", msg);
}

static bool is_python(const json_t *grader) {
    const char *type = json_string_value(json_object_get(grader, "type"));
    return type && strcmp(type, "python") == 0;
}

/* Is pred true of the grader or of one of a multi's sub-graders? */
static bool any_grader(const json_t *grader, bool (*pred)(const json_t *g)) {
    if (pred(grader)) return true;
    const char *key;
    const json_t *sub;
    json_object_foreach((json_t *)json_object_get(grader, "graders"), key, sub)
        if (pred(sub)) return true;
    return false;
}

/* Claims one of the python grader slots: at most half the HTTP threads (at least one)
 * sit in sandboxes. false with a 429 reply when all are taken. */
static bool claim_python_slot(struct server *s, struct http_response *res) {
    int threads = s->config.http_threads > 0 ? s->config.http_threads : 8;
    int limit = threads / 2 > 0 ? threads / 2 : 1;
    if (atomic_fetch_add(&s->grader_python_runs, 1) < limit) return true;
    atomic_fetch_sub(&s->grader_python_runs, 1);
    http_reply_error(res, 429, NULL, "too_many_python_graders",
                     "%d python graders are running, the most this server runs at once; retry shortly", limit);
    http_add_header(res, "Retry-After", "1");
    return false;
}

/* body.grader → a reward stage ({"grader": G}), or a reply. */
static struct reward_stage *stage_of(const json_t *body, struct http_response *res) {
    const json_t *grader = json_object_get(body, "grader");
    if (!grader || json_is_null(grader)) {
        http_reply_error(res, 400, "grader", "missing_required_parameter",
                         "grader: required (an OpenAI grader object: string_check, text_similarity, python or multi)");
        return NULL;
    }
    json_t *spec = json_pack("{s:O}", "grader", grader);
    struct reward_stage *stage = NULL;
    struct smelt_error err = {0};
    int rc = spec ? reward_stage_create(spec, "body", &stage, &err) : error_set(&err, SMELT_ENOMEM, "out of memory");
    json_decref(spec);
    if (rc) reply_grader_error(res, &err);
    return stage;
}

/* The grader as smelt reads it (defaults filled), a new reference; NULL with a reply. */
static json_t *grader_read(const struct reward_stage *stage, struct http_response *res) {
    json_t *spec = NULL;
    struct smelt_error err = {0};
    if (reward_stage_to_json(stage, &spec, &err)) {
        http_reply_error(res, 500, NULL, "out_of_memory", "%s", err.message);
        return NULL;
    }
    json_t *grader = json_incref(json_object_get(spec, "grader"));
    json_decref(spec);
    return grader;
}

/* Refuses a body key outside allowed, naming it: 0, or -1 with a reply. */
static int check_keys(const json_t *body, const char *const *allowed, struct http_response *res) {
    const char *key = json_unknown_key(body, allowed);
    if (!key) return 0;
    http_reply_error(res, 400, key, "unknown_parameter", "%s: unknown parameter", key);
    return -1;
}

/* The body's grader as a stage, or NULL with a reply. A python grader holds a slot
 * (*python) from here until the caller releases it: reading it runs its source once in
 * a sandbox. */
static struct reward_stage *read_grader(struct server *s, const json_t *body, bool *python,
                                        struct http_response *res) {
    *python = false;
    const json_t *grader = json_object_get(body, "grader");
    if (json_is_object(grader) && any_grader(grader, is_python)) {
        if (!claim_python_slot(s, res)) return NULL;
        *python = true;
    }
    return stage_of(body, res);
}

static void release_python_slot(struct server *s, bool python) {
    if (python) atomic_fetch_sub(&s->grader_python_runs, 1);
}

void api_graders_validate(void *app, struct http_request *req, struct http_response *res) {
    static const char *const keys[] = {"grader", NULL};
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    bool python = false;
    struct reward_stage *stage = check_keys(body, keys, res) ? NULL : read_grader(s, body, &python, res);
    json_t *grader = stage ? grader_read(stage, res) : NULL;
    if (grader) http_reply_json(res, 200, json_pack("{s:o}", "grader", grader));
    reward_stage_free(stage);
    release_python_slot(s, python);
    json_decref(body);
}

/* ---- the sample and the item ---- */

struct run_input {
    const char *model_sample;
    json_t *metadata;        /* the item's fields for {{item.<field>}}; NULL when none */
    char *metadata_json;
    const char *answer;      /* borrowed from the body */
};

static void run_input_free(struct run_input *in) {
    json_decref(in->metadata);
    free(in->metadata_json);
    *in = (struct run_input){0};
}

/* model_sample (required, a string) and item (optional, an object, read as a
 * reinforcement job reads a training row). 0, or -1 with a reply naming the field. */
static int read_input(const json_t *body, struct run_input *in, struct http_response *res) {
    *in = (struct run_input){0};
    const json_t *sample = json_object_get(body, "model_sample");
    if (!sample || json_is_null(sample)) {
        http_reply_error(res, 400, "model_sample", "missing_required_parameter",
                         "model_sample: required (the model's output text to grade)");
        return -1;
    }
    if (!json_is_string(sample)) { /* a string holds no NUL: the body was read without JSON_ALLOW_NUL */
        http_reply_error(res, 400, "model_sample", "invalid_value", "model_sample: expected a string");
        return -1;
    }
    in->model_sample = json_string_value(sample);
    const json_t *item = json_object_get(body, "item");
    if (!item || json_is_null(item)) return 0;
    struct smelt_error err = {0};
    if (json_is_object(item) && body_check_json(item, "item", &err)) { /* the document's JsonValue */
        http_reply_error(res, 400, err.field, "invalid_value", "%s", err.message);
        return -1;
    }
    int rc = json_is_object(item) ? dataset_openai_item(item, &in->metadata, &in->answer, &err) : SMELT_EINVAL;
    if (!rc && in->metadata &&
        !(in->metadata_json = json_dumps(in->metadata, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        rc = SMELT_ENOMEM;
    if (rc == SMELT_EINVAL)
        http_reply_error(res, 400, "item", "invalid_value",
                         "item: expected a JSON object (a training row: its fields are {{item.<field>}})");
    else if (rc) http_reply_error(res, 500, NULL, "out_of_memory", "item: out of memory");
    if (rc) run_input_free(in);
    return rc ? -1 : 0;
}

/* ---- the answer ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static json_t *number_or_null(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

static bool text_grader(const char *type) {
    return type && (strcmp(type, "string_check") == 0 || strcmp(type, "text_similarity") == 0);
}

/* The type of score i of the stage: the grader's, then a multi's sub-graders'. */
static const char *score_type(const json_t *grader, const struct reward_stage *stage, int i) {
    const json_t *g = i == 0 ? grader : json_object_get(json_object_get(grader, "graders"), reward_stage_name(stage, i));
    return json_string_value(json_object_get(g, "type"));
}

/* OpenAI's flag for a sample the stage failed. A string_check or text_similarity grader
 * fails a sample only when a template names what the item lacks (or holds null):
 * invalid_variable_error. A multi whose sub-graders all scored failed in its
 * calculate_output (a division by zero, a result that is not finite): other_error, as
 * any other failure. */
static const char *failure_flag(const json_t *grader, const struct reward_stage *stage,
                                const struct reward_result *r) {
    int n = reward_stage_count(stage);
    for (int i = n > 1 ? 1 : 0; i < n; i++)
        if (isnan(r->scores[i])) return text_grader(score_type(grader, stage, i)) ? "invalid_variable_error" : "other_error";
    return "other_error";
}

/* Does a template read {{sample.output_json...}}? */
static bool template_reads_json(const char *t) {
    for (const char *at = t ? strstr(t, "{{") : NULL; at; at = strstr(at + 2, "{{")) {
        const char *p = at + 2;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (strncmp(p, "sample.output_json", 18) == 0) return true;
    }
    return false;
}

static bool leaf_reads_json(const json_t *g) {
    return template_reads_json(json_string_value(json_object_get(g, "input"))) ||
           template_reads_json(json_string_value(json_object_get(g, "reference")));
}

/* What one run found, for the answer. */
struct run_outcome {
    struct reward_result r;
    bool server_error;                   /* the python sandboxes could not start */
    char server_message[SMELT_ERROR_MESSAGE_BYTES];
    bool sample_not_json;
    double seconds;
};

/* metadata.errors: OpenAI's flags and details, every one present. NULL: out of memory. */
static json_t *errors_object(const json_t *grader, const struct reward_stage *stage, const struct run_outcome *o) {
    json_t *e = json_object();
    int bad = !e;
    for (int k = 0; !bad && ERROR_FLAGS[k]; k++) bad |= json_object_set_new(e, ERROR_FLAGS[k], json_false());
    for (int k = 0; !bad && ERROR_DETAILS[k]; k++) bad |= json_object_set_new(e, ERROR_DETAILS[k], json_null());
    if (!bad && o->r.failed) bad |= json_object_set_new(e, failure_flag(grader, stage, &o->r), json_true());
    if (!bad && o->r.warning[0]) {
        bad |= json_object_set_new(e, "python_grader_runtime_error", json_true());
        bad |= json_object_set_new(e, "python_grader_runtime_error_details",
                                   json_string_lossy(o->r.warning, strlen(o->r.warning)));
    }
    if (!bad && o->server_error) {
        bad |= json_object_set_new(e, "python_grader_server_error", json_true());
        bad |= json_object_set_new(e, "python_grader_server_error_type", json_string("sandbox_unavailable"));
    }
    if (!bad && o->sample_not_json) bad |= json_object_set_new(e, "sample_parse_error", json_true());
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* scores: every score of the stage by its metric name (a job's rewards/<name>);
 * sub_rewards: a multi's sub-graders'. null for one that failed. */
static int scores_objects(const struct reward_stage *stage, const struct run_outcome *o, json_t **scores,
                          json_t **subs) {
    *scores = json_object();
    *subs = json_object();
    if (!*scores || !*subs) return -1;
    if (o->server_error) return 0; /* nothing was scored */
    int n = reward_stage_count(stage), bad = 0;
    for (int i = 0; i < n; i++) {
        bad |= json_object_set_new(*scores, reward_stage_name(stage, i), number_or_null(o->r.scores[i]));
        if (i > 0) bad |= json_object_set_new(*subs, reward_stage_name(stage, i), number_or_null(o->r.scores[i]));
    }
    return bad ? -1 : 0;
}

static json_t *error_message(const struct run_outcome *o) {
    if (o->server_error) return json_string_lossy(o->server_message, strlen(o->server_message));
    if (o->r.failed) return json_string_lossy(o->r.error, strlen(o->r.error));
    return json_null();
}

/* OpenAI's GraderRunResponse, plus smelt's metadata.error_message. NULL: out of memory. */
static json_t *run_answer(const json_t *grader, const struct reward_stage *stage, const struct run_outcome *o) {
    json_t *scores, *subs;
    if (scores_objects(stage, o, &scores, &subs)) {
        json_decref(scores);
        json_decref(subs);
        return NULL;
    }
    const char *type = json_string_value(json_object_get(grader, "type"));
    const char *name = json_string_value(json_object_get(grader, "name"));
    double reward = o->server_error || o->r.failed || !isfinite(o->r.reward) ? 0.0 : o->r.reward;
    /* "o" arguments are stolen even when packing fails (jansson >= 2.11) */
    json_t *meta = json_pack("{s:s, s:s, s:o, s:f, s:o, s:n, s:n, s:o}", "name", name ? name : type, "type", type,
                             "errors", errors_object(grader, stage, o), "execution_time", o->seconds, "scores",
                             scores, "token_usage", "sampled_model_name", "error_message", error_message(o));
    return json_pack("{s:f, s:o, s:o, s:{}}", "reward", reward, "metadata", meta, "sub_rewards", subs,
                     "model_grader_token_usage_per_model");
}

/* Scores the sample with the stage into *o. 0, or -1 with a 500 reply. */
static int run_stage(struct reward_stage *stage, const struct run_input *in, struct run_outcome *o,
                     struct http_response *res) {
    *o = (struct run_outcome){0};
    struct reward_sample sample = {.completion = in->model_sample, .answer = in->answer,
                                   .metadata_json = in->metadata_json};
    struct smelt_error err = {0};
    double t0 = now_s();
    int rc = reward_stage_score(stage, &sample, 1, &o->r, &err);
    o->seconds = now_s() - t0;
    if (rc == SMELT_ENOMEM || rc == SMELT_EINVAL) {
        http_reply_error(res, 500, NULL, rc == SMELT_ENOMEM ? "out_of_memory" : "server_error", "%s", err.message);
        return -1;
    }
    if (rc) { /* the sandboxes could not start: a server error of the grader, as OpenAI reports its own */
        o->server_error = true;
        snprintf(o->server_message, sizeof o->server_message, "%s", err.message);
        log_warn("graders run: %s", err.message);
    }
    json_t *parsed = json_loads(in->model_sample, JSON_DECODE_ANY, NULL);
    o->sample_not_json = !parsed;
    json_decref(parsed);
    return 0;
}

/* Runs the stage on the input and replies with the answer. */
static void run_and_reply(struct reward_stage *stage, const struct run_input *in, struct http_response *res) {
    json_t *grader = grader_read(stage, res);
    struct run_outcome o;
    if (grader && run_stage(stage, in, &o, res) == 0) {
        o.sample_not_json = o.sample_not_json && any_grader(grader, leaf_reads_json);
        json_t *answer = run_answer(grader, stage, &o);
        if (answer) http_reply_json(res, 200, answer);
        else http_reply_error(res, 500, NULL, "out_of_memory", "graders run: out of memory");
    }
    json_decref(grader);
}

/* Graders that only a job's trainer runs: an endpoint grader would have smeltd itself
 * call any URL a caller names (from inside the operator's network), and reward_model,
 * score_model and label_model graders need a model loaded in a trainer. 0, or -1 with a
 * 400 naming the type. */
static int refuse_job_only(const json_t *grader, const char *path, struct http_response *res) {
    const char *type = json_string_value(json_object_get(grader, "type"));
    if (type && (strcmp(type, "endpoint") == 0 || strcmp(type, "reward_model") == 0 ||
                 strcmp(type, "score_model") == 0 || strcmp(type, "label_model") == 0)) {
        char field[160];
        snprintf(field, sizeof field, "%s.type", path);
        http_reply_error(res, 400, field, "unsupported",
                         "%s: %s graders run only inside a job (its trainer %s); /run does not run them", field, type,
                         strcmp(type, "endpoint") == 0 ? "calls the service, smeltd never does" : "loads the model");
        return -1;
    }
    const char *key;
    const json_t *sub;
    json_object_foreach((json_t *)json_object_get(grader, "graders"), key, sub) {
        char sub_path[128];
        snprintf(sub_path, sizeof sub_path, "%s.graders.%.64s", path, key);
        if (refuse_job_only(sub, sub_path, res)) return -1;
    }
    return 0;
}

void api_graders_run(void *app, struct http_request *req, struct http_response *res) {
    static const char *const keys[] = {"grader", "model_sample", "item", NULL};
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    struct run_input in = {0};
    bool python = false;
    struct reward_stage *stage = NULL;
    /* the cheap checks first: a python grader's is a sandbox started */
    if (check_keys(body, keys, res) == 0 && read_input(body, &in, res) == 0 &&
        refuse_job_only(json_object_get(body, "grader"), "grader", res) == 0)
        stage = read_grader(s, body, &python, res);
    if (stage) run_and_reply(stage, &in, res);
    run_input_free(&in);
    reward_stage_free(stage);
    release_python_slot(s, python);
    json_decref(body);
}
