/* text_similarity's metrics, each the same number as the Python reference docs/rewards.md
 * names (tests/data/graders/ holds their outputs):
 *
 *   fuzzy_match  rapidfuzz fuzz.ratio / 100: 1 − Indel distance / (len a + len b) over
 *                code points, 1 for two empty texts
 *   bleu         sacrebleu sentence_bleu (13a tokens, "exp" smoothing, effective order) / 100
 *   gleu         nltk sentence_gleu over whitespace tokens (str.split), n-grams 1 to 4
 *   rouge_N      rouge-score's ROUGE-N F-measure (its tokenizer, no stemming)
 *   rouge_l      rouge-score's ROUGE-L F-measure (longest common subsequence of tokens)
 *
 * Tokens are interned to integers (sorted once) so that n-grams compare as integer
 * runs; n-gram counts come from sorting, longest common subsequences from Hyyrö's
 * bit-parallel algorithm (dynamic programming where its masks would be too large). */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rewards/rewards_internal.h"

/* ---- tokens ---- */

/* A token list: spans of buf, and the integer each token is interned to. */
struct tokens {
    struct reward_buf buf;
    int n, cap;
    size_t *off, *len;
    int32_t *id;
};

static void tokens_free(struct tokens *t) {
    reward_buf_free(&t->buf);
    free(t->off);
    free(t->len);
    free(t->id);
}

static int tokens_push(struct tokens *t, size_t off, size_t len) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        size_t *o = realloc(t->off, (size_t)cap * sizeof *o);
        if (o) t->off = o;
        size_t *l = realloc(t->len, (size_t)cap * sizeof *l);
        if (l) t->len = l;
        if (!o || !l) return SMELT_ENOMEM;
        t->cap = cap;
    }
    t->off[t->n] = off;
    t->len[t->n] = len;
    t->n++;
    return SMELT_OK;
}

/* Python's str.isspace(): what str.split() and str.rstrip() take for whitespace. */
static bool py_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* t->buf split as Python's str.split() does. */
static int split_buf(struct tokens *t) {
    const char *s = t->buf.p;
    size_t n = t->buf.n, i = 0, start = 0;
    bool in = false;
    while (i < n) {
        size_t at = i;
        bool space = py_space(reward_next_char(s, n, &i, false));
        if (space && in) TRY(tokens_push(t, start, at - start));
        if (!space && !in) start = at;
        in = !space;
    }
    if (in) TRY(tokens_push(t, start, n - start));
    return SMELT_OK;
}

static int tokens_whitespace(const char *s, size_t n, struct tokens *t) {
    TRY(reward_buf_append(&t->buf, s, n));
    return split_buf(t);
}

/* rouge-score's tokenizer: lowercase (Python's str.lower), every run of characters
 * outside [a-z0-9] a separator. Only ASCII letters and digits survive, plus the two
 * characters whose lowercase is ASCII: İ (U+0130 → "i" + U+0307, a separator) and the
 * Kelvin sign (U+212A → "k"). */
static int tokens_rouge(const char *s, size_t n, struct tokens *t) {
    size_t i = 0;
    while (i < n) {
        int32_t c = reward_next_char(s, n, &i, false);
        char out[2] = {' ', ' '};
        size_t k = 1;
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) out[0] = (char)c;
        else if (c >= 'A' && c <= 'Z') out[0] = (char)(c - 'A' + 'a');
        else if (c == 0x212a) out[0] = 'k';
        else if (c == 0x130) out[0] = 'i', k = 2;
        TRY(reward_buf_append(&t->buf, out, k));
    }
    TRY(reward_buf_append(&t->buf, "", 0));
    return split_buf(t);
}

/* out = in with every `from` replaced by `to` (Python's str.replace). */
static int replace_all(const struct reward_buf *in, const char *from, const char *to, struct reward_buf *out) {
    size_t nf = strlen(from), i = 0;
    out->n = 0;
    TRY(reward_buf_append(out, "", 0));
    while (i < in->n) {
        if (in->n - i >= nf && memcmp(in->p + i, from, nf) == 0) {
            TRY(reward_buf_append(out, to, strlen(to)));
            i += nf;
        } else {
            TRY(reward_buf_append(out, in->p + i++, 1));
        }
    }
    return SMELT_OK;
}

