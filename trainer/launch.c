/* smelt-trainer --ranks N without --rank: this process starts the N ranks of one job on
 * this machine and watches them, as torchrun does (trainer.h, trainer_launch_ranks).
 *
 * Each rank is this program again (fork + execve, common/spawn.h) with the same
 * arguments and --rank R --ranks N --rendezvous STORE --no-lock. STORE is smeltd's
 * rendezvous when smeltd started the job (`--rendezvous smeltd:ENDPOINT`: scoped to the
 * attempt whose keys every rank gets), else file:DIR, a fresh folder under the job's
 * output_dir, so a new attempt never meets an old attempt's addresses.
 * The ranks stay in this process's group: a stop meant for the group (the agent's
 * SIGTERM, a terminal's ^C) reaches every rank, and the ranks agree to stop after the same
 * step. A signal sent to this process alone is passed on to the ranks. Rank R runs on
 * entry R of the CUDA_VISIBLE_DEVICES / SMELT_CPU_SLOT lists the agent gives the job;
 * rank 0 also gets the entries after the ranks' (an RL job's rollout workers, started by
 * rank 0), after its own.
 *
 * A rank that fails makes the others fail too, within the communicator's timeout, each
 * naming it (comm/). This process waits that long for them; a rank still there after
 * twice the timeout (a stopped one, say) is killed, and so is a rank that is stopped
 * while every other has ended. Nothing is left behind: a launcher killed outright takes
 * its ranks down with it (PR_SET_PDEATHSIG SIGKILL: a rank must not write the job
 * directory once the lock this process held is gone). */
#include "trainer/trainer.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "common/curve.h"

#define WATCH_MS 20
/* After a failure: the others' timeout twice over (their own, and the fault report's
 * grace), plus time to write their error and exit. */
#define EXIT_SLACK_MS 5000

enum rank_state { RANK_RUNNING, RANK_STOPPED, RANK_ENDED };

struct rank_proc {
    pid_t pid;
    enum rank_state state;
    int status;
    bool killed;   /* SIGKILL sent by this process */
};

static atomic_int pending_signal;

static void on_signal(int sig) { atomic_store(&pending_signal, sig); }

/* The arguments of rank `rank`: the program, the launcher's own arguments, then this
 * rank's place. text holds the numbers. */
