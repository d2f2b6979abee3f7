/* tokenizer: GPT-2 and Qwen3 ids against vectors.jsonl (from independent
 * implementations), special tokens, invalid UTF-8, the byte tokenizer and its saved
 * tokenizer.json, a hand-made Llama-2-style Metaspace + byte-fallback tokenizer, each
 * normalizer / pre-tokenizer / split behavior / added-token flag on a tiny vocabulary, and
 * the errors malformed files get.
 *
 * The expected ids of the hand-made tokenizers are derived by hand in the comments; each
 * was also checked against Hugging Face `tokenizers` 0.23 when the test was written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "tokenizer/tokenizer.h"
#include "tests/unit/testutil.h"

#define DATA "tests/data/tokenizers/"

static void expect_ids_n(const struct tokenizer *tok, const char *text, size_t len, bool special,
                         const int32_t *want, size_t n_want) {
    struct smelt_error err;
    int32_t *ids;
    size_t n;
    TEST_OK(tokenizer_encode(tok, text, len, special, &ids, &n, &err), &err);
    bool same = n == n_want;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    char got[512] = "";
    for (size_t i = 0, o = 0; !same && i < n && o < sizeof got - 16; i++)
        o += (size_t)snprintf(got + o, sizeof got - o, " %d", ids[i]);
    cr_expect(same, "encode(\"%s\", special=%d) gave %zu ids [%s ], expected %zu", text, special, n,
              got, n_want);
    free(ids);
}

#define IDS(...) (const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)
#define EXPECT_IDS(tok, text, special, ...) \
    expect_ids_n(tok, text, strlen(text), special, IDS(__VA_ARGS__))

static void expect_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                          const char *want, size_t want_len) {
    struct smelt_error err;
    char *text;
    size_t len;
    TEST_OK(tokenizer_decode(tok, ids, n, skip, &text, &len, &err), &err);
    cr_expect(len == want_len && memcmp(text, want, len) == 0 && text[len] == '\0',
              "decode gave \"%.*s\" (%zu bytes), expected \"%s\"", (int)len, text, len, want);
    free(text);
}

#define EXPECT_DECODE(tok, skip, want, ...) expect_decode(tok, IDS(__VA_ARGS__), skip, want, strlen(want))

static void expect_roundtrip(const struct tokenizer *tok, const char *text, size_t len) {
    struct smelt_error err;
    int32_t *ids;
    size_t n;
    TEST_OK(tokenizer_encode(tok, text, len, false, &ids, &n, &err), &err);
    expect_decode(tok, ids, n, false, text, len);
    free(ids);
}

static struct tokenizer *load(const char *path) {
    struct smelt_error err;
    struct tokenizer *tok = NULL;
    TEST_OK(tokenizer_load(path, &tok, &err), &err);
    return tok;
}

static struct tokenizer *load_json(const char *json) {
    struct smelt_error err;
    struct tokenizer *tok = NULL;
    TEST_OK(tokenizer_load_json(json, strlen(json), "test.json", &tok, &err), &err);
    return tok;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- vectors.jsonl ------------------------------------------------------------------- */

static void run_vectors(const char *dir, const char *field) {
    struct tokenizer *tok = load(dir);
    struct smelt_error err;
    char *file;
    size_t file_len;
    TEST_OK(file_read_all(DATA "vectors.jsonl", &file, &file_len, &err), &err);
    size_t lines = 0, mismatches = 0;
    double encode_s = 0;
    for (char *line = file, *nl; line < file + file_len; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) nl = file + file_len;
        json_t *j = json_loadb(line, (size_t)(nl - line), 0, NULL);
        cr_assert(j, "vectors.jsonl line %zu is not JSON", lines + 1);
        const json_t *text = json_object_get(j, "text"), *want = json_object_get(j, field);
        int32_t *ids;
        size_t n;
        double t0 = seconds();
        /* The reference encoders matched special tokens in the text (line 142). */
        TEST_OK(tokenizer_encode(tok, json_string_value(text), json_string_length(text), true, &ids, &n, &err), &err);
        encode_s += seconds() - t0;
        bool same = n == json_array_size(want);
        for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(want, i));
        cr_expect(same, "%s: vectors.jsonl line %zu: %zu ids, expected %zu: %s", dir, lines + 1, n,
                  json_array_size(want), json_string_value(text));
        mismatches += !same;
        expect_decode(tok, ids, n, false, json_string_value(text), json_string_length(text));
        free(ids);
        json_decref(j);
        lines++;
    }
    cr_expect_eq(lines, 156, "vectors.jsonl has %zu lines", lines);
    cr_expect_eq(mismatches, 0);
#if !defined(__SANITIZE_ADDRESS__)
    cr_expect(encode_s < 1.0, "encoding vectors.jsonl took %.3f s", encode_s);
#endif
    free(file);
    tokenizer_free(tok);
}

Test(tokenizer, gpt2_vectors) { run_vectors(DATA "gpt2", "gpt2"); }
Test(tokenizer, qwen3_vectors) { run_vectors(DATA "qwen3", "qwen3"); }

/* No ids decode to "" through a decoder chain whose output holds one empty piece (found
 * by tests/fuzz: the join read past a NULL buffer). */
