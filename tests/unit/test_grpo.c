/* trainer/ GRPO (issue 15): the spec's "rl" section and what a grpo job refuses; a
 * short colocated run and what it logs; one step's gradient through the packing
 * (rl_batch_build / gather / scatter and the model's backward) against central finite
 * differences of a float64 closed form of the loss over samples run one at a time;
 * exact resume (a full fine-tune, and LoRA with a reference and several optimizer steps
 * per iteration); which samples dynamic sampling and mask_truncated_completions train;
 * the split placement (smelt-rollout processes): the same run as colocated bit for bit,
 * full and LoRA, the bytes each weight sync moves, no process left behind, a killed
 * worker or one that fails to start failing the run at once and naming it, exact
 * resume. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "trainer/trainer_internal.h"
#include "rl_testutil.h"
#include "trainer_testutil.h"

/* ---- data, specs, runs ---- */

/* The letter-or-digit check alone: 0 or 1, groups of 3 all equal about a quarter of the time. */
#define REWARD_BINARY "\"reward\":{\"verifiers\":[{\"type\":\"regex_match\",\"pattern\":\"[0-9a-z]\"}]}"
/* Always 0 (no completion comes near 1000 tokens): every group is degenerate. */
#define REWARD_CONSTANT \
    "\"reward\":{\"verifiers\":[{\"type\":\"length_penalty\",\"max_tokens\":1000,\"cache_tokens\":0}]}"

/* Runs the grpo job of extra over p's data into out, to the end or as o says. */
static void run_grpo(const struct test_run_paths *p, const char *out, const char *extra,
                     const struct trainer_options *o, struct trainer_result *res) {
    rl_test_run(p, "grpo", out, extra, o, res);
}

/* The error trainer_run gives for the grpo job of extra over train. */
static void expect_run_refused(const struct test_run_paths *p, const char *train, const char *extra,
                               struct smelt_error *err) {
    struct job_spec spec;
    struct trainer_result res;
    static const struct trainer_options o = {.quiet = true};
    TEST_OK(rl_test_load_spec(p, "grpo", train, p->out, extra, &spec, err), err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &o, &res, err), SMELT_EINVAL, err);
}

static const struct trainer_options quiet = {.quiet = true};

static int64_t int_at(const json_t *line, const char *key) {
    const json_t *v = json_object_get(line, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return (int64_t)json_integer_value(v);
}

static double num_at(const json_t *line, const char *key) {
    const json_t *v = json_object_get(line, key);
    cr_assert(json_is_number(v), "%s is not a number", key);
    return json_number_value(v);
}

/* The weights of the model directory dir, into a new array (free it). */
static float *model_weights_of(const char *dir, int64_t *n) {
    struct smelt_error err = {0};
    struct model *m;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    *n = m->n_weights;
    float *w = malloc((size_t)*n * sizeof *w);
    cr_assert(w);
    memcpy(w, m->weights.data, (size_t)*n * sizeof *w);
    model_free(m);
    return w;
}

/* ---- (1) the spec ---- */

#define MINIMAL_RL "\"rl\":{" RL_TEST_REWARD_MIXED "},"

Test(grpo, spec_defaults_and_round_trip) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec, back;
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, MINIMAL_RL, &spec, &err), &err);
    cr_expect_eq(spec.type, JOB_GRPO);
    cr_expect_eq(spec.rl.num_generations, 8);
    cr_expect_eq(spec.rl.minibatches, 1);
    cr_expect_eq(spec.rl.ppo_epochs, 1);
    cr_expect_eq(spec.rl.max_new_tokens, 64);
    cr_expect_eq(spec.rl.loss_type, RL_LOSS_DAPO);
    cr_expect_eq(spec.rl.loss_agg, -1, "loss_agg is not auto");
    cr_expect(spec.rl.epsilon == 0.2 && spec.rl.epsilon_high == 0.2, "epsilon %g / %g", spec.rl.epsilon,
              spec.rl.epsilon_high);
    cr_expect(spec.rl.beta == 0 && spec.rl.dual_clip == 0 && spec.rl.tis_cap == 0);
    cr_expect_eq(spec.rl.advantage_estimator, RL_ADV_GRPO);
    cr_expect_eq(spec.rl.kl_estimator, RL_KL_K3);
    cr_expect(spec.rl.scale_rewards && !spec.rl.mask_truncated_completions && !spec.rl.dynamic_sampling);
    cr_expect_eq(spec.rl.placement, RL_PLACEMENT_COLOCATED);
    struct rl_policy_config c;
    job_rl_loss_config(&spec, &c);
    cr_expect_eq(c.agg, RL_AGG_TOKEN_MEAN, "dapo aggregates by token");
    cr_expect_eq(c.max_completion_len, 64);

    /* Each loss type's own clip range; epsilon alone sets both ends but CISPO's cap. */
    static const struct {
        const char *rl;
        enum rl_loss_type type;
        double lo, hi;
        enum rl_loss_agg agg;
    } clip[] = {
        {"\"loss_type\":\"gspo\",", RL_LOSS_GSPO, 3e-4, 4e-4, RL_AGG_SEQ_MEAN_TOKEN_MEAN},
        {"\"loss_type\":\"cispo\",", RL_LOSS_CISPO, 0.2, 4.0, RL_AGG_TOKEN_MEAN},
        {"\"loss_type\":\"cispo\",\"epsilon\":0.1,", RL_LOSS_CISPO, 0.1, 4.0, RL_AGG_TOKEN_MEAN},
        {"\"loss_type\":\"grpo\",", RL_LOSS_GRPO, 0.2, 0.2, RL_AGG_SEQ_MEAN_TOKEN_MEAN},
        {"\"loss_type\":\"dr_grpo\",", RL_LOSS_DR_GRPO, 0.2, 0.2, RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM},
        {"\"epsilon\":0.1,", RL_LOSS_DAPO, 0.1, 0.1, RL_AGG_TOKEN_MEAN},
        {"\"epsilon\":0.1,\"epsilon_high\":0.28,", RL_LOSS_DAPO, 0.1, 0.28, RL_AGG_TOKEN_MEAN},
        {"\"loss_type\":\"grpo\",\"loss_agg\":\"token_mean\",", RL_LOSS_GRPO, 0.2, 0.2, RL_AGG_TOKEN_MEAN},
    };
    for (size_t i = 0; i < sizeof clip / sizeof *clip; i++) {
        char extra[1024];
        snprintf(extra, sizeof extra, "\"rl\":{%s" RL_TEST_REWARD_MIXED "},", clip[i].rl);
        TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, extra, &spec, &err), &err);
        cr_expect_eq(spec.rl.loss_type, clip[i].type, "%s", clip[i].rl);
        cr_expect(spec.rl.epsilon == clip[i].lo && spec.rl.epsilon_high == clip[i].hi, "%s: epsilon %g / %g",
                  clip[i].rl, spec.rl.epsilon, spec.rl.epsilon_high);
        job_rl_loss_config(&spec, &c);
        cr_expect(c.eps_low == clip[i].lo && c.eps_high == clip[i].hi && c.agg == clip[i].agg, "%s", clip[i].rl);
    }

    /* Written back with every default, and read again to the same spec (a minimal one
     * and one that sets many fields). */
    static const char *const round_trip[] = {
        MINIMAL_RL,
        "\"rl\":{\"num_generations\":4,\"minibatches\":2,\"ppo_epochs\":3,\"max_iterations\":9,\"max_new_tokens\":5,"
        "\"temperature\":0.7,\"top_k\":20,\"top_p\":0.9,\"min_p\":0.05,\"loss_type\":\"cispo\",\"epsilon\":0.1,"
        "\"dual_clip\":3,\"beta\":0.04,\"kl_estimator\":\"k2\",\"advantage_estimator\":\"rloo\","
        "\"scale_rewards\":false,\"mask_truncated_completions\":true,\"dynamic_sampling\":true,\"tis_cap\":2,"
        "\"tis_level\":\"sequence\",\"tis_mode\":\"mask\",\"kv_memory_mb\":64,\"placement\":\"split\","
        "\"rollout_workers\":3," RL_TEST_REWARD_MIXED "},",
    };
    for (size_t i = 0; i < sizeof round_trip / sizeof *round_trip; i++) {
        TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, round_trip[i], &spec, &err), &err);
        void *j;
        TEST_OK(job_spec_to_json(&spec, &j, &err), &err);
        cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "grpo");
        json_t *rl = json_object_get(j, "rl");
        cr_assert(json_is_object(rl), "no \"rl\" object written");
        cr_expect(json_is_object(json_object_get(rl, "reward")), "no rl.reward written");
        for (int f = 0; f < JOB_N_RL_FIELDS; f++)
            cr_expect(json_object_get(rl, JOB_RL_FIELDS[f].name), "rl.%s not written", JOB_RL_FIELDS[f].name);
        memset(&back, 0xa5, sizeof back);
        TEST_OK(job_spec_from_json(j, "round trip", &back, &err), &err);
        cr_expect_eq(memcmp(&spec, &back, sizeof spec), 0, "spec %zu changed through JSON", i);
        json_decref(j);
    }
    /* Another job type writes no rl section and takes an empty one. */
    TEST_OK(rl_test_load_spec(&p, "sft", p.train, p.out, "\"rl\":{},", &spec, &err), &err);
    void *j;
    TEST_OK(job_spec_to_json(&spec, &j, &err), &err);
    cr_expect_null(json_object_get(j, "rl"), "an sft spec written with an rl section");
    json_decref(j);
    test_tmp_teardown();
}

