/* OpenAI-style graders in the reward stage (rewards/graders.c, template.c, formula.c,
 * similarity.c): text_similarity's metrics against the Python references' outputs in
 * tests/data/graders/similarity.json (rapidfuzz, sacrebleu, nltk, rouge-score; made by
 * tests/parity/graders_reference.py) and against hand-computed values; string_check's
 * four operations (Unicode, empty texts); templates (the row's answer and metadata,
 * nested paths, numbers, the completion as text and as JSON, missing fields as clear
 * per-sample failures and as refused rows); multi's formula (precedence, functions,
 * division by zero, errors with their offset); every refused spec with its exact field
 * path; the spec written back. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rewards/graders_internal.h"
#include "rewards/rewards.h"
#include "rewards_testutil.h"

/* ---- helpers ---- */

static struct reward_result grade(struct reward_stage *st, const char *completion, const char *answer,
                                  const char *metadata) {
    struct reward_sample s = {.completion = completion, .answer = answer, .metadata_json = metadata};
    return rewards_test_score(st, &s);
}

/* The grader's score of one sample, which must not fail. */
static double score_of(const char *spec, const char *completion, const char *answer, const char *metadata) {
    struct reward_stage *st = rewards_test_stage(spec);
    struct reward_result r = grade(st, completion, answer, metadata);
    reward_stage_free(st);
    cr_assert(!r.failed, "%s on \"%s\" failed: %s", spec, completion, r.error);
    cr_assert_eq(r.reward, r.scores[0]);
    return r.reward;
}

/* The message of a sample that must fail. */
static void expect_failure(const char *spec, const char *completion, const char *answer, const char *metadata,
                           const char *message) {
    struct reward_stage *st = rewards_test_stage(spec);
    struct reward_result r = grade(st, completion, answer, metadata);
    reward_stage_free(st);
    cr_assert(r.failed, "%s on \"%s\" scored %g, expected a failure", spec, completion, r.reward);
    cr_expect(isnan(r.reward) && isnan(r.scores[0]));
    cr_expect_str_eq(r.error, message);
}

/* A spec that must be refused: the error's field and a piece of its message. */
static void expect_refused(const char *spec_text, const char *field, const char *message_part) {
    rewards_test_refused(spec_text, field, message_part);
}

/* A grader object (CHECK_G, SIMILAR_G) and a spec of that one grader (CHECK, SIMILAR). */
#define CHECK_G(op, input, reference)                                                                               \
    "{\"type\": \"string_check\", \"name\": \"c\", \"operation\": \"" op "\", \"input\": \"" input "\", \"reference\": \"" \
    reference "\"}"
#define SIMILAR_G(metric, input, reference)                                                                         \
    "{\"type\": \"text_similarity\", \"evaluation_metric\": \"" metric "\", \"input\": \"" input "\", \"reference\": \"" \
    reference "\"}"
#define CHECK(op, input, reference) "{\"grader\": " CHECK_G(op, input, reference) "}"
#define SIMILAR(metric, input, reference) "{\"grader\": " SIMILAR_G(metric, input, reference) "}"

/* ---- text_similarity against the references ---- */

static const char *const METRIC_KEYS[] = {"fuzzy_match", "bleu",    "gleu",    "rouge_1", "rouge_2",
                                          "rouge_3",     "rouge_4", "rouge_5", "rouge_l"};

Test(graders, similarity_matches_python_references) {
    json_error_t jerr;
    json_t *doc = json_load_file("tests/data/graders/similarity.json", 0, &jerr);
    cr_assert(doc, "tests/data/graders/similarity.json: %s", jerr.text);
    const json_t *cases = json_object_get(doc, "cases");
    cr_assert(json_array_size(cases) >= 100);
    size_t i;
    const json_t *c;
    json_array_foreach(cases, i, c) {
        const json_t *in = json_object_get(c, "input"), *ref = json_object_get(c, "reference");
        for (int m = 0; m < 9; m++) {
            double got = -1, want = json_number_value(json_object_get(c, METRIC_KEYS[m]));
            cr_assert_eq(grader_similarity((enum grader_metric)m, json_string_value(in), json_string_length(in),
                                           json_string_value(ref), json_string_length(ref), &got),
                         SMELT_OK);
            cr_expect(fabs(got - want) <= 1e-9, "case %zu, %s: \"%s\" vs \"%s\": %.17g, the reference gives %.17g", i,
                      METRIC_KEYS[m], json_string_value(in), json_string_value(ref), got, want);
        }
    }
    json_decref(doc);
}

