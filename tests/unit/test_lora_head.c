/* LoRA on the output projection (PEFT's target "lm_head", the Tinker API's
 * train_unembed): finite differences with the head and the blocks' adapters (untied
 * Llama, tied GPT-2, recompute, dropout over logits chunks), the forward's formula, no
 * head adapter leaving the logits exactly the base matmul's, targets on every
 * architecture, a tied head's merge refused, and the paged engine's greedy output
 * against the reference generator with a head adapter attached. Save/load and an
 * untied merge are test_lora.c's (check_save_load, check_merge with lm_head). */
#include "tests/unit/lora_testutil.h"
#include "tests/unit/rollout_testutil.h"

#include "lora/lora_internal.h"
#include "model/generate.h"
#include "model/model_internal.h"

static const char *const head_and_blocks[] = {"all-linear", "lm_head"};

/* ---- gradients ---- */

/* chunk_rows 0: the activations' own (every row in one chunk on these models). */
static void check_fd(const char *type, bool recompute, float dropout, int64_t chunk_rows) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 7);
    struct lora *l = lora_test_adapter(m, head_and_blocks, 2, dropout, 21, 0.3);
    cr_assert(l->state->head_module >= 0, "%s: lm_head not wrapped", type);
    if (dropout > 0) {
        lora_set_training(l, true);
        lora_set_dropout_seed(l, 99);
    }
    struct parity_packed p;
    parity_load_inputs(type, &p);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, recompute, &acts, &err), &err);
    if (chunk_rows) acts->chunk_rows = chunk_rows;
    char label[128];
    snprintf(label, sizeof label, "%s + lm_head%s, dropout %g, chunks of %lld", type, recompute ? " (recompute)" : "",
             (double)dropout, (long long)acts->chunk_rows);
    lora_expect_fd(m, l, acts, &p, label);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora_head, fd_llama) { check_fd("llama", false, 0.0f, 0); }
Test(lora_head, fd_gpt2_tied) { check_fd("gpt2", false, 0.0f, 0); }
Test(lora_head, fd_gpt2_tied_recompute) { check_fd("gpt2", true, 0.0f, 0); }
Test(lora_head, fd_llama_dropout_chunked) { check_fd("llama", false, 0.3f, 5); }

/* Dropout masks follow the batch row, not the row within a logits chunk: the loss is
 * the same whatever the chunking. */
