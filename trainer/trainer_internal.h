/* Private to trainer/: one run's state, shared by the setup, the loop, evaluation,
 * checkpoints and metrics. */
#ifndef SMELT_TRAINER_INTERNAL_H
#define SMELT_TRAINER_INTERNAL_H

#include <jansson.h>
#include <stdio.h>

#include "model/model.h"
#include "rewards/rewards.h"
#include "trainer/trainer.h"

struct run_algo;
struct comm;
struct comm_store;
struct dpo_state;
struct reward_state;
struct rl_state;
struct zero3;

/* dist.c: this process's place among the job's data-parallel ranks (docs/distributed.md).
 * With one rank there is no communicator and every call below is the one-process
 * behaviour. */
struct dist {
    int rank, ranks, stage;        /* stage: hyperparameters.zero_stage */
    struct comm_store *store;      /* the rendezvous (owned); NULL with one rank */
    struct comm *comm;             /* owned; NULL with one rank */
    int64_t shard_off, shard_len;  /* stage >= 1: this rank's shard of the trainable buffer (comm_shard) */
    struct tensor grad_shard;      /* stage 2: the shard's reduced gradients [shard_len] (owned) */
};

struct trainer_run {
    const struct job_spec *spec;
    struct dist dist;
    const struct run_algo *algo;         /* SFT, DPO or reward model: what a step and an evaluation do */
    char base_path[JOB_PATH_BYTES];      /* the full model's directory ("" for random init) */
    char tokenizer_dir[JOB_PATH_BYTES];  /* where the tokenizer files came from */
    struct tokenizer *tok;
    struct chat_template chat;
    bool has_chat;
    struct model *model;
    struct lora *lora;                   /* NULL for a full fine-tune */
    struct tensor *params, *grads;       /* what trains: the model's or the adapter's */
    struct optimizer opt;
    struct dataset *train, *val;         /* val may be NULL */
    struct dataset_loader *loader;
    struct model_acts *acts;
    struct tensor logprobs, dlogprobs;   /* f32 [max_tokens] on the model's backend */
    float *host_logprobs;                /* [max_tokens] */
    int64_t max_tokens;
    struct lr_schedule schedule;
    int64_t total_steps;
    int64_t total_micro;                 /* micro-batches in the whole run (epoch-bound) */
    int64_t step;                        /* optimizer steps done */
    int64_t micro_done;
    int64_t tokens_done;
    double elapsed_s;                    /* training time, carried across resumes */
    double flops_per_token;              /* training FLOPs per token at the mean length */
    uint64_t base_hash;                  /* LoRA: hash of the frozen base weights */
    FILE *metrics;
    bool quiet;
    bool batch_invariant;                /* rl.true_on_policy turned the kernels' mode on (off at teardown) */
    struct dpo_state *dpo;               /* DPO: reference logprobs and per-batch scratch */
    struct reward_state *reward;         /* reward model: hidden states and scores */
    struct rl_state *rl;                 /* GRPO / PPO: samples, per-token arrays, the reward stage, the critic */
    struct zero3 *zero3;                 /* ZeRO stage 3 on several ranks (zero3_run.c), else NULL */
    bool pad_pass;                       /* stage 3: a pass that only keeps the ranks' collectives in step */
    const struct curve_job_keys *job_keys; /* trainer_options' (borrowed): the rollout workers' channel */
};

/* What one optimizer step reports. metrics: a jansson object of the algorithm's own
 * numbers (NULL: none), added to the step's train line, or freed when none is logged. */
struct step_stats {
    double loss, grad_norm, lr;
    int64_t tokens, trained;
    void *metrics;
};

/* A training algorithm, as run.c drives it. */
struct run_algo {
    /* After the setup, before a checkpoint is restored (so it sees the starting
     * weights); NULL: nothing to do. */
    int (*prepare)(struct trainer_run *r, struct smelt_error *err);
    int (*step)(struct trainer_run *r, int64_t n_micro, struct step_stats *st, struct smelt_error *err);
    /* The validation metrics as a jansson object ("val_loss" first; NULL without
     * validation data) and the validation loss (NAN without). */
    int (*validate)(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err);
    /* What a checkpoint holds beside the trained weights and their moments (PPO: the
     * critic's weights and moments): written into the checkpoint's directory before it
     * is renamed into place, read back after the weights. NULL: nothing. */
    int (*save_state)(struct trainer_run *r, const char *ckpt_dir, struct smelt_error *err);
    int (*restore_state)(struct trainer_run *r, const char *ckpt_dir, struct smelt_error *err);
    /* Outputs beside the trained model in output_dir/output/ (PPO: critic/); NULL: none. */
    int (*save_outputs)(struct trainer_run *r, const char *out_dir, struct smelt_error *err);
};

extern const struct run_algo SFT_ALGO, DPO_ALGO, REWARD_ALGO, GRPO_ALGO, PPO_ALGO;

/* run.c */
/* The LoRA dropout seed of micro-batch `micro` of the coming step: a pure function of
 * (seed, step, micro), which is what makes a resumed run exact. */
uint64_t run_dropout_seed(const struct trainer_run *r, int64_t micro);
/* AdamW on the accumulated gradients times grad_scale, at the schedule's rate; fills
 * st->lr and st->grad_norm, counts the step and st->tokens. */
int run_optimizer_step(struct trainer_run *r, double grad_scale, struct step_stats *st,
                       struct smelt_error *err);

/* job_spec.c */
void job_pref_config(const struct job_spec *s, struct pref_config *out);
/* The fields of a table from obj (a JSON object, where "<where>: <section>"), refusing
 * a key that is neither a field nor one of extra_keys (NULL-terminated; may be NULL). */
