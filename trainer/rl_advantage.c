/* The advantage estimators and reward shaping of rl_loss.h, in double
 * (docs/algorithms.md (RL)): group-relative (GRPO, Dr. GRPO), RLOO, token rewards with the KL
 * in them, GAE, whitening and REINFORCE++. Each works on what it is given and checks it
 * first; nothing is allocated (REINFORCE++ builds its token rewards in adv). */
#include "trainer/rl_loss.h"

#include <math.h>

/* veRL masked_whiten's variance floor. */
#define WHITEN_EPS 1e-8

/* ---- group-relative ---- */

static int group_check(const char *fn, const double *rewards, int64_t n_groups, int64_t group_size,
                       const double *out, struct smelt_error *err) {
    if (n_groups < 0)
        return error_set(err, SMELT_EINVAL, "%s: n_groups is %lld: must be >= 0", fn, (long long)n_groups);
    if (group_size < 2)
        return error_set(err, SMELT_EINVAL, "%s: group_size is %lld: a group-relative advantage needs >= 2 samples",
                         fn, (long long)group_size);
    if (n_groups > 0 && (!rewards || !out))
        return error_set(err, SMELT_EINVAL, "%s: %s is NULL", fn, !rewards ? "rewards" : "out");
    for (int64_t i = 0; i < n_groups * group_size; i++)
        if (!isfinite(rewards[i]))
            return error_set(err, SMELT_EINVAL, "%s: rewards[%lld] (group %lld) is %g: rewards must be finite", fn,
                             (long long)i, (long long)(i / group_size), rewards[i]);
    return SMELT_OK;
}

static double mean_of(const double *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s / (double)n;
}

int rl_group_advantages(const double *rewards, int64_t n_groups, int64_t group_size, bool scale_by_std,
                        double eps, double *out, struct smelt_error *err) {
    TRY(group_check("rl_group_advantages", rewards, n_groups, group_size, out, err));
    if (scale_by_std && (!(eps > 0.0) || !isfinite(eps)))
        return error_set(err, SMELT_EINVAL, "rl_group_advantages: eps is %g: must be > 0 and finite (a group of "
                         "equal rewards has std 0)", eps);
    for (int64_t g = 0; g < n_groups; g++) {
        const double *r = rewards + g * group_size;
        double *o = out + g * group_size;
        double mean = mean_of(r, group_size), ss = 0.0;
        for (int64_t j = 0; j < group_size; j++) ss += (r[j] - mean) * (r[j] - mean);
        double scale = scale_by_std ? 1.0 / (sqrt(ss / (double)(group_size - 1)) + eps) : 1.0;
        for (int64_t j = 0; j < group_size; j++) o[j] = (r[j] - mean) * scale;
    }
    return SMELT_OK;
}

int rl_rloo_advantages(const double *rewards, int64_t n_groups, int64_t group_size, double *out,
                       struct smelt_error *err) {
    TRY(group_check("rl_rloo_advantages", rewards, n_groups, group_size, out, err));
    for (int64_t g = 0; g < n_groups; g++) {
        const double *r = rewards + g * group_size;
        double *o = out + g * group_size;
        double sum = mean_of(r, group_size) * (double)group_size;
        for (int64_t j = 0; j < group_size; j++) o[j] = r[j] - (sum - r[j]) / (double)(group_size - 1);
    }
    return SMELT_OK;
}

bool rl_group_is_degenerate(const double *rewards, int64_t group_size) {
    for (int64_t j = 1; j < group_size; j++)
        if (!(rewards[j] == rewards[0])) return false;
    return true;
}

/* ---- token rewards, GAE, whitening ---- */

static int finite_trained(const char *fn, const char *name, const float *x, const float *mask, int64_t n,
                          struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (mask[t] != 0.0f && !isfinite(x[t]))
            return error_set(err, SMELT_EINVAL, "%s: %s[%lld] is %g: must be finite at a trained token", fn, name,
                             (long long)t, (double)x[t]);
    return SMELT_OK;
}

static int finite_trained_f64(const char *fn, const char *name, const double *x, const float *mask, int64_t n,
                              struct smelt_error *err) {
    for (int64_t t = 0; t < n; t++)
        if (mask[t] != 0.0f && !isfinite(x[t]))
            return error_set(err, SMELT_EINVAL, "%s: %s[%lld] is %g: must be finite at a trained token", fn, name,
                             (long long)t, x[t]);
    return SMELT_OK;
}

int rl_token_rewards(const float *old_logp, const float *ref_logp, const float *mask, int64_t n, double reward,
                     double beta, enum rl_kl_estimator est, double *out, struct smelt_error *err) {
    static const char fn[] = "rl_token_rewards";
    if (n < 0) return error_set(err, SMELT_EINVAL, "%s: n is %lld: must be >= 0", fn, (long long)n);
    if (!(beta >= 0.0) || !isfinite(beta))
        return error_set(err, SMELT_EINVAL, "%s: beta is %g: must be >= 0 and finite", fn, beta);
    if (!isfinite(reward)) return error_set(err, SMELT_EINVAL, "%s: the reward is %g: must be finite", fn, reward);
    if ((int)est < RL_KL_K1 || (int)est > RL_KL_K3)
        return error_set(err, SMELT_EINVAL, "%s: unknown KL estimator %d", fn, (int)est);
    if (n > 0 && (!mask || !out || (beta > 0.0 && (!old_logp || !ref_logp))))
        return error_set(err, SMELT_EINVAL, "%s: %s is NULL", fn,
                         !mask ? "mask" : !out ? "out" : !old_logp ? "old_logp (beta > 0)" : "ref_logp (beta > 0)");
    if (beta > 0.0) {
        TRY(finite_trained(fn, "old_logp", old_logp, mask, n, err));
        TRY(finite_trained(fn, "ref_logp", ref_logp, mask, n, err));
    }
    int64_t last = -1;
    for (int64_t t = 0; t < n; t++) {
        out[t] = 0.0;
        if (mask[t] == 0.0f) continue;
        last = t;
        if (beta > 0.0) out[t] = -beta * rl_kl_estimate(est, old_logp[t], ref_logp[t], NULL);
    }
    if (last >= 0) out[last] += reward;
    return SMELT_OK;
}

