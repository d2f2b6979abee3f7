/* SQLite store: WAL, migrations, a connection pool, format-string binding. */
#include "server/store.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define STORE_POOL_SIZE 16
#define STORE_BUSY_TIMEOUT_MS 10000

#define STORE_AFTER_COMMIT_MAX 4

struct store_conn {
    sqlite3 *db;
    struct {
        void (*fn)(void *);
        void *arg;
    } after_commit[STORE_AFTER_COMMIT_MAX]; /* run after the open transaction commits */
    int n_after_commit;
};

struct store {
    pthread_mutex_t lock;
    pthread_cond_t returned;
    struct store_conn conns[STORE_POOL_SIZE];
    bool lent[STORE_POOL_SIZE];
    int n_conns;
    char path[1024];
};

/* Each migration moves the schema from version i to i + 1; never edit a released one,
 * add the next. */
static const char *const MIGRATIONS[] = {
    /* 1: the first schema */
    "CREATE TABLE projects ("
    "  id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL);"
    "CREATE TABLE api_keys ("
    "  id INTEGER PRIMARY KEY, project_id TEXT NOT NULL REFERENCES projects(id),"
    "  name TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,"
    "  admin INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,"
    "  revoked INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE files ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, filename TEXT NOT NULL,"
    "  purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,"
    "  path TEXT NOT NULL, status TEXT NOT NULL, kind TEXT, report TEXT,"
    "  deleted INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX files_project ON files(project_id, created_at);"
    "CREATE TABLE jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    "  project_id TEXT NOT NULL, created_at INTEGER NOT NULL, status TEXT NOT NULL,"
    "  request TEXT NOT NULL, spec TEXT NOT NULL, model TEXT NOT NULL, method TEXT NOT NULL,"
    "  training_file TEXT NOT NULL, validation_file TEXT, suffix TEXT, seed INTEGER NOT NULL,"
    "  metadata TEXT, priority INTEGER NOT NULL DEFAULT 0, devices_wanted INTEGER NOT NULL DEFAULT 1,"
    "  max_retries INTEGER NOT NULL DEFAULT 0, max_runtime_seconds INTEGER NOT NULL DEFAULT 0,"
    "  desired TEXT NOT NULL DEFAULT 'run', attempt INTEGER NOT NULL DEFAULT 0,"
    "  retries INTEGER NOT NULL DEFAULT 0, agent_id TEXT, devices TEXT, pid INTEGER,"
    "  started_at INTEGER, run_started_at INTEGER, finished_at INTEGER, queued_at INTEGER,"
    "  fine_tuned_model TEXT, error TEXT, trained_tokens INTEGER, saw_final INTEGER NOT NULL DEFAULT 0,"
    "  stop_sent_at INTEGER, schedule_id TEXT, event_offset INTEGER NOT NULL DEFAULT -1);"
    "CREATE INDEX jobs_project ON jobs(project_id, seq);"
    "CREATE INDEX jobs_status ON jobs(status, priority, seq);"
    "CREATE TABLE idempotency ("
    "  project_id TEXT NOT NULL, key TEXT NOT NULL, job_id TEXT NOT NULL,"
    "  created_at INTEGER NOT NULL, PRIMARY KEY (project_id, key));"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, created_at INTEGER NOT NULL,"
    "  level TEXT NOT NULL, type TEXT NOT NULL, message TEXT NOT NULL, data TEXT);"
    "CREATE INDEX events_job ON events(job_id, id);"
    "CREATE TABLE metrics ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, attempt INTEGER NOT NULL,"
    "  step INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL);"
    "CREATE INDEX metrics_job ON metrics(job_id, id);"
    "CREATE TABLE checkpoints ("
    "  id TEXT PRIMARY KEY, job_id TEXT NOT NULL, step INTEGER NOT NULL,"
    "  created_at INTEGER NOT NULL, path TEXT NOT NULL, metrics TEXT,"
    "  UNIQUE (job_id, step));"
    "CREATE TABLE models ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, job_id TEXT NOT NULL, path TEXT NOT NULL,"
    "  kind TEXT NOT NULL, base_model TEXT NOT NULL, created_at INTEGER NOT NULL,"
    "  deleted INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE schedules ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, name TEXT, cron TEXT NOT NULL,"
    "  template TEXT NOT NULL, concurrency TEXT NOT NULL, suspended INTEGER NOT NULL DEFAULT 0,"
    "  next_fire_at INTEGER, last_fire_at INTEGER, created_at INTEGER NOT NULL,"
    "  deleted INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE schedule_runs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, schedule_id TEXT NOT NULL, scheduled_for INTEGER,"
    "  fired_at INTEGER NOT NULL, trigger TEXT NOT NULL, job_id TEXT, outcome TEXT NOT NULL,"
    "  message TEXT);"
    "CREATE INDEX schedule_runs_schedule ON schedule_runs(schedule_id, id);"
    "CREATE TABLE agents ("
    "  id TEXT PRIMARY KEY, hostname TEXT NOT NULL, devices TEXT NOT NULL,"
    "  registered_at INTEGER NOT NULL, last_seen INTEGER NOT NULL, status TEXT NOT NULL);"
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);",
    /* 2: what a model's head does ("lm" generates; "reward" will score), beside its
     * weights' form (kind). Every model made before was a supervised job's: "lm". */
    "ALTER TABLE models ADD COLUMN head TEXT NOT NULL DEFAULT 'lm';",
    /* 3: the Tinker API (docs/tinker.md): sessions, LoRA models served by session jobs,
     * futures (one per request, result or error kept as JSON), checkpoints (id: the
     * tinker:// path) and sampling sessions. */
    "CREATE TABLE tinker_sessions ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, created_at INTEGER NOT NULL,"
    "  last_seen INTEGER NOT NULL, tags TEXT, metadata TEXT, sdk_version TEXT);"
    "CREATE TABLE tinker_models ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, session_id TEXT NOT NULL, job_id TEXT NOT NULL,"
    "  base_model TEXT NOT NULL, base_dir TEXT NOT NULL, lora TEXT NOT NULL, created_at INTEGER NOT NULL,"
    "  status TEXT NOT NULL DEFAULT 'live');"
    "CREATE INDEX tinker_models_project ON tinker_models(project_id, created_at);"
    "CREATE INDEX tinker_models_job ON tinker_models(job_id);"
    "CREATE TABLE tinker_futures ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, model_id TEXT, job_id TEXT, op TEXT NOT NULL,"
    "  status TEXT NOT NULL, created_at INTEGER NOT NULL, finished_at INTEGER,"
    "  result TEXT, error TEXT);"
    "CREATE INDEX tinker_futures_job ON tinker_futures(job_id, status);"
    "CREATE TABLE tinker_checkpoints ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, model_id TEXT NOT NULL,"
    "  kind TEXT NOT NULL, name TEXT NOT NULL, path TEXT NOT NULL, created_at INTEGER NOT NULL);"
    "CREATE INDEX tinker_checkpoints_model ON tinker_checkpoints(model_id, created_at);"
    "CREATE TABLE tinker_samplers ("
    "  id TEXT PRIMARY KEY, project_id TEXT NOT NULL, session_id TEXT, job_id TEXT NOT NULL,"
    "  base_model TEXT NOT NULL, model_id TEXT, adapter_path TEXT, created_at INTEGER NOT NULL);",
    /* 4: the CURVE public key of each job's current attempt (common/curve.h) */
    "ALTER TABLE jobs ADD COLUMN worker_public_key TEXT;",
    /* 5: agent credentials (docs/security.md): the public key an enrolled agent shows on
     * the agents socket; the secret key lives only in the agent's key file. replaced_by: the
     * credential a rotation made in its place. */
    "CREATE TABLE agent_credentials ("
    "  id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, public_key TEXT NOT NULL UNIQUE,"
    "  description TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL, revoked_at INTEGER,"
    "  replaced_by TEXT);"
    "CREATE INDEX agent_credentials_agent ON agent_credentials(agent_id, revoked_at);",
};
#define N_MIGRATIONS ((int)(sizeof MIGRATIONS / sizeof MIGRATIONS[0]))

