/* trainer/: the job spec, the optimizer, learning-rate schedules, checkpoints and the
 * training loops (SFT, DPO, the reward model, GRPO and PPO), run by the
 * `smelt-trainer` program. docs/job-spec.md documents the spec and the job directory.
 *
 * Ownership: a struct job_spec is a plain value (fixed-size strings, no heap). The
 * optimizer owns its moment buffers (optimizer_free). trainer_run owns everything it
 * loads for the duration of the call. */
#ifndef SMELT_TRAINER_H
#define SMELT_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "datasets/datasets.h"
#include "kernels/ops.h"
#include "lora/lora.h"
#include "trainer/preference_loss.h" /* enum pref_loss_type, in the spec */
#include "trainer/rl_loss.h"         /* the RL loss and estimator enums, in the spec */

#define JOB_PATH_BYTES 1024

/* ---- learning-rate schedules ---- */

enum lr_schedule_kind { LR_SCHEDULE_CONSTANT, LR_SCHEDULE_LINEAR, LR_SCHEDULE_COSINE };
const char *lr_schedule_name(enum lr_schedule_kind kind);
int lr_schedule_from_name(const char *name, enum lr_schedule_kind *out, struct smelt_error *err);

struct lr_schedule {
    enum lr_schedule_kind kind;
    double peak;
    int64_t warmup_steps;
    int64_t total_steps;
    double min_lr_ratio;
};

/* The learning rate of optimizer step `step` (1-based): linear warmup from peak/warmup
 * at step 1 to peak at step warmup_steps, then constant, or linear / cosine decay to
 * min_lr_ratio * peak at total_steps (HF transformers' schedules with a floor). */
double lr_at(const struct lr_schedule *s, int64_t step);

/* ---- the job spec ---- */

enum job_type { JOB_SFT, JOB_DPO, JOB_REWARD, JOB_GRPO, JOB_PPO };
/* the spec's "type": "sft", "dpo", "reward_model", "grpo", "ppo" */
const char *job_type_name(enum job_type type);
/* GRPO and PPO: the RL loop, its "rl" section and prompts rows. */
static inline bool job_type_is_rl(enum job_type type) { return type == JOB_GRPO || type == JOB_PPO; }

/* Where an RL job generates: in the trainer's process on its own weights, or in
 * smelt-rollout workers that receive the weights after every update. */
enum rl_placement { RL_PLACEMENT_COLOCATED, RL_PLACEMENT_SPLIT };
const char *rl_placement_name(enum rl_placement p);
/* rl.weight_sync: how the split placement's syncs move the bytes. auto: broadcast. */
enum rl_weight_sync { RL_WEIGHT_SYNC_AUTO, RL_WEIGHT_SYNC_BROADCAST, RL_WEIGHT_SYNC_ZMQ };
const char *rl_weight_sync_name(enum rl_weight_sync w);

#define JOB_REWARD_SPEC_BYTES 65536 /* a python grader's source is most of it */

