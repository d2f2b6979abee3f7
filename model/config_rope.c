/* config.json's rotary settings: rope_theta, partial_rotary_factor and the scaling in
 * rope_scaling (transformers 4's name) or rope_parameters (transformers 5's; rope_scaling
 * wins when both are given, as transformers 5 reads them). The types smelt implements
 * (linear, llama3, yarn; model/rope.c) are read with their parameters and transformers'
 * defaults; dynamic, longrope and any other type, a parameter the type does not take, and
 * a partial_rotary_factor other than 1 are refused naming the field. */
#include "model/config_internal.h"

#include <stdio.h>
#include <string.h>

static const char *const rope_type_names[] = {
    [MODEL_ROPE_DEFAULT] = "default", [MODEL_ROPE_LINEAR] = "linear",
    [MODEL_ROPE_LLAMA3] = "llama3", [MODEL_ROPE_YARN] = "yarn",
};

const char *model_rope_type_name(enum model_rope_type type) {
    return (unsigned)type <= MODEL_ROPE_YARN ? rope_type_names[type] : "invalid-rope-type";
}

bool model_rope_scaling_equal(const struct model_rope_scaling *a, const struct model_rope_scaling *b) {
    return a->type == b->type && a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings &&
           a->attention_factor == b->attention_factor && a->beta_fast == b->beta_fast &&
           a->beta_slow == b->beta_slow && a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim &&
           a->truncate == b->truncate;
}

/* The keys each type reads, beside rope_type/type, rope_theta and partial_rotary_factor. */
static const char *const linear_keys[] = {"factor", NULL};
static const char *const llama3_keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings", NULL};
static const char *const yarn_keys[] = {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                                        "beta_slow", "mscale", "mscale_all_dim", "truncate", NULL};

static bool listed(const char *key, const char *const *keys) {
    for (; *keys; keys++)
        if (strcmp(key, *keys) == 0) return true;
    return false;
}

static int check_keys(const json_t *d, const char *field, enum model_rope_type type, const char *where,
                      struct smelt_error *err) {
    const char *const *keys = type == MODEL_ROPE_LINEAR ? linear_keys : type == MODEL_ROPE_LLAMA3 ? llama3_keys
                                                                                                  : yarn_keys;
    const char *const common[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", NULL};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)d, key, v) {
        if (listed(key, common) || listed(key, keys)) continue;
        return error_set_field(err, SMELT_EUNSUPPORTED, field, "%s: %s.%s is not a parameter of rope_type '%s'",
                               where, field, key, model_rope_type_name(type));
    }
    return SMELT_OK;
}

static int read_type(const json_t *d, const char *field, enum model_rope_type *type, const char *where,
                     struct smelt_error *err) {
    const char *key = "rope_type";
    const json_t *t = json_object_get(d, key);
    if (!t) t = json_object_get(d, key = "type");
    if (!json_is_string(t))
        return error_set_field(err, SMELT_EINVAL, field, "%s: field '%s' has no string 'rope_type'", where, field);
    for (int i = 0; i <= MODEL_ROPE_YARN; i++)
        if (strcmp(json_string_value(t), rope_type_names[i]) == 0) {
            *type = (enum model_rope_type)i;
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EUNSUPPORTED, field, "%s: %s.%s '%s' is not implemented (smelt implements "
                           "default, linear, llama3 and yarn)", where, field, key, json_string_value(t));
}

/* original_max_position_embeddings: the top level's wins (Phi-3 keeps it there), then the
 * scaling's, then max_position_embeddings. */
static int read_original_len(const json_t *root, const json_t *d, const char *dwhere, struct model_config *c,
                             const char *where, struct smelt_error *err) {
    int64_t *out = &c->rope_scaling.original_max_position_embeddings;
    const json_t *top = json_object_get(root, "original_max_position_embeddings");
    if (top && !json_is_null(top))
        return json_field_int(root, "original_max_position_embeddings", true, 0, 1, INT64_C(1) << 30, out, where,
                              err);
    return json_field_int(d, "original_max_position_embeddings", false, c->max_position_embeddings, 1,
                          INT64_C(1) << 30, out, dwhere, err);
}

