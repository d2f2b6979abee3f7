/* chat_render and chat_tokenize: the pieces of chat_template_build.c as text, and as
 * token ids with the assistant mask.
 *
 * Tokenization, and why segment by segment (docs/chat-templates.md has the details):
 * control tokens are looked up as ids; the text between two control tokens is encoded
 * with allow_special = false, so content cannot inject a control token, in one call per
 * stretch of equal mask. Encoding the whole rendered text at once gives the same ids
 * except where BPE or the pre-tokenizer would join characters across a change of mask
 * (content that starts with a newline right after "assistant\n"). Splitting there is what
 * trainers want: the prompt's ids are then exactly those the model sees at generation
 * time, whatever answer follows. */
#include "tokenizer/chat_template_internal.h"

#include <stdlib.h>
#include <string.h>

int chat_render(const struct chat_template *t, const struct chat_message *messages, size_t n,
                bool add_generation_prompt, char **text, size_t *len, struct smelt_error *err) {
    if (!text || !len) return error_set(err, SMELT_EINVAL, "chat_render: text and len are required");
    *text = NULL;
    *len = 0;
    struct chat_pieces p = {0};
    int rc = chat_build_pieces(t, messages, n, add_generation_prompt, &p, err);
    size_t total = 0;
    for (size_t i = 0; !rc && i < p.count; i++) total += p.items[i].len;
    char *out = rc ? NULL : malloc(total + 1);
    if (!rc && !out) rc = error_set(err, SMELT_ENOMEM, "chat_render: out of memory for %zu bytes", total + 1);
    if (!rc) {
        size_t at = 0;
        for (size_t i = 0; i < p.count; i++) {
            if (p.items[i].len) memcpy(out + at, p.items[i].text, p.items[i].len);
            at += p.items[i].len;
        }
        out[at] = '\0';
        *text = out;
        *len = at;
    }
    free(p.items);
    return rc;
}

/* ---- tokenization ---- */

struct id_list {
    int32_t *ids;
    uint8_t *mask;
    size_t count, cap;
};

static int ids_append(struct id_list *l, const int32_t *ids, size_t n, bool trained, struct smelt_error *err) {
    if (l->count + n > l->cap) {
        size_t cap = l->cap ? l->cap : 256;
        while (cap < l->count + n) cap *= 2;
        int32_t *ids2 = realloc(l->ids, cap * sizeof *ids2);
        if (ids2) l->ids = ids2;
        uint8_t *mask2 = ids2 ? realloc(l->mask, cap) : NULL;
        if (mask2) l->mask = mask2;
        if (!ids2 || !mask2)
            return error_set(err, SMELT_ENOMEM, "chat_tokenize: out of memory for %zu token ids", cap);
        l->cap = cap;
    }
    memcpy(l->ids + l->count, ids, n * sizeof *ids);
    memset(l->mask + l->count, trained, n);
    l->count += n;
    return SMELT_OK;
}

/* Whether every encode call starts its text with a word-boundary marker, as
 * SentencePiece-style tokenizers do (Prepend("▁") normalizer, Metaspace): then "a" and
 * "b" encoded apart give the ids of "a b". */
static bool prefixes_space(const struct tokenizer *tok) {
    int32_t *a = NULL, *b = NULL, *ab = NULL;
    size_t na = 0, nb = 0, nab = 0;
    /* A tokenizer that cannot encode the probe (no "a", no unk) simply is not one. */
    bool ok = !tokenizer_encode(tok, "a", 1, false, &a, &na, NULL) &&
              !tokenizer_encode(tok, "b", 1, false, &b, &nb, NULL) &&
              !tokenizer_encode(tok, "a b", 3, false, &ab, &nab, NULL);
    bool prefix = ok && na + nb == nab && (!na || !memcmp(a, ab, na * sizeof *a)) &&
                  (!nb || !memcmp(b, ab + na, nb * sizeof *b));
    free(a);
    free(b);
    free(ab);
    return prefix;
}

/* The id of a control-token piece, or -1 when it is text (a marker the tokenizer does
 * not have as a special token). A TOKEN piece the tokenizer lacks is an error. */
