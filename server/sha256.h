/* SHA-256 (FIPS 180-4), for hashing API keys at rest and checking uploads. Whole
 * messages only: keys and test payloads fit in memory. */
#ifndef SMELT_SERVER_SHA256_H
#define SMELT_SERVER_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_BYTES 32

/* The 32-byte digest of data[0..len). */
void sha256(const void *data, size_t len, uint8_t out[SHA256_DIGEST_BYTES]);
/* The same digest as 64 lower-case hex digits and a NUL. */
void sha256_hex(const void *data, size_t len, char out[2 * SHA256_DIGEST_BYTES + 1]);

#endif
