/* model/safetensors: write → read round trips per dtype and shape, the reference
 * implementation's byte layout, hand-built files, sharded directories with an index,
 * and robustness: every truncation, header byte flips, and each way a header can lie. */
#include "tests/unit/testutil.h"

#include <ftw.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"


static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_text(const char *path, const char *text) {
    write_bytes(path, text, strlen(text));
}

/* A file with header length n = strlen(header) (or n_override when nonzero), the
 * header bytes, and data_len bytes of data (zeros when data is NULL). */
static void write_raw(const char *path, const char *header, uint64_t n_override,
                      const void *data, size_t data_len) {
    size_t hl = strlen(header);
    uint64_t n = n_override ? n_override : hl;
    unsigned char *buf = calloc(1, 8 + hl + data_len + 1);
    cr_assert(buf);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data) memcpy(buf + 8 + hl, data, data_len);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static unsigned char *read_bytes(const char *path, size_t *len) {
    char *buf = NULL;
    struct smelt_error err;
    TEST_OK(file_read_all(path, &buf, len, &err), &err);
    return (unsigned char *)buf;
}

/* Opening must fail with code, naming the file and (when given) containing want. */
static void expect_open_fails(const char *path, int code, const char *want) {
    struct smelt_error err;
    struct safetensors *st = (struct safetensors *)0x1;
    TEST_EXPECT_ERROR(safetensors_open(path, &st, &err), code, &err);
    cr_expect_null(st, "output must be NULL on failure");
    cr_expect(strstr(err.message, path) != NULL, "error names the file: %s", err.message);
    if (want)
        cr_expect(strstr(err.message, want) != NULL, "error mentions '%s': %s", want,
                  err.message);
}

static void expect_bad_header(const char *header, size_t data_len, int code, const char *want) {
    char path[128];
    test_tmp_path(path, sizeof path, "bad.safetensors");
    write_raw(path, header, 0, NULL, data_len);
    expect_open_fails(path, code, want);
}

/* Every entry's bytes lie inside its shard's data region. */
static void expect_entries_in_bounds(const struct safetensors *st) {
    for (size_t i = 0; i < st->n_entries; i++) {
        const struct safetensors_entry *e = &st->entries[i];
        const struct file_map *m = &st->shards[e->shard].map;
        uint64_t hl;
        memcpy(&hl, m->data, 8);
        const unsigned char *p = e->data, *lo = m->data + 8 + hl, *hi = m->data + m->len;
        cr_assert(p >= lo && p <= hi && e->nbytes <= (size_t)(hi - p), "entry '%s' out of bounds",
                  e->name);
    }
}

/* What reading value x stored as file dtype gives back in f32. */
static float stored_as(float x, enum dtype file_dtype) {
    if (file_dtype == DTYPE_BF16) return bf16_to_f32(f32_to_bf16(x));
    if (file_dtype == DTYPE_F16) return f16_to_f32(f32_to_f16(x));
    return x;
}

/* ---- round trips ---- */

static const int64_t shapes[][5] = {
    /* ndim, dims */
    {1, 1}, {1, 7}, {2, 3, 5}, {3, 2, 3, 4}, {4, 2, 1, 3, 5}, {2, 33, 17},
};
#define N_SHAPES (sizeof shapes / sizeof *shapes)

