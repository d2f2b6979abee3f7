/* The RL iteration on several trainer ranks (docs/distributed.md, "GRPO and PPO"): rank
 * 0 alone generates and scores — its engine or rollout workers, its reward stage, so a
 * grader, an endpoint or a python sandbox runs once per sample, not once per rank — and
 * broadcasts the outcome; the other ranks wait for it in the broadcast. Rank 0's failure
 * travels in the same broadcast, so every rank ends with its error instead of waiting in
 * another collective until the timeout.
 *
 * The message (same binary on every rank, so native byte order and struct layout):
 *   u32 magic, i32 rc, i32 n_samples, i32 finish-index count
 *   u64 sizes: message, field, iter, errors JSON, tokens
 *   message, field, iter bytes, errors JSON text
 *   per sample: i64 row, n, version; i32 finish index, failed; f64 reward, scores[]
 *   every sample's ids (i32), then every sample's rollout logprobs (f32)
 * A receiver checks every size against the bytes it got before it reads.
 *
 * Also here: the outcome alone of rank 0's later worker calls (split placement), the
 * one-step update's old logprobs gathered onto every rank, and an optimizer step's
 * statistics summed over the ranks in rank order. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rollout/rollout.h"

#define SHARE_MAGIC 0x534d5231u /* "SMR1" */

static const char *const FINISH[] = {ROLLOUT_FINISH_STOP, ROLLOUT_FINISH_LENGTH, ROLLOUT_FINISH_ABORT};
#define N_FINISH ((int)(sizeof FINISH / sizeof *FINISH))

struct share_head {
    uint32_t magic;
    int32_t rc, n_samples, n_finish;
    uint64_t msg, field, iter, errors, tokens;
};

struct share_sample {
    int64_t row, n, version;
    int32_t finish, failed;
    double reward, scores[REWARD_MAX_VERIFIERS];
};

/* ---- writing (rank 0) ---- */

struct writer {
    char *p;
    size_t at;
};

static void put(struct writer *w, const void *src, size_t n) {
    if (n) memcpy(w->p + w->at, src, n);
    w->at += n;
}

static int finish_index(const char *reason) {
    for (int i = 0; i < N_FINISH; i++)
        if (reason && strcmp(reason, FINISH[i]) == 0) return i;
    return 0; /* a reason the loop never makes: the samples' own ROLLOUT_FINISH_* */
}

static void put_samples(struct writer *w, const struct rl_sample *s, int n) {
    for (int i = 0; i < n; i++) {
        struct share_sample x = {.row = s[i].row, .n = s[i].n, .version = s[i].version,
                                 .finish = finish_index(s[i].finish_reason), .failed = s[i].failed,
                                 .reward = s[i].reward};
        memcpy(x.scores, s[i].scores, sizeof x.scores);
        put(w, &x, sizeof x);
    }
    for (int i = 0; i < n; i++) put(w, s[i].ids, (size_t)s[i].n * sizeof *s[i].ids);
    for (int i = 0; i < n; i++) put(w, s[i].rollout_logp, (size_t)s[i].n * sizeof *s[i].rollout_logp);
}

/* The message of rank 0's outcome; NULL when out of memory (*errors_text freed by the caller). */
static char *build(struct trainer_run *r, int rc, const struct smelt_error *e, const void *iter, size_t iter_bytes,
                   int n, char **errors_text, size_t *len) {
    const struct rl_sample *s = r->rl->samples;
    struct share_head h = {.magic = SHARE_MAGIC, .rc = rc, .n_samples = rc ? 0 : n, .n_finish = N_FINISH,
                           .msg = rc ? strlen(e->message) : 0, .field = rc ? strlen(e->field) : 0,
                           .iter = rc ? 0 : iter_bytes};
    *errors_text = !rc && r->rl->errors ? json_dumps(r->rl->errors, JSON_COMPACT) : NULL;
    h.errors = *errors_text ? strlen(*errors_text) : 0;
    for (int i = 0; i < h.n_samples; i++) h.tokens += (uint64_t)s[i].n;
    *len = sizeof h + h.msg + h.field + h.iter + h.errors + (size_t)h.n_samples * sizeof(struct share_sample) +
           h.tokens * (sizeof(int32_t) + sizeof(float));
    struct writer w = {.p = malloc(*len)};
    if (!w.p) return NULL;
    put(&w, &h, sizeof h);
    put(&w, e->message, h.msg);
    put(&w, e->field, h.field);
    put(&w, iter, h.iter);
    put(&w, *errors_text, h.errors);
    put_samples(&w, s, h.n_samples);
    return w.p;
}

