/* The Tinker session tests' store: a temporary data directory with smeltd's store, the
 * Tinker tables (S_shared's schema; CREATE ... IF NOT EXISTS so that, once helper S1's
 * migration 3 creates them, this is a no-op) and helpers that write jobs, models,
 * sessions and futures rows as the API would. */
#ifndef SMELT_TESTS_TINKER_TESTUTIL_H
#define SMELT_TESTS_TINKER_TESTUTIL_H

#include "tests/unit/testutil.h"

#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "common/common.h"
#include "server/tinker_internal.h"

__attribute__((unused)) static struct server tinker_s;

static const char *const TINKER_TABLES[] = {
    "CREATE TABLE IF NOT EXISTS tinker_sessions (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, created_at "
    "INTEGER NOT NULL, last_seen INTEGER NOT NULL, tags TEXT, metadata TEXT, sdk_version TEXT)",
    "CREATE TABLE IF NOT EXISTS tinker_models (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, session_id TEXT NOT "
    "NULL, job_id TEXT NOT NULL, base_model TEXT NOT NULL, base_dir TEXT NOT NULL, lora TEXT NOT NULL, created_at "
    "INTEGER NOT NULL, status TEXT NOT NULL DEFAULT 'live')",
    "CREATE TABLE IF NOT EXISTS tinker_futures (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, model_id TEXT, job_id "
    "TEXT, op TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL, finished_at INTEGER, result TEXT, "
    "error TEXT)",
    "CREATE TABLE IF NOT EXISTS tinker_checkpoints (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, model_id TEXT NOT "
    "NULL, kind TEXT NOT NULL, name TEXT NOT NULL, path TEXT NOT NULL, created_at INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tinker_samplers (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, session_id TEXT, "
    "job_id TEXT NOT NULL, base_model TEXT NOT NULL, model_id TEXT, adapter_path TEXT, created_at INTEGER NOT NULL)",
};

static inline struct store_conn *tinker_conn(void) {
    struct smelt_error err = {0};
    struct store_conn *c = store_acquire(tinker_s.store, &err);
    cr_assert(c, "%s", err.message);
    return c;
}

static inline void tinker_setup(void) {
    test_tmp_setup();
    memset(&tinker_s, 0, sizeof tinker_s);
    snprintf(tinker_s.jobs_dir, sizeof tinker_s.jobs_dir, "%s/jobs", test_tmp_dir);
    snprintf(tinker_s.models_dir, sizeof tinker_s.models_dir, "%s/models", test_tmp_dir);
    snprintf(tinker_s.tinker_path, sizeof tinker_s.tinker_path, "/opt/smelt/smelt-tinker");
    cr_assert(mkdir(tinker_s.jobs_dir, 0700) == 0 && mkdir(tinker_s.models_dir, 0700) == 0);
    char path[256];
    struct smelt_error err = {0};
    TEST_OK(store_open(test_tmp_path(path, sizeof path, "smelt.db"), &tinker_s.store, &err), &err);
    struct store_conn *c = tinker_conn();
    for (size_t i = 0; i < sizeof TINKER_TABLES / sizeof *TINKER_TABLES; i++)
        cr_assert(store_exec(c, &err, TINKER_TABLES[i], "") >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

static inline void tinker_teardown(void) {
    tinker_dispatch_free(&tinker_s);
    zap_handler_stop(tinker_s.zap); /* after the dispatcher's socket, before the context */
    tinker_s.zap = NULL;
    if (tinker_s.zmq) zmq_ctx_term(tinker_s.zmq);
    if (tinker_s.store) store_close(tinker_s.store);
    test_tmp_teardown();
}

/* A session job row as tinker_session_job writes it, in status, at attempt (devices [0]
 * when running), its run started run_started_at. */
static inline void tinker_insert_job(const char *id, const char *project, const char *status, int64_t attempt,
                              int64_t run_started_at) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    int rc = store_exec(c, &err, "INSERT INTO jobs (id, project_id, created_at, status, request, spec, model, method, "
                        "training_file, seed, attempt, devices, run_started_at, queued_at) VALUES (?, ?, 0, ?, '{}', "
                        "'{\"type\":\"tinker\",\"model\":\"/models/tiny\",\"model_name\":\"tiny\"}', 'tiny', "
                        "'{\"type\":\"tinker\"}', '', 0, ?, ?, ?, 0)", "sssisi", id, project, status, attempt,
                        strcmp(status, "running") == 0 ? "[0]" : NULL, run_started_at);
    cr_assert(rc >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

static inline void tinker_insert_future(const char *id, const char *job_id, const char *status, int64_t created_at) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    int rc = store_exec(c, &err, "INSERT INTO tinker_futures (id, project_id, model_id, job_id, op, status, "
                        "created_at) VALUES (?, 'default', 'm1', ?, 'optim_step', ?, ?)", "sssi", id, job_id,
                        status, created_at);
    cr_assert(rc >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

/* A session (last heard from at last_seen) and a live model of it on job_id. */
static inline void tinker_insert_model(const char *model_id, const char *session_id, const char *job_id, int64_t last_seen) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    int rc = store_exec(c, &err, "INSERT OR REPLACE INTO tinker_sessions (id, project_id, created_at, last_seen) "
                        "VALUES (?, 'default', 0, ?)", "si", session_id, last_seen);
    if (rc >= 0)
        rc = store_exec(c, &err, "INSERT INTO tinker_models (id, project_id, session_id, job_id, base_model, "
                        "base_dir, lora, created_at) VALUES (?, 'default', ?, ?, 'tiny', '/models/tiny', "
                        "'{\"rank\":8}', 0)", "sss", model_id, session_id, job_id);
    cr_assert(rc >= 0, "%s", err.message);
    store_release(tinker_s.store, c);
}

/* The first row of sql (a new reference; NULL when none). */
static inline json_t *tinker_row(const char *sql, const char *arg) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    json_t *row = NULL;
    int rc = store_query_one(c, &row, &err, sql, "s", arg);
    store_release(tinker_s.store, c);
    cr_assert(rc == 0 || rc == SMELT_ENOTFOUND, "%s", err.message);
    return rc == 0 ? row : NULL;
}

/* Column col of the first row of sql, copied into out ("" when none or NULL). */
static inline const char *tinker_text(const char *sql, const char *arg, const char *col, char *out, size_t cap) {
    json_t *row = tinker_row(sql, arg);
    snprintf(out, cap, "%s", json_string_value(json_object_get(row, col)) ?: "");
    json_decref(row);
    return out;
}

/* Whether an event of job has a message containing text. */
static inline bool tinker_event_says(const char *job, const char *text) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    json_t *rows = NULL;
    cr_assert(store_query(c, &rows, &err, "SELECT message FROM events WHERE job_id = ?", "s", job) == 0);
    store_release(tinker_s.store, c);
    bool found = false;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) found |= strstr(json_string_value(json_object_get(row, "message")), text) != 0;
    json_decref(rows);
    return found;
}

#endif
