/* OpenAI's python grader: {"type": "python", "name", "source": "def grade(sample, item)
 * -> float: ...", "image_tag"?}, plus smelt's limits (timeout_s, memory_mb,
 * sandboxes). The source runs only in the sandbox (sandbox_internal.h): once when the
 * spec is read (it must compile, run and define grade(sample, item)), then once per
 * batch in a pool of sandboxes. What grade() receives: sample {"output_text", "output_json",
 * "output_tools", "choices", "finish_reason", "n_completion_tokens"} and item, the
 * prompts row's fields (its metadata, with "answer" when the row has one). A sample
 * grade() cannot score scores 0 with the reason (graders.c reports it). */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "rewards/rewards_internal.h"
#include "rewards/sandbox_internal.h"

#define DEFAULT_TIMEOUT_S 10.0
#define MAX_TIMEOUT_S 120.0  /* OpenAI's: "the grading execution itself is limited to 2 minutes" */
#define DEFAULT_MEMORY_MB 2048 /* OpenAI's 2 GB */
#define MAX_SANDBOXES 16

struct grader_python {
    char *source;
    char *image_tag;          /* NULL when not given */
    struct sandbox_limits limits;
    bool sandboxes_given;
    int n;                    /* the last batch */
    struct sandbox_result *results;
};

/* ---- reading ---- */

static int parse_source(const json_t *obj, const char *w, struct grader_python *py, struct smelt_error *err) {
    const char *source;
    TRY(json_field_string(obj, "source", true, NULL, &source, w, err));
    size_t len = json_string_length(json_object_get(obj, "source"));
    if (len == 0 || len > GRADER_MAX_SOURCE_BYTES)
        return error_set_field(err, SMELT_EINVAL, "source", "%s.source: %zu bytes, expected 1 to %d", w, len,
                               GRADER_MAX_SOURCE_BYTES);
    if (strlen(source) != len)
        return error_set_field(err, SMELT_EINVAL, "source", "%s.source: holds a NUL character", w);
    py->source = strdup(source);
    return py->source ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.source: out of memory", w);
}

static int parse_image_tag(const json_t *obj, const char *w, struct grader_python *py, struct smelt_error *err) {
    const char *tag;
    TRY(json_field_string(obj, "image_tag", false, NULL, &tag, w, err));
    if (!tag) return SMELT_OK;
    if (strlen(tag) > GRADER_MAX_IMAGE_TAG_BYTES)
        return error_set_field(err, SMELT_EINVAL, "image_tag", "%s.image_tag: %zu bytes, expected at most %d", w,
                               strlen(tag), GRADER_MAX_IMAGE_TAG_BYTES);
    py->image_tag = strdup(tag);
    return py->image_tag ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.image_tag: out of memory", w);
}

/* min(online cores, 4): scoring shares the machine with generation and training. */
static int default_sandboxes(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > 4 ? 4 : (int)cores;
}

static int parse_limits(const json_t *obj, const char *w, struct grader_python *py, struct smelt_error *err) {
    int64_t memory, sandboxes;
    TRY(json_field_double(obj, "timeout_s", false, DEFAULT_TIMEOUT_S, 0.05, MAX_TIMEOUT_S, &py->limits.timeout_s, w,
                          err));
    TRY(json_field_int(obj, "memory_mb", false, DEFAULT_MEMORY_MB, 128, 65536, &memory, w, err));
    TRY(json_field_int(obj, "sandboxes", false, default_sandboxes(), 1, MAX_SANDBOXES, &sandboxes, w, err));
    const json_t *given = json_object_get(obj, "sandboxes");
    py->sandboxes_given = given && !json_is_null(given);
    py->limits.memory_mb = memory;
    py->limits.sandboxes = (int)sandboxes;
    return SMELT_OK;
}

/* The source in a sandbox, once: it must compile, run and define grade(sample, item). A
 * machine that cannot run sandboxes refuses the grader (never runs it unsandboxed). */
