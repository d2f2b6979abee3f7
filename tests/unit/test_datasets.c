/* datasets/: every row error with its line and field, the report's counts, ids and
 * masks against the tokenizer's encoding of the pieces, truncation policies, the split,
 * and the loader: each epoch's units exactly once, packing limits, targets, shuffling,
 * batches_in_epoch and exact resumption from a cursor. Byte tokenizer and the plain
 * template, plus Qwen3's real tokenizer and template once. */
#include "tests/unit/datasets_testutil.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "tokenizer/tokenizer.h"

#define BOS 256
#define EOS 257

/* ds_setup, and the byte tokenizer's bos and eos are BOS and EOS. */
static void setup(void) {
    ds_setup();
    cr_assert_eq(tokenizer_special_ids(ds_tok)->bos, BOS);
    cr_assert_eq(tokenizer_special_ids(ds_tok)->eos, EOS);
}

/* ds_load, and the report counts every example. */
static struct dataset *load_ok(const char *path, enum dataset_kind kind, const struct dataset_format *f) {
    struct dataset_report report;
    struct dataset *ds = ds_load(path, kind, f, &report);
    cr_expect_eq(report.n_examples, ds->n);
    return ds;
}

struct ids {
    int32_t *v;
    size_t n;
};

static struct ids enc(const char *text) {
    struct smelt_error err = {0};
    struct ids r = {0};
    TEST_OK(tokenizer_encode(ds_tok, text, strlen(text), false, &r.v, &r.n, &err), &err);
    return r;
}

/* ids = concatenation of the given pieces: a piece is text, or a single id when text
 * is NULL. */
struct piece {
    const char *text;
    int32_t id;
    bool trained;
};

static void expect_example(const struct dataset_example *ex, const struct piece *pieces, size_t n_pieces) {
    int32_t want[512];
    uint8_t mask[512];
    size_t n = 0;
    for (size_t p = 0; p < n_pieces; p++) {
        if (!pieces[p].text) {
            mask[n] = pieces[p].trained;
            want[n++] = pieces[p].id;
            continue;
        }
        struct ids e = enc(pieces[p].text);
        for (size_t i = 0; i < e.n; i++) mask[n] = pieces[p].trained, want[n++] = e.v[i];
        free(e.v);
    }
    cr_assert_eq((size_t)ex->n, n, "example has %d ids, expected %zu", ex->n, n);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(ex->ids[i], want[i], "id %zu is %d, expected %d", i, ex->ids[i], want[i]);
        cr_expect_eq(ex->mask[i], i == 0 ? 0 : mask[i], "mask %zu is %d, expected %d", i, ex->mask[i], mask[i]);
    }
    size_t first = 1;
    while (first < n && !mask[first]) first++;
    cr_expect_eq((size_t)ex->n_prompt, first, "n_prompt %d, expected %zu", ex->n_prompt, first);
}

/* Loading fails with SMELT_EFORMAT and err exactly "<path>:<want>". */
static void expect_load_error(const char *path, enum dataset_kind kind, const struct dataset_format *f,
                              const char *want, struct dataset_report *report) {
    struct smelt_error err = {0};
    struct dataset *ds = (struct dataset *)1;
    TEST_EXPECT_ERROR(dataset_load(path, kind, f, &ds, report, &err), SMELT_EFORMAT, &err);
    cr_expect_null(ds);
    char full[600];
    snprintf(full, sizeof full, "%s%s", path, want);
    cr_expect_str_eq(err.message, full);
}

/* ---- names ---- */

