/* score_model and label_model graders (rewards/model_grader*.c) and their generator in
 * the trainer (trainer/reward_generator.c): the messages rendered per sample as the
 * generator gets them (a recording scorer), replies read (numbers, {"result": x}, out of
 * range, labels, passing labels, garbage quoted), the completion's missing JSON scoring
 * 0 unasked, a stage without a generator failing its samples, spec defaults and
 * refusals naming the field; the trainer's generator: the exact prompt ids (the plain
 * template's chat_tokenize of the rendered messages) and a greedy reply equal to the
 * reference generator's; a GRPO run rewarded by a score_model grader. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/generate.h"
#include "rewards/rewards.h"
#include "rewards_testutil.h"
#include "rl_testutil.h"
#include "trainer/trainer_internal.h"
#include "trainer_testutil.h"

/* ---- a recording scorer: replies given by the test, prompts kept ---- */

struct fake {
    const char *const *replies; /* [i]: sample i's reply */
    char seen[8][512];          /* "role:content|role:content" per asked sample */
    int calls, asked;
    struct reward_generate_params params;
};

static int fake_open(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err) {
    (void)err;
    cr_expect_str_eq(ref->dir, "/models/judge");
    *handle = ctx;
    return SMELT_OK;
}

static int fake_generate(void *handle, const struct reward_prompt *prompts, int n,
                         const struct reward_generate_params *p, struct reward_generation *out,
                         struct smelt_error *err) {
    (void)err;
    struct fake *f = handle;
    f->calls++;
    f->params = *p;
    for (int i = 0; i < n; i++) {
        out[i] = (struct reward_generation){0};
        f->seen[i][0] = 0;
        if (!prompts[i].n) continue;
        f->asked++;
        for (int k = 0; k < prompts[i].n; k++)
            snprintf(f->seen[i] + strlen(f->seen[i]), sizeof f->seen[i] - strlen(f->seen[i]), "%s%s:%s", k ? "|" : "",
                     prompts[i].messages[k].role, prompts[i].messages[k].content);
        out[i].text = strdup(f->replies[i]);
        cr_assert(out[i].text);
    }
    return SMELT_OK;
}

static struct reward_stage *fake_stage(const char *grader, struct fake *f) {
    char spec[2048];
    snprintf(spec, sizeof spec, "{\"grader\": %s}", grader);
    struct reward_stage *st = rewards_test_stage(spec);
    struct reward_model_scorer sc = {.ctx = f, .open_generator = fake_open, .generate = fake_generate};
    struct smelt_error err = {0};
    TEST_OK(reward_stage_set_model_scorer(st, &sc, &err), &err);
    return st;
}

#define JUDGE                                                                                                  \
    "{\"type\": \"score_model\", \"name\": \"j\", \"model\": \"m\", \"model_dir\": \"/models/judge\", "       \
    "\"range\": [0, 10], \"sampling_params\": {\"temperature\": 0, \"seed\": 7, \"max_completions_tokens\": 5}, " \
    "\"input\": [{\"role\": \"developer\", \"content\": \"Rate 0-10.\"}, {\"role\": \"user\", \"content\": "     \
    "{\"type\": \"input_text\", \"text\": \"Q: {{item.q}} A: {{sample.output_text}}\"}}]}"

Test(model_grader, score_model_renders_each_sample_and_reads_the_reply) {
    const char *replies[] = {" 7\n", "{\"result\": 2.5, \"steps\": []}", "11", "seven", "-1", "10."};
    struct fake f = {.replies = replies};
    struct reward_stage *st = fake_stage(JUDGE, &f);
    struct reward_sample s[6];
    const char *outs[] = {"Paris", "Lyon", "x", "y", "z", "w"};
    for (int i = 0; i < 6; i++) s[i] = (struct reward_sample){.completion = outs[i], .metadata_json = "{\"q\": \"cap?\"}"};
    struct reward_result r[6];
    struct smelt_error err = {0};
    TEST_OK(reward_stage_score(st, s, 6, r, &err), &err);
    cr_expect_eq(f.calls, 1, "one batch, one call");
    cr_expect_str_eq(f.seen[0], "system:Rate 0-10.|user:Q: cap? A: Paris");
    cr_expect_str_eq(f.seen[1], "system:Rate 0-10.|user:Q: cap? A: Lyon");
    cr_expect(f.params.temperature == 0 && f.params.seed == 7 && f.params.max_tokens == 5 && f.params.top_p == 1);
    cr_expect(!r[0].failed && r[0].reward == 7, "%s", r[0].error);
    cr_expect(!r[1].failed && r[1].reward == 2.5, "%s", r[1].error);
    cr_expect(r[2].failed && strstr(r[2].error, "score 11 is outside range [0, 10]"), "%s", r[2].error);
    cr_expect(r[3].failed && strstr(r[3].error, "grader (score_model): the grader model's reply \"seven\" is not a "
                                               "number"), "%s", r[3].error);
    cr_expect(r[4].failed && isnan(r[4].reward), "%s", r[4].error);
    cr_expect(r[5].failed, "\"10.\" is no number of the grammar: %s", r[5].error);
    reward_stage_free(st);
}

