/* The reward stage (rewards/rewards.h): the number grammar, every extraction rule and
 * verifier on hand-made completions (negative numbers, decimals, thousands separators,
 * trailing periods, no number, several markers, nested \boxed{}, Unicode, invalid UTF-8,
 * empty completions), weights combining, the length penalty at each boundary, every bad
 * spec with the exact field path, per-sample failures beside a scored batch, the
 * up-front prompt check, names and the spec written back. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rewards/rewards.h"
#include "rewards/rewards_internal.h"
#include "rewards_testutil.h"

/* ---- helpers ---- */

static struct reward_result score_one(struct reward_stage *st, const char *completion, const char *answer,
                                      int64_t n_tokens, const char *finish) {
    struct reward_sample s = {.prompt = "Q", .completion = completion, .answer = answer,
                              .n_completion_tokens = n_tokens, .finish_reason = finish};
    return rewards_test_score(st, &s);
}

/* The one verifier's score of completion against answer; the sample must not fail. */
static double score_with(const char *spec_text, const char *completion, const char *answer) {
    struct reward_stage *st = rewards_test_stage(spec_text);
    struct reward_result r = score_one(st, completion, answer, 0, "stop");
    reward_stage_free(st);
    cr_assert(!r.failed, "%s on \"%s\" failed: %s", spec_text, completion, r.error);
    cr_assert(r.error[0] == '\0');
    return r.scores[0];
}

#define EXPECT_SCORE(spec, completion, answer, want)                                                          \
    do {                                                                                                      \
        double got_ = score_with(spec, completion, answer);                                                   \
        cr_expect(got_ == (want), "%s: \"%s\" vs \"%s\": score %g, expected %g", spec, completion,            \
                  (answer) ? (const char *)(answer) : "(none)", got_, (double)(want));                        \
    } while (0)

/* The one verifier's failure message on completion/answer (the sample must fail). */
static void expect_sample_fails(const char *spec_text, const char *completion, const char *answer,
                                const char *message_part) {
    struct reward_stage *st = rewards_test_stage(spec_text);
    struct reward_result r = score_one(st, completion, answer, 0, "stop");
    reward_stage_free(st);
    cr_expect(r.failed, "%s on \"%s\": expected a failure", spec_text, completion);
    cr_expect(isnan(r.reward) && isnan(r.scores[0]));
    cr_expect(strstr(r.error, message_part), "error \"%s\" lacks \"%s\"", r.error, message_part);
}

/* ---- the number grammar ---- */

static void expect_last_number(const char *text, const char *span, double value) {
    size_t start = 0, end = 0;
    double x = 0;
    bool found = reward_number_last(text, strlen(text), &start, &end, &x);
    cr_expect(found, "no number found in \"%s\"", text);
    if (!found) return;
    cr_expect(end - start == strlen(span) && memcmp(text + start, span, end - start) == 0,
              "\"%s\": span \"%.*s\", expected \"%s\"", text, (int)(end - start), text + start, span);
    cr_expect(x == value, "\"%s\": value %.17g, expected %.17g", text, x, value);
}

Test(rewards, last_number_grammar) {
    expect_last_number("The answer is 42.", "42", 42);
    expect_last_number("It is -7 degrees", "-7", -7);
    expect_last_number("x = -3", "-3", -3);
    expect_last_number("(-3)", "-3", -3);
    expect_last_number("5-3", "3", 3);           /* a minus after a digit is an operator */
    expect_last_number("2024-01-15", "15", 15);
    expect_last_number("x-3", "3", 3);           /* ... and after a letter */
    expect_last_number("+5", "+5", 5);
    expect_last_number("\xE2\x88\x92" "12 K", "\xE2\x88\x92" "12", -12); /* U+2212 MINUS SIGN */
    expect_last_number("pi is about 3.14159", "3.14159", 3.14159);
    expect_last_number("costs $1,234.50 in total", "1,234.50", 1234.5);
    expect_last_number("1,234,567 people", "1,234,567", 1234567);
    expect_last_number("1,23", "23", 23);         /* not a thousands group: two numbers */
    expect_last_number("1,2345", "2345", 2345);
    expect_last_number("1234,567", "567", 567);   /* a group needs 1 to 3 leading digits */
    expect_last_number("a list: 1,2,3", "3", 3);
    expect_last_number("about .5 of it", ".5", 0.5);
    expect_last_number("version 1.2.3", "3", 3);
    expect_last_number("1e5 atoms", "1e5", 1e5);
    expect_last_number("2.5E-3", "2.5E-3", 2.5e-3);
    expect_last_number("3 eggs", "3", 3);         /* "e" without digits after it is a letter */
    expect_last_number("3.0", "3.0", 3);
    expect_last_number("答案是 ٣ 和 12。", "12", 12); /* ASCII digits only: ٣ is not one */
    expect_last_number("-0", "-0", 0);
    size_t start, end;
    double x;
    cr_expect(!reward_number_last("no number here", 14, &start, &end, &x));
    cr_expect(!reward_number_last("", 0, &start, &end, &x));
    cr_expect(!reward_number_last("- . , e", 7, &start, &end, &x));
    /* A number over 320 characters is ignored, not misread. */
    char long_text[512] = "7 then ";
    memset(long_text + 7, '9', 400);
    long_text[407] = '\0';
    expect_last_number(long_text, "7", 7);
    /* An overflowing exponent is still the last number: +inf, which equals nothing. */
    cr_expect(reward_number_last("1e999", 5, &start, &end, &x) && isinf(x) && x > 0);
}

Test(rewards, whole_number) {
    double x = 0;
    cr_expect(reward_number_whole("1,234", 5, &x) && x == 1234);
    cr_expect(reward_number_whole("-0.5", 4, &x) && x == -0.5);
    cr_expect(reward_number_whole("+7", 2, &x) && x == 7);
    cr_expect(!reward_number_whole(" 5", 2, &x));
    cr_expect(!reward_number_whole("5 apples", 8, &x));
    cr_expect(!reward_number_whole("42.", 3, &x));
    cr_expect(!reward_number_whole("$5", 2, &x));
    cr_expect(!reward_number_whole("", 0, &x));
    cr_expect(!reward_number_whole("1,23", 4, &x));
}

