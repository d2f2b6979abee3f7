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
#define SMELT_ERROR_FIELD_BYTES 128

struct smelt_error {
    int  code;
    char message[SMELT_ERROR_MESSAGE_BYTES];
    /* The input field at fault as a dotted path ("hyperparameters.epochs"), relative to
     * the document being read; "" when the error is not about one field. Carried apart
     * from the message so that callers (the HTTP API's `param`) never parse text. */
    char field[SMELT_ERROR_FIELD_BYTES];
};

/* Sets err (if non-NULL) to code and a printf-style message, with no field; returns
 * code, so callers write `return error_set(err, SMELT_EINVAL, "...")`. */
int error_set(struct smelt_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* error_set naming the field at fault (see struct smelt_error's `field`). */
int error_set_field(struct smelt_error *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Adds context to a callee's failure: `return error_wrap(err, rc, "loading %s", path);`.
 * rc is the callee's return code and is always what comes back, so a failure can never
 * turn into SMELT_OK or change its code (even with err NULL). rc == SMELT_OK does
 * nothing. The message gets the context in front ("loading x: <callee's message>"); a
 * callee that failed without filling err gets a message naming the code, so no failure
 * goes unexplained. err->code becomes rc; the field is kept. */
int error_wrap(struct smelt_error *err, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Places a failure inside an enclosing field: when rc is a failure, err's field becomes
 * "outer.<field>" (or "outer" when it had none). Returns rc. Readers of nested objects
 * use it so that each level names only its own keys. */
int error_in_field(struct smelt_error *err, int rc, const char *outer);

void error_clear(struct smelt_error *err);

/* Returns the code of a failing call from the enclosing function: `TRY(f(x, err));`.
 * The callee has filled err; add context with error_wrap where the caller knows more. */
#define TRY(expr)                 \
    do {                          \
        int rc_ = (expr);         \
        if (rc_) return rc_;      \
    } while (0)

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
