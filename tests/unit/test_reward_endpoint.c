/* The endpoint grader (rewards/endpoint_grader.c, endpoint_http.c) against a real HTTP
 * server in the test (server/http.h: libmicrohttpd on 127.0.0.1, an ephemeral port)
 * whose behaviour each test sets: good rewards computed from what was sent (so the
 * request's fields are checked too), chunks of 256 samples, garbage, a reply without
 * "rewards", the wrong length, a null, a string, 500 then 200 (retried, counted), 503
 * every time (max_retries + 1 requests), 429 with Retry-After (honoured), 400 (not
 * retried), a redirect (not followed), a reply slower than timeout_s (fails in about
 * timeout_s), a reply over 16 MiB, connection refused; proxies in the environment never
 * used for 127.0.0.1; a multi combining endpoint and string_check; every refused spec
 * with its field; the spec written back. */
#include <criterion/criterion.h>

#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "rewards/rewards.h"
#include "rewards_testutil.h"
#include "server/http.h"

enum mode {
    GOOD,          /* rewards[k] = strlen(completion) + item.bonus (0 without) */
    GARBAGE,       /* 200 with bytes that are not JSON */
    NO_REWARDS,    /* 200 {"scores": [...]} */
    SHORT,         /* one reward too few */
    NULL_AT_1,     /* rewards[1] null */
    STRING_AT_0,   /* rewards[0] "1" */
    FAIL_ONCE,     /* 500 on the first request, then GOOD */
    ALWAYS_503,    /* 503 with Retry-After: 0 */
    RATE_LIMITED,  /* 429 with Retry-After: 1 on the first request, then GOOD */
    BAD_REQUEST,   /* 400 {"error": "no such task"} */
    REDIRECT,      /* 302 to /elsewhere */
    SLOW,          /* GOOD after 2 s (or when the test releases it) */
    HUGE,          /* 200 with 17 MiB */
};

static struct http_server *g_server;
static atomic_int g_mode, g_requests, g_largest_request, g_release;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static json_t *g_last_body;         /* the last request's body (under g_lock) */
static char g_last_auth[128];       /* its Authorization header */

/* ---- the service ---- */

static json_t *good_rewards(const json_t *samples) {
    json_t *rewards = json_array();
    for (size_t k = 0; k < json_array_size(samples); k++) {
        const json_t *s = json_array_get(samples, k);
        double r = (double)strlen(json_string_value(json_object_get(s, "completion")));
        const json_t *bonus = json_object_get(json_object_get(s, "item"), "bonus");
        json_array_append_new(rewards, json_real(r + (json_is_number(bonus) ? json_number_value(bonus) : 0.0)));
    }
    return rewards;
}

static void remember(const struct http_request *req, json_t *body) {
    pthread_mutex_lock(&g_lock);
    json_decref(g_last_body);
    g_last_body = json_incref(body);
    const char *auth = http_header(req, "Authorization");
    snprintf(g_last_auth, sizeof g_last_auth, "%s", auth ? auth : "");
    pthread_mutex_unlock(&g_lock);
    int n = (int)json_array_size(json_object_get(body, "samples"));
    for (int seen = atomic_load(&g_largest_request); n > seen;) atomic_compare_exchange_weak(&g_largest_request, &seen, n);
}

static void reply_text(struct http_response *res, int status, const char *text) {
    http_reply_text(res, status, "application/json", text, strlen(text));
}