static int control_id(const struct chat_template *t, const struct tokenizer *tok, const struct chat_piece *pc,
                      int32_t *id, struct smelt_error *err) {
    *id = -1;
    if (pc->kind != CHAT_PIECE_TOKEN && pc->kind != CHAT_PIECE_MARKER) return SMELT_OK;
    int32_t found = tokenizer_token_to_id(tok, pc->text, pc->len);
    if (pc->kind == CHAT_PIECE_MARKER) {
        if (found >= 0 && tokenizer_is_special(tok, found)) *id = found;
        return SMELT_OK;
    }
    if (found < 0)
        return error_set(err, SMELT_EINVAL, "chat_tokenize: the %s template needs the token '%.*s', which the "
                         "tokenizer does not have", chat_template_name(t->kind), (int)pc->len, pc->text);
    *id = found;
    return SMELT_OK;
}

struct text_buf {
    char *data;
    size_t len, cap;
};

static int buf_append(struct text_buf *b, const char *s, size_t n, struct smelt_error *err) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return error_set(err, SMELT_ENOMEM, "chat_tokenize: out of memory for %zu bytes", cap);
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return SMELT_OK;
}

static int encode_run(const struct tokenizer *tok, const char *text, size_t len, bool trained,
                      struct id_list *out, struct smelt_error *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tok, text, len, false, &ids, &n, err);
    if (!rc) rc = ids_append(out, ids, n, trained, err);
    free(ids);
    return rc;
}

/* Walks the pieces: control tokens become ids, runs of text with one mask bit are
 * encoded together. A run that continues text across a change of mask (no control token
 * between) is text in mid-sentence: a tokenizer that prefixes a word boundary to every
 * encode call (prefix) already stands for one leading space there, so the run's own
 * leading space is dropped rather than doubled ("[/INST] hello" → ▁[/INST] ▁hello). */
static int tokenize_pieces(const struct chat_template *t, const struct tokenizer *tok,
                           const struct chat_pieces *p, bool prefix, struct id_list *out,
                           struct smelt_error *err) {
    struct text_buf run = {0};
    bool prev_text = false;
    int rc = SMELT_OK;
    for (size_t i = 0; !rc && i < p->count;) {
        const struct chat_piece *pc = &p->items[i];
        int32_t id;
        if (!pc->len || (rc = control_id(t, tok, pc, &id, err)) != 0) {
            i++;
            continue;
        }
        if (id >= 0) {
            rc = ids_append(out, &id, 1, pc->trained, err);
            prev_text = false;
            i++;
            continue;
        }
        bool trained = pc->trained;
        run.len = 0;
        for (; !rc && i < p->count && p->items[i].trained == trained; i++) {
            if (!p->items[i].len) continue;
            rc = control_id(t, tok, &p->items[i], &id, err);
            if (rc || id >= 0) break;
            rc = buf_append(&run, p->items[i].text, p->items[i].len, err);
        }
        size_t skip = prefix && prev_text && run.len && run.data[0] == ' ';
        if (!rc) rc = encode_run(tok, run.data + skip, run.len - skip, trained, out, err);
        prev_text = true;
    }
    free(run.data);
    return rc;
}

int chat_tokenize(const struct chat_template *t, const struct tokenizer *tok,
                  const struct chat_message *messages, size_t n, bool add_generation_prompt,
                  int32_t **ids, uint8_t **assistant_mask, size_t *n_ids, struct smelt_error *err) {
    if (!tok || !ids || !assistant_mask || !n_ids)
        return error_set(err, SMELT_EINVAL, "chat_tokenize: tokenizer, ids, assistant_mask and n_ids are required");
    *ids = NULL;
    *assistant_mask = NULL;
    *n_ids = 0;
    struct chat_pieces p = {0};
    struct id_list out = {0};
    int rc = chat_build_pieces(t, messages, n, add_generation_prompt, &p, err);
    if (!rc) rc = tokenize_pieces(t, tok, &p, prefixes_space(tok), &out, err);
    free(p.items);
    if (rc) {
        free(out.ids);
        free(out.mask);
        return rc;
    }
    *ids = out.ids;
    *assistant_mask = out.mask;
    *n_ids = out.count;
    return SMELT_OK;
}
