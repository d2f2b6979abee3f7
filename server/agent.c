/* The node agent (agent.h): one loop on one thread. Each turn it reads smeltd's orders
 * from the DEALER (waiting at most LOOP_POLL_MS), then tends its workers (SIGKILL
 * deadlines, reaping, metrics lines) and keeps in touch (register until acknowledged,
 * heartbeats, re-register after a silence).
 *
 * Workers are reaped by polling waitid() on their own pids: the agent may run on a
 * thread of smeltd, so it installs no signal handler and never waits on "any child".
 * Everything a forked child needs is prepared before fork() (argv, environment, open
 * log and /dev/null descriptors): the child only calls async-signal-safe functions,
 * because other threads of smeltd may hold locks (malloc's among them) at fork time. */
#include "server/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/common.h"
#include "common/curve.h"
#include "common/msg.h"
#include "common/secret_fd.h"

#ifdef SMELT_CUDA
#include <cuda_runtime_api.h>
#endif

#define AGENT_MAX_WORKERS 256
#define JOB_ID_MAX_BYTES 128
#define LOOP_POLL_MS 50
#define SHUTDOWN_POLL_MS 10
#define RECV_BURST 64                 /* messages handled per turn before tending workers */
#define REGISTER_RETRY_MS 2000
#define SILENT_HEARTBEATS 5           /* this many heartbeats without a word: re-register */
#define SHUTDOWN_GRACE_MS 10000
#define MAX_GRACE_MS (24LL * 3600 * 1000)
/* Queued while smeltd restarts: a few minutes of metrics lines from a busy node. */
#define SEND_HWM 100000
#define MAX_SOCKET_FAILURES 20        /* consecutive receive failures before giving up */
/* A longer metrics line is skipped: it would not fit smeltd's header limit. */
#define METRICS_MAX_LINE_BYTES (512 * 1024)
#define MAX_ARGV 4096
#define MAX_ENV 1024
#define ENV_NAME_MAX_BYTES 256
#define VISIBLE_TOKEN_BYTES 96

/* ---- state ---- */

/* Where the relay stands in one worker's metrics file. */
struct metrics_tail {
    int64_t offset;  /* start of the first line not yet relayed */
    bool seen;       /* dev/ino hold the file last read; a different one starts over */
    dev_t dev;
    ino_t ino;
    bool skipping;   /* inside an over-long line: drop bytes through its newline */
};

struct worker {
    bool used;
    char job_id[JOB_ID_MAX_BYTES + 1];
    int64_t attempt;
    pid_t pid;                 /* also its process group id */
    char *metrics_path;        /* owned */
    struct metrics_tail tail;
    bool kill_pending;         /* SIGKILL the group at kill_at_ms */
    int64_t kill_at_ms;
};

#define AGENT_RECONNECT_MAX_MS 5000

struct agent {
    const struct agent_config *config;
    char id[MSG_ROUTE_BYTES];
    char hostname[256];
    struct agent_device devices[AGENT_MAX_DEVICES];
    /* How a worker's CUDA_VISIBLE_DEVICES names each device: the agent's own
     * CUDA_VISIBLE_DEVICES entry when it has one (ordinals are relative to it). */
    char visible_tokens[AGENT_MAX_DEVICES][VISIBLE_TOKEN_BYTES];
    int n_devices;
    void *ctx, *sock;
    bool own_ctx;
    int heartbeat_ms;
    bool registered;
    int64_t last_heard_ms, last_register_ms, last_heartbeat_ms;
    int socket_failures;
    char *line_buf;            /* METRICS_MAX_LINE_BYTES, for the metrics relay */
    struct worker workers[AGENT_MAX_WORKERS];
};

/* A refused message: the field it names and the message. */
struct refusal {
    char field[64];
    struct smelt_error err;
};

__attribute__((format(printf, 3, 4)))
static int refuse(struct refusal *r, const char *field, const char *fmt, ...) {
    char detail[SMELT_ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(r->field, sizeof r->field, "%s", field);
    return error_set(&r->err, SMELT_EINVAL, "%s: %s", field, detail);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- devices ---- */

#ifdef SMELT_CUDA
/* GPUs through the CUDA runtime; *n = 0 when none is visible or there is no driver. */
static int discover_cuda(struct agent_device *devices, int max, int *n, struct smelt_error *err) {
    int count = 0;
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        log_info("agent: no CUDA device (%s): using CPU slots", cudaGetErrorString(e));
        cudaGetLastError(); /* reset the runtime's last error for whoever uses CUDA next */
        return SMELT_OK;
    }
    if (count > max) {
        log_warn("agent: %d CUDA devices, reporting the first %d", count, max);
        count = max;
    }
    for (int i = 0; i < count; i++) {
        struct cudaDeviceProp prop;
        e = cudaGetDeviceProperties(&prop, i);
        if (e != cudaSuccess)
            return error_set(err, SMELT_EBACKEND, "cudaGetDeviceProperties(%d): %s", i,
                             cudaGetErrorString(e));
        devices[i] = (struct agent_device){.index = i, .memory_bytes = (int64_t)prop.totalGlobalMem};
        snprintf(devices[i].kind, sizeof devices[i].kind, "cuda");
        snprintf(devices[i].name, sizeof devices[i].name, "%.*s",
                 (int)sizeof devices[i].name - 1, prop.name);
    }
    *n = count;
    return SMELT_OK;
}
#endif

static int discover_cpu(const struct agent_config *config, struct agent_device *devices, int max,
                        int *n, struct smelt_error *err) {
    int slots = config->cpu_slots;
    if (slots == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        slots = cores >= 16 ? (int)(cores / 8) : 1;
        if (slots > max) slots = max;
    }
    if (slots > max)
        return error_set(err, SMELT_EINVAL, "cpu_slots: %d is more than the %d devices room was given for",
                         slots, max);
    long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_bytes <= 0)
        return error_set(err, SMELT_EIO, "sysconf: cannot read the physical memory size");
    int64_t per_slot = (int64_t)pages * page_bytes / slots;
    for (int i = 0; i < slots; i++) {
        devices[i] = (struct agent_device){.index = i, .memory_bytes = per_slot};
        snprintf(devices[i].kind, sizeof devices[i].kind, "cpu");
        snprintf(devices[i].name, sizeof devices[i].name, "cpu%d", i);
    }
    *n = slots;
    return SMELT_OK;
}

