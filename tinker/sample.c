/* sample: one prompt x num_samples through the rollout engine on the shared base, with
 * the chosen adapter attached (a live model's, a sampler checkpoint's cached by path, or
 * none), and the prompt's own logprobs from model_forward when asked. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tinker/tinker_internal.h"

/* A sampler checkpoint's adapter, loaded on first use and kept. */
static int cached_adapter(struct tinker_worker *w, const char *path, struct lora **out, struct smelt_error *err) {
    for (struct tinker_cached_adapter *a = w->adapters; a; a = a->next)
        if (strcmp(a->path, path) == 0) return (*out = a->lora), SMELT_OK;
    TRY(tinker_path_check(path, "adapter_path", err));
    struct tinker_cached_adapter *a = calloc(1, sizeof *a);
    if (!a) return error_set(err, SMELT_ENOMEM, "adapter_path: out of memory");
    int rc = lora_load(w->base, path, &a->lora, err);
    if (rc) {
        free(a);
        char why[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", err->message);
        return error_set_field(err, rc == SMELT_EIO ? SMELT_ENOTFOUND : rc, "adapter_path", "adapter_path: %s", why);
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    a->next = w->adapters;
    w->adapters = a;
    *out = a->lora;
    return SMELT_OK;
}

static int pick_adapter(struct tinker_worker *w, const json_t *h, struct lora **out, struct smelt_error *err) {
    *out = NULL;
    const json_t *id = json_object_get(h, "model_id"), *path = json_object_get(h, "adapter_path");
    bool has_id = id && !json_is_null(id), has_path = path && !json_is_null(path);
    if (has_id && has_path)
        return error_set_field(err, SMELT_EINVAL, "adapter_path", "adapter_path: give model_id or adapter_path, not both");
    if (has_id) {
        struct tinker_model *m;
        TRY(tinker_model_of(w, h, &m, err));
        *out = m->lora;
        return SMELT_OK;
    }
    if (!has_path) return SMELT_OK;
    if (!json_is_string(path))
        return error_set_field(err, SMELT_EINVAL, "adapter_path", "adapter_path: must be a string");
    return cached_adapter(w, json_string_value(path), out, err);
}

static int stop_lists(const json_t *h, const struct model *base, struct rollout_request *r, struct smelt_error *err) {
    const json_t *ids = json_object_get(h, "stop_token_ids"), *strs = json_object_get(h, "stop_strings");
    size_t i;
    const json_t *v;
    json_array_foreach(ids, i, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= base->config.vocab_size || r->n_stop_ids >= ROLLOUT_MAX_STOP)
            return error_set_field(err, SMELT_EINVAL, "stop_token_ids", "stop_token_ids[%zu]: a token id in 0..%lld, "
                                   "at most %d", i, (long long)base->config.vocab_size - 1, ROLLOUT_MAX_STOP);
        r->stop_ids[r->n_stop_ids++] = (int32_t)id;
    }
    json_array_foreach(strs, i, v) {
        if (!json_is_string(v) || r->n_stop_strings >= ROLLOUT_MAX_STOP)
            return error_set_field(err, SMELT_EINVAL, "stop_strings", "stop_strings[%zu]: a string, at most %d", i,
                                   ROLLOUT_MAX_STOP);
        r->stop_strings[r->n_stop_strings++] = json_string_value(v);
    }
    /* The model's eos ends a sample too ("stop"), as smelt-rollout does by default. */
    for (int e = 0; e < base->config.n_eos_token_ids && r->n_stop_ids < ROLLOUT_MAX_STOP; e++) {
        bool have = false;
        for (int k = 0; k < r->n_stop_ids; k++) have |= r->stop_ids[k] == base->config.eos_token_ids[e];
        if (!have) r->stop_ids[r->n_stop_ids++] = (int32_t)base->config.eos_token_ids[e];
    }
    return SMELT_OK;
}

static int request_parse(struct tinker_worker *w, const struct msg *m, struct rollout_request *r, bool *plp,
                         struct smelt_error *err) {
    const json_t *h = m->header;
    int64_t n, max_tokens, top_k, seed, topk_plp;
    double temperature, top_p;
    int rc = json_field_int(h, "num_samples", false, 1, 1, 256, &n, "request", err);
    if (!rc) rc = json_field_int(h, "max_tokens", true, 0, 1, w->base->config.max_seq_len, &max_tokens, "request", err);
    if (!rc) rc = json_field_double(h, "temperature", false, 1.0, 0.0, 1e6, &temperature, "request", err);
    if (!rc) rc = json_field_int(h, "top_k", false, 0, INT64_MIN, INT64_MAX, &top_k, "request", err);
    if (!rc) rc = json_field_double(h, "top_p", false, 1.0, 1e-9, 1.0, &top_p, "request", err);
    if (!rc) rc = json_field_int(h, "seed", false, -1, -1, INT64_MAX, &seed, "request", err);
    if (!rc) rc = json_field_bool(h, "prompt_logprobs", false, false, plp, "request", err);
    if (!rc) rc = json_field_int(h, "topk_prompt_logprobs", false, 0, 0, 1 << 20, &topk_plp, "request", err);
    if (rc) return rc;
    if (topk_plp > 0)
        return error_set_field(err, SMELT_EUNSUPPORTED, "topk_prompt_logprobs",
                               "topk_prompt_logprobs: not supported by this worker yet");
    if (m->n_arrays < 1 || m->arrays[0].bytes < 4 || m->arrays[0].bytes % 4)
        return error_set_field(err, SMELT_EINVAL, "prompt", "prompt: frame 2 must hold at least one int32 token");
    r->prompt = m->arrays[0].data;
    r->n_prompt = (int64_t)(m->arrays[0].bytes / 4);
    for (int64_t t = 0; t < r->n_prompt; t++)
        if (r->prompt[t] < 0 || r->prompt[t] >= w->base->config.vocab_size)
            return error_set_field(err, SMELT_EINVAL, "prompt", "prompt.tokens[%lld]: token id %d outside the "
                                   "vocabulary (0..%lld)", (long long)t, r->prompt[t],
                                   (long long)w->base->config.vocab_size - 1);
    r->n = (int)n, r->max_new_tokens = max_tokens;
    r->sampling = (struct sample_params){.temperature = (float)temperature, .top_k = top_k > 0 ? top_k : 0,
                                         .top_p = (float)top_p};
    r->seed = seed >= 0 ? (uint64_t)seed : rng_next(&w->rng);
    r->id = ++w->next_request;
    return stop_lists(h, w->base, r, err);
}

/* Every sample of the request, by sample index. */
static int run_engine(struct tinker_worker *w, const struct rollout_request *r, struct rollout_result *res,
                      struct smelt_error *err) {
    TRY(rollout_engine_add(w->engine, r, err));
    int got = 0, rc = SMELT_OK;
    while (!rc && !rollout_engine_idle(w->engine)) {
        rc = rollout_engine_step(w->engine, err);
        struct rollout_result *done = NULL;
        int n = 0;
        if (!rc) rc = rollout_engine_take(w->engine, &done, &n, err);
        for (int i = 0; i < n; i++) {
            if (!rc && done[i].sample_index >= 0 && done[i].sample_index < r->n && got < r->n) {
                res[done[i].sample_index] = done[i];
                done[i] = (struct rollout_result){0};
                got++;
            }
        }
        rollout_results_free(done, n);
    }
    if (rc) { /* the engine failed: nothing of this request may linger */
        rollout_engine_abort(w->engine, r->id);
        struct rollout_result *rest = NULL;
        int n = 0;
        if (!rollout_engine_take(w->engine, &rest, &n, &(struct smelt_error){0})) rollout_results_free(rest, n);
        return rc;
    }
    if (got != r->n) return error_set(err, SMELT_EBACKEND, "sample: the engine finished %d of %d samples", got, r->n);
    return SMELT_OK;
}

/* log p(prompt[t] | prompt[<t]) for t >= 1; out[0] is NaN. */
static int prompt_logprobs(struct model *base, const int32_t *ids, int64_t n, float *out, struct smelt_error *err) {
    out[0] = NAN;
    if (n < 2) return SMELT_OK;
    int64_t T = n;
    int32_t cu[2] = {0, (int32_t)n}, *targets = malloc((size_t)n * sizeof *targets);
    struct model_acts *acts = NULL;
    struct tensor lp = {0};
    if (!targets) return error_set(err, SMELT_ENOMEM, "prompt_logprobs: out of memory");
    for (int64_t t = 0; t < n; t++) targets[t] = t + 1 < n ? ids[t + 1] : -1;
    struct model_batch b = {.n_tokens = T, .n_seqs = 1, .ids = ids, .cu_seqlens = cu, .targets = targets};
    int rc = model_acts_alloc(base, T, false, &acts, err);
    if (!rc) rc = tensor_alloc(&lp, base->backend, DTYPE_F32, 1, &T, err);
    if (!rc) rc = model_forward(base, acts, &b, &lp, NULL, NULL, err);
    int64_t n1 = n - 1;
    struct tensor host = tensor_f32(out + 1, 1, &n1), src = lp;
    src.shape[0] = n1;
    if (!rc) rc = tensor_copy(&host, &src, err);
    tensor_free(&lp);
    model_acts_free(acts);
    free(targets);
    return rc;
}

/* {sequences: [{n_tokens, stop_reason}]}; frames: tokens, logprobs (, prompt logprobs). */
static int reply_build(const struct rollout_request *r, const struct rollout_result *res, float *plp,
                       struct tinker_reply *out, struct smelt_error *err) {
    int64_t total = 0;
    for (int i = 0; i < r->n; i++) total += res[i].n;
    int32_t *ids = malloc((size_t)(total ? total : 1) * sizeof *ids);
    float *lps = malloc((size_t)(total ? total : 1) * sizeof *lps);
    json_t *seqs = json_array();
    out->result = json_pack("{s:o}", "sequences", seqs);
    if (!ids || !lps || !seqs || !out->result) {
        free(ids), free(lps), free(plp);
        return error_set(err, SMELT_ENOMEM, "sample: out of memory");
    }
    int64_t k = 0;
    for (int i = 0; i < r->n; i++) {
        memcpy(ids + k, res[i].ids, (size_t)res[i].n * sizeof *ids);
        memcpy(lps + k, res[i].logprobs, (size_t)res[i].n * sizeof *lps);
        k += res[i].n;
        const char *reason = strcmp(res[i].finish_reason, ROLLOUT_FINISH_LENGTH) == 0 ? "length" : "stop";
        json_array_append_new(seqs, json_pack("{s:I, s:s}", "n_tokens", (json_int_t)res[i].n, "stop_reason", reason));
    }
    int rc = tinker_reply_add(out, ids, (size_t)total * sizeof *ids, err);
    if (!rc) rc = tinker_reply_add(out, lps, (size_t)total * sizeof *lps, err);
    else free(lps);
    if (!rc && plp) rc = tinker_reply_add(out, plp, (size_t)r->n_prompt * sizeof *plp, err);
    else if (plp) free(plp);
    return rc;
}

int tinker_op_sample(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                     struct smelt_error *err) {
    struct rollout_request r = {0};
    struct lora *adapter;
    bool want_plp;
    TRY(request_parse(w, m, &r, &want_plp, err));
    TRY(pick_adapter(w, m->header, &adapter, err));
    struct rollout_result *res = calloc((size_t)r.n, sizeof *res);
    float *plp = want_plp ? malloc((size_t)r.n_prompt * sizeof *plp) : NULL;
    int rc = !res || (want_plp && !plp) ? error_set(err, SMELT_ENOMEM, "sample: out of memory") : SMELT_OK;
    if (!rc && adapter) rc = lora_attach(adapter, err);
    if (!rc) {
        rc = run_engine(w, &r, res, err);
        if (!rc && plp) rc = prompt_logprobs(w->base, r.prompt, r.n_prompt, plp, err);
        if (adapter) lora_detach(adapter);
    }
    if (!rc) rc = reply_build(&r, res, plp, out, err);
    else free(plp);
    if (res) rollout_results_free(res, r.n);
    return rc;
}
