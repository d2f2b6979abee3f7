/* trainer/ PPO: the spec's ppo fields, their defaults and what a ppo (and a grpo) job
 * refuses; the critic's model refused when it has no score head; a short colocated run
 * logging every metric finite and saving its critic as a reward model; the critic's
 * step gradient through the packing (several micro-batches) against central finite
 * differences of a float64 closed form of the clipped value loss over samples run one
 * at a time; exact resume (full policy, and a LoRA policy with the KL in the reward and
 * four steps per iteration); the split placement giving the colocated run; PPO raising
 * an easy reward. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/score_head.h"
#include "testutil.h"
#include "trainer/trainer_internal.h"
#include "rl_testutil.h"
#include "trainer_testutil.h"

/* ---- data, specs, runs (rl_testutil.h) ---- */

static void run_ppo(const struct test_run_paths *p, const char *out, const char *extra,
                    const struct trainer_options *o, struct trainer_result *res) {
    rl_test_run(p, "ppo", out, extra, o, res);
}

static const struct trainer_options quiet = {.quiet = true};

/* ---- (1) the spec ---- */

#define MINIMAL_PPO "\"rl\":{" RL_TEST_REWARD_MIXED "},"

Test(ppo, spec_defaults_and_round_trip) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec, back;
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out, MINIMAL_PPO, &spec, &err), &err);
    cr_expect_eq(spec.type, JOB_PPO);
    cr_expect_str_eq(job_type_name(spec.type), "ppo");
    cr_expect_eq(spec.rl.num_generations, 1, "ppo needs no group");
    cr_expect_eq(spec.rl.advantage_estimator, RL_ADV_GAE);
    cr_expect(spec.rl.kl_in_reward, "the KL goes in the reward by default");
    cr_expect_eq(spec.rl.kl_estimator, RL_KL_K1, "k1 in the reward");
    cr_expect(spec.rl.gamma == 1.0 && spec.rl.lambda == 0.95 && spec.rl.value_clip == 0.2, "gamma %g lambda %g clip %g",
              spec.rl.gamma, spec.rl.lambda, spec.rl.value_clip);
    cr_expect(spec.rl.critic_learning_rate == 9e-6 && spec.rl.whiten_advantages &&
              spec.rl.critic_warmup_iterations == 0 && spec.rl.critic_model[0] == 0);
    cr_expect(spec.rl.beta == 0 && spec.rl.loss_type == RL_LOSS_DAPO);

    /* beta with the KL in the reward: not in the policy loss; as a loss (k3 then). */
    struct rl_policy_config c;
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out, "\"rl\":{\"beta\":0.05," RL_TEST_REWARD_MIXED "},", &spec,
                              &err),
            &err);
    job_rl_loss_config(&spec, &c);
    cr_expect(c.beta == 0 && spec.rl.beta == 0.05, "loss beta %g", c.beta);
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out,
                              "\"rl\":{\"beta\":0.05,\"kl_in_reward\":false," RL_TEST_REWARD_MIXED "},", &spec, &err),
            &err);
    job_rl_loss_config(&spec, &c);
    cr_expect(c.beta == 0.05 && spec.rl.kl_estimator == RL_KL_K3, "loss beta %g, estimator %d", c.beta,
              (int)spec.rl.kl_estimator);
    /* A grpo job keeps its own defaults. */
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, MINIMAL_PPO, &spec, &err), &err);
    cr_expect(spec.rl.num_generations == 8 && spec.rl.advantage_estimator == RL_ADV_GRPO && !spec.rl.kl_in_reward &&
              spec.rl.kl_estimator == RL_KL_K3);

    char critic[600];
    snprintf(critic, sizeof critic, "%s", p.model);
    static const char *const fmt[] = {
        MINIMAL_PPO,
        "\"rl\":{\"num_generations\":3,\"minibatches\":2,\"ppo_epochs\":2,\"beta\":0.02,\"kl_estimator\":\"k2\","
        "\"critic_learning_rate\":0.001,\"gamma\":0.99,\"lambda\":1,\"value_clip\":0,\"whiten_advantages\":false,"
        "\"critic_warmup_iterations\":2,\"critic_model\":\"%s\",\"placement\":\"split\"," RL_TEST_REWARD_MIXED "},",
        "\"rl\":{\"kl_in_reward\":false,\"beta\":0.1," RL_TEST_REWARD_MIXED "},",
    };
    for (size_t i = 0; i < sizeof fmt / sizeof *fmt; i++) {
        char extra[2048];
        snprintf(extra, sizeof extra, fmt[i], critic);
        TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out, extra, &spec, &err), &err);
        void *j;
        TEST_OK(job_spec_to_json(&spec, &j, &err), &err);
        cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "ppo");
        json_t *rl = json_object_get(j, "rl");
        cr_assert(json_is_object(rl));
        for (int f = 0; f < JOB_N_RL_FIELDS; f++)
            cr_expect(json_object_get(rl, JOB_RL_FIELDS[f].name), "rl.%s not written", JOB_RL_FIELDS[f].name);
        cr_expect(json_object_get(rl, "critic_model"), "rl.critic_model not written");
        memset(&back, 0xa5, sizeof back);
        TEST_OK(job_spec_from_json(j, "round trip", &back, &err), &err);
        cr_expect_eq(memcmp(&spec, &back, sizeof spec), 0, "spec %zu changed through JSON", i);
        json_decref(j);
    }
    cr_expect_str_eq(spec.rl.critic_model, "", "the last spec names no critic");
    test_tmp_teardown();
}

