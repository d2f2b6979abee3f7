/* The optimizer step and the validation of the algorithms that train on preference pairs
 * (DPO, the reward model): both run micro-batches of pairs through their own
 * pref_micro_fn, sum struct pref_totals, and report the same TRL-named means, so the
 * server reads one set of names (server/control.c). */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <math.h>

/* The TRL names of the preference metrics, means over the pairs in tot, each name after
 * prefix; the logps only where the objective has them (DPO). */
static json_t *totals_json(const struct pref_totals *t, const char *prefix, enum pref_metrics which) {
    static const char *const names[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                        "rewards/margins", "logps/chosen", "logps/rejected"};
    const double sums[] = {t->reward_chosen, t->reward_rejected, t->correct, t->margin, t->logp_chosen,
                           t->logp_rejected};
    size_t n = which == PREF_METRICS_DPO ? sizeof names / sizeof *names : 4;
    json_t *obj = json_object();
    for (size_t i = 0; obj && i < n; i++) {
        double mean = sums[i] / (double)t->pairs;
        char key[64];
        snprintf(key, sizeof key, "%s%s", prefix, names[i]);
        json_object_set_new(obj, key, isfinite(mean) ? json_real(mean) : json_null());
    }
    return obj;
}

/* The step's totals over every rank (each ran its own micro-batches): counts are exact in
 * a double below 2^53. */
static int sum_over_ranks(struct trainer_run *r, struct pref_totals *t, struct step_stats *st,
                          struct smelt_error *err) {
    double v[10] = {(double)t->pairs, t->loss, t->reward_chosen, t->reward_rejected, t->correct, t->margin,
                    t->logp_chosen, t->logp_rejected, (double)st->tokens, (double)st->trained};
    TRY(dist_sum(&r->dist, v, 10, err));
    *t = (struct pref_totals){.pairs = (int64_t)v[0], .loss = v[1], .reward_chosen = v[2], .reward_rejected = v[3],
                              .correct = v[4], .margin = v[5], .logp_chosen = v[6], .logp_rejected = v[7]};
    st->tokens = (int64_t)v[8];
    st->trained = (int64_t)v[9];
    return SMELT_OK;
}

struct micro_call {
    pref_micro_fn fn;
    struct pref_totals tot;
};

/* A training micro-batch through fn (zero3_run_pad's padding passes). */
static int train_micro(struct trainer_run *r, const struct dataset_batch *b, void *ctx, struct smelt_error *err) {
    struct micro_call *c = ctx;
    return c->fn(r, b, true, &c->tot, err);
}

int pref_step(struct trainer_run *r, int64_t n_micro, pref_micro_fn fn, enum pref_metrics which,
              struct step_stats *st, struct smelt_error *err) {
    TRY(tensor_zero(r->grads, err));
    struct pref_totals tot = {0};
    const struct dataset_batch *b = NULL;
    int64_t done = 0;
    for (int64_t i = 0; i < n_micro; i++) {
        TRY(dataset_loader_next(r->loader, &b, err));
        r->micro_done++;
        if (!dist_mine(&r->dist, i)) continue;
        if (r->lora) lora_set_dropout_seed(r->lora, run_dropout_seed(r, i));
        TRY(fn(r, b, true, &tot, err));
        st->tokens += b->n_tokens;
        st->trained += b->n_targets;
        done++;
    }
    struct micro_call pad = {.fn = fn};
    TRY(zero3_run_pad(r, n_micro, done, b, train_micro, &pad, err));
    if (r->dist.ranks > 1) TRY(sum_over_ranks(r, &tot, st, err));
    if (tot.pairs == 0) return error_set(err, SMELT_EINVAL, "step %lld has no pair", (long long)r->step + 1);
    st->loss = tot.loss / (double)tot.pairs;
    /* The loss is the mean over the step's pairs: 1/pairs scales the summed gradients. */
    TRY(run_optimizer_step(r, 1.0 / (double)tot.pairs, st, err));
    st->metrics = totals_json(&tot, "", which);
    return SMELT_OK;
}

struct validation {
    pref_micro_fn fn;
    struct pref_totals tot;
};

static int add_validation(struct trainer_run *r, const struct dataset_batch *b, void *ctx,
                          struct smelt_error *err) {
    struct validation *v = ctx;
    return v->fn(r, b, false, &v->tot, err);
}

int pref_validate(struct trainer_run *r, pref_micro_fn fn, enum pref_metrics which, void **metrics,
                  double *val_loss, struct smelt_error *err) {
    *metrics = NULL;
    *val_loss = NAN;
    if (!r->val) return SMELT_OK;
    struct validation v = {.fn = fn};
    bool split = run_passes_shared(r);
    TRY(error_wrap(err, run_each_batch(r, r->val, split, add_validation, &v, err), "validation"));
    if (split) {
        struct step_stats unused = {0};
        TRY(error_wrap(err, sum_over_ranks(r, &v.tot, &unused, err), "validation"));
    }
    *val_loss = v.tot.loss / (double)v.tot.pairs;
    json_t *obj = json_pack("{s:o, s:I}", "val_loss", isfinite(*val_loss) ? json_real(*val_loss) : json_null(),
                            "val_pairs", (json_int_t)v.tot.pairs);
    if (obj) json_object_update_new(obj, totals_json(&v.tot, "val_", which));
    *metrics = obj;
    return obj ? SMELT_OK : error_set(err, SMELT_ENOMEM, "metrics: out of memory");
}
