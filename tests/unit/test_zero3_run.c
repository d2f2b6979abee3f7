/* trainer/zero3_run.c and the optimizer's pieces (ZeRO stage 3 in the run):
 *  - the stage-3 step of a full fine-tune over 1, 2 and 3 forked ranks (a file store,
 *    loopback Gloo), each rank's AdamW over its pieces of every parameter unit of the
 *    llama fixture with the global norm from the shards' sums of squares, gathered back
 *    at the end: one process's optimizer_step on the whole buffer, clipped and not;
 *  - moments saved by stage 3's per-unit pieces or by stages 1-2's contiguous shards (or
 *    one process), read back into the other layouts at other rank counts, and a
 *    malformed piece table refused;
 *  - an RL job refused at stage 3. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/common.h"
#include "model/safetensors.h"
#include "tests/unit/parity_testutil.h"
#include "testutil.h"
#include "trainer/trainer_internal.h"

#define N_STEPS 3
#define MAX_RANKS 4

/* Rank r's gradient of flat element i at step t: half-integers, so the sum over ranks is
 * exact in f32 in any order (the reduce-scatter adds no rounding of its own). */
static float local_grad(int r, int64_t i, int t) { return (float)((i * 7 + r * 13 + t * 5) % 17) - 8.5f; }

static float summed_grad(int ranks, int64_t i, int t) {
    float g = 0;
    for (int r = 0; r < ranks; r++) g += local_grad(r, i, t);
    return g;
}

