/* smelt's endpoint grader: {"type": "endpoint", "name"?, "url", "timeout_s"?,
 * "max_retries"?, "headers"?}. Per batch, the samples go to the user's service in
 * requests of at most ENDPOINT_CHUNK_SAMPLES samples (and about ENDPOINT_CHUNK_BYTES),
 * one after the other:
 *     {"samples": [{"prompt", "completion", "item", "finish_reason", "n_completion_tokens"}, ...]}
 * and each reply must be 200 with {"rewards": [number | null, ...]}, one per sample of
 * its request, in order. Anything else fails the request's samples, with a message
 * naming what was wrong (the status, the first bytes of the body); a null or a
 * non-number fails its sample only. The HTTP client is endpoint_http.c. */
#include "rewards/endpoint_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/json.h"
#include "rewards/rewards_internal.h"

#define SNIPPET_BYTES 80 /* of a reply's body, in messages */

struct endpoint_result {
    double score;
    bool ok;
    char why[ENDPOINT_WHY_BYTES];
};

struct grader_endpoint {
    struct endpoint_target target;
    json_t *headers;                 /* the spec's headers (written back); NULL when not given */
    int n;                           /* the last batch */
    struct endpoint_result *results; /* [n] */
};

/* ---- reading ---- */

static int parse_url(const json_t *obj, const char *w, struct grader_endpoint *ep, struct smelt_error *err) {
    const char *url;
    TRY(json_field_string(obj, "url", true, NULL, &url, w, err));
    size_t len = json_string_length(json_object_get(obj, "url"));
    if (len == 0 || len > ENDPOINT_MAX_URL_BYTES || strlen(url) != len)
        return error_set_field(err, SMELT_EINVAL, "url", "%s.url: %zu bytes, expected 1 to %d (and no NUL)", w, len,
                               ENDPOINT_MAX_URL_BYTES);
    char why[200];
    int rc = endpoint_url_check(url, why, sizeof why);
    if (rc == SMELT_ENOMEM) return error_set(err, rc, "%s.url: out of memory", w);
    if (rc) return error_set_field(err, SMELT_EINVAL, "url", "%s.url: %s", w, why);
    ep->target.url = strdup(url);
    return ep->target.url ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.url: out of memory", w);
}

/* RFC 9110's token: what a header's name may hold. */
static bool header_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > ENDPOINT_MAX_HEADER_NAME_BYTES) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              strchr("!#$%&'*+-.^_`|~", *c)))
            return false;
    return true;
}

/* Headers smelt writes itself: the request's framing. */
static bool header_reserved(const char *name) {
    static const char *const RESERVED[] = {"content-type", "content-length", "transfer-encoding", "host",
                                           "expect",       "connection",     NULL};
    for (int k = 0; RESERVED[k]; k++)
        if (strcasecmp(name, RESERVED[k]) == 0) return true;
    return false;
}

/* A header's value: a string of visible characters, spaces and tabs (no line break,
 * which would end the header and start another). */
static int check_header_value(const json_t *value, const char *wf, const char *field, struct smelt_error *err) {
    if (!json_is_string(value))
        return error_set_field(err, SMELT_EINVAL, field, "%s: expected a string", wf);
    size_t n = json_string_length(value);
    const unsigned char *v = (const unsigned char *)json_string_value(value);
    if (n > ENDPOINT_MAX_HEADER_VALUE_BYTES)
        return error_set_field(err, SMELT_EINVAL, field, "%s: %zu bytes, expected at most %d", wf, n,
                               ENDPOINT_MAX_HEADER_VALUE_BYTES);
    for (size_t i = 0; i < n; i++)
        if ((v[i] < 0x20 && v[i] != '\t') || v[i] == 0x7f)
            return error_set_field(err, SMELT_EINVAL, field,
                                   "%s: holds a control character at byte %zu (a line break would start another "
                                   "header)",
                                   wf, i);
    return SMELT_OK;
}

