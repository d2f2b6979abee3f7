/* Per-token losses without a clipped surrogate (rl_loss.h): cross-entropy, plain
 * importance sampling, CISPO with a two-sided clip, DRO. Summed, as the Tinker API
 * defines them. */
#include <math.h>
#include <stddef.h>

#include "trainer/rl_loss.h"

static const char *const TOKEN_LOSS_NAMES[] = {
    [RL_TOKEN_CROSS_ENTROPY] = "cross_entropy", [RL_TOKEN_IMPORTANCE_SAMPLING] = "importance_sampling",
    [RL_TOKEN_CISPO] = "cispo", [RL_TOKEN_DRO] = "dro"};

static int need(const void *p, const char *name, enum rl_token_loss type, struct smelt_error *err) {
    if (p) return SMELT_OK;
    return error_set_field(err, SMELT_EINVAL, name, "%s: required by the %s loss", name, TOKEN_LOSS_NAMES[type]);
}

static int inputs_check(enum rl_token_loss type, const struct rl_token_inputs *in, struct smelt_error *err) {
    if ((int)type < 0 || type > RL_TOKEN_DRO)
        return error_set(err, SMELT_EINVAL, "rl_token_loss: unknown loss %d", (int)type);
    if (in->n < 0) return error_set(err, SMELT_EINVAL, "rl_token_loss: n is %lld", (long long)in->n);
    if (in->n == 0) return SMELT_OK;
    TRY(need(in->logp, "logp", type, err));
    if (type == RL_TOKEN_CROSS_ENTROPY) return need(in->weights, "weights", type, err);
    TRY(need(in->sampling_logp, "logprobs", type, err));
    TRY(need(in->adv, "advantages", type, err));
    if (type == RL_TOKEN_CISPO) {
        if (!(in->clip_low >= 0.0) || !isfinite(in->clip_low))
            return error_set_field(err, SMELT_EINVAL, "clip_low_threshold",
                                   "clip_low_threshold: must be >= 0 and finite, got %g", in->clip_low);
        if (!(in->clip_high >= in->clip_low) || !isfinite(in->clip_high))
            return error_set_field(err, SMELT_EINVAL, "clip_high_threshold",
                                   "clip_high_threshold: must be finite and >= clip_low_threshold %g, got %g",
                                   in->clip_low, in->clip_high);
    }
    if (type == RL_TOKEN_DRO && (!(in->beta >= 0.0) || !isfinite(in->beta)))
        return error_set_field(err, SMELT_EINVAL, "beta", "beta: must be >= 0 and finite, got %g", in->beta);
    return SMELT_OK;
}

static int finite_at(const float *a, const char *name, int64_t t, struct smelt_error *err) {
    if (!a || isfinite(a[t])) return SMELT_OK;
    return error_set_field(err, SMELT_EINVAL, name, "%s[%lld] is %g: must be finite", name, (long long)t,
                           (double)a[t]);
}

/* l_t and dl/dlogp_t for one token. */
static void token(enum rl_token_loss type, const struct rl_token_inputs *in, int64_t t, double *l, double *d) {
    double logp = in->logp[t];
    if (type == RL_TOKEN_CROSS_ENTROPY) {
        *l = -(double)in->weights[t] * logp;
        *d = -(double)in->weights[t];
        return;
    }
    double a = in->adv[t], lr = logp - (double)in->sampling_logp[t], r = exp(lr);
    switch (type) {
    case RL_TOKEN_IMPORTANCE_SAMPLING:
        *l = -r * a;
        *d = -r * a;
        break;
    case RL_TOKEN_CISPO: {
        double c = fmin(fmax(r, in->clip_low), in->clip_high);
        *l = -c * a * logp;
        *d = -c * a;
        break;
    }
    default: /* RL_TOKEN_DRO */
        *l = -(a * logp - 0.5 * in->beta * lr * lr);
        *d = -a + in->beta * lr;
        break;
    }
}

int rl_token_loss(enum rl_token_loss type, const struct rl_token_inputs *in, double *coef, double *elementwise,
                  double *loss, struct smelt_error *err) {
    if (!in || !coef || !loss) return error_set(err, SMELT_EINVAL, "rl_token_loss: NULL argument");
    TRY(inputs_check(type, in, err));
    double sum = 0.0;
    for (int64_t t = 0; t < in->n; t++) {
        TRY(finite_at(in->logp, "logp", t, err));
        TRY(finite_at(in->weights, "weights", t, err));
        TRY(finite_at(in->sampling_logp, "logprobs", t, err));
        TRY(finite_at(in->adv, "advantages", t, err));
        double l, d;
        token(type, in, t, &l, &d);
        if (!isfinite(l) || !isfinite(d))
            return error_set(err, SMELT_EINVAL, "rl_token_loss: token %lld: the %s loss overflows (logp %g, "
                             "sampling logprob %g)", (long long)t, TOKEN_LOSS_NAMES[type], (double)in->logp[t],
                             in->sampling_logp ? (double)in->sampling_logp[t] : 0.0);
        coef[t] = d;
        if (elementwise) elementwise[t] = l;
        sum += l;
    }
    *loss = sum;
    return SMELT_OK;
}
