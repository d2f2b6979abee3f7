/* The reward stage at work: a batch of samples scored by every verifier (the weighted
 * sum) or by the grader (its score; python graders first run on the whole batch),
 * per-sample failures and zeros-with-a-reason kept apart from failures of the stage; the
 * up-front check of a prompts row; the names of the scores for metrics. */
#include "rewards/rewards_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rewards/graders_internal.h"

static int check_args(const struct reward_stage *stage, const struct reward_sample *samples, int n,
                      const struct reward_result *out, struct smelt_error *err) {
    if (!stage || n < 0 || (n > 0 && (!samples || !out)))
        return error_set(err, SMELT_EINVAL, "reward_stage_score: bad arguments (stage %p, %d samples)",
                         (const void *)stage, n);
    for (int i = 0; i < n; i++)
        if (!samples[i].completion)
            return error_set(err, SMELT_EINVAL, "reward_stage_score: samples[%d].completion is NULL", i);
    return SMELT_OK;
}

/* Every verifier on one sample. A verifier that fails leaves NaN as its score and the
 * first failure's message; the others still score, for metrics. */
static void score_sample(struct reward_stage *stage, const struct reward_sample *s, struct reward_result *r) {
    memset(r, 0, sizeof *r);
    for (int k = 0; k < stage->n; k++) {
        struct reward_verifier *v = &stage->v[k];
        char why[REWARD_ERROR_BYTES - 64] = "";
        double score = 0.0;
        if (v->type->score(v, s, &score, why, sizeof why) == 0) {
            r->scores[k] = score;
            r->reward += v->weight * score;
            continue;
        }
        r->scores[k] = NAN;
        if (!r->failed)
            snprintf(r->error, sizeof r->error, "%s (verifiers[%d], %s): %s", v->name, k, v->type->name, why);
        r->failed = true;
    }
    if (r->failed) r->reward = NAN;
}

/* The grader on sample i of the batch: its score is the reward. */
static int grade_sample(struct reward_stage *stage, const struct reward_sample *s, int i, struct reward_result *r) {
    memset(r, 0, sizeof *r);
    int rc = reward_grader_score(stage->grader, s, i, r->scores, r->error, sizeof r->error, r->warning,
                                 sizeof r->warning);
    if (rc < 0) return rc;
    r->failed = rc == GRADER_FAILED;
    r->reward = r->failed ? NAN : r->scores[0];
    return SMELT_OK;
}

int reward_stage_score(struct reward_stage *stage, const struct reward_sample *samples, int n,
                       struct reward_result *out, struct smelt_error *err) {
    TRY(check_args(stage, samples, n, out, err));
    /* Python graders grade the whole batch at once, in their sandboxes. */
    if (stage->grader) TRY(error_wrap(err, reward_grader_prepare(stage->grader, samples, n, err), "reward_stage_score"));
    for (int i = 0; i < n; i++) {
        if (!stage->grader) {
            score_sample(stage, &samples[i], &out[i]);
            continue;
        }
        int rc = grade_sample(stage, &samples[i], i, &out[i]);
        if (rc) return error_set(err, rc, "reward_stage_score: out of memory grading samples[%d]", i);
    }
    return SMELT_OK;
}

int reward_stage_check_prompt(const struct reward_stage *stage, const char *answer, const char *metadata_json,
                              struct smelt_error *err) {
    if (stage->grader) return reward_grader_check_row(stage->grader, answer, metadata_json, err);
    for (int k = 0; k < stage->n; k++) {
        const struct reward_verifier *v = &stage->v[k];
        char why[REWARD_ERROR_BYTES];
        if (v->type->check_answer && v->type->check_answer(v, answer, why, sizeof why))
            return error_set_field(err, SMELT_EINVAL, "answer", "%s (verifiers[%d], %s): %s", v->name, k,
                                   v->type->name, why);
    }
    return SMELT_OK;
}

int reward_stage_count(const struct reward_stage *stage) {
    return stage->grader ? reward_grader_count(stage->grader) : stage->n;
}

const char *reward_stage_name(const struct reward_stage *stage, int i) {
    SMELT_ASSERT(i >= 0 && i < reward_stage_count(stage));
    return stage->grader ? reward_grader_name(stage->grader, i) : stage->v[i].name;
}
