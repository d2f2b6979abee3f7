/* server/agent: agent_run on a thread against a ROUTER in the test (inproc, shared
 * context) playing smeltd. Registration and heartbeats, re-registration after a silence,
 * workers (small /bin/sh scripts) that write metrics lines, print, exit, are stopped with
 * SIGTERM or killed after their grace, launches refused field by field, garbage answered
 * with agent.error, and a stop of the agent itself that leaves no process behind. */
#include "tests/unit/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/common.h"
#include "common/msg.h"
#include "server/agent.h"

#define AGENT_ID "test-agent"
#define ENDPOINT "inproc://smeltd"

/* The agent under test and the ROUTER standing in for smeltd. */
static struct {
    void *ctx, *router;
    pthread_t thread;
    bool running;
    atomic_int stop;  /* set by the test's thread, read by the agent's */
    struct agent_config config;
    struct smelt_error err;
    int rc;
    int heartbeat_ms;  /* what the test answers agent.register with */
} h;

static void *agent_thread(void *arg) {
    (void)arg;
    h.rc = agent_run(&h.config, &h.err);
    return NULL;
}

static void start_agent(void) {
    h.ctx = zmq_ctx_new();
    cr_assert(h.ctx);
    h.router = zmq_socket(h.ctx, ZMQ_ROUTER);
    cr_assert(h.router);
    int linger = 0;
    cr_assert_eq(zmq_setsockopt(h.router, ZMQ_LINGER, &linger, sizeof linger), 0);
    cr_assert_eq(zmq_bind(h.router, ENDPOINT), 0, "bind: %s", zmq_strerror(zmq_errno()));
    atomic_store(&h.stop, 0);
    h.config = (struct agent_config){.server_endpoint = ENDPOINT, .zmq_context = h.ctx,
                                     .agent_id = AGENT_ID, .cpu_slots = 2, .force_cpu = true,
                                     .heartbeat_ms = 1000, .stop = &h.stop};
    cr_assert_eq(pthread_create(&h.thread, NULL, agent_thread, NULL), 0);
    h.running = true;
}

/* Sets *stop and waits for agent_run; returns how long that took. */
static int64_t stop_agent(void) {
    int64_t t0 = mono_ms();
    atomic_store(&h.stop, 1);
    pthread_join(h.thread, NULL);
    h.running = false;
    cr_expect_eq(h.rc, 0, "agent_run: %s", h.err.message);
    return mono_ms() - t0;
}

static void setup(void) {
    memset(&h, 0, sizeof h);
    h.heartbeat_ms = 1000;
    test_tmp_setup();
}

static void teardown(void) {
    if (h.running) stop_agent();
    if (h.router) zmq_close(h.router);
    if (h.ctx) zmq_ctx_term(h.ctx);
    test_tmp_teardown();
}

static void send_order(const char *type, json_t *header) {
    struct smelt_error err;
    cr_assert(header, "json_pack failed for %s", type);
    TEST_OK(msg_send(h.router, AGENT_ID, strlen(AGENT_ID), type, header, NULL, 0, &err), &err);
    json_decref(header);
}