struct job_spec {
    enum job_type type;
    char model[JOB_PATH_BYTES];
    bool model_init_random;
    char tokenizer[JOB_PATH_BYTES];      /* "" = the model directory */
    char chat_template[32];              /* "" = detect */
    struct {
        char train[JOB_PATH_BYTES];
        char validation[JOB_PATH_BYTES]; /* "" = none */
        double validation_fraction;
        int64_t max_seq_len;             /* 0 = the model's context */
        enum dataset_truncation truncation;
        enum dataset_loss_on loss_on;
        bool add_bos;
        bool shuffle;
    } data;
    struct {
        int64_t epochs, max_steps, batch_size, batch_tokens, grad_accum;
        double learning_rate;
        enum lr_schedule_kind lr_schedule;
        int64_t warmup_steps;
        double min_lr_ratio, weight_decay, beta1, beta2, eps, max_grad_norm;
        bool recompute;
        /* DPO only (docs/job-spec.md); parsed, and ignored, in any job */
        double beta;
        enum pref_loss_type loss_type;
        double label_smoothing, rpo_alpha, simpo_gamma;
        bool precompute_ref;
        /* reward model only: TRL RewardTrainer's center_rewards_coefficient */
        double center_rewards_coefficient;
        /* ZeRO with more than one rank: 0 replicated, 1 AdamW moments sharded, 2 and
         * the reduced gradients, 3 and the parameters, per unit (docs/distributed.md) */
        int64_t zero_stage;
        /* with several ranks: how long a collective may wait for the others (rank 0's
         * validation and checkpoint writes happen while they wait); --comm-timeout-ms wins */
        double comm_timeout_s;
    } hp;
    /* GRPO and PPO (the spec's "rl" section: JOB_RL_FIELDS, plus reward and critic_model). */
    struct {
        int64_t num_generations, minibatches, ppo_epochs, max_iterations, max_new_tokens, top_k;
        double temperature, top_p, min_p;
        enum rl_loss_type loss_type;
        int loss_agg;                        /* enum rl_loss_agg, or -1: the loss type's own */
        double epsilon, epsilon_high, dual_clip, beta;
        enum rl_kl_estimator kl_estimator;
        enum rl_adv_estimator advantage_estimator;
        bool scale_rewards, mask_truncated_completions, dynamic_sampling;
        int64_t max_staleness;               /* 0: on-policy; 1: the next batch generated during the update */
        bool true_on_policy;                 /* batch-invariant CPU kernels: rollout logprobs = trainer's, bit for bit */
        double tis_cap;
        enum rl_tis_level tis_level;
        enum rl_tis_mode tis_mode;
        enum rl_placement placement;
        int64_t rollout_workers;             /* split: smelt-rollout processes the trainer starts */
        enum rl_weight_sync weight_sync;     /* split: broadcast (comm/, Gloo) or ZeroMQ bucket messages */
        int64_t kv_memory_mb;                /* the rollout engine's KV cache */
        /* PPO only (a grpo job refuses any but their defaults): the critic and GAE. */
        double critic_learning_rate, gamma, lambda, value_clip;
        bool whiten_advantages;
        bool kl_in_reward;                   /* beta's KL in the token rewards (k1 by default), not the loss */
        int64_t critic_warmup_iterations;    /* iterations that train the critic alone */
        char critic_model[JOB_PATH_BYTES];   /* a reward model's directory; "": the policy's start + a new head */
        char reward[JOB_REWARD_SPEC_BYTES];  /* the reward spec (rewards/rewards.h), compact JSON */
    } rl;
    bool has_lora;
    struct lora_config lora;
    struct {
        int64_t every_steps, accuracy_examples, max_new_tokens;
    } eval;
    struct {
        int64_t every_steps, keep_last;
    } checkpoint;
    char output_dir[JOB_PATH_BYTES];
    bool save_merged;
    bool save_bf16;
    uint64_t seed;
    enum backend backend;
    int64_t log_every_steps;
};

/* spec.hyperparameters, field by field: the one definition of their names, types,
 * defaults and ranges. The parser, job_spec_to_json and smeltd's API (which only maps
 * OpenAI's names onto these) all read it, so a field added here is accepted everywhere. */
enum job_field_kind { JOB_FIELD_INT, JOB_FIELD_NUMBER, JOB_FIELD_BOOL, JOB_FIELD_NAME };

struct job_hp_field {
    const char *name;
    enum job_field_kind kind;
    size_t offset;       /* of the value in struct job_spec (int64_t, double, bool or an enum) */
    double def;          /* INT, NUMBER, BOOL (0 or 1); integers are exact up to 2^53 */
    double min, max;     /* INT, NUMBER: the allowed range, both ends included... */
    bool min_excluded;   /* ...unless this says min itself is refused: (min, max] */
    const char *def_name;                                                  /* NAME */
    int (*from_name)(const char *name, void *value, struct smelt_error *err); /* NAME */
    const char *(*to_name)(const void *value);                             /* NAME */
};

extern const struct job_hp_field JOB_HP_FIELDS[];
extern const int JOB_N_HP_FIELDS;
/* spec.rl's fields of the same kinds (GRPO / PPO; TRL's names where TRL has them). The
 * section's two other keys are not in the table: "reward" (an object) and, PPO only,
 * "critic_model" (a path, or null). */
extern const struct job_hp_field JOB_RL_FIELDS[];
extern const int JOB_N_RL_FIELDS;
/* The field called name, or NULL. */
const struct job_hp_field *job_hp_field_find(const char *name);

/* Parses and validates a spec (json: a jansson json_t *). Errors name the field with
 * its path ("<where>: hyperparameters.learning_rate: ...") in the message and, without
 * `where`, in err->field ("hyperparameters.learning_rate"), for callers that report it
 * apart (smeltd's `param`). */
