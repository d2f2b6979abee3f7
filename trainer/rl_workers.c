/* The split placement's rollout workers: rl.rollout_workers `smelt-rollout` processes
 * that the trainer starts at setup, sends every generation to (rollout/'s client), pushes
 * the new weights to after every update (weightsync/ over the same sockets), and stops in
 * every exit path.
 *
 * Processes. fork + execve of the smelt-rollout next to this executable, with an argv
 * array (never a shell) built before the fork: the child makes only async-signal-safe
 * calls, since other threads (OpenMP's, ZeroMQ's) may hold locks at fork time. Each
 * child gets its own process group, so a SIGTERM meant for the trainer's group (the
 * agent's stop, a terminal's ^C) reaches the trainer alone, which finishes its
 * iteration, checkpoints and then stops its workers; PR_SET_PDEATHSIG SIGTERM, so a
 * trainer killed outright leaves no worker behind; stdout and stderr appended to
 * output_dir/rollout-<i>.log; OPENBLAS_CORETYPE set to the trainer's own kernel set, so
 * a worker computes with the trainer's GEMM kernels (the same logprobs). Devices: the
 * agent lists a job's devices in CUDA_VISIBLE_DEVICES / SMELT_CPU_SLOT, the trainer's
 * first and then one per worker (resources.rollout), so worker i gets entry 1 + i. Each binds
 * tcp://127.0.0.1:* (no fixed port) and the trainer reads the endpoint from the line
 * "smelt-rollout: serving on ENDPOINT" it writes to its log. Children are reaped by pid,
 * never as "any child": the trainer may run inside a program with children of its own.
 * Keys: a trainer with its job's CURVE keys (trainer_options.job_keys) hands them to each
 * worker through a pipe of its own (common/secret_fd.h); the worker's socket then admits
 * only that keypair, which the client shows (docs/security.md "Job channels").
 *
 * Weights. The workers start on the trainer's starting weights: the model directory the
 * trainer loaded when its weights are that directory's, else a copy of them written to
 * output_dir/rollout-model/ (random init, an adapter output merged into its base) and
 * removed once every worker has loaded it (a worker's engine starts at policy version
 * 0, which no push can carry, so a copy it is). With LoRA the fresh adapter is saved to
 * output_dir/rollout-adapter/ and passed as --adapter: the workers then hold an adapter
 * of the same configuration, which "lora" syncs overwrite. A worker holding an older
 * version than a generation asks for (a resumed job) gets the trainer's weights first.
 *
 * Liveness. Every wait of the client (rollout.h: generation, weight sync) asks this file
 * whether each worker still runs (waitpid(WNOHANG) on its pid), so a worker that dies
 * fails the call within the client's poll slice, and the error names it, its endpoint,
 * how it ended and the last lines of its log. A worker that runs but stays silent is
 * declared dead by the client's health checks. */
#include "trainer/trainer_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/curve.h"
#include "rollout/rollout.h"
#include "weightsync/weightsync.h"

/* Loading a large model from disk takes a while; a worker that has not bound by then is
 * stuck. */
#define START_TIMEOUT_MS 300000
/* A worker stops within its idle poll and a socket linger (rollout/); SIGKILL after. */
#define STOP_GRACE_MS 5000
/* How often the wait for the workers to serve looks at their logs and processes. */
#define WATCH_MS 20
/* The end of a worker's log quoted in an error (the message holds 512 bytes). */
#define LOG_TAIL_BYTES 200
#define SERVING "smelt-rollout: serving on "

struct rl_worker {
    pid_t pid;                 /* 0: never started, or reaped */
    int status;                /* its wait status, once reaped */
    bool ended;                /* reaped: status says how it ended */
    off_t log_from;            /* this run's part of the log starts here */
    char log[JOB_PATH_BYTES + 32];
    char endpoint[ROLLOUT_CLIENT_ENDPOINT_BYTES];
};

