/* regex_match and format: 1 when the completion matches a pattern, else 0. format is
 * regex_match with full_match on and "." matching newlines too (PCRE2_DOTALL), the shape
 * of the usual reasoning-format check "<think>.*</think>\s*<answer>.*</answer>"; both
 * score through the same function. A full match is of the completion trimmed of
 * surrounding whitespace, so a trailing newline does not fail it; a search reads the
 * completion as it is. */
#include "rewards/rewards_internal.h"

#include <string.h>

#include "common/json.h"

static int score_regex(struct reward_verifier *v, const struct reward_sample *s, double *score, char *why,
                       size_t why_n) {
    size_t start = 0, end = strlen(s->completion);
    if (v->full_match) reward_trim(s->completion, &start, &end);
    enum reward_match m =
        reward_pattern_test(&v->pattern, s->completion + start, end - start, v->full_match, why, why_n);
    if (m == REWARD_MATCH_FAILED) return -1;
    *score = m == REWARD_MATCH_FOUND;
    return 0;
}

static int parse_regex_match(const json_t *obj, const char *where, struct reward_verifier *v,
                             struct smelt_error *err) {
    TRY(reward_pattern_field(obj, "pattern", 0, where, &v->pattern, err));
    return json_field_bool(obj, "full_match", false, false, &v->full_match, where, err);
}

static int regex_match_to_json(const struct reward_verifier *v, json_t *obj) {
    int bad = reward_json_set(obj, "pattern", json_string(v->pattern.source));
    return bad | reward_json_set(obj, "full_match", json_boolean(v->full_match));
}

static const char *const REGEX_MATCH_KEYS[] = {"type", "name", "weight", "pattern", "full_match", NULL};

const struct reward_verifier_type REWARD_REGEX_MATCH = {
    .name = "regex_match", .keys = REGEX_MATCH_KEYS, .parse = parse_regex_match, .to_json = regex_match_to_json,
    .score = score_regex, .check_answer = NULL,
};

static int parse_format(const json_t *obj, const char *where, struct reward_verifier *v, struct smelt_error *err) {
    v->full_match = true;
    return reward_pattern_field(obj, "pattern", PCRE2_DOTALL, where, &v->pattern, err);
}

static int format_to_json(const struct reward_verifier *v, json_t *obj) {
    return reward_json_set(obj, "pattern", json_string(v->pattern.source));
}

static const char *const FORMAT_KEYS[] = {"type", "name", "weight", "pattern", NULL};

const struct reward_verifier_type REWARD_FORMAT = {
    .name = "format", .keys = FORMAT_KEYS, .parse = parse_format, .to_json = format_to_json,
    .score = score_regex, .check_answer = NULL,
};
