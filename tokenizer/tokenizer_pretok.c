/* Pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Sequence. Each turns the list of
 * text pieces into a finer one; BPE then runs on each piece alone. The split behaviors
 * replay `tokenizers`' SplitDelimiterBehavior folds exactly, since ids depend on them. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#define SUPPORTED "Split, ByteLevel, Metaspace, Digits, Sequence"

int tok_parse_prepend_scheme(const json_t *obj, const char *where,
                             enum tok_prepend_scheme *out, struct smelt_error *err) {
    const char *scheme;
    bool add_prefix_space;
    int rc = json_field_string(obj, "prepend_scheme", false, NULL, &scheme, where, err);
    if (!rc) rc = json_field_bool(obj, "add_prefix_space", false, true, &add_prefix_space, where, err);
    if (rc) return rc;
    if (!scheme) {
        /* Files older than prepend_scheme say it with add_prefix_space. */
        *out = add_prefix_space ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return SMELT_OK;
    }
    if (!strcmp(scheme, "always")) *out = TOK_PREPEND_ALWAYS;
    else if (!strcmp(scheme, "first")) *out = TOK_PREPEND_FIRST;
    else if (!strcmp(scheme, "never")) *out = TOK_PREPEND_NEVER;
    else
        return error_set(err, SMELT_EFORMAT,
                         "%s: prepend_scheme '%s' is not always, first or never", where, scheme);
    if (!add_prefix_space && *out != TOK_PREPEND_NEVER)
        return error_set(err, SMELT_EFORMAT,
                         "%s: add_prefix_space false contradicts prepend_scheme '%s'", where,
                         scheme);
    return SMELT_OK;
}

static int parse_replacement(const json_t *j, const char *where, char out[4], size_t *len,
                             struct smelt_error *err) {
    const char *s;
    int rc = json_field_string(j, "replacement", true, NULL, &s, where, err);
    if (rc) return rc;
    int32_t cp;
    size_t n = strlen(s), k = tok_utf8_decode(s, n, &cp);
    if (k == 0 || k != n)
        return error_set(err, SMELT_EFORMAT, "%s: replacement must be one character", where);
    memcpy(out, s, k);
    *len = k;
    return SMELT_OK;
}

static int parse_behavior(const json_t *j, const char *where, enum tok_split_behavior *out,
                          struct smelt_error *err) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const char *b;
    int rc = json_field_string(j, "behavior", true, NULL, &b, where, err);
    if (rc) return rc;
    for (int i = 0; i < 5; i++)
        if (!strcmp(b, names[i])) {
            *out = (enum tok_split_behavior)i;
            return SMELT_OK;
        }
    return error_set(err, SMELT_EFORMAT, "%s: unknown split behavior '%s'", where, b);
}

static int parse_node(const json_t *j, const char *where, struct tok_pretok *p,
                      struct smelt_error *err);

