/* server/api_graders.c: POST /v1/fine_tuning/alpha/graders/validate and /run called as the
 * HTTP layer calls them (a request with its body, a response to fill). Each answer is
 * OpenAI's shape with the numbers the reward stage computes (hand-computed here), the
 * item read as a reinforcement job reads a training row, per-sample failures as OpenAI's
 * error flags, and every refusal a 400 naming the field. Python graders run where a
 * sandbox can (skipped elsewhere); the cap on python graders at once needs none. */
#include "tests/unit/testutil.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server_internal.h"

#define VALIDATE "/v1/fine_tuning/alpha/graders/validate"
#define RUN "/v1/fine_tuning/alpha/graders/run"

static struct server g_s; /* what the handlers read of it: config.http_threads, the python slots */

struct answer {
    int status;
    json_t *body;     /* parsed; the test frees it */
    char retry_after[16];
};

static struct answer call(const char *path, const char *body) {
    struct http_request req = {.method = "POST", .path = path, .body = body, .body_len = strlen(body)};
    struct http_response res = {0};
    if (strcmp(path, RUN) == 0) api_graders_run(&g_s, &req, &res);
    else api_graders_validate(&g_s, &req, &res);
    struct answer a = {.status = res.status};
    json_error_t jerr;
    a.body = json_loadb(res.body, res.body_len, 0, &jerr);
    cr_assert(a.body, "%s answered %d with a body that is not JSON: %.200s", path, res.status, res.body);
    for (int i = 0; i < res.n_headers; i++)
        if (strcmp(res.headers[i].name, "Retry-After") == 0)
            snprintf(a.retry_after, sizeof a.retry_after, "%s", res.headers[i].value);
    free(res.body);
    return a;
}

/* A run that must answer 200; the test frees the body. */
static json_t *run_ok(const char *body) {
    struct answer a = call(RUN, body);
    cr_assert_eq(a.status, 200, "run %s answered %d: %s", body, a.status, json_dumps(a.body, 0));
    return a.body;
}

