/* tokenizer/ chat templates against the real Jinja templates: every case of
 * tests/data/chat_templates/expected.json (conversations rendered by jinja2 as
 * transformers renders them, tests/parity/make_chat_fixtures.py) rendered by chat_render
 * byte for byte, or refused where the Jinja raises; the assistant mask's runs equal the
 * spans the fixture found in the Jinja's text; and chat_template_detect names each
 * .jinja file's format. */
#include "tests/unit/testutil.h"

#include "common/common.h"
#include "tokenizer/tokenizer.h"

#define CT_DIR "tests/data/chat_templates"
#define MAX_MESSAGES 16

static json_t *load_expected(void) {
    struct smelt_error err = {0};
    json_t *root = NULL;
    TEST_OK(json_load_path(CT_DIR "/expected.json", &root, &err), &err);
    return root;
}

static const char *str_or_null(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The smelt template of a fixture format: its name, and bos/eos as the model's
 * tokenizer_config.json gives them (null: none). */
static struct chat_template template_of(const json_t *format) {
    struct smelt_error err = {0};
    enum chat_template_kind kind;
    TEST_OK(chat_template_from_name(str_or_null(format, "template"), &kind, &err), &err);
    struct chat_template t;
    chat_template_init(&t, kind);
    const char *bos = str_or_null(format, "bos_token"), *eos = str_or_null(format, "eos_token");
    snprintf(t.bos, sizeof t.bos, "%s", bos ? bos : "");
    snprintf(t.eos, sizeof t.eos, "%s", eos ? eos : "");
    return t;
}

static size_t messages_of(const json_t *c, struct chat_message *m) {
    const json_t *list = json_object_get(c, "messages");
    size_t n = json_array_size(list);
    cr_assert(n > 0 && n <= MAX_MESSAGES, "a case has %zu messages", n);
    for (size_t i = 0; i < n; i++) {
        m[i].role = str_or_null(json_array_get(list, i), "role");
        m[i].content = str_or_null(json_array_get(list, i), "content");
    }
    return n;
}

/* Every control token of every format, as specials of a byte tokenizer: decoding its ids
 * gives the text back, so each mask run can be read as text. */
static struct tokenizer *all_controls_tokenizer(void) {
    static const char *const specials[] = {
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
        "<|im_end|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<s>", "<|endoftext|>",
        "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"};
    struct smelt_error err = {0};
    struct tokenizer *tok = NULL;
    TEST_OK(tokenizer_create_bytes(specials, sizeof specials / sizeof specials[0], &tok, &err), &err);
    return tok;
}

static char *decode(const struct tokenizer *tok, const int32_t *ids, size_t n) {
    struct smelt_error err = {0};
    char *text = NULL;
    size_t len = 0;
    TEST_OK(tokenizer_decode(tok, ids, n, false, &text, &len, &err), &err);
    return text;
}

/* The ids decode to the rendered text, and the runs of mask 1 to the expected spans. */
static void expect_mask(const struct chat_template *t, const struct tokenizer *tok, const struct chat_message *m,
                        size_t n, bool gen, const char *text, const json_t *spans, size_t index) {
    struct smelt_error err = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n_ids = 0;
    TEST_OK(chat_tokenize(t, tok, m, n, gen, &ids, &mask, &n_ids, &err), &err);
    char *all = decode(tok, ids, n_ids);
    cr_expect_str_eq(all, text, "case %zu: the ids decode to another text", index);
    free(all);
    size_t span = 0;
    for (size_t i = 0; i < n_ids;) {
        if (!mask[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n_ids && mask[j]) j++;
        char *got = decode(tok, ids + i, j - i);
        const char *want = json_string_value(json_array_get(spans, span));
        cr_expect(want && !strcmp(got, want), "case %zu: mask run %zu is [%s], expected [%s]", index, span, got,
                  want ? want : "(no more runs)");
        free(got);
        span++;
        i = j;
    }
    cr_expect_eq(span, json_array_size(spans), "case %zu: %zu mask runs, expected %zu", index, span,
                 json_array_size(spans));
    free(ids);
    free(mask);
}

static void check_case(const json_t *formats, const json_t *c, size_t index, const struct tokenizer *tok) {
    struct chat_template t = template_of(json_object_get(formats, str_or_null(c, "format")));
    struct chat_message m[MAX_MESSAGES];
    size_t n = messages_of(c, m);
    bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
    const char *want = str_or_null(c, "text");
    struct smelt_error err = {0};
    char *text = NULL;
    size_t len = 0;
    int rc = chat_render(&t, m, n, gen, &text, &len, &err);
    if (!want) {
        cr_expect_eq(rc, SMELT_EINVAL, "case %zu (%s): the Jinja raises (%s) but smelt rendered [%s]", index,
                     str_or_null(c, "format"), str_or_null(c, "error"), text ? text : "");
        free(text);
        return;
    }
    cr_assert_eq(rc, SMELT_OK, "case %zu (%s): %s", index, str_or_null(c, "format"), err.message);
    cr_expect(len == strlen(want) && !memcmp(text, want, len), "case %zu (%s) rendered\n[%s]\nthe Jinja\n[%s]",
              index, str_or_null(c, "format"), text, want);
    free(text);
    expect_mask(&t, tok, m, n, gen, want, json_object_get(c, "spans"), index);
}

Test(chat_template_parity, renders_what_the_jinja_renders) {
    json_t *root = load_expected();
    const json_t *formats = json_object_get(root, "formats"), *cases = json_object_get(root, "cases");
    struct tokenizer *tok = all_controls_tokenizer();
    cr_assert_gt(json_array_size(cases), 300, "the fixture holds %zu cases", json_array_size(cases));
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) check_case(formats, c, i, tok);
    tokenizer_free(tok);
    json_decref(root);
}

/* Each .jinja file is recognised as the format its cases render with (qwen3.jinja is
 * qwen3: qwen3-nothink is chosen by name). */
Test(chat_template_parity, detects_each_jinja_file) {
    json_t *root = load_expected();
    const char *name;
    json_t *format;
    size_t n = 0;
    json_object_foreach(json_object_get(root, "formats"), name, format) {
        struct smelt_error err = {0};
        char path[256], *jinja = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, CT_DIR "/%s", str_or_null(format, "jinja"));
        TEST_OK(file_read_all(path, &jinja, &len, &err), &err);
        enum chat_template_kind kind;
        TEST_OK(chat_template_detect(jinja, &kind, &err), &err);
        cr_expect_str_eq(chat_template_name(kind), str_or_null(format, "detect"), "%s (%s)", path, name);
        free(jinja);
        n++;
    }
    cr_expect_eq(n, 7);
    json_decref(root);
}