static double metric(enum grader_metric m, const char *a, const char *b) {
    double s = -1;
    cr_assert_eq(grader_similarity(m, a, strlen(a), b, strlen(b), &s), SMELT_OK);
    return s;
}

Test(graders, similarity_hand_computed) {
    /* fuzzy: 1 - indel/(la + lb); "abc" vs "abd": LCS 2, indel 2 of 6 */
    cr_expect(fabs(metric(GRADER_FUZZY_MATCH, "abc", "abd") - 4.0 / 6.0) < 1e-15);
    cr_expect_eq(metric(GRADER_FUZZY_MATCH, "", ""), 1.0);
    cr_expect_eq(metric(GRADER_FUZZY_MATCH, "", "x"), 0.0);
    /* code points, not bytes: é vs e differ by one character of 2 + 2 */
    cr_expect(fabs(metric(GRADER_FUZZY_MATCH, "é!", "e!") - 0.5) < 1e-15);
    /* rouge_1: "the cat" vs "the dog sat": overlap 1, p = 1/2, r = 1/3, F = 2/5 */
    cr_expect(fabs(metric(GRADER_ROUGE_1, "The cat", "the dog, sat!") - 0.4) < 1e-15);
    /* rouge_l: LCS of [a b c d] and [a c d e] = 3: p = r = 3/4 */
    cr_expect(fabs(metric(GRADER_ROUGE_L, "a b c d", "a c d e") - 0.75) < 1e-15);
    cr_expect_eq(metric(GRADER_ROUGE_L, "", "a"), 0.0);
    /* gleu: hyp "a b", ref "a b c": everygrams 3 vs 6, overlap 3 -> 3/6 */
    cr_expect(fabs(metric(GRADER_GLEU, "a b", "a b c") - 0.5) < 1e-15);
    /* bleu: identical 4+ tokens give 1; one token right of two (no bigram): exp smoothing
     * p1 = 50, p2 = 100 / (2 * 1) = 50 -> geometric mean 50 -> 0.5; lengths equal, bp 1 */
    cr_expect(fabs(metric(GRADER_BLEU, "the cat sat down", "the cat sat down") - 1.0) < 1e-15);
    cr_expect(fabs(metric(GRADER_BLEU, "a x", "a y") - 0.5) < 1e-12);
    cr_expect_eq(metric(GRADER_BLEU, "", "a"), 0.0);
    /* 13a splits punctuation, so "cat." matches "cat ." */
    cr_expect(fabs(metric(GRADER_BLEU, "the cat.", "the cat .") - 1.0) < 1e-15);
}

/* a: n distinct CJK characters; b: a without every third one, so LCS = len(b) and
 * fuzzy_match = 2 len(b) / (len(a) + len(b)). n = 24600 takes the table (the bit masks
 * would pass 32 MiB), n = 1000 the bit-parallel path over 16 words. */
static void check_subsequence_fuzzy(int n) {
    char *a = malloc((size_t)n * 3 + 1), *b = malloc((size_t)n * 3 + 1);
    cr_assert(a && b);
    size_t la = 0, lb = 0;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        int cp = 0x4e00 + i;
        char c[3] = {(char)(0xe0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3f)), (char)(0x80 | (cp & 0x3f))};
        memcpy(a + la, c, 3), la += 3;
        if (i % 3 != 2) memcpy(b + lb, c, 3), lb += 3, nb++;
    }
    double s = -1;
    cr_assert_eq(grader_similarity(GRADER_FUZZY_MATCH, a, la, b, lb, &s), SMELT_OK);
    cr_expect(fabs(s - 2.0 * nb / (n + nb)) < 1e-15, "n %d: %.17g, expected %.17g", n, s, 2.0 * nb / (n + nb));
    cr_assert_eq(grader_similarity(GRADER_FUZZY_MATCH, b, lb, a, la, &s), SMELT_OK);
    cr_expect(fabs(s - 2.0 * nb / (n + nb)) < 1e-15);
    free(a);
    free(b);
}

