/* ZeRO-3: the model's parameter-provider seam and trainer/zero3.c.
 *  - seam: a provider serving each unit from a separate copy, through two slots it
 *    poisons (NaN) on release, with the model's own buffer poisoned too, must give the
 *    plain model's logprobs, hidden states and gradients bit for bit: llama (untied
 *    head) and GPT-2 (tied), with and without recompute, with and without a LoRA adapter.
 *  - zero3: 1, 2 and 3 forked ranks over a file store, each on its own batch: logprobs
 *    bitwise the plain model's, the gradient shard within 1e-6 (relative to the unit's
 *    largest) of the plain one-rank gradient over every rank's batch, the whole weights gone and the rank's parameter bytes
 *    ~ 1/N plus two gather buffers; gathering the model back gives its weights. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/clock.h"
#include "common/file.h"
#include "tests/unit/lora_testutil.h"
#include "trainer/trainer_internal.h"

/* The LoRA tests' random model (lora_testutil.h) with seed 7. */
static struct model *tiny_model(const char *type) { return lora_test_model(type, 7); }

static void fill_nan(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

static struct lora *tiny_adapter(struct model *m) {
    struct smelt_error err;
    struct lora_config c = {.rank = 4, .alpha = 8.0f, .n_targets = 1};
    snprintf(c.targets[0], sizeof c.targets[0], "all-linear");
    struct lora *l;
    TEST_OK(lora_create(m, &c, 21, &l, &err), &err);
    lora_fill_random(l, 22, 0.3);
    TEST_OK(lora_attach(l, &err), &err);
    return l;
}

/* ---- the seam: a provider serving a separate copy ------------------------------------ */

struct copy_provider {
    const float *src;      /* the whole weights */
    float *slot[2];        /* [max unit] each; NaN while free */
    int64_t slot_unit[2];
    int holds[2];
    float *grads;          /* the whole gradient buffer; NULL: frozen base */
    int64_t max_unit;
    int begins, grads_ready;
    struct model_param_provider p;
};

static int cp_begin(void *ctx, struct model *m, bool backward, struct smelt_error *err) {
    (void)m, (void)backward, (void)err;
    ((struct copy_provider *)ctx)->begins++;
    return SMELT_OK;
}

static int cp_find(struct copy_provider *c, int64_t u) {
    for (int i = 0; i < 2; i++)
        if (c->holds[i] > 0 && c->slot_unit[i] == u) return i;
    return -1;
}

static int cp_acquire(void *ctx, struct model *m, int64_t u, bool bwd, struct smelt_error *err) {
    struct copy_provider *c = ctx;
    int64_t off, n;
    model_unit_range(m, u, &off, &n);
    int i = cp_find(c, u);
    if (i < 0) {
        i = c->holds[0] == 0 ? 0 : c->holds[1] == 0 ? 1 : -1;
        if (i < 0) return error_set(err, SMELT_EINVAL, "copy provider: a third unit held (%lld)", (long long)u);
        memcpy(c->slot[i], c->src + off, (size_t)n * sizeof(float));
        c->slot_unit[i] = u;
    }
    c->holds[i]++;
    model_unit_bind(m, u, c->slot[i], bwd && c->grads ? c->grads + off : NULL);
    return SMELT_OK;
}

static int cp_release(void *ctx, struct model *m, int64_t u, struct smelt_error *err) {
    struct copy_provider *c = ctx;
    int i = cp_find(c, u);
    if (i < 0) return error_set(err, SMELT_EINVAL, "copy provider: unit %lld released, not held", (long long)u);
    if (--c->holds[i] == 0) {
        fill_nan(c->slot[i], c->max_unit);
        model_unit_bind(m, u, NULL, NULL);
    }
    return SMELT_OK;
}

static int cp_grads_ready(void *ctx, struct model *m, int64_t u, struct smelt_error *err) {
    struct copy_provider *c = ctx;
    (void)m;
    if (cp_find(c, u) < 0) return error_set(err, SMELT_EINVAL, "copy provider: gradients of unit %lld, not held", (long long)u);
    c->grads_ready++;
    return SMELT_OK;
}

static int64_t max_unit(const struct model *m) {
    int64_t best = 0;
    for (int64_t u = 0; u < model_unit_count(m); u++) {
        int64_t off, n;
        model_unit_range(m, u, &off, &n);
        best = n > best ? n : best;
    }
    return best;
}

static void copy_provider_init(struct copy_provider *c, struct model *m, const float *src, bool grads) {
    memset(c, 0, sizeof *c);
    c->src = src;
    c->max_unit = max_unit(m);
    for (int i = 0; i < 2; i++) {
        c->slot[i] = test_zeros_f32(c->max_unit);
        fill_nan(c->slot[i], c->max_unit);
    }
    c->grads = grads ? test_zeros_f32(m->n_weights) : NULL;
    c->p = (struct model_param_provider){.ctx = c, .base_grads = grads, .begin = cp_begin,
                                         .acquire = cp_acquire, .release = cp_release,
                                         .grads_ready = cp_grads_ready};
}

static void copy_provider_free(struct copy_provider *c) {
    free(c->slot[0]);
    free(c->slot[1]);
    free(c->grads);
}

/* What one forward + backward gives: logprobs [T], hidden [T, C]. */
struct pass_out {
    float lp[64], *hidden;
};

static void run_pass(struct model *m, bool recompute, const struct parity_packed *p, const float *dhidden,
                     struct pass_out *out) {
    struct smelt_error err;
    struct model_acts *acts;
    TEST_OK(model_acts_alloc(m, p->T, recompute, &acts, &err), &err);
    int64_t C = m->config.hidden_size, hshape[2] = {p->T, C};
    out->hidden = test_zeros_f32(p->T * C);
    struct tensor lp = tensor_f32(out->lp, 1, &p->T), hid = tensor_f32(out->hidden, 2, hshape);
    struct tensor dlp = tensor_f32((float *)p->weights, 1, &p->T), dh = tensor_f32((float *)dhidden, 2, hshape);
    struct model_batch b = parity_batch_of(p);
    TEST_OK(model_forward(m, acts, &b, &lp, NULL, &hid, &err), &err);
    TEST_OK(model_backward(m, acts, &dlp, &dh, &err), &err);
    model_acts_free(acts);
}

static void expect_same_bits(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            cr_expect_fail("%s: element %lld is %.9g, the plain model's %.9g", what, (long long)i, got[i], want[i]);
            return;
        }
}

