/* LoRA maths on tiny random models (the parity fixtures' configs): finite differences
 * of a weighted logprob loss w.r.t. adapter weights (with and without activation
 * recompute, with dropout), a frozen base, merge, save/load, dropout masks, target
 * resolution and bad job-spec configs. PEFT parity is in test_lora_peft.c. */
#include "tests/unit/lora_testutil.h"

#include "lora/lora_internal.h"

static const char *const all_linear[] = {"all-linear"};

/* An attached adapter over every linear with random A and B. */
/* An attached adapter over every linear with random A and B. */
static struct lora *random_adapter(struct model *m, float dropout, uint64_t seed) {
    return lora_test_adapter(m, all_linear, 1, dropout, seed, 0.3);
}

static const char *const head_and_blocks[] = {"all-linear", "lm_head"};

/* ---- gradients ---- */

static void check_fd(const char *type, bool recompute, float dropout) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 7);
    struct lora *l = random_adapter(m, dropout, 21);
    if (dropout > 0) {
        lora_set_training(l, true);
        lora_set_dropout_seed(l, 1234);
    }
    struct parity_packed p;
    parity_load_inputs(type, &p);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, recompute, &acts, &err), &err);
    char label[128];
    snprintf(label, sizeof label, "%s%s, dropout %g", type, recompute ? " (recompute)" : "", (double)dropout);
    lora_expect_fd(m, l, acts, &p, label);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora, fd_llama) { check_fd("llama", false, 0.0f); }
Test(lora, fd_llama_recompute) { check_fd("llama", true, 0.0f); }
Test(lora, fd_qwen3) { check_fd("qwen3", false, 0.0f); }
Test(lora, fd_gpt2) { check_fd("gpt2", false, 0.0f); }
Test(lora, fd_gpt2_recompute) { check_fd("gpt2", true, 0.0f); }
Test(lora, fd_llama_dropout) { check_fd("llama", false, 0.3f); }
Test(lora, fd_gpt2_dropout_recompute) { check_fd("gpt2", true, 0.3f); }

/* ---- frozen base ---- */

static void check_frozen(const char *type) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 3);
    struct lora *l = random_adapter(m, 0.0f, 4);
    size_t base_bytes = (size_t)m->n_weights * sizeof(float);
    float *before = malloc(base_bytes);
    memcpy(before, m->weights.data, base_bytes);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    double loss0 = lora_loss(m, acts, &p);
    lora_backward(m, acts, &p);
    /* The gradient of L: a small step against it lowers L. */
    float *w = l->weights.data;
    const float *g = l->grads.data;
    for (int64_t i = 0; i < l->n_weights; i++) w[i] -= 1e-3f * g[i];
    double loss1 = lora_loss(m, acts, &p);
    cr_expect(loss1 < loss0, "%s: an SGD step on the adapter did not lower the loss (%g -> %g)", type, loss0, loss1);
    cr_expect(m->grads.data == NULL, "%s: base gradients were allocated", type);
    cr_expect(memcmp(before, m->weights.data, base_bytes) == 0, "%s: base weights changed", type);
    free(before);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora, frozen_base_llama) { check_frozen("llama"); }
Test(lora, frozen_base_gpt2) { check_frozen("gpt2"); }