Test(grpo, spec_refusals_name_the_field) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    /* says: what the message must hold (the field's path, or for an unknown key the
     * section and the key, as every section words it). */
    static const struct rl_test_refusal refused[] = {
        {"grpo", "", "rl.reward", "rl.reward"},
        {"grpo", "\"rl\":{\"num_generation\":4," RL_TEST_REWARD_MIXED "},", "rl.num_generation",
         "rl: unknown field 'num_generation'"},
        {"grpo", "\"rl\":{\"dual_clip\":0.5," RL_TEST_REWARD_MIXED "},", "rl.dual_clip", "rl.dual_clip"},
        {"grpo", "\"rl\":{\"advantage_estimator\":\"gae\"," RL_TEST_REWARD_MIXED "},", "rl.advantage_estimator",
         "rl.advantage_estimator"},
        {"grpo", "\"rl\":{\"placement\":\"elsewhere\"," RL_TEST_REWARD_MIXED "},", "rl.placement", "rl.placement"},
        {"grpo", "\"rl\":{\"placement\":\"split\",\"rollout_workers\":0," RL_TEST_REWARD_MIXED "},",
         "rl.rollout_workers", "rl: field 'rollout_workers'"},
        {"grpo", "\"rl\":{\"rollout_workers\":2," RL_TEST_REWARD_MIXED "},", "rl.rollout_workers",
         "rl.rollout_workers"},
        {"grpo", "\"rl\":{\"placement\":\"split\",\"weight_sync\":\"nccl\"," RL_TEST_REWARD_MIXED "},",
         "rl.weight_sync", "auto, broadcast, zmq"},
        {"grpo", "\"rl\":{\"weight_sync\":\"broadcast\"," RL_TEST_REWARD_MIXED "},", "rl.weight_sync",
         "needs \"placement\": \"split\""},
        {"grpo", "\"rl\":{\"epsilon\":1," RL_TEST_REWARD_MIXED "},", "rl.epsilon", "rl: field 'epsilon'"},
        {"grpo", "\"rl\":{\"num_generations\":1," RL_TEST_REWARD_MIXED "},", "rl.num_generations",
         "rl: field 'num_generations'"},
        {"grpo", "\"rl\":{\"tis_cap\":0.5," RL_TEST_REWARD_MIXED "},", "rl.tis_cap", "rl.tis_cap"},
        {"grpo", "\"rl\":{\"loss_type\":\"ppo\"," RL_TEST_REWARD_MIXED "},", "rl.loss_type", "rl.loss_type"},
        {"grpo", "\"rl\":{\"reward\":{\"verifiers\":[{\"type\":\"llm_judge\"}]}},", "rl.reward.verifiers[0].type",
         "rl.reward.verifiers[0].type"},
        {"sft", "\"rl\":{\"num_generations\":4},", "rl", "rl: only a grpo job"},
    };
    rl_test_expect_refusals(&p, refused, sizeof refused / sizeof *refused);
    test_tmp_teardown();
}

/* ---- (2) what a grpo job refuses when it starts ---- */

#define RUN_RL(more) \
    "\"rl\":{\"num_generations\":2,\"max_new_tokens\":3,\"kv_memory_mb\":2," more RL_TEST_REWARD_MIXED "},"

Test(grpo, setup_refusals_say_what_is_wrong) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    char other[600];

    snprintf(other, sizeof other, "%s.sft", p.train);
    test_write_text(other, "{\"prompt\": \"ab>\", \"completion\": \"ba\"}\n");
    expect_run_refused(&p, other, RUN_RL(""), &err);
    cr_expect(strstr(err.message, other) && strstr(err.message, "sft rows") && strstr(err.message, "prompts rows"),
              "%s", err.message);
    cr_expect_str_eq(err.field, "data.train");

    snprintf(other, sizeof other, "%s.noanswer", p.train);
    rl_test_write_prompts(other, 0, 6, 3);
    expect_run_refused(&p, other, RUN_RL(""), &err);
    char at[700];
    snprintf(at, sizeof at, "%s:3", other);
    cr_expect(strstr(err.message, at) && strstr(err.message, "answer") && strstr(err.message, "exact_match"),
              "the message does not name %s, the answer and the verifier: %s", at, err.message);
    cr_expect(strncmp(err.field, "data.train", 10) == 0, "field %s: %s", err.field, err.message);

    /* The same row in the validation file. */
    rl_test_write_prompts(p.val, 20, 4, 2);
    expect_run_refused(&p, p.train, RUN_RL(""), &err);
    snprintf(at, sizeof at, "%s:2", p.val);
    cr_expect(strstr(err.message, at), "the message does not name %s: %s", at, err.message);
    cr_expect(strncmp(err.field, "data.validation", 15) == 0, "field %s: %s", err.field, err.message);
    rl_test_write_prompts(p.val, 20, 4, 0);

    struct job_spec spec; /* refused when the spec is read: the API refuses it at creation */
    TEST_EXPECT_ERROR(rl_test_load_spec(&p, "grpo", p.train, p.out, "\"hyperparameters\":{\"max_steps\":3}," RUN_RL(""),
                                        &spec, &err),
                      SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "hyperparameters.max_steps", "%s", err.message);
    cr_expect(strstr(err.message, "rl.max_iterations"), "%s", err.message);

    /* The longest prompt (bos + 5 letters + '>') and 122 new tokens: 129 > 128. */
    expect_run_refused(&p, p.train, "\"rl\":{\"num_generations\":2,\"max_new_tokens\":122," RL_TEST_REWARD_MIXED "},",
                       &err);
    cr_expect_str_eq(err.field, "rl.max_new_tokens", "%s", err.message);
    cr_expect(strstr(err.message, "129") && strstr(err.message, "128"), "%s", err.message);
    /* 121 fits exactly: the check is not off by one (one iteration runs). */
    struct trainer_result res;
    char out2[600];
    snprintf(out2, sizeof out2, "%s-fits", p.out);
    run_grpo(&p, out2,
             "\"hyperparameters\":{\"batch_size\":1},\"rl\":{\"num_generations\":2,\"max_new_tokens\":121,"
             "\"kv_memory_mb\":2,\"max_iterations\":1," RL_TEST_REWARD_MIXED "},\"eval\":{\"accuracy_examples\":1},",
             &quiet, &res);
    cr_expect_eq(res.steps, 1);
    test_tmp_teardown();
}

/* ---- (3) a short run ---- */

#define SHORT_RUN_WITH(more)                                                                             \
    "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{" more "\"num_generations\":4,"  \
    "\"max_new_tokens\":4,\"max_iterations\":3,\"kv_memory_mb\":2,\"temperature\":0.8," RL_TEST_REWARD_MIXED "},"
#define SHORT_RUN SHORT_RUN_WITH("")

/* Reward and loss of every train line of out, into reward[0..3) and loss[0..3). */
static void read_reward_loss(const char *out, double *reward, double *loss) {
    int steps[4];
    cr_assert_eq(test_read_metric(out, "train", "reward", reward, steps, 4), 3);
    cr_assert_eq(test_read_metric(out, "train", "loss", loss, NULL, 4), 3);
    for (int i = 0; i < 3; i++) cr_expect_eq(steps[i], i + 1, "train line %d at step %d", i, steps[i]);
}

/* The samples line's rewards: one per sample of the iteration, their min, mean and max
 * those of its train line. */
static void expect_reward_distribution(const json_t *sm, const json_t *train) {
    const json_t *rw = json_object_get(sm, "rewards");
    cr_assert(json_is_array(rw), "the samples line has no rewards");
    cr_expect_eq(json_array_size(rw), 8);
    cr_expect_eq(int_at(sm, "rewards_total"), 8);
    double sum = 0, min = INFINITY, max = -INFINITY;
    for (size_t k = 0; k < json_array_size(rw); k++) {
        double v = json_number_value(json_array_get(rw, k));
        cr_expect(v == 0 || v == 0.5 || v == 1, "reward %g", v);
        sum += v;
        min = fmin(min, v);
        max = fmax(max, v);
    }
    cr_expect(fabs(sum / 8 - num_at(train, "reward")) < 1e-12, "rewards' mean %.17g, train line's %.17g", sum / 8,
              num_at(train, "reward"));
    cr_expect_eq(min, num_at(train, "reward_min"));
    cr_expect_eq(max, num_at(train, "reward_max"));
}

