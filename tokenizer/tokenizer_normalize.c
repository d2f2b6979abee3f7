/* Normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Replace, Prepend, Sequence.
 * Unicode forms apply to each run of valid UTF-8; invalid bytes are copied as they are. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/json.h"

#define SUPPORTED "NFC, NFD, NFKC, NFKD, Replace, Prepend, Sequence"

static int parse_node(const json_t *j, const char *where, struct tok_normalizer *n,
                      struct smelt_error *err);

static int parse_sequence(const json_t *j, const char *where, struct tok_normalizer *n,
                          struct smelt_error *err) {
    static const char *const keys[] = {"type", "normalizers", NULL};
    int rc = json_check_keys(j, keys, where, err);
    if (rc) return rc;
    const json_t *arr = json_object_get(j, "normalizers");
    if (!json_is_array(arr))
        return error_set(err, SMELT_EFORMAT, "%s: 'normalizers' must be an array", where);
    size_t count = json_array_size(arr);
    n->items = calloc(count ? count : 1, sizeof *n->items);
    if (!n->items) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    for (size_t i = 0; i < count; i++) {
        char sub[400];
        snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
        n->n_items = i + 1; /* so that a failure frees what was parsed */
        rc = parse_node(json_array_get(arr, i), sub, &n->items[i], err);
        if (rc) return rc;
    }
    n->n_items = count;
    return SMELT_OK;
}

static int copy_string_field(const json_t *j, const char *key, const char *where, char **out,
                             size_t *len, struct smelt_error *err) {
    const json_t *v = json_object_get(j, key);
    if (!json_is_string(v))
        return error_set(err, SMELT_EFORMAT, "%s: field '%s' must be a string", where, key);
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    memcpy(*out, json_string_value(v), *len + 1);
    return SMELT_OK;
}

static int parse_node(const json_t *j, const char *where, struct tok_normalizer *n,
                      struct smelt_error *err) {
    *n = (struct tok_normalizer){0};
    const char *type;
    int rc = json_field_string(j, "type", true, NULL, &type, where, err);
    if (rc) return rc;
    static const char *const only_type[] = {"type", NULL};
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") ||
        !strcmp(type, "NFKD")) {
        n->kind = !strcmp(type, "NFC")    ? TOK_NORM_NFC
                  : !strcmp(type, "NFD")  ? TOK_NORM_NFD
                  : !strcmp(type, "NFKC") ? TOK_NORM_NFKC
                                          : TOK_NORM_NFKD;
        return json_check_keys(j, only_type, where, err);
    }
    if (!strcmp(type, "Replace")) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        n->kind = TOK_NORM_REPLACE;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = tok_pattern_parse(json_object_get(j, "pattern"), where, &n->pattern, err);
        if (!rc) rc = copy_string_field(j, "content", where, &n->content, &n->content_len, err);
        return rc;
    }
    if (!strcmp(type, "Prepend")) {
        static const char *const keys[] = {"type", "prepend", NULL};
        n->kind = TOK_NORM_PREPEND;
        rc = json_check_keys(j, keys, where, err);
        if (!rc) rc = copy_string_field(j, "prepend", where, &n->content, &n->content_len, err);
        return rc;
    }
    if (!strcmp(type, "Sequence")) {
        n->kind = TOK_NORM_SEQUENCE;
        return parse_sequence(j, where, n, err);
    }
    return error_set(err, SMELT_EUNSUPPORTED,
                     "%s: unsupported normalizer type '%s' (smelt reads " SUPPORTED ")", where,
                     type);
}

static void free_node(struct tok_normalizer *n) {
    tok_pattern_free(&n->pattern);
    free(n->content);
    for (size_t i = 0; i < n->n_items; i++) free_node(&n->items[i]);
    free(n->items);
}

void tok_normalizer_free(struct tok_normalizer *n) {
    if (!n) return;
    free_node(n);
    free(n);
}

