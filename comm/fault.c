/* Naming the ranks at fault after a failed operation, whatever the transport. Gloo says
 * that an operation failed (a closed connection, a timeout) but, in its messages, names a
 * peer by address at best and a stuck peer not at all; NCCL's asynchronous errors name
 * none, and a stuck peer only shows as our own timeout. So every rank whose operation failed publishes that in
 * the store under <name>/fail/<rank>, and waits a grace period for the others: the
 * ranks that never report are the dead or stuck ones. The key holds no operation
 * number: a communicator fails once (it is broken after), and the ranks need not fail
 * in the same operation — one whose part of an all-reduce finished before the peer died
 * fails in the next one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

/* The timeout, within [100 ms, 5 s]: a healthy rank fails at the latest when its own
 * operation times out (a killed peer closes every connection at once, and the first rank
 * to fail closes its own), so its report comes within about one timeout of ours; a
 * shorter grace named healthy ranks on busy machines. */
static int grace_ms(const struct comm *comm) {
    int g = comm->timeout_ms;
    return g < 100 ? 100 : g > 5000 ? 5000 : g;
}

static void fail_key(const struct comm *comm, int rank, char *key, size_t bytes) {
    snprintf(key, bytes, "%s/fail/%d", comm->name, rank);
}

/* Appends the ranks whose report did not come within the grace period to list and flags
 * them in comm->at_fault. */
static int silent_ranks(struct comm *comm, char *list, size_t bytes) {
    int64_t deadline = mono_ms() + grace_ms(comm);
    int silent = 0;
    size_t n = 0;
    list[0] = '\0';
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank) continue;
        char key[COMM_KEY_BYTES];
        fail_key(comm, r, key, sizeof key);
        int64_t left = deadline - mono_ms();
        struct smelt_error ignored;
        if (!comm->store->ops->wait(comm->store->impl, (const char *const[]){key}, 1,
                                    left > 0 ? (int)left : 0, &ignored))
            continue;
        comm->at_fault[r] = true;
        if (n < bytes)
            n += (size_t)snprintf(list + n, bytes - n, "%s%d", silent ? ", " : "", r);
        silent++;
    }
    return silent;
}

int comm_name_faults(struct comm *comm, uint64_t seq, const char *what,
                     struct smelt_error *err) {
    char cause[SMELT_ERROR_MESSAGE_BYTES];
    snprintf(cause, sizeof cause, "%s", err->message);
    int code = err->code;
    char key[COMM_KEY_BYTES];
    fail_key(comm, comm->rank, key, sizeof key);
    struct smelt_error store_err;
    bool published = !comm->store->ops->set(comm->store->impl, key, cause, strlen(cause),
                                            &store_err);
    char silent[160];
    int n = published ? silent_ranks(comm, silent, sizeof silent) : 0;
    if (!published)
        return error_set(err, code, "%s #%llu failed on rank %d of %d (%s; the store failed "
                         "too, so the rank at fault is unknown: %s)", what,
                         (unsigned long long)seq, comm->rank, comm->size, cause,
                         store_err.message);
    if (n == 0)
        return error_set(err, code, "%s #%llu failed on rank %d of %d and on every other "
                         "rank: %s", what, (unsigned long long)seq, comm->rank, comm->size,
                         cause);
    return error_set(err, code, "%s #%llu failed on rank %d of %d: rank%s %s dead or not "
                     "answering (no failure report within %d ms); %s: %s", what,
                     (unsigned long long)seq, comm->rank, comm->size, n > 1 ? "s" : "",
                     silent, grace_ms(comm), comm->transport->name, cause);
}