Test(ppo, spec_refusals_name_the_field) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    static const struct rl_test_refusal refused[] = {
        {"ppo", "\"rl\":{\"advantage_estimator\":\"grpo\"," RL_TEST_REWARD_MIXED "},", "rl.advantage_estimator",
         "rl.advantage_estimator: a ppo job's advantages come from its critic"},
        {"ppo", "\"rl\":{\"advantage_estimator\":\"rloo\"," RL_TEST_REWARD_MIXED "},", "rl.advantage_estimator",
         "\"rloo\""},
        {"ppo", "\"rl\":{\"dynamic_sampling\":true," RL_TEST_REWARD_MIXED "},", "rl.dynamic_sampling",
         "rl.dynamic_sampling"},
        {"ppo", "\"rl\":{\"gamma\":1.5," RL_TEST_REWARD_MIXED "},", "rl.gamma", "rl: field 'gamma'"},
        {"ppo", "\"rl\":{\"lambda\":-0.1," RL_TEST_REWARD_MIXED "},", "rl.lambda", "rl: field 'lambda'"},
        {"ppo", "\"rl\":{\"value_clip\":-1," RL_TEST_REWARD_MIXED "},", "rl.value_clip", "rl: field 'value_clip'"},
        {"ppo", "\"rl\":{\"critic_learning_rate\":0," RL_TEST_REWARD_MIXED "},", "rl.critic_learning_rate",
         "rl.critic_learning_rate"},
        {"ppo", "\"rl\":{\"critic_warmup_iterations\":-1," RL_TEST_REWARD_MIXED "},", "rl.critic_warmup_iterations",
         "rl: field 'critic_warmup_iterations'"},
        {"ppo", "\"rl\":{\"whiten_advantages\":1," RL_TEST_REWARD_MIXED "},", "rl.whiten_advantages",
         "rl: field 'whiten_advantages'"},
        {"ppo", "\"rl\":{\"critic_model\":3," RL_TEST_REWARD_MIXED "},", "rl.critic_model", "rl.critic_model"},
        {"ppo", "\"rl\":{\"critic\":\"x\"," RL_TEST_REWARD_MIXED "},", "rl.critic", "rl: unknown field 'critic'"},
        {"ppo", "\"rl\":{\"num_generations\":0," RL_TEST_REWARD_MIXED "},", "rl.num_generations",
         "rl: field 'num_generations'"},
        {"ppo", "\"rl\":{},", "rl.reward", "rl.reward"},
        /* a grpo job has no critic, and its groups still need 2 */
        {"grpo", "\"rl\":{\"gamma\":0.9," RL_TEST_REWARD_MIXED "},", "rl.gamma", "rl.gamma: a ppo job's field"},
        {"grpo", "\"rl\":{\"kl_in_reward\":true," RL_TEST_REWARD_MIXED "},", "rl.kl_in_reward", "rl.kl_in_reward"},
        {"grpo", "\"rl\":{\"critic_model\":\"x\"," RL_TEST_REWARD_MIXED "},", "rl.critic_model", "rl.critic_model"},
        {"grpo", "\"rl\":{\"num_generations\":1," RL_TEST_REWARD_MIXED "},", "rl.num_generations",
         "rl: field 'num_generations'"},
        {"sft", "\"rl\":{\"gamma\":0.9},", "rl", "rl: only a grpo job or a ppo job"},
    };
    rl_test_expect_refusals(&p, refused, sizeof refused / sizeof *refused);
    test_tmp_teardown();
}

