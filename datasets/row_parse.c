/* One JSON row → a checked struct dataset_row, or the first thing wrong with it,
 * named by field ("messages[2].content"). Structure only: no tokenizer needed, so an
 * upload can be checked before a model is chosen. */
#include "datasets/datasets_internal.h"

#include "common/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const SFT_MESSAGES_KEYS[] = {"messages", NULL};
static const char *const SFT_PAIR_KEYS[] = {"prompt", "completion", NULL};
static const char *const PREFERENCE_KEYS[] = {"prompt", "chosen", "rejected", "margin", NULL};
static const char *const PROMPTS_KEYS[] = {"prompt", "answer", "metadata", NULL};
static const char *const MESSAGE_KEYS[] = {"role", "content", NULL};

static bool has_key(const json_t *obj, const char *key) { return json_object_get(obj, key) != NULL; }

/* A non-empty list whose last element is a message of another role than assistant (what
 * the model answers next): OpenAI's reinforcement rows end so, its SFT rows do not. */
static bool ends_with_prompt_turn(const json_t *messages) {
    size_t n = json_array_size(messages);
    const json_t *role = n ? json_object_get(json_array_get(messages, n - 1), "role") : NULL;
    return json_is_string(role) && strcmp(json_string_value(role), "assistant") != 0;
}

enum dataset_kind row_guess_kind(const json_t *obj, enum dataset_kind file_kind) {
    /* A conversation fits both sft (its assistant turns are trained) and prompts (OpenAI's
     * reinforcement rows): the file's kind decides, else the last turn does. */
    const json_t *messages = json_object_get(obj, "messages");
    if (messages) {
        if (file_kind == DATASET_SFT || file_kind == DATASET_PROMPTS) return file_kind;
        return ends_with_prompt_turn(messages) ? DATASET_PROMPTS : DATASET_SFT;
    }
    bool sft = has_key(obj, "completion");
    bool preference = has_key(obj, "chosen") || has_key(obj, "rejected");
    bool prompts = has_key(obj, "answer") || has_key(obj, "metadata");
    /* Keys of the file's kind among others: checking against that kind names the
     * stray key, which says more than "wrong kind". */
    if ((file_kind == DATASET_SFT && sft) || (file_kind == DATASET_PREFERENCE && preference) ||
        (file_kind == DATASET_PROMPTS && prompts))
        return file_kind;
    if (sft) return DATASET_SFT;
    if (preference) return DATASET_PREFERENCE;
    if (prompts) return DATASET_PROMPTS;
    if (has_key(obj, "prompt")) return file_kind != DATASET_AUTO ? file_kind : DATASET_PROMPTS;
    return DATASET_AUTO;
}

static int check_keys(const json_t *obj, const char *const *allowed, const char *field,
                      struct dataset_issue *issue) {
    const char *key = json_unknown_key(obj, allowed);
    return key ? issue_set(issue, field, "unknown field \"%s\"", key) : SMELT_OK;
}

static int required(const json_t *obj, const char *key, const json_t **out,
                    struct dataset_issue *issue) {
    *out = json_object_get(obj, key);
    return *out ? SMELT_OK : issue_set(issue, key, "missing field");
}

static bool is_role(const char *role) {
    return !strcmp(role, "system") || !strcmp(role, "developer") || !strcmp(role, "user") ||
           !strcmp(role, "assistant");
}

/* "messages[2].content": built only for an issue, rows being mostly valid. */
static const char *message_field(char *buf, size_t size, const char *list, size_t i,
                                 const char *suffix) {
    snprintf(buf, size, "%s[%zu]%s", list, i, suffix);
    return buf;
}

/* One {"role", "content"} object, list[i]. A response list holds assistant turns only. */
static int parse_message(const json_t *m, const char *list, size_t i, bool response,
                         struct chat_message *out, struct dataset_issue *issue) {
    char f[64];
    if (!json_is_object(m))
        return issue_set(issue, message_field(f, sizeof f, list, i, ""),
                         "expected a message object, got %s", json_kind_name(m));
    int rc = check_keys(m, MESSAGE_KEYS, message_field(f, sizeof f, list, i, ""), issue);
    if (rc) return rc;
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!role) return issue_set(issue, message_field(f, sizeof f, list, i, ".role"), "missing field");
    if (!json_is_string(role))
        return issue_set(issue, message_field(f, sizeof f, list, i, ".role"), "expected a string, got %s",
                         json_kind_name(role));
    out->role = json_string_value(role);
    if (!is_role(out->role))
        return issue_set(issue, message_field(f, sizeof f, list, i, ".role"),
                         "expected \"system\", \"developer\", \"user\" or \"assistant\", got \"%.80s\"",
                         out->role);
    if (response && strcmp(out->role, "assistant"))
        return issue_set(issue, message_field(f, sizeof f, list, i, ".role"),
                         "a response holds assistant turns only, got \"%s\"", out->role);
    /* OpenAI's name for the system turn of its reasoning models: the templates know one. */
    if (!strcmp(out->role, "developer")) out->role = "system";
    if (!content) return issue_set(issue, message_field(f, sizeof f, list, i, ".content"), "missing field");
    if (!json_is_string(content))
        return issue_set(issue, message_field(f, sizeof f, list, i, ".content"), "expected a string, got %s",
                         json_kind_name(content));
    out->content = json_string_value(content);
    if (!strcmp(out->role, "assistant") && text_is_blank(out->content, json_string_length(content)))
        return issue_set(issue, message_field(f, sizeof f, list, i, ".content"), "empty assistant turn");
    return SMELT_OK;
}

