/* The communicator: options, requests and the broken state, whatever the transport; and
 * the Gloo transport: its context, and the thread that runs the operations one after the
 * other in issue order so that the caller computes while they run. A failure breaks the
 * communicator; comm/fault.c names the ranks at fault. (NCCL: comm/nccl.c.) */
#include <signal.h>
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

static int gloo_connect(struct comm *comm, const struct comm_options *options,
                        struct smelt_error *err) {
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s/gloo", comm->name);
    TRY(gloo_ctx_create(comm->store, prefix, comm->rank, comm->size, options->host,
                        comm->timeout_ms, &comm->gloo, err));
    if (pthread_create(&comm->thread, NULL, comm_thread, comm)) {
        gloo_ctx_destroy(comm->gloo);
        comm->gloo = NULL;
        return error_set(err, SMELT_ENOMEM, "cannot start the communicator's thread");
    }
    return SMELT_OK;
}

static int gloo_issue(struct comm *comm, struct comm_request *req, struct smelt_error *err) {
    (void)err;
    pthread_mutex_lock(&comm->lock);
    req->seq = comm->next_seq++;
    if (comm->tail) comm->tail->next = req;
    else comm->head = req;
    comm->tail = req;
    pthread_cond_signal(&comm->work);
    pthread_mutex_unlock(&comm->lock);
    return SMELT_OK;
}

static void gloo_wait(struct comm *comm, struct comm_request *req) {
    pthread_mutex_lock(&comm->lock);
    while (!req->done) pthread_cond_wait(&comm->finished, &comm->lock);
    pthread_mutex_unlock(&comm->lock);
}

/* Runs out the queue (each operation bounded by its timeout), then disconnects. */
static void gloo_close(struct comm *comm) {
    pthread_mutex_lock(&comm->lock);
    comm->stopping = true;
    pthread_cond_signal(&comm->work);
    pthread_mutex_unlock(&comm->lock);
    pthread_join(comm->thread, NULL);
    gloo_ctx_destroy(comm->gloo);
    comm->gloo = NULL;
}

static const struct comm_transport gloo_transport = {
    .name = "Gloo", .connect = gloo_connect, .issue = gloo_issue, .wait = gloo_wait,
    .close = gloo_close};

/* NULL for a backend this program was built without. */
static const struct comm_transport *transport_of(enum comm_backend backend) {
    if (backend == COMM_BACKEND_GLOO) return &gloo_transport;
#ifdef SMELT_NCCL
    if (backend == COMM_BACKEND_NCCL) return &comm_nccl_transport;
#endif
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
    if (!transport_of(o->backend))
        return error_set_field(err, SMELT_EUNSUPPORTED, "backend", "backend %d (%s) is not "
                               "built into this program (it has: %s)", (int)o->backend,
                               o->backend == COMM_BACKEND_NCCL ? "NCCL" : "unknown",
                               transport_of(COMM_BACKEND_NCCL) ? "Gloo, NCCL" :
                               "Gloo; NCCL needs a build with CUDA and NCCL");
    return comm_name_check(o->name, "name", err);
}

static struct comm *comm_alloc(struct comm_store *store, const struct comm_options *o) {
    struct comm *comm = calloc(1, sizeof *comm);
    bool *at_fault = calloc((size_t)o->size, sizeof *at_fault);
    if (!comm || !at_fault) {
        free(comm);
        free(at_fault);
        return NULL;
    }
    comm->at_fault = at_fault;
    comm->rank = o->rank;
    comm->size = o->size;
    comm->timeout_ms = o->timeout_ms;
    snprintf(comm->name, sizeof comm->name, "%s", o->name);
    comm->store = store;
    comm->transport = transport_of(o->backend);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->work, NULL);
    pthread_cond_init(&comm->finished, NULL);
    return comm;
}

static void comm_free(struct comm *comm) {
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->work);
    pthread_cond_destroy(&comm->finished);
    free(comm->at_fault);
    free(comm);
}

/* Gloo writes to its sockets without MSG_NOSIGNAL: a write to the socket of a peer that
 * has just died raises SIGPIPE, whose default action kills this rank (exit 141) instead
 * of failing the operation, which would name the peer. Python, where PyTorch runs Gloo,
 * ignores SIGPIPE from its start; a program of ours does the same here, unless it has a
 * handler of its own. */
static void ignore_sigpipe(void) {
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) return;
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
}

int comm_create(struct comm_store *store, const struct comm_options *options,
                struct comm **out, struct smelt_error *err) {
    *out = NULL;
    TRY(check_options(options, err));
    ignore_sigpipe();
    if (!store) return error_set_field(err, SMELT_EINVAL, "store", "no rendezvous store");
    struct comm *comm = comm_alloc(store, options);
    if (!comm) return error_set(err, SMELT_ENOMEM, "communicator: out of memory");
    const struct comm_transport *transport = comm->transport;
    int rc = transport->connect(comm, options, err);
    if (rc) {
        comm_free(comm);
        return error_wrap(err, rc, "communicator '%s' (%s): rank %d of %d", options->name,
                          transport->name, options->rank, options->size);
    }
    *out = comm;
    return SMELT_OK;
}

void comm_destroy(struct comm *comm) {
    if (!comm) return;
    comm->transport->close(comm);
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

int comm_fault_ranks(const struct comm *comm, int *ranks, int cap) {
    struct comm *c = (struct comm *)comm; /* the lock is the only thing written */
    int n = 0;
    pthread_mutex_lock(&c->lock);
    for (int r = 0; c->broken && r < c->size; r++)
        if (c->at_fault[r]) {
            if (n < cap) ranks[n] = r;
            n++;
        }
    pthread_mutex_unlock(&c->lock);
    return n;
}

int comm_submit(struct comm *comm, struct comm_request *req, struct comm_request **out,
                struct smelt_error *err) {
    req->comm = comm;
    int rc = comm->transport->issue(comm, req, err);
    if (rc) {
        free(req);
        return rc;
    }
    if (out) {
        *out = req;
        return SMELT_OK;
    }
    return comm_wait(req, err);
}

int comm_wait(struct comm_request *req, struct smelt_error *err) {
    if (!req) return error_set(err, SMELT_EINVAL, "comm_wait: no request");
    req->comm->transport->wait(req->comm, req);
    int rc = req->rc;
    if (rc && err) *err = req->err;
    free(req);
    return rc;
}