static void check_seam(const char *type, bool recompute, bool with_lora) {
    struct smelt_error err;
    struct model *plain = tiny_model(type), *served = tiny_model(type);
    struct lora *la = with_lora ? tiny_adapter(plain) : NULL, *lb = with_lora ? tiny_adapter(served) : NULL;
    if (!with_lora) TEST_OK(model_grads_alloc(plain, &err), &err);
    struct copy_provider cp;
    copy_provider_init(&cp, served, plain->weights.data, !with_lora);
    fill_nan(served->weights.data, served->n_weights); /* only the provider's copy may be read */
    TEST_OK(model_set_param_provider(served, &cp.p, &err), &err);

    struct parity_packed p;
    parity_load_inputs(type, &p);
    int64_t C = plain->config.hidden_size;
    struct test_rng rng = {5};
    float *dhidden = test_rand_f32(&rng, p.T * C, -0.1, 0.1);
    struct pass_out a, b;
    run_pass(plain, recompute, &p, dhidden, &a);
    run_pass(served, recompute, &p, dhidden, &b);
    expect_same_bits("logprobs", b.lp, a.lp, p.T);
    expect_same_bits("hidden", b.hidden, a.hidden, p.T * C);
    if (with_lora)
        expect_same_bits("adapter gradients", lb->grads.data, la->grads.data, la->n_weights);
    else
        expect_same_bits("gradients", cp.grads, plain->grads.data, plain->n_weights);
    cr_expect_eq(cp.begins, 2, "one begin per pass, got %d", cp.begins);
    cr_expect_eq(cp.holds[0] + cp.holds[1], 0, "units still held after the passes");
    int64_t want_ready = with_lora ? 0 : model_unit_count(plain) + (plain->config.tie_word_embeddings ? 1 : 0);
    cr_expect_eq(cp.grads_ready, want_ready, "grads_ready calls: %d, expected %lld", cp.grads_ready, (long long)want_ready);
    free(a.hidden), free(b.hidden), free(dhidden);
    lora_free(la), lora_free(lb);
    copy_provider_free(&cp);
    model_free(plain), model_free(served);
}