/* A kept sample's score from each verifier, by name: the reward is their weighted sum. */
static void expect_sample_scores(const json_t *x, double reward) {
    const json_t *sc = json_object_get(x, "scores");
    cr_assert(json_is_object(sc) && json_object_size(sc) == 2, "a sample's scores: %zu", json_object_size(sc));
    double exact = num_at(sc, "exact_match"), regex = num_at(sc, "regex_match");
    cr_expect((exact == 0 || exact == 1) && (regex == 0 || regex == 1), "scores %g, %g", exact, regex);
    cr_expect_eq(0.5 * exact + 0.5 * regex, reward);
}

/* Bounded: at most cap rewards, evenly spaced over the iteration; a failed one is null. */
Test(grpo, the_samples_lines_rewards_are_bounded) {
    struct rl_sample s[10] = {0};
    for (int i = 0; i < 10; i++) s[i].reward = i;
    s[4].failed = true;
    s[4].reward = NAN;
    json_t *all = rl_rewards_json(s, 10, 16), *some = rl_rewards_json(s, 10, 4);
    cr_assert(all && some);
    cr_expect_eq(json_array_size(all), 10);
    cr_expect(json_is_null(json_array_get(all, 4)));
    cr_expect_eq(json_number_value(json_array_get(all, 9)), 9);
    cr_expect_eq(json_array_size(some), 4);
    const double want[4] = {0, 2, 5, 7}; /* indexes j * 10 / 4 */
    for (int j = 0; j < 4; j++) cr_expect_eq(json_number_value(json_array_get(some, (size_t)j)), want[j], "entry %d", j);
    json_decref(all);
    json_decref(some);
    json_t *none = rl_rewards_json(s, 0, 4);
    cr_expect(json_is_array(none) && json_array_size(none) == 0);
    json_decref(none);
}

Test(grpo, a_short_colocated_run_logs_every_iteration) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_grpo(&p, p.out, SHORT_RUN, &quiet, &res);
    cr_expect_eq(res.steps, 3);
    cr_expect(!res.stopped);

    json_t *ev[4], *tr[8], *sm[8], *fin[2];
    int n_eval = test_read_lines(p.out, "eval", ev, 4);
    cr_assert_eq(n_eval, 1, "eval lines: %d (one at step 0 expected)", n_eval);
    cr_expect_eq(int_at(ev[0], "step"), 0);
    double v = num_at(ev[0], "val_reward");
    cr_expect(v >= 0 && v <= 1, "val_reward %g", v);
    cr_expect_eq(int_at(ev[0], "val_samples"), 4);

    int n_train = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n_train, 3);
    for (int i = 0; i < n_train; i++) {
        const json_t *t = tr[i];
        cr_expect_eq(int_at(t, "step"), i + 1);
        cr_expect_eq(int_at(t, "iteration"), i + 1);
        cr_expect_eq(int_at(t, "policy_version"), i + 1);
        cr_expect_eq(int_at(t, "samples"), 8);
        cr_expect_eq(int_at(t, "samples_trained"), 8);
        cr_expect_eq(int_at(t, "samples_failed"), 0);
        cr_expect_eq(int_at(t, "prompts"), 2);
        double r = num_at(t, "reward"), rmax = num_at(t, "reward_max");
        cr_expect(r >= 0 && r <= 1 && rmax >= r && rmax <= 1, "iteration %d: reward %g, max %g", i + 1, r, rmax);
        cr_expect(num_at(t, "reward_std") >= 0);
        double regex = num_at(t, "rewards/regex_match/mean"), exact = num_at(t, "rewards/exact_match/mean");
        cr_expect(fabs(0.5 * regex + 0.5 * exact - r) < 1e-12, "iteration %d: reward %.17g is not 0.5 * %g + 0.5 * %g",
                  i + 1, r, regex, exact);
        double len = num_at(t, "completions/mean_length");
        cr_expect(len >= 1 && len <= 4 && int_at(t, "completions/max_length") <= 4, "mean length %g", len);
        double diff = num_at(t, "rollout/logprob_diff_mean"), dmax = num_at(t, "rollout/logprob_diff_max");
        cr_expect(diff >= 0 && diff < 1e-5 && dmax >= diff && dmax < 1e-3,
                  "iteration %d: rollout/trainer logprob difference mean %g, max %g", i + 1, diff, dmax);
        double fz = num_at(t, "frac_reward_zero_std");
        cr_expect(fz >= 0 && fz <= 1);
        cr_expect(isfinite(num_at(t, "loss")) && (fz == 1 || num_at(t, "grad_norm") > 0), "iteration %d: no update",
                  i + 1);
        cr_expect(fabs(num_at(t, "ratio_mean") - 1) < 1e-3, "one step per iteration: ratios are 1, got %g",
                  num_at(t, "ratio_mean"));
    }

    /* A samples line after each train line: the first sample of each group (2 here). */
    int n_samples = test_read_lines(p.out, "samples", sm, 8);
    cr_expect_eq(n_samples, 3);
    for (int i = 0; i < n_samples; i++) {
        cr_expect_eq(int_at(sm[i], "step"), i + 1);
        expect_reward_distribution(sm[i], tr[i]);
        const json_t *arr = json_object_get(sm[i], "samples");
        cr_assert(json_is_array(arr));
        cr_expect_eq(json_array_size(arr), 2, "samples line %d holds %zu samples, not one per prompt (2)", i,
                     json_array_size(arr));
        for (size_t k = 0; k < json_array_size(arr); k++) {
            const json_t *x = json_array_get(arr, k);
            const char *fr = json_string_value(json_object_get(x, "finish_reason"));
            cr_expect(json_is_string(json_object_get(x, "prompt")) &&
                          json_is_string(json_object_get(x, "completion")) && fr &&
                          (strcmp(fr, "stop") == 0 || strcmp(fr, "length") == 0),
                      "a bad sample in line %d", i);
            double r = num_at(x, "reward");
            cr_expect(r == 0 || r == 0.5 || r == 1, "sample reward %g", r);
            expect_sample_scores(x, r);
            cr_expect(int_at(x, "line") >= 1 && int_at(x, "line") <= 6, "sample's prompt line %lld",
                      (long long)int_at(x, "line"));
        }
    }
    test_free_lines(sm, n_samples);
    test_free_lines(tr, n_train);

    cr_assert_eq(test_read_lines(p.out, "final", fin, 2), 1);
    double vr = num_at(fin[0], "val_reward"), va = num_at(fin[0], "val_accuracy");
    cr_expect(vr >= 0 && vr <= 1 && va >= 0 && va <= 1, "final val_reward %g, val_accuracy %g", vr, va);
    cr_expect_eq(int_at(fin[0], "step"), 3);
    test_free_lines(fin, 1);
    test_free_lines(ev, n_eval);

    /* The same spec again: the same samples, rewards and updates, bit for bit. */
    char out2[600];
    snprintf(out2, sizeof out2, "%s-again", p.out);
    run_grpo(&p, out2, SHORT_RUN, &quiet, &res);
    double r1[4], l1[4], r2[4], l2[4];
    read_reward_loss(p.out, r1, l1);
    read_reward_loss(out2, r2, l2);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(r1[i], r2[i], "iteration %d: reward %.17g vs %.17g", i + 1, r1[i], r2[i]);
        cr_expect_eq(l1[i], l2[i], "iteration %d: loss %.17g vs %.17g", i + 1, l1[i], l2[i]);
    }
    test_tmp_teardown();
}

/* ---- (4) the gradient through the packing ---- */

/* Generated tokens' logprobs of samples s[0..n) run one at a time (nothing packed), in
 * float64 from the logits: log_softmax(logits[n_prompt - 1 + j])[token j]. */
static void unpacked_logprobs(struct trainer_run *r, const struct rl_sample *s, int n, const int64_t *start,
                              double *out) {
    int64_t V = r->model->config.vocab_size;
    for (int i = 0; i < n; i++) {
        const struct dataset_prompt *p = &r->train->prompts[s[i].row];
        float *logits = rl_test_forward_alone(r->model, r->acts, p, &s[i], false);
        for (int64_t j = 0; j < s[i].n; j++) {
            const float *row = logits + (p->n - 1 + j) * V;
            double mx = row[0], z = 0;
            for (int64_t v = 1; v < V; v++) mx = fmax(mx, row[v]);
            for (int64_t v = 0; v < V; v++) z += exp((double)row[v] - mx);
            out[start[i] + j] = (double)row[s[i].ids[j]] - mx - log(z);
        }
        free(logits);
    }
}

/* The clipped surrogate with a k3 KL, in float64 (rl_loss.h's formula for grpo, dapo and
 * dr_grpo; no dual clip, no TIS): what the step's loss must be. */
