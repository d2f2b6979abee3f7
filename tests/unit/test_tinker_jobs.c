/* server/tinker_jobs.c: session jobs against a real store. One job per (project, base
 * model) while it takes work; the worker's argv; an idle job released (and not one with
 * a pending future or a session heard from); the worker's end (succeeded after a release,
 * failed otherwise, futures failed, models lost); a restart ending the last run's
 * session jobs; metrics lines recorded once by offset; the jobs API refusing to create
 * one and listing one. */
#include "tests/unit/tinker_testutil.h"

#include "server/tinker_api.h"

#define JOB "ftjob-tinker1"
#define OLD 1000 /* seconds ago: past the idle window below */

TestSuite(tinker_jobs, .init = tinker_setup, .fini = tinker_teardown);

static void session_job(const char *project, const char *base_dir, char *id) {
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    TEST_OK(tinker_session_job(&tinker_s, c, project, "tiny", base_dir, id, HTTP_ID_BYTES, &err), &err);
    store_release(tinker_s.store, c);
}

static void tick(void) {
    struct store_conn *c = tinker_conn();
    tinker_jobs_tick(&tinker_s, c);
    store_release(tinker_s.store, c);
}

static const char *column(const char *table, const char *id, const char *col, char *out, size_t cap) {
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT %s AS v FROM %s WHERE id = ?", col, table);
    json_t *row = tinker_row(sql, id);
    json_t *v = json_object_get(row, "v");
    if (json_is_integer(v)) snprintf(out, cap, "%lld", (long long)json_integer_value(v));
    else snprintf(out, cap, "%s", json_string_value(v) ?: "");
    json_decref(row);
    return out;
}

Test(tinker_jobs, one_session_job_per_project_and_base_while_it_takes_work) {
    char a[HTTP_ID_BYTES], b[HTTP_ID_BYTES], other_base[HTTP_ID_BYTES], other_project[HTTP_ID_BYTES], v[256];
    session_job("default", "/models/tiny", a);
    session_job("default", "/models/tiny", b);
    cr_expect_str_eq(a, b, "the queued job serves the second request");
    session_job("default", "/models/other", other_base);
    session_job("team-b", "/models/tiny", other_project);
    cr_expect_str_neq(a, other_base);
    cr_expect_str_neq(a, other_project);
    cr_expect_str_eq(column("jobs", a, "status", v, sizeof v), "queued");
    cr_expect_str_eq(column("jobs", a, "method", v, sizeof v), "{\"type\":\"tinker\"}");
    cr_expect_str_eq(column("jobs", a, "model", v, sizeof v), "tiny");
    cr_expect_str_eq(column("jobs", a, "training_file", v, sizeof v), "");
    cr_expect_str_eq(column("jobs", a, "json_extract(spec, '$.model')", v, sizeof v), "/models/tiny");
    cr_expect_str_eq(column("jobs", a, "json_extract(spec, '$.type')", v, sizeof v), "tinker");
    cr_expect_str_eq(column("jobs", a, "max_retries", v, sizeof v), "0");
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_exec(c, &err, "UPDATE jobs SET status = 'running', desired = 'release' WHERE id = ?", "s", a) == 1);
    store_release(tinker_s.store, c);
    session_job("default", "/models/tiny", b);
    cr_expect_str_neq(a, b, "a job being released takes no new work");
}

Test(tinker_jobs, the_worker_argv) {
    snprintf(tinker_s.tinker_endpoint, sizeof tinker_s.tinker_endpoint, "tcp://127.0.0.1:5555");
    tinker_insert_job(JOB, "default", "queued", 0, 0);
    json_t *row = tinker_row("SELECT * FROM jobs WHERE id = ?", JOB);
    cr_assert(tinker_job_is_session(row));
    json_t *argv = tinker_worker_argv(&tinker_s, row, 1, "cuda", "/var/jobs/x/metrics.jsonl");
    json_t *want = json_pack("[s, s, s, s, s, s, s, s, s, s, s, s, s]", "/opt/smelt/smelt-tinker", "--model",
                             "/models/tiny", "--server", "tcp://127.0.0.1:5555", "--job", JOB, "--attempt", "1",
                             "--metrics", "/var/jobs/x/metrics.jsonl", "--backend", "cuda");
    char *got = json_dumps(argv, JSON_COMPACT);
    cr_expect(json_equal(argv, want), "argv: %s", got);
    free(got);
    json_decref(argv);
    argv = tinker_worker_argv(&tinker_s, row, 1, "cpu", "m");
    cr_expect_str_eq(json_string_value(json_array_get(argv, 12)), "cpu");
    json_decref(argv);
    json_decref(want);
    json_decref(row);
}