static void roundtrip(enum dtype file_dtype) {
    struct test_rng rng = {7 + (uint64_t)file_dtype};
    struct smelt_error err;
    struct safetensors_tensor_desc descs[N_SHAPES];
    float *data[N_SHAPES];
    char names[N_SHAPES][32];
    for (size_t i = 0; i < N_SHAPES; i++) {
        struct tensor t = tensor_f32(NULL, (int)shapes[i][0], &shapes[i][1]);
        data[i] = test_rand_f32(&rng, tensor_numel(&t), -3, 3);
        t.data = data[i];
        snprintf(names[i], sizeof names[i], "layers.%zu.weight", N_SHAPES - i);
        descs[i] = (struct safetensors_tensor_desc){names[i], t, file_dtype};
    }
    char path[128];
    test_tmp_path(path, sizeof path, "rt.safetensors");
    struct safetensors_kv md[] = {{"format", "pt"}, {"note", "round trip"}};
    TEST_OK(safetensors_write(path, descs, N_SHAPES, md, 2, &err), &err);

    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    cr_assert_eq(st->n_entries, N_SHAPES);
    cr_expect_str_eq(safetensors_metadata_get(st, "note"), "round trip");
    cr_expect_null(safetensors_metadata_get(st, "absent"));
    for (size_t i = 0; i < N_SHAPES; i++) {
        const struct safetensors_entry *e = safetensors_find(st, names[i]);
        cr_assert(e, "tensor %s not found", names[i]);
        cr_expect_eq(e->dtype, safetensors_dtype_from_dtype(file_dtype));
        cr_expect_eq(e->ndim, (int)shapes[i][0]);
        for (int k = 0; k < e->ndim; k++) cr_expect_eq(e->shape[k], shapes[i][1 + k]);
        /* The reference layout aligns every tensor to its element size. */
        cr_expect_eq((uintptr_t)e->data % dtype_size(file_dtype), 0, "tensor %s unaligned",
                     names[i]);
        int64_t n = e->numel;
        float *got = test_zeros_f32(n);
        TEST_OK(safetensors_read_f32(st, names[i], got, e->ndim, e->shape, &err), &err);
        for (int64_t j = 0; j < n; j++)
            cr_assert_eq(got[j], stored_as(data[i][j], file_dtype), "%s[%lld]", names[i],
                         (long long)j);
        /* Reading into a bf16 tensor rounds once from the stored value. */
        uint16_t *bf = calloc((size_t)n, sizeof *bf);
        struct tensor tb = tensor_make(BACKEND_CPU, DTYPE_BF16, bf, e->ndim, e->shape);
        TEST_OK(safetensors_read(st, names[i], &tb, &err), &err);
        for (int64_t j = 0; j < n; j++)
            cr_assert_eq(bf[j], f32_to_bf16(stored_as(data[i][j], file_dtype)));
        free(bf);
        free(got);
    }
    expect_entries_in_bounds(st);
    safetensors_close(st);
    for (size_t i = 0; i < N_SHAPES; i++) free(data[i]);
}

Test(safetensors, roundtrip_f32, .init = test_tmp_setup, .fini = test_tmp_teardown) { roundtrip(DTYPE_F32); }
Test(safetensors, roundtrip_bf16, .init = test_tmp_setup, .fini = test_tmp_teardown) { roundtrip(DTYPE_BF16); }
Test(safetensors, roundtrip_f16, .init = test_tmp_setup, .fini = test_tmp_teardown) { roundtrip(DTYPE_F16); }

Test(safetensors, roundtrip_16bit_sources_and_i32, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    uint16_t h[6];
    float want_h[6];
    for (int i = 0; i < 6; i++) {
        h[i] = f32_to_f16(0.37f * (float)(i - 2));
        want_h[i] = f16_to_f32(h[i]);
    }
    int32_t ids[5] = {0, -1, 7, INT32_MAX, INT32_MIN};
    int64_t s23[2] = {2, 3}, s5[1] = {5};
    struct safetensors_tensor_desc d[] = {
        {"half_as_f32", tensor_make(BACKEND_CPU, DTYPE_F16, h, 2, s23), DTYPE_F32},
        {"half_as_half", tensor_make(BACKEND_CPU, DTYPE_F16, h, 2, s23), DTYPE_F16},
        {"ids", tensor_i32(ids, 1, s5), DTYPE_I32},
    };
    char path[128];
    test_tmp_path(path, sizeof path, "mixed.safetensors");
    TEST_OK(safetensors_write(path, d, 3, NULL, 0, &err), &err);
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    float got[6];
    TEST_OK(safetensors_read_f32(st, "half_as_f32", got, 2, s23, &err), &err);
    for (int i = 0; i < 6; i++) cr_expect_eq(got[i], want_h[i]);
    uint16_t got_h[6];
    struct tensor th = tensor_make(BACKEND_CPU, DTYPE_F16, got_h, 2, s23);
    TEST_OK(safetensors_read(st, "half_as_half", &th, &err), &err);
    cr_expect(memcmp(got_h, h, sizeof h) == 0);
    int32_t got_ids[5];
    struct tensor ti = tensor_i32(got_ids, 1, s5);
    TEST_OK(safetensors_read(st, "ids", &ti, &err), &err);
    cr_expect(memcmp(got_ids, ids, sizeof ids) == 0);
    /* i32 is never converted to or from floats. */
    TEST_EXPECT_ERROR(safetensors_read_f32(st, "ids", got, 1, s5, &err), SMELT_EUNSUPPORTED, &err);
    int32_t i6[6];
    struct tensor ti6 = tensor_i32(i6, 2, s23);
    TEST_EXPECT_ERROR(safetensors_read(st, "half_as_f32", &ti6, &err), SMELT_EUNSUPPORTED, &err);
    safetensors_close(st);
}