#define RUN_RL(more)                                                                               \
    "\"hyperparameters\":{\"batch_size\":2},\"rl\":{\"max_new_tokens\":3,\"kv_memory_mb\":2," more \
    RL_TEST_REWARD_MIXED "},"

/* The critic's model must be a reward model with the policy's vocabulary. */
Test(ppo, critic_model_refusals) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    char extra[2048], missing[600];
    snprintf(extra, sizeof extra, RUN_RL("\"critic_model\":\"%s\","), p.model); /* a causal LM */
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out, extra, &spec, &err), &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "rl.critic_model", "%s", err.message);
    cr_expect(strstr(err.message, "score head") && strstr(err.message, p.model), "%s", err.message);

    snprintf(missing, sizeof missing, "%s/none", p.model);
    snprintf(extra, sizeof extra, RUN_RL("\"critic_model\":\"%s\","), missing);
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out, extra, &spec, &err), &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_ENOTFOUND, &err);
    cr_expect(strstr(err.message, "rl.critic_model") && strstr(err.message, missing), "%s", err.message);
    test_tmp_teardown();
}

/* ---- (2) a short colocated run ---- */

#define SHORT_PPO(more)                                                                                         \
    "\"hyperparameters\":{\"batch_size\":3,\"learning_rate\":0.01},\"rl\":{" more "\"num_generations\":2,"      \
    "\"max_new_tokens\":4,\"max_iterations\":3,\"kv_memory_mb\":2,\"temperature\":0.8,\"beta\":0.05,"           \
    "\"critic_learning_rate\":0.003," RL_TEST_REWARD_MIXED "},"

Test(ppo, a_short_colocated_run_logs_every_metric) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_ppo(&p, p.out, SHORT_PPO(""), &quiet, &res);
    cr_expect_eq(res.steps, 3);
    json_t *tr[8];
    int n = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n, 3);
    static const char *const keys[] = {
        "loss", "grad_norm", "reward", "reward_std", "kl", "ppo_kl", "ratio_mean", "critic/value_mean",
        "critic/vf_loss", "critic/vf_clipfrac", "critic/returns_mean", "critic/advantages_mean", "critic/vpred_mean",
        "critic/grad_norm", "time/critic_s", "time/update_s", "time/reference_s", "rollout/logprob_diff_mean"};
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            const json_t *v = json_object_get(tr[i], keys[k]);
            cr_expect(json_is_number(v) && isfinite(json_number_value(v)), "iteration %d: %s is not a finite number",
                      i + 1, keys[k]);
        }
        cr_expect_eq(json_integer_value(json_object_get(tr[i], "samples")), 6);
        cr_expect(json_number_value(json_object_get(tr[i], "critic/grad_norm")) > 0, "iteration %d: the critic did not "
                  "learn", i + 1);
        double vf = json_number_value(json_object_get(tr[i], "critic/vf_clipfrac"));
        cr_expect(vf >= 0 && vf <= 1, "vf_clipfrac %g", vf);
        cr_expect(json_is_null(json_object_get(tr[i], "frac_reward_zero_std")), "ppo has no groups");
    }
    /* The first iteration's policy is the reference: its KL (in the reward) is 0. */
    cr_expect_eq(json_number_value(json_object_get(tr[0], "kl")), 0.0);
    test_free_lines(tr, n);

    /* output/critic: a reward model's directory (loads as a classifier, scores), trained away from its start. */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/output/critic", p.out);
    struct smelt_error err = {0};
    struct model *critic, *start;
    TEST_OK(model_load(dir, BACKEND_CPU, &critic, &err), &err);
    cr_expect(critic->config.score_head && !critic->w.lm_head.data, "output/critic is not a sequence classifier");
    snprintf(dir, sizeof dir, "%s/output/critic/tokenizer.json", p.out);
    cr_expect(path_exists(dir), "no tokenizer beside the critic");
    TEST_OK(model_load(p.model, BACKEND_CPU, &start, &err), &err);
    const struct model_param *emb = model_param_find(critic, "model.embed_tokens.weight");
    cr_assert(emb);
    cr_expect_neq(memcmp((float *)critic->weights.data + emb->offset, start->w.wte.data,
                         (size_t)emb->numel * sizeof(float)), 0, "the critic's body did not train");
    model_free(critic);
    model_free(start);
    test_tmp_teardown();
}

