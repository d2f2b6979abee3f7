/* The RL losses and advantage estimators (trainer/rl_loss.h): every loss type, option
 * and aggregation against TRL's formula written out literally in double (trl_loss
 * below), and a few against numbers worked out by hand; every coefficient against
 * float64 central finite differences; micro-batches adding up to one call; GAE against
 * its O(n^2) definition; group, RLOO and REINFORCE++ advantages, whitening and
 * degenerate groups against hand values; the value loss; the logprob mismatch; and
 * every refusal of bad input. */
#include "tests/unit/testutil.h"

#include <string.h>

#include "trainer/rl_loss.h"

#define MAXT 64

static const enum rl_loss_type TYPES[] = {RL_LOSS_GRPO, RL_LOSS_DR_GRPO, RL_LOSS_DAPO,
                                          RL_LOSS_BNPO, RL_LOSS_GSPO,    RL_LOSS_CISPO};
static const enum rl_loss_agg AGGS[] = {RL_AGG_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])
#define N_AGGS (int)(sizeof AGGS / sizeof AGGS[0])

/* A micro-batch held by value: sequences end to end, as rl_seqs lays them out. */
struct batch {
    int n_seq;
    int64_t start[9];
    float logp[MAXT], old[MAXT], ref[MAXT], roll[MAXT], mask[MAXT];
    double adv[MAXT];
};

static int64_t n_tokens(const struct batch *b) { return b->start[b->n_seq]; }

static struct rl_seqs seqs_of(const struct batch *b) {
    return (struct rl_seqs){.n_seq = b->n_seq, .start = b->start, .logp = b->logp, .old_logp = b->old,
                            .ref_logp = b->ref, .rollout_logp = b->roll, .mask = b->mask, .adv = b->adv};
}

static struct rl_norm norm_of(const struct batch *b) {
    struct rl_norm n = {0, 0};
    struct smelt_error err;
    TEST_OK(rl_norm_accumulate(&n, b->n_seq, b->start, b->mask, &err), &err);
    return n;
}

/* Appends a sequence of n tokens; ratio r = exp(logp - old) is set through old. */
static void add_seq(struct batch *b, int n, const float *logp, const double *ratio, const double *adv,
                    const float *mask) {
    int64_t s = b->start[b->n_seq];
    for (int t = 0; t < n; t++) {
        b->logp[s + t] = logp[t];
        b->old[s + t] = (float)((double)logp[t] - log(ratio[t]));
        b->ref[s + t] = logp[t];
        b->roll[s + t] = b->old[s + t];
        b->adv[s + t] = adv[t];
        b->mask[s + t] = mask ? mask[t] : 1.0f;
    }
    b->start[++b->n_seq] = s + n;
}

static struct rl_policy_config config(enum rl_loss_type type) {
    struct rl_policy_config c;
    rl_policy_config_default(type, &c);
    return c;
}

static double run(const struct rl_policy_config *c, const struct batch *b, struct rl_norm norm, double *coef,
                  struct rl_policy_stats *st) {
    struct rl_seqs s = seqs_of(b);
    struct smelt_error err;
    struct rl_policy_stats local;
    if (!st) st = &local;
    memset(st, 0xff, sizeof *st); /* NaN / -1 everywhere: every field must be written */
    TEST_OK(rl_policy_loss(c, &s, norm, coef, st, &err), &err);
    return st->loss;
}

static void expect_near(const char *what, double got, double want, double tol) {
    cr_expect(fabs(got - want) <= tol * fmax(1.0, fabs(want)), "%s: got %.17g, expected %.17g", what, got, want);
}

/* ---- TRL's GRPOTrainer._compute_loss, written out token by token, no clamps ---- */

static double trl_kl(enum rl_kl_estimator est, double logp, double ref) {
    if (est == RL_KL_K1) return logp - ref;                       /* OpenRLHF k1 */
    if (est == RL_KL_K2) return (logp - ref) * (logp - ref) / 2;  /* OpenRLHF k2 */
    return exp(ref - logp) - (ref - logp) - 1;                    /* TRL's per_token_kl */
}

static double trl_is_ratio(const struct rl_policy_config *c, double log_w) {
    double w = exp(log_w);
    if (c->tis_cap == 0) return 1.0;
    if (c->tis_mode == RL_TIS_TRUNCATE) return fmin(w, c->tis_cap); /* torch.clamp(max=) */
    return w > c->tis_cap ? 0.0 : w;                                /* masked_fill(> max, 0) */
}

static double trl_loss(const struct rl_policy_config *c, const struct batch *b, struct rl_norm norm) {
    double total = 0;
    for (int i = 0; i < b->n_seq; i++) {
        double n = 0, lr_sum = 0, is_sum = 0, seq_sum = 0;
        for (int64_t t = b->start[i]; t < b->start[i + 1]; t++)
            if (b->mask[t]) {
                n++;
                lr_sum += (double)b->logp[t] - b->old[t];
                is_sum += (double)b->old[t] - b->roll[t];
            }
        if (n == 0) continue;
        for (int64_t t = b->start[i]; t < b->start[i + 1]; t++) {
            if (!b->mask[t]) continue;
            double logp = b->logp[t], a = b->adv[t];
            double coef_1 = exp(c->type == RL_LOSS_GSPO ? lr_sum / n : logp - b->old[t]);
            double loss;
            if (c->type == RL_LOSS_CISPO) {
                loss = -fmin(coef_1, 1 + c->eps_high) * a * logp;
            } else {
                double coef_2 = fmin(fmax(coef_1, 1 - c->eps_low), 1 + c->eps_high);
                if (c->dual_clip > 0) coef_1 = fmin(coef_1, c->dual_clip); /* TRL's delta */
                loss = -fmin(coef_1 * a, coef_2 * a);
            }
            double log_w = c->tis_level == RL_TIS_SEQUENCE ? is_sum : (double)b->old[t] - b->roll[t];
            loss *= trl_is_ratio(c, log_w);
            if (c->beta > 0) loss += c->beta * trl_kl(c->kl_estimator, logp, b->ref[t]);
            seq_sum += loss;
        }
        if (c->agg == RL_AGG_TOKEN_MEAN) total += seq_sum / norm.tokens;
        else if (c->agg == RL_AGG_SEQ_MEAN_TOKEN_MEAN) total += seq_sum / n / norm.seqs;
        else total += seq_sum / ((double)c->max_completion_len * norm.seqs);
    }
    return total;
}

/* ---- names and defaults ---- */