int agent_discover_devices(const struct agent_config *config, struct agent_device *devices,
                           int max, int *n, struct smelt_error *err) {
    if (!config || !devices || !n || max < 1)
        return error_set(err, SMELT_EINVAL, "agent_discover_devices: bad arguments");
    if (config->cpu_slots < 0 || config->cpu_slots > AGENT_MAX_DEVICES)
        return error_set(err, SMELT_EINVAL, "cpu_slots: %d is outside [0, %d]", config->cpu_slots,
                         AGENT_MAX_DEVICES);
    *n = 0;
#ifdef SMELT_CUDA
    if (!config->force_cpu) {
        int rc = discover_cuda(devices, max, n, err);
        if (rc || *n > 0) return rc;
    }
#endif
    return discover_cpu(config, devices, max, n, err);
}

/* The agent's own CUDA_VISIBLE_DEVICES maps ordinal i to its i-th entry; without one the
 * ordinal is the name. */
static void fill_visible_tokens(struct agent *a) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    const char *p = visible;
    for (int i = 0; i < a->n_devices; i++) {
        snprintf(a->visible_tokens[i], VISIBLE_TOKEN_BYTES, "%d", a->devices[i].index);
        if (!visible || !p) continue;
        size_t len = strcspn(p, ",");
        if (len > 0 && len < VISIBLE_TOKEN_BYTES)
            snprintf(a->visible_tokens[i], VISIBLE_TOKEN_BYTES, "%.*s", (int)len, p);
        p = p[len] == ',' ? p + len + 1 : NULL;
    }
}

/* ---- sending ---- */

/* Sends and releases header (NULL: building it ran out of memory). A failed send is
 * logged and dropped: smeltd learns the state again from the next heartbeat. */
static void agent_send(struct agent *a, const char *type, json_t *header) {
    if (!header) {
        log_error("agent: out of memory building %s", type);
        return;
    }
    struct smelt_error err = {0};
    if (msg_send(a->sock, NULL, 0, type, header, NULL, 0, &err))
        log_warn("agent: %s dropped: %s", type, err.message);
    json_decref(header);
}

static void send_agent_error(struct agent *a, const char *type, const struct refusal *r) {
    log_warn("agent: refused %s: %s", type[0] ? type : "a message", r->err.message);
    agent_send(a, MSG_AGENT_ERROR,
               json_pack("{s:{s:s, s:s}}", "error", "message", r->err.message, "field", r->field));
}

static bool append_new(json_t *array, json_t *value) {
    return value && json_array_append_new(array, value) == 0;
}

static json_t *running_list(const struct agent *a) {
    json_t *list = json_array();
    for (int i = 0; list && i < AGENT_MAX_WORKERS; i++) {
        const struct worker *w = &a->workers[i];
        if (w->used && !append_new(list, json_pack("{s:s, s:I}", "job_id", w->job_id, "attempt",
                                                   (json_int_t)w->attempt))) {
            json_decref(list);
            list = NULL;
        }
    }
    return list;
}

static void send_register(struct agent *a, int64_t now) {
    json_t *devices = json_array();
    for (int i = 0; devices && i < a->n_devices; i++) {
        const struct agent_device *d = &a->devices[i];
        if (!append_new(devices, json_pack("{s:i, s:s, s:s, s:I}", "index", d->index, "kind", d->kind,
                                           "name", d->name, "memory_bytes",
                                           (json_int_t)d->memory_bytes))) {
            json_decref(devices);
            devices = NULL;
        }
    }
    json_t *running = running_list(a);
    json_t *header = NULL;
    if (devices && running)
        header = json_pack("{s:s, s:s, s:O, s:O}", "agent_id", a->id, "hostname", a->hostname,
                           "devices", devices, "running", running);
    json_decref(devices);
    json_decref(running);
    agent_send(a, MSG_AGENT_REGISTER, header);
    a->last_register_ms = now;
}

static void send_heartbeat(struct agent *a, int64_t now) {
    json_t *running = running_list(a);
    agent_send(a, MSG_AGENT_HEARTBEAT,
               running ? json_pack("{s:s, s:o}", "agent_id", a->id, "running", running) : NULL);
    a->last_heartbeat_ms = now;
}

