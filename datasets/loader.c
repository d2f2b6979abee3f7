/* Batches for the trainer: every epoch a seeded permutation of the dataset's units (an
 * example; a chosen/rejected pair for preference data; a prompt for RL), cut into batches of batch_size
 * units or packed greedily up to max_tokens, each batch laid out as one packed row.
 *
 * The loader stands at the start of the next batch: (epoch, index into that epoch's
 * permutation). Where a batch ends depends only on where it starts, so a cursor saved
 * from dataset_loader_cursor and given to dataset_loader_seek continues exactly. */
#include "datasets/datasets_internal.h"

#include "common/rng.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct dataset_loader {
    const struct dataset *ds;        /* borrowed */
    struct dataset_loader_config config;
    int seqs_per_unit;               /* 1, or 2 for preference pairs */
    int64_t n_units;
    int64_t *unit_tokens;            /* [n_units] */
    int64_t *order;                  /* [n_units] the permutation of order_epoch */
    int64_t order_epoch;             /* -1: none yet */
    struct dataset_cursor at;        /* where the next batch starts */
    struct dataset_batch batch;
    int32_t *ids, *cu_seqlens, *targets; /* the batch's arrays */
    int64_t *rows;
    int64_t cap_tokens, cap_seqs;
};

static uint64_t mix64(uint64_t z) { return rng_mix64(z + RNG_GOLDEN); }

static void fill_order(const struct dataset_loader *l, int64_t epoch, int64_t *order) {
    if (l->config.shuffle) {
        shuffle_indices(order, l->n_units, mix64(l->config.seed ^ mix64((uint64_t)epoch)));
    } else {
        for (int64_t i = 0; i < l->n_units; i++) order[i] = i;
    }
}

static void ensure_order(struct dataset_loader *l) {
    if (l->order_epoch == l->at.epoch) return;
    fill_order(l, l->at.epoch, l->order);
    l->order_epoch = l->at.epoch;
}

/* One past the last unit of the batch that starts at start. */
static int64_t batch_end(const struct dataset_loader *l, const int64_t *order, int64_t start) {
    if (l->config.max_tokens <= 0) {
        int64_t end = start + l->config.batch_size;
        return end < l->n_units ? end : l->n_units;
    }
    int64_t tokens = 0, i = start;
    while (i < l->n_units && tokens + l->unit_tokens[order[i]] <= l->config.max_tokens)
        tokens += l->unit_tokens[order[i++]];
    return i; /* > start: no unit is longer than max_tokens */
}

/* drop_last: an epoch's last batch goes when it is short of batch_size, or, packing,
 * when it is less than half full — unless it is the epoch's only batch. */
static bool batch_kept(const struct dataset_loader *l, const int64_t *order, int64_t start,
                       int64_t end) {
    if (!l->config.drop_last || end < l->n_units) return true;
    if (l->config.max_tokens <= 0) return end - start == l->config.batch_size;
    if (start == 0) return true;
    int64_t tokens = 0;
    for (int64_t i = start; i < end; i++) tokens += l->unit_tokens[order[i]];
    return 2 * tokens >= l->config.max_tokens;
}

/* Moves the cursor off an epoch's end (or a dropped last batch) to the next epoch. */
static void normalize(struct dataset_loader *l) {
    for (;;) {
        ensure_order(l);
        if (l->at.index < l->n_units &&
            batch_kept(l, l->order, l->at.index, batch_end(l, l->order, l->at.index)))
            return;
        l->at.epoch++;
        l->at.index = 0;
    }
}

static int check_config(const struct dataset *ds, const struct dataset_loader_config *c,
                        struct smelt_error *err) {
    if (!ds || !c) return error_set(err, SMELT_EINVAL, "dataset loader: a dataset and a config are required");
    if (ds->kind != DATASET_SFT && ds->kind != DATASET_PREFERENCE && ds->kind != DATASET_PROMPTS)
        return error_set(err, SMELT_EINVAL, "dataset loader: %s is a %s dataset; batches are for sft, "
                         "preference and prompts data", ds->path, dataset_kind_name(ds->kind));
    if (ds->n < 1) return error_set(err, SMELT_EINVAL, "dataset loader: %s has no rows", ds->path);
    if (c->max_tokens < 0 || c->max_tokens > INT32_MAX)
        return error_set(err, SMELT_EINVAL, "dataset loader: max_tokens %lld is outside [0, %d]",
                         (long long)c->max_tokens, INT32_MAX);
    if (c->max_tokens == 0 && (c->batch_size < 1 || c->batch_size > INT_MAX / 2))
        return error_set(err, SMELT_EINVAL, "dataset loader: batch_size %d is outside [1, %d]",
                         c->batch_size, INT_MAX / 2);
    if (c->max_tokens == 0 && c->drop_last && ds->n < c->batch_size)
        return error_set(err, SMELT_EINVAL, "dataset loader: drop_last with %lld rows and batch_size %d "
                         "leaves no batch", (long long)ds->n, c->batch_size);
    return SMELT_OK;
}

