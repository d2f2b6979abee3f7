/* trainer/dist.c and the sharded optimizer: the ZeRO step over 1, 2 and 3 forked ranks
 * (a file store in a temporary folder, loopback Gloo) against one process's
 * optimizer_step, with clipping on and off; and optimizer moments saved as the shards of
 * one layout and read back into another (4 -> 2, 4 -> 1, 1 -> 3, 3 -> 2). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/common.h"
#include "testutil.h"
#include "trainer/trainer_internal.h"

#define N_PARAMS 1001 /* not a multiple of 2 or 3: uneven shards */
#define N_STEPS 3
#define MAX_RANKS 4

/* Rank r's own gradient of element i at step t: half-integers, so the sum over ranks is
 * exact in f32 in any order and the ranks' reduction adds no rounding of its own. */
static float local_grad(int r, int64_t i, int t) { return (float)((i * 7 + r * 13 + t * 5) % 17) - 8.5f; }

static float start_param(int64_t i) { return (float)((i * 31) % 101) * 0.01f - 0.5f; }

static struct adamw_step hyper(double max_norm) {
    return (struct adamw_step){.grad_scale = 0.01, .max_norm = max_norm, .lr = 0.01, .beta1 = 0.9,
                               .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
}

/* One process: optimizer_step on the ranks' summed gradients; the norms into norms. */
static void reference(int ranks, double max_norm, float *params, double *norms) {
    struct smelt_error err = {0};
    int64_t n = N_PARAMS;
    static float grads[N_PARAMS];
    for (int64_t i = 0; i < n; i++) params[i] = start_param(i);
    struct tensor p = tensor_f32(params, 1, &n), g = tensor_f32(grads, 1, &n);
    struct optimizer opt;
    TEST_OK(optimizer_init(&opt, &p, &err), &err);
    struct adamw_step s = hyper(max_norm);
    for (int t = 0; t < N_STEPS; t++) {
        for (int64_t i = 0; i < n; i++) {
            grads[i] = 0;
            for (int r = 0; r < ranks; r++) grads[i] += local_grad(r, i, t);
        }
        TEST_OK(optimizer_step(&opt, &p, &g, s.grad_scale, s.max_norm, s.lr, s.beta1, s.beta2, s.eps,
                               s.weight_decay, &norms[t], &err),
                &err);
    }
    optimizer_free(&opt);
}

/* A forked rank: the same steps through dist_optimizer_step; its parameters and norms
 * into DIR/params.<rank>. Exit code 0, or 1 with the message in DIR/err.<rank>. */
static _Noreturn void rank_main(int rank, int ranks, int stage, double max_norm, const char *run_id) {
    struct smelt_error err = {0};
    char spec[128], path[256], name[32];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    struct dist d;
    struct dist_config c = {.rank = rank, .ranks = ranks, .stage = stage, .rendezvous = spec, .run_id = run_id,
                            .timeout_ms = 10000};
    int64_t n = N_PARAMS;
    float *params = malloc(N_PARAMS * sizeof *params), *grads = malloc(N_PARAMS * sizeof *grads);
    double norms[N_STEPS];
    for (int64_t i = 0; i < n; i++) params[i] = start_param(i);
    struct tensor p = tensor_f32(params, 1, &n), g = tensor_f32(grads, 1, &n);
    struct optimizer opt = {0};
    struct adamw_step s = hyper(max_norm);
    int rc = dist_open(&d, &c, &err);
    if (!rc) rc = dist_optimizer_init(&d, &p, &opt, &err);
    for (int t = 0; t < N_STEPS && !rc; t++) {
        for (int64_t i = 0; i < n; i++) grads[i] = local_grad(rank, i, t);
        rc = dist_optimizer_step(&d, &opt, &p, &g, &s, &norms[t], &err);
    }
    /* The moments are as large as the rank's shard. */
    if (!rc && tensor_numel(&opt.m) != (dist_sharded(&d) ? d.shard_len : n))
        rc = error_set(&err, SMELT_EINVAL, "moments of %lld elements", (long long)tensor_numel(&opt.m));
    optimizer_free(&opt);
    dist_close(&d);
    snprintf(name, sizeof name, rc ? "err.%d" : "params.%d", rank);
    test_tmp_path(path, sizeof path, name);
    if (rc) {
        file_write_atomic(path, err.message, strlen(err.message), NULL);
    } else {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(params, sizeof *params, N_PARAMS, f) != N_PARAMS || fwrite(norms, sizeof *norms, N_STEPS, f) != N_STEPS)
            rc = 1;
        if (f) fclose(f);
    }
    free(params);
    free(grads);
    _exit(rc ? 1 : 0);
}

