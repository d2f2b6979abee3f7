/* Cron expressions (server/cron.c): any text as a schedule's cron; one that parses gives
 * its next time after a few instants. */
#include "server/cron.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_string(data, size);
    struct cron_expr e;
    struct smelt_error err = {0};
    if (cron_parse(text, &e, &err) == 0) {
        static const int64_t at[] = {0, 951782400 /* 2000-02-29 */, 1798761599 /* 2026-12-31 23:59:59 */};
        for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
            int64_t next = cron_next(&e, at[i]);
            if (next != -1 && next <= at[i]) abort();
        }
    }
    free(text);
    return 0;
}
