/* The Tinker SDK's REST routes over training runs (= models) and their checkpoints
 * (docs/tinker.md), and the mapping of checkpoint names to tinker:// paths and to
 * directories: tinker://<model_id>/weights/<name> (save_state) and
 * tinker://<model_id>/sampler_weights/<name> (save_weights_for_sampler) live in
 * DATA/tinker/<model_id>/{weights,sampler_weights}/<name>/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/tinker_api.h"

bool tinker_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64 || name[0] == '.') return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.'))
            return false;
    return true;
}

/* A model id as the server makes them: "<session>:train:<n>", no '/' and no dot-dot. */
static bool model_id_ok(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n >= TINKER_ID_BYTES || id[0] == '.') return false;
    for (const char *c = id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == ':' || *c == '.'))
            return false;
    return strstr(id, "..") == NULL;
}

static const char *segment_of(const char *kind) {
    return strcmp(kind, "training") == 0 ? "weights" : strcmp(kind, "sampler") == 0 ? "sampler_weights" : NULL;
}

static int check(const char *model_id, const char *kind, const char *name, struct smelt_error *err) {
    if (!model_id_ok(model_id)) return error_set_field(err, SMELT_EINVAL, "model_id", "model_id: not a model id");
    if (!segment_of(kind)) return error_set(err, SMELT_EINVAL, "checkpoint kind %s", kind);
    if (!tinker_name_ok(name))
        return error_set_field(err, SMELT_EINVAL, "path", "path: a checkpoint name of 1 to 64 characters from "
                               "A-Z a-z 0-9 . _ - (not starting with '.') is expected");
    return 0;
}

int tinker_checkpoint_path(const char *model_id, const char *kind, const char *name, char *out, size_t cap,
                           struct smelt_error *err) {
    TRY(check(model_id, kind, name, err));
    if (snprintf(out, cap, "tinker://%s/%s/%s", model_id, segment_of(kind), name) >= (int)cap)
        return error_set_field(err, SMELT_EINVAL, "path", "path: too long");
    return 0;
}

int tinker_checkpoint_dir(const char *data_dir, const char *model_id, const char *kind, const char *name, char *out,
                          size_t cap, struct smelt_error *err) {
    TRY(check(model_id, kind, name, err));
    if (snprintf(out, cap, "%s/tinker/%s/%s/%s", data_dir, model_id, segment_of(kind), name) >= (int)cap)
        return error_set_field(err, SMELT_EINVAL, "path", "path: too long");
    return 0;
}

static json_t *iso_time(int64_t t) {
    char buf[32];
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(buf);
}

static json_t *checkpoint_object(const json_t *row) {
    const char *tpath = json_string_value(json_object_get(row, "id"));
    const char *kind = json_string_value(json_object_get(row, "kind"));
    char cid[256];
    snprintf(cid, sizeof cid, "%s/%s", segment_of(kind) ? segment_of(kind) : kind,
             json_string_value(json_object_get(row, "name")));
    return json_pack("{s:s, s:s, s:o, s:s, s:b}", "checkpoint_id", cid, "checkpoint_type", kind, "time",
                     iso_time(json_integer_value(json_object_get(row, "created_at"))), "tinker_path", tpath, "public",
                     0);
}

static json_t *run_object(struct store_conn *c, const json_t *row) {
    const char *id = json_string_value(json_object_get(row, "id"));
    json_t *o = json_pack("{s:s, s:O, s:s, s:b, s:O, s:o, s:b}", "training_run_id", id, "base_model",
                          json_object_get(row, "base_model"), "model_owner",
                          json_string_value(json_object_get(row, "project_id")), "is_lora", 1, "lora_rank",
                          json_object_get(json_object_get(row, "lora"), "rank"), "last_request_time",
                          iso_time(json_integer_value(json_object_get(row, "last_time"))), "corrupted",
                          strcmp(json_string_value(json_object_get(row, "status")), "lost") == 0);
    static const char *const kinds[] = {"training", "sampler"}, *const keys[] = {"last_checkpoint",
                                                                              "last_sampler_checkpoint"};
    for (int k = 0; o && k < 2; k++) {
        json_t *ck = NULL;
        struct smelt_error err = {0};
        if (store_query_one(c, &ck, &err, "SELECT * FROM tinker_checkpoints WHERE model_id = ? AND kind = ? ORDER BY "
                            "created_at DESC LIMIT 1", "ss", id, kinds[k]) == 0)
            json_object_set_new(o, keys[k], checkpoint_object(ck));
        json_decref(ck);
    }
    return o;
}

#define RUN_SELECT "SELECT *, lora AS lora__json, COALESCE((SELECT MAX(f.created_at) FROM tinker_futures f WHERE " \
                   "f.model_id = m.id), m.created_at) AS last_time FROM tinker_models m "

