/* An SFT row → one example: a conversation through the chat template, or a prompt
 * and its completion. */
#include "datasets/datasets_internal.h"

int sft_row_example(const struct dataset_format *format, const struct dataset_row *row,
                    struct dataset_example *ex, enum example_fit *fit,
                    struct dataset_issue *issue, struct smelt_error *err) {
    int rc;
    if (row->conversation.messages)
        rc = tokenize_chat(format, NULL, &row->conversation, "messages", ex, issue, err);
    else
        rc = tokenize_turns(format, &row->prompt, &row->response, "completion", ex, issue, err);
    if (!rc) rc = example_fit(format, ex, true, "", fit, issue);
    ex->line = row->line;
    if (rc) dataset_example_free(ex);
    return rc;
}
