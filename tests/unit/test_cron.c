/* server/cron: every syntax form parsed into its bit sets, refused expressions whose
 * messages name the field and the fault, cron_next on known calendar cases (weekends,
 * leap years, year ends, Vixie's OR rule, impossible dates, exact-minute boundaries),
 * and a seeded comparison with a minute-by-minute brute force over random expressions
 * that the test builds, renders and evaluates on its own. Expected times come from
 * timegm/gmtime_r, not from cron.c's calendar arithmetic. */
#include "tests/unit/testutil.h"

#include <string.h>
#include <time.h>

#include "server/cron.h"

static struct cron_expr parse_ok(const char *text) {
    struct smelt_error err;
    struct cron_expr e;
    memset(&e, 0xa5, sizeof e);
    TEST_OK(cron_parse(text, &e, &err), &err);
    return e;
}

/* Bits lo, lo+step, ... up to hi. */
static uint64_t bits(int lo, int hi, int step) {
    uint64_t b = 0;
    for (int v = lo; v <= hi; v += step) b |= 1ull << v;
    return b;
}

static uint64_t bit(int v) { return 1ull << v; }

static int64_t utc(int year, int month, int day, int hour, int minute, int second) {
    struct tm tm = {.tm_year = year - 1900, .tm_mon = month - 1, .tm_mday = day,
                    .tm_hour = hour, .tm_min = minute, .tm_sec = second};
    return (int64_t)timegm(&tm);
}

static int weekday_of(int64_t t) {
    time_t tt = (time_t)t;
    struct tm tm;
    cr_assert(gmtime_r(&tt, &tm));
    return tm.tm_wday;
}

/* "2024-05-13 09:00:00" for failure messages. */
static const char *show(int64_t t, char *buf, size_t n) {
    if (t == -1) return "-1 (none)";
    time_t tt = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm)) return "(out of range)";
    strftime(buf, n, "%Y-%m-%d %H:%M:%S %a", &tm);
    return buf;
}

static void expect_next(const char *text, int64_t after, int64_t want) {
    struct cron_expr e = parse_ok(text);
    int64_t got = cron_next(&e, after);
    char a[64], g[64], w[64];
    cr_expect_eq(got, want, "cron_next('%s', %s) = %s, expected %s", text,
                 show(after, a, sizeof a), show(got, g, sizeof g), show(want, w, sizeof w));
}

/* ---- parsing ---- */

Test(cron, parse_stars_cover_every_value_unrestricted) {
    struct cron_expr e = parse_ok("* * * * *");
    cr_expect_eq(e.minutes, bits(0, 59, 1));
    cr_expect_eq(e.hours, bits(0, 23, 1));
    cr_expect_eq(e.days, bits(1, 31, 1));
    cr_expect_eq(e.months, bits(1, 12, 1));
    cr_expect_eq(e.weekdays, bits(0, 6, 1));
    cr_expect(!e.days_restricted && !e.weekdays_restricted);
}

Test(cron, parse_numbers_ranges_and_lists) {
    struct cron_expr e = parse_ok("5 4 3 2 1");
    cr_expect_eq(e.minutes, bit(5));
    cr_expect_eq(e.hours, bit(4));
    cr_expect_eq(e.days, bit(3));
    cr_expect_eq(e.months, bit(2));
    cr_expect_eq(e.weekdays, bit(1));
    cr_expect(e.days_restricted && e.weekdays_restricted);

    e = parse_ok("10-20 9-17 1-15 3-6 1-5");
    cr_expect_eq(e.minutes, bits(10, 20, 1));
    cr_expect_eq(e.hours, bits(9, 17, 1));
    cr_expect_eq(e.days, bits(1, 15, 1));
    cr_expect_eq(e.months, bits(3, 6, 1));
    cr_expect_eq(e.weekdays, bits(1, 5, 1));

    e = parse_ok("0,30,59 8,12-14,23 1,15,31 1,6-7,12 0,3");
    cr_expect_eq(e.minutes, bit(0) | bit(30) | bit(59));
    cr_expect_eq(e.hours, bit(8) | bits(12, 14, 1) | bit(23));
    cr_expect_eq(e.days, bit(1) | bit(15) | bit(31));
    cr_expect_eq(e.months, bit(1) | bits(6, 7, 1) | bit(12));
    cr_expect_eq(e.weekdays, bit(0) | bit(3));

    e = parse_ok("7-7 0-23 31 12-12 0-0"); /* one-value ranges, the edges of each field */
    cr_expect_eq(e.minutes, bit(7));
    cr_expect_eq(e.hours, bits(0, 23, 1));
    cr_expect_eq(e.days, bit(31));
    cr_expect_eq(e.months, bit(12));
    cr_expect_eq(e.weekdays, bit(0));
}