Test(lora_head, dropout_masks_do_not_depend_on_chunks) {
    struct smelt_error err;
    struct model *m = lora_test_model("llama", 3);
    static const char *const head[] = {"lm_head"};
    struct lora *l = lora_test_adapter(m, head, 1, 0.5f, 4, 0.5);
    lora_set_training(l, true);
    lora_set_dropout_seed(l, 7);
    struct parity_packed p;
    parity_load_inputs("llama", &p);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    cr_assert(acts->chunk_rows >= p.T, "the fixture's logits fit one chunk");
    double whole = lora_loss(m, acts, &p);
    acts->chunk_rows = 3;
    double chunked = lora_loss(m, acts, &p);
    cr_expect(fabs(whole - chunked) <= 1e-5 * fabs(whole), "loss %.9g in one chunk, %.9g in chunks of 3", whole,
              chunked);
    lora_set_dropout_seed(l, 8);
    double other_seed = lora_loss(m, acts, &p);
    cr_expect(fabs(whole - other_seed) > 1e-4, "another dropout seed gives the same loss (%.9g)", whole);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

/* ---- forward ---- */

/* Logits and final hidden states of the fixture's batch. */
static void forward_outputs(struct model *m, struct model_acts *acts, const struct parity_packed *p, float *logits,
                            float *hidden) {
    int64_t ls[2] = {p->T, m->config.vocab_size}, hs[2] = {p->T, m->config.hidden_size};
    struct tensor tl = tensor_f32(logits, 2, ls), th = tensor_f32(hidden, 2, hs);
    struct model_batch b = parity_batch_of(p);
    struct smelt_error err;
    TEST_OK(model_forward(m, acts, &b, NULL, &tl, &th, &err), &err);
}

/* With a head adapter: logits = h W^T + s (h A^T) B^T; without one (an adapter on the
 * blocks only) exactly h W^T, the base matmul's bits. */
static void check_forward(const char *type) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 5);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t T = p.T, V = m->config.vocab_size, C = m->config.hidden_size, r = 4;
    float *logits = test_zeros_f32(T * V), *hidden = test_zeros_f32(T * C), *base = test_zeros_f32(T * V);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, T, false, &acts, &err), &err);
    int64_t ls[2] = {T, V}, hs[2] = {T, C};
    struct tensor tb = tensor_f32(base, 2, ls), th = tensor_f32(hidden, 2, hs);

    static const char *const blocks[] = {"all-linear"};
    struct lora *l = lora_test_adapter(m, blocks, 1, 0.0f, 6, 0.3);
    cr_expect(l->adapter.head_forward == NULL && l->adapter.head_backward == NULL, "%s: head hooks without lm_head", type);
    forward_outputs(m, acts, &p, logits, hidden);
    TEST_OK(ops_matmul(&tb, &th, &m->w.lm_head, NULL, false, true, 1.0f, 0.0f, &err), &err);
    cr_expect(memcmp(logits, base, (size_t)(T * V) * sizeof *base) == 0, "%s: logits without a head adapter are not "
              "the base matmul's", type);
    lora_free(l);

    l = lora_test_adapter(m, head_and_blocks, 2, 0.0f, 6, 0.3);
    forward_outputs(m, acts, &p, logits, hidden);
    const struct lora_module *mod = &l->state->modules[l->state->head_module];
    const float *a = (const float *)l->weights.data + l->params[mod->param_a].offset;
    const float *bm = (const float *)l->weights.data + l->params[mod->param_a + 1].offset;
    const float *w = m->w.lm_head.data;
    double *want = calloc((size_t)(T * V), sizeof *want), maxdelta = 0;
    for (int64_t t = 0; t < T; t++) {
        double u[4] = {0};
        for (int64_t k = 0; k < r; k++)
            for (int64_t c = 0; c < C; c++) u[k] += (double)hidden[t * C + c] * a[k * C + c];
        for (int64_t v = 0; v < V; v++) {
            double base_v = 0, delta = 0;
            for (int64_t c = 0; c < C; c++) base_v += (double)hidden[t * C + c] * w[v * C + c];
            for (int64_t k = 0; k < r; k++) delta += u[k] * bm[v * r + k];
            want[t * V + v] = base_v + l->scaling * delta;
            maxdelta = fmax(maxdelta, fabs(l->scaling * delta));
        }
    }
    test_expect_close("logits with an lm_head adapter", logits, want, T * V, 1e-4, 1e-4);
    cr_expect(maxdelta > 1e-2, "%s: the head adapter hardly changes the logits (%g)", type, maxdelta);
    free(want), free(logits), free(hidden), free(base);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora_head, forward_llama) { check_forward("llama"); }
Test(lora_head, forward_gpt2_tied) { check_forward("gpt2"); }

/* ---- targets ---- */

Test(lora_head, every_architecture) {
    static const char *const types[] = {"llama", "mistral", "qwen2", "qwen3", "gpt2"};
    static const char *const head[] = {"lm_head"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        struct smelt_error err;
        struct model *m = lora_test_model(types[i], 1);
        struct lora_config c = lora_test_config(head, 1, 0.0f);
        struct lora *l;
        TEST_OK(lora_create(m, &c, 1, &l, &err), &err);
        cr_assert_eq(l->n_params, 2, "%s", types[i]);
        cr_expect_str_eq(l->params[0].name, "base_model.model.lm_head.lora_A.weight");
        cr_expect_str_eq(l->params[1].name, "base_model.model.lm_head.lora_B.weight");
        cr_expect(l->params[0].shape[0] == 4 && l->params[0].shape[1] == m->config.hidden_size, "%s: A", types[i]);
        cr_expect(l->params[1].shape[0] == m->config.vocab_size && l->params[1].shape[1] == 4, "%s: B", types[i]);
        cr_expect(l->config.n_targets == 1 && strcmp(l->config.targets[0], "lm_head") == 0, "%s", types[i]);
        lora_free(l);
        /* all-linear leaves the output layer out, as PEFT does. */
        static const char *const all[] = {"all-linear"};
        c = lora_test_config(all, 1, 0.0f);
        TEST_OK(lora_create(m, &c, 1, &l, &err), &err);
        cr_expect(l->state->head_module < 0, "%s: all-linear wrapped lm_head", types[i]);
        for (int k = 0; k < l->n_params; k++) cr_expect(strstr(l->params[k].name, "lm_head") == NULL, "%s", l->params[k].name);
        lora_free(l);
        model_free(m);
    }
}