/* ---- exact_match ---- */

#define FULL "{\"verifiers\": [{\"type\": \"exact_match\"}]}"
#define FULL_LOWER "{\"verifiers\": [{\"type\": \"exact_match\", \"normalize\": [\"lowercase\"]}]}"
#define FULL_BOTH "{\"verifiers\": [{\"type\": \"exact_match\", \"normalize\": [\"lowercase\", \"strip_period\"]}]}"

Test(rewards, exact_match_full) {
    EXPECT_SCORE(FULL, "  Paris \n", "Paris", 1);
    EXPECT_SCORE(FULL, "Paris", " Paris\t", 1);
    EXPECT_SCORE(FULL, "paris", "Paris", 0);
    EXPECT_SCORE(FULL, "Paris.", "Paris", 0);
    EXPECT_SCORE(FULL, "The capital is Paris", "Paris", 0);
    EXPECT_SCORE(FULL_LOWER, "PARIS", "paris", 1);
    EXPECT_SCORE(FULL_LOWER, "Paris.", "paris", 0);
    EXPECT_SCORE(FULL_BOTH, "Paris. ", "paris", 1);
    EXPECT_SCORE(FULL_BOTH, "Paris..", "paris", 0);          /* one period only */
    EXPECT_SCORE(FULL_LOWER, "CAFÉ ÅNGSTRÖM", "café ångström", 1); /* Unicode lowercase */
    EXPECT_SCORE(FULL, "café", "cafe", 0);
    EXPECT_SCORE(FULL_LOWER, "ΣΟΦΙΑ", "σοφια", 1);
    EXPECT_SCORE(FULL, "", "Paris", 0);                       /* empty completion */
    EXPECT_SCORE(FULL, " \n\t", "Paris", 0);
    EXPECT_SCORE(FULL_LOWER, "\xff" "abc", "\xff" "ABC", 1);  /* invalid UTF-8 compares as bytes */
    EXPECT_SCORE(FULL_LOWER, "\xfe" "abc", "\xff" "abc", 0);
    EXPECT_SCORE(FULL, "3.0", "3", 1);                        /* numbers compare as numbers */
    EXPECT_SCORE(FULL, "1,000", "1000", 1);
}

#define LAST_NUMBER "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"last_number\"}}]}"

Test(rewards, exact_match_last_number) {
    EXPECT_SCORE(LAST_NUMBER, "3 + 4 = 7.", "7", 1);
    EXPECT_SCORE(LAST_NUMBER, "3 + 4 = 7.", "7.0", 1);
    EXPECT_SCORE(LAST_NUMBER, "so the result is 3.0", "3", 1);
    EXPECT_SCORE(LAST_NUMBER, "It falls to -5 at night", "-5", 1);
    EXPECT_SCORE(LAST_NUMBER, "It falls to -5 at night", "5", 0);
    EXPECT_SCORE(LAST_NUMBER, "She pays $1,234 in total.", "1234", 1);
    EXPECT_SCORE(LAST_NUMBER, "She pays $1234 in total.", "1,234", 1);
    EXPECT_SCORE(LAST_NUMBER, "first 12, then 13", "12", 0); /* the last number counts */
    EXPECT_SCORE(LAST_NUMBER, "0.1 of it: 0.50", "0.5", 1);
    EXPECT_SCORE(LAST_NUMBER, "I do not know", "7", 0);      /* no number: 0, not a failure */
    EXPECT_SCORE(LAST_NUMBER, "", "7", 0);
    EXPECT_SCORE(LAST_NUMBER, "结果是 42。", "42", 1);
    expect_sample_fails(LAST_NUMBER, "7", "seven", "is not a number");
    expect_sample_fails(LAST_NUMBER, "7", NULL, "the row has no \"answer\"");
    expect_sample_fails(LAST_NUMBER, "7", "  ", "is empty");
}

#define MARKER                                                                                   \
    "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"after_marker\", \"marker\": " \
    "\"####\"}}]}"

Test(rewards, exact_match_after_marker) {
    EXPECT_SCORE(MARKER, "She has 3 + 69 = 72 apples.\n#### 72", "72", 1);
    EXPECT_SCORE(MARKER, "#### 5 is wrong, so\n#### 6", "6", 1);  /* the last marker */
    EXPECT_SCORE(MARKER, "#### 5 is wrong, so\n#### 6", "5", 0);
    EXPECT_SCORE(MARKER, "#### 9\nThat is all.", "9", 1);         /* the first line only */
    EXPECT_SCORE(MARKER, "####\n  8 \nmore text", "8", 1);        /* the first non-blank line */
    EXPECT_SCORE(MARKER, "#### 3.0", "3", 1);                     /* numbers as numbers */
    EXPECT_SCORE(MARKER, "#### 1,234", "1234", 1);
    EXPECT_SCORE(MARKER, "#### 72 apples", "72", 0);              /* the whole line is the answer */
    EXPECT_SCORE(MARKER, "The answer is 72", "72", 0);            /* no marker */
    EXPECT_SCORE(MARKER, "72 ####", "72", 0);                     /* nothing after it */
    EXPECT_SCORE(MARKER, "##### 72", "72", 1);                    /* overlapping occurrences */
    EXPECT_SCORE(MARKER, "", "72", 0);
    EXPECT_SCORE("{\"verifiers\": [{\"type\": \"exact_match\", \"normalize\": [\"strip_period\"], \"extract\": "
                 "{\"type\": \"after_marker\", \"marker\": \"Answer:\"}}]}",
                 "Answer: Ünïcødé.", "Ünïcødé", 1);
}

