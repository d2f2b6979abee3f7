/* Embedding lookup and its scatter-add backward: forward against a plain gather,
 * backward against float64 finite differences of L = sum(w * out) with repeated ids,
 * thread-count independence, and the errors bad ids and shapes get. */
#include "tests/unit/testutil.h"

#include <omp.h>
#include <string.h>

struct emb_ctx {
    double *table, *w;
    const int32_t *ids;
    int64_t n, channels;
};

static double emb_loss(void *p) {
    struct emb_ctx *c = p;
    double s = 0.0;
    for (int64_t t = 0; t < c->n; t++)
        for (int64_t j = 0; j < c->channels; j++)
            s += c->w[t * c->channels + j] * c->table[(int64_t)c->ids[t] * c->channels + j];
    return s;
}

/* ids with repeats: every id drawn from the first half of the vocabulary, so most
 * rows are hit several times and the rest never. */
static int32_t *rand_ids(struct test_rng *rng, int64_t n, int64_t vocab) {
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    cr_assert(ids);
    int64_t half = vocab > 1 ? vocab / 2 : 1;
    for (int64_t t = 0; t < n; t++) ids[t] = (int32_t)(test_rng_next(rng) % (uint64_t)half);
    return ids;
}

static void run_embedding(int64_t vocab, int64_t channels, int64_t b, int64_t t_len, uint64_t seed) {
    struct test_rng rng = {seed};
    struct smelt_error err;
    int64_t n = b * t_len, tn = vocab * channels, on = n * channels;
    int64_t ids_shape[2] = {b, t_len}, table_shape[2] = {vocab, channels};
    int64_t out_shape[3] = {b, t_len, channels};
    float *table = test_rand_f32(&rng, tn, -2, 2), *w = test_rand_f32(&rng, on, -1, 1);
    float *out = test_zeros_f32(on), *init = test_rand_f32(&rng, tn, -1, 1);
    float *dtable = malloc((size_t)tn * sizeof *dtable);
    cr_assert(dtable);
    memcpy(dtable, init, (size_t)tn * sizeof *dtable);
    int32_t *ids = rand_ids(&rng, n, vocab);
    if (n > 2) ids[n - 1] = ids[0] = (int32_t)(vocab - 1); /* the last row, twice */

    struct tensor tids = tensor_i32(ids, 2, ids_shape), ttable = tensor_f32(table, 2, table_shape);
    struct tensor tout = tensor_make(BACKEND_CPU, DTYPE_F32, out, 3, out_shape);
    struct tensor tw = tensor_make(BACKEND_CPU, DTYPE_F32, w, 3, out_shape);
    struct tensor tdtable = tensor_f32(dtable, 2, table_shape);

    TEST_OK(ops_embedding(&tout, &tids, &ttable, &err), &err);
    for (int64_t t = 0; t < n; t++)
        cr_expect(memcmp(out + t * channels, table + (int64_t)ids[t] * channels,
                         (size_t)channels * sizeof *out) == 0,
                  "out row %lld is not table row %d", (long long)t, ids[t]);

    TEST_OK(ops_embedding_backward(&tdtable, &tw, &tids, &err), &err);
    struct emb_ctx c = {test_to_f64(table, tn), test_to_f64(w, on), ids, n, channels};
    double *grad = malloc((size_t)tn * sizeof *grad);
    cr_assert(grad);
    test_fd_gradient(emb_loss, &c, c.table, tn, 1e-3, grad); /* L is linear: any h works */
    for (int64_t i = 0; i < tn; i++) grad[i] += init[i];
    test_expect_close("dtable (initial + gradient)", dtable, grad, tn, 1e-5, 1e-6);

    free(table), free(w), free(out), free(init), free(dtable), free(ids);
    free(c.table), free(c.w), free(grad);
}

Test(embedding, forward_backward_small) { run_embedding(5, 3, 1, 9, 1); }
Test(embedding, forward_backward_odd) { run_embedding(17, 33, 3, 7, 2); }
Test(embedding, forward_backward_one_row) { run_embedding(1, 4, 2, 2, 3); }
Test(embedding, forward_backward_parallel) { run_embedding(23, 160, 4, 60, 4); } /* > threshold */

/* Repeated ids sum in position order inside one thread: exact same bits with 1 or 2
 * threads, and the sum equals the sequential one. */
Test(embedding, backward_thread_count_independent) {
    struct test_rng rng = {5};
    struct smelt_error err;
    enum { V = 7, C = 300, N = 400 };
    int64_t ids_shape[1] = {N}, table_shape[2] = {V, C}, out_shape[2] = {N, C};
    float *dout = test_rand_f32(&rng, N * C, -1, 1);
    int32_t *ids = rand_ids(&rng, N, V);
    float *d[2] = {test_zeros_f32(V * C), test_zeros_f32(V * C)};
    struct tensor tids = tensor_i32(ids, 1, ids_shape), tdout = tensor_f32(dout, 2, out_shape);
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        struct tensor td = tensor_f32(d[k], 2, table_shape);
        TEST_OK(ops_embedding_backward(&td, &tdout, &tids, &err), &err);
    }
    cr_expect(memcmp(d[0], d[1], V * C * sizeof(float)) == 0, "dtable differs between 1 and 2 threads");
    float *seq = test_zeros_f32(V * C);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < C; j++) seq[ids[t] * C + j] += dout[t * C + j];
    cr_expect(memcmp(d[0], seq, V * C * sizeof(float)) == 0, "dtable is not the in-order sum");
    free(dout), free(ids), free(d[0]), free(d[1]), free(seq);
}

