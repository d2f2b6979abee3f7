/* The control loop: one thread owns the agents' ROUTER socket. It registers agents and
 * notices lost ones, gang-allocates devices to queued jobs (FIFO within priority, never
 * over-committing), launches and stops workers, turns worker metrics into events,
 * checkpoints and models, decides a job's end (succeeded, retried from its checkpoint,
 * failed), enforces max_runtime_seconds and fires schedules. HTTP threads only write
 * the wishes (status, desired) into the store and set s->kick. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/common.h"
#include "common/msg.h"
#include "server/agent.h"
#include "server/server_internal.h"
#include "server/tinker_internal.h"
#include "trainer/trainer.h"

#define CONTROL_INPROC "inproc://smeltd-agents"
#define CONTROL_TICK_MS 250
#define CONTROL_STOP_FORCE_S 60   /* a stop the agent never answered frees the devices after this */

static int64_t heartbeat_ms(struct server *s) {
    return s->config.heartbeat_ms > 0 ? s->config.heartbeat_ms : 1000;
}
static int64_t lost_ms(struct server *s) {
    return s->config.agent_lost_ms > 0 ? s->config.agent_lost_ms : 10000;
}
static int64_t grace_ms(struct server *s) {
    return s->config.stop_grace_ms > 0 ? s->config.stop_grace_ms : 10000;
}

/* Whether the message left for the agent's connection. */
static bool send_to_agent(struct server *s, const char *agent_id, const char *type, json_t *header) {
    struct smelt_error err = {0};
    const void *route = NULL;
    size_t route_len = 0;
    if (!agent_link_route(s, agent_id, &route, &route_len)) {
        log_warn("control: %s to agent %s: not connected on a live credential", type, agent_id);
        return false;
    }
    if (msg_send(s->agent_router, route, route_len, type, header, NULL, 0, &err) != 0) {
        log_warn("control: %s to agent %s: %s", type, agent_id, err.message);
        return false;
    }
    return true;
}

/* Whether smeltd knows how to reach agent_id now (under CURVE: it has heard from it since
 * it connected); the scheduler places jobs only there. */
static bool agent_reachable(struct server *s, const char *agent_id) {
    const void *route = NULL;
    size_t route_len = 0;
    return agent_link_route(s, agent_id, &route, &route_len);
}

static void reply_error(struct server *s, const struct msg *m, const char *field, const char *message) {
    json_t *h = json_pack("{s:{s:s, s:s}}", "error", "message", message, "field", field);
    if (h) msg_send(s->agent_router, m->route, m->route_len, MSG_AGENT_ERROR, h, NULL, 0, NULL);
    json_decref(h);
}

/* ---- job endings ---- */

static void job_event(struct server *s, struct store_conn *c, const char *job, const char *level,
                      const char *fmt, const char *arg) {
    struct smelt_error err = {0};
    if (jobs_event(s, c, job, level, "message", NULL, &err, fmt, arg) != 0)
        log_error("control: event for %s: %s", job, err.message);
}

static void exec_logged(const char *what, int rc, struct smelt_error *err) {
    if (rc < 0) log_error("control: %s: %s", what, err->message);
}

static void job_succeed(struct server *s, struct store_conn *c, json_t *job) {
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *model = json_string_value(json_object_get(job, "model"));
    const char *suffix = json_string_value(json_object_get(job, "suffix"));
    const char *project = json_string_value(json_object_get(job, "project_id"));
    json_t *spec = json_loads(json_string_value(json_object_get(job, "spec")), 0, NULL);
    bool lora = spec && json_is_object(json_object_get(spec, "lora"));
    json_decref(spec);
    json_t *method = json_loads(json_string_value(json_object_get(job, "method")), 0, NULL);
    const char *head = jobs_method_head(json_string_value(json_object_get(method, "type")) ?: "supervised");
    struct smelt_error err = {0};
    char base[256];
    snprintf(base, sizeof base, "%s", model);
    if (strncmp(model, "ft:", 3) == 0) {
        json_t *row = NULL;
        if (store_query_one(c, &row, &err, "SELECT base_model FROM models WHERE id = ?", "s", model) == 0) {
            snprintf(base, sizeof base, "%s", json_string_value(json_object_get(row, "base_model")));
            json_decref(row);
        }
        error_clear(&err);
    }
    char name[HTTP_ID_BYTES], path[SERVER_PATH_BYTES + 96];
    snprintf(name, sizeof name, "ft:%.40s:%.30s:%s", base, suffix ? suffix : "smelt", id + strlen("ftjob-"));
    snprintf(path, sizeof path, "%s/%s/output", s->jobs_dir, id);
    int64_t now = server_now();
    int rc = store_exec(c, &err, "INSERT OR REPLACE INTO models (id, project_id, job_id, path, kind, base_model, "
                        "created_at, head) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", "ssssssis", name, project, id, path,
                        lora ? "lora" : "full", base, now, head ? head : "lm");
    json_decref(method);
    exec_logged("model row", rc, &err);
    rc = store_exec(c, &err, "UPDATE jobs SET status = 'succeeded', finished_at = ?, fine_tuned_model = ? "
                    "WHERE id = ?", "iss", now, name, id);
    exec_logged("job succeeded", rc, &err);
    job_event(s, c, id, "info", "New fine-tuned model created: %s", name);
    job_event(s, c, id, "info", "%s", "The job has successfully completed");
}

void control_job_fail(struct server *s, struct store_conn *c, const char *id, const char *code, const char *message) {
    struct smelt_error err = {0};
    json_t *error = json_pack("{s:s, s:s, s:n}", "code", code, "message", message, "param");
    int rc = store_exec(c, &err, "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? WHERE id = ?",
                        "ijs", server_now(), error, id);
    json_decref(error);
    exec_logged("job failed", rc, &err);
    job_event(s, c, id, "error", "Job failed: %s", message);
}

/* The last lines of a job's log, for a failure message. */
static void log_tail(struct server *s, const char *id, char *out, size_t cap) {
    char path[SERVER_PATH_BYTES + 96];
    snprintf(path, sizeof path, "%s/%s/log.txt", s->jobs_dir, id);
    out[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        long start = size > (long)cap - 1 ? size - (long)cap + 1 : 0;
        if (fseek(f, start, SEEK_SET) == 0) {
            size_t n = fread(out, 1, cap - 1, f);
            out[n] = 0;
            while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r')) out[--n] = 0;
            /* keep the last 3 lines */
            int lines = 0;
            for (size_t i = n; i > 0; i--)
                if (out[i - 1] == '\n' && ++lines == 3) {
                    memmove(out, out + i, n - i + 1);
                    break;
                }
        }
    }
    fclose(f);
}

