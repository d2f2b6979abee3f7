/* One tinker.request to its op, and the tinker.result header of the outcome. */
#include <string.h>

#include "tinker/tinker_internal.h"

int tinker_handle(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out, struct smelt_error *err) {
    *out = (struct tinker_reply){0};
    TRY(msg_check_version(m, err));
    const char *op;
    TRY(json_field_string(m->header, "op", true, NULL, &op, "request", err));
    int rc;
    if (strcmp(op, "create_model") == 0) rc = tinker_op_create_model(w, m, out, err);
    else if (strcmp(op, "forward") == 0) rc = tinker_op_forward(w, m, false, out, err);
    else if (strcmp(op, "forward_backward") == 0) rc = tinker_op_forward(w, m, true, out, err);
    else if (strcmp(op, "optim_step") == 0) rc = tinker_op_optim_step(w, m, out, err);
    else if (strcmp(op, "save_weights") == 0) rc = tinker_op_save_weights(w, m, false, out, err);
    else if (strcmp(op, "save_weights_for_sampler") == 0) rc = tinker_op_save_weights(w, m, true, out, err);
    else if (strcmp(op, "load_weights") == 0) rc = tinker_op_load_weights(w, m, out, err);
    else if (strcmp(op, "unload_model") == 0) rc = tinker_op_unload_model(w, m, out, err);
    else if (strcmp(op, "sample") == 0) rc = tinker_op_sample(w, m, out, err);
    else
        rc = error_set_field(err, SMELT_EINVAL, "op", "op: unknown \"%s\"", op);
    if (rc) tinker_reply_free(out);
    return rc;
}

const char *tinker_error_category(int rc) {
    switch (rc) {
    case SMELT_EINVAL:
    case SMELT_EFORMAT:
    case SMELT_ENOTFOUND:
    case SMELT_EUNSUPPORTED: return "user";
    default: return "server";
    }
}

static json_t *error_object(int rc, const struct smelt_error *err) {
    json_t *e = json_pack("{s:s, s:s}", "message", err && err->message[0] ? err->message : error_code_name(rc),
                          "category", tinker_error_category(rc));
    if (e && err && err->field[0] && json_object_set_new(e, "field", json_string(err->field))) {
        json_decref(e);
        return NULL;
    }
    return e;
}

json_t *tinker_result_header(const char *id, int rc, const struct tinker_reply *reply,
                             const struct smelt_error *err) {
    json_t *h = json_pack("{s:o, s:b}", "id", id ? json_string(id) : json_null(), "ok", rc == 0);
    if (!h) return NULL;
    json_t *body = rc != 0 ? error_object(rc, err)
                   : reply && reply->result ? json_incref(reply->result) : json_object();
    if (!body || json_object_set_new(h, rc == 0 ? "result" : "error", body)) {
        json_decref(h);
        return NULL;
    }
    return h;
}
