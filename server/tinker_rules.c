/* The Tinker SDK's JSON request bodies (tinker==0.38.0's request types, which refuse unknown
 * fields too), as server/web/openapi.json's Tinker* schemas say them: what the handlers of
 * api_tinker*.c check first (body_check). The SDK leaves out None fields; null counts as
 * absent. A field smelt reads nothing from is still typed, so a wrong one is refused, not
 * ignored. */
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

#define I32 .min = 0, .max = INT32_MAX
/* 64-bit fields are read with json_field_int, which takes an integral real (1e3 for 1000) only below
 * 9e15: bounded below that, so the document's integer is one whatever way it is written. */
#define BIG 8999999999999999.0
#define I53 .min = -BIG, .max = BIG
#define STRING(k, req) {.key = k, .kind = BODY_STRING, .required = req}
#define BOOL(k) {.key = k, .kind = BODY_BOOL}
#define TYPE(literal) {.key = "type", .kind = BODY_STRING, .values = (const char *const[]){literal, NULL}}

/* user_metadata of sessions, models and loads: any JSON object; of saves: strings. */
#define METADATA {.key = "user_metadata", .kind = BODY_OBJECT}
static const struct body_rule STRINGS[] = {{.key = "*", .kind = BODY_STRING}, {.key = NULL}};
#define STRING_METADATA {.key = "user_metadata", .kind = BODY_OBJECT, .fields = STRINGS}

static const struct body_rule ITEM_STRING = {.kind = BODY_STRING};

const struct body_rule TINKER_CLIENT_CONFIG[] = {STRING("sdk_version", false), {.key = NULL}};

/* TelemetryBatch (not a strict type in the SDK: other keys are taken as JSON). smeltd drops it. */
static const struct body_rule EVENT = {.kind = BODY_OBJECT};
const struct body_rule TINKER_TELEMETRY[] = {
    {.key = "events", .kind = BODY_ARRAY, .items = &EVENT},
    STRING("platform", false),
    STRING("sdk_version", false),
    STRING("session_id", false),
    STRING("process_uuid", false),
    {.key = "*", .kind = BODY_JSON},
    {.key = NULL},
};

const struct body_rule TINKER_CREATE_SESSION[] = {
    {.key = "tags", .kind = BODY_ARRAY, .items = &ITEM_STRING},
    METADATA,
    STRING("sdk_version", false),
    STRING("project_id", false),
    STRING("display_name", false),
    TYPE("create_session"),
    {.key = NULL},
};

/* The SDK's close: why the session ended. smeltd keeps the session's models until idle release. */
static const struct body_rule FINISH_REASON[] = {
    {.key = "type", .kind = BODY_STRING, .required = true,
     .values = (const char *const[]){"success", "errored", "interrupted", NULL}},
    {.key = NULL},
};

const struct body_rule TINKER_FINISH_SESSION[] = {
    {.key = "reason", .kind = BODY_OBJECT, .fields = FINISH_REASON},
    STRING("detail", false),
    {.key = NULL},
};

const struct body_rule TINKER_HEARTBEAT[] = {STRING("session_id", true), TYPE("session_heartbeat"), {.key = NULL}};

/* train_attn, train_mlp and train_unembed all false train nothing. */
static int lora_trains_something(const json_t *v, const char *path, struct smelt_error *err) {
    static const char *const parts[] = {"train_attn", "train_mlp", "train_unembed"};
    for (int i = 0; i < 3; i++)
        if (!json_is_false(json_object_get(v, parts[i]))) return 0;
    return error_set_field(err, SMELT_EINVAL, path, "%s: train_attn, train_mlp and train_unembed are all false",
                           path);
}

static const struct body_rule LORA_CONFIG[] = {
    {.key = "rank", .kind = BODY_INT, .min = 1, .max = 4096},
    {.key = "seed", .kind = BODY_INT, .min = 0, .max = BIG},
    BOOL("train_unembed"),
    BOOL("train_mlp"),
    BOOL("train_attn"),
    {.key = NULL, .check = lora_trains_something},
};

