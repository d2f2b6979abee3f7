/* The agents socket's security (docs/security.md): CURVE on smeltd's agents ROUTER, who sent
 * each message, where smeltd's messages to an agent go, failed handshakes in the log.
 *
 * Identity. With CURVE (the default) a remote agent is who its credential says: the ZAP
 * handler admits only live credentials' keys, and every message carries the credential's
 * id (struct msg's user_id), mapped here to the agent id on every message, so a credential
 * revoked after the handshake silences its connection at once. A message without a user id
 * can only have come over inproc (libzmq runs no security mechanism there): smeltd's own
 * embedded agent. With --insecure-agents the routing id is the agent id, as its sender says.
 *
 * Routes. A remote agent under CURVE sets no routing id of its own: the ROUTER numbers its
 * connection, and smeltd sends to an agent only on the route its last authenticated message
 * came on. A route chosen by the peer could be taken by another enrolled agent while its
 * owner reconnects, and that one would then receive the owner's launches.
 *
 * Everything here runs on the control thread, except what the ZAP handler calls
 * (agent_credentials_authorize). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/common.h"
#include "common/msg.h"
#include "server/server_internal.h"

#define AGENT_LINK_DOMAIN "agents"
#define AGENT_LINK_MONITOR "inproc://smeltd-agents-monitor"
#define AGENT_LINK_MAX_SESSIONS 1024
#define HANDSHAKE_LOG_EVERY_S 10 /* repeated failures (a client retrying) are counted, not each logged */

enum { FAILURE_AUTH, FAILURE_MECHANISM, FAILURE_CRYPTO, FAILURE_OTHER, FAILURE_KINDS };

struct agent_session {
    char agent_id[MSG_ROUTE_BYTES];
    char route[MSG_ROUTE_BYTES];
    size_t route_len;
    char credential_id[CURVE_USER_ID_BYTES]; /* "" for the embedded agent */
};

struct agent_link {
    bool curve;
    void *monitor; /* PAIR: the router's handshake failures */
    struct agent_session sessions[AGENT_LINK_MAX_SESSIONS];
    int n_sessions;
    /* per failure kind (failure_kind): when last logged, how many since */
    int64_t last_failure_log[FAILURE_KINDS];
    long failures_unlogged[FAILURE_KINDS];
};

bool agent_link_secure(const struct server *s) { return s->agent_link && s->agent_link->curve; }

static int open_monitor(struct server *s, struct agent_link *l, struct smelt_error *err) {
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(s->agent_router, AGENT_LINK_MONITOR, events) != 0)
        return error_set(err, SMELT_EIO, "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
    int linger = 0;
    l->monitor = zmq_socket(s->zmq, ZMQ_PAIR);
    if (!l->monitor || zmq_setsockopt(l->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(l->monitor, AGENT_LINK_MONITOR) != 0)
        return error_set(err, SMELT_EIO, "agents monitor: %s", zmq_strerror(zmq_errno()));
    return 0;
}

int agent_link_open(struct server *s, struct smelt_error *err) {
    struct agent_link *l = calloc(1, sizeof *l);
    if (!l) return error_set(err, SMELT_ENOMEM, "out of memory");
    s->agent_link = l;
    l->curve = !s->config.insecure_agents;
    if (!l->curve) {
        if (s->config.agent_bind)
            log_warn("smeltd: --insecure-agents: anyone who reaches %s can join the cluster as any agent and "
                     "read its jobs; the traffic is not encrypted", s->config.agent_bind);
        return 0;
    }
    TRY(zap_handler_add_domain(s->zap, AGENT_LINK_DOMAIN, agent_credentials_authorize, s, err));
    TRY(curve_socket_server(s->agent_router, &s->curve, AGENT_LINK_DOMAIN, err));
    return open_monitor(s, l, err);
}

void agent_link_close(struct server *s) {
    if (!s->agent_link) return;
    if (s->agent_link->monitor) zmq_close(s->agent_link->monitor);
    free(s->agent_link);
    s->agent_link = NULL;
}

/* ---- failed handshakes ---- */

static int failure_kind(uint16_t event, uint32_t value) {
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return FAILURE_AUTH;
    /* a plain client meeting a CURVE server: the mismatch, or (as libzmq 4.3 reports it) the
     * connection closed with no detail */
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
        (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH))
        return FAILURE_MECHANISM;
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        return FAILURE_CRYPTO;
    return FAILURE_OTHER;
}

static const char *const FAILURE_TEXT[FAILURE_KINDS] = {
    [FAILURE_AUTH] = "its key is no live agent credential's",
    [FAILURE_MECHANISM] = "no CURVE handshake (not CURVE: an agent without a credential?, or closed early)",
    [FAILURE_CRYPTO] = "cryptographic failure (a public key it holds no secret of, or another server key)",
    [FAILURE_OTHER] = "protocol error",
};

static void log_failure(struct agent_link *l, uint16_t event, uint32_t value, const char *endpoint) {
    int kind = failure_kind(event, value);
    int64_t now = server_now();
    if (l->last_failure_log[kind] && now - l->last_failure_log[kind] < HANDSHAKE_LOG_EVERY_S) {
        l->failures_unlogged[kind]++;
        return;
    }
    log_warn("control: refused a connection to the agents endpoint %s: %s (handshake event 0x%x, value 0x%x; %ld "
             "more since the last such line)", endpoint, FAILURE_TEXT[kind], (unsigned)event, (unsigned)value,
             l->failures_unlogged[kind]);
    l->last_failure_log[kind] = now;
    l->failures_unlogged[kind] = 0;
}

