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
#include "tests/unit/testutil.h"

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

/* sft.bin repacked with n copies of its first datum, decoded. */
static int decode_copies(size_t n, struct tinker_fwdbwd *r, struct smelt_error *err) {
    char *body = NULL;
    size_t len = 0;
    struct smelt_error ferr = {0};
    cr_assert_eq(file_read_all("tests/data/tinker/sft.bin", &body, &len, &ferr), 0, "%s", ferr.message);
    TinkerPublic__ForwardBackwardRequest *m =
        tinker_public__forward_backward_request__unpack(NULL, len, (const uint8_t *)body);
    cr_assert(m);
    TinkerPublic__Datum **own = m->data, **copies = calloc(n, sizeof *copies);
    size_t own_n = m->n_data;
    cr_assert(copies);
    for (size_t i = 0; i < n; i++) copies[i] = own[0];
    m->data = copies, m->n_data = n;
    size_t bytes = tinker_public__forward_backward_request__get_packed_size(m);
    uint8_t *buf = malloc(bytes);
    cr_assert(buf);
    tinker_public__forward_backward_request__pack(m, buf);
    m->data = own, m->n_data = own_n;
    tinker_public__forward_backward_request__free_unpacked(m, NULL);
    free(copies);
    free(body);
    int rc = tinker_fwdbwd_decode(buf, bytes, r, err);
    free(buf);
    return rc;
}

