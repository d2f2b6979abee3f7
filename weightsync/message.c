/* The weights.* messages of common/msg.h: their JSON headers built and read, every field
 * checked, errors naming the field (err->field) in the protocol's words. */
#include "weightsync/weightsync.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

#define MAX_BYTES (INT64_C(1) << 50)   /* no model's stream is near a petabyte */

/* ---- weights.begin ---- */

static json_t *tensor_json(const struct weightsync_tensor *t) {
    json_t *shape = t->ndim == 2 ? json_pack("[I, I]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                 : json_pack("[I]", (json_int_t)t->shape[0]);
    return json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", t->name, "dtype", dtype_name(t->dtype), "shape", shape,
                     "offset", (json_int_t)t->offset_bytes, "bytes", (json_int_t)t->bytes);
}

/* "transport" is written only for a broadcast: a begin without it is the ZeroMQ sync
 * every worker understands. */
static int via_json(json_t *h, const struct weightsync_meta *m) {
    if (m->via.kind == WEIGHTSYNC_VIA_ZMQ) return 0;
    return json_object_set_new(h, "transport", json_string(weightsync_via_name(m->via.kind))) ||
           json_object_set_new(h, "comm", json_string(m->via.comm)) ||
           json_object_set_new(h, "comm_timeout_ms", json_integer(m->via.timeout_ms));
}

json_t *weightsync_begin_header(const struct weightsync_meta *m) {
    json_t *tensors = json_array();
    for (int i = 0; tensors && i < m->n_tensors; i++)
        if (json_array_append_new(tensors, tensor_json(&m->tensors[i]))) {
            json_decref(tensors);
            tensors = NULL;
        }
    if (!tensors) return NULL;
    json_t *h = json_pack("{s:I, s:s, s:I, s:I, s:I, s:o}", "version", (json_int_t)m->version, "kind",
                          weightsync_kind_name(m->kind), "total_bytes", (json_int_t)m->total_bytes, "bucket_bytes",
                          (json_int_t)m->bucket_bytes, "n_buckets", (json_int_t)m->n_buckets, "tensors", tensors);
    if (h && via_json(h, m)) {
        json_decref(h);
        return NULL;
    }
    if (h && m->kind == WEIGHTSYNC_LORA &&
        json_object_set_new(h, "lora", json_pack("{s:i, s:f, s:b}", "r", m->lora.rank, "lora_alpha",
                                                 (double)m->lora.alpha, "use_rslora", m->lora.use_rslora))) {
        json_decref(h);
        return NULL;
    }
    return h;
}

static int read_dtype(const json_t *obj, const char *where, enum dtype *out, struct smelt_error *err) {
    const char *name;
    TRY(json_field_string(obj, "dtype", true, NULL, &name, where, err));
    for (int d = 0; d < DTYPE_COUNT; d++)
        if (strcmp(name, dtype_name((enum dtype)d)) == 0) {
            *out = (enum dtype)d;
            return SMELT_OK;
        }
    return error_set_field(err, SMELT_EINVAL, "dtype", "%s: field 'dtype' is '%.32s', not a dtype", where, name);
}

static int read_shape(const json_t *obj, const char *where, struct weightsync_tensor *t, struct smelt_error *err) {
    json_t *s = json_object_get(obj, "shape");
    size_t n = json_is_array(s) ? json_array_size(s) : 0;
    if (n < 1 || n > 2)
        return error_set_field(err, SMELT_EINVAL, "shape", "%s: field 'shape' must be an array of 1 or 2 sizes", where);
    t->ndim = (int)n;
    t->shape[1] = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(s, i);
        if (!json_is_integer(d) || json_integer_value(d) < 1)
            return error_set_field(err, SMELT_EINVAL, "shape", "%s: field 'shape' must hold sizes >= 1", where);
        t->shape[i] = json_integer_value(d);
    }
    return SMELT_OK;
}

