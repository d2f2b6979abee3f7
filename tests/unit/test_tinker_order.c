/* The Tinker API's pure parts (server/tinker_order.c, server/api_tinker_runs.c): a
 * model's requests leave in seq_id order whatever order they arrive in, repeated seq ids
 * answer the first future, refused seqs are passed over; checkpoint names map to
 * tinker:// paths and directories only when safe. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

struct sent {
    char order[256];
    int n;
};

static void record(void *ctx, void *payload, const char *future_id) {
    struct sent *s = ctx;
    size_t at = strlen(s->order);
    snprintf(s->order + at, sizeof s->order - at, "%s%s", at ? "," : "", future_id);
    s->n++;
    free(payload);
}

static int submit(struct tinker_order *o, const char *model, int64_t seq, const char *fid, struct sent *s,
                  char *first) {
    struct smelt_error err = {0};
    char *payload = strdup(fid);
    int rc = tinker_order_submit(o, model, seq, fid, payload, s, first, 64, &err);
    if (rc) free(payload);
    return rc;
}

Test(tinker_order, early_requests_wait_for_their_turn) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    cr_assert_eq(submit(o, "m", 3, "f3", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 2, "f2", &s, NULL), 0);
    cr_assert_eq(s.n, 0, "nothing is due before seq 1");
    cr_assert_eq(submit(o, "other", 1, "g1", &s, NULL), 0);
    cr_assert_str_eq(s.order, "g1", "models are independent");
    cr_assert_eq(submit(o, "m", 1, "f1", &s, NULL), 0);
    cr_assert_str_eq(s.order, "g1,f1,f2,f3");
    cr_assert_eq(submit(o, "m", 4, "f4", &s, NULL), 0);
    cr_assert_str_eq(s.order, "g1,f1,f2,f3,f4");
    tinker_order_free(o);
}

Test(tinker_order, a_repeated_seq_answers_the_first_future) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    char first[64];
    cr_assert_eq(submit(o, "m", 2, "f2", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 2, "again", &s, first), TINKER_ORDER_REPEATED, "a waiting one");
    cr_assert_str_eq(first, "f2");
    cr_assert_eq(submit(o, "m", 1, "f1", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 1, "again", &s, first), TINKER_ORDER_REPEATED, "a sent one");
    cr_assert_str_eq(first, "f1");
    cr_assert_str_eq(s.order, "f1,f2");
    tinker_order_free(o);
}

Test(tinker_order, refused_seqs_are_passed_over_and_past_seqs_refused) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    cr_assert_eq(submit(o, "m", 2, "f2", &s, NULL), 0);
    cr_assert_eq(tinker_order_skip(o, "m", 1, &s), 0);
    cr_assert_str_eq(s.order, "f2", "seq 1 was refused: seq 2 need not wait");
    cr_assert_eq(tinker_order_skip(o, "m", 4, &s), 0);
    cr_assert_eq(submit(o, "m", 4, "f4", &s, NULL), 0, "a real request takes a passed-over seq's place");
    cr_assert_eq(submit(o, "m", 3, "f3", &s, NULL), 0);
    cr_assert_str_eq(s.order, "f2,f3,f4");
    char first[64];
    int rc = tinker_order_submit(o, "m", 1, "late", NULL, &s, first, sizeof first, &err);
    cr_assert_eq(rc, SMELT_EINVAL);
    cr_assert_str_eq(err.field, "seq_id");
    tinker_order_free(o);
}

Test(tinker_order, seqs_below_one_or_far_ahead_are_refused) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    cr_assert_eq(tinker_order_submit(o, "m", 0, "f0", NULL, &s, NULL, 0, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "seq_id");
    cr_assert_eq(tinker_order_submit(o, "m", -5, "fm", NULL, &s, NULL, 0, &err), SMELT_EINVAL);
    cr_assert_str_eq(err.field, "seq_id");
    cr_assert_eq(tinker_order_submit(o, "m", 1026, "far", NULL, &s, NULL, 0, &err), SMELT_EINVAL,
                 "more than 1024 ahead of seq 1");
    cr_assert_str_eq(err.field, "seq_id");
    cr_assert(strstr(err.message, "1026"), "%s", err.message);
    cr_assert_eq(submit(o, "m", 1025, "f1025", &s, NULL), 0, "1024 ahead waits");
    cr_assert_eq(submit(o, "m", 1, "f1", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 1026, "f1026", &s, NULL), 0, "the bound moves with the next expected seq");
    cr_assert_str_eq(s.order, "f1");
    tinker_order_free(o);
}

Test(tinker_order, open_restarts_a_model_and_drops_what_waits) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    cr_assert_eq(submit(o, "m", 5, "f5", &s, NULL), 0);
    cr_assert_eq(tinker_order_open(o, "m", 1, &err), 0);
    cr_assert_eq(submit(o, "m", 1, "g1", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 2, "g2", &s, NULL), 0);
    cr_assert_str_eq(s.order, "g1,g2");
    tinker_order_close(o, "m");
    cr_assert_eq(submit(o, "m", 1, "h1", &s, NULL), 0, "a closed model starts over");
    cr_assert_str_eq(s.order, "g1,g2,h1");
    tinker_order_free(o);
}

/* A waiting request taken back never goes out and its seq is passed over; one already sent cannot be taken. */
Test(tinker_order, a_cancelled_waiting_request_is_passed_over) {
    struct tinker_order *o = NULL;
    struct smelt_error err = {0};
    cr_assert_eq(tinker_order_new(record, free, &o, &err), 0);
    struct sent s = {0};
    cr_assert_eq(submit(o, "m", 1, "f1", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 3, "f3", &s, NULL), 0);
    cr_assert_eq(submit(o, "m", 4, "f4", &s, NULL), 0);
    cr_expect(!tinker_order_cancel(o, "m", "f1"), "f1 was sent already");
    cr_expect(!tinker_order_cancel(o, "other", "f3"), "f3 is not the other model's");
    cr_expect(tinker_order_cancel(o, "m", "f3"));
    cr_expect(!tinker_order_cancel(o, "m", "f3"), "taken back twice");
    cr_assert_eq(submit(o, "m", 2, "f2", &s, NULL), 0);
    cr_expect_str_eq(s.order, "f1,f2,f4", "f3 went out, or held f4 back");
    cr_expect_eq(tinker_order_count(o), 1);
    tinker_order_close(o, "m");
    cr_expect_eq(tinker_order_count(o), 0);
    tinker_order_free(o);
}

