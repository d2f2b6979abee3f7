/* The engine: requests and sequences, the step loop (plan → model → sample), forking the
 * samples of a prompt after its prefill, finishing and weight updates. Who runs in a step
 * is the scheduler's decision (scheduler.c); which blocks hold what is the block
 * manager's (kv_blocks.c). */
#include "rollout/rollout.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lora/lora.h"
#include "rollout/kv_blocks.h"
#include "rollout/scheduler.h"

/* What the samples of one request share. */
struct request {
    struct rollout_request r;   /* prompt points at prompt below; stop strings at copies */
    int32_t *prompt;
    char *stop_copies[ROLLOUT_MAX_STOP];
    int live;                   /* sequences still referring to it */
};

struct seq {
    /* The scheduler's view; sched.n_tokens counts tokens below, and sched.sample_index
     * is -1 for the parent that prefills for all n samples. */
    struct sched_seq sched;
    struct request *req;
    int32_t *tokens;            /* prompt then generated */
    float *logprobs;            /* [generated] */
    int64_t cap;
    struct rng rng;
};

static struct seq *seq_of(struct sched_seq *q) { return (struct seq *)((char *)q - offsetof(struct seq, sched)); }

struct rollout_engine {
    struct model *model;
    const struct tokenizer *tok;
    struct rollout_config config;
    struct model_kv_cache cache;
    struct kv_pool pool;
    struct scheduler sched;               /* tracks every live sequence */
    struct model_step_buffers *buffers;
    int max_blocks;                       /* per sequence: the model's context */
    int64_t next_arrival;
    struct rollout_result *done;          /* finished, not yet taken */
    int n_done, cap_done;
    struct rollout_stats stats;
    /* per-step scratch */
    int32_t *ids, *slots, *cu_q, *ctx, *tables;
    float *logits;                        /* [S, V] host copy, for steps that sample */
    struct sample_candidate *work;
    /* Greedy steps reduce the logits on the model's backend: i32 / f32 [S] there, and
     * their host copies. */
    struct tensor greedy_ids, greedy_logprobs;
    int32_t *host_greedy_ids;
    float *host_greedy_logprobs;
    /* Steps with requests naming adapters: each adapter's rows, on the model for the
     * step's forward only. */
    struct model_segmented_adapter segments;
};

/* ---- sequences ---- */

static int seq_reserve(struct seq *s, int64_t n, struct smelt_error *err) {
    if (n <= s->cap) return SMELT_OK;
    int64_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
    if (!t) return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    s->tokens = t;
    float *lp = realloc(s->logprobs, (size_t)cap * sizeof *lp);
    if (!lp) return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    s->logprobs = lp;
    s->cap = cap;
    return SMELT_OK;
}

static void request_release(struct request *q) {
    if (--q->live > 0) return;
    for (int i = 0; i < q->r.n_stop_strings; i++) free(q->stop_copies[i]);
    free(q->prompt);
    free(q);
}

static void seq_free(struct rollout_engine *e, struct seq *s) {
    kv_table_release(&e->pool, &s->sched.table);
    request_release(s->req);
    free(s->tokens);
    free(s->logprobs);
    free(s);
}

static int add_seq(struct rollout_engine *e, struct seq *s, struct smelt_error *err) {
    return scheduler_add(&e->sched, &s->sched, err);
}

static void remove_seq(struct rollout_engine *e, struct seq *s) { scheduler_remove(&e->sched, &s->sched); }

/* ---- results ---- */

static int result_append(struct rollout_engine *e, uint64_t id, int index, const int32_t *ids,
                         const float *logprobs, int64_t n, const char *reason, struct smelt_error *err) {
    if (e->n_done == e->cap_done) {
        int cap = e->cap_done ? 2 * e->cap_done : 64;
        struct rollout_result *grown = realloc(e->done, (size_t)cap * sizeof *grown);
        if (!grown) return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
        e->done = grown;
        e->cap_done = cap;
    }
    struct rollout_result *r = &e->done[e->n_done];
    *r = (struct rollout_result){.request_id = id, .sample_index = index, .n = n, .finish_reason = reason,
                                 .policy_version = e->stats.policy_version};
    r->ids = malloc((size_t)(n ? n : 1) * sizeof *r->ids);
    r->logprobs = malloc((size_t)(n ? n : 1) * sizeof *r->logprobs);
    if (!r->ids || !r->logprobs) {
        free(r->ids);
        free(r->logprobs);
        return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    }
    if (n) {
        memcpy(r->ids, ids, (size_t)n * sizeof *r->ids);
        memcpy(r->logprobs, logprobs, (size_t)n * sizeof *r->logprobs);
    }
    e->n_done++;
    return SMELT_OK;
}

