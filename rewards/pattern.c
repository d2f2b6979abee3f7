/* PCRE2 patterns of the verifiers: compiled once when the spec is read (a bad regex is a
 * spec error naming the field), matched per sample with a bounded number of steps.
 *
 * Options: UTF + UCP (\w, \d, \s and \b with their Unicode meaning, as Python's re has
 * them on str), and MATCH_INVALID_UTF because a completion may end inside a character:
 * invalid bytes then never match instead of failing the match. */
#include "rewards/rewards_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

static int compile(const char *source, uint32_t extra_options, const char *where, const char *key,
                   struct reward_pattern *p, struct smelt_error *err) {
    int code;
    PCRE2_SIZE at;
    p->re = pcre2_compile((PCRE2_SPTR)source, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | extra_options, &code, &at, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return error_set_field(err, SMELT_EINVAL, key, "%s.%s: regex does not compile at offset %zu: %s", where,
                               key, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* when JIT is unavailable the interpreter runs */
    pcre2_pattern_info(p->re, PCRE2_INFO_CAPTURECOUNT, &p->n_groups);
    p->md = pcre2_match_data_create_from_pattern(p->re, NULL);
    p->mctx = pcre2_match_context_create(NULL);
    p->source = strdup(source);
    if (!p->md || !p->mctx || !p->source)
        return error_set(err, SMELT_ENOMEM, "%s.%s: out of memory compiling the regex", where, key);
    pcre2_set_match_limit(p->mctx, REWARD_REGEX_MATCH_LIMIT);
    return SMELT_OK;
}

int reward_pattern_field(const json_t *obj, const char *key, uint32_t extra_options, const char *where,
                         struct reward_pattern *p, struct smelt_error *err) {
    const char *source;
    TRY(json_field_string(obj, key, true, NULL, &source, where, err));
    size_t len = strlen(source);
    if (len == 0) return error_set_field(err, SMELT_EINVAL, key, "%s.%s: must not be empty", where, key);
    if (len > REWARD_MAX_PATTERN_BYTES)
        return error_set_field(err, SMELT_EINVAL, key, "%s.%s: %zu bytes, longer than the %d allowed", where, key,
                               len, REWARD_MAX_PATTERN_BYTES);
    return compile(source, extra_options, where, key, p, err);
}

void reward_pattern_free(struct reward_pattern *p) {
    pcre2_match_data_free(p->md);
    pcre2_match_context_free(p->mctx);
    pcre2_code_free(p->re);
    free(p->source);
    *p = (struct reward_pattern){0};
}

/* A failed match (not "no match"): the match limit, or PCRE2's own reasons. */
static enum reward_match match_failed(int rc, char *why, size_t why_n) {
    if (rc == PCRE2_ERROR_MATCHLIMIT) {
        snprintf(why, why_n, "the regex gave up after %u matching steps (it backtracks too much on this "
                             "completion: simplify it)", REWARD_REGEX_MATCH_LIMIT);
    } else {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        snprintf(why, why_n, "the regex could not be matched: %s", (const char *)msg);
    }
    return REWARD_MATCH_FAILED;
}

enum reward_match reward_pattern_test(struct reward_pattern *p, const char *s, size_t n, bool whole,
                                      char *why, size_t why_n) {
    uint32_t options = whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0;
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, 0, options, p->md, p->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return REWARD_MATCH_NONE;
    if (rc < 0) return match_failed(rc, why, why_n);
    return REWARD_MATCH_FOUND;
}

/* The next start after an empty match that cannot be retried: one character on (the
 * bytes of a UTF-8 character, or one invalid byte). */
static size_t next_char(const char *s, size_t n, size_t pos) {
    pos++;
    while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
    return pos;
}

/* Every match in turn, pcre2demo's way: after an empty match, retry at the same place
 * for a non-empty one, else move one character on. */
enum reward_match reward_pattern_last(struct reward_pattern *p, const char *s, size_t n, uint32_t group,
                                      size_t *start, size_t *end, char *why, size_t why_n) {
    enum reward_match found = REWARD_MATCH_NONE;
    size_t pos = 0;
    uint32_t options = 0;
    while (pos <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, options, p->md, p->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!options || pos >= n) break;
            pos = next_char(s, n, pos);
            options = 0;
            continue;
        }
        if (rc < 0) return match_failed(rc, why, why_n);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
        bool set = group < (uint32_t)rc && ov[2 * group] != PCRE2_UNSET;
        found = set ? REWARD_MATCH_FOUND : REWARD_MATCH_NONE;
        if (set) {
            *start = ov[2 * group];
            *end = ov[2 * group + 1];
        }
        options = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
        pos = ov[1];
    }
    return found;
}
