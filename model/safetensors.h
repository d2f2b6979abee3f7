/* model/safetensors.h — Hugging Face safetensors weights: read (memory-mapped, fully
 * validated, one file or shards listed by model.safetensors.index.json) and write
 * (atomic, streamed, optionally sharded with an index).
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON header, then the
 * data region. The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the data region, plus an optional
 * "__metadata__" object of string → string. Tensors are C-order, little-endian.
 *
 * Opening checks everything the reference implementation (the Rust `safetensors`
 * crate) checks and names the file and tensor in every error: header length inside the
 * file and ≤ 100 MB, header a JSON object without duplicate keys, every entry with a
 * known dtype, a shape of ≤ 4 non-negative dims whose byte size does not overflow,
 * offsets that match that size, and tensors that tile the data region exactly (sorted
 * by offset: no overlap, no gap, nothing after the last). After a successful open
 * every entry's bytes lie inside its mapping, so readers need no further checks.
 * docs/model-formats.md lists every rule and the reasons.
 *
 * Ownership: struct safetensors owns its maps, names and metadata; entries and the
 * strings they point to live until safetensors_close. Entry data pointers point into
 * read-only maps and are NOT necessarily aligned (a header length that is not a
 * multiple of 8 is legal): read through safetensors_read*, or memcpy. */
#ifndef SMELT_MODEL_SAFETENSORS_H
#define SMELT_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "kernels/ops.h" /* enum dtype, struct tensor, TENSOR_MAX_DIMS */

/* The format's dtypes, in the reference crate's order (ascending alignment), which the
 * writer uses to sort tensors. Sub-byte types (F4, F6_*) are not listed: a file holding
 * them is refused as an unknown dtype. */
enum safetensors_dtype {
    SAFETENSORS_BOOL,
    SAFETENSORS_U8,
    SAFETENSORS_I8,
    SAFETENSORS_F8_E5M2,
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E8M0,
    SAFETENSORS_I16,
    SAFETENSORS_U16,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_I32,
    SAFETENSORS_U32,
    SAFETENSORS_F32,
    SAFETENSORS_F64,
    SAFETENSORS_I64,
    SAFETENSORS_U64,
    SAFETENSORS_DTYPE_COUNT
};

const char *safetensors_dtype_name(enum safetensors_dtype dtype); /* "BF16" */
size_t safetensors_dtype_size(enum safetensors_dtype dtype);      /* bytes per element */
/* The ops dtype a file dtype loads as: F32, BF16, F16, I32 → true; others false. */
bool safetensors_dtype_to_dtype(enum safetensors_dtype dtype, enum dtype *out);
enum safetensors_dtype safetensors_dtype_from_dtype(enum dtype dtype);

/* Header limit of the reference implementation; larger headers are refused. */
#define SAFETENSORS_MAX_HEADER_BYTES 100000000ull

struct safetensors_entry {
    const char *name;                 /* owned by the struct safetensors */
    enum safetensors_dtype dtype;     /* as stored in the file */
    int ndim;                         /* 0..TENSOR_MAX_DIMS; 0 is a scalar (numel 1) */
    int64_t shape[TENSOR_MAX_DIMS];   /* dims past ndim are 1 */
    int64_t numel;
    size_t nbytes;                    /* numel * element size */
    const void *data;                 /* inside the shard's map; possibly unaligned */
    int shard;                        /* index into safetensors.shards */
};

struct safetensors_shard {
    char *path;                       /* as opened */
    struct file_map map;
    json_t *metadata;                 /* the "__metadata__" object, or NULL */
};

struct safetensors {
    char *path;                       /* the file or index that was opened (for errors) */
    struct safetensors_shard *shards; /* [n_shards]; one for a single file */
    int n_shards;
    struct safetensors_entry *entries;/* [n_entries], sorted by name (strcmp) */
    size_t n_entries;
};

