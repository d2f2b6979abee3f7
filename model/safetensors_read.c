/* Opening and validating safetensors files and shard indexes, lookup, and reading
 * tensors with dtype conversion. Every byte an entry points at is proven to lie inside
 * its file mapping before the entry is handed out (see safetensors.h). */
#include "model/safetensors.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors IO assumes a little-endian host (the format is little-endian)"
#endif

/* ---- dtypes ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_info[SAFETENSORS_DTYPE_COUNT] = {
    [SAFETENSORS_BOOL] = {"BOOL", 1},       [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_I8] = {"I8", 1},           [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
    [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1}, [SAFETENSORS_F8_E8M0] = {"F8_E8M0", 1},
    [SAFETENSORS_I16] = {"I16", 2},         [SAFETENSORS_U16] = {"U16", 2},
    [SAFETENSORS_F16] = {"F16", 2},         [SAFETENSORS_BF16] = {"BF16", 2},
    [SAFETENSORS_I32] = {"I32", 4},         [SAFETENSORS_U32] = {"U32", 4},
    [SAFETENSORS_F32] = {"F32", 4},         [SAFETENSORS_F64] = {"F64", 8},
    [SAFETENSORS_I64] = {"I64", 8},         [SAFETENSORS_U64] = {"U64", 8},
};

const char *safetensors_dtype_name(enum safetensors_dtype dtype) {
    return (unsigned)dtype < SAFETENSORS_DTYPE_COUNT ? dtype_info[dtype].name : "invalid-dtype";
}

size_t safetensors_dtype_size(enum safetensors_dtype dtype) {
    return (unsigned)dtype < SAFETENSORS_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

bool safetensors_dtype_to_dtype(enum safetensors_dtype dtype, enum dtype *out) {
    switch (dtype) {
    case SAFETENSORS_F32: *out = DTYPE_F32; return true;
    case SAFETENSORS_BF16: *out = DTYPE_BF16; return true;
    case SAFETENSORS_F16: *out = DTYPE_F16; return true;
    case SAFETENSORS_I32: *out = DTYPE_I32; return true;
    default: return false;
    }
}

enum safetensors_dtype safetensors_dtype_from_dtype(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_BF16: return SAFETENSORS_BF16;
    case DTYPE_F16: return SAFETENSORS_F16;
    case DTYPE_I32: return SAFETENSORS_I32;
    default: return SAFETENSORS_F32;
    }
}

static bool dtype_parse(const char *name, enum safetensors_dtype *out) {
    for (int i = 0; i < SAFETENSORS_DTYPE_COUNT; i++)
        if (strcmp(dtype_info[i].name, name) == 0) {
            *out = (enum safetensors_dtype)i;
            return true;
        }
    return false;
}

/* "[2, 3]" ("[]" for a scalar) into buf. */
static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t bytes) {
    size_t at = 0;
    at += (size_t)snprintf(buf, bytes, "[");
    for (int i = 0; i < ndim && at < bytes; i++)
        at += (size_t)snprintf(buf + at, bytes - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < bytes) snprintf(buf + at, bytes - at, "]");
    return buf;
}

/* ---- one file -------------------------------------------------------------------- */

/* An entry's byte range in its file's data region, for the tiling check. */
struct span {
    uint64_t begin, end;
    size_t entry;
};

static int parse_dims(const char *path, const char *name, const json_t *jshape,
                      enum safetensors_dtype dtype, struct safetensors_entry *e,
                      struct smelt_error *err) {
    if (!json_is_array(jshape))
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': 'shape' is missing or not an array", path, name);
    size_t nd = json_array_size(jshape);
    if (nd > TENSOR_MAX_DIMS)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: tensor '%s' has %zu dims; smelt supports at most %d", path, name,
                         nd, TENSOR_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) e->shape[i] = 1;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(jshape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return error_set(err, SMELT_EFORMAT,
                             "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                             name, i);
        e->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)e->shape[i], &numel) || numel > INT64_MAX)
            return error_set(err, SMELT_EFORMAT,
                             "%s: tensor '%s': the element count of its shape overflows", path,
                             name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)safetensors_dtype_size(dtype), &nbytes) ||
        nbytes > SIZE_MAX)
        return error_set(err, SMELT_EFORMAT, "%s: tensor '%s': its byte size overflows", path,
                         name);
    e->numel = (int64_t)numel;
    e->nbytes = (size_t)nbytes;
    return SMELT_OK;
}

