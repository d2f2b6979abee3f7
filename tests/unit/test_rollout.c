/* rollout/: the paged engine against the plain-recompute reference generator, for every
 * model type, with and without preemption and chunked prefill; prefix sharing; seeded
 * sampling independent of the batch; block accounting under random load; bad requests;
 * weight updates re-running unfinished samples; a step of more than 1024 sequences. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "rollout/rollout.h"
#include "tests/unit/rollout_testutil.h"

static struct rollout_request greedy_request(uint64_t id, const int32_t *prompt, int64_t n, int64_t max_new) {
    return (struct rollout_request){.id = id, .prompt = prompt, .n_prompt = n, .n = 1,
                                    .sampling = {.temperature = 0, .top_p = 1}, .max_new_tokens = max_new};
}

static void prompt_of(int32_t *ids, int64_t n, int seed, int64_t V) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7 + seed * 13 + 3) % V);
}

/* Greedy output of the engine equals the reference generator for every prompt. */
static void check_greedy(const char *type, int64_t kv_tokens, int64_t batch_tokens, int64_t chunk, bool expect_preempt) {
    struct model *m = rollout_test_load(type);
    int64_t V = m->config.vocab_size, ctx = m->config.max_seq_len;
    struct rollout_engine *e = rollout_test_engine(m, NULL, kv_tokens, batch_tokens, 16, chunk);
    enum { N = 6 };
    int32_t prompts[N][64];
    int64_t lens[N] = {1, 5, 17, 33, 9, 40}, max_new = 20;
    struct smelt_error err = {0};
    for (int i = 0; i < N; i++) {
        prompt_of(prompts[i], lens[i], i, V);
        int64_t mn = lens[i] + max_new <= ctx ? max_new : ctx - lens[i];
        struct rollout_request r = greedy_request((uint64_t)i, prompts[i], lens[i], mn);
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
    struct rollout_test_collected *c = rollout_test_run_all(e);
    struct rollout_stats st = rollout_engine_stats(e);
    cr_expect_eq(st.free_blocks, st.n_blocks, "%s: blocks leaked", type);
    if (expect_preempt) cr_expect(st.preemptions > 0, "%s: the small pool caused no preemption", type);
    for (int i = 0; i < N; i++) {
        cr_assert(c->have[i][0], "%s: request %d never finished", type, i);
        int64_t mn = lens[i] + max_new <= ctx ? max_new : ctx - lens[i];
        struct generate_params gp = {.max_new_tokens = mn, .temperature = 0, .top_p = 1};
        struct generate_result ref;
        TEST_OK(model_generate_reference(m, prompts[i], lens[i], &gp, &ref, &err), &err);
        struct rollout_result *r = &c->r[i][0];
        cr_expect_eq(r->n, ref.n, "%s prompt %d: %lld tokens vs reference %lld", type, i, (long long)r->n, (long long)ref.n);
        for (int64_t t = 0; t < ref.n && t < r->n; t++) {
            cr_expect_eq(r->ids[t], ref.ids[t], "%s prompt %d token %lld: %d vs reference %d", type, i, (long long)t,
                         r->ids[t], ref.ids[t]);
            cr_expect_float_eq(r->logprobs[t], ref.logprobs[t], 1e-4, "%s prompt %d token %lld logprob", type, i, (long long)t);
        }
        cr_expect_str_eq(r->finish_reason, "length");
        generate_result_free(&ref);
    }
    rollout_test_free_collected(c);
    rollout_engine_free(e);
    model_free(m);
}

Test(rollout, greedy_matches_reference_for_every_model_type) {
    const char *types[] = {"llama", "mistral", "qwen2", "qwen3", "gpt2"};
    for (size_t i = 0; i < 5; i++) check_greedy(types[i], 1024, 256, 256, false);
}

Test(rollout, greedy_matches_reference_with_preemption_and_chunked_prefill) {
    const char *types[] = {"llama", "qwen3", "gpt2"};
    /* 8 blocks of 16: not enough for six sequences at once. */
    for (size_t i = 0; i < 3; i++) check_greedy(types[i], 8 * 16, 64, 7, true);
}

Test(rollout, samples_of_a_prompt_share_its_blocks) {
    struct model *m = rollout_test_load("llama");
    struct rollout_engine *e = rollout_test_engine(m, NULL, 2048, 512, 16, 512);
    int32_t prompt[50];
    prompt_of(prompt, 50, 1, m->config.vocab_size);
    struct rollout_request r = {.id = 0, .prompt = prompt, .n_prompt = 50, .n = 8,
                                .sampling = {.temperature = 1, .top_p = 1}, .seed = 3, .max_new_tokens = 4};
    struct smelt_error err = {0};
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    TEST_OK(rollout_engine_step(e, &err), &err); /* prefill once, fork, first tokens */
    TEST_OK(rollout_engine_step(e, &err), &err); /* first decode: copy-on-write of the partial block */
    struct rollout_stats st = rollout_engine_stats(e);
    int64_t used = st.n_blocks - st.free_blocks, prompt_blocks = (50 + 15) / 16;
    /* 3 full prompt blocks shared by all, one partial block privately per sample. */
    cr_expect_eq(used, (prompt_blocks - 1) + 8, "8 samples use %lld blocks; one prompt is %lld", (long long)used,
                 (long long)prompt_blocks);
    cr_expect(used < 2 * prompt_blocks + 8);
    struct rollout_test_collected *c = rollout_test_run_all(e);
    for (int s = 0; s < 8; s++) cr_expect(c->have[0][s], "sample %d missing", s);
    st = rollout_engine_stats(e);
    cr_expect_eq(st.free_blocks, st.n_blocks);
    rollout_test_free_collected(c);
    rollout_engine_free(e);
    model_free(m);
}

Test(rollout, same_seed_same_output_alone_or_batched) {
    struct model *m = rollout_test_load("qwen2");
    int64_t V = m->config.vocab_size;
    int32_t prompt[12], other[30];
    prompt_of(prompt, 12, 2, V);
    prompt_of(other, 30, 5, V);
    struct rollout_request r = {.id = 0, .prompt = prompt, .n_prompt = 12, .n = 3,
                                .sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f}, .seed = 77,
                                .max_new_tokens = 12};
    struct smelt_error err = {0};
    struct rollout_engine *e = rollout_test_engine(m, NULL, 2048, 256, 16, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *alone = rollout_test_run_all(e);
    rollout_engine_free(e);
    e = rollout_test_engine(m, NULL, 2048, 256, 16, 5);
    for (int i = 1; i < 5; i++) {
        struct rollout_request o = {.id = (uint64_t)i, .prompt = other, .n_prompt = 10 + i, .n = 2,
                                    .sampling = {.temperature = 1, .top_p = 1}, .seed = (uint64_t)i, .max_new_tokens = 9};
        TEST_OK(rollout_engine_add(e, &o, &err), &err);
        if (i == 2) TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
    struct rollout_test_collected *batched = rollout_test_run_all(e);
    for (int s = 0; s < 3; s++) {
        struct rollout_result *a = &alone->r[0][s], *b = &batched->r[0][s];
        cr_assert(alone->have[0][s] && batched->have[0][s]);
        cr_expect_eq(a->n, b->n, "sample %d: %lld vs %lld tokens", s, (long long)a->n, (long long)b->n);
        cr_expect_eq(memcmp(a->ids, b->ids, (size_t)(a->n < b->n ? a->n : b->n) * sizeof(int32_t)), 0,
                     "sample %d differs when batched", s);
    }
    /* Samples of one request differ from each other (their streams differ). */
    cr_expect(memcmp(alone->r[0][0].ids, alone->r[0][1].ids, 12 * sizeof(int32_t)) != 0);
    /* Sample 0 is what the reference generator samples with the same seed. */
    struct generate_params gp = {.max_new_tokens = 12, .temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 77};
    struct generate_result ref;
    TEST_OK(model_generate_reference(m, prompt, 12, &gp, &ref, &err), &err);
    cr_expect_eq(memcmp(ref.ids, alone->r[0][0].ids, 12 * sizeof(int32_t)), 0, "sample 0 differs from smelt-generate");
    generate_result_free(&ref);
    rollout_test_free_collected(alone);
    rollout_test_free_collected(batched);
    rollout_engine_free(e);
    model_free(m);
}

Test(rollout, every_block_returns_under_random_load_and_aborts) {
    struct model *m = rollout_test_load("llama");
    int64_t V = m->config.vocab_size;
    struct rollout_engine *e = rollout_test_engine(m, NULL, 20 * 16, 96, 12, 24);
    struct test_rng rng = {2024};
    struct smelt_error err = {0};
    int32_t prompt[48];
    uint64_t next_id = 0, finished = 0, submitted = 0;
    for (int round = 0; round < 300; round++) {
        if (test_rng_uniform(&rng, 0, 1) < 0.6) {
            int64_t len = 1 + (int64_t)test_rng_uniform(&rng, 0, 40);
            prompt_of(prompt, len, round, V);
            struct rollout_request r = {.id = next_id++, .prompt = prompt, .n_prompt = len,
                                        .n = 1 + (int)test_rng_uniform(&rng, 0, 6),
                                        .sampling = {.temperature = 1, .top_p = 1}, .seed = (uint64_t)round,
                                        .max_new_tokens = 1 + (int64_t)test_rng_uniform(&rng, 0, 20)};
            if (len + r.max_new_tokens > m->config.max_seq_len) r.max_new_tokens = m->config.max_seq_len - len;
            TEST_OK(rollout_engine_add(e, &r, &err), &err);
            submitted += (uint64_t)r.n;
        }
        if (next_id && test_rng_uniform(&rng, 0, 1) < 0.1) finished += (uint64_t)rollout_engine_abort(e, (uint64_t)test_rng_uniform(&rng, 0, (double)next_id));
        if (!rollout_engine_idle(e)) TEST_OK(rollout_engine_step(e, &err), &err);
        struct rollout_result *res;
        int n;
        TEST_OK(rollout_engine_take(e, &res, &n, &err), &err);
        for (int i = 0; i < n; i++) finished += strcmp(res[i].finish_reason, "abort") != 0;
        rollout_results_free(res, n);
        struct rollout_stats st = rollout_engine_stats(e);
        cr_assert(st.free_blocks >= 0 && st.free_blocks <= st.n_blocks);
    }
    while (!rollout_engine_idle(e)) {
        TEST_OK(rollout_engine_step(e, &err), &err);
        struct rollout_result *res;
        int n;
        TEST_OK(rollout_engine_take(e, &res, &n, &err), &err);
        for (int i = 0; i < n; i++) finished += strcmp(res[i].finish_reason, "abort") != 0;
        rollout_results_free(res, n);
    }
    struct rollout_stats st = rollout_engine_stats(e);
    cr_expect_eq(st.free_blocks, st.n_blocks, "%lld of %lld blocks came back", (long long)st.free_blocks,
                 (long long)st.n_blocks);
    cr_expect_eq(finished, submitted, "%llu samples submitted, %llu accounted for", (unsigned long long)submitted,
                 (unsigned long long)finished);
    cr_expect(st.preemptions > 0, "the load never preempted");
    rollout_engine_free(e);
    model_free(m);
}

Test(rollout, bad_requests_name_the_field) {
    struct model *m = rollout_test_load("llama");
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 128, 8, 128);
    int32_t p[80] = {0};
    struct smelt_error err = {0};
    struct rollout_request ok = greedy_request(1, p, 4, 4);
    struct {
        struct rollout_request r;
        const char *field;
    } cases[6];
    for (int i = 0; i < 6; i++) cases[i].r = ok;
    cases[0].r.n_prompt = 0, cases[0].field = "prompt";
    cases[1].r.n_prompt = 64, cases[1].field = "prompt"; /* the whole context */
    cases[2].r.n = 0, cases[2].field = "n";
    cases[3].r.sampling.top_p = 1.5f, cases[3].field = "top_p";
    cases[4].r.max_new_tokens = 0, cases[4].field = "max_new_tokens";
    cases[5].r.n_stop_strings = 1, cases[5].r.stop_strings[0] = "x", cases[5].field = "stop_strings";
    for (int i = 0; i < 6; i++) {
        TEST_EXPECT_ERROR(rollout_engine_add(e, &cases[i].r, &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, cases[i].field), "case %d: \"%s\" does not name %s", i, err.message, cases[i].field);
    }
    cr_expect(rollout_engine_idle(e), "a refused request was queued");
    TEST_OK(rollout_engine_add(e, &ok, &err), &err);
    rollout_engine_free(e); /* freeing with work pending releases it */
    model_free(m);
}

Test(rollout, new_weights_rerun_unfinished_samples) {
    struct model *m = rollout_test_load("llama"), *m2 = rollout_test_load("llama");
    /* Other weights: scale every weight a little. */
    float *w2 = m2->weights.data;
    for (int64_t i = 0; i < m2->n_weights; i++) w2[i] *= 1.5f;
    int32_t prompt[10];
    prompt_of(prompt, 10, 4, m->config.vocab_size);
    struct rollout_request r = {.id = 0, .prompt = prompt, .n_prompt = 10, .n = 2,
                                .sampling = {.temperature = 1, .top_p = 1}, .seed = 9, .max_new_tokens = 16};
    struct smelt_error err = {0};
    /* References: the whole request on the old weights, and on the new ones, each on a
     * fresh engine. */
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 128, 8, 128);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *old = rollout_test_run_all(e);
    rollout_engine_free(e);
    e = rollout_test_engine(m2, NULL, 1024, 128, 8, 128);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *want = rollout_test_run_all(e);
    rollout_engine_free(e);
    /* Start on the old weights, switch after a few steps. */
    e = rollout_test_engine(m, NULL, 1024, 128, 8, 128);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    for (int i = 0; i < 4; i++) TEST_OK(rollout_engine_step(e, &err), &err);
    TEST_OK(rollout_engine_set_weights(e, w2, m2->n_weights, &err), &err);
    TEST_EXPECT_ERROR(rollout_engine_set_weights(e, w2, 3, &err), SMELT_EINVAL, &err);
    struct rollout_test_collected *got = rollout_test_run_all(e);
    for (int s = 0; s < 2; s++) {
        cr_assert(got->have[0][s] && want->have[0][s] && old->have[0][s]);
        const struct rollout_result *g = &got->r[0][s], *w = &want->r[0][s], *o = &old->r[0][s];
        cr_expect_eq(g->policy_version, 1);
        cr_expect_eq(o->policy_version, 0);
        /* Otherwise this test could not tell a re-run from a sample left on the old weights. */
        cr_expect(o->n != w->n || memcmp(o->ids, w->ids, (size_t)w->n * sizeof(int32_t)) != 0,
                  "sample %d: the old and new weights give the same tokens", s);
        cr_expect_eq(g->n, w->n, "sample %d: %lld tokens, the new weights' %lld", s, (long long)g->n, (long long)w->n);
        cr_expect_eq(memcmp(g->ids, w->ids, (size_t)(g->n < w->n ? g->n : w->n) * sizeof(int32_t)), 0,
                     "sample %d mixes policy versions", s);
        for (int64_t t = 0; t < g->n && t < w->n; t++)
            cr_expect_float_eq(g->logprobs[t], w->logprobs[t], 1e-5, "sample %d token %lld logprob", s, (long long)t);
    }
    struct rollout_stats st = rollout_engine_stats(e);
    cr_expect_eq(st.free_blocks, st.n_blocks);
    rollout_test_free_collected(old);
    rollout_test_free_collected(want);
    rollout_test_free_collected(got);
    rollout_engine_free(e);
    model_free(m);
    model_free(m2);
}