static int finish(struct rollout_engine *e, struct seq *s, const char *reason, struct smelt_error *err) {
    int64_t n = s->sched.n_tokens - s->req->r.n_prompt;
    int rc = result_append(e, s->req->r.id, s->sched.sample_index < 0 ? 0 : s->sched.sample_index,
                           s->tokens + s->req->r.n_prompt, s->logprobs, n, reason, err);
    if (rc) return rc;
    remove_seq(e, s);
    seq_free(e, s);
    return SMELT_OK;
}

int rollout_engine_take(struct rollout_engine *e, struct rollout_result **results, int *n,
                        struct smelt_error *err) {
    (void)err;
    *results = e->n_done ? e->done : NULL;
    *n = e->n_done;
    e->done = NULL;
    e->n_done = e->cap_done = 0;
    return SMELT_OK;
}

void rollout_results_free(struct rollout_result *results, int n) {
    for (int i = 0; i < n; i++) {
        free(results[i].ids);
        free(results[i].logprobs);
    }
    free(results);
}

/* ---- requests ---- */

int rollout_engine_add(struct rollout_engine *e, const struct rollout_request *r, struct smelt_error *err) {
    const struct model_config *c = &e->model->config;
    if (!r->prompt || r->n_prompt < 1) return error_set(err, SMELT_EINVAL, "prompt: empty");
    if (r->n_prompt >= c->max_seq_len)
        return error_set(err, SMELT_EINVAL, "prompt: %lld tokens leave no room in the model's context of %lld",
                         (long long)r->n_prompt, (long long)c->max_seq_len);
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
            return error_set(err, SMELT_EINVAL, "prompt: token %lld is %d, outside the vocabulary [0, %lld)",
                             (long long)i, r->prompt[i], (long long)c->vocab_size);
    if (r->n < 1 || r->n > 256) return error_set(err, SMELT_EINVAL, "n: must be in [1, 256], got %d", r->n);
    if (r->max_new_tokens < 1) return error_set(err, SMELT_EINVAL, "max_new_tokens: must be >= 1, got %lld", (long long)r->max_new_tokens);
    TRY(error_wrap(err, sample_params_check(&r->sampling, err), "sampling"));
    if (r->n_stop_ids < 0 || r->n_stop_ids > ROLLOUT_MAX_STOP)
        return error_set(err, SMELT_EINVAL, "stop_ids: at most %d", ROLLOUT_MAX_STOP);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= c->vocab_size)
            return error_set(err, SMELT_EINVAL, "stop_ids[%d]: %d is outside the vocabulary", i, r->stop_ids[i]);
    if (r->n_stop_strings < 0 || r->n_stop_strings > ROLLOUT_MAX_STOP)
        return error_set(err, SMELT_EINVAL, "stop_strings: at most %d", ROLLOUT_MAX_STOP);
    if (r->n_stop_strings && !e->tok) return error_set(err, SMELT_EINVAL, "stop_strings: the engine has no tokenizer");
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i] || !r->stop_strings[i][0])
            return error_set(err, SMELT_EINVAL, "stop_strings[%d]: empty", i);
    if (r->adapter && r->adapter->model != e->model)
        return error_set_field(err, SMELT_EINVAL, "adapter", "adapter: an adapter of another model");
    if (r->adapter && e->model->adapter == &r->adapter->adapter)
        return error_set_field(err, SMELT_EINVAL, "adapter", "adapter: attached to the model; name it only "
                               "when it is not (a request without one samples from the attached adapter)");

    struct request *q = calloc(1, sizeof *q);
    struct seq *s = calloc(1, sizeof *s);
    if (q) q->prompt = malloc((size_t)r->n_prompt * sizeof *q->prompt);
    int rc = q && s && q->prompt ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    if (!rc) {
        q->r = *r;
        memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof *q->prompt);
        q->r.prompt = q->prompt;
        for (int i = 0; i < r->n_stop_strings && !rc; i++) {
            q->stop_copies[i] = strdup(r->stop_strings[i]);
            q->r.stop_strings[i] = q->stop_copies[i];
            if (!q->stop_copies[i]) rc = error_set(err, SMELT_ENOMEM, "rollout: out of memory");
        }
        q->live = 1;
        s->req = q;
        s->sched.sample_index = r->n > 1 ? -1 : 0;
        s->sched.arrival = e->next_arrival++;
        s->sched.group = (uintptr_t)r->adapter;
        sample_stream_seed(&s->rng, r->seed, 0);
    }
    if (!rc) rc = seq_reserve(s, r->n_prompt + 1, err);
    if (!rc) {
        memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof *s->tokens);
        s->sched.n_tokens = r->n_prompt;
        rc = add_seq(e, s, err);
    }
    if (rc) {
        if (s && s->req) seq_free(e, s);
        else {
            if (q) {
                for (int i = 0; i < ROLLOUT_MAX_STOP; i++) free(q->stop_copies[i]);
                free(q->prompt);
            }
            free(q);
            free(s);
        }
    }
    return rc;
}