/* Critic warmup: the policy does not step in the first iterations (its train lines say
 * no update), the critic does. */
Test(ppo, critic_warmup_leaves_the_policy) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_ppo(&p, p.out, SHORT_PPO("\"critic_warmup_iterations\":2,"), &quiet, &res);
    double gn[4], cgn[4];
    cr_assert_eq(rl_test_train_values(p.out, "grad_norm", gn, NULL, 4), 3);
    cr_assert_eq(rl_test_train_values(p.out, "critic/grad_norm", cgn, NULL, 4), 3);
    cr_expect(gn[0] == 0 && gn[1] == 0 && gn[2] > 0, "policy grad_norm %g %g %g", gn[0], gn[1], gn[2]);
    cr_expect(cgn[0] > 0 && cgn[1] > 0 && cgn[2] > 0, "critic grad_norm %g %g %g", cgn[0], cgn[1], cgn[2]);
    test_tmp_teardown();
}

/* ---- (3) the critic's gradient through the packing ---- */

/* The critic's values of samples s[0..n)' generated tokens run one at a time (nothing
 * packed), in float64 from the hidden states: score.weight . hidden[n_prompt - 1 + j]. */
static void unpacked_values(struct trainer_run *r, const struct rl_sample *s, int n, const int64_t *start,
                            double *out) {
    struct critic *c = r->rl->critic;
    int64_t C = c->model->config.hidden_size;
    const float *w = c->model->w.score.data;
    for (int i = 0; i < n; i++) {
        const struct dataset_prompt *p = &r->train->prompts[s[i].row];
        float *hidden = rl_test_forward_alone(c->model, c->acts, p, &s[i], true);
        for (int64_t j = 0; j < s[i].n; j++) {
            double v = 0;
            for (int64_t k = 0; k < C; k++) v += (double)w[k] * hidden[(p->n - 1 + j) * C + k];
            out[start[i] + j] = v;
        }
        free(hidden);
    }
}

/* The clipped value loss, token mean, in float64 (rl_loss.h's formula). */
static double closed_form_vloss(int64_t n_tok, const double *v, const float *old, const double *ret, double eps) {
    double total = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        double clipped = old[t] + fmin(fmax(v[t] - old[t], -eps), eps);
        double a = (v[t] - ret[t]) * (v[t] - ret[t]), b = (clipped - ret[t]) * (clipped - ret[t]);
        total += 0.5 * fmax(a, b);
    }
    return total / (double)n_tok;
}

struct vcase {
    struct trainer_run *r;
    struct rl_sample *s;
    int n;
    const int64_t *start;
    double eps;
};

static double vloss(const struct vcase *g) {
    struct critic *c = g->r->rl->critic;
    double v[64];
    unpacked_values(g->r, g->s, g->n, g->start, v);
    return closed_form_vloss(g->start[g->n], v, c->old, c->returns, g->eps);
}

