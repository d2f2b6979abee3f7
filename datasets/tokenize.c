/* Text and conversations → token ids with their loss mask, and fitting the result into
 * max_seq_len. Shared by SFT, preference and prompt rows. */
#include "datasets/datasets_internal.h"

#include <stdlib.h>
#include <string.h>

void dataset_example_free(struct dataset_example *ex) {
    free(ex->ids);
    free(ex->mask);
    ex->ids = NULL;
    ex->mask = NULL;
    ex->n = 0;
}

void prompt_free(struct dataset_prompt *p) {
    free(p->ids);
    free(p->text);
    free(p->messages_json);
    free(p->answer);
    free(p->metadata_json);
    memset(p, 0, sizeof *p);
}

int64_t example_trained_tokens(const struct dataset_example *ex) {
    int64_t n = 0;
    for (int32_t i = 0; i < ex->n; i++) n += ex->mask[i];
    return n;
}

/* A tokenizer failure on user text is the row's problem; running out of memory is not. */
static int encode_failed(int rc, const char *field, const struct smelt_error *e,
                         struct dataset_issue *issue, struct smelt_error *err) {
    if (rc == SMELT_ENOMEM) return error_set(err, rc, "%s", e->message);
    return issue_set(issue, field, "%s", e->message);
}

static int too_many_tokens(size_t n, const char *field, struct dataset_issue *issue) {
    return issue_set(issue, field, "%zu tokens: more than a sequence can hold", n);
}

int tokenize_raw(const struct dataset_format *format, const char *prompt, const char *response,
                 const char *response_field, struct dataset_example *ex,
                 struct dataset_issue *issue, struct smelt_error *err) {
    const struct tokenizer_specials *sp = tokenizer_special_ids(format->tok);
    int32_t bos = format->add_bos ? sp->bos : -1, eos = sp->eos;
    int32_t *p_ids = NULL, *r_ids = NULL;
    size_t n_p = 0, n_r = 0;
    struct smelt_error e = {0};
    int rc = tokenizer_encode(format->tok, prompt, strlen(prompt), false, &p_ids, &n_p, &e);
    if (rc) return encode_failed(rc, "prompt", &e, issue, err);
    rc = tokenizer_encode(format->tok, response, strlen(response), false, &r_ids, &n_r, &e);
    if (rc) {
        free(p_ids);
        return encode_failed(rc, response_field, &e, issue, err);
    }
    size_t n = (bos >= 0) + n_p + n_r + (eos >= 0);
    if (n > INT32_MAX) {
        rc = too_many_tokens(n, "", issue);
        goto done;
    }
    ex->ids = malloc((n ? n : 1) * sizeof *ex->ids);
    ex->mask = calloc(n ? n : 1, 1);
    if (!ex->ids || !ex->mask) {
        rc = error_set(err, SMELT_ENOMEM, "dataset: %zu tokens", n);
        goto done;
    }
    size_t k = 0;
    if (bos >= 0) ex->ids[k++] = bos;
    if (n_p) memcpy(ex->ids + k, p_ids, n_p * sizeof *p_ids);
    k += n_p;
    if (n_r) memcpy(ex->ids + k, r_ids, n_r * sizeof *r_ids);
    memset(ex->mask + k, 1, n_r);
    k += n_r;
    if (eos >= 0) ex->mask[k] = 1, ex->ids[k++] = eos;
    ex->n = (int32_t)n;
done:
    free(p_ids);
    free(r_ids);
    return rc;
}

/* Keeps the mask of the last `keep` runs of ones (the response's assistant turns). */
static int keep_last_runs(uint8_t *mask, size_t n, size_t keep, size_t n_assistant,
                          const char *field, struct dataset_issue *issue) {
    size_t runs = 0;
    for (size_t i = 0; i < n; i++) runs += mask[i] && (i == 0 || !mask[i - 1]);
    if (runs != n_assistant)
        return issue_set(issue, field, "the chat template marked %zu spans for %zu assistant turns",
                         runs, n_assistant);
    size_t seen = 0;
    uint8_t before = 0; /* mask[i - 1] as chat_tokenize gave it */
    for (size_t i = 0; i < n; i++) {
        uint8_t m = mask[i];
        seen += m && !before;
        before = m;
        if (seen <= runs - keep) mask[i] = 0;
    }
    return SMELT_OK;
}