Test(cron, parse_steps_of_every_form) {
    struct cron_expr e = parse_ok("*/15 */6 */10 */3 */2");
    cr_expect_eq(e.minutes, bits(0, 45, 15));
    cr_expect_eq(e.hours, bits(0, 18, 6));
    cr_expect_eq(e.days, bit(1) | bit(11) | bit(21) | bit(31));
    cr_expect_eq(e.months, bit(1) | bit(4) | bit(7) | bit(10));
    cr_expect_eq(e.weekdays, bit(0) | bit(2) | bit(4) | bit(6));
    cr_expect(!e.days_restricted && !e.weekdays_restricted, "'*/n' counts as '*' for the OR rule");

    e = parse_ok("10-30/7 9-17/4 2-20/9 jan-jun/2 mon-fri/2");
    cr_expect_eq(e.minutes, bit(10) | bit(17) | bit(24));
    cr_expect_eq(e.hours, bit(9) | bit(13) | bit(17));
    cr_expect_eq(e.days, bit(2) | bit(11) | bit(20));
    cr_expect_eq(e.months, bit(1) | bit(3) | bit(5));
    cr_expect_eq(e.weekdays, bit(1) | bit(3) | bit(5));

    /* "a/n" runs from a to the field's maximum. */
    e = parse_ok("5/20 3/8 25/3 11/1 1/2");
    cr_expect_eq(e.minutes, bit(5) | bit(25) | bit(45));
    cr_expect_eq(e.hours, bit(3) | bit(11) | bit(19));
    cr_expect_eq(e.days, bit(25) | bit(28) | bit(31));
    cr_expect_eq(e.months, bit(11) | bit(12));
    cr_expect_eq(e.weekdays, bit(1) | bit(3) | bit(5) | bit(0), "1/2 reaches 7 = Sunday");

    e = parse_ok("*/1 0-23/1 */31 * *");
    cr_expect_eq(e.minutes, bits(0, 59, 1));
    cr_expect_eq(e.days, bit(1));
}

Test(cron, parse_month_and_weekday_names_any_case) {
    struct cron_expr e = parse_ok("0 0 * JAN,jul-Sep,Dec Mon-FRI");
    cr_expect_eq(e.months, bit(1) | bits(7, 9, 1) | bit(12));
    cr_expect_eq(e.weekdays, bits(1, 5, 1));

    e = parse_ok("0 0 * feb,mar,apr,may,jun,jul,aug,sep,oct,nov sun,tue,wed,thu,sat");
    cr_expect_eq(e.months, bits(2, 11, 1));
    cr_expect_eq(e.weekdays, bit(0) | bits(2, 4, 1) | bit(6));

    e = parse_ok("0 0 * mar-5 2-thu"); /* names and numbers mix */
    cr_expect_eq(e.months, bits(3, 5, 1));
    cr_expect_eq(e.weekdays, bits(2, 4, 1));

    e = parse_ok("0 0 * * fri-sun"); /* Sunday closing a range reads as 7 */
    cr_expect_eq(e.weekdays, bit(5) | bit(6) | bit(0));
    e = parse_ok("0 0 * * sun-sat");
    cr_expect_eq(e.weekdays, bits(0, 6, 1));
}

Test(cron, parse_seven_is_sunday) {
    cr_expect_eq(parse_ok("0 0 * * 7").weekdays, bit(0));
    cr_expect_eq(parse_ok("0 0 * * 5-7").weekdays, bit(5) | bit(6) | bit(0));
    cr_expect_eq(parse_ok("0 0 * * 0,7").weekdays, bit(0));
    cr_expect_eq(parse_ok("0 0 * * 0-7").weekdays, bits(0, 6, 1));
}