Test(tinker_jobs, an_idle_job_is_released_and_a_busy_one_is_not) {
    tinker_s.config.tinker_idle_seconds = 60;
    int64_t now = server_now();
    tinker_insert_job("ftjob-idle", "default", "running", 1, now - OLD);
    tinker_insert_model("m-idle", "sess-idle", "ftjob-idle", now - OLD);
    tinker_insert_job("ftjob-pending", "default", "running", 1, now - OLD);
    tinker_insert_model("m-pending", "sess-idle", "ftjob-pending", now - OLD);
    tinker_insert_future("fut-p", "ftjob-pending", "pending", now - OLD);
    tinker_insert_job("ftjob-heard", "default", "running", 1, now - OLD);
    tinker_insert_model("m-heard", "sess-heard", "ftjob-heard", now);
    tinker_insert_job("ftjob-new", "default", "running", 1, now);
    tick();
    char v[64];
    cr_expect_str_eq(column("jobs", "ftjob-idle", "desired", v, sizeof v), "release");
    cr_expect_str_eq(column("jobs", "ftjob-idle", "status", v, sizeof v), "running", "it ends when its worker does");
    cr_expect_str_eq(column("tinker_models", "m-idle", "status", v, sizeof v), "released");
    cr_expect(tinker_event_says("ftjob-idle", "Releasing the session job"));
    const char *busy[] = {"ftjob-pending", "ftjob-heard", "ftjob-new"};
    for (int i = 0; i < 3; i++)
        cr_expect_str_eq(column("jobs", busy[i], "desired", v, sizeof v), "run", "%s was released", busy[i]);
    cr_expect_str_eq(column("tinker_models", "m-heard", "status", v, sizeof v), "live");
}

static void worker_gone(const char *id, int exit_code, const char *how) {
    json_t *row = tinker_row("SELECT * FROM jobs WHERE id = ?", id);
    struct store_conn *c = tinker_conn();
    tinker_job_worker_gone(&tinker_s, c, row, exit_code, how);
    store_release(tinker_s.store, c);
    json_decref(row);
}

Test(tinker_jobs, a_released_worker_exiting_0_ends_the_job_succeeded) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_exec(c, &err, "UPDATE jobs SET desired = 'release' WHERE id = ?", "s", JOB) == 1);
    store_release(tinker_s.store, c);
    worker_gone(JOB, 0, "exited with code 0");
    char v[64];
    cr_expect_str_eq(column("jobs", JOB, "status", v, sizeof v), "succeeded");
    cr_expect_str_eq(column("jobs", JOB, "fine_tuned_model", v, sizeof v), "", "a session job makes no model");
    cr_expect(tinker_event_says(JOB, "Session released"));
}

Test(tinker_jobs, a_worker_that_dies_fails_the_job_its_futures_and_its_models) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    tinker_insert_model("m1", "sess", JOB, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    tinker_insert_future("fut-done", JOB, "done", 0);
    worker_gone(JOB, -1, "was stopped by signal 9: last log line");
    char v[512];
    cr_expect_str_eq(column("jobs", JOB, "status", v, sizeof v), "failed");
    cr_expect(strstr(column("jobs", JOB, "error", v, sizeof v), "was stopped by signal 9: last log line"), "%s", v);
    cr_expect_str_eq(column("tinker_futures", "fut-1", "status", v, sizeof v), "failed");
    cr_expect(strstr(column("tinker_futures", "fut-1", "error", v, sizeof v), "signal 9"), "%s", v);
    cr_expect_str_eq(column("tinker_futures", "fut-done", "status", v, sizeof v), "done");
    cr_expect_str_eq(column("tinker_models", "m1", "status", v, sizeof v), "lost");
    cr_expect_str_eq(column("jobs", JOB, "attempt", v, sizeof v), "1", "never retried");
}

