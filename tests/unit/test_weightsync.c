/* weightsync/ and the worker's side of it: XXH64 against the reference vectors, the
 * metadata of the model's and the adapter's flat buffers, the weights.* headers read
 * back, a push through an in-process transport (buckets in any order, written in place),
 * and then a real sync: the rollout client pushes to a worker serving on a thread behind
 * an inproc ROUTER (rollout/worker.c). After a full sync the worker's weights are the
 * trainer's byte for byte and its greedy output and logprobs equal a local engine's on
 * the trainer's model exactly (and the reference generator's); a LoRA sync moves exactly
 * the adapter's bytes; a sync in the middle of generation leaves every sample on one
 * version; bad syncs are refused naming the field and the old weights stay; the
 * colocated path (rollout_engine_weights_changed).
 *
 * Every wait here is bounded by the client's timeouts or msg_recv's, not by Criterion's
 * .timeout (whose runner leaks an allocation under --jobs 2 that LeakSanitizer reports). */
#include "tests/unit/rollout_testutil.h"

#include <zmq.h>

#include "common/msg.h"
#include "lora/lora.h"
#include "weightsync/weightsync.h"

#define ENDPOINT "inproc://weightsync-worker"
#define TIMEOUT_MS 30000
#define MAX_TOKENS 64

static struct rollout_client *client_of(void *ctx, const char *endpoint, int64_t bucket_bytes) {
    const char *endpoints[1] = {endpoint};
    struct rollout_client_config cfg = {.endpoints = endpoints, .n_endpoints = 1, .zmq_ctx = ctx,
                                        .timeout_ms = TIMEOUT_MS, .bucket_bytes = bucket_bytes};
    struct rollout_client *c;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_create(&cfg, &c, &err), &err);
    return c;
}

/* ---- results ---- */

/* One request's samples through the client, by sample index. */
#define MAX_SAMPLES 48
struct samples {
    int n;
    int32_t ids[MAX_SAMPLES * MAX_TOKENS];
    float logprobs[MAX_SAMPLES * MAX_TOKENS];
    int64_t n_tokens[MAX_SAMPLES], version[MAX_SAMPLES];
    const char *reason[MAX_SAMPLES];
};

static struct rollout_client_results results_of(struct samples *s, int n) {
    s->n = n;
    return (struct rollout_client_results){.max_tokens = MAX_TOKENS, .ids = s->ids, .logprobs = s->logprobs,
                                           .n_tokens = s->n_tokens, .policy_version = s->version,
                                           .finish_reason = s->reason};
}

static void generate(struct rollout_client *c, const struct rollout_request *r, struct samples *out) {
    struct rollout_client_results res = results_of(out, r->n);
    struct smelt_error err = {0};
    TEST_OK(rollout_client_generate(c, r, 1, &res, &err), &err);
}

static struct rollout_request request_of(const int32_t *prompt, int64_t n_prompt, int n, float temperature,
                                         uint64_t seed, int64_t max_new) {
    return (struct rollout_request){.prompt = prompt, .n_prompt = n_prompt, .n = n,
                                    .sampling = {.temperature = temperature, .top_p = 1}, .seed = seed,
                                    .max_new_tokens = max_new};
}

/* The request alone on a fresh local engine of model m (the worker's configuration). */
static struct rollout_test_collected *local_run(struct model *m, const struct rollout_request *r, int max_seqs) {
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, max_seqs, 256);
    struct smelt_error err = {0};
    struct rollout_request q = *r;
    q.id = 0;
    TEST_OK(rollout_engine_add(e, &q, &err), &err);
    struct rollout_test_collected *c = rollout_test_run_all(e);
    rollout_engine_free(e);
    return c;
}

/* The samples of r (any n) on a fresh local engine, by index: an array of r->n to free
 * with rollout_results_free. */
static struct rollout_result *local_samples(struct model *m, const struct rollout_request *r, int max_seqs) {
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, max_seqs, 256);
    struct smelt_error err = {0};
    struct rollout_result *all = calloc((size_t)r->n, sizeof *all);
    cr_assert(all);
    TEST_OK(rollout_engine_add(e, r, &err), &err);
    while (!rollout_engine_idle(e)) {
        TEST_OK(rollout_engine_step(e, &err), &err);
        struct rollout_result *res;
        int n;
        TEST_OK(rollout_engine_take(e, &res, &n, &err), &err);
        for (int i = 0; i < n; i++) {
            cr_assert(res[i].sample_index >= 0 && res[i].sample_index < r->n && !all[res[i].sample_index].ids);
            all[res[i].sample_index] = res[i];
        }
        free(res); /* the arrays inside now belong to all */
    }
    rollout_engine_free(e);
    return all;
}

/* Sample s of got equals the engine's result want: tokens always, logprobs to within
 * tol (0: bit for bit). */
static void expect_sample(const struct samples *got, int s, const struct rollout_result *want, double tol,
                          const char *what) {
    const int32_t *ids = got->ids + s * MAX_TOKENS;
    const float *lp = got->logprobs + s * MAX_TOKENS;
    cr_expect_eq(got->n_tokens[s], want->n, "%s sample %d: %lld tokens, expected %lld", what, s,
                 (long long)got->n_tokens[s], (long long)want->n);
    int64_t n = got->n_tokens[s] < want->n ? got->n_tokens[s] : want->n;
    cr_expect_eq(memcmp(ids, want->ids, (size_t)n * 4), 0, "%s sample %d: tokens differ", what, s);
    if (tol == 0) cr_expect_eq(memcmp(lp, want->logprobs, (size_t)n * 4), 0, "%s sample %d: logprobs differ", what, s);
    for (int64_t t = 0; tol > 0 && t < n; t++)
        cr_expect_float_eq(lp[t], want->logprobs[t], tol, "%s sample %d token %lld logprob", what, s, (long long)t);
    cr_expect_str_eq(got->reason[s], want->finish_reason, "%s sample %d", what, s);
}

static bool same_tokens(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && memcmp(a, b, (size_t)na * 4) == 0;
}