/* A worker of job row `job` is gone (exited, or lost with its agent). */
static void worker_gone(struct server *s, struct store_conn *c, json_t *job, int exit_code, int signal_no,
                        const char *launch_error) {
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *status = json_string_value(json_object_get(job, "status"));
    bool final_seen = json_integer_value(json_object_get(job, "saw_final")) != 0;
    struct smelt_error err = {0};
    int rc = store_exec(c, &err, "UPDATE jobs SET devices = NULL, pid = NULL, stop_sent_at = NULL WHERE id = ?",
                        "s", id);
    exec_logged("free devices", rc, &err);
    char how[128];
    if (launch_error) snprintf(how, sizeof how, "could not start");
    else if (signal_no > 0) snprintf(how, sizeof how, "was stopped by signal %d", signal_no);
    else if (exit_code >= 0) snprintf(how, sizeof how, "exited with code %d", exit_code);
    else snprintf(how, sizeof how, "was lost with its agent");
    if (tinker_job_is_session(job)) { /* its models lived in the worker: never retried */
        char tail[600], what[900];
        if (launch_error) snprintf(what, sizeof what, "could not start: %.700s", launch_error);
        else {
            log_tail(s, id, tail, sizeof tail);
            snprintf(what, sizeof what, "%s%s%.600s", how, tail[0] ? ": " : "", tail);
        }
        tinker_job_worker_gone(s, c, job, launch_error ? -1 : exit_code, what);
        return;
    }
    if (exit_code == 0 && final_seen && (strcmp(status, "running") == 0 || strcmp(status, "paused") == 0)) {
        job_succeed(s, c, job);
        return;
    }
    if (strcmp(status, "cancelled") == 0 || strcmp(status, "failed") == 0) {
        job_event(s, c, id, "info", "Worker %s; its devices are free", how);
        return;
    }
    if (strcmp(status, "paused") == 0) {
        job_event(s, c, id, "info", "Worker %s; resuming continues from the last checkpoint", how);
        return;
    }
    if (strcmp(status, "running") != 0) return;
    char message[900];
    if (launch_error) snprintf(message, sizeof message, "the worker could not start: %.700s", launch_error);
    else {
        char tail[600];
        log_tail(s, id, tail, sizeof tail);
        snprintf(message, sizeof message, "the worker %s%s%.600s", how, tail[0] ? ": " : "", tail);
    }
    int64_t retries = json_integer_value(json_object_get(job, "retries"));
    int64_t max_retries = json_integer_value(json_object_get(job, "max_retries"));
    /* A trainer that exits non-zero refused its input: retrying cannot help. A signal or a
     * lost agent can. */
    bool retryable = !launch_error && exit_code != 1 && exit_code != 2;
    if (retryable && retries < max_retries) {
        rc = store_exec(c, &err, "UPDATE jobs SET status = 'queued', retries = retries + 1, queued_at = ? "
                        "WHERE id = ?", "is", server_now(), id);
        exec_logged("retry", rc, &err);
        atomic_fetch_add(&s->job_retries_total, 1);
        char text[1024];
        snprintf(text, sizeof text, "%.900s; retrying from the last checkpoint (retry %lld of %lld)", message,
                 (long long)retries + 1, (long long)max_retries);
        job_event(s, c, id, "warn", "%s", text);
        return;
    }
    control_job_fail(s, c, id, launch_error ? "launch_failed" : "worker_failed", message);
}

/* ---- agent messages ---- */

static json_t *job_by_id(struct store_conn *c, const char *id) {
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (store_query_one(c, &row, &err, "SELECT * FROM jobs WHERE id = ?", "s", id) != 0) return NULL;
    return row;
}

/* Jobs the agent runs that smeltd no longer wants there get stopped. */
static void reconcile_running(struct server *s, struct store_conn *c, const char *agent_id, json_t *running) {
    size_t i;
    json_t *entry;
    json_array_foreach(running, i, entry) {
        const char *id = json_string_value(json_object_get(entry, "job_id"));
        json_int_t attempt = json_integer_value(json_object_get(entry, "attempt"));
        if (!id) continue;
        json_t *job = job_by_id(c, id);
        bool wanted = job && json_integer_value(json_object_get(job, "attempt")) == attempt &&
                      !json_is_null(json_object_get(job, "devices")) &&
                      json_string_value(json_object_get(job, "agent_id")) &&
                      strcmp(json_string_value(json_object_get(job, "agent_id")), agent_id) == 0;
        json_decref(job);
        if (!wanted) {
            json_t *h = json_pack("{s:s, s:I, s:I, s:s}", "job_id", id, "attempt", attempt, "grace_ms",
                                  (json_int_t)grace_ms(s), "reason", "not scheduled here");
            if (h) send_to_agent(s, agent_id, MSG_WORKER_STOP, h);
            json_decref(h);
        }
    }
}

/* sender: the agent id the connection proved (its credential's), whatever the header says. */
static void on_register(struct server *s, struct store_conn *c, const struct msg *m, const char *sender) {
    const char *agent_id = json_string_value(json_object_get(m->header, "agent_id"));
    const char *hostname = json_string_value(json_object_get(m->header, "hostname"));
    json_t *devices = json_object_get(m->header, "devices");
    json_t *running = json_object_get(m->header, "running");
    if (agent_id && strcmp(agent_id, sender) != 0) {
        log_warn("control: refused agent.register as '%.64s' from agent %s (its credential's)", agent_id, sender);
        reply_error(s, m, "agent_id", "agent.register: agent_id is not the agent id of this connection's credential");
        return;
    }
    if (!agent_id || !json_is_array(devices) || !json_is_array(running)) {
        reply_error(s, m, "agent_id", "agent.register: agent_id (equal to the routing id), devices and running are "
                    "required");
        return;
    }
    struct smelt_error err = {0};
    int64_t now = server_now();
    int rc = store_exec(c, &err, "INSERT INTO agents (id, hostname, devices, registered_at, last_seen, status) "
                        "VALUES (?, ?, ?, ?, ?, 'online') ON CONFLICT(id) DO UPDATE SET hostname = excluded.hostname, "
                        "devices = excluded.devices, registered_at = excluded.registered_at, last_seen = "
                        "excluded.last_seen, status = 'online'", "ssjii", agent_id, hostname ? hostname : "",
                        devices, now, now);
    exec_logged("agent row", rc, &err);
    log_info("control: agent %s registered with %zu device(s)", agent_id, json_array_size(devices));
    /* Workers smeltd placed on this agent that it does not run any more are gone. */
    json_t *jobs = NULL;
    if (store_query(c, &jobs, &err, "SELECT * FROM jobs WHERE agent_id = ? AND devices IS NOT NULL", "s",
                    agent_id) == 0) {
        size_t i;
        json_t *job;
        json_array_foreach(jobs, i, job) {
            bool found = false;
            size_t k;
            json_t *entry;
            json_array_foreach(running, k, entry) {
                const char *rid = json_string_value(json_object_get(entry, "job_id"));
                if (rid && strcmp(rid, json_string_value(json_object_get(job, "id"))) == 0 &&
                    json_integer_value(json_object_get(entry, "attempt")) ==
                        json_integer_value(json_object_get(job, "attempt")))
                    found = true;
            }
            if (!found) worker_gone(s, c, job, -1, 0, NULL);
        }
        json_decref(jobs);
    }
    reconcile_running(s, c, agent_id, running);
    json_t *reply = json_pack("{s:I}", "heartbeat_ms", (json_int_t)heartbeat_ms(s));
    if (reply) send_to_agent(s, agent_id, MSG_AGENT_REGISTERED, reply);
    json_decref(reply);
}