Test(tinker_jobs, a_restart_ends_the_last_runs_session_jobs) {
    tinker_insert_job("ftjob-run", "default", "running", 1, 0);
    tinker_insert_job("ftjob-q", "default", "queued", 0, 0);
    tinker_insert_model("m1", "sess", "ftjob-run", 0);
    tinker_insert_future("fut-1", "ftjob-q", "pending", 0);
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_exec(c, &err, "INSERT INTO jobs (id, project_id, created_at, status, request, spec, model, method, "
                         "training_file, seed) VALUES ('ftjob-sft', 'default', 0, 'running', '{}', '{}', 'tiny', "
                         "'{\"type\":\"supervised\"}', 'file-x', 0)", "") == 1);
    store_release(tinker_s.store, c);
    TEST_OK(tinker_jobs_recover(&tinker_s, &err), &err);
    char v[512];
    cr_expect_str_eq(column("jobs", "ftjob-run", "status", v, sizeof v), "failed");
    cr_expect(strstr(column("jobs", "ftjob-run", "error", v, sizeof v), "smeltd restarted"), "%s", v);
    cr_expect_str_eq(column("jobs", "ftjob-q", "status", v, sizeof v), "failed");
    cr_expect_str_eq(column("tinker_models", "m1", "status", v, sizeof v), "lost");
    cr_expect(strstr(column("tinker_futures", "fut-1", "error", v, sizeof v), "smeltd restarted"), "%s", v);
    cr_expect_str_eq(column("jobs", "ftjob-sft", "status", v, sizeof v), "running", "a trainer job is retried as before");
}

Test(tinker_jobs, pending_futures_of_a_job_cancelled_while_queued_fail) {
    tinker_insert_job(JOB, "default", "cancelled", 0, 0);
    tinker_insert_future("fut-1", JOB, "pending", 0);
    tick();
    char v[256];
    cr_expect_str_eq(column("tinker_futures", "fut-1", "status", v, sizeof v), "failed");
    cr_expect(strstr(column("tinker_futures", "fut-1", "error", v, sizeof v), "cancelled"), "%s", v);
}

static void metrics_line(const char *op, int64_t step, int64_t offset) {
    json_t *row = tinker_row("SELECT * FROM jobs WHERE id = ?", JOB);
    json_t *event = json_pack("{s:s, s:i, s:I, s:{s:s, s:s, s:s, s:I, s:{s:f}, s:i}}", "job_id", JOB, "attempt", 1,
                              "offset", (json_int_t)offset, "line", "type", "tinker", "op", op, "model_id", "m1",
                              "step", (json_int_t)step, "metrics", "loss:sum", 2.5, "ms", 12);
    struct store_conn *c = tinker_conn();
    tinker_job_metrics_line(&tinker_s, c, row, event);
    store_release(tinker_s.store, c);
    json_decref(event);
    json_decref(row);
}

Test(tinker_jobs, metrics_lines_are_recorded_once_and_optim_steps_are_events) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    metrics_line("forward_backward", 0, 0);
    metrics_line("forward_backward", 0, 100); /* the same step: another call, recorded */
    metrics_line("optim_step", 1, 200);
    metrics_line("optim_step", 1, 200);       /* the file read again */
    metrics_line("forward_backward", 0, 100);
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    json_t *rows = NULL;
    cr_assert(store_query(c, &rows, &err, "SELECT step, type, data AS data__json FROM metrics WHERE job_id = ? "
                          "ORDER BY id", "s", JOB) == 0);
    store_release(tinker_s.store, c);
    cr_assert_eq(json_array_size(rows), 3);
    json_t *last = json_array_get(rows, 2);
    cr_expect_eq(json_integer_value(json_object_get(last, "step")), 1);
    cr_expect_str_eq(json_string_value(json_object_get(last, "type")), "tinker");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(last, "data"), "op")), "optim_step");
    json_decref(rows);
    cr_expect(tinker_event_says(JOB, "Model m1: optimizer step 1"));
}