static int send_outcome(struct trainer_run *r, int rc, void *iter, size_t iter_bytes, int n, struct smelt_error *err) {
    struct smelt_error none = {0};
    const struct smelt_error *e = rc ? err : &none;
    char *errors_text, *msg;
    size_t len;
    msg = build(r, rc, e, iter, iter_bytes, n, &errors_text, &len);
    struct share_head oom = {.magic = SHARE_MAGIC, .rc = SMELT_ENOMEM, .n_finish = N_FINISH};
    if (!msg) { /* the others must still hear that this iteration is over */
        msg = (char *)&oom;
        len = sizeof oom;
    }
    struct smelt_error berr = {0};
    int brc = dist_broadcast_bytes(&r->dist, (void **)&msg, &len, &berr);
    if (msg != (char *)&oom) free(msg);
    free(errors_text);
    if (rc) return rc; /* its own error first: the broadcast's would hide why */
    if (brc) {
        *err = berr;
        return brc;
    }
    return msg == (char *)&oom ? error_set(err, SMELT_ENOMEM, "rl: out of memory for the ranks' samples") : SMELT_OK;
}

/* ---- reading (ranks > 0) ---- */

struct reader {
    const char *p;
    size_t at, len;
};

static const void *take(struct reader *rd, uint64_t n) {
    if (n > rd->len - rd->at) return NULL;
    const void *q = rd->p + rd->at;
    rd->at += (size_t)n;
    return q;
}

static int malformed(struct smelt_error *err, const char *what) {
    return error_set(err, SMELT_EFORMAT, "ranks: rank 0's samples are malformed (%s)", what);
}

/* A sample of the message: its record, and its ids and logprobs at ids, lp (the
 * message's bytes, not necessarily aligned: copied with memcpy). */
static int take_sample(struct trainer_run *r, const struct share_sample *x, const char *ids, const char *lp,
                       struct rl_sample *out, struct smelt_error *err) {
    if (x->row < 0 || x->row >= r->train->n || x->finish < 0 || x->finish >= N_FINISH)
        return malformed(err, "a sample's row or finish reason");
    *out = (struct rl_sample){.row = x->row, .n = x->n, .version = x->version, .finish_reason = FINISH[x->finish],
                              .failed = x->failed != 0, .reward = x->reward};
    memcpy(out->scores, x->scores, sizeof out->scores);
    size_t n = (size_t)(x->n ? x->n : 1);
    out->ids = malloc(n * sizeof *out->ids);
    out->rollout_logp = malloc(n * sizeof *out->rollout_logp);
    if (!out->ids || !out->rollout_logp) return error_set(err, SMELT_ENOMEM, "rl: out of memory for samples");
    memcpy(out->ids, ids, (size_t)x->n * sizeof *out->ids);
    memcpy(out->rollout_logp, lp, (size_t)x->n * sizeof *out->rollout_logp);
    return SMELT_OK;
}

static int take_samples(struct trainer_run *r, struct reader *rd, const struct share_head *h,
                        struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    if (h->n_samples < 0 || h->n_samples > rl->cap * RL_ROUNDS) return malformed(err, "the sample count");
    if (h->tokens > rd->len) return malformed(err, "the token count");
    const char *xs = take(rd, (uint64_t)h->n_samples * sizeof(struct share_sample));
    const char *ids = take(rd, h->tokens * sizeof(int32_t)), *lp = take(rd, h->tokens * sizeof(float));
    if (!xs || !ids || !lp || rd->at != rd->len) return malformed(err, "sizes");
    rl_samples_clear(rl->samples, rl->cap * RL_ROUNDS);
    uint64_t off = 0;
    for (int i = 0; i < h->n_samples; i++) {
        struct share_sample x;
        memcpy(&x, xs + (size_t)i * sizeof x, sizeof x);
        if (x.n < 0 || (uint64_t)x.n > h->tokens - off) return malformed(err, "token counts");
        TRY(take_sample(r, &x, ids + off * sizeof(int32_t), lp + off * sizeof(float), &rl->samples[i], err));
        off += (uint64_t)x.n;
    }
    return off == h->tokens ? SMELT_OK : malformed(err, "token counts");
}

static int take_errors(struct trainer_run *r, const char *text, size_t n, struct smelt_error *err) {
    json_decref(r->rl->errors);
    r->rl->errors = NULL;
    json_error_t jerr;
    r->rl->errors = n ? json_loadb(text, n, 0, &jerr) : json_array();
    return r->rl->errors ? SMELT_OK : malformed(err, "errors");
}

static int receive_outcome(struct trainer_run *r, void *iter, size_t iter_bytes, struct smelt_error *err) {
    void *buf = NULL;
    size_t len = 0;
    TRY(dist_broadcast_bytes(&r->dist, &buf, &len, err));
    struct reader rd = {.p = buf, .len = len};
    struct share_head h;
    const void *hp = take(&rd, sizeof h);
    int rc = hp ? SMELT_OK : malformed(err, "no header");
    if (!rc) memcpy(&h, hp, sizeof h);
    if (!rc && (h.magic != SHARE_MAGIC || h.n_finish != N_FINISH)) rc = malformed(err, "another format");
    const char *msg = rc ? NULL : take(&rd, h.msg), *field = rc ? NULL : take(&rd, h.field);
    if (!rc && (!msg || !field)) rc = malformed(err, "the error");
    if (!rc && h.rc) { /* rank 0 failed: the same failure here */
        int nm = (int)(h.msg < SMELT_ERROR_MESSAGE_BYTES ? h.msg : SMELT_ERROR_MESSAGE_BYTES - 1);
        int nf = (int)(h.field < SMELT_ERROR_FIELD_BYTES ? h.field : SMELT_ERROR_FIELD_BYTES - 1);
        rc = error_set(err, h.rc, "%.*s", nm, msg);
        snprintf(err->field, sizeof err->field, "%.*s", nf, field);
        free(buf);
        return rc ? rc : SMELT_EINVAL;
    }
    if (!rc && !iter) { /* the outcome alone */
        free(buf);
        return SMELT_OK;
    }
    const void *it = rc ? NULL : take(&rd, h.iter);
    const char *errors = rc ? NULL : take(&rd, h.errors);
    if (!rc && (!it || h.iter != iter_bytes || !errors)) rc = malformed(err, "the iteration's record");
    if (!rc) memcpy(iter, it, iter_bytes);
    if (!rc) rc = take_errors(r, errors, (size_t)h.errors, err);
    if (!rc) rc = take_samples(r, &rd, &h, err);
    free(buf);
    return rc;
}

