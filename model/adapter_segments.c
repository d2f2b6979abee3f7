/* The segmented adapter (transformer.h): one pass, several adapters, each applied by its
 * own hooks to its own rows. No LoRA maths here: a segment's rows go to its adapter's
 * hooks as views, so a batch of many adapters runs exactly the code a single adapter
 * runs. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

/* Rows [r0, r1) of t (rows along its first dimension), or a NULL-data tensor for NULL. */
static struct tensor row_view(const struct tensor *t, int64_t r0, int64_t r1) {
    if (!t || !t->data) return (struct tensor){0};
    int64_t shape[TENSOR_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    int64_t per_row = t->shape[0] ? tensor_numel(t) / t->shape[0] : 0;
    shape[0] = r1 - r0;
    char *base = (char *)t->data + (size_t)(r0 * per_row) * dtype_size(t->dtype);
    return tensor_make(t->backend, t->dtype, base, t->ndim, shape);
}

/* The part of [lo, hi) that segment rows [b, e) cover, in *from / *to; false if none. */
static bool overlap(int64_t lo, int64_t hi, int64_t b, int64_t e, int64_t *from, int64_t *to) {
    *from = lo > b ? lo : b;
    *to = hi < e ? hi : e;
    return *from < *to;
}

static int seg_forward(void *ctx, int64_t layer, enum model_linear linear, const struct tensor *x,
                       struct tensor *y, struct smelt_error *err) {
    const struct model_segmented_adapter *s = ctx;
    for (int i = 0; i < s->n; i++) {
        const struct model_adapter_segment *g = &s->segs[i];
        int64_t a, b;
        if (!g->adapter || !overlap(0, x->shape[0], g->row_begin, g->row_end, &a, &b)) continue;
        struct tensor xs = row_view(x, a, b), ys = row_view(y, a, b);
        TRY(g->adapter->forward(g->adapter->ctx, layer, linear, &xs, &ys, err));
    }
    return SMELT_OK;
}

static int seg_backward(void *ctx, int64_t layer, enum model_linear linear, const struct tensor *x,
                        const struct tensor *dy, struct tensor *dx, struct smelt_error *err) {
    const struct model_segmented_adapter *s = ctx;
    for (int i = 0; i < s->n; i++) {
        const struct model_adapter_segment *g = &s->segs[i];
        int64_t a, b;
        if (!g->adapter || !overlap(0, x->shape[0], g->row_begin, g->row_end, &a, &b)) continue;
        struct tensor xs = row_view(x, a, b), dys = row_view(dy, a, b), dxs = row_view(dx, a, b);
        TRY(g->adapter->backward(g->adapter->ctx, layer, linear, &xs, &dys, dx ? &dxs : NULL, err));
    }
    return SMELT_OK;
}

/* The head's rows are [row0, row0 + rows(x)) of the pass; a segment's adapter sees its
 * part counted from the segment's first head row. */
static int seg_head_forward(void *ctx, int64_t row0, const struct tensor *x, struct tensor *y,
                            struct smelt_error *err) {
    const struct model_segmented_adapter *s = ctx;
    for (int i = 0; i < s->n; i++) {
        const struct model_adapter_segment *g = &s->segs[i];
        int64_t a, b;
        if (!g->adapter || !g->adapter->head_forward ||
            !overlap(row0, row0 + x->shape[0], g->head_begin, g->head_end, &a, &b))
            continue;
        struct tensor xs = row_view(x, a - row0, b - row0), ys = row_view(y, a - row0, b - row0);
        TRY(g->adapter->head_forward(g->adapter->ctx, a - g->head_begin, &xs, &ys, err));
    }
    return SMELT_OK;
}

static int seg_head_backward(void *ctx, int64_t row0, const struct tensor *x, const struct tensor *dy,
                             struct tensor *dx, struct smelt_error *err) {
    const struct model_segmented_adapter *s = ctx;
    for (int i = 0; i < s->n; i++) {
        const struct model_adapter_segment *g = &s->segs[i];
        int64_t a, b;
        if (!g->adapter || !g->adapter->head_backward ||
            !overlap(row0, row0 + x->shape[0], g->head_begin, g->head_end, &a, &b))
            continue;
        struct tensor xs = row_view(x, a - row0, b - row0), dys = row_view(dy, a - row0, b - row0);
        struct tensor dxs = row_view(dx, a - row0, b - row0);
        TRY(g->adapter->head_backward(g->adapter->ctx, a - g->head_begin, &xs, &dys, dx ? &dxs : NULL, err));
    }
    return SMELT_OK;
}

void model_segments_init(struct model_segmented_adapter *s) {
    memset(s, 0, sizeof *s);
    s->adapter = (struct model_adapter){.ctx = s, .forward = seg_forward, .backward = seg_backward,
                                        .head_forward = seg_head_forward, .head_backward = seg_head_backward};
}

int model_segments_push(struct model_segmented_adapter *s, const struct model_adapter_segment *seg,
                        struct smelt_error *err) {
    if (seg->row_begin < 0 || seg->row_end < seg->row_begin || seg->head_begin < 0 || seg->head_end < seg->head_begin)
        return error_set(err, SMELT_EINVAL, "model_segments_push: rows [%lld, %lld), head rows [%lld, %lld) are not ranges",
                         (long long)seg->row_begin, (long long)seg->row_end, (long long)seg->head_begin,
                         (long long)seg->head_end);
    if (seg->row_begin == seg->row_end && seg->head_begin == seg->head_end) return SMELT_OK;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        struct model_adapter_segment *grown = realloc(s->segs, (size_t)cap * sizeof *grown);
        if (!grown) return error_set(err, SMELT_ENOMEM, "model_segments_push: out of memory");
        s->segs = grown;
        s->cap = cap;
    }
    s->segs[s->n++] = *seg;
    return SMELT_OK;
}

void model_segments_clear(struct model_segmented_adapter *s) { s->n = 0; }

void model_segments_free(struct model_segmented_adapter *s) {
    free(s->segs);
    s->segs = NULL;
    s->n = s->cap = 0;
}