int rollout_engine_abort(struct rollout_engine *e, uint64_t id) {
    int aborted = 0;
    struct smelt_error ignore = {0};
    for (int i = 0; i < e->sched.n_seqs;) {
        struct seq *s = seq_of(e->sched.seqs[i]);
        if (s->req->r.id != id) {
            i++;
            continue;
        }
        /* a parent that never forked stands for all n samples: samples 1..n-1 end empty */
        int count = s->sched.sample_index < 0 ? s->req->r.n : 1;
        for (int k = 1; k < count; k++)
            result_append(e, id, k, NULL, NULL, 0, ROLLOUT_FINISH_ABORT, &ignore);
        if (finish(e, s, ROLLOUT_FINISH_ABORT, &ignore)) {
            remove_seq(e, s); /* no memory for a result: drop it rather than loop */
            seq_free(e, s);
        }
        aborted += count;
    }
    return aborted;
}

/* ---- one step ---- */

static bool hits_stop_string(const struct rollout_engine *e, const struct seq *s) {
    const struct rollout_request *r = &s->req->r;
    if (!r->n_stop_strings) return false;
    /* Decode a tail long enough to hold any stop string that ends at the new token. */
    size_t longest = 0;
    for (int i = 0; i < r->n_stop_strings; i++) longest = strlen(r->stop_strings[i]) > longest ? strlen(r->stop_strings[i]) : longest;
    int64_t gen = s->sched.n_tokens - r->n_prompt;
    int64_t tail = (int64_t)longest + 4 < gen ? (int64_t)longest + 4 : gen;
    char *text = NULL;
    size_t len = 0;
    struct smelt_error ignore = {0};
    if (tokenizer_decode(e->tok, s->tokens + s->sched.n_tokens - tail, (size_t)tail, true, &text, &len, &ignore)) return false;
    bool hit = false;
    for (int i = 0; i < r->n_stop_strings && !hit; i++) hit = strstr(text, r->stop_strings[i]) != NULL;
    free(text);
    return hit;
}

/* Appends the next token: sampled from the host logits row, or, when logits is NULL (a
 * greedy step), the token and logprob the device chose. Finishes the sequence when it
 * should stop. */
