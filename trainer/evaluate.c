/* Evaluation: mean token loss on the validation split, and greedy exact-match accuracy
 * (does the model, given an example's prompt, produce exactly its first trained span —
 * for preference data, its chosen response?). */
#include "trainer/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

bool run_passes_shared(const struct trainer_run *r) { return r->dist.ranks > 1 && !r->zero3 && !r->rl; }

int run_each_batch(struct trainer_run *r, const struct dataset *ds, bool mine_only, run_batch_fn fn, void *ctx,
                   struct smelt_error *err) {
    struct dataset_loader_config lc = {.batch_size = (int)r->spec->hp.batch_size,
                                       .max_tokens = r->spec->hp.batch_tokens, .shuffle = false};
    struct dataset_loader *loader;
    TRY(dataset_loader_create(ds, &lc, &loader, err));
    int64_t n = dataset_loader_batches_in_epoch(loader, 0);
    int rc = n < 0 ? error_set(err, SMELT_ENOMEM, "%s: out of memory", ds->path) : SMELT_OK;
    if (r->lora) lora_set_training(r->lora, false);
    for (int64_t i = 0; i < n && !rc; i++) {
        const struct dataset_batch *b;
        rc = dataset_loader_next(loader, &b, err);
        if (!rc && (!mine_only || dist_mine(&r->dist, i))) rc = fn(r, b, ctx, err);
    }
    if (r->lora) lora_set_training(r->lora, true);
    dataset_loader_free(loader);
    return rc;
}

struct nll_sum {
    double total;
    int64_t count;
};

static int add_nll(struct trainer_run *r, const struct dataset_batch *b, void *ctx, struct smelt_error *err) {
    struct nll_sum *sum = ctx;
    double nll;
    TRY(run_forward_batch(r, b, &nll, err));
    sum->total += nll;
    sum->count += b->n_targets;
    return SMELT_OK;
}

int run_eval_loss(struct trainer_run *r, double *loss, int64_t *n_tokens, struct smelt_error *err) {
    *loss = NAN;
    *n_tokens = 0;
    if (!r->val) return SMELT_OK;
    struct nll_sum sum = {0};
    bool split = run_passes_shared(r);
    TRY(error_wrap(err, run_each_batch(r, r->val, split, add_nll, &sum, err), "validation loss"));
    if (split) {
        double v[2] = {sum.total, (double)sum.count}; /* the count is exact below 2^53 */
        TRY(error_wrap(err, dist_sum(&r->dist, v, 2, err), "validation loss"));
        sum = (struct nll_sum){.total = v[0], .count = (int64_t)v[1]};
    }
    *loss = sum.count ? sum.total / (double)sum.count : NAN;
    *n_tokens = sum.count;
    return SMELT_OK;
}

/* The first run of trained tokens after the prompt: what generation must reproduce. */
static int32_t reference_end(const struct dataset_example *e) {
    int32_t end = e->n_prompt;
    while (end < e->n && e->mask[end]) end++;
    return end;
}

int run_accuracy(struct trainer_run *r, int64_t n_examples, double *accuracy, int64_t *n_done,
                 struct smelt_error *err) {
    *accuracy = NAN;
    *n_done = 0;
    if (!r->val || n_examples <= 0) return SMELT_OK;
    const struct tokenizer_specials *sp = tokenizer_special_ids(r->tok);
    /* Stop at the tokenizer's eos and the model config's eos ids. */
    int32_t stop[MODEL_CONFIG_MAX_EOS + 1];
    int n_stop = 0;
    if (sp->eos >= 0) stop[n_stop++] = sp->eos;
    for (int i = 0; i < r->model->config.n_eos_token_ids; i++) {
        int32_t id = (int32_t)r->model->config.eos_token_ids[i];
        bool seen = false;
        for (int j = 0; j < n_stop; j++) seen |= stop[j] == id;
        if (!seen) stop[n_stop++] = id;
    }
    if (r->lora) lora_set_training(r->lora, false);
    int64_t correct = 0, done = 0;
    int rc = SMELT_OK;
    /* Preference data: the chosen responses (examples 2i) are the ones to reproduce. */
    int64_t stride = r->val->kind == DATASET_PREFERENCE ? 2 : 1;
    for (int64_t i = 0; i < r->val->n && done < n_examples && !rc; i++) {
        const struct dataset_example *e = &r->val->examples[i * stride];
        int32_t end = reference_end(e), want = end - e->n_prompt;
        if (want <= 0 || e->n_prompt < 1) continue;
        int64_t limit = want < r->spec->eval.max_new_tokens ? want : r->spec->eval.max_new_tokens;
        struct generate_params gp = {.max_new_tokens = limit, .temperature = 0, .top_p = 1,
                                     .stop_ids = stop, .n_stop_ids = n_stop};
        struct generate_result g = {0};
        rc = model_generate_reference(r->model, e->ids, e->n_prompt, &gp, &g, err);
        if (rc) break;
        bool same = g.n == want && memcmp(g.ids, e->ids + e->n_prompt, (size_t)want * sizeof *g.ids) == 0;
        correct += same;
        done++;
        if (done <= 3 && !r->quiet) {
            char *got = NULL, *ref = NULL;
            size_t gl = 0, rl = 0;
            struct smelt_error ignore = {0};
            if (!tokenizer_decode(r->tok, g.ids, (size_t)g.n, true, &got, &gl, &ignore) &&
                !tokenizer_decode(r->tok, e->ids + e->n_prompt, (size_t)want, true, &ref, &rl, &ignore))
                log_info("sample %lld (line %lld): generated \"%s\", reference \"%s\"%s", (long long)done,
                         (long long)e->line, got, ref, same ? "" : " (wrong)");
            free(got);
            free(ref);
        }
        generate_result_free(&g);
    }
    if (r->lora) lora_set_training(r->lora, true);
    if (rc) return error_wrap(err, rc, "accuracy");
    *n_done = done;
    *accuracy = done ? (double)correct / (double)done : NAN;
    return SMELT_OK;
}
