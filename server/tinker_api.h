/* The Tinker API's HTTP side inside smeltd (private to server/; docs/tinker.md): the
 * SDK's protobuf bodies turned into common/msg.h's tinker.request, and the worker's
 * tinker.result turned into the SDK's result objects. Shared parts with the session
 * jobs and dispatch are in server/tinker_internal.h. */
#ifndef SMELT_SERVER_TINKER_API_H
#define SMELT_SERVER_TINKER_API_H

#include <stdbool.h>
#include <stdint.h>

#include "server/tinker_internal.h"

#define TINKER_ID_BYTES 128

/* A forward / forward_backward request decoded from the SDK's ForwardBackwardRequest
 * protobuf and checked field by field: header is msg.h's tinker.request header (no "v",
 * no "id"), arrays its frames 2..4 (tokens int32, int64 inputs as int32, float32
 * inputs). Owned: tinker_fwdbwd_free. */
struct tinker_fwdbwd {
    char model_id[TINKER_ID_BYTES];
    int64_t seq_id;
    json_t *header;
    struct msg_array arrays[3];
    int n_arrays;
};

/* Decodes and checks body (every failure SMELT_EINVAL / SMELT_EUNSUPPORTED naming the
 * field, e.g. "data[2].loss_fn_inputs.weights"). Token ids are not checked against a
 * vocabulary here: tinker_fwdbwd_check_tokens does that once the model is known. */
int tinker_fwdbwd_decode(const void *body, size_t len, struct tinker_fwdbwd *out, struct smelt_error *err);
/* Every input token and every target_tokens value in [0, vocab_size); else SMELT_EINVAL
 * naming the datum, the field and the index. */
int tinker_fwdbwd_check_tokens(const struct tinker_fwdbwd *r, int64_t vocab_size, struct smelt_error *err);
void tinker_fwdbwd_free(struct tinker_fwdbwd *r);

/* The SDK's result object of a worker's successful tinker.result for op: base (what the
 * API decided at submission, e.g. {"type":"save_weights","path":"tinker://..."}; may be
 * NULL) with the worker's answer added. For forward(_backward) and sample it is the JSON
 * form of the protobuf answer, which tinker_result_proto encodes; floats are kept as
 * doubles so they convert back to the same f32. New reference in *out. SMELT_EFORMAT
 * naming the field when the worker's answer does not fit msg.h. */
int tinker_result_object(const char *op, const json_t *base, const struct msg *result, json_t **out,
                         struct smelt_error *err);
/* The protobuf body of a stored forward(_backward) or sample result (malloc'd, *len). */
int tinker_result_proto(const char *op, const json_t *result, uint8_t **out, size_t *len,
                        struct smelt_error *err);
/* true for the ops whose results the SDK takes only as protobuf. */
bool tinker_op_is_proto(const char *op);

#endif
