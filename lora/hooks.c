/* The forward and backward hooks model_forward / model_backward call after each base
 * linear. With u = drop(x) A^T [T, r] and s the scaling:
 *   forward:  y += s u B^T
 *   backward: dB += s dy^T u; du = s dy B; dA += du^T drop(x); dx += drop'(du A)
 * u and drop(x) are recomputed in the backward (r is small, and dropout masks are a
 * function of the seed), so nothing is kept between the passes. GPT-2's c_attn is
 * called once for each of q, k and v with its row block of B; the three backward calls
 * each add their share into dA and dx. lm_head's hooks are the same maths on the final
 * hidden states, called chunk by chunk of rows (row0 tells dropout where a chunk is). */
#include "lora/lora_internal.h"

/* The first rows * cols elements of a flat buffer as [rows, cols]. */
static struct tensor view2(const struct tensor *flat, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return tensor_make(flat->backend, DTYPE_F32, flat->data, 2, shape);
}

/* The hook's row block of B (or of its gradient). */
static struct tensor b_block(const struct lora *lora, const struct tensor *flat,
                             const struct lora_module *mod, const struct lora_hook *hook) {
    const struct lora_param *b = &lora->params[mod->param_a + 1];
    int64_t shape[2] = {hook->rows, b->shape[1]};
    float *base = (float *)flat->data + b->offset + hook->row0 * b->shape[1];
    return tensor_make(flat->backend, DTYPE_F32, base, 2, shape);
}

static const struct lora_hook *find_hook(const struct lora *lora, int64_t layer,
                                         enum model_linear linear) {
    if (layer < 0 || layer >= lora->state->selection.n_layers || linear < 0 || linear >= MODEL_LINEAR_COUNT)
        return NULL;
    const struct lora_hook *h = &lora->state->hooks[layer * MODEL_LINEAR_COUNT + linear];
    return h->module >= 0 ? h : NULL;
}

static int check_shapes(const struct lora *lora, const struct lora_module *mod, const struct lora_hook *hook,
                        const struct tensor *x, const struct tensor *y, struct smelt_error *err) {
    if (x->ndim != 2 || x->shape[1] != mod->in || y->ndim != 2 || y->shape[0] != x->shape[0] ||
        y->shape[1] != hook->rows || x->dtype != DTYPE_F32 || y->dtype != DTYPE_F32)
        return error_set(err, SMELT_EINVAL, "lora: %s: linear input/output of the wrong shape "
                         "(expected f32 [T, %lld] -> [T, %lld])", lora->params[mod->param_a].name,
                         (long long)mod->in, (long long)hook->rows);
    return SMELT_OK;
}

/* The hook's module, scratch for T rows, drop(x) in *xd and u = drop(x) A^T in *u. */
struct hook_pass {
    const struct lora_module *mod;
    struct tensor xd, u, a, b;
};

/* row0: x's first row in the batch (dropout masks are per batch element). */
static int begin(struct lora *lora, const struct lora_hook *hook, int64_t row0, const struct tensor *x,
                 const struct tensor *y, struct hook_pass *p, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    p->mod = &s->modules[hook->module];
    int rc = check_shapes(lora, p->mod, hook, x, y, err);
    if (rc) return rc;
    int64_t T = x->shape[0];
    bool drop = lora_dropout_active(lora);
    if ((rc = lora_scratch_reserve(lora, T, drop, err))) return rc;
    p->xd = *x;
    if (drop) {
        p->xd = view2(&s->x_drop, T, p->mod->in);
        if ((rc = lora_dropout_forward(lora, p->mod, row0, x, &p->xd, err))) return rc;
    }
    p->a = lora_param_view(lora, &lora->weights, p->mod->param_a);
    p->b = b_block(lora, &lora->weights, p->mod, hook);
    p->u = view2(&s->u, T, lora->config.rank);
    return ops_matmul(&p->u, &p->xd, &p->a, NULL, false, true, 1.0f, 0.0f, err);
}

static int hook_forward(struct lora *lora, const struct lora_hook *hook, int64_t row0, const struct tensor *x,
                        struct tensor *y, struct smelt_error *err) {
    struct hook_pass p;
    int rc = begin(lora, hook, row0, x, y, &p, err);
    if (rc) return rc;
    return ops_matmul(y, &p.u, &p.b, NULL, false, true, lora->scaling, 1.0f, err);
}

static int hook_backward(struct lora *lora, const struct lora_hook *hook, int64_t row0, const struct tensor *x,
                         const struct tensor *dy, struct tensor *dx, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    struct hook_pass p;
    int rc = begin(lora, hook, row0, x, dy, &p, err);
    if (rc) return rc;
    int64_t T = x->shape[0];
    struct tensor du = view2(&s->du, T, lora->config.rank);
    struct tensor da = lora_param_view(lora, &lora->grads, p.mod->param_a);
    struct tensor db = b_block(lora, &lora->grads, p.mod, hook);
    if ((rc = tensor_zero(&du, err))) return rc;
    /* du += s dy B, dB += s dy^T u */
    if ((rc = ops_matmul_backward(&du, &db, NULL, dy, &p.u, &p.b, false, true, lora->scaling, err)))
        return rc;
    if (!lora_dropout_active(lora))
        return ops_matmul_backward(dx, &da, NULL, &du, x, &p.a, false, true, 1.0f, err);
    struct tensor dxd = view2(&s->dx_drop, T, p.mod->in);
    if ((rc = tensor_zero(&dxd, err))) return rc;
    if ((rc = ops_matmul_backward(&dxd, &da, NULL, &du, &p.xd, &p.a, false, true, 1.0f, err)))
        return rc;
    return dx ? lora_dropout_backward(lora, p.mod, row0, &dxd, dx, err) : SMELT_OK;
}

int lora_hook_forward(void *ctx, int64_t layer, enum model_linear linear,
                      const struct tensor *x, struct tensor *y, struct smelt_error *err) {
    const struct lora_hook *hook = find_hook(ctx, layer, linear);
    return hook ? hook_forward(ctx, hook, 0, x, y, err) : SMELT_OK;
}

int lora_hook_backward(void *ctx, int64_t layer, enum model_linear linear,
                       const struct tensor *x, const struct tensor *dy, struct tensor *dx,
                       struct smelt_error *err) {
    const struct lora_hook *hook = find_hook(ctx, layer, linear);
    return hook ? hook_backward(ctx, hook, 0, x, dy, dx, err) : SMELT_OK;
}

/* lm_head's module as a hook: all of B's rows. */
static struct lora_hook head_hook(const struct lora *lora) {
    const struct lora_state *s = lora->state;
    SMELT_ASSERT(s->head_module >= 0);
    return (struct lora_hook){.module = s->head_module, .row0 = 0, .rows = s->modules[s->head_module].out};
}

int lora_hook_head_forward(void *ctx, int64_t row0, const struct tensor *x, struct tensor *y,
                           struct smelt_error *err) {
    struct lora_hook hook = head_hook(ctx);
    return hook_forward(ctx, &hook, row0, x, y, err);
}

int lora_hook_head_backward(void *ctx, int64_t row0, const struct tensor *x, const struct tensor *dy,
                            struct tensor *dx, struct smelt_error *err) {
    struct lora_hook hook = head_hook(ctx);
    return hook_backward(ctx, &hook, row0, x, dy, dx, err);
}
