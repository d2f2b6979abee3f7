/* Writing safetensors files (streamed through a temporary file and renamed into place)
 * and Hugging Face weight directories (one file, or shards plus an index). The layout
 * matches the reference writer so files compare byte for byte with its output. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Elements converted per write() when the file dtype differs from the memory dtype. */
#define CONVERT_CHUNK_ELEMS 65536

/* One tensor as it will be laid out in the file. */
struct item {
    const struct safetensors_tensor_desc *desc;
    enum safetensors_dtype file_dtype;
    uint64_t nbytes; /* in the file dtype */
};

static bool is_float_dtype(enum dtype d) {
    return d == DTYPE_F32 || d == DTYPE_BF16 || d == DTYPE_F16;
}

static int check_desc(const char *path, const struct safetensors_tensor_desc *d, size_t i,
                      uint64_t *nbytes, struct smelt_error *err) {
    if (!d->name || !d->name[0] || strcmp(d->name, "__metadata__") == 0)
        return error_set(err, SMELT_EINVAL, "%s: tensor #%zu: name must be non-empty and not "
                         "'__metadata__'", path, i);
    const struct tensor *t = &d->tensor;
    if (t->backend != BACKEND_CPU || t->ndim < 1 || t->ndim > TENSOR_MAX_DIMS)
        return error_set(err, SMELT_EINVAL,
                         "%s: tensor '%s': must be a host tensor of 1..%d dims", path, d->name,
                         TENSOR_MAX_DIMS);
    if ((unsigned)t->dtype >= DTYPE_COUNT || (unsigned)d->file_dtype >= DTYPE_COUNT)
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s': invalid dtype", path, d->name);
    bool floats = is_float_dtype(t->dtype) && is_float_dtype(d->file_dtype);
    bool ints = t->dtype == DTYPE_I32 && d->file_dtype == DTYPE_I32;
    if (!floats && !ints)
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s': cannot store %s data as %s", path,
                         d->name, dtype_name(t->dtype), dtype_name(d->file_dtype));
    uint64_t numel = 1;
    for (int k = 0; k < t->ndim; k++)
        if (t->shape[k] < 1 || __builtin_mul_overflow(numel, (uint64_t)t->shape[k], &numel))
            return error_set(err, SMELT_EINVAL, "%s: tensor '%s': invalid shape", path,
                             d->name);
    if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(d->file_dtype), nbytes) ||
        *nbytes > SIZE_MAX / 2)
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s': too large", path, d->name);
    if (!t->data)
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s': no data", path, d->name);
    return SMELT_OK;
}

static int name_ptr_cmp(const void *pa, const void *pb) {
    const struct safetensors_tensor_desc *a = *(const struct safetensors_tensor_desc *const *)pa;
    const struct safetensors_tensor_desc *b = *(const struct safetensors_tensor_desc *const *)pb;
    return strcmp(a->name, b->name);
}

/* Checks every desc and that names are unique. */
static int check_descs(const char *path, const struct safetensors_tensor_desc *tensors,
                       size_t n, struct smelt_error *err) {
    if (n > 0 && !tensors)
        return error_set(err, SMELT_EINVAL, "%s: tensors is NULL", path);
    uint64_t nbytes;
    for (size_t i = 0; i < n; i++) {
        int rc = check_desc(path, &tensors[i], i, &nbytes, err);
        if (rc) return rc;
    }
    const struct safetensors_tensor_desc **byname = malloc((n ? n : 1) * sizeof *byname);
    if (!byname) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) byname[i] = &tensors[i];
    qsort(byname, n, sizeof *byname, name_ptr_cmp);
    int rc = SMELT_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (strcmp(byname[i - 1]->name, byname[i]->name) == 0)
            rc = error_set(err, SMELT_EINVAL, "%s: tensor name '%s' appears twice", path,
                           byname[i]->name);
    free(byname);
    return rc;
}