/* A request that must be refused with 400 naming param. */
static void expect_refused(const char *path, const char *body, const char *param) {
    struct answer a = call(path, body);
    const json_t *e = json_object_get(a.body, "error");
    cr_expect_eq(a.status, 400, "%s %s answered %d", path, body, a.status);
    cr_expect_str_eq(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    const char *got = json_string_value(json_object_get(e, "param"));
    cr_expect(got && strcmp(got, param) == 0, "%s %s: param %s, expected %s (%s)", path, body, got ? got : "null",
              param, json_string_value(json_object_get(e, "message")));
    json_decref(a.body);
}

static double number(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    cr_assert(json_is_number(v), "%s is not a number", key);
    return json_number_value(v);
}

static const json_t *meta(const json_t *answer) { return json_object_get(answer, "metadata"); }

static bool flag(const json_t *answer, const char *name) {
    const json_t *v = json_object_get(json_object_get(meta(answer), "errors"), name);
    cr_assert(json_is_boolean(v), "errors.%s is not a boolean", name);
    return json_is_true(v);
}

/* Every flag of OpenAI's errors object false but those named (NULL-terminated). */
static void expect_flags(const json_t *answer, const char *const *raised) {
    static const char *const all[] = {"formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
                                      "model_grader_refusal_error", "model_grader_server_error", "other_error",
                                      "python_grader_runtime_error", "python_grader_server_error",
                                      "sample_parse_error", "truncated_observation_error",
                                      "unresponsive_reward_error", NULL};
    for (int k = 0; all[k]; k++) {
        bool want = false;
        for (int j = 0; raised[j]; j++) want |= strcmp(raised[j], all[k]) == 0;
        cr_expect_eq(flag(answer, all[k]), want, "errors.%s is %d", all[k], !want);
    }
}

static const char *const NONE[] = {NULL};

static void api_setup(void) {
    memset(&g_s, 0, sizeof g_s);
    g_s.config.http_threads = 4; /* two python graders at once */
}

TestSuite(graders_api, .init = api_setup);

/* ---- validate ---- */

Test(graders_api, validate_answers_the_grader_as_smelt_reads_it) {
    const char *multi = "{\"type\":\"multi\",\"name\":\"m\",\"graders\":{"
                        "\"exact\":{\"type\":\"string_check\",\"name\":\"e\",\"input\":\"{{sample.output_text}}\","
                        "\"reference\":\"{{item.answer}}\",\"operation\":\"ilike\"},"
                        "\"close\":{\"type\":\"text_similarity\",\"input\":\"{{sample.output_text}}\","
                        "\"reference\":\"{{item.answer}}\",\"evaluation_metric\":\"rouge_l\",\"pass_threshold\":0.5}},"
                        "\"calculate_output\":\"0.5 * exact + 0.5 * close\"}";
    char body[2048];
    snprintf(body, sizeof body, "{\"grader\":%s}", multi);
    struct answer a = call(VALIDATE, body);
    cr_assert_eq(a.status, 200, "%s", json_dumps(a.body, 0));
    json_t *want = json_loads(multi, 0, NULL);
    cr_assert(want);
    cr_expect(json_equal(json_object_get(a.body, "grader"), want), "validate answered %s", json_dumps(a.body, 0));
    cr_expect_eq(json_object_size(a.body), 1);
    json_decref(want);
    json_decref(a.body);
}

Test(graders_api, validate_refusals_name_the_field) {
    expect_refused(VALIDATE,
                   "{\"grader\":{\"type\":\"multi\",\"graders\":{\"acc\":{\"type\":\"string_check\",\"input\":\"a\","
                   "\"reference\":\"b\",\"operation\":\"contains\"}},\"calculate_output\":\"acc\"}}",
                   "grader.graders.acc.operation");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"score_model\",\"name\":\"s\",\"input\":[],\"model\":\"m\"}}",
                   "grader.input");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"label_model\"}}", "grader.model");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"fancy\"}}", "grader.type");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"text_similarity\",\"input\":\"a\",\"reference\":\"b\","
                             "\"evaluation_metric\":\"cosine\"}}", "grader.evaluation_metric");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"string_check\",\"input\":\"{{item.a\",\"reference\":\"b\","
                             "\"operation\":\"eq\"}}", "grader.input");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"multi\",\"graders\":{\"a\":{\"type\":\"string_check\","
                             "\"input\":\"a\",\"reference\":\"b\",\"operation\":\"eq\"}},\"calculate_output\":\"a +\"}}",
                   "grader.calculate_output");
    expect_refused(VALIDATE, "{\"grader\":\"string_check\"}", "grader");
    expect_refused(VALIDATE, "{}", "grader");
    expect_refused(VALIDATE, "{\"grader\":null}", "grader");
    expect_refused(VALIDATE, "{\"grader\":{\"type\":\"string_check\",\"input\":\"a\",\"reference\":\"b\","
                             "\"operation\":\"eq\"},\"model_sample\":\"x\"}", "model_sample");
}

Test(graders_api, a_body_that_is_not_a_json_object_is_refused) {
    const char *bodies[] = {"", "{\"grader\":", "[1]", "\"grader\""};
    for (int i = 0; i < 4; i++) {
        struct answer a = call(i % 2 ? VALIDATE : RUN, bodies[i]);
        cr_expect_eq(a.status, 400, "body '%s' answered %d", bodies[i], a.status);
        cr_expect_str_eq(json_string_value(json_object_get(json_object_get(a.body, "error"), "type")),
                         "invalid_request_error");
        json_decref(a.body);
    }
}

/* ---- run ---- */

#define EXACT "{\"type\":\"string_check\",\"name\":\"exact\",\"input\":\"{{sample.output_text}}\"," \
              "\"reference\":\"{{item.reference_answer}}\",\"operation\":\"eq\"}"

Test(graders_api, run_string_check_answers_openais_shape) {
    json_t *a = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"Paris\",\"item\":{\"reference_answer\":\"Paris\"}}");
    cr_expect_eq(number(a, "reward"), 1.0);
    cr_expect_str_eq(json_string_value(json_object_get(meta(a), "name")), "exact");
    cr_expect_str_eq(json_string_value(json_object_get(meta(a), "type")), "string_check");
    cr_expect(number(meta(a), "execution_time") >= 0.0);
    cr_expect_eq(number(json_object_get(meta(a), "scores"), "string_check"), 1.0);
    cr_expect(json_is_null(json_object_get(meta(a), "token_usage")));
    cr_expect(json_is_null(json_object_get(meta(a), "sampled_model_name")));
    cr_expect(json_is_null(json_object_get(meta(a), "error_message")));
    cr_expect_eq(json_object_size(json_object_get(a, "sub_rewards")), 0);
    cr_expect(json_is_object(json_object_get(a, "model_grader_token_usage_per_model")));
    expect_flags(a, NONE);
    const json_t *e = json_object_get(meta(a), "errors");
    cr_expect(json_is_null(json_object_get(e, "python_grader_runtime_error_details")));
    cr_expect(json_is_null(json_object_get(e, "python_grader_server_error_type")));
    cr_expect(json_is_null(json_object_get(e, "model_grader_server_error_details")));
    json_decref(a);
    a = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"paris\",\"item\":{\"reference_answer\":\"Paris\"}}");
    cr_expect_eq(number(a, "reward"), 0.0);
    expect_flags(a, NONE);
    json_decref(a);
}

