/* The Tinker SDK's session routes under /api/v1/ (docs/tinker.md): client config,
 * sessions and heartbeats, telemetry (accepted and dropped), server capabilities, and
 * what the other api_tinker*.c handlers share: error replies, model lookups, the base
 * models' vocabulary cache and submitting requests to a session job's worker. */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "model/config.h"
#include "server/tinker_api.h"

#define BASE_CACHE 16

struct base_info {
    char dir[SERVER_PATH_BYTES];
    int64_t vocab_size, max_context;
};

struct tinker_api {
    struct tinker_order *order;
    pthread_mutex_t lock; /* guards bases */
    struct base_info bases[BASE_CACHE];
    int n_bases;
};

/* What waits in the order for a model's turn. */
struct payload {
    struct server *s;
    char job_id[HTTP_ID_BYTES];
    json_t *header;
    struct msg_array arrays[MSG_MAX_ARRAYS];
    int n_arrays;
};

static void payload_free(void *p) {
    struct payload *x = p;
    json_decref(x->header);
    for (int i = 0; i < x->n_arrays; i++) free(x->arrays[i].data);
    free(x);
}

/* A pending future whose request could not be handed to the dispatcher: failed with why, with an event on its
 * job, so its poll does not wait for a worker that will never see it. */
static void future_fail(struct server *s, struct store_conn *c, const char *job_id, const char *future_id,
                        const struct smelt_error *why) {
    char message[700];
    snprintf(message, sizeof message, "the request could not be sent to the session worker: %.600s", why->message);
    struct smelt_error err = {0};
    if (tinker_future_fail(s, c, future_id, job_id, message, &err) != 0)
        log_error("tinker: failing future %s: %s", future_id, err.message);
    else tinker_futures_wake(s, future_id);
}

/* The order's send: to the dispatcher; a failure fails the future (ctx: a store conn). */
static void payload_send(void *ctx, void *p, const char *future_id) {
    struct payload *x = p;
    struct smelt_error err = {0};
    if (tinker_dispatch_submit(x->s, x->job_id, future_id, x->header, x->arrays, x->n_arrays, &err) != 0)
        future_fail(x->s, ctx, x->job_id, future_id, &err);
    payload_free(x);
}

int tinker_api_start(struct server *s, struct smelt_error *err) {
    struct tinker_api *a = calloc(1, sizeof *a);
    if (!a) return error_set(err, SMELT_ENOMEM, "out of memory");
    if (tinker_order_new(payload_send, payload_free, &a->order, err) != 0) {
        free(a);
        return err->code;
    }
    pthread_mutex_init(&a->lock, NULL);
    s->tinker_api = a;
    return 0;
}

void tinker_api_stop(struct server *s) {
    struct tinker_api *a = s->tinker_api;
    if (!a) return;
    tinker_order_free(a->order);
    pthread_mutex_destroy(&a->lock);
    free(a);
    s->tinker_api = NULL;
}

struct tinker_order *tinker_api_order(struct server *s) {
    return s->tinker_api->order;
}

void tinker_api_forget_job(struct server *s, struct store_conn *c, const char *job_id) {
    if (!s->tinker_api) return;
    json_t *rows = NULL;
    struct smelt_error err = {0};
    if (store_query(c, &rows, &err, "SELECT id FROM tinker_models WHERE job_id = ?", "s", job_id) != 0) {
        log_error("tinker: the models of job %s stay ordered: %s", job_id, err.message);
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) tinker_order_close(s->tinker_api->order, json_string_value(json_object_get(row,
                                                                                                               "id")));
    json_decref(rows);
}

/* ---- shared helpers ---- */

void tinker_reply_failure(struct http_response *res, const struct smelt_error *err, const char *param) {
    int status = err->code == SMELT_ENOTFOUND                                                        ? 404
                 : err->code == SMELT_EINVAL || err->code == SMELT_EFORMAT || err->code == SMELT_EUNSUPPORTED ? 400
                                                                                                   : 500;
    if (!param && err->field[0]) param = err->field;
    http_reply_error(res, status, param, NULL, "%s", err->message);
}

