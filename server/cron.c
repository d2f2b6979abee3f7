/* Cron expressions: parsing the five fields into bit sets, and finding the next
 * matching minute by skipping whole months, days and hours that cannot match.
 *
 * Choices where crons differ (written down in cron.h's terms):
 *  - A day field counts as restricted unless its text begins with '*' (Vixie's test),
 *    so "*\/2" in day-of-month still ANDs with the weekday field.
 *  - Ranges never wrap ("17-9" is refused), except that a weekday range may end at
 *    "sun" meaning 7 ("fri-sun").
 *  - A step is 1 up to the field's maximum; "*\/60" in the minute field would only
 *    ever match 0 and is refused as a likely mistake.
 *  - Only spaces and tabs separate fields; anything else outside the grammar (a line
 *    break included) is refused, so every message quotes printable ASCII only. */
#include "server/cron.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CRON_MAX_TEXT_BYTES 255
#define CRON_N_FIELDS 5
/* "Within 5 years": five 365-day years plus the two leap days they can hold. */
#define CRON_HORIZON_DAYS (5 * 365 + 2)

struct cron_field {
    const char *name;
    int min, max;
    const char *const *names; /* names[i] is value i + names_base; NULL: numbers only */
    int names_base, n_names;
    const char *names_hint;
};

