/* Grader templates: "{{ namespace.path }}" references parsed once from a grader's input
 * or reference, and substituted per sample from the prompts row (item) and the
 * completion (sample.output_text, sample.output_json). A reference that names nothing
 * fails the sample with a message naming it; the prompt check finds the row's misses
 * before training. */
#include "rewards/graders_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

int reward_buf_append(struct reward_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return SMELT_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return SMELT_OK;
}

void reward_buf_free(struct reward_buf *b) {
    free(b->p);
    *b = (struct reward_buf){0};
}

/* ---- parsing ---- */

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Key characters: letters, digits, '_', '-', and any non-ASCII byte (Unicode keys). */
static bool is_key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           (unsigned char)c >= 0x80;
}

struct ref_parse {
    const char *s; /* the template */
    size_t i, end; /* the cursor and the end of the reference's content */
    const char *w;
    size_t at, close; /* offsets of "{{" and "}}" */
};

static int ref_error(const struct ref_parse *p, struct smelt_error *err, const char *key, const char *why) {
    size_t n = p->close + 2 - p->at;
    return error_set_field(err, SMELT_EINVAL, key, "%s: \"%.*s\" at offset %zu: %s", p->w, (int)(n > 80 ? 80 : n),
                           p->s + p->at, p->at, why);
}

/* Segments from the cursor to the end: ('.' key | '[' digits ']')*. */
static int parse_segments(struct ref_parse *p, struct grader_ref *r, const char *key, struct smelt_error *err) {
    while (p->i < p->end) {
        if (r->n_seg == GRADER_MAX_PATH) return ref_error(p, err, key, "more than 8 path segments");
        struct grader_segment *g = &r->seg[r->n_seg];
        char c = p->s[p->i++];
        if (c == '.') {
            g->key = p->i;
            while (p->i < p->end && is_key_char(p->s[p->i])) p->i++;
            g->key_len = p->i - g->key;
            if (!g->key_len) return ref_error(p, err, key, "a '.' must be followed by a field name");
        } else if (c == '[') {
            size_t k = 0, start = p->i;
            while (p->i < p->end && p->s[p->i] >= '0' && p->s[p->i] <= '9' && p->i - start < 9)
                k = k * 10 + (size_t)(p->s[p->i++] - '0');
            if (p->i == start || p->i >= p->end || p->s[p->i] != ']')
                return ref_error(p, err, key, "expected [index] with an index of 1 to 9 digits");
            p->i++;
            g->is_index = true;
            g->index = k;
        } else {
            return ref_error(p, err, key, "expected '.field' or '[index]' in the path");
        }
        r->n_seg++;
    }
    return SMELT_OK;
}

static bool word_is(const struct ref_parse *p, size_t start, size_t len, const char *word) {
    return len == strlen(word) && memcmp(p->s + start, word, len) == 0;
}

/* "item.<path>", "sample.output_text" or "sample.output_json<path>". */
static int parse_ref(struct ref_parse *p, struct grader_ref *r, const char *key, struct smelt_error *err) {
    size_t ns = p->i;
    while (p->i < p->end && is_key_char(p->s[p->i])) p->i++;
    size_t ns_len = p->i - ns;
    if (word_is(p, ns, ns_len, "item")) {
        r->source = GRADER_ITEM;
        if (p->i >= p->end || p->s[p->i] != '.')
            return ref_error(p, err, key, "expected item.<field> (a field of the prompts row)");
        return parse_segments(p, r, key, err);
    }
    if (!word_is(p, ns, ns_len, "sample"))
        return ref_error(p, err, key, "unknown namespace: references are {{item.<field>}} or {{sample.<field>}}");
    size_t f = p->i + 1, n = 0;
    if (p->i < p->end && p->s[p->i] == '.')
        while (f + n < p->end && is_key_char(p->s[f + n])) n++;
    p->i = f + n;
    if (word_is(p, f, n, "output_text")) {
        r->source = GRADER_OUTPUT_TEXT;
        return p->i == p->end ? SMELT_OK : ref_error(p, err, key, "sample.output_text is a string: nothing follows it");
    }
    if (word_is(p, f, n, "output_json")) {
        r->source = GRADER_OUTPUT_JSON;
        return parse_segments(p, r, key, err);
    }
    return ref_error(p, err, key,
                     "not available: smelt's samples are text completions (sample.output_text, "
                     "sample.output_json)");
}

