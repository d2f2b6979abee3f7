/* Request bodies against their schema (server/body_rules.c) and the Tinker SDK's bodies
 * (server/tinker_rules.c): unknown keys, missing required ones, types, ranges and values are
 * refused naming the field as the document's path; free-form values keep their numbers
 * within what jansson reads. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

static const struct body_rule INNER[] = {
    {.key = "n", .kind = BODY_INT, .required = true, .min = 1, .max = 10},
    {.key = NULL},
};

static const struct body_rule ITEM = {.kind = BODY_STRING};

static int not_two(const json_t *v, const char *path, struct smelt_error *err) {
    (void)path;
    if (json_integer_value(json_object_get(json_object_get(v, "inner"), "n")) != 2) return 0;
    return error_set_field(err, SMELT_EINVAL, "inner.n", "inner.n: not 2");
}

static const struct body_rule RULES[] = {
    {.key = "name", .kind = BODY_STRING, .required = true},
    {.key = "mode", .kind = BODY_STRING, .values = (const char *const[]){"a", "b", NULL}},
    {.key = "rate", .kind = BODY_NUMBER, .min = 0, .max = 1},
    {.key = "flag", .kind = BODY_BOOL},
    {.key = "inner", .kind = BODY_OBJECT, .fields = INNER},
    {.key = "tags", .kind = BODY_ARRAY, .items = &ITEM},
    {.key = "meta", .kind = BODY_OBJECT},
    {.key = NULL, .check = not_two},
};

/* The field body_check names for text, "" when it passes. */
static const char *refused(const char *text, const struct body_rule *rules) {
    static struct smelt_error err;
    memset(&err, 0, sizeof err);
    json_t *body = json_loads(text, 0, NULL);
    cr_assert(body, "%s", text);
    int rc = body_check(body, rules, "", &err);
    json_decref(body);
    cr_assert(rc == 0 || err.message[0], "%s", text);
    return rc ? err.field : "";
}

Test(body_rules, a_body_that_keeps_its_rules_passes) {
    cr_assert_str_eq(refused("{\"name\": \"x\"}", RULES), "");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"mode\": \"b\", \"rate\": 0.5, \"flag\": false, \"inner\": {\"n\": 3}, "
                             "\"tags\": [\"t\"], \"meta\": {\"k\": [1, {\"x\": null}]}}", RULES), "");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"mode\": null, \"inner\": null}", RULES), ""); /* null: absent */
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 4.0}}", RULES), "");          /* 4.0 is 4 */
}

Test(body_rules, refusals_name_the_field) {
    cr_assert_str_eq(refused("{}", RULES), "name");
    cr_assert_str_eq(refused("{\"name\": null}", RULES), "name");
    cr_assert_str_eq(refused("{\"name\": 3}", RULES), "name");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"extra\": 1}", RULES), "extra");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"mode\": \"c\"}", RULES), "mode");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"rate\": 1.5}", RULES), "rate");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"rate\": \"1\"}", RULES), "rate");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"flag\": 1}", RULES), "flag");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {}}", RULES), "inner.n");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 11}}", RULES), "inner.n");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 2.5}}", RULES), "inner.n");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 1, \"m\": 1}}", RULES), "inner.m");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": []}", RULES), "inner");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"tags\": [\"a\", 1]}", RULES), "tags[1]");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"tags\": [null]}", RULES), "tags[0]");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 2}}", RULES), "inner.n"); /* the whole's check */
}

/* An empty key was refused with an empty field (no param in the reply); found by
 * tests/fuzz/fuzz_body_rules. */
Test(body_rules, an_empty_key_is_named) {
    cr_assert_str_eq(refused("{\"name\": \"x\", \"\": 1}", RULES), "\"\"");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"inner\": {\"n\": 1, \"\": 1}}", RULES), "inner.\"\"");
    cr_assert_str_eq(refused("{\"\": 1}", TINKER_CANCEL_FUTURE), "\"\"");
}

Test(body_rules, free_form_numbers_stay_within_64_bits) {
    cr_assert_str_eq(refused("{\"name\": \"x\", \"meta\": {\"k\": 9223372036854775807}}", RULES), "");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"meta\": {\"k\": -9.2e18}}", RULES), "");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"meta\": {\"k\": 9.3e18}}", RULES), "meta.k");
    cr_assert_str_eq(refused("{\"name\": \"x\", \"meta\": {\"k\": [0, {\"deep\": -1e300}]}}", RULES), "meta.k[1].deep");
}

Test(body_rules, other_keys_take_the_star_rule) {
    static const struct body_rule STRINGS[] = {{.key = "*", .kind = BODY_STRING}, {.key = NULL}};
    cr_assert_str_eq(refused("{\"a\": \"x\", \"b\": \"y\", \"c\": null}", STRINGS), "");
    cr_assert_str_eq(refused("{\"a\": \"x\", \"b\": 2}", STRINGS), "b");
}

