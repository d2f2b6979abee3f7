/* Shared by the process starters: see common/spawn.h. */
#include "common/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

bool env_entry_is(const char *entry, const char *name) {
    size_t len = strlen(name);
    return strncmp(entry, name, len) == 0 && entry[len] == '=';
}

char *env_entry(const char *name, const char *value) {
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (s) snprintf(s, len, "%s=%s", name, value);
    return s;
}

int open_above_stdio(const char *path, int flags, mode_t mode) {
    int fd = open(path, flags | O_CLOEXEC, mode);
    if (fd >= 0 && fd <= 2) {
        int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        int saved = errno;
        close(fd);
        errno = saved;
        fd = high;
    }
    return fd;
}

void fd_write_str(int fd, const char *s) {
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t n = write(fd, s, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        s += n;
        len -= (size_t)n;
    }
}

void spawn_plan_init(struct spawn_plan *p, const char *const *argv, char *const *envp) {
    long max_fd = sysconf(_SC_OPEN_MAX);
    *p = (struct spawn_plan){.argv = argv, .envp = envp, .in_fd = -1, .out_fd = -1, .err_fd = -1,
                             .death_signal = SIGTERM, .who = "smelt", .parent = getpid(), .pass_fd = -1,
                             .max_fd = max_fd > 0 && max_fd < 65536 ? (int)max_fd : 65536};
}

/* In the child: says what failed on fd 2, then exits 127. */
static _Noreturn void child_fail(const struct spawn_plan *p, const char *what, const char *path, int e) {
    const char *name = strerrorname_np(e), *desc = strerrordesc_np(e);
    const char *parts[] = {p->who, ": ", what, " ", path, ": ", name ? name : "error", " (",
                           desc ? desc : "unknown", ")\n"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) fd_write_str(2, parts[i]);
    _exit(127);
}

/* Closes every descriptor above stderr except keep (-1: none). */
static void close_fds_but(int keep, int max_fd) {
    if (keep < 3) {
        if (close_range(3, ~0U, 0) != 0)
            for (int fd = 3; fd < max_fd; fd++) close(fd);
        return;
    }
    if (keep > 3 && close_range(3, (unsigned)keep - 1, 0) != 0)
        for (int fd = 3; fd < keep; fd++) close(fd);
    if (close_range((unsigned)keep + 1, ~0U, 0) != 0)
        for (int fd = keep + 1; fd < max_fd; fd++) close(fd);
}

/* The child between fork and exec: async-signal-safe calls only. */
static _Noreturn void child_exec(const struct spawn_plan *p) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);
    const int fds[3] = {p->in_fd, p->out_fd, p->err_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0 && dup2(fds[i], i) < 0) _exit(127);
    if (p->own_group && setpgid(0, 0) != 0) child_fail(p, "setpgid", "0", errno);
    /* The death signal follows the thread that forked; if the parent is already gone it
     * will never come, so stop here. */
    if (prctl(PR_SET_PDEATHSIG, p->death_signal) != 0) child_fail(p, "prctl", "PR_SET_PDEATHSIG", errno);
    if (getppid() != p->parent) _exit(127);
    if (p->workdir && chdir(p->workdir) != 0) child_fail(p, "chdir", p->workdir, errno);
    close_fds_but(p->pass_fd, p->max_fd);
    if (p->pass_fd > 2 && fcntl(p->pass_fd, F_SETFD, 0) != 0) child_fail(p, "fcntl", "pass_fd", errno);
    execve(p->argv[0], (char *const *)p->argv, p->envp);
    child_fail(p, "execve", p->argv[0], errno);
}

pid_t spawn_start(const struct spawn_plan *p) {
    pid_t pid = fork();
    if (pid == 0) child_exec(p);
    /* Also in the parent, so a signal to the group sent before the child ran finds it
     * (EACCES once it has exec'd is fine). */
    if (pid > 0 && p->own_group) setpgid(pid, pid);
    return pid;
}