Test(tokenizer, decode_of_no_ids_is_empty) {
    struct tokenizer *tok = load(DATA "qwen3/tokenizer.json");
    char *text = NULL;
    size_t len = 1;
    struct smelt_error err;
    TEST_OK(tokenizer_decode(tok, NULL, 0, false, &text, &len, &err), &err);
    cr_expect(text && text[0] == 0 && len == 0);
    free(text);
    tokenizer_free(tok);
}

Test(tokenizer, qwen3_special_tokens_and_lookups) {
    struct tokenizer *tok = load(DATA "qwen3/tokenizer.json");
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    EXPECT_IDS(tok, chat, true, 151644, 872, 198, 6023, 151645);
    /* Not allowed: the markers are text: '<', '|', 'im', '_start', '|', '>'. */
    EXPECT_IDS(tok, chat, false, 27, 91, 318, 4906, 91, 29, 872, 198, 6023, 27, 91, 318, 6213, 91, 29);
    /* Non-special added tokens match either way, as in `tokenizers`. */
    EXPECT_IDS(tok, "<think>\n\n</think>", false, 151667, 271, 151668);
    EXPECT_DECODE(tok, false, chat, 151644, 872, 198, 6023, 151645);
    EXPECT_DECODE(tok, true, "user\nhi", 151644, 872, 198, 6023, 151645);

    cr_expect_eq(tokenizer_vocab_size(tok), 151669);
    cr_expect_eq(tokenizer_token_to_id(tok, "<|im_end|>", 10), 151645);
    cr_expect_eq(tokenizer_token_to_id(tok, "\xc4\xa0the", 5), 279); /* "Ġthe" */
    cr_expect_eq(tokenizer_token_to_id(tok, "no such token", 13), -1);
    cr_expect_str_eq(tokenizer_id_to_token(tok, 151644), "<|im_start|>");
    cr_expect_str_eq(tokenizer_id_to_token(tok, 279), "\xc4\xa0the");
    cr_expect_null(tokenizer_id_to_token(tok, 151669));
    cr_expect(tokenizer_is_special(tok, 151645));
    cr_expect(!tokenizer_is_special(tok, 151667) && !tokenizer_is_special(tok, 279));
    const struct tokenizer_specials *s = tokenizer_special_ids(tok);
    cr_expect(s->bos == -1 && s->eos == 151643 && s->pad == -1 && s->unk == -1 && !s->add_bos,
              "bos %d eos %d pad %d unk %d", s->bos, s->eos, s->pad, s->unk);

    /* Invalid UTF-8 and NUL go through NFC and the regex untouched and come back. */
    static const char raw[] = "caf\xc3\xa9 \xff\xfe\x80 ok \xe4\xb8 end\0x \xed\xa0\x80";
    expect_roundtrip(tok, raw, sizeof raw - 1);
    expect_roundtrip(tok, "", 0);

    struct smelt_error err;
    char *text;
    size_t len;
    TEST_EXPECT_ERROR(tokenizer_decode(tok, IDS(872, 151669), false, &text, &len, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "position 1"), "%s", err.message);
    TEST_EXPECT_ERROR(tokenizer_decode(tok, IDS(-1), false, &text, &len, &err), SMELT_EINVAL, &err);
    struct tokenizer_specials chat_ids = *s;
    chat_ids.eos = 151645;
    TEST_OK(tokenizer_set_special_ids(tok, &chat_ids, &err), &err);
    cr_expect_eq(tokenizer_special_ids(tok)->eos, 151645);
    chat_ids.pad = 151669;
    TEST_EXPECT_ERROR(tokenizer_set_special_ids(tok, &chat_ids, &err), SMELT_EINVAL, &err);
    tokenizer_free(tok);
}

Test(tokenizer, gpt2_files_and_raw_bytes) {
    struct tokenizer *tok = load(DATA "gpt2");
    EXPECT_IDS(tok, "Hello world", false, 15496, 995);
    EXPECT_IDS(tok, "<|endoftext|>", true, 50256);
    EXPECT_IDS(tok, "<|endoftext|>", false, 27, 91, 437, 1659, 5239, 91, 29);
    const struct tokenizer_specials *s = tokenizer_special_ids(tok);
    cr_expect(s->bos == 50256 && s->eos == 50256);
    static const char raw[] = "\xff\x00\xc3(\xf0\x9f\x98\x80 \xc0\xaf";
    expect_roundtrip(tok, raw, sizeof raw - 1);
    tokenizer_free(tok);
}

/* One tokenizer, many threads: every result equals the single-threaded one. */
/* tokenizer_encode_batch (the OpenMP pool: 64 texts of ~200 bytes, above its threshold)
 * gives each text's serial ids; a failing text fails the batch naming its index and
 * leaves nothing allocated. */