static int parse_header(const char *name, const json_t *value, const char *w, struct grader_endpoint *ep,
                        struct smelt_error *err) {
    if (!header_name_ok(name))
        return error_set_field(err, SMELT_EINVAL, "headers",
                               "%s.headers: \"%.64s\" is not a header name (1 to %d letters, digits or "
                               "!#$%%&'*+-.^_`|~)",
                               w, name, ENDPOINT_MAX_HEADER_NAME_BYTES);
    char field[96], wf[600];
    snprintf(field, sizeof field, "headers.%s", name);
    snprintf(wf, sizeof wf, "%s.%s", w, field);
    if (header_reserved(name))
        return error_set_field(err, SMELT_EINVAL, field,
                               "%s: smelt sets this header itself (the body is JSON, sent to the URL's host)", wf);
    TRY(check_header_value(value, wf, field, err));
    if (endpoint_target_add_header(&ep->target, name, json_string_value(value)))
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", wf);
    return SMELT_OK;
}

static int parse_headers(const json_t *obj, const char *w, struct grader_endpoint *ep, struct smelt_error *err) {
    const json_t *headers = json_object_get(obj, "headers");
    if (!headers || json_is_null(headers)) return SMELT_OK;
    if (!json_is_object(headers) || json_object_size(headers) > ENDPOINT_MAX_HEADERS)
        return error_set_field(err, SMELT_EINVAL, "headers",
                               "%s.headers: expected an object of at most %d headers ({\"Authorization\": \"Bearer "
                               "...\"})",
                               w, ENDPOINT_MAX_HEADERS);
    const char *name;
    const json_t *value;
    json_object_foreach((json_t *)headers, name, value) TRY(parse_header(name, value, w, ep, err));
    ep->headers = json_deep_copy(headers);
    return ep->headers ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.headers: out of memory", w);
}

static int parse_limits(const json_t *obj, const char *w, struct grader_endpoint *ep, struct smelt_error *err) {
    int64_t retries;
    TRY(json_field_double(obj, "timeout_s", false, ENDPOINT_DEFAULT_TIMEOUT_S, 0.05, ENDPOINT_MAX_TIMEOUT_S,
                          &ep->target.timeout_s, w, err));
    TRY(json_field_int(obj, "max_retries", false, ENDPOINT_DEFAULT_RETRIES, 0, ENDPOINT_MAX_RETRIES, &retries, w,
                       err));
    ep->target.max_retries = (int)retries;
    return SMELT_OK;
}

int grader_endpoint_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    struct grader_endpoint *ep = calloc(1, sizeof *ep);
    if (!ep) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    g->ep = ep; /* owned by g from now: reward_grader_free frees it on any failure below */
    char why[200];
    if (endpoint_http_init(why, sizeof why))
        return error_set_field(err, SMELT_EBACKEND, "type", "%s.type: endpoint graders cannot run here: %s", w, why);
    TRY(parse_url(obj, w, ep, err));
    TRY(parse_limits(obj, w, ep, err));
    TRY(parse_headers(obj, w, ep, err));
    if (endpoint_target_finish(&ep->target)) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    return SMELT_OK;
}

void grader_endpoint_free(struct grader_endpoint *ep) {
    if (!ep) return;
    endpoint_target_free(&ep->target);
    json_decref(ep->headers);
    free(ep->results);
    free(ep);
}

int grader_endpoint_to_json(const struct grader_endpoint *ep, json_t *obj) {
    int bad = reward_json_set(obj, "url", json_string(ep->target.url));
    bad |= reward_json_set(obj, "timeout_s", json_real(ep->target.timeout_s));
    bad |= reward_json_set(obj, "max_retries", json_integer(ep->target.max_retries));
    if (ep->headers) bad |= reward_json_set(obj, "headers", json_deep_copy(ep->headers));
    return bad;
}

/* ---- the requests ---- */