/* smelt trains with AdamW: another optimizer is refused by name. */
static const struct body_rule OPTIMIZER_CONFIG[] = {
    {.key = "type", .kind = BODY_STRING, .required = true, .values = (const char *const[]){"adamw", NULL}},
    {.key = NULL},
};

const struct body_rule TINKER_CREATE_MODEL[] = {
    STRING("session_id", true),
    {.key = "model_seq_id", .kind = BODY_INT, .required = true, I32},
    STRING("base_model", true),
    METADATA,
    {.key = "lora_config", .kind = BODY_OBJECT, .required = true, .fields = LORA_CONFIG},
    {.key = "optimizer_config", .kind = BODY_OBJECT, .fields = OPTIMIZER_CONFIG},
    TYPE("create_model"),
    {.key = NULL},
};

const struct body_rule TINKER_GET_INFO[] = {STRING("model_id", true), TYPE("get_info"), {.key = NULL}};

#define SEQ_ID {.key = "seq_id", .kind = BODY_INT, .required = true, .min = 1, .max = INT32_MAX}

static const struct body_rule ADAM_PARAMS[] = {
    {.key = "learning_rate", .kind = BODY_NUMBER, .required = true, .min = 0, .max = 1e3},
    {.key = "beta1", .kind = BODY_NUMBER, .min = 0, .max = 0.999999},
    {.key = "beta2", .kind = BODY_NUMBER, .min = 0, .max = 0.999999999},
    {.key = "eps", .kind = BODY_NUMBER, .min = 0, .max = 1},
    {.key = "weight_decay", .kind = BODY_NUMBER, .min = 0, .max = 1e3},
    {.key = "grad_clip_norm", .kind = BODY_NUMBER, .min = 0, .max = 1e12},
    {.key = NULL},
};

/* The SDK's non-Adam optimizers' parameters. */
static int no_other_optimizer(const json_t *v, const char *path, struct smelt_error *err) {
    const char *type = json_string_value(json_object_get(v, "type"));
    return error_set_field(err, SMELT_EUNSUPPORTED, path, "%s: optimizer %.40s is not supported; smelt trains with "
                           "adamw (adam_params)", path, type ? type : "(none)");
}

const struct body_rule TINKER_OPTIM_STEP[] = {
    STRING("model_id", true),
    SEQ_ID,
    /* before adam_params, which such a request lacks: the refusal names the optimizer */
    {.key = "optimizer_params", .kind = BODY_JSON, .check = no_other_optimizer},
    {.key = "adam_params", .kind = BODY_OBJECT, .required = true, .fields = ADAM_PARAMS},
    TYPE("optim_step"),
    {.key = NULL},
};

/* A checkpoint name: 1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.'. */
static int checkpoint_name(const json_t *v, const char *path, struct smelt_error *err) {
    if (tinker_name_ok(json_string_value(v))) return 0;
    return error_set_field(err, SMELT_EINVAL, path, "%s: a checkpoint name of 1 to 64 characters from A-Z a-z 0-9 "
                           ". _ - (not starting with '.') is expected", path);
}

#define TTL {.key = "ttl_seconds", .kind = BODY_INT, I53}

const struct body_rule TINKER_SAVE_WEIGHTS[] = {
    STRING("model_id", true),
    {.key = "path", .kind = BODY_STRING, .required = true, .check = checkpoint_name},
    SEQ_ID,
    TTL,
    BOOL("overwrite"),
    STRING_METADATA,
    TYPE("save_weights"),
    {.key = NULL},
};

/* path (a checkpoint) or sampling_session_seq_id (a sampler made at once). */
static int names_a_sampler(const json_t *v, const char *path, struct smelt_error *err) {
    (void)path;
    if (json_is_string(json_object_get(v, "path")) || json_is_number(json_object_get(v, "sampling_session_seq_id")))
        return 0;
    return error_set_field(err, SMELT_EINVAL, "sampling_session_seq_id", "sampling_session_seq_id: required "
                           "without a path");
}

