/* ZeroMQ CURVE keys and sockets (common/curve.h). */
#include "common/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/file.h"
#include "common/json.h"
#include "common/secret_fd.h"

bool curve_available(void) { return zmq_has("curve") != 0; }

int curve_keypair_new(struct curve_keypair *out, struct smelt_error *err) {
    if (!curve_available()) return error_set(err, SMELT_EUNSUPPORTED, "this libzmq has no CURVE");
    if (zmq_curve_keypair(out->public_key, out->secret_key) != 0)
        return error_set(err, SMELT_EIO, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    return 0;
}

bool curve_key_valid(const char *text) {
    if (!text || strlen(text) != CURVE_KEY_CHARS) return false;
    uint8_t raw[32];
    return zmq_z85_decode(raw, text) != NULL;
}

int curve_public_of(const char *secret_key, char public_key[CURVE_KEY_BYTES], const char *field,
                    struct smelt_error *err) {
    if (!curve_key_valid(secret_key))
        return error_set_field(err, SMELT_EINVAL, field, "%s: not a CURVE key (40 Z85 characters)", field);
    if (zmq_curve_public(public_key, secret_key) != 0)
        return error_set_field(err, SMELT_EINVAL, field, "%s: zmq_curve_public: %s", field,
                               zmq_strerror(zmq_errno()));
    return 0;
}

static int set_option(void *socket, int option, const void *value, size_t len, const char *name,
                      struct smelt_error *err) {
    if (zmq_setsockopt(socket, option, value, len) != 0)
        return error_set(err, SMELT_EIO, "zmq_setsockopt %s: %s", name, zmq_strerror(zmq_errno()));
    return 0;
}

int curve_socket_server(void *socket, const struct curve_keypair *self, const char *domain,
                        struct smelt_error *err) {
    int on = 1;
    TRY(set_option(socket, ZMQ_CURVE_SERVER, &on, sizeof on, "ZMQ_CURVE_SERVER", err));
    TRY(set_option(socket, ZMQ_CURVE_SECRETKEY, self->secret_key, CURVE_KEY_CHARS, "ZMQ_CURVE_SECRETKEY",
                   err));
    return set_option(socket, ZMQ_ZAP_DOMAIN, domain, strlen(domain), "ZMQ_ZAP_DOMAIN", err);
}

int curve_socket_client(void *socket, const struct curve_keypair *self, const char *server_public,
                        struct smelt_error *err) {
    if (!curve_key_valid(server_public))
        return error_set(err, SMELT_EINVAL, "server public key: not a CURVE key");
    TRY(set_option(socket, ZMQ_CURVE_SERVERKEY, server_public, CURVE_KEY_CHARS, "ZMQ_CURVE_SERVERKEY", err));
    TRY(set_option(socket, ZMQ_CURVE_PUBLICKEY, self->public_key, CURVE_KEY_CHARS, "ZMQ_CURVE_PUBLICKEY",
                   err));
    return set_option(socket, ZMQ_CURVE_SECRETKEY, self->secret_key, CURVE_KEY_CHARS, "ZMQ_CURVE_SECRETKEY",
                      err);
}

/* ---- key files ---- */

int curve_key_file_write(const char *path, const struct curve_keypair *keys, json_t *extra,
                         struct smelt_error *err) {
    json_t *doc = extra ? json_deep_copy(extra) : json_object();
    if (!doc || json_object_set_new(doc, "public_key", json_string(keys->public_key)) ||
        json_object_set_new(doc, "secret_key", json_string(keys->secret_key))) {
        json_decref(doc);
        return error_set(err, SMELT_ENOMEM, "key file: out of memory");
    }
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(doc);
    if (!text) return error_set(err, SMELT_ENOMEM, "key file: out of memory");
    /* Created 0600 from the start: never a moment where another user can read it. */
    int rc = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) rc = error_set(err, SMELT_EIO, "%s: %s", path, strerror(errno));
    else {
        size_t len = strlen(text), done = 0;
        while (!rc && done < len) {
            ssize_t n = write(fd, text + done, len - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) rc = error_set(err, SMELT_EIO, "%s: write: %s", path, strerror(errno));
            else done += (size_t)n;
        }
        if (!rc && (write(fd, "\n", 1) != 1 || fsync(fd) != 0))
            rc = error_set(err, SMELT_EIO, "%s: %s", path, strerror(errno));
        if (close(fd) != 0 && !rc) rc = error_set(err, SMELT_EIO, "%s: close: %s", path, strerror(errno));
        if (rc) unlink(path);
    }
    explicit_bzero(text, strlen(text));
    free(text);
    return rc;
}

