/* The preference losses of preference_loss.h, in double, with TRL's formulas
 * (docs/algorithms.md). Each loss is a function of one or two scalars with its
 * derivative; the chain rule back to the SUMMED logprobs is applied once per loss.
 * Logistic terms are written with log1p/exp of -|x| only, so nothing overflows for any
 * finite input. */
#include "trainer/preference_loss.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const LOSS_NAMES[] = {
    [PREF_LOSS_SIGMOID] = "sigmoid", [PREF_LOSS_IPO] = "ipo",
    [PREF_LOSS_HINGE] = "hinge",     [PREF_LOSS_ROBUST] = "robust",
    [PREF_LOSS_APO_ZERO] = "apo_zero", [PREF_LOSS_SIMPO] = "simpo",
    [PREF_LOSS_ORPO] = "orpo",
};
#define LOSS_COUNT ((int)(sizeof LOSS_NAMES / sizeof LOSS_NAMES[0]))

/* ORPO's odds p/(1-p) are infinite at a mean logprob of 0 (every token certain), which
 * TRL turns into inf/NaN. Mean logprobs above this are evaluated here instead, loss and
 * derivatives alike (a straight-through clamp), so a rejected response the policy has
 * made certain still gets a finite, large push down rather than none. */
#define ORPO_MAX_MEAN_LOGPROB (-1e-8)

const char *pref_loss_name(enum pref_loss_type type) {
    return (int)type >= 0 && (int)type < LOSS_COUNT ? LOSS_NAMES[type] : "unknown";
}

int pref_loss_from_name(const char *name, enum pref_loss_type *out, struct smelt_error *err) {
    for (int i = 0; name && i < LOSS_COUNT; i++) {
        if (strcmp(name, LOSS_NAMES[i]) == 0) {
            *out = (enum pref_loss_type)i;
            return SMELT_OK;
        }
    }
    char accepted[128] = "";
    for (int i = 0; i < LOSS_COUNT; i++) {
        size_t used = strlen(accepted);
        snprintf(accepted + used, sizeof accepted - used, "%s%s", i ? ", " : "", LOSS_NAMES[i]);
    }
    return error_set(err, SMELT_EINVAL, "unknown preference loss \"%s\": expected one of %s",
                     name ? name : "(null)", accepted);
}

bool pref_loss_needs_reference(enum pref_loss_type type) {
    return type != PREF_LOSS_SIMPO && type != PREF_LOSS_ORPO;
}

int pref_config_check(const struct pref_config *c, struct smelt_error *err) {
    if ((int)c->type < 0 || (int)c->type >= LOSS_COUNT)
        return error_set_field(err, SMELT_EINVAL, "loss_type", "loss_type: unknown value %d",
                               (int)c->type);
    if (!(c->beta > 0.0) || !isfinite(c->beta))
        return error_set_field(err, SMELT_EINVAL, "beta", "beta: must be > 0 and finite, got %g",
                               c->beta);
    if (!(c->label_smoothing >= 0.0 && c->label_smoothing < 0.5))
        return error_set_field(err, SMELT_EINVAL, "label_smoothing",
                               "label_smoothing: must be in [0, 0.5), got %g", c->label_smoothing);
    if (!(c->rpo_alpha >= 0.0) || !isfinite(c->rpo_alpha))
        return error_set_field(err, SMELT_EINVAL, "rpo_alpha",
                               "rpo_alpha: must be >= 0 and finite, got %g", c->rpo_alpha);
    if (!isfinite(c->simpo_gamma))
        return error_set_field(err, SMELT_EINVAL, "simpo_gamma", "simpo_gamma: must be finite, got %g",
                               c->simpo_gamma);
    return SMELT_OK;
}

/* log sigmoid(x) = min(x, 0) - log(1 + e^-|x|): exp never sees a positive argument. */
static double log_sigmoid(double x) { return fmin(x, 0.0) - log1p(exp(-fabs(x))); }

