/* The Tinker SDK's forward / forward_backward body (server/tinker_proto.c): any bytes as
 * a tinker_public.ForwardBackwardRequest protobuf (protoc-c's code of server/tinker.proto)
 * decoded into smelt's tinker.request, then the checks the handler applies
 * (api_tinker_train.c: token ids against a vocabulary, seq_id from 1). A refusal of a
 * message that decoded must name its field; a request taken must be consistent: its
 * datums' n_tokens add up to the token frame, every input's offset and length lie inside
 * its frame, every loss_fn_config setting given is in it. */
#include "server/tinker.pb-c.h"
#include "server/tinker_api.h"
#include "tests/fuzz/fuzz.h"

/* Whether header's datums describe the frames exactly (tokens) or within them (inputs). */
static bool consistent(const struct tinker_fwdbwd *r) {
    const json_t *data = json_object_get(r->header, "data"), *d;
    size_t i, tokens = 0;
    if (!json_is_array(data) || json_array_size(data) == 0 || r->n_arrays != 3) return false;
    json_array_foreach(data, i, d) {
        json_int_t n = json_integer_value(json_object_get(d, "n_tokens"));
        if (n < 1) return false;
        tokens += (size_t)n;
        const char *name;
        const json_t *spec;
        json_object_foreach(json_object_get(d, "inputs"), name, spec) {
            bool ints = strcmp(json_string_value(json_object_get(spec, "dtype")), "int64") == 0;
            json_int_t offset = json_integer_value(json_object_get(spec, "offset"));
            size_t frame = r->arrays[ints ? 1 : 2].bytes / 4;
            if (offset < 0 || (size_t)offset > frame || (size_t)n > frame - (size_t)offset) return false;
        }
    }
    return tokens * 4 == r->arrays[0].bytes;
}

/* Whether every loss_fn_config setting the message gives (the v2 map when it has one, else the
 * legacy map) is in the header: none is dropped on the way. */
static bool config_kept(const struct tinker_fwdbwd *r, const uint8_t *data, size_t size) {
    TinkerPublic__ForwardBackwardRequest *m = tinker_public__forward_backward_request__unpack(NULL, size, data);
    const json_t *config = json_object_get(r->header, "loss_fn_config");
    bool kept = m != NULL;
    for (size_t i = 0; kept && i < m->n_loss_fn_config_v2; i++)
        kept = json_is_number(json_object_get(config, m->loss_fn_config_v2[i]->key));
    for (size_t i = 0; kept && m->n_loss_fn_config_v2 == 0 && i < m->n_loss_fn_config; i++)
        kept = json_is_number(json_object_get(config, m->loss_fn_config[i]->key));
    if (m) tinker_public__forward_backward_request__free_unpacked(m, NULL);
    return kept;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tinker_fwdbwd r;
    struct smelt_error err = {0};
    int rc = tinker_fwdbwd_decode(data, size, &r, &err);
    if (!memchr(r.model_id, 0, sizeof r.model_id)) abort();
    if (rc == 0) {
        if (!consistent(&r) || !config_kept(&r, data, size)) abort();
        static const int64_t vocabs[] = {1, 256, 151936};
        for (int v = 0; v < 3; v++) {
            struct smelt_error verr = {0};
            if (tinker_fwdbwd_check_tokens(&r, vocabs[v], &verr) && !verr.field[0]) abort();
        }
    } else if (rc != SMELT_EFORMAT && (!err.field[0] || !err.message[0])) {
        fprintf(stderr, "refused without a field (code %d): %s\n", rc, err.message);
        abort();
    }
    tinker_fwdbwd_free(&r);
    return 0;
}