int job_parse_fields(const json_t *obj, const struct job_hp_field *fields, int n, const char *const *extra_keys,
                     const char *w, struct job_spec *s, struct smelt_error *err);
const struct job_hp_field *job_field_in(const struct job_hp_field *fields, int n, const char *name);
json_t *job_field_json(const struct job_hp_field *f, const struct job_spec *s);

/* job_spec_rl.c: the "rl" section (where: the spec's name for messages). */
int job_parse_rl(const json_t *obj, const char *where, struct job_spec *s, struct smelt_error *err);
int job_rl_to_json(const struct job_spec *s, json_t **out, struct smelt_error *err);
/* The policy loss the spec asks for. */
void job_rl_loss_config(const struct job_spec *s, struct rl_policy_config *out);

/* dpo.c */
/* Sums over the pairs of one or more micro-batches: what the DPO metrics average. */
struct pref_totals {
    int64_t pairs;
    double loss, reward_chosen, reward_rejected, correct, margin, logp_chosen, logp_rejected;
};
/* One micro-batch of pairs from the training split (train: the reference logprobs of
 * the training pairs, and the backward: gradients accumulate unscaled, the step divides
 * by its pairs) or the validation split (forward only). */
int dpo_micro_batch(struct trainer_run *r, const struct dataset_batch *b, bool train, struct pref_totals *tot,
                    struct smelt_error *err);
void dpo_state_free(struct dpo_state *d);

/* preference_step.c: the step and validation of the pair objectives (DPO, reward
 * model), around their micro-batch function (dpo_micro_batch's contract). */
typedef int (*pref_micro_fn)(struct trainer_run *r, const struct dataset_batch *b, bool train,
                             struct pref_totals *tot, struct smelt_error *err);
enum pref_metrics {
    PREF_METRICS_DPO,    /* rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected} */
    PREF_METRICS_REWARD, /* the rewards/ ones: the reward model has no logps */
};
int pref_step(struct trainer_run *r, int64_t n_micro, pref_micro_fn fn, enum pref_metrics which,
              struct step_stats *st, struct smelt_error *err);
/* "val_loss", "val_pairs" and the train line's metrics prefixed "val_". */
int pref_validate(struct trainer_run *r, pref_micro_fn fn, enum pref_metrics which, void **metrics,
                  double *val_loss, struct smelt_error *err);

/* reward.c */
/* A reward model's starting point: a causal LM gets a fresh score head
 * (model_classifier_from_lm), a sequence classifier is kept as it is. Before the
 * trainable parameters are set up: the head changes the weights' layout. */
int reward_model_prepare_model(struct trainer_run *r, struct smelt_error *err);
/* One micro-batch of pairs, dpo_micro_batch's contract: gradients (head and body)
 * accumulate unscaled, the step divides by its pairs; rewards are the scores. */
int reward_micro_batch(struct trainer_run *r, const struct dataset_batch *b, bool train, struct pref_totals *tot,
                       struct smelt_error *err);
void reward_state_free(struct reward_state *s);

/* ---- the RL loop (grpo.c, ppo.c, critic.c, rl_rollout.c, rl_workers.c, rl_batch.c) ---- */

struct rollout_config;
struct rollout_request;
struct weightsync_report;

/* One generated completion and what the iteration learns about it. */
struct rl_sample {
    int64_t row;                /* its prompt: an index into the prompts dataset */
    int32_t *ids;               /* the generated tokens [n] (owned) */
    float *rollout_logp;        /* the engine's logprobs of them [n] (owned) */
    int64_t n;
    const char *finish_reason;  /* ROLLOUT_FINISH_* (static) */
    int64_t version;            /* the policy version that generated it */
    char *text;                 /* the decoded completion (owned) */
    double reward;              /* NaN when its reward failed */
    double scores[REWARD_MAX_VERIFIERS]; /* each verifier's score (reward_result.scores), for the samples line */
    bool failed;                /* its reward failed: not trained on */
    bool trained;               /* in the loss */
    double adv;                 /* its advantage (before REINFORCE++'s whitening) */
    int64_t off;                /* its first token in the iteration's per-token arrays */
};

/* The packed layout of one micro-batch of samples (grpo.c owns it). */
struct rl_buffers {
    int32_t *ids, *cu, *targets;  /* [max_tokens], [cap_seqs + 1], [max_tokens] */
    int64_t *rows;                /* [cap_seqs] */
    int64_t cap_seqs;
};
struct rl_buffers *rl_buffers(struct trainer_run *r);

struct critic;
struct reward_stage;
struct reward_sample;
struct reward_result;

/* Generation rounds of one iteration at most: DAPO's dynamic sampling draws more
 * prompts while groups with equal rewards leave the batch short. */
#define RL_ROUNDS 4
#define RL_MAX_ALL_FAILED 3 /* iterations in a row without one reward: the job fails */

/* reward_scorer.c: the reward_model grader's scorer (rewards.h), which runs each
 * grader's sequence classifier in this process, on `backend`, frozen; its inputs are
 * tokenized as the reward-model trainer tokenized its pairs (dataset_tokenize_response). */