Test(datasets, names_round_trip) {
    struct smelt_error err = {0};
    for (int k = DATASET_AUTO; k <= DATASET_PROMPTS; k++) {
        enum dataset_kind got;
        TEST_OK(dataset_kind_from_name(dataset_kind_name((enum dataset_kind)k), &got, &err), &err);
        cr_expect_eq((int)got, k);
    }
    enum dataset_truncation t;
    TEST_OK(dataset_truncation_from_name("truncate", &t, &err), &err);
    cr_expect_eq(t, DATASET_TRUNCATE_RIGHT);
    cr_expect_str_eq(dataset_truncation_name(DATASET_TRUNCATE_DROP), "drop");
    enum dataset_loss_on l;
    TEST_OK(dataset_loss_on_from_name("all", &l, &err), &err);
    cr_expect_eq(l, DATASET_LOSS_ALL);
    cr_expect_str_eq(dataset_loss_on_name(DATASET_LOSS_COMPLETION), "completion");
    TEST_EXPECT_ERROR(dataset_truncation_from_name("cut", &t, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.message, "truncation: unknown value \"cut\" (expected one of error, drop, truncate)");
    enum dataset_kind k;
    TEST_EXPECT_ERROR(dataset_kind_from_name("dpo", &k, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(dataset_kind_name((enum dataset_kind)42), "unknown");
}

/* ---- tokens and masks ---- */

Test(datasets, sft_messages_ids_and_mask, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("chat.jsonl",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
        "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}, "
        "{\"role\": \"user\", \"content\": \"again\"}, {\"role\": \"assistant\", \"content\": \"ok\"}]}\n");
    struct dataset_format f = ds_format(256);
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_assert_eq(ds->kind, DATASET_SFT);
    cr_assert_eq(ds->n, 1);
    cr_expect_eq(ds->examples[0].line, 1);
    /* "<|bos|>System: Be brief.\nUser: hi\nAssistant: hello<|eos|>\nUser: again\nAssistant: ok<|eos|>\n" */
    const struct piece want[] = {
        {NULL, BOS, false}, {"System: Be brief.\nUser: hi\nAssistant:", 0, false}, {" hello", 0, true},
        {NULL, EOS, true}, {"\nUser: again\nAssistant:", 0, false}, {" ok", 0, true},
        {NULL, EOS, true}, {"\n", 0, false},
    };
    expect_example(&ds->examples[0], want, sizeof want / sizeof want[0]);

    /* The same ids and mask as chat_tokenize gives. */
    struct chat_message m[] = {{"system", "Be brief."}, {"user", "hi"}, {"assistant", "hello"},
                               {"user", "again"}, {"assistant", "ok"}};
    struct smelt_error err = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    TEST_OK(chat_tokenize(&ds_chat, ds_tok, m, 5, false, &ids, &mask, &n, &err), &err);
    cr_assert_eq((size_t)ds->examples[0].n, n);
    cr_expect(!memcmp(ids, ds->examples[0].ids, n * sizeof *ids));
    cr_expect(!memcmp(mask, ds->examples[0].mask, n));
    free(ids);
    free(mask);
    int64_t trained = 6 + 1 + 3 + 1; /* " hello" eos " ok" eos */
    cr_expect_eq(ds->report.n_tokens, (int64_t)n);
    cr_expect_eq(ds->report.n_trained_tokens, trained);
    dataset_free(ds);
}

Test(datasets, prompt_completion_ids_and_mask, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("pc.jsonl", "{\"prompt\": \"2+2=\", \"completion\": \" 4\"}\n"
                                              "{\"prompt\": \"\", \"completion\": \"<|eos|>x\"}\n");
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_assert_eq(ds->kind, DATASET_SFT);
    cr_assert_eq(ds->n, 2);
    const struct piece want0[] = {{NULL, BOS, false}, {"2+2=", 0, false}, {" 4", 0, true}, {NULL, EOS, true}};
    expect_example(&ds->examples[0], want0, 4);
    cr_expect_eq(ds->examples[0].n_prompt, 5);
    /* Special-token text in data stays text. */
    const struct piece want1[] = {{NULL, BOS, false}, {"<|eos|>x", 0, true}, {NULL, EOS, true}};
    expect_example(&ds->examples[1], want1, 3);
    cr_expect_eq(ds->examples[1].line, 2);
    dataset_free(ds);

    f.add_bos = false;
    ds = load_ok(path, DATASET_SFT, &f);
    const struct piece nobos[] = {{"2+2=", 0, false}, {" 4", 0, true}, {NULL, EOS, true}};
    expect_example(&ds->examples[0], nobos, 3);
    /* No bos and an empty prompt: the first completion token cannot be a target. */
    cr_expect_eq(ds->examples[1].ids[0], '<');
    cr_expect_eq(ds->examples[1].mask[0], 0);
    cr_expect_eq(ds->examples[1].n_prompt, 1);
    dataset_free(ds);
}

Test(datasets, conversational_prompt_completion_trains_the_completion_only, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("conv.jsonl",
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hey\"}, "
        "{\"role\": \"user\", \"content\": \"bye\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"ciao\"}]}\n");
    struct dataset_format f = ds_format(128);
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_assert_eq(ds->kind, DATASET_SFT);
    const struct piece want[] = {{NULL, BOS, false}, {"User: hi\nAssistant: hey", 0, false}, {NULL, EOS, false},
                                 {"\nUser: bye\nAssistant:", 0, false}, {" ciao", 0, true}, {NULL, EOS, true},
                                 {"\n", 0, false}};
    expect_example(&ds->examples[0], want, 7);
    dataset_free(ds);
}

Test(datasets, loss_on_all_trains_every_token_but_the_first, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("pc.jsonl",
        "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n");
    struct dataset_format f = ds_format(64);
    f.loss_on = DATASET_LOSS_ALL;
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    cr_assert_eq(ds->n, 2);
    for (int e = 0; e < 2; e++) {
        const struct dataset_example *ex = &ds->examples[e];
        cr_expect_eq(ex->mask[0], 0);
        for (int32_t i = 1; i < ex->n; i++) cr_expect_eq(ex->mask[i], 1, "example %d mask %d", e, i);
    }
    cr_expect_eq(ds->examples[0].n_prompt, 3); /* still where the completion starts */
    cr_expect_eq(ds->report.n_trained_tokens, ds->report.n_tokens - 2);
    dataset_free(ds);
}

Test(datasets, qwen3_template_masks_the_answer) {
    struct smelt_error err = {0};
    struct tokenizer *qwen = NULL;
    TEST_OK(tokenizer_load("tests/data/tokenizers/qwen3", &qwen, &err), &err);
    struct chat_template t;
    TEST_OK(chat_template_from_tokenizer_config("tests/data/tokenizers/qwen3", NULL, &t, qwen, &err), &err);
    test_tmp_setup();
    const char *path = ds_write_file("qwen.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, "
        "{\"role\": \"assistant\", \"content\": \"It is 4.\"}]}\n");
    struct dataset_format f = {.tok = qwen, .chat = &t, .max_seq_len = 512};
    struct dataset *ds = NULL;
    TEST_OK(dataset_load(path, DATASET_AUTO, &f, &ds, NULL, &err), &err);
    const struct dataset_example *ex = &ds->examples[0];
    int32_t first = ex->n_prompt, end = first;
    while (end < ex->n && ex->mask[end]) end++;
    for (int32_t i = end; i < ex->n; i++) cr_expect_eq(ex->mask[i], 0);
    char *text = NULL, *prompt = NULL;
    size_t len = 0;
    TEST_OK(tokenizer_decode(qwen, ex->ids + first, (size_t)(end - first), false, &text, &len, &err), &err);
    cr_expect(strstr(text, "It is 4.") != NULL, "trained span [%s]", text);
    cr_expect(len >= strlen("<|im_end|>") && !strcmp(text + len - strlen("<|im_end|>"), "<|im_end|>"),
              "trained span [%s] ends with <|im_end|>", text);
    TEST_OK(tokenizer_decode(qwen, ex->ids, (size_t)first, false, &prompt, &len, &err), &err);
    cr_expect(strstr(prompt, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n") == prompt,
              "prompt [%s]", prompt);
    free(text);
    free(prompt);
    dataset_free(ds);
    tokenizer_free(qwen);
    test_tmp_teardown();
}

/* ---- errors ---- */

Test(datasets, every_row_error_names_line_and_field, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("bad.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n" /* 1 ok */
        "   \n"                                                                                                  /* 2 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \" \\n\"}]}\n" /* 3 */
        "{\"messages\": [\n"                                                                                     /* 4 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n"                                           /* 5 */
        "{\"messages\": [{\"role\": \"bot\", \"content\": \"q\"}]}\n"                                            /* 6 */
        "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n"                                               /* 7 */
        "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"foo\": 1}\n"                        /* 8 */
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"                                          /* 9 */
        "[1, 2]\n"                                                                                               /* 10 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"name\": \"x\"}]}\n"                        /* 11 */
        "{\"prompt\": \"p\", \"completion\": \"\"}\n"                                                           /* 12 */
        "{\"completion\": \"x\"}\n"                                                                              /* 13 */
        "{\"messages\": \"hi\"}\n"                                                                               /* 14 */
        "{\"messages\": []}\n"                                                                                   /* 15 */
        "{\"prompt\": \"p\", \"completion\": \"caf\xC3\"}\n"                                                    /* 16 */
        "{\"messages\": [{\"content\": \"q\"}]}\n"                                                               /* 17 */
        "\n"                                                                                                     /* 18 */
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"completion\": \"a\"}\n"                    /* 19 */
        "{}\n");                                                                                                 /* 20 */
    struct dataset_report report;
    struct dataset_format f = ds_format(256);
    expect_load_error(path, DATASET_AUTO, &f, ":3: messages[1].content: empty assistant turn", &report);
    struct smelt_error err = {0};
    struct dataset_report vreport;
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_AUTO, &vreport, &err), SMELT_EFORMAT, &err);
    for (int pass = 0; pass < 2; pass++) {
        const struct dataset_report *r = pass ? &vreport : &report;
        cr_expect_eq(r->kind, DATASET_SFT);
        cr_expect_eq(r->n_lines, 20);
        cr_expect_eq(r->n_skipped_blank, 2);
        cr_expect_eq(r->n_examples, 1);
        cr_expect_eq(r->n_issues, 17);
        int i = 0;
        ds_expect_issue(r, i++, 3, "messages[1].content", "empty assistant turn");
        cr_expect_eq(r->issues[i].line, 4);
        cr_expect_str_eq(r->issues[i].field, "");
        cr_expect(!strncmp(r->issues[i].message, "invalid JSON: ", 14) && strstr(r->issues[i].message, "(column "),
                  "line 4: %s", r->issues[i].message);
        i++;
        ds_expect_issue(r, i++, 5, "messages", "no assistant turn (nothing to train)");
        ds_expect_issue(r, i++, 6, "messages[0].role",
                     "expected \"system\", \"developer\", \"user\" or \"assistant\", got \"bot\"");
        ds_expect_issue(r, i++, 7, "messages[0].content", "expected a string, got number");
        ds_expect_issue(r, i++, 8, "", "unknown field \"foo\"");
        ds_expect_issue(r, i++, 9, "", "a preference row in a sft file (line 1 decided the kind; kinds cannot mix)");
        ds_expect_issue(r, i++, 10, "", "expected a JSON object, got array");
        ds_expect_issue(r, i++, 11, "messages[0]", "unknown field \"name\"");
        ds_expect_issue(r, i++, 12, "completion", "empty completion");
        ds_expect_issue(r, i++, 13, "prompt", "missing field");
        ds_expect_issue(r, i++, 14, "messages", "expected a list of messages, got string");
        ds_expect_issue(r, i++, 15, "messages", "empty list of messages");
        cr_expect_eq(r->issues[i].line, 16);
        cr_expect_str_eq(r->issues[i].message,
                         "invalid JSON (not UTF-8): unable to decode byte 0xc3 near '\"caf' (column 34)");
        i++;
        ds_expect_issue(r, i++, 17, "messages[0].role", "missing field");
        ds_expect_issue(r, i++, 19, "completion", "expected a list of messages like prompt, got string");
        ds_expect_issue(r, i++, 20, "", "no \"messages\" or \"prompt\" field: not an sft, preference or prompts row");
    }
    char want[600];
    snprintf(want, sizeof want, "%s:3: messages[1].content: empty assistant turn", path);
    cr_expect_str_eq(err.message, want);
}

Test(datasets, invalid_json_message_has_the_column, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("json.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": 1,,}\n");
    struct dataset_format f = ds_format(64);
    struct dataset_report r;
    struct smelt_error err = {0};
    struct dataset *ds = NULL;
    TEST_EXPECT_ERROR(dataset_load(path, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EFORMAT, &err);
    char want[600];
    snprintf(want, sizeof want, "%s:2: invalid JSON: string or '}' expected near ',' (column 14)", path);
    cr_expect_str_eq(err.message, want);
}

Test(datasets, preference_and_prompts_field_errors, .init = setup, .fini = ds_teardown) {
    const char *pref = ds_write_file("pref.jsonl",
        "{\"prompt\": 5, \"chosen\": \"a\", \"rejected\": \"b\"}\n"
        "{\"prompt\": \"p\", \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"rejected\": \"b\"}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\"}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"user\", \"content\": \"a\"}], \"rejected\": []}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"\\t\"}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"score\": 1}\n"
        "{\"prompt\": \"p\", \"chosen\": \"same\", \"rejected\": \"same\"}\n");
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_validate_file(pref, DATASET_PREFERENCE, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.n_issues, 7);
    ds_expect_issue(&r, 0, 1, "prompt", "expected a string or a list of messages, got number");
    ds_expect_issue(&r, 1, 2, "chosen", "expected a string like prompt, got array");
    ds_expect_issue(&r, 2, 3, "rejected", "missing field");
    ds_expect_issue(&r, 3, 4, "chosen[0].role", "a response holds assistant turns only, got \"user\"");
    ds_expect_issue(&r, 4, 5, "rejected", "empty response");
    ds_expect_issue(&r, 5, 6, "", "unknown field \"score\"");
    ds_expect_issue(&r, 6, 7, "rejected", "identical to chosen (a preference pair must differ)");
    char want[600];
    snprintf(want, sizeof want, "%s:1: prompt: expected a string or a list of messages, got number", pref);
    cr_expect_str_eq(err.message, want);

    const char *prompts = ds_write_file("prompts.jsonl",
        "{\"prompt\": \"q\", \"answer\": 4}\n"
        "{\"prompt\": \"q\", \"metadata\": [1]}\n"
        "{\"prompt\": \" \"}\n"
        "{\"prompt\": \"q\", \"answer\": null, \"metadata\": {\"a\": 1}}\n");
    TEST_EXPECT_ERROR(dataset_validate_file(prompts, DATASET_AUTO, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.kind, DATASET_PROMPTS);
    cr_expect_eq(r.n_issues, 3);
    cr_expect_eq(r.n_examples, 1);
    ds_expect_issue(&r, 0, 1, "answer", "expected a string, got number");
    ds_expect_issue(&r, 1, 2, "metadata", "expected an object, got array");
    ds_expect_issue(&r, 2, 3, "prompt", "empty prompt");
}

Test(datasets, kind_requested_or_decided_by_first_valid_row, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("mixed.jsonl",
        "{not json}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
        "{\"prompt\": \"p\", \"completion\": \"c\"}\n"
        "{\"prompt\": \"p\"}\n");
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_AUTO, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.kind, DATASET_PREFERENCE);
    cr_expect_eq(r.n_issues, 3);
    ds_expect_issue(&r, 1, 3, "", "a sft row in a preference file (line 2 decided the kind; kinds cannot mix)");
    ds_expect_issue(&r, 2, 4, "chosen", "missing field"); /* a bare prompt is checked as the file's kind */

    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_SFT, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.kind, DATASET_SFT);
    ds_expect_issue(&r, 1, 2, "", "a preference row, but the dataset was requested as sft");
    ds_expect_issue(&r, 2, 4, "completion", "missing field");
    cr_expect_eq(r.n_examples, 1);

    const char *ok = ds_write_file("prompts.jsonl", "{\"prompt\": \"p\"}\n");
    TEST_OK(dataset_validate_file(ok, DATASET_AUTO, &r, &err), &err);
    cr_expect_eq(r.kind, DATASET_PROMPTS);
    cr_expect_eq(r.n_tokens, 0);
}

Test(datasets, empty_missing_and_blank_files, .init = setup, .fini = ds_teardown) {
    struct dataset_format f = ds_format(64);
    struct dataset_report r;
    const char *empty = ds_write_file("empty.jsonl", "");
    expect_load_error(empty, DATASET_AUTO, &f, ": no rows: the file is empty or holds only blank lines", &r);
    cr_expect_eq(r.n_issues, 1);
    cr_expect_eq(r.issues[0].line, 0);
    const char *blank = ds_write_file("blank.jsonl", "\n  \r\n\t\n");
    expect_load_error(blank, DATASET_AUTO, &f, ": no rows: the file is empty or holds only blank lines", &r);
    cr_expect_eq(r.n_lines, 3);
    cr_expect_eq(r.n_skipped_blank, 3);
    struct smelt_error err = {0};
    struct dataset *ds = NULL;
    char missing[256];
    test_tmp_path(missing, sizeof missing, "nope.jsonl");
    TEST_EXPECT_ERROR(dataset_load(missing, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EIO, &err);
    TEST_EXPECT_ERROR(dataset_validate_file(missing, DATASET_AUTO, &r, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "nope.jsonl") != NULL);
    f.max_seq_len = 1;
    TEST_EXPECT_ERROR(dataset_load(blank, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EINVAL, &err);
    f = ds_format(64);
    f.tok = NULL;
    TEST_EXPECT_ERROR(dataset_load(blank, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EINVAL, &err);
}

Test(datasets, messages_without_a_chat_template, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n");
    struct dataset_format f = ds_format(64);
    f.chat = NULL;
    struct dataset_report r;
    expect_load_error(path, DATASET_AUTO, &f,
                      ":1: messages: a list of messages needs a chat template, and none was given or found "
                      "with the tokenizer", &r);
}

Test(datasets, issue_list_keeps_the_first_twenty_and_counts_all, .init = setup, .fini = ds_teardown) {
    char text[4096] = "";
    for (int i = 0; i < 30; i++) strcat(text, i % 2 ? "{\"prompt\": \"p\", \"completion\": 3}\n" : "\n");
    const char *path = ds_write_file("many.jsonl", text);
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_SFT, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.n_issues, 15);
    cr_expect_eq(r.n_skipped_blank, 15);
    for (int i = 0; i < 15; i++) ds_expect_issue(&r, i, 2 * i + 2, "completion", "expected a string like prompt, got number");
    text[0] = '\0';
    for (int i = 0; i < 25; i++) strcat(text, "{\"prompt\": \"p\", \"completion\": 3}\n");
    path = ds_write_file("more.jsonl", text);
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_SFT, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.n_issues, 25);
    ds_expect_issue(&r, DATASET_MAX_ISSUES - 1, DATASET_MAX_ISSUES, "completion", "expected a string like prompt, got number");
}

Test(datasets, long_lines_and_a_byte_order_mark, .init = setup, .fini = ds_teardown) {
    size_t n = 200000;
    char *text = malloc(n + 256);
    cr_assert(text);
    int k = sprintf(text, "\xEF\xBB\xBF{\"prompt\": \"p\", \"completion\": \"");
    memset(text + k, 'x', n);
    strcpy(text + k + n, "\"}\r\n");
    const char *path = ds_write_file("long.jsonl", text);
    free(text);
    struct dataset_format f = ds_format(300000);
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_expect_eq(ds->examples[0].n, (int32_t)(1 + 1 + n + 1));
    dataset_free(ds);
}

/* ---- max_seq_len ---- */

Test(datasets, truncation_policies, .init = setup, .fini = ds_teardown) {
    /* Lengths: bos + prompt + completion + eos. */
    const char *path = ds_write_file("len.jsonl",
        "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n"          /* 6 */
        "{\"prompt\": \"abcdef\", \"completion\": \"ghij\"}\n"    /* 12 */
        "{\"prompt\": \"abcdefghijk\", \"completion\": \"l\"}\n"  /* 14: cut at 10 keeps no completion */
        "{\"prompt\": \"a\", \"completion\": \"bc\"}\n");         /* 5 */
    struct dataset_format f = ds_format(10);
    struct dataset_report r;
    expect_load_error(path, DATASET_AUTO, &f, ":2: sequence of 12 tokens exceeds max_seq_len 10", &r);
    cr_expect_eq(r.n_issues, 2);
    ds_expect_issue(&r, 1, 3, "", "sequence of 14 tokens exceeds max_seq_len 10");

    f.truncation = DATASET_TRUNCATE_DROP;
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_expect_eq(ds->n, 2);
    cr_expect_eq(ds->report.n_dropped, 2);
    cr_expect_eq(ds->report.n_truncated, 0);
    cr_expect_eq(ds->report.n_examples, 2);
    cr_expect_eq(ds->examples[1].line, 4);
    cr_expect_eq(ds->report.n_tokens, 11);
    cr_expect_eq(ds->report.n_trained_tokens, 3 + 3);
    dataset_free(ds);

    f.truncation = DATASET_TRUNCATE_RIGHT;
    ds = load_ok(path, DATASET_AUTO, &f);
    cr_expect_eq(ds->n, 3);
    cr_expect_eq(ds->report.n_truncated, 1);
    cr_expect_eq(ds->report.n_dropped, 1);
    const struct dataset_example *cut = &ds->examples[1];
    cr_expect_eq(cut->line, 2);
    const struct piece want[] = {{NULL, BOS, false}, {"abcdef", 0, false}, {"ghi", 0, true}};
    expect_example(cut, want, 3);
    cr_expect_eq(ds->report.n_tokens, 6 + 10 + 5);
    dataset_free(ds);

    f.truncation = DATASET_TRUNCATE_DROP;
    f.max_seq_len = 4;
    expect_load_error(path, DATASET_AUTO, &f,
                      ": no examples left: all 4 rows were dropped as longer than max_seq_len 4", &r);
    cr_expect_eq(r.n_dropped, 4);
}

/* ---- preference and prompts ---- */

Test(datasets, preference_pairs, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("pref.jsonl",
        "{\"prompt\": \"Q\", \"chosen\": \"yes\", \"rejected\": \"no\"}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hey\"}, "
        "{\"role\": \"user\", \"content\": \"bye\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"ciao\"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"no\"}]}\n");
    struct dataset_format f = ds_format(128);
    f.loss_on = DATASET_LOSS_ALL; /* preference masks are the responses whatever loss_on says */
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_assert_eq(ds->kind, DATASET_PREFERENCE);
    cr_assert_eq(ds->n, 2);
    const struct piece c0[] = {{NULL, BOS, false}, {"Q", 0, false}, {"yes", 0, true}, {NULL, EOS, true}};
    const struct piece r0[] = {{NULL, BOS, false}, {"Q", 0, false}, {"no", 0, true}, {NULL, EOS, true}};
    expect_example(&ds->examples[0], c0, 4);
    expect_example(&ds->examples[1], r0, 4);
    const struct piece c1[] = {{NULL, BOS, false}, {"User: hi\nAssistant: hey", 0, false}, {NULL, EOS, false},
                               {"\nUser: bye\nAssistant:", 0, false}, {" ciao", 0, true}, {NULL, EOS, true},
                               {"\n", 0, false}};
    const struct piece r1[] = {{NULL, BOS, false}, {"User: hi\nAssistant: hey", 0, false}, {NULL, EOS, false},
                               {"\nUser: bye\nAssistant:", 0, false}, {" no", 0, true}, {NULL, EOS, true},
                               {"\n", 0, false}};
    expect_example(&ds->examples[2], c1, 7);
    expect_example(&ds->examples[3], r1, 7);
    cr_expect_eq(ds->examples[2].line, 2);
    cr_expect_eq(ds->examples[3].line, 2);
    cr_expect_eq(ds->report.n_examples, 2);
    cr_expect_eq(ds->report.n_trained_tokens, 4 + 3 + 6 + 4);
    dataset_free(ds);

    /* A pair too long on one side only: dropped whole. */
    const char *longer = ds_write_file("pref2.jsonl",
        "{\"prompt\": \"Q\", \"chosen\": \"yes\", \"rejected\": \"a much longer rejection\"}\n"
        "{\"prompt\": \"Q\", \"chosen\": \"y\", \"rejected\": \"n\"}\n");
    f = ds_format(8);
    f.truncation = DATASET_TRUNCATE_DROP;
    ds = load_ok(longer, DATASET_PREFERENCE, &f);
    cr_expect_eq(ds->n, 1);
    cr_expect_eq(ds->report.n_dropped, 1);
    cr_expect_eq(ds->examples[0].line, 2);
    cr_expect_eq(ds->examples[1].line, 2);
    dataset_free(ds);
    f.truncation = DATASET_TRUNCATE_ERROR;
    struct dataset_report r;
    expect_load_error(longer, DATASET_PREFERENCE, &f, ":1: rejected: sequence of 26 tokens exceeds max_seq_len 8", &r);
}

/* Issue 14's bad preference input: an empty response on either side, in text or as
 * message lists, and a pair whose sides are the same — each named by line and field,
 * both when an upload validates the file and when a job loads it. */
Test(datasets, preference_empty_or_identical_responses_name_line_and_field, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("pref_bad.jsonl",
        "{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \" \\n\"}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \" \"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
        "\"rejected\": []}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"x\"}], "
        "\"rejected\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n"
        "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n");
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_PREFERENCE, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.kind, DATASET_PREFERENCE);
    cr_expect_eq(r.n_issues, 5);
    cr_expect_eq(r.n_examples, 1);
    ds_expect_issue(&r, 0, 1, "chosen", "empty response");
    ds_expect_issue(&r, 1, 2, "rejected", "empty response");
    ds_expect_issue(&r, 2, 3, "chosen[0].content", "empty assistant turn");
    ds_expect_issue(&r, 3, 4, "rejected", "empty list of messages");
    ds_expect_issue(&r, 4, 5, "rejected", "identical to chosen (a preference pair must differ)");

    struct dataset_format f = ds_format(64);
    expect_load_error(path, DATASET_AUTO, &f, ":1: chosen: empty response", &r);
    cr_expect_eq(r.n_issues, 5);
    ds_expect_issue(&r, 4, 5, "rejected", "identical to chosen (a preference pair must differ)");
}

/* A pair over max_seq_len under each policy. Lengths (bos + prompt + response + eos):
 * line 1 chosen 6, rejected 12; line 2 both 12 with a 10-token prompt; line 3 both 4. */
Test(datasets, preference_pairs_over_max_seq_len_under_each_policy, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("pref_len.jsonl",
        "{\"prompt\": \"ab\", \"chosen\": \"cd\", \"rejected\": \"efghijkl\"}\n"
        "{\"prompt\": \"abcdefghi\", \"chosen\": \"x\", \"rejected\": \"y\"}\n"
        "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n");
    struct dataset_format f = ds_format(8);
    struct dataset_report r;

    /* error: the file is refused; each issue names its line and the side over the limit
     * (the first side found: chosen is checked before rejected). */
    expect_load_error(path, DATASET_PREFERENCE, &f, ":1: rejected: sequence of 12 tokens exceeds max_seq_len 8", &r);
    cr_expect_eq(r.n_issues, 2);
    ds_expect_issue(&r, 1, 2, "chosen", "sequence of 12 tokens exceeds max_seq_len 8");

    /* drop: both pairs with a long side go, whole; the report counts them. */
    f.truncation = DATASET_TRUNCATE_DROP;
    struct dataset *ds = load_ok(path, DATASET_PREFERENCE, &f);
    cr_expect_eq(ds->n, 1);
    cr_expect_eq(ds->report.n_dropped, 2);
    cr_expect_eq(ds->report.n_truncated, 0);
    cr_expect_eq(ds->examples[0].line, 3);
    cr_expect_eq(ds->examples[1].line, 3);
    dataset_free(ds);

    /* truncate: line 1's rejected side is cut to 8 tokens (its chosen side is whole);
     * line 2's prompt alone fills 8 tokens, which leaves nothing to train, so that pair
     * is dropped whole. */
    f.truncation = DATASET_TRUNCATE_RIGHT;
    ds = load_ok(path, DATASET_PREFERENCE, &f);
    cr_assert_eq(ds->n, 2);
    cr_expect_eq(ds->report.n_truncated, 1);
    cr_expect_eq(ds->report.n_dropped, 1);
    const struct piece chosen[] = {{NULL, BOS, false}, {"ab", 0, false}, {"cd", 0, true}, {NULL, EOS, true}};
    const struct piece cut[] = {{NULL, BOS, false}, {"ab", 0, false}, {"efghi", 0, true}};
    expect_example(&ds->examples[0], chosen, 4);
    expect_example(&ds->examples[1], cut, 3);
    cr_expect_eq(ds->examples[1].line, 1);
    cr_expect_eq(ds->examples[2].line, 3);
    cr_expect_eq(ds->examples[3].line, 3);
    cr_expect_eq(ds->report.n_tokens, 6 + 8 + 4 + 4);
    cr_expect_eq(ds->report.n_trained_tokens, 3 + 5 + 2 + 2);
    dataset_free(ds);

    /* When the policy leaves no pair, the load fails saying why and with which limit. */
    f.max_seq_len = 2;
    expect_load_error(path, DATASET_PREFERENCE, &f,
                      ": no examples left: all 3 rows were dropped as longer than max_seq_len 2", &r);
    cr_expect_eq(r.n_dropped, 3);
    f.truncation = DATASET_TRUNCATE_DROP;
    f.max_seq_len = 3;
    expect_load_error(path, DATASET_PREFERENCE, &f,
                      ": no examples left: all 3 rows were dropped as longer than max_seq_len 3", &r);
}

Test(datasets, prompts_with_answer_and_metadata, .init = setup, .fini = ds_teardown) {
    const char *path = ds_write_file("prompts.jsonl",
        "{\"prompt\": \"2+2=\", \"answer\": \"4\", \"metadata\": {\"level\": 1, \"tags\": [\"add\"]}}\n"
        "\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_AUTO, &f);
    cr_assert_eq(ds->kind, DATASET_PROMPTS);
    cr_assert_eq(ds->n, 2);
    cr_expect_null(ds->examples);
    const struct dataset_prompt *p = &ds->prompts[0];
    cr_assert_eq(p->n, 5);
    cr_expect_eq(p->ids[0], BOS);
    cr_expect(!memcmp(&p->ids[1], (int32_t[]){'2', '+', '2', '='}, 4 * sizeof(int32_t)));
    cr_expect_str_eq(p->answer, "4");
    cr_expect_str_eq(p->metadata_json, "{\"level\":1,\"tags\":[\"add\"]}");
    cr_expect_eq(p->line, 1);
    p = &ds->prompts[1];
    cr_expect_eq(p->line, 3);
    cr_expect_null(p->answer);
    cr_expect_null(p->metadata_json);
    /* The chat template with the generation prompt. */
    struct chat_message m = {"user", "hi"};
    struct smelt_error err = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    TEST_OK(chat_tokenize(&ds_chat, ds_tok, &m, 1, true, &ids, &mask, &n, &err), &err);
    cr_assert_eq((size_t)p->n, n);
    cr_expect(!memcmp(p->ids, ids, n * sizeof *ids));
    free(ids);
    free(mask);
    cr_expect_eq(ds->report.n_tokens, 5 + (int64_t)n);
    cr_expect_eq(ds->report.n_trained_tokens, 0);
    dataset_free(ds);

    /* Prompts are never cut. */
    f.max_seq_len = 4;
    f.truncation = DATASET_TRUNCATE_RIGHT;
    struct dataset_report r;
    expect_load_error(path, DATASET_PROMPTS, &f,
                      ":1: prompt: prompt of 5 tokens exceeds max_seq_len 4 (prompts are never cut: use "
                      "truncation \"drop\" to skip them)", &r);
    f.max_seq_len = 5;
    f.truncation = DATASET_TRUNCATE_DROP;
    ds = load_ok(path, DATASET_PROMPTS, &f);
    cr_expect_eq(ds->n, 1);
    cr_expect_eq(ds->report.n_dropped, 1);
    cr_expect_str_eq(ds->prompts[0].answer, "4");
    dataset_free(ds);
}

/* ---- split ---- */

/* n rows "{prompt: "<i>", completion: ...}" of varying length. */
static const char *write_rows(const char *name, int n, bool preference) {
    size_t cap = (size_t)n * 128 + 1;
    char *text = malloc(cap);
    cr_assert(text);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        char prompt[32], completion[32];
        snprintf(prompt, sizeof prompt, "%d:%.*s", i, i % 7, "pppppppp");
        snprintf(completion, sizeof completion, "%.*s", 1 + i % 5, "cccccc");
        if (preference)
            len += (size_t)snprintf(text + len, cap - len,
                                    "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"r%s\"}\n", prompt,
                                    completion, completion);
        else
            len += (size_t)snprintf(text + len, cap - len, "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", prompt,
                                    completion);
    }
    const char *path = ds_write_file(name, text);
    free(text);
    return path;
}

static void lines_of(const struct dataset *ds, int64_t *lines) {
    int seqs = ds->kind == DATASET_PREFERENCE ? 2 : 1;
    for (int64_t i = 0; i < ds->n; i++) lines[i] = ds->examples[i * seqs].line;
}

Test(datasets, split_is_seeded_and_sized, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 40, false);
    struct dataset_format f = ds_format(64);
    struct smelt_error err = {0};
    int64_t lines_a[40], lines_b[40], val_a[40], val_b[40];
    int64_t tokens = 0;
    for (int run = 0; run < 2; run++) {
        struct dataset *ds = load_ok(path, DATASET_SFT, &f), *val = NULL;
        if (!run) tokens = ds->report.n_tokens;
        TEST_OK(dataset_split(ds, 0.1, 7, &val, &err), &err);
        cr_assert_eq(val->n, 4);
        cr_assert_eq(ds->n, 36);
        cr_expect_eq(val->kind, DATASET_SFT);
        cr_expect_eq(ds->report.n_tokens + val->report.n_tokens, tokens);
        cr_expect_eq(val->report.n_examples, 4);
        lines_of(ds, run ? lines_b : lines_a);
        lines_of(val, run ? val_b : val_a);
        /* Both keep file order; together they hold every line once. */
        bool seen[41] = {0};
        for (int64_t i = 0; i < ds->n; i++) seen[ds->examples[i].line] = true;
        for (int64_t i = 0; i < val->n; i++) {
            cr_expect(!seen[val->examples[i].line]);
            seen[val->examples[i].line] = true;
            if (i) cr_expect_gt(val->examples[i].line, val->examples[i - 1].line);
        }
        for (int l = 1; l <= 40; l++) cr_expect(seen[l], "line %d missing", l);
        dataset_free(ds);
        dataset_free(val);
    }
    cr_expect(!memcmp(lines_a, lines_b, sizeof(int64_t) * 36));
    cr_expect(!memcmp(val_a, val_b, sizeof(int64_t) * 4));

    /* Another seed picks other rows; tiny fractions still give one row, large ones leave one. */
    struct dataset *ds = load_ok(path, DATASET_SFT, &f), *val = NULL;
    TEST_OK(dataset_split(ds, 0.1, 8, &val, &err), &err);
    int64_t other[4];
    lines_of(val, other);
    cr_expect(memcmp(other, val_a, sizeof other), "seeds 7 and 8 chose the same rows");
    dataset_free(val);
    TEST_OK(dataset_split(ds, 0.001, 1, &val, &err), &err);
    cr_expect_eq(val->n, 1);
    cr_expect_eq(ds->n, 35);
    dataset_free(val);
    TEST_OK(dataset_split(ds, 0.999, 1, &val, &err), &err);
    cr_expect_eq(val->n, 34);
    cr_expect_eq(ds->n, 1);
    dataset_free(val);
    TEST_EXPECT_ERROR(dataset_split(ds, 0.5, 1, &val, &err), SMELT_EINVAL, &err);
    cr_expect_null(val);
    dataset_free(ds);
    ds = load_ok(path, DATASET_SFT, &f);
    TEST_EXPECT_ERROR(dataset_split(ds, 0.0, 1, &val, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(dataset_split(ds, 1.0, 1, &val, &err), SMELT_EINVAL, &err);
    dataset_free(ds);
}

Test(datasets, split_moves_pairs_and_prompts_together, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("pairs.jsonl", 10, true);
    struct dataset_format f = ds_format(64);
    struct smelt_error err = {0};
    struct dataset *ds = load_ok(path, DATASET_PREFERENCE, &f), *val = NULL;
    TEST_OK(dataset_split(ds, 0.3, 3, &val, &err), &err);
    cr_assert_eq(val->n, 3);
    cr_assert_eq(ds->n, 7);
    for (int pass = 0; pass < 2; pass++) {
        const struct dataset *d = pass ? val : ds;
        for (int64_t i = 0; i < d->n; i++) {
            const struct dataset_example *c = &d->examples[2 * i], *r = &d->examples[2 * i + 1];
            cr_expect_eq(c->line, r->line);
            cr_expect_eq(r->ids[r->n_prompt], 'r', "rejected of line %lld starts with r", (long long)r->line);
            cr_expect_eq(c->ids[c->n_prompt], 'c');
        }
    }
    dataset_free(ds);
    dataset_free(val);

    const char *prompts = ds_write_file("prompts.jsonl", "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\", "
                                                      "\"answer\": \"2\"}\n{\"prompt\": \"c\", \"answer\": \"3\"}\n");
    ds = load_ok(prompts, DATASET_PROMPTS, &f);
    TEST_OK(dataset_split(ds, 0.5, 1, &val, &err), &err);
    cr_assert_eq(val->n + ds->n, 3);
    cr_expect_eq(val->n, 2);
    for (int64_t i = 0; i < val->n; i++)
        cr_expect_eq(val->prompts[i].answer[0] - '0', val->prompts[i].ids[1] - 'a' + 1);
    dataset_free(ds);
    dataset_free(val);
}

/* ---- loader ---- */

/* A batch agrees with the dataset: sequences back to back, targets the next trained
 * token within the sequence. */
static void check_batch(const struct dataset *ds, const struct dataset_batch *b) {
    cr_assert_eq(b->cu_seqlens[0], 0);
    cr_assert_eq(b->cu_seqlens[b->n_seqs], b->n_tokens);
    int64_t n_targets = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct dataset_example *ex = &ds->examples[b->rows[s]];
        int32_t start = b->cu_seqlens[s], n = b->cu_seqlens[s + 1] - start;
        cr_assert_eq(n, ex->n, "sequence %d has %d tokens, its example %d", s, n, ex->n);
        cr_assert(!memcmp(b->ids + start, ex->ids, (size_t)n * sizeof *ex->ids));
        for (int32_t j = 0; j < n; j++) {
            int32_t want = j + 1 < n && ex->mask[j + 1] ? ex->ids[j + 1] : -1;
            cr_assert_eq(b->targets[start + j], want, "seq %d target %d", s, j);
            n_targets += want >= 0;
        }
    }
    cr_assert_eq(b->n_targets, n_targets);
}

/* Runs one epoch from its start: every unit exactly once, batches as counted. */
static void check_epoch(const struct dataset *ds, struct dataset_loader *l, int64_t epoch,
                        const struct dataset_loader_config *c, int64_t *order_out) {
    struct smelt_error err = {0};
    int seqs = ds->kind == DATASET_PREFERENCE ? 2 : 1;
    struct dataset_cursor at = dataset_loader_cursor(l);
    cr_assert_eq(at.epoch, epoch);
    cr_assert_eq(at.index, 0);
    int64_t n_batches = dataset_loader_batches_in_epoch(l, epoch), seen_units = 0;
    cr_assert_gt(n_batches, 0);
    int *count = calloc((size_t)ds->n, sizeof *count);
    for (int64_t k = 0; k < n_batches; k++) {
        const struct dataset_batch *b = NULL;
        TEST_OK(dataset_loader_next(l, &b, &err), &err);
        check_batch(ds, b);
        if (c->max_tokens > 0) cr_assert_leq(b->n_tokens, c->max_tokens);
        else if (k + 1 < n_batches || c->drop_last) cr_assert_eq(b->n_seqs, c->batch_size * seqs);
        for (int s = 0; s < b->n_seqs; s += seqs) {
            int64_t u = b->rows[s] / seqs;
            if (seqs == 2) {
                cr_assert_eq(b->rows[s], 2 * u);
                cr_assert_eq(b->rows[s + 1], 2 * u + 1);
            }
            count[u]++;
            if (order_out) order_out[seen_units] = u;
            seen_units++;
        }
        at = dataset_loader_cursor(l);
        if (k + 1 < n_batches) cr_assert(at.epoch == epoch && at.index == seen_units);
    }
    cr_assert(at.epoch == epoch + 1 && at.index == 0, "after epoch %lld the cursor is (%lld, %lld)",
              (long long)epoch, (long long)at.epoch, (long long)at.index);
    for (int64_t u = 0; u < ds->n; u++)
        if (!c->drop_last) cr_assert_eq(count[u], 1, "unit %lld seen %d times in epoch %lld", (long long)u, count[u],
                                        (long long)epoch);
        else cr_assert_leq(count[u], 1);
    if (c->drop_last && c->max_tokens == 0) cr_assert_eq(seen_units, ds->n - ds->n % c->batch_size);
    free(count);
}

Test(datasets, loader_batch_size_mode, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 37, false);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    struct smelt_error err = {0};
    struct dataset_loader_config c = {.batch_size = 5, .shuffle = false, .seed = 1};
    struct dataset_loader *l = NULL;
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    cr_expect_eq(dataset_loader_batches_in_epoch(l, 0), 8);
    int64_t order[37];
    check_epoch(ds, l, 0, &c, order);
    for (int i = 0; i < 37; i++) cr_expect_eq(order[i], i, "without shuffle the order is the file's");
    check_epoch(ds, l, 1, &c, NULL);
    dataset_loader_free(l);

    c.shuffle = true;
    c.drop_last = true;
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    cr_expect_eq(dataset_loader_batches_in_epoch(l, 3), 7);
    for (int e = 0; e < 3; e++) check_epoch(ds, l, e, &c, NULL);
    dataset_loader_free(l);
    dataset_free(ds);
}

Test(datasets, loader_packing_mode, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 53, false);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    struct smelt_error err = {0};
    for (int drop = 0; drop < 2; drop++) {
        struct dataset_loader_config c = {.max_tokens = 40, .shuffle = true, .seed = 5, .drop_last = drop};
        struct dataset_loader *l = NULL;
        TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
        int64_t total = 0;
        for (int e = 0; e < 4; e++) {
            int64_t before = dataset_loader_batches_in_epoch(l, e);
            check_epoch(ds, l, e, &c, NULL);
            total += before;
        }
        cr_expect_geq(total, 4 * (ds->report.n_tokens / 40 - 1));
        dataset_loader_free(l);
    }
    /* drop_last in packing drops a last batch under half full, never an epoch's only batch. */
    struct dataset_loader_config c = {.max_tokens = 4096, .drop_last = true};
    struct dataset_loader *l = NULL;
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    cr_expect_eq(dataset_loader_batches_in_epoch(l, 0), 1);
    check_epoch(ds, l, 0, &c, NULL);
    dataset_loader_free(l);
    int64_t half = ds->report.n_tokens - 8; /* a last batch of a few tokens */
    c.max_tokens = half;
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    cr_expect_eq(dataset_loader_batches_in_epoch(l, 0), 1);
    const struct dataset_batch *b = NULL;
    TEST_OK(dataset_loader_next(l, &b, &err), &err);
    cr_expect_eq(dataset_loader_cursor(l).epoch, 1);
    dataset_loader_free(l);
    dataset_free(ds);
}

