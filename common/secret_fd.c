/* Secrets through an inherited pipe (common/secret_fd.h). */
#include "common/secret_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/spawn.h"

int secret_pipe_new(const json_t *secret, int *read_fd, struct smelt_error *err) {
    *read_fd = -1;
    char *text = json_dumps(secret, JSON_COMPACT);
    if (!text) return error_set(err, SMELT_ENOMEM, "secret: out of memory");
    size_t len = strlen(text);
    int fds[2], rc = 0;
    if (len > SECRET_FD_MAX_BYTES) rc = error_set(err, SMELT_EINVAL, "secret of %zu bytes (most %d)", len,
                                                  SECRET_FD_MAX_BYTES);
    else if (pipe2(fds, O_CLOEXEC) != 0) rc = error_set(err, SMELT_EIO, "pipe: %s", strerror(errno));
    else {
        /* Below PIPE_BUF the write is whole or not at all, and never blocks on an empty pipe. */
        ssize_t n;
        do n = write(fds[1], text, len);
        while (n < 0 && errno == EINTR);
        close(fds[1]);
        if (n != (ssize_t)len) {
            close(fds[0]);
            rc = error_set(err, SMELT_EIO, "secret pipe: write: %s", strerror(errno));
        } else if (fds[0] < 3) {
            /* above stdio, so a child's dup2 onto 0..2 never clobbers it */
            *read_fd = fcntl(fds[0], F_DUPFD_CLOEXEC, 3);
            close(fds[0]);
            if (*read_fd < 0) rc = error_set(err, SMELT_EIO, "secret pipe: fcntl: %s", strerror(errno));
        } else
            *read_fd = fds[0];
    }
    explicit_bzero(text, len);
    free(text);
    return rc;
}

int secret_fd_for_child(const json_t *secret, char ***envp, int *read_fd, struct smelt_error *err) {
    TRY(secret_pipe_new(secret, read_fd, err));
    char number[16];
    snprintf(number, sizeof number, "%d", *read_fd);
    if (spawn_envp_put(envp, env_entry(SECRET_FD_ENV, number))) return 0;
    close(*read_fd);
    *read_fd = -1;
    return error_set(err, SMELT_ENOMEM, "secret: out of memory");
}

static int fd_from_env(const char *value, int *fd, struct smelt_error *err) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || *end || end == value || v < 3 || v > INT_MAX)
        return error_set(err, SMELT_EINVAL, "%s=%s: not a descriptor number", SECRET_FD_ENV, value);
    *fd = (int)v;
    return 0;
}

int secret_fd_take(json_t **out, struct smelt_error *err) {
    *out = NULL;
    const char *value = getenv(SECRET_FD_ENV);
    if (!value) return 0;
    int fd = -1;
    int rc = fd_from_env(value, &fd, err);
    unsetenv(SECRET_FD_ENV);
    if (rc) return rc;
    char buf[SECRET_FD_MAX_BYTES + 1];
    size_t len = 0;
    while (!rc) {
        ssize_t n = read(fd, buf + len, sizeof buf - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = error_set(err, SMELT_EIO, "%s: read: %s", SECRET_FD_ENV, strerror(errno));
        else if (n == 0) break;
        else if ((len += (size_t)n) == sizeof buf)
            rc = error_set(err, SMELT_EINVAL, "%s: more than %d bytes", SECRET_FD_ENV, SECRET_FD_MAX_BYTES);
    }
    close(fd);
    if (!rc) {
        json_error_t jerr;
        *out = json_loadb(buf, len, 0, &jerr);
        if (!*out || !json_is_object(*out)) {
            json_decref(*out);
            *out = NULL;
            rc = error_set(err, SMELT_EFORMAT, "%s: not a JSON object", SECRET_FD_ENV);
        }
    }
    explicit_bzero(buf, sizeof buf);
    return rc;
}
