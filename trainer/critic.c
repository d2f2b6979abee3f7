/* PPO's critic (trainer_internal.h: struct critic): a sequence classifier beside the
 * policy, its score head read at every token (model_value_forward), trained in full
 * with its own gradient buffer, activations and AdamW state (optimizer.c) on the clipped
 * value loss (rl_value_loss). It sees the samples exactly as the policy does — the same
 * packed micro-batches (rl_batch_build), values read where the logprobs are read
 * (rl_batch_gather_from) — so a value belongs to the state before its token.
 *
 * Why a second model and not a value head on the policy: OpenRLHF, veRL and TRL's
 * PPOTrainer all keep the critic apart (its own weights, optimizer and learning rate),
 * it may start from a reward model, and a LoRA policy keeps its base frozen. Why always
 * in full: a LoRA critic would need a second adapter on the policy's base, which comes
 * later. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/score_head.h"

/* A new value head's init: transformers' initializer_range (reward.c's head too), as
 * TRL's value model (AutoModelForSequenceClassification, num_labels 1) draws it. */
#define CRITIC_HEAD_INIT_STD 0.02

void critic_free(struct critic *c) {
    if (!c) return;
    tensor_free(&c->hidden);
    tensor_free(&c->dhidden);
    tensor_free(&c->values);
    free(c->host);
    free(c->old);
    free(c->cur);
    free(c->rewards);
    free(c->returns);
    free(c->dvalue);
    optimizer_free(&c->opt);
    model_acts_free(c->acts);
    model_free(c->model);
    free(c);
}

/* What a critic must share with the policy: the vocabulary (it reads the policy's token
 * ids) and room for the longest sample. */
static int check_critic_model(struct trainer_run *r, const struct model *m, const char *dir,
                              struct smelt_error *err) {
    if (m->config.vocab_size != r->model->config.vocab_size)
        return error_set_field(err, SMELT_EINVAL, "rl.critic_model",
                               "rl.critic_model: %s has a vocabulary of %lld, the policy %lld: the critic reads the "
                               "policy's tokens", dir, (long long)m->config.vocab_size,
                               (long long)r->model->config.vocab_size);
    int64_t longest = rl_longest_sample(r, r->train);
    if (longest > m->config.max_seq_len)
        return error_set_field(err, SMELT_EINVAL, "rl.critic_model",
                               "rl.critic_model: %s has a context of %lld tokens, below the longest sample (%lld)", dir,
                               (long long)m->config.max_seq_len, (long long)longest);
    return SMELT_OK;
}

static int load_critic_model(struct trainer_run *r, struct model **out, struct smelt_error *err) {
    const char *dir = r->spec->rl.critic_model;
    int64_t pad = tokenizer_special_ids(r->tok)->pad;
    *out = NULL;
    if (!dir[0]) /* the policy's starting weights (a LoRA policy: its base, which is the same model) */
        return error_wrap(err,
                          model_classifier_from_lm(r->model, pad, CRITIC_HEAD_INIT_STD, r->spec->seed ^ 0xc71c5eedu,
                                                   out, err),
                          "the critic from the policy %s", r->spec->model);
    TRY(run_load_classifier(dir, r->spec->backend, pad, "rl.critic_model",
                            "give a reward model (a sequence classifier, e.g. a reward_model job's output), or "
                            "\"\" for the policy's starting weights with a new head", out, err));
    return check_critic_model(r, *out, dir, err);
}

static int alloc_buffers(struct trainer_run *r, struct critic *c, int64_t cap_tokens, struct smelt_error *err) {
    enum backend be = c->model->backend;
    int64_t shape[2] = {r->max_tokens, c->model->config.hidden_size}, n = cap_tokens ? cap_tokens : 1;
    TRY(tensor_alloc(&c->hidden, be, DTYPE_F32, 2, shape, err));
    TRY(tensor_alloc(&c->dhidden, be, DTYPE_F32, 2, shape, err));
    TRY(tensor_alloc(&c->values, be, DTYPE_F32, 1, shape, err));
    c->host = malloc((size_t)r->max_tokens * sizeof *c->host);
    c->old = calloc((size_t)n, sizeof *c->old);
    c->cur = calloc((size_t)n, sizeof *c->cur);
    c->rewards = calloc((size_t)n, sizeof *c->rewards);
    c->returns = calloc((size_t)n, sizeof *c->returns);
    c->dvalue = calloc((size_t)n, sizeof *c->dvalue);
    bool ok = c->host && c->old && c->cur && c->rewards && c->returns && c->dvalue;
    return ok ? SMELT_OK : error_set(err, SMELT_ENOMEM, "critic: out of memory for %lld tokens", (long long)n);
}

