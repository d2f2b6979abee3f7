/* Private to rollout/: the scheduler (vLLM's), which decides who runs in each engine
 * step and how many tokens each runs:
 *   - running sequences first, oldest first: one decode token each, or the next chunk of
 *     an unfinished prefill;
 *   - then waiting ones in arrival order, while max_batch_tokens, max_seqs, prefill_chunk
 *     and the KV pool allow; the first that does not fit stops admission, so nothing
 *     newer jumps the queue;
 *   - when the pool runs short for a running sequence, the newest running sequence not
 *     already in this step is preempted: its blocks go back, its tokens stay, and it is
 *     recomputed when readmitted. A sequence newer than every candidate preempts itself.
 * It reserves the planned tokens' blocks in the block manager (kv_blocks.h) and lists
 * the copy-on-write copies that the step must make first. It knows nothing of models,
 * requests or sampling: the engine embeds a struct sched_seq in each sequence, runs the
 * plan and advances n_cached / n_tokens itself.
 *
 * Ownership: the scheduler owns its arrays and its plan; it borrows the pool and the
 * sequences (added and removed by the caller, who frees them). */
#ifndef SMELT_ROLLOUT_SCHEDULER_H
#define SMELT_ROLLOUT_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "rollout/kv_blocks.h"

/* What the scheduler knows of a sequence. Zero-initialise, then set arrival,
 * sample_index and n_tokens. */
struct sched_seq {
    int64_t arrival;             /* lower is older: admission and preemption order */
    int sample_index;            /* breaks ties within an arrival; unique within one */
    int64_t n_tokens;            /* tokens known: prompt, then generated */
    int64_t n_cached;            /* the first n_cached of them have keys and values cached */
    struct kv_block_table table; /* their blocks */
    bool running;                /* admitted: holds blocks, runs every step it fits */
    uintptr_t group;             /* the engine's adapter key; 0: none. A plan keeps each
                                    group's sequences contiguous (below) */
};

struct sched_config {
    int64_t max_batch_tokens;    /* >= 1 */
    int max_seqs;                /* >= 1 */
    int64_t prefill_chunk;       /* >= 1 */
};

/* One step. Arrays hold max_seqs entries: at most one copy-on-write per planned
 * sequence (a sequence only ever writes into one existing block per step). */
struct sched_plan {
    int n;                       /* sequences that run, in step order */
    struct sched_seq **seqs;     /* [max_seqs] */
    int64_t *n_new;              /* [max_seqs] positions [n_cached, n_cached + n_new) run */
    int64_t tokens;              /* sum of n_new, <= max_batch_tokens */
    struct kv_copy *copies;      /* [max_seqs] to make in every layer before the step */
    int n_copies;
    int n_preempted;             /* preempted while planning */
};

struct scheduler {
    struct sched_config config;
    struct kv_pool *pool;        /* borrowed */
    struct sched_seq **seqs;     /* [n_seqs] live sequences, any order between plans */
    int n_seqs, cap_seqs;
    struct sched_plan plan;      /* the last plan */
};

/* SMELT_EINVAL for a config out of range (the field named), SMELT_ENOMEM. On failure s
 * is left safe to scheduler_destroy. */
int scheduler_init(struct scheduler *s, const struct sched_config *config, struct kv_pool *pool,
                   struct smelt_error *err);
/* Frees the scheduler's arrays; not the sequences. */
void scheduler_destroy(struct scheduler *s);

/* Starts tracking q (waiting unless q->running). */
int scheduler_add(struct scheduler *s, struct sched_seq *q, struct smelt_error *err);
/* Stops tracking q; its blocks are the caller's to release. */
void scheduler_remove(struct scheduler *s, struct sched_seq *q);

/* Back to waiting with nothing cached (its blocks released); its tokens are recomputed
 * when it is admitted again. */
void scheduler_drop_cache(struct scheduler *s, struct sched_seq *q);

/* Plans the next step into s->plan: reserves every planned sequence's blocks, preempts
 * when short, and sorts s->seqs by arrival. Then the plan's sequences are grouped by
 * sched_seq.group: each group's sequences contiguous, the groups in the order of their
 * first sequence, arrival order within a group (a step of one group keeps the arrival
 * order); who runs and how many tokens never depends on the groups. An empty plan with sequences live means the
 * pool cannot hold even the oldest one's next step. Errors (SMELT_ENOMEM from a block
 * table) leave s->plan partial; blocks it reserved stay with their tables. */
int scheduler_plan(struct scheduler *s, struct smelt_error *err);

#endif
