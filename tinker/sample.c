/* sample: one prompt x num_samples through the rollout engine on the shared base, with
 * the chosen adapter (a live model's, a sampler checkpoint's cached by path, or none)
 * named in the engine's request, and the prompt's own logprobs from model_forward (the
 * adapter attached) when asked. Several sample requests share one engine run
 * (tinker_sample_batch): their adapters are applied each to its own rows of every step
 * (rollout_request.adapter), so each gets the bits it gets alone. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tinker/tinker_internal.h"

static void cached_free(struct tinker_cached_adapter *a) {
    lora_free(a->lora);
    free(a);
}

/* The adapter file's modification time ({0, 0} when it cannot be read: lora_load says why). */
static struct timespec adapter_mtime(const char *dir) {
    char file[TINKER_PATH_BYTES + 32];
    struct stat st;
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    return stat(file, &st) == 0 ? st.st_mtim : (struct timespec){0, 0};
}

/* Drops the least recently used adapters beyond TINKER_CACHED_ADAPTERS that this batch
 * does not use, and the entry for path (written again since it was loaded). */
static void cache_trim(struct tinker_worker *w, const char *stale) {
    int n = 0;
    for (struct tinker_cached_adapter *a = w->adapters; a; a = a->next) n++;
    for (struct tinker_cached_adapter **pp = &w->adapters; *pp;) {
        struct tinker_cached_adapter *a = *pp;
        bool drop = (stale && strcmp(a->path, stale) == 0 && a->used != w->sample_batch);
        if (!drop && n > TINKER_CACHED_ADAPTERS && a->used != w->sample_batch) {
            drop = true;
            for (struct tinker_cached_adapter *b = w->adapters; b; b = b->next)
                if (b->used < a->used) drop = false; /* a is not the least recently used */
        }
        if (drop) {
            *pp = a->next, n--;
            cached_free(a);
            pp = &w->adapters; /* rescan: the next least recently used may go too */
        } else {
            pp = &a->next;
        }
    }
}

