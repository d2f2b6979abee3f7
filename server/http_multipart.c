/* multipart/form-data (RFC 7578 over RFC 2046): the boundary from Content-Type, then
 * parts of "headers CRLF CRLF data", each ended by "CRLF --boundary". Binary-safe: data
 * is searched with memmem, and a "CRLF --boundary" counts only when what follows is
 * "--" (the last) or optional blanks and CRLF (another part), as RFC 2046 requires. */
#include "server/http_internal.h"

#include <string.h>
#include <strings.h>

#define BOUNDARY_MAX 70   /* RFC 2046 */
#define PARAM_VALUE_BYTES 512

static bool is_blank(char c) { return c == ' ' || c == '\t'; }

static bool is_token_char(char c) {
    return c > ' ' && c < 127 && !strchr("()<>@,;:\\\"/[]?={}", c);
}

/* Reads the next "; name=value" parameter of a header value from *cursor (end of the
 * value at end). Returns 1 when one was read, 0 at the end, or SMELT_EFORMAT. Quoted
 * values lose their quotes and backslash escapes of '"' and '\'. */
static int next_param(const char **cursor, const char *end, char name[64],
                      char value[PARAM_VALUE_BYTES], struct smelt_error *err) {
    const char *p = *cursor;
    while (p < end && (is_blank(*p) || *p == ';')) p++;
    if (p == end) return 0;
    size_t n = 0;
    while (p < end && is_token_char(*p) && *p != '=') {
        if (n + 1 >= 64) return error_set(err, SMELT_EFORMAT, "a parameter name is too long");
        name[n++] = *p++;
    }
    name[n] = '\0';
    while (p < end && is_blank(*p)) p++;
    if (n == 0 || p == end || *p != '=')
        return error_set(err, SMELT_EFORMAT, "parameter '%s' has no '=value'", name);
    p++;
    while (p < end && is_blank(*p)) p++;
    size_t v = 0;
    if (p < end && *p == '"') {
        for (p++;; p++) {
            if (p == end)
                return error_set(err, SMELT_EFORMAT, "parameter '%s': unterminated quote", name);
            if (*p == '"') break;
            if (*p == '\\' && p + 1 < end && (p[1] == '"' || p[1] == '\\')) p++;
            if (v + 1 >= PARAM_VALUE_BYTES)
                return error_set(err, SMELT_EFORMAT, "parameter '%s' is longer than %d bytes",
                                 name, PARAM_VALUE_BYTES - 1);
            value[v++] = *p;
        }
        p++;
    } else {
        while (p < end && *p != ';' && !is_blank(*p)) {
            if (v + 1 >= PARAM_VALUE_BYTES)
                return error_set(err, SMELT_EFORMAT, "parameter '%s' is longer than %d bytes",
                                 name, PARAM_VALUE_BYTES - 1);
            value[v++] = *p++;
        }
    }
    value[v] = '\0';
    while (p < end && is_blank(*p)) p++;
    if (p < end && *p != ';')
        return error_set(err, SMELT_EFORMAT, "parameter '%s': unexpected text after its value",
                         name);
    *cursor = p;
    return 1;
}

/* Case-insensitive: does [p, end) start with word, followed by end, ';' or a blank? */
static bool starts_with_word(const char *p, const char *end, const char *word) {
    size_t n = strlen(word);
    return (size_t)(end - p) >= n && strncasecmp(p, word, n) == 0 &&
           (p + n == end || p[n] == ';' || is_blank(p[n]));
}

static int boundary_from_content_type(const char *ctype, char boundary[BOUNDARY_MAX + 1],
                                      struct smelt_error *err) {
    const char *p = ctype, *end = ctype + strlen(ctype);
    while (p < end && is_blank(*p)) p++;
    if (!starts_with_word(p, end, "multipart/form-data"))
        return error_set(err, SMELT_EFORMAT, "Content-Type is '%.80s', not multipart/form-data",
                         ctype);
    p += strlen("multipart/form-data");
    char name[64], value[PARAM_VALUE_BYTES];
    boundary[0] = '\0';
    int rc;
    while ((rc = next_param(&p, end, name, value, err)) == 1) {
        if (strcasecmp(name, "boundary") != 0) continue;
        size_t len = strlen(value);
        if (len < 1 || len > BOUNDARY_MAX)
            return error_set(err, SMELT_EFORMAT,
                             "the multipart boundary is %zu bytes long; 1 to %d allowed", len,
                             BOUNDARY_MAX);
        memcpy(boundary, value, len + 1);
    }
    if (rc < 0) return error_wrap(err, rc, "Content-Type");
    if (!boundary[0])
        return error_set(err, SMELT_EFORMAT, "Content-Type has no boundary parameter");
    return SMELT_OK;
}

