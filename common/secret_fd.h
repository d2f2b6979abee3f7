/* common/secret_fd.h — handing a secret (a job's CURVE keys) to a child process through
 * an inherited pipe: never on a command line, in an environment value or in a file that
 * could outlive the handover (docs/security.md).
 *
 * The parent writes the secret into a pipe before forking, closes the write end, and the
 * child inherits the read end (struct spawn_plan's pass_fd) with SECRET_FD_ENV naming its
 * number; the child reads it once at start (secret_fd_take), which closes it and removes
 * the variable, so its own children inherit neither. */
#ifndef SMELT_COMMON_SECRET_FD_H
#define SMELT_COMMON_SECRET_FD_H

#include <jansson.h>

#include "common/error.h"

#define SECRET_FD_ENV "SMELT_SECRETS_FD"
/* The most a secret may hold: what a pipe buffers without a reader. */
#define SECRET_FD_MAX_BYTES 4096

/* Parent: a pipe holding secret (a JSON object, serialized here) whole; *read_fd is its read
 * end (close-on-exec in the parent: pass it with spawn_plan.pass_fd; the caller closes it
 * after spawning). */
int secret_pipe_new(const json_t *secret, int *read_fd, struct smelt_error *err);
/* Parent, for a child started with *envp (a malloc'd array such as spawn_envp_for_device's:
 * spawn_envp_put): secret_pipe_new, and SECRET_FD_ENV naming its read end put into *envp.
 * Pass *read_fd as spawn_plan.pass_fd and close it after spawning (-1 on failure). */
int secret_fd_for_child(const json_t *secret, char ***envp, int *read_fd, struct smelt_error *err);
/* Child: the JSON object from the descriptor SECRET_FD_ENV names, in *out (the caller
 * json_decrefs it; NULL when the variable is not set). The descriptor is closed and the
 * variable removed either way. */
int secret_fd_take(json_t **out, struct smelt_error *err);

#endif
