/* Building a tokenizer from tokenizer.json, finding the files of a model folder, and
 * freeing. */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/json.h"

void tokenizer_free(struct tokenizer *tok) {
    if (!tok) return;
    tok_bpe_free(&tok->bpe);
    tok_added_free(&tok->added);
    free(tok->added_of_id);
    tok_normalizer_free(tok->normalizer);
    tok_pretok_free(tok->pretok);
    tok_decoder_free(tok->decoder);
    json_decref(tok->normalizer_json);
    json_decref(tok->pretok_json);
    json_decref(tok->post_json);
    json_decref(tok->decoder_json);
    free(tok->source);
    free(tok);
}

static int parse_model(const json_t *root, const char *where, struct tok_bpe *bpe,
                       struct smelt_error *err) {
    char sub[400];
    snprintf(sub, sizeof sub, "%s: model", where);
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return error_set(err, SMELT_EFORMAT, "%s: missing object 'model'", where);
    const char *type;
    int rc = json_field_string(model, "type", false, NULL, &type, sub, err);
    if (rc) return rc;
    /* Files from before tagged models have no "type"; BPE is the one with merges. */
    if (!type && json_object_get(model, "merges")) type = "BPE";
    if (!type || strcmp(type, "BPE") != 0)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: unsupported model type '%s' (smelt reads BPE)",
                         sub, type ? type : "(none)");
    return tok_bpe_parse(model, sub, bpe, err);
}

/* An added token's id is what `tokenizers` gives it: its vocabulary id when the model
 * has its content (<s> in Llama), else the next id after the vocabulary and the added
 * tokens before it. A file that says otherwise would be renumbered by `tokenizers`;
 * rather than pick a side, it is refused. */
static int check_added_id(const struct tokenizer *tok, const struct tok_added *a, int64_t *next,
                          const char *where, struct smelt_error *err) {
    int32_t vid;
    bool in_vocab = tok_str_map_get(&tok->bpe.vocab, a->content, a->len, &vid);
    int64_t want = in_vocab ? vid : *next;
    if (a->id != want)
        return error_set(err, SMELT_EFORMAT,
                         "%s: added token '%s' has id %d, but its id must be %lld (%s)", where,
                         a->content, a->id, (long long)want,
                         in_vocab ? "its id in the vocabulary" : "the next free id");
    if (!in_vocab && tok_bpe_token(&tok->bpe, a->id))
        return error_set(err, SMELT_EFORMAT, "%s: added token '%s' has id %d, which the vocabulary gives to '%s'",
                         where, a->content, a->id, tok_bpe_token(&tok->bpe, a->id));
    if (a->id + 1 > *next) *next = a->id + 1;
    return SMELT_OK;
}

/* added_of_id and n_ids: added tokens may reuse model ids (<s> in Llama) or extend them. */
static int index_ids(struct tokenizer *tok, const char *where, struct smelt_error *err) {
    int32_t n = tok->bpe.n_slots;
    int64_t next = (int64_t)tok->bpe.vocab.count;
    for (size_t i = 0; i < tok->added.count; i++) {
        int rc = check_added_id(tok, &tok->added.items[i], &next, where, err);
        if (rc) return rc;
        if (tok->added.items[i].id >= n) n = tok->added.items[i].id + 1;
    }
    tok->n_ids = n;
    tok->added_of_id = malloc((size_t)(n ? n : 1) * sizeof *tok->added_of_id);
    if (!tok->added_of_id) return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    for (int32_t i = 0; i < n; i++) tok->added_of_id[i] = -1;
    for (size_t i = 0; i < tok->added.count; i++) {
        int32_t id = tok->added.items[i].id;
        if (tok->added_of_id[id] >= 0)
            return error_set(err, SMELT_EFORMAT, "%s: added_tokens '%s' and '%s' both have id %d", where,
                             tok->added.items[tok->added_of_id[id]].content, tok->added.items[i].content, id);
        tok->added_of_id[id] = (int32_t)i;
    }
    return SMELT_OK;
}

static json_t *copy_section(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    return v ? json_deep_copy(v) : json_null();
}

