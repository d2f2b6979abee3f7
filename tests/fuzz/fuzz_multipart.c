/* multipart/form-data (server/http_multipart.c), the body of POST /v1/files: the input is
 * a boundary and a body. Byte 0: the boundary's length (low 7 bits, up to 127, so lengths
 * past RFC 2046's 70 are tried) and whether Content-Type quotes it (high bit); then the
 * boundary's bytes, then the body. Parts that parse must lie inside the body, in order,
 * with NUL-terminated names, filenames and types; a refusal must say why. */
#include "server/http_internal.h"
#include "tests/fuzz/fuzz.h"

#define MAX_PARTS 8

static void check_part(const struct http_part *p, const char *body, size_t len, const char *after) {
    if (!memchr(p->name, 0, sizeof p->name) || !memchr(p->filename, 0, sizeof p->filename) ||
        !memchr(p->content_type, 0, sizeof p->content_type) || !p->name[0])
        abort(); /* a name, filename or type not NUL-terminated, or a part without a name */
    if (p->data < after || p->data > body + len || p->len > (size_t)(body + len - p->data))
        abort(); /* a part's data outside the body, or before the end of the part before it */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t blen = data[0] & 0x7f;
    bool quoted = data[0] & 0x80;
    if (blen > size - 1) blen = size - 1;
    char ctype[256];
    snprintf(ctype, sizeof ctype, "multipart/form-data; boundary=%s%.*s%s", quoted ? "\"" : "", (int)blen,
             (const char *)data + 1, quoted ? "\"" : "");
    /* the body in a buffer of its own size, so a read past its end is caught */
    size_t len = size - 1 - blen;
    char *body = malloc(len ? len : 1);
    if (!body) abort();
    memcpy(body, data + 1 + blen, len);
    struct http_part parts[MAX_PARTS];
    int n = -1;
    struct smelt_error err = {0};
    int rc = http_multipart_parse_body(ctype, body, len, parts, MAX_PARTS, &n, &err);
    if (n < 0 || n > MAX_PARTS || (rc && !err.message[0])) abort();
    const char *after = body;
    for (int i = 0; i < n; i++) { /* also the parts read before a refusal */
        check_part(&parts[i], body, len, after);
        after = parts[i].data + parts[i].len;
    }
    free(body);
    return 0;
}