/* A refused body as a 400 naming the field. */
static void reply_refused(struct http_response *res, const struct smelt_error *err) {
    http_reply_error(res, 400, err->field[0] ? err->field : NULL,
                     err->code == SMELT_EUNSUPPORTED ? "unsupported" : "invalid_value", "%s", err->message);
}

json_t *tinker_body(const struct http_request *req, struct http_response *res, const struct body_rule *rules) {
    json_t *body = server_body_object(req, res);
    struct smelt_error err = {0};
    if (body && body_check(body, rules, "", &err) != 0) {
        reply_refused(res, &err);
        json_decref(body);
        return NULL;
    }
    return body;
}

int tinker_optional_body(const struct http_request *req, struct http_response *res, const struct body_rule *rules) {
    if (req->body_len == 0) return 0;
    json_t *body = tinker_body(req, res, rules);
    json_decref(body);
    return body ? 0 : -1;
}

/* A body refused by its rules: a live model's seq (model_id, seq_id as its rules read them) is passed over
 * first. */
static void refuse_body(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                        const json_t *body, const struct smelt_error *why) {
    const char *model_id = json_string_value(json_object_get(body, "model_id"));
    int64_t seq = 0;
    struct smelt_error err = {0};
    json_t *row = NULL;
    if (model_id && json_field_int(body, "seq_id", true, 0, 1, INT32_MAX, &seq, "request", &err) == 0 &&
        store_query_one(c, &row, &err, "SELECT id FROM tinker_models WHERE id = ? AND project_id = ? AND "
                        "status = 'live'", "ss", model_id, project) == 0)
        tinker_order_skip(s->tinker_api->order, model_id, seq, c);
    json_decref(row);
    reply_refused(res, why);
}

int tinker_txn_begin(struct store_conn *c, struct http_response *res) {
    struct smelt_error err = {0};
    int rc = store_begin(c, &err);
    if (rc) http_reply_error(res, 503, NULL, "store_busy", "the store is busy: %s", err.message);
    return rc;
}

void tinker_txn_end(struct store_conn *c, struct http_response *res) {
    struct smelt_error err = {0};
    /* a refusal may have written too (a failed future, a dropped model): committed alike */
    if (store_commit(c, &err) != 0)
        http_reply_error(res, 500, NULL, NULL, "storing the request failed: %s", err.message);
}

void tinker_with_body(void *app, struct http_request *req, struct http_response *res, const struct body_rule *rules,
                      tinker_body_fn fn) {
    struct server *s = app;
    json_t *body = server_body_object(req, res);
    if (!body) return;
    struct smelt_error err = {0};
    int refused = body_check(body, rules, "", &err);
    struct store_conn *c = server_conn(s, res);
    if (c && tinker_txn_begin(c, res) == 0) {
        if (refused) refuse_body(s, c, res, req->identity.project, body, &err);
        else fn(s, c, res, req->identity.project, body);
        tinker_txn_end(c, res);
    }
    if (c) store_release(s->store, c);
    json_decref(body);
}

int tinker_base_info(struct server *s, const char *base_dir, int64_t *vocab_size, int64_t *max_context,
                     struct smelt_error *err) {
    struct tinker_api *a = s->tinker_api;
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < a->n_bases; i++) {
        if (strcmp(a->bases[i].dir, base_dir)) continue;
        *vocab_size = a->bases[i].vocab_size, *max_context = a->bases[i].max_context;
        pthread_mutex_unlock(&a->lock);
        return 0;
    }
    pthread_mutex_unlock(&a->lock);
    struct model_config cfg;
    TRY(model_config_load(base_dir, &cfg, err));
    *vocab_size = cfg.vocab_size, *max_context = cfg.max_seq_len;
    pthread_mutex_lock(&a->lock);
    struct base_info *b = &a->bases[a->n_bases < BASE_CACHE ? a->n_bases++ : 0];
    snprintf(b->dir, sizeof b->dir, "%s", base_dir);
    b->vocab_size = cfg.vocab_size, b->max_context = cfg.max_seq_len;
    pthread_mutex_unlock(&a->lock);
    return 0;
}

