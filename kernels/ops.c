/* The front of ops.h: validates every call (presence, backend, dtype, shape) and
 * dispatches to the backend table. Backends see only well-formed arguments. */
#include "kernels/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* One op call being checked: its name, the backend and compute dtype every tensor must
 * share (taken from the first compute tensor), and where errors go. */
struct call {
    const char *op;
    enum backend backend;
    enum dtype dtype;
    const struct backend_ops *impl;
    struct smelt_error *err;
};

static int bad(struct call *c, const char *fmt, const char *name, const char *detail) {
    return error_set(c->err, SMELT_EINVAL, "%s: %s%s%s", c->op, name, fmt, detail ? detail : "");
}

static int check_form(struct call *c, const char *name, const struct tensor *t) {
    if (!t) return bad(c, " is missing", name, NULL);
    if (t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS)
        return error_set(c->err, SMELT_EINVAL, "%s: %s has ndim %d, outside [1, %d]", c->op, name,
                         t->ndim, TENSOR_MAX_DIMS);
    if ((unsigned)t->dtype >= DTYPE_COUNT)
        return error_set(c->err, SMELT_EINVAL, "%s: %s has an invalid dtype", c->op, name);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0)
            return error_set(c->err, SMELT_EINVAL, "%s: %s has a negative dimension", c->op, name);
    if (!t->data && tensor_numel(t) > 0) return bad(c, " has no data", name, NULL);
    return SMELT_OK;
}

/* The first compute tensor fixes backend and dtype for the call. */
static int call_begin(struct call *c, const char *op, const char *name, const struct tensor *t,
                      struct smelt_error *err) {
    c->op = op;
    c->err = err;
    int rc = check_form(c, name, t);
    if (rc) return rc;
    c->backend = t->backend;
    c->dtype = t->dtype;
    c->impl = backend_ops_get(t->backend);
    if (!c->impl)
        return error_set(err, SMELT_EUNSUPPORTED, "%s: %s is on backend %s, which is not available",
                         op, name, backend_name(t->backend));
    if (!(c->impl->compute_dtypes & (1u << t->dtype)))
        return error_set(err, SMELT_EUNSUPPORTED, "%s: dtype %s of %s is not supported on backend %s",
                         op, dtype_name(t->dtype), name, backend_name(t->backend));
    return SMELT_OK;
}

static int check_on(struct call *c, const char *name, const struct tensor *t, enum dtype dtype,
                    enum backend backend) {
    int rc = check_form(c, name, t);
    if (rc) return rc;
    if (t->backend != backend)
        return error_set(c->err, SMELT_EINVAL, "%s: %s is on backend %s, expected %s", c->op, name,
                         backend_name(t->backend), backend_name(backend));
    if (t->dtype != dtype)
        return error_set(c->err, SMELT_EINVAL, "%s: %s has dtype %s, expected %s", c->op, name,
                         dtype_name(t->dtype), dtype_name(dtype));
    return SMELT_OK;
}

/* A compute tensor: same backend and dtype as the call's first. */
static int check_compute(struct call *c, const char *name, const struct tensor *t) {
    return check_on(c, name, t, c->dtype, c->backend);
}
static int check_f32(struct call *c, const char *name, const struct tensor *t) {
    return check_on(c, name, t, DTYPE_F32, c->backend);
}
static int check_i32(struct call *c, const char *name, const struct tensor *t) {
    return check_on(c, name, t, DTYPE_I32, c->backend);
}

static int check_same_shape(struct call *c, const char *name, const struct tensor *t,
                            const char *ref_name, const struct tensor *ref) {
    if (tensor_same_shape(t, ref)) return SMELT_OK;
    char a[96], b[96];
    return error_set(c->err, SMELT_EINVAL, "%s: %s has shape %s but %s has shape %s; they must match",
                     c->op, name, tensor_shape_str(t, a, sizeof a), ref_name,
                     tensor_shape_str(ref, b, sizeof b));
}

static int check_numel(struct call *c, const char *name, const struct tensor *t, int64_t want,
                       const char *why) {
    if (tensor_numel(t) == want) return SMELT_OK;
    char a[96];
    return error_set(c->err, SMELT_EINVAL, "%s: %s has shape %s (%lld elements), expected %lld (%s)",
                     c->op, name, tensor_shape_str(t, a, sizeof a), (long long)tensor_numel(t),
                     (long long)want, why);
}

static int unsupported(struct call *c) {
    return error_set(c->err, SMELT_EUNSUPPORTED, "%s: not implemented on backend %s", c->op,
                     backend_name(c->backend));
}

/* ---- batch-invariant mode ---- */

int ops_set_batch_invariant(enum backend backend, bool on, struct smelt_error *err) {
    const struct backend_ops *impl = backend_ops_get(backend);
    if (!impl)
        return error_set(err, SMELT_EUNSUPPORTED, "ops_set_batch_invariant: backend %s is not available",
                         backend_name(backend));
    if (!impl->set_batch_invariant)
        return on ? error_set(err, SMELT_EUNSUPPORTED,
                              "ops_set_batch_invariant: backend %s has no batch-invariant mode (the CPU "
                              "backend has)", backend_name(backend))
                  : SMELT_OK;
    return impl->set_batch_invariant(on, err);
}