/* The reference writer's order: file dtype descending (widest alignment first), then
 * name, so with an 8-aligned header every tensor is aligned to its element size. */
static int item_cmp(const void *pa, const void *pb) {
    const struct item *a = pa, *b = pb;
    if (a->file_dtype != b->file_dtype) return a->file_dtype > b->file_dtype ? -1 : 1;
    return strcmp(a->desc->name, b->desc->name);
}

static int metadata_json(const char *path, const struct safetensors_kv *md, size_t n,
                         json_t *header, struct smelt_error *err) {
    if (n == 0) return SMELT_OK;
    if (!md) return error_set(err, SMELT_EINVAL, "%s: metadata is NULL", path);
    json_t *m = json_object();
    if (!m || json_object_set_new(header, "__metadata__", m) != 0)
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        if (!md[i].key || !md[i].value)
            return error_set(err, SMELT_EINVAL, "%s: metadata entry %zu has a NULL key or value",
                             path, i);
        json_t *v = json_string(md[i].value);
        if (!v || json_object_set_new(m, md[i].key, v) != 0)
            return error_set(err, SMELT_EINVAL,
                             "%s: metadata '%s' is not valid UTF-8 (or out of memory)", path,
                             md[i].key);
    }
    return SMELT_OK;
}

static json_t *entry_json(const struct item *it, uint64_t begin) {
    json_t *e = json_object(), *shape = json_array(), *off = json_array();
    if (!e) {
        json_decref(shape);
        json_decref(off);
        return NULL;
    }
    /* set_new takes each value even when it fails, so nothing leaks on the error path;
     * the arrays are filled through borrowed pointers. Key order is the reference's. */
    int bad = json_object_set_new(e, "dtype", json_string(safetensors_dtype_name(it->file_dtype)));
    bad |= json_object_set_new(e, "shape", shape);
    bad |= json_object_set_new(e, "data_offsets", off);
    const struct tensor *t = &it->desc->tensor;
    for (int k = 0; k < t->ndim && !bad; k++)
        bad |= json_array_append_new(shape, json_integer((json_int_t)t->shape[k]));
    if (!bad) bad |= json_array_append_new(off, json_integer((json_int_t)begin));
    if (!bad) bad |= json_array_append_new(off, json_integer((json_int_t)(begin + it->nbytes)));
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* The header bytes, padded with spaces to a multiple of 8; *out is malloc'd. */
static int header_bytes(const char *path, const struct item *items, size_t n,
                        const struct safetensors_kv *md, size_t n_md, char **out,
                        size_t *len, struct smelt_error *err) {
    json_t *header = json_object();
    if (!header) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    int rc = metadata_json(path, md, n_md, header, err);
    uint64_t at = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *e = entry_json(&items[i], at);
        if (!e || json_object_set_new(header, items[i].desc->name, e) != 0)
            rc = error_set(err, SMELT_EINVAL,
                           "%s: tensor '%s': name is not valid UTF-8 (or out of memory)", path,
                           items[i].desc->name);
        at += items[i].nbytes;
    }
    char *s = rc ? NULL : json_dumps(header, JSON_COMPACT);
    json_decref(header);
    if (rc) return rc;
    if (!s) return error_set(err, SMELT_ENOMEM, "%s: cannot serialise the header", path);
    size_t n_s = strlen(s), pad = (8 - n_s % 8) % 8;
    char *buf = realloc(s, n_s + pad + 1);
    if (!buf) {
        free(s);
        return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    }
    memset(buf + n_s, ' ', pad);
    buf[n_s + pad] = '\0';
    *out = buf;
    *len = n_s + pad;
    return SMELT_OK;
}

/* Writes one tensor's bytes in its file dtype, converting a chunk at a time (ops_cast
 * rounds as every other cast in smelt does). */
