/* The reward model's score head (model/score_head.h): parity with transformers'
 * *ForSequenceClassification on the fixtures of tests/parity/make_reward_fixtures.py
 * (scores and every gradient), the head against float64 references and finite
 * differences, finite differences through the whole model, save/load round trips,
 * turning a causal LM into a reward model, and refusals. */
#include "tests/unit/parity_testutil.h"
#include "tests/unit/score_head_testutil.h"

#include <string.h>

#include "model/model.h"

/* A fixture's sequences packed into one row, and dL/dscore per sequence. */
struct rm_inputs {
    int64_t T;
    int n_seqs;
    int32_t ids[64], cu[8];
    float weights[8];
};

static void load_rm_inputs(const char *dir, struct rm_inputs *in) {
    char path[256];
    snprintf(path, sizeof path, "%s/inputs.json", dir);
    json_t *root;
    struct smelt_error err;
    TEST_OK(json_load_path(path, &root, &err), &err);
    json_t *seqs = json_object_get(root, "sequences"), *ws = json_object_get(root, "score_weights");
    memset(in, 0, sizeof *in);
    in->n_seqs = (int)json_array_size(seqs);
    cr_assert(in->n_seqs > 0 && in->n_seqs < 8 && json_array_size(ws) == (size_t)in->n_seqs);
    for (int s = 0; s < in->n_seqs; s++) {
        json_t *seq = json_array_get(seqs, (size_t)s);
        in->cu[s] = (int32_t)in->T;
        in->weights[s] = (float)json_real_value(json_array_get(ws, (size_t)s));
        for (size_t t = 0; t < json_array_size(seq); t++) {
            cr_assert(in->T < 64);
            in->ids[in->T++] = (int32_t)json_integer_value(json_array_get(seq, t));
        }
    }
    in->cu[in->n_seqs] = (int32_t)in->T;
    json_decref(root);
}

static struct model_batch rm_batch(const struct rm_inputs *in) {
    return (struct model_batch){.n_tokens = in->T, .n_seqs = in->n_seqs, .ids = in->ids,
                                .cu_seqlens = in->cu};
}

/* The scores of the batch: forward to hidden (into `hidden`, [T, C]), then the head. */
static void rm_scores(struct model *m, struct model_acts *acts, const struct rm_inputs *in,
                      float *hidden, float *scores) {
    int64_t hs[2] = {in->T, m->config.hidden_size}, S = in->n_seqs;
    struct tensor th = tensor_f32(hidden, 2, hs), ts = tensor_f32(scores, 1, &S);
    struct model_batch b = rm_batch(in);
    struct smelt_error err;
    TEST_OK(model_forward(m, acts, &b, NULL, NULL, &th, &err), &err);
    TEST_OK(model_score_forward(m, &b, &th, &ts, &err), &err);
}

/* L = sum_s w[s] score[s], differentiated into m->grads (head and body). */
static void rm_backward(struct model *m, struct model_acts *acts, const struct rm_inputs *in,
                        float *hidden) {
    int64_t hs[2] = {in->T, m->config.hidden_size}, S = in->n_seqs;
    float *dh = test_zeros_f32(hs[0] * hs[1]);
    struct tensor th = tensor_f32(hidden, 2, hs), tdh = tensor_f32(dh, 2, hs);
    struct tensor tds = tensor_f32((float *)in->weights, 1, &S);
    struct model_batch b = rm_batch(in);
    struct smelt_error err;
    TEST_OK(model_score_backward(m, &b, &th, &tds, &m->g.score, &tdh, &err), &err);
    TEST_OK(model_backward(m, acts, NULL, &tdh, &err), &err);
    free(dh);
}

static void check_parity(const char *type) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s-rm", type);
    struct smelt_error err;
    struct model *m = parity_model_load(type, "-rm");
    cr_assert(m->config.score_head && !m->w.lm_head.data, "%s: loaded as a classifier", dir);
    struct rm_inputs in;
    load_rm_inputs(dir, &in);
    struct model_acts *acts;
    TEST_OK(model_grads_alloc(m, &err), &err);
    TEST_OK(model_acts_alloc(m, in.T, false, &acts, &err), &err);
    float *hidden = test_zeros_f32(in.T * m->config.hidden_size), scores[8];
    rm_scores(m, acts, &in, hidden, scores);
    rm_backward(m, acts, &in, hidden);

    struct safetensors *st;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    TEST_OK(safetensors_open(path, &st, &err), &err);
    parity_expect_matches(st, "scores", scores, in.n_seqs, 1e-4, 1e-5);
    struct model_hf_tensor *g;
    int n;
    TEST_OK(model_hf_tensors(m, m->grads.data, &g, &n, &err), &err);
    parity_expect_grads(st, g, n);
    model_hf_tensors_free(g, n);
    safetensors_close(st);
    free(hidden);
    model_acts_free(acts);
    model_free(m);
}

