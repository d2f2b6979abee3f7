/* The DPO step and its validation (run.c drives the run). The chosen and rejected
 * responses of a pair go through the model in the same packed batch; each sequence's
 * response logprobs are summed, the pair's loss (preference_loss.h) gives dL/d(sum) for
 * each side, and that coefficient is dL/dlogprob on every response token of the side.
 *
 * The reference is the starting model: the weights as loaded (full fine-tune) or the
 * base with the adapter detached (LoRA), never a second copy of the weights. With
 * precompute_ref it runs once over the training and validation pairs before the first
 * step, and again when a run resumes — it is deterministic, and a full fine-tune
 * restores its trained weights only after it — so checkpoints do not carry it.
 * Otherwise (LoRA only, job_spec.c) it runs on every batch, adapter detached. SimPO and
 * ORPO have none. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <time.h>

#include "common/common.h"

struct dpo_state {
    struct pref_config pref;
    bool needs_ref;
    double *ref_train, *ref_val;  /* [2n] summed reference logprobs by example; NULL: per batch */
    /* Per sequence of the current batch, [max_tokens] each (a sequence has at least a
     * token): views into one allocation, logp's. */
    double *logp, *ref, *coef;
    int64_t *tokens;
};

void dpo_state_free(struct dpo_state *d) {
    if (!d) return;
    free(d->ref_train);
    free(d->ref_val);
    free(d->logp);
    free(d->tokens);
    free(d);
}

/* The summed response logprobs (from the last forward) and response tokens of every
 * sequence of b. */
static void sum_sequences(const struct trainer_run *r, const struct dataset_batch *b, double *logp,
                          int64_t *tokens) {
    for (int s = 0; s < b->n_seqs; s++) {
        double sum = 0;
        int64_t n = 0;
        for (int32_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++)
            if (b->targets[t] >= 0) {
                sum += r->host_logprobs[t];
                n++;
            }
        logp[s] = sum;
        if (tokens) tokens[s] = n;
    }
}

/* The reference's summed logprobs of b's sequences into ref: forward with the adapter
 * detached (the policy's forward must come after, for the backward). */
static int reference_forward(struct trainer_run *r, const struct dataset_batch *b, double *ref,
                             struct smelt_error *err) {
    double nll;
    if (r->lora) lora_detach(r->lora);
    int rc = run_forward_batch(r, b, &nll, err);
    if (r->lora) {
        int arc = lora_attach(r->lora, err);
        if (!rc) rc = arc;
    }
    if (rc) return rc;
    sum_sequences(r, b, ref, NULL);
    return SMELT_OK;
}

static int store_reference(struct trainer_run *r, const struct dataset_batch *b, void *ctx,
                           struct smelt_error *err) {
    double *stored = ctx;
    TRY(reference_forward(r, b, r->dpo->ref, err));
    for (int s = 0; s < b->n_seqs; s++) stored[b->rows[s]] = r->dpo->ref[s];
    return SMELT_OK;
}

/* Every rank's share of the reference logprobs into every rank's out: each value was
 * computed by one rank and is 0 on the others, so the sums are that value exactly. */
static int share_references(struct trainer_run *r, double *out, int64_t n, struct smelt_error *err) {
    enum { CHUNK = 1 << 20 };
    for (int64_t at = 0; at < n; at += CHUNK)
        TRY(dist_sum(&r->dist, out + at, (int)(n - at < CHUNK ? n - at : CHUNK), err));
    return SMELT_OK;
}

/* Precomputes the reference over ds: *out[2n], by example (shared over the ranks when
 * run_passes_shared: each computes its share of the batches). */
static int reference_pass(struct trainer_run *r, const struct dataset *ds, double **out, struct smelt_error *err) {
    bool shared = run_passes_shared(r);
    *out = calloc((size_t)(2 * ds->n), sizeof **out);
    if (!*out) return error_set(err, SMELT_ENOMEM, "reference logprobs: out of memory");
    int rc = run_each_batch(r, ds, shared, store_reference, *out, err);
    if (!rc && shared) rc = share_references(r, *out, 2 * ds->n, err);
    return error_wrap(err, rc, "reference logprobs of %s", ds->path);
}

