/* tokenizer.json (tokenizer/tokenizer_load.c): any bytes as a Hugging Face tokenizer
 * file. One that loads then encodes a fixed text and the input itself, and decodes what
 * it encoded. */
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static void encode_decode(const struct tokenizer *tok, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    struct smelt_error err = {0};
    if (tokenizer_encode(tok, text, len, true, &ids, &n, &err) == 0) {
        char *back = NULL;
        size_t back_len = 0;
        if (tokenizer_decode(tok, ids, n, false, &back, &back_len, &err) == 0) free(back);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tokenizer *tok = NULL;
    struct smelt_error err = {0};
    if (tokenizer_load_json((const char *)data, size, "tokenizer.json", &tok, &err) != 0) return 0;
    static const char text[] = "Hello, world! caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 12345 <s>\n\t";
    encode_decode(tok, text, sizeof text - 1);
    encode_decode(tok, (const char *)data, size < 4096 ? size : 4096);
    tokenizer_free(tok);
    return 0;
}
