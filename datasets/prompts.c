/* A prompts row (for RL) → the prompt's ids, its answer and metadata. A prompt over
 * max_seq_len is never cut: its end holds the question and the generation prompt, its
 * start the instructions, so truncating either way gives the model a different task.
 * Under DATASET_TRUNCATE_RIGHT such a prompt is an error, as under ERROR. */
#include "datasets/datasets_internal.h"

#include <stdlib.h>
#include <string.h>

static int prompt_ids(const struct dataset_format *format, const struct row_turns *prompt, const char *field,
                      int32_t **ids, size_t *n, struct dataset_issue *issue, struct smelt_error *err) {
    struct smelt_error e = {0};
    int rc;
    if (prompt->text) {
        const struct tokenizer_specials *sp = tokenizer_special_ids(format->tok);
        int32_t bos = format->add_bos ? sp->bos : -1;
        int32_t *text_ids = NULL;
        size_t n_text = 0;
        rc = tokenizer_encode(format->tok, prompt->text, strlen(prompt->text), false, &text_ids,
                              &n_text, &e);
        if (!rc) {
            *n = (bos >= 0) + n_text;
            *ids = malloc((*n ? *n : 1) * sizeof **ids);
            if (!*ids) {
                free(text_ids);
                return error_set(err, SMELT_ENOMEM, "dataset: %zu prompt tokens", *n);
            }
            if (bos >= 0) (*ids)[0] = bos;
            if (n_text) memcpy(*ids + (bos >= 0), text_ids, n_text * sizeof *text_ids);
        }
        free(text_ids);
    } else if (!format->chat) {
        return issue_set(issue, field, "a list of messages needs a chat template, and none was "
                                       "given or found with the tokenizer");
    } else {
        uint8_t *mask = NULL;
        rc = chat_tokenize(format->chat, format->tok, prompt->messages, prompt->n_messages, true, ids,
                           &mask, n, &e);
        free(mask);
    }
    if (rc == SMELT_ENOMEM) return error_set(err, rc, "dataset: %s", e.message);
    if (rc) return issue_set(issue, field, "%s", e.message);
    return SMELT_OK;
}

static int fit_prompt(const struct dataset_format *format, size_t n, const char *field, enum example_fit *fit,
                      struct dataset_issue *issue) {
    *fit = EXAMPLE_FITS;
    if (n == 0) return issue_set(issue, field, "no tokens");
    if ((int64_t)n <= format->max_seq_len) return SMELT_OK;
    if (format->truncation == DATASET_TRUNCATE_DROP) {
        *fit = EXAMPLE_DROPPED;
        return SMELT_OK;
    }
    return issue_set(issue, field, "prompt of %zu tokens exceeds max_seq_len %lld%s", n,
                     (long long)format->max_seq_len,
                     format->truncation == DATASET_TRUNCATE_RIGHT
                         ? " (prompts are never cut: use truncation \"drop\" to skip them)" : "");
}

static char *copy_text(const char *s) {
    size_t len = strlen(s) + 1;
    char *c = malloc(len);
    if (c) memcpy(c, s, len);
    return c;
}

/* The prompt as the row gives it: its text, or its messages as JSON. */
static int keep_prompt(const struct row_turns *prompt, struct dataset_prompt *out, struct smelt_error *err) {
    if (prompt->text) {
        out->text = copy_text(prompt->text);
        return out->text ? SMELT_OK : error_set(err, SMELT_ENOMEM, "dataset: prompt text");
    }
    json_t *list = json_array();
    for (size_t i = 0; list && i < prompt->n_messages; i++) {
        const struct chat_message *m = &prompt->messages[i];
        if (json_array_append_new(list, json_pack("{s:s, s:s}", "role", m->role, "content", m->content))) {
            json_decref(list);
            list = NULL;
        }
    }
    out->messages_json = list ? json_dumps(list, JSON_COMPACT) : NULL;
    json_decref(list);
    return out->messages_json ? SMELT_OK : error_set(err, SMELT_ENOMEM, "dataset: prompt messages");
}

int prompts_row_prompt(const struct dataset_format *format, const struct dataset_row *row,
                       struct dataset_prompt *out, enum example_fit *fit,
                       struct dataset_issue *issue, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    out->line = row->line;
    size_t n = 0;
    const char *field = row->prompt_field ? row->prompt_field : "prompt";
    int rc = prompt_ids(format, &row->prompt, field, &out->ids, &n, issue, err);
    if (!rc) rc = fit_prompt(format, n, field, fit, issue);
    if (!rc && *fit != EXAMPLE_DROPPED) {
        out->n = (int32_t)n;
        rc = keep_prompt(&row->prompt, out, err);
        if (!rc && row->answer && !(out->answer = copy_text(row->answer)))
            rc = error_set(err, SMELT_ENOMEM, "dataset: answer text");
        if (!rc && row->metadata &&
            !(out->metadata_json = json_dumps(row->metadata, JSON_COMPACT | JSON_PRESERVE_ORDER)))
            rc = error_set(err, SMELT_ENOMEM, "dataset: metadata text");
    }
    if (rc) prompt_free(out);
    return rc;
}