struct rl_workers {
    int n;
    /* Broadcast syncs: the rendezvous folder (output_dir/weightsync-rendezvous, removed at
     * stop) and this trainer start's id in it; store[0] 0: syncs by ZeroMQ messages. */
    char store[JOB_PATH_BYTES + 40], store_dir[JOB_PATH_BYTES + 40], store_id[48];
    struct rl_worker *w;          /* [n] */
    struct rollout_client *client;
    int64_t version;              /* the policy version every worker holds */
    /* Where a generation's samples land: cap samples of max_tokens. */
    int64_t cap, max_tokens;
    int32_t *ids;                 /* [cap * max_tokens] */
    float *logprobs;              /* [cap * max_tokens] */
    int64_t *n_tokens, *versions; /* [cap] */
    const char **finish;          /* [cap] */
    int *made_by;                 /* [cap] the worker (endpoint index) */
    int64_t in_flight;            /* samples of a submitted batch not yet collected; 0: none */
    int64_t in_flight_version;    /* the version that batch must come from */
};

static char program_override[JOB_PATH_BYTES];

void rl_workers_set_program(const char *path) {
    snprintf(program_override, sizeof program_override, "%s", path ? path : "");
}

/* ---- what the workers run ---- */

/* smelt-rollout in the folder of this executable (or the tests' override). */
static int program_path(char *out, size_t cap, struct smelt_error *err) {
    if (program_override[0]) {
        snprintf(out, cap, "%s", program_override);
    } else {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return error_set(err, SMELT_EIO, "rl: cannot find this program's folder (/proc/self/exe)");
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        size_t len = slash ? (size_t)(slash - exe) : 0;
        static const char name[] = "/smelt-rollout";
        if (len + sizeof name > cap) return error_set(err, SMELT_EINVAL, "rl: the program folder's path is too long");
        memcpy(out, exe, len);
        memcpy(out + len, name, sizeof name);
    }
    if (access(out, X_OK) != 0)
        return error_set_field(err, SMELT_ENOTFOUND, "rl.placement",
                               "rl.placement: split needs smelt-rollout, and %s is %s (it is built beside "
                               "smelt-trainer: make)", out, errno == ENOENT ? "missing" : "not executable");
    return SMELT_OK;
}

/* Whether the trainer's weights are those of the model directory it loaded. */
static bool weights_are_the_directory(const struct trainer_run *r) {
    char cfg[JOB_PATH_BYTES + 32];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", r->spec->model);
    return !r->spec->model_init_random && r->base_path[0] && !path_exists(cfg);
}

/* output_dir/name, emptied. */
static int fresh_dir(const struct trainer_run *r, const char *name, char *dir, size_t cap, struct smelt_error *err) {
    TRY(path_join(dir, cap, r->spec->output_dir, name, err));
    TRY(dir_remove_all(dir, err));
    return dir_create_all(dir, err);
}

/* The model directory the workers load, and (LoRA) the adapter they hold. */
static int worker_weights(struct trainer_run *r, char *model_dir, char *adapter_dir, size_t cap,
                          struct smelt_error *err) {
    adapter_dir[0] = 0;
    if (weights_are_the_directory(r)) {
        snprintf(model_dir, cap, "%s", r->base_path);
    } else {
        TRY(fresh_dir(r, "rollout-model", model_dir, cap, err));
        TRY(error_wrap(err, model_save(r->model, model_dir, false, err), "rl: the workers' model"));
    }
    if (!r->lora) return SMELT_OK;
    TRY(fresh_dir(r, "rollout-adapter", adapter_dir, cap, err));
    return error_wrap(err, lora_save(r->lora, adapter_dir, model_dir, err), "rl: the workers' adapter");
}

/* Once every worker has loaded it, the copy of the weights is not needed (it is as large
 * as the model in f32). */
static void drop_model_copy(const struct trainer_run *r) {
    char dir[JOB_PATH_BYTES + 32];
    struct smelt_error err = {0};
    if (weights_are_the_directory(r)) return;
    if (path_join(dir, sizeof dir, r->spec->output_dir, "rollout-model", &err) || dir_remove_all(dir, &err))
        log_warn("rl: the workers' copy of the weights stays: %s", err.message);
}

/* ---- starting them ---- */

/* Every worker's argv (the same for all but the group rank: each binds a port of its own). */
struct spawn_args {
    const char *argv[32];
};