static int read_tensor(const json_t *obj, int i, struct weightsync_tensor *t, struct smelt_error *err) {
    static const char *const known[] = {"name", "dtype", "shape", "offset", "bytes", NULL};
    char where[64], outer[32];
    snprintf(where, sizeof where, "weights.begin: tensors[%d]", i);
    snprintf(outer, sizeof outer, "tensors[%d]", i);
    if (!json_is_object(obj))
        return error_set_field(err, SMELT_EINVAL, outer, "%s: must be an object", where);
    const char *name;
    int rc = json_check_keys(obj, known, where, err);
    if (!rc) rc = json_field_string(obj, "name", true, NULL, &name, where, err);
    if (!rc && (strlen(name) == 0 || strlen(name) >= sizeof t->name))
        rc = error_set_field(err, SMELT_EINVAL, "name", "%s: field 'name' must be 1..%zu bytes", where,
                             sizeof t->name - 1);
    if (!rc) snprintf(t->name, sizeof t->name, "%s", name);
    if (!rc) rc = read_dtype(obj, where, &t->dtype, err);
    if (!rc) rc = read_shape(obj, where, t, err);
    if (!rc) rc = json_field_int(obj, "offset", true, 0, 0, MAX_BYTES, &t->offset_bytes, where, err);
    if (!rc) rc = json_field_int(obj, "bytes", true, 0, 0, MAX_BYTES, &t->bytes, where, err);
    return error_in_field(err, rc, outer);
}

static int read_tensors(const json_t *h, struct weightsync_meta *out, struct smelt_error *err) {
    json_t *a = json_object_get(h, "tensors");
    if (!json_is_array(a))
        return error_set_field(err, SMELT_EINVAL, "tensors", "weights.begin: field 'tensors' must be an array");
    size_t n = json_array_size(a);
    out->tensors = calloc(n > 0 ? n : 1, sizeof *out->tensors);
    if (!out->tensors) return error_set(err, SMELT_ENOMEM, "weightsync: out of memory");
    out->n_tensors = (int)n;
    for (size_t i = 0; i < n; i++) TRY(read_tensor(json_array_get(a, i), (int)i, &out->tensors[i], err));
    return SMELT_OK;
}

static int read_lora(const json_t *h, struct weightsync_meta *out, struct smelt_error *err) {
    static const char *const known[] = {"r", "lora_alpha", "use_rslora", NULL};
    json_t *l = json_object_get(h, "lora");
    if (out->kind != WEIGHTSYNC_LORA) {
        if (l) return error_set_field(err, SMELT_EINVAL, "lora", "weights.begin: field 'lora' with kind \"full\"");
        return SMELT_OK;
    }
    if (!json_is_object(l))
        return error_set_field(err, SMELT_EINVAL, "lora", "weights.begin: kind \"lora\" needs the object 'lora'");
    int64_t r = 0;
    double alpha = 0;
    const char *where = "weights.begin: lora";
    int rc = json_check_keys(l, known, where, err);
    if (!rc) rc = json_field_int(l, "r", true, 0, 1, 1 << 20, &r, where, err);
    if (!rc) rc = json_field_double(l, "lora_alpha", true, 0, 0, 1e30, &alpha, where, err);
    if (!rc) rc = json_field_bool(l, "use_rslora", true, false, &out->lora.use_rslora, where, err);
    out->lora.rank = (int)r;
    out->lora.alpha = (float)alpha;
    return error_in_field(err, rc, "lora");
}

static int read_via(const json_t *h, struct weightsync_meta *out, struct smelt_error *err) {
    const char *where = "weights.begin", *via, *comm;
    TRY(json_field_string(h, "transport", false, "zmq", &via, where, err));
    if (strcmp(via, "zmq") == 0) {
        if (json_object_get(h, "comm") || json_object_get(h, "comm_timeout_ms"))
            return error_set_field(err, SMELT_EINVAL, "comm", "%s: 'comm' and 'comm_timeout_ms' belong to "
                                   "\"transport\": \"broadcast\"", where);
        return SMELT_OK;
    }
    if (strcmp(via, "broadcast") != 0)
        return error_set_field(err, SMELT_EINVAL, "transport", "%s: field 'transport' must be \"zmq\" or "
                               "\"broadcast\"", where);
    out->via.kind = WEIGHTSYNC_VIA_BROADCAST;
    int64_t timeout;
    TRY(json_field_string(h, "comm", true, NULL, &comm, where, err));
    if (!comm[0] || strlen(comm) >= sizeof out->via.comm)
        return error_set_field(err, SMELT_EINVAL, "comm", "%s: field 'comm' must be 1..%zu bytes", where,
                               sizeof out->via.comm - 1);
    snprintf(out->via.comm, sizeof out->via.comm, "%s", comm);
    TRY(json_field_int(h, "comm_timeout_ms", true, 0, 1, INT32_MAX, &timeout, where, err));
    out->via.timeout_ms = (int)timeout;
    return SMELT_OK;
}