static int sample_into(struct rollout_engine *e, struct seq *s, const float *logits, int32_t greedy_tok,
                       float greedy_logprob, struct smelt_error *err) {
    const struct rollout_request *r = &s->req->r;
    int64_t V = e->model->config.vocab_size;
    int32_t tok = logits ? sample_token(logits, V, &r->sampling, &s->rng, e->work) : greedy_tok;
    TRY(seq_reserve(s, s->sched.n_tokens + 1, err));
    s->logprobs[s->sched.n_tokens - r->n_prompt] = logits ? sample_logprob(logits, V, tok) : greedy_logprob;
    s->tokens[s->sched.n_tokens++] = tok;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (tok == r->stop_ids[i]) return finish(e, s, ROLLOUT_FINISH_STOP, err);
    if (hits_stop_string(e, s)) return finish(e, s, ROLLOUT_FINISH_STOP, err);
    if (s->sched.n_tokens - r->n_prompt >= r->max_new_tokens || s->sched.n_tokens >= e->model->config.max_seq_len)
        return finish(e, s, ROLLOUT_FINISH_LENGTH, err);
    return SMELT_OK;
}

/* The parent's prefill is done: it becomes sample 0 and n - 1 samples share its blocks. */
static int fork_samples(struct rollout_engine *e, struct seq *parent, struct seq **out, struct smelt_error *err) {
    const struct rollout_request *r = &parent->req->r;
    parent->sched.sample_index = 0;
    out[0] = parent;
    for (int i = 1; i < r->n; i++) {
        struct seq *c = calloc(1, sizeof *c);
        if (!c) return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
        *c = (struct seq){.sched = {.arrival = parent->sched.arrival, .sample_index = i,
                                    .n_cached = parent->sched.n_cached, .running = true,
                                    .group = parent->sched.group},
                          .req = parent->req};
        parent->req->live++;
        sample_stream_seed(&c->rng, r->seed, (uint64_t)i);
        int rc = seq_reserve(c, parent->sched.n_tokens + 1, err);
        if (!rc) rc = kv_table_fork(&e->pool, &parent->sched.table, &c->sched.table, err);
        if (!rc) {
            memcpy(c->tokens, parent->tokens, (size_t)parent->sched.n_tokens * sizeof *c->tokens);
            c->sched.n_tokens = parent->sched.n_tokens;
            rc = add_seq(e, c, err);
        }
        if (rc) {
            seq_free(e, c);
            return rc;
        }
        out[i] = c;
    }
    return SMELT_OK;
}

/* The step's next tokens without moving S x V logits to the host when every sequence
 * that samples this step is greedy: argmax and its logprob on the model's backend, S ids
 * and S logprobs back. Otherwise the logits come to the host for sample_token. */
static int step_logits(struct rollout_engine *e, const struct sched_plan *p, bool *greedy, struct smelt_error *err) {
    *greedy = true;
    for (int i = 0; i < p->n; i++) {
        const struct seq *s = seq_of(p->seqs[i]);
        bool samples = s->sched.n_cached + p->n_new[i] >= s->sched.n_tokens;
        if (samples && s->req->r.sampling.temperature != 0) *greedy = false;
    }
    struct tensor logits = model_step_logits(e->buffers);
    int64_t S = p->n, n = S * logits.shape[1];
    if (!*greedy) {
        struct tensor host = tensor_f32(e->logits, 1, &n), flat = tensor_make(logits.backend, DTYPE_F32, logits.data, 1, &n);
        return tensor_copy(&host, &flat, err);
    }
    struct tensor ids = tensor_make(e->greedy_ids.backend, DTYPE_I32, e->greedy_ids.data, 1, &S);
    struct tensor lps = tensor_make(e->greedy_logprobs.backend, DTYPE_F32, e->greedy_logprobs.data, 1, &S);
    struct tensor h_ids = tensor_i32(e->host_greedy_ids, 1, &S), h_lps = tensor_f32(e->host_greedy_logprobs, 1, &S);
    TRY(ops_argmax(&ids, &logits, err));
    TRY(ops_logprobs(&lps, NULL, &logits, &ids, err));
    TRY(tensor_copy(&h_ids, &ids, err));
    return tensor_copy(&h_lps, &lps, err);
}

/* The plan as the model's packed batch: ids, cache slots, query offsets, context lengths
 * and block tables of every planned sequence. */
