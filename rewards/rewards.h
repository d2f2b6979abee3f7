/* rewards/: the reward stage of the RL loop. A spec (JSON) names weighted verifiers, or
 * one OpenAI-style grader; the stage built from it scores a batch of samples (prompt,
 * completion, the row's answer and metadata, token count, finish reason) and returns one
 * reward per sample:
 *     reward = Σ_k weight_k · score_k      (verifiers)
 *     reward = the grader's score          (grader)
 * docs/rewards.md is the user's reference (every verifier and grader, their fields and
 * defaults, the extraction rules, templates, the metrics' references, examples); keep
 * the two in step.
 *
 * Spec: {"verifiers": [{"type": T, "name"?, "weight"?, ...T's fields}, ...]}, 1 to
 * REWARD_MAX_VERIFIERS entries. T is one of exact_match, numeric_match, regex_match,
 * format, length_penalty. Every error names the field's path in its message
 * ("<where>.verifiers[1].pattern: ...") and in err->field ("verifiers[1].pattern",
 * relative to the spec: the caller nests it with error_in_field).
 *
 * Or: {"grader": G}, G one of OpenAI's grader objects: string_check, text_similarity,
 * python ({"source": "def grade(sample, item) -> float: ..."}, run in a bubblewrap
 * sandbox: a machine without bwrap refuses it here, naming grader.type; the source is
 * run once in a sandbox here and must define grade, or it is refused naming
 * grader.source and the line), smelt's reward_model ({"model": M}: a sequence
 * classifier's score of prompt + completion, through the stage's reward-model scorer,
 * below), smelt's endpoint ({"url": "https://...", "timeout_s", "max_retries",
 * "headers"}: the batch POSTed to the user's service, which answers one reward per
 * sample; no request is made here), score_model / label_model ({"model": M, "input":
 * [messages]}: a model's reply to the rendered messages, read as a number in "range" or
 * one of "labels", through the stage's scorer's generate, below), or multi ({"graders": {name: G', ...},
 * "calculate_output": formula}). A spec holds "verifiers" or "grader", not both. Errors
 * name the path OpenAI style: err->field "grader.graders.acc.operation". Graders read
 * {{item.<field>}} (the row's answer and metadata), {{sample.output_text}} and
 * {{sample.output_json.<field>}}.
 *
 * Failures. reward_stage_score fails (returns an error) only when the stage itself
 * cannot work: bad arguments, or memory for a grader. A sample that cannot be scored —
 * the row has no answer for a verifier that needs one, an answer that is not a number
 * for a numeric one, a regex that hits its match limit, a grader's template naming a
 * field the row (or the completion's JSON) lacks, a non-JSON completion read as
 * sample.output_json, a formula dividing by zero — is a per-sample failure:
 * out[i].failed, a message naming the verifier or grader, reward NaN; the other samples
 * are scored as usual. Every sample an endpoint grader's service does not score
 * (unreachable, too slow, an HTTP error, a bad reply, a null reward) fails the same way.
 * A completion that simply lacks what a verifier looks for (no number, no marker)
 * scores 0. A python grader that cannot grade a sample (grade() raised, returned
 * something other than a finite number, timed out, ran out of memory, its sandbox died
 * or printed too much) scores it 0, not a failure, with the reason in out[i].warning:
 * the loop reports it as an event.
 *
 * Threads: a stage keeps per-pattern match buffers, so one stage scores one batch at a
 * time; scoring is deterministic (python graders: as deterministic as their code).
 * Verifiers allocate nothing when scoring; graders allocate per sample (rendered
 * templates, parsed JSON, tokens) and free it before the next; python graders start
 * their sandboxes per batch and stop them before reward_stage_score returns; endpoint
 * graders make their requests (in the calling thread) before it returns.
 *
 * Ownership: reward_stage_create returns a stage the caller frees with
 * reward_stage_free; it copies what it needs from the spec (the JSON may be freed).
 * Samples are borrowed for the call. Names returned by reward_stage_name live as long
 * as the stage. */
#ifndef SMELT_REWARDS_H
#define SMELT_REWARDS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

#define REWARD_MAX_VERIFIERS 16
#define REWARD_MAX_PATTERN_BYTES 1024 /* a regex's source */
#define REWARD_MAX_MARKER_BYTES 256   /* after_marker's marker */
#define REWARD_NAME_BYTES 33          /* a verifier's name (metrics), 32 bytes + NUL */
#define REWARD_ERROR_BYTES 256

