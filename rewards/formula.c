/* multi's calculate_output: a formula over the sub-graders' scores, parsed once by
 * recursive descent into a small tree of nodes and evaluated per sample. Never eval:
 * the grammar is numbers, sub-grader names, + - * / ^, parentheses and the functions
 * OpenAI documents (min, max, abs, floor, ceil, exp, sqrt, log):
 *
 *     expr    = term (("+" | "-") term)*
 *     term    = unary (("*" | "/") unary)*
 *     unary   = ("-" | "+") unary | power
 *     power   = primary ["^" unary]           (right-associative; -2^2 = -4, as Python's **)
 *     primary = number | name | name "(" expr ("," expr)* ")" | "(" expr ")"
 *
 * Errors name the offset. A division by zero, or any result that is not finite (log of
 * 0, sqrt of a negative), fails the sample. */
#include "rewards/graders_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_NUM, F_VAR, F_NEG, F_ADD, F_SUB, F_MUL, F_DIV, F_POW, F_CALL };
enum { FN_MIN, FN_MAX, FN_ABS, FN_FLOOR, FN_CEIL, FN_EXP, FN_SQRT, FN_LOG, N_FN };
static const char *const FUNCTIONS[N_FN] = {"min", "max", "abs", "floor", "ceil", "exp", "sqrt", "log"};
#define MAX_DEPTH 64

bool grader_formula_is_function(const char *name) {
    for (int k = 0; k < N_FN; k++)
        if (strcmp(name, FUNCTIONS[k]) == 0) return true;
    return false;
}

struct fparse {
    const char *s;
    size_t i, len;
    const char *const *names;
    int n_names, depth;
    const char *w;
    struct grader_formula *f;
    struct smelt_error *err;
};

static int fail_at(struct fparse *p, size_t at, const char *what) {
    return error_set_field(p->err, SMELT_EINVAL, "calculate_output", "%s: %s at offset %zu", p->w, what, at);
}