static int parse_message_list(const json_t *list, const char *field, bool response,
                              struct row_turns *out, struct dataset_issue *issue,
                              struct smelt_error *err) {
    size_t n = json_array_size(list);
    if (n == 0) return issue_set(issue, field, "empty list of messages");
    out->messages = calloc(n, sizeof *out->messages);
    if (!out->messages) return error_set(err, SMELT_ENOMEM, "dataset row: %zu messages", n);
    out->n_messages = n;
    for (size_t i = 0; i < n; i++) {
        int rc = parse_message(json_array_get(list, i), field, i, response, &out->messages[i], issue);
        if (rc) return rc;
    }
    return SMELT_OK;
}

/* A prompt: a string or a message list. */
static int parse_prompt(const json_t *row, struct row_turns *out, struct dataset_issue *issue,
                        struct smelt_error *err) {
    const json_t *v;
    int rc = required(row, "prompt", &v, issue);
    if (rc) return rc;
    if (json_is_string(v)) {
        out->text = json_string_value(v);
        return SMELT_OK;
    }
    if (json_is_array(v)) return parse_message_list(v, "prompt", false, out, issue, err);
    return issue_set(issue, "prompt", "expected a string or a list of messages, got %s",
                     json_kind_name(v));
}

/* A response follows its prompt's form: text after text, assistant turns after a
 * message list (a template cannot render raw text after a conversation). */
static int parse_response(const json_t *row, const char *key, const struct row_turns *prompt,
                          struct row_turns *out, struct dataset_issue *issue,
                          struct smelt_error *err) {
    const json_t *v;
    int rc = required(row, key, &v, issue);
    if (rc) return rc;
    if (prompt->text) {
        if (!json_is_string(v))
            return issue_set(issue, key, "expected a string like prompt, got %s", json_kind_name(v));
        out->text = json_string_value(v);
        if (text_is_blank(out->text, json_string_length(v)))
            return issue_set(issue, key, "empty %s", !strcmp(key, "completion") ? "completion" : "response");
        return SMELT_OK;
    }
    if (!json_is_array(v))
        return issue_set(issue, key, "expected a list of messages like prompt, got %s",
                         json_kind_name(v));
    return parse_message_list(v, key, true, out, issue, err);
}

static int parse_sft(const json_t *obj, struct dataset_row *row, struct dataset_issue *issue,
                     struct smelt_error *err) {
    if (!has_key(obj, "messages")) {
        int rc = check_keys(obj, SFT_PAIR_KEYS, "", issue);
        if (!rc) rc = parse_prompt(obj, &row->prompt, issue, err);
        if (!rc) rc = parse_response(obj, "completion", &row->prompt, &row->response, issue, err);
        return rc;
    }
    int rc = check_keys(obj, SFT_MESSAGES_KEYS, "", issue);
    if (rc) return rc;
    const json_t *list = json_object_get(obj, "messages");
    row->prompt_field = "messages";
    if (!json_is_array(list))
        return issue_set(issue, "messages", "expected a list of messages, got %s", json_kind_name(list));
    rc = parse_message_list(list, "messages", false, &row->conversation, issue, err);
    if (rc) return rc;
    for (size_t i = 0; i < row->conversation.n_messages; i++)
        if (!strcmp(row->conversation.messages[i].role, "assistant")) return SMELT_OK;
    return issue_set(issue, "messages", "no assistant turn (nothing to train)");
}

static int parse_preference(const json_t *obj, struct dataset_row *row,
                            struct dataset_issue *issue, struct smelt_error *err) {
    int rc = check_keys(obj, PREFERENCE_KEYS, "", issue);
    if (!rc) rc = parse_prompt(obj, &row->prompt, issue, err);
    if (!rc) rc = parse_response(obj, "chosen", &row->prompt, &row->response, issue, err);
    if (!rc) rc = parse_response(obj, "rejected", &row->prompt, &row->rejected, issue, err);
    if (rc) return rc;
    /* A pair whose sides are the same teaches nothing and gives every preference loss a
     * zero margin: almost always a data-preparation bug. */
    if (json_equal(json_object_get(obj, "chosen"), json_object_get(obj, "rejected")))
        return issue_set(issue, "rejected", "identical to chosen (a preference pair must differ)");
    /* TRL RewardTrainer's optional margin column: how far chosen should beat rejected.
     * Only the reward model's loss reads it. */
    const json_t *margin = json_object_get(obj, "margin");
    if (!margin || json_is_null(margin)) return SMELT_OK;
    if (!json_is_number(margin))
        return issue_set(issue, "margin", "expected a number, got %s", json_kind_name(margin));
    row->margin = json_number_value(margin);
    if (!isfinite(row->margin) || fabs(row->margin) > 1e6)
        return issue_set(issue, "margin", "must be a finite number of at most 1e6 in magnitude");
    return SMELT_OK;
}