struct reward_scorer_config {
    enum backend backend;                    /* where the reward models run: the policy's */
    bool add_bos;                            /* data.add_bos: a raw prompt's bos, as the reward model's job had it */
    const struct chat_template *policy_chat; /* the policy's template (NULL: none): its seam before a turn's
                                                content is cut from completions, and it renders message-list
                                                prompts for a reward model that has no template of its own */
    const char *where;                       /* the stage's place in the spec ("rl.reward"), for messages */
};
struct reward_model_scorer;
/* The scorer of config (borrowed: it must outlive the stage the scorer is set on). */
void reward_scorer_init(const struct reward_scorer_config *config, struct reward_model_scorer *out);
/* The tokenizer of the model in dir (its own, else its adapter's base's) and its chat
 * template: its tokenizer_config.json's, else the policy's family with its own tokens,
 * else the policy's template when dir has no config, else none (*has_chat false). Errors
 * start with field. The caller frees *tok. */
int reward_model_tokenizer(const char *dir, const struct reward_scorer_config *c, const char *field,
                           struct tokenizer **tok, struct chat_template *chat, bool *has_chat, struct smelt_error *err);
/* reward_generator.c: score_model / label_model graders' generator (rewards.h: the
 * scorer's open_generator, generate, close_generator; reward_scorer_init sets them). A
 * causal LM (a model directory or a causal LoRA output, merged) loaded frozen on the
 * config's backend, with its own tokenizer and chat template; each batch's prompts
 * through the paged rollout engine (created per batch, freed before returning). */
struct reward_model_ref;
struct reward_prompt;
struct reward_generate_params;
struct reward_generation;
int reward_generator_open(void *ctx, const struct reward_model_ref *ref, void **handle, struct smelt_error *err);
int reward_generator_generate(void *handle, const struct reward_prompt *prompts, int n,
                              const struct reward_generate_params *p, struct reward_generation *out,
                              struct smelt_error *err);
void reward_generator_close(void *handle);
/* The ids the grader model is given for prompt (its chat template, generation prompt
 * appended): *ids malloc'd, the caller frees it. SMELT_EINVAL when the template refuses
 * the messages (why in err). */
int reward_generator_prompt_ids(void *handle, const struct reward_prompt *prompt, int32_t **ids, size_t *n,
                                struct smelt_error *err);

/* A sequence classifier from dir: a model directory, or a reward model's LoRA output
 * (its base made a classifier with pad, the adapter and its head merged in), on backend.
 * Errors name field (err->field and the message's start) and end with hint where the
 * model is not a classifier: SMELT_ENOTFOUND no directory, SMELT_EINVAL a causal LM or
 * its adapter. */
int run_load_classifier(const char *dir, enum backend backend, int64_t pad, const char *field, const char *hint,
                        struct model **out, struct smelt_error *err);

/* One RL run's state (grpo.c owns it; ppo.c and critic.c read the iteration's arrays). */
struct rl_state {
    struct reward_stage *reward;
    struct reward_scorer_config scorer; /* the reward_model graders' (the stage borrows it) */
    struct model *ref_model;        /* a full fine-tune's reference (beta > 0), else NULL */
    struct critic *critic;          /* PPO's value model (critic.c); NULL in a grpo job */
    struct rl_policy_config loss;
    struct rl_buffers buf;
    int64_t steps_per_iteration;    /* ppo_epochs * minibatches */
    int cap;                        /* samples of one iteration (and of one refill round) */
    struct rl_sample *samples;      /* [cap * RL_ROUNDS] this iteration's samples */
    struct rl_sample *trained;      /* [cap * RL_ROUNDS] the ones in the loss, in order */
    struct reward_sample *rin;      /* [cap] */
    struct reward_result *rout;     /* [cap] */
    double *group;                  /* [num_generations] */
    /* Per generated token of the trained samples, [cap_tokens]; sample i of `trained`
     * owns [start[i], start[i + 1]). */
    float *rollout, *old, *ref, *cur, *mask;
    double *adv, *coef;
    int64_t *start;                 /* [cap * RL_ROUNDS + 1] */
    int64_t cap_tokens;
    bool recorded_start_eval;
    bool policy_frozen;             /* this iteration trains the critic alone (critic_warmup_iterations) */
    struct rl_workers *workers;     /* split placement: the smelt-rollout processes */
    json_t *errors;                 /* the iteration's failed rewards: [{line, error}], the first few */
    int all_failed_streak;          /* iterations in a row whose every reward failed */
    int64_t version;                /* the policy version this iteration starts from */
    bool old_in_update;             /* old logprobs = the update's own first forward (one step, no dropout
                                       to keep apart from the rollout's) */
    /* max_staleness 1: the next iteration's samples, generated during this update by the
     * version before it (rl_pending.c keeps them across a checkpoint). */
    struct rl_sample *ahead;        /* [cap] */
    int n_ahead;
    bool ahead_in_flight;
};
/* The split placement's workers (NULL when colocated, or before they start). */
struct rl_workers *rl_workers(struct trainer_run *r);

/* rl_rollout.c */
/* The stream seed of a prompt's samples at a policy version (63 bits). */
uint64_t rl_sample_seed(const struct trainer_run *r, int64_t version, int64_t row);
/* Adds the ids that end a sample to q's stop ids: the model's eos ids and the
 * tokenizer's (the policy's rollouts and a model grader's replies). */
void rl_stop_ids(const struct model *m, const struct tokenizer *tok, struct rollout_request *q);
/* The engine settings for n_seqs samples of ds's prompts at once: KV cache no larger than
 * they can fill (at most rl.kv_memory_mb), every sequence running at once (at most
 * 256). The colocated engine is made with them for each generation; the split
 * placement's workers take the same step limits (and the whole rl.kv_memory_mb). */
void rl_engine_config(const struct trainer_run *r, const struct dataset *ds, int64_t n_seqs,
                      struct rollout_config *out);
