/* The reward_model grader (rewards/reward_model_grader.c) and its scorer in the trainer
 * (trainer/reward_scorer.c): a sample's score equals the classifier's score head on a
 * direct model_forward of the tokens the reward-model trainer made of the same (prompt,
 * response) as a preference row (raw text, and messages through the plain template with
 * the policy's seam cut from the completion); packing samples into batches of any size
 * gives the same scores; normalize sigmoid; a multi mixing a reward model with a format
 * check; samples it cannot read fail, saying why; a stage without a scorer fails its
 * samples saying so; the spec's fields, defaults and refusals (exact field paths); the
 * model refused when it is no classifier, naming the field; and a GRPO run rewarded by
 * a reward model (every sample scored) and runs refused for a causal LM, a missing
 * directory and a max_length beyond the model's context, naming the field. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/datasets.h"
#include "model/score_head.h"
#include "rewards/rewards.h"
#include "rewards_testutil.h"
#include "rl_testutil.h"
#include "trainer/trainer_internal.h"
#include "trainer_testutil.h"

#define PAD 258 /* the byte tokenizer's <|pad|> */

/* dir: the tiny model as a sequence classifier with a head drawn wide (N(0, 0.5)), so
 * that scores of different texts differ clearly; the byte tokenizer beside it. */
static void make_classifier_dir(const char *dir) {
    struct smelt_error err = {0};
    test_make_model_dir(dir, true);
    struct model *lm, *cm;
    TEST_OK(model_load(dir, BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_classifier_from_lm(lm, PAD, 0.5, 11, &cm, &err), &err);
    TEST_OK(model_save(cm, dir, false, &err), &err);
    model_free(lm);
    model_free(cm);
}

/* The score head on a direct forward of ids[0..n) alone. */
static double direct_score(struct model *m, const int32_t *ids, int32_t n) {
    struct smelt_error err = {0};
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, n, false, &acts, &err), &err);
    int64_t C = m->config.hidden_size, hs[2] = {n, C}, one = 1;
    float *h = malloc((size_t)(n * C) * sizeof *h), score;
    cr_assert(h);
    int32_t cu[2] = {0, n};
    struct tensor th = tensor_f32(h, 2, hs), ts = tensor_f32(&score, 1, &one);
    struct model_batch mb = {.n_tokens = n, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
    TEST_OK(model_forward(m, acts, &mb, NULL, NULL, &th, &err), &err);
    TEST_OK(model_score_forward(m, &mb, &th, &ts, &err), &err);
    free(h);
    model_acts_free(acts);
    return score;
}

/* The chosen sides of a preference file holding one row per response, as the
 * reward-model trainer loads them (with the policy's format: add_bos, chat). */
static struct dataset *trained_inputs(const char *dir, const char *prompt_json, const char *const *responses, int n,
                                      bool chat, struct tokenizer **tok, struct chat_template *tmpl) {
    struct smelt_error err = {0};
    char path[600];
    test_tmp_path(path, sizeof path, "pairs.jsonl");
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < n; i++) {
        json_t *r = json_string(responses[i]);
        char *resp = json_dumps(r, JSON_ENCODE_ANY);
        if (chat)
            fprintf(f, "{\"prompt\": %s, \"chosen\": [{\"role\": \"assistant\", \"content\": %s}], \"rejected\": "
                       "[{\"role\": \"assistant\", \"content\": \"zz\"}]}\n", prompt_json, resp);
        else fprintf(f, "{\"prompt\": %s, \"chosen\": %s, \"rejected\": \"zz\"}\n", prompt_json, resp);
        free(resp);
        json_decref(r);
    }
    fclose(f);
    TEST_OK(tokenizer_load(dir, tok, &err), &err);
    chat_template_init(tmpl, CHAT_TEMPLATE_PLAIN);
    struct dataset_format format = {.tok = *tok, .chat = chat ? tmpl : NULL, .max_seq_len = 128, .add_bos = true};
    struct dataset *ds;
    TEST_OK(dataset_load(path, DATASET_PREFERENCE, &format, &ds, NULL, &err), &err);
    return ds;
}

