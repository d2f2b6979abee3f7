/* Byte buffers, id lists, UTF-8 decoding and the character classes the tokenizer needs. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int tok_bytes_reserve(struct tok_bytes *b, size_t extra, struct smelt_error *err) {
    if (extra <= b->cap - b->len) return SMELT_OK;
    if (extra > SIZE_MAX / 2 - b->len)
        return error_set(err, SMELT_ENOMEM, "tokenizer: buffer of %zu bytes is too large", extra);
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < extra) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return SMELT_OK;
}

int tok_bytes_append(struct tok_bytes *b, const void *src, size_t n, struct smelt_error *err) {
    int rc = tok_bytes_reserve(b, n, err);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
    return SMELT_OK;
}

void tok_bytes_free(struct tok_bytes *b) {
    free(b->data);
    *b = (struct tok_bytes){0};
}

int tok_ids_push(struct tok_ids *ids, int32_t id, struct smelt_error *err) {
    if (ids->count == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *p = realloc(ids->items, cap * sizeof *p);
        if (!p) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu ids", cap);
        ids->items = p;
        ids->cap = cap;
    }
    ids->items[ids->count++] = id;
    return SMELT_OK;
}

size_t tok_utf8_decode(const char *s, size_t n, int32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    unsigned char c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    int32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

size_t tok_utf8_unit(const char *s, size_t n) {
    int32_t cp;
    size_t k = tok_utf8_decode(s, n, &cp);
    return k ? k : 1;
}

size_t tok_utf8_encode(int32_t cp, char out[4]) {
    return (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}

bool tok_is_whitespace(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tok_is_numeric(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tok_is_alnum(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || tok_is_numeric(cp);
}