/* n samples of each of ds's prompts rows[0..n_prompts) into out[p * n + k] (out holds
 * n_prompts * n; its old contents are overwritten, not freed), by the placement's
 * engine: the trainer's own (colocated) or the rollout workers (split). */
int rl_generate(struct trainer_run *r, const struct dataset *ds, const int64_t *rows, int n_prompts, int n,
                const struct sample_params *sp, int64_t max_new_tokens, int64_t version, struct rl_sample *out,
                struct smelt_error *err);
/* rl_generate in two halves (the split placement only): submit names out's samples and
 * sends their requests; collect (n_samples = n_prompts * n) fills them once generated.
 * out must stay put in between. */
int rl_generate_submit(struct trainer_run *r, const struct dataset *ds, const int64_t *rows, int n_prompts, int n,
                       const struct sample_params *sp, int64_t max_new_tokens, int64_t version,
                       struct rl_sample *out, struct smelt_error *err);
int rl_generate_collect(struct trainer_run *r, const struct dataset *ds, int n_samples, int n, struct rl_sample *out,
                        struct smelt_error *err);
/* rl_pending.c: the samples generated ahead (max_staleness), saved with a checkpoint:
 * ids, rollout logprobs, prompt row, version and finish reason of s[0..n). load fills
 * out[0..*n) (at most cap; the caller frees them with rl_samples_clear), refusing a file
 * of another format or naming rows ds does not have. */
/* The RL loop's own checkpoint state (the samples generated ahead), for run_algo's hooks. */
int rl_save_state(struct trainer_run *r, const char *ckpt_dir, struct smelt_error *err);
int rl_restore_state(struct trainer_run *r, const char *ckpt_dir, struct smelt_error *err);
int rl_pending_save(const char *path, const struct rl_sample *s, int n, struct smelt_error *err);
int rl_pending_load(const char *path, const struct dataset *ds, int cap, struct rl_sample *out, int *n_out,
                    struct smelt_error *err);
void rl_samples_clear(struct rl_sample *s, int n); /* frees what each owns, zeroes them */

/* The samples line's reward distribution: the rewards of s[0..n) (null where failed), at
 * most cap of them, evenly spaced over the iteration when n > cap. A new reference (NULL
 * when out of memory). */
#define RL_SAMPLES_REWARDS_KEPT 1024
json_t *rl_rewards_json(const struct rl_sample *s, int n, int cap);

/* rl_workers.c: the split placement's smelt-rollout processes (the file's comment says
 * how they are started, fed, watched and stopped). Owned by the RL state; every
 * function but rl_workers_stop runs on the training thread only. */
struct rl_workers;
/* Starts rl.rollout_workers workers on the trainer's current weights (LoRA: its adapter
 * too), waits until each serves (a worker that ends or stays silent fails the call,
 * naming it and quoting its log) and connects to them. cap: the most samples one
 * generation asks for. *out is set at once: rl_workers_stop ends whatever started, also
 * after a failure. */
int rl_workers_start(struct trainer_run *r, int64_t cap, struct rl_workers **out, struct smelt_error *err);
/* The requests q[0..n_requests) (all with the same n) on the workers, their samples into
 * out[p * n + k] (ids, rollout logprobs, n, finish reason; row and version are the
 * caller's). Every sample must come from policy version `version`; workers holding an
 * older one get the trainer's weights as `version` first (a resumed job). A worker that
 * dies fails the call at once, naming it. */
int rl_workers_generate(struct rl_workers *ws, struct trainer_run *r, const struct rollout_request *q,
                        int n_requests, int64_t version, struct rl_sample *out, struct smelt_error *err);
/* rl_workers_generate in two halves, so the trainer can work while the workers generate
 * (max_staleness): submit sends the requests (one batch in flight at a time; no weight
 * sync until it is collected), collect waits for them and fills out as generate does. */
int rl_workers_submit(struct rl_workers *ws, struct trainer_run *r, const struct rollout_request *q, int n_requests,
                      int64_t version, struct smelt_error *err);
int rl_workers_collect(struct rl_workers *ws, struct rl_sample *out, struct smelt_error *err);
/* Pushes the trainer's weights (LoRA: the adapter's only) to every worker as policy
 * version `version` (newer than the one they hold); report (may be NULL): bytes and
 * times. */
int rl_workers_sync(struct rl_workers *ws, struct trainer_run *r, int64_t version, struct weightsync_report *report,
                    struct smelt_error *err);
/* SIGTERM to every worker, SIGKILL to those still there after a grace period, each
 * reaped; then the connection and ws are freed. NULL: nothing. */
void rl_workers_stop(struct rl_workers *ws);
/* How its syncs move the bytes: "broadcast" or "zmq" (rl.weight_sync). */
const char *rl_workers_transport(const struct rl_workers *ws);
/* The smelt-rollout program to run instead of the one next to this executable (NULL:
 * that one again): for tests, whose executable lives elsewhere. */
void rl_workers_set_program(const char *path);

/* rl_batch.c: samples through the trainer's model. */
/* Samples [first, first + n) of ds's prompts as one packed batch (its arrays are the
 * run's rl buffers: valid until the next call). */
int rl_batch_build(struct trainer_run *r, const struct dataset *ds, const struct rl_sample *s, int n,
                   struct dataset_batch *b, struct smelt_error *err);
/* The most samples from s[0..n) that fit one micro-batch (at least 1). */
int rl_batch_fit(const struct trainer_run *r, const struct dataset *ds, const struct rl_sample *s, int n);
/* The logprobs of each sample's generated tokens, from the last forward of b (built from
 * s[0..n)), into dst[s[i].off ...]. */