/* Every unit's tokens; packing refuses a unit that no batch can hold. */
static int count_unit_tokens(struct dataset_loader *l, struct smelt_error *err) {
    for (int64_t u = 0; u < l->n_units; u++) {
        int64_t tokens = 0;
        if (l->ds->kind == DATASET_PROMPTS) tokens = l->ds->prompts[u].n;
        for (int k = 0; l->ds->kind != DATASET_PROMPTS && k < l->seqs_per_unit; k++)
            tokens += l->ds->examples[u * l->seqs_per_unit + k].n;
        l->unit_tokens[u] = tokens;
        if (l->config.max_tokens > 0 && tokens > l->config.max_tokens)
            return error_set(err, SMELT_EINVAL, "dataset loader: %s:%lld: %s of %lld tokens is longer "
                             "than max_tokens %lld", l->ds->path,
                             (long long)(l->ds->kind == DATASET_PROMPTS ? l->ds->prompts[u].line
                                                                        : l->ds->examples[u * l->seqs_per_unit].line),
                             l->ds->kind == DATASET_PROMPTS ? "a prompt"
                             : l->seqs_per_unit == 2        ? "a chosen/rejected pair"
                                                            : "an example",
                             (long long)tokens, (long long)l->config.max_tokens);
    }
    return SMELT_OK;
}

int dataset_loader_create(const struct dataset *ds, const struct dataset_loader_config *config,
                          struct dataset_loader **out, struct smelt_error *err) {
    if (!out) return error_set(err, SMELT_EINVAL, "dataset loader: out is required");
    *out = NULL;
    int rc = check_config(ds, config, err);
    if (rc) return rc;
    struct dataset_loader *l = calloc(1, sizeof *l);
    if (!l) return error_set(err, SMELT_ENOMEM, "dataset loader");
    l->ds = ds;
    l->config = *config;
    l->seqs_per_unit = ds->kind == DATASET_PREFERENCE ? 2 : 1;
    l->n_units = ds->n;
    l->unit_tokens = malloc((size_t)l->n_units * sizeof *l->unit_tokens);
    l->order = malloc((size_t)l->n_units * sizeof *l->order);
    l->order_epoch = -1;
    if (!l->unit_tokens || !l->order)
        rc = error_set(err, SMELT_ENOMEM, "dataset loader: %lld rows", (long long)l->n_units);
    if (!rc) rc = count_unit_tokens(l, err);
    if (rc) {
        dataset_loader_free(l);
        return rc;
    }
    normalize(l);
    *out = l;
    return SMELT_OK;
}

void dataset_loader_free(struct dataset_loader *l) {
    if (!l) return;
    free(l->unit_tokens);
    free(l->order);
    free(l->ids);
    free(l->cu_seqlens);
    free(l->targets);
    free(l->rows);
    free(l);
}

static int reserve(struct dataset_loader *l, int64_t tokens, int64_t seqs, struct smelt_error *err) {
    if (tokens > l->cap_tokens) {
        int32_t *ids = realloc(l->ids, (size_t)tokens * sizeof *ids);
        if (ids) l->ids = ids;
        int32_t *targets = realloc(l->targets, (size_t)tokens * sizeof *targets);
        if (targets) l->targets = targets;
        if (!ids || !targets) return error_set(err, SMELT_ENOMEM, "dataset loader: a batch of %lld tokens",
                                               (long long)tokens);
        l->cap_tokens = tokens;
    }
    if (seqs > l->cap_seqs) {
        int32_t *cu = realloc(l->cu_seqlens, (size_t)(seqs + 1) * sizeof *cu);
        if (cu) l->cu_seqlens = cu;
        int64_t *rows = realloc(l->rows, (size_t)seqs * sizeof *rows);
        if (rows) l->rows = rows;
        if (!cu || !rows) return error_set(err, SMELT_ENOMEM, "dataset loader: a batch of %lld sequences",
                                           (long long)seqs);
        l->cap_seqs = seqs;
    }
    return SMELT_OK;
}

