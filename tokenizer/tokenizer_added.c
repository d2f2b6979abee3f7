/* Added tokens (<|im_start|>, <s>, ...): found in the text before the model sees it.
 *
 * As in `tokenizers`, tokens with normalized=false are searched in the raw text and those
 * with normalized=true in the normalized text (their content normalized the same way);
 * at each position the longest token wins, the leftmost position first. single_word
 * demands no word character (letter, digit, '_') on either side; lstrip / rstrip make the
 * token swallow the whitespace before / after it. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

static int parse_one(const json_t *j, const char *where, struct tok_added *a,
                     struct smelt_error *err) {
    static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip",
                                       "normalized", "special", NULL};
    int64_t id;
    const char *content;
    int rc = json_check_keys(j, keys, where, err);
    if (!rc) rc = json_field_int(j, "id", true, 0, 0, TOK_MAX_ID - 1, &id, where, err);
    if (!rc) rc = json_field_string(j, "content", true, NULL, &content, where, err);
    if (!rc) rc = json_field_bool(j, "special", false, false, &a->special, where, err);
    if (!rc) rc = json_field_bool(j, "single_word", false, false, &a->single_word, where, err);
    if (!rc) rc = json_field_bool(j, "lstrip", false, false, &a->lstrip, where, err);
    if (!rc) rc = json_field_bool(j, "rstrip", false, false, &a->rstrip, where, err);
    if (!rc) rc = json_field_bool(j, "normalized", false, !a->special, &a->normalized, where, err);
    if (rc) return rc;
    a->id = (int32_t)id;
    a->len = strlen(content);
    if (a->len == 0) return error_set(err, SMELT_EFORMAT, "%s: empty content", where);
    a->content = strdup(content);
    if (!a->content) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    return SMELT_OK;
}

int tok_added_parse(const json_t *arr, const char *where, struct tok_added_set *set,
                    struct smelt_error *err) {
    *set = (struct tok_added_set){0};
    if (!arr || json_is_null(arr)) return SMELT_OK;
    if (!json_is_array(arr)) return error_set(err, SMELT_EFORMAT, "%s: must be an array", where);
    size_t count = json_array_size(arr);
    set->items = calloc(count ? count : 1, sizeof *set->items);
    if (!set->items) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    for (size_t i = 0; i < count; i++) {
        char sub[400];
        snprintf(sub, sizeof sub, "%s[%zu]", where, i);
        set->count = i + 1;
        int rc = parse_one(json_array_get(arr, i), sub, &set->items[i], err);
        if (!rc) rc = tok_str_map_put(&set->by_content, set->items[i].content, set->items[i].len, (int32_t)i, err);
        if (rc) return rc;
        set->n_normalized += set->items[i].normalized;
    }
    return SMELT_OK;
}

void tok_added_free(struct tok_added_set *set) {
    for (size_t i = 0; i < set->count; i++) {
        if (set->items[i].match != set->items[i].content) free(set->items[i].match);
        free(set->items[i].content);
    }
    free(set->items);
    free(set->order);
    tok_str_map_free(&set->by_content);
    *set = (struct tok_added_set){0};
}

struct sort_key {
    unsigned char first;
    size_t len;
    uint32_t index;
};

static int by_first_byte_then_longest(const void *x, const void *y) {
    const struct sort_key *a = x, *b = y;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->index < b->index ? -1 : 1;
}

/* order = the tokens with a non-empty match string, by first byte then longest first. */
static int build_index(struct tok_added_set *set, size_t n_index, struct smelt_error *err) {
    struct sort_key *keys = malloc((n_index ? n_index : 1) * sizeof *keys);
    set->order = malloc((n_index ? n_index : 1) * sizeof *set->order);
    if (!keys || !set->order) {
        free(keys);
        return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < set->count; i++) {
        const struct tok_added *a = &set->items[i];
        if (a->match_len > 0) keys[k++] = (struct sort_key){(unsigned char)a->match[0], a->match_len, (uint32_t)i};
    }
    qsort(keys, n_index, sizeof *keys, by_first_byte_then_longest);
    size_t pos = 0;
    for (int b = 0; b < 256; b++) {
        set->bucket[b] = (uint32_t)pos;
        while (pos < n_index && keys[pos].first == b) {
            set->order[pos] = keys[pos].index;
            pos++;
        }
    }
    set->bucket[256] = (uint32_t)pos;
    free(keys);
    return SMELT_OK;
}