/* Raw frames after the routing id, for messages msg_send would not build. */
static void send_frames(const char *const *frames, int n) {
    cr_assert_eq(zmq_send(h.router, AGENT_ID, strlen(AGENT_ID), ZMQ_SNDMORE), (int)strlen(AGENT_ID));
    for (int i = 0; i < n; i++)
        cr_assert(zmq_send(h.router, frames[i], strlen(frames[i]), i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* Receives until a message of `type` arrives, answering agent.register and skipping
 * heartbeats on the way; any other message fails the test. The caller msg_free()s. */
static void expect_msg(const char *type, int timeout_ms, struct msg *out) {
    int64_t deadline = mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - mono_ms();
        cr_assert(left > 0, "no %s within %d ms", type, timeout_ms);
        struct smelt_error err = {0};
        int rc = msg_recv(h.router, true, (int)left, out, &err);
        if (rc == SMELT_ENOTFOUND) continue;
        cr_assert_eq(rc, 0, "msg_recv: %s", err.message);
        cr_assert_eq(out->route_len, strlen(AGENT_ID));
        cr_assert_eq(memcmp(out->route, AGENT_ID, out->route_len), 0);
        if (strcmp(out->type, type) == 0) return;
        bool is_register = strcmp(out->type, MSG_AGENT_REGISTER) == 0;
        char *dump = json_dumps(out->header, JSON_COMPACT);
        cr_assert(is_register || strcmp(out->type, MSG_AGENT_HEARTBEAT) == 0,
                  "expected %s, got %s %s", type, out->type, dump ? dump : "");
        free(dump);
        msg_free(out);
        if (is_register)
            send_order(MSG_AGENT_REGISTERED, json_pack("{s:i}", "heartbeat_ms", h.heartbeat_ms));
    }
}

static void start_registered(void) {
    start_agent();
    struct msg m;
    expect_msg(MSG_AGENT_REGISTER, 10000, &m);
    msg_free(&m);
    send_order(MSG_AGENT_REGISTERED, json_pack("{s:i}", "heartbeat_ms", h.heartbeat_ms));
}

static int64_t field_int(const struct msg *m, const char *key) {
    json_t *v = json_object_get(m->header, key);
    cr_assert(json_is_integer(v), "%s: %s is not an integer", m->type, key);
    return json_integer_value(v);
}

static const char *field_str(const struct msg *m, const char *key) {
    json_t *v = json_object_get(m->header, key);
    cr_assert(json_is_string(v), "%s: %s is not a string", m->type, key);
    return json_string_value(v);
}

static const char *tmp_file(const char *name, const char *content, mode_t mode) {
    static char paths[8][256];
    static int next;
    char *path = paths[next++ % 8];
    test_tmp_path(path, 256, name);
    FILE *f = fopen(path, "w");
    cr_assert(f, "fopen %s", path);
    fputs(content, f);
    fclose(f);
    cr_assert_eq(chmod(path, mode), 0);
    return path;
}

static char *read_text(const char *path) {
    char *text = NULL;
    size_t len;
    struct smelt_error err;
    TEST_OK(file_read_all(path, &text, &len, &err), &err);
    return text;
}

/* A worker.launch of `/bin/sh script` in the temp dir with env {M: metrics path, D: the
 * temp dir} plus extra_env, on CPU slot 0. */
static json_t *launch_order(const char *job_id, const char *script, json_t *extra_env) {
    char log[256], metrics[256];
    test_tmp_path(log, sizeof log, "log.txt");
    test_tmp_path(metrics, sizeof metrics, "metrics.jsonl");
    json_t *env = json_pack("{s:s, s:s}", "M", metrics, "D", test_tmp_dir);
    cr_assert(env);
    if (extra_env) json_object_update(env, extra_env);
    json_decref(extra_env);
    json_t *l = json_pack("{s:s, s:i, s:[s,s], s:o, s:s, s:s, s:s, s:[i]}", "job_id", job_id,
                          "attempt", 1, "argv", "/bin/sh", script, "env", env, "workdir",
                          test_tmp_dir, "log_path", log, "metrics_path", metrics, "devices", 0);
    cr_assert(l);
    return l;
}

static pid_t expect_started(const char *job_id) {
    struct msg m;
    expect_msg(MSG_WORKER_STARTED, 10000, &m);
    cr_expect_str_eq(field_str(&m, "agent_id"), AGENT_ID);
    cr_expect_str_eq(field_str(&m, "job_id"), job_id);
    cr_expect_eq(field_int(&m, "attempt"), 1);
    pid_t pid = (pid_t)field_int(&m, "pid");
    cr_expect_gt(pid, 0);
    msg_free(&m);
    return pid;
}

/* Expects a worker.event at offset carrying key == value; returns nothing else. */
static void expect_event(const char *job_id, int64_t offset, const char *key, int64_t value) {
    struct msg m;
    expect_msg(MSG_WORKER_EVENT, 10000, &m);
    cr_expect_str_eq(field_str(&m, "agent_id"), AGENT_ID);
    cr_expect_str_eq(field_str(&m, "job_id"), job_id);
    cr_expect_eq(field_int(&m, "attempt"), 1);
    cr_expect_eq(field_int(&m, "offset"), offset, "event for %s=%lld: offset %lld, expected %lld",
                 key, (long long)value, (long long)field_int(&m, "offset"), (long long)offset);
    json_t *line = json_object_get(m.header, "line");
    cr_assert(json_is_object(line), "line is not an object");
    cr_expect_eq(json_integer_value(json_object_get(line, key)), value, "line.%s", key);
    msg_free(&m);
}

/* Expects worker.exited with this exit code and signal; returns after checking no
 * error was attached. */
static void expect_exited(const char *job_id, int exit_code, int sig, int timeout_ms) {
    struct msg m;
    expect_msg(MSG_WORKER_EXITED, timeout_ms, &m);
    cr_expect_str_eq(field_str(&m, "job_id"), job_id);
    cr_expect_eq(field_int(&m, "exit_code"), exit_code);
    cr_expect_eq(field_int(&m, "signal"), sig);
    cr_expect_null(json_object_get(m.header, "error"));
    msg_free(&m);
}

/* Gone or a zombie of someone else's (a reparented grandchild init has not reaped). */
static bool process_gone(pid_t pid) {
    if (kill(pid, 0) == -1 && errno == ESRCH) return true;
    char path[64], state = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    int n = fscanf(f, "%*d (%*[^)]) %c", &state);
    fclose(f);
    return n == 1 && state == 'Z';
}

/* ---- registration ---- */

Test(agent, registers_with_devices_then_heartbeats, .init = setup, .fini = teardown, .timeout = 10) {
    start_agent();
    struct msg m;
    expect_msg(MSG_AGENT_REGISTER, 10000, &m);
    cr_expect_eq(field_int(&m, "v"), MSG_VERSION);
    cr_expect_str_eq(field_str(&m, "agent_id"), AGENT_ID);
    cr_expect_gt(strlen(field_str(&m, "hostname")), 0);
    json_t *devices = json_object_get(m.header, "devices");
    cr_assert_eq(json_array_size(devices), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(devices, i);
        char name[16];
        snprintf(name, sizeof name, "cpu%zu", i);
        cr_expect_eq(json_integer_value(json_object_get(d, "index")), (json_int_t)i);
        cr_expect_str_eq(json_string_value(json_object_get(d, "kind")), "cpu");
        cr_expect_str_eq(json_string_value(json_object_get(d, "name")), name);
        cr_expect_gt(json_integer_value(json_object_get(d, "memory_bytes")), 0);
    }
    cr_expect_eq(json_array_size(json_object_get(m.header, "running")), 0);
    cr_expect(json_is_array(json_object_get(m.header, "running")));
    msg_free(&m);

    /* Nothing but registers until acknowledged; then heartbeats at smeltd's interval. */
    send_order(MSG_AGENT_REGISTERED, json_pack("{s:i}", "heartbeat_ms", 50));
    int64_t t0 = mono_ms();
    for (int i = 0; i < 3; i++) {
        expect_msg(MSG_AGENT_HEARTBEAT, 1000, &m);
        cr_expect_str_eq(field_str(&m, "agent_id"), AGENT_ID);
        cr_expect(json_is_array(json_object_get(m.header, "running")));
        msg_free(&m);
    }
    int64_t took = mono_ms() - t0;
    cr_expect(took >= 100 && took < 1000, "3 heartbeats at 50 ms took %lld ms", (long long)took);
}

Test(agent, registers_again_after_a_silence, .init = setup, .fini = teardown, .timeout = 10) {
    start_agent();
    struct msg m;
    expect_msg(MSG_AGENT_REGISTER, 10000, &m);
    msg_free(&m);
    send_order(MSG_AGENT_REGISTERED, json_pack("{s:i}", "heartbeat_ms", 50));
    /* smeltd "restarts": it says nothing more. After ~5 heartbeats the agent registers again. */
    int64_t t0 = mono_ms();
    int heartbeats = 0;
    for (;;) {
        struct smelt_error err;
        cr_assert(mono_ms() - t0 < 2000, "no second agent.register within 2 s");
        if (msg_recv(h.router, true, 100, &m, &err) != 0) continue;
        bool again = strcmp(m.type, MSG_AGENT_REGISTER) == 0;
        heartbeats += strcmp(m.type, MSG_AGENT_HEARTBEAT) == 0;
        msg_free(&m);
        if (again) break;
    }
    int64_t took = mono_ms() - t0;
    cr_expect(heartbeats >= 3, "only %d heartbeats before re-registering", heartbeats);
    cr_expect(took >= 200, "re-registered after %lld ms", (long long)took);
}

Test(agent, discovers_cpu_slots) {
    struct agent_device d[AGENT_MAX_DEVICES];
    int n = 0;
    struct smelt_error err;
    struct agent_config c = {.cpu_slots = 3, .force_cpu = true};
    TEST_OK(agent_discover_devices(&c, d, AGENT_MAX_DEVICES, &n, &err), &err);
    cr_assert_eq(n, 3);
    int64_t phys = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "cpu%d", i);
        cr_expect_eq(d[i].index, i);
        cr_expect_str_eq(d[i].kind, "cpu");
        cr_expect_str_eq(d[i].name, name);
        cr_expect_eq(d[i].memory_bytes, phys / 3);
    }
    c.cpu_slots = 0;
    TEST_OK(agent_discover_devices(&c, d, AGENT_MAX_DEVICES, &n, &err), &err);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cr_expect_eq(n, cores / 8 > 1 ? cores / 8 : 1);
    c.cpu_slots = -1;
    TEST_EXPECT_ERROR(agent_discover_devices(&c, d, AGENT_MAX_DEVICES, &n, &err), SMELT_EINVAL, &err);
    c.cpu_slots = AGENT_MAX_DEVICES + 1;
    TEST_EXPECT_ERROR(agent_discover_devices(&c, d, AGENT_MAX_DEVICES, &n, &err), SMELT_EINVAL, &err);
    c.cpu_slots = 4;
    TEST_EXPECT_ERROR(agent_discover_devices(&c, d, 2, &n, &err), SMELT_EINVAL, &err);
}

