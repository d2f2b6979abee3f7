/* TEMPORARY (helper S2's branch only): a minimal stand-in for helper S1's
 * server/tinker_futures.c, so the dispatcher and session jobs build and are tested before
 * S1's work is merged. The integrator deletes this file when S1's tinker_futures.c lands;
 * S1's versions convert results into the SDK's objects, these store the worker's result
 * object as it came. */
#include <string.h>

#include "common/common.h"
#include "server/tinker_internal.h"

int tinker_future_complete(struct server *s, struct store_conn *c, const struct msg *result, struct smelt_error *err) {
    (void)s;
    const char *id = json_string_value(json_object_get(result->header, "id"));
    bool ok = json_is_true(json_object_get(result->header, "ok"));
    if (!id) return error_set_field(err, SMELT_EINVAL, "id", "tinker.result: id is required");
    int rc = store_exec(c, err, "UPDATE tinker_futures SET status = ?, finished_at = ?, result = ?, error = ? "
                        "WHERE id = ? AND status = 'pending'", "sijjs", ok ? "done" : "failed", server_now(),
                        ok ? json_object_get(result->header, "result") : NULL,
                        ok ? NULL : json_object_get(result->header, "error"), id);
    if (rc < 0) return rc;
    if (rc == 0) return error_set(err, SMELT_ENOTFOUND, "no pending future %s", id);
    return 0;
}

int tinker_futures_fail_job(struct store_conn *c, const char *job_id, const char *message, struct smelt_error *err) {
    json_t *error = json_pack("{s:s, s:s}", "message", message, "category", "server");
    if (!error) return error_set(err, SMELT_ENOMEM, "out of memory");
    int rc = store_exec(c, err, "UPDATE tinker_futures SET status = 'failed', finished_at = ?, error = ? "
                        "WHERE job_id = ? AND status = 'pending'", "ijs", server_now(), error, job_id);
    json_decref(error);
    if (rc >= 0)
        rc = store_exec(c, err, "UPDATE tinker_models SET status = 'lost' WHERE job_id = ? AND status = 'live'", "s",
                        job_id);
    return rc < 0 ? rc : 0;
}
