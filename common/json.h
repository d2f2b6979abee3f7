/* JSON helpers over jansson: load with positioned errors, read typed fields with the
 * field named in every error, refuse unknown keys. Every reader takes `where`, a
 * prefix for messages such as "config.json" or "job spec: hyperparameters". Errors about
 * one key also set err->field to that key (the caller adds its enclosing path with
 * error_in_field), so an API can report it without parsing the message. */
#ifndef SMELT_COMMON_JSON_H
#define SMELT_COMMON_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

/* Parses a file / buffer. On success *out is a new reference the caller json_decref()s.
 * Errors name the file and line:column. */
int json_load_path(const char *path, json_t **out, struct smelt_error *err);
int json_load_buffer(const char *buf, size_t len, const char *where, json_t **out,
                     struct smelt_error *err);

/* Typed field readers. When the key is absent: required → SMELT_EINVAL naming the
 * field; optional → *out = def and 0. A present key of the wrong type, or a number out
 * of [min, max], is SMELT_EINVAL naming the field and what was expected. JSON null
 * counts as absent. */
int json_field_int(const json_t *obj, const char *key, bool required, int64_t def,
                   int64_t min, int64_t max, int64_t *out, const char *where,
                   struct smelt_error *err);
int json_field_double(const json_t *obj, const char *key, bool required, double def,
                      double min, double max, double *out, const char *where,
                      struct smelt_error *err);
int json_field_bool(const json_t *obj, const char *key, bool required, bool def, bool *out,
                    const char *where, struct smelt_error *err);
/* *out points into obj (borrowed; valid while obj lives) or is def. */
int json_field_string(const json_t *obj, const char *key, bool required, const char *def,
                      const char **out, const char *where, struct smelt_error *err);

/* Writes json_dumps(value, flags) plus a newline to path atomically (file_write_atomic). */
int json_save_atomic(const json_t *value, size_t flags, const char *path, struct smelt_error *err);

/* A JSON string of len bytes, each byte that does not start valid UTF-8 replaced by
 * U+FFFD (jansson refuses invalid UTF-8): for model output, which may end inside a
 * character. NULL when out of memory. */
json_t *json_string_lossy(const char *s, size_t len);

/* The first key of object obj that is not in allowed (NULL-terminated), or NULL when
 * every key is allowed: for callers that report unknown fields in their own protocol's
 * error (HTTP replies, dataset issues, worker refusals). */
const char *json_unknown_key(const json_t *obj, const char *const *allowed);
/* key as an error names it: itself, or "" (two quote marks) for the empty key, so that a
 * refusal's field (an HTTP reply's param) is never empty. */
const char *json_key_name(const char *key);

/* SMELT_EINVAL naming the first key of keys (NULL-terminated) that obj holds as null: the
 * field readers take null for absent, which an API whose document says a field is not
 * nullable must refuse first. */
int json_refuse_nulls(const json_t *obj, const char *const *keys, const char *where,
                      struct smelt_error *err);

/* SMELT_EINVAL naming the first key of obj that is not in allowed (NULL-terminated). */
int json_check_keys(const json_t *obj, const char *const *allowed, const char *where,
                    struct smelt_error *err);

#endif