static int spawn(const struct spawn_args *a, char **envp, int keys_fd, int i, struct rl_worker *w,
                 struct smelt_error *err) {
    int log_fd = open_above_stdio(w->log, O_WRONLY | O_APPEND | O_CREAT | O_NOCTTY, 0644);
    if (log_fd < 0) return error_set(err, SMELT_EIO, "rl: rollout worker %d: %s: %s", i, w->log, strerror(errno));
    int null_fd = open_above_stdio("/dev/null", O_RDONLY, 0);
    struct stat st;
    w->log_from = fstat(log_fd, &st) == 0 ? st.st_size : 0;
    struct spawn_plan p;
    spawn_plan_init(&p, a->argv, envp);
    p.in_fd = null_fd;
    p.out_fd = p.err_fd = log_fd;
    p.own_group = true;
    p.pass_fd = keys_fd;
    p.who = "smelt-trainer";
    pid_t pid = null_fd < 0 ? -1 : spawn_start(&p);
    int e = errno;
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    if (pid < 0) return error_set(err, SMELT_EIO, "rl: starting rollout worker %d: %s", i, strerror(e));
    w->pid = pid;
    return SMELT_OK;
}

/* The last bytes of worker i's log from this run, on one line. */
static void log_tail(const struct rl_worker *w, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(w->log, "r");
    if (!f) return;
    struct stat st;
    off_t from = fstat(fileno(f), &st) == 0 ? st.st_size - (off_t)(cap - 1) : 0;
    if (from < w->log_from) from = w->log_from;
    size_t n = fseeko(f, from, SEEK_SET) == 0 ? fread(out, 1, cap - 1, f) : 0;
    fclose(f);
    out[n] = 0;
    char *whole = from > w->log_from ? strchr(out, '\n') : NULL; /* cut in a line: from the next */
    if (whole && whole[1]) {
        n -= (size_t)(whole + 1 - out);
        memmove(out, whole + 1, n + 1);
    }
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = 0;
    for (size_t k = 0; k < n; k++)
        if (out[k] == '\n') out[k] = '|';
}

/* The error of worker i, which ended `during` something: how, and its log's last lines. */
static int ended_error(const struct rl_workers *ws, int i, const char *during, struct smelt_error *err) {
    const struct rl_worker *w = &ws->w[i];
    char how[64], tail[LOG_TAIL_BYTES];
    spawn_describe_status(w->status, how, sizeof how);
    log_tail(w, tail, sizeof tail);
    return error_set(err, SMELT_EIO, "rl: rollout worker %d (%s) %s %s; the end of %s: %s", i,
                     w->endpoint[0] ? w->endpoint : "not serving yet", how, during, w->log, tail[0] ? tail : "(empty)");
}

/* Reaps worker i if it ended; true when it did (now or before). ECHILD: someone else
 * reaped it (SIGCHLD ignored), so it ended, how is unknown. */
static bool reaped(struct rl_worker *w) {
    if (w->ended) return true;
    if (w->pid <= 0) return false;
    int status = 0;
    pid_t got = waitpid(w->pid, &status, WNOHANG);
    if (got != w->pid && !(got < 0 && errno == ECHILD)) return false;
    w->ended = true;
    w->status = got == w->pid ? status : -1;
    w->pid = 0;
    return true;
}

/* SMELT_OK while every worker runs; else the first ended one's error. */
static int check_alive(struct rl_workers *ws, const char *during, struct smelt_error *err) {
    for (int i = 0; i < ws->n; i++)
        if (reaped(&ws->w[i])) return ended_error(ws, i, during, err);
    return SMELT_OK;
}

/* Worker i's endpoint, once its log says it serves. */
static bool read_endpoint(struct rl_worker *w) {
    char *text = NULL;
    size_t len = 0;
    struct smelt_error ignore = {0};
    if (file_read_all(w->log, &text, &len, &ignore)) return false;
    const char *at = (off_t)len > w->log_from ? strstr(text + w->log_from, SERVING) : NULL;
    const char *eol = at ? strchr(at, '\n') : NULL;
    size_t n = eol ? (size_t)(eol - at) - strlen(SERVING) : 0;
    if (eol && n > 0 && n < sizeof w->endpoint) {
        memcpy(w->endpoint, at + strlen(SERVING), n);
        w->endpoint[n] = 0;
    }
    free(text);
    return w->endpoint[0] != 0;
}