/* Backward accumulates into the adapter's grads (the trainer zeroes them). */
Test(lora, grads_accumulate) {
    struct smelt_error err;
    struct model *m = lora_test_model("llama", 3);
    struct lora *l = random_adapter(m, 0.0f, 4);
    struct parity_packed p;
    parity_load_inputs("llama", &p);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    lora_loss(m, acts, &p);
    lora_backward(m, acts, &p);
    float *once = malloc((size_t)l->n_weights * sizeof *once);
    memcpy(once, l->grads.data, (size_t)l->n_weights * sizeof *once);
    lora_backward(m, acts, &p);
    const float *g = l->grads.data;
    int64_t bad = 0;
    for (int64_t i = 0; i < l->n_weights; i++) bad += fabsf(g[i] - 2 * once[i]) > 1e-5f * (1 + fabsf(g[i]));
    cr_expect(bad == 0, "%lld gradients are not the sum of two backward passes", (long long)bad);
    free(once);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

/* ---- merge ---- */

static void check_merge(const char *type, const char *const *targets, int n_targets) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 8);
    struct lora *l = lora_test_adapter(m, targets, n_targets, 0.1f, 9, 0.3);
    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t n = p.T * m->config.vocab_size;
    float *attached = test_zeros_f32(n), *merged = test_zeros_f32(n), *base = test_zeros_f32(n);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    lora_forward(m, acts, &p, attached, NULL);
    TEST_EXPECT_ERROR(lora_merge(l, &err), SMELT_EINVAL, &err); /* still attached */
    lora_detach(l);
    cr_expect(m->adapter == NULL);
    lora_forward(m, acts, &p, base, NULL);
    TEST_OK(lora_merge(l, &err), &err);
    lora_forward(m, acts, &p, merged, NULL);
    double *want = test_to_f64(attached, n);
    test_expect_close("merged logits", merged, want, n, 1e-5, 1e-5);
    double diff = 0;
    for (int64_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)base[i] - attached[i]));
    cr_expect(diff > 1e-2, "%s: the adapter hardly changes the logits (%g)", type, diff);
    free(want), free(attached), free(merged), free(base);
    model_acts_free(acts);
    lora_free(l);
    model_free(m);
}

Test(lora, merge_llama) { check_merge("llama", all_linear, 1); }
Test(lora, merge_qwen3) { check_merge("qwen3", all_linear, 1); }
Test(lora, merge_gpt2) { check_merge("gpt2", all_linear, 1); }
/* An untied lm_head merges too (a tied one is refused: test_lora_head.c). */
Test(lora, merge_llama_lm_head) { check_merge("llama", head_and_blocks, 2); }

/* ---- save / load ---- */

static void check_save_load(const char *type, bool rslora, const char *const *targets, int n_targets) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 10);
    struct lora_config c = lora_test_config(targets, n_targets, 0.05f);
    c.alpha = 12.5f;
    c.use_rslora = rslora;
    struct lora *a, *b;
    TEST_OK(lora_create(m, &c, 11, &a, &err), &err);
    lora_fill_random(a, 12, 0.3);
    char dir[256];
    TEST_OK(lora_save(a, test_tmp_path(dir, sizeof dir, "adapter"), "some/base", &err), &err);
    TEST_OK(lora_load(m, dir, &b, &err), &err);
    cr_expect_eq(b->config.rank, a->config.rank);
    cr_expect_eq(b->config.alpha, a->config.alpha);
    cr_expect_eq(b->config.dropout, a->config.dropout);
    cr_expect_eq(b->config.use_rslora, rslora);
    cr_expect_eq(b->scaling, a->scaling);
    cr_expect_eq(b->config.n_targets, a->config.n_targets);
    for (int i = 0; i < a->config.n_targets && i < b->config.n_targets; i++)
        cr_expect_str_eq(b->config.targets[i], a->config.targets[i]);
    cr_assert_eq(b->n_params, a->n_params);
    cr_assert_eq(b->n_weights, a->n_weights);
    for (int i = 0; i < a->n_params; i++) {
        cr_expect_str_eq(b->params[i].name, a->params[i].name);
        cr_expect(b->params[i].offset == a->params[i].offset && b->params[i].shape[0] == a->params[i].shape[0] &&
                  b->params[i].shape[1] == a->params[i].shape[1], "%s: layout differs", a->params[i].name);
    }
    cr_expect(memcmp(a->weights.data, b->weights.data, (size_t)a->n_weights * sizeof(float)) == 0,
              "%s: weights changed through save/load", type);

    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t n = p.T * m->config.vocab_size;
    float *la = test_zeros_f32(n), *lb = test_zeros_f32(n);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    TEST_OK(lora_attach(a, &err), &err);
    TEST_EXPECT_ERROR(lora_attach(b, &err), SMELT_EINVAL, &err); /* one adapter at a time */
    lora_forward(m, acts, &p, la, NULL);
    lora_detach(a);
    TEST_OK(lora_attach(b, &err), &err);
    lora_forward(m, acts, &p, lb, NULL);
    cr_expect(memcmp(la, lb, (size_t)n * sizeof(float)) == 0, "%s: logits differ after save/load", type);
    free(la), free(lb);
    model_acts_free(acts);
    lora_free(a);
    lora_free(b);
    model_free(m);
}

