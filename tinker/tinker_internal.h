/* Private to tinker/: the worker's state and the ops' entry points. */
#ifndef SMELT_TINKER_INTERNAL_H
#define SMELT_TINKER_INTERNAL_H

#include "tinker/tinker.h"

#include <time.h>

#include "common/rng.h"
#include "lora/lora.h"
#include "model/model.h"
#include "rollout/rollout.h"
#include "tokenizer/tokenizer.h"
#include "trainer/trainer.h"

/* One LoRA model on the base. */
struct tinker_model {
    char id[TINKER_ID_BYTES];
    struct lora *lora;
    struct optimizer opt;   /* opt.step: optimizer steps so far */
    int rank;
    float alpha;
    uint64_t seed;
    bool train_attn, train_mlp, train_unembed;
    struct tinker_model *next;
};

/* A sampler checkpoint's adapter, loaded once per path and kept while it is among the
 * TINKER_CACHED_ADAPTERS most recently used (an RL loop saves a new one every iteration).
 * mtime is its adapter file's: a checkpoint written again under the same path (overwrite)
 * is loaded again. used: the sample batch that last picked it (never evicted during it). */
#define TINKER_CACHED_ADAPTERS 8
struct tinker_cached_adapter {
    char path[TINKER_PATH_BYTES];
    struct lora *lora;
    struct timespec mtime;
    uint64_t used;
    struct tinker_cached_adapter *next;
};

struct tinker_worker {
    struct model *base;
    char base_name[TINKER_PATH_BYTES];
    struct tokenizer *tok;              /* NULL: stop strings refused */
    struct rollout_engine *engine;
    struct tinker_model *models;
    struct tinker_cached_adapter *adapters;
    FILE *metrics;                      /* NULL: none */
    struct rng rng;                     /* fresh sample seeds */
    uint64_t next_request;              /* engine request ids */
    uint64_t sample_batch;              /* tinker_sample_batch calls so far */
};

struct tinker_model *tinker_model_find(struct tinker_worker *w, const char *id);
/* The request's "model_id": SMELT_ENOTFOUND naming it when no such model lives here. */
int tinker_model_of(struct tinker_worker *w, const json_t *h, struct tinker_model **out, struct smelt_error *err);

/* m's adapter (from its rank, alpha, seed and switches) and optimizer. */
int tinker_model_build(struct tinker_worker *w, struct tinker_model *m, struct smelt_error *err);

int tinker_op_create_model(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                           struct smelt_error *err);
int tinker_op_unload_model(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                           struct smelt_error *err);
/* forward (backward false) and forward_backward. */
int tinker_op_forward(struct tinker_worker *w, const struct msg *m, bool backward, struct tinker_reply *out,
                      struct smelt_error *err);
int tinker_op_optim_step(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                         struct smelt_error *err);
int tinker_op_save_weights(struct tinker_worker *w, const struct msg *m, bool for_sampler, struct tinker_reply *out,
                           struct smelt_error *err);
int tinker_op_load_weights(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                           struct smelt_error *err);
int tinker_op_sample(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                     struct smelt_error *err);

/* The prompt's own logprobs under the model as it is (adapter attached): plp [n] (NULL:
 * not wanted) = log p(ids[t] | ids[<t]), plp[0] NaN; with k > 0, topk_ids / topk_lps
 * [n * k]: position t's k most likely tokens and their logprobs (position 0: ids -1,
 * NaN). */
int tinker_prompt_logprobs(struct model *base, const int32_t *ids, int64_t n, int64_t k, float *plp,
                           int32_t *topk_ids, float *topk_lps, struct smelt_error *err);

/* The k most likely ids of one row of V logits, best first (ties: the lower id first), and
 * their log-softmax; k > V fills the rest with -1 and NaN. The row is finite. O(V log k). */
void tinker_row_topk(const float *row, int64_t V, int64_t k, int32_t *ids, float *lps);

/* Checks a directory path from a request (absolute, no "..", fits): SMELT_EINVAL
 * naming field. */
int tinker_path_check(const char *path, const char *field, struct smelt_error *err);

/* Moves a malloc'd buffer into the reply's next array (freed on failure). */
int tinker_reply_add(struct tinker_reply *r, void *data, size_t bytes, struct smelt_error *err);

/* Appends {"type": "tinker", "op", "model_id", "step", "metrics", "ms"} to the metrics
 * file (no-op without one; a failed write is logged, never fails the request). */
void tinker_metrics_write(struct tinker_worker *w, const char *op, const struct tinker_model *m,
                          const json_t *metrics, double ms);

#endif
