/* Private to rewards/: OpenAI-style graders (string_check, text_similarity, python, multi;
 * smelt's endpoint, whose own declarations are in endpoint_internal.h, and smelt's
 * reward_model), the templates they read ({{item.x}}, {{sample.output_text}},
 * {{sample.output_json.x}}), multi's calculate_output formula and the text-similarity
 * metrics. docs/rewards.md
 * ("Graders") is the user's reference.
 *
 * Unlike the verifiers, graders allocate while scoring (rendered templates, the
 * completion parsed as JSON, token lists): one sample at a time, freed before the next.
 * Scoring functions return 0 (scored), GRADER_FAILED (the sample fails; the reason is in
 * why) or SMELT_ENOMEM. */
#ifndef SMELT_REWARDS_GRADERS_INTERNAL_H
#define SMELT_REWARDS_GRADERS_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rewards/rewards.h"

#define GRADER_FAILED 1
#define GRADER_ZERO 2   /* the completion lacks what a template reads (sample.output_json): scores 0 */
#define GRADER_MAX_SUB (REWARD_MAX_VERIFIERS - 1) /* multi's graders; the multi takes the first score */
#define GRADER_MAX_TEMPLATE_BYTES 4096
#define GRADER_MAX_REFS 16           /* {{...}} in one template */
#define GRADER_MAX_PATH 8            /* segments after the namespace: item.a.b[0] is 3 */
#define GRADER_MAX_FORMULA_BYTES 1024
#define GRADER_MAX_FORMULA_NODES 256
#define GRADER_MAX_NAME_BYTES 256    /* OpenAI's free-text "name" */
#define GRADER_PATH_BYTES 96         /* "grader.graders.<key>" */
#define GRADER_MAX_SOURCE_BYTES (256 * 1024) /* a python grader's source: OpenAI's limit */
#define GRADER_MAX_IMAGE_TAG_BYTES 128

/* ---- a growable byte buffer (NUL-terminated when not empty) ---- */

struct reward_buf {
    char *p;
    size_t n, cap;
};
int reward_buf_append(struct reward_buf *b, const char *s, size_t n); /* SMELT_ENOMEM */
void reward_buf_free(struct reward_buf *b);

/* ---- template.c ---- */

enum grader_source { GRADER_ITEM, GRADER_OUTPUT_TEXT, GRADER_OUTPUT_JSON };

struct grader_segment {
    bool is_index;      /* [k] */
    size_t index;
    size_t key, key_len; /* .name: its span in the template's source */
};

/* One {{namespace.path}} of a template. */
struct grader_ref {
    enum grader_source source;
    size_t start, end; /* the span of "{{...}}" in the source */
    int n_seg;
    struct grader_segment seg[GRADER_MAX_PATH];
};

struct grader_template {
    char *src; /* owned copy of the template */
    size_t len;
    int n_refs;
    struct grader_ref refs[GRADER_MAX_REFS];
};

/* What one sample offers the templates: the row (answer, metadata) and the completion,
 * parsed when a template first asks. grader_context_reset frees what was parsed. */
struct grader_context {
    const char *answer, *metadata_json, *completion;
    bool metadata_read, output_read;
    json_t *metadata, *output;       /* NULL when absent or not JSON */
    char output_error[96];           /* why the completion is not JSON */
};
void grader_context_init(struct grader_context *c, const char *answer, const char *metadata_json,
                         const char *completion);
void grader_context_reset(struct grader_context *c);

/* Reads obj[key] (a required string of at most GRADER_MAX_TEMPLATE_BYTES) and parses its
 * references. w is "<where>.<path>" for messages; err->field is key. */
int grader_template_parse(const json_t *obj, const char *key, const char *w, struct grader_template *t,
                          struct smelt_error *err);
void grader_template_free(struct grader_template *t);
/* The template with every reference substituted, into out (reset first). GRADER_FAILED
 * with why when a reference is missing, null, or output_json's completion is not JSON. */
int grader_template_render(const struct grader_template *t, struct grader_context *c, struct reward_buf *out,
                           char *why, size_t why_n);
/* Every {{item...}} of t resolves against c's row: 0, or GRADER_FAILED with why and
 * *field ("answer" or "metadata"). */
int grader_template_check_row(const struct grader_template *t, struct grader_context *c, const char **field,
                              char *why, size_t why_n);

/* ---- formula.c: multi's calculate_output ---- */

struct grader_formula_node {
    uint8_t kind, fn;
    int16_t a, b;          /* operands (node indices); CALL: first argument in args, b arguments */
    int var;               /* VAR: which sub-grader */
    double value;          /* NUM */
    uint16_t offset;       /* where in the source, for messages */
};

struct grader_formula {
    char *src;
    int n_nodes, n_args, root;
    struct grader_formula_node node[GRADER_MAX_FORMULA_NODES];
    int16_t args[GRADER_MAX_FORMULA_NODES];
};

/* Parses src against the names[0..n_names) it may read. w names the field in messages
 * ("<where>.grader.calculate_output"); errors give the offset. */
