/* The standalone rendezvous store: a folder shared by the ranks (local disk for one
 * machine, a network file system across machines). One file per key, written through a
 * temporary and renamed into place, so a reader sees a whole value or nothing; readers
 * poll until a deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "comm/comm_internal.h"

struct file_store {
    struct comm_store base;
    char *dir;
    char job[65];
};

/* DIR/<job>.<key>, every key byte outside [A-Za-z0-9_-] written as %XX so that keys with
 * '/' stay in the folder and no key can look like another's temporary. */
static int key_path(const struct file_store *s, const char *key, char *path, size_t bytes,
                    struct smelt_error *err) {
    if (!key || !*key || strlen(key) >= COMM_KEY_BYTES)
        return error_set_field(err, SMELT_EINVAL, "key", "store key is empty or over %d bytes",
                               COMM_KEY_BYTES - 1);
    char name[3 * COMM_KEY_BYTES + 80];
    size_t n = (size_t)snprintf(name, sizeof name, "%s.", s->job);
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) {
        bool plain = (*k >= 'a' && *k <= 'z') || (*k >= 'A' && *k <= 'Z') ||
                     (*k >= '0' && *k <= '9') || *k == '-' || *k == '_';
        n += (size_t)snprintf(name + n, sizeof name - n, plain ? "%c" : "%%%02X", *k);
    }
    return path_join(path, bytes, s->dir, name, err);
}

static int file_set(void *impl, const char *key, const void *data, size_t len,
                    struct smelt_error *err) {
    char path[4096];
    TRY(key_path(impl, key, path, sizeof path, err));
    return error_wrap(err, file_write_atomic(path, data, len, err), "rendezvous set '%s'", key);
}

/* Polls every 2 ms at first, backing off to 20 ms: rendezvous waits are short. */
static int wait_path(const char *path, int timeout_ms) {
    int64_t deadline = mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    int pause = 2;
    while (!path_exists(path)) {
        if (mono_ms() >= deadline) return SMELT_ENOTFOUND;
        sleep_ms(pause);
        if (pause < 20) pause *= 2;
    }
    return SMELT_OK;
}

static int file_get(void *impl, const char *key, int timeout_ms, void **data, size_t *len,
                    struct smelt_error *err) {
    *data = NULL;
    *len = 0;
    char path[4096];
    TRY(key_path(impl, key, path, sizeof path, err));
    if (wait_path(path, timeout_ms))
        return error_set(err, SMELT_ENOTFOUND, "rendezvous key '%s' not set within %d ms", key,
                         timeout_ms);
    char *buf;
    TRY(error_wrap(err, file_read_all(path, &buf, len, err), "rendezvous get '%s'", key));
    *data = buf;
    return SMELT_OK;
}

static int file_wait(void *impl, const char *const *keys, size_t nkeys, int timeout_ms,
                     struct smelt_error *err) {
    int64_t deadline = mono_ms() + timeout_ms;
    for (size_t i = 0; i < nkeys; i++) {
        char path[4096];
        TRY(key_path(impl, keys[i], path, sizeof path, err));
        int64_t left = deadline - mono_ms();
        if (wait_path(path, left > 0 ? (int)left : 0))
            return error_set(err, SMELT_ENOTFOUND, "rendezvous key '%s' not set within %d ms",
                             keys[i], timeout_ms);
    }
    return SMELT_OK;
}

static void file_close(void *impl) {
    struct file_store *s = impl;
    free(s->dir);
    free(s);
}

static const struct comm_store_ops FILE_OPS = {file_set, file_get, file_wait, file_close};

int comm_store_file_create(const char *dir, const char *job, struct comm_store **out,
                           struct smelt_error *err) {
    TRY(error_in_field(err, dir_create_all(dir, err), "rendezvous"));
    struct file_store *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        free(s);
        return error_set(err, SMELT_ENOMEM, "rendezvous store: out of memory");
    }
    snprintf(s->job, sizeof s->job, "%s", job);
    s->base.ops = &FILE_OPS;
    s->base.impl = s;
    *out = &s->base;
    return SMELT_OK;
}