int tok_normalizer_parse(const json_t *j, const char *where, struct tok_normalizer **out,
                         struct smelt_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return SMELT_OK;
    struct tok_normalizer *n = calloc(1, sizeof *n);
    if (!n) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    int rc = parse_node(j, where, n, err);
    if (rc) {
        tok_normalizer_free(n);
        return rc;
    }
    *out = n;
    return SMELT_OK;
}

static int unicode_form(enum tok_norm_kind kind, const char *in, size_t len,
                        struct tok_bytes *out, struct smelt_error *err) {
    utf8proc_option_t opts = UTF8PROC_STABLE;
    if (kind == TOK_NORM_NFC || kind == TOK_NORM_NFKC) opts |= UTF8PROC_COMPOSE;
    else opts |= UTF8PROC_DECOMPOSE;
    if (kind == TOK_NORM_NFKC || kind == TOK_NORM_NFKD) opts |= UTF8PROC_COMPAT;
    size_t i = 0;
    while (i < len) {
        /* A run of valid characters; ASCII-only runs are already in every form. */
        size_t run = i;
        bool ascii = true;
        int32_t cp;
        size_t k;
        while (run < len && (k = tok_utf8_decode(in + run, len - run, &cp)) > 0) {
            ascii &= cp < 0x80;
            run += k;
        }
        int rc;
        if (ascii) {
            rc = tok_bytes_append(out, in + i, run - i, err);
        } else {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)in + i,
                                              (utf8proc_ssize_t)(run - i), &dst, opts);
            if (n < 0) {
                free(dst);
                return error_set(err, n == UTF8PROC_ERROR_NOMEM ? SMELT_ENOMEM : SMELT_EINVAL,
                                 "tokenizer: Unicode normalization failed: %s",
                                 utf8proc_errmsg(n));
            }
            rc = tok_bytes_append(out, dst, (size_t)n, err);
            free(dst);
        }
        if (!rc && run < len) rc = tok_bytes_append(out, in + run, 1, err); /* invalid byte */
        if (rc) return rc;
        i = run < len ? run + 1 : run;
    }
    return SMELT_OK;
}

static int replace(const struct tok_normalizer *n, const char *in, size_t len,
                   struct tok_bytes *out, struct smelt_error *err) {
    struct tok_segments segs = {0};
    int rc = tok_pattern_find(&n->pattern, in, len, &segs, err);
    for (size_t i = 0; !rc && i < segs.count; i++) {
        const struct tok_segment *s = &segs.items[i];
        if (s->is_match) rc = tok_bytes_append(out, n->content, n->content_len, err);
        else rc = tok_bytes_append(out, in + s->start, s->end - s->start, err);
    }
    free(segs.items);
    return rc;
}

static int sequence(const struct tok_normalizer *n, const char *in, size_t len,
                    struct tok_bytes *out, struct smelt_error *err) {
    struct tok_bytes a = {0}, b = {0};
    int rc = tok_bytes_append(&a, in, len, err);
    for (size_t i = 0; !rc && i < n->n_items; i++) {
        rc = tok_normalize(&n->items[i], a.data, a.len, &b, err);
        struct tok_bytes t = a;
        a = b;
        b = t;
    }
    if (!rc) rc = tok_bytes_append(out, a.data, a.len, err);
    tok_bytes_free(&a);
    tok_bytes_free(&b);
    return rc;
}

int tok_normalize(const struct tok_normalizer *n, const char *in, size_t len,
                  struct tok_bytes *out, struct smelt_error *err) {
    out->len = 0;
    switch (n->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: return unicode_form(n->kind, in, len, out, err);
    case TOK_NORM_REPLACE: return replace(n, in, len, out, err);
    case TOK_NORM_PREPEND: {
        if (len == 0) return SMELT_OK; /* as `tokenizers`: nothing is prepended to "" */
        int rc = tok_bytes_append(out, n->content, n->content_len, err);
        return rc ? rc : tok_bytes_append(out, in, len, err);
    }
    case TOK_NORM_SEQUENCE: return sequence(n, in, len, out, err);
    }
    return error_set(err, SMELT_EINVAL, "tokenizer: unknown normalizer kind %d", (int)n->kind);
}
