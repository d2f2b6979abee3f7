/* Evaluation: mean token loss on the validation split, and greedy exact-match accuracy
 * (does the model, given an example's prompt, produce exactly its first trained span?). */
#include "trainer/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int run_forward_batch(struct trainer_run *r, const struct dataset_batch *b, double *nll,
                      struct smelt_error *err) {
    struct model_batch mb = {.n_tokens = b->n_tokens, .n_seqs = b->n_seqs, .ids = b->ids,
                             .cu_seqlens = b->cu_seqlens, .targets = b->targets};
    int64_t T = b->n_tokens;
    struct tensor lp = tensor_make(r->logprobs.backend, DTYPE_F32, r->logprobs.data, 1, &T);
    int rc = model_forward(r->model, r->acts, &mb, &lp, NULL, NULL, err);
    if (rc) return rc;
    struct tensor host = tensor_f32(r->host_logprobs, 1, &T);
    rc = tensor_copy(&host, &lp, err);
    if (rc) return rc;
    double sum = 0;
    for (int64_t t = 0; t < T; t++)
        if (b->targets[t] >= 0) sum -= r->host_logprobs[t];
    *nll = sum;
    return SMELT_OK;
}

int run_eval_loss(struct trainer_run *r, double *loss, int64_t *n_tokens, struct smelt_error *err) {
    *loss = NAN;
    *n_tokens = 0;
    if (!r->val) return SMELT_OK;
    const struct job_spec *s = r->spec;
    struct dataset_loader_config lc = {.batch_size = (int)s->hp.batch_size,
                                       .max_tokens = s->hp.batch_tokens, .shuffle = false};
    struct dataset_loader *loader;
    int rc = dataset_loader_create(r->val, &lc, &loader, err);
    if (rc) return error_wrap(err, rc, "validation data");
    if (r->lora) lora_set_training(r->lora, false);
    double total = 0;
    int64_t count = 0, n = dataset_loader_batches_in_epoch(loader, 0);
    for (int64_t i = 0; i < n && !rc; i++) {
        const struct dataset_batch *b;
        double nll = 0;
        rc = dataset_loader_next(loader, &b, err);
        if (!rc) rc = run_forward_batch(r, b, &nll, err);
        total += nll;
        count += rc ? 0 : b->n_targets;
    }
    if (r->lora) lora_set_training(r->lora, true);
    dataset_loader_free(loader);
    if (rc) return error_wrap(err, rc, "validation loss");
    *loss = count ? total / (double)count : NAN;
    *n_tokens = count;
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
    for (int64_t i = 0; i < r->val->n && done < n_examples && !rc; i++) {
        const struct dataset_example *e = &r->val->examples[i];
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