Test(graders, long_texts_closed_form) {
    check_subsequence_fuzzy(1000);
    check_subsequence_fuzzy(24600);
}

Test(graders, text_similarity_through_the_stage) {
    double s = score_of(SIMILAR("rouge_l", "{{sample.output_text}}", "{{item.answer}}"), "a b c d", "a c d e", NULL);
    cr_expect(fabs(s - 0.75) < 1e-15);
    /* pass_threshold does not change the score (OpenAI: the score is the reward) */
    s = score_of("{\"grader\": {\"type\": \"text_similarity\", \"evaluation_metric\": \"fuzzy_match\", "
                 "\"pass_threshold\": 0.9, \"input\": \"{{sample.output_text}}\", \"reference\": \"abd\"}}",
                 "abc", NULL, NULL);
    cr_expect(fabs(s - 4.0 / 6.0) < 1e-15);
    cr_expect_eq(score_of(SIMILAR("bleu", "{{sample.output_text}}", "x"), "", NULL, NULL), 0.0);
}

/* ---- string_check ---- */

Test(graders, string_check_operations) {
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "Paris"), "Paris", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "Paris"), "Paris ", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "Paris"), "paris", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_text}}", "Paris"), "paris", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_text}}", "Paris"), "Paris", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("like", "{{sample.output_text}}", "Paris"), "It is Paris.", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("like", "{{sample.output_text}}", "Paris"), "It is PARIS.", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ilike", "{{sample.output_text}}", "Paris"), "It is PARIS.", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("ilike", "{{sample.output_text}}", "paris"), "It is Pari", NULL, NULL), 0.0);
    /* Unicode lowercase, character by character */
    cr_expect_eq(score_of(CHECK("ilike", "{{sample.output_text}}", "ÉTÉ À ΣΟΦΊΑ"), "un été à σοφία!", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("like", "{{sample.output_text}}", "ÉTÉ"), "un été", NULL, NULL), 0.0);
    /* empty output: contains nothing but the empty reference; equals only "" */
    cr_expect_eq(score_of(CHECK("like", "{{sample.output_text}}", "x"), "", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("like", "{{sample.output_text}}", ""), "", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", ""), "", NULL, NULL), 1.0);
    cr_expect_eq(score_of(CHECK("ilike", "{{sample.output_text}}", ""), "", NULL, NULL), 1.0);
    /* invalid UTF-8 in the completion compares as its bytes */
    cr_expect_eq(score_of(CHECK("ilike", "{{sample.output_text}}", "AB"), "x\xff" "ab", NULL, NULL), 1.0);
}

/* ---- templates ---- */

Test(graders, templates_read_the_row_and_the_completion) {
    const char *meta = "{\"city\": \"Paris\", \"n\": 3, \"x\": 0.1, \"ok\": true, \"list\": [\"a\", {\"b\": \"B\"}], "
                       "\"obj\": {\"k\": [1, 2]}}";
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{item.answer}}"), "42", "42", meta), 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{ item.city }}"), "Paris", NULL, meta), 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{item.metadata.city}}"), "Paris", NULL, meta), 1.0);
    /* an OpenAI row with a field named "metadata": item.metadata.x means that field's x */
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{item.metadata.city}}"), "Rome", NULL,
                          "{\"city\": \"Paris\", \"metadata\": {\"city\": \"Rome\"}}"),
                 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{item.list[1].b}}-{{item.list[0]}}"), "B-a", NULL,
                          meta),
                 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "n={{item.n}} x={{item.x}} ok={{item.ok}} {{item.obj}}"),
                          "n=3 x=0.1 ok=true {\"k\":[1,2]}", NULL, meta),
                 1.0);
    /* item.answer falls back to the metadata's when the row has none */
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_text}}", "{{item.answer}}"), "7", NULL, "{\"answer\": 7}"), 1.0);
    /* the completion as JSON */
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_json.name}}", "{{item.city}}"), " {\"name\": \"Paris\"} ", NULL,
                          meta),
                 1.0);
    cr_expect_eq(score_of(CHECK("eq", "{{sample.output_json[1]}}", "2"), "[1, 2]", NULL, NULL), 1.0);
    /* text around references, braces that are no reference */
    cr_expect_eq(score_of(CHECK("eq", "<{{sample.output_text}}> {x} }}", "<a> {x} }}"), "a", NULL, NULL), 1.0);
}

