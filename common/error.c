#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int error_set(struct smelt_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int error_wrap(struct smelt_error *err, const char *fmt, ...) {
    if (!err) return SMELT_EINVAL;
    if (err->code == SMELT_OK) return SMELT_OK;
    char prefix[SMELT_ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[2 * SMELT_ERROR_MESSAGE_BYTES + 2];
    snprintf(joined, sizeof joined, "%s: %s", prefix, err->message);
    snprintf(err->message, sizeof err->message, "%.*s", (int)sizeof err->message - 1, joined);
    return err->code;
}

void error_clear(struct smelt_error *err) {
    if (!err) return;
    err->code = SMELT_OK;
    err->message[0] = '\0';
}

const char *error_code_name(int code) {
    switch (code) {
    case SMELT_OK: return "OK";
    case SMELT_EINVAL: return "EINVAL";
    case SMELT_ENOMEM: return "ENOMEM";
    case SMELT_EIO: return "EIO";
    case SMELT_EFORMAT: return "EFORMAT";
    case SMELT_ENOTFOUND: return "ENOTFOUND";
    case SMELT_EUNSUPPORTED: return "EUNSUPPORTED";
    case SMELT_EBACKEND: return "EBACKEND";
    default: return "EUNKNOWN";
    }
}

_Noreturn void smelt_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "smelt: internal invariant broken at %s:%d: %s\n", file, line, expr);
    abort();
}
