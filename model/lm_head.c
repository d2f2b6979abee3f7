/* The output projection: logits from final-norm hidden states, with the adapter's
 * head hook (a LoRA on lm_head) after the base matmul, forward and backward. One place
 * for it, so that training, the reference generator and the paged step all apply it. */
#include "model/model_internal.h"

int model_lm_head_forward(const struct model *m, int64_t row0, struct tensor *y, const struct tensor *x,
                          struct smelt_error *err) {
    TRY(ops_matmul(y, x, &m->w.lm_head, NULL, false, true, 1.0f, 0.0f, err));
    const struct model_adapter *ad = m->adapter;
    if (!ad || !ad->head_forward) return SMELT_OK;
    return ad->head_forward(ad->ctx, row0, x, y, err);
}

int model_lm_head_backward(struct model *m, int64_t row0, struct tensor *dx, const struct tensor *dy,
                           const struct tensor *x, struct smelt_error *err) {
    struct tensor *dw = m->g.lm_head.data ? &m->g.lm_head : NULL;
    TRY(ops_matmul_backward(dx, dw, NULL, dy, x, &m->w.lm_head, false, true, 1.0f, err));
    const struct model_adapter *ad = m->adapter;
    if (!ad || !ad->head_backward) return SMELT_OK;
    return ad->head_backward(ad->ctx, row0, x, dy, dx, err);
}
