/* The ZeroMQ loop: tinker.hello now and every TINKER_HELLO_MS, one tinker.result for
 * every message received, requests run one at a time in arrival order, except that a
 * sample request takes the sample requests waiting behind it into one engine run
 * (tinker_sample_batch), up to the first other message, which runs next. */
#include <stdlib.h>
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

static int send_result(void *dealer, const char *id, int rc, const struct tinker_reply *reply,
                       const struct smelt_error *rerr, struct smelt_error *err) {
    if (rc) log_info("tinker.request %s refused (%s): %s", id ? id : "(no id)", tinker_error_category(rc), rerr->message);
    json_t *h = tinker_result_header(id, rc, reply, rerr);
    int src = h ? msg_send(dealer, NULL, 0, MSG_TINKER_RESULT, h, reply->arrays, reply->n_arrays, err)
                : error_set(err, SMELT_ENOMEM, "tinker.result: out of memory");
    json_decref(h);
    return src;
}

/* A received message's request id, or why it cannot be run (rc, rerr). */
static int check_request(const struct msg *m, const char **id, struct smelt_error *rerr) {
    *id = NULL;
    if (strcmp(m->type, MSG_TINKER_REQUEST) != 0)
        return error_set_field(rerr, SMELT_EINVAL, "type", "type: \"%s\" is not %s", m->type, MSG_TINKER_REQUEST);
    *id = json_string_value(json_object_get(m->header, "id"));
    return *id ? SMELT_OK : error_set_field(rerr, SMELT_EINVAL, "id", "id: required string");
}

/* Answers one received message (or one that failed to parse: rc, err). */
static void answer(struct tinker_worker *w, void *dealer, const struct msg *m, int rc,
                   const struct smelt_error *recv_err) {
    struct tinker_reply reply = {0};
    const char *id = NULL;
    struct smelt_error rerr = {0}, serr = {0};
    if (rc) rerr = *recv_err;
    else if (!(rc = check_request(m, &id, &rerr))) rc = tinker_handle(w, m, &reply, &rerr);
    if (send_result(dealer, id, rc, &reply, &rerr, &serr)) log_warn("tinker.result not sent: %s", serr.message);
    tinker_reply_free(&reply);
}

/* A batch of sample requests: first (received) and every sample request already
 * waiting, up to TINKER_MAX_SAMPLE_BATCH. The first other message (or a receive that
 * fails to parse) ends the drain: it is left in *next (*next_rc) to run after the batch,
 * so requests other than samples keep their order. Returns how many are in batch. */
static int drain_samples(void *dealer, struct msg *batch, struct msg *next, int *next_rc,
                         struct smelt_error *next_err) {
    int n = 1;
    *next_rc = SMELT_ENOTFOUND;
    while (n < TINKER_MAX_SAMPLE_BATCH) {
        struct msg m = {0};
        int rc = msg_recv(dealer, false, 0, &m, next_err);
        if (rc == SMELT_ENOTFOUND || rc == SMELT_EIO) { /* nothing waiting; a failing socket shows at the next wait */
            msg_free(&m);
            break;
        }
        const char *id;
        struct smelt_error ignore = {0};
        if (rc || check_request(&m, &id, &ignore) || !tinker_is_sample(&m)) {
            *next = m, *next_rc = rc;
            break;
        }
        batch[n++] = m;
    }
    return n;
}

static void answer_samples(struct tinker_worker *w, void *dealer, struct msg *batch, int n) {
    const struct msg *reqs[TINKER_MAX_SAMPLE_BATCH] = {0};
    struct tinker_reply outs[TINKER_MAX_SAMPLE_BATCH];
    int rcs[TINKER_MAX_SAMPLE_BATCH];
    struct smelt_error errs[TINKER_MAX_SAMPLE_BATCH];
    for (int i = 0; i < n; i++) reqs[i] = &batch[i];
    memset(errs, 0, sizeof errs);
    tinker_sample_batch(w, reqs, n, outs, rcs, errs);
    for (int i = 0; i < n; i++) {
        const char *id = json_string_value(json_object_get(batch[i].header, "id"));
        struct smelt_error serr = {0};
        if (send_result(dealer, id, rcs[i], &outs[i], &errs[i], &serr)) log_warn("tinker.result not sent: %s", serr.message);
        tinker_reply_free(&outs[i]);
    }
}

/* One received message: a sample request with the samples waiting behind it as one
 * batch (then the message that ended the drain), anything else on its own. */
static void dispatch(struct tinker_worker *w, void *dealer, struct msg *m, int rc, const struct smelt_error *recv_err) {
    const char *id;
    struct smelt_error ignore = {0};
    if (rc || check_request(m, &id, &ignore) || !tinker_is_sample(m)) {
        answer(w, dealer, m, rc, recv_err);
        msg_free(m);
        return;
    }
    struct msg *batch = calloc(TINKER_MAX_SAMPLE_BATCH, sizeof *batch), next = {0};
    if (!batch) { /* no room to batch: the one in hand alone */
        answer(w, dealer, m, rc, recv_err);
        msg_free(m);
        return;
    }
    int next_rc;
    struct smelt_error next_err = {0};
    batch[0] = *m;
    int n = drain_samples(dealer, batch, &next, &next_rc, &next_err);
    answer_samples(w, dealer, batch, n);
    for (int i = 0; i < n; i++) msg_free(&batch[i]);
    free(batch);
    if (next_rc != SMELT_ENOTFOUND) {
        answer(w, dealer, &next, next_rc, &next_err);
        msg_free(&next);
    }
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
        dispatch(w, dealer, &m, rc, err);
    }
    return SMELT_OK;
}
