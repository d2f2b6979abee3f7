/* Holding out a seeded share of a dataset's rows for validation. */
#include "datasets/datasets_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Marks n_val of n rows, chosen by a seeded Fisher–Yates shuffle. */
static int choose_rows(int64_t n, int64_t n_val, uint64_t seed, bool *chosen,
                       struct smelt_error *err) {
    int64_t *order = malloc((size_t)n * sizeof *order);
    if (!order) return error_set(err, SMELT_ENOMEM, "dataset_split: %lld rows", (long long)n);
    shuffle_indices(order, n, seed);
    for (int64_t i = 0; i < n_val; i++) chosen[order[i]] = true;
    free(order);
    return SMELT_OK;
}

/* The counts a report gives for the rows a dataset now holds. */
static void recount(struct dataset *ds) {
    struct dataset_report *r = &ds->report;
    r->n_examples = ds->n;
    r->n_tokens = r->n_trained_tokens = 0;
    int64_t n_seqs = ds->kind == DATASET_PREFERENCE ? 2 * ds->n : ds->n;
    for (int64_t i = 0; ds->examples && i < n_seqs; i++) {
        r->n_tokens += ds->examples[i].n;
        r->n_trained_tokens += example_trained_tokens(&ds->examples[i]);
    }
    for (int64_t i = 0; ds->prompts && i < ds->n; i++) r->n_tokens += ds->prompts[i].n;
}

/* Moves the chosen rows (in file order) from ds to val, compacting ds. */
static void move_rows(struct dataset *ds, const bool *chosen, struct dataset *val) {
    int seqs = ds->kind == DATASET_PREFERENCE ? 2 : 1;
    int64_t kept = 0;
    for (int64_t i = 0; i < ds->n; i++) {
        if (ds->prompts) {
            struct dataset_prompt p = ds->prompts[i];
            if (chosen[i]) val->prompts[val->n] = p;
            else ds->prompts[kept] = p;
        } else {
            struct dataset_example *src = &ds->examples[i * seqs];
            struct dataset_example *dst = chosen[i] ? &val->examples[val->n * seqs]
                                                    : &ds->examples[kept * seqs];
            memmove(dst, src, (size_t)seqs * sizeof *src);
        }
        if (chosen[i]) val->n++;
        else kept++;
    }
    ds->n = kept;
}

int dataset_split(struct dataset *ds, double fraction, uint64_t seed, struct dataset **val,
                  struct smelt_error *err) {
    if (!ds || !val) return error_set(err, SMELT_EINVAL, "dataset_split: ds and val are required");
    *val = NULL;
    if (!(fraction > 0.0 && fraction < 1.0))
        return error_set(err, SMELT_EINVAL, "dataset_split: fraction %g is outside (0, 1)", fraction);
    if (ds->n < 2)
        return error_set(err, SMELT_EINVAL, "dataset_split: %s has %lld rows; a split needs at least 2",
                         ds->path, (long long)ds->n);
    int64_t n_val = (int64_t)llround(fraction * (double)ds->n);
    if (n_val < 1) n_val = 1;
    if (n_val > ds->n - 1) n_val = ds->n - 1;
    int seqs = ds->kind == DATASET_PREFERENCE ? 2 : 1;
    struct dataset *v = calloc(1, sizeof *v);
    bool *chosen = calloc((size_t)ds->n, sizeof *chosen);
    if (v && ds->prompts) v->prompts = malloc((size_t)n_val * sizeof *v->prompts);
    else if (v) v->examples = malloc((size_t)(n_val * seqs) * sizeof *v->examples);
    int rc = !v || !chosen || (!v->prompts && !v->examples)
                 ? error_set(err, SMELT_ENOMEM, "dataset_split: %lld rows", (long long)n_val)
                 : choose_rows(ds->n, n_val, seed, chosen, err);
    if (rc) {
        free(chosen);
        dataset_free(v);
        return rc;
    }
    v->kind = ds->kind;
    snprintf(v->path, sizeof v->path, "%s", ds->path);
    v->report.kind = ds->kind;
    move_rows(ds, chosen, v);
    free(chosen);
    recount(ds);
    recount(v);
    *val = v;
    return SMELT_OK;
}