static struct adamw_step hyper(double max_norm) {
    return (struct adamw_step){.grad_scale = 0.001, .max_norm = max_norm, .lr = 0.01, .beta1 = 0.9,
                               .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
}

/* One process: optimizer_step over the whole buffer with the ranks' summed gradients. */
static void reference(int ranks, double max_norm, float **params, int64_t *n, double *norms) {
    struct smelt_error err = {0};
    struct model *m = parity_model_load("llama", "");
    *n = m->n_weights;
    *params = malloc((size_t)*n * sizeof **params);
    float *grads = malloc((size_t)*n * sizeof *grads);
    cr_assert(*params && grads);
    memcpy(*params, m->weights.data, (size_t)*n * sizeof **params);
    struct tensor p = tensor_f32(*params, 1, n), g = tensor_f32(grads, 1, n);
    struct optimizer opt;
    TEST_OK(optimizer_init(&opt, &p, &err), &err);
    struct adamw_step s = hyper(max_norm);
    for (int t = 0; t < N_STEPS; t++) {
        for (int64_t i = 0; i < *n; i++) grads[i] = summed_grad(ranks, i, t);
        TEST_OK(optimizer_step(&opt, &p, &g, s.grad_scale, s.max_norm, s.lr, s.beta1, s.beta2, s.eps,
                               s.weight_decay, &norms[t], &err),
                &err);
    }
    optimizer_free(&opt);
    free(grads);
    model_free(m);
}

/* What a backward over every rank's micro-batches leaves in this rank's gradient shard. */
static void fill_shard_grads(struct trainer_run *r, int t) {
    float *g = zero3_grads(r->zero3)->data;
    for (int64_t u = 0; u < model_unit_count(r->model); u++) {
        int64_t off, n, at;
        zero3_piece(r->zero3, u, &off, &n, &at);
        for (int64_t j = 0; j < n; j++) g[at + j] = summed_grad(r->dist.ranks, off + j, t);
    }
}

static int open_comm(struct dist *d, int rank, int ranks, const char *run_id, struct smelt_error *err) {
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    *d = (struct dist){.rank = rank, .ranks = ranks, .stage = 3};
    TRY(comm_store_open(spec, "trainer", &d->store, err));
    struct comm_options co = {.rank = rank, .size = ranks, .name = run_id, .timeout_ms = 10000,
                              .backend = COMM_BACKEND_GLOO};
    return comm_create(d->store, &co, &d->comm, err);
}

/* The steps on this rank, then the whole weights gathered back. */
static int stage3_steps(struct trainer_run *r, double max_norm, double *norms, struct smelt_error *err) {
    TRY(zero3_run_setup(r, err));
    int64_t shard = tensor_numel(zero3_params(r->zero3));
    if (tensor_numel(&r->opt.m) != shard || r->opt.n_pieces != model_unit_count(r->model) ||
        r->opt.total != r->model->n_weights)
        return error_set(err, SMELT_EINVAL, "moments of %lld in %lld pieces; the shard has %lld",
                         (long long)tensor_numel(&r->opt.m), (long long)r->opt.n_pieces, (long long)shard);
    if (shard > r->model->n_weights / r->dist.ranks + model_unit_count(r->model))
        return error_set(err, SMELT_EINVAL, "a shard of %lld of %lld parameters on %d ranks", (long long)shard,
                         (long long)r->model->n_weights, r->dist.ranks);
    struct adamw_step s = hyper(max_norm);
    for (int t = 0; t < N_STEPS; t++) {
        fill_shard_grads(r, t);
        TRY(zero3_run_optimizer_step(r, &s, &norms[t], err));
    }
    return zero3_unshard(r->zero3, true, err);
}

/* A forked rank: DIR/params.<rank> (weights, norms), or DIR/err.<rank>; exit 0 or 1. */
static _Noreturn void rank_main(int rank, int ranks, double max_norm, const char *run_id) {
    struct smelt_error err = {0};
    struct job_spec spec = {0};
    spec.type = JOB_SFT;
    struct trainer_run r = {.spec = &spec, .model = parity_model_load("llama", "")};
    double norms[N_STEPS];
    int rc = open_comm(&r.dist, rank, ranks, run_id, &err);
    if (!rc) rc = stage3_steps(&r, max_norm, norms, &err);
    char path[256], name[32];
    snprintf(name, sizeof name, rc ? "err.%d" : "params.%d", rank);
    test_tmp_path(path, sizeof path, name);
    if (rc) {
        file_write_atomic(path, err.message, strlen(err.message), NULL);
    } else {
        FILE *f = fopen(path, "wb");
        size_t n = (size_t)r.model->n_weights;
        if (!f || fwrite(r.model->weights.data, sizeof(float), n, f) != n ||
            fwrite(norms, sizeof *norms, N_STEPS, f) != N_STEPS)
            rc = 1;
        if (f) fclose(f);
    }
    optimizer_free(&r.opt);
    zero3_free(r.zero3);
    model_free(r.model);
    dist_close(&r.dist);
    _exit(rc ? 1 : 0);
}

static void expect_close(double got, double want, double rel, const char *what, int rank, int64_t i) {
    cr_expect(fabs(got - want) <= rel * fmax(fabs(want), 1e-3), "%s [%lld] on rank %d: %.9g, one process %.9g", what,
              (long long)i, rank, got, want);
}

static void check_rank_output(int r, const float *want, int64_t n, const double *want_norms) {
    char path[256], name[32], *text = NULL;
    size_t len;
    snprintf(name, sizeof name, "err.%d", r);
    test_tmp_path(path, sizeof path, name);
    if (file_read_all(path, &text, &len, NULL) == 0) cr_expect_fail("rank %d: %s", r, text);
    free(text);
    snprintf(name, sizeof name, "params.%d", r);
    test_tmp_path(path, sizeof path, name);
    float *got = malloc((size_t)n * sizeof *got);
    double norms[N_STEPS];
    FILE *f = fopen(path, "rb");
    cr_assert(f && got, "no %s", path);
    cr_assert(fread(got, sizeof *got, (size_t)n, f) == (size_t)n && fread(norms, sizeof *norms, N_STEPS, f) == N_STEPS);
    fclose(f);
    for (int t = 0; t < N_STEPS; t++) expect_close(norms[t], want_norms[t], 1e-9, "norm", r, t);
    int64_t bad = 0;
    for (int64_t i = 0; i < n && bad < 5; i++) {
        bool ok = fabs(got[i] - want[i]) <= 1e-6 * fmax(fabs(want[i]), 1e-3);
        if (!ok) expect_close(got[i], want[i], 1e-6, "param", r, i);
        bad += !ok;
    }
    free(got);
}

/* The ranks are forked before this process runs anything parallel: a child of a process
 * whose OpenMP pool exists would hang in its first parallel region (libgomp). */
static void check_stage3_step(int ranks, double max_norm) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "z3-%d-%d", ranks, max_norm > 0);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < ranks; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) rank_main(r, ranks, max_norm, run_id);
    }
    int status[MAX_RANKS];
    for (int r = 0; r < ranks; r++) cr_assert(waitpid(pids[r], &status[r], 0) == pids[r]);
    float *want;
    int64_t n;
    double want_norms[N_STEPS];
    reference(ranks, max_norm, &want, &n, want_norms);
    if (max_norm > 0) cr_expect(want_norms[0] > max_norm, "the test must clip: norm %g", want_norms[0]);
    else cr_expect(want_norms[0] > 0.5, "unclipped at a norm the clipped cases clip");
    for (int r = 0; r < ranks; r++) {
        check_rank_output(r, want, n, want_norms);
        cr_expect(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d failed", r);
    }
    free(want);
}