/* The modes that answer without reading the samples; false for the others. */
static bool reply_fixed(int mode, int nth, struct http_response *res) {
    switch (mode) {
    case GARBAGE: reply_text(res, 200, "this is not JSON \x01\xff <html>"); return true;
    case ALWAYS_503: reply_text(res, 503, "{\"error\": \"overloaded\"}"); http_add_header(res, "Retry-After", "0"); return true;
    case BAD_REQUEST: reply_text(res, 400, "{\"error\": \"no such task\"}"); return true;
    case REDIRECT: reply_text(res, 302, ""); http_add_header(res, "Location", "/elsewhere"); return true;
    case FAIL_ONCE: if (nth == 1) reply_text(res, 500, "{\"error\": \"warming up\"}"); return nth == 1;
    case RATE_LIMITED:
        if (nth == 1) {
            reply_text(res, 429, "{\"error\": \"slow down\"}");
            http_add_header(res, "Retry-After", "1");
        }
        return nth == 1;
    case HUGE: {
        size_t n = 17u << 20;
        char *big = malloc(n);
        cr_assert(big);
        memset(big, ' ', n);
        http_reply_text(res, 200, "application/json", big, n);
        free(big);
        return true;
    }
    default: return false;
    }
}

static void h_reward(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    int nth = atomic_fetch_add(&g_requests, 1) + 1, mode = atomic_load(&g_mode);
    json_t *body = json_loadb(req->body, req->body_len, 0, NULL);
    if (!body) {
        reply_text(res, 422, "{\"error\": \"the request is not JSON\"}");
        return;
    }
    remember(req, body);
    if (mode == SLOW)
        for (int t = 0; t < 40 && !atomic_load(&g_release); t++) usleep(50 * 1000);
    if (!reply_fixed(mode, nth, res)) {
        json_t *rewards = good_rewards(json_object_get(body, "samples"));
        if (mode == SHORT) json_array_remove(rewards, 0);
        if (mode == NULL_AT_1) json_array_set_new(rewards, 1, json_null());
        if (mode == STRING_AT_0) json_array_set_new(rewards, 0, json_string("1"));
        http_reply_json(res, 200, json_pack("{s:o}", mode == NO_REWARDS ? "scores" : "rewards", rewards));
    }
    json_decref(body);
}

static void server_up(void) {
    static const struct http_route ROUTES[] = {{"POST", "/reward", h_reward, HTTP_PUBLIC}};
    log_set_level(LOG_LEVEL_ERROR);
    struct http_config config = {.listen_address = "127.0.0.1", .threads = 4, .max_body_bytes = 4u << 20,
                                 .routes = ROUTES, .n_routes = 1};
    struct smelt_error err = {0};
    cr_assert_eq(http_server_start(&config, &g_server, &err), 0, "%s", err.message);
}

static void server_down(void) {
    atomic_store(&g_release, 1);
    http_server_stop(g_server);
    json_decref(g_last_body);
}

TestSuite(reward_endpoint, .init = server_up, .fini = server_down, .timeout = 30);

/* ---- helpers ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A spec of one endpoint grader at the test's server, with more fields (", ..." or ""). */
static char *spec_of(const char *more) {
    static char spec[1024];
    snprintf(spec, sizeof spec, "{\"grader\": {\"type\": \"endpoint\", \"url\": \"http://127.0.0.1:%d/reward\"%s}}",
             http_server_port(g_server), more);
    return spec;
}

/* n samples: completion "x" repeated i + 1 times, the row's answer "a<i>", metadata
 * {"bonus": i / 10}. Borrowed texts live in static storage until the next call. */
#define MAX_SAMPLES 300
static struct reward_sample *samples_of(int n) {
    static struct reward_sample s[MAX_SAMPLES];
    static char completion[MAX_SAMPLES][MAX_SAMPLES + 1], answer[MAX_SAMPLES][16], meta[MAX_SAMPLES][32];
    cr_assert(n <= MAX_SAMPLES);
    for (int i = 0; i < n; i++) {
        memset(completion[i], 'x', (size_t)i + 1);
        completion[i][i + 1] = '\0';
        snprintf(answer[i], sizeof answer[i], "a%d", i);
        snprintf(meta[i], sizeof meta[i], "{\"bonus\": %g}", i / 10.0);
        s[i] = (struct reward_sample){.prompt_rendered = "Say x.", .completion = completion[i], .answer = answer[i],
                                      .metadata_json = meta[i], .n_completion_tokens = i + 1,
                                      .finish_reason = "stop"};
    }
    return s;
}

