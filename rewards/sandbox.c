/* One sandbox process: finding bwrap and python, claiming a uid, the bwrap command line,
 * fork + execve with the limits set in between, and stopping it with nothing left
 * behind. sandbox_internal.h describes the sandbox; sandbox_pool.c drives batches.
 *
 * The child between fork and execve runs only system calls (the caller may have other
 * threads, so no malloc or stdio there): everything it needs, the argv included, is
 * built before fork. A failing step in the child is written to a close-on-exec pipe as
 * (step, errno), so the caller's message names it; end of file on that pipe means
 * execve worked. */
#include "rewards/sandbox_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the host's programs ---- */

static bool find_on_path(const char *name, char *out, size_t n) {
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        if (d[0] != '/') continue; /* a relative PATH entry would depend on the cwd */
        if ((size_t)snprintf(out, n, "%s/%s", d, name) < n && access(out, X_OK) == 0) return true;
    }
    return false;
}

int sandbox_host_find(struct sandbox_host *host, struct smelt_error *err) {
    if (!find_on_path("bwrap", host->bwrap, sizeof host->bwrap))
        return error_set(err, SMELT_EUNSUPPORTED,
                         "python graders run in a bubblewrap sandbox, and bwrap is not installed on this machine "
                         "(apt-get install bubblewrap; smelt never runs them unsandboxed)");
    char real[PATH_MAX];
    if (!realpath("/usr/bin/python3", real))
        return error_set(err, SMELT_EUNSUPPORTED, "python graders need /usr/bin/python3 (apt-get install python3): %s",
                         strerror(errno));
    /* The sandbox sees /usr only: a python3 that resolves elsewhere could not start in it. */
    if (strncmp(real, "/usr/", 5) != 0 || strlen(real) >= sizeof host->python)
        return error_set(err, SMELT_EUNSUPPORTED, "/usr/bin/python3 resolves to %.200s, outside /usr, which is all the "
                         "sandbox sees", real);
    memcpy(host->python, real, strlen(real) + 1);
    return SMELT_OK;
}

/* ---- a uid of the sandbox's own (root callers) ---- */

static int uid_range(uid_t *first, uid_t *count, struct smelt_error *err) {
    *first = SANDBOX_UID_FIRST;
    *count = SANDBOX_UID_COUNT;
    const char *env = getenv("SMELT_SANDBOX_UIDS");
    if (!env || !*env) return SMELT_OK;
    char *end;
    errno = 0;
    unsigned long a = strtoul(env, &end, 10), b = a;
    if (*end == '-') b = strtoul(end + 1, &end, 10);
    if (errno || *end || a == 0 || b < a || b >= 0xFFFFFFFEul)
        return error_set(err, SMELT_EINVAL, "SMELT_SANDBOX_UIDS=\"%.60s\": expected FIRST-LAST, two uids above 0",
                         env);
    *first = (uid_t)a;
    *count = (uid_t)(b - a + 1);
    return SMELT_OK;
}

/* Binds the abstract socket "smelt-sandbox-uid-<uid>" for the first free uid of the
 * range: the kernel releases it when the holder closes it or dies, so a claim never
 * outlives its sandbox and needs no file. */
static int claim_uid(struct sandbox_proc *p, struct smelt_error *err) {
    uid_t first, count;
    TRY(uid_range(&first, &count, err));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return error_set(err, SMELT_EBACKEND, "sandbox: socket (uid claim): %s", strerror(errno));
    for (uid_t k = 0; k < count; k++) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int len = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "smelt-sandbox-uid-%u", (unsigned)(first + k));
        if (bind(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) == 0) {
            p->claim_fd = fd;
            p->uid = first + k;
            return SMELT_OK;
        }
        if (errno != EADDRINUSE) {
            int e = errno;
            close(fd);
            return error_set(err, SMELT_EBACKEND, "sandbox: bind (uid claim): %s", strerror(e));
        }
    }
    close(fd);
    return error_set(err, SMELT_EBACKEND, "sandbox: every sandbox uid (%u-%u) is in use", (unsigned)first,
                     (unsigned)(first + count - 1));
}