Test(tinker_paths, names_map_to_paths_and_directories) {
    char out[512];
    struct smelt_error err = {0};
    cr_assert_eq(tinker_checkpoint_path("sess-1:train:0", "training", "ckpt-1.a_b", out, sizeof out, &err), 0);
    cr_assert_str_eq(out, "tinker://sess-1:train:0/weights/ckpt-1.a_b");
    cr_assert_eq(tinker_checkpoint_path("sess-1:train:0", "sampler", "s1", out, sizeof out, &err), 0);
    cr_assert_str_eq(out, "tinker://sess-1:train:0/sampler_weights/s1");
    cr_assert_eq(tinker_checkpoint_dir("/d", "sess-1:train:0", "sampler", "s1", out, sizeof out, &err), 0);
    cr_assert_str_eq(out, "/d/tinker/sess-1:train:0/sampler_weights/s1");
}

Test(tinker_paths, unsafe_names_are_refused) {
    char out[512];
    struct smelt_error err = {0};
    static const char *const bad[] = {"", "..", ".hidden", "a/b", "a b", "x\n",
                                      "0123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert(!tinker_name_ok(bad[i]), "%s", bad[i]);
        cr_assert_eq(tinker_checkpoint_dir("/d", "m:train:0", "training", bad[i], out, sizeof out, &err),
                     SMELT_EINVAL, "%s", bad[i]);
        cr_assert_str_eq(err.field, "path");
    }
    cr_assert_eq(tinker_checkpoint_dir("/d", "../x", "training", "ok", out, sizeof out, &err), SMELT_EINVAL);
    cr_assert_eq(tinker_checkpoint_dir("/d", "a/b", "training", "ok", out, sizeof out, &err), SMELT_EINVAL);
    cr_assert_eq(tinker_checkpoint_path("m:train:0", "external", "ok", out, sizeof out, &err), SMELT_EINVAL);
}