static int parse_offsets(const char *path, const char *name, const json_t *joff,
                         uint64_t data_len, const struct safetensors_entry *e,
                         struct span *span, struct smelt_error *err) {
    if (!json_is_array(joff) || json_array_size(joff) != 2)
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': 'data_offsets' is missing or not [begin, end]", path,
                         name);
    const json_t *jb = json_array_get(joff, 0), *je = json_array_get(joff, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': data_offsets must be non-negative integers", path,
                         name);
    uint64_t b = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (end < b)
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu) end before they begin",
                         path, name, (unsigned long long)b, (unsigned long long)end);
    if (end > data_len)
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu) run past the data "
                         "region's %llu bytes (truncated file?)",
                         path, name, (unsigned long long)b, (unsigned long long)end,
                         (unsigned long long)data_len);
    if (end - b != e->nbytes) {
        char s[96];
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but %s %s "
                         "needs %zu",
                         path, name, (unsigned long long)b, (unsigned long long)end,
                         (unsigned long long)(end - b), safetensors_dtype_name(e->dtype),
                         shape_str(e->ndim, e->shape, s, sizeof s), e->nbytes);
    }
    span->begin = b;
    span->end = end;
    return SMELT_OK;
}

static int parse_entry(const char *path, const char *name, const json_t *v, uint64_t data_len,
                       struct safetensors_entry *e, struct span *span,
                       struct smelt_error *err) {
    if (!json_is_object(v))
        return error_set(err, SMELT_EFORMAT, "%s: tensor '%s': header entry is not an object",
                         path, name);
    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return error_set(err, SMELT_EFORMAT,
                         "%s: tensor '%s': 'dtype' is missing or not a string", path, name);
    if (!dtype_parse(json_string_value(jd), &e->dtype))
        return error_set(err, SMELT_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name,
                         json_string_value(jd));
    int rc = parse_dims(path, name, json_object_get(v, "shape"), e->dtype, e, err);
    if (rc) return rc;
    return parse_offsets(path, name, json_object_get(v, "data_offsets"), data_len, e, span,
                         err);
}

static int check_metadata(const char *path, const json_t *md, struct smelt_error *err) {
    if (!json_is_object(md))
        return error_set(err, SMELT_EFORMAT, "%s: '__metadata__' is not an object", path);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)md, key, value) {
        if (!json_is_string(value))
            return error_set(err, SMELT_EFORMAT,
                             "%s: '__metadata__' value of '%s' is not a string", path, key);
    }
    return SMELT_OK;
}

static int span_cmp(const void *pa, const void *pb) {
    const struct span *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->entry < b->entry ? -1 : a->entry > b->entry;
}

/* Tensors must tile the data region: sorted by offsets, each begins where the previous
 * ended and the last ends at the end of the file (the reference crate's rule). */
static int check_tiling(const char *path, const struct safetensors_entry *entries,
                        struct span *spans, size_t n, uint64_t data_len,
                        struct smelt_error *err) {
    qsort(spans, n, sizeof *spans, span_cmp);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = entries[spans[i].entry].name;
        if (spans[i].begin < at)
            return error_set(err, SMELT_EFORMAT,
                             "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s'",
                             path, name, (unsigned long long)spans[i].begin,
                             (unsigned long long)spans[i].end,
                             entries[spans[i - 1].entry].name);
        if (spans[i].begin > at)
            return error_set(err, SMELT_EFORMAT,
                             "%s: tensor '%s': data_offsets begin at %llu, leaving bytes "
                             "[%llu, %llu) of the data region unused",
                             path, name, (unsigned long long)spans[i].begin,
                             (unsigned long long)at, (unsigned long long)spans[i].begin);
        at = spans[i].end;
    }
    if (at != data_len)
        return error_set(err, SMELT_EFORMAT,
                         "%s: the data region is %llu bytes but its tensors cover %llu "
                         "(trailing bytes, or a header that lies about offsets)",
                         path, (unsigned long long)data_len, (unsigned long long)at);
    return SMELT_OK;
}