static int write_tensor(struct file_atomic *f, const struct item *it, void *scratch,
                        struct smelt_error *err) {
    const struct tensor *t = &it->desc->tensor;
    enum dtype to = it->desc->file_dtype;
    if (t->dtype == to) return file_atomic_write(f, t->data, (size_t)it->nbytes, err);
    int64_t n = tensor_numel(t);
    for (int64_t at = 0; at < n; at += CONVERT_CHUNK_ELEMS) {
        int64_t m = n - at < CONVERT_CHUNK_ELEMS ? n - at : CONVERT_CHUNK_ELEMS;
        struct tensor src = tensor_make(BACKEND_CPU, t->dtype,
                                        (char *)t->data + (size_t)at * dtype_size(t->dtype), 1, &m);
        struct tensor dst = tensor_make(BACKEND_CPU, to, scratch, 1, &m);
        int rc = ops_cast(&dst, &src, err);
        if (!rc) rc = file_atomic_write(f, scratch, (size_t)m * dtype_size(to), err);
        if (rc) {
            file_atomic_abort(f);
            return rc;
        }
    }
    return SMELT_OK;
}

/* Streams header and tensors into a temporary beside path, then renames it over path. */
static int write_file(const char *path, const struct item *items, size_t n,
                      const char *header, size_t header_len, struct smelt_error *err) {
    void *scratch = malloc(CONVERT_CHUNK_ELEMS * sizeof(float));
    if (!scratch) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    struct file_atomic f;
    uint64_t n_le = header_len; /* little-endian host: the bytes are already LE */
    int rc = file_atomic_open(&f, path, err);
    if (!rc) rc = file_atomic_write(&f, &n_le, 8, err);
    if (!rc) rc = file_atomic_write(&f, header, header_len, err);
    for (size_t i = 0; i < n && !rc; i++) rc = write_tensor(&f, &items[i], scratch, err);
    if (!rc) rc = file_atomic_commit(&f, err);
    free(scratch);
    return rc;
}

int safetensors_write(const char *path, const struct safetensors_tensor_desc *tensors,
                      size_t n, const struct safetensors_kv *metadata, size_t n_metadata,
                      struct smelt_error *err) {
    if (!path) return error_set(err, SMELT_EINVAL, "safetensors_write: NULL path");
    int rc = check_descs(path, tensors, n, err);
    if (rc) return rc;
    struct item *items = malloc((n ? n : 1) * sizeof *items);
    if (!items) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        items[i].desc = &tensors[i];
        items[i].file_dtype = safetensors_dtype_from_dtype(tensors[i].file_dtype);
        items[i].nbytes = (uint64_t)tensor_numel(&tensors[i].tensor) *
                          dtype_size(tensors[i].file_dtype);
    }
    qsort(items, n, sizeof *items, item_cmp);
    char *header = NULL;
    size_t header_len = 0;
    rc = header_bytes(path, items, n, metadata, n_metadata, &header, &header_len, err);
    if (!rc) rc = write_file(path, items, n, header, header_len, err);
    free(header);
    free(items);
    return rc;
}

/* ---- model directories ----------------------------------------------------------- */

/* Packs tensors in order into shards of at most max_bytes; returns the shard count. */
static int assign_shards(const struct safetensors_tensor_desc *tensors, size_t n,
                         uint64_t max_bytes, int *shard_of, uint64_t *total) {
    int shard = 0;
    uint64_t in_shard = 0, bytes_seen = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = (uint64_t)tensor_numel(&tensors[i].tensor) * dtype_size(tensors[i].file_dtype);
        if (max_bytes > 0 && count > 0 && in_shard + b > max_bytes) {
            shard++;
            in_shard = 0;
            count = 0;
        }
        shard_of[i] = shard;
        in_shard += b;
        bytes_seen += b;
        count++;
    }
    *total = bytes_seen;
    return shard + 1;
}

static int remove_stale(const char *dir, const char *name, struct smelt_error *err) {
    char path[PATH_MAX];
    int rc = path_join(path, sizeof path, dir, name, err);
    if (rc) return rc;
    if (unlink(path) != 0 && errno != ENOENT)
        return error_set(err, SMELT_EIO, "%s: cannot remove stale file: %s", path,
                         strerror(errno));
    return SMELT_OK;
}

