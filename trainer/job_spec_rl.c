/* The job spec's "rl" section (GRPO and PPO): its table of fields, the reward spec, the
 * critic's model, the defaults that depend on the job type and the checks that involve
 * several fields. docs/job-spec.md documents it. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <stddef.h>
#include <string.h>

#include "common/common.h"
#include "rewards/rewards.h"

static const char *const PLACEMENT_NAMES[] = {[RL_PLACEMENT_COLOCATED] = "colocated", [RL_PLACEMENT_SPLIT] = "split"};

const char *rl_placement_name(enum rl_placement p) { return PLACEMENT_NAMES[p]; }

static int placement_parse(const char *name, void *value, struct smelt_error *err) {
    for (int i = 0; i < 2; i++)
        if (strcmp(name, PLACEMENT_NAMES[i]) == 0) {
            *(enum rl_placement *)value = (enum rl_placement)i;
            return SMELT_OK;
        }
    return error_set(err, SMELT_EINVAL, "\"%s\" is not a placement (colocated, split)", name);
}

static const char *placement_format(const void *value) { return rl_placement_name(*(const enum rl_placement *)value); }

static const char *const WEIGHT_SYNC_NAMES[] = {[RL_WEIGHT_SYNC_AUTO] = "auto",
                                                 [RL_WEIGHT_SYNC_BROADCAST] = "broadcast",
                                                 [RL_WEIGHT_SYNC_ZMQ] = "zmq"};

const char *rl_weight_sync_name(enum rl_weight_sync w) { return WEIGHT_SYNC_NAMES[w]; }

static int weight_sync_parse(const char *name, void *value, struct smelt_error *err) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, WEIGHT_SYNC_NAMES[i]) == 0) {
            *(enum rl_weight_sync *)value = (enum rl_weight_sync)i;
            return SMELT_OK;
        }
    return error_set(err, SMELT_EINVAL, "\"%s\" is not a weight sync transport (auto, broadcast, zmq)", name);
}

static const char *weight_sync_format(const void *value) {
    return rl_weight_sync_name(*(const enum rl_weight_sync *)value);
}

/* loss_agg: "auto" (-1) or an aggregation. */
static int agg_parse(const char *name, void *value, struct smelt_error *err) {
    if (strcmp(name, "auto") == 0) {
        *(int *)value = -1;
        return SMELT_OK;
    }
    enum rl_loss_agg agg;
    TRY(rl_loss_agg_from_name(name, &agg, err));
    *(int *)value = (int)agg;
    return SMELT_OK;
}

static const char *agg_format(const void *value) {
    int v = *(const int *)value;
    if (v < 0) return "auto";
    enum rl_loss_agg agg = (enum rl_loss_agg)v;
    return rl_loss_agg_to_name(&agg);
}

#define RL_AT(member, T) \
    (offsetof(struct job_spec, rl.member) + 0 * sizeof(_Generic(((struct job_spec *)0)->rl.member, T: 1)))
