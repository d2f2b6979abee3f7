/* What a user's reward service (the endpoint grader, rewards/endpoint_grader.c) answers
 * for one request: byte 0 gives the request's samples (low 7 bits + 1: 1 to 128) and the
 * status (high bit: 500 after 3 attempts, else 200), the rest is the reply's body. Every
 * sample must come out scored or failed with a reason, and a score only from a 200 whose
 * body is {"rewards": [...]} of that many entries, the sample's entry a number equal to it. */
#include <math.h>

#include "rewards/endpoint_internal.h"
#include "tests/fuzz/fuzz.h"

static struct reward_grader *grader(void) {
    static struct reward_grader *g;
    if (g) return g;
    struct smelt_error err = {0};
    json_t *spec = json_pack("{s:s, s:s}", "type", "endpoint", "url", "http://127.0.0.1:9/score");
    if (!spec || reward_grader_create(spec, "grader", &g, &err)) {
        fprintf(stderr, "fuzz_endpoint_reply: setup failed: %s\n", err.message);
        abort();
    }
    json_decref(spec);
    return g;
}

/* rewards[i] of a 200's body as an independent read finds it (NULL when the body is not
 * {"rewards": [n entries]}). */
static const json_t *expected(const json_t *reply, int n, int i) {
    const json_t *rewards = json_object_get(reply, "rewards");
    if (!json_is_array(rewards) || json_array_size(rewards) != (size_t)n) return NULL;
    return json_array_get(rewards, (size_t)i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    struct reward_grader *g = grader();
    int n = (data[0] & 0x7f) + 1;
    struct endpoint_reply reply = {.status = data[0] & 0x80 ? 500 : 200, .attempts = data[0] & 0x80 ? 3 : 1};
    if (size > 1 && reward_buf_append(&reply.body, (const char *)data + 1, size - 1)) abort();
    struct smelt_error err = {0};
    if (grader_endpoint_read_reply(g->ep, n, &reply, &err)) abort(); /* memory only */
    json_t *j = reply.status == 200 ? fuzz_json(data + 1, size - 1) : NULL;
    for (int i = 0; i < n; i++) {
        double score = 0;
        char why[ENDPOINT_WHY_BYTES + 64] = "";
        const json_t *want = expected(j, n, i);
        if (grader_endpoint_result(g->ep, i, &score, why, sizeof why) == 0) {
            if (!json_is_number(want) || json_number_value(want) != score || !isfinite(score)) abort();
        } else if (!why[0] || json_is_number(want)) {
            abort(); /* a failure without a reason, or a reward read as no reward */
        }
    }
    json_decref(j);
    reward_buf_free(&reply.body);
    return 0;
}