static double closed_form_loss(const struct rl_policy_config *c, int n, const int64_t *start, const double *logp,
                               const float *old, const float *ref, const double *adv) {
    cr_assert(c->kl_estimator == RL_KL_K3 && c->dual_clip == 0 && c->tis_cap == 0);
    cr_assert(c->type != RL_LOSS_GSPO && c->type != RL_LOSS_CISPO);
    double tokens = (double)start[n], total = 0;
    for (int i = 0; i < n; i++) {
        double ni = (double)(start[i + 1] - start[i]), w;
        switch (c->agg) {
        case RL_AGG_TOKEN_MEAN: w = 1 / tokens; break;
        case RL_AGG_SEQ_MEAN_TOKEN_MEAN: w = 1 / (ni * n); break;
        default: w = 1 / ((double)c->max_completion_len * n); break;
        }
        for (int64_t t = start[i]; t < start[i + 1]; t++) {
            double ratio = exp(logp[t] - old[t]), A = adv[t];
            double clipped = fmin(fmax(ratio, 1 - c->eps_low), 1 + c->eps_high);
            double d = ref[t] - logp[t];
            total += w * (fmax(-ratio * A, -clipped * A) + c->beta * (exp(d) - d - 1));
        }
    }
    return total;
}

struct grad_case {
    struct trainer_run *r;
    struct rl_sample *s;
    int n;
    const int64_t *start;
    const float *old, *ref, *mask;
    const double *adv;
};

static double model_loss(const struct grad_case *g, const struct rl_policy_config *c) {
    double logp[64];
    unpacked_logprobs(g->r, g->s, g->n, g->start, logp);
    return closed_form_loss(c, g->n, g->start, logp, g->old, g->ref, g->adv);
}

/* What grpo.c's update does for one optimizer step (minibatch_step / micro_step): the
 * samples in two micro-batches [0, split) and [split, n), each built, run forward,
 * gathered, through the loss with the step's norm, scattered and run backward, the
 * gradients accumulating. Returns the summed loss; the policy logprobs go to cur, the
 * loss's counts to st. */
static double packed_step(const struct grad_case *g, const struct rl_policy_config *c, int split, float *cur,
                          double *coef, struct rl_policy_stats *st) {
    struct smelt_error err = {0};
    struct trainer_run *r = g->r;
    struct rl_norm norm = {0};
    TEST_OK(rl_norm_accumulate(&norm, g->n, g->start, g->mask, &err), &err);
    TEST_OK(tensor_zero(r->grads, &err), &err);
    int bounds[3] = {0, split, g->n};
    double loss = 0;
    *st = (struct rl_policy_stats){0};
    for (int m = 0; m < 2; m++) {
        int a = bounds[m], k = bounds[m + 1] - a;
        struct dataset_batch b;
        double nll;
        TEST_OK(rl_batch_build(r, r->train, g->s + a, k, &b, &err), &err);
        cr_assert_eq(b.n_seqs, k);
        TEST_OK(run_forward_batch(r, &b, &nll, &err), &err);
        rl_batch_gather(r, r->train, &b, g->s + a, k, cur);
        int64_t rel[16], o = g->start[a];
        for (int i = 0; i <= k; i++) rel[i] = g->start[a + i] - o;
        struct rl_seqs seqs = {.n_seq = k, .start = rel, .logp = cur + o, .old_logp = g->old + o,
                               .ref_logp = g->ref + o, .mask = g->mask + o, .adv = g->adv + o};
        struct rl_policy_stats ps;
        TEST_OK(rl_policy_loss(c, &seqs, norm, coef + o, &ps, &err), &err);
        loss += ps.loss;
        rl_policy_stats_merge(st, &ps);
        rl_batch_scatter(r, r->train, &b, g->s + a, k, coef);
        TEST_OK(run_backward_tokens(r, &b, r->host_logprobs, &err), &err);
    }
    return loss;
}

Test(grpo, step_gradient_matches_finite_differences) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec;
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out,
                              "\"hyperparameters\":{\"batch_size\":2},\"rl\":{\"num_generations\":4,"
                              "\"max_new_tokens\":4,\"loss_type\":\"grpo\"," RL_TEST_REWARD_MIXED "},",
                              &spec, &err), &err);
    struct trainer_run r = {.spec = &spec, .quiet = true, .algo = &GRPO_ALGO};
    TEST_OK(run_setup(&r, &err), &err);
    TEST_OK(GRPO_ALGO.prepare(&r, &err), &err);
    /* Larger weights than the 0.02 init, so that every path carries gradient. */
    float *w = r.model->weights.data;
    struct test_rng rng = {23};
    for (int64_t i = 0; i < r.model->n_weights; i++) w[i] += (float)test_rng_uniform(&rng, -0.2, 0.2);

    /* Samples of different prompts (of 4 to 7 tokens) and lengths, two of one prompt, one
     * ending with eos, as an iteration lays them out. */
    enum { N = 6 };
    static const int64_t rows[N] = {0, 0, 1, 2, 3, 5}, lens[N] = {1, 4, 2, 3, 4, 2};
    static const double seq_adv[N] = {0.9, -1.1, 0.4, -0.3, 1.3, -0.7};
    int32_t ids[N][4];
    struct rl_sample s[N];
    int64_t start[N + 1] = {0};
    double adv[64];
    float old[64], ref[64], mask[64], cur[64];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 4; j++) ids[i][j] = (int32_t)(test_rng_next(&rng) % 256);
        if (i == 3) ids[i][lens[i] - 1] = tokenizer_special_ids(r.tok)->eos;
        s[i] = (struct rl_sample){.row = rows[i], .ids = ids[i], .n = lens[i], .off = start[i], .trained = true};
        start[i + 1] = start[i] + lens[i];
        for (int64_t t = start[i]; t < start[i + 1]; t++) {
            adv[t] = seq_adv[i];
            mask[t] = 1;
        }
    }
    int64_t n_tok = start[N];
    cr_assert(n_tok <= 64);
    /* The old policy: the current one moved by small log-ratios (inside the clip range)
     * and, on every third token, by 0.6 (far outside it: no gradient from the surrogate). */
    double lp0[64];
    unpacked_logprobs(&r, s, N, start, lp0);
    for (int64_t t = 0; t < n_tok; t++) {
        double shift = t % 3 == 0 ? (t % 2 ? 0.6 : -0.6) : test_rng_uniform(&rng, -0.05, 0.05);
        old[t] = (float)(lp0[t] + shift);
        ref[t] = (float)(lp0[t] + test_rng_uniform(&rng, -0.5, 0.5));
    }
    struct grad_case g = {.r = &r, .s = s, .n = N, .start = start, .old = old, .ref = ref, .mask = mask, .adv = adv};

    /* grpo with a KL (seq_mean_token_mean), dapo (token_mean), dr_grpo (sum_norm). */
    struct rl_policy_config cfgs[3];
    job_rl_loss_config(&spec, &cfgs[0]);
    cfgs[0].beta = 0.1;
    rl_policy_config_default(RL_LOSS_DAPO, &cfgs[1]);
    rl_policy_config_default(RL_LOSS_DR_GRPO, &cfgs[2]);
    cfgs[2].max_completion_len = 4;
    cr_assert_eq(cfgs[0].agg, RL_AGG_SEQ_MEAN_TOKEN_MEAN);
    static const int splits[3] = {3, 2, 5};
    for (int ci = 0; ci < 3; ci++) {
        const struct rl_policy_config *c = &cfgs[ci];
        double coef[64];
        struct rl_policy_stats st;
        double got_loss = packed_step(&g, c, splits[ci], cur, coef, &st);
        cr_expect(st.n_tokens == n_tok && st.clip_low + st.clip_high > 0 && st.clip_low + st.clip_high < n_tok,
                  "config %d: %lld of %lld tokens clipped: both paths of the surrogate should be taken", ci,
                  (long long)(st.clip_low + st.clip_high), (long long)st.n_tokens);
        for (int64_t t = 0; t < n_tok; t++)
            cr_expect(fabs(cur[t] - lp0[t]) < 1e-5, "token %lld: packed logprob %.9g, alone %.9g", (long long)t,
                      cur[t], lp0[t]);
        double want_loss = closed_form_loss(c, N, start, lp0, old, ref, adv);
        cr_expect(fabs(got_loss - want_loss) < 1e-5 * fabs(want_loss) + 1e-7, "config %d: loss %.9g, closed form %.9g",
                  ci, got_loss, want_loss);
        const float *gr = r.model->grads.data;
        for (int i = 0; i < r.model->n_params; i++) {
            const struct model_param *par = &r.model->params[i];
            for (int k = 0; k < 2; k++) {
                int64_t j = par->offset + (int64_t)(test_rng_next(&rng) % (uint64_t)par->numel);
                float saved = w[j];
                const float h = 1e-2f;
                w[j] = saved + h;
                double lp = model_loss(&g, c);
                w[j] = saved - h;
                double lm = model_loss(&g, c);
                w[j] = saved;
                double fd = (lp - lm) / (2.0 * (double)h), got = gr[j];
                cr_expect(fabs(fd - got) <= 2e-2 * fabs(fd) + 3e-5,
                          "config %d: %s[%lld]: step gradient %.6g, finite difference %.6g", ci,
                          par->name, (long long)(j - par->offset), got, fd);
            }
        }
    }
    run_teardown(&r);
    test_tmp_teardown();
}

