/* Private to trainer/: one run's state, shared by the setup, the loop, evaluation,
 * checkpoints and metrics. */
#ifndef SMELT_TRAINER_INTERNAL_H
#define SMELT_TRAINER_INTERNAL_H

#include <stdio.h>

#include "model/model.h"
#include "trainer/trainer.h"

struct trainer_run {
    const struct job_spec *spec;
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
};

/* setup.c */
int run_setup(struct trainer_run *r, struct smelt_error *err);
void run_teardown(struct trainer_run *r);
int run_hash_weights(const struct tensor *t, uint64_t *out, struct smelt_error *err);
int run_copy_tokenizer_files(const struct trainer_run *r, const char *dir, struct smelt_error *err);

/* evaluate.c */
/* Forward of one batch: *nll = -sum of the trained tokens' logprobs (in double). */
int run_forward_batch(struct trainer_run *r, const struct dataset_batch *b, double *nll,
                      struct smelt_error *err);
int run_eval_loss(struct trainer_run *r, double *loss, int64_t *n_tokens, struct smelt_error *err);
int run_accuracy(struct trainer_run *r, int64_t n_examples, double *accuracy, int64_t *n_done,
                 struct smelt_error *err);

/* checkpoint.c: checkpoints/step-N/{trainer_state.json, optimizer.safetensors, model/|adapter/} */
int run_checkpoint_save(struct trainer_run *r, struct smelt_error *err);
/* resume: "latest" or a checkpoint directory; restores weights, moments, cursor, step. */
int run_checkpoint_restore(struct trainer_run *r, const char *resume, int64_t *step_out,
                           struct smelt_error *err);

/* metrics.c: JSON lines to output_dir/metrics.jsonl and stdout. */
int run_metrics_open(struct trainer_run *r, int64_t keep_through_step, struct smelt_error *err);
/* obj: a jansson object, stolen. */
void run_metrics_emit(struct trainer_run *r, void *obj);
void run_metrics_close(struct trainer_run *r);

#endif