Test(safetensors, layout_sorted_by_dtype_then_name, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    float f[4] = {1, 2, 3, 4};
    int32_t i32[4] = {1, 2, 3, 4};
    int64_t s[1] = {3};
    struct safetensors_tensor_desc d[] = {
        {"z_half", tensor_f32(f, 1, s), DTYPE_F16}, {"b_bf", tensor_f32(f, 1, s), DTYPE_BF16},
        {"y_f32", tensor_f32(f, 1, s), DTYPE_F32},  {"a_bf", tensor_f32(f, 1, s), DTYPE_BF16},
        {"ids", tensor_i32(i32, 1, s), DTYPE_I32},  {"c_f32", tensor_f32(f, 1, s), DTYPE_F32},
    };
    char path[128];
    test_tmp_path(path, sizeof path, "order.safetensors");
    TEST_OK(safetensors_write(path, d, 6, NULL, 0, &err), &err);
    size_t len;
    unsigned char *bytes = read_bytes(path, &len);
    uint64_t n;
    memcpy(&n, bytes, 8);
    cr_expect_eq(n % 8, 0, "header padded to 8 bytes");
    /* Reference order: F32, I32, BF16, F16 (descending dtype), then name. */
    const char *order[] = {"\"c_f32\"", "\"y_f32\"", "\"ids\"", "\"a_bf\"", "\"b_bf\"", "\"z_half\""};
    const char *header = (const char *)bytes + 8, *prev = header;
    for (int i = 0; i < 6; i++) {
        const char *at = strstr(header, order[i]);
        cr_assert(at && at >= prev, "%s out of order in %.*s", order[i], (int)n, header);
        prev = at;
    }
    cr_expect_eq(len, 8 + n + 2 * 12 + 12 + 2 * 6 + 6);
    free(bytes);
}

/* ---- the reference implementation's exact bytes ---- */

static void expect_file_bytes(const char *path, const unsigned char *want, size_t want_len) {
    size_t len;
    unsigned char *got = read_bytes(path, &len);
    cr_expect_eq(len, want_len, "file is %zu bytes, expected %zu", len, want_len);
    if (len == want_len) cr_expect(memcmp(got, want, len) == 0, "bytes differ");
    free(got);
}

/* The file the reference writer produces: length, header, padding, data. */
static size_t build_expected(unsigned char *buf, const char *header, size_t pad,
                             const void *data, size_t data_len) {
    size_t hl = strlen(header), n = hl + pad;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', pad);
    if (data_len) memcpy(buf + 8 + n, data, data_len);
    return 8 + n + data_len;
}

Test(safetensors, reference_bytes, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    float data[6] = {0, 1, 2, 3, 4, 5};
    int64_t s123[3] = {1, 2, 3}, s1123[4] = {1, 1, 2, 3};
    unsigned char want[256];
    char path[128];
    test_tmp_path(path, sizeof path, "ref.safetensors");

    /* A 64-byte header needs no padding. */
    struct safetensors_tensor_desc a = {"attn.0", tensor_f32(data, 3, s123), DTYPE_F32};
    TEST_OK(safetensors_write(path, &a, 1, NULL, 0, &err), &err);
    const char *h1 = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    cr_assert_eq(strlen(h1), 64);
    expect_file_bytes(path, want, build_expected(want, h1, 0, data, sizeof data));

    /* A 65-byte header gets 7 spaces so the data starts 8-aligned. */
    struct safetensors_tensor_desc b = {"attn0", tensor_f32(data, 4, s1123), DTYPE_F32};
    TEST_OK(safetensors_write(path, &b, 1, NULL, 0, &err), &err);
    const char *h2 = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}";
    expect_file_bytes(path, want, build_expected(want, h2, 7, data, sizeof data));

    /* No tensors, then only metadata. */
    TEST_OK(safetensors_write(path, NULL, 0, NULL, 0, &err), &err);
    expect_file_bytes(path, want, build_expected(want, "{}", 6, NULL, 0));
    struct safetensors_kv md = {"framework", "pt"};
    TEST_OK(safetensors_write(path, NULL, 0, &md, 1, &err), &err);
    expect_file_bytes(path, want,
                      build_expected(want, "{\"__metadata__\":{\"framework\":\"pt\"}}", 5, NULL, 0));
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    cr_expect_eq(st->n_entries, 0);
    cr_expect_str_eq(safetensors_metadata_get(st, "framework"), "pt");
    cr_expect_null(safetensors_find(st, "x"));
    safetensors_close(st);
}