void rl_batch_gather(const struct trainer_run *r, const struct dataset *ds, const struct dataset_batch *b,
                     const struct rl_sample *s, int n, float *dst);
/* The same from any per-position array of b (src [b->n_tokens]: the critic's values):
 * generated token j of a sample is read at its position n_prompt - 1 + j, the position
 * that predicts it. */
void rl_batch_gather_from(const struct dataset *ds, const struct dataset_batch *b, const struct rl_sample *s, int n,
                          const float *src, float *dst);
/* dL/dlogprob of every generated token (coef[s[i].off ...]) laid out on b's positions, into
 * host_logprobs (ready for run_backward_tokens). */
void rl_batch_scatter(struct trainer_run *r, const struct dataset *ds, const struct dataset_batch *b,
                      const struct rl_sample *s, int n, const double *coef);
/* The same into any per-position array (dst [b->n_tokens], zeroed first). */
void rl_batch_scatter_to(const struct dataset *ds, const struct dataset_batch *b, const struct rl_sample *s, int n,
                         const double *coef, float *dst);
/* The longest sample a prompt of ds can make: its prompt and max_new_tokens. */
int64_t rl_longest_sample(const struct trainer_run *r, const struct dataset *ds);

/* grpo.c */
/* The iteration count, steps and micro-batch size of an RL run (setup.c's plan). */
int rl_plan(struct trainer_run *r, struct smelt_error *err);
void rl_state_free(struct rl_state *s);
/* GRPO_ALGO's three functions, which PPO_ALGO shares: the RL state, the reward stage, the
 * reference and the split placement's workers (prepare); one iteration, with the
 * critic's part when r->rl->critic is set (step); greedy held-out rewards (validate). */
int rl_prepare(struct trainer_run *r, struct smelt_error *err);
int rl_step(struct trainer_run *r, int64_t n_micro, struct step_stats *st, struct smelt_error *err);
int rl_validate(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err);

/* critic.c: PPO's critic, a second model beside the policy — a sequence classifier
 * (model/score_head.h) whose head is read at every token as a value head
 * (model_value_forward) — with its own weights, gradients, activations and AdamW state.
 * It is always trained in full, also when the policy is a LoRA adapter. The value of a
 * generated token is read at the position that predicts it (the state before it), the
 * position its logprob is read at: OpenRLHF's values[:, -num_actions-1:-1], veRL's
 * values[:, -response_length-1:-1], TRL's value[:, context_length-1:-1]. */
struct critic {
    struct model *model;            /* owned */
    struct model_acts *acts;        /* for r->max_tokens tokens */
    struct optimizer opt;
    struct lr_schedule schedule;    /* the policy's, peaking at rl.critic_learning_rate */
    struct tensor hidden, dhidden;  /* f32 [max_tokens, C] */
    struct tensor values;           /* f32 [max_tokens]: values, then dL/dvalue */
    float *host;                    /* [max_tokens] */
    /* Per generated token of the trained samples (rl_state's layout), [cap_tokens]. */
    float *old, *cur;               /* values before the iteration's update, and in it */
    double *rewards, *returns;      /* token rewards (rl_token_rewards), GAE returns */
    double *dvalue;                 /* dL/dvalue */
};
/* Sums over an iteration's critic steps (rl_value_stats merged) and their gradient norms. */
struct critic_totals {
    double loss, value_sum, grad_norm_sum;
    int64_t n_tokens, clipped, steps;
};
/* The critic of a ppo job: rl.critic_model loaded (a reward model's directory, full or
 * its LoRA output merged; it must have a score head and the policy's vocabulary), or
 * the policy's starting weights with a new head (N(0, 0.02) from the seed). Per-token
 * arrays hold cap_tokens. */
int critic_create(struct trainer_run *r, int64_t cap_tokens, struct critic **out, struct smelt_error *err);
void critic_free(struct critic *c);
/* The critic's values of every generated token of trained samples [0, n) (forward only)
 * into dst, per token (rl_state's layout). */
int critic_values(struct trainer_run *r, int n, float *dst, struct smelt_error *err);
/* One critic optimizer step on trained samples [a, b): the clipped value loss
 * (rl_value_loss: old values c->old, returns c->returns, token-mean over the
 * minibatch), its backward through the head and the body, AdamW at the critic's rate
 * for policy step r->step + 1. Adds to tot. */
int critic_step(struct trainer_run *r, int a, int b, struct critic_totals *tot, struct smelt_error *err);
/* dir/critic/ (an HF sequence-classifier directory, f32) and dir/critic_optimizer.safetensors. */
int critic_save_state(const struct critic *c, const char *dir, struct smelt_error *err);
int critic_restore_state(struct critic *c, const char *dir, struct smelt_error *err);

/* ppo.c: what a ppo iteration adds to grpo.c's. */
struct ppo_iteration {
    double value_sum, returns_sum, adv_sum;  /* over the trained tokens, before the update */
    double kl_sum;                           /* the KL in the token rewards (rl.kl_in_reward, beta > 0) */
    bool kl_in_reward;
    int64_t tokens;
    struct critic_totals ct;
    double t_critic;                         /* the critic's passes and steps, seconds */
};
/* After the reference and old-logprob passes: the critic's values, token rewards (the
 * score at the last token, and -beta * KL when rl.kl_in_reward), GAE per sample, and
 * the advantages whitened over the batch (rl.whiten_advantages) into rl->adv. */
