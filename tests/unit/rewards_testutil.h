/* Helpers shared by the reward-stage tests (test_rewards.c, test_graders.c,
 * test_reward_endpoint.c): test JSON parsed, a stage built from a spec that must be
 * accepted, a spec that must be refused, one sample scored. */
#ifndef SMELT_TESTS_REWARDS_TESTUTIL_H
#define SMELT_TESTS_REWARDS_TESTUTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "rewards/rewards.h"

/* text, which must parse; the test frees it (json_decref). */
static inline json_t *rewards_test_parse(const char *text) {
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    cr_assert(j, "test JSON does not parse: %s (%s)", jerr.text, text);
    return j;
}

/* The stage of spec_text (the "reward" section), which must be accepted; the test frees
 * it (reward_stage_free). */
static inline struct reward_stage *rewards_test_stage(const char *spec_text) {
    json_t *spec = rewards_test_parse(spec_text);
    struct reward_stage *st = NULL;
    struct smelt_error err = {0};
    int rc = reward_stage_create(spec, "reward", &st, &err);
    json_decref(spec);
    cr_assert_eq(rc, SMELT_OK, "spec %s refused: %s", spec_text, err.message);
    return st;
}

/* A spec that must be refused (SMELT_EINVAL, no stage): the error's field and a piece
 * of its message. */
static inline void rewards_test_refused(const char *spec_text, const char *field, const char *message_part) {
    json_t *spec = rewards_test_parse(spec_text);
    struct reward_stage *st = NULL;
    struct smelt_error err = {0};
    int rc = reward_stage_create(spec, "reward", &st, &err);
    json_decref(spec);
    cr_assert_eq(rc, SMELT_EINVAL, "spec %s was accepted (%d: %s)", spec_text, rc, err.message);
    cr_assert_null(st);
    cr_expect_str_eq(err.field, field, "spec %s: field \"%s\", expected \"%s\" (%s)", spec_text, err.field, field,
                     err.message);
    cr_expect(strstr(err.message, message_part), "spec %s: message \"%s\" lacks \"%s\"", spec_text, err.message,
              message_part);
}

/* The result of scoring s alone, which must not fail as a batch (the sample may). */
static inline struct reward_result rewards_test_score(struct reward_stage *st, const struct reward_sample *s) {
    struct reward_result r;
    memset(&r, 0xff, sizeof r); /* garbage everywhere: every field must be written */
    struct smelt_error err = {0};
    cr_assert_eq(reward_stage_score(st, s, 1, &r, &err), SMELT_OK, "%s", err.message);
    return r;
}

#endif