/* A prompt given as messages is what the model answers: it ends with a user (or system)
 * turn. After a final assistant turn the generation prompt would open a second one. */
static int check_prompt_end(const struct row_turns *prompt, const char *list, struct dataset_issue *issue) {
    if (!prompt->messages) return SMELT_OK;
    size_t last = prompt->n_messages - 1;
    if (strcmp(prompt->messages[last].role, "assistant") != 0) return SMELT_OK;
    char f[64];
    return issue_set(issue, message_field(f, sizeof f, list, last, ".role"),
                     "a prompt ends with a user or system turn (the model writes the answer), got a final "
                     "assistant turn");
}

/* OpenAI's reinforcement row: {"messages": [...], <any other field>}. "messages" and
 * "tools" are OpenAI's reserved keys; every other field is data for the graders
 * ({{item.<field>}}), kept whole as the row's metadata. A string "answer" is also the
 * row's answer, as in smelt's own rows (what the verifiers compare with). */
static int parse_openai_prompt(const json_t *obj, struct dataset_row *row, struct dataset_issue *issue,
                               struct smelt_error *err) {
    const json_t *tools = json_object_get(obj, "tools");
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return issue_set(issue, "tools", "not supported: smelt's samples are text completions (no tool calls)");
    const json_t *list = json_object_get(obj, "messages");
    row->prompt_field = "messages";
    if (!json_is_array(list))
        return issue_set(issue, "messages", "expected a list of messages, got %s", json_kind_name(list));
    int rc = parse_message_list(list, "messages", false, &row->prompt, issue, err);
    if (!rc) rc = check_prompt_end(&row->prompt, "messages", issue);
    if (!rc) rc = dataset_openai_item(obj, &row->owned_metadata, &row->answer, err);
    row->metadata = row->owned_metadata;
    return rc;
}

int dataset_openai_item(const json_t *row, json_t **metadata, const char **answer, struct smelt_error *err) {
    *metadata = NULL;
    *answer = NULL;
    if (!json_is_object(row)) return error_set(err, SMELT_EINVAL, "item: expected a JSON object");
    size_t reserved = (json_object_get(row, "messages") != NULL) + (json_object_get(row, "tools") != NULL);
    if (json_object_size(row) == reserved) return SMELT_OK;
    json_t *fields = json_copy((json_t *)row); /* shallow: the values stay the row's */
    if (!fields) return error_set(err, SMELT_ENOMEM, "dataset row: out of memory");
    json_object_del(fields, "messages");
    json_object_del(fields, "tools");
    *metadata = fields;
    const json_t *a = json_object_get(row, "answer");
    if (json_is_string(a)) *answer = json_string_value(a);
    return SMELT_OK;
}

static int parse_prompts(const json_t *obj, struct dataset_row *row, struct dataset_issue *issue,
                         struct smelt_error *err) {
    if (has_key(obj, "messages")) return parse_openai_prompt(obj, row, issue, err);
    row->prompt_field = "prompt";
    int rc = check_keys(obj, PROMPTS_KEYS, "", issue);
    if (!rc) rc = parse_prompt(obj, &row->prompt, issue, err);
    if (!rc) rc = check_prompt_end(&row->prompt, "prompt", issue);
    if (rc) return rc;
    if (row->prompt.text && text_is_blank(row->prompt.text, strlen(row->prompt.text)))
        return issue_set(issue, "prompt", "empty prompt");
    const json_t *answer = json_object_get(obj, "answer"), *metadata = json_object_get(obj, "metadata");
    if (answer && !json_is_null(answer)) {
        if (!json_is_string(answer))
            return issue_set(issue, "answer", "expected a string, got %s", json_kind_name(answer));
        row->answer = json_string_value(answer);
    }
    if (metadata && !json_is_null(metadata)) {
        if (!json_is_object(metadata))
            return issue_set(issue, "metadata", "expected an object, got %s", json_kind_name(metadata));
        row->metadata = metadata;
    }
    return SMELT_OK;
}

int row_parse(const json_t *obj, enum dataset_kind kind, struct dataset_row *row,
              struct dataset_issue *issue, struct smelt_error *err) {
    row->kind = kind;
    if (!json_is_object(obj))
        return issue_set(issue, "", "expected a JSON object, got %s", json_kind_name(obj));
    switch (kind) {
    case DATASET_SFT: return parse_sft(obj, row, issue, err);
    case DATASET_PREFERENCE: return parse_preference(obj, row, issue, err);
    case DATASET_PROMPTS: return parse_prompts(obj, row, issue, err);
    default:
        return issue_set(issue, "", "no \"messages\" or \"prompt\" field: not an sft, preference or "
                                    "prompts row");
    }
}

void row_free(struct dataset_row *row) {
    free(row->conversation.messages);
    free(row->prompt.messages);
    free(row->response.messages);
    free(row->rejected.messages);
    json_decref(row->owned_metadata);
    memset(row, 0, sizeof *row);
}
