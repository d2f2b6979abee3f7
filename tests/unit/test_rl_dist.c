/* trainer/rl_dist.c and dist.c's byte helpers over 2 and 3 forked ranks (a file store in
 * a temporary folder, loopback Gloo): rank 0's samples, iteration record and reward
 * errors arrive on every rank byte for byte; rank 0's failure arrives as the same code,
 * message and field, also as an outcome alone; byte broadcasts and gathers of odd sizes; an optimizer step's policy
 * statistics summed in rank order (max / min kept); dist_check for RL jobs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "rollout/rollout.h"
#include "testutil.h"
#include "trainer/trainer_internal.h"

#define MAX_RANKS 3
#define CAP 4
#define N_SAMPLES 5 /* CAP * RL_ROUNDS holds them */

/* The plain record an iteration sends beside its samples (grpo.c's is private). */
struct fake_iteration {
    int n_samples, loader_moves;
    double t_generate;
    int64_t failed;
};

enum scenario { SHARE_OK, SHARE_FAILED, STATUS, BYTES, TOTALS };

static void fill_sample(struct rl_sample *s, int i) {
    s->row = i % 3;
    s->n = i; /* sample 0 has no tokens */
    s->ids = malloc((size_t)(i + 1) * sizeof *s->ids);
    s->rollout_logp = malloc((size_t)(i + 1) * sizeof *s->rollout_logp);
    cr_assert(s->ids && s->rollout_logp);
    for (int j = 0; j < i; j++) {
        s->ids[j] = 100 * i + j;
        s->rollout_logp[j] = -0.1f * (float)(j + 1) - (float)i;
    }
    s->finish_reason = i % 2 ? ROLLOUT_FINISH_LENGTH : ROLLOUT_FINISH_STOP;
    s->version = 7 + i;
    s->failed = i == 3;
    s->reward = i == 3 ? NAN : 0.25 * i;
    for (int v = 0; v < REWARD_MAX_VERIFIERS; v++) s->scores[v] = v == 0 ? 0.5 * i : NAN;
}

/* What rank > 0 must hold after SHARE_OK. */
static int check_samples(const struct rl_sample *got, struct smelt_error *err) {
    for (int i = 0; i < N_SAMPLES; i++) {
        struct rl_sample want = {0};
        fill_sample(&want, i);
        const struct rl_sample *g = &got[i];
        bool same = g->row == want.row && g->n == want.n && g->version == want.version && g->failed == want.failed &&
                    strcmp(g->finish_reason, want.finish_reason) == 0 &&
                    memcmp(&g->reward, &want.reward, sizeof g->reward) == 0 &&
                    memcmp(g->scores, want.scores, sizeof g->scores) == 0 &&
                    memcmp(g->ids, want.ids, (size_t)want.n * sizeof *g->ids) == 0 &&
                    memcmp(g->rollout_logp, want.rollout_logp, (size_t)want.n * sizeof *g->rollout_logp) == 0 &&
                    !g->text;
        rl_samples_clear(&want, 1);
        if (!same) return error_set(err, SMELT_EINVAL, "sample %d differs from rank 0's", i);
    }
    return SMELT_OK;
}

static int share(struct trainer_run *r, bool fail, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    struct fake_iteration it = {0};
    int rc = SMELT_OK;
    if (r->dist.rank == 0) {
        for (int i = 0; i < N_SAMPLES; i++) fill_sample(&rl->samples[i], i);
        it = (struct fake_iteration){.n_samples = N_SAMPLES, .loader_moves = 2, .t_generate = 1.5, .failed = 1};
        json_array_append_new(rl->errors, json_pack("{s:i, s:s}", "line", 4, "error", "grader: no letter"));
        if (fail) rc = error_set_field(err, SMELT_EIO, "rl.reward.grader", "rl: the sandbox died on line %d", 9);
    } else {
        fill_sample(&rl->samples[0], 4); /* replaced by rank 0's */
    }
    TRY(rl_dist_share(r, rc, &it, sizeof it, N_SAMPLES, err));
    if (r->dist.rank == 0) return SMELT_OK;
    if (it.n_samples != N_SAMPLES || it.loader_moves != 2 || it.t_generate != 1.5 || it.failed != 1)
        return error_set(err, SMELT_EINVAL, "the iteration record differs from rank 0's");
    const char *e = json_string_value(json_object_get(json_array_get(rl->errors, 0), "error"));
    if (!e || strcmp(e, "grader: no letter") != 0 || json_array_size(rl->errors) != 1)
        return error_set(err, SMELT_EINVAL, "the errors differ from rank 0's");
    return check_samples(rl->samples, err);
}

/* The outcome alone (iter NULL): a success leaves the other ranks' samples as they are,
 * a failure reaches them as rank 0's error. */
static int status(struct trainer_run *r, struct smelt_error *err) {
    fill_sample(&r->rl->samples[0], 2);
    TRY(rl_dist_share(r, SMELT_OK, NULL, 0, 0, err));
    if (r->rl->samples[0].n != 2 || r->rl->samples[0].ids[1] != 201)
        return error_set(err, SMELT_EINVAL, "a status changed the samples");
    int rc = r->dist.rank == 0 ? error_set(err, SMELT_EBACKEND, "rl: rollout worker 0 was killed") : SMELT_OK;
    return rl_dist_share(r, rc, NULL, 0, 0, err);
}