Test(lora, save_load_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("llama", false, all_linear, 1); }
Test(lora, save_load_qwen3, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("qwen3", true, all_linear, 1); }
Test(lora, save_load_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("gpt2", false, all_linear, 1); }
/* With the output projection: PEFT's lm_head tensors and "lm_head" in target_modules. */
Test(lora, save_load_llama_lm_head, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_save_load("llama", false, head_and_blocks, 2);
}
Test(lora, save_load_gpt2_tied_lm_head, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_save_load("gpt2", false, head_and_blocks, 2);
}

/* A selection that differs between layers is saved as full module paths and loads
 * back as the same selection. */
Test(lora, save_load_some_layers, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    struct model *m = lora_test_model("gpt2", 10);
    static const char *const targets[] = {"transformer.h.1.attn.c_attn", "h.0.mlp.c_proj"};
    struct lora_config c = lora_test_config(targets, 2, 0.0f);
    struct lora *a, *b;
    TEST_OK(lora_create(m, &c, 11, &a, &err), &err);
    cr_assert_eq(a->n_params, 4);
    cr_expect_str_eq(a->params[0].name, "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight");
    cr_expect_str_eq(a->params[3].name, "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight");
    char dir[256];
    TEST_OK(lora_save(a, test_tmp_path(dir, sizeof dir, "adapter"), NULL, &err), &err);
    TEST_OK(lora_load(m, dir, &b, &err), &err);
    cr_assert_eq(b->n_params, 4);
    for (int i = 0; i < 4; i++) cr_expect_str_eq(b->params[i].name, a->params[i].name);
    lora_free(a);
    lora_free(b);
    model_free(m);
}

/* ---- dropout ---- */

Test(lora, dropout_deterministic) {
    struct smelt_error err;
    struct model *m = lora_test_model("llama", 13);
    struct lora *l = random_adapter(m, 0.5f, 14);
    struct parity_packed p;
    parity_load_inputs("llama", &p);
    int64_t n = p.T * m->config.vocab_size;
    size_t bytes = (size_t)n * sizeof(float);
    float *off = test_zeros_f32(n), *off2 = test_zeros_f32(n), *s1 = test_zeros_f32(n);
    float *s1b = test_zeros_f32(n), *s2 = test_zeros_f32(n), *nodrop = test_zeros_f32(n);
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p.T, false, &acts, &err), &err);
    lora_forward(m, acts, &p, off, NULL);
    lora_set_training(l, true);
    lora_set_dropout_seed(l, 1);
    lora_forward(m, acts, &p, s1, NULL);
    lora_forward(m, acts, &p, s1b, NULL);
    lora_set_dropout_seed(l, 2);
    lora_forward(m, acts, &p, s2, NULL);
    lora_set_training(l, false);
    lora_forward(m, acts, &p, off2, NULL);
    cr_expect(memcmp(off, s1, bytes) != 0, "dropout on changes nothing");
    cr_expect(memcmp(s1, s1b, bytes) == 0, "the same seed gives different outputs");
    cr_expect(memcmp(s1, s2, bytes) != 0, "different seeds give the same output");
    cr_expect(memcmp(off, off2, bytes) == 0, "training off is not dropout-free");

    /* Training off equals an adapter without dropout and the same weights. */
    lora_detach(l);
    struct lora_config c = lora_test_config(all_linear, 1, 0.0f);
    struct lora *plain;
    TEST_OK(lora_create(m, &c, 14, &plain, &err), &err);
    memcpy(plain->weights.data, l->weights.data, (size_t)l->n_weights * sizeof(float));
    TEST_OK(lora_attach(plain, &err), &err);
    lora_set_training(plain, true);
    lora_forward(m, acts, &p, nodrop, NULL);
    cr_expect(memcmp(off, nodrop, bytes) == 0, "training off differs from no dropout");
    free(off), free(off2), free(s1), free(s1b), free(s2), free(nodrop);
    model_acts_free(acts);
    lora_free(plain);
    lora_free(l);
    model_free(m);
}

