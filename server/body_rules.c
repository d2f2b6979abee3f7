/* Request bodies checked against what the OpenAPI document says of them (server/web/openapi.json):
 * each object's keys (unknown ones refused), their types, ranges and allowed values, which
 * are required; free-form values hold numbers jansson and the document agree on. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

#define PATH_BYTES SMELT_ERROR_FIELD_BYTES

static int check_value(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err);

/* "where.key", or key at the top (where ""). An empty key is written "" (quotes), so that
 * a refusal of {"": 1} still names its field (err.field is the reply's param). */
static void join(char *out, const char *where, const char *key) {
    snprintf(out, PATH_BYTES, "%s%s%s", where, where[0] ? "." : "", json_key_name(key));
}

int body_check_json(const json_t *v, const char *path, struct smelt_error *err) {
    char at[PATH_BYTES];
    if (json_is_number(v)) {
        double x = json_number_value(v);
        if (json_is_real(v) && !(x >= -0x1p63 && x < 0x1p63))
            return error_set_field(err, SMELT_EINVAL, path, "%s: %g is outside [-2^63, 2^63)", path, x);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
            snprintf(at, sizeof at, "%s[%zu]", path, i);
            TRY(body_check_json(item, at, err));
        }
    } else if (json_is_object(v)) {
        const char *key;
        json_t *item;
        json_object_foreach((json_t *)v, key, item) {
            join(at, path, key);
            TRY(body_check_json(item, at, err));
        }
    }
    return 0;
}

bool body_integral(const json_t *v) {
    return json_is_integer(v) || (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
                                  fabs(json_real_value(v)) < 9.0e15);
}

static int check_number(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err) {
    bool is_int = r->kind == BODY_INT;
    if (is_int ? !body_integral(v) : !json_is_number(v))
        return error_set_field(err, SMELT_EINVAL, path, "%s: %s is expected", path, is_int ? "an integer" : "a number");
    double x = json_number_value(v);
    if (!(x >= r->min && x <= r->max))
        return error_set_field(err, SMELT_EINVAL, path, "%s: %g is outside [%g, %g]", path, x, r->min, r->max);
    return 0;
}

static int check_string(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err) {
    if (!json_is_string(v)) return error_set_field(err, SMELT_EINVAL, path, "%s: a string is expected", path);
    if (!r->values) return 0;
    for (int i = 0; r->values[i]; i++)
        if (strcmp(json_string_value(v), r->values[i]) == 0) return 0;
    char listed[256] = "";
    for (int i = 0; r->values[i]; i++)
        snprintf(listed + strlen(listed), sizeof listed - strlen(listed), "%s%s", i ? ", " : "", r->values[i]);
    return error_set_field(err, SMELT_EINVAL, path, "%s: '%.60s' is not one of %s", path, json_string_value(v), listed);
}

static int check_array(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err) {
    if (!json_is_array(v)) return error_set_field(err, SMELT_EINVAL, path, "%s: an array is expected", path);
    if (!r->items) return body_check_json(v, path, err);
    size_t i;
    json_t *item;
    char at[PATH_BYTES];
    json_array_foreach(v, i, item) {
        snprintf(at, sizeof at, "%s[%zu]", path, i);
        if (json_is_null(item)) return error_set_field(err, SMELT_EINVAL, at, "%s: null is not allowed", at);
        TRY(check_value(item, r->items, at, err));
    }
    return 0;
}

static int check_object(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err) {
    if (!json_is_object(v)) return error_set_field(err, SMELT_EINVAL, path, "%s: an object is expected", path);
    return r->fields ? body_check(v, r->fields, path, err) : body_check_json(v, path, err);
}

static int check_value(const json_t *v, const struct body_rule *r, const char *path, struct smelt_error *err) {
    switch (r->kind) {
    case BODY_STRING: TRY(check_string(v, r, path, err)); break;
    case BODY_INT:
    case BODY_NUMBER: TRY(check_number(v, r, path, err)); break;
    case BODY_BOOL:
        if (!json_is_boolean(v)) return error_set_field(err, SMELT_EINVAL, path, "%s: true or false is expected", path);
        break;
    case BODY_OBJECT: TRY(check_object(v, r, path, err)); break;
    case BODY_ARRAY: TRY(check_array(v, r, path, err)); break;
    case BODY_JSON: TRY(body_check_json(v, path, err)); break;
    }
    return r->check ? r->check(v, path, err) : 0;
}

/* The rule of key: its own, else the "*" rule of any other key, else NULL (an unknown key). */
static const struct body_rule *rule_of(const struct body_rule *rules, const char *key) {
    const struct body_rule *any = NULL;
    for (const struct body_rule *r = rules; r->key; r++) {
        if (strcmp(r->key, key) == 0) return r;
        if (strcmp(r->key, "*") == 0) any = r;
    }
    return any;
}

/* The keys no rule names: refused, or checked against the "*" rule. */
static int check_other_keys(const json_t *obj, const struct body_rule *rules, const char *where,
                            struct smelt_error *err) {
    const char *key;
    json_t *v;
    char path[PATH_BYTES];
    json_object_foreach((json_t *)obj, key, v) {
        const struct body_rule *r = rule_of(rules, key);
        join(path, where, key);
        if (!r) return error_set_field(err, SMELT_EINVAL, path, "%s: unknown field", path);
        if (strcmp(r->key, "*") == 0 && !json_is_null(v)) TRY(check_value(v, r, path, err));
    }
    return 0;
}

int body_check(const json_t *obj, const struct body_rule *rules, const char *where, struct smelt_error *err) {
    char path[PATH_BYTES];
    if (!json_is_object(obj))
        return error_set_field(err, SMELT_EINVAL, where, "%s: an object is expected", where[0] ? where : "body");
    TRY(check_other_keys(obj, rules, where, err));
    for (const struct body_rule *r = rules; r->key; r++) {
        if (strcmp(r->key, "*") == 0) continue;
        const json_t *v = json_object_get(obj, r->key);
        join(path, where, r->key);
        if (!v || json_is_null(v)) {
            if (r->required) return error_set_field(err, SMELT_EINVAL, path, "%s: required", path);
            continue;
        }
        TRY(check_value(v, r, path, err));
    }
    const struct body_rule *end = rules;
    while (end->key) end++;
    return end->check ? end->check(obj, where, err) : 0;
}
