/* Private to rewards/: user Python code run in a bubblewrap sandbox (python graders).
 * docs/rewards.md ("python") is the user's reference: what the code can and cannot do,
 * the limits and their defaults.
 *
 * One sandbox is one process tree: bwrap (new user, pid, network, ipc, uts, cgroup and
 * mount namespaces, no further user namespaces, a new session, an empty environment)
 * over a read-only view of /usr (and the host's /bin, /lib* links to it), a private
 * /proc, a read-only minimal /dev and a private size-limited /tmp; nothing else of the
 * host. In it runs /usr/bin/python3 -I, pid 1 of the namespace (bwrap --as-pid-1), with
 * a runner (sandbox_runner.c) that reads the user's source once, then grades one request
 * line at a time, each under a timer, and kills whatever processes a grade() call left
 * behind. Only the sandbox's stdin, stdout and stderr reach it: every other descriptor
 * of the caller is closed in the child.
 *
 * Who the code runs as: a caller running as root drops, before bwrap starts, to a uid of
 * its own from a reserved range (default 1879048192-1879049215, systemd's unassigned
 * range; SMELT_SANDBOX_UIDS="FIRST-LAST" changes it), claimed host-wide for the
 * sandbox's lifetime through an abstract unix socket named after the uid, so concurrent
 * sandboxes (of any process) never share one and RLIMIT_NPROC counts one sandbox's
 * processes. A caller that is not root cannot change uid: the sandbox runs as its uid
 * inside a user namespace (which needs unprivileged user namespaces), and the process
 * limit is set inside it by the runner, where it counts the namespace's processes.
 *
 * Limits, set in the forked child before bwrap runs (inherited by everything in it):
 * address space (memory_mb per process), CPU seconds (a backstop: start-up plus
 * timeout_s per sample of the batch), open files, file size, no core files; processes
 * and threads of one sandbox (SANDBOX_MAX_PROCS). The caller enforces the wall clock:
 * SANDBOX_START_S for start-up and the import of the source, then timeout_s plus
 * SANDBOX_GRACE_S per sample (the runner's own timer stops a grade() at timeout_s; the
 * caller SIGKILLs the sandbox when even that fails), and the output: a sandbox that
 * prints more than SANDBOX_OUTPUT_BYTES is killed.
 *
 * Batches: sandbox_grade runs up to lim->sandboxes sandboxes at once and hands each the
 * next request when it answers the last, so a slow sample delays one sandbox only. A
 * sample whose grade() raises, returns something other than a finite number, times out,
 * or whose sandbox dies or prints too much gets ok = false and a message; a dead sandbox
 * is replaced for the samples still waiting. Nothing outlives the call: every sandbox is
 * ended (its init killed when it was busy), drained to end of file and reaped before it
 * returns; bwrap reaps the init, whose end took every other process of its namespace. */
#ifndef SMELT_REWARDS_SANDBOX_INTERNAL_H
#define SMELT_REWARDS_SANDBOX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/error.h"

#define SANDBOX_MAX_PROCS 16                  /* processes + threads in one sandbox (RLIMIT_NPROC) */
#define SANDBOX_MAX_FILES 64                  /* open files per process (RLIMIT_NOFILE) */
#define SANDBOX_TMP_BYTES (64ll << 20)        /* the private /tmp, and RLIMIT_FSIZE */
#define SANDBOX_OUTPUT_BYTES (1ll << 20)      /* what one sandbox may print before it is killed */
#define SANDBOX_START_S 10.0                  /* python's start and the source's import */
#define SANDBOX_GRACE_S 1.0                   /* past timeout_s before the caller kills */
#define SANDBOX_MESSAGE_BYTES 200             /* one sample's error */
#define SANDBOX_UID_FIRST 1879048192u         /* default range of sandbox uids (root callers) */
#define SANDBOX_UID_COUNT 1024u
#define SANDBOX_REFUSED 1                     /* sandbox_check: the source is at fault (why) */

struct sandbox_limits {
    double timeout_s;  /* one grade() call, wall clock */
    int64_t memory_mb; /* address space of each process */
    int sandboxes;     /* sandboxes at once in a batch */
};

/* Where the sandbox's programs are. */
struct sandbox_host {
    char bwrap[256];  /* absolute path of bwrap */
    char python[256]; /* the real python3 binary (not a shim), under /usr */
};

/* Finds bwrap (on PATH) and /usr/bin/python3. SMELT_EUNSUPPORTED naming what is missing
 * (and how to install it). */
int sandbox_host_find(struct sandbox_host *host, struct smelt_error *err);

/* Runs source's top level in a sandbox and checks that it defines grade(sample, item):
 * 0; SANDBOX_REFUSED with why ("line 3: invalid syntax", "defines no grade(sample,
 * item) function", "the module's top level raised ..."); or a negative code with err
 * when no sandbox can run here (bwrap missing, namespaces refused, fork failed). */
int sandbox_check(const char *source, const struct sandbox_limits *lim, char *why, size_t why_n,
                  struct smelt_error *err);

struct sandbox_result {
    bool ok;                             /* score holds grade()'s number */
    double score;
    char error[SANDBOX_MESSAGE_BYTES];   /* why not ("" when ok) */
};

/* grade() of source on requests[0..n) (each a compact JSON object {"sample": {...},
 * "item": {...}} without newlines; borrowed) into out[0..n), every one written. 0, or a
 * negative code with err when sandboxes cannot be started at all (fork, pipes, no free
 * uid); the samples' own failures are in out. */
int sandbox_grade(const char *source, const struct sandbox_limits *lim, const char *const *requests, int n,
                  struct sandbox_result *out, struct smelt_error *err);

/* ---- one sandbox process (sandbox.c), for sandbox_grade ---- */

struct sandbox_proc {
    pid_t pid;          /* bwrap, leader of its own process group; 0 when none */
    int in_fd;          /* the runner's stdin (a socket: writes never raise SIGPIPE) */
    int out_fd;         /* the runner's result lines */
    int err_fd;         /* everything the code prints */
    int init_fd;        /* a pidfd of the sandbox's init (pid 1 of its namespace); -1 unknown */
    int claim_fd;       /* holds the uid claim; -1 when the caller is not root */
    uid_t uid;          /* what the sandbox runs as */
};

/* Starts bwrap + the runner with timeout_s (the runner's timer) and cpu_s (RLIMIT_CPU).
 * Our ends of the pipes are non-blocking and close-on-exec. */
int sandbox_spawn(const struct sandbox_host *host, const struct sandbox_limits *lim, double cpu_s,
                  struct sandbox_proc *p, struct smelt_error *err);
/* Ends the sandbox: closes the runner's stdin (it exits at end of file), and with
 * kill_now (or when it has not ended 2 s later) SIGKILLs the sandbox's init, which takes
 * every process of its namespace with it; drains its output to end of file, reaps bwrap
 * (which reaps the init, which waited for the rest) and releases the uid: when this
 * returns no process of the sandbox exists. *status: bwrap's wait status (NULL: not
 * wanted). Safe on a stopped or never started proc. */
void sandbox_stop(struct sandbox_proc *p, bool kill_now, int *status);

/* The runner, Python source (sandbox_runner.c). */
extern const char SANDBOX_RUNNER[];

#endif