bool ops_batch_invariant(enum backend backend) {
    const struct backend_ops *impl = backend_ops_get(backend);
    return impl && impl->batch_invariant && impl->batch_invariant();
}

/* ---- matmul ---- */

struct matmul_dims {
    int64_t batch, m, n, k;
    bool a_batched, b_batched;
};

static int matmul_dims(struct call *c, const struct tensor *a, const struct tensor *b,
                       bool trans_a, bool trans_b, struct matmul_dims *d) {
    char sa[96], sb[96];
    if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3)
        return error_set(c->err, SMELT_EINVAL, "%s: a %s and b %s must each be 2D or 3D (batched)",
                         c->op, tensor_shape_str(a, sa, sizeof sa), tensor_shape_str(b, sb, sizeof sb));
    d->a_batched = a->ndim == 3;
    d->b_batched = b->ndim == 3;
    int64_t ba = d->a_batched ? a->shape[0] : 1, bb = d->b_batched ? b->shape[0] : 1;
    if (d->a_batched && d->b_batched && ba != bb)
        return error_set(c->err, SMELT_EINVAL, "%s: batch sizes differ: a %s, b %s", c->op,
                         tensor_shape_str(a, sa, sizeof sa), tensor_shape_str(b, sb, sizeof sb));
    d->batch = d->a_batched ? ba : bb;
    int ra = a->ndim - 2, rb = b->ndim - 2; /* index of the matrix rows */
    d->m = trans_a ? a->shape[ra + 1] : a->shape[ra];
    int64_t ka = trans_a ? a->shape[ra] : a->shape[ra + 1];
    int64_t kb = trans_b ? b->shape[rb + 1] : b->shape[rb];
    d->n = trans_b ? b->shape[rb] : b->shape[rb + 1];
    if (ka != kb)
        return error_set(c->err, SMELT_EINVAL,
                         "%s: inner dimensions differ: op(a) is %lldx%lld (a %s%s), op(b) is %lldx%lld (b %s%s)",
                         c->op, (long long)d->m, (long long)ka, tensor_shape_str(a, sa, sizeof sa),
                         trans_a ? " transposed" : "", (long long)kb, (long long)d->n,
                         tensor_shape_str(b, sb, sizeof sb), trans_b ? " transposed" : "");
    d->k = ka;
    return SMELT_OK;
}

static int check_matmul_out(struct call *c, const char *name, const struct tensor *out,
                            const struct matmul_dims *d) {
    bool batched = d->a_batched || d->b_batched;
    int64_t want[3] = {d->batch, d->m, d->n};
    struct tensor expect = tensor_make(c->backend, c->dtype, NULL, batched ? 3 : 2,
                                       batched ? want : want + 1);
    return check_same_shape(c, name, out, "the product", &expect);
}

int ops_matmul(struct tensor *out, const struct tensor *a, const struct tensor *b,
               const struct tensor *bias, bool trans_a, bool trans_b, float alpha, float beta,
               struct smelt_error *err) {
    struct call c;
    struct matmul_dims d;
    TRY(call_begin(&c, "ops_matmul", "a", a, err));
    TRY(check_compute(&c, "b", b));
    TRY(check_compute(&c, "out", out));
    TRY(matmul_dims(&c, a, b, trans_a, trans_b, &d));
    TRY(check_matmul_out(&c, "out", out, &d));
    if (bias) {
        TRY(check_compute(&c, "bias", bias));
        TRY(check_numel(&c, "bias", bias, d.n, "one per output column"));
    }
    if (!c.impl->matmul) return unsupported(&c);
    return c.impl->matmul(out, a, b, bias, trans_a, trans_b, alpha, beta, err);
}

int ops_matmul_backward(struct tensor *da, struct tensor *db, struct tensor *dbias,
                        const struct tensor *dout, const struct tensor *a, const struct tensor *b,
                        bool trans_a, bool trans_b, float alpha, struct smelt_error *err) {
    struct call c;
    struct matmul_dims d;
    TRY(call_begin(&c, "ops_matmul_backward", "dout", dout, err));
    TRY(check_compute(&c, "a", a));
    TRY(check_compute(&c, "b", b));
    TRY(matmul_dims(&c, a, b, trans_a, trans_b, &d));
    TRY(check_matmul_out(&c, "dout", dout, &d));
    if (da) {
        TRY(check_compute(&c, "da", da));
        TRY(check_same_shape(&c, "da", da, "a", a));
    }
    if (db) {
        TRY(check_compute(&c, "db", db));
        TRY(check_same_shape(&c, "db", db, "b", b));
    }
    if (dbias) {
        TRY(check_compute(&c, "dbias", dbias));
        TRY(check_numel(&c, "dbias", dbias, d.n, "one per output column"));
    }
    if (!c.impl->matmul_backward) return unsupported(&c);
    return c.impl->matmul_backward(da, db, dbias, dout, a, b, trans_a, trans_b, alpha, err);
}

