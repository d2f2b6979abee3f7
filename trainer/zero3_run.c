/* ZeRO stage 3 in the run (docs/distributed.md): the provider made at setup, the full
 * fine-tune's optimizer over the rank's pieces, the padding passes that keep every rank's
 * unit gathers in step, the start line's sizes and world.json's piece table. zero3.c is
 * the provider itself; checkpoint.c and run.c call the unshard / reshard pair around
 * what needs the whole weights. */
#include "trainer/trainer_internal.h"

#include <jansson.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "common/common.h"

/* A full fine-tune's optimizer: moments for the shard, each piece's flat place recorded
 * (checkpoints reshard through them). */
static int init_pieces(struct trainer_run *r, struct smelt_error *err) {
    int64_t n = model_unit_count(r->model);
    int64_t *off = malloc((size_t)n * sizeof *off), *len = malloc((size_t)n * sizeof *len);
    int rc = off && len ? SMELT_OK : error_set(err, SMELT_ENOMEM, "zero3: out of memory");
    for (int64_t u = 0; u < n && !rc; u++) {
        int64_t at;
        zero3_piece(r->zero3, u, &off[u], &len[u], &at);
    }
    if (!rc) rc = optimizer_init_pieces(&r->opt, r->params, r->model->n_weights, n, off, len, err);
    free(off);
    free(len);
    return rc;
}

int zero3_run_setup(struct trainer_run *r, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    if (job_type_is_rl(s->type))
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.zero_stage",
                               "hyperparameters.zero_stage: stage 3 on %d ranks runs sft, dpo and reward_model "
                               "jobs; a %s job takes stage 0, 1 or 2", r->dist.ranks, job_type_name(s->type));
    bool full = r->lora == NULL;
    TRY(error_wrap(err, zero3_create(r->model, r->dist.comm, full, &r->zero3, err), "hyperparameters.zero_stage"));
    if (!full) return dist_optimizer_init(&r->dist, r->params, &r->opt, err);
    r->params = zero3_params(r->zero3);
    r->grads = zero3_grads(r->zero3);
    return init_pieces(r, err);
}

int zero3_run_optimizer_step(struct trainer_run *r, const struct adamw_step *s, double *norm,
                             struct smelt_error *err) {
    TRY(zero3_sync(r->zero3, err));
    /* Every rank's shard holds every rank's reduced gradients for its pieces: the
     * global norm is the shards' sums of squares, summed byte-exactly (the same
     * coefficient everywhere). The shard is the truth: nothing is gathered after. */
    double ss;
    TRY(ops_sum_squares(&ss, r->grads, err));
    TRY(dist_sum(&r->dist, &ss, 1, err));
    return optimizer_apply(&r->opt, r->params, r->grads, ss, s, norm, err);
}

int zero3_run_pad(struct trainer_run *r, int64_t n_micro, int64_t done, const struct dataset_batch *b,
                  run_batch_fn fn, void *ctx, struct smelt_error *err) {
    if (!r->zero3) return SMELT_OK;
    int64_t passes = (n_micro + r->dist.ranks - 1) / r->dist.ranks; /* rank 0's: dist_mine */
    if (done < passes && !b) return error_set(err, SMELT_EINVAL, "zero3: a padding pass without a batch");
    int rc = SMELT_OK;
    r->pad_pass = true;
    for (int64_t k = done; k < passes && !rc; k++) rc = fn(r, b, ctx, err);
    r->pad_pass = false;
    return rc ? error_wrap(err, rc, "stage 3 padding pass") : SMELT_OK;
}

void zero3_run_sizes(const struct trainer_run *r, struct dist_sizes *out) {
    struct zero3_bytes zb;
    zero3_bytes(r->zero3, &zb);
    if (r->lora) {
        /* The adapter (whole) and the frozen base's shard with its gather buffers. */
        out->param_bytes = (int64_t)tensor_nbytes(r->params) + zb.shard_params + zb.work_params;
        return;
    }
    out->param_bytes = zb.shard_params + zb.work_params;
    out->grad_bytes = zb.shard_grads + zb.work_grads;
}

json_t *zero3_run_bytes_json(const struct trainer_run *r) {
    struct zero3_bytes zb;
    zero3_bytes(r->zero3, &zb);
    return json_pack("{s:I, s:I, s:I, s:I}", "shard_param_bytes", (json_int_t)zb.shard_params, "work_param_bytes",
                     (json_int_t)zb.work_params, "shard_grad_bytes", (json_int_t)zb.shard_grads, "work_grad_bytes",
                     (json_int_t)zb.work_grads);
}

json_t *zero3_run_pieces(const struct trainer_run *r, int k, int64_t *len) {
    json_t *pieces = json_array();
    *len = 0;
    for (int64_t u = 0; pieces && u < model_unit_count(r->model); u++) {
        int64_t off, n;
        size_t poff, plen;
        model_unit_range(r->model, u, &off, &n);
        comm_shard((size_t)n, r->dist.ranks, k, &poff, &plen); /* zero3.c's layout */
        json_array_append_new(pieces, json_pack("[I, I]", (json_int_t)(off + (int64_t)poff), (json_int_t)plen));
        *len += (int64_t)plen;
    }
    return pieces;
}
