/* The BPE model: vocabulary and merges from tokenizer.json's "model", and the encoding of
 * one pre-tokenized piece.
 *
 * Encoding is `tokenizers`' Word::merge_all: the piece's characters become a linked list
 * of symbols; every adjacent pair with a merge goes into a min-heap keyed (rank,
 * position); the top is merged when still current, and the pairs it forms with its
 * neighbours are pushed. O(n log n) per piece, and the same tie-breaking (lowest rank,
 * then leftmost) as the reference, so ids match exactly. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

struct tok_bpe_symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t len;       /* bytes of the piece it covers; 0 once merged into its left */
};

struct tok_bpe_merge {
    int32_t rank, pos, merged;
};

static int copy_optional_string(const json_t *model, const char *key, const char *where,
                                char **out, size_t *len, struct smelt_error *err) {
    const char *s;
    int rc = json_field_string(model, key, false, NULL, &s, where, err);
    if (rc || !s || !*s) return rc; /* "" means none, as in `tokenizers` */
    *len = strlen(s);
    *out = strdup(s);
    if (!*out) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    return SMELT_OK;
}

static int parse_options(const json_t *model, const char *where, struct tok_bpe *bpe,
                         struct smelt_error *err) {
    static const char *const keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                       "end_of_word_suffix", "fuse_unk", "byte_fallback",
                                       "ignore_merges", "vocab", "merges", NULL};
    int rc = json_check_keys(model, keys, where, err);
    if (rc) return rc;
    double dropout;
    rc = json_field_double(model, "dropout", false, 0.0, 0.0, 1.0, &dropout, where, err);
    if (rc) return rc;
    if (dropout > 0.0)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: BPE dropout %g is not supported (it makes encoding random)", where,
                         dropout);
    size_t unk_len = 0;
    rc = copy_optional_string(model, "unk_token", where, &bpe->unk_token, &unk_len, err);
    if (!rc) rc = copy_optional_string(model, "continuing_subword_prefix", where, &bpe->prefix, &bpe->prefix_len, err);
    if (!rc) rc = copy_optional_string(model, "end_of_word_suffix", where, &bpe->suffix, &bpe->suffix_len, err);
    if (!rc) rc = json_field_bool(model, "fuse_unk", false, false, &bpe->fuse_unk, where, err);
    if (!rc) rc = json_field_bool(model, "byte_fallback", false, false, &bpe->byte_fallback, where, err);
    if (!rc) rc = json_field_bool(model, "ignore_merges", false, false, &bpe->ignore_merges, where, err);
    return rc;
}

static int parse_vocab(const json_t *model, const char *where, struct tok_bpe *bpe,
                       struct smelt_error *err) {
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return error_set(err, SMELT_EFORMAT, "%s: 'vocab' must be an object of token: id", where);
    const char *token;
    const json_t *v;
    int64_t max_id = -1;
    json_object_foreach((json_t *)vocab, token, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
            return error_set(err, SMELT_EFORMAT, "%s: vocab['%s'] must be an id in [0, %d)", where,
                             token, TOK_MAX_ID);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    bpe->n_slots = (int32_t)(max_id + 1);
    bpe->token_off = malloc((size_t)(bpe->n_slots ? bpe->n_slots : 1) * sizeof *bpe->token_off);
    if (!bpe->token_off) return error_set(err, SMELT_ENOMEM, "%s: out of memory for the vocabulary", where);
    for (int32_t i = 0; i < bpe->n_slots; i++) bpe->token_off[i] = -1;
    json_object_foreach((json_t *)vocab, token, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (bpe->token_off[id] >= 0)
            return error_set(err, SMELT_EFORMAT, "%s: tokens '%s' and '%s' both have id %d", where,
                             bpe->pool.data + bpe->token_off[id], token, id);
        size_t len = strlen(token);
        bpe->token_off[id] = (int64_t)bpe->pool.len;
        int rc = tok_bytes_append(&bpe->pool, token, len + 1, err);
        if (!rc) rc = tok_str_map_put(&bpe->vocab, token, len, id, err);
        if (rc) return rc;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (!tok_str_map_get(&bpe->vocab, name, 6, &bpe->byte_ids[b])) bpe->byte_ids[b] = -1;
    }
    bpe->unk_id = -1;
    if (bpe->unk_token) tok_str_map_get(&bpe->vocab, bpe->unk_token, strlen(bpe->unk_token), &bpe->unk_id);
    return SMELT_OK;
}

/* One merge: "left right" (one space) or ["left", "right"]. */
static int merge_parts(const json_t *m, const char *where, size_t rank, const char **left,
                       size_t *left_len, const char **right, struct smelt_error *err) {
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *left = json_string_value(json_array_get(m, 0));
        *left_len = json_string_length(json_array_get(m, 0));
        *right = json_string_value(json_array_get(m, 1));
        return SMELT_OK;
    }
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *space = strchr(s, ' ');
        if (space && space > s && space[1] && !strchr(space + 1, ' ')) {
            *left = s;
            *left_len = (size_t)(space - s);
            *right = space + 1;
            return SMELT_OK;
        }
    }
    return error_set(err, SMELT_EFORMAT,
                     "%s: merges[%zu] must be \"left right\" or [\"left\", \"right\"]", where, rank);
}

