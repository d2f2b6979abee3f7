/* /v1/files: fine-tune data uploaded as the OpenAI client sends it (multipart: purpose,
 * file), validated at once; the report is part of the file object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "datasets/datasets.h"
#include "server/server_internal.h"

#define FILE_MAX_PARTS 8

static json_t *file_object(json_t *row) {
    json_t *o = json_pack("{s:O, s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:n}",
                          "id", json_object_get(row, "id"), "object", "file",
                          "bytes", json_object_get(row, "bytes"),
                          "created_at", json_object_get(row, "created_at"),
                          "filename", json_object_get(row, "filename"),
                          "purpose", json_object_get(row, "purpose"),
                          "status", json_object_get(row, "status"),
                          "status_details", json_object_get(row, "status_details"),
                          "expires_at");
    json_t *report = json_object_get(row, "report");
    if (o && report) json_object_set(o, "validation", report);
    return o;
}

static json_t *report_json(const struct dataset_report *r) {
    json_t *errors = json_array();
    for (int64_t i = 0; errors && i < r->n_issues && i < DATASET_MAX_ISSUES; i++) {
        const struct dataset_issue *is = &r->issues[i];
        json_array_append_new(errors, json_pack("{s:I, s:s, s:s}", "line", (json_int_t)is->line,
                                                "field", is->field, "message", is->message));
    }
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:o}", "kind", dataset_kind_name(r->kind),
                     "lines", (json_int_t)r->n_lines, "examples", (json_int_t)r->n_examples,
                     "blank_lines", (json_int_t)r->n_skipped_blank,
                     "errors_total", (json_int_t)r->n_issues, "errors", errors);
}

static json_t *file_list_object(void *ctx, json_t *row) {
    (void)ctx;
    return file_object(row);
}

#define FILE_COLUMNS "id, bytes, created_at, filename, purpose, status, " \
                     "CASE WHEN status = 'error' THEN json_extract(report, '$.errors[0].message') END " \
                     "AS status_details, report AS report__json"

void api_files_create(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct http_part parts[FILE_MAX_PARTS];
    int n = 0;
    struct smelt_error err = {0};
    if (http_multipart_parse(req, parts, FILE_MAX_PARTS, &n, &err) != 0) {
        http_reply_error(res, 400, "file", "invalid_multipart", "%s", err.message);
        return;
    }
    const struct http_part *file = NULL, *purpose = NULL;
    for (int i = 0; i < n; i++) {
        if (strcmp(parts[i].name, "file") == 0 && !file) file = &parts[i];
        else if (strcmp(parts[i].name, "purpose") == 0 && !purpose) purpose = &parts[i];
        else {
            http_reply_error(res, 400, parts[i].name, "unknown_parameter",
                             "%s: unknown or repeated form field (expected purpose and file)",
                             parts[i].name);
            return;
        }
    }
    if (!purpose) {
        http_reply_error(res, 400, "purpose", "missing_required_parameter", "purpose: required");
        return;
    }
    if (purpose->len != strlen("fine-tune") || memcmp(purpose->data, "fine-tune", purpose->len) != 0) {
        http_reply_error(res, 400, "purpose", "invalid_value",
                         "purpose: only 'fine-tune' files are accepted by smelt");
        return;
    }
    if (!file || !file->filename[0]) {
        http_reply_error(res, 400, "file", "missing_required_parameter",
                         "file: a file part with a filename is required");
        return;
    }
    json_t *filename = json_string(file->filename);
    if (!filename) {
        http_reply_error(res, 400, "file", "invalid_value", "file: the filename is not valid UTF-8");
        return;
    }
    if (file->len == 0) {
        json_decref(filename);
        http_reply_error(res, 400, "file", "invalid_value", "file: the file is empty");
        return;
    }

    char id[HTTP_ID_BYTES], path[SERVER_PATH_BYTES];
    server_new_id("file-", id, sizeof id);
    if (snprintf(path, sizeof path, "%s/%s.jsonl", s->files_dir, id) >= (int)sizeof path ||
        file_write_atomic(path, file->data, file->len, &err) != 0) {
        json_decref(filename);
        if (!err.code) error_set(&err, SMELT_EIO, "files directory path too long");
        http_reply_error(res, 500, NULL, "storage_error", "storing the file: %s", err.message);
        return;
    }
    struct dataset_report *report = calloc(1, sizeof *report);
    if (!report) {
        json_decref(filename);
        unlink(path);
        http_reply_error(res, 500, NULL, "out_of_memory", "out of memory");
        return;
    }
    error_clear(&err);
    int vrc = dataset_validate_file(path, DATASET_AUTO, report, &err);
    if (vrc == SMELT_EIO) {
        free(report);
        json_decref(filename);
        unlink(path);
        http_reply_error(res, 500, NULL, "storage_error", "%s", err.message);
        return;
    }
    json_t *report_obj = report_json(report);
    const char *status = vrc == 0 ? "processed" : "error";
    if (vrc != 0 && report->n_issues == 0 && report_obj) {
        /* the file as a whole was refused (e.g. no rows): keep the reason */
        json_array_append_new(json_object_get(report_obj, "errors"),
                              json_pack("{s:i, s:s, s:s}", "line", 0, "field", "",
                                        "message", err.message));
        json_object_set_new(report_obj, "errors_total", json_integer(1));
    }
    free(report);

    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(filename);
        json_decref(report_obj);
        unlink(path);
        return;
    }
    int rc = store_exec(conn, &err,
                        "INSERT INTO files (id, project_id, filename, purpose, bytes, created_at, "
                        "path, status, kind, report) VALUES (?, ?, ?, 'fine-tune', ?, ?, ?, ?, ?, ?)",
                        "sssiisssj", id, req->identity.project, json_string_value(filename),
                        (int64_t)file->len, server_now(), path, status,
                        json_string_value(json_object_get(report_obj, "kind")), report_obj);
    json_t *row = NULL;
    if (rc >= 0)
        rc = store_query_one(conn, &row, &err, "SELECT " FILE_COLUMNS " FROM files WHERE id = ?",
                             "s", id);
    store_release(s->store, conn);
    json_decref(filename);
    json_decref(report_obj);
    if (rc < 0) {
        unlink(path);
        server_reply_failure(res, &err, NULL);
        return;
    }
    http_reply_json(res, 200, file_object(row));
    json_decref(row);
}

