/* The SFT step: micro-batches of packed examples, loss = mean negative logprob of the
 * trained tokens of the whole optimizer step (every trained token weighs the same, in
 * whichever micro-batch it falls); and its validation, the mean token loss. run.c
 * drives the run. */
#include "trainer/trainer_internal.h"

#include <jansson.h>

struct sft_sums {
    double nll;
    int64_t targets, tokens;
};

/* One micro-batch: forward, backward (dL/dlogprob = -1 on every trained token), sums. */
static int sft_pass(struct trainer_run *r, const struct dataset_batch *b, void *ctx, struct smelt_error *err) {
    struct sft_sums *sum = ctx;
    double batch_nll;
    TRY(run_forward_batch(r, b, &batch_nll, err));
    TRY(run_backward_batch(r, b, NULL, err));
    sum->nll += batch_nll;
    sum->targets += b->n_targets;
    sum->tokens += b->n_tokens;
    return SMELT_OK;
}

/* The 1/N of the mean goes into the optimizer's gradient scale, once N is known for the
 * whole step (over every rank: each runs its own micro-batches, dist_mine, and the sums
 * are added before use). */
static int sft_step(struct trainer_run *r, int64_t n_micro, struct step_stats *st,
                    struct smelt_error *err) {
    TRY(tensor_zero(r->grads, err));
    struct sft_sums sum = {0}, pad = {0};
    const struct dataset_batch *b = NULL;
    int64_t done = 0;
    for (int64_t i = 0; i < n_micro; i++) {
        TRY(dataset_loader_next(r->loader, &b, err));
        r->micro_done++;
        if (!dist_mine(&r->dist, i)) continue;
        if (r->lora) lora_set_dropout_seed(r->lora, run_dropout_seed(r, i));
        TRY(sft_pass(r, b, &sum, err));
        done++;
    }
    TRY(zero3_run_pad(r, n_micro, done, b, sft_pass, &pad, err));
    double nll = sum.nll;
    int64_t targets = sum.targets, tokens = sum.tokens;
    if (r->dist.ranks > 1) {
        double sums[3] = {nll, (double)targets, (double)tokens}; /* counts are exact below 2^53 */
        TRY(dist_sum(&r->dist, sums, 3, err));
        nll = sums[0];
        targets = (int64_t)sums[1];
        tokens = (int64_t)sums[2];
    }
    if (targets == 0) return error_set(err, SMELT_EINVAL, "step %lld has no trained token", (long long)r->step + 1);
    st->tokens = tokens;
    st->trained = targets;
    st->loss = nll / (double)targets;
    return run_optimizer_step(r, 1.0 / (double)targets, st, err);
}

static int sft_validate(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err) {
    int64_t n;
    *metrics = NULL;
    TRY(run_eval_loss(r, val_loss, &n, err));
    if (!n) return SMELT_OK;
    *metrics = json_pack("{s:f, s:I}", "val_loss", *val_loss, "val_tokens", (json_int_t)n);
    return *metrics ? SMELT_OK : error_set(err, SMELT_ENOMEM, "metrics: out of memory");
}

const struct run_algo SFT_ALGO = {.step = sft_step, .validate = sft_validate};