/* ---- embedding ---- */

static int check_embedding_rows(struct call *c, const char *name, const struct tensor *rows,
                                const struct tensor *ids, const struct tensor *table) {
    if (table->ndim != 2) {
        char s[96];
        return error_set(c->err, SMELT_EINVAL, "%s: table has shape %s, expected [vocab, channels]",
                         c->op, tensor_shape_str(table, s, sizeof s));
    }
    TRY(check_numel(c, name, rows, tensor_numel(ids) * table->shape[1], "one table row per id"));
    if (rows->shape[rows->ndim - 1] != table->shape[1])
        return error_set(c->err, SMELT_EINVAL, "%s: last dim of %s is %lld, table has %lld channels",
                         c->op, name, (long long)rows->shape[rows->ndim - 1], (long long)table->shape[1]);
    return SMELT_OK;
}

int ops_embedding(struct tensor *out, const struct tensor *ids, const struct tensor *table,
                  struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_embedding", "table", table, err));
    TRY(check_compute(&c, "out", out));
    TRY(check_i32(&c, "ids", ids));
    TRY(check_embedding_rows(&c, "out", out, ids, table));
    if (!c.impl->embedding) return unsupported(&c);
    return c.impl->embedding(out, ids, table, err);
}

int ops_embedding_backward(struct tensor *dtable, const struct tensor *dout,
                           const struct tensor *ids, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_embedding_backward", "dtable", dtable, err));
    TRY(check_compute(&c, "dout", dout));
    TRY(check_i32(&c, "ids", ids));
    TRY(check_embedding_rows(&c, "dout", dout, ids, dtable));
    if (!c.impl->embedding_backward) return unsupported(&c);
    return c.impl->embedding_backward(dtable, dout, ids, err);
}

/* ---- normalisation ---- */

/* x [..., C]; w (and b) [C]; per-row statistics f32 [rows]. */
static int check_norm(struct call *c, const struct tensor *x, const struct tensor *w,
                      const struct tensor *b, const struct tensor *stat1, const char *stat1_name,
                      const struct tensor *stat2, const char *stat2_name) {
    int64_t channels = x->shape[x->ndim - 1];
    TRY(check_compute(c, "w", w));
    TRY(check_numel(c, "w", w, channels, "one weight per channel of x"));
    if (b) {
        TRY(check_compute(c, "b", b));
        TRY(check_numel(c, "b", b, channels, "one bias per channel of x"));
    }
    if (stat1) {
        TRY(check_f32(c, stat1_name, stat1));
        TRY(check_numel(c, stat1_name, stat1, tensor_rows(x), "one per row of x"));
    }
    if (stat2) {
        TRY(check_f32(c, stat2_name, stat2));
        TRY(check_numel(c, stat2_name, stat2, tensor_rows(x), "one per row of x"));
    }
    return SMELT_OK;
}

int ops_rmsnorm(struct tensor *y, struct tensor *rstd, const struct tensor *x,
                const struct tensor *w, float eps, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_rmsnorm", "x", x, err));
    TRY(check_compute(&c, "y", y));
    TRY(check_same_shape(&c, "y", y, "x", x));
    TRY(check_norm(&c, x, w, NULL, rstd, "rstd", NULL, NULL));
    if (!(eps >= 0)) return error_set(err, SMELT_EINVAL, "ops_rmsnorm: eps %g must be >= 0", eps);
    if (!c.impl->rmsnorm) return unsupported(&c);
    return c.impl->rmsnorm(y, rstd, x, w, eps, err);
}

int ops_rmsnorm_backward(struct tensor *dx, struct tensor *dw, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w, const struct tensor *rstd,
                         struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_rmsnorm_backward", "x", x, err));
    TRY(check_compute(&c, "dy", dy));
    TRY(check_same_shape(&c, "dy", dy, "x", x));
    if (dx) {
        TRY(check_compute(&c, "dx", dx));
        TRY(check_same_shape(&c, "dx", dx, "x", x));
    }
    if (dw) {
        TRY(check_compute(&c, "dw", dw));
        TRY(check_same_shape(&c, "dw", dw, "w", w));
    }
    if (!rstd) return error_set(err, SMELT_EINVAL, "ops_rmsnorm_backward: rstd is missing (save it in the forward)");
    TRY(check_norm(&c, x, w, NULL, rstd, "rstd", NULL, NULL));
    if (!c.impl->rmsnorm_backward) return unsupported(&c);
    return c.impl->rmsnorm_backward(dx, dw, dy, x, w, rstd, err);
}

int ops_layernorm(struct tensor *y, struct tensor *mean, struct tensor *rstd,
                  const struct tensor *x, const struct tensor *w, const struct tensor *b,
                  float eps, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_layernorm", "x", x, err));
    TRY(check_compute(&c, "y", y));
    TRY(check_same_shape(&c, "y", y, "x", x));
    if (!b) return error_set(err, SMELT_EINVAL, "ops_layernorm: b is missing");
    TRY(check_norm(&c, x, w, b, mean, "mean", rstd, "rstd"));
    if (!(eps >= 0)) return error_set(err, SMELT_EINVAL, "ops_layernorm: eps %g must be >= 0", eps);
    if (!c.impl->layernorm) return unsupported(&c);
    return c.impl->layernorm(y, mean, rstd, x, w, b, eps, err);
}