/* Opens weights at path_or_dir, which is a .safetensors file, a
 * model.safetensors.index.json, or a model directory (its model.safetensors when present,
 * else its model.safetensors.index.json — the order transformers uses). For an index,
 * every shard named in weight_map is opened and validated, every listed tensor must be
 * in the shard the index names, and a tensor name may appear in only one shard; tensors
 * a shard holds but the index does not list are kept. On success *out is the caller's,
 * freed with safetensors_close. Errors: SMELT_EIO (cannot open/map), SMELT_EFORMAT
 * (malformed), SMELT_ENOTFOUND (no weights in a directory, a listed tensor missing),
 * SMELT_ENOMEM. */
int safetensors_open(const char *path_or_dir, struct safetensors **out,
                     struct smelt_error *err);
void safetensors_close(struct safetensors *st); /* NULL is fine */

/* The entry named name, or NULL (binary search over the sorted entries). */
const struct safetensors_entry *safetensors_find(const struct safetensors *st,
                                                 const char *name);

/* A "__metadata__" value (the first shard holding key), or NULL. Borrowed from st. */
const char *safetensors_metadata_get(const struct safetensors *st, const char *key);

/* Copies tensor name into dst, a host (BACKEND_CPU) tensor whose dtype and shape say what
 * is expected, converting F32/BF16/F16 into f32, bf16 or f16 (round to nearest even),
 * and I32 into i32 only. A 0-dim file tensor matches a dst of shape [1]. Errors name the
 * file and the tensor: SMELT_ENOTFOUND (no such tensor), SMELT_EINVAL (shape differs:
 * got and expected both shown), SMELT_EUNSUPPORTED (a dtype that cannot convert, e.g.
 * I64 or F64 into f32). */
int safetensors_read(const struct safetensors *st, const char *name, struct tensor *dst,
                     struct smelt_error *err);
/* safetensors_read into a host f32 buffer of the given shape. */
int safetensors_read_f32(const struct safetensors *st, const char *name, float *dst,
                         int ndim, const int64_t *shape, struct smelt_error *err);

/* ---- writing --------------------------------------------------------------------- */

struct safetensors_tensor_desc {
    const char *name;
    struct tensor tensor;             /* host (BACKEND_CPU) data, its dtype and shape */
    enum dtype file_dtype;            /* stored as: f32/bf16/f16 from any of those
                                         (converted while writing), i32 from i32 */
};

struct safetensors_kv {
    const char *key;
    const char *value;
};

/* Writes one safetensors file. Tensors are laid out as the reference writer does:
 * sorted by file dtype, widest alignment first, then by name (strcmp), so every tensor
 * is aligned to its element size; the header lists them in that order after
 * "__metadata__" (written only when n_metadata > 0, verbatim: transformers refuses a
 * file whose metadata lacks "format": "pt", so model savers pass it) and is padded with
 * spaces to a multiple of 8 bytes. The file is streamed to a temporary beside path,
 * fsync'd and renamed over path, so readers never see a torn file. Names must be
 * non-empty, valid UTF-8, unique and not "__metadata__". */
int safetensors_write(const char *path, const struct safetensors_tensor_desc *tensors,
                      size_t n, const struct safetensors_kv *metadata, size_t n_metadata,
                      struct smelt_error *err);

/* Writes the weights of a Hugging Face model directory (created if needed). When
 * max_shard_bytes is 0 or every tensor fits, the result is dir/model.safetensors;
 * otherwise tensors are packed in the given order into shards of at most
 * max_shard_bytes of tensor data (a larger tensor gets a shard of its own), named
 * model-00001-of-0000N.safetensors, and dir/model.safetensors.index.json
 * ({"metadata": {"total_size"}, "weight_map"}) is written last. A stale
 * model.safetensors or index left by an earlier save in the other layout is removed so
 * loaders cannot pick it up; other old shards are left alone (save into a fresh dir). */
int safetensors_write_dir(const char *dir, const struct safetensors_tensor_desc *tensors,
                          size_t n, const struct safetensors_kv *metadata,
                          size_t n_metadata, uint64_t max_shard_bytes,
                          struct smelt_error *err);

#define SAFETENSORS_SINGLE_FILE "model.safetensors"
#define SAFETENSORS_INDEX_FILE  "model.safetensors.index.json"

#endif