/* Other weights: every one scaled and nudged, enough to change greedy output. */
static void perturb(float *w, int64_t n, uint64_t seed) {
    struct test_rng rng = {seed};
    for (int64_t i = 0; i < n; i++) w[i] = w[i] * 1.3f + (float)test_rng_uniform(&rng, -0.02, 0.02);
}

/* ---- hash, metadata, messages ---- */

Test(weightsync, hash_is_xxh64) {
    /* Reference values from the xxhash package (XXH64, seed 0) on bytes ((i*131+7)>>1) & 255. */
    static const struct { size_t n; uint64_t want; } cases[] = {
        {0, 0xef46db3751d8e999ull},  {1, 0x1f25c8d0bc1f4bb6ull},   {3, 0xfae6158de2e681c8ull},
        {4, 0x62917774d28ea099ull},  {7, 0x2e36725b00842ee2ull},   {8, 0xd8a37a7456ca36fdull},
        {31, 0xcec8c2be9bd26a69ull}, {32, 0xb69064153d4851a5ull},  {33, 0x732da22315773994ull},
        {63, 0x4a1b11c93a45e7eeull}, {64, 0x7f35aafc3388c0b8ull},  {100, 0x1c0c2332e8ff479aull},
        {1000, 0xc7227a16ad9064c5ull}, {1 << 20, 0xb37d43368b529db3ull},
    };
    uint8_t *bytes = malloc(1 << 20);
    cr_assert(bytes);
    for (size_t i = 0; i < (1 << 20); i++) bytes[i] = (uint8_t)(((i * 131 + 7) >> 1) & 255);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        cr_expect_eq(weightsync_hash(bytes, cases[k].n), cases[k].want, "XXH64 of %zu bytes: %016llx, expected %016llx",
                     cases[k].n, (unsigned long long)weightsync_hash(bytes, cases[k].n),
                     (unsigned long long)cases[k].want);
    cr_expect_eq(weightsync_hash("abc", 3), 0x44bc2cf5ad770999ull, "XXH64(\"abc\")");
    /* One flipped bit anywhere changes it. */
    uint64_t h = weightsync_hash(bytes, 4096);
    bytes[4095] ^= 1;
    cr_expect_neq(weightsync_hash(bytes, 4096), h);
    free(bytes);
}

/* The tensors tile [0, total_bytes) in order and name the buffer's parameters. */
static void expect_tiling(const struct weightsync_meta *m, int64_t n_elements) {
    int64_t at = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct weightsync_tensor *t = &m->tensors[i];
        cr_expect_eq(t->offset_bytes, at, "tensor %d (%s) at %lld, expected %lld", i, t->name,
                     (long long)t->offset_bytes, (long long)at);
        cr_expect_eq(t->bytes, t->shape[0] * t->shape[1] * 4, "tensor %d (%s): bytes and shape disagree", i, t->name);
        cr_expect_eq(t->dtype, DTYPE_F32);
        at += t->bytes;
    }
    cr_expect_eq(at, m->total_bytes);
    cr_expect_eq(m->total_bytes, n_elements * 4);
    cr_expect_eq(m->n_buckets, (m->total_bytes + m->bucket_bytes - 1) / m->bucket_bytes);
}

Test(weightsync, metadata_describes_the_flat_buffers) {
    struct smelt_error err = {0};
    const char *types[] = {"llama", "gpt2", "qwen3"};
    for (int k = 0; k < 3; k++) {
        struct model *m = rollout_test_load(types[k]);
        struct weightsync_meta meta;
        TEST_OK(weightsync_meta_model(m, 4, 4000, &meta, &err), &err);
        cr_expect_eq(meta.kind, WEIGHTSYNC_FULL);
        cr_expect_eq(meta.version, 4);
        cr_expect_eq(meta.n_tensors, m->n_params);
        for (int i = 0; i < m->n_params && i < meta.n_tensors; i++) {
            cr_expect_str_eq(meta.tensors[i].name, m->params[i].name);
            cr_expect_eq(meta.tensors[i].ndim, m->params[i].ndim);
        }
        expect_tiling(&meta, m->n_weights);
        cr_expect_eq(weightsync_bucket_size(&meta, 0), 4000);
        cr_expect_eq(weightsync_bucket_size(&meta, meta.n_buckets - 1),
                     meta.total_bytes - (meta.n_buckets - 1) * 4000, "the last bucket holds what is left");
        cr_expect_eq(weightsync_bucket_size(&meta, meta.n_buckets), 0);
        weightsync_meta_free(&meta);
        TEST_OK(weightsync_meta_model(m, 0, 0, &meta, &err), &err);
        cr_expect_eq(meta.bucket_bytes, WEIGHTSYNC_DEFAULT_BUCKET_BYTES);
        cr_expect_eq(meta.n_buckets, 1);
        weightsync_meta_free(&meta);
        int64_t bad[] = {3, 6, 2, -4, WEIGHTSYNC_MAX_BUCKET_BYTES + 4};
        for (int i = 0; i < 5; i++) {
            TEST_EXPECT_ERROR(weightsync_meta_model(m, 0, bad[i], &meta, &err), SMELT_EINVAL, &err);
            cr_expect_str_eq(err.field, "bucket_bytes");
        }
        model_free(m);
    }
    struct model *m = rollout_test_load("llama");
    struct lora *l;
    TEST_OK(lora_load(m, "tests/data/parity/llama-lora", &l, &err), &err);
    struct weightsync_meta meta;
    TEST_OK(weightsync_meta_lora(l, 2, 256, &meta, &err), &err);
    cr_expect_eq(meta.kind, WEIGHTSYNC_LORA);
    cr_expect_eq(meta.n_tensors, l->n_params);
    cr_expect_str_eq(meta.tensors[0].name, l->params[0].name);
    cr_expect(strstr(meta.tensors[0].name, "lora_A") != NULL, "PEFT's names: %s", meta.tensors[0].name);
    cr_expect_eq(meta.lora.rank, l->config.rank);
    cr_expect_eq(meta.lora.alpha, l->config.alpha);
    expect_tiling(&meta, l->n_weights);
    weightsync_meta_free(&meta);
    lora_free(l);
    model_free(m);
}