/* A delimiter is "--boundary" followed by "--" (the close delimiter) or by blanks and
 * CRLF. at points at the "--"; on a match *next is where the next part (or the epilogue)
 * begins and *last says which kind it was. */
static bool delimiter_at(const char *at, const char *end, const char *boundary, size_t blen,
                         const char **next, bool *last) {
    if ((size_t)(end - at) < 2 + blen || memcmp(at, "--", 2) != 0 ||
        memcmp(at + 2, boundary, blen) != 0)
        return false;
    const char *p = at + 2 + blen;
    if (end - p >= 2 && memcmp(p, "--", 2) == 0) {
        *next = p + 2;
        *last = true;
        return true;
    }
    while (p < end && is_blank(*p)) p++;
    if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
        *next = p + 2;
        *last = false;
        return true;
    }
    return false;
}

/* The first "CRLF --boundary" delimiter at or after from: returns where its CRLF starts,
 * or NULL. */
static const char *find_delimiter(const char *from, const char *end, const char *boundary,
                                  size_t blen, const char **next, bool *last) {
    while (from < end) {
        const char *hit = memmem(from, (size_t)(end - from), "\r\n--", 4);
        if (!hit) return NULL;
        if (delimiter_at(hit + 2, end, boundary, blen, next, last)) return hit;
        from = hit + 1;
    }
    return NULL;
}

/* Copies a header value (trimmed) into out; SMELT_EFORMAT when it does not fit. */
static int copy_trimmed(const char *p, const char *end, char *out, size_t cap, const char *what,
                        int index, struct smelt_error *err) {
    while (p < end && is_blank(*p)) p++;
    while (end > p && is_blank(end[-1])) end--;
    size_t len = (size_t)(end - p);
    if (len >= cap)
        return error_set(err, SMELT_EFORMAT, "part %d: %s is longer than %zu bytes", index, what,
                         cap - 1);
    memcpy(out, p, len);
    out[len] = '\0';
    return SMELT_OK;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* filename*=UTF-8''percent-encoded (RFC 5987); 0 and out filled, or SMELT_EFORMAT. */
static int decode_ext_filename(const char *value, char *out, size_t cap, int index,
                               struct smelt_error *err) {
    const char *q = strstr(value, "''");
    if (strncasecmp(value, "utf-8''", 7) != 0 || !q)
        return error_set(err, SMELT_EFORMAT, "part %d: filename* is not UTF-8''...", index);
    size_t n = 0;
    for (const char *p = q + 2; *p; p++) {
        char c = *p;
        int hi, lo;
        if (c == '%' && (hi = hex_value(p[1])) >= 0 && (lo = hex_value(p[2])) >= 0 &&
            (hi | lo) != 0) {
            c = (char)(hi * 16 + lo);
            p += 2;
        }
        if (n + 1 >= cap)
            return error_set(err, SMELT_EFORMAT, "part %d: filename is longer than %zu bytes",
                             index, cap - 1);
        out[n++] = c;
    }
    out[n] = '\0';
    return SMELT_OK;
}

static int parse_disposition(const char *p, const char *end, struct http_part *part, int index,
                             struct smelt_error *err) {
    while (p < end && is_blank(*p)) p++;
    if (!starts_with_word(p, end, "form-data"))
        return error_set(err, SMELT_EFORMAT, "part %d: Content-Disposition is not form-data",
                         index);
    p += strlen("form-data");
    char name[64], value[PARAM_VALUE_BYTES];
    bool has_name = false, has_ext_filename = false;
    int rc;
    while ((rc = next_param(&p, end, name, value, err)) == 1) {
        size_t len = strlen(value);
        if (strcasecmp(name, "name") == 0) {
            if (len >= sizeof part->name)
                return error_set(err, SMELT_EFORMAT, "part %d: name is longer than %zu bytes",
                                 index, sizeof part->name - 1);
            memcpy(part->name, value, len + 1);
            has_name = true;
        } else if (strcasecmp(name, "filename") == 0 && !has_ext_filename) {
            if (len >= sizeof part->filename)
                return error_set(err, SMELT_EFORMAT, "part %d: filename is longer than %zu bytes",
                                 index, sizeof part->filename - 1);
            memcpy(part->filename, value, len + 1);
        } else if (strcasecmp(name, "filename*") == 0) {
            rc = decode_ext_filename(value, part->filename, sizeof part->filename, index, err);
            if (rc) return rc;
            has_ext_filename = true;
        }
    }
    if (rc < 0) return error_wrap(err, rc, "part %d: Content-Disposition", index);
    if (!has_name || !part->name[0])
        return error_set(err, SMELT_EFORMAT, "part %d: Content-Disposition has no name", index);
    return SMELT_OK;
}

/* Header lines of one part, [p, end) without the blank line that ends them. */
static int parse_part_headers(const char *p, const char *end, struct http_part *part, int index,
                              struct smelt_error *err) {
    bool has_disposition = false;
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (!eol) eol = end;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p)
            return error_set(err, SMELT_EFORMAT, "part %d: header line without 'Name:'", index);
        size_t name_len = (size_t)(colon - p);
        int rc = SMELT_OK;
        if (name_len == 19 && strncasecmp(p, "Content-Disposition", 19) == 0) {
            rc = parse_disposition(colon + 1, eol, part, index, err);
            has_disposition = true;
        } else if (name_len == 12 && strncasecmp(p, "Content-Type", 12) == 0) {
            rc = copy_trimmed(colon + 1, eol, part->content_type, sizeof part->content_type,
                              "Content-Type", index, err);
        }
        if (rc) return rc;
        p = eol == end ? end : eol + 2;
    }
    if (!has_disposition)
        return error_set(err, SMELT_EFORMAT, "part %d: no Content-Disposition header", index);
    return SMELT_OK;
}