static void expect_close(double got, double want, double rel, const char *what, int rank, int64_t i) {
    cr_expect(fabs(got - want) <= rel * fmax(fabs(want), 1e-3), "%s [%lld] on rank %d: %.9g, one process %.9g", what,
              (long long)i, rank, got, want);
}

static void check_sharded_step(int ranks, int stage, double max_norm) {
    static float want[N_PARAMS], got[N_PARAMS];
    double want_norms[N_STEPS], got_norms[N_STEPS];
    reference(ranks, max_norm, want, want_norms);
    if (max_norm > 0) cr_assert(want_norms[0] * 1.0 > max_norm, "the test must clip: norm %g", want_norms[0]);
    char run_id[64];
    snprintf(run_id, sizeof run_id, "opt-%d-%d-%d", ranks, stage, max_norm > 0);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < ranks; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) rank_main(r, ranks, stage, max_norm, run_id);
    }
    for (int r = 0; r < ranks; r++) {
        int status;
        cr_assert(waitpid(pids[r], &status, 0) == pids[r]);
        char path[256], name[32], *text = NULL;
        size_t len;
        snprintf(name, sizeof name, "err.%d", r);
        test_tmp_path(path, sizeof path, name);
        if (file_read_all(path, &text, &len, NULL) == 0) cr_expect_fail("rank %d: %s", r, text);
        free(text);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d failed", r);
        snprintf(name, sizeof name, "params.%d", r);
        test_tmp_path(path, sizeof path, name);
        FILE *f = fopen(path, "rb");
        cr_assert(f, "no %s", path);
        cr_assert(fread(got, sizeof *got, N_PARAMS, f) == N_PARAMS && fread(got_norms, sizeof *got_norms, N_STEPS, f) == N_STEPS);
        fclose(f);
        for (int t = 0; t < N_STEPS; t++) expect_close(got_norms[t], want_norms[t], 1e-9, "norm", r, t);
        for (int64_t i = 0; i < N_PARAMS; i++) expect_close(got[i], want[i], 1e-6, "param", r, i);
    }
}

TestSuite(dist, .init = test_tmp_setup, .fini = test_tmp_teardown, .timeout = 60);

Test(dist, one_rank_is_optimizer_step) {
    check_sharded_step(1, 1, 1.0);
}

Test(dist, stage0_two_ranks_clipped) { check_sharded_step(2, 0, 1.0); }
Test(dist, stage1_two_ranks_clipped) { check_sharded_step(2, 1, 1.0); }
Test(dist, stage1_three_ranks_unclipped) { check_sharded_step(3, 1, 0); }
Test(dist, stage2_two_ranks_unclipped) { check_sharded_step(2, 2, 0); }
Test(dist, stage2_three_ranks_clipped) { check_sharded_step(3, 2, 1.0); }

/* ---- moments saved by one layout, read by another ---------------------------------- */

static float moment_value(int64_t i, int which) { return (float)(i % 97) * (which ? 0.5f : -0.25f) + (float)which; }

/* Saves the moments of a `from`-rank layout (each rank's shard, values by global index)
 * as DIR/opt-<from>-<k>.safetensors; paths receive the names. */
static void save_layout(int from, int64_t step, char paths[][256]) {
    struct smelt_error err = {0};
    int64_t n = N_PARAMS;
    static float params[N_PARAMS];
    struct tensor p = tensor_f32(params, 1, &n);
    for (int k = 0; k < from; k++) {
        size_t off, len;
        comm_shard(N_PARAMS, from, k, &off, &len);
        struct optimizer opt;
        TEST_OK(optimizer_init_shard(&opt, &p, (int64_t)off, (int64_t)len, &err), &err);
        for (size_t j = 0; j < len; j++) {
            ((float *)opt.m.data)[j] = moment_value((int64_t)(off + j), 0);
            ((float *)opt.v.data)[j] = moment_value((int64_t)(off + j), 1);
        }
        opt.step = step;
        char name[64];
        snprintf(name, sizeof name, "opt-%d-%d.safetensors", from, k);
        test_tmp_path(paths[k], 256, name);
        TEST_OK(optimizer_save(&opt, paths[k], &err), &err);
        optimizer_free(&opt);
    }
}

