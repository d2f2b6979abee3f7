/* Part of trainer/'s public header (trainer.h includes it: the spec holds these enums):
 * the RL losses (GRPO and its variants, GSPO, CISPO, PPO's clipped value loss) and the
 * advantage estimators (group-relative, RLOO, REINFORCE++, GAE), as pure functions over
 * flat arrays.
 *
 * Every objective here is a token-logprob objective (docs/architecture.md §4): the
 * policy loss depends on the policy only through the logprob of each trained token, so
 * rl_policy_loss returns dL/dlogprob per token (the coefficient), which the trainer
 * writes into dlogprobs and backpropagates. Nothing else scales it: the aggregation's
 * denominators (struct rl_norm) are already in it, so the optimizer's gradient scale is 1.
 *
 * Layout: a micro-batch is n_seq sequences laid end to end; sequence i owns tokens
 * [start[i], start[i+1]) of every per-token array (start[0] == 0, non-decreasing,
 * n_tokens = start[n_seq]). mask is 1 for a trained (completion) token and 0 for any
 * other (prompt, padding, tool output); a value at an untrained token is never read.
 * Precision: what the model produces (logprobs, values) is float; what is computed from
 * it (rewards, advantages, returns, coefficients, losses) is double, in and out.
 *
 * Log-ratios (policy/old for the importance ratio, reference/policy for k3) are clamped
 * to [-RL_LOG_RATIO_CLAMP, RL_LOG_RATIO_CLAMP] as veRL and OpenRLHF do (TRL does not; the
 * results agree inside the range), with a zero derivative outside, so every result is
 * finite for finite inputs. docs/algorithms.md (RL) gives every formula and the TRL / OpenRLHF
 * / veRL setting each corresponds to. Ownership: no function allocates or keeps a
 * pointer; the caller owns every array. */
#ifndef SMELT_TRAINER_RL_LOSS_H
#define SMELT_TRAINER_RL_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

#define RL_LOG_RATIO_CLAMP 20.0

/* ---- names (the job spec's NAME fields: from_name writes the enum through value) ---- */

/* TRL GRPOConfig.loss_type names; "gspo" is TRL's loss_type "grpo" with
 * importance_sampling_level "sequence". */
enum rl_loss_type { RL_LOSS_GRPO, RL_LOSS_DR_GRPO, RL_LOSS_DAPO, RL_LOSS_BNPO, RL_LOSS_GSPO, RL_LOSS_CISPO };
/* "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm" (veRL's loss_agg_mode
 * with '_' for '-'), and "sum" (every trained token weighs 1, no denominator: the Tinker
 * API's losses, which the client normalises itself). */
enum rl_loss_agg { RL_AGG_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, RL_AGG_SUM };
/* Schulman's estimators of KL(policy || reference) from a token sampled by the policy,
 * with d = ref_logp - logp: k1 = -d, k2 = d^2/2, k3 = e^d - d - 1 ("k1", "k2", "k3"). */
enum rl_kl_estimator { RL_KL_K1, RL_KL_K2, RL_KL_K3 };
/* "grpo" (group-relative; mean-only with scale_rewards off: Dr. GRPO), "rloo",
 * "reinforce_pp" (REINFORCE++), "gae" (PPO with a critic). */
enum rl_adv_estimator { RL_ADV_GRPO, RL_ADV_RLOO, RL_ADV_REINFORCE_PP, RL_ADV_GAE };
/* Truncated importance sampling against the rollout engine's logprobs: one weight per
 * token ("token") or one per sequence ("sequence"); above the cap the weight is cut to
 * the cap ("truncate") or to 0 ("mask"). */
enum rl_tis_level { RL_TIS_TOKEN, RL_TIS_SEQUENCE };
enum rl_tis_mode { RL_TIS_TRUNCATE, RL_TIS_MASK };