Test(reward_head, parity_llama) { check_parity("llama"); }
Test(reward_head, parity_qwen2) { check_parity("qwen2"); }
Test(reward_head, parity_gpt2) { check_parity("gpt2"); }

/* The pad rule: the last non-pad token; the first when all are pad; the last without a
 * pad id. The llama-rm fixture's pad is 2. */
Test(reward_head, positions) {
    struct smelt_error err;
    struct model *m;
    TEST_OK(model_load(PARITY_DIR "/llama-rm", BACKEND_CPU, &m, &err), &err);
    int32_t ids[9] = {5, 6, 2, 2, /* */ 2, 2, /* */ 7, 2, 8}, cu[4] = {0, 4, 6, 9}, pos[3];
    struct model_batch b = {.n_tokens = 9, .n_seqs = 3, .ids = ids, .cu_seqlens = cu};
    TEST_OK(model_score_positions(m, &b, pos, &err), &err);
    cr_expect(pos[0] == 1 && pos[1] == 4 && pos[2] == 8, "positions %d %d %d", pos[0], pos[1], pos[2]);
    m->config.pad_token_id = -1;
    TEST_OK(model_score_positions(m, &b, pos, &err), &err);
    cr_expect(pos[0] == 3 && pos[1] == 5 && pos[2] == 8, "positions %d %d %d", pos[0], pos[1], pos[2]);
    model_free(m);
}

/* ---- the head alone: float64 reference and finite differences ---- */

struct head_case {
    struct model *m;
    struct model_batch b;
    int32_t ids[12], cu[4];
    float *hidden, *ds;  /* [T, C], [S] */
    int64_t T, C, S;
};

static double head_loss(void *ctx) {
    struct head_case *h = ctx;
    float scores[3];
    int64_t hs[2] = {h->T, h->C};
    struct tensor th = tensor_f32(h->hidden, 2, hs), ts = tensor_f32(scores, 1, &h->S);
    struct smelt_error err;
    TEST_OK(model_score_forward(h->m, &h->b, &th, &ts, &err), &err);
    double l = 0;
    for (int64_t s = 0; s < h->S; s++) l += (double)h->ds[s] * scores[s];
    return l;
}

static void head_case_init(struct head_case *h, struct test_rng *rng) {
    struct smelt_error err;
    memset(h, 0, sizeof *h);
    TEST_OK(model_load(PARITY_DIR "/qwen2-rm", BACKEND_CPU, &h->m, &err), &err);
    h->T = 12, h->S = 3, h->C = h->m->config.hidden_size;
    int32_t cu[4] = {0, 5, 9, 12};
    for (int t = 0; t < 12; t++) h->ids[t] = 3 + t;
    memcpy(h->cu, cu, sizeof cu);
    h->b = (struct model_batch){.n_tokens = h->T, .n_seqs = 3, .ids = h->ids, .cu_seqlens = h->cu};
    h->hidden = test_rand_f32(rng, h->T * h->C, -2, 2);
    h->ds = test_rand_f32(rng, h->S, -1, 1);
}