/* Scores n samples with spec under mode; the call itself must succeed. */
static void score_with(const char *spec, int mode, int n, struct reward_result *out) {
    atomic_store(&g_mode, mode);
    atomic_store(&g_requests, 0);
    struct reward_stage *st = rewards_test_stage(spec);
    struct smelt_error err = {0};
    memset(out, 0xff, (size_t)n * sizeof *out);
    cr_assert_eq(reward_stage_score(st, samples_of(n), n, out, &err), SMELT_OK, "%s", err.message);
    reward_stage_free(st);
}

static void expect_good(const struct reward_result *r, int i) {
    cr_assert(!r->failed, "sample %d failed: %s", i, r->error);
    cr_expect_float_eq(r->reward, (i + 1) + i / 10.0, 1e-12, "sample %d: %g", i, r->reward);
    cr_expect_eq(r->scores[0], r->reward);
    cr_expect_str_empty(r->warning);
}

/* Every one of n results failed with exactly message. */
static void expect_all_failed(const struct reward_result *r, int n, const char *message) {
    for (int i = 0; i < n; i++) {
        cr_assert(r[i].failed, "sample %d scored %g, expected a failure", i, r[i].reward);
        cr_expect(isnan(r[i].reward) && isnan(r[i].scores[0]));
        cr_expect_str_eq(r[i].error, message);
    }
}

/* ---- good replies ---- */

Test(reward_endpoint, good_rewards_and_what_the_service_gets) {
    struct reward_result r[3];
    score_with(spec_of(", \"headers\": {\"Authorization\": \"Bearer sk-test\", \"X-Empty\": \"\"}"), GOOD, 3, r);
    for (int i = 0; i < 3; i++) expect_good(&r[i], i);
    cr_expect_eq(atomic_load(&g_requests), 1);
    pthread_mutex_lock(&g_lock);
    cr_expect_str_eq(g_last_auth, "Bearer sk-test");
    const json_t *s = json_array_get(json_object_get(g_last_body, "samples"), 2);
    cr_expect_str_eq(json_string_value(json_object_get(s, "prompt")), "Say x.");
    cr_expect_str_eq(json_string_value(json_object_get(s, "completion")), "xxx");
    cr_expect_str_eq(json_string_value(json_object_get(s, "finish_reason")), "stop");
    cr_expect_eq(json_integer_value(json_object_get(s, "n_completion_tokens")), 3);
    const json_t *item = json_object_get(s, "item");
    cr_expect_str_eq(json_string_value(json_object_get(item, "answer")), "a2");
    cr_expect_float_eq(json_number_value(json_object_get(item, "bonus")), 0.2, 1e-12);
    pthread_mutex_unlock(&g_lock);
}

Test(reward_endpoint, batches_go_in_requests_of_at_most_256_samples) {
    struct reward_result r[MAX_SAMPLES];
    score_with(spec_of(""), GOOD, MAX_SAMPLES, r);
    for (int i = 0; i < MAX_SAMPLES; i++) expect_good(&r[i], i);
    cr_expect_eq(atomic_load(&g_requests), 2);
    cr_expect_eq(atomic_load(&g_largest_request), 256);
}

Test(reward_endpoint, proxies_in_the_environment_are_not_used_for_loopback) {
    /* A proxy that refuses every connection: a request sent to it would fail. */
    setenv("http_proxy", "http://127.0.0.1:9", 1);
    setenv("HTTPS_PROXY", "http://127.0.0.1:9", 1);
    setenv("ALL_PROXY", "http://127.0.0.1:9", 1);
    setenv("no_proxy", "example.com", 1);
    struct reward_result r[2];
    score_with(spec_of(", \"max_retries\": 0"), GOOD, 2, r);
    for (int i = 0; i < 2; i++) expect_good(&r[i], i);
}

/* ---- bad replies fail the request's samples ---- */