/* SMELT_EINVAL naming the value and every accepted name; NULL name refused the same way. */
int rl_loss_type_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_loss_type_to_name(const void *value); /* "unknown" outside the enum */
int rl_loss_agg_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_loss_agg_to_name(const void *value);
int rl_kl_estimator_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_kl_estimator_to_name(const void *value);
int rl_adv_estimator_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_adv_estimator_to_name(const void *value);
int rl_tis_level_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_tis_level_to_name(const void *value);
int rl_tis_mode_from_name(const char *name, void *value, struct smelt_error *err);
const char *rl_tis_mode_to_name(const void *value);

/* One token's KL estimate to the reference, and (d_logp non-NULL) its derivative in
 * logp; k3's exponent ref_logp - logp is clamped to the log-ratio range. */
double rl_kl_estimate(enum rl_kl_estimator est, double logp, double ref_logp, double *d_logp);

/* ---- the policy loss ---- */

struct rl_policy_config {
    enum rl_loss_type type;
    enum rl_loss_agg agg;
    /* Clip range [1 - eps_low, 1 + eps_high] of the ratio (TRL epsilon / epsilon_high,
     * veRL clip_ratio_low / clip_ratio_high, OpenRLHF eps_clip_low_high). eps_low in
     * [0, 1), eps_high >= 0. CISPO uses only eps_high: its weight is min(r, 1 + eps_high)
     * (TRL's cispo epsilon_high is that cap itself: TRL 5.0 = eps_high 4.0 here). */
    double eps_low, eps_high;
    /* Dual clip: 0 = off, else c > 1: for A < 0 the token loss is at most -c * A (veRL
     * clip_ratio_c, OpenRLHF dual_clip, TRL delta). Ignored by CISPO. */
    double dual_clip;
    double beta; /* >= 0: weight of the KL to the reference, added per token; 0 = none */
    enum rl_kl_estimator kl_estimator;
    double tis_cap; /* 0 = no TIS, else >= 1 (TRL vllm_importance_sampling_clip_max) */
    enum rl_tis_level tis_level;
    enum rl_tis_mode tis_mode;
    /* >= 1 with RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM: Dr. GRPO's constant (TRL
     * max_completion_length); ignored by the other aggregations. */
    int64_t max_completion_len;
};

/* The aggregation each loss type implies (grpo, gspo: seq_mean_token_mean; dr_grpo:
 * seq_mean_token_sum_norm; dapo, bnpo, cispo: token_mean). */
enum rl_loss_agg rl_loss_type_default_agg(enum rl_loss_type type);

/* Over what the caller counts struct rl_norm: the minibatch of one optimizer step, or
 * (dapo, cispo: TRL's num_items_in_batch) the whole generation batch. */
enum rl_norm_scope { RL_NORM_MINIBATCH, RL_NORM_GENERATION_BATCH };
enum rl_norm_scope rl_loss_type_norm_scope(enum rl_loss_type type);

/* A config with type's defaults: its aggregation; eps_low = eps_high = 0.2 (TRL's
 * epsilon, epsilon_high = epsilon) except gspo 3e-4 / 4e-4 (the GSPO paper) and cispo
 * eps_high 4.0 (a cap of 5, ScaleRL / TRL's recommendation); no dual clip; beta 0; k3;
 * no TIS (token, truncate when turned on); max_completion_len 0 (set it for
 * seq_mean_token_sum_norm). */
void rl_policy_config_default(enum rl_loss_type type, struct rl_policy_config *out);

/* SMELT_EINVAL naming the field ("loss_type", "loss_agg", "eps_low", "eps_high",
 * "dual_clip", "beta", "kl_estimator", "tis_cap", "tis_level", "tis_mode",
 * "max_completion_len") for a value out of range. */
int rl_policy_config_check(const struct rl_policy_config *c, struct smelt_error *err);

/* One micro-batch (layout above). logp: the policy being trained; old_logp: the policy
 * that the ratios are taken against (the trainer's recomputation at generation time);
 * ref_logp: the reference (NULL when beta == 0); rollout_logp: the rollout engine's (NULL
 * when tis_cap == 0); adv: one advantage per token. */
