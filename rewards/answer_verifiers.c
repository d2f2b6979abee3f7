/* The verifiers that compare a completion with the row's answer: exact_match and
 * numeric_match. A row without a usable answer is a data problem, so the sample fails
 * (and reward_stage_check_prompt refuses such a prompts file up front); a completion
 * without the answer in it scores 0. */
#include "rewards/rewards_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"

/* ---- the row's answer ---- */

/* The answer, normalized, as a span of answer; -1 with why when there is none. */
static int answer_span(const char *answer, unsigned normalize, size_t *start, size_t *end, char *why,
                       size_t why_n) {
    if (!answer) {
        snprintf(why, why_n, "the row has no \"answer\"");
        return -1;
    }
    *start = 0;
    *end = strlen(answer);
    reward_normalize_span(answer, start, end, normalize);
    if (*start == *end) {
        snprintf(why, why_n, "the row's \"answer\" is empty");
        return -1;
    }
    return 0;
}

/* The answer as a finite number; -1 with why when it is not one. */
static int answer_number(const char *answer, double *value, char *why, size_t why_n) {
    size_t start, end;
    if (answer_span(answer, 0, &start, &end, why, why_n)) return -1;
    if (!reward_number_whole(answer + start, end - start, value) || !isfinite(*value)) {
        int shown = (int)(end - start > 60 ? 60 : end - start);
        snprintf(why, why_n, "the row's \"answer\" \"%.*s\" is not a number", shown, answer + start);
        return -1;
    }
    return 0;
}

static int check_exact(const struct reward_verifier *v, const char *answer, char *why, size_t why_n) {
    size_t start, end;
    double value;
    if (v->extract.kind == REWARD_EXTRACT_LAST_NUMBER) return answer_number(answer, &value, why, why_n);
    return answer_span(answer, v->normalize, &start, &end, why, why_n);
}

static int check_numeric(const struct reward_verifier *v, const char *answer, char *why, size_t why_n) {
    (void)v;
    double value;
    return answer_number(answer, &value, why, why_n);
}

/* ---- exact_match ---- */

static const char *const NORMALIZE_NAMES[] = {"lowercase", "strip_period"};
static const unsigned NORMALIZE_BITS[] = {REWARD_NORMALIZE_LOWERCASE, REWARD_NORMALIZE_STRIP_PERIOD};
#define N_NORMALIZE 2

static int parse_normalize_item(const json_t *item, size_t i, const char *where, unsigned *bits,
                                struct smelt_error *err) {
    char field[32];
    snprintf(field, sizeof field, "normalize[%zu]", i);
    const char *name = json_is_string(item) ? json_string_value(item) : "";
    for (int k = 0; k < N_NORMALIZE; k++)
        if (strcmp(name, NORMALIZE_NAMES[k]) == 0) {
            *bits |= NORMALIZE_BITS[k];
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EINVAL, field, "%s.%s: expected \"lowercase\" or \"strip_period\"", where,
                           field);
}

static int parse_normalize(const json_t *obj, const char *where, unsigned *bits, struct smelt_error *err) {
    *bits = 0;
    const json_t *list = json_object_get(obj, "normalize");
    if (!list || json_is_null(list)) return SMELT_OK;
    if (!json_is_array(list))
        return error_set_field(err, SMELT_EINVAL, "normalize",
                               "%s.normalize: expected a list such as [\"lowercase\", \"strip_period\"]", where);
    for (size_t i = 0; i < json_array_size(list); i++)
        TRY(parse_normalize_item(json_array_get(list, i), i, where, bits, err));
    return SMELT_OK;
}

static int parse_exact(const json_t *obj, const char *where, struct reward_verifier *v, struct smelt_error *err) {
    TRY(reward_extract_field(obj, REWARD_EXTRACT_FULL, where, &v->extract, err));
    return parse_normalize(obj, where, &v->normalize, err);
}

static int exact_to_json(const struct reward_verifier *v, json_t *obj) {
    json_t *list = json_array();
    int bad = !list;
    for (int k = 0; k < N_NORMALIZE && list; k++)
        if (v->normalize & NORMALIZE_BITS[k]) bad |= json_array_append_new(list, json_string(NORMALIZE_NAMES[k]));
    bad |= reward_json_set(obj, "normalize", list);
    return bad | reward_json_set(obj, "extract", reward_extract_to_json(&v->extract));
}

static int score_exact(struct reward_verifier *v, const struct reward_sample *s, double *score, char *why,
                       size_t why_n) {
    size_t a0, a1;
    if (check_exact(v, s->answer, why, why_n)) return -1;
    answer_span(s->answer, v->normalize, &a0, &a1, why, why_n); /* cannot fail: checked above */
    struct reward_extracted got;
    if (reward_extract_apply(&v->extract, s->completion, strlen(s->completion), &got, why, why_n)) return -1;
    if (got.found) reward_normalize_span(s->completion, &got.start, &got.end, v->normalize);
    *score = got.found && reward_text_matches(s->completion + got.start, got.end - got.start, s->answer + a0,
                                              a1 - a0, v->normalize);
    return 0;
}

static const char *const EXACT_KEYS[] = {"type", "name", "weight", "extract", "normalize", NULL};

const struct reward_verifier_type REWARD_EXACT_MATCH = {
    .name = "exact_match", .keys = EXACT_KEYS, .parse = parse_exact, .to_json = exact_to_json,
    .score = score_exact, .check_answer = check_exact,
};

/* ---- numeric_match ---- */

static int parse_numeric(const json_t *obj, const char *where, struct reward_verifier *v, struct smelt_error *err) {
    TRY(reward_extract_field(obj, REWARD_EXTRACT_LAST_NUMBER, where, &v->extract, err));
    TRY(json_field_double(obj, "tolerance", false, 1e-6, 0.0, DBL_MAX, &v->tolerance, where, err));
    return json_field_double(obj, "relative", false, 0.0, 0.0, 1.0, &v->relative, where, err);
}

static int numeric_to_json(const struct reward_verifier *v, json_t *obj) {
    int bad = reward_json_set(obj, "extract", reward_extract_to_json(&v->extract));
    bad |= reward_json_set(obj, "tolerance", json_real(v->tolerance));
    return bad | reward_json_set(obj, "relative", json_real(v->relative));
}

/* The number extracted: last_number's value, or the whole extracted text as one number
 * (a trailing "." dropped). */
static bool extracted_number(const struct reward_extracted *got, const char *s, double *x) {
    if (got->is_number) {
        *x = got->value;
        return true;
    }
    size_t start = got->start, end = got->end;
    reward_normalize_span(s, &start, &end, REWARD_NORMALIZE_STRIP_PERIOD);
    return reward_number_whole(s + start, end - start, x);
}

static int score_numeric(struct reward_verifier *v, const struct reward_sample *s, double *score, char *why,
                         size_t why_n) {
    double want, x;
    if (answer_number(s->answer, &want, why, why_n)) return -1;
    struct reward_extracted got;
    if (reward_extract_apply(&v->extract, s->completion, strlen(s->completion), &got, why, why_n)) return -1;
    *score = got.found && extracted_number(&got, s->completion, &x) &&
             fabs(x - want) <= v->tolerance + v->relative * fabs(want);
    return 0;
}

static const char *const NUMERIC_KEYS[] = {"type", "name", "weight", "extract", "tolerance", "relative", NULL};

const struct reward_verifier_type REWARD_NUMERIC_MATCH = {
    .name = "numeric_match", .keys = NUMERIC_KEYS, .parse = parse_numeric, .to_json = numeric_to_json,
    .score = score_numeric, .check_answer = check_numeric,
};