int ppo_advantages(struct trainer_run *r, int n, struct ppo_iteration *pi, struct smelt_error *err);
/* The critic's step on trained samples [a, b), beside the policy's. */
int ppo_critic_minibatch(struct trainer_run *r, int a, int b, struct ppo_iteration *pi, struct smelt_error *err);
/* critic/... and time/critic_s into m; with the KL in the reward, "kl" is that KL (the
 * policy loss has none). */
void ppo_metrics(const struct ppo_iteration *pi, json_t *m);

/* dist.c */
/* The options' ranks against the spec: rank in range, a rendezvous, the CPU backend, no
 * more ranks than grad_accum (not for RL jobs: dist_check_rl), stage 3 only where it is
 * built. Errors name the option ("rank", "ranks", "rendezvous") or the spec's field. */
int dist_check(const struct job_spec *s, const struct trainer_options *o, struct smelt_error *err);
struct dist_config {
    int rank, ranks, stage;
    const char *rendezvous, *run_id; /* comm_store_open's spec; the communicator's name (NULL: "world") */
    int timeout_ms;                  /* 0: TRAINER_COMM_TIMEOUT_MS */
    const struct curve_job_keys *job_keys; /* borrowed: a smeltd:ENDPOINT rendezvous needs them */
};
/* With ranks > 1: the store (job key "trainer") and the communicator, waiting up to the
 * timeout for every rank. d is zeroed first; dist_close frees it (also after a failure). */
int dist_open(struct dist *d, const struct dist_config *c, struct smelt_error *err);
void dist_close(struct dist *d);
/* More than one rank and stage >= 1: the moments (and at stage 2 the reduced gradients)
 * are shard-sized. */
bool dist_sharded(const struct dist *d);
/* Whether micro-batch `micro` (0-based, of a step) is this rank's: micro % ranks == rank. */
bool dist_mine(const struct dist *d, int64_t micro);
/* vals[0 .. n) become their sums over the ranks, added in rank order on every rank (the
 * same bits everywhere); with one rank they stay as they are. */
int dist_sum(struct dist *d, double *vals, int n, struct smelt_error *err);
int dist_barrier(struct dist *d, struct smelt_error *err);
/* opt for params: whole (one rank, stage 0) or this rank's shard (dist_sharded). */
int dist_optimizer_init(struct dist *d, const struct tensor *params, struct optimizer *opt, struct smelt_error *err);
/* One optimizer step on every rank's summed gradients (each rank's grads hold its own
 * micro-batches' sum; they are scratch afterwards): reduced by the stage's collective,
 * the global norm clipped (torch's rule), AdamW on the whole buffer (stage 0) or the
 * shard, the shards all-gathered. params end equal on every rank. */
int dist_optimizer_step(struct dist *d, struct optimizer *opt, struct tensor *params, struct tensor *grads,
                        const struct adamw_step *s, double *norm, struct smelt_error *err);
/* Bytes this rank allocated for the trainable parameters, their gradients (the
 * backward's full accumulation buffer, plus stage 2's shard) and the AdamW moments. */
struct dist_sizes {
    int64_t param_bytes, grad_bytes, optimizer_bytes;
};
void dist_sizes(const struct dist *d, const struct tensor *params, const struct tensor *grads,
                const struct optimizer *opt, struct dist_sizes *out);

/* ==== RL on several ranks (dist.c's byte helpers, rl_dist.c; docs/distributed.md) ======
 * Rank 0 alone generates and scores (its engine or rollout workers, its reward stage);
 * the others wait in dist_broadcast_bytes and take its samples, then every rank runs the
 * reference, old and critic passes over all samples and its share of every optimizer
 * step's micro-batches. */
#define DIST_MAX_BROADCAST_BYTES ((uint64_t)INT32_MAX * 4) /* one collective: 2^31 - 1 f32 slots */
/* A grpo / ppo job on `ranks` > 1: ZeRO stage 0, 1 or 2 (hyperparameters.zero_stage
 * named otherwise). */
int dist_check_rl(const struct job_spec *s, int ranks, struct smelt_error *err);
/* Rank 0's *buf (*len bytes, borrowed) to every rank: the others get a malloc'd copy in
 * *buf (theirs to free) and its length in *len. Sizes travel first. One rank: nothing. */
int dist_broadcast_bytes(struct dist *d, void **buf, size_t *len, struct smelt_error *err);
/* Every rank's `bytes` bytes at mine into all[rank * bytes ...] (all holds ranks * bytes),
 * as raw bytes: callers combine them in rank order, so every rank gets the same bits. */
int dist_gather_bytes(struct dist *d, const void *mine, size_t bytes, void *all, struct smelt_error *err);
/* t (f32, host) becomes its sum over the ranks (PPO's critic gradients: stage 0). */
int dist_all_reduce_sum(struct dist *d, struct tensor *t, struct smelt_error *err);

/* rl_dist.c. rank 0: rc is the outcome of its generation and rewards (err filled when it
 * failed); iter (iter_bytes, a plain struct of the same binary) and rl->samples[0 ..
 * n_samples) with rl->errors are broadcast with it. The other ranks replace their samples
 * (ids, rollout logprobs, row, version, finish reason, reward, scores, failed), iter and
 * rl->errors with rank 0's, or, when rank 0 failed, return its code with its message and
 * field. iter NULL: the outcome alone (a step only rank 0 takes: the split placement's
 * weight sync, its generation ahead), nothing else changes. One rank: returns rc. */
int rl_dist_share(struct trainer_run *r, int rc, void *iter, size_t iter_bytes, int n_samples,
                  struct smelt_error *err);