/* A message as msg_recv would give it: header (stolen) and one optional frame. */
static struct msg message_of(const char *type, json_t *header, void *frame, size_t bytes) {
    struct msg m = {.header = header};
    snprintf(m.type, sizeof m.type, "%s", type);
    if (frame) {
        m.arrays[0] = (struct msg_array){frame, bytes};
        m.n_arrays = 1;
    }
    return m;
}

static json_t *parse(const char *text) {
    json_error_t jerr;
    json_t *h = json_loads(text, 0, &jerr);
    cr_assert(h, "test header %s: %s", text, jerr.text);
    return h;
}

Test(weightsync, messages_read_back_and_name_bad_fields) {
    struct model *m = rollout_test_load("qwen3");
    struct lora *l;
    struct smelt_error err = {0};
    TEST_OK(lora_load(m, "tests/data/parity/qwen3-lora", &l, &err), &err);
    for (int kind = 0; kind < 2; kind++) {
        struct weightsync_meta meta, back;
        if (kind == 0) TEST_OK(weightsync_meta_model(m, 12, 1000, &meta, &err), &err);
        else TEST_OK(weightsync_meta_lora(l, 12, 1000, &meta, &err), &err);
        struct msg msg = message_of(MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta), NULL, 0);
        cr_assert(msg.header);
        TEST_OK(weightsync_begin_read(&msg, &back, &err), &err);
        cr_expect_eq(back.kind, meta.kind);
        cr_expect_eq(back.version, 12);
        cr_expect_eq(back.total_bytes, meta.total_bytes);
        cr_expect_eq(back.bucket_bytes, 1000);
        cr_expect_eq(back.n_buckets, meta.n_buckets);
        cr_expect_eq(back.lora.rank, meta.lora.rank);
        cr_expect_eq(back.lora.alpha, meta.lora.alpha);
        cr_expect_eq(back.lora.use_rslora, meta.lora.use_rslora);
        cr_assert_eq(back.n_tensors, meta.n_tensors);
        cr_expect_eq(memcmp(back.tensors, meta.tensors, (size_t)meta.n_tensors * sizeof *meta.tensors), 0,
                     "the tensor table changed on the way");
        weightsync_meta_free(&back);
        json_decref(msg.header);
        weightsync_meta_free(&meta);
    }
    /* A bucket and an ack. */
    uint8_t bytes[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct weightsync_bucket b = {.version = 3, .index = 7, .data = bytes, .bytes = 12,
                                  .hash = weightsync_hash(bytes, 12)}, bb;
    struct msg msg = message_of(MSG_WEIGHTS_BUCKET, weightsync_bucket_header(&b), bytes, sizeof bytes);
    TEST_OK(weightsync_bucket_read(&msg, &bb, &err), &err);
    cr_expect(bb.version == 3 && bb.index == 7 && bb.bytes == 12 && bb.hash == b.hash && bb.data == (void *)bytes);
    json_decref(msg.header);
    struct weightsync_ack a = {.version = 5, .kind = WEIGHTSYNC_LORA, .bytes = 4096, .buckets = 2, .seconds = 0.25}, ab;
    msg = message_of(MSG_WEIGHTS_ACK, weightsync_ack_header(&a), NULL, 0);
    TEST_OK(weightsync_ack_read(&msg, &ab, &err), &err);
    cr_expect(ab.version == 5 && ab.kind == WEIGHTSYNC_LORA && ab.bytes == 4096 && ab.buckets == 2 &&
              ab.seconds == 0.25);
    json_decref(msg.header);

    /* Refusals name the field. */
    static const struct { const char *type, *header, *field; } bad[] = {
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"half\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": []}", "kind"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": -1, \"kind\": \"full\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": []}", "version"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"full\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": {}}", "tensors"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"full\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": [], \"extra\": 1}", "extra"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"full\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": [{\"name\": \"w\", \"dtype\": \"f64\", \"shape\": [2], "
                            "\"offset\": 0, \"bytes\": 8}]}", "tensors[0].dtype"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"full\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": [{\"name\": \"w\", \"dtype\": \"f32\", \"shape\": [2, 0], "
                            "\"offset\": 0, \"bytes\": 8}]}", "tensors[0].shape"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"lora\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": []}", "lora"},
        {MSG_WEIGHTS_BEGIN, "{\"version\": 1, \"kind\": \"lora\", \"total_bytes\": 8, \"bucket_bytes\": 8, "
                            "\"n_buckets\": 1, \"tensors\": [], \"lora\": {\"r\": 0, \"lora_alpha\": 2, "
                            "\"use_rslora\": false}}", "lora.r"},
        {MSG_WEIGHTS_BUCKET, "{\"version\": 1, \"index\": 0, \"hash\": \"0123\"}", "hash"},
        {MSG_WEIGHTS_BUCKET, "{\"version\": 1, \"index\": 0, \"hash\": \"0123456789ABCDEF\"}", "hash"},
        {MSG_WEIGHTS_BUCKET, "{\"version\": 1, \"index\": -2, \"hash\": \"0123456789abcdef\"}", "index"},
        {MSG_WEIGHTS_END, "{\"version\": 1, \"n_buckets\": 1}", "total_bytes"},
        {MSG_WEIGHTS_ACK, "{\"version\": 1, \"kind\": \"full\", \"bytes\": 1, \"buckets\": 1}", "seconds"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        msg = message_of(bad[i].type, parse(bad[i].header), bytes, sizeof bytes);
        int rc;
        struct weightsync_meta meta;
        int64_t x, y, z;
        error_clear(&err);
        if (strcmp(bad[i].type, MSG_WEIGHTS_BEGIN) == 0) rc = weightsync_begin_read(&msg, &meta, &err);
        else if (strcmp(bad[i].type, MSG_WEIGHTS_BUCKET) == 0) rc = weightsync_bucket_read(&msg, &bb, &err);
        else if (strcmp(bad[i].type, MSG_WEIGHTS_END) == 0) rc = weightsync_end_read(&msg, &x, &y, &z, &err);
        else rc = weightsync_ack_read(&msg, &ab, &err);
        cr_expect_eq(rc, SMELT_EINVAL, "case %zu (%s) was accepted", i, bad[i].header);
        cr_expect_str_eq(err.field, bad[i].field, "case %zu: %s", i, err.message);
        json_decref(msg.header);
    }
    /* A bucket without its frame. */
    msg = message_of(MSG_WEIGHTS_BUCKET, weightsync_bucket_header(&b), NULL, 0);
    TEST_EXPECT_ERROR(weightsync_bucket_read(&msg, &bb, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "bytes");
    json_decref(msg.header);
    lora_free(l);
    model_free(m);
}

/* ---- the transport interface, in process ---- */

/* A transport straight into a receiver: buckets held back and delivered in reverse order
 * at finish (any order is fine), either copied (as a message transport does) or written
 * in place through bucket_dst / landed (as a collective would). */
struct loopback {
    struct weightsync_receiver *rx;
    bool in_place;
    int64_t current_version;
    uint8_t **held;
    int64_t *held_bytes;
    uint64_t *held_hash;
    int64_t n_held;
    int begins, ends;
};

static int loop_begin(void *ctx, const struct weightsync_meta *meta, struct smelt_error *err) {
    struct loopback *lb = ctx;
    lb->begins++;
    lb->held = calloc((size_t)meta->n_buckets, sizeof *lb->held);
    lb->held_bytes = calloc((size_t)meta->n_buckets, sizeof *lb->held_bytes);
    lb->held_hash = calloc((size_t)meta->n_buckets, sizeof *lb->held_hash);
    cr_assert(lb->held && lb->held_bytes && lb->held_hash);
    return weightsync_receiver_begin(lb->rx, meta, lb->current_version, err);
}

static int loop_bucket(void *ctx, const struct weightsync_bucket *b, struct smelt_error *err) {
    (void)err;
    struct loopback *lb = ctx;
    cr_assert_eq(b->index, lb->n_held, "buckets go out in order");
    lb->held[lb->n_held] = malloc((size_t)b->bytes);
    cr_assert(lb->held[lb->n_held]);
    memcpy(lb->held[lb->n_held], b->data, (size_t)b->bytes); /* b->data is valid during the call only */
    lb->held_bytes[lb->n_held] = b->bytes;
    lb->held_hash[lb->n_held++] = b->hash;
    return SMELT_OK;
}

static int loop_finish(void *ctx, const struct weightsync_meta *meta, struct weightsync_report *report,
                       struct smelt_error *err) {
    struct loopback *lb = ctx;
    int rc = SMELT_OK;
    for (int64_t k = lb->n_held - 1; k >= 0 && !rc; k--) {
        if (lb->in_place) {
            void *dst;
            int64_t bytes;
            rc = weightsync_receiver_bucket_dst(lb->rx, meta->version, k, &dst, &bytes, err);
            if (!rc) {
                cr_expect_eq(bytes, lb->held_bytes[k]);
                memcpy(dst, lb->held[k], (size_t)bytes);
                rc = weightsync_receiver_landed(lb->rx, meta->version, k, lb->held_hash[k], err);
            }
        } else {
            struct weightsync_bucket b = {.version = meta->version, .index = k, .data = lb->held[k],
                                          .bytes = lb->held_bytes[k], .hash = lb->held_hash[k]};
            rc = weightsync_receiver_bucket(lb->rx, &b, err);
        }
    }
    for (int64_t k = 0; k < lb->n_held; k++) free(lb->held[k]);
    free(lb->held), free(lb->held_bytes), free(lb->held_hash);
    lb->held = NULL;
    lb->n_held = 0;
    lb->ends++;
    if (!rc) rc = weightsync_receiver_end(lb->rx, meta->version, meta->n_buckets, meta->total_bytes, err);
    if (rc) return rc;
    struct weightsync_ack ack = weightsync_receiver_done(lb->rx);
    report->receivers = 1;
    report->bytes_sent = ack.bytes;
    report->receiver_seconds = ack.seconds;
    return SMELT_OK;
}

Test(weightsync, a_push_through_any_transport_lands_every_byte) {
    struct model *trainer = rollout_test_load("gpt2"), *worker = rollout_test_load("gpt2");
    perturb(trainer->weights.data, trainer->n_weights, 5);
    struct smelt_error err = {0};
    struct weightsync_receiver rx;
    TEST_OK(weightsync_receiver_init(&rx, worker, NULL, &err), &err);
    for (int in_place = 0; in_place < 2; in_place++) {
        struct loopback lb = {.rx = &rx, .in_place = in_place, .current_version = in_place};
        struct weightsync_transport t = {.ctx = &lb, .begin = loop_begin, .bucket = loop_bucket,
                                         .finish = loop_finish};
        struct weightsync_meta meta;
        /* 1028 bytes: no tensor boundary falls on a bucket boundary by design. */
        TEST_OK(weightsync_meta_model(trainer, in_place + 1, 1028, &meta, &err), &err);
        struct weightsync_report report;
        TEST_OK(weightsync_push(&t, &meta, &trainer->weights, &report, &err), &err);
        cr_expect_eq(lb.begins, 1);
        cr_expect_eq(lb.ends, 1);
        cr_expect_eq(report.version, in_place + 1);
        cr_expect_eq(report.bytes, trainer->n_weights * 4);
        cr_expect_eq(report.bytes_sent, trainer->n_weights * 4);
        cr_expect_eq(report.buckets, (trainer->n_weights * 4 + 1027) / 1028);
        cr_expect(report.seconds >= report.send_seconds && report.send_seconds >= 0);
        /* The staging buffer holds the stream until the next begin. */
        cr_expect_eq(memcmp(rx.staging, trainer->weights.data, (size_t)meta.total_bytes), 0,
                     "%s: the staged bytes are not the trainer's", in_place ? "in place" : "copied");
        cr_expect(!weightsync_receiver_busy(&rx));
        weightsync_meta_free(&meta);
    }
    weightsync_receiver_free(&rx);
    model_free(trainer);
    model_free(worker);
}

/* The receiver alone: each refusal names its field and ends the sync; its later
 * messages are ignored, a new begin is taken. */
Test(weightsync, the_receiver_refuses_what_does_not_add_up) {
    struct model *m = rollout_test_load("llama");
    struct smelt_error err = {0};
    struct weightsync_receiver rx;
    TEST_OK(weightsync_receiver_init(&rx, m, NULL, &err), &err);
    struct weightsync_meta meta;
    TEST_OK(weightsync_meta_model(m, 2, 4096, &meta, &err), &err);
    const uint8_t *stream = m->weights.data;
    struct weightsync_bucket b0 = {.version = 2, .index = 0, .data = stream, .bytes = 4096,
                                   .hash = weightsync_hash(stream, 4096)};

    TEST_EXPECT_ERROR(weightsync_receiver_bucket(&rx, &b0, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "version", "a bucket without a begin: %s", err.message);
    cr_expect_eq(weightsync_receiver_bucket(&rx, &b0, &err), WEIGHTSYNC_IGNORED, "its sync is over: ignored");

    TEST_OK(weightsync_receiver_begin(&rx, &meta, 1, &err), &err);
    struct weightsync_bucket twice = b0;
    TEST_OK(weightsync_receiver_bucket(&rx, &b0, &err), &err);
    TEST_EXPECT_ERROR(weightsync_receiver_bucket(&rx, &twice, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "index");
    cr_expect(!weightsync_receiver_busy(&rx), "a refused sync is over");

    TEST_OK(weightsync_receiver_begin(&rx, &meta, 1, &err), &err);
    struct weightsync_bucket far = b0;
    far.index = meta.n_buckets;
    TEST_EXPECT_ERROR(weightsync_receiver_bucket(&rx, &far, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "index");

    /* A stray message of another version does not end the sync in progress. */
    TEST_OK(weightsync_receiver_begin(&rx, &meta, 1, &err), &err);
    struct weightsync_bucket stray = b0;
    stray.version = 9;
    TEST_EXPECT_ERROR(weightsync_receiver_bucket(&rx, &stray, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "version");
    cr_expect(weightsync_receiver_busy(&rx));
    TEST_EXPECT_ERROR(weightsync_receiver_end(&rx, 2, meta.n_buckets, meta.total_bytes + 4, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "total_bytes");

    /* Metadata that is not this model's. */
    struct weightsync_meta bad = meta;
    bad.n_buckets++;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &bad, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "n_buckets");
    bad = meta;
    bad.kind = WEIGHTSYNC_LORA;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &bad, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "kind", "lora without an adapter: %s", err.message);
    bad = meta;
    bad.n_tensors--;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &bad, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "tensors");
    cr_expect(strstr(err.message, meta.tensors[meta.n_tensors - 1].name), "names the missing tensor: %s", err.message);
    bad = meta;
    bad.version = 1;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &bad, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "version");
    struct weightsync_tensor saved = meta.tensors[1];
    meta.tensors[1].shape[0]++;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &meta, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "tensors[1]");
    meta.tensors[1] = meta.tensors[2];
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &meta, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "tensors[2]", "a tensor twice: %s", err.message);
    meta.tensors[1] = saved;
    meta.tensors[1].offset_bytes += 4;
    TEST_EXPECT_ERROR(weightsync_receiver_begin(&rx, &meta, 1, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "tensors[1]", "another layout: %s", err.message);
    meta.tensors[1] = saved;
    TEST_OK(weightsync_receiver_begin(&rx, &meta, 1, &err), &err);
    weightsync_receiver_abandon(&rx);
    weightsync_meta_free(&meta);
    weightsync_receiver_free(&rx);
    model_free(m);
}

/* ---- syncs into a serving worker ---- */

Test(weightsync, a_full_sync_gives_the_trainers_outputs) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    perturb(trainer->weights.data, trainer->n_weights, 11);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    rollout_test_serve(&s, ctx, ENDPOINT, worker, NULL, 16);
    /* 4000 bytes a bucket: tensors span buckets. */
    struct rollout_client *c = client_of(ctx, ENDPOINT, 4000);
    int32_t prompt[11];
    rollout_test_prompt(prompt, 11, 3, trainer->config.vocab_size);
    struct rollout_request r = request_of(prompt, 11, 1, 0, 0, 24);
    static struct samples before, after;
    generate(c, &r, &before);
    cr_expect_eq(before.version[0], 0);

    struct weightsync_report rep;
    struct smelt_error err = {0};
    TEST_OK(rollout_client_push_model(c, trainer, 3, &rep, &err), &err);
    cr_expect_eq(rep.version, 3);
    cr_expect_eq(rep.kind, WEIGHTSYNC_FULL);
    cr_expect_eq(rep.bytes, trainer->n_weights * 4, "bytes moved: %lld, the model's %lld", (long long)rep.bytes,
                 (long long)trainer->n_weights * 4);
    cr_expect_eq(rep.buckets, (trainer->n_weights * 4 + 3999) / 4000);
    cr_expect_eq(rep.receivers, 1);
    cr_expect_eq(rep.bytes_sent, rep.bytes);
    cr_expect(rep.seconds > 0 && rep.receiver_seconds > 0 && rep.receiver_seconds <= rep.seconds);
    generate(c, &r, &after);
    cr_expect_eq(after.version[0], 3, "a sample after the sync carries its version");
    rollout_client_free(c);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);

    cr_expect_eq(memcmp(worker->weights.data, trainer->weights.data, (size_t)trainer->n_weights * 4), 0,
                 "the worker's weights are not the trainer's");
    struct model *orig = rollout_test_load("llama");
    struct rollout_test_collected *old = local_run(orig, &r, 16);
    struct rollout_test_collected *want = local_run(trainer, &r, 16);
    model_free(orig);
    expect_sample(&before, 0, &old->r[0][0], 0, "before the sync");
    expect_sample(&after, 0, &want->r[0][0], 0, "after the sync");
    cr_expect(!same_tokens(old->r[0][0].ids, old->r[0][0].n, want->r[0][0].ids, want->r[0][0].n),
              "the new weights give the old output: the test could not tell a sync from none");
    /* The trainer's own forward (the plain-recompute reference generator). */
    struct generate_params gp = {.max_new_tokens = 24, .temperature = 0, .top_p = 1};
    struct generate_result ref;
    TEST_OK(model_generate_reference(trainer, prompt, 11, &gp, &ref, &err), &err);
    cr_expect_eq(after.n_tokens[0], ref.n);
    for (int64_t t = 0; t < ref.n && t < after.n_tokens[0]; t++) {
        cr_expect_eq(after.ids[t], ref.ids[t], "token %lld: %d, the trainer's forward %d", (long long)t,
                     after.ids[t], ref.ids[t]);
        cr_expect_float_eq(after.logprobs[t], ref.logprobs[t], 1e-4, "token %lld logprob", (long long)t);
    }
    generate_result_free(&ref);
    rollout_test_free_collected(old);
    rollout_test_free_collected(want);
    model_free(trainer);
    model_free(worker);
}

Test(weightsync, a_lora_sync_moves_only_the_adapter) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    struct lora *la, *lw;
    struct smelt_error err = {0};
    TEST_OK(lora_load(trainer, "tests/data/parity/llama-lora", &la, &err), &err);
    TEST_OK(lora_load(worker, "tests/data/parity/llama-lora", &lw, &err), &err);
    TEST_OK(lora_attach(la, &err), &err);
    TEST_OK(lora_attach(lw, &err), &err);
    perturb(la->weights.data, la->n_weights, 21);
    for (int64_t i = 0; i < la->n_weights; i++) ((float *)la->weights.data)[i] *= 4; /* a clear change */
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    rollout_test_serve(&s, ctx, ENDPOINT, worker, lw, 16);
    struct rollout_client *c = client_of(ctx, ENDPOINT, 1000);
    int32_t prompt[9];
    rollout_test_prompt(prompt, 9, 6, trainer->config.vocab_size);
    struct rollout_request r = request_of(prompt, 9, 1, 0, 0, 20);
    static struct samples before, after;
    generate(c, &r, &before);
    struct weightsync_report rep;
    TEST_OK(rollout_client_push_lora(c, la, 1, &rep, &err), &err);
    fprintf(stderr, "weightsync: a LoRA sync of rank %d moved %lld bytes in %lld buckets (adapter: %lld bytes, "
            "model: %lld bytes) in %.4f s\n", la->config.rank, (long long)rep.bytes, (long long)rep.buckets,
            (long long)la->n_weights * 4, (long long)trainer->n_weights * 4, rep.seconds);
    cr_expect_eq(rep.kind, WEIGHTSYNC_LORA);
    cr_expect_eq(rep.bytes, la->n_weights * 4, "bytes moved: %lld, the adapter's size %lld", (long long)rep.bytes,
                 (long long)la->n_weights * 4);
    cr_expect_lt(rep.bytes, trainer->n_weights * 4);
    cr_expect_eq(rep.buckets, (la->n_weights * 4 + 999) / 1000);
    generate(c, &r, &after);
    cr_expect_eq(after.version[0], 1);

    /* A full sync to a worker with an adapter replaces the base and keeps the adapter. */
    rollout_client_free(c);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);
    cr_expect_eq(memcmp(lw->weights.data, la->weights.data, (size_t)la->n_weights * 4), 0,
                 "the worker's adapter is not the trainer's");
    struct model *orig = rollout_test_load("llama");
    cr_expect_eq(memcmp(worker->weights.data, orig->weights.data, (size_t)orig->n_weights * 4), 0,
                 "a LoRA sync changed the base weights");
    model_free(orig);
    struct rollout_test_collected *want = local_run(trainer, &r, 16);
    expect_sample(&after, 0, &want->r[0][0], 0, "after the LoRA sync");
    cr_expect(!same_tokens(before.ids, before.n_tokens[0], want->r[0][0].ids, want->r[0][0].n),
              "the new adapter gives the old output: the test could not tell a sync from none");
    rollout_test_free_collected(want);
    lora_free(la);
    lora_free(lw);
    model_free(trainer);
    model_free(worker);
}

