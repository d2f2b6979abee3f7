/* smelt-trainer: runs one job spec to the end (or until SIGTERM/SIGINT, which
 * checkpoint after the current step so the job can resume).
 *
 *   smelt-trainer --spec job.json [--resume [latest|CHECKPOINT_DIR]] [--stop-after-step N] [--quiet]
 *                 [--ranks N [--comm-timeout-ms MS] [--rendezvous smeltd:ENDPOINT]]
 *                 [--rank R --ranks N --rendezvous file:DIR|smeltd:ENDPOINT [--run-id ID]
 *                  [--comm-timeout-ms MS] [--no-lock]]
 *
 * --ranks N > 1 without --rank: this process starts the N data-parallel ranks of the job on
 * this machine and watches them (launch.c; docs/distributed.md), holding the job
 * directory's lock. With --rank R it is one of those ranks (started by the launcher, or by
 * someone else with the same arguments but --rank): rank 0 writes the job directory and
 * takes its lock unless --no-lock (the launcher holds it); the others write nothing and
 * log only errors.
 *
 * Keys: a trainer launched by smeltd gets its job's CURVE keys through an inherited pipe
 * (common/secret_fd.h), read first thing; rank 0 hands them to its rollout workers, whose
 * channel then admits only them (docs/security.md "Job channels"). Started by hand (no
 * SMELT_SECRETS_FD) it runs with plain sockets, as before.
 *
 * Exit status: 0 finished (or stopped cleanly), 1 the job failed on its input (spec, data,
 * model: running it again cannot help), 2 bad usage, 3 the run failed against its
 * surroundings (a rollout worker lost, a read or write, a device: a new attempt from the
 * last checkpoint may succeed, and smeltd retries it within the job's max_retries). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "common/curve.h"
#include "trainer/trainer.h"

/* The job's keys from the launch (present false without), for the whole run. */
static struct curve_job_keys job_keys;

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-trainer --spec job.json [--resume [latest|CHECKPOINT_DIR]] [--stop-after-step N] [--quiet]\n"
               "                     [--ranks N [--comm-timeout-ms MS] [--rendezvous smeltd:ENDPOINT]]\n"
               "                     [--rank R --ranks N --rendezvous file:DIR|smeltd:ENDPOINT [--run-id ID]\n"
               "                      [--comm-timeout-ms MS] [--no-lock]]\n"
               "  runs an SFT, DPO, reward-model or GRPO job (its \"type\"; docs/job-spec.md); metrics go\n"
               "  to stdout and OUTPUT_DIR/metrics.jsonl. --ranks N > 1 alone: starts and watches the N\n"
               "  data-parallel ranks here; with --rank R: this process is rank R of N, meeting the others\n"
               "  through the rendezvous (docs/distributed.md)\n");
}

/* The exit status of a failed run, by its error's code (common/error.h): I/O and device
 * failures (a dead or silent rollout worker is SMELT_EIO) are the run's, not the job's. */
static int failure_status(int code) {
    return code == SMELT_EIO || code == SMELT_EBACKEND ? 3 : 1;
}

static bool is_rank_option(const char *a) {
    return strcmp(a, "--rank") == 0 || strcmp(a, "--ranks") == 0 || strcmp(a, "--rendezvous") == 0 ||
           strcmp(a, "--run-id") == 0 || strcmp(a, "--comm-timeout-ms") == 0;
}

/* --rank, --ranks, --rendezvous, --run-id, --comm-timeout-ms. */
static int rank_option(const char *a, const char *value, struct trainer_options *o, struct smelt_error *err) {
    int64_t n;
    if (strcmp(a, "--rendezvous") == 0) {
        o->rendezvous = value;
    } else if (strcmp(a, "--run-id") == 0) {
        o->run_id = value;
    } else if (strcmp(a, "--rank") == 0) {
        TRY(args_int(a, value, 0, 65535, &n, err));
        o->rank = (int)n;
    } else if (strcmp(a, "--ranks") == 0) {
        TRY(args_int(a, value, 1, 65536, &n, err));
        o->ranks = (int)n;
    } else {
        TRY(args_int(a, value, 1, INT32_MAX, &n, err));
        o->comm_timeout_ms = (int)n;
    }
    return SMELT_OK;
}