Test(model_grader, label_model_scores_passing_labels_1) {
    const char *replies[] = {"good", "bad.", "{\"result\": \"ok\"}", "Good", "excellent work"};
    struct fake f = {.replies = replies};
    struct reward_stage *st = fake_stage(
        "{\"type\": \"label_model\", \"name\": \"l\", \"model\": \"/models/judge\", \"labels\": [\"good\", \"ok\", "
        "\"bad\"], \"passing_labels\": [\"good\", \"ok\"], \"sampling_params\": {\"temperature\": 0, \"seed\": 3, "
        "\"top_p\": 0.5, \"max_completions_tokens\": 4}, \"input\": [{\"role\": \"user\", \"content\": "
        "\"Label: {{sample.output_text}}\", \"type\": \"message\"}]}", &f);
    struct reward_sample s[5];
    for (int i = 0; i < 5; i++) s[i] = (struct reward_sample){.completion = "x"};
    struct reward_result r[5];
    struct smelt_error err = {0};
    TEST_OK(reward_stage_score(st, s, 5, r, &err), &err);
    cr_expect_str_eq(f.seen[0], "user:Label: x");
    cr_expect(f.params.temperature == 0 && f.params.seed == 3 && f.params.max_tokens == 4 && f.params.top_p == 0.5,
              "smelt's sampling_params of a label_model reach the generator");
    cr_expect(!r[0].failed && r[0].reward == 1);
    cr_expect(!r[1].failed && r[1].reward == 0);
    cr_expect(!r[2].failed && r[2].reward == 1);
    cr_expect(r[3].failed && strstr(r[3].error, "reply \"Good\" is not one of the labels (good, ...)"), "%s", r[3].error);
    cr_expect(r[4].failed && strstr(r[4].error, "\"excellent work\""), "%s", r[4].error);
    reward_stage_free(st);
}

Test(model_grader, missing_json_scores_0_unasked_and_a_missing_item_fails) {
    const char *replies[] = {"1", "1"};
    struct fake f = {.replies = replies};
    struct reward_stage *st = fake_stage(
        "{\"type\": \"score_model\", \"name\": \"j\", \"model\": \"/models/judge\", \"input\": [{\"role\": \"user\", "
        "\"content\": \"{{sample.output_json.a}} {{item.b}}\"}]}", &f);
    struct reward_sample s[2] = {{.completion = "not json", .metadata_json = "{\"b\": 1}"},
                                 {.completion = "{\"a\": 1}", .metadata_json = "{}"}};
    struct reward_result r[2];
    struct smelt_error err = {0};
    TEST_OK(reward_stage_score(st, s, 2, r, &err), &err);
    cr_expect_eq(f.asked, 0);
    cr_expect(!r[0].failed && r[0].reward == 0);
    cr_expect(r[1].failed && strstr(r[1].error, "{{item.b}}"), "%s", r[1].error);
    TEST_EXPECT_ERROR(reward_stage_check_prompt(st, NULL, "{}", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "grader.input[0].content"), "%s", err.message);
    reward_stage_free(st);
}

