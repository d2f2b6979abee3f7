/* The models of an RL job's reward: each reward_model, score_model or label_model
 * grader's "model" names a model as a job's `model` does (GET /v1/models: a job's
 * fine_tuned_model, or a base model), and the job spec gets its directory beside the name as "model_dir",
 * as resolve_critic does for a ppo job's critic_model. A directory never comes from the
 * request: "model_dir" there is refused. The trainer then checks the model is a
 * sequence classifier (trainer/reward_scorer.c), or a causal LM for the model graders
 * (trainer/reward_generator.c). The job object shows the grader without it
 * (jobs_grader_shown): a server path is no business of an API client. */
#include <stdio.h>
#include <string.h>

#include "server/server_internal.h"

/* One grader object at path (the request's, "method.grpo.reward.grader.graders.rm"). */
static int resolve_one(struct server *s, struct store_conn *conn, const char *project, json_t *g, const char *path,
                       struct smelt_error *err) {
    const char *type = json_string_value(json_object_get(g, "type"));
    if (!type || (strcmp(type, "reward_model") != 0 && strcmp(type, "score_model") != 0 &&
                  strcmp(type, "label_model") != 0))
        return SMELT_OK;
    char field[SMELT_ERROR_FIELD_BYTES + 16], dir[SERVER_PATH_BYTES], kind[16];
    snprintf(field, sizeof field, "%s.model_dir", path);
    if (json_object_get(g, "model_dir"))
        return error_set_field(err, SMELT_EINVAL, field, "%s: not accepted; smelt finds the directory of the model "
                               "named in model (GET /v1/models lists them)", field);
    snprintf(field, sizeof field, "%s.model", path);
    json_t *name = json_object_get(g, "model");
    if (!json_is_string(name) || !json_string_length(name))
        return error_set_field(err, SMELT_EINVAL, field, "%s: a model name is expected (GET /v1/models lists them: "
                               "a job's fine_tuned_model, or a base model)", field);
    int rc = models_resolve(s, conn, project, json_string_value(name), dir, sizeof dir, kind, sizeof kind, err);
    if (rc == SMELT_ENOTFOUND)
        return error_set_field(err, SMELT_EINVAL, field, "%s: no such model: %.200s (GET /v1/models lists them)",
                               field, json_string_value(name));
    TRY(rc);
    if (json_object_set_new(g, "model_dir", json_string(dir)))
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", field);
    return SMELT_OK;
}

int jobs_resolve_reward_models(struct server *s, struct store_conn *conn, const char *project, json_t *grader,
                               const char *path, struct smelt_error *err) {
    if (!json_is_object(grader)) return SMELT_OK; /* the trainer's parser names what is wrong */
    TRY(resolve_one(s, conn, project, grader, path, err));
    const char *key;
    json_t *sub;
    json_t *subs = json_object_get(grader, "graders");
    const char *type = json_string_value(json_object_get(grader, "type"));
    if (!type || strcmp(type, "multi") != 0 || !json_is_object(subs)) return SMELT_OK;
    json_object_foreach(subs, key, sub) {
        char at[SMELT_ERROR_FIELD_BYTES];
        snprintf(at, sizeof at, "%.48s.graders.%.64s", path, key);
        if (json_is_object(sub)) TRY(resolve_one(s, conn, project, sub, at, err));
    }
    return SMELT_OK;
}

void jobs_grader_shown(json_t *grader) {
    if (!json_is_object(grader)) return;
    json_object_del(grader, "model_dir"); /* absent for other types: nothing to delete */
    const char *key;
    json_t *sub;
    json_object_foreach(json_object_get(grader, "graders"), key, sub) jobs_grader_shown(sub);
}