Test(zero3_seam, llama_bitwise) { check_seam("llama", false, false); }
Test(zero3_seam, llama_recompute_bitwise) { check_seam("llama", true, false); }
Test(zero3_seam, llama_lora_bitwise) { check_seam("llama", false, true); }
Test(zero3_seam, llama_lora_recompute_bitwise) { check_seam("llama", true, true); }
Test(zero3_seam, gpt2_tied_bitwise) { check_seam("gpt2", false, false); }
Test(zero3_seam, gpt2_tied_recompute_bitwise) { check_seam("gpt2", true, false); }
Test(zero3_seam, gpt2_lora_bitwise) { check_seam("gpt2", false, true); }
Test(zero3_seam, gpt2_lora_recompute_bitwise) { check_seam("gpt2", true, true); }

/* Units are contiguous, in parameter order, and cover the buffer; a tied head's unit is
 * only the final norm. */
Test(zero3_seam, unit_layout) {
    const char *types[] = {"llama", "gpt2"};
    for (int k = 0; k < 2; k++) {
        struct model *m = tiny_model(types[k]);
        int64_t end = 0;
        for (int64_t u = 0; u < model_unit_count(m); u++) {
            int64_t off, n;
            model_unit_range(m, u, &off, &n);
            cr_expect_eq(off, end, "%s: unit %lld starts at %lld, expected %lld", types[k], (long long)u, (long long)off, (long long)end);
            cr_expect_gt(n, 0);
            end = off + n;
        }
        cr_expect_eq(end, m->n_weights);
        int64_t off, n;
        model_unit_range(m, model_unit_head(m), &off, &n);
        int64_t C = m->config.hidden_size, V = m->config.vocab_size;
        int64_t want = m->config.tie_word_embeddings ? 0 : V * C;
        want += m->config.norm == MODEL_NORM_LAYERNORM ? 2 * C : C;
        cr_expect_eq(n, want, "%s: head unit has %lld elements, expected %lld", types[k], (long long)n, (long long)want);
        model_free(m);
    }
}

/* A provider lacking a callback is refused; a model with one has no whole gradient
 * buffer to allocate, and generation refuses it. */
Test(zero3_seam, refusals) {
    struct smelt_error err;
    struct model *m = tiny_model("llama");
    struct model_param_provider bad = {0};
    TEST_EXPECT_ERROR(model_set_param_provider(m, &bad, &err), SMELT_EINVAL, &err);
    struct copy_provider cp;
    copy_provider_init(&cp, m, m->weights.data, true);
    TEST_OK(model_set_param_provider(m, &cp.p, &err), &err);
    TEST_EXPECT_ERROR(model_grads_alloc(m, &err), SMELT_EINVAL, &err);
    struct model_step_buffers *sb;
    TEST_OK(model_step_buffers_alloc(m, 4, 1, 1, &sb, &err), &err);
    struct model_kv_cache kv;
    TEST_OK(model_kv_cache_alloc(m, 1, 4, &kv, &err), &err);
    int32_t ids[1] = {1}, cu[2] = {0, 1}, lens[1] = {1}, slots[1] = {0}, bt[1] = {0};
    struct model_paged_batch pb = {.n_tokens = 1, .n_seqs = 1, .ids = ids, .cu_q = cu, .context_lens = lens,
                                   .slot_mapping = slots, .block_tables = bt, .max_blocks = 1};
    TEST_EXPECT_ERROR(model_forward_paged(m, sb, &kv, &pb, &err), SMELT_EUNSUPPORTED, &err);
    model_kv_cache_free(&kv);
    model_step_buffers_free(sb);
    model_set_param_provider(m, NULL, &err);
    copy_provider_free(&cp);
    model_free(m);
}

/* ---- zero3 over comm: forked ranks ------------------------------------------------- */

#define TIMEOUT_MS 5000