/* rapidfuzz's ratio: 1 - indel distance / (6 + 7); kitten and sitting share "ittn", so
 * the distance is 6 + 7 - 2 * 4 = 5 and the score 8/13. */
Test(graders_api, run_text_similarity_gives_the_hand_computed_score) {
    json_t *a = run_ok("{\"grader\":{\"type\":\"text_similarity\",\"name\":\"close\",\"input\":\"{{sample.output_text}}\","
                       "\"reference\":\"{{item.word}}\",\"evaluation_metric\":\"fuzzy_match\"},"
                       "\"model_sample\":\"kitten\",\"item\":{\"word\":\"sitting\"}}");
    cr_expect(fabs(number(a, "reward") - 8.0 / 13.0) < 1e-12, "reward %.17g", number(a, "reward"));
    cr_expect_str_eq(json_string_value(json_object_get(meta(a), "type")), "text_similarity");
    json_decref(a);
}

#define MULTI(formula) "{\"type\":\"multi\",\"graders\":{\"exact\":" EXACT ",\"close\":{\"type\":\"text_similarity\"," \
                       "\"input\":\"{{sample.output_text}}\",\"reference\":\"{{item.reference_answer}}\"," \
                       "\"evaluation_metric\":\"fuzzy_match\"}},\"calculate_output\":\"" formula "\"}"

/* " 37" against " 037": ratio 2 * 3 / 7 = 6/7; the reward 0.8 * 0 + 0.2 * 6/7. */
Test(graders_api, run_multi_gives_sub_rewards_and_the_formula) {
    json_t *a = run_ok("{\"grader\":" MULTI("0.8 * exact + 0.2 * close")
                       ",\"model_sample\":\" 37\",\"item\":{\"reference_answer\":\" 037\"}}");
    const json_t *subs = json_object_get(a, "sub_rewards"), *scores = json_object_get(meta(a), "scores");
    cr_expect_eq(json_object_size(subs), 2);
    cr_expect_eq(number(subs, "exact"), 0.0);
    cr_expect(fabs(number(subs, "close") - 6.0 / 7.0) < 1e-12);
    cr_expect(fabs(number(a, "reward") - 0.2 * 6.0 / 7.0) < 1e-12, "reward %.17g", number(a, "reward"));
    cr_expect(fabs(number(scores, "multi") - number(a, "reward")) < 1e-15);
    cr_expect_eq(number(scores, "exact"), 0.0);
    cr_expect_str_eq(json_string_value(json_object_get(meta(a), "type")), "multi");
    expect_flags(a, NONE);
    json_decref(a);
}

Test(graders_api, a_formula_dividing_by_zero_is_an_other_error_with_its_message) {
    json_t *a = run_ok("{\"grader\":" MULTI("close / exact")
                       ",\"model_sample\":\"x\",\"item\":{\"reference_answer\":\"y\"}}");
    cr_expect_eq(number(a, "reward"), 0.0);
    expect_flags(a, (const char *const[]){"other_error", NULL});
    const char *msg = json_string_value(json_object_get(meta(a), "error_message"));
    cr_expect(msg && strstr(msg, "division by zero"), "error_message %s", msg ? msg : "null");
    cr_expect(json_is_null(json_object_get(json_object_get(meta(a), "scores"), "multi")));
    cr_expect_eq(number(json_object_get(a, "sub_rewards"), "exact"), 0.0);
    json_decref(a);
}

