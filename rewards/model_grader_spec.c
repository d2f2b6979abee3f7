/* OpenAI's model graders, read and written back: score_model {"model", "input":
 * [messages], "range"?, "sampling_params"?, "pass_threshold"?} and label_model {"model",
 * "input", "labels", "passing_labels"}, plus smeltd's "model_dir" (its resolution of the
 * model name) and, for label_model, smelt's "sampling_params" (score_model's: OpenAI's
 * label_model has none, but a label judge that cannot be made greedy or seeded gives
 * verdicts no one can reproduce). Both are written back with every sampling default. Messages are {"role", "content", "type"?: "message"} with content a
 * template string or {"type": "input_text" | "output_text", "text": template}: the
 * text-only part of OpenAI's EvalItem (images and audio are refused by name). Scoring is
 * model_grader.c's. */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "rewards/rewards_internal.h"

#define MAX_MODEL_BYTES 1024
#define MAX_LABEL_BYTES 256

const char *const GRADER_SCORE_MODEL_KEYS[] = {"type",  "name",  "model",           "model_dir",     "input",
                                               "range", "sampling_params", "pass_threshold", NULL};
const char *const GRADER_LABEL_MODEL_KEYS[] = {"type",   "name",           "model",           "model_dir", "input",
                                               "labels", "passing_labels", "sampling_params", NULL};

int grader_parse_text(const json_t *obj, const char *key, bool required, size_t max, const char *w, char **out,
                      struct smelt_error *err) {
    const char *v;
    TRY(json_field_string(obj, key, required, NULL, &v, w, err));
    if (!v) return SMELT_OK;
    size_t len = json_string_length(json_object_get(obj, key));
    if (len == 0 || len > max || strlen(v) != len)
        return error_set_field(err, SMELT_EINVAL, key, "%s.%s: expected 1 to %zu bytes without NUL, got %zu", w, key,
                               max, len);
    *out = strdup(v);
    return *out ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.%s: out of memory", w, key);
}

/* ---- input: the messages ---- */

static int parse_role(const json_t *m, const char *w, struct grader_lm_message *out, struct smelt_error *err) {
    static const char *const roles[] = {"system", "developer", "user", "assistant"};
    const char *role;
    TRY(json_field_string(m, "role", true, NULL, &role, w, err));
    for (int k = 0; k < 4; k++)
        if (strcmp(role, roles[k]) == 0) {
            /* chat templates know system, not OpenAI's newer name for it */
            out->role = k <= 1 ? "system" : roles[k];
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EINVAL, "role", "%s.role: \"%.40s\" is not one of system, developer, user, "
                           "assistant", w, role);
}

static int parse_content(const json_t *m, const char *w, struct grader_lm_message *out, struct smelt_error *err) {
    const json_t *c = json_object_get(m, "content");
    if (json_is_string(c)) return grader_template_parse(m, "content", w, &out->content, err);
    if (!json_is_object(c))
        return error_set_field(err, SMELT_EINVAL, "content", "%s.content: expected a template string or "
                               "{\"type\": \"input_text\", \"text\": ...}", w);
    char wc[1024];
    snprintf(wc, sizeof wc, "%.900s.content", w);
    static const char *const keys[] = {"type", "text", NULL};
    TRY(error_in_field(err, json_check_keys(c, keys, wc, err), "content"));
    const char *type;
    TRY(error_in_field(err, json_field_string(c, "type", true, NULL, &type, wc, err), "content"));
    if (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0)
        return error_set_field(err, SMELT_EINVAL, "content.type", "%s.type: \"%.40s\": smelt's grader models read "
                               "text (input_text, output_text); images and audio are not available", wc, type);
    return error_in_field(err, grader_template_parse(c, "text", wc, &out->content, err), "content");
}

static int parse_message(const json_t *m, const char *w, struct grader_lm_message *out, struct smelt_error *err) {
    static const char *const keys[] = {"role", "content", "type", NULL};
    if (!json_is_object(m))
        return error_set(err, SMELT_EINVAL, "%s: expected a message {\"role\": \"user\", \"content\": \"...\"}", w);
    TRY(json_check_keys(m, keys, w, err));
    const char *type;
    TRY(json_field_string(m, "type", false, "message", &type, w, err));
    if (strcmp(type, "message") != 0)
        return error_set_field(err, SMELT_EINVAL, "type", "%s.type: \"%.40s\" (only \"message\")", w, type);
    TRY(parse_role(m, w, out, err));
    return parse_content(m, w, out, err);
}

