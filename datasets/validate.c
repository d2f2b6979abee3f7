/* The pass over a file that validation and loading share: every line read, the kind
 * decided, every row checked, every problem counted; loading adds a callback. */
#include "datasets/datasets_internal.h"

#include <string.h>

struct pass {
    enum dataset_kind kind;    /* the file's kind; AUTO until a valid row decides */
    bool kind_requested;
    int64_t kind_line;         /* the row that decided it */
};

/* The row's kind, or an issue when it differs from the file's. */
static int row_kind(const struct pass *pass, const json_t *obj, enum dataset_kind *kind,
                    struct dataset_issue *issue) {
    if (!json_is_object(obj))
        return issue_set(issue, "", "expected a JSON object, got %s", json_kind_name(obj));
    *kind = row_guess_kind(obj, pass->kind);
    if (pass->kind == DATASET_AUTO || *kind == DATASET_AUTO || *kind == pass->kind) return SMELT_OK;
    if (pass->kind_requested)
        return issue_set(issue, "", "a %s row, but the dataset was requested as %s",
                         dataset_kind_name(*kind), dataset_kind_name(pass->kind));
    return issue_set(issue, "", "a %s row in a %s file (line %lld decided the kind; kinds cannot mix)",
                     dataset_kind_name(*kind), dataset_kind_name(pass->kind),
                     (long long)pass->kind_line);
}

/* Checks one row and hands it to fn. SMELT_EFORMAT (issue) or a fatal code. */
static int pass_row(struct pass *pass, const json_t *obj, int64_t line, dataset_row_fn fn,
                    void *ctx, bool *kept, struct dataset_issue *issue, struct smelt_error *err) {
    enum dataset_kind kind = DATASET_AUTO;
    int rc = row_kind(pass, obj, &kind, issue);
    if (rc) return rc;
    struct dataset_row row = {0};
    rc = row_parse(obj, kind, &row, issue, err);
    row.line = line;
    if (!rc && pass->kind == DATASET_AUTO) {
        pass->kind = kind;
        pass->kind_line = line;
    }
    *kept = true;
    if (!rc && fn) rc = fn(ctx, &row, kept, issue, err);
    row_free(&row);
    return rc;
}

int dataset_read_rows(const char *path, enum dataset_kind kind, struct dataset_report *report,
                      dataset_row_fn fn, void *ctx, struct smelt_error *err) {
    memset(report, 0, sizeof *report);
    if (!path) return error_set(err, SMELT_EINVAL, "dataset: no path");
    if ((int)kind < DATASET_AUTO || kind > DATASET_PROMPTS)
        return error_set(err, SMELT_EINVAL, "dataset %s: unknown kind %d", path, (int)kind);
    struct pass pass = {.kind = kind, .kind_requested = kind != DATASET_AUTO};
    struct jsonl_reader reader;
    int rc = jsonl_open(&reader, path, err);
    if (rc) return rc;
    int64_t n_rows = 0;
    for (;;) {
        json_t *obj = NULL;
        struct dataset_issue issue = {0};
        rc = jsonl_next(&reader, &obj, &issue, err);
        if (rc <= 0) break;
        n_rows++;
        bool kept = false;
        rc = obj ? pass_row(&pass, obj, reader.n_lines, fn, ctx, &kept, &issue, err) : SMELT_EFORMAT;
        json_decref(obj);
        if (rc == SMELT_EFORMAT) {
            issue.line = reader.n_lines;
            report_add_issue(report, path, &issue, err);
        } else if (rc) {
            break;
        } else if (kept) {
            report->n_examples++;
        }
    }
    report->kind = pass.kind;
    report->n_lines = reader.n_lines;
    report->n_skipped_blank = reader.n_blank;
    jsonl_close(&reader);
    if (rc < 0) return rc; /* a read error or out of memory: the report is partial */
    if (n_rows == 0) {
        struct dataset_issue issue = {.line = 0};
        issue_set(&issue, "", "no rows: the file is empty or holds only blank lines");
        report_add_issue(report, path, &issue, err);
    }
    return report->n_issues ? SMELT_EFORMAT : SMELT_OK;
}

int dataset_validate_file(const char *path, enum dataset_kind kind, struct dataset_report *report,
                          struct smelt_error *err) {
    struct dataset_report local;
    return dataset_read_rows(path, kind, report ? report : &local, NULL, NULL, err);
}