/* ---- the command line ---- */

#define MAX_ARGS 96
#define ARG_BYTES 4096

struct argv_builder {
    char *argv[MAX_ARGS];
    int n;
    char text[ARG_BYTES]; /* numbers and link targets */
    size_t used;
    bool full;
};

static void arg(struct argv_builder *b, const char *s) {
    if (b->n >= MAX_ARGS - 1) {
        b->full = true;
        return;
    }
    b->argv[b->n++] = (char *)s;
    b->argv[b->n] = NULL;
}

/* A formatted argument stored in b->text. */
static void argf(struct argv_builder *b, const char *fmt, long long v) {
    int len = snprintf(b->text + b->used, sizeof b->text - b->used, fmt, v);
    if (len < 0 || (size_t)len >= sizeof b->text - b->used) {
        b->full = true;
        return;
    }
    arg(b, b->text + b->used);
    b->used += (size_t)len + 1;
}

static void arg_copy(struct argv_builder *b, const char *s) {
    size_t len = strlen(s);
    if (len >= sizeof b->text - b->used) {
        b->full = true;
        return;
    }
    memcpy(b->text + b->used, s, len + 1);
    arg(b, b->text + b->used);
    b->used += len + 1;
}

/* /bin, /lib, ... as the host has them: a link (merged /usr) is the same link, a real
 * folder a read-only bind; absent, nothing. */
static void host_dir(struct argv_builder *b, const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) return;
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t len = readlink(dir, target, sizeof target - 1);
        if (len <= 0) return;
        target[len] = '\0';
        arg(b, "--symlink");
        arg_copy(b, target);
        arg(b, dir);
    } else if (S_ISDIR(st.st_mode)) {
        arg(b, "--ro-bind");
        arg(b, dir);
        arg(b, dir);
    }
}

static int build_argv(const struct sandbox_host *host, const struct sandbox_limits *lim, struct argv_builder *b,
                      struct smelt_error *err) {
    static const char *const head[] = {
        "--info-fd", "4", /* bwrap writes the sandbox's init pid there */
        /* The runner is pid 1 of the namespace: bwrap, its parent, reaps it and only then
         * exits (with an init of bwrap's own in between, bwrap exits as soon as the init
         * reports the runner's end, and the init is left to the host's init to reap). */
        "--as-pid-1",
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "OPENBLAS_NUM_THREADS", "1",
        "--setenv", "MKL_NUM_THREADS", "1", "--ro-bind", "/usr", "/usr", NULL};
    static const char *const tail[] = {
        /* numpy's BLAS is found through /etc/alternatives links; ld.so.cache speeds loading */
        "--ro-bind-try", "/etc/alternatives", "/etc/alternatives", "--ro-bind-try", "/etc/ld.so.cache",
        "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--perms", "1777", NULL};
    static const char *const dirs[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", NULL};
    arg(b, host->bwrap);
    for (int k = 0; head[k]; k++) arg(b, head[k]);
    for (int k = 0; dirs[k]; k++) host_dir(b, dirs[k]);
    for (int k = 0; tail[k]; k++) arg(b, tail[k]);
    arg(b, "--size");
    argf(b, "%lld", SANDBOX_TMP_BYTES);
    arg(b, "--tmpfs");
    arg(b, "/tmp");
    arg(b, "--remount-ro");
    arg(b, "/");
    arg(b, "--chdir");
    arg(b, "/tmp");
    arg(b, "--");
    arg(b, host->python);
    arg(b, "-I"); /* no user site, no PYTHON* variables, no cwd on sys.path */
    arg(b, "-B");
    arg(b, "-c");
    arg(b, SANDBOX_RUNNER);
    char t[32];
    snprintf(t, sizeof t, "%.3f", lim->timeout_s);
    arg_copy(b, t);
    argf(b, "%lld", SANDBOX_MAX_PROCS);
    if (b->full) return error_set(err, SMELT_EBACKEND, "sandbox: the bwrap command line is too long");
    return SMELT_OK;
}

/* ---- the child ---- */

enum child_step { STEP_SETPGID, STEP_DUP, STEP_RLIMIT, STEP_SETGROUPS, STEP_SETGID, STEP_SETUID, STEP_PDEATHSIG,
                  STEP_EXEC };
static const char *const STEP_NAMES[] = {"setpgid", "dup2", "setrlimit", "setgroups", "setresgid", "setresuid",
                                         "prctl(PR_SET_PDEATHSIG)", "execve(bwrap)"};

struct child_plan {
    char *const *argv;
    int fds[5];             /* stdin, stdout, stderr, the error pipe, bwrap's info pipe */
    struct rlimit limits[6];
    int resources[6];
    int n_limits;
    bool switch_uid;
    uid_t uid;
    pid_t parent;
};

static int report_fd = -1; /* the error pipe, in the child: its first number, then 3 */

_Noreturn static void child_fail(int step) {
    int rec[2] = {step, errno};
    ssize_t w = write(report_fd, rec, sizeof rec);
    (void)w;
    _exit(127);
}

static void close_from(int first) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)first, ~0u, 0u) == 0) return;
#endif
    struct rlimit r;
    int max = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < 1048576
                  ? (int)r.rlim_cur : 65536;
    for (int fd = first; fd < max; fd++) close(fd);
}