static int sqlite_error(struct smelt_error *err, sqlite3 *db, const char *what) {
    return error_set(err, SMELT_EIO, "sqlite: %s: %s", what, db ? sqlite3_errmsg(db) : "out of memory");
}

static int conn_open(const char *path, sqlite3 **out, struct smelt_error *err) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                             SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        int code = sqlite_error(err, db, path);
        sqlite3_close(db);
        return code;
    }
    sqlite3_busy_timeout(db, STORE_BUSY_TIMEOUT_MS);
    char *msg = NULL;
    if (sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                         "PRAGMA foreign_keys=ON;", NULL, NULL, &msg) != SQLITE_OK) {
        int code = error_set(err, SMELT_EIO, "sqlite: %s: %s", path, msg ? msg : "pragma failed");
        sqlite3_free(msg);
        sqlite3_close(db);
        return code;
    }
    *out = db;
    return 0;
}

static int migrate(sqlite3 *db, struct smelt_error *err) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return sqlite_error(err, db, "reading the schema version");
    int version = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    if (version > N_MIGRATIONS)
        return error_set(err, SMELT_EUNSUPPORTED,
                         "the database has schema version %d, newer than this smeltd (%d)",
                         version, N_MIGRATIONS);
    for (int v = version; v < N_MIGRATIONS; v++) {
        char *msg = NULL;
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d;", v + 1);
        if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(db, MIGRATIONS[v], NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(db, pragma, NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) {
            int code = error_set(err, SMELT_EIO, "sqlite: migration %d: %s", v + 1,
                                 msg ? msg : "failed");
            sqlite3_free(msg);
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return code;
        }
        log_info("store: schema migrated to version %d", v + 1);
    }
    return 0;
}