void api_files_list(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    int64_t limit;
    const char *after;
    if (server_page_args(req, res, 10000, 10000, &limit, &after) != 0) return;
    const char *purpose = http_query(req, "purpose");
    const char *order = http_query(req, "order");
    if (order && strcmp(order, "asc") != 0 && strcmp(order, "desc") != 0) {
        http_reply_error(res, 400, "order", "invalid_value", "order: 'asc' or 'desc'");
        return;
    }
    bool asc = order && strcmp(order, "asc") == 0;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return;
    struct smelt_error err = {0};
    json_t *rows = NULL;
    int rc = store_query(conn, &rows, &err,
                         asc ? "SELECT " FILE_COLUMNS " FROM files WHERE project_id = ? AND deleted = 0 "
                               "AND (? IS NULL OR purpose = ?) AND (? IS NULL OR rowid > "
                               "(SELECT rowid FROM files WHERE id = ?)) ORDER BY rowid ASC LIMIT ?"
                             : "SELECT " FILE_COLUMNS " FROM files WHERE project_id = ? AND deleted = 0 "
                               "AND (? IS NULL OR purpose = ?) AND (? IS NULL OR rowid < "
                               "(SELECT rowid FROM files WHERE id = ?)) ORDER BY rowid DESC LIMIT ?",
                         "sssssi", req->identity.project, purpose, purpose, after, after, limit + 1);
    store_release(s->store, conn);
    if (rc < 0) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    server_reply_list(res, rows, limit, file_list_object, NULL, true);
}

static json_t *file_row(struct server *s, struct http_request *req, struct http_response *res) {
    struct store_conn *conn = server_conn(s, res);
    if (!conn) return NULL;
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_query_one(conn, &row, &err,
                             "SELECT " FILE_COLUMNS ", path FROM files WHERE id = ? AND project_id = ? "
                             "AND deleted = 0", "ss", req->params[0], req->identity.project);
    store_release(s->store, conn);
    if (rc == SMELT_ENOTFOUND) {
        http_reply_error(res, 404, "file_id", "not_found", "No such file: %s", req->params[0]);
        return NULL;
    }
    if (rc < 0) {
        server_reply_failure(res, &err, NULL);
        return NULL;
    }
    return row;
}

void api_files_get(void *app, struct http_request *req, struct http_response *res) {
    json_t *row = file_row(app, req, res);
    if (!row) return;
    http_reply_json(res, 200, file_object(row));
    json_decref(row);
}

void api_files_delete(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    json_t *row = file_row(s, req, res);
    if (!row) return;
    struct store_conn *conn = server_conn(s, res);
    if (!conn) {
        json_decref(row);
        return;
    }
    struct smelt_error err = {0};
    json_t *busy = NULL;
    int rc = store_query_one(conn, &busy, &err,
                             "SELECT id FROM jobs WHERE (training_file = ? OR validation_file = ?) AND "
                             "status IN ('validating_files', 'queued', 'running', 'paused') LIMIT 1",
                             "ss", req->params[0], req->params[0]);
    if (rc == 0) {
        store_release(s->store, conn);
        http_reply_error(res, 409, "file_id", "file_in_use", "%s is used by job %s, which has not ended",
                         req->params[0], json_string_value(json_object_get(busy, "id")));
        json_decref(busy);
        json_decref(row);
        return;
    }
    error_clear(&err);
    rc = store_exec(conn, &err, "UPDATE files SET deleted = 1 WHERE id = ?", "s", req->params[0]);
    store_release(s->store, conn);
    if (rc < 0) {
        json_decref(row);
        server_reply_failure(res, &err, NULL);
        return;
    }
    unlink(json_string_value(json_object_get(row, "path")));
    json_decref(row);
    http_reply_json(res, 200, json_pack("{s:s, s:s, s:b}", "id", req->params[0], "object", "file",
                                        "deleted", 1));
}

void api_files_content(void *app, struct http_request *req, struct http_response *res) {
    json_t *row = file_row(app, req, res);
    if (!row) return;
    struct smelt_error err = {0};
    char *data = NULL;
    size_t len = 0;
    int rc = file_read_all(json_string_value(json_object_get(row, "path")), &data, &len, &err);
    json_decref(row);
    if (rc) {
        server_reply_failure(res, &err, NULL);
        return;
    }
    res->status = 200;
    res->body = data;
    res->body_len = len;
    snprintf(res->content_type, sizeof res->content_type, "application/octet-stream");
}
