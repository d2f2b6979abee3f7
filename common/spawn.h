/* common/spawn.h — small pieces every process starter shares (smelt-agent's workers,
 * the trainer's rollout workers): environment entries, descriptors above stdio, and a
 * write that is safe between fork and exec. */
#ifndef SMELT_COMMON_SPAWN_H
#define SMELT_COMMON_SPAWN_H

#include <stdbool.h>
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

#endif
