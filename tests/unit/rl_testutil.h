/* Helpers shared by the RL trainer tests (test_grpo.c, test_ppo.c): prompts of letters
 * to reverse, a spec over a run's files loaded, refused or run, a sample run through a
 * model alone (the unpacked reference of the packed passes), train lines compared
 * between two runs, a run stopped and resumed against an uninterrupted one, and the
 * smelt-rollout built beside the tests for the split placement. */
#ifndef SMELT_TESTS_RL_TESTUTIL_H
#define SMELT_TESTS_RL_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "trainer/trainer_internal.h"
#include "trainer_testutil.h"

/* exact_match of the answer (never met by the tiny model: val_accuracy is its pass
 * rate) and a letter or digit anywhere in the completion (about half of the random
 * completions of 3-4 tokens have one): rewards 0, 0.5 or 1. */
#define RL_TEST_REWARD_MIXED                                                                          \
    "\"reward\":{\"verifiers\":[{\"type\":\"exact_match\",\"weight\":0.5},{\"type\":\"regex_match\"," \
    "\"pattern\":\"[0-9a-z]\",\"weight\":0.5}]}"

/* Rows first .. first + n - 1 of a prompts file: "xyz>" with 2 to 5 letters (prompts of
 * different lengths) and the reversal as the answer; the row on line missing_answer
 * (1-based; 0: none) has no answer. */
static inline void rl_test_write_prompts(const char *path, int first, int n, int missing_answer) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = first; i < first + n; i++) {
        int len = 2 + i % 4;
        char s[8], rev[8];
        for (int k = 0; k < len; k++) s[k] = (char)('a' + (i * 7 + k * 3) % 26);
        for (int k = 0; k < len; k++) rev[k] = s[len - 1 - k];
        s[len] = rev[len] = 0;
        if (i - first + 1 == missing_answer) fprintf(f, "{\"prompt\": \"%s>\"}\n", s);
        else fprintf(f, "{\"prompt\": \"%s>\", \"answer\": \"%s\"}\n", s, rev);
    }
    fclose(f);
}

/* The tiny pretrained model, n_train training prompts and 4 held-out ones. */
static inline void rl_test_setup(struct test_run_paths *p, int n_train) {
    test_run_paths_init(p, true);
    rl_test_write_prompts(p->train, 0, n_train, 0);
    rl_test_write_prompts(p->val, 20, 4, 0);
}

/* A spec of `type` over p's model and validation prompts, with extra (sections, each
 * followed by a comma) and train as data.train, written to p->spec and loaded. */
static inline int rl_test_load_spec(const struct test_run_paths *p, const char *type, const char *train,
                                    const char *out, const char *extra, struct job_spec *spec,
                                    struct smelt_error *err) {
    char text[8192];
    int n = snprintf(text, sizeof text,
                     "{\"type\":\"%s\",\"model\":\"%s\",%s\"data\":{\"train\":\"%s\",\"validation\":\"%s\"},"
                     "\"output_dir\":\"%s\",\"seed\":7}",
                     type, p->model, extra, train, p->val, out);
    cr_assert(n > 0 && (size_t)n < sizeof text);
    test_write_text(p->spec, text);
    return job_spec_load(p->spec, spec, err);
}

/* A spec job_spec_load refuses (SMELT_EINVAL): a `type` job with extra (sections, each
 * followed by a comma) over p's files, the error naming field and saying `says`. */
struct rl_test_refusal {
    const char *type, *extra, *field, *says;
};

/* Every spec of refused[0..n) refused as it says, the message naming the spec file. */
static inline void rl_test_expect_refusals(const struct test_run_paths *p, const struct rl_test_refusal *refused,
                                           size_t n) {
    struct smelt_error err = {0};
    struct job_spec spec;
    for (size_t i = 0; i < n; i++) {
        TEST_EXPECT_ERROR(rl_test_load_spec(p, refused[i].type, p->train, p->out, refused[i].extra, &spec, &err),
                          SMELT_EINVAL, &err);
        cr_expect_str_eq(err.field, refused[i].field, "case %zu: %s", i, err.message);
        cr_expect(strstr(err.message, refused[i].says), "case %zu: the message does not say \"%s\": %s", i,
                  refused[i].says, err.message);
        cr_expect(strstr(err.message, p->spec), "case %zu: the message does not name the spec file: %s", i,
                  err.message);
    }
}

/* Runs the `type` job of extra over p's data into out, to the end or as o says. */
static inline void rl_test_run(const struct test_run_paths *p, const char *type, const char *out,
                               const char *extra, const struct trainer_options *o, struct trainer_result *res) {
    struct smelt_error err = {0};
    struct job_spec spec;
    TEST_OK(rl_test_load_spec(p, type, p->train, out, extra, &spec, &err), &err);
    TEST_OK(trainer_run(&spec, o, res, &err), &err);
}

/* Sample s after its prompt p run alone through m (nothing packed), into a new array
 * (free it): the logits [T, V], or with hidden the final hidden states [T, C]; T is
 * p->n + s->n (at most 64). */
