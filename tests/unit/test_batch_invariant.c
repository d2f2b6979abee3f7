/* Batch-invariant mode (ops_set_batch_invariant): ops_matmul's rows have the same bits
 * whatever the row count, the thread count and the row's place, each element is
 * cpu_dot's scalar definition and close to a float64 reference; and the rollout engine's
 * logprobs (many sequences at once, greedy and sampled, chunked prefill, preemption,
 * LoRA adapters unmerged) equal bit for bit the trainer's model_forward of the same sequences packed
 * in one batch. With the mode off the same comparison is only close: its max |difference|
 * is printed. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h" /* cpu_dot: the definition of every element */
#include "lora/lora.h"
#include "model/model.h"
#include "rollout/rollout.h"
#include "tests/unit/rollout_testutil.h"

static void set_mode(bool on) {
    struct smelt_error err = {0};
    TEST_OK(ops_set_batch_invariant(BACKEND_CPU, on, &err), &err);
    cr_assert_eq(ops_batch_invariant(BACKEND_CPU), on);
}

/* ---- the switch ---- */

Test(batch_invariant, the_switch_is_cpu_only) {
    struct smelt_error err = {0};
    cr_expect(!ops_batch_invariant(BACKEND_CPU), "the mode starts off");
    set_mode(true);
    set_mode(false);
    /* CUDA: refused (no such mode there, or no CUDA in this build), and never reported on. */
    TEST_EXPECT_ERROR(ops_set_batch_invariant(BACKEND_CUDA, true, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(!ops_batch_invariant(BACKEND_CUDA));
    cr_expect(!ops_batch_invariant(BACKEND_CPU), "a refusal elsewhere leaves the CPU alone");
}

/* ---- matmul ---- */

/* One product out [M, N] = alpha * op(a) @ op(b) + bias + beta * out over the rows [r0,
 * r0 + m) of a full problem of `rows` rows: a is [rows, K] (stored [K, rows] when
 * trans_a), b is [N, K] when trans_b else [K, N]. */
struct mm_case {
    int64_t k, n;
    bool trans_a, trans_b, bias;
    float alpha, beta;
};

struct mm_data {
    int64_t rows;
    float *a_rows;  /* [rows, K]: op(a) by rows, whatever the storage */
    float *b;       /* stored as the case says */
    float *bias;    /* [N] */
    float *old;     /* [rows, N]: out's content before the call */
};

static struct mm_data mm_data_make(const struct mm_case *c, int64_t rows, uint64_t seed) {
    struct test_rng rng = {seed};
    struct mm_data d = {.rows = rows};
    d.a_rows = test_rand_f32(&rng, rows * c->k, -1, 1);
    d.b = test_rand_f32(&rng, c->n * c->k, -1, 1);
    d.bias = test_rand_f32(&rng, c->n, -1, 1);
    d.old = test_rand_f32(&rng, rows * c->n, -1, 1);
    return d;
}

static void mm_data_free(struct mm_data *d) { free(d->a_rows), free(d->b), free(d->bias), free(d->old); }

/* ops_matmul over rows [r0, r0 + m) of d; out [m, N] malloc'd. */
static float *mm_rows(const struct mm_case *c, const struct mm_data *d, int64_t r0, int64_t m) {
    struct smelt_error err = {0};
    float *a = malloc((size_t)(m * c->k) * sizeof *a), *out = malloc((size_t)(m * c->n) * sizeof *out);
    cr_assert(a && out);
    for (int64_t i = 0; i < m; i++)
        for (int64_t kk = 0; kk < c->k; kk++) {
            float v = d->a_rows[(r0 + i) * c->k + kk];
            if (c->trans_a) a[kk * m + i] = v;
            else a[i * c->k + kk] = v;
        }
    memcpy(out, d->old + r0 * c->n, (size_t)(m * c->n) * sizeof *out);
    int64_t sa[2] = {c->trans_a ? c->k : m, c->trans_a ? m : c->k};
    int64_t sb[2] = {c->trans_b ? c->n : c->k, c->trans_b ? c->k : c->n}, so[2] = {m, c->n};
    struct tensor ta = tensor_f32(a, 2, sa), tb = tensor_f32(d->b, 2, sb), to = tensor_f32(out, 2, so);
    struct tensor tbias = tensor_f32(d->bias, 1, &c->n);
    TEST_OK(ops_matmul(&to, &ta, &tb, c->bias ? &tbias : NULL, c->trans_a, c->trans_b, c->alpha, c->beta, &err),
            &err);
    free(a);
    return out;
}

/* Column j of op(b) as a contiguous row of K. */
static void b_column(const struct mm_case *c, const float *b, int64_t j, float *col) {
    for (int64_t kk = 0; kk < c->k; kk++) col[kk] = c->trans_b ? b[j * c->k + kk] : b[kk * c->n + j];
}

/* Every element of the full product is bias + beta * old, then + alpha * cpu_dot, bit for
 * bit (the scalar definition), and within float32 rounding of the float64 sum. */
static void check_definition(const struct mm_case *c, const struct mm_data *d, const float *full) {
    float *col = malloc((size_t)c->k * sizeof *col);
    cr_assert(col);
    int64_t wrong = 0, far = 0;
    for (int64_t j = 0; j < c->n; j++) {
        b_column(c, d->b, j, col);
        for (int64_t i = 0; i < d->rows; i++) {
            const float *row = d->a_rows + i * c->k;
            float old = d->old[i * c->n + j], bias = c->bias ? d->bias[j] : 0.0f;
            float prep = c->beta == 0.0f ? bias : c->bias ? bias + c->beta * old : c->beta * old;
            float want = prep + c->alpha * cpu_dot(row, col, c->k);
            float got = full[i * c->n + j];
            wrong += memcmp(&want, &got, sizeof got) != 0;
            double exact = (double)prep, scale = fabs((double)prep);
            for (int64_t kk = 0; kk < c->k; kk++) {
                exact += (double)c->alpha * row[kk] * col[kk];
                scale += fabs((double)c->alpha * row[kk] * col[kk]);
            }
            /* (K + 4) roundings of at most half an ulp of the running magnitude. */
            far += fabs((double)got - exact) > (double)(c->k + 4) * 0x1p-24 * scale + 1e-30;
        }
    }
    cr_expect_eq(wrong, 0, "K %lld N %lld: %lld elements differ from the cpu_dot definition", (long long)c->k,
                 (long long)c->n, (long long)wrong);
    cr_expect_eq(far, 0, "K %lld N %lld: %lld elements are off the float64 product by more than rounding",
                 (long long)c->k, (long long)c->n, (long long)far);
    free(col);
}

/* Rows of every count 1..40 (and one large count), at shifting offsets, alone in a call,
 * under 1 and 2 threads: the bits of the full 300-row product. */
static void check_rows_invariant(const struct mm_case *c) {
    enum { ROWS = 300 };
    struct mm_data d = mm_data_make(c, ROWS, (uint64_t)(c->k * 1000 + c->n));
    omp_set_num_threads(2);
    float *full = mm_rows(c, &d, 0, ROWS);
    check_definition(c, &d, full);
    int64_t counts[41];
    for (int i = 0; i < 40; i++) counts[i] = i + 1;
    counts[40] = 257;
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int i = 0; i < 41; i++) {
            int64_t m = counts[i], r0 = (m * 37 + threads * 11) % (ROWS - m + 1);
            float *part = mm_rows(c, &d, r0, m);
            cr_expect_eq(memcmp(part, full + r0 * c->n, (size_t)(m * c->n) * sizeof *part), 0,
                         "K %lld N %lld trans_a %d trans_b %d: rows [%lld, %lld) alone (%d threads) differ "
                         "from the same rows of %d",
                         (long long)c->k, (long long)c->n, c->trans_a, c->trans_b, (long long)r0,
                         (long long)(r0 + m), threads, ROWS);
            free(part);
        }
    }
    free(full);
    mm_data_free(&d);
}

