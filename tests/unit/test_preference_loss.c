/* The preference losses (trainer/preference_loss.h) against TRL's formulas written out
 * literally in double, and against numbers computed apart with python3; their
 * derivatives against central finite differences for every loss type; rewards; config
 * errors; and finite results at extreme inputs. */
#include "tests/unit/testutil.h"

#include <string.h>

#include "trainer/preference_loss.h"

static const enum pref_loss_type ALL_TYPES[] = {
    PREF_LOSS_SIGMOID, PREF_LOSS_IPO,   PREF_LOSS_HINGE, PREF_LOSS_ROBUST,
    PREF_LOSS_APO_ZERO, PREF_LOSS_SIMPO, PREF_LOSS_ORPO,
};
#define N_TYPES (int)(sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* The worked example: pc, pr, rc, rr, nc, nr. */
static const struct pref_pair PAIR = {-12.5, -15.0, -13.0, -14.0, 5, 6};

static struct pref_config config(enum pref_loss_type type, double label_smoothing) {
    return (struct pref_config){.type = type, .beta = 0.1, .label_smoothing = label_smoothing,
                                .rpo_alpha = 0.0, .simpo_gamma = 0.5};
}

static struct pref_result run(const struct pref_config *c, const struct pref_pair *p) {
    struct pref_result r;
    memset(&r, 0xff, sizeof r); /* NaN everywhere: every field must be written */
    pref_pair_loss(c, p, &r);
    return r;
}

static void expect_near(const char *what, double got, double want, double rtol) {
    cr_expect(fabs(got - want) <= rtol * fmax(1.0, fabs(want)), "%s: got %.17g, expected %.17g",
              what, got, want);
}

/* torch.nn.functional.logsigmoid / sigmoid, naively: exact enough at these inputs. */
static double F_logsigmoid(double x) { return -log(1.0 + exp(-x)); }
static double F_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

Test(preference_loss, dpo_family_matches_trl) {
    double beta = 0.1, pc = -12.5, pr = -15.0, rc = -13.0, rr = -14.0, ls = 0.2;
    /* TRL DPOTrainer.dpo_loss: logits = (chosen - rejected) - (ref_chosen - ref_rejected) */
    double logits = (pc - pr) - (rc - rr);
    struct pref_config c = config(PREF_LOSS_SIGMOID, 0.0);
    expect_near("sigmoid", run(&c, &PAIR).loss, -F_logsigmoid(beta * logits), 1e-14);
    expect_near("sigmoid (python3)", run(&c, &PAIR).loss, 0.6209570477895321, 1e-14);
    c = config(PREF_LOSS_SIGMOID, ls);
    expect_near("sigmoid, label_smoothing 0.2", run(&c, &PAIR).loss,
                -F_logsigmoid(beta * logits) * (1 - ls) - F_logsigmoid(-beta * logits) * ls, 1e-14);
    expect_near("sigmoid, label_smoothing 0.2 (python3)", run(&c, &PAIR).loss, 0.6509570477895321, 1e-14);
    c = config(PREF_LOSS_ROBUST, ls);
    expect_near("robust", run(&c, &PAIR).loss,
                (-F_logsigmoid(beta * logits) * (1 - ls) + F_logsigmoid(-beta * logits) * ls) / (1 - 2 * ls),
                1e-14);
    expect_near("robust (python3)", run(&c, &PAIR).loss, 0.570957047789532, 1e-14);
    c = config(PREF_LOSS_HINGE, 0.0);
    expect_near("hinge", run(&c, &PAIR).loss, fmax(0.0, 1 - beta * logits), 1e-14);
    expect_near("hinge (python3)", run(&c, &PAIR).loss, 0.85, 1e-14);
    c = config(PREF_LOSS_APO_ZERO, 0.0);
    expect_near("apo_zero", run(&c, &PAIR).loss,
                (1 - F_sigmoid(beta * (pc - rc))) + F_sigmoid(beta * (pr - rr)), 1e-14);
    expect_near("apo_zero (python3)", run(&c, &PAIR).loss, 0.9625234160368497, 1e-14);
}