struct rl_seqs {
    int n_seq;
    const int64_t *start;  /* [n_seq + 1] */
    const float *logp, *old_logp, *ref_logp, *rollout_logp; /* [n_tokens] */
    const float *mask;     /* [n_tokens], 0 or 1 */
    const double *adv;     /* [n_tokens] */
};

/* The aggregation's denominators over everything one optimizer step's loss averages
 * (rl_loss_type_norm_scope says what), NOT one micro-batch: tokens = trained tokens,
 * seqs = sequences with at least one trained token. With them, the losses and
 * coefficients of the micro-batches add up to the loss and gradient of the whole, as if
 * it were one call. */
struct rl_norm {
    double tokens, seqs;
};

/* Adds one micro-batch's counts to *norm (start from {0, 0}); the same counts serve
 * every aggregation. Checks the layout and the mask (SMELT_EINVAL). */
int rl_norm_accumulate(struct rl_norm *norm, int n_seq, const int64_t *start, const float *mask,
                       struct smelt_error *err);

/* Checks a layout alone: n_seq >= 0, start non-NULL with start[0] == 0 and
 * non-decreasing, mask 0 or 1 at every token (NULL only when there is none). */
int rl_layout_check(int n_seq, const int64_t *start, const float *mask, struct smelt_error *err);

/* Sums over the trained tokens of one call; merge micro-batches with
 * rl_policy_stats_merge. To report: loss and pg_loss as they are (already aggregated);
 * every *_sum and count divided by n_tokens (the KL to the reference, TRL "kl"; the
 * ratio's mean; veRL/OpenRLHF "ppo_kl" = mean of old_logp - logp; the mean TIS weight;
 * clip and TIS fractions); ratio_min / ratio_max as they are (0 when n_tokens is 0). For
 * GSPO the ratio and the clip counts are the sequence's, counted once per token. */
struct rl_policy_stats {
    double loss;           /* this call's part of the step loss: policy + beta * KL */
    double pg_loss;        /* its policy-gradient part */
    double kl_sum;         /* KL estimate to the reference (0 when beta == 0) */
    double ppo_kl_sum;     /* old_logp - logp */
    double ratio_sum, ratio_min, ratio_max;
    double tis_weight_sum; /* the weight applied (1 without TIS) */
    int64_t n_tokens, n_seqs;
    /* clipped: r < 1 - eps_low with A < 0 (low), r > 1 + eps_high with A > 0 (high; for
     * CISPO the weight's cap), dual clip in force (A < 0, -r*A above -c*A) */
    int64_t clip_low, clip_high, clip_dual;
    int64_t tis_truncated, tis_masked; /* tokens whose weight was cut to the cap / to 0 */
};
void rl_policy_stats_merge(struct rl_policy_stats *acc, const struct rl_policy_stats *add);

/* The policy loss of one micro-batch and coef[t] = dL/dlogp[t] for every token (0 where
 * mask is 0). Per trained token, with r = exp(logp - old_logp) (GSPO: the sequence's
 * exp(mean over its trained tokens of logp - old_logp), shared by its tokens, its
 * gradient reaching each token through the mean), w the TIS weight (no gradient) and A
 * the token's advantage:
 *   clipped surrogate  f = max(-r*A, -clip(r, 1-eps_low, 1+eps_high)*A), and with the
 *                      dual clip f = min(f, -c*A) for A < 0; l = w * f;
 *   CISPO              l = -w * sg(min(r, 1+eps_high)) * A * logp;
 *   plus beta * KL(logp, ref_logp) per token;
 * then L = sum over trained tokens of l * (1/norm.tokens for token_mean;
 * 1/(n_i*norm.seqs) for seq_mean_token_mean, n_i the sequence's trained tokens;
 * 1/(max_completion_len*norm.seqs) for seq_mean_token_sum_norm; 1 for sum, which
 * ignores norm). TIS weight:
 * exp(old_logp - rollout_logp) per token, or exp(sum over the sequence's trained tokens)
 * at sequence level; above tis_cap it becomes tis_cap (truncate) or 0 (mask).
 * st may be NULL. SMELT_EINVAL for a bad config, layout or norm (norm below this
 * micro-batch's own counts), a NULL array that the config needs, or a non-finite
 * logprob or advantage at a trained token (the message names the array, the index and
 * the sequence). */