Test(rewards, exact_match_regex) {
    const char *spec = "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": "
                       "\"answer: (\\\\w+)\"}}]}";
    EXPECT_SCORE(spec, "answer: foo, and finally answer: bar", "bar", 1);
    EXPECT_SCORE(spec, "answer: foo, and finally answer: bar", "foo", 0);
    EXPECT_SCORE(spec, "answer: Ελλάδα", "Ελλάδα", 1);          /* \w is Unicode (UCP) */
    EXPECT_SCORE(spec, "no match", "bar", 0);
    const char *group0 = "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": "
                         "\"[0-9]+ apples\", \"group\": 0}}]}";
    EXPECT_SCORE(group0, "2 apples and 5 apples", "5 apples", 1);
    /* The last match leaves group 2 unset: nothing is extracted. */
    const char *unset = "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": "
                        "\"(a)|(b)\", \"group\": 2}}]}";
    EXPECT_SCORE(unset, "b a", "b", 0);
    EXPECT_SCORE(unset, "a b", "b", 1);
    /* An extraction regex that exceeds its step limit fails the sample. */
    const char *slow = "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", "
                       "\"pattern\": \"^(a|aa)+$\"}}]}";
    char subject[64];
    memset(subject, 'a', 48);
    strcpy(subject + 48, "c");
    expect_sample_fails(slow, subject, "a", "exact_match (verifiers[0], exact_match): the regex gave up after");
}

#define BOXED "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"boxed\"}}]}"

