/* length_penalty: DAPO's overlong reward shaping ("soft overlong punishment", Yu et al.
 * 2025, eq. 13), as veRL's DAPO reward manager and TRL's get_soft_overlong_punishment
 * compute it. With L = max_tokens, C = cache_tokens and len the completion's tokens:
 *     0                    len <= L - C
 *     (L - C - len) / C    L - C < len <= L    (from -1/C down to -1)
 *     -1                   len > L
 * C = 0 leaves no soft band: 0 up to L, -1 beyond (TRL's soft_punish_cache = 0). The
 * weight scales it (veRL's overlong_buffer.penalty_factor). With truncated_penalty p,
 * a sample the engine stopped at its token limit (finish reason "length") scores at most
 * -p, however long it is: a cut-off answer is penalised even when the engine's limit is
 * below L. */
#include "rewards/rewards_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "rollout/rollout.h"

static int parse_length(const json_t *obj, const char *where, struct reward_verifier *v, struct smelt_error *err) {
    TRY(json_field_int(obj, "max_tokens", true, 0, 1, INT64_C(1) << 30, &v->max_tokens, where, err));
    TRY(json_field_int(obj, "cache_tokens", true, 0, 0, v->max_tokens, &v->cache_tokens, where, err));
    v->has_truncated_penalty = json_object_get(obj, "truncated_penalty") &&
                               !json_is_null(json_object_get(obj, "truncated_penalty"));
    return json_field_double(obj, "truncated_penalty", false, 0.0, 0.0, 1.0, &v->truncated_penalty, where, err);
}

static int length_to_json(const struct reward_verifier *v, json_t *obj) {
    int bad = reward_json_set(obj, "max_tokens", json_integer(v->max_tokens));
    bad |= reward_json_set(obj, "cache_tokens", json_integer(v->cache_tokens));
    return bad | reward_json_set(obj, "truncated_penalty",
                                 v->has_truncated_penalty ? json_real(v->truncated_penalty) : json_null());
}

static int score_length(struct reward_verifier *v, const struct reward_sample *s, double *score, char *why,
                        size_t why_n) {
    int64_t len = s->n_completion_tokens, safe = v->max_tokens - v->cache_tokens;
    if (len < 0) {
        snprintf(why, why_n, "n_completion_tokens is %lld", (long long)len);
        return -1;
    }
    if (len <= safe) *score = 0.0;
    else if (len <= v->max_tokens) *score = (double)(safe - len) / (double)v->cache_tokens; /* C > 0 here */
    else *score = -1.0;
    bool truncated = s->finish_reason && strcmp(s->finish_reason, ROLLOUT_FINISH_LENGTH) == 0;
    if (v->has_truncated_penalty && truncated) *score = fmin(*score, -v->truncated_penalty);
    return 0;
}

static const char *const LENGTH_KEYS[] = {"type", "name", "weight", "max_tokens", "cache_tokens", "truncated_penalty",
                                          NULL};

const struct reward_verifier_type REWARD_LENGTH_PENALTY = {
    .name = "length_penalty", .keys = LENGTH_KEYS, .parse = parse_length, .to_json = length_to_json,
    .score = score_length, .check_answer = NULL,
};