/* Reads the header length and the header JSON of a mapped file. */
static int load_header(const char *path, const struct file_map *map, uint64_t *header_len,
                       json_t **root, struct smelt_error *err) {
    if (map->len < 8)
        return error_set(err, SMELT_EFORMAT,
                         "%s: file is %zu bytes, too short for the 8-byte header length", path,
                         map->len);
    uint64_t n;
    memcpy(&n, map->data, 8);
    if (n > SAFETENSORS_MAX_HEADER_BYTES)
        return error_set(err, SMELT_EFORMAT,
                         "%s: header length %llu exceeds the %llu-byte limit (not a "
                         "safetensors file?)",
                         path, (unsigned long long)n, SAFETENSORS_MAX_HEADER_BYTES);
    if (n > map->len - 8)
        return error_set(err, SMELT_EFORMAT,
                         "%s: header length %llu runs past the end of the %zu-byte file "
                         "(truncated?)",
                         path, (unsigned long long)n, map->len);
    char where[PATH_MAX + 16];
    snprintf(where, sizeof where, "%s: header", path);
    int rc = json_load_buffer((const char *)map->data + 8, (size_t)n, where, root, err);
    if (rc) return rc;
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return error_set(err, SMELT_EFORMAT, "%s: header is not a JSON object", path);
    }
    *header_len = n;
    return SMELT_OK;
}

/* Parses every tensor of one mapped file, appending entries to st. */
static int parse_tensors(struct safetensors *st, int shard, const json_t *root,
                         uint64_t header_len, struct smelt_error *err) {
    struct safetensors_shard *sh = &st->shards[shard];
    const char *path = sh->path;
    uint64_t data_len = sh->map.len - 8 - header_len;
    const unsigned char *base = sh->map.data + 8 + header_len;
    size_t cap = st->n_entries + json_object_size(root);
    struct safetensors_entry *grown = realloc(st->entries, (cap ? cap : 1) * sizeof *grown);
    struct span *spans = malloc((json_object_size(root) + 1) * sizeof *spans);
    if (grown) st->entries = grown;
    if (!grown || !spans) {
        free(spans);
        return error_set(err, SMELT_ENOMEM, "%s: out of memory indexing tensors", path);
    }
    size_t n = 0;
    const char *key;
    json_t *value;
    int rc = SMELT_OK;
    json_object_foreach((json_t *)root, key, value) {
        if (strcmp(key, "__metadata__") == 0) continue;
        struct safetensors_entry *e = &st->entries[st->n_entries];
        memset(e, 0, sizeof *e);
        rc = parse_entry(path, key, value, data_len, e, &spans[n], err);
        if (rc) break;
        e->name = strdup(key);
        if (!e->name) {
            rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
            break;
        }
        e->shard = shard;
        spans[n].entry = st->n_entries;
        st->n_entries++;
        n++;
    }
    if (!rc) rc = check_tiling(path, st->entries, spans, n, data_len, err);
    if (!rc)
        for (size_t i = 0; i < n; i++) st->entries[spans[i].entry].data = base + spans[i].begin;
    free(spans);
    return rc;
}

/* Maps and validates st->shards[shard] (its path already set). */
static int shard_load(struct safetensors *st, int shard, struct smelt_error *err) {
    struct safetensors_shard *sh = &st->shards[shard];
    int rc = file_map_open(sh->path, &sh->map, err);
    if (rc) return rc;
    json_t *root = NULL;
    uint64_t header_len = 0;
    rc = load_header(sh->path, &sh->map, &header_len, &root, err);
    if (rc) return rc;
    json_t *md = json_object_get(root, "__metadata__");
    if (md && !json_is_null(md)) {
        rc = check_metadata(sh->path, md, err);
        if (!rc) sh->metadata = json_incref(md);
    }
    if (!rc) rc = parse_tensors(st, shard, root, header_len, err);
    json_decref(root);
    return rc;
}

