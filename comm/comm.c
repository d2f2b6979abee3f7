/* The communicator: its Gloo context, and the thread that runs the operations one after
 * the other in issue order so that the caller computes while they run. A failure breaks
 * the communicator; comm/fault.c names the ranks at fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

static void *comm_thread(void *arg) {
    struct comm *comm = arg;
    pthread_mutex_lock(&comm->lock);
    for (;;) {
        while (!comm->head && !comm->stopping) pthread_cond_wait(&comm->work, &comm->lock);
        struct comm_request *req = comm->head;
        if (!req) break;
        bool broken = comm->broken;
        pthread_mutex_unlock(&comm->lock);
        struct smelt_error err = {0};
        int rc;
        if (broken) {
            err = comm->broken_err; /* written once, before broken was set */
            rc = err.code;
        } else {
            rc = comm_run(comm, req, &err);
            if (rc) {
                /* Closing every connection now makes the ranks still blocked in this
                 * operation (those not next to the dead one) fail at once instead of
                 * at their timeout, so they report within the others' grace period. */
                gloo_ctx_destroy(comm->gloo);
                comm->gloo = NULL;
                rc = comm_name_faults(comm, req->seq, comm_kind_name(req->kind), &err);
            }
        }
        pthread_mutex_lock(&comm->lock);
        if (rc && !comm->broken) {
            comm->broken_err = err;
            comm->broken = true;
        }
        comm->head = req->next;
        if (!comm->head) comm->tail = NULL;
        req->rc = rc;
        req->err = err;
        req->done = true;
        pthread_cond_broadcast(&comm->finished);
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

static int check_options(const struct comm_options *o, struct smelt_error *err) {
    if (o->size < 1)
        return error_set_field(err, SMELT_EINVAL, "size", "size is %d (at least 1)", o->size);
    if (o->rank < 0 || o->rank >= o->size)
        return error_set_field(err, SMELT_EINVAL, "rank", "rank %d is outside 0..%d", o->rank,
                               o->size - 1);
    if (o->timeout_ms < 1)
        return error_set_field(err, SMELT_EINVAL, "timeout_ms", "timeout_ms is %d (at least 1)",
                               o->timeout_ms);
    if (o->backend != COMM_BACKEND_GLOO)
        return error_set_field(err, SMELT_EUNSUPPORTED, "backend",
                               "backend %d is not built (only Gloo)", (int)o->backend);
    return comm_name_check(o->name, "name", err);
}

static struct comm *comm_alloc(struct comm_store *store, const struct comm_options *o) {
    struct comm *comm = calloc(1, sizeof *comm);
    if (!comm) return NULL;
    comm->rank = o->rank;
    comm->size = o->size;
    comm->timeout_ms = o->timeout_ms;
    snprintf(comm->name, sizeof comm->name, "%s", o->name);
    comm->store = store;
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->work, NULL);
    pthread_cond_init(&comm->finished, NULL);
    return comm;
}

static void comm_free(struct comm *comm) {
    gloo_ctx_destroy(comm->gloo);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->work);
    pthread_cond_destroy(&comm->finished);
    free(comm);
}

int comm_create(struct comm_store *store, const struct comm_options *options,
                struct comm **out, struct smelt_error *err) {
    *out = NULL;
    TRY(check_options(options, err));
    if (!store) return error_set_field(err, SMELT_EINVAL, "store", "no rendezvous store");
    struct comm *comm = comm_alloc(store, options);
    if (!comm) return error_set(err, SMELT_ENOMEM, "communicator: out of memory");
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s/gloo", comm->name);
    int rc = gloo_ctx_create(store, prefix, comm->rank, comm->size, options->host,
                             comm->timeout_ms, &comm->gloo, err);
    if (rc) {
        comm_free(comm);
        return error_wrap(err, rc, "communicator '%s': rank %d of %d", options->name,
                          options->rank, options->size);
    }
    if (pthread_create(&comm->thread, NULL, comm_thread, comm)) {
        comm_free(comm);
        return error_set(err, SMELT_ENOMEM, "communicator '%s': cannot start its thread",
                         options->name);
    }
    *out = comm;
    return SMELT_OK;
}

void comm_destroy(struct comm *comm) {
    if (!comm) return;
    pthread_mutex_lock(&comm->lock);
    comm->stopping = true;
    pthread_cond_signal(&comm->work);
    pthread_mutex_unlock(&comm->lock);
    pthread_join(comm->thread, NULL);
    comm_free(comm);
}

int comm_rank(const struct comm *comm) { return comm->rank; }
int comm_size(const struct comm *comm) { return comm->size; }

bool comm_is_broken(const struct comm *comm, struct smelt_error *why) {
    struct comm *c = (struct comm *)comm; /* the lock is the only thing written */
    pthread_mutex_lock(&c->lock);
    bool broken = c->broken;
    if (broken && why) *why = c->broken_err;
    pthread_mutex_unlock(&c->lock);
    return broken;
}

int comm_submit(struct comm *comm, struct comm_request *req, struct comm_request **out,
                struct smelt_error *err) {
    req->comm = comm;
    pthread_mutex_lock(&comm->lock);
    req->seq = comm->next_seq++;
    if (comm->tail) comm->tail->next = req;
    else comm->head = req;
    comm->tail = req;
    pthread_cond_signal(&comm->work);
    pthread_mutex_unlock(&comm->lock);
    if (out) {
        *out = req;
        return SMELT_OK;
    }
    return comm_wait(req, err);
}

int comm_wait(struct comm_request *req, struct smelt_error *err) {
    if (!req) return error_set(err, SMELT_EINVAL, "comm_wait: no request");
    struct comm *comm = req->comm;
    pthread_mutex_lock(&comm->lock);
    while (!req->done) pthread_cond_wait(&comm->finished, &comm->lock);
    pthread_mutex_unlock(&comm->lock);
    int rc = req->rc;
    if (rc && err) *err = req->err;
    free(req);
    return rc;
}