const struct body_rule TINKER_SAVE_FOR_SAMPLER[] = {
    STRING("model_id", true),
    {.key = "path", .kind = BODY_STRING, .check = checkpoint_name},
    {.key = "sampling_session_seq_id", .kind = BODY_INT, I32},
    {.key = "kind", .kind = BODY_STRING, .values = (const char *const[]){"snapshot", "inflight", NULL}},
    SEQ_ID,
    TTL,
    BOOL("overwrite"),
    STRING_METADATA,
    TYPE("save_weights_for_sampler"),
    {.key = NULL, .check = names_a_sampler},
};

/* A load into a model (model_id, its seq_id), or into a new one (session_id, model_seq_id). */
static int load_addressing(const json_t *v, const char *path, struct smelt_error *err) {
    (void)path;
    bool into_model = json_is_string(json_object_get(v, "model_id"));
    static const char *const model[] = {"seq_id", NULL}, *const new_model[] = {"session_id", "model_seq_id", NULL};
    for (const char *const *k = into_model ? model : new_model; *k; k++) {
        const json_t *x = json_object_get(v, *k);
        if (!x || json_is_null(x))
            return error_set_field(err, SMELT_EINVAL, *k, "%s: required %s", *k, into_model ? "with a model_id" :
                                   "without a model_id (a load into a new model)");
    }
    return 0;
}

const struct body_rule TINKER_LOAD_WEIGHTS[] = {
    STRING("model_id", false),
    {.key = "seq_id", .kind = BODY_INT, .min = 1, .max = INT32_MAX},
    STRING("session_id", false),
    {.key = "model_seq_id", .kind = BODY_INT, I32},
    STRING("base_model", false),
    METADATA,
    STRING("path", true),
    BOOL("optimizer"),
    {.key = "optimizer_config", .kind = BODY_OBJECT, .fields = OPTIMIZER_CONFIG},
    STRING("weights_access_token", false),
    TYPE("load_weights"),
    {.key = NULL, .check = load_addressing},
};

/* base_model or model_path. */
static int names_a_model(const json_t *v, const char *path, struct smelt_error *err) {
    (void)path;
    if (json_is_string(json_object_get(v, "base_model")) || json_is_string(json_object_get(v, "model_path")))
        return 0;
    return error_set_field(err, SMELT_EINVAL, "base_model", "base_model: required without a model_path");
}

const struct body_rule TINKER_CREATE_SAMPLER[] = {
    STRING("session_id", true),
    {.key = "sampling_session_seq_id", .kind = BODY_INT, .required = true, I32},
    STRING("base_model", false),
    STRING("model_path", false),
    TYPE("create_sampling_session"),
    {.key = NULL, .check = names_a_model},
};

/* sampling_params.stop: a string, strings, or token ids (not both). */
static int stop_of(const json_t *v, const char *path, struct smelt_error *err) {
    size_t i, strings = 0, ids = 0;
    json_t *item;
    if (json_is_string(v)) return 0;
    json_array_foreach(v, i, item) {
        strings += json_is_string(item);
        ids += body_integral(item) && json_number_value(item) >= 0 && json_number_value(item) <= INT32_MAX;
    }
    if (json_is_array(v) && (strings == json_array_size(v) || ids == json_array_size(v))) return 0;
    return error_set_field(err, SMELT_EINVAL, path, "%s: a string, strings or token ids (0 to 2147483647) are "
                           "expected", path);
}

static const struct body_rule SAMPLING_PARAMS[] = {
    {.key = "max_tokens", .kind = BODY_INT, .required = true, .min = 1, .max = INT32_MAX},
    {.key = "seed", .kind = BODY_INT, .min = -1, .max = BIG},
    {.key = "stop", .kind = BODY_JSON, .check = stop_of},
    {.key = "temperature", .kind = BODY_NUMBER, .min = 0, .max = 1e6},
    {.key = "top_k", .kind = BODY_INT, I53},
    {.key = "top_p", .kind = BODY_NUMBER, .min = 1e-9, .max = 1},
    {.key = NULL},
};

static const struct body_rule TOKEN = {.kind = BODY_INT, I32};

