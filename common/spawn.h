/* common/spawn.h — starting child processes, shared by every process starter
 * (smelt-agent's workers, the trainer's rollout workers, the trainer's local ranks):
 * fork + execve of an argv array prepared before the fork (never a shell), environment
 * entries, descriptors above stdio, and writes that are safe between fork and exec.
 *
 * Everything a child needs is built by the parent first, so the child makes only
 * async-signal-safe calls: other threads (OpenMP's, ZeroMQ's, libmicrohttpd's) may hold
 * locks (malloc's among them) at fork time. */
#ifndef SMELT_COMMON_SPAWN_H
#define SMELT_COMMON_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Whether entry ("NAME=value") sets variable name. */
bool env_entry_is(const char *entry, const char *name);
/* "name=value", malloc'd (the caller frees it), or NULL when out of memory. */
char *env_entry(const char *name, const char *value);
/* open() with O_CLOEXEC and the descriptor above stderr, so a child's dup2 onto 0..2
 * never clobbers it; -1 with errno set on failure. */
int open_above_stdio(const char *path, int flags, mode_t mode);
/* Writes s to fd whole, retrying on EINTR; async-signal-safe (for a forked child). */
void fd_write_str(int fd, const char *s);

/* What a child gets. The strings and arrays are borrowed until spawn_start returns. */
struct spawn_plan {
    const char *const *argv;  /* argv[0]: the program's path (execve: no PATH search) */
    char *const *envp;
    const char *workdir;      /* NULL: the parent's */
    int in_fd, out_fd, err_fd; /* become 0, 1, 2; -1: inherited */
    bool own_group;           /* a process group of its own (setpgid in child and parent) */
    int death_signal;         /* sent to the child when its parent dies (PR_SET_PDEATHSIG) */
    const char *who;          /* prefix of the child's messages when exec fails ("smelt-agent") */
    pid_t parent;             /* spawn_plan_init's: the death-signal check compares getppid() */
    int max_fd;               /* close_range's fallback */
    int pass_fd;              /* -1, or a descriptor above stdio the child keeps open at its
                               * number (close-on-exec cleared): common/secret_fd.h's pipe */
};
/* argv and envp as given; no workdir, fds inherited, no fd passed, same group, death
 * signal SIGTERM, who "smelt". */
void spawn_plan_init(struct spawn_plan *p, const char *const *argv, char *const *envp);
/* Forks and execs. The child: default signal mask and handlers (a worker must see
 * SIGTERM), its fds, its group, PR_SET_PDEATHSIG death_signal (a parent killed outright
 * leaves no child behind; a child whose parent is already gone stops), workdir,
 * every other descriptor closed, execve; any failure is written to its fd 2 and it
 * exits 127. Returns the child's pid, or -1 with errno set when fork failed. */
pid_t spawn_start(const struct spawn_plan *p);

/* The environment of this process for a child that runs on device entry `device`: the
 * agent gives a job its devices as CUDA_VISIBLE_DEVICES / SMELT_CPU_SLOT lists ("0,1,2"),
 * so each list is narrowed to its entry `device`, followed by its entries from `also_from`
 * on (-1: none) — devices the child hands on to children of its own (trainer rank 0's
 * rollout workers) — and passed whole when it has no entry `device` (a process started
 * by hand). OPENBLAS_CORETYPE is set to blas_kernels (NULL or "unknown": left as it is) so
 * the child computes with the parent's GEMM kernels. malloc'd; free with
 * spawn_envp_free. NULL when out of memory. */
char **spawn_envp_for_device(int device, int also_from, const char *blas_kernels);
void spawn_envp_free(char **envp);
/* Puts entry ("NAME=value", malloc'd: taken, freed with the array or here on failure)
 * into *envp (a malloc'd array such as spawn_envp_for_device's, reallocated), replacing
 * an entry of the same name. false when out of memory (*envp is then unchanged). */
bool spawn_envp_put(char ***envp, char *entry);
/* Entry k of a comma list into out; false when the list has no (non-empty, fitting) entry k. */
bool spawn_list_entry(const char *list, int k, char *out, size_t cap);
/* How a child ended, from its wait status ("exited with status 3", "was killed by signal
 * 9 (SIGKILL)"); -1: it was reaped elsewhere. */
void spawn_describe_status(int status, char *out, size_t cap);

#endif