Test(graders, templates_that_name_nothing_fail_the_sample) {
    const char *spec = CHECK("eq", "{{sample.output_text}}", "{{item.city}}");
    expect_failure(spec, "Paris", NULL, "{\"town\": \"Paris\"}",
                   "grader (string_check): {{item.city}}: the row's metadata has no field \"city\"");
    expect_failure(spec, "Paris", "Paris", NULL, "grader (string_check): {{item.city}}: the row has no \"metadata\"");
    expect_failure(spec, "Paris", NULL, "{\"city\": null}",
                   "grader (string_check): {{item.city}}: is null in the row's metadata");
    expect_failure(CHECK("eq", "{{sample.output_text}}", "{{item.answer}}"), "x", NULL, "{}",
                   "grader (string_check): {{item.answer}}: the row has no \"answer\" (nor has its metadata)");
    expect_failure(CHECK("eq", "{{sample.output_text}}", "{{item.list[5]}}"), "x", NULL, "{\"list\": [1]}",
                   "grader (string_check): {{item.list[5]}}: the row's metadata has no element [5]");
    /* The completion's side is the model's: not JSON, or JSON without the field, scores 0. */
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_json.name}}", "x"), "name: x", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_json.name}}", "x"), "{\"nom\": 1}", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_json.name}}", "x"), "", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_json.name}}", "x"), "{\"name\": null}", NULL, NULL), 0.0);
    cr_expect_eq(score_of(CHECK("ne", "{{sample.output_json.name}}", "x"), "{\"name\": \"y\"}", NULL, NULL), 1.0);
}