static void shard_file_name(char *buf, size_t bytes, int i, int n) {
    snprintf(buf, bytes, "model-%05d-of-%05d.safetensors", i + 1, n);
}

/* model.safetensors.index.json as transformers writes it (sorted keys, indent 2). */
static int write_index(const char *dir, const struct safetensors_tensor_desc *tensors,
                       size_t n, const int *shard_of, int n_shards, uint64_t total,
                       struct smelt_error *err) {
    char path[PATH_MAX];
    int rc = path_join(path, sizeof path, dir, SAFETENSORS_INDEX_FILE, err);
    if (rc) return rc;
    json_t *root = json_pack("{s:{s:I},s:{}}", "metadata", "total_size", (json_int_t)total,
                             "weight_map");
    if (!root) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    json_t *wm = json_object_get(root, "weight_map");
    for (size_t i = 0; i < n && !rc; i++) {
        char file[64];
        shard_file_name(file, sizeof file, shard_of[i], n_shards);
        if (json_object_set_new(wm, tensors[i].name, json_string(file)) != 0)
            rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    }
    if (!rc) rc = json_save_atomic(root, JSON_INDENT(2) | JSON_SORT_KEYS, path, err);
    json_decref(root);
    return rc;
}

static int write_shards(const char *dir, const struct safetensors_tensor_desc *tensors,
                        size_t n, const struct safetensors_kv *md, size_t n_md,
                        const int *shard_of, int n_shards, struct smelt_error *err) {
    struct safetensors_tensor_desc *group = malloc((n ? n : 1) * sizeof *group);
    if (!group) return error_set(err, SMELT_ENOMEM, "%s: out of memory", dir);
    int rc = SMELT_OK;
    for (int s = 0; s < n_shards && !rc; s++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (shard_of[i] == s) group[m++] = tensors[i];
        char file[64], path[PATH_MAX];
        shard_file_name(file, sizeof file, s, n_shards);
        rc = path_join(path, sizeof path, dir, file, err);
        if (!rc) rc = safetensors_write(path, group, m, md, n_md, err);
    }
    free(group);
    return rc;
}

int safetensors_write_dir(const char *dir, const struct safetensors_tensor_desc *tensors,
                          size_t n, const struct safetensors_kv *metadata,
                          size_t n_metadata, uint64_t max_shard_bytes,
                          struct smelt_error *err) {
    if (!dir) return error_set(err, SMELT_EINVAL, "safetensors_write_dir: NULL dir");
    int rc = check_descs(dir, tensors, n, err);
    if (!rc) rc = dir_create_all(dir, err);
    if (rc) return rc;
    int *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
    if (!shard_of) return error_set(err, SMELT_ENOMEM, "%s: out of memory", dir);
    uint64_t total = 0;
    int n_shards = assign_shards(tensors, n, max_shard_bytes, shard_of, &total);
    if (n_shards > 99999) {
        free(shard_of);
        return error_set(err, SMELT_EINVAL, "%s: %d shards exceed the 99999 a name can count",
                         dir, n_shards);
    }
    if (n_shards == 1) {
        char path[PATH_MAX];
        rc = path_join(path, sizeof path, dir, SAFETENSORS_SINGLE_FILE, err);
        if (!rc) rc = safetensors_write(path, tensors, n, metadata, n_metadata, err);
        if (!rc) rc = remove_stale(dir, SAFETENSORS_INDEX_FILE, err);
    } else {
        rc = write_shards(dir, tensors, n, metadata, n_metadata, shard_of, n_shards, err);
        if (!rc) rc = write_index(dir, tensors, n, shard_of, n_shards, total, err);
        if (!rc) rc = remove_stale(dir, SAFETENSORS_SINGLE_FILE, err);
    }
    free(shard_of);
    return rc;
}
