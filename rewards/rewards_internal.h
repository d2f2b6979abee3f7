/* Private to rewards/: the verifier table, compiled patterns, the number grammar, text
 * comparison and extraction rules. */
#ifndef SMELT_REWARDS_INTERNAL_H
#define SMELT_REWARDS_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>

#include "rewards/rewards.h"

/* Steps one regex match may take before the sample fails (PCRE2's own default is ten
 * times this): a pattern that backtracks catastrophically on one completion costs
 * milliseconds and fails that sample, not the loop's time. */
#define REWARD_REGEX_MATCH_LIMIT 1000000u

/* ---- pattern.c: PCRE2 patterns, compiled once at parse time ---- */

struct reward_pattern {
    pcre2_code *re;            /* NULL when unused */
    pcre2_match_data *md;      /* reused by every match: a stage scores one batch at a time */
    pcre2_match_context *mctx; /* the match limit */
    char *source;              /* the pattern as given (for reward_stage_to_json) */
    uint32_t n_groups;         /* capture groups */
};

/* Reads obj[key] (required, 1..REWARD_MAX_PATTERN_BYTES bytes) and compiles it with UTF,
 * UCP and invalid-UTF-8 subjects allowed, plus extra_options (PCRE2_DOTALL for format).
 * Errors name "<where>.<key>" and set err->field to key; a pattern that does not compile
 * gives PCRE2's message and offset. */
int reward_pattern_field(const json_t *obj, const char *key, uint32_t extra_options, const char *where,
                         struct reward_pattern *p, struct smelt_error *err);
void reward_pattern_free(struct reward_pattern *p);

/* Outcome of a match: found, not found, or the sample fails (message in why). */
enum reward_match { REWARD_MATCH_NONE = 0, REWARD_MATCH_FOUND = 1, REWARD_MATCH_FAILED = -1 };

/* Is there a match in s[0..n)? whole: the match must span all of s[0..n). */
enum reward_match reward_pattern_test(struct reward_pattern *p, const char *s, size_t n, bool whole,
                                      char *why, size_t why_n);
/* The span of group `group` (0: the whole match) of the last match in s[0..n); NONE when
 * nothing matches or the last match leaves the group unset. */
enum reward_match reward_pattern_last(struct reward_pattern *p, const char *s, size_t n, uint32_t group,
                                      size_t *start, size_t *end, char *why, size_t why_n);

/* ---- number.c: the number grammar (docs/rewards.md, "Numbers") ---- */

/* The last number in s[0..n): its span and value (±inf when it overflows a double).
 * false when s holds none. */
bool reward_number_last(const char *s, size_t n, size_t *start, size_t *end, double *value);
/* true when the whole of s[0..n) is one number (nothing before or after it). */
bool reward_number_whole(const char *s, size_t n, double *value);

/* ---- text.c: trimming, normalization, answer comparison ---- */

enum reward_normalize {
    REWARD_NORMALIZE_LOWERCASE = 1u << 0,    /* per-character Unicode lowercase */
    REWARD_NORMALIZE_STRIP_PERIOD = 1u << 1, /* one trailing "." dropped */
};

/* [*start, *end) shrunk past ASCII whitespace at both ends. */
void reward_trim(const char *s, size_t *start, size_t *end);
/* The next character of s[*i..n) as a code point, *i moved past it; lowercased (Unicode
 * simple case mapping, one character to one) when lower. A byte that does not start
 * valid UTF-8 stands for itself, as 0x110000 + the byte, so it never equals a character. */
int32_t reward_next_char(const char *s, size_t n, size_t *i, bool lower);
/* Trim; with STRIP_PERIOD drop one trailing "." and trim again. */
void reward_normalize_span(const char *s, size_t *start, size_t *end, unsigned normalize);
/* exact_match's comparison of two normalized texts: as numbers when both are one number
 * each, else byte for byte (per character lowercased with LOWERCASE). Empty text never
 * matches. */
bool reward_text_matches(const char *got, size_t n_got, const char *want, size_t n_want, unsigned normalize);

/* ---- extract.c: where the answer is in a completion ---- */

enum reward_extract_kind {
    REWARD_EXTRACT_FULL,
    REWARD_EXTRACT_LAST_NUMBER,
    REWARD_EXTRACT_AFTER_MARKER,
    REWARD_EXTRACT_REGEX,
    REWARD_EXTRACT_BOXED,
};

struct reward_extract {
    enum reward_extract_kind kind;
    char marker[REWARD_MAX_MARKER_BYTES + 1]; /* after_marker */
    struct reward_pattern pattern;            /* regex */
    uint32_t group;                           /* regex */
};

/* What an extraction found in a completion. */
struct reward_extracted {
    bool found;
    size_t start, end;  /* the span of the completion, trimmed */
    bool is_number;     /* last_number: value holds the number */
    double value;
};

/* Reads an optional "extract" object of obj (absent: {"type": def}). Errors name
 * "extract.<field>" in err->field. */
int reward_extract_field(const json_t *obj, enum reward_extract_kind def, const char *where,
                         struct reward_extract *x, struct smelt_error *err);
json_t *reward_extract_to_json(const struct reward_extract *x); /* NULL: out of memory */
/* 0 with *out filled (found or not), or -1 with why when the sample fails (a regex
 * match limit). */
int reward_extract_apply(struct reward_extract *x, const char *s, size_t n, struct reward_extracted *out,
                         char *why, size_t why_n);

/* ---- the verifiers ---- */

struct reward_verifier_type;

/* One verifier of a stage: its type, name, weight, and the fields of its type (a plain
 * struct: each type reads the members it owns). */
struct reward_verifier {
    const struct reward_verifier_type *type;
    char name[REWARD_NAME_BYTES];
    bool named;               /* "name" was given */
    double weight;
    /* exact_match, numeric_match */
    struct reward_extract extract;
    unsigned normalize;       /* enum reward_normalize bits */
    double tolerance, relative;
    /* regex_match, format */
    struct reward_pattern pattern;
    bool full_match;
    /* length_penalty */
    int64_t max_tokens, cache_tokens;
    bool has_truncated_penalty;
    double truncated_penalty;
};

struct reward_verifier_type {
    const char *name;
    const char *const *keys; /* every key allowed, "type", "name" and "weight" included */
    /* Reads the type's own fields (type, name, weight are read already). */
    int (*parse)(const json_t *obj, const char *where, struct reward_verifier *v, struct smelt_error *err);
    /* Adds the type's fields, defaults filled; nonzero when out of memory. */
    int (*to_json)(const struct reward_verifier *v, json_t *obj);
    /* One sample: 0 with *score, or -1 with why (the sample fails). */
    int (*score)(struct reward_verifier *v, const struct reward_sample *s, double *score, char *why, size_t why_n);
    /* NULL when the verifier reads no answer; else 0 when answer (maybe NULL) is one it
     * can score against, -1 with why. */
    int (*check_answer)(const struct reward_verifier *v, const char *answer, char *why, size_t why_n);
};

extern const struct reward_verifier_type REWARD_EXACT_MATCH, REWARD_NUMERIC_MATCH, REWARD_REGEX_MATCH,
    REWARD_FORMAT, REWARD_LENGTH_PENALTY;

struct reward_grader; /* graders_internal.h */

/* A stage holds verifiers (n of them) or one grader (n = 0). */
struct reward_stage {
    int n;
    struct reward_verifier v[REWARD_MAX_VERIFIERS];
    struct reward_grader *grader;
};

/* A JSON member set on obj; nonzero when value is NULL (out of memory) or setting fails. */
int reward_json_set(json_t *obj, const char *key, json_t *value);

#endif
