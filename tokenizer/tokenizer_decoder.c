/* Decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence. Each maps
 * a list of token strings to a list of strings, as in `tokenizers`; the decoded text is
 * the concatenation of the last list. One deliberate difference: byte sequences that are
 * not valid UTF-8 come out as those bytes, not as U+FFFD, so that decode(encode(x)) == x
 * for any bytes x. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#define SUPPORTED "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence"

int tok_strlist_push(struct tok_strlist *l, const char *s, size_t n, struct smelt_error *err) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *off = realloc(l->off, cap * sizeof *off);
        if (!off) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu strings", cap);
        l->off = off;
        size_t *len = realloc(l->len, cap * sizeof *len);
        if (!len) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu strings", cap);
        l->len = len;
        l->cap = cap;
    }
    l->off[l->count] = l->data.len;
    l->len[l->count] = n;
    int rc = tok_bytes_append(&l->data, s, n, err);
    if (rc) return rc;
    l->count++;
    return SMELT_OK;
}

void tok_strlist_clear(struct tok_strlist *l) {
    l->count = 0;
    l->data.len = 0;
}

void tok_strlist_free(struct tok_strlist *l) {
    tok_bytes_free(&l->data);
    free(l->off);
    free(l->len);
    *l = (struct tok_strlist){0};
}

static int parse_node(const json_t *j, const char *where, struct tok_decoder *d,
                      struct smelt_error *err);

static int parse_sequence(const json_t *j, const char *where, struct tok_decoder *d,
                          struct smelt_error *err) {
    static const char *const keys[] = {"type", "decoders", NULL};
    int rc = json_check_keys(j, keys, where, err);
    if (rc) return rc;
    const json_t *arr = json_object_get(j, "decoders");
    if (!json_is_array(arr))
        return error_set(err, SMELT_EFORMAT, "%s: 'decoders' must be an array", where);
    size_t count = json_array_size(arr);
    d->items = calloc(count ? count : 1, sizeof *d->items);
    if (!d->items) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    for (size_t i = 0; i < count; i++) {
        char sub[400];
        snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
        d->n_items = i + 1;
        rc = parse_node(json_array_get(arr, i), sub, &d->items[i], err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

static int parse_char(const json_t *j, const char *key, const char *where, char out[4],
                      size_t *len, struct smelt_error *err) {
    const char *s;
    int rc = json_field_string(j, key, true, NULL, &s, where, err);
    if (rc) return rc;
    int32_t cp;
    size_t n = strlen(s), k = tok_utf8_decode(s, n, &cp);
    if (k == 0 || k != n)
        return error_set(err, SMELT_EFORMAT, "%s: '%s' must be one character", where, key);
    memcpy(out, s, k);
    *len = k;
    return SMELT_OK;
}

static int parse_strip(const json_t *j, const char *where, struct tok_decoder *d,
                       struct smelt_error *err) {
    static const char *const keys[] = {"type", "content", "start", "stop", NULL};
    int64_t start = 0, stop = 0;
    int rc = json_check_keys(j, keys, where, err);
    if (!rc) rc = parse_char(j, "content", where, d->strip, &d->strip_len, err);
    if (!rc) rc = json_field_int(j, "start", true, 0, 0, 1 << 20, &start, where, err);
    if (!rc) rc = json_field_int(j, "stop", true, 0, 0, 1 << 20, &stop, where, err);
    d->strip_start = (size_t)start;
    d->strip_stop = (size_t)stop;
    return rc;
}

static int parse_replace(const json_t *j, const char *where, struct tok_decoder *d,
                         struct smelt_error *err) {
    static const char *const keys[] = {"type", "pattern", "content", NULL};
    int rc = json_check_keys(j, keys, where, err);
    if (!rc) rc = tok_pattern_parse(json_object_get(j, "pattern"), where, &d->pattern, err);
    if (rc) return rc;
    const json_t *c = json_object_get(j, "content");
    if (!json_is_string(c))
        return error_set(err, SMELT_EFORMAT, "%s: field 'content' must be a string", where);
    d->content_len = json_string_length(c);
    d->content = malloc(d->content_len + 1);
    if (!d->content) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    memcpy(d->content, json_string_value(c), d->content_len + 1);
    return SMELT_OK;
}

static int parse_node(const json_t *j, const char *where, struct tok_decoder *d,
                      struct smelt_error *err) {
    *d = (struct tok_decoder){0};
    const char *type;
    int rc = json_field_string(j, "type", true, NULL, &type, where, err);
    if (rc) return rc;
    static const char *const only_type[] = {"type", NULL};
    if (!strcmp(type, "ByteLevel")) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets",
                                           "use_regex", NULL};
        d->kind = TOK_DEC_BYTE_LEVEL;
        return json_check_keys(j, keys, where, err);
    }
    if (!strcmp(type, "Metaspace")) {
        static const char *const keys[] = {"type", "replacement", "add_prefix_space",
                                           "prepend_scheme", "split", "str_rep", NULL};
        d->kind = TOK_DEC_METASPACE;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = parse_char(j, "replacement", where, d->replacement, &d->replacement_len, err);
        if (!rc) rc = tok_parse_prepend_scheme(j, where, &d->prepend_scheme, err);
        return rc;
    }
    if (!strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")) {
        d->kind = !strcmp(type, "Fuse") ? TOK_DEC_FUSE : TOK_DEC_BYTE_FALLBACK;
        return json_check_keys(j, only_type, where, err);
    }
    if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        return parse_strip(j, where, d, err);
    }
    if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        return parse_replace(j, where, d, err);
    }
    if (!strcmp(type, "Sequence")) {
        d->kind = TOK_DEC_SEQUENCE;
        return parse_sequence(j, where, d, err);
    }
    return error_set(err, SMELT_EUNSUPPORTED,
                     "%s: unsupported decoder type '%s' (smelt reads " SUPPORTED ")", where, type);
}

static void free_node(struct tok_decoder *d) {
    tok_pattern_free(&d->pattern);
    free(d->content);
    for (size_t i = 0; i < d->n_items; i++) free_node(&d->items[i]);
    free(d->items);
}

void tok_decoder_free(struct tok_decoder *d) {
    if (!d) return;
    free_node(d);
    free(d);
}

int tok_decoder_parse(const json_t *j, const char *where, struct tok_decoder **out,
                      struct smelt_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return SMELT_OK;
    struct tok_decoder *d = calloc(1, sizeof *d);
    if (!d) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    int rc = parse_node(j, where, d, err);
    if (rc) {
        tok_decoder_free(d);
        return rc;
    }
    *out = d;
    return SMELT_OK;
}

/* Concatenates every token's bytes: its characters mapped back through the byte-level
 * table, or the token as it is when some character is outside the table. */
