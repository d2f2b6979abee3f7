/* Routing: which route serves a request, and what a path's Allow header says, both read
 * from the route table alone so they cannot disagree with it.
 *
 * A path is matched twice against each pattern: by shape (every {placeholder} takes any
 * non-empty segment) and strictly (the segment is an id). A path of a route's shape
 * belongs to that route even when its id is bad: the answer is 404 naming the id on that
 * route, never another route's 405. A trailing-"*" route (the page's static files) only
 * gets paths whose first segment no other route starts with, so /v1/... and /api/... never
 * fall through to it. */
#include "server/http_internal.h"

#include <stdio.h>
#include <string.h>

enum shape { SHAPE_NONE, SHAPE_BAD_ID, SHAPE_OK };

static bool is_id_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '-';
}

bool http_is_id(const char *s, size_t len) {
    if (len < 1 || len >= HTTP_ID_BYTES) return false;
    for (size_t i = 0; i < len; i++)
        if (!is_id_char(s[i])) return false;
    return true;
}

/* The rest a trailing "*" captures (a static file's path): no "." or ".." segment and
 * no empty segment before another one. "//" and backslashes are refused earlier. */
static bool rest_is_safe(const char *rest) {
    for (const char *seg = rest;;) {
        const char *end = strchrnul(seg, '/');
        size_t len = (size_t)(end - seg);
        if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        if (len == 0 && *end == '/') return false;
        if (!*end) return true;
        seg = end + 1;
    }
}

static bool is_wildcard(const struct http_route *r) {
    size_t len = strlen(r->pattern);
    return len >= 2 && strcmp(r->pattern + len - 2, "/*") == 0;
}

/* "file_id" of the pattern segment "{file_id}" (len bytes from '{'). */
static void placeholder_name(const char *p, size_t len, char *name, size_t cap) {
    snprintf(name, cap, "%.*s", (int)(len - 2), p + 1);
}

/* Matches path against pattern; captures point into scratch (a copy of path), cut at the
 * end of their segment. A capture that is not an id gives SHAPE_BAD_ID, with the first
 * such placeholder's name in m->bad_param. */
static enum shape route_shape(const char *pattern, const char *path, char *scratch,
                              struct http_route_match *m) {
    const char *p = pattern, *s = path;
    enum shape result = SHAPE_OK;
    m->n_params = 0;
    for (;;) {
        if (*p == '\0') return *s == '\0' ? result : SHAPE_NONE;
        if (*p != '/' || *s != '/') return SHAPE_NONE;
        p++;
        s++;
        if (p[0] == '*' && p[1] == '\0') {
            if (m->n_params >= HTTP_MAX_PARAMS || !rest_is_safe(s)) return SHAPE_NONE;
            m->params[m->n_params++] = scratch + (s - path);
            return result;
        }
        const char *p_end = strchrnul(p, '/'), *s_end = strchrnul(s, '/');
        size_t p_len = (size_t)(p_end - p), s_len = (size_t)(s_end - s);
        if (p_len >= 2 && p[0] == '{' && p[p_len - 1] == '}') {
            if (s_len == 0 || m->n_params >= HTTP_MAX_PARAMS) return SHAPE_NONE;
            if (result == SHAPE_OK && !http_is_id(s, s_len)) {
                result = SHAPE_BAD_ID;
                m->bad_index = m->n_params;
                placeholder_name(p, p_len, m->bad_param, sizeof m->bad_param);
            }
            m->params[m->n_params++] = scratch + (s - path);
            scratch[s_end - path] = '\0';
        } else if (p_len != s_len || memcmp(p, s, p_len) != 0) {
            return SHAPE_NONE;
        }
        p = p_end;
        s = s_end;
    }
}

/* "GET, DELETE": each method once, in the table's order. */
static void allow_add(char *allow, size_t cap, const char *method) {
    size_t len = strlen(method);
    for (const char *a = allow; *a;) {
        size_t item = strcspn(a, ",");
        if (item == len && strncmp(a, method, len) == 0) return;
        a += item;
        if (*a) a += 2; /* ", " */
    }
    size_t used = strlen(allow);
    snprintf(allow + used, cap - used, "%s%s", used ? ", " : "", method);
}

/* Whether some route other than a wildcard starts with path's first segment. */
static bool first_segment_claimed(const struct http_route *routes, int n, const char *path) {
    const char *seg = path + 1, *end = strchrnul(seg, '/');
    size_t len = (size_t)(end - seg);
    for (int i = 0; i < n; i++) {
        const char *p = routes[i].pattern + 1;
        if (is_wildcard(&routes[i]) || p[0] == '{') continue;
        if (strlen(p) >= len && strncmp(p, seg, len) == 0 && (p[len] == '/' || !p[len]))
            return true;
    }
    return false;
}

/* One pass over the routes that are (or are not) wildcards: Allow gathered, the method's
 * route picked (a strict match before a bad id's), its index returned (-1: none). */
static int route_pass(const struct http_route *routes, int n, bool wildcards,
                      const char *method, const char *path, char *scratch,
                      struct http_route_match *m) {
    int chosen = -1;
    enum shape chosen_shape = SHAPE_NONE;
    for (int i = 0; i < n; i++) {
        if (is_wildcard(&routes[i]) != wildcards) continue;
        enum shape sh = route_shape(routes[i].pattern, path, scratch, m);
        if (sh == SHAPE_NONE) continue;
        allow_add(m->allow, sizeof m->allow, routes[i].method);
        if (strcmp(routes[i].method, method) == 0 && sh > chosen_shape) {
            chosen = i;
            chosen_shape = sh;
        }
    }
    return chosen;
}

void http_route_find(const struct http_route *routes, int n, const char *method,
                     const char *path, char *scratch, struct http_route_match *m) {
    memset(m, 0, sizeof *m);
    m->bad_index = -1;
    if (strcmp(method, "HEAD") == 0) method = "GET";
    /* "%00" is what unescape leaves of an encoded NUL. */
    if (path[0] != '/' || strstr(path, "//") || strchr(path, '\\') || strstr(path, "%00"))
        return;
    int chosen = route_pass(routes, n, false, method, path, scratch, m);
    if (!m->allow[0] && !first_segment_claimed(routes, n, path))
        chosen = route_pass(routes, n, true, method, path, scratch, m);
    m->bad_index = -1;
    m->bad_param[0] = '\0';
    if (chosen < 0) {
        m->n_params = 0;
        return;
    }
    /* Once more, so scratch, params and the bad capture are the chosen route's. */
    strcpy(scratch, path);
    m->route = &routes[chosen];
    route_shape(m->route->pattern, path, scratch, m);
}
