/* Helpers for tests that run the trainer: a tiny model directory to train, and reading
 * what the trainer wrote. */
#ifndef SMELT_TESTS_TRAINER_TESTUTIL_H
#define SMELT_TESTS_TRAINER_TESTUTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/model.h"
#include "testutil.h"
#include "tokenizer/tokenizer.h"
#include "trainer/trainer.h"

static inline void test_write_text(const char *path, const char *text) {
    struct smelt_error err = {0};
    TEST_OK(file_write_atomic(path, text, strlen(text), &err), &err);
}

/* dir/{config.json, tokenizer.json} (and weights when pretrained), from
 * tests/data/tiny. */
static inline void test_make_model_dir(const char *dir, bool with_weights) {
    struct smelt_error err = {0};
    struct model_config c;
    TEST_OK(model_config_load("tests/data/tiny/config.json", &c, &err), &err);
    TEST_OK(dir_create_all(dir, &err), &err);
    if (with_weights) {
        struct model *m;
        TEST_OK(model_init_random(&c, 99, BACKEND_CPU, &m, &err), &err);
        TEST_OK(model_save(m, dir, false, &err), &err);
        model_free(m);
    } else {
        TEST_OK(model_config_save(&c, dir, &err), &err);
    }
    struct tokenizer *tok;
    TEST_OK(tokenizer_create_bytes(NULL, 0, &tok, &err), &err);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    TEST_OK(tokenizer_save(tok, p, &err), &err);
    tokenizer_free(tok);
}

/* Reversal of three letters, as a preference: chosen the reversed string, rejected a
 * near miss (one letter of it moved to the next one): rows first .. first + n - 1 of a
 * sequence whose 210 first prompts differ (with offset 0, disjoint ranges hold disjoint
 * prompts). margin != 0: a "margin" column, margin * (i % 3) on row i. */
static inline void test_make_pref_data(const char *path, int first, int n, int offset, double margin) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = first; i < first + n; i++) {
        char s[4] = {(char)('a' + (i + offset) % 7), (char)('a' + (i * 3 + offset) % 5), (char)('a' + (i / 5 + offset) % 6), 0};
        char good[4] = {s[2], s[1], s[0], 0}, bad[4];
        memcpy(bad, good, sizeof bad);
        bad[i % 3] = (char)('a' + (bad[i % 3] - 'a' + 1) % 7);
        fprintf(f, "{\"prompt\": \"%s>\", \"chosen\": \"%s\", \"rejected\": \"%s\"", s, good, bad);
        if (margin != 0) fprintf(f, ", \"margin\": %g", margin * (i % 3));
        fprintf(f, "}\n");
    }
    fclose(f);
}

/* A run's files in a fresh temporary directory, with the tiny model (weights when
 * pretrained) in model/; the data files are the test's to write. */
struct test_run_paths {
    char model[512], train[512], val[512], out[512], spec[512];
};

static inline void test_run_paths_init(struct test_run_paths *p, bool pretrained) {
    test_tmp_setup();
    test_tmp_path(p->model, sizeof p->model, "model");
    test_tmp_path(p->train, sizeof p->train, "train.jsonl");
    test_tmp_path(p->val, sizeof p->val, "val.jsonl");
    test_tmp_path(p->out, sizeof p->out, "run");
    test_tmp_path(p->spec, sizeof p->spec, "spec.json");
    test_make_model_dir(p->model, pretrained);
}

/* Every line of type `type` of out_dir/metrics.jsonl, parsed, in order (more than cap
 * fails the test); the caller frees them (test_free_lines). Lines of any length. */
static inline int test_read_lines(const char *out_dir, const char *type, json_t **lines, int cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    char *text = NULL;
    size_t size = 0;
    int n = 0;
    while (getline(&text, &size, f) > 0) {
        json_t *j = json_loads(text, 0, NULL);
        cr_assert(j, "bad metrics line %s", text);
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t && strcmp(t, type) == 0) {
            cr_assert(n < cap, "more than %d %s lines", cap, type);
            lines[n++] = j;
        } else {
            json_decref(j);
        }
    }
    free(text);
    fclose(f);
    return n;
}

static inline void test_free_lines(json_t **lines, int n) {
    for (int i = 0; i < n; i++) json_decref(lines[i]);
}

/* key of every line of type `type` in out_dir/metrics.jsonl, in order (at most cap),
 * into values, and their steps into steps (may be NULL); returns how many. */
static inline int test_read_metric(const char *out_dir, const char *type, const char *key, double *values,
                                   int *steps, int cap) {
    json_t **lines = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *lines);
    cr_assert(lines);
    int n = test_read_lines(out_dir, type, lines, cap);
    for (int i = 0; i < n; i++) {
        json_t *v = json_object_get(lines[i], key);
        if (!json_is_number(v)) {
            char *text = json_dumps(lines[i], JSON_COMPACT);
            cr_assert_fail("a %s line without a number %s: %s", type, key, text ? text : "?");
        }
        values[i] = json_number_value(v);
        if (steps) steps[i] = (int)json_integer_value(json_object_get(lines[i], "step"));
    }
    test_free_lines(lines, n);
    free(lines);
    return n;
}

/* loss[step] for every "train" line of out_dir/metrics.jsonl (steps 1.. in order, below
 * cap); returns the last step. */
static inline int test_read_losses(const char *out_dir, double *loss, int cap) {
    int steps[1024];
    cr_assert(cap <= 1024);
    int n = test_read_metric(out_dir, "train", "loss", loss + 1, steps, cap - 1);
    for (int i = 0; i < n; i++) cr_expect(steps[i] == i + 1, "steps out of order: %d after %d", steps[i], i);
    return n;
}

/* Runs a job of a test's own kind over p's data into out, to the end or as o says. */
typedef void (*test_run_fn)(const struct test_run_paths *p, const char *out, const char *hp,
                            const struct trainer_options *o, struct trainer_result *res);

/* Six steps straight, and three, a stop and a resume in another directory: the same
 * losses and final `final_key`, bit for bit. */
static inline void test_expect_resume_exact(const struct test_run_paths *p, test_run_fn run, const char *hp,
                                            const char *final_key) {
    struct trainer_result res;
    struct trainer_options all = {.quiet = true}, stop = {.quiet = true, .stop_after_step = 3},
                           resume = {.quiet = true, .resume = "latest"};
    run(p, p->out, hp, &all, &res);
    double straight[16], resumed[16], last[2];
    cr_assert_eq(test_read_losses(p->out, straight, 16), 6);
    cr_assert_eq(test_read_metric(p->out, "final", final_key, &last[0], NULL, 1), 1);
    char out2[600];
    snprintf(out2, sizeof out2, "%s2", p->out);
    run(p, out2, hp, &stop, &res);
    cr_expect(res.stopped && res.steps == 3);
    run(p, out2, hp, &resume, &res);
    cr_expect_eq(res.steps, 6);
    cr_assert_eq(test_read_losses(out2, resumed, 16), 6);
    cr_assert_eq(test_read_metric(out2, "final", final_key, &last[1], NULL, 1), 1);
    for (int s = 1; s <= 6; s++)
        cr_expect_eq(straight[s], resumed[s], "step %d: %.17g uninterrupted vs %.17g resumed", s, straight[s], resumed[s]);
    cr_expect_eq(last[0], last[1], "final %s %.17g vs %.17g", final_key, last[0], last[1]);
}

#endif
