/* Extraction rules: where exact_match and numeric_match look for the answer in a
 * completion (docs/rewards.md, "Extraction"). Each returns a span of the completion,
 * trimmed of ASCII whitespace; nothing is copied. */
#include "rewards/rewards_internal.h"

#include <stdio.h>
#include <string.h>

#include "common/json.h"

static const char *const EXTRACT_NAMES[] = {
    [REWARD_EXTRACT_FULL] = "full",       [REWARD_EXTRACT_LAST_NUMBER] = "last_number",
    [REWARD_EXTRACT_AFTER_MARKER] = "after_marker", [REWARD_EXTRACT_REGEX] = "regex",
    [REWARD_EXTRACT_BOXED] = "boxed",
};
#define N_EXTRACT (int)(sizeof EXTRACT_NAMES / sizeof EXTRACT_NAMES[0])

static const char *const KEYS_TYPE[] = {"type", NULL};
static const char *const KEYS_MARKER[] = {"type", "marker", NULL};
static const char *const KEYS_REGEX[] = {"type", "pattern", "group", NULL};

static int parse_marker(const json_t *obj, const char *w, struct reward_extract *x, struct smelt_error *err) {
    const char *marker;
    TRY(json_field_string(obj, "marker", true, NULL, &marker, w, err));
    size_t len = strlen(marker);
    if (len == 0 || len > REWARD_MAX_MARKER_BYTES)
        return error_set_field(err, SMELT_EINVAL, "marker", "%s.marker: must be 1 to %d bytes, got %zu", w,
                               REWARD_MAX_MARKER_BYTES, len);
    memcpy(x->marker, marker, len + 1);
    return SMELT_OK;
}

static int parse_regex(const json_t *obj, const char *w, struct reward_extract *x, struct smelt_error *err) {
    TRY(reward_pattern_field(obj, "pattern", 0, w, &x->pattern, err));
    int64_t group;
    TRY(json_field_int(obj, "group", false, 1, 0, 65535, &group, w, err));
    if (group > (int64_t)x->pattern.n_groups)
        return error_set_field(err, SMELT_EINVAL, "group",
                               "%s.group: %lld, but the pattern has %u capture group(s) (0 is the whole match)", w,
                               (long long)group, x->pattern.n_groups);
    x->group = (uint32_t)group;
    return SMELT_OK;
}

static int parse_extract(const json_t *obj, const char *w, struct reward_extract *x, struct smelt_error *err) {
    if (!json_is_object(obj))
        return error_set(err, SMELT_EINVAL, "%s: expected an object like {\"type\": \"last_number\"}", w);
    const char *name;
    TRY(json_field_string(obj, "type", true, NULL, &name, w, err));
    int k = 0;
    while (k < N_EXTRACT && strcmp(name, EXTRACT_NAMES[k]) != 0) k++;
    if (k == N_EXTRACT)
        return error_set_field(err, SMELT_EINVAL, "type",
                               "%s.type: unknown extraction \"%s\" (full, last_number, after_marker, regex, boxed)", w,
                               name);
    x->kind = (enum reward_extract_kind)k;
    const char *const *keys = x->kind == REWARD_EXTRACT_AFTER_MARKER ? KEYS_MARKER
                              : x->kind == REWARD_EXTRACT_REGEX      ? KEYS_REGEX
                                                                     : KEYS_TYPE;
    TRY(json_check_keys(obj, keys, w, err));
    if (x->kind == REWARD_EXTRACT_AFTER_MARKER) return parse_marker(obj, w, x, err);
    if (x->kind == REWARD_EXTRACT_REGEX) return parse_regex(obj, w, x, err);
    return SMELT_OK;
}

int reward_extract_field(const json_t *obj, enum reward_extract_kind def, const char *where,
                         struct reward_extract *x, struct smelt_error *err) {
    x->kind = def;
    const json_t *v = json_object_get(obj, "extract");
    if (!v || json_is_null(v)) return SMELT_OK;
    char w[256];
    snprintf(w, sizeof w, "%s.extract", where);
    return error_in_field(err, parse_extract(v, w, x, err), "extract");
}

