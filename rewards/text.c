/* Trimming, normalization and exact_match's comparison. Nothing here allocates: spans
 * index the caller's text, and lowercasing compares character by character. */
#include "rewards/rewards_internal.h"

#include <string.h>
#include <utf8proc.h>

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

void reward_trim(const char *s, size_t *start, size_t *end) {
    while (*start < *end && is_space(s[*start])) (*start)++;
    while (*end > *start && is_space(s[*end - 1])) (*end)--;
}

void reward_normalize_span(const char *s, size_t *start, size_t *end, unsigned normalize) {
    reward_trim(s, start, end);
    if ((normalize & REWARD_NORMALIZE_STRIP_PERIOD) && *end > *start && s[*end - 1] == '.') {
        (*end)--;
        reward_trim(s, start, end);
    }
}

int32_t reward_next_char(const char *s, size_t n, size_t *i, bool lower) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k < 1) return 0x110000 + (unsigned char)s[(*i)++];
    *i += (size_t)k;
    return lower ? utf8proc_tolower(cp) : cp;
}

static int32_t next_lower(const char *s, size_t n, size_t *i) { return reward_next_char(s, n, i, true); }

static bool equal_lowercase(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0, j = 0;
    while (i < na && j < nb)
        if (next_lower(a, na, &i) != next_lower(b, nb, &j)) return false;
    return i == na && j == nb;
}

bool reward_text_matches(const char *got, size_t n_got, const char *want, size_t n_want, unsigned normalize) {
    if (n_got == 0 || n_want == 0) return false;
    double x, y;
    if (reward_number_whole(got, n_got, &x) && reward_number_whole(want, n_want, &y)) return x == y;
    if (normalize & REWARD_NORMALIZE_LOWERCASE) return equal_lowercase(got, n_got, want, n_want);
    return n_got == n_want && memcmp(got, want, n_got) == 0;
}