int critic_create(struct trainer_run *r, int64_t cap_tokens, struct critic **out, struct smelt_error *err) {
    struct critic *c = calloc(1, sizeof *c);
    *out = c; /* the caller frees it (critic_free), also after a failure */
    if (!c) return error_set(err, SMELT_ENOMEM, "critic: out of memory");
    TRY(load_critic_model(r, &c->model, err));
    TRY(model_grads_alloc(c->model, err));
    TRY(optimizer_init(&c->opt, &c->model->weights, err));
    TRY(model_acts_alloc(c->model, r->max_tokens, r->spec->hp.recompute, &c->acts, err));
    c->schedule = r->schedule;
    c->schedule.peak = r->spec->rl.critic_learning_rate;
    return alloc_buffers(r, c, cap_tokens, err);
}

/* A view of the first rows of t (the kernels read shapes). */
static struct tensor rows_of(const struct tensor *t, int64_t rows) {
    int64_t shape[2] = {rows, t->ndim > 1 ? t->shape[1] : 1};
    return tensor_make(t->backend, DTYPE_F32, t->data, t->ndim, shape);
}

/* One packed batch through the critic: hidden states (for its backward) and the value at
 * every position, copied to c->host. */
static int forward_batch(struct critic *c, const struct dataset_batch *b, struct tensor *hidden,
                         struct smelt_error *err) {
    struct model_batch mb = run_model_batch(b);
    *hidden = rows_of(&c->hidden, b->n_tokens);
    struct tensor values = rows_of(&c->values, b->n_tokens);
    TRY(model_forward(c->model, c->acts, &mb, NULL, NULL, hidden, err));
    TRY(model_value_forward(c->model, hidden, &values, err));
    struct tensor host = tensor_f32(c->host, 1, &b->n_tokens);
    return tensor_copy(&host, &values, err);
}

int critic_values(struct trainer_run *r, int n, float *dst, struct smelt_error *err) {
    struct critic *c = r->rl->critic;
    const struct rl_sample *ts = r->rl->trained;
    for (int i = 0; i < n;) {
        int k = rl_batch_fit(r, r->train, ts + i, n - i);
        struct dataset_batch b;
        struct tensor hidden;
        TRY(rl_batch_build(r, r->train, ts + i, k, &b, err));
        TRY(forward_batch(c, &b, &hidden, err));
        rl_batch_gather_from(r->train, &b, ts + i, k, c->host, dst);
        i += k;
    }
    return SMELT_OK;
}

/* The backward of the last forward_batch from dL/dvalue of samples [i, i + k). */
static int backward_batch(struct trainer_run *r, struct critic *c, const struct dataset_batch *b, int i, int k,
                          const struct tensor *hidden, struct smelt_error *err) {
    rl_batch_scatter_to(r->train, b, r->rl->trained + i, k, c->dvalue, c->host);
    struct tensor host = tensor_f32(c->host, 1, &b->n_tokens);
    struct tensor dvalues = rows_of(&c->values, b->n_tokens), dhidden = rows_of(&c->dhidden, b->n_tokens);
    TRY(tensor_copy(&dvalues, &host, err));
    TRY(model_value_backward(c->model, hidden, &dvalues, &c->model->g.score, &dhidden, err));
    return model_backward(c->model, c->acts, NULL, &dhidden, err);
}

/* Offsets of trained samples [a, a + k] relative to a's first token, into rel. */
static void relative(const struct rl_state *rl, int a, int k, int64_t *rel) {
    for (int i = 0; i <= k; i++) rel[i] = rl->start[a + i] - rl->start[a];
}