int job_spec_from_json(const void *json, const char *where, struct job_spec *out,
                       struct smelt_error *err);
int job_spec_load(const char *path, struct job_spec *out, struct smelt_error *err);
/* The spec with every default filled in, as a new jansson object (json_decref it). */
int job_spec_to_json(const struct job_spec *spec, void **out, struct smelt_error *err);

/* ---- the optimizer ---- */

/* AdamW over one flat f32 parameter buffer (the whole model, or a LoRA adapter), or over
 * one rank's shard of it (ZeRO stage >= 1): m and v hold the elements [offset, offset +
 * numel(m)) of a buffer of total elements. */
struct optimizer {
    struct tensor m, v;     /* first and second moments, like the parameters (or their shard) */
    int64_t step;           /* optimizer steps taken */
    int64_t offset, total;  /* the shard's place in the flat buffer; 0 and its length unsharded */
    /* ZeRO stage 3 (optimizer_init_pieces): the moments are n_pieces flat ranges
     * [piece_off[i], + piece_len[i]) back to back, and offset is 0 (params is the shard
     * itself); 0 pieces: the one range above. Owned. */
    int64_t n_pieces;
    int64_t *piece_off, *piece_len;
};

int optimizer_init(struct optimizer *opt, const struct tensor *params, struct smelt_error *err);
/* Moments for elements [offset, offset + len) of params only (len >= 1). */
int optimizer_init_shard(struct optimizer *opt, const struct tensor *params, int64_t offset, int64_t len,
                         struct smelt_error *err);
/* Moments for a shard made of pieces of a flat buffer of total elements (ZeRO stage 3):
 * shard holds them back to back (numel(shard) = the sum of len[0 .. n)); off and len are
 * copied. */
int optimizer_init_pieces(struct optimizer *opt, const struct tensor *shard, int64_t total, int64_t n,
                          const int64_t *off, const int64_t *len, struct smelt_error *err);
void optimizer_free(struct optimizer *opt);

/* One step: the gradient is grads * grad_scale, clipped to a global norm of max_norm
 * (0: no clipping; torch's clip_grad_norm_ rule, coefficient max_norm / (norm + 1e-6)).
 * *norm_out receives the norm before clipping. Unsharded optimizers only. */
int optimizer_step(struct optimizer *opt, struct tensor *params, const struct tensor *grads,
                   double grad_scale, double max_norm, double lr, double beta1, double beta2,
                   double eps, double weight_decay, double *norm_out, struct smelt_error *err);

/* The hyperparameters of one step. */
struct adamw_step {
    double grad_scale, max_norm, lr, beta1, beta2, eps, weight_decay;
};
/* The step's clip and update given the sum of squares of the whole (unscaled) gradient,
 * wherever it was computed: params is the whole flat buffer (the shard's elements are
 * updated) or, for a shard of pieces, the shard itself (offset 0); grads holds just the
 * optimizer's elements (numel(m) of them). *norm_out as
 * optimizer_step's. optimizer_step is this with ops_sum_squares over all of grads. */
int optimizer_apply(struct optimizer *opt, struct tensor *params, const struct tensor *grads, double sum_squares,
                    const struct adamw_step *s, double *norm_out, struct smelt_error *err);
/* A 1-d f32 view of elements [offset, offset + len) of t (borrowed memory). */
struct tensor optimizer_view(const struct tensor *t, int64_t offset, int64_t len);

/* optimizer.safetensors (or a rank's shard of it): "exp_avg", "exp_avg_sq" (f32, the
 * optimizer's elements) and in the metadata the step, "offset" and "total" (the shard's
 * place; files without them hold a whole buffer) and, for a shard of pieces, "pieces"
 * ("OFF+LEN,OFF+LEN,...": the flat ranges the elements hold, back to back). */
int optimizer_save(const struct optimizer *opt, const char *path, struct smelt_error *err);
int optimizer_load(struct optimizer *opt, const char *path, struct smelt_error *err);
/* Restores the moments of opt's elements from saved shards of any layout (paths[0 ..
 * n_paths): every shard of one checkpoint, disjoint): each file's overlap with opt's
 * range is copied. Refused when the files disagree on the step or the total, or do not
 * cover opt's range. */