static int lookup(const struct tok_bpe *bpe, const char *s, size_t n, const char *where,
                  size_t rank, int32_t *id, struct smelt_error *err) {
    if (tok_str_map_get(&bpe->vocab, s, n, id)) return SMELT_OK;
    return error_set(err, SMELT_EFORMAT, "%s: merges[%zu] uses '%.*s', which is not in the vocabulary",
                     where, rank, (int)(n > 200 ? 200 : n), s);
}

static int parse_merges(const json_t *model, const char *where, struct tok_bpe *bpe,
                        struct smelt_error *err) {
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        return error_set(err, SMELT_EFORMAT, "%s: 'merges' must be an array", where);
    size_t count = json_array_size(merges);
    if (count >= (size_t)INT32_MAX) return error_set(err, SMELT_EFORMAT, "%s: too many merges", where);
    bpe->merge_list = malloc((count ? count : 1) * sizeof *bpe->merge_list);
    if (!bpe->merge_list) return error_set(err, SMELT_ENOMEM, "%s: out of memory for merges", where);
    struct tok_bytes joined = {0};
    int rc = SMELT_OK;
    for (size_t r = 0; r < count && !rc; r++) {
        const char *left = NULL, *right = NULL;
        size_t left_len = 0;
        int32_t a = -1, b = -1, merged = -1;
        rc = merge_parts(json_array_get(merges, r), where, r, &left, &left_len, &right, err);
        if (rc) break;
        size_t right_len = strlen(right), skip = 0;
        if (bpe->prefix && right_len >= bpe->prefix_len && !memcmp(right, bpe->prefix, bpe->prefix_len))
            skip = bpe->prefix_len;
        joined.len = 0;
        rc = tok_bytes_append(&joined, left, left_len, err);
        if (!rc) rc = tok_bytes_append(&joined, right + skip, right_len - skip, err);
        if (!rc) rc = lookup(bpe, left, left_len, where, r, &a, err);
        if (!rc) rc = lookup(bpe, right, right_len, where, r, &b, err);
        if (!rc) rc = lookup(bpe, joined.data, joined.len, where, r, &merged, err);
        if (!rc) rc = tok_pair_map_put(&bpe->merges, a, b, (int32_t)r, merged, err);
        bpe->merge_list[r][0] = a;
        bpe->merge_list[r][1] = b;
        bpe->n_merges = r + 1;
    }
    tok_bytes_free(&joined);
    return rc;
}

int tok_bpe_parse(const json_t *model, const char *where, struct tok_bpe *bpe,
                  struct smelt_error *err) {
    *bpe = (struct tok_bpe){0};
    bpe->unk_id = -1;
    if (!json_object_get(model, "merges"))
        return error_set(err, SMELT_EFORMAT, "%s: BPE model has no 'merges'", where);
    int rc = parse_options(model, where, bpe, err);
    if (!rc) rc = parse_vocab(model, where, bpe, err);
    if (!rc) rc = parse_merges(model, where, bpe, err);
    return rc;
}