/* A stage of spec_text with the trainer's scorer on config, which must open. */
static struct reward_stage *scored_stage(const char *spec_text, const struct reward_scorer_config *config) {
    struct reward_stage *st = rewards_test_stage(spec_text);
    struct reward_model_scorer scorer;
    reward_scorer_init(config, &scorer);
    struct smelt_error err = {0};
    TEST_OK(reward_stage_set_model_scorer(st, &scorer, &err), &err);
    return st;
}

/* The stage of a reward_model grader on dir with more fields (", \"batch_size\": 4"). */
static struct reward_stage *rm_stage(const char *dir, const char *more, const struct reward_scorer_config *config) {
    char spec[1200];
    snprintf(spec, sizeof spec, "{\"grader\": {\"type\": \"reward_model\", \"model\": \"%s\"%s}}", dir, more);
    return scored_stage(spec, config);
}

/* got (sample i's reward, scored) within 1e-6 of want, a direct forward's. */
static void expect_near(const struct reward_result *got, double want, const char *what, int i) {
    cr_expect(!got->failed, "%s %d: %s", what, i, got->error);
    cr_expect(fabs(got->reward - want) <= 1e-6 * (1 + fabs(want)), "%s %d: %.9g, direct forward %.9g", what, i,
              got->reward, want);
}

static void score_all(struct reward_stage *st, const struct reward_sample *s, int n, struct reward_result *out) {
    struct smelt_error err = {0};
    TEST_OK(reward_stage_score(st, s, n, out, &err), &err);
}

static const struct reward_scorer_config RAW = {.backend = BACKEND_CPU, .add_bos = true, .where = "rl.reward"};

static const char *const RESPONSES[] = {"ba", "z", "bab", "a much longer response than the others", "12"};
#define N_RESPONSES 5

/* ---- scores ---- */

Test(reward_model_grader, scores_equal_a_direct_forward_of_the_trained_tokens) {
    test_tmp_setup();
    char dir[600];
    make_classifier_dir(test_tmp_path(dir, sizeof dir, "rm"));
    struct tokenizer *tok;
    struct chat_template tmpl;
    struct dataset *ds = trained_inputs(dir, "\"ab>\"", RESPONSES, N_RESPONSES, false, &tok, &tmpl);
    struct reward_stage *st = rm_stage(dir, "", &RAW);
    struct reward_sample s[N_RESPONSES];
    struct reward_result out[N_RESPONSES];
    for (int i = 0; i < N_RESPONSES; i++) s[i] = (struct reward_sample){.prompt = "ab>", .completion = RESPONSES[i]};
    score_all(st, s, N_RESPONSES, out);
    struct smelt_error err = {0};
    struct model *m;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    double first = NAN;
    for (int i = 0; i < N_RESPONSES; i++) {
        const struct dataset_example *ex = &ds->examples[2 * i];
        double want = direct_score(m, ex->ids, ex->n);
        expect_near(&out[i], want, "response", i);
        cr_expect_eq(out[i].scores[0], out[i].reward);
        if (i == 0) first = want;
        else cr_expect(fabs(want - first) > 1e-4, "\"%s\" scores as \"%s\": the test tells nothing", RESPONSES[i],
                       RESPONSES[0]);
    }
    cr_expect_str_eq(reward_stage_name(st, 0), "reward_model");
    /* an empty completion (which no preference row holds): [bos] + prompt + [eos] */
    struct reward_sample empty = {.prompt = "ab>", .completion = ""};
    score_all(st, &empty, 1, out);
    int32_t ids[5] = {256, 'a', 'b', '>', 257};
    expect_near(&out[0], direct_score(m, ids, 5), "the empty completion", 0);
    model_free(m);
    reward_stage_free(st);
    dataset_free(ds);
    tokenizer_free(tok);
    test_tmp_teardown();
}

