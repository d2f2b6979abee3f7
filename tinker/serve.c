/* The ZeroMQ loop: tinker.hello now and every TINKER_HELLO_MS, one tinker.result for
 * every message received, requests run one at a time in arrival order. */
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "tinker/tinker_internal.h"

static int send_hello(struct tinker_worker *w, void *dealer, const char *job_id, int64_t attempt,
                      struct smelt_error *err) {
    const struct model *b = w->base;
    json_t *h = json_pack("{s:s, s:I, s:I, s:s, s:I, s:I}", "job_id", job_id, "attempt", (json_int_t)attempt, "pid",
                          (json_int_t)getpid(), "model", w->base_name, "vocab_size", (json_int_t)b->config.vocab_size,
                          "max_context", (json_int_t)b->config.max_seq_len);
    if (!h) return error_set(err, SMELT_ENOMEM, "tinker.hello: out of memory");
    int rc = msg_send(dealer, NULL, 0, MSG_TINKER_HELLO, h, NULL, 0, err);
    json_decref(h);
    return rc;
}

/* Answers one received message (or one that failed to parse: rc, err). */
static int answer(struct tinker_worker *w, void *dealer, const struct msg *m, int rc,
                  const struct smelt_error *recv_err, struct smelt_error *err) {
    struct tinker_reply reply = {0};
    const char *id = NULL;
    struct smelt_error rerr = {0};
    if (rc) rerr = *recv_err;
    else if (strcmp(m->type, MSG_TINKER_REQUEST) != 0)
        rc = error_set_field(&rerr, SMELT_EINVAL, "type", "type: \"%s\" is not %s", m->type, MSG_TINKER_REQUEST);
    else {
        id = json_string_value(json_object_get(m->header, "id"));
        if (!id) rc = error_set_field(&rerr, SMELT_EINVAL, "id", "id: required string");
        else rc = tinker_handle(w, m, &reply, &rerr);
    }
    if (rc) log_info("tinker.request %s refused (%s): %s", id ? id : "(no id)", tinker_error_category(rc), rerr.message);
    json_t *h = tinker_result_header(id, rc, &reply, &rerr);
    int src = h ? msg_send(dealer, NULL, 0, MSG_TINKER_RESULT, h, reply.arrays, reply.n_arrays, err)
                : error_set(err, SMELT_ENOMEM, "tinker.result: out of memory");
    json_decref(h);
    tinker_reply_free(&reply);
    return src;
}

int tinker_serve(struct tinker_worker *w, void *dealer, const char *job_id, int64_t attempt, const atomic_int *stop,
                 struct smelt_error *err) {
    int64_t next_hello = 0;
    while (!atomic_load(stop)) {
        int64_t now = mono_ms();
        if (now >= next_hello) {
            /* A hello smeltd cannot take now (DONTWAIT) is only late: the next one follows. */
            struct smelt_error herr = {0};
            if (send_hello(w, dealer, job_id, attempt, &herr)) log_warn("tinker.hello: %s", herr.message);
            next_hello = now + TINKER_HELLO_MS;
        }
        struct msg m = {0};
        int wait = (int)(next_hello - now < 200 ? next_hello - now : 200);
        int rc = msg_recv(dealer, false, wait > 0 ? wait : 0, &m, err);
        if (rc == SMELT_ENOTFOUND) continue;
        if (rc == SMELT_EIO) {
            msg_free(&m);
            if (atomic_load(stop)) break; /* a signal interrupted the wait */
            return rc;
        }
        struct smelt_error aerr = {0};
        if (answer(w, dealer, &m, rc, err, &aerr)) log_warn("tinker.result not sent: %s", aerr.message);
        msg_free(&m);
    }
    return SMELT_OK;
}