int grader_formula_parse(const char *src, const char *const *names, int n_names, const char *w,
                         struct grader_formula *f, struct smelt_error *err);
void grader_formula_free(struct grader_formula *f);
/* 0 with *out, or GRADER_FAILED with why (division by zero, a result that is not finite). */
int grader_formula_eval(const struct grader_formula *f, const double *vars, double *out, char *why, size_t why_n);
/* true when name is one of the formula's functions (a sub-grader may not take it). */
bool grader_formula_is_function(const char *name);

/* ---- similarity.c: text_similarity's metrics ---- */

enum grader_metric {
    GRADER_FUZZY_MATCH,
    GRADER_BLEU,
    GRADER_GLEU,
    GRADER_ROUGE_1,
    GRADER_ROUGE_2,
    GRADER_ROUGE_3,
    GRADER_ROUGE_4,
    GRADER_ROUGE_5,
    GRADER_ROUGE_L,
};

/* The metric of input against reference (both may hold any bytes), in [0, 1]: 0 with
 * *score, or SMELT_ENOMEM. */
int grader_similarity(enum grader_metric m, const char *input, size_t n_input, const char *reference,
                      size_t n_reference, double *score);

/* ---- graders.c ---- */

enum grader_type {
    GRADER_STRING_CHECK, GRADER_TEXT_SIMILARITY, GRADER_MULTI, GRADER_PYTHON, GRADER_ENDPOINT, GRADER_REWARD_MODEL,
    GRADER_SCORE_MODEL, GRADER_LABEL_MODEL
};

struct grader_python;
struct grader_endpoint;
struct grader_rm;
struct grader_lm;
enum grader_operation { GRADER_EQ, GRADER_NE, GRADER_LIKE, GRADER_ILIKE };

struct reward_grader {
    enum grader_type type;
    char path[GRADER_PATH_BYTES];      /* "grader", "grader.graders.<key>": messages */
    char metric[REWARD_NAME_BYTES];    /* metrics label: the type at the top, else the key */
    char *name;                        /* OpenAI's "name"; NULL when not given */
    /* string_check, text_similarity */
    struct grader_template input, reference;
    enum grader_operation operation;
    enum grader_metric evaluation_metric;
    bool has_pass_threshold;
    double pass_threshold;
    /* multi */
    int n_sub;
    struct reward_grader *sub;         /* [n_sub], in the order of the graders object */
    struct grader_formula formula;
    /* python (python_grader.c) */
    struct grader_python *py;
    /* endpoint (endpoint_grader.c) */
    struct grader_endpoint *ep;
    /* reward_model (reward_model_grader.c) */
    struct grader_rm *rm;
    /* score_model, label_model (model_grader_spec.c, model_grader.c) */
    struct grader_lm *lm;
};

/* spec["grader"] → *out (a new grader the caller frees with reward_grader_free). A
 * python grader's source is run once in a sandbox here (sandbox_check). */
int reward_grader_create(const json_t *obj, const char *where, struct reward_grader **out, struct smelt_error *err);
void reward_grader_free(struct reward_grader *g);
json_t *reward_grader_to_json(const struct reward_grader *g); /* NULL: out of memory */
/* Runs the python and endpoint graders of the tree (the grader, or a multi's
 * sub-graders) on the whole batch samples[0..n) (python in their sandboxes, endpoint
 * through the service), keeping each sample's result for reward_grader_score; nothing
 * for other graders. A negative code only when sandboxes cannot be started or memory
 * runs out. */
int reward_grader_prepare(struct reward_grader *g, const struct reward_sample *samples, int n,
                          struct smelt_error *err);
/* Scores sample i of the batch last prepared: scores[0] the grader's, scores[1 + k]
 * sub-grader k's (NaN where it failed). 0, GRADER_FAILED with why, or SMELT_ENOMEM. A
 * python grader that could not grade the sample (raised, timed out, ...) scores 0, with
 * the reason in warning ("" otherwise; the first one's when several). */
int reward_grader_score(struct reward_grader *g, const struct reward_sample *s, int i, double *scores, char *why,
                        size_t why_n, char *warning, size_t warning_n);
int reward_grader_check_row(const struct reward_grader *g, const char *answer, const char *metadata_json,
                            struct smelt_error *err);
int reward_grader_count(const struct reward_grader *g);
const char *reward_grader_name(const struct reward_grader *g, int i);

/* ---- python_grader.c: {"type": "python", "source": "def grade(sample, item): ..."} ---- */

/* The python grader's own fields of obj (type and name are read): source (checked in a
 * sandbox), image_tag, pass_threshold, and smelt's limits timeout_s, memory_mb,
 * sandboxes. w names it in messages. */
int grader_python_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err);
void grader_python_free(struct grader_python *py); /* NULL is fine */
/* Adds the fields to obj, defaults filled (sandboxes only when given: its default is the
 * machine's); nonzero when out of memory. */
int grader_python_to_json(const struct grader_python *py, json_t *obj);
/* The row as graders' code sees it (python's item, endpoint's "item"): the row's metadata
 * object (an OpenAI row's other fields) with the row's answer as "answer" (the row's wins
 * over a metadata field of that name); metadata that is not an object (or not JSON)
 * stays whole under "metadata". A new reference, or NULL when out of memory. */
