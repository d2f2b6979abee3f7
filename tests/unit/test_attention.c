/* attention: forward and lse against a float64 reference, backward against float64
 * finite differences, GQA against repeated kv heads, packed sequences against each
 * other and against themselves alone, thread-count independence, accumulation, NULL
 * gradients, and the errors bad calls get. */
#include "tests/unit/testutil.h"

#include <omp.h>
#include <string.h>

#define MAX_CU 8

/* One call's shapes and packing: cu has nseq + 1 entries. */
struct attn_case {
    int64_t T, hq, hkv, D;
    int nseq;
    int32_t cu[MAX_CU];
};

static double case_scale(const struct attn_case *c) { return 1.0 / sqrt((double)c->D); }

/* ---- float64 reference ---- */

/* Naive causal softmax attention, one query row at a time. */
static void ref_attention(const struct attn_case *c, const double *q, const double *k,
                          const double *v, double *out, double *lse) {
    double scale = case_scale(c);
    int64_t group = c->hq / c->hkv, D = c->D;
    double *s = malloc((size_t)(c->T + 1) * sizeof *s);
    cr_assert(s);
    for (int sq = 0; sq < c->nseq; sq++)
        for (int64_t i = c->cu[sq]; i < c->cu[sq + 1]; i++)
            for (int64_t h = 0; h < c->hq; h++) {
                const double *qi = q + (i * c->hq + h) * D;
                int64_t kvh = h / group, start = c->cu[sq];
                double m = -INFINITY, sum = 0;
                for (int64_t j = start; j <= i; j++) {
                    double dotp = 0;
                    for (int64_t d = 0; d < D; d++) dotp += qi[d] * k[(j * c->hkv + kvh) * D + d];
                    s[j - start] = scale * dotp;
                    if (s[j - start] > m) m = s[j - start];
                }
                double *oi = out + (i * c->hq + h) * D;
                for (int64_t d = 0; d < D; d++) oi[d] = 0;
                for (int64_t j = start; j <= i; j++) {
                    double p = exp(s[j - start] - m);
                    sum += p;
                    for (int64_t d = 0; d < D; d++) oi[d] += p * v[(j * c->hkv + kvh) * D + d];
                }
                for (int64_t d = 0; d < D; d++) oi[d] /= sum;
                if (lse) lse[i * c->hq + h] = m + log(sum);
            }
    free(s);
}

/* ---- buffers for one case ---- */

struct attn_bufs {
    struct attn_case c;
    int64_t nq, nkv; /* elements of q-shaped and kv-shaped tensors */
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
    struct tensor tq, tk, tv, tdout, tout, tlse, tdq, tdk, tdv, tcu;
};

/* Random q, k, v, dout in [-range, range); outputs and gradients zeroed. b must not
 * move afterwards (tcu points into it). */
static void bufs_init(struct attn_bufs *b, const struct attn_case *c, struct test_rng *rng,
                      double range) {
    memset(b, 0, sizeof *b);
    b->c = *c;
    b->nq = c->T * c->hq * c->D;
    b->nkv = c->T * c->hkv * c->D;
    int64_t sq[3] = {c->T, c->hq, c->D}, skv[3] = {c->T, c->hkv, c->D}, sl[2] = {c->T, c->hq};
    int64_t scu[1] = {c->nseq + 1};
    b->q = test_rand_f32(rng, b->nq, -range, range);
    b->k = test_rand_f32(rng, b->nkv, -range, range);
    b->v = test_rand_f32(rng, b->nkv, -1, 1);
    b->dout = test_rand_f32(rng, b->nq, -1, 1);
    b->out = test_zeros_f32(b->nq);
    b->lse = test_zeros_f32(c->T * c->hq);
    b->dq = test_zeros_f32(b->nq);
    b->dk = test_zeros_f32(b->nkv);
    b->dv = test_zeros_f32(b->nkv);
    b->tq = tensor_f32(b->q, 3, sq), b->tk = tensor_f32(b->k, 3, skv), b->tv = tensor_f32(b->v, 3, skv);
    b->tdout = tensor_f32(b->dout, 3, sq), b->tout = tensor_f32(b->out, 3, sq);
    b->tlse = tensor_f32(b->lse, 2, sl);
    b->tdq = tensor_f32(b->dq, 3, sq), b->tdk = tensor_f32(b->dk, 3, skv), b->tdv = tensor_f32(b->dv, 3, skv);
    b->tcu = tensor_i32(b->c.cu, 1, scu);
}