TestSuite(zero3_run, .init = test_tmp_setup, .fini = test_tmp_teardown, .timeout = 60);

Test(zero3_run, step_one_rank_clipped) { check_stage3_step(1, 0.5); }
Test(zero3_run, step_two_ranks_clipped) { check_stage3_step(2, 0.5); }
Test(zero3_run, step_three_ranks_unclipped) { check_stage3_step(3, 0); }
Test(zero3_run, step_three_ranks_clipped) { check_stage3_step(3, 0.5); }

/* ---- moments of one layout read by another ------------------------------------------ */

/* Synthetic parameter units (the flat buffer's contiguous ranges), uneven on 2, 3, 4. */
static const int64_t UNITS[] = {100, 333, 7, 561};
#define N_UNITS 4
#define TOTAL 1001

enum layout { CONTIGUOUS, PIECES }; /* stages 1-2 (or one process), stage 3 */

static float moment_value(int64_t i, int which) { return (float)(i % 97) * (which ? 0.5f : -0.25f) + (float)which; }

/* Rank k of `ranks` in layout l: its flat ranges (stage 3: its piece of every unit). */
static int ranges_of(enum layout l, int ranks, int k, int64_t *off, int64_t *len) {
    if (l == CONTIGUOUS) {
        size_t o, n;
        comm_shard(TOTAL, ranks, k, &o, &n);
        off[0] = (int64_t)o;
        len[0] = (int64_t)n;
        return 1;
    }
    int64_t base = 0;
    for (int u = 0; u < N_UNITS; base += UNITS[u], u++) {
        size_t o, n;
        comm_shard((size_t)UNITS[u], ranks, k, &o, &n);
        off[u] = base + (int64_t)o;
        len[u] = (int64_t)n;
    }
    return N_UNITS;
}

static void init_layout(struct optimizer *opt, enum layout l, int ranks, int k, float *buf) {
    struct smelt_error err = {0};
    int64_t off[N_UNITS], len[N_UNITS], shard = 0, total = TOTAL;
    int n = ranges_of(l, ranks, k, off, len);
    for (int i = 0; i < n; i++) shard += len[i];
    struct tensor whole = tensor_f32(buf, 1, &total), mine = tensor_f32(buf, 1, &shard);
    if (l == CONTIGUOUS) TEST_OK(optimizer_init_shard(opt, &whole, off[0], len[0], &err), &err);
    else TEST_OK(optimizer_init_pieces(opt, &mine, TOTAL, n, off, len, &err), &err);
}

/* Calls fn(flat index, moment index) for every element opt holds. */
static void each_element(const struct optimizer *opt, void (*fn)(const struct optimizer *, int64_t, int64_t)) {
    if (!opt->n_pieces) {
        for (int64_t j = 0; j < tensor_numel(&opt->m); j++) fn(opt, opt->offset + j, j);
        return;
    }
    for (int64_t p = 0, at = 0; p < opt->n_pieces; at += opt->piece_len[p], p++)
        for (int64_t j = 0; j < opt->piece_len[p]; j++) fn(opt, opt->piece_off[p] + j, at + j);
}

static void put(const struct optimizer *opt, int64_t flat, int64_t j) {
    ((float *)opt->m.data)[j] = moment_value(flat, 0);
    ((float *)opt->v.data)[j] = moment_value(flat, 1);
}

static void expect(const struct optimizer *opt, int64_t flat, int64_t j) {
    cr_expect_eq(((float *)opt->m.data)[j], moment_value(flat, 0), "m[%lld]", (long long)flat);
    cr_expect_eq(((float *)opt->v.data)[j], moment_value(flat, 1), "v[%lld]", (long long)flat);
}

