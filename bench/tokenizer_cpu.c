/* tokenizer_cpu: encode throughput of smelt's tokenizer, printed as one JSON object
 * (bench/tokenizer.py runs it next to Hugging Face `tokenizers` on the same files).
 *
 *   tokenizer_cpu [--tokenizer PATH] [--texts FILE] [--rounds N]
 *
 * Defaults (what `make bench` runs, from the repository root): the Qwen3 tokenizer and
 * the texts of tests/data/tokenizers/.
 * --tokenizer: a tokenizer.json, or a folder holding one (or GPT-2's encoder.json and
 * vocab.bpe). --texts: JSON Lines, one {"text": ...} per line. Each mode runs --rounds
 * times (default 3) and reports its fastest round: "serial" encodes the texts one after
 * another on this thread (tokenizer_encode), "batch" all of them in one
 * tokenizer_encode_batch call (the OpenMP pool). ids_hash (FNV-1a over every id, text
 * after text) lets the driver check that both modes, and the peer, produced the same ids.
 * Special tokens in the text stay plain text (allow_special false), as a peer encoding
 * without add_special_tokens and with split_special_tokens does. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "tokenizer/tokenizer.h"

#define DEFAULT_TOKENIZER "tests/data/tokenizers/qwen3"
#define DEFAULT_TEXTS "tests/data/tokenizers/vectors.jsonl"

struct corpus {
    char **texts;
    size_t *lens;
    size_t count, bytes;
};

static void usage(FILE *f) {
    fprintf(f, "usage: tokenizer_cpu [--tokenizer PATH] [--texts FILE] [--rounds N]\n"
               "  --tokenizer PATH  tokenizer.json, or a folder with one or GPT-2's files (default %s)\n"
               "  --texts FILE      JSON Lines of {\"text\": ...} (default %s)\n"
               "  --rounds N        rounds per mode, the fastest reported (default 3)\n", DEFAULT_TOKENIZER,
            DEFAULT_TEXTS);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void corpus_free(struct corpus *c) {
    for (size_t i = 0; i < c->count; i++) free(c->texts[i]);
    free(c->texts);
    free(c->lens);
}

static int corpus_add(struct corpus *c, const json_t *text, size_t line, struct smelt_error *err) {
    if (!json_is_string(text)) return error_set(err, SMELT_EINVAL, "texts line %zu: no string \"text\"", line);
    char **t = realloc(c->texts, (c->count + 1) * sizeof *t);
    if (t) c->texts = t;
    size_t *l = t ? realloc(c->lens, (c->count + 1) * sizeof *l) : NULL;
    if (l) c->lens = l;
    size_t len = json_string_length(text);
    char *copy = l ? malloc(len + 1) : NULL;
    if (!copy) return error_set(err, SMELT_ENOMEM, "texts: out of memory");
    memcpy(copy, json_string_value(text), len + 1);
    c->texts[c->count] = copy;
    c->lens[c->count++] = len;
    c->bytes += len;
    return SMELT_OK;
}

static int corpus_load(const char *path, struct corpus *c, struct smelt_error *err) {
    char *data;
    size_t size;
    TRY(file_read_all(path, &data, &size, err));
    int rc = SMELT_OK;
    size_t line = 0;
    for (char *p = data, *end; !rc && p < data + size; p = end + 1) {
        end = memchr(p, '\n', (size_t)(data + size - p));
        if (!end) end = data + size;
        line++;
        if (end == p) continue;
        json_error_t jerr;
        json_t *j = json_loadb(p, (size_t)(end - p), JSON_ALLOW_NUL, &jerr);
        rc = j ? corpus_add(c, json_object_get(j, "text"), line, err)
               : error_set(err, SMELT_EINVAL, "%s line %zu: %s", path, line, jerr.text);
        json_decref(j);
    }
    free(data);
    return rc;
}

static uint64_t fnv1a(uint64_t h, const int32_t *ids, size_t n) {
    const unsigned char *b = (const unsigned char *)ids;
    for (size_t i = 0; i < n * sizeof *ids; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* One round of one mode: its seconds, the ids' hash and count. */
static int encode_round(const struct tokenizer *tok, const struct corpus *c, bool batch, double *secs,
                        uint64_t *hash, size_t *tokens, struct smelt_error *err) {
    int32_t **ids = calloc(c->count, sizeof *ids);
    size_t *n = calloc(c->count, sizeof *n);
    int rc = ids && n ? SMELT_OK : error_set(err, SMELT_ENOMEM, "out of memory");
    double t0 = now_s();
    if (!rc && batch)
        rc = tokenizer_encode_batch(tok, (const char *const *)c->texts, c->lens, c->count, false, ids, n, err);
    for (size_t i = 0; !rc && !batch && i < c->count; i++)
        rc = tokenizer_encode(tok, c->texts[i], c->lens[i], false, &ids[i], &n[i], err);
    *secs = now_s() - t0;
    *hash = 14695981039346656037ull;
    *tokens = 0;
    for (size_t i = 0; ids && n && i < c->count; i++) {
        if (!rc) *hash = fnv1a(*hash, ids[i], n[i]), *tokens += n[i];
        free(ids[i]);
    }
    free(ids);
    free(n);
    return rc;
}

static int run(const char *tok_path, const char *texts, int64_t rounds, struct smelt_error *err) {
    struct tokenizer *tok;
    TRY(tokenizer_load(tok_path, &tok, err));
    struct corpus c = {0};
    int rc = corpus_load(texts, &c, err);
    double best[2] = {0, 0};
    uint64_t hash[2] = {0, 0};
    size_t tokens[2] = {0, 0};
    for (int mode = 0; !rc && mode < 2; mode++)
        for (int64_t r = 0; !rc && r < rounds; r++) {
            double s;
            rc = encode_round(tok, &c, mode == 1, &s, &hash[mode], &tokens[mode], err);
            if (!rc && (r == 0 || s < best[mode])) best[mode] = s;
        }
    if (!rc)
        printf("{\"texts\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"ids_hash\": \"%016llx\", \"batch_same_ids\": %s, "
               "\"serial_s\": %.6f, \"batch_s\": %.6f, \"threads\": %d}\n",
               c.count, c.bytes, tokens[0], (unsigned long long)hash[0],
               hash[0] == hash[1] && tokens[0] == tokens[1] ? "true" : "false", best[0], best[1],
               omp_get_max_threads());
    corpus_free(&c);
    tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv) {
    const char *tok_path = DEFAULT_TOKENIZER, *texts = DEFAULT_TEXTS;
    int64_t rounds = 3;
    struct smelt_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        if (strcmp(a, "--tokenizer") == 0) tok_path = v;
        else if (strcmp(a, "--texts") == 0) texts = v;
        else if (strcmp(a, "--rounds") == 0) {
            if (args_int("--rounds", v, 1, 1000, &rounds, &err)) {
                fprintf(stderr, "tokenizer_cpu: %s\n", err.message);
                return 2;
            }
        } else {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (run(tok_path, texts, rounds, &err)) {
        fprintf(stderr, "tokenizer_cpu: %s\n", err.message);
        return 1;
    }
    return 0;
}