/* One micro-batch of samples [i, i + k): forward, loss against the norm, backward. */
static int micro_step(struct trainer_run *r, int i, int k, const struct rl_value_config *vc, struct rl_norm norm,
                      int64_t *rel, struct critic_totals *tot, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    struct critic *c = rl->critic;
    struct dataset_batch b;
    struct tensor hidden;
    TRY(rl_batch_build(r, r->train, rl->trained + i, k, &b, err));
    TRY(forward_batch(c, &b, &hidden, err));
    rl_batch_gather_from(r->train, &b, rl->trained + i, k, c->host, c->cur);
    int64_t o = rl->start[i];
    relative(rl, i, k, rel);
    struct rl_value_batch vb = {.n_seq = k, .start = rel, .values = c->cur + o, .old_values = c->old + o,
                                .returns = c->returns + o, .mask = rl->mask + o};
    struct rl_value_stats vs;
    TRY(rl_value_loss(vc, &vb, norm, c->dvalue + o, &vs, err));
    tot->loss += vs.loss;
    tot->value_sum += vs.value_sum;
    tot->n_tokens += vs.n_tokens;
    tot->clipped += vs.clipped;
    return backward_batch(r, c, &b, i, k, &hidden, err);
}

int critic_step(struct trainer_run *r, int a, int b, struct critic_totals *tot, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_state *rl = r->rl;
    struct critic *c = rl->critic;
    int64_t *rel = malloc((size_t)(b - a + 1) * sizeof *rel);
    if (!rel) return error_set(err, SMELT_ENOMEM, "critic: out of memory");
    /* token_mean over the minibatch: veRL's critic (loss_agg_mode token-mean) and
     * OpenRLHF's ValueLoss (masked mean). */
    struct rl_value_config vc = {.clip_range = s->rl.value_clip, .agg = RL_AGG_TOKEN_MEAN,
                                 .max_completion_len = s->rl.max_new_tokens};
    struct rl_norm norm = {0};
    relative(rl, a, b - a, rel);
    int rc = rl_norm_accumulate(&norm, b - a, rel, rl->mask + rl->start[a], err);
    if (!rc) rc = tensor_zero(&c->model->grads, err);
    /* Several ranks: the policy's split of the micro-batches (dist_mine), the sums and
     * gradients added over the ranks; the critic's moments stay whole (stage 0). */
    bool ranks = r->dist.ranks > 1;
    struct critic_totals mine = {0}, *acc = ranks ? &mine : tot;
    for (int i = a, j = 0; !rc && i < b; j++) {
        int k = rl_batch_fit(r, r->train, rl->trained + i, b - i);
        if (dist_mine(&r->dist, j)) rc = micro_step(r, i, k, &vc, norm, rel, acc, err);
        i += k;
    }
    free(rel);
    TRY(rc);
    if (ranks) {
        TRY(rl_dist_critic_totals(&r->dist, &mine, err));
        TRY(dist_all_reduce_sum(&r->dist, &c->model->grads, err));
        tot->loss += mine.loss;
        tot->value_sum += mine.value_sum;
        tot->n_tokens += mine.n_tokens;
        tot->clipped += mine.clipped;
    }
    double grad_norm, lr = lr_at(&c->schedule, r->step + 1);
    TRY(optimizer_step(&c->opt, &c->model->weights, &c->model->grads, 1.0, s->hp.max_grad_norm, lr, s->hp.beta1,
                       s->hp.beta2, s->hp.eps, s->hp.weight_decay, &grad_norm, err));
    tot->grad_norm_sum += grad_norm;
    tot->steps++;
    return SMELT_OK;
}

/* ---- checkpoints ---- */

int critic_save_state(const struct critic *c, const char *dir, struct smelt_error *err) {
    char p[JOB_PATH_BYTES + 192];
    TRY(path_join(p, sizeof p, dir, "critic", err));
    TRY(model_save(c->model, p, false, err)); /* f32: nothing rounded */
    TRY(path_join(p, sizeof p, dir, "critic_optimizer.safetensors", err));
    return optimizer_save(&c->opt, p, err);
}

int critic_restore_state(struct critic *c, const char *dir, struct smelt_error *err) {
    char p[JOB_PATH_BYTES + 192];
    TRY(path_join(p, sizeof p, dir, "critic", err));
    /* Loaded on the host and copied over, as the policy's weights are. */
    struct model *saved;
    TRY(model_load(p, BACKEND_CPU, &saved, err));
    int rc = saved->n_weights == c->model->n_weights
                 ? tensor_copy(&c->model->weights, &saved->weights, err)
                 : error_set(err, SMELT_EINVAL, "%s: the critic's layout differs from this job's", p);
    model_free(saved);
    TRY(rc);
    TRY(path_join(p, sizeof p, dir, "critic_optimizer.safetensors", err));
    return optimizer_load(&c->opt, p, err);
}
