/* The SDK's ForwardBackwardRequest (protobuf, server/tinker.proto) → msg.h's
 * tinker.request for forward / forward_backward, every field checked on the way so that
 * a bad request is refused on the HTTP thread, naming the field. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker.pb-c.h"
#include "server/tinker_api.h"

/* The worker reads at most this many datums and a header of MSG_MAX_HEADER_BYTES (less room for the "v" and
 * "id" the dispatcher adds): a bigger request would never be answered, so it is refused here. */
#define FWDBWD_MAX_DATA 4096
#define FWDBWD_HEADER_ROOM 256

/* What each loss reads (msg.h: inputs per datum) and which loss_fn_config keys it takes. */
struct loss_spec {
    const char *name;
    const char *inputs[4];
    const char *config[3];
};
static const struct loss_spec LOSSES[] = {
    {"cross_entropy", {"target_tokens", "weights", NULL}, {NULL}},
    {"importance_sampling", {"target_tokens", "logprobs", "advantages", NULL}, {NULL}},
    {"ppo", {"target_tokens", "logprobs", "advantages", NULL}, {"clip_low_threshold", "clip_high_threshold", NULL}},
    {"cispo", {"target_tokens", "logprobs", "advantages", NULL}, {"clip_low_threshold", "clip_high_threshold", NULL}},
    {"dro", {"target_tokens", "logprobs", "advantages", NULL}, {"beta", NULL}},
};
#define N_LOSSES ((int)(sizeof LOSSES / sizeof LOSSES[0]))

static bool in_list(const char *const *list, const char *name) {
    for (; *list; list++)
        if (strcmp(*list, name) == 0) return true;
    return false;
}

/* A growable little-endian array (one frame). */
struct frame {
    uint8_t *data;
    size_t bytes, cap;
};

static int frame_append(struct frame *f, const void *src, size_t n, struct smelt_error *err) {
    if (f->bytes + n > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->bytes + n) cap *= 2;
        uint8_t *p = realloc(f->data, cap);
        if (!p) return error_set(err, SMELT_ENOMEM, "out of memory decoding the request");
        f->data = p;
        f->cap = cap;
    }
    if (n) memcpy(f->data + f->bytes, src, n);
    f->bytes += n;
    return 0;
}

static const struct loss_spec *loss_lookup(const char *name, struct smelt_error *err) {
    for (int i = 0; i < N_LOSSES; i++)
        if (strcmp(LOSSES[i].name, name) == 0) return &LOSSES[i];
    if (strcmp(name, "custom") == 0)
        error_set_field(err, SMELT_EUNSUPPORTED, "loss_fn",
                        "loss_fn: server-side custom losses are not supported by smelt (use "
                        "forward_backward_custom, which runs the loss client-side)");
    else
        error_set_field(err, SMELT_EINVAL, "loss_fn",
                        "loss_fn: unknown loss '%s' (smelt supports cross_entropy, importance_sampling, ppo, "
                        "cispo, dro)", name);
    return NULL;
}

/* A setting's value must be finite: jansson has no NaN or infinity (json_real gives NULL),
 * so one would be dropped without a word and the loss would run with its default. */
static int finite_setting(const char *key, double value, struct smelt_error *err) {
    if (isfinite(value)) return 0;
    return error_set_field(err, SMELT_EINVAL, "loss_fn_config", "loss_fn_config.%s: %g is not a finite number",
                           key, value);
}

/* loss_fn_config from the v2 map when the SDK sent one (it dual-writes numbers), else the
 * legacy map; keys the loss does not take are refused. */