int ops_layernorm_backward(struct tensor *dx, struct tensor *dw, struct tensor *db,
                           const struct tensor *dy, const struct tensor *x, const struct tensor *w,
                           const struct tensor *mean, const struct tensor *rstd,
                           struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_layernorm_backward", "x", x, err));
    TRY(check_compute(&c, "dy", dy));
    TRY(check_same_shape(&c, "dy", dy, "x", x));
    if (dx) {
        TRY(check_compute(&c, "dx", dx));
        TRY(check_same_shape(&c, "dx", dx, "x", x));
    }
    if (dw) {
        TRY(check_compute(&c, "dw", dw));
        TRY(check_same_shape(&c, "dw", dw, "w", w));
    }
    if (db) {
        TRY(check_compute(&c, "db", db));
        TRY(check_same_shape(&c, "db", db, "w", w));
    }
    if (!mean || !rstd)
        return error_set(err, SMELT_EINVAL, "ops_layernorm_backward: mean and rstd are required (save them in the forward)");
    TRY(check_norm(&c, x, w, NULL, mean, "mean", rstd, "rstd"));
    if (!c.impl->layernorm_backward) return unsupported(&c);
    return c.impl->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, err);
}

/* ---- rope ---- */

static int check_rope(struct call *c, const char *name, const struct tensor *x,
                      const struct tensor *positions, const struct ops_rope_freqs *f) {
    char s[96];
    if (x->ndim != 3 || x->shape[2] % 2 != 0)
        return error_set(c->err, SMELT_EINVAL, "%s: %s has shape %s, expected [tokens, heads, head_dim] with an even head_dim",
                         c->op, name, tensor_shape_str(x, s, sizeof s));
    TRY(check_i32(c, "positions", positions));
    TRY(check_numel(c, "positions", positions, x->shape[0], "one per token"));
    if (!f || !f->inv_freq || f->n != x->shape[2] / 2)
        return error_set(c->err, SMELT_EINVAL, "%s: the rope table has %lld entries, head_dim %lld needs %lld", c->op,
                         (long long)(f ? f->n : 0), (long long)x->shape[2], (long long)x->shape[2] / 2);
    for (int64_t i = 0; i < f->n; i++)
        if (!(isfinite(f->inv_freq[i]) && f->inv_freq[i] >= 0))
            return error_set(c->err, SMELT_EINVAL, "%s: inv_freq[%lld] is %g; finite and >= 0 expected", c->op,
                             (long long)i, f->inv_freq[i]);
    if (!(isfinite(f->scale) && f->scale > 0))
        return error_set(c->err, SMELT_EINVAL, "%s: scale %g must be finite and > 0", c->op, f->scale);
    return SMELT_OK;
}

void ops_rope_default_freqs(float *inv_freq, int64_t head_dim, float theta) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        float exponent = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / (float)pow((double)theta, (double)exponent);
    }
}

int ops_rope_with(struct tensor *y, const struct tensor *x, const struct tensor *positions,
                  const struct ops_rope_freqs *f, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_rope", "x", x, err));
    TRY(check_compute(&c, "y", y));
    TRY(check_same_shape(&c, "y", y, "x", x));
    TRY(check_rope(&c, "x", x, positions, f));
    if (!c.impl->rope) return unsupported(&c);
    return c.impl->rope(y, x, positions, f, err);
}

int ops_rope_with_backward(struct tensor *dx, const struct tensor *dy, const struct tensor *positions,
                           const struct ops_rope_freqs *f, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_rope_backward", "dy", dy, err));
    TRY(check_compute(&c, "dx", dx));
    TRY(check_same_shape(&c, "dx", dx, "dy", dy));
    TRY(check_rope(&c, "dy", dy, positions, f));
    if (!c.impl->rope_backward) return unsupported(&c);
    return c.impl->rope_backward(dx, dy, positions, f, err);
}

/* ops_rope(theta): the unscaled table, built per call (one pow per channel pair). */
static int rope_theta(const char *op, struct tensor *out, const struct tensor *in, const struct tensor *positions,
                      float theta, bool backward, struct smelt_error *err) {
    if (!(theta > 0)) return error_set(err, SMELT_EINVAL, "%s: theta %g must be > 0", op, theta);
    int64_t head_dim = in && in->ndim == 3 ? in->shape[2] : 0;
    float *inv_freq = malloc((size_t)(head_dim / 2 + 1) * sizeof *inv_freq);
    if (!inv_freq) return error_set(err, SMELT_ENOMEM, "%s: out of memory", op);
    ops_rope_default_freqs(inv_freq, head_dim, theta);
    struct ops_rope_freqs f = {inv_freq, head_dim / 2, 1.0f};
    int rc = backward ? ops_rope_with_backward(out, in, positions, &f, err) : ops_rope_with(out, in, positions, &f, err);
    free(inv_freq);
    return rc;
}

