/* The reference generator: the whole sequence through the model for every token. */
#include "model/generate.h"
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static struct sample_params sample_params_of(const struct generate_params *p) {
    return (struct sample_params){.temperature = p->temperature, .top_k = p->top_k,
                                  .top_p = p->top_p, .min_p = p->min_p};
}

static int check_params(const struct generate_params *p, struct smelt_error *err) {
    if (p->max_new_tokens < 1)
        return error_set(err, SMELT_EINVAL, "max_new_tokens must be >= 1 (got %lld)", (long long)p->max_new_tokens);
    struct sample_params sp = sample_params_of(p);
    int rc = sample_params_check(&sp, err);
    if (rc) return rc;
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return error_set(err, SMELT_EINVAL, "stop_ids: %d given without the array", p->n_stop_ids);
    return SMELT_OK;
}

void generate_result_free(struct generate_result *r) {
    if (!r) return;
    free(r->ids);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}

int model_generate_reference(struct model *m, const int32_t *prompt, int64_t n_prompt,
                             const struct generate_params *p, struct generate_result *out,
                             struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_params(p, err);
    if (rc) return rc;
    if (!m->w.lm_head.data)
        return error_set(err, SMELT_EINVAL, "generate: %s is a sequence classifier (no lm_head): it "
                         "scores text, it does not generate", m->config.architecture);
    int64_t ctx = m->config.max_seq_len, V = m->config.vocab_size, C = m->config.hidden_size;
    if (n_prompt < 1) return error_set(err, SMELT_EINVAL, "prompt is empty");
    if (n_prompt >= ctx)
        return error_set(err, SMELT_EINVAL, "prompt has %lld tokens; the model's context is %lld",
                         (long long)n_prompt, (long long)ctx);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return error_set(err, SMELT_EINVAL, "prompt token %lld is %d, outside the vocabulary [0, %lld)",
                             (long long)i, prompt[i], (long long)V);
    int64_t max_total = n_prompt + p->max_new_tokens < ctx ? n_prompt + p->max_new_tokens : ctx;
    /* The final hidden states and the last row's logits stay on the model's backend;
     * only the V logits the sampler reads come back to the host, once per token. */
    int32_t *seq = malloc((size_t)max_total * sizeof *seq);
    float *logits = malloc((size_t)V * sizeof *logits);
    struct sample_candidate *work = malloc((size_t)V * sizeof *work);
    struct sample_params sp = sample_params_of(p);
    out->ids = malloc((size_t)p->max_new_tokens * sizeof *out->ids);
    out->logprobs = malloc((size_t)p->max_new_tokens * sizeof *out->logprobs);
    struct model_acts *acts = NULL;
    struct tensor hidden = {0}, dev_logits = {0};
    if (!seq || !logits || !work || !out->ids || !out->logprobs)
        rc = error_set(err, SMELT_ENOMEM, "generate: out of memory");
    int64_t hidden_shape[2] = {max_total, C}, logits_shape[2] = {1, V};
    if (!rc) rc = tensor_alloc(&hidden, m->backend, DTYPE_F32, 2, hidden_shape, err);
    if (!rc) rc = tensor_alloc(&dev_logits, m->backend, DTYPE_F32, 2, logits_shape, err);
    if (!rc) rc = model_acts_alloc(m, max_total, false, &acts, err);
    if (!rc) memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    struct rng rng;
    rng_seed(&rng, p->seed);
    int64_t n = n_prompt;
    out->finish_reason = GENERATE_FINISH_LENGTH;
    while (!rc && out->n < p->max_new_tokens && n < ctx) {
        int32_t cu[2] = {0, (int32_t)n};
        struct model_batch b = {.n_tokens = n, .n_seqs = 1, .ids = seq, .cu_seqlens = cu};
        int64_t hs[2] = {n, C}, one[2] = {1, C};
        struct tensor th = tensor_make(hidden.backend, DTYPE_F32, hidden.data, 2, hs);
        rc = model_forward(m, acts, &b, NULL, NULL, &th, err);
        if (rc) break;
        /* Only the last position's logits are needed. */
        struct tensor last = tensor_make(hidden.backend, DTYPE_F32, (float *)hidden.data + (n - 1) * C, 2, one);
        struct tensor host_logits = tensor_f32(logits, 2, logits_shape);
        rc = model_lm_head_forward(m, n - 1, &dev_logits, &last, err);
        if (!rc) rc = tensor_copy(&host_logits, &dev_logits, err);
        if (rc) break;
        int32_t tok = sample_token(logits, V, &sp, &rng, work);
        out->ids[out->n] = tok;
        out->logprobs[out->n] = sample_logprob(logits, V, tok);
        out->n++;
        seq[n++] = tok;
        bool stop = false;
        for (int i = 0; i < p->n_stop_ids; i++) stop |= tok == p->stop_ids[i];
        if (stop) {
            out->finish_reason = GENERATE_FINISH_STOP;
            break;
        }
    }
    model_acts_free(acts);
    tensor_free(&hidden);
    tensor_free(&dev_logits);
    free(seq), free(logits), free(work);
    if (rc) generate_result_free(out);
    return rc;
}