static int not_empty(const json_t *v, const char *path, struct smelt_error *err) {
    return json_array_size(v) ? 0 : error_set_field(err, SMELT_EINVAL, path, "%s: empty", path);
}

static const struct body_rule CHUNK_FIELDS[] = {
    {.key = "tokens", .kind = BODY_ARRAY, .required = true, .items = &TOKEN, .check = not_empty},
    TYPE("encoded_text"),
    {.key = NULL},
};

/* Text chunks only: an image chunk is refused by name. */
static int text_chunk(const json_t *v, const char *path, struct smelt_error *err) {
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !type || strcmp(type, "encoded_text") == 0) return 0;
    return error_set_field(err, SMELT_EUNSUPPORTED, path, "%s: %.40s chunks are not supported (text models only)",
                           path, type);
}

/* A chunk: an image chunk is named before its fields are looked at. */
static int chunk_of(const json_t *v, const char *path, struct smelt_error *err) {
    TRY(text_chunk(v, path, err));
    return body_check(v, CHUNK_FIELDS, path, err);
}

static const struct body_rule CHUNK = {.kind = BODY_JSON, .check = chunk_of};

static const struct body_rule PROMPT[] = {
    {.key = "chunks", .kind = BODY_ARRAY, .required = true, .items = &CHUNK, .check = not_empty},
    {.key = NULL},
};

/* What the SDK can ask of a sample that smelt does not compute: refused by name (the SDK
 * sends 0 / false / nothing by default). */
static int zero_only(const json_t *v, const char *path, struct smelt_error *err) {
    if (json_is_number(v) && json_number_value(v) == 0) return 0; /* 0.0 is 0 too */
    return error_set_field(err, SMELT_EUNSUPPORTED, path, "%s: not supported by smelt (give 0)", path);
}

static int never(const json_t *v, const char *path, struct smelt_error *err) {
    (void)v;
    return error_set_field(err, SMELT_EUNSUPPORTED, path, "%s: not supported by smelt", path);
}

static int false_only(const json_t *v, const char *path, struct smelt_error *err) {
    if (json_is_false(v)) return 0;
    if (!json_is_true(v)) return error_set_field(err, SMELT_EINVAL, path, "%s: true or false is expected", path);
    return error_set_field(err, SMELT_EUNSUPPORTED, path, "%s: not supported by smelt (stable_reinforce is not)",
                           path);
}

const struct body_rule TINKER_SAMPLE[] = {
    {.key = "num_samples", .kind = BODY_INT, .min = 1, .max = 256},
    {.key = "prompt", .kind = BODY_OBJECT, .required = true, .fields = PROMPT},
    {.key = "sampling_params", .kind = BODY_OBJECT, .required = true, .fields = SAMPLING_PARAMS},
    STRING("base_model", false),
    STRING("model_path", false),
    STRING("sampling_session_id", true),
    {.key = "seq_id", .kind = BODY_INT, .min = 0, .max = BIG},
    BOOL("prompt_logprobs"),
    {.key = "topk_prompt_logprobs", .kind = BODY_INT, .min = 0, .max = TINKER_MAX_TOPK},
    {.key = "topk_sample_logprobs", .kind = BODY_JSON, .check = zero_only},
    {.key = "target_prompt_logprobs", .kind = BODY_JSON, .check = never},
    {.key = "prompt_alt_tokens_k", .kind = BODY_JSON, .check = zero_only},
    {.key = "prompt_logprobs_last_n", .kind = BODY_JSON, .check = never},
    {.key = "record_stability_info", .kind = BODY_JSON, .check = false_only},
    TYPE("sample"),
    {.key = NULL},
};

const struct body_rule TINKER_RETRIEVE_FUTURE[] = {
    STRING("request_id", true),
    BOOL("allow_metadata_only"),
    {.key = NULL},
};

const struct body_rule TINKER_CANCEL_FUTURE[] = {STRING("request_id", true), {.key = NULL}};

const struct body_rule TINKER_WEIGHTS_INFO[] = {STRING("tinker_path", true), {.key = NULL}};