int store_open(const char *path, struct store **out, struct smelt_error *err) {
    *out = NULL;
    struct store *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, SMELT_ENOMEM, "store: out of memory");
    if (strlen(path) >= sizeof s->path) {
        free(s);
        return error_set(err, SMELT_EINVAL, "store: path too long");
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->returned, NULL);
    int rc = conn_open(path, &s->conns[0].db, err);
    if (rc == 0) {
        s->n_conns = 1;
        rc = migrate(s->conns[0].db, err);
    }
    if (rc) {
        store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void store_close(struct store *s) {
    if (!s) return;
    for (int i = 0; i < s->n_conns; i++) sqlite3_close(s->conns[i].db);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->returned);
    free(s);
}

struct store_conn *store_acquire(struct store *s, struct smelt_error *err) {
    pthread_mutex_lock(&s->lock);
    for (;;) {
        for (int i = 0; i < s->n_conns; i++)
            if (!s->lent[i]) {
                s->lent[i] = true;
                pthread_mutex_unlock(&s->lock);
                return &s->conns[i];
            }
        if (s->n_conns < STORE_POOL_SIZE) {
            int i = s->n_conns;
            if (conn_open(s->path, &s->conns[i].db, err) != 0) {
                pthread_mutex_unlock(&s->lock);
                return NULL;
            }
            s->n_conns++;
            s->lent[i] = true;
            pthread_mutex_unlock(&s->lock);
            return &s->conns[i];
        }
        pthread_cond_wait(&s->returned, &s->lock);
    }
}