Test(graders, the_prompt_check_refuses_rows_missing_a_field) {
    struct reward_stage *st = rewards_test_stage(
        "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"a + b\", "
        "\"graders\": {\"a\": " CHECK_G("eq", "{{sample.output_text}}", "{{item.answer}}")
        ", \"b\": " SIMILAR_G("bleu", "{{sample.output_json.x}}", "{{item.ref.text}}")
        "}}}");
    struct smelt_error err = {0};
    cr_expect_eq(reward_stage_check_prompt(st, "1", "{\"ref\": {\"text\": \"t\"}}", &err), SMELT_OK, "%s", err.message);
    cr_expect_eq(reward_stage_check_prompt(st, NULL, "{\"ref\": {\"text\": \"t\"}}", &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "answer");
    cr_expect_str_eq(err.message, "grader.graders.a.reference: {{item.answer}}: the row has no \"answer\" (nor has its "
                                  "metadata)");
    cr_expect_eq(reward_stage_check_prompt(st, "1", "{\"ref\": {}}", &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "metadata");
    cr_expect_str_eq(err.message, "grader.graders.b.reference: {{item.ref.text}}: the row's metadata has no field "
                                  "\"text\"");
    cr_expect_eq(reward_stage_check_prompt(st, "1", NULL, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "metadata");
    reward_stage_free(st);
}

/* ---- multi ---- */

static double formula(const char *f) {
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"%s\", \"graders\": {"
             "\"acc\": {\"type\": \"text_similarity\", \"evaluation_metric\": \"fuzzy_match\", \"input\": "
             "\"{{sample.output_text}}\", \"reference\": \"{{item.answer}}\"}, "
             "\"b_2\": {\"type\": \"string_check\", \"operation\": \"like\", \"input\": \"{{sample.output_text}}\", "
             "\"reference\": \"{{item.k}}\"}}}}",
             f);
    /* acc = fuzzy("abc", "abd") = 4/6; b_2 = 1: the completion holds the row's k */
    return score_of(spec, "abc", "abd", "{\"k\": \"b\"}");
}

Test(graders, multi_formula_semantics) {
    double acc = 4.0 / 6.0, b = 1.0;
    cr_expect(fabs(formula("0.5 * acc + 0.5 * b_2") - (0.5 * acc + 0.5 * b)) < 1e-15);
    cr_expect(fabs(formula("acc + b_2 * 2 - 1") - (acc + 2 - 1)) < 1e-15);
    cr_expect(fabs(formula("(acc + b_2) / 2") - (acc + b) / 2) < 1e-15);
    cr_expect_eq(formula("2 ^ 3 ^ 2"), 512.0); /* right-associative */
    cr_expect_eq(formula("-2 ^ 2"), -4.0);     /* power binds tighter than the sign */
    cr_expect_eq(formula("2 ^ -1"), 0.5);
    cr_expect_eq(formula("- -3 + +1"), 4.0);
    cr_expect_eq(formula("10 - 4 - 3"), 3.0); /* left-associative */
    cr_expect_eq(formula("12 / 3 / 2"), 2.0);
    cr_expect(fabs(formula("min(acc, b_2, 0.9)") - acc) < 1e-15);
    cr_expect_eq(formula("max(acc, b_2)"), 1.0);
    cr_expect_eq(formula("max(3)"), 3.0);
    cr_expect_eq(formula("abs(-2.5) + floor(1.7) + ceil(1.2)"), 5.5);
    cr_expect(fabs(formula("exp(1) + sqrt(2) + log(10)") - (exp(1) + sqrt(2) + log(10))) < 1e-15);
    cr_expect_eq(formula("1.5e1 + .5 + 2."), 17.5);
}

Test(graders, multi_reports_every_sub_score) {
    struct reward_stage *st = rewards_test_stage(
        "{\"grader\": {\"type\": \"multi\", \"name\": \"combined\", "
        "\"calculate_output\": \"(exact + near) / 2\", \"graders\": {"
        "\"exact\": " CHECK_G("eq", "{{sample.output_text}}", "{{item.answer}}") ", "
        "\"near\": " SIMILAR_G("fuzzy_match", "{{sample.output_text}}", "{{item.answer}}")
        "}}}");
    cr_assert_eq(reward_stage_count(st), 3);
    cr_expect_str_eq(reward_stage_name(st, 0), "multi");
    cr_expect_str_eq(reward_stage_name(st, 1), "exact");
    cr_expect_str_eq(reward_stage_name(st, 2), "near");
    struct reward_result r = grade(st, "abc", "abd", NULL);
    cr_assert(!r.failed, "%s", r.error);
    cr_expect_eq(r.scores[1], 0.0);
    cr_expect(fabs(r.scores[2] - 4.0 / 6.0) < 1e-15);
    cr_expect(fabs(r.reward - 2.0 / 6.0) < 1e-15);
    cr_expect_eq(r.scores[3], 0.0); /* past the count */
    /* a sub-grader that fails fails the sample; the others still score */
    r = grade(st, "abc", NULL, NULL);
    cr_expect(r.failed);
    cr_expect(isnan(r.scores[0]) && isnan(r.scores[1]) && isnan(r.scores[2]));
    cr_expect_str_eq(r.error, "grader.graders.exact (string_check): {{item.answer}}: the row has no \"answer\" (nor "
                              "has its metadata)");
    reward_stage_free(st);
}

Test(graders, multi_formula_failures_fail_the_sample) {
    const char *spec = "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"1 / (a - 1)\", \"graders\": {"
                       "\"a\": " CHECK_G("eq", "{{sample.output_text}}", "yes") "}}}";
    cr_expect_eq(score_of(spec, "no", NULL, NULL), -1.0);
    expect_failure(spec, "yes", NULL, NULL, "grader (multi): calculate_output: division by zero at offset 2");
    const char *logs = "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"log(a)\", \"graders\": {"
                       "\"a\": " CHECK_G("eq", "{{sample.output_text}}", "yes") "}}}";
    expect_failure(logs, "no", NULL, NULL,
                   "grader (multi): calculate_output: the term at offset 0 gives -inf, not a finite number");
    const char *root = "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"sqrt(a - 1)\", \"graders\": {"
                       "\"a\": " CHECK_G("eq", "{{sample.output_text}}", "yes") "}}}";
    struct reward_stage *st = rewards_test_stage(root);
    struct reward_result r = grade(st, "no", NULL, NULL);
    cr_expect(r.failed && strstr(r.error, "the term at offset 0 gives"), "%s", r.error);
    reward_stage_free(st);
}

/* ---- refused specs, each naming its field ---- */

#define MULTI_WITH(formula_text)                                                                                    \
    "{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"" formula_text "\", \"graders\": {\"acc\": "      \
    CHECK_G("eq", "x", "y") ", \"sim\": " SIMILAR_G("bleu", "x", "y") "}}}"

Test(graders, refused_specs_name_the_field) {
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"acc\", \"graders\": {\"acc\": "
                   "{\"type\": \"string_check\", \"operation\": \"contains\", \"input\": \"a\", \"reference\": \"b\"}}}}",
                   "grader.graders.acc.operation",
                   "reward.grader.graders.acc.operation: \"contains\" is not one of eq, ne, like, ilike");
    expect_refused(SIMILAR("cosine", "a", "b"), "grader.evaluation_metric",
                   "cosine needs an embedding model, and none is configured");
    expect_refused(SIMILAR("meteor", "a", "b"), "grader.evaluation_metric", "meteor needs WordNet");
    expect_refused(SIMILAR("rouge_6", "a", "b"), "grader.evaluation_metric", "\"rouge_6\" is not one of");
    expect_refused("{\"grader\": {\"type\": \"score_model\"}}", "grader.model", "missing required field 'model'");
    expect_refused("{\"grader\": {\"type\": \"regex\"}}", "grader.type", "unknown grader type \"regex\"");
    expect_refused("{\"grader\": {\"type\": \"string_check\", \"operation\": \"eq\", \"input\": \"a\", "
                   "\"reference\": \"b\", \"weight\": 2}}",
                   "grader.weight", "weight");
    expect_refused("{\"grader\": {\"type\": \"string_check\", \"operation\": \"eq\", \"input\": \"a\"}}",
                   "grader.reference", "reward.grader: missing required field 'reference'");
    expect_refused("{\"grader\": " CHECK_G("eq", "a", "b") ", \"verifiers\": [{\"type\": \"format\", \"pattern\": "
                   "\"x\"}]}",
                   "grader", "not both");
    expect_refused("{\"grader\": \"string_check\"}", "grader", "expected a grader object");
    expect_refused(SIMILAR("bleu", "{{sample.output_text}}", "x\", \"pass_threshold\": \"high"),
                   "grader.pass_threshold", "pass_threshold");
    expect_refused("{\"grader\": {\"type\": \"text_similarity\", \"evaluation_metric\": \"bleu\", \"input\": \"a\", "
                   "\"reference\": \"b\", \"pass_threshold\": 1.5}}",
                   "grader.pass_threshold", "pass_threshold");
}

Test(graders, refused_templates_name_the_field_and_offset) {
    expect_refused(CHECK("eq", "{{sample.output_text", "x"), "grader.input",
                   "reward.grader.input: \"{{\" at offset 0 is never closed");
    expect_refused(CHECK("eq", "a", "x {{row.answer}}"), "grader.reference",
                   "reward.grader.reference: \"{{row.answer}}\" at offset 2: unknown namespace");
    expect_refused(CHECK("eq", "{{sample.output_tools}}", "x"), "grader.input",
                   "\"{{sample.output_tools}}\" at offset 0: not available: smelt's samples are text completions");
    expect_refused(CHECK("eq", "{{item}}", "x"), "grader.input", "expected item.<field>");
    expect_refused(CHECK("eq", "{{item.a..b}}", "x"), "grader.input", "a '.' must be followed by a field name");
    expect_refused(CHECK("eq", "{{item.a[x]}}", "x"), "grader.input", "expected [index]");
    expect_refused(CHECK("eq", "{{sample.output_text.x}}", "x"), "grader.input", "nothing follows it");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"a\", \"graders\": {\"a\": "
                   CHECK_G("eq", "{{item.x y}}", "x") "}}}",
                   "grader.graders.a.input", "reward.grader.graders.a.input: \"{{item.x y}}\" at offset 0");
}

