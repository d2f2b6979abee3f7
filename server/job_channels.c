/* What smeltd's job-facing CURVE ROUTERs share (the Tinker dispatcher, the rendezvous):
 * binding one as a CURVE server under a ZAP domain, and deciding a handshake by the job
 * attempt whose worker key the client shows (docs/security.md "Job channels"). */
#include <string.h>
#include <zmq.h>

#include "server/server_internal.h"

int server_curve_bind(struct server *s, void *router, const char *bind, const char *domain, zap_authorize_fn fn,
                      const char *field, char *endpoint, size_t cap, struct smelt_error *err) {
    if (!s->zap) return error_set(err, SMELT_EINVAL, "the %s socket needs smeltd's ZAP handler (s->zap)", domain);
    TRY(zap_handler_add_domain(s->zap, domain, fn, s, err));
    TRY(curve_socket_server(router, &s->curve, domain, err));
    if (zmq_bind(router, bind) != 0)
        return error_set_field(err, SMELT_EIO, field, "binding the %s endpoint %s: %s", domain, bind,
                               zmq_strerror(zmq_errno()));
    size_t len = cap;
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0)
        return error_set(err, SMELT_EIO, "ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
    return 0;
}

/* Runs on the ZAP thread, with a store connection of its own. */
bool server_attempt_of_key(struct server *s, const char *key, bool sessions_only, char *user_id, size_t cap,
                           char *why, size_t why_cap) {
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    json_t *row = NULL;
    const char *sql = sessions_only
                          ? "SELECT id, attempt FROM jobs WHERE worker_public_key = ? AND status = 'running' AND "
                            "devices IS NOT NULL AND json_extract(method, '$.type') = 'tinker'"
                          : "SELECT id, attempt FROM jobs WHERE worker_public_key = ? AND status = 'running' AND "
                            "devices IS NOT NULL";
    int rc = c ? store_query_one(c, &row, &err, sql, "s", key) : SMELT_EIO;
    if (c) store_release(s->store, c);
    const char *id = json_string_value(json_object_get(row, "id"));
    if (!rc && id)
        snprintf(user_id, cap, "%s.%lld", id, (long long)json_integer_value(json_object_get(row, "attempt")));
    else if (rc == SMELT_ENOTFOUND)
        snprintf(why, why_cap, "not the key of a running %s's attempt", sessions_only ? "session job" : "job");
    else snprintf(why, why_cap, "the store: %s", err.message);
    json_decref(row);
    return !rc && id;
}
