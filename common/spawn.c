/* Shared by the process starters: see common/spawn.h. */
#include "common/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