Test(reward_model_grader, chat_prompts_are_read_as_the_pairs_were_trained) {
    test_tmp_setup();
    char dir[600];
    make_classifier_dir(test_tmp_path(dir, sizeof dir, "rm"));
    struct tokenizer *tok;
    struct chat_template plain;
    static const char *const contents[] = {"ba", "12"};
    struct dataset *ds =
        trained_inputs(dir, "[{\"role\": \"user\", \"content\": \"ab>\"}]", contents, 2, true, &tok, &plain);
    /* the reward model has no template of its own: the policy's (plain) renders; the
     * policy generated " ba" after plain's "Assistant:" */
    struct reward_scorer_config chat = RAW;
    chat.policy_chat = &plain;
    struct reward_stage *st = rm_stage(dir, "", &chat);
    const char *messages = "[{\"role\":\"user\",\"content\":\"ab>\"}]";
    struct reward_sample s[3] = {{.prompt_messages = messages, .completion = " ba"},
                                 {.prompt_messages = messages, .completion = "ba"},
                                 {.prompt_messages = messages, .completion = " 12"}};
    struct reward_result out[3];
    score_all(st, s, 3, out);
    struct smelt_error err = {0};
    struct model *m;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    double want[2] = {direct_score(m, ds->examples[0].ids, ds->examples[0].n),
                      direct_score(m, ds->examples[2].ids, ds->examples[2].n)};
    for (int i = 0; i < 3; i++) expect_near(&out[i], want[i == 2], "sample", i);
    cr_expect(fabs(want[0] - want[1]) > 1e-4);
    model_free(m);
    reward_stage_free(st);

    /* no template anywhere: a message-list prompt fails its sample, saying so */
    st = rm_stage(dir, "", &RAW);
    score_all(st, s, 1, out);
    cr_expect(out[0].failed && isnan(out[0].reward));
    cr_expect(strstr(out[0].error, "grader (reward_model): the reward model cannot read the sample") &&
                  strstr(out[0].error, "chat template"), "%s", out[0].error);
    /* a raw row without its prompt text */
    s[0] = (struct reward_sample){.completion = "ba"};
    score_all(st, s, 1, out);
    cr_expect(out[0].failed && strstr(out[0].error, "no prompt text"), "%s", out[0].error);
    reward_stage_free(st);
    dataset_free(ds);
    tokenizer_free(tok);
    test_tmp_teardown();
}

Test(reward_model_grader, batching_does_not_change_scores) {
    test_tmp_setup();
    char dir[600], more[64];
    make_classifier_dir(test_tmp_path(dir, sizeof dir, "rm"));
    enum { N = 11 };
    struct reward_sample s[N];
    char texts[N][40];
    for (int i = 0; i < N; i++) { /* lengths 0 to 30: packed sequences of every size */
        int len = (i * 7) % 31;
        for (int k = 0; k < len; k++) texts[i][k] = (char)('a' + (i + k) % 26);
        texts[i][len] = 0;
        s[i] = (struct reward_sample){.prompt = i % 2 ? "ab>" : "xyz>", .completion = texts[i]};
    }
    static const int sizes[] = {1, 3, 4, 16};
    double base[N];
    for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
        snprintf(more, sizeof more, ", \"batch_size\": %d", sizes[b]);
        struct reward_stage *st = rm_stage(dir, more, &RAW);
        struct reward_result out[N];
        score_all(st, s, N, out);
        char what[48];
        snprintf(what, sizeof what, "in batches of %d against alone, sample", sizes[b]);
        for (int i = 0; i < N; i++) {
            if (b == 0) base[i] = out[i].reward;
            expect_near(&out[i], base[i], what, i);
        }
        reward_stage_free(st);
    }
    test_tmp_teardown();
}

Test(reward_model_grader, max_length_keeps_the_first_tokens) {
    test_tmp_setup();
    char dir[600];
    make_classifier_dir(test_tmp_path(dir, sizeof dir, "rm"));
    /* [bos] + "ab>" + "b..." + [eos]: 6 tokens or more, of which 5 are kept */
    struct reward_sample s[3] = {{.prompt = "ab>", .completion = "ba"}, {.prompt = "ab>", .completion = "b"},
                                 {.prompt = "ab>", .completion = "bX"}};
    struct reward_result out[3];
    struct reward_stage *st = rm_stage(dir, ", \"max_length\": 5", &RAW);
    score_all(st, s, 3, out);
    struct smelt_error err = {0};
    struct model *m;
    TEST_OK(model_load(dir, BACKEND_CPU, &m, &err), &err);
    int32_t ids[5] = {256, 'a', 'b', '>', 'b'};
    double want = direct_score(m, ids, 5);
    for (int i = 0; i < 3; i++) expect_near(&out[i], want, "cut to 5 tokens, sample", i);
    model_free(m);
    reward_stage_free(st);
    test_tmp_teardown();
}

