/* smelt-agent: the node agent (server/agent.h) as a program, one per node.
 *
 *   smelt-agent --credential FILE [--server tcp://HOST:PORT] [--id NAME] [--cpu-slots N]
 *               [--cpu] [--heartbeat-ms N]
 *   smelt-agent --server tcp://HOST:PORT [--id NAME] ...   (a smeltd with --insecure-agents)
 *
 * The credential is a key file made by an admin (docs/security.md): the agent's id and
 * CURVE keys and smeltd's public key (and the endpoint, when smeltd knew it).
 *
 * SIGTERM or SIGINT stops it: its workers get SIGTERM, then SIGKILL after 10 s. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/agent.h"

/* agent_config.stop is an atomic_int (smeltd's embedded agent gets it set from another
 * thread); a signal handler may write a lock-free atomic (C11 7.14.1.1). */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "signal handlers need a lock-free atomic_int");
static atomic_int stop_requested;

static void on_stop_signal(int sig) {
    (void)sig;
    atomic_store(&stop_requested, 1);
}

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-agent --credential FILE [--server tcp://HOST:PORT] [--id NAME] [--cpu-slots N]\n"
               "                   [--cpu] [--heartbeat-ms N]\n"
               "  --credential FILE this agent's key file (docs/security.md); without it the connection\n"
               "                    is plain, which only a smeltd started with --insecure-agents accepts\n"
               "  --server ENDPOINT smeltd's agents endpoint (default: the key file's \"endpoint\")\n"
               "  --id NAME         this node's agent id (default: the credential's, else the hostname)\n"
               "  --cpu-slots N     CPU slots to offer (default 0: one per 8 cores, at least 1)\n"
               "  --cpu             offer CPU slots even when GPUs are visible\n"
               "  --heartbeat-ms N  heartbeat interval until smeltd sets one (default 1000)\n");
}

static int parse(int argc, char **argv, struct agent_config *c, const char **credential, struct smelt_error *err) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t n;
        int rc;
        if (strcmp(a, "--cpu") == 0) {
            c->force_cpu = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        static const char *const valued[] = {"--server", "--id", "--cpu-slots", "--heartbeat-ms", "--credential",
                                             NULL};
        bool known = false;
        for (int k = 0; valued[k]; k++) known = known || strcmp(a, valued[k]) == 0;
        if (!known) return error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if ((rc = args_value(argc, argv, &i, &v, err))) return rc;
        if (strcmp(a, "--server") == 0) c->server_endpoint = v;
        else if (strcmp(a, "--credential") == 0) *credential = v;
        else if (strcmp(a, "--id") == 0) c->agent_id = v;
        else if (strcmp(a, "--cpu-slots") == 0) {
            if ((rc = args_int(a, v, 0, AGENT_MAX_DEVICES, &n, err))) return rc;
            c->cpu_slots = (int)n;
        } else if (strcmp(a, "--heartbeat-ms") == 0) {
            if ((rc = args_int(a, v, 10, 3600000, &n, err))) return rc;
            c->heartbeat_ms = (int)n;
        }
    }
    return SMELT_OK;
}

/* The credential's keys, agent id, smeltd's key and endpoint into c (held by cred). */
struct credential {
    struct curve_keypair keys;
    char server_public_key[CURVE_KEY_BYTES];
    json_t *doc;
};

static int load_credential(const char *path, struct agent_config *c, struct credential *cred,
                           struct smelt_error *err) {
    TRY(curve_key_file_read(path, &cred->keys, &cred->doc, err));
    const char *agent_id = json_string_value(json_object_get(cred->doc, "agent_id"));
    const char *server_key = json_string_value(json_object_get(cred->doc, "server_public_key"));
    const char *endpoint = json_string_value(json_object_get(cred->doc, "endpoint"));
    if (!agent_id || !agent_id[0])
        return error_set_field(err, SMELT_EFORMAT, "agent_id", "%s: agent_id: missing", path);
    if (!curve_key_valid(server_key))
        return error_set_field(err, SMELT_EFORMAT, "server_public_key", "%s: server_public_key: missing or not a "
                               "CURVE key", path);
    if (c->agent_id && strcmp(c->agent_id, agent_id) != 0)
        return error_set_field(err, SMELT_EINVAL, "--id", "--id %s: the credential is agent %s's", c->agent_id,
                               agent_id);
    memcpy(cred->server_public_key, server_key, CURVE_KEY_BYTES);
    c->agent_id = agent_id;
    c->curve = &cred->keys;
    c->server_public_key = cred->server_public_key;
    if (!c->server_endpoint) c->server_endpoint = endpoint;
    return SMELT_OK;
}

static int check_endpoint(const struct agent_config *c, struct smelt_error *err) {
    if (!c->server_endpoint) return error_set(err, SMELT_EINVAL, "--server is required");
    if (strncmp(c->server_endpoint, "tcp://", 6) != 0 && strncmp(c->server_endpoint, "ipc://", 6) != 0)
        return error_set(err, SMELT_EINVAL, "--server: '%s' is not a tcp:// (or ipc://) endpoint",
                         c->server_endpoint);
    if (c->agent_id && c->agent_id[0] == '\0') return error_set(err, SMELT_EINVAL, "--id: empty");
    return SMELT_OK;
}

int main(int argc, char **argv) {
    struct agent_config config = {.stop = &stop_requested};
    struct smelt_error err = {0};
    const char *credential_path = NULL;
    struct credential cred = {0};
    if (parse(argc, argv, &config, &credential_path, &err) ||
        (credential_path && load_credential(credential_path, &config, &cred, &err)) ||
        check_endpoint(&config, &err)) {
        fprintf(stderr, "smelt-agent: %s\n", err.message);
        usage(stderr);
        json_decref(cred.doc);
        return 2;
    }
    /* No SA_RESTART: the agent's poll returns at once and sees the flag. */
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0) {
        perror("smelt-agent: sigaction");
        return 1;
    }
    int rc = agent_run(&config, &err);
    explicit_bzero(&cred.keys, sizeof cred.keys);
    json_decref(cred.doc);
    if (rc) {
        fprintf(stderr, "smelt-agent: %s\n", err.message);
        return 1;
    }
    return 0;
}
