/* A job event stream's resume point (server/api_jobs.c): the Last-Event-ID header's value
 * (or ?after=), as libmicrohttpd hands it over (a NUL-terminated string). It is taken
 * exactly when it matches the document's pattern ^(ftevent-)?[0-9]{1,18}$ (a reference
 * matcher here), as the number its digits say; the id an SSE record carries
 * ("id: ftevent-N") reads back as N. */
#include <inttypes.h>

#include "server/server_internal.h"
#include "tests/fuzz/fuzz.h"

/* The pattern, by hand: -1 when s does not match, else the value of its digits. */
static int64_t reference(const char *s) {
    if (strncmp(s, "ftevent-", 8) == 0) s += 8;
    size_t n = strlen(s);
    if (n < 1 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_string(data, size);
    int64_t got = server_event_number(text), want = reference(text);
    if (got != want) {
        fprintf(stderr, "'%s': %" PRId64 ", the pattern says %" PRId64 "\n", text, got, want);
        abort();
    }
    if (got >= 0) { /* the id of the record it names reads back the same */
        char id[64];
        snprintf(id, sizeof id, "ftevent-%" PRId64, got);
        if (server_event_number(id) != got) abort();
    }
    free(text);
    return 0;
}