Test(batch_invariant, matmul_rows_have_the_same_bits_for_any_row_count) {
    set_mode(true);
    const struct mm_case cases[] = {
        {.k = 32, .n = 96, .trans_b = true, .alpha = 1, .beta = 0},        /* parity models' lm_head */
        {.k = 64, .n = 130, .trans_b = true, .bias = true, .alpha = 1, .beta = 1}, /* residual + bias */
        {.k = 37, .n = 13, .trans_b = true, .alpha = 0.5f, .beta = 0},     /* K with a tail, odd N */
        {.k = 384, .n = 128, .trans_b = true, .alpha = 1, .beta = 0},      /* llama-22m's k/v */
        {.k = 5, .n = 9, .trans_b = true, .bias = true, .alpha = 1, .beta = 0}, /* K below one lane block */
        {.k = 48, .n = 40, .trans_b = false, .alpha = 2, .beta = 0.5f},    /* B stored [K, N] */
        {.k = 40, .n = 24, .trans_a = true, .trans_b = true, .alpha = 1, .beta = 0},
        {.k = 19, .n = 33, .trans_a = true, .trans_b = false, .bias = true, .alpha = 1, .beta = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_rows_invariant(&cases[i]);
}

/* The linear layer's batched form (x [B, T, K] next to a shared W) gives each token the
 * bits it has in a 2D call of any size. */
Test(batch_invariant, batched_operands_give_each_row_its_bits) {
    set_mode(true);
    enum { B = 3, T = 7, K = 24, N = 20 };
    struct test_rng rng = {5};
    float *x = test_rand_f32(&rng, B * T * K, -1, 1), *w = test_rand_f32(&rng, N * K, -1, 1);
    float *w_batched = malloc(B * N * K * sizeof *w_batched);
    float out3[B * T * N], out3b[B * T * N], one[N];
    cr_assert(w_batched);
    for (int b = 0; b < B; b++) memcpy(w_batched + b * N * K, w, N * K * sizeof *w);
    int64_t sx[3] = {B, T, K}, sw[2] = {N, K}, swb[3] = {B, N, K}, so[3] = {B, T, N};
    struct tensor tx = tensor_f32(x, 3, sx), tw = tensor_f32(w, 2, sw), twb = tensor_f32(w_batched, 3, swb);
    struct tensor to = tensor_f32(out3, 3, so), tob = tensor_f32(out3b, 3, so);
    struct smelt_error err = {0};
    TEST_OK(ops_matmul(&to, &tx, &tw, NULL, false, true, 1, 0, &err), &err);
    TEST_OK(ops_matmul(&tob, &tx, &twb, NULL, false, true, 1, 0, &err), &err);
    cr_expect_eq(memcmp(out3, out3b, sizeof out3), 0, "a weight per batch gives other bits than a shared one");
    for (int r = 0; r < B * T; r++) {
        int64_t s1[2] = {1, K}, s2[2] = {1, N};
        struct tensor row = tensor_f32(x + r * K, 2, s1), o = tensor_f32(one, 2, s2);
        TEST_OK(ops_matmul(&o, &row, &tw, NULL, false, true, 1, 0, &err), &err);
        cr_expect_eq(memcmp(one, out3 + r * N, sizeof one), 0, "row %d alone differs from its batched bits", r);
    }
    free(x), free(w), free(w_batched);
}

/* An empty inner dimension adds cpu_dot's empty sum (+0) to bias + beta * out, as the
 * definition says, and reads no operand memory (there is none). */
Test(batch_invariant, empty_inner_dimension) {
    set_mode(true);
    float out[6] = {1, -2, 3, -4, 5, -0.0f}, bias[3] = {0.5f, 0.25f, -1};
    int64_t sa[2] = {2, 0}, sb[2] = {3, 0}, so[2] = {2, 3}, sbias = 3;
    struct tensor a = tensor_f32(NULL, 2, sa), b = tensor_f32(NULL, 2, sb), o = tensor_f32(out, 2, so);
    struct tensor tb = tensor_f32(bias, 1, &sbias);
    struct smelt_error err = {0};
    TEST_OK(ops_matmul(&o, &a, &b, &tb, false, true, 2.0f, 1.0f, &err), &err);
    const float want[6] = {1.5f, -1.75f, 2, -3.5f, 5.25f, -1};
    cr_expect_eq(memcmp(out, want, sizeof out), 0, "%g %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4],
                 out[5]);
}

/* The mode is what makes the difference: without it, OpenBLAS's rows are only close
 * (how many differ depends on the CPU's kernels, so it is printed, not asserted). */
Test(batch_invariant, without_the_mode_rows_are_close) {
    set_mode(false);
    const struct mm_case c = {.k = 384, .n = 128, .trans_b = true, .alpha = 1, .beta = 0};
    struct mm_data d = mm_data_make(&c, 300, 9);
    float *full = mm_rows(&c, &d, 0, 300);
    int64_t differ = 0;
    double worst = 0;
    for (int64_t m = 1; m <= 40; m++) {
        float *part = mm_rows(&c, &d, 0, m);
        for (int64_t e = 0; e < m * c.n; e++) {
            double diff = fabs((double)part[e] - (double)full[e]);
            worst = diff > worst ? diff : worst;
        }
        differ += memcmp(part, full, (size_t)(m * c.n) * sizeof *part) != 0;
        free(part);
    }
    cr_log_info("batch_invariant: mode off, K 384 N 128: %lld of 40 row counts give other bits than 300 rows "
                "(max |diff| %.3g)", (long long)differ, worst);
    cr_expect(worst < 1e-4);
    free(full);
    mm_data_free(&d);
}

/* ---- the engine against the trainer ---- */

enum { N_REQ = 5, MAX_SAMPLES = 3 };

struct engine_run {
    int32_t prompts[N_REQ][48];
    int64_t lens[N_REQ];
    struct rollout_test_collected *c;
    int n_samples[N_REQ];
    int64_t tokens; /* generated in all: no stop ids, so every sample runs to its length */
    int64_t preemptions;
};

/* How the engine runs the requests. */
struct engine_setup {
    const char *name;
    bool greedy_only;  /* every step reduces its logits on the backend (ops_argmax +
                          ops_logprobs) instead of on the host */
    int64_t kv_tokens; /* the KV pool: a small one preempts sequences (recomputed later) */
};

static const struct engine_setup SETUPS[] = {
    {"mixed", false, 2048},
    {"greedy", true, 2048},
    {"mixed, preempted", false, 8 * ROLLOUT_KV_BLOCK_TOKENS},
};

/* Five requests of different prompt lengths at once, through chunked prefill (7 tokens
 * of a prompt per step, 64 tokens per step): greedy ones, and sampled ones (n = 2 or 3,
 * temperature, top-p) unless greedy_only. */
static void engine_generate(struct model *m, const struct engine_setup *setup, struct engine_run *run) {
    int64_t V = m->config.vocab_size, ctx = m->config.max_seq_len;
    const int64_t lens[N_REQ] = {1, 5, 17, 33, 9};
    bool greedy_only = setup->greedy_only;
    struct rollout_engine *e = rollout_test_engine(m, NULL, setup->kv_tokens, 64, 16, 7);
    struct smelt_error err = {0};
    run->tokens = 0;
    for (int i = 0; i < N_REQ; i++) {
        run->lens[i] = lens[i];
        rollout_test_prompt(run->prompts[i], lens[i], i, V);
        bool greedy = greedy_only || i % 2 == 0;
        run->n_samples[i] = greedy ? 1 : 2 + i % 2;
        int64_t max_new = lens[i] + 14 <= ctx ? 14 : ctx - lens[i];
        struct rollout_request r = {.id = (uint64_t)i, .prompt = run->prompts[i], .n_prompt = lens[i],
                                    .n = run->n_samples[i], .seed = (uint64_t)(40 + i), .max_new_tokens = max_new,
                                    .sampling = {.temperature = greedy ? 0.0f : 0.9f, .top_p = greedy ? 1.0f : 0.95f}};
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
        run->tokens += run->n_samples[i] * max_new;
    }
    run->c = rollout_test_run_all(e);
    run->preemptions = rollout_engine_stats(e).preemptions;
    rollout_engine_free(e);
}

/* The trainer's view (trainer/rl_batch.c): every sample is its prompt followed by its
 * tokens, all packed in one batch; the logprob of generated token j sits at position
 * n_prompt - 1 + j. Returns the largest |engine - trainer| and counts the tokens
 * compared and those whose bits differ. */
static double trainer_compare(struct model *m, const struct engine_run *run, int64_t *compared,
                              int64_t *differ) {
    int32_t ids[N_REQ * MAX_SAMPLES * 64], targets[N_REQ * MAX_SAMPLES * 64], cu[N_REQ * MAX_SAMPLES + 1];
    int n_seqs = 0;
    int64_t T = 0;
    cu[0] = 0;
    for (int i = 0; i < N_REQ; i++)
        for (int s = 0; s < run->n_samples[i]; s++) {
            const struct rollout_result *r = &run->c->r[i][s];
            cr_assert(run->c->have[i][s], "request %d sample %d never finished", i, s);
            int64_t len = run->lens[i] + r->n;
            memcpy(ids + T, run->prompts[i], (size_t)run->lens[i] * sizeof *ids);
            memcpy(ids + T + run->lens[i], r->ids, (size_t)r->n * sizeof *ids);
            for (int64_t j = 0; j < len; j++) targets[T + j] = j + 1 >= run->lens[i] && j + 1 < len ? ids[T + j + 1] : -1;
            T += len;
            cu[++n_seqs] = (int32_t)T;
        }
    struct model_acts *acts;
    struct smelt_error err = {0};
    TEST_OK(model_acts_alloc(m, T, false, &acts, &err), &err);
    float *lp = malloc((size_t)T * sizeof *lp);
    cr_assert(lp);
    struct tensor tlp = tensor_f32(lp, 1, &T);
    struct model_batch b = {.n_tokens = T, .n_seqs = n_seqs, .ids = ids, .cu_seqlens = cu, .targets = targets};
    TEST_OK(model_forward(m, acts, &b, &tlp, NULL, NULL, &err), &err);
    double worst = 0;
    *compared = *differ = 0;
    int seq = 0;
    for (int i = 0; i < N_REQ; i++)
        for (int s = 0; s < run->n_samples[i]; s++, seq++) {
            const struct rollout_result *r = &run->c->r[i][s];
            const float *trainer = lp + cu[seq] + run->lens[i] - 1;
            for (int64_t j = 0; j < r->n; j++) {
                worst = fmax(worst, fabs((double)r->logprobs[j] - (double)trainer[j]));
                *differ += memcmp(&r->logprobs[j], &trainer[j], sizeof(float)) != 0;
                ++*compared;
            }
        }
    free(lp);
    model_acts_free(acts);
    return worst;
}

/* A parity model, or "tiny" (tests/data/tiny's Llama, random weights: wider layers than
 * the parity models), with a PEFT adapter attached unmerged when lora_dir is given. */
static struct model *load_with(const char *type, const char *lora_dir, struct lora **adapter) {
    struct smelt_error err = {0};
    struct model *m;
    if (strcmp(type, "tiny") == 0) {
        struct model_config cfg;
        TEST_OK(model_config_load("tests/data/tiny/config.json", &cfg, &err), &err);
        TEST_OK(model_init_random(&cfg, 7, BACKEND_CPU, &m, &err), &err);
    } else {
        m = rollout_test_load(type);
    }
    *adapter = NULL;
    if (lora_dir) {
        TEST_OK(lora_load(m, lora_dir, adapter, &err), &err);
        TEST_OK(lora_attach(*adapter, &err), &err);
    }
    return m;
}

static void unload(struct model *m, struct lora *adapter) {
    if (adapter) {
        lora_detach(adapter);
        lora_free(adapter);
    }
    model_free(m);
}

/* Engine on 2 threads, trainer on 1: the bits depend on neither. */
static void check_engine_equals_trainer(const char *type, const char *lora_dir) {
    set_mode(true);
    struct lora *adapter;
    struct model *m = load_with(type, lora_dir, &adapter);
    for (size_t k = 0; k < sizeof SETUPS / sizeof *SETUPS; k++) {
        const struct engine_setup *setup = &SETUPS[k];
        struct engine_run run;
        omp_set_num_threads(2);
        engine_generate(m, setup, &run);
        if (setup->kv_tokens < 1024) cr_expect(run.preemptions > 0, "%s: the small pool preempted nothing", type);
        omp_set_num_threads(1);
        int64_t compared, differ;
        double worst = trainer_compare(m, &run, &compared, &differ);
        cr_expect_eq(compared, run.tokens, "%s: %lld of %lld tokens compared", type, (long long)compared,
                     (long long)run.tokens);
        cr_expect_eq(differ, 0, "%s%s%s (%s): %lld of %lld engine logprobs differ from the trainer's (max |diff| %.3g)",
                     type, lora_dir ? " + " : "", lora_dir ? lora_dir : "", setup->name,
                     (long long)differ, (long long)compared, worst);
        rollout_test_free_collected(run.c);
    }
    unload(m, adapter);
}

Test(batch_invariant, engine_logprobs_equal_the_trainers_llama) { check_engine_equals_trainer("llama", NULL); }
Test(batch_invariant, engine_logprobs_equal_the_trainers_qwen3) { check_engine_equals_trainer("qwen3", NULL); }
Test(batch_invariant, engine_logprobs_equal_the_trainers_gpt2) { check_engine_equals_trainer("gpt2", NULL); }
Test(batch_invariant, engine_logprobs_equal_the_trainers_tiny) { check_engine_equals_trainer("tiny", NULL); }
Test(batch_invariant, engine_logprobs_equal_the_trainers_llama_lora) {
    check_engine_equals_trainer("llama", "tests/data/parity/llama-lora");
}
Test(batch_invariant, engine_logprobs_equal_the_trainers_gpt2_lora) {
    check_engine_equals_trainer("gpt2", "tests/data/parity/gpt2-lora");
}

/* The default mode: the same comparison, close but not bitwise; the gap is printed. */
Test(batch_invariant, without_the_mode_engine_logprobs_are_close) {
    set_mode(false);
    const char *types[] = {"llama", "gpt2"};
    for (int t = 0; t < 2; t++) {
        struct lora *adapter;
        struct model *m = load_with(types[t], NULL, &adapter);
        struct engine_run run;
        engine_generate(m, &SETUPS[0], &run);
        int64_t compared, differ;
        double worst = trainer_compare(m, &run, &compared, &differ);
        cr_log_info("batch_invariant: mode off, %s: %lld of %lld engine logprobs differ from the trainer's, "
                    "max |diff| %.3g", types[t], (long long)differ, (long long)compared, worst);
        cr_expect(worst < 1e-4, "%s: engine and trainer logprobs differ by %.3g", types[t], worst);
        rollout_test_free_collected(run.c);
        unload(m, adapter);
    }
}
