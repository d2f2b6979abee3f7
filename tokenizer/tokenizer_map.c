/* The tokenizer's two hash maps: token string → id (vocabulary, added tokens) and
 * (left id, right id) → (rank, merged id) (BPE merges). Open addressing with linear
 * probing at load <= 1/2: lookups are the inner loop of BPE. */
#include "tokenizer/tokenizer_internal.h"

#include "common/rng.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY_LEN UINT32_MAX

static uint64_t hash_bytes(const char *s, size_t n) { /* FNV-1a, then a final mix */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int str_map_grow(struct tok_str_map *m, struct smelt_error *err) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct tok_str_slot *slots = malloc(cap * sizeof *slots);
    if (!slots) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for a map of %zu", cap);
    for (size_t i = 0; i < cap; i++) slots[i].len = EMPTY_LEN;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].len == EMPTY_LEN) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (slots[j].len != EMPTY_LEN) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return SMELT_OK;
}

/* The slot holding key, or the empty slot where it would go. */
static size_t str_map_find(const struct tok_str_map *m, const char *key, size_t len,
                           uint64_t h) {
    size_t j = h & (m->cap - 1);
    for (;;) {
        const struct tok_str_slot *s = &m->slots[j];
        if (s->len == EMPTY_LEN) return j;
        if (s->hash == h && s->len == len && memcmp(m->keys.data + s->off, key, len) == 0)
            return j;
        j = (j + 1) & (m->cap - 1);
    }
}

int tok_str_map_put(struct tok_str_map *m, const char *key, size_t len, int32_t value,
                    struct smelt_error *err) {
    if (len >= EMPTY_LEN || m->keys.len > UINT32_MAX - len)
        return error_set(err, SMELT_EINVAL, "tokenizer: token strings exceed 4 GiB");
    if (2 * (m->count + 1) > m->cap) {
        int rc = str_map_grow(m, err);
        if (rc) return rc;
    }
    uint64_t h = hash_bytes(key, len);
    size_t j = str_map_find(m, key, len, h);
    if (m->slots[j].len != EMPTY_LEN) {
        m->slots[j].value = value;
        return SMELT_OK;
    }
    uint32_t off = (uint32_t)m->keys.len;
    int rc = tok_bytes_append(&m->keys, key, len, err);
    if (rc) return rc;
    m->slots[j] = (struct tok_str_slot){h, off, (uint32_t)len, value};
    m->count++;
    return SMELT_OK;
}

bool tok_str_map_get(const struct tok_str_map *m, const char *key, size_t len, int32_t *value) {
    if (!m->cap) return false;
    size_t j = str_map_find(m, key, len, hash_bytes(key, len));
    if (m->slots[j].len == EMPTY_LEN) return false;
    *value = m->slots[j].value;
    return true;
}

void tok_str_map_free(struct tok_str_map *m) {
    free(m->slots);
    tok_bytes_free(&m->keys);
    *m = (struct tok_str_map){0};
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

static int pair_map_grow(struct tok_pair_map *m, struct smelt_error *err) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct tok_pair_slot *slots = malloc(cap * sizeof *slots);
    if (!slots) return error_set(err, SMELT_ENOMEM, "tokenizer: out of memory for a map of %zu", cap);
    for (size_t i = 0; i < cap; i++) slots[i].rank = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].rank < 0) continue;
        size_t j = rng_mix64(m->slots[i].key) & (cap - 1);
        while (slots[j].rank >= 0) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return SMELT_OK;
}

static size_t pair_map_find(const struct tok_pair_map *m, uint64_t key) {
    size_t j = rng_mix64(key) & (m->cap - 1);
    while (m->slots[j].rank >= 0 && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
    return j;
}

int tok_pair_map_put(struct tok_pair_map *m, int32_t left, int32_t right, int32_t rank,
                     int32_t merged, struct smelt_error *err) {
    SMELT_ASSERT(rank >= 0);
    if (2 * (m->count + 1) > m->cap) {
        int rc = pair_map_grow(m, err);
        if (rc) return rc;
    }
    uint64_t key = pair_key(left, right);
    size_t j = pair_map_find(m, key);
    if (m->slots[j].rank < 0) m->count++;
    m->slots[j] = (struct tok_pair_slot){key, rank, merged};
    return SMELT_OK;
}

bool tok_pair_map_get(const struct tok_pair_map *m, int32_t left, int32_t right,
                      int32_t *rank, int32_t *merged) {
    if (!m->cap) return false;
    size_t j = pair_map_find(m, pair_key(left, right));
    if (m->slots[j].rank < 0) return false;
    *rank = m->slots[j].rank;
    *merged = m->slots[j].merged;
    return true;
}

void tok_pair_map_free(struct tok_pair_map *m) {
    free(m->slots);
    *m = (struct tok_pair_map){0};
}
