/* ZeroMQ messages (common/msg.c) as a ROUTER receives them, and a rollout worker's
 * gen.request parsing (rollout/worker_request.c) of what arrives. The input is a list of
 * frames, each a 2-byte little-endian length and its bytes (at most 8 frames), sent by a
 * DEALER over inproc: frame 0 is the type, 1 the JSON header, the rest arrays (frame 2 a
 * gen.request's prompt ids). The worker's limits are a tiny random model's (the tiny
 * config of tests/data) with the byte tokenizer, so text prompts are encoded too. */
#include <zmq.h>

#include "common/common.h"
#include "model/model.h"
#include "rollout/worker_internal.h"
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

struct harness {
    void *ctx, *router, *dealer;
    struct model *model;
    struct tokenizer *tok;
    struct worker_limits limits;
};

static void setup(struct harness *h) {
    struct smelt_error err = {0};
    struct model_config cfg;
    int linger = 0;
    h->ctx = zmq_ctx_new();
    h->router = h->ctx ? zmq_socket(h->ctx, ZMQ_ROUTER) : NULL;
    h->dealer = h->ctx ? zmq_socket(h->ctx, ZMQ_DEALER) : NULL;
    if (!h->router || !h->dealer || zmq_setsockopt(h->dealer, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_bind(h->router, "inproc://fuzz-msg") || zmq_connect(h->dealer, "inproc://fuzz-msg") ||
        model_config_load("tests/data/tiny/config.json", &cfg, &err) ||
        model_init_random(&cfg, 1, BACKEND_CPU, &h->model, &err) || tokenizer_create_bytes(NULL, 0, &h->tok, &err)) {
        fprintf(stderr, "fuzz_msg: setup failed (run from the repository root): %s\n", err.message);
        abort();
    }
    h->limits = (struct worker_limits){.model = h->model, .tok = h->tok, .pool_tokens = 256, .eos = {1}, .n_eos = 1};
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct harness h;
    if (!h.ctx) setup(&h);
    const uint8_t *frames[8];
    size_t lens[8];
    int n = 0;
    for (size_t at = 0; n < 8 && at + 2 <= size; n++) {
        size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
        at += 2;
        if (len > size - at) len = size - at;
        frames[n] = data + at, lens[n] = len;
        at += len;
    }
    if (n == 0) return 0;
    for (int i = 0; i < n; i++)
        if (zmq_send(h.dealer, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0) abort();
    struct msg m;
    struct smelt_error err = {0};
    if (msg_recv(h.router, true, 5000, &m, &err) == 0) {
        struct worker_request req;
        struct worker_field field;
        if (worker_request_parse(&m, &h.limits, &req, &field, &err) == 0) worker_request_free(&req);
        else if (!field.named && err.code == SMELT_EINVAL) abort(); /* a refusal names its field */
    } else if (err.code == SMELT_ENOTFOUND) {
        abort(); /* what was sent never arrived: the receiver lost a message */
    }
    msg_free(&m);
    return 0;
}