Test(ppo, critic_gradient_matches_finite_differences) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec;
    /* batch_tokens 20: the six samples (5 to 11 tokens each) take several micro-batches. */
    TEST_OK(rl_test_load_spec(&p, "ppo", p.train, p.out,
                              "\"hyperparameters\":{\"batch_size\":2,\"batch_tokens\":20},"
                              "\"rl\":{\"num_generations\":4,\"max_new_tokens\":4,\"value_clip\":0.05,"
                              RL_TEST_REWARD_MIXED "},",
                              &spec, &err), &err);
    spec.data.max_seq_len = 20; /* the spec's data section is rl_test_load_spec's */
    struct trainer_run r = {.spec = &spec, .quiet = true, .algo = &PPO_ALGO};
    TEST_OK(run_setup(&r, &err), &err);
    TEST_OK(PPO_ALGO.prepare(&r, &err), &err);
    struct rl_state *rl = r.rl;
    struct critic *c = rl->critic;
    cr_assert(c && c->model->config.score_head);
    float *w = c->model->weights.data;
    struct test_rng rng = {31};
    for (int64_t i = 0; i < c->model->n_weights; i++) w[i] += (float)test_rng_uniform(&rng, -0.2, 0.2);

    enum { N = 6 };
    static const int64_t rows[N] = {0, 0, 1, 2, 3, 5}, lens[N] = {1, 4, 2, 3, 4, 2};
    int32_t ids[N][4];
    struct rl_sample s[N];
    int64_t start[N + 1] = {0};
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 4; j++) ids[i][j] = (int32_t)(test_rng_next(&rng) % 256);
        s[i] = (struct rl_sample){.row = rows[i], .ids = ids[i], .n = lens[i], .off = start[i], .trained = true};
        start[i + 1] = start[i] + lens[i];
        rl->trained[i] = s[i];
        rl->start[i] = start[i];
    }
    rl->start[N] = start[N];
    int64_t n_tok = start[N];
    /* Old values near the current ones (inside the clip range 0.05) or far from them (on
     * every third token: the clipped term may win), returns anywhere. */
    double v0[64];
    unpacked_values(&r, s, N, start, v0);
    for (int64_t t = 0; t < n_tok; t++) {
        rl->mask[t] = 1;
        double shift = t % 3 == 0 ? (t % 2 ? 0.3 : -0.3) : test_rng_uniform(&rng, -0.02, 0.02);
        c->old[t] = (float)(v0[t] + shift);
        c->returns[t] = v0[t] + test_rng_uniform(&rng, -1, 1);
    }
    /* The step: its gradient stays in the critic's buffer; the weights it updated are
     * put back for the finite differences. */
    float *saved = malloc((size_t)c->model->n_weights * sizeof *saved);
    cr_assert(saved);
    memcpy(saved, w, (size_t)c->model->n_weights * sizeof *saved);
    struct critic_totals tot = {0};
    TEST_OK(critic_step(&r, 0, N, &tot, &err), &err);
    cr_expect_eq(tot.steps, 1);
    cr_expect_eq(tot.n_tokens, n_tok);
    cr_expect(tot.clipped > 0 && tot.clipped < n_tok, "%lld of %lld tokens clipped: both terms should win somewhere",
              (long long)tot.clipped, (long long)n_tok);
    cr_expect(memcmp(saved, w, (size_t)c->model->n_weights * sizeof *saved) != 0, "the critic took no step");
    memcpy(w, saved, (size_t)c->model->n_weights * sizeof *saved);
    for (int64_t t = 0; t < n_tok; t++)
        cr_expect(fabs(c->cur[t] - v0[t]) < 1e-4, "token %lld: packed value %.9g, alone %.9g", (long long)t, c->cur[t],
                  v0[t]);
    struct vcase g = {.r = &r, .s = s, .n = N, .start = start, .eps = 0.05};
    double want = vloss(&g);
    cr_expect(fabs(tot.loss - want) < 1e-5 * fabs(want) + 1e-7, "loss %.9g, closed form %.9g", tot.loss, want);
    const float *gr = c->model->grads.data;
    for (int i = 0; i < c->model->n_params; i++) {
        const struct model_param *par = &c->model->params[i];
        for (int k = 0; k < 2; k++) {
            int64_t j = par->offset + (int64_t)(test_rng_next(&rng) % (uint64_t)par->numel);
            float x = w[j];
            const float h = 1e-2f;
            w[j] = x + h;
            double lp = vloss(&g);
            w[j] = x - h;
            double lm = vloss(&g);
            w[j] = x;
            double fd = (lp - lm) / (2.0 * (double)h), got = gr[j];
            cr_expect(fabs(fd - got) <= 2e-2 * fabs(fd) + 3e-5, "%s[%lld]: step gradient %.6g, finite difference %.6g",
                      par->name, (long long)(j - par->offset), got, fd);
        }
    }
    free(saved);
    run_teardown(&r);
    test_tmp_teardown();
}

/* ---- (4) exact resume ---- */

/* A run straight and one stopped after `stop` steps and resumed: the same train lines,
 * and the same critic saved at the end. */
static void expect_resume_exact(const struct test_run_paths *p, const char *extra, int iterations, int spi,
                                int stop) {
    static const char *const keys[] = {"loss", "reward", "kl", "grad_norm", "ratio_mean", "critic/value_mean",
                                       "critic/vf_loss", "critic/vf_clipfrac", "critic/returns_mean",
                                       "critic/grad_norm", "critic/vpred_mean"};
    struct rl_test_resume r = {.type = "ppo", .extra = extra, .iterations = iterations, .spi = spi, .stop = stop,
                               .keys = keys, .n_keys = sizeof keys / sizeof *keys};
    rl_test_expect_resume_iterations(p, &r);
    char out2[600];
    snprintf(out2, sizeof out2, "%s2", p->out);
    /* The critics saved at the end are the same, bit for bit. */
    char da[700], db[700];
    snprintf(da, sizeof da, "%s/output/critic", p->out);
    snprintf(db, sizeof db, "%s/output/critic", out2);
    struct smelt_error err = {0};
    struct model *ma, *mb;
    TEST_OK(model_load(da, BACKEND_CPU, &ma, &err), &err);
    TEST_OK(model_load(db, BACKEND_CPU, &mb, &err), &err);
    cr_assert_eq(ma->n_weights, mb->n_weights);
    cr_expect_eq(memcmp(ma->weights.data, mb->weights.data, (size_t)ma->n_weights * sizeof(float)), 0,
                 "the resumed run's critic differs");
    model_free(ma);
    model_free(mb);
}

