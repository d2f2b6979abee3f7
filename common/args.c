#include "common/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int args_value(int argc, char **argv, int *i, const char **out, struct smelt_error *err) {
    if (*i + 1 >= argc) return error_set(err, SMELT_EINVAL, "%s needs a value", argv[*i]);
    *out = argv[++*i];
    return SMELT_OK;
}

int args_parse(int argc, char **argv, int first, const struct args_option *options,
               struct smelt_error *err) {
    for (int i = first; i < argc; i++) {
        const struct args_option *o = options;
        while (o->flag && strcmp(o->flag, argv[i]) != 0) o++;
        if (!o->flag) return error_set(err, SMELT_EINVAL, "unknown option %s", argv[i]);
        if (o->value) TRY(args_value(argc, argv, &i, o->value, err));
        else *o->on = true;
    }
    return SMELT_OK;
}

int args_int(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out,
             struct smelt_error *err) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0')
        return error_set(err, SMELT_EINVAL, "%s: '%s' is not an integer", flag, text);
    if (v < min || v > max)
        return error_set(err, SMELT_EINVAL, "%s: %lld is outside [%lld, %lld]", flag, v,
                         (long long)min, (long long)max);
    *out = v;
    return SMELT_OK;
}

int args_double(const char *flag, const char *text, double min, double max, double *out,
                struct smelt_error *err) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !isfinite(v))
        return error_set(err, SMELT_EINVAL, "%s: '%s' is not a number", flag, text);
    if (v < min || v > max)
        return error_set(err, SMELT_EINVAL, "%s: %g is outside [%g, %g]", flag, v, min, max);
    *out = v;
    return SMELT_OK;
}

int args_int_list(const char *flag, const char *text, int32_t min, int32_t max, int32_t **out,
                  int64_t *n, struct smelt_error *err) {
    int64_t count = 1;
    for (const char *p = text; *p; p++) count += *p == ',';
    int32_t *v = malloc((size_t)count * sizeof *v);
    if (!v) return error_set(err, SMELT_ENOMEM, "%s: out of memory", flag);
    const char *p = text;
    for (int64_t k = 0; k < count; k++) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || (*end != ',' && *end != '\0') || x < min || x > max) {
            free(v);
            return error_set(err, SMELT_EINVAL, "%s: element %lld of '%s' is not an integer in [%d, %d]",
                             flag, (long long)k, text, min, max);
        }
        v[k] = (int32_t)x;
        p = end + 1;
    }
    *out = v;
    *n = count;
    return SMELT_OK;
}