/* Until every worker serves (or one ends, or the time is up). */
static int wait_serving(struct rl_workers *ws, struct smelt_error *err) {
    int64_t deadline = mono_ms() + START_TIMEOUT_MS;
    for (;;) {
        int ready = 0;
        for (int i = 0; i < ws->n; i++) {
            struct rl_worker *w = &ws->w[i];
            if (w->endpoint[0] || read_endpoint(w)) ready++;
            else if (reaped(w)) return ended_error(ws, i, "before serving", err);
        }
        if (ready == ws->n) return SMELT_OK;
        if (mono_ms() >= deadline)
            for (int i = 0; i < ws->n; i++)
                if (!ws->w[i].endpoint[0]) {
                    char tail[LOG_TAIL_BYTES];
                    log_tail(&ws->w[i], tail, sizeof tail);
                    return error_set(err, SMELT_EIO, "rl: rollout worker %d did not serve within %d s; the end of "
                                     "%s: %s", i, START_TIMEOUT_MS / 1000, ws->w[i].log, tail[0] ? tail : "(empty)");
                }
        sleep_ms(WATCH_MS);
    }
}

/* ---- the broadcast group: trainer rank 0, worker i rank i + 1 ---- */

static bool by_broadcast(const struct trainer_run *r) { return r->spec->rl.weight_sync != RL_WEIGHT_SYNC_ZMQ; }

/* A fresh rendezvous for this trainer start: the folder emptied, an id no earlier start
 * used (a killed worker of an earlier start can never join this group). */
