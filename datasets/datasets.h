/* datasets/: JSONL training data → validated, tokenized examples with loss masks →
 * shuffled, packed batches for the trainer.
 *
 * Row formats (one JSON object per line; blank lines are skipped; UTF-8):
 *   SFT         {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 *               {"prompt": "...", "completion": "..."}
 *               {"prompt": [messages], "completion": [assistant turn(s)]}
 *   preference  {"prompt": P, "chosen": R, "rejected": R, "margin": x (optional)}
 *               P: a string or a message list; R: a string, or a message list holding
 *               the assistant turn(s) that follow the prompt; chosen and rejected must
 *               differ; optional "margin" (a number, the reward model's); margin: a finite number,
 *               |x| <= 1e6, what a reward model's loss subtracts (TRL RewardTrainer's
 *               margin column); other preference losses ignore it
 *   prompts     {"prompt": P, "answer": "..." (optional), "metadata": {...} (optional)}
 *               {"messages": [...], <any other field>} (OpenAI's reinforcement rows): the
 *               messages are the prompt; every other field is kept, as given, as the
 *               row's metadata (what a grader reads as {{item.<field>}}); a string
 *               "answer" is also the row's answer; "tools" (OpenAI's other reserved key)
 *               is refused unless null or []. A prompt given as messages (either form)
 *               must not end with an assistant turn.
 * Roles: "system", "developer" (OpenAI's name for the system turn: rendered as one),
 * "user", "assistant". Any other key is refused, naming it (OpenAI's prompts rows
 * excepted). A file holds one kind: a row of another kind is an error. A "messages" row
 * is of the file's kind when that is sft or prompts; deciding the kind (DATASET_AUTO), it
 * is prompts when its last message is not an assistant turn, sft when it is. Every
 * problem is reported as "<file>:<line>: <field>: <what>" (field like
 * messages[2].content; "<file>:<line>: <what>" for the row as a whole).
 *
 * Tokenization: message lists go through the chat template (chat_tokenize) and its
 * assistant mask; a prompt/completion pair of strings is raw text, TRL's way:
 * [bos] + encode(prompt) + encode(completion) + [eos], bos only when the tokenizer has
 * one and add_bos is set, eos when the tokenizer has one. Loss mask: by default only
 * assistant / completion tokens (and the eos closing them) are trained; loss_on = ALL
 * trains every token but the first (SFT only: preference examples always mark their
 * response, which is what the preference losses compare).
 *
 * Ownership: dataset_load returns a struct dataset the caller frees with dataset_free;
 * dataset_split moves examples into a new dataset the caller frees. Loaders borrow
 * their dataset, which must outlive them; batches are owned by the loader and valid
 * until the next dataset_loader_next. */
#ifndef SMELT_DATASETS_H
#define SMELT_DATASETS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

enum dataset_kind {
    DATASET_AUTO,       /* decided by the first valid row's keys */
    DATASET_SFT,
    DATASET_PREFERENCE,
    DATASET_PROMPTS,
};
const char *dataset_kind_name(enum dataset_kind kind); /* "auto", "sft", "preference", "prompts" */
int dataset_kind_from_name(const char *name, enum dataset_kind *out, struct smelt_error *err);

/* What to do with an example longer than max_seq_len tokens. */
enum dataset_truncation {
    DATASET_TRUNCATE_ERROR,  /* refuse the file (default): the error names the line */
    DATASET_TRUNCATE_DROP,   /* skip the example; counted in the report */
    DATASET_TRUNCATE_RIGHT,  /* keep the first max_seq_len tokens; counted (an example left
                                with nothing to train is dropped). Prompts rows are never
                                cut: a long prompt is an error, as under ERROR */
};
const char *dataset_truncation_name(enum dataset_truncation t); /* "error", "drop", "truncate" */
int dataset_truncation_from_name(const char *name, enum dataset_truncation *out,
                                 struct smelt_error *err);

enum dataset_loss_on {
    DATASET_LOSS_COMPLETION, /* assistant / completion tokens only (default) */
    DATASET_LOSS_ALL,        /* every token after the first */
};
const char *dataset_loss_on_name(enum dataset_loss_on l); /* "completion", "all" */
int dataset_loss_on_from_name(const char *name, enum dataset_loss_on *out, struct smelt_error *err);