/* One generated completion and what the loop knows about it (all borrowed). */
struct reward_sample {
    const char *prompt;          /* a raw row's prompt text, as given; NULL for a message-list
                                    row (or when not known: a reward_model grader fails a raw
                                    row's sample without it) */
    const char *prompt_messages; /* a message-list row's prompt, as a JSON array of {"role",
                                    "content"} (datasets' dataset_prompt.messages_json); NULL
                                    for a raw row. A reward_model grader renders it with the
                                    reward model's template */
    const char *prompt_rendered; /* the prompt as the policy saw it (its chat template applied,
                                    decoded with special tokens); may be NULL. An endpoint
                                    grader sends it to the service */
    const char *completion;      /* required, NUL-terminated; may hold invalid UTF-8 */
    const char *answer;          /* the prompts row's "answer"; NULL when the row has none */
    const char *metadata_json;   /* the row's "metadata" as JSON text; NULL when none (graders'
                                    {{item.<field>}}) */
    int64_t n_completion_tokens; /* generated tokens (length_penalty) */
    const char *finish_reason;   /* "stop", "length", "abort" (rollout/'s ROLLOUT_FINISH_*); may be NULL */
};

struct reward_result {
    double reward;                              /* Σ weight·score, or the grader's score; NaN
                                                   when failed */
    bool failed;                                /* the sample gets no reward: the loop reports
                                                   error as an event, not a job failure */
    char error[REWARD_ERROR_BYTES];             /* why, naming the verifier ("" when not failed) */
    char warning[REWARD_ERROR_BYTES];           /* a python grader could not grade the sample and
                                                   scored it 0: why, naming the grader ("grader
                                                   (python): grade() took more than 10 s"); the
                                                   sample is scored (not failed) and the loop
                                                   reports this as an event. "" otherwise */
    double scores[REWARD_MAX_VERIFIERS];        /* each verifier's raw score, in spec order, for
                                                   metrics (a grader: its score, then a multi's
                                                   sub-graders' in the order of its graders);
                                                   NaN for one that failed on this sample, 0
                                                   past reward_stage_count */
};

struct reward_stage;

/* Parses and validates spec, compiles its patterns. where prefixes messages ("spec.json:
 * reward", "reward"). SMELT_EINVAL naming the field for any bad spec; SMELT_ENOMEM. */
int reward_stage_create(const json_t *spec, const char *where, struct reward_stage **out,
                        struct smelt_error *err);
void reward_stage_free(struct reward_stage *stage); /* NULL is fine */

/* Scores samples[0..n) into out[0..n) (every field of every out[i] is written). An
 * endpoint grader's requests are made here: the call takes as long as the service, at
 * most (max_retries + 1) · timeout_s plus backoffs per request of 256 samples. Returns
 * SMELT_EINVAL only for bad arguments (n < 0, NULL arrays, a NULL completion), before
 * anything is scored, SMELT_ENOMEM when a grader runs out of memory, and SMELT_EBACKEND
 * when a python grader's sandboxes cannot be started at all (fork, pipes, no free
 * sandbox uid); a reward-model scorer's own failure (its code: memory, the backend);
 * per-sample problems go in out[i]. */
int reward_stage_score(struct reward_stage *stage, const struct reward_sample *samples, int n,
                       struct reward_result *out, struct smelt_error *err);

/* Checks one prompts row against the stage before training: every verifier that needs
 * the answer finds one, numeric ones a number; every {{item.<field>}} of a grader names
 * something the row has (a python grader checks nothing: grade() reads what it likes).
 * SMELT_EINVAL with err->field "answer" (or "metadata" for a grader's field of the
 * metadata) and a message naming the verifier or the grader's field and reference; the
 * caller adds the file and line. */
int reward_stage_check_prompt(const struct reward_stage *stage, const char *answer,
                              const char *metadata_json, struct smelt_error *err);

/* The scores, in spec order: how many, and each one's name (metrics label). Verifiers:
 * the "name" field, else the type, else "<type>_<index>" when several share a type. A
 * grader: its type ("string_check", "text_similarity", "python", "reward_model", "multi"), then a multi's
 * sub-graders by their keys in "graders". */
int reward_stage_count(const struct reward_stage *stage);
const char *reward_stage_name(const struct reward_stage *stage, int i);

/* The spec with every default filled in (for the job's recorded spec); *out is a new
 * reference. reward_stage_create on it builds the same stage. */
int reward_stage_to_json(const struct reward_stage *stage, json_t **out, struct smelt_error *err);