static bool agent_known(struct store_conn *c, const char *agent_id) {
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (store_query_one(c, &row, &err, "SELECT status FROM agents WHERE id = ?", "s", agent_id) != 0) return false;
    bool online = strcmp(json_string_value(json_object_get(row, "status")), "online") == 0;
    json_decref(row);
    return online;
}

/* The preference metrics of DPO lines, TRL's names as the trainer writes them: as they
 * are on train lines, after VAL_PREFIX on eval and final lines (as val_loss is). An
 * event's data carries them under the line's names. */
static const char *const PREFERENCE_METRICS[] = {"rewards/chosen",  "rewards/rejected", "rewards/accuracies",
                                                 "rewards/margins", "logps/chosen",     "logps/rejected"};
#define N_PREFERENCE_METRICS ((int)(sizeof PREFERENCE_METRICS / sizeof PREFERENCE_METRICS[0]))
#define VAL_PREFIX "val_"

static json_t *preference_metric(const json_t *line, const char *prefix, const char *name, char *key, size_t cap) {
    snprintf(key, cap, "%s%s", prefix, name);
    return json_object_get(line, key);
}

static void add_preference_metrics(json_t *data, const json_t *line, const char *prefix) {
    for (int i = 0; data && i < N_PREFERENCE_METRICS; i++) {
        char key[64];
        json_t *v = preference_metric(line, prefix, PREFERENCE_METRICS[i], key, sizeof key);
        if (json_is_number(v)) json_object_set(data, key, v);
    }
}

/* Appends ", preference accuracy=A, reward margin=M" (those present in line) to out. */
static void append_preference_summary(const json_t *line, const char *prefix, char *out, size_t cap) {
    char key[64];
    json_t *acc = preference_metric(line, prefix, "rewards/accuracies", key, sizeof key);
    json_t *margin = preference_metric(line, prefix, "rewards/margins", key, sizeof key);
    size_t n = strlen(out);
    if (json_is_number(acc) && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%spreference accuracy=%.4f", n ? ", " : "", json_number_value(acc));
    if (json_is_number(margin) && n < cap)
        snprintf(out + n, cap - n, "%sreward margin=%.4f", n ? ", " : "", json_number_value(margin));
}

/* The RL loop's numbers (GRPO and PPO train lines) that an event's data carries, under
 * the line's names (a name the line lacks is left out). */
static const char *const RL_METRICS[] = {"reward", "reward_std", "reward_min", "reward_max", "kl", "completions/mean_length",
                                         "completions/clipped_ratio", "clip_ratio/region_mean",
                                         "rollout/logprob_diff_mean", "rollout/logprob_diff_max", "rollout/kl",
                                         "iteration", "policy_version", "version_lag", "samples", "samples_failed",
                                         "samples_graded_zero", "time/generate_s", "time/score_s",
                                         "time/reference_s", "time/update_s", "time/sync_s", "sync_bytes",
                                         "generate_tokens_per_s", "critic/vf_loss", "critic/vpred_mean",
                                         "critic/vf_clipfrac", "critic/returns_mean", "time/critic_s"};
static const char *const RL_VAL_METRICS[] = {"val_reward", "val_accuracy", "val_samples"};

static void add_metrics(json_t *data, const json_t *line, const char *const *names, int n) {
    for (int i = 0; data && i < n; i++) {
        json_t *v = json_object_get(line, names[i]);
        if (json_is_number(v)) json_object_set(data, names[i], v);
    }
}

/* ", reward=R" / "validation reward=R, accuracy=A": what an RL line adds to a message. */
static void append_rl_summary(const json_t *line, bool val, char *out, size_t cap) {
    json_t *r = json_object_get(line, val ? "val_reward" : "reward"), *a = json_object_get(line, "val_accuracy");
    size_t n = strlen(out);
    if (json_is_number(r) && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%s%sreward=%.4f", n ? ", " : "", val ? "validation " : "",
                              json_number_value(r));
    if (val && json_is_number(a) && n < cap)
        snprintf(out + n, cap - n, "%saccuracy=%.4f", n ? ", " : "", json_number_value(a));
}

static int64_t total_steps(struct store_conn *c, const char *id) {
    struct smelt_error err = {0};
    json_t *start = NULL;
    if (store_query_one(c, &start, &err, "SELECT data AS data__json FROM metrics WHERE job_id = ? AND "
                        "type = 'start' ORDER BY id LIMIT 1", "s", id) != 0)
        return 0;
    int64_t total = json_integer_value(json_object_get(json_object_get(start, "data"), "total_steps"));
    json_decref(start);
    return total;
}

static void metrics_event(struct server *s, struct store_conn *c, const char *id, json_t *data, const char *msg) {
    struct smelt_error err = {0};
    exec_logged("event", jobs_event(s, c, id, "info", "metrics", data, &err, "%s", msg), &err);
}

static void on_train_line(struct server *s, struct store_conn *c, const char *id, int64_t step, const json_t *line) {
    int64_t total = total_steps(c, id);
    double loss = json_number_value(json_object_get(line, "loss"));
    json_t *data = json_pack("{s:I, s:f, s:O?, s:O?, s:O?, s:O?, s:I}", "step", (json_int_t)step, "train_loss",
                             loss, "learning_rate", json_object_get(line, "lr"), "grad_norm",
                             json_object_get(line, "grad_norm"), "tokens_per_s", json_object_get(line, "tokens_per_s"),
                             "epoch", json_object_get(line, "epoch"), "total_steps", (json_int_t)total);
    add_preference_metrics(data, line, "");
    add_metrics(data, line, RL_METRICS, (int)(sizeof RL_METRICS / sizeof *RL_METRICS));
    char extra[160] = "", msg[512];
    append_preference_summary(line, "", extra, sizeof extra);
    append_rl_summary(line, false, extra, sizeof extra);
    snprintf(msg, sizeof msg, "Step %lld/%lld: training loss=%.4f%s%s", (long long)step, (long long)total, loss,
             extra[0] ? ", " : "", extra);
    metrics_event(s, c, id, data, msg);
    json_decref(data);
    struct smelt_error err = {0};
    json_t *tt = json_object_get(line, "trained_tokens");
    if (json_is_integer(tt))
        exec_logged("trained tokens", store_exec(c, &err, "UPDATE jobs SET trained_tokens = "
                    "coalesce(trained_tokens, 0) + ? WHERE id = ?", "is", (int64_t)json_integer_value(tt), id),
                    &err);
}

static void on_eval_line(struct server *s, struct store_conn *c, const char *id, int64_t step, const json_t *line) {
    if (json_is_number(json_object_get(line, "val_reward"))) { /* RL: held-out rewards, no loss */
        json_t *data = json_pack("{s:I}", "step", (json_int_t)step);
        add_metrics(data, line, RL_VAL_METRICS, (int)(sizeof RL_VAL_METRICS / sizeof *RL_VAL_METRICS));
        char extra[160] = "", msg[512];
        append_rl_summary(line, true, extra, sizeof extra);
        snprintf(msg, sizeof msg, "Step %lld: %s", (long long)step, extra);
        metrics_event(s, c, id, data, msg);
        json_decref(data);
        return;
    }
    double vl = json_number_value(json_object_get(line, "val_loss"));
    json_t *data = json_pack("{s:I, s:f}", "step", (json_int_t)step, "valid_loss", vl);
    add_preference_metrics(data, line, VAL_PREFIX);
    char extra[160] = "", msg[512];
    append_preference_summary(line, VAL_PREFIX, extra, sizeof extra);
    snprintf(msg, sizeof msg, "Step %lld: validation loss=%.4f%s%s", (long long)step, vl, extra[0] ? ", " : "",
             extra);
    metrics_event(s, c, id, data, msg);
    json_decref(data);
}

/* The preference metrics the job ended with (VAL_PREFIX names): the final line's, else
 * the last evaluation's (NULL when neither has them; a new reference). */
static json_t *final_preference(struct store_conn *c, const char *id, const json_t *line) {
    static const char accuracy[] = VAL_PREFIX "rewards/accuracies";
    if (json_is_number(json_object_get(line, accuracy))) return json_incref((json_t *)line);
    struct smelt_error err = {0};
    json_t *last = NULL;
    if (store_query_one(c, &last, &err, "SELECT data AS data__json FROM metrics WHERE job_id = ? AND type = "
                        "'eval' ORDER BY step DESC LIMIT 1", "s", id) != 0)
        return NULL;
    json_t *data = json_incref(json_object_get(last, "data"));
    json_decref(last);
    if (json_is_number(json_object_get(data, accuracy))) return data;
    json_decref(data);
    return NULL;
}

static void on_final_line(struct server *s, struct store_conn *c, const char *id, int64_t step, const json_t *line) {
    struct smelt_error err = {0};
    exec_logged("final", store_exec(c, &err, "UPDATE jobs SET saw_final = 1 WHERE id = ?", "s", id), &err);
    json_t *vl = json_object_get(line, "val_loss"), *acc = json_object_get(line, "accuracy");
    char extra[240] = "", msg[512];
    if (json_is_number(vl)) snprintf(extra, sizeof extra, "validation loss=%.4f", json_number_value(vl));
    if (json_is_number(acc))
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%saccuracy=%.4f", extra[0] ? ", " : "",
                 json_number_value(acc));
    json_t *data = json_deep_copy(line), *pref = final_preference(c, id, line);
    append_preference_summary(pref, VAL_PREFIX, extra, sizeof extra);
    append_rl_summary(line, true, extra, sizeof extra);
    add_preference_metrics(data, pref, VAL_PREFIX);
    json_decref(pref);
    snprintf(msg, sizeof msg, "Training finished at step %lld%s%s", (long long)step, extra[0] ? ": " : "", extra);
    metrics_event(s, c, id, data, msg);
    json_decref(data);
}