#define RESUME_PPO(more)                                                                                   \
    "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":2,"         \
    "\"max_new_tokens\":3,\"max_iterations\":6,\"kv_memory_mb\":2,\"critic_learning_rate\":0.003," more    \
    RL_TEST_REWARD_MIXED "},"

Test(ppo, full_run_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    expect_resume_exact(&p, RESUME_PPO("\"beta\":0.05,") "\"checkpoint\":{\"every_steps\":2},", 6, 1, 3);
    test_tmp_teardown();
}

/* LoRA policy (full critic), KL in the reward against the base, dropout, two epochs of
 * two minibatches: 4 steps per iteration; a stop asked after step 5 ends iteration 2. */
Test(ppo, lora_run_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    expect_resume_exact(&p,
                        RESUME_PPO("\"ppo_epochs\":2,\"minibatches\":2,\"beta\":0.05,")
                        "\"lora\":{\"rank\":4,\"alpha\":8,\"dropout\":0.1},\"checkpoint\":{\"every_steps\":4},",
                        6, 4, 5);
    double kl[8];
    cr_assert_eq(rl_test_train_values(p.out, "kl", kl, NULL, 8), 6);
    cr_expect_eq(kl[0], 0.0, "the fresh adapter is the base: kl %.17g", kl[0]);
    cr_expect(kl[5] > 0, "kl %g at the last iteration", kl[5]);
    test_tmp_teardown();
}

/* ---- (5) the split placement ---- */

Test(ppo, a_split_run_is_the_colocated_run) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    struct trainer_result res;
    run_ppo(&p, p.out, SHORT_PPO(""), &quiet, &res);
    char split[600];
    snprintf(split, sizeof split, "%s-split", p.out);
    run_ppo(&p, split, SHORT_PPO("\"placement\":\"split\","), &quiet, &res);
    static const char *const keys[] = {"reward", "loss", "grad_norm", "kl", "critic/vf_loss", "critic/value_mean",
                                       "critic/grad_norm", "rollout/logprob_diff_mean"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        rl_test_expect_same_train(p.out, split, keys[k], 3, "colocated", "split");
    double bytes[4];
    cr_assert_eq(rl_test_train_values(split, "sync_bytes", bytes, NULL, 4), 3);
    cr_expect(bytes[0] > 0, "no weights pushed");
    test_tmp_teardown();
}

/* ---- (6) PPO learns ---- */

/* A reward the tiny random model meets by chance now and then: a completion that starts
 * with a lowercase letter (26 of the 320 ids). */
#define REWARD_LETTER "\"reward\":{\"verifiers\":[{\"type\":\"regex_match\",\"pattern\":\"^[a-z]\"}]}"

Test(ppo, learns_an_easy_reward) {
    struct test_run_paths p;
    rl_test_setup(&p, 32);
    struct trainer_result res;
    run_ppo(&p, p.out,
            "\"hyperparameters\":{\"batch_size\":16,\"learning_rate\":0.01,\"lr_schedule\":\"constant\"},"
            "\"rl\":{\"num_generations\":2,\"max_new_tokens\":2,\"max_iterations\":16,\"kv_memory_mb\":4,"
            "\"critic_learning_rate\":0.003," REWARD_LETTER "},",
            &quiet, &res);
    double reward[20];
    cr_assert_eq(rl_test_train_values(p.out, "reward", reward, NULL, 20), 16);
    double first = (reward[0] + reward[1] + reward[2] + reward[3]) / 4,
           last = (reward[12] + reward[13] + reward[14] + reward[15]) / 4;
    cr_expect(last > first + 0.3, "mean reward of the first 4 iterations %.3f, of the last 4 %.3f", first, last);
    test_tmp_teardown();
}