/* The SDK's bodies as tinker==0.38.0 sends them pass; what smelt refuses is named. */
Test(body_rules, tinker_bodies) {
    cr_assert_str_eq(refused("{\"tags\": [], \"sdk_version\": \"0.38.0\", \"type\": \"create_session\"}",
                             TINKER_CREATE_SESSION), "");
    cr_assert_str_eq(refused("{\"session_id\": \"s\", \"model_seq_id\": 0, \"base_model\": \"tiny\", \"lora_config\": "
                             "{\"rank\": 4, \"seed\": 7, \"train_unembed\": true, \"train_mlp\": true, \"train_attn\": "
                             "true}, \"optimizer_config\": {\"type\": \"adamw\"}, \"type\": \"create_model\"}",
                             TINKER_CREATE_MODEL), "");
    cr_assert_str_eq(refused("{\"session_id\": \"s\", \"model_seq_id\": 0, \"base_model\": \"tiny\", \"lora_config\": "
                             "{\"train_unembed\": false, \"train_mlp\": false, \"train_attn\": false}}",
                             TINKER_CREATE_MODEL), "lora_config");
    cr_assert_str_eq(refused("{\"session_id\": \"s\", \"model_seq_id\": 0, \"base_model\": \"tiny\", \"lora_config\": "
                             "{}, \"optimizer_config\": {\"type\": \"dimuon\", \"version\": 1}}", TINKER_CREATE_MODEL),
                     "optimizer_config.version");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"seq_id\": 3, \"adam_params\": {\"learning_rate\": 1e-4, "
                             "\"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-12, \"weight_decay\": 0, \"grad_clip_norm\": "
                             "0}, \"type\": \"optim_step\"}", TINKER_OPTIM_STEP), "");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"seq_id\": 3, \"optimizer_params\": {\"type\": \"dimuon\"}}",
                             TINKER_OPTIM_STEP), "optimizer_params");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"seq_id\": 0, \"adam_params\": {\"learning_rate\": 1}}",
                             TINKER_OPTIM_STEP), "seq_id");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"seq_id\": 2, \"path\": \".x\"}", TINKER_SAVE_WEIGHTS), "path");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"seq_id\": 2, \"kind\": \"snapshot\"}", TINKER_SAVE_FOR_SAMPLER),
                     "sampling_session_seq_id");
    cr_assert_str_eq(refused("{\"model_id\": \"m\", \"path\": \"tinker://x\", \"optimizer\": true}",
                             TINKER_LOAD_WEIGHTS), "seq_id");
    cr_assert_str_eq(refused("{\"session_id\": \"s\", \"model_seq_id\": 1, \"path\": \"tinker://x\", \"optimizer\": "
                             "false}", TINKER_LOAD_WEIGHTS), "");
    cr_assert_str_eq(refused("{\"session_id\": \"s\", \"sampling_session_seq_id\": 0}", TINKER_CREATE_SAMPLER),
                     "base_model");
}

Test(body_rules, tinker_samples) {
    const char *ok = "{\"num_samples\": 2, \"prompt\": {\"chunks\": [{\"tokens\": [1, 2], \"type\": \"encoded_text\"}]}, "
                     "\"sampling_params\": {\"max_tokens\": 4, \"seed\": 1, \"stop\": [\"\\n\"], \"temperature\": 1, "
                     "\"top_k\": -1, \"top_p\": 1}, \"sampling_session_id\": \"s\", \"seq_id\": 0, "
                     "\"prompt_logprobs\": false, \"topk_prompt_logprobs\": 0, \"topk_sample_logprobs\": 0, "
                     "\"prompt_alt_tokens_k\": 0, \"type\": \"sample\"}";
    cr_assert_str_eq(refused(ok, TINKER_SAMPLE), "");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": [1]}, {\"type\": \"image\", \"data\": \"x\"}]}, "
                             "\"sampling_params\": {\"max_tokens\": 1}, \"sampling_session_id\": \"s\"}", TINKER_SAMPLE),
                     "prompt.chunks[1]");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": []}]}, \"sampling_params\": {\"max_tokens\": 1}, "
                             "\"sampling_session_id\": \"s\"}", TINKER_SAMPLE), "prompt.chunks[0].tokens");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": [1]}]}, \"sampling_params\": {\"max_tokens\": 1, "
                             "\"stop\": [\"a\", 3]}, \"sampling_session_id\": \"s\"}", TINKER_SAMPLE),
                     "sampling_params.stop");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": [1]}]}, \"sampling_params\": {}, "
                             "\"sampling_session_id\": \"s\"}", TINKER_SAMPLE), "sampling_params.max_tokens");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": [1]}]}, \"sampling_params\": {\"max_tokens\": 1}, "
                             "\"sampling_session_id\": \"s\", \"topk_sample_logprobs\": 2}", TINKER_SAMPLE),
                     "topk_sample_logprobs");
    cr_assert_str_eq(refused("{\"prompt\": {\"chunks\": [{\"tokens\": [1]}]}, \"sampling_params\": {\"max_tokens\": 1}, "
                             "\"sampling_session_id\": \"s\", \"record_stability_info\": true}", TINKER_SAMPLE),
                     "record_stability_info");
}