int rl_policy_loss(const struct rl_policy_config *c, const struct rl_seqs *s, struct rl_norm norm, double *coef,
                   struct rl_policy_stats *st, struct smelt_error *err);

/* ---- per-token losses without a clipped surrogate (the Tinker API's, docs/tinker.md) ----
 * Each is a sum over the n tokens of one datum (no mean, no mask: a token that should not
 * count gets weight or advantage 0). logp: the model's logprob of each target token;
 * sampling_logp (q): the sampler's; ratio r = exp(logp - q), NOT clamped (Tinker does not
 * clamp; an overflow is refused as non-finite). Per token t:
 *   RL_TOKEN_CROSS_ENTROPY        l = -w_t * logp_t
 *   RL_TOKEN_IMPORTANCE_SAMPLING  l = -r_t * A_t
 *   RL_TOKEN_CISPO                l = -sg(clip(r_t, clip_low, clip_high)) * A_t * logp_t
 *   RL_TOKEN_DRO                  l = -(A_t * logp_t - beta/2 * (logp_t - q_t)^2)
 * (PPO's clipped surrogate is rl_policy_loss with RL_AGG_SUM.) */
enum rl_token_loss { RL_TOKEN_CROSS_ENTROPY, RL_TOKEN_IMPORTANCE_SAMPLING, RL_TOKEN_CISPO, RL_TOKEN_DRO };

struct rl_token_inputs {
    int64_t n;
    const float *logp;          /* [n] */
    const float *weights;       /* [n]: cross_entropy only */
    const float *sampling_logp; /* [n]: the others */
    const float *adv;           /* [n]: the others */
    double clip_low, clip_high; /* cispo: 0 <= clip_low <= clip_high */
    double beta;                /* dro: >= 0 */
};

/* Fills coef[t] = dL/dlogp_t and (elementwise non-NULL) elementwise[t] = l_t, and *loss
 * = the sum. SMELT_EINVAL for a NULL array the loss needs, a bad clip range or beta
 * (field "clip_low_threshold", "clip_high_threshold", "beta"), or a non-finite input
 * or result (the message names the array and the index). */
int rl_token_loss(enum rl_token_loss type, const struct rl_token_inputs *in, double *coef, double *elementwise,
                  double *loss, struct smelt_error *err);

/* ---- PPO's value loss ---- */

struct rl_value_config {
    double clip_range; /* >= 0; 0 = no clipping (OpenRLHF value_clip None), veRL cliprange_value */
    enum rl_loss_agg agg;
    int64_t max_completion_len; /* as in rl_policy_config */
};

struct rl_value_batch {
    int n_seq;
    const int64_t *start;            /* [n_seq + 1] */
    const float *values, *old_values; /* [n_tokens]: the critic now and at generation time */
    const double *returns;           /* [n_tokens] */
    const float *mask;               /* [n_tokens] */
};

/* Sums as in rl_policy_stats: loss as it is; clipped and value_sum / n_tokens (veRL
 * vf_clipfrac, vpred_mean). */
struct rl_value_stats {
    double loss, value_sum;
    int64_t n_tokens, clipped;
};

/* l = 0.5 * max((v - R)^2, (clip(v, old - eps, old + eps) - R)^2) per trained token,
 * aggregated like the policy loss; dvalue[t] = dL/dv[t] (0 where mask is 0). clipped
 * counts tokens where the clipped term is the larger. st may be NULL. */
int rl_value_loss(const struct rl_value_config *c, const struct rl_value_batch *b, struct rl_norm norm,
                  double *dvalue, struct rl_value_stats *st, struct smelt_error *err);

/* ---- advantages, rewards, returns (rl_advantage.c) ---- */

/* GRPO: out[g*k + j] = (r - mean_g) / (std_g + eps) with std_g the unbiased (n-1)
 * standard deviation of group g (TRL, veRL and OpenRLHF all use torch's unbiased std;
 * eps: TRL 1e-4, veRL 1e-6, OpenRLHF 1e-9), or r - mean_g when !scale_by_std (Dr. GRPO;
 * eps unused). rewards and out: [n_groups * group_size], group by group; may alias.
 * group_size >= 2. */