Test(rewards, exact_match_boxed) {
    EXPECT_SCORE(BOXED, "so $\\boxed{42}$.", "42", 1);
    EXPECT_SCORE(BOXED, "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1);   /* nested braces */
    EXPECT_SCORE(BOXED, "first \\boxed{1}, then \\boxed{2}", "2", 1); /* the last box */
    EXPECT_SCORE(BOXED, "\\boxed{\\boxed{3}}", "\\boxed{3}", 1);       /* a box inside a box is its content */
    EXPECT_SCORE(BOXED, "\\boxed{\\boxed{3}}", "3", 0);
    EXPECT_SCORE(BOXED, "\\boxed{5} and then \\boxed{6", "5", 1);     /* an unclosed box does not count */
    EXPECT_SCORE(BOXED, "\\boxed{ 6 \\boxed{7}", "7", 1);              /* ... a closed box inside it does */
    EXPECT_SCORE(BOXED, "\\boxed{\\{1, 2\\}}", "\\{1, 2\\}", 1);       /* escaped braces are literal */
    EXPECT_SCORE(BOXED, "\\boxed{ 3.0 }", "3", 1);
    EXPECT_SCORE(BOXED, "\\boxed{}", "0", 0);
    EXPECT_SCORE(BOXED, "the answer is 42", "42", 0);
    EXPECT_SCORE(BOXED, "\\boxed{x²+ÿ}", "x²+ÿ", 1);
}

/* ---- numeric_match ---- */

Test(rewards, numeric_match) {
    const char *tol = "{\"verifiers\": [{\"type\": \"numeric_match\", \"tolerance\": 0.01}]}";
    EXPECT_SCORE(tol, "pi is about 3.14", "3.14159", 1);
    EXPECT_SCORE(tol, "pi is about 3.2", "3.14159", 0);
    EXPECT_SCORE(tol, "it is -2.5.", "-2.5", 1);
    EXPECT_SCORE(tol, "no number", "3", 0);
    EXPECT_SCORE(tol, "1e999", "5", 0);                          /* +inf matches nothing */
    const char *exact = "{\"verifiers\": [{\"type\": \"numeric_match\", \"tolerance\": 0.25}]}";
    EXPECT_SCORE(exact, "0.5", "0.25", 1);                       /* |x - a| = tolerance: in */
    EXPECT_SCORE(exact, "0.5", "0.125", 0);
    const char *rel = "{\"verifiers\": [{\"type\": \"numeric_match\", \"tolerance\": 0, \"relative\": 0.125}]}";
    EXPECT_SCORE(rel, "112.5", "100", 1);                        /* |x - a| <= 0 + 0.125 * |a| */
    EXPECT_SCORE(rel, "87.5", "100", 1);
    EXPECT_SCORE(rel, "112.6", "100", 0);
    EXPECT_SCORE(rel, "1,100", "1000", 1);
    const char *def = "{\"verifiers\": [{\"type\": \"numeric_match\"}]}"; /* tolerance 1e-6 */
    EXPECT_SCORE(def, "0.3", "0.30000001", 1);
    EXPECT_SCORE(def, "0.3", "0.3001", 0);
    const char *marker = "{\"verifiers\": [{\"type\": \"numeric_match\", \"extract\": {\"type\": \"after_marker\", "
                         "\"marker\": \"####\"}}]}";
    EXPECT_SCORE(marker, "#### 42.", "42", 1);                   /* a trailing period dropped */
    EXPECT_SCORE(marker, "#### 42 apples", "42", 0);             /* the extracted text must be a number */
    EXPECT_SCORE(marker, "#### 1,234", "1234", 1);
    expect_sample_fails(tol, "3", "three", "\"three\" is not a number");
    expect_sample_fails(tol, "3", NULL, "no \"answer\"");
    expect_sample_fails(tol, "3", "1e999", "is not a number");   /* an answer must be finite */
}

/* ---- regex_match and format ---- */

Test(rewards, regex_match) {
    const char *search = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"\\\\d{3}\"}]}";
    EXPECT_SCORE(search, "call 555 now", NULL, 1);
    EXPECT_SCORE(search, "call 55 now", NULL, 0);
    EXPECT_SCORE(search, "", NULL, 0);
    const char *full = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"\\\\d+\", \"full_match\": true}]}";
    EXPECT_SCORE(full, "123\n", NULL, 1);     /* a full match of the trimmed completion */
    EXPECT_SCORE(full, "123 abc", NULL, 0);
    EXPECT_SCORE(full, "abc 123", NULL, 0);
    const char *alt = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"a|ab\", \"full_match\": true}]}";
    EXPECT_SCORE(alt, "ab", NULL, 1);         /* the end anchor backtracks into the alternative */
    const char *han = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"^\\\\p{Han}+$\"}]}";
    EXPECT_SCORE(han, "漢字", NULL, 1);
    EXPECT_SCORE(han, "kanji", NULL, 0);
    const char *abc = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"abc\"}]}";
    EXPECT_SCORE(abc, "\xff\xfe" "abc\xc3", NULL, 1); /* invalid UTF-8 does not fail the match */
    /* Catastrophic backtracking: the match limit fails this sample, quickly. */
    const char *slow = "{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"^(a|aa)+$\"}]}";
    char subject[64];
    memset(subject, 'a', 48);
    subject[48] = 'c';
    subject[49] = '\0';
    expect_sample_fails(slow, subject, NULL, "matching steps");
}

Test(rewards, format) {
    const char *spec = "{\"verifiers\": [{\"type\": \"format\", \"pattern\": "
                       "\"<think>.*</think>\\\\s*<answer>.*</answer>\"}]}";
    EXPECT_SCORE(spec, "<think>a\nb</think>\n<answer>42</answer>\n", NULL, 1); /* "." spans lines */
    EXPECT_SCORE(spec, "  <think></think><answer></answer>", NULL, 1);
    EXPECT_SCORE(spec, "<think>a</think>\n42", NULL, 0);
    EXPECT_SCORE(spec, "<think>a</think><answer>42</answer> and more", NULL, 0);
    EXPECT_SCORE(spec, "Sure! <think>a</think><answer>42</answer>", NULL, 0);
    EXPECT_SCORE(spec, "", NULL, 0);
}

/* ---- length_penalty ---- */

static double length_score(struct reward_stage *st, int64_t len, const char *finish) {
    struct reward_result r = score_one(st, "text", NULL, len, finish);
    cr_assert(!r.failed, "%s", r.error);
    return r.scores[0];
}

Test(rewards, length_penalty_boundaries) {
    /* L = 100, C = 20: 0 up to 80, (80 - len) / 20 on (80, 100], -1 beyond. */
    struct reward_stage *st = rewards_test_stage("{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 100, "
                                                 "\"cache_tokens\": 20}]}");
    cr_expect(length_score(st, 0, "stop") == 0.0);
    cr_expect(length_score(st, 79, "stop") == 0.0);
    cr_expect(length_score(st, 80, "stop") == 0.0);
    cr_expect(length_score(st, 81, "stop") == -1.0 / 20.0);
    cr_expect(length_score(st, 90, "stop") == -0.5);
    cr_expect(length_score(st, 99, "stop") == -19.0 / 20.0);
    cr_expect(length_score(st, 100, "stop") == -1.0);
    cr_expect(length_score(st, 101, "stop") == -1.0);
    cr_expect(length_score(st, 100000, "stop") == -1.0);
    cr_expect(length_score(st, 50, "length") == 0.0);  /* no truncated_penalty: finish reason ignored */
    cr_expect(length_score(st, 50, NULL) == 0.0);
    struct reward_result r = score_one(st, "text", NULL, -1, "stop");
    cr_expect(r.failed && strstr(r.error, "length_penalty (verifiers[0], length_penalty): n_completion_tokens is -1"),
              "%s", r.error);
    reward_stage_free(st);

    st = rewards_test_stage("{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 100, "
                            "\"cache_tokens\": 20, \"truncated_penalty\": 0.5}]}");
    cr_expect(length_score(st, 50, "length") == -0.5);    /* truncated: at most -p */
    cr_expect(length_score(st, 90, "length") == -0.5);    /* min(-0.5, -0.5) */
    cr_expect(length_score(st, 95, "length") == -0.75);   /* the length term is lower */
    cr_expect(length_score(st, 50, "stop") == 0.0);
    cr_expect(length_score(st, 50, "abort") == 0.0);
    reward_stage_free(st);

    /* C = L: every token counts. */
    st = rewards_test_stage(
        "{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 8, \"cache_tokens\": 8}]}");
    cr_expect(length_score(st, 0, "stop") == 0.0);
    cr_expect(length_score(st, 1, "stop") == -1.0 / 8.0);
    cr_expect(length_score(st, 8, "stop") == -1.0);
    reward_stage_free(st);

    /* C = 0: no soft band (TRL's soft_punish_cache = 0): 0 up to L, -1 beyond. */
    st = rewards_test_stage(
        "{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 8, \"cache_tokens\": 0}]}");
    cr_expect(length_score(st, 8, "stop") == 0.0);
    cr_expect(length_score(st, 9, "stop") == -1.0);
    reward_stage_free(st);
}

/* ---- the stage: weights, batches, failures ---- */

#define MIXED                                                                                                   \
    "{\"verifiers\": ["                                                                                         \
    "{\"type\": \"exact_match\", \"weight\": 2, \"extract\": {\"type\": \"last_number\"}},"                      \
    "{\"type\": \"format\", \"weight\": 0.5, \"pattern\": \"<answer>.*</answer>\"},"                            \
    "{\"type\": \"length_penalty\", \"weight\": 0.25, \"max_tokens\": 10, \"cache_tokens\": 4}]}"

Test(rewards, weights_combine) {
    struct reward_stage *st = rewards_test_stage(MIXED);
    cr_assert_eq(reward_stage_count(st), 3);
    struct reward_result r = score_one(st, "<answer>7</answer>", "7", 8, "stop");
    cr_assert(!r.failed, "%s", r.error);
    cr_expect(r.scores[0] == 1.0 && r.scores[1] == 1.0 && r.scores[2] == -0.5);
    cr_expect(r.reward == 2.0 * 1.0 + 0.5 * 1.0 + 0.25 * -0.5, "reward %.17g", r.reward);
    for (int k = 3; k < REWARD_MAX_VERIFIERS; k++) cr_expect(r.scores[k] == 0.0);
    r = score_one(st, "7", "7", 11, "length");
    cr_expect(r.scores[0] == 1.0 && r.scores[1] == 0.0 && r.scores[2] == -1.0);
    cr_expect(r.reward == 2.0 - 0.25, "reward %.17g", r.reward);
    r = score_one(st, "<answer>8</answer>", "7", 0, "stop");
    cr_expect(r.reward == 0.5, "reward %.17g", r.reward);
    reward_stage_free(st);

    st = rewards_test_stage("{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"x\", \"weight\": -1.5},"
                            "{\"type\": \"regex_match\", \"pattern\": \"y\", \"weight\": 0}]}");
    r = score_one(st, "xy", NULL, 0, "stop");
    cr_expect(r.reward == -1.5 && r.scores[0] == 1.0 && r.scores[1] == 1.0, "reward %.17g", r.reward);
    reward_stage_free(st);
}

Test(rewards, per_sample_failures_do_not_fail_the_batch) {
    struct reward_stage *st = rewards_test_stage(MIXED);
    struct reward_sample samples[4] = {
        {.completion = "<answer>7</answer>", .answer = "7", .n_completion_tokens = 3, .finish_reason = "stop"},
        {.completion = "<answer>7</answer>", .answer = NULL, .n_completion_tokens = 3, .finish_reason = "stop"},
        {.completion = "<answer>7</answer>", .answer = "7", .n_completion_tokens = -4, .finish_reason = "stop"},
        {.completion = "", .answer = "7", .n_completion_tokens = 0, .finish_reason = "stop"},
    };
    struct reward_result out[4];
    memset(out, 0xff, sizeof out);
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_score(st, samples, 4, out, &err), SMELT_OK);
    cr_expect(!out[0].failed && out[0].reward == 2.5 && out[0].error[0] == '\0');
    cr_expect(out[1].failed && isnan(out[1].reward));
    cr_expect(strcmp(out[1].error, "exact_match (verifiers[0], exact_match): the row has no \"answer\"") == 0, "%s",
              out[1].error);
    cr_expect(isnan(out[1].scores[0]) && out[1].scores[1] == 1.0 && out[1].scores[2] == 0.0,
              "the other verifiers still score, for metrics");
    cr_expect(out[2].failed && isnan(out[2].reward) && isnan(out[2].scores[2]) && out[2].scores[0] == 1.0);
    cr_expect(strstr(out[2].error, "length_penalty (verifiers[2], length_penalty)"), "%s", out[2].error);
    cr_expect(!out[3].failed && out[3].reward == 0.0, "an empty completion scores, it does not fail");

    /* The stage's own failures: bad arguments, refused before anything is scored. */
    cr_expect_eq(reward_stage_score(st, samples, -1, out, &err), SMELT_EINVAL);
    cr_expect_eq(reward_stage_score(st, NULL, 2, out, &err), SMELT_EINVAL);
    samples[2].completion = NULL;
    memset(out, 0, sizeof out);
    cr_expect_eq(reward_stage_score(st, samples, 4, out, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "samples[2].completion is NULL"), "%s", err.message);
    cr_expect(out[0].reward == 0.0, "nothing was scored");
    cr_expect_eq(reward_stage_score(st, NULL, 0, NULL, &err), SMELT_OK);
    reward_stage_free(st);
}

