/* ZeRO stage 3 (trainer_internal.h): the model's parameter provider over comm/. Two work
 * slots, each a gather buffer of the largest unit (and, when the base trains, a unit
 * gradient buffer and a receive buffer for the rank's piece of it). A slot keeps its unit
 * after release, so the head gathered at the end of a forward serves the start of its
 * backward; a new forward drops what is cached (an optimizer step may have changed the
 * shards). The collectives run in issue order on the comm's thread, so a prefetched
 * gather or a reduce-scatter overlaps the model's compute on this one. Every rank makes
 * the same calls, so every rank issues the same collectives in the same order. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

#define ZERO3_SLOTS 2

struct zero3_slot {
    int64_t unit;                 /* gathered (or being gathered) here; -1: none */
    int holds;                    /* acquires not yet released */
    bool grads_bound;             /* g zeroed and bound for the current holds */
    struct comm_request *gather;  /* all_gather into w in flight */
    struct comm_request *reduce;  /* reduce_scatter of g into recv in flight */
    int64_t reduce_unit;
    struct tensor w, g, recv;     /* f32 [max_unit], [max_unit], [max_piece] */
};

struct zero3 {
    struct model *model;          /* borrowed */
    struct comm *comm;            /* borrowed */
    bool base_grads;
    int64_t n_units;
    int64_t *piece_off, *piece_len, *shard_off; /* [n_units]: offset in the unit, length, offset in the shard */
    int64_t shard_numel, max_unit, max_piece;
    struct tensor shard_w, shard_g;             /* f32 [shard_numel]; shard_g only with base_grads */
    struct zero3_slot slots[ZERO3_SLOTS];
    struct model_param_provider provider;
};

static int64_t unit_numel(const struct zero3 *z, int64_t u) {
    int64_t off, n;
    model_unit_range(z->model, u, &off, &n);
    return n;
}

static float *shard_at(const struct tensor *t, int64_t off) { return (float *)t->data + off; }

/* ---- slots ---- */

static struct zero3_slot *find_slot(struct zero3 *z, int64_t u) {
    for (int i = 0; i < ZERO3_SLOTS; i++)
        if (z->slots[i].unit == u) return &z->slots[i];
    return NULL;
}

static int wait_gather(struct zero3_slot *s, struct smelt_error *err) {
    if (!s->gather) return SMELT_OK;
    int rc = comm_wait(s->gather, err);
    s->gather = NULL;
    if (rc) s->unit = -1;
    return rc;
}

/* The slot's reduce-scatter done: its piece added into the gradient shard. */
static int finish_reduce(struct zero3 *z, struct zero3_slot *s, struct smelt_error *err) {
    if (!s->reduce) return SMELT_OK;
    int rc = comm_wait(s->reduce, err);
    s->reduce = NULL;
    if (rc) return rc;
    int64_t u = s->reduce_unit, n = z->piece_len[u];
    float *dst = shard_at(&z->shard_g, z->shard_off[u]);
    const float *src = s->recv.data;
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
    return SMELT_OK;
}

static int issue_gather(struct zero3 *z, struct zero3_slot *s, int64_t u, struct smelt_error *err) {
    s->unit = u;
    int rc = comm_all_gather(z->comm, shard_at(&z->shard_w, z->shard_off[u]), s->w.data,
                             (size_t)unit_numel(z, u), COMM_F32, &s->gather, err);
    if (rc) s->unit = -1;
    return rc;
}

/* A slot no unit holds, preferring one with no prefetch in flight. */
static int take_slot(struct zero3 *z, int64_t u, struct zero3_slot **out, struct smelt_error *err) {
    struct zero3_slot *pick = NULL;
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        struct zero3_slot *s = &z->slots[i];
        if (s->holds == 0 && (!pick || (pick->gather && !s->gather))) pick = s;
    }
    if (!pick)
        return error_set(err, SMELT_EINVAL, "zero3: unit %lld asked for while %d units are held",
                         (long long)u, ZERO3_SLOTS);
    TRY(wait_gather(pick, err));
    *out = pick;
    return SMELT_OK;
}

/* Starts gathering u into a free slot when one is idle; never waits. */
static int prefetch(struct zero3 *z, int64_t u, struct smelt_error *err) {
    if (u < 0 || u >= z->n_units || find_slot(z, u)) return SMELT_OK;
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        struct zero3_slot *s = &z->slots[i];
        if (s->holds == 0 && !s->gather) return issue_gather(z, s, u, err);
    }
    return SMELT_OK;
}

/* The unit a pass wants after u: forward runs 0, 1, ..., head; backward head, last
 * layer, ..., 0 (the embedding only when the base trains). */