/* The split placement: rc, the outcome of rank 0's call to its workers (the generation
 * ahead, the weight sync), shared as rl_dist_share's outcome alone; otherwise rc. */
int rl_dist_lead_outcome(struct trainer_run *r, int rc, struct smelt_error *err);
/* After a one-step update whose old logprobs were its own forward (each rank: its own
 * micro-batches, those of the current version), every rank gets them all (summed from a
 * buffer that is 0 elsewhere: exact), for the mismatch metrics. One rank: nothing. */
int rl_dist_gather_old(struct trainer_run *r, int n, struct smelt_error *err);
/* One optimizer step's policy-loss statistics, loss and token count summed over the
 * ranks (each rank's partial merged in rank order: the same bits everywhere). */
int rl_dist_policy_totals(struct dist *d, struct rl_policy_stats *ps, double *loss, int64_t *tokens,
                          struct smelt_error *err);
/* One critic step's value-loss sums over the ranks (loss, value_sum, n_tokens, clipped). */
int rl_dist_critic_totals(struct dist *d, struct critic_totals *t, struct smelt_error *err);
/* ==== end of RL on several ranks ======================================================= */

/* setup.c */
double run_flops_per_token(const struct model *m, double mean_len);
int run_setup(struct trainer_run *r, struct smelt_error *err);
void run_teardown(struct trainer_run *r);
int run_hash_weights(const struct tensor *t, uint64_t *out, struct smelt_error *err);
int run_copy_tokenizer_files(const struct trainer_run *r, const char *dir, struct smelt_error *err);

/* batch.c */
/* The model's view of a packed batch. */
struct model_batch run_model_batch(const struct dataset_batch *b);
/* Forward of one batch: the trained tokens' logprobs into host_logprobs, and *nll = -their
 * sum (in double). */
int run_forward_batch(struct trainer_run *r, const struct dataset_batch *b, double *nll,
                      struct smelt_error *err);
/* Backward of the last forward: dL/dlogprob = coef[s] on every trained token of sequence
 * s (-1 for all when coef is NULL: SFT), 0 elsewhere. Overwrites host_logprobs. */
int run_backward_batch(struct trainer_run *r, const struct dataset_batch *b, const double *coef,
                       struct smelt_error *err);
/* Backward of the last forward from dL/dlogprob per token (host f32 [b->n_tokens]; 0
 * where nothing is trained). dlogp may be host_logprobs. */
int run_backward_tokens(struct trainer_run *r, const struct dataset_batch *b, const float *dlogp,
                        struct smelt_error *err);

/* evaluate.c */
int run_eval_loss(struct trainer_run *r, double *loss, int64_t *n_tokens, struct smelt_error *err);
/* fn on every batch of ds, in file order with the job's batch shape and LoRA dropout
 * off (evaluation, reference passes); stops at the first failure. mine_only: only this
 * rank's share of the batches (dist_mine), for a pass whose sums are then added over
 * the ranks. */
typedef int (*run_batch_fn)(struct trainer_run *r, const struct dataset_batch *b, void *ctx,
                            struct smelt_error *err);
int run_each_batch(struct trainer_run *r, const struct dataset *ds, bool mine_only, run_batch_fn fn, void *ctx,
                   struct smelt_error *err);
/* Whether forward-only passes over a split (validation, DPO's reference logprobs) are
 * shared over the ranks (each runs its share of the batches, the results added):
 * several ranks at stages 0-2, a job that is not RL. Stage 3 runs them whole on every
 * rank (its passes gather the units together); an RL job's held-out evaluation generates
 * on rank 0. Otherwise rank 0 validates alone and every rank computes all references. */
bool run_passes_shared(const struct trainer_run *r);
int run_accuracy(struct trainer_run *r, int64_t n_examples, double *accuracy, int64_t *n_done,
                 struct smelt_error *err);

/* checkpoint.c: checkpoints/step-N/{trainer_state.json, optimizer.safetensors, model/|adapter/}, and
 * what the algorithm's save_state adds (PPO: critic/, critic_optimizer.safetensors) */
int run_checkpoint_save(struct trainer_run *r, struct smelt_error *err);
/* resume: "latest" or a checkpoint directory; restores weights, moments, cursor, step. */
int run_checkpoint_restore(struct trainer_run *r, const char *resume, int64_t *step_out,
                           struct smelt_error *err);

/* metrics.c: JSON lines to output_dir/metrics.jsonl and stdout. */
int run_metrics_open(struct trainer_run *r, int64_t keep_through_step, struct smelt_error *err);
/* obj: a jansson object, stolen. */
void run_metrics_emit(struct trainer_run *r, void *obj);
void run_metrics_close(struct trainer_run *r);

/* ==== ZeRO stage 3 (zero3.c): parameters sharded, gathered unit by unit ================
 * A model_param_provider over comm/: every parameter unit (model_unit_range) is split
 * with comm_shard over its own numel, so each rank owns 1/N of every unit; the rank's
 * flat shard is its pieces of every unit, back to back in unit order. A unit is
 * all-gathered into one of two work buffers when the model acquires it, the next unit's
 * gather issued (asynchronously) as soon as one is acquired; after a unit's backward its
 * gradient is reduce-scattered (sum) from a unit gradient buffer and added into the
 * rank's gradient shard, so gradients accumulate across micro-batches and the whole
 * gradient buffer never exists. Host buffers (Gloo): CPU models only.
 *
 * LoRA: the trainable buffer is the adapter's, a few MB: it stays whole on every rank
 * (its gradients are reduced as stage 1/2 reduce any flat buffer). Stage 3 shards the
 * frozen base (base_grads false), which is where the memory is — as DeepSpeed's stage 3
 * partitions frozen parameters too.
 *
 * Ownership: zero3_create takes the model's weights (copies this rank's pieces, then
 * frees model->weights and model->grads) and sets itself as the model's provider; the
 * comm and the model are borrowed and must outlive it. zero3_free removes the provider
 * (the model then has no weights unless zero3_restore put them back). */