Test(graders, refused_multis_name_the_field) {
    expect_refused(MULTI_WITH("acc + sin"), "grader.calculate_output",
                   "reward.grader.calculate_output: unknown name \"sin\" (the graders are: acc, sim) at offset 6");
    expect_refused(MULTI_WITH("acc + sin(sim)"), "grader.calculate_output", "unknown function \"sin\"");
    expect_refused(MULTI_WITH("(acc + sim"), "grader.calculate_output", "expected ')' at offset 10");
    expect_refused(MULTI_WITH("acc +"), "grader.calculate_output", "the formula ends where");
    expect_refused(MULTI_WITH("acc sim"), "grader.calculate_output", "unexpected 's' after a complete formula at offset 4");
    expect_refused(MULTI_WITH("abs(acc, sim)"), "grader.calculate_output", "abs takes 1 argument, not 2 at offset 0");
    expect_refused(MULTI_WITH("acc * $"), "grader.calculate_output", "unexpected '$' at offset 6");
    expect_refused(MULTI_WITH(""), "grader.calculate_output", "0 bytes");
    expect_refused(MULTI_WITH("1e999"), "grader.calculate_output", "too large");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"a\", \"graders\": {}}}",
                   "grader.graders", "1 to 15 named graders");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"a\", \"graders\": {\"a\": "
                   "{\"type\": \"multi\", \"calculate_output\": \"1\", \"graders\": {}}}}}",
                   "grader.graders.a.type", "not another multi");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"1\", \"graders\": {\"2x\": "
                   CHECK_G("eq", "a", "b") "}}}",
                   "grader.graders", "\"2x\" is not a grader name");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"calculate_output\": \"1\", \"graders\": {\"max\": "
                   CHECK_G("eq", "a", "b") "}}}",
                   "grader.graders", "a function of calculate_output");
    expect_refused("{\"grader\": {\"type\": \"multi\", \"graders\": {\"a\": " CHECK_G("eq", "a", "b") "}}}",
                   "grader.calculate_output", "calculate_output");
    /* nesting deeper than 64 is refused, not a stack overflow */
    char deep[400] = "";
    for (int k = 0; k < 70; k++) strcat(deep, "(");
    strcat(deep, "acc");
    for (int k = 0; k < 70; k++) strcat(deep, ")");
    char spec[1200];
    snprintf(spec, sizeof spec, MULTI_WITH("%s"), deep);
    expect_refused(spec, "grader.calculate_output", "nested more than 64 deep");
}