Test(datasets, loader_refuses_what_it_cannot_batch, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 6, false);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    struct smelt_error err = {0};
    struct dataset_loader *l = NULL;
    struct dataset_loader_config c = {.max_tokens = 8};
    TEST_EXPECT_ERROR(dataset_loader_create(ds, &c, &l, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "longer than max_tokens 8") != NULL, "%s", err.message);
    cr_expect_null(l);
    c = (struct dataset_loader_config){.batch_size = 0};
    TEST_EXPECT_ERROR(dataset_loader_create(ds, &c, &l, &err), SMELT_EINVAL, &err);
    c = (struct dataset_loader_config){.batch_size = 7, .drop_last = true};
    TEST_EXPECT_ERROR(dataset_loader_create(ds, &c, &l, &err), SMELT_EINVAL, &err);
    c = (struct dataset_loader_config){.batch_size = 2};
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    struct dataset_cursor bad = {.epoch = 0, .index = 7};
    TEST_EXPECT_ERROR(dataset_loader_seek(l, &bad, &err), SMELT_EINVAL, &err);
    bad = (struct dataset_cursor){.epoch = -1};
    TEST_EXPECT_ERROR(dataset_loader_seek(l, &bad, &err), SMELT_EINVAL, &err);
    dataset_loader_free(l);
    dataset_free(ds);

}