int rl_dist_share(struct trainer_run *r, int rc, void *iter, size_t iter_bytes, int n_samples,
                  struct smelt_error *err) {
    if (r->dist.ranks <= 1) return rc;
    if (r->dist.rank == 0) return send_outcome(r, rc, iter, iter_bytes, n_samples, err);
    return receive_outcome(r, iter, iter_bytes, err);
}

/* ---- rank 0's steps alone, and what the update leaves on each rank ---- */

/* The split placement on several ranks: the outcome of a call to the workers, which only
 * rank 0 has, goes to every rank, so that its failure (a worker that died) ends them all
 * with its error rather than leaving them in their next collective. */
int rl_dist_lead_outcome(struct trainer_run *r, int rc, struct smelt_error *err) {
    if (r->dist.ranks <= 1 || r->spec->rl.placement != RL_PLACEMENT_SPLIT) return rc;
    return rl_dist_share(r, rc, NULL, 0, 0, err);
}

/* Several ranks, old logprobs taken from the update's own forward: each rank holds them
 * for its own micro-batches (those of the current version). They are summed over the
 * ranks from a buffer that is 0 elsewhere (x + 0 is exact), so every rank holds them all
 * for the mismatch metrics, as one process does. The micro-batches are walked as
 * grpo.c's minibatch_step walks its single step's. */
/* The current version's tokens of the samples in this rank's micro-batches (mine) or in
 * the others' (!mine), from src to dst. */
static void copy_current(struct trainer_run *r, int n, bool mine, const float *src, float *dst) {
    struct rl_state *rl = r->rl;
    for (int i = 0, j = 0; i < n; j++) {
        int k = rl_batch_fit(r, r->train, rl->trained + i, n - i);
        for (int q = i; dist_mine(&r->dist, j) == mine && q < i + k; q++)
            if (rl->trained[q].version == rl->version)
                memcpy(dst + rl->start[q], src + rl->start[q],
                       (size_t)(rl->start[q + 1] - rl->start[q]) * sizeof *dst);
        i += k;
    }
}

int rl_dist_gather_old(struct trainer_run *r, int n, struct smelt_error *err) {
    struct rl_state *rl = r->rl;
    if (r->dist.ranks <= 1 || n == 0) return SMELT_OK;
    int64_t T = rl->start[n];
    struct tensor buf;
    TRY(tensor_alloc(&buf, BACKEND_CPU, DTYPE_F32, 1, &T, err));
    memset(buf.data, 0, (size_t)T * sizeof(float));
    copy_current(r, n, true, rl->old, buf.data);
    int rc = dist_all_reduce_sum(&r->dist, &buf, err);
    if (!rc) copy_current(r, n, false, buf.data, rl->old);
    tensor_free(&buf);
    return rc;
}

/* ---- sums of an optimizer step's statistics ---- */

struct policy_part {
    struct rl_policy_stats ps;
    double loss;
    int64_t tokens;
};

int rl_dist_policy_totals(struct dist *d, struct rl_policy_stats *ps, double *loss, int64_t *tokens,
                          struct smelt_error *err) {
    if (d->ranks <= 1) return SMELT_OK;
    struct policy_part mine = {.ps = *ps, .loss = *loss, .tokens = *tokens};
    struct policy_part *all = malloc((size_t)d->ranks * sizeof *all);
    if (!all) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    int rc = dist_gather_bytes(d, &mine, sizeof mine, all, err);
    if (!rc) {
        *ps = (struct rl_policy_stats){0};
        *loss = 0;
        *tokens = 0;
        for (int k = 0; k < d->ranks; k++) {
            rl_policy_stats_merge(ps, &all[k].ps);
            *loss += all[k].loss;
            *tokens += all[k].tokens;
        }
    }
    free(all);
    return rc;
}

int rl_dist_critic_totals(struct dist *d, struct critic_totals *t, struct smelt_error *err) {
    double v[4] = {t->loss, t->value_sum, (double)t->n_tokens, (double)t->clipped};
    TRY(dist_sum(d, v, 4, err));
    t->loss = v[0];
    t->value_sum = v[1];
    t->n_tokens = (int64_t)v[2];
    t->clipped = (int64_t)v[3];
    return SMELT_OK;
}
