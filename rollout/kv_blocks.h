/* Private to rollout/: the KV block pool and per-sequence block tables (vLLM's block
 * manager). A block holds the keys and values of KV_BLOCK_SIZE consecutive tokens of one
 * sequence in every layer; blocks are reference-counted so that the n samples of one
 * prompt share the prompt's blocks, and a shared block is copied before anyone writes
 * into it (copy-on-write). This file only does the bookkeeping: the engine performs
 * the copies it is told about on the cache tensors.
 *
 * Ownership: a pool owns its arrays (kv_pool_destroy); a table owns its block array and
 * one reference on each block it lists (kv_table_release gives them back). */
#ifndef SMELT_ROLLOUT_KV_BLOCKS_H
#define SMELT_ROLLOUT_KV_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "rollout/rollout.h" /* ROLLOUT_KV_BLOCK_TOKENS */

#define KV_BLOCK_SIZE ROLLOUT_KV_BLOCK_TOKENS
/* Returned (positive, not an error) when the pool has too few free blocks. */
#define KV_NO_BLOCKS 1

struct kv_pool {
    int64_t n_blocks;
    int32_t *refcount;   /* [n_blocks] */
    int32_t *free_list;  /* [n_blocks] stack of free block ids */
    int64_t n_free;
};

/* All blocks free (refcount 0); a fresh pool hands out blocks 0, 1, 2, ... SMELT_EINVAL
 * unless 1 <= n_blocks <= INT32_MAX / KV_BLOCK_SIZE (slots are int32). On failure the
 * pool is left zeroed, so kv_pool_destroy is still safe. */
int kv_pool_init(struct kv_pool *pool, int64_t n_blocks, struct smelt_error *err);
void kv_pool_destroy(struct kv_pool *pool);
/* A free block with refcount 1, or -1 when none is left. The free list is a stack: the
 * most recently freed block is handed out first. */
int32_t kv_pool_alloc(struct kv_pool *pool);
/* Referencing a free block, or unreferencing one at refcount 0, breaks an invariant:
 * SMELT_ASSERT. */
void kv_pool_ref(struct kv_pool *pool, int32_t block);
/* Drops one reference; the block returns to the free list at zero. */
void kv_pool_unref(struct kv_pool *pool, int32_t block);

/* Zero-initialise ({0}) before first use. */
struct kv_block_table {
    int32_t *blocks;     /* [cap] block ids in token order; the first n are held */
    int32_t n, cap;
};

/* A copy the engine must make in every layer's cache before the step writes. */
struct kv_copy {
    int32_t src, dst;
};

/* Blocks a table would need to grow from n_cached to n_cached + n_new tokens: the
 * blocks appended, plus one when the existing block the first new token lands in is
 * shared (its copy-on-write). Requires 0 <= n_cached <= n * KV_BLOCK_SIZE and
 * n_new >= 0 (SMELT_ASSERT), and that every block after the one the first new token
 * lands in is held by this table alone (true unless a table is forked mid-step). */
int64_t kv_table_blocks_needed(const struct kv_pool *pool, const struct kv_block_table *table,
                               int64_t n_cached, int64_t n_new);

/* Makes room for tokens [n_cached, n_cached + n_new): appends fresh blocks, and when
 * the block the first new token lands in is shared (refcount > 1) swaps it for a
 * private copy, recorded in *copy with *has_copy = true. All or nothing: when the pool
 * lacks blocks it returns KV_NO_BLOCKS and leaves table and pool unchanged.
 * SMELT_ENOMEM when the table's array cannot grow (nothing changed either); SMELT_EINVAL
 * for negative counts. n_new == 0 changes nothing. The same preconditions as
 * kv_table_blocks_needed. */
int kv_table_extend(struct kv_pool *pool, struct kv_block_table *table, int64_t n_cached,
                    int64_t n_new, struct kv_copy *copy, bool *has_copy, struct smelt_error *err);

/* dst (empty: zeroed or released) shares every block of src (one more reference
 * each). SMELT_ENOMEM leaves dst empty and the pool unchanged. */
int kv_table_fork(struct kv_pool *pool, const struct kv_block_table *src,
                  struct kv_block_table *dst, struct smelt_error *err);

/* Gives every block back (one reference each) and empties the table (its array is
 * freed too; the table is zeroed, ready for reuse). */
void kv_table_release(struct kv_pool *pool, struct kv_block_table *table);

/* The slot (block * KV_BLOCK_SIZE + offset) of token position pos. */
static inline int32_t kv_table_slot(const struct kv_block_table *table, int64_t pos) {
    return table->blocks[pos / KV_BLOCK_SIZE] * KV_BLOCK_SIZE + (int32_t)(pos % KV_BLOCK_SIZE);
}

#endif