/* The mask keeps about 1 - p of the elements, scaled by 1 / (1 - p), and differs
 * between modules. */
Test(lora, dropout_mask) {
    struct smelt_error err;
    struct model *m = lora_test_model("llama", 15);
    struct lora *l = random_adapter(m, 0.25f, 16);
    lora_set_training(l, true);
    lora_set_dropout_seed(l, 3);
    int64_t T = 64, C = m->config.hidden_size, n = T * C, shape[2] = {T, C};
    TEST_OK(lora_scratch_reserve(l, T, true, &err), &err);
    float *ones = malloc((size_t)n * sizeof *ones), *out0 = test_zeros_f32(n), *out1 = test_zeros_f32(n);
    for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
    struct tensor x = tensor_f32(ones, 2, shape), y0 = tensor_f32(out0, 2, shape), y1 = tensor_f32(out1, 2, shape);
    TEST_OK(lora_dropout_forward(l, &l->state->modules[0], 0, &x, &y0, &err), &err);
    TEST_OK(lora_dropout_forward(l, &l->state->modules[1], 0, &x, &y1, &err), &err);
    int64_t dropped = 0, same = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        dropped += out0[i] == 0.0f;
        bad += out0[i] != 0.0f && fabsf(out0[i] - 1.0f / 0.75f) > 1e-6f;
        same += (out0[i] == 0.0f) == (out1[i] == 0.0f);
    }
    double frac = (double)dropped / (double)n;
    cr_expect(frac > 0.2 && frac < 0.3, "dropped fraction %g for p = 0.25", frac);
    cr_expect(bad == 0, "%lld kept elements not scaled by 1/(1-p)", (long long)bad);
    cr_expect(same < n * 0.75, "two modules share their masks (%lld of %lld agree)", (long long)same, (long long)n);
    free(ones), free(out0), free(out1);
    lora_free(l);
    model_free(m);
}

/* ---- targets and configs ---- */

static void expect_params(const char *type, const char *const *targets, int n_targets,
                          const char *const *want_names, int n_want, const char *const *want_targets,
                          int n_want_targets) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 1);
    struct lora_config c = lora_test_config(targets, n_targets, 0.0f);
    struct lora *l;
    TEST_OK(lora_create(m, &c, 1, &l, &err), &err);
    cr_assert_eq(l->n_params, n_want, "%s: %d parameters, expected %d", type, l->n_params, n_want);
    for (int i = 0; i < n_want; i++) cr_expect_str_eq(l->params[i].name, want_names[i]);
    cr_assert_eq(l->config.n_targets, n_want_targets);
    for (int i = 0; i < n_want_targets; i++) cr_expect_str_eq(l->config.targets[i], want_targets[i]);
    /* B starts at zero, A within PEFT's kaiming-uniform bound. */
    const float *w = l->weights.data;
    for (int i = 0; i < l->n_params; i++) {
        const struct lora_param *par = &l->params[i];
        bool is_a = strstr(par->name, "lora_A") != NULL;
        double bound = 1.0 / sqrt((double)par->shape[1]), maxabs = 0;
        for (int64_t j = 0; j < par->numel; j++) maxabs = fmax(maxabs, fabs(w[par->offset + j]));
        if (is_a)
            cr_expect(maxabs <= bound && maxabs > 0.5 * bound, "%s: max |A| %g, bound %g", par->name, maxabs, bound);
        else
            cr_expect(maxabs == 0, "%s: B is not zero", par->name);
    }
    lora_free(l);
    model_free(m);
}

