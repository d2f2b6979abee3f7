/* dataset_load: the file pass with every valid row tokenized and kept, and
 * dataset_free. */
#include "datasets/datasets_internal.h"

#include <stdlib.h>
#include <string.h>

struct load_ctx {
    const struct dataset_format *format;
    struct dataset *ds;
    int64_t cap; /* rows the arrays hold */
};

static int seqs_per_row(enum dataset_kind kind) { return kind == DATASET_PREFERENCE ? 2 : 1; }

static int grow(struct load_ctx *c, enum dataset_kind kind, struct smelt_error *err) {
    struct dataset *ds = c->ds;
    if (ds->n < c->cap) return SMELT_OK;
    int64_t cap = c->cap ? 2 * c->cap : 256;
    if (kind == DATASET_PROMPTS) {
        struct dataset_prompt *p = realloc(ds->prompts, (size_t)cap * sizeof *p);
        if (!p) return error_set(err, SMELT_ENOMEM, "dataset: %lld prompts", (long long)cap);
        ds->prompts = p;
    } else {
        size_t n = (size_t)cap * (size_t)seqs_per_row(kind);
        struct dataset_example *e = realloc(ds->examples, n * sizeof *e);
        if (!e) return error_set(err, SMELT_ENOMEM, "dataset: %zu examples", n);
        ds->examples = e;
    }
    c->cap = cap;
    return SMELT_OK;
}

static void count_example(struct dataset_report *r, const struct dataset_example *ex) {
    r->n_tokens += ex->n;
    r->n_trained_tokens += example_trained_tokens(ex);
}

/* Tokenizes one row; keeps it while the file has shown no issue (a load that will fail
 * need not hold the rest). */
static int load_row(void *ctx, const struct dataset_row *row, bool *kept,
                    struct dataset_issue *issue, struct smelt_error *err) {
    struct load_ctx *c = ctx;
    struct dataset_report *report = &c->ds->report;
    struct dataset_example ex[2] = {{0}};
    struct dataset_prompt prompt = {0};
    enum example_fit fit = EXAMPLE_FITS;
    int rc;
    switch (row->kind) {
    case DATASET_SFT: rc = sft_row_example(c->format, row, &ex[0], &fit, issue, err); break;
    case DATASET_PREFERENCE: rc = preference_row_examples(c->format, row, ex, &fit, issue, err); break;
    default: rc = prompts_row_prompt(c->format, row, &prompt, &fit, issue, err); break;
    }
    if (rc) return rc;
    *kept = fit != EXAMPLE_DROPPED;
    report->n_truncated += fit == EXAMPLE_TRUNCATED;
    report->n_dropped += fit == EXAMPLE_DROPPED;
    int n_seqs = seqs_per_row(row->kind);
    if (*kept) {
        for (int s = 0; s < n_seqs && row->kind != DATASET_PROMPTS; s++) count_example(report, &ex[s]);
        if (row->kind == DATASET_PROMPTS) report->n_tokens += prompt.n;
    }
    if (*kept && report->n_issues == 0) rc = grow(c, row->kind, err);
    if (!*kept || report->n_issues || rc) {
        dataset_example_free(&ex[0]);
        dataset_example_free(&ex[1]);
        prompt_free(&prompt);
        return rc;
    }
    struct dataset *ds = c->ds;
    if (row->kind == DATASET_PROMPTS)
        ds->prompts[ds->n] = prompt;
    else
        memcpy(&ds->examples[ds->n * n_seqs], ex, (size_t)n_seqs * sizeof *ex);
    ds->n++;
    return SMELT_OK;
}

static int check_format(const struct dataset_format *f, struct smelt_error *err) {
    if (!f || !f->tok) return error_set(err, SMELT_EINVAL, "dataset_load: a format with a tokenizer is required");
    if (f->max_seq_len < 2 || f->max_seq_len > INT32_MAX)
        return error_set(err, SMELT_EINVAL, "dataset_load: max_seq_len %lld is outside [2, %d]",
                         (long long)f->max_seq_len, INT32_MAX);
    if ((int)f->truncation < 0 || f->truncation > DATASET_TRUNCATE_RIGHT)
        return error_set(err, SMELT_EINVAL, "dataset_load: unknown truncation %d", (int)f->truncation);
    if ((int)f->loss_on < 0 || f->loss_on > DATASET_LOSS_ALL)
        return error_set(err, SMELT_EINVAL, "dataset_load: unknown loss_on %d", (int)f->loss_on);
    return SMELT_OK;
}

int dataset_load(const char *path, enum dataset_kind kind, const struct dataset_format *format,
                 struct dataset **out, struct dataset_report *report_out,
                 struct smelt_error *err) {
    if (report_out) memset(report_out, 0, sizeof *report_out);
    if (!out || !path) return error_set(err, SMELT_EINVAL, "dataset_load: path and out are required");
    *out = NULL;
    int rc = check_format(format, err);
    if (rc) return rc;
    struct dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return error_set(err, SMELT_ENOMEM, "dataset_load: %s", path);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    struct load_ctx ctx = {.format = format, .ds = ds};
    rc = dataset_read_rows(path, kind, &ds->report, load_row, &ctx, err);
    ds->kind = ds->report.kind;
    if (!rc && ds->n == 0) {
        struct dataset_issue issue = {.line = 0};
        issue_set(&issue, "", "no examples left: all %lld rows were dropped as longer than "
                              "max_seq_len %lld", (long long)ds->report.n_dropped,
                  (long long)format->max_seq_len);
        report_add_issue(&ds->report, path, &issue, err);
        rc = SMELT_EFORMAT;
    }
    if (report_out) *report_out = ds->report;
    if (rc) {
        dataset_free(ds);
        return rc;
    }
    *out = ds;
    return SMELT_OK;
}

void dataset_free(struct dataset *ds) {
    if (!ds) return;
    int64_t n_examples = ds->examples ? ds->n * seqs_per_row(ds->kind) : 0;
    for (int64_t i = 0; i < n_examples; i++) dataset_example_free(&ds->examples[i]);
    for (int64_t i = 0; ds->prompts && i < ds->n; i++) prompt_free(&ds->prompts[i]);
    free(ds->examples);
    free(ds->prompts);
    free(ds);
}