/* A prompts batch (the RL loop's): its rows are the prompts, their ids laid out, nothing
 * trained. */
Test(datasets, loader_batches_prompts, .init = setup, .fini = ds_teardown) {
    const char *prompts = ds_write_file("prompts.jsonl", "{\"prompt\": \"ab\"}\n{\"prompt\": \"c\"}\n{\"prompt\": \"de\"}\n");
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(prompts, DATASET_AUTO, &f);
    struct smelt_error err = {0};
    struct dataset_loader *l = NULL;
    struct dataset_loader_config c = {.batch_size = 2};
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    const struct dataset_batch *b;
    TEST_OK(dataset_loader_next(l, &b, &err), &err);
    cr_assert_eq(b->n_seqs, 2);
    cr_expect_eq(b->rows[0], 0);
    cr_expect_eq(b->rows[1], 1);
    cr_expect_eq(b->n_targets, 0);
    cr_expect_eq(b->n_tokens, ds->prompts[0].n + ds->prompts[1].n);
    for (int64_t t = 0; t < b->n_tokens; t++) cr_expect_eq(b->targets[t], -1);
    cr_expect_eq(memcmp(b->ids, ds->prompts[0].ids, (size_t)ds->prompts[0].n * sizeof *b->ids), 0);
    TEST_OK(dataset_loader_next(l, &b, &err), &err);
    cr_expect_eq(b->n_seqs, 1);
    cr_expect_eq(b->rows[0], 2);
    cr_expect_eq(dataset_loader_cursor(l).epoch, 1);
    dataset_loader_free(l);
    dataset_free(ds);
}

