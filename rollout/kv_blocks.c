/* The KV block pool and per-sequence block tables. The free list is a stack, so the
 * order blocks are handed out depends only on the order of allocations and frees: a
 * replayed schedule touches the same cache slots. */
#include "rollout/kv_blocks.h"

#include <stdlib.h>
#include <string.h>

/* Slots are int32 (block * KV_BLOCK_SIZE + offset), which bounds the pool. */
#define KV_MAX_BLOCKS ((int64_t)INT32_MAX / KV_BLOCK_SIZE)
#define KV_MAX_TOKENS (KV_MAX_BLOCKS * KV_BLOCK_SIZE)

int kv_pool_init(struct kv_pool *pool, int64_t n_blocks, struct smelt_error *err) {
    memset(pool, 0, sizeof *pool);
    if (n_blocks < 1 || n_blocks > KV_MAX_BLOCKS)
        return error_set(err, SMELT_EINVAL, "kv pool: n_blocks %lld outside [1, %lld]",
                         (long long)n_blocks, (long long)KV_MAX_BLOCKS);
    pool->refcount = calloc((size_t)n_blocks, sizeof *pool->refcount);
    pool->free_list = malloc((size_t)n_blocks * sizeof *pool->free_list);
    if (!pool->refcount || !pool->free_list) {
        kv_pool_destroy(pool);
        return error_set(err, SMELT_ENOMEM, "kv pool: cannot allocate %lld blocks",
                         (long long)n_blocks);
    }
    /* Top of the stack is block 0, so a fresh pool hands out 0, 1, 2, ... */
    for (int64_t i = 0; i < n_blocks; i++) pool->free_list[i] = (int32_t)(n_blocks - 1 - i);
    pool->n_blocks = n_blocks;
    pool->n_free = n_blocks;
    return SMELT_OK;
}

void kv_pool_destroy(struct kv_pool *pool) {
    free(pool->refcount);
    free(pool->free_list);
    memset(pool, 0, sizeof *pool);
}

int32_t kv_pool_alloc(struct kv_pool *pool) {
    if (pool->n_free == 0) return -1;
    int32_t block = pool->free_list[--pool->n_free];
    SMELT_ASSERT(pool->refcount[block] == 0);
    pool->refcount[block] = 1;
    return block;
}

void kv_pool_ref(struct kv_pool *pool, int32_t block) {
    SMELT_ASSERT(block >= 0 && block < pool->n_blocks);
    /* A free block has no contents anyone could be sharing. */
    SMELT_ASSERT(pool->refcount[block] > 0);
    pool->refcount[block]++;
}

void kv_pool_unref(struct kv_pool *pool, int32_t block) {
    SMELT_ASSERT(block >= 0 && block < pool->n_blocks);
    SMELT_ASSERT(pool->refcount[block] > 0);
    if (--pool->refcount[block] == 0) {
        SMELT_ASSERT(pool->n_free < pool->n_blocks);
        pool->free_list[pool->n_free++] = block;
    }
}