/* ---- multi, normalize ---- */

Test(reward_model_grader, a_multi_mixes_a_reward_model_with_a_format_check) {
    test_tmp_setup();
    char dir[600], spec[1200];
    make_classifier_dir(test_tmp_path(dir, sizeof dir, "rm"));
    struct reward_sample s[2] = {{.prompt = "ab>", .completion = "ba"}, {.prompt = "ab>", .completion = "xy"}};
    struct reward_result raw[2], out[2];
    struct reward_stage *st = rm_stage(dir, "", &RAW);
    score_all(st, s, 2, raw);
    reward_stage_free(st);
    snprintf(spec, sizeof spec,
             "{\"grader\": {\"type\": \"multi\", \"graders\": {"
             "\"rm\": {\"type\": \"reward_model\", \"model\": \"%s\", \"normalize\": \"sigmoid\"},"
             "\"fmt\": {\"type\": \"string_check\", \"input\": \"{{sample.output_text}}\", \"reference\": \"b\","
             " \"operation\": \"like\"}}, \"calculate_output\": \"0.5 * rm + fmt\"}}", dir);
    st = scored_stage(spec, &RAW);
    score_all(st, s, 2, out);
    cr_expect_str_eq(reward_stage_name(st, 1), "rm");
    cr_expect_str_eq(reward_stage_name(st, 2), "fmt");
    for (int i = 0; i < 2; i++) {
        double sig = 1.0 / (1.0 + exp(-raw[i].reward)), fmt = i == 0 ? 1.0 : 0.0;
        cr_expect(!out[i].failed, "%s", out[i].error);
        cr_expect(fabs(out[i].scores[1] - sig) < 1e-12, "rm %.12g, sigmoid of the raw score %.12g", out[i].scores[1],
                  sig);
        cr_expect_eq(out[i].scores[2], fmt);
        cr_expect(fabs(out[i].reward - (0.5 * sig + fmt)) < 1e-12, "%.12g", out[i].reward);
    }
    reward_stage_free(st);
    test_tmp_teardown();
}

/* ---- without a scorer; the spec ---- */

Test(reward_model_grader, a_stage_without_a_scorer_fails_its_samples_saying_so) {
    struct reward_stage *st = rewards_test_stage(
        "{\"grader\": {\"type\": \"multi\", \"graders\": {\"rm\": {\"type\": \"reward_model\", \"model\": \"ft:rm\"},"
        "\"ok\": {\"type\": \"string_check\", \"input\": \"a\", \"reference\": \"a\", \"operation\": \"eq\"}},"
        "\"calculate_output\": \"rm + ok\"}}");
    struct reward_sample s = {.prompt = "p", .completion = "c"};
    struct reward_result r = rewards_test_score(st, &s);
    cr_expect(r.failed && isnan(r.reward) && isnan(r.scores[1]) && r.scores[2] == 1.0);
    cr_expect(strstr(r.error, "grader.graders.rm (reward_model): no reward model is loaded here") &&
                  strstr(r.error, "ft:rm"), "%s", r.error);
    reward_stage_free(st);
}

static void expect_refused(const char *spec_text, const char *field, const char *says) {
    json_t *spec = rewards_test_parse(spec_text);
    struct reward_stage *st = NULL;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(reward_stage_create(spec, "reward", &st, &err), SMELT_EINVAL, &err);
    json_decref(spec);
    cr_expect_str_eq(err.field, field, "%s: %s", spec_text, err.message);
    cr_expect(strstr(err.message, says), "%s: \"%s\" lacks \"%s\"", spec_text, err.message, says);
}