json_t *tinker_model_row(struct store_conn *c, struct http_response *res, const char *project, const char *model_id,
                         bool live) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = model_id ? store_query_one(c, &row, &err, "SELECT *, lora AS lora__json FROM tinker_models WHERE id = ? "
                                        "AND project_id = ?", "ss", model_id, project)
                      : error_set(&err, SMELT_ENOTFOUND, "model_id is required");
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, "model_id", "not_found", "model_id: no such model: %.200s",
                         model_id ? model_id : "(none)");
        return NULL;
    }
    if (rc) {
        tinker_reply_failure(res, &err, NULL);
        return NULL;
    }
    const char *status = json_string_value(json_object_get(row, "status"));
    if (live && strcmp(status, "live") != 0) {
        http_reply_error(res, 410, "model_id", "model_gone",
                         "model_id: model %s is %s (its session worker %s); load its last save_state into a new "
                         "training client (ServiceClient.create_training_client_from_state)", model_id, status,
                         strcmp(status, "released") == 0 ? "was released after being idle" : "is gone");
        json_decref(row);
        return NULL;
    }
    return row;
}

static int future_start(struct store_conn *c, const char *project, const char *model_id, const char *job_id,
                        const char *op, json_t *base, char *fut, size_t cap, struct smelt_error *err) {
    TRY(tinker_future_create(c, project, model_id, job_id, op, fut, cap, err));
    if (!base) return 0;
    int rc = store_exec(c, err, "UPDATE tinker_futures SET result = ? WHERE id = ?", "js", base, fut);
    return rc < 0 ? rc : 0;
}

static struct payload *payload_new(struct server *s, const char *job_id, json_t *header,
                                   const struct msg_array *arrays, int n_arrays) {
    struct payload *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->s = s;
    snprintf(x->job_id, sizeof x->job_id, "%s", job_id);
    x->header = header;
    for (int i = 0; i < n_arrays && i < MSG_MAX_ARRAYS; i++) {
        x->arrays[i].data = malloc(arrays[i].bytes ? arrays[i].bytes : 1);
        if (!x->arrays[i].data) {
            x->header = NULL;
            payload_free(x);
            return NULL;
        }
        memcpy(x->arrays[i].data, arrays[i].data, arrays[i].bytes);
        x->arrays[i].bytes = arrays[i].bytes;
        x->n_arrays = i + 1;
    }
    return x;
}

int tinker_submit_quiet(struct server *s, struct store_conn *c, const char *project, const char *model_id,
                        const char *job_id, const char *op, json_t *base, json_t *header, char *fut, size_t cap,
                        struct smelt_error *err) {
    json_object_set_new(header, "op", json_string(op));
    if (model_id) json_object_set_new(header, "model_id", json_string(model_id));
    int rc = future_start(c, project, model_id, job_id, op, base, fut, cap, err);
    if (!rc && (rc = tinker_dispatch_submit(s, job_id, fut, header, NULL, 0, err)) != 0)
        future_fail(s, c, job_id, fut, err);
    json_decref(header);
    return rc;
}

static void reply_future(struct http_response *res, const char *fut, const char *model_id, json_t *extra) {
    json_t *o = json_pack("{s:s}", "request_id", fut);
    if (o && model_id) json_object_set_new(o, "model_id", json_string(model_id));
    if (o && extra) json_object_update(o, extra);
    json_decref(extra);
    if (!o) http_reply_error(res, 500, NULL, NULL, "out of memory");
    else http_reply_json(res, 200, o);
}