Test(reward_endpoint, bad_replies_fail_every_sample_of_the_request) {
    static const struct {
        int mode;
        const char *message; /* its start */
    } CASES[] = {
        {GARBAGE, "grader (endpoint): the reply is not JSON (at byte 4): this is not JSON ?? <html>"},
        {NO_REWARDS, "grader (endpoint): the reply has no \"rewards\" array: {\"scores\":"},
        {SHORT, "grader (endpoint): the reply has 2 rewards for the request's 3 samples"},
    };
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        struct reward_result r[3];
        score_with(spec_of(""), CASES[c].mode, 3, r);
        cr_expect_eq(atomic_load(&g_requests), 1, "an answer is not retried");
        for (int i = 0; i < 3; i++)
            cr_expect(r[i].failed && isnan(r[i].reward) &&
                          strncmp(r[i].error, CASES[c].message, strlen(CASES[c].message)) == 0,
                      "mode %d, sample %d: %s", CASES[c].mode, i, r[i].error);
    }
}

Test(reward_endpoint, a_null_or_a_string_fails_that_sample_only) {
    struct reward_result r[3];
    score_with(spec_of(""), NULL_AT_1, 3, r);
    expect_good(&r[0], 0);
    expect_good(&r[2], 2);
    expect_all_failed(&r[1], 1, "grader (endpoint): the service gave no reward (rewards[1] is null)");
    score_with(spec_of(""), STRING_AT_0, 3, r);
    expect_all_failed(&r[0], 1, "grader (endpoint): rewards[0] is a string, expected a number or null");
    expect_good(&r[1], 1);
}

Test(reward_endpoint, a_reply_over_16_mib_fails) {
    struct reward_result r[1];
    score_with(spec_of(""), HUGE, 1, r);
    expect_all_failed(r, 1, "grader (endpoint): the reply is larger than 16777216 bytes");
    cr_expect_eq(atomic_load(&g_requests), 1);
}

/* ---- statuses, retries, timeouts ---- */

Test(reward_endpoint, a_500_is_retried) {
    struct reward_result r[2];
    score_with(spec_of(""), FAIL_ONCE, 2, r);
    for (int i = 0; i < 2; i++) expect_good(&r[i], i);
    cr_expect_eq(atomic_load(&g_requests), 2);
}

Test(reward_endpoint, a_503_is_retried_max_retries_times_then_fails) {
    struct reward_result r[1];
    score_with(spec_of(", \"max_retries\": 3"), ALWAYS_503, 1, r);
    cr_expect_eq(atomic_load(&g_requests), 4);
    expect_all_failed(r, 1, "grader (endpoint): answered HTTP 503 (4 attempts): {\"error\": \"overloaded\"}");
}

Test(reward_endpoint, a_429_waits_for_retry_after) {
    struct reward_result r[1];
    double t0 = now_s();
    score_with(spec_of(", \"timeout_s\": 5"), RATE_LIMITED, 1, r);
    double took = now_s() - t0;
    expect_good(&r[0], 0);
    cr_expect_eq(atomic_load(&g_requests), 2);
    cr_expect(took >= 0.95 && took < 3.0, "took %.2f s, expected about Retry-After's 1 s", took);
}

Test(reward_endpoint, a_400_is_not_retried) {
    struct reward_result r[2];
    score_with(spec_of(""), BAD_REQUEST, 2, r);
    cr_expect_eq(atomic_load(&g_requests), 1);
    expect_all_failed(r, 2, "grader (endpoint): answered HTTP 400: {\"error\": \"no such task\"}");
}

Test(reward_endpoint, a_redirect_is_not_followed) {
    struct reward_result r[1];
    score_with(spec_of(""), REDIRECT, 1, r);
    cr_expect_eq(atomic_load(&g_requests), 1);
    expect_all_failed(r, 1, "grader (endpoint): answered HTTP 302, a redirect (not followed: give the final URL): "
                            "(empty body)");
}

