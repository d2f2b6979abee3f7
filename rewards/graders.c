/* OpenAI-style graders: the spec's "grader" object read into a tree (a string_check,
 * text_similarity, python, endpoint or reward_model grader, or a multi grader over
 * named ones and a formula), written back, and run on one sample at a time (python
 * graders, endpoints and reward models on the whole batch first: python_grader.c in
 * their sandboxes, endpoint_grader.c through the user's service, reward_model_grader.c).
 * Errors name the field's path as OpenAI does ("grader.graders.acc.operation"). */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "rewards/endpoint_internal.h"
#include "rewards/rewards_internal.h"
#include "rewards/sandbox_internal.h"

static const char *const TYPE_NAMES[] = {"string_check", "text_similarity", "multi",      "python",
                                          "endpoint",     "reward_model",    "score_model", "label_model"};
#define N_TYPES 8
static const char *const OPERATIONS[] = {"eq", "ne", "like", "ilike"};
static const char *const METRICS[] = {"fuzzy_match", "bleu",    "gleu",    "rouge_1", "rouge_2",
                                      "rouge_3",     "rouge_4", "rouge_5", "rouge_l"};
#define N_OPERATIONS 4
#define N_METRICS 9

static const char *const STRING_CHECK_KEYS[] = {"type", "name", "input", "reference", "operation", NULL};
static const char *const TEXT_SIMILARITY_KEYS[] = {"type",      "name",           "input", "reference",
                                                   "evaluation_metric", "pass_threshold", NULL};
static const char *const MULTI_KEYS[] = {"type", "name", "graders", "calculate_output", NULL};
static const char *const PYTHON_KEYS[] = {"type",      "name",      "source",    "image_tag", "pass_threshold",
                                          "timeout_s", "memory_mb", "sandboxes", NULL};
static const char *const ENDPOINT_KEYS[] = {"type", "name", "url", "timeout_s", "max_retries", "headers", NULL};

/* ---- reading the spec ---- */

static int parse_grader(const json_t *obj, const char *w, bool nested, struct reward_grader *g,
                        struct smelt_error *err);

static int parse_type(const json_t *obj, const char *w, bool nested, struct reward_grader *g,
                      struct smelt_error *err) {
    const char *type;
    TRY(json_field_string(obj, "type", true, NULL, &type, w, err));
    for (int t = 0; t < N_TYPES; t++)
        if (strcmp(type, TYPE_NAMES[t]) == 0) {
            if (t == GRADER_MULTI && nested)
                return error_set_field(err, SMELT_EINVAL, "type",
                                       "%s.type: a multi grader's graders are string_check, text_similarity, "
                                       "python, endpoint, reward_model, score_model or label_model graders, not "
                                       "another multi (OpenAI's shape)",
                                       w);
            g->type = (enum grader_type)t;
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EINVAL, "type",
                           "%s.type: unknown grader type \"%.40s\" (string_check, text_similarity, python, multi, "
                           "endpoint, reward_model, score_model, label_model)",
                           w, type);
}

static int parse_name(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(obj, "name", false, NULL, &name, w, err));
    if (!name) return SMELT_OK;
    if (strlen(name) > GRADER_MAX_NAME_BYTES)
        return error_set_field(err, SMELT_EINVAL, "name", "%s.name: %zu bytes, expected at most %d", w, strlen(name),
                               GRADER_MAX_NAME_BYTES);
    g->name = strdup(name);
    return g->name ? SMELT_OK : error_set(err, SMELT_ENOMEM, "%s.name: out of memory", w);
}