/* 5 requests of 256 samples: their second step runs 1280 decodes, 1275 of them after a
 * copy-on-write. A plan once held only 1024 copies and silently left the rest out. */
Test(rollout, one_step_runs_more_than_1024_sequences) {
    struct model *m = rollout_test_load("llama");
    enum { R = 5, N = 256 };
    struct rollout_engine *e = rollout_test_engine(m, NULL, (R * N + 2 * R) * ROLLOUT_KV_BLOCK_TOKENS, 2048, 2048, 512);
    int32_t prompts[R][5];
    struct smelt_error err = {0};
    for (int i = 0; i < R; i++) {
        prompt_of(prompts[i], 5, i, m->config.vocab_size);
        struct rollout_request r = greedy_request((uint64_t)i, prompts[i], 5, 3);
        r.n = N;
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
    TEST_OK(rollout_engine_step(e, &err), &err); /* prefill, fork, first tokens */
    struct rollout_stats before = rollout_engine_stats(e);
    cr_assert_eq(before.running, R * N);
    TEST_OK(rollout_engine_step(e, &err), &err);
    struct rollout_stats after = rollout_engine_stats(e);
    cr_expect_eq(after.decode_tokens - before.decode_tokens, R * N, "%lld of %d sequences decoded",
                 (long long)(after.decode_tokens - before.decode_tokens), R * N);
    cr_expect_eq(after.preemptions, 0);
    while (!rollout_engine_idle(e)) TEST_OK(rollout_engine_step(e, &err), &err);
    struct rollout_result *res;
    int n;
    TEST_OK(rollout_engine_take(e, &res, &n, &err), &err);
    cr_expect_eq(n, R * N);
    for (int i = 0; i < R; i++) {
        struct generate_params gp = {.max_new_tokens = 3, .temperature = 0, .top_p = 1};
        struct generate_result ref;
        TEST_OK(model_generate_reference(m, prompts[i], 5, &gp, &ref, &err), &err);
        for (int k = 0; k < n; k++)
            if (res[k].request_id == (uint64_t)i)
                cr_expect(res[k].n == ref.n && memcmp(res[k].ids, ref.ids, (size_t)ref.n * sizeof(int32_t)) == 0,
                          "request %d sample %d differs from the reference", i, res[k].sample_index);
        generate_result_free(&ref);
    }
    rollout_results_free(res, n);
    struct rollout_stats st = rollout_engine_stats(e);
    cr_expect_eq(st.free_blocks, st.n_blocks);
    rollout_engine_free(e);
    model_free(m);
}