/* Appends one sequence; a target is the next token when that token is trained. */
static int64_t append_sequence(struct dataset_loader *l, const struct dataset_example *ex, int64_t t) {
    memcpy(l->ids + t, ex->ids, (size_t)ex->n * sizeof *ex->ids);
    int64_t n_targets = 0;
    for (int32_t j = 0; j < ex->n; j++) {
        bool trained = j + 1 < ex->n && ex->mask[j + 1];
        l->targets[t + j] = trained ? ex->ids[j + 1] : -1;
        n_targets += trained;
    }
    return n_targets;
}

static int build_batch(struct dataset_loader *l, int64_t start, int64_t end, struct smelt_error *err) {
    int64_t tokens = 0, seqs = (end - start) * l->seqs_per_unit;
    for (int64_t i = start; i < end; i++) tokens += l->unit_tokens[l->order[i]];
    if (tokens > INT32_MAX)
        return error_set(err, SMELT_EINVAL, "dataset loader: a batch of %lld tokens is more than "
                         "cu_seqlens can index; lower batch_size", (long long)tokens);
    int rc = reserve(l, tokens, seqs, err);
    if (rc) return rc;
    struct dataset_batch *b = &l->batch;
    int64_t t = 0, s = 0;
    b->n_targets = 0;
    for (int64_t i = start; i < end; i++) {
        for (int k = 0; k < l->seqs_per_unit; k++, s++) {
            int64_t e = l->order[i] * l->seqs_per_unit + k;
            l->cu_seqlens[s] = (int32_t)t;
            l->rows[s] = e;
            if (l->ds->kind == DATASET_PROMPTS) { /* a prompt trains nothing by itself */
                const struct dataset_prompt *p = &l->ds->prompts[e];
                memcpy(l->ids + t, p->ids, (size_t)p->n * sizeof *p->ids);
                for (int32_t j = 0; j < p->n; j++) l->targets[t + j] = -1;
                t += p->n;
                continue;
            }
            const struct dataset_example *ex = &l->ds->examples[e];
            b->n_targets += append_sequence(l, ex, t);
            t += ex->n;
        }
    }
    l->cu_seqlens[s] = (int32_t)t;
    b->n_tokens = tokens;
    b->n_seqs = (int)seqs;
    b->ids = l->ids;
    b->cu_seqlens = l->cu_seqlens;
    b->targets = l->targets;
    b->rows = l->rows;
    return SMELT_OK;
}

int dataset_loader_next(struct dataset_loader *l, const struct dataset_batch **batch,
                        struct smelt_error *err) {
    if (!l || !batch) return error_set(err, SMELT_EINVAL, "dataset_loader_next: loader and batch are required");
    int64_t start = l->at.index, end = batch_end(l, l->order, start);
    int rc = build_batch(l, start, end, err);
    if (rc) return rc;
    l->at.index = end;
    normalize(l);
    *batch = &l->batch;
    return SMELT_OK;
}

int64_t dataset_loader_batches_in_epoch(const struct dataset_loader *l, int64_t epoch) {
    if (!l || epoch < 0) return 0;
    int64_t n = l->n_units;
    if (l->config.max_tokens <= 0) {
        int64_t bs = l->config.batch_size;
        return l->config.drop_last ? n / bs : (n + bs - 1) / bs;
    }
    int64_t *order = l->order, *own = NULL;
    if (epoch != l->order_epoch) {
        order = own = malloc((size_t)n * sizeof *own);
        if (!own) return -1;
        fill_order(l, epoch, own);
    }
    int64_t count = 0;
    for (int64_t start = 0; start < n;) {
        int64_t end = batch_end(l, order, start);
        count += batch_kept(l, order, start, end);
        start = end;
    }
    free(own);
    return count;
}

struct dataset_cursor dataset_loader_cursor(const struct dataset_loader *l) { return l->at; }

int dataset_loader_seek(struct dataset_loader *l, const struct dataset_cursor *cursor,
                        struct smelt_error *err) {
    if (!l || !cursor) return error_set(err, SMELT_EINVAL, "dataset_loader_seek: loader and cursor are required");
    if (cursor->epoch < 0 || cursor->index < 0 || cursor->index > l->n_units)
        return error_set(err, SMELT_EINVAL, "dataset_loader_seek: cursor (epoch %lld, index %lld) is "
                         "outside the dataset's %lld units", (long long)cursor->epoch,
                         (long long)cursor->index, (long long)l->n_units);
    l->at = *cursor;
    normalize(l);
    return SMELT_OK;
}
