/* The reward-model step (run.c drives the run, preference_step.c the step's loop): the
 * chosen and rejected responses of a pair go through the model in the same packed
 * batch, the score head (model/score_head.h) reads one scalar per sequence from the
 * final hidden states, and the pair's Bradley-Terry loss (reward_pair_loss, with the
 * row's margin and center_rewards_coefficient) gives dL/dscore for each side. The
 * backward runs the head's, then the body's from dL/dhidden.
 *
 * Full fine-tune: the head is "score.weight" in the model's flat buffer, so the
 * optimizer, checkpoints and model_save treat it like any weight, and the output is a
 * sequence-classification model directory. LoRA: the adapter, created on the
 * classifier, carries a copy of the head in its own flat buffer (PEFT's SEQ_CLS
 * modules_to_save, lora/lora.h) and scores with it while attached, so the head's
 * gradient goes to lora->score_grad and it trains, checkpoints (moments included) and
 * saves with the LoRA matrices; the base stays as loaded, its head included. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>

#include "common/common.h"
#include "model/score_head.h"

/* transformers' initializer_range in every supported config class. */
#define SCORE_INIT_STD 0.02

struct reward_state {
    struct tensor hidden, dhidden;  /* f32 [max_tokens, C] */
    struct tensor scores, dscores;  /* f32 [max_tokens]: a sequence has at least a token */
    float *host;                    /* [max_tokens]: scores, then dL/dscore */
};

void reward_state_free(struct reward_state *s) {
    if (!s) return;
    tensor_free(&s->hidden);
    tensor_free(&s->dhidden);
    tensor_free(&s->scores);
    tensor_free(&s->dscores);
    free(s->host);
    free(s);
}

int reward_model_prepare_model(struct trainer_run *r, struct smelt_error *err) {
    if (r->model->config.score_head) return SMELT_OK;
    int64_t pad = tokenizer_special_ids(r->tok)->pad;
    struct model *rm;
    TRY(error_wrap(err, model_classifier_from_lm(r->model, pad, SCORE_INIT_STD, r->spec->seed ^ 0x5c0be4ea5u, &rm, err),
                   "reward model from %s", r->spec->model));
    model_free(r->model);
    r->model = rm;
    return SMELT_OK;
}

static int reward_prepare(struct trainer_run *r, struct smelt_error *err) {
    /* lora_create gives an adapter on a classifier its head (run_setup made one). */
    SMELT_ASSERT(!r->lora || r->lora->score.data);
    struct reward_state *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, SMELT_ENOMEM, "reward model: out of memory");
    r->reward = s;
    enum backend be = r->model->backend;
    int64_t shape[2] = {r->max_tokens, r->model->config.hidden_size};
    TRY(tensor_alloc(&s->hidden, be, DTYPE_F32, 2, shape, err));
    TRY(tensor_alloc(&s->dhidden, be, DTYPE_F32, 2, shape, err));
    TRY(tensor_alloc(&s->scores, be, DTYPE_F32, 1, shape, err));
    TRY(tensor_alloc(&s->dscores, be, DTYPE_F32, 1, shape, err));
    s->host = malloc((size_t)r->max_tokens * sizeof *s->host);
    return s->host ? SMELT_OK : error_set(err, SMELT_ENOMEM, "reward model: out of memory");
}

/* A view of the first rows of t, sized for this batch (the kernels read shapes). */
static struct tensor rows_of(const struct tensor *t, int64_t rows) {
    int64_t shape[2] = {rows, t->ndim > 1 ? t->shape[1] : 1};
    return tensor_make(t->backend, DTYPE_F32, t->data, t->ndim, shape);
}

/* Pairs k of b: sequences 2k (chosen) and 2k + 1 (rejected). Replaces the scores in
 * host by dL/dscore. */