static int parse_refs(struct grader_template *t, const char *key, const char *w, struct smelt_error *err) {
    const char *s = t->src;
    for (const char *open = strstr(s, "{{"); open; open = strstr(open, "{{")) {
        const char *close = strstr(open + 2, "}}");
        size_t at = (size_t)(open - s);
        if (!close)
            return error_set_field(err, SMELT_EINVAL, key, "%s: \"{{\" at offset %zu is never closed by \"}}\"", w,
                                   at);
        if (t->n_refs == GRADER_MAX_REFS)
            return error_set_field(err, SMELT_EINVAL, key, "%s: more than %d {{references}}", w, GRADER_MAX_REFS);
        struct ref_parse p = {.s = s, .i = at + 2, .end = (size_t)(close - s), .w = w, .at = at,
                             .close = (size_t)(close - s)};
        while (p.i < p.end && is_blank(s[p.i])) p.i++;
        while (p.end > p.i && is_blank(s[p.end - 1])) p.end--;
        struct grader_ref *r = &t->refs[t->n_refs];
        *r = (struct grader_ref){.start = at, .end = (size_t)(close - s) + 2};
        TRY(parse_ref(&p, r, key, err));
        t->n_refs++;
        open = close + 2;
    }
    return SMELT_OK;
}

int grader_template_parse(const json_t *obj, const char *key, const char *w, struct grader_template *t,
                          struct smelt_error *err) {
    const char *text;
    TRY(json_field_string(obj, key, true, NULL, &text, w, err));
    size_t len = json_string_length(json_object_get(obj, key));
    if (len > GRADER_MAX_TEMPLATE_BYTES || strlen(text) != len)
        return error_set_field(err, SMELT_EINVAL, key, "%s.%s: %zu bytes%s, expected at most %d", w, key, len,
                               strlen(text) != len ? " holding a NUL" : "", GRADER_MAX_TEMPLATE_BYTES);
    t->src = malloc(len + 1);
    if (!t->src) return error_set(err, SMELT_ENOMEM, "%s.%s: out of memory", w, key);
    memcpy(t->src, text, len + 1);
    t->len = len;
    char wk[GRADER_PATH_BYTES + 300];
    snprintf(wk, sizeof wk, "%s.%s", w, key);
    return parse_refs(t, key, wk, err);
}

void grader_template_free(struct grader_template *t) {
    free(t->src);
    *t = (struct grader_template){0};
}

/* ---- per-sample context ---- */

void grader_context_init(struct grader_context *c, const char *answer, const char *metadata_json,
                         const char *completion) {
    *c = (struct grader_context){.answer = answer, .metadata_json = metadata_json, .completion = completion};
}

void grader_context_reset(struct grader_context *c) {
    json_decref(c->metadata);
    json_decref(c->output);
    grader_context_init(c, c->answer, c->metadata_json, c->completion);
}

static json_t *context_metadata(struct grader_context *c) {
    if (!c->metadata_read && c->metadata_json) c->metadata = json_loads(c->metadata_json, 0, NULL);
    c->metadata_read = true;
    return c->metadata;
}

static json_t *context_output(struct grader_context *c) {
    if (!c->output_read) {
        json_error_t jerr;
        c->output = json_loads(c->completion ? c->completion : "", JSON_DECODE_ANY, &jerr);
        if (!c->output)
            snprintf(c->output_error, sizeof c->output_error, "line %d column %d: %.60s", jerr.line, jerr.column,
                     jerr.text);
    }
    c->output_read = true;
    return c->output;
}

/* ---- resolving a reference ---- */

/* What a reference resolves to: text (the completion, the row's answer) or a JSON value. */
struct resolved {
    const char *text;
    size_t len;
    const json_t *value;
};

static int ref_fail(const struct grader_template *t, const struct grader_ref *r, char *why, size_t why_n,
                    const char *what) {
    int n = (int)(r->end - r->start);
    snprintf(why, why_n, "%.*s%s: %s", n > 60 ? 60 : n, t->src + r->start, n > 60 ? "..." : "", what);
    return GRADER_FAILED;
}

static int walk(const struct grader_template *t, const struct grader_ref *r, int from, const json_t *v,
                const char *owner, struct resolved *out, char *why, size_t why_n) {
    char what[160];
    for (int k = from; k < r->n_seg; k++) {
        const struct grader_segment *g = &r->seg[k];
        const json_t *next = NULL;
        if (g->is_index) next = json_is_array(v) ? json_array_get(v, g->index) : NULL;
        else next = json_is_object(v) ? json_object_getn(v, t->src + g->key, g->key_len) : NULL;
        if (!next) {
            if (g->is_index) snprintf(what, sizeof what, "%s has no element [%zu]", owner, g->index);
            else snprintf(what, sizeof what, "%s has no field \"%.*s\"", owner, (int)(g->key_len > 60 ? 60 : g->key_len),
                          t->src + g->key);
            return ref_fail(t, r, why, why_n, what);
        }
        v = next;
    }
    if (json_is_null(v)) {
        snprintf(what, sizeof what, "is null in %s", owner);
        return ref_fail(t, r, why, why_n, what);
    }
    out->value = v;
    return SMELT_OK;
}

