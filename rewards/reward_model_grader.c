/* smelt's reward_model grader: {"type": "reward_model", "name"?, "model": M,
 * "model_dir"?, "batch_size"?, "max_length"?, "normalize"?}. The score of a sample is a
 * sequence classifier's scalar on its prompt + completion (optionally through a
 * sigmoid). rewards/ loads no model: the stage's owner sets a scorer
 * (reward_stage_set_model_scorer, rewards.h) that opens each grader's model once and
 * scores whole batches; this file holds the fields, the handle and the batch's results.
 * Without a scorer every sample the grader scores fails, saying why. */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "rewards/rewards_internal.h"

#define DEFAULT_BATCH_SIZE 16
#define MAX_BATCH_SIZE 1024
#define MAX_LENGTH (1 << 20)
#define MAX_MODEL_BYTES 1024

const char *const GRADER_RM_KEYS[] = {"type",       "name",       "model",     "model_dir",
                                      "batch_size", "max_length", "normalize", NULL};

struct grader_rm {
    char *model;                 /* as given: a model name (the API's) or a directory */
    char *model_dir;             /* smeltd's resolution of the name; NULL when not given */
    int batch_size;
    int64_t max_length;          /* 0: the model's context */
    bool sigmoid;                /* normalize "sigmoid" */
    struct reward_model_scorer scorer;
    void *handle;                /* the scorer's model; NULL until opened */
    int n;                       /* the last batch */
    struct reward_model_result *results;
};

/* ---- reading ---- */

static int parse_normalize(const json_t *obj, const char *w, struct grader_rm *rm, struct smelt_error *err) {
    const char *v;
    TRY(json_field_string(obj, "normalize", false, "none", &v, w, err));
    if (strcmp(v, "none") != 0 && strcmp(v, "sigmoid") != 0)
        return error_set_field(err, SMELT_EINVAL, "normalize",
                               "%s.normalize: \"%.40s\" is not one of none (the raw score), sigmoid", w, v);
    rm->sigmoid = strcmp(v, "sigmoid") == 0;
    return SMELT_OK;
}

int grader_rm_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err) {
    struct grader_rm *rm = calloc(1, sizeof *rm);
    if (!rm) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    g->rm = rm; /* owned by g from now: reward_grader_free frees it on any failure below */
    TRY(grader_parse_text(obj, "model", true, MAX_MODEL_BYTES, w, &rm->model, err));
    TRY(grader_parse_text(obj, "model_dir", false, MAX_MODEL_BYTES, w, &rm->model_dir, err));
    int64_t batch;
    TRY(json_field_int(obj, "batch_size", false, DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE, &batch, w, err));
    rm->batch_size = (int)batch;
    TRY(json_field_int(obj, "max_length", false, 0, 0, MAX_LENGTH, &rm->max_length, w, err));
    if (rm->max_length == 1)
        return error_set_field(err, SMELT_EINVAL, "max_length",
                               "%s.max_length: 1 token holds no completion (0: the model's context, or 2 or more)", w);
    return parse_normalize(obj, w, rm, err);
}

void grader_rm_free(struct grader_rm *rm) {
    if (!rm) return;
    if (rm->handle && rm->scorer.close) rm->scorer.close(rm->handle);
    free(rm->model);
    free(rm->model_dir);
    free(rm->results);
    free(rm);
}

int grader_rm_to_json(const struct grader_rm *rm, json_t *obj) {
    int bad = reward_json_set(obj, "model", json_string(rm->model));
    if (rm->model_dir) bad |= reward_json_set(obj, "model_dir", json_string(rm->model_dir));
    bad |= reward_json_set(obj, "batch_size", json_integer(rm->batch_size));
    bad |= reward_json_set(obj, "max_length", json_integer(rm->max_length));
    bad |= reward_json_set(obj, "normalize", json_string(rm->sigmoid ? "sigmoid" : "none"));
    return bad;
}

/* ---- the scorer ---- */

static int open_one(struct reward_grader *g, const struct reward_model_scorer *scorer, struct smelt_error *err) {
    struct grader_rm *rm = g->rm;
    struct reward_model_ref ref = {.model = rm->model, .dir = rm->model_dir ? rm->model_dir : rm->model,
                                   .field = g->path, .batch_size = rm->batch_size, .max_length = rm->max_length};
    rm->scorer = *scorer;
    return scorer->open(scorer->ctx, &ref, &rm->handle, err);
}

/* g's model when it has one not yet opened, by the scorer's entry for its kind. */
static int open_grader(struct reward_grader *g, const struct reward_model_scorer *scorer, struct smelt_error *err) {
    if (g->lm && !g->lm->handle) return grader_lm_open(g, scorer, err);
    if (g->type != GRADER_REWARD_MODEL || g->rm->handle) return SMELT_OK;
    if (!scorer->open || !scorer->score) {
        error_set(err, SMELT_EINVAL, "%s.model: this scorer cannot run a reward model", g->path);
        snprintf(err->field, sizeof err->field, "%s.model", g->path);
        return SMELT_EINVAL;
    }
    return open_one(g, scorer, err);
}

int reward_stage_set_model_scorer(struct reward_stage *stage, const struct reward_model_scorer *scorer,
                                  struct smelt_error *err) {
    if (!stage || !scorer || !((scorer->open && scorer->score) || (scorer->open_generator && scorer->generate)))
        return error_set(err, SMELT_EINVAL, "reward_stage_set_model_scorer: a stage and a scorer with open and score, "
                         "or open_generator and generate");
    struct reward_grader *g = stage->grader;
    if (!g) return SMELT_OK;
    TRY(open_grader(g, scorer, err));
    for (int k = 0; k < g->n_sub; k++) TRY(open_grader(&g->sub[k], scorer, err));
    return SMELT_OK;
}

/* The batch through one grader's model, or every sample failed when it has none. */
static int run_one(const struct reward_grader *g, const struct reward_sample *samples, int n,
                   struct smelt_error *err) {
    struct grader_rm *rm = g->rm;
    free(rm->results);
    rm->n = 0;
    rm->results = calloc(n > 0 ? (size_t)n : 1, sizeof *rm->results);
    if (!rm->results) return error_set(err, SMELT_ENOMEM, "%s (reward_model): out of memory", g->path);
    rm->n = n;
    if (rm->handle)
        return error_wrap(err, rm->scorer.score(rm->handle, samples, n, rm->results, err), "%s (reward_model)",
                          g->path);
    for (int i = 0; i < n; i++) {
        rm->results[i].failed = true;
        snprintf(rm->results[i].error, sizeof rm->results[i].error,
                 "no reward model is loaded here: reward_model graders score in the trainer (smelt-trainer), "
                 "which loads %.120s", rm->model);
    }
    return SMELT_OK;
}

int grader_rm_prepare(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err) {
    if (g->type == GRADER_REWARD_MODEL) TRY(run_one(g, samples, n, err));
    for (int k = 0; k < g->n_sub; k++)
        if (g->sub[k].type == GRADER_REWARD_MODEL) TRY(run_one(&g->sub[k], samples, n, err));
    return SMELT_OK;
}

int grader_rm_result(const struct grader_rm *rm, int i, double *score, char *why, size_t why_n) {
    SMELT_ASSERT(i >= 0 && i < rm->n);
    const struct reward_model_result *r = &rm->results[i];
    if (r->failed || !isfinite(r->score)) {
        snprintf(why, why_n, "%s", r->failed ? r->error : "the reward model's score is not a finite number");
        return GRADER_FAILED;
    }
    *score = rm->sigmoid ? 1.0 / (1.0 + exp(-r->score)) : r->score;
    return SMELT_OK;
}
