/* server/server.c: server_run on a thread, stopped from another. Under `make test TSAN=1`
 * this is the check that smeltd's stop flags are shared by the rules: the test's thread
 * sets server_config.stop while server_run reads it, and control_stop sets the embedded
 * agent's stop while the agent's thread reads it (both atomic_int). */
#include "tests/unit/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server.h"

static struct {
    atomic_int stop;  /* set by the test's thread, read by server_run's */
    struct server_config config;
    struct smelt_error err;
    int rc;
    char data_dir[128], port_file[160];
} h;

static void *server_thread(void *arg) {
    (void)arg;
    h.rc = server_run(&h.config, &h.err);
    return NULL;
}

/* Waits for the port file: by then the control loop and the embedded agent run. */
static void wait_listening(void) {
    int64_t deadline = mono_ms() + 20000;
    while (access(h.port_file, F_OK) != 0 && mono_ms() < deadline) sleep_ms(10);
    cr_assert_eq(access(h.port_file, F_OK), 0, "server_run never wrote %s", h.port_file);
}

Test(server, stop_from_another_thread_joins_the_control_loop_and_the_agent,
     .init = test_tmp_setup, .fini = test_tmp_teardown, .timeout = 60) {
    test_tmp_path(h.data_dir, sizeof h.data_dir, "var");
    test_tmp_path(h.port_file, sizeof h.port_file, "port");
    atomic_store(&h.stop, 0);
    h.config = (struct server_config){.data_dir = h.data_dir, .listen_address = "127.0.0.1",
                                      .port_file = h.port_file, .embedded_agent = true,
                                      .cpu_slots = 1, .force_cpu = true, .heartbeat_ms = 20,
                                      .admin_key = "sk-smelt-test-0123456789abcdef",
                                      .bin_dir = test_tmp_dir, .web_dir = test_tmp_dir,
                                      .http_threads = 2, .stop = &h.stop};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, server_thread, NULL), 0);
    wait_listening();
    sleep_ms(200); /* a few heartbeats and control ticks */
    int64_t t0 = mono_ms();
    atomic_store(&h.stop, 1);
    cr_assert_eq(pthread_join(thread, NULL), 0);
    int64_t took = mono_ms() - t0;
    cr_expect_eq(h.rc, 0, "server_run: %s", h.err.message);
    cr_expect_lt(took, 5000, "server_run took %lld ms to return after the stop", (long long)took);
}