/* A checkpoint row, with the metrics of the last training step at or before it. */
static void on_checkpoint_line(struct server *s, struct store_conn *c, const char *id, int64_t step,
                               const json_t *line) {
    const char *rel = json_string_value(json_object_get(line, "path"));
    char path[SERVER_PATH_BYTES + 256], ckpt_id[HTTP_ID_BYTES], msg[128];
    snprintf(path, sizeof path, "%s/%s/%s", s->jobs_dir, id, rel ? rel : "");
    server_new_id("ftckpt-", ckpt_id, sizeof ckpt_id);
    struct smelt_error err = {0};
    json_t *last = NULL, *metrics = NULL;
    if (store_query_one(c, &last, &err, "SELECT data AS data__json FROM metrics WHERE job_id = ? AND type = "
                        "'train' AND step <= ? ORDER BY step DESC LIMIT 1", "si", id, step) == 0) {
        json_t *d = json_object_get(last, "data");
        metrics = json_pack("{s:I, s:O?, s:O?}", "step", (json_int_t)step, "train_loss",
                            json_object_get(d, "loss"), "learning_rate", json_object_get(d, "lr"));
        add_preference_metrics(metrics, d, "");
        json_decref(last);
    }
    error_clear(&err);
    int rc = store_exec(c, &err, "INSERT OR IGNORE INTO checkpoints (id, job_id, step, created_at, path, metrics) "
                        "VALUES (?, ?, ?, ?, ?, ?)", "ssiisj", ckpt_id, id, step, server_now(), path, metrics);
    json_decref(metrics);
    exec_logged("checkpoint row", rc, &err);
    snprintf(msg, sizeof msg, "Checkpoint saved at step %lld", (long long)step);
    job_event(s, c, id, "info", "%s", msg);
}

static double mib(const json_t *bytes) { return (double)json_integer_value(bytes) / (1024.0 * 1024.0); }

/* The trainer's start line: the run's size, its compute and, with several ranks, its
 * layout (the per-rank sizes the trainer actually allocated). */
static void on_start_line(struct server *s, struct store_conn *c, const char *id, const json_t *line) {
    char msg[512];
    int n = snprintf(msg, sizeof msg, "Training started: %lld steps on %lld examples",
                     (long long)json_integer_value(json_object_get(line, "total_steps")),
                     (long long)json_integer_value(json_object_get(line, "train_examples")));
    const char *backend = NULL, *kernels = NULL;
    json_int_t threads = 0;
    if (n > 0 && (size_t)n < sizeof msg &&
        !json_unpack((json_t *)line, "{s:{s:s, s:s, s:I}}", "compute", "backend", &backend, "blas_kernels",
                     &kernels, "cpu_threads", &threads))
        snprintf(msg + n, sizeof msg - (size_t)n, " (%s backend; CPU: OpenBLAS %.32s kernels, %lld threads)",
                 backend, kernels, (long long)threads);
    json_int_t ranks = json_integer_value(json_object_get(line, "ranks"));
    n = (int)strlen(msg);
    if (ranks > 1 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, "; %lld ranks, ZeRO stage %lld: per rank %.1f MiB of optimizer "
                 "state, %.1f MiB of parameters, %.1f MiB of gradients", (long long)ranks,
                 (long long)json_integer_value(json_object_get(line, "zero_stage")),
                 mib(json_object_get(line, "rank_optimizer_bytes")), mib(json_object_get(line, "rank_param_bytes")),
                 mib(json_object_get(line, "rank_grad_bytes")));
    job_event(s, c, id, "info", "%s", msg);
}

