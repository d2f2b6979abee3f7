/* tokenizer_decode: ids → token strings → the decoder chain → bytes. Without a decoder
 * the tokens are joined with spaces, as `tokenizers` does. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static int token_strings(const struct tokenizer *tok, const int32_t *ids, size_t n,
                         bool skip_special, struct tok_strlist *out, struct smelt_error *err) {
    for (size_t i = 0; i < n; i++) {
        const char *s = tokenizer_id_to_token(tok, ids[i]);
        if (!s)
            return error_set(err, SMELT_EINVAL,
                             "tokenizer_decode: id %d at position %zu has no token (vocabulary "
                             "size %d)", ids[i], i, tok->n_ids);
        if (skip_special && tokenizer_is_special(tok, ids[i])) continue;
        int rc = tok_strlist_push(out, s, strlen(s), err);
        if (rc) return rc;
    }
    return SMELT_OK;
}

static int join(const struct tok_strlist *l, const char *sep, char **text, size_t *len,
                struct smelt_error *err) {
    struct tok_bytes b = {0};
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < l->count; i++) {
        if (i > 0) rc = tok_bytes_append(&b, sep, strlen(sep), err);
        /* an empty piece may have no storage at all (a decoder's empty output) */
        if (!rc && l->len[i]) rc = tok_bytes_append(&b, l->data.data + l->off[i], l->len[i], err);
    }
    if (!rc) rc = tok_bytes_append(&b, "", 1, err);
    if (rc) {
        tok_bytes_free(&b);
        return rc;
    }
    *text = b.data;
    *len = b.len - 1;
    return SMELT_OK;
}

int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n,
                     bool skip_special, char **text, size_t *len, struct smelt_error *err) {
    if (!tok || !text || !len || (!ids && n))
        return error_set(err, SMELT_EINVAL, "tokenizer_decode: tokenizer, ids, text and len are required");
    *text = NULL;
    *len = 0;
    struct tok_strlist tokens = {0}, decoded = {0};
    int rc = token_strings(tok, ids, n, skip_special, &tokens, err);
    if (!rc && tok->decoder) rc = tok_decoder_apply(tok->decoder, &tokens, &decoded, err);
    if (!rc) rc = join(tok->decoder ? &decoded : &tokens, tok->decoder ? "" : " ", text, len, err);
    tok_strlist_free(&tokens);
    tok_strlist_free(&decoded);
    return rc;
}