/* The units of the first batches of loaders built from c, flattened. */
static void first_units(const struct dataset *ds, const struct dataset_loader_config *c, int n_batches,
                        int64_t *units, int *n_units) {
    struct smelt_error err = {0};
    struct dataset_loader *l = NULL;
    TEST_OK(dataset_loader_create(ds, c, &l, &err), &err);
    *n_units = 0;
    for (int k = 0; k < n_batches; k++) {
        const struct dataset_batch *b = NULL;
        TEST_OK(dataset_loader_next(l, &b, &err), &err);
        for (int s = 0; s < b->n_seqs; s++) units[(*n_units)++] = b->rows[s];
    }
    dataset_loader_free(l);
}

Test(datasets, shuffle_depends_on_seed_and_epoch, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 30, false);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    struct dataset_loader_config c = {.batch_size = 3, .shuffle = true, .seed = 11};
    int64_t a[60], b[60], other[60];
    int na, nb, no;
    first_units(ds, &c, 20, a, &na); /* two epochs */
    first_units(ds, &c, 20, b, &nb);
    cr_assert_eq(na, 60);
    cr_expect(na == nb && !memcmp(a, b, sizeof a), "the same seed gave different orders");
    cr_expect(memcmp(a, a + 30, 30 * sizeof *a), "epochs 0 and 1 have the same order");
    bool identity = true;
    for (int i = 0; i < 30; i++) identity &= a[i] == i;
    cr_expect(!identity, "shuffled epoch 0 is in file order");
    c.seed = 12;
    first_units(ds, &c, 20, other, &no);
    cr_expect(memcmp(a, other, sizeof a), "seeds 11 and 12 gave the same order");
    dataset_free(ds);
}