Test(preference_loss, ipo_averages_over_tokens) {
    double beta = 0.1, nc = 5, nr = 6;
    /* TRL: for "ipo" every logp (policy and reference) is divided by its token count */
    double pc = -12.5 / nc, pr = -15.0 / nr, rc = -13.0 / nc, rr = -14.0 / nr;
    double logits = (pc - pr) - (rc - rr);
    struct pref_config c = config(PREF_LOSS_IPO, 0.0);
    expect_near("ipo", run(&c, &PAIR).loss, pow(logits - 1 / (2 * beta), 2), 1e-14);
    expect_near("ipo (python3)", run(&c, &PAIR).loss, 22.404444444444444, 1e-14);
}

Test(preference_loss, simpo_matches_trl_cpo) {
    double beta = 0.1, simpo_gamma = 0.5;
    /* TRL CPOTrainer, loss_type "simpo": average_log_prob, then
     * logits = (chosen - rejected) - simpo_gamma / beta; -logsigmoid(beta * logits) */
    double pc = -12.5 / 5, pr = -15.0 / 6;
    double logits = (pc - pr) - simpo_gamma / beta;
    struct pref_config c = config(PREF_LOSS_SIMPO, 0.0);
    struct pref_result r = run(&c, &PAIR);
    expect_near("simpo", r.loss, -F_logsigmoid(beta * logits), 1e-14);
    expect_near("simpo (python3)", r.loss, 0.9740769841801067, 1e-14);
    expect_near("simpo reward_chosen", r.reward_chosen, beta * pc, 1e-14);
    expect_near("simpo reward_rejected", r.reward_rejected, beta * pr, 1e-14);
}

Test(preference_loss, orpo_matches_trl) {
    double beta = 0.1;
    struct pref_pair p = {.policy_chosen = -3.0, .policy_rejected = -9.0, .n_chosen = 4, .n_rejected = 3};
    /* TRL ORPOTrainer: average_log_prob; nll of chosen; loss = nll - beta * logsigmoid(log_odds) */
    double pc = -3.0 / 4, pr = -9.0 / 3;
    double log_odds = (pc - pr) - (log1p(-exp(pc)) - log1p(-exp(pr)));
    double nll = -pc;
    struct pref_config c = config(PREF_LOSS_ORPO, 0.0);
    struct pref_result r = run(&c, &p);
    expect_near("orpo", r.loss, nll - beta * F_logsigmoid(log_odds), 1e-14);
    expect_near("orpo (python3)", r.loss, 0.7556877368543187, 1e-14);
    expect_near("orpo on the worked example (python3)", run(&c, &PAIR).loss, 2.5693147180559945, 1e-14);
    expect_near("orpo reward_chosen", r.reward_chosen, beta * pc, 1e-14);
}

Test(preference_loss, rpo_adds_chosen_nll_per_token) {
    struct pref_config c = config(PREF_LOSS_SIGMOID, 0.0);
    struct pref_result plain = run(&c, &PAIR);
    c.rpo_alpha = 1.0;
    struct pref_result rpo = run(&c, &PAIR);
    expect_near("sigmoid + rpo_alpha 1", rpo.loss, plain.loss + 1.0 * (12.5 / 5), 1e-14);
    expect_near("sigmoid + rpo_alpha 1 (python3)", rpo.loss, 3.120957047789532, 1e-14);
    expect_near("d_chosen", rpo.d_chosen, plain.d_chosen - 1.0 / 5, 1e-14);
    expect_near("d_rejected", rpo.d_rejected, plain.d_rejected, 1e-14);
}

/* Finite differences of the loss in pc and pr. */
struct fd_ctx {
    const struct pref_config *c;
    struct pref_pair p;
};

