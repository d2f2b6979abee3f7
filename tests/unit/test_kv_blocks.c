/* rollout/kv_blocks: the pool (refcounts, LIFO allocation, exhaustion), block tables
 * growing across block boundaries, fork and copy-on-write, all-or-nothing extension,
 * and a seeded stress run of thousands of requests whose simulated cache contents must
 * survive sharing, copies, preemption and cancellation, with every block back at the
 * end. */
#include "tests/unit/testutil.h"

#include <signal.h>
#include <string.h>

#include "rollout/kv_blocks.h"

static void pool_init_ok(struct kv_pool *pool, int64_t n_blocks) {
    struct smelt_error err;
    TEST_OK(kv_pool_init(pool, n_blocks, &err), &err);
}

/* Extends and expects success; returns whether a copy was asked for. */
static bool extend_ok(struct kv_pool *pool, struct kv_block_table *table, int64_t n_cached,
                      int64_t n_new, struct kv_copy *copy) {
    struct smelt_error err;
    bool has_copy = true;
    TEST_OK(kv_table_extend(pool, table, n_cached, n_new, copy, &has_copy, &err), &err);
    return has_copy;
}

/* Every block's refcount equals the references the given tables hold; no table lists a
 * block twice; the free list holds exactly the unreferenced blocks, once each. */
static void check_accounting(const struct kv_pool *pool, struct kv_block_table *const *tables,
                             int n_tables) {
    int64_t n = pool->n_blocks;
    int32_t *refs = calloc((size_t)n, sizeof *refs);
    int32_t *seen_in = malloc((size_t)n * sizeof *seen_in);
    cr_assert(refs && seen_in);
    for (int64_t b = 0; b < n; b++) seen_in[b] = -1;
    for (int t = 0; t < n_tables; t++) {
        for (int32_t i = 0; i < tables[t]->n; i++) {
            int32_t b = tables[t]->blocks[i];
            cr_assert(b >= 0 && b < n, "table %d lists block %d outside the pool", t, b);
            cr_assert_neq(seen_in[b], t, "table %d lists block %d twice", t, b);
            seen_in[b] = t;
            refs[b]++;
        }
    }
    int64_t n_used = 0;
    for (int64_t b = 0; b < n; b++) {
        cr_assert_eq(pool->refcount[b], refs[b], "block %lld: refcount %d, tables hold %d",
                     (long long)b, pool->refcount[b], refs[b]);
        n_used += refs[b] > 0;
    }
    cr_assert_eq(pool->n_free + n_used, n, "n_free %lld + used %lld != %lld blocks",
                 (long long)pool->n_free, (long long)n_used, (long long)n);
    for (int64_t b = 0; b < n; b++) seen_in[b] = 0;
    for (int64_t i = 0; i < pool->n_free; i++) {
        int32_t b = pool->free_list[i];
        cr_assert(b >= 0 && b < n && pool->refcount[b] == 0 && !seen_in[b],
                  "free list entry %lld (block %d) is referenced or repeated", (long long)i, b);
        seen_in[b] = 1;
    }
    free(refs);
    free(seen_in);
}

/* ---- the pool ---- */

Test(kv_blocks, pool_alloc_free_refcounts_lifo) {
    struct kv_pool pool;
    pool_init_ok(&pool, 4);
    cr_expect_eq(pool.n_free, 4);
    for (int32_t b = 0; b < 4; b++) cr_expect_eq(pool.refcount[b], 0);

    for (int32_t want = 0; want < 4; want++) {
        cr_assert_eq(kv_pool_alloc(&pool), want, "a fresh pool hands out blocks in order");
        cr_expect_eq(pool.refcount[want], 1);
    }
    cr_expect_eq(pool.n_free, 0);
    cr_expect_eq(kv_pool_alloc(&pool), -1, "exhausted");
    cr_expect_eq(pool.n_free, 0);

    kv_pool_ref(&pool, 2);
    cr_expect_eq(pool.refcount[2], 2);
    kv_pool_unref(&pool, 2);
    cr_expect_eq(pool.refcount[2], 1);
    cr_expect_eq(pool.n_free, 0, "a block still referenced stays out of the free list");

    kv_pool_unref(&pool, 1);
    kv_pool_unref(&pool, 3);
    cr_expect_eq(pool.n_free, 2);
    cr_expect_eq(pool.refcount[1], 0);
    cr_expect_eq(kv_pool_alloc(&pool), 3, "the last block freed comes back first");
    cr_expect_eq(kv_pool_alloc(&pool), 1);
    cr_expect_eq(kv_pool_alloc(&pool), -1);

    for (int32_t b = 0; b < 4; b++) kv_pool_unref(&pool, b);
    cr_expect_eq(pool.n_free, 4);
    kv_pool_destroy(&pool);
    cr_expect(pool.refcount == NULL && pool.free_list == NULL && pool.n_blocks == 0);
    kv_pool_destroy(&pool); /* a destroyed pool can be destroyed again */
}