Test(tinker_proto, more_datums_than_the_worker_reads_are_refused) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_copies(4096, &r, &err), 0, "%s", err.message);
    cr_assert_eq(json_array_size(json_object_get(r.header, "data")), 4096);
    tinker_fwdbwd_free(&r);
    cr_assert_eq(decode_copies(4097, &r, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "data");
    cr_assert(strstr(err.message, "4097"), "%s", err.message);
    cr_assert_str_eq(r.model_id, "sess-1:train:0"); /* kept: the caller passes the seq over */
    cr_assert_eq(r.seq_id, 1);
    tinker_fwdbwd_free(&r);
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

/* ppo.bin with one field edited, repacked and decoded (found by tests/fuzz/fuzz_tinker_proto). */
static int decode_edited(void (*edit)(TinkerPublic__ForwardBackwardRequest *m, bool undo), struct tinker_fwdbwd *r,
                         struct smelt_error *err) {
    char *body = NULL;
    size_t len = 0;
    struct smelt_error ferr = {0};
    cr_assert_eq(file_read_all("tests/data/tinker/ppo.bin", &body, &len, &ferr), 0, "%s", ferr.message);
    TinkerPublic__ForwardBackwardRequest *m =
        tinker_public__forward_backward_request__unpack(NULL, len, (const uint8_t *)body);
    cr_assert(m);
    edit(m, false);
    size_t bytes = tinker_public__forward_backward_request__get_packed_size(m);
    uint8_t *buf = malloc(bytes);
    cr_assert(buf);
    tinker_public__forward_backward_request__pack(m, buf);
    edit(m, true); /* what free_unpacked frees is the message's own again */
    tinker_public__forward_backward_request__free_unpacked(m, NULL);
    free(body);
    int rc = tinker_fwdbwd_decode(buf, bytes, r, err);
    free(buf);
    return rc;
}

static void model_id_not_utf8(TinkerPublic__ForwardBackwardRequest *m, bool undo) {
    static char *own;
    static char bad[] = "\x93\xd9" "1";
    if (!undo) own = m->model_id, m->model_id = bad;
    else m->model_id = own;
}

static void config_nan(TinkerPublic__ForwardBackwardRequest *m, bool undo) {
    static double own;
    cr_assert(m->n_loss_fn_config_v2 > 0);
    double *v = &m->loss_fn_config_v2[0]->value->number;
    if (!undo) own = *v, *v = NAN;
    else *v = own;
}

static void legacy_config_infinite(TinkerPublic__ForwardBackwardRequest *m, bool undo) {
    static size_t n_v2;
    cr_assert(m->n_loss_fn_config > 0);
    if (!undo) n_v2 = m->n_loss_fn_config_v2, m->n_loss_fn_config_v2 = 0, m->loss_fn_config[0]->value = INFINITY;
    else m->n_loss_fn_config_v2 = n_v2;
}

/* A model_id that is not UTF-8 was refused as "out of memory" (json_pack refuses it), and a
 * NaN or infinite loss_fn_config value was dropped from the header without a word. */
Test(tinker_proto, model_id_not_utf8_and_non_finite_config_are_refused_by_name) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    cr_assert_eq(decode_edited(model_id_not_utf8, &r, &err), SMELT_EINVAL, "%s", err.message);
    cr_assert_str_eq(err.field, "model_id");
    cr_assert(strstr(err.message, "not UTF-8"), "%s", err.message);
    cr_assert_null(r.header);
    cr_assert_eq(decode_edited(config_nan, &r, &err), SMELT_EINVAL, "%s", err.message);
    cr_assert_str_eq(err.field, "loss_fn_config");
    cr_assert(strstr(err.message, "not a finite number"), "%s", err.message);
    cr_assert_eq(decode_edited(legacy_config_infinite, &r, &err), SMELT_EINVAL, "%s", err.message);
    cr_assert_str_eq(err.field, "loss_fn_config");
    cr_assert(strstr(err.message, "inf is not a finite number"), "%s", err.message);
    cr_assert_str_eq(r.model_id, "sess-1:train:0"); /* kept for the caller, as with other refusals */
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

/* ---- results: worker tinker.result → stored SDK objects → protobuf ---- */

static void array_of(struct msg *m, const void *data, size_t bytes) {
    m->arrays[m->n_arrays].data = malloc(bytes ? bytes : 1);
    cr_assert(m->arrays[m->n_arrays].data);
    memcpy(m->arrays[m->n_arrays].data, data, bytes);
    m->arrays[m->n_arrays++].bytes = bytes;
}

/* A forward_backward result of two datums (2 and 1 tokens), logprobs only. */
static void fwdbwd_result(struct msg *m, const char *id, const float *logprobs) {
    memset(m, 0, sizeof *m);
    m->header = json_pack("{s:i, s:s, s:b, s:{s:{s:f, s:f}, s:[[[s,i]],[[s,i]]]}}", "v", 1, "id", id, "ok", 1,
                          "result", "metrics", "loss:sum", 2.5, "tokens:sum", 3.0, "outputs", "logprobs", 2,
                          "logprobs", 1);
    array_of(m, logprobs, 3 * sizeof(float));
}

Test(tinker_result, forward_backward_round_trips_bit_exact_through_protobuf) {
    const float lp[3] = {-0.123456789f, -1e-30f, -17.000001f};
    struct msg m;
    struct smelt_error err = {0};
    fwdbwd_result(&m, "fut-1", lp);
    json_t *obj = NULL;
    cr_assert_eq(tinker_result_object("forward_backward", NULL, &m, &obj, &err), 0, "%s", err.message);
    char *text = json_dumps(obj, JSON_COMPACT); /* as stored */
    json_t *back = json_loads(text, 0, NULL);
    uint8_t *buf = NULL;
    size_t len = 0;
    cr_assert(tinker_op_is_proto("forward_backward"));
    cr_assert_eq(tinker_result_proto("forward_backward", back, &buf, &len, &err), 0, "%s", err.message);
    TinkerPublic__ForwardBackwardOutput *o = tinker_public__forward_backward_output__unpack(NULL, len, buf);
    cr_assert(o);
    cr_assert_str_eq(o->loss_fn_output_type, "ArrayRecord");
    cr_assert_eq(o->n_loss_fn_outputs, 1);
    TinkerPublic__ArrayRecord *r = o->loss_fn_outputs[0];
    cr_assert_eq(r->num_datums, 2);
    cr_assert_eq(r->n_fields, 1);
    cr_assert_str_eq(r->fields[0]->key, "logprobs");
    TinkerPublic__BatchedTensor *t = r->fields[0]->value;
    cr_assert_eq(t->dtype, TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32);
    cr_assert_eq(t->data.len, 12);
    cr_assert_eq(memcmp(t->data.data, lp, 12), 0, "logprobs must come back bit for bit");
    int64_t offs[3];
    cr_assert_eq(t->offsets.len, sizeof offs);
    memcpy(offs, t->offsets.data, sizeof offs);
    cr_assert(offs[0] == 0 && offs[1] == 8 && offs[2] == 12);
    cr_assert_eq(o->n_metrics, 2);
    tinker_public__forward_backward_output__free_unpacked(o, NULL);
    free(buf), free(text), json_decref(back), json_decref(obj), msg_free(&m);
}

Test(tinker_result, malformed_worker_results_are_refused) {
    const float lp[3] = {0};
    struct msg m;
    struct smelt_error err = {0};
    json_t *obj = NULL;
    fwdbwd_result(&m, "fut-1", lp);
    m.arrays[0].bytes = 8; /* fewer values than outputs claim */
    cr_assert_eq(tinker_result_object("forward", NULL, &m, &obj, &err), SMELT_EFORMAT);
    cr_assert_str_eq(err.field, "result.outputs");
    m.arrays[0].bytes = 12;
    json_object_set_new(json_object_get(json_object_get(m.header, "result"), "metrics"), "loss", json_real(1));
    cr_assert_eq(tinker_result_object("forward", NULL, &m, &obj, &err), SMELT_EFORMAT); /* no ':' */
    cr_assert_str_eq(err.field, "result.metrics");
    msg_free(&m);
}

Test(tinker_result, sample_keeps_tokens_logprobs_and_prompt_nan) {
    struct msg m = {0};
    struct smelt_error err = {0};
    m.header = json_pack("{s:s, s:b, s:{s:[{s:i, s:s}, {s:i, s:s}]}}", "id", "fut-2", "ok", 1, "result", "sequences",
                         "n_tokens", 2, "stop_reason", "stop", "n_tokens", 1, "stop_reason", "length");
    const int32_t toks[3] = {5, 6, 7};
    const float lps[3] = {-0.5f, -0.25f, -3.3333333f}, prompt[2] = {NAN, -1.75f};
    array_of(&m, toks, sizeof toks);
    array_of(&m, lps, sizeof lps);
    array_of(&m, prompt, sizeof prompt);
    json_t *obj = NULL;
    cr_assert_eq(tinker_result_object("sample", NULL, &m, &obj, &err), 0, "%s", err.message);
    cr_assert(json_is_null(json_array_get(json_object_get(obj, "prompt_logprobs"), 0)));
    uint8_t *buf = NULL;
    size_t len = 0;
    cr_assert_eq(tinker_result_proto("sample", obj, &buf, &len, &err), 0, "%s", err.message);
    TinkerPublic__SampleResponse *o = tinker_public__sample_response__unpack(NULL, len, buf);
    cr_assert(o);
    cr_assert_eq(o->n_sequences, 2);
    cr_assert_eq(o->sequences[1]->stop_reason, TINKER_PUBLIC__STOP_REASON__STOP_REASON_LENGTH);
    cr_assert_eq(o->sequences[0]->tokens.len, 8);
    cr_assert_eq(memcmp(o->sequences[0]->tokens.data, toks, 8), 0);
    cr_assert_eq(memcmp(o->sequences[1]->logprobs.data, &lps[2], 4), 0);
    cr_assert_eq(o->_prompt_logprobs_case, TINKER_PUBLIC__SAMPLE_RESPONSE___PROMPT_LOGPROBS_PROMPT_LOGPROBS);
    float p[2];
    memcpy(p, o->prompt_logprobs.data, 8);
    cr_assert(isnan(p[0]) && p[1] == -1.75f);
    tinker_public__sample_response__free_unpacked(o, NULL);
    free(buf), json_decref(obj), msg_free(&m);
}

/* ---- futures in the store ---- */

static struct store *open_store(void) {
    char path[256];
    struct store *st = NULL;
    struct smelt_error err = {0};
    TEST_OK(store_open(test_tmp_path(path, sizeof path, "smelt.db"), &st, &err), &err);
    return st;
}

static json_t *future_row(struct store_conn *c, const char *id) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    TEST_OK(store_query_one(c, &row, &err, "SELECT status, result AS result__json, error AS error__json FROM tinker_futures WHERE id = ?",
                            "s", id), &err);
    return row;
}