Test(agent, refuses_a_bad_config) {
    atomic_int stop = 1;
    struct smelt_error err;
    struct agent_config c = {.server_endpoint = NULL, .cpu_slots = 1, .stop = &stop};
    TEST_EXPECT_ERROR(agent_run(&c, &err), SMELT_EINVAL, &err);
    c.server_endpoint = "tcp://127.0.0.1:1";
    c.heartbeat_ms = 5;
    TEST_EXPECT_ERROR(agent_run(&c, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "heartbeat_ms"), "%s", err.message);
    c.heartbeat_ms = 0;
    c.agent_id = "has space";
    TEST_EXPECT_ERROR(agent_run(&c, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "agent_id"), "%s", err.message);
    c.agent_id = "ok";
    c.server_endpoint = "nope://x";
    TEST_EXPECT_ERROR(agent_run(&c, &err), SMELT_EINVAL, &err);
    cr_expect(strstr(err.message, "nope://x"), "%s", err.message);
}

/* ---- workers ---- */

Test(agent, worker_metrics_log_and_exit_code, .init = setup, .fini = teardown, .timeout = 10) {
    const char *script = tmp_file("w.sh",
                                  "echo hello from the worker\n"
                                  "printf '{\"step\":1,\"loss\":2.5}\\n' >> \"$M\"\n"
                                  "printf 'not json\\n' >> \"$M\"\n"
                                  "printf '{\"step\":' >> \"$M\"\n"
                                  "sleep 0.2\n"
                                  "printf '2}\\n' >> \"$M\"\n"
                                  "echo to stderr >&2\n"
                                  "exit 3\n",
                                  0644);
    start_registered();
    send_order(MSG_WORKER_LAUNCH, launch_order("job-1", script, NULL));
    expect_started("job-1");
    expect_event("job-1", 0, "step", 1);
    expect_event("job-1", (int64_t)(strlen("{\"step\":1,\"loss\":2.5}\n") + strlen("not json\n")),
                 "step", 2);
    expect_exited("job-1", 3, 0, 2000);
    char path[256];
    char *log = read_text(test_tmp_path(path, sizeof path, "log.txt"));
    cr_expect(strstr(log, "hello from the worker\n"), "log: %s", log);
    cr_expect(strstr(log, "to stderr\n"), "log: %s", log);
    free(log);
}

