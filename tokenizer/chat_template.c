/* chat_template: template names, defaults, recognising a Jinja chat_template's family,
 * and reading tokenizer_config.json (template, bos/eos/pad tokens). */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static const char *const names[CHAT_TEMPLATE_COUNT] = {
    [CHAT_TEMPLATE_CHATML] = "chatml",   [CHAT_TEMPLATE_QWEN3] = "qwen3",
    [CHAT_TEMPLATE_QWEN3_NOTHINK] = "qwen3-nothink",
    [CHAT_TEMPLATE_LLAMA3] = "llama3",   [CHAT_TEMPLATE_LLAMA31] = "llama3.1",
    [CHAT_TEMPLATE_LLAMA2] = "llama2",   [CHAT_TEMPLATE_MISTRAL] = "mistral",
    [CHAT_TEMPLATE_GEMMA] = "gemma",     [CHAT_TEMPLATE_PHI3] = "phi3",
    [CHAT_TEMPLATE_PLAIN] = "plain",
};

#define KNOWN_NAMES "chatml, qwen3, qwen3-nothink, llama3, llama3.1, llama2, mistral, gemma, phi3, plain"

int chat_template_from_name(const char *name, enum chat_template_kind *out, struct smelt_error *err) {
    if (!name || !out) return error_set(err, SMELT_EINVAL, "chat template: a name and out are required");
    for (int k = 0; k < CHAT_TEMPLATE_COUNT; k++) {
        if (!strcmp(name, names[k])) {
            *out = (enum chat_template_kind)k;
            return SMELT_OK;
        }
    }
    return error_set(err, SMELT_EINVAL, "chat template '%.64s' is unknown (known: " KNOWN_NAMES ")", name);
}

const char *chat_template_name(enum chat_template_kind kind) {
    return (int)kind >= 0 && kind < CHAT_TEMPLATE_COUNT ? names[kind] : "unknown";
}

void chat_template_init(struct chat_template *t, enum chat_template_kind kind) {
    memset(t, 0, sizeof *t);
    t->kind = kind;
    const char *bos = "", *eos = "";
    switch (kind) {
    case CHAT_TEMPLATE_LLAMA3:
    case CHAT_TEMPLATE_LLAMA31: bos = "<|begin_of_text|>"; break;
    case CHAT_TEMPLATE_LLAMA2:
    case CHAT_TEMPLATE_MISTRAL: bos = "<s>", eos = "</s>"; break;
    case CHAT_TEMPLATE_GEMMA: bos = "<bos>", eos = "<eos>"; break;
    case CHAT_TEMPLATE_PHI3: bos = "<s>", eos = "<|endoftext|>"; break;
    case CHAT_TEMPLATE_PLAIN: bos = "<|bos|>", eos = "<|eos|>"; break;
    default: break;
    }
    snprintf(t->bos, sizeof t->bos, "%s", bos);
    snprintf(t->eos, sizeof t->eos, "%s", eos);
}

/* ---- recognising a Jinja template ---- */

static bool has(const char *s, const char *marker) { return strstr(s, marker) != NULL; }

static int unsupported(struct smelt_error *err, const char *what) {
    return error_set(err, SMELT_EUNSUPPORTED,
                     "chat_template: %s; name a template explicitly (" KNOWN_NAMES
                     ") to use that format instead (docs/chat-templates.md)", what);
}

/* Qwen3's thinking rules, as the Jinja spells them. */
static bool is_qwen3(const char *j) {
    return has(j, "ns.last_query_index") && has(j, "reasoning_content.strip('\\n')") &&
           has(j, "loop.last or (not loop.last and reasoning_content)") &&
           has(j, "enable_thinking is defined and enable_thinking is false");
}

/* Meta's Llama 3.1/3.2/3.3 template: the dated system block, the first system message
 * trimmed into it, every other message trimmed (Llama 3.2 Vision's does not trim). */
static bool is_llama31(const char *j) {
    return has(j, "Cutting Knowledge Date: December 2023") && has(j, "\"Today Date: \" + date_string") &&
           has(j, "set system_message = messages[0]['content']|trim") &&
           has(j, "message['content'] | trim + '<|eot_id|>'");
}

static int detect_llama3(const char *j, enum chat_template_kind *out, struct smelt_error *err) {
    if (!has(j, "Cutting Knowledge Date")) *out = CHAT_TEMPLATE_LLAMA3;
    else if (is_llama31(j)) *out = CHAT_TEMPLATE_LLAMA31;
    else return unsupported(err, "a Llama 3.x template with a dated system block that is not Meta's Llama "
                                 "3.1-3.3 one (Llama 3.2 Vision's, for one, does not trim content)");
    return SMELT_OK;
}

