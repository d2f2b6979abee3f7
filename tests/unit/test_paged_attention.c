/* paged KV cache: sequences written to a pool through shuffled block tables with
 * ops_kv_append, then attended with ops_paged_attention as a full prefill, chunks and
 * decode steps, must give ops_attention's rows for the same tokens; a float64
 * reference; appends write exactly the slots given; several block sizes; the same bits
 * for any thread count; and the errors bad calls get. */
#include "tests/unit/testutil.h"

#include <omp.h>
#include <string.h>

#define MAX_SEQ 8

#define EXPECT_MESSAGE(err, text) \
    cr_expect(strstr((err).message, (text)) != NULL, "message should mention \"%s\": %s", (text), (err).message)

/* The sequences and the cache's shape. */
struct paged_case {
    int nseq;
    int32_t len[MAX_SEQ];
    int64_t hq, hkv, D, block_size;
};

/* Every token of every sequence, packed, with ops_attention's output for it, and the
 * same keys and values scattered over a pool of blocks. */
struct paged_setup {
    struct paged_case c;
    int64_t T;                /* tokens of all sequences */
    int32_t cu[MAX_SEQ + 1];  /* where each sequence starts in the packed arrays */
    int64_t n_blocks, max_blocks, row;  /* row: Hkv * D, one slot's floats */
    float *q, *k, *v;         /* [T, Hq, D], [T, Hkv, D], [T, Hkv, D] */
    float *ref;               /* ops_attention(q, k, v) [T, Hq, D] */
    float *k_cache, *v_cache; /* [n_blocks, block_size, Hkv, D]; NaN where nothing was written */
    int32_t *tables;          /* [nseq, max_blocks]; entries past a sequence's blocks are junk */
    int32_t *slots;           /* [T]: the slot of each packed token */
    struct tensor tk_cache, tv_cache, ttables;
};

static double case_scale(const struct paged_case *c) { return 1.0 / sqrt((double)c->D); }

static int64_t blocks_for(int64_t len, int64_t block_size) { return (len + block_size - 1) / block_size; }

/* Blocks drawn from a shuffled pool (with spare blocks nobody owns), so neighbouring
 * positions of a sequence sit in unrelated blocks. */