static int parse_input(const json_t *obj, const char *w, struct grader_lm *lm, struct smelt_error *err) {
    const json_t *input = json_object_get(obj, "input");
    if (!json_is_array(input) || json_array_size(input) == 0 || json_array_size(input) > GRADER_LM_MAX_MESSAGES)
        return error_set_field(err, SMELT_EINVAL, "input", "%s.input: expected a list of 1 to %d messages "
                               "[{\"role\": \"user\", \"content\": \"Grade {{sample.output_text}}...\"}]", w,
                               GRADER_LM_MAX_MESSAGES);
    for (size_t i = 0; i < json_array_size(input); i++) {
        char wi[1024], fi[32];
        snprintf(fi, sizeof fi, "input[%zu]", i);
        snprintf(wi, sizeof wi, "%.900s.%s", w, fi);
        lm->n_msgs++; /* counted first, so that grader_lm_free frees a half-parsed one */
        TRY(error_in_field(err, parse_message(json_array_get(input, i), wi, &lm->msgs[i], err), fi));
    }
    lm->input = json_deep_copy(input);
    return lm->input ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.input: out of memory", w);
}

/* ---- score_model: range; both: sampling_params ---- */

static int parse_range(const json_t *obj, const char *w, struct grader_lm *lm, struct smelt_error *err) {
    const json_t *r = json_object_get(obj, "range");
    lm->range[0] = 0;
    lm->range[1] = 1;
    if (!r || json_is_null(r)) return SMELT_OK;
    if (!json_is_array(r) || json_array_size(r) != 2 || !json_is_number(json_array_get(r, 0)) ||
        !json_is_number(json_array_get(r, 1)))
        return error_set_field(err, SMELT_EINVAL, "range", "%s.range: expected [min, max], two numbers", w);
    lm->range[0] = json_number_value(json_array_get(r, 0));
    lm->range[1] = json_number_value(json_array_get(r, 1));
    if (!isfinite(lm->range[0]) || !isfinite(lm->range[1]) || !(lm->range[0] < lm->range[1]))
        return error_set_field(err, SMELT_EINVAL, "range", "%s.range: [%g, %g]: min must be below max", w,
                               lm->range[0], lm->range[1]);
    return SMELT_OK;
}

static int parse_sampling(const json_t *obj, const char *w, struct grader_lm *lm, struct smelt_error *err) {
    static const char *const keys[] = {"temperature", "top_p", "max_completions_tokens", "seed", "reasoning_effort",
                                       NULL};
    lm->params = (struct reward_generate_params){.temperature = 1, .top_p = 1, .max_tokens = GRADER_LM_DEFAULT_TOKENS};
    const json_t *sp = json_object_get(obj, "sampling_params");
    if (!sp || json_is_null(sp)) return SMELT_OK;
    char ws[1024];
    snprintf(ws, sizeof ws, "%.900s.sampling_params", w);
    if (!json_is_object(sp))
        return error_set_field(err, SMELT_EINVAL, "sampling_params", "%s: expected an object", ws);
    int rc = json_check_keys(sp, keys, ws, err);
    const json_t *effort = json_object_get(sp, "reasoning_effort");
    if (!rc && effort && !json_is_null(effort))
        rc = error_set_field(err, SMELT_EINVAL, "reasoning_effort", "%s.reasoning_effort: smelt's grader models "
                             "have no reasoning effort to set (leave it out)", ws);
    int64_t seed = 0;
    if (!rc) rc = json_field_double(sp, "temperature", false, 1.0, 0.0, 2.0, &lm->params.temperature, ws, err);
    if (!rc) rc = json_field_double(sp, "top_p", false, 1.0, 0.0, 1.0, &lm->params.top_p, ws, err);
    if (!rc && lm->params.top_p <= 0)
        rc = error_set_field(err, SMELT_EINVAL, "top_p", "%s.top_p: must be above 0 (at most 1)", ws);
    if (!rc) rc = json_field_int(sp, "max_completions_tokens", false, GRADER_LM_DEFAULT_TOKENS, 1,
                                 GRADER_LM_MAX_TOKENS, &lm->params.max_tokens, ws, err);
    if (!rc) rc = json_field_int(sp, "seed", false, 0, 0, INT64_MAX, &seed, ws, err);
    lm->params.seed = (uint64_t)seed;
    return error_in_field(err, rc, "sampling_params");
}

/* ---- label_model: labels, passing_labels ---- */

