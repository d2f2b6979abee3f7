/* Small file utilities. Buffers returned to the caller are malloc'd; the caller free()s. */
#ifndef SMELT_COMMON_FILE_H
#define SMELT_COMMON_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

/* Reads a whole file. *out is NUL-terminated (not counted in *len); caller frees. */
int file_read_all(const char *path, char **out, size_t *len, struct smelt_error *err);

/* Writes through a temporary file in the same folder, fsyncs, then renames over path, so
 * a reader sees the old content or the new, never a torn file. */
int file_write_atomic(const char *path, const void *data, size_t len, struct smelt_error *err);

/* The same, streamed: open a temporary beside path, write any number of pieces, then
 * commit (fsync, mode 0644, rename over path) or abort (remove the temporary). Every
 * failure aborts by itself, so after an error only the error needs handling. */
struct file_atomic {
    int fd;
    char *tmp_path; /* malloc'd; NULL once committed or aborted */
    const char *path; /* borrowed */
};
int file_atomic_open(struct file_atomic *f, const char *path, struct smelt_error *err);
int file_atomic_write(struct file_atomic *f, const void *data, size_t len,
                      struct smelt_error *err);
int file_atomic_commit(struct file_atomic *f, struct smelt_error *err);
void file_atomic_abort(struct file_atomic *f);

/* mkdir -p with mode 0755. */
int dir_create_all(const char *path, struct smelt_error *err);

/* rm -rf without following symbolic links (a link is removed, not its target).
 * A missing path is SMELT_OK. */
int dir_remove_all(const char *path, struct smelt_error *err);

/* Puts the directory src at dst, where an existing dst (a previous checkpoint) is
 * replaced only now, once src is complete: the two are swapped in one rename
 * (renameat2 RENAME_EXCHANGE) and the old one, now at src, removed. Where the file
 * system cannot swap, dst moves to "<src>.old" first and comes back if src cannot
 * follow. Either way a failure leaves dst as it was. */
int dir_replace(const char *src, const char *dst, struct smelt_error *err);

bool path_exists(const char *path);
bool path_is_dir(const char *path);

/* dst = a + "/" + b; SMELT_EINVAL when it does not fit in dst_bytes. */
int path_join(char *dst, size_t dst_bytes, const char *a, const char *b,
              struct smelt_error *err);

/* A read-only memory map of a whole file. Empty files map to data == NULL, len == 0. */
struct file_map {
    const unsigned char *data;
    size_t len;
};
int file_map_open(const char *path, struct file_map *map, struct smelt_error *err);
void file_map_close(struct file_map *map);

#endif
