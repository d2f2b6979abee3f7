/* Chat templates and tokenizer_config.json (tokenizer/chat_template*.c): any bytes as a
 * tokenizer_config.json read for its template and its bos/eos tokens, and as a Jinja
 * chat_template to recognise. A config that is accepted renders a short conversation. */
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *jinja = fuzz_string(data, size);
    enum chat_template_kind kind;
    struct smelt_error err = {0};
    chat_template_detect(jinja, &kind, &err);
    free(jinja);
    const char *path = fuzz_file(data, size, "tokenizer_config.json");
    struct chat_template t;
    if (chat_template_from_tokenizer_config(path, NULL, &t, NULL, &err) != 0) return 0;
    const struct chat_message msgs[] = {{"system", "Be brief."}, {"user", "1+2="}, {"assistant", "3"},
                                        {"user", "2+2="}};
    char *text = NULL;
    size_t len = 0;
    if (chat_render(&t, msgs, 4, true, &text, &len, &err) == 0) free(text);
    return 0;
}