static int key_field(json_t *doc, const char *path, const char *name, char out[CURVE_KEY_BYTES],
                     struct smelt_error *err) {
    const char *v = json_string_value(json_object_get(doc, name));
    if (!v || !curve_key_valid(v))
        return error_set_field(err, SMELT_EFORMAT, name, "%s: %s: missing or not a CURVE key (40 Z85 characters)",
                               path, name);
    memcpy(out, v, CURVE_KEY_BYTES);
    return 0;
}

int curve_key_file_read(const char *path, struct curve_keypair *keys, json_t **extra_out,
                        struct smelt_error *err) {
    if (extra_out) *extra_out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return error_set(err, SMELT_ENOTFOUND, "%s: %s", path, strerror(errno));
    if (st.st_mode & (S_IRWXG | S_IRWXO))
        return error_set(err, SMELT_EINVAL, "%s: mode %03o lets other users read a secret key (chmod 600 it)",
                         path, (unsigned)(st.st_mode & 0777));
    json_t *doc = NULL;
    TRY(json_load_path(path, &doc, err));
    if (!json_is_object(doc)) {
        json_decref(doc);
        return error_set(err, SMELT_EFORMAT, "%s: not a JSON object", path);
    }
    int rc = key_field(doc, path, "public_key", keys->public_key, err);
    if (!rc) rc = key_field(doc, path, "secret_key", keys->secret_key, err);
    char derived[CURVE_KEY_BYTES];
    if (!rc) rc = curve_public_of(keys->secret_key, derived, "secret_key", err);
    if (!rc && strcmp(derived, keys->public_key) != 0)
        rc = error_set_field(err, SMELT_EFORMAT, "public_key", "%s: public_key is not the secret key's", path);
    if (!rc && extra_out) *extra_out = json_incref(doc);
    json_decref(doc);
    return rc;
}

int curve_key_file_load_or_create(const char *path, struct curve_keypair *keys, struct smelt_error *err) {
    if (path_exists(path)) return curve_key_file_read(path, keys, NULL, err);
    TRY(curve_keypair_new(keys, err));
    return curve_key_file_write(path, keys, NULL, err);
}

bool curve_authorize_single_key(void *arg, const char *address, const char *client_public_key,
                                char *user_id, size_t user_id_cap, char *why, size_t why_cap) {
    (void)address;
    const struct curve_single_key *k = arg;
    if (strcmp(client_public_key, k->public_key) != 0) {
        snprintf(why, why_cap, "not the channel's key");
        return false;
    }
    snprintf(user_id, user_id_cap, "%s", k->user_id);
    return true;
}

json_t *curve_job_keys_json(const struct curve_job_keys *keys) {
    return json_pack("{s:s, s:s, s:s}", "worker_public_key", keys->worker.public_key, "worker_secret_key",
                     keys->worker.secret_key, "server_public_key", keys->server_public_key);
}

int curve_job_keys_from_json(const json_t *obj, struct curve_job_keys *out, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    static const char *const names[] = {"worker_public_key", "worker_secret_key", "server_public_key"};
    char *const dst[] = {out->worker.public_key, out->worker.secret_key, out->server_public_key};
    for (int i = 0; i < 3; i++) {
        const char *v = json_string_value(json_object_get(obj, names[i]));
        if (!v || !curve_key_valid(v))
            return error_set_field(err, SMELT_EINVAL, names[i], "%s: missing or not a CURVE key", names[i]);
        memcpy(dst[i], v, CURVE_KEY_BYTES);
    }
    char derived[CURVE_KEY_BYTES];
    TRY(curve_public_of(out->worker.secret_key, derived, "worker_secret_key", err));
    if (strcmp(derived, out->worker.public_key) != 0)
        return error_set_field(err, SMELT_EINVAL, "worker_public_key", "worker_public_key is not the secret's");
    out->present = true;
    return 0;
}

int curve_job_keys_for_child(const struct curve_job_keys *keys, char ***envp, int *read_fd,
                             struct smelt_error *err) {
    *read_fd = -1;
    if (!keys || !keys->present) return 0;
    json_t *secret = curve_job_keys_json(keys);
    if (!secret) return error_set(err, SMELT_ENOMEM, "keys: out of memory");
    int rc = secret_fd_for_child(secret, envp, read_fd, err);
    json_decref(secret); /* jansson does not wipe: the strings were copies of keys, freed here */
    return rc;
}

int curve_job_keys_take(struct curve_job_keys *out, struct smelt_error *err) {
    memset(out, 0, sizeof *out);
    json_t *secret = NULL;
    TRY(secret_fd_take(&secret, err));
    if (!secret) return 0;
    int rc = curve_job_keys_from_json(secret, out, err);
    json_decref(secret);
    if (rc) return error_wrap(err, rc, "the launch's keys");
    return 0;
}
