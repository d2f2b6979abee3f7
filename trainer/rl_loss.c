/* The RL policy and value losses of rl_loss.h, in double (docs/algorithms.md (RL)). One pass
 * checks a micro-batch (layout, config, norm, every value a trained token reads); then
 * each sequence is done on its own: a first loop over its tokens for what the sequence
 * shares (trained-token count, GSPO's mean log-ratio, the sequence-level TIS weight), a
 * second for each token's loss and coefficient. Nothing is allocated. */
#include "trainer/rl_loss.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- names ---- */

static const char *const LOSS_NAMES[] = {
    [RL_LOSS_GRPO] = "grpo", [RL_LOSS_DR_GRPO] = "dr_grpo", [RL_LOSS_DAPO] = "dapo",
    [RL_LOSS_BNPO] = "bnpo", [RL_LOSS_GSPO] = "gspo",       [RL_LOSS_CISPO] = "cispo",
};
static const char *const AGG_NAMES[] = {
    [RL_AGG_TOKEN_MEAN] = "token_mean",
    [RL_AGG_SEQ_MEAN_TOKEN_MEAN] = "seq_mean_token_mean",
    [RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM] = "seq_mean_token_sum_norm",
    [RL_AGG_SUM] = "sum",
};
static const char *const KL_NAMES[] = {[RL_KL_K1] = "k1", [RL_KL_K2] = "k2", [RL_KL_K3] = "k3"};
static const char *const ADV_NAMES[] = {
    [RL_ADV_GRPO] = "grpo", [RL_ADV_RLOO] = "rloo", [RL_ADV_REINFORCE_PP] = "reinforce_pp", [RL_ADV_GAE] = "gae",
};
static const char *const TIS_LEVEL_NAMES[] = {[RL_TIS_TOKEN] = "token", [RL_TIS_SEQUENCE] = "sequence"};
static const char *const TIS_MODE_NAMES[] = {[RL_TIS_TRUNCATE] = "truncate", [RL_TIS_MASK] = "mask"};

static int name_index(const char *const *names, int count, const char *what, const char *name,
                      struct smelt_error *err) {
    for (int i = 0; name && i < count; i++)
        if (strcmp(name, names[i]) == 0) return i;
    char accepted[160] = "";
    for (int i = 0; i < count; i++) {
        size_t used = strlen(accepted);
        snprintf(accepted + used, sizeof accepted - used, "%s%s", i ? ", " : "", names[i]);
    }
    return error_set(err, SMELT_EINVAL, "unknown %s \"%s\": expected one of %s", what, name ? name : "(null)",
                     accepted);
}

/* from_name / to_name in the job spec's shape for one enum. */
#define RL_NAME_FUNCS(prefix, type, table, what)                                             \
    int prefix##_from_name(const char *name, void *value, struct smelt_error *err) {         \
        int i = name_index(table, COUNT(table), what, name, err);                             \
        if (i < 0) return i;                                                                  \
        *(type *)value = (type)i;                                                             \
        return SMELT_OK;                                                                      \
    }                                                                                         \
    const char *prefix##_to_name(const void *value) {                                         \
        int i = (int)*(const type *)value;                                                    \
        return i >= 0 && i < COUNT(table) ? table[i] : "unknown";                             \
    }

RL_NAME_FUNCS(rl_loss_type, enum rl_loss_type, LOSS_NAMES, "loss type")
RL_NAME_FUNCS(rl_loss_agg, enum rl_loss_agg, AGG_NAMES, "loss aggregation")
RL_NAME_FUNCS(rl_kl_estimator, enum rl_kl_estimator, KL_NAMES, "KL estimator")
RL_NAME_FUNCS(rl_adv_estimator, enum rl_adv_estimator, ADV_NAMES, "advantage estimator")
RL_NAME_FUNCS(rl_tis_level, enum rl_tis_level, TIS_LEVEL_NAMES, "TIS level")
RL_NAME_FUNCS(rl_tis_mode, enum rl_tis_mode, TIS_MODE_NAMES, "TIS mode")