Test(weightsync, a_sync_in_the_middle_of_generation_never_mixes_versions) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    perturb(trainer->weights.data, trainer->n_weights, 31);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    rollout_test_serve(&s, ctx, ENDPOINT, worker, NULL, 2); /* two sequences at a time: many steps */
    struct rollout_client *c = client_of(ctx, ENDPOINT, 0);
    int32_t prompt[7];
    rollout_test_prompt(prompt, 7, 8, trainer->config.vocab_size);
    enum { N = MAX_SAMPLES };
    struct rollout_request r = request_of(prompt, 7, N, 1, 1234, 40);
    static struct samples got;
    struct rollout_client_results res = results_of(&got, N);
    struct smelt_error err = {0};
    TEST_OK(rollout_client_submit(c, &r, 1, &res, &err), &err);
    int64_t finished = 0;
    for (int tries = 0; finished == 0 && tries < 1000; tries++)
        TEST_OK(rollout_client_poll(c, 50, &finished, &err), &err);
    cr_assert(finished > 0 && finished < N, "%lld samples finished before the sync", (long long)finished);
    TEST_OK(rollout_client_push_model(c, trainer, 1, NULL, &err), &err);
    TEST_OK(rollout_client_collect(c, &err), &err);
    rollout_client_free(c);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);

    struct model *orig = rollout_test_load("llama");
    struct rollout_result *old = local_samples(orig, &r, 2), *want = local_samples(trainer, &r, 2);
    int n_old = 0, n_new = 0, differ = 0;
    for (int i = 0; i < N; i++) {
        char what[48];
        cr_assert(got.version[i] == 0 || got.version[i] == 1, "sample %d: version %lld", i, (long long)got.version[i]);
        bool is_new = got.version[i] == 1;
        snprintf(what, sizeof what, "version %d", is_new);
        /* Tokens exactly; logprobs to 1e-5, as the batches of a re-run differ from a clean run's. */
        expect_sample(&got, i, is_new ? &want[i] : &old[i], 1e-5, what);
        n_new += is_new;
        n_old += !is_new;
        differ += is_new && !same_tokens(old[i].ids, old[i].n, want[i].ids, want[i].n);
    }
    cr_expect(n_old > 0 && n_new > 0, "%d samples on the old weights, %d on the new: the sync was not mid-batch",
              n_old, n_new);
    cr_expect(differ * 2 >= n_new, "only %d of %d new samples differ from the old weights' (the test cannot tell)",
              differ, n_new);
    rollout_results_free(old, N);
    rollout_results_free(want, N);
    model_free(orig);
    model_free(trainer);
    model_free(worker);
}