static const char *const MONTH_NAMES[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                          "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const WEEKDAY_NAMES[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

static const struct cron_field FIELDS[CRON_N_FIELDS] = {
    {"minute", 0, 59, NULL, 0, 0, NULL},
    {"hour", 0, 23, NULL, 0, 0, NULL},
    {"day-of-month", 1, 31, NULL, 0, 0, NULL},
    {"month", 1, 12, MONTH_NAMES, 1, 12, "jan-dec"},
    {"day-of-week", 0, 7, WEEKDAY_NAMES, 0, 7, "sun-sat"},
};
enum { FIELD_DAY_OF_WEEK = 4 };

struct cron_macro {
    const char *name, *expansion;
};

static const struct cron_macro MACROS[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

/* A piece of the input: not NUL-terminated. */
struct span {
    const char *p;
    int len;
};

/* ---- parsing one field ---- */

struct field_ctx {
    int index; /* 0-based; messages say index + 1 */
    const struct cron_field *f;
    struct span text, item;
    struct smelt_error *err;
};

#define FIELD_ERROR(ctx, fmt, ...)                                                          \
    error_set((ctx)->err, SMELT_EINVAL, "cron: field %d (%s): " fmt, (ctx)->index + 1,      \
              (ctx)->f->name, __VA_ARGS__)

static bool is_separator(char c) { return c == ' ' || c == '\t'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Refuses anything but the field grammar's characters before any message quotes the
 * field, so quoted text is always printable. */
static int check_characters(const struct field_ctx *ctx) {
    for (int i = 0; i < ctx->text.len; i++) {
        unsigned char c = (unsigned char)ctx->text.p[i];
        if (is_digit((char)c) || is_alpha((char)c) || strchr("*,-/", c)) continue;
        if (c == '\n' || c == '\r')
            return FIELD_ERROR(ctx, "line break at byte %d (the expression must be one line)",
                               i + 1);
        if (c < 0x20 || c >= 0x7f)
            return FIELD_ERROR(ctx, "byte 0x%02x at byte %d is not a printable character", c,
                               i + 1);
        return FIELD_ERROR(ctx, "unexpected character '%c' in '%.*s'", c, ctx->text.len,
                           ctx->text.p);
    }
    return SMELT_OK;
}

/* A number or name at *pos inside the current item; on success *pos is past it. */
static int parse_value(const struct field_ctx *ctx, int *pos, int *value) {
    const char *p = ctx->item.p + *pos;
    int len = 0;
    if (is_digit(p[0])) {
        long v = 0;
        while (*pos + len < ctx->item.len && is_digit(p[len])) {
            if (v < 1000000) v = v * 10 + (p[len] - '0'); /* saturates; quoted as text */
            len++;
        }
        if (v < ctx->f->min || v > ctx->f->max)
            return FIELD_ERROR(ctx, "%.*s is out of %d-%d", len, p, ctx->f->min, ctx->f->max);
        *value = (int)v;
        *pos += len;
        return SMELT_OK;
    }
    while (*pos + len < ctx->item.len && is_alpha(p[len])) len++;
    if (!ctx->f->names)
        return FIELD_ERROR(ctx, "'%.*s' is a name; names are allowed only in month and "
                                "day-of-week", len, p);
    for (int i = 0; i < ctx->f->n_names; i++) {
        if (len == 3 && strncasecmp(p, ctx->f->names[i], 3) == 0) {
            *value = ctx->f->names_base + i;
            *pos += len;
            return SMELT_OK;
        }
    }
    return FIELD_ERROR(ctx, "'%.*s' is not a %s name (%s)", len, p,
                       ctx->index == FIELD_DAY_OF_WEEK ? "weekday" : "month",
                       ctx->f->names_hint);
}

static bool at_value(const struct field_ctx *ctx, int pos) {
    return pos < ctx->item.len && (is_digit(ctx->item.p[pos]) || is_alpha(ctx->item.p[pos]));
}

static int missing_number(const struct field_ctx *ctx, const char *where) {
    return FIELD_ERROR(ctx, "missing number %s in '%.*s'", where, ctx->item.len, ctx->item.p);
}

/* The step after '/' at *pos: a plain number 1..max. */
static int parse_step(const struct field_ctx *ctx, int *pos, int *step) {
    const char *p = ctx->item.p + *pos;
    int len = 0;
    long v = 0;
    while (*pos + len < ctx->item.len && is_digit(p[len])) {
        if (v < 1000000) v = v * 10 + (p[len] - '0');
        len++;
    }
    if (len == 0) {
        if (at_value(ctx, *pos))
            return FIELD_ERROR(ctx, "step in '%.*s' must be a number", ctx->item.len,
                               ctx->item.p);
        return missing_number(ctx, "after '/'");
    }
    if (v == 0)
        return FIELD_ERROR(ctx, "step 0 in '%.*s' must be at least 1", ctx->item.len,
                           ctx->item.p);
    if (v > ctx->f->max)
        return FIELD_ERROR(ctx, "step %.*s in '%.*s' is out of 1-%d", len, p, ctx->item.len,
                           ctx->item.p, ctx->f->max);
    *step = (int)v;
    *pos += len;
    return SMELT_OK;
}

/* One list item: "*", "a", "a-b", each optionally "/n"; its values are ORed into *bits. */
static int parse_item(const struct field_ctx *ctx, uint64_t *bits) {
    int pos = 0, lo, hi, step = 1, rc;
    bool bare_value = false;
    if (ctx->item.p[0] == '*') {
        lo = ctx->f->min;
        hi = ctx->f->max;
        pos = 1;
    } else {
        if (!at_value(ctx, 0)) return missing_number(ctx, "before '-' or '/'");
        if ((rc = parse_value(ctx, &pos, &lo))) return rc;
        hi = lo;
        bare_value = true;
        if (pos < ctx->item.len && ctx->item.p[pos] == '-') {
            pos++;
            if (!at_value(ctx, pos)) return missing_number(ctx, "after '-'");
            bool ends_at_name = is_alpha(ctx->item.p[pos]);
            if ((rc = parse_value(ctx, &pos, &hi))) return rc;
            /* "fri-sun": Sunday closing a weekday range reads as 7. */
            if (ctx->index == FIELD_DAY_OF_WEEK && ends_at_name && hi == 0 && lo > 0) hi = 7;
            if (hi < lo)
                return FIELD_ERROR(ctx, "range '%.*s' is reversed (%d > %d)", ctx->item.len,
                                   ctx->item.p, lo, hi);
            bare_value = false;
        }
    }
    if (pos < ctx->item.len && ctx->item.p[pos] == '/') {
        pos++;
        if ((rc = parse_step(ctx, &pos, &step))) return rc;
        if (bare_value) hi = ctx->f->max; /* "a/n": a through the maximum */
    }
    if (pos < ctx->item.len)
        return FIELD_ERROR(ctx, "unexpected '%c' in '%.*s'", ctx->item.p[pos], ctx->item.len,
                           ctx->item.p);
    for (int v = lo; v <= hi; v += step) *bits |= 1ull << v;
    return SMELT_OK;
}

static int parse_field(const struct field_ctx *base, uint64_t *bits) {
    struct field_ctx ctx = *base;
    int rc = check_characters(&ctx);
    if (rc) return rc;
    *bits = 0;
    const char *p = ctx.text.p, *end = ctx.text.p + ctx.text.len;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        if (item_end == p)
            return FIELD_ERROR(&ctx, "empty item in list '%.*s'", ctx.text.len, ctx.text.p);
        ctx.item = (struct span){p, (int)(item_end - p)};
        if ((rc = parse_item(&ctx, bits))) return rc;
        if (!comma) return SMELT_OK;
        p = comma + 1;
    }
}

/* ---- the whole expression ---- */

static const char *skip_separators(const char *p) {
    while (is_separator(*p)) p++;
    return p;
}

static struct span next_word(const char **p) {
    const char *start = skip_separators(*p), *q = start;
    while (*q && !is_separator(*q)) q++;
    *p = q;
    return (struct span){start, (int)(q - start)};
}

/* Quotes at most the first 40 bytes of junk, replacing what is not printable. */
static void quote_junk(struct span s, char *out, size_t out_bytes) {
    size_t n = 0;
    for (int i = 0; i < s.len && i < 40 && n + 1 < out_bytes; i++) {
        unsigned char c = (unsigned char)s.p[i];
        out[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    out[n] = '\0';
    if (s.len > 40 && n + 4 < out_bytes) strcpy(out + n, "...");
}

static int parse_macro(const char *text, struct cron_expr *out, struct smelt_error *err) {
    const char *p = text;
    struct span word = next_word(&p), junk = next_word(&p);
    char quoted[48];
    if (word.len == 7 && strncasecmp(word.p, "@reboot", 7) == 0)
        return error_set(err, SMELT_EINVAL,
                         "cron: @reboot is not supported (schedules fire at times of day)");
    for (size_t i = 0; i < sizeof MACROS / sizeof MACROS[0]; i++) {
        if ((size_t)word.len != strlen(MACROS[i].name) ||
            strncasecmp(word.p, MACROS[i].name, (size_t)word.len) != 0)
            continue;
        if (junk.len > 0) {
            quote_junk(junk, quoted, sizeof quoted);
            return error_set(err, SMELT_EINVAL, "cron: trailing junk '%s' after macro %s",
                             quoted, MACROS[i].name);
        }
        return cron_parse(MACROS[i].expansion, out, err);
    }
    quote_junk(word, quoted, sizeof quoted);
    return error_set(err, SMELT_EINVAL,
                     "cron: unknown macro '%s' (expected @yearly, @annually, @monthly, "
                     "@weekly, @daily, @midnight or @hourly)", quoted);
}

int cron_parse(const char *text, struct cron_expr *out, struct smelt_error *err) {
    if (!text) return error_set(err, SMELT_EINVAL, "cron: no expression given");
    size_t len = strnlen(text, CRON_MAX_TEXT_BYTES + 1);
    if (len > CRON_MAX_TEXT_BYTES)
        return error_set(err, SMELT_EINVAL, "cron: expression is longer than %d characters",
                         CRON_MAX_TEXT_BYTES);
    const char *p = skip_separators(text);
    if (*p == '\0') return error_set(err, SMELT_EINVAL, "cron: empty expression");
    if (*p == '@') return parse_macro(p, out, err);

    struct span words[CRON_N_FIELDS];
    int n_words = 0;
    for (; n_words < CRON_N_FIELDS; n_words++) {
        words[n_words] = next_word(&p);
        if (words[n_words].len == 0) break;
    }
    if (n_words < CRON_N_FIELDS)
        return error_set(err, SMELT_EINVAL,
                         "cron: %d field%s, expected 5 (minute hour day-of-month month "
                         "day-of-week) or a macro such as @daily", n_words,
                         n_words == 1 ? "" : "s");
    struct span junk = next_word(&p);
    if (junk.len > 0) {
        char quoted[48];
        quote_junk(junk, quoted, sizeof quoted);
        return error_set(err, SMELT_EINVAL,
                         "cron: trailing junk '%s' after field 5 (day-of-week); expected "
                         "exactly 5 fields", quoted);
    }

    uint64_t bits[CRON_N_FIELDS];
    for (int i = 0; i < CRON_N_FIELDS; i++) {
        struct field_ctx ctx = {.index = i, .f = &FIELDS[i], .text = words[i], .err = err};
        int rc = parse_field(&ctx, &bits[i]);
        if (rc) return rc;
    }
    uint64_t weekdays = bits[FIELD_DAY_OF_WEEK];
    if (weekdays & (1u << 7)) weekdays = (weekdays | 1u) & 0x7fu; /* 7 is Sunday */
    *out = (struct cron_expr){
        .minutes = bits[0],
        .hours = (uint32_t)bits[1],
        .days = (uint32_t)bits[2],
        .months = (uint16_t)bits[3],
        .weekdays = (uint8_t)weekdays,
        .days_restricted = words[2].p[0] != '*',
        .weekdays_restricted = words[4].p[0] != '*',
    };
    return SMELT_OK;
}

/* ---- the next matching minute ---- */

struct civil_date {
    int64_t year;
    int month, day; /* 1-based */
};

static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

/* Days since 1970-01-01 to a proleptic Gregorian date, by 400-year eras
 * (146097 days each) with the year starting in March so leap days come last. */
static struct civil_date civil_from_days(int64_t days) {
    days += 719468; /* 0000-03-01 to 1970-01-01 */
    int64_t era = floor_div(days, 146097);
    int64_t day_of_era = days - era * 146097;                                   /* [0, 146096] */
    int64_t year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
    int64_t day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    int64_t month_from_march = (5 * day_of_year + 2) / 153;                     /* [0, 11] */
    struct civil_date d;
    d.day = (int)(day_of_year - (153 * month_from_march + 2) / 5 + 1);
    d.month = (int)(month_from_march < 10 ? month_from_march + 3 : month_from_march - 9);
    d.year = year_of_era + era * 400 + (d.month <= 2);
    return d;
}

static bool is_leap_year(int64_t year) {
    return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

static int days_in_month(int64_t year, int month) {
    static const int DAYS[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return month == 2 && is_leap_year(year) ? 29 : DAYS[month - 1];
}

/* Sunday = 0; 1970-01-01 was a Thursday. */
static int weekday_of_days(int64_t days) { return (int)(days - floor_div(days + 4, 7) * 7 + 4); }

static bool day_matches(const struct cron_expr *e, int day_of_month, int weekday) {
    bool by_day = (e->days >> day_of_month) & 1u, by_weekday = (e->weekdays >> weekday) & 1u;
    if (e->days_restricted && e->weekdays_restricted) return by_day || by_weekday;
    return by_day && by_weekday;
}

/* The lowest set bit at or above `from` (bits up to 63), or -1. */
static int next_bit(uint64_t bits, int from) {
    if (from > 63) return -1;
    uint64_t rest = bits >> from;
    return rest ? from + __builtin_ctzll(rest) : -1;
}

int64_t cron_next(const struct cron_expr *expr, int64_t after) {
    /* Far enough from the int64 ends that no second count below can overflow; such
     * times are hundreds of billions of years away and get "none". */
    const int64_t margin = (int64_t)(CRON_HORIZON_DAYS + 2) * 86400;
    if (after > INT64_MAX - margin || after < INT64_MIN + margin) return -1;
    int64_t first_minute = floor_div(after, 60) + 1;
    int64_t day = floor_div(first_minute, 1440);
    int minute_of_day = (int)(first_minute - day * 1440);
    int hour = minute_of_day / 60, minute = minute_of_day % 60;
    int64_t last_day = day + CRON_HORIZON_DAYS;
    struct civil_date date = civil_from_days(day);

    while (day <= last_day) {
        if (!((expr->months >> date.month) & 1u)) { /* to the 1st of the next month */
            day += days_in_month(date.year, date.month) - date.day + 1;
        } else if (day_matches(expr, date.day, weekday_of_days(day))) {
            int h = next_bit(expr->hours, hour);
            if (h >= 0 && h < 24) {
                int m = next_bit(expr->minutes, h == hour ? minute : 0);
                if (m >= 0 && m < 60) return (day * 1440 + h * 60 + m) * 60;
                if (h + 1 < 24) { /* no minute left in hour h: try the next hour */
                    hour = h + 1;
                    minute = 0;
                    continue;
                }
            }
            day++;
        } else {
            day++;
        }
        date = civil_from_days(day);
        hour = minute = 0;
    }
    return -1;
}