Test(graders_api, a_missing_item_field_is_an_invalid_variable_error_naming_it) {
    json_t *a = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"Paris\",\"item\":{\"answer\":\"Paris\"}}");
    cr_expect_eq(number(a, "reward"), 0.0);
    expect_flags(a, (const char *const[]){"invalid_variable_error", NULL});
    const char *msg = json_string_value(json_object_get(meta(a), "error_message"));
    cr_expect(msg && strstr(msg, "{{item.reference_answer}}") && strstr(msg, "no field"), "error_message %s",
              msg ? msg : "null");
    cr_expect(json_is_null(json_object_get(json_object_get(meta(a), "scores"), "string_check")));
    json_decref(a);
    /* no item at all: the same failure */
    a = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"Paris\"}");
    expect_flags(a, (const char *const[]){"invalid_variable_error", NULL});
    json_decref(a);
    /* in a multi: the failing sub-grader is null, the flag the same */
    a = run_ok("{\"grader\":" MULTI("exact + close") ",\"model_sample\":\"Paris\",\"item\":{}}");
    expect_flags(a, (const char *const[]){"invalid_variable_error", NULL});
    cr_expect(json_is_null(json_object_get(json_object_get(a, "sub_rewards"), "exact")));
    json_decref(a);
}

/* The item is a training row: its messages (and tools) are the prompt, not grader data,
 * exactly as in a reinforcement job; its other fields, nested ones too, and a string
 * "answer" are. */
Test(graders_api, the_item_is_read_as_a_jobs_training_row) {
    const char *row = "\"item\":{\"messages\":[{\"role\":\"user\",\"content\":\"capital?\"}],\"tools\":[],"
                      "\"answer\":\"Paris\",\"meta\":{\"city\":[\"Lyon\",\"Paris\"]}}";
    char body[1024];
    snprintf(body, sizeof body, "{\"grader\":{\"type\":\"string_check\",\"input\":\"{{sample.output_text}}\","
                                "\"reference\":\"{{item.answer}}/{{item.meta.city[1]}}\",\"operation\":\"eq\"},"
                                "\"model_sample\":\"Paris/Paris\",%s}", row);
    json_t *a = run_ok(body);
    cr_expect_eq(number(a, "reward"), 1.0);
    expect_flags(a, NONE);
    json_decref(a);
    snprintf(body, sizeof body, "{\"grader\":{\"type\":\"string_check\",\"input\":\"{{item.messages}}\","
                                "\"reference\":\"x\",\"operation\":\"eq\"},\"model_sample\":\"x\",%s}", row);
    a = run_ok(body);
    expect_flags(a, (const char *const[]){"invalid_variable_error", NULL});
    json_decref(a);
}

Test(graders_api, a_sample_that_is_not_json_read_as_output_json_is_a_sample_parse_error) {
    const char *grader = "{\"grader\":{\"type\":\"string_check\",\"input\":\"{{ sample.output_json.city }}\","
                         "\"reference\":\"{{item.city}}\",\"operation\":\"eq\"},\"item\":{\"city\":\"Paris\"},";
    char body[512];
    snprintf(body, sizeof body, "%s\"model_sample\":\"Paris\"}", grader);
    json_t *a = run_ok(body);
    cr_expect_eq(number(a, "reward"), 0.0);
    expect_flags(a, (const char *const[]){"sample_parse_error", NULL});
    json_decref(a);
    snprintf(body, sizeof body, "%s\"model_sample\":\"{\\\"city\\\": \\\"Paris\\\"}\"}", grader);
    a = run_ok(body);
    cr_expect_eq(number(a, "reward"), 1.0);
    expect_flags(a, NONE);
    json_decref(a);
    /* a sample that is not JSON, read only as text: no flag */
    a = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"{oops\",\"item\":{\"reference_answer\":\"{oops\"}}");
    expect_flags(a, NONE);
    json_decref(a);
}

Test(graders_api, run_refusals_name_the_field) {
    expect_refused(RUN, "{\"grader\":" EXACT "}", "model_sample");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":null}", "model_sample");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":3}", "model_sample");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":\"a\",\"item\":[1]}", "item");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":\"a\",\"item\":\"Paris\"}", "item");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":\"a\",\"item\":{\"n\":[1, 1e300]}}", "item.n[1]");
    expect_refused(RUN, "{\"grader\":" EXACT ",\"model_sample\":\"a\",\"sample\":\"b\"}", "sample");
    expect_refused(RUN, "{\"model_sample\":\"a\"}", "grader");
    expect_refused(RUN, "{\"grader\":{\"type\":\"string_check\",\"input\":\"{{sample.output_text}}\","
                        "\"reference\":\"x\",\"operation\":\"eq\",\"shape\":1},\"model_sample\":\"a\"}",
                   "grader.shape");
    expect_refused(RUN, "{\"grader\":{\"type\":\"score_model\"},\"model_sample\":\"a\"}", "grader.type");
    /* smeltd never calls a caller's URL: endpoint graders run only in a job's trainer */
    expect_refused(RUN, "{\"grader\":{\"type\":\"endpoint\",\"url\":\"http://127.0.0.1:9/\"},\"model_sample\":\"a\"}",
                   "grader.type");
    expect_refused(RUN, "{\"grader\":{\"type\":\"multi\",\"graders\":{\"ok\":" EXACT ",\"ep\":{\"type\":"
                        "\"endpoint\",\"url\":\"http://127.0.0.1:9/\"}},\"calculate_output\":\"ok\"},"
                        "\"model_sample\":\"a\"}",
                   "grader.graders.ep.type");
}

