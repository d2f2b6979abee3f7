/* A sample request's prompt_logprobs and topk_prompt_logprobs: one model_forward over
 * the prompt with whatever adapter is attached. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tinker/tinker_internal.h"

/* The forward of ids with targets ids[t + 1] (none at the end): logprobs [n] and, when
 * logits is not NULL, every logit [n, V], into host memory. */
static int prompt_forward(struct model *base, const int32_t *ids, int64_t n, float *lp, float *logits,
                          struct smelt_error *err) {
    int64_t V = base->config.vocab_size, shape[2] = {n, V};
    int32_t cu[2] = {0, (int32_t)n}, *targets = malloc((size_t)n * sizeof *targets);
    struct model_acts *acts = NULL;
    struct tensor lp_dev = {0}, lg_dev = {0};
    if (!targets) return error_set(err, SMELT_ENOMEM, "prompt_logprobs: out of memory");
    for (int64_t t = 0; t < n; t++) targets[t] = t + 1 < n ? ids[t + 1] : -1;
    struct model_batch b = {.n_tokens = n, .n_seqs = 1, .ids = ids, .cu_seqlens = cu, .targets = targets};
    int rc = model_acts_alloc(base, n, false, &acts, err);
    if (!rc) rc = tensor_alloc(&lp_dev, base->backend, DTYPE_F32, 1, &n, err);
    if (!rc && logits) rc = tensor_alloc(&lg_dev, base->backend, DTYPE_F32, 2, shape, err);
    if (!rc) rc = model_forward(base, acts, &b, &lp_dev, logits ? &lg_dev : NULL, NULL, err);
    struct tensor h = tensor_f32(lp, 1, &n), hl = tensor_f32(logits, 2, shape);
    if (!rc) rc = tensor_copy(&h, &lp_dev, err);
    if (!rc && logits) rc = tensor_copy(&hl, &lg_dev, err);
    tensor_free(&lp_dev);
    tensor_free(&lg_dev);
    model_acts_free(acts);
    free(targets);
    return rc;
}

/* Whether id a (value va) ranks below id b (vb): a lower value, or the same value and a
 * higher id (ties: the lower id first). */
static bool ranks_below(float va, int32_t a, float vb, int32_t b) {
    return va < vb || (va == vb && a > b);
}

/* Restores the min-heap (its worst at the root) below position i. */
static void sift_down(const float *row, int32_t *heap, int64_t n, int64_t i) {
    for (;;) {
        int64_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_below(row[heap[l]], heap[l], row[heap[worst]], heap[worst])) worst = l;
        if (r < n && ranks_below(row[heap[r]], heap[r], row[heap[worst]], heap[worst])) worst = r;
        if (worst == i) return;
        int32_t t = heap[i];
        heap[i] = heap[worst], heap[worst] = t;
        i = worst;
    }
}

/* A bounded min-heap of the k best seen so far: O(V log k). The heap, emptied worst
 * first, fills ids from the back. */
void tinker_row_topk(const float *row, int64_t V, int64_t k, int32_t *ids, float *lps) {
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
    for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
    double lse = mx + log(sum);
    int64_t n = 0, kept = k < V ? k : V;
    for (int64_t v = 0; v < V && kept > 0; v++) {
        if (n < kept) {
            ids[n++] = (int32_t)v; /* sifted up below */
            for (int64_t i = n - 1; i > 0; i = (i - 1) / 2) {
                int64_t p = (i - 1) / 2;
                if (!ranks_below(row[ids[i]], ids[i], row[ids[p]], ids[p])) break;
                int32_t t = ids[i];
                ids[i] = ids[p], ids[p] = t;
            }
        } else if (ranks_below(row[ids[0]], ids[0], row[v], (int32_t)v)) {
            ids[0] = (int32_t)v;
            sift_down(row, ids, n, 0);
        }
    }
    for (int64_t j = kept; j < k; j++) ids[j] = -1, lps[j] = NAN; /* fewer ids than k */
    while (n > 0) { /* pop the worst into the last free place */
        int32_t worst = ids[0];
        ids[0] = ids[--n];
        sift_down(row, ids, n, 0);
        ids[n] = worst;
    }
    for (int64_t j = 0; j < kept; j++) lps[j] = (float)((double)row[ids[j]] - lse);
}

int tinker_prompt_logprobs(struct model *base, const int32_t *ids, int64_t n, int64_t k, float *plp,
                           int32_t *topk_ids, float *topk_lps, struct smelt_error *err) {
    int64_t V = base->config.vocab_size;
    float *lp = malloc((size_t)n * sizeof *lp), *logits = k > 0 ? malloc((size_t)(n * V) * sizeof *logits) : NULL;
    int rc = !lp || (k > 0 && !logits) ? error_set(err, SMELT_ENOMEM, "prompt_logprobs: out of memory") : SMELT_OK;
    if (!rc) rc = prompt_forward(base, ids, n, lp, logits, err);
    if (!rc && plp) {
        plp[0] = NAN; /* the first token has no context */
        memcpy(plp + 1, lp, (size_t)(n - 1) * sizeof *plp);
    }
    for (int64_t j = 0; !rc && j < k; j++) topk_ids[j] = -1, topk_lps[j] = NAN;
    for (int64_t t = 1; !rc && k > 0 && t < n; t++) /* no logits were computed when k = 0 */
        tinker_row_topk(logits + (t - 1) * V, V, k, topk_ids + t * k, topk_lps + t * k);
    free(lp);
    free(logits);
    return rc;
}