/* An RL iteration's samples whose reward failed (left out; the job goes on) or that a
 * grader could not grade (scored 0). The file is named by line only (its path is the
 * server's own). An older trainer's line has "count" alone: all failed. */
static void on_sample_errors_line(struct server *s, struct store_conn *c, const char *id, int64_t step,
                                  const json_t *line) {
    json_t *first = json_array_get(json_object_get(line, "errors"), 0);
    json_t *failed_v = json_object_get(line, "failed");
    int64_t count = json_integer_value(json_object_get(line, "count"));
    int64_t failed = json_is_integer(failed_v) ? json_integer_value(failed_v) : count;
    int64_t zeroed = json_integer_value(json_object_get(line, "zeroed"));
    char what[160] = "";
    if (failed) snprintf(what, sizeof what, "the reward of %lld sample(s) failed; they are left out", (long long)failed);
    if (zeroed)
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s%lld sample(s) could not be graded and scored 0",
                 failed ? "; " : "", (long long)zeroed);
    char msg[640];
    snprintf(msg, sizeof msg, "Step %lld: %s (first: prompt on line %lld: %.300s)", (long long)step, what,
             (long long)json_integer_value(json_object_get(first, "line")),
             json_string_value(json_object_get(first, "error")) ?: "unknown error");
    job_event(s, c, id, "warn", "%s", msg);
}

/* A worker's metrics line: recorded once per (type, step), then turned into events. */
static void on_worker_event(struct server *s, struct store_conn *c, json_t *job, const struct msg *m) {
    const char *id = json_string_value(json_object_get(job, "id"));
    json_t *line = json_object_get(m->header, "line");
    const char *type = json_string_value(json_object_get(line, "type"));
    json_t *step_v = json_object_get(line, "step");
    if (!type || !json_is_integer(step_v)) return;
    if (strcmp(type, "tinker") == 0) {
        tinker_job_metrics_line(s, c, job, m->header);
        return;
    }
    int64_t step = json_integer_value(step_v);
    struct smelt_error err = {0};
    json_t *dup = NULL;
    if (store_query_one(c, &dup, &err, "SELECT id FROM metrics WHERE job_id = ? AND type = ? AND step = ?", "ssi",
                        id, type, step) == 0) {
        json_decref(dup); /* a resumed attempt repeats what the last one already reported */
        return;
    }
    int rc = store_exec(c, &err, "INSERT INTO metrics (job_id, attempt, step, type, data) VALUES (?, ?, ?, ?, ?)",
                        "siisj", id, json_integer_value(json_object_get(m->header, "attempt")), step, type, line);
    exec_logged("metrics row", rc, &err);
    if (strcmp(type, "train") == 0) on_train_line(s, c, id, step, line);
    else if (strcmp(type, "eval") == 0) on_eval_line(s, c, id, step, line);
    else if (strcmp(type, "checkpoint") == 0) on_checkpoint_line(s, c, id, step, line);
    else if (strcmp(type, "final") == 0) on_final_line(s, c, id, step, line);
    else if (strcmp(type, "start") == 0) on_start_line(s, c, id, line);
    else if (strcmp(type, "sample_errors") == 0) on_sample_errors_line(s, c, id, step, line);
}

/* Whether job row `job` runs attempt `attempt` on agent_id: what an agent may report on. */
static bool placed_on(const json_t *job, const char *agent_id, const json_t *attempt) {
    const char *placed = json_string_value(json_object_get(job, "agent_id"));
    return placed && strcmp(placed, agent_id) == 0 &&
           json_integer_value(json_object_get(job, "attempt")) == json_integer_value(attempt);
}

static void on_agent_message(struct server *s, struct store_conn *c, const struct msg *m) {
    char agent_id[MSG_ROUTE_BYTES];
    if (agent_link_sender(s, c, m, agent_id, sizeof agent_id) != 0) return;
    struct smelt_error err = {0};
    if (msg_check_version(m, &err) != 0) {
        reply_error(s, m, "v", err.message);
        return;
    }
    if (strcmp(m->type, MSG_AGENT_REGISTER) == 0) {
        on_register(s, c, m, agent_id);
        return;
    }
    if (!agent_known(c, agent_id)) {
        /* An agent we lost (or never saw) must register again before anything else. */
        reply_error(s, m, "agent_id", "unknown agent: register first");
        return;
    }
    exec_logged("last seen", store_exec(c, &err, "UPDATE agents SET last_seen = ? WHERE id = ?", "is",
                                           server_now(), agent_id), &err);
    if (strcmp(m->type, MSG_AGENT_HEARTBEAT) == 0) {
        json_t *running = json_object_get(m->header, "running");
        if (json_is_array(running)) reconcile_running(s, c, agent_id, running);
        json_t *ack = json_pack("{s:I}", "heartbeat_ms", (json_int_t)heartbeat_ms(s));
        if (ack) send_to_agent(s, agent_id, MSG_AGENT_REGISTERED, ack);
        json_decref(ack);
        return;
    }
    const char *job_id = json_string_value(json_object_get(m->header, "job_id"));
    json_t *attempt = json_object_get(m->header, "attempt");
    if (!job_id || !json_is_integer(attempt)) {
        if (strcmp(m->type, MSG_AGENT_ERROR) == 0)
            log_warn("control: agent %s refused a message: %s", agent_id,
                     json_string_value(json_object_get(json_object_get(m->header, "error"), "message")) ?: "?");
        return;
    }
    json_t *job = job_by_id(c, job_id);
    if (!job) return;
    if (!placed_on(job, agent_id, attempt)) {
        log_warn("control: dropped %s for %s attempt %lld from agent %s, which does not run that attempt", m->type,
                 job_id, (long long)json_integer_value(attempt), agent_id);
        json_decref(job);
        return;
    }
    bool current = json_integer_value(json_object_get(job, "attempt")) == json_integer_value(attempt) &&
                   !json_is_null(json_object_get(job, "devices"));
    if (strcmp(m->type, MSG_WORKER_STARTED) == 0 && current) {
        exec_logged("pid", store_exec(c, &err, "UPDATE jobs SET pid = ? WHERE id = ?", "is",
                                         (int64_t)json_integer_value(json_object_get(m->header, "pid")), job_id),
                    &err);
    } else if (strcmp(m->type, MSG_WORKER_EVENT) == 0) {
        on_worker_event(s, c, job, m);
    } else if (strcmp(m->type, MSG_WORKER_EXITED) == 0 && current) {
        json_t *ec = json_object_get(m->header, "exit_code"), *sig = json_object_get(m->header, "signal");
        worker_gone(s, c, job, json_is_integer(ec) ? (int)json_integer_value(ec) : -1,
                    json_is_integer(sig) ? (int)json_integer_value(sig) : 0,
                    json_string_value(json_object_get(m->header, "error")));
        atomic_store(&s->kick, 1);
    }
    json_decref(job);
}

