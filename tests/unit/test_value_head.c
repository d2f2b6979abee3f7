/* PPO's value head (model/score_head.h: model_value_forward / model_value_backward): the
 * score head read at every token. The head alone against a float64 reference (values,
 * dweight accumulating, dhidden overwritten) and central finite differences; through a
 * whole classifier (two packed sequences, every parameter) against finite differences;
 * refusals. */
#include "tests/unit/parity_testutil.h"
#include "tests/unit/score_head_testutil.h"

#include <string.h>

#include "model/model.h"

/* ---- the head alone ---- */

struct vh_case {
    struct model *m;
    float *hidden, *dv; /* [T, C], [T] */
    int64_t T, C;
};

/* L = sum_t dv[t] * values[t]: its gradient is the backward's output for dvalues = dv. */
static double vh_loss(void *ctx) {
    struct vh_case *h = ctx;
    float *values = test_zeros_f32(h->T);
    int64_t hs[2] = {h->T, h->C};
    struct tensor th = tensor_f32(h->hidden, 2, hs), tv = tensor_f32(values, 1, &h->T);
    struct smelt_error err;
    TEST_OK(model_value_forward(h->m, &th, &tv, &err), &err);
    double l = 0;
    for (int64_t t = 0; t < h->T; t++) l += (double)h->dv[t] * values[t];
    free(values);
    return l;
}

Test(value_head, head_reference_and_fd) {
    struct test_rng rng = {5};
    struct smelt_error err;
    struct vh_case h = {0};
    TEST_OK(model_load(PARITY_DIR "/qwen2-rm", BACKEND_CPU, &h.m, &err), &err);
    h.T = 11, h.C = h.m->config.hidden_size;
    h.hidden = test_rand_f32(&rng, h.T * h.C, -2, 2);
    h.dv = test_rand_f32(&rng, h.T, -1, 1);
    int64_t T = h.T, C = h.C, hs[2] = {T, C}, ws[2] = {1, C};
    const float *w = h.m->w.score.data;

    /* Values: a dot product per row, in float64. */
    float *values = test_zeros_f32(T);
    double *want_v = calloc((size_t)T, sizeof *want_v), *want_dw = calloc((size_t)C, sizeof *want_dw),
           *want_dh = calloc((size_t)(T * C), sizeof *want_dh);
    cr_assert(want_v && want_dw && want_dh);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            want_v[t] += (double)w[c] * h.hidden[t * C + c];
            want_dw[c] += (double)h.dv[t] * h.hidden[t * C + c];
            want_dh[t * C + c] = (double)h.dv[t] * w[c];
        }
    struct tensor th = tensor_f32(h.hidden, 2, hs), tv = tensor_f32(values, 1, &T);
    TEST_OK(model_value_forward(h.m, &th, &tv, &err), &err);
    test_expect_close("values", values, want_v, T, 1e-5, 1e-6);

    /* The backward: dweight accumulates onto what it held, dhidden is overwritten. */
    float *dw = test_rand_f32(&rng, C, -1, 1), *dw0 = malloc((size_t)C * sizeof *dw0),
          *dh = test_rand_f32(&rng, T * C, -1, 1);
    cr_assert(dw0);
    memcpy(dw0, dw, (size_t)C * sizeof *dw);
    struct tensor tdv = tensor_f32(h.dv, 1, &T), tdw = tensor_f32(dw, 2, ws), tdh = tensor_f32(dh, 2, hs);
    TEST_OK(model_value_backward(h.m, &th, &tdv, &tdw, &tdh, &err), &err);
    for (int64_t c = 0; c < C; c++) want_dw[c] += dw0[c];
    test_expect_close("dweight", dw, want_dw, C, 1e-5, 1e-6);
    test_expect_close("dhidden", dh, want_dh, T * C, 1e-5, 1e-6);
    /* Either output alone gives the same numbers. */
    float *dh2 = test_rand_f32(&rng, T * C, -1, 1);
    struct tensor tdh2 = tensor_f32(dh2, 2, hs);
    TEST_OK(model_value_backward(h.m, &th, &tdv, NULL, &tdh2, &err), &err);
    cr_expect_eq(memcmp(dh, dh2, (size_t)(T * C) * sizeof *dh), 0, "dhidden differs without dweight");

    /* Central finite differences at random coordinates of the head and of hidden. */
    score_head_expect_fd(&rng, h.m, h.hidden, T, C, dw, dw0, dh, vh_loss, &h);
    free(values), free(want_v), free(want_dw), free(want_dh), free(dw), free(dw0), free(dh), free(dh2);
    free(h.hidden), free(h.dv);
    model_free(h.m);
}

