/* Causal self-attention over packed sequences, forward and backward, in fp32.
 *
 * Layout: q, out, dq [T, Hq, D]; k, v, dk, dv [T, Hkv, D]; lse [T, Hq]. Query head h
 * reads kv head h / (Hq / Hkv). Sequence s is tokens [cu[s], cu[s+1]); token i of it
 * attends to tokens cu[s] .. i.
 *
 * Every output row is computed start to finish by one thread in a fixed order, so the
 * results are bit-identical for any thread count, and the schedule can be dynamic
 * (causal rows differ in length). The dot products use fixed lanes rather than a
 * compiler reduction so their summation order does not depend on where a row happens
 * to sit in memory: a sequence gives the same bits packed or alone.
 *
 * The backward is flash-attention style: probabilities are recomputed from the saved
 * lse, never stored as a T x T matrix. dq is gathered per query; dk and dv are gathered
 * per key (looping over the later queries of its sequence and the q heads of its group),
 * so each gradient row has one writer and no atomics are needed. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

/* Below this much work (multiply-adds, roughly) a thread team costs more than it saves. */
#define ATTN_PARALLEL_MIN_WORK 16384

/* The shapes of one call, read once from the validated tensors. */
struct attn_dims {
    int64_t tokens, hq, hkv, dim;
    int64_t group;         /* q heads per kv head, Hq / Hkv */
    int64_t nseq;          /* S: cu_seqlens has S + 1 entries */
    int64_t max_len;       /* longest sequence */
    const int32_t *cu;
};

static struct attn_dims attn_dims_of(const struct tensor *q, const struct tensor *k,
                                     const struct tensor *cu_seqlens) {
    struct attn_dims d = {
        .tokens = q->shape[0], .hq = q->shape[1], .hkv = k->shape[1], .dim = q->shape[2],
        .nseq = tensor_numel(cu_seqlens) - 1, .cu = cu_seqlens->data,
    };
    d.group = d.hq / d.hkv;
    for (int64_t s = 0; s < d.nseq; s++) {
        int64_t len = (int64_t)d.cu[s + 1] - d.cu[s];
        if (len > d.max_len) d.max_len = len;
    }
    return d;
}


/* Work estimate for the parallel cut-off: every causal pair of every q head, over D. */
static bool attn_worth_threads(const struct attn_dims *d) {
    double pairs = 0;
    for (int64_t s = 0; s < d->nseq; s++) {
        double len = (double)d->cu[s + 1] - d->cu[s];
        pairs += len * (len + 1) / 2;
    }
    return pairs * (double)d->hq * (double)(d->dim + 1) >= ATTN_PARALLEL_MIN_WORK;
}

/* One scratch row of at least `floats` per thread of the team to come, each a multiple
 * of 64 bytes so neighbours do not share cache lines. The caller frees *out. */
static int scratch_alloc(float **out, int64_t *stride, int64_t floats, const char *op,
                         struct smelt_error *err) {
    *stride = floats > 0 ? (floats + 15) / 16 * 16 : 16;
    int64_t bytes = *stride * (int64_t)omp_get_max_threads() * (int64_t)sizeof(float);
    *out = malloc((size_t)bytes);
    if (!*out)
        return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %lld bytes of scratch", op,
                         (long long)bytes);
    return SMELT_OK;
}

/* ---- forward ---- */

/* out[t, h] and lse[t, h] for one query row; scores has room for the sequence. */
static void attn_row_forward(const struct attn_dims *d, int64_t t, int64_t h, const float *q,
                             const float *k, const float *v, float scale, float *out,
                             float *lse, float *scores) {
    int64_t start = d->cu[cpu_seq_of(d->cu, d->nseq, t)], n = t - start + 1, dim = d->dim;
    int64_t kvh = h / d->group;
    const float *qi = q + (t * d->hq + h) * dim;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        scores[j] = scale * cpu_dot(qi, k + ((start + j) * d->hkv + kvh) * dim, dim);
        if (scores[j] > m) m = scores[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - m);
        sum += scores[j];
    }
    float *oi = out + (t * d->hq + h) * dim;
    for (int64_t c = 0; c < dim; c++) oi[c] = 0.0f;
    for (int64_t j = 0; j < n; j++) cpu_axpy(oi, scores[j], v + ((start + j) * d->hkv + kvh) * dim, dim);
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < dim; c++) oi[c] *= inv;
    if (lse) lse[t * d->hq + h] = m + logf(sum);
}

int cpu_attention(struct tensor *out, struct tensor *lse, const struct tensor *q,
                  const struct tensor *k, const struct tensor *v,
                  const struct tensor *cu_seqlens, float scale, struct smelt_error *err) {
    struct attn_dims d = attn_dims_of(q, k, cu_seqlens);
    int64_t rows = d.tokens * d.hq;
    if (rows == 0) return SMELT_OK;
    float *scratch;
    int64_t stride;
    int rc = scratch_alloc(&scratch, &stride, d.max_len, "ops_attention", err);
    if (rc) return rc;
    const float *qp = q->data, *kp = k->data, *vp = v->data;
    float *op = out->data, *lp = lse ? lse->data : NULL;
#pragma omp parallel if (attn_worth_threads(&d))
    {
        float *scores = scratch + omp_get_thread_num() * stride;
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; r++)
            attn_row_forward(&d, r / d.hq, r % d.hq, qp, kp, vp, scale, op, lp, scores);
    }
    free(scratch);
    return SMELT_OK;
}

