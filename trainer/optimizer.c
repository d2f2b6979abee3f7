/* AdamW over one flat parameter buffer, or over one rank's shard of it (ZeRO stage >= 1:
 * trainer/dist.c), with global-norm clipping folded into the gradient scale (one pass over
 * the gradients for the norm, one for the update). The one-rank step and the sharded one
 * share optimizer_apply: they differ only in where the sum of squares comes from. */
#include "trainer/trainer.h"

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

void optimizer_free(struct optimizer *opt) {
    tensor_free(&opt->m);
    tensor_free(&opt->v);
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

int optimizer_save(const struct optimizer *opt, const char *path, struct smelt_error *err) {
    struct tensor hm = {0}, hv = {0};
    int rc = to_host(&opt->m, &hm, err);
    if (!rc) rc = to_host(&opt->v, &hv, err);
    if (!rc) {
        char step[32], offset[32], total[32];
        snprintf(step, sizeof step, "%lld", (long long)opt->step);
        snprintf(offset, sizeof offset, "%lld", (long long)opt->offset);
        snprintf(total, sizeof total, "%lld", (long long)opt->total);
        struct safetensors_tensor_desc t[2] = {{"exp_avg", hm, DTYPE_F32}, {"exp_avg_sq", hv, DTYPE_F32}};
        struct safetensors_kv meta[4] = {{"format", "smelt-adamw"}, {"step", step}, {"offset", offset},
                                         {"total", total}};
        rc = safetensors_write(path, t, 2, meta, 4, err);
    }
    tensor_free(&hm);
    tensor_free(&hv);
    return rc;
}

/* A non-negative integer of the metadata; def when absent (files older than sharding). */
static int meta_int(const struct safetensors *st, const char *path, const char *key, long long def, long long *out,
                    struct smelt_error *err) {
    const char *text = safetensors_metadata_get(st, key);
    char *end = NULL;
    *out = text ? strtoll(text, &end, 10) : def;
    if (*out < 0 || (text && (!*text || *end)))
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

/* The part of the saved shard at path that overlaps the optimizer's elements, into the
 * host moments hm, hv (the optimizer's layout); *copied counts the elements, *step
 * gets the file's step. */
static int load_slice(const struct optimizer *opt, const char *path, float *hm, float *hv, int64_t *copied,
                      long long *step, struct smelt_error *err) {
    struct safetensors *st;
    TRY(safetensors_open(path, &st, err));
    long long offset, total;
    const float *m = NULL, *v = NULL;
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
    if (!rc && offset + e->numel > total)
        rc = error_set(err, SMELT_EFORMAT, "%s: shard [%lld, +%lld) outside %lld", path, offset, (long long)e->numel,
                       total);
    if (!rc) {
        int64_t lo = opt->offset > offset ? opt->offset : offset;
        int64_t mine_end = opt->offset + tensor_numel(&opt->m), end = offset + e->numel;
        int64_t hi = mine_end < end ? mine_end : end;
        if (hi > lo) {
            /* The file's data may be unaligned for floats: memcpy, not loads. */
            memcpy(hm + (lo - opt->offset), (const char *)m + (lo - offset) * 4, (size_t)(hi - lo) * 4);
            memcpy(hv + (lo - opt->offset), (const char *)v + (lo - offset) * 4, (size_t)(hi - lo) * 4);
            *copied += hi - lo;
        }
    }
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
