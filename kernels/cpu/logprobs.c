/* Token logprobs: fused log-softmax + gather over rows of V logits, and its backward.
 *
 * Design decisions:
 *  - logsumexp is computed ONLINE in a single pass over each row: a running maximum m
 *    and a running sum s = sum exp(x - m), rescaled by exp(m_old - m_new) whenever a new
 *    maximum appears. Vocabulary rows are large (up to ~150k floats = 600 KB), so a
 *    two-pass max-then-sum reads every row twice, often from beyond L2; the online form
 *    reads it once, and the rescale is rare (a new maximum appears O(log V) times on
 *    typical rows), so the cost stays one expf per logit. Every exponent is <= 0, so
 *    logits of any magnitude (±1000 and beyond) neither overflow nor lose the row.
 *  - The sum is accumulated in double: 150k terms in float would lose ~1e-3 relative
 *    in the worst case; double keeps lse good to f32 rounding.
 *  - lse is written for every row, targeted or not: it is a property of the logits, and
 *    the backward recomputes softmax(x)[v] = exp(x[v] - lse) from it, so the
 *    probabilities never live in a buffer of their own.
 *  - Rows are independent and each is reduced sequentially in index order, so results
 *    are bit-identical for any thread count.
 *  - Targets come from datasets and requests: they are range-checked here, all of them,
 *    before any output is written, so a bad batch leaves the caller's buffers alone. */
#include "kernels/cpu/cpu.h"

#include <math.h>

/* Below this many logits a parallel region costs more than it saves. */
#define LOGPROBS_PARALLEL_MIN 32768

static int check_targets(const char *op, const int32_t *targets, int64_t rows, int64_t vocab,
                         struct smelt_error *err) {
    for (int64_t t = 0; t < rows; t++)
        if (targets[t] >= vocab)
            return error_set(err, SMELT_EINVAL,
                             "%s: target %d at row %lld is outside the vocabulary [0, %lld) "
                             "(negative targets mean \"no target\")",
                             op, targets[t], (long long)t, (long long)vocab);
    return SMELT_OK;
}

/* log(sum(exp(x[0..n)))), single pass, stable for any magnitude (see the top). */
static double row_logsumexp(const float *x, int64_t n) {
    float m = -INFINITY;
    double s = 0.0;
    for (int64_t v = 0; v < n; v++) {
        if (x[v] > m) {
            s = s * exp((double)m - (double)x[v]) + 1.0; /* exp(-inf) = 0 on the first */
            m = x[v];
        } else if (x[v] != -INFINITY) {
            s += (double)expf(x[v] - m);
        }
    }
    /* -inf logits (masked vocabulary entries) add exactly 0 and are skipped, so a row
     * that starts with them does not compute exp(-inf - -inf) = NaN. A NaN logit never
     * passes `x > m` and makes s NaN in the else branch: NaN propagates, not vanishes. */
    return (double)m + log(s);
}

int cpu_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                 const struct tensor *targets, struct smelt_error *err) {
    const int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    const int32_t *tgt = targets->data;
    int rc = check_targets("ops_logprobs", tgt, rows, vocab, err);
    if (rc) return rc;
    const float *x = logits->data;
    float *lp = logprobs->data;
    float *ls = lse ? lse->data : NULL;
#pragma omp parallel for schedule(static) if (rows * vocab > LOGPROBS_PARALLEL_MIN)
    for (int64_t t = 0; t < rows; t++) {
        const float *row = x + t * vocab;
        if (!ls && tgt[t] < 0) { /* nothing asked of this row */
            lp[t] = 0.0f;
            continue;
        }
        double l = row_logsumexp(row, vocab);
        if (ls) ls[t] = (float)l;
        /* From the double lse, so the logprob is not rounded twice. */
        lp[t] = tgt[t] < 0 ? 0.0f : (float)((double)row[tgt[t]] - l);
    }
    return SMELT_OK;
}

int cpu_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                          const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *lse, struct smelt_error *err) {
    const int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    const int32_t *tgt = targets->data;
    int rc = check_targets("ops_logprobs_backward", tgt, rows, vocab, err);
    if (rc) return rc;
    const float *x = logits->data, *dlp = dlogprobs->data, *ls = lse->data;
    float *dx = dlogits->data;
#pragma omp parallel for schedule(static) if (rows * vocab > LOGPROBS_PARALLEL_MIN)
    for (int64_t t = 0; t < rows; t++) {
        if (tgt[t] < 0) continue;
        const float *row = x + t * vocab;
        float *drow = dx + t * vocab;
        const float g = dlp[t], l = ls[t];
        const int64_t target = tgt[t];
        for (int64_t v = 0; v < vocab; v++) {
            float hit = v == target ? 1.0f : 0.0f;
            drow[v] += g * (hit - expf(row[v] - l));
        }
    }
    return SMELT_OK;
}

/* ---- argmax ---- */

/* The first index of the row's maximum; `>` never prefers a NaN, and a NaN at index 0
 * loses to the first number after it. */
static int32_t row_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t v = 1; v < n; v++)
        if (x[v] > x[best] || (isnan(x[best]) && !isnan(x[v]))) best = v;
    return (int32_t)best;
}

int cpu_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err) {
    (void)err;
    int64_t vocab = logits->shape[logits->ndim - 1], rows = tensor_rows(logits);
    const float *x = logits->data;
    int32_t *out = ids->data;
#pragma omp parallel for schedule(static) if (rows * vocab >= LOGPROBS_PARALLEL_MIN)
    for (int64_t t = 0; t < rows; t++) out[t] = row_argmax(x + t * vocab, vocab);
    return SMELT_OK;
}