Test(rewards, scoring_is_deterministic) {
    struct reward_stage *st = rewards_test_stage(MIXED);
    struct reward_sample s[3] = {
        {.completion = "<answer>7</answer>", .answer = "7", .n_completion_tokens = 9, .finish_reason = "stop"},
        {.completion = "so 7.", .answer = "7", .n_completion_tokens = 7, .finish_reason = "stop"},
        {.completion = "no", .answer = "7", .n_completion_tokens = 10, .finish_reason = "length"},
    };
    struct reward_result a[3], b[3];
    cr_assert_eq(reward_stage_score(st, s, 3, a, NULL), SMELT_OK);
    cr_assert_eq(reward_stage_score(st, s, 3, b, NULL), SMELT_OK);
    cr_expect(memcmp(a, b, sizeof a) == 0);
    for (int i = 0; i < 3; i++) { /* a batch scores each sample as it would alone */
        struct reward_result one = score_one(st, s[i].completion, s[i].answer, s[i].n_completion_tokens,
                                             s[i].finish_reason);
        cr_expect(memcmp(&one, &a[i], sizeof one) == 0, "sample %d", i);
    }
    reward_stage_free(st);
}

/* ---- the prompt check ---- */

Test(rewards, check_prompt) {
    struct smelt_error err = {0};
    struct reward_stage *st = rewards_test_stage(MIXED);
    cr_expect_eq(reward_stage_check_prompt(st, "42", NULL, &err), SMELT_OK);
    cr_expect_eq(reward_stage_check_prompt(st, "1,234", "{\"source\": \"gsm8k\"}", &err), SMELT_OK);
    cr_expect_eq(reward_stage_check_prompt(st, NULL, NULL, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "answer");
    cr_expect_str_eq(err.message, "exact_match (verifiers[0], exact_match): the row has no \"answer\"");
    cr_expect_eq(reward_stage_check_prompt(st, "forty-two", NULL, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "\"forty-two\" is not a number"), "%s", err.message);
    reward_stage_free(st);

    st = rewards_test_stage(FULL);
    cr_expect_eq(reward_stage_check_prompt(st, "forty-two", NULL, &err), SMELT_OK); /* text is fine here */
    cr_expect_eq(reward_stage_check_prompt(st, " ", NULL, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "is empty"), "%s", err.message);
    reward_stage_free(st);

    st = rewards_test_stage("{\"verifiers\": [{\"type\": \"numeric_match\", \"name\": \"close\"}]}");
    cr_expect_eq(reward_stage_check_prompt(st, "abc", NULL, &err), SMELT_EINVAL);
    cr_expect(strncmp(err.message, "close (verifiers[0], numeric_match): ", 37) == 0, "%s", err.message);
    reward_stage_free(st);

    st = rewards_test_stage("{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\"}]}"); /* reads no answer */
    cr_expect_eq(reward_stage_check_prompt(st, NULL, NULL, &err), SMELT_OK);
    reward_stage_free(st);
}

/* ---- names and the spec written back ---- */

Test(rewards, names) {
    struct reward_stage *st = rewards_test_stage(
        "{\"verifiers\": [{\"type\": \"exact_match\"}, {\"type\": \"regex_match\", \"pattern\": \"a\"},"
        "{\"type\": \"regex_match\", \"pattern\": \"b\", \"name\": \"has_b\"},"
        "{\"type\": \"regex_match\", \"pattern\": \"c\"}, {\"type\": \"format\", \"pattern\": \"d\", \"name\": "
        "\"length_penalty\"}, {\"type\": \"length_penalty\", \"max_tokens\": 4, \"cache_tokens\": 1}]}");
    const char *want[] = {"exact_match", "regex_match_1", "has_b", "regex_match_3", "length_penalty",
                          "length_penalty_5"};
    cr_assert_eq(reward_stage_count(st), 6);
    for (int i = 0; i < 6; i++) cr_expect_str_eq(reward_stage_name(st, i), want[i]);
    reward_stage_free(st);
}

Test(rewards, to_json_fills_defaults_and_round_trips) {
    struct reward_stage *st = rewards_test_stage(
        "{\"verifiers\": [{\"type\": \"exact_match\"}, {\"type\": \"numeric_match\"},"
        "{\"type\": \"exact_match\", \"normalize\": [\"strip_period\", \"lowercase\"], \"extract\": {\"type\": "
        "\"regex\", \"pattern\": \"= (\\\\d+)\"}},"
        "{\"type\": \"regex_match\", \"pattern\": \"x\"}, {\"type\": \"format\", \"pattern\": \"y\", \"weight\": 0.5},"
        "{\"type\": \"length_penalty\", \"max_tokens\": 10, \"cache_tokens\": 2},"
        "{\"type\": \"exact_match\", \"extract\": {\"type\": \"after_marker\", \"marker\": \"####\"}},"
        "{\"type\": \"exact_match\", \"extract\": {\"type\": \"boxed\"}}]}");
    json_t *out = NULL;
    cr_assert_eq(reward_stage_to_json(st, &out, NULL), SMELT_OK);
    json_t *want = rewards_test_parse(
        "{\"verifiers\": ["
        "{\"type\": \"exact_match\", \"name\": \"exact_match_0\", \"weight\": 1.0, \"normalize\": [], \"extract\": "
        "{\"type\": \"full\"}},"
        "{\"type\": \"numeric_match\", \"name\": \"numeric_match\", \"weight\": 1.0, \"extract\": {\"type\": "
        "\"last_number\"}, \"tolerance\": 1e-6, \"relative\": 0.0},"
        "{\"type\": \"exact_match\", \"name\": \"exact_match_2\", \"weight\": 1.0, \"normalize\": [\"lowercase\", "
        "\"strip_period\"], \"extract\": {\"type\": \"regex\", \"pattern\": \"= (\\\\d+)\", \"group\": 1}},"
        "{\"type\": \"regex_match\", \"name\": \"regex_match\", \"weight\": 1.0, \"pattern\": \"x\", \"full_match\": "
        "false},"
        "{\"type\": \"format\", \"name\": \"format\", \"weight\": 0.5, \"pattern\": \"y\"},"
        "{\"type\": \"length_penalty\", \"name\": \"length_penalty\", \"weight\": 1.0, \"max_tokens\": 10, "
        "\"cache_tokens\": 2, \"truncated_penalty\": null},"
        "{\"type\": \"exact_match\", \"name\": \"exact_match_6\", \"weight\": 1.0, \"normalize\": [], \"extract\": "
        "{\"type\": \"after_marker\", \"marker\": \"####\"}},"
        "{\"type\": \"exact_match\", \"name\": \"exact_match_7\", \"weight\": 1.0, \"normalize\": [], \"extract\": "
        "{\"type\": \"boxed\"}}]}");
    char *got_text = json_dumps(out, JSON_SORT_KEYS), *want_text = json_dumps(want, JSON_SORT_KEYS);
    cr_expect(json_equal(out, want), "got  %s\nwant %s", got_text, want_text);
    free(got_text);
    free(want_text);
    /* The written spec builds the same stage. */
    struct reward_stage *again = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_create(out, "reward", &again, &err), SMELT_OK, "%s", err.message);
    json_t *out2 = NULL;
    cr_assert_eq(reward_stage_to_json(again, &out2, NULL), SMELT_OK);
    cr_expect(json_equal(out, out2));
    json_decref(out2);
    json_decref(out);
    json_decref(want);
    reward_stage_free(again);
    reward_stage_free(st);
}