Test(reward_head, head_reference_and_fd) {
    struct test_rng rng = {3};
    struct head_case h;
    head_case_init(&h, &rng);
    int64_t T = h.T, C = h.C, hs[2] = {T, C}, ws[2] = {1, C};
    const float *w = h.m->w.score.data;
    double want_l = 0, *want_dw = calloc((size_t)C, sizeof *want_dw), *want_dh = calloc((size_t)(T * C), sizeof *want_dh);
    cr_assert(want_dw && want_dh);
    for (int64_t s = 0; s < h.S; s++) {
        int64_t last = h.cu[s + 1] - 1;
        for (int64_t c = 0; c < C; c++) {
            want_l += (double)h.ds[s] * w[c] * h.hidden[last * C + c];
            want_dw[c] += (double)h.ds[s] * h.hidden[last * C + c];
            want_dh[last * C + c] = (double)h.ds[s] * w[c];
        }
    }
    cr_expect(fabs(head_loss(&h) - want_l) <= 1e-5 * fabs(want_l) + 1e-6, "loss %.9g vs %.9g", head_loss(&h), want_l);
    float *dw = test_rand_f32(&rng, C, -1, 1), *dw0 = malloc((size_t)C * sizeof *dw0), *dh = test_rand_f32(&rng, T * C, -1, 1);
    cr_assert(dw0);
    memcpy(dw0, dw, (size_t)C * sizeof *dw);
    struct tensor th = tensor_f32(h.hidden, 2, hs), tds = tensor_f32(h.ds, 1, &h.S);
    struct tensor tdw = tensor_f32(dw, 2, ws), tdh = tensor_f32(dh, 2, hs);
    struct smelt_error err;
    TEST_OK(model_score_backward(h.m, &h.b, &th, &tds, &tdw, &tdh, &err), &err);
    for (int64_t c = 0; c < C; c++) want_dw[c] += dw0[c]; /* dweight accumulates */
    test_expect_close("dweight", dw, want_dw, C, 1e-5, 1e-6);
    test_expect_close("dhidden", dh, want_dh, T * C, 1e-5, 1e-6); /* overwritten */
    /* Finite differences at random coordinates (the loss is linear in each). */
    score_head_expect_fd(&rng, h.m, h.hidden, T, C, dw, dw0, dh, head_loss, &h);
    free(want_dw), free(want_dh), free(dw), free(dw0), free(dh), free(h.hidden), free(h.ds);
    model_free(h.m);
}

/* ---- finite differences through the whole model ---- */

struct fd_case {
    struct model *m;
    struct model_acts *acts;
    const struct rm_inputs *in;
    float *hidden;
};

static double model_loss(void *ctx) {
    const struct fd_case *c = ctx;
    float scores[8];
    rm_scores(c->m, c->acts, c->in, c->hidden, scores);
    double l = 0;
    for (int s = 0; s < c->in->n_seqs; s++) l += (double)c->in->weights[s] * scores[s];
    return l;
}

static void check_fd(const char *type) {
    char dir[256];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s-rm", type);
    struct smelt_error err;
    struct model *m = parity_model_load(type, "-rm");
    struct rm_inputs in;
    load_rm_inputs(dir, &in);
    struct model_acts *acts;
    TEST_OK(model_grads_alloc(m, &err), &err);
    TEST_OK(model_acts_alloc(m, in.T, true, &acts, &err), &err);
    float *hidden = test_zeros_f32(in.T * m->config.hidden_size);
    struct fd_case c = {m, acts, &in, hidden};
    model_loss(&c);
    rm_backward(m, acts, &in, hidden);
    struct test_rng rng = {17};
    parity_expect_fd_grads(m, model_loss, &c, &rng, 1, type);
    free(hidden);
    model_acts_free(acts);
    model_free(m);
}

Test(reward_head, fd_llama) { check_fd("llama"); }
Test(reward_head, fd_gpt2) { check_fd("gpt2"); }

/* ---- save, load, and making a reward model from a causal LM ---- */

static void expect_same_weights(const struct model *a, const struct model *b, const char *what) {
    cr_assert_eq(a->n_weights, b->n_weights, "%s: parameter count", what);
    cr_expect(memcmp(a->weights.data, b->weights.data, (size_t)a->n_weights * sizeof(float)) == 0,
              "%s: weights changed through save/load", what);
}

static void expect_classifier_config(const char *dir, const char *arch, int64_t pad) {
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root;
    struct smelt_error err;
    TEST_OK(json_load_path(path, &root, &err), &err);
    json_t *a = json_array_get(json_object_get(root, "architectures"), 0);
    cr_expect_str_eq(json_string_value(a), arch);
    cr_expect_eq(json_integer_value(json_object_get(root, "num_labels")), 1);
    cr_expect_eq(json_object_size(json_object_get(root, "id2label")), 1);
    cr_expect_eq(json_integer_value(json_object_get(root, "pad_token_id")), pad);
    json_decref(root);
}