static int64_t next_unit(const struct zero3 *z, int64_t u, bool backward) {
    int64_t head = model_unit_head(z->model);
    if (!backward) return u < head ? u + 1 : -1;
    if (u == MODEL_UNIT_EMBED) return -1;
    int64_t next = u - 1;
    return next == MODEL_UNIT_EMBED && !z->base_grads ? -1 : next;
}

/* ---- the provider ---- */

static int p_begin(void *ctx, struct model *m, bool backward, struct smelt_error *err) {
    struct zero3 *z = ctx;
    (void)m;
    if (backward) return prefetch(z, model_unit_head(z->model), err);
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        struct zero3_slot *s = &z->slots[i];
        if (s->holds > 0) continue;
        TRY(wait_gather(s, err));
        s->unit = -1;
    }
    return prefetch(z, MODEL_UNIT_EMBED, err);
}

static int bind_grads(struct zero3 *z, struct zero3_slot *s, int64_t u, struct smelt_error *err) {
    TRY(finish_reduce(z, s, err));
    memset(s->g.data, 0, (size_t)unit_numel(z, u) * sizeof(float));
    s->grads_bound = true;
    return SMELT_OK;
}

static int p_acquire(void *ctx, struct model *m, int64_t u, bool for_backward, struct smelt_error *err) {
    struct zero3 *z = ctx;
    if (u < 0 || u >= z->n_units)
        return error_set(err, SMELT_EINVAL, "zero3: unit %lld outside [0, %lld)", (long long)u,
                         (long long)z->n_units);
    struct zero3_slot *s = find_slot(z, u);
    if (!s) {
        TRY(take_slot(z, u, &s, err));
        TRY(issue_gather(z, s, u, err));
    }
    TRY(wait_gather(s, err));
    if (for_backward && z->base_grads && !s->grads_bound) TRY(bind_grads(z, s, u, err));
    s->holds++;
    model_unit_bind(m, u, s->w.data, s->grads_bound ? s->g.data : NULL);
    return prefetch(z, next_unit(z, u, for_backward), err);
}

static struct zero3_slot *held_slot(struct zero3 *z, int64_t u, const char *what, struct smelt_error *err) {
    struct zero3_slot *s = u >= 0 && u < z->n_units ? find_slot(z, u) : NULL;
    if (!s || s->holds == 0) {
        error_set(err, SMELT_EINVAL, "zero3: %s of unit %lld, which is not held", what, (long long)u);
        return NULL;
    }
    return s;
}

static int p_release(void *ctx, struct model *m, int64_t u, struct smelt_error *err) {
    struct zero3 *z = ctx;
    struct zero3_slot *s = held_slot(z, u, "release", err);
    if (!s) return SMELT_EINVAL;
    if (--s->holds > 0) return SMELT_OK;
    s->grads_bound = false;
    model_unit_bind(m, u, NULL, NULL);
    return SMELT_OK;
}

static int p_grads_ready(void *ctx, struct model *m, int64_t u, struct smelt_error *err) {
    struct zero3 *z = ctx;
    (void)m;
    struct zero3_slot *s = held_slot(z, u, "gradients", err);
    if (!s) return SMELT_EINVAL;
    if (!s->grads_bound)
        return error_set(err, SMELT_EINVAL, "zero3: gradients of unit %lld, acquired without them", (long long)u);
    TRY(finish_reduce(z, s, err));
    s->reduce_unit = u;
    return comm_reduce_scatter(z->comm, s->g.data, s->recv.data, (size_t)unit_numel(z, u), COMM_F32,
                               COMM_SUM, &s->reduce, err);
}

/* ---- building ---- */

static int layout(struct zero3 *z, struct smelt_error *err) {
    size_t n = (size_t)z->n_units;
    z->piece_off = calloc(n, sizeof *z->piece_off);
    z->piece_len = calloc(n, sizeof *z->piece_len);
    z->shard_off = calloc(n, sizeof *z->shard_off);
    if (!z->piece_off || !z->piece_len || !z->shard_off) return error_set(err, SMELT_ENOMEM, "zero3: out of memory");
    for (int64_t u = 0; u < z->n_units; u++) {
        size_t off, len, numel = (size_t)unit_numel(z, u);
        comm_shard(numel, comm_size(z->comm), comm_rank(z->comm), &off, &len);
        z->piece_off[u] = (int64_t)off;
        z->piece_len[u] = (int64_t)len;
        z->shard_off[u] = z->shard_numel;
        z->shard_numel += (int64_t)len;
        if ((int64_t)numel > z->max_unit) z->max_unit = (int64_t)numel;
        if ((int64_t)len > z->max_piece) z->max_piece = (int64_t)len;
    }
    return SMELT_OK;
}