#define CHECK(cond, ...)                           \
    do {                                           \
        if (!(cond)) {                             \
            snprintf(msg, bytes, __VA_ARGS__);     \
            return 1;                              \
        }                                          \
    } while (0)
#define CHECK_OK(call) CHECK((call) == 0, "%s: %s", #call, err.message)

/* Rank r's batch: the fixture's tokens shifted by 7 r (mod V), so ranks differ. */
static void rank_batch(const char *type, int r, int64_t V, struct parity_packed *p) {
    parity_load_inputs(type, p);
    for (int64_t t = 0; t < p->T; t++) {
        p->ids[t] = (int32_t)((p->ids[t] + 7 * r) % V);
        if (p->targets[t] >= 0) p->targets[t] = (int32_t)((p->targets[t] + 7 * r) % V);
    }
}

static int fwd_bwd(struct model *m, struct model_acts *acts, struct parity_packed *p, float *lp,
                   struct smelt_error *err) {
    struct tensor tlp = tensor_f32(lp, 1, &p->T), dlp = tensor_f32(p->weights, 1, &p->T);
    struct model_batch b = parity_batch_of(p);
    TRY(model_forward(m, acts, &b, &tlp, NULL, NULL, err));
    return model_backward(m, acts, &dlp, NULL, err);
}

struct rank_case {
    const char *type;
    bool recompute;
};

static double max_abs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Every element of the rank's gradient shard against the plain one-rank gradient: within
 * 1e-6 of the unit's largest gradient (the ranks' sums are added in another order, and
 * an element whose terms cancel loses its own relative precision); bit for bit on one
 * rank without a tied head (the same additions in the same order). */
static int check_grads(struct zero3 *z, const struct model *plain, int size, char *msg, size_t bytes) {
    const float *got = zero3_grads(z)->data, *want = plain->grads.data;
    bool exact = size == 1 && !plain->config.tie_word_embeddings;
    for (int64_t u = 0; u < model_unit_count(plain); u++) {
        int64_t flat, n, at, off, numel;
        zero3_piece(z, u, &flat, &n, &at);
        model_unit_range(plain, u, &off, &numel);
        double tol = exact ? 0.0 : 1e-6 * max_abs(want + off, numel);
        for (int64_t i = 0; i < n; i++) {
            double g = got[at + i], w = want[flat + i];
            CHECK(fabs(g - w) <= tol, "unit %lld element %lld: gradient %.9g, plain %.9g (tolerance %.3g)",
                  (long long)u, (long long)(flat + i), g, w, tol);
        }
    }
    return 0;
}

static int check_bytes(struct zero3 *z, const struct model *m, int size, char *msg, size_t bytes) {
    struct zero3_bytes zb;
    zero3_bytes(z, &zb);
    int64_t units = model_unit_count(m), share = m->n_weights / size;
    int64_t shard = zb.shard_params / (int64_t)sizeof(float);
    CHECK(m->weights.data == NULL && m->grads.data == NULL, "the whole weights or gradients were kept");
    CHECK(shard >= share - units && shard <= share + units, "shard of %lld parameters; 1/%d is %lld",
          (long long)shard, size, (long long)share);
    CHECK(shard == zero3_params(z)->shape[0], "bytes report %lld, shard tensor %lld", (long long)shard,
          (long long)zero3_params(z)->shape[0]);
    CHECK(zb.work_params == 2 * max_unit(m) * (int64_t)sizeof(float), "work buffers %lld bytes",
          (long long)zb.work_params);
    CHECK(zb.shard_grads == zb.shard_params, "gradient shard %lld bytes", (long long)zb.shard_grads);
    return 0;
}

/* The plain model runs every rank's batch (the sum a one-rank job would have); the
 * sharded one only this rank's, then gathers itself back. */