/* Moves the five descriptors to 0..4 (through copies above 9, so none is overwritten
 * before it is moved) and closes every other: nothing of the caller's (sockets, job
 * files) reaches the sandbox. */
static void child_fds(const struct child_plan *c) {
    int high[5];
    report_fd = c->fds[3];
    for (int k = 0; k < 5; k++)
        if ((high[k] = fcntl(c->fds[k], F_DUPFD, 10)) < 0) child_fail(STEP_DUP);
    if (dup2(high[3], 3) < 0 || fcntl(3, F_SETFD, FD_CLOEXEC) < 0) child_fail(STEP_DUP);
    report_fd = 3;
    for (int k = 0; k < 5; k++)
        if (k != 3 && dup2(high[k], k) < 0) child_fail(STEP_DUP);
    close_from(5);
}

_Noreturn static void child_run(const struct child_plan *c) {
    static char *const empty_env[] = {NULL};
    child_fds(c);
    if (setpgid(0, 0) != 0) child_fail(STEP_SETPGID);
    for (int k = 0; k < c->n_limits; k++)
        if (setrlimit(c->resources[k], &c->limits[k]) != 0) child_fail(STEP_RLIMIT);
    if (c->switch_uid) {
        if (setgroups(0, NULL) != 0) child_fail(STEP_SETGROUPS);
        if (setresgid(c->uid, c->uid, c->uid) != 0) child_fail(STEP_SETGID);
        if (setresuid(c->uid, c->uid, c->uid) != 0) child_fail(STEP_SETUID);
    }
    /* After the uid change, which clears it: bwrap dies with its caller. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) child_fail(STEP_PDEATHSIG);
    if (getppid() != c->parent) _exit(127);
    execve(c->argv[0], c->argv, empty_env);
    child_fail(STEP_EXEC);
}

static void add_limit(struct child_plan *c, int resource, rlim_t soft, rlim_t hard) {
    c->resources[c->n_limits] = resource;
    c->limits[c->n_limits++] = (struct rlimit){.rlim_cur = soft, .rlim_max = hard};
}

static void plan_limits(struct child_plan *c, const struct sandbox_limits *lim, double cpu_s) {
    rlim_t cpu = (rlim_t)ceil(cpu_s);
    add_limit(c, RLIMIT_AS, (rlim_t)lim->memory_mb << 20, (rlim_t)lim->memory_mb << 20);
    add_limit(c, RLIMIT_CPU, cpu, cpu + 1); /* SIGXCPU, then SIGKILL a second later */
    add_limit(c, RLIMIT_NOFILE, SANDBOX_MAX_FILES, SANDBOX_MAX_FILES);
    add_limit(c, RLIMIT_FSIZE, (rlim_t)SANDBOX_TMP_BYTES, (rlim_t)SANDBOX_TMP_BYTES);
    add_limit(c, RLIMIT_CORE, 0, 0);
    /* Counted per real uid: only meaningful for a uid of the sandbox's own (the runner
     * sets it again inside the user namespace, which covers the other case). */
    if (c->switch_uid) add_limit(c, RLIMIT_NPROC, SANDBOX_MAX_PROCS, SANDBOX_MAX_PROCS);
}

