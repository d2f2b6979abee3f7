/* common/stop.h. The flag is a lock-free atomic, not a volatile sig_atomic_t: the handler
 * may run on another thread than the serving one (OpenMP's), and a lock-free atomic may be
 * written by a signal handler (C11 7.14.1.1). */
#include "common/stop.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "signal handlers need a lock-free atomic_int");
static atomic_int stop_requested;

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&stop_requested, 1);
}

int stop_on_signals(struct smelt_error *err) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL))
        return error_set(err, SMELT_EIO, "sigaction: %s", strerror(errno));
    return SMELT_OK;
}

atomic_int *stop_flag(void) { return &stop_requested; }