Test(model_grader, a_stage_without_a_generator_fails_its_samples_or_refuses_the_scorer) {
    struct reward_stage *st = rewards_test_stage("{\"grader\": " JUDGE "}");
    struct reward_sample s = {.completion = "a", .metadata_json = "{\"q\": 1}"};
    struct reward_result r = rewards_test_score(st, &s);
    cr_expect(r.failed && strstr(r.error, "no grader model is loaded here"), "%s", r.error);
    struct reward_model_scorer only_rm = {.open = (void *)1, .score = (void *)1};
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(reward_stage_set_model_scorer(st, &only_rm, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "grader.model", "%s", err.message);
    reward_stage_free(st);
}

Test(model_grader, spec_defaults_round_trip_and_refusals) {
    struct reward_stage *st = rewards_test_stage(
        "{\"grader\": {\"type\": \"score_model\", \"name\": \"j\", \"model\": \"m\", \"input\": [{\"role\": "
        "\"user\", \"content\": \"x\"}]}}");
    json_t *back;
    struct smelt_error err = {0};
    TEST_OK(reward_stage_to_json(st, &back, &err), &err);
    json_t *want = rewards_test_parse(
        "{\"grader\": {\"type\": \"score_model\", \"name\": \"j\", \"model\": \"m\", \"input\": [{\"role\": "
        "\"user\", \"content\": \"x\"}], \"range\": [0.0, 1.0], \"sampling_params\": {\"temperature\": 1.0, "
        "\"top_p\": 1.0, \"max_completions_tokens\": 64, \"seed\": 0}}}");
    char *text = json_dumps(back, JSON_SORT_KEYS);
    cr_expect(json_equal(back, want), "%s", text);
    reward_stage_free(rewards_test_stage(text));
    free(text);
    json_decref(back);
    json_decref(want);
    reward_stage_free(st);

    st = rewards_test_stage("{\"grader\": {\"type\": \"label_model\", \"name\": \"l\", \"model\": \"m\", "
                            "\"input\": [{\"role\": \"user\", \"content\": \"x\"}], \"labels\": [\"a\"], "
                            "\"passing_labels\": [\"a\"]}}");
    TEST_OK(reward_stage_to_json(st, &back, &err), &err);
    json_t *sp = json_object_get(json_object_get(back, "grader"), "sampling_params");
    want = rewards_test_parse("{\"temperature\": 1.0, \"top_p\": 1.0, \"max_completions_tokens\": 64, \"seed\": 0}");
    cr_expect(json_equal(sp, want), "a label_model is written back with the sampling defaults, as a score_model");
    json_decref(back);
    json_decref(want);
    reward_stage_free(st);

#define SM(more) "{\"grader\": {\"type\": \"score_model\", \"model\": \"m\"" more "}}"
#define IN ", \"input\": [{\"role\": \"user\", \"content\": \"x\"}]"
    rewards_test_refused(SM(""), "grader.input", "1 to 16 messages");
    rewards_test_refused(SM(", \"input\": [{\"role\": \"tool\", \"content\": \"x\"}]"), "grader.input[0].role",
                         "not one of system, developer, user, assistant");
    rewards_test_refused(SM(", \"input\": [{\"role\": \"user\", \"content\": {\"type\": \"input_image\"}}]"),
                         "grader.input[0].content.type", "images and audio are not available");
    rewards_test_refused(SM(", \"input\": [{\"role\": \"user\", \"content\": \"{{item.a\"}]"),
                         "grader.input[0].content", "never closed");
    rewards_test_refused(SM(IN ", \"range\": [1, 1]"), "grader.range", "min must be below max");
    rewards_test_refused(SM(IN ", \"sampling_params\": {\"max_completions_tokens\": 0}"),
                         "grader.sampling_params.max_completions_tokens", "max_completions_tokens");
    rewards_test_refused(SM(IN ", \"sampling_params\": {\"top_p\": 0}"), "grader.sampling_params.top_p", "above 0");
    rewards_test_refused(SM(IN ", \"sampling_params\": {\"reasoning_effort\": \"high\"}"),
                         "grader.sampling_params.reasoning_effort", "no reasoning effort");
    rewards_test_refused(SM(IN ", \"labels\": [\"a\"]"), "grader.labels", "labels");
    rewards_test_refused("{\"grader\": {\"type\": \"label_model\", \"model\": \"m\"" IN ", \"labels\": [\"a\"], "
                         "\"passing_labels\": [\"a\"], \"sampling_params\": {\"temperature\": 3}}}",
                         "grader.sampling_params.temperature", "temperature");
    rewards_test_refused("{\"grader\": {\"type\": \"label_model\", \"model\": \"m\"" IN ", \"labels\": [\"a\", "
                         "\"a\"], \"passing_labels\": [\"a\"]}}", "grader.labels", "listed twice");
    rewards_test_refused("{\"grader\": {\"type\": \"label_model\", \"model\": \"m\"" IN ", \"labels\": [\"a\"], "
                         "\"passing_labels\": [\"b\"]}}", "grader.passing_labels", "subset of labels");
    rewards_test_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"j\", \"graders\": {\"j\": "
                         "{\"type\": \"label_model\", \"model\": \"m\"" IN "}}}}", "grader.graders.j.labels", "labels");
}