/* ---- spawning ---- */

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static void release(struct sandbox_proc *p) {
    close_fd(&p->in_fd);
    close_fd(&p->out_fd);
    close_fd(&p->err_fd);
    close_fd(&p->init_fd);
    close_fd(&p->claim_fd);
    p->pid = 0;
}

/* The parent's and the child's ends: stdin a socket pair (send with MSG_NOSIGNAL), the
 * rest pipes, all close-on-exec (the child moves its own). ours: stdin, stdout, stderr
 * (non-blocking), the error pipe, the info pipe. */
static int make_channels(int ours[5], int theirs[5], struct smelt_error *err) {
    int all[10];
    for (int k = 0; k < 10; k++) all[k] = -1;
    int rc = SMELT_OK;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, all) != 0)
        rc = error_set(err, SMELT_EBACKEND, "sandbox: socketpair: %s", strerror(errno));
    for (int k = 1; k < 5 && !rc; k++) /* pipe k: read end all[2k] (ours), write end all[2k+1] */
        if (pipe2(all + 2 * k, O_CLOEXEC) != 0) rc = error_set(err, SMELT_EBACKEND, "sandbox: pipe2: %s", strerror(errno));
    for (int k = 0; k < 3 && !rc; k++)
        if (fcntl(all[2 * k], F_SETFL, O_NONBLOCK) != 0)
            rc = error_set(err, SMELT_EBACKEND, "sandbox: fcntl(O_NONBLOCK): %s", strerror(errno));
    if (rc) {
        for (int k = 0; k < 10; k++)
            if (all[k] >= 0) close(all[k]);
        return rc;
    }
    for (int k = 0; k < 5; k++) ours[k] = all[2 * k], theirs[k] = all[2 * k + 1];
    return SMELT_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* bwrap's --info-fd JSON, {"child-pid": N, ...}: a pidfd of the sandbox's init (pid 1 of
 * its namespace) in p->init_fd, so that stopping kills it and no reused pid. Without
 * one (bwrap failed before its namespace existed) sandbox_stop kills the group. */
static void read_init_pid(struct sandbox_proc *p, int info_r) {
    char buf[512];
    size_t n = 0;
    double deadline = now_s() + SANDBOX_START_S;
    while (n < sizeof buf - 1 && !memchr(buf, '}', n)) {
        struct pollfd pf = {.fd = info_r, .events = POLLIN};
        double left = deadline - now_s();
        if (left <= 0 || (poll(&pf, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR)) break;
        ssize_t got = read(info_r, buf + n, sizeof buf - 1 - n);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) break;
        if (got > 0) n += (size_t)got;
    }
    close(info_r);
    buf[n] = '\0';
    const char *at = strstr(buf, "\"child-pid\":");
    long pid = at ? strtol(at + 12, NULL, 10) : 0;
#ifdef SYS_pidfd_open
    if (pid > 1) p->init_fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#endif
}

/* What the child reported: nothing (execve worked) or its failing step. */
static int child_report(struct sandbox_proc *p, int errpipe_r, struct smelt_error *err) {
    int rec[2];
    ssize_t got;
    do got = read(errpipe_r, rec, sizeof rec);
    while (got < 0 && errno == EINTR);
    close(errpipe_r);
    if (got == 0) return SMELT_OK;
    int status;
    while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {
    }
    release(p);
    if (got != (ssize_t)sizeof rec || rec[0] < 0 || rec[0] > STEP_EXEC)
        return error_set(err, SMELT_EBACKEND, "sandbox: the child failed before starting bwrap");
    return error_set(err, SMELT_EBACKEND, "sandbox: %s failed in the child: %s", STEP_NAMES[rec[0]],
                     strerror(rec[1]));
}

