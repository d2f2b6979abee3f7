/* Chat templates: a list of messages → the text a chat model expects, and → token ids
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
 *   llama3   "<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
 *   llama2   "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>"
 *   mistral  Mistral v0.1 "<s>[INST] {user} [/INST]{assistant}</s>"; no system role
 *   plain    "User: {user}\nAssistant: {assistant}<eos>\n" for tiny demo models
 *
 * Ownership: a struct chat_template is a plain value (no heap memory). Messages are
 * borrowed for the duration of a call. chat_render and chat_tokenize malloc their
 * outputs; the caller frees them. All functions are thread-safe on const inputs. */
#ifndef SMELT_MODEL_CHAT_TEMPLATE_H
#define SMELT_MODEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "model/tokenizer.h"

enum chat_template_kind {
    CHAT_TEMPLATE_CHATML,
    CHAT_TEMPLATE_QWEN3,
    CHAT_TEMPLATE_LLAMA3,
    CHAT_TEMPLATE_LLAMA2,
    CHAT_TEMPLATE_MISTRAL,
    CHAT_TEMPLATE_PLAIN,
    CHAT_TEMPLATE_COUNT
};

#define CHAT_TOKEN_BYTES 64 /* longest bos/eos string + 1 */

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

/* "chatml", "qwen3", "llama3", "llama2", "mistral", "plain" ↔ kind. Unknown names are
 * SMELT_EINVAL listing the known ones. */
int chat_template_from_name(const char *name, enum chat_template_kind *out, struct smelt_error *err);
const char *chat_template_name(enum chat_template_kind kind);

/* The family's defaults: llama3 bos "<|begin_of_text|>"; llama2 and mistral "<s>",
 * "</s>"; plain "<|bos|>", "<|eos|>" (the byte tokenizer's); chatml and qwen3 none. */
void chat_template_init(struct chat_template *t, enum chat_template_kind kind);

/* Recognises the family of a Jinja chat_template by its markers (<|im_start|>,
 * <|start_header_id|>, [INST] with or without <<SYS>>). A template of a known family
 * whose rendering differs from ours (Llama 3.1's dated system block, Mistral's later
 * [INST] spacing, thinking rules other than Qwen3's) and anything unrecognised are
 * SMELT_EUNSUPPORTED saying so and suggesting to name a template explicitly. */
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
 * "<|im_start|>assistant\n"; llama3: "<|start_header_id|>assistant<|end_header_id|>\n\n";
 * plain: "Assistant:"; llama2 and mistral: nothing, their user turn ends the prompt).
 * SMELT_EINVAL, naming the message index, for: no messages, a NULL role or content, a
 * role other than system/user/assistant, and the family's own rules (llama2: system only
 * first, then user/assistant alternating from user; mistral: the same without system). */
int chat_render(const struct chat_template *t, const struct chat_message *messages, size_t n,
                bool add_generation_prompt, char **text, size_t *len, struct smelt_error *err);

/* The same conversation as token ids, built segment by segment: the template's control
 * tokens (<|im_start|>, <|eot_id|>, bos, eos, ...) are looked up as ids, and the text
 * between them is encoded with allow_special = false, so message content can never
 * produce a control token. Text on either side of a change of mask is encoded
 * separately, so the ids of a prompt are the same whether or not an answer follows.
 * *assistant_mask[i] is 1 where ids[i] is a token the model is trained to produce:
 * everything an assistant turn adds after its generation prompt, through the token that
 * closes it (<|im_end|>, <|eot_id|>, eos); 0 on headers, system and user turns. Both
 * arrays are malloc'd with *n_ids entries; the caller frees them. A control token the
 * tokenizer lacks is SMELT_EINVAL naming it. */
int chat_tokenize(const struct chat_template *t, const struct tokenizer *tok,
                  const struct chat_message *messages, size_t n, bool add_generation_prompt,
                  int32_t **ids, uint8_t **assistant_mask, size_t *n_ids,
                  struct smelt_error *err);

#endif