static int config_object(const TinkerPublic__ForwardBackwardRequest *m, const struct loss_spec *loss,
                         json_t *config, struct smelt_error *err) {
    for (size_t i = 0; i < m->n_loss_fn_config_v2; i++) {
        const char *k = m->loss_fn_config_v2[i]->key;
        const TinkerPublic__LossConfigValue *v = m->loss_fn_config_v2[i]->value;
        if (!in_list(loss->config, k))
            return error_set_field(err, SMELT_EINVAL, "loss_fn_config",
                                   "loss_fn_config.%s: not a setting of loss_fn %s", k, loss->name);
        if (!v || v->value_case != TINKER_PUBLIC__LOSS_CONFIG_VALUE__VALUE_NUMBER)
            return error_set_field(err, SMELT_EINVAL, "loss_fn_config",
                                   "loss_fn_config.%s: must be a number", k);
        TRY(finite_setting(k, v->number, err));
        json_object_set_new(config, k, json_real(v->number));
    }
    for (size_t i = 0; m->n_loss_fn_config_v2 == 0 && i < m->n_loss_fn_config; i++) {
        const char *k = m->loss_fn_config[i]->key;
        if (!in_list(loss->config, k))
            return error_set_field(err, SMELT_EINVAL, "loss_fn_config",
                                   "loss_fn_config.%s: not a setting of loss_fn %s", k, loss->name);
        TRY(finite_setting(k, m->loss_fn_config[i]->value, err));
        json_object_set_new(config, k, json_real(m->loss_fn_config[i]->value));
    }
    return 0;
}

/* The datum's input tokens (its chunks concatenated) appended to tokens; *n gets their count. */
static int datum_tokens(const TinkerPublic__Datum *d, size_t di, struct frame *tokens, int64_t *n,
                        struct smelt_error *err) {
    char field[64];
    *n = 0;
    for (size_t c = 0; c < d->n_model_input; c++) {
        const TinkerPublic__Chunk *ch = d->model_input[c];
        snprintf(field, sizeof field, "data[%zu].model_input[%zu]", di, c);
        if (ch->chunk_case == TINKER_PUBLIC__CHUNK__CHUNK_IMAGE)
            return error_set_field(err, SMELT_EUNSUPPORTED, field, "%s: images are not supported", field);
        if (ch->chunk_case != TINKER_PUBLIC__CHUNK__CHUNK_ENCODED_TEXT)
            return error_set_field(err, SMELT_EUNSUPPORTED, field,
                                   "%s: only encoded_text chunks are supported", field);
        ProtobufCBinaryData t = ch->encoded_text->tokens;
        if (t.len % 4)
            return error_set_field(err, SMELT_EINVAL, field, "%s.tokens: %zu bytes, not whole int32 values",
                                   field, t.len);
        TRY(frame_append(tokens, t.data, t.len, err));
        *n += (int64_t)(t.len / 4);
    }
    if (*n == 0) {
        snprintf(field, sizeof field, "data[%zu].model_input", di);
        return error_set_field(err, SMELT_EINVAL, field, "%s: no tokens", field);
    }
    return 0;
}

/* One loss_fn_inputs tensor: dtype as the loss needs, 1-D of n values, dense; its values
 * appended to ints (int64 → int32) or floats. *spec gets {dtype, shape, offset}. */
static int datum_input(const char *field, const char *name, const TinkerPublic__Tensor *t, int64_t n,
                       struct frame *ints, struct frame *floats, json_t **spec, struct smelt_error *err) {
    bool want_int = strcmp(name, "target_tokens") == 0;
    TinkerPublic__DType want = want_int ? TINKER_PUBLIC__DTYPE__DTYPE_INT64 : TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
    if (t->dtype != want)
        return error_set_field(err, SMELT_EINVAL, field, "%s: dtype must be %s", field,
                               want_int ? "int64" : "float32");
    if (t->encoding_case != TINKER_PUBLIC__TENSOR__ENCODING_DENSE)
        return error_set_field(err, SMELT_EUNSUPPORTED, field, "%s: only dense 1-D tensors are supported", field);
    size_t elem = want_int ? 8 : 4;
    if (t->dense.len != (size_t)n * elem)
        return error_set_field(err, SMELT_EINVAL, field, "%s: %zu values, model_input has %lld tokens", field,
                               t->dense.len / elem, (long long)n);
    if (t->n_shape > 1 || (t->n_shape == 1 && t->shape[0] != n))
        return error_set_field(err, SMELT_EINVAL, field,
                               "%s: shape must be [%lld] (1-D, the length of model_input)", field, (long long)n);
    size_t offset = want_int ? ints->bytes / 4 : floats->bytes / 4;
    if (want_int) {
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, t->dense.data + i * 8, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return error_set_field(err, SMELT_EINVAL, field, "%s[%lld]: %lld is out of range", field,
                                       (long long)i, (long long)v);
            int32_t v32 = (int32_t)v;
            TRY(frame_append(ints, &v32, 4, err));
        }
    } else {
        TRY(frame_append(floats, t->dense.data, t->dense.len, err));
    }
    *spec = json_pack("{s:s, s:[I], s:I}", "dtype", want_int ? "int64" : "float32", "shape", (json_int_t)n,
                      "offset", (json_int_t)offset);
    return *spec ? 0 : error_set(err, SMELT_ENOMEM, "out of memory decoding the request");
}

