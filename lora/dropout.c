/* LoRA dropout with masks from a hash, not a random stream: element (t, i) of the input
 * of module (layer, kind) is kept when hash(seed, layer, kind, t * in + i) falls at or
 * above p. The same seed gives the same masks, so the backward's recompute and an exact
 * resume need no saved state. Kept elements are scaled by 1 / (1 - p), as
 * torch.nn.Dropout does.
 *
 * kernels/ops.h has no elementwise mask op, so off the CPU the masks are applied on
 * the host between two copies: correct, not fast (a kernels op would remove it). */
#include "lora/lora_internal.h"

static uint64_t module_key(uint64_t seed, const struct lora_module *mod) {
    uint64_t site = ((uint64_t)mod->layer << 8) | (uint64_t)mod->kind;
    return rng_mix64(rng_mix64(seed + RNG_GOLDEN) ^ rng_mix64(site + 0x632be59bd9b4e019ull));
}

bool lora_dropout_active(const struct lora *lora) {
    return lora->state->training && lora->config.dropout > 0.0f;
}

/* dst = mask * src * scale, or dst += that when accumulate; element e of src is
 * element first + e of the module's input. */
static void apply_mask(uint64_t key, float p, int64_t first, const float *src, float *dst, int64_t n,
                       bool accumulate) {
    float scale = 1.0f / (1.0f - p);
    double threshold = (double)p;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t e = 0; e < n; e++) {
        uint64_t h = rng_mix64(key + (uint64_t)(first + e + 1) * RNG_GOLDEN);
        bool keep = (double)(h >> 11) * 0x1p-53 >= threshold;
        float v = keep ? src[e] * scale : 0.0f;
        dst[e] = accumulate ? dst[e] + v : v;
    }
}

static struct tensor host_like(float *data, const struct tensor *like) {
    return tensor_make(BACKEND_CPU, DTYPE_F32, data, like->ndim, like->shape);
}

int lora_dropout_forward(struct lora *lora, const struct lora_module *mod, int64_t row0,
                         const struct tensor *x, struct tensor *out, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    uint64_t key = module_key(s->dropout_seed, mod);
    int64_t n = tensor_numel(x), first = row0 * mod->in;
    if (x->backend == BACKEND_CPU) {
        apply_mask(key, lora->config.dropout, first, x->data, out->data, n, false);
        return SMELT_OK;
    }
    struct tensor ha = host_like(s->host_a, x), hb = host_like(s->host_b, x);
    int rc = tensor_copy(&ha, x, err);
    if (rc) return rc;
    apply_mask(key, lora->config.dropout, first, s->host_a, s->host_b, n, false);
    return tensor_copy(out, &hb, err);
}

int lora_dropout_backward(struct lora *lora, const struct lora_module *mod, int64_t row0,
                          const struct tensor *dout, struct tensor *dx, struct smelt_error *err) {
    struct lora_state *s = lora->state;
    uint64_t key = module_key(s->dropout_seed, mod);
    int64_t n = tensor_numel(dout), first = row0 * mod->in;
    if (dx->backend == BACKEND_CPU) {
        apply_mask(key, lora->config.dropout, first, dout->data, dx->data, n, true);
        return SMELT_OK;
    }
    struct tensor ha = host_like(s->host_a, dout), hb = host_like(s->host_b, dx);
    int rc = tensor_copy(&ha, dout, err);
    if (!rc) rc = tensor_copy(&hb, dx, err);
    if (rc) return rc;
    apply_mask(key, lora->config.dropout, first, s->host_a, s->host_b, n, true);
    return tensor_copy(dx, &hb, err);
}