/* ---- the trainer's generator ---- */

/* A random tiny LM opened as a grader model through the trainer's scorer (the plain
 * template as the policy's). cfg and plain are what sc's ctx points at. */
struct judge {
    char dir[600];
    struct chat_template plain;
    struct reward_scorer_config cfg;
    struct reward_model_scorer sc;
    void *h; /* the generator handle */
};

static void open_judge(struct judge *j) {
    test_make_model_dir(test_tmp_path(j->dir, sizeof j->dir, "judge"), true);
    chat_template_init(&j->plain, CHAT_TEMPLATE_PLAIN);
    j->cfg = (struct reward_scorer_config){.backend = BACKEND_CPU, .policy_chat = &j->plain, .where = "rl.reward"};
    reward_scorer_init(&j->cfg, &j->sc);
    struct reward_model_ref ref = {.model = "judge", .dir = j->dir, .field = "grader", .batch_size = 1};
    struct smelt_error err = {0};
    TEST_OK(j->sc.open_generator(j->sc.ctx, &ref, &j->h, &err), &err);
}

Test(model_grader, the_generator_feeds_the_templates_ids_and_replies_as_the_reference_does) {
    struct judge j;
    open_judge(&j);
    struct smelt_error err = {0};

    struct reward_message m[2] = {{"system", "Rate it."}, {"user", "A: b"}};
    struct reward_prompt pr[3] = {{m, 2}, {NULL, 0}, {m + 1, 1}};
    int32_t *ids;
    size_t n;
    TEST_OK(reward_generator_prompt_ids(j.h, &pr[0], &ids, &n, &err), &err);
    struct tokenizer *tok;
    TEST_OK(tokenizer_load(j.dir, &tok, &err), &err);
    struct chat_message cm[2] = {{"system", "Rate it."}, {"user", "A: b"}};
    int32_t *want;
    uint8_t *mask;
    size_t nw;
    TEST_OK(chat_tokenize(&j.plain, tok, cm, 2, true, &want, &mask, &nw, &err), &err);
    cr_assert_eq(n, nw);
    cr_expect(memcmp(ids, want, n * sizeof *ids) == 0, "the ids fed are the plain template's");

    struct reward_generate_params gp = {.temperature = 0, .top_p = 1, .max_tokens = 6, .seed = 3};
    struct reward_generation out[3];
    TEST_OK(j.sc.generate(j.h, pr, 3, &gp, out, &err), &err);
    cr_expect(!out[1].text && !out[1].failed, "an empty prompt is not asked");
    struct model *lm;
    TEST_OK(model_load(j.dir, BACKEND_CPU, &lm, &err), &err);
    int32_t stop = tokenizer_special_ids(tok)->eos;
    struct generate_params ref_p = {.max_new_tokens = 6, .temperature = 0, .top_p = 1, .stop_ids = &stop,
                                    .n_stop_ids = 1};
    struct generate_result g = {0};
    TEST_OK(model_generate_reference(lm, ids, (int64_t)n, &ref_p, &g, &err), &err);
    char *text;
    size_t len;
    TEST_OK(tokenizer_decode(tok, g.ids, (size_t)g.n, true, &text, &len, &err), &err);
    cr_assert(out[0].text && !out[0].failed, "%s", out[0].error);
    cr_expect_str_eq(out[0].text, text, "greedy replies equal the reference generator's");
    cr_expect(out[2].text != NULL);
    for (int i = 0; i < 3; i++) free(out[i].text);
    free(text);
    generate_result_free(&g);
    model_free(lm);
    free(ids);
    free(want);
    free(mask);
    tokenizer_free(tok);
    j.sc.close_generator(j.h);
    test_tmp_teardown();
}

