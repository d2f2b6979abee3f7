/* The tokenizer: text ↔ token ids for the models smelt trains.
 *
 * Reads Hugging Face `tokenizer.json` files with a BPE model (byte-level like GPT-2,
 * Qwen and Llama 3; Metaspace with byte fallback like Llama 2 and Mistral), GPT-2's
 * original `encoder.json` + `vocab.bpe`, and makes a byte tokenizer for tiny demo models.
 * Ids equal those of `tokenizers` with add_special_tokens=False; docs/tokenizer.md gives
 * the supported component types and the decisions. A file with any other model,
 * normalizer, pre-tokenizer, post-processor or decoder type is refused with an error
 * naming the type and the file, never tokenized approximately.
 *
 * Ownership: every constructor hands the caller a tokenizer to tokenizer_free. Encode
 * and decode malloc their outputs; the caller frees them. A tokenizer is read-only after
 * construction, so encode, decode and the lookups may run on one tokenizer from many
 * threads at once (tokenizer_set_special_ids excepted).
 *
 * Text is bytes. Encode accepts any bytes: a byte that does not start valid UTF-8 passes
 * the normalizers unchanged and becomes its byte token in byte-level tokenizers, its
 * <0xNN> token with byte_fallback, else unk; with none of these, encode fails with
 * SMELT_EINVAL. Decode returns exactly the bytes the tokens stand for (no U+FFFD
 * substitution), so byte-level and byte-fallback tokenizers round-trip any input. */
#ifndef SMELT_MODEL_TOKENIZER_H
#define SMELT_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct tokenizer;

/* Special ids known from the tokenizer files alone; -1 when unknown. bos comes from a
 * TemplateProcessing post-processor that puts a special token before the text (then
 * add_bos is true), else from a special token named <s>, <|begin_of_text|>, <|bos|>,
 * <bos>; eos from </s>, <|end_of_text|>, <|endoftext|>, <|eos|>, <eos>; pad from <pad>,
 * <|pad|>, [PAD]; unk is the model's unk_token. GPT-2's files give bos = eos =
 * <|endoftext|>. tokenizer_config.json (chat models) may say otherwise: its reader calls
 * tokenizer_set_special_ids. */
struct tokenizer_specials {
    int32_t bos, eos, pad, unk;
    bool add_bos; /* the model's post-processor prepends bos to every text */
};

/* path: a tokenizer.json file, or a folder holding tokenizer.json, or else GPT-2's
 * encoder.json + vocab.bpe. Errors name the file. */
int tokenizer_load(const char *path, struct tokenizer **out, struct smelt_error *err);
/* A tokenizer.json already in memory; where names it in messages. */
int tokenizer_load_json(const char *json, size_t len, const char *where,
                        struct tokenizer **out, struct smelt_error *err);
/* The byte tokenizer: ids 0-255 are the bytes (as GPT-2 byte-level characters), then
 * the specials in order (NULL/0: "<|bos|>", "<|eos|>", "<|pad|>"); no merges. */
int tokenizer_create_bytes(const char *const *specials, size_t n_specials,
                           struct tokenizer **out, struct smelt_error *err);
/* Writes a tokenizer.json that `tokenizers` and transformers load (merges as pairs, the
 * format of tokenizers >= 0.20). */
int tokenizer_save(const struct tokenizer *tok, const char *path, struct smelt_error *err);
void tokenizer_free(struct tokenizer *tok);

/* text[0..len) → *ids (malloc'd, *n of them; NULL when n == 0). allow_special: special
 * added tokens in the text become their ids; false makes them plain text, so that user
 * data cannot inject control tokens. Non-special added tokens always match. */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len,
                     bool allow_special, int32_t **ids, size_t *n, struct smelt_error *err);
/* ids → *text (malloc'd, NUL-terminated, *len bytes without the NUL). skip_special drops
 * special added tokens. An id with no token → SMELT_EINVAL naming its position. */
int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n,
                     bool skip_special, char **text, size_t *len, struct smelt_error *err);

/* 1 + the largest id: the embedding rows a model needs at least. */
int32_t tokenizer_vocab_size(const struct tokenizer *tok);
/* The id of a token string (added tokens first, then the model's vocabulary), -1 when
 * none. Token strings are as stored: byte-level vocabularies spell a space "Ġ". */
int32_t tokenizer_token_to_id(const struct tokenizer *tok, const char *token, size_t len);
/* The token string of an id (borrowed, valid while tok lives), NULL when none. */
const char *tokenizer_id_to_token(const struct tokenizer *tok, int32_t id);
bool tokenizer_is_special(const struct tokenizer *tok, int32_t id);
const struct tokenizer_specials *tokenizer_special_ids(const struct tokenizer *tok);
/* Replaces the special ids (each -1 or a valid id); not thread-safe against users. */
int tokenizer_set_special_ids(struct tokenizer *tok, const struct tokenizer_specials *ids,
                              struct smelt_error *err);

#endif
