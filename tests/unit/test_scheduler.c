/* rollout/scheduler: its decisions checked directly, without a model: admission in
 * arrival order under the KV budget, chunked prefill within the token budget, which
 * sequence is preempted, max_seqs, copy-on-write of shared blocks, and a step of more
 * than 1024 sequences that each need a copy. */
#include "tests/unit/testutil.h"

#include <stdlib.h>

#include "rollout/scheduler.h"

struct fixture {
    struct kv_pool pool;
    struct scheduler s;
};

static void fixture_init(struct fixture *f, int64_t n_blocks, int64_t batch_tokens, int max_seqs, int64_t chunk) {
    struct smelt_error err;
    TEST_OK(kv_pool_init(&f->pool, n_blocks, &err), &err);
    struct sched_config c = {.max_batch_tokens = batch_tokens, .max_seqs = max_seqs, .prefill_chunk = chunk};
    TEST_OK(scheduler_init(&f->s, &c, &f->pool, &err), &err);
}

/* A waiting sequence of n_tokens known tokens. */
static void add(struct fixture *f, struct sched_seq *q, int64_t arrival, int64_t n_tokens) {
    *q = (struct sched_seq){.arrival = arrival, .n_tokens = n_tokens};
    struct smelt_error err;
    TEST_OK(scheduler_add(&f->s, q, &err), &err);
}

static void plan(struct fixture *f) {
    struct smelt_error err;
    TEST_OK(scheduler_plan(&f->s, &err), &err);
}

/* What the engine does after the forward pass: the planned tokens are cached, and a
 * sequence with everything cached samples one more token. */
static void commit(struct fixture *f) {
    const struct sched_plan *p = &f->s.plan;
    for (int i = 0; i < p->n; i++) {
        p->seqs[i]->n_cached += p->n_new[i];
        if (p->seqs[i]->n_cached == p->seqs[i]->n_tokens) p->seqs[i]->n_tokens++;
    }
}

/* Tokens q runs in the plan, -1 when it does not run. */
static int64_t planned(const struct fixture *f, const struct sched_seq *q) {
    for (int i = 0; i < f->s.plan.n; i++)
        if (f->s.plan.seqs[i] == q) return f->s.plan.n_new[i];
    return -1;
}

static void finish(struct fixture *f, struct sched_seq *q) {
    scheduler_remove(&f->s, q);
    kv_table_release(&f->pool, &q->table);
}

/* Every sequence gone, every block back. */
static void fixture_destroy(struct fixture *f) {
    while (f->s.n_seqs) finish(f, f->s.seqs[0]);
    cr_expect_eq(f->pool.n_free, f->pool.n_blocks, "%lld of %lld blocks came back", (long long)f->pool.n_free,
                 (long long)f->pool.n_blocks);
    scheduler_destroy(&f->s);
    kv_pool_destroy(&f->pool);
}

Test(rollout_scheduler, rejects_bad_configs) {
    struct kv_pool pool;
    struct scheduler s;
    struct smelt_error err;
    TEST_OK(kv_pool_init(&pool, 4, &err), &err);
    struct sched_config bad[] = {{0, 1, 1}, {1, 0, 1}, {1, 1, 0}};
    const char *field[] = {"max_batch_tokens", "max_seqs", "prefill_chunk"};
    for (int i = 0; i < 3; i++) {
        TEST_EXPECT_ERROR(scheduler_init(&s, &bad[i], &pool, &err), SMELT_EINVAL, &err);
        cr_expect(strstr(err.message, field[i]), "\"%s\" does not name %s", err.message, field[i]);
        scheduler_destroy(&s);
    }
    kv_pool_destroy(&pool);
}