static void skip_blanks(struct fparse *p) {
    while (p->i < p->len && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* The next non-blank character (consumed when it is c). */
static bool accept(struct fparse *p, char c) {
    skip_blanks(p);
    if (p->i < p->len && p->s[p->i] == c) {
        p->i++;
        return true;
    }
    return false;
}

static int new_node(struct fparse *p, int kind, size_t at, int *out) {
    if (p->f->n_nodes == GRADER_MAX_FORMULA_NODES)
        return fail_at(p, at, "the formula is too long (more than 256 terms)");
    *out = p->f->n_nodes++;
    p->f->node[*out] = (struct grader_formula_node){.kind = (uint8_t)kind, .a = -1, .b = -1, .offset = (uint16_t)at};
    return SMELT_OK;
}

static int binary(struct fparse *p, int kind, size_t at, int a, int b, int *out) {
    TRY(new_node(p, kind, at, out));
    p->f->node[*out].a = (int16_t)a;
    p->f->node[*out].b = (int16_t)b;
    return SMELT_OK;
}

static int parse_expr(struct fparse *p, int *out);
static int parse_unary(struct fparse *p, int *out);

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* digits ["." digits] | "." digits, then an optional exponent. */
static int parse_number(struct fparse *p, int *out) {
    size_t at = p->i, i = p->i;
    while (i < p->len && is_digit(p->s[i])) i++;
    if (i < p->len && p->s[i] == '.') {
        i++;
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i == at + 1 && p->s[at] == '.') return fail_at(p, at, "a number needs a digit");
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t e = i + 1;
        if (e < p->len && (p->s[e] == '+' || p->s[e] == '-')) e++;
        if (e < p->len && is_digit(p->s[e])) {
            while (e < p->len && is_digit(p->s[e])) e++;
            i = e;
        }
    }
    char text[64];
    if (i - at >= sizeof text) return fail_at(p, at, "a number longer than 63 characters");
    memcpy(text, p->s + at, i - at);
    text[i - at] = '\0';
    double v = strtod(text, NULL);
    if (!isfinite(v)) return fail_at(p, at, "a number too large for a double");
    p->i = i;
    TRY(new_node(p, F_NUM, at, out));
    p->f->node[*out].value = v;
    return SMELT_OK;
}

/* name "(" expr ("," expr)* ")": arguments go to f->args, in order. */
static int parse_call(struct fparse *p, int fn, size_t at, int *out) {
    int args[GRADER_MAX_FORMULA_NODES], n = 0;
    do {
        if (n == GRADER_MAX_FORMULA_NODES) return fail_at(p, at, "too many arguments");
        TRY(parse_expr(p, &args[n]));
        n++;
    } while (accept(p, ','));
    if (!accept(p, ')')) return fail_at(p, p->i, "expected ',' or ')' in the arguments");
    bool variadic = fn == FN_MIN || fn == FN_MAX;
    if (!variadic && n != 1) {
        char what[96];
        snprintf(what, sizeof what, "%s takes 1 argument, not %d", FUNCTIONS[fn], n);
        return fail_at(p, at, what);
    }
    if (p->f->n_args + n > GRADER_MAX_FORMULA_NODES) return fail_at(p, at, "too many arguments");
    TRY(new_node(p, F_CALL, at, out));
    struct grader_formula_node *node = &p->f->node[*out];
    node->fn = (uint8_t)fn;
    node->a = (int16_t)p->f->n_args;
    node->b = (int16_t)n;
    for (int k = 0; k < n; k++) p->f->args[p->f->n_args++] = (int16_t)args[k];
    return SMELT_OK;
}

static int parse_name(struct fparse *p, int *out) {
    size_t at = p->i;
    while (p->i < p->len && is_name_char(p->s[p->i])) p->i++;
    size_t len = p->i - at;
    if (accept(p, '(')) {
        for (int k = 0; k < N_FN; k++)
            if (strlen(FUNCTIONS[k]) == len && memcmp(p->s + at, FUNCTIONS[k], len) == 0)
                return parse_call(p, k, at, out);
        char what[160];
        snprintf(what, sizeof what, "unknown function \"%.*s\" (min, max, abs, floor, ceil, exp, sqrt, log)",
                 (int)(len > 40 ? 40 : len), p->s + at);
        return fail_at(p, at, what);
    }
    for (int k = 0; k < p->n_names; k++)
        if (strlen(p->names[k]) == len && memcmp(p->s + at, p->names[k], len) == 0) {
            TRY(new_node(p, F_VAR, at, out));
            p->f->node[*out].var = k;
            return SMELT_OK;
        }
    char what[400];
    int w = snprintf(what, sizeof what, "unknown name \"%.*s\" (the graders are:", (int)(len > 40 ? 40 : len), p->s + at);
    for (int k = 0; k < p->n_names && w > 0 && (size_t)w < sizeof what; k++)
        w += snprintf(what + w, sizeof what - (size_t)w, "%s %s", k ? "," : "", p->names[k]);
    if (w > 0 && (size_t)w < sizeof what) snprintf(what + w, sizeof what - (size_t)w, ")");
    return fail_at(p, at, what);
}

static int parse_primary(struct fparse *p, int *out) {
    skip_blanks(p);
    size_t at = p->i;
    if (at >= p->len) return fail_at(p, at, "the formula ends where a number, a name or '(' was expected");
    char c = p->s[at];
    if (is_digit(c) || c == '.') return parse_number(p, out);
    if (is_name_start(c)) return parse_name(p, out);
    if (c == '(') {
        p->i++;
        TRY(parse_expr(p, out));
        return accept(p, ')') ? SMELT_OK : fail_at(p, p->i, "expected ')'");
    }
    char what[64];
    snprintf(what, sizeof what, "unexpected '%c'", c);
    return fail_at(p, at, what);
}

static int parse_power(struct fparse *p, int *out) {
    TRY(parse_primary(p, out));
    skip_blanks(p);
    size_t at = p->i;
    if (!accept(p, '^')) return SMELT_OK;
    int rhs;
    TRY(parse_unary(p, &rhs));
    return binary(p, F_POW, at, *out, rhs, out);
}

static int parse_unary(struct fparse *p, int *out) {
    skip_blanks(p);
    size_t at = p->i;
    if (++p->depth > MAX_DEPTH) return fail_at(p, at, "nested more than 64 deep");
    int rc;
    if (accept(p, '-')) {
        int a;
        rc = parse_unary(p, &a);
        if (!rc) rc = binary(p, F_NEG, at, a, -1, out);
    } else if (accept(p, '+')) {
        rc = parse_unary(p, out);
    } else {
        rc = parse_power(p, out);
    }
    p->depth--;
    return rc;
}

static int parse_term(struct fparse *p, int *out) {
    TRY(parse_unary(p, out));
    for (;;) {
        skip_blanks(p);
        size_t at = p->i;
        int kind = accept(p, '*') ? F_MUL : accept(p, '/') ? F_DIV : -1;
        if (kind < 0) return SMELT_OK;
        int rhs;
        TRY(parse_unary(p, &rhs));
        TRY(binary(p, kind, at, *out, rhs, out));
    }
}

static int parse_expr(struct fparse *p, int *out) {
    if (++p->depth > MAX_DEPTH) return fail_at(p, p->i, "nested more than 64 deep");
    TRY(parse_term(p, out));
    for (;;) {
        skip_blanks(p);
        size_t at = p->i;
        int kind = accept(p, '+') ? F_ADD : accept(p, '-') ? F_SUB : -1;
        if (kind < 0) break;
        int rhs;
        TRY(parse_term(p, &rhs));
        TRY(binary(p, kind, at, *out, rhs, out));
    }
    p->depth--;
    return SMELT_OK;
}

int grader_formula_parse(const char *src, const char *const *names, int n_names, const char *w,
                         struct grader_formula *f, struct smelt_error *err) {
    size_t len = strlen(src);
    *f = (struct grader_formula){0};
    if (len == 0 || len > GRADER_MAX_FORMULA_BYTES)
        return error_set_field(err, SMELT_EINVAL, "calculate_output", "%s: %zu bytes, expected 1 to %d", w, len,
                               GRADER_MAX_FORMULA_BYTES);
    struct fparse p = {.s = src, .len = len, .names = names, .n_names = n_names, .w = w, .f = f, .err = err};
    TRY(parse_expr(&p, &f->root));
    skip_blanks(&p);
    if (p.i < len) {
        char what[64];
        snprintf(what, sizeof what, "unexpected '%c' after a complete formula", src[p.i]);
        return fail_at(&p, p.i, what);
    }
    f->src = malloc(len + 1);
    if (!f->src) return error_set(err, SMELT_ENOMEM, "%s: out of memory", w);
    memcpy(f->src, src, len + 1);
    return SMELT_OK;
}

void grader_formula_free(struct grader_formula *f) {
    free(f->src);
    f->src = NULL;
}

/* ---- evaluation ---- */

struct feval {
    const struct grader_formula *f;
    const double *vars;
    char *why;
    size_t why_n;
};

static int not_finite(struct feval *e, const struct grader_formula_node *n, double v) {
    snprintf(e->why, e->why_n, "calculate_output: the term at offset %u gives %g, not a finite number", n->offset, v);
    return GRADER_FAILED;
}

static double apply(int fn, double x) {
    switch (fn) {
    case FN_ABS: return fabs(x);
    case FN_FLOOR: return floor(x);
    case FN_CEIL: return ceil(x);
    case FN_EXP: return exp(x);
    case FN_SQRT: return sqrt(x);
    default: return log(x);
    }
}

static int eval_node(struct feval *e, int k, double *out);

static int eval_call(struct feval *e, const struct grader_formula_node *n, double *out) {
    double acc = 0;
    for (int j = 0; j < n->b; j++) {
        double x;
        TRY(eval_node(e, e->f->args[n->a + j], &x));
        if (n->fn == FN_MIN) acc = j == 0 || x < acc ? x : acc;
        else if (n->fn == FN_MAX) acc = j == 0 || x > acc ? x : acc;
        else acc = apply(n->fn, x);
    }
    *out = acc;
    return SMELT_OK;
}

static int eval_node(struct feval *e, int k, double *out) {
    const struct grader_formula_node *n = &e->f->node[k];
    double a = 0, b = 0, v;
    if (n->kind == F_NUM) v = n->value;
    else if (n->kind == F_VAR) v = e->vars[n->var];
    else if (n->kind == F_CALL) TRY(eval_call(e, n, &v));
    else {
        TRY(eval_node(e, n->a, &a));
        if (n->b >= 0) TRY(eval_node(e, n->b, &b));
        switch (n->kind) {
        case F_NEG: v = -a; break;
        case F_ADD: v = a + b; break;
        case F_SUB: v = a - b; break;
        case F_MUL: v = a * b; break;
        case F_DIV:
            if (b == 0) {
                snprintf(e->why, e->why_n, "calculate_output: division by zero at offset %u", n->offset);
                return GRADER_FAILED;
            }
            v = a / b;
            break;
        default: v = pow(a, b); break;
        }
    }
    if (!isfinite(v)) return not_finite(e, n, v);
    *out = v;
    return SMELT_OK;
}

int grader_formula_eval(const struct grader_formula *f, const double *vars, double *out, char *why, size_t why_n) {
    struct feval e = {.f = f, .vars = vars, .why = why, .why_n = why_n};
    return eval_node(&e, f->root, out);
}