static int byte_level(const struct tok_strlist *in, struct tok_strlist *out,
                      struct smelt_error *err) {
    struct tok_bytes *b = &out->data;
    int rc = tok_strlist_push(out, "", 0, err);
    for (size_t i = 0; !rc && i < in->count; i++) {
        const char *s = in->data.data + in->off[i];
        bool ok;
        rc = tok_bytelevel_unmap(s, in->len[i], b, &ok, err);
        if (!rc && !ok) rc = tok_bytes_append(b, s, in->len[i], err);
    }
    if (!rc) out->len[0] = b->len;
    return rc;
}

static int metaspace(const struct tok_decoder *d, const struct tok_strlist *in,
                     struct tok_strlist *out, struct smelt_error *err) {
    size_t rl = d->replacement_len;
    for (size_t i = 0; i < in->count; i++) {
        const char *s = in->data.data + in->off[i];
        size_t n = in->len[i], start = out->data.len;
        bool drop = i == 0 && d->prepend_scheme != TOK_PREPEND_NEVER;
        int rc = tok_strlist_push(out, "", 0, err);
        for (size_t k = 0; !rc && k < n;) {
            if (n - k >= rl && !memcmp(s + k, d->replacement, rl)) {
                if (!drop) rc = tok_bytes_append(&out->data, " ", 1, err);
                k += rl;
            } else {
                rc = tok_bytes_append(&out->data, s + k, 1, err);
                k++;
            }
        }
        if (rc) return rc;
        out->len[out->count - 1] = out->data.len - start;
    }
    return SMELT_OK;
}