Test(agent, metrics_file_replaced_and_unterminated_last_line, .init = setup, .fini = teardown,
     .timeout = 10) {
    const char *script = tmp_file("w.sh",
                                  "printf '{\"a\":1}\\n{\"a\":2}\\n' > \"$M\"\n"
                                  "sleep 0.4\n"
                                  "rm \"$M\"\n"
                                  "printf '{\"b\":1}\\n' > \"$M\"\n"
                                  "printf '{\"b\":2}' >> \"$M\"\n",
                                  0644);
    start_registered();
    send_order(MSG_WORKER_LAUNCH, launch_order("job-2", script, NULL));
    expect_started("job-2");
    expect_event("job-2", 0, "a", 1);
    expect_event("job-2", 8, "a", 2);
    expect_event("job-2", 0, "b", 1);
    expect_event("job-2", 8, "b", 2);  /* relayed at exit although it has no newline */
    expect_exited("job-2", 0, 0, 2000);
}

Test(agent, env_devices_workdir_and_fds_reach_the_worker, .init = setup, .fini = teardown,
     .timeout = 10) {
    /* Set before the agent starts: inherited, except the device variables it owns. */
    setenv("AGENT_SIDE", "inherited", 1);
    setenv("CUDA_VISIBLE_DEVICES", "0,1", 1);
    setenv("SMELT_CPU_SLOT", "7", 1);
    int leak = open("/dev/null", O_RDONLY); /* no O_CLOEXEC: the agent must close it */
    cr_assert(leak >= 3);
    char wd[256], out[256];
    test_tmp_path(wd, sizeof wd, "wd");
    cr_assert_eq(mkdir(wd, 0755), 0);
    const char *script = tmp_file("w.sh",
                                  "read line; echo \"stdin=$?\"\n"
                                  "echo \"A=$A\"\n"
                                  "echo \"SIDE=$AGENT_SIDE\"\n"
                                  "echo \"CVD=[$CUDA_VISIBLE_DEVICES] set=${CUDA_VISIBLE_DEVICES+yes}\"\n"
                                  "echo \"SLOT=$SMELT_CPU_SLOT\"\n"
                                  "echo \"PWD=$(pwd)\"\n"
                                  "if [ -e /proc/$$/fd/$LEAK ]; then echo fd=open; else echo fd=closed; fi\n",
                                  0644);
    start_registered();
    char leak_text[16];
    snprintf(leak_text, sizeof leak_text, "%d", leak);
    json_t *order = launch_order("job-3", script,
                                 json_pack("{s:s, s:s, s:s}", "A", "x y", "SMELT_CPU_SLOT", "5",
                                           "LEAK", leak_text));
    json_object_set_new(order, "workdir", json_string(wd));
    json_object_set_new(order, "devices", json_pack("[i]", 1));
    send_order(MSG_WORKER_LAUNCH, order);
    expect_started("job-3");
    expect_exited("job-3", 0, 0, 2000);
    close(leak);
    char *log = read_text(test_tmp_path(out, sizeof out, "log.txt"));
    char want_pwd[300];
    snprintf(want_pwd, sizeof want_pwd, "PWD=%s\n", wd);
    const char *want[] = {"stdin=1\n", "A=x y\n", "SIDE=inherited\n", "CVD=[] set=yes\n",
                          "SLOT=1\n", want_pwd, "fd=closed\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(log, want[i]), "'%s' missing from the log:\n%s", want[i], log);
    free(log);
    unsetenv("AGENT_SIDE");
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("SMELT_CPU_SLOT");
}

Test(agent, exec_failure_is_logged_and_exits_127, .init = setup, .fini = teardown, .timeout = 10) {
    const char *prog = tmp_file("not-a-program", "\x7f" "garbage\n", 0755);
    start_registered();
    json_t *order = launch_order("job-4", "unused", NULL);
    json_object_set_new(order, "argv", json_pack("[s]", prog));
    send_order(MSG_WORKER_LAUNCH, order);
    expect_started("job-4");
    expect_exited("job-4", 127, 0, 2000);
    char path[256];
    char *log = read_text(test_tmp_path(path, sizeof path, "log.txt"));
    cr_expect(strstr(log, "execv") && strstr(log, "ENOEXEC"), "log: %s", log);
    free(log);
}

/* ---- stopping ---- */

Test(agent, stop_sends_sigterm_to_the_process_group, .init = setup, .fini = teardown, .timeout = 10) {
    const char *script = tmp_file("w.sh",
                                  "sleep 30 &\n"
                                  "echo $! > \"$D/sleep.pid\"\n"
                                  "printf '{\"up\":1}\\n' >> \"$M\"\n"
                                  "wait\n",
                                  0644);
    h.heartbeat_ms = 100;
    start_registered();
    send_order(MSG_WORKER_LAUNCH, launch_order("job-5", script, NULL));
    pid_t pid = expect_started("job-5");
    expect_event("job-5", 0, "up", 1);
    cr_expect_eq(getpgid(pid), pid, "the worker leads a process group of its own");

    struct msg m;
    expect_msg(MSG_AGENT_HEARTBEAT, 2000, &m);
    json_t *running = json_object_get(m.header, "running");
    cr_assert_eq(json_array_size(running), 1);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(running, 0), "job_id")), "job-5");
    cr_expect_eq(json_integer_value(json_object_get(json_array_get(running, 0), "attempt")), 1);
    msg_free(&m);

    int64_t t0 = mono_ms();
    send_order(MSG_WORKER_STOP, json_pack("{s:s, s:i, s:i, s:s}", "job_id", "job-5", "attempt", 1,
                                          "grace_ms", 5000, "reason", "cancelled"));
    expect_exited("job-5", -1, SIGTERM, 2000);
    cr_expect_lt(mono_ms() - t0, 1500, "SIGTERM should end it at once");
    cr_expect(kill(pid, 0) == -1 && errno == ESRCH, "worker %d still exists", (int)pid);
    char path[256];
    char *text = read_text(test_tmp_path(path, sizeof path, "sleep.pid"));
    pid_t sleeper = (pid_t)atoi(text);
    free(text);
    int64_t t1 = mono_ms();
    while (!process_gone(sleeper) && mono_ms() - t1 < 1000) usleep(10000);
    cr_expect(process_gone(sleeper), "the worker's child %d survived the stop", (int)sleeper);
}