Test(tinker_futures, complete_stores_the_result_once, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct store *st = open_store();
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(st, &err);
    char id[64];
    TEST_OK(tinker_future_create(c, "proj-a", "sess-1:train:0", "ftjob-1", "forward_backward", id, sizeof id, &err),
            &err);
    cr_assert(strncmp(id, "fut-", 4) == 0 && strlen(id) == 28, "%s", id);
    const float lp[3] = {-1, -2, -3};
    struct msg m;
    fwdbwd_result(&m, id, lp);
    TEST_OK(tinker_future_complete(NULL, c, &m, &err), &err);
    json_t *row = future_row(c, id);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "done");
    json_t *out = json_object_get(json_object_get(row, "result"), "loss_fn_outputs");
    cr_assert_eq(json_real_value(json_array_get(
                     json_object_get(json_object_get(json_array_get(out, 1), "logprobs"), "data"), 0)), -3.0);
    json_decref(row);
    TEST_EXPECT_ERROR(tinker_future_complete(NULL, c, &m, &err), SMELT_ENOTFOUND, &err);
    msg_free(&m);
    store_release(st, c);
    store_close(st);
}

Test(tinker_futures, failures_keep_the_workers_message_and_category, .init = test_tmp_setup,
     .fini = test_tmp_teardown) {
    struct store *st = open_store();
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(st, &err);
    char a[64], b[64], other[64];
    TEST_OK(tinker_future_create(c, "p", "m1", "job-1", "optim_step", a, sizeof a, &err), &err);
    TEST_OK(tinker_future_create(c, "p", "m1", "job-1", "optim_step", b, sizeof b, &err), &err);
    TEST_OK(tinker_future_create(c, "p", "m2", "job-2", "optim_step", other, sizeof other, &err), &err);
    cr_assert_eq(store_exec(c, &err, "INSERT INTO tinker_models (id, project_id, session_id, job_id, base_model, "
                            "base_dir, lora, created_at) VALUES ('m1', 'p', 's', 'job-1', 'tiny', '/x', '{}', 0)", ""),
                 1, "%s", err.message);
    struct msg m = {0};
    m.header = json_pack("{s:s, s:b, s:{s:s, s:s, s:s}}", "id", a, "ok", 0, "error", "message",
                         "adam.learning_rate: must be > 0", "field", "adam.learning_rate", "category", "user");
    TEST_OK(tinker_future_complete(NULL, c, &m, &err), &err);
    json_t *row = future_row(c, a);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "failed");
    json_t *e = json_object_get(row, "error");
    cr_assert_str_eq(json_string_value(json_object_get(e, "error")), "adam.learning_rate: must be > 0");
    cr_assert_str_eq(json_string_value(json_object_get(e, "category")), "user");
    json_decref(row);
    struct server no_http = {0}; /* no HTTP server: no poll to wake */
    TEST_OK(tinker_futures_fail_job(&no_http, c, "job-1", "the session worker ended (exit 137)", &err), &err);
    row = future_row(c, b);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "failed");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(row, "error"), "category")), "server");
    json_decref(row);
    row = future_row(c, other);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "pending");
    json_decref(row);
    TEST_OK(store_query_one(c, &row, &err, "SELECT status FROM tinker_models WHERE id = 'm1'", ""), &err);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "lost");
    json_decref(row);
    msg_free(&m);
    store_release(st, c);
    store_close(st);
}