#define RL_INT(member, d, lo, hi) \
    {.name = #member, .kind = JOB_FIELD_INT, .offset = RL_AT(member, int64_t), .def = d, .min = lo, .max = hi}
#define RL_NUMBER(member, d, lo, hi) \
    {.name = #member, .kind = JOB_FIELD_NUMBER, .offset = RL_AT(member, double), .def = d, .min = lo, .max = hi}
#define RL_BOOL(member, d) \
    {.name = #member, .kind = JOB_FIELD_BOOL, .offset = RL_AT(member, bool), .def = d, .min = 0, .max = 1}
#define RL_NAME(member, T, d, parse, format)                                                                    \
    {.name = #member, .kind = JOB_FIELD_NAME, .offset = RL_AT(member, T), .def_name = d, .from_name = parse, \
     .to_name = format}

/* The order is the order of checking. */
const struct job_hp_field JOB_RL_FIELDS[] = {
    /* a grpo job needs >= 2 (check_grpo: its message names the field as a range error does) */
    RL_INT(num_generations, 8, 1, 256),
    RL_INT(minibatches, 1, 1, 4096),
    RL_INT(ppo_epochs, 1, 1, 100),
    RL_INT(max_iterations, 0, 0, 0x1p40),
    RL_INT(max_new_tokens, 64, 1, 1 << 20),
    {.name = "temperature", .kind = JOB_FIELD_NUMBER, .offset = RL_AT(temperature, double), .def = 1.0, .min = 0.0,
     .max = 100.0, .min_excluded = true},
    RL_INT(top_k, 0, 0, 1 << 30),
    {.name = "top_p", .kind = JOB_FIELD_NUMBER, .offset = RL_AT(top_p, double), .def = 1.0, .min = 0.0, .max = 1.0,
     .min_excluded = true},
    RL_NUMBER(min_p, 0.0, 0.0, 0.999999),
    RL_NAME(loss_type, enum rl_loss_type, "dapo", rl_loss_type_from_name, rl_loss_type_to_name),
    RL_NAME(loss_agg, int, "auto", agg_parse, agg_format),
    /* absent: the loss type's own (rl_policy_config_default) */
    RL_NUMBER(epsilon, 0.2, 0.0, 0.999999),
    RL_NUMBER(epsilon_high, 0.2, 0.0, 100.0),
    RL_NUMBER(dual_clip, 0.0, 0.0, 1000.0),
    RL_NUMBER(beta, 0.0, 0.0, 1000.0),
    RL_NAME(kl_estimator, enum rl_kl_estimator, "k3", rl_kl_estimator_from_name, rl_kl_estimator_to_name),
    RL_NAME(advantage_estimator, enum rl_adv_estimator, "grpo", rl_adv_estimator_from_name,
            rl_adv_estimator_to_name),
    RL_BOOL(scale_rewards, true),
    RL_BOOL(mask_truncated_completions, false),
    RL_BOOL(dynamic_sampling, false),
    RL_NUMBER(tis_cap, 0.0, 0.0, 1e6),
    RL_NAME(tis_level, enum rl_tis_level, "token", rl_tis_level_from_name, rl_tis_level_to_name),
    RL_NAME(tis_mode, enum rl_tis_mode, "truncate", rl_tis_mode_from_name, rl_tis_mode_to_name),
    RL_NAME(placement, enum rl_placement, "colocated", placement_parse, placement_format),
    RL_INT(rollout_workers, 1, 1, 64),
    RL_NAME(weight_sync, enum rl_weight_sync, "auto", weight_sync_parse, weight_sync_format),
    RL_INT(kv_memory_mb, 256, 1, 1 << 20),
    RL_INT(max_staleness, 0, 0, 1),
    RL_BOOL(true_on_policy, false),
    /* PPO only, from here to the end (PPO_FIRST_FIELD): a grpo job refuses any but the default. */
    {.name = "critic_learning_rate", .kind = JOB_FIELD_NUMBER, .offset = RL_AT(critic_learning_rate, double),
     .def = 9e-6, .min = 0.0, .max = 10.0, .min_excluded = true},
    RL_NUMBER(gamma, 1.0, 0.0, 1.0),
    RL_NUMBER(lambda, 0.95, 0.0, 1.0),
    RL_NUMBER(value_clip, 0.2, 0.0, 1e6),
    RL_BOOL(whiten_advantages, true),
    RL_BOOL(kl_in_reward, false), /* a ppo job's default is true (type_defaults) */
    RL_INT(critic_warmup_iterations, 0, 0, 0x1p40),
};
const int JOB_N_RL_FIELDS = (int)(sizeof JOB_RL_FIELDS / sizeof JOB_RL_FIELDS[0]);
#define PPO_FIRST_FIELD "critic_learning_rate"

/* The reward spec: checked by building the stage once, kept as compact JSON. */
static int parse_reward(const json_t *obj, const char *w, struct job_spec *s, struct smelt_error *err) {
    const json_t *reward = json_object_get(obj, "reward");
    if (!reward || json_is_null(reward))
        return error_set_field(err, SMELT_EINVAL, "reward",
                               "%s.reward: missing (an RL job needs a reward: docs/rewards.md)", w);
    char rw[300];
    snprintf(rw, sizeof rw, "%s.reward", w);
    struct reward_stage *stage;
    TRY(error_in_field(err, reward_stage_create(reward, rw, &stage, err), "reward"));
    reward_stage_free(stage);
    char *text = json_dumps(reward, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return error_set(err, SMELT_ENOMEM, "%s.reward: out of memory", w);
    size_t len = strlen(text);
    int rc = len < sizeof s->rl.reward ? SMELT_OK
                                       : error_set_field(err, SMELT_EINVAL, "reward", "%s.reward: longer than %zu bytes",
                                                         w, sizeof s->rl.reward - 1);
    if (!rc) memcpy(s->rl.reward, text, len + 1);
    free(text);
    return rc;
}

/* The clip range a loss type takes where the spec gives none (TRL's epsilon_high is
 * epsilon when only epsilon is given). */
static void default_clip(const json_t *obj, struct job_spec *s) {
    struct rl_policy_config d;
    rl_policy_config_default(s->rl.loss_type, &d);
    bool low = json_object_get(obj, "epsilon") != NULL, high = json_object_get(obj, "epsilon_high") != NULL;
    if (!low) s->rl.epsilon = d.eps_low;
    if (!high) s->rl.epsilon_high = low && s->rl.loss_type != RL_LOSS_CISPO ? s->rl.epsilon : d.eps_high;
}

/* critic_model: a path, or null / absent for none (""). */
static int parse_critic_model(const json_t *obj, const char *w, struct job_spec *s, struct smelt_error *err) {
    const json_t *v = json_object_get(obj, "critic_model");
    s->rl.critic_model[0] = 0;
    if (!v || json_is_null(v)) return SMELT_OK;
    if (!json_is_string(v))
        return error_set_field(err, SMELT_EINVAL, "critic_model",
                               "%s.critic_model: expected a reward model's directory (a string) or null", w);
    const char *path = json_string_value(v);
    size_t len = strlen(path);
    if (len >= sizeof s->rl.critic_model)
        return error_set_field(err, SMELT_EINVAL, "critic_model", "%s.critic_model: longer than %zu bytes", w,
                               sizeof s->rl.critic_model - 1);
    memcpy(s->rl.critic_model, path, len + 1);
    return SMELT_OK;
}

/* A ppo job's own defaults for fields it shares with grpo, where the spec gives none:
 * one sample per prompt (PPO has no groups), GAE, the KL to the reference in the token
 * rewards (OpenRLHF's and TRL PPOTrainer's place for it) and, there, k1. */
static void type_defaults(const json_t *obj, struct job_spec *s) {
    if (s->type != JOB_PPO) return;
    if (!json_object_get(obj, "num_generations")) s->rl.num_generations = 1;
    if (!json_object_get(obj, "advantage_estimator")) s->rl.advantage_estimator = RL_ADV_GAE;
    if (!json_object_get(obj, "kl_in_reward")) s->rl.kl_in_reward = true;
    if (!json_object_get(obj, "kl_estimator") && s->rl.kl_in_reward) s->rl.kl_estimator = RL_KL_K1;
}

void job_rl_loss_config(const struct job_spec *s, struct rl_policy_config *out) {
    rl_policy_config_default(s->rl.loss_type, out);
    if (s->rl.loss_agg >= 0) out->agg = (enum rl_loss_agg)s->rl.loss_agg;
    out->eps_low = s->rl.epsilon;
    out->eps_high = s->rl.epsilon_high;
    out->dual_clip = s->rl.dual_clip;
    /* PPO's KL in the reward is not also a loss term. */
    out->beta = s->type == JOB_PPO && s->rl.kl_in_reward ? 0 : s->rl.beta;
    out->kl_estimator = s->rl.kl_estimator;
    out->tis_cap = s->rl.tis_cap;
    out->tis_level = s->rl.tis_level;
    out->tis_mode = s->rl.tis_mode;
    out->max_completion_len = s->rl.max_new_tokens;
}

static bool at_default(const struct job_hp_field *f, const struct job_spec *s) {
    const void *v = (const char *)s + f->offset;
    switch (f->kind) {
    case JOB_FIELD_INT: return *(const int64_t *)v == (int64_t)f->def;
    case JOB_FIELD_NUMBER: return *(const double *)v == f->def;
    case JOB_FIELD_BOOL: return *(const bool *)v == (f->def != 0);
    case JOB_FIELD_NAME: break;
    }
    return false;
}

/* A grpo job: groups of at least 2, no critic, so none of PPO's fields. */
static int check_grpo(const struct job_spec *s, const char *w, struct smelt_error *err) {
    if (s->rl.num_generations < 2)
        return error_set_field(err, SMELT_EINVAL, "num_generations",
                               "%s: field 'num_generations' is %lld: a grpo job's group needs at least 2 samples "
                               "per prompt", w, (long long)s->rl.num_generations);
    if (s->rl.advantage_estimator == RL_ADV_GAE)
        return error_set_field(err, SMELT_EINVAL, "advantage_estimator",
                               "%s.advantage_estimator: \"gae\" needs a critic (PPO), which a grpo job does not have; "
                               "use \"type\": \"ppo\"", w);
    const struct job_hp_field *end = JOB_RL_FIELDS + JOB_N_RL_FIELDS;
    for (const struct job_hp_field *f = job_field_in(JOB_RL_FIELDS, JOB_N_RL_FIELDS, PPO_FIRST_FIELD); f < end; f++)
        if (!at_default(f, s))
            return error_set_field(err, SMELT_EINVAL, f->name,
                                   "%s.%s: a ppo job's field (its critic and advantages); a grpo job has no critic",
                                   w, f->name);
    if (s->rl.critic_model[0])
        return error_set_field(err, SMELT_EINVAL, "critic_model",
                               "%s.critic_model: a ppo job's field; a grpo job has no critic", w);
    return SMELT_OK;
}

/* A ppo job: its advantages come from the critic (GAE) and it has no groups to filter. */
static int check_ppo(const struct job_spec *s, const char *w, struct smelt_error *err) {
    if (s->rl.advantage_estimator != RL_ADV_GAE)
        return error_set_field(err, SMELT_EINVAL, "advantage_estimator",
                               "%s.advantage_estimator: a ppo job's advantages come from its critic (\"gae\"); "
                               "\"%s\" is a grpo job's (group-relative, no critic)", w,
                               rl_adv_estimator_to_name(&s->rl.advantage_estimator));
    if (s->rl.dynamic_sampling)
        return error_set_field(err, SMELT_EINVAL, "dynamic_sampling",
                               "%s.dynamic_sampling: drops groups whose rewards are all equal; a ppo job has no "
                               "groups (its baseline is the critic)", w);
    return SMELT_OK;
}

/* What one field cannot say alone. */
static int check_rl(struct job_spec *s, const char *w, struct smelt_error *err) {
    if (s->rl.dual_clip != 0 && s->rl.dual_clip <= 1)
        return error_set_field(err, SMELT_EINVAL, "dual_clip", "%s.dual_clip: must be 0 (off) or above 1, got %g", w,
                               s->rl.dual_clip);
    TRY(s->type == JOB_PPO ? check_ppo(s, w, err) : check_grpo(s, w, err));
    if (s->rl.placement == RL_PLACEMENT_COLOCATED && s->rl.rollout_workers != 1)
        return error_set_field(err, SMELT_EINVAL, "rollout_workers",
                               "%s.rollout_workers: %lld workers need \"placement\": \"split\"; colocated runs one "
                               "engine in the trainer's process", w, (long long)s->rl.rollout_workers);
    if (s->rl.placement == RL_PLACEMENT_COLOCATED && s->rl.weight_sync != RL_WEIGHT_SYNC_AUTO)
        return error_set_field(err, SMELT_EINVAL, "weight_sync",
                               "%s.weight_sync: \"%s\" needs \"placement\": \"split\"; colocated, the trainer and "
                               "the engine share the weights and nothing moves", w,
                               rl_weight_sync_name(s->rl.weight_sync));
    if (s->rl.max_staleness > 0 && s->rl.placement != RL_PLACEMENT_SPLIT)
        return error_set_field(err, SMELT_EINVAL, "max_staleness",
                               "%s.max_staleness: generating the next batch during the update needs \"placement\": "
                               "\"split\" (the colocated engine shares the weights the update changes)", w);
    if (s->rl.tis_cap != 0 && s->rl.tis_cap < 1)
        return error_set_field(err, SMELT_EINVAL, "tis_cap", "%s.tis_cap: must be 0 (off) or at least 1, got %g", w,
                               s->rl.tis_cap);
    return SMELT_OK;
}

int job_parse_rl(const json_t *obj, const char *where, struct job_spec *s, struct smelt_error *err) {
    static const char *const extra[] = {"reward", "critic_model", NULL};
    char w[256];
    snprintf(w, sizeof w, "%s: rl", where);
    if (!job_type_is_rl(s->type)) {
        if (json_object_size(obj) == 0) return SMELT_OK;
        return error_set(err, SMELT_EINVAL, "%s: only a grpo job or a ppo job has an rl section", w);
    }
    TRY(job_parse_fields(obj, JOB_RL_FIELDS, JOB_N_RL_FIELDS, extra, w, s, err));
    TRY(parse_reward(obj, w, s, err));
    TRY(parse_critic_model(obj, w, s, err));
    default_clip(obj, s);
    type_defaults(obj, s);
    TRY(check_rl(s, w, err));
    struct rl_policy_config c;
    job_rl_loss_config(s, &c);
    int rc = rl_policy_config_check(&c, err);
    if (rc) error_wrap(err, rc, "%s", w);
    return rc;
}

int job_rl_to_json(const struct job_spec *s, json_t **out, struct smelt_error *err) {
    json_t *rl = json_object();
    int bad = !rl;
    for (int i = 0; !bad && i < JOB_N_RL_FIELDS; i++) {
        json_t *v = job_field_json(&JOB_RL_FIELDS[i], s);
        bad |= !v || json_object_set_new(rl, JOB_RL_FIELDS[i].name, v);
    }
    json_error_t jerr;
    json_t *reward = bad ? NULL : json_loads(s->rl.reward, 0, &jerr);
    bad |= !reward || json_object_set_new(rl, "reward", reward);
    bad |= json_object_set_new(rl, "critic_model",
                               s->rl.critic_model[0] ? json_string(s->rl.critic_model) : json_null());
    if (bad) {
        json_decref(rl);
        return error_set(err, SMELT_ENOMEM, "job_spec_to_json: out of memory");
    }
    *out = rl;
    return SMELT_OK;
}