/* "<0xNN>" → 0..255, else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int h = c >= '0' && c <= '9' ? c - '0'
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Runs of <0xNN> tokens become one string of those bytes. */
static int byte_fallback(const struct tok_strlist *in, struct tok_strlist *out,
                         struct smelt_error *err) {
    bool in_run = false;
    for (size_t i = 0; i < in->count; i++) {
        const char *s = in->data.data + in->off[i];
        int b = byte_token(s, in->len[i]);
        int rc;
        if (b >= 0 && in_run) {
            char c = (char)b;
            rc = tok_bytes_append(&out->data, &c, 1, err);
            if (!rc) out->len[out->count - 1]++;
        } else if (b >= 0) {
            char c = (char)b;
            rc = tok_strlist_push(out, &c, 1, err);
        } else {
            rc = tok_strlist_push(out, s, in->len[i], err);
        }
        if (rc) return rc;
        in_run = b >= 0;
    }
    return SMELT_OK;
}

static int strip(const struct tok_decoder *d, const struct tok_strlist *in,
                 struct tok_strlist *out, struct smelt_error *err) {
    size_t cl = d->strip_len;
    for (size_t i = 0; i < in->count; i++) {
        const char *s = in->data.data + in->off[i];
        size_t lo = 0, hi = in->len[i];
        for (size_t k = 0; k < d->strip_start && hi - lo >= cl && !memcmp(s + lo, d->strip, cl); k++)
            lo += cl;
        for (size_t k = 0; k < d->strip_stop && hi - lo >= cl && !memcmp(s + hi - cl, d->strip, cl); k++)
            hi -= cl;
        int rc = tok_strlist_push(out, s + lo, hi - lo, err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

static int replace(const struct tok_decoder *d, const struct tok_strlist *in,
                   struct tok_strlist *out, struct smelt_error *err) {
    struct tok_segments segs = {0};
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < in->count; i++) {
        const char *s = in->data.data + in->off[i];
        size_t start = out->data.len;
        rc = tok_pattern_find(&d->pattern, s, in->len[i], &segs, err);
        if (!rc) rc = tok_strlist_push(out, "", 0, err);
        for (size_t k = 0; !rc && k < segs.count; k++) {
            const struct tok_segment *g = &segs.items[k];
            rc = g->is_match ? tok_bytes_append(&out->data, d->content, d->content_len, err)
                             : tok_bytes_append(&out->data, s + g->start, g->end - g->start, err);
        }
        if (!rc) out->len[out->count - 1] = out->data.len - start;
    }
    free(segs.items);
    return rc;
}

static int sequence(const struct tok_decoder *d, const struct tok_strlist *in,
                    struct tok_strlist *out, struct smelt_error *err) {
    struct tok_strlist a = {0}, b = {0};
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < in->count; i++)
        rc = tok_strlist_push(&a, in->data.data + in->off[i], in->len[i], err);
    for (size_t i = 0; !rc && i < d->n_items; i++) {
        rc = tok_decoder_apply(&d->items[i], &a, &b, err);
        struct tok_strlist t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; !rc && i < a.count; i++)
        rc = tok_strlist_push(out, a.data.data + a.off[i], a.len[i], err);
    tok_strlist_free(&a);
    tok_strlist_free(&b);
    return rc;
}

int tok_decoder_apply(const struct tok_decoder *d, const struct tok_strlist *in,
                      struct tok_strlist *out, struct smelt_error *err) {
    tok_strlist_clear(out);
    switch (d->kind) {
    case TOK_DEC_BYTE_LEVEL: return byte_level(in, out, err);
    case TOK_DEC_METASPACE: return metaspace(d, in, out, err);
    case TOK_DEC_BYTE_FALLBACK: return byte_fallback(in, out, err);
    case TOK_DEC_FUSE: {
        int rc = tok_strlist_push(out, "", 0, err);
        for (size_t i = 0; !rc && i < in->count; i++)
            rc = tok_bytes_append(&out->data, in->data.data + in->off[i], in->len[i], err);
        if (!rc) out->len[0] = out->data.len;
        return rc;
    }
    case TOK_DEC_STRIP: return strip(d, in, out, err);
    case TOK_DEC_REPLACE: return replace(d, in, out, err);
    case TOK_DEC_SEQUENCE: return sequence(d, in, out, err);
    }
    return error_set(err, SMELT_EINVAL, "tokenizer: unknown decoder kind %d", (int)d->kind);
}