/* ---- backward ---- */

/* Everything the backward reads, gathered once. */
struct attn_grad_in {
    const float *q, *k, *v, *dout, *lse;
    const float *delta; /* [T, Hq]: dout_i . out_i, the softmax backward's row term */
    float scale;
};

/* p = softmax probability of key j for query row (i, h), recomputed from lse;
 * returns dS = p (dout_i . v_j - delta_i), and p through *p_out. */
static inline float attn_pair_grad(const struct attn_dims *d, const struct attn_grad_in *g,
                                   int64_t i, int64_t h, int64_t j, float *p_out) {
    int64_t dim = d->dim, kvh = h / d->group;
    int64_t qrow = i * d->hq + h, krow = j * d->hkv + kvh;
    float p = expf(g->scale * cpu_dot(g->q + qrow * dim, g->k + krow * dim, dim) - g->lse[qrow]);
    float dp = cpu_dot(g->dout + qrow * dim, g->v + krow * dim, dim);
    *p_out = p;
    return p * (dp - g->delta[qrow]);
}

/* dq[i, h] += scale * sum_j dS_ij k_j over the keys of query row (i, h). */
static void attn_row_dq(const struct attn_dims *d, const struct attn_grad_in *g, int64_t i,
                        int64_t h, float *dq, float *acc) {
    int64_t start = d->cu[cpu_seq_of(d->cu, d->nseq, i)], dim = d->dim, kvh = h / d->group;
    for (int64_t c = 0; c < dim; c++) acc[c] = 0.0f;
    for (int64_t j = start; j <= i; j++) {
        float p;
        float ds = attn_pair_grad(d, g, i, h, j, &p);
        cpu_axpy(acc, ds, g->k + (j * d->hkv + kvh) * dim, dim);
    }
    cpu_axpy(dq + (i * d->hq + h) * dim, g->scale, acc, dim);
}

/* dk[j, kvh] += scale * sum dS_ij q_i and dv[j, kvh] += sum P_ij dout_i over the later
 * queries i of j's sequence and the q heads reading kv head kvh. */
static void attn_row_dkv(const struct attn_dims *d, const struct attn_grad_in *g, int64_t j,
                         int64_t kvh, float *dk, float *dv, float *acc_k, float *acc_v) {
    int64_t end = d->cu[cpu_seq_of(d->cu, d->nseq, j) + 1], dim = d->dim;
    for (int64_t c = 0; c < dim; c++) acc_k[c] = acc_v[c] = 0.0f;
    for (int64_t i = j; i < end; i++)
        for (int64_t h = kvh * d->group; h < (kvh + 1) * d->group; h++) {
            float p;
            float ds = attn_pair_grad(d, g, i, h, j, &p);
            int64_t qrow = (i * d->hq + h) * dim;
            if (dk) cpu_axpy(acc_k, ds, g->q + qrow, dim);
            if (dv) cpu_axpy(acc_v, p, g->dout + qrow, dim);
        }
    int64_t krow = (j * d->hkv + kvh) * dim;
    if (dk) cpu_axpy(dk + krow, g->scale, acc_k, dim);
    if (dv) cpu_axpy(dv + krow, 1.0f, acc_v, dim);
}

int cpu_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                           const struct tensor *dout, const struct tensor *q,
                           const struct tensor *k, const struct tensor *v,
                           const struct tensor *out, const struct tensor *lse,
                           const struct tensor *cu_seqlens, float scale,
                           struct smelt_error *err) {
    static const char op[] = "ops_attention_backward";
    struct attn_dims d = attn_dims_of(q, k, cu_seqlens);
    int64_t qrows = d.tokens * d.hq, kvrows = d.tokens * d.hkv, dim = d.dim;
    if (qrows == 0 || (!dq && !dk && !dv)) return SMELT_OK;

    float *delta = malloc((size_t)qrows * sizeof *delta);
    if (!delta)
        return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %lld bytes for the row terms", op,
                         (long long)(qrows * (int64_t)sizeof *delta));
    float *scratch;
    int64_t stride;
    int rc = scratch_alloc(&scratch, &stride, 2 * dim, op, err);
    if (rc) {
        free(delta);
        return rc;
    }
    struct attn_grad_in g = {q->data, k->data, v->data, dout->data, lse->data, delta, scale};
    const float *o = out->data;
    float *dqp = dq ? dq->data : NULL, *dkp = dk ? dk->data : NULL, *dvp = dv ? dv->data : NULL;
    bool threads = attn_worth_threads(&d);

#pragma omp parallel if (threads)
    {
        float *acc = scratch + omp_get_thread_num() * stride;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < qrows; r++) delta[r] = cpu_dot(g.dout + r * dim, o + r * dim, dim);
        /* the implicit barrier: every delta is ready below */
        if (dqp) {
#pragma omp for schedule(dynamic, 4)
            for (int64_t r = 0; r < qrows; r++) attn_row_dq(&d, &g, r / d.hq, r % d.hq, dqp, acc);
        }
        if (dkp || dvp) {
#pragma omp for schedule(dynamic, 4)
            for (int64_t r = 0; r < kvrows; r++)
                attn_row_dkv(&d, &g, r / d.hkv, r % d.hkv, dkp, dvp, acc, acc + dim);
        }
    }
    free(scratch);
    free(delta);
    return SMELT_OK;
}