Test(lora, targets_gpt2_c_proj_both) {
    static const char *const t[] = {"c_proj"};
    static const char *const names[] = {
        "base_model.model.transformer.h.0.attn.c_proj.lora_A.weight", "base_model.model.transformer.h.0.attn.c_proj.lora_B.weight",
        "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight", "base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight",
        "base_model.model.transformer.h.1.attn.c_proj.lora_A.weight", "base_model.model.transformer.h.1.attn.c_proj.lora_B.weight",
        "base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight", "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"};
    expect_params("gpt2", t, 1, names, 8, t, 1);
}

Test(lora, targets_gpt2_attn_c_proj_only) {
    static const char *const t[] = {"attn.c_proj"};
    static const char *const names[] = {
        "base_model.model.transformer.h.0.attn.c_proj.lora_A.weight", "base_model.model.transformer.h.0.attn.c_proj.lora_B.weight",
        "base_model.model.transformer.h.1.attn.c_proj.lora_A.weight", "base_model.model.transformer.h.1.attn.c_proj.lora_B.weight"};
    expect_params("gpt2", t, 1, names, 4, t, 1);
}

Test(lora, targets_defaults) {
    static const char *const llama[] = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
        "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight",
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight",
        "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight", "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"};
    static const char *const llama_targets[] = {"q_proj", "v_proj"};
    expect_params("llama", NULL, 0, llama, 8, llama_targets, 2);
    static const char *const short_forms[] = {"v", "q"};
    expect_params("llama", short_forms, 2, llama, 8, llama_targets, 2);
    static const char *const gpt2[] = {
        "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight", "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight",
        "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight", "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"};
    static const char *const gpt2_targets[] = {"c_attn"};
    expect_params("gpt2", NULL, 0, gpt2, 4, gpt2_targets, 1);
}

Test(lora, targets_shapes) {
    struct smelt_error err;
    struct model *m = lora_test_model("qwen3", 1); /* heads * head_dim != hidden */
    struct lora_config c = lora_test_config(all_linear, 1, 0.0f);
    struct lora *l;
    TEST_OK(lora_create(m, &c, 1, &l, &err), &err);
    cr_assert_eq(l->n_params, 28);
    const struct model_config *mc = &m->config;
    int64_t QD = mc->n_heads * mc->head_dim, KD = mc->n_kv_heads * mc->head_dim, C = mc->hidden_size;
    int64_t F = mc->intermediate_size;
    int64_t want[7][2] = {{C, QD}, {C, KD}, {C, KD}, {QD, C}, {C, F}, {C, F}, {F, C}}; /* in, out */
    for (int k = 0; k < 7; k++) {
        const struct lora_param *a = &l->params[2 * k], *b = &l->params[2 * k + 1];
        cr_expect(a->shape[0] == 4 && a->shape[1] == want[k][0], "%s", a->name);
        cr_expect(b->shape[0] == want[k][1] && b->shape[1] == 4, "%s", b->name);
    }
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    cr_assert_eq(l->config.n_targets, 7);
    for (int i = 0; i < 7; i++) cr_expect_str_eq(l->config.targets[i], names[i]);
    cr_expect_float_eq(l->scaling, 2.0f, 0);
    lora_free(l);
    c.use_rslora = true;
    TEST_OK(lora_create(m, &c, 1, &l, &err), &err);
    cr_expect_float_eq(l->scaling, 4.0f, 0); /* alpha / sqrt(r) */
    lora_free(l);
    model_free(m);
}

static void expect_create_error(const char *type, const char *target, const char *want_in_message) {
    struct smelt_error err;
    struct model *m = lora_test_model(type, 1);
    struct lora_config c = lora_test_config(&target, 1, 0.0f);
    struct lora *l = NULL;
    TEST_EXPECT_ERROR(lora_create(m, &c, 1, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, want_in_message) != NULL, "'%s' not in: %s", want_in_message, err.message);
    model_free(m);
}

