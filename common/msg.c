/* ZeroMQ multipart framing of common/msg.h. */
#include "common/msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static int send_frame(void *socket, const void *data, size_t len, bool more, struct smelt_error *err) {
    int flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, data, len, flags) < 0)
        return error_set(err, SMELT_EIO, "zmq_send: %s", zmq_strerror(zmq_errno()));
    return 0;
}

int msg_send(void *socket, const void *route, size_t route_len, const char *type,
             json_t *header, const struct msg_array *arrays, int n_arrays,
             struct smelt_error *err) {
    if (!socket || !type || !header || !json_is_object(header) || n_arrays < 0 ||
        n_arrays > MSG_MAX_ARRAYS || strlen(type) >= MSG_TYPE_BYTES)
        return error_set(err, SMELT_EINVAL, "msg_send: bad arguments");
    if (!json_object_get(header, "v") &&
        json_object_set_new(header, "v", json_integer(MSG_VERSION)) != 0)
        return error_set(err, SMELT_ENOMEM, "msg_send: out of memory");
    char *text = json_dumps(header, JSON_COMPACT);
    if (!text) return error_set(err, SMELT_ENOMEM, "msg_send: out of memory");
    int rc = 0;
    if (route_len > 0) rc = send_frame(socket, route, route_len, true, err);
    /* The first frame decides: if it could not go, nothing went and the message is
     * dropped whole. Later frames of a multipart message are queued atomically. */
    if (rc == 0) rc = send_frame(socket, type, strlen(type), true, err);
    if (rc == 0) rc = send_frame(socket, text, strlen(text), n_arrays > 0, err);
    for (int i = 0; rc == 0 && i < n_arrays; i++)
        rc = send_frame(socket, arrays[i].data, arrays[i].bytes, i + 1 < n_arrays, err);
    free(text);
    if (rc) error_wrap(err, rc, "sending %s", type);
    return rc;
}

static bool more_frames(void *socket) {
    int more = 0;
    size_t len = sizeof(more);
    return zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &len) == 0 && more;
}

static void drain(void *socket) {
    zmq_msg_t part;
    while (more_frames(socket)) {
        zmq_msg_init(&part);
        zmq_msg_recv(&part, socket, 0);
        zmq_msg_close(&part);
    }
}

void msg_free(struct msg *m) {
    if (!m) return;
    if (m->header) json_decref(m->header);
    for (int i = 0; i < m->n_arrays; i++) free(m->arrays[i].data);
    memset(m, 0, sizeof(*m));
}

/* ThreadSanitizer cannot see libzmq's lock-free hand-off of a message between threads
 * (tests/tsan.supp): the copy out of ZeroMQ's buffer looks raced with ZeroMQ's own write
 * on the sending thread, and when that thread has run on too far for TSAN to name the
 * write, the libzmq suppression cannot match. What msg_recv reads is ZeroMQ's buffer and
 * its own message, nothing another thread of smelt's shares, so TSAN looks away for it. */
#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define ZMQ_HANDOFF_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define ZMQ_HANDOFF_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define ZMQ_HANDOFF_BEGIN() ((void)0)
#define ZMQ_HANDOFF_END() ((void)0)
#endif

static int recv_unannotated(void *socket, bool router, int timeout_ms, struct msg *out, struct smelt_error *err);

int msg_recv(void *socket, bool router, int timeout_ms, struct msg *out, struct smelt_error *err) {
    ZMQ_HANDOFF_BEGIN();
    int rc = recv_unannotated(socket, router, timeout_ms, out, err);
    ZMQ_HANDOFF_END();
    return rc;
}

/* The ZAP user id of the connection the message came on (common/curve.h); "" without one. */
static void copy_user_id(zmq_msg_t *part, struct msg *out) {
    const char *id = zmq_msg_gets(part, "User-Id");
    if (id && strlen(id) < sizeof out->user_id) memcpy(out->user_id, id, strlen(id) + 1);
}