void store_release(struct store *s, struct store_conn *conn) {
    if (!conn) return;
    pthread_mutex_lock(&s->lock);
    int i = (int)(conn - s->conns);
    SMELT_ASSERT(i >= 0 && i < s->n_conns && s->lent[i]);
    /* A statement left in a transaction by a failed handler must not leak into the
     * next borrower's work. */
    if (!sqlite3_get_autocommit(conn->db)) sqlite3_exec(conn->db, "ROLLBACK", NULL, NULL, NULL);
    conn->n_after_commit = 0;
    s->lent[i] = false;
    pthread_cond_signal(&s->returned);
    pthread_mutex_unlock(&s->lock);
}

static int prepare_bind(struct store_conn *conn, sqlite3_stmt **out, struct smelt_error *err,
                        const char *sql, const char *fmt, va_list ap) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(conn->db, sql, -1, &st, NULL) != SQLITE_OK)
        return sqlite_error(err, conn->db, "prepare");
    int n_fmt = fmt ? (int)strlen(fmt) : 0;
    SMELT_ASSERT(n_fmt == sqlite3_bind_parameter_count(st));
    for (int i = 0; i < n_fmt; i++) {
        int rc = SQLITE_OK;
        switch (fmt[i]) {
        case 's': {
            const char *v = va_arg(ap, const char *);
            rc = v ? sqlite3_bind_text(st, i + 1, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i + 1);
            break;
        }
        case 'i': rc = sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t)); break;
        case 'd': rc = sqlite3_bind_double(st, i + 1, va_arg(ap, double)); break;
        case 'j': {
            json_t *v = va_arg(ap, json_t *);
            if (!v) {
                rc = sqlite3_bind_null(st, i + 1);
                break;
            }
            char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!text) {
                sqlite3_finalize(st);
                return error_set(err, SMELT_ENOMEM, "store: out of memory");
            }
            rc = sqlite3_bind_text(st, i + 1, text, -1, free);
            break;
        }
        default: SMELT_ASSERT(!"bad store format letter");
        }
        if (rc != SQLITE_OK) {
            int code = sqlite_error(err, conn->db, "bind");
            sqlite3_finalize(st);
            return code;
        }
    }
    *out = st;
    return 0;
}

static json_t *column_value(sqlite3_stmt *st, int c) {
    switch (sqlite3_column_type(st, c)) {
    case SQLITE_INTEGER: return json_integer(sqlite3_column_int64(st, c));
    case SQLITE_FLOAT: return json_real(sqlite3_column_double(st, c));
    case SQLITE_NULL: return json_null();
    default: {
        const unsigned char *text = sqlite3_column_text(st, c);
        int len = sqlite3_column_bytes(st, c);
        return json_stringn(text ? (const char *)text : "", (size_t)len);
    }
    }
}

static int row_object(sqlite3_stmt *st, json_t **out, struct smelt_error *err) {
    json_t *row = json_object();
    if (!row) return error_set(err, SMELT_ENOMEM, "store: out of memory");
    int n = sqlite3_column_count(st);
    for (int c = 0; c < n; c++) {
        const char *name = sqlite3_column_name(st, c);
        size_t len = strlen(name);
        json_t *value;
        if (len > 6 && strcmp(name + len - 6, "__json") == 0) {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(len - 6), name);
            if (sqlite3_column_type(st, c) == SQLITE_NULL) value = json_null();
            else {
                const char *text = (const char *)sqlite3_column_text(st, c);
                value = json_loads(text ? text : "null", JSON_DECODE_ANY, NULL);
                if (!value) value = json_null(); /* stored by us, so never expected */
            }
            json_object_set_new(row, key, value);
        } else {
            value = column_value(st, c);
            if (!value || json_object_set_new(row, name, value) != 0) {
                json_decref(row);
                return error_set(err, SMELT_ENOMEM, "store: out of memory");
            }
        }
    }
    *out = row;
    return 0;
}