static double sigmoid(double x) {
    double e = exp(-fabs(x));
    return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

/* log(1 - e^a) for a < 0, switching at -ln 2 so that neither branch cancels. */
static double log1mexp(double a) {
    return a < -M_LN2 ? log1p(-exp(a)) : log(-expm1(a));
}

/* A loss of one scalar and its derivative with respect to that scalar. */
struct loss_d {
    double loss, d;
};

/* -(1-ls) log sigmoid(x) - ls log sigmoid(-x): DPO (cDPO when ls > 0) and SimPO. */
static struct loss_d smoothed_logistic(double x, double ls) {
    return (struct loss_d){
        .loss = -(1.0 - ls) * log_sigmoid(x) - ls * log_sigmoid(-x),
        .d = -(1.0 - ls) * sigmoid(-x) + ls * sigmoid(x),
    };
}

/* rDPO: the unbiased estimate of the clean-label loss under flip rate ls. */
static struct loss_d robust_logistic(double x, double ls) {
    double scale = 1.0 / (1.0 - 2.0 * ls);
    return (struct loss_d){
        .loss = scale * (-(1.0 - ls) * log_sigmoid(x) + ls * log_sigmoid(-x)),
        .d = scale * (-(1.0 - ls) * sigmoid(-x) - ls * sigmoid(x)),
    };
}

/* relu(1 - x); the derivative at the kink is torch's relu'(0) = 0. */
static struct loss_d hinge(double x) {
    return x < 1.0 ? (struct loss_d){1.0 - x, -1.0} : (struct loss_d){0.0, 0.0};
}

/* Losses of x = beta * ((pc - rc) - (pr - rr)); x grows with pc and falls with pr. */
static void dpo_logit_loss(const struct pref_config *c, const struct pref_pair *p,
                           struct pref_result *out) {
    double x = c->beta * ((p->policy_chosen - p->ref_chosen) - (p->policy_rejected - p->ref_rejected));
    struct loss_d l = c->type == PREF_LOSS_HINGE    ? hinge(x)
                      : c->type == PREF_LOSS_ROBUST ? robust_logistic(x, c->label_smoothing)
                                                    : smoothed_logistic(x, c->label_smoothing);
    out->loss = l.loss;
    out->d_chosen = c->beta * l.d;
    out->d_rejected = -c->beta * l.d;
}

/* (h - 1/(2 beta))^2 on per-token log-ratios (TRL averages for IPO; beta is tau here). */
static void ipo_loss(const struct pref_config *c, const struct pref_pair *p, double nc, double nr,
                     struct pref_result *out) {
    double h = (p->policy_chosen - p->ref_chosen) / nc - (p->policy_rejected - p->ref_rejected) / nr;
    double e = h - 1.0 / (2.0 * c->beta);
    out->loss = e * e;
    out->d_chosen = 2.0 * e / nc;
    out->d_rejected = -2.0 * e / nr;
}

/* 1 - sigmoid(xc) + sigmoid(xr) on each response's own log-ratio; 1 - sigmoid(xc) is
 * computed as sigmoid(-xc), which keeps its digits when xc is large. */
static void apo_zero_loss(const struct pref_config *c, const struct pref_pair *p,
                          struct pref_result *out) {
    double xc = c->beta * (p->policy_chosen - p->ref_chosen);
    double xr = c->beta * (p->policy_rejected - p->ref_rejected);
    out->loss = sigmoid(-xc) + sigmoid(xr);
    out->d_chosen = -c->beta * sigmoid(xc) * sigmoid(-xc);
    out->d_rejected = c->beta * sigmoid(xr) * sigmoid(-xr);
}

/* x = beta * (pc/nc - pr/nr) - gamma, then the (smoothed) logistic loss. */
static void simpo_loss(const struct pref_config *c, const struct pref_pair *p, double nc, double nr,
                       struct pref_result *out) {
    double x = c->beta * (p->policy_chosen / nc - p->policy_rejected / nr) - c->simpo_gamma;
    struct loss_d l = smoothed_logistic(x, c->label_smoothing);
    out->loss = l.loss;
    out->d_chosen = c->beta * l.d / nc;
    out->d_rejected = -c->beta * l.d / nr;
}

/* NLL of chosen (per token) - beta * log sigmoid(log odds ratio) on mean logprobs a:
 * d(log odds)/d(ac) = -1/expm1(ac) and d(log odds)/d(ar) = 1/expm1(ar). */
static void orpo_loss(const struct pref_config *c, const struct pref_pair *p, double nc, double nr,
                      struct pref_result *out) {
    double ac = fmin(p->policy_chosen / nc, ORPO_MAX_MEAN_LOGPROB);
    double ar = fmin(p->policy_rejected / nr, ORPO_MAX_MEAN_LOGPROB);
    double log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
    double g = -c->beta * sigmoid(-log_odds); /* dL/d(log_odds) */
    out->loss = -p->policy_chosen / nc - c->beta * log_sigmoid(log_odds);
    out->d_chosen = -1.0 / nc - g / expm1(ac) / nc;
    out->d_rejected = g / expm1(ar) / nr;
}

void pref_pair_loss(const struct pref_config *c, const struct pref_pair *p, struct pref_result *out) {
    /* TRL clamps token counts to >= 1 (an empty response has logprob 0 anyway). */
    double nc = p->n_chosen > 1 ? (double)p->n_chosen : 1.0;
    double nr = p->n_rejected > 1 ? (double)p->n_rejected : 1.0;
    switch (c->type) {
    case PREF_LOSS_IPO: ipo_loss(c, p, nc, nr, out); break;
    case PREF_LOSS_APO_ZERO: apo_zero_loss(c, p, out); break;
    case PREF_LOSS_SIMPO: simpo_loss(c, p, nc, nr, out); break;
    case PREF_LOSS_ORPO: orpo_loss(c, p, nc, nr, out); break;
    default: dpo_logit_loss(c, p, out); break;
    }
    if (c->rpo_alpha > 0.0) { /* RPO: + alpha * NLL of the chosen response, per token */
        out->loss += -c->rpo_alpha * p->policy_chosen / nc;
        out->d_chosen += -c->rpo_alpha / nc;
    }
    if (pref_loss_needs_reference(c->type)) {
        out->reward_chosen = c->beta * (p->policy_chosen - p->ref_chosen);
        out->reward_rejected = c->beta * (p->policy_rejected - p->ref_rejected);
    } else {
        out->reward_chosen = c->beta * p->policy_chosen / nc;
        out->reward_rejected = c->beta * p->policy_rejected / nr;
    }
}

void reward_pair_loss(double r_chosen, double r_rejected, double margin, double center,
                      struct reward_pair_result *out) {
    double x = r_chosen - r_rejected - margin;
    double sum = r_chosen + r_rejected;
    double d_x = -sigmoid(-x);              /* d(-log sigmoid(x))/dx */
    double d_center = 2.0 * center * sum;   /* d(center * sum^2)/dr, either score */
    out->loss = -log_sigmoid(x) + center * sum * sum;
    out->d_chosen = d_x + d_center;
    out->d_rejected = -d_x + d_center;
}