static const TinkerPublic__Tensor *input_of(const TinkerPublic__Datum *d, const char *name) {
    for (size_t i = 0; i < d->n_loss_fn_inputs; i++)
        if (strcmp(d->loss_fn_inputs[i]->key, name) == 0) return d->loss_fn_inputs[i]->value;
    return NULL;
}

/* One datum → {n_tokens, inputs} with its values appended to the frames. */
static int datum_object(const TinkerPublic__Datum *d, size_t di, const struct loss_spec *loss,
                        struct frame f[3], json_t *data, struct smelt_error *err) {
    char field[128];
    for (size_t i = 0; i < d->n_loss_fn_inputs; i++)
        if (!in_list(loss->inputs, d->loss_fn_inputs[i]->key)) {
            snprintf(field, sizeof field, "data[%zu].loss_fn_inputs.%.64s", di, d->loss_fn_inputs[i]->key);
            return error_set_field(err, SMELT_EINVAL, field, "%s: not an input of loss_fn %s", field, loss->name);
        }
    int64_t n;
    TRY(datum_tokens(d, di, &f[0], &n, err));
    json_t *inputs = json_object();
    json_t *datum = json_pack("{s:I, s:o}", "n_tokens", (json_int_t)n, "inputs", inputs);
    if (!datum || json_array_append_new(data, datum))
        return error_set(err, SMELT_ENOMEM, "out of memory decoding the request");
    for (int k = 0; loss->inputs[k]; k++) {
        snprintf(field, sizeof field, "data[%zu].loss_fn_inputs.%s", di, loss->inputs[k]);
        const TinkerPublic__Tensor *t = input_of(d, loss->inputs[k]);
        if (!t) return error_set_field(err, SMELT_EINVAL, field, "%s: missing (loss_fn %s needs it)", field, loss->name);
        json_t *spec = NULL;
        TRY(datum_input(field, loss->inputs[k], t, n, &f[1], &f[2], &spec, err));
        json_object_set_new(inputs, loss->inputs[k], spec);
    }
    return 0;
}