/* ---- bad syncs, sent by hand ---- */

static void *dealer(void *ctx) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    cr_assert(d && zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero) == 0);
    cr_assert_eq(zmq_connect(d, ENDPOINT), 0);
    return d;
}

static void send_header(void *d, const char *type, json_t *h, const void *frame, size_t bytes) {
    cr_assert(h);
    struct msg_array a = {(void *)frame, bytes};
    struct smelt_error err = {0};
    TEST_OK(msg_send(d, NULL, 0, type, h, &a, frame ? 1 : 0, &err), &err);
    json_decref(h);
}

/* Bucket k of the stream; bytes_delta and hash_xor spoil it. */
static void send_bucket(void *d, const struct weightsync_meta *meta, const uint8_t *stream, int64_t k,
                        int64_t bytes_delta, uint64_t hash_xor) {
    int64_t bytes = weightsync_bucket_size(meta, k);
    const uint8_t *data = stream + k * meta->bucket_bytes;
    struct weightsync_bucket b = {.version = meta->version, .index = k, .data = data,
                                  .bytes = bytes + bytes_delta, .hash = weightsync_hash(data, (size_t)bytes) ^ hash_xor};
    send_header(d, MSG_WEIGHTS_BUCKET, weightsync_bucket_header(&b), data, (size_t)(bytes + bytes_delta));
}