json_t *reward_extract_to_json(const struct reward_extract *x) {
    json_t *obj = json_object();
    if (!obj) return NULL;
    int bad = reward_json_set(obj, "type", json_string(EXTRACT_NAMES[x->kind]));
    if (x->kind == REWARD_EXTRACT_AFTER_MARKER) bad |= reward_json_set(obj, "marker", json_string(x->marker));
    if (x->kind == REWARD_EXTRACT_REGEX) {
        bad |= reward_json_set(obj, "pattern", json_string(x->pattern.source));
        bad |= reward_json_set(obj, "group", json_integer(x->group));
    }
    if (bad) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* ---- applying a rule ---- */

static void found_span(struct reward_extracted *out, const char *s, size_t start, size_t end) {
    reward_trim(s, &start, &end);
    out->found = true;
    out->start = start;
    out->end = end;
}

/* The rest of the first non-blank line after the last occurrence of the marker. */
static void after_marker(const char *marker, const char *s, size_t n, struct reward_extracted *out) {
    size_t len = strlen(marker), at = n, i = 0;
    const char *hit;
    while (i + len <= n && (hit = memmem(s + i, n - i, marker, len))) {
        at = (size_t)(hit - s);
        i = at + 1;
    }
    if (at == n) return;
    size_t start = at + len, end = n;
    reward_trim(s, &start, &end);
    const char *nl = memchr(s + start, '\n', end - start);
    found_span(out, s, start, nl ? (size_t)(nl - s) : end);
}

/* The end of the braces opened just before s[open] (one past the closing "}"), or 0 when
 * they never close. "\{" and "\}" are LaTeX's literal braces and do not count. */
static size_t closing_brace(const char *s, size_t n, size_t open) {
    int depth = 1;
    for (size_t k = open; k < n; k++) {
        if (s[k] == '\\' && k + 1 < n && (s[k + 1] == '{' || s[k + 1] == '}')) k++;
        else if (s[k] == '{') depth++;
        else if (s[k] == '}' && --depth == 0) return k + 1;
    }
    return 0;
}

/* The content of the last complete \boxed{...}, scanning left to right: boxes nested in
 * a box's content belong to it; an unclosed box does not count (a box inside it may). */
static void boxed(const char *s, size_t n, struct reward_extracted *out) {
    static const char BOX[] = "\\boxed{";
    const size_t len = sizeof BOX - 1;
    size_t i = 0;
    const char *hit;
    while (i < n && (hit = memmem(s + i, n - i, BOX, len))) {
        size_t open = (size_t)(hit - s) + len, close = closing_brace(s, n, open);
        if (close) found_span(out, s, open, close - 1);
        i = close ? close : open;
    }
}

int reward_extract_apply(struct reward_extract *x, const char *s, size_t n, struct reward_extracted *out,
                         char *why, size_t why_n) {
    *out = (struct reward_extracted){0};
    size_t start = 0, end = 0;
    switch (x->kind) {
    case REWARD_EXTRACT_FULL: found_span(out, s, 0, n); return 0;
    case REWARD_EXTRACT_LAST_NUMBER:
        out->found = out->is_number = reward_number_last(s, n, &out->start, &out->end, &out->value);
        return 0;
    case REWARD_EXTRACT_AFTER_MARKER: after_marker(x->marker, s, n, out); return 0;
    case REWARD_EXTRACT_BOXED: boxed(s, n, out); return 0;
    case REWARD_EXTRACT_REGEX:
        switch (reward_pattern_last(&x->pattern, s, n, x->group, &start, &end, why, why_n)) {
        case REWARD_MATCH_FOUND: found_span(out, s, start, end); return 0;
        case REWARD_MATCH_NONE: return 0;
        case REWARD_MATCH_FAILED: return -1;
        }
    }
    SMELT_ASSERT(!"an extraction of unknown kind");
    return -1;
}