static size_t count_assistant(const struct row_turns *t) {
    size_t n = 0;
    for (size_t i = 0; t && i < t->n_messages; i++) n += !strcmp(t->messages[i].role, "assistant");
    return n;
}

int tokenize_chat(const struct dataset_format *format, const struct row_turns *prompt,
                  const struct row_turns *response, const char *field,
                  struct dataset_example *ex, struct dataset_issue *issue,
                  struct smelt_error *err) {
    if (!format->chat)
        return issue_set(issue, field, "a list of messages needs a chat template, and none was "
                                       "given or found with the tokenizer");
    size_t n_p = prompt ? prompt->n_messages : 0, n_msg = n_p + response->n_messages;
    struct chat_message *msgs = malloc(n_msg * sizeof *msgs);
    if (!msgs) return error_set(err, SMELT_ENOMEM, "dataset: %zu messages", n_msg);
    if (n_p) memcpy(msgs, prompt->messages, n_p * sizeof *msgs);
    memcpy(msgs + n_p, response->messages, response->n_messages * sizeof *msgs);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    struct smelt_error e = {0};
    int rc = chat_tokenize(format->chat, format->tok, msgs, n_msg, false, &ids, &mask, &n, &e);
    free(msgs);
    if (rc) return encode_failed(rc, field, &e, issue, err);
    if (n > INT32_MAX) rc = too_many_tokens(n, field, issue);
    if (!rc && n_p)
        rc = keep_last_runs(mask, n, count_assistant(response),
                            count_assistant(prompt) + count_assistant(response), field, issue);
    if (rc) {
        free(ids);
        free(mask);
        return rc;
    }
    ex->ids = ids;
    ex->mask = mask;
    ex->n = (int32_t)n;
    return SMELT_OK;
}

int tokenize_turns(const struct dataset_format *format, const struct row_turns *prompt,
                   const struct row_turns *response, const char *response_field,
                   struct dataset_example *ex, struct dataset_issue *issue,
                   struct smelt_error *err) {
    if (prompt->text)
        return tokenize_raw(format, prompt->text, response->text, response_field, ex, issue, err);
    return tokenize_chat(format, prompt, response, response_field, ex, issue, err);
}

/* Gives back the memory of cut tokens; keeping the larger arrays is harmless. */
static void shrink(struct dataset_example *ex) {
    int32_t *ids = realloc(ex->ids, (size_t)ex->n * sizeof *ids);
    if (ids) ex->ids = ids;
    uint8_t *mask = realloc(ex->mask, (size_t)ex->n);
    if (mask) ex->mask = mask;
}

int example_fit(const struct dataset_format *format, struct dataset_example *ex,
                bool apply_loss_on, const char *field, enum example_fit *fit,
                struct dataset_issue *issue) {
    *fit = EXAMPLE_FITS;
    if (ex->n > 0) ex->mask[0] = 0; /* nothing predicts the first token */
    int32_t first = 0;
    while (first < ex->n && !ex->mask[first]) first++;
    if (first == ex->n) return issue_set(issue, field, "nothing to train: no completion token");
    ex->n_prompt = first;
    if (apply_loss_on && format->loss_on == DATASET_LOSS_ALL)
        for (int32_t i = 1; i < ex->n; i++) ex->mask[i] = 1;
    if (ex->n <= format->max_seq_len) return SMELT_OK;
    switch (format->truncation) {
    case DATASET_TRUNCATE_DROP: *fit = EXAMPLE_DROPPED; return SMELT_OK;
    case DATASET_TRUNCATE_RIGHT:
        ex->n = (int32_t)format->max_seq_len;
        if (ex->n_prompt > ex->n) ex->n_prompt = ex->n;
        shrink(ex);
        *fit = example_trained_tokens(ex) ? EXAMPLE_TRUNCATED : EXAMPLE_DROPPED;
        return SMELT_OK;
    default:
        return issue_set(issue, field, "sequence of %d tokens exceeds max_seq_len %lld", ex->n,
                         (long long)format->max_seq_len);
    }
}
