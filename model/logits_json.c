/* model_write_logits_json: one sequence's logits as JSON, for the parity tools that
 * compare smelt with transformers/PEFT. */
#include <stdlib.h>

#include "model/transformer.h"

static void write_rows(const float *logits, int64_t n, int64_t V, FILE *out) {
    fputs("{\"logits\": [", out);
    for (int64_t t = 0; t < n; t++) {
        fputs(t ? ", [" : "[", out);
        for (int64_t v = 0; v < V; v++) fprintf(out, v ? ", %.9g" : "%.9g", logits[t * V + v]);
        fputs("]", out);
    }
    fputs("]}\n", out);
}

int model_write_logits_json(struct model *model, const int32_t *ids, int64_t n, FILE *out,
                            struct smelt_error *err) {
    if (n < 1 || n > INT32_MAX) return error_set(err, SMELT_EINVAL, "logits: need 1.. ids, got %lld", (long long)n);
    int64_t V = model->config.vocab_size;
    struct model_acts *acts = NULL;
    float *logits = malloc((size_t)(n * V) * sizeof *logits);
    int rc = logits ? SMELT_OK : error_set(err, SMELT_ENOMEM, "logits: out of memory for %lld x %lld", (long long)n, (long long)V);
    if (!rc) rc = model_acts_alloc(model, n, false, &acts, err);
    if (!rc) {
        int32_t cu[2] = {0, (int32_t)n};
        int64_t shape[2] = {n, V};
        struct tensor tl = tensor_f32(logits, 2, shape);
        struct model_batch b = {.n_tokens = n, .n_seqs = 1, .ids = ids, .cu_seqlens = cu};
        rc = model_forward(model, acts, &b, NULL, &tl, NULL, err);
    }
    if (!rc) write_rows(logits, n, V, out);
    model_acts_free(acts);
    free(logits);
    return rc;
}