Test(rollout_scheduler, admits_in_arrival_order_within_the_kv_budget) {
    struct fixture f;
    fixture_init(&f, 7, 1000, 8, 1000);
    struct sched_seq a, b, c, d;
    /* Added out of order: arrival decides. 3 + 3 blocks fit, c's 2 do not, and d (1 block,
     * which would fit) must not jump the queue. */
    add(&f, &d, 3, 1);
    add(&f, &b, 1, 40);
    add(&f, &c, 2, 20);
    add(&f, &a, 0, 40);
    plan(&f);
    cr_expect_eq(f.s.plan.n, 2);
    cr_expect(f.s.plan.seqs[0] == &a && f.s.plan.seqs[1] == &b, "oldest first");
    cr_expect_eq(f.s.plan.tokens, 80);
    cr_expect(planned(&f, &c) < 0 && planned(&f, &d) < 0, "c does not fit; d waits behind it");
    cr_expect(a.running && b.running && !c.running && !d.running);
    cr_expect_eq(f.s.plan.n_preempted, 0, "waiting sequences never preempt");
    cr_expect_eq(f.pool.n_free, 1);
    commit(&f);
    plan(&f); /* the 41st tokens land in blocks a and b hold: still no room for c */
    cr_expect_eq(f.s.plan.n, 2);
    cr_expect_eq(planned(&f, &a), 1);
    cr_expect_eq(planned(&f, &b), 1);
    commit(&f);
    finish(&f, &a);
    plan(&f);
    cr_expect_eq(planned(&f, &b), 1);
    cr_expect_eq(planned(&f, &c), 20, "a's blocks admit c");
    cr_expect_eq(planned(&f, &d), 1, "and d after it");
    fixture_destroy(&f);
}

Test(rollout_scheduler, chunked_prefill_within_the_token_budget) {
    struct fixture f;
    fixture_init(&f, 64, 12, 8, 8);
    struct sched_seq a, b;
    add(&f, &a, 0, 20);
    add(&f, &b, 1, 10);
    plan(&f);
    cr_expect_eq(planned(&f, &a), 8, "one prefill chunk");
    cr_expect_eq(planned(&f, &b), 4, "what is left of the step's 12 tokens");
    cr_expect_eq(f.s.plan.tokens, 12);
    commit(&f);
    plan(&f);
    cr_expect_eq(planned(&f, &a), 8);
    cr_expect_eq(planned(&f, &b), 4);
    commit(&f);
    plan(&f);
    cr_expect_eq(planned(&f, &a), 4, "the prompt's last 4");
    cr_expect_eq(planned(&f, &b), 2, "b's prompt is done after 4 + 4 + 2");
    commit(&f);
    cr_expect_eq(a.n_tokens, 21, "a sampled its first token");
    cr_expect_eq(b.n_tokens, 11);
    plan(&f);
    cr_expect_eq(planned(&f, &a), 1, "decoding");
    cr_expect_eq(planned(&f, &b), 1);
    cr_expect_eq(f.s.plan.n_preempted, 0);
    fixture_destroy(&f);
}

Test(rollout_scheduler, preempts_the_newest_running_sequence) {
    struct fixture f;
    fixture_init(&f, 4, 1000, 8, 1000);
    struct sched_seq a, b, c;
    add(&f, &a, 0, 16); /* one full block each */
    add(&f, &b, 1, 16);
    add(&f, &c, 2, 16);
    plan(&f);
    cr_assert_eq(f.s.plan.n, 3);
    commit(&f); /* each now needs a second block; one is free */
    plan(&f);
    cr_expect_eq(planned(&f, &a), 1, "a takes the free block");
    cr_expect_eq(planned(&f, &b), 1, "b takes c's");
    cr_expect_eq(planned(&f, &c), -1);
    cr_expect_eq(f.s.plan.n_preempted, 1);
    cr_expect(!c.running && c.n_cached == 0 && c.table.n == 0, "c's blocks went back");
    cr_expect_eq(c.n_tokens, 17, "c keeps its tokens, to be recomputed");
    cr_expect_eq(f.pool.n_free, 0);
    commit(&f);
    finish(&f, &a);
    plan(&f);
    cr_expect_eq(planned(&f, &c), 17, "readmitted: c recomputes all it knew");
    fixture_destroy(&f);
}

Test(rollout_scheduler, never_preempts_a_sequence_already_in_the_step) {
    struct fixture f;
    fixture_init(&f, 3, 1000, 8, 1000);
    struct sched_seq a, b;
    add(&f, &a, 0, 16);
    add(&f, &b, 1, 16);
    plan(&f);
    commit(&f);
    plan(&f);
    /* a took the last block; the only other running sequence is a, already planned, so
     * b preempts itself. */
    cr_expect_eq(planned(&f, &a), 1);
    cr_expect_eq(planned(&f, &b), -1);
    cr_expect(a.running && !b.running && b.table.n == 0);
    cr_expect_eq(f.s.plan.n_preempted, 1);
    fixture_destroy(&f);
}

