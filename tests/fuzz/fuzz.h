/* What the harnesses share (tests/fuzz/README.md): the input as a NUL-terminated string,
 * as a JSON document, or as a file's contents. Every harness calls one parser on the
 * input and frees what it got; the parsers must refuse bad input with an error, never
 * crash, hang, leak or read out of bounds (ASan, UBSan and LeakSanitizer watch). */
#ifndef SMELT_TESTS_FUZZ_H
#define SMELT_TESTS_FUZZ_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a string (malloc'd; NUL bytes in it end the string early). */
static inline char *fuzz_string(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* The input parsed as JSON (NULL when it is not JSON: nothing to test). */
static inline json_t *fuzz_json(const uint8_t *data, size_t size) {
    json_error_t jerr;
    return json_loadb((const char *)data, size, 0, &jerr);
}

/* A file of this process holding the input, for parsers that read paths; rewritten at
 * every call. The path lives until the process ends. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *name) {
    static char path[256];
    snprintf(path, sizeof path, "/tmp/smelt-fuzz-%d-%s", (int)getpid(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    return path;
}

#endif
