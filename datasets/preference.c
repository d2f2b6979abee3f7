/* A preference row → two examples, the prompt followed by the chosen response and by
 * the rejected one. Only the responses are marked whatever loss_on says: the
 * preference losses compare the responses' log-probabilities. */
#include "datasets/datasets_internal.h"

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
        example_free(&pair[0]);
        example_free(&pair[1]);
    }
    return rc;
}