static int parse_sequence(const json_t *j, const char *where, struct tok_pretok *p,
                          struct smelt_error *err) {
    static const char *const keys[] = {"type", "pretokenizers", NULL};
    int rc = json_check_keys(j, keys, where, err);
    if (rc) return rc;
    const json_t *arr = json_object_get(j, "pretokenizers");
    if (!json_is_array(arr))
        return error_set(err, SMELT_EFORMAT, "%s: 'pretokenizers' must be an array", where);
    size_t count = json_array_size(arr);
    p->items = calloc(count ? count : 1, sizeof *p->items);
    if (!p->items) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    for (size_t i = 0; i < count; i++) {
        char sub[400];
        snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
        p->n_items = i + 1;
        rc = parse_node(json_array_get(arr, i), sub, &p->items[i], err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

static int parse_node(const json_t *j, const char *where, struct tok_pretok *p,
                      struct smelt_error *err) {
    *p = (struct tok_pretok){0};
    const char *type;
    int rc = json_field_string(j, "type", true, NULL, &type, where, err);
    if (rc) return rc;
    if (!strcmp(type, "Split")) {
        static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
        p->kind = TOK_PRETOK_SPLIT;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = parse_behavior(j, where, &p->behavior, err);
        if (!rc) rc = json_field_bool(j, "invert", false, false, &p->invert, where, err);
        if (!rc) rc = tok_pattern_parse(json_object_get(j, "pattern"), where, &p->pattern, err);
        return rc;
    }
    if (!strcmp(type, "ByteLevel")) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets",
                                           "use_regex", NULL};
        bool trim; /* offsets only: ids do not depend on it */
        p->kind = TOK_PRETOK_BYTE_LEVEL;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = json_field_bool(j, "add_prefix_space", false, true, &p->add_prefix_space, where, err);
        if (!rc) rc = json_field_bool(j, "trim_offsets", false, true, &trim, where, err);
        if (!rc) rc = json_field_bool(j, "use_regex", false, true, &p->use_regex, where, err);
        if (!rc && p->use_regex) rc = tok_pattern_compile_regex(TOK_GPT2_REGEX, where, &p->pattern, err);
        return rc;
    }
    if (!strcmp(type, "Metaspace")) {
        static const char *const keys[] = {"type", "replacement", "add_prefix_space",
                                           "prepend_scheme", "split", "str_rep", NULL};
        p->kind = TOK_PRETOK_METASPACE;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = parse_replacement(j, where, p->replacement, &p->replacement_len, err);
        if (!rc) rc = tok_parse_prepend_scheme(j, where, &p->prepend_scheme, err);
        if (!rc) rc = json_field_bool(j, "split", false, true, &p->split, where, err);
        return rc;
    }
    if (!strcmp(type, "Digits")) {
        static const char *const keys[] = {"type", "individual_digits", NULL};
        p->kind = TOK_PRETOK_DIGITS;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = json_field_bool(j, "individual_digits", false, false, &p->individual_digits, where, err);
        return rc;
    }
    if (!strcmp(type, "Sequence")) {
        p->kind = TOK_PRETOK_SEQUENCE;
        return parse_sequence(j, where, p, err);
    }
    return error_set(err, SMELT_EUNSUPPORTED,
                     "%s: unsupported pre_tokenizer type '%s' (smelt reads " SUPPORTED ")",
                     where, type);
}

static void free_node(struct tok_pretok *p) {
    tok_pattern_free(&p->pattern);
    for (size_t i = 0; i < p->n_items; i++) free_node(&p->items[i]);
    free(p->items);
}

void tok_pretok_free(struct tok_pretok *p) {
    if (!p) return;
    free_node(p);
    free(p);
}

int tok_pretok_parse(const json_t *j, const char *where, struct tok_pretok **out,
                     struct smelt_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return SMELT_OK;
    struct tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    int rc = parse_node(j, where, p, err);
    if (rc) {
        tok_pretok_free(p);
        return rc;
    }
    *out = p;
    return SMELT_OK;
}

/* Folds the cover in segs per behavior, in place; the result is the non-empty ranges
 * segs[*first .. segs->count). */
static void fold_behavior(struct tok_segments *segs, enum tok_split_behavior behavior,
                          bool invert, size_t *first) {
    struct tok_segment *s = segs->items;
    size_t n = segs->count, w = 0;
    bool prev_match = false;
    if (invert)
        for (size_t i = 0; i < n; i++) s[i].is_match = !s[i].is_match;
    *first = 0;
    switch (behavior) {
    case TOK_SPLIT_ISOLATED: return;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!s[i].is_match) s[w++] = s[i];
        segs->count = w;
        return;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            struct tok_segment cur = s[i];
            bool merge = behavior == TOK_SPLIT_CONTIGUOUS ? cur.is_match == prev_match
                                                          : cur.is_match && !prev_match;
            if (merge && w > 0) s[w - 1].end = cur.end;
            else s[w++] = (struct tok_segment){cur.start, cur.end, false};
            prev_match = cur.is_match;
        }
        segs->count = w;
        return;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        w = n;
        for (size_t i = n; i-- > 0;) {
            struct tok_segment cur = s[i];
            if (cur.is_match && !prev_match && w < n) s[w].start = cur.start;
            else s[--w] = (struct tok_segment){cur.start, cur.end, false};
            prev_match = cur.is_match;
        }
        *first = w;
        return;
    }
}