static int rendezvous(struct trainer_run *r, struct rl_workers *ws, struct smelt_error *err) {
    if (!by_broadcast(r)) return SMELT_OK;
    TRY(fresh_dir(r, "weightsync-rendezvous", ws->store_dir, sizeof ws->store_dir, err));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(ws->store_id, sizeof ws->store_id, "t%d-%lld-%09ld", (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec);
    int n = snprintf(ws->store, sizeof ws->store, "file:%s", ws->store_dir);
    if (n < 0 || (size_t)n >= sizeof ws->store) return error_set(err, SMELT_EINVAL, "rl: output_dir is too long");
    return SMELT_OK;
}

/* --weights-comm and its companions; text[7] holds the rank (set per worker by
 * start_all), text[8] the size. Returns the new argc. */
static int comm_args(const struct rl_workers *ws, struct spawn_args *p, int n, char (*text)[JOB_PATH_BYTES]) {
    if (!ws->store[0]) return n;
    snprintf(text[8], JOB_PATH_BYTES, "%d", ws->n + 1);
    const char *more[] = {"--weights-comm", ws->store, "--weights-comm-name", ws->store_id, "--weights-comm-rank",
                          text[7], "--weights-comm-size", text[8]};
    for (size_t k = 0; k < sizeof more / sizeof *more; k++) p->argv[n++] = more[k];
    return n;
}

const char *rl_workers_transport(const struct rl_workers *ws) {
    return weightsync_via_name(ws->store[0] ? WEIGHTSYNC_VIA_BROADCAST : WEIGHTSYNC_VIA_ZMQ);
}

/* The argv of every worker (the same but for the group rank: each binds a port of its own). */
static int plan_of(struct trainer_run *r, const struct rl_workers *ws, struct spawn_args *p,
                   char (*text)[JOB_PATH_BYTES], struct smelt_error *err) {
    int64_t cap = ws->cap;
    const struct job_spec *s = r->spec;
    struct rollout_config ec;
    rl_engine_config(r, r->train, cap, &ec);
    TRY(program_path(text[0], JOB_PATH_BYTES, err));
    TRY(worker_weights(r, text[1], text[2], JOB_PATH_BYTES, err));
    snprintf(text[3], JOB_PATH_BYTES, "%lld", (long long)s->rl.kv_memory_mb);
    snprintf(text[4], JOB_PATH_BYTES, "%lld", (long long)ec.max_batch_tokens);
    snprintf(text[5], JOB_PATH_BYTES, "%d", ec.max_seqs);
    snprintf(text[6], JOB_PATH_BYTES, "%lld", (long long)ec.prefill_chunk);
    const char *argv[] = {text[0], "--model", text[1], "--bind", "tcp://127.0.0.1:*", "--kv-memory-mb", text[3],
                          "--max-batch-tokens", text[4], "--max-seqs", text[5], "--prefill-chunk", text[6],
                          "--backend", backend_name(s->backend)};
    int n = (int)(sizeof argv / sizeof *argv);
    memcpy(p->argv, argv, sizeof argv);
    if (text[2][0]) {
        p->argv[n++] = "--adapter";
        p->argv[n++] = text[2];
    }
    if (s->rl.true_on_policy) p->argv[n++] = "--batch-invariant";
    n = comm_args(ws, p, n, text);
    p->argv[n] = NULL;
    return SMELT_OK;
}

static bool with_curve(const struct trainer_run *r) { return r->job_keys && r->job_keys->present; }

static int alloc_results(struct rl_workers *ws, int64_t cap, int64_t max_tokens, struct smelt_error *err) {
    ws->cap = cap;
    ws->max_tokens = max_tokens;
    ws->ids = malloc((size_t)(cap * max_tokens) * sizeof *ws->ids);
    ws->logprobs = malloc((size_t)(cap * max_tokens) * sizeof *ws->logprobs);
    ws->n_tokens = malloc((size_t)cap * sizeof *ws->n_tokens);
    ws->versions = malloc((size_t)cap * sizeof *ws->versions);
    ws->finish = malloc((size_t)cap * sizeof *ws->finish);
    ws->made_by = malloc((size_t)cap * sizeof *ws->made_by);
    bool ok = ws->ids && ws->logprobs && ws->n_tokens && ws->versions && ws->finish && ws->made_by;
    return ok ? SMELT_OK : error_set(err, SMELT_ENOMEM, "rl: out of memory for %lld samples", (long long)cap);
}

/* The client's liveness hook: the trainer knows at once when a worker's process ends. */
static bool worker_alive(void *ctx, int k) { return !reaped(&((struct rl_workers *)ctx)->w[k]); }

/* The workers' sockets are CURVE servers with the job's keypair admitting only it, so the
 * trainer shows the same keypair and expects the same public key. */
static int connect_client(struct trainer_run *r, struct rl_workers *ws, struct smelt_error *err) {
    const char *endpoints[ROLLOUT_CLIENT_MAX_WORKERS];
    for (int i = 0; i < ws->n; i++) endpoints[i] = ws->w[i].endpoint;
    const struct curve_job_keys *k = with_curve(r) ? r->job_keys : NULL;
    struct rollout_client_config cc = {.endpoints = endpoints, .n_endpoints = ws->n, .alive = worker_alive,
                                       .alive_ctx = ws, .weights_comm = ws->store[0] ? ws->store : NULL,
                                       .weights_comm_name = ws->store_id, .curve_keys = k ? &k->worker : NULL,
                                       .curve_server_key = k ? k->worker.public_key : NULL};
    return error_wrap(err, rollout_client_create(&cc, &ws->client, err), "rl: connecting to the rollout workers");
}

/* A failed client call: when a worker's process ended, that is the reason given. */
static int client_failure(struct rl_workers *ws, int rc, const char *during, struct smelt_error *err) {
    struct smelt_error dead = {0};
    if (check_alive(ws, during, &dead)) {
        *err = dead;
        return dead.code;
    }
    return error_wrap(err, rc, "rl: the rollout workers, %s", during);
}

static int start_all(struct trainer_run *r, struct rl_workers *ws, struct smelt_error *err) {
    char text[9][JOB_PATH_BYTES];
    struct spawn_args plan = {0};
    int rc = plan_of(r, ws, &plan, text, err);
    for (int i = 0; !rc && i < ws->n; i++) {
        struct rl_worker *w = &ws->w[i];
        char name[32];
        snprintf(name, sizeof name, "rollout-%d.log", i);
        rc = path_join(w->log, sizeof w->log, r->spec->output_dir, name, err);
        snprintf(text[7], JOB_PATH_BYTES, "%d", i + 1); /* its group rank (comm_args) */
        /* The trainer's device comes first in its lists, then one per worker (the agent's
         * order; a launcher gives rank 0 its own and the workers'). */
        char **envp = rc ? NULL : spawn_envp_for_device(1 + i, -1, backend_cpu_blas_kernels());
        int keys_fd = -1;
        if (!rc && !envp) rc = error_set(err, SMELT_ENOMEM, "rl: out of memory");
        /* The job's keys, so its socket admits only this trainer (a pipe per worker: each
         * reads its own). */
        if (!rc) rc = error_wrap(err, curve_job_keys_for_child(r->job_keys, &envp, &keys_fd, err),
                                 "rl: rollout worker %d's keys", i);
        if (!rc) rc = spawn(&plan, envp, keys_fd, i, w, err);
        if (keys_fd >= 0) close(keys_fd);
        spawn_envp_free(envp);
    }
    if (!rc) log_info("rl: %d rollout workers (%s) starting on %s%s%s; their channel %s", ws->n, text[0], text[1],
                      text[2][0] ? ", adapter " : "", text[2], with_curve(r) ? "uses CURVE with the job's keys"
                      : "is plain (no job keys: a trainer started by hand)");
    return rc;
}

int rl_workers_start(struct trainer_run *r, int64_t cap, struct rl_workers **out, struct smelt_error *err) {
    const struct job_spec *s = r->spec;
    struct rl_workers *ws = calloc(1, sizeof *ws);
    if (!ws) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    *out = ws; /* from here on, rl_workers_stop ends whatever was started */
    ws->n = (int)s->rl.rollout_workers;
    ws->w = calloc((size_t)ws->n, sizeof *ws->w);
    if (!ws->w) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    TRY(alloc_results(ws, cap, s->rl.max_new_tokens, err));
    TRY(rendezvous(r, ws, err));
    TRY(start_all(r, ws, err));
    TRY(wait_serving(ws, err));
    drop_model_copy(r);
    TRY(connect_client(r, ws, err));
    for (int i = 0; i < ws->n; i++) log_info("rl: rollout worker %d serves on %s", i, ws->w[i].endpoint);
    return SMELT_OK;
}

/* ---- weights ---- */

int rl_workers_sync(struct rl_workers *ws, struct trainer_run *r, int64_t version, struct weightsync_report *report,
                    struct smelt_error *err) {
    if (ws->in_flight)
        return error_set(err, SMELT_EINVAL, "rl: weight sync while %lld samples are being generated",
                         (long long)ws->in_flight);
    TRY(check_alive(ws, "before the weight sync", err));
    int rc = r->lora ? rollout_client_push_lora(ws->client, r->lora, version, report, err)
                     : rollout_client_push_model(ws->client, r->model, version, report, err);
    if (rc) return client_failure(ws, rc, "during the weight sync", err);
    ws->version = version;
    return SMELT_OK;
}

/* ---- generating ---- */

/* Sample k of the batch into x, which must carry the version the trainer expects. */
static int take_sample(struct rl_workers *ws, int64_t k, int64_t version, struct rl_sample *x,
                       struct smelt_error *err) {
    if (ws->versions[k] != version) {
        const struct rl_worker *w = &ws->w[ws->made_by[k]];
        return error_set(err, SMELT_EBACKEND, "rl: rollout worker %d (%s) made sample %lld with policy version %lld; "
                         "the trainer expects version %lld (its weights did not arrive)", ws->made_by[k], w->endpoint,
                         (long long)k, (long long)ws->versions[k], (long long)version);
    }
    int64_t n = ws->n_tokens[k];
    x->ids = malloc((size_t)(n ? n : 1) * sizeof *x->ids);
    x->rollout_logp = malloc((size_t)(n ? n : 1) * sizeof *x->rollout_logp);
    if (!x->ids || !x->rollout_logp) return error_set(err, SMELT_ENOMEM, "rl: out of memory");
    memcpy(x->ids, ws->ids + k * ws->max_tokens, (size_t)n * sizeof *x->ids);
    memcpy(x->rollout_logp, ws->logprobs + k * ws->max_tokens, (size_t)n * sizeof *x->rollout_logp);
    x->n = n;
    x->finish_reason = ws->finish[k];
    return SMELT_OK;
}

int rl_workers_submit(struct rl_workers *ws, struct trainer_run *r, const struct rollout_request *q, int n_requests,
                      int64_t version, struct smelt_error *err) {
    int64_t total = 0;
    for (int i = 0; i < n_requests; i++) total += q[i].n;
    if (ws->in_flight)
        return error_set(err, SMELT_EINVAL, "rl: a generation of %lld samples is still in flight",
                         (long long)ws->in_flight);
    if (total > ws->cap)
        return error_set(err, SMELT_EINVAL, "rl: %lld samples at once, the workers' results hold %lld",
                         (long long)total, (long long)ws->cap);
    if (ws->version > version)
        return error_set(err, SMELT_EINVAL, "rl: the workers hold policy version %lld, newer than %lld",
                         (long long)ws->version, (long long)version);
    if (ws->version < version) { /* a resumed job: the workers hold the starting weights */
        struct weightsync_report rep;
        TRY(rl_workers_sync(ws, r, version, &rep, err));
    }
    struct rollout_client_results res = {.max_tokens = ws->max_tokens, .ids = ws->ids, .logprobs = ws->logprobs,
                                         .n_tokens = ws->n_tokens, .policy_version = ws->versions,
                                         .finish_reason = ws->finish, .worker = ws->made_by};
    TRY(check_alive(ws, "before generating", err));
    int rc = rollout_client_submit(ws->client, q, n_requests, &res, err);
    if (rc) return client_failure(ws, rc, "while generating", err);
    ws->in_flight = total;
    ws->in_flight_version = version;
    return SMELT_OK;
}

int rl_workers_collect(struct rl_workers *ws, struct rl_sample *out, struct smelt_error *err) {
    int64_t total = ws->in_flight;
    if (!total) return error_set(err, SMELT_EINVAL, "rl: no generation is in flight");
    ws->in_flight = 0;
    int rc = rollout_client_collect(ws->client, err);
    if (rc) return client_failure(ws, rc, "while generating", err);
    for (int64_t k = 0; k < total; k++) TRY(take_sample(ws, k, ws->in_flight_version, &out[k], err));
    return SMELT_OK;
}

int rl_workers_generate(struct rl_workers *ws, struct trainer_run *r, const struct rollout_request *q,
                        int n_requests, int64_t version, struct rl_sample *out, struct smelt_error *err) {
    TRY(rl_workers_submit(ws, r, q, n_requests, version, err));
    return rl_workers_collect(ws, out, err);
}

/* ---- stopping ---- */

static void signal_live(struct rl_workers *ws, int sig) {
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].pid > 0 && !reaped(&ws->w[i])) kill(ws->w[i].pid, sig);
}

