/* datasets/: OpenAI's prompts rows ({"messages": [...], <any other field>}) — the prompt's
 * ids against the chat template's own rendering with its generation prompt, the other
 * fields kept as the metadata a grader reads, the answer; the kind a messages row gives
 * a file (the last turn decides; the file's kind wins); every refusal with its line and
 * field. Byte tokenizer and the plain template. */
#include "tests/unit/datasets_testutil.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "tokenizer/tokenizer.h"

static struct dataset *load_ok(const char *path, enum dataset_kind kind) {
    struct dataset_format f = ds_format(256);
    return ds_load(path, kind, &f, NULL);
}

/* The prompt's ids are exactly the template's rendering of messages with the generation
 * prompt. */
static void expect_rendered(const struct dataset_prompt *p, const struct chat_message *m, size_t n) {
    struct smelt_error err = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n_ids = 0;
    TEST_OK(chat_tokenize(&ds_chat, ds_tok, m, n, true, &ids, &mask, &n_ids, &err), &err);
    cr_assert_eq((size_t)p->n, n_ids, "line %lld: %d ids, the template gives %zu", (long long)p->line, p->n, n_ids);
    cr_expect(!memcmp(p->ids, ids, n_ids * sizeof *ids), "line %lld: ids differ from the template's",
              (long long)p->line);
    free(ids);
    free(mask);
}

Test(prompts_messages, openai_rows_are_prompts_with_their_fields_as_metadata, .init = ds_setup, .fini = ds_teardown) {
    const char *path = ds_write_file("rft.jsonl",
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"Add.\"}, {\"role\": \"user\", \"content\": \"2+2=\"}], "
        "\"reference_answer\": \"4\", \"level\": 2, \"refs\": [{\"text\": \"four\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": \"hello\", \"metadata\": {\"x\": 1}}\n"
        "\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}], \"answer\": 2, \"tools\": []}\n"
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"a\"}, "
        "{\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}], \"tools\": null}\n");
    struct dataset *ds = load_ok(path, DATASET_AUTO);
    cr_assert_eq(ds->kind, DATASET_PROMPTS);
    cr_assert_eq(ds->n, 5);
    cr_expect_null(ds->examples);

    /* developer is the template's system turn */
    const struct dataset_prompt *p = &ds->prompts[0];
    expect_rendered(p, (struct chat_message[]){{"system", "Add."}, {"user", "2+2="}}, 2);
    cr_expect_null(p->answer);
    cr_expect_str_eq(p->metadata_json, "{\"reference_answer\":\"4\",\"level\":2,\"refs\":[{\"text\":\"four\"}]}");
    cr_expect_eq(p->line, 1);

    /* a string answer is the row's answer too; "metadata" is a field like any other */
    p = &ds->prompts[1];
    expect_rendered(p, (struct chat_message[]){{"user", "hi"}}, 1);
    cr_expect_str_eq(p->answer, "hello");
    cr_expect_str_eq(p->metadata_json, "{\"answer\":\"hello\",\"metadata\":{\"x\":1}}");
    cr_expect_eq(p->line, 2);

    /* messages alone: no metadata */
    p = &ds->prompts[2];
    cr_expect_eq(p->line, 4);
    cr_expect_null(p->answer);
    cr_expect_null(p->metadata_json);

    /* a number answer stays in the metadata (a grader's {{item.answer}} finds it there);
     * an empty tools list is OpenAI's reserved key, not data */
    p = &ds->prompts[3];
    cr_expect_null(p->answer);
    cr_expect_str_eq(p->metadata_json, "{\"answer\":2}");

    /* earlier assistant turns are context: the prompt ends with the user's */
    p = &ds->prompts[4];
    expect_rendered(p, (struct chat_message[]){{"system", "s"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}}, 4);
    cr_expect_null(p->metadata_json);
    dataset_free(ds);
}