static double fd_loss(void *ctx) {
    struct fd_ctx *f = ctx;
    return run(f->c, &f->p).loss;
}

static void expect_fd(const struct pref_config *c, const struct pref_pair *p) {
    struct fd_ctx f = {c, *p};
    struct pref_result r = run(c, p);
    double g[2], h[2] = {1e-5 * fmax(1.0, fabs(p->policy_chosen)), 1e-5 * fmax(1.0, fabs(p->policy_rejected))};
    test_fd_gradient(fd_loss, &f, &f.p.policy_chosen, 1, h[0], &g[0]);
    test_fd_gradient(fd_loss, &f, &f.p.policy_rejected, 1, h[1], &g[1]);
    double want[2] = {r.d_chosen, r.d_rejected};
    for (int i = 0; i < 2; i++)
        cr_expect(fabs(g[i] - want[i]) <= 1e-6 * fabs(g[i]) + 1e-8 * fmax(1.0, fabs(r.loss)),
                  "%s (ls %g, rpo %g, beta %g) at pc %g pr %g rc %g rr %g: d_%s %.12g, finite "
                  "difference %.12g",
                  pref_loss_name(c->type), c->label_smoothing, c->rpo_alpha, c->beta, p->policy_chosen,
                  p->policy_rejected, p->ref_chosen, p->ref_rejected, i ? "rejected" : "chosen",
                  want[i], g[i]);
}

Test(preference_loss, derivatives_match_finite_differences) {
    const struct pref_pair pairs[] = {
        PAIR,
        {-3.0, -9.0, -4.0, -7.0, 4, 3},
        {-40.0, -300.0, -45.0, -250.0, 20, 60},  /* DPO logits 5.5: the tail of the sigmoid */
        {-100.0, -100100.0, -100.0, -100.0, 7, 9}, /* DPO logits +1e4 at beta 0.1 */
        {-100100.0, -100.0, -100.0, -100.0, 9, 7}, /* DPO logits -1e4 at beta 0.1 */
        {-0.6, -2.0, -0.5, -1.0, 3, 2},            /* ORPO: chosen mean logprob -0.2 */
    };
    const double smoothing[] = {0.0, 0.3}, rpo[] = {0.0, 0.7}, betas[] = {0.1, 2.0};
    for (int t = 0; t < N_TYPES; t++)
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
            for (int k = 0; k < 8; k++) {
                struct pref_config c = config(ALL_TYPES[t], smoothing[k & 1]);
                c.rpo_alpha = rpo[(k >> 1) & 1];
                c.beta = betas[k >> 2];
                expect_fd(&c, &pairs[i]);
            }
}

Test(preference_loss, rewards_and_accuracy_sign) {
    struct pref_pair better = {-3.0, -9.0, -4.0, -7.0, 4, 3};
    struct pref_pair worse = {-9.0, -3.0, -7.0, -4.0, 3, 4};
    for (int t = 0; t < N_TYPES; t++) {
        struct pref_config c = config(ALL_TYPES[t], 0.0);
        struct pref_result r = run(&c, &better), w = run(&c, &worse);
        cr_expect(r.reward_chosen > r.reward_rejected, "%s: chosen should win", pref_loss_name(c.type));
        cr_expect(w.reward_chosen < w.reward_rejected, "%s: rejected should win", pref_loss_name(c.type));
        cr_expect(r.d_chosen < 0.0, "%s: raising chosen lowers the loss",
                  pref_loss_name(c.type));
    }
    struct pref_config c = config(PREF_LOSS_IPO, 0.0); /* summed log-ratios, as TRL reports */
    struct pref_result r = run(&c, &better);
    expect_near("ipo reward_chosen", r.reward_chosen, 0.1 * (-3.0 - -4.0), 1e-14);
    expect_near("ipo reward_rejected", r.reward_rejected, 0.1 * (-9.0 - -7.0), 1e-14);
    c = config(PREF_LOSS_ORPO, 0.0);
    r = run(&c, &better);
    expect_near("orpo reward_rejected", r.reward_rejected, 0.1 * (-9.0 / 3), 1e-14);
}