int ops_rope(struct tensor *y, const struct tensor *x, const struct tensor *positions,
             float theta, struct smelt_error *err) {
    return rope_theta("ops_rope", y, x, positions, theta, false, err);
}

int ops_rope_backward(struct tensor *dx, const struct tensor *dy, const struct tensor *positions,
                      float theta, struct smelt_error *err) {
    return rope_theta("ops_rope_backward", dx, dy, positions, theta, true, err);
}

/* ---- attention ---- */

/* Sequence offsets into a packed token axis: host i32 [S + 1], cu[0] = 0,
 * nondecreasing, cu[S] = tokens. */
static int check_cu(struct call *c, const char *name, const struct tensor *cu_t, int64_t tokens) {
    TRY(check_on(c, name, cu_t, DTYPE_I32, BACKEND_CPU));
    int64_t n = tensor_numel(cu_t);
    const int32_t *cu = cu_t->data;
    if (n < 2)
        return error_set(c->err, SMELT_EINVAL, "%s: %s needs at least 2 entries, has %lld", c->op, name,
                         (long long)n);
    if (cu[0] != 0) return error_set(c->err, SMELT_EINVAL, "%s: %s[0] is %d, must be 0", c->op, name, cu[0]);
    for (int64_t i = 1; i < n; i++)
        if (cu[i] < cu[i - 1])
            return error_set(c->err, SMELT_EINVAL, "%s: %s decreases at index %lld (%d after %d)", c->op,
                             name, (long long)i, cu[i], cu[i - 1]);
    if (cu[n - 1] != tokens)
        return error_set(c->err, SMELT_EINVAL, "%s: %s ends at %d but q has %lld tokens", c->op, name,
                         cu[n - 1], (long long)tokens);
    return SMELT_OK;
}

static int check_attention(struct call *c, const struct tensor *q, const struct tensor *k,
                           const struct tensor *v, const struct tensor *cu_seqlens,
                           const struct tensor *lse, float scale) {
    char sq[96], sk[96];
    if (q->ndim != 3 || k->ndim != 3)
        return error_set(c->err, SMELT_EINVAL, "%s: q %s and k %s must be [tokens, heads, head_dim]",
                         c->op, tensor_shape_str(q, sq, sizeof sq), tensor_shape_str(k, sk, sizeof sk));
    TRY(check_compute(c, "k", k));
    TRY(check_compute(c, "v", v));
    TRY(check_same_shape(c, "v", v, "k", k));
    int64_t tokens = q->shape[0], hq = q->shape[1], hkv = k->shape[1], dim = q->shape[2];
    if (k->shape[0] != tokens || k->shape[2] != dim || hkv == 0 || hq % hkv != 0)
        return error_set(c->err, SMELT_EINVAL,
                         "%s: q %s and k %s must share tokens and head_dim, with q heads a multiple of kv heads",
                         c->op, tensor_shape_str(q, sq, sizeof sq), tensor_shape_str(k, sk, sizeof sk));
    if (lse) {
        TRY(check_f32(c, "lse", lse));
        TRY(check_numel(c, "lse", lse, tokens * hq, "[tokens, q heads]"));
    }
    if (!(scale > 0)) return error_set(c->err, SMELT_EINVAL, "%s: scale %g must be > 0", c->op, scale);
    return check_cu(c, "cu_seqlens", cu_seqlens, tokens);
}

int ops_attention(struct tensor *out, struct tensor *lse, const struct tensor *q,
                  const struct tensor *k, const struct tensor *v, const struct tensor *cu_seqlens,
                  float scale, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_attention", "q", q, err));
    TRY(check_compute(&c, "out", out));
    TRY(check_same_shape(&c, "out", out, "q", q));
    TRY(check_attention(&c, q, k, v, cu_seqlens, lse, scale));
    if (!c.impl->attention) return unsupported(&c);
    return c.impl->attention(out, lse, q, k, v, cu_seqlens, scale, err);
}

int ops_attention_backward(struct tensor *dq, struct tensor *dk, struct tensor *dv,
                           const struct tensor *dout, const struct tensor *q, const struct tensor *k,
                           const struct tensor *v, const struct tensor *out,
                           const struct tensor *lse, const struct tensor *cu_seqlens, float scale,
                           struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_attention_backward", "q", q, err));
    TRY(check_compute(&c, "out", out));
    TRY(check_compute(&c, "dout", dout));
    TRY(check_same_shape(&c, "out", out, "q", q));
    TRY(check_same_shape(&c, "dout", dout, "q", q));
    if (!lse) return error_set(err, SMELT_EINVAL, "ops_attention_backward: lse is missing (save it in the forward)");
    TRY(check_attention(&c, q, k, v, cu_seqlens, lse, scale));
    if (dq) {
        TRY(check_compute(&c, "dq", dq));
        TRY(check_same_shape(&c, "dq", dq, "q", q));
    }
    if (dk) {
        TRY(check_compute(&c, "dk", dk));
        TRY(check_same_shape(&c, "dk", dk, "k", k));
    }
    if (dv) {
        TRY(check_compute(&c, "dv", dv));
        TRY(check_same_shape(&c, "dv", dv, "v", v));
    }
    if (!c.impl->attention_backward) return unsupported(&c);
    return c.impl->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, scale, err);
}