/* ---- defaults and checks ---- */

enum rl_loss_agg rl_loss_type_default_agg(enum rl_loss_type type) {
    switch (type) {
    case RL_LOSS_GRPO:
    case RL_LOSS_GSPO: return RL_AGG_SEQ_MEAN_TOKEN_MEAN;
    case RL_LOSS_DR_GRPO: return RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    default: return RL_AGG_TOKEN_MEAN;
    }
}

enum rl_norm_scope rl_loss_type_norm_scope(enum rl_loss_type type) {
    return type == RL_LOSS_DAPO || type == RL_LOSS_CISPO ? RL_NORM_GENERATION_BATCH : RL_NORM_MINIBATCH;
}

void rl_policy_config_default(enum rl_loss_type type, struct rl_policy_config *out) {
    *out = (struct rl_policy_config){
        .type = type, .agg = rl_loss_type_default_agg(type), .eps_low = 0.2, .eps_high = 0.2,
        .kl_estimator = RL_KL_K3, .tis_level = RL_TIS_TOKEN, .tis_mode = RL_TIS_TRUNCATE,
    };
    if (type == RL_LOSS_GSPO) out->eps_low = 3e-4, out->eps_high = 4e-4;
    if (type == RL_LOSS_CISPO) out->eps_high = 4.0;
}

static bool enum_ok(int v, int count) { return v >= 0 && v < count; }

