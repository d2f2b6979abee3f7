/* Error values: every fallible function returns 0 or a negative code and, when given a
 * non-NULL `struct smelt_error *`, fills it with a message saying what was wrong and
 * where. Only broken internal invariants abort (SMELT_ASSERT). */
#ifndef SMELT_COMMON_ERROR_H
#define SMELT_COMMON_ERROR_H

#include <stddef.h>

enum smelt_code {
    SMELT_OK          = 0,
    SMELT_EINVAL      = -1, /* bad argument: shape, dtype, range, field value */
    SMELT_ENOMEM      = -2, /* an allocation failed */
    SMELT_EIO         = -3, /* a read, write, open or mmap failed */
    SMELT_EFORMAT     = -4, /* malformed input data: JSON, file header, dataset line */
    SMELT_ENOTFOUND   = -5, /* a named thing does not exist */
    SMELT_EUNSUPPORTED= -6, /* valid request this build or backend cannot serve */
    SMELT_EBACKEND    = -7, /* a device or library call failed (CUDA, BLAS, ...) */
};

#define SMELT_ERROR_MESSAGE_BYTES 512

struct smelt_error {
    int  code;
    char message[SMELT_ERROR_MESSAGE_BYTES];
};

/* Sets err (if non-NULL) to code and a printf-style message; returns code, so callers
 * write `return error_set(err, SMELT_EINVAL, "...")`. */
int error_set(struct smelt_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends context ("loading model.safetensors: ") to an error already set; returns its
 * code. Leaves err untouched when it holds no error. */
int error_wrap(struct smelt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void error_clear(struct smelt_error *err);

/* "EINVAL", "ENOMEM", ... for logs and tests. */
const char *error_code_name(int code);

/* Aborts with file:line and the message when an internal invariant is broken. Never use
 * for input validation. */
#define SMELT_ASSERT(cond)                                                          \
    do {                                                                            \
        if (!(cond)) smelt_assert_fail(#cond, __FILE__, __LINE__);                  \
    } while (0)
#ifdef __cplusplus
[[noreturn]] void smelt_assert_fail(const char *expr, const char *file, int line);
#else
_Noreturn void smelt_assert_fail(const char *expr, const char *file, int line);
#endif

#endif