static bool digit(char c) { return c >= '0' && c <= '9'; }

/* sacrebleu's first regex: ASCII punctuation except ' , - . gets a space each side. */
static bool punct_13a(char c) {
    return (c >= 0x7b && c <= 0x7e) || (c >= 0x5b && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
           (c >= 0x28 && c <= 0x2b) || (c >= 0x3a && c <= 0x40) || c == '/';
}

/* One of sacrebleu's two-character regexes, applied as re.sub does (left to right, a
 * match consuming both characters). Its characters on the ASCII side are ASCII, so
 * working on UTF-8 bytes gives the same text as Python does on code points.
 * which 2: ([^0-9])([.,]) → "\1 \2 "; 3: ([.,])([^0-9]) → " \1 \2"; 4: ([0-9])(-) → "\1 \2 ". */
static int pair_rule(const struct reward_buf *in, int which, struct reward_buf *out) {
    out->n = 0;
    TRY(reward_buf_append(out, "", 0));
    size_t i = 0;
    while (i < in->n) {
        char a = in->p[i], b = i + 1 < in->n ? in->p[i + 1] : 0;
        bool more = i + 1 < in->n, m = false;
        if (which == 2) m = more && !digit(a) && (b == '.' || b == ',');
        else if (which == 3) m = more && (a == '.' || a == ',') && !digit(b);
        else m = more && digit(a) && b == '-';
        if (!m) {
            TRY(reward_buf_append(out, &in->p[i++], 1));
            continue;
        }
        char r[4] = {a, ' ', b, ' '};
        if (which == 3) r[0] = ' ', r[1] = a, r[2] = ' ', r[3] = b;
        TRY(reward_buf_append(out, r, 4));
        i += 2;
    }
    return SMELT_OK;
}

/* sacrebleu's "13a" tokenizer (mteval-v13a) on s.rstrip(). */
static int tokens_13a(const char *s, size_t n, struct tokens *t) {
    size_t end = 0, i = 0;
    while (i < n) /* rstrip: the end of the last character that is not whitespace */
        if (!py_space(reward_next_char(s, n, &i, false))) end = i;
    struct reward_buf a = {0}, b = {0};
    int rc = reward_buf_append(&a, s, end);
    static const char *const REPLACE[][2] = {{"<skipped>", ""}, {"-\n", ""}, {"\n", " "}, {"&quot;", "\""},
                                             {"&amp;", "&"},    {"&lt;", "<"}, {"&gt;", ">"}};
    for (int k = 0; k < 7 && !rc; k++) {
        if (k == 3 && !memchr(a.p, '&', a.n)) break; /* the entities only when the line holds a '&' */
        rc = replace_all(&a, REPLACE[k][0], REPLACE[k][1], &b);
        struct reward_buf x = a;
        a = b, b = x;
    }
    b.n = 0;
    if (!rc) rc = reward_buf_append(&b, " ", 1);
    for (size_t k = 0; k < a.n && !rc; k++)
        rc = punct_13a(a.p[k]) ? reward_buf_append(&b, (char[]){' ', a.p[k], ' '}, 3) : reward_buf_append(&b, &a.p[k], 1);
    if (!rc) rc = reward_buf_append(&b, " ", 1);
    for (int which = 2; which <= 4 && !rc; which++) {
        rc = pair_rule(&b, which, &a);
        struct reward_buf x = a;
        a = b, b = x;
    }
    reward_buf_free(&a);
    t->buf = b;
    return rc ? rc : split_buf(t);
}

/* ---- interning ---- */

struct tok_ref {
    const char *p;
    size_t n;
    int32_t *slot;
};

static int cmp_tok(const void *x, const void *y) {
    const struct tok_ref *a = x, *b = y;
    int c = memcmp(a->p, b->p, a->n < b->n ? a->n : b->n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* Gives equal tokens of a and b equal ids, different tokens different ones. */
static int intern(struct tokens *a, struct tokens *b) {
    int n = a->n + b->n;
    a->id = malloc((size_t)(a->n ? a->n : 1) * sizeof *a->id);
    b->id = malloc((size_t)(b->n ? b->n : 1) * sizeof *b->id);
    struct tok_ref *refs = malloc((size_t)(n ? n : 1) * sizeof *refs);
    if (!a->id || !b->id || !refs) {
        free(refs);
        return SMELT_ENOMEM;
    }
    struct tokens *both[2] = {a, b};
    int k = 0;
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < both[s]->n; j++)
            refs[k++] = (struct tok_ref){both[s]->buf.p + both[s]->off[j], both[s]->len[j], &both[s]->id[j]};
    qsort(refs, (size_t)n, sizeof *refs, cmp_tok);
    int32_t id = -1;
    for (int j = 0; j < n; j++) {
        if (j == 0 || cmp_tok(&refs[j - 1], &refs[j]) != 0) id++;
        *refs[j].slot = id;
    }
    free(refs);
    return SMELT_OK;
}

/* ---- n-grams and subsequences ---- */

struct gram {
    const int32_t *p;
    int n, side;
};

static int cmp_gram(const void *x, const void *y) {
    const struct gram *a = x, *b = y;
    for (int k = 0; k < a->n; k++)
        if (a->p[k] != b->p[k]) return a->p[k] < b->p[k] ? -1 : 1;
    return 0;
}

/* Σ over distinct n-grams of min(count in a, count in b). */
static int ngram_overlap(const int32_t *a, int na, const int32_t *b, int nb, int n, int64_t *overlap) {
    int ga = na - n + 1 > 0 ? na - n + 1 : 0, gb = nb - n + 1 > 0 ? nb - n + 1 : 0;
    *overlap = 0;
    if (!ga || !gb) return SMELT_OK;
    struct gram *g = malloc((size_t)(ga + gb) * sizeof *g);
    if (!g) return SMELT_ENOMEM;
    for (int k = 0; k < ga; k++) g[k] = (struct gram){a + k, n, 0};
    for (int k = 0; k < gb; k++) g[ga + k] = (struct gram){b + k, n, 1};
    qsort(g, (size_t)(ga + gb), sizeof *g, cmp_gram);
    for (int k = 0; k < ga + gb;) {
        int64_t c[2] = {0, 0};
        int j = k;
        while (j < ga + gb && cmp_gram(&g[k], &g[j]) == 0) c[g[j++].side]++;
        *overlap += c[0] < c[1] ? c[0] : c[1];
        k = j;
    }
    free(g);
    return SMELT_OK;
}

/* Length of the longest common subsequence of a and b by dynamic programming (one row). */
static int lcs_table(const int32_t *a, int na, const int32_t *b, int nb, int64_t *out) {
    int64_t *row = calloc((size_t)nb + 1, sizeof *row);
    if (!row) return SMELT_ENOMEM;
    for (int i = 0; i < na; i++) {
        int64_t diag = 0; /* row[j - 1] of the previous line */
        for (int j = 1; j <= nb; j++) {
            int64_t up = row[j];
            row[j] = a[i] == b[j - 1] ? diag + 1 : (up > row[j - 1] ? up : row[j - 1]);
            diag = up;
        }
    }
    *out = row[nb];
    free(row);
    return SMELT_OK;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* Where c is in the sorted u[0..n), or -1. */
static int find_i32(const int32_t *u, int n, int32_t c) {
    const int32_t *p = bsearch(&c, u, (size_t)n, sizeof c, cmp_i32);
    return p ? (int)(p - u) : -1;
}

/* The same length by Hyyrö's bit-parallel algorithm, 64 cells of the table per step:
 * S starts all ones; for each element of b with match mask M (the positions of that
 * element in a), S = (S + (S & M)) | (S & ~M); the LCS is the number of zeros in S's
 * first na bits. *done false when the masks would take more than 32 MiB (a long a of
 * many distinct elements): the caller falls back to the table. */
static int lcs_bits(const int32_t *a, int na, const int32_t *b, int nb, int64_t *out, bool *done) {
    int words = (na + 63) / 64, nu = 0;
    int32_t *u = malloc((size_t)na * sizeof *u);
    if (!u) return SMELT_ENOMEM;
    memcpy(u, a, (size_t)na * sizeof *u);
    qsort(u, (size_t)na, sizeof *u, cmp_i32);
    for (int i = 0; i < na; i++)
        if (i == 0 || u[i] != u[nu - 1]) u[nu++] = u[i];
    *done = (int64_t)nu * words <= (1 << 22);
    uint64_t *pm = *done ? calloc((size_t)nu * (size_t)words, sizeof *pm) : NULL;
    uint64_t *s = *done ? malloc((size_t)words * sizeof *s) : NULL;
    if (*done && (!pm || !s)) {
        free(u), free(pm), free(s);
        return SMELT_ENOMEM;
    }
    for (int i = 0; *done && i < na; i++) pm[(size_t)find_i32(u, nu, a[i]) * (size_t)words + (size_t)(i / 64)] |= 1ull << (i % 64);
    for (int w = 0; *done && w < words; w++) s[w] = ~0ull;
    for (int j = 0; *done && j < nb; j++) {
        int k = find_i32(u, nu, b[j]);
        if (k < 0) continue;
        const uint64_t *m = pm + (size_t)k * (size_t)words;
        uint64_t carry = 0;
        for (int w = 0; w < words; w++) {
            uint64_t x = s[w] & m[w], sum = s[w] + x, next = sum < x;
            sum += carry;
            next |= sum < carry;
            s[w] = sum | (s[w] & ~m[w]);
            carry = next;
        }
    }
    int64_t zeros = 0;
    for (int i = 0; *done && i < na; i++) zeros += !((s[i / 64] >> (i % 64)) & 1);
    *out = zeros;
    free(u), free(pm), free(s);
    return SMELT_OK;
}

/* Length of the longest common subsequence of a and b. */
static int lcs_length(const int32_t *a, int na, const int32_t *b, int nb, int64_t *out) {
    *out = 0;
    if (!na || !nb) return SMELT_OK;
    if (na > nb) { /* the masks over the shorter one */
        const int32_t *t = a;
        int n = na;
        a = b, na = nb, b = t, nb = n;
    }
    bool done;
    TRY(lcs_bits(a, na, b, nb, out, &done));
    return done ? SMELT_OK : lcs_table(a, na, b, nb, out);
}

/* ---- metrics ---- */

static int to_chars(const char *s, size_t n, int32_t **out, int *len) {
    *out = malloc((n ? n : 1) * sizeof **out);
    if (!*out) return SMELT_ENOMEM;
    size_t i = 0;
    *len = 0;
    while (i < n) (*out)[(*len)++] = reward_next_char(s, n, &i, false);
    return SMELT_OK;
}

static int fuzzy_match(const char *a, size_t na, const char *b, size_t nb, double *score) {
    int32_t *ca = NULL, *cb = NULL;
    int la = 0, lb = 0;
    int64_t lcs = 0;
    int rc = to_chars(a, na, &ca, &la);
    if (!rc) rc = to_chars(b, nb, &cb, &lb);
    if (!rc) rc = lcs_length(ca, la, cb, lb, &lcs);
    free(ca);
    free(cb);
    if (rc) return rc;
    double total = (double)la + (double)lb;
    *score = total == 0 ? 1.0 : 1.0 - ((double)(la + lb) - 2.0 * (double)lcs) / total;
    return SMELT_OK;
}

/* sacrebleu's compute_bleu for one sentence: exp smoothing, effective order, / 100. */
static double bleu_from_counts(const int64_t *correct, const int64_t *total, int64_t sys_len, int64_t ref_len) {
    double bp = 1.0;
    if (sys_len < ref_len) bp = sys_len > 0 ? exp(1.0 - (double)ref_len / (double)sys_len) : 0.0;
    if (!correct[0] && !correct[1] && !correct[2] && !correct[3]) return 0.0;
    double precisions[4] = {0, 0, 0, 0}, smooth = 1.0;
    int eff = 4;
    for (int n = 1; n <= 4; n++) {
        if (total[n - 1] == 0) break;
        eff = n;
        if (correct[n - 1] == 0) {
            smooth *= 2;
            precisions[n - 1] = 100.0 / (smooth * (double)total[n - 1]);
        } else {
            precisions[n - 1] = 100.0 * (double)correct[n - 1] / (double)total[n - 1];
        }
    }
    double sum = 0;
    for (int n = 0; n < eff; n++) sum += precisions[n] == 0.0 ? -9999999999.0 : log(precisions[n]);
    return bp * exp(sum / eff) / 100.0;
}

static double fmeasure(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0.0; }

/* Both texts tokenized by the metric's tokenizer and interned; then the metric. */
static int token_metric(enum grader_metric m, struct tokens *in, struct tokens *ref, double *score) {
    TRY(intern(in, ref));
    int64_t ov[4];
    if (m == GRADER_BLEU || m == GRADER_GLEU) {
        int64_t tot_in[4], tot_ref[4];
        for (int n = 1; n <= 4; n++) {
            TRY(ngram_overlap(in->id, in->n, ref->id, ref->n, n, &ov[n - 1]));
            tot_in[n - 1] = in->n - n + 1 > 0 ? in->n - n + 1 : 0;
            tot_ref[n - 1] = ref->n - n + 1 > 0 ? ref->n - n + 1 : 0;
        }
        if (m == GRADER_BLEU) {
            *score = bleu_from_counts(ov, tot_in, in->n, ref->n);
            return SMELT_OK;
        }
        int64_t tp = ov[0] + ov[1] + ov[2] + ov[3], tpfp = tot_in[0] + tot_in[1] + tot_in[2] + tot_in[3],
                tpfn = tot_ref[0] + tot_ref[1] + tot_ref[2] + tot_ref[3], all = tpfp > tpfn ? tpfp : tpfn;
        *score = all > 0 ? (double)tp / (double)all : 0.0;
        return SMELT_OK;
    }
    if (m == GRADER_ROUGE_L) {
        int64_t lcs;
        if (!in->n || !ref->n) return *score = 0.0, SMELT_OK;
        TRY(lcs_length(ref->id, ref->n, in->id, in->n, &lcs));
        *score = fmeasure((double)lcs / in->n, (double)lcs / ref->n);
        return SMELT_OK;
    }
    int n = (int)(m - GRADER_ROUGE_1) + 1;
    int64_t g_in = in->n - n + 1 > 0 ? in->n - n + 1 : 0, g_ref = ref->n - n + 1 > 0 ? ref->n - n + 1 : 0;
    TRY(ngram_overlap(in->id, in->n, ref->id, ref->n, n, &ov[0]));
    *score = fmeasure((double)ov[0] / (double)(g_in > 1 ? g_in : 1), (double)ov[0] / (double)(g_ref > 1 ? g_ref : 1));
    return SMELT_OK;
}

int grader_similarity(enum grader_metric m, const char *input, size_t n_input, const char *reference,
                      size_t n_reference, double *score) {
    if (m == GRADER_FUZZY_MATCH) return fuzzy_match(input, n_input, reference, n_reference, score);
    struct tokens in = {0}, ref = {0};
    int (*tokenize)(const char *, size_t, struct tokens *) =
        m == GRADER_BLEU ? tokens_13a : m == GRADER_GLEU ? tokens_whitespace : tokens_rouge;
    int rc = tokenize(input, n_input, &in);
    if (!rc) rc = tokenize(reference, n_reference, &ref);
    if (!rc) rc = token_metric(m, &in, &ref, score);
    tokens_free(&in);
    tokens_free(&ref);
    return rc;
}