/* A file built by hand: an unpadded header (so data is unaligned), a scalar, metadata,
 * any key order, and an I64 tensor that is listed but cannot be loaded as floats. */
Test(safetensors, hand_built_file, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    const char *header =
        "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
        "\"__metadata__\":{\"format\":\"pt\"},"
        "\"pos\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}";
    cr_assert(strlen(header) % 8 != 0, "the test wants an unaligned data region");
    unsigned char data[16] = {0x80, 0x3f, 0x00, 0xc0, /* bf16 1.0, -2.0 */
                              0x00, 0x00, 0x00, 0x3f, /* f32 0.5 */
                              9, 0, 0, 0, 0, 0, 0, 0 /* i64 9 */};
    char path[128];
    test_tmp_path(path, sizeof path, "hand.safetensors");
    write_raw(path, header, 0, data, sizeof data);

    struct smelt_error err;
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    cr_assert_eq(st->n_entries, 3);
    cr_expect_str_eq(st->entries[0].name, "a"); /* sorted by name */
    cr_expect_str_eq(safetensors_metadata_get(st, "format"), "pt");
    const struct safetensors_entry *a = safetensors_find(st, "a");
    cr_assert(a);
    cr_expect_eq(a->ndim, 0);
    cr_expect_eq(a->numel, 1);
    int64_t one = 1, two = 2;
    float x = 0, b[2] = {0};
    TEST_OK(safetensors_read_f32(st, "a", &x, 1, &one, &err), &err);
    cr_expect_eq(x, 0.5f);
    TEST_OK(safetensors_read_f32(st, "b", b, 1, &two, &err), &err);
    cr_expect_eq(b[0], 1.0f);
    cr_expect_eq(b[1], -2.0f);
    const struct safetensors_entry *pos = safetensors_find(st, "pos");
    cr_assert(pos);
    cr_expect_eq(pos->dtype, SAFETENSORS_I64);
    cr_expect_str_eq(safetensors_dtype_name(pos->dtype), "I64");
    TEST_EXPECT_ERROR(safetensors_read_f32(st, "pos", &x, 1, &one, &err), SMELT_EUNSUPPORTED,
                      &err);
    cr_expect(strstr(err.message, path) && strstr(err.message, "'pos'") &&
                  strstr(err.message, "I64"),
              "names file, tensor and dtype: %s", err.message);
    expect_entries_in_bounds(st);
    safetensors_close(st);
}

