/* Helpers shared by the dataset tests (test_datasets.c, test_prompts_messages.c), ds_*:
 * the byte tokenizer and the plain chat template made and freed around each test (the
 * Criterion fixtures), a format over them, files written into the test folder, a load
 * that must succeed and a report's issue checked. */
#ifndef SMELT_TESTS_DATASETS_TESTUTIL_H
#define SMELT_TESTS_DATASETS_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "tokenizer/tokenizer.h"

/* The test's tokenizer and template: set by ds_setup, the tokenizer freed by ds_teardown. */
__attribute__((unused)) static struct tokenizer *ds_tok;
__attribute__((unused)) static struct chat_template ds_chat;

/* `.init = ds_setup, .fini = ds_teardown`: the test folder (testutil.h), the byte
 * tokenizer and the plain template. */
static inline void ds_setup(void) {
    test_tmp_setup();
    struct smelt_error err = {0};
    TEST_OK(tokenizer_create_bytes(NULL, 0, &ds_tok, &err), &err);
    chat_template_init(&ds_chat, CHAT_TEMPLATE_PLAIN);
}

static inline void ds_teardown(void) {
    tokenizer_free(ds_tok);
    ds_tok = NULL;
    test_tmp_teardown();
}

/* Rows of at most max_seq_len ids (longer ones refused), loss on the completion, bos first. */
static inline struct dataset_format ds_format(int64_t max_seq_len) {
    return (struct dataset_format){.tok = ds_tok, .chat = &ds_chat, .max_seq_len = max_seq_len,
                                   .truncation = DATASET_TRUNCATE_ERROR,
                                   .loss_on = DATASET_LOSS_COMPLETION, .add_bos = true};
}

/* Writes text into the test folder as name; returns the path, in one of 8 static buffers
 * used in turn (valid until 8 more calls). */
static inline const char *ds_write_file(const char *name, const char *text) {
    static char paths[8][256];
    static int next;
    char *path = paths[next++ % 8];
    test_tmp_path(path, 256, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
    return path;
}

/* The dataset of path, which must load (report may be NULL); the test frees it. */
static inline struct dataset *ds_load(const char *path, enum dataset_kind kind, const struct dataset_format *f,
                                      struct dataset_report *report) {
    struct smelt_error err = {0};
    struct dataset *ds = NULL;
    TEST_OK(dataset_load(path, kind, f, &ds, report, &err), &err);
    cr_assert(ds);
    return ds;
}

/* Issue i of report r is on line `line`, names field and says exactly message. */
static inline void ds_expect_issue(const struct dataset_report *r, int64_t i, int64_t line, const char *field,
                                   const char *message) {
    cr_assert(i < r->n_issues && i < DATASET_MAX_ISSUES, "no issue %lld (%lld issues)", (long long)i,
              (long long)r->n_issues);
    const struct dataset_issue *is = &r->issues[i];
    cr_expect_eq(is->line, line, "issue %lld is on line %lld, expected %lld (%s: %s)", (long long)i,
                 (long long)is->line, (long long)line, is->field, is->message);
    cr_expect_str_eq(is->field, field, "issue %lld (line %lld)", (long long)i, (long long)line);
    cr_expect_str_eq(is->message, message, "issue %lld (line %lld)", (long long)i, (long long)line);
}

#endif
