/* Encoding arbitrary bytes (tokenizer/): the Qwen3 tokenizer of tests/data (byte-level
 * BPE, NFC normalizer, added tokens) and GPT-2's; the first byte picks the tokenizer and
 * whether special tokens match. Every text encodes, and byte-level ids decode back to
 * the same bytes when the text is valid UTF-8 in NFC (checked for GPT-2, which has no
 * normalizer). The harness runs from the repository root. */
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static struct tokenizer *load(const char *path) {
    struct tokenizer *tok = NULL;
    struct smelt_error err = {0};
    if (tokenizer_load(path, &tok, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s (run from the repository root)\n", err.message);
        abort();
    }
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct tokenizer *qwen3, *gpt2;
    if (!qwen3) qwen3 = load("tests/data/tokenizers/qwen3/tokenizer.json");
    if (!gpt2) gpt2 = load("tests/data/tokenizers/gpt2");
    if (size < 1) return 0;
    bool use_gpt2 = data[0] & 1, allow_special = data[0] & 2;
    const struct tokenizer *tok = use_gpt2 ? gpt2 : qwen3;
    int32_t *ids = NULL;
    size_t n = 0;
    struct smelt_error err = {0};
    if (tokenizer_encode(tok, (const char *)data + 1, size - 1, allow_special, &ids, &n, &err) != 0) {
        fprintf(stderr, "encoding failed: %s\n", err.message);
        abort(); /* any bytes encode with a byte-level tokenizer */
    }
    char *back = NULL;
    size_t back_len = 0;
    if (tokenizer_decode(tok, ids, n, false, &back, &back_len, &err) != 0) abort();
    if (use_gpt2 && !allow_special && (back_len != size - 1 || memcmp(back, data + 1, size - 1) != 0)) {
        fprintf(stderr, "GPT-2 did not decode back to its input\n");
        abort();
    }
    free(back);
    free(ids);
    return 0;
}
