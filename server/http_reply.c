/* The reply helpers handlers use: JSON, text, OpenAI's error envelope, extra headers.
 * Error messages quote what clients sent (paths, names), so they are made valid UTF-8
 * first; jansson would refuse them otherwise and the envelope would be lost. */
#include "server/http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int utf8_char_len(const unsigned char *s) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* Copies src into dst (cap bytes), with '?' for every byte that is not valid UTF-8: error
 * messages quote paths and names from clients, and jansson refuses invalid strings. */
static void copy_utf8(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    const unsigned char *s = (const unsigned char *)src;
    while (*s && n + 1 < cap) {
        int len = utf8_char_len(s);
        if (len == 0) {
            dst[n++] = '?';
            s++;
        } else if (n + (size_t)len < cap) {
            memcpy(dst + n, s, (size_t)len);
            n += (size_t)len;
            s += len;
        } else {
            break;
        }
    }
    dst[n] = '\0';
}

static void response_clear_body(struct http_response *res) {
    free(res->body);
    res->body = NULL;
    res->body_len = 0;
}

void http_reply_json(struct http_response *res, int status, json_t *value) {
    response_clear_body(res);
    res->status = status;
    snprintf(res->content_type, sizeof res->content_type, "application/json");
    if (!value) return; /* a failed json_pack: answered as a handler bug (500) */
    /* jansson allocates with malloc (smelt never swaps its allocator), so the body can
     * be freed by MHD with free(). */
    res->body = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(value);
    if (res->body) res->body_len = strlen(res->body);
}

void http_reply_text(struct http_response *res, int status, const char *content_type,
                     const char *text, size_t len) {
    response_clear_body(res);
    res->status = status;
    snprintf(res->content_type, sizeof res->content_type, "%s", content_type);
    res->body = malloc(len + 1);
    if (!res->body) return;
    if (len) memcpy(res->body, text, len);
    res->body[len] = '\0';
    res->body_len = len;
}

static const char *error_type_for(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 409: return "conflict_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void http_reply_error(struct http_response *res, int status, const char *param,
                      const char *code, const char *fmt, ...) {
    char raw[1024], message[1024], param_utf8[256], code_utf8[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    copy_utf8(message, sizeof message, raw);
    if (param) copy_utf8(param_utf8, sizeof param_utf8, param);
    if (code) copy_utf8(code_utf8, sizeof code_utf8, code);
    json_t *body = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", message, "type",
                             error_type_for(status), "param", param ? param_utf8 : NULL,
                             "code", code ? code_utf8 : NULL);
    http_reply_json(res, status, body);
    if (!res->body) { /* out of memory: still answer with the envelope */
        static const char fallback[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
            "\"param\":null,\"code\":null}}";
        http_reply_text(res, status, "application/json", fallback, sizeof fallback - 1);
    }
}

void http_add_header(struct http_response *res, const char *name, const char *value) {
    /* Overflow marks the response as broken (n_headers past the end); it is answered
     * with 500 rather than sent without the header. */
    if (res->n_headers < 0 || res->n_headers >= HTTP_MAX_HEADERS ||
        strlen(name) >= sizeof res->headers[0].name ||
        strlen(value) >= sizeof res->headers[0].value) {
        res->n_headers = HTTP_MAX_HEADERS + 1;
        return;
    }
    snprintf(res->headers[res->n_headers].name, sizeof res->headers[0].name, "%s", name);
    snprintf(res->headers[res->n_headers].value, sizeof res->headers[0].value, "%s", value);
    res->n_headers++;
}
