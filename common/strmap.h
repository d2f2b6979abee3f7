/* A map from strings to pointers: open addressing, linear probing, load <= 1/2, deletion
 * by backward shift (no tombstones), so lookups stay O(1) however many keys come and go.
 * The map owns copies of its keys, never the values. Not thread-safe. */
#ifndef SMELT_COMMON_STRMAP_H
#define SMELT_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct strmap_slot {
    char *key; /* NULL: empty */
    uint64_t hash;
    void *value;
};

/* Zero-initialized is an empty map. Iterate slots[0..cap) whose key is not NULL. */
struct strmap {
    struct strmap_slot *slots;
    size_t cap, count;
};

/* Sets key's value (replacing an existing one's). */
int strmap_put(struct strmap *m, const char *key, void *value, struct smelt_error *err);
/* key's value, or NULL. */
void *strmap_get(const struct strmap *m, const char *key);
/* Removes key; its value (NULL when absent) is returned to the caller, who owns it. */
void *strmap_remove(struct strmap *m, const char *key);
/* Frees the keys and slots (not the values); the map is empty again. */
void strmap_free(struct strmap *m);

#endif