int rl_policy_config_check(const struct rl_policy_config *c, struct smelt_error *err) {
    if (!enum_ok((int)c->type, COUNT(LOSS_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "loss_type", "loss_type: unknown value %d", (int)c->type);
    if (!enum_ok((int)c->agg, COUNT(AGG_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "loss_agg", "loss_agg: unknown value %d", (int)c->agg);
    if (!(c->eps_low >= 0.0 && c->eps_low < 1.0))
        return error_set_field(err, SMELT_EINVAL, "eps_low", "eps_low: must be in [0, 1), got %g", c->eps_low);
    if (!(c->eps_high >= 0.0) || !isfinite(c->eps_high))
        return error_set_field(err, SMELT_EINVAL, "eps_high", "eps_high: must be >= 0 and finite, got %g",
                               c->eps_high);
    if (!(c->dual_clip == 0.0 || (c->dual_clip > 1.0 && isfinite(c->dual_clip))))
        return error_set_field(err, SMELT_EINVAL, "dual_clip", "dual_clip: must be 0 (off) or a finite c > 1, got %g",
                               c->dual_clip);
    if (!(c->beta >= 0.0) || !isfinite(c->beta))
        return error_set_field(err, SMELT_EINVAL, "beta", "beta: must be >= 0 and finite, got %g", c->beta);
    if (!enum_ok((int)c->kl_estimator, COUNT(KL_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "kl_estimator", "kl_estimator: unknown value %d",
                               (int)c->kl_estimator);
    if (!(c->tis_cap == 0.0 || (c->tis_cap >= 1.0 && isfinite(c->tis_cap))))
        return error_set_field(err, SMELT_EINVAL, "tis_cap", "tis_cap: must be 0 (off) or a finite cap >= 1, got %g",
                               c->tis_cap);
    if (!enum_ok((int)c->tis_level, COUNT(TIS_LEVEL_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "tis_level", "tis_level: unknown value %d", (int)c->tis_level);
    if (!enum_ok((int)c->tis_mode, COUNT(TIS_MODE_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "tis_mode", "tis_mode: unknown value %d", (int)c->tis_mode);
    if (c->agg == RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM ? c->max_completion_len < 1 : c->max_completion_len < 0)
        return error_set_field(err, SMELT_EINVAL, "max_completion_len",
                               "max_completion_len: must be >= 1 with seq_mean_token_sum_norm (Dr. GRPO's constant) "
                               "and >= 0 otherwise, got %lld",
                               (long long)c->max_completion_len);
    return SMELT_OK;
}

/* ---- layout, norm, stats ---- */

int rl_layout_check(int n_seq, const int64_t *start, const float *mask, struct smelt_error *err) {
    if (n_seq < 0) return error_set(err, SMELT_EINVAL, "n_seq is %d: must be >= 0", n_seq);
    if (!start) return error_set(err, SMELT_EINVAL, "start is NULL: %d sequences need n_seq + 1 offsets", n_seq);
    if (start[0] != 0) return error_set(err, SMELT_EINVAL, "start[0] is %lld: must be 0", (long long)start[0]);
    for (int i = 0; i < n_seq; i++)
        if (start[i + 1] < start[i])
            return error_set(err, SMELT_EINVAL, "start[%d] = %lld is below start[%d] = %lld: offsets must not decrease",
                             i + 1, (long long)start[i + 1], i, (long long)start[i]);
    if (!mask && start[n_seq] > 0) return error_set(err, SMELT_EINVAL, "mask is NULL");
    for (int64_t t = 0; t < start[n_seq]; t++)
        if (mask[t] != 0.0f && mask[t] != 1.0f)
            return error_set(err, SMELT_EINVAL, "mask[%lld] is %g: must be 0 or 1", (long long)t, (double)mask[t]);
    return SMELT_OK;
}

/* Trained tokens of sequence i. */
static int64_t seq_tokens(const int64_t *start, const float *mask, int i) {
    int64_t n = 0;
    for (int64_t t = start[i]; t < start[i + 1]; t++) n += mask[t] != 0.0f;
    return n;
}

int rl_norm_accumulate(struct rl_norm *norm, int n_seq, const int64_t *start, const float *mask,
                       struct smelt_error *err) {
    TRY(rl_layout_check(n_seq, start, mask, err));
    for (int i = 0; i < n_seq; i++) {
        int64_t n = seq_tokens(start, mask, i);
        norm->tokens += (double)n;
        norm->seqs += n > 0;
    }
    return SMELT_OK;
}

/* The norm must cover at least this micro-batch (it counts the whole step). */
static int norm_check(enum rl_loss_agg agg, struct rl_norm norm, double tokens, double seqs, struct smelt_error *err) {
    if (!(norm.tokens >= 0.0 && norm.seqs >= 0.0) || !isfinite(norm.tokens) || !isfinite(norm.seqs))
        return error_set(err, SMELT_EINVAL, "norm {tokens %g, seqs %g}: must be finite and >= 0", norm.tokens,
                         norm.seqs);
    if (agg == RL_AGG_SUM) return SMELT_OK; /* no denominator */
    if (agg == RL_AGG_TOKEN_MEAN && norm.tokens < tokens)
        return error_set(err, SMELT_EINVAL,
                         "norm.tokens is %g, below this micro-batch's %g trained tokens: it must count every "
                         "micro-batch of the step (rl_norm_accumulate)",
                         norm.tokens, tokens);
    if (agg != RL_AGG_TOKEN_MEAN && norm.seqs < seqs)
        return error_set(err, SMELT_EINVAL,
                         "norm.seqs is %g, below this micro-batch's %g sequences with trained tokens: it must count "
                         "every micro-batch of the step (rl_norm_accumulate)",
                         norm.seqs, seqs);
    return SMELT_OK;
}

/* What one trained token of a sequence with n trained tokens weighs in the step loss. */
static double agg_weight(enum rl_loss_agg agg, int64_t n, struct rl_norm norm, int64_t max_len) {
    switch (agg) {
    case RL_AGG_TOKEN_MEAN: return 1.0 / norm.tokens;
    case RL_AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / ((double)n * norm.seqs);
    case RL_AGG_SUM: return 1.0;
    default: return 1.0 / ((double)max_len * norm.seqs);
    }
}

void rl_policy_stats_merge(struct rl_policy_stats *acc, const struct rl_policy_stats *add) {
    if (add->n_tokens > 0) {
        acc->ratio_min = acc->n_tokens > 0 ? fmin(acc->ratio_min, add->ratio_min) : add->ratio_min;
        acc->ratio_max = acc->n_tokens > 0 ? fmax(acc->ratio_max, add->ratio_max) : add->ratio_max;
    }
    acc->loss += add->loss;
    acc->pg_loss += add->pg_loss;
    acc->kl_sum += add->kl_sum;
    acc->ppo_kl_sum += add->ppo_kl_sum;
    acc->ratio_sum += add->ratio_sum;
    acc->tis_weight_sum += add->tis_weight_sum;
    acc->n_tokens += add->n_tokens;
    acc->n_seqs += add->n_seqs;
    acc->clip_low += add->clip_low;
    acc->clip_high += add->clip_high;
    acc->clip_dual += add->clip_dual;
    acc->tis_truncated += add->tis_truncated;
    acc->tis_masked += add->tis_masked;
}

/* ---- per-token pieces ---- */

/* A log-ratio clamped as veRL / OpenRLHF do, with its derivative (0 once clamped). */
struct clamped {
    double x, dx;
};
static struct clamped clamp_log_ratio(double x) {
    if (x > RL_LOG_RATIO_CLAMP) return (struct clamped){RL_LOG_RATIO_CLAMP, 0.0};
    if (x < -RL_LOG_RATIO_CLAMP) return (struct clamped){-RL_LOG_RATIO_CLAMP, 0.0};
    return (struct clamped){x, 1.0};
}

double rl_kl_estimate(enum rl_kl_estimator est, double logp, double ref_logp, double *d_logp) {
    double d = ref_logp - logp, v, slope;
    switch (est) {
    case RL_KL_K1: v = -d, slope = 1.0; break;
    case RL_KL_K2: v = 0.5 * d * d, slope = -d; break;
    default: {
        struct clamped c = clamp_log_ratio(d); /* veRL clamps k3's exponent; e^20 stays finite */
        double em1 = expm1(c.x);               /* e^d - 1 - d keeps its digits for small d */
        v = em1 - c.x, slope = -em1 * c.dx;
    }
    }
    if (d_logp) *d_logp = slope;
    return v;
}

/* The TIS weight from log(pi_old / pi_rollout) (token's, or the sequence's sum). */
struct tis_weight {
    double w;
    bool truncated, masked;
};
static struct tis_weight tis_weight(const struct rl_policy_config *c, double log_w) {
    if (c->tis_cap == 0.0) return (struct tis_weight){1.0, false, false};
    if (log_w > log(c->tis_cap)) {
        if (c->tis_mode == RL_TIS_MASK) return (struct tis_weight){0.0, false, true};
        return (struct tis_weight){c->tis_cap, true, false};
    }
    return (struct tis_weight){exp(log_w), false, false};
}

/* The clipped surrogate f(r, A) and df/dlog(r), with which clip was in force. */
struct surrogate {
    double f, d;
    bool low, high, dual;
};
static struct surrogate clipped_surrogate(const struct rl_policy_config *c, double r, double a) {
    double lo = 1.0 - c->eps_low, hi = 1.0 + c->eps_high;
    double clipped = fmin(fmax(r, lo), hi);
    double plain = -r * a, clip = -clipped * a;
    /* Inside [lo, hi] the two are equal and clip(r) moves with r: the slope is -r*A
     * either way. Outside, the clipped term is a constant. */
    struct surrogate s = {.f = plain >= clip ? plain : clip, .d = plain >= clip ? -r * a : 0.0,
                          .low = r < lo && a < 0.0, .high = r > hi && a > 0.0};
    if (c->dual_clip > 0.0 && a < 0.0 && s.f > -c->dual_clip * a) {
        s.f = -c->dual_clip * a;
        s.d = 0.0;
        s.dual = true;
    }
    return s;
}

/* ---- the policy loss ---- */

static int finite_at(const char *name, const float *x, int64_t t, int i, struct smelt_error *err) {
    if (isfinite(x[t])) return SMELT_OK;
    return error_set(err, SMELT_EINVAL, "rl_policy_loss: %s[%lld] (sequence %d) is %g: every trained token's value "
                     "must be finite", name, (long long)t, i, (double)x[t]);
}

/* Every array the config reads is there, and finite at every trained token. */
static int policy_inputs_check(const struct rl_policy_config *c, const struct rl_seqs *s, double *coef,
                               struct smelt_error *err) {
    const char *missing = !s->logp ? "logp" : !s->old_logp ? "old_logp" : !s->adv ? "adv" : !coef ? "coef" : NULL;
    if (!missing && c->beta > 0.0 && !s->ref_logp) missing = "ref_logp (beta > 0)";
    if (!missing && c->tis_cap > 0.0 && !s->rollout_logp) missing = "rollout_logp (tis_cap > 0)";
    if (missing && s->start[s->n_seq] > 0) return error_set(err, SMELT_EINVAL, "rl_policy_loss: %s is NULL", missing);
    for (int i = 0; i < s->n_seq; i++)
        for (int64_t t = s->start[i]; t < s->start[i + 1]; t++) {
            if (s->mask[t] == 0.0f) continue;
            TRY(finite_at("logp", s->logp, t, i, err));
            TRY(finite_at("old_logp", s->old_logp, t, i, err));
            if (c->beta > 0.0) TRY(finite_at("ref_logp", s->ref_logp, t, i, err));
            if (c->tis_cap > 0.0) TRY(finite_at("rollout_logp", s->rollout_logp, t, i, err));
            if (!isfinite(s->adv[t]))
                return error_set(err, SMELT_EINVAL, "rl_policy_loss: adv[%lld] (sequence %d) is %g: every trained "
                                 "token's value must be finite", (long long)t, i, s->adv[t]);
        }
    return SMELT_OK;
}

/* What a sequence shares among its tokens. */
struct seq_shared {
    int64_t n;           /* trained tokens */
    double weight;       /* agg_weight */
    struct clamped lr;   /* GSPO: the mean log-ratio */
    struct tis_weight tis; /* sequence-level TIS */
};

static struct seq_shared seq_shared(const struct rl_policy_config *c, const struct rl_seqs *s, int i,
                                    struct rl_norm norm) {
    struct seq_shared q = {0};
    double lr_sum = 0.0, log_w = 0.0;
    for (int64_t t = s->start[i]; t < s->start[i + 1]; t++) {
        if (s->mask[t] == 0.0f) continue;
        q.n++;
        lr_sum += (double)s->logp[t] - (double)s->old_logp[t];
        if (c->tis_cap > 0.0) log_w += (double)s->old_logp[t] - (double)s->rollout_logp[t];
    }
    if (q.n == 0) return q;
    q.weight = agg_weight(c->agg, q.n, norm, c->max_completion_len);
    q.lr = clamp_log_ratio(lr_sum / (double)q.n);
    q.tis = tis_weight(c, log_w);
    return q;
}

static void stats_token(struct rl_policy_stats *st, double r, double w, const struct tis_weight *tis) {
    st->ratio_min = st->n_tokens > 0 ? fmin(st->ratio_min, r) : r;
    st->ratio_max = st->n_tokens > 0 ? fmax(st->ratio_max, r) : r;
    st->ratio_sum += r;
    st->tis_weight_sum += w;
    st->tis_truncated += tis->truncated;
    st->tis_masked += tis->masked;
    st->n_tokens++;
}

/* One sequence: coef for its tokens, its part of the stats. GSPO's tokens share the
 * ratio, so their surrogate slopes are summed first (gsum) and spread back through the
 * mean log-ratio: each trained token gets gsum / n. */
static void policy_seq(const struct rl_policy_config *c, const struct rl_seqs *s, int i, struct rl_norm norm,
                       double *coef, struct rl_policy_stats *st) {
    struct seq_shared q = seq_shared(c, s, i, norm);
    double gsum = 0.0;
    for (int64_t t = s->start[i]; t < s->start[i + 1]; t++) {
        coef[t] = 0.0;
        if (s->mask[t] == 0.0f) continue;
        double logp = s->logp[t], old = s->old_logp[t], a = s->adv[t];
        struct clamped lr = c->type == RL_LOSS_GSPO ? q.lr : clamp_log_ratio(logp - old);
        double r = exp(lr.x);
        struct tis_weight tis = q.tis;
        if (c->tis_cap > 0.0 && c->tis_level == RL_TIS_TOKEN) tis = tis_weight(c, old - (double)s->rollout_logp[t]);
        double pg, d_logp = 0.0;
        if (c->type == RL_LOSS_CISPO) {
            double capped = fmin(r, 1.0 + c->eps_high);
            pg = -tis.w * capped * a * logp;
            d_logp = -tis.w * capped * a;
            st->clip_high += r > 1.0 + c->eps_high && a > 0.0;
        } else {
            struct surrogate f = clipped_surrogate(c, r, a);
            pg = tis.w * f.f;
            if (c->type == RL_LOSS_GSPO) gsum += q.weight * tis.w * f.d * lr.dx;
            else d_logp = tis.w * f.d * lr.dx;
            st->clip_low += f.low, st->clip_high += f.high, st->clip_dual += f.dual;
        }
        double kl = 0.0, d_kl = 0.0;
        if (c->beta > 0.0) kl = rl_kl_estimate(c->kl_estimator, logp, s->ref_logp[t], &d_kl);
        coef[t] = q.weight * (d_logp + c->beta * d_kl);
        st->loss += q.weight * (pg + c->beta * kl);
        st->pg_loss += q.weight * pg;
        st->kl_sum += kl;
        st->ppo_kl_sum += old - logp;
        stats_token(st, r, tis.w, &tis);
    }
    if (c->type == RL_LOSS_GSPO && q.n > 0)
        for (int64_t t = s->start[i]; t < s->start[i + 1]; t++)
            if (s->mask[t] != 0.0f) coef[t] += gsum / (double)q.n;
    st->n_seqs += q.n > 0;
}

int rl_policy_loss(const struct rl_policy_config *c, const struct rl_seqs *s, struct rl_norm norm, double *coef,
                   struct rl_policy_stats *st, struct smelt_error *err) {
    if (!c || !s) return error_set(err, SMELT_EINVAL, "rl_policy_loss: %s is NULL", !c ? "config" : "seqs");
    TRY(rl_policy_config_check(c, err));
    TRY(rl_layout_check(s->n_seq, s->start, s->mask, err));
    TRY(policy_inputs_check(c, s, coef, err));
    struct rl_norm own = {0.0, 0.0};
    TRY(rl_norm_accumulate(&own, s->n_seq, s->start, s->mask, err));
    TRY(norm_check(c->agg, norm, own.tokens, own.seqs, err));
    struct rl_policy_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    for (int i = 0; i < s->n_seq; i++) policy_seq(c, s, i, norm, coef, st);
    return SMELT_OK;
}

/* ---- the value loss ---- */

static int value_inputs_check(const struct rl_value_config *c, const struct rl_value_batch *b, double *dvalue,
                              struct smelt_error *err) {
    if (!(c->clip_range >= 0.0) || !isfinite(c->clip_range))
        return error_set_field(err, SMELT_EINVAL, "clip_range", "clip_range: must be >= 0 and finite, got %g",
                               c->clip_range);
    if (!enum_ok((int)c->agg, COUNT(AGG_NAMES)))
        return error_set_field(err, SMELT_EINVAL, "loss_agg", "loss_agg: unknown value %d", (int)c->agg);
    if (c->agg == RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM && c->max_completion_len < 1)
        return error_set_field(err, SMELT_EINVAL, "max_completion_len",
                               "max_completion_len: must be >= 1 with seq_mean_token_sum_norm, got %lld",
                               (long long)c->max_completion_len);
    TRY(rl_layout_check(b->n_seq, b->start, b->mask, err));
    const char *missing = !b->values       ? "values"
                          : !b->old_values ? "old_values"
                          : !b->returns    ? "returns"
                          : !dvalue        ? "dvalue"
                                           : NULL;
    if (missing && b->start[b->n_seq] > 0) return error_set(err, SMELT_EINVAL, "rl_value_loss: %s is NULL", missing);
    for (int64_t t = 0; t < b->start[b->n_seq]; t++) {
        if (b->mask[t] == 0.0f) continue;
        const char *bad = !isfinite(b->values[t])       ? "values"
                          : !isfinite(b->old_values[t]) ? "old_values"
                          : !isfinite(b->returns[t])    ? "returns"
                                                        : NULL;
        if (bad) return error_set(err, SMELT_EINVAL, "rl_value_loss: %s[%lld] is not finite", bad, (long long)t);
    }
    return SMELT_OK;
}

int rl_value_loss(const struct rl_value_config *c, const struct rl_value_batch *b, struct rl_norm norm,
                  double *dvalue, struct rl_value_stats *st, struct smelt_error *err) {
    if (!c || !b) return error_set(err, SMELT_EINVAL, "rl_value_loss: %s is NULL", !c ? "config" : "batch");
    TRY(value_inputs_check(c, b, dvalue, err));
    struct rl_norm own = {0.0, 0.0};
    TRY(rl_norm_accumulate(&own, b->n_seq, b->start, b->mask, err));
    TRY(norm_check(c->agg, norm, own.tokens, own.seqs, err));
    struct rl_value_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    for (int i = 0; i < b->n_seq; i++) {
        int64_t n = seq_tokens(b->start, b->mask, i);
        double weight = n > 0 ? agg_weight(c->agg, n, norm, c->max_completion_len) : 0.0;
        for (int64_t t = b->start[i]; t < b->start[i + 1]; t++) {
            dvalue[t] = 0.0;
            if (b->mask[t] == 0.0f) continue;
            double v = b->values[t], old = b->old_values[t], ret = b->returns[t];
            double e = v - ret, ec = e, dc = 1.0; /* the clipped term's error and its slope */
            if (c->clip_range > 0.0) {
                double vc = fmin(fmax(v, old - c->clip_range), old + c->clip_range);
                ec = vc - ret;
                dc = vc == v ? 1.0 : 0.0;
            }
            bool use_clipped = ec * ec > e * e;
            st->loss += weight * 0.5 * (use_clipped ? ec * ec : e * e);
            dvalue[t] = weight * (use_clipped ? ec * dc : e);
            st->clipped += use_clipped;
            st->value_sum += v;
            st->n_tokens++;
        }
    }
    return SMELT_OK;
}

/* ---- rollout / trainer mismatch ---- */

int rl_logprob_mismatch(const float *a, const float *b, const float *mask, int64_t n, struct rl_mismatch *out,
                        struct smelt_error *err) {
    if (n < 0) return error_set(err, SMELT_EINVAL, "rl_logprob_mismatch: n is %lld", (long long)n);
    if (!out || (n > 0 && (!a || !b || !mask)))
        return error_set(err, SMELT_EINVAL, "rl_logprob_mismatch: a NULL array");
    double abs_sum = 0.0, max_abs = 0.0, k1 = 0.0, k3 = 0.0;
    int64_t count = 0;
    for (int64_t t = 0; t < n; t++) {
        if (mask[t] == 0.0f) continue;
        if (!isfinite(a[t]) || !isfinite(b[t]))
            return error_set(err, SMELT_EINVAL, "rl_logprob_mismatch: %s[%lld] is not finite",
                             isfinite(a[t]) ? "b" : "a", (long long)t);
        double d = (double)a[t] - (double)b[t];
        abs_sum += fabs(d);
        max_abs = fmax(max_abs, fabs(d));
        k1 -= d;
        double dc = clamp_log_ratio(d).x; /* a finite figure for any input */
        k3 += expm1(dc) - dc;
        count++;
    }
    double inv = count > 0 ? 1.0 / (double)count : 0.0;
    *out = (struct rl_mismatch){abs_sum * inv, max_abs, k1 * inv, k3 * inv, count};
    return SMELT_OK;
}