void tinker_submit(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                   const char *model_id, int64_t seq, const char *job_id, const char *op, json_t *base, json_t *header,
                   const struct msg_array *arrays, int n_arrays, json_t *extra) {
    char fut[HTTP_ID_BYTES], first[HTTP_ID_BYTES];
    struct smelt_error err = {0};
    if (!header) {
        json_decref(base);
        json_decref(extra);
        if (model_id && seq >= 1) tinker_order_skip(s->tinker_api->order, model_id, seq, c);
        http_reply_error(res, 500, NULL, NULL, "out of memory");
        return;
    }
    json_object_set_new(header, "op", json_string(op));
    if (model_id) json_object_set_new(header, "model_id", json_string(model_id));
    int rc = future_start(c, project, model_id, job_id, op, base, fut, sizeof fut, &err);
    json_decref(base);
    struct payload *x = rc ? NULL : payload_new(s, job_id, header, arrays, n_arrays);
    if (!rc && !x) rc = error_set(&err, SMELT_ENOMEM, "out of memory");
    if (rc) {
        json_decref(header);
        json_decref(extra);
        if (model_id && seq >= 1) tinker_order_skip(s->tinker_api->order, model_id, seq, c);
        tinker_reply_failure(res, &err, NULL);
        return;
    }
    if (seq < 0) {
        payload_send(c, x, fut);
        reply_future(res, fut, model_id, extra);
        return;
    }
    log_debug("tinker: %s seq %lld of %s is %s", op, (long long)seq, model_id, fut);
    rc = tinker_order_submit(s->tinker_api->order, model_id, seq, fut, x, c, first, sizeof first, &err);
    if (rc) {
        payload_free(x);
        store_exec(c, &(struct smelt_error){0}, "DELETE FROM tinker_futures WHERE id = ?", "s", fut);
    }
    if (rc == TINKER_ORDER_REPEATED) reply_future(res, first, model_id, extra);
    else if (rc) {
        json_decref(extra);
        tinker_reply_failure(res, &err, NULL);
    } else reply_future(res, fut, model_id, extra);
}

int tinker_job_for_base(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                        const char *base_model, const char *field, char *base_dir, size_t dir_cap, char *job_id,
                        size_t job_cap) {
    char kind[32];
    struct smelt_error err = {0};
    int rc = base_model ? models_resolve(s, c, project, base_model, base_dir, dir_cap, kind, sizeof kind, &err)
                        : error_set(&err, SMELT_EINVAL, "%s is required", field);
    /* a job's full model is a base like any other; an adapter is not a whole model */
    if (!rc && strcmp(kind, "lora") == 0)
        rc = error_set_field(&err, SMELT_EUNSUPPORTED, field, "%s: %s is a LoRA adapter; Tinker models start from a "
                             "base or fully fine-tuned model (load a sampler checkpoint's adapter with "
                             "create_sampling_client(model_path=...))", field, base_model);
    if (!rc) rc = tinker_session_job(s, c, project, base_model, base_dir, job_id, job_cap, &err);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, field, "model_not_found", "%s: no such model: %.200s (GET /v1/models lists them)",
                         field, base_model);
        return rc;
    }
    if (rc) tinker_reply_failure(res, &err, field);
    return rc;
}

/* ---- session routes ---- */

void api_tinker_healthz(void *app, struct http_request *req, struct http_response *res) {
    (void)app, (void)req;
    http_reply_json(res, 200, json_pack("{s:s}", "status", "ok"));
}

void api_tinker_client_config(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    if (tinker_optional_body(req, res, TINKER_CLIENT_CONFIG)) return;
    /* httpx everywhere: the SDK's default Rust transport is not needed on a local server. */
    http_reply_json(res, 200, json_pack("{s:b, s:b, s:b}", "use_pyqwest_transport", 0, "pjwt_auth_enabled", 0,
                                        "proto_compress_fwdbwd", 0));
}

void api_tinker_dynamic_config(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    if (tinker_optional_body(req, res, TINKER_CLIENT_CONFIG)) return;
    http_reply_json(res, 200, json_object());
}

void api_tinker_telemetry(void *app, struct http_request *req, struct http_response *res) {
    (void)app;
    if (tinker_optional_body(req, res, TINKER_TELEMETRY)) return;
    http_reply_json(res, 200, json_pack("{s:s}", "status", "accepted"));
}

static void create_session(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                           const json_t *body) {
    (void)s;
    char id[HTTP_ID_BYTES];
    server_new_id("sess-", id, sizeof id);
    struct smelt_error err = {0};
    json_t *tags = json_object_get(body, "tags"), *meta = json_object_get(body, "user_metadata");
    const char *sdk = json_string_value(json_object_get(body, "sdk_version"));
    int64_t now = server_now();
    int rc = store_exec(c, &err, "INSERT INTO tinker_sessions (id, project_id, created_at, last_seen, tags, metadata, "
                        "sdk_version) VALUES (?, ?, ?, ?, ?, ?, ?)", "ssiijjs", id, project, now, now,
                        json_is_array(tags) ? tags : NULL, json_is_object(meta) ? meta : NULL, sdk);
    if (rc < 0) tinker_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s, s:s}", "type", "create_session", "session_id", id));
}