/* ---- the periodic pass ---- */

/* Marks agent_id lost; its workers are gone (their jobs retried or failed). */
static void agent_lost(struct server *s, struct store_conn *c, const char *agent_id) {
    struct smelt_error err = {0};
    exec_logged("lost", store_exec(c, &err, "UPDATE agents SET status = 'lost' WHERE id = ?", "s", agent_id), &err);
    json_t *jobs = NULL;
    if (store_query(c, &jobs, &err, "SELECT * FROM jobs WHERE agent_id = ? AND devices IS NOT NULL", "s",
                    agent_id) == 0) {
        size_t k;
        json_t *job;
        json_array_foreach(jobs, k, job) worker_gone(s, c, job, -1, 0, NULL);
        json_decref(jobs);
    }
}

static void mark_lost_agents(struct server *s, struct store_conn *c) {
    struct smelt_error err = {0};
    int64_t now = server_now();
    /* A restart gives every agent the full timeout to come back. */
    int64_t since = now - (lost_ms(s) + 999) / 1000;
    if (since < s->started_at) since = s->started_at - 1;
    json_t *lost = NULL;
    if (store_query(c, &lost, &err, "SELECT id FROM agents WHERE status = 'online' AND last_seen < ?", "i",
                    since) != 0)
        return;
    size_t i;
    json_t *a;
    json_array_foreach(lost, i, a) {
        const char *agent_id = json_string_value(json_object_get(a, "id"));
        log_warn("control: agent %s missed its heartbeats: lost", agent_id);
        agent_lost(s, c, agent_id);
    }
    json_decref(lost);
}

/* Asks agent_id, on the connection it still has, to stop every worker smeltd placed on it,
 * so that a job retried elsewhere does not run twice (an agent that ignores it keeps
 * nothing it did not already hold). */
static void stop_all_on(struct server *s, struct store_conn *c, const char *agent_id, const char *reason) {
    struct smelt_error err = {0};
    json_t *jobs = NULL;
    if (store_query(c, &jobs, &err, "SELECT id, attempt FROM jobs WHERE agent_id = ? AND devices IS NOT NULL", "s",
                    agent_id) != 0)
        return;
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        json_t *h = json_pack("{s:s, s:I, s:I, s:s}", "job_id", json_string_value(json_object_get(job, "id")),
                              "attempt", json_integer_value(json_object_get(job, "attempt")), "grace_ms",
                              (json_int_t)grace_ms(s), "reason", reason);
        if (h) send_to_agent(s, agent_id, MSG_WORKER_STOP, h);
        json_decref(h);
    }
    json_decref(jobs);
}

/* An agent whose credential was revoked (or rotated) is lost at once: its workers are asked
 * to stop, its jobs go on elsewhere, and nothing more is taken from that connection. */
static void mark_revoked_agents(struct server *s, struct store_conn *c) {
    char revoked[16][MSG_ROUTE_BYTES];
    int n = agent_link_revoked(s, c, revoked, 16);
    for (int i = 0; i < n; i++) {
        log_warn("control: agent %s's credential was revoked: lost", revoked[i]);
        stop_all_on(s, c, revoked[i], "the agent's credential was revoked");
        agent_link_forget(s, revoked[i]);
        agent_lost(s, c, revoked[i]);
    }
}

static void send_stops(struct server *s, struct store_conn *c) {
    struct smelt_error err = {0};
    int64_t now = server_now();
    /* max_runtime_seconds */
    json_t *over = NULL;
    if (store_query(c, &over, &err, "SELECT id, max_runtime_seconds FROM jobs WHERE status = 'running' AND "
                    "max_runtime_seconds > 0 AND run_started_at IS NOT NULL AND ? - run_started_at > "
                    "max_runtime_seconds", "i", now) == 0) {
        size_t i;
        json_t *job;
        json_array_foreach(over, i, job) {
            char message[160];
            snprintf(message, sizeof message, "the job ran past max_runtime_seconds (%lld)",
                     (long long)json_integer_value(json_object_get(job, "max_runtime_seconds")));
            control_job_fail(s, c, json_string_value(json_object_get(job, "id")), "max_runtime_exceeded", message);
        }
        json_decref(over);
    }
    json_t *jobs = NULL;
    /* desired 'release': an idle Tinker session job (tinker_jobs_tick) */
    if (store_query(c, &jobs, &err, "SELECT id, agent_id, attempt, status, stop_sent_at, desired FROM jobs WHERE "
                    "devices IS NOT NULL AND (status IN ('cancelled', 'paused', 'failed') OR (status = 'running' AND "
                    "desired = 'release'))", "") != 0)
        return;
    size_t i;
    json_t *job;
    json_array_foreach(jobs, i, job) {
        const char *id = json_string_value(json_object_get(job, "id"));
        json_t *sent = json_object_get(job, "stop_sent_at");
        if (json_is_integer(sent)) {
            if (now - json_integer_value(sent) > grace_ms(s) / 1000 + CONTROL_STOP_FORCE_S) {
                /* The agent never confirmed the stop: free the devices anyway. */
                log_warn("control: no exit reported for %s after its stop; freeing its devices", id);
                exec_logged("force free", store_exec(c, &err, "UPDATE jobs SET devices = NULL, pid = NULL, "
                                                        "stop_sent_at = NULL WHERE id = ?", "s", id), &err);
            }
            continue;
        }
        const char *agent_id = json_string_value(json_object_get(job, "agent_id"));
        const char *st = json_string_value(json_object_get(job, "status"));
        if (strcmp(st, "running") == 0) st = json_string_value(json_object_get(job, "desired"));
        json_t *h = json_pack("{s:s, s:O, s:I, s:s}", "job_id", id, "attempt", json_object_get(job, "attempt"),
                              "grace_ms", (json_int_t)grace_ms(s), "reason", st);
        if (h && agent_id) send_to_agent(s, agent_id, MSG_WORKER_STOP, h);
        json_decref(h);
        exec_logged("stop sent", store_exec(c, &err, "UPDATE jobs SET stop_sent_at = ? WHERE id = ?", "is",
                                               now, id), &err);
    }
    json_decref(jobs);
}