/* ---- python graders ---- */

#define PY_SCORE "def grade(sample, item):\\n    return len(sample['output_text']) / len(item['word'])\\n"

/* Half the HTTP threads (here 2 of 4) may sit in sandboxes; the next python grader is
 * told to retry, the other graders are served. No sandbox is started: the slot is
 * claimed before the grader is read. */
Test(graders_api, python_graders_beyond_half_the_http_threads_are_told_to_retry) {
    atomic_store(&g_s.grader_python_runs, 2);
    struct answer a = call(RUN, "{\"grader\":{\"type\":\"python\",\"source\":\"" PY_SCORE "\"},\"model_sample\":\"x\"}");
    cr_expect_eq(a.status, 429);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(a.body, "error"), "type")), "rate_limit_error");
    cr_expect_str_eq(a.retry_after, "1");
    json_decref(a.body);
    a = call(VALIDATE, "{\"grader\":{\"type\":\"multi\",\"graders\":{\"p\":{\"type\":\"python\",\"source\":\"" PY_SCORE
                       "\"}},\"calculate_output\":\"p\"}}");
    cr_expect_eq(a.status, 429);
    json_decref(a.body);
    json_t *ok = run_ok("{\"grader\":" EXACT ",\"model_sample\":\"a\",\"item\":{\"reference_answer\":\"a\"}}");
    json_decref(ok);
    cr_expect_eq(atomic_load(&g_s.grader_python_runs), 2, "a refused request left the count changed");
}

/* A python grader's run where a sandbox can run; NULL (the test skipped) elsewhere. */
static json_t *python_run(const char *body) {
    if (access("/usr/bin/bwrap", X_OK) != 0) cr_skip_test("no bubblewrap: python graders cannot run here");
    struct answer a = call(RUN, body);
    const char *msg = json_string_value(json_object_get(json_object_get(a.body, "error"), "message"));
    if (a.status == 400 && msg && strstr(msg, "cannot run on this machine")) cr_skip_test("no sandbox here: %s", msg);
    cr_assert_eq(a.status, 200, "%s", json_dumps(a.body, 0));
    cr_expect_eq(atomic_load(&g_s.grader_python_runs), 0, "the python slot was not given back");
    return a.body;
}

Test(graders_api, a_python_grader_scores_the_sample_and_the_item, .timeout = 60) {
    json_t *a = python_run("{\"grader\":{\"type\":\"python\",\"name\":\"len\",\"source\":\"" PY_SCORE "\"},"
                           "\"model_sample\":\"abc\",\"item\":{\"word\":\"abcd\",\"messages\":[]}}");
    cr_expect_eq(number(a, "reward"), 0.75);
    cr_expect_str_eq(json_string_value(json_object_get(meta(a), "name")), "len");
    cr_expect_eq(number(json_object_get(meta(a), "scores"), "python"), 0.75);
    expect_flags(a, NONE);
    json_decref(a);
}

Test(graders_api, a_python_grader_that_raises_scores_0_with_the_runtime_error, .timeout = 60) {
    json_t *a = python_run("{\"grader\":{\"type\":\"python\",\"source\":\"def grade(sample, item):\\n"
                           "    raise ValueError('no luck')\\n\"},\"model_sample\":\"abc\"}");
    cr_expect_eq(number(a, "reward"), 0.0);
    expect_flags(a, (const char *const[]){"python_grader_runtime_error", NULL});
    const char *details =
        json_string_value(json_object_get(json_object_get(meta(a), "errors"), "python_grader_runtime_error_details"));
    cr_expect(details && strstr(details, "ValueError: no luck"), "details %s", details ? details : "null");
    cr_expect(json_is_null(json_object_get(meta(a), "error_message")));
    json_decref(a);
}