static int recv_unannotated(void *socket, bool router, int timeout_ms, struct msg *out, struct smelt_error *err) {
    memset(out, 0, sizeof(*out));
    zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};
    int n = zmq_poll(&item, 1, timeout_ms);
    if (n < 0) {
        if (zmq_errno() == EINTR) return error_set(err, SMELT_ENOTFOUND, "interrupted");
        return error_set(err, SMELT_EIO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    }
    if (n == 0) return error_set(err, SMELT_ENOTFOUND, "no message within %d ms", timeout_ms);

    zmq_msg_t part;
    int index = 0, rc = 0;
    bool more = true;
    while (more) {
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, socket, 0) < 0) {
            zmq_msg_close(&part);
            msg_free(out);
            return error_set(err, SMELT_EIO, "zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
        }
        more = zmq_msg_more(&part);
        if (!out->user_id[0]) copy_user_id(&part, out); /* the routing id frame has none */
        const char *data = zmq_msg_data(&part);
        size_t len = zmq_msg_size(&part);
        int frame = router ? index - 1 : index; /* -1: the routing id */
        if (rc == 0) {
            if (frame == -1) {
                if (len > MSG_ROUTE_BYTES)
                    rc = error_set(err, SMELT_EFORMAT, "routing id of %zu bytes", len);
                else {
                    memcpy(out->route, data, len);
                    out->route_len = len;
                }
            } else if (frame == 0) {
                if (len == 0 || len >= MSG_TYPE_BYTES)
                    rc = error_set(err, SMELT_EFORMAT, "message type of %zu bytes", len);
                else {
                    memcpy(out->type, data, len);
                    out->type[len] = 0;
                    for (size_t i = 0; i < len; i++)
                        if (data[i] < 0x21 || data[i] > 0x7e) {
                            out->type[0] = 0;
                            rc = error_set(err, SMELT_EFORMAT, "message type is not printable ASCII");
                            break;
                        }
                }
            } else if (frame == 1) {
                if (len > MSG_MAX_HEADER_BYTES)
                    rc = error_set(err, SMELT_EFORMAT, "header of %zu bytes (most %d)", len,
                                   MSG_MAX_HEADER_BYTES);
                else {
                    json_error_t jerr;
                    out->header = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
                    if (!out->header)
                        rc = error_set(err, SMELT_EFORMAT, "header: invalid JSON at column %d: %s",
                                       jerr.column, jerr.text);
                    else if (!json_is_object(out->header))
                        rc = error_set(err, SMELT_EFORMAT, "header: not a JSON object");
                }
            } else {
                if (out->n_arrays == MSG_MAX_ARRAYS)
                    rc = error_set(err, SMELT_EFORMAT, "more than %d array frames", MSG_MAX_ARRAYS);
                else {
                    void *copy = malloc(len ? len : 1);
                    if (!copy) rc = error_set(err, SMELT_ENOMEM, "array frame of %zu bytes", len);
                    else {
                        memcpy(copy, data, len);
                        out->arrays[out->n_arrays].data = copy;
                        out->arrays[out->n_arrays].bytes = len;
                        out->n_arrays++;
                    }
                }
            }
        }
        zmq_msg_close(&part);
        index++;
    }
    if (rc == 0 && index < (router ? 3 : 2))
        rc = error_set(err, SMELT_EFORMAT, "message of %d frames (type and header needed)",
                       router ? index - 1 : index);
    if (rc) {
        /* Keep route and type so the caller can answer; drop the rest. */
        if (out->header) json_decref(out->header);
        out->header = NULL;
        for (int i = 0; i < out->n_arrays; i++) free(out->arrays[i].data);
        out->n_arrays = 0;
        drain(socket);
    }
    return rc;
}

int msg_check_version(const struct msg *m, struct smelt_error *err) {
    json_t *v = m->header ? json_object_get(m->header, "v") : NULL;
    if (!v) return error_set(err, SMELT_EINVAL, "v: missing (protocol version %d)", MSG_VERSION);
    if (!json_is_integer(v) || json_integer_value(v) != MSG_VERSION)
        return error_set(err, SMELT_EINVAL, "v: protocol version %d expected", MSG_VERSION);
    return 0;
}