/* ---- (5) exact resume ---- */

/* One optimizer step per iteration: test_expect_resume_exact's six steps are six
 * iterations; 6 prompts in batches of 2 make the stop after 3 an epoch boundary. */
#define RESUME_RL(more)                                                                                   \
    "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":3,"        \
    "\"max_new_tokens\":3,\"max_iterations\":6,\"kv_memory_mb\":2," more RL_TEST_REWARD_MIXED "},"

/* test_expect_resume_exact over grpo runs of extra, every iteration's reward the same
 * too; the stopped and resumed run's directory into out2. */
static void expect_resume_exact_rewards(const struct test_run_paths *p, const char *extra, char *out2, size_t size) {
    test_expect_resume_exact(p, run_grpo, extra, "val_reward");
    snprintf(out2, size, "%s2", p->out);
    rl_test_expect_same_train(p->out, out2, "reward", 6, "uninterrupted", "resumed");
}

Test(grpo, full_run_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    char out2[600];
    expect_resume_exact_rewards(&p, RESUME_RL("") "\"checkpoint\":{\"every_steps\":2},", out2, sizeof out2);
    test_tmp_teardown();
}

/* LoRA with a KL to the reference (the base with the adapter off) and dropout; two
 * epochs of two minibatches: 4 optimizer steps per iteration. A stop asked after step 5
 * ends the second iteration (step 8), in the middle of the prompts' first epoch. */
Test(grpo, lora_run_with_reference_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    static const char *const keys[] = {"loss", "reward", "kl", "grad_norm", "ratio_mean"};
    struct rl_test_resume r = {
        .type = "grpo",
        .extra = RESUME_RL("\"ppo_epochs\":2,\"minibatches\":2,\"beta\":0.04,")
        "\"lora\":{\"rank\":4,\"alpha\":8,\"dropout\":0.1},\"checkpoint\":{\"every_steps\":4},",
        .iterations = 6, .spi = 4, .stop = 5, .keys = keys, .n_keys = sizeof keys / sizeof *keys,
        .base_unchanged = true};
    rl_test_expect_resume_iterations(&p, &r);
    /* The KL to the reference is measured, and the adapter moved the policy from it. */
    double kl[8];
    cr_assert_eq(rl_test_train_values(p.out, "kl", kl, NULL, 8), 6);
    cr_expect(kl[5] > 0, "kl %g at the last iteration", kl[5]);
    test_tmp_teardown();
}

/* The reference of a LoRA job is the base with the adapter off. With one step per
 * iteration and no dropout the KL is measured on the policy that generated: at the
 * first iteration the fresh adapter adds exactly nothing, so the KL is exactly 0; after
 * updates it is not (a reference taken with the adapter on would stay at 0). */
Test(grpo, lora_reference_is_the_base) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_grpo(&p, p.out,
             "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":3,"
             "\"max_new_tokens\":3,\"max_iterations\":3,\"kv_memory_mb\":2,\"beta\":0.04," RL_TEST_REWARD_MIXED "},"
             "\"lora\":{\"rank\":4,\"alpha\":8},",
             &quiet, &res);
    cr_expect(res.base_unchanged);
    double kl[4];
    cr_assert_eq(rl_test_train_values(p.out, "kl", kl, NULL, 4), 3);
    cr_expect_eq(kl[0], 0.0, "iteration 1: kl %.17g with a fresh adapter", kl[0]);
    /* an iteration whose groups all tie updates nothing: the KL is > 0 once one did */
    cr_expect(kl[2] > 0, "kl %g, %g after updates", kl[1], kl[2]);
    test_tmp_teardown();
}

/* A full fine-tune keeps a copy of the starting weights as the reference: the KL is 0 at
 * the first iteration (one step per iteration: the policy is still the reference) and
 * grows after the updates. */
Test(grpo, full_reference_is_the_starting_model) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_grpo(&p, p.out,
             "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":3,"
             "\"max_new_tokens\":3,\"max_iterations\":3,\"kv_memory_mb\":2,\"beta\":0.04," RL_TEST_REWARD_MIXED "},",
             &quiet, &res);
    double kl[4];
    cr_assert_eq(rl_test_train_values(p.out, "kl", kl, NULL, 4), 3);
    cr_expect_eq(kl[0], 0.0, "iteration 1: kl %.17g against the starting weights", kl[0]);
    /* an iteration whose groups all tie updates nothing: the KL is > 0 once one did */
    cr_expect(kl[2] > 0, "kl %g, %g after updates", kl[1], kl[2]);
    test_tmp_teardown();
}

/* ---- (6) which samples train ---- */

/* One iteration's sample and group counts, from its train line (clipped: cut at
 * max_new_tokens; degenerate_groups: groups whose rewards are all equal). */
struct counts {
    int64_t samples, trained, clipped, prompts, degenerate_groups;
};

static struct counts iteration_counts(const json_t *t) {
    struct counts c = {.samples = int_at(t, "samples"), .trained = int_at(t, "samples_trained"),
                       .prompts = int_at(t, "prompts")};
    c.clipped = (int64_t)llround(num_at(t, "completions/clipped_ratio") * (double)c.samples);
    c.degenerate_groups = (int64_t)llround(num_at(t, "frac_reward_zero_std") * (double)c.prompts);
    cr_expect_eq(int_at(t, "samples_failed"), 0);
    return c;
}

static void add_counts(struct counts *acc, struct counts c) {
    acc->samples += c.samples;
    acc->trained += c.trained;
    acc->clipped += c.clipped;
    acc->prompts += c.prompts;
    acc->degenerate_groups += c.degenerate_groups;
}

#define SAMPLING_RUN(reward, more)                                                                           \
    "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":3,"          \
    "\"max_new_tokens\":3,\"max_iterations\":3,\"kv_memory_mb\":2," more reward "},"

/* A reward that never varies: every group is degenerate. With dynamic sampling nothing
 * trains (every iteration draws its 4 rounds of prompts, then passes), the run still
 * ends, and the weights are those it started from; without, every sample trains (with
 * zero advantages). */
Test(grpo, dynamic_sampling_drops_degenerate_groups) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_grpo(&p, p.out, SAMPLING_RUN(REWARD_CONSTANT, "\"dynamic_sampling\":true,"), &quiet, &res);
    cr_expect_eq(res.steps, 3);
    json_t *tr[8];
    int n = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n, 3, "the run did not complete its iterations");
    for (int i = 0; i < n; i++) {
        struct counts c = iteration_counts(tr[i]);
        cr_expect_eq(c.prompts, 8, "iteration %d: %lld prompts (4 rounds of 2 expected)", i + 1, (long long)c.prompts);
        cr_expect_eq(c.samples, 24);
        cr_expect_eq(c.trained, 0, "iteration %d: %lld samples of degenerate groups trained", i + 1,
                     (long long)c.trained);
        cr_expect_eq(num_at(tr[i], "frac_reward_zero_std"), 1.0);
        cr_expect_eq(num_at(tr[i], "reward"), 0.0);
        cr_expect_eq(num_at(tr[i], "grad_norm"), 0.0);
    }
    test_free_lines(tr, n);
    int64_t n0, n1;
    char out[700];
    snprintf(out, sizeof out, "%s/output", p.out);
    float *w0 = model_weights_of(p.model, &n0), *w1 = model_weights_of(out, &n1);
    cr_assert_eq(n0, n1);
    cr_expect_eq(memcmp(w0, w1, (size_t)n0 * sizeof *w0), 0, "the weights changed although nothing trained");
    free(w0);
    free(w1);

    char out2[600];
    snprintf(out2, sizeof out2, "%s-all", p.out);
    run_grpo(&p, out2, SAMPLING_RUN(REWARD_CONSTANT, ""), &quiet, &res);
    n = test_read_lines(out2, "train", tr, 8);
    cr_assert_eq(n, 3);
    for (int i = 0; i < n; i++) {
        struct counts c = iteration_counts(tr[i]);
        cr_expect(c.prompts == 2 && c.samples == 6 && c.trained == 6,
                  "iteration %d without dynamic sampling: %lld prompts, %lld samples, %lld trained", i + 1,
                  (long long)c.prompts, (long long)c.samples, (long long)c.trained);
    }
    test_free_lines(tr, n);
    test_tmp_teardown();
}

/* A reward of 0 or 1: the groups that train are exactly the mixed ones, and rounds of
 * prompts are drawn until 2 of them are (at most 4 rounds). */