int tok_added_prepare(struct tok_added_set *set, const struct tok_normalizer *norm,
                      struct smelt_error *err) {
    struct tok_bytes buf = {0};
    size_t n_index = 0;
    for (size_t i = 0; i < set->count; i++) {
        struct tok_added *a = &set->items[i];
        a->match = a->content;
        a->match_len = a->len;
        if (a->normalized && norm) {
            int rc = tok_normalize(norm, a->content, a->len, &buf, err);
            if (!rc) rc = tok_bytes_append(&buf, "", 1, err);
            if (rc) {
                tok_bytes_free(&buf);
                return rc;
            }
            a->match = malloc(buf.len);
            if (!a->match) {
                a->match = a->content;
                tok_bytes_free(&buf);
                return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory");
            }
            memcpy(a->match, buf.data, buf.len);
            a->match_len = buf.len - 1;
        }
        n_index += a->match_len > 0;
    }
    tok_bytes_free(&buf);
    return build_index(set, n_index, err);
}

static bool is_word_char(int32_t cp) { return cp == '_' || tok_is_alnum(cp); }

/* The code point of the character ending at s[pos) (not before lo); false when none. */
static bool char_before(const char *s, size_t lo, size_t pos, int32_t *cp, size_t *len) {
    for (size_t k = 1; k <= 4 && k <= pos - lo; k++)
        if (tok_utf8_decode(s + pos - k, k, cp) == k) {
            *len = k;
            return true;
        }
    return false;
}

static bool single_word_ok(const char *s, size_t n, size_t start, size_t end) {
    int32_t cp;
    size_t k;
    if (char_before(s, 0, start, &cp, &k) && is_word_char(cp)) return false;
    return !(tok_utf8_decode(s + end, n - end, &cp) && is_word_char(cp));
}

/* The added token matching at s[pos..), NULL when none. */
static const struct tok_added *match_at(const struct tok_added_set *set, bool normalized,
                                        bool allow_special, const char *s, size_t n, size_t pos) {
    unsigned char b = (unsigned char)s[pos];
    for (uint32_t i = set->bucket[b]; i < set->bucket[b + 1]; i++) {
        const struct tok_added *a = &set->items[set->order[i]];
        if (a->normalized != normalized || (a->special && !allow_special)) continue;
        if (a->match_len > n - pos || memcmp(s + pos, a->match, a->match_len) != 0) continue;
        if (a->single_word && !single_word_ok(s, n, pos, pos + a->match_len)) continue;
        return a;
    }
    return NULL;
}

static int split_piece(const struct tok_added_set *set, bool normalized, bool allow_special,
                       struct tok_text *t, struct tok_piece pc, struct smelt_error *err) {
    const char *s = t->arena.data + pc.off;
    size_t last = 0, pos = 0;
    while (pos < pc.len) {
        const struct tok_added *a = match_at(set, normalized, allow_special, s, pc.len, pos);
        if (!a) {
            pos += tok_utf8_unit(s + pos, pc.len - pos);
            continue;
        }
        size_t start = pos, end = pos + a->match_len, k;
        int32_t cp;
        while (a->lstrip && char_before(s, last, start, &cp, &k) && tok_is_whitespace(cp)) start -= k;
        while (a->rstrip && (k = tok_utf8_decode(s + end, pc.len - end, &cp)) && tok_is_whitespace(cp)) end += k;
        int rc = SMELT_OK;
        if (start > last)
            rc = tok_pieces_push(&t->next, (struct tok_piece){pc.off + last, start - last, -1,
                                                             pc.at_start && last == 0}, err);
        if (!rc) rc = tok_pieces_push(&t->next, (struct tok_piece){pc.off + start, end - start, a->id, false}, err);
        if (rc) return rc;
        last = pos = end;
    }
    if (last < pc.len)
        return tok_pieces_push(&t->next, (struct tok_piece){pc.off + last, pc.len - last, -1,
                                                           pc.at_start && last == 0}, err);
    return SMELT_OK;
}

int tok_added_split(const struct tok_added_set *set, bool normalized, bool allow_special,
                    struct tok_text *t, struct smelt_error *err) {
    for (size_t i = 0; i < t->pieces.count; i++) {
        struct tok_piece pc = t->pieces.items[i];
        int rc = pc.added_id >= 0 ? tok_pieces_push(&t->next, pc, err)
                                  : split_piece(set, normalized, allow_special, t, pc, err);
        if (rc) return rc;
    }
    tok_text_commit(t);
    return SMELT_OK;
}