/* Gemma 3's (system folded into the first user turn) or Gemma 1.1/2's (no system role):
 * the same turns, content trimmed, the assistant called "model". */
static int detect_gemma(const char *j, enum chat_template_kind *out, struct smelt_error *err) {
    bool turns = has(j, "<end_of_turn>") && (has(j, "set role = \"model\"") || has(j, "set role = 'model'"));
    bool system = has(j, "(first_user_prefix if loop.first else \"\")") || has(j, "System role not supported");
    if (!turns || !system || !has(j, "message['content'] | trim"))
        return unsupported(err, "a <start_of_turn> template that is neither Gemma 2's nor Gemma 3's");
    *out = CHAT_TEMPLATE_GEMMA;
    return SMELT_OK;
}

/* Phi-3-mini's: every role as '<|role|>\n' + content + '<|end|>\n', eos when there is
 * no generation prompt. Phi-3.5 drops empty system messages, Phi-3-medium has no
 * system role and no generation prompt: both render differently. */
static int detect_phi3(const char *j, enum chat_template_kind *out, struct smelt_error *err) {
    if (has(j, "message['role'] == 'system' and message['content']"))
        return unsupported(err, "Phi-3.5's template, which drops empty system messages (phi3 renders them)");
    if (!has(j, "{{'<|system|>") || !has(j, "{{'<|assistant|>") || !has(j, "{% else %}{{ eos_token }}"))
        return unsupported(err, "a <|user|>/<|end|> template that is not Phi-3-mini's");
    *out = CHAT_TEMPLATE_PHI3;
    return SMELT_OK;
}

int chat_template_detect(const char *jinja, enum chat_template_kind *out, struct smelt_error *err) {
    if (!jinja || !out) return error_set(err, SMELT_EINVAL, "chat_template_detect: jinja and out are required");
    if (has(jinja, "<|im_start|>")) {
        if (!has(jinja, "<think>")) *out = CHAT_TEMPLATE_CHATML;
        else if (is_qwen3(jinja)) *out = CHAT_TEMPLATE_QWEN3;
        else return unsupported(err, "a ChatML template with <think> rules other than Qwen3's");
        return SMELT_OK;
    }
    if (has(jinja, "<|start_header_id|>")) return detect_llama3(jinja, out, err);
    if (has(jinja, "<start_of_turn>")) return detect_gemma(jinja, out, err);
    if (has(jinja, "<|user|>") && has(jinja, "<|end|>")) return detect_phi3(jinja, out, err);
    if (has(jinja, "[INST]")) {
        if (has(jinja, "<<SYS>>")) {
            *out = CHAT_TEMPLATE_LLAMA2;
            return SMELT_OK;
        }
        if (has(jinja, "[INST] ") && has(jinja, " [/INST]") && !has(jinja, "system_message") &&
            has(jinja, "Only user and assistant roles are supported")) {
            *out = CHAT_TEMPLATE_MISTRAL;
            return SMELT_OK;
        }
        return unsupported(err, "an [INST] template that is neither Llama 2's (<<SYS>>) nor Mistral v0.1's "
                                "(later Mistral templates space [INST] differently and place the system "
                                "message elsewhere)");
    }
    return unsupported(err, "unrecognised template (no <|im_start|>, <|start_header_id|>, <start_of_turn>, "
                            "<|user|> or [INST])");
}

/* ---- tokenizer_config.json ---- */

/* A token field: absent (*present false), null (*value NULL), a string, or an
 * AddedToken object {"content": ...}. */
static int token_field(const json_t *root, const char *key, const char *where, bool *present,
                       const char **value, struct smelt_error *err) {
    const json_t *v = json_object_get(root, key);
    *present = v != NULL;
    *value = NULL;
    if (!v || json_is_null(v)) return SMELT_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return error_set(err, SMELT_EINVAL, "%s: %s must be a string, an object with a string \"content\", "
                         "or null", where, key);
    *value = json_string_value(v);
    return SMELT_OK;
}

static int copy_token(char *dst, const char *key, const char *value, const char *where,
                      struct smelt_error *err) {
    size_t len = strlen(value);
    if (len >= CHAT_TOKEN_BYTES)
        return error_set(err, SMELT_EINVAL, "%s: %s is %zu bytes, at most %d", where, key, len,
                         CHAT_TOKEN_BYTES - 1);
    memcpy(dst, value, len + 1);
    return SMELT_OK;
}

/* The Jinja source: chat_template as a string, or the "default" entry of a list of
 * named templates, or else dir/chat_template.jinja (read into *owned). */
