#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

int file_read_all(const char *path, char **out, size_t *len, struct smelt_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_set(err, SMELT_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return error_set(err, SMELT_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, SMELT_EIO, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return error_set(err, SMELT_ENOMEM, "%s: cannot allocate %zu bytes", path, size + 1);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return error_set(err, SMELT_EIO, "%s: read failed: %s", path, strerror(e));
        }
        got += (size_t)n;
    }
    close(fd);
    buf[size] = '\0';
    *out = buf;
    if (len) *len = size;
    return SMELT_OK;
}

static int write_fully(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int file_atomic_open(struct file_atomic *f, const char *path, struct smelt_error *err) {
    size_t n = strlen(path);
    f->fd = -1;
    f->path = path;
    f->tmp_path = malloc(n + 16);
    if (!f->tmp_path) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    snprintf(f->tmp_path, n + 16, "%s.tmpXXXXXX", path);
    f->fd = mkstemp(f->tmp_path);
    if (f->fd < 0) {
        int e = errno;
        free(f->tmp_path);
        f->tmp_path = NULL;
        return error_set(err, SMELT_EIO, "%s: cannot create temporary file: %s", path, strerror(e));
    }
    return SMELT_OK;
}

void file_atomic_abort(struct file_atomic *f) {
    if (!f->tmp_path) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp_path);
    free(f->tmp_path);
    f->tmp_path = NULL;
    f->fd = -1;
}

int file_atomic_write(struct file_atomic *f, const void *data, size_t len,
                      struct smelt_error *err) {
    if (!f->tmp_path) return error_set(err, SMELT_EINVAL, "%s: file is not open", f->path);
    if (write_fully(f->fd, data, len) != 0) {
        int e = errno;
        file_atomic_abort(f);
        return error_set(err, SMELT_EIO, "%s: write failed: %s", f->path, strerror(e));
    }
    return SMELT_OK;
}

int file_atomic_commit(struct file_atomic *f, struct smelt_error *err) {
    if (!f->tmp_path) return error_set(err, SMELT_EINVAL, "%s: file is not open", f->path);
    /* mkstemp makes the file 0600; the mode is set before fsync so it is durable too. */
    if (fchmod(f->fd, 0644) != 0 || fsync(f->fd) != 0) {
        int e = errno;
        file_atomic_abort(f);
        return error_set(err, SMELT_EIO, "%s: write failed: %s", f->path, strerror(e));
    }
    int closed = close(f->fd);
    f->fd = -1;
    if (closed != 0 || rename(f->tmp_path, f->path) != 0) {
        int e = errno;
        file_atomic_abort(f);
        return error_set(err, SMELT_EIO, "%s: cannot replace file: %s", f->path, strerror(e));
    }
    free(f->tmp_path);
    f->tmp_path = NULL;
    return SMELT_OK;
}

int file_write_atomic(const char *path, const void *data, size_t len, struct smelt_error *err) {
    struct file_atomic f;
    int rc = file_atomic_open(&f, path, err);
    if (!rc) rc = file_atomic_write(&f, data, len, err);
    if (!rc) rc = file_atomic_commit(&f, err);
    return rc;
}

int dir_create_all(const char *path, struct smelt_error *err) {
    size_t n = strlen(path);
    if (n == 0) return error_set(err, SMELT_EINVAL, "empty directory path");
    char *buf = strdup(path);
    if (!buf) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            free(buf);
            return error_set(err, SMELT_EIO, "%s: cannot create directory: %s", path, strerror(e));
        }
        buf[i] = saved;
    }
    free(buf);
    if (!path_is_dir(path))
        return error_set(err, SMELT_EIO, "%s: exists and is not a directory", path);
    return SMELT_OK;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) ? errno : 0;
}

int dir_remove_all(const char *path, struct smelt_error *err) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? SMELT_OK : error_set(err, SMELT_EIO, "%s: %s", path, strerror(errno));
    int rc = nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc) return error_set(err, SMELT_EIO, "%s: cannot remove: %s", path, strerror(rc > 0 ? rc : errno));
    return SMELT_OK;
}

static int replace_error(const char *src, const char *dst, int e, struct smelt_error *err) {
    return error_set(err, SMELT_EIO, "cannot put %s at %s: %s", src, dst, strerror(e));
}

/* The replaced directory goes; dst is already the new one, so a failure here is only logged. */
static int leftover_remove(const char *path) {
    struct smelt_error err = {0};
    if (dir_remove_all(path, &err)) log_error("file: a replaced directory stays: %s", err.message);
    return SMELT_OK;
}

/* dir_replace where renameat2 cannot swap: dst aside, src in, the old one removed. */
static int replace_in_steps(const char *src, const char *dst, struct smelt_error *err) {
    char old[4096];
    if (snprintf(old, sizeof old, "%s.old", src) >= (int)sizeof old)
        return error_set(err, SMELT_EINVAL, "path too long: %s.old", src);
    TRY(dir_remove_all(old, err));
    if (rename(dst, old) != 0) return replace_error(dst, old, errno, err);
    if (rename(src, dst) != 0) {
        int e = errno;
        if (rename(old, dst) != 0) log_error("file: %s stays at %s: %s", dst, old, strerror(errno));
        return replace_error(src, dst, e, err);
    }
    return leftover_remove(old);
}

int dir_replace(const char *src, const char *dst, struct smelt_error *err) {
    if (renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_NOREPLACE) == 0) return SMELT_OK;
    if (errno == EEXIST) {
        if (renameat2(AT_FDCWD, src, AT_FDCWD, dst, RENAME_EXCHANGE) == 0) return leftover_remove(src);
        if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) return replace_error(src, dst, errno, err);
        return replace_in_steps(src, dst, err);
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) return replace_error(src, dst, errno, err);
    if (!path_exists(dst)) return rename(src, dst) == 0 ? SMELT_OK : replace_error(src, dst, errno, err);
    return replace_in_steps(src, dst, err);
}

bool path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int path_join(char *dst, size_t dst_bytes, const char *a, const char *b,
              struct smelt_error *err) {
    size_t la = strlen(a);
    bool slash = la > 0 && a[la - 1] != '/';
    int n = snprintf(dst, dst_bytes, "%s%s%s", a, slash ? "/" : "", b);
    if (n < 0 || (size_t)n >= dst_bytes)
        return error_set(err, SMELT_EINVAL, "path too long: %s/%s", a, b);
    return SMELT_OK;
}

int file_map_open(const char *path, struct file_map *map, struct smelt_error *err) {
    map->data = NULL;
    map->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_set(err, SMELT_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, SMELT_EIO, "%s: not a readable regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return SMELT_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return error_set(err, SMELT_EIO, "%s: mmap failed: %s", path, strerror(e));
    map->data = p;
    map->len = (size_t)st.st_size;
    return SMELT_OK;
}

void file_map_close(struct file_map *map) {
    if (map->data) munmap((void *)map->data, map->len);
    map->data = NULL;
    map->len = 0;
}