Test(rollout_scheduler, max_seqs_bounds_the_running_set) {
    struct fixture f;
    fixture_init(&f, 64, 1000, 3, 1000);
    struct sched_seq q[5];
    for (int i = 0; i < 5; i++) add(&f, &q[i], i, 4);
    plan(&f);
    cr_expect_eq(f.s.plan.n, 3);
    for (int i = 0; i < 5; i++) cr_expect_eq(q[i].running, i < 3, "sequence %d", i);
    commit(&f);
    plan(&f);
    cr_expect_eq(f.s.plan.n, 3, "the three running ones decode; nobody else gets in");
    commit(&f);
    finish(&f, &q[1]);
    plan(&f);
    cr_expect_eq(f.s.plan.n, 3);
    cr_expect_eq(planned(&f, &q[3]), 4, "the oldest waiting one takes the free place");
    cr_expect_eq(planned(&f, &q[4]), -1);
    fixture_destroy(&f);
}

/* n sequences sharing a parent's 20-token prefill (one full block, one partial), each
 * about to write its first sampled token into the shared partial block. */
static struct sched_seq *forked(struct fixture *f, int n) {
    struct smelt_error err;
    struct sched_seq *q = calloc((size_t)n, sizeof *q);
    cr_assert(q);
    bool has_copy;
    struct kv_copy unused;
    TEST_OK(kv_table_extend(&f->pool, &q[0].table, 0, 20, &unused, &has_copy, &err), &err);
    for (int i = 0; i < n; i++) {
        if (i) TEST_OK(kv_table_fork(&f->pool, &q[0].table, &q[i].table, &err), &err);
        q[i].sample_index = i;
        q[i].n_tokens = 21;
        q[i].n_cached = 20;
        q[i].running = true;
        TEST_OK(scheduler_add(&f->s, &q[i], &err), &err);
    }
    return q;
}

Test(rollout_scheduler, copy_on_write_of_a_shared_block) {
    struct fixture f;
    fixture_init(&f, 8, 1000, 8, 1000);
    struct sched_seq *q = forked(&f, 3);
    int32_t full = q[0].table.blocks[0], partial = q[0].table.blocks[1];
    plan(&f);
    cr_assert_eq(f.s.plan.n, 3);
    /* The last holder writes in place; the others get private copies first. */
    cr_expect_eq(f.s.plan.n_copies, 2);
    for (int i = 0; i < f.s.plan.n_copies; i++) {
        cr_expect_eq(f.s.plan.copies[i].src, partial);
        cr_expect_neq(f.s.plan.copies[i].dst, partial);
        cr_expect_eq(q[i].table.blocks[1], f.s.plan.copies[i].dst, "sample %d writes into its copy", i);
    }
    cr_expect_neq(f.s.plan.copies[0].dst, f.s.plan.copies[1].dst);
    cr_expect_eq(q[2].table.blocks[1], partial);
    cr_expect_eq(f.pool.refcount[full], 3, "the full prompt block stays shared");
    fixture_destroy(&f);
    free(q);
}

/* A plan once held at most 1024 copies and quietly left out every sequence after them. */
Test(rollout_scheduler, more_than_1024_copies_in_one_step) {
    enum { N = 1500 };
    struct fixture f;
    fixture_init(&f, N + 8, 4 * N, 65536, 1000);
    struct sched_seq *q = forked(&f, N);
    plan(&f);
    cr_expect_eq(f.s.plan.n, N, "%d of %d sequences planned", f.s.plan.n, N);
    cr_expect_eq(f.s.plan.n_copies, N - 1);
    cr_expect_eq(f.s.plan.n_preempted, 0);
    cr_expect_eq(f.pool.n_free, 8 - 1);
    fixture_destroy(&f);
    free(q);
}

/* Sequences of several adapters (sched_seq.group): the step's plan keeps each group's
 * sequences together, groups in the order of their oldest, arrival order inside; who
 * runs and how many tokens is the same as without groups. */
Test(rollout_scheduler, groups_a_steps_sequences_by_adapter) {
    struct fixture f;
    fixture_init(&f, 64, 1000, 8, 1000);
    struct sched_seq q[6];
    const uintptr_t group[6] = {7, 0, 9, 7, 0, 9};
    for (int i = 0; i < 6; i++) {
        add(&f, &q[i], i, 3 + i);
        q[i].group = group[i];
    }
    plan(&f);
    cr_assert_eq(f.s.plan.n, 6);
    const int want[6] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++) {
        cr_expect(f.s.plan.seqs[i] == &q[want[i]], "position %d holds the wrong sequence", i);
        cr_expect_eq(f.s.plan.n_new[i], 3 + want[i], "position %d: its tokens moved with it", i);
    }
    cr_expect_eq(f.s.plan.tokens, 3 + 4 + 5 + 6 + 7 + 8);
    fixture_destroy(&f);
}