static int parse_sections(const json_t *root, const char *where, struct tokenizer *tok,
                          struct smelt_error *err) {
    char sub[400];
    int rc;
    snprintf(sub, sizeof sub, "%s: added_tokens", where);
    if ((rc = tok_added_parse(json_object_get(root, "added_tokens"), sub, &tok->added, err))) return rc;
    snprintf(sub, sizeof sub, "%s: normalizer", where);
    if ((rc = tok_normalizer_parse(json_object_get(root, "normalizer"), sub, &tok->normalizer, err))) return rc;
    snprintf(sub, sizeof sub, "%s: pre_tokenizer", where);
    if ((rc = tok_pretok_parse(json_object_get(root, "pre_tokenizer"), sub, &tok->pretok, err))) return rc;
    snprintf(sub, sizeof sub, "%s: post_processor", where);
    if ((rc = tok_post_check(json_object_get(root, "post_processor"), sub, err))) return rc;
    snprintf(sub, sizeof sub, "%s: decoder", where);
    if ((rc = tok_decoder_parse(json_object_get(root, "decoder"), sub, &tok->decoder, err))) return rc;
    return tok_added_prepare(&tok->added, tok->normalizer, err);
}

int tok_build(const json_t *root, const char *where, struct tokenizer **out,
              struct smelt_error *err) {
    static const char *const keys[] = {"version", "truncation", "padding", "added_tokens",
                                       "normalizer", "pre_tokenizer", "post_processor",
                                       "decoder", "model", NULL};
    *out = NULL;
    int rc = json_check_keys(root, keys, where, err);
    if (rc) return rc;
    struct tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->source = strdup(where))) {
        free(tok);
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    }
    rc = parse_model(root, where, &tok->bpe, err);
    if (!rc) rc = parse_sections(root, where, tok, err);
    if (!rc) rc = index_ids(tok, where, err);
    if (!rc) rc = tok_infer_specials(tok, json_object_get(root, "post_processor"), where, err);
    if (!rc) {
        tok->normalizer_json = copy_section(root, "normalizer");
        tok->pretok_json = copy_section(root, "pre_tokenizer");
        tok->post_json = copy_section(root, "post_processor");
        tok->decoder_json = copy_section(root, "decoder");
        if (!tok->normalizer_json || !tok->pretok_json || !tok->post_json || !tok->decoder_json)
            rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", where);
    }
    if (rc) {
        tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return SMELT_OK;
}

int tokenizer_load_json(const char *json, size_t len, const char *where,
                        struct tokenizer **out, struct smelt_error *err) {
    if (!json || !where || !out)
        return error_set(err, SMELT_EINVAL, "tokenizer_load_json: json, where and out are required");
    json_t *root;
    int rc = json_load_buffer(json, len, where, &root, err);
    if (rc) return rc;
    rc = tok_build(root, where, out, err);
    json_decref(root);
    return rc;
}

static int load_file(const char *path, struct tokenizer **out, struct smelt_error *err) {
    json_t *root;
    int rc = json_load_path(path, &root, err);
    if (rc) return rc;
    rc = tok_build(root, path, out, err);
    json_decref(root);
    return rc;
}

int tokenizer_load(const char *path, struct tokenizer **out, struct smelt_error *err) {
    if (!path || !out) return error_set(err, SMELT_EINVAL, "tokenizer_load: path and out are required");
    *out = NULL;
    if (!path_is_dir(path)) {
        if (!path_exists(path)) return error_set(err, SMELT_ENOTFOUND, "tokenizer_load: %s does not exist", path);
        return load_file(path, out, err);
    }
    char json[4096], encoder[4096], merges[4096];
    int rc = path_join(json, sizeof json, path, "tokenizer.json", err);
    if (!rc) rc = path_join(encoder, sizeof encoder, path, "encoder.json", err);
    if (!rc) rc = path_join(merges, sizeof merges, path, "vocab.bpe", err);
    if (rc) return rc;
    if (path_exists(json)) return load_file(json, out, err);
    if (path_exists(encoder) && path_exists(merges)) return tok_load_gpt2(encoder, merges, out, err);
    return error_set(err, SMELT_ENOTFOUND,
                     "tokenizer_load: %s has neither tokenizer.json nor encoder.json + vocab.bpe", path);
}
