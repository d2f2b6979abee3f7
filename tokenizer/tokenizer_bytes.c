/* The byte tokenizer for tiny demo and test models: ids 0-255 are the bytes, then the
 * special tokens; no merges. It is built as the tokenizer.json that describes it (BPE,
 * ByteLevel pre-tokenizer without regex or prefix space, ByteLevel decoder), so that what
 * tokenizer_save writes is exactly what `tokenizers` and smelt read back. */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#define MAX_SPECIALS 65536

static json_t *byte_vocab(void) {
    json_t *vocab = json_object();
    for (int b = 0; vocab && b < 256; b++) {
        char ch[5] = {0};
        tok_utf8_encode(tok_byte_to_char((unsigned char)b), ch);
        if (json_object_set_new(vocab, ch, json_integer(b))) {
            json_decref(vocab);
            return NULL;
        }
    }
    return vocab;
}

static json_t *special_list(const char *const *specials, size_t n) {
    json_t *added = json_array();
    for (size_t i = 0; added && i < n; i++) {
        json_t *t = json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)(256 + i),
                              "content", specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                              "normalized", 0, "special", 1);
        if (json_array_append_new(added, t)) {
            json_decref(added);
            return NULL;
        }
    }
    return added;
}

static int check_specials(const char *const *specials, size_t n, struct smelt_error *err) {
    if (n > MAX_SPECIALS)
        return error_set(err, SMELT_EINVAL, "tokenizer_create_bytes: %zu specials, at most %d", n, MAX_SPECIALS);
    for (size_t i = 0; i < n; i++) {
        int32_t cp;
        if (!specials[i] || !specials[i][0])
            return error_set(err, SMELT_EINVAL, "tokenizer_create_bytes: special %zu is empty", i);
        for (size_t k = 0, len = strlen(specials[i]); k < len;) {
            size_t u = tok_utf8_decode(specials[i] + k, len - k, &cp);
            if (!u)
                return error_set(err, SMELT_EINVAL, "tokenizer_create_bytes: special %zu is not UTF-8", i);
            k += u;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(specials[i], specials[j]))
                return error_set(err, SMELT_EINVAL, "tokenizer_create_bytes: special '%s' is listed twice",
                                 specials[i]);
    }
    return SMELT_OK;
}

int tokenizer_create_bytes(const char *const *specials, size_t n_specials,
                           struct tokenizer **out, struct smelt_error *err) {
    static const char *const defaults[] = {"<|bos|>", "<|eos|>", "<|pad|>"};
    if (!out) return error_set(err, SMELT_EINVAL, "tokenizer_create_bytes: out is required");
    *out = NULL;
    if (!specials || !n_specials) {
        specials = defaults;
        n_specials = 3;
    }
    int rc = check_specials(specials, n_specials, err);
    if (rc) return rc;
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o*, s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o*, s:[]}}",
        "version", "1.0", "truncation", "padding", "added_tokens", special_list(specials, n_specials),
        "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
        "use_regex", 0, "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 1, "use_regex", 0, "model", "type", "BPE", "dropout", "unk_token",
        "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
        "ignore_merges", 0, "vocab", byte_vocab(), "merges");
    if (!root || !json_object_get(root, "added_tokens") ||
        !json_object_get(json_object_get(root, "model"), "vocab")) {
        json_decref(root);
        return error_set(err, SMELT_ENOMEM, "tokenizer_create_bytes: out of memory");
    }
    rc = tok_build(root, "byte tokenizer", out, err); /* bos/eos/pad found by name */
    json_decref(root);
    return rc;
}
