#include "common/json.h"
#include "common/file.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int json_load_path(const char *path, json_t **out, struct smelt_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    /* A file that cannot be opened has no line or column (jansson reports -1:-1) and
     * is not malformed: it is an I/O error, as file_read_all reports it. */
    if (!root && json_error_code(&jerr) == json_error_cannot_open_file)
        return error_set(err, SMELT_EIO, "%s", jerr.text); /* "unable to open PATH: why" */
    if (!root)
        return error_set(err, SMELT_EFORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column,
                         jerr.text);
    *out = root;
    return SMELT_OK;
}

int json_load_buffer(const char *buf, size_t len, const char *where, json_t **out,
                     struct smelt_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(err, SMELT_EFORMAT, "%s:%d:%d: %s", where, jerr.line, jerr.column,
                         jerr.text);
    *out = root;
    return SMELT_OK;
}

/* Looks the key up; returns NULL when absent or null. Fails if obj is not an object. */
static int field_lookup(const json_t *obj, const char *key, bool required, const char *where,
                        json_t **value, struct smelt_error *err) {
    if (!json_is_object(obj))
        return error_set(err, SMELT_EINVAL, "%s: expected a JSON object", where);
    json_t *v = json_object_get(obj, key);
    if (v && json_is_null(v)) v = NULL;
    if (!v && required)
        return error_set_field(err, SMELT_EINVAL, key, "%s: missing required field '%s'", where, key);
    *value = v;
    return SMELT_OK;
}

int json_field_int(const json_t *obj, const char *key, bool required, int64_t def,
                   int64_t min, int64_t max, int64_t *out, const char *where,
                   struct smelt_error *err) {
    json_t *v = NULL;
    int rc = field_lookup(obj, key, required, where, &v, err);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return SMELT_OK;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9.0e15) {
        x = (int64_t)json_real_value(v); /* 4.0 written by some tools means 4 */
    } else {
        return error_set_field(err, SMELT_EINVAL, key, "%s: field '%s' must be an integer", where, key);
    }
    if (x < min || x > max)
        return error_set_field(err, SMELT_EINVAL, key,
                               "%s: field '%s' is %lld, outside the allowed range [%lld, %lld]",
                               where, key, (long long)x, (long long)min, (long long)max);
    *out = x;
    return SMELT_OK;
}

int json_field_double(const json_t *obj, const char *key, bool required, double def,
                      double min, double max, double *out, const char *where,
                      struct smelt_error *err) {
    json_t *v = NULL;
    int rc = field_lookup(obj, key, required, where, &v, err);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return SMELT_OK;
    }
    if (!json_is_number(v))
        return error_set_field(err, SMELT_EINVAL, key, "%s: field '%s' must be a number", where, key);
    double x = json_number_value(v);
    if (!(x >= min && x <= max))
        return error_set_field(err, SMELT_EINVAL, key,
                               "%s: field '%s' is %g, outside the allowed range [%g, %g]", where, key,
                               x, min, max);
    *out = x;
    return SMELT_OK;
}

int json_field_bool(const json_t *obj, const char *key, bool required, bool def, bool *out,
                    const char *where, struct smelt_error *err) {
    json_t *v = NULL;
    int rc = field_lookup(obj, key, required, where, &v, err);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return SMELT_OK;
    }
    if (!json_is_boolean(v))
        return error_set_field(err, SMELT_EINVAL, key, "%s: field '%s' must be true or false", where, key);
    *out = json_is_true(v);
    return SMELT_OK;
}

int json_field_string(const json_t *obj, const char *key, bool required, const char *def,
                      const char **out, const char *where, struct smelt_error *err) {
    json_t *v = NULL;
    int rc = field_lookup(obj, key, required, where, &v, err);
    if (rc) return rc;
    if (!v) {
        *out = def;
        return SMELT_OK;
    }
    if (!json_is_string(v))
        return error_set_field(err, SMELT_EINVAL, key, "%s: field '%s' must be a string", where, key);
    *out = json_string_value(v);
    return SMELT_OK;
}

json_t *json_string_lossy(const char *s, size_t len) {
    char *buf = malloc(3 * len + 1);
    if (!buf) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 1) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(buf + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

const char *json_unknown_key(const json_t *obj, const char *const *allowed) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        (void)value;
        bool known = false;
        for (const char *const *a = allowed; *a && !known; a++) known = strcmp(*a, key) == 0;
        if (!known) return key;
    }
    return NULL;
}

int json_refuse_nulls(const json_t *obj, const char *const *keys, const char *where,
                      struct smelt_error *err) {
    for (const char *const *k = keys; *k; k++)
        if (json_is_null(json_object_get(obj, *k)))
            return error_set_field(err, SMELT_EINVAL, *k, "%s: field '%s' may not be null", where,
                                   *k);
    return SMELT_OK;
}

const char *json_key_name(const char *key) {
    return key[0] ? key : "\"\"";
}

int json_check_keys(const json_t *obj, const char *const *allowed, const char *where,
                    struct smelt_error *err) {
    if (!json_is_object(obj))
        return error_set(err, SMELT_EINVAL, "%s: expected a JSON object", where);
    const char *key = json_unknown_key(obj, allowed);
    if (key) return error_set_field(err, SMELT_EINVAL, key, "%s: unknown field '%s'", where, key);
    return SMELT_OK;
}

int json_save_atomic(const json_t *value, size_t flags, const char *path, struct smelt_error *err) {
    char *text = json_dumps(value, flags);
    if (!text) return error_set(err, SMELT_ENOMEM, "%s: cannot serialise JSON", path);
    size_t len = strlen(text);
    char *with_newline = realloc(text, len + 2);
    if (!with_newline) {
        free(text);
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    }
    with_newline[len] = '\n';
    with_newline[len + 1] = '\0';
    int rc = file_write_atomic(path, with_newline, len + 1, err);
    free(with_newline);
    return rc;
}