static int convert(const TinkerPublic__ForwardBackwardRequest *m, struct tinker_fwdbwd *out, struct frame f[3],
                   struct smelt_error *err) {
    if (!m->model_id[0] || strlen(m->model_id) >= sizeof out->model_id)
        return error_set_field(err, SMELT_EINVAL, "model_id", "model_id: missing or too long");
    /* protobuf-c takes a string of any bytes, jansson (the header below) only UTF-8: refused
     * here, not as an out-of-memory json_pack */
    json_t *id = json_string(m->model_id);
    if (!id) return error_set_field(err, SMELT_EINVAL, "model_id", "model_id: not UTF-8");
    json_decref(id);
    snprintf(out->model_id, sizeof out->model_id, "%s", m->model_id);
    out->seq_id = m->seq_id;
    const struct loss_spec *loss = loss_lookup(m->loss_fn, err);
    if (!loss) return err->code;
    if (m->n_data == 0) return error_set_field(err, SMELT_EINVAL, "data", "data: no datums");
    if (m->n_data > FWDBWD_MAX_DATA)
        return error_set_field(err, SMELT_EINVAL, "data", "data: %zu datums; at most %d per request (split the "
                               "batch)", m->n_data, FWDBWD_MAX_DATA);
    json_t *config = json_object(), *data = json_array();
    out->header = json_pack("{s:s, s:s, s:s, s:o, s:o}", "op", m->forward_only ? "forward" : "forward_backward",
                            "model_id", m->model_id, "loss_fn", loss->name, "loss_fn_config", config, "data", data);
    if (!out->header) return error_set(err, SMELT_ENOMEM, "out of memory decoding the request");
    TRY(config_object(m, loss, config, err));
    for (size_t i = 0; i < m->n_data; i++) TRY(datum_object(m->data[i], i, loss, f, data, err));
    size_t bytes = json_dumpb(out->header, NULL, 0, JSON_COMPACT);
    if (bytes == 0 || bytes > MSG_MAX_HEADER_BYTES - FWDBWD_HEADER_ROOM)
        return error_set_field(err, SMELT_EINVAL, "data", "data: the request's %zu datums describe more than the "
                               "worker reads at once (%d header bytes); split the batch", m->n_data,
                               MSG_MAX_HEADER_BYTES - FWDBWD_HEADER_ROOM);
    return 0;
}

int tinker_fwdbwd_decode(const void *body, size_t len, struct tinker_fwdbwd *out, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    TinkerPublic__ForwardBackwardRequest *m =
        tinker_public__forward_backward_request__unpack(NULL, len, (const uint8_t *)body);
    if (!m)
        return error_set(err, SMELT_EFORMAT,
                         "the body is not a tinker_public.ForwardBackwardRequest protobuf message");
    struct frame f[3] = {{0}};
    int rc = convert(m, out, f, err);
    tinker_public__forward_backward_request__free_unpacked(m, NULL);
    for (int i = 0; i < 3; i++) out->arrays[i] = (struct msg_array){f[i].data, f[i].bytes};
    out->n_arrays = 3;
    if (rc) { /* model_id and seq_id outlive a refusal: the caller passes the seq over */
        char id[sizeof out->model_id];
        int64_t seq = out->seq_id;
        memcpy(id, out->model_id, sizeof id);
        tinker_fwdbwd_free(out);
        memcpy(out->model_id, id, sizeof id);
        out->seq_id = seq;
    }
    return rc;
}

/* n int32 values at data[offset..] in [0, vocab). */
static int check_ids(const struct msg_array *a, size_t offset, int64_t n, int64_t vocab, const char *field,
                     struct smelt_error *err) {
    for (int64_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)a->data + (offset + (size_t)i) * 4, 4);
        if (v < 0 || v >= vocab)
            return error_set_field(err, SMELT_EINVAL, field,
                                   "%s[%lld]: token id %d is outside the vocabulary [0, %lld)", field,
                                   (long long)i, v, (long long)vocab);
    }
    return 0;
}

int tinker_fwdbwd_check_tokens(const struct tinker_fwdbwd *r, int64_t vocab_size, struct smelt_error *err) {
    char field[96];
    size_t token_offset = 0;
    json_t *data = json_object_get(r->header, "data"), *d;
    size_t i;
    json_array_foreach(data, i, d) {
        int64_t n = json_integer_value(json_object_get(d, "n_tokens"));
        snprintf(field, sizeof field, "data[%zu].model_input", i);
        TRY(check_ids(&r->arrays[0], token_offset, n, vocab_size, field, err));
        token_offset += (size_t)n;
        json_t *t = json_object_get(json_object_get(d, "inputs"), "target_tokens");
        if (!t) continue;
        snprintf(field, sizeof field, "data[%zu].loss_fn_inputs.target_tokens", i);
        TRY(check_ids(&r->arrays[1], (size_t)json_integer_value(json_object_get(t, "offset")), n, vocab_size,
                      field, err));
    }
    return 0;
}

void tinker_fwdbwd_free(struct tinker_fwdbwd *r) {
    json_decref(r->header);
    for (int i = 0; i < r->n_arrays; i++) free(r->arrays[i].data);
    memset(r, 0, sizeof *r);
}