/* ---- bad specs: the exact field path ---- */

struct bad_spec {
    const char *spec;
    const char *field;   /* err->field, relative to the spec */
    const char *message; /* a part of the message */
};

static const struct bad_spec BAD[] = {
    {"[]", "", "reward: the reward spec must be a JSON object"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\"}], \"graders\": []}", "graders",
     "reward: unknown field 'graders'"},
    {"{}", "verifiers", "reward.verifiers: missing"},
    {"{\"verifiers\": {}}", "verifiers", "reward.verifiers: expected a list of 1 to 16 verifiers"},
    {"{\"verifiers\": []}", "verifiers", "reward.verifiers: 0 verifiers, expected 1 to 16"},
    {"{\"verifiers\": [1]}", "verifiers[0]", "reward.verifiers[0]: expected an object"},
    {"{\"verifiers\": [{}]}", "verifiers[0].type", "reward.verifiers[0]: missing required field 'type'"},
    {"{\"verifiers\": [{\"type\": 3}]}", "verifiers[0].type", "reward.verifiers[0]: field 'type' must be a string"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\"}, {\"type\": \"magic\"}]}", "verifiers[1].type",
     "reward.verifiers[1].type: unknown verifier type \"magic\""},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"patern\": \"y\"}]}", "verifiers[0].patern",
     "reward.verifiers[0]: unknown field 'patern'"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 4, \"cache_tokens\": 1, \"pattern\": \"x\"}]}",
     "verifiers[0].pattern", "unknown field 'pattern'"},
    {"{\"verifiers\": [{\"type\": \"regex_match\"}]}", "verifiers[0].pattern",
     "reward.verifiers[0]: missing required field 'pattern'"},
    {"{\"verifiers\": [{\"type\": \"exact_match\"}, {\"type\": \"regex_match\", \"pattern\": \"(ab\"}]}",
     "verifiers[1].pattern",
     "reward.verifiers[1].pattern: regex does not compile at offset 3: missing closing parenthesis"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"\"}]}", "verifiers[0].pattern",
     "reward.verifiers[0].pattern: must not be empty"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": \"[a\"}}]}",
     "verifiers[0].extract.pattern", "reward.verifiers[0].extract.pattern: regex does not compile at offset 2"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": \"a\"}}]}",
     "verifiers[0].extract.group", "reward.verifiers[0].extract.group: 1, but the pattern has 0 capture group(s)"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"regex\", \"pattern\": \"(a)\", "
     "\"group\": -1}}]}",
     "verifiers[0].extract.group", "reward.verifiers[0].extract: field 'group' is -1, outside the allowed range"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": \"last_number\"}]}", "verifiers[0].extract",
     "reward.verifiers[0].extract: expected an object"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"first_number\"}}]}",
     "verifiers[0].extract.type", "reward.verifiers[0].extract.type: unknown extraction \"first_number\""},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {}}]}", "verifiers[0].extract.type",
     "reward.verifiers[0].extract: missing required field 'type'"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"last_number\", \"marker\": \"#\"}}]}",
     "verifiers[0].extract.marker", "reward.verifiers[0].extract: unknown field 'marker'"},
    {"{\"verifiers\": [{\"type\": \"numeric_match\", \"extract\": {\"type\": \"after_marker\"}}]}",
     "verifiers[0].extract.marker", "reward.verifiers[0].extract: missing required field 'marker'"},
    {"{\"verifiers\": [{\"type\": \"numeric_match\", \"extract\": {\"type\": \"after_marker\", \"marker\": \"\"}}]}",
     "verifiers[0].extract.marker", "reward.verifiers[0].extract.marker: must be 1 to 256 bytes, got 0"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"weight\": \"1\"}]}", "verifiers[0].weight",
     "reward.verifiers[0]: field 'weight' must be a number"},
    /* jansson holds no inf or NaN (json_real refuses them, the parser calls 1e999 an
     * overflow), so a finite range is what keeps weights finite. */
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"weight\": 1e300}]}", "verifiers[0].weight",
     "reward.verifiers[0]: field 'weight' is 1e+300, outside the allowed range [-1e+06, 1e+06]"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"normalize\": \"lowercase\"}]}", "verifiers[0].normalize",
     "reward.verifiers[0].normalize: expected a list"},
    {"{\"verifiers\": [{\"type\": \"exact_match\", \"normalize\": [\"lowercase\", \"casefold\"]}]}",
     "verifiers[0].normalize[1]", "reward.verifiers[0].normalize[1]: expected \"lowercase\" or \"strip_period\""},
    {"{\"verifiers\": [{\"type\": \"numeric_match\", \"tolerance\": -0.1}]}", "verifiers[0].tolerance",
     "reward.verifiers[0]: field 'tolerance' is -0.1, outside the allowed range"},
    {"{\"verifiers\": [{\"type\": \"numeric_match\", \"relative\": 2}]}", "verifiers[0].relative",
     "reward.verifiers[0]: field 'relative' is 2, outside the allowed range [0, 1]"},
    {"{\"verifiers\": [{\"type\": \"regex_match\", \"pattern\": \"x\", \"full_match\": 1}]}",
     "verifiers[0].full_match", "reward.verifiers[0]: field 'full_match' must be true or false"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"cache_tokens\": 1}]}", "verifiers[0].max_tokens",
     "reward.verifiers[0]: missing required field 'max_tokens'"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 10}]}", "verifiers[0].cache_tokens",
     "reward.verifiers[0]: missing required field 'cache_tokens'"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 10, \"cache_tokens\": 11}]}",
     "verifiers[0].cache_tokens", "reward.verifiers[0]: field 'cache_tokens' is 11, outside the allowed range [0, 10]"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 0, \"cache_tokens\": 1}]}",
     "verifiers[0].max_tokens", "field 'max_tokens' is 0, outside the allowed range"},
    {"{\"verifiers\": [{\"type\": \"length_penalty\", \"max_tokens\": 10, \"cache_tokens\": 2, "
     "\"truncated_penalty\": 1.5}]}",
     "verifiers[0].truncated_penalty", "reward.verifiers[0]: field 'truncated_penalty' is 1.5, outside"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"name\": \"a b\"}]}", "verifiers[0].name",
     "reward.verifiers[0].name: \"a b\" is not a name"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"name\": \"\"}]}", "verifiers[0].name",
     "is not a name"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"name\": \"ok\"}, {\"type\": \"format\", "
     "\"pattern\": \"y\", \"name\": \"ok\"}]}",
     "verifiers[1].name", "reward.verifiers[1].name: \"ok\" names verifiers[0] and verifiers[1]"},
    {"{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"x\", \"name\": \"format_1\"}, {\"type\": \"format\", "
     "\"pattern\": \"y\"}]}",
     "verifiers[0].name", "\"format_1\" names verifiers[0] and verifiers[1]"},
};