Test(tokenizer, batch_encode_matches_serial) {
    struct tokenizer *tok = load(DATA "gpt2");
    enum { N = 64 };
    char texts[N][256];
    const char *ptrs[N];
    size_t lens[N];
    int32_t *serial[N], *batch[N];
    size_t n_serial[N], n_batch[N];
    for (int i = 0; i < N; i++) {
        int len = 0;
        for (int k = 0; k < 5; k++)
            len += snprintf(texts[i] + len, sizeof texts[i] - (size_t)len, "text %d: caf\xc3\xa9 %d  \n\t\xff %x ", i,
                            i * 7919 + k, i * 31);
        ptrs[i] = texts[i];
        lens[i] = (size_t)len;
        struct smelt_error err;
        TEST_OK(tokenizer_encode(tok, texts[i], lens[i], false, &serial[i], &n_serial[i], &err), &err);
    }
    struct smelt_error err;
    TEST_OK(tokenizer_encode_batch(tok, ptrs, lens, N, false, batch, n_batch, &err), &err);
    for (int i = 0; i < N; i++) {
        cr_expect(n_batch[i] == n_serial[i] && !memcmp(batch[i], serial[i], n_serial[i] * sizeof(int32_t)),
                  "text %d differs", i);
        free(serial[i]);
        free(batch[i]);
    }
    ptrs[37] = NULL; /* a text without bytes but with a length: refused */
    TEST_EXPECT_ERROR(tokenizer_encode_batch(tok, ptrs, lens, N, false, batch, n_batch, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "text 37 of 64"), "%s", err.message);
    for (int i = 0; i < N; i++) cr_expect(batch[i] == NULL && n_batch[i] == 0, "text %d kept", i);
    TEST_OK(tokenizer_encode_batch(tok, NULL, NULL, 0, false, NULL, NULL, &err), &err);
    tokenizer_free(tok);
}

/* ---- the byte tokenizer ---------------------------------------------------------------- */