void api_tinker_create_session(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_CREATE_SESSION, create_session);
}

static void heartbeat(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                      const json_t *body) {
    (void)s;
    struct smelt_error err = {0};
    const char *id = json_string_value(json_object_get(body, "session_id"));
    int rc = store_exec(c, &err, "UPDATE tinker_sessions SET last_seen = ? WHERE id = ? AND project_id = ?", "iss",
                        server_now(), id ? id : "", project);
    if (rc == 0) http_reply_error(res, 404, "session_id", "not_found", "session_id: no such session: %.200s",
                                  id ? id : "(none)");
    else if (rc < 0) tinker_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s}", "type", "session_heartbeat"));
}

void api_tinker_heartbeat(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_HEARTBEAT, heartbeat);
}

void api_tinker_finish(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = tinker_body(req, res, TINKER_FINISH_SESSION);
    if (!body) return;
    json_decref(body);
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = store_query_one(c, &row, &err, "SELECT id FROM tinker_sessions WHERE id = ? AND project_id = ?", "ss",
                             req->params[0], req->identity.project);
    store_release(s->store, c);
    json_decref(row);
    /* Its models stay until idle release: the client may have saved nothing yet. */
    if (rc) tinker_reply_failure(res, &err, "session_id");
    else http_reply_json(res, 200, json_object());
}

/* A base model under models_dir whose config names a causal LM, or NULL. */
static json_t *capability(struct server *s, const char *name) {
    char dir[SERVER_PATH_BYTES], cfgpath[SERVER_PATH_BYTES + 16];
    if (name[0] == '.' || snprintf(dir, sizeof dir, "%s/%s", s->models_dir, name) >= (int)sizeof dir) return NULL;
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
    json_t *cfg = NULL;
    struct smelt_error err = {0};
    if (!path_exists(cfgpath) || json_load_path(cfgpath, &cfg, &err) != 0) return NULL;
    const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    size_t n = arch ? strlen(arch) : 0;
    bool lm = n > 11 && (strcmp(arch + n - 11, "ForCausalLM") == 0 || (n > 12 && strcmp(arch + n - 12, "LMHeadModel") == 0));
    json_decref(cfg);
    int64_t vocab, ctx;
    if (!lm || tinker_base_info(s, dir, &vocab, &ctx, &err) != 0) return NULL;
    return json_pack("{s:s, s:I, s:b, s:b}", "model_name", name, "max_context_length", (json_int_t)ctx, "trainable", 1,
                     "sampleable", 1);
}

/* The project's fully fine-tuned models (job outputs), trainable further. */
static void full_models(struct server *s, const char *project, json_t *list) {
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(s->store, &err);
    json_t *rows = NULL, *row;
    if (!c || store_query(c, &rows, &err, "SELECT id, path FROM models WHERE project_id = ? AND kind = 'full' AND "
                          "deleted = 0 ORDER BY created_at", "s", project) != 0)
        log_warn("tinker: capabilities: %s", err.message);
    if (c) store_release(s->store, c);
    size_t i;
    json_array_foreach(rows, i, row) {
        int64_t vocab, ctx;
        if (tinker_base_info(s, json_string_value(json_object_get(row, "path")), &vocab, &ctx, &err) == 0)
            json_array_append_new(list, json_pack("{s:O, s:I, s:b, s:b}", "model_name", json_object_get(row, "id"),
                                                  "max_context_length", (json_int_t)ctx, "trainable", 1,
                                                  "sampleable", 1));
    }
    json_decref(rows);
}

void api_tinker_capabilities(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *list = json_array();
    DIR *d = opendir(s->models_dir);
    for (struct dirent *e; d && list && (e = readdir(d));) {
        json_t *m = capability(s, e->d_name);
        if (m) json_array_append_new(list, m);
    }
    if (d) closedir(d);
    if (list) full_models(s, req->identity.project, list);
    if (!list) http_reply_error(res, 500, NULL, NULL, "out of memory");
    else http_reply_json(res, 200, json_pack("{s:o}", "supported_models", list));
}