struct dataset_format {
    const struct tokenizer *tok;        /* borrowed; required */
    const struct chat_template *chat;   /* borrowed; NULL refuses message lists */
    int64_t max_seq_len;                /* >= 2 */
    enum dataset_truncation truncation;
    enum dataset_loss_on loss_on;
    bool add_bos;                       /* raw prompt/completion text only */
};

/* One line that failed validation. */
struct dataset_issue {
    int64_t line;                 /* 1-based; 0 for the file as a whole (no rows) */
    char field[64];               /* "messages[1].content", "chosen", "" for the row */
    char message[256];
};

#define DATASET_MAX_ISSUES 20

/* What reading a file found: the file object of the HTTP API shows this. */
struct dataset_report {
    enum dataset_kind kind;
    int64_t n_lines;              /* lines read, blank ones included */
    int64_t n_examples;           /* valid rows kept */
    int64_t n_skipped_blank;
    int64_t n_truncated;          /* DATASET_TRUNCATE_RIGHT */
    int64_t n_dropped;            /* DATASET_TRUNCATE_DROP */
    int64_t n_tokens;             /* after tokenization (0 when validating only) */
    int64_t n_trained_tokens;     /* tokens with mask 1 */
    int64_t n_issues;             /* every invalid row; the first DATASET_MAX_ISSUES kept */
    struct dataset_issue issues[DATASET_MAX_ISSUES];
};

/* One tokenized sequence. mask[i] = 1 when ids[i] is a training target (predicted at
 * position i - 1); mask[0] is always 0. n_prompt: tokens before the first assistant /
 * completion token, whatever loss_on says (what a model is given to generate the rest). */
struct dataset_example {
    int32_t *ids;
    uint8_t *mask;
    int32_t n;
    int32_t n_prompt;
    int64_t line;
    double margin;                /* preference: the row's margin (0 without), both sides */
};

/* A prompt for RL: ids of the rendered prompt (chat template with generation prompt for
 * message lists; raw text otherwise), the prompt as the row gives it (what a reward
 * model renders with its own tokenizer and template: dataset_tokenize_response), the
 * optional answer and metadata (JSON text). */
struct dataset_prompt {
    int32_t *ids;
    int32_t n;
    char *text;                   /* a raw text prompt; NULL for messages */
    char *messages_json;          /* a message list, as a JSON array of {"role", "content"}
                                     (roles as rendered: "developer" is "system"); NULL for text */
    char *answer;                 /* NULL when absent */
    char *metadata_json;          /* NULL when absent */
    int64_t line;
};

struct dataset {
    enum dataset_kind kind;
    char path[512];
    int64_t n;                           /* rows */
    struct dataset_example *examples;    /* SFT: [n]; preference: [2n], chosen at 2i,
                                            rejected at 2i + 1; NULL for prompts */
    struct dataset_prompt *prompts;      /* prompts: [n] */
    struct dataset_report report;
};

/* Checks every line's JSON structure without tokenizing (what an upload can check
 * before a model is known). Fills report (counts and issues) and returns SMELT_OK when
 * every row is valid, SMELT_EFORMAT with the first issue in err otherwise; SMELT_EIO
 * when the file cannot be read. kind DATASET_AUTO decides by the first valid row. An
 * empty file is an error. */
int dataset_validate_file(const char *path, enum dataset_kind kind, struct dataset_report *report,
                          struct smelt_error *err);

/* What the graders of a job read of an OpenAI reinforcement row ({"messages": [...],
 * <any other field>}): every field but "messages" and "tools" (OpenAI's reserved keys)
 * as the row's metadata ({{item.<field>}}; *metadata NULL when none is left, else a new
 * reference to a shallow copy), and its "answer" when that is a string (*answer borrowed
 * from row, else NULL). The prompts loader reads rows through it, and smeltd's graders
 * run route reads its "item" through it, so a grader sees the same item in both.
 * SMELT_EINVAL when row is not an object, SMELT_ENOMEM. */
int dataset_openai_item(const json_t *row, json_t **metadata, const char **answer, struct smelt_error *err);

/* Validates, tokenizes and masks every row. Any invalid row (structure, an empty
 * assistant turn or completion, an SFT row with nothing to train, a sequence over
 * max_seq_len under DATASET_TRUNCATE_ERROR) fails the whole load with SMELT_EFORMAT,
 * the first issue in err and all of them (up to DATASET_MAX_ISSUES) in
 * (*out)->report — *out is NULL on failure, so report_out (may be NULL) receives the
 * report either way. */