static void check_byte_tokenizer(const struct tokenizer *tok) {
    char all[256];
    int32_t want[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i, want[i] = i;
    expect_ids_n(tok, all, 256, false, want, 256);
    expect_roundtrip(tok, all, 256);
    cr_expect_eq(tokenizer_vocab_size(tok), 259);
    EXPECT_IDS(tok, "<|bos|>hi<|eos|><|pad|>", true, 256, 'h', 'i', 257, 258);
    EXPECT_IDS(tok, "<|bos|>", false, '<', '|', 'b', 'o', 's', '|', '>');
    EXPECT_DECODE(tok, true, "hi", 256, 'h', 'i', 257);
    cr_expect_str_eq(tokenizer_id_to_token(tok, ' '), "\xc4\xa0"); /* 'Ġ' */
    const struct tokenizer_specials *s = tokenizer_special_ids(tok);
    cr_expect(s->bos == 256 && s->eos == 257 && s->pad == 258 && s->unk == -1);
}

Test(tokenizer, byte_tokenizer_roundtrip_save_load) {
    struct smelt_error err;
    struct tokenizer *tok, *back;
    TEST_OK(tokenizer_create_bytes(NULL, 0, &tok, &err), &err);
    check_byte_tokenizer(tok);
    char dir[] = "/tmp/smelt-tok-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    TEST_OK(tokenizer_save(tok, path, &err), &err);
    TEST_OK(tokenizer_load(dir, &back, &err), &err);
    check_byte_tokenizer(back);
    tokenizer_free(back);
    tokenizer_free(tok);
    unlink(path);
    rmdir(dir);

    const char *mine[] = {"<|im_start|>", "<|im_end|>"};
    TEST_OK(tokenizer_create_bytes(mine, 2, &tok, &err), &err);
    EXPECT_IDS(tok, "<|im_start|>a<|im_end|>", true, 256, 'a', 257);
    cr_expect_eq(tokenizer_special_ids(tok)->bos, -1);
    tokenizer_free(tok);
    const char *dup[] = {"<x>", "<x>"}, *empty[] = {""}, *bad[] = {"\xff"};
    TEST_EXPECT_ERROR(tokenizer_create_bytes(dup, 2, &tok, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tokenizer_create_bytes(empty, 1, &tok, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tokenizer_create_bytes(bad, 1, &tok, &err), SMELT_EINVAL, &err);
}

/* GPT-2 loaded from its own files and saved as tokenizer.json encodes the same. */
Test(tokenizer, gpt2_saved_as_tokenizer_json) {
    struct smelt_error err;
    struct tokenizer *tok = load(DATA "gpt2"), *back;
    char dir[] = "/tmp/smelt-tok-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    TEST_OK(tokenizer_save(tok, path, &err), &err);
    TEST_OK(tokenizer_load(path, &back, &err), &err);
    EXPECT_IDS(back, "Hello world<|endoftext|>", true, 15496, 995, 50256);
    cr_expect_eq(tokenizer_vocab_size(back), 50257);
    tokenizer_free(back);
    tokenizer_free(tok);
    unlink(path);
    rmdir(dir);
}

/* ---- Metaspace + byte fallback (Llama 2 style): tiny_metaspace.json ------------------ *
 * ids: <unk> 0, <s> 1, </s> 2, <0xNN> 3 + NN, then ▁ 259, h 260, e 261, l 262, o 263,
 * w 264, r 265, d 266, ▁h 267, ll 268, ell 269, ▁hell 270, ▁hello 271, ▁w 272, or 273,
 * ▁wor 274, ld 275, ▁world 276. Merges by rank: ▁+h, l+l, e+ll, ▁h+ell, ▁hell+o, ▁+w,
 * o+r, ▁w+or, l+d, ▁wor+ld. Pre-tokenizer: Metaspace, prepend_scheme "first", no split;
 * decoder: Replace ▁→' ', ByteFallback, Fuse, Strip one leading space. */

#define ME 259 /* ▁ */
#define H 260
#define ELL 269
#define O 263
#define W 264
#define H_ 267      /* ▁h */
#define HELLO 271   /* ▁hello */
#define WORLD 276   /* ▁world */
#define BYTE(b) (3 + (b))

static char *read_text(const char *path) {
    struct smelt_error err;
    char *text;
    size_t len;
    TEST_OK(file_read_all(path, &text, &len, &err), &err);
    return text;
}

/* tiny_metaspace.json with one section replaced (value is JSON text, "null" allowed). */
static struct tokenizer *metaspace_variant(const char *const *keys, const char *const *values, int n) {
    char *text = read_text(DATA "tiny_metaspace.json");
    json_t *root = json_loads(text, 0, NULL);
    cr_assert(root);
    for (int i = 0; i < n; i++) {
        json_t *target = root;
        char key[64];
        snprintf(key, sizeof key, "%s", keys[i]);
        char *dot = strchr(key, '.');
        if (dot) { /* "model.byte_fallback" */
            *dot = '\0';
            target = json_object_get(root, key);
            memmove(key, dot + 1, strlen(dot + 1) + 1);
        }
        json_t *v = json_loads(values[i], JSON_DECODE_ANY, NULL);
        cr_assert(v, "bad JSON for %s", keys[i]);
        json_object_set_new(target, key, v);
    }
    char *dumped = json_dumps(root, 0);
    struct tokenizer *tok = load_json(dumped);
    free(dumped);
    json_decref(root);
    free(text);
    return tok;
}

Test(tokenizer, metaspace_byte_fallback) {
    struct tokenizer *tok = load(DATA "tiny_metaspace.json");
    /* "▁hello▁world": the merges build ▁hello, then ▁world; no merge joins o+▁. */
    EXPECT_IDS(tok, "hello world", false, HELLO, WORLD);
    /* '\n' is not in the vocabulary: its byte token <0x0A>. */
    EXPECT_IDS(tok, "hello\n", false, HELLO, BYTE(0x0A));
    /* é is two bytes C3 A9. */
    EXPECT_IDS(tok, "h\xc3\xa9", false, H_, BYTE(0xC3), BYTE(0xA9));
    /* Invalid UTF-8: each bad byte is its byte token. */
    EXPECT_IDS(tok, "h\xff\xc3", false, H_, BYTE(0xFF), BYTE(0xC3));
    /* A leading space already is the ▁: nothing is prepended. */
    EXPECT_IDS(tok, " hello", false, HELLO);
    EXPECT_IDS(tok, "hello  world", false, HELLO, ME, WORLD);
    EXPECT_IDS(tok, "hw", false, H_, W);
    /* After <s> the text no longer starts the input: no ▁ ("first"); h, ell, o. */
    EXPECT_IDS(tok, "<s>hello", true, 1, H, ELL, O);
    /* As text: ▁ < s > by bytes, then h ell o. */
    EXPECT_IDS(tok, "<s>hello", false, ME, BYTE('<'), BYTE('s'), BYTE('>'), H, ELL, O);
    EXPECT_IDS(tok, "hello <s> world", true, HELLO, ME, 1, WORLD);
    EXPECT_IDS(tok, "hello</s>", true, HELLO, 2);
    int32_t *ids;
    size_t n;
    struct smelt_error err;
    TEST_OK(tokenizer_encode(tok, "", 0, true, &ids, &n, &err), &err);
    cr_expect(n == 0 && ids == NULL);

    EXPECT_DECODE(tok, false, "hello world", HELLO, WORLD);
    EXPECT_DECODE(tok, false, "hello\n", HELLO, BYTE(0x0A));
    EXPECT_DECODE(tok, false, "h\xc3\xa9", H_, BYTE(0xC3), BYTE(0xA9));
    EXPECT_DECODE(tok, false, "hello <s> world", HELLO, ME, 1, WORLD);
    EXPECT_DECODE(tok, true, "hello  world", HELLO, ME, 1, WORLD);
    static const char raw[] = "a\xff\x01 b\xe2\x82";
    expect_roundtrip(tok, raw, sizeof raw - 1);

    const struct tokenizer_specials *s = tokenizer_special_ids(tok);
    cr_expect(s->bos == 1 && s->add_bos && s->eos == 2 && s->unk == 0 && s->pad == -1);
    cr_expect_eq(tokenizer_vocab_size(tok), 277);
    tokenizer_free(tok);
}

/* The older Llama 2 files: Prepend("▁") + Replace(" ", "▁") normalizer, no
 * pre-tokenizer. The normalizer runs on each piece between added tokens, so text after
 * <s> gets its ▁ too, and a leading space gives ▁▁. */
Test(tokenizer, metaspace_legacy_normalizer) {
    const char *keys[] = {"normalizer", "pre_tokenizer"};
    const char *values[] = {"{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
                            "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]}",
                            "null"};
    struct tokenizer *tok = metaspace_variant(keys, values, 2);
    EXPECT_IDS(tok, "hello world", false, HELLO, WORLD);
    EXPECT_IDS(tok, "<s>hello", true, 1, HELLO);
    EXPECT_IDS(tok, " hello", false, ME, HELLO);
    EXPECT_IDS(tok, "hello <s> world", true, HELLO, ME, 1, ME, WORLD);
    tokenizer_free(tok);
}

Test(tokenizer, metaspace_unk_without_byte_fallback) {
    const char *keys[] = {"model.byte_fallback", "model.fuse_unk"};
    const char *fused[] = {"false", "true"}, *unfused[] = {"false", "false"};
    struct tokenizer *tok = metaspace_variant(keys, fused, 2);
    EXPECT_IDS(tok, "h\xc3\xa9\xe2\x82\xac", false, H_, 0);             /* hé€: é€ fuse */
    EXPECT_IDS(tok, "h\xe2\x82\xac \xc3\xa9", false, H_, 0, ME, 0);    /* h€ é */
    EXPECT_IDS(tok, "h\xff", false, H_, 0);
    tokenizer_free(tok);
    tok = metaspace_variant(keys, unfused, 2);
    EXPECT_IDS(tok, "h\xc3\xa9\xe2\x82\xac", false, H_, 0, 0);
    tokenizer_free(tok);

    /* Neither byte_fallback nor unk_token: encoding an unknown character fails. */
    const char *keys3[] = {"model.byte_fallback", "model.unk_token", "added_tokens"};
    const char *none[] = {"false", "null", "[]"};
    tok = metaspace_variant(keys3, none, 3);
    struct smelt_error err;
    int32_t *ids;
    size_t n;
    TEST_EXPECT_ERROR(tokenizer_encode(tok, "h\xc3\xa9", 3, false, &ids, &n, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "U+00E9"), "%s", err.message);
    TEST_EXPECT_ERROR(tokenizer_encode(tok, "h\xff", 2, false, &ids, &n, &err), SMELT_EINVAL, &err);
    tokenizer_free(tok);
}

Test(tokenizer, metaspace_options_and_decoder) {
    const char *keys[] = {"pre_tokenizer", "decoder"};
    const char *values[] = {"{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"always\",\"split\":true}",
                            "{\"type\":\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":false}"};
    struct tokenizer *tok = metaspace_variant(keys, values, 2);
    /* split: pieces ▁hello, ▁, ▁world (merged with next); always: ▁ after <s> too. */
    EXPECT_IDS(tok, "hello  world", false, HELLO, ME, WORLD);
    EXPECT_IDS(tok, "<s>hello", true, 1, HELLO);
    /* The Metaspace decoder drops every ▁ of the first token and turns the rest into spaces. */
    EXPECT_DECODE(tok, false, "hello world", HELLO, WORLD);
    EXPECT_DECODE(tok, false, "  hello world", ME, ME, HELLO, WORLD);
    EXPECT_DECODE(tok, false, "h hello", H, HELLO);
    tokenizer_free(tok);
}

/* ---- components on a tiny vocabulary ----------------------------------------------------- *
 * ignore_merges and no merges: a piece that is a vocabulary entry becomes that one id,
 * any other piece its characters, so the ids show where the pieces end. */

static const char *const tiny_vocab =
    "{\"a\":0,\"b\":1,\"c\":2,\"1\":3,\"2\":4,\"3\":5,\" \":6,\"-\":7,\"ab\":8,\"123\":9,\" ab\":10,"
    "\"ab-\":11,\"-ab\":12,\"--\":13,\"e\":14,\"\xc3\xa9\":15,\"\xcc\x81\":16,\"f\":17,\"i\":18,"
    "\"fi\":19,\"<\":20,\"x\":21,\">\":22,\"?\":23,\"\xef\xac\x81\":24}";
/* 25 <x> special; 26 cc single_word; 27 bb lstrip+rstrip; 28 ﬂ normalized (matches "fl"
 * once normalized by NFKC). */
static const char *const tiny_added =
    "[{\"id\":25,\"content\":\"<x>\",\"special\":true,\"normalized\":false},"
    "{\"id\":26,\"content\":\"cc\",\"single_word\":true,\"normalized\":false},"
    "{\"id\":27,\"content\":\"bb\",\"lstrip\":true,\"rstrip\":true,\"normalized\":false},"
    "{\"id\":28,\"content\":\"\xef\xac\x82\",\"normalized\":true}]";

static struct tokenizer *tiny(const char *normalizer, const char *pre_tokenizer) {
    char json[4096];
    snprintf(json, sizeof json,
             "{\"added_tokens\":%s,\"normalizer\":%s,\"pre_tokenizer\":%s,\"decoder\":null,"
             "\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"ignore_merges\":true,"
             "\"vocab\":%s,\"merges\":[]}}",
             tiny_added, normalizer, pre_tokenizer, tiny_vocab);
    return load_json(json);
}

static struct tokenizer *tiny_split(const char *pattern, const char *behavior, bool invert) {
    char pre[256];
    snprintf(pre, sizeof pre, "{\"type\":\"Split\",\"pattern\":%s,\"behavior\":\"%s\",\"invert\":%s}",
             pattern, behavior, invert ? "true" : "false");
    return tiny("null", pre);
}

Test(tokenizer, split_behaviors) {
    const char *dash = "{\"String\":\"-\"}";
    struct tokenizer *t;
    t = tiny_split(dash, "Removed", false);
    EXPECT_IDS(t, "ab-ab-ab", false, 8, 8, 8);
    EXPECT_IDS(t, "-ab-", false, 8);
    tokenizer_free(t);
    t = tiny_split(dash, "Isolated", false);
    EXPECT_IDS(t, "ab-ab-ab", false, 8, 7, 8, 7, 8);
    EXPECT_IDS(t, "ab--ab", false, 8, 7, 7, 8);
    tokenizer_free(t);
    t = tiny_split(dash, "MergedWithPrevious", false);
    EXPECT_IDS(t, "ab-ab-ab", false, 11, 11, 8); /* ab- ab- ab */
    EXPECT_IDS(t, "ab--ab", false, 11, 7, 8);    /* only the first '-' joins its left */
    EXPECT_IDS(t, "-ab-", false, 7, 11);
    tokenizer_free(t);
    t = tiny_split(dash, "MergedWithNext", false);
    EXPECT_IDS(t, "ab-ab-ab", false, 8, 12, 12); /* ab -ab -ab */
    EXPECT_IDS(t, "ab--ab", false, 8, 7, 12);
    EXPECT_IDS(t, "-ab-", false, 12, 7);
    tokenizer_free(t);
    t = tiny_split(dash, "Contiguous", false);
    EXPECT_IDS(t, "ab--ab", false, 8, 13, 8); /* ab -- ab */
    tokenizer_free(t);
    /* invert: the matches of [ab]+ are the pieces and the rest is the delimiter. */
    t = tiny_split("{\"Regex\":\"[ab]+\"}", "Removed", true);
    EXPECT_IDS(t, "ab-ab", false, 8, 8);
    tokenizer_free(t);
    t = tiny_split("{\"Regex\":\"[ab]+\"}", "MergedWithPrevious", true);
    EXPECT_IDS(t, "-ab-ab", false, 7, 11, 8);
    tokenizer_free(t);
    /* \p{L} and \s under UCP: é is a letter, U+3000 a space. */
    t = tiny_split("{\"Regex\":\"\\\\p{L}+|\\\\s+\"}", "Removed", false);
    EXPECT_IDS(t, "\xc3\xa9" "1\xe3\x80\x80" "2", false, 3, 4);
    tokenizer_free(t);
}

Test(tokenizer, digits_and_sequence) {
    struct tokenizer *t = tiny("null", "{\"type\":\"Digits\",\"individual_digits\":true}");
    EXPECT_IDS(t, "ab123", false, 8, 3, 4, 5);
    tokenizer_free(t);
    t = tiny("null", "{\"type\":\"Digits\",\"individual_digits\":false}");
    EXPECT_IDS(t, "ab123", false, 8, 9);
    tokenizer_free(t);
    t = tiny("null", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\"},"
                     "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\"}]}");
    EXPECT_IDS(t, "ab-123", false, 8, 7, 9);
    tokenizer_free(t);
}

Test(tokenizer, byte_level_prefix_space) {
    struct tokenizer *bytes;
    struct smelt_error err;
    TEST_OK(tokenizer_create_bytes(NULL, 0, &bytes, &err), &err);
    char dir[] = "/tmp/smelt-tok-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    TEST_OK(tokenizer_save(bytes, path, &err), &err);
    tokenizer_free(bytes);
    char *text = read_text(path);
    json_t *root = json_loads(text, 0, NULL);
    json_object_set_new(json_object_get(root, "pre_tokenizer"), "add_prefix_space", json_true());
    char *dumped = json_dumps(root, 0);
    struct tokenizer *t = load_json(dumped);
    EXPECT_IDS(t, "hi", false, ' ', 'h', 'i');
    EXPECT_IDS(t, " hi", false, ' ', 'h', 'i');
    EXPECT_IDS(t, "<|bos|>hi", true, 256, ' ', 'h', 'i'); /* each piece gets its space */
    tokenizer_free(t);
    free(dumped);
    json_decref(root);
    free(text);
    unlink(path);
    rmdir(dir);
}

Test(tokenizer, normalizers) {
    struct tokenizer *t;
    t = tiny("{\"type\":\"NFC\"}", "null");
    EXPECT_IDS(t, "e\xcc\x81", false, 15); /* e + combining acute → é */
    tokenizer_free(t);
    t = tiny("{\"type\":\"NFD\"}", "null");
    EXPECT_IDS(t, "\xc3\xa9", false, 14, 16);
    tokenizer_free(t);
    t = tiny("{\"type\":\"NFKC\"}", "null");
    EXPECT_IDS(t, "\xef\xac\x81", false, 19); /* ﬁ → fi */
    tokenizer_free(t);
    t = tiny("{\"type\":\"NFKD\"}", "null");
    EXPECT_IDS(t, "f\xef\xac\x81", false, 17, 17, 18);
    tokenizer_free(t);
    t = tiny("null", "null");
    EXPECT_IDS(t, "\xef\xac\x81", false, 24);
    tokenizer_free(t);
    t = tiny("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\d+\"},\"content\":\"123\"}", "null");
    EXPECT_IDS(t, "a7b", false, 0, 3, 4, 5, 1);
    tokenizer_free(t);
    t = tiny("{\"type\":\"Replace\",\"pattern\":{\"String\":\"-\"},\"content\":\" \"}", "null");
    EXPECT_IDS(t, "ab-ab", false, 0, 1, 6, 0, 1);
    tokenizer_free(t);
    t = tiny("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
             "\"content\":\"-\"},{\"type\":\"Prepend\",\"prepend\":\"-\"}]}", "null");
    EXPECT_IDS(t, "ab", false, 12);          /* -ab */
    EXPECT_IDS(t, " ab", false, 7, 7, 0, 1); /* --ab */
    tokenizer_free(t);
}

Test(tokenizer, added_token_flags) {
    struct tokenizer *t = tiny("null", "null");
    EXPECT_IDS(t, "a<x>b", true, 0, 25, 1);
    EXPECT_IDS(t, "a<x>b", false, 0, 20, 21, 22, 1);
    EXPECT_IDS(t, "a cc b", false, 0, 6, 26, 6, 1); /* single_word: spaces around */
    EXPECT_IDS(t, "acc", false, 0, 2, 2);           /* a letter before: not a word */
    EXPECT_IDS(t, "cc_", false, 2, 2, 23);          /* '_' after counts as a word char */
    EXPECT_IDS(t, "a  bb  c", false, 0, 27, 2);     /* lstrip/rstrip swallow the spaces */
    EXPECT_IDS(t, "a\xef\xac\x82", false, 0, 28);   /* ﬂ itself */
    EXPECT_IDS(t, "afl", false, 0, 17, 23);         /* no normalizer: "fl" is just text */
    EXPECT_IDS(t, "a\xc3\xa9z", false, 0, 15, 23);  /* z is unknown: unk */
    EXPECT_DECODE(t, false, "a b <x> ab", 0, 1, 25, 8); /* no decoder: joined by spaces */
    EXPECT_DECODE(t, true, "a ab", 0, 25, 8);
    tokenizer_free(t);
    t = tiny("{\"type\":\"NFKC\"}", "null");
    EXPECT_IDS(t, "afl", false, 0, 28); /* normalized=true: matched as NFKC("ﬂ") = "fl" */
    tokenizer_free(t);
}

/* continuing_subword_prefix "##" and end_of_word_suffix "</w>": a piece's characters
 * after the first carry ##, its last one </w>; a merge of a and ##b makes "ab". */
Test(tokenizer, subword_prefix_and_suffix) {
    struct tokenizer *t = load_json(
        "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\"},"
        "\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",\"end_of_word_suffix\":\"</w>\","
        "\"unk_token\":\"?\",\"vocab\":{\"?\":0,\"a\":1,\"##b\":2,\"##c</w>\":3,\"ab\":4,\"abc</w>\":5,"
        "\"a</w>\":6,\"##b</w>\":7,\"b\":8},\"merges\":[[\"a\",\"##b\"],[\"ab\",\"##c</w>\"]]}}");
    EXPECT_IDS(t, "abc a", false, 5, 6); /* a ##b ##c</w> → ab ##c</w> → abc</w>; a</w> */
    EXPECT_IDS(t, "ab", false, 1, 7);    /* a ##b</w>: no merge for that pair */
    EXPECT_IDS(t, "abb", false, 4, 7);   /* a ##b ##b</w> → ab ##b</w> */
    EXPECT_IDS(t, "b", false, 0);        /* b</w> is not in the vocabulary: unk */
    tokenizer_free(t);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void expect_load_error(const char *json, int code, const char *needle) {
    struct smelt_error err;
    struct tokenizer *tok = NULL;
    TEST_EXPECT_ERROR(tokenizer_load_json(json, strlen(json), "bad.json", &tok, &err), code, &err);
    cr_expect_null(tok);
    cr_expect(strstr(err.message, "bad.json") && strstr(err.message, needle),
              "message \"%s\" should name bad.json and '%s'", err.message, needle);
}

static char *tiny_with(const char *model_extra, const char *vocab, const char *merges,
                       const char *section, const char *value) {
    static char json[4096];
    snprintf(json, sizeof json,
             "{\"%s\":%s,\"model\":{\"type\":\"BPE\"%s,\"vocab\":%s,\"merges\":%s}}", section,
             value, model_extra, vocab, merges);
    return json;
}

Test(tokenizer, malformed_json_and_unknown_types) {
    const char *v = "{\"a\":0,\"b\":1,\"ab\":2}";
    expect_load_error("{\"model\": {", SMELT_EFORMAT, "bad.json");
    expect_load_error("[1, 2]", SMELT_EINVAL, "bad.json");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", SMELT_EUNSUPPORTED, "WordPiece");
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", SMELT_EUNSUPPORTED, "Unigram");
    expect_load_error(tiny_with("", v, "[]", "normalizer", "{\"type\":\"Lowercase\"}"), SMELT_EUNSUPPORTED, "Lowercase");
    expect_load_error(tiny_with("", v, "[]", "normalizer",
                                "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Strip\"}]}"),
                      SMELT_EUNSUPPORTED, "normalizers[1]");
    expect_load_error(tiny_with("", v, "[]", "pre_tokenizer", "{\"type\":\"Whitespace\"}"), SMELT_EUNSUPPORTED, "Whitespace");
    expect_load_error(tiny_with("", v, "[]", "decoder", "{\"type\":\"WordPiece\"}"), SMELT_EUNSUPPORTED, "WordPiece");
    expect_load_error(tiny_with("", v, "[]", "post_processor", "{\"type\":\"Magic\"}"), SMELT_EUNSUPPORTED, "Magic");
    expect_load_error(tiny_with("", v, "[]", "pre_tokenizer",
                                "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}"),
                      SMELT_EFORMAT, "regex");
    expect_load_error(tiny_with("", v, "[]", "pre_tokenizer",
                                "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Sideways\"}"),
                      SMELT_EFORMAT, "Sideways");
    expect_load_error(tiny_with("", v, "[]", "pre_tokenizer", "{\"type\":\"ByteLevel\",\"colour\":1}"),
                      SMELT_EINVAL, "colour");
    expect_load_error(tiny_with(",\"dropout\":0.1", v, "[]", "normalizer", "null"), SMELT_EUNSUPPORTED, "dropout");
}

Test(tokenizer, malformed_vocab_merges_and_added) {
    const char *v = "{\"a\":0,\"b\":1,\"ab\":2}";
    expect_load_error(tiny_with("", v, "[\"a z\"]", "normalizer", "null"), SMELT_EFORMAT, "'z'");
    expect_load_error(tiny_with("", v, "[[\"b\",\"a\"]]", "normalizer", "null"), SMELT_EFORMAT, "'ba'");
    expect_load_error(tiny_with("", v, "[\"a b c\"]", "normalizer", "null"), SMELT_EFORMAT, "merges[0]");
    expect_load_error(tiny_with("", v, "[\"a b\", 7]", "normalizer", "null"), SMELT_EFORMAT, "merges[1]");
    expect_load_error(tiny_with("", "{\"a\":0,\"b\":0}", "[]", "normalizer", "null"), SMELT_EFORMAT, "id 0");
    expect_load_error(tiny_with("", "{\"a\":-1}", "[]", "normalizer", "null"), SMELT_EFORMAT, "vocab");
    expect_load_error(tiny_with("", "{\"a\":99999999}", "[]", "normalizer", "null"), SMELT_EFORMAT, "vocab");
    expect_load_error(tiny_with("", v, "[]", "added_tokens", "[{\"id\":7,\"content\":\"<x>\"}]"),
                      SMELT_EFORMAT, "<x>");
    expect_load_error(tiny_with("", v, "[]", "added_tokens", "[{\"id\":3,\"content\":\"\"}]"),
                      SMELT_EFORMAT, "empty");

    /* A vocabulary with a hole: id 1 has no token. */
    struct tokenizer *tok = load_json(tiny_with("", "{\"a\":0,\"b\":2}", "[]", "normalizer", "null"));
    struct smelt_error err;
    char *text;
    size_t len;
    TEST_EXPECT_ERROR(tokenizer_decode(tok, IDS(0, 1), false, &text, &len, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "position 1"), "%s", err.message);
    EXPECT_DECODE(tok, false, "a b", 0, 2);
    tokenizer_free(tok);
}

static void write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void expect_file_error(const char *path, int code) {
    struct smelt_error err;
    struct tokenizer *tok = NULL;
    TEST_EXPECT_ERROR(tokenizer_load(path, &tok, &err), code, &err);
    cr_expect_null(tok);
    cr_expect(strstr(err.message, path), "message \"%s\" should name %s", err.message, path);
}

Test(tokenizer, malformed_files_name_the_file) {
    char dir[] = "/tmp/smelt-tok-XXXXXX", json[64], enc[64], bpe[64];
    cr_assert(mkdtemp(dir));
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(bpe, sizeof bpe, "%s/vocab.bpe", dir);

    expect_file_error(dir, SMELT_ENOTFOUND); /* empty folder */
    expect_file_error(json, SMELT_ENOTFOUND);

    char *good = read_text(DATA "tiny_metaspace.json");
    write_file(json, good, strlen(good) / 2); /* truncated */
    expect_file_error(json, SMELT_EFORMAT);
    expect_file_error(dir, SMELT_EFORMAT);
    free(good);
    const char *wordpiece = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}";
    write_file(json, wordpiece, strlen(wordpiece));
    expect_file_error(json, SMELT_EUNSUPPORTED);
    unlink(json);

    const char *vocab = "{\"a\":0,\"b\":1,\"ab\":2}";
    write_file(enc, vocab, strlen(vocab));
    write_file(bpe, "#version: 0.2\na b\nb\n", 20);
    expect_file_error(dir, SMELT_EFORMAT); /* vocab.bpe line 3 */
    write_file(bpe, "#version: 0.2\na q\n", 18);
    expect_file_error(dir, SMELT_EFORMAT); /* q unknown */
    write_file(bpe, "#version: 0.2\na b\n", 18);
    struct tokenizer *tok = load(dir);
    EXPECT_IDS(tok, "abba", false, 2, 1, 0);
    tokenizer_free(tok);
    unlink(enc);
    unlink(bpe);
    rmdir(dir);
}

Test(tokenizer, bad_arguments) {
    struct tokenizer *tok = load(DATA "tiny_metaspace.json");
    struct smelt_error err;
    int32_t *ids;
    size_t n;
    char *text;
    size_t len;
    TEST_EXPECT_ERROR(tokenizer_encode(tok, NULL, 3, false, &ids, &n, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tokenizer_encode(NULL, "a", 1, false, &ids, &n, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tokenizer_decode(tok, NULL, 2, false, &text, &len, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(tokenizer_load(NULL, &tok, &err), SMELT_EINVAL, &err);
    tokenizer_free(tok);
    tokenizer_free(NULL);
}