static struct model_paged_batch pack_batch(struct rollout_engine *e, const struct sched_plan *p) {
    int64_t T = 0;
    e->cu_q[0] = 0;
    for (int i = 0; i < p->n; i++) {
        const struct seq *s = seq_of(p->seqs[i]);
        for (int64_t t = 0; t < p->n_new[i]; t++) {
            int64_t pos = s->sched.n_cached + t;
            e->ids[T] = s->tokens[pos];
            e->slots[T++] = kv_table_slot(&s->sched.table, pos);
        }
        e->cu_q[i + 1] = (int32_t)T;
        e->ctx[i] = (int32_t)(s->sched.n_cached + p->n_new[i]);
        for (int b = 0; b < e->max_blocks; b++) e->tables[i * e->max_blocks + b] = b < s->sched.table.n ? s->sched.table.blocks[b] : 0;
    }
    return (struct model_paged_batch){.n_tokens = T, .n_seqs = p->n, .ids = e->ids, .cu_q = e->cu_q,
                                      .context_lens = e->ctx, .slot_mapping = e->slots,
                                      .block_tables = e->tables, .max_blocks = e->max_blocks};
}

/* After the forward pass: the planned tokens are cached; a sequence whose known tokens
 * are all cached samples its next one (a parent forks its n samples first). */
static int advance(struct rollout_engine *e, const struct sched_plan *p, bool greedy, struct smelt_error *err) {
    int64_t V = e->model->config.vocab_size;
    for (int i = 0; i < p->n; i++) {
        struct seq *s = seq_of(p->seqs[i]);
        bool prefill = s->sched.n_cached < s->req->r.n_prompt;
        s->sched.n_cached += p->n_new[i];
        if (prefill) e->stats.prefill_tokens += p->n_new[i];
        else e->stats.decode_tokens += p->n_new[i];
        if (s->sched.n_cached < s->sched.n_tokens) continue; /* a prefill chunk; more to come */
        const float *lg = greedy ? NULL : e->logits + (size_t)i * (size_t)V;
        int32_t tok = greedy ? e->host_greedy_ids[i] : -1;
        float lp = greedy ? e->host_greedy_logprobs[i] : 0.0f;
        if (s->sched.sample_index < 0) {
            struct seq *samples[256];
            int n = s->req->r.n; /* read first: sample 0 is s, which finishing frees */
            TRY(fork_samples(e, s, samples, err));
            for (int k = 0; k < n; k++) TRY(sample_into(e, samples[k], lg, tok, lp, err));
        } else {
            TRY(sample_into(e, s, lg, tok, lp, err));
        }
    }
    return SMELT_OK;
}

/* The plan's runs of one adapter (contiguous: the scheduler groups them) as segments:
 * token rows from cu_q, lm_head rows = sequence indices (the paged step's head computes
 * one row per sequence). A run of requests naming none gets the attached adapter, if
 * any. Returns whether any request of the step names an adapter. */
static int build_segments(struct rollout_engine *e, const struct sched_plan *p, const struct model_adapter *attached,
                          bool *any, struct smelt_error *err) {
    *any = false;
    model_segments_clear(&e->segments);
    for (int i = 0; i < p->n; i++) *any |= seq_of(p->seqs[i])->req->r.adapter != NULL;
    if (!*any) return SMELT_OK;
    for (int i0 = 0, i1; i0 < p->n; i0 = i1) {
        struct lora *a = seq_of(p->seqs[i0])->req->r.adapter;
        for (i1 = i0 + 1; i1 < p->n && seq_of(p->seqs[i1])->req->r.adapter == a; i1++) {}
        struct model_adapter_segment g = {.row_begin = e->cu_q[i0], .row_end = e->cu_q[i1], .head_begin = i0,
                                          .head_end = i1, .adapter = a ? &a->adapter : attached};
        TRY(model_segments_push(&e->segments, &g, err));
    }
    return SMELT_OK;
}

/* The model's pass over the step, through the segmented adapter when a request names
 * an adapter (put back to what was attached after). */
static int forward(struct rollout_engine *e, const struct sched_plan *p, const struct model_paged_batch *pb,
                   struct smelt_error *err) {
    const struct model_adapter *attached = e->model->adapter;
    bool any;
    TRY(build_segments(e, p, attached, &any, err));
    if (any) e->model->adapter = &e->segments.adapter;
    int rc = model_forward_paged(e->model, e->buffers, &e->cache, pb, err);
    e->model->adapter = attached;
    return rc;
}

