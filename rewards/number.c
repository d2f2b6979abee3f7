/* The number grammar of last_number and of numeric answers (docs/rewards.md, "Numbers"):
 *
 *   number   = [sign] mantissa [exponent]
 *   sign     = "-" | "+" | "−" (U+2212), only where the character before it is not an
 *              ASCII letter or digit ("5-3" holds 5 and 3, "x = -3" holds -3)
 *   mantissa = integer ["." digits] | "." digits (the latter only where the "." does not
 *              follow a digit)
 *   integer  = digits | 1 to 3 digits ("," 3 digits)+  (each group exactly three digits
 *              not followed by another digit: "1,234" is 1234, "1,23" is 1 and 23)
 *   exponent = ("e" | "E") ["+" | "-"] digits, right after the mantissa
 *
 * Digits are ASCII. A "." not followed by a digit ends the number ("42." is 42). The
 * value is strtod's on the text without its commas (the C locale's "." is the decimal
 * point: smelt never changes LC_NUMERIC). A number over NUMBER_MAX_BYTES characters is
 * ignored (no double holds one meaningfully). */
#include "rewards/rewards_internal.h"

#include <stdlib.h>
#include <string.h>

#define NUMBER_MAX_BYTES 320

static const char UNICODE_MINUS[] = "\xE2\x88\x92"; /* U+2212 */

static bool is_digit(const char *s, size_t n, size_t i) { return i < n && s[i] >= '0' && s[i] <= '9'; }

static bool is_alnum(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Bytes of a sign at s[i] (0 when none). */
static size_t sign_len(const char *s, size_t n, size_t i) {
    if (i < n && (s[i] == '-' || s[i] == '+')) return 1;
    if (n - i >= 3 && memcmp(s + i, UNICODE_MINUS, 3) == 0) return 3;
    return 0;
}

static size_t skip_digits(const char *s, size_t n, size_t i) {
    while (is_digit(s, n, i)) i++;
    return i;
}

/* The end of an integer starting at the digit s[i], thousands groups included. */
static size_t integer_end(const char *s, size_t n, size_t i) {
    size_t k = skip_digits(s, n, i);
    if (k - i > 3) return k;
    while (k + 3 < n && s[k] == ',' && is_digit(s, n, k + 1) && is_digit(s, n, k + 2) && is_digit(s, n, k + 3) &&
           !is_digit(s, n, k + 4))
        k += 4;
    return k;
}

/* The end of a mantissa starting at s[i], or i when none starts there. */
static size_t mantissa_end(const char *s, size_t n, size_t i) {
    if (is_digit(s, n, i)) {
        size_t k = integer_end(s, n, i);
        if (k < n && s[k] == '.' && is_digit(s, n, k + 1)) k = skip_digits(s, n, k + 1);
        return k;
    }
    bool after_digit = i > 0 && is_digit(s, n, i - 1);
    if (i < n && s[i] == '.' && is_digit(s, n, i + 1) && !after_digit) return skip_digits(s, n, i + 1);
    return i;
}

static size_t exponent_end(const char *s, size_t n, size_t k) {
    if (k >= n || (s[k] != 'e' && s[k] != 'E')) return k;
    size_t m = k + 1;
    if (m < n && (s[m] == '+' || s[m] == '-')) m++;
    return is_digit(s, n, m) ? skip_digits(s, n, m) : k;
}

/* The end of a number starting exactly at s[i] (what precedes s[i] decides whether a
 * sign may start one), or i when none does. */
static size_t number_end(const char *s, size_t n, size_t i) {
    size_t sign = sign_len(s, n, i);
    if (sign && i > 0 && is_alnum(s[i - 1])) return i;
    size_t k = mantissa_end(s, n, i + sign);
    if (k == i + sign) return i;
    return exponent_end(s, n, k);
}

/* strtod of s[start, end) without its commas, U+2212 as "-"; false when too long. */
static bool number_value(const char *s, size_t start, size_t end, double *value) {
    if (end - start > NUMBER_MAX_BYTES) return false;
    char buf[NUMBER_MAX_BYTES + 1];
    size_t o = 0, i = start;
    if (end - start >= 3 && memcmp(s + i, UNICODE_MINUS, 3) == 0) {
        buf[o++] = '-';
        i += 3;
    }
    for (; i < end; i++)
        if (s[i] != ',') buf[o++] = s[i];
    buf[o] = '\0';
    *value = strtod(buf, NULL);
    return true;
}

bool reward_number_last(const char *s, size_t n, size_t *start, size_t *end, double *value) {
    bool found = false;
    size_t i = 0;
    while (i < n) {
        size_t k = number_end(s, n, i);
        if (k == i) {
            i++;
            continue;
        }
        if (number_value(s, i, k, value)) {
            *start = i;
            *end = k;
            found = true;
        }
        i = k;
    }
    return found;
}

bool reward_number_whole(const char *s, size_t n, double *value) {
    return n > 0 && number_end(s, n, 0) == n && number_value(s, 0, n, value);
}