/* Batches after seeking to any cursor are the batches an uninterrupted loader gives. */
static void check_resume(const struct dataset *ds, const struct dataset_loader_config *c, int n_batches) {
    struct smelt_error err = {0};
    struct dataset_loader *full = NULL;
    TEST_OK(dataset_loader_create(ds, c, &full, &err), &err);
    struct dataset_cursor *cursors = calloc((size_t)n_batches + 1, sizeof *cursors);
    int64_t **rows = calloc((size_t)n_batches, sizeof *rows);
    int *n_seqs = calloc((size_t)n_batches, sizeof *n_seqs);
    int64_t *n_tokens = calloc((size_t)n_batches, sizeof *n_tokens);
    cursors[0] = dataset_loader_cursor(full);
    for (int k = 0; k < n_batches; k++) {
        const struct dataset_batch *b = NULL;
        TEST_OK(dataset_loader_next(full, &b, &err), &err);
        rows[k] = malloc((size_t)b->n_seqs * sizeof **rows);
        memcpy(rows[k], b->rows, (size_t)b->n_seqs * sizeof **rows);
        n_seqs[k] = b->n_seqs;
        n_tokens[k] = b->n_tokens;
        cursors[k + 1] = dataset_loader_cursor(full);
    }
    for (int start = 0; start < n_batches; start += 3) {
        struct dataset_loader *resumed = NULL;
        TEST_OK(dataset_loader_create(ds, c, &resumed, &err), &err);
        TEST_OK(dataset_loader_seek(resumed, &cursors[start], &err), &err);
        for (int k = start; k < n_batches; k++) {
            const struct dataset_batch *b = NULL;
            TEST_OK(dataset_loader_next(resumed, &b, &err), &err);
            cr_assert_eq(b->n_seqs, n_seqs[k], "resumed at batch %d: batch %d differs", start, k);
            cr_assert_eq(b->n_tokens, n_tokens[k]);
            cr_assert(!memcmp(b->rows, rows[k], (size_t)b->n_seqs * sizeof *b->rows),
                      "resumed at batch %d: batch %d has other rows", start, k);
            struct dataset_cursor at = dataset_loader_cursor(resumed);
            cr_assert(at.epoch == cursors[k + 1].epoch && at.index == cursors[k + 1].index);
        }
        dataset_loader_free(resumed);
    }
    for (int k = 0; k < n_batches; k++) free(rows[k]);
    free(rows);
    free(n_seqs);
    free(n_tokens);
    free(cursors);
    dataset_loader_free(full);
}