int sandbox_spawn(const struct sandbox_host *host, const struct sandbox_limits *lim, double cpu_s,
                  struct sandbox_proc *p, struct smelt_error *err) {
    *p = (struct sandbox_proc){.in_fd = -1, .out_fd = -1, .err_fd = -1, .init_fd = -1, .claim_fd = -1,
                               .uid = getuid()};
    struct argv_builder *b = calloc(1, sizeof *b);
    if (!b) return error_set(err, SMELT_ENOMEM, "sandbox: out of memory");
    struct child_plan c = {.switch_uid = geteuid() == 0, .parent = getpid()};
    int rc = build_argv(host, lim, b, err);
    if (!rc && c.switch_uid) rc = claim_uid(p, err);
    int ours[5], theirs[5];
    if (!rc) rc = make_channels(ours, theirs, err);
    if (rc) {
        close_fd(&p->claim_fd);
        free(b);
        return rc;
    }
    c.argv = b->argv;
    c.uid = p->uid;
    memcpy(c.fds, theirs, sizeof theirs);
    plan_limits(&c, lim, cpu_s);
    p->in_fd = ours[0], p->out_fd = ours[1], p->err_fd = ours[2];
    pid_t pid = fork();
    if (pid == 0) child_run(&c);
    int fork_errno = errno;
    for (int k = 0; k < 5; k++) close(theirs[k]);
    free(b);
    if (pid < 0) {
        close(ours[3]);
        close(ours[4]);
        release(p);
        return error_set(err, SMELT_EBACKEND, "sandbox: fork: %s", strerror(fork_errno));
    }
    p->pid = pid;
    rc = child_report(p, ours[3], err);
    if (rc) close(ours[4]);
    else read_init_pid(p, ours[4]);
    return rc;
}

/* ---- stopping ---- */

/* Reads fds until end of file on both (every writer gone) or the deadline. */
static void drain(int *fds, int n, double deadline) {
    char buf[4096];
    for (;;) {
        struct pollfd pf[2];
        int m = 0;
        for (int k = 0; k < n; k++)
            if (fds[k] >= 0) pf[m++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
        double left = deadline - now_s();
        if (m == 0 || left <= 0) return;
        int r = poll(pf, (nfds_t)m, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return;
        for (int k = 0; k < n; k++) {
            if (fds[k] < 0) continue;
            ssize_t got = read(fds[k], buf, sizeof buf);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) close_fd(&fds[k]);
        }
    }
}

/* The sandbox's init, pid 1 of its namespace: when it dies the kernel kills every other
 * process of the namespace and waits for them, and bwrap, its parent, reaps it and
 * exits. Killing bwrap instead would leave the init to the host's init to reap. */
static void kill_init(struct sandbox_proc *p) {
#ifdef SYS_pidfd_send_signal
    if (p->init_fd >= 0 && syscall(SYS_pidfd_send_signal, p->init_fd, SIGKILL, NULL, 0) == 0) return;
#endif
    kill(-p->pid, SIGKILL); /* no init known: the group (bwrap's --die-with-parent does the rest) */
}

/* Waits for bwrap until the deadline; false when it is still running. */
static bool reap_until(struct sandbox_proc *p, double deadline, int *status) {
    for (;;) {
        pid_t r = waitpid(p->pid, status, WNOHANG);
        if (r == p->pid || (r < 0 && errno != EINTR)) return true;
        if (now_s() >= deadline) return false;
        usleep(2000);
    }
}

void sandbox_stop(struct sandbox_proc *p, bool kill_now, int *status) {
    int st = 0;
    if (p->pid > 0) {
        close_fd(&p->in_fd); /* the runner's end of file: it exits */
        if (kill_now) kill_init(p);
        int fds[2] = {p->out_fd, p->err_fd};
        p->out_fd = p->err_fd = -1;
        drain(fds, 2, now_s() + 2.0);
        close_fd(&fds[0]);
        close_fd(&fds[1]);
        if (!reap_until(p, now_s() + 2.0, &st)) {
            kill_init(p);
            if (!reap_until(p, now_s() + 2.0, &st)) {
                kill(-p->pid, SIGKILL);
                while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
                }
            }
        }
    }
    if (status) *status = st;
    release(p);
}