/* The whole sync, but for bucket skip (-1: none). */
static void send_sync(void *d, const struct weightsync_meta *meta, const uint8_t *stream, int64_t skip) {
    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(meta), NULL, 0);
    for (int64_t k = 0; k < meta->n_buckets; k++)
        if (k != skip) send_bucket(d, meta, stream, k, 0, 0);
    send_header(d, MSG_WEIGHTS_END, weightsync_end_header(meta, NULL), NULL, 0);
}

static void recv_one(void *d, struct msg *m) {
    struct smelt_error err = {0};
    cr_assert_eq(msg_recv(d, false, 10000, m, &err), 0, "no answer from the worker: %s", err.message);
}

/* The next message is weights.error for version (-1: none given) naming field. */
static void expect_refused(void *d, int64_t version, const char *field, const char *what) {
    struct msg m;
    recv_one(d, &m);
    char *h = json_dumps(m.header, JSON_COMPACT);
    cr_expect_str_eq(m.type, MSG_WEIGHTS_ERROR, "%s: expected weights.error, got %s %s", what, m.type, h);
    const char *got = json_string_value(json_object_get(json_object_get(m.header, "error"), "field"));
    cr_expect(got && strcmp(got, field) == 0, "%s: field should be %s: %s", what, field, h);
    cr_expect_eq(weightsync_header_version(&m), version, "%s: %s", what, h);
    free(h);
    msg_free(&m);
}