static void bufs_free(struct attn_bufs *b) {
    free(b->q), free(b->k), free(b->v), free(b->dout), free(b->out), free(b->lse);
    free(b->dq), free(b->dk), free(b->dv);
}

static void bufs_forward(struct attn_bufs *b) {
    struct smelt_error err;
    TEST_OK(ops_attention(&b->tout, &b->tlse, &b->tq, &b->tk, &b->tv, &b->tcu,
                          (float)case_scale(&b->c), &err), &err);
}

/* Gradients of L = sum(dout * out) into the NULL-able outputs given. */
static void bufs_backward_into(struct attn_bufs *b, struct tensor *dq, struct tensor *dk,
                               struct tensor *dv) {
    struct smelt_error err;
    TEST_OK(ops_attention_backward(dq, dk, dv, &b->tdout, &b->tq, &b->tk, &b->tv, &b->tout,
                                   &b->tlse, &b->tcu, (float)case_scale(&b->c), &err), &err);
}

static void bufs_backward(struct attn_bufs *b) { bufs_backward_into(b, &b->tdq, &b->tdk, &b->tdv); }

static void expect_same_bits(const char *what, const float *got, const float *want, int64_t n) {
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (memcmp(&got[i], &want[i], sizeof *got) != 0) bad = i;
    cr_expect(bad < 0, "%s: element %lld is %.9g, expected the same bits as %.9g", what,
              (long long)bad, bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
}

static float *copy_f32(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    cr_assert(y);
    if (n > 0) memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* ---- forward against the reference ---- */

static const int64_t test_T[] = {1, 5, 17, 40};
static const int64_t test_D[] = {1, 3, 8, 16};
static const int64_t test_heads[][2] = {{1, 1}, {4, 2}, {6, 2}, {3, 1}};

/* Several sequences per T, with a length-1 and an empty one among them. */
static struct attn_case packed_case(int64_t T) {
    switch (T) {
    case 1: return (struct attn_case){.T = 1, .nseq = 2, .cu = {0, 0, 1}};
    case 5: return (struct attn_case){.T = 5, .nseq = 3, .cu = {0, 1, 1, 5}};
    case 17: return (struct attn_case){.T = 17, .nseq = 4, .cu = {0, 6, 6, 7, 17}};
    default: return (struct attn_case){.T = 40, .nseq = 5, .cu = {0, 13, 14, 14, 40, 40}};
    }
}

static struct attn_case single_case(int64_t T) {
    return (struct attn_case){.T = T, .nseq = 1, .cu = {0, (int32_t)T}};
}

static void check_forward(struct attn_case c, struct test_rng *rng, double range) {
    struct attn_bufs b;
    bufs_init(&b, &c, rng, range);
    bufs_forward(&b);
    double *q = test_to_f64(b.q, b.nq), *k = test_to_f64(b.k, b.nkv), *v = test_to_f64(b.v, b.nkv);
    double *out = malloc((size_t)b.nq * sizeof *out), *lse = malloc((size_t)(c.T * c.hq) * sizeof *lse);
    cr_assert(out && lse);
    ref_attention(&c, q, k, v, out, lse);
    char what[128];
    snprintf(what, sizeof what, "out T %lld Hq %lld Hkv %lld D %lld, %d sequences", (long long)c.T,
             (long long)c.hq, (long long)c.hkv, (long long)c.D, c.nseq);
    test_expect_close(what, b.out, out, b.nq, 1e-5, 1e-6);
    snprintf(what, sizeof what, "lse T %lld Hq %lld Hkv %lld D %lld, %d sequences", (long long)c.T,
             (long long)c.hq, (long long)c.hkv, (long long)c.D, c.nseq);
    test_expect_close(what, b.lse, lse, c.T * c.hq, 3e-6, 1e-5);
    free(q), free(k), free(v), free(out), free(lse);
    bufs_free(&b);
}

Test(attention, forward_matches_reference) {
    struct test_rng rng = {7};
    for (size_t ti = 0; ti < sizeof test_T / sizeof *test_T; ti++)
        for (size_t di = 0; di < sizeof test_D / sizeof *test_D; di++)
            for (size_t hi = 0; hi < sizeof test_heads / sizeof *test_heads; hi++)
                for (int packed = 0; packed < 2; packed++) {
                    struct attn_case c = packed ? packed_case(test_T[ti]) : single_case(test_T[ti]);
                    c.D = test_D[di], c.hq = test_heads[hi][0], c.hkv = test_heads[hi][1];
                    check_forward(c, &rng, 2.0);
                }
}

/* Scores in the thousands: exp without the max subtracted would overflow. */
Test(attention, forward_stable_with_large_scores) {
    struct test_rng rng = {8};
    struct attn_case c = packed_case(17);
    c.hq = 4, c.hkv = 2, c.D = 16;
    check_forward(c, &rng, 40.0);
}

/* A sequence's first token sees only itself: out = v, lse = its own score. */
Test(attention, first_token_copies_v) {
    struct test_rng rng = {9};
    struct attn_case c = packed_case(40);
    c.hq = 6, c.hkv = 2, c.D = 8;
    struct attn_bufs b;
    bufs_init(&b, &c, &rng, 1.0);
    bufs_forward(&b);
    for (int s = 0; s < c.nseq; s++) {
        if (c.cu[s] == c.cu[s + 1]) continue;
        int64_t t = c.cu[s];
        for (int64_t h = 0; h < c.hq; h++)
            expect_same_bits("first token out", b.out + (t * c.hq + h) * c.D,
                             b.v + (t * c.hkv + h / 3) * c.D, c.D);
    }
    bufs_free(&b);
}

/* ---- backward against finite differences ---- */

/* L = sum(w * attention(q, k, v)) in float64. */
struct fd_ctx {
    const struct attn_case *c;
    double *q, *k, *v, *w, *out;
    int64_t nq;
};

static double fd_loss(void *p) {
    struct fd_ctx *x = p;
    ref_attention(x->c, x->q, x->k, x->v, x->out, NULL);
    double s = 0;
    for (int64_t i = 0; i < x->nq; i++) s += x->w[i] * x->out[i];
    return s;
}

static void check_backward(struct attn_case c, struct test_rng *rng) {
    struct attn_bufs b;
    bufs_init(&b, &c, rng, 1.5);
    bufs_forward(&b);
    bufs_backward(&b);
    struct fd_ctx x = {&c, test_to_f64(b.q, b.nq), test_to_f64(b.k, b.nkv), test_to_f64(b.v, b.nkv),
                       test_to_f64(b.dout, b.nq), malloc((size_t)b.nq * sizeof(double)), b.nq};
    double *gq = malloc((size_t)b.nq * sizeof *gq), *gk = malloc((size_t)b.nkv * sizeof *gk);
    double *gv = malloc((size_t)b.nkv * sizeof *gv);
    cr_assert(x.out && gq && gk && gv);
    test_fd_gradient(fd_loss, &x, x.q, b.nq, 1e-5, gq);
    test_fd_gradient(fd_loss, &x, x.k, b.nkv, 1e-5, gk);
    test_fd_gradient(fd_loss, &x, x.v, b.nkv, 1e-5, gv);
    char what[128];
    const char *names[3] = {"dq", "dk", "dv"};
    const float *got[3] = {b.dq, b.dk, b.dv};
    const double *want[3] = {gq, gk, gv};
    for (int g = 0; g < 3; g++) {
        snprintf(what, sizeof what, "%s T %lld Hq %lld Hkv %lld D %lld, %d sequences", names[g],
                 (long long)c.T, (long long)c.hq, (long long)c.hkv, (long long)c.D, c.nseq);
        test_expect_close(what, got[g], want[g], g == 0 ? b.nq : b.nkv, 1e-4, 2e-5);
    }
    free(x.q), free(x.k), free(x.v), free(x.w), free(x.out), free(gq), free(gk), free(gv);
    bufs_free(&b);
}

Test(attention, backward_matches_finite_differences) {
    struct test_rng rng = {11};
    struct attn_case cases[] = {
        {.T = 5, .hq = 1, .hkv = 1, .D = 3, .nseq = 1, .cu = {0, 5}},
        {.T = 9, .hq = 4, .hkv = 2, .D = 4, .nseq = 4, .cu = {0, 3, 3, 4, 9}},
        {.T = 12, .hq = 6, .hkv = 2, .D = 8, .nseq = 4, .cu = {0, 1, 6, 6, 12}},
        {.T = 7, .hq = 3, .hkv = 1, .D = 1, .nseq = 1, .cu = {0, 7}},
        {.T = 17, .hq = 3, .hkv = 1, .D = 16, .nseq = 4, .cu = {0, 6, 6, 7, 17}},
        {.T = 1, .hq = 4, .hkv = 2, .D = 3, .nseq = 2, .cu = {0, 0, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_backward(cases[i], &rng);
}

/* ---- grouped-query attention ---- */

/* x [T, Hkv, D] -> [T, Hq, D] with kv head g repeated for the q heads reading it. */
static void repeat_heads(float *dst, const float *src, const struct attn_case *c) {
    int64_t group = c->hq / c->hkv;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t h = 0; h < c->hq; h++)
            memcpy(dst + (t * c->hq + h) * c->D, src + (t * c->hkv + h / group) * c->D,
                   (size_t)c->D * sizeof *dst);
}

/* dx [T, Hq, D] summed over each group -> [T, Hkv, D], in float64. */
static double *sum_groups(const float *src, const struct attn_case *c) {
    int64_t group = c->hq / c->hkv, n = c->T * c->hkv * c->D;
    double *dst = calloc((size_t)n, sizeof *dst);
    cr_assert(dst);
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t d = 0; d < c->D; d++)
                dst[(t * c->hkv + h / group) * c->D + d] += src[(t * c->hq + h) * c->D + d];
    return dst;
}

Test(attention, gqa_equals_mha_with_repeated_heads) {
    struct test_rng rng = {13};
    struct attn_case c = packed_case(17);
    c.hq = 6, c.hkv = 2, c.D = 8;
    struct attn_case m = c;
    m.hkv = c.hq;
    struct attn_bufs g, r;
    bufs_init(&g, &c, &rng, 2.0);
    bufs_init(&r, &m, &rng, 2.0);
    memcpy(r.q, g.q, (size_t)g.nq * sizeof *g.q);
    memcpy(r.dout, g.dout, (size_t)g.nq * sizeof *g.dout);
    repeat_heads(r.k, g.k, &c);
    repeat_heads(r.v, g.v, &c);
    bufs_forward(&g), bufs_backward(&g);
    bufs_forward(&r), bufs_backward(&r);
    expect_same_bits("GQA out vs MHA", g.out, r.out, g.nq);
    expect_same_bits("GQA lse vs MHA", g.lse, r.lse, c.T * c.hq);
    expect_same_bits("GQA dq vs MHA", g.dq, r.dq, g.nq);
    double *dk = sum_groups(r.dk, &c), *dv = sum_groups(r.dv, &c);
    test_expect_close("GQA dk vs MHA summed over the group", g.dk, dk, g.nkv, 1e-5, 1e-6);
    test_expect_close("GQA dv vs MHA summed over the group", g.dv, dv, g.nkv, 1e-5, 1e-6);
    free(dk), free(dv);
    bufs_free(&g), bufs_free(&r);
}

/* ---- packed sequences ---- */

/* Expects rows [t0, t1) of every output and gradient of a and b to have the same bits;
 * a's row t0 + i is compared with b's row b_t0 + i. */
static void expect_same_tokens(const char *what, const struct attn_bufs *a, const struct attn_bufs *b,
                               int64_t t0, int64_t t1, int64_t b_t0) {
    const struct attn_case *c = &a->c;
    int64_t n = t1 - t0, qw = c->hq * c->D, kw = c->hkv * c->D;
    char msg[128];
    snprintf(msg, sizeof msg, "%s: out of tokens [%lld, %lld)", what, (long long)t0, (long long)t1);
    expect_same_bits(msg, a->out + t0 * qw, b->out + b_t0 * qw, n * qw);
    snprintf(msg, sizeof msg, "%s: lse of tokens [%lld, %lld)", what, (long long)t0, (long long)t1);
    expect_same_bits(msg, a->lse + t0 * c->hq, b->lse + b_t0 * c->hq, n * c->hq);
    snprintf(msg, sizeof msg, "%s: dq of tokens [%lld, %lld)", what, (long long)t0, (long long)t1);
    expect_same_bits(msg, a->dq + t0 * qw, b->dq + b_t0 * qw, n * qw);
    snprintf(msg, sizeof msg, "%s: dk of tokens [%lld, %lld)", what, (long long)t0, (long long)t1);
    expect_same_bits(msg, a->dk + t0 * kw, b->dk + b_t0 * kw, n * kw);
    snprintf(msg, sizeof msg, "%s: dv of tokens [%lld, %lld)", what, (long long)t0, (long long)t1);
    expect_same_bits(msg, a->dv + t0 * kw, b->dv + b_t0 * kw, n * kw);
}

Test(attention, packed_sequences_are_independent) {
    struct test_rng rng = {17};
    struct attn_case c = packed_case(40); /* 13, 1, empty, 26, empty */
    c.hq = 4, c.hkv = 2, c.D = 8;
    struct attn_bufs a, b;
    bufs_init(&a, &c, &rng, 2.0);
    bufs_init(&b, &c, &rng, 2.0);
    memcpy(b.q, a.q, (size_t)a.nq * sizeof *a.q), memcpy(b.dout, a.dout, (size_t)a.nq * sizeof *a.q);
    memcpy(b.k, a.k, (size_t)a.nkv * sizeof *a.k), memcpy(b.v, a.v, (size_t)a.nkv * sizeof *a.v);
    /* b differs from a only in sequence 3, tokens [14, 40). */
    int64_t t0 = c.cu[3], t1 = c.cu[4];
    for (int64_t i = t0 * c.hq * c.D; i < t1 * c.hq * c.D; i++) b.q[i] += 0.5f, b.dout[i] -= 0.25f;
    for (int64_t i = t0 * c.hkv * c.D; i < t1 * c.hkv * c.D; i++) b.k[i] *= -1.0f, b.v[i] += 1.0f;
    bufs_forward(&a), bufs_backward(&a);
    bufs_forward(&b), bufs_backward(&b);
    expect_same_tokens("untouched sequences", &a, &b, 0, t0, 0);
    int64_t changed = 0;
    for (int64_t i = t0 * c.hq * c.D; i < t1 * c.hq * c.D; i++) changed += a.out[i] != b.out[i];
    cr_expect(changed > 0, "changing sequence 3 changed none of its outputs");
    bufs_free(&a), bufs_free(&b);
}

/* Runs tokens [t0, t1) of p as one sequence of their own. */
static void run_alone(struct attn_bufs *alone, const struct attn_bufs *p, int64_t t0, int64_t t1,
                      struct test_rng *rng) {
    struct attn_case c = p->c;
    c.T = t1 - t0, c.nseq = 1, c.cu[0] = 0, c.cu[1] = (int32_t)c.T;
    bufs_init(alone, &c, rng, 1.0);
    int64_t qw = c.hq * c.D, kw = c.hkv * c.D;
    memcpy(alone->q, p->q + t0 * qw, (size_t)(c.T * qw) * sizeof(float));
    memcpy(alone->dout, p->dout + t0 * qw, (size_t)(c.T * qw) * sizeof(float));
    memcpy(alone->k, p->k + t0 * kw, (size_t)(c.T * kw) * sizeof(float));
    memcpy(alone->v, p->v + t0 * kw, (size_t)(c.T * kw) * sizeof(float));
    bufs_forward(alone), bufs_backward(alone);
}

Test(attention, packed_equals_each_sequence_alone) {
    struct test_rng rng = {19};
    struct attn_case c = packed_case(40);
    c.hq = 6, c.hkv = 2, c.D = 3;
    struct attn_bufs p;
    bufs_init(&p, &c, &rng, 2.0);
    bufs_forward(&p), bufs_backward(&p);
    for (int s = 0; s < c.nseq; s++) {
        if (c.cu[s] == c.cu[s + 1]) continue;
        struct attn_bufs alone;
        run_alone(&alone, &p, c.cu[s], c.cu[s + 1], &rng);
        expect_same_tokens("packed vs alone", &p, &alone, c.cu[s], c.cu[s + 1], 0);
        bufs_free(&alone);
    }
    bufs_free(&p);
}

/* ---- determinism, accumulation, optional outputs ---- */

Test(attention, same_bits_for_any_thread_count) {
    struct test_rng rng = {23};
    struct attn_case c = packed_case(40);
    c.hq = 6, c.hkv = 2, c.D = 16;
    struct attn_bufs one, many;
    bufs_init(&one, &c, &rng, 2.0);
    bufs_init(&many, &c, &rng, 2.0);
    memcpy(many.q, one.q, (size_t)one.nq * sizeof *one.q), memcpy(many.dout, one.dout, (size_t)one.nq * sizeof *one.q);
    memcpy(many.k, one.k, (size_t)one.nkv * sizeof *one.k), memcpy(many.v, one.v, (size_t)one.nkv * sizeof *one.v);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    bufs_forward(&one), bufs_backward(&one);
    omp_set_num_threads(3);
    bufs_forward(&many), bufs_backward(&many);
    omp_set_num_threads(saved);
    expect_same_tokens("1 thread vs 3", &many, &one, 0, c.T, 0);
    bufs_free(&one), bufs_free(&many);
}

Test(attention, backward_accumulates) {
    struct test_rng rng = {29};
    struct attn_case c = packed_case(17);
    c.hq = 4, c.hkv = 2, c.D = 8;
    struct attn_bufs b;
    bufs_init(&b, &c, &rng, 2.0);
    bufs_forward(&b), bufs_backward(&b);
    float *fresh[3] = {copy_f32(b.dq, b.nq), copy_f32(b.dk, b.nkv), copy_f32(b.dv, b.nkv)};
    float *grads[3] = {b.dq, b.dk, b.dv};
    double *want[3];
    for (int g = 0; g < 3; g++) {
        int64_t n = g == 0 ? b.nq : b.nkv;
        want[g] = malloc((size_t)n * sizeof(double));
        cr_assert(want[g]);
        for (int64_t i = 0; i < n; i++) {
            grads[g][i] = (float)test_rng_uniform(&rng, -3, 3);
            want[g][i] = (double)grads[g][i] + fresh[g][i];
        }
    }
    bufs_backward(&b);
    test_expect_close("accumulated dq", b.dq, want[0], b.nq, 1e-6, 1e-7);
    test_expect_close("accumulated dk", b.dk, want[1], b.nkv, 1e-6, 1e-7);
    test_expect_close("accumulated dv", b.dv, want[2], b.nkv, 1e-6, 1e-7);
    for (int g = 0; g < 3; g++) free(fresh[g]), free(want[g]);
    bufs_free(&b);
}

Test(attention, null_gradients_and_lse_are_skipped) {
    struct test_rng rng = {31};
    struct attn_case c = packed_case(17);
    c.hq = 6, c.hkv = 2, c.D = 3;
    struct attn_bufs b;
    bufs_init(&b, &c, &rng, 2.0);
    bufs_forward(&b), bufs_backward(&b);
    float *full[3] = {copy_f32(b.dq, b.nq), copy_f32(b.dk, b.nkv), copy_f32(b.dv, b.nkv)};
    float *out = copy_f32(b.out, b.nq);
    struct smelt_error err;
    TEST_OK(ops_attention(&b.tout, NULL, &b.tq, &b.tk, &b.tv, &b.tcu, (float)case_scale(&c), &err), &err);
    expect_same_bits("out without lse", b.out, out, b.nq);

    struct tensor *grads[3] = {&b.tdq, &b.tdk, &b.tdv};
    const char *names[3] = {"dq alone", "dk alone", "dv alone"};
    for (int only = 0; only < 3; only++) {
        memset(b.dq, 0, (size_t)b.nq * sizeof(float));
        memset(b.dk, 0, (size_t)b.nkv * sizeof(float));
        memset(b.dv, 0, (size_t)b.nkv * sizeof(float));
        bufs_backward_into(&b, only == 0 ? grads[0] : NULL, only == 1 ? grads[1] : NULL,
                           only == 2 ? grads[2] : NULL);
        for (int g = 0; g < 3; g++) {
            int64_t n = g == 0 ? b.nq : b.nkv;
            float *zeros = test_zeros_f32(n);
            expect_same_bits(names[only], (float *)grads[g]->data, g == only ? full[g] : zeros, n);
            free(zeros);
        }
    }
    bufs_backward_into(&b, NULL, NULL, NULL);
    for (int g = 0; g < 3; g++) free(full[g]);
    free(out);
    bufs_free(&b);
}

/* No tokens, in one empty sequence or several: both calls succeed and write nothing.
 * Every tensor views a guard buffer of sentinels that must keep its bits (NULL data
 * would hide a write as a crash only where the address faults). */
Test(attention, zero_tokens) {
    enum { GUARD = 16, N_BUFS = 9 };
    static const char *const names[N_BUFS] = {"q", "k", "v", "dout", "out", "lse", "dq", "dk", "dv"};
    static const struct attn_case cases[] = {
        {.T = 0, .hq = 2, .hkv = 1, .D = 3, .nseq = 1, .cu = {0, 0}},
        {.T = 0, .hq = 4, .hkv = 2, .D = 8, .nseq = 3, .cu = {0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct attn_case c = cases[i];
        float guard[N_BUFS][GUARD], sentinel[GUARD];
        for (int j = 0; j < GUARD; j++) sentinel[j] = -7.25f - (float)j;
        for (int b = 0; b < N_BUFS; b++) memcpy(guard[b], sentinel, sizeof sentinel);
        int64_t sq[3] = {0, c.hq, c.D}, skv[3] = {0, c.hkv, c.D}, sl[2] = {0, c.hq}, scu[1] = {c.nseq + 1};
        struct tensor q = tensor_f32(guard[0], 3, sq), k = tensor_f32(guard[1], 3, skv);
        struct tensor v = tensor_f32(guard[2], 3, skv), dout = tensor_f32(guard[3], 3, sq);
        struct tensor out = tensor_f32(guard[4], 3, sq), lse = tensor_f32(guard[5], 2, sl);
        struct tensor dq = tensor_f32(guard[6], 3, sq), dk = tensor_f32(guard[7], 3, skv);
        struct tensor dv = tensor_f32(guard[8], 3, skv), cu = tensor_i32(c.cu, 1, scu);
        struct smelt_error err;
        TEST_OK(ops_attention(&out, &lse, &q, &k, &v, &cu, (float)case_scale(&c), &err), &err);
        TEST_OK(ops_attention_backward(&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse, &cu, (float)case_scale(&c),
                                       &err), &err);
        for (int b = 0; b < N_BUFS; b++) {
            char what[64];
            snprintf(what, sizeof what, "case %zu: %s of a zero-token call", i, names[b]);
            expect_same_bits(what, guard[b], sentinel, GUARD);
        }
    }
}

/* ---- errors ---- */

#define EXPECT_MESSAGE(err, text) \
    cr_expect(strstr((err).message, (text)) != NULL, "message should mention \"%s\": %s", (text), (err).message)

Test(attention, bad_cu_seqlens) {
    struct test_rng rng = {37};
    struct attn_case c = {.T = 5, .hq = 4, .hkv = 2, .D = 3, .nseq = 2, .cu = {0, 2, 5}};
    struct attn_bufs b;
    bufs_init(&b, &c, &rng, 1.0);
    bufs_forward(&b);
    struct smelt_error err;
    float scale = (float)case_scale(&c);
    struct {
        int32_t cu[4];
        int64_t n;
        const char *says;
    } bad[] = {
        {{1, 2, 5}, 3, "cu_seqlens[0] is 1"},
        {{0, 3, 2, 5}, 4, "decreases at index 2"},
        {{0, 2, 4}, 3, "ends at 4"},
        {{0, 2, 6}, 3, "ends at 6"},
        {{0}, 1, "at least 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct tensor cu = tensor_i32(bad[i].cu, 1, &bad[i].n);
        TEST_EXPECT_ERROR(ops_attention(&b.tout, &b.tlse, &b.tq, &b.tk, &b.tv, &cu, scale, &err), SMELT_EINVAL, &err);
        EXPECT_MESSAGE(err, bad[i].says);
        TEST_EXPECT_ERROR(ops_attention_backward(&b.tdq, &b.tdk, &b.tdv, &b.tdout, &b.tq, &b.tk, &b.tv,
                                                 &b.tout, &b.tlse, &cu, scale, &err), SMELT_EINVAL, &err);
        EXPECT_MESSAGE(err, bad[i].says);
    }
    float fcu[3] = {0, 2, 5};
    int64_t n3 = 3;
    struct tensor cu_f32 = tensor_f32(fcu, 1, &n3);
    TEST_EXPECT_ERROR(ops_attention(&b.tout, &b.tlse, &b.tq, &b.tk, &b.tv, &cu_f32, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "cu_seqlens has dtype f32");
    bufs_free(&b);
}

Test(attention, bad_shapes_and_missing_lse) {
    struct test_rng rng = {41};
    struct attn_case c = {.T = 5, .hq = 4, .hkv = 2, .D = 3, .nseq = 1, .cu = {0, 5}};
    struct attn_bufs b;
    bufs_init(&b, &c, &rng, 1.0);
    bufs_forward(&b);
    struct smelt_error err;
    float scale = (float)case_scale(&c);

    int64_t s3heads[3] = {5, 3, 3};
    struct tensor q3 = tensor_f32(b.q, 3, s3heads), out3 = tensor_f32(b.out, 3, s3heads);
    struct tensor lse3 = tensor_f32(b.lse, 2, (int64_t[]){5, 3});
    TEST_EXPECT_ERROR(ops_attention(&out3, &lse3, &q3, &b.tk, &b.tv, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "multiple of kv heads");

    struct tensor lse_small = tensor_f32(b.lse, 2, (int64_t[]){5, 3});
    TEST_EXPECT_ERROR(ops_attention(&b.tout, &lse_small, &b.tq, &b.tk, &b.tv, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "lse has shape [5, 3]");
    TEST_EXPECT_ERROR(ops_attention_backward(&b.tdq, &b.tdk, &b.tdv, &b.tdout, &b.tq, &b.tk, &b.tv,
                                             &b.tout, &lse_small, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "lse has shape [5, 3]");

    TEST_EXPECT_ERROR(ops_attention_backward(&b.tdq, &b.tdk, &b.tdv, &b.tdout, &b.tq, &b.tk, &b.tv,
                                             &b.tout, NULL, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "lse is missing");

    struct tensor dk_wrong = tensor_f32(b.dq, 3, (int64_t[]){5, 4, 3});
    TEST_EXPECT_ERROR(ops_attention_backward(&b.tdq, &dk_wrong, &b.tdv, &b.tdout, &b.tq, &b.tk, &b.tv,
                                             &b.tout, &b.tlse, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "dk has shape [5, 4, 3]");

    struct tensor k_short = tensor_f32(b.k, 3, (int64_t[]){4, 2, 3});
    TEST_EXPECT_ERROR(ops_attention(&b.tout, &b.tlse, &b.tq, &k_short, &k_short, &b.tcu, scale, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "share tokens");

    TEST_EXPECT_ERROR(ops_attention(&b.tout, &b.tlse, &b.tq, &b.tk, &b.tv, &b.tcu, 0.0f, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "scale");
    bufs_free(&b);
}