Test(rl_loss, names_round_trip) {
    struct smelt_error err;
    const char *loss[] = {"grpo", "dr_grpo", "dapo", "bnpo", "gspo", "cispo"};
    for (int i = 0; i < 6; i++) {
        enum rl_loss_type v;
        TEST_OK(rl_loss_type_from_name(loss[i], &v, &err), &err);
        cr_expect_eq(v, TYPES[i]);
        cr_expect_str_eq(rl_loss_type_to_name(&v), loss[i]);
    }
    const char *agg[] = {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"};
    for (int i = 0; i < 3; i++) {
        enum rl_loss_agg v;
        TEST_OK(rl_loss_agg_from_name(agg[i], &v, &err), &err);
        cr_expect_eq(v, AGGS[i]);
        cr_expect_str_eq(rl_loss_agg_to_name(&v), agg[i]);
    }
    const char *kl[] = {"k1", "k2", "k3"}, *adv[] = {"grpo", "rloo", "reinforce_pp", "gae"};
    for (int i = 0; i < 3; i++) {
        enum rl_kl_estimator v;
        TEST_OK(rl_kl_estimator_from_name(kl[i], &v, &err), &err);
        cr_expect_eq((int)v, i);
        cr_expect_str_eq(rl_kl_estimator_to_name(&v), kl[i]);
    }
    for (int i = 0; i < 4; i++) {
        enum rl_adv_estimator v;
        TEST_OK(rl_adv_estimator_from_name(adv[i], &v, &err), &err);
        cr_expect_eq((int)v, i);
        cr_expect_str_eq(rl_adv_estimator_to_name(&v), adv[i]);
    }
    enum rl_tis_level level;
    enum rl_tis_mode mode;
    TEST_OK(rl_tis_level_from_name("sequence", &level, &err), &err);
    cr_expect_eq(level, RL_TIS_SEQUENCE);
    cr_expect_str_eq(rl_tis_level_to_name(&level), "sequence");
    TEST_OK(rl_tis_mode_from_name("mask", &mode, &err), &err);
    cr_expect_eq(mode, RL_TIS_MASK);
    cr_expect_str_eq(rl_tis_mode_to_name(&mode), "mask");
    level = (enum rl_tis_level)7;
    cr_expect_str_eq(rl_tis_level_to_name(&level), "unknown");
}

Test(rl_loss, unknown_names_list_the_accepted_ones) {
    struct smelt_error err;
    enum rl_loss_type t = RL_LOSS_GRPO;
    TEST_EXPECT_ERROR(rl_loss_type_from_name("ppo", &t, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "\"ppo\"") && strstr(err.message, "dr_grpo") && strstr(err.message, "cispo"),
              "%s", err.message);
    cr_expect_eq(t, RL_LOSS_GRPO, "a refused name leaves the value alone");
    enum rl_loss_agg a;
    TEST_EXPECT_ERROR(rl_loss_agg_from_name("token-mean", &a, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "seq_mean_token_sum_norm"), "%s", err.message);
    enum rl_kl_estimator k;
    TEST_EXPECT_ERROR(rl_kl_estimator_from_name(NULL, &k, &err), SMELT_EINVAL, &err);
    enum rl_adv_estimator e;
    TEST_EXPECT_ERROR(rl_adv_estimator_from_name("reinforce++", &e, &err), SMELT_EINVAL, &err);
    enum rl_tis_mode m;
    TEST_EXPECT_ERROR(rl_tis_mode_from_name("clip", &m, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "truncate, mask"), "%s", err.message);
}

Test(rl_loss, defaults_per_loss_type) {
    const enum rl_loss_agg want[] = {RL_AGG_SEQ_MEAN_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, RL_AGG_TOKEN_MEAN,
                                     RL_AGG_TOKEN_MEAN, RL_AGG_SEQ_MEAN_TOKEN_MEAN, RL_AGG_TOKEN_MEAN};
    const enum rl_norm_scope scope[] = {RL_NORM_MINIBATCH, RL_NORM_MINIBATCH, RL_NORM_GENERATION_BATCH,
                                        RL_NORM_MINIBATCH, RL_NORM_MINIBATCH, RL_NORM_GENERATION_BATCH};
    for (int i = 0; i < N_TYPES; i++) {
        cr_expect_eq(rl_loss_type_default_agg(TYPES[i]), want[i], "%s", rl_loss_type_to_name(&TYPES[i]));
        cr_expect_eq(rl_loss_type_norm_scope(TYPES[i]), scope[i], "%s", rl_loss_type_to_name(&TYPES[i]));
        struct rl_policy_config c = config(TYPES[i]);
        cr_expect_eq(c.agg, want[i]);
        cr_expect(c.beta == 0 && c.dual_clip == 0 && c.tis_cap == 0 && c.kl_estimator == RL_KL_K3);
    }
    struct rl_policy_config c = config(RL_LOSS_DAPO);
    cr_expect(c.eps_low == 0.2 && c.eps_high == 0.2);
    c = config(RL_LOSS_GSPO);
    cr_expect(c.eps_low == 3e-4 && c.eps_high == 4e-4);
    c = config(RL_LOSS_CISPO);
    cr_expect(c.eps_high == 4.0);
    struct smelt_error err;
    c = config(RL_LOSS_DR_GRPO); /* Dr. GRPO needs its constant */
    TEST_EXPECT_ERROR(rl_policy_config_check(&c, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "max_completion_len");
    c.max_completion_len = 256;
    TEST_OK(rl_policy_config_check(&c, &err), &err);
}

/* ---- closed forms, with hand-computed numbers ---- */

/* r = 1.5, 0.5, 1.1, 0.5, 1.5 with A = 1, -1, 2, 1, -1 and eps 0.2 / 0.28: token losses
 * -1.28 (clipped high), 0.8 (clipped low), -2.2, -0.5, 1.5; mean -0.336; the clipped
 * tokens get no gradient, the others -r*A/5. */
Test(rl_loss, clipped_surrogate_by_hand) {
    struct batch b = {0};
    const float logp[] = {-1.0f, -2.0f, -0.5f, -3.0f, -0.25f};
    const double r[] = {1.5, 0.5, 1.1, 0.5, 1.5}, a[] = {1, -1, 2, 1, -1};
    add_seq(&b, 5, logp, r, a, NULL);
    struct rl_policy_config c = config(RL_LOSS_DAPO);
    c.eps_high = 0.28;
    double coef[MAXT];
    struct rl_policy_stats st;
    double loss = run(&c, &b, norm_of(&b), coef, &st);
    expect_near("loss (by hand)", loss, -0.336, 1e-6);
    expect_near("loss (TRL formula)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-13);
    const double want[] = {0, 0, -0.44, -0.1, 0.3};
    for (int t = 0; t < 5; t++) expect_near("coef (by hand)", coef[t], want[t], 1e-6);
    cr_expect(st.clip_low == 1 && st.clip_high == 1 && st.clip_dual == 0 && st.n_tokens == 5 && st.n_seqs == 1,
              "clip low %lld high %lld", (long long)st.clip_low, (long long)st.clip_high);
    expect_near("pg_loss", st.pg_loss, loss, 1e-15);
    expect_near("ratio mean", st.ratio_sum / 5, (1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5, 1e-6);
    expect_near("ratio max", st.ratio_max, 1.5, 1e-6);
    expect_near("ratio min", st.ratio_min, 0.5, 1e-6);
    expect_near("ppo_kl", st.ppo_kl_sum, -(log(1.5) * 2 + log(0.5) * 2 + log(1.1)), 1e-6);
    cr_expect(st.kl_sum == 0 && st.tis_weight_sum == 5 && st.tis_truncated == 0 && st.tis_masked == 0);
}

/* Dual clip c = 3 for A = -1: r = 4 is held at 3 (no gradient), r = 2 and the low-clipped
 * 0.5 are untouched: (3 + 2 + 0.8) / 3, coef (0, 2/3, 0). */
Test(rl_loss, dual_clip_by_hand) {
    struct batch b = {0};
    const float logp[] = {-1.0f, -1.0f, -1.0f};
    const double r[] = {4, 2, 0.5}, a[] = {-1, -1, -1};
    add_seq(&b, 3, logp, r, a, NULL);
    struct rl_policy_config c = config(RL_LOSS_BNPO);
    c.dual_clip = 3.0;
    double coef[MAXT];
    struct rl_policy_stats st;
    double loss = run(&c, &b, norm_of(&b), coef, &st);
    expect_near("dual clip (by hand)", loss, 5.8 / 3, 1e-6);
    expect_near("dual clip (TRL delta)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-13);
    expect_near("coef 0", coef[0], 0, 0);
    expect_near("coef 1", coef[1], 2.0 / 3, 1e-6);
    expect_near("coef 2", coef[2], 0, 0);
    cr_expect(st.clip_dual == 1 && st.clip_low == 1 && st.clip_high == 0);
    c.dual_clip = 0; /* without it r = 4 costs 4 */
    expect_near("no dual clip", run(&c, &b, norm_of(&b), coef, NULL), 6.8 / 3, 1e-6);
}

/* One token, ratio 1 and A = 0, logp -1, ref -1.5, beta 0.1: only the KL term. */
Test(rl_loss, kl_estimators_by_hand) {
    struct batch b = {0};
    const float logp[] = {-1.0f};
    const double r[] = {1}, a[] = {0};
    add_seq(&b, 1, logp, r, a, NULL);
    b.ref[0] = -1.5f;
    const double want_kl[] = {0.5, 0.125, 0.10653065971263342};   /* k1, k2, k3 = e^-.5 + .5 - 1 */
    const double want_d[] = {1.0, 0.5, 0.3934693402873666};       /* 1, logp - ref, 1 - e^-.5 */
    for (int k = 0; k < 3; k++) {
        struct rl_policy_config c = config(RL_LOSS_GRPO);
        c.beta = 0.1;
        c.kl_estimator = (enum rl_kl_estimator)k;
        double coef[MAXT];
        struct rl_policy_stats st;
        double loss = run(&c, &b, norm_of(&b), coef, &st);
        expect_near("beta * KL", loss, 0.1 * want_kl[k], 1e-14);
        expect_near("beta * KL (TRL formula)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-14);
        expect_near("beta * dKL/dlogp", coef[0], 0.1 * want_d[k], 1e-14);
        expect_near("kl_sum", st.kl_sum, want_kl[k], 1e-14);
        cr_expect(st.pg_loss == 0.0);
        double d;
        expect_near("rl_kl_estimate", rl_kl_estimate(c.kl_estimator, -1.0, -1.5, &d), want_kl[k], 1e-15);
        expect_near("rl_kl_estimate slope", d, want_d[k], 1e-15);
    }
}

/* Ratio 1, A = 1 (token loss -1 before the weight); old - rollout = log 0.5, log 2,
 * log 4; cap 3. Token: weights 0.5, 2, 3 (truncate) or 0.5, 2, 0 (mask). Sequence: the
 * product 4 is over the cap: 3 (truncate) or 0 (mask) for every token. */
Test(rl_loss, tis_by_hand) {
    struct batch b = {0};
    const float logp[] = {-1.0f, -2.0f, -0.5f};
    const double r[] = {1, 1, 1}, a[] = {1, 1, 1};
    add_seq(&b, 3, logp, r, a, NULL);
    const double w[] = {0.5, 2, 4};
    for (int t = 0; t < 3; t++) b.roll[t] = (float)(b.old[t] - log(w[t]));
    struct {
        enum rl_tis_level level;
        enum rl_tis_mode mode;
        double w[3];
        int truncated, masked;
    } cases[] = {
        {RL_TIS_TOKEN, RL_TIS_TRUNCATE, {0.5, 2, 3}, 1, 0},
        {RL_TIS_TOKEN, RL_TIS_MASK, {0.5, 2, 0}, 0, 1},
        {RL_TIS_SEQUENCE, RL_TIS_TRUNCATE, {3, 3, 3}, 3, 0},
        {RL_TIS_SEQUENCE, RL_TIS_MASK, {0, 0, 0}, 0, 3},
    };
    for (int k = 0; k < 4; k++) {
        struct rl_policy_config c = config(RL_LOSS_DAPO);
        c.tis_cap = 3.0;
        c.tis_level = cases[k].level;
        c.tis_mode = cases[k].mode;
        double coef[MAXT];
        struct rl_policy_stats st;
        double loss = run(&c, &b, norm_of(&b), coef, &st);
        double sum = cases[k].w[0] + cases[k].w[1] + cases[k].w[2];
        expect_near("TIS loss (by hand)", loss, -sum / 3, 1e-6);
        expect_near("TIS loss (TRL formula)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-13);
        for (int t = 0; t < 3; t++) expect_near("TIS coef", coef[t], -cases[k].w[t] / 3, 1e-6);
        cr_expect(st.tis_truncated == cases[k].truncated && st.tis_masked == cases[k].masked,
                  "case %d: truncated %lld masked %lld", k, (long long)st.tis_truncated, (long long)st.tis_masked);
        expect_near("mean TIS weight", st.tis_weight_sum / 3, sum / 3, 1e-6);
    }
    /* Under the cap the sequence weight is the product: 0.5 * 2 * 2 = 2. */
    b.roll[2] = (float)(b.old[2] - log(2.0));
    struct rl_policy_config c = config(RL_LOSS_DAPO);
    c.tis_cap = 3.0;
    c.tis_level = RL_TIS_SEQUENCE;
    expect_near("sequence weight under the cap", run(&c, &b, norm_of(&b), (double[MAXT]){0}, NULL), -2.0, 1e-6);
}

/* Two sequences, ratio 1 so each token loses -A: a prompt token (untrained) and A = 1, 3;
 * then A = 1, 1, 1. token_mean -7/5; seq_mean_token_mean (-2 + -1)/2; Dr. GRPO's sum over
 * 2 sequences * 4 tokens: -7/8. */
Test(rl_loss, aggregations_by_hand) {
    struct batch b = {0};
    const float logp0[] = {-9.0f, -1.0f, -2.0f}, mask0[] = {0, 1, 1}, logp1[] = {-1.0f, -1.5f, -0.5f};
    const double one[] = {1, 1, 1}, a0[] = {5, 1, 3}, a1[] = {1, 1, 1};
    add_seq(&b, 3, logp0, one, a0, mask0);
    add_seq(&b, 3, logp1, one, a1, NULL);
    struct rl_norm norm = norm_of(&b);
    cr_expect(norm.tokens == 5 && norm.seqs == 2);
    const double want_loss[] = {-7.0 / 5, -1.5, -7.0 / 8};
    const double want_coef[][6] = {
        {0, -0.2, -0.6, -0.2, -0.2, -0.2},
        {0, -0.25, -0.75, -1.0 / 6, -1.0 / 6, -1.0 / 6},
        {0, -1.0 / 8, -3.0 / 8, -1.0 / 8, -1.0 / 8, -1.0 / 8},
    };
    for (int g = 0; g < N_AGGS; g++) {
        struct rl_policy_config c = config(RL_LOSS_GRPO);
        c.agg = AGGS[g];
        c.max_completion_len = 4;
        double coef[MAXT];
        double loss = run(&c, &b, norm, coef, NULL);
        expect_near(rl_loss_agg_to_name(&c.agg), loss, want_loss[g], 1e-14);
        expect_near("TRL formula", loss, trl_loss(&c, &b, norm), 1e-14);
        for (int t = 0; t < 6; t++) expect_near("aggregated coef", coef[t], want_coef[g][t], 1e-14);
    }
}

/* One sequence, logp - old = log 2 and 0: the sequence ratio is sqrt(2), shared. With
 * eps_high 0.5 it is inside: each token loses -sqrt(2), the sequence -sqrt(2), and each
 * token's coefficient is -sqrt(2)/2 (through the mean). With eps_high 0.2 it is held at
 * 1.2 and nothing flows. */
Test(rl_loss, gspo_by_hand) {
    struct batch b = {0};
    const float logp[] = {-1.0f, -2.0f};
    const double r[] = {2, 1}, a[] = {1, 1};
    add_seq(&b, 2, logp, r, a, NULL);
    struct rl_policy_config c = config(RL_LOSS_GSPO);
    c.eps_low = 0.2, c.eps_high = 0.5;
    double coef[MAXT];
    struct rl_policy_stats st;
    double loss = run(&c, &b, norm_of(&b), coef, &st);
    expect_near("gspo (by hand)", loss, -1.4142135623730951, 1e-6);
    expect_near("gspo (TRL formula)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-13);
    expect_near("gspo coef 0", coef[0], -0.70710678118654757, 1e-6);
    expect_near("gspo coef 1", coef[1], -0.70710678118654757, 1e-6);
    expect_near("gspo ratio", st.ratio_max, 1.4142135623730951, 1e-6);
    cr_expect(st.ratio_min == st.ratio_max, "one ratio for the sequence");
    c.eps_high = 0.2;
    loss = run(&c, &b, norm_of(&b), coef, &st);
    expect_near("gspo clipped", loss, -1.2, 1e-14);
    cr_expect(coef[0] == 0 && coef[1] == 0 && st.clip_high == 2);
}

/* r = 2, 0.5 with A = 1, logp -0.5, -1, eps_high 0.5: weights 1.5 (capped), 0.5;
 * token losses -1.5*1*(-0.5) = 0.75 and 0.5; mean 0.625; coef -w*A/2. */
Test(rl_loss, cispo_by_hand) {
    struct batch b = {0};
    const float logp[] = {-0.5f, -1.0f};
    const double r[] = {2, 0.5}, a[] = {1, 1};
    add_seq(&b, 2, logp, r, a, NULL);
    struct rl_policy_config c = config(RL_LOSS_CISPO);
    c.eps_high = 0.5;
    double coef[MAXT];
    struct rl_policy_stats st;
    double loss = run(&c, &b, norm_of(&b), coef, &st);
    expect_near("cispo (by hand)", loss, 0.625, 1e-6);
    expect_near("cispo (TRL formula)", loss, trl_loss(&c, &b, norm_of(&b)), 1e-13);
    expect_near("cispo coef 0: the capped weight still carries gradient", coef[0], -0.75, 1e-6);
    expect_near("cispo coef 1", coef[1], -0.25, 1e-6);
    cr_expect(st.clip_high == 1 && st.clip_low == 0);
}

/* ---- every type x aggregation x option against TRL's formula, and finite differences ---- */

/* A random batch on a 2^-8 grid (so logp +- 2^-14 is exact in float), three sequences
 * with untrained tokens at the start and inside, every ratio, GSPO sequence ratio and
 * dual-clip point at least 4h away from a kink of the configs below. */
#define FD_H 0x1p-14
static const double KINKS[] = {0.8, 1.28, 1.5}; /* 1 - eps_low, 1 + eps_high, dual clip */

static double grid(struct test_rng *rng, double lo, double hi) {
    return round(test_rng_uniform(rng, lo, hi) * 256.0) / 256.0;
}

static bool near_kink(double lr) {
    for (int k = 0; k < 3; k++)
        if (fabs(lr - log(KINKS[k])) < 4 * FD_H) return true;
    return false;
}

static struct batch random_batch(uint64_t seed) {
    struct test_rng rng = {seed};
    struct batch b = {0};
    const int len[] = {6, 8, 5};
    const float masks[][8] = {{0, 0, 1, 1, 1, 1}, {0, 1, 1, 1, 0, 1, 1, 1}, {1, 1, 1, 1, 1}};
    for (int i = 0; i < 3; i++) {
        float logp[8], mask[8];
        double r[8], a[8];
        for (int t = 0; t < len[i]; t++) {
            logp[t] = (float)grid(&rng, -4.0, -0.05);
            r[t] = exp(grid(&rng, -0.5, 0.5));
            double mag = test_rng_uniform(&rng, 0.2, 1.5);
            a[t] = test_rng_uniform(&rng, 0, 1) < 0.5 ? -mag : mag;
            mask[t] = masks[i][t];
        }
        add_seq(&b, len[i], logp, r, a, mask);
        int64_t s = b.start[i];
        for (int t = 0; t < len[i]; t++) {
            b.old[s + t] = (float)((double)logp[t] - grid(&rng, -0.5, 0.5));
            b.ref[s + t] = (float)((double)logp[t] + grid(&rng, -1.0, 1.0));
        }
        for (;;) { /* every token's log-ratio and the sequence's mean (GSPO) away from the kinks */
            double sum = 0, n = 0;
            int near = -1;
            for (int t = 0; t < len[i]; t++) {
                double lr = (double)b.logp[s + t] - b.old[s + t];
                if (mask[t]) sum += lr, n++;
                if (near_kink(lr)) near = t;
            }
            if (near < 0 && !near_kink(sum / n)) break;
            b.old[s + (near >= 0 ? near : len[i] - 1)] += (near >= 0 ? 3.0f : 1.0f) / 256;
        }
        for (int t = 0; t < len[i]; t++) b.roll[s + t] = (float)((double)b.old[s + t] + grid(&rng, -0.6, 0.6));
    }
    return b;
}

/* The option sets every type and aggregation is checked with. */
static struct rl_policy_config option_config(enum rl_loss_type type, enum rl_loss_agg agg, int opt) {
    struct rl_policy_config c = config(type);
    c.agg = agg;
    c.eps_low = 0.2, c.eps_high = 0.28; /* GSPO's and CISPO's own defaults would clip everything / nothing */
    c.max_completion_len = 8;
    switch (opt) {
    case 1: c.beta = 0.05, c.kl_estimator = RL_KL_K1, c.dual_clip = 1.5; break;
    case 2: c.beta = 0.1, c.kl_estimator = RL_KL_K2, c.tis_cap = 1.5; break;
    case 3: c.beta = 0.1, c.kl_estimator = RL_KL_K3, c.tis_cap = 1.5, c.tis_mode = RL_TIS_MASK; break;
    case 4: c.tis_cap = 2.0, c.tis_level = RL_TIS_SEQUENCE; break;
    case 5:
        c.beta = 0.2, c.tis_cap = 2.0, c.tis_level = RL_TIS_SEQUENCE, c.tis_mode = RL_TIS_MASK, c.dual_clip = 1.5;
        break;
    default: break;
    }
    return c;
}
#define N_OPTS 6

static void describe(char *buf, size_t n, const struct rl_policy_config *c, int opt, uint64_t seed) {
    snprintf(buf, n, "%s / %s / options %d / batch %llu", rl_loss_type_to_name(&c->type), rl_loss_agg_to_name(&c->agg),
             opt, (unsigned long long)seed);
}

Test(rl_loss, every_type_and_option_matches_trl_formula) {
    int checked = 0, clipped = 0, truncated = 0, masked = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        struct batch b = random_batch(seed);
        struct rl_norm norm = norm_of(&b);
        for (int t = 0; t < N_TYPES; t++)
            for (int g = 0; g < N_AGGS; g++)
                for (int o = 0; o < N_OPTS; o++) {
                    struct rl_policy_config c = option_config(TYPES[t], AGGS[g], o);
                    double coef[MAXT];
                    struct rl_policy_stats st;
                    double loss = run(&c, &b, norm, coef, &st);
                    char what[128];
                    describe(what, sizeof what, &c, o, seed);
                    expect_near(what, loss, trl_loss(&c, &b, norm), 1e-13);
                    for (int64_t k = 0; k < n_tokens(&b); k++)
                        if (!b.mask[k])
                            cr_expect(coef[k] == 0.0, "%s: coef at untrained token %lld", what, (long long)k);
                    clipped += st.clip_low + st.clip_high + st.clip_dual;
                    truncated += st.tis_truncated;
                    masked += st.tis_masked;
                    checked++;
                }
    }
    /* The inputs do reach every branch. */
    cr_expect(checked == 4 * N_TYPES * N_AGGS * N_OPTS && clipped > 0 && truncated > 0 && masked > 0,
              "clipped %d truncated %d masked %d", clipped, truncated, masked);
}

/* Loss as a function of the batch's float arrays, for finite differences. */
struct fd_ctx {
    const struct rl_policy_config *c;
    struct batch *b;
    struct rl_norm norm;
};

static double fd_loss(const struct fd_ctx *f) {
    double coef[MAXT];
    return run(f->c, f->b, f->norm, coef, NULL);
}

/* dL/dlogp[k] by central differences. CISPO's weight is a stop-gradient of the ratio,
 * so its derivative is taken with the ratio and the TIS weight held: logp, old_logp and
 * rollout_logp all move by h together. */
static double fd_coef(struct fd_ctx *f, int64_t k) {
    bool joint = f->c->type == RL_LOSS_CISPO;
    float *arrays[3] = {f->b->logp, f->b->old, f->b->roll};
    float saved[3];
    for (int j = 0; j < 3; j++) saved[j] = arrays[j][k];
    double l[2];
    for (int s = 0; s < 2; s++) {
        for (int j = 0; j < (joint ? 3 : 1); j++) arrays[j][k] = saved[j] + (float)(s ? -FD_H : FD_H);
        l[s] = fd_loss(f);
    }
    for (int j = 0; j < 3; j++) arrays[j][k] = saved[j];
    return (l[0] - l[1]) / (2 * FD_H);
}

Test(rl_loss, coefficients_match_finite_differences) {
    int nonzero = 0;
    for (uint64_t seed = 11; seed <= 13; seed++) {
        struct batch b = random_batch(seed);
        for (int t = 0; t < N_TYPES; t++)
            for (int g = 0; g < N_AGGS; g++)
                for (int o = 0; o < N_OPTS; o++) {
                    struct rl_policy_config c = option_config(TYPES[t], AGGS[g], o);
                    struct fd_ctx f = {&c, &b, norm_of(&b)};
                    double coef[MAXT];
                    run(&c, &b, f.norm, coef, NULL);
                    char what[128];
                    describe(what, sizeof what, &c, o, seed);
                    for (int64_t k = 0; k < n_tokens(&b); k++) {
                        double fd = fd_coef(&f, k);
                        cr_expect(fabs(coef[k] - fd) <= 1e-8 + 1e-6 * fabs(fd),
                                  "%s: token %lld (mask %g): coef %.12g, finite difference %.12g", what, (long long)k,
                                  (double)b.mask[k], coef[k], fd);
                        nonzero += coef[k] != 0.0;
                    }
                }
    }
    cr_expect(nonzero > 1000, "the check saw %d non-zero coefficients", nonzero);
}

/* Two micro-batches with the step's rl_norm add up to one call on the whole. */
static struct batch sub_batch(const struct batch *b, int first, int count) {
    struct batch s = {0};
    int64_t off = b->start[first];
    s.n_seq = count;
    for (int i = 0; i <= count; i++) s.start[i] = b->start[first + i] - off;
    int64_t n = s.start[count];
    memcpy(s.logp, b->logp + off, (size_t)n * sizeof(float));
    memcpy(s.old, b->old + off, (size_t)n * sizeof(float));
    memcpy(s.ref, b->ref + off, (size_t)n * sizeof(float));
    memcpy(s.roll, b->roll + off, (size_t)n * sizeof(float));
    memcpy(s.mask, b->mask + off, (size_t)n * sizeof(float));
    memcpy(s.adv, b->adv + off, (size_t)n * sizeof(double));
    return s;
}

Test(rl_loss, micro_batches_add_up_to_the_whole) {
    struct batch whole = random_batch(21);
    struct batch parts[2] = {sub_batch(&whole, 0, 1), sub_batch(&whole, 1, 2)};
    struct rl_norm norm = {0, 0};
    struct smelt_error err;
    for (int p = 0; p < 2; p++)
        TEST_OK(rl_norm_accumulate(&norm, parts[p].n_seq, parts[p].start, parts[p].mask, &err), &err);
    struct rl_norm direct = norm_of(&whole);
    cr_expect(norm.tokens == direct.tokens && norm.seqs == direct.seqs);
    for (int t = 0; t < N_TYPES; t++)
        for (int g = 0; g < N_AGGS; g++)
            for (int o = 0; o < N_OPTS; o++) {
                struct rl_policy_config c = option_config(TYPES[t], AGGS[g], o);
                double coef[MAXT], part_coef[MAXT];
                struct rl_policy_stats st, part_st, sum_st = {0};
                double loss = run(&c, &whole, norm, coef, &st), sum = 0;
                char what[128];
                describe(what, sizeof what, &c, o, 21);
                for (int p = 0; p < 2; p++) {
                    sum += run(&c, &parts[p], norm, part_coef, &part_st);
                    rl_policy_stats_merge(&sum_st, &part_st);
                    int64_t off = whole.start[p == 0 ? 0 : 1];
                    for (int64_t k = 0; k < n_tokens(&parts[p]); k++)
                        expect_near(what, part_coef[k], coef[off + k], 1e-13);
                }
                expect_near(what, sum, loss, 1e-13);
                expect_near("merged pg_loss", sum_st.pg_loss, st.pg_loss, 1e-13);
                expect_near("merged kl_sum", sum_st.kl_sum, st.kl_sum, 1e-13);
                expect_near("merged ratio_sum", sum_st.ratio_sum, st.ratio_sum, 1e-13);
                cr_expect(sum_st.n_tokens == st.n_tokens && sum_st.n_seqs == st.n_seqs &&
                              sum_st.clip_low == st.clip_low && sum_st.clip_high == st.clip_high &&
                              sum_st.clip_dual == st.clip_dual && sum_st.tis_truncated == st.tis_truncated &&
                              sum_st.tis_masked == st.tis_masked && sum_st.ratio_max == st.ratio_max &&
                              sum_st.ratio_min == st.ratio_min,
                          "%s: merged counts differ", what);
            }
}

Test(rl_loss, untrained_tokens_are_never_read) {
    struct batch b = random_batch(5);
    struct rl_policy_config c = option_config(RL_LOSS_GSPO, RL_AGG_SEQ_MEAN_TOKEN_MEAN, 5);
    double coef[MAXT];
    double want = run(&c, &b, norm_of(&b), coef, NULL);
    for (int64_t k = 0; k < n_tokens(&b); k++)
        if (!b.mask[k]) b.logp[k] = b.old[k] = b.ref[k] = b.roll[k] = NAN, b.adv[k] = INFINITY;
    cr_expect(run(&c, &b, norm_of(&b), coef, NULL) == want);
}

Test(rl_loss, empty_micro_batch) {
    const int64_t start[] = {0, 0};
    struct rl_seqs s = {.n_seq = 0, .start = start};
    struct rl_policy_config c = config(RL_LOSS_GRPO);
    struct rl_policy_stats st;
    struct smelt_error err;
    TEST_OK(rl_policy_loss(&c, &s, (struct rl_norm){0, 0}, NULL, &st, &err), &err);
    cr_expect(st.loss == 0 && st.n_tokens == 0 && st.ratio_max == 0);
    s.n_seq = 1; /* one sequence with no tokens at all */
    TEST_OK(rl_policy_loss(&c, &s, (struct rl_norm){0, 0}, NULL, &st, &err), &err);
    cr_expect(st.n_seqs == 0, "a sequence without trained tokens is not counted");
}

/* Far outside the clamp range everything stays finite and the clamped terms are flat. */
Test(rl_loss, extreme_log_ratios_stay_finite) {
    struct batch b = {0};
    const float logp[] = {-1.0f, -500.0f, -3.0f};
    const double r[] = {1, 1, 1}, a[] = {-1, -1, 1};
    add_seq(&b, 3, logp, r, a, NULL);
    b.old[0] = -400.0f; /* log-ratio +399 */
    b.ref[1] = -1.0f;   /* k3 exponent +499 */
    b.roll[2] = 80.0f;  /* TIS log weight -83 */
    for (int t = 0; t < N_TYPES; t++) {
        struct rl_policy_config c = option_config(TYPES[t], RL_AGG_TOKEN_MEAN, 3);
        double coef[MAXT];
        struct rl_policy_stats st;
        double loss = run(&c, &b, norm_of(&b), coef, &st);
        cr_expect(isfinite(loss) && isfinite(coef[0]) && isfinite(coef[1]) && isfinite(coef[2]) &&
                      isfinite(st.ratio_max),
                  "%s: loss %g coef %g %g %g", rl_loss_type_to_name(&c.type), loss, coef[0], coef[1], coef[2]);
        if (c.type != RL_LOSS_GSPO && c.type != RL_LOSS_CISPO) {
            expect_near("ratio held at e^20", st.ratio_max, exp(RL_LOG_RATIO_CLAMP), 1e-15);
            cr_expect(coef[0] == 0.0, "%s: a clamped ratio is flat: coef %g", rl_loss_type_to_name(&c.type), coef[0]);
        }
        /* token 1: ratio 1, A = -1, its k3 exponent clamped (flat): only -r*A/3 is left
         * (GSPO: the sequence's mean log-ratio, 133, is clamped too: nothing) */
        expect_near(rl_loss_type_to_name(&c.type), coef[1], c.type == RL_LOSS_GSPO ? 0.0 : 1.0 / 3, 1e-15);
        expect_near("k3 held at e^20 - 20 - 1", st.kl_sum, expm1(RL_LOG_RATIO_CLAMP) - RL_LOG_RATIO_CLAMP, 1e-15);
    }
}

/* ---- the value loss ---- */

/* (v, old, R) with clip 0.2, the larger of (v-R)^2 and (clip(v, old +- 0.2) - R)^2, halved:
 * (1.0, 0.5, 0): 1 vs 0.49: plain, 0.5, slope 1; (0.2, 0.5, 1): 0.64 vs 0.49: plain, 0.32,
 * slope -0.8; (0.8, 0.5, 0): 0.64 vs 0.49: plain, 0.32, slope 0.8; (0.9, 0.5, 2): 1.21 vs
 * 1.69: clipped, 0.845, slope 0 (the clipped value does not move with v). Mean over 4. */
Test(rl_loss, value_loss_by_hand) {
    const float values[] = {1.0f, 0.2f, 0.8f, 0.9f, 7.0f}, old[] = {0.5f, 0.5f, 0.5f, 0.5f, 7.0f};
    const double returns[] = {0.0, 1.0, 0.0, 2.0, 9.0};
    const float mask[] = {1, 1, 1, 1, 0};
    const int64_t start[] = {0, 5};
    struct rl_value_batch b = {1, start, values, old, returns, mask};
    struct rl_value_config c = {.clip_range = 0.2, .agg = RL_AGG_TOKEN_MEAN};
    double dv[5];
    struct rl_value_stats st;
    struct smelt_error err;
    TEST_OK(rl_value_loss(&c, &b, (struct rl_norm){4, 1}, dv, &st, &err), &err);
    expect_near("value loss (by hand)", st.loss, (0.5 + 0.32 + 0.32 + 0.845) / 4, 1e-6);
    const double want[] = {1.0 / 4, -0.8 / 4, 0.8 / 4, 0.0, 0.0};
    for (int t = 0; t < 5; t++) expect_near("dL/dv", dv[t], want[t], 1e-6);
    cr_expect(st.clipped == 1 && st.n_tokens == 4);
    expect_near("value mean", st.value_sum / 4, (1.0 + 0.2 + 0.8 + 0.9) / 4, 1e-6);
    c.clip_range = 0; /* off: plain squared error */
    TEST_OK(rl_value_loss(&c, &b, (struct rl_norm){4, 1}, dv, &st, &err), &err);
    expect_near("unclipped value loss", st.loss, (0.5 + 0.32 + 0.32 + 0.605) / 4, 1e-6);
    cr_expect(st.clipped == 0);
}

struct value_fd {
    struct rl_value_config c;
    struct rl_value_batch b;
    float *values;
    struct rl_norm norm;
};

static double value_loss_of(struct value_fd *f) {
    double dv[MAXT];
    struct rl_value_stats st;
    struct smelt_error err;
    TEST_OK(rl_value_loss(&f->c, &f->b, f->norm, dv, &st, &err), &err);
    return st.loss;
}

Test(rl_loss, value_coefficients_match_finite_differences) {
    struct test_rng rng = {77};
    float values[12], old[12], mask[12];
    double returns[12];
    const int64_t start[] = {0, 5, 12};
    for (int t = 0; t < 12; t++) {
        mask[t] = t == 0 || t == 7 ? 0.0f : 1.0f;
        old[t] = (float)grid(&rng, -2, 2);
        returns[t] = grid(&rng, -2, 2);
        for (;;) { /* away from |v - old| = clip and from the tie between the two terms */
            values[t] = (float)grid(&rng, -2, 2);
            double v = values[t], vc = fmin(fmax(v, old[t] - 0.25), old[t] + 0.25);
            bool inside = vc == v;
            if (fabs(fabs(v - old[t]) - 0.25) > 4 * FD_H &&
                (inside || fabs(fabs(vc - returns[t]) - fabs(v - returns[t])) > 8 * FD_H))
                break;
        }
    }
    for (int g = 0; g < N_AGGS; g++) {
        struct value_fd f = {{0.25, AGGS[g], 8}, {2, start, values, old, returns, mask}, values, {0, 0}};
        struct smelt_error err;
        TEST_OK(rl_norm_accumulate(&f.norm, 2, start, mask, &err), &err);
        double dv[12];
        struct rl_value_stats st;
        TEST_OK(rl_value_loss(&f.c, &f.b, f.norm, dv, &st, &err), &err);
        cr_expect(st.clipped > 0 && st.clipped < st.n_tokens, "both branches seen: %lld", (long long)st.clipped);
        for (int t = 0; t < 12; t++) {
            float saved = values[t];
            values[t] = saved + (float)FD_H;
            double lp = value_loss_of(&f);
            values[t] = saved - (float)FD_H;
            double lm = value_loss_of(&f);
            values[t] = saved;
            double fd = (lp - lm) / (2 * FD_H);
            cr_expect(fabs(dv[t] - fd) <= 1e-9 + 1e-7 * fabs(fd), "%s token %d: dv %.12g fd %.12g",
                      rl_loss_agg_to_name(&AGGS[g]), t, dv[t], fd);
        }
    }
}

/* ---- advantages ---- */

Test(rl_advantage, group_relative_by_hand) {
    const double rewards[] = {1, 0, 0, 1, 2, 2, 2, 2, 3, 1, 0, 0};
    double out[12];
    struct smelt_error err;
    TEST_OK(rl_group_advantages(rewards, 3, 4, true, 1e-4, out, &err), &err);
    /* mean 0.5, unbiased std sqrt(1/3): 0.5 / (0.57735 + 1e-4) */
    const double want[] = {0.8658754297607016, -0.8658754297607016, -0.8658754297607016, 0.8658754297607016,
                           0, 0, 0, 0, 1.4141135694436628, 0.0, -0.7070567847218314, -0.7070567847218314};
    for (int i = 0; i < 12; i++) expect_near("grpo advantage (python3)", out[i], want[i], 1e-14);
    TEST_OK(rl_group_advantages(rewards, 3, 4, false, 0.0, out, &err), &err); /* Dr. GRPO: mean only */
    const double centred[] = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 2, 0, -1, -1};
    for (int i = 0; i < 12; i++) expect_near("dr_grpo advantage", out[i], centred[i], 1e-15);
    double inplace[4] = {1, 0, 0, 1};
    TEST_OK(rl_group_advantages(inplace, 1, 4, true, 1e-4, inplace, &err), &err);
    expect_near("in place", inplace[0], want[0], 1e-15);
}

Test(rl_advantage, rloo_by_hand) {
    const double rewards[] = {1, 0, 0, 1, 3, 1, 0, 0};
    double out[8];
    struct smelt_error err;
    TEST_OK(rl_rloo_advantages(rewards, 2, 4, out, &err), &err);
    const double want[] = {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3, 8.0 / 3, 0, -4.0 / 3, -4.0 / 3};
    for (int i = 0; i < 8; i++) expect_near("rloo advantage", out[i], want[i], 1e-15);
    /* veRL's form: r * k/(k-1) - mean * k/(k-1) */
    for (int i = 4; i < 8; i++) expect_near("rloo, veRL's form", out[i], rewards[i] * 4 / 3 - 1.0 * 4 / 3, 1e-15);
}

Test(rl_advantage, degenerate_groups) {
    const double same[] = {0.5, 0.5, 0.5}, mixed[] = {1, 1, 0}, nan_group[] = {NAN, NAN};
    cr_expect(rl_group_is_degenerate(same, 3));
    cr_expect(!rl_group_is_degenerate(mixed, 3));
    cr_expect(rl_group_is_degenerate(mixed, 2), "the first two are equal");
    cr_expect(!rl_group_is_degenerate(nan_group, 2), "NaN never equals");
    double out[3];
    struct smelt_error err;
    TEST_OK(rl_group_advantages(same, 1, 3, true, 1e-6, out, &err), &err);
    cr_expect(out[0] == 0 && out[1] == 0 && out[2] == 0, "a degenerate group has no signal");
}

/* GAE's definition, O(n^2): over the trained positions p_0 < p_1 < ..., delta_j =
 * r(p_j) + gamma V(p_{j+1}) - V(p_j) and A(p_j) = sum_{l >= j} (gamma lambda)^(l-j) delta_l. */
static void gae_direct(const float *v, const double *r, const float *mask, int n, double gamma, double lambda,
                       double *adv, double *ret) {
    int pos[MAXT], k = 0;
    for (int t = 0; t < n; t++) {
        adv[t] = ret[t] = 0;
        if (mask[t]) pos[k++] = t;
    }
    for (int j = 0; j < k; j++) {
        double sum = 0;
        for (int l = j; l < k; l++) {
            double next = l + 1 < k ? v[pos[l + 1]] : 0.0;
            sum += pow(gamma * lambda, l - j) * (r[pos[l]] + gamma * next - v[pos[l]]);
        }
        adv[pos[j]] = sum;
        ret[pos[j]] = sum + v[pos[j]];
    }
}

Test(rl_advantage, gae_by_hand) {
    const float v[] = {0.5f, 0.25f, 0.125f}, mask[] = {1, 1, 1};
    const double r[] = {0, 0, 1};
    double adv[3], ret[3];
    struct smelt_error err;
    TEST_OK(rl_gae(v, r, mask, 3, 1.0, 1.0, adv, ret, &err), &err);
    const double a1[] = {0.5, 0.75, 0.875};
    for (int t = 0; t < 3; t++) {
        expect_near("gae gamma 1 lambda 1", adv[t], a1[t], 1e-15);
        expect_near("returns: the reward-to-go", ret[t], 1.0, 1e-15);
    }
    TEST_OK(rl_gae(v, r, mask, 3, 0.5, 0.5, adv, ret, &err), &err);
    const double a2[] = {-0.3671875, 0.03125, 0.875};
    for (int t = 0; t < 3; t++) expect_near("gae gamma .5 lambda .5", adv[t], a2[t], 1e-15);
}

Test(rl_advantage, gae_matches_its_definition) {
    struct test_rng rng = {3};
    for (int trial = 0; trial < 20; trial++) {
        int n = 1 + (int)(test_rng_uniform(&rng, 0, 40));
        float v[MAXT], mask[MAXT];
        double r[MAXT], adv[MAXT], ret[MAXT], want_adv[MAXT], want_ret[MAXT];
        for (int t = 0; t < n; t++) {
            v[t] = (float)test_rng_uniform(&rng, -2, 2);
            r[t] = test_rng_uniform(&rng, -1, 1);
            mask[t] = test_rng_uniform(&rng, 0, 1) < (t < 3 ? 0.2 : 0.85) ? 1.0f : 0.0f; /* prompt-ish start, gaps */
        }
        double gamma = trial % 4 == 0 ? 1.0 : test_rng_uniform(&rng, 0.5, 1), lambda = test_rng_uniform(&rng, 0, 1);
        struct smelt_error err;
        TEST_OK(rl_gae(v, r, mask, n, gamma, lambda, adv, ret, &err), &err);
        gae_direct(v, r, mask, n, gamma, lambda, want_adv, want_ret);
        for (int t = 0; t < n; t++) {
            expect_near("gae advantage", adv[t], want_adv[t], 1e-12);
            expect_near("gae return", ret[t], want_ret[t], 1e-12);
        }
    }
}

Test(rl_advantage, whitening) {
    struct test_rng rng = {9};
    double x[50], before[50];
    float mask[50];
    for (int t = 0; t < 50; t++) {
        x[t] = before[t] = test_rng_uniform(&rng, -3, 7);
        mask[t] = t % 7 == 3 ? 0.0f : 1.0f;
    }
    struct smelt_error err;
    TEST_OK(rl_whiten(x, mask, 50, true, &err), &err);
    double sum = 0, ss = 0, n = 0;
    for (int t = 0; t < 50; t++)
        if (mask[t]) sum += x[t], n++;
        else cr_expect(x[t] == before[t], "untrained element %d left alone", t);
    for (int t = 0; t < 50; t++)
        if (mask[t]) ss += (x[t] - sum / n) * (x[t] - sum / n);
    expect_near("whitened mean", sum / n, 0.0, 1e-14);
    expect_near("whitened unbiased std", sqrt(ss / (n - 1)), 1.0, 1e-8);
    double mean_before = 0;
    for (int t = 0; t < 50; t++)
        if (mask[t]) mean_before += before[t] / n;
    memcpy(x, before, sizeof x);
    TEST_OK(rl_whiten(x, mask, 50, false, &err), &err);
    sum = 0;
    for (int t = 0; t < 50; t++)
        if (mask[t]) sum += x[t];
    expect_near("shift_mean false keeps the mean", sum / n, mean_before, 1e-13);
}

/* Two sequences, beta 0.1, gamma 1. A: old - ref = 0.5, -0.25, reward 1; B: a prompt
 * token then two trained tokens with old = ref, reward 0. k1 token rewards: A -0.05,
 * 0.025 + 1; B 0, 0. Returns A 0.975, 1.025; B 0, 0; whitened over the 4 trained tokens. */
Test(rl_advantage, reinforce_pp_by_hand) {
    const float old[] = {-1.0f, -2.0f, -5.0f, -1.0f, -1.0f}, ref[] = {-1.5f, -1.75f, -3.0f, -1.0f, -1.0f};
    const float mask[] = {1, 1, 0, 1, 1};
    const int64_t start[] = {0, 2, 5};
    const double rewards[] = {1.0, 0.0};
    double adv[5], ret[5];
    struct smelt_error err;
    TEST_OK(rl_reinforce_pp_advantages(2, start, mask, old, ref, rewards, 0.1, RL_KL_K1, 1.0, adv, ret, &err), &err);
    const double want_ret[] = {0.975, 1.025, 0, 0, 0};
    const double want_adv[] = {0.8222104002572808, 0.9087588634422576, 0, -0.8654846318497693, -0.8654846318497693};
    for (int t = 0; t < 5; t++) {
        expect_near("reinforce++ return", ret[t], want_ret[t], 1e-14);
        expect_near("reinforce++ advantage (python3)", adv[t], want_adv[t], 1e-12);
    }
    /* k2: token rewards -0.1 * 0.125, -0.1 * 0.03125 + 1, then the same whitening. */
    TEST_OK(rl_reinforce_pp_advantages(2, start, mask, old, ref, rewards, 0.1, RL_KL_K2, 1.0, adv, ret, &err), &err);
    expect_near("k2 return 0", ret[0], -0.0125 + (1 - 0.003125), 1e-14);
    expect_near("k2 return 1", ret[1], 1 - 0.003125, 1e-14);
    double w[5] = {ret[0], ret[1], 0, 0, 0};
    TEST_OK(rl_whiten(w, mask, 5, true, &err), &err);
    for (int t = 0; t < 5; t++) expect_near("k2 advantage", adv[t], mask[t] ? w[t] : 0.0, 1e-15);
    /* gamma 0.5 discounts the final reward once per token back */
    TEST_OK(rl_reinforce_pp_advantages(2, start, mask, old, ref, rewards, 0.0, RL_KL_K1, 0.5, adv, ret, &err), &err);
    expect_near("discounted return", ret[0], 0.5, 1e-15);
    expect_near("discounted return, last", ret[1], 1.0, 1e-15);
}

Test(rl_advantage, token_rewards_put_the_reward_on_the_last_trained_token) {
    const float old[] = {-1, -1, -2, -1, -1}, ref[] = {-1, -1.5f, -1, -1, -1}, mask[] = {0, 1, 1, 0, 0};
    double out[5];
    struct smelt_error err;
    TEST_OK(rl_token_rewards(old, ref, mask, 5, 2.0, 0.5, RL_KL_K1, out, &err), &err);
    const double want[] = {0, -0.5 * 0.5, -0.5 * -1.0 + 2.0, 0, 0}; /* PPO's -beta * (old - ref) */
    for (int t = 0; t < 5; t++) expect_near("token reward", out[t], want[t], 1e-15);
    TEST_OK(rl_token_rewards(NULL, NULL, mask, 5, 2.0, 0.0, RL_KL_K3, out, &err), &err);
    cr_expect(out[1] == 0 && out[2] == 2.0, "beta 0 needs no logprobs");
}

/* ---- mismatch ---- */

Test(rl_loss, logprob_mismatch) {
    const float a[] = {-1.0f, -2.0f, -3.0f}, b[] = {-1.5f, -2.0f, NAN}, mask[] = {1, 1, 0};
    struct rl_mismatch m;
    struct smelt_error err;
    TEST_OK(rl_logprob_mismatch(a, b, mask, 3, &m, &err), &err);
    expect_near("mean |a-b|", m.mean_abs, 0.25, 1e-15);
    expect_near("max |a-b|", m.max_abs, 0.5, 1e-15);
    expect_near("k1: mean(b - a)", m.kl_k1, -0.25, 1e-15);
    expect_near("k3 (python3)", m.kl_k3, 0.0743606353500641, 1e-14);
    cr_expect(m.n_tokens == 2);
    TEST_OK(rl_logprob_mismatch(a, a, mask, 3, &m, &err), &err); /* the same kernels: exactly 0 */
    cr_expect(m.mean_abs == 0.0 && m.max_abs == 0.0 && m.kl_k1 == 0.0 && m.kl_k3 == 0.0);
}

/* ---- bad input ---- */

static void expect_policy_error(const struct rl_policy_config *c, const struct rl_seqs *s, struct rl_norm norm,
                                const char *needle) {
    double coef[MAXT];
    struct smelt_error err;
    TEST_EXPECT_ERROR(rl_policy_loss(c, s, norm, coef, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, needle), "message should name \"%s\": %s", needle, err.message);
}

Test(rl_loss, bad_policy_input) {
    struct batch b = random_batch(8);
    struct rl_norm norm = norm_of(&b);
    struct rl_policy_config c = option_config(RL_LOSS_GRPO, RL_AGG_TOKEN_MEAN, 2); /* beta and TIS on */
    struct rl_seqs s = seqs_of(&b);
    s.logp = NULL;
    expect_policy_error(&c, &s, norm, "logp is NULL");
    s = seqs_of(&b), s.old_logp = NULL;
    expect_policy_error(&c, &s, norm, "old_logp is NULL");
    s = seqs_of(&b), s.adv = NULL;
    expect_policy_error(&c, &s, norm, "adv is NULL");
    s = seqs_of(&b), s.ref_logp = NULL;
    expect_policy_error(&c, &s, norm, "ref_logp (beta > 0) is NULL");
    s = seqs_of(&b), s.rollout_logp = NULL;
    expect_policy_error(&c, &s, norm, "rollout_logp (tis_cap > 0) is NULL");
    s = seqs_of(&b), s.mask = NULL;
    expect_policy_error(&c, &s, norm, "mask is NULL");
    s = seqs_of(&b), s.n_seq = -1;
    expect_policy_error(&c, &s, norm, "n_seq is -1");
    s = seqs_of(&b), s.start = NULL;
    expect_policy_error(&c, &s, norm, "start is NULL");
    double coef[MAXT];
    struct smelt_error err;
    s = seqs_of(&b);
    TEST_EXPECT_ERROR(rl_policy_loss(&c, &s, norm, NULL, NULL, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_policy_loss(NULL, &s, norm, coef, NULL, &err), SMELT_EINVAL, &err);
    /* offsets */
    struct batch bad = b;
    bad.start[0] = 1;
    s = seqs_of(&bad);
    expect_policy_error(&c, &s, norm, "start[0] is 1");
    bad = b, bad.start[2] = bad.start[1] - 1;
    s = seqs_of(&bad);
    expect_policy_error(&c, &s, norm, "start[2]");
    bad = b, bad.mask[3] = 0.5f;
    s = seqs_of(&bad);
    expect_policy_error(&c, &s, norm, "mask[3] is 0.5");
    /* non-finite values at trained tokens, each named */
    int64_t k = b.start[1] + 2; /* trained, sequence 1 */
    cr_assert(b.mask[k] == 1.0f);
    struct {
        float *f;
        double *d;
        const char *name;
    } arrays[] = {{bad.logp, NULL, "logp"}, {bad.old, NULL, "old_logp"}, {bad.ref, NULL, "ref_logp"},
                  {bad.roll, NULL, "rollout_logp"}, {NULL, bad.adv, "adv"}};
    for (int i = 0; i < 5; i++) {
        bad = b;
        if (arrays[i].f) arrays[i].f[k] = i % 2 ? INFINITY : NAN;
        else arrays[i].d[k] = NAN;
        s = seqs_of(&bad);
        char needle[64];
        snprintf(needle, sizeof needle, "%s[%lld] (sequence 1)", arrays[i].name, (long long)k);
        expect_policy_error(&c, &s, norm, needle);
    }
    /* the norm must cover the micro-batch */
    s = seqs_of(&b);
    expect_policy_error(&c, &s, (struct rl_norm){norm.tokens - 1, norm.seqs}, "norm.tokens");
    struct rl_policy_config cs = option_config(RL_LOSS_GRPO, RL_AGG_SEQ_MEAN_TOKEN_MEAN, 0);
    expect_policy_error(&cs, &s, (struct rl_norm){norm.tokens, 1}, "norm.seqs");
    expect_policy_error(&cs, &s, (struct rl_norm){NAN, norm.seqs}, "finite");
}

static void expect_config_field(struct rl_policy_config c, const char *field) {
    struct smelt_error err;
    TEST_EXPECT_ERROR(rl_policy_config_check(&c, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, field, "%s", err.message);
    cr_expect(strstr(err.message, field), "message names %s: %s", field, err.message);
}

Test(rl_loss, config_out_of_range) {
    struct smelt_error err;
    for (int t = 0; t < N_TYPES; t++) {
        struct rl_policy_config ok = option_config(TYPES[t], AGGS[t % 3], t % N_OPTS);
        TEST_OK(rl_policy_config_check(&ok, &err), &err);
    }
    const struct rl_policy_config ok = option_config(RL_LOSS_GRPO, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, 1);
    const double bad_eps_low[] = {-0.1, 1.0, NAN}, bad_eps_high[] = {-0.01, INFINITY, NAN};
    const double bad_dual[] = {0.5, 1.0, INFINITY}, bad_beta[] = {-1e-3, NAN, INFINITY};
    const double bad_cap[] = {0.5, -1.0, INFINITY};
    for (int i = 0; i < 3; i++) {
        struct rl_policy_config c = ok;
        c.eps_low = bad_eps_low[i];
        expect_config_field(c, "eps_low");
        c = ok, c.eps_high = bad_eps_high[i];
        expect_config_field(c, "eps_high");
        c = ok, c.dual_clip = bad_dual[i];
        expect_config_field(c, "dual_clip");
        c = ok, c.beta = bad_beta[i];
        expect_config_field(c, "beta");
        c = ok, c.tis_cap = bad_cap[i];
        expect_config_field(c, "tis_cap");
    }
    struct rl_policy_config c = ok;
    c.max_completion_len = 0;
    expect_config_field(c, "max_completion_len");
    c = ok, c.type = (enum rl_loss_type)42;
    expect_config_field(c, "loss_type");
    c = ok, c.agg = (enum rl_loss_agg)-1;
    expect_config_field(c, "loss_agg");
    c = ok, c.kl_estimator = (enum rl_kl_estimator)3;
    expect_config_field(c, "kl_estimator");
    c = ok, c.tis_level = (enum rl_tis_level)2;
    expect_config_field(c, "tis_level");
    c = ok, c.tis_mode = (enum rl_tis_mode)2;
    expect_config_field(c, "tis_mode");
    c = ok, c.eps_low = 0.999, c.tis_cap = 1.0, c.dual_clip = 1.0001; /* the edges that are allowed */
    TEST_OK(rl_policy_config_check(&c, &err), &err);
}

Test(rl_advantage, bad_input) {
    const double r[] = {1, 2, 3, NAN};
    double out[4];
    struct smelt_error err;
    TEST_EXPECT_ERROR(rl_group_advantages(r, 1, 1, true, 1e-4, out, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "group_size is 1"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_group_advantages(r, 2, 2, true, 1e-4, out, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "rewards[3] (group 1) is nan"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_group_advantages(r, 1, 3, true, 0.0, out, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "eps"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_group_advantages(NULL, 1, 3, true, 1e-4, out, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_group_advantages(r, -1, 3, true, 1e-4, out, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_rloo_advantages(r, 1, 3, NULL, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_rloo_advantages(r, 1, 1, out, &err), SMELT_EINVAL, &err);

    const float v[] = {0.1f, NAN, 0.3f}, mask[] = {1, 1, 1}, gap[] = {1, 0, 1};
    const double tr[] = {0, 0, 1};
    double adv[3], ret[3];
    TEST_EXPECT_ERROR(rl_gae(v, tr, mask, 3, 1.5, 1.0, adv, ret, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "gamma is 1.5"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_gae(v, tr, gap, 3, 1.0, -0.1, adv, ret, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "lambda"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_gae(v, tr, mask, 3, 1.0, 1.0, adv, ret, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "values[1]"), "%s", err.message);
    TEST_OK(rl_gae(v, tr, gap, 3, 1.0, 1.0, adv, ret, &err), &err); /* values[1] is untrained there */
    TEST_EXPECT_ERROR(rl_gae(NULL, tr, mask, 3, 1.0, 1.0, adv, ret, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_gae(v, tr, mask, -2, 1.0, 1.0, adv, ret, &err), SMELT_EINVAL, &err);

    double x[3] = {1, 2, 3};
    const float one[] = {0, 1, 0};
    TEST_EXPECT_ERROR(rl_whiten(x, one, 3, true, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "at least 2"), "%s", err.message);

    const float old[] = {-1, -1, -1}, ref[] = {-1, -1, -1};
    TEST_EXPECT_ERROR(rl_token_rewards(old, NULL, mask, 3, 1.0, 0.1, RL_KL_K1, out, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "ref_logp"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_token_rewards(old, ref, mask, 3, NAN, 0.1, RL_KL_K1, out, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_token_rewards(old, ref, mask, 3, 1.0, -0.1, RL_KL_K1, out, &err), SMELT_EINVAL, &err);
    const int64_t start[] = {0, 3};
    TEST_EXPECT_ERROR(rl_reinforce_pp_advantages(1, start, mask, old, ref, NULL, 0.1, RL_KL_K1, 1.0, adv, ret, &err),
                      SMELT_EINVAL, &err);
    const int64_t bad_start[] = {0, 4, 3};
    const double two[] = {1, 0};
    TEST_EXPECT_ERROR(rl_reinforce_pp_advantages(2, bad_start, mask, old, ref, two, 0.1, RL_KL_K1, 1.0, adv, ret, &err),
                      SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "rl_reinforce_pp_advantages") && strstr(err.message, "start[2]"), "%s",
              err.message);

    const int64_t vstart[] = {0, 3};
    const double returns[] = {0, 0, 0};
    struct rl_value_batch vb = {1, vstart, v, v, returns, gap};
    struct rl_value_config vc = {.clip_range = -0.2, .agg = RL_AGG_TOKEN_MEAN};
    TEST_EXPECT_ERROR(rl_value_loss(&vc, &vb, (struct rl_norm){2, 1}, adv, NULL, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "clip_range");
    vc.clip_range = 0.2;
    vb.returns = NULL;
    TEST_EXPECT_ERROR(rl_value_loss(&vc, &vb, (struct rl_norm){2, 1}, adv, NULL, &err), SMELT_EINVAL, &err);
    vb.returns = returns;
    TEST_EXPECT_ERROR(rl_value_loss(&vc, &vb, (struct rl_norm){1, 1}, adv, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "norm.tokens"), "%s", err.message);

    struct rl_mismatch m;
    TEST_EXPECT_ERROR(rl_logprob_mismatch(old, NULL, mask, 3, &m, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(rl_logprob_mismatch(old, v, mask, 3, &m, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "b[1]"), "%s", err.message);
}

/* ---- the Tinker API's summed losses: rl_token_loss, and PPO through RL_AGG_SUM ---- */

static const float TK_LOGP[] = {-0.5f, -2.0f, -1.25f, -0.1f, -3.0f};
static const float TK_Q[] = {-0.7f, -1.0f, -1.25f, -0.4f, -2.5f};
static const float TK_ADV[] = {1.0f, -0.5f, 2.0f, -1.5f, 0.25f};
static const float TK_W[] = {0.0f, 1.0f, 0.5f, 1.0f, 2.0f};
#define TK_N 5

static struct rl_token_inputs tk_inputs(const float *logp) {
    return (struct rl_token_inputs){.n = TK_N, .logp = logp, .weights = TK_W, .sampling_logp = TK_Q, .adv = TK_ADV,
                                    .clip_low = 0.8, .clip_high = 1.2, .beta = 0.3};
}

/* The per-token loss as the Tinker docs write it, in double. */
static double tk_closed(enum rl_token_loss type, int t, double logp) {
    double q = TK_Q[t], a = TK_ADV[t], r = exp(logp - q);
    switch (type) {
    case RL_TOKEN_CROSS_ENTROPY: return -(double)TK_W[t] * logp;
    case RL_TOKEN_IMPORTANCE_SAMPLING: return -r * a;
    case RL_TOKEN_CISPO: return -fmin(fmax(r, 0.8), 1.2) * a * logp;
    default: return -(logp * a - 0.5 * 0.3 * (logp - q) * (logp - q));
    }
}

Test(rl_loss, token_losses_match_the_tinker_formulas) {
    for (int type = RL_TOKEN_CROSS_ENTROPY; type <= RL_TOKEN_DRO; type++) {
        struct rl_token_inputs in = tk_inputs(TK_LOGP);
        double coef[TK_N], el[TK_N], loss, want = 0;
        struct smelt_error err;
        TEST_OK(rl_token_loss((enum rl_token_loss)type, &in, coef, el, &loss, &err), &err);
        for (int t = 0; t < TK_N; t++) {
            double l = tk_closed((enum rl_token_loss)type, t, TK_LOGP[t]);
            expect_near("elementwise", el[t], l, 1e-12);
            want += l;
            /* CISPO's ratio is a stop-gradient: its coefficient is the clipped weight times -A. */
            double r = exp((double)TK_LOGP[t] - TK_Q[t]);
            double d = type == RL_TOKEN_CISPO
                           ? -fmin(fmax(r, 0.8), 1.2) * TK_ADV[t]
                           : (tk_closed((enum rl_token_loss)type, t, TK_LOGP[t] + 1e-6) -
                              tk_closed((enum rl_token_loss)type, t, TK_LOGP[t] - 1e-6)) / 2e-6;
            expect_near("coef", coef[t], d, type == RL_TOKEN_CISPO ? 1e-12 : 1e-6);
        }
        expect_near("loss", loss, want, 1e-12);
    }
}

Test(rl_loss, cispo_clips_both_sides) {
    /* r = e^{0.2} > 1.2 (capped), e^{-0.3} < 0.8 (floored), e^0 = 1 (as is). */
    float logp[] = {-1.0f, -1.0f, -1.0f}, q[] = {-1.2f, -0.7f, -1.0f}, adv[] = {1.0f, 1.0f, 1.0f};
    struct rl_token_inputs in = {.n = 3, .logp = logp, .sampling_logp = q, .adv = adv, .clip_low = 0.8,
                                 .clip_high = 1.2};
    double coef[3], loss;
    struct smelt_error err;
    TEST_OK(rl_token_loss(RL_TOKEN_CISPO, &in, coef, NULL, &loss, &err), &err);
    expect_near("capped", coef[0], -1.2, 1e-12);
    expect_near("floored", coef[1], -0.8, 1e-12);
    expect_near("inside", coef[2], -1.0, 1e-12);
    expect_near("loss", loss, (1.2 + 0.8 + 1.0) * 1.0, 1e-12);
}

Test(rl_loss, ppo_sum_aggregation_is_the_plain_sum) {
    /* Tinker's ppo: -sum min(r A, clip(r, 0.8, 1.2) A), no denominator. */
    struct batch b = {0};
    float logp[TK_N];
    double ratio[TK_N], adv[TK_N];
    for (int t = 0; t < TK_N; t++) {
        logp[t] = TK_LOGP[t];
        ratio[t] = exp((double)TK_LOGP[t] - TK_Q[t]);
        adv[t] = TK_ADV[t];
    }
    add_seq(&b, 3, logp, ratio, adv, NULL);
    add_seq(&b, 2, logp + 3, ratio + 3, adv + 3, NULL);
    struct rl_policy_config c = config(RL_LOSS_GRPO);
    c.agg = RL_AGG_SUM;
    double coef[TK_N], want = 0;
    double loss = run(&c, &b, (struct rl_norm){0, 0}, coef, NULL);
    for (int t = 0; t < TK_N; t++) {
        double r = exp((double)b.logp[t] - b.old[t]), a = adv[t];
        want += -fmin(r * a, fmin(fmax(r, 0.8), 1.2) * a);
    }
    expect_near("ppo sum", loss, want, 1e-12);
    struct smelt_error err;
    void *v = &c.agg;
    TEST_OK(rl_loss_agg_from_name("sum", v, &err), &err);
    cr_expect_eq(c.agg, RL_AGG_SUM);
}

Test(rl_loss, token_loss_refuses_bad_input) {
    struct smelt_error err;
    double coef[TK_N], loss;
    struct rl_token_inputs in = tk_inputs(TK_LOGP);
    in.weights = NULL;
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_CROSS_ENTROPY, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "weights");
    in = tk_inputs(TK_LOGP);
    in.adv = NULL;
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_DRO, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "advantages");
    in = tk_inputs(TK_LOGP);
    in.clip_high = 0.5;
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_CISPO, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "clip_high_threshold");
    in = tk_inputs(TK_LOGP);
    in.beta = -1;
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_DRO, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "beta");
    float bad[TK_N] = {-1, -1, NAN, -1, -1};
    in = tk_inputs(bad);
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_IMPORTANCE_SAMPLING, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "logp[2]"), "%s", err.message);
    float huge[TK_N] = {-1, 800, -1, -1, -1};
    in = tk_inputs(huge);
    TEST_EXPECT_ERROR(rl_token_loss(RL_TOKEN_IMPORTANCE_SAMPLING, &in, coef, NULL, &loss, &err), SMELT_EINVAL, &err);
}