/* health.reply comes next (nothing else was sent in between) with this policy version. */
static void expect_version(void *d, int64_t version, const char *what) {
    send_header(d, MSG_HEALTH_REQUEST, json_object(), NULL, 0);
    struct msg m;
    recv_one(d, &m);
    char *h = json_dumps(m.header, JSON_COMPACT);
    cr_expect_str_eq(m.type, MSG_HEALTH_REPLY, "%s: a stray answer: %s %s", what, m.type, h);
    cr_expect_eq(json_integer_value(json_object_get(m.header, "policy_version")), version, "%s: %s", what, h);
    free(h);
    msg_free(&m);
}

Test(weightsync, bad_syncs_are_refused_and_the_old_weights_stay) {
    struct model *trainer = rollout_test_load("llama"), *worker = rollout_test_load("llama");
    struct model *orig = rollout_test_load("llama");
    perturb(trainer->weights.data, trainer->n_weights, 41);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    rollout_test_serve(&s, ctx, ENDPOINT, worker, NULL, 16);
    void *d = dealer(ctx);
    const uint8_t *stream = trainer->weights.data;
    struct weightsync_meta meta;
    struct smelt_error err = {0};
    TEST_OK(weightsync_meta_model(trainer, 4, 8192, &meta, &err), &err);

    send_sync(d, &meta, stream, 3);
    expect_refused(d, 4, "n_buckets", "a missing bucket");
    expect_version(d, 0, "after a missing bucket");

    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta), NULL, 0);
    send_bucket(d, &meta, stream, 0, 0, 0);
    send_bucket(d, &meta, stream, 1, -4, 0);
    for (int64_t k = 2; k < meta.n_buckets; k++) send_bucket(d, &meta, stream, k, 0, 0);
    send_header(d, MSG_WEIGHTS_END, weightsync_end_header(&meta, NULL), NULL, 0);
    expect_refused(d, 4, "bytes", "a bucket of the wrong size");
    expect_version(d, 0, "after a short bucket (its sync's later messages are dropped)");

    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta), NULL, 0);
    for (int64_t k = 0; k < meta.n_buckets; k++) send_bucket(d, &meta, stream, k, 0, k == 2 ? 1 : 0);
    send_header(d, MSG_WEIGHTS_END, weightsync_end_header(&meta, NULL), NULL, 0);
    expect_refused(d, 4, "hash", "a wrong checksum");
    expect_version(d, 0, "after a wrong checksum");

    char saved[WEIGHTSYNC_NAME_BYTES];
    memcpy(saved, meta.tensors[2].name, sizeof saved);
    snprintf(meta.tensors[2].name, sizeof meta.tensors[2].name, "model.layers.0.mlp.bogus.weight");
    send_sync(d, &meta, stream, -1);
    expect_refused(d, 4, "tensors[2]", "an unknown tensor");
    memcpy(meta.tensors[2].name, saved, sizeof saved);
    expect_version(d, 0, "after an unknown tensor");

    struct weightsync_bucket lone = {.version = 9, .index = 0, .data = stream, .bytes = 8192,
                                     .hash = weightsync_hash(stream, 8192)};
    send_header(d, MSG_WEIGHTS_BUCKET, weightsync_bucket_header(&lone), stream, 8192);
    expect_refused(d, 9, "version", "a bucket without a begin");
    meta.kind = WEIGHTSYNC_LORA;
    meta.lora.rank = 4;
    meta.lora.alpha = 8;
    send_header(d, MSG_WEIGHTS_BEGIN, weightsync_begin_header(&meta), NULL, 0);
    expect_refused(d, 4, "kind", "lora to a worker without an adapter");
    meta.kind = WEIGHTSYNC_FULL;
    json_t *h = weightsync_begin_header(&meta);
    json_object_set_new(h, "v", json_integer(MSG_VERSION + 1));
    send_header(d, MSG_WEIGHTS_BEGIN, h, NULL, 0);
    expect_refused(d, 4, "v", "another protocol version");
    expect_version(d, 0, "after the refusals");

    /* A good sync, then versions that do not move forward. */
    send_sync(d, &meta, stream, -1);
    struct msg ack;
    recv_one(d, &ack);
    cr_assert_str_eq(ack.type, MSG_WEIGHTS_ACK, "the good sync was not acknowledged");
    struct weightsync_ack a;
    TEST_OK(weightsync_ack_read(&ack, &a, &err), &err);
    cr_expect(a.version == 4 && a.bytes == meta.total_bytes && a.buckets == meta.n_buckets && a.kind == WEIGHTSYNC_FULL);
    msg_free(&ack);
    for (int64_t v = 4; v >= 3; v--) {
        struct weightsync_meta back = meta;
        back.version = v;
        perturb(orig->weights.data, orig->n_weights, (uint64_t)v); /* other bytes, which must not land */
        send_sync(d, &back, orig->weights.data, -1);
        expect_refused(d, v, "version", v == 4 ? "the same version again" : "a version going backwards");
    }
    expect_version(d, 4, "after refused versions");

    /* Still serving, on the version-4 weights. */
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    send_header(d, MSG_GEN_REQUEST, json_pack("{s:s, s:f, s:i, s:b}", "id", "after", "temperature", 0.0,
                                              "max_new_tokens", 4, "ignore_eos", 1), prompt, sizeof prompt);
    struct msg res;
    recv_one(d, &res);
    cr_expect_str_eq(res.type, MSG_GEN_RESULT);
    cr_expect_eq(json_integer_value(json_object_get(res.header, "policy_version")), 4);
    msg_free(&res);
    zmq_close(d);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);
    cr_expect_eq(memcmp(worker->weights.data, trainer->weights.data, (size_t)trainer->n_weights * 4), 0,
                 "the worker's weights are not the last accepted sync's");
    weightsync_meta_free(&meta);
    model_free(orig);
    model_free(trainer);
    model_free(worker);
}

