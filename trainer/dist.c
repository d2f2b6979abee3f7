/* Data-parallel ranks of one job (docs/distributed.md): the communicator, which
 * micro-batches are this rank's, byte-exact sums of the metrics, and the optimizer step
 * at ZeRO stage 0 (gradients all-reduced, every rank updates everything), 1 (gradients
 * all-reduced, each rank updates its shard with shard-sized moments, parameters
 * all-gathered) and 2 (gradients reduce-scattered into the shard, then as stage 1).
 *
 * Every rank walks the same data in the same order and holds the same parameters bit
 * for bit after every step (an all-reduce gives every rank the same sums, an all-gather
 * the same shards), so what differs from one process is only the order in which the
 * micro-batches' gradients and metric sums are added: the losses equal the one-rank
 * run's to rounding. */
#include "trainer/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"

int dist_check(const struct job_spec *s, const struct trainer_options *o, struct smelt_error *err) {
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (o->rank < 0 || o->rank >= ranks)
        return error_set_field(err, SMELT_EINVAL, "rank", "rank: %d is not in [0, %d) (ranks %d)", o->rank, ranks,
                               ranks);
    if (ranks == 1) return SMELT_OK;
    if (!o->rendezvous || !*o->rendezvous)
        return error_set_field(err, SMELT_EINVAL, "rendezvous",
                               "rendezvous: %d ranks need a rendezvous store (\"file:DIR\" or "
                               "\"smeltd:ENDPOINT\")", ranks);
    if (s->backend != BACKEND_CPU)
        return error_set_field(err, SMELT_EINVAL, "ranks",
                               "ranks: %d ranks need backend \"cpu\" (the collectives are Gloo's, on host "
                               "buffers; NCCL comes later)", ranks);
    if (job_type_is_rl(s->type)) return dist_check_rl(s, ranks, err);
    if (ranks > s->hp.grad_accum)
        return error_set_field(err, SMELT_EINVAL, "ranks",
                               "ranks: %d ranks share a step's %lld micro-batches; raise "
                               "hyperparameters.grad_accum to at least %d", ranks, (long long)s->hp.grad_accum,
                               ranks);
    return SMELT_OK;
}

int dist_open(struct dist *d, const struct dist_config *c, struct smelt_error *err) {
    memset(d, 0, sizeof *d);
    d->rank = c->rank;
    d->ranks = c->ranks > 0 ? c->ranks : 1;
    d->stage = c->stage;
    if (d->ranks == 1) return SMELT_OK;
    TRY(error_wrap(err, comm_store_open_keys(c->rendezvous, "trainer", c->job_keys, &d->store, err), "rendezvous"));
    struct comm_options co = {.rank = d->rank, .size = d->ranks, .name = c->run_id ? c->run_id : "world",
                              .timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : TRAINER_COMM_TIMEOUT_MS,
                              .backend = COMM_BACKEND_GLOO};
    int rc = comm_create(d->store, &co, &d->comm, err);
    if (rc) {
        error_wrap(err, rc, "rank %d of %d", d->rank, d->ranks);
        dist_close(d);
    }
    return rc;
}

void dist_close(struct dist *d) {
    comm_destroy(d->comm);
    d->comm = NULL;
    comm_store_close(d->store);
    d->store = NULL;
    tensor_free(&d->grad_shard);
}

bool dist_sharded(const struct dist *d) { return d->ranks > 1 && d->stage >= 1; }

bool dist_mine(const struct dist *d, int64_t micro) { return d->ranks <= 1 || micro % d->ranks == d->rank; }

int dist_sum(struct dist *d, double *vals, int n, struct smelt_error *err) {
    if (d->ranks <= 1 || n <= 0) return SMELT_OK;
    /* The doubles travel as raw bytes (two f32 slots each: no arithmetic in transit) and
     * every rank adds them in rank order: the same bits everywhere, run after run. */
    size_t per = 2 * (size_t)n;
    float *all = malloc(per * (size_t)d->ranks * sizeof *all);
    if (!all) return error_set(err, SMELT_ENOMEM, "ranks: out of memory");
    int rc = comm_all_gather(d->comm, vals, all, per * (size_t)d->ranks, COMM_F32, NULL, err);
    for (int i = 0; i < n && !rc; i++) {
        double sum = 0;
        for (int k = 0; k < d->ranks; k++) {
            double x;
            memcpy(&x, all + (size_t)k * per + 2 * (size_t)i, sizeof x);
            sum += x;
        }
        vals[i] = sum;
    }
    free(all);
    return rc;
}