Test(lora_head, job_spec_accepts_lm_head) {
    json_t *root = json_pack("{s:i, s:[s, s]}", "rank", 2, "target_modules", "q_proj", "lm_head");
    struct lora_config c;
    struct smelt_error err;
    TEST_OK(lora_config_from_json(root, "job.lora", &c, &err), &err);
    cr_expect(c.n_targets == 2 && strcmp(c.targets[1], "lm_head") == 0);
    json_decref(root);
}

/* ---- merge (an untied lm_head's: test_lora.c) ---- */

Test(lora_head, merge_tied_is_refused_untouched) {
    struct smelt_error err;
    struct model *m = lora_test_model("gpt2", 8);
    cr_assert(m->config.tie_word_embeddings);
    struct lora *l = lora_test_adapter(m, head_and_blocks, 2, 0.0f, 9, 0.3);
    lora_detach(l);
    size_t bytes = (size_t)m->n_weights * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, m->weights.data, bytes);
    TEST_EXPECT_ERROR(lora_merge(l, &err), SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "lm_head") && strstr(err.message, "tie_word_embeddings"), "%s", err.message);
    cr_expect(memcmp(before, m->weights.data, bytes) == 0, "a refused merge changed the weights");
    free(before);
    lora_free(l);
    model_free(m);
}

/* ---- generation ---- */

/* The engine (paged step) and the reference generator (model_forward + its own head)
 * give the same greedy tokens with the adapter attached, and the adapter changes them. */
static void check_greedy(const char *type) {
    struct smelt_error err = {0};
    struct model *m = rollout_test_load(type);
    int64_t V = m->config.vocab_size;
    static const char *const head[] = {"lm_head"};
    struct lora *l = lora_test_adapter(m, head, 1, 0.0f, 31, 1.0);
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 8, 256);
    enum { N = 4, MAX_NEW = 12 };
    int32_t prompts[N][32];
    int64_t lens[N] = {1, 6, 13, 25};
    for (int i = 0; i < N; i++) {
        rollout_test_prompt(prompts[i], lens[i], i, V);
        struct rollout_request r = {.id = (uint64_t)i, .prompt = prompts[i], .n_prompt = lens[i], .n = 1,
                                    .sampling = {.temperature = 0, .top_p = 1}, .max_new_tokens = MAX_NEW};
        TEST_OK(rollout_engine_add(e, &r, &err), &err);
    }
    struct rollout_test_collected *c = rollout_test_run_all(e);
    struct generate_params gp = {.max_new_tokens = MAX_NEW, .temperature = 0, .top_p = 1};
    int differs = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(c->have[i][0], "%s: request %d never finished", type, i);
        struct generate_result ref, plain;
        TEST_OK(model_generate_reference(m, prompts[i], lens[i], &gp, &ref, &err), &err);
        const struct rollout_result *r = &c->r[i][0];
        cr_expect_eq(r->n, ref.n, "%s prompt %d", type, i);
        for (int64_t t = 0; t < ref.n && t < r->n; t++) {
            cr_expect_eq(r->ids[t], ref.ids[t], "%s prompt %d token %lld", type, i, (long long)t);
            cr_expect_float_eq(r->logprobs[t], ref.logprobs[t], 1e-4, "%s prompt %d token %lld logprob", type, i,
                               (long long)t);
        }
        lora_detach(l);
        TEST_OK(model_generate_reference(m, prompts[i], lens[i], &gp, &plain, &err), &err);
        TEST_OK(lora_attach(l, &err), &err);
        for (int64_t t = 0; t < ref.n && t < plain.n; t++) differs += ref.ids[t] != plain.ids[t];
        generate_result_free(&ref);
        generate_result_free(&plain);
    }
    cr_expect(differs > 0, "%s: the lm_head adapter changes no greedy token", type);
    rollout_test_free_collected(c);
    rollout_engine_free(e);
    lora_free(l);
    model_free(m);
}

Test(lora_head, engine_greedy_matches_reference_llama) { check_greedy("llama"); }
Test(lora_head, engine_greedy_matches_reference_gpt2_tied) { check_greedy("gpt2"); }
