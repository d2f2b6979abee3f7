/* Agent credentials (docs/security.md): an enrolled agent's CURVE keypair, of which the
 * store keeps only the public key. The ZAP handler of the agents socket admits a key only
 * while its credential is live, under the credential's id as ZAP user id; the control loop
 * maps that id back to the agent id on every message, so a credential revoked after the
 * handshake stops its connection's messages too. Used by the API (api_agent_credentials.c),
 * `smeltd agent-credential` (agent_credential_cli.c) and the control loop. */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

#define CREDENTIAL_PREFIX "agc-"
#define AGENT_ID_MAX_CHARS 63

static bool agent_id_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

int agent_credential_check_id(const char *agent_id, struct smelt_error *err) {
    size_t len = agent_id ? strlen(agent_id) : 0;
    bool ok = len >= 1 && len <= AGENT_ID_MAX_CHARS;
    for (size_t i = 0; ok && i < len; i++) ok = agent_id_char(agent_id[i]);
    if (!ok)
        return error_set_field(err, SMELT_EINVAL, "agent_id", "agent_id: 1 to %d letters, digits, '-', '_' or '.'",
                               AGENT_ID_MAX_CHARS);
    if (strcmp(agent_id, AGENT_LOCAL_ID) == 0)
        return error_set_field(err, SMELT_EINVAL, "agent_id", "agent_id: '%s' is smeltd's embedded agent",
                               AGENT_LOCAL_ID);
    return 0;
}

static json_t *object_of(json_t *row) {
    return json_pack("{s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:b}", "object", "agent_credential", "id",
                     json_object_get(row, "id"), "agent_id", json_object_get(row, "agent_id"), "description",
                     json_object_get(row, "description"), "public_key", json_object_get(row, "public_key"),
                     "created_at", json_object_get(row, "created_at"), "revoked_at",
                     json_object_get(row, "revoked_at"), "live", json_is_null(json_object_get(row, "revoked_at")));
}

static int credential_object(struct store_conn *c, const char *id, json_t **out, struct smelt_error *err) {
    json_t *row = NULL;
    int rc = store_query_one(c, &row, err, "SELECT * FROM agent_credentials WHERE id = ?", "s", id);
    if (rc == SMELT_ENOTFOUND) return error_set_field(err, rc, "credential_id", "no agent credential %s", id);
    if (rc) return rc;
    *out = object_of(row);
    json_decref(row);
    return *out ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
}