static int64_t blocks_for_tokens(int64_t n_tokens) {
    return (n_tokens + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
}

/* Index of the existing shared block the first new token is written into, or -1. */
static int64_t shared_block_to_copy(const struct kv_pool *pool,
                                    const struct kv_block_table *table, int64_t n_cached,
                                    int64_t n_new) {
    int64_t first = n_cached / KV_BLOCK_SIZE;
    if (n_new == 0 || first >= table->n) return -1;
    /* Blocks after the first written one must be this table's alone: only one copy can
     * be reported per extend. */
    for (int64_t i = first + 1; i < table->n; i++)
        SMELT_ASSERT(pool->refcount[table->blocks[i]] == 1);
    return pool->refcount[table->blocks[first]] > 1 ? first : -1;
}

int64_t kv_table_blocks_needed(const struct kv_pool *pool, const struct kv_block_table *table,
                               int64_t n_cached, int64_t n_new) {
    SMELT_ASSERT(n_cached >= 0 && n_new >= 0 && n_new <= KV_MAX_TOKENS);
    SMELT_ASSERT(n_cached <= (int64_t)table->n * KV_BLOCK_SIZE);
    int64_t appended = blocks_for_tokens(n_cached + n_new) - table->n;
    if (appended < 0) appended = 0;
    return appended + (shared_block_to_copy(pool, table, n_cached, n_new) >= 0 ? 1 : 0);
}

static int table_reserve(struct kv_block_table *table, int64_t n_needed, struct smelt_error *err) {
    if (n_needed <= table->cap) return SMELT_OK;
    SMELT_ASSERT(n_needed <= KV_MAX_BLOCKS);
    int64_t cap = table->cap > 0 ? 2 * (int64_t)table->cap : 4;
    if (cap < n_needed) cap = n_needed;
    if (cap > KV_MAX_BLOCKS) cap = KV_MAX_BLOCKS;
    int32_t *blocks = realloc(table->blocks, (size_t)cap * sizeof *blocks);
    if (!blocks)
        return error_set(err, SMELT_ENOMEM, "kv block table: cannot grow to %lld blocks",
                         (long long)cap);
    table->blocks = blocks;
    table->cap = (int32_t)cap;
    return SMELT_OK;
}

int kv_table_extend(struct kv_pool *pool, struct kv_block_table *table, int64_t n_cached,
                    int64_t n_new, struct kv_copy *copy, bool *has_copy, struct smelt_error *err) {
    SMELT_ASSERT(copy && has_copy);
    *has_copy = false;
    if (n_cached < 0 || n_new < 0 || n_new > KV_MAX_TOKENS)
        return error_set(err, SMELT_EINVAL, "kv block table: cannot extend %lld cached tokens by %lld",
                         (long long)n_cached, (long long)n_new);
    int64_t needed = kv_table_blocks_needed(pool, table, n_cached, n_new);
    if (needed > pool->n_free) return KV_NO_BLOCKS;
    int64_t n_total = blocks_for_tokens(n_cached + n_new);
    if (n_total > table->n) {
        int rc = table_reserve(table, n_total, err);
        if (rc != SMELT_OK) return rc;
    }

    int64_t shared = shared_block_to_copy(pool, table, n_cached, n_new);
    if (shared >= 0) {
        int32_t old = table->blocks[shared];
        int32_t fresh = kv_pool_alloc(pool);
        SMELT_ASSERT(fresh >= 0);
        kv_pool_unref(pool, old);
        table->blocks[shared] = fresh;
        *copy = (struct kv_copy){.src = old, .dst = fresh};
        *has_copy = true;
    }
    while (table->n < n_total) {
        int32_t fresh = kv_pool_alloc(pool);
        SMELT_ASSERT(fresh >= 0);
        table->blocks[table->n++] = fresh;
    }
    return SMELT_OK;
}

int kv_table_fork(struct kv_pool *pool, const struct kv_block_table *src,
                  struct kv_block_table *dst, struct smelt_error *err) {
    SMELT_ASSERT(src != dst && dst->n == 0);
    if (src->n == 0) return SMELT_OK;
    int rc = table_reserve(dst, src->n, err);
    if (rc != SMELT_OK) return error_wrap(err, rc, "forking a block table");
    memcpy(dst->blocks, src->blocks, (size_t)src->n * sizeof *dst->blocks);
    dst->n = src->n;
    for (int32_t i = 0; i < dst->n; i++) kv_pool_ref(pool, dst->blocks[i]);
    return SMELT_OK;
}

void kv_table_release(struct kv_pool *pool, struct kv_block_table *table) {
    for (int32_t i = 0; i < table->n; i++) kv_pool_unref(pool, table->blocks[i]);
    free(table->blocks);
    memset(table, 0, sizeof *table);
}