/* The rank options together: what can be told before the spec is read. */
static int check_ranks(const struct trainer_options *o, struct smelt_error *err) {
    int ranks = o->ranks > 0 ? o->ranks : 1;
    if (o->rank >= ranks) return error_set(err, SMELT_EINVAL, "--rank %d: not below --ranks %d", o->rank, ranks);
    if (ranks > 1 && !o->rendezvous)
        return error_set(err, SMELT_EINVAL, "--ranks %d needs --rendezvous file:DIR (where the ranks meet)", ranks);
    return SMELT_OK;
}

static void on_signal(int sig) {
    (void)sig;
    trainer_request_stop();
}

/* Takes output_dir/.lock (waiting for a previous run); *fd -2 when a signal ended the wait. */
static int lock_job_dir(const char *output_dir, int *fd) {
    struct smelt_error err = {0};
    if (dir_create_all(output_dir, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return -1;
    }
    char lock_path[JOB_PATH_BYTES + 16];
    snprintf(lock_path, sizeof lock_path, "%s/.lock", output_dir);
    *fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) {
        fprintf(stderr, "smelt-trainer: %s: %s\n", lock_path, strerror(errno));
        return -1;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return 0;
    log_info("another run of this job (%s) is still running; waiting for it to exit", output_dir);
    if (flock(*fd, LOCK_EX) == 0) return 0;
    log_info("stopped while waiting for the previous run");
    close(*fd);
    *fd = -2;
    return -1;
}

/* --ranks N without --rank: this process starts the N ranks (launch.c) with its own
 * arguments less --ranks N, and exits as they did. */
static int find_arg(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return i;
    return 0;
}

static int launcher_options(int argc, char **argv, int at, int64_t *ranks, int64_t *timeout) {
    struct smelt_error err = {0};
    int spec_at = find_arg(argc, argv, "--spec"), timeout_at = find_arg(argc, argv, "--comm-timeout-ms");
    if (at + 1 >= argc || args_int("--ranks", argv[at + 1], 1, TRAINER_MAX_RANKS, ranks, &err) ||
        (timeout_at && (timeout_at + 1 >= argc ||
                        args_int("--comm-timeout-ms", argv[timeout_at + 1], 1, INT32_MAX, timeout, &err)))) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message[0] ? err.message : "--ranks needs a value");
        return 2;
    }
    int rdzv_at = find_arg(argc, argv, "--rendezvous");
    bool rdzv_ok = !rdzv_at || (rdzv_at + 1 < argc && strncmp(argv[rdzv_at + 1], "smeltd:", 7) == 0);
    if (!rdzv_ok || find_arg(argc, argv, "--no-lock") ||
        find_arg(argc, argv, "--run-id") || !spec_at || spec_at + 1 >= argc || argc > 64) {
        fprintf(stderr, "smelt-trainer: --ranks without --rank starts the ranks itself: give --spec (and at most 60 "
                        "arguments), and not --run-id, --no-lock or a --rendezvous other than smeltd:ENDPOINT (those "
                        "are for ranks started by someone else)\n");
        return 2;
    }
    return 0;
}

/* First of all: the descriptor and its variable must reach no child (ranks, rollout
 * workers, graders); the keys go on only where this program hands them. */
static int take_job_keys(void) {
    struct smelt_error err = {0};
    if (curve_job_keys_take(&job_keys, &err) == 0) return 0;
    fprintf(stderr, "smelt-trainer: %s\n", err.message);
    return 2;
}

