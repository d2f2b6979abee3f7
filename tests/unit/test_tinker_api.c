/* The Tinker API's conversions (server/tinker_proto.c, server/tinker_result.c): bodies
 * the official SDK encoded (tests/data/tinker/, tests/tools/make_tinker_bodies.py) →
 * msg.h's tinker.request, refusals named by field, and worker results → the SDK's
 * result objects. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker.pb-c.h"
#include "server/tinker_api.h"

static int decode_file(const char *name, struct tinker_fwdbwd *r, struct smelt_error *err) {
    char path[256], *body = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "tests/data/tinker/%s", name);
    struct smelt_error ferr = {0};
    cr_assert_eq(file_read_all(path, &body, &len, &ferr), 0, "%s", ferr.message);
    int rc = tinker_fwdbwd_decode(body, len, r, err);
    free(body);
    return rc;
}

static int32_t i32_at(const struct msg_array *a, size_t i) {
    int32_t v;
    memcpy(&v, (const uint8_t *)a->data + i * 4, 4);
    return v;
}

static float f32_at(const struct msg_array *a, size_t i) {
    float v;
    memcpy(&v, (const uint8_t *)a->data + i * 4, 4);
    return v;
}

Test(tinker_proto, sft_body_becomes_the_request_header_and_frames) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_file("sft.bin", &r, &err), 0, "%s", err.message);
    cr_assert_str_eq(r.model_id, "sess-1:train:0");
    cr_assert_eq(r.seq_id, 1);
    cr_assert_str_eq(json_string_value(json_object_get(r.header, "op")), "forward_backward");
    cr_assert_str_eq(json_string_value(json_object_get(r.header, "loss_fn")), "cross_entropy");
    json_t *data = json_object_get(r.header, "data");
    cr_assert_eq(json_array_size(data), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(data, 1), "n_tokens")), 3);
    json_t *w1 = json_object_get(json_object_get(json_array_get(data, 1), "inputs"), "weights");
    cr_assert_str_eq(json_string_value(json_object_get(w1, "dtype")), "float32");
    cr_assert_eq(json_integer_value(json_object_get(w1, "offset")), 4);
    json_t *t1 = json_object_get(json_object_get(json_array_get(data, 1), "inputs"), "target_tokens");
    cr_assert_eq(json_integer_value(json_object_get(t1, "offset")), 4);
    cr_assert_eq(r.arrays[0].bytes, 7 * 4);
    int32_t tokens[] = {1, 2, 3, 4, 7, 8, 9}, targets[] = {2, 3, 4, 5, 8, 9, 10};
    float weights[] = {0, 1, 1, 1, 1, 0.5f, 0.25f};
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(i32_at(&r.arrays[0], i), tokens[i]);
        cr_assert_eq(i32_at(&r.arrays[1], i), targets[i]);
        cr_assert_eq(f32_at(&r.arrays[2], i), weights[i]);
    }
    cr_assert_eq(tinker_fwdbwd_check_tokens(&r, 11, &err), 0, "%s", err.message);
    cr_assert_eq(tinker_fwdbwd_check_tokens(&r, 10, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "data[1].loss_fn_inputs.target_tokens");
    cr_assert(strstr(err.message, "[2]: token id 10"), "%s", err.message);
    tinker_fwdbwd_free(&r);
}

Test(tinker_proto, forward_only_and_ppo_config) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_file("forward.bin", &r, &err), 0, "%s", err.message);
    cr_assert_str_eq(json_string_value(json_object_get(r.header, "op")), "forward");
    cr_assert_eq(r.seq_id, 4);
    tinker_fwdbwd_free(&r);
    cr_assert_eq(decode_file("ppo.bin", &r, &err), 0, "%s", err.message);
    json_t *config = json_object_get(r.header, "loss_fn_config");
    cr_assert_float_eq(json_real_value(json_object_get(config, "clip_low_threshold")), 0.8, 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(config, "clip_high_threshold")), 1.2, 1e-12);
    json_t *inputs = json_object_get(json_array_get(json_object_get(r.header, "data"), 0), "inputs");
    cr_assert_eq(json_object_size(inputs), 3);
    cr_assert_eq(r.arrays[2].bytes, 6 * 4); /* logprobs + advantages */
    cr_assert_eq(f32_at(&r.arrays[2], 2), -2.0f);
    tinker_fwdbwd_free(&r);
}

static void refused(const char *file, int code, const char *field, const char *words) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_file(file, &r, &err), code, "%s: %s", file, err.message);
    cr_assert_str_eq(err.field, field, "%s: %s", file, err.message);
    cr_assert(strstr(err.message, words), "%s: %s", file, err.message);
    cr_assert_null(r.header);
}

Test(tinker_proto, bad_bodies_are_refused_by_name) {
    refused("bad_length.bin", SMELT_EINVAL, "data[2].loss_fn_inputs.weights", "1 values, model_input has 2");
    refused("wrong_dtype.bin", SMELT_EINVAL, "data[0].loss_fn_inputs.weights", "dtype must be float32");
    refused("unknown_loss.bin", SMELT_EINVAL, "loss_fn", "unknown loss 'fancy_loss'");
    refused("custom_loss.bin", SMELT_EUNSUPPORTED, "loss_fn", "server-side custom losses");
    refused("ppo_unknown_config.bin", SMELT_EINVAL, "loss_fn_config", "loss_fn_config.epsilon");
    refused("ppo_text_config.bin", SMELT_EINVAL, "loss_fn_config", "must be a number");
    refused("image.bin", SMELT_EUNSUPPORTED, "data[0].model_input[1]", "images are not supported");
    refused("extra_input.bin", SMELT_EINVAL, "data[0].loss_fn_inputs.advantages", "not an input of loss_fn");
}

Test(tinker_proto, malformed_protobuf_is_refused) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    const char junk[] = "\x0a\xff\xff\xff\xff\x0f not a message";
    cr_assert_eq(tinker_fwdbwd_decode(junk, sizeof junk - 1, &r, &err), SMELT_EFORMAT);
    cr_assert(strstr(err.message, "ForwardBackwardRequest"), "%s", err.message);
    cr_assert_eq(tinker_fwdbwd_decode("", 0, &r, &err), SMELT_EINVAL); /* empty message: no model_id */
    cr_assert_str_eq(err.field, "model_id");
}

Test(tinker_proto, vocabulary_bound_applies_to_input_tokens) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_file("big_token.bin", &r, &err), 0, "%s", err.message);
    cr_assert_eq(tinker_fwdbwd_check_tokens(&r, 1000, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "data[0].loss_fn_inputs.target_tokens");
    cr_assert_eq(tinker_fwdbwd_check_tokens(&r, 1001, &err), 0);
    cr_assert_eq(tinker_fwdbwd_check_tokens(&r, 2, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "data[0].model_input");
    tinker_fwdbwd_free(&r);
}