/* ---- through the whole model ---- */

/* Two sequences packed in one row; L = sum_t g[t] * value[t] over every token. */
struct vm_case {
    struct model *m;
    struct model_acts *acts;
    struct model_batch b;
    int32_t ids[13], cu[3];
    float *hidden, *g; /* [T, C], [T] */
    int64_t T, C;
};

static double vm_loss(void *ctx) {
    struct vm_case *c = ctx;
    int64_t hs[2] = {c->T, c->C};
    float *values = test_zeros_f32(c->T);
    struct tensor th = tensor_f32(c->hidden, 2, hs), tv = tensor_f32(values, 1, &c->T);
    struct smelt_error err;
    TEST_OK(model_forward(c->m, c->acts, &c->b, NULL, NULL, &th, &err), &err);
    TEST_OK(model_value_forward(c->m, &th, &tv, &err), &err);
    double l = 0;
    for (int64_t t = 0; t < c->T; t++) l += (double)c->g[t] * values[t];
    free(values);
    return l;
}

static void check_model_fd(const char *type) {
    struct smelt_error err;
    struct test_rng rng = {41};
    struct vm_case c = {0};
    c.m = parity_model_load(type, "-rm");
    c.T = 13, c.C = c.m->config.hidden_size;
    for (int t = 0; t < 13; t++) c.ids[t] = (int32_t)(3 + (t * 5) % 40);
    c.cu[0] = 0, c.cu[1] = 6, c.cu[2] = 13;
    c.b = (struct model_batch){.n_tokens = c.T, .n_seqs = 2, .ids = c.ids, .cu_seqlens = c.cu};
    c.hidden = test_zeros_f32(c.T * c.C);
    c.g = test_rand_f32(&rng, c.T, -1, 1);
    TEST_OK(model_grads_alloc(c.m, &err), &err);
    TEST_OK(model_acts_alloc(c.m, c.T, false, &c.acts, &err), &err);
    vm_loss(&c);
    int64_t hs[2] = {c.T, c.C};
    float *dh = test_zeros_f32(c.T * c.C);
    struct tensor th = tensor_f32(c.hidden, 2, hs), tdh = tensor_f32(dh, 2, hs), tg = tensor_f32(c.g, 1, &c.T);
    TEST_OK(model_value_backward(c.m, &th, &tg, &c.m->g.score, &tdh, &err), &err);
    TEST_OK(model_backward(c.m, c.acts, NULL, &tdh, &err), &err);
    parity_expect_fd_grads(c.m, vm_loss, &c, &rng, 2, type);
    free(dh), free(c.hidden), free(c.g);
    model_acts_free(c.acts);
    model_free(c.m);
}

Test(value_head, fd_llama) { check_model_fd("llama"); }
Test(value_head, fd_gpt2) { check_model_fd("gpt2"); }

/* ---- refusals ---- */

Test(value_head, refusals) {
    struct smelt_error err;
    struct model *rm, *lm;
    TEST_OK(model_load(PARITY_DIR "/llama-rm", BACKEND_CPU, &rm, &err), &err);
    lm = parity_model_load("llama", "");
    int64_t C = rm->config.hidden_size, T = 4, hs[2] = {T, C}, bad[2] = {T, C + 1};
    float *hidden = test_zeros_f32(T * (C + 1)), values[4], dh[1];
    struct tensor th = tensor_f32(hidden, 2, hs), tv = tensor_f32(values, 1, &T);
    TEST_EXPECT_ERROR(model_value_forward(lm, &th, &tv, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "no score head"), "%s", err.message);
    struct tensor tbad = tensor_f32(hidden, 2, bad);
    TEST_EXPECT_ERROR(model_value_forward(rm, &tbad, &tv, &err), SMELT_EINVAL, &err);
    int64_t three = 3;
    struct tensor tv3 = tensor_f32(values, 1, &three);
    TEST_EXPECT_ERROR(model_value_forward(rm, &th, &tv3, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "values"), "%s", err.message);
    int64_t one = 1;
    struct tensor tdh = tensor_f32(dh, 1, &one);
    TEST_EXPECT_ERROR(model_value_backward(rm, &th, &tv, NULL, &tdh, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "dhidden"), "%s", err.message);
    TEST_EXPECT_ERROR(model_value_backward(rm, &th, NULL, NULL, NULL, &err), SMELT_EINVAL, &err);
    free(hidden);
    model_free(rm);
    model_free(lm);
}