Test(rewards, bad_specs_name_the_field) {
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        json_t *spec = rewards_test_parse(BAD[i].spec);
        static char sentinel;
        struct reward_stage *st = (struct reward_stage *)&sentinel; /* must become NULL */
        struct smelt_error err = {0};
        int rc = reward_stage_create(spec, "reward", &st, &err);
        json_decref(spec);
        cr_expect_eq(rc, SMELT_EINVAL, "%s: rc %d (%s)", BAD[i].spec, rc, err.message);
        cr_expect(st == NULL, "%s: a stage came back", BAD[i].spec);
        cr_expect_str_eq(err.field, BAD[i].field, "%s: %s", BAD[i].spec, err.message);
        cr_expect(strstr(err.message, BAD[i].message), "%s:\n  message \"%s\"\n  lacks \"%s\"", BAD[i].spec,
                  err.message, BAD[i].message);
        if (st != (struct reward_stage *)&sentinel) reward_stage_free(st);
    }
}

/* Bounds that need long inputs: 17 verifiers, a 1025-byte pattern, a long marker. */
Test(rewards, bad_specs_sizes) {
    struct smelt_error err = {0};
    struct reward_stage *st = NULL;
    json_t *list = json_array();
    for (int i = 0; i < REWARD_MAX_VERIFIERS + 1; i++)
        json_array_append_new(list, json_pack("{s:s, s:s}", "type", "regex_match", "pattern", "x"));
    json_t *spec = json_pack("{s:O}", "verifiers", list);
    cr_expect_eq(reward_stage_create(spec, "reward", &st, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "verifiers");
    cr_expect(strstr(err.message, "reward.verifiers: 17 verifiers, expected 1 to 16"), "%s", err.message);
    json_array_remove(list, 0);
    cr_expect_eq(reward_stage_create(spec, "reward", &st, &err), SMELT_OK, "16 verifiers: %s", err.message);
    cr_expect_eq(reward_stage_count(st), 16);
    reward_stage_free(st);
    json_decref(spec);
    json_decref(list);

    char pattern[REWARD_MAX_PATTERN_BYTES + 2];
    memset(pattern, 'a', sizeof pattern - 1);
    pattern[sizeof pattern - 1] = '\0';
    spec = json_pack("{s:[{s:s, s:s}]}", "verifiers", "type", "format", "pattern", pattern);
    cr_expect_eq(reward_stage_create(spec, "reward", &st, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "verifiers[0].pattern");
    cr_expect(strstr(err.message, "reward.verifiers[0].pattern: 1025 bytes, longer than the 1024 allowed"), "%s",
              err.message);
    json_decref(spec);
    pattern[REWARD_MAX_PATTERN_BYTES] = '\0'; /* 1024 bytes: allowed */
    spec = json_pack("{s:[{s:s, s:s}]}", "verifiers", "type", "format", "pattern", pattern);
    cr_expect_eq(reward_stage_create(spec, "reward", &st, &err), SMELT_OK, "%s", err.message);
    reward_stage_free(st);
    json_decref(spec);

    char marker[REWARD_MAX_MARKER_BYTES + 2];
    memset(marker, '#', sizeof marker - 1);
    marker[sizeof marker - 1] = '\0';
    spec = json_pack("{s:[{s:s, s:{s:s, s:s}}]}", "verifiers", "type", "exact_match", "extract", "type",
                     "after_marker", "marker", marker);
    cr_expect_eq(reward_stage_create(spec, "reward", &st, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "verifiers[0].extract.marker");
    json_decref(spec);

    /* The error's path follows the caller's where and nests under the caller's field. */
    spec = rewards_test_parse("{\"verifiers\": [{\"type\": \"format\", \"pattern\": \"(\"}]}");
    int rc = reward_stage_create(spec, "spec.json: method.grpo.reward", &st, &err);
    const char *prefix = "spec.json: method.grpo.reward.verifiers[0].pattern: ";
    cr_expect(strncmp(err.message, prefix, strlen(prefix)) == 0, "%s", err.message);
    error_in_field(&err, rc, "method.grpo.reward");
    cr_expect_str_eq(err.field, "method.grpo.reward.verifiers[0].pattern");
    json_decref(spec);
}

/* ---- the examples of docs/rewards.md, with the scores it states ---- */

Test(rewards, docs_examples) {
    struct reward_stage *st = rewards_test_stage(
        "{\"verifiers\": [{\"type\": \"exact_match\", \"extract\": {\"type\": \"after_marker\", \"marker\": \"####\"},"
        " \"normalize\": [\"strip_period\"]}, {\"type\": \"length_penalty\", \"max_tokens\": 1024, "
        "\"cache_tokens\": 256}]}");
    struct reward_result r = score_one(st, "3 + 69 = 72\n#### 72.0", "72", 100, "stop");
    cr_expect(!r.failed && r.reward == 1.0, "reward %g %s", r.reward, r.error);
    r = score_one(st, "#### 72.", "72", 896, "stop"); /* (768 - 896) / 256 = -0.5 */
    cr_expect(!r.failed && r.reward == 0.5, "reward %g %s", r.reward, r.error);
    reward_stage_free(st);

    st = rewards_test_stage("{\"verifiers\": [{\"type\": \"exact_match\", \"name\": \"correct\", \"extract\": "
                            "{\"type\": \"regex\", \"pattern\": \"<answer>\\\\s*(.*?)\\\\s*</answer>\"}}, "
                            "{\"type\": \"format\", "
                            "\"weight\": 0.1, \"pattern\": \"<think>.*</think>\\\\s*<answer>.*</answer>\"}]}");
    r = score_one(st, "<think>3 + 4 = 7</think>\n<answer>7</answer>", "7", 0, "stop");
    cr_expect(!r.failed && r.reward == 1.0 + 0.1, "reward %g %s", r.reward, r.error);
    cr_expect_str_eq(reward_stage_name(st, 0), "correct");
    cr_expect_str_eq(reward_stage_name(st, 1), "format");
    reward_stage_free(st);
}