Test(safetensors, read_errors_name_file_and_tensor, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    float w[15] = {0};
    int64_t s35[2] = {3, 5}, s53[2] = {5, 3}, s15[1] = {15};
    struct safetensors_tensor_desc d = {"model.embed_tokens.weight", tensor_f32(w, 2, s35),
                                        DTYPE_BF16};
    char path[128];
    test_tmp_path(path, sizeof path, "one.safetensors");
    TEST_OK(safetensors_write(path, &d, 1, NULL, 0, &err), &err);
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    TEST_EXPECT_ERROR(safetensors_read_f32(st, d.name, w, 2, s53, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, path) && strstr(err.message, d.name) &&
                  strstr(err.message, "[3, 5]") && strstr(err.message, "[5, 3]"),
              "names file, tensor, got and expected shapes: %s", err.message);
    TEST_EXPECT_ERROR(safetensors_read_f32(st, d.name, w, 1, s15, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(safetensors_read_f32(st, "lm_head.weight", w, 2, s35, &err),
                      SMELT_ENOTFOUND, &err);
    cr_expect(strstr(err.message, path) && strstr(err.message, "lm_head.weight"), "%s",
              err.message);
    struct tensor dev = tensor_make(BACKEND_CUDA, DTYPE_F32, w, 2, s35);
    TEST_EXPECT_ERROR(safetensors_read(st, d.name, &dev, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(safetensors_read_f32(st, d.name, NULL, 2, s35, &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(safetensors_read_f32(st, d.name, w, 0, s35, &err), SMELT_EINVAL, &err);
    safetensors_close(st);
    safetensors_close(NULL);

    char dir[128];
    test_tmp_path(dir, sizeof dir, "empty_dir");
    cr_assert_eq(mkdir(dir, 0755), 0);
    expect_open_fails(dir, SMELT_ENOTFOUND, "model.safetensors");
    test_tmp_path(path, sizeof path, "missing.safetensors");
    expect_open_fails(path, SMELT_ENOTFOUND, NULL);
}

/* ---- malformed files ---- */

Test(safetensors, header_lies, .init = test_tmp_setup, .fini = test_tmp_teardown) {
#define T(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
    /* overlap, gap, past the end, end before begin, trailing bytes */
    expect_bad_header("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
                      SMELT_EFORMAT, "overlap");
    expect_bad_header("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[1]", 12, 16) "}", 16,
                      SMELT_EFORMAT, "'b'");
    expect_bad_header("{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 8, 16) "}", 12,
                      SMELT_EFORMAT, "'b'");
    expect_bad_header("{" T("a", "F32", "[0]", 8, 4) "}", 8, SMELT_EFORMAT, "'a'");
    expect_bad_header("{" T("a", "F32", "[2]", 0, 8) "}", 9, SMELT_EFORMAT, "9 bytes");
    expect_bad_header("{}", 4, SMELT_EFORMAT, "4 bytes");
    /* size and dtype disagree; shapes whose size overflows */
    expect_bad_header("{" T("w", "F32", "[3]", 0, 8) "}", 8, SMELT_EFORMAT, "'w'");
    expect_bad_header("{" T("w", "BF16", "[2,2]", 0, 16) "}", 16, SMELT_EFORMAT, "'w'");
    expect_bad_header("{" T("w", "F32", "[4294967296,4294967296,4294967296]", 0, 0) "}", 0,
                      SMELT_EFORMAT, "'w'");
    expect_bad_header("{" T("w", "F64", "[2305843009213693952]", 0, 0) "}", 0, SMELT_EFORMAT,
                      "'w'");
    expect_bad_header("{" T("w", "F32", "[1,1,1,1,1]", 0, 4) "}", 4, SMELT_EUNSUPPORTED, "'w'");
    /* malformed entries */
    expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, SMELT_EFORMAT, "data_offsets");
    expect_bad_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SMELT_EFORMAT, "dtype");
    expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, SMELT_EFORMAT, "shape");
    expect_bad_header("{" T("w", "F128", "[1]", 0, 4) "}", 4, SMELT_EFORMAT, "F128");
    expect_bad_header("{" T("w", "F32", "[-1]", 0, 4) "}", 4, SMELT_EFORMAT, "'w'");
    expect_bad_header("{" T("w", "F32", "[1.0]", 0, 4) "}", 4, SMELT_EFORMAT, "'w'");
    expect_bad_header("{" T("w", "F32", "[1]", -4, 0) "}", 4, SMELT_EFORMAT, "'w'");
    expect_bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4,
                      SMELT_EFORMAT, "'w'");
    expect_bad_header("{\"w\":[1,2]}", 0, SMELT_EFORMAT, "'w'");
    expect_bad_header("{\"__metadata__\":{\"k\":1}}", 0, SMELT_EFORMAT, "__metadata__");
    expect_bad_header("{\"__metadata__\":[]}", 0, SMELT_EFORMAT, "__metadata__");
    /* not a JSON object, not JSON, duplicate keys */
    expect_bad_header("[1,2]    ", 0, SMELT_EFORMAT, "not a JSON object");
    expect_bad_header("\"text\"", 0, SMELT_EFORMAT, "header");
    expect_bad_header("{\"a\":", 0, SMELT_EFORMAT, "header");
    expect_bad_header("{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 0, 4) "}", 4,
                      SMELT_EFORMAT, "header");
    expect_bad_header("", 0, SMELT_EFORMAT, "header");
#undef T
    /* header length past the end of the file, and above the 100 MB limit */
    char path[128];
    test_tmp_path(path, sizeof path, "len.safetensors");
    write_raw(path, "{}", 3, NULL, 0);
    expect_open_fails(path, SMELT_EFORMAT, "header length 3");
    write_raw(path, "{}", 200000000, NULL, 0);
    expect_open_fails(path, SMELT_EFORMAT, "limit");
    write_raw(path, "{}", UINT64_MAX, NULL, 0);
    expect_open_fails(path, SMELT_EFORMAT, NULL);
    write_bytes(path, "abc", 3);
    expect_open_fails(path, SMELT_EFORMAT, "too short");
    write_bytes(path, "", 0);
    expect_open_fails(path, SMELT_EFORMAT, "too short");
}

/* A valid file with several tensors and metadata, for the mutation tests. */
static unsigned char *sample_file(const char *path, size_t *len) {
    struct smelt_error err;
    float f[12];
    for (int i = 0; i < 12; i++) f[i] = (float)i - 5.5f;
    int64_t s34[2] = {3, 4}, s5[1] = {5}, s1[1] = {1};
    struct safetensors_tensor_desc d[] = {
        {"embed", tensor_f32(f, 2, s34), DTYPE_F32},
        {"norm", tensor_f32(f, 1, s5), DTYPE_BF16},
        {"scale", tensor_f32(f, 1, s1), DTYPE_F16},
    };
    struct safetensors_kv md = {"format", "pt"};
    TEST_OK(safetensors_write(path, d, 3, &md, 1, &err), &err);
    return read_bytes(path, len);
}