static const char **rank_argv(const struct trainer_launch *l, int rank, const char *store, char (*text)[32]) {
    const char **argv = calloc((size_t)l->n_args + 12, sizeof *argv);
    if (!argv) return NULL;
    int n = 0;
    argv[n++] = l->program;
    for (int i = 0; i < l->n_args; i++) argv[n++] = l->args[i];
    snprintf(text[0], 32, "%d", rank);
    snprintf(text[1], 32, "%d", l->ranks);
    const char *extra[] = {"--rank", text[0], "--ranks", text[1], "--rendezvous", store, "--no-lock"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    return argv;
}

static int start_rank(const struct trainer_launch *l, int rank, const char *store, struct rank_proc *p,
                      struct smelt_error *err) {
    char text[2][32];
    const char **argv = rank_argv(l, rank, store, text);
    /* Rank R runs on entry R; rank 0 also gets the entries after the ranks': an RL job's
     * rollout workers, which it starts. */
    char **envp = spawn_envp_for_device(rank, rank == 0 ? l->ranks : -1, backend_cpu_blas_kernels());
    int rc = SMELT_OK, keys_fd = -1;
    if (!argv || !envp) rc = error_set(err, SMELT_ENOMEM, "launch: out of memory");
    /* The job's keys to every rank: each shows them to smeltd's rendezvous; rank 0 also
     * runs the job's channels with them. */
    if (!rc) rc = error_wrap(err, curve_job_keys_for_child(l->job_keys, &envp, &keys_fd, err),
                             "launch: rank %d's keys", rank);
    if (!rc) {
        struct spawn_plan plan;
        spawn_plan_init(&plan, argv, envp);
        plan.pass_fd = keys_fd;
        plan.who = "smelt-trainer";
        /* Not SIGTERM: a rank told to stop would go on writing the job directory (its last
         * checkpoint) after this process, and with it the directory's lock, is gone, while
         * a retry may already hold the lock. */
        plan.death_signal = SIGKILL;
        *p = (struct rank_proc){.pid = spawn_start(&plan), .state = RANK_RUNNING};
        if (p->pid < 0) rc = error_set(err, SMELT_EIO, "launch: starting rank %d: %s", rank, strerror(errno));
    }
    if (keys_fd >= 0) close(keys_fd);
    free(argv);
    spawn_envp_free(envp);
    return rc;
}

/* Looks at rank i without blocking; true when its state changed. */
static bool poll_rank(struct rank_proc *p) {
    if (p->state == RANK_ENDED) return false;
    int status = 0;
    pid_t got = waitpid(p->pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (got < 0 && errno == ECHILD) {
        *p = (struct rank_proc){.pid = p->pid, .state = RANK_ENDED, .status = -1};
        return true;
    }
    if (got != p->pid) return false;
    enum rank_state before = p->state;
    if (WIFSTOPPED(status)) p->state = RANK_STOPPED;
    else if (WIFCONTINUED(status)) p->state = RANK_RUNNING;
    else {
        p->state = RANK_ENDED;
        p->status = status;
    }
    return p->state != before || p->state == RANK_ENDED;
}

static bool failed(const struct rank_proc *p) {
    return p->state == RANK_ENDED && !(p->status != -1 && WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0);
}

/* The launcher's exit status for a failed rank: its own, or 3 (the run failed against
 * its surroundings: a retry from the last checkpoint may succeed) when it did not exit. */
static int exit_status_of(const struct rank_proc *p) {
    return p->status != -1 && WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 3;
}

struct watch {
    struct rank_proc *procs;
    int n;
    int first_failed;          /* -1: none yet */
    int64_t kill_at;           /* after a failure: when the rest are killed */
};

static void pass_on_signal(struct watch *w) {
    int sig = atomic_exchange(&pending_signal, 0);
    if (!sig) return;
    for (int i = 0; i < w->n; i++)
        if (w->procs[i].state != RANK_ENDED) kill(w->procs[i].pid, sig);
}

static void note_changes(struct watch *w, int64_t timeout_ms) {
    for (int i = 0; i < w->n; i++) {
        struct rank_proc *p = &w->procs[i];
        if (!poll_rank(p) || !failed(p)) continue;
        char how[96];
        spawn_describe_status(p->status, how, sizeof how);
        if (w->first_failed < 0) {
            w->first_failed = i;
            w->kill_at = mono_ms() + 2 * timeout_ms + EXIT_SLACK_MS;
            log_error("launch: rank %d (pid %d) %s; the other ranks stop within the communicator's timeout "
                      "(%lld ms)", i, (int)p->pid, how, (long long)timeout_ms);
        } else {
            log_info("launch: rank %d (pid %d) %s", i, (int)p->pid, how);
        }
    }
}

/* Whether the ranks left are to be killed now: after a failure, once the time is up; and
 * whenever every rank left is stopped while the others have ended (nothing can wake it:
 * its peers are gone). */
static bool kill_rest_now(const struct watch *w) {
    if (w->first_failed >= 0 && mono_ms() >= w->kill_at) return true;
    bool any_stopped = false, any_ended = false;
    for (int i = 0; i < w->n; i++) {
        if (w->procs[i].state == RANK_RUNNING) return false;
        any_stopped |= w->procs[i].state == RANK_STOPPED;
        any_ended |= w->procs[i].state == RANK_ENDED;
    }
    return any_stopped && any_ended;
}

static int ranks_left(const struct watch *w) {
    int left = 0;
    for (int i = 0; i < w->n; i++) left += w->procs[i].state != RANK_ENDED;
    return left;
}

static int watch_ranks(struct watch *w, int64_t timeout_ms) {
    while (ranks_left(w) > 0) {
        pass_on_signal(w);
        note_changes(w, timeout_ms);
        if (kill_rest_now(w)) {
            for (int i = 0; i < w->n; i++) {
                struct rank_proc *p = &w->procs[i];
                if (p->state == RANK_ENDED || p->killed) continue;
                log_error("launch: rank %d (pid %d) is still there %s; killing it", i, (int)p->pid,
                          p->state == RANK_STOPPED ? "and stopped" : "after the others failed");
                if (w->first_failed < 0) w->first_failed = i; /* a rank killed here failed the run */
                kill(p->pid, SIGKILL);
                p->killed = true;
            }
            w->kill_at = INT64_MAX;
        }
        if (ranks_left(w) > 0) sleep_ms(WATCH_MS);
    }
    return w->first_failed < 0 ? 0 : exit_status_of(&w->procs[w->first_failed]);
}

/* A fresh rendezvous folder for this launch: output_dir/rendezvous/<pid>. */
static int make_store_dir(const struct trainer_launch *l, char *dir, size_t cap, struct smelt_error *err) {
    char name[32];
    snprintf(name, sizeof name, "rendezvous/%d", (int)getpid());
    TRY(path_join(dir, cap, l->output_dir, name, err));
    TRY(dir_remove_all(dir, err));
    return dir_create_all(dir, err);
}

static void catch_signals(void) {
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int trainer_launch_ranks(const struct trainer_launch *l, int *exit_status, struct smelt_error *err) {
    if (l->ranks < 2 || l->ranks > TRAINER_MAX_RANKS)
        return error_set(err, SMELT_EINVAL, "--ranks: %d is not between 2 and %d", l->ranks, TRAINER_MAX_RANKS);
    char dir[JOB_PATH_BYTES + 64] = "", file_store[JOB_PATH_BYTES + 80];
    const char *store = l->rendezvous;
    if (!store) {
        TRY(make_store_dir(l, dir, sizeof dir, err));
        snprintf(file_store, sizeof file_store, "file:%s", dir);
        store = file_store;
    }
    struct rank_proc *procs = calloc((size_t)l->ranks, sizeof *procs);
    if (!procs) return error_set(err, SMELT_ENOMEM, "launch: out of memory");
    catch_signals();
    struct watch w = {.procs = procs, .n = 0, .first_failed = -1, .kill_at = INT64_MAX};
    int rc = SMELT_OK;
    for (int r = 0; r < l->ranks && !rc; r++) {
        rc = start_rank(l, r, store, &procs[r], err);
        if (!rc) w.n++;
    }
    if (rc)
        for (int i = 0; i < w.n; i++) kill(procs[i].pid, SIGKILL);
    else log_info("launch: %d ranks started (pids %d..%d), rendezvous %s", l->ranks, (int)procs[0].pid,
                  (int)procs[l->ranks - 1].pid, store);
    int64_t timeout = l->comm_timeout_ms > 0 ? l->comm_timeout_ms : TRAINER_COMM_TIMEOUT_MS;
    int status = watch_ranks(&w, timeout);
    free(procs);
    struct smelt_error ignore = {0};
    if (dir[0]) dir_remove_all(dir, &ignore);
    if (rc) return rc;
    *exit_status = status;
    return SMELT_OK;
}
