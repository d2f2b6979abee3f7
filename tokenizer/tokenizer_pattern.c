/* Patterns of Split, Replace (normalizer and decoder): a literal string or a regex.
 *
 * `tokenizers` runs its regexes with Oniguruma; PCRE2 with UTF + UCP gives the same
 * answers for the patterns real tokenizers use (\p{L}, \p{N}, \s with Unicode meaning,
 * lookahead, (?i:...)). MATCH_INVALID_UTF lets a regex run over text holding invalid
 * UTF-8: such bytes never match and so fall into the non-match ranges. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/json.h"

int tok_segments_push(struct tok_segments *s, size_t start, size_t end, bool is_match,
                      struct smelt_error *err) {
    if (s->count == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        struct tok_segment *p = realloc(s->items, cap * sizeof *p);
        if (!p) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu ranges", cap);
        s->items = p;
        s->cap = cap;
    }
    s->items[s->count++] = (struct tok_segment){start, end, is_match};
    return SMELT_OK;
}

int tok_pattern_compile_regex(const char *source, const char *where, struct tok_pattern *p,
                              struct smelt_error *err) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)source, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return error_set(err, SMELT_EFORMAT, "%s: regex /%s/ does not compile at offset %zu: %s",
                         where, source, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* when JIT is unavailable the interpreter runs */
    p->re = re;
    return SMELT_OK;
}

int tok_pattern_parse(const json_t *obj, const char *where, struct tok_pattern *p,
                      struct smelt_error *err) {
    *p = (struct tok_pattern){0};
    if (!json_is_object(obj) || json_object_size(obj) != 1)
        return error_set(err, SMELT_EFORMAT,
                         "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
    const json_t *s = json_object_get(obj, "String"), *r = json_object_get(obj, "Regex");
    if (s && json_is_string(s)) {
        size_t n = json_string_length(s);
        if (n == 0) return error_set(err, SMELT_EFORMAT, "%s: empty String pattern", where);
        p->literal = malloc(n);
        if (!p->literal) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
        memcpy(p->literal, json_string_value(s), n);
        p->literal_len = n;
        return SMELT_OK;
    }
    if (r && json_is_string(r)) return tok_pattern_compile_regex(json_string_value(r), where, p, err);
    return error_set(err, SMELT_EFORMAT,
                     "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

void tok_pattern_free(struct tok_pattern *p) {
    free(p->literal);
    if (p->re) pcre2_code_free(p->re);
    *p = (struct tok_pattern){0};
}

static int find_literal(const struct tok_pattern *p, const char *s, size_t n,
                        struct tok_segments *out, struct smelt_error *err) {
    size_t prev = 0;
    const char *at = s;
    while ((size_t)(at - s) < n) {
        const char *hit = memmem(at, n - (size_t)(at - s), p->literal, p->literal_len);
        if (!hit) break;
        size_t start = (size_t)(hit - s), end = start + p->literal_len;
        int rc = 0;
        if (start > prev) rc = tok_segments_push(out, prev, start, false, err);
        if (!rc) rc = tok_segments_push(out, start, end, true, err);
        if (rc) return rc;
        prev = end;
        at = s + end;
    }
    if (prev < n) return tok_segments_push(out, prev, n, false, err);
    return SMELT_OK;
}

/* Iterates matches the way pcre2demo does: after an empty match, retry at the same place
 * for a non-empty one, else step one character. */
static int find_regex(const struct tok_pattern *p, const char *s, size_t n,
                      struct tok_segments *out, struct smelt_error *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for regex match data");
    size_t prev = 0, pos = 0;
    uint32_t opts = 0;
    int rc = SMELT_OK;
    while (pos <= n) {
        int m = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, opts, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) {
            if (!opts || pos >= n) break;
            pos += tok_utf8_unit(s + pos, n - pos);
            opts = 0;
            continue;
        }
        if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = error_set(err, SMELT_EINVAL, "tokenizer: regex match failed: %s", (const char *)msg);
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        if (start > prev) rc = tok_segments_push(out, prev, start, false, err);
        if (!rc) rc = tok_segments_push(out, start, end, true, err);
        if (rc) break;
        prev = end;
        pos = end;
        opts = start == end ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    pcre2_match_data_free(md);
    if (!rc && prev < n) rc = tok_segments_push(out, prev, n, false, err);
    return rc;
}

int tok_pattern_find(const struct tok_pattern *p, const char *s, size_t n,
                     struct tok_segments *out, struct smelt_error *err) {
    out->count = 0;
    if (n == 0) return tok_segments_push(out, 0, 0, false, err);
    return p->re ? find_regex(p, s, n, out, err) : find_literal(p, s, n, out, err);
}

int tok_chars_find(bool (*pred)(int32_t cp, const void *ctx), const void *ctx, const char *s,
                   size_t n, struct tok_segments *out, struct smelt_error *err) {
    out->count = 0;
    if (n == 0) return tok_segments_push(out, 0, 0, false, err);
    size_t prev = 0, i = 0;
    while (i < n) {
        int32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        if (k && pred(cp, ctx)) {
            int rc = 0;
            if (i > prev) rc = tok_segments_push(out, prev, i, false, err);
            if (!rc) rc = tok_segments_push(out, i, i + k, true, err);
            if (rc) return rc;
            prev = i + k;
        }
        i += k ? k : 1;
    }
    if (prev < n) return tok_segments_push(out, prev, n, false, err);
    return SMELT_OK;
}