/* The generator's replies for prompt "A: b" x 4 under p: texts into out (caller frees). */
static void replies(void *h, const struct reward_model_scorer *sc, const struct reward_generate_params *p,
                    struct reward_generation out[4]) {
    struct reward_message m = {"user", "A: b"};
    struct reward_prompt pr[4] = {{&m, 1}, {&m, 1}, {&m, 1}, {&m, 1}};
    struct smelt_error err = {0};
    TEST_OK(sc->generate(h, pr, 4, p, out, &err), &err);
    for (int i = 0; i < 4; i++) cr_assert(out[i].text && !out[i].failed, "%s", out[i].error);
}

static bool same_replies(struct reward_generation a[4], struct reward_generation b[4]) {
    bool same = true;
    for (int i = 0; i < 4; i++) same = same && strcmp(a[i].text, b[i].text) == 0;
    return same;
}

static void free_replies(struct reward_generation g[4]) {
    for (int i = 0; i < 4; i++) free(g[i].text);
}

Test(model_grader, the_generator_honours_max_tokens_and_seed) {
    struct judge j;
    open_judge(&j);
    struct reward_generate_params p = {.temperature = 1, .top_p = 1, .max_tokens = 2, .seed = 5};
    struct reward_generation a[4], b[4], c[4];
    replies(j.h, &j.sc, &p, a);
    for (int i = 0; i < 4; i++) /* the byte tokenizer: a token is at most one byte of text */
        cr_expect_leq(strlen(a[i].text), 2, "max_completions_tokens 2: \"%s\"", a[i].text);
    p.max_tokens = 12;
    replies(j.h, &j.sc, &p, b);
    replies(j.h, &j.sc, &p, c);
    cr_expect(same_replies(b, c), "the same seed, the same replies");
    free_replies(c);
    p.seed = 6;
    replies(j.h, &j.sc, &p, c);
    cr_expect(!same_replies(b, c), "another seed, other replies (a random model at temperature 1, 4 x 12 tokens)");
    free_replies(a);
    free_replies(b);
    free_replies(c);
    j.sc.close_generator(j.h);
    test_tmp_teardown();
}

static const struct trainer_options quiet = {.quiet = true};

Test(model_grader, a_grpo_run_is_rewarded_by_a_score_model_grader) {
    struct test_run_paths p;
    rl_test_setup(&p, 6);
    char extra[2048];
    /* the policy judges itself, greedily (the plain template renders its messages): a tiny random model's reply is bytes, no number,
     * so its samples fail with the reply quoted in the iteration's sample_errors line, and
     * the run goes on (failed samples are events, not job failures) */
    snprintf(extra, sizeof extra,
             "\"chat_template\":\"plain\",\"hyperparameters\":{\"batch_size\":3,\"learning_rate\":0.01},"
             "\"rl\":{\"num_generations\":2,\"max_new_tokens\":4,\"max_iterations\":1,\"kv_memory_mb\":2,\"temperature\":0.8,\"reward\":{"
             "\"grader\":{\"type\":\"multi\",\"calculate_output\":\"judge + len\",\"graders\":{"
             "\"judge\":{\"type\":\"score_model\",\"model\":\"%s\",\"sampling_params\":{\"temperature\":0,"
             "\"max_completions_tokens\":3},\"input\":[{\"role\":\"user\",\"content\":\"{{sample.output_text}}\"}]},"
             "\"len\":{\"type\":\"string_check\",\"input\":\"{{sample.output_text}}\",\"reference\":\"\","
             "\"operation\":\"like\"}}}}},", p.model);
    struct trainer_result res;
    rl_test_run(&p, "grpo", p.out, extra, &quiet, &res);
    json_t *tr[2], *ev[2];
    cr_assert_eq(test_read_lines(p.out, "train", tr, 2), 1);
    cr_expect_eq(json_integer_value(json_object_get(tr[0], "samples")), 6);
    int64_t failed = json_integer_value(json_object_get(tr[0], "samples_failed"));
    cr_expect_gt(failed, 0, "the tiny judge's bytes are no number");
    cr_assert_eq(test_read_lines(p.out, "sample_errors", ev, 2), 1);
    char *text = json_dumps(json_object_get(ev[0], "errors"), 0);
    cr_expect(strstr(text, "grader.graders.judge (score_model): the grader model's reply"), "%s", text);
    free(text);
    test_free_lines(tr, 1);
    test_free_lines(ev, 1);
    test_tmp_teardown();
}