/* Where the body's first delimiter ends: "--boundary" at the very start, or after a
 * preamble ending in CRLF. NULL when there is none. */
static const char *skip_preamble(const char *body, const char *end, const char *boundary,
                                 size_t blen, bool *last) {
    const char *next;
    if (delimiter_at(body, end, boundary, blen, &next, last)) return next;
    return find_delimiter(body, end, boundary, blen, &next, last) ? next : NULL;
}

int http_multipart_parse(const struct http_request *req, struct http_part *parts, int max,
                         int *n, struct smelt_error *err) {
    return http_multipart_parse_body(http_header(req, "Content-Type"), req->body, req->body_len,
                                     parts, max, n, err);
}

int http_multipart_parse_body(const char *ctype, const char *body, size_t body_len,
                              struct http_part *parts, int max, int *n, struct smelt_error *err) {
    *n = 0;
    if (!ctype) return error_set(err, SMELT_EFORMAT, "multipart body without a Content-Type");
    char boundary[BOUNDARY_MAX + 1];
    int rc = boundary_from_content_type(ctype, boundary, err);
    if (rc) return rc;
    size_t blen = strlen(boundary);

    const char *end = body + body_len;
    bool last = false;
    const char *p = skip_preamble(body, end, boundary, blen, &last);
    if (!p)
        return error_set(err, SMELT_EFORMAT, "multipart body has no '--%s' boundary line",
                         boundary);
    for (int index = 0; !last; index++) {
        if (index >= max)
            return error_set(err, SMELT_EFORMAT, "multipart body has more than %d parts", max);
        struct http_part *part = &parts[index];
        memset(part, 0, sizeof *part);
        const char *data;
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            data = p + 2; /* no headers at all: caught below as a missing disposition */
            rc = parse_part_headers(p, p, part, index, err);
        } else {
            const char *blank = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
            if (!blank)
                return error_set(err, SMELT_EFORMAT,
                                 "part %d: headers do not end with a blank line", index);
            data = blank + 4;
            rc = parse_part_headers(p, blank, part, index, err);
        }
        if (rc) return rc;
        /* The part's data may be empty, so its delimiter's CRLF can start right at data. */
        const char *data_end = find_delimiter(data, end, boundary, blen, &p, &last);
        if (!data_end)
            return error_set(err, SMELT_EFORMAT,
                             "part %d ('%s'): no boundary after its data (body cut short?)",
                             index, part->name);
        part->data = data;
        part->len = (size_t)(data_end - data);
        *n = index + 1;
    }
    return SMELT_OK;
}