/* Free device indexes of an online agent: its devices minus those allocated. */
static int free_devices(struct store_conn *c, json_t *agent, int64_t *free_idx, int max) {
    struct smelt_error err = {0};
    json_t *alloc = NULL;
    const char *agent_id = json_string_value(json_object_get(agent, "id"));
    if (store_query(c, &alloc, &err, "SELECT devices AS devices__json FROM jobs WHERE agent_id = ? AND "
                    "devices IS NOT NULL", "s", agent_id) != 0)
        return 0;
    int n = 0;
    size_t i;
    json_t *dev;
    json_array_foreach(json_object_get(agent, "devices"), i, dev) {
        int64_t index = json_integer_value(json_object_get(dev, "index"));
        bool used = false;
        size_t k, j;
        json_t *row, *d;
        json_array_foreach(alloc, k, row) {
            json_array_foreach(json_object_get(row, "devices"), j, d) {
                if (json_integer_value(d) == index) used = true;
            }
        }
        if (!used && n < max) free_idx[n++] = index;
    }
    json_decref(alloc);
    return n;
}

/* The trainer's ranks among a job's devices: all of them, less an RL job's rollout
 * workers in the split placement (the agent lists the trainer's devices first). */
static int64_t trainer_ranks_of(const json_t *spec, int n_devices) {
    const json_t *rl = json_object_get(spec, "rl");
    const char *placement = json_string_value(json_object_get(rl, "placement"));
    int64_t workers = placement && strcmp(placement, "split") == 0
                          ? json_integer_value(json_object_get(rl, "rollout_workers")) : 0;
    if (placement && strcmp(placement, "split") == 0 && workers < 1) workers = 1;
    return n_devices - workers > 1 ? n_devices - workers : 1;
}

static json_t *trainer_argv(struct server *s, const char *job_dir, const char *spec_path, int64_t ranks) {
    char latest[SERVER_PATH_BYTES + 256];
    struct smelt_error err = {0};
    bool resume = trainer_checkpoint_latest(job_dir, latest, sizeof latest, &err) == 0;
    json_t *argv = json_pack("[s, s, s]", s->trainer_path, "--spec", spec_path);
    if (argv && resume) {
        json_array_append_new(argv, json_string("--resume"));
        json_array_append_new(argv, json_string("latest"));
    }
    if (argv && ranks > 1) {
        char text[24];
        snprintf(text, sizeof text, "%lld", (long long)ranks);
        json_array_append_new(argv, json_string("--ranks"));
        json_array_append_new(argv, json_string(text));
    }
    /* The ranks meet at smeltd's rendezvous, each showing the attempt's keys (rendezvous.c). */
    if (argv && ranks > 1 && s->rendezvous_endpoint[0]) {
        char spec[sizeof s->rendezvous_endpoint + 8];
        snprintf(spec, sizeof spec, "smeltd:%s", s->rendezvous_endpoint);
        json_array_append_new(argv, json_string("--rendezvous"));
        json_array_append_new(argv, json_string(spec));
    }
    return argv;
}

/* The kind ("cpu", "cuda") of the agent's device index. */
static const char *device_kind(const json_t *agent, int64_t index) {
    size_t i;
    json_t *dev;
    json_array_foreach(json_object_get(agent, "devices"), i, dev) {
        if (json_integer_value(json_object_get(dev, "index")) == index)
            return json_string_value(json_object_get(dev, "kind"));
    }
    return NULL;
}