static int read_llama3(const json_t *d, const char *dwhere, struct model_rope_scaling *s, struct smelt_error *err) {
    TRY(json_field_double(d, "factor", true, 0, 1.0, 1e6, &s->factor, dwhere, err));
    TRY(json_field_double(d, "low_freq_factor", true, 0, 1e-6, 1e6, &s->low_freq_factor, dwhere, err));
    TRY(json_field_double(d, "high_freq_factor", true, 0, 1e-6, 1e6, &s->high_freq_factor, dwhere, err));
    if (!(s->high_freq_factor > s->low_freq_factor))
        return error_set_field(err, SMELT_EINVAL, "high_freq_factor", "%s: high_freq_factor %g must be above "
                               "low_freq_factor %g", dwhere, s->high_freq_factor, s->low_freq_factor);
    return SMELT_OK;
}

/* yarn's optional numbers: null, absent and 0 all mean "not given" (transformers' `or`). */
static int read_yarn(const json_t *d, const char *dwhere, struct model_config *c, struct smelt_error *err) {
    struct model_rope_scaling *s = &c->rope_scaling;
    double derived = (double)c->max_position_embeddings / (double)s->original_max_position_embeddings;
    TRY(json_field_double(d, "factor", false, derived, 1.0, 1e6, &s->factor, dwhere, err));
    TRY(json_field_double(d, "attention_factor", false, 0, 0, 1e6, &s->attention_factor, dwhere, err));
    TRY(json_field_double(d, "beta_fast", false, 0, 0, 1e6, &s->beta_fast, dwhere, err));
    TRY(json_field_double(d, "beta_slow", false, 0, 0, 1e6, &s->beta_slow, dwhere, err));
    TRY(json_field_double(d, "mscale", false, 0, 0, 1e6, &s->mscale, dwhere, err));
    TRY(json_field_double(d, "mscale_all_dim", false, 0, 0, 1e6, &s->mscale_all_dim, dwhere, err));
    TRY(json_field_bool(d, "truncate", false, true, &s->truncate, dwhere, err));
    if (s->beta_fast == 0) s->beta_fast = 32;
    if (s->beta_slow == 0) s->beta_slow = 1;
    return SMELT_OK;
}

static int check_partial_rotary(const json_t *obj, const char *where, struct smelt_error *err) {
    double f;
    TRY(json_field_double(obj, "partial_rotary_factor", false, 1.0, 0.0, 1.0, &f, where, err));
    if (f != 1.0)
        return error_set_field(err, SMELT_EUNSUPPORTED, "partial_rotary_factor", "%s: partial_rotary_factor %g is "
                               "not implemented (rope over the whole head only)", where, f);
    return SMELT_OK;
}

/* The object holding the scaling and its name: rope_scaling unless null, else rope_parameters. */
static int scaling_dict(const json_t *root, const char *where, const json_t **d, const char **field,
                        struct smelt_error *err) {
    const char *const fields[] = {"rope_scaling", "rope_parameters"};
    *d = NULL;
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, fields[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_object(v))
            return error_set_field(err, SMELT_EINVAL, fields[i], "%s: field '%s' must be an object or null", where,
                                   fields[i]);
        if (!*d) {
            *d = v;
            *field = fields[i];
        }
    }
    return SMELT_OK;
}

int model_config_parse_rope(const json_t *root, const char *where, struct model_config *c, struct smelt_error *err) {
    memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
    TRY(check_partial_rotary(root, where, err));
    TRY(json_field_double(root, "rope_theta", false, 10000.0, 1e-3, 1e12, &c->rope_theta, where, err));
    char dwhere[256];
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (json_is_object(rp)) { /* transformers 5 moves rope_theta here; it wins when present */
        snprintf(dwhere, sizeof dwhere, "%s: rope_parameters", where);
        TRY(json_field_double(rp, "rope_theta", false, c->rope_theta, 1e-3, 1e12, &c->rope_theta, dwhere, err));
        TRY(check_partial_rotary(rp, dwhere, err));
    }
    const json_t *d;
    const char *field = NULL;
    TRY(scaling_dict(root, where, &d, &field, err));
    if (!d) return SMELT_OK;
    snprintf(dwhere, sizeof dwhere, "%s: %s", where, field);
    struct model_rope_scaling *s = &c->rope_scaling;
    TRY(read_type(d, field, &s->type, where, err));
    if (s->type == MODEL_ROPE_DEFAULT) return SMELT_OK;
    TRY(check_keys(d, field, s->type, where, err));
    TRY(check_partial_rotary(d, dwhere, err));
    if (s->type == MODEL_ROPE_LINEAR) return json_field_double(d, "factor", true, 0, 1.0, 1e6, &s->factor, dwhere, err);
    TRY(read_original_len(root, d, dwhere, c, where, err));
    return s->type == MODEL_ROPE_LLAMA3 ? read_llama3(d, dwhere, s, err) : read_yarn(d, dwhere, c, err);
}
