/* Private to datasets/: the line reader, one row's validated shape, tokenization
 * helpers and the file pass that validation and loading share. */
#ifndef SMELT_DATASETS_INTERNAL_H
#define SMELT_DATASETS_INTERNAL_H

#include <jansson.h>
#include <stdio.h>

#include "datasets/datasets.h"

/* ---- issues (jsonl_read.c) ---- */

/* Fills issue (line left to the caller) and returns SMELT_EFORMAT. */
int issue_set(struct dataset_issue *issue, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Counts the issue in report, keeps it while there is room, and puts the first one of
 * the file into err as "<path>:<line>: <field>: <what>". */
void report_add_issue(struct dataset_report *report, const char *path,
                      const struct dataset_issue *issue, struct smelt_error *err);
/* "object", "array", "string", "number", "boolean", "null". */
const char *json_kind_name(const json_t *v);
/* Only ASCII whitespace (or nothing). */
bool text_is_blank(const char *s, size_t len);

/* ---- reading lines (jsonl_read.c) ---- */

struct jsonl_reader {
    FILE *file;
    const char *path;   /* borrowed */
    char *line;         /* getline's buffer: lines have no length limit */
    size_t cap;
    int64_t n_lines;    /* blank ones included */
    int64_t n_blank;
};

int jsonl_open(struct jsonl_reader *r, const char *path, struct smelt_error *err);
/* The next non-blank line: 1 with *row a new JSON reference (NULL when the line is not
 * valid JSON; issue then says why, line set), 0 at the end, < 0 on a read error. */
int jsonl_next(struct jsonl_reader *r, json_t **row, struct dataset_issue *issue,
               struct smelt_error *err);
void jsonl_close(struct jsonl_reader *r);

/* ---- one row (row_parse.c) ---- */

/* A prompt or a response as a row gives it: raw text or a message list. */
struct row_turns {
    const char *text;               /* borrowed from the row's JSON; NULL for a list */
    struct chat_message *messages;  /* malloc'd, strings borrowed; NULL for text */
    size_t n_messages;
};

/* A structurally valid row. Everything borrowed lives as long as the row's JSON. */
struct dataset_row {
    enum dataset_kind kind;
    int64_t line;
    struct row_turns conversation;  /* SFT {"messages"} form; else empty */
    struct row_turns prompt;
    struct row_turns response;      /* SFT completion, preference chosen */
    struct row_turns rejected;      /* preference */
    double margin;                  /* preference: "margin", 0 when absent */
    const char *answer;             /* prompts; NULL when absent */
    const json_t *metadata;         /* prompts; NULL when absent */
    json_t *owned_metadata;         /* an OpenAI prompts row's other fields (metadata points
                                       here); row_free releases it */
    const char *prompt_field;       /* prompts: where the prompt is, "prompt" or "messages" */
};

/* The kind the row's keys point to (DATASET_AUTO when none do). A row with only
 * "prompt" fits every kind: it is prompts unless the file's kind says otherwise. A row
 * with "messages" fits sft and prompts: the file's kind when it is one of them, else
 * prompts when the last message is not an assistant turn (OpenAI's reinforcement rows),
 * sft otherwise. */
enum dataset_kind row_guess_kind(const json_t *obj, enum dataset_kind file_kind);
/* Checks the row against kind (not AUTO) and fills *row. SMELT_EFORMAT with issue
 * filled for an invalid row; SMELT_ENOMEM. row_free releases it either way. */
int row_parse(const json_t *obj, enum dataset_kind kind, struct dataset_row *row,
              struct dataset_issue *issue, struct smelt_error *err);
void row_free(struct dataset_row *row);

/* ---- the file pass (validate.c) ---- */

/* Called for each structurally valid row: SMELT_OK with *kept, SMELT_EFORMAT with
 * issue filled, or a fatal code (ENOMEM) that stops the pass. */
typedef int (*dataset_row_fn)(void *ctx, const struct dataset_row *row, bool *kept,
                              struct dataset_issue *issue, struct smelt_error *err);

/* Reads every line of path, decides the kind (AUTO: the first valid row), checks
 * each row and hands the valid ones to fn (NULL: validation only). report is filled
 * from scratch. SMELT_EFORMAT with the first issue in err when any row failed. */
int dataset_read_rows(const char *path, enum dataset_kind kind, struct dataset_report *report,
                      dataset_row_fn fn, void *ctx, struct smelt_error *err);

/* ---- tokens (tokenize.c) ---- */

/* What fitting an example into max_seq_len did to it. */
enum example_fit {
    EXAMPLE_FITS,
    EXAMPLE_TRUNCATED,
    EXAMPLE_DROPPED,
};

/* [bos] + encode(prompt) + encode(response) + [eos]; mask 1 on the response and eos. */
int tokenize_raw(const struct dataset_format *format, const char *prompt, const char *response,
                 const char *response_field, struct dataset_example *ex,
                 struct dataset_issue *issue, struct smelt_error *err);
/* prompt messages (n_prompt may be 0) + response messages through the chat template.
 * With prompt messages only the response's assistant turns keep their mask; with none
 * (an SFT conversation) every assistant turn does. */
int tokenize_chat(const struct dataset_format *format, const struct row_turns *prompt,
                  const struct row_turns *response, const char *field,
                  struct dataset_example *ex, struct dataset_issue *issue,
                  struct smelt_error *err);
/* prompt (raw or messages) followed by response of the same form. */
int tokenize_turns(const struct dataset_format *format, const struct row_turns *prompt,
                   const struct row_turns *response, const char *response_field,
                   struct dataset_example *ex, struct dataset_issue *issue,
                   struct smelt_error *err);
/* Sets n_prompt, applies loss_on when apply_loss_on, and max_seq_len's truncation
 * policy. An example that keeps no trained token is EXAMPLE_DROPPED (its memory kept:
 * the caller frees). SMELT_EFORMAT with issue for nothing to train or, under
 * DATASET_TRUNCATE_ERROR, a sequence too long; field names the sequence ("" for the row). */
int example_fit(const struct dataset_format *format, struct dataset_example *ex,
                bool apply_loss_on, const char *field, enum example_fit *fit,
                struct dataset_issue *issue);
int64_t example_trained_tokens(const struct dataset_example *ex);
void prompt_free(struct dataset_prompt *p);

/* ---- order (shuffle.c) ---- */

/* order[0..n) = a permutation of 0..n-1 drawn from seed (Fisher–Yates, common/rng.h). */
void shuffle_indices(int64_t *order, int64_t n, uint64_t seed);

/* ---- one row to examples (sft.c, preference.c, prompts.c) ---- */

int sft_row_example(const struct dataset_format *format, const struct dataset_row *row,
                    struct dataset_example *ex, enum example_fit *fit,
                    struct dataset_issue *issue, struct smelt_error *err);
/* pair[0] chosen, pair[1] rejected. */
int preference_row_examples(const struct dataset_format *format, const struct dataset_row *row,
                            struct dataset_example pair[2], enum example_fit *fit,
                            struct dataset_issue *issue, struct smelt_error *err);
int prompts_row_prompt(const struct dataset_format *format, const struct dataset_row *row,
                       struct dataset_prompt *out, enum example_fit *fit,
                       struct dataset_issue *issue, struct smelt_error *err);

#endif
