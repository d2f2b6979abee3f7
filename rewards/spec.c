/* The reward spec: {"verifiers": [...]} read into a stage (types, names, weights, each
 * type's fields, patterns compiled), or {"grader": {...}} handed to graders.c; written
 * back with its defaults. Every error names the field: "<where>.verifiers[1].pattern:
 * ..." in the message, and "verifiers[1].pattern" in err->field. */
#include "rewards/rewards_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "rewards/graders_internal.h"

static const struct reward_verifier_type *const TYPES[] = {
    &REWARD_EXACT_MATCH, &REWARD_NUMERIC_MATCH, &REWARD_REGEX_MATCH, &REWARD_FORMAT, &REWARD_LENGTH_PENALTY,
};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])

int reward_json_set(json_t *obj, const char *key, json_t *value) {
    return value ? json_object_set_new(obj, key, value) : -1;
}

static int parse_type(const json_t *obj, const char *w, struct reward_verifier *v, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(obj, "type", true, NULL, &name, w, err));
    for (int t = 0; t < N_TYPES; t++)
        if (strcmp(name, TYPES[t]->name) == 0) {
            v->type = TYPES[t];
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EINVAL, "type",
                           "%s.type: unknown verifier type \"%s\" (exact_match, numeric_match, regex_match, format, "
                           "length_penalty)",
                           w, name);
}

/* Names label metrics ("reward/<name>"): letters, digits, "_", "-", ".". */
static bool name_ok(const char *name) {
    size_t len = strlen(name);
    if (len == 0 || len >= REWARD_NAME_BYTES) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.'))
            return false;
    return true;
}

static int parse_name(const json_t *obj, const char *w, struct reward_verifier *v, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(obj, "name", false, NULL, &name, w, err));
    if (!name) return SMELT_OK;
    if (!name_ok(name))
        return error_set_field(err, SMELT_EINVAL, "name",
                               "%s.name: \"%.40s\" is not a name: 1 to %d letters, digits, '_', '-' or '.'", w, name,
                               REWARD_NAME_BYTES - 1);
    memcpy(v->name, name, strlen(name) + 1);
    v->named = true;
    return SMELT_OK;
}

/* verifiers[i]: type first (it decides the allowed keys), then the common fields. */
static int parse_verifier(const json_t *obj, const char *w, struct reward_verifier *v, struct smelt_error *err) {
    if (!json_is_object(obj))
        return error_set(err, SMELT_EINVAL, "%s: expected an object like {\"type\": \"exact_match\"}", w);
    TRY(parse_type(obj, w, v, err));
    TRY(json_check_keys(obj, v->type->keys, w, err));
    TRY(parse_name(obj, w, v, err));
    TRY(json_field_double(obj, "weight", false, 1.0, -1e6, 1e6, &v->weight, w, err));
    return v->type->parse(obj, w, v, err);
}

/* Default names: the type when no other verifier has that type or takes it as its
 * name, else "<type>_<index>". */
static void default_name(struct reward_stage *st, int i) {
    struct reward_verifier *v = &st->v[i];
    bool shared = false;
    for (int j = 0; j < st->n; j++)
        if (j != i && (st->v[j].type == v->type || (st->v[j].named && strcmp(st->v[j].name, v->type->name) == 0)))
            shared = true;
    if (shared) snprintf(v->name, sizeof v->name, "%.20s_%d", v->type->name, i);
    else snprintf(v->name, sizeof v->name, "%s", v->type->name);
}

/* Every name distinct; a clash is reported at a verifier that was given its name. */
static int check_names(const struct reward_stage *st, const char *where, struct smelt_error *err) {
    for (int i = 0; i < st->n; i++)
        for (int j = i + 1; j < st->n; j++) {
            if (strcmp(st->v[i].name, st->v[j].name) != 0) continue;
            int at = st->v[j].named ? j : i;
            char field[48];
            snprintf(field, sizeof field, "verifiers[%d].name", at);
            return error_set_field(err, SMELT_EINVAL, field, "%s.%s: \"%s\" names verifiers[%d] and verifiers[%d]",
                                   where, field, st->v[i].name, i, j);
        }
    return SMELT_OK;
}