int optimizer_load_shards(struct optimizer *opt, const char *const *paths, int n_paths, struct smelt_error *err);

/* ---- running a job ---- */

struct curve_job_keys;

struct trainer_options {
    const char *resume;       /* NULL: fresh start (refused if checkpoints exist);
                                 "latest": the newest checkpoint; else a checkpoint dir */
    int64_t stop_after_step;  /* > 0: checkpoint and stop after this step (tests, pause) */
    bool quiet;               /* no metrics on stdout */
    /* Data parallel ranks (docs/distributed.md): ranks > 1 runs this process as rank
     * `rank` of one job whose every rank runs with the same spec and options but rank.
     * 0/0 is one rank (no communicator: the single-process run). */
    int rank, ranks;
    const char *rendezvous;   /* comm_store_open's spec ("file:DIR"); required when ranks > 1 */
    const char *run_id;       /* the communicator's name in the store; NULL: "world" */
    int comm_timeout_ms;      /* per collective; 0: TRAINER_COMM_TIMEOUT_MS */
    /* The job's CURVE keys from its launch (common/curve.h; borrowed for the run): rank 0
     * hands them to its rollout workers, whose sockets then admit only this keypair
     * (docs/security.md "Job channels"). NULL or not present: plain sockets. */
    const struct curve_job_keys *job_keys;
};
/* A collective's timeout when none is given: long enough for a checkpoint's write or a
 * validation pass on rank 0 while the others wait in a collective (NCCL's default is of
 * this order). */
#define TRAINER_COMM_TIMEOUT_MS 600000
/* The spec's hyperparameters.comm_timeout_s in milliseconds (at most INT32_MAX). */
int trainer_comm_timeout_ms(const struct job_spec *spec);

struct trainer_result {
    int64_t steps;            /* optimizer steps done in total */
    bool stopped;             /* stopped early (stop_after_step or SIGTERM/SIGINT) */
    double last_loss;
    double val_loss;          /* NAN without validation data */
    double accuracy;          /* NAN when not measured */
    int64_t accuracy_examples;
    bool base_unchanged;      /* LoRA: the base weights were verified untouched */
    char output[JOB_PATH_BYTES];
};

/* Runs the job to the end (or until stopped), writing the job directory. */
int trainer_run(const struct job_spec *spec, const struct trainer_options *options,
                struct trainer_result *result, struct smelt_error *err);

/* ---- several ranks on this machine (launch.c) ---- */

#define TRAINER_MAX_RANKS 64

/* smelt-trainer --ranks N without --rank: the ranks of one job started on this machine. */
struct trainer_launch {
    const char *program;       /* this program's path (each rank runs it again) */
    const char *const *args;   /* the arguments every rank gets (--spec, --resume, ...) */
    int n_args;
    int ranks;                 /* 2 .. TRAINER_MAX_RANKS */
    const char *output_dir;    /* the job's: its rendezvous/ folder holds the ranks' addresses */
    int comm_timeout_ms;       /* the ranks' collective timeout (0: the default) */
    const struct curve_job_keys *job_keys; /* NULL, or the job's keys: handed to every rank (borrowed) */
    const char *rendezvous;    /* NULL: a fresh file:DIR under output_dir; else the ranks' store
                                  (smeltd's "smeltd:ENDPOINT", given by smeltd) */
};
/* Starts ranks 0..N-1 (each with --rank R --ranks N --rendezvous STORE --no-lock, on
 * device entry R), passes SIGTERM/SIGINT on to them, and waits for all of them. After a
 * rank fails the others get twice the timeout to fail in turn (each naming it); ranks left
 * after that, or stopped while all others ended, are killed. *exit_status: 0 when every
 * rank exited 0, else the first failed rank's status (3 when it was killed by a signal).
 * An error only when the ranks could not be started. */
int trainer_launch_ranks(const struct trainer_launch *l, int *exit_status, struct smelt_error *err);

/* The newest complete checkpoint of a job directory (output_dir/checkpoints/step-N) into
 * dst; SMELT_ENOTFOUND when there is none. What `--resume latest` resumes from. */
int trainer_checkpoint_latest(const char *output_dir, char *dst, size_t cap, struct smelt_error *err);

/* Set by SIGTERM/SIGINT in smelt-trainer: trainer_run checkpoints after the current step
 * and returns with result->stopped. */
void trainer_request_stop(void);

#endif