/* A required string field that must be one of names[0..n): its index in *out. */
static int parse_choice(const json_t *obj, const char *key, const char *const *names, int n, const char *w, int *out,
                        struct smelt_error *err) {
    const char *value;
    TRY(json_field_string(obj, key, true, NULL, &value, w, err));
    for (int k = 0; k < n; k++)
        if (strcmp(value, names[k]) == 0) {
            *out = k;
            return SMELT_OK;
        }
    char list[200] = "";
    for (int k = 0; k < n; k++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", names[k]);
    return error_set_field(err, SMELT_EINVAL, key, "%s.%s: \"%.40s\" is not one of %s", w, key, value, list);
}

static int parse_string_check(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    int op;
    TRY(grader_template_parse(obj, "input", w, &g->input, err));
    TRY(grader_template_parse(obj, "reference", w, &g->reference, err));
    TRY(parse_choice(obj, "operation", OPERATIONS, N_OPERATIONS, w, &op, err));
    g->operation = (enum grader_operation)op;
    return SMELT_OK;
}

/* The metrics OpenAI lists that smelt refuses, by name and why. */
static int refused_metric(const json_t *obj, const char *w, struct smelt_error *err) {
    const char *m = json_string_value(json_object_get(obj, "evaluation_metric"));
    if (m && strcmp(m, "cosine") == 0)
        return error_set_field(err, SMELT_EINVAL, "evaluation_metric",
                               "%s.evaluation_metric: cosine needs an embedding model, and none is configured", w);
    if (m && strcmp(m, "meteor") == 0)
        return error_set_field(err, SMELT_EINVAL, "evaluation_metric",
                               "%s.evaluation_metric: meteor needs WordNet's synonym sets, which smelt does not ship "
                               "(bleu, gleu, rouge_l are available)",
                               w);
    return SMELT_OK;
}

static int parse_text_similarity(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    int m;
    TRY(grader_template_parse(obj, "input", w, &g->input, err));
    TRY(grader_template_parse(obj, "reference", w, &g->reference, err));
    TRY(refused_metric(obj, w, err));
    TRY(parse_choice(obj, "evaluation_metric", METRICS, N_METRICS, w, &m, err));
    g->evaluation_metric = (enum grader_metric)m;
    const json_t *t = json_object_get(obj, "pass_threshold");
    g->has_pass_threshold = t && !json_is_null(t);
    return json_field_double(obj, "pass_threshold", false, 0.0, 0.0, 1.0, &g->pass_threshold, w, err);
}

/* A sub-grader's key: a name the formula can read ([A-Za-z_][A-Za-z0-9_]*, 1 to 32
 * bytes), not a function of the formula, not the multi's own metric name. */
static int check_key(const char *key, const char *w, struct smelt_error *err) {
    size_t len = strlen(key);
    bool ok = len > 0 && len < REWARD_NAME_BYTES && !(key[0] >= '0' && key[0] <= '9');
    for (const char *c = key; *c && ok; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_';
    if (!ok)
        return error_set(err, SMELT_EINVAL,
                         "%s.graders: \"%.40s\" is not a grader name: 1 to %d letters, digits or '_', not starting "
                         "with a digit (calculate_output reads it)",
                         w, key, REWARD_NAME_BYTES - 1);
    if (grader_formula_is_function(key) || strcmp(key, "multi") == 0)
        return error_set(err, SMELT_EINVAL, "%s.graders: \"%s\" is taken (%s); name the grader otherwise", w, key,
                         strcmp(key, "multi") == 0 ? "the multi grader's own metric" : "a function of calculate_output");
    return SMELT_OK;
}

static int parse_multi(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    const json_t *graders = json_object_get(obj, "graders");
    if (!json_is_object(graders) || json_object_size(graders) == 0 || json_object_size(graders) > GRADER_MAX_SUB)
        return error_set_field(err, SMELT_EINVAL, "graders",
                               "%s.graders: expected an object of 1 to %d named graders ({\"acc\": {\"type\": "
                               "\"string_check\", ...}})",
                               w, GRADER_MAX_SUB);
    g->sub = calloc(json_object_size(graders), sizeof *g->sub);
    if (!g->sub) return error_set(err, SMELT_ENOMEM, "%s.graders: out of memory", w);
    const char *names[GRADER_MAX_SUB], *key;
    const json_t *sub;
    json_object_foreach((json_t *)graders, key, sub) {
        char field[GRADER_PATH_BYTES], ws[600];
        struct reward_grader *s = &g->sub[g->n_sub];
        TRY(error_in_field(err, check_key(key, w, err), "graders"));
        snprintf(field, sizeof field, "graders.%s", key);
        snprintf(ws, sizeof ws, "%s.%s", w, field);
        snprintf(s->path, sizeof s->path, "grader.graders.%.32s", key);
        snprintf(s->metric, sizeof s->metric, "%s", key);
        names[g->n_sub++] = s->metric; /* counted now, so that reward_grader_free frees it */
        TRY(error_in_field(err, parse_grader(sub, ws, true, s, err), field));
    }
    const char *formula;
    TRY(json_field_string(obj, "calculate_output", true, NULL, &formula, w, err));
    char wf[600];
    snprintf(wf, sizeof wf, "%s.calculate_output", w);
    return grader_formula_parse(formula, names, g->n_sub, wf, &g->formula, err);
}

static int parse_grader(const json_t *obj, const char *w, bool nested, struct reward_grader *g,
                        struct smelt_error *err) {
    if (!json_is_object(obj))
        return error_set(err, SMELT_EINVAL, "%s: expected a grader object like {\"type\": \"string_check\", ...}", w);
    TRY(parse_type(obj, w, nested, g, err));
    static const char *const *const KEYS[] = {STRING_CHECK_KEYS, TEXT_SIMILARITY_KEYS, MULTI_KEYS, PYTHON_KEYS,
                                              ENDPOINT_KEYS, GRADER_RM_KEYS, GRADER_SCORE_MODEL_KEYS,
                                              GRADER_LABEL_MODEL_KEYS};
    TRY(json_check_keys(obj, KEYS[g->type], w, err));
    TRY(parse_name(obj, w, g, err));
    if (g->type == GRADER_STRING_CHECK) return parse_string_check(obj, w, g, err);
    if (g->type == GRADER_TEXT_SIMILARITY) return parse_text_similarity(obj, w, g, err);
    if (g->type == GRADER_PYTHON) return grader_python_parse(obj, w, g, err);
    if (g->type == GRADER_ENDPOINT) return grader_endpoint_parse(obj, w, g, err);
    if (g->type == GRADER_REWARD_MODEL) return grader_rm_parse(obj, w, g, err);
    if (g->type == GRADER_SCORE_MODEL || g->type == GRADER_LABEL_MODEL) return grader_lm_parse(obj, w, g, err);
    return parse_multi(obj, w, g, err);
}

int reward_grader_create(const json_t *obj, const char *where, struct reward_grader **out, struct smelt_error *err) {
    *out = NULL;
    struct reward_grader *g = calloc(1, sizeof *g);
    if (!g) return error_set(err, SMELT_ENOMEM, "%s.grader: out of memory", where);
    snprintf(g->path, sizeof g->path, "grader");
    char w[400];
    snprintf(w, sizeof w, "%s.grader", where);
    int rc = error_in_field(err, parse_grader(obj, w, false, g, err), "grader");
    if (rc) {
        reward_grader_free(g);
        return rc;
    }
    snprintf(g->metric, sizeof g->metric, "%s", TYPE_NAMES[g->type]);
    *out = g;
    return SMELT_OK;
}

static void grader_clear(struct reward_grader *g) {
    for (int k = 0; k < g->n_sub; k++) grader_clear(&g->sub[k]);
    free(g->sub);
    free(g->name);
    grader_template_free(&g->input);
    grader_template_free(&g->reference);
    grader_formula_free(&g->formula);
    grader_python_free(g->py);
    grader_endpoint_free(g->ep);
    grader_rm_free(g->rm);
    grader_lm_free(g->lm);
}

void reward_grader_free(struct reward_grader *g) {
    if (!g) return;
    grader_clear(g);
    free(g);
}

/* ---- writing it back ---- */

json_t *reward_grader_to_json(const struct reward_grader *g) {
    json_t *obj = json_object();
    if (!obj) return NULL;
    int bad = reward_json_set(obj, "type", json_string(TYPE_NAMES[g->type]));
    if (g->name) bad |= reward_json_set(obj, "name", json_string(g->name));
    if (g->type == GRADER_MULTI) {
        json_t *subs = json_object();
        bad |= !subs;
        for (int k = 0; k < g->n_sub && !bad; k++) bad |= reward_json_set(subs, g->sub[k].metric, reward_grader_to_json(&g->sub[k]));
        bad |= reward_json_set(obj, "graders", subs);
        bad |= reward_json_set(obj, "calculate_output", json_string(g->formula.src));
    } else if (g->type == GRADER_ENDPOINT) {
        bad |= grader_endpoint_to_json(g->ep, obj);
    } else if (g->type == GRADER_REWARD_MODEL) {
        bad |= grader_rm_to_json(g->rm, obj);
    } else if (g->lm) {
        bad |= grader_lm_to_json(g, obj);
    } else if (g->type == GRADER_PYTHON) {
        bad |= grader_python_to_json(g->py, obj);
        if (g->has_pass_threshold) bad |= reward_json_set(obj, "pass_threshold", json_real(g->pass_threshold));
    } else {
        bad |= reward_json_set(obj, "input", json_stringn(g->input.src, g->input.len));
        bad |= reward_json_set(obj, "reference", json_stringn(g->reference.src, g->reference.len));
        if (g->type == GRADER_STRING_CHECK)
            bad |= reward_json_set(obj, "operation", json_string(OPERATIONS[g->operation]));
        else bad |= reward_json_set(obj, "evaluation_metric", json_string(METRICS[g->evaluation_metric]));
        if (g->has_pass_threshold) bad |= reward_json_set(obj, "pass_threshold", json_real(g->pass_threshold));
    }
    if (bad) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* ---- scoring ---- */

/* Is ref a substring of in, byte for byte (lower: per character lowercased)? */
static int contains(const char *in, size_t n_in, const char *ref, size_t n_ref, bool lower, bool *out) {
    if (!lower) {
        *out = n_ref == 0 || (n_ref <= n_in && memmem(in, n_in, ref, n_ref) != NULL);
        return SMELT_OK;
    }
    int32_t *a = malloc((n_in ? n_in : 1) * sizeof *a), *b = malloc((n_ref ? n_ref : 1) * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return SMELT_ENOMEM;
    }
    size_t na = 0, nb = 0, i = 0;
    while (i < n_in) a[na++] = reward_next_char(in, n_in, &i, true);
    for (i = 0; i < n_ref;) b[nb++] = reward_next_char(ref, n_ref, &i, true);
    *out = nb == 0;
    for (size_t s = 0; !*out && s + nb <= na; s++) *out = memcmp(a + s, b, nb * sizeof *b) == 0;
    free(a);
    free(b);
    return SMELT_OK;
}

struct scratch {
    struct grader_context ctx;
    struct reward_buf in, ref;
    int i;                 /* the sample's index in the batch (python graders' results) */
    char *warning;         /* a python grader's reason for a 0 */
    size_t warning_n;
};

static int string_check(const struct reward_grader *g, const struct reward_buf *in, const struct reward_buf *ref,
                        double *score) {
    bool yes;
    if (g->operation == GRADER_EQ || g->operation == GRADER_NE)
        yes = (in->n == ref->n && memcmp(in->p, ref->p, in->n) == 0) == (g->operation == GRADER_EQ);
    else TRY(contains(in->p, in->n, ref->p, ref->n, g->operation == GRADER_ILIKE, &yes));
    *score = yes ? 1.0 : 0.0;
    return SMELT_OK;
}

static int describe_failure(const struct reward_grader *g, const char *what, char *why, size_t why_n) {
    snprintf(why, why_n, "%s (%s): %s", g->path, TYPE_NAMES[g->type], what);
    return GRADER_FAILED;
}

/* A python grader's result for sample i: its score, or 0 and the reason in warning (the
 * first warning of the sample is kept). */
static void score_python(const struct reward_grader *g, int i, double *score, char *warning, size_t warning_n) {
    char what[SANDBOX_MESSAGE_BYTES];
    if (grader_python_result(g->py, i, score, what, sizeof what) || warning[0]) return;
    describe_failure(g, what, warning, warning_n);
}

/* A string_check, text_similarity, python, endpoint, reward_model, score_model or
 * label_model grader on the sample
 * of x->ctx (sample i). */
static int score_leaf(const struct reward_grader *g, struct scratch *x, double *score, char *why, size_t why_n) {
    if (g->type == GRADER_ENDPOINT) return grader_endpoint_result(g->ep, x->i, score, why, why_n);
    if (g->type == GRADER_REWARD_MODEL) return grader_rm_result(g->rm, x->i, score, why, why_n);
    if (g->lm) return grader_lm_result(g->lm, x->i, score, why, why_n);
    if (g->type == GRADER_PYTHON) {
        score_python(g, x->i, score, x->warning, x->warning_n);
        return SMELT_OK;
    }
    int rc = grader_template_render(&g->input, &x->ctx, &x->in, why, why_n);
    if (!rc) rc = grader_template_render(&g->reference, &x->ctx, &x->ref, why, why_n);
    if (rc == GRADER_ZERO) {
        *score = 0;
        return SMELT_OK;
    }
    if (rc) return rc;
    if (g->type == GRADER_STRING_CHECK) return string_check(g, &x->in, &x->ref, score);
    return grader_similarity(g->evaluation_metric, x->in.p, x->in.n, x->ref.p, x->ref.n, score);
}

/* Every sub-grader, even after one failed (their metrics stay complete), then the formula. */
static int score_multi(const struct reward_grader *g, struct scratch *x, double *scores, char *why, size_t why_n) {
    bool failed = false;
    for (int k = 0; k < g->n_sub; k++) {
        char what[REWARD_ERROR_BYTES];
        int rc = score_leaf(&g->sub[k], x, &scores[1 + k], what, sizeof what);
        if (rc < 0) return rc;
        if (!rc) continue;
        scores[1 + k] = NAN;
        if (!failed) describe_failure(&g->sub[k], what, why, why_n);
        failed = true;
    }
    if (failed) return GRADER_FAILED;
    char what[REWARD_ERROR_BYTES];
    if (grader_formula_eval(&g->formula, scores + 1, &scores[0], what, sizeof what))
        return describe_failure(g, what, why, why_n);
    return SMELT_OK;
}

int reward_grader_score(struct reward_grader *g, const struct reward_sample *s, int i, double *scores, char *why,
                        size_t why_n, char *warning, size_t warning_n) {
    struct scratch x = {.i = i, .warning = warning, .warning_n = warning_n};
    warning[0] = '\0';
    grader_context_init(&x.ctx, s->answer, s->metadata_json, s->completion);
    int rc;
    if (g->type == GRADER_MULTI) {
        rc = score_multi(g, &x, scores, why, why_n);
    } else {
        char what[REWARD_ERROR_BYTES];
        rc = score_leaf(g, &x, &scores[0], what, sizeof what);
        if (rc == GRADER_FAILED) describe_failure(g, what, why, why_n);
    }
    if (rc) scores[0] = NAN;
    grader_context_reset(&x.ctx);
    reward_buf_free(&x.in);
    reward_buf_free(&x.ref);
    return rc;
}

static int check_leaf(const struct reward_grader *g, struct grader_context *c, struct smelt_error *err) {
    /* grade() and the user's service read whatever they like of the row; a reward model reads none of it */
    if (g->type == GRADER_PYTHON || g->type == GRADER_ENDPOINT || g->type == GRADER_REWARD_MODEL) return SMELT_OK;
    if (g->lm) return grader_lm_check_row(g, c, err);
    const struct grader_template *t[2] = {&g->input, &g->reference};
    for (int k = 0; k < 2; k++) {
        const char *field = NULL;
        char why[REWARD_ERROR_BYTES];
        if (grader_template_check_row(t[k], c, &field, why, sizeof why))
            return error_set_field(err, SMELT_EINVAL, field, "%s.%s: %s", g->path, k ? "reference" : "input", why);
    }
    return SMELT_OK;
}

int reward_grader_check_row(const struct reward_grader *g, const char *answer, const char *metadata_json,
                            struct smelt_error *err) {
    struct grader_context c;
    grader_context_init(&c, answer, metadata_json, "");
    int rc = SMELT_OK;
    if (g->type != GRADER_MULTI) rc = check_leaf(g, &c, err);
    for (int k = 0; k < g->n_sub && !rc; k++) rc = check_leaf(&g->sub[k], &c, err);
    grader_context_reset(&c);
    return rc;
}

/* The endpoint and python graders of the tree, each on the whole batch. */
int reward_grader_prepare(struct reward_grader *g, const struct reward_sample *samples, int n,
                          struct smelt_error *err) {
    TRY(grader_endpoint_prepare(g, samples, n, err));
    TRY(grader_rm_prepare(g, samples, n, err));
    TRY(grader_lm_prepare(g, samples, n, err));
    struct reward_grader *py[1 + GRADER_MAX_SUB];
    int n_py = 0;
    if (g->type == GRADER_PYTHON) py[n_py++] = g;
    for (int k = 0; k < g->n_sub; k++)
        if (g->sub[k].type == GRADER_PYTHON) py[n_py++] = &g->sub[k];
    if (n_py == 0 || n == 0) return SMELT_OK;
    char **requests;
    TRY(grader_python_requests(samples, n, &requests, err));
    int rc = SMELT_OK;
    for (int k = 0; k < n_py && !rc; k++)
        rc = error_wrap(err, grader_python_run(py[k]->py, (const char *const *)requests, n, err), "%s (python)",
                        py[k]->path);
    grader_python_requests_free(requests, n);
    return rc;
}

int reward_grader_count(const struct reward_grader *g) { return 1 + g->n_sub; }

const char *reward_grader_name(const struct reward_grader *g, int i) {
    return i == 0 ? g->metric : g->sub[i - 1].metric;
}
