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
#ifndef SMELT_TOKENIZER_H
#define SMELT_TOKENIZER_H

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
/* tokenizer_encode on each of count texts (texts[i][0..lens[i])), in parallel on the
 * OpenMP pool: ids[i] (malloc'd, the caller frees each) and n[i] are what tokenizer_encode
 * gives for text i, the same ids in any thread count. On a failure nothing is kept (every
 * ids[i] NULL) and err names the lowest failing text's index. */
int tokenizer_encode_batch(const struct tokenizer *tok, const char *const *texts, const size_t *lens, size_t count,
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

/* ---- Chat templates ----
 *
 * Chat templates: a list of messages → the text a chat model expects, and → token ids
 * with the tokens the model is trained to produce marked (the assistant loss mask).
 *
 * No Jinja engine: each family of templates in common use is written here in C and
 * renders exactly what its Hugging Face Jinja template renders for plain conversations
 * (roles system/user/assistant, string contents, no tools). docs/chat-templates.md gives
 * each format character by character, the subset of each Jinja template reproduced, and
 * where tokenization differs from tokenizing the rendered text at once.
 *
 *   chatml   Qwen2/Qwen2.5 "<|im_start|>{role}\n{content}<|im_end|>\n"; no default system
 *            prompt is added (Qwen2.5's Jinja adds one when none is given)
 *   qwen3    chatml plus Qwen3's rules for <think> blocks in assistant turns
 *   qwen3-nothink  qwen3 as rendered with enable_thinking=false: the generation prompt
 *            ends with an empty "<think>\n\n</think>\n\n" (chosen by name, never detected)
 *   llama3   "<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
 *   llama3.1 llama3 after Llama 3.1+'s dated system block, always emitted:
 *            "...system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n
 *            Today Date: 26 Jul 2024\n\n{system}<|eot_id|>"
 *   llama2   "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>"
 *   mistral  Mistral v0.1 "<s>[INST] {user} [/INST]{assistant}</s>"; no system role
 *   gemma    Gemma 2/3 "<bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n
 *            <start_of_turn>model\n{assistant}<end_of_turn>\n"
 *   phi3     Phi-3-mini "<|user|>\n{user}<|end|>\n<|assistant|>\n{assistant}<|end|>\n"
 *            (then eos when there is no generation prompt)
 *   plain    "User: {user}\nAssistant: {assistant}<eos>\n" for tiny demo models
 *
 * Ownership: a struct chat_template is a plain value (no heap memory). Messages are
 * borrowed for the duration of a call. chat_render and chat_tokenize malloc their
 * outputs; the caller frees them. All functions are thread-safe on const inputs. */
enum chat_template_kind {
    CHAT_TEMPLATE_CHATML,
    CHAT_TEMPLATE_QWEN3,
    CHAT_TEMPLATE_QWEN3_NOTHINK,
    CHAT_TEMPLATE_LLAMA3,
    CHAT_TEMPLATE_LLAMA31,
    CHAT_TEMPLATE_LLAMA2,
    CHAT_TEMPLATE_MISTRAL,
    CHAT_TEMPLATE_GEMMA,
    CHAT_TEMPLATE_PHI3,
    CHAT_TEMPLATE_PLAIN,
    CHAT_TEMPLATE_COUNT
};

#define CHAT_TOKEN_BYTES 64 /* longest bos/eos string + 1 */

/* The "Today Date" of llama3.1's system block. Meta's Jinja uses the caller's date_string
 * and defaults to this (Llama 3.2's asks strftime_now first, so transformers renders the
 * day it runs); smelt always uses the default, so a dataset renders the same every day. */
#define CHAT_LLAMA31_DATE "26 Jul 2024"

/* The template family and the bos/eos strings its Jinja reads from bos_token/eos_token
 * (llama3: bos; llama2, mistral, plain: both; chatml and qwen3 use neither: their
 * markers are fixed). "" means none; a family that needs one then refuses to render. */
struct chat_template {
    enum chat_template_kind kind;
    char bos[CHAT_TOKEN_BYTES];
    char eos[CHAT_TOKEN_BYTES];
};

/* One message. role: "system", "user" or "assistant"; content: UTF-8 text, borrowed. */
struct chat_message {
    const char *role;
    const char *content;
};

/* "chatml", "qwen3", "qwen3-nothink", "llama3", "llama3.1", "llama2", "mistral", "gemma",
 * "phi3", "plain" ↔ kind. Unknown names are SMELT_EINVAL listing the known ones. */
int chat_template_from_name(const char *name, enum chat_template_kind *out, struct smelt_error *err);
const char *chat_template_name(enum chat_template_kind kind);

/* The family's defaults: llama3 and llama3.1 bos "<|begin_of_text|>"; llama2 and
 * mistral "<s>", "</s>"; gemma "<bos>", "<eos>"; phi3 "<s>", "<|endoftext|>"; plain
 * "<|bos|>", "<|eos|>" (the byte tokenizer's); chatml and qwen3 none. */
void chat_template_init(struct chat_template *t, enum chat_template_kind kind);

/* Recognises the family of a Jinja chat_template by its markers (<|im_start|>,
 * <|start_header_id|> with or without Llama 3.1's dated system block, [INST] with or
 * without <<SYS>>, <start_of_turn>, <|user|>/<|end|>). qwen3-nothink is never detected:
 * it is Qwen3's file rendered with another argument, so it is chosen by name. A template
 * of a known family whose rendering differs from ours (Mistral's later [INST] spacing,
 * thinking rules other than Qwen3's, Llama 3.2 Vision's untrimmed content, Phi-3.5's and
 * Phi-3-medium's variants) and anything unrecognised are SMELT_EUNSUPPORTED saying so and
 * suggesting to name a template explicitly. */
int chat_template_detect(const char *jinja, enum chat_template_kind *out, struct smelt_error *err);

/* Reads a tokenizer_config.json (path_or_dir: the file, or the folder holding it).
 * name: a template name, or NULL to detect the family from the config's chat_template
 * (a string, or a list of {name, template} whose "default" is used; when the config has
 * none, chat_template.jinja beside it). bos_token/eos_token (strings or {"content": ...}
 * objects; null means none) replace the family defaults. When tok is non-NULL, its
 * bos/eos/pad ids are set from bos_token/eos_token/pad_token with
 * tokenizer_set_special_ids (an absent key keeps the tokenizer's id, null sets -1; a
 * token the tokenizer lacks is SMELT_EINVAL). Errors name the file. */
int chat_template_from_tokenizer_config(const char *path_or_dir, const char *name,
                                        struct chat_template *out, struct tokenizer *tok,
                                        struct smelt_error *err);

/* messages[0..n) → *text (malloc'd, NUL-terminated, *len bytes without the NUL).
 * add_generation_prompt appends the text that opens an assistant turn (chatml, qwen3:
 * "<|im_start|>assistant\n"; qwen3-nothink: that and "<think>\n\n</think>\n\n"; llama3,
 * llama3.1: "<|start_header_id|>assistant<|end_header_id|>\n\n"; gemma:
 * "<start_of_turn>model\n"; phi3: "<|assistant|>\n" (without it phi3 ends with eos);
 * plain: "Assistant:"; llama2 and mistral: nothing, their user turn ends the prompt).
 * SMELT_EINVAL, naming the message index, for: no messages, a NULL role or content, a
 * role other than system/user/assistant, and the family's own rules (llama2: system only
 * first, then user/assistant alternating from user; mistral: the same without system;
 * gemma: as llama2). */
int chat_render(const struct chat_template *t, const struct chat_message *messages, size_t n,
                bool add_generation_prompt, char **text, size_t *len, struct smelt_error *err);

/* The same conversation as token ids, built segment by segment: the template's control
 * tokens (<|im_start|>, <|eot_id|>, bos, eos, ...) are looked up as ids, and the text
 * between them is encoded with allow_special = false, so message content can never
 * produce a control token. Text on either side of a change of mask is encoded
 * separately, so the ids of a prompt are the same whether or not an answer follows.
 * *assistant_mask[i] is 1 where ids[i] is a token the model is trained to produce:
 * everything an assistant turn adds after its generation prompt, through the token that
 * closes it (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, eos); 0 on headers, system
 * and user turns (and on qwen3-nothink's empty think block, which its generation prompt
 * supplies, and phi3's closing eos, which follows the last <|end|>). Both
 * arrays are malloc'd with *n_ids entries; the caller frees them. A control token the
 * tokenizer lacks is SMELT_EINVAL naming it. */
int chat_tokenize(const struct chat_template *t, const struct tokenizer *tok,
                  const struct chat_message *messages, size_t n, bool add_generation_prompt,
                  int32_t **ids, uint8_t **assistant_mask, size_t *n_ids,
                  struct smelt_error *err);

#endif