Test(datasets, cursor_and_seek_continue_exactly, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("rows.jsonl", 23, false);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    struct dataset_loader_config configs[] = {
        {.batch_size = 4, .shuffle = true, .seed = 3},
        {.batch_size = 4, .shuffle = true, .seed = 3, .drop_last = true},
        {.max_tokens = 30, .shuffle = true, .seed = 9},
        {.max_tokens = 30, .shuffle = true, .seed = 9, .drop_last = true},
        {.max_tokens = 30, .shuffle = false},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) check_resume(ds, &configs[i], 40);
    /* A cursor at an epoch's end is the next epoch's start. */
    struct smelt_error err = {0};
    struct dataset_loader *l = NULL;
    TEST_OK(dataset_loader_create(ds, &configs[0], &l, &err), &err);
    struct dataset_cursor end = {.epoch = 2, .index = 23};
    TEST_OK(dataset_loader_seek(l, &end, &err), &err);
    struct dataset_cursor at = dataset_loader_cursor(l);
    cr_expect(at.epoch == 3 && at.index == 0);
    dataset_loader_free(l);
    dataset_free(ds);
}

Test(datasets, loader_keeps_preference_pairs_adjacent, .init = setup, .fini = ds_teardown) {
    const char *path = write_rows("pairs.jsonl", 19, true);
    struct dataset_format f = ds_format(64);
    struct dataset *ds = load_ok(path, DATASET_PREFERENCE, &f);
    struct smelt_error err = {0};
    struct dataset_loader_config configs[] = {
        {.batch_size = 4, .shuffle = true, .seed = 2},
        {.max_tokens = 60, .shuffle = true, .seed = 2},
    };
    for (int i = 0; i < 2; i++) {
        struct dataset_loader *l = NULL;
        TEST_OK(dataset_loader_create(ds, &configs[i], &l, &err), &err);
        for (int e = 0; e < 3; e++) check_epoch(ds, l, e, &configs[i], NULL);
        dataset_loader_free(l);
        check_resume(ds, &configs[i], 20);
    }
    dataset_free(ds);
}

/* ---- size ---- */

Test(datasets, many_rows_load_quickly, .init = setup, .fini = ds_teardown) {
    int n = 20000;
    const char *path = write_rows("many.jsonl", n, false);
    struct dataset_format f = ds_format(64);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct dataset *ds = load_ok(path, DATASET_SFT, &f);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_eq(ds->n, n);
    cr_expect_lt(s, 5.0, "%d rows took %.2f s", n, s);
    struct smelt_error err = {0};
    struct dataset_loader_config c = {.max_tokens = 512, .shuffle = true, .seed = 1};
    struct dataset_loader *l = NULL;
    TEST_OK(dataset_loader_create(ds, &c, &l, &err), &err);
    int64_t batches = dataset_loader_batches_in_epoch(l, 0), tokens = 0;
    for (int64_t k = 0; k < batches; k++) {
        const struct dataset_batch *b = NULL;
        TEST_OK(dataset_loader_next(l, &b, &err), &err);
        tokens += b->n_tokens;
    }
    cr_expect_eq(tokens, ds->report.n_tokens);
    dataset_loader_free(l);
    dataset_free(ds);
}