/* One sample of a request, as compact JSON (malloc'd), or NULL when out of memory. */
static char *sample_text(const struct reward_sample *s) {
    const char *p = s->prompt_rendered;
    json_t *prompt = p ? json_string_lossy(p, strlen(p)) : json_null();
    json_t *sample = json_pack("{s:o, s:o, s:o, s:o, s:I}", "prompt", prompt, "completion",
                               json_string_lossy(s->completion, strlen(s->completion)), "item", grader_item_of(s),
                               "finish_reason", s->finish_reason ? json_string(s->finish_reason) : json_null(),
                               "n_completion_tokens", (json_int_t)s->n_completion_tokens);
    char *text = sample ? json_dumps(sample, JSON_COMPACT) : NULL;
    json_decref(sample);
    return text;
}

/* The body of the request starting at samples[first]: as many samples as fit (at least
 * one) into *count. SMELT_ENOMEM. */
static int request_body(const struct reward_sample *samples, int first, int n, struct reward_buf *body, int *count) {
    *count = 0;
    TRY(reward_buf_append(body, "{\"samples\":[", 12));
    for (int i = first; i < n && *count < ENDPOINT_CHUNK_SAMPLES; i++) {
        char *text = sample_text(&samples[i]);
        if (!text) return SMELT_ENOMEM;
        size_t len = strlen(text);
        bool fits = *count == 0 || body->n + len + 3 <= ENDPOINT_CHUNK_BYTES;
        int rc = fits && *count ? reward_buf_append(body, ",", 1) : SMELT_OK;
        if (fits && !rc) rc = reward_buf_append(body, text, len);
        free(text);
        TRY(rc);
        if (!fits) break;
        (*count)++;
    }
    return reward_buf_append(body, "]}", 2);
}

/* ---- the replies ---- */

/* The first bytes of a reply, printable ASCII only (other bytes as '?'): for messages,
 * which end up in JSON events and logs. */
