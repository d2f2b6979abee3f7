/* The "lora" object of a job spec, and the range checks every way of making an
 * adapter shares. */
#include "lora/lora_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int lora_config_check(const struct lora_config *c, const char *where, struct smelt_error *err) {
    if (c->rank < 1 || c->rank > LORA_MAX_RANK)
        return error_set(err, SMELT_EINVAL, "%s: field 'rank' is %d, outside the allowed range [1, %d]",
                         where, c->rank, LORA_MAX_RANK);
    if (!(c->alpha > 0.0f) || !isfinite(c->alpha))
        return error_set(err, SMELT_EINVAL, "%s: field 'alpha' is %g; it must be a finite number > 0",
                         where, (double)c->alpha);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return error_set(err, SMELT_EINVAL, "%s: field 'dropout' is %g; it must be in [0, 1)",
                         where, (double)c->dropout);
    if (c->n_targets < 0 || c->n_targets > LORA_MAX_TARGETS)
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' has %d names; at most %d",
                         where, c->n_targets, LORA_MAX_TARGETS);
    for (int i = 0; i < c->n_targets; i++) {
        size_t len = strnlen(c->targets[i], sizeof c->targets[i]);
        if (len == 0 || len == sizeof c->targets[i])
            return error_set(err, SMELT_EINVAL, "%s: field 'target_modules': name %d is empty or longer than %zu bytes",
                             where, i, sizeof c->targets[i] - 1);
    }
    return SMELT_OK;
}

static int add_target(struct lora_config *c, const json_t *v, const char *where,
                      struct smelt_error *err) {
    if (!json_is_string(v))
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' must list module names (strings)", where);
    const char *name = json_string_value(v);
    if (!lora_target_known(name))
        return error_set(err, SMELT_EINVAL,
                         "%s: field 'target_modules': unknown module '%s' (known: q_proj k_proj v_proj o_proj "
                         "gate_proj up_proj down_proj, c_attn c_proj c_fc, q k v o gate up down, all-linear)",
                         where, name);
    if (c->n_targets == LORA_MAX_TARGETS)
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' lists more than %d names",
                         where, LORA_MAX_TARGETS);
    if (strlen(name) >= sizeof c->targets[0])
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules': '%s' is longer than %zu bytes",
                         where, name, sizeof c->targets[0] - 1);
    snprintf(c->targets[c->n_targets++], sizeof c->targets[0], "%s", name);
    return SMELT_OK;
}

/* A list of names, or the one string PEFT also takes: "all-linear" (PEFT reads any
 * other string as a regular expression, which smelt does not implement). */
static int parse_targets(const json_t *obj, struct lora_config *c, const char *where,
                         struct smelt_error *err) {
    const json_t *t = json_object_get(obj, "target_modules");
    if (!t || json_is_null(t)) return SMELT_OK;
    if (json_is_string(t)) {
        if (strcmp(json_string_value(t), "all-linear") != 0)
            return error_set(err, SMELT_EINVAL,
                             "%s: field 'target_modules' is the string '%s'; give a list of module names or \"all-linear\"",
                             where, json_string_value(t));
        return add_target(c, t, where, err);
    }
    if (!json_is_array(t) || json_array_size(t) == 0)
        return error_set(err, SMELT_EINVAL, "%s: field 'target_modules' must be a non-empty list of module names",
                         where);
    size_t i;
    const json_t *v;
    json_array_foreach(t, i, v) {
        int rc = add_target(c, v, where, err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

int lora_config_from_json(const void *json, const char *where, struct lora_config *out,
                          struct smelt_error *err) {
    const json_t *obj = json;
    static const char *const keys[] = {"rank", "alpha", "dropout", "target_modules", "use_rslora", NULL};
    int rc = json_check_keys(obj, keys, where, err);
    if (rc) return rc;
    struct lora_config c = {0};
    int64_t rank;
    double alpha, dropout;
    if ((rc = json_field_int(obj, "rank", false, 8, 1, LORA_MAX_RANK, &rank, where, err))) return rc;
    if ((rc = json_field_double(obj, "alpha", false, 2.0 * (double)rank, -INFINITY, INFINITY, &alpha,
                                where, err)))
        return rc;
    if ((rc = json_field_double(obj, "dropout", false, 0.0, -INFINITY, INFINITY, &dropout, where, err)))
        return rc;
    if ((rc = json_field_bool(obj, "use_rslora", false, false, &c.use_rslora, where, err))) return rc;
    c.rank = (int)rank;
    c.alpha = (float)alpha;
    c.dropout = (float)dropout;
    if ((rc = lora_config_check(&c, where, err))) return rc;
    if ((rc = parse_targets(obj, &c, where, err))) return rc;
    *out = c;
    return SMELT_OK;
}