static int host_buf(struct tensor *t, int64_t n, struct smelt_error *err) {
    int64_t shape[1] = {n > 0 ? n : 1};
    return tensor_alloc(t, BACKEND_CPU, DTYPE_F32, 1, shape, err);
}

static int alloc_buffers(struct zero3 *z, struct smelt_error *err) {
    TRY(host_buf(&z->shard_w, z->shard_numel, err));
    if (z->base_grads) TRY(host_buf(&z->shard_g, z->shard_numel, err));
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        struct zero3_slot *s = &z->slots[i];
        s->unit = -1;
        TRY(host_buf(&s->w, z->max_unit, err));
        if (!z->base_grads) continue;
        TRY(host_buf(&s->g, z->max_unit, err));
        TRY(host_buf(&s->recv, z->max_piece, err));
    }
    return SMELT_OK;
}

/* This rank's pieces of the model's weights into the shard; then the whole buffers go. */
static void take_weights(struct zero3 *z) {
    struct model *m = z->model;
    const float *flat = m->weights.data;
    for (int64_t u = 0; u < z->n_units; u++) {
        int64_t off, n;
        model_unit_range(m, u, &off, &n);
        memcpy(shard_at(&z->shard_w, z->shard_off[u]), flat + off + z->piece_off[u],
               (size_t)z->piece_len[u] * sizeof(float));
    }
    tensor_free(&m->weights);
    tensor_free(&m->grads);
    for (int64_t u = 0; u < z->n_units; u++) model_unit_bind(m, u, NULL, NULL);
}

static int check_model(const struct model *m, struct smelt_error *err) {
    if (m->backend != BACKEND_CPU)
        return error_set(err, SMELT_EUNSUPPORTED, "zero3: the model is on %s; stage 3 gathers host "
                         "buffers over Gloo (CPU models only until the NCCL backend)", backend_name(m->backend));
    if (!m->weights.data) return error_set(err, SMELT_EINVAL, "zero3: the model has no whole weights buffer to shard");
    if (m->provider) return error_set(err, SMELT_EINVAL, "zero3: the model already has a parameter provider");
    return SMELT_OK;
}

int zero3_create(struct model *m, struct comm *comm, bool base_grads, struct zero3 **out,
                 struct smelt_error *err) {
    TRY(check_model(m, err));
    struct zero3 *z = calloc(1, sizeof *z);
    if (!z) return error_set(err, SMELT_ENOMEM, "zero3: out of memory");
    *z = (struct zero3){.model = m, .comm = comm, .base_grads = base_grads, .n_units = model_unit_count(m)};
    z->provider = (struct model_param_provider){.ctx = z, .base_grads = base_grads, .begin = p_begin,
                                                .acquire = p_acquire, .release = p_release,
                                                .grads_ready = p_grads_ready};
    int rc = layout(z, err);
    if (!rc) rc = alloc_buffers(z, err);
    if (rc) {
        zero3_free(z);
        return error_wrap(err, rc, "zero3: shards of %lld parameters", (long long)m->n_weights);
    }
    take_weights(z);
    model_set_param_provider(m, &z->provider, err);
    *out = z;
    return SMELT_OK;
}

/* ---- the trainer's side ---- */

int zero3_sync(struct zero3 *z, struct smelt_error *err) {
    int first = SMELT_OK;
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        struct smelt_error e = {0}, e2 = {0};
        int rc = finish_reduce(z, &z->slots[i], &e);
        int rc2 = wait_gather(&z->slots[i], rc ? &e2 : &e);
        if (!rc) rc = rc2;
        if (rc && !first) {
            first = rc;
            if (err) *err = e;
        }
    }
    return first;
}

struct tensor *zero3_params(struct zero3 *z) { return &z->shard_w; }
struct tensor *zero3_grads(struct zero3 *z) { return &z->shard_g; }

void zero3_piece(const struct zero3 *z, int64_t unit, int64_t *flat_offset, int64_t *numel,
                 int64_t *shard_offset) {
    SMELT_ASSERT(unit >= 0 && unit < z->n_units);
    int64_t off, n;
    model_unit_range(z->model, unit, &off, &n);
    *flat_offset = off + z->piece_off[unit];
    *numel = z->piece_len[unit];
    *shard_offset = z->shard_off[unit];
}

