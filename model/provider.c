/* The seam between the passes and a parameter provider (ZeRO-3, transformer.h): setting
 * one, and the acquire / release / grads_ready calls the passes make, which cost nothing
 * without a provider. A failed pass still releases what it acquired, keeping the first
 * error's message. */
#include "model/model_internal.h"

int model_set_param_provider(struct model *m, const struct model_param_provider *p,
                             struct smelt_error *err) {
    if (p && (!p->begin || !p->acquire || !p->release || !p->grads_ready))
        return error_set(err, SMELT_EINVAL,
                         "model_set_param_provider: begin, acquire, release and grads_ready are all required");
    m->provider = p;
    return SMELT_OK;
}

bool model_base_trains(const struct model *m) {
    return m->grads.data != NULL || (m->provider && m->provider->base_grads);
}

int model_unit_acquire(struct model *m, int64_t unit, bool for_backward, struct smelt_error *err) {
    const struct model_param_provider *p = m->provider;
    if (!p) return SMELT_OK;
    int rc = p->acquire(p->ctx, m, unit, for_backward, err);
    return rc ? error_wrap(err, rc, "parameter unit %lld", (long long)unit) : SMELT_OK;
}

int model_unit_release(struct model *m, int64_t unit, struct smelt_error *err) {
    const struct model_param_provider *p = m->provider;
    if (!p) return SMELT_OK;
    int rc = p->release(p->ctx, m, unit, err);
    return rc ? error_wrap(err, rc, "parameter unit %lld", (long long)unit) : SMELT_OK;
}

int model_pass_begin(struct model *m, bool backward, struct smelt_error *err) {
    const struct model_param_provider *p = m->provider;
    if (!p) return SMELT_OK;
    return p->begin(p->ctx, m, backward, err);
}

int model_unit_done(struct model *m, int64_t unit, int rc, struct smelt_error *err) {
    if (!m->provider) return rc;
    if (rc) {
        struct smelt_error ignored = {0};
        model_unit_release(m, unit, &ignored);
        return rc;
    }
    return model_unit_release(m, unit, err);
}

int model_unit_grads_ready(struct model *m, int64_t unit, struct smelt_error *err) {
    const struct model_param_provider *p = m->provider;
    if (!p || !p->base_grads) return SMELT_OK;
    int rc = p->grads_ready(p->ctx, m, unit, err);
    return rc ? error_wrap(err, rc, "gradients of parameter unit %lld", (long long)unit) : SMELT_OK;
}
