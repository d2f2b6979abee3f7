#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set(struct smelt_error *err, int code, const char *field, const char *fmt, va_list ap) {
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    err->code = code;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
}

int error_set(struct smelt_error *err, int code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    set(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int error_set_field(struct smelt_error *err, int code, const char *field, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    set(err, code, field, fmt, ap);
    va_end(ap);
    return code;
}

int error_wrap(struct smelt_error *err, int rc, const char *fmt, ...) {
    if (rc == SMELT_OK || !err) return rc;
    char prefix[SMELT_ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* A callee that failed without saying why still leaves a trace of what failed. */
    if (err->code == SMELT_OK) {
        snprintf(err->message, sizeof err->message, "failed with %s (no message was given)",
                 error_code_name(rc));
        err->field[0] = '\0';
    }
    char joined[2 * SMELT_ERROR_MESSAGE_BYTES + 2];
    snprintf(joined, sizeof joined, "%s: %s", prefix, err->message);
    snprintf(err->message, sizeof err->message, "%.*s", (int)sizeof err->message - 1, joined);
    err->code = rc;
    return rc;
}

int error_in_field(struct smelt_error *err, int rc, const char *outer) {
    if (rc == SMELT_OK || !err) return rc;
    char joined[SMELT_ERROR_FIELD_BYTES * 2 + 2];
    snprintf(joined, sizeof joined, "%s%s%s", outer, err->field[0] ? "." : "", err->field);
    snprintf(err->field, sizeof err->field, "%.*s", (int)sizeof err->field - 1, joined);
    return rc;
}

void error_clear(struct smelt_error *err) {
    if (!err) return;
    err->code = SMELT_OK;
    err->message[0] = '\0';
    err->field[0] = '\0';
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
