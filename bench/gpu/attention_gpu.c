/* attention_gpu: ops_attention forward and ops_attention_backward on one backend, in
 * TFLOP/s of causal work (bench/gpu/README.md).
 *
 *   attention_gpu [--backend cpu|cuda] [--dtype f32,bf16] [--seqs 4] [--lens 1024,2048,4096]
 *                 [--shapes 16x16x128,16x2x128,16x16x64] [--json]
 *
 * One row per (dtype, length, shape): --seqs sequences of --lens tokens packed in one
 * token axis (cu_seqlens), Hq x Hkv x D from --shapes, random inputs in [-1, 1),
 * scale 1/sqrt(D). Forward and backward are each called once untimed, then repeated
 * (at least MIN_RUNS times, more until about TARGET_S, at most MAX_RUNS), every call
 * timed with the device idle on both sides; the medians are reported.
 * FLOPs: forward 4 * D * Hq * sum s^2 / 2 (QK^T and PV over the causal half), backward
 * 2.5 x forward. An op the backend lacks (CUDA's attention until its kernels land; bf16
 * on the CPU) gives a row with status "unsupported" and the op's message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu/bench_gpu.h"
#include "common/common.h"
#include "kernels/ops.h"

#define MIN_RUNS 3
#define MAX_RUNS 50
#define TARGET_S 0.25
#define MAX_LIST 16

struct shape {
    int64_t hq, hkv, d;
};

struct options {
    enum backend backend;
    enum dtype dtypes[2];
    int n_dtypes;
    int64_t seqs;
    int32_t *lens;
    int64_t n_lens;
    struct shape shapes[MAX_LIST];
    int n_shapes;
    bool json;
};

static void usage(FILE *f) {
    fprintf(f, "usage: attention_gpu [--backend cpu|cuda] [--dtype f32,bf16] [--seqs 4] [--lens 1024,2048,4096]\n"
               "                     [--shapes 16x16x128,16x2x128,16x16x64] [--json]\n"
               "  --backend B      cpu or cuda (default cuda)\n"
               "  --dtype LIST     f32 and/or bf16 (default f32,bf16; the CPU backend has f32 only)\n"
               "  --seqs N         sequences packed in one batch (default 4)\n"
               "  --lens LIST      tokens per sequence, one row each (default 1024,2048,4096)\n"
               "  --shapes LIST    HqxHkvxD, one row each (default 16x16x128,16x2x128,16x16x64)\n"
               "  --json           JSON lines instead of key=value text\n");
}

static int parse_dtypes(const char *v, struct options *o, struct smelt_error *err) {
    o->n_dtypes = 0;
    char buf[64];
    if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf) return error_set(err, SMELT_EINVAL, "--dtype: '%s' is too long", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        enum dtype d;
        if (strcmp(tok, "f32") == 0) d = DTYPE_F32;
        else if (strcmp(tok, "bf16") == 0) d = DTYPE_BF16;
        else return error_set(err, SMELT_EINVAL, "--dtype: '%s' is not f32 or bf16", tok);
        if (o->n_dtypes == 2) return error_set(err, SMELT_EINVAL, "--dtype: at most two dtypes");
        o->dtypes[o->n_dtypes++] = d;
    }
    if (o->n_dtypes == 0) return error_set(err, SMELT_EINVAL, "--dtype: no dtype given");
    return SMELT_OK;
}

static int parse_shapes(const char *v, struct options *o, struct smelt_error *err) {
    o->n_shapes = 0;
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf) return error_set(err, SMELT_EINVAL, "--shapes: too long");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long hq, hkv, d;
        int used = 0;
        if (sscanf(tok, "%lldx%lldx%lld%n", &hq, &hkv, &d, &used) != 3 || tok[used] != '\0' || hq < 1 || hkv < 1 ||
            d < 1 || hq > 1024 || d > 1024 || hq % hkv)
            return error_set(err, SMELT_EINVAL,
                             "--shapes: '%s' is not HqxHkvxD with Hq a multiple of Hkv (each in [1, 1024])", tok);
        if (o->n_shapes == MAX_LIST) return error_set(err, SMELT_EINVAL, "--shapes: at most %d shapes", MAX_LIST);
        o->shapes[o->n_shapes++] = (struct shape){hq, hkv, d};
    }
    if (o->n_shapes == 0) return error_set(err, SMELT_EINVAL, "--shapes: no shape given");
    return SMELT_OK;
}

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    static const char *const value_flags[] = {"--backend", "--dtype", "--seqs", "--lens", "--shapes", NULL};
    *o = (struct options){.backend = BACKEND_CUDA, .seqs = 4};
    const char *dtypes = "f32,bf16", *lens = "1024,2048,4096", *shapes = "16x16x128,16x2x128,16x16x64";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = bench_next_arg(argc, argv, &i, value_flags, usage, &o->json, &v, err);
        if (rc) return rc;
        if (!v) continue; /* --json */
        if (strcmp(a, "--backend") == 0) rc = bench_backend_flag(v, &o->backend, err);
        else if (strcmp(a, "--dtype") == 0) dtypes = v;
        else if (strcmp(a, "--seqs") == 0) rc = args_int(a, v, 1, 1024, &o->seqs, err);
        else if (strcmp(a, "--lens") == 0) lens = v;
        else if (strcmp(a, "--shapes") == 0) shapes = v;
        else rc = error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    int rc = parse_dtypes(dtypes, o, err);
    if (!rc) rc = parse_shapes(shapes, o, err);
    if (!rc) rc = args_int_list("--lens", lens, 1, 1 << 20, &o->lens, &o->n_lens, err);
    if (!rc && o->n_lens > MAX_LIST) rc = error_set(err, SMELT_EINVAL, "--lens: at most %d lengths", MAX_LIST);
    for (int64_t i = 0; !rc && i < o->n_lens; i++)
        if (o->seqs * o->lens[i] > INT32_MAX)
            rc = error_set(err, SMELT_EINVAL, "--seqs x --lens: %lld tokens do not fit an i32 cu_seqlens",
                           (long long)(o->seqs * o->lens[i]));
    return rc;
}