static int resolve_item(const struct grader_template *t, const struct grader_ref *r, struct grader_context *c,
                        struct resolved *out, char *why, size_t why_n) {
    const struct grader_segment *g = &r->seg[0];
    bool answer = !g->is_index && g->key_len == 6 && memcmp(t->src + g->key, "answer", 6) == 0;
    if (answer && c->answer) {
        if (r->n_seg > 1) return ref_fail(t, r, why, why_n, "the row's \"answer\" is a string, with no fields");
        out->text = c->answer;
        out->len = strlen(c->answer);
        return SMELT_OK;
    }
    json_t *meta = context_metadata(c);
    if (answer && !json_object_get(meta, "answer"))
        return ref_fail(t, r, why, why_n, "the row has no \"answer\" (nor has its metadata)");
    if (!meta) return ref_fail(t, r, why, why_n, "the row has no \"metadata\"");
    /* item.metadata.x spells out smelt's own rows' "metadata" object; an OpenAI row whose
     * fields include one named "metadata" means that field. */
    bool whole = !g->is_index && g->key_len == 8 && memcmp(t->src + g->key, "metadata", 8) == 0 &&
                 !json_object_get(meta, "metadata");
    return walk(t, r, whole ? 1 : 0, meta, "the row's metadata", out, why, why_n);
}

static int resolve(const struct grader_template *t, const struct grader_ref *r, struct grader_context *c,
                   struct resolved *out, char *why, size_t why_n) {
    *out = (struct resolved){0};
    if (r->source == GRADER_OUTPUT_TEXT) {
        out->text = c->completion;
        out->len = strlen(c->completion);
        return SMELT_OK;
    }
    if (r->source == GRADER_ITEM) return resolve_item(t, r, c, out, why, why_n);
    /* The completion's side is the model's to get right: no JSON, or JSON without the
     * field, scores 0 (the reward stage's rule), never a failed sample. */
    const json_t *v = context_output(c);
    if (!v) return GRADER_ZERO;
    return walk(t, r, 0, v, "the completion's JSON", out, why, why_n) ? GRADER_ZERO : SMELT_OK;
}

/* ---- rendering ---- */

/* A double as Python's repr writes it: the shortest "%.*g" that reads back the same. */
static void format_real(double x, char *buf, size_t n) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x) return;
    }
}

static int append_value(struct reward_buf *out, const json_t *v) {
    char num[64];
    switch (json_typeof(v)) {
    case JSON_STRING: return reward_buf_append(out, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: format_real(json_real_value(v), num, sizeof num); break;
    case JSON_TRUE: snprintf(num, sizeof num, "true"); break;
    case JSON_FALSE: snprintf(num, sizeof num, "false"); break;
    default: { /* object, array: compact JSON */
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) return SMELT_ENOMEM;
        int rc = reward_buf_append(out, text, strlen(text));
        free(text);
        return rc;
    }
    }
    return reward_buf_append(out, num, strlen(num));
}

int grader_template_render(const struct grader_template *t, struct grader_context *c, struct reward_buf *out,
                           char *why, size_t why_n) {
    out->n = 0;
    TRY(reward_buf_append(out, "", 0));
    size_t at = 0;
    for (int k = 0; k < t->n_refs; k++) {
        const struct grader_ref *r = &t->refs[k];
        struct resolved v;
        TRY(reward_buf_append(out, t->src + at, r->start - at));
        TRY(resolve(t, r, c, &v, why, why_n));
        TRY(v.value ? append_value(out, v.value) : reward_buf_append(out, v.text, v.len));
        at = r->end;
    }
    return reward_buf_append(out, t->src + at, t->len - at);
}

int grader_template_check_row(const struct grader_template *t, struct grader_context *c, const char **field,
                              char *why, size_t why_n) {
    for (int k = 0; k < t->n_refs; k++) {
        const struct grader_ref *r = &t->refs[k];
        if (r->source != GRADER_ITEM) continue;
        struct resolved v;
        if (resolve(t, r, c, &v, why, why_n)) {
            bool answer = !r->seg[0].is_index && r->seg[0].key_len == 6 && memcmp(t->src + r->seg[0].key, "answer", 6) == 0;
            *field = answer ? "answer" : "metadata";
            return GRADER_FAILED;
        }
    }
    return SMELT_OK;
}