static void pair_losses(struct trainer_run *r, const struct dataset *ds, const struct dataset_batch *b,
                        float *host, struct pref_totals *tot) {
    double center = r->spec->hp.center_rewards_coefficient;
    for (int s = 0; s + 1 < b->n_seqs; s += 2) {
        SMELT_ASSERT(b->rows[s] % 2 == 0 && b->rows[s + 1] == b->rows[s] + 1);
        double chosen = host[s], rejected = host[s + 1];
        struct reward_pair_result res;
        reward_pair_loss(chosen, rejected, ds->examples[b->rows[s]].margin, center, &res);
        host[s] = (float)res.d_chosen;
        host[s + 1] = (float)res.d_rejected;
        tot->pairs++;
        tot->loss += res.loss;
        tot->reward_chosen += chosen;
        tot->reward_rejected += rejected;
        tot->correct += chosen > rejected;
        tot->margin += chosen - rejected;
    }
}

/* The scores of b's sequences from the final hidden states into s->host. The head is
 * read outside the model's passes: under a parameter provider (ZeRO-3) its unit is
 * acquired around the read (no-ops without one). */
static int score_forward(struct trainer_run *r, const struct model_batch *mb, const struct tensor *hidden,
                         struct smelt_error *err) {
    struct reward_state *s = r->reward;
    int64_t head = model_unit_head(r->model), S = mb->n_seqs;
    struct tensor scores = rows_of(&s->scores, S), host = tensor_f32(s->host, 1, &S);
    TRY(model_unit_acquire(r->model, head, false, err));
    int rc = model_score_forward(r->model, mb, hidden, &scores, err);
    struct smelt_error rerr = {0};
    int rrc = model_unit_release(r->model, head, rc ? &rerr : err);
    TRY(rc ? rc : rrc);
    return tensor_copy(&host, &scores, err);
}

/* The head's backward from dL/dscore (s->host), then the body's. The head's unit stays
 * held across both: its gradient (a full fine-tune's score.weight) is in the unit the
 * body's backward reduces once its final norm is done. */
static int score_backward(struct trainer_run *r, const struct model_batch *mb, const struct tensor *hidden,
                          struct smelt_error *err) {
    struct reward_state *s = r->reward;
    int64_t head = model_unit_head(r->model), S = mb->n_seqs;
    struct tensor host = tensor_f32(s->host, 1, &S);
    struct tensor dscores = rows_of(&s->dscores, S), dhidden = rows_of(&s->dhidden, mb->n_tokens);
    /* A stage-3 padding pass adds nothing: zero dL/dscore, so zero gradients. */
    TRY(r->pad_pass ? tensor_zero(&dscores, err) : tensor_copy(&dscores, &host, err));
    struct tensor *dhead = r->lora ? &r->lora->score_grad : &r->model->g.score;
    TRY(model_unit_acquire(r->model, head, true, err));
    int rc = model_score_backward(r->model, mb, hidden, &dscores, dhead, &dhidden, err);
    if (!rc) rc = model_backward(r->model, r->acts, NULL, &dhidden, err);
    struct smelt_error rerr = {0};
    int rrc = model_unit_release(r->model, head, rc ? &rerr : err);
    return rc ? rc : rrc;
}

int reward_micro_batch(struct trainer_run *r, const struct dataset_batch *b, bool train,
                       struct pref_totals *tot, struct smelt_error *err) {
    struct reward_state *s = r->reward;
    struct model_batch mb = run_model_batch(b);
    struct tensor hidden = rows_of(&s->hidden, b->n_tokens);
    TRY(model_forward(r->model, r->acts, &mb, NULL, NULL, &hidden, err));
    TRY(score_forward(r, &mb, &hidden, err));
    pair_losses(r, train ? r->train : r->val, b, s->host, tot);
    return train ? score_backward(r, &mb, &hidden, err) : SMELT_OK;
}

static int reward_step(struct trainer_run *r, int64_t n_micro, struct step_stats *st, struct smelt_error *err) {
    return pref_step(r, n_micro, reward_micro_batch, PREF_METRICS_REWARD, st, err);
}

static int reward_validate(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err) {
    return pref_validate(r, reward_micro_batch, PREF_METRICS_REWARD, metrics, val_loss, err);
}

const struct run_algo REWARD_ALGO = {.prepare = reward_prepare, .step = reward_step, .validate = reward_validate};
