/* AdamW over one flat parameter buffer, with global-norm clipping folded into the
 * gradient scale (one pass over the gradients for the norm, one for the update). */
#include "trainer/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int optimizer_init(struct optimizer *opt, const struct tensor *params, struct smelt_error *err) {
    memset(opt, 0, sizeof *opt);
    int64_t n = tensor_numel(params);
    if (params->dtype != DTYPE_F32)
        return error_set(err, SMELT_EINVAL, "optimizer: parameters must be f32 master weights");
    int rc = tensor_alloc(&opt->m, params->backend, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_alloc(&opt->v, params->backend, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_zero(&opt->m, err);
    if (!rc) rc = tensor_zero(&opt->v, err);
    if (rc) optimizer_free(opt);
    return rc;
}

void optimizer_free(struct optimizer *opt) {
    tensor_free(&opt->m);
    tensor_free(&opt->v);
}

int optimizer_step(struct optimizer *opt, struct tensor *params, const struct tensor *grads,
                   double grad_scale, double max_norm, double lr, double beta1, double beta2,
                   double eps, double weight_decay, double *norm_out, struct smelt_error *err) {
    double sum_squares;
    int rc = ops_sum_squares(&sum_squares, grads, err);
    if (rc) return rc;
    double norm = sqrt(sum_squares) * grad_scale;
    if (norm_out) *norm_out = norm;
    if (!isfinite(norm))
        return error_set(err, SMELT_EINVAL, "optimizer: the gradient norm is %g; refusing to update", norm);
    double scale = grad_scale;
    /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1. */
    double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    if (coef < 1.0) scale *= coef;
    opt->step++;
    struct adamw_config c = {.lr = (float)lr, .beta1 = (float)beta1, .beta2 = (float)beta2,
                             .eps = (float)eps, .weight_decay = (float)weight_decay,
                             .grad_scale = (float)scale, .step = opt->step};
    return ops_adamw(params, &opt->m, &opt->v, grads, &c, err);
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
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)opt->step);
        struct safetensors_tensor_desc t[2] = {{"exp_avg", hm, DTYPE_F32}, {"exp_avg_sq", hv, DTYPE_F32}};
        struct safetensors_kv meta[2] = {{"format", "smelt-adamw"}, {"step", step}};
        rc = safetensors_write(path, t, 2, meta, 2, err);
    }
    tensor_free(&hm);
    tensor_free(&hv);
    return rc;
}

int optimizer_load(struct optimizer *opt, const char *path, struct smelt_error *err) {
    struct safetensors *st;
    int rc = safetensors_open(path, &st, err);
    if (rc) return rc;
    const char *step = safetensors_metadata_get(st, "step");
    char *end = NULL;
    long long s = step ? strtoll(step, &end, 10) : -1;
    if (!step || *end || s < 0) {
        safetensors_close(st);
        return error_set(err, SMELT_EFORMAT, "%s: no valid \"step\" in the metadata", path);
    }
    int64_t n = tensor_numel(&opt->m);
    struct tensor hm = {0}, hv = {0};
    rc = tensor_alloc(&hm, BACKEND_CPU, DTYPE_F32, 1, &n, err);
    if (!rc) rc = tensor_alloc(&hv, BACKEND_CPU, DTYPE_F32, 1, &n, err);
    if (!rc) rc = safetensors_read(st, "exp_avg", &hm, err);
    if (!rc) rc = safetensors_read(st, "exp_avg_sq", &hv, err);
    if (!rc) rc = tensor_copy(&opt->m, &hm, err);
    if (!rc) rc = tensor_copy(&opt->v, &hv, err);
    if (!rc) opt->step = s;
    tensor_free(&hm);
    tensor_free(&hv);
    safetensors_close(st);
    return rc;
}
