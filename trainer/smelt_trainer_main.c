/* smelt-trainer: runs one job spec to the end (or until SIGTERM/SIGINT, which
 * checkpoint after the current step so the job can resume).
 *
 *   smelt-trainer --spec job.json [--resume [latest|CHECKPOINT_DIR]] [--stop-after-step N] [--quiet]
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
#include "trainer/trainer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-trainer --spec job.json [--resume [latest|CHECKPOINT_DIR]] [--stop-after-step N] [--quiet]\n"
               "  runs an SFT, DPO, reward-model or GRPO job (its \"type\"; docs/job-spec.md); metrics go\n"
               "  to stdout and OUTPUT_DIR/metrics.jsonl\n");
}

/* The exit status of a failed run, by its error's code (common/error.h): I/O and device
 * failures (a dead or silent rollout worker is SMELT_EIO) are the run's, not the job's. */
static int failure_status(int code) {
    return code == SMELT_EIO || code == SMELT_EBACKEND ? 3 : 1;
}

static void on_signal(int sig) {
    (void)sig;
    trainer_request_stop();
}

/* One run per job directory at a time: a retry started while the previous run is still
 * writing its last checkpoint waits for it to exit (the kernel drops the lock when a
 * process ends, however it ends). 1: locked (held until exit); else the exit status. */
static int take_job_lock(const char *output_dir) {
    struct smelt_error err = {0};
    if (dir_create_all(output_dir, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 1;
    }
    char lock_path[JOB_PATH_BYTES + 16];
    snprintf(lock_path, sizeof lock_path, "%s/.lock", output_dir);
    int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
        fprintf(stderr, "smelt-trainer: %s: %s\n", lock_path, strerror(errno));
        return 1;
    }
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        log_info("another run of this job (%s) is still running; waiting for it to exit", output_dir);
        if (flock(lock_fd, LOCK_EX) != 0) {
            log_info("stopped while waiting for the previous run");
            close(lock_fd);
            return 0;
        }
    }
    return 1;
}

/* --ranks N without --rank: this process starts the N ranks (launch.c) with its own
 * arguments less --ranks N, and exits as they did. */
static int find_arg(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return i;
    return 0;
}

static int run_launcher(int argc, char **argv, int at) {
    struct smelt_error err = {0};
    int64_t ranks = 0, timeout = 0;
    int spec_at = find_arg(argc, argv, "--spec"), timeout_at = find_arg(argc, argv, "--comm-timeout-ms");
    if (at + 1 >= argc || args_int("--ranks", argv[at + 1], 1, TRAINER_MAX_RANKS, &ranks, &err) ||
        (timeout_at && (timeout_at + 1 >= argc ||
                        args_int("--comm-timeout-ms", argv[timeout_at + 1], 1, INT32_MAX, &timeout, &err)))) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message[0] ? err.message : "--ranks needs a value");
        return 2;
    }
    if (find_arg(argc, argv, "--rendezvous") || find_arg(argc, argv, "--no-lock") || !spec_at || spec_at + 1 >= argc) {
        fprintf(stderr, "smelt-trainer: --ranks without --rank starts the ranks itself: give --spec, and not "
                        "--rendezvous or --no-lock (those are for ranks started by someone else)\n");
        return 2;
    }
    struct job_spec spec;
    if (job_spec_load(argv[spec_at + 1], &spec, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 1;
    }
    int locked = take_job_lock(spec.output_dir);
    if (locked != 1) return locked;
    const char *args[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) {
        if (i == at) i++; /* --ranks N: each rank gets its own */
        else args[n++] = argv[i];
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0 || argc > 64) {
        fprintf(stderr, "smelt-trainer: %s\n", len <= 0 ? "cannot find this program (/proc/self/exe)" : "too many arguments");
        return 2;
    }
    exe[len] = 0;
    struct trainer_launch l = {.program = exe, .args = args, .n_args = n, .ranks = (int)ranks,
                               .output_dir = spec.output_dir, .comm_timeout_ms = (int)timeout};
    int status = 3;
    if (trainer_launch_ranks(&l, &status, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return err.code == SMELT_EINVAL ? 2 : 3;
    }
    return status;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv);
    int ranks_at = find_arg(argc, argv, "--ranks");
    /* --ranks 1 is one process: no launcher. */
    if (ranks_at && !find_arg(argc, argv, "--rank") && !(ranks_at + 1 < argc && strcmp(argv[ranks_at + 1], "1") == 0))
        return run_launcher(argc, argv, ranks_at);
    const char *spec_path = NULL, *resume = NULL;
    struct trainer_options o = {0};
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
    o.resume = resume;
    struct job_spec spec;
    if (job_spec_load(spec_path, &spec, &err)) {
        fprintf(stderr, "smelt-trainer: %s\n", err.message);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int locked = take_job_lock(spec.output_dir);
    if (locked != 1) return locked;
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
    if (res.accuracy_examples > 0)
        printf("accuracy: %.4f (%lld held-out examples, greedy exact match)\n", res.accuracy,
               (long long)res.accuracy_examples);
    printf("output: %s\n", res.output);
    return 0;
}