static int template_source(const json_t *root, const char *dir, const char *where, const char **jinja,
                           char **owned, struct smelt_error *err) {
    const json_t *v = json_object_get(root, "chat_template");
    *owned = NULL;
    if (json_is_string(v)) {
        *jinja = json_string_value(v);
        return SMELT_OK;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) {
            const json_t *name = json_object_get(item, "name"), *tpl = json_object_get(item, "template");
            if (json_is_string(name) && !strcmp(json_string_value(name), "default") && json_is_string(tpl)) {
                *jinja = json_string_value(tpl);
                return SMELT_OK;
            }
        }
        return error_set(err, SMELT_EFORMAT, "%s: chat_template lists named templates but none named "
                         "\"default\" with a string template", where);
    }
    if (v && !json_is_null(v))
        return error_set(err, SMELT_EFORMAT, "%s: chat_template must be a string or a list of "
                         "{name, template}", where);
    char path[4096];
    size_t len;
    int rc = path_join(path, sizeof path, dir, "chat_template.jinja", err);
    if (rc) return rc;
    if (!path_exists(path))
        return error_set(err, SMELT_ENOTFOUND, "%s has no chat_template and there is no %s; name a template "
                         "explicitly (" KNOWN_NAMES ")", where, path);
    rc = file_read_all(path, owned, &len, err);
    *jinja = *owned;
    return rc;
}

/* Sets tok's bos/eos/pad from the config: absent keeps, null clears, a string must be a
 * token of tok. */
static int update_specials(const json_t *root, struct tokenizer *tok, const char *where,
                           struct smelt_error *err) {
    static const char *const keys[3] = {"bos_token", "eos_token", "pad_token"};
    struct tokenizer_specials s = *tokenizer_special_ids(tok);
    int32_t *ids[3] = {&s.bos, &s.eos, &s.pad};
    for (int k = 0; k < 3; k++) {
        bool present;
        const char *value;
        int rc = token_field(root, keys[k], where, &present, &value, err);
        if (rc) return rc;
        if (!present) continue;
        *ids[k] = value ? tokenizer_token_to_id(tok, value, strlen(value)) : -1;
        if (value && *ids[k] < 0)
            return error_set(err, SMELT_EINVAL, "%s: %s '%.64s' is not a token of the tokenizer", where, keys[k],
                             value);
    }
    return tokenizer_set_special_ids(tok, &s, err);
}

static int read_config(const json_t *root, const char *dir, const char *where, const char *name,
                       struct chat_template *out, struct tokenizer *tok, struct smelt_error *err) {
    if (!json_is_object(root)) return error_set(err, SMELT_EFORMAT, "%s: not a JSON object", where);
    enum chat_template_kind kind;
    int rc;
    if (name) {
        rc = chat_template_from_name(name, &kind, err);
    } else {
        const char *jinja = NULL;
        char *owned = NULL;
        rc = template_source(root, dir, where, &jinja, &owned, err);
        if (!rc && (rc = chat_template_detect(jinja, &kind, err)) != 0) error_wrap(err, rc, "%s", where);
        free(owned);
    }
    if (rc) return rc;
    chat_template_init(out, kind);
    static const char *const keys[2] = {"bos_token", "eos_token"};
    char *dst[2] = {out->bos, out->eos};
    for (int k = 0; !rc && k < 2; k++) {
        bool present;
        const char *value;
        rc = token_field(root, keys[k], where, &present, &value, err);
        if (!rc && present) rc = copy_token(dst[k], keys[k], value ? value : "", where, err);
    }
    if (!rc && tok) rc = update_specials(root, tok, where, err);
    return rc;
}

int chat_template_from_tokenizer_config(const char *path_or_dir, const char *name,
                                        struct chat_template *out, struct tokenizer *tok,
                                        struct smelt_error *err) {
    if (!path_or_dir || !out)
        return error_set(err, SMELT_EINVAL, "chat_template_from_tokenizer_config: a path and out are required");
    char path[4096], dir[4096];
    int rc = SMELT_OK;
    if (path_is_dir(path_or_dir)) {
        rc = path_join(path, sizeof path, path_or_dir, "tokenizer_config.json", err);
        if (!rc) snprintf(dir, sizeof dir, "%s", path_or_dir);
    } else {
        const char *slash = strrchr(path_or_dir, '/');
        int n = snprintf(path, sizeof path, "%s", path_or_dir);
        if (n < 0 || (size_t)n >= sizeof path)
            rc = error_set(err, SMELT_EINVAL, "tokenizer config path is longer than %zu bytes", sizeof path - 1);
        else if (!slash) snprintf(dir, sizeof dir, ".");
        else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path_or_dir + (slash == path_or_dir)), path_or_dir);
    }
    if (rc) return rc;
    json_t *root = NULL;
    rc = json_load_path(path, &root, err);
    if (!rc) rc = read_config(root, dir, path, name, out, tok, err);
    json_decref(root);
    return rc;
}