/* ---- the set of shards ----------------------------------------------------------- */

static int entry_name_cmp(const void *pa, const void *pb) {
    const struct safetensors_entry *a = pa, *b = pb;
    return strcmp(a->name, b->name);
}

/* Sorts entries by name for bsearch; a name in two shards is an error. */
static int index_entries(struct safetensors *st, struct smelt_error *err) {
    if (st->n_entries > 1) qsort(st->entries, st->n_entries, sizeof *st->entries, entry_name_cmp);
    for (size_t i = 1; i < st->n_entries; i++)
        if (strcmp(st->entries[i - 1].name, st->entries[i].name) == 0)
            return error_set(err, SMELT_EFORMAT, "%s: tensor '%s' is stored in both %s and %s",
                             st->path, st->entries[i].name,
                             st->shards[st->entries[i - 1].shard].path,
                             st->shards[st->entries[i].shard].path);
    return SMELT_OK;
}

static int shards_alloc(struct safetensors *st, int n, struct smelt_error *err) {
    st->shards = calloc((size_t)(n > 0 ? n : 1), sizeof *st->shards);
    if (!st->shards) return error_set(err, SMELT_ENOMEM, "%s: out of memory", st->path);
    st->n_shards = n;
    return SMELT_OK;
}

static int open_single(struct safetensors *st, struct smelt_error *err) {
    int rc = shards_alloc(st, 1, err);
    if (rc) return rc;
    st->shards[0].path = strdup(st->path);
    if (!st->shards[0].path) return error_set(err, SMELT_ENOMEM, "%s: out of memory", st->path);
    rc = shard_load(st, 0, err);
    return rc ? rc : index_entries(st, err);
}

static int str_ptr_cmp(const void *pa, const void *pb) {
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* A weight_map value must name a file beside the index: no path separators, so an index
 * cannot point the loader at arbitrary files. */
static int check_shard_name(const char *index, const char *tensor, const json_t *v,
                            struct smelt_error *err) {
    if (!json_is_string(v))
        return error_set(err, SMELT_EFORMAT, "%s: weight_map['%s'] is not a string", index,
                         tensor);
    const char *s = json_string_value(v);
    if (!s[0] || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return error_set(err, SMELT_EFORMAT,
                         "%s: weight_map['%s'] = '%s' is not a file name in the model "
                         "directory",
                         index, tensor, s);
    return SMELT_OK;
}

/* The distinct shard file names of weight_map, sorted; borrowed from wm. */
static int shard_names(const char *index, const json_t *wm, const char ***names_out,
                       int *n_out, struct smelt_error *err) {
    size_t n = json_object_size(wm);
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names) return error_set(err, SMELT_ENOMEM, "%s: out of memory", index);
    size_t k = 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)wm, key, value) {
        int rc = check_shard_name(index, key, value, err);
        if (rc) {
            free(names);
            return rc;
        }
        names[k++] = json_string_value(value);
    }
    qsort(names, k, sizeof *names, str_ptr_cmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    if (u > INT_MAX) {
        free(names);
        return error_set(err, SMELT_EFORMAT, "%s: too many shards", index);
    }
    *names_out = names;
    *n_out = (int)u;
    return SMELT_OK;
}

/* Every tensor the index lists must be in the shard it names. */
static int check_weight_map(const struct safetensors *st, const json_t *wm,
                            struct smelt_error *err) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)wm, key, value) {
        const char *file = json_string_value(value);
        const struct safetensors_entry *e = safetensors_find(st, key);
        if (!e)
            return error_set(err, SMELT_ENOTFOUND,
                             "%s: tensor '%s' is listed in weight_map under %s, which does "
                             "not contain it",
                             st->path, key, file);
        const char *shard_path = st->shards[e->shard].path;
        size_t lp = strlen(shard_path), lf = strlen(file);
        if (lp < lf || strcmp(shard_path + lp - lf, file) != 0 ||
            (lp > lf && shard_path[lp - lf - 1] != '/'))
            return error_set(err, SMELT_EFORMAT,
                             "%s: tensor '%s' is listed under %s but stored in %s", st->path,
                             key, file, shard_path);
    }
    return SMELT_OK;
}