/* One monitor event: frame 1 = uint16 event + uint32 value, frame 2 = the endpoint. */
static bool read_event(void *monitor, uint16_t *event, uint32_t *value, char *endpoint, size_t cap) {
    unsigned char head[6];
    int n = zmq_recv(monitor, head, sizeof head, ZMQ_DONTWAIT);
    if (n < 0) return false;
    memcpy(event, head, sizeof *event);
    memcpy(value, head + 2, sizeof *value);
    int more = 0;
    size_t more_len = sizeof more;
    endpoint[0] = 0;
    if (zmq_getsockopt(monitor, ZMQ_RCVMORE, &more, &more_len) == 0 && more) {
        int len = zmq_recv(monitor, endpoint, cap - 1, 0);
        endpoint[len < 0 ? 0 : (size_t)len < cap - 1 ? (size_t)len : cap - 1] = 0;
    }
    return n == (int)sizeof head;
}

void agent_link_poll(struct server *s) {
    struct agent_link *l = s->agent_link;
    if (!l || !l->monitor) return;
    uint16_t event;
    uint32_t value;
    char endpoint[256];
    while (read_event(l->monitor, &event, &value, endpoint, sizeof endpoint)) log_failure(l, event, value, endpoint);
}

/* ---- sessions: agent id -> the route and credential of its last message ---- */

static struct agent_session *session_of(struct agent_link *l, const char *agent_id) {
    for (int i = 0; i < l->n_sessions; i++)
        if (strcmp(l->sessions[i].agent_id, agent_id) == 0) return &l->sessions[i];
    return NULL;
}

static void remember(struct agent_link *l, const char *agent_id, const struct msg *m, const char *credential_id) {
    struct agent_session *e = session_of(l, agent_id);
    if (!e && l->n_sessions == AGENT_LINK_MAX_SESSIONS) {
        log_error("control: more than %d agents; agent %s cannot be answered", AGENT_LINK_MAX_SESSIONS, agent_id);
        return;
    }
    if (!e) e = &l->sessions[l->n_sessions++];
    snprintf(e->agent_id, sizeof e->agent_id, "%s", agent_id);
    memcpy(e->route, m->route, m->route_len);
    e->route_len = m->route_len;
    snprintf(e->credential_id, sizeof e->credential_id, "%s", credential_id);
}

void agent_link_forget(struct server *s, const char *agent_id) {
    struct agent_link *l = s->agent_link;
    struct agent_session *e = l ? session_of(l, agent_id) : NULL;
    if (e) *e = l->sessions[--l->n_sessions];
}

/* The route as text, for an agent id without CURVE. */
static int route_text(const struct msg *m, char *agent_id, size_t cap) {
    if (m->route_len == 0 || m->route_len >= cap) return SMELT_EINVAL;
    memcpy(agent_id, m->route, m->route_len);
    agent_id[m->route_len] = 0;
    return strlen(agent_id) == m->route_len ? 0 : SMELT_EINVAL;
}

int agent_link_sender(struct server *s, struct store_conn *c, const struct msg *m, char *agent_id, size_t cap) {
    struct agent_link *l = s->agent_link;
    if (!l->curve || !m->user_id[0]) { /* insecure, or inproc: the embedded agent */
        if (route_text(m, agent_id, cap) != 0) return SMELT_EINVAL;
        if (l->curve && strcmp(agent_id, AGENT_LOCAL_ID) != 0) {
            log_warn("control: dropped a %s over inproc from '%s' (only the embedded agent connects there)",
                     m->type, agent_id);
            return SMELT_EINVAL;
        }
        remember(l, agent_id, m, "");
        return 0;
    }
    struct smelt_error err = {0};
    int rc = agent_credential_agent(c, m->user_id, agent_id, cap, &err);
    if (rc) {
        log_warn("control: dropped a %s from a connection of agent credential %s: %s", m->type, m->user_id,
                 rc == SMELT_ENOTFOUND ? "revoked" : err.message);
        return rc;
    }
    remember(l, agent_id, m, m->user_id);
    return 0;
}

bool agent_link_route(struct server *s, const char *agent_id, const void **route, size_t *len) {
    struct agent_link *l = s->agent_link;
    if (!l->curve) {
        *route = agent_id;
        *len = strlen(agent_id);
        return true;
    }
    const struct agent_session *e = session_of(l, agent_id);
    if (!e) return false;
    *route = e->route;
    *len = e->route_len;
    return true;
}

int agent_link_revoked(struct server *s, struct store_conn *c, char (*out)[MSG_ROUTE_BYTES], int max) {
    struct agent_link *l = s->agent_link;
    int n = 0;
    for (int i = 0; l && i < l->n_sessions && n < max; i++) {
        const struct agent_session *e = &l->sessions[i];
        char agent_id[MSG_ROUTE_BYTES];
        struct smelt_error err = {0};
        if (!e->credential_id[0]) continue;
        int rc = agent_credential_agent(c, e->credential_id, agent_id, sizeof agent_id, &err);
        if (rc == SMELT_ENOTFOUND) snprintf(out[n++], MSG_ROUTE_BYTES, "%s", e->agent_id);
        else if (rc) log_error("control: checking agent credential %s: %s", e->credential_id, err.message);
    }
    return n;
}