Test(reward_endpoint, a_slow_service_fails_in_about_timeout_s) {
    struct reward_result r[2];
    double t0 = now_s();
    score_with(spec_of(", \"timeout_s\": 0.3"), SLOW, 2, r);
    double took = now_s() - t0;
    atomic_store(&g_release, 1);
    cr_expect(took >= 0.29 && took < 1.0, "took %.2f s, expected about 0.3 s", took);
    cr_expect_eq(atomic_load(&g_requests), 1, "a timed-out request is not retried");
    for (int i = 0; i < 2; i++) {
        cr_assert(r[i].failed);
        cr_expect(strstr(r[i].error, "grader (endpoint): no reply within timeout_s 0.3 s (1 attempt): "), "%s",
                  r[i].error);
    }
}

static int closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    cr_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd); /* bound, never listening, now closed: connections are refused */
    return ntohs(a.sin_port);
}

Test(reward_endpoint, connection_refused_is_retried_then_fails) {
    char spec[256];
    snprintf(spec, sizeof spec,
             "{\"grader\": {\"type\": \"endpoint\", \"url\": \"http://127.0.0.1:%d/reward\", \"max_retries\": 2}}",
             closed_port());
    struct reward_result r[2];
    double t0 = now_s();
    score_with(spec, GOOD, 2, r);
    double took = now_s() - t0;
    cr_expect(took >= 0.7 && took < 3.0, "took %.2f s: two backoffs of 0.25 and 0.5 s", took);
    for (int i = 0; i < 2; i++) {
        cr_assert(r[i].failed);
        cr_expect(strstr(r[i].error, "grader (endpoint): no reply (3 attempts): Failed to connect to 127.0.0.1 port"),
                  "%s", r[i].error);
    }
}

/* ---- in a multi ---- */

#define MULTI(url_more)                                                                                             \
    "{\"grader\": {\"type\": \"multi\", \"graders\": {\"ep\": {\"type\": \"endpoint\", \"url\": \"http://127.0.0.1:%d" \
    "/reward\"" url_more "}, \"exact\": {\"type\": \"string_check\", \"input\": \"{{sample.output_text}}\", "        \
    "\"reference\": \"x\", \"operation\": \"eq\"}}, \"calculate_output\": \"0.5 * ep + exact\"}}"

Test(reward_endpoint, a_multi_combines_endpoint_and_string_check) {
    char spec[600];
    snprintf(spec, sizeof spec, MULTI(""), http_server_port(g_server));
    struct reward_stage *st = rewards_test_stage(spec);
    cr_expect_eq(reward_stage_count(st), 3);
    cr_expect_str_eq(reward_stage_name(st, 0), "multi");
    cr_expect_str_eq(reward_stage_name(st, 1), "ep");
    cr_expect_str_eq(reward_stage_name(st, 2), "exact");
    reward_stage_free(st);
    struct reward_result r[2];
    score_with(spec, GOOD, 2, r);
    cr_expect_float_eq(r[0].scores[1], 1.0, 1e-12);
    cr_expect_float_eq(r[0].scores[2], 1.0, 1e-12);
    cr_expect_float_eq(r[0].reward, 1.5, 1e-12);
    cr_expect_float_eq(r[1].scores[1], 2.1, 1e-12);
    cr_expect_float_eq(r[1].scores[2], 0.0, 1e-12);
    cr_expect_float_eq(r[1].reward, 1.05, 1e-12);
    score_with(spec, BAD_REQUEST, 2, r);
    for (int i = 0; i < 2; i++) {
        cr_assert(r[i].failed);
        cr_expect_str_eq(r[i].error, "grader.graders.ep (endpoint): answered HTTP 400: {\"error\": \"no such task\"}");
        cr_expect(isnan(r[i].scores[1]));
        cr_expect_float_eq(r[i].scores[2], i == 0 ? 1.0 : 0.0, 1e-12, "the string_check still scores");
    }
}

/* ---- the spec ---- */

