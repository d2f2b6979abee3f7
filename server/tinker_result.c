/* The worker's tinker.result (common/msg.h) → the SDK's result objects: JSON for most
 * ops, and for forward(_backward) and sample a JSON form that tinker_result_proto packs
 * into the protobuf the SDK accepts for them (ForwardBackwardOutput, SampleResponse). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker.pb-c.h"
#include "server/tinker_api.h"

bool tinker_op_is_proto(const char *op) {
    return strcmp(op, "forward") == 0 || strcmp(op, "forward_backward") == 0 || strcmp(op, "sample") == 0;
}

static int bad(struct smelt_error *err, const char *field, const char *what) {
    return error_set_field(err, SMELT_EFORMAT, field, "the worker's result: %s: %s", field, what);
}

/* n floats of a frame from element *at on, as JSON reals (NaN: null); *at advances. */
static json_t *floats_json(const struct msg_array *a, size_t *at, size_t n) {
    json_t *out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        float v;
        memcpy(&v, (const uint8_t *)a->data + (*at + i) * 4, 4);
        json_array_append_new(out, isfinite(v) ? json_real(v) : json_null());
    }
    *at += n;
    return out;
}

static json_t *ints_json(const struct msg_array *a, size_t *at, size_t n) {
    json_t *out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)a->data + (*at + i) * 4, 4);
        json_array_append_new(out, json_integer(v));
    }
    *at += n;
    return out;
}

/* metrics {"name:reduction": number}: the SDK's merge splits each key at its one ':'. */
static int metrics_copy(const json_t *metrics, json_t *out, struct smelt_error *err) {
    if (!json_is_object(metrics)) return bad(err, "result.metrics", "not an object");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)metrics, k, v) {
        const char *colon = strchr(k, ':');
        if (!json_is_number(v) || !colon || strchr(colon + 1, ':'))
            return bad(err, "result.metrics", "keys must be name:reduction with a number");
    }
    json_object_set_new(out, "metrics", json_deep_copy(metrics));
    return 0;
}

/* forward(_backward): outputs [[[name, n], ...] per datum] over frame 2's floats. */
static int fwdbwd_object(const json_t *res, const struct msg *m, json_t *out, struct smelt_error *err) {
    TRY(metrics_copy(json_object_get(res, "metrics"), out, err));
    const json_t *outputs = json_object_get(res, "outputs");
    if (!json_is_array(outputs)) return bad(err, "result.outputs", "not an array");
    size_t avail = m->n_arrays > 0 ? m->arrays[0].bytes / 4 : 0, at = 0, i, j;
    json_t *list = json_array(), *datum, *pair;
    json_object_set_new(out, "loss_fn_output_type", json_string("ArrayRecord"));
    json_object_set_new(out, "loss_fn_outputs", list);
    json_array_foreach(outputs, i, datum) {
        json_t *record = json_object();
        json_array_append_new(list, record);
        json_array_foreach(datum, j, pair) {
            const char *name = json_string_value(json_array_get(pair, 0));
            json_int_t n = json_integer_value(json_array_get(pair, 1));
            if (!name || n < 0 || (size_t)n > avail - at) return bad(err, "result.outputs", "bad [name, n] or frame 2 too short");
            json_t *t = json_pack("{s:o, s:s, s:[I]}", "data", floats_json(&m->arrays[0], &at, (size_t)n), "dtype",
                                  "float32", "shape", n);
            json_object_set_new(record, name, t);
        }
    }
    return at == avail ? 0 : bad(err, "result.outputs", "frame 2 has values no output claims");
}

/* sample: sequences [{n_tokens, stop_reason}] over frames 2 (tokens) and 3 (logprobs);
 * frame 4 the prompt's logprobs, frames 5 and 6 its top-k ids and logprobs. */