Test(safetensors, every_truncation_fails, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    char path[128], cut[128];
    test_tmp_path(path, sizeof path, "full.safetensors");
    test_tmp_path(cut, sizeof cut, "cut.safetensors");
    size_t len;
    unsigned char *bytes = sample_file(path, &len);
    for (size_t n = 0; n < len; n++) {
        write_bytes(cut, bytes, n);
        struct smelt_error err;
        struct safetensors *st = NULL;
        error_clear(&err);
        int rc = safetensors_open(cut, &st, &err);
        cr_assert(rc != 0, "a file cut to %zu of %zu bytes opened", n, len);
        cr_assert(strstr(err.message, cut), "error at length %zu names no file: %s", n,
                  err.message);
    }
    write_bytes(cut, bytes, len);
    struct smelt_error err;
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(cut, &st, &err), &err);
    safetensors_close(st);
    free(bytes);
}

Test(safetensors, header_byte_flips_never_crash, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    char path[128], bad[128];
    test_tmp_path(path, sizeof path, "full.safetensors");
    test_tmp_path(bad, sizeof bad, "flip.safetensors");
    size_t len;
    unsigned char *bytes = sample_file(path, &len);
    uint64_t n;
    memcpy(&n, bytes, 8);
    static const unsigned char flips[] = {0x01, 0x04, 0x20, 0x80};
    int opened = 0, refused = 0;
    for (size_t at = 0; at < 8 + n; at++) {
        for (size_t f = 0; f < sizeof flips; f++) {
            bytes[at] ^= flips[f];
            write_bytes(bad, bytes, len);
            bytes[at] ^= flips[f];
            struct smelt_error err;
            struct safetensors *st = NULL;
            error_clear(&err);
            if (safetensors_open(bad, &st, &err) == 0) {
                /* e.g. a renamed tensor: still valid, and still in bounds */
                expect_entries_in_bounds(st);
                for (size_t i = 0; i < st->n_entries; i++) {
                    const struct safetensors_entry *e = &st->entries[i];
                    float *out = test_zeros_f32(e->numel);
                    struct tensor t = tensor_f32(out, e->ndim ? e->ndim : 1, e->shape);
                    safetensors_read(st, e->name, &t, &err);
                    free(out);
                }
                safetensors_close(st);
                opened++;
            } else {
                cr_assert(strstr(err.message, bad), "no file name: %s", err.message);
                refused++;
            }
        }
    }
    cr_expect(refused > opened, "most flips must be refused (%d refused, %d opened)", refused,
              opened);
    free(bytes);
}

/* ---- sharded directories ---- */

struct model_fixture {
    float embed[20], l0[16], l1[16], norm[4], head[20];
    struct safetensors_tensor_desc d[5];
};

static void fixture_init(struct model_fixture *m) {
    static const int64_t s54[2] = {5, 4}, s44[2] = {4, 4}, s4[1] = {4};
    struct test_rng rng = {99};
    float *all[5] = {m->embed, m->l0, m->l1, m->norm, m->head};
    int sizes[5] = {20, 16, 16, 4, 20};
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < sizes[k]; i++) all[k][i] = (float)test_rng_uniform(&rng, -1, 1);
    m->d[0] = (struct safetensors_tensor_desc){"model.embed_tokens.weight", tensor_f32(m->embed, 2, s54), DTYPE_BF16};
    m->d[1] = (struct safetensors_tensor_desc){"model.layers.0.w", tensor_f32(m->l0, 2, s44), DTYPE_BF16};
    m->d[2] = (struct safetensors_tensor_desc){"model.layers.1.w", tensor_f32(m->l1, 2, s44), DTYPE_BF16};
    m->d[3] = (struct safetensors_tensor_desc){"model.norm.weight", tensor_f32(m->norm, 1, s4), DTYPE_BF16};
    m->d[4] = (struct safetensors_tensor_desc){"lm_head.weight", tensor_f32(m->head, 2, s54), DTYPE_BF16};
}

