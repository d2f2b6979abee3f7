/* /v1/cluster: agents and their devices (what runs where), how agents connect
 * (agents_security), and the queue with each waiting job's position and the reason it waits. Jobs of other projects show as
 * occupied devices and queue places without their ids. */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

void api_cluster(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *agents = NULL, *alloc = NULL, *queued = NULL;
    int rc = store_query(conn, &agents, &err, "SELECT id, hostname, devices AS devices__json, registered_at, "
                         "last_seen, status FROM agents ORDER BY id", "");
    if (!rc)
        rc = store_query(conn, &alloc, &err, "SELECT id, project_id, agent_id, status, devices AS devices__json "
                         "FROM jobs WHERE devices IS NOT NULL", "");
    if (!rc)
        rc = store_query(conn, &queued, &err, "SELECT id, project_id, priority, devices_wanted, queued_at, devices "
                         "FROM jobs WHERE status = 'queued' ORDER BY priority DESC, seq", "");
    store_release(s->store, conn);
    if (rc) {
        json_decref(agents);
        json_decref(alloc);
        json_decref(queued);
        server_reply_failure(res, &err, NULL);
        return;
    }
    const char *project = req->identity.project;
    int64_t best_free = 0;
    json_t *out_agents = json_array();
    size_t i, k, j;
    json_t *agent, *job, *d;
    json_array_foreach(agents, i, agent) {
        json_t *devices = json_array();
        int64_t free_count = 0;
        bool online = strcmp(json_string_value(json_object_get(agent, "status")), "online") == 0;
        json_t *dev;
        json_array_foreach(json_object_get(agent, "devices"), k, dev) {
            json_t *o = json_deep_copy(dev);
            json_t *holder = json_null();
            int64_t index = json_integer_value(json_object_get(dev, "index"));
            json_array_foreach(alloc, j, job) {
                if (strcmp(json_string_value(json_object_get(job, "agent_id")) ?: "",
                           json_string_value(json_object_get(agent, "id"))) != 0)
                    continue;
                size_t q;
                json_array_foreach(json_object_get(job, "devices"), q, d) {
                    if (json_integer_value(d) != index) continue;
                    bool mine = strcmp(json_string_value(json_object_get(job, "project_id")), project) == 0;
                    holder = mine ? json_incref(json_object_get(job, "id")) : json_string("(another project)");
                }
            }
            if (json_is_null(holder) && online) free_count++;
            json_object_set_new(o, "job_id", holder);
            json_object_set_new(o, "state", json_string(json_is_null(json_object_get(o, "job_id"))
                                                            ? (online ? "free" : "unavailable") : "allocated"));
            json_array_append_new(devices, o);
        }
        if (free_count > best_free) best_free = free_count;
        json_array_append_new(out_agents, json_pack("{s:O, s:O, s:O, s:O, s:O, s:o, s:I}", "id",
                                                    json_object_get(agent, "id"), "hostname",
                                                    json_object_get(agent, "hostname"), "status",
                                                    json_object_get(agent, "status"), "registered_at",
                                                    json_object_get(agent, "registered_at"), "last_seen",
                                                    json_object_get(agent, "last_seen"), "devices", devices,
                                                    "free_devices", (json_int_t)free_count));
    }
    json_t *queue = json_array();
    int64_t now = server_now();
    const char *head = NULL;
    bool any_online = false;
    json_array_foreach(agents, i, agent)
        any_online |= strcmp(json_string_value(json_object_get(agent, "status")), "online") == 0;
    json_array_foreach(queued, i, job) {
        bool mine = strcmp(json_string_value(json_object_get(job, "project_id")), project) == 0;
        int64_t want = json_integer_value(json_object_get(job, "devices_wanted"));
        char reason[256];
        if (!any_online) snprintf(reason, sizeof reason, "no agent is online");
        else if (!json_is_null(json_object_get(job, "devices")))
            snprintf(reason, sizeof reason, "its previous worker is still stopping");
        else if (head)
            snprintf(reason, sizeof reason, "behind %s in the queue (first in, first out within a priority)", head);
        else if (want > best_free)
            snprintf(reason, sizeof reason, "needs %lld device(s) on one agent; at most %lld free", (long long)want,
                     (long long)best_free);
        else snprintf(reason, sizeof reason, "starting");
        if (!head) head = mine ? json_string_value(json_object_get(job, "id")) : "a job of another project";
        json_array_append_new(queue, json_pack("{s:o, s:I, s:O, s:O, s:I, s:s}", "job_id",
                                               mine ? json_incref(json_object_get(job, "id")) : json_null(),
                                               "position", (json_int_t)i + 1, "priority",
                                               json_object_get(job, "priority"), "devices_wanted",
                                               json_object_get(job, "devices_wanted"), "waiting_seconds",
                                               (json_int_t)(now - json_integer_value(json_object_get(job, "queued_at"))),
                                               "reason", reason));
    }
    /* "curve": agents prove their credential and the traffic is encrypted (docs/security.md) */
    json_t *out = json_pack("{s:s, s:s, s:o, s:o}", "object", "cluster", "agents_security",
                            s->config.insecure_agents ? "insecure" : "curve", "agents", out_agents, "queue", queue);
    json_decref(agents);
    json_decref(alloc);
    json_decref(queued);
    http_reply_json(res, 200, out);
}