/* ---- paged KV cache ---- */

/* k_cache, v_cache: [n_blocks, block_size, Hkv, D], the same shape. */
static int check_kv_cache(struct call *c, const struct tensor *k_cache, const struct tensor *v_cache) {
    char s[96];
    if (k_cache->ndim != 4 || k_cache->shape[1] == 0 || k_cache->shape[2] == 0)
        return error_set(c->err, SMELT_EINVAL,
                         "%s: k_cache has shape %s, expected [n_blocks, block_size, kv_heads, head_dim] "
                         "with block_size and kv_heads >= 1",
                         c->op, tensor_shape_str(k_cache, s, sizeof s));
    TRY(check_compute(c, "v_cache", v_cache));
    return check_same_shape(c, "v_cache", v_cache, "k_cache", k_cache);
}

int ops_kv_append(struct tensor *k_cache, struct tensor *v_cache, const struct tensor *k,
                  const struct tensor *v, const struct tensor *slot_mapping,
                  struct smelt_error *err) {
    struct call c;
    char sk[96], sc[96];
    TRY(call_begin(&c, "ops_kv_append", "k_cache", k_cache, err));
    TRY(check_kv_cache(&c, k_cache, v_cache));
    TRY(check_compute(&c, "k", k));
    TRY(check_compute(&c, "v", v));
    if (k->ndim != 3 || k->shape[1] != k_cache->shape[2] || k->shape[2] != k_cache->shape[3])
        return error_set(err, SMELT_EINVAL,
                         "ops_kv_append: k has shape %s, expected [tokens, %lld, %lld] to match k_cache %s",
                         tensor_shape_str(k, sk, sizeof sk), (long long)k_cache->shape[2],
                         (long long)k_cache->shape[3], tensor_shape_str(k_cache, sc, sizeof sc));
    TRY(check_same_shape(&c, "v", v, "k", k));
    TRY(check_i32(&c, "slot_mapping", slot_mapping));
    TRY(check_numel(&c, "slot_mapping", slot_mapping, k->shape[0], "one slot per token of k"));
    if (!c.impl->kv_append) return unsupported(&c);
    return c.impl->kv_append(k_cache, v_cache, k, v, slot_mapping, err);
}

/* context_lens: host i32 [S]; each context holds its sequence's query tokens and fits
 * in a block table row. */
static int check_context_lens(struct call *c, const struct tensor *context_lens, const int32_t *cu,
                              int64_t nseq, int64_t capacity, int64_t max_blocks, int64_t block_size) {
    TRY(check_on(c, "context_lens", context_lens, DTYPE_I32, BACKEND_CPU));
    TRY(check_numel(c, "context_lens", context_lens, nseq, "one per sequence of cu_q"));
    const int32_t *len = context_lens->data;
    for (int64_t s = 0; s < nseq; s++) {
        int64_t queries = (int64_t)cu[s + 1] - cu[s];
        if (len[s] < queries)
            return error_set(c->err, SMELT_EINVAL,
                             "%s: context_lens[%lld] is %d, fewer than the %lld query tokens of sequence %lld",
                             c->op, (long long)s, len[s], (long long)queries, (long long)s);
        if (len[s] > capacity)
            return error_set(c->err, SMELT_EINVAL,
                             "%s: context_lens[%lld] is %d, more than a block_tables row holds "
                             "(%lld blocks of %lld positions)",
                             c->op, (long long)s, len[s], (long long)max_blocks, (long long)block_size);
    }
    return SMELT_OK;
}

int ops_paged_attention(struct tensor *out, const struct tensor *q, const struct tensor *k_cache,
                        const struct tensor *v_cache, const struct tensor *block_tables,
                        const struct tensor *cu_q, const struct tensor *context_lens,
                        float scale, struct smelt_error *err) {
    struct call c;
    char sq[96], sc[96];
    TRY(call_begin(&c, "ops_paged_attention", "q", q, err));
    TRY(check_compute(&c, "out", out));
    if (q->ndim != 3)
        return error_set(err, SMELT_EINVAL, "ops_paged_attention: q has shape %s, expected [tokens, heads, head_dim]",
                         tensor_shape_str(q, sq, sizeof sq));
    TRY(check_same_shape(&c, "out", out, "q", q));
    TRY(check_compute(&c, "k_cache", k_cache));
    TRY(check_kv_cache(&c, k_cache, v_cache));
    int64_t hq = q->shape[1], hkv = k_cache->shape[2], block_size = k_cache->shape[1];
    if (q->shape[2] != k_cache->shape[3] || hq % hkv != 0)
        return error_set(err, SMELT_EINVAL,
                         "ops_paged_attention: q %s and k_cache %s must share head_dim, with q heads a multiple of kv heads",
                         tensor_shape_str(q, sq, sizeof sq), tensor_shape_str(k_cache, sc, sizeof sc));
    if (!(scale > 0)) return error_set(err, SMELT_EINVAL, "ops_paged_attention: scale %g must be > 0", scale);
    TRY(check_cu(&c, "cu_q", cu_q, q->shape[0]));
    int64_t nseq = tensor_numel(cu_q) - 1;
    TRY(check_i32(&c, "block_tables", block_tables));
    if (block_tables->ndim != 2 || block_tables->shape[0] != nseq)
        return error_set(err, SMELT_EINVAL,
                         "ops_paged_attention: block_tables has shape %s, expected [%lld, max_blocks] (one row per sequence of cu_q)",
                         tensor_shape_str(block_tables, sq, sizeof sq), (long long)nseq);
    int64_t max_blocks = block_tables->shape[1];
    TRY(check_context_lens(&c, context_lens, cu_q->data, nseq, max_blocks * block_size, max_blocks,
                           block_size));
    if (!c.impl->paged_attention) return unsupported(&c);
    return c.impl->paged_attention(out, q, k_cache, v_cache, block_tables, cu_q, context_lens, scale, err);
}