int weightsync_begin_read(const struct msg *m, struct weightsync_meta *out, struct smelt_error *err) {
    static const char *const known[] = {"v", "version", "kind", "total_bytes", "bucket_bytes", "n_buckets",
                                        "tensors", "lora", "transport", "comm", "comm_timeout_ms", NULL};
    const char *where = "weights.begin", *kind;
    const json_t *h = m->header;
    memset(out, 0, sizeof *out);
    int rc = json_check_keys(h, known, where, err);
    if (!rc) rc = json_field_int(h, "version", true, 0, 0, INT64_MAX, &out->version, where, err);
    if (!rc) rc = json_field_string(h, "kind", true, NULL, &kind, where, err);
    if (!rc && strcmp(kind, "full") != 0 && strcmp(kind, "lora") != 0)
        rc = error_set_field(err, SMELT_EINVAL, "kind", "%s: field 'kind' must be \"full\" or \"lora\"", where);
    if (!rc) out->kind = strcmp(kind, "lora") == 0 ? WEIGHTSYNC_LORA : WEIGHTSYNC_FULL;
    if (!rc) rc = json_field_int(h, "total_bytes", true, 0, 0, MAX_BYTES, &out->total_bytes, where, err);
    if (!rc) rc = json_field_int(h, "bucket_bytes", true, 0, 1, MAX_BYTES, &out->bucket_bytes, where, err);
    if (!rc) rc = json_field_int(h, "n_buckets", true, 0, 0, MAX_BYTES, &out->n_buckets, where, err);
    if (!rc) rc = read_lora(h, out, err);
    if (!rc) rc = read_via(h, out, err);
    if (!rc) rc = read_tensors(h, out, err);
    if (!rc && m->n_arrays)
        rc = error_set_field(err, SMELT_EINVAL, "frames", "%s: %d array frames; none expected", where, m->n_arrays);
    if (rc) weightsync_meta_free(out);
    return rc;
}

/* ---- weights.bucket ---- */

json_t *weightsync_bucket_header(const struct weightsync_bucket *b) {
    char hash[17];
    snprintf(hash, sizeof hash, "%016" PRIx64, b->hash);
    return json_pack("{s:I, s:I, s:s}", "version", (json_int_t)b->version, "index", (json_int_t)b->index, "hash",
                     hash);
}