Test(grpo, dynamic_sampling_trains_the_mixed_groups) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    run_grpo(&p, p.out, SAMPLING_RUN(REWARD_BINARY, "\"dynamic_sampling\":true,"), &quiet, &res);
    json_t *tr[8];
    int n = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n, 3);
    struct counts sum = {0};
    for (int i = 0; i < n; i++) {
        struct counts c = iteration_counts(tr[i]);
        add_counts(&sum, c);
        int64_t kept = c.prompts - c.degenerate_groups;
        cr_expect_eq(c.samples, 3 * c.prompts);
        cr_expect(c.prompts % 2 == 0 && c.prompts >= 2 && c.prompts <= 8, "iteration %d: %lld prompts", i + 1,
                  (long long)c.prompts);
        cr_expect_eq(c.trained, 3 * kept, "iteration %d: %lld trained, %lld mixed groups of 3", i + 1,
                     (long long)c.trained, (long long)kept);
        cr_expect(kept >= 2 || c.prompts == 8,
                  "iteration %d: stopped drawing with %lld mixed groups after %lld prompts",
                  i + 1, (long long)kept, (long long)c.prompts);
        /* Only the last round may complete the batch. */
        cr_expect(c.prompts == 2 || kept - 2 < 2, "iteration %d: %lld mixed groups over %lld prompts", i + 1,
                  (long long)kept, (long long)c.prompts);
        /* One verifier of weight 1: its mean is the reward's, over every sample drawn. */
        double reward = num_at(tr[i], "reward"), verifier = num_at(tr[i], "rewards/regex_match/mean");
        cr_expect(fabs(reward - verifier) < 1e-12,
                  "iteration %d: reward %.17g over %lld samples, rewards/regex_match/mean %.17g", i + 1, reward,
                  (long long)c.samples, verifier);
    }
    test_free_lines(tr, n);
    cr_expect(sum.degenerate_groups > 0 && sum.degenerate_groups < sum.prompts,
              "a run that does not tell: %lld degenerate groups of %lld", (long long)sum.degenerate_groups,
              (long long)sum.prompts);
    test_tmp_teardown();
}

/* Makes the tiny model end its completions early and often: every embedding's first
 * coordinate becomes 1 and eos's 1 + lift. That coordinate dominates the residual
 * stream (the rest is about 0.02 * sqrt(63)), so after the final norm (about 8 on it)
 * the logits are nearly equal but eos's, ahead by about 8 * lift. */
static void make_eos_likely(const char *dir, float lift) {
    struct smelt_error err = {0};
    struct model *m;
    struct tokenizer *tok;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    TEST_OK(tokenizer_load(dir, &tok, &err), &err);
    int64_t eos = tokenizer_special_ids(tok)->eos, C = m->config.hidden_size;
    cr_assert(eos >= 0 && eos < m->config.vocab_size && m->config.tie_word_embeddings);
    float *wte = m->w.wte.data;
    for (int64_t v = 0; v < m->config.vocab_size; v++) wte[v * C] = 1;
    wte[eos * C] = 1 + lift;
    TEST_OK(model_save(m, dir, false, &err), &err);
    model_free(m);
    tokenizer_free(tok);
}

/* With eos likely, some completions stop and others are cut at max_new_tokens: under
 * mask_truncated_completions exactly the cut ones do not train. */
Test(grpo, mask_truncated_completions_leaves_out_the_cut_samples) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    make_eos_likely(p.model, 0.6f);
    struct trainer_result res;
    run_grpo(&p, p.out, SAMPLING_RUN(REWARD_BINARY, "\"mask_truncated_completions\":true,"), &quiet, &res);
    json_t *tr[8];
    int n = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n, 3);
    struct counts sum = {0};
    for (int i = 0; i < n; i++) {
        struct counts c = iteration_counts(tr[i]);
        add_counts(&sum, c);
        cr_expect_eq(c.trained, c.samples - c.clipped, "iteration %d: %lld trained of %lld samples, %lld cut", i + 1,
                     (long long)c.trained, (long long)c.samples, (long long)c.clipped);
    }
    test_free_lines(tr, n);
    cr_expect(sum.clipped > 0 && sum.clipped < sum.samples, "a run that does not tell: %lld cut of %lld",
              (long long)sum.clipped, (long long)sum.samples);

    char out2[600];
    snprintf(out2, sizeof out2, "%s-all", p.out);
    run_grpo(&p, out2, SAMPLING_RUN(REWARD_BINARY, ""), &quiet, &res);
    n = test_read_lines(out2, "train", tr, 8);
    cr_assert_eq(n, 3);
    struct counts all = {0};
    for (int i = 0; i < n; i++) {
        struct counts c = iteration_counts(tr[i]);
        add_counts(&all, c);
        cr_expect_eq(c.trained, c.samples, "iteration %d without the mask: %lld trained of %lld", i + 1,
                     (long long)c.trained, (long long)c.samples);
    }
    test_free_lines(tr, n);
    cr_expect(all.clipped > 0, "no cut sample without the mask either");
    test_tmp_teardown();
}

/* ---- (7) the split placement ---- */

/* The smelt-rollout processes whose parent is this one (zombies included), their pids
 * into pids (at most cap); how many. */