/* ---- activations, residuals ---- */

int ops_swiglu(struct tensor *out, const struct tensor *gate, const struct tensor *up,
               struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_swiglu", "gate", gate, err));
    TRY(check_compute(&c, "up", up));
    TRY(check_compute(&c, "out", out));
    TRY(check_same_shape(&c, "up", up, "gate", gate));
    TRY(check_same_shape(&c, "out", out, "gate", gate));
    if (!c.impl->swiglu) return unsupported(&c);
    return c.impl->swiglu(out, gate, up, err);
}

int ops_swiglu_backward(struct tensor *dgate, struct tensor *dup, const struct tensor *dout,
                        const struct tensor *gate, const struct tensor *up, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_swiglu_backward", "gate", gate, err));
    TRY(check_compute(&c, "up", up));
    TRY(check_compute(&c, "dout", dout));
    TRY(check_same_shape(&c, "up", up, "gate", gate));
    TRY(check_same_shape(&c, "dout", dout, "gate", gate));
    if (dgate) {
        TRY(check_compute(&c, "dgate", dgate));
        TRY(check_same_shape(&c, "dgate", dgate, "gate", gate));
    }
    if (dup) {
        TRY(check_compute(&c, "dup", dup));
        TRY(check_same_shape(&c, "dup", dup, "up", up));
    }
    if (!c.impl->swiglu_backward) return unsupported(&c);
    return c.impl->swiglu_backward(dgate, dup, dout, gate, up, err);
}

int ops_gelu(struct tensor *out, const struct tensor *x, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_gelu", "x", x, err));
    TRY(check_compute(&c, "out", out));
    TRY(check_same_shape(&c, "out", out, "x", x));
    if (!c.impl->gelu) return unsupported(&c);
    return c.impl->gelu(out, x, err);
}

int ops_gelu_backward(struct tensor *dx, const struct tensor *dout, const struct tensor *x,
                      struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_gelu_backward", "x", x, err));
    TRY(check_compute(&c, "dout", dout));
    TRY(check_compute(&c, "dx", dx));
    TRY(check_same_shape(&c, "dout", dout, "x", x));
    TRY(check_same_shape(&c, "dx", dx, "x", x));
    if (!c.impl->gelu_backward) return unsupported(&c);
    return c.impl->gelu_backward(dx, dout, x, err);
}

int ops_add(struct tensor *out, const struct tensor *a, const struct tensor *b,
            struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_add", "a", a, err));
    TRY(check_compute(&c, "b", b));
    TRY(check_compute(&c, "out", out));
    TRY(check_same_shape(&c, "b", b, "a", a));
    TRY(check_same_shape(&c, "out", out, "a", a));
    if (!c.impl->add) return unsupported(&c);
    return c.impl->add(out, a, b, err);
}

int ops_add_backward(struct tensor *da, struct tensor *db, const struct tensor *dout,
                     struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_add_backward", "dout", dout, err));
    if (da) {
        TRY(check_compute(&c, "da", da));
        TRY(check_same_shape(&c, "da", da, "dout", dout));
    }
    if (db) {
        TRY(check_compute(&c, "db", db));
        TRY(check_same_shape(&c, "db", db, "dout", dout));
    }
    if (!c.impl->accumulate) return unsupported(&c);
    if (da) TRY(c.impl->accumulate(da, dout, err));
    if (db) TRY(c.impl->accumulate(db, dout, err));
    return SMELT_OK;
}

/* ---- logprobs ---- */

static int check_logprobs(struct call *c, const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *per_token, const char *per_token_name,
                          const struct tensor *lse) {
    int64_t rows = tensor_rows(logits);
    TRY(check_i32(c, "targets", targets));
    TRY(check_numel(c, "targets", targets, rows, "one per row of logits"));
    TRY(check_f32(c, per_token_name, per_token));
    TRY(check_numel(c, per_token_name, per_token, rows, "one per row of logits"));
    if (lse) {
        TRY(check_f32(c, "lse", lse));
        TRY(check_numel(c, "lse", lse, rows, "one per row of logits"));
    }
    if (logits->shape[logits->ndim - 1] < 1)
        return error_set(c->err, SMELT_EINVAL, "%s: logits have an empty vocabulary dimension", c->op);
    return SMELT_OK;
}