struct comm;
struct zero3;

struct zero3_bytes {
    int64_t shard_params, shard_grads; /* the rank's shards */
    int64_t work_params, work_grads;   /* the two gather buffers; the unit gradient and receive buffers */
};

/* Every rank calls it with the same model (same weights) and its comm. base_grads: the
 * base trains (full fine-tune); false: frozen base, an adapter trains. */
int zero3_create(struct model *model, struct comm *comm, bool base_grads, struct zero3 **out,
                 struct smelt_error *err);
void zero3_free(struct zero3 *z);
/* The rank's shards, f32 [shard numel] on the host: what the optimizer steps. The
 * gradient shard's data is NULL without base_grads; the caller zeroes it between steps.
 * A change to the parameter shard is seen from the next model_forward on. */
struct tensor *zero3_params(struct zero3 *z);
struct tensor *zero3_grads(struct zero3 *z);
/* Waits for the collectives in flight: the gradient shard is complete after a backward. */
int zero3_sync(struct zero3 *z, struct smelt_error *err);
/* Unit u's piece on this rank: flat [*flat_offset, + *numel) is shard [*shard_offset, + *numel). */
void zero3_piece(const struct zero3 *z, int64_t unit, int64_t *flat_offset, int64_t *numel,
                 int64_t *shard_offset);
/* Whole unit u (its numel elements) into dst, on every rank (weight sync bucket by bucket). */
int zero3_gather_unit(struct zero3 *z, int64_t unit, float *dst, struct smelt_error *err);
/* The whole flat buffer (model->n_weights elements) into flat, on every rank (saving). */
int zero3_gather(struct zero3 *z, float *flat, struct smelt_error *err);
/* Gives the model its whole weights buffer back and removes the provider: the model is
 * as before zero3_create (no gradient buffer). Only zero3_free may follow. */
int zero3_restore(struct zero3 *z, struct smelt_error *err);
void zero3_bytes(const struct zero3 *z, struct zero3_bytes *out);
/* The whole weights for a while (a checkpoint's weights, the outputs, greedy
 * generation): every rank gathers every unit (collectives: all ranks call it). With
 * keep, this rank's model gets them as its whole weights buffer and loses its provider
 * — it runs and saves as an unsharded model — until zero3_reshard; without, the units
 * pass through a work buffer and only serve the other ranks' gathers. */
int zero3_unshard(struct zero3 *z, bool keep, struct smelt_error *err);
/* Frees what zero3_unshard kept and puts the provider back (the shard is the truth: a
 * change to the whole buffer meanwhile is lost). Nothing to do without keep. */
int zero3_reshard(struct zero3 *z, struct smelt_error *err);
/* This rank's pieces of a whole flat buffer (model->n_weights elements: a checkpoint's
 * weights) into the parameter shard; no collective. */
int zero3_set_params(struct zero3 *z, const float *flat, struct smelt_error *err);

/* zero3_run.c: stage 3 in the run (docs/distributed.md). With zero_stage 3 and more than
 * one rank, r->zero3 serves the model's units: a full fine-tune trains the rank's shard
 * (r->params, r->grads are zero3's; AdamW over its pieces), LoRA trains its adapter
 * whole as stage 2 does (dist_optimizer_step) over the sharded frozen base. One rank:
 * no provider, the plain run. */
/* After the adapter (if any) exists: the provider and the optimizer. */
int zero3_run_setup(struct trainer_run *r, struct smelt_error *err);
/* The full fine-tune's step over the shard: gradients complete (zero3_sync), the global
 * norm from the shards' sums of squares (dist_sum), AdamW on the shard, no gather. */
int zero3_run_optimizer_step(struct trainer_run *r, const struct adamw_step *s, double *norm,
                             struct smelt_error *err);
/* Every unit fetch is a collective, so every rank runs as many passes per step as rank
 * 0 (the one with most micro-batches, dist_mine): after its own `done` micro-batches a
 * rank runs fn on b (a batch of the step) until it has, with r->pad_pass set: the
 * backward then gets zero gradients (run_backward_tokens, reward.c), and ctx should be
 * scratch. Nothing without a provider. */
int zero3_run_pad(struct trainer_run *r, int64_t n_micro, int64_t done, const struct dataset_batch *b,
                  run_batch_fn fn, void *ctx, struct smelt_error *err);
/* The start line's per-rank sizes at stage 3: shards and work buffers (LoRA: the
 * adapter and the base's shard and work buffers). */
void zero3_run_sizes(const struct trainer_run *r, struct dist_sizes *out);
/* The start line's "zero3": {shard_param_bytes, work_param_bytes, shard_grad_bytes,
 * work_grad_bytes} (zero3_bytes), new. */
json_t *zero3_run_bytes_json(const struct trainer_run *r);
/* world.json's shard entry of rank k: its moments' flat pieces ([[offset, len], ...]),
 * *len their sum (a full fine-tune at stage 3). */
json_t *zero3_run_pieces(const struct trainer_run *r, int k, int64_t *len);
/* ==== end of ZeRO stage 3 ============================================================ */

#endif
