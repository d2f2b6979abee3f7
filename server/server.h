/* server/: smeltd, the control plane (docs/architecture.md §2, §7, §9): the HTTP API (OpenAI
 * fine-tuning compatible; docs/api.md), the SQLite store, the scheduler and cron, the
 * agents' ZeroMQ endpoint and the web status page. `smeltd` (server/smeltd_main.c) fills
 * a server_config from its flags and calls server_run; tests do the same in-process.
 *
 * Ownership: server_run owns everything it starts and stops it all before returning. */
#ifndef SMELT_SERVER_H
#define SMELT_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

struct server_config {
    const char *data_dir;         /* smelt.db, files/, jobs/ (created if missing) */
    const char *models_dir;       /* base models: each subfolder with a config.json; NULL:
                                     <data_dir>/models */
    const char *listen_address;   /* HTTP; "127.0.0.1" */
    int port;                     /* HTTP; 0 picks a free one (written to port_file) */
    const char *port_file;        /* NULL or a path the HTTP port is written to once bound */
    const char *agent_bind;       /* ZeroMQ ROUTER for remote agents, e.g.
                                     "tcp://127.0.0.1:7071"; NULL: none */
    bool insecure_agents;         /* agent_bind without CURVE (--insecure-agents): anyone who
                                     reaches it may join; logged, shown in /v1/cluster */
    bool embedded_agent;          /* run a local agent on a thread (no cluster configured) */
    int cpu_slots;                /* the embedded agent's CPU slots (0: its default) */
    bool force_cpu;               /* the embedded agent reports CPU slots even with GPUs */
    const char *admin_key;        /* created as the admin key of project "default" at
                                     first start when no key exists; NULL: one is generated
                                     and written to <data_dir>/admin_key */
    const char *bin_dir;          /* where smelt-trainer is; NULL: smeltd's own folder */
    const char *web_dir;          /* the page's static files; NULL: server/web beside the
                                     binary's source tree, found from bin_dir */
    int http_threads;             /* 0: 8 */
    size_t max_upload_bytes;      /* 0: 512 MiB */
    int heartbeat_ms;             /* agents' heartbeat (0: 1000) */
    int agent_lost_ms;            /* silence after which an agent is lost (0: 10 s) */
    int stop_grace_ms;            /* SIGTERM -> SIGKILL for cancel (0: 10 s) */
    const char *tinker_bind;      /* ZeroMQ ROUTER the Tinker session workers connect to;
                                     NULL: "tcp://127.0.0.1:*" (a free port) */
    const char *rendezvous_bind;  /* ZeroMQ ROUTER where the ranks of a job meet (server/
                                     rendezvous.c); NULL: "tcp://127.0.0.1:*" (a free port) */
    int rendezvous_max_keys;      /* keys one job attempt may hold (0: 1024) */
    size_t rendezvous_max_bytes;  /* bytes of keys and values one attempt may hold (0: 4 MiB) */
    int tinker_idle_seconds;      /* a session job none of whose sessions was heard from for
                                     this long is released (0: 600) */
    const atomic_int *stop;       /* server_run returns once *stop != 0; atomic because
                                     smeltd's signal handler may run on any of its threads */
};

int server_run(const struct server_config *config, struct smelt_error *err);

/* `smeltd agent-credential VERB ...` (argv as main's, argv[1] == "agent-credential"): agent
 * credentials created, listed, revoked or rotated on a data directory (docs/security.md).
 * Returns the process's exit status. */
int server_agent_credential_main(int argc, char **argv);

#endif