static void check_save_load(const char *type) {
    char dir[256], out[128];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s-rm", type);
    struct smelt_error err;
    struct model *a, *b;
    TEST_OK(model_load(dir, BACKEND_CPU, &a, &err), &err);
    TEST_OK(model_save(a, test_tmp_path(out, sizeof out, "rm"), false, &err), &err);
    TEST_OK(model_load(out, BACKEND_CPU, &b, &err), &err);
    expect_same_weights(a, b, type);
    cr_expect(b->config.score_head && b->config.pad_token_id == a->config.pad_token_id);
    expect_classifier_config(out, a->config.architecture, a->config.pad_token_id);
    model_free(a), model_free(b);
}

Test(reward_head, save_load_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("llama"); }
Test(reward_head, save_load_qwen2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("qwen2"); }
Test(reward_head, save_load_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) { check_save_load("gpt2"); }

/* The body is the LM's, bit for bit; the head is new, ~ N(0, 0.02); pad falls back to
 * eos (the llama fixture has pad_token_id null, eos 2). */
static void check_from_lm(const char *type, const char *arch, int64_t pad_given, int64_t pad_want) {
    char dir[256], out[128];
    snprintf(dir, sizeof dir, PARITY_DIR "/%s", type);
    struct smelt_error err;
    struct model *lm, *rm, *back;
    TEST_OK(model_load(dir, BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_classifier_from_lm(lm, pad_given, 0.02, 9, &rm, &err), &err);
    cr_expect_str_eq(rm->config.architecture, arch);
    cr_expect_eq(rm->config.pad_token_id, pad_want);
    for (int i = 0; i < rm->n_params; i++) {
        const struct model_param *p = &rm->params[i], *q = model_param_find(lm, p->name);
        if (strcmp(p->name, "score.weight") == 0) continue;
        cr_assert(q, "%s missing from the LM", p->name);
        cr_expect(memcmp((float *)rm->weights.data + p->offset, (float *)lm->weights.data + q->offset,
                         (size_t)p->numel * sizeof(float)) == 0, "%s changed", p->name);
    }
    const float *w = rm->w.score.data;
    double sq = 0;
    for (int64_t c = 0; c < rm->config.hidden_size; c++) sq += (double)w[c] * w[c];
    double sd = sqrt(sq / (double)rm->config.hidden_size);
    cr_expect(sd > 0.01 && sd < 0.04, "score head std %g, expected about 0.02", sd);
    TEST_OK(model_save(rm, test_tmp_path(out, sizeof out, "rm"), false, &err), &err);
    TEST_OK(model_load(out, BACKEND_CPU, &back, &err), &err);
    expect_same_weights(rm, back, type);
    expect_classifier_config(out, arch, pad_want);
    model_free(lm), model_free(rm), model_free(back);
}

Test(reward_head, from_lm_llama, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_from_lm("llama", "LlamaForSequenceClassification", -1, 2);
}
Test(reward_head, from_lm_qwen3_tied, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_from_lm("qwen3", "Qwen3ForSequenceClassification", 7, 7);
}
Test(reward_head, from_lm_gpt2, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    check_from_lm("gpt2", "GPT2ForSequenceClassification", 0, 0);
}

/* ---- refusals ---- */

static int config_of(const char *text, struct model_config *c, struct smelt_error *err) {
    json_t *root = json_loads(text, 0, NULL);
    cr_assert(root, "bad test JSON: %s", text);
    int rc = model_config_from_json(root, "test", c, err);
    json_decref(root);
    return rc;
}

#define SMALL "\"model_type\": \"llama\", \"hidden_size\": 32, \"num_attention_heads\": 4, "

Test(reward_head, config_labels) {
    struct smelt_error err;
    struct model_config c;
    TEST_OK(config_of("{" SMALL "\"architectures\": [\"LlamaForSequenceClassification\"], \"num_labels\": 1}", &c, &err), &err);
    cr_expect(c.score_head);
    TEST_OK(config_of("{" SMALL "\"architectures\": [\"LlamaForSequenceClassification\"], "
                      "\"id2label\": {\"0\": \"LABEL_0\"}}", &c, &err), &err);
    cr_expect(c.score_head);
    TEST_OK(config_of("{" SMALL "\"architectures\": [\"LlamaForCausalLM\"], \"num_labels\": 3}", &c, &err), &err);
    cr_expect(!c.score_head, "a causal LM's labels do not matter");
    /* transformers' default is two labels. */
    TEST_EXPECT_ERROR(config_of("{" SMALL "\"architectures\": [\"LlamaForSequenceClassification\"]}", &c, &err),
                      SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "2 labels") != NULL, "%s", err.message);
    TEST_EXPECT_ERROR(config_of("{" SMALL "\"architectures\": [\"LlamaForSequenceClassification\"], "
                                "\"id2label\": {\"0\": \"a\", \"1\": \"b\"}}", &c, &err),
                      SMELT_EUNSUPPORTED, &err);
    TEST_EXPECT_ERROR(config_of("{" SMALL "\"architectures\": [\"LlamaForTokenClassification\"], \"num_labels\": 1}", &c, &err),
                      SMELT_EUNSUPPORTED, &err);
    cr_expect(strstr(err.message, "LlamaForTokenClassification") != NULL, "%s", err.message);
    TEST_EXPECT_ERROR(config_of("{" SMALL "\"architectures\": [\"LlamaForQuestionAnswering\"]}", &c, &err),
                      SMELT_EUNSUPPORTED, &err);
}