static void snippet(const struct reward_buf *body, char *out, size_t out_n) {
    size_t n = body->n < SNIPPET_BYTES ? body->n : SNIPPET_BYTES, k = 0;
    for (size_t i = 0; i < n && k + 1 < out_n; i++) {
        unsigned char c = (unsigned char)body->p[i];
        out[k++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    out[k] = '\0';
    if (body->n == 0) snprintf(out, out_n, "(empty body)");
    else if (body->n > n && k + 4 <= out_n) memcpy(out + k, "...", 4);
}

static void fail_all(struct grader_endpoint *ep, int first, int count, const char *why) {
    for (int i = first; i < first + count; i++) {
        ep->results[i].ok = false;
        snprintf(ep->results[i].why, sizeof ep->results[i].why, "%s", why);
    }
}

static const char *type_name(const json_t *v) {
    return json_is_string(v) ? "a string" : json_is_boolean(v) ? "a boolean" : json_is_object(v) ? "an object" : "an array";
}

static void read_reward(const json_t *v, int k, struct endpoint_result *r) {
    r->ok = json_is_number(v);
    if (r->ok) r->score = json_number_value(v);
    else if (json_is_null(v)) snprintf(r->why, sizeof r->why, "the service gave no reward (rewards[%d] is null)", k);
    else snprintf(r->why, sizeof r->why, "rewards[%d] is %s, expected a number or null", k, type_name(v));
}

/* A 200's body: {"rewards": [...]} of count entries, each into its sample's result. */
static void read_rewards(struct grader_endpoint *ep, const struct endpoint_reply *reply, int first, int count) {
    char why[ENDPOINT_WHY_BYTES], start[SNIPPET_BYTES + 4];
    snippet(&reply->body, start, sizeof start);
    json_error_t jerr;
    json_t *j = json_loadb(reply->body.p ? reply->body.p : "", reply->body.n, 0, &jerr);
    const json_t *rewards = json_object_get(j, "rewards");
    if (!j) {
        snprintf(why, sizeof why, "the reply is not JSON (at byte %d): %s", jerr.position, start);
    } else if (!json_is_array(rewards)) {
        snprintf(why, sizeof why, "the reply has no \"rewards\" array: %s", start);
    } else if (json_array_size(rewards) != (size_t)count) {
        snprintf(why, sizeof why, "the reply has %zu rewards for the request's %d samples", json_array_size(rewards),
                 count);
    } else {
        for (int k = 0; k < count; k++) read_reward(json_array_get(rewards, k), k, &ep->results[first + k]);
        json_decref(j);
        return;
    }
    json_decref(j);
    fail_all(ep, first, count, why);
}

static void read_reply(struct grader_endpoint *ep, const struct endpoint_reply *reply, int first, int count) {
    if (reply->status == 200) {
        read_rewards(ep, reply, first, count);
        return;
    }
    char why[ENDPOINT_WHY_BYTES], start[SNIPPET_BYTES + 4], tries[32] = "";
    snippet(&reply->body, start, sizeof start);
    if (reply->attempts > 1) snprintf(tries, sizeof tries, " (%d attempts)", reply->attempts);
    snprintf(why, sizeof why, "answered HTTP %ld%s%s: %s", reply->status, tries,
             reply->status >= 300 && reply->status < 400 ? ", a redirect (not followed: give the final URL)" : "",
             start);
    fail_all(ep, first, count, why);
}

/* The request of samples[first..first + *count): its results, whatever the service did.
 * SMELT_ENOMEM only. */
static int post_request(struct grader_endpoint *ep, const struct reward_sample *samples, int first, int n,
                        int *count) {
    struct reward_buf body = {0};
    struct endpoint_reply reply = {0};
    char why[ENDPOINT_WHY_BYTES];
    int rc = request_body(samples, first, n, &body, count);
    if (!rc) rc = endpoint_http_post(&ep->target, body.p, body.n, &reply, why, sizeof why);
    if (rc == SMELT_OK) read_reply(ep, &reply, first, *count);
    if (rc == ENDPOINT_NO_ANSWER) fail_all(ep, first, *count, why);
    reward_buf_free(&body);
    reward_buf_free(&reply.body);
    return rc == ENDPOINT_NO_ANSWER ? SMELT_OK : rc;
}

/* Results for a new batch of n samples (the last batch's dropped): false when out of memory. */
static bool batch_start(struct grader_endpoint *ep, int n) {
    free(ep->results);
    ep->n = 0;
    ep->results = calloc(n > 0 ? (size_t)n : 1, sizeof *ep->results);
    if (!ep->results) return false;
    ep->n = n;
    return true;
}

int grader_endpoint_read_reply(struct grader_endpoint *ep, int n, const struct endpoint_reply *reply,
                               struct smelt_error *err) {
    if (n < 1 || n > ENDPOINT_CHUNK_SAMPLES)
        return error_set(err, SMELT_EINVAL, "a request has 1 to %d samples, not %d", ENDPOINT_CHUNK_SAMPLES, n);
    if (!batch_start(ep, n)) return error_set(err, SMELT_ENOMEM, "endpoint: out of memory");
    read_reply(ep, reply, 0, n);
    return SMELT_OK;
}

static int run(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err) {
    struct grader_endpoint *ep = g->ep;
    if (!batch_start(ep, n)) return error_set(err, SMELT_ENOMEM, "%s (endpoint): out of memory", g->path);
    for (int first = 0, count = 0; first < n; first += count)
        if (post_request(ep, samples, first, n, &count))
            return error_set(err, SMELT_ENOMEM, "%s (endpoint): out of memory for samples[%d...]", g->path, first);
    return SMELT_OK;
}

int grader_endpoint_prepare(struct reward_grader *g, const struct reward_sample *samples, int n,
                            struct smelt_error *err) {
    if (g->type == GRADER_ENDPOINT) return run(g, samples, n, err);
    for (int k = 0; k < g->n_sub; k++)
        if (g->sub[k].type == GRADER_ENDPOINT) TRY(run(&g->sub[k], samples, n, err));
    return SMELT_OK;
}

int grader_endpoint_result(const struct grader_endpoint *ep, int i, double *score, char *why, size_t why_n) {
    SMELT_ASSERT(i >= 0 && i < ep->n);
    const struct endpoint_result *r = &ep->results[i];
    if (!r->ok) {
        snprintf(why, why_n, "%s", r->why);
        return GRADER_FAILED;
    }
    *score = r->score;
    return SMELT_OK;
}