/* A sync whose adapter configuration differs is refused too (the shapes alone would not
 * show a different alpha). */
Test(weightsync, a_lora_sync_of_another_configuration_is_refused) {
    struct model *worker = rollout_test_load("llama");
    struct lora *lw;
    struct smelt_error err = {0};
    TEST_OK(lora_load(worker, "tests/data/parity/llama-lora", &lw, &err), &err);
    TEST_OK(lora_attach(lw, &err), &err);
    void *ctx = zmq_ctx_new();
    struct rollout_test_worker s;
    rollout_test_serve(&s, ctx, ENDPOINT, worker, lw, 16);
    void *d = dealer(ctx);
    struct weightsync_meta meta;
    TEST_OK(weightsync_meta_lora(lw, 1, 0, &meta, &err), &err);
    meta.lora.alpha *= 2;
    send_sync(d, &meta, lw->weights.data, -1);
    expect_refused(d, 1, "lora", "another lora_alpha");
    expect_version(d, 0, "after a refused adapter");
    zmq_close(d);
    rollout_test_unserve(&s);
    zmq_ctx_term(ctx);
    weightsync_meta_free(&meta);
    lora_free(lw);
    model_free(worker);
}

/* ---- the colocated placement: weights changed in place ---- */

Test(weightsync, colocated_weights_changed_reruns_unfinished_samples) {
    struct model *m = rollout_test_load("llama"), *m2 = rollout_test_load("llama");
    perturb(m2->weights.data, m2->n_weights, 51);
    int32_t prompt[8];
    rollout_test_prompt(prompt, 8, 2, m->config.vocab_size);
    struct rollout_request r = request_of(prompt, 8, 3, 1, 77, 20);
    struct rollout_test_collected *want = local_run(m2, &r, 8);
    struct smelt_error err = {0};
    struct rollout_engine *e = rollout_test_engine(m, NULL, 1024, 256, 8, 256);
    TEST_OK(rollout_engine_add(e, &r, &err), &err);
    for (int i = 0; i < 5; i++) TEST_OK(rollout_engine_step(e, &err), &err);
    /* The optimizer step, in place: the engine's model is the trainer's. */
    memcpy(m->weights.data, m2->weights.data, (size_t)m->n_weights * 4);
    TEST_OK(rollout_engine_weights_changed(e, 7, &err), &err);
    TEST_EXPECT_ERROR(rollout_engine_weights_changed(e, 7, &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "version");
    TEST_EXPECT_ERROR(rollout_engine_set_weights_version(e, m2->weights.data, m2->n_weights, 6, &err), SMELT_EINVAL,
                      &err);
    cr_expect_str_eq(err.field, "version");
    cr_expect_eq(rollout_engine_stats(e).policy_version, 7);
    struct rollout_test_collected *got = rollout_test_run_all(e);
    for (int i = 0; i < 3; i++) {
        const struct rollout_result *g = &got->r[0][i], *w = &want->r[0][i];
        cr_assert(got->have[0][i]);
        cr_expect_eq(g->policy_version, 7);
        cr_expect(same_tokens(g->ids, g->n, w->ids, w->n), "sample %d mixes policy versions", i);
        for (int64_t t = 0; t < g->n && t < w->n; t++)
            cr_expect_float_eq(g->logprobs[t], w->logprobs[t], 1e-5, "sample %d token %lld logprob", i, (long long)t);
    }
    /* set_weights still counts up from the version it finds. */
    TEST_OK(rollout_engine_set_weights(e, m2->weights.data, m2->n_weights, &err), &err);
    cr_expect_eq(rollout_engine_stats(e).policy_version, 8);
    rollout_test_free_collected(got);
    rollout_test_free_collected(want);
    rollout_engine_free(e);
    model_free(m);
    model_free(m2);
}
