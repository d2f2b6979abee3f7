/* Requests of several LoRA adapters in one engine (rollout_request.adapter): a batch of
 * requests on three adapters and the base gives every request exactly (tokens and
 * logprob bits) what it gets alone in an engine with its adapter attached, on the CPU in
 * batch-invariant mode; on Llama and on GPT-2 (tied embeddings, an lm_head adapter). */
#include "tests/unit/lora_testutil.h"
#include "tests/unit/rollout_testutil.h"

#define N_REQ 7
#define N_SAMPLES 2
#define MAX_NEW 6

static const char *const blocks[] = {"all-linear"};
static const char *const blocks_and_head[] = {"all-linear", "lm_head"};
static const char *const attn_llama[] = {"q", "v"};
static const char *const attn_gpt2[] = {"c_attn"};

/* Three adapters with different targets and random (non-zero) B; none attached. */
static void make_adapters(struct model *m, struct lora *out[3]) {
    struct smelt_error err = {0};
    bool gpt2 = strcmp(m->config.architecture, "GPT2LMHeadModel") == 0;
    struct lora_config cs[3] = {lora_test_config(blocks, 1, 0.0f), lora_test_config(blocks_and_head, 2, 0.0f),
                                gpt2 ? lora_test_config(attn_gpt2, 1, 0.0f) : lora_test_config(attn_llama, 2, 0.0f)};
    for (int i = 0; i < 3; i++) {
        TEST_OK(lora_create(m, &cs[i], 40 + (uint64_t)i, &out[i], &err), &err);
        lora_fill_random(out[i], 50 + (uint64_t)i, 0.3);
    }
}

/* Request i: adapter pattern a0, base, a1, a2, base, a0, a1 with prompts of different
 * lengths; requests 0 and 1 share prompt and seed, so the adapter must show. */
static struct rollout_request request_of(int i, struct lora *ad[3], int32_t prompts[N_REQ][16], int64_t V) {
    static const int which[N_REQ] = {0, -1, 1, 2, -1, 0, 1};
    int64_t n = i == 1 ? 3 : 3 + (i * 5) % 11;
    rollout_test_prompt(prompts[i], n, i == 1 ? 0 : i, V);
    struct rollout_request r = {.id = (uint64_t)i, .prompt = prompts[i], .n_prompt = n, .n = N_SAMPLES,
                                .sampling = {.temperature = 1.0f, .top_p = 1.0f}, .seed = i == 1 ? 0 : 100 + (uint64_t)i,
                                .max_new_tokens = MAX_NEW, .adapter = which[i] >= 0 ? ad[which[i]] : NULL};
    return r;
}

static void expect_same(const struct rollout_result *a, const struct rollout_result *b, const char *label, int i, int s) {
    cr_assert_eq(a->n, b->n, "%s: request %d sample %d: %lld tokens batched, %lld alone", label, i, s, (long long)a->n,
                 (long long)b->n);
    cr_expect(memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) == 0, "%s: request %d sample %d: tokens differ",
              label, i, s);
    cr_expect(memcmp(a->logprobs, b->logprobs, (size_t)a->n * sizeof *a->logprobs) == 0,
              "%s: request %d sample %d: logprobs differ (first %.9g vs %.9g)", label, i, s, (double)a->logprobs[0],
              (double)b->logprobs[0]);
}

/* Request i alone: a fresh engine, its adapter attached, the request naming none. */
static struct rollout_test_collected *alone(struct model *m, struct rollout_request r) {
    struct smelt_error err = {0};
    struct lora *ad = r.adapter;
    if (ad) TEST_OK(lora_attach(ad, &err), &err);
    r.adapter = NULL;
    struct rollout_engine *e = rollout_test_engine(m, NULL, 2048, 256, 16, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    struct rollout_test_collected *c = rollout_test_run_all(e);
    rollout_engine_free(e);
    if (ad) lora_detach(ad);
    return c;
}

static void check_batched(const char *type, int64_t batch_tokens, int64_t chunk) {
    struct smelt_error err = {0};
    TEST_OK(ops_set_batch_invariant(BACKEND_CPU, true, &err), &err);
    struct model *m = lora_test_model(type, 7);
    struct lora *ad[3];
    make_adapters(m, ad);
    int32_t prompts[N_REQ][16];
    struct rollout_request reqs[N_REQ];
    /* A small step budget and chunk: prefill chunks and decodes of every adapter mix. */
    struct rollout_engine *e = rollout_test_engine(m, NULL, 2048, batch_tokens, 16, chunk);
    for (int i = 0; i < N_REQ; i++) {
        reqs[i] = request_of(i, ad, prompts, m->config.vocab_size);
        TEST_OK(rollout_engine_add(e, &reqs[i], &err), &err);
    }
    struct rollout_test_collected *batched = rollout_test_run_all(e);
    cr_expect(m->adapter == NULL, "%s: the step left an adapter on the model", type);
    char label[96];
    snprintf(label, sizeof label, "%s, %lld tokens a step, chunks of %lld", type, (long long)batch_tokens, (long long)chunk);
    for (int i = 0; i < N_REQ; i++) {
        struct rollout_test_collected *one = alone(m, reqs[i]);
        for (int s = 0; s < N_SAMPLES; s++) {
            cr_assert(batched->have[i][s] && one->have[i][s], "%s: request %d sample %d missing", label, i, s);
            expect_same(&batched->r[i][s], &one->r[i][s], label, i, s);
        }
        rollout_test_free_collected(one);
    }
    /* Requests 0 (adapter) and 1 (base): same prompt, same seed, different logprobs. */
    cr_expect(memcmp(batched->r[0][0].logprobs, batched->r[1][0].logprobs, sizeof(float)) != 0,
              "%s: the adapter changed nothing", label);
    rollout_test_free_collected(batched);
    rollout_engine_free(e);
    for (int i = 0; i < 3; i++) lora_free(ad[i]);
    model_free(m);
}

Test(rollout_adapters, llama_batch_of_adapters_equals_each_alone) {
    check_batched("llama", 256, 256);
    check_batched("llama", 24, 5);
}

Test(rollout_adapters, gpt2_tied_with_lm_head_adapter_equals_each_alone) {
    check_batched("gpt2", 256, 256);
    check_batched("gpt2", 24, 5);
}

Test(rollout_adapters, refuses_an_adapter_of_another_model_or_the_attached_one) {
    struct smelt_error err = {0};
    struct model *m = lora_test_model("llama", 7), *other = lora_test_model("llama", 8);
    struct lora *mine, *theirs;
    struct lora_config c = lora_test_config(blocks, 1, 0.0f);
    TEST_OK(lora_create(m, &c, 1, &mine, &err), &err);
    TEST_OK(lora_create(other, &c, 1, &theirs, &err), &err);
    struct rollout_engine *e = rollout_test_engine(m, NULL, 256, 64, 4, 64);
    int32_t prompt[4] = {1, 2, 3, 4};
    struct rollout_request r = {.prompt = prompt, .n_prompt = 4, .n = 1, .sampling = {.top_p = 1.0f},
                                .max_new_tokens = 2, .adapter = theirs};
    TEST_EXPECT_ERROR(rollout_engine_add(e, &r, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "adapter");
    TEST_OK(lora_attach(mine, &err), &err);
    r.adapter = mine;
    TEST_EXPECT_ERROR(rollout_engine_add(e, &r, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "adapter");
    rollout_engine_free(e);
    lora_free(mine), lora_free(theirs);
    model_free(m), model_free(other);
}