int zero3_gather_unit(struct zero3 *z, int64_t unit, float *dst, struct smelt_error *err) {
    if (unit < 0 || unit >= z->n_units)
        return error_set(err, SMELT_EINVAL, "zero3_gather_unit: unit %lld outside [0, %lld)", (long long)unit,
                         (long long)z->n_units);
    return comm_all_gather(z->comm, shard_at(&z->shard_w, z->shard_off[unit]), dst,
                           (size_t)unit_numel(z, unit), COMM_F32, NULL, err);
}

int zero3_gather(struct zero3 *z, float *flat, struct smelt_error *err) {
    for (int64_t u = 0; u < z->n_units; u++) {
        int64_t off, n;
        model_unit_range(z->model, u, &off, &n);
        TRY(zero3_gather_unit(z, u, flat + off, err));
    }
    return SMELT_OK;
}

/* No unit held, nothing in flight, nothing cached: the slots are free to reuse. */
static int quiesce(struct zero3 *z, const char *what, struct smelt_error *err) {
    for (int i = 0; i < ZERO3_SLOTS; i++)
        if (z->slots[i].holds > 0)
            return error_set(err, SMELT_EINVAL, "%s: unit %lld is still held", what, (long long)z->slots[i].unit);
    TRY(zero3_sync(z, err));
    for (int i = 0; i < ZERO3_SLOTS; i++) z->slots[i].unit = -1;
    return SMELT_OK;
}

int zero3_unshard(struct zero3 *z, bool keep, struct smelt_error *err) {
    TRY(quiesce(z, "zero3_unshard", err));
    if (!keep) {
        /* The units pass through a work buffer: this rank only serves the gathers. */
        for (int64_t u = 0; u < z->n_units; u++) TRY(zero3_gather_unit(z, u, z->slots[0].w.data, err));
        return SMELT_OK;
    }
    struct model *m = z->model;
    struct tensor whole = {0};
    TRY(host_buf(&whole, m->n_weights, err));
    int rc = zero3_gather(z, whole.data, err);
    if (rc) {
        tensor_free(&whole);
        return rc;
    }
    m->weights = whole;
    model_set_param_provider(m, NULL, err);
    for (int64_t u = 0; u < z->n_units; u++) {
        int64_t off, n;
        model_unit_range(m, u, &off, &n);
        model_unit_bind(m, u, (float *)m->weights.data + off, NULL);
    }
    return SMELT_OK;
}

int zero3_restore(struct zero3 *z, struct smelt_error *err) { return zero3_unshard(z, true, err); }

int zero3_reshard(struct zero3 *z, struct smelt_error *err) {
    struct model *m = z->model;
    if (m->provider == &z->provider) return SMELT_OK; /* not unsharded here (keep false) */
    tensor_free(&m->weights);
    for (int64_t u = 0; u < z->n_units; u++) model_unit_bind(m, u, NULL, NULL);
    return model_set_param_provider(m, &z->provider, err);
}

int zero3_set_params(struct zero3 *z, const float *flat, struct smelt_error *err) {
    TRY(quiesce(z, "zero3_set_params", err));
    for (int64_t u = 0; u < z->n_units; u++) {
        int64_t off, n, at;
        zero3_piece(z, u, &off, &n, &at);
        memcpy(shard_at(&z->shard_w, at), flat + off, (size_t)n * sizeof *flat);
    }
    return SMELT_OK;
}

void zero3_bytes(const struct zero3 *z, struct zero3_bytes *out) {
    int64_t f = (int64_t)sizeof(float);
    *out = (struct zero3_bytes){.shard_params = z->shard_numel * f,
                                .work_params = ZERO3_SLOTS * z->max_unit * f};
    if (!z->base_grads) return;
    out->shard_grads = z->shard_numel * f;
    out->work_grads = ZERO3_SLOTS * (z->max_unit + z->max_piece) * f;
}

void zero3_free(struct zero3 *z) {
    if (!z) return;
    struct smelt_error ignored = {0};
    zero3_sync(z, &ignored); /* every request waited for, as comm_destroy requires */
    struct model *m = z->model;
    if (m->provider == &z->provider) {
        model_set_param_provider(m, NULL, &ignored);
        /* No view may point into the slots freed below. */
        for (int64_t u = 0; u < z->n_units && !m->weights.data; u++) model_unit_bind(m, u, NULL, NULL);
    }
    for (int i = 0; i < ZERO3_SLOTS; i++) {
        tensor_free(&z->slots[i].w);
        tensor_free(&z->slots[i].g);
        tensor_free(&z->slots[i].recv);
    }
    tensor_free(&z->shard_w);
    tensor_free(&z->shard_g);
    free(z->piece_off);
    free(z->piece_len);
    free(z->shard_off);
    free(z);
}