/* Pushes onto t->next the parts of piece that t->segs (its cover) and behavior make. */
static int push_split(struct tok_text *t, struct tok_piece piece,
                      enum tok_split_behavior behavior, bool invert, struct smelt_error *err) {
    size_t first;
    fold_behavior(&t->segs, behavior, invert, &first);
    for (size_t i = first; i < t->segs.count; i++) {
        const struct tok_segment *s = &t->segs.items[i];
        if (s->end == s->start) continue;
        struct tok_piece part = {piece.off + s->start, s->end - s->start, -1,
                                 piece.at_start && s->start == 0};
        int rc = tok_pieces_push(&t->next, part, err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

int tok_split_pieces(struct tok_text *t, const struct tok_pattern *pattern,
                     enum tok_split_behavior behavior, bool invert, struct smelt_error *err) {
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece pc = t->pieces.items[i];
        int rc = pc.added_id >= 0
                     ? tok_pieces_push(&t->next, pc, err)
                     : tok_pattern_find(pattern, t->arena.data + pc.off, pc.len, &t->segs, err);
        if (!rc && pc.added_id < 0) rc = push_split(t, pc, behavior, invert, err);
        if (rc) return rc;
    }
    tok_text_commit(t);
    return SMELT_OK;
}

static bool is_numeric_pred(int32_t cp, const void *ctx) {
    (void)ctx;
    return tok_is_numeric(cp);
}

static bool is_char_pred(int32_t cp, const void *ctx) { return cp == *(const int32_t *)ctx; }

static int split_chars(struct tok_text *t, bool (*pred)(int32_t, const void *), const void *ctx,
                       enum tok_split_behavior behavior, struct smelt_error *err) {
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece pc = t->pieces.items[i];
        int rc = pc.added_id >= 0
                     ? tok_pieces_push(&t->next, pc, err)
                     : tok_chars_find(pred, ctx, t->arena.data + pc.off, pc.len, &t->segs, err);
        if (!rc && pc.added_id < 0) rc = push_split(t, pc, behavior, false, err);
        if (rc) return rc;
    }
    tok_text_commit(t);
    return SMELT_OK;
}

/* Points a piece at its ByteLevel image, appended to the arena. */
static int rewrite_byte_level(struct tok_text *t, struct tok_piece *pc, struct smelt_error *err) {
    int rc = tok_bytes_reserve(&t->arena, 2 * pc->len, err);
    if (rc) return rc;
    size_t off = t->arena.len;
    rc = tok_bytelevel_map(t->arena.data + pc->off, pc->len, &t->arena, err);
    if (rc) return rc;
    pc->off = off;
    pc->len = t->arena.len - off;
    return SMELT_OK;
}

static int byte_level(const struct tok_pretok *p, struct tok_text *t, struct smelt_error *err) {
    for (size_t i = 0; p->add_prefix_space && i < t->pieces.count; i++) {
        struct tok_piece *pc = &t->pieces.items[i];
        if (pc->added_id >= 0 || (pc->len > 0 && t->arena.data[pc->off] == ' ')) continue;
        int rc = tok_bytes_reserve(&t->arena, pc->len + 1, err);
        if (rc) return rc;
        size_t off = t->arena.len;
        t->arena.data[t->arena.len++] = ' ';
        memcpy(t->arena.data + t->arena.len, t->arena.data + pc->off, pc->len);
        t->arena.len += pc->len;
        pc->off = off;
        pc->len += 1;
    }
    if (p->use_regex) {
        int rc = tok_split_pieces(t, &p->pattern, TOK_SPLIT_ISOLATED, false, err);
        if (rc) return rc;
    }
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece *pc = &t->pieces.items[i];
        if (pc->added_id >= 0) continue;
        int rc = rewrite_byte_level(t, pc, err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

/* Spaces become the replacement character; the replacement is prepended per scheme
 * unless the piece already starts with it. */
static int metaspace(const struct tok_pretok *p, struct tok_text *t, struct smelt_error *err) {
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece *pc = &t->pieces.items[i];
        if (pc->added_id >= 0) continue;
        size_t rl = p->replacement_len;
        int rc = tok_bytes_reserve(&t->arena, rl * (pc->len + 1), err);
        if (rc) return rc;
        const char *in = t->arena.data + pc->off;
        bool starts = pc->len > 0 && (in[0] == ' ' || (pc->len >= rl && !memcmp(in, p->replacement, rl)));
        bool prepend = !starts && (p->prepend_scheme == TOK_PREPEND_ALWAYS ||
                                   (p->prepend_scheme == TOK_PREPEND_FIRST && pc->at_start));
        size_t off = t->arena.len;
        char *w = t->arena.data + off;
        if (prepend) {
            memcpy(w, p->replacement, rl);
            w += rl;
        }
        for (size_t k = 0; k < pc->len; k++) {
            if (in[k] != ' ') {
                *w++ = in[k];
                continue;
            }
            memcpy(w, p->replacement, rl);
            w += rl;
        }
        t->arena.len = (size_t)(w - t->arena.data);
        pc->off = off;
        pc->len = t->arena.len - off;
    }
    if (!p->split) return SMELT_OK;
    int32_t cp;
    tok_utf8_decode(p->replacement, p->replacement_len, &cp);
    return split_chars(t, is_char_pred, &cp, TOK_SPLIT_MERGED_WITH_NEXT, err);
}

int tok_pretokenize(const struct tok_pretok *p, struct tok_text *t, struct smelt_error *err) {
    switch (p->kind) {
    case TOK_PRETOK_SPLIT: return tok_split_pieces(t, &p->pattern, p->behavior, p->invert, err);
    case TOK_PRETOK_BYTE_LEVEL: return byte_level(p, t, err);
    case TOK_PRETOK_METASPACE: return metaspace(p, t, err);
    case TOK_PRETOK_DIGITS:
        return split_chars(t, is_numeric_pred, NULL,
                           p->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, err);
    case TOK_PRETOK_SEQUENCE:
        for (size_t i = 0; i < p->n_items; i++) {
            int rc = tok_pretokenize(&p->items[i], t, err);
            if (rc) return rc;
        }
        return SMELT_OK;
    }
    return error_set(err, SMELT_EINVAL, "tokenizer: unknown pre-tokenizer kind %d", (int)p->kind);
}
