/* The store of smeltd (private to server/): one SQLite file in WAL mode, versioned
 * migrations (PRAGMA user_version), a pool of connections so HTTP threads and the
 * control loop each use their own, and small helpers that bind parameters from a format
 * string (never SQL built from request text) and return rows as JSON.
 *
 * Parameter formats, one letter per '?' in order:
 *   s  const char *   (NULL binds NULL)
 *   i  int64_t
 *   d  double
 *   j  json_t *       (stored as its compact text; NULL binds NULL)
 *
 * Result rows are JSON objects keyed by column name; INTEGER, REAL, TEXT and NULL map to
 * their JSON kinds, and a column whose name ends in "__json" is parsed and stored under
 * the name without that suffix (stored JSON comes back as JSON).
 *
 * Ownership: the store owns its connections; store_acquire lends one until
 * store_release. Row arrays returned to the caller are new references (json_decref). */
#ifndef SMELT_SERVER_STORE_H
#define SMELT_SERVER_STORE_H

#include <jansson.h>
#include <stdint.h>

#include "common/error.h"

struct store;
struct store_conn;

/* Opens (creating) the database file and brings its schema to the newest version. */
int store_open(const char *path, struct store **out, struct smelt_error *err);
void store_close(struct store *store);

/* A connection for this thread's use until released (waits if all are lent). */
struct store_conn *store_acquire(struct store *store, struct smelt_error *err);
void store_release(struct store *store, struct store_conn *conn);

/* Runs one statement; returns the number of rows changed (>= 0) or an error. */
int store_exec(struct store_conn *conn, struct smelt_error *err, const char *sql,
               const char *fmt, ...);
/* Runs one query; *rows is a new JSON array of row objects. */
int store_query(struct store_conn *conn, json_t **rows, struct smelt_error *err,
                const char *sql, const char *fmt, ...);
/* The first row (a new reference) or SMELT_ENOTFOUND when there is none. */
int store_query_one(struct store_conn *conn, json_t **row, struct smelt_error *err,
                    const char *sql, const char *fmt, ...);

/* BEGIN IMMEDIATE / COMMIT / ROLLBACK. */
int store_begin(struct store_conn *conn, struct smelt_error *err);
int store_commit(struct store_conn *conn, struct smelt_error *err);
void store_rollback(struct store_conn *conn);

int64_t store_last_insert_id(struct store_conn *conn);

/* Calls fn(arg) once the connection's open transaction commits, or at once outside one; a
 * rollback (or the connection's release with the transaction open) drops it. For waking
 * readers of rows written in the transaction: woken before the commit, they would find
 * nothing new. The same fn and arg registered twice run once. */
void store_after_commit(struct store_conn *conn, void (*fn)(void *), void *arg);

#endif