json_t *grader_item_of(const struct reward_sample *s);
/* The batch's requests ({"sample": ..., "item": ...} per sample, compact JSON) into
 * *out (n malloc'd strings in a malloc'd array; free with grader_python_requests_free). */
int grader_python_requests(const struct reward_sample *samples, int n, char ***out, struct smelt_error *err);
void grader_python_requests_free(char **requests, int n);
/* Grades the batch in the grader's sandboxes; results kept in py until the next run. */
int grader_python_run(struct grader_python *py, const char *const *requests, int n, struct smelt_error *err);
/* Sample i of the last run: true with *score, or false with why (then it scores 0). */
bool grader_python_result(const struct grader_python *py, int i, double *score, char *why, size_t why_n);

/* ---- reward_model_grader.c: {"type": "reward_model", "model": M} ---- */

extern const char *const GRADER_RM_KEYS[]; /* every key allowed, NULL-terminated */

/* The grader's own fields of obj (type and name are read): model, model_dir, batch_size,
 * max_length, normalize. w names it in messages. */
int grader_rm_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err);
void grader_rm_free(struct grader_rm *rm); /* closes its model; NULL is fine */
/* Adds the fields to obj, defaults filled; nonzero when out of memory. */
int grader_rm_to_json(const struct grader_rm *rm, json_t *obj);
/* Scores the batch with every reward_model grader of the tree (g, or a multi's
 * sub-graders), results kept until the next batch; nothing for other graders. A
 * negative code only when a scorer fails or memory runs out. */
int grader_rm_prepare(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err);
/* Sample i of the last batch: 0 with *score, or GRADER_FAILED with why. */
int grader_rm_result(const struct grader_rm *rm, int i, double *score, char *why, size_t why_n);

/* ---- model_grader_spec.c, model_grader.c: score_model and label_model ---- */

#define GRADER_LM_MAX_MESSAGES REWARD_MAX_PROMPT_MESSAGES
#define GRADER_LM_MAX_LABELS 64
#define GRADER_LM_DEFAULT_TOKENS 64   /* sampling_params.max_completions_tokens */
#define GRADER_LM_MAX_TOKENS 4096

/* obj[key] as a copy in *out (malloc'd): a string of 1 to max bytes without NUL; *out
 * stays NULL when the key is absent and not required. Errors name "<w>.<key>". */
int grader_parse_text(const json_t *obj, const char *key, bool required, size_t max, const char *w, char **out,
                      struct smelt_error *err);
extern const char *const GRADER_SCORE_MODEL_KEYS[]; /* every key allowed, NULL-terminated */
extern const char *const GRADER_LABEL_MODEL_KEYS[];

struct grader_lm_message {
    const char *role;                  /* static: "system" (also for "developer"), "user", "assistant" */
    struct grader_template content;
};

/* One sample's outcome of the last batch. */
struct grader_lm_result {
    int status;                        /* 0 (scored), GRADER_FAILED */
    double score;
    char why[REWARD_ERROR_BYTES];
};

struct grader_lm {
    bool label;                        /* label_model (else score_model) */
    char *model, *model_dir;           /* as given; model_dir: smeltd's resolution, NULL when not given */
    int n_msgs;
    struct grader_lm_message msgs[GRADER_LM_MAX_MESSAGES];
    json_t *input;                     /* the spec's input, written back as given */
    double range[2];                   /* score_model */
    struct reward_generate_params params; /* sampling_params, defaults filled (both types) */
    char **labels, **passing;          /* label_model */
    int n_labels, n_passing;
    struct reward_model_scorer scorer;
    void *handle;                      /* the scorer's generator; NULL until opened */
    int n;                             /* the last batch */
    struct grader_lm_result *results;
};

/* The grader's own fields of obj (type and name are read). w names it in messages. */
int grader_lm_parse(const json_t *obj, const char *w, struct reward_grader *g, struct smelt_error *err);
void grader_lm_free(struct grader_lm *lm); /* closes its model; NULL is fine */
int grader_lm_to_json(const struct reward_grader *g, json_t *obj); /* nonzero when out of memory */
/* Opens g's model with scorer's open_generator (SMELT_EINVAL naming <path>.model when
 * the scorer has none). */
int grader_lm_open(struct reward_grader *g, const struct reward_model_scorer *scorer, struct smelt_error *err);
/* Every score_model / label_model grader of the tree on the batch: messages rendered per
 * sample, replies generated, read into scores. A negative code only when the scorer
 * fails or memory runs out. */
int grader_lm_prepare(struct reward_grader *g, const struct reward_sample *samples, int n, struct smelt_error *err);
/* Sample i of the last batch: 0 with *score, or GRADER_FAILED with why. */
int grader_lm_result(const struct grader_lm *lm, int i, double *score, char *why, size_t why_n);
/* Every {{item.x}} of the messages found in the row: as grader_template_check_row. */
int grader_lm_check_row(const struct reward_grader *g, struct grader_context *c, struct smelt_error *err);

#endif
