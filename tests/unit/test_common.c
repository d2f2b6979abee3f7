/* common/: errors (formatting, wrapping, truncation), JSON loading and typed fields,
 * file utilities in a temporary directory, and logging levels and line format. */
#include "tests/unit/testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot create %s", path);
    fputs(text, f);
    fclose(f);
}

/* ---- errors ---- */

Test(common, error_set_and_clear) {
    struct smelt_error err;
    error_clear(&err);
    cr_expect_eq(error_set(&err, SMELT_EIO, "%s: %d bytes", "model.bin", 42), SMELT_EIO);
    cr_expect_eq(err.code, SMELT_EIO);
    cr_expect_str_eq(err.message, "model.bin: 42 bytes");
    cr_expect_eq(error_set(NULL, SMELT_EFORMAT, "ignored"), SMELT_EFORMAT, "NULL err still returns the code");
    error_clear(&err);
    cr_expect(err.code == SMELT_OK && err.message[0] == '\0');
    error_clear(NULL);
}

Test(common, error_set_truncates) {
    struct smelt_error err;
    char long_text[2000];
    memset(long_text, 'a', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    error_set(&err, SMELT_EINVAL, "%s", long_text);
    cr_expect_eq(strlen(err.message), SMELT_ERROR_MESSAGE_BYTES - 1);
    cr_expect_eq(err.code, SMELT_EINVAL);
}

Test(common, error_wrap) {
    struct smelt_error err;
    error_set(&err, SMELT_EFORMAT, "bad header");
    cr_expect_eq(error_wrap(&err, SMELT_EFORMAT, "loading %s", "model.safetensors"), SMELT_EFORMAT);
    cr_expect_str_eq(err.message, "loading model.safetensors: bad header");
    cr_expect_eq(error_wrap(&err, SMELT_EFORMAT, "job %d", 7), SMELT_EFORMAT);
    cr_expect_str_eq(err.message, "job 7: loading model.safetensors: bad header");

    /* Success passes through untouched. */
    error_clear(&err);
    cr_expect_eq(error_wrap(&err, SMELT_OK, "context"), SMELT_OK);
    cr_expect_str_eq(err.message, "");
    cr_expect_eq(err.code, SMELT_OK);

    /* Long prefix and long message: truncated to the buffer, NUL-terminated, prefix first. */
    char long_text[700];
    memset(long_text, 'm', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    error_set(&err, SMELT_EIO, "%s", long_text);
    memset(long_text, 'p', sizeof long_text - 1);
    cr_expect_eq(error_wrap(&err, SMELT_EIO, "%s", long_text), SMELT_EIO);
    cr_expect_eq(strlen(err.message), SMELT_ERROR_MESSAGE_BYTES - 1);
    cr_expect(err.message[0] == 'p' && err.message[SMELT_ERROR_MESSAGE_BYTES - 2] == 'p', "prefix kept first");

    error_set(&err, SMELT_EIO, "short");
    long_text[400] = '\0';
    error_wrap(&err, SMELT_EIO, "%s", long_text);
    cr_expect_eq(strlen(err.message), 400 + 2 + 5);
    cr_expect(strcmp(err.message + 400, ": short") == 0, "tail: %s", err.message + 400);
}

/* A failing callee's code survives wrapping whatever err holds: no failure becomes
 * SMELT_OK, none changes its code, none goes unexplained. */
Test(common, error_wrap_never_loses_a_failure) {
    static const int codes[] = {SMELT_EINVAL, SMELT_ENOMEM, SMELT_EIO, SMELT_EFORMAT,
                                SMELT_ENOTFOUND, SMELT_EUNSUPPORTED, SMELT_EBACKEND};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        int code = codes[i];
        /* No err to fill: the code comes back as it was (an ENOMEM stays ENOMEM). */
        cr_expect_eq(error_wrap(NULL, code, "context"), code, "%s with err NULL", error_code_name(code));

        /* The callee failed without filling err: still the callee's code, and a message. */
        struct smelt_error err = {0};
        cr_expect_eq(error_wrap(&err, code, "loading %s", "x"), code);
        cr_expect_eq(err.code, code);
        cr_expect(strncmp(err.message, "loading x: ", 11) == 0, "message: %s", err.message);
        cr_expect(strstr(err.message, error_code_name(code)) != NULL, "names the code: %s", err.message);

        /* err holds another code than the callee returned: the returned code wins, err follows. */
        error_set(&err, SMELT_EINVAL, "stale");
        cr_expect_eq(error_wrap(&err, code, "ctx"), code);
        cr_expect_eq(err.code, code);
    }
}

Test(common, error_fields) {
    struct smelt_error err;
    error_clear(&err);
    cr_expect_str_eq(err.field, "");
    cr_expect_eq(error_set_field(&err, SMELT_EINVAL, "epochs", "bad %d", 1), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "epochs");
    cr_expect_str_eq(err.message, "bad 1");
    cr_expect_eq(error_in_field(&err, SMELT_EINVAL, "hyperparameters"), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "hyperparameters.epochs");
    /* Wrapping adds to the message and keeps the field. */
    error_wrap(&err, SMELT_EINVAL, "job");
    cr_expect_str_eq(err.field, "hyperparameters.epochs");
    cr_expect_str_eq(err.message, "job: bad 1");
    /* Success is not placed anywhere; a fieldless failure gets the outer name. */
    cr_expect_eq(error_in_field(&err, SMELT_OK, "x"), SMELT_OK);
    cr_expect_str_eq(err.field, "hyperparameters.epochs");
    error_set(&err, SMELT_EINVAL, "no field");
    cr_expect_str_eq(err.field, "", "error_set names no field");
    error_in_field(&err, SMELT_EINVAL, "lora");
    cr_expect_str_eq(err.field, "lora");
    cr_expect_eq(error_in_field(NULL, SMELT_ENOMEM, "x"), SMELT_ENOMEM);
    cr_expect_eq(error_set_field(NULL, SMELT_EIO, "f", "x"), SMELT_EIO);
    error_clear(&err);
    cr_expect_str_eq(err.field, "");
}

Test(common, error_code_names) {
    cr_expect_str_eq(error_code_name(SMELT_OK), "OK");
    cr_expect_str_eq(error_code_name(SMELT_EINVAL), "EINVAL");
    cr_expect_str_eq(error_code_name(SMELT_ENOMEM), "ENOMEM");
    cr_expect_str_eq(error_code_name(SMELT_EIO), "EIO");
    cr_expect_str_eq(error_code_name(SMELT_EFORMAT), "EFORMAT");
    cr_expect_str_eq(error_code_name(SMELT_ENOTFOUND), "ENOTFOUND");
    cr_expect_str_eq(error_code_name(SMELT_EUNSUPPORTED), "EUNSUPPORTED");
    cr_expect_str_eq(error_code_name(SMELT_EBACKEND), "EBACKEND");
    cr_expect_str_eq(error_code_name(-99), "EUNKNOWN");
}

/* ---- JSON ---- */

Test(common, json_load_path_errors, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[128];
    json_t *root = NULL;

    test_tmp_path(path, sizeof path, "ok.json");
    write_text(path, "{\"a\": 1}\n");
    TEST_OK(json_load_path(path, &root, &err), &err);
    cr_expect(json_is_object(root));
    json_decref(root);

    test_tmp_path(path, sizeof path, "bad.json");
    write_text(path, "{\n  \"a\": 1,\n  \"b\": [1, 2,,]\n}\n");
    TEST_EXPECT_ERROR(json_load_path(path, &root, &err), SMELT_EFORMAT, &err);
    char want[160];
    snprintf(want, sizeof want, "%s:3:", path);
    cr_expect(strstr(err.message, want) == err.message, "message starts with file:line: %s", err.message);

    test_tmp_path(path, sizeof path, "dup.json");
    write_text(path, "{\"a\": 1, \"a\": 2}");
    TEST_EXPECT_ERROR(json_load_path(path, &root, &err), SMELT_EFORMAT, &err);
    cr_expect(strstr(err.message, "dup.json:1:") != NULL, "message: %s", err.message);

    test_tmp_path(path, sizeof path, "empty.json");
    write_text(path, "");
    TEST_EXPECT_ERROR(json_load_path(path, &root, &err), SMELT_EFORMAT, &err);

    test_tmp_path(path, sizeof path, "missing.json");
    TEST_EXPECT_ERROR(json_load_path(path, &root, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, path) != NULL, "message names the file: %s", err.message);
}

Test(common, json_load_buffer) {
    struct smelt_error err;
    json_t *root = NULL;
    const char good[] = "[1, 2, 3]";
    TEST_OK(json_load_buffer(good, strlen(good), "request body", &root, &err), &err);
    cr_expect_eq(json_array_size(root), 3);
    json_decref(root);
    const char bad[] = "{\"x\": tru}";
    TEST_EXPECT_ERROR(json_load_buffer(bad, strlen(bad), "request body", &root, &err), SMELT_EFORMAT, &err);
    cr_expect(strstr(err.message, "request body:1:") == err.message, "message: %s", err.message);
    /* Only len bytes are parsed: a valid prefix of a longer buffer loads. */
    TEST_OK(json_load_buffer("{}garbage", 2, "prefix", &root, &err), &err);
    json_decref(root);
}

static json_t *parse(const char *text) {
    json_error_t jerr;
    json_t *v = json_loads(text, 0, &jerr);
    cr_assert(v, "test JSON does not parse: %s", jerr.text);
    return v;
}

Test(common, json_field_int) {
    struct smelt_error err;
    json_t *o = parse("{\"n\": 5, \"big\": 9000000000, \"real\": 4.0, \"frac\": 4.5, \"s\": \"5\","
                      " \"nul\": null, \"b\": true, \"neg\": -3}");
    int64_t x = 0;
    TEST_OK(json_field_int(o, "n", true, 0, 0, 10, &x, "spec", &err), &err);
    cr_expect_eq(x, 5);
    TEST_OK(json_field_int(o, "big", true, 0, 0, INT64_MAX, &x, "spec", &err), &err);
    cr_expect_eq(x, 9000000000LL);
    TEST_OK(json_field_int(o, "real", true, 0, 0, 10, &x, "spec", &err), &err);
    cr_expect_eq(x, 4, "4.0 reads as 4");
    TEST_OK(json_field_int(o, "absent", false, 77, 0, 10, &x, "spec", &err), &err);
    cr_expect_eq(x, 77, "default for an absent optional field (not range-checked)");
    TEST_OK(json_field_int(o, "nul", false, 8, 0, 10, &x, "spec", &err), &err);
    cr_expect_eq(x, 8, "null is absent");
    TEST_OK(json_field_int(o, "neg", true, 0, -5, 5, &x, "spec", &err), &err);
    cr_expect_eq(x, -3);

    TEST_EXPECT_ERROR(json_field_int(o, "absent", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "spec") && strstr(err.message, "'absent'"), "message: %s", err.message);
    TEST_EXPECT_ERROR(json_field_int(o, "nul", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "missing") != NULL, "null counts as missing: %s", err.message);
    TEST_EXPECT_ERROR(json_field_int(o, "s", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'s'") && strstr(err.message, "integer"), "message: %s", err.message);
    TEST_EXPECT_ERROR(json_field_int(o, "frac", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(json_field_int(o, "b", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    x = 123;
    TEST_EXPECT_ERROR(json_field_int(o, "n", true, 0, 6, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'n'") && strstr(err.message, "5") && strstr(err.message, "[6, 10]"),
              "message names field, value and range: %s", err.message);
    cr_expect_eq(x, 123, "out not written on error");
    TEST_EXPECT_ERROR(json_field_int(o, "neg", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    json_t *arr = parse("[1]");
    TEST_EXPECT_ERROR(json_field_int(arr, "n", false, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "object") != NULL, "message: %s", err.message);
    json_decref(arr);
    json_decref(o);
}

Test(common, json_field_double_bool_string) {
    struct smelt_error err;
    json_t *o = parse("{\"lr\": 0.001, \"i\": 3, \"s\": \"x\", \"t\": true, \"f\": false, \"nul\": null}");
    double d = 0;
    TEST_OK(json_field_double(o, "lr", true, 0, 0, 1, &d, "hp", &err), &err);
    cr_expect(d == 0.001);
    TEST_OK(json_field_double(o, "i", true, 0, 0, 10, &d, "hp", &err), &err);
    cr_expect(d == 3.0, "an integer is a number");
    TEST_OK(json_field_double(o, "nul", false, 0.5, 0, 1, &d, "hp", &err), &err);
    cr_expect(d == 0.5);
    TEST_EXPECT_ERROR(json_field_double(o, "lr", true, 0, 0.01, 1, &d, "hp", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'lr'") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(json_field_double(o, "s", true, 0, 0, 1, &d, "hp", &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(json_field_double(o, "t", true, 0, 0, 1, &d, "hp", &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(json_field_double(o, "gone", true, 0, 0, 1, &d, "hp", &err), SMELT_EINVAL, &err);

    bool b = false;
    TEST_OK(json_field_bool(o, "t", true, false, &b, "hp", &err), &err);
    cr_expect(b);
    TEST_OK(json_field_bool(o, "f", true, true, &b, "hp", &err), &err);
    cr_expect(!b);
    TEST_OK(json_field_bool(o, "gone", false, true, &b, "hp", &err), &err);
    cr_expect(b);
    TEST_EXPECT_ERROR(json_field_bool(o, "i", true, false, &b, "hp", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "'i'") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(json_field_bool(o, "nul", true, false, &b, "hp", &err), SMELT_EINVAL, &err);

    const char *s = NULL;
    TEST_OK(json_field_string(o, "s", true, NULL, &s, "hp", &err), &err);
    cr_expect_str_eq(s, "x");
    TEST_OK(json_field_string(o, "gone", false, "dflt", &s, "hp", &err), &err);
    cr_expect_str_eq(s, "dflt");
    TEST_OK(json_field_string(o, "nul", false, NULL, &s, "hp", &err), &err);
    cr_expect(s == NULL);
    TEST_EXPECT_ERROR(json_field_string(o, "lr", true, NULL, &s, "hp", &err), SMELT_EINVAL, &err);
    TEST_EXPECT_ERROR(json_field_string(o, "gone", true, NULL, &s, "hp", &err), SMELT_EINVAL, &err);
    json_decref(o);
}

Test(common, json_check_keys) {
    struct smelt_error err;
    static const char *const allowed[] = {"lr", "epochs", "batch_size", NULL};
    json_t *ok = parse("{\"lr\": 1, \"epochs\": 2}"), *bad = parse("{\"lr\": 1, \"epoch\": 2}");
    json_t *empty = parse("{}"), *arr = parse("[]");
    TEST_OK(json_check_keys(ok, allowed, "hyperparameters", &err), &err);
    TEST_OK(json_check_keys(empty, allowed, "hyperparameters", &err), &err);
    TEST_EXPECT_ERROR(json_check_keys(bad, allowed, "hyperparameters", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "hyperparameters") && strstr(err.message, "'epoch'"), "message: %s", err.message);
    TEST_EXPECT_ERROR(json_check_keys(arr, allowed, "hyperparameters", &err), SMELT_EINVAL, &err);
    json_decref(ok), json_decref(bad), json_decref(empty), json_decref(arr);
}

/* Every reader's refusal names its key in err.field (the HTTP API's `param` is built from
 * it, never from the message). */
Test(common, json_errors_name_the_field) {
    struct smelt_error err;
    json_t *o = json_pack("{s:i, s:s, s:i, s:f}", "n", 42, "s", "x", "b", 1, "d", 5.0);
    int64_t x;
    double d;
    bool b;
    const char *str;
    TEST_EXPECT_ERROR(json_field_int(o, "missing", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "missing");
    TEST_EXPECT_ERROR(json_field_int(o, "n", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "n");
    TEST_EXPECT_ERROR(json_field_int(o, "s", true, 0, 0, 10, &x, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "s");
    TEST_EXPECT_ERROR(json_field_double(o, "d", true, 0, 0, 1, &d, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "d");
    TEST_EXPECT_ERROR(json_field_double(o, "s", true, 0, 0, 1, &d, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "s");
    TEST_EXPECT_ERROR(json_field_bool(o, "b", true, false, &b, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "b");
    TEST_EXPECT_ERROR(json_field_string(o, "n", true, NULL, &str, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "n");
    static const char *const allowed[] = {"n", "s", "b", NULL};
    TEST_EXPECT_ERROR(json_check_keys(o, allowed, "spec", &err), SMELT_EINVAL, &err);
    cr_expect_str_eq(err.field, "d");
    json_decref(o);
}

Test(common, json_unknown_key) {
    static const char *const allowed[] = {"a", "b", NULL}, *const none[] = {NULL};
    json_t *ok = parse("{\"a\": 1, \"b\": 2}"), *bad = parse("{\"a\": 1, \"c\": 2}");
    cr_expect_null(json_unknown_key(ok, allowed));
    cr_expect_str_eq(json_unknown_key(bad, allowed), "c");
    cr_expect_str_eq(json_unknown_key(ok, none), "a");
    json_decref(ok), json_decref(bad);
}

Test(common, json_string_lossy) {
    json_t *ok = json_string_lossy("h\xC3\xA9", 3), *cut = json_string_lossy("a\xC3", 2),
           *bad = json_string_lossy("\xFF" "b", 2);
    cr_assert(ok && cut && bad);
    cr_expect_str_eq(json_string_value(ok), "h\xC3\xA9");
    cr_expect_str_eq(json_string_value(cut), "a\xEF\xBF\xBD");
    cr_expect_str_eq(json_string_value(bad), "\xEF\xBF\xBD" "b");
    json_decref(ok), json_decref(cut), json_decref(bad);
}

Test(common, args_parse) {
    struct smelt_error err;
    const char *model = NULL, *out = NULL;
    bool bf16 = false;
    const struct args_option options[] = {
        {"--model", &model, NULL}, {"--out", &out, NULL}, {"--bf16", NULL, &bf16}, {NULL, NULL, NULL}};
    char *ok[] = {"tool", "cmd", "--bf16", "--model", "m", NULL};
    TEST_OK(args_parse(5, ok, 2, options, &err), &err);
    cr_expect(bf16 && model && strcmp(model, "m") == 0 && !out);
    char *unknown[] = {"tool", "cmd", "--modle", "m", NULL};
    TEST_EXPECT_ERROR(args_parse(4, unknown, 2, options, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "--modle"), "message: %s", err.message);
    char *missing[] = {"tool", "cmd", "--out", NULL};
    TEST_EXPECT_ERROR(args_parse(3, missing, 2, options, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "--out needs a value"), "message: %s", err.message);
}

/* ---- random numbers ---- */

/* splitmix64's published first outputs from state 0 (Vigna's reference code): every
 * seeded stream in smelt derives from this mixer, so a change to it would change
 * shuffles, dropout masks and samples everywhere. */
Test(common, rng_mix64_is_splitmix64) {
    cr_expect_eq(rng_mix64(RNG_GOLDEN), 0xe220a8397b1dcdafull);
    cr_expect_eq(rng_mix64(2 * RNG_GOLDEN), 0x6e789e6aa1b965f4ull);
    cr_expect_eq(rng_mix64(3 * RNG_GOLDEN), 0x06c45d188009454full);
}

/* ---- files ---- */

Test(common, file_read_all, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[128];
    char *buf = NULL;
    size_t len = 0;
    test_tmp_path(path, sizeof path, "a.txt");
    write_text(path, "hello\nworld");
    TEST_OK(file_read_all(path, &buf, &len, &err), &err);
    cr_expect_eq(len, 11);
    cr_expect_str_eq(buf, "hello\nworld");
    free(buf);

    test_tmp_path(path, sizeof path, "empty.txt");
    write_text(path, "");
    TEST_OK(file_read_all(path, &buf, NULL, &err), &err);
    cr_expect_str_eq(buf, "", "an empty file is an empty string");
    free(buf);

    test_tmp_path(path, sizeof path, "missing.txt");
    TEST_EXPECT_ERROR(file_read_all(path, &buf, &len, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "missing.txt") != NULL, "message: %s", err.message);
    TEST_EXPECT_ERROR(file_read_all(test_tmp_dir, &buf, &len, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "regular") != NULL, "a directory is refused: %s", err.message);
}

/* Number of entries in dir (a leftover temporary file would show up here). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert(d, "cannot open %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

Test(common, file_write_atomic, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[128], *buf = NULL;
    size_t len = 0;
    test_tmp_path(path, sizeof path, "out.json");
    TEST_OK(file_write_atomic(path, "first", 5, &err), &err);
    TEST_OK(file_read_all(path, &buf, &len, &err), &err);
    cr_expect_str_eq(buf, "first");
    free(buf);
    TEST_OK(file_write_atomic(path, "2nd", 3, &err), &err); /* replaces, shorter */
    TEST_OK(file_read_all(path, &buf, &len, &err), &err);
    cr_expect(len == 3 && strcmp(buf, "2nd") == 0, "got '%s'", buf);
    free(buf);
    TEST_OK(file_write_atomic(path, "", 0, &err), &err);
    TEST_OK(file_read_all(path, &buf, &len, &err), &err);
    cr_expect_eq(len, 0);
    free(buf);
    struct stat st;
    cr_assert(stat(path, &st) == 0);
    cr_expect_eq(st.st_mode & 0777, 0644, "mode %o", st.st_mode & 0777);
    cr_expect_eq(count_entries(test_tmp_dir), 1, "temporary files left behind");

    char missing[160];
    test_tmp_path(missing, sizeof missing, "no/such/dir/f");
    TEST_EXPECT_ERROR(file_write_atomic(missing, "x", 1, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "no/such/dir/f") != NULL, "message: %s", err.message);

    /* Renaming over a directory fails: the temporary file is removed again. */
    char sub[160];
    test_tmp_path(sub, sizeof sub, "subdir");
    cr_assert(mkdir(sub, 0755) == 0);
    TEST_EXPECT_ERROR(file_write_atomic(sub, "x", 1, &err), SMELT_EIO, &err);
    cr_expect_eq(count_entries(test_tmp_dir), 2, "temporary file left after a failed rename");
}

Test(common, dir_create_all_and_paths, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[160];
    test_tmp_path(path, sizeof path, "a/b/c");
    TEST_OK(dir_create_all(path, &err), &err);
    cr_expect(path_is_dir(path) && path_exists(path));
    TEST_OK(dir_create_all(path, &err), &err); /* existing: fine */
    test_tmp_path(path, sizeof path, "a/b/d/");
    TEST_OK(dir_create_all(path, &err), &err); /* trailing slash */
    cr_expect(path_is_dir(path));

    test_tmp_path(path, sizeof path, "file");
    write_text(path, "x");
    cr_expect(path_exists(path) && !path_is_dir(path));
    TEST_EXPECT_ERROR(dir_create_all(path, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "not a directory") != NULL, "message: %s", err.message);
    test_tmp_path(path, sizeof path, "file/sub");
    TEST_EXPECT_ERROR(dir_create_all(path, &err), SMELT_EIO, &err);
    TEST_EXPECT_ERROR(dir_create_all("", &err), SMELT_EINVAL, &err);
    test_tmp_path(path, sizeof path, "nothing");
    cr_expect(!path_exists(path) && !path_is_dir(path));
}

Test(common, path_join) {
    struct smelt_error err;
    char buf[16];
    TEST_OK(path_join(buf, sizeof buf, "a", "b", &err), &err);
    cr_expect_str_eq(buf, "a/b");
    TEST_OK(path_join(buf, sizeof buf, "a/", "b", &err), &err);
    cr_expect_str_eq(buf, "a/b", "no doubled slash");
    TEST_OK(path_join(buf, sizeof buf, "", "b", &err), &err);
    cr_expect_str_eq(buf, "b");
    TEST_OK(path_join(buf, sizeof buf, "/data", "x.json", &err), &err); /* 13 + NUL: fits */
    cr_expect_str_eq(buf, "/data/x.json");
    TEST_OK(path_join(buf, sizeof buf, "0123456", "89abcde", &err), &err); /* exactly 15 */
    TEST_EXPECT_ERROR(path_join(buf, sizeof buf, "0123456", "89abcdef", &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "too long") != NULL, "message: %s", err.message);
    cr_expect(memchr(buf, '\0', sizeof buf) != NULL, "dst stays NUL-terminated");
}

Test(common, file_map, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[128];
    struct file_map map;
    test_tmp_path(path, sizeof path, "w.bin");
    write_text(path, "0123456789");
    TEST_OK(file_map_open(path, &map, &err), &err);
    cr_expect(map.len == 10 && memcmp(map.data, "0123456789", 10) == 0);
    file_map_close(&map);
    cr_expect(map.data == NULL && map.len == 0);
    file_map_close(&map); /* twice: harmless */

    test_tmp_path(path, sizeof path, "empty.bin");
    write_text(path, "");
    TEST_OK(file_map_open(path, &map, &err), &err);
    cr_expect(map.data == NULL && map.len == 0, "empty file maps to NULL, 0");
    file_map_close(&map);

    test_tmp_path(path, sizeof path, "missing.bin");
    TEST_EXPECT_ERROR(file_map_open(path, &map, &err), SMELT_EIO, &err);
    cr_expect(strstr(err.message, "missing.bin") != NULL, "message: %s", err.message);
    cr_expect(map.data == NULL && map.len == 0);
    TEST_EXPECT_ERROR(file_map_open(test_tmp_dir, &map, &err), SMELT_EIO, &err);
}

/* ---- logging ---- */

Test(common, log_level_parse) {
    enum log_level l = LOG_LEVEL_OFF;
    const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(log_level_parse(names[i], &l), SMELT_OK, "%s", names[i]);
        cr_expect_eq(l, (enum log_level)i);
    }
    cr_expect_eq(log_level_parse("WARN", &l), SMELT_OK, "case does not matter");
    cr_expect_eq(l, LOG_LEVEL_WARN);
    l = LOG_LEVEL_INFO;
    cr_expect_eq(log_level_parse("warning", &l), SMELT_EINVAL);
    cr_expect_eq(log_level_parse("", &l), SMELT_EINVAL);
    cr_expect_eq(log_level_parse(NULL, &l), SMELT_EINVAL);
    cr_expect_eq(l, LOG_LEVEL_INFO, "out untouched on failure");
}

/* Lines go to stderr: capture them in a file and check format and level filtering. */
Test(common, log_lines, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    char path[128];
    test_tmp_path(path, sizeof path, "log.txt");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    int saved = dup(STDERR_FILENO);
    cr_assert(saved >= 0 && dup2(fd, STDERR_FILENO) >= 0);
    log_set_level(LOG_LEVEL_WARN);
    cr_expect_eq(log_get_level(), LOG_LEVEL_WARN);
    log_info("hidden %d", 1);
    log_warn("shown %d", 2);
    log_error("also shown");
    char huge[5000];
    memset(huge, 'z', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    log_error("%s", huge); /* truncated, still one line */
    log_set_level(LOG_LEVEL_OFF);
    log_error("off means off");
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);

    char *text = NULL;
    size_t len = 0;
    struct smelt_error err;
    TEST_OK(file_read_all(path, &text, &len, &err), &err);
    cr_expect(strstr(text, "hidden") == NULL, "info below warn was written");
    cr_expect(strstr(text, "off means off") == NULL, "level off still wrote");
    const char *w = strstr(text, "WARN  test_common.c:");
    cr_expect(w && strstr(w, " shown 2\n") != NULL, "warn line: %s", text);
    cr_expect(strstr(text, "ERROR test_common.c:") != NULL, "error line: %s", text);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    cr_expect_eq(lines, 3, "one line per call: %d", lines);
    cr_expect(text[len - 1] == '\n', "last line ends with a newline");
    cr_expect(text[4] == '-' && text[10] == 'T' && strchr(text, 'Z') != NULL, "timestamp: %.30s", text);
    free(text);
}

Test(common, dir_remove_all_removes_trees_not_link_targets, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err = {0};
    char tree[256], deep[256], file[256], keep[256], link[256];
    test_tmp_path(tree, sizeof tree, "tree");
    test_tmp_path(deep, sizeof deep, "tree/a/b/c");
    test_tmp_path(file, sizeof file, "tree/a/b/f.txt");
    test_tmp_path(keep, sizeof keep, "keep.txt");
    test_tmp_path(link, sizeof link, "tree/a/link");
    TEST_OK(dir_create_all(deep, &err), &err);
    TEST_OK(file_write_atomic(file, "x", 1, &err), &err);
    TEST_OK(file_write_atomic(keep, "y", 1, &err), &err);
    cr_assert_eq(symlink(keep, link), 0);
    TEST_OK(dir_remove_all(tree, &err), &err);
    cr_expect(!path_exists(tree));
    cr_expect(path_exists(keep), "the link's target was removed");
    TEST_OK(dir_remove_all(tree, &err), &err); /* missing is fine */
}

/* The text of dir/name ("" when it cannot be read). */
static const char *read_in(const char *dir, const char *name, char *out, size_t cap) {
    char path[512], *buf = NULL;
    size_t len = 0;
    struct smelt_error err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    out[0] = '\0';
    if (file_read_all(path, &buf, &len, &err) == 0) snprintf(out, cap, "%.*s", (int)len, buf);
    free(buf);
    return out;
}

Test(common, dir_replace_swaps_a_finished_directory_in, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err = {0};
    char dst[256], src[256], f[300], text[32];
    test_tmp_path(dst, sizeof dst, "ckpt");
    test_tmp_path(src, sizeof src, "ckpt.partial");
    TEST_OK(dir_create_all(src, &err), &err);
    snprintf(f, sizeof f, "%s/state.json", src);
    TEST_OK(file_write_atomic(f, "old", 3, &err), &err);
    TEST_OK(dir_replace(src, dst, &err), &err); /* nothing at dst yet */
    cr_expect_str_eq(read_in(dst, "state.json", text, sizeof text), "old");
    cr_expect(!path_exists(src));

    TEST_OK(dir_create_all(src, &err), &err); /* a full directory is replaced whole */
    snprintf(f, sizeof f, "%s/other.json", src);
    TEST_OK(file_write_atomic(f, "new", 3, &err), &err);
    TEST_OK(dir_replace(src, dst, &err), &err);
    cr_expect_str_eq(read_in(dst, "other.json", text, sizeof text), "new");
    cr_expect_str_eq(read_in(dst, "state.json", text, sizeof text), "", "a file of the old directory stayed");
    cr_expect(!path_exists(src), "the old directory was not removed");

    /* a source that is not there fails and leaves dst as it was */
    TEST_EXPECT_ERROR(dir_replace(src, dst, &err), SMELT_EIO, &err);
    cr_expect_str_eq(read_in(dst, "other.json", text, sizeof text), "new");
}

/* Puts and removes in a scrambled order against a plain array: every key present maps to its value, every removed
 * key is gone (backward-shift deletion keeps probe runs whole), and the count agrees. */
Test(common, strmap_agrees_with_an_array_through_puts_and_removes) {
    enum { N = 600 };
    static int values[N];
    bool in[N] = {0};
    struct strmap m = {0};
    struct smelt_error err = {0};
    char key[32];
    uint64_t x = 12345;
    for (int round = 0; round < 6000; round++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((x >> 33) % N);
        snprintf(key, sizeof key, "model-%d:train:%d", k, k * 7);
        if (in[k] && (x >> 20) % 3 == 0) {
            cr_assert_eq(strmap_remove(&m, key), &values[k], "remove %s", key);
            in[k] = false;
        } else {
            TEST_OK(strmap_put(&m, key, &values[k], &err), &err);
            in[k] = true;
        }
    }
    size_t n = 0;
    for (int k = 0; k < N; k++) {
        snprintf(key, sizeof key, "model-%d:train:%d", k, k * 7);
        cr_expect_eq(strmap_get(&m, key), in[k] ? &values[k] : NULL, "%s", key);
        n += in[k];
    }
    cr_expect_eq(m.count, n);
    cr_expect_null(strmap_remove(&m, "absent"));
    strmap_free(&m);
    cr_expect_null(strmap_get(&m, "model-1:train:7"));
}

/* SIGTERM and SIGINT set the stop flag and nothing else (criterion runs each test in its own process). */
Test(common, stop_signals_set_the_flag) {
    struct smelt_error err = {0};
    TEST_OK(stop_on_signals(&err), &err);
    cr_assert_eq(atomic_load(stop_flag()), 0);
    cr_assert_eq(raise(SIGTERM), 0);
    cr_expect_eq(atomic_load(stop_flag()), 1, "SIGTERM did not set the flag");
    atomic_store(stop_flag(), 0);
    cr_assert_eq(raise(SIGINT), 0);
    cr_expect_eq(atomic_load(stop_flag()), 1, "SIGINT did not set the flag");
}