static int dpo_prepare(struct trainer_run *r, struct smelt_error *err) {
    struct dpo_state *d = calloc(1, sizeof *d);
    if (!d) return error_set(err, SMELT_ENOMEM, "dpo: out of memory");
    r->dpo = d;
    job_pref_config(r->spec, &d->pref);
    d->needs_ref = pref_loss_needs_reference(d->pref.type);
    size_t n = (size_t)r->max_tokens;
    d->logp = calloc(3 * n, sizeof *d->logp); /* ref stays 0 for a loss without a reference */
    d->tokens = malloc(n * sizeof *d->tokens);
    if (!d->logp || !d->tokens) return error_set(err, SMELT_ENOMEM, "dpo: out of memory");
    d->ref = d->logp + n;
    d->coef = d->logp + 2 * n;
    if (!d->needs_ref || !r->spec->hp.precompute_ref) return SMELT_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    TRY(reference_pass(r, r->train, &d->ref_train, err));
    if (r->val) TRY(reference_pass(r, r->val, &d->ref_val, err));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    log_info("reference logprobs of %lld pairs in %.1f s", (long long)(r->train->n + (r->val ? r->val->n : 0)),
             (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return SMELT_OK;
}

/* Pairs k of b: sequences 2k (chosen) and 2k + 1 (rejected), the datasets' layout. */
static void pair_losses(struct dpo_state *d, const struct dataset_batch *b, struct pref_totals *tot) {
    for (int s = 0; s + 1 < b->n_seqs; s += 2) {
        SMELT_ASSERT(b->rows[s] % 2 == 0 && b->rows[s + 1] == b->rows[s] + 1);
        struct pref_pair p = {.policy_chosen = d->logp[s], .policy_rejected = d->logp[s + 1],
                              .ref_chosen = d->ref[s], .ref_rejected = d->ref[s + 1],
                              .n_chosen = d->tokens[s], .n_rejected = d->tokens[s + 1]};
        struct pref_result res;
        pref_pair_loss(&d->pref, &p, &res);
        d->coef[s] = res.d_chosen;
        d->coef[s + 1] = res.d_rejected;
        tot->pairs++;
        tot->loss += res.loss;
        tot->reward_chosen += res.reward_chosen;
        tot->reward_rejected += res.reward_rejected;
        tot->correct += res.reward_chosen > res.reward_rejected;
        tot->margin += res.reward_chosen - res.reward_rejected;
        tot->logp_chosen += p.policy_chosen;
        tot->logp_rejected += p.policy_rejected;
    }
}

int dpo_micro_batch(struct trainer_run *r, const struct dataset_batch *b, bool train, struct pref_totals *tot,
                    struct smelt_error *err) {
    struct dpo_state *d = r->dpo;
    const double *stored = train ? d->ref_train : d->ref_val;
    if (d->needs_ref && stored)
        for (int s = 0; s < b->n_seqs; s++) d->ref[s] = stored[b->rows[s]];
    else if (d->needs_ref)
        TRY(reference_forward(r, b, d->ref, err));
    double nll;
    TRY(run_forward_batch(r, b, &nll, err));
    sum_sequences(r, b, d->logp, d->tokens);
    pair_losses(d, b, tot);
    return train ? run_backward_batch(r, b, d->coef, err) : SMELT_OK;
}

static int dpo_step(struct trainer_run *r, int64_t n_micro, struct step_stats *st, struct smelt_error *err) {
    return pref_step(r, n_micro, dpo_micro_batch, PREF_METRICS_DPO, st, err);
}

static int dpo_validate(struct trainer_run *r, void **metrics, double *val_loss, struct smelt_error *err) {
    return pref_validate(r, dpo_micro_batch, PREF_METRICS_DPO, metrics, val_loss, err);
}

const struct run_algo DPO_ALGO = {.prepare = dpo_prepare, .step = dpo_step, .validate = dpo_validate};