/* The key file's document: everything smelt-agent --credential needs. */
static json_t *key_file_doc(const char *id, const char *agent_id, const struct curve_keypair *keys,
                            const char *server_public_key, const char *endpoint) {
    json_t *doc = json_pack("{s:s, s:s, s:s, s:s, s:s}", "credential_id", id, "agent_id", agent_id, "public_key",
                            keys->public_key, "secret_key", keys->secret_key, "server_public_key",
                            server_public_key);
    if (doc && endpoint && json_object_set_new(doc, "endpoint", json_string(endpoint)) != 0) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

/* The insert of a new credential, in the caller's transaction. */
static int insert_credential(struct store_conn *c, const struct agent_credential_request *r, char *id, size_t cap,
                             json_t **key_file_out, struct smelt_error *err) {
    struct curve_keypair keys;
    TRY(curve_keypair_new(&keys, err));
    server_new_id(CREDENTIAL_PREFIX, id, cap);
    int rc = store_exec(c, err, "INSERT INTO agent_credentials (id, agent_id, public_key, description, created_at) "
                        "VALUES (?, ?, ?, ?, ?)", "ssssi", id, r->agent_id, keys.public_key,
                        r->description ? r->description : "", server_now());
    if (rc >= 0) {
        *key_file_out = key_file_doc(id, r->agent_id, &keys, r->server_public_key, r->endpoint);
        rc = *key_file_out ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
    }
    explicit_bzero(&keys, sizeof keys);
    return rc < 0 ? rc : 0;
}

static int live_credential_of(struct store_conn *c, const char *agent_id, json_t **row, struct smelt_error *err) {
    return store_query_one(c, row, err, "SELECT id FROM agent_credentials WHERE agent_id = ? AND revoked_at IS NULL",
                           "s", agent_id);
}

int agent_credential_create(struct store_conn *c, const struct agent_credential_request *r, json_t **object_out,
                            json_t **key_file_out, struct smelt_error *err) {
    *object_out = *key_file_out = NULL;
    TRY(agent_credential_check_id(r->agent_id, err));
    size_t chars = 0; /* the document's maxLength counts characters, not bytes */
    for (const char *p = r->description; p && *p; p++) chars += ((unsigned char)*p & 0xC0) != 0x80;
    if (chars > 256) return error_set_field(err, SMELT_EINVAL, "description", "description: at most 256 characters");
    TRY(store_begin(c, err));
    json_t *live = NULL;
    int rc = live_credential_of(c, r->agent_id, &live, err);
    if (rc == 0) {
        rc = error_set_field(err, SERVER_ESTATE, "agent_id", "agent %s already has a live credential (%s): rotate or "
                             "revoke it", r->agent_id, json_string_value(json_object_get(live, "id")));
        json_decref(live);
    } else if (rc == SMELT_ENOTFOUND) {
        error_clear(err);
        char id[HTTP_ID_BYTES];
        rc = insert_credential(c, r, id, sizeof id, key_file_out, err);
        if (!rc) rc = credential_object(c, id, object_out, err);
    }
    if (!rc) rc = store_commit(c, err);
    if (rc) {
        store_rollback(c);
        json_decref(*key_file_out);
        *key_file_out = NULL;
        json_decref(*object_out);
        *object_out = NULL;
    }
    return rc;
}

/* Marks id revoked (replaced_by may be NULL), in the caller's transaction. */
static int mark_revoked(struct store_conn *c, const char *id, const char *replaced_by, struct smelt_error *err) {
    json_t *row = NULL;
    int rc = store_query_one(c, &row, err, "SELECT revoked_at FROM agent_credentials WHERE id = ?", "s", id);
    if (rc == SMELT_ENOTFOUND) return error_set_field(err, rc, "credential_id", "no agent credential %s", id);
    if (rc) return rc;
    bool revoked = !json_is_null(json_object_get(row, "revoked_at"));
    json_decref(row);
    if (revoked)
        return error_set_field(err, SERVER_ESTATE, "credential_id", "agent credential %s is already revoked", id);
    rc = store_exec(c, err, "UPDATE agent_credentials SET revoked_at = ?, replaced_by = ? WHERE id = ?", "iss",
                    server_now(), replaced_by, id);
    return rc < 0 ? rc : 0;
}

int agent_credential_revoke(struct store_conn *c, const char *id, json_t **object_out, struct smelt_error *err) {
    *object_out = NULL;
    TRY(store_begin(c, err));
    int rc = mark_revoked(c, id, NULL, err);
    if (!rc) rc = credential_object(c, id, object_out, err);
    if (!rc) rc = store_commit(c, err);
    if (rc) store_rollback(c);
    return rc;
}

int agent_credential_rotate(struct store_conn *c, const char *id, const struct agent_credential_request *r,
                            json_t **object_out, json_t **key_file_out, struct smelt_error *err) {
    *object_out = *key_file_out = NULL;
    TRY(store_begin(c, err));
    json_t *old = NULL;
    int rc = store_query_one(c, &old, err, "SELECT agent_id, description FROM agent_credentials WHERE id = ?", "s",
                             id);
    if (rc == SMELT_ENOTFOUND) rc = error_set_field(err, rc, "credential_id", "no agent credential %s", id);
    char new_id[HTTP_ID_BYTES];
    if (!rc) {
        struct agent_credential_request same = *r;
        same.agent_id = json_string_value(json_object_get(old, "agent_id"));
        same.description = json_string_value(json_object_get(old, "description"));
        rc = insert_credential(c, &same, new_id, sizeof new_id, key_file_out, err);
    }
    if (!rc) rc = mark_revoked(c, id, new_id, err);
    if (!rc) rc = credential_object(c, new_id, object_out, err);
    if (!rc) rc = store_commit(c, err);
    json_decref(old);
    if (rc) {
        store_rollback(c);
        json_decref(*key_file_out);
        *key_file_out = NULL;
        json_decref(*object_out);
        *object_out = NULL;
    }
    return rc;
}

int agent_credential_list(struct store_conn *c, json_t **list_out, struct smelt_error *err) {
    json_t *rows = NULL;
    TRY(store_query(c, &rows, err, "SELECT * FROM agent_credentials ORDER BY rowid", ""));
    *list_out = json_array();
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) json_array_append_new(*list_out, object_of(row));
    json_decref(rows);
    return *list_out ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
}

int agent_credential_agent(struct store_conn *c, const char *credential_id, char *agent_id, size_t cap,
                           struct smelt_error *err) {
    json_t *row = NULL;
    TRY(store_query_one(c, &row, err, "SELECT agent_id FROM agent_credentials WHERE id = ? AND revoked_at IS NULL",
                        "s", credential_id));
    snprintf(agent_id, cap, "%s", json_string_value(json_object_get(row, "agent_id")));
    json_decref(row);
    return 0;
}

/* Runs on the ZAP handler's thread with a store connection of its own (the pool is
 * thread-safe); the store, not a copy, is the one truth, so `smeltd agent-credential
 * revoke` on a running smeltd's data directory takes effect at once too. */
bool agent_credentials_authorize(void *arg, const char *address, const char *client_public_key, char *user_id,
                                 size_t user_id_cap, char *why, size_t why_cap) {
    (void)address;
    struct server *s = arg;
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    if (!c) {
        snprintf(why, why_cap, "store: %s", err.message);
        return false;
    }
    json_t *row = NULL;
    int rc = store_query_one(c, &row, &err, "SELECT id FROM agent_credentials WHERE public_key = ? AND "
                             "revoked_at IS NULL", "s", client_public_key);
    store_release(s->store, c);
    if (rc) {
        snprintf(why, why_cap, "%s", rc == SMELT_ENOTFOUND ? "no live agent credential has this key" : err.message);
        return false;
    }
    snprintf(user_id, user_id_cap, "%s", json_string_value(json_object_get(row, "id")));
    json_decref(row);
    return true;
}