void api_tinker_runs_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    const char *l = http_query(req, "limit"), *off = http_query(req, "offset");
    long long limit = l ? atoll(l) : 20, offset = off ? atoll(off) : 0;
    if (limit < 1 || limit > 1000 || offset < 0) {
        http_reply_error(res, 400, l && (limit < 1 || limit > 1000) ? "limit" : "offset", "invalid_value",
                         "limit: 1..1000 and offset >= 0 are expected");
        return;
    }
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *rows = NULL, *total = NULL;
    struct smelt_error err = {0};
    int rc = store_query(c, &rows, &err, RUN_SELECT "WHERE m.project_id = ? ORDER BY m.created_at DESC, m.id "
                         "LIMIT ? OFFSET ?", "sii", req->identity.project, (int64_t)limit, (int64_t)offset);
    if (!rc) rc = store_query_one(c, &total, &err, "SELECT COUNT(*) AS n FROM tinker_models WHERE project_id = ?", "s",
                                  req->identity.project);
    json_t *list = json_array(), *row;
    size_t i;
    json_array_foreach(rc ? NULL : rows, i, row) json_array_append_new(list, run_object(c, row));
    store_release(s->store, c);
    if (rc) tinker_reply_failure(res, &err, NULL);
    else
        http_reply_json(res, 200, json_pack("{s:o, s:{s:I, s:I, s:O}}", "training_runs", list, "cursor", "offset",
                                            (json_int_t)offset, "limit", (json_int_t)limit, "total_count",
                                            json_object_get(total, "n")));
    if (rc) json_decref(list);
    json_decref(rows);
    json_decref(total);
}

/* The project's run (model) row of params[0] (new reference) or a 404 reply. */
static json_t *run_row(struct store_conn *c, struct http_response *res, const struct http_request *req) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = store_query_one(c, &row, &err, RUN_SELECT "WHERE m.id = ? AND m.project_id = ?", "ss", req->params[0],
                             req->identity.project);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "training_run_id", "not_found", "training_run_id: no such training run: %s",
                         req->params[0]);
    else if (rc) tinker_reply_failure(res, &err, NULL);
    return rc ? NULL : row;
}

void api_tinker_run_get(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *row = run_row(c, res, req);
    if (row) http_reply_json(res, 200, run_object(c, row));
    store_release(s->store, c);
    json_decref(row);
}

void api_tinker_checkpoints(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *run = run_row(c, res, req), *rows = NULL;
    struct smelt_error err = {0};
    int rc = run ? store_query(c, &rows, &err, "SELECT * FROM tinker_checkpoints WHERE model_id = ? AND project_id = ? "
                               "ORDER BY created_at, id", "ss", req->params[0], req->identity.project)
                 : -1;
    store_release(s->store, c);
    json_decref(run);
    if (rc > 0 || (rc < 0 && run)) tinker_reply_failure(res, &err, NULL);
    if (rc) return;
    json_t *list = json_array(), *row;
    size_t i;
    json_array_foreach(rows, i, row) json_array_append_new(list, checkpoint_object(row));
    json_decref(rows);
    http_reply_json(res, 200, json_pack("{s:o}", "checkpoints", list));
}

void api_tinker_checkpoint_delete(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    const char *run = req->params[0], *segment = req->params[1], *name = req->params[2];
    const char *kind = strcmp(segment, "weights") == 0 ? "training" : strcmp(segment, "sampler_weights") == 0 ? "sampler"
                                                                                                            : NULL;
    char tpath[SERVER_PATH_BYTES];
    struct smelt_error err = {0};
    if (!kind || tinker_checkpoint_path(run, kind, name, tpath, sizeof tpath, &err) != 0) {
        http_reply_error(res, 404, "checkpoint_id", "not_found", "checkpoint_id: no such checkpoint: %s/%s", segment,
                         name);
        return;
    }
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *row = NULL;
    int rc = store_query_one(c, &row, &err, "SELECT path FROM tinker_checkpoints WHERE id = ? AND project_id = ?", "ss",
                             tpath, req->identity.project);
    if (!rc) rc = store_exec(c, &err, "DELETE FROM tinker_checkpoints WHERE id = ?", "s", tpath) < 0 ? err.code : 0;
    if (!rc && strcmp(kind, "sampler") == 0)
        rc = store_exec(c, &err, "UPDATE models SET deleted = 1 WHERE path = ? AND project_id = ?", "ss",
                        json_string_value(json_object_get(row, "path")), req->identity.project) < 0 ? err.code : 0;
    store_release(s->store, c);
    if (!rc) rc = dir_remove_all(json_string_value(json_object_get(row, "path")), &err);
    json_decref(row);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "checkpoint_id", "not_found", "checkpoint_id: no such checkpoint: %s/%s", segment,
                         name);
    else if (rc) tinker_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_object());
}

void api_tinker_weights_info(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *body = tinker_body(req, res, TINKER_WEIGHTS_INFO);
    if (!body) return;
    struct store_conn *c = server_conn(s, res);
    json_t *row = NULL;
    struct smelt_error err = {0};
    const char *tpath = json_string_value(json_object_get(body, "tinker_path"));
    int rc = !c ? -1 : tpath ? store_query_one(c, &row, &err, "SELECT m.base_model, m.lora AS lora__json FROM "
                                               "tinker_checkpoints k JOIN tinker_models m ON m.id = k.model_id WHERE "
                                               "k.id = ? AND k.project_id = ?", "ss", tpath, req->identity.project)
                             : SMELT_ENOTFOUND;
    if (c) store_release(s->store, c);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "tinker_path", "not_found", "tinker_path: no such checkpoint: %.300s",
                         tpath ? tpath : "(none)");
    else if (rc > 0 || (rc < 0 && c)) tinker_reply_failure(res, &err, NULL);
    else if (!rc) {
        json_t *l = json_object_get(row, "lora");
        http_reply_json(res, 200, json_pack("{s:O, s:b, s:O, s:O, s:O, s:O}", "base_model",
                                            json_object_get(row, "base_model"), "is_lora", 1, "lora_rank",
                                            json_object_get(l, "rank"), "train_unembed",
                                            json_object_get(l, "train_unembed"), "train_mlp",
                                            json_object_get(l, "train_mlp"), "train_attn",
                                            json_object_get(l, "train_attn")));
    }
    json_decref(row);
    json_decref(body);
}