void spawn_envp_free(char **envp) {
    for (char **e = envp; e && *e; e++) free(*e);
    free(envp);
}

bool spawn_envp_put(char ***envp, char *entry) {
    const char *eq = entry ? strchr(entry, '=') : NULL;
    if (!eq) {
        free(entry);
        return false;
    }
    size_t n = 0, name_len = (size_t)(eq - entry);
    for (char **e = *envp; e && *e; e++, n++)
        if (strncmp(*e, entry, name_len + 1) == 0) { /* same name, '=' included */
            free(*e);
            *e = entry;
            return true;
        }
    char **grown = realloc(*envp, (n + 2) * sizeof *grown);
    if (!grown) {
        free(entry);
        return false;
    }
    grown[n] = entry;
    grown[n + 1] = NULL;
    *envp = grown;
    return true;
}

bool spawn_list_entry(const char *list, int k, char *out, size_t cap) {
    for (int i = 0; list; i++) {
        const char *comma = strchr(list, ',');
        size_t len = comma ? (size_t)(comma - list) : strlen(list);
        if (i == k) {
            if (len == 0 || len >= cap) return false;
            memcpy(out, list, len);
            out[len] = 0;
            return true;
        }
        list = comma ? comma + 1 : NULL;
    }
    return false;
}

static const char *const DEVICE_LISTS[] = {"CUDA_VISIBLE_DEVICES", "SMELT_CPU_SLOT"};
#define N_DEVICE_LISTS (sizeof DEVICE_LISTS / sizeof *DEVICE_LISTS)

/* "name=<entry device>[,<entries also_from..>]", or the whole list without an entry device. */
static char *device_entry(const char *name, int device, int also_from) {
    const char *list = getenv(name);
    char one[64], picked[512];
    if (!spawn_list_entry(list, device, one, sizeof one)) return env_entry(name, list);
    size_t n = (size_t)snprintf(picked, sizeof picked, "%s", one);
    for (int k = also_from; k >= 0 && spawn_list_entry(list, k, one, sizeof one) && n + strlen(one) + 2 < sizeof picked; k++)
        n += (size_t)snprintf(picked + n, sizeof picked - n, ",%s", one);
    return env_entry(name, picked);
}

char **spawn_envp_for_device(int device, int also_from, const char *blas_kernels) {
    extern char **environ;
    size_t n = 0;
    while (environ && environ[n]) n++;
    char **envp = calloc(n + N_DEVICE_LISTS + 2, sizeof *envp);
    if (!envp) return NULL;
    bool set_kernels = blas_kernels && strcmp(blas_kernels, "unknown") != 0;
    size_t k = 0;
    bool ok = true;
    for (size_t e = 0; ok && e < n; e++) {
        bool replaced = set_kernels && env_entry_is(environ[e], "OPENBLAS_CORETYPE");
        for (size_t d = 0; d < N_DEVICE_LISTS; d++) replaced |= env_entry_is(environ[e], DEVICE_LISTS[d]);
        if (!replaced) ok = (envp[k++] = strdup(environ[e])) != NULL;
    }
    for (size_t d = 0; ok && d < N_DEVICE_LISTS; d++)
        if (getenv(DEVICE_LISTS[d])) ok = (envp[k++] = device_entry(DEVICE_LISTS[d], device, also_from)) != NULL;
    if (ok && set_kernels) ok = (envp[k++] = env_entry("OPENBLAS_CORETYPE", blas_kernels)) != NULL;
    if (ok) return envp;
    spawn_envp_free(envp);
    return NULL;
}

void spawn_describe_status(int status, char *out, size_t cap) {
    if (status == -1) snprintf(out, cap, "ended (reaped elsewhere)");
    else if (WIFEXITED(status)) snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (SIG%s)", WTERMSIG(status),
                 sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
    else snprintf(out, cap, "ended (wait status %d)", status);
}
