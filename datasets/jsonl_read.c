/* JSONL lines → JSON rows, and the issue list every problem lands in. */
#include "datasets/datasets_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int issue_set(struct dataset_issue *issue, const char *field, const char *fmt, ...) {
    snprintf(issue->field, sizeof issue->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(issue->message, sizeof issue->message, fmt, ap);
    va_end(ap);
    return SMELT_EFORMAT;
}

void report_add_issue(struct dataset_report *report, const char *path,
                      const struct dataset_issue *issue, struct smelt_error *err) {
    if (report->n_issues < DATASET_MAX_ISSUES) report->issues[report->n_issues] = *issue;
    if (report->n_issues++ > 0) return;
    if (issue->line <= 0)
        error_set(err, SMELT_EFORMAT, "%s: %s", path, issue->message);
    else if (issue->field[0])
        error_set(err, SMELT_EFORMAT, "%s:%lld: %s: %s", path, (long long)issue->line,
                  issue->field, issue->message);
    else
        error_set(err, SMELT_EFORMAT, "%s:%lld: %s", path, (long long)issue->line,
                  issue->message);
}

const char *json_kind_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER:
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

bool text_is_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!strchr(" \t\r\n\f\v", s[i]) || s[i] == '\0') return false;
    return true;
}

int jsonl_open(struct jsonl_reader *r, const char *path, struct smelt_error *err) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->file = fopen(path, "rb");
    if (!r->file) return error_set(err, SMELT_EIO, "%s: cannot open: %s", path, strerror(errno));
    return SMELT_OK;
}

/* Reads one line into r->line; its length in *len (newline kept). 0 at the end. */
static int read_line(struct jsonl_reader *r, size_t *len, struct smelt_error *err) {
    errno = 0;
    ssize_t n = getline(&r->line, &r->cap, r->file);
    if (n >= 0) {
        *len = (size_t)n;
        return 1;
    }
    if (ferror(r->file)) {
        int code = errno == ENOMEM ? SMELT_ENOMEM : SMELT_EIO;
        return error_set(err, code, "%s: reading line %lld: %s", r->path,
                         (long long)r->n_lines + 1, strerror(errno ? errno : EIO));
    }
    return 0;
}

int jsonl_next(struct jsonl_reader *r, json_t **row, struct dataset_issue *issue,
               struct smelt_error *err) {
    *row = NULL;
    for (;;) {
        size_t len = 0;
        int rc = read_line(r, &len, err);
        if (rc <= 0) return rc;
        r->n_lines++;
        const char *text = r->line;
        /* A byte order mark some editors write is not JSON; it says nothing either. */
        if (r->n_lines == 1 && len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) text += 3, len -= 3;
        if (text_is_blank(text, len)) {
            r->n_blank++;
            continue;
        }
        json_error_t jerr;
        *row = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!*row) {
            bool utf8 = json_error_code(&jerr) == json_error_invalid_utf8;
            issue_set(issue, "", "invalid JSON%s: %s (column %d)", utf8 ? " (not UTF-8)" : "",
                      jerr.text, jerr.column);
            issue->line = r->n_lines;
        }
        return 1;
    }
}

void jsonl_close(struct jsonl_reader *r) {
    if (r->file) fclose(r->file);
    free(r->line);
    r->file = NULL;
    r->line = NULL;
}