/* ---- reward models: the reward_model grader ----
 *
 * rewards/ loads no model. A reward_model grader scores through a scorer its owner sets
 * on the stage (trainer/ sets one that runs the classifier in the trainer's process:
 * trainer/reward_scorer.c); a stage with no scorer fails every sample such a grader
 * scores, saying so. */

/* A reward_model grader's model, as the scorer's open gets it (all borrowed for the call). */
struct reward_model_ref {
    const char *model;      /* "model" as the spec gives it: a model name, or a directory */
    const char *dir;        /* the directory to load: "model_dir" (smeltd's resolution of the
                               name) when the spec has it, else model */
    const char *field;      /* the grader's path for messages: "grader", "grader.graders.rm" */
    int batch_size;         /* samples per forward pass */
    int64_t max_length;     /* tokens of prompt + completion kept (the first ones); 0: the
                               model's context */
};

/* One sample's score: score, or failed with why (the sample fails, naming the grader). */
struct reward_model_result {
    double score;
    bool failed;
    char error[REWARD_ERROR_BYTES];
};

/* ---- model graders: score_model and label_model ----
 *
 * A score_model or label_model grader renders its templated messages per sample and has
 * a model generate a reply, from which it reads the score. The generation is the
 * scorer's too (generate, below): rewards/ renders, the owner's scorer tokenizes with
 * the grader model's own tokenizer and chat template and generates. */

/* One rendered message of a grader's prompt (borrowed for the call). role: "system",
 * "user" or "assistant" (OpenAI's "developer" arrives as "system"). */
struct reward_message {
    const char *role;
    const char *content;
};

#define REWARD_MAX_PROMPT_MESSAGES 16 /* a model grader's input */

/* One sample's prompt for the grader model; n == 0 when the sample could not be rendered
 * (the scorer skips it: out[i].failed is not read for it). */
struct reward_prompt {
    const struct reward_message *messages;
    int n;
};

/* The grader's sampling_params as the scorer takes them. */
struct reward_generate_params {
    double temperature;     /* 0: greedy */
    double top_p;           /* (0, 1] */
    int64_t max_tokens;     /* generated tokens at most, >= 1 */
    uint64_t seed;          /* prompt i draws from stream (seed, i): a batch is reproducible */
};

/* One reply: text (malloc'd, NUL-terminated; rewards/ frees it), or failed with why. */
struct reward_generation {
    char *text;
    bool failed;
    char error[REWARD_ERROR_BYTES];
};

struct reward_model_scorer {
    void *ctx;
    /* Loads and checks the model of ref; *handle is what score and close get. Errors name
     * "<ref->field>.model" in err->field (relative to the spec): SMELT_EINVAL for a model
     * that is not a sequence classifier, SMELT_ENOTFOUND for no such directory. */
    int (*open)(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err);
    /* samples[0..n) → out[0..n) (every field written). A negative code only when the
     * scorer itself fails (memory, the backend); a sample it cannot score is out[i].failed. */
    int (*score)(void *handle, const struct reward_sample *samples, int n, struct reward_model_result *out,
                 struct smelt_error *err);
    void (*close)(void *handle); /* NULL handle is fine */
    /* score_model and label_model graders (NULL when the owner runs none: such a grader
     * is then refused by reward_stage_set_model_scorer, naming its model). Loads a causal
     * LM with its tokenizer and chat template; errors as open's (SMELT_EINVAL for a model
     * that cannot generate). */
    int (*open_generator)(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err);
    /* prompts[0..n) → out[0..n) (every field written; a prompt with n == 0 gets neither
     * text nor a failure). A negative code only when the scorer itself fails. */
    int (*generate)(void *handle, const struct reward_prompt *prompts, int n, const struct reward_generate_params *p,
                    struct reward_generation *out, struct smelt_error *err);
    void (*close_generator)(void *handle); /* NULL handle is fine */
};

/* Opens every reward_model grader of the stage with scorer's open, every score_model and
 * label_model grader with its open_generator (scorer copied; its ctx must outlive the
 * stage): the first open's error, its field under the stage's spec ("grader.model"). A
 * scorer needs open and score, or open_generator and generate, or all four; a grader
 * whose entries it lacks is SMELT_EINVAL naming "<grader>.model". A stage without model
 * graders takes it and never calls it. Set it once. */
int reward_stage_set_model_scorer(struct reward_stage *stage, const struct reward_model_scorer *scorer,
                                  struct smelt_error *err);

#endif