Test(reward_head, refusals) {
    struct smelt_error err;
    struct model *lm, *rm;
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_load(PARITY_DIR "/llama-rm", BACKEND_CPU, &rm, &err), &err);
    int32_t ids[4] = {3, 4, 5, 6}, cu[2] = {0, 4};
    struct model_batch b = {.n_tokens = 4, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
    float hidden[4 * 32], scores[2], logits[4 * 96];
    int64_t hs[2] = {4, 32}, one = 1, two = 2, ls[2] = {4, 96};
    struct tensor th = tensor_f32(hidden, 2, hs), ts = tensor_f32(scores, 1, &one), ts2 = tensor_f32(scores, 1, &two);
    TEST_EXPECT_ERROR(model_score_forward(lm, &b, &th, &ts, &err), SMELT_EINVAL, &err); /* no head */
    TEST_EXPECT_ERROR(model_score_forward(rm, &b, &th, &ts2, &err), SMELT_EINVAL, &err); /* [S] */
    TEST_EXPECT_ERROR(model_classifier_from_lm(rm, -1, 0.02, 1, &lm, &err), SMELT_EINVAL, &err);
    struct model *tmp;
    TEST_EXPECT_ERROR(model_classifier_from_lm(lm, 96, 0.02, 1, &tmp, &err), SMELT_EINVAL, &err); /* vocab 96 */
    lm->config.n_eos_token_ids = 0; /* no pad, no eos */
    TEST_EXPECT_ERROR(model_classifier_from_lm(lm, -1, 0.02, 1, &tmp, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "pad_token_id") != NULL, "%s", err.message);
    /* A classifier has no logits: forward, generation and the paged engine say so. */
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(rm, 4, false, &acts, &err), &err);
    struct tensor tl = tensor_f32(logits, 2, ls);
    TEST_EXPECT_ERROR(model_forward(rm, acts, &b, NULL, &tl, NULL, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "lm_head") != NULL, "%s", err.message);
    struct generate_params gp = {.max_new_tokens = 1, .temperature = 1.0, .top_p = 1.0};
    struct generate_result gr;
    TEST_EXPECT_ERROR(model_generate_reference(rm, ids, 4, &gp, &gr, &err), SMELT_EINVAL, &err);
    struct model_step_buffers *sb;
    TEST_EXPECT_ERROR(model_step_buffers_alloc(rm, 4, 1, 1, &sb, &err), SMELT_EINVAL, &err);
    model_acts_free(acts);
    model_free(lm), model_free(rm);
}

/* A classifier config over a causal LM's weights: the missing head is named. */
Test(reward_head, load_mismatch, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    struct model *lm, *m;
    struct model_config cfg;
    char out[128];
    TEST_OK(model_load(PARITY_DIR "/llama", BACKEND_CPU, &lm, &err), &err);
    TEST_OK(model_config_load(PARITY_DIR "/llama-rm", &cfg, &err), &err);
    TEST_OK(model_save(lm, test_tmp_path(out, sizeof out, "mixed"), false, &err), &err);
    TEST_OK(model_config_save(&cfg, out, &err), &err);
    TEST_EXPECT_ERROR(model_load(out, BACKEND_CPU, &m, &err), SMELT_ENOTFOUND, &err);
    cr_expect(strstr(err.message, "score.weight") != NULL, "%s", err.message);
    model_free(lm);
}