static int check_source(const char *w, struct grader_python *py, struct smelt_error *err) {
    char why[SANDBOX_MESSAGE_BYTES] = "";
    int rc = sandbox_check(py->source, &py->limits, why, sizeof why, err);
    if (rc == SANDBOX_REFUSED) return error_set_field(err, SMELT_EINVAL, "source", "%s.source: %s", w, why);
    if (rc == SMELT_ENOMEM) return rc;
    if (rc) {
        char what[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(what, sizeof what, "%s", err->message);
        return error_set_field(err, rc, "type", "%s.type: python graders cannot run on this machine: %.400s", w, what);
    }
    return SMELT_OK;
}

int grader_python_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    struct grader_python *py = calloc(1, sizeof *py);
    if (!py) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    g->py = py; /* owned by g from now: reward_grader_free frees it on any failure below */
    TRY(parse_source(obj, w, py, err));
    TRY(parse_image_tag(obj, w, py, err));
    TRY(parse_limits(obj, w, py, err));
    const json_t *t = json_object_get(obj, "pass_threshold");
    g->has_pass_threshold = t && !json_is_null(t);
    TRY(json_field_double(obj, "pass_threshold", false, 0.0, -1e9, 1e9, &g->pass_threshold, w, err));
    return check_source(w, py, err);
}

void grader_python_free(struct grader_python *py) {
    if (!py) return;
    free(py->source);
    free(py->image_tag);
    free(py->results);
    free(py);
}

int grader_python_to_json(const struct grader_python *py, json_t *obj) {
    int bad = reward_json_set(obj, "source", json_string(py->source));
    if (py->image_tag) bad |= reward_json_set(obj, "image_tag", json_string(py->image_tag));
    bad |= reward_json_set(obj, "timeout_s", json_real(py->limits.timeout_s));
    bad |= reward_json_set(obj, "memory_mb", json_integer(py->limits.memory_mb));
    if (py->sandboxes_given) bad |= reward_json_set(obj, "sandboxes", json_integer(py->limits.sandboxes));
    return bad;
}

/* ---- a batch ---- */

json_t *grader_item_of(const struct reward_sample *s) {
    json_t *meta = s->metadata_json ? json_loads(s->metadata_json, JSON_DECODE_ANY, NULL) : NULL;
    json_t *item = json_is_object(meta) ? json_incref(meta) : json_object();
    if (item && meta && !json_is_object(meta) && json_object_set(item, "metadata", meta)) {
        json_decref(item);
        item = NULL;
    }
    json_decref(meta);
    if (item && s->answer && json_object_set_new(item, "answer", json_string_lossy(s->answer, strlen(s->answer)))) {
        json_decref(item);
        item = NULL;
    }
    return item;
}

static char *request_of(const struct reward_sample *s) {
    json_t *sample = json_pack("{s:o, s:o, s:I}", "output_text", json_string_lossy(s->completion, strlen(s->completion)),
                               "finish_reason", s->finish_reason ? json_string(s->finish_reason) : json_null(),
                               "n_completion_tokens", (json_int_t)s->n_completion_tokens);
    json_t *item = grader_item_of(s);
    json_t *req = sample && item ? json_pack("{s:O, s:O}", "sample", sample, "item", item) : NULL;
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(sample);
    json_decref(item);
    json_decref(req);
    return text;
}

void grader_python_requests_free(char **requests, int n) {
    if (!requests) return;
    for (int i = 0; i < n; i++) free(requests[i]);
    free(requests);
}

int grader_python_requests(const struct reward_sample *samples, int n, char ***out, struct smelt_error *err) {
    *out = NULL;
    char **requests = calloc(n > 0 ? (size_t)n : 1, sizeof *requests);
    if (!requests) return error_set(err, SMELT_ENOMEM, "python grader: out of memory");
    for (int i = 0; i < n; i++)
        if (!(requests[i] = request_of(&samples[i]))) {
            grader_python_requests_free(requests, n);
            return error_set(err, SMELT_ENOMEM, "python grader: out of memory writing samples[%d]", i);
        }
    *out = requests;
    return SMELT_OK;
}

int grader_python_run(struct grader_python *py, const char *const *requests, int n, struct smelt_error *err) {
    free(py->results);
    py->n = 0;
    py->results = calloc(n > 0 ? (size_t)n : 1, sizeof *py->results);
    if (!py->results) return error_set(err, SMELT_ENOMEM, "python grader: out of memory");
    py->n = n;
    return sandbox_grade(py->source, &py->limits, requests, n, py->results, err);
}

bool grader_python_result(const struct grader_python *py, int i, double *score, char *why, size_t why_n) {
    SMELT_ASSERT(i >= 0 && i < py->n);
    const struct sandbox_result *r = &py->results[i];
    *score = r->ok ? r->score : 0.0;
    if (!r->ok) snprintf(why, why_n, "%s", r->error);
    return r->ok;
}