/* Without a template a message list cannot be rendered: refused naming the line. */
Test(prompts_messages, need_a_chat_template, .init = ds_setup, .fini = ds_teardown) {
    const char *path = ds_write_file("rft.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"a\": 1}\n");
    struct dataset_format f = ds_format(64);
    f.chat = NULL;
    struct dataset *ds = NULL;
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_load(path, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_null(ds);
    cr_expect_eq(r.kind, DATASET_PROMPTS);
    ds_expect_issue(&r, 0, 1, "messages", "a list of messages needs a chat template, and none was given or found with "
                                     "the tokenizer");
}

Test(prompts_messages, the_last_turn_decides_the_kind_of_a_file, .init = ds_setup, .fini = ds_teardown) {
    struct dataset_report r;
    struct smelt_error err = {0};
    const char *rft = ds_write_file("rft.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n"
                                              "{\"messages\": [{\"role\": \"user\", \"content\": \"r\"}], \"x\": 1}\n");
    TEST_OK(dataset_validate_file(rft, DATASET_AUTO, &r, &err), &err);
    cr_expect_eq(r.kind, DATASET_PROMPTS);
    cr_expect_eq(r.n_examples, 2);

    const char *sft = ds_write_file("sft.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}, "
        "{\"role\": \"user\", \"content\": \"thanks\"}]}\n");
    /* the first row decides; in an sft file a conversation ending with a user turn is
     * still sft (its assistant turn is trained) */
    TEST_OK(dataset_validate_file(sft, DATASET_AUTO, &r, &err), &err);
    cr_expect_eq(r.kind, DATASET_SFT);
    cr_expect_eq(r.n_examples, 2);
    struct dataset *ds = load_ok(sft, DATASET_AUTO);
    cr_expect_eq(ds->kind, DATASET_SFT);
    cr_expect_eq(ds->n, 2);
    dataset_free(ds);

    /* requested as prompts, an SFT file's rows are refused naming line and turn */
    TEST_EXPECT_ERROR(dataset_validate_file(sft, DATASET_PROMPTS, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.n_issues, 1);
    cr_expect_eq(r.n_examples, 1);
    ds_expect_issue(&r, 0, 1, "messages[1].role",
                 "a prompt ends with a user or system turn (the model writes the answer), got a final assistant turn");
    char want[600];
    snprintf(want, sizeof want, "%s:1: messages[1].role: a prompt ends with a user or system turn (the model "
             "writes the answer), got a final assistant turn", sft);
    cr_expect_str_eq(err.message, want);

    /* requested as sft, a prompts row without an assistant turn has nothing to train */
    TEST_EXPECT_ERROR(dataset_validate_file(rft, DATASET_SFT, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.n_issues, 2);
    ds_expect_issue(&r, 0, 1, "messages", "no assistant turn (nothing to train)");
    ds_expect_issue(&r, 1, 2, "", "unknown field \"x\"");
}

Test(prompts_messages, refusals_name_line_and_field, .init = ds_setup, .fini = ds_teardown) {
    const char *path = ds_write_file("bad.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"reference_answer\": \"4\"}\n"        /* 1 ok */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"4\"}], "
        "\"reference_answer\": \"4\"}\n"                                                                       /* 2 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": [{\"type\": \"function\"}]}\n"  /* 3 */
        "{\"messages\": [{\"role\": \"tool\", \"content\": \"q\"}]}\n"                                        /* 4 */
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"q\"}]}]}\n"      /* 5 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"name\": \"n\"}]}\n"                      /* 6 */
        "{\"messages\": []}\n"                                                                                 /* 7 */
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n" /* 8 */
        "{\"prompt\": \"q\", \"reference_answer\": \"4\"}\n"                                                   /* 9 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \" \"}]}\n"); /* 10 */
    struct dataset_report r;
    struct smelt_error err = {0};
    TEST_EXPECT_ERROR(dataset_validate_file(path, DATASET_AUTO, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_eq(r.kind, DATASET_PROMPTS);
    cr_expect_eq(r.n_examples, 1);
    cr_expect_eq(r.n_issues, 9);
    int i = 0;
    ds_expect_issue(&r, i++, 2, "messages[1].role",
                 "a prompt ends with a user or system turn (the model writes the answer), got a final assistant turn");
    ds_expect_issue(&r, i++, 3, "tools", "not supported: smelt's samples are text completions (no tool calls)");
    ds_expect_issue(&r, i++, 4, "messages[0].role",
                 "expected \"system\", \"developer\", \"user\" or \"assistant\", got \"tool\"");
    ds_expect_issue(&r, i++, 5, "messages[0].content", "expected a string, got array");
    ds_expect_issue(&r, i++, 6, "messages[0]", "unknown field \"name\"");
    ds_expect_issue(&r, i++, 7, "messages", "empty list of messages");
    ds_expect_issue(&r, i++, 8, "prompt[1].role",
                 "a prompt ends with a user or system turn (the model writes the answer), got a final assistant turn");
    /* smelt's own form keeps its keys */
    ds_expect_issue(&r, i++, 9, "", "unknown field \"reference_answer\"");
    ds_expect_issue(&r, i++, 10, "messages[1].content", "empty assistant turn");

    /* the same through dataset_load: the first issue is the error */
    struct dataset_format f = ds_format(256);
    struct dataset *ds = NULL;
    TEST_EXPECT_ERROR(dataset_load(path, DATASET_AUTO, &f, &ds, &r, &err), SMELT_EFORMAT, &err);
    cr_expect_null(ds);
    cr_expect_eq(r.n_issues, 9);
    char want[600];
    snprintf(want, sizeof want, "%s:2: messages[1].role: a prompt ends with a user or system turn (the model "
             "writes the answer), got a final assistant turn", path);
    cr_expect_str_eq(err.message, want);
}

/* "developer" in an SFT conversation is its system turn, token for token. */
Test(prompts_messages, developer_is_the_system_turn_in_sft_rows, .init = ds_setup, .fini = ds_teardown) {
    const char *dev = ds_write_file("dev.jsonl", "{\"messages\": [{\"role\": \"developer\", \"content\": \"be brief\"}, "
                                              "{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
                                              "\"content\": \"a\"}]}\n");
    const char *sys = ds_write_file("sys.jsonl", "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, "
                                              "{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
                                              "\"content\": \"a\"}]}\n");
    struct dataset *a = load_ok(dev, DATASET_AUTO), *b = load_ok(sys, DATASET_AUTO);
    cr_assert_eq(a->kind, DATASET_SFT);
    cr_assert_eq(a->examples[0].n, b->examples[0].n);
    cr_expect(!memcmp(a->examples[0].ids, b->examples[0].ids, (size_t)a->examples[0].n * sizeof(int32_t)));
    cr_expect(!memcmp(a->examples[0].mask, b->examples[0].mask, (size_t)a->examples[0].n));
    dataset_free(a);
    dataset_free(b);
}

/* The held-out split keeps each prompt's metadata with it. */
Test(prompts_messages, split_keeps_metadata, .init = ds_setup, .fini = ds_teardown) {
    const char *path = ds_write_file("rft.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"k\": \"a\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}], \"k\": \"b\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}], \"k\": \"c\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"d\"}], \"k\": \"d\"}\n");
    struct dataset *ds = load_ok(path, DATASET_PROMPTS), *val = NULL;
    struct smelt_error err = {0};
    TEST_OK(dataset_split(ds, 0.5, 3, &val, &err), &err);
    cr_assert_eq(ds->n + val->n, 4);
    const struct dataset *parts[2] = {ds, val};
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < parts[k]->n; i++) {
            const struct dataset_prompt *p = &parts[k]->prompts[i];
            char want[32];
            char letter = (char)('a' + p->line - 1);
            snprintf(want, sizeof want, "{\"k\":\"%c\"}", letter);
            cr_expect_str_eq(p->metadata_json, want, "line %lld", (long long)p->line);
        }
    dataset_free(val);
    dataset_free(ds);
}

/* What graders read of a row, alone (smeltd's graders run reads its item through it):
 * the fields but messages and tools, a string answer; nothing left is no metadata. */
Test(prompts_messages, openai_item_is_the_rows_fields_but_messages_and_tools) {
    json_t *row = json_loads("{\"messages\": [], \"tools\": null, \"answer\": \"4\", \"n\": {\"x\": 1}}", 0, NULL);
    json_t *meta = NULL;
    const char *answer = NULL;
    struct smelt_error err = {0};
    TEST_OK(dataset_openai_item(row, &meta, &answer, &err), &err);
    json_t *want = json_loads("{\"answer\": \"4\", \"n\": {\"x\": 1}}", 0, NULL);
    cr_expect(json_equal(meta, want), "metadata %s", json_dumps(meta, 0));
    cr_expect_str_eq(answer, "4");
    json_decref(meta);
    json_decref(want);
    json_object_set_new(row, "answer", json_integer(4)); /* not a string: metadata only */
    TEST_OK(dataset_openai_item(row, &meta, &answer, &err), &err);
    cr_expect_null(answer);
    cr_expect_eq(json_integer_value(json_object_get(meta, "answer")), 4);
    json_decref(meta);
    json_object_del(row, "answer");
    json_object_del(row, "n");
    TEST_OK(dataset_openai_item(row, &meta, &answer, &err), &err);
    cr_expect_null(meta);
    cr_expect_null(answer);
    json_decref(row);
    json_t *list = json_array();
    TEST_EXPECT_ERROR(dataset_openai_item(list, &meta, &answer, &err), SMELT_EINVAL, &err);
    json_decref(list);
}