Test(lora, create_errors) {
    expect_create_error("llama", "c_attn", "c_attn");
    expect_create_error("gpt2", "q_proj", "q_proj");
    expect_create_error("gpt2", "q", "'q'");
    expect_create_error("llama-rm", "lm_head", "sequence classifier"); /* its head is score */
    expect_create_error("llama", "model.layers.2.self_attn.q_proj", "layers.2"); /* 2 layers */
    expect_create_error("llama", "proj", "proj"); /* a suffix, but not at a '.' */
    struct smelt_error err;
    struct model *m = lora_test_model("llama", 1);
    struct lora *l;
    struct lora_config c = lora_test_config(NULL, 0, 0.0f);
    c.rank = 0;
    TEST_EXPECT_ERROR(lora_create(m, &c, 1, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "rank") != NULL, "%s", err.message);
    c = lora_test_config(NULL, 0, 1.0f);
    TEST_EXPECT_ERROR(lora_create(m, &c, 1, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "dropout") != NULL, "%s", err.message);
    c = lora_test_config(NULL, 0, 0.0f);
    c.alpha = 0;
    TEST_EXPECT_ERROR(lora_create(m, &c, 1, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "alpha") != NULL, "%s", err.message);
    model_free(m);
}

static int parse_config(const char *text, struct lora_config *out, struct smelt_error *err) {
    json_t *root;
    int rc = json_load_buffer(text, strlen(text), "test", &root, err);
    if (rc) return rc;
    rc = lora_config_from_json(root, "job.lora", out, err);
    json_decref(root);
    return rc;
}

static void expect_config_error(const char *text, const char *field) {
    struct smelt_error err;
    struct lora_config c;
    TEST_EXPECT_ERROR(parse_config(text, &c, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, field) != NULL && strstr(err.message, "job.lora") != NULL,
              "%s: error does not name %s: %s", text, field, err.message);
}

Test(lora, config_from_json) {
    struct smelt_error err;
    struct lora_config c;
    TEST_OK(parse_config("{}", &c, &err), &err);
    cr_expect(c.rank == 8 && c.alpha == 16.0f && c.dropout == 0.0f && !c.use_rslora && c.n_targets == 0);
    TEST_OK(parse_config("{\"rank\": 4, \"dropout\": 0.05, \"use_rslora\": true,"
                         " \"target_modules\": [\"q\", \"v_proj\", \"attn.c_proj\", \"model.layers.3.mlp.up_proj\"]}",
                         &c, &err), &err);
    cr_expect(c.rank == 4 && c.alpha == 8.0f && c.dropout == 0.05f && c.use_rslora);
    cr_assert_eq(c.n_targets, 4);
    cr_expect_str_eq(c.targets[0], "q");
    cr_expect_str_eq(c.targets[3], "model.layers.3.mlp.up_proj");
    TEST_OK(parse_config("{\"alpha\": 32, \"target_modules\": \"all-linear\"}", &c, &err), &err);
    cr_expect(c.alpha == 32.0f && c.n_targets == 1 && strcmp(c.targets[0], "all-linear") == 0);

    expect_config_error("{\"ranks\": 4}", "ranks");
    expect_config_error("{\"rank\": 0}", "rank");
    expect_config_error("{\"rank\": 2.5}", "rank");
    expect_config_error("{\"alpha\": -1}", "alpha");
    expect_config_error("{\"dropout\": 1}", "dropout");
    expect_config_error("{\"dropout\": -0.1}", "dropout");
    expect_config_error("{\"use_rslora\": 1}", "use_rslora");
    expect_config_error("{\"target_modules\": [\"q_prj\"]}", "q_prj");
    expect_config_error("{\"target_modules\": []}", "target_modules");
    expect_config_error("{\"target_modules\": [3]}", "target_modules");
    expect_config_error("{\"target_modules\": \".*proj\"}", "target_modules");
    expect_config_error("{\"target_modules\": [\"q\",\"k\",\"v\",\"o\",\"q\",\"k\",\"v\",\"o\",\"q\",\"k\",\"v\",\"o\","
                        "\"q\",\"k\",\"v\",\"o\",\"q\"]}", "target_modules");
    expect_config_error("[1]", "job.lora");
}