/* ---- one row ---- */

struct buffers {
    struct tensor q, k, v, out, lse, dout, dq, dk, dv;
};

static void buffers_free(struct buffers *b) {
    struct tensor *all[] = {&b->q, &b->k, &b->v, &b->out, &b->lse, &b->dout, &b->dq, &b->dk, &b->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tensor_free(all[i]);
}

/* t (any dtype, on the backend) = uniform [-1, 1) from rng, through an f32 host buffer
 * and, for bf16, an f32 device buffer and ops_cast. */
static int fill_uniform(struct tensor *t, struct rng *rng, struct smelt_error *err) {
    int64_t n = tensor_numel(t);
    float *host = malloc((size_t)n * sizeof *host);
    if (!host) return error_set(err, SMELT_ENOMEM, "inputs: out of memory");
    for (int64_t i = 0; i < n; i++) host[i] = (float)(2.0 * rng_uniform(rng) - 1.0);
    struct tensor h = tensor_f32(host, 1, &n), staging = {0};
    int rc;
    if (t->dtype == DTYPE_F32) {
        struct tensor flat = tensor_make(t->backend, DTYPE_F32, t->data, 1, &n);
        rc = tensor_copy(&flat, &h, err);
    } else {
        rc = tensor_alloc(&staging, t->backend, DTYPE_F32, 1, &n, err);
        if (!rc) rc = tensor_copy(&staging, &h, err);
        struct tensor flat = tensor_make(t->backend, t->dtype, t->data, 1, &n);
        if (!rc) rc = ops_cast(&flat, &staging, err);
    }
    tensor_free(&staging);
    free(host);
    return rc;
}

static int buffers_alloc(struct buffers *b, enum backend be, enum dtype dt, int64_t T, const struct shape *s,
                         struct smelt_error *err) {
    int64_t qs[3] = {T, s->hq, s->d}, ks[3] = {T, s->hkv, s->d}, ls[2] = {T, s->hq};
    int rc = tensor_alloc(&b->q, be, dt, 3, qs, err);
    if (!rc) rc = tensor_alloc(&b->k, be, dt, 3, ks, err);
    if (!rc) rc = tensor_alloc(&b->v, be, dt, 3, ks, err);
    if (!rc) rc = tensor_alloc(&b->out, be, dt, 3, qs, err);
    if (!rc) rc = tensor_alloc(&b->lse, be, DTYPE_F32, 2, ls, err);
    if (!rc) rc = tensor_alloc(&b->dout, be, dt, 3, qs, err);
    if (!rc) rc = tensor_alloc(&b->dq, be, dt, 3, qs, err);
    if (!rc) rc = tensor_alloc(&b->dk, be, dt, 3, ks, err);
    if (!rc) rc = tensor_alloc(&b->dv, be, dt, 3, ks, err);
    struct rng rng;
    rng_seed(&rng, (uint64_t)(T * 131 + s->hq * 17 + s->hkv * 5 + s->d));
    if (!rc) rc = fill_uniform(&b->q, &rng, err);
    if (!rc) rc = fill_uniform(&b->k, &rng, err);
    if (!rc) rc = fill_uniform(&b->v, &rng, err);
    if (!rc) rc = fill_uniform(&b->dout, &rng, err);
    return rc;
}

struct call {
    struct buffers *b;
    const struct tensor *cu;
    float scale;
    bool backward;
};

static int call_once(const struct call *c, struct smelt_error *err) {
    struct buffers *b = c->b;
    if (!c->backward) return ops_attention(&b->out, &b->lse, &b->q, &b->k, &b->v, c->cu, c->scale, err);
    /* The gradients accumulate (+=) from call to call: the same work each time. */
    return ops_attention_backward(&b->dq, &b->dk, &b->dv, &b->dout, &b->q, &b->k, &b->v, &b->out, &b->lse, c->cu,
                                  c->scale, err);
}

/* Median seconds of one call: one untimed call, then MIN_RUNS..MAX_RUNS timed ones. */
static int time_call(const struct call *c, enum backend be, double *median_s, int *runs, struct smelt_error *err) {
    double t0 = 0, t1 = 0, times[MAX_RUNS];
    int rc = bench_sync_clock(be, &t0, err);
    if (!rc) rc = call_once(c, err);
    if (!rc) rc = bench_sync_clock(be, &t1, err);
    if (rc) return rc;
    int n = (int)(TARGET_S / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9));
    n = n < MIN_RUNS ? MIN_RUNS : n > MAX_RUNS ? MAX_RUNS : n;
    for (int i = 0; i < n; i++) {
        rc = bench_sync_clock(be, &t0, err);
        if (!rc) rc = call_once(c, err);
        if (!rc) rc = bench_sync_clock(be, &t1, err);
        if (rc) return rc;
        times[i] = t1 - t0;
    }
    *median_s = bench_median(times, n);
    *runs = n;
    return SMELT_OK;
}