static int zero3_rank(struct comm *comm, const struct rank_case *rc_, char *msg, size_t bytes) {
    struct smelt_error err = {0};
    int rank = comm_rank(comm), size = comm_size(comm);
    struct model *plain = tiny_model(rc_->type), *m = tiny_model(rc_->type);
    struct model_acts *acts;
    struct parity_packed p;
    float lp_plain[64], lp[64];
    CHECK_OK(model_grads_alloc(plain, &err));
    CHECK_OK(model_acts_alloc(plain, 64, rc_->recompute, &acts, &err));
    for (int r = 0; r < size; r++) {
        rank_batch(rc_->type, r, plain->config.vocab_size, &p);
        float tmp[64];
        CHECK_OK(fwd_bwd(plain, acts, &p, tmp, &err));
        if (r == rank) memcpy(lp_plain, tmp, sizeof tmp);
    }
    struct zero3 *z;
    CHECK_OK(zero3_create(m, comm, true, &z, &err));
    if (check_bytes(z, m, size, msg, bytes)) return 1;
    rank_batch(rc_->type, rank, plain->config.vocab_size, &p);
    CHECK_OK(fwd_bwd(m, acts, &p, lp, &err));
    CHECK_OK(zero3_sync(z, &err));
    CHECK(memcmp(lp, lp_plain, (size_t)p.T * sizeof(float)) == 0, "logprobs differ from the plain model's");
    if (check_grads(z, plain, size, msg, bytes)) return 1;
    CHECK_OK(zero3_restore(z, &err));
    CHECK(memcmp(m->weights.data, plain->weights.data, (size_t)m->n_weights * sizeof(float)) == 0,
          "the gathered weights differ");
    zero3_free(z);
    model_acts_free(acts);
    model_free(plain), model_free(m);
    return 0;
}

static _Noreturn void rank_main(int rank, int size, const struct rank_case *rc_) {
    char msg[1024] = "", spec[128], path[256], name[32];
    struct smelt_error err = {0};
    struct comm_store *store = NULL;
    struct comm *comm = NULL;
    snprintf(spec, sizeof spec, "file:%s", test_tmp_dir);
    struct comm_options o = {.rank = rank, .size = size, .name = "world", .host = "127.0.0.1",
                             .timeout_ms = TIMEOUT_MS};
    int code;
    if (comm_store_open(spec, "job-1", &store, &err) || comm_create(store, &o, &comm, &err)) {
        snprintf(msg, sizeof msg, "setup: %s", err.message);
        code = 10;
    } else {
        code = zero3_rank(comm, rc_, msg, sizeof msg);
    }
    comm_destroy(comm);
    comm_store_close(store);
    snprintf(name, sizeof name, "out.%d", rank);
    test_tmp_path(path, sizeof path, name);
    file_write_atomic(path, msg, strlen(msg), NULL);
    _exit(code);
}

static int reap(pid_t pid, int64_t deadline) {
    int status;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (mono_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(5000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void run_ranks(int size, const struct rank_case *rc_) {
    pid_t pids[4];
    for (int r = 0; r < size; r++) {
        pids[r] = fork();
        cr_assert(pids[r] >= 0, "fork: %s", strerror(errno));
        if (pids[r] == 0) rank_main(r, size, rc_);
    }
    int64_t deadline = mono_ms() + 20000;
    for (int r = 0; r < size; r++) {
        int code = reap(pids[r], deadline);
        char path[256], name[32], *out = NULL;
        size_t len;
        snprintf(name, sizeof name, "out.%d", r);
        test_tmp_path(path, sizeof path, name);
        if (file_read_all(path, &out, &len, NULL)) out = NULL;
        cr_expect_eq(code, 0, "%s, %d ranks: rank %d exited %d: %s", rc_->type, size, r, code, out ? out : "");
        free(out);
    }
}

static const struct rank_case LLAMA = {"llama", false}, GPT2_RECOMPUTE = {"gpt2", true};

Test(zero3, llama_one_rank, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(1, &LLAMA); }
Test(zero3, llama_two_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(2, &LLAMA); }
Test(zero3, llama_three_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(3, &LLAMA); }
Test(zero3, gpt2_tied_recompute_one_rank, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(1, &GPT2_RECOMPUTE); }
Test(zero3, gpt2_tied_recompute_two_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(2, &GPT2_RECOMPUTE); }
Test(zero3, gpt2_tied_recompute_three_ranks, .init = test_tmp_setup, .fini = test_tmp_teardown) { run_ranks(3, &GPT2_RECOMPUTE); }