/* Broadcasts of 0, 1, 7 and 4096 + 3 bytes, and a gather of 5 bytes per rank. */
static int bytes(struct dist *d, struct smelt_error *err) {
    static const size_t sizes[] = {0, 1, 7, 4099};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        char *src = malloc(sizes[k] + 1);
        for (size_t i = 0; i < sizes[k]; i++) src[i] = (char)(i * 31 + k);
        void *buf = d->rank == 0 ? src : NULL;
        size_t len = d->rank == 0 ? sizes[k] : 12345;
        int rc = dist_broadcast_bytes(d, &buf, &len, err);
        if (!rc && (len != sizes[k] || (len && memcmp(buf, src, len) != 0)))
            rc = error_set(err, SMELT_EINVAL, "broadcast of %zu bytes: got %zu, other bytes", sizes[k], len);
        if (buf != src) free(buf);
        free(src);
        TRY(rc);
    }
    char mine[5], all[5 * MAX_RANKS];
    for (int i = 0; i < 5; i++) mine[i] = (char)(d->rank * 10 + i);
    TRY(dist_gather_bytes(d, mine, sizeof mine, all, err));
    for (int k = 0; k < d->ranks; k++)
        for (int i = 0; i < 5; i++)
            if (all[5 * k + i] != (char)(k * 10 + i)) return error_set(err, SMELT_EINVAL, "gathered bytes differ");
    return SMELT_OK;
}

/* Rank k's statistics: k + 1 tokens, ratio range [1 - 0.1k, 1 + 0.1k]; rank 1 has none. */
static int totals(struct dist *d, struct smelt_error *err) {
    int k = d->rank;
    struct rl_policy_stats ps = {0};
    if (k != 1)
        ps = (struct rl_policy_stats){.loss = 0.5 * k, .kl_sum = k, .ratio_sum = 2.0 * k, .ratio_min = 1 - 0.1 * k,
                                      .ratio_max = 1 + 0.1 * k, .n_tokens = k + 1, .clip_low = k};
    double loss = 0.25 * (k + 1);
    int64_t tokens = 10 * (k + 1);
    TRY(rl_dist_policy_totals(d, &ps, &loss, &tokens, err));
    int n = d->ranks;
    int64_t want_tokens = 0, want_ntok = 0;
    double want_loss = 0, want_max = 1, want_min = 1;
    for (int q = 0; q < n; q++) {
        want_tokens += 10 * (q + 1);
        want_loss += 0.25 * (q + 1);
        if (q == 1) continue;
        want_ntok += q + 1;
        want_max = fmax(want_max, 1 + 0.1 * q);
        want_min = fmin(want_min, 1 - 0.1 * q);
    }
    if (tokens != want_tokens || loss != want_loss || ps.n_tokens != want_ntok || ps.ratio_max != want_max ||
        ps.ratio_min != want_min)
        return error_set(err, SMELT_EINVAL, "totals: tokens %lld loss %g n_tokens %lld max %g min %g",
                         (long long)tokens, loss, (long long)ps.n_tokens, ps.ratio_max, ps.ratio_min);
    struct critic_totals ct = {.loss = 1.0 + k, .value_sum = 2, .n_tokens = 3, .clipped = k, .steps = 1};
    TRY(rl_dist_critic_totals(d, &ct, err));
    if (ct.n_tokens != 3 * n || ct.value_sum != 2.0 * n || ct.steps != 1)
        return error_set(err, SMELT_EINVAL, "critic totals: n_tokens %lld value_sum %g", (long long)ct.n_tokens,
                         ct.value_sum);
    return SMELT_OK;
}

static int run_scenario(struct trainer_run *r, enum scenario sc, struct smelt_error *err) {
    switch (sc) {
    case SHARE_OK: return share(r, false, err);
    case SHARE_FAILED: return share(r, true, err);
    case STATUS: return status(r, err);
    case BYTES: return bytes(&r->dist, err);
    default: return totals(&r->dist, err);
    }
}

/* A forked rank: the scenario over a minimal run (3 prompt rows, room for the samples);
 * its error (code, field, message) into DIR/out.<rank>, "ok" when none. */