static int run_row(const struct options *o, enum dtype dt, int64_t len, const struct shape *s, json_t *row,
                   struct smelt_error *err) {
    int64_t S = o->seqs, T = S * len, cu_n = S + 1;
    int32_t *cu = malloc((size_t)cu_n * sizeof *cu);
    if (!cu) return error_set(err, SMELT_ENOMEM, "cu_seqlens: out of memory");
    for (int64_t i = 0; i <= S; i++) cu[i] = (int32_t)(i * len);
    struct tensor cus = tensor_i32(cu, 1, &cu_n);
    struct buffers b = {0};
    double fwd_flops = 4.0 * (double)s->d * (double)s->hq * (double)S * (double)len * (double)len / 2.0;
    json_object_set_new(row, "fwd_flops", json_real(fwd_flops));
    int rc = bench_backend_ready(o->backend, err);
    if (!rc) rc = buffers_alloc(&b, o->backend, dt, T, s, err);
    struct call c = {.b = &b, .cu = &cus, .scale = (float)(1.0 / sqrt((double)s->d))};
    double fwd_s = 0, bwd_s = 0;
    int fwd_runs = 0, bwd_runs = 0;
    if (!rc && (rc = time_call(&c, o->backend, &fwd_s, &fwd_runs, err))) error_wrap(err, rc, "forward");
    if (!rc) {
        json_object_set_new(row, "fwd_ms", json_real(1e3 * fwd_s));
        json_object_set_new(row, "fwd_tflops", json_real(fwd_flops / fwd_s / 1e12));
        json_object_set_new(row, "fwd_runs", json_integer(fwd_runs));
        c.backward = true;
        if ((rc = time_call(&c, o->backend, &bwd_s, &bwd_runs, err))) error_wrap(err, rc, "backward");
    }
    if (!rc) {
        json_object_set_new(row, "bwd_ms", json_real(1e3 * bwd_s));
        json_object_set_new(row, "bwd_tflops", json_real(2.5 * fwd_flops / bwd_s / 1e12));
        json_object_set_new(row, "bwd_runs", json_integer(bwd_runs));
    }
    buffers_free(&b);
    free(cu);
    return rc;
}

int main(int argc, char **argv) {
    struct options o;
    struct smelt_error err = {0};
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "attention_gpu: %s\n", err.message);
        usage(stderr);
        free(o.lens);
        return BENCH_EXIT_USAGE;
    }
    int worst = SMELT_OK;
    for (int di = 0; di < o.n_dtypes; di++)
        for (int64_t li = 0; li < o.n_lens; li++)
            for (int si = 0; si < o.n_shapes; si++) {
                const struct shape *s = &o.shapes[si];
                json_t *row = bench_row_new("attn");
                int rc = row ? SMELT_OK : error_set(&err, SMELT_ENOMEM, "out of memory");
                if (row) {
                    json_object_set_new(row, "backend", json_string(backend_name(o.backend)));
                    json_object_set_new(row, "dtype", json_string(dtype_name(o.dtypes[di])));
                    json_object_set_new(row, "seqs", json_integer(o.seqs));
                    json_object_set_new(row, "seq_len", json_integer(o.lens[li]));
                    json_object_set_new(row, "hq", json_integer(s->hq));
                    json_object_set_new(row, "hkv", json_integer(s->hkv));
                    json_object_set_new(row, "head_dim", json_integer(s->d));
                    rc = run_row(&o, o.dtypes[di], o.lens[li], s, row, &err);
                }
                bench_row_emit(row, rc, &err, o.json);
                if (rc) fprintf(stderr, "attention_gpu: %s\n", err.message);
                if (rc && !worst) worst = rc;
                error_clear(&err);
            }
    free(o.lens);
    return bench_exit_code(worst);
}