static int hex_digit(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* 16 lower-case hex digits into *out; false when s is not that. */
static bool parse_hash(const char *s, uint64_t *out) {
    bool ok = s && strlen(s) == 16;
    uint64_t v = 0;
    for (int i = 0; ok && i < 16; i++) {
        ok = hex_digit(s[i]) >= 0;
        v = v << 4 | (uint64_t)(ok ? hex_digit(s[i]) : 0);
    }
    *out = v;
    return ok;
}

static int read_hash(const json_t *h, uint64_t *out, struct smelt_error *err) {
    const char *s;
    TRY(json_field_string(h, "hash", true, NULL, &s, "weights.bucket", err));
    if (!parse_hash(s, out))
        return error_set_field(err, SMELT_EINVAL, "hash", "weights.bucket: field 'hash' must be 16 lower-case hex "
                               "digits (XXH64)");
    return SMELT_OK;
}

int weightsync_bucket_read(const struct msg *m, struct weightsync_bucket *out, struct smelt_error *err) {
    static const char *const known[] = {"v", "version", "index", "hash", NULL};
    const char *where = "weights.bucket";
    memset(out, 0, sizeof *out);
    TRY(json_check_keys(m->header, known, where, err));
    TRY(json_field_int(m->header, "version", true, 0, 0, INT64_MAX, &out->version, where, err));
    TRY(json_field_int(m->header, "index", true, 0, 0, INT64_MAX, &out->index, where, err));
    TRY(read_hash(m->header, &out->hash, err));
    if (m->n_arrays != 1)
        return error_set_field(err, SMELT_EINVAL, "bytes", "%s: %d array frames; exactly one (the bytes) expected",
                               where, m->n_arrays);
    out->data = m->arrays[0].data;
    out->bytes = (int64_t)m->arrays[0].bytes;
    return SMELT_OK;
}

/* ---- weights.end, weights.ack ---- */

static json_t *hashes_json(const uint64_t *hashes, int64_t n) {
    json_t *a = json_array();
    for (int64_t k = 0; a && k < n; k++) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, hashes[k]);
        if (json_array_append_new(a, json_string(hex))) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

json_t *weightsync_end_header(const struct weightsync_meta *m, const uint64_t *hashes) {
    json_t *h = json_pack("{s:I, s:I, s:I}", "version", (json_int_t)m->version, "n_buckets",
                          (json_int_t)m->n_buckets, "total_bytes", (json_int_t)m->total_bytes);
    if (h && hashes && json_object_set_new(h, "hashes", hashes_json(hashes, m->n_buckets))) {
        json_decref(h);
        return NULL;
    }
    return h;
}

int weightsync_end_hashes(const struct msg *m, int64_t n_buckets, uint64_t *out, struct smelt_error *err) {
    json_t *a = json_object_get(m->header, "hashes");
    if (!json_is_array(a) || (int64_t)json_array_size(a) != n_buckets)
        return error_set_field(err, SMELT_EINVAL, "hashes", "weights.end: field 'hashes' must be an array of the "
                               "%lld buckets' XXH64s (a broadcast sync)", (long long)n_buckets);
    for (int64_t k = 0; k < n_buckets; k++)
        if (!parse_hash(json_string_value(json_array_get(a, (size_t)k)), &out[k]))
            return error_set_field(err, SMELT_EINVAL, "hashes", "weights.end: hashes[%lld] must be 16 lower-case "
                                   "hex digits (XXH64)", (long long)k);
    return SMELT_OK;
}

int weightsync_end_read(const struct msg *m, int64_t *version, int64_t *n_buckets, int64_t *total_bytes,
                        struct smelt_error *err) {
    static const char *const known[] = {"v", "version", "n_buckets", "total_bytes", "hashes", NULL};
    const char *where = "weights.end";
    TRY(json_check_keys(m->header, known, where, err));
    TRY(json_field_int(m->header, "version", true, 0, 0, INT64_MAX, version, where, err));
    TRY(json_field_int(m->header, "n_buckets", true, 0, 0, MAX_BYTES, n_buckets, where, err));
    TRY(json_field_int(m->header, "total_bytes", true, 0, 0, MAX_BYTES, total_bytes, where, err));
    if (m->n_arrays)
        return error_set_field(err, SMELT_EINVAL, "frames", "%s: %d array frames; none expected", where, m->n_arrays);
    return SMELT_OK;
}

json_t *weightsync_ack_header(const struct weightsync_ack *a) {
    return json_pack("{s:I, s:s, s:I, s:I, s:f}", "version", (json_int_t)a->version, "kind",
                     weightsync_kind_name(a->kind), "bytes", (json_int_t)a->bytes, "buckets", (json_int_t)a->buckets,
                     "seconds", a->seconds);
}

int weightsync_ack_read(const struct msg *m, struct weightsync_ack *out, struct smelt_error *err) {
    static const char *const known[] = {"v", "version", "kind", "bytes", "buckets", "seconds", NULL};
    const char *where = "weights.ack", *kind;
    memset(out, 0, sizeof *out);
    TRY(json_check_keys(m->header, known, where, err));
    TRY(json_field_int(m->header, "version", true, 0, 0, INT64_MAX, &out->version, where, err));
    TRY(json_field_string(m->header, "kind", true, NULL, &kind, where, err));
    if (strcmp(kind, "full") != 0 && strcmp(kind, "lora") != 0)
        return error_set_field(err, SMELT_EINVAL, "kind", "%s: field 'kind' must be \"full\" or \"lora\"", where);
    out->kind = strcmp(kind, "lora") == 0 ? WEIGHTSYNC_LORA : WEIGHTSYNC_FULL;
    TRY(json_field_int(m->header, "bytes", true, 0, 0, MAX_BYTES, &out->bytes, where, err));
    TRY(json_field_int(m->header, "buckets", true, 0, 0, MAX_BYTES, &out->buckets, where, err));
    return json_field_double(m->header, "seconds", true, 0, 0, 1e12, &out->seconds, where, err);
}

int64_t weightsync_header_version(const struct msg *m) {
    json_t *v = m->header ? json_object_get(m->header, "version") : NULL;
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}
