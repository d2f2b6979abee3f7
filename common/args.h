/* Command-line parsing helpers for smelt's programs: numbers parsed whole, errors that
 * name the flag. */
#ifndef SMELT_COMMON_ARGS_H
#define SMELT_COMMON_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

/* One option of a program: a switch (`on` set, `value` NULL) or a flag that takes a value
 * (`value` set: it points into argv). A table of them ends with a NULL flag. */
struct args_option {
    const char *flag;
    const char **value;
    bool *on;
};

/* Reads argv[first..argc) against options: values stored, switches set to true.
 * SMELT_EINVAL naming an unknown option or a flag without its value. */
int args_parse(int argc, char **argv, int first, const struct args_option *options,
               struct smelt_error *err);

/* The value after flag argv[*i] (advancing *i), or SMELT_EINVAL "FLAG needs a value". */
int args_value(int argc, char **argv, int *i, const char **out, struct smelt_error *err);
int args_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out,
             struct smelt_error *err);
int args_double(const char *flag, const char *text, double min, double max, double *out,
                struct smelt_error *err);
/* "1,2,3" → malloc'd int32 array (caller frees); every element in [min, max]. */
int args_int_list(const char *flag, const char *text, int32_t min, int32_t max, int32_t **out,
                  int64_t *n, struct smelt_error *err);

#endif