/* GAE backwards over the trained tokens; values NULL means 0 (then, with lambda 1, it
 * is the discounted reward-to-go). token_rewards[t] is read before adv[t] and
 * returns[t] are written, so token_rewards may be adv or returns. */
static void gae_core(const float *values, const double *token_rewards, const float *mask, int64_t n, double gamma,
                     double lambda, double *adv, double *returns) {
    double next_value = 0.0, last = 0.0;
    for (int64_t t = n - 1; t >= 0; t--) {
        if (mask[t] == 0.0f) {
            adv[t] = returns[t] = 0.0;
            continue;
        }
        double v = values ? (double)values[t] : 0.0;
        double delta = token_rewards[t] + gamma * next_value - v;
        last = delta + gamma * lambda * last;
        adv[t] = last;
        returns[t] = last + v;
        next_value = v;
    }
}

static int unit_interval(const char *fn, const char *name, double x, struct smelt_error *err) {
    if (x >= 0.0 && x <= 1.0) return SMELT_OK;
    return error_set(err, SMELT_EINVAL, "%s: %s is %g: must be in [0, 1]", fn, name, x);
}

int rl_gae(const float *values, const double *token_rewards, const float *mask, int64_t n, double gamma,
           double lambda, double *adv, double *returns, struct smelt_error *err) {
    static const char fn[] = "rl_gae";
    if (n < 0) return error_set(err, SMELT_EINVAL, "%s: n is %lld: must be >= 0", fn, (long long)n);
    TRY(unit_interval(fn, "gamma", gamma, err));
    TRY(unit_interval(fn, "lambda", lambda, err));
    if (n > 0 && (!values || !token_rewards || !mask || !adv || !returns))
        return error_set(err, SMELT_EINVAL, "%s: %s is NULL", fn,
                         !values          ? "values"
                         : !token_rewards ? "token_rewards"
                         : !mask          ? "mask"
                         : !adv           ? "adv"
                                          : "returns");
    TRY(finite_trained(fn, "values", values, mask, n, err));
    TRY(finite_trained_f64(fn, "token_rewards", token_rewards, mask, n, err));
    gae_core(values, token_rewards, mask, n, gamma, lambda, adv, returns);
    return SMELT_OK;
}

int rl_whiten(double *x, const float *mask, int64_t n, bool shift_mean, struct smelt_error *err) {
    static const char fn[] = "rl_whiten";
    if (n < 0) return error_set(err, SMELT_EINVAL, "%s: n is %lld: must be >= 0", fn, (long long)n);
    if (n > 0 && (!x || !mask)) return error_set(err, SMELT_EINVAL, "%s: %s is NULL", fn, !x ? "x" : "mask");
    TRY(finite_trained_f64(fn, "x", x, mask, n, err));
    double sum = 0.0, count = 0.0;
    for (int64_t t = 0; t < n; t++)
        if (mask[t] != 0.0f) sum += x[t], count += 1.0;
    if (count < 2.0)
        return error_set(err, SMELT_EINVAL, "%s: %g trained elements: the unbiased variance needs at least 2", fn,
                         count);
    double mean = sum / count, ss = 0.0;
    for (int64_t t = 0; t < n; t++)
        if (mask[t] != 0.0f) ss += (x[t] - mean) * (x[t] - mean);
    double scale = 1.0 / sqrt(ss / (count - 1.0) + WHITEN_EPS);
    for (int64_t t = 0; t < n; t++)
        if (mask[t] != 0.0f) x[t] = (x[t] - mean) * scale + (shift_mean ? 0.0 : mean);
    return SMELT_OK;
}

/* ---- REINFORCE++ ---- */

int rl_reinforce_pp_advantages(int n_seq, const int64_t *start, const float *mask, const float *old_logp,
                               const float *ref_logp, const double *rewards, double beta, enum rl_kl_estimator est,
                               double gamma, double *adv, double *returns, struct smelt_error *err) {
    static const char fn[] = "rl_reinforce_pp_advantages";
    TRY(error_wrap(err, rl_layout_check(n_seq, start, mask, err), "%s", fn));
    TRY(unit_interval(fn, "gamma", gamma, err));
    int64_t n = start[n_seq];
    if (n_seq > 0 && !rewards) return error_set(err, SMELT_EINVAL, "%s: rewards is NULL", fn);
    if (n > 0 && (!adv || !returns))
        return error_set(err, SMELT_EINVAL, "%s: %s is NULL", fn, !adv ? "adv" : "returns");
    for (int i = 0; i < n_seq; i++) {
        int64_t s = start[i], len = start[i + 1] - s;
        /* The token rewards go into adv, which gae_core reads before it overwrites. */
        TRY(error_wrap(err,
                       rl_token_rewards(old_logp ? old_logp + s : NULL, ref_logp ? ref_logp + s : NULL, mask + s, len,
                                        rewards[i], beta, est, adv + s, err),
                       "%s: sequence %d", fn, i));
        gae_core(NULL, adv + s, mask + s, len, gamma, 1.0, adv + s, returns + s);
    }
    return error_wrap(err, rl_whiten(adv, mask, n, true, err), "%s: over the batch", fn);
}