static int rollout_children(pid_t *pids, int cap) {
    DIR *d = opendir("/proc");
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], text[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* gone meanwhile */
        size_t len = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[len] = 0;
        char *open = strchr(text, '('), *close = strrchr(text, ')');
        if (!open || !close || close < open) continue;
        char state;
        int ppid;
        if (sscanf(close + 1, " %c %d", &state, &ppid) != 2 || ppid != (int)getpid()) continue;
        *close = 0;
        if (strcmp(open + 1, "smelt-rollout") != 0) continue;
        if (n < cap) pids[n] = (pid_t)atoi(e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static void expect_no_rollout_children(const char *when) {
    pid_t pids[8];
    int n = rollout_children(pids, 8);
    cr_expect_eq(n, 0, "%s: %d smelt-rollout processes are left (the first pid %d)", when, n, n ? (int)pids[0] : 0);
}

/* Everything the two placements log of the same spec: each iteration's rewards, losses,
 * gradient norms, ratios and rollout/trainer mismatch, and the held-out rewards. */
static void expect_same_run(const char *colocated, const char *split, int iterations) {
    static const char *const keys[] = {"reward", "reward_std", "loss", "grad_norm", "kl", "ratio_mean",
                                       "rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/kl",
                                       "completions/mean_length"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        rl_test_expect_same_train(colocated, split, keys[k], iterations, "colocated", "split");
    double ea[4], eb[4], fa, fb;
    cr_assert_eq(test_read_metric(colocated, "eval", "val_reward", ea, NULL, 4), 1);
    cr_assert_eq(test_read_metric(split, "eval", "val_reward", eb, NULL, 4), 1);
    cr_expect_eq(ea[0], eb[0], "val_reward at step 0: %.17g colocated vs %.17g split", ea[0], eb[0]);
    cr_assert_eq(test_read_metric(colocated, "final", "val_reward", &fa, NULL, 1), 1);
    cr_assert_eq(test_read_metric(split, "final", "val_reward", &fb, NULL, 1), 1);
    cr_expect_eq(fa, fb, "final val_reward: %.17g colocated vs %.17g split", fa, fb);
}

/* Every iteration's sync: `bytes` per worker (0 and no time colocated). */
static void expect_syncs(const char *out, int iterations, double bytes) {
    double b[16], t[16];
    cr_assert_eq(rl_test_train_values(out, "sync_bytes", b, NULL, 16), iterations);
    cr_assert_eq(rl_test_train_values(out, "time/sync_s", t, NULL, 16), iterations);
    for (int i = 0; i < iterations; i++) {
        cr_expect_eq(b[i], bytes, "iteration %d: sync_bytes %.0f, expected %.0f", i + 1, b[i], bytes);
        cr_expect(bytes > 0 ? t[i] > 0 : t[i] == 0, "iteration %d: time/sync_s %g", i + 1, t[i]);
    }
}

/* Every train line names the transport, and the worker's log says each sync came by it;
 * the broadcast's rendezvous folder is gone after the run. */
static void expect_transport(const char *out, int iterations, const char *transport) {
    json_t *lines[16];
    int n = test_read_lines(out, "train", lines, 16);
    cr_expect_eq(n, iterations);
    for (int i = 0; i < n; i++) {
        const char *t = json_string_value(json_object_get(lines[i], "sync_transport"));
        cr_expect(t && strcmp(t, transport) == 0, "iteration %d: sync_transport %s, expected %s", i + 1,
                  t ? t : "(none)", transport);
    }
    test_free_lines(lines, n);
    char path[700], *text = NULL, want[64];
    size_t len;
    struct smelt_error err = {0};
    snprintf(path, sizeof path, "%s/rollout-0.log", out);
    TEST_OK(file_read_all(path, &text, &len, &err), &err);
    snprintf(want, sizeof want, "in use (by %s)", transport);
    int syncs = 0;
    for (const char *p = text; (p = strstr(p, want)) != NULL; p++) syncs++;
    cr_expect_eq(syncs, iterations, "%s: %d syncs %s, expected %d", path, syncs, want, iterations);
    free(text);
    snprintf(path, sizeof path, "%s/weightsync-rendezvous", out);
    cr_expect(!path_exists(path), "%s is left behind", path);
}

/* One worker schedules as the colocated engine does (rl_engine_config), on the same
 * weights and GEMM kernels: the same samples and logprobs, so the same run. The worker
 * loads the model directory the trainer loaded, and every full sync moves the model —
 * by broadcast (rl.weight_sync "auto") and by ZeroMQ messages ("zmq") alike. */
Test(grpo, a_split_run_is_the_colocated_run_bit_for_bit) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    struct trainer_result res;
    run_grpo(&p, p.out, SHORT_RUN, &quiet, &res);
    char split[600];
    snprintf(split, sizeof split, "%s-split", p.out);
    run_grpo(&p, split, SHORT_RUN_WITH("\"placement\":\"split\","), &quiet, &res);
    cr_expect_eq(res.steps, 3);
    expect_no_rollout_children("after the run");
    expect_same_run(p.out, split, 3);
    double params;
    cr_assert_eq(test_read_metric(split, "start", "model_params", &params, NULL, 1), 1);
    expect_syncs(split, 3, 4 * params);
    expect_syncs(p.out, 3, 0);
    expect_transport(split, 3, "broadcast");
    char zmq[600];
    snprintf(zmq, sizeof zmq, "%s-zmq", p.out);
    run_grpo(&p, zmq, SHORT_RUN_WITH("\"placement\":\"split\",\"weight_sync\":\"zmq\","), &quiet, &res);
    expect_no_rollout_children("after the zmq run");
    expect_same_run(p.out, zmq, 3);
    expect_syncs(zmq, 3, 4 * params);
    expect_transport(zmq, 3, "zmq");
    test_tmp_teardown();
}

/* LoRA: the workers hold an adapter of the trainer's configuration and each sync moves
 * its tensors only — as many bytes as the saved adapter's parameters, far fewer than the
 * model's; the run is still the colocated one. */
Test(grpo, a_split_lora_run_syncs_only_the_adapter) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
#define LORA_RUN(more) SHORT_RUN_WITH(more) "\"lora\":{\"rank\":4,\"alpha\":8},"
    struct trainer_result res;
    run_grpo(&p, p.out, LORA_RUN(""), &quiet, &res);
    char split[600];
    snprintf(split, sizeof split, "%s-split", p.out);
    run_grpo(&p, split, LORA_RUN("\"placement\":\"split\","), &quiet, &res);
    cr_expect(res.base_unchanged);
    expect_no_rollout_children("after the run");
    expect_same_run(p.out, split, 3);
    /* The adapter's size, from the adapter the run saved, loaded on the model. */
    struct smelt_error err = {0};
    struct model *m;
    struct lora *adapter;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/output", split);
    TEST_OK(model_load(p.model, BACKEND_CPU, &m, &err), &err);
    TEST_OK(lora_load(m, dir, &adapter, &err), &err);
    double bytes = 4.0 * (double)adapter->n_weights, model_bytes = 4.0 * (double)m->n_weights;
    lora_free(adapter);
    model_free(m);
    cr_expect(bytes > 0 && bytes < model_bytes / 10, "adapter %.0f bytes, model %.0f", bytes, model_bytes);
    expect_syncs(split, 3, bytes);
    expect_transport(split, 3, "broadcast");
    test_tmp_teardown();
}

/* The test's second thread: waits for the run's first train line, then SIGKILLs one of
 * its rollout workers (which one: the log its stderr goes to says). */
struct killer {
    char metrics[700];
    pid_t pid;
    int index;           /* the worker's, from its log's name; -1: none killed */
    struct timespec at;
};

static bool has_train_line(const char *path) {
    char *text = NULL;
    size_t len;
    struct smelt_error ignore = {0};
    if (file_read_all(path, &text, &len, &ignore)) return false;
    bool yes = strstr(text, "\"type\":\"train\"") != NULL;
    free(text);
    return yes;
}

static void *kill_a_worker(void *arg) {
    struct killer *k = arg;
    k->index = -1;
    for (int tries = 0; tries < 60000 && !has_train_line(k->metrics); tries++) usleep(1000);
    pid_t pids[4];
    int n = rollout_children(pids, 4);
    if (n < 1) return NULL;
    k->pid = pids[n - 1];
    char fd[64], log[700];
    snprintf(fd, sizeof fd, "/proc/%d/fd/2", (int)k->pid);
    ssize_t len = readlink(fd, log, sizeof log - 1);
    log[len > 0 ? len : 0] = 0;
    const char *at = strstr(log, "/rollout-");
    if (!at || sscanf(at, "/rollout-%d.log", &k->index) != 1) return NULL;
    clock_gettime(CLOCK_MONOTONIC, &k->at);
    kill(k->pid, SIGKILL);
    return NULL;
}

static double since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* A worker killed mid-run (after the first iteration, in whatever the trainer does
 * next: generating, syncing): the run fails at once, not after the client's health
 * timeout (over a minute), naming the worker, how it ended and its log; the other
 * worker is stopped too. */
Test(grpo, a_killed_worker_fails_the_run_at_once_naming_it) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    struct smelt_error err = {0};
    struct job_spec spec;
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out,
                              "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},"
                              "\"rl\":{\"placement\":\"split\",\"rollout_workers\":2,\"num_generations\":4,"
                              "\"max_new_tokens\":4,\"max_iterations\":200,\"kv_memory_mb\":2,"
                              RL_TEST_REWARD_MIXED "},",
                              &spec, &err),
            &err);
    struct killer k = {0};
    snprintf(k.metrics, sizeof k.metrics, "%s/metrics.jsonl", p.out);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, kill_a_worker, &k), 0);
    struct trainer_result res;
    int rc = trainer_run(&spec, &quiet, &res, &err);
    pthread_join(thread, NULL);
    cr_assert(k.index >= 0, "no worker was killed (the run ended with %s: %s)", error_code_name(rc), err.message);
    double took = since(&k.at);
    cr_expect_eq(rc, SMELT_EIO, "the run went on after its worker was killed: %s (%s)", error_code_name(rc),
                 err.message);
    cr_expect(res.steps < 200, "all %lld steps ran", (long long)res.steps);
    cr_expect_lt(took, 10.0, "the run failed %.1f s after the kill", took);
    char worker[32], log[48];
    snprintf(worker, sizeof worker, "rollout worker %d ", k.index);
    snprintf(log, sizeof log, "rollout-%d.log", k.index);
    cr_expect(strstr(err.message, worker) && strstr(err.message, "SIGKILL") && strstr(err.message, log),
              "the error should name %s, SIGKILL and %s: %s", worker, log, err.message);
    expect_no_rollout_children("after the failed run");
    test_tmp_teardown();
}

/* A worker that ends before it serves (here a stand-in program that says why on stderr
 * and exits 3) fails the job at setup, naming it, how it ended and its log's last words;
 * the other worker is stopped too. */
Test(grpo, a_worker_that_fails_to_start_fails_the_job_naming_it) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    char bin[600], prog[700];
    struct smelt_error err = {0};
    TEST_OK(dir_create_all(test_tmp_path(bin, sizeof bin, "bin"), &err), &err);
    snprintf(prog, sizeof prog, "%s/smelt-rollout", bin); /* the name the leftover check looks for */
    test_write_text(prog, "#!/bin/sh\necho \"smelt-rollout: --model: the weights are unreadable\" >&2\nexit 3\n");
    cr_assert_eq(chmod(prog, 0755), 0);
    rl_workers_set_program(prog);
    struct job_spec spec;
    struct trainer_result res;
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out,
                              SHORT_RUN_WITH("\"placement\":\"split\",\"rollout_workers\":2,"), &spec, &err),
            &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "rollout worker ") && strstr(err.message, "exited with status 3 before serving") &&
                  strstr(err.message, "the weights are unreadable") && strstr(err.message, "/rollout-"),
              "the error should name the worker, its exit and its log: %s", err.message);
    cr_expect_eq(res.steps, 0);
    expect_no_rollout_children("after the failed start");
    test_tmp_teardown();
}

/* Stopped after 3 iterations and resumed: the resumed trainer starts its workers on the
 * starting weights (model_init random: a copy in output_dir/rollout-model/, removed once
 * loaded) and pushes the checkpoint's as version 3 before generating; the run logs what
 * an uninterrupted one does. */
Test(grpo, a_split_run_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    char out2[600], path[700];
    expect_resume_exact_rewards(&p,
                                "\"model_init\":\"random\"," RESUME_RL("\"placement\":\"split\",")
                                "\"checkpoint\":{\"every_steps\":2},",
                                out2, sizeof out2);
    snprintf(path, sizeof path, "%s/rollout-model", out2);
    cr_expect(!path_exists(path), "%s is still there", path);
    /* The worker's log: it loaded the copy, both times, and took version 3 at the resume. */
    snprintf(path, sizeof path, "%s/rollout-0.log", out2);
    char *log = NULL;
    size_t len;
    struct smelt_error err = {0};
    TEST_OK(file_read_all(path, &log, &len, &err), &err);
    int loaded = 0;
    const char *resumed = NULL;
    for (const char *at = log; (at = strstr(at, "/rollout-model on cpu")); at++) {
        loaded++;
        resumed = at;
    }
    cr_assert_eq(loaded, 2, "the worker loaded the weights' copy %d times: %s", loaded, log);
    cr_expect(strstr(resumed, "full weights of version 3 in use"), "no sync of version 3 at the resume: %s", resumed);
    free(log);
    expect_no_rollout_children("after the runs");
    test_tmp_teardown();
}