Test(agent, stop_escalates_to_sigkill_after_the_grace, .init = setup, .fini = teardown, .timeout = 10) {
    const char *script = tmp_file("w.sh",
                                  "trap '' TERM\n"
                                  "printf '{\"up\":1}\\n' >> \"$M\"\n"
                                  "sleep 30\n",
                                  0644);
    start_registered();
    send_order(MSG_WORKER_LAUNCH, launch_order("job-6", script, NULL));
    pid_t pid = expect_started("job-6");
    expect_event("job-6", 0, "up", 1);
    int64_t t0 = mono_ms();
    send_order(MSG_WORKER_STOP, json_pack("{s:s, s:i, s:i, s:s}", "job_id", "job-6", "attempt", 1,
                                          "grace_ms", 300, "reason", "test"));
    expect_exited("job-6", -1, SIGKILL, 2000);
    int64_t took = mono_ms() - t0;
    cr_expect(took >= 300 && took < 1500, "SIGKILL came after %lld ms (grace 300)", (long long)took);
    cr_expect(kill(pid, 0) == -1 && errno == ESRCH);
}

Test(agent, stop_flag_returns_promptly_and_leaves_no_child, .init = setup, .fini = teardown,
     .timeout = 10) {
    const char *script = tmp_file("w.sh", "printf '{\"up\":1}\\n' >> \"$M\"\nsleep 30\n", 0644);
    start_registered();
    send_order(MSG_WORKER_LAUNCH, launch_order("job-7", script, NULL));
    pid_t pid = expect_started("job-7");
    expect_event("job-7", 0, "up", 1);
    int64_t took = stop_agent();
    cr_expect_lt(took, 2000, "agent_run took %lld ms to return", (long long)took);
    cr_expect(kill(pid, 0) == -1 && errno == ESRCH, "worker %d outlived the agent", (int)pid);
}

