/* optim_step: AdamW on one model's adapter with the gradients its forward_backward
 * calls accumulated, then those gradients zeroed for the next step. */
#include "common/clock.h"
#include "tinker/tinker_internal.h"

struct adam {
    double lr, beta1, beta2, eps, weight_decay, clip;
};

/* {learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm}: Tinker's AdamParams
 * (types/optimizer.py), every field required (smeltd fills the SDK's defaults). */
static int adam_parse(const json_t *h, struct adam *a, struct smelt_error *err) {
    static const char *const keys[] = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm",
                                       NULL};
    const json_t *j = json_object_get(h, "adam");
    if (!json_is_object(j)) return error_set_field(err, SMELT_EINVAL, "adam", "adam: required object");
    int rc = json_check_keys(j, keys, "adam", err);
    if (!rc) rc = json_field_double(j, "learning_rate", true, 0, 0.0, 1e3, &a->lr, "adam", err);
    if (!rc) rc = json_field_double(j, "beta1", true, 0, 0.0, 0.999999999, &a->beta1, "adam", err);
    if (!rc) rc = json_field_double(j, "beta2", true, 0, 0.0, 0.999999999, &a->beta2, "adam", err);
    if (!rc) rc = json_field_double(j, "eps", true, 0, 1e-30, 1.0, &a->eps, "adam", err);
    if (!rc) rc = json_field_double(j, "weight_decay", true, 0, 0.0, 1e3, &a->weight_decay, "adam", err);
    if (!rc) rc = json_field_double(j, "grad_clip_norm", true, 0, 0.0, 1e30, &a->clip, "adam", err);
    return error_in_field(err, rc, "adam");
}

int tinker_op_optim_step(struct tinker_worker *w, const struct msg *m, struct tinker_reply *out,
                         struct smelt_error *err) {
    int64_t t0 = mono_ms();
    struct tinker_model *tm;
    struct adam a;
    TRY(tinker_model_of(w, m->header, &tm, err));
    TRY(adam_parse(m->header, &a, err));
    struct lora *l = tm->lora;
    double norm;
    TRY(optimizer_step(&tm->opt, &l->weights, &l->grads, 1.0, a.clip, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                       &norm, err));
    TRY(tensor_zero(&l->grads, err));
    if (!(out->result = json_pack("{s:{s:f, s:f}}", "metrics", "grad_norm:mean", norm, "learning_rate:mean", a.lr)))
        return error_set(err, SMELT_ENOMEM, "optim_step: out of memory");
    tinker_metrics_write(w, "optim_step", tm, json_object_get(out->result, "metrics"), (double)(mono_ms() - t0));
    return SMELT_OK;
}