static int sample_object(const json_t *res, const struct msg *m, json_t *out, struct smelt_error *err) {
    const json_t *seqs = json_object_get(res, "sequences");
    if (!json_is_array(seqs) || m->n_arrays < 2 || m->arrays[0].bytes != m->arrays[1].bytes)
        return bad(err, "result.sequences", "no sequences, or frames 2 and 3 differ in length");
    size_t avail = m->arrays[0].bytes / 4, at = 0, at2 = 0, i;
    json_t *list = json_array(), *s;
    json_object_set_new(out, "sequences", list);
    json_array_foreach(seqs, i, s) {
        json_int_t n = json_integer_value(json_object_get(s, "n_tokens"));
        const char *stop = json_string_value(json_object_get(s, "stop_reason"));
        if (n < 0 || (size_t)n > avail - at || !stop || (strcmp(stop, "stop") && strcmp(stop, "length")))
            return bad(err, "result.sequences", "bad n_tokens or stop_reason");
        json_array_append_new(list, json_pack("{s:o, s:o, s:s}", "tokens", ints_json(&m->arrays[0], &at, (size_t)n),
                                              "logprobs", floats_json(&m->arrays[1], &at2, (size_t)n),
                                              "stop_reason", stop));
    }
    if (at != avail) return bad(err, "result.sequences", "frame 2 has tokens no sequence claims");
    if (m->n_arrays < 3) return 0;
    size_t n_prompt = m->arrays[2].bytes / 4, p = 0;
    json_object_set_new(out, "prompt_logprobs", floats_json(&m->arrays[2], &p, n_prompt));
    if (m->n_arrays < 5) return 0;
    size_t nk = m->arrays[3].bytes / 4;
    if (n_prompt == 0 || nk % n_prompt || m->arrays[4].bytes != m->arrays[3].bytes)
        return bad(err, "result.topk_prompt_logprobs", "frames 5 and 6 are not n_prompt * k each");
    size_t a = 0, b = 0;
    json_object_set_new(out, "topk_prompt_logprobs",
                        json_pack("{s:o, s:o, s:I}", "token_ids", ints_json(&m->arrays[3], &a, nk), "logprobs",
                                  floats_json(&m->arrays[4], &b, nk), "k", (json_int_t)(nk / n_prompt)));
    return 0;
}

