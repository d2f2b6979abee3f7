/* One packed batch through the model: the forward to token logprobs (copied to the
 * host), and the backward from a per-sequence coefficient on every trained token —
 * the shape every token-logprob objective takes (docs/architecture.md §4) — or from
 * any dL/dlogprob per token (the RL losses). */
#include "trainer/trainer_internal.h"

struct model_batch run_model_batch(const struct dataset_batch *b) {
    return (struct model_batch){.n_tokens = b->n_tokens, .n_seqs = b->n_seqs, .ids = b->ids,
                                .cu_seqlens = b->cu_seqlens, .targets = b->targets};
}

int run_forward_batch(struct trainer_run *r, const struct dataset_batch *b, double *nll,
                      struct smelt_error *err) {
    struct model_batch mb = run_model_batch(b);
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

int run_backward_batch(struct trainer_run *r, const struct dataset_batch *b, const double *coef,
                       struct smelt_error *err) {
    float *d = r->host_logprobs; /* the forward's logprobs are read by now */
    for (int s = 0; s < b->n_seqs; s++) {
        float c = coef ? (float)coef[s] : -1.0f;
        for (int32_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++) d[t] = b->targets[t] >= 0 ? c : 0.0f;
    }
    return run_backward_tokens(r, b, d, err);
}

int run_backward_tokens(struct trainer_run *r, const struct dataset_batch *b, const float *dlogp,
                        struct smelt_error *err) {
    int64_t T = b->n_tokens;
    struct tensor host = tensor_f32((float *)dlogp, 1, &T);
    struct tensor dev = tensor_make(r->dlogprobs.backend, DTYPE_F32, r->dlogprobs.data, 1, &T);
    /* A stage-3 padding pass adds nothing: zero dL/dlogprob, so zero gradients. */
    TRY(r->pad_pass ? tensor_zero(&dev, err) : tensor_copy(&dev, &host, err));
    return model_backward(r->model, r->acts, &dev, NULL, err);
}