static void expect_field(struct pref_config c, const char *field) {
    struct smelt_error err;
    TEST_EXPECT_ERROR(pref_config_check(&c, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, field, "%s", err.message);
    cr_expect(strstr(err.message, field), "message names %s: %s", field, err.message);
}

Test(preference_loss, config_errors_name_the_field) {
    struct smelt_error err;
    for (int t = 0; t < N_TYPES; t++) {
        struct pref_config ok = config(ALL_TYPES[t], 0.49);
        TEST_OK(pref_config_check(&ok, &err), &err);
    }
    const struct pref_config ok = config(PREF_LOSS_SIGMOID, 0.0);
    const double bad_beta[] = {0.0, -0.1, NAN, INFINITY}, bad_ls[] = {-0.01, 0.5, 0.7, NAN};
    const double bad_rpo[] = {-1.0, NAN, INFINITY, NAN}, bad_gamma[] = {NAN, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 4; i++) {
        struct pref_config c = ok;
        c.beta = bad_beta[i];
        expect_field(c, "beta");
        c = ok, c.label_smoothing = bad_ls[i];
        expect_field(c, "label_smoothing");
        c = ok, c.rpo_alpha = bad_rpo[i];
        expect_field(c, "rpo_alpha");
        c = ok, c.simpo_gamma = bad_gamma[i];
        expect_field(c, "simpo_gamma");
    }
    struct pref_config c = ok;
    c.simpo_gamma = -1.0; /* a negative margin is allowed: finite is all that is asked */
    TEST_OK(pref_config_check(&c, &err), &err);
}

Test(preference_loss, names) {
    struct smelt_error err;
    for (int t = 0; t < N_TYPES; t++) {
        enum pref_loss_type back;
        TEST_OK(pref_loss_from_name(pref_loss_name(ALL_TYPES[t]), &back, &err), &err);
        cr_expect_eq(back, ALL_TYPES[t]);
        cr_expect_eq(pref_loss_needs_reference(back), back != PREF_LOSS_SIMPO && back != PREF_LOSS_ORPO);
    }
    cr_expect_str_eq(pref_loss_name(PREF_LOSS_APO_ZERO), "apo_zero");
    enum pref_loss_type out;
    TEST_EXPECT_ERROR(pref_loss_from_name("dpo", &out, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "\"dpo\"") && strstr(err.message, "sigmoid") &&
                  strstr(err.message, "orpo"),
              "message names the value and the accepted names: %s", err.message);
}

static void expect_finite(const struct pref_config *c, const struct pref_pair *p) {
    struct pref_result r = run(c, p);
    cr_expect(isfinite(r.loss) && isfinite(r.d_chosen) && isfinite(r.d_rejected) &&
                  isfinite(r.reward_chosen) && isfinite(r.reward_rejected),
              "%s at pc %g pr %g rc %g rr %g: loss %g d %g %g", pref_loss_name(c->type), p->policy_chosen,
              p->policy_rejected, p->ref_chosen, p->ref_rejected, r.loss, r.d_chosen, r.d_rejected);
}

Test(preference_loss, finite_at_extreme_inputs) {
    const struct pref_pair pairs[] = {
        {-100.0, -100100.0, -100.0, -100.0, 7, 9}, {-100100.0, -100.0, -100.0, -100.0, 9, 7},
        {-1e7, -1e9, 0.0, 0.0, 1, 1},              {-1e9, -1e7, 0.0, 0.0, 1, 1},
        {0.0, -1e-12, 0.0, 0.0, 1, 1},             {-1e-12, 0.0, 0.0, 0.0, 1, 1},
        {0.0, 0.0, 0.0, 0.0, 0, 0}, /* empty responses: counts are taken as 1 */
    };
    for (int t = 0; t < N_TYPES; t++)
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
            for (int ls = 0; ls < 2; ls++) {
                struct pref_config c = config(ALL_TYPES[t], 0.4 * ls);
                c.rpo_alpha = ls;
                expect_finite(&c, &pairs[i]);
            }
    /* -log sigmoid(-1e4) is 1e4 to the last digit, and its slope is exactly -beta. */
    struct pref_config c = config(PREF_LOSS_SIGMOID, 0.0);
    struct pref_result r = run(&c, &pairs[1]);
    expect_near("sigmoid at logits -1e4", r.loss, 1e4, 1e-15);
    expect_near("sigmoid slope at logits -1e4", r.d_chosen, -0.1, 1e-15);
    r = run(&c, &pairs[0]);
    cr_expect(r.loss >= 0.0 && r.loss < 1e-300, "sigmoid at logits +1e4: %g", r.loss);
}

Test(preference_loss, orpo_clamps_certain_responses) {
    /* A mean logprob of 0 has infinite odds; it is evaluated at -1e-8 instead. */
    struct pref_config c = config(PREF_LOSS_ORPO, 0.0);
    struct pref_pair at_zero = {0.0, -6.0, 0.0, 0.0, 3, 2}, clamped = {-3e-8, -6.0, 0.0, 0.0, 3, 2};
    struct pref_result a = run(&c, &at_zero), b = run(&c, &clamped);
    expect_near("odds term at 0 equals the clamp's", a.loss, b.loss - 1e-8, 1e-12); /* b's NLL: 1e-8 */
    expect_near("d_chosen at 0 equals the clamp's", a.d_chosen, b.d_chosen, 1e-12);
    /* A certain rejected response still gets pushed down, hard. */
    struct pref_pair rejected_certain = {-6.0, 0.0, 0.0, 0.0, 2, 3};
    struct pref_result r = run(&c, &rejected_certain);
    cr_expect(isfinite(r.d_rejected) && r.d_rejected > 1e5, "d_rejected %g", r.d_rejected);
}

static double reward_loss(void *ctx) {
    const double *s = ctx; /* r_chosen, r_rejected, margin, center */
    struct reward_pair_result r;
    reward_pair_loss(s[0], s[1], s[2], s[3], &r);
    return r.loss;
}

Test(preference_loss, reward_model_loss) {
    struct reward_pair_result r;
    reward_pair_loss(1.5, 0.25, 0.5, 0.01, &r);
    /* TRL RewardTrainer: -logsigmoid(chosen - rejected - margin) + c * (chosen + rejected)^2 */
    expect_near("reward loss", r.loss, -F_logsigmoid(1.5 - 0.25 - 0.5) + 0.01 * pow(1.5 + 0.25, 2), 1e-14);
    expect_near("reward loss (python3)", r.loss, 0.41749600611489995, 1e-14);
    const double cases[][4] = {{1.5, 0.25, 0.5, 0.01}, {-3.0, 2.0, 0.0, 0.0}, {40.0, -2.0, 1.0, 0.1}};
    for (int i = 0; i < 3; i++) {
        double s[4] = {cases[i][0], cases[i][1], cases[i][2], cases[i][3]}, g[2];
        test_fd_gradient(reward_loss, s, s, 2, 1e-5, g);
        reward_pair_loss(s[0], s[1], s[2], s[3], &r);
        expect_near("reward d_chosen", r.d_chosen, g[0], 1e-8);
        expect_near("reward d_rejected", r.d_rejected, g[1], 1e-8);
    }
    reward_pair_loss(-1e4, 1e4, 0.0, 0.0, &r);
    expect_near("reward loss at -2e4", r.loss, 2e4, 1e-15);
    reward_pair_loss(1e4, -1e4, 0.0, 0.0, &r);
    cr_expect(isfinite(r.loss) && isfinite(r.d_chosen) && r.loss < 1e-300);
}
