/* common/strmap.h: string -> pointer, open addressing with backward-shift deletion. */
#include "common/strmap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_of(const char *s) { /* FNV-1a, then a final mix */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* The slot holding key, or the empty slot where it would go (cap > 0, never full). */
static size_t find(const struct strmap *m, const char *key, uint64_t h) {
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key && (m->slots[j].hash != h || strcmp(m->slots[j].key, key) != 0)) j = (j + 1) & (m->cap - 1);
    return j;
}

static int grow(struct strmap *m, struct smelt_error *err) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    struct strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return error_set(err, SMELT_ENOMEM, "out of memory for a map of %zu", cap);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (slots[j].key) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return SMELT_OK;
}

int strmap_put(struct strmap *m, const char *key, void *value, struct smelt_error *err) {
    if (2 * (m->count + 1) > m->cap) TRY(grow(m, err));
    uint64_t h = hash_of(key);
    size_t j = find(m, key, h);
    if (!m->slots[j].key) {
        char *copy = strdup(key);
        if (!copy) return error_set(err, SMELT_ENOMEM, "out of memory for a map key");
        m->slots[j] = (struct strmap_slot){copy, h, NULL};
        m->count++;
    }
    m->slots[j].value = value;
    return SMELT_OK;
}

void *strmap_get(const struct strmap *m, const char *key) {
    if (!m->cap) return NULL;
    size_t j = find(m, key, hash_of(key));
    return m->slots[j].key ? m->slots[j].value : NULL;
}

/* Whether home lies cyclically in (hole, j]: then the entry at j may not move back to hole. */
static bool stays(size_t home, size_t hole, size_t j) {
    return hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
}

void *strmap_remove(struct strmap *m, const char *key) {
    if (!m->cap) return NULL;
    size_t hole = find(m, key, hash_of(key));
    if (!m->slots[hole].key) return NULL;
    void *value = m->slots[hole].value;
    free(m->slots[hole].key);
    m->count--;
    /* later entries of the probe run move back into the hole when their home allows */
    for (size_t j = (hole + 1) & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1)) {
        if (stays(m->slots[j].hash & (m->cap - 1), hole, j)) continue;
        m->slots[hole] = m->slots[j];
        hole = j;
    }
    m->slots[hole] = (struct strmap_slot){0};
    return value;
}

void strmap_free(struct strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    *m = (struct strmap){0};
}