Test(kv_blocks, pool_same_schedule_same_blocks) {
    int32_t seen[2][64];
    for (int run = 0; run < 2; run++) {
        struct kv_pool pool;
        pool_init_ok(&pool, 16);
        struct test_rng rng = {.state = 7};
        int32_t held[16];
        int n_held = 0, n_seen = 0;
        for (int i = 0; i < 64; i++) {
            if (n_held > 0 && (n_held == 16 || test_rng_next(&rng) % 2)) {
                int victim = (int)(test_rng_next(&rng) % (uint64_t)n_held);
                kv_pool_unref(&pool, held[victim]);
                held[victim] = held[--n_held];
            } else {
                held[n_held] = kv_pool_alloc(&pool);
                cr_assert_geq(held[n_held], 0);
                seen[run][n_seen++] = held[n_held++];
            }
        }
        for (int i = n_seen; i < 64; i++) seen[run][i] = -1;
        for (int i = 0; i < n_held; i++) kv_pool_unref(&pool, held[i]);
        cr_expect_eq(pool.n_free, 16);
        kv_pool_destroy(&pool);
    }
    cr_expect_arr_eq(seen[0], seen[1], sizeof seen[0], "allocation order is deterministic");
}

Test(kv_blocks, pool_init_rejects_bad_sizes) {
    struct kv_pool pool;
    struct smelt_error err;
    TEST_EXPECT_ERROR(kv_pool_init(&pool, 0, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(kv_pool_init(&pool, -3, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(kv_pool_init(&pool, (int64_t)INT32_MAX / KV_BLOCK_SIZE + 1, &err),
                      SMELT_EINVAL, &err);
    cr_expect(pool.refcount == NULL && pool.n_blocks == 0, "a failed init leaves the pool zeroed");
    kv_pool_destroy(&pool);
}

Test(kv_blocks, unref_of_free_block_aborts, .signal = SIGABRT) {
    struct kv_pool pool;
    pool_init_ok(&pool, 2);
    int32_t b = kv_pool_alloc(&pool);
    kv_pool_unref(&pool, b);
    kv_pool_unref(&pool, b);
}

Test(kv_blocks, ref_of_free_block_aborts, .signal = SIGABRT) {
    struct kv_pool pool;
    pool_init_ok(&pool, 2);
    kv_pool_ref(&pool, 1);
}

/* ---- block tables ---- */

/* Every position maps to its block's slot range, and no two positions share a slot. */
static void check_slots(const struct kv_block_table *table, int64_t n_tokens, int64_t n_blocks) {
    bool *used = calloc((size_t)(n_blocks * KV_BLOCK_SIZE), sizeof *used);
    cr_assert(used);
    for (int64_t pos = 0; pos < n_tokens; pos++) {
        int32_t slot = kv_table_slot(table, pos);
        cr_assert_eq(slot / KV_BLOCK_SIZE, table->blocks[pos / KV_BLOCK_SIZE], "pos %lld",
                     (long long)pos);
        cr_assert_eq(slot % KV_BLOCK_SIZE, pos % KV_BLOCK_SIZE, "pos %lld", (long long)pos);
        cr_assert(!used[slot], "slot %d used twice", slot);
        used[slot] = true;
    }
    free(used);
}

Test(kv_blocks, extend_across_block_boundaries) {
    struct kv_pool pool;
    pool_init_ok(&pool, 32);
    /* Take and give back a few blocks so table ids are not simply 0, 1, 2, ... */
    int32_t scratch[5];
    for (int i = 0; i < 5; i++) scratch[i] = kv_pool_alloc(&pool);
    kv_pool_unref(&pool, scratch[1]);
    kv_pool_unref(&pool, scratch[3]);

    struct kv_block_table table = {0};
    struct kv_copy copy;
    /* {n_cached, n_new, blocks after} */
    const int64_t steps[][3] = {
        {0, 0, 0},   {0, 1, 1},    {1, 14, 1},  {15, 2, 2},  {17, 15, 2},
        {32, 0, 2},  {32, 1, 3},   {33, 100, 9}, {133, 11, 9}, {144, 1, 10},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int64_t n_cached = steps[i][0], n_new = steps[i][1], want_blocks = steps[i][2];
        int64_t n_free = pool.n_free;
        int64_t needed = kv_table_blocks_needed(&pool, &table, n_cached, n_new);
        cr_expect_eq(needed, want_blocks - table.n, "step %zu: blocks needed", i);
        cr_expect(!extend_ok(&pool, &table, n_cached, n_new, &copy), "step %zu: private table", i);
        cr_expect_eq(table.n, want_blocks, "step %zu: %lld tokens", i, (long long)(n_cached + n_new));
        cr_expect_eq(n_free - pool.n_free, needed, "step %zu: pool gave what was needed", i);
        check_slots(&table, n_cached + n_new, pool.n_blocks);
    }
    cr_expect_eq(table.blocks[0], scratch[3], "freed blocks are reused first, last freed first");
    cr_expect_eq(table.blocks[1], scratch[1]);
    cr_expect_eq(table.blocks[2], 5);
    cr_expect_eq(kv_table_slot(&table, 17), scratch[1] * KV_BLOCK_SIZE + 1);

    int32_t held[] = {scratch[0], scratch[2], scratch[4]};
    struct kv_block_table scratch_table = {.blocks = held, .n = 3, .cap = 3};
    struct kv_block_table *tables[] = {&table, &scratch_table};
    check_accounting(&pool, tables, 2);
    kv_table_release(&pool, &table);
    cr_expect(table.blocks == NULL && table.n == 0 && table.cap == 0);
    for (int i = 0; i < 5; i++)
        if (i != 1 && i != 3) kv_pool_unref(&pool, scratch[i]);
    cr_expect_eq(pool.n_free, 32);
    kv_pool_destroy(&pool);
}

Test(kv_blocks, extend_rejects_negative_counts) {
    struct kv_pool pool;
    pool_init_ok(&pool, 4);
    struct kv_block_table table = {0};
    struct kv_copy copy;
    bool has_copy = true;
    struct smelt_error err;
    TEST_EXPECT_ERROR(kv_table_extend(&pool, &table, 0, -1, &copy, &has_copy, &err), SMELT_EINVAL,
                      &err);
    TEST_EXPECT_ERROR(kv_table_extend(&pool, &table, -1, 1, &copy, &has_copy, &err), SMELT_EINVAL,
                      &err);
    cr_expect(!has_copy);
    cr_expect_eq(table.n, 0);
    cr_expect_eq(pool.n_free, 4);
    kv_pool_destroy(&pool);
}

Test(kv_blocks, extend_past_the_table_aborts, .signal = SIGABRT) {
    struct kv_pool pool;
    pool_init_ok(&pool, 4);
    struct kv_block_table table = {0};
    struct kv_copy copy;
    extend_ok(&pool, &table, 0, 16, &copy);
    /* 17 tokens cannot be cached in one block: the caller's count is broken. */
    extend_ok(&pool, &table, 17, 1, &copy);
}

/* ---- fork and copy-on-write ---- */

Test(kv_blocks, fork_shares_and_first_write_copies) {
    enum { N_CHILDREN = 7, N_SEQS = N_CHILDREN + 1, POOL = 64 };
    struct kv_pool pool;
    pool_init_ok(&pool, POOL);
    struct smelt_error err;
    struct kv_copy copy;

    /* seqs[0] is the parent: a 20-token prompt, one full block and one partial. */
    struct kv_block_table seqs[N_SEQS] = {{0}};
    struct kv_block_table *tables[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) tables[i] = &seqs[i];
    extend_ok(&pool, &seqs[0], 0, 20, &copy);
    cr_assert_eq(seqs[0].n, 2);
    const int32_t full = seqs[0].blocks[0], partial = seqs[0].blocks[1];
    for (int i = 1; i < N_SEQS; i++) TEST_OK(kv_table_fork(&pool, &seqs[0], &seqs[i], &err), &err);
    cr_expect_eq(pool.refcount[full], N_SEQS);
    cr_expect_eq(pool.refcount[partial], N_SEQS);
    cr_expect_eq(pool.n_free, POOL - 2, "forks take no blocks");
    check_accounting(&pool, tables, N_SEQS);

    /* Each sequence writes token 20 into the shared partial block: every writer but the
     * last holder copies it first, the parent included. */
    int n_copies = 0;
    int32_t private_partial[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        bool last_holder = i == N_SEQS - 1;
        cr_expect_eq(kv_table_blocks_needed(&pool, &seqs[i], 20, 1), last_holder ? 0 : 1,
                     "seq %d", i);
        bool copied = extend_ok(&pool, &seqs[i], 20, 1, &copy);
        cr_expect_eq(copied, !last_holder, "seq %d", i);
        if (copied) {
            n_copies++;
            cr_expect_eq(copy.src, partial, "seq %d copies the shared partial block", i);
            cr_expect_eq(copy.dst, seqs[i].blocks[1]);
            cr_expect_neq(copy.dst, partial);
        } else {
            cr_expect_eq(seqs[i].blocks[1], partial, "the last holder keeps the original");
        }
        cr_expect_eq(seqs[i].n, 2);
        cr_expect_eq(seqs[i].blocks[0], full, "the full prompt block stays shared");
        private_partial[i] = seqs[i].blocks[1];
        cr_expect_eq(pool.refcount[partial], last_holder ? 1 : N_SEQS - 1 - i, "seq %d", i);
        check_accounting(&pool, tables, N_SEQS);
    }
    cr_expect_eq(n_copies, N_CHILDREN);
    cr_expect_eq(pool.refcount[full], N_SEQS);
    cr_expect_eq(pool.refcount[partial], 1);
    cr_expect_eq(POOL - pool.n_free, 1 + N_SEQS, "one shared prompt block + one partial per writer");
    for (int i = 0; i < N_SEQS; i++)
        for (int j = i + 1; j < N_SEQS; j++) cr_expect_neq(private_partial[i], private_partial[j]);

    /* Private from here on: filling the block and starting the next copy nothing. */
    for (int i = 0; i < N_SEQS; i++) {
        cr_expect(!extend_ok(&pool, &seqs[i], 21, 11, &copy), "seq %d", i);
        cr_expect(!extend_ok(&pool, &seqs[i], 32, 1, &copy), "seq %d", i);
        cr_expect_eq(seqs[i].n, 3);
    }
    cr_expect_eq(POOL - pool.n_free, 1 + 2 * N_SEQS);
    check_accounting(&pool, tables, N_SEQS);

    for (int i = 0; i < N_SEQS; i++) kv_table_release(&pool, &seqs[i]);
    cr_expect_eq(pool.n_free, POOL);
    for (int32_t b = 0; b < POOL; b++) cr_expect_eq(pool.refcount[b], 0);
    kv_pool_destroy(&pool);
}

Test(kv_blocks, copy_on_write_with_appended_blocks) {
    struct kv_pool pool;
    pool_init_ok(&pool, 16);
    struct smelt_error err;
    struct kv_copy copy;
    struct kv_block_table parent = {0}, child = {0};
    extend_ok(&pool, &parent, 0, 20, &copy);
    TEST_OK(kv_table_fork(&pool, &parent, &child, &err), &err);

    /* Tokens 20..49: a copy of the partial block plus blocks 2 and 3. */
    cr_expect_eq(kv_table_blocks_needed(&pool, &child, 20, 30), 3);
    cr_expect(extend_ok(&pool, &child, 20, 30, &copy));
    cr_expect_eq(copy.src, parent.blocks[1]);
    cr_expect_eq(child.n, 4);
    cr_expect_eq(child.blocks[0], parent.blocks[0]);
    cr_expect_eq(child.blocks[1], copy.dst);
    cr_expect_eq(pool.n_free, 16 - 2 - 3);

    /* A block reserved past the cached tokens and shared is written at its first slot
     * (n_cached a multiple of KV_BLOCK_SIZE): it is copied too. */
    struct kv_block_table reserved = {0}, sibling = {0};
    extend_ok(&pool, &reserved, 0, 17, &copy); /* 2 blocks, only 16 tokens computed */
    TEST_OK(kv_table_fork(&pool, &reserved, &sibling, &err), &err);
    cr_expect_eq(kv_table_blocks_needed(&pool, &sibling, 16, 1), 1);
    cr_expect(extend_ok(&pool, &sibling, 16, 1, &copy));
    cr_expect_eq(copy.src, reserved.blocks[1]);
    cr_expect_eq(sibling.blocks[1], copy.dst);
    cr_expect_eq(sibling.blocks[0], reserved.blocks[0]);

    /* Forking an empty table takes nothing. */
    struct kv_block_table empty = {0}, empty_fork = {0};
    TEST_OK(kv_table_fork(&pool, &empty, &empty_fork, &err), &err);
    cr_expect_eq(empty_fork.n, 0);

    struct kv_block_table *tables[] = {&parent, &child, &reserved, &sibling, &empty_fork};
    check_accounting(&pool, tables, 5);
    for (int i = 0; i < 5; i++) kv_table_release(&pool, tables[i]);
    cr_expect_eq(pool.n_free, 16);
    kv_pool_destroy(&pool);
}

/* ---- all or nothing ---- */

Test(kv_blocks, extend_short_of_blocks_changes_nothing) {
    struct kv_pool pool;
    pool_init_ok(&pool, 3);
    struct smelt_error err;
    struct kv_copy copy = {-7, -7};
    struct kv_block_table parent = {0}, child = {0};
    extend_ok(&pool, &parent, 0, 20, &copy);
    TEST_OK(kv_table_fork(&pool, &parent, &child, &err), &err);
    cr_assert_eq(pool.n_free, 1);

    /* Needs a copy of the partial block and two more blocks; one is free. */
    int32_t before_blocks[2] = {child.blocks[0], child.blocks[1]};
    int32_t before_refs[3] = {pool.refcount[0], pool.refcount[1], pool.refcount[2]};
    int32_t before_free_top = pool.free_list[0];
    cr_expect_eq(kv_table_blocks_needed(&pool, &child, 20, 30), 3);
    bool has_copy = true;
    copy = (struct kv_copy){-7, -7};
    cr_expect_eq(kv_table_extend(&pool, &child, 20, 30, &copy, &has_copy, &err), KV_NO_BLOCKS);
    cr_expect(!has_copy);
    cr_expect(copy.src == -7 && copy.dst == -7, "no copy reported");
    cr_expect_eq(pool.n_free, 1);
    cr_expect_eq(pool.free_list[0], before_free_top);
    cr_expect_arr_eq(pool.refcount, before_refs, sizeof before_refs);
    cr_expect_eq(child.n, 2);
    cr_expect_arr_eq(child.blocks, before_blocks, sizeof before_blocks);

    /* A fresh table asking for more than the pool has. */
    struct kv_block_table big = {0};
    cr_expect_eq(kv_table_extend(&pool, &big, 0, 17, &copy, &has_copy, &err), KV_NO_BLOCKS);
    cr_expect(big.n == 0 && big.blocks == NULL);
    cr_expect_eq(pool.n_free, 1);

    /* Exactly enough: the copy alone fits, and so does a copy plus nothing appended
     * once the parent is gone. */
    cr_expect(extend_ok(&pool, &child, 20, 12, &copy));
    cr_expect_eq(pool.n_free, 0);
    cr_expect_eq(kv_table_extend(&pool, &child, 32, 1, &copy, &has_copy, &err), KV_NO_BLOCKS);
    kv_table_release(&pool, &parent);
    cr_expect_eq(pool.n_free, 1, "the parent's partial block is freed; the full one is shared");
    cr_expect(!extend_ok(&pool, &child, 32, 1, &copy));
    cr_expect_eq(pool.n_free, 0);

    struct kv_block_table *tables[] = {&child};
    check_accounting(&pool, tables, 1);
    kv_table_release(&pool, &child);
    cr_expect_eq(pool.n_free, 3);
    kv_pool_destroy(&pool);
}

/* ---- stress: a simulated engine ----
 * Requests arrive with random prompt lengths and n; the prompt is prefilled in random
 * chunks, its samples fork from it and decode one token per step. When the pool runs
 * short a random live sequence is preempted; sequences are also cancelled at random.
 * Every write stores a value unique to (request, sample or prompt, position) in a
 * simulated cache, and the engine's copies are applied to it, so a missing or wrong
 * copy-on-write shows up as a sequence reading someone else's token. */

enum { SIM_BLOCKS = 96, SIM_SEQS = 64, SIM_REQUESTS = 3000, SIM_MAX_N = 8,
       SIM_MAX_PROMPT = 80, SIM_MAX_DECODE = 48 };

struct sim_seq {
    struct kv_block_table table;
    bool live;
    uint64_t request, sample;
    int64_t prompt_len, n_tokens, n_final;
};

struct sim {
    struct kv_pool pool;
    struct sim_seq seqs[SIM_SEQS];
    uint64_t cache[SIM_BLOCKS * KV_BLOCK_SIZE]; /* [slot] the value written there */
    struct test_rng rng;
    uint64_t next_request;
    int64_t n_copies, n_short, n_preempted, n_cancelled, n_finished, n_dropped_prompts;
};

static uint64_t sim_rand(struct sim *sim, uint64_t n) { return test_rng_next(&sim->rng) % n; }

static uint64_t token_value(const struct sim_seq *seq, int64_t pos) {
    uint64_t owner = pos < seq->prompt_len ? 0 : seq->sample + 1;
    struct test_rng hash = {.state = ((seq->request * 16 + owner) << 12) + (uint64_t)pos};
    return test_rng_next(&hash); /* a bijection of state: distinct inputs, distinct values */
}

static void sim_release(struct sim *sim, int i) {
    kv_table_release(&sim->pool, &sim->seqs[i].table);
    sim->seqs[i].live = false;
}

static int sim_random_live(struct sim *sim) {
    int n_live = 0;
    for (int i = 0; i < SIM_SEQS; i++) n_live += sim->seqs[i].live;
    if (n_live == 0) return -1;
    int k = (int)sim_rand(sim, (uint64_t)n_live);
    for (int i = 0; i < SIM_SEQS; i++)
        if (sim->seqs[i].live && k-- == 0) return i;
    return -1;
}

static void sim_verify(const struct sim *sim, int i) {
    const struct sim_seq *seq = &sim->seqs[i];
    for (int64_t pos = 0; pos < seq->n_tokens; pos++)
        cr_assert_eq(sim->cache[kv_table_slot(&seq->table, pos)], token_value(seq, pos),
                     "request %llu sample %llu reads a wrong value at position %lld",
                     (unsigned long long)seq->request, (unsigned long long)seq->sample,
                     (long long)pos);
}

/* Appends n_new tokens to seq i, preempting random sequences while the pool is short.
 * False when seq i itself was preempted. */
static bool sim_extend(struct sim *sim, int i, int64_t n_new) {
    struct sim_seq *seq = &sim->seqs[i];
    for (;;) {
        int64_t n_free = sim->pool.n_free;
        int32_t n_before = seq->table.n;
        struct kv_copy copy;
        bool has_copy;
        struct smelt_error err;
        int rc = kv_table_extend(&sim->pool, &seq->table, seq->n_tokens, n_new, &copy,
                                 &has_copy, &err);
        if (rc == SMELT_OK) {
            if (has_copy) {
                memcpy(&sim->cache[copy.dst * KV_BLOCK_SIZE], &sim->cache[copy.src * KV_BLOCK_SIZE],
                       KV_BLOCK_SIZE * sizeof sim->cache[0]);
                sim->n_copies++;
            }
            for (int64_t pos = seq->n_tokens; pos < seq->n_tokens + n_new; pos++)
                sim->cache[kv_table_slot(&seq->table, pos)] = token_value(seq, pos);
            seq->n_tokens += n_new;
            return true;
        }
        cr_assert_eq(rc, KV_NO_BLOCKS, "extend failed: %s", err.message);
        cr_assert(!has_copy && sim->pool.n_free == n_free && seq->table.n == n_before,
                  "a short extend changed something");
        sim->n_short++;
        int victim = sim_random_live(sim);
        sim_release(sim, victim);
        sim->n_preempted++;
        if (victim == i) return false;
    }
}

static void sim_admit(struct sim *sim) {
    int n = 1 + (int)sim_rand(sim, SIM_MAX_N);
    int slots[SIM_MAX_N + 1], n_slots = 0;
    for (int i = 0; i < SIM_SEQS && n_slots < n + 1; i++)
        if (!sim->seqs[i].live) slots[n_slots++] = i;
    if (n_slots < n + 1) return; /* no room this step */

    int p = slots[0];
    struct sim_seq *prompt = &sim->seqs[p];
    *prompt = (struct sim_seq){.live = true, .request = sim->next_request++,
                               .prompt_len = 1 + (int64_t)sim_rand(sim, SIM_MAX_PROMPT)};
    while (prompt->n_tokens < prompt->prompt_len) { /* chunked prefill */
        int64_t left = prompt->prompt_len - prompt->n_tokens;
        if (!sim_extend(sim, p, 1 + (int64_t)sim_rand(sim, (uint64_t)left))) {
            sim->n_dropped_prompts++;
            return;
        }
    }
    /* Either the prompt's own sequence becomes sample 0 (vLLM's way), or every sample
     * is a fork and the prompt's table is dropped. */
    bool prompt_is_sample0 = sim_rand(sim, 2) == 0;
    for (int s = prompt_is_sample0 ? 1 : 0; s < n; s++) {
        struct sim_seq *child = &sim->seqs[slots[s + 1]];
        *child = *prompt;
        child->table = (struct kv_block_table){0};
        child->sample = (uint64_t)s;
        child->n_final = prompt->prompt_len + 1 + (int64_t)sim_rand(sim, SIM_MAX_DECODE);
        struct smelt_error err;
        TEST_OK(kv_table_fork(&sim->pool, &prompt->table, &child->table, &err), &err);
    }
    if (prompt_is_sample0)
        prompt->n_final = prompt->prompt_len + 1 + (int64_t)sim_rand(sim, SIM_MAX_DECODE);
    else
        sim_release(sim, p);
}

static void sim_check_accounting(struct sim *sim) {
    struct kv_block_table *tables[SIM_SEQS];
    int n_tables = 0;
    for (int i = 0; i < SIM_SEQS; i++)
        if (sim->seqs[i].live) tables[n_tables++] = &sim->seqs[i].table;
    check_accounting(&sim->pool, tables, n_tables);
}

Test(kv_blocks, stress_every_block_returns) {
    struct sim *sim = calloc(1, sizeof *sim);
    cr_assert(sim);
    pool_init_ok(&sim->pool, SIM_BLOCKS);
    sim->rng.state = 20240605;
    int max_live = 0;
    for (int64_t step = 0;; step++) {
        if (sim->next_request < SIM_REQUESTS && sim_rand(sim, 4) != 0) sim_admit(sim);
        int start = (int)sim_rand(sim, SIM_SEQS), n_live = 0;
        for (int k = 0; k < SIM_SEQS; k++) {
            int i = (start + k) % SIM_SEQS;
            if (!sim->seqs[i].live) continue;
            if (sim_rand(sim, 100) < 2) {
                sim_release(sim, i);
                sim->n_cancelled++;
                continue;
            }
            if (!sim_extend(sim, i, 1)) continue;
            if (sim->seqs[i].n_tokens == sim->seqs[i].n_final) {
                sim_verify(sim, i);
                sim_release(sim, i);
                sim->n_finished++;
            }
        }
        for (int i = 0; i < SIM_SEQS; i++) n_live += sim->seqs[i].live;
        if (n_live > max_live) max_live = n_live;
        sim_check_accounting(sim);
        if (step % 8 == 0)
            for (int i = 0; i < SIM_SEQS; i++)
                if (sim->seqs[i].live) sim_verify(sim, i);
        if (sim->next_request == SIM_REQUESTS && n_live == 0) break;
    }
    cr_expect_eq(sim->pool.n_free, SIM_BLOCKS, "every block is back in the pool");
    for (int32_t b = 0; b < SIM_BLOCKS; b++) cr_expect_eq(sim->pool.refcount[b], 0, "block %d", b);
    sim_check_accounting(sim);
    /* The run must have exercised what it claims to. */
    cr_expect_gt(sim->n_copies, 1000, "%lld copies", (long long)sim->n_copies);
    cr_expect_gt(sim->n_short, 100, "%lld short extends", (long long)sim->n_short);
    cr_expect_gt(sim->n_cancelled, 100);
    cr_expect_gt(sim->n_finished, 1000);
    cr_expect_gt(sim->n_dropped_prompts, 0);
    cr_expect_gt(max_live, 24);
    cr_log_info("kv stress: %lld copies, %lld short, %lld preempted, %lld cancelled, "
                "%lld finished, %lld prompts dropped, max %d live",
                (long long)sim->n_copies, (long long)sim->n_short, (long long)sim->n_preempted,
                (long long)sim->n_cancelled, (long long)sim->n_finished,
                (long long)sim->n_dropped_prompts, max_live);
    kv_pool_destroy(&sim->pool);
    free(sim);
}