/* worker.exited; error (NULL for none) says why a launch failed. */
static void send_exited(struct agent *a, const char *job_id, int64_t attempt, int exit_code,
                        int signal, const char *error) {
    json_t *h = json_pack("{s:s, s:s, s:I, s:i, s:i}", "agent_id", a->id, "job_id", job_id,
                          "attempt", (json_int_t)attempt, "exit_code", exit_code, "signal", signal);
    if (h && error && json_object_set_new(h, "error", json_string(error)) != 0) {
        json_decref(h);
        h = NULL;
    }
    agent_send(a, MSG_WORKER_EXITED, h);
}

/* ---- validating orders ---- */

static bool is_job_id_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == ':' || c == '-';
}

static bool is_env_name(const char *s) {
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return false;
    for (s++; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

/* A JSON string without embedded NULs (they would cut it short in C). */
static const char *plain_string(const json_t *v) {
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

static int check_keys(const json_t *header, const char *const *allowed, struct refusal *r) {
    const char *key = json_unknown_key(header, allowed);
    return key ? refuse(r, key, "unknown field") : SMELT_OK;
}

/* job_id and attempt: what every order about a worker names it by. */
static int read_worker_key(const json_t *header, const char **job_id, int64_t *attempt,
                           struct refusal *r) {
    const char *id = plain_string(json_object_get(header, "job_id"));
    if (!id) return refuse(r, "job_id", "a string is required");
    size_t len = strlen(id);
    if (len == 0 || len > JOB_ID_MAX_BYTES)
        return refuse(r, "job_id", "%zu bytes (1 to %d allowed)", len, JOB_ID_MAX_BYTES);
    for (size_t i = 0; i < len; i++)
        if (!is_job_id_char(id[i]))
            return refuse(r, "job_id", "character %zu is not one of [A-Za-z0-9_.:-]", i);
    json_t *att = json_object_get(header, "attempt");
    if (!json_is_integer(att) || json_integer_value(att) < 0 || json_integer_value(att) > INT32_MAX)
        return refuse(r, "attempt", "an integer in [0, %d] is required", INT32_MAX);
    *job_id = id;
    *attempt = json_integer_value(att);
    return SMELT_OK;
}

static int read_abs_path(const json_t *header, const char *key, const char **out,
                         struct refusal *r) {
    const char *p = plain_string(json_object_get(header, key));
    if (!p) return refuse(r, key, "a string is required");
    if (p[0] != '/') return refuse(r, key, "'%s' is not an absolute path", p);
    if (strlen(p) >= PATH_MAX) return refuse(r, key, "longer than %d bytes", PATH_MAX - 1);
    *out = p;
    return SMELT_OK;
}

/* A validated worker.launch; strings are borrowed from the message. */
struct launch {
    const char *job_id;
    int64_t attempt;
    const char **argv;   /* malloc'd, NULL-terminated */
    const json_t *env;
    const char *workdir, *log_path, *metrics_path;
    int devices[AGENT_MAX_DEVICES];
    int n_devices;
    const json_t *secrets; /* NULL, or the attempt's keys for the worker (common/secret_fd.h) */
};

static int read_argv(const json_t *header, struct launch *l, struct refusal *r) {
    const json_t *argv = json_object_get(header, "argv");
    if (!json_is_array(argv) || json_array_size(argv) == 0)
        return refuse(r, "argv", "a non-empty array of strings is required");
    size_t n = json_array_size(argv);
    if (n > MAX_ARGV) return refuse(r, "argv", "%zu entries (at most %d)", n, MAX_ARGV);
    l->argv = calloc(n + 1, sizeof *l->argv);
    if (!l->argv) return refuse(r, "argv", "out of memory");
    for (size_t i = 0; i < n; i++) {
        l->argv[i] = plain_string(json_array_get(argv, i));
        if (!l->argv[i]) {
            char field[32];
            snprintf(field, sizeof field, "argv[%zu]", i);
            return refuse(r, field, "a string without NUL bytes is required");
        }
    }
    const char *prog = l->argv[0];
    struct stat st;
    if (prog[0] != '/') return refuse(r, "argv[0]", "'%s' is not an absolute path", prog);
    if (stat(prog, &st) != 0) return refuse(r, "argv[0]", "%s: %s", prog, strerror(errno));
    if (!S_ISREG(st.st_mode)) return refuse(r, "argv[0]", "%s is not a regular file", prog);
    if (access(prog, X_OK) != 0) return refuse(r, "argv[0]", "%s is not executable", prog);
    return SMELT_OK;
}

static int read_env(const json_t *header, struct launch *l, struct refusal *r) {
    const json_t *env = json_object_get(header, "env");
    if (!json_is_object(env)) return refuse(r, "env", "an object of strings is required");
    if (json_object_size(env) > MAX_ENV)
        return refuse(r, "env", "%zu entries (at most %d)", json_object_size(env), MAX_ENV);
    const char *name;
    json_t *value;
    json_object_foreach((json_t *)env, name, value) {
        if (strlen(name) > ENV_NAME_MAX_BYTES || !is_env_name(name))
            return refuse(r, "env", "'%.64s' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", name);
        if (!plain_string(value))
            return refuse(r, "env", "%s: a string without NUL bytes is required", name);
    }
    l->env = env;
    return SMELT_OK;
}

static int read_devices(const struct agent *a, const json_t *header, struct launch *l,
                        struct refusal *r) {
    const json_t *devices = json_object_get(header, "devices");
    if (!json_is_array(devices)) return refuse(r, "devices", "an array of device indexes is required");
    if (json_array_size(devices) > (size_t)a->n_devices)
        return refuse(r, "devices", "%zu entries, this agent has %d devices",
                      json_array_size(devices), a->n_devices);
    bool taken[AGENT_MAX_DEVICES] = {false};
    size_t i;
    json_t *v;
    json_array_foreach(devices, i, v) {
        int found = -1;
        for (int d = 0; json_is_integer(v) && d < a->n_devices; d++)
            if (a->devices[d].index == json_integer_value(v)) found = d;
        if (found < 0)
            return refuse(r, "devices", "entry %zu is not the index of one of this agent's %d devices",
                          i, a->n_devices);
        if (taken[found]) return refuse(r, "devices", "device %d is listed twice", a->devices[found].index);
        taken[found] = true;
        l->devices[l->n_devices++] = found;
    }
    return SMELT_OK;
}

/* The attempt's keys, passed on to the worker through a pipe as they are (checked here
 * so a bad launch is refused rather than a worker failing later). */
static int read_secrets(const json_t *header, struct launch *l, struct refusal *r) {
    const json_t *secrets = json_object_get(header, "secrets");
    if (!secrets) return SMELT_OK;
    struct curve_job_keys keys;
    struct smelt_error err = {0};
    int rc = curve_job_keys_from_json(secrets, &keys, &err);
    explicit_bzero(&keys, sizeof keys);
    if (rc) return refuse(r, "secrets", "%s", err.message);
    l->secrets = secrets;
    return SMELT_OK;
}

/* Everything but job_id and attempt, which the caller has read. */
static int read_launch(const struct agent *a, const json_t *header, struct launch *l,
                       struct refusal *r) {
    static const char *const allowed[] = {"v", "job_id", "attempt", "argv", "env", "workdir",
                                          "log_path", "metrics_path", "devices", "secrets", NULL};
    int rc = check_keys(header, allowed, r);
    if (!rc) rc = read_argv(header, l, r);
    if (!rc) rc = read_env(header, l, r);
    if (!rc) rc = read_abs_path(header, "workdir", &l->workdir, r);
    if (!rc && !path_is_dir(l->workdir))
        rc = refuse(r, "workdir", "%s is not an existing directory", l->workdir);
    if (!rc) rc = read_abs_path(header, "log_path", &l->log_path, r);
    if (!rc) rc = read_abs_path(header, "metrics_path", &l->metrics_path, r);
    if (!rc) rc = read_devices(a, header, l, r);
    if (!rc) rc = read_secrets(header, l, r);
    return rc;
}

/* ---- starting a worker ---- */

/* Appends item to the comma list in buf; the callers' buffers are sized for every device. */
static void list_append(char *buf, size_t cap, const char *item) {
    size_t used = strlen(buf);
    int n = snprintf(buf + used, cap - used, "%s%s", used ? "," : "", item);
    SMELT_ASSERT(n > 0 && (size_t)n < cap - used);
}

/* The devices as CUDA_VISIBLE_DEVICES / SMELT_CPU_SLOT values ("0,1"). */
static void device_lists(const struct agent *a, const struct launch *l, char *visible,
                         size_t visible_bytes, char *slots, size_t slots_bytes) {
    visible[0] = slots[0] = 0;
    for (int i = 0; i < l->n_devices; i++) {
        int d = l->devices[i];
        char index[16];
        snprintf(index, sizeof index, "%d", a->devices[d].index);
        if (strcmp(a->devices[d].kind, "cuda") == 0) list_append(visible, visible_bytes, a->visible_tokens[d]);
        else list_append(slots, slots_bytes, index);
    }
}

/* The agent's environment, with the launch's env laid over it and then the device
 * variables, which the agent owns (a launch cannot widen its devices through env). */
static char **build_envp(const struct agent *a, const struct launch *l, int secret_fd) {
    char visible[AGENT_MAX_DEVICES * (VISIBLE_TOKEN_BYTES + 1)];
    char slots[AGENT_MAX_DEVICES * 16];
    device_lists(a, l, visible, sizeof visible, slots, sizeof slots);
    size_t n_own = 0;
    while (environ && environ[n_own]) n_own++;
    size_t cap = n_own + json_object_size(l->env) + 4, n = 0;
    char **envp = calloc(cap, sizeof *envp);
    if (!envp) return NULL;
    bool ok = true;
    for (size_t i = 0; ok && i < n_own; i++) {
        const char *e = environ[i];
        if (env_entry_is(e, "CUDA_VISIBLE_DEVICES") || env_entry_is(e, "SMELT_CPU_SLOT") ||
            env_entry_is(e, SECRET_FD_ENV))
            continue;
        const char *name;
        json_t *value;
        bool replaced = false;
        json_object_foreach((json_t *)l->env, name, value) replaced = replaced || env_entry_is(e, name);
        if (!replaced) ok = (envp[n++] = strdup(e)) != NULL;
    }
    const char *name;
    json_t *value;
    json_object_foreach((json_t *)l->env, name, value) {
        if (!ok) break;
        if (strcmp(name, "CUDA_VISIBLE_DEVICES") == 0 || strcmp(name, "SMELT_CPU_SLOT") == 0 ||
            strcmp(name, SECRET_FD_ENV) == 0)
            continue;
        ok = (envp[n++] = env_entry(name, json_string_value(value))) != NULL;
    }
    /* No GPU listed means none: an empty CUDA_VISIBLE_DEVICES, not "all of them". */
    if (ok) ok = (envp[n++] = env_entry("CUDA_VISIBLE_DEVICES", visible)) != NULL;
    if (ok && slots[0]) ok = (envp[n++] = env_entry("SMELT_CPU_SLOT", slots)) != NULL;
    if (ok && secret_fd >= 0) {
        char number[16];
        snprintf(number, sizeof number, "%d", secret_fd);
        ok = (envp[n++] = env_entry(SECRET_FD_ENV, number)) != NULL;
    }
    if (!ok) {
        spawn_envp_free(envp);
        return NULL;
    }
    return envp;
}


static struct worker *worker_find(struct agent *a, const char *job_id, int64_t attempt) {
    for (int i = 0; i < AGENT_MAX_WORKERS; i++) {
        struct worker *w = &a->workers[i];
        if (w->used && w->attempt == attempt && strcmp(w->job_id, job_id) == 0) return w;
    }
    return NULL;
}

static struct worker *worker_slot(struct agent *a) {
    for (int i = 0; i < AGENT_MAX_WORKERS; i++)
        if (!a->workers[i].used) return &a->workers[i];
    return NULL;
}

static void worker_clear(struct worker *w) {
    free(w->metrics_path);
    memset(w, 0, sizeof *w);
}

/* Forks and execs the validated launch into slot w. Failures before the fork are
 * refusals (field log_path for a log that cannot be opened). */
static int spawn_worker(struct agent *a, const struct launch *l, struct worker *w,
                        struct refusal *r) {
    struct spawn_plan plan;
    spawn_plan_init(&plan, l->argv, NULL);
    plan.workdir = l->workdir;
    plan.own_group = true;
    plan.who = "smelt-agent";
    int rc = SMELT_OK;
    char *metrics_path = strdup(l->metrics_path);
    struct smelt_error err = {0};
    if (l->secrets && secret_pipe_new(l->secrets, &plan.pass_fd, &err) != 0)
        rc = refuse(r, "secrets", "%s", err.message);
    char **envp = build_envp(a, l, plan.pass_fd);
    plan.envp = envp;
    if (!rc && !metrics_path) rc = refuse(r, "metrics_path", "out of memory");
    if (!rc && !envp) rc = refuse(r, "env", "out of memory building the environment");
    if (!rc) {
        plan.out_fd = plan.err_fd = open_above_stdio(l->log_path, O_WRONLY | O_APPEND | O_CREAT | O_NOCTTY, 0644);
        if (plan.out_fd < 0) rc = refuse(r, "log_path", "%s: %s", l->log_path, strerror(errno));
    }
    if (!rc) {
        plan.in_fd = open_above_stdio("/dev/null", O_RDONLY, 0);
        if (plan.in_fd < 0) rc = refuse(r, "argv", "/dev/null: %s", strerror(errno));
    }
    pid_t pid = -1;
    if (!rc) {
        pid = spawn_start(&plan);
        if (pid < 0) rc = refuse(r, "argv", "fork: %s", strerror(errno));
    }
    if (!rc) {
        *w = (struct worker){.used = true, .attempt = l->attempt, .pid = pid,
                             .metrics_path = metrics_path};
        snprintf(w->job_id, sizeof w->job_id, "%s", l->job_id);
        metrics_path = NULL;
    }
    if (plan.out_fd >= 0) close(plan.out_fd);
    if (plan.in_fd >= 0) close(plan.in_fd);
    if (plan.pass_fd >= 0) close(plan.pass_fd);
    spawn_envp_free(envp);
    free(metrics_path);
    return rc;
}

static void handle_launch(struct agent *a, const json_t *header, struct refusal *r) {
    const char *job_id;
    int64_t attempt;
    /* Without a usable job_id and attempt there is no worker to report on. */
    if (read_worker_key(header, &job_id, &attempt, r)) return;
    if (worker_find(a, job_id, attempt)) {
        refuse(r, "job_id", "job %s attempt %lld is already running here", job_id, (long long)attempt);
        return;
    }
    struct launch l = {.job_id = job_id, .attempt = attempt};
    struct refusal launch_r = {{0}, {0}};
    struct worker *w = NULL;
    int rc = SMELT_OK;
    if (!(w = worker_slot(a)))
        rc = refuse(&launch_r, "job_id", "%d workers are running here already", AGENT_MAX_WORKERS);
    if (!rc) rc = read_launch(a, header, &l, &launch_r);
    if (!rc) rc = spawn_worker(a, &l, w, &launch_r);
    free(l.argv);
    if (rc) {
        log_warn("agent: launch of job %s attempt %lld refused: %s", job_id, (long long)attempt,
                 launch_r.err.message);
        send_exited(a, job_id, attempt, -1, 0, launch_r.err.message);
        return;
    }
    log_info("agent: started job %s attempt %lld as pid %d", job_id, (long long)attempt, (int)w->pid);
    agent_send(a, MSG_WORKER_STARTED,
               json_pack("{s:s, s:s, s:I, s:i}", "agent_id", a->id, "job_id", w->job_id, "attempt",
                         (json_int_t)w->attempt, "pid", (int)w->pid));
}

/* ---- stopping ---- */

static void signal_group(const struct worker *w, int sig) {
    if (kill(-w->pid, sig) != 0 && errno != ESRCH)
        log_warn("agent: kill(-%d, %d): %s", (int)w->pid, sig, strerror(errno));
}

/* SIGTERM now, SIGKILL at now + grace_ms unless it is gone by then; a second stop can
 * only bring the SIGKILL closer. */
static void worker_stop(struct worker *w, int64_t grace_ms, int64_t now) {
    signal_group(w, SIGTERM);
    int64_t at = now + grace_ms;
    if (!w->kill_pending || at < w->kill_at_ms) w->kill_at_ms = at;
    w->kill_pending = true;
}

static void handle_stop(struct agent *a, const json_t *header, int64_t now, struct refusal *r) {
    static const char *const allowed[] = {"v", "job_id", "attempt", "grace_ms", "reason", NULL};
    const char *job_id, *reason;
    int64_t attempt;
    if (check_keys(header, allowed, r) || read_worker_key(header, &job_id, &attempt, r)) return;
    json_t *grace = json_object_get(header, "grace_ms");
    if (!json_is_integer(grace) || json_integer_value(grace) < 0 ||
        json_integer_value(grace) > MAX_GRACE_MS) {
        refuse(r, "grace_ms", "an integer in [0, %lld] is required", MAX_GRACE_MS);
        return;
    }
    if (!(reason = plain_string(json_object_get(header, "reason")))) {
        refuse(r, "reason", "a string is required");
        return;
    }
    struct worker *w = worker_find(a, job_id, attempt);
    if (!w) {
        refuse(r, "job_id", "no worker of job %s attempt %lld is running here", job_id, (long long)attempt);
        return;
    }
    log_info("agent: stopping job %s attempt %lld (pid %d, grace %lld ms): %s", job_id,
             (long long)attempt, (int)w->pid, (long long)json_integer_value(grace), reason);
    worker_stop(w, json_integer_value(grace), now);
}

/* ---- metrics relay ---- */

static void relay_line(struct agent *a, const struct worker *w, int64_t offset, const char *line,
                       size_t len) {
    size_t blank = 0;
    while (blank < len && (line[blank] == ' ' || line[blank] == '\t' || line[blank] == '\r')) blank++;
    if (blank == len) return;
    json_error_t jerr;
    json_t *obj = json_loadb(line, len, 0, &jerr);
    if (!obj || !json_is_object(obj)) {
        log_warn("agent: job %s attempt %lld: %s offset %lld: %s: line skipped", w->job_id,
                 (long long)w->attempt, w->metrics_path, (long long)offset,
                 obj ? "not a JSON object" : jerr.text);
        json_decref(obj);
        return;
    }
    agent_send(a, MSG_WORKER_EVENT,
               json_pack("{s:s, s:s, s:I, s:I, s:o}", "agent_id", a->id, "job_id", w->job_id,
                         "attempt", (json_int_t)w->attempt, "offset", (json_int_t)offset, "line", obj));
}

/* Relays the complete lines added to w's metrics file since the last call. A new file
 * (another inode) or a shorter one starts over at offset 0: the receiver drops repeats.
 * at_exit: the worker is gone, so a last line without its newline is relayed too. */
static void relay_metrics(struct agent *a, struct worker *w, bool at_exit) {
    int fd = open(w->metrics_path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return; /* not written yet (or unreadable: nothing to relay either way) */
    struct metrics_tail *t = &w->tail;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    if (!t->seen || st.st_dev != t->dev || st.st_ino != t->ino || st.st_size < t->offset) {
        if (t->seen)
            log_info("agent: job %s attempt %lld: %s was replaced or truncated: reading it again",
                     w->job_id, (long long)w->attempt, w->metrics_path);
        *t = (struct metrics_tail){.seen = true, .dev = st.st_dev, .ino = st.st_ino};
    }
    char *buf = a->line_buf;
    while (t->offset < st.st_size) {
        ssize_t n = pread(fd, buf, METRICS_MAX_LINE_BYTES, t->offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        size_t start = 0, len = (size_t)n;
        const char *nl;
        while ((nl = memchr(buf + start, '\n', len - start)) != NULL) {
            size_t end = (size_t)(nl - buf);
            if (t->skipping) t->skipping = false;
            else relay_line(a, w, t->offset + (int64_t)start, buf + start, end - start);
            start = end + 1;
        }
        if (start == 0 && len == METRICS_MAX_LINE_BYTES) {
            if (!t->skipping)
                log_warn("agent: job %s attempt %lld: %s offset %lld: line longer than %d bytes: skipped",
                         w->job_id, (long long)w->attempt, w->metrics_path, (long long)t->offset,
                         METRICS_MAX_LINE_BYTES);
            t->skipping = true;
            t->offset += n;
            continue;
        }
        if (start == 0) { /* an unfinished line */
            if (at_exit && !t->skipping) {
                relay_line(a, w, t->offset, buf, len);
                t->offset += n;
            }
            break;
        }
        t->offset += (int64_t)start;
    }
    close(fd);
}

/* ---- reaping ---- */

/* Reports and forgets w if its process has ended. */
static void reap_worker(struct agent *a, struct worker *w) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    /* WNOWAIT: the zombie keeps the process group id reserved while the group's
     * leftovers are killed, so the kill cannot reach a recycled group. */
    if (waitid(P_PID, (id_t)w->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        if (errno == EINTR) return;
        log_error("agent: job %s attempt %lld: pid %d was reaped by someone else (%s)", w->job_id,
                  (long long)w->attempt, (int)w->pid, strerror(errno));
        relay_metrics(a, w, true);
        send_exited(a, w->job_id, w->attempt, -1, 0, "the worker's exit status was lost");
        worker_clear(w);
        return;
    }
    if (info.si_pid == 0) return; /* still running */
    signal_group(w, SIGKILL);
    int status = 0;
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {}
    int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    log_info("agent: job %s attempt %lld (pid %d) ended: exit code %d, signal %d", w->job_id,
             (long long)w->attempt, (int)w->pid, exit_code, sig);
    relay_metrics(a, w, true);
    send_exited(a, w->job_id, w->attempt, exit_code, sig, NULL);
    worker_clear(w);
}

static int tend_workers(struct agent *a, int64_t now) {
    int live = 0;
    for (int i = 0; i < AGENT_MAX_WORKERS; i++) {
        struct worker *w = &a->workers[i];
        if (!w->used) continue;
        if (w->kill_pending && now >= w->kill_at_ms) {
            log_warn("agent: job %s attempt %lld (pid %d) outlived its grace: SIGKILL", w->job_id,
                     (long long)w->attempt, (int)w->pid);
            signal_group(w, SIGKILL);
            w->kill_pending = false;
        }
        reap_worker(a, w);
        if (w->used) {
            relay_metrics(a, w, false);
            live++;
        }
    }
    return live;
}

/* ---- orders from smeltd ---- */

static void handle_registered(struct agent *a, const json_t *header, int64_t now,
                              struct refusal *r) {
    /* Only an acknowledgement: fields it may grow are ignored. */
    json_t *hb = json_object_get(header, "heartbeat_ms");
    if (hb && !json_is_null(hb)) {
        if (!json_is_integer(hb) || json_integer_value(hb) < 10 || json_integer_value(hb) > 3600000) {
            refuse(r, "heartbeat_ms", "an integer in [10, 3600000] is required");
            return;
        }
        a->heartbeat_ms = (int)json_integer_value(hb);
    }
    if (!a->registered)
        log_info("agent %s: registered (heartbeat every %d ms)", a->id, a->heartbeat_ms);
    a->registered = true;
    a->last_heartbeat_ms = now;
}

static void handle_message(struct agent *a, const struct msg *m, int64_t now) {
    struct refusal r = {{0}, {0}};
    if (msg_check_version(m, &r.err)) snprintf(r.field, sizeof r.field, "v");
    else if (strcmp(m->type, MSG_AGENT_REGISTERED) == 0) handle_registered(a, m->header, now, &r);
    else if (strcmp(m->type, MSG_WORKER_LAUNCH) == 0) handle_launch(a, m->header, &r);
    else if (strcmp(m->type, MSG_WORKER_STOP) == 0) handle_stop(a, m->header, now, &r);
    else refuse(&r, "type", "unknown message type '%s'", m->type);
    if (r.err.code) send_agent_error(a, m->type, &r);
}

/* Handles what has arrived, waiting at most timeout_ms for the first message. Only a
 * socket that keeps failing is an error. */
static int receive_orders(struct agent *a, int timeout_ms, struct smelt_error *err) {
    for (int i = 0; i < RECV_BURST; i++) {
        struct msg m;
        struct smelt_error rerr = {0};
        int rc = msg_recv(a->sock, false, i == 0 ? timeout_ms : 0, &m, &rerr);
        if (rc == SMELT_ENOTFOUND) return SMELT_OK;
        if (rc == SMELT_EIO) {
            int e = zmq_errno();
            if (e == ETERM || ++a->socket_failures >= MAX_SOCKET_FAILURES)
                return error_set(err, SMELT_EIO, "agent socket: %s", rerr.message);
            log_warn("agent: %s", rerr.message);
            return SMELT_OK;
        }
        a->socket_failures = 0;
        int64_t now = now_ms();
        a->last_heard_ms = now;
        if (rc) {
            /* msg_recv's message already names what was wrong. */
            struct refusal r = {{0}, {0}};
            snprintf(r.field, sizeof r.field, "%s", m.type[0] ? "header" : "type");
            error_set(&r.err, rc, "%s", rerr.message);
            send_agent_error(a, m.type, &r);
        } else {
            handle_message(a, &m, now);
        }
        msg_free(&m);
    }
    return SMELT_OK;
}

static void keep_in_touch(struct agent *a, int64_t now) {
    if (!a->registered) {
        if (now - a->last_register_ms >= REGISTER_RETRY_MS) send_register(a, now);
        return;
    }
    if (now - a->last_heard_ms >= (int64_t)SILENT_HEARTBEATS * a->heartbeat_ms) {
        log_warn("agent %s: nothing from smeltd for %lld ms: registering again", a->id,
                 (long long)(now - a->last_heard_ms));
        a->registered = false;
        a->last_heard_ms = now;
        send_register(a, now);
        return;
    }
    if (now - a->last_heartbeat_ms >= a->heartbeat_ms) send_heartbeat(a, now);
}

/* ---- lifetime ---- */

static int check_agent_id(const char *id, struct smelt_error *err) {
    size_t len = strlen(id);
    if (len == 0 || len >= MSG_ROUTE_BYTES)
        return error_set(err, SMELT_EINVAL, "agent_id: %zu bytes (1 to %d allowed)", len,
                         MSG_ROUTE_BYTES - 1);
    for (size_t i = 0; i < len; i++)
        if (id[i] < 0x21 || id[i] > 0x7e)
            return error_set(err, SMELT_EINVAL, "agent_id: character %zu is not printable ASCII", i);
    return SMELT_OK;
}

static int open_socket(struct agent *a, struct smelt_error *err) {
    const struct agent_config *c = a->config;
    a->ctx = c->zmq_context;
    if (!a->ctx) {
        if (!(a->ctx = zmq_ctx_new()))
            return error_set(err, SMELT_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        a->own_ctx = true;
    }
    if (!(a->sock = zmq_socket(a->ctx, ZMQ_DEALER)))
        return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = 0, hwm = SEND_HWM;
    int backoff_ms = AGENT_RECONNECT_MAX_MS; /* a refused handshake is retried, less and less often */
    if (c->curve) {
        TRY(curve_socket_client(a->sock, c->curve, c->server_public_key, err));
        if (zmq_setsockopt(a->sock, ZMQ_RECONNECT_IVL_MAX, &backoff_ms, sizeof backoff_ms) != 0)
            return error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    }
    else if (zmq_setsockopt(a->sock, ZMQ_ROUTING_ID, a->id, strlen(a->id)) != 0)
        return error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    if (zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(a->sock, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0)
        return error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    if (zmq_connect(a->sock, c->server_endpoint) != 0)
        return error_set(err, SMELT_EINVAL, "server endpoint '%s': %s", c->server_endpoint,
                         zmq_strerror(zmq_errno()));
    return SMELT_OK;
}

static int agent_init(struct agent *a, const struct agent_config *c, struct smelt_error *err) {
    a->config = c;
    a->heartbeat_ms = c->heartbeat_ms ? c->heartbeat_ms : 1000;
    if (a->heartbeat_ms < 10 || a->heartbeat_ms > 3600000)
        return error_set(err, SMELT_EINVAL, "heartbeat_ms: %d is outside [10, 3600000]", c->heartbeat_ms);
    if (gethostname(a->hostname, sizeof a->hostname - 1) != 0)
        return error_set(err, SMELT_EIO, "gethostname: %s", strerror(errno));
    snprintf(a->id, sizeof a->id, "%s", c->agent_id ? c->agent_id : a->hostname);
    int rc = check_agent_id(c->agent_id ? c->agent_id : a->hostname, err);
    if (!rc) rc = agent_discover_devices(c, a->devices, AGENT_MAX_DEVICES, &a->n_devices, err);
    if (rc) return rc;
    fill_visible_tokens(a);
    if (!(a->line_buf = malloc(METRICS_MAX_LINE_BYTES)))
        return error_set(err, SMELT_ENOMEM, "agent: out of memory");
    rc = open_socket(a, err);
    if (!rc)
        log_info("agent %s: %d %s device(s), smeltd at %s%s", a->id, a->n_devices, a->devices[0].kind,
                 c->server_endpoint, c->curve ? " (CURVE)" : "");
    return rc;
}

/* Stops every worker as worker.stop would and waits for them all; their exits are still
 * reported while the socket lives. */
static void agent_shutdown(struct agent *a) {
    int64_t now = now_ms();
    for (int i = 0; i < AGENT_MAX_WORKERS; i++)
        if (a->workers[i].used) worker_stop(&a->workers[i], SHUTDOWN_GRACE_MS, now);
    while (tend_workers(a, now_ms()) > 0) {
        struct timespec ts = {.tv_nsec = SHUTDOWN_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void agent_free(struct agent *a) {
    if (a->sock) zmq_close(a->sock);
    if (a->own_ctx) zmq_ctx_term(a->ctx);
    for (int i = 0; i < AGENT_MAX_WORKERS; i++) worker_clear(&a->workers[i]);
    free(a->line_buf);
    free(a);
}

int agent_run(const struct agent_config *config, struct smelt_error *err) {
    if (!config || !config->server_endpoint || !config->stop)
        return error_set(err, SMELT_EINVAL, "agent_run: server_endpoint and stop are required");
    struct agent *a = calloc(1, sizeof *a);
    if (!a) return error_set(err, SMELT_ENOMEM, "agent: out of memory");
    int rc = agent_init(a, config, err);
    if (!rc) {
        int64_t now = now_ms();
        a->last_heard_ms = now;
        send_register(a, now);
        while (!rc && !atomic_load(config->stop)) {
            rc = receive_orders(a, LOOP_POLL_MS, err);
            now = now_ms();
            tend_workers(a, now);
            keep_in_touch(a, now);
        }
    }
    agent_shutdown(a);
    agent_free(a);
    return rc;
}
