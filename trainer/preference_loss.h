/* Part of trainer/'s public header (trainer.h includes it: the spec holds a loss type):
 * the preference losses (DPO and its variants, SimPO, ORPO, the
 * reward model's Bradley-Terry loss) as small pure functions of per-sequence numbers.
 *
 * Every objective here is a token-logprob objective (docs/architecture.md §4): a pair's
 * loss depends on the policy only through the SUMMED logprobs of the chosen and the
 * rejected response tokens (and their token counts, for the length-normalised ones), so
 * dL/dlogprob is the same for every response token of a sequence: the coefficient
 * returned here. The trainer writes it into dlogprobs for that sequence's response
 * tokens and calls model_backward. The reward model's loss depends on one scalar score
 * per sequence; its coefficient is dL/dscore.
 *
 * Losses are per pair; the trainer averages over the pairs of a step (scaling the
 * coefficients by 1/pairs). docs/algorithms.md gives every formula, its defaults and the
 * TRL / OpenAI setting it corresponds to. All arithmetic in double. */
#ifndef SMELT_TRAINER_PREFERENCE_LOSS_H
#define SMELT_TRAINER_PREFERENCE_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

enum pref_loss_type {
    PREF_LOSS_SIGMOID,  /* DPO (TRL "sigmoid"), with label_smoothing: conservative DPO */
    PREF_LOSS_IPO,      /* TRL "ipo": logprobs averaged over tokens, as TRL does */
    PREF_LOSS_HINGE,    /* TRL "hinge" (SLiC) */
    PREF_LOSS_ROBUST,   /* TRL "robust" (rDPO), uses label_smoothing as the flip rate */
    PREF_LOSS_APO_ZERO, /* TRL "apo_zero" */
    PREF_LOSS_SIMPO,    /* reference-free: length-normalised, margin simpo_gamma */
    PREF_LOSS_ORPO,     /* reference-free: SFT on chosen + beta * odds-ratio term */
};
const char *pref_loss_name(enum pref_loss_type type); /* "sigmoid", "ipo", ... */
int pref_loss_from_name(const char *name, enum pref_loss_type *out, struct smelt_error *err);
/* SimPO and ORPO need no reference model. */
bool pref_loss_needs_reference(enum pref_loss_type type);

struct pref_config {
    enum pref_loss_type type;
    /* > 0: TRL's beta (IPO's tau; ORPO's lambda, TRL ORPOConfig.beta). */
    double beta;
    /* [0, 0.5): sigmoid (cDPO), robust (flip rate), simpo; the others ignore it. */
    double label_smoothing;
    /* >= 0: weight of the chosen response's NLL per token, 0 = off. Adds to every type
     * (with simpo it is TRL CPO's cpo_alpha; with orpo it adds to ORPO's own NLL). */
    double rpo_alpha;
    /* Finite: SimPO's target margin in reward units, TRL CPOConfig's simpo_gamma
     * (default 0.5), i.e. the SimPO repo's beta * gamma_beta_ratio. */
    double simpo_gamma;
};

/* One pair's inputs: summed response logprobs under the policy and the reference
 * (ref_* unused when the loss needs no reference) and the response token counts (>= 1;
 * a count below 1 is taken as 1, as TRL clamps it). */
struct pref_pair {
    double policy_chosen, policy_rejected;
    double ref_chosen, ref_rejected;
    int64_t n_chosen, n_rejected;
};

/* One pair's outputs. d_chosen / d_rejected: dL/d(summed policy logprob of that
 * response), i.e. the coefficient of each of its tokens (for the length-normalised
 * losses the 1/count is already in it). reward_*: TRL's implicit rewards (beta *
 * (policy - ref), summed, for the DPO family, IPO included; beta * mean logprob for
 * SimPO and ORPO), for the metrics rewards/chosen, rewards/rejected, rewards/margins and
 * rewards/accuracies (reward_chosen > reward_rejected).
 * ORPO's odds p/(1-p) are infinite at a mean logprob of 0: a mean logprob above -1e-8
 * is evaluated at -1e-8, loss and derivatives alike, so every result is finite. */
struct pref_result {
    double loss;
    double d_chosen, d_rejected;
    double reward_chosen, reward_rejected;
};

/* SMELT_EINVAL naming the field ("beta", "label_smoothing", "rpo_alpha", "simpo_gamma";
 * "loss_type" for a type outside the enum) for a config out of range. */
int pref_config_check(const struct pref_config *c, struct smelt_error *err);
void pref_pair_loss(const struct pref_config *c, const struct pref_pair *p, struct pref_result *out);

/* The reward model's Bradley-Terry loss on one pair of scores:
 *   -log sigmoid(r_chosen - r_rejected - margin) + center * (r_chosen + r_rejected)^2
 * (TRL RewardTrainer: margin from the row, center_rewards_coefficient). */
struct reward_pair_result {
    double loss;
    double d_chosen, d_rejected; /* dL/dr */
};
void reward_pair_loss(double r_chosen, double r_rejected, double margin, double center,
                      struct reward_pair_result *out);

#endif