Test(embedding, out_of_range_ids) {
    struct smelt_error err;
    enum { V = 4, C = 3, N = 5 };
    float table[V * C] = {0}, out[N * C], dtable[V * C];
    int32_t ids[N] = {0, 1, 2, 3, 0};
    int64_t ids_shape[1] = {N}, table_shape[2] = {V, C}, out_shape[2] = {N, C};
    for (int i = 0; i < N * C; i++) out[i] = 9.0f;
    for (int i = 0; i < V * C; i++) dtable[i] = 9.0f;
    struct tensor tids = tensor_i32(ids, 1, ids_shape), ttable = tensor_f32(table, 2, table_shape);
    struct tensor tout = tensor_f32(out, 2, out_shape), tdtable = tensor_f32(dtable, 2, table_shape);

    const int32_t bad[] = {-1, V, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ids[3] = bad[i];
        TEST_EXPECT_ERROR(ops_embedding(&tout, &tids, &ttable, &err), SMELT_EINVAL, &err);
        char want[64];
        snprintf(want, sizeof want, "%d", bad[i]);
        cr_expect(strstr(err.message, "position 3") && strstr(err.message, want),
                  "message names position 3 and id %d: %s", bad[i], err.message);
        TEST_EXPECT_ERROR(ops_embedding_backward(&tdtable, &tout, &tids, &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, "position 3") != NULL, "message: %s", err.message);
    }
    for (int i = 0; i < N * C; i++) cr_expect(out[i] == 9.0f, "out written by a rejected call");
    for (int i = 0; i < V * C; i++) cr_expect(dtable[i] == 9.0f, "dtable written by a rejected call");
}

Test(embedding, shape_errors) {
    struct smelt_error err;
    enum { V = 4, C = 3, N = 5 };
    float table[V * C] = {0}, out[N * C + 8] = {0};
    int32_t ids[N] = {0, 1, 2, 3, 0};
    int64_t ids_shape[1] = {N}, table_shape[2] = {V, C}, out_shape[2] = {N, C};
    struct tensor tids = tensor_i32(ids, 1, ids_shape), ttable = tensor_f32(table, 2, table_shape);
    struct tensor tout = tensor_f32(out, 2, out_shape);

    int64_t flat[1] = {V * C};
    struct tensor table_1d = tensor_f32(table, 1, flat);
    TEST_EXPECT_ERROR(ops_embedding(&tout, &tids, &table_1d, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "table") != NULL, "message: %s", err.message);

    int64_t too_many[2] = {N + 1, C};
    struct tensor out_big = tensor_f32(out, 2, too_many);
    TEST_EXPECT_ERROR(ops_embedding(&out_big, &tids, &ttable, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "out") != NULL, "message: %s", err.message);

    int64_t wrong_last[2] = {C, N}; /* right numel, channels in the wrong place */
    struct tensor out_t = tensor_f32(out, 2, wrong_last);
    TEST_EXPECT_ERROR(ops_embedding(&out_t, &tids, &ttable, &err), SMELT_EINVAL, &err);

    struct tensor ids_f32 = tensor_f32((float *)ids, 1, ids_shape);
    TEST_EXPECT_ERROR(ops_embedding(&tout, &ids_f32, &ttable, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "ids") != NULL, "message: %s", err.message);

    TEST_EXPECT_ERROR(ops_embedding(&tout, NULL, &ttable, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_embedding(NULL, &tids, &ttable, &err), SMELT_EINVAL, &err);
    struct tensor table_bf16 = tensor_make(BACKEND_CPU, DTYPE_BF16, table, 2, table_shape);
    TEST_EXPECT_ERROR(ops_embedding(&tout, &tids, &table_bf16, &err), SMELT_EUNSUPPORTED, &err);

    TEST_EXPECT_ERROR(ops_embedding_backward(&table_1d, &tout, &tids, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_embedding_backward(&ttable, &out_big, &tids, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_embedding_backward(&ttable, &out_t, &tids, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(ops_embedding_backward(&ttable, &tout, &ids_f32, &err), SMELT_EINVAL, &err);
}

/* Zero tokens: nothing to do, and no error; neither the table nor the buffer behind the
 * empty output is written. */
Test(embedding, empty_ids) {
    struct smelt_error err;
    float table[6] = {1, 2, 3, 4, 5, 6}, out[3] = {7, 8, 9};
    const float table0[6] = {1, 2, 3, 4, 5, 6}, out0[3] = {7, 8, 9};
    int32_t ids[1] = {1};
    int64_t ids_shape[1] = {0}, table_shape[2] = {2, 3}, out_shape[2] = {0, 3};
    struct tensor tids = tensor_i32(ids, 1, ids_shape), ttable = tensor_f32(table, 2, table_shape);
    struct tensor tout = tensor_f32(out, 2, out_shape);
    TEST_OK(ops_embedding(&tout, &tids, &ttable, &err), &err);
    TEST_OK(ops_embedding_backward(&ttable, &tout, &tids, &err), &err);
    cr_expect(memcmp(table, table0, sizeof table) == 0, "the table changed");
    cr_expect(memcmp(out, out0, sizeof out) == 0, "the empty output's buffer was written");
}