Test(tinker_jobs, the_jobs_api_refuses_to_create_one_and_lists_one) {
    struct http_response res = {0};
    json_t *request = json_pack("{s:s, s:s, s:{s:s}}", "model", "tiny", "training_file", "file-x", "method", "type",
                                "tinker");
    cr_expect_neq(jobs_validate(&tinker_s, "default", request, &res), 0);
    json_decref(request);
    cr_expect_eq(res.status, 400);
    json_t *body = json_loadb(res.body, res.body_len, 0, NULL);
    free(res.body);
    json_t *error = json_object_get(body, "error");
    cr_expect_str_eq(json_string_value(json_object_get(error, "param")), "method.type");
    cr_expect(strstr(json_string_value(json_object_get(error, "message")), "/api/v1/"));
    json_decref(body);
    tinker_insert_job(JOB, "default", "running", 1, 0);
    json_t *row = tinker_row("SELECT * FROM jobs WHERE id = ?", JOB);
    json_t *job = jobs_object(&tinker_s, row);
    cr_expect_str_eq(json_string_value(json_object_get(job, "object")), "fine_tuning.job");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(job, "method"), "type")), "tinker");
    cr_expect_str_eq(json_string_value(json_object_get(job, "status")), "running");
    cr_expect(json_is_null(json_object_get(job, "hyperparameters")));
    json_decref(job);
    json_decref(row);
}

Test(tinker_jobs, a_release_whose_stop_was_never_confirmed_ends_at_the_next_tick) {
    tinker_insert_job(JOB, "default", "running", 1, 0);
    struct store_conn *c = tinker_conn();
    struct smelt_error err = {0};
    cr_assert(store_exec(c, &err, "UPDATE jobs SET desired = 'release', devices = NULL WHERE id = ?", "s", JOB) == 1);
    store_release(tinker_s.store, c);
    tick();
    char v[64];
    cr_expect_str_eq(column("jobs", JOB, "status", v, sizeof v), "succeeded");
}

/* Opens order state for model_id (as create_model does). */
static void order_open(const char *model_id) {
    struct smelt_error err = {0};
    TEST_OK(tinker_order_open(tinker_api_order(&tinker_s), model_id, 1, &err), &err);
}

/* A session job's end frees its models' order state (a released model's too), not other jobs'. */
Test(tinker_jobs, a_jobs_end_frees_its_models_order_state) {
    struct smelt_error err = {0};
    TEST_OK(tinker_api_start(&tinker_s, &err), &err);
    tinker_insert_job(JOB, "default", "running", 1, 0);
    tinker_insert_job("ftjob-other", "default", "running", 1, 0);
    tinker_insert_model("m1", "sess", JOB, 0);
    tinker_insert_model("m2", "sess", JOB, 0);
    tinker_insert_model("m3", "sess2", "ftjob-other", 0);
    struct store_conn *c = tinker_conn();
    cr_assert(store_exec(c, &err, "UPDATE tinker_models SET status = 'released' WHERE id = 'm2'", "") == 1);
    store_release(tinker_s.store, c);
    order_open("m1"), order_open("m2"), order_open("m3");
    struct tinker_order *o = tinker_api_order(&tinker_s);
    cr_assert_eq(tinker_order_count(o), 3);
    worker_gone(JOB, -1, "was stopped by signal 9");
    cr_expect_eq(tinker_order_count(o), 1, "%zu models still ordered", tinker_order_count(o));
    TEST_OK(tinker_jobs_recover(&tinker_s, &err), &err); /* a restart ends ftjob-other the same way */
    cr_expect_eq(tinker_order_count(o), 0, "%zu models still ordered", tinker_order_count(o));
    tinker_api_stop(&tinker_s);
}