int rl_group_advantages(const double *rewards, int64_t n_groups, int64_t group_size, bool scale_by_std,
                        double eps, double *out, struct smelt_error *err);

/* RLOO: out = r - (mean of the other group_size - 1 rewards of its group). */
int rl_rloo_advantages(const double *rewards, int64_t n_groups, int64_t group_size, double *out,
                       struct smelt_error *err);

/* True when every reward of the group equals the first (exactly; a NaN never equals):
 * its group-relative advantages are all 0 (DAPO's dynamic sampling drops such groups). */
bool rl_group_is_degenerate(const double *rewards, int64_t group_size);

/* One sequence's token rewards: out[t] = -beta * KL_t(old_logp, ref_logp) at each trained
 * token, plus `reward` at the last trained token, 0 at untrained ones. PPO's KL in the
 * reward is k1 (veRL apply_kl_penalty, OpenRLHF compute_reward); REINFORCE++ uses k1 or
 * k2. ref_logp may be NULL when beta == 0. */
int rl_token_rewards(const float *old_logp, const float *ref_logp, const float *mask, int64_t n, double reward,
                     double beta, enum rl_kl_estimator est, double *out, struct smelt_error *err);

/* GAE over one sequence's trained tokens t_1 < ... < t_k (untrained tokens are skipped,
 * as veRL skips observation tokens): delta_j = r(t_j) + gamma * V(t_{j+1}) - V(t_j), with
 * V after the last trained token 0; adv(t_j) = sum_{l >= j} (gamma*lambda)^(l-j) delta_l;
 * returns = adv + V. adv and returns are 0 at untrained tokens. gamma, lambda in [0, 1].
 * With values 0 and lambda 1, adv = returns = the discounted reward-to-go. */
int rl_gae(const float *values, const double *token_rewards, const float *mask, int64_t n, double gamma,
           double lambda, double *adv, double *returns, struct smelt_error *err);

/* In place over the trained elements (others untouched): x = (x - mean) / sqrt(var +
 * 1e-8) with the mean and unbiased variance over the trained elements (veRL
 * masked_whiten; OpenRLHF divides by n, not n - 1); shift_mean false adds the mean back.
 * Needs at least 2 trained elements. */
int rl_whiten(double *x, const float *mask, int64_t n, bool shift_mean, struct smelt_error *err);

/* REINFORCE++ over a whole generation batch (layout above): per sequence, token rewards
 * (rl_token_rewards with rewards[i]) and their discounted reward-to-go over its trained
 * tokens (returns), then the returns whitened over every trained token of the batch
 * (adv; 0 at untrained tokens). REINFORCE++-baseline: pass group-centred rewards
 * (rl_group_advantages without std). ref_logp may be NULL when beta == 0. */
int rl_reinforce_pp_advantages(int n_seq, const int64_t *start, const float *mask, const float *old_logp,
                               const float *ref_logp, const double *rewards, double beta, enum rl_kl_estimator est,
                               double gamma, double *adv, double *returns, struct smelt_error *err);

/* ---- rollout / trainer mismatch ---- */

/* a: the trainer's logprobs (old_logp), b: the rollout engine's, over the trained
 * tokens: mean and max |a - b|; kl_k1 = mean(b - a) and kl_k3 = mean(e^(a-b) - (a-b) - 1),
 * both estimates of KL(rollout || trainer) from the rollout's samples, a - b clamped as above (veRL's
 * rollout_corr "kl" and "k3_kl"); all exactly 0 when a and b are equal. Merge calls by
 * weighting the means with n_tokens. */
struct rl_mismatch {
    double mean_abs, max_abs, kl_k1, kl_k3;
    int64_t n_tokens;
};
int rl_logprob_mismatch(const float *a, const float *b, const float *mask, int64_t n, struct rl_mismatch *out,
                        struct smelt_error *err);

#endif