int dist_barrier(struct dist *d, struct smelt_error *err) {
    return d->comm ? comm_barrier(d->comm, NULL, err) : SMELT_OK;
}

/* One collective carries at most 2^31 - 1 elements (comm/): a larger buffer moved whole
 * at stages 0-2 is refused at setup, not at the first step. */
static int check_one_collective(const struct dist *d, int64_t n, const char *what, struct smelt_error *err) {
    if (d->ranks <= 1 || n <= INT32_MAX) return SMELT_OK;
    return error_set_field(err, SMELT_EUNSUPPORTED, "hyperparameters.zero_stage", "hyperparameters.zero_stage: %s "
                           "of %lld elements are more than one collective carries (%d) at stage %d; stage 3 moves "
                           "them a unit at a time", what, (long long)n, INT32_MAX, d->stage);
}

int dist_optimizer_init(struct dist *d, const struct tensor *params, struct optimizer *opt, struct smelt_error *err) {
    TRY(check_one_collective(d, tensor_numel(params), "the trainable parameters", err));
    if (!dist_sharded(d)) return optimizer_init(opt, params, err);
    size_t off, len, n = (size_t)tensor_numel(params);
    comm_shard(n, d->ranks, d->rank, &off, &len);
    if (len == 0)
        return error_set_field(err, SMELT_EINVAL, "ranks", "ranks: %d ranks for %zu trainable parameters", d->ranks, n);
    d->shard_off = (int64_t)off;
    d->shard_len = (int64_t)len;
    TRY(optimizer_init_shard(opt, params, d->shard_off, d->shard_len, err));
    if (d->stage < 2) return SMELT_OK;
    return tensor_alloc(&d->grad_shard, params->backend, DTYPE_F32, 1, &d->shard_len, err);
}

/* Stage >= 1 after the shard's update: every rank's updated shard into every rank's
 * parameters. The send buffer is the gradients' shard region (they are spent by now):
 * Gloo's all-gather must not read from the buffer it writes. */
static int gather_params(struct dist *d, struct tensor *params, struct tensor *grads, struct smelt_error *err) {
    struct tensor send = optimizer_view(grads, d->shard_off, d->shard_len);
    struct tensor mine = optimizer_view(params, d->shard_off, d->shard_len);
    TRY(tensor_copy(&send, &mine, err));
    return comm_all_gather(d->comm, send.data, params->data, (size_t)tensor_numel(params), COMM_F32, NULL, err);
}

int dist_optimizer_step(struct dist *d, struct optimizer *opt, struct tensor *params, struct tensor *grads,
                        const struct adamw_step *s, double *norm, struct smelt_error *err) {
    size_t n = (size_t)tensor_numel(grads);
    if (d->comm && d->stage < 2) TRY(comm_all_reduce(d->comm, grads->data, n, COMM_F32, COMM_SUM, NULL, err));
    if (!dist_sharded(d)) {
        double ss;
        TRY(ops_sum_squares(&ss, grads, err));
        return optimizer_apply(opt, params, grads, ss, s, norm, err);
    }
    struct tensor shard = d->stage >= 2 ? d->grad_shard : optimizer_view(grads, d->shard_off, d->shard_len);
    if (d->stage >= 2)
        TRY(comm_reduce_scatter(d->comm, grads->data, shard.data, n, COMM_F32, COMM_SUM, NULL, err));
    /* The global norm from the shards' sums of squares, summed byte-exactly: every rank
     * clips with the same coefficient. */
    double ss;
    TRY(ops_sum_squares(&ss, &shard, err));
    TRY(dist_sum(d, &ss, 1, err));
    TRY(optimizer_apply(opt, params, &shard, ss, s, norm, err));
    return gather_params(d, params, grads, err);
}