void tok_bpe_free(struct tok_bpe *bpe) {
    tok_str_map_free(&bpe->vocab);
    tok_bytes_free(&bpe->pool);
    free(bpe->token_off);
    tok_pair_map_free(&bpe->merges);
    free(bpe->merge_list);
    free(bpe->unk_token);
    free(bpe->prefix);
    free(bpe->suffix);
    *bpe = (struct tok_bpe){0};
}

const char *tok_bpe_token(const struct tok_bpe *bpe, int32_t id) {
    if (id < 0 || id >= bpe->n_slots || bpe->token_off[id] < 0) return NULL;
    return bpe->pool.data + bpe->token_off[id];
}

void tok_bpe_work_free(struct tok_bpe_work *w) {
    free(w->symbols);
    free(w->heap);
    tok_bytes_free(&w->key);
    *w = (struct tok_bpe_work){0};
}

/* ---- encoding one piece ------------------------------------------------------------ */

static bool merge_less(const struct tok_bpe_merge *x, const struct tok_bpe_merge *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(struct tok_bpe_merge *h, size_t *n, struct tok_bpe_merge m) {
    size_t i = (*n)++;
    while (i > 0 && merge_less(&m, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = m;
}

static struct tok_bpe_merge heap_pop(struct tok_bpe_merge *h, size_t *n) {
    struct tok_bpe_merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void add_symbol(struct tok_bpe_work *w, size_t *ns, int32_t id, size_t len) {
    w->symbols[*ns] = (struct tok_bpe_symbol){id, (int32_t)*ns - 1, (int32_t)*ns + 1, (uint32_t)len};
    (*ns)++;
}

/* The vocabulary id of the character at word[i..i+k), with the subword prefix/suffix the
 * model asks for; false when absent. */
static bool char_id(const struct tok_bpe *bpe, struct tok_bpe_work *w, const char *word,
                    size_t n, size_t i, size_t k, int32_t *id, struct smelt_error *err, int *rc) {
    bool pre = bpe->prefix && i > 0, suf = bpe->suffix && i + k == n;
    if (!pre && !suf) return tok_str_map_get(&bpe->vocab, word + i, k, id);
    w->key.len = 0;
    *rc = tok_bytes_append(&w->key, bpe->prefix, pre ? bpe->prefix_len : 0, err);
    if (!*rc) *rc = tok_bytes_append(&w->key, word + i, k, err);
    if (!*rc) *rc = tok_bytes_append(&w->key, bpe->suffix, suf ? bpe->suffix_len : 0, err);
    return !*rc && tok_str_map_get(&bpe->vocab, w->key.data, w->key.len, id);
}

static int unknown_char(const struct tok_bpe *bpe, const char *word, size_t n, size_t i,
                        struct smelt_error *err) {
    int32_t cp;
    if (!tok_utf8_decode(word + i, n - i, &cp))
        return error_set(err, SMELT_EINVAL,
                         "tokenizer: byte 0x%02X (not valid UTF-8) has no token and the tokenizer has "
                         "no byte_fallback or unk_token", (unsigned char)word[i]);
    if (bpe->unk_token)
        return error_set(err, SMELT_EINVAL, "tokenizer: unk_token '%s' is not in the vocabulary",
                         bpe->unk_token);
    return error_set(err, SMELT_EINVAL,
                     "tokenizer: character U+%04X has no token and the tokenizer has no "
                     "byte_fallback or unk_token", (unsigned)cp);
}

/* Splits the piece into initial symbols: characters, else their <0xNN> bytes, else unk. */
static int initial_symbols(const struct tok_bpe *bpe, const char *word, size_t n,
                           struct tok_bpe_work *w, size_t *ns, struct smelt_error *err) {
    int32_t unk_len = 0; /* bytes of a pending (possibly fused) unk symbol */
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_unit(word + i, n - i);
        int32_t id;
        int rc = SMELT_OK;
        bool found = char_id(bpe, w, word, n, i, k, &id, err, &rc);
        if (rc) return rc;
        bool bytes_ok = !found && bpe->byte_fallback;
        for (size_t b = 0; bytes_ok && b < k; b++) bytes_ok = bpe->byte_ids[(unsigned char)word[i + b]] >= 0;
        if (found || bytes_ok) {
            if (unk_len) add_symbol(w, ns, bpe->unk_id, (size_t)unk_len);
            unk_len = 0;
            if (found) add_symbol(w, ns, id, k);
            for (size_t b = 0; bytes_ok && b < k; b++)
                add_symbol(w, ns, bpe->byte_ids[(unsigned char)word[i + b]], 1);
        } else {
            if (bpe->unk_id < 0) return unknown_char(bpe, word, n, i, err);
            if (unk_len && !bpe->fuse_unk) {
                add_symbol(w, ns, bpe->unk_id, (size_t)unk_len);
                unk_len = 0;
            }
            unk_len += (int32_t)k;
        }
        i += k;
    }
    if (unk_len) add_symbol(w, ns, bpe->unk_id, (size_t)unk_len);
    if (*ns) w->symbols[*ns - 1].next = -1;
    return SMELT_OK;
}

static void push_pair(const struct tok_bpe *bpe, struct tok_bpe_work *w, size_t *nh, int32_t pos) {
    const struct tok_bpe_symbol *s = w->symbols;
    int32_t rank, merged;
    if (s[pos].next >= 0 && tok_pair_map_get(&bpe->merges, s[pos].id, s[s[pos].next].id, &rank, &merged))
        heap_push(w->heap, nh, (struct tok_bpe_merge){rank, pos, merged});
}

static void merge_all(const struct tok_bpe *bpe, struct tok_bpe_work *w, size_t ns) {
    struct tok_bpe_symbol *s = w->symbols;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) push_pair(bpe, w, &nh, (int32_t)i);
    while (nh) {
        struct tok_bpe_merge top = heap_pop(w->heap, &nh);
        struct tok_bpe_symbol *left = &s[top.pos];
        if (left->len == 0 || left->next < 0) continue;
        struct tok_bpe_symbol *right = &s[left->next];
        int32_t rank, merged;
        if (!tok_pair_map_get(&bpe->merges, left->id, right->id, &rank, &merged) || rank != top.rank)
            continue; /* stale: a neighbour changed since this pair was pushed */
        left->id = merged;
        left->len += right->len;
        right->len = 0;
        left->next = right->next;
        if (left->next >= 0) s[left->next].prev = top.pos;
        if (left->prev >= 0) push_pair(bpe, w, &nh, left->prev);
        push_pair(bpe, w, &nh, top.pos);
    }
}

/* Room for n symbols (a piece of n bytes has at most n) and their pairs: each merge
 * pushes at most two, so the heap never holds more than 3n entries. */
static int reserve_work(struct tok_bpe_work *w, size_t n, struct smelt_error *err) {
    if (n > w->symbols_cap) {
        free(w->symbols);
        free(w->heap);
        w->symbols = malloc(n * sizeof *w->symbols);
        w->heap = malloc(3 * n * sizeof *w->heap);
        w->symbols_cap = w->heap_cap = 0;
        if (!w->symbols || !w->heap)
            return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        w->symbols_cap = n;
        w->heap_cap = 3 * n;
    }
    return SMELT_OK;
}

int tok_bpe_encode(const struct tok_bpe *bpe, const char *word, size_t n,
                   struct tok_bpe_work *w, struct tok_ids *out, struct smelt_error *err) {
    int32_t id;
    if (n == 0) return SMELT_OK;
    if (bpe->ignore_merges && tok_str_map_get(&bpe->vocab, word, n, &id)) return tok_ids_push(out, id, err);
    if (n >= INT32_MAX) return error_set(err, SMELT_EINVAL, "tokenizer: piece of %zu bytes is too long", n);
    int rc = reserve_work(w, n, err);
    size_t ns = 0;
    if (!rc) rc = initial_symbols(bpe, word, n, w, &ns, err);
    if (rc) return rc;
    merge_all(bpe, w, ns);
    for (int32_t i = 0; ns && i >= 0; i = w->symbols[i].next) {
        rc = tok_ids_push(out, w->symbols[i].id, err);
        if (rc) return rc;
    }
    return SMELT_OK;
}