/* A sampler checkpoint's adapter: from the cache, or loaded and cached. */
static int cached_adapter(struct tinker_worker *w, const char *path, struct lora **out, struct smelt_error *err) {
    TRY(tinker_path_check(path, "adapter_path", err));
    struct timespec mtime = adapter_mtime(path);
    for (struct tinker_cached_adapter *a = w->adapters; a; a = a->next)
        if (strcmp(a->path, path) == 0 && a->mtime.tv_sec == mtime.tv_sec && a->mtime.tv_nsec == mtime.tv_nsec) {
            a->used = w->sample_batch;
            return (*out = a->lora), SMELT_OK;
        }
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
    a->mtime = mtime;
    a->used = w->sample_batch;
    a->next = w->adapters;
    w->adapters = a;
    cache_trim(w, path);
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

/* What the prompt's own logprobs need: plp [n_prompt] when wanted (or k > 0), the top-k
 * arrays [n_prompt * k] when k > 0. Owned until moved into the reply. */
struct prompt_out {
    bool want;
    int64_t k;
    float *plp, *tk_lps;
    int32_t *tk_ids;
};

static void prompt_out_free(struct prompt_out *p) {
    free(p->plp), free(p->tk_lps), free(p->tk_ids);
    p->plp = p->tk_lps = NULL, p->tk_ids = NULL;
}

static int request_parse(struct tinker_worker *w, const struct msg *m, struct rollout_request *r,
                         struct prompt_out *po, struct smelt_error *err) {
    const json_t *h = m->header;
    int64_t n, max_tokens, top_k, seed;
    double temperature, top_p;
    int rc = json_field_int(h, "num_samples", false, 1, 1, 256, &n, "request", err);
    if (!rc) rc = json_field_int(h, "max_tokens", true, 0, 1, w->base->config.max_seq_len, &max_tokens, "request", err);
    if (!rc) rc = json_field_double(h, "temperature", false, 1.0, 0.0, 1e6, &temperature, "request", err);
    if (!rc) rc = json_field_int(h, "top_k", false, 0, INT64_MIN, INT64_MAX, &top_k, "request", err);
    if (!rc) rc = json_field_double(h, "top_p", false, 1.0, 1e-9, 1.0, &top_p, "request", err);
    if (!rc) rc = json_field_int(h, "seed", false, -1, -1, INT64_MAX, &seed, "request", err);
    if (!rc) rc = json_field_bool(h, "prompt_logprobs", false, false, &po->want, "request", err);
    if (!rc)
        rc = json_field_int(h, "topk_prompt_logprobs", false, 0, 0, w->base->config.vocab_size, &po->k, "request",
                            err);
    if (rc) return rc;
    po->want |= po->k > 0;
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

/* One sample request of a batch: what it asks, its adapter, its samples by index, and
 * its outcome (rc, err) until its reply is built. */
struct job {
    const struct msg *m;
    struct rollout_request r;
    struct prompt_out po;
    struct lora *adapter;
    struct rollout_result *res; /* [r.n] */
    int got;
    bool queued;                /* in the engine */
    int rc;
    struct smelt_error err;
};

static void job_take(struct job *jobs, int n, struct rollout_result *done) {
    for (int j = 0; j < n; j++) {
        struct job *q = &jobs[j];
        if (!q->queued || done->request_id != q->r.id) continue;
        if (done->sample_index >= 0 && done->sample_index < q->r.n && !q->res[done->sample_index].ids) {
            q->res[done->sample_index] = *done;
            *done = (struct rollout_result){0};
            q->got++;
        }
        return;
    }
}

/* Steps the engine until idle, filing every sample with its request. A failed step
 * fails every queued request: their sequences are aborted so nothing lingers. */
static void run_engine(struct tinker_worker *w, struct job *jobs, int n) {
    struct smelt_error err = {0};
    int rc = SMELT_OK;
    while (!rc && !rollout_engine_idle(w->engine)) {
        rc = rollout_engine_step(w->engine, &err);
        struct rollout_result *done = NULL;
        int k = 0;
        if (!rc) rc = rollout_engine_take(w->engine, &done, &k, &err);
        for (int i = 0; i < k; i++) job_take(jobs, n, &done[i]);
        rollout_results_free(done, k);
    }
    for (int j = 0; j < n; j++) {
        struct job *q = &jobs[j];
        if (!q->queued || q->rc) continue;
        if (rc) {
            rollout_engine_abort(w->engine, q->r.id);
            q->rc = rc, q->err = err;
        } else if (q->got != q->r.n) {
            q->rc = error_set(&q->err, SMELT_EBACKEND, "sample: the engine finished %d of %d samples", q->got, q->r.n);
        }
    }
    if (rc) {
        struct rollout_result *rest = NULL;
        int k = 0;
        if (!rollout_engine_take(w->engine, &rest, &k, &(struct smelt_error){0})) rollout_results_free(rest, k);
    }
}

/* {sequences: [{n_tokens, stop_reason}]}; frames: tokens, logprobs (, prompt logprobs
 * (, top-k ids and logprobs)). The prompt arrays move into the reply. */
static int reply_build(const struct rollout_request *r, const struct rollout_result *res, struct prompt_out *po,
                       struct tinker_reply *out, struct smelt_error *err) {
    int64_t total = 0;
    for (int i = 0; i < r->n; i++) total += res[i].n;
    int32_t *ids = malloc((size_t)(total ? total : 1) * sizeof *ids);
    float *lps = malloc((size_t)(total ? total : 1) * sizeof *lps);
    json_t *seqs = json_array();
    out->result = json_pack("{s:o}", "sequences", seqs);
    if (!ids || !lps || !seqs || !out->result) {
        free(ids), free(lps);
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
    size_t np = (size_t)r->n_prompt, nk = np * (size_t)po->k;
    if (!rc && po->want) rc = tinker_reply_add(out, po->plp, np * sizeof(float), err), po->plp = NULL;
    if (!rc && po->k > 0) rc = tinker_reply_add(out, po->tk_ids, nk * sizeof(int32_t), err), po->tk_ids = NULL;
    if (!rc && po->k > 0) rc = tinker_reply_add(out, po->tk_lps, nk * sizeof(float), err), po->tk_lps = NULL;
    return rc;
}

/* Parses and checks the request, picks its adapter, allocates its outputs. */
static int job_prepare(struct tinker_worker *w, struct job *q, struct smelt_error *err) {
    TRY(msg_check_version(q->m, err));
    if (!tinker_is_sample(q->m))
        return error_set_field(err, SMELT_EINVAL, "op", "op: a batch of samples holds only \"sample\" requests");
    TRY(request_parse(w, q->m, &q->r, &q->po, err));
    TRY(pick_adapter(w, q->m->header, &q->adapter, err));
    q->r.adapter = q->adapter;
    size_t np = (size_t)q->r.n_prompt, nk = np * (size_t)q->po.k;
    q->res = calloc((size_t)q->r.n, sizeof *q->res);
    if (q->po.want) q->po.plp = malloc(np * sizeof *q->po.plp);
    if (q->po.k > 0) q->po.tk_ids = malloc(nk * sizeof *q->po.tk_ids), q->po.tk_lps = malloc(nk * sizeof *q->po.tk_lps);
    if (!q->res || (q->po.want && !q->po.plp) || (q->po.k > 0 && (!q->po.tk_ids || !q->po.tk_lps)))
        return error_set(err, SMELT_ENOMEM, "sample: out of memory");
    return SMELT_OK;
}

/* After the engine: the prompt's logprobs (its adapter attached), then the reply. */
static int job_finish(struct tinker_worker *w, struct job *q, struct tinker_reply *out, struct smelt_error *err) {
    if (q->po.want) {
        if (q->adapter) TRY(lora_attach(q->adapter, err));
        int rc = tinker_prompt_logprobs(w->base, q->r.prompt, q->r.n_prompt, q->po.k, q->po.plp, q->po.tk_ids,
                                        q->po.tk_lps, err);
        if (q->adapter) lora_detach(q->adapter);
        TRY(rc);
    }
    return reply_build(&q->r, q->res, &q->po, out, err);
}

static void job_free(struct job *q) {
    prompt_out_free(&q->po);
    if (q->res) rollout_results_free(q->res, q->r.n);
}

bool tinker_is_sample(const struct msg *m) {
    const char *op = json_string_value(json_object_get(m->header, "op"));
    return strcmp(m->type, MSG_TINKER_REQUEST) == 0 && op && strcmp(op, "sample") == 0;
}

int tinker_sample_batch(struct tinker_worker *w, const struct msg *const *requests, int n, struct tinker_reply *outs,
                        int *rcs, struct smelt_error *errs) {
    w->sample_batch++;
    struct job *jobs = calloc((size_t)(n ? n : 1), sizeof *jobs);
    if (!jobs) {
        for (int j = 0; j < n; j++) rcs[j] = error_set(&errs[j], SMELT_ENOMEM, "sample: out of memory");
        return SMELT_ENOMEM;
    }
    for (int j = 0; j < n; j++) {
        struct job *q = &jobs[j];
        q->m = requests[j];
        outs[j] = (struct tinker_reply){0};
        q->rc = job_prepare(w, q, &q->err);
        if (!q->rc) q->rc = rollout_engine_add(w->engine, &q->r, &q->err);
        q->queued = q->rc == SMELT_OK;
    }
    run_engine(w, jobs, n);
    for (int j = 0; j < n; j++) {
        struct job *q = &jobs[j];
        if (!q->rc) q->rc = job_finish(w, q, &outs[j], &q->err);
        if (q->rc) tinker_reply_free(&outs[j]);
        rcs[j] = q->rc;
        errs[j] = q->err;
        job_free(q);
    }
    free(jobs);
    return SMELT_OK;
}

int tinker_op_sample(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                     struct smelt_error *err) {
    int rc;
    tinker_sample_batch(w, &m, 1, out, &rc, err);
    return rc;
}
