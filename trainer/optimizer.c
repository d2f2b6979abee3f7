/* AdamW over one flat parameter buffer, or over one rank's shard of it (ZeRO stage >= 1:
 * trainer/dist.c), with global-norm clipping folded into the gradient scale (one pass over
 * the gradients for the norm, one for the update). The one-rank step and the sharded one
 * share optimizer_apply: they differ only in where the sum of squares comes from. */
#include "trainer/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int optimizer_init_shard(struct optimizer *opt, const struct tensor *params, int64_t offset, int64_t len,
                         struct smelt_error *err) {
    memset(opt, 0, sizeof *opt);
    int64_t n = tensor_numel(params);
    if (params->dtype != DTYPE_F32)
        return error_set(err, SMELT_EINVAL, "optimizer: parameters must be f32 master weights");
    if (offset < 0 || len < 1 || offset + len > n)
        return error_set(err, SMELT_EINVAL, "optimizer: shard [%lld, +%lld) outside %lld parameters",
                         (long long)offset, (long long)len, (long long)n);
    opt->offset = offset;
    opt->total = n;
    int rc = tensor_alloc(&opt->m, params->backend, DTYPE_F32, 1, &len, err);
    if (!rc) rc = tensor_alloc(&opt->v, params->backend, DTYPE_F32, 1, &len, err);
    if (!rc) rc = tensor_zero(&opt->m, err);
    if (!rc) rc = tensor_zero(&opt->v, err);
    if (rc) optimizer_free(opt);
    return rc;
}

int optimizer_init(struct optimizer *opt, const struct tensor *params, struct smelt_error *err) {
    return optimizer_init_shard(opt, params, 0, tensor_numel(params), err);
}

int optimizer_init_pieces(struct optimizer *opt, const struct tensor *shard, int64_t total, int64_t n,
                          const int64_t *off, const int64_t *len, struct smelt_error *err) {
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        if (off[i] < 0 || len[i] < 0 || off[i] + len[i] > total)
            return error_set(err, SMELT_EINVAL, "optimizer: piece %lld [%lld, +%lld) outside %lld parameters",
                             (long long)i, (long long)off[i], (long long)len[i], (long long)total);
        sum += len[i];
    }
    if (n < 1 || sum != tensor_numel(shard))
        return error_set(err, SMELT_EINVAL, "optimizer: %lld pieces of %lld elements for a shard of %lld",
                         (long long)n, (long long)sum, (long long)tensor_numel(shard));
    TRY(optimizer_init(opt, shard, err));
    opt->total = total;
    opt->piece_off = malloc((size_t)n * sizeof *opt->piece_off);
    opt->piece_len = malloc((size_t)n * sizeof *opt->piece_len);
    if (!opt->piece_off || !opt->piece_len) {
        optimizer_free(opt);
        return error_set(err, SMELT_ENOMEM, "optimizer: out of memory");
    }
    memcpy(opt->piece_off, off, (size_t)n * sizeof *off);
    memcpy(opt->piece_len, len, (size_t)n * sizeof *len);
    opt->n_pieces = n;
    return SMELT_OK;
}

void optimizer_free(struct optimizer *opt) {
    tensor_free(&opt->m);
    tensor_free(&opt->v);
    free(opt->piece_off);
    free(opt->piece_len);
    opt->piece_off = opt->piece_len = NULL;
    opt->n_pieces = 0;
}

struct tensor optimizer_view(const struct tensor *t, int64_t offset, int64_t len) {
    return tensor_make(t->backend, DTYPE_F32, (float *)t->data + offset, 1, &len);
}

int optimizer_apply(struct optimizer *opt, struct tensor *params, const struct tensor *grads, double sum_squares,
                    const struct adamw_step *s, double *norm_out, struct smelt_error *err) {
    double norm = sqrt(sum_squares) * s->grad_scale;
    if (norm_out) *norm_out = norm;
    if (!isfinite(norm))
        return error_set(err, SMELT_EINVAL, "optimizer: the gradient norm is %g; refusing to update", norm);
    double scale = s->grad_scale;
    /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1. */
    double coef = s->max_norm > 0 ? s->max_norm / (norm + 1e-6) : 1.0;
    if (coef < 1.0) scale *= coef;
    opt->step++;
    int64_t len = tensor_numel(&opt->m);
    struct adamw_config c = {.lr = (float)s->lr, .beta1 = (float)s->beta1, .beta2 = (float)s->beta2,
                             .eps = (float)s->eps, .weight_decay = (float)s->weight_decay,
                             .grad_scale = (float)scale, .step = opt->step};
    struct tensor p = optimizer_view(params, opt->offset, len);
    return ops_adamw(&p, &opt->m, &opt->v, grads, &c, err);
}

