/* Bearer API keys: stored as SHA-256 hex, each in a project; the first admin key is
 * created at first start. */
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server_internal.h"
#include "server/sha256.h"

int server_auth(void *app, const char *key, struct http_identity *out) {
    struct server *s = app;
    if (!key || strlen(key) < 8 || strlen(key) > 256) return SMELT_ENOTFOUND;
    char hash[65];
    sha256_hex(key, strlen(key), hash);
    struct smelt_error err = {0};
    struct store_conn *conn = store_acquire(s->store, &err);
    if (!conn) return SMELT_EIO;
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, &err, "SELECT id, project_id, admin FROM api_keys WHERE hash = ? "
                             "AND revoked = 0", "s", hash);
    store_release(s->store, conn);
    if (rc) return rc == SMELT_ENOTFOUND ? SMELT_ENOTFOUND : SMELT_EIO;
    memset(out, 0, sizeof *out);
    out->key_id = json_integer_value(json_object_get(row, "id"));
    snprintf(out->project, sizeof out->project, "%s", json_string_value(json_object_get(row, "project_id")));
    out->admin = json_integer_value(json_object_get(row, "admin")) != 0;
    json_decref(row);
    return 0;
}

/* Creates project (if new) and a key in it; *key_out receives the key's text. */
static int key_create(struct server *s, struct store_conn *conn, const char *project, const char *name,
                      bool admin, const char *given, char *key_out, size_t cap, int64_t *id_out,
                      struct smelt_error *err) {
    (void)s;
    char key[160];
    if (given) snprintf(key, sizeof key, "%s", given);
    else server_new_id("sk-smelt-", key, sizeof key);
    char hash[65];
    sha256_hex(key, strlen(key), hash);
    int64_t now = server_now();
    int rc = store_exec(conn, err, "INSERT OR IGNORE INTO projects (id, name, created_at) VALUES (?, ?, ?)",
                        "ssi", project, project, now);
    if (rc >= 0)
        rc = store_exec(conn, err, "INSERT INTO api_keys (project_id, name, hash, prefix, admin, created_at) "
                        "VALUES (?, ?, ?, ?, ?, ?)", "ssssii", project, name, hash,
                        (char[13]){key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7], key[8],
                                   key[9], key[10], key[11], 0}, (int64_t)admin, now);
    if (rc < 0) return rc;
    if (id_out) *id_out = store_last_insert_id(conn);
    snprintf(key_out, cap, "%s", key);
    return 0;
}

int server_auth_bootstrap(struct server *s, struct smelt_error *err) {
    struct store_conn *conn = store_acquire(s->store, err);
    if (!conn) return err->code;
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, err, "SELECT count(*) AS n FROM api_keys", "");
    if (rc) {
        store_release(s->store, conn);
        return rc;
    }
    int64_t n = json_integer_value(json_object_get(row, "n"));
    json_decref(row);
    if (n > 0) {
        store_release(s->store, conn);
        return 0;
    }
    const char *given = s->config.admin_key;
    if (given && (strlen(given) < 16 || strlen(given) > 128)) {
        store_release(s->store, conn);
        return error_set(err, SMELT_EINVAL, "admin key: 16 to 128 characters are needed");
    }
    char key[160];
    rc = key_create(s, conn, "default", "admin", true, given, key, sizeof key, NULL, err);
    store_release(s->store, conn);
    if (rc) return rc;
    if (!given) {
        char path[SERVER_PATH_BYTES + 16];
        snprintf(path, sizeof path, "%s/admin_key", s->data_dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, key, strlen(key)) != (ssize_t)strlen(key) || write(fd, "\n", 1) != 1) {
            if (fd >= 0) close(fd);
            return error_set(err, SMELT_EIO, "writing %s failed", path);
        }
        close(fd);
        log_info("smeltd: created the admin key of project 'default'; it is in %s", path);
    } else {
        log_info("smeltd: created the admin key of project 'default' from the configuration");
    }
    return 0;
}

/* POST /v1/api_keys {project, name?, admin?} (admin): a new key, shown once. */
void api_keys_create(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    static const char *const keys[] = {"project", "name", "admin", NULL};
    struct smelt_error err = {0};
    const char *project = NULL, *name = NULL;
    bool admin = false;
    if (json_check_keys(body, keys, "body", &err) || json_refuse_nulls(body, keys, "body", &err) ||
        json_field_string(body, "project", true, NULL, &project, "body", &err) ||
        json_field_string(body, "name", false, "key", &name, "body", &err) ||
        json_field_bool(body, "admin", false, false, &admin, "body", &err)) {
        json_decref(body);
        http_reply_error(res, 400, err.field[0] ? err.field : NULL, "invalid_value", "%s",
                         err.message);
        return;
    }
    size_t name_chars = 0; /* the document's maxLength counts characters, not bytes */
    for (const char *c = name; *c; c++) name_chars += ((unsigned char)*c & 0xC0) != 0x80;
    bool ok = strlen(project) > 0 && strlen(project) < 64 && name_chars < 128;
    for (const char *c = project; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
             *c == '_';
    if (!ok) {
        json_decref(body);
        http_reply_error(res, 400, "project", "invalid_value",
                         "project: 1 to 63 letters, digits, '-' or '_' (name: under 128 characters)");
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(body);
        return;
    }
    char key[160];
    int64_t id = 0;
    int rc = key_create(s, conn, project, name, admin, NULL, key, sizeof key, &id, &err);
    store_release(s->store, conn);
    if (rc) server_reply_failure(res, &err, NULL);
    else
        http_reply_json(res, 200, json_pack("{s:s, s:I, s:s, s:s, s:s, s:b}", "object", "api_key", "id",
                                            (json_int_t)id, "key", key, "project", project, "name", name,
                                            "admin", admin));
    json_decref(body);
}

void api_keys_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    (void)req;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err, "SELECT id, project_id AS project, name, prefix, admin, created_at, "
                         "revoked FROM api_keys ORDER BY id", "");
    store_release(s->store, conn);
    if (rc) server_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s, s:o}", "object", "list", "data", rows));
}

void api_keys_delete(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    char *end = NULL;
    long long id = strtoll(req->params[0], &end, 10);
    if (*end || id <= 0) {
        http_reply_error(res, 404, "key_id", "not_found", "No such API key: %s", req->params[0]);
        return;
    }
    if (id == req->identity.key_id) {
        http_reply_error(res, 409, "key_id", "invalid_state", "a key cannot revoke itself");
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    int rc = store_exec(conn, &err, "UPDATE api_keys SET revoked = 1 WHERE id = ? AND revoked = 0", "i",
                        (int64_t)id);
    store_release(s->store, conn);
    if (rc < 0) server_reply_failure(res, &err, NULL);
    else if (rc == 0) http_reply_error(res, 404, "key_id", "not_found", "No such API key: %s", req->params[0]);
    else http_reply_json(res, 200, json_pack("{s:s, s:I, s:b}", "object", "api_key", "id", (json_int_t)id,
                                             "deleted", 1));
}