static int run_launcher(int argc, char **argv, int at) {
    struct smelt_error err = {0};
    int64_t ranks = 0, timeout = 0;
    int rc = launcher_options(argc, argv, at, &ranks, &timeout);
    if (rc) return rc;
    struct job_spec spec;
    if (job_spec_load(argv[find_arg(argc, argv, "--spec") + 1], &spec, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 1;
    }
    int lock_fd = -1;
    if (lock_job_dir(spec.output_dir, &lock_fd) != 0) return lock_fd == -2 ? 0 : 1;
    const char *args[64];
    int n = 0;
    int rdzv_at = find_arg(argc, argv, "--rendezvous");
    for (int i = 1; i < argc; i++) {
        if (i == at || i == rdzv_at) i++; /* --ranks N, --rendezvous S: each rank gets them with its --rank */
        else args[n++] = argv[i];
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        fprintf(stderr, "smelt-trainer: cannot find this program (/proc/self/exe)\n");
        return 2;
    }
    exe[len] = 0;
    struct trainer_launch l = {.program = exe, .args = args, .n_args = n, .ranks = (int)ranks,
                               .output_dir = spec.output_dir, .comm_timeout_ms = timeout ? (int)timeout : trainer_comm_timeout_ms(&spec),
                               .job_keys = &job_keys, .rendezvous = rdzv_at ? argv[rdzv_at + 1] : NULL};
    int status = 3;
    if (trainer_launch_ranks(&l, &status, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return err.code == SMELT_EINVAL ? 2 : 3;
    }
    return status;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv); /* may re-execute this program: the keys' pipe survives it */
    if (take_job_keys()) return 2;
    /* First of all: a stop that comes while the job directory's lock is awaited, or while
     * a rank is still starting, is a stop, not a death (the lock's wait then ends). */
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* --ranks 1 is one process: no launcher. */
    int ranks_at = find_arg(argc, argv, "--ranks");
    if (ranks_at && !find_arg(argc, argv, "--rank") && !(ranks_at + 1 < argc && strcmp(argv[ranks_at + 1], "1") == 0))
        return run_launcher(argc, argv, ranks_at);
    bool no_lock = false;
    const char *spec_path = NULL, *resume = NULL;
    struct trainer_options o = {.job_keys = &job_keys};
    struct smelt_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--spec") == 0 && i + 1 < argc) {
            spec_path = argv[++i];
        } else if (strcmp(a, "--resume") == 0) {
            resume = (i + 1 < argc && argv[i + 1][0] != '-') ? argv[++i] : "latest";
        } else if (strcmp(a, "--stop-after-step") == 0 && i + 1 < argc) {
            int64_t n;
            if (args_int("--stop-after-step", argv[++i], 1, INT64_MAX, &n, &err)) {
                fprintf(stderr, "smelt-trainer: %s\n", err.message);
                return 2;
            }
            o.stop_after_step = n;
        } else if (strcmp(a, "--quiet") == 0) {
            o.quiet = true;
        } else if (strcmp(a, "--no-lock") == 0) {
            no_lock = true;
        } else if (is_rank_option(a) && i + 1 < argc) {
            if (rank_option(a, argv[++i], &o, &err)) {
                fprintf(stderr, "smelt-trainer: %s\n", err.message);
                return 2;
            }
        } else {
            fprintf(stderr, "smelt-trainer: unknown or incomplete argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!spec_path) {
        usage(stderr);
        return 2;
    }
    if (check_ranks(&o, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 2;
    }
    if (o.rank > 0) log_set_level(LOG_LEVEL_ERROR); /* rank 0 reports for all */
    o.resume = resume;
    struct job_spec spec;
    if (job_spec_load(spec_path, &spec, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 1;
    }
    /* One run per job directory at a time (rank 0's lock: the other ranks write nothing
     * there): a retry started while the previous worker is still writing its last
     * checkpoint waits for it to exit (the kernel drops the lock when a process ends,
     * however it ends). */
    int lock_fd = -1;
    if (o.rank == 0 && !no_lock && lock_job_dir(spec.output_dir, &lock_fd) != 0) return lock_fd == -2 ? 0 : 1;
    struct trainer_result res;
    int rc = trainer_run(&spec, &o, &res, &err);
    if (rc) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return failure_status(rc);
    }
    if (res.stopped) {
        log_info("stopped at step %lld", (long long)res.steps);
        return 0;
    }
    if (o.rank > 0) return 0;
    if (res.accuracy_examples > 0)
        printf("accuracy: %.4f (%lld held-out examples, greedy exact match)\n", res.accuracy,
               (long long)res.accuracy_examples);
    printf("output: %s\n", res.output);
    return 0;
}