/* ---- refusals ---- */

/* Sends order and expects worker.exited {exit_code -1, error "field: ..."} for job-x. */
static void expect_launch_refused(json_t *order, const char *field) {
    send_order(MSG_WORKER_LAUNCH, order);
    struct msg m;
    expect_msg(MSG_WORKER_EXITED, 2000, &m);
    cr_expect_str_eq(field_str(&m, "job_id"), "job-x");
    cr_expect_eq(field_int(&m, "exit_code"), -1);
    cr_expect_eq(field_int(&m, "signal"), 0);
    const char *error = field_str(&m, "error");
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s: ", field);
    cr_expect_eq(strncmp(error, prefix, strlen(prefix)), 0, "error '%s' should name %s", error, field);
    msg_free(&m);
}

static void expect_agent_error(const char *field) {
    struct msg m;
    expect_msg(MSG_AGENT_ERROR, 2000, &m);
    json_t *e = json_object_get(m.header, "error");
    cr_assert(json_is_object(e));
    const char *got = json_string_value(json_object_get(e, "field"));
    cr_expect(got && strcmp(got, field) == 0, "agent.error names '%s', expected '%s' (%s)",
              got ? got : "(none)", field, json_string_value(json_object_get(e, "message")));
    cr_expect_gt(strlen(json_string_value(json_object_get(e, "message"))), 0);
    msg_free(&m);
}

