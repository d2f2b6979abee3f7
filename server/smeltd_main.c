/* smeltd: the control plane. With no flags it serves http://127.0.0.1:8700 with its data
 * in ./var, an embedded local agent and the admin key in ./var/admin_key. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/server.h"

/* Not a volatile sig_atomic_t: the handler may run on an HTTP or control thread while
 * server_run reads the flag on the main one. A lock-free atomic may be written by a
 * signal handler (C11 7.14.1.1) and is ordered between threads. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "signal handlers need a lock-free atomic_int");
static atomic_int stop_requested;

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&stop_requested, 1);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: smeltd [--data DIR] [--models DIR] [--listen ADDR] [--port N] [--port-file F]\n"
            "              [--agents tcp://ADDR:PORT] [--insecure-agents] [--no-local-agent] [--cpu-slots N] [--cpu]\n"
            "              [--admin-key-file F] [--bin-dir DIR] [--web-dir DIR] [--threads N]\n"
            "              [--heartbeat-ms N] [--agent-lost-ms N] [--stop-grace-ms N] [--max-upload-mb N]\n"
            "              [--tinker-bind tcp://ADDR:PORT] [--tinker-idle-seconds N]\n"
            "              [--rendezvous-bind tcp://ADDR:PORT]\n"
            "The admin key comes from SMELT_ADMIN_KEY, --admin-key-file, or is generated into DIR/admin_key\n"
            "at the first start. docs/operations.md explains each flag.\n"
            "       smeltd agent-credential create|list|revoke|rotate ... (enrolls agents; docs/security.md)\n");
}

int main(int argc, char **argv) {
    struct server_config c = {.data_dir = "var", .listen_address = "127.0.0.1", .port = 8700,
                              .embedded_agent = true};
    struct smelt_error err = {0};
    const char *key_file = NULL;
    if (argc > 1 && strcmp(argv[1], "agent-credential") == 0) return server_agent_credential_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t n = 0;
        int rc = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--no-local-agent") == 0) {
            c.embedded_agent = false;
            continue;
        }
        if (strcmp(a, "--insecure-agents") == 0) {
            c.insecure_agents = true;
            continue;
        }
        if (strcmp(a, "--cpu") == 0) {
            c.force_cpu = true;
            continue;
        }
        if ((rc = args_value(argc, argv, &i, &v, &err))) goto bad;
        if (strcmp(a, "--data") == 0) c.data_dir = v;
        else if (strcmp(a, "--models") == 0) c.models_dir = v;
        else if (strcmp(a, "--listen") == 0) c.listen_address = v;
        else if (strcmp(a, "--port-file") == 0) c.port_file = v;
        else if (strcmp(a, "--agents") == 0) c.agent_bind = v;
        else if (strcmp(a, "--tinker-bind") == 0) c.tinker_bind = v;
        else if (strcmp(a, "--rendezvous-bind") == 0) c.rendezvous_bind = v;
        else if (strcmp(a, "--admin-key-file") == 0) key_file = v;
        else if (strcmp(a, "--bin-dir") == 0) c.bin_dir = v;
        else if (strcmp(a, "--web-dir") == 0) c.web_dir = v;
        else if (strcmp(a, "--port") == 0) { if (!(rc = args_int(a, v, 0, 65535, &n, &err))) c.port = (int)n; }
        else if (strcmp(a, "--cpu-slots") == 0) { if (!(rc = args_int(a, v, 1, 1024, &n, &err))) c.cpu_slots = (int)n; }
        else if (strcmp(a, "--threads") == 0) { if (!(rc = args_int(a, v, 1, 1024, &n, &err))) c.http_threads = (int)n; }
        else if (strcmp(a, "--heartbeat-ms") == 0) { if (!(rc = args_int(a, v, 10, 600000, &n, &err))) c.heartbeat_ms = (int)n; }
        else if (strcmp(a, "--agent-lost-ms") == 0) { if (!(rc = args_int(a, v, 100, 3600000, &n, &err))) c.agent_lost_ms = (int)n; }
        else if (strcmp(a, "--stop-grace-ms") == 0) { if (!(rc = args_int(a, v, 0, 3600000, &n, &err))) c.stop_grace_ms = (int)n; }
        else if (strcmp(a, "--tinker-idle-seconds") == 0) { if (!(rc = args_int(a, v, 1, 31536000, &n, &err))) c.tinker_idle_seconds = (int)n; }
        else if (strcmp(a, "--max-upload-mb") == 0) { if (!(rc = args_int(a, v, 1, 1 << 20, &n, &err))) c.max_upload_bytes = (size_t)n << 20; }
        else rc = error_set(&err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) goto bad;
    }
    char *key_text = NULL;
    c.admin_key = getenv("SMELT_ADMIN_KEY");
    if (key_file) {
        size_t len = 0;
        if (file_read_all(key_file, &key_text, &len, &err) != 0) goto bad;
        while (len > 0 && (key_text[len - 1] == '\n' || key_text[len - 1] == '\r' || key_text[len - 1] == ' '))
            key_text[--len] = 0;
        c.admin_key = key_text;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    c.stop = &stop_requested;
    int rc = server_run(&c, &err);
    free(key_text);
    if (rc) {
        fprintf(stderr, "smeltd: %s\n", err.message);
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "smeltd: %s\n", err.message);
    usage(stderr);
    return 2;
}