static void launch(struct server *s, struct store_conn *c, json_t *job, json_t *agent, const int64_t *devices,
                   int n_devices) {
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *agent_id = json_string_value(json_object_get(agent, "id"));
    struct smelt_error err = {0};
    char job_dir[SERVER_PATH_BYTES + 96], spec_path[SERVER_PATH_BYTES + 256], log_path[SERVER_PATH_BYTES + 256],
        metrics_path[SERVER_PATH_BYTES + 256];
    snprintf(job_dir, sizeof job_dir, "%s/%s", s->jobs_dir, id);
    snprintf(spec_path, sizeof spec_path, "%s/spec.json", job_dir);
    snprintf(log_path, sizeof log_path, "%s/log.txt", job_dir);
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", job_dir);
    json_t *spec = json_loads(json_string_value(json_object_get(job, "spec")), 0, NULL);
    int rc = spec ? dir_create_all(job_dir, &err) : error_set(&err, SMELT_EFORMAT, "stored spec unreadable");
    if (rc == 0) rc = json_save_atomic(spec, JSON_INDENT(2) | JSON_SORT_KEYS, spec_path, &err);
    int64_t ranks = spec ? trainer_ranks_of(spec, n_devices) : 1;
    json_decref(spec);
    if (rc) {
        control_job_fail(s, c, id, "launch_failed", err.message);
        return;
    }
    int64_t attempt = json_integer_value(json_object_get(job, "attempt")) + 1;
    json_t *argv = tinker_job_is_session(job)
                       ? tinker_worker_argv(s, job, attempt, device_kind(agent, n_devices ? devices[0] : -1),
                                            metrics_path)
                       : trainer_argv(s, job_dir, spec_path, ranks);
    if (!argv) {
        control_job_fail(s, c, id, "launch_failed", "the worker's command line could not be made (stored spec)");
        return;
    }
    /* Keys of this attempt alone: a worker of an earlier attempt cannot pass for it. */
    struct curve_job_keys keys = {.present = true};
    memcpy(keys.server_public_key, s->curve.public_key, CURVE_KEY_BYTES);
    if (curve_keypair_new(&keys.worker, &err) != 0) {
        log_error("control: keys for %s: %s", id, err.message);
        json_decref(argv);
        return;
    }
    json_t *dev_array = json_array();
    for (int i = 0; i < n_devices; i++) json_array_append_new(dev_array, json_integer(devices[i]));
    int64_t now = server_now();
    rc = store_exec(c, &err, "UPDATE jobs SET status = 'running', attempt = ?, agent_id = ?, devices = ?, pid = NULL, "
                    "stop_sent_at = NULL, saw_final = 0, started_at = coalesce(started_at, ?), run_started_at = ?, "
                    "worker_public_key = ? WHERE id = ?", "isjiiss", attempt, agent_id, dev_array, now, now,
                    keys.worker.public_key, id);
    if (rc < 0) {
        log_error("control: allocating for %s: %s", id, err.message);
        json_decref(argv);
        json_decref(dev_array);
        return;
    }
    json_t *h = json_pack("{s:s, s:I, s:o, s:{s:s}, s:s, s:s, s:s, s:O, s:o}", "job_id", id, "attempt",
                          (json_int_t)attempt, "argv", argv, "env", "SMELT_LOG_LEVEL", "info", "workdir", job_dir,
                          "log_path", log_path, "metrics_path", metrics_path, "devices", dev_array, "secrets",
                          curve_job_keys_json(&keys));
    explicit_bzero(&keys, sizeof keys);
    bool sent = h && send_to_agent(s, agent_id, MSG_WORKER_LAUNCH, h);
    json_decref(h);
    if (!sent) {
        /* The agent never got it: back in the queue as it was, for the next pass to place. */
        exec_logged("requeue", store_exec(c, &err, "UPDATE jobs SET status = 'queued', attempt = attempt - 1, "
                                          "agent_id = NULL, devices = NULL, worker_public_key = NULL WHERE id = ?",
                                          "s", id), &err);
        json_decref(dev_array);
        return;
    }
    char what[512], list[256] = "";
    for (int i = 0; i < n_devices && strlen(list) < sizeof list - 24; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", i ? "," : "", (long long)devices[i]);
    snprintf(what, sizeof what, "Job started on %s (attempt %lld), device%s %s", agent_id, (long long)attempt,
             n_devices == 1 ? "" : "s", list);
    job_event(s, c, id, "info", "%s", what);
    json_decref(dev_array);
}

static void schedule_queue(struct server *s, struct store_conn *c) {
    struct smelt_error err = {0};
    json_t *queued = NULL, *agents = NULL;
    if (store_query(c, &queued, &err, "SELECT * FROM jobs WHERE status = 'queued' ORDER BY priority DESC, seq",
                    "") != 0)
        return;
    if (json_array_size(queued) == 0 ||
        store_query(c, &agents, &err, "SELECT id, devices AS devices__json FROM agents WHERE status = 'online' "
                    "ORDER BY id", "") != 0) {
        json_decref(queued);
        return;
    }
    size_t i;
    json_t *job;
    json_array_foreach(queued, i, job) {
        if (!json_is_null(json_object_get(job, "devices"))) break; /* its last worker is still stopping */
        int64_t want = json_integer_value(json_object_get(job, "devices_wanted"));
        bool placed = false;
        size_t k;
        json_t *agent;
        json_array_foreach(agents, k, agent) {
            if (!agent_reachable(s, json_string_value(json_object_get(agent, "id")))) continue;
            int64_t free_idx[AGENT_MAX_DEVICES];
            int n = free_devices(c, agent, free_idx, AGENT_MAX_DEVICES);
            if (n >= want) {
                launch(s, c, job, agent, free_idx, (int)want);
                placed = true;
                break;
            }
        }
        if (!placed) break; /* FIFO within priority: nothing overtakes the head of the queue */
    }
    json_decref(queued);
    json_decref(agents);
}

static void tick(struct server *s) {
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    if (!c) {
        log_error("control: %s", err.message);
        return;
    }
    /* One transaction per pass, so readers (the SSE streams) never see a job's end
     * without the events written with it. */
    bool txn = store_begin(c, &err) == 0;
    mark_revoked_agents(s, c);
    mark_lost_agents(s, c);
    tinker_jobs_tick(s, c);
    send_stops(s, c);
    schedule_queue(s, c);
    if (txn && store_commit(c, &err) != 0) log_error("control: %s", err.message);
    store_release(s->store, c);
    tinker_futures_wake_failed(s);
    schedules_tick(s);
}

static void *control_main(void *arg) {
    struct server *s = arg;
    int64_t last_tick_ms = 0;
    while (!atomic_load(&s->control_stop)) {
        struct msg m;
        struct smelt_error err = {0};
        int rc = msg_recv(s->agent_router, true, 50, &m, &err);
        if (rc == 0 || rc == SMELT_EFORMAT) {
            struct store_conn *c = store_acquire(s->store, &err);
            if (c) {
                if (rc == 0) {
                    bool txn = store_begin(c, &err) == 0;
                    on_agent_message(s, c, &m);
                    if (txn && store_commit(c, &err) != 0) log_error("control: %s", err.message);
                    tinker_futures_wake_failed(s);
                }
                else if (m.route_len) {
                    json_t *h = json_pack("{s:{s:s, s:s}}", "error", "message", err.message, "field", "frames");
                    if (h) msg_send(s->agent_router, m.route, m.route_len, MSG_AGENT_ERROR, h, NULL, 0, NULL);
                    json_decref(h);
                }
                store_release(s->store, c);
            }
            msg_free(&m);
        } else if (rc == SMELT_EIO) {
            log_error("control: %s", err.message);
        }
        agent_link_poll(s);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        if (atomic_exchange(&s->kick, 0) || now_ms - last_tick_ms >= CONTROL_TICK_MS) {
            tick(s);
            last_tick_ms = now_ms;
        }
    }
    return NULL;
}

static void *agent_main(void *arg) {
    struct server *s = arg;
    struct agent_config config = {.server_endpoint = CONTROL_INPROC, .zmq_context = s->zmq, .agent_id = "local",
                                  .cpu_slots = s->config.cpu_slots, .force_cpu = s->config.force_cpu,
                                  .heartbeat_ms = (int)heartbeat_ms(s), .stop = &s->agent_stop};
    struct smelt_error err = {0};
    if (agent_run(&config, &err) != 0) log_error("embedded agent: %s", err.message);
    return NULL;
}

int control_start(struct server *s, struct smelt_error *err) {
    s->agent_router = zmq_socket(s->zmq, ZMQ_ROUTER);
    if (!s->agent_router) return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = 0, mandatory = 1, hwm = 100000;
    zmq_setsockopt(s->agent_router, ZMQ_LINGER, &linger, sizeof linger);
    /* an unroutable message (agent gone) fails instead of vanishing silently */
    zmq_setsockopt(s->agent_router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    zmq_setsockopt(s->agent_router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->agent_router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    TRY(agent_link_open(s, err)); /* before bind: CURVE options apply to later connections */
    if (zmq_bind(s->agent_router, CONTROL_INPROC) != 0)
        return error_set(err, SMELT_EIO, "binding %s: %s", CONTROL_INPROC, zmq_strerror(zmq_errno()));
    if (s->config.agent_bind && zmq_bind(s->agent_router, s->config.agent_bind) != 0)
        return error_set(err, SMELT_EIO, "binding the agents' endpoint %s: %s", s->config.agent_bind,
                         zmq_strerror(zmq_errno()));
    if (pthread_create(&s->control_thread, NULL, control_main, s) != 0)
        return error_set(err, SMELT_EIO, "starting the control thread failed");
    s->control_started = true;
    if (s->config.embedded_agent) {
        if (pthread_create(&s->agent_thread, NULL, agent_main, s) != 0)
            return error_set(err, SMELT_EIO, "starting the embedded agent failed");
        s->agent_started = true;
    }
    return 0;
}

void control_stop(struct server *s) {
    if (s->agent_started) {
        atomic_store(&s->agent_stop, 1);
        pthread_join(s->agent_thread, NULL);
        s->agent_started = false;
    }
    if (s->control_started) {
        /* let the agent's last worker.exited messages land before the loop ends */
        atomic_store(&s->control_stop, 1);
        pthread_join(s->control_thread, NULL);
        s->control_started = false;
    }
    if (s->agent_router) zmq_close(s->agent_router);
    s->agent_router = NULL;
    agent_link_close(s);
}
