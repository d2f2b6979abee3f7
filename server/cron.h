/* Cron expressions (private to server/): the five standard fields in UTC
 *
 *   minute (0-59)  hour (0-23)  day-of-month (1-31)  month (1-12)  day-of-week (0-7, 0 and 7 = Sunday)
 *
 * each a "*", a number, a range "a-b", a step "*\/n" or "a-b/n" or "a/n", or a comma list
 * of those; month and weekday also take names (jan-dec, sun-sat, any case). When both
 * day fields are restricted a day matches if either does (Vixie cron's rule). The
 * macros @yearly @annually @monthly @weekly @daily @midnight @hourly are accepted.
 *
 * Ownership: struct cron_expr is a plain value. */
#ifndef SMELT_SERVER_CRON_H
#define SMELT_SERVER_CRON_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

struct cron_expr {
    uint64_t minutes;     /* bit m set: minute m matches */
    uint32_t hours;
    uint32_t days;        /* bits 1..31 */
    uint16_t months;      /* bits 1..12 */
    uint8_t weekdays;     /* bits 0..6, Sunday = 0 */
    bool days_restricted, weekdays_restricted;
};

/* SMELT_EINVAL naming the field and what is wrong ("cron: field 2 (hour): 24 is out of
 * 0-23"); the whole expression must be one line of 5 fields or one macro. */
int cron_parse(const char *text, struct cron_expr *out, struct smelt_error *err);

/* The first matching minute strictly after `after` (Unix seconds, UTC), as Unix
 * seconds; -1 when none exists within 5 years (e.g. "0 0 30 2 *"). */
int64_t cron_next(const struct cron_expr *expr, int64_t after);

#endif