/* ---- written back ---- */

Test(graders, spec_written_back_builds_the_same_stage) {
    const char *text = "{\"grader\": {\"type\": \"multi\", \"name\": \"my grader\", \"calculate_output\": "
                       "\"0.7 * acc + 0.3 * sim\", \"graders\": {\"acc\": {\"type\": \"string_check\", \"name\": "
                       "\"acc\", \"operation\": \"ilike\", \"input\": \"{{ sample.output_json.city }}\", "
                       "\"reference\": \"{{item.city}}\"}, \"sim\": {\"type\": \"text_similarity\", "
                       "\"evaluation_metric\": \"rouge_l\", \"pass_threshold\": 0.5, \"input\": "
                       "\"{{sample.output_text}}\", \"reference\": \"{{item.answer}}\"}}}}";
    struct reward_stage *st = rewards_test_stage(text);
    json_t *out = NULL, *again = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_to_json(st, &out, &err), SMELT_OK);
    json_t *want = rewards_test_parse(text);
    cr_expect(json_equal(out, want), "the spec written back differs from the spec");
    struct reward_stage *st2 = NULL;
    cr_assert_eq(reward_stage_create(out, "reward", &st2, &err), SMELT_OK, "%s", err.message);
    cr_assert_eq(reward_stage_to_json(st2, &again, &err), SMELT_OK);
    cr_expect(json_equal(out, again));
    struct reward_result a = grade(st, "{\"city\": \"PARIS\"} x y", "x y", "{\"city\": \"paris\"}");
    struct reward_result b = grade(st2, "{\"city\": \"PARIS\"} x y", "x y", "{\"city\": \"paris\"}");
    cr_expect(!a.failed && !b.failed && a.scores[1] == 0 && b.scores[1] == 0,
              "trailing text after the JSON: not JSON, so acc scores 0");
    a = grade(st, "{\"city\": \"PARIS\"}", "city paris", "{\"city\": \"paris\"}");
    b = grade(st2, "{\"city\": \"PARIS\"}", "city paris", "{\"city\": \"paris\"}");
    cr_assert(!a.failed && !b.failed, "%s", a.error);
    cr_expect_eq(a.reward, b.reward);
    cr_expect(fabs(a.reward - (0.7 + 0.3 * 1.0)) < 1e-15, "reward %.17g", a.reward);
    json_decref(want);
    json_decref(out);
    json_decref(again);
    reward_stage_free(st);
    reward_stage_free(st2);
}