Test(agent, bad_launches_are_refused_naming_the_field, .init = setup, .fini = teardown,
     .timeout = 10) {
    const char *script = tmp_file("w.sh", "exit 0\n", 0644);
    const char *plain = tmp_file("plain", "not executable\n", 0644);
    start_registered();
    json_t *good = launch_order("job-x", script, NULL);
    struct {
        const char *key, *field;
        json_t *value; /* NULL: remove the key */
    } cases[] = {
        {"argv", "argv[0]", json_pack("[s,s]", "sh", script)},
        {"argv", "argv[0]", json_pack("[s]", plain)},
        {"argv", "argv[0]", json_pack("[s]", "/no/such/program")},
        {"argv", "argv", json_array()},
        {"argv", "argv[1]", json_pack("[s,i]", "/bin/sh", 3)},
        {"argv", "argv", NULL},
        {"workdir", "workdir", json_string("/no/such/dir")},
        {"workdir", "workdir", json_string("relative/dir")},
        {"env", "env", json_pack("{s:s}", "1BAD", "x")},
        {"env", "env", json_pack("{s:s}", "BAD-NAME", "x")},
        {"env", "env", json_pack("{s:i}", "OK", 5)},
        {"env", "env", json_pack("[s]", "A=1")},
        {"log_path", "log_path", json_string("log.txt")},
        {"log_path", "log_path", json_string("/no/such/dir/log.txt")},
        {"metrics_path", "metrics_path", json_string("metrics.jsonl")},
        {"devices", "devices", json_pack("[i]", 7)},
        {"devices", "devices", json_pack("[i,i]", 0, 0)},
        {"devices", "devices", json_pack("[s]", "0")},
        {"devices", "devices", json_string("0")},
        {"extra", "extra", json_true()},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *order = json_deep_copy(good);
        if (cases[i].value) json_object_set_new(order, cases[i].key, cases[i].value);
        else json_object_del(order, cases[i].key);
        expect_launch_refused(order, cases[i].field);
    }
    /* Without a valid job_id or attempt there is no worker to report on: agent.error. */
    json_t *order = json_deep_copy(good);
    json_object_set_new(order, "job_id", json_string("bad id"));
    send_order(MSG_WORKER_LAUNCH, order);
    expect_agent_error("job_id");
    order = json_deep_copy(good);
    json_object_set_new(order, "attempt", json_integer(-1));
    send_order(MSG_WORKER_LAUNCH, order);
    expect_agent_error("attempt");

    /* Nothing was started; the good launch still works. */
    send_order(MSG_WORKER_LAUNCH, good);
    expect_started("job-x");
    expect_exited("job-x", 0, 0, 2000);
}

