/* /v1/models: base models found under the models directory, and the models and adapters
 * the project's jobs produced; each id works as a job's `model`. Each says its weights'
 * form (kind: base, full, lora) and, where smelt knows it, what its head does (head: "lm"
 * generates; "reward" scores, for reward models). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "server/server_internal.h"

/* A base model name is one directory name: no separators, no dot-dot, not hidden. */
static bool base_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 100 || name[0] == '.') return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            return false;
    return true;
}

static bool base_model_dir(struct server *s, const char *name, char *path, size_t cap) {
    char probe[SERVER_PATH_BYTES + 128];
    if (!base_name_ok(name)) return false;
    if (snprintf(path, cap, "%s/%s", s->models_dir, name) >= (int)cap) return false;
    snprintf(probe, sizeof probe, "%s/config.json", path);
    return path_exists(probe);
}

int models_resolve(struct server *s, struct store_conn *conn, const char *project, const char *model,
                   char *path, size_t cap, char *kind, size_t kind_cap, struct smelt_error *err) {
    if (strncmp(model, "ft:", 3) != 0) {
        if (!base_model_dir(s, model, path, cap))
            return error_set(err, SMELT_ENOTFOUND, "no such model: %s", model);
        snprintf(kind, kind_cap, "base");
        return 0;
    }
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, err, "SELECT path, kind FROM models WHERE id = ? AND project_id = ? "
                             "AND deleted = 0", "ss", model, project);
    if (rc) return rc;
    snprintf(path, cap, "%s", json_string_value(json_object_get(row, "path")));
    snprintf(kind, kind_cap, "%s", json_string_value(json_object_get(row, "kind")));
    json_decref(row);
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A base model's head from its config.json's architecture (transformers' class names),
 * NULL when the file names none that says. */
static const char *base_head(const char *dir) {
    char path[SERVER_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *config = NULL;
    struct smelt_error err = {0};
    if (json_load_path(path, &config, &err) != 0) return NULL;
    const char *arch = json_string_value(json_array_get(json_object_get(config, "architectures"), 0));
    const char *head = !arch                                                            ? NULL
                       : ends_with(arch, "ForCausalLM") || ends_with(arch, "LMHeadModel") ? "lm"
                       : ends_with(arch, "ForSequenceClassification")                   ? "reward"
                                                                                        : NULL;
    json_decref(config);
    return head;
}

static json_t *base_object(const char *name, const char *dir) {
    struct stat st;
    json_int_t created = stat(dir, &st) == 0 ? (json_int_t)st.st_mtime : 0;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", name, "object", "model", "created", created,
                          "owned_by", "smelt", "kind", "base");
    const char *head = base_head(dir);
    if (o && head) json_object_set_new(o, "head", json_string(head));
    return o;
}

static json_t *job_model_object(json_t *row) {
    return json_pack("{s:O, s:s, s:O, s:O, s:O, s:O, s:O, s:O}", "id", json_object_get(row, "id"), "object",
                     "model", "created", json_object_get(row, "created_at"), "owned_by",
                     json_object_get(row, "project_id"), "kind", json_object_get(row, "kind"), "head",
                     json_object_get(row, "head"), "base_model", json_object_get(row, "base_model"),
                     "fine_tuning_job_id", json_object_get(row, "job_id"));
}

void api_models_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *data = json_array();
    DIR *dir = opendir(s->models_dir);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir))) {
            char path[SERVER_PATH_BYTES];
            if (!base_model_dir(s, e->d_name, path, sizeof path)) continue;
            json_array_append_new(data, base_object(e->d_name, path));
        }
        closedir(dir);
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(data);
        return;
    }
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err, "SELECT * FROM models WHERE project_id = ? AND deleted = 0 "
                         "ORDER BY created_at", "s", req->identity.project);
    store_release(s->store, conn);
    if (rc) {
        json_decref(data);
        server_reply_failure(res, &err, NULL);
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) json_array_append_new(data, job_model_object(row));
    json_decref(rows);
    http_reply_json(res, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

void api_models_get(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    const char *id = req->params[0];
    char path[SERVER_PATH_BYTES];
    if (strncmp(id, "ft:", 3) != 0) {
        if (!base_model_dir(s, id, path, sizeof path)) {
            http_reply_error(res, 404, "model", "model_not_found", "No such model: %s", id);
            return;
        }
        http_reply_json(res, 200, base_object(id, path));
        return;
    }
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, &err, "SELECT * FROM models WHERE id = ? AND project_id = ? AND "
                             "deleted = 0", "ss", id, req->identity.project);
    store_release(s->store, conn);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, "model", "model_not_found", "No such model: %s", id);
        return;
    }
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    http_reply_json(res, 200, job_model_object(row));
    json_decref(row);
}