static int open_index(struct safetensors *st, struct smelt_error *err) {
    json_t *root = NULL;
    int rc = json_load_path(st->path, &root, err);
    if (rc) return rc;
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return error_set(err, SMELT_EFORMAT, "%s: no 'weight_map' object listing tensors",
                         st->path);
    }
    const char **names = NULL;
    int n = 0;
    rc = shard_names(st->path, wm, &names, &n, err);
    if (!rc) rc = shards_alloc(st, n, err);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", st->path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir ? 1 : 0] = '\0'; /* "/x.json" lives in "/" */
    else snprintf(dir, sizeof dir, ".");
    for (int i = 0; !rc && i < n; i++) {
        char path[PATH_MAX];
        rc = path_join(path, sizeof path, dir, names[i], err);
        if (rc) break;
        st->shards[i].path = strdup(path);
        if (!st->shards[i].path) rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
        if (!rc) rc = shard_load(st, i, err);
    }
    if (!rc) rc = index_entries(st, err);
    if (!rc) rc = check_weight_map(st, wm, err);
    free(names);
    json_decref(root);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/* Decides which file path_or_dir means (see safetensors_open). */
static int resolve_path(const char *path_or_dir, char *path, size_t bytes, bool *is_index,
                        struct smelt_error *err) {
    if (!path_is_dir(path_or_dir)) {
        if (!path_exists(path_or_dir))
            return error_set(err, SMELT_ENOTFOUND, "%s: no such file", path_or_dir);
        if ((size_t)snprintf(path, bytes, "%s", path_or_dir) >= bytes)
            return error_set(err, SMELT_EINVAL, "%s: path too long", path_or_dir);
        *is_index = ends_with(path_or_dir, ".json");
        return SMELT_OK;
    }
    int rc = path_join(path, bytes, path_or_dir, SAFETENSORS_SINGLE_FILE, err);
    if (rc) return rc;
    if (path_exists(path)) {
        *is_index = false;
        return SMELT_OK;
    }
    rc = path_join(path, bytes, path_or_dir, SAFETENSORS_INDEX_FILE, err);
    if (rc) return rc;
    if (path_exists(path)) {
        *is_index = true;
        return SMELT_OK;
    }
    return error_set(err, SMELT_ENOTFOUND, "%s: holds neither %s nor %s", path_or_dir,
                     SAFETENSORS_SINGLE_FILE, SAFETENSORS_INDEX_FILE);
}

int safetensors_open(const char *path_or_dir, struct safetensors **out,
                     struct smelt_error *err) {
    if (!out || !path_or_dir)
        return error_set(err, SMELT_EINVAL, "safetensors_open: NULL argument");
    *out = NULL;
    char path[PATH_MAX];
    bool is_index = false;
    int rc = resolve_path(path_or_dir, path, sizeof path, &is_index, err);
    if (rc) return rc;
    struct safetensors *st = calloc(1, sizeof *st);
    if (!st) return error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    st->path = strdup(path);
    if (!st->path) rc = error_set(err, SMELT_ENOMEM, "%s: out of memory", path);
    if (!rc) rc = is_index ? open_index(st, err) : open_single(st, err);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return SMELT_OK;
}

void safetensors_close(struct safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n_entries; i++) free((char *)st->entries[i].name);
    free(st->entries);
    for (int i = 0; i < st->n_shards; i++) {
        file_map_close(&st->shards[i].map);
        json_decref(st->shards[i].metadata);
        free(st->shards[i].path);
    }
    free(st->shards);
    free(st->path);
    free(st);
}

const struct safetensors_entry *safetensors_find(const struct safetensors *st,
                                                 const char *name) {
    if (!st || !name || st->n_entries == 0) return NULL;
    struct safetensors_entry key = {.name = name};
    return bsearch(&key, st->entries, st->n_entries, sizeof key, entry_name_cmp);
}