static int parse_list(const json_t *spec, const char *where, struct reward_stage *st, struct smelt_error *err) {
    const json_t *list = json_object_get(spec, "verifiers");
    if (!list || json_is_null(list))
        return error_set_field(err, SMELT_EINVAL, "verifiers", "%s.verifiers: missing (a list of 1 to %d verifiers, or a \"grader\")",
                               where, REWARD_MAX_VERIFIERS);
    if (!json_is_array(list))
        return error_set_field(err, SMELT_EINVAL, "verifiers", "%s.verifiers: expected a list of 1 to %d verifiers",
                               where, REWARD_MAX_VERIFIERS);
    if (json_array_size(list) == 0 || json_array_size(list) > REWARD_MAX_VERIFIERS)
        return error_set_field(err, SMELT_EINVAL, "verifiers", "%s.verifiers: %zu verifiers, expected 1 to %d", where,
                               json_array_size(list), REWARD_MAX_VERIFIERS);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char w[256], field[32];
        snprintf(field, sizeof field, "verifiers[%zu]", i);
        snprintf(w, sizeof w, "%s.%s", where, field);
        st->n = (int)i + 1; /* counted now, so that reward_stage_free frees what was compiled */
        TRY(error_in_field(err, parse_verifier(json_array_get(list, i), w, &st->v[i], err), field));
    }
    for (int i = 0; i < st->n; i++)
        if (!st->v[i].named) default_name(st, i);
    return check_names(st, where, err);
}

int reward_stage_create(const json_t *spec, const char *where, struct reward_stage **out,
                        struct smelt_error *err) {
    static const char *const keys[] = {"verifiers", "grader", NULL};
    *out = NULL;
    if (!json_is_object(spec)) return error_set(err, SMELT_EINVAL, "%s: the reward spec must be a JSON object", where);
    TRY(json_check_keys(spec, keys, where, err));
    const json_t *grader = json_object_get(spec, "grader");
    if (json_is_null(grader)) grader = NULL;
    if (grader && json_object_get(spec, "verifiers"))
        return error_set_field(err, SMELT_EINVAL, "grader",
                               "%s.grader: a spec holds \"verifiers\" or one \"grader\", not both (a multi grader "
                               "combines several)",
                               where);
    struct reward_stage *st = calloc(1, sizeof *st);
    if (!st) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    int rc = grader ? reward_grader_create(grader, where, &st->grader, err) : parse_list(spec, where, st, err);
    if (rc) {
        reward_stage_free(st);
        return rc;
    }
    *out = st;
    return SMELT_OK;
}

void reward_stage_free(struct reward_stage *stage) {
    if (!stage) return;
    reward_grader_free(stage->grader);
    for (int i = 0; i < stage->n; i++) {
        reward_pattern_free(&stage->v[i].pattern);
        reward_pattern_free(&stage->v[i].extract.pattern);
    }
    free(stage);
}

static json_t *verifier_to_json(const struct reward_verifier *v) {
    json_t *obj = json_object();
    if (!obj) return NULL;
    int bad = reward_json_set(obj, "type", json_string(v->type->name));
    bad |= reward_json_set(obj, "name", json_string(v->name));
    bad |= reward_json_set(obj, "weight", json_real(v->weight));
    bad |= v->type->to_json(v, obj);
    if (bad) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

int reward_stage_to_json(const struct reward_stage *stage, json_t **out, struct smelt_error *err) {
    json_t *root = json_object(), *list = stage->grader ? reward_grader_to_json(stage->grader) : json_array();
    int bad = !root || !list;
    for (int i = 0; i < stage->n && !bad; i++) bad |= json_array_append_new(list, verifier_to_json(&stage->v[i]));
    bad |= reward_json_set(root, stage->grader ? "grader" : "verifiers", list);
    if (bad) {
        json_decref(root);
        return error_set(err, SMELT_ENOMEM, "reward_stage_to_json: out of memory");
    }
    *out = root;
    return SMELT_OK;
}