int ops_logprobs(struct tensor *logprobs, struct tensor *lse, const struct tensor *logits,
                 const struct tensor *targets, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_logprobs", "logits", logits, err));
    TRY(check_logprobs(&c, logits, targets, logprobs, "logprobs", lse));
    if (!c.impl->logprobs) return unsupported(&c);
    return c.impl->logprobs(logprobs, lse, logits, targets, err);
}

int ops_logprobs_backward(struct tensor *dlogits, const struct tensor *dlogprobs,
                          const struct tensor *logits, const struct tensor *targets,
                          const struct tensor *lse, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_logprobs_backward", "logits", logits, err));
    TRY(check_compute(&c, "dlogits", dlogits));
    TRY(check_same_shape(&c, "dlogits", dlogits, "logits", logits));
    if (!lse) return error_set(err, SMELT_EINVAL, "ops_logprobs_backward: lse is missing (save it in the forward)");
    TRY(check_logprobs(&c, logits, targets, dlogprobs, "dlogprobs", lse));
    if (!c.impl->logprobs_backward) return unsupported(&c);
    return c.impl->logprobs_backward(dlogits, dlogprobs, logits, targets, lse, err);
}

int ops_argmax(struct tensor *ids, const struct tensor *logits, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_argmax", "logits", logits, err));
    if (logits->shape[logits->ndim - 1] < 1)
        return error_set(err, SMELT_EINVAL, "ops_argmax: logits have an empty vocabulary dimension");
    TRY(check_i32(&c, "ids", ids));
    TRY(check_numel(&c, "ids", ids, tensor_rows(logits), "one per row of logits"));
    if (!c.impl->argmax) return unsupported(&c);
    return c.impl->argmax(ids, logits, err);
}

/* ---- optimizer, reductions, casts ---- */

int ops_adamw(struct tensor *params, struct tensor *m, struct tensor *v, const struct tensor *grads,
              const struct adamw_config *config, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_adamw", "params", params, err));
    TRY(check_f32(&c, "params", params));
    TRY(check_f32(&c, "m", m));
    TRY(check_f32(&c, "v", v));
    TRY(check_f32(&c, "grads", grads));
    int64_t n = tensor_numel(params);
    TRY(check_numel(&c, "m", m, n, "one per parameter"));
    TRY(check_numel(&c, "v", v, n, "one per parameter"));
    TRY(check_numel(&c, "grads", grads, n, "one per parameter"));
    if (!config) return error_set(err, SMELT_EINVAL, "ops_adamw: config is missing");
    if (!(config->lr >= 0) || !(config->beta1 >= 0 && config->beta1 < 1) ||
        !(config->beta2 >= 0 && config->beta2 < 1) || !(config->eps > 0) ||
        !(config->weight_decay >= 0) || !(config->grad_scale >= 0) || config->step < 1)
        return error_set(err, SMELT_EINVAL,
                         "ops_adamw: need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, "
                         "grad_scale >= 0, step >= 1 (got lr %g beta1 %g beta2 %g eps %g wd %g scale %g step %lld)",
                         config->lr, config->beta1, config->beta2, config->eps, config->weight_decay,
                         config->grad_scale, (long long)config->step);
    if (!c.impl->adamw) return unsupported(&c);
    return c.impl->adamw(params, m, v, grads, config, err);
}

int ops_sum_squares(double *out, const struct tensor *x, struct smelt_error *err) {
    struct call c;
    TRY(call_begin(&c, "ops_sum_squares", "x", x, err));
    TRY(check_f32(&c, "x", x));
    if (!out) return error_set(err, SMELT_EINVAL, "ops_sum_squares: out is missing");
    if (!c.impl->sum_squares) return unsupported(&c);
    return c.impl->sum_squares(out, x, err);
}

int ops_cast(struct tensor *out, const struct tensor *in, struct smelt_error *err) {
    struct call c = {.op = "ops_cast", .err = err};
    TRY(check_form(&c, "in", in));
    TRY(check_form(&c, "out", out));
    c.backend = in->backend;
    c.impl = backend_ops_get(in->backend);
    if (!c.impl)
        return error_set(err, SMELT_EUNSUPPORTED, "ops_cast: backend %s is not available", backend_name(in->backend));
    if (out->backend != in->backend)
        return error_set(err, SMELT_EINVAL, "ops_cast: out is on %s, in on %s (use tensor_copy to move data)",
                         backend_name(out->backend), backend_name(in->backend));
    if (in->dtype == DTYPE_I32 || out->dtype == DTYPE_I32)
        return error_set(err, SMELT_EUNSUPPORTED, "ops_cast: casts are between f32, bf16 and f16, not %s to %s",
                         dtype_name(in->dtype), dtype_name(out->dtype));
    TRY(check_numel(&c, "out", out, tensor_numel(in), "same element count as in"));
    if (!c.impl->cast) return unsupported(&c);
    return c.impl->cast(out, in, err);
}