/* A save's future as api_tinker_train.c makes it: the checkpoint rides in the partial result. */
static void save_future(struct store_conn *c, const char *op, const char *kind, const char *name, char *id,
                        size_t cap) {
    struct smelt_error err = {0};
    TEST_OK(tinker_future_create(c, "p", "m1", "job-1", op, id, cap, &err), &err);
    char tpath[128];
    snprintf(tpath, sizeof tpath, "tinker://m1/%s/%s", strcmp(kind, "sampler") == 0 ? "sampler_weights" : "weights",
             name);
    json_t *base = json_pack("{s:s, s:s, s:{s:s, s:s, s:s, s:s}}", "type", op, "path", tpath,
                             TINKER_FUTURE_CHECKPOINT, "kind", kind, "name", name, "dir", "/data/x", "base_model",
                             "tiny");
    cr_assert_eq(store_exec(c, &err, "UPDATE tinker_futures SET result = ? WHERE id = ?", "js", base, id), 1, "%s",
                 err.message);
    json_decref(base);
}

static void save_answer(struct store_conn *c, const char *id, bool ok) {
    struct msg m = {0};
    m.header = ok ? json_pack("{s:s, s:b, s:{}}", "id", id, "ok", 1, "result")
                  : json_pack("{s:s, s:b, s:{s:s, s:s}}", "id", id, "ok", 0, "error", "message", "disk full",
                              "category", "server");
    struct smelt_error err = {0};
    TEST_OK(tinker_future_complete(NULL, c, &m, &err), &err);
    msg_free(&m);
}