Test(reward_endpoint, spec_written_back_with_defaults) {
    struct reward_stage *st =
        rewards_test_stage("{\"grader\": {\"type\": \"endpoint\", \"name\": \"svc\", \"url\": \"https://rm.example/v1\","
                           " \"headers\": {\"Authorization\": \"Bearer k\"}}}");
    json_t *out = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_to_json(st, &out, &err), SMELT_OK, "%s", err.message);
    char *text = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
    cr_expect_str_eq(text, "{\"grader\":{\"headers\":{\"Authorization\":\"Bearer k\"},\"max_retries\":2,\"name\":"
                           "\"svc\",\"timeout_s\":30.0,\"type\":\"endpoint\",\"url\":\"https://rm.example/v1\"}}");
    struct reward_stage *again = NULL;
    cr_expect_eq(reward_stage_create(out, "reward", &again, &err), SMELT_OK, "%s", err.message);
    free(text);
    json_decref(out);
    reward_stage_free(again);
    reward_stage_free(st);
}

#define EP(fields) "{\"grader\": {\"type\": \"endpoint\"" fields "}}"
#define URL ", \"url\": \"http://127.0.0.1:1/r\""

Test(reward_endpoint, refused_specs_name_the_field) {
    rewards_test_refused(EP(""), "grader.url", "reward.grader: missing required field 'url'");
    rewards_test_refused(EP(", \"url\": 3"), "grader.url", "url");
    rewards_test_refused(EP(", \"url\": \"ftp://h/x\""), "grader.url",
                   "reward.grader.url: \"ftp://h/x\" is not an http:// or https:// URL");
    rewards_test_refused(EP(", \"url\": \"file:///etc/passwd\""), "grader.url", "is not an http:// or https:// URL");
    rewards_test_refused(EP(", \"url\": \"127.0.0.1:8000/r\""), "grader.url", "is not an http:// or https:// URL");
    rewards_test_refused(EP(", \"url\": \"http://\""), "grader.url", "reward.grader.url: ");
    rewards_test_refused(EP(", \"url\": \"http://h/a b\""), "grader.url", "holds a space");
    rewards_test_refused(EP(", \"url\": \"http://h:99999/\""), "grader.url", "not a URL libcurl can use");
    rewards_test_refused(EP(", \"url\": \"https://me:pw@h/\""), "grader.url", "user name or password");
    rewards_test_refused(EP(URL ", \"timeout_s\": 0"), "grader.timeout_s", "timeout_s");
    rewards_test_refused(EP(URL ", \"timeout_s\": 601"), "grader.timeout_s", "timeout_s");
    rewards_test_refused(EP(URL ", \"max_retries\": 11"), "grader.max_retries", "max_retries");
    rewards_test_refused(EP(URL ", \"max_retries\": 1.5"), "grader.max_retries", "max_retries");
    rewards_test_refused(EP(URL ", \"method\": \"GET\""), "grader.method", "method");
    rewards_test_refused(EP(URL ", \"headers\": [\"a\"]"), "grader.headers", "expected an object of at most 16 headers");
    rewards_test_refused(EP(URL ", \"headers\": {\"X-A\": 1}"), "grader.headers.X-A",
                   "reward.grader.headers.X-A: expected a string");
    rewards_test_refused(EP(URL ", \"headers\": {\"Bad Name\": \"x\"}"), "grader.headers", "is not a header name");
    rewards_test_refused(EP(URL ", \"headers\": {\"content-type\": \"text/plain\"}"), "grader.headers.content-type",
                   "smelt sets this header itself");
    rewards_test_refused(EP(URL ", \"headers\": {\"X-A\": \"a\\r\\nHost: evil\"}"), "grader.headers.X-A",
                   "control character at byte 1");
    char many[1024] = EP(URL ", \"headers\": {");
    many[strlen(many) - 2] = '\0';
    for (int k = 0; k < 17; k++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"X-%d\": \"v\"", k ? ", " : "", k);
    strcat(many, "}}}");
    rewards_test_refused(many, "grader.headers", "at most 16 headers");
    rewards_test_refused("{\"grader\": {\"type\": \"multi\", \"graders\": {\"ep\": {\"type\": \"endpoint\", \"url\": "
                   "\"gopher://h/\"}}, \"calculate_output\": \"ep\"}}",
                   "grader.graders.ep.url", "reward.grader.graders.ep.url: \"gopher://h/\" is not an http:// or https://");
}