int optimizer_step(struct optimizer *opt, struct tensor *params, const struct tensor *grads,
                   double grad_scale, double max_norm, double lr, double beta1, double beta2,
                   double eps, double weight_decay, double *norm_out, struct smelt_error *err) {
    double sum_squares;
    TRY(ops_sum_squares(&sum_squares, grads, err));
    struct adamw_step s = {.grad_scale = grad_scale, .max_norm = max_norm, .lr = lr, .beta1 = beta1,
                           .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
    return optimizer_apply(opt, params, grads, sum_squares, &s, norm_out, err);
}

/* Host copies of the moments (the identity on the CPU backend). */
static int to_host(const struct tensor *t, struct tensor *host, struct smelt_error *err) {
    int64_t n = tensor_numel(t);
    int rc = tensor_alloc(host, BACKEND_CPU, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_copy(host, t, err);
    if (rc) tensor_free(host);
    return rc;
}

/* "OFF+LEN,OFF+LEN,...": the pieces as the metadata holds them; *out malloc'd. */
static int pieces_text(const struct optimizer *opt, char **out, struct smelt_error *err) {
    size_t cap = (size_t)opt->n_pieces * 42 + 1, used = 0;
    char *text = malloc(cap);
    if (!text) return error_set(err, SMELT_ENOMEM, "optimizer: out of memory");
    text[0] = 0;
    for (int64_t i = 0; i < opt->n_pieces; i++)
        used += (size_t)snprintf(text + used, cap - used, "%s%lld+%lld", i ? "," : "", (long long)opt->piece_off[i],
                                 (long long)opt->piece_len[i]);
    *out = text;
    return SMELT_OK;
}

int optimizer_save(const struct optimizer *opt, const char *path, struct smelt_error *err) {
    struct tensor hm = {0}, hv = {0};
    char *pieces = NULL;
    int rc = to_host(&opt->m, &hm, err);
    if (!rc) rc = to_host(&opt->v, &hv, err);
    if (!rc && opt->n_pieces) rc = pieces_text(opt, &pieces, err);
    if (!rc) {
        char step[32], offset[32], total[32];
        snprintf(step, sizeof step, "%lld", (long long)opt->step);
        snprintf(offset, sizeof offset, "%lld", (long long)opt->offset);
        snprintf(total, sizeof total, "%lld", (long long)opt->total);
        struct safetensors_tensor_desc t[2] = {{"exp_avg", hm, DTYPE_F32}, {"exp_avg_sq", hv, DTYPE_F32}};
        struct safetensors_kv meta[5] = {{"format", "smelt-adamw"}, {"step", step}, {"offset", offset},
                                         {"total", total}, {"pieces", pieces}};
        rc = safetensors_write(path, t, 2, meta, pieces ? 5 : 4, err);
    }
    free(pieces);
    tensor_free(&hm);
    tensor_free(&hv);
    return rc;
}

/* Offsets and lengths read from a checkpoint are at most this: far above any model, and
 * sums of a few of them cannot overflow. */
#define MOMENT_MAX_ELEMENTS (1ll << 48)

/* A non-negative integer of the metadata (at most MOMENT_MAX_ELEMENTS); def when absent
 * (files older than sharding). */
static int meta_int(const struct safetensors *st, const char *path, const char *key, long long def, long long *out,
                    struct smelt_error *err) {
    const char *text = safetensors_metadata_get(st, key);
    char *end = NULL;
    errno = 0;
    *out = text ? strtoll(text, &end, 10) : def;
    if (*out < 0 || *out > MOMENT_MAX_ELEMENTS || errno == ERANGE || (text && (!*text || *end)))
        return error_set(err, SMELT_EFORMAT, "%s: no valid \"%s\" in the metadata", path, key);
    return SMELT_OK;
}

/* A moment of one saved shard: f32 [len]. */
static int moment(const struct safetensors *st, const char *path, const char *name, long long len,
                  const float **out, struct smelt_error *err) {
    const struct safetensors_entry *e = safetensors_find(st, name);
    if (!e) return error_set(err, SMELT_ENOTFOUND, "%s: no tensor \"%s\"", path, name);
    if (e->dtype != SAFETENSORS_F32 || e->ndim != 1 || (len >= 0 && e->numel != len))
        return error_set(err, SMELT_EFORMAT, "%s: \"%s\" is not f32 [%lld]", path, name, len);
    *out = e->data;
    return SMELT_OK;
}

/* A run of moments: flat elements [flat, + len) are the moments' elements [at, + len). */
struct moment_range {
    int64_t flat, len, at;
};

/* The ranges opt's moments hold; *out malloc'd. */
static int own_ranges(const struct optimizer *opt, struct moment_range **out, int64_t *n, struct smelt_error *err) {
    *n = opt->n_pieces ? opt->n_pieces : 1;
    struct moment_range *r = malloc((size_t)*n * sizeof *r);
    if (!r) return error_set(err, SMELT_ENOMEM, "optimizer: out of memory");
    r[0] = (struct moment_range){opt->offset, tensor_numel(&opt->m), 0};
    for (int64_t i = 0, at = 0; i < opt->n_pieces; at += opt->piece_len[i], i++)
        r[i] = (struct moment_range){opt->piece_off[i], opt->piece_len[i], at};
    *out = r;
    return SMELT_OK;
}

/* One "OFF+LEN" of a "pieces" text at *p, which moves past it and its comma. */
static bool parse_piece(const char **p, struct moment_range *r) {
    char *end;
    long long off = strtoll(*p, &end, 10);
    if (end == *p || *end != '+') return false;
    const char *q = end + 1;
    long long len = strtoll(q, &end, 10);
    if (end == q || (*end && *end != ',') || off < 0 || len < 0 || off > MOMENT_MAX_ELEMENTS ||
        len > MOMENT_MAX_ELEMENTS)
        return false;
    r->flat = off;
    r->len = len;
    *p = *end ? end + 1 : end;
    return true;
}

/* The ranges a saved shard holds: its "pieces", else [offset, + numel). Each within
 * total, covering numel elements. */
static int file_ranges(const struct safetensors *st, const char *path, long long offset, int64_t numel,
                       long long total, struct moment_range **out, int64_t *n, struct smelt_error *err) {
    const char *text = safetensors_metadata_get(st, "pieces");
    *n = 1;
    for (const char *c = text; c && *c; c++) *n += *c == ',';
    struct moment_range *r = malloc((size_t)*n * sizeof *r);
    if (!r) return error_set(err, SMELT_ENOMEM, "optimizer: out of memory");
    r[0] = (struct moment_range){offset, numel, 0};
    int64_t at = 0;
    bool ok = true;
    for (int64_t i = 0; text && i < *n && ok; i++) {
        ok = parse_piece(&text, &r[i]) && r[i].len <= numel - at; /* never past the moments */
        r[i].at = at;
        at += r[i].len;
    }
    ok = ok && (!text || (!*text && at == numel));
    for (int64_t i = 0; i < *n && ok; i++) ok = r[i].flat + r[i].len <= total;
    if (!ok) {
        free(r);
        return error_set(err, SMELT_EFORMAT, "%s: its pieces or shard [%lld, +%lld) do not fit %lld parameters", path,
                         offset, (long long)numel, total);
    }
    *out = r;
    return SMELT_OK;
}

/* Copies every overlap of a saved shard's ranges (moments m, v as stored) with opt's
 * (host moments hm, hv); *copied counts the elements. */
static void copy_overlaps(const struct moment_range *file, int64_t nf, const struct moment_range *own, int64_t no,
                          const float *m, const float *v, float *hm, float *hv, int64_t *copied) {
    for (int64_t i = 0; i < nf; i++)
        for (int64_t j = 0; j < no; j++) {
            const struct moment_range *f = &file[i], *o = &own[j];
            int64_t lo = f->flat > o->flat ? f->flat : o->flat;
            int64_t hi = f->flat + f->len < o->flat + o->len ? f->flat + f->len : o->flat + o->len;
            if (hi <= lo) continue;
            /* The file's data may be unaligned for floats: memcpy, not loads. */
            size_t src = (size_t)(f->at + lo - f->flat) * 4, n = (size_t)(hi - lo) * 4;
            memcpy(hm + o->at + (lo - o->flat), (const char *)m + src, n);
            memcpy(hv + o->at + (lo - o->flat), (const char *)v + src, n);
            *copied += hi - lo;
        }
}

/* The part of the saved shard at path that overlaps the optimizer's elements, into the
 * host moments hm, hv (the optimizer's layout); *copied counts the elements, *step
 * gets the file's step. */
static int load_slice(const struct optimizer *opt, const char *path, float *hm, float *hv, int64_t *copied,
                      long long *step, struct smelt_error *err) {
    struct safetensors *st;
    TRY(safetensors_open(path, &st, err));
    long long offset, total;
    const float *m = NULL, *v = NULL;
    struct moment_range *file = NULL, *own = NULL;
    int64_t nf = 0, no = 0;
    int rc = meta_int(st, path, "step", -1, step, err);
    if (!rc && *step < 0) rc = error_set(err, SMELT_EFORMAT, "%s: no valid \"step\" in the metadata", path);
    const struct safetensors_entry *e = rc ? NULL : safetensors_find(st, "exp_avg");
    if (!rc && !e) rc = error_set(err, SMELT_ENOTFOUND, "%s: no tensor \"exp_avg\"", path);
    if (!rc) rc = meta_int(st, path, "offset", 0, &offset, err);
    if (!rc) rc = meta_int(st, path, "total", offset + e->numel, &total, err);
    if (!rc && total != opt->total)
        rc = error_set(err, SMELT_EINVAL, "%s: moments of %lld parameters; this job trains %lld", path, total,
                       (long long)opt->total);
    if (!rc) rc = moment(st, path, "exp_avg", -1, &m, err);
    if (!rc) rc = moment(st, path, "exp_avg_sq", e->numel, &v, err);
    if (!rc) rc = file_ranges(st, path, offset, e->numel, total, &file, &nf, err);
    if (!rc) rc = own_ranges(opt, &own, &no, err);
    if (!rc) copy_overlaps(file, nf, own, no, m, v, hm, hv, copied);
    free(file);
    free(own);
    safetensors_close(st);
    return rc;
}

int optimizer_load_shards(struct optimizer *opt, const char *const *paths, int n_paths, struct smelt_error *err) {
    int64_t n = tensor_numel(&opt->m), copied = 0;
    long long step = -1;
    struct tensor hm = {0}, hv = {0};
    int rc = tensor_alloc(&hm, BACKEND_CPU, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_alloc(&hv, BACKEND_CPU, DTYPE_F32, 1, &n, err);
    for (int i = 0; i < n_paths && !rc; i++) {
        long long s;
        rc = load_slice(opt, paths[i], hm.data, hv.data, &copied, &s, err);
        if (!rc && step >= 0 && s != step)
            rc = error_set(err, SMELT_EFORMAT, "%s: step %lld, but %s has %lld", paths[i], s, paths[0], step);
        step = s;
    }
    /* Saved shards are disjoint, so a full cover copies every element exactly once. */
    if (!rc && copied != n)
        rc = error_set(err, SMELT_EFORMAT, "%s: the saved shards cover %lld of this rank's %lld moments",
                       n_paths ? paths[0] : "optimizer", (long long)copied, (long long)n);
    if (!rc) rc = tensor_copy(&opt->m, &hm, err);
    if (!rc) rc = tensor_copy(&opt->v, &hv, err);
    if (!rc) opt->step = step;
    tensor_free(&hm);
    tensor_free(&hv);
    return rc;
}

int optimizer_load(struct optimizer *opt, const char *path, struct smelt_error *err) {
    return optimizer_load_shards(opt, &path, 1, err);
}