static void expect_fixture_values(const struct safetensors *st, const struct model_fixture *m) {
    struct smelt_error err;
    for (int k = 0; k < 5; k++) {
        const struct tensor *t = &m->d[k].tensor;
        float got[20];
        TEST_OK(safetensors_read_f32(st, m->d[k].name, got, t->ndim, t->shape, &err), &err);
        const float *want = t->data;
        for (int64_t i = 0; i < tensor_numel(t); i++)
            cr_assert_eq(got[i], stored_as(want[i], DTYPE_BF16), "%s[%lld]", m->d[k].name,
                         (long long)i);
    }
}

static const char *const shard_files[3] = {
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
};

/* 40 + 32 + 32 + 8 + 40 bytes of bf16 with a 64-byte limit: {embed}, {l0, l1}, {norm, head}. */
static void write_sharded(const char *dir, struct model_fixture *m) {
    struct smelt_error err;
    struct safetensors_kv md = {"format", "pt"};
    TEST_OK(safetensors_write_dir(dir, m->d, 5, &md, 1, 64, &err), &err);
}

static int count_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

Test(safetensors, sharded_dir_roundtrip, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct model_fixture m;
    fixture_init(&m);
    char dir[128], path[192];
    test_tmp_path(dir, sizeof dir, "model");
    write_sharded(dir, &m);
    cr_expect_eq(count_dir_entries(dir), 4, "3 shards + index, no temporaries");

    struct smelt_error err;
    json_t *index = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_INDEX_FILE);
    TEST_OK(json_load_path(path, &index, &err), &err);
    json_t *wm = json_object_get(index, "weight_map");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(index, "metadata"), "total_size")), 152);
    int want_shard[5] = {0, 1, 1, 2, 2};
    for (int k = 0; k < 5; k++)
        cr_expect_str_eq(json_string_value(json_object_get(wm, m.d[k].name)),
                         shard_files[want_shard[k]]);
    json_decref(index);

    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(dir, &st, &err), &err);
    cr_expect_eq(st->n_shards, 3);
    cr_expect_eq(st->n_entries, 5);
    cr_expect_str_eq(safetensors_metadata_get(st, "format"), "pt");
    expect_fixture_values(st, &m);
    expect_entries_in_bounds(st);
    const struct safetensors_entry *e = safetensors_find(st, "lm_head.weight");
    cr_assert(e);
    cr_expect(strstr(st->shards[e->shard].path, shard_files[2]), "%s", st->shards[e->shard].path);
    safetensors_close(st);

    /* The index file itself opens the same set. */
    TEST_OK(safetensors_open(path, &st, &err), &err);
    cr_expect_eq(st->n_entries, 5);
    safetensors_close(st);

    /* Saving again unsharded writes model.safetensors and drops the stale index. */
    TEST_OK(safetensors_write_dir(dir, m.d, 5, NULL, 0, 0, &err), &err);
    cr_expect(!path_exists(path), "stale index removed");
    TEST_OK(safetensors_open(dir, &st, &err), &err);
    cr_expect_eq(st->n_shards, 1);
    cr_expect(strstr(st->path, SAFETENSORS_SINGLE_FILE) != NULL);
    expect_fixture_values(st, &m);
    safetensors_close(st);

    /* And sharded once more removes the stale single file. */
    write_sharded(dir, &m);
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_SINGLE_FILE);
    cr_expect(!path_exists(path), "stale model.safetensors removed");

    /* A limit every tensor fits under gives one file. */
    char dir2[128];
    test_tmp_path(dir2, sizeof dir2, "model2");
    TEST_OK(safetensors_write_dir(dir2, m.d, 5, NULL, 0, 1 << 20, &err), &err);
    cr_expect_eq(count_dir_entries(dir2), 1);
}

/* Rewrites the index of a sharded fixture with weight_map[key] = value. */
static void patch_index(const char *dir, const char *key, const char *value) {
    char path[192];
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_INDEX_FILE);
    struct smelt_error err;
    json_t *index = NULL;
    TEST_OK(json_load_path(path, &index, &err), &err);
    json_object_set_new(json_object_get(index, "weight_map"), key, json_string(value));
    cr_assert_eq(json_dump_file(index, path, JSON_INDENT(2)), 0);
    json_decref(index);
}