void dist_sizes(const struct dist *d, const struct tensor *params, const struct tensor *grads,
                const struct optimizer *opt, struct dist_sizes *out) {
    out->param_bytes = (int64_t)tensor_nbytes(params);
    out->grad_bytes = (int64_t)(tensor_nbytes(grads) + (d->grad_shard.data ? tensor_nbytes(&d->grad_shard) : 0));
    out->optimizer_bytes = (int64_t)(tensor_nbytes(&opt->m) + tensor_nbytes(&opt->v));
}

/* ==== RL on several ranks: bytes between ranks (rl_dist.c's samples) ================== */

/* An RL iteration's micro-batches are the samples' (rl_batch_fit), not grad_accum's, so
 * that rule does not apply; stage 3 is not wired into the RL loop. */
int dist_check_rl(const struct job_spec *s, int ranks, struct smelt_error *err) {
    if (s->hp.zero_stage >= 3)
        return error_set_field(err, SMELT_EINVAL, "hyperparameters.zero_stage",
                               "hyperparameters.zero_stage: a %s job on %d ranks takes ZeRO stage 0, 1 or 2 (got "
                               "%lld)", job_type_name(s->type), ranks, (long long)s->hp.zero_stage);
    return SMELT_OK;
}

/* Bytes travel as f32 slots (no arithmetic in transit): a length padded to them. */
static size_t slots(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

int dist_broadcast_bytes(struct dist *d, void **buf, size_t *len, struct smelt_error *err) {
    if (!d->comm) return SMELT_OK;
    uint64_t n = d->rank == 0 ? (uint64_t)*len : 0;
    float head[2];
    memcpy(head, &n, sizeof n);
    TRY(comm_broadcast(d->comm, head, 2, COMM_F32, 0, NULL, err));
    memcpy(&n, head, sizeof n);
    if (n > DIST_MAX_BROADCAST_BYTES)
        return error_set(err, SMELT_EINVAL, "ranks: rank 0 sends %llu bytes, more than %llu", (unsigned long long)n,
                         (unsigned long long)DIST_MAX_BROADCAST_BYTES);
    float *body = calloc(slots((size_t)n) ? slots((size_t)n) : 1, sizeof *body);
    if (!body) return error_set(err, SMELT_ENOMEM, "ranks: out of memory for %llu bytes", (unsigned long long)n);
    if (d->rank == 0 && n) memcpy(body, *buf, (size_t)n);
    int rc = comm_broadcast(d->comm, body, slots((size_t)n), COMM_F32, 0, NULL, err);
    if (rc || d->rank == 0) {
        free(body);
        return rc;
    }
    *buf = body;
    *len = (size_t)n;
    return SMELT_OK;
}

int dist_gather_bytes(struct dist *d, const void *mine, size_t bytes, void *all, struct smelt_error *err) {
    if (!d->comm) {
        memcpy(all, mine, bytes);
        return SMELT_OK;
    }
    size_t per = slots(bytes) ? slots(bytes) : 1;
    float *send = calloc(per, sizeof *send), *recv = malloc(per * (size_t)d->ranks * sizeof *recv);
    int rc = send && recv ? SMELT_OK : error_set(err, SMELT_ENOMEM, "ranks: out of memory");
    if (!rc) {
        memcpy(send, mine, bytes);
        rc = comm_all_gather(d->comm, send, recv, per * (size_t)d->ranks, COMM_F32, NULL, err);
    }
    for (int k = 0; !rc && k < d->ranks; k++)
        memcpy((char *)all + (size_t)k * bytes, recv + (size_t)k * per, bytes);
    free(send);
    free(recv);
    return rc;
}

int dist_all_reduce_sum(struct dist *d, struct tensor *t, struct smelt_error *err) {
    if (!d->comm) return SMELT_OK;
    TRY(check_one_collective(d, tensor_numel(t), "a buffer summed across ranks (the critic's gradients)", err));
    return comm_all_reduce(d->comm, t->data, (size_t)tensor_numel(t), COMM_F32, COMM_SUM, NULL, err);
}
/* ==== end of RL on several ranks ====================================================== */
