/* GPT-2's original files: encoder.json (token → id) and vocab.bpe ("#version" line, then
 * one "left right" merge per line). They are turned into the tokenizer.json that
 * `tokenizers` would make of them (ByteLevel pre-tokenizer with the GPT-2 regex and no
 * prefix space, ByteLevel decoder, <|endoftext|> as a special token), so one code path
 * serves both formats and tokenizer_save writes them out as tokenizer.json. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/json.h"

#define ENDOFTEXT "<|endoftext|>"

static int read_merges(const char *path, json_t *merges, struct smelt_error *err) {
    char *text;
    size_t len;
    int rc = file_read_all(path, &text, &len, err);
    if (rc) return rc;
    size_t line_no = 0;
    for (char *line = text; !rc && line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        line_no++;
        if (end > line && end[-1] == '\r') end--;
        *end = '\0';
        bool skip = end == line || (line_no == 1 && !strncmp(line, "#version", 8));
        if (!skip) {
            char *space = strchr(line, ' ');
            if (!space || space == line || !space[1] || strchr(space + 1, ' '))
                rc = error_set(err, SMELT_EFORMAT, "%s:%zu: expected \"left right\"", path, line_no);
            else if (json_array_append_new(merges, json_stringn(line, (size_t)(end - line))))
                rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
        }
        line = nl ? nl + 1 : text + len;
    }
    free(text);
    return rc;
}

static json_t *byte_level_section(bool use_regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", use_regex);
}

int tok_load_gpt2(const char *encoder_path, const char *merges_path, struct tokenizer **out,
                  struct smelt_error *err) {
    json_t *vocab = NULL, *merges = json_array();
    int rc = merges ? json_load_path(encoder_path, &vocab, err)
                    : error_set(err, SMELT_ENOMEM, "%s: out of memory", merges_path);
    if (!rc && !json_is_object(vocab))
        rc = error_set(err, SMELT_EFORMAT, "%s: expected an object of token: id", encoder_path);
    if (!rc) rc = read_merges(merges_path, merges, err);
    json_t *root = NULL;
    if (!rc) {
        json_t *added = json_array();
        const json_t *eot = json_object_get(vocab, ENDOFTEXT);
        if (added && json_is_integer(eot))
            json_array_append_new(added, json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   json_integer_value(eot), "content", ENDOFTEXT,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1));
        root = json_pack("{s:o*, s:n, s:o*, s:n, s:{s:s, s:O, s:O}, s:o*}", "added_tokens", added,
                         "normalizer", "pre_tokenizer", byte_level_section(true), "post_processor",
                         "model", "type", "BPE", "vocab", vocab, "merges", merges, "decoder",
                         byte_level_section(false));
        if (!root) rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", merges_path);
    }
    if (!rc) {
        char where[1024];
        snprintf(where, sizeof where, "%s + %s", encoder_path, merges_path);
        rc = tok_build(root, where, out, err);
    }
    if (!rc) {
        (*out)->specials.bos = (*out)->specials.eos = tokenizer_token_to_id(*out, ENDOFTEXT, strlen(ENDOFTEXT));
    }
    json_decref(root);
    json_decref(vocab);
    json_decref(merges);
    return rc;
}