static void check_reshard(int from, int to) {
    char paths[MAX_RANKS][256];
    const char *names[MAX_RANKS];
    save_layout(from, 7, paths);
    for (int k = 0; k < from; k++) names[k] = paths[k];
    struct smelt_error err = {0};
    int64_t n = N_PARAMS;
    static float params[N_PARAMS];
    struct tensor p = tensor_f32(params, 1, &n);
    for (int k = 0; k < to; k++) {
        size_t off, len;
        comm_shard(N_PARAMS, to, k, &off, &len);
        struct optimizer opt;
        TEST_OK(optimizer_init_shard(&opt, &p, (int64_t)off, (int64_t)len, &err), &err);
        TEST_OK(optimizer_load_shards(&opt, names, from, &err), &err);
        cr_expect_eq(opt.step, 7);
        for (size_t j = 0; j < len; j++) {
            cr_expect_eq(((float *)opt.m.data)[j], moment_value((int64_t)(off + j), 0), "%d -> %d: m[%zu]", from, to,
                         off + j);
            cr_expect_eq(((float *)opt.v.data)[j], moment_value((int64_t)(off + j), 1), "%d -> %d: v[%zu]", from, to,
                         off + j);
        }
        optimizer_free(&opt);
    }
}

Test(dist, reshard_4_to_2) { check_reshard(4, 2); }
Test(dist, reshard_4_to_1) { check_reshard(4, 1); }
Test(dist, reshard_1_to_3) { check_reshard(1, 3); }
Test(dist, reshard_3_to_2) { check_reshard(3, 2); }

/* A missing shard leaves moments uncovered; shards of different steps are not one
 * checkpoint; another model's moments do not fit. */
Test(dist, reshard_refuses_partial_mixed_and_foreign) {
    char four[MAX_RANKS][256], two[MAX_RANKS][256];
    save_layout(4, 7, four);
    save_layout(2, 8, two);
    struct smelt_error err = {0};
    int64_t n = N_PARAMS;
    static float params[N_PARAMS];
    struct tensor p = tensor_f32(params, 1, &n);
    struct optimizer opt;
    TEST_OK(optimizer_init(&opt, &p, &err), &err);
    const char *partial[3] = {four[0], four[1], four[2]};
    cr_expect_eq(optimizer_load_shards(&opt, partial, 3, &err), SMELT_EFORMAT);
    cr_expect(strstr(err.message, "cover"), "%s", err.message);
    const char *mixed[4] = {four[0], four[1], two[1], NULL};
    cr_expect_eq(optimizer_load_shards(&opt, mixed, 3, &err), SMELT_EFORMAT);
    cr_expect(strstr(err.message, "step"), "%s", err.message);
    optimizer_free(&opt);
    int64_t other = N_PARAMS + 1;
    float *bigger = calloc((size_t)other, sizeof *bigger);
    struct tensor q = tensor_f32(bigger, 1, &other);
    TEST_OK(optimizer_init(&opt, &q, &err), &err);
    const char *all[4] = {four[0], four[1], four[2], four[3]};
    cr_expect_eq(optimizer_load_shards(&opt, all, 4, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "1001 parameters"), "%s", err.message);
    optimizer_free(&opt);
    free(bigger);
}

/* dist_check: what the options may not ask of a spec. */
Test(dist, check_refuses_bad_combinations) {
    struct job_spec s = {0};
    s.type = JOB_SFT;
    s.backend = BACKEND_CPU;
    s.hp.grad_accum = 2;
    struct smelt_error err = {0};
    struct trainer_options o = {.rank = 0, .ranks = 2, .rendezvous = "file:/tmp/x"};
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_OK, "%s", err.message);
    o.ranks = 3;
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "ranks");
    cr_expect(strstr(err.message, "grad_accum"), "%s", err.message);
    o.ranks = 2;
    o.rank = 2;
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rank");
    o.rank = 1;
    o.rendezvous = NULL;
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "rendezvous");
    o.rendezvous = "file:/tmp/x";
    s.type = JOB_GRPO; /* RL jobs: test_rl_dist.c */
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_OK, "%s", err.message);
    s.type = JOB_SFT;
    o.ranks = 1;
    o.rank = 0;
    o.rendezvous = NULL;
    cr_expect_eq(dist_check(&s, &o, &err), SMELT_OK, "one rank needs nothing more: %s", err.message);
}