int rollout_engine_step(struct rollout_engine *e, struct smelt_error *err) {
    const struct sched_plan *p = &e->sched.plan;
    int rc = scheduler_plan(&e->sched, err);
    e->stats.preemptions += p->n_preempted;
    TRY(rc);
    if (p->n == 0 && e->sched.n_seqs > 0)
        return error_set(err, SMELT_EINVAL, "rollout: the KV pool (%lld blocks) cannot hold one sequence's next step",
                         (long long)e->pool.n_blocks);
    for (int i = 0; i < p->n_copies; i++)
        TRY(model_kv_cache_copy_block(&e->cache, p->copies[i].src, p->copies[i].dst, err));
    if (p->n == 0) return SMELT_OK;
    struct model_paged_batch pb = pack_batch(e, p);
    bool greedy = false;
    rc = forward(e, p, &pb, err);
    if (!rc) rc = step_logits(e, p, &greedy, err);
    if (!rc) rc = advance(e, p, greedy, err);
    e->stats.steps++;
    return rc;
}

bool rollout_engine_idle(const struct rollout_engine *e) { return e->sched.n_seqs == 0; }

/* ---- weights ---- */

int rollout_engine_weights_changed(struct rollout_engine *e, int64_t version, struct smelt_error *err) {
    if (version <= e->stats.policy_version)
        return error_set_field(err, SMELT_EINVAL, "version", "policy version %lld is not newer than the engine's %lld",
                               (long long)version, (long long)e->stats.policy_version);
    e->stats.policy_version = version;
    /* Re-run every unfinished sample from its prompt on the new weights. */
    for (int i = 0; i < e->sched.n_seqs; i++) {
        struct seq *s = seq_of(e->sched.seqs[i]);
        scheduler_drop_cache(&e->sched, &s->sched); /* a re-run, not a preemption */
        s->sched.n_tokens = s->req->r.n_prompt;
        sample_stream_seed(&s->rng, s->req->r.seed, (uint64_t)(s->sched.sample_index < 0 ? 0 : s->sched.sample_index));
    }
    return SMELT_OK;
}

int rollout_engine_set_weights_version(struct rollout_engine *e, const float *weights, int64_t n, int64_t version,
                                       struct smelt_error *err) {
    if (n != e->model->n_weights)
        return error_set(err, SMELT_EINVAL, "weights: %lld values given, the model has %lld", (long long)n,
                         (long long)e->model->n_weights);
    if (version <= e->stats.policy_version) /* checked before a byte changes */
        return error_set_field(err, SMELT_EINVAL, "version", "policy version %lld is not newer than the engine's %lld",
                               (long long)version, (long long)e->stats.policy_version);
    struct tensor host = tensor_f32((float *)weights, 1, &n);
    TRY(tensor_copy(&e->model->weights, &host, err));
    return rollout_engine_weights_changed(e, version, err);
}

int rollout_engine_set_weights(struct rollout_engine *e, const float *weights, int64_t n, struct smelt_error *err) {
    if (e->stats.policy_version == INT64_MAX)
        return error_set_field(err, SMELT_EINVAL, "version", "the policy version cannot grow past %lld", (long long)INT64_MAX);
    return rollout_engine_set_weights_version(e, weights, n, e->stats.policy_version + 1, err);
}

/* ---- life cycle ---- */

struct rollout_stats rollout_engine_stats(const struct rollout_engine *e) {
    struct rollout_stats st = e->stats;
    st.n_blocks = e->pool.n_blocks;
    st.free_blocks = e->pool.n_free;
    st.running = st.waiting = 0;
    for (int i = 0; i < e->sched.n_seqs; i++) {
        if (e->sched.seqs[i]->running) st.running++;
        else st.waiting++;
    }
    st.kv_bytes_per_token = model_kv_bytes_per_token(e->model);
    return st;
}