static inline float *rl_test_forward_alone(struct model *m, struct model_acts *acts, const struct dataset_prompt *p,
                                           const struct rl_sample *s, bool hidden) {
    struct smelt_error err = {0};
    int64_t T = p->n + s->n, width = hidden ? m->config.hidden_size : m->config.vocab_size;
    int32_t ids[64], cu[2] = {0, (int32_t)T};
    cr_assert(T <= 64);
    memcpy(ids, p->ids, (size_t)p->n * sizeof *ids);
    memcpy(ids + p->n, s->ids, (size_t)s->n * sizeof *ids);
    float *out = malloc((size_t)(T * width) * sizeof *out);
    cr_assert(out);
    int64_t shape[2] = {T, width};
    struct tensor t = tensor_f32(out, 2, shape);
    struct model_batch mb = {.n_tokens = T, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
    TEST_OK(model_forward(m, acts, &mb, NULL, hidden ? NULL : &t, hidden ? &t : NULL, &err), &err);
    return out;
}

/* Every train line's `key` of out (in order), and their steps (may be NULL). */
static inline int rl_test_train_values(const char *out, const char *key, double *v, int *steps, int cap) {
    return test_read_metric(out, "train", key, v, steps, cap);
}

/* key of every train line of runs a and b (n lines each, at most 16), equal bit for bit;
 * a_is and b_is name the runs in the messages ("colocated", "split"). */
static inline void rl_test_expect_same_train(const char *a, const char *b, const char *key, int n, const char *a_is,
                                             const char *b_is) {
    double va[16], vb[16];
    cr_assert_eq(rl_test_train_values(a, key, va, NULL, 16), n, "%s", key);
    cr_assert_eq(rl_test_train_values(b, key, vb, NULL, 16), n, "%s", key);
    for (int i = 0; i < n; i++)
        cr_expect_eq(va[i], vb[i], "iteration %d: %s %.17g %s vs %.17g %s", i + 1, key, va[i], a_is, vb[i], b_is);
}

/* A run straight into p->out and one into p->out "2", stopped after `stop` optimizer
 * steps and resumed: with spi optimizer steps per iteration, a train line per iteration
 * at steps spi, 2 spi, ...; the stop takes effect at the end of its iteration. Every
 * train line's keys[0..n_keys) and the final val_reward are the same, bit for bit. */
struct rl_test_resume {
    const char *type, *extra;
    int iterations, spi, stop;
    const char *const *keys;
    size_t n_keys;
    bool base_unchanged; /* each completed run must report its base weights unchanged */
};

static inline void rl_test_expect_resume_iterations(const struct test_run_paths *p, const struct rl_test_resume *r) {
    struct trainer_result res;
    struct trainer_options all = {.quiet = true}, stopped = {.quiet = true, .stop_after_step = r->stop},
                           resume = {.quiet = true, .resume = "latest"};
    rl_test_run(p, r->type, p->out, r->extra, &all, &res);
    cr_expect_eq(res.steps, r->iterations * r->spi);
    if (r->base_unchanged) cr_expect(res.base_unchanged);
    char out2[600];
    snprintf(out2, sizeof out2, "%s2", p->out);
    rl_test_run(p, r->type, out2, r->extra, &stopped, &res);
    int stop_at = (r->stop + r->spi - 1) / r->spi * r->spi;
    cr_expect(res.stopped && res.steps == stop_at, "stopped %d after %lld steps, expected %d", res.stopped,
              (long long)res.steps, stop_at);
    rl_test_run(p, r->type, out2, r->extra, &resume, &res);
    cr_expect_eq(res.steps, r->iterations * r->spi);
    if (r->base_unchanged) cr_expect(res.base_unchanged);
    for (size_t k = 0; k < r->n_keys; k++) {
        double a[16], b[16];
        int sa[16], sb[16];
        cr_assert_eq(rl_test_train_values(p->out, r->keys[k], a, sa, 16), r->iterations, "%s", r->keys[k]);
        cr_assert_eq(rl_test_train_values(out2, r->keys[k], b, sb, 16), r->iterations, "%s", r->keys[k]);
        for (int i = 0; i < r->iterations; i++) {
            cr_expect(sa[i] == (i + 1) * r->spi && sb[i] == sa[i], "train line %d at steps %d / %d", i, sa[i], sb[i]);
            cr_expect_eq(a[i], b[i], "iteration %d: %s %.17g uninterrupted vs %.17g resumed", i + 1, r->keys[k],
                         a[i], b[i]);
        }
    }
    double fa, fb;
    cr_assert_eq(test_read_metric(p->out, "final", "val_reward", &fa, NULL, 1), 1);
    cr_assert_eq(test_read_metric(out2, "final", "val_reward", &fb, NULL, 1), 1);
    cr_expect_eq(fa, fb, "final val_reward %.17g vs %.17g", fa, fb);
}

/* The smelt-rollout built beside these tests (BUILD/tests/unit_tests -> BUILD/smelt-rollout):
 * the trainer looks next to its own executable, which here is the test program. */
static inline void rl_test_use_built_rollout(void) {
    char prog[700];
    rl_workers_set_program(test_built_program("smelt-rollout", prog, sizeof prog));
}

#endif