Test(reward_model_grader, spec_defaults_round_trip_and_refusals) {
    struct reward_stage *st = rewards_test_stage(
        "{\"grader\": {\"type\": \"reward_model\", \"name\": \"rm\", \"model\": \"ft:tiny:rm\", \"model_dir\": "
        "\"/data/jobs/ftjob-1/output\"}}");
    json_t *back;
    struct smelt_error err = {0};
    TEST_OK(reward_stage_to_json(st, &back, &err), &err);
    json_t *want = rewards_test_parse(
        "{\"grader\": {\"type\": \"reward_model\", \"name\": \"rm\", \"model\": \"ft:tiny:rm\", \"model_dir\": "
        "\"/data/jobs/ftjob-1/output\", \"batch_size\": 16, \"max_length\": 0, \"normalize\": \"none\"}}");
    char *text = json_dumps(back, JSON_SORT_KEYS);
    cr_expect(json_equal(back, want), "%s", text);
    free(text);
    reward_stage_free(st);
    text = json_dumps(back, 0);
    st = rewards_test_stage(text); /* the written spec reads back */
    free(text);
    reward_stage_free(st);
    json_decref(back);
    json_decref(want);

    expect_refused("{\"grader\": {\"type\": \"reward_model\"}}", "grader.model", "model");
    expect_refused("{\"grader\": {\"type\": \"reward_model\", \"model\": \"\"}}", "grader.model", "1 to 1024 bytes");
    expect_refused("{\"grader\": {\"type\": \"reward_model\", \"model\": \"m\", \"batch_size\": 0}}",
                   "grader.batch_size", "batch_size");
    expect_refused("{\"grader\": {\"type\": \"reward_model\", \"model\": \"m\", \"max_length\": 1}}",
                   "grader.max_length", "no completion");
    expect_refused("{\"grader\": {\"type\": \"reward_model\", \"model\": \"m\", \"normalize\": \"zscore\"}}",
                   "grader.normalize", "none (the raw score), sigmoid");
    expect_refused("{\"grader\": {\"type\": \"reward_model\", \"model\": \"m\", \"input\": \"x\"}}", "grader.input",
                   "input");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"graders\": {\"rm\": {\"type\": \"reward_model\"}},"
                   " \"calculate_output\": \"rm\"}}", "grader.graders.rm.model", "model");
}

/* ---- the trainer ---- */

static const struct trainer_options quiet = {.quiet = true};

#define RM_RUN(model, more)                                                                                   \
    "\"hyperparameters\":{\"batch_size\":3,\"learning_rate\":0.01},\"rl\":{\"num_generations\":2,"        \
    "\"max_new_tokens\":4,\"max_iterations\":2,\"kv_memory_mb\":2,\"temperature\":0.8,\"reward\":{"          \
    "\"grader\":{\"type\":\"reward_model\",\"model\":\"" model "\"" more "}}},"

Test(reward_model_grader, a_grpo_run_is_rewarded_by_the_reward_model) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    char rm[600], extra[2048];
    make_classifier_dir(test_tmp_path(rm, sizeof rm, "rm"));
    snprintf(extra, sizeof extra, RM_RUN("%s", ",\"batch_size\":4"), rm);
    struct trainer_result res;
    rl_test_run(&p, "grpo", p.out, extra, &quiet, &res);
    cr_expect_eq(res.steps, 2);
    json_t *tr[4], *fin[2];
    cr_assert_eq(test_read_lines(p.out, "train", tr, 4), 2);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(json_integer_value(json_object_get(tr[i], "samples_failed")), 0);
        cr_expect_eq(json_integer_value(json_object_get(tr[i], "samples")), 6);
        /* every sample scored (a raw row's prompt reached the scorer), by the model: not a constant */
        double mean = json_number_value(json_object_get(tr[i], "rewards/reward_model/mean"));
        cr_expect(isfinite(mean) && fabs(mean - json_number_value(json_object_get(tr[i], "reward"))) < 1e-9);
        cr_expect_gt(json_number_value(json_object_get(tr[i], "reward_std")), 1e-3);
    }
    cr_assert_eq(test_read_lines(p.out, "final", fin, 2), 1);
    cr_expect(isfinite(json_number_value(json_object_get(fin[0], "val_reward"))));
    cr_expect_eq(json_integer_value(json_object_get(fin[0], "val_samples_failed")), 0);
    test_free_lines(tr, 2);
    test_free_lines(fin, 1);
    test_tmp_teardown();
}

