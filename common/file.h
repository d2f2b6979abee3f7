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

/* mkdir -p with mode 0755. */
int dir_create_all(const char *path, struct smelt_error *err);

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
