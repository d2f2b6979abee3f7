/* tokenizer_encode: runs the pipeline of tokenizer_internal.h over one text. All scratch
 * lives in this call, so one tokenizer serves many threads. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

int tok_pieces_push(struct tok_pieces *p, struct tok_piece piece, struct smelt_error *err) {
    if (p->count == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        struct tok_piece *items = realloc(p->items, cap * sizeof *items);
        if (!items) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for %zu pieces", cap);
        p->items = items;
        p->cap = cap;
    }
    p->items[p->count++] = piece;
    return SMELT_OK;
}

void tok_text_commit(struct tok_text *t) {
    struct tok_pieces done = t->pieces;
    t->pieces = t->next;
    t->next = done;
    t->next.count = 0;
}

static void text_free(struct tok_text *t) {
    tok_bytes_free(&t->arena);
    free(t->pieces.items);
    free(t->next.items);
    free(t->segs.items);
    tok_bytes_free(&t->scratch);
}

/* Normalizes every text piece; pieces that become empty are dropped, as `tokenizers`
 * drops empty splits. */
static int normalize_pieces(const struct tok_normalizer *norm, struct tok_text *t,
                            struct smelt_error *err) {
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece pc = t->pieces.items[i];
        int rc = SMELT_OK;
        if (pc.added_id < 0) {
            rc = tok_normalize(norm, t->arena.data + pc.off, pc.len, &t->scratch, err);
            pc.off = t->arena.len;
            pc.len = t->scratch.len;
            if (!rc) rc = tok_bytes_append(&t->arena, t->scratch.data, t->scratch.len, err);
        }
        if (!rc && (pc.added_id >= 0 || pc.len > 0)) rc = tok_pieces_push(&t->next, pc, err);
        if (rc) return rc;
    }
    tok_text_commit(t);
    return SMELT_OK;
}

static int model_pieces(const struct tokenizer *tok, struct tok_text *t, struct tok_ids *out,
                        struct smelt_error *err) {
    struct tok_bpe_work w = {0};
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < t->pieces.count; i++) {
        const struct tok_piece *pc = &t->pieces.items[i];
        rc = pc->added_id >= 0 ? tok_ids_push(out, pc->added_id, err)
                               : tok_bpe_encode(&tok->bpe, t->arena.data + pc->off, pc->len, &w, out, err);
    }
    tok_bpe_work_free(&w);
    return rc;
}

static int run_pipeline(const struct tokenizer *tok, const char *text, size_t len,
                        bool allow_special, struct tok_text *t, struct tok_ids *out,
                        struct smelt_error *err) {
    int rc = tok_bytes_append(&t->arena, text, len, err);
    if (!rc && len > 0) rc = tok_pieces_push(&t->pieces, (struct tok_piece){0, len, -1, true}, err);
    if (!rc && tok->added.count > tok->added.n_normalized)
        rc = tok_added_split(&tok->added, false, allow_special, t, err);
    if (!rc && tok->normalizer) rc = normalize_pieces(tok->normalizer, t, err);
    if (!rc && tok->added.n_normalized) rc = tok_added_split(&tok->added, true, allow_special, t, err);
    if (!rc && tok->pretok) rc = tok_pretokenize(tok->pretok, t, err);
    if (!rc) rc = model_pieces(tok, t, out, err);
    return rc;
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                     bool allow_special, int32_t **ids, size_t *n, struct smelt_error *err) {
    if (!tok || !ids || !n || (!text && len))
        return error_set(err, SMELT_EINVAL, "tokenizer_encode: tokenizer, text, ids and n are required");
    *ids = NULL;
    *n = 0;
    struct tok_text t = {0};
    struct tok_ids out = {0};
    int rc = run_pipeline(tok, text, len, allow_special, &t, &out, err);
    text_free(&t);
    if (rc) {
        free(out.items);
        return error_wrap(err, rc, "encoding with %s", tok->source);
    }
    *ids = out.items;
    *n = out.count;
    return SMELT_OK;
}
