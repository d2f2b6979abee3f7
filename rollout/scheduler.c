/* The scheduler: who runs this step, how many tokens, which blocks, whom to preempt. */
#include "rollout/scheduler.h"

#include <stdlib.h>
#include <string.h>

static void plan_free(struct sched_plan *p) {
    free(p->seqs);
    free(p->n_new);
    free(p->copies);
    memset(p, 0, sizeof *p);
}

int scheduler_init(struct scheduler *s, const struct sched_config *c, struct kv_pool *pool,
                   struct smelt_error *err) {
    memset(s, 0, sizeof *s);
    if (c->max_batch_tokens < 1) return error_set(err, SMELT_EINVAL, "max_batch_tokens: must be >= 1");
    if (c->max_seqs < 1) return error_set(err, SMELT_EINVAL, "max_seqs: must be >= 1");
    if (c->prefill_chunk < 1) return error_set(err, SMELT_EINVAL, "prefill_chunk: must be >= 1");
    s->config = *c;
    s->pool = pool;
    size_t n = (size_t)c->max_seqs;
    s->plan.seqs = malloc(n * sizeof *s->plan.seqs);
    s->plan.n_new = malloc(n * sizeof *s->plan.n_new);
    s->plan.copies = malloc(n * sizeof *s->plan.copies);
    if (!s->plan.seqs || !s->plan.n_new || !s->plan.copies) {
        scheduler_destroy(s);
        return error_set(err, SMELT_ENOMEM, "scheduler: out of memory for %d sequences", c->max_seqs);
    }
    return SMELT_OK;
}

void scheduler_destroy(struct scheduler *s) {
    free(s->seqs);
    plan_free(&s->plan);
    memset(s, 0, sizeof *s);
}

int scheduler_add(struct scheduler *s, struct sched_seq *q, struct smelt_error *err) {
    if (s->n_seqs == s->cap_seqs) {
        int cap = s->cap_seqs ? 2 * s->cap_seqs : 64;
        struct sched_seq **grown = realloc(s->seqs, (size_t)cap * sizeof *grown);
        if (!grown) return error_set(err, SMELT_ENOMEM, "scheduler: out of memory");
        s->seqs = grown;
        s->cap_seqs = cap;
    }
    s->seqs[s->n_seqs++] = q;
    return SMELT_OK;
}

void scheduler_remove(struct scheduler *s, struct sched_seq *q) {
    for (int i = 0; i < s->n_seqs; i++)
        if (s->seqs[i] == q) {
            s->seqs[i] = s->seqs[--s->n_seqs];
            return;
        }
}

void scheduler_drop_cache(struct scheduler *s, struct sched_seq *q) {
    kv_table_release(s->pool, &q->table);
    q->n_cached = 0;
    q->running = false;
}

static int by_arrival(const void *a, const void *b) {
    const struct sched_seq *x = *(struct sched_seq *const *)a, *y = *(struct sched_seq *const *)b;
    if (x->arrival != y->arrival) return x->arrival < y->arrival ? -1 : 1;
    return x->sample_index - y->sample_index;
}

static bool in_plan(const struct sched_plan *p, const struct sched_seq *q) {
    for (int i = 0; i < p->n; i++)
        if (p->seqs[i] == q) return true;
    return false;
}

/* The newest running sequence other than keep that is not in this step's plan (its
 * blocks are already promised to the step), or NULL. */
static struct sched_seq *preemption_victim(struct scheduler *s, const struct sched_seq *keep) {
    struct sched_seq *best = NULL;
    for (int i = 0; i < s->n_seqs; i++) {
        struct sched_seq *q = s->seqs[i];
        if (!q->running || q == keep) continue;
        if (!best || by_arrival(&q, &best) > 0) best = q;
    }
    return best && !in_plan(&s->plan, best) ? best : NULL;
}

static void preempt(struct scheduler *s, struct sched_seq *q) {
    scheduler_drop_cache(s, q);
    s->plan.n_preempted++;
}

/* Reserves blocks for n new tokens of q, preempting newer running sequences when the
 * pool is short and may_preempt. *ok is false when q must wait (or was preempted). */