Test(reward_model_grader, a_run_refuses_a_model_that_is_not_a_classifier) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    char extra[2048], missing[600];
    struct smelt_error err = {0};
    struct job_spec spec;
    struct trainer_result res;
    snprintf(extra, sizeof extra, RM_RUN("%s", ""), p.model); /* a causal LM */
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, extra, &spec, &err), &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "rl.reward.grader.model", "%s", err.message);
    cr_expect(strstr(err.message, "rl.reward.grader.model: ") && strstr(err.message, "without a score head") &&
                  strstr(err.message, p.model), "%s", err.message);

    snprintf(missing, sizeof missing, "%s/none", p.model);
    snprintf(extra, sizeof extra, RM_RUN("%s", ",\"max_length\":4096"), missing);
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, extra, &spec, &err), &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_ENOTFOUND, &err);
    cr_expect_str_eq(err.field, "rl.reward.grader.model", "%s", err.message);

    char rm[600];
    make_classifier_dir(test_tmp_path(rm, sizeof rm, "rm"));
    snprintf(extra, sizeof extra, RM_RUN("%s", ",\"max_length\":4096"), rm);
    TEST_OK(rl_test_load_spec(&p, "grpo", p.train, p.out, extra, &spec, &err), &err);
    TEST_EXPECT_ERROR(trainer_run(&spec, &quiet, &res, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "rl.reward.grader.max_length", "%s", err.message);
    cr_expect(strstr(err.message, "context (128 tokens)"), "%s", err.message);
    test_tmp_teardown();
}

/* A reward model's LoRA output (a PEFT SEQ_CLS adapter with its head, no tokenizer of its
 * own) scores as the classifier with the adapter attached: its base's tokenizer, its
 * base made a classifier, the adapter merged. */
Test(reward_model_grader, a_lora_reward_models_output_scores_as_its_adapter_does) {
    test_tmp_setup();
    char lm[600], dir[600];
    test_make_model_dir(test_tmp_path(lm, sizeof lm, "lm"), true);
    test_tmp_path(dir, sizeof dir, "rm-lora");
    struct smelt_error err = {0};
    struct model *base, *cm;
    TEST_OK(model_load(lm, BACKEND_CPU, &base, &err), &err);
    TEST_OK(model_classifier_from_lm(base, PAD, 0.5, 11, &cm, &err), &err);
    struct lora_config c = {.rank = 2, .alpha = 4, .n_targets = 2, .targets = {"q_proj", "v_proj"}};
    struct lora *l;
    TEST_OK(lora_create(cm, &c, 5, &l, &err), &err);
    float *w = l->weights.data; /* B away from 0, the head moved: the adapter changes the scores */
    for (int64_t k = 0; k < tensor_numel(&l->weights); k++) w[k] += 0.05f * (float)(k % 7 - 3);
    TEST_OK(lora_save(l, dir, lm, &err), &err);
    struct reward_stage *st = rm_stage(dir, "", &RAW);
    struct reward_sample s[2] = {{.prompt = "ab>", .completion = "ba"}, {.prompt = "xyz>", .completion = "q"}};
    struct reward_result out[2];
    score_all(st, s, 2, out);
    int32_t ids[2][7] = {{256, 'a', 'b', '>', 'b', 'a', 257}, {256, 'x', 'y', 'z', '>', 'q', 257}};
    double plain = direct_score(cm, ids[0], 7);
    TEST_OK(lora_attach(l, &err), &err);
    for (int i = 0; i < 2; i++) {
        double want = direct_score(cm, ids[i], 7);
        cr_expect(!out[i].failed, "%s", out[i].error);
        cr_expect(fabs(out[i].reward - want) <= 1e-5 * (1 + fabs(want)), "sample %d: %.9g, with the adapter %.9g", i,
                  out[i].reward, want);
        if (i == 0) cr_expect(fabs(want - plain) > 1e-3, "the adapter changes nothing: the test tells nothing");
    }
    reward_stage_free(st);
    lora_free(l);
    model_free(cm);
    model_free(base);
    test_tmp_teardown();
}