static int parse_label_list(const json_t *obj, const char *key, const char *w, char ***out, int *n,
                            struct smelt_error *err) {
    const json_t *a = json_object_get(obj, key);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > GRADER_LM_MAX_LABELS)
        return error_set_field(err, SMELT_EINVAL, key, "%s.%s: expected a list of 1 to %d labels", w, key,
                               GRADER_LM_MAX_LABELS);
    *out = calloc(json_array_size(a), sizeof **out);
    if (!*out) return error_set(err, SMELT_ENOMEM, "%s.%s: out of memory", w, key);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        size_t len = json_string_length(v), s = 0, e = len;
        if (json_is_string(v)) reward_trim(json_string_value(v), &s, &e);
        if (!json_is_string(v) || e == s || len > MAX_LABEL_BYTES || strlen(json_string_value(v)) != len)
            return error_set_field(err, SMELT_EINVAL, key, "%s.%s[%zu]: expected a label of 1 to %d bytes (not "
                                   "blank, no NUL)", w, key, i, MAX_LABEL_BYTES);
        for (int k = 0; k < *n; k++)
            if (strcmp((*out)[k], json_string_value(v)) == 0)
                return error_set_field(err, SMELT_EINVAL, key, "%s.%s[%zu]: \"%.40s\" is listed twice", w, key, i,
                                       (*out)[k]);
        (*out)[(*n)++] = strdup(json_string_value(v));
        if (!(*out)[*n - 1]) return error_set(err, SMELT_ENOMEM, "%s.%s: out of memory", w, key);
    }
    return SMELT_OK;
}

static int parse_labels(const json_t *obj, const char *w, struct grader_lm *lm, struct smelt_error *err) {
    TRY(parse_label_list(obj, "labels", w, &lm->labels, &lm->n_labels, err));
    TRY(parse_label_list(obj, "passing_labels", w, &lm->passing, &lm->n_passing, err));
    for (int p = 0; p < lm->n_passing; p++) {
        bool found = false;
        for (int k = 0; k < lm->n_labels && !found; k++) found = strcmp(lm->passing[p], lm->labels[k]) == 0;
        if (!found)
            return error_set_field(err, SMELT_EINVAL, "passing_labels", "%s.passing_labels[%d]: \"%.40s\" is not "
                                   "one of labels (passing_labels must be a subset of labels)", w, p, lm->passing[p]);
    }
    return SMELT_OK;
}

int grader_lm_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    struct grader_lm *lm = calloc(1, sizeof *lm);
    if (!lm) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    g->lm = lm; /* owned by g from now: reward_grader_free frees it on any failure below */
    lm->label = g->type == GRADER_LABEL_MODEL;
    TRY(grader_parse_text(obj, "model", true, MAX_MODEL_BYTES, w, &lm->model, err));
    TRY(grader_parse_text(obj, "model_dir", false, MAX_MODEL_BYTES, w, &lm->model_dir, err));
    TRY(parse_input(obj, w, lm, err));
    TRY(parse_sampling(obj, w, lm, err));
    if (lm->label) return parse_labels(obj, w, lm, err);
    TRY(parse_range(obj, w, lm, err));
    const json_t *t = json_object_get(obj, "pass_threshold");
    g->has_pass_threshold = t && !json_is_null(t);
    return json_field_double(obj, "pass_threshold", false, 0.0, -1e300, 1e300, &g->pass_threshold, w, err);
}

void grader_lm_free(struct grader_lm *lm) {
    if (!lm) return;
    if (lm->handle && lm->scorer.close_generator) lm->scorer.close_generator(lm->handle);
    for (int k = 0; k < lm->n_msgs; k++) grader_template_free(&lm->msgs[k].content);
    for (int k = 0; k < lm->n_labels; k++) free(lm->labels[k]);
    for (int k = 0; k < lm->n_passing; k++) free(lm->passing[k]);
    free(lm->labels);
    free(lm->passing);
    json_decref(lm->input);
    free(lm->model);
    free(lm->model_dir);
    free(lm->results);
    free(lm);
}

static json_t *string_list(char *const *v, int n) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++)
        if (json_array_append_new(a, json_string(v[k]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

int grader_lm_to_json(const struct reward_grader *g, json_t *obj) {
    const struct grader_lm *lm = g->lm;
    int bad = reward_json_set(obj, "model", json_string(lm->model));
    if (lm->model_dir) bad |= reward_json_set(obj, "model_dir", json_string(lm->model_dir));
    bad |= reward_json_set(obj, "input", json_deep_copy(lm->input));
    bad |= reward_json_set(obj, "sampling_params",
                           json_pack("{sfsfsIsI}", "temperature", lm->params.temperature, "top_p", lm->params.top_p,
                                     "max_completions_tokens", (json_int_t)lm->params.max_tokens, "seed",
                                     (json_int_t)lm->params.seed));
    if (lm->label) {
        bad |= reward_json_set(obj, "labels", string_list(lm->labels, lm->n_labels));
        return bad | reward_json_set(obj, "passing_labels", string_list(lm->passing, lm->n_passing));
    }
    bad |= reward_json_set(obj, "range", json_pack("[ff]", lm->range[0], lm->range[1]));
    if (g->has_pass_threshold) bad |= reward_json_set(obj, "pass_threshold", json_real(g->pass_threshold));
    return bad;
}