/* ---- (7) true on-policy, off-policy overlap ---- */

/* The rollout/trainer mismatch of every train line of out: exactly 0 (want_zero), or
 * small. Returns the largest mean |Δlogprob| seen. */
static double expect_mismatch(const char *out, int iterations, bool want_zero) {
    json_t *tr[8];
    int n = test_read_lines(out, "train", tr, 8);
    cr_assert_eq(n, iterations);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double mean = num_at(tr[i], "rollout/logprob_diff_mean"), max = num_at(tr[i], "rollout/logprob_diff_max");
        double kl = num_at(tr[i], "rollout/kl");
        if (want_zero)
            cr_expect(mean == 0 && max == 0 && kl == 0, "%s iteration %d: mismatch mean %g, max %g, kl %g", out, i + 1,
                      mean, max, kl);
        else cr_expect(mean < 1e-5 && max < 1e-3, "%s iteration %d: mean %g max %g", out, i + 1, mean, max);
        if (mean > worst) worst = mean;
    }
    test_free_lines(tr, n);
    return worst;
}

/* true_on_policy: the batch-invariant kernels in the trainer and the engine, so the
 * rollout's logprobs are the trainer's bit for bit — colocated, in a split worker, and
 * with LoRA dropout (the old logprobs then get a pass without it). The default mode's
 * figure is printed (docs/algorithms.md states it). */
Test(grpo, true_on_policy_gives_the_trainers_logprobs_bit_for_bit) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    struct trainer_result res;
    char out[600];
    static const char *const runs[] = {
        SHORT_RUN_WITH("\"true_on_policy\":true,"),
        SHORT_RUN_WITH("\"true_on_policy\":true,\"placement\":\"split\","),
        SHORT_RUN_WITH("\"true_on_policy\":true,") "\"lora\":{\"rank\":4,\"alpha\":8,\"dropout\":0.1},",
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        snprintf(out, sizeof out, "%s-%zu", p.out, i);
        run_grpo(&p, out, runs[i], &quiet, &res);
        cr_expect_eq(res.steps, 3);
        expect_mismatch(out, 3, true);
    }
    expect_no_rollout_children("after the runs");
    run_grpo(&p, p.out, SHORT_RUN, &quiet, &res);
    double worst = expect_mismatch(p.out, 3, false);
    cr_log_info("default mode: rollout/trainer mean |dlogprob| up to %.3g per iteration", worst);
    /* The mode is the process's while the run lasts, and off after it. */
    cr_expect(!ops_batch_invariant(BACKEND_CPU));
    test_tmp_teardown();
}

Test(grpo, off_policy_overlap_needs_the_split_placement) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct smelt_error err = {0};
    struct job_spec spec;
    TEST_EXPECT_ERROR(
        rl_test_load_spec(&p, "grpo", p.train, p.out, SHORT_RUN_WITH("\"max_staleness\":1,"), &spec, &err),
        SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "rl.max_staleness", "%s", err.message);
    cr_expect(strstr(err.message, "split"), "%s", err.message);
    TEST_EXPECT_ERROR(rl_test_load_spec(&p, "grpo", p.train, p.out,
                                        SHORT_RUN_WITH("\"placement\":\"split\",\"max_staleness\":2,"), &spec, &err),
                      SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "rl.max_staleness", "%s", err.message);
    test_tmp_teardown();
}

/* max_staleness 1: iteration 1 trains on its own samples; every later one on samples the
 * previous version generated during the previous update (version_lag 1), its ratios
 * taken against their generator's logprobs (so not 1 on the first step), and the
 * mismatch, which needs the generating weights, measured where the trainer has them. */
Test(grpo, an_off_policy_run_trains_on_the_previous_versions_samples) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    struct trainer_result res;
    run_grpo(&p, p.out, SHORT_RUN_WITH("\"placement\":\"split\",\"max_staleness\":1,"), &quiet, &res);
    cr_expect_eq(res.steps, 3);
    json_t *tr[8];
    int n = test_read_lines(p.out, "train", tr, 8);
    cr_assert_eq(n, 3);
    for (int i = 0; i < n; i++) {
        double lag = num_at(tr[i], "version_lag");
        cr_expect_eq(lag, i == 0 ? 0 : 1, "iteration %d: version_lag %g", i + 1, lag);
        cr_expect_eq(int_at(tr[i], "version_lag_max"), i == 0 ? 0 : 1);
        cr_expect_eq(int_at(tr[i], "samples"), 8);
        cr_expect_eq(int_at(tr[i], "prompts"), 2);
        const json_t *diff = json_object_get(tr[i], "rollout/logprob_diff_mean");
        if (i == 0) cr_expect(json_is_number(diff) && json_number_value(diff) < 1e-5);
        else cr_expect(json_is_null(diff), "iteration %d: a mismatch without the generating weights", i + 1);
        double ratio = num_at(tr[i], "ratio_mean");
        if (i == 0) cr_expect_eq(ratio, 1.0, "on-policy first step: ratio %.17g", ratio);
        else cr_expect(isfinite(ratio) && ratio != 1.0, "iteration %d: ratio %.17g", i + 1, ratio);
    }
    test_free_lines(tr, n);
    expect_no_rollout_children("after the run");
    test_tmp_teardown();
}

/* The samples generated ahead are in the checkpoint: a resumed off-policy job trains on
 * the very samples an uninterrupted one does (also across the epoch boundary at 3). */
Test(grpo, an_off_policy_run_resumes_bit_identically) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    rl_test_use_built_rollout();
    char out2[600], path[700];
    expect_resume_exact_rewards(&p,
                                "\"model_init\":\"random\"," RESUME_RL("\"placement\":\"split\",\"max_staleness\":1,")
                                "\"checkpoint\":{\"every_steps\":2},",
                                out2, sizeof out2);
    snprintf(path, sizeof path, "%s/checkpoints/step-3/rl_pending.safetensors", out2);
    cr_expect(path_exists(path), "no %s", path);
    expect_no_rollout_children("after the runs");
    test_tmp_teardown();
}

/* A python grader that cannot grade some samples (it raises on completions without a
 * letter): those score 0, train, and are reported — a samples_graded_zero count and a
 * sample_errors line naming the prompt line and the error — and the job goes on. */
Test(grpo, a_grader_that_raises_scores_the_sample_0_and_says_so) {
    if (access("/usr/bin/bwrap", X_OK) != 0) cr_skip_test("no bubblewrap: python graders cannot run here");
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    struct trainer_result res;
    char extra[2048];
    snprintf(extra, sizeof extra,
             "\"hyperparameters\":{\"batch_size\":2,\"learning_rate\":0.01},\"rl\":{\"num_generations\":4,"
             "\"max_new_tokens\":4,\"max_iterations\":2,\"kv_memory_mb\":2,\"reward\":{\"grader\":{\"type\":"
             "\"python\",\"source\":\"import re\\ndef grade(sample, item):\\n    if not re.search('[a-z]', "
             "sample['output_text']):\\n        raise ValueError('no letter')\\n    return 1.0\\n\"}}},");
    struct smelt_error err = {0};
    struct job_spec spec;
    int rc = rl_test_load_spec(&p, "grpo", p.train, p.out, extra, &spec, &err);
    if (rc && strstr(err.message, "sandbox")) cr_skip_test("no sandbox here: %s", err.message);
    TEST_OK(rc, &err);
    TEST_OK(trainer_run(&spec, &quiet, &res, &err), &err);
    json_t *tr[4], *se[4];
    int n = test_read_lines(p.out, "train", tr, 4), zeroed = 0;
    cr_assert_eq(n, 2);
    for (int i = 0; i < n; i++) {
        zeroed += (int)int_at(tr[i], "samples_graded_zero");
        cr_expect_eq(int_at(tr[i], "samples_failed"), 0);
        cr_expect_eq(int_at(tr[i], "samples_trained"), 8, "samples scored 0 still train");
    }
    cr_assert(zeroed > 0, "no completion without a letter in %d iterations: pick another grader", n);
    int k = test_read_lines(p.out, "sample_errors", se, 4), reported = 0;
    for (int i = 0; i < k; i++) {
        reported += (int)int_at(se[i], "zeroed");
        const json_t *first = json_array_get(json_object_get(se[i], "errors"), 0);
        cr_expect(strstr(json_string_value(json_object_get(first, "error")), "no letter"), "%s",
                  json_string_value(json_object_get(first, "error")));
        cr_expect(json_is_true(json_object_get(first, "scored")));
    }
    cr_expect_eq(reported, zeroed);
    test_free_lines(tr, n);
    test_free_lines(se, k);
    test_tmp_teardown();
}