static void assign_blocks(struct paged_setup *p, struct test_rng *rng) {
    const struct paged_case *c = &p->c;
    int64_t used = 0, longest = 0;
    for (int s = 0; s < c->nseq; s++) {
        int64_t b = blocks_for(c->len[s], c->block_size);
        used += b;
        if (b > longest) longest = b;
    }
    p->n_blocks = used + 3;
    p->max_blocks = longest + 2;
    int32_t *perm = malloc((size_t)p->n_blocks * sizeof *perm);
    p->tables = malloc((size_t)(c->nseq * p->max_blocks) * sizeof *p->tables);
    cr_assert(perm && p->tables);
    for (int64_t i = 0; i < p->n_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = p->n_blocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(test_rng_next(rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int64_t next = 0;
    for (int s = 0; s < c->nseq; s++) {
        int32_t *row = p->tables + s * p->max_blocks;
        int64_t b = blocks_for(c->len[s], c->block_size);
        for (int64_t j = 0; j < p->max_blocks; j++)
            row[j] = j < b ? perm[next++] : (j % 2 ? -1 : (int32_t)(p->n_blocks + 7)); /* ignored */
    }
    free(perm);
}

static void setup_init(struct paged_setup *p, const struct paged_case *c, struct test_rng *rng) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    for (int s = 0; s < c->nseq; s++) p->cu[s + 1] = p->cu[s] + c->len[s];
    p->T = p->cu[c->nseq];
    p->row = c->hkv * c->D;
    p->q = test_rand_f32(rng, p->T * c->hq * c->D, -2, 2);
    p->k = test_rand_f32(rng, p->T * p->row, -2, 2);
    p->v = test_rand_f32(rng, p->T * p->row, -1, 1);
    p->ref = test_zeros_f32(p->T * c->hq * c->D);
    struct smelt_error err;
    int64_t sq[3] = {p->T, c->hq, c->D}, skv[3] = {p->T, c->hkv, c->D}, scu[1] = {c->nseq + 1};
    struct tensor tq = tensor_f32(p->q, 3, sq), tk = tensor_f32(p->k, 3, skv), tv = tensor_f32(p->v, 3, skv);
    struct tensor tout = tensor_f32(p->ref, 3, sq), tcu = tensor_i32(p->cu, 1, scu);
    TEST_OK(ops_attention(&tout, NULL, &tq, &tk, &tv, &tcu, (float)case_scale(c), &err), &err);

    assign_blocks(p, rng);
    int64_t cache_floats = p->n_blocks * c->block_size * p->row;
    p->k_cache = test_zeros_f32(cache_floats);
    p->v_cache = test_zeros_f32(cache_floats);
    for (int64_t i = 0; i < cache_floats; i++) p->k_cache[i] = p->v_cache[i] = NAN; /* read = caught */
    int64_t scache[4] = {p->n_blocks, c->block_size, c->hkv, c->D}, stab[2] = {c->nseq, p->max_blocks};
    p->tk_cache = tensor_f32(p->k_cache, 4, scache);
    p->tv_cache = tensor_f32(p->v_cache, 4, scache);
    p->ttables = tensor_i32(p->tables, 2, stab);
    p->slots = malloc((size_t)(p->T > 0 ? p->T : 1) * sizeof *p->slots);
    cr_assert(p->slots);
    for (int s = 0; s < c->nseq; s++)
        for (int32_t pos = 0; pos < c->len[s]; pos++) {
            int32_t block = p->tables[s * p->max_blocks + pos / c->block_size];
            p->slots[p->cu[s] + pos] = block * (int32_t)c->block_size + pos % (int32_t)c->block_size;
        }
}

/* Writes packed tokens [from, to) to the cache. */
static void setup_append(struct paged_setup *p, int64_t from, int64_t to) {
    struct smelt_error err;
    int64_t skv[3] = {to - from, p->c.hkv, p->c.D}, ss[1] = {to - from};
    struct tensor tk = tensor_f32(p->k + from * p->row, 3, skv), tv = tensor_f32(p->v + from * p->row, 3, skv);
    struct tensor ts = tensor_i32(p->slots + from, 1, ss);
    TEST_OK(ops_kv_append(&p->tk_cache, &p->tv_cache, &tk, &tv, &ts, &err), &err);
}

/* Everything in, in two calls (the second starts mid-sequence). */
static void setup_fill(struct paged_setup *p) {
    setup_append(p, 0, p->T / 2);
    setup_append(p, p->T / 2, p->T);
}

static void setup_free(struct paged_setup *p) {
    free(p->q), free(p->k), free(p->v), free(p->ref);
    free(p->k_cache), free(p->v_cache), free(p->tables), free(p->slots);
}

/* One paged call: sequence s has a context of ctx[s] tokens and queries its last n[s]. */
struct paged_query {
    int32_t ctx[MAX_SEQ], n[MAX_SEQ];
    int32_t cu_q[MAX_SEQ + 1];
    int64_t T;
    float *q, *out;
    struct tensor tq, tout, tcu_q, tctx;
};

static void query_init(struct paged_query *pq, const struct paged_setup *p, const int32_t *ctx,
                       const int32_t *n) {
    const struct paged_case *c = &p->c;
    int64_t width = c->hq * c->D;
    memset(pq, 0, sizeof *pq);
    for (int s = 0; s < c->nseq; s++) {
        pq->ctx[s] = ctx[s], pq->n[s] = n[s];
        pq->cu_q[s + 1] = pq->cu_q[s] + n[s];
    }
    pq->T = pq->cu_q[c->nseq];
    pq->q = test_zeros_f32(pq->T * width);
    pq->out = test_zeros_f32(pq->T * width);
    for (int s = 0; s < c->nseq; s++) {
        int64_t first = p->cu[s] + ctx[s] - n[s]; /* packed index of the first query */
        memcpy(pq->q + pq->cu_q[s] * width, p->q + first * width, (size_t)(n[s] * width) * sizeof(float));
    }
    int64_t sq[3] = {pq->T, c->hq, c->D}, scu[1] = {c->nseq + 1}, sctx[1] = {c->nseq};
    pq->tq = tensor_f32(pq->q, 3, sq);
    pq->tout = tensor_f32(pq->out, 3, sq);
    pq->tcu_q = tensor_i32(pq->cu_q, 1, scu);
    pq->tctx = tensor_i32(pq->ctx, 1, sctx);
}

static void query_free(struct paged_query *pq) { free(pq->q), free(pq->out); }

static int query_run(struct paged_query *pq, struct paged_setup *p, struct smelt_error *err) {
    return ops_paged_attention(&pq->tout, &pq->tq, &p->tk_cache, &p->tv_cache, &p->ttables, &pq->tcu_q,
                               &pq->tctx, (float)case_scale(&p->c), err);
}

/* The rows of ops_attention's output for the query tokens, in query order. */
static double *query_expected(const struct paged_query *pq, const struct paged_setup *p) {
    int64_t width = p->c.hq * p->c.D;
    double *want = malloc((size_t)(pq->T * width > 0 ? pq->T * width : 1) * sizeof *want);
    cr_assert(want);
    for (int s = 0; s < p->c.nseq; s++)
        for (int32_t i = 0; i < pq->n[s]; i++) {
            int64_t src = p->cu[s] + pq->ctx[s] - pq->n[s] + i, dst = pq->cu_q[s] + i;
            for (int64_t e = 0; e < width; e++) want[dst * width + e] = p->ref[src * width + e];
        }
    return want;
}

enum query_kind { QUERY_PREFILL, QUERY_LAST_CHUNK, QUERY_MID_CHUNK, QUERY_DECODE, QUERY_MID_DECODE };
static const char *query_kind_names[] = {"prefill", "last chunk", "middle chunk", "decode", "middle decode"};

/* The (context, queries) of one sequence of length len for a kind of call. A middle
 * chunk or decode step stops before the end of what the cache holds. */
static void query_shape(enum query_kind kind, int32_t len, int32_t *ctx, int32_t *n) {
    switch (kind) {
    case QUERY_PREFILL: *ctx = len, *n = len; break;
    case QUERY_LAST_CHUNK: *ctx = len, *n = len - len / 2; break;
    case QUERY_MID_CHUNK: *ctx = len - len / 4, *n = len - len / 4 - len / 3; break;
    case QUERY_DECODE: *ctx = len, *n = len > 0; break;
    case QUERY_MID_DECODE: *ctx = len > 0 ? len / 2 + 1 : 0, *n = len > 0; break;
    }
}

static void check_kind(struct paged_setup *p, enum query_kind kind) {
    int32_t ctx[MAX_SEQ], n[MAX_SEQ];
    for (int s = 0; s < p->c.nseq; s++) query_shape(kind, p->c.len[s], &ctx[s], &n[s]);
    struct paged_query pq;
    query_init(&pq, p, ctx, n);
    struct smelt_error err;
    TEST_OK(query_run(&pq, p, &err), &err);
    double *want = query_expected(&pq, p);
    char what[160];
    snprintf(what, sizeof what, "%s, Hq %lld Hkv %lld D %lld block_size %lld", query_kind_names[kind],
             (long long)p->c.hq, (long long)p->c.hkv, (long long)p->c.D, (long long)p->c.block_size);
    test_expect_close(what, pq.out, want, pq.T * p->c.hq * p->c.D, 1e-5, 1e-5);
    free(want);
    query_free(&pq);
}

static void check_all_kinds(const struct paged_case *c, uint64_t seed) {
    struct test_rng rng = {seed};
    struct paged_setup p;
    setup_init(&p, c, &rng);
    setup_fill(&p);
    for (int kind = QUERY_PREFILL; kind <= QUERY_MID_DECODE; kind++) check_kind(&p, (enum query_kind)kind);
    setup_free(&p);
}

/* An empty sequence, one of a single token, and ones spanning several blocks. */
static const struct paged_case base_case = {.nseq = 5, .len = {7, 0, 37, 1, 13}};

/* ---- against ops_attention ---- */

Test(paged_attention, matches_attention) {
    static const int64_t heads[][2] = {{4, 2}, {2, 2}};
    static const int64_t dims[] = {8, 16};
    static const int64_t block_sizes[] = {16, 4};
    uint64_t seed = 1;
    for (size_t h = 0; h < 2; h++)
        for (size_t d = 0; d < 2; d++)
            for (size_t b = 0; b < 2; b++) {
                struct paged_case c = base_case;
                c.hq = heads[h][0], c.hkv = heads[h][1], c.D = dims[d], c.block_size = block_sizes[b];
                check_all_kinds(&c, seed++);
            }
}

/* Block sizes of one position, odd ones, and one larger than any sequence. */
Test(paged_attention, other_block_sizes) {
    static const int64_t block_sizes[] = {1, 4, 5, 64};
    for (size_t b = 0; b < sizeof block_sizes / sizeof *block_sizes; b++) {
        struct paged_case c = base_case;
        c.hq = 6, c.hkv = 2, c.D = 3, c.block_size = block_sizes[b];
        check_all_kinds(&c, 100 + b);
    }
}

/* ---- float64 reference ---- */

/* Causal attention of one query at position pos of sequence s, straight from the
 * packed float inputs in double. */
static void ref_row(const struct paged_setup *p, int s, int64_t pos, int64_t h, double *out) {
    const struct paged_case *c = &p->c;
    int64_t D = c->D, kvh = h / (c->hq / c->hkv), start = p->cu[s];
    const float *qi = p->q + ((start + pos) * c->hq + h) * D;
    double *score = malloc((size_t)(pos + 1) * sizeof *score), m = -INFINITY, sum = 0;
    cr_assert(score);
    for (int64_t j = 0; j <= pos; j++) {
        double dotp = 0;
        for (int64_t e = 0; e < D; e++) dotp += (double)qi[e] * p->k[((start + j) * c->hkv + kvh) * D + e];
        score[j] = case_scale(c) * dotp;
        if (score[j] > m) m = score[j];
    }
    for (int64_t e = 0; e < D; e++) out[e] = 0;
    for (int64_t j = 0; j <= pos; j++) {
        double w = exp(score[j] - m);
        sum += w;
        for (int64_t e = 0; e < D; e++) out[e] += w * p->v[((start + j) * c->hkv + kvh) * D + e];
    }
    for (int64_t e = 0; e < D; e++) out[e] /= sum;
    free(score);
}

Test(paged_attention, matches_float64_reference) {
    struct test_rng rng = {200};
    struct paged_case c = {.nseq = 3, .len = {9, 4, 1}, .hq = 4, .hkv = 2, .D = 5, .block_size = 4};
    struct paged_setup p;
    setup_init(&p, &c, &rng);
    setup_fill(&p);
    for (int kind = QUERY_PREFILL; kind <= QUERY_MID_DECODE; kind++) {
        int32_t ctx[MAX_SEQ], n[MAX_SEQ];
        for (int s = 0; s < c.nseq; s++) query_shape((enum query_kind)kind, c.len[s], &ctx[s], &n[s]);
        struct paged_query pq;
        query_init(&pq, &p, ctx, n);
        struct smelt_error err;
        TEST_OK(query_run(&pq, &p, &err), &err);
        double *want = malloc((size_t)(pq.T * c.hq * c.D + 1) * sizeof *want);
        cr_assert(want);
        for (int s = 0; s < c.nseq; s++)
            for (int32_t i = 0; i < n[s]; i++)
                for (int64_t h = 0; h < c.hq; h++)
                    ref_row(&p, s, ctx[s] - n[s] + i, h, want + ((pq.cu_q[s] + i) * c.hq + h) * c.D);
        test_expect_close(query_kind_names[kind], pq.out, want, pq.T * c.hq * c.D, 1e-5, 1e-6);
        free(want);
        query_free(&pq);
    }
    setup_free(&p);
}

/* ---- appends ---- */

static void expect_row(const char *what, const float *got, const float *want, int64_t n) {
    cr_expect(memcmp(got, want, (size_t)n * sizeof *got) == 0, "%s differs", what);
}

/* Exactly the given slots change; negative slots are skipped; a repeated slot keeps
 * the last token's row. */
Test(paged_attention, kv_append_writes_exactly_the_slots) {
    struct test_rng rng = {300};
    enum { BLOCKS = 3, BLOCK_SIZE = 4, HKV = 2, D = 3, ROW = HKV * D, SLOTS = BLOCKS * BLOCK_SIZE, T = 6 };
    float k_cache[SLOTS * ROW], v_cache[SLOTS * ROW];
    for (int i = 0; i < SLOTS * ROW; i++) k_cache[i] = -7.0f, v_cache[i] = -9.0f;
    float *k = test_rand_f32(&rng, T * ROW, -1, 1), *v = test_rand_f32(&rng, T * ROW, -1, 1);
    int32_t slots[T] = {5, -1, 0, 11, -3, 5}; /* slot 5 twice: token 5 wins */
    int64_t scache[4] = {BLOCKS, BLOCK_SIZE, HKV, D}, skv[3] = {T, HKV, D}, ss[1] = {T};
    struct tensor tkc = tensor_f32(k_cache, 4, scache), tvc = tensor_f32(v_cache, 4, scache);
    struct tensor tk = tensor_f32(k, 3, skv), tv = tensor_f32(v, 3, skv), ts = tensor_i32(slots, 1, ss);
    struct smelt_error err;
    TEST_OK(ops_kv_append(&tkc, &tvc, &tk, &tv, &ts, &err), &err);
    int writer[SLOTS];
    for (int s = 0; s < SLOTS; s++) writer[s] = -1;
    writer[5] = 5, writer[0] = 2, writer[11] = 3;
    float k_untouched[ROW], v_untouched[ROW];
    for (int e = 0; e < ROW; e++) k_untouched[e] = -7.0f, v_untouched[e] = -9.0f;
    for (int s = 0; s < SLOTS; s++) {
        char what[64];
        snprintf(what, sizeof what, "k_cache slot %d", s);
        expect_row(what, k_cache + s * ROW, writer[s] >= 0 ? k + writer[s] * ROW : k_untouched, ROW);
        snprintf(what, sizeof what, "v_cache slot %d", s);
        expect_row(what, v_cache + s * ROW, writer[s] >= 0 ? v + writer[s] * ROW : v_untouched, ROW);
    }

    /* No tokens: nothing to do. */
    int64_t s0[3] = {0, HKV, D}, n0[1] = {0};
    struct tensor k0 = tensor_f32(k, 3, s0), sl0 = tensor_i32(slots, 1, n0);
    TEST_OK(ops_kv_append(&tkc, &tvc, &k0, &k0, &sl0, &err), &err);
    free(k), free(v);
}

/* ---- determinism ---- */

Test(paged_attention, same_bits_for_any_thread_count) {
    struct test_rng rng = {400};
    struct paged_case c = base_case;
    c.hq = 4, c.hkv = 2, c.D = 16, c.block_size = 4;
    struct paged_setup p;
    setup_init(&p, &c, &rng);
    setup_fill(&p);
    int32_t ctx[MAX_SEQ], n[MAX_SEQ];
    for (int s = 0; s < c.nseq; s++) query_shape(QUERY_PREFILL, c.len[s], &ctx[s], &n[s]);
    struct paged_query one, many;
    query_init(&one, &p, ctx, n);
    query_init(&many, &p, ctx, n);
    struct smelt_error err;
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    TEST_OK(query_run(&one, &p, &err), &err);
    omp_set_num_threads(3);
    TEST_OK(query_run(&many, &p, &err), &err);
    omp_set_num_threads(saved);
    expect_row("paged attention, 1 thread vs 3", many.out, one.out, one.T * c.hq * c.D);
    query_free(&one), query_free(&many);
    setup_free(&p);

    /* An append wide and long enough to split between threads, with repeated slots. */
    enum { T = 64, HKV = 4, D = 128, ROW = HKV * D, SLOTS = 48 };
    float *k = test_rand_f32(&rng, T * ROW, -1, 1), *v = test_rand_f32(&rng, T * ROW, -1, 1);
    float *kc1 = test_zeros_f32(SLOTS * ROW), *vc1 = test_zeros_f32(SLOTS * ROW);
    float *kc3 = test_zeros_f32(SLOTS * ROW), *vc3 = test_zeros_f32(SLOTS * ROW);
    int32_t slots[T];
    for (int t = 0; t < T; t++) slots[t] = (int32_t)(test_rng_next(&rng) % SLOTS);
    int64_t scache[4] = {SLOTS / 4, 4, HKV, D}, skv[3] = {T, HKV, D}, ss[1] = {T};
    struct tensor tk = tensor_f32(k, 3, skv), tv = tensor_f32(v, 3, skv), ts = tensor_i32(slots, 1, ss);
    struct tensor tkc1 = tensor_f32(kc1, 4, scache), tvc1 = tensor_f32(vc1, 4, scache);
    struct tensor tkc3 = tensor_f32(kc3, 4, scache), tvc3 = tensor_f32(vc3, 4, scache);
    omp_set_num_threads(1);
    TEST_OK(ops_kv_append(&tkc1, &tvc1, &tk, &tv, &ts, &err), &err);
    omp_set_num_threads(3);
    TEST_OK(ops_kv_append(&tkc3, &tvc3, &tk, &tv, &ts, &err), &err);
    omp_set_num_threads(saved);
    expect_row("kv_append k_cache, 1 thread vs 3", kc3, kc1, SLOTS * ROW);
    expect_row("kv_append v_cache, 1 thread vs 3", vc3, vc1, SLOTS * ROW);
    for (int t = 0; t < T; t++) {
        bool last = true;
        for (int u = t + 1; u < T; u++) last = last && slots[u] != slots[t];
        if (last) expect_row("last writer of a slot", kc3 + slots[t] * ROW, k + t * ROW, ROW);
    }
    free(k), free(v), free(kc1), free(vc1), free(kc3), free(vc3);
}

/* ---- errors ---- */

/* A small valid call of each op: two sequences (contexts 5 and 3, one decode query
 * each) in a pool of 4 blocks of 4 positions; Hq 2, Hkv 1, D 4. */
struct small_call {
    float k_cache[4 * 4 * 4], v_cache[4 * 4 * 4], k[2 * 4], v[2 * 4], q[2 * 2 * 4], out[2 * 2 * 4];
    int32_t slots[2], tables[2 * 2], cu_q[3], ctx[2];
    struct tensor tkc, tvc, tk, tv, tslots, tq, tout, ttables, tcu_q, tctx;
};

static void small_call_init(struct small_call *s) {
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < sizeof s->q / sizeof *s->q; i++) s->q[i] = 0.25f * (float)(i % 5);
    for (size_t i = 0; i < sizeof s->k_cache / sizeof *s->k_cache; i++) s->k_cache[i] = s->v_cache[i] = 0.5f;
    for (size_t i = 0; i < sizeof s->out / sizeof *s->out; i++) s->out[i] = 3.0f;
    int32_t tables[4] = {2, 0, 3, -1}, cu_q[3] = {0, 1, 2}, ctx[2] = {5, 3}, slots[2] = {12, 2};
    memcpy(s->tables, tables, sizeof tables), memcpy(s->cu_q, cu_q, sizeof cu_q);
    memcpy(s->ctx, ctx, sizeof ctx), memcpy(s->slots, slots, sizeof slots);
    int64_t scache[4] = {4, 4, 1, 4}, skv[3] = {2, 1, 4}, sq[3] = {2, 2, 4}, two[1] = {2}, three[1] = {3};
    int64_t stab[2] = {2, 2};
    s->tkc = tensor_f32(s->k_cache, 4, scache), s->tvc = tensor_f32(s->v_cache, 4, scache);
    s->tk = tensor_f32(s->k, 3, skv), s->tv = tensor_f32(s->v, 3, skv);
    s->tslots = tensor_i32(s->slots, 1, two);
    s->tq = tensor_f32(s->q, 3, sq), s->tout = tensor_f32(s->out, 3, sq);
    s->ttables = tensor_i32(s->tables, 2, stab);
    s->tcu_q = tensor_i32(s->cu_q, 1, three), s->tctx = tensor_i32(s->ctx, 1, two);
}

static int small_append(struct small_call *s, struct smelt_error *err) {
    return ops_kv_append(&s->tkc, &s->tvc, &s->tk, &s->tv, &s->tslots, err);
}

static int small_attend(struct small_call *s, struct smelt_error *err) {
    return ops_paged_attention(&s->tout, &s->tq, &s->tkc, &s->tvc, &s->ttables, &s->tcu_q, &s->tctx, 0.5f, err);
}

/* Sets one field of a fresh valid call, expects `code` and a message saying `says`. */
#define EXPECT_BAD(call_fn, change, code, says)      \
    do {                                             \
        struct small_call s_;                        \
        small_call_init(&s_);                        \
        struct small_call *s = &s_;                  \
        change;                                      \
        TEST_EXPECT_ERROR(call_fn(s, &err), code, &err); \
        EXPECT_MESSAGE(err, says);                   \
    } while (0)

Test(paged_attention, valid_small_calls) {
    struct small_call s;
    small_call_init(&s);
    struct smelt_error err;
    TEST_OK(small_attend(&s, &err), &err);
    /* Every cached value is 0.5, so every output is 0.5 whatever the weights. */
    for (size_t i = 0; i < sizeof s.out / sizeof *s.out; i++)
        cr_expect(fabsf(s.out[i] - 0.5f) <= 1e-6f, "out[%zu] is %g, expected 0.5", i, s.out[i]);
    for (size_t i = 0; i < sizeof s.k / sizeof *s.k; i++) s.k[i] = 1.0f + (float)i, s.v[i] = -1.0f - (float)i;
    TEST_OK(small_append(&s, &err), &err);
    /* Token t lands in row slots[t] of each cache (one kv head of 4 floats a row); every
     * other row keeps its 0.5. */
    for (int row = 0; row < 16; row++) {
        int t = row == s.slots[0] ? 0 : row == s.slots[1] ? 1 : -1;
        for (int d = 0; d < 4; d++) {
            float want_k = t < 0 ? 0.5f : s.k[t * 4 + d], want_v = t < 0 ? 0.5f : s.v[t * 4 + d];
            cr_expect(s.k_cache[row * 4 + d] == want_k && s.v_cache[row * 4 + d] == want_v,
                      "cache row %d, dim %d: k %g v %g, expected %g %g", row, d, s.k_cache[row * 4 + d],
                      s.v_cache[row * 4 + d], want_k, want_v);
        }
    }
}

Test(paged_attention, kv_append_bad_calls) {
    struct smelt_error err;
    int64_t s3[3] = {4, 4, 4}, s4bad[4] = {4, 4, 1, 5}, k_heads[3] = {2, 2, 4}, k_dim[3] = {2, 1, 3};
    int64_t v_short[3] = {1, 1, 4}, three[1] = {3};
    static float f32_slots[2] = {12, 2};
    static uint16_t bf16_data[64];
    EXPECT_BAD(small_append, s->tkc = tensor_f32(s->k_cache, 3, s3), SMELT_EINVAL, "k_cache has shape");
    EXPECT_BAD(small_append, s->tvc = tensor_f32(s->v_cache, 4, s4bad), SMELT_EINVAL, "v_cache has shape");
    EXPECT_BAD(small_append, (s->tkc.shape[1] = 0, s->tvc.shape[1] = 0), SMELT_EINVAL, "block_size and kv_heads >= 1");
    EXPECT_BAD(small_append, s->tvc.dtype = DTYPE_I32, SMELT_EINVAL, "v_cache has dtype i32");
    EXPECT_BAD(small_append, s->tk = tensor_f32(s->k, 3, k_heads), SMELT_EINVAL, "k has shape [2, 2, 4]");
    EXPECT_BAD(small_append, s->tk = tensor_f32(s->k, 3, k_dim), SMELT_EINVAL, "k has shape [2, 1, 3]");
    EXPECT_BAD(small_append, s->tv = tensor_f32(s->v, 3, v_short), SMELT_EINVAL, "v has shape");
    EXPECT_BAD(small_append, s->tk = tensor_make(BACKEND_CPU, DTYPE_BF16, bf16_data, 3, s->tk.shape),
               SMELT_EINVAL, "k has dtype bf16");
    EXPECT_BAD(small_append, s->tk.data = NULL, SMELT_EINVAL, "k has no data");
    EXPECT_BAD(small_append, s->tkc = tensor_make(BACKEND_CPU, DTYPE_BF16, bf16_data, 4, s->tkc.shape),
               SMELT_EUNSUPPORTED, "k_cache");
    EXPECT_BAD(small_append, s->tslots = tensor_f32(f32_slots, 1, s->tslots.shape), SMELT_EINVAL,
               "slot_mapping has dtype f32");
    EXPECT_BAD(small_append, s->tslots.shape[0] = 1, SMELT_EINVAL, "slot_mapping has shape [1]");
    EXPECT_BAD(small_append, s->tslots = tensor_i32(s->cu_q, 1, three), SMELT_EINVAL, "one slot per token");
    EXPECT_BAD(small_append, s->tslots.backend = BACKEND_CUDA, SMELT_EINVAL, "slot_mapping is on backend cuda");
    TEST_EXPECT_ERROR(ops_kv_append(NULL, NULL, NULL, NULL, NULL, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "k_cache is missing");

    /* Slots past the pool (16 slots) are data errors, and the call writes nothing. */
    struct small_call s;
    small_call_init(&s);
    s.slots[0] = 3, s.slots[1] = 16;
    s.k[0] = 99.0f;
    TEST_EXPECT_ERROR(small_append(&s, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "slot_mapping[1] is 16");
    EXPECT_MESSAGE(err, "16 slots");
    cr_expect(s.k_cache[3 * 4] == 0.5f, "a refused append wrote slot 3");
}

Test(paged_attention, paged_attention_bad_calls) {
    struct smelt_error err;
    int64_t s2[2] = {2, 8}, s3bad[3] = {2, 2, 5}, s3[3] = {4, 4, 4}, s4bad[4] = {4, 2, 1, 4};
    int64_t q_heads[3] = {2, 3, 4}, cache_heads[4] = {2, 4, 2, 4}, cache_dim[4] = {8, 4, 1, 2};
    int64_t q_dim[3] = {2, 2, 3}, stab1[1] = {4};
    int64_t stab_rows[2] = {1, 4}, one[1] = {1}, three[1] = {3};
    static float f32_tables[4] = {2, 0, 3, -1};
    static uint16_t bf16_data[64];
    EXPECT_BAD(small_attend, s->tq = tensor_f32(s->q, 2, s2), SMELT_EINVAL, "q has shape [2, 8]");
    EXPECT_BAD(small_attend, s->tout = tensor_f32(s->out, 3, s3bad), SMELT_EINVAL, "out has shape [2, 2, 5]");
    EXPECT_BAD(small_attend, s->tout.dtype = DTYPE_I32, SMELT_EINVAL, "out has dtype i32");
    EXPECT_BAD(small_attend, s->tkc = tensor_f32(s->k_cache, 3, s3), SMELT_EINVAL, "k_cache has shape");
    EXPECT_BAD(small_attend, s->tvc = tensor_f32(s->v_cache, 4, s4bad), SMELT_EINVAL, "v_cache has shape");
    EXPECT_BAD(small_attend, (s->tkc.shape[1] = 0, s->tvc.shape[1] = 0, s->ctx[0] = s->ctx[1] = 0,
                              s->cu_q[1] = s->cu_q[2] = 0, s->tq.shape[0] = s->tout.shape[0] = 0),
               SMELT_EINVAL, "k_cache has shape [4, 0, 1, 4]");
    EXPECT_BAD(small_attend, s->tvc = tensor_make(BACKEND_CPU, DTYPE_BF16, bf16_data, 4, s->tvc.shape),
               SMELT_EINVAL, "v_cache has dtype bf16");
    EXPECT_BAD(small_attend, s->tkc.backend = BACKEND_CUDA, SMELT_EINVAL, "k_cache is on backend cuda");
    /* 3 q heads over 2 kv heads */
    EXPECT_BAD(small_attend,
               (s->tq = tensor_f32(s->q, 3, q_heads), s->tout = tensor_f32(s->out, 3, q_heads),
                s->tkc = tensor_f32(s->k_cache, 4, cache_heads), s->tvc = tensor_f32(s->v_cache, 4, cache_heads)),
               SMELT_EINVAL, "q heads a multiple of kv heads");
    EXPECT_BAD(small_attend, (s->tkc = tensor_f32(s->k_cache, 4, cache_dim), s->tvc = tensor_f32(s->v_cache, 4, cache_dim)),
               SMELT_EINVAL, "must share head_dim");
    EXPECT_BAD(small_attend, (s->tq = tensor_f32(s->q, 3, q_dim), s->tout = tensor_f32(s->out, 3, q_dim)),
               SMELT_EINVAL, "must share head_dim");
    EXPECT_BAD(small_attend, s->ttables = tensor_f32(f32_tables, 2, s->ttables.shape), SMELT_EINVAL,
               "block_tables has dtype f32");
    EXPECT_BAD(small_attend, s->ttables = tensor_i32(s->tables, 1, stab1), SMELT_EINVAL, "block_tables has shape [4]");
    EXPECT_BAD(small_attend, s->ttables = tensor_i32(s->tables, 2, stab_rows), SMELT_EINVAL,
               "block_tables has shape [1, 4]");
    EXPECT_BAD(small_attend, s->ttables.backend = BACKEND_CUDA, SMELT_EINVAL, "block_tables is on backend cuda");
    EXPECT_BAD(small_attend, s->tcu_q.backend = BACKEND_CUDA, SMELT_EINVAL, "cu_q is on backend cuda");
    EXPECT_BAD(small_attend, s->tcu_q = tensor_f32(f32_tables, 1, three), SMELT_EINVAL, "cu_q has dtype f32");
    EXPECT_BAD(small_attend, s->cu_q[0] = 1, SMELT_EINVAL, "cu_q[0] is 1");
    EXPECT_BAD(small_attend, (s->cu_q[1] = 2, s->cu_q[2] = 1), SMELT_EINVAL, "cu_q decreases at index 2");
    EXPECT_BAD(small_attend, s->cu_q[2] = 1, SMELT_EINVAL, "cu_q ends at 1");
    EXPECT_BAD(small_attend, s->tcu_q = tensor_i32(s->cu_q, 1, one), SMELT_EINVAL, "cu_q needs at least 2");
    EXPECT_BAD(small_attend, s->tctx = tensor_i32(s->ctx, 1, one), SMELT_EINVAL, "context_lens has shape [1]");
    EXPECT_BAD(small_attend, s->tctx.backend = BACKEND_CUDA, SMELT_EINVAL, "context_lens is on backend cuda");
    EXPECT_BAD(small_attend, s->ctx[1] = 0, SMELT_EINVAL, "context_lens[1] is 0, fewer than the 1 query");
    EXPECT_BAD(small_attend, s->ctx[1] = -2, SMELT_EINVAL, "context_lens[1] is -2");
    EXPECT_BAD(small_attend, s->ctx[0] = 9, SMELT_EINVAL, "context_lens[0] is 9, more than a block_tables row");
    EXPECT_BAD(small_attend, s->tq.data = NULL, SMELT_EINVAL, "q has no data");
    TEST_EXPECT_ERROR(ops_paged_attention(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1.0f, &err), SMELT_EINVAL, &err);
    EXPECT_MESSAGE(err, "q is missing");
    float bad_scales[] = {0.0f, -1.0f, NAN};
    for (size_t i = 0; i < 3; i++) {
        struct small_call s;
        small_call_init(&s);
        TEST_EXPECT_ERROR(ops_paged_attention(&s.tout, &s.tq, &s.tkc, &s.tvc, &s.ttables, &s.tcu_q, &s.tctx,
                                              bad_scales[i], &err), SMELT_EINVAL, &err);
        EXPECT_MESSAGE(err, "scale");
    }

    /* Block ids are data: one outside the pool in the used part of a row is refused and
     * nothing is written; entries past the used part are never read. */
    EXPECT_BAD(small_attend, s->tables[1 * 2 + 0] = 4, SMELT_EINVAL, "block_tables[1][0] is 4");
    EXPECT_BAD(small_attend, s->tables[0 * 2 + 1] = -1, SMELT_EINVAL, "block_tables[0][1] is -1");
    EXPECT_BAD(small_attend, s->tables[0 * 2 + 1] = -1, SMELT_EINVAL, "sequence 0 reads 2 blocks");
    struct small_call s;
    small_call_init(&s);
    s.tables[2] = 7;
    TEST_EXPECT_ERROR(small_attend(&s, &err), SMELT_EINVAL, &err);
    for (size_t i = 0; i < sizeof s.out / sizeof *s.out; i++)
        cr_expect(s.out[i] == 3.0f, "a refused call wrote out[%zu]", i);
    small_call_init(&s);
    s.tables[3] = 1000; /* sequence 1 (context 3) reads one block */
    TEST_OK(small_attend(&s, &err), &err);
}

/* No query tokens at all: sequences with nothing to attend are fine. */
/* No query tokens: the call succeeds and writes nothing (q and out view buffers whose
 * contents must keep their bits, as must the caches). */
Test(paged_attention, zero_queries) {
    struct small_call s, before;
    small_call_init(&s);
    int64_t sq[3] = {0, 2, 4};
    s.tq = tensor_f32(s.q, 3, sq), s.tout = tensor_f32(s.out, 3, sq);
    s.cu_q[1] = s.cu_q[2] = 0;
    before = s;
    struct smelt_error err;
    TEST_OK(small_attend(&s, &err), &err);
    cr_expect(memcmp(s.out, before.out, sizeof s.out) == 0, "out was written by a call with no queries");
    cr_expect(memcmp(s.k_cache, before.k_cache, sizeof s.k_cache) == 0, "k_cache changed");
    cr_expect(memcmp(s.v_cache, before.v_cache, sizeof s.v_cache) == 0, "v_cache changed");
}
