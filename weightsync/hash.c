/* XXH64 (Yann Collet's xxHash, 64-bit, seed 0), written from its specification: four
 * independent lanes over 32-byte stripes, so it runs at memory speed and a bucket's
 * checksum costs far less than moving it. Not cryptographic: it catches bytes that went
 * missing, moved or changed, not an adversary (the connection is the place for that). */
#include "weightsync/weightsync.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "XXH64 reads little-endian words; this host is not little-endian"
#endif

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t read32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t round64(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static inline uint64_t merge_round(uint64_t acc, uint64_t val) {
    acc ^= round64(0, val);
    return acc * P1 + P4;
}

/* The four lanes over every whole 32-byte stripe, folded into one value. */
static uint64_t stripes(const uint8_t **p, const uint8_t *end) {
    uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;
    const uint8_t *q = *p;
    while (end - q >= 32) {
        v1 = round64(v1, read64(q));
        v2 = round64(v2, read64(q + 8));
        v3 = round64(v3, read64(q + 16));
        v4 = round64(v4, read64(q + 24));
        q += 32;
    }
    *p = q;
    uint64_t h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge_round(h, v1);
    h = merge_round(h, v2);
    h = merge_round(h, v3);
    return merge_round(h, v4);
}

uint64_t weightsync_hash(const void *data, size_t bytes) {
    const uint8_t *p = data, *end = p + bytes;
    uint64_t h = bytes >= 32 ? stripes(&p, end) : P5;
    h += (uint64_t)bytes;
    while (end - p >= 8) {
        h ^= round64(0, read64(p));
        h = rotl(h, 27) * P1 + P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p++) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}
