/* Lookups between ids and token strings, and the special ids (bos/eos/pad/unk). */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <string.h>

#include "common/json.h"

int32_t tokenizer_vocab_size(const struct tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t tokenizer_token_to_id(const struct tokenizer *tok, const char *token, size_t len) {
    int32_t v;
    if (!tok || !token) return -1;
    if (tok_str_map_get(&tok->added.by_content, token, len, &v)) return tok->added.items[v].id;
    if (tok_str_map_get(&tok->bpe.vocab, token, len, &v)) return v;
    return -1;
}

const char *tokenizer_id_to_token(const struct tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return NULL;
    if (tok->added_of_id[id] >= 0) return tok->added.items[tok->added_of_id[id]].content;
    return tok_bpe_token(&tok->bpe, id);
}

bool tokenizer_is_special(const struct tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids || tok->added_of_id[id] < 0) return false;
    return tok->added.items[tok->added_of_id[id]].special;
}

const struct tokenizer_specials *tokenizer_special_ids(const struct tokenizer *tok) {
    return &tok->specials;
}

int tokenizer_set_special_ids(struct tokenizer *tok, const struct tokenizer_specials *ids,
                              struct smelt_error *err) {
    const int32_t v[4] = {ids->bos, ids->eos, ids->pad, ids->unk};
    static const char *const names[4] = {"bos", "eos", "pad", "unk"};
    for (int i = 0; i < 4; i++)
        if (v[i] != -1 && !tokenizer_id_to_token(tok, v[i]))
            return error_set(err, SMELT_EINVAL, "tokenizer_set_special_ids: %s id %d has no token in %s",
                             names[i], v[i], tok->source);
    tok->specials = *ids;
    return SMELT_OK;
}

/* ---- post-processor: accepted types, and the bos its template adds ---------------- */

int tok_post_check(const json_t *post, const char *where, struct smelt_error *err) {
    if (!post || json_is_null(post)) return SMELT_OK;
    const char *type;
    int rc = json_field_string(post, "type", true, NULL, &type, where, err);
    if (rc) return rc;
    if (!strcmp(type, "ByteLevel") || !strcmp(type, "TemplateProcessing") ||
        !strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing"))
        return SMELT_OK;
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(post, "processors");
        if (!json_is_array(arr))
            return error_set(err, SMELT_EFORMAT, "%s: 'processors' must be an array", where);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char sub[400];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            rc = tok_post_check(json_array_get(arr, i), sub, err);
            if (rc) return rc;
        }
        return SMELT_OK;
    }
    return error_set(err, SMELT_EUNSUPPORTED,
                     "%s: unsupported post_processor type '%s' (smelt reads ByteLevel, "
                     "TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)", where, type);
}

/* The TemplateProcessing inside post (itself or in a Sequence), or NULL. */
static const json_t *find_template(const json_t *post) {
    const char *type = json_string_value(json_object_get(post, "type"));
    if (type && !strcmp(type, "TemplateProcessing")) return post;
    const json_t *arr = json_object_get(post, "processors");
    for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr); i++) {
        const json_t *t = find_template(json_array_get(arr, i));
        if (t) return t;
    }
    return NULL;
}

/* The id of the special token the "single" template puts before the text ($A), or -1. */
static int32_t template_bos(const json_t *post) {
    const json_t *tpl = post ? find_template(post) : NULL;
    const json_t *single = tpl ? json_object_get(tpl, "single") : NULL;
    if (!json_is_array(single) || json_array_size(single) < 2) return -1;
    const json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
    if (!json_object_get(json_array_get(single, 1), "Sequence") || !first) return -1;
    const char *name = json_string_value(json_object_get(first, "id"));
    const json_t *spec = name ? json_object_get(json_object_get(tpl, "special_tokens"), name) : NULL;
    const json_t *ids = json_object_get(spec, "ids");
    if (!json_is_array(ids) || json_array_size(ids) != 1 || !json_is_integer(json_array_get(ids, 0)))
        return -1;
    json_int_t id = json_integer_value(json_array_get(ids, 0));
    return id >= 0 && id < TOK_MAX_ID ? (int32_t)id : -1;
}

/* The first of names that is a special added token, or -1. */
static int32_t special_named(const struct tokenizer *tok, const char *const *names) {
    for (; *names; names++) {
        int32_t v;
        if (tok_str_map_get(&tok->added.by_content, *names, strlen(*names), &v) && tok->added.items[v].special)
            return tok->added.items[v].id;
    }
    return -1;
}

int tok_infer_specials(struct tokenizer *tok, const json_t *post, const char *where,
                       struct smelt_error *err) {
    static const char *const bos[] = {"<s>", "<|begin_of_text|>", "<|bos|>", "<bos>", NULL};
    static const char *const eos[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|eos|>", "<eos>", NULL};
    static const char *const pad[] = {"<pad>", "<|pad|>", "[PAD]", NULL};
    struct tokenizer_specials *s = &tok->specials;
    s->bos = template_bos(post);
    s->add_bos = s->bos >= 0;
    if (s->bos >= 0 && !tokenizer_id_to_token(tok, s->bos))
        return error_set(err, SMELT_EFORMAT, "%s: post_processor template adds id %d, which has no token",
                         where, s->bos);
    if (s->bos < 0) s->bos = special_named(tok, bos);
    s->eos = special_named(tok, eos);
    s->pad = special_named(tok, pad);
    s->unk = tok->bpe.unk_id;
    return SMELT_OK;
}