static void save_layout(enum layout l, int ranks, char paths[][256]) {
    static float buf[TOTAL];
    struct smelt_error err = {0};
    for (int k = 0; k < ranks; k++) {
        struct optimizer opt;
        init_layout(&opt, l, ranks, k, buf);
        each_element(&opt, put);
        opt.step = 5;
        char name[64];
        snprintf(name, sizeof name, "opt-%d-%d-%d.safetensors", l, ranks, k);
        test_tmp_path(paths[k], 256, name);
        TEST_OK(optimizer_save(&opt, paths[k], &err), &err);
        optimizer_free(&opt);
    }
}

static void check_reshard(enum layout from, int from_ranks, enum layout to, int to_ranks) {
    char paths[MAX_RANKS][256];
    const char *names[MAX_RANKS];
    save_layout(from, from_ranks, paths);
    for (int k = 0; k < from_ranks; k++) names[k] = paths[k];
    static float buf[TOTAL];
    struct smelt_error err = {0};
    for (int k = 0; k < to_ranks; k++) {
        struct optimizer opt;
        init_layout(&opt, to, to_ranks, k, buf);
        TEST_OK(optimizer_load_shards(&opt, names, from_ranks, &err), &err);
        cr_expect_eq(opt.step, 5);
        each_element(&opt, expect);
        optimizer_free(&opt);
    }
}

Test(zero3_run, reshard_pieces_4_to_pieces_2) { check_reshard(PIECES, 4, PIECES, 2); }
Test(zero3_run, reshard_pieces_4_to_one_process) { check_reshard(PIECES, 4, CONTIGUOUS, 1); }
Test(zero3_run, reshard_pieces_3_to_contiguous_2) { check_reshard(PIECES, 3, CONTIGUOUS, 2); }
Test(zero3_run, reshard_contiguous_2_to_pieces_2) { check_reshard(CONTIGUOUS, 2, PIECES, 2); }
Test(zero3_run, reshard_one_process_to_pieces_3) { check_reshard(CONTIGUOUS, 1, PIECES, 3); }

/* A piece table that does not parse, or does not fit the total or the moments. */
Test(zero3_run, reshard_refuses_bad_piece_tables) {
    static const char *const bad[] = {"0+5,x", "0+5,996+6", "0+4", "0+5,", "-1+5"};
    float m[5] = {0}, v[5] = {0};
    int64_t five = 5, total = TOTAL;
    static float buf[TOTAL];
    struct tensor whole = tensor_f32(buf, 1, &total);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct smelt_error err = {0};
        char path[256];
        test_tmp_path(path, sizeof path, "bad.safetensors");
        struct safetensors_tensor_desc t[2] = {{"exp_avg", tensor_f32(m, 1, &five), DTYPE_F32},
                                               {"exp_avg_sq", tensor_f32(v, 1, &five), DTYPE_F32}};
        struct safetensors_kv meta[4] = {{"step", "1"}, {"offset", "0"}, {"total", "1001"}, {"pieces", bad[i]}};
        TEST_OK(safetensors_write(path, t, 2, meta, 4, &err), &err);
        struct optimizer opt;
        TEST_OK(optimizer_init(&opt, &whole, &err), &err);
        cr_expect_eq(optimizer_load(&opt, path, &err), SMELT_EFORMAT, "pieces \"%s\"", bad[i]);
        cr_expect(strstr(err.message, "pieces"), "%s", err.message);
        optimizer_free(&opt);
    }
}

/* GRPO and PPO do not run at stage 3 on several ranks: refused by the field's name before
 * anything is sharded. */
Test(zero3_run, refuses_rl_jobs) {
    static const enum job_type rl[] = {JOB_GRPO, JOB_PPO};
    for (size_t i = 0; i < 2; i++) {
        struct job_spec spec = {0};
        spec.type = rl[i];
        struct trainer_run r = {.spec = &spec, .dist = {.ranks = 2, .stage = 3}};
        struct smelt_error err = {0};
        cr_expect_eq(zero3_run_setup(&r, &err), SMELT_EINVAL);
        cr_expect_str_eq(err.field, "hyperparameters.zero_stage");
        cr_expect(strstr(err.message, job_type_name(rl[i])), "%s", err.message);
        cr_expect_null(r.zero3);
    }
}