static int run_query(struct store_conn *conn, json_t **rows, int limit, struct smelt_error *err,
                     const char *sql, const char *fmt, va_list ap) {
    sqlite3_stmt *st;
    int rc = prepare_bind(conn, &st, err, sql, fmt, ap);
    if (rc) return rc;
    json_t *array = json_array();
    if (!array) {
        sqlite3_finalize(st);
        return error_set(err, SMELT_ENOMEM, "store: out of memory");
    }
    for (;;) {
        int step = sqlite3_step(st);
        if (step == SQLITE_DONE) break;
        if (step != SQLITE_ROW) {
            rc = sqlite_error(err, conn->db, "query");
            break;
        }
        json_t *row = NULL;
        rc = row_object(st, &row, err);
        if (rc) break;
        json_array_append_new(array, row);
        if (limit > 0 && (int)json_array_size(array) >= limit) break;
    }
    sqlite3_finalize(st);
    if (rc) {
        json_decref(array);
        return rc;
    }
    *rows = array;
    return 0;
}

int store_query(struct store_conn *conn, json_t **rows, struct smelt_error *err,
                const char *sql, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = run_query(conn, rows, 0, err, sql, fmt, ap);
    va_end(ap);
    return rc;
}

int store_query_one(struct store_conn *conn, json_t **row, struct smelt_error *err,
                    const char *sql, const char *fmt, ...) {
    json_t *rows;
    va_list ap;
    va_start(ap, fmt);
    int rc = run_query(conn, &rows, 1, err, sql, fmt, ap);
    va_end(ap);
    if (rc) return rc;
    if (json_array_size(rows) == 0) {
        json_decref(rows);
        return error_set(err, SMELT_ENOTFOUND, "not found");
    }
    *row = json_incref(json_array_get(rows, 0));
    json_decref(rows);
    return 0;
}

int store_exec(struct store_conn *conn, struct smelt_error *err, const char *sql,
               const char *fmt, ...) {
    sqlite3_stmt *st;
    va_list ap;
    va_start(ap, fmt);
    int rc = prepare_bind(conn, &st, err, sql, fmt, ap);
    va_end(ap);
    if (rc) return rc;
    int step = sqlite3_step(st);
    while (step == SQLITE_ROW) step = sqlite3_step(st);
    sqlite3_finalize(st);
    if (step != SQLITE_DONE) return sqlite_error(err, conn->db, "exec");
    return sqlite3_changes(conn->db);
}

int store_begin(struct store_conn *conn, struct smelt_error *err) {
    if (sqlite3_exec(conn->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return sqlite_error(err, conn->db, "begin");
    return 0;
}

int store_commit(struct store_conn *conn, struct smelt_error *err) {
    if (sqlite3_exec(conn->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        int rc = sqlite_error(err, conn->db, "commit");
        sqlite3_exec(conn->db, "ROLLBACK", NULL, NULL, NULL);
        conn->n_after_commit = 0;
        return rc;
    }
    int n = conn->n_after_commit;
    conn->n_after_commit = 0;
    for (int i = 0; i < n; i++) conn->after_commit[i].fn(conn->after_commit[i].arg);
    return 0;
}

void store_rollback(struct store_conn *conn) {
    sqlite3_exec(conn->db, "ROLLBACK", NULL, NULL, NULL);
    conn->n_after_commit = 0;
}

void store_after_commit(struct store_conn *conn, void (*fn)(void *), void *arg) {
    if (sqlite3_get_autocommit(conn->db)) {
        fn(arg);
        return;
    }
    for (int i = 0; i < conn->n_after_commit; i++)
        if (conn->after_commit[i].fn == fn && conn->after_commit[i].arg == arg) return;
    /* the slots are a handful of distinct wake-ups; more than that is an internal misuse */
    SMELT_ASSERT(conn->n_after_commit < STORE_AFTER_COMMIT_MAX);
    conn->after_commit[conn->n_after_commit].fn = fn;
    conn->after_commit[conn->n_after_commit].arg = arg;
    conn->n_after_commit++;
}

int64_t store_last_insert_id(struct store_conn *conn) {
    return sqlite3_last_insert_rowid(conn->db);
}