Test(agent, garbage_gets_agent_error_and_the_agent_keeps_serving, .init = setup, .fini = teardown,
     .timeout = 10) {
    start_registered();
    send_frames((const char *[]){MSG_WORKER_LAUNCH, "{not json"}, 2);
    expect_agent_error("header");
    send_frames((const char *[]){MSG_WORKER_LAUNCH}, 1);
    expect_agent_error("header");
    send_frames((const char *[]){"bad\x01type", "{}"}, 2);
    expect_agent_error("type");
    send_frames((const char *[]){MSG_WORKER_STOP, "[1,2]"}, 2);
    expect_agent_error("header");
    send_frames((const char *[]){MSG_WORKER_STOP, "{}"}, 2);
    expect_agent_error("v");
    send_frames((const char *[]){MSG_WORKER_STOP, "{\"v\":2}"}, 2);
    expect_agent_error("v");
    send_order("no.such.message", json_object());
    expect_agent_error("type");
    send_order(MSG_WORKER_STOP, json_pack("{s:s, s:i, s:i, s:s}", "job_id", "job-9", "attempt", 1,
                                          "grace_ms", 10, "reason", "x"));
    expect_agent_error("job_id");
    send_order(MSG_WORKER_STOP, json_pack("{s:s, s:i, s:s}", "job_id", "job-9", "attempt", 1,
                                          "reason", "x"));
    expect_agent_error("grace_ms");
    send_order(MSG_WORKER_STOP, json_pack("{s:s, s:i, s:i, s:s, s:b}", "job_id", "job-9", "attempt",
                                          1, "grace_ms", 10, "reason", "x", "force", 1));
    expect_agent_error("force");

    json_t *order = launch_order("job-9", "unused", NULL);
    json_object_set_new(order, "argv", json_pack("[s]", "/bin/true"));
    send_order(MSG_WORKER_LAUNCH, order);
    expect_started("job-9");
    expect_exited("job-9", 0, 0, 2000);
}

/* The agent in a process of its own (over ipc) is SIGKILLed: PR_SET_PDEATHSIG gives its
 * worker SIGTERM, so no worker outlives a dead agent. The fork comes before this process
 * has a ZeroMQ context: a child forked from a process with threads may only exec, not
 * start threads of its own as agent_run does (ZeroMQ connects before the bind is there). */
Test(agent, worker_gets_sigterm_when_the_agent_dies, .init = setup, .fini = teardown,
     .timeout = 10) {
    const char *script = tmp_file("w.sh", "printf '{\"up\":1}\\n' >> \"$M\"\nexec sleep 30\n", 0644);
    char endpoint[128];
    cr_assert_lt(snprintf(endpoint, sizeof endpoint, "ipc://%s/smeltd.sock", test_tmp_dir), (int)sizeof endpoint);

    pid_t agent = fork();
    cr_assert(agent >= 0);
    if (agent == 0) {
        atomic_int stop = 0;
        struct agent_config c = {.server_endpoint = endpoint, .agent_id = AGENT_ID,
                                 .cpu_slots = 1, .force_cpu = true, .stop = &stop};
        struct smelt_error err;
        _exit(agent_run(&c, &err) ? 1 : 0);
    }
    h.ctx = zmq_ctx_new();
    h.router = zmq_socket(h.ctx, ZMQ_ROUTER);
    cr_assert(h.router);
    int linger = 0;
    cr_assert_eq(zmq_setsockopt(h.router, ZMQ_LINGER, &linger, sizeof linger), 0);
    cr_assert_eq(zmq_bind(h.router, endpoint), 0, "bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    struct msg m;
    expect_msg(MSG_AGENT_REGISTER, 10000, &m);
    msg_free(&m);
    send_order(MSG_AGENT_REGISTERED, json_pack("{s:i}", "heartbeat_ms", 1000));
    send_order(MSG_WORKER_LAUNCH, launch_order("job-8", script, NULL));
    pid_t pid = expect_started("job-8");
    expect_event("job-8", 0, "up", 1);

    cr_assert_eq(kill(agent, SIGKILL), 0);
    int status;
    cr_assert_eq(waitpid(agent, &status, 0), agent);
    int64_t t0 = mono_ms();
    while (!process_gone(pid) && mono_ms() - t0 < 2000) usleep(10000);
    cr_expect(process_gone(pid), "worker %d outlived its agent", (int)pid);
    if (!process_gone(pid)) kill(pid, SIGKILL);
}