static _Noreturn void rank_main(int rank, int ranks, enum scenario sc) {
    struct smelt_error err = {0};
    char spec[128], path[256], name[32], id[32], text[1024];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    snprintf(id, sizeof id, "rl-%d-%d", sc, ranks);
    struct dist_config c = {.rank = rank, .ranks = ranks, .rendezvous = spec, .run_id = id, .timeout_ms = 10000};
    struct dataset train = {.n = 3};
    struct rl_state *rl = calloc(1, sizeof *rl);
    struct trainer_run r = {.train = &train, .rl = rl};
    rl->cap = CAP;
    rl->samples = calloc(CAP * RL_ROUNDS, sizeof *rl->samples);
    rl->errors = json_array();
    int rc = dist_open(&r.dist, &c, &err);
    if (!rc) rc = run_scenario(&r, sc, &err);
    dist_close(&r.dist);
    snprintf(name, sizeof name, "out.%d", rank);
    test_tmp_path(path, sizeof path, name);
    int n = rc ? snprintf(text, sizeof text, "%d|%s|%s", rc, err.field, err.message) : snprintf(text, sizeof text, "ok");
    file_write_atomic(path, text, (size_t)n, NULL);
    rl_samples_clear(rl->samples, CAP * RL_ROUNDS);
    free(rl->samples);
    json_decref(rl->errors);
    free(rl);
    _exit(0);
}

/* Runs the scenario on `ranks` forked ranks; each rank's outcome into out[rank]. */
static void run_ranks(int ranks, enum scenario sc, char out[][1024]) {
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < ranks; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) rank_main(r, ranks, sc);
    }
    for (int r = 0; r < ranks; r++) {
        int status;
        cr_assert(waitpid(pids[r], &status, 0) == pids[r]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d crashed", r);
        char path[256], name[32], *text = NULL;
        size_t len;
        snprintf(name, sizeof name, "out.%d", r);
        test_tmp_path(path, sizeof path, name);
        cr_assert(file_read_all(path, &text, &len, NULL) == 0, "rank %d wrote nothing", r);
        snprintf(out[r], 1024, "%.*s", (int)len, text);
        free(text);
    }
}

TestSuite(rl_dist, .init = test_tmp_setup, .fini = test_tmp_teardown, .timeout = 60);

Test(rl_dist, samples_reach_every_rank_byte_for_byte) {
    char out[MAX_RANKS][1024];
    run_ranks(3, SHARE_OK, out);
    for (int r = 0; r < 3; r++) cr_expect_str_eq(out[r], "ok", "rank %d: %s", r, out[r]);
}

Test(rl_dist, rank_0_failure_ends_every_rank_with_its_error) {
    char out[MAX_RANKS][1024], want[1024];
    run_ranks(3, SHARE_FAILED, out);
    snprintf(want, sizeof want, "%d|rl.reward.grader|rl: the sandbox died on line 9", SMELT_EIO);
    for (int r = 0; r < 3; r++) cr_expect_str_eq(out[r], want, "rank %d", r);
}

Test(rl_dist, rank_0_status_alone) {
    char out[MAX_RANKS][1024], want[1024];
    run_ranks(2, STATUS, out);
    snprintf(want, sizeof want, "%d||rl: rollout worker 0 was killed", SMELT_EBACKEND);
    for (int r = 0; r < 2; r++) cr_expect_str_eq(out[r], want, "rank %d", r);
}

Test(rl_dist, bytes_of_odd_sizes) {
    char out[MAX_RANKS][1024];
    run_ranks(2, BYTES, out);
    for (int r = 0; r < 2; r++) cr_expect_str_eq(out[r], "ok", "rank %d: %s", r, out[r]);
}

Test(rl_dist, step_totals_summed_in_rank_order) {
    char out[MAX_RANKS][1024];
    run_ranks(3, TOTALS, out);
    for (int r = 0; r < 3; r++) cr_expect_str_eq(out[r], "ok", "rank %d: %s", r, out[r]);
}

Test(rl_dist, one_rank_passes_its_outcome_through) {
    struct trainer_run r = {.dist = {.rank = 0, .ranks = 1}};
    struct smelt_error err = {0};
    struct fake_iteration it = {0};
    cr_expect_eq(rl_dist_share(&r, SMELT_OK, &it, sizeof it, 0, &err), SMELT_OK);
    cr_expect_eq(rl_dist_share(&r, SMELT_EIO, &it, sizeof it, 0, &err), SMELT_EIO);
}

/* dist_check: a grpo / ppo job on several ranks is taken at stages 0-2, whatever its
 * grad_accum (its micro-batches are the samples'), and refused at stage 3 by name. */
Test(rl_dist, check_takes_rl_jobs_below_stage_3) {
    struct job_spec s = {0};
    s.backend = BACKEND_CPU;
    s.hp.grad_accum = 1;
    struct smelt_error err = {0};
    struct trainer_options o = {.rank = 0, .ranks = 4, .rendezvous = "file:/tmp/x"};
    enum job_type types[] = {JOB_GRPO, JOB_PPO};
    for (int t = 0; t < 2; t++) {
        s.type = types[t];
        for (int stage = 0; stage <= 2; stage++) {
            s.hp.zero_stage = stage;
            cr_expect_eq(dist_check(&s, &o, &err), SMELT_OK, "%s stage %d: %s", job_type_name(s.type), stage,
                         err.message);
        }
        s.hp.zero_stage = 3;
        cr_expect_eq(dist_check(&s, &o, &err), SMELT_EINVAL);
        cr_expect_str_eq(err.field, "hyperparameters.zero_stage");
        cr_expect(strstr(err.message, job_type_name(s.type)), "%s", err.message);
    }
}