static int reserve(struct scheduler *s, struct sched_seq *q, int64_t n, bool may_preempt, bool *ok,
                   struct smelt_error *err) {
    struct sched_plan *p = &s->plan;
    *ok = false;
    for (;;) {
        /* One copy per planned sequence at most, and p has room for max_seqs of them. */
        SMELT_ASSERT(p->n_copies < s->config.max_seqs);
        bool has_copy = false;
        int rc = kv_table_extend(s->pool, &q->table, q->n_cached, n, &p->copies[p->n_copies], &has_copy, err);
        if (rc < 0) return rc;
        if (rc == SMELT_OK) {
            p->n_copies += has_copy;
            *ok = true;
            return SMELT_OK;
        }
        if (!may_preempt) return SMELT_OK;
        struct sched_seq *victim = preemption_victim(s, q);
        if (!victim || by_arrival(&victim, &q) < 0) {
            if (q->running) preempt(s, q);
            return SMELT_OK;
        }
        preempt(s, victim);
    }
}

/* Tokens q runs next: the rest of what is known, within a prefill chunk and the budget. */
static int64_t next_tokens(const struct scheduler *s, const struct sched_seq *q, int64_t budget) {
    int64_t n = q->n_tokens - q->n_cached;
    if (n > s->config.prefill_chunk) n = s->config.prefill_chunk;
    return n < budget ? n : budget;
}

static void plan_push(struct sched_plan *p, struct sched_seq *q, int64_t n) {
    p->seqs[p->n] = q;
    p->n_new[p->n++] = n;
    p->tokens += n;
}

static int plan_running(struct scheduler *s, struct smelt_error *err) {
    struct sched_plan *p = &s->plan;
    for (int i = 0; i < s->n_seqs && p->tokens < s->config.max_batch_tokens && p->n < s->config.max_seqs; i++) {
        struct sched_seq *q = s->seqs[i];
        if (!q->running) continue;
        int64_t n = next_tokens(s, q, s->config.max_batch_tokens - p->tokens);
        bool ok;
        TRY(reserve(s, q, n, true, &ok, err));
        if (ok) plan_push(p, q, n);
    }
    return SMELT_OK;
}

/* Waiting sequences never preempt: they are newer than every running one. */
static int plan_waiting(struct scheduler *s, struct smelt_error *err) {
    struct sched_plan *p = &s->plan;
    int running = 0;
    for (int i = 0; i < s->n_seqs; i++) running += s->seqs[i]->running;
    for (int i = 0; i < s->n_seqs && p->tokens < s->config.max_batch_tokens && p->n < s->config.max_seqs &&
                    running < s->config.max_seqs; i++) {
        struct sched_seq *q = s->seqs[i];
        if (q->running) continue;
        int64_t n = next_tokens(s, q, s->config.max_batch_tokens - p->tokens);
        bool ok;
        TRY(reserve(s, q, n, false, &ok, err));
        if (!ok) break; /* keep arrival order: nothing newer jumps the queue */
        q->running = true;
        running++;
        plan_push(p, q, n);
    }
    return SMELT_OK;
}

/* Moves each planned sequence up behind the last earlier one of its group: groups
 * contiguous, first-appearance order, stable within a group. n <= max_seqs, so the
 * quadratic walk costs nothing next to the step it plans. */
static void group_plan(struct sched_plan *p) {
    for (int i = 1; i < p->n; i++) {
        struct sched_seq *q = p->seqs[i];
        int64_t n_new = p->n_new[i];
        int k = i - 1;
        while (k >= 0 && p->seqs[k]->group != q->group) k--;
        if (k < 0 || k == i - 1) continue;
        memmove(&p->seqs[k + 2], &p->seqs[k + 1], (size_t)(i - k - 1) * sizeof *p->seqs);
        memmove(&p->n_new[k + 2], &p->n_new[k + 1], (size_t)(i - k - 1) * sizeof *p->n_new);
        p->seqs[k + 1] = q;
        p->n_new[k + 1] = n_new;
    }
}

int scheduler_plan(struct scheduler *s, struct smelt_error *err) {
    struct sched_plan *p = &s->plan;
    p->n = p->n_copies = p->n_preempted = 0;
    p->tokens = 0;
    if (s->n_seqs > 1) qsort(s->seqs, (size_t)s->n_seqs, sizeof *s->seqs, by_arrival);
    TRY(plan_running(s, err));
    TRY(plan_waiting(s, err));
    group_plan(p);
    return SMELT_OK;
}