Test(safetensors, sharded_index_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct model_fixture m;
    fixture_init(&m);
    char dir[128], index[192];
    test_tmp_path(dir, sizeof dir, "model");
    snprintf(index, sizeof index, "%s/%s", dir, SAFETENSORS_INDEX_FILE);

    write_sharded(dir, &m);
    patch_index(dir, "ghost.weight", shard_files[0]);
    expect_open_fails(dir, SMELT_ENOTFOUND, "ghost.weight");

    write_sharded(dir, &m);
    patch_index(dir, "model.norm.weight", shard_files[0]);
    expect_open_fails(dir, SMELT_EFORMAT, "model.norm.weight");

    write_sharded(dir, &m);
    patch_index(dir, "x", "model-00009-of-00009.safetensors");
    expect_open_fails(dir, SMELT_EIO, "model-00009-of-00009.safetensors");

    write_sharded(dir, &m);
    patch_index(dir, "x", "../../etc/passwd");
    expect_open_fails(dir, SMELT_EFORMAT, "../../etc/passwd");

    write_text(index, "{\"metadata\":{}}");
    expect_open_fails(dir, SMELT_EFORMAT, "weight_map");
    write_text(index, "{\"weight_map\":{\"a\":3}}");
    expect_open_fails(dir, SMELT_EFORMAT, "'a'");
    write_text(index, "{\"weight_map\": ");
    expect_open_fails(dir, SMELT_EFORMAT, NULL);

    /* A tensor stored in two shards. */
    struct smelt_error err;
    char path[192];
    snprintf(path, sizeof path, "%s/%s", dir, shard_files[0]);
    TEST_OK(safetensors_write(path, &m.d[3], 1, NULL, 0, &err), &err);
    snprintf(path, sizeof path, "%s/%s", dir, shard_files[1]);
    TEST_OK(safetensors_write(path, &m.d[3], 1, NULL, 0, &err), &err);
    char text[512];
    snprintf(text, sizeof text, "{\"weight_map\":{\"model.norm.weight\":\"%s\",\"other\":\"%s\"}}",
             shard_files[0], shard_files[1]);
    write_text(index, text);
    expect_open_fails(dir, SMELT_EFORMAT, "both");

    /* A corrupt shard names the shard file. */
    write_sharded(dir, &m);
    snprintf(path, sizeof path, "%s/%s", dir, shard_files[1]);
    write_text(path, "garbage!garbage!");
    struct safetensors *st = NULL;
    TEST_EXPECT_ERROR(safetensors_open(dir, &st, &err), SMELT_EFORMAT, &err);
    cr_expect(strstr(err.message, shard_files[1]), "%s", err.message);
}

/* ---- writer errors ---- */

Test(safetensors, write_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    float f[4] = {0};
    int32_t ids[4] = {0};
    int64_t s4[1] = {4};
    char path[128];
    test_tmp_path(path, sizeof path, "w.safetensors");
    struct safetensors_tensor_desc dup[] = {{"a", tensor_f32(f, 1, s4), DTYPE_F32},
                                            {"a", tensor_f32(f, 1, s4), DTYPE_BF16}};
    TEST_EXPECT_ERROR(safetensors_write(path, dup, 2, NULL, 0, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'a'"), "%s", err.message);
    struct safetensors_tensor_desc bad[] = {
        {"__metadata__", tensor_f32(f, 1, s4), DTYPE_F32},
        {"", tensor_f32(f, 1, s4), DTYPE_F32},
        {NULL, tensor_f32(f, 1, s4), DTYPE_F32},
        {"ids", tensor_i32(ids, 1, s4), DTYPE_BF16},
        {"f", tensor_f32(f, 1, s4), DTYPE_I32},
        {"nodata", tensor_f32(NULL, 1, s4), DTYPE_F32},
        {"dev", tensor_make(BACKEND_CUDA, DTYPE_F32, f, 1, s4), DTYPE_F32},
        {"bad\xff utf8", tensor_f32(f, 1, s4), DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        TEST_EXPECT_ERROR(safetensors_write(path, &bad[i], 1, NULL, 0, &err), SMELT_EINVAL, &err);
    struct safetensors_kv md = {"k", NULL};
    TEST_EXPECT_ERROR(safetensors_write(path, dup, 1, &md, 1, &err), SMELT_EINVAL, &err);
    cr_expect(!path_exists(path), "no file after failed writes");
    TEST_EXPECT_ERROR(safetensors_write("/nonexistent-dir/x.safetensors", dup, 1, NULL, 0, &err),
                      SMELT_EIO, &err);
    cr_expect_eq(count_dir_entries(test_tmp_dir), 0, "no temporaries left behind");

    /* Overwriting an existing file replaces it whole. */
    write_text(path, "old contents that are longer than the new file will be ..........");
    TEST_OK(safetensors_write(path, dup, 1, NULL, 0, &err), &err);
    struct safetensors *st = NULL;
    TEST_OK(safetensors_open(path, &st, &err), &err);
    safetensors_close(st);
    cr_expect_eq(count_dir_entries(test_tmp_dir), 1);
}