const char *safetensors_metadata_get(const struct safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->n_shards; i++) {
        const json_t *v = st->shards[i].metadata ? json_object_get(st->shards[i].metadata, key)
                                                 : NULL;
        if (json_is_string(v)) return json_string_value(v);
    }
    return NULL;
}

/* ---- reading --------------------------------------------------------------------- */

/* Loads element i of a possibly unaligned F32/BF16/F16 array. */
static float load_float(const unsigned char *p, enum safetensors_dtype dtype, int64_t i) {
    if (dtype == SAFETENSORS_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dtype == SAFETENSORS_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static void convert(void *dst, enum dtype to, const unsigned char *src,
                    enum safetensors_dtype from, int64_t n) {
    if (to == DTYPE_F32) {
        float *d = dst;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) d[i] = load_float(src, from, i);
    } else {
        uint16_t *d = dst;
        bool bf16 = to == DTYPE_BF16;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) {
            float x = load_float(src, from, i);
            d[i] = bf16 ? f32_to_bf16(x) : f32_to_f16(x);
        }
    }
}

static bool shape_matches(const struct safetensors_entry *e, const struct tensor *t) {
    if (e->ndim == 0) return t->ndim == 1 && t->shape[0] == 1;
    if (e->ndim != t->ndim) return false;
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] != t->shape[i]) return false;
    return true;
}

static bool is_float(enum safetensors_dtype d) {
    return d == SAFETENSORS_F32 || d == SAFETENSORS_BF16 || d == SAFETENSORS_F16;
}

int safetensors_read(const struct safetensors *st, const char *name, struct tensor *dst,
                     struct smelt_error *err) {
    if (!st || !name || !dst)
        return error_set(err, SMELT_EINVAL, "safetensors_read: NULL argument");
    const struct safetensors_entry *e = safetensors_find(st, name);
    if (!e) return error_set(err, SMELT_ENOTFOUND, "%s: no tensor named '%s'", st->path, name);
    const char *file = st->shards[e->shard].path;
    if (dst->backend != BACKEND_CPU || dst->ndim < 1 || dst->ndim > TENSOR_MAX_DIMS)
        return error_set(err, SMELT_EINVAL,
                         "%s: tensor '%s': destination must be a host tensor of 1..%d dims",
                         file, name, TENSOR_MAX_DIMS);
    if (!shape_matches(e, dst)) {
        char got[96], want[96];
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s' has shape %s, expected %s", file,
                         name, shape_str(e->ndim, e->shape, got, sizeof got),
                         shape_str(dst->ndim, dst->shape, want, sizeof want));
    }
    bool float_ok = is_float(e->dtype) && dst->dtype != DTYPE_I32;
    bool int_ok = e->dtype == SAFETENSORS_I32 && dst->dtype == DTYPE_I32;
    if (!float_ok && !int_ok)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "%s: tensor '%s' is stored as %s, which smelt cannot load as %s", file,
                         name, safetensors_dtype_name(e->dtype), dtype_name(dst->dtype));
    if (e->numel == 0) return SMELT_OK;
    if (!dst->data)
        return error_set(err, SMELT_EINVAL, "%s: tensor '%s': destination has no data", file,
                         name);
    if (safetensors_dtype_from_dtype(dst->dtype) == e->dtype)
        memcpy(dst->data, e->data, e->nbytes);
    else
        convert(dst->data, dst->dtype, e->data, e->dtype, e->numel);
    return SMELT_OK;
}

int safetensors_read_f32(const struct safetensors *st, const char *name, float *dst, int ndim,
                         const int64_t *shape, struct smelt_error *err) {
    if (ndim < 1 || ndim > TENSOR_MAX_DIMS || !shape)
        return error_set(err, SMELT_EINVAL,
                         "safetensors_read_f32: tensor '%s': expected shape must have 1..%d "
                         "dims",
                         name ? name : "(null)", TENSOR_MAX_DIMS);
    struct tensor t = tensor_f32(dst, ndim, shape);
    return safetensors_read(st, name, &t, err);
}
