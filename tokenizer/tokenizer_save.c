/* tokenizer_save: writes tokenizer.json from the loaded tables (vocabulary in id order,
 * merges as [left, right] pairs by rank, added tokens) and the config sections kept as
 * read. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/json.h"

static json_t *string_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *added_json(const struct tok_added_set *set) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < set->count; i++) {
        const struct tok_added *a = &set->items[i];
        json_t *t = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)a->id, "content",
                              a->content, "single_word", a->single_word, "lstrip", a->lstrip,
                              "rstrip", a->rstrip, "normalized", a->normalized, "special", a->special);
        if (json_array_append_new(arr, t)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *vocab_json(const struct tok_bpe *bpe) {
    json_t *vocab = json_object();
    for (int32_t id = 0; vocab && id < bpe->n_slots; id++) {
        const char *s = tok_bpe_token(bpe, id);
        if (s && json_object_set_new(vocab, s, json_integer(id))) {
            json_decref(vocab);
            return NULL;
        }
    }
    return vocab;
}

static json_t *merges_json(const struct tok_bpe *bpe) {
    json_t *arr = json_array();
    for (size_t r = 0; arr && r < bpe->n_merges; r++) {
        json_t *pair = json_pack("[s, s]", tok_bpe_token(bpe, bpe->merge_list[r][0]),
                                 tok_bpe_token(bpe, bpe->merge_list[r][1]));
        if (json_array_append_new(arr, pair)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *model_json(const struct tok_bpe *bpe) {
    return json_pack("{s:s, s:n, s:o, s:o, s:o, s:b, s:b, s:b, s:o*, s:o*}", "type", "BPE",
                     "dropout", "unk_token", string_or_null(bpe->unk_token),
                     "continuing_subword_prefix", string_or_null(bpe->prefix),
                     "end_of_word_suffix", string_or_null(bpe->suffix), "fuse_unk", bpe->fuse_unk,
                     "byte_fallback", bpe->byte_fallback, "ignore_merges", bpe->ignore_merges,
                     "vocab", vocab_json(bpe), "merges", merges_json(bpe));
}

int tokenizer_save(const struct tokenizer *tok, const char *path, struct smelt_error *err) {
    if (!tok || !path) return error_set(err, SMELT_EINVAL, "tokenizer_save: tokenizer and path are required");
    json_t *root = json_pack("{s:s, s:n, s:n, s:o*, s:O, s:O, s:O, s:O, s:o*}", "version", "1.0",
                             "truncation", "padding", "added_tokens", added_json(&tok->added),
                             "normalizer", tok->normalizer_json, "pre_tokenizer", tok->pretok_json,
                             "post_processor", tok->post_json, "decoder", tok->decoder_json,
                             "model", model_json(&tok->bpe));
    const json_t *model = json_object_get(root, "model");
    if (!root || !json_object_get(root, "added_tokens") || !json_object_get(model, "vocab") ||
        !json_object_get(model, "merges")) {
        json_decref(root);
        return error_set(err, SMELT_ENOMEM, "tokenizer_save: out of memory building %s", path);
    }
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text) return error_set(err, SMELT_ENOMEM, "tokenizer_save: out of memory writing %s", path);
    int rc = file_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
