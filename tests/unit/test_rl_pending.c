/* trainer/rl_pending.c: the samples generated ahead under max_staleness, saved with a
 * checkpoint and read back exactly (ids, rollout logprobs bit for bit, row, version,
 * finish reason; an empty completion too); a file of another format, rows the job does
 * not have, and more samples than an iteration holds are refused by name. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "testutil.h"
#include "trainer/trainer_internal.h"

#define N 5

static void make_samples(struct rl_sample *s) {
    static const char *reasons[] = {"stop", "length", "stop", "abort", "stop"};
    for (int i = 0; i < N; i++) {
        int64_t n = i == 2 ? 0 : 1 + i;
        s[i] = (struct rl_sample){.row = 3 - i % 3, .version = 7 + i % 2, .n = n, .finish_reason = reasons[i]};
        s[i].ids = malloc((size_t)(n ? n : 1) * sizeof *s[i].ids);
        s[i].rollout_logp = malloc((size_t)(n ? n : 1) * sizeof *s[i].rollout_logp);
        cr_assert(s[i].ids && s[i].rollout_logp);
        for (int64_t k = 0; k < n; k++) {
            s[i].ids[k] = (int32_t)(100 * i + k);
            s[i].rollout_logp[k] = -(float)exp(0.37 * (double)(i + k)) / 3.0f; /* not round in decimal */
        }
    }
}

static struct dataset dataset_of(int64_t rows) { return (struct dataset){.kind = DATASET_PROMPTS, .n = rows}; }

Test(rl_pending, round_trip_is_exact) {
    struct rl_sample s[N], back[N + 2];
    make_samples(s);
    char path[512];
    test_tmp_path(path, sizeof path, "pending.safetensors");
    struct smelt_error err = {0};
    TEST_OK(rl_pending_save(path, s, N, &err), &err);
    struct dataset ds = dataset_of(4);
    int n = -1;
    TEST_OK(rl_pending_load(path, &ds, N + 2, back, &n, &err), &err);
    cr_assert_eq(n, N);
    for (int i = 0; i < N; i++) {
        cr_expect_eq(back[i].row, s[i].row);
        cr_expect_eq(back[i].version, s[i].version);
        cr_expect_eq(back[i].n, s[i].n);
        cr_expect_str_eq(back[i].finish_reason, s[i].finish_reason);
        cr_expect(memcmp(back[i].ids, s[i].ids, (size_t)s[i].n * sizeof *s[i].ids) == 0, "sample %d ids", i);
        cr_expect(memcmp(back[i].rollout_logp, s[i].rollout_logp, (size_t)s[i].n * sizeof(float)) == 0,
                  "sample %d logprobs", i);
        cr_expect(!back[i].text && !back[i].trained && !back[i].failed);
    }
    rl_samples_clear(back, n);
    rl_samples_clear(s, N);
}

Test(rl_pending, refuses_what_is_not_this_jobs) {
    struct rl_sample s[N], back[N];
    make_samples(s);
    char path[512];
    test_tmp_path(path, sizeof path, "pending.safetensors");
    struct smelt_error err = {0};
    TEST_OK(rl_pending_save(path, s, N, &err), &err);
    int n = -1;
    struct dataset small = dataset_of(3); /* row 3 is not there */
    cr_expect_eq(rl_pending_load(path, &small, N, back, &n, &err), SMELT_EFORMAT);
    cr_expect(strstr(err.message, "row 3 of 3"), "%s", err.message);
    cr_expect_eq(n, 0);
    struct dataset ds = dataset_of(4);
    cr_expect_eq(rl_pending_load(path, &ds, N - 1, back, &n, &err), SMELT_EFORMAT);
    cr_expect(strstr(err.message, "more than an iteration"), "%s", err.message);
    /* A model's weights are a safetensors file too, not one of pending samples. */
    float w[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    struct safetensors_tensor_desc t[] = {{"n_tokens", tensor_f32(w, 1, shape), DTYPE_F32}};
    TEST_OK(safetensors_write(path, t, 1, NULL, 0, &err), &err);
    cr_expect_eq(rl_pending_load(path, &ds, N, back, &n, &err), SMELT_EFORMAT);
    cr_expect(strstr(err.message, "not a file of pending samples"), "%s", err.message);
    cr_expect_neq(rl_pending_load("/nonexistent/pending.safetensors", &ds, N, back, &n, &err), SMELT_OK);
    /* A sample the writer cannot name refuses the save. */
    s[1].finish_reason = "gone fishing";
    cr_expect_eq(rl_pending_save(path, s, N, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "pending sample 1"), "%s", err.message);
    s[1].finish_reason = "length";
    rl_samples_clear(s, N);
}
