/* /v1/cluster/agent_credentials (admin keys only; docs/security.md): enroll an agent (the
 * key file is answered once, never stored), list, revoke, rotate. A revocation takes effect
 * at the control loop's next pass, which it asks for at once. */
#include <stdbool.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

/* Whether endpoint binds every interface (0.0.0.0, the star or [::] as its host): an
 * address an agent on another machine cannot connect to. */
static bool wildcard_bind(const char *endpoint) {
    static const char *const wild[] = {"tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:", "tcp://::"};
    for (size_t i = 0; i < sizeof wild / sizeof *wild; i++)
        if (strncmp(endpoint, wild[i], strlen(wild[i])) == 0) return true;
    return false;
}

/* The key file names smeltd's agents endpoint only when smeltd knows one an agent can
 * reach: the request's, else the bind address unless it is a wildcard (then the agent
 * needs --server). */
static void request_of(struct server *s, struct agent_credential_request *r) {
    memset(r, 0, sizeof *r);
    r->server_public_key = s->curve.public_key;
    const char *bind = s->config.agent_bind;
    r->endpoint = bind && !wildcard_bind(bind) ? bind : NULL;
}

/* The credential with its key file, or the failure, as the reply. Takes both. */
static void reply_with_key_file(struct http_response *res, int rc, const struct smelt_error *err, json_t *object,
                                json_t *key_file) {
    if (rc) {
        server_reply_failure(res, err, err->field[0] ? err->field : NULL);
        return;
    }
    json_object_set_new(object, "key_file", key_file);
    http_reply_json(res, 200, object);
}

/* POST /v1/cluster/agent_credentials {agent_id, description?} */
void api_agent_credentials_create(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    static const char *const keys[] = {"agent_id", "description", "endpoint", NULL};
    struct smelt_error err = {0};
    struct agent_credential_request r;
    request_of(s, &r);
    if (json_check_keys(body, keys, "body", &err) ||
        json_field_string(body, "agent_id", true, NULL, &r.agent_id, "body", &err) ||
        json_field_string(body, "description", false, "", &r.description, "body", &err) ||
        json_field_string(body, "endpoint", false, r.endpoint, &r.endpoint, "body", &err) ||
        (r.endpoint && strncmp(r.endpoint, "tcp://", 6) != 0 &&
         error_set_field(&err, SMELT_EINVAL, "endpoint", "endpoint: a tcp://HOST:PORT address is required"))) {
        server_reply_failure(res, &err, err.field[0] ? err.field : NULL);
        json_decref(body);
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (conn) {
        json_t *object = NULL, *key_file = NULL;
        int rc = agent_credential_create(conn, &r, &object, &key_file, &err);
        store_release(s->store, conn);
        if (!rc) log_info("smeltd: agent credential %s created for agent %s",
                          json_string_value(json_object_get(object, "id")), r.agent_id);
        reply_with_key_file(res, rc, &err, object, key_file);
    }
    json_decref(body);
}

void api_agent_credentials_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    (void)req;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *list = NULL;
    int rc = agent_credential_list(conn, &list, &err);
    store_release(s->store, conn);
    if (rc) server_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s, s:o}", "object", "list", "data", list));
}

/* POST /v1/cluster/agent_credentials/{credential_id}/revoke */
void api_agent_credentials_revoke(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *object = NULL;
    int rc = agent_credential_revoke(conn, req->params[0], &object, &err);
    store_release(s->store, conn);
    if (rc) {
        server_reply_failure(res, &err, "credential_id");
        return;
    }
    log_warn("smeltd: agent credential %s of agent %s revoked", req->params[0],
             json_string_value(json_object_get(object, "agent_id")));
    atomic_store(&s->kick, 1); /* the agent on it is lost now, not at the next tick */
    http_reply_json(res, 200, object);
}

/* POST /v1/cluster/agent_credentials/{credential_id}/rotate */
void api_agent_credentials_rotate(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    struct agent_credential_request r;
    request_of(s, &r);
    json_t *object = NULL, *key_file = NULL;
    int rc = agent_credential_rotate(conn, req->params[0], &r, &object, &key_file, &err);
    store_release(s->store, conn);
    if (!rc) {
        log_warn("smeltd: agent credential %s rotated: %s replaces it", req->params[0],
                 json_string_value(json_object_get(object, "id")));
        atomic_store(&s->kick, 1);
    }
    if (rc && !err.field[0]) snprintf(err.field, sizeof err.field, "credential_id");
    reply_with_key_file(res, rc, &err, object, key_file);
}
