/* The agent (private to server/): one per node. It connects a ZeroMQ DEALER to smeltd's
 * ROUTER, registers its devices, heartbeats, launches and stops workers on smeltd's
 * orders, relays their metrics lines and reports their exits. The protocol is in
 * common/msg.h (agent.*, worker.*).
 *
 * `smelt-agent` runs agent_run in its main thread; smeltd with no configured cluster
 * runs it on a thread of its own (the embedded local agent).
 *
 * Workers: fork + execv (never a shell) with argv from worker.launch, in its workdir,
 * stdout and stderr appended to its log_path, the launch env added to the agent's own,
 * CUDA_VISIBLE_DEVICES from the launch's devices when they are GPUs, in a process group
 * of its own, and PR_SET_PDEATHSIG=SIGTERM so that a worker never outlives an agent that
 * died (it then checkpoints and exits; smeltd retries it from that checkpoint).
 * worker.stop sends SIGTERM to the group, then SIGKILL after grace_ms. The agent tails
 * metrics_path and sends each complete new line as worker.event; when the worker exits
 * it relays the remaining lines first, then worker.exited.
 *
 * Ownership: agent_run owns every process it starts and reaps them all before it
 * returns (stopping them as worker.stop does). */
#ifndef SMELT_SERVER_AGENT_H
#define SMELT_SERVER_AGENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/error.h"

#define AGENT_MAX_DEVICES 64

struct agent_device {
    int index;
    char kind[8];               /* "cpu" or "cuda" */
    char name[128];
    int64_t memory_bytes;
};

struct agent_config {
    const char *server_endpoint;  /* "tcp://127.0.0.1:7071" or "inproc://..." */
    void *zmq_context;            /* NULL: the agent makes its own; inproc needs smeltd's */
    const char *agent_id;         /* unique per node; NULL: the hostname */
    /* Devices: GPUs found through the CUDA runtime (when built with CUDA and one is
     * visible) unless force_cpu; otherwise cpu_slots CPU slots (0: one slot per 8
     * online cores, at least 1; at most AGENT_MAX_DEVICES). */
    int cpu_slots;
    bool force_cpu;
    int heartbeat_ms;             /* 0: 1000 */
    /* CURVE (docs/security.md): the agent's credential (keys and smeltd's public key), from
     * `smelt-agent --credential FILE`. NULL: a plain connection (inproc, or a smeltd started
     * with --insecure-agents). With a credential the agent sets no routing id: smeltd knows it
     * by its credential and answers it on the connection the ROUTER numbered. */
    const struct curve_keypair *curve;
    const char *server_public_key;
    /* agent_run returns soon after *stop becomes non-zero. Atomic: smeltd sets it from
     * another thread, smelt-agent from a signal handler. */
    const atomic_int *stop;
};

/* Fills devices as agent_run would report them. */
int agent_discover_devices(const struct agent_config *config, struct agent_device *devices,
                           int max, int *n, struct smelt_error *err);

/* Runs until *config->stop; reconnects and re-registers if smeltd goes away (it keeps
 * its workers running meanwhile and reports them in the next agent.register). */
int agent_run(const struct agent_config *config, struct smelt_error *err);

#endif