static long long count_of(struct store_conn *c, const char *sql) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    TEST_OK(store_query_one(c, &row, &err, sql, ""), &err);
    long long n = json_integer_value(json_object_get(row, "n"));
    json_decref(row);
    return n;
}

Test(tinker_futures, a_save_is_listed_only_once_it_succeeded, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct store *st = open_store();
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(st, &err);
    char good[64], bad[64], sampler[64], bad_sampler[64];
    save_future(c, "save_weights", "training", "ok1", good, sizeof good);
    save_future(c, "save_weights", "training", "broken", bad, sizeof bad);
    save_future(c, "save_weights_for_sampler", "sampler", "s1", sampler, sizeof sampler);
    save_future(c, "save_weights_for_sampler", "sampler", "s2", bad_sampler, sizeof bad_sampler);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM tinker_checkpoints"), 0, "listed before the worker saved");
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM models"), 0);

    save_answer(c, good, true);
    save_answer(c, bad, false);
    save_answer(c, sampler, true);
    save_answer(c, bad_sampler, false);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM tinker_checkpoints"), 2);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM tinker_checkpoints WHERE id = 'tinker://m1/weights/ok1' AND "
                          "kind = 'training' AND name = 'ok1' AND path = '/data/x' AND project_id = 'p'"), 1);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM tinker_checkpoints WHERE id = "
                          "'tinker://m1/sampler_weights/s1' AND kind = 'sampler'"), 1);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM models"), 1);
    cr_assert_eq(count_of(c, "SELECT count(*) AS n FROM models WHERE id = 'ft:tinker:m1:s1' AND job_id = 'job-1' AND "
                          "kind = 'lora' AND base_model = 'tiny'"), 1);

    /* The SDK's result is the save's answer without the checkpoint smeltd kept in it. */
    json_t *row = future_row(c, good);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "done");
    json_t *result = json_object_get(row, "result");
    cr_assert_str_eq(json_string_value(json_object_get(result, "path")), "tinker://m1/weights/ok1");
    cr_assert_str_eq(json_string_value(json_object_get(result, "type")), "save_weights");
    cr_assert_null(json_object_get(result, TINKER_FUTURE_CHECKPOINT));
    json_decref(row);
    row = future_row(c, bad);
    cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "failed");
    json_decref(row);
    store_release(st, c);
    store_close(st);
}
