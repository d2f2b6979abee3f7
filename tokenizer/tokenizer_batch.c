/* tokenizer_encode_batch: many texts encoded on the OpenMP pool (the one every CPU op and
 * OpenBLAS share, docs/dependencies.md). tokenizer_encode keeps its scratch per call, so
 * the texts need no lock; each thread takes the next text as it finishes one (texts
 * differ in length by orders of magnitude). */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>

/* Below this many bytes in all, the pool's start costs more than it saves. */
#define BATCH_PARALLEL_BYTES 4096

int tokenizer_encode_batch(const struct tokenizer *tok, const char *const *texts, const size_t *lens, size_t count,
                           bool allow_special, int32_t **ids, size_t *n, struct smelt_error *err) {
    if (!tok || (count && (!texts || !lens || !ids || !n)))
        return error_set(err, SMELT_EINVAL, "tokenizer_encode_batch: tokenizer, texts, lens, ids and n are required");
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++) {
        ids[i] = NULL;
        n[i] = 0;
        bytes += lens[i];
    }
    /* The lowest failing index's error is reported, whatever order the threads ran in. */
    size_t first_bad = count;
    struct smelt_error first_err = {0};
    int first_rc = SMELT_OK;
#pragma omp parallel for schedule(dynamic, 1) if (count > 1 && bytes >= BATCH_PARALLEL_BYTES)
    for (size_t i = 0; i < count; i++) {
        struct smelt_error e = {0};
        int rc = tokenizer_encode(tok, texts[i], lens[i], allow_special, &ids[i], &n[i], &e);
        if (rc) {
#pragma omp critical(tokenizer_batch_error)
            if (i < first_bad) {
                first_bad = i;
                first_rc = rc;
                first_err = e;
            }
        }
    }
    if (first_bad == count) return SMELT_OK;
    for (size_t i = 0; i < count; i++) {
        free(ids[i]);
        ids[i] = NULL;
        n[i] = 0;
    }
    *err = first_err;
    return error_wrap(err, first_rc, "text %zu of %zu", first_bad, count);
}