int tinker_result_object(const char *op, const json_t *base, const struct msg *result, json_t **out,
                         struct smelt_error *err) {
    *out = NULL;
    const json_t *res = json_object_get(result->header, "result");
    if (!json_is_object(res)) return bad(err, "result", "not an object");
    json_t *o = json_is_object(base) ? json_deep_copy(base) : json_object();
    if (!o) return error_set(err, SMELT_ENOMEM, "out of memory converting a result");
    int rc = 0;
    if (strcmp(op, "forward") == 0 || strcmp(op, "forward_backward") == 0) rc = fwdbwd_object(res, result, o, err);
    else if (strcmp(op, "sample") == 0) rc = sample_object(res, result, o, err);
    else if (strcmp(op, "optim_step") == 0 && json_object_get(res, "metrics"))
        rc = metrics_copy(json_object_get(res, "metrics"), o, err);
    if (rc) {
        json_decref(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* ---- the protobuf answers (only these two the SDK takes as protobuf) ---- */

/* A JSON array of numbers (null: NaN) as packed little-endian float32 / int32 bytes. */
static int pack_array(const json_t *a, bool as_int, ProtobufCBinaryData *out, struct smelt_error *err) {
    size_t n = json_array_size(a), i;
    out->len = n * 4;
    out->data = malloc(n ? n * 4 : 1);
    if (!out->data) return error_set(err, SMELT_ENOMEM, "out of memory packing a result");
    json_t *v;
    json_array_foreach(a, i, v) {
        if (as_int) {
            int32_t x = (int32_t)json_integer_value(v);
            memcpy(out->data + i * 4, &x, 4);
        } else {
            float x = json_is_number(v) ? (float)json_number_value(v) : NAN;
            memcpy(out->data + i * 4, &x, 4);
        }
    }
    return 0;
}

static int pack_message(const ProtobufCMessage *msg, uint8_t **out, size_t *len, struct smelt_error *err) {
    *len = protobuf_c_message_get_packed_size(msg);
    *out = malloc(*len ? *len : 1);
    if (!*out) return error_set(err, SMELT_ENOMEM, "out of memory packing a result");
    protobuf_c_message_pack(msg, *out);
    return 0;
}

/* One ArrayRecord of every datum: per output name, one BatchedTensor of all datums'
 * float32 values with int64 byte offsets (datums' output names as in datum 0's). */
static int fwdbwd_proto(const json_t *r, uint8_t **out, size_t *len, struct smelt_error *err) {
    const json_t *outputs = json_object_get(r, "loss_fn_outputs"), *metrics = json_object_get(r, "metrics");
    size_t n_datums = json_array_size(outputs), n_fields = json_object_size(json_array_get(outputs, 0));
    size_t n_metrics = json_object_size(metrics);
    TinkerPublic__ForwardBackwardOutput o;
    TinkerPublic__ArrayRecord rec;
    tinker_public__forward_backward_output__init(&o);
    tinker_public__array_record__init(&rec);
    TinkerPublic__ArrayRecord *recs[1] = {&rec};
    TinkerPublic__ArrayRecord__FieldsEntry *fe = calloc(n_fields + 1, sizeof *fe), **fp = calloc(n_fields + 1, sizeof *fp);
    TinkerPublic__BatchedTensor *bt = calloc(n_fields + 1, sizeof *bt);
    TinkerPublic__ForwardBackwardOutput__MetricsEntry *me = calloc(n_metrics + 1, sizeof *me), **mp = calloc(n_metrics + 1, sizeof *mp);
    int rc = fe && fp && bt && me && mp ? 0 : error_set(err, SMELT_ENOMEM, "out of memory packing a result");
    const char *name;
    json_t *v;
    size_t f = 0;
    json_object_foreach(rc ? NULL : json_array_get(outputs, 0), name, v) {
        tinker_public__array_record__fields_entry__init(&fe[f]);
        tinker_public__batched_tensor__init(&bt[f]);
        fe[f].key = (char *)name;
        fe[f].value = &bt[f];
        fp[f] = &fe[f];
        bt[f].dtype = TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
        json_t *all = json_array(), *offsets = json_array();
        json_array_append_new(offsets, json_integer(0));
        for (size_t d = 0; d < n_datums; d++) {
            json_array_extend(all, json_object_get(json_object_get(json_array_get(outputs, d), name), "data"));
            json_array_append_new(offsets, json_integer((json_int_t)json_array_size(all) * 4));
        }
        rc = pack_array(all, false, &bt[f].data, err);
        int64_t *offs = rc ? NULL : malloc((n_datums + 1) * 8);
        if (!rc && !offs) rc = error_set(err, SMELT_ENOMEM, "out of memory packing a result");
        for (size_t d = 0; offs && d <= n_datums; d++) offs[d] = json_integer_value(json_array_get(offsets, d));
        bt[f].offsets = (ProtobufCBinaryData){(n_datums + 1) * 8, (uint8_t *)offs};
        json_decref(all);
        json_decref(offsets);
        f++;
        if (rc) break;
    }
    size_t k = 0;
    json_object_foreach(rc ? NULL : (json_t *)metrics, name, v) {
        tinker_public__forward_backward_output__metrics_entry__init(&me[k]);
        me[k].key = (char *)name;
        me[k].value = json_number_value(v);
        mp[k] = &me[k];
        k++;
    }
    rec.num_datums = (int64_t)n_datums;
    rec.n_fields = f;
    rec.fields = fp;
    o.loss_fn_output_type = (char *)"ArrayRecord";
    o.n_loss_fn_outputs = 1;
    o.loss_fn_outputs = recs;
    o.n_metrics = k;
    o.metrics = mp;
    if (!rc) rc = pack_message(&o.base, out, len, err);
    for (size_t i = 0; bt && i < f; i++) {
        free(bt[i].data.data);
        free(bt[i].offsets.data);
    }
    free(fe), free(fp), free(bt), free(me), free(mp);
    return rc;
}

static int sample_proto(const json_t *r, uint8_t **out, size_t *len, struct smelt_error *err) {
    const json_t *seqs = json_object_get(r, "sequences"), *plp = json_object_get(r, "prompt_logprobs");
    const json_t *topk = json_object_get(r, "topk_prompt_logprobs");
    size_t n = json_array_size(seqs);
    TinkerPublic__SampleResponse o;
    TinkerPublic__TopkLogprobs tk;
    tinker_public__sample_response__init(&o);
    tinker_public__topk_logprobs__init(&tk);
    TinkerPublic__SampledSequence *ss = calloc(n + 1, sizeof *ss), **sp = calloc(n + 1, sizeof *sp);
    int rc = ss && sp ? 0 : error_set(err, SMELT_ENOMEM, "out of memory packing a result");
    for (size_t i = 0; !rc && i < n; i++) {
        const json_t *s = json_array_get(seqs, i);
        tinker_public__sampled_sequence__init(&ss[i]);
        sp[i] = &ss[i];
        ss[i].stop_reason = strcmp(json_string_value(json_object_get(s, "stop_reason")), "length") == 0
                                ? TINKER_PUBLIC__STOP_REASON__STOP_REASON_LENGTH
                                : TINKER_PUBLIC__STOP_REASON__STOP_REASON_STOP;
        rc = pack_array(json_object_get(s, "tokens"), true, &ss[i].tokens, err);
        if (!rc) rc = pack_array(json_object_get(s, "logprobs"), false, &ss[i].logprobs, err);
        if (!rc) ss[i]._logprobs_case = TINKER_PUBLIC__SAMPLED_SEQUENCE___LOGPROBS_LOGPROBS;
    }
    o.n_sequences = n;
    o.sequences = sp;
    if (!rc && json_is_array(plp)) {
        rc = pack_array(plp, false, &o.prompt_logprobs, err);
        o._prompt_logprobs_case = TINKER_PUBLIC__SAMPLE_RESPONSE___PROMPT_LOGPROBS_PROMPT_LOGPROBS;
    }
    if (!rc && json_is_object(topk)) {
        rc = pack_array(json_object_get(topk, "token_ids"), true, &tk.token_ids, err);
        if (!rc) rc = pack_array(json_object_get(topk, "logprobs"), false, &tk.logprobs, err);
        tk.k = (uint32_t)json_integer_value(json_object_get(topk, "k"));
        tk.length = tk.k ? (uint32_t)(json_array_size(json_object_get(topk, "token_ids")) / tk.k) : 0;
        o.topk_prompt_logprobs = &tk;
        o._topk_prompt_logprobs_case = TINKER_PUBLIC__SAMPLE_RESPONSE___TOPK_PROMPT_LOGPROBS_TOPK_PROMPT_LOGPROBS;
    }
    if (!rc) rc = pack_message(&o.base, out, len, err);
    for (size_t i = 0; ss && i < n; i++) free(ss[i].tokens.data), free(ss[i].logprobs.data);
    free(o.prompt_logprobs.data), free(tk.token_ids.data), free(tk.logprobs.data);
    free(ss), free(sp);
    return rc;
}

int tinker_result_proto(const char *op, const json_t *result, uint8_t **out, size_t *len, struct smelt_error *err) {
    *out = NULL;
    *len = 0;
    if (strcmp(op, "sample") == 0) return sample_proto(result, out, len, err);
    if (strcmp(op, "forward") == 0 || strcmp(op, "forward_backward") == 0)
        return fwdbwd_proto(result, out, len, err);
    return error_set(err, SMELT_EINVAL, "op %s has no protobuf result", op);
}
