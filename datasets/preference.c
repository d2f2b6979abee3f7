/* A preference row → two examples, the prompt followed by the chosen response and by
 * the rejected one. Only the responses are marked whatever loss_on says: the
 * preference losses compare the responses' log-probabilities. The same tokenization of
 * one (prompt, response) given apart from a row: what a reward model scores at reward
 * time is what it was trained on. */
#include "datasets/datasets_internal.h"

#include <stdlib.h>
#include <string.h>

int preference_row_examples(const struct dataset_format *format, const struct dataset_row *row,
                            struct dataset_example pair[2], enum example_fit *fit,
                            struct dataset_issue *issue, struct smelt_error *err) {
    static const char *const sides[2] = {"chosen", "rejected"};
    const struct row_turns *responses[2] = {&row->response, &row->rejected};
    *fit = EXAMPLE_FITS;
    int rc = SMELT_OK;
    for (int s = 0; s < 2 && !rc; s++) {
        enum example_fit side_fit = EXAMPLE_FITS;
        rc = tokenize_turns(format, &row->prompt, responses[s], sides[s], &pair[s], issue, err);
        if (!rc) rc = example_fit(format, &pair[s], false, sides[s], &side_fit, issue);
        pair[s].line = row->line;
        pair[s].margin = row->margin;
        /* A pair lives or dies whole: dropping either side drops both (the enum is
         * ordered FITS < TRUNCATED < DROPPED). */
        if (!rc && side_fit > *fit) *fit = side_fit;
    }
    if (rc) {
        dataset_example_free(&pair[0]);
        dataset_example_free(&pair[1]);
    }
    return rc;
}

/* messages_json (a JSON array of {"role", "content"}) as turns borrowing its strings. */
static int turns_of(const json_t *list, struct row_turns *t, struct smelt_error *err) {
    size_t n = json_array_size(list);
    if (!json_is_array(list) || n == 0)
        return error_set(err, SMELT_EFORMAT, "the prompt's messages are not a non-empty JSON list");
    t->messages = calloc(n, sizeof *t->messages);
    if (!t->messages) return error_set(err, SMELT_ENOMEM, "dataset: %zu messages", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(list, i);
        t->messages[i].role = json_string_value(json_object_get(m, "role"));
        t->messages[i].content = json_string_value(json_object_get(m, "content"));
        if (!t->messages[i].role || !t->messages[i].content)
            return error_set(err, SMELT_EFORMAT, "the prompt's messages[%zu] lacks a string role or content", i);
    }
    t->n_messages = n;
    return SMELT_OK;
}

int dataset_tokenize_response(const struct dataset_format *format, const char *prompt_text,
                              const char *prompt_messages_json, const char *response,
                              struct dataset_example *ex, struct smelt_error *err) {
    memset(ex, 0, sizeof *ex);
    if (!format || !format->tok || !response || !prompt_text == !prompt_messages_json)
        return error_set(err, SMELT_EINVAL, "dataset_tokenize_response: a format, a response and one prompt");
    struct row_turns prompt = {.text = prompt_text}, answer = {.text = prompt_text ? response : NULL};
    struct chat_message turn = {.role = "assistant", .content = response};
    json_t *list = NULL;
    int rc = SMELT_OK;
    if (prompt_messages_json) {
        list = json_loads(prompt_messages_json, 0, NULL);
        answer.messages = &turn;
        answer.n_messages = 1;
        rc = turns_of(list, &prompt, err);
    }
    struct dataset_issue issue = {0};
    if (!rc) rc = tokenize_turns(format, &prompt, &answer, "response", ex, &issue, err);
    if (rc == SMELT_EFORMAT && issue.message[0]) error_set(err, rc, "%s", issue.message);
    free(prompt.messages);
    json_decref(list);
    return rc;
}