static bool all_reaped(struct rl_workers *ws) {
    bool all = true;
    for (int i = 0; i < ws->n; i++) all = (ws->w[i].pid <= 0 || reaped(&ws->w[i])) && all;
    return all;
}

void rl_workers_stop(struct rl_workers *ws) {
    if (!ws) return;
    signal_live(ws, SIGTERM);
    int64_t deadline = mono_ms() + STOP_GRACE_MS;
    while (!all_reaped(ws) && mono_ms() < deadline) sleep_ms(5);
    for (int i = 0; i < ws->n; i++) {
        struct rl_worker *w = &ws->w[i];
        if (w->pid <= 0) continue;
        log_warn("rl: rollout worker %d (pid %d) did not stop within %d ms of SIGTERM: SIGKILL", i, (int)w->pid,
                 STOP_GRACE_MS);
        kill(w->pid, SIGKILL);
        while (waitpid(w->pid, &w->status, 0) < 0 && errno == EINTR) {
        }
        w->pid = 0;
    }
    rollout_client_free(ws->client);
    struct smelt_error e = {0};
    if (ws->store_dir[0] && dir_remove_all(ws->store_dir, &e))
        log_warn("rl: the weight sync's rendezvous folder stays: %s", e.message);
    free(ws->w);
    free(ws->ids);
    free(ws->logprobs);
    free(ws->n_tokens);
    free(ws->versions);
    free(ws->finish);
    free(ws->made_by);
    free(ws);
}