int dataset_load(const char *path, enum dataset_kind kind, const struct dataset_format *format,
                 struct dataset **out, struct dataset_report *report_out,
                 struct smelt_error *err);
void dataset_free(struct dataset *ds);

/* Moves round(fraction * n) rows (at least 1, leaving at least 1), chosen by a seeded
 * shuffle, from ds into a new dataset *val; both keep file order. For preference data a
 * pair moves together. fraction in (0, 1), ds->n >= 2. The reports' n_examples, n_tokens
 * and n_trained_tokens are recounted for the rows each now holds. */
int dataset_split(struct dataset *ds, double fraction, uint64_t seed, struct dataset **val,
                  struct smelt_error *err);

/* A prompt and a response tokenized exactly as a side of a preference row is (the
 * reward model's training input, preference_row_examples): a raw prompt (prompt_text)
 * is followed by the response as raw text ([bos] + encode(prompt) + encode(response) +
 * [eos]); a message list (prompt_messages_json, as dataset_prompt.messages_json holds
 * it) by one assistant turn holding the response, through format->chat. Exactly one of
 * prompt_text and prompt_messages_json is non-NULL. No max_seq_len applies: the caller
 * cuts. ex->ids / ex->mask (the response's tokens 1) are the caller's to free
 * (dataset_example_free). SMELT_EFORMAT with why in err for text the tokenizer or the
 * template cannot take (no chat template, a bad role); SMELT_ENOMEM. */
int dataset_tokenize_response(const struct dataset_format *format, const char *prompt_text,
                              const char *prompt_messages_json, const char *response,
                              struct dataset_example *ex, struct smelt_error *err);
void dataset_example_free(struct dataset_example *ex);

/* ---- batches ---- */

/* One packed row for the model: sequences back to back, cu_seqlens marking them;
 * targets[t] = ids[t + 1] when that token is trained and in the same sequence, else -1. */
struct dataset_batch {
    int64_t n_tokens;
    int n_seqs;
    int32_t *ids;          /* [n_tokens] */
    int32_t *cu_seqlens;   /* [n_seqs + 1] */
    int32_t *targets;      /* [n_tokens] */
    int64_t n_targets;     /* targets >= 0 */
    const int64_t *rows;   /* [n_seqs] indices into ds->examples (a pair: 2i, 2i + 1) */
};

struct dataset_loader_config {
    int batch_size;        /* examples per batch (>= 1) when max_tokens is 0 */
    int64_t max_tokens;    /* > 0: packing — add examples while the row stays within
                              max_tokens (an example is never split) */
    bool shuffle;
    uint64_t seed;         /* epoch e uses a permutation drawn from (seed, e) */
    bool drop_last;        /* drop an epoch's last batch when it has fewer than
                              batch_size units or, packing, fewer than max_tokens / 2
                              tokens — never an epoch's only batch */
};

/* Where a loader is: enough to continue exactly (checkpoints store it). It always
 * names the start of the next batch: after an epoch's last batch, (epoch + 1, 0). */
struct dataset_cursor {
    int64_t epoch;         /* 0-based */
    int64_t index;         /* position in the epoch's permutation (in units) */
};

struct dataset_loader;

/* For SFT, preference and prompts data (a preference batch holds whole pairs: chosen and
 * rejected of a pair are adjacent sequences; a prompts batch has no target: its rows are
 * the prompts to generate from). SMELT_EINVAL for a bad config or an
 * example longer than max_tokens. */
int dataset_loader_create(const struct dataset *ds, const struct dataset_loader_config *config,
                          struct dataset_loader **out, struct smelt_error *err);
void dataset_loader_free(struct dataset_loader *loader);

/* The next batch; at the end of an epoch the next epoch starts (its own permutation).
 * *batch points into the loader. */
int dataset_loader_next(struct dataset_loader *loader, const struct dataset_batch **batch,
                        struct smelt_error *err);
/* Batches in epoch e (depends on e's permutation when packing); -1 when out of memory. */
int64_t dataset_loader_batches_in_epoch(const struct dataset_loader *loader, int64_t epoch);
struct dataset_cursor dataset_loader_cursor(const struct dataset_loader *loader);
/* After seeking to a cursor dataset_loader_cursor gave, the batches are exactly those
 * the loader gave from there. SMELT_EINVAL for a cursor outside the dataset. */
int dataset_loader_seek(struct dataset_loader *loader, const struct dataset_cursor *cursor,
                        struct smelt_error *err);

#endif