void rollout_engine_free(struct rollout_engine *e) {
    if (!e) return;
    while (e->sched.n_seqs) {
        struct seq *s = seq_of(e->sched.seqs[0]);
        remove_seq(e, s);
        seq_free(e, s);
    }
    scheduler_destroy(&e->sched);
    rollout_results_free(e->done, e->n_done);
    model_step_buffers_free(e->buffers);
    model_kv_cache_free(&e->cache);
    kv_pool_destroy(&e->pool);
    free(e->ids), free(e->slots), free(e->cu_q), free(e->ctx), free(e->tables);
    free(e->logits), free(e->work);
    tensor_free(&e->greedy_ids), tensor_free(&e->greedy_logprobs);
    free(e->host_greedy_ids), free(e->host_greedy_logprobs);
    model_segments_free(&e->segments);
    free(e);
}

int rollout_engine_create(struct model *model, const struct tokenizer *tok, const struct rollout_config *config,
                          struct rollout_engine **out, struct smelt_error *err) {
    const struct rollout_config *c = config;
    if (c->max_batch_tokens < 1) return error_set(err, SMELT_EINVAL, "max_batch_tokens: must be >= 1");
    if (c->max_seqs < 1 || c->max_seqs > 65536) return error_set(err, SMELT_EINVAL, "max_seqs: must be in [1, 65536]");
    if (c->prefill_chunk < 1) return error_set(err, SMELT_EINVAL, "prefill_chunk: must be >= 1");
    int64_t per_block = KV_BLOCK_SIZE * model_kv_bytes_per_token(model);
    int64_t n_blocks = c->kv_memory_bytes / per_block;
    if (n_blocks < 1)
        return error_set(err, SMELT_EINVAL, "kv_memory_bytes: %lld holds no block of %lld bytes",
                         (long long)c->kv_memory_bytes, (long long)per_block);
    struct rollout_engine *e = calloc(1, sizeof *e);
    if (!e) return error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    e->model = model;
    e->tok = tok;
    e->config = *c;
    model_segments_init(&e->segments);
    e->max_blocks = (int)((model->config.max_seq_len + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
    int64_t T = c->max_batch_tokens, S = c->max_seqs, V = model->config.vocab_size;
    struct sched_config sc = {.max_batch_tokens = c->max_batch_tokens, .max_seqs = c->max_seqs,
                              .prefill_chunk = c->prefill_chunk};
    int rc = kv_pool_init(&e->pool, n_blocks, err);
    if (!rc) rc = scheduler_init(&e->sched, &sc, &e->pool, err);
    if (!rc) rc = model_kv_cache_alloc(model, n_blocks, KV_BLOCK_SIZE, &e->cache, err);
    if (!rc) rc = model_step_buffers_alloc(model, T, (int)S, e->max_blocks, &e->buffers, err);
    if (!rc) {
        e->ids = malloc((size_t)T * sizeof *e->ids);
        e->slots = malloc((size_t)T * sizeof *e->slots);
        e->cu_q = malloc((size_t)(S + 1) * sizeof *e->cu_q);
        e->ctx = malloc((size_t)S * sizeof *e->ctx);
        e->tables = malloc((size_t)S * (size_t)e->max_blocks * sizeof *e->tables);
        e->logits = malloc((size_t)(S * V) * sizeof *e->logits);
        e->work = malloc((size_t)V * sizeof *e->work);
        e->host_greedy_ids = malloc((size_t)S * sizeof *e->host_greedy_ids);
        e->host_greedy_logprobs = malloc((size_t)S * sizeof *e->host_greedy_logprobs);
        if (!e->ids || !e->slots || !e->cu_q || !e->ctx || !e->tables || !e->logits ||
            !e->work || !e->host_greedy_ids || !e->host_greedy_logprobs)
            rc = error_set(err, SMELT_ENOMEM, "rollout: out of memory");
    }
    if (!rc) rc = tensor_alloc(&e->greedy_ids, model->backend, DTYPE_I32, 1, &S, err);
    if (!rc) rc = tensor_alloc(&e->greedy_logprobs, model->backend, DTYPE_F32, 1, &S, err);
    if (rc) {
        rollout_engine_free(e);
        return error_wrap(err, rc, "rollout engine");
    }
    *out = e;
    return SMELT_OK;
}