Test(cron, parse_macros) {
    struct {
        const char *macro, *same_as;
    } cases[] = {
        {"@yearly", "0 0 1 1 *"},  {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
        {"@weekly", "0 0 * * 0"},  {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
        {"@hourly", "0 * * * *"},  {"@DAILY", "0 0 * * *"},    {"  @Hourly \t", "0 * * * *"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cron_expr got = parse_ok(cases[i].macro), want = parse_ok(cases[i].same_as);
        cr_expect(got.minutes == want.minutes && got.hours == want.hours &&
                      got.days == want.days && got.months == want.months &&
                      got.weekdays == want.weekdays &&
                      got.days_restricted == want.days_restricted &&
                      got.weekdays_restricted == want.weekdays_restricted,
                  "%s differs from '%s'", cases[i].macro, cases[i].same_as);
    }
}

Test(cron, parse_spaces_tabs_and_restricted_flags) {
    struct cron_expr e = parse_ok("  0\t\t9  *   *\tmon  ");
    cr_expect_eq(e.minutes, bit(0));
    cr_expect_eq(e.hours, bit(9));
    cr_expect(!e.days_restricted && e.weekdays_restricted);

    e = parse_ok("0 0 1-31 * *"); /* restricted although it covers every day */
    cr_expect(e.days_restricted && !e.weekdays_restricted);
    e = parse_ok("0 0 */2 * 1");
    cr_expect(!e.days_restricted && e.weekdays_restricted);
}

/* ---- refusals ---- */

struct refusal {
    const char *text;
    const char *want[3]; /* substrings the message must contain */
};

static const struct refusal REFUSALS[] = {
    {"60 * * * *", {"cron: field 1 (minute): 60 is out of 0-59"}},
    {"* 24 * * *", {"cron: field 2 (hour): 24 is out of 0-23"}},
    {"* * 0 * *", {"field 3 (day-of-month)", "0 is out of 1-31"}},
    {"* * 1-32 * *", {"field 3 (day-of-month)", "32 is out of 1-31"}},
    {"* * * 13 *", {"field 4 (month)", "13 is out of 1-12"}},
    {"* * * * 8", {"field 5 (day-of-week)", "8 is out of 0-7"}},
    {"99999999999 * * * *", {"field 1 (minute)", "99999999999 is out of 0-59"}},
    {"*/0 * * * *", {"field 1 (minute)", "step 0"}},
    {"* 1-5/0 * * *", {"field 2 (hour)", "step 0"}},
    {"*/60 * * * *", {"field 1 (minute)", "step 60", "out of 1-59"}},
    {"* * * * */mon", {"field 5 (day-of-week)", "step", "must be a number"}},
    {"* 17-9 * * *", {"field 2 (hour)", "'17-9' is reversed"}},
    {"* * * * sat-mon", {"field 5 (day-of-week)", "'sat-mon' is reversed"}},
    {"* * * dec-jan *", {"field 4 (month)", "reversed"}},
    {"1,,2 * * * *", {"field 1 (minute)", "empty item", "'1,,2'"}},
    {"* * * 1, *", {"field 4 (month)", "empty item"}},
    {"* ,5 * * *", {"field 2 (hour)", "empty item"}},
    {"5#2 * * * *", {"field 1 (minute)", "unexpected character '#'"}},
    {"* * * * 1?", {"field 5 (day-of-week)", "unexpected character '?'"}},
    {"1x * * * *", {"field 1 (minute)", "unexpected 'x' in '1x'"}},
    {"*-5 * * * *", {"field 1 (minute)", "unexpected '-'"}},
    {"* 1-2-3 * * *", {"field 2 (hour)", "unexpected '-' in '1-2-3'"}},
    {"-5 * * * *", {"field 1 (minute)", "missing number"}},
    {"* * * jan- *", {"field 4 (month)", "missing number after '-'"}},
    {"* * 5/ * *", {"field 3 (day-of-month)", "missing number after '/'"}},
    {"0 0 * * \xc3\xa9", {"field 5 (day-of-week)", "byte 0xc3"}},
    {"0 9 * * *\n", {"field 5 (day-of-week)", "line break", "one line"}},
    {"* mon * * *", {"field 2 (hour)", "'mon' is a name", "only in month and day-of-week"}},
    {"* * L * *", {"field 3 (day-of-month)", "'L' is a name"}},
    {"* * * foo *", {"field 4 (month)", "'foo' is not a month name (jan-dec)"}},
    {"* * * * monday", {"field 5 (day-of-week)", "'monday' is not a weekday name (sun-sat)"}},
    {"* * * * jan", {"field 5 (day-of-week)", "not a weekday name"}},
    {"* * * *", {"4 fields, expected 5", "minute hour day-of-month month day-of-week"}},
    {"0", {"1 field, expected 5"}},
    {"* * * * * *", {"trailing junk '*' after field 5 (day-of-week)"}},
    {"0 0 * * * /usr/bin/backup", {"trailing junk '/usr/bin/backup'"}},
    {"", {"empty expression"}},
    {" \t ", {"empty expression"}},
    {"@daily now", {"trailing junk 'now' after macro @daily"}},
    {"@fortnightly", {"unknown macro '@fortnightly'", "@hourly"}},
    {"@reboot", {"@reboot is not supported"}},
};

Test(cron, refuses_bad_expressions_naming_field_and_fault) {
    cr_assert_geq(sizeof REFUSALS / sizeof REFUSALS[0], 15);
    for (size_t i = 0; i < sizeof REFUSALS / sizeof REFUSALS[0]; i++) {
        const struct refusal *r = &REFUSALS[i];
        struct smelt_error err;
        struct cron_expr e;
        TEST_EXPECT_ERROR(cron_parse(r->text, &e, &err), SMELT_EINVAL, &err);
        cr_expect(strncmp(err.message, "cron: ", 6) == 0, "'%s': %s", r->text, err.message);
        for (int k = 0; k < 3 && r->want[k]; k++)
            cr_expect(strstr(err.message, r->want[k]) != NULL, "'%s': message '%s' lacks '%s'",
                      r->text, err.message, r->want[k]);
    }
}

Test(cron, refuses_null_and_overlong_input) {
    struct smelt_error err;
    struct cron_expr e;
    TEST_EXPECT_ERROR(cron_parse(NULL, &e, &err), SMELT_EINVAL, &err);

    char text[400];
    memset(text, 0, sizeof text);
    strcpy(text, "0 0 * * ");
    for (size_t n = strlen(text); n < 300; n += 2) strcat(text, "1,");
    strcat(text, "1");
    TEST_EXPECT_ERROR(cron_parse(text, &e, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "longer than 255 characters") != NULL, "%s", err.message);

    text[250] = '\0'; /* a long list still within the limit parses (ends on a digit) */
    if (text[249] == ',') text[249] = '\0';
    TEST_OK(cron_parse(text, &e, &err), &err);
    cr_expect_eq(e.weekdays, bit(1));
}

/* ---- cron_next on known cases ---- */

Test(cron, next_every_minute_and_seconds) {
    expect_next("* * * * *", utc(2024, 5, 6, 12, 34, 0), utc(2024, 5, 6, 12, 35, 0));
    expect_next("* * * * *", utc(2024, 5, 6, 12, 34, 56), utc(2024, 5, 6, 12, 35, 0));
    expect_next("* * * * *", utc(2024, 12, 31, 23, 59, 30), utc(2025, 1, 1, 0, 0, 0));
}

Test(cron, next_every_quarter_hour) {
    expect_next("*/15 * * * *", utc(2024, 5, 6, 10, 7, 0), utc(2024, 5, 6, 10, 15, 0));
    expect_next("*/15 * * * *", utc(2024, 5, 6, 10, 45, 0), utc(2024, 5, 6, 11, 0, 0));
    expect_next("*/15 * * * *", utc(2024, 5, 6, 23, 50, 0), utc(2024, 5, 7, 0, 0, 0));
}

Test(cron, next_weekdays_skip_the_weekend) {
    cr_assert_eq(weekday_of(utc(2024, 5, 10, 0, 0, 0)), 5, "2024-05-10 is a Friday");
    const char *text = "0 9 * * mon-fri";
    expect_next(text, utc(2024, 5, 10, 8, 59, 59), utc(2024, 5, 10, 9, 0, 0));
    expect_next(text, utc(2024, 5, 10, 9, 0, 0), utc(2024, 5, 13, 9, 0, 0));
    expect_next(text, utc(2024, 5, 11, 12, 0, 0), utc(2024, 5, 13, 9, 0, 0));
    expect_next(text, utc(2024, 5, 12, 23, 59, 0), utc(2024, 5, 13, 9, 0, 0));
}

Test(cron, next_leap_day) {
    expect_next("0 0 29 2 *", utc(2025, 1, 1, 0, 0, 0), utc(2028, 2, 29, 0, 0, 0));
    expect_next("0 0 29 2 *", utc(2024, 2, 28, 12, 0, 0), utc(2024, 2, 29, 0, 0, 0));
    /* 2100 is not a leap year: the next Feb 29 after 2099 is in 2104... */
    expect_next("0 0 29 2 *", utc(2099, 3, 1, 0, 0, 0), utc(2104, 2, 29, 0, 0, 0));
    /* ...which from 2097 is more than 5 years away. */
    expect_next("0 0 29 2 *", utc(2097, 3, 1, 0, 0, 0), -1);
    expect_next("0 0 1 3 *", utc(2100, 2, 10, 0, 0, 0), utc(2100, 3, 1, 0, 0, 0));
    expect_next("0 0 1 3 *", utc(2000, 2, 10, 0, 0, 0), utc(2000, 3, 1, 0, 0, 0));
    expect_next("0 0 29 * *", utc(2100, 2, 10, 0, 0, 0), utc(2100, 3, 29, 0, 0, 0));
}

Test(cron, next_across_year_end_and_short_months) {
    expect_next("0 0 1 * *", utc(2024, 12, 15, 0, 0, 0), utc(2025, 1, 1, 0, 0, 0));
    expect_next("0 0 1 * *", utc(2024, 12, 1, 0, 0, 0), utc(2025, 1, 1, 0, 0, 0));
    expect_next("@yearly", utc(2024, 1, 1, 0, 0, 0), utc(2025, 1, 1, 0, 0, 0));
    expect_next("0 0 31 * *", utc(2024, 4, 1, 0, 0, 0), utc(2024, 5, 31, 0, 0, 0));
    expect_next("0 12 * feb *", utc(2024, 3, 1, 0, 0, 0), utc(2025, 2, 1, 12, 0, 0));
}

Test(cron, next_or_rule_hits_the_13th_and_fridays) {
    /* From 2024-10-01: Fridays, plus Sunday Oct 13 and Wednesday Nov 13; Friday Dec 13 once. */
    const int want[][2] = {{10, 4},  {10, 11}, {10, 13}, {10, 18}, {10, 25}, {11, 1}, {11, 8},
                           {11, 13}, {11, 15}, {11, 22}, {11, 29}, {12, 6},  {12, 13}, {12, 20}};
    struct cron_expr e = parse_ok("0 0 13 * fri");
    int64_t t = utc(2024, 10, 1, 0, 0, 0);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t expected = utc(2024, want[i][0], want[i][1], 0, 0, 0), got = cron_next(&e, t);
        char g[64], w[64];
        cr_expect_eq(got, expected, "occurrence %zu: %s, expected %s", i,
                     show(got, g, sizeof g), show(expected, w, sizeof w));
        t = expected;
    }
    /* Only one field restricted: AND, so '*' days with Fridays are just Fridays. */
    expect_next("0 0 * * fri", utc(2024, 10, 12, 0, 0, 0), utc(2024, 10, 18, 0, 0, 0));
    /* '*\/2' counts as unrestricted: odd days that are also Fridays. */
    expect_next("0 0 */2 * fri", utc(2024, 10, 4, 0, 0, 0), utc(2024, 10, 11, 0, 0, 0));
}

Test(cron, next_impossible_dates_are_minus_one) {
    expect_next("0 0 30 2 *", utc(2024, 1, 1, 0, 0, 0), -1);
    expect_next("0 0 31 4,6,9,11 *", utc(2024, 1, 1, 0, 0, 0), -1);
    /* With the OR rule a weekday rescues an impossible date. */
    expect_next("0 0 30 2 mon", utc(2024, 2, 1, 0, 0, 0), utc(2024, 2, 5, 0, 0, 0));
}

Test(cron, next_is_strictly_after_a_matching_minute) {
    const char *text = "30 14 * * *";
    expect_next(text, utc(2024, 7, 1, 14, 29, 59), utc(2024, 7, 1, 14, 30, 0));
    expect_next(text, utc(2024, 7, 1, 14, 30, 0), utc(2024, 7, 2, 14, 30, 0));
    expect_next(text, utc(2024, 7, 1, 14, 30, 1), utc(2024, 7, 2, 14, 30, 0));
    expect_next("5 10,12 * * *", utc(2024, 7, 1, 10, 30, 0), utc(2024, 7, 1, 12, 5, 0));
    expect_next("0-5 10 * * *", utc(2024, 7, 1, 10, 5, 0), utc(2024, 7, 2, 10, 0, 0));
}

Test(cron, next_before_1970_and_at_the_extremes) {
    expect_next("0 0 1 1 *", -1, 0);
    expect_next("0 0 1 1 *", utc(1969, 6, 1, 0, 0, 0), 0);
    expect_next("* * * * *", -61, -60);
    expect_next("0 0 29 2 *", utc(1899, 3, 1, 0, 0, 0), utc(1904, 2, 29, 0, 0, 0));
    struct cron_expr e = parse_ok("* * * * *");
    cr_expect_eq(cron_next(&e, INT64_MAX), -1);
    cr_expect_eq(cron_next(&e, INT64_MIN), -1);
}

/* Skipping months and days keeps even a 5-year search with no match cheap; a
 * minute-by-minute scan (2.6 million minutes per call) would blow this budget. */
Test(cron, next_search_without_match_is_fast) {
    struct cron_expr e = parse_ok("59 23 30 2 *");
    clock_t start = clock();
    for (int i = 0; i < 200; i++) cr_assert_eq(cron_next(&e, utc(2024, 1, 1, 0, 0, i)), -1);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    cr_expect_lt(seconds, 2.0, "200 fruitless searches took %.2f s", seconds);
}

/* ---- against a brute force ---- */

/* An expression the test builds itself: the text cron_parse reads, and the sets and
 * OR-rule flags the test derived without cron.c. */
struct random_expr {
    char text[256];
    uint64_t sets[5]; /* minute, hour, day, month, weekday (7 folded into 0) */
    bool restricted[5];
};

static const int FIELD_MIN[5] = {0, 0, 1, 1, 0}, FIELD_MAX[5] = {59, 23, 31, 12, 7};
static const char *const MONTHS[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                     "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const DAYS[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

static int rand_int(struct test_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* A value as a number or, in month and weekday, sometimes a name in random case. */
static void append_value(struct test_rng *r, int field, int v, char *out) {
    const char *name = NULL;
    if (field == 3 && rand_int(r, 0, 1)) name = MONTHS[v - 1];
    if (field == 4 && v < 7 && rand_int(r, 0, 1)) name = DAYS[v];
    char buf[8];
    if (!name) {
        snprintf(buf, sizeof buf, "%d", v);
    } else {
        for (int i = 0; i < 3; i++) {
            char c = name[i];
            buf[i] = rand_int(r, 0, 3) == 0 ? (char)(c - 'a' + 'A') : c;
        }
        buf[3] = '\0';
    }
    strcat(out, buf);
}

static void random_field(struct test_rng *r, int field, struct random_expr *x) {
    int lo_limit = FIELD_MIN[field], hi_limit = FIELD_MAX[field];
    /* Day, month and weekday are '*' often so that matches fall within the horizon. */
    int star_percent = field >= 2 ? 50 : 20;
    char *out = x->text + strlen(x->text);
    uint64_t set = 0;
    if (rand_int(r, 1, 100) <= star_percent) {
        strcat(out, "*");
        set = ~0ull;
    } else {
        int n_items = rand_int(r, 1, 3);
        for (int k = 0; k < n_items; k++) {
            if (k) strcat(out, ",");
            int lo = rand_int(r, lo_limit, hi_limit), hi = lo, step = 1;
            int kind = rand_int(r, 0, 5);
            int step_max = hi_limit < 12 ? hi_limit : 12;
            if (kind == 0 && k == 0) { /* "*\/n", which keeps the field unrestricted */
                lo = lo_limit;
                hi = hi_limit;
                step = rand_int(r, 1, step_max);
                sprintf(out + strlen(out), "*/%d", step);
            } else if (kind <= 2) { /* "a" */
                append_value(r, field, lo, out);
            } else { /* "a-b", "a-b/n", "a/n" */
                hi = rand_int(r, lo, hi_limit);
                append_value(r, field, lo, out);
                if (kind == 5) {
                    hi = hi_limit;
                } else {
                    strcat(out, "-");
                    append_value(r, field, hi, out);
                }
                if (kind >= 4) {
                    step = rand_int(r, 1, step_max);
                    sprintf(out + strlen(out), "/%d", step);
                }
            }
            for (int v = lo; v <= hi; v += step) set |= 1ull << v;
        }
    }
    if (field == 4 && (set >> 7 & 1)) set |= 1;
    x->sets[field] = set;
    x->restricted[field] = out[0] != '*';
    strcat(x->text, field < 4 ? " " : "");
}

static void random_expr(struct test_rng *r, struct random_expr *x) {
    x->text[0] = '\0';
    for (int f = 0; f < 5; f++) random_field(r, f, x);
}

static bool brute_day_matches(const struct random_expr *x, const struct tm *tm) {
    if (!(x->sets[3] >> (tm->tm_mon + 1) & 1)) return false;
    bool by_day = x->sets[2] >> tm->tm_mday & 1, by_weekday = x->sets[4] >> tm->tm_wday & 1;
    if (x->restricted[2] && x->restricted[4]) return by_day || by_weekday;
    return by_day && by_weekday;
}

/* Minute by minute from the first whole minute after `after`, for horizon_minutes;
 * -1 when nothing matches. */
static int64_t brute_next(const struct random_expr *x, int64_t after, int64_t horizon_minutes) {
    int64_t t = (after >= 0 ? after / 60 : (after - 59) / 60) * 60 + 60;
    int64_t day = INT64_MIN;
    bool day_ok = false;
    for (int64_t i = 0; i < horizon_minutes; i++, t += 60) {
        int64_t d = t >= 0 ? t / 86400 : (t - 86399) / 86400;
        if (d != day) {
            time_t tt = (time_t)t;
            struct tm tm;
            cr_assert(gmtime_r(&tt, &tm));
            day = d;
            day_ok = brute_day_matches(x, &tm);
        }
        if (!day_ok) continue;
        int64_t second_of_day = t - d * 86400;
        if ((x->sets[1] >> (second_of_day / 3600) & 1) &&
            (x->sets[0] >> (second_of_day / 60 % 60) & 1))
            return t;
    }
    return -1;
}

Test(cron, next_matches_brute_force_on_random_expressions) {
    struct test_rng rng = {.state = 20240611};
    const int64_t horizon_minutes = 100 * 1440;
    const int64_t from = utc(1960, 1, 1, 0, 0, 0), to = utc(2040, 1, 1, 0, 0, 0);
    int n_found = 0;
    for (int c = 0; c < 1000; c++) {
        struct random_expr x;
        random_expr(&rng, &x);
        struct cron_expr e = parse_ok(x.text);
        cr_assert(e.minutes == (x.sets[0] & bits(0, 59, 1)) &&
                      e.hours == (x.sets[1] & bits(0, 23, 1)) &&
                      e.days == (x.sets[2] & bits(1, 31, 1)) &&
                      e.months == (x.sets[3] & bits(1, 12, 1)) &&
                      e.weekdays == (x.sets[4] & bits(0, 6, 1)) &&
                      e.days_restricted == x.restricted[2] &&
                      e.weekdays_restricted == x.restricted[4],
                  "case %d: '%s' parsed into other sets", c, x.text);
        int64_t after = from + (int64_t)(test_rng_next(&rng) % (uint64_t)(to - from));
        if (c % 8 == 1) /* around the century years 1900, 2000 and 2100 */
            after = utc(1900 + 100 * (c / 8 % 3), 1, 1, 0, 0, 0) +
                    (int64_t)(test_rng_next(&rng) % (120 * 86400));
        if (c % 4 == 0) after -= after % 60; /* exact minutes: the boundary case */
        /* Follow each expression for a few occurrences: every result is the next `after`. */
        for (int step = 0; step < 3; step++) {
            int64_t want = brute_next(&x, after, horizon_minutes), got = cron_next(&e, after);
            char a[64], g[64], w[64];
            if (want != -1) { /* results are whole minutes, so never -1 */
                cr_assert_eq(got, want, "case %d '%s' after %s: got %s, brute force %s", c,
                             x.text, show(after, a, sizeof a), show(got, g, sizeof g),
                             show(want, w, sizeof w));
                n_found++;
                after = want;
            } else {
                cr_assert(got == -1 || got >= after + horizon_minutes * 60,
                          "case %d '%s' after %s: got %s, brute force finds none in 100 days",
                          c, x.text, show(after, a, sizeof a), show(got, g, sizeof g));
                break;
            }
        }
    }
    cr_expect_gt(n_found, 2000, "only %d matches found: the random expressions are too sparse",
                 n_found);
}
