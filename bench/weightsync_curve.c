/* weightsync_curve: the cost of CURVE on the ZeroMQ weight-sync path (issue 28;
 * docs/security.md "Job channels"). Full syncs of a random Llama's f32 weights go from
 * this process through rollout/client.c (the trainer's sender, buckets as weights.bucket
 * messages) to two real smelt-rollout processes on loopback serving the same model: one
 * plain, one with --key-file (CURVE: every byte encrypted and authenticated, ZAP admits
 * only the key). Both in the same run, syncs alternating between them, so the machine's
 * load falls on both alike. Prints one JSON object per size: bytes per sync, the median
 * bytes/s of each (begin until the worker's ack: sending, receiving, checking XXH64 and
 * applying) and plain / curve.
 *
 *   weightsync_curve [--mib N[,N...]] [--syncs K] [--bucket-mib B]
 *
 * --mib: model sizes in MiB of f32 (default 8: what `make bench` runs, a few seconds);
 * the model is examples/tiny's Llama widened to hidden 512 / MLP 1536 with as many
 * layers as make the size (13.5 MiB a layer). --syncs: timed syncs per worker and size
 * (default 3; one untimed sync each first). --bucket-mib: the sync's bucket (default
 * weightsync's 32). Worker logs and the model copies live in a temporary folder, removed
 * at the end. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "common/curve.h"
#include "model/model.h"
#include "rollout/rollout.h"
#include "weightsync/weightsync.h"

#define MAX_SIZES 8
#define MAX_SYNCS 64
#define SERVING "smelt-rollout: serving on "
#define START_MS 300000

struct options {
    int32_t *mib;
    int64_t n_sizes, syncs, bucket_mib;
};

/* One smelt-rollout process and its client. */
struct worker {
    const char *name;             /* "plain" or "curve" */
    pid_t pid;
    char log[512], endpoint[ROLLOUT_CLIENT_ENDPOINT_BYTES];
    struct rollout_client *client;
    double rate[MAX_SYNCS];       /* bytes/s of each timed sync */
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    const char *mib = "8", *syncs = "3", *bucket = "32";
    const struct args_option opts[] = {{"--mib", &mib, NULL}, {"--syncs", &syncs, NULL},
                                       {"--bucket-mib", &bucket, NULL}, {NULL, NULL, NULL}};
    TRY(args_parse(argc, argv, 1, opts, err));
    TRY(args_int_list("--mib", mib, 1, 4096, &o->mib, &o->n_sizes, err));
    if (o->n_sizes > MAX_SIZES) return error_set(err, SMELT_EINVAL, "--mib: at most %d sizes", MAX_SIZES);
    TRY(args_int("--syncs", syncs, 1, MAX_SYNCS, &o->syncs, err));
    return args_int("--bucket-mib", bucket, 1, WEIGHTSYNC_MAX_BUCKET_BYTES >> 20, &o->bucket_mib, err);
}

/* ---- the model ---- */

/* examples/tiny widened, with layers enough for about mib MiB of f32. */
static int make_model(int64_t mib, struct model **out, struct smelt_error *err) {
    struct model_config c;
    TRY(model_config_load("examples/tiny", &c, err));
    c.hidden_size = 512;
    c.intermediate_size = 1536;
    c.n_heads = c.n_kv_heads = 16;
    c.head_dim = 32;
    int64_t layer_bytes = 4 * (4 * c.hidden_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size);
    c.n_layers = ((mib << 20) + layer_bytes / 2) / layer_bytes;
    if (c.n_layers < 1) c.n_layers = 1;
    return model_init_random(&c, 1, BACKEND_CPU, out, err);
}

/* ---- the workers ---- */

/* smelt-rollout beside this program's folder (BUILD/bench/.. -> BUILD/smelt-rollout). */
static int program(char *out, size_t cap, struct smelt_error *err) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return error_set(err, SMELT_EIO, "cannot find this program (/proc/self/exe)");
    exe[n] = 0;
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
    }
    int len = snprintf(out, cap, "%s/smelt-rollout", exe);
    if (len < 0 || (size_t)len >= cap || access(out, X_OK) != 0)
        return error_set(err, SMELT_ENOTFOUND, "%s is missing (make)", out);
    return SMELT_OK;
}

static int start_worker(struct worker *w, const char *dir, const char *model_dir, const char *key_file,
                        struct smelt_error *err) {
    char prog[4096];
    TRY(program(prog, sizeof prog, err));
    snprintf(w->log, sizeof w->log, "%s/%s.log", dir, w->name);
    const char *argv[] = {prog, "--model", model_dir, "--bind", "tcp://127.0.0.1:*", "--kv-memory-mb", "4",
                          "--max-batch-tokens", "64", "--max-seqs", "1", "--backend", "cpu",
                          key_file ? "--key-file" : NULL, key_file, NULL};
    int log_fd = open_above_stdio(w->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log_fd < 0) return error_set(err, SMELT_EIO, "%s: cannot open", w->log);
    extern char **environ;
    struct spawn_plan p;
    spawn_plan_init(&p, argv, environ);
    p.out_fd = p.err_fd = log_fd;
    w->pid = spawn_start(&p);
    close(log_fd);
    return w->pid > 0 ? SMELT_OK : error_set(err, SMELT_EIO, "starting smelt-rollout failed");
}

/* Until w's log names its endpoint. */
static int wait_serving(struct worker *w, struct smelt_error *err) {
    for (int64_t deadline = mono_ms() + START_MS; mono_ms() < deadline; sleep_ms(20)) {
        char *text = NULL;
        size_t len = 0;
        struct smelt_error ignore = {0};
        const char *at = file_read_all(w->log, &text, &len, &ignore) ? NULL : strstr(text, SERVING);
        const char *eol = at ? strchr(at, '\n') : NULL;
        if (eol) snprintf(w->endpoint, sizeof w->endpoint, "%.*s", (int)(eol - at - strlen(SERVING)), at + strlen(SERVING));
        free(text);
        if (w->endpoint[0]) return SMELT_OK;
        int status;
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
            w->pid = 0;
            return error_set(err, SMELT_EIO, "the %s worker ended before serving (see %s)", w->name, w->log);
        }
    }
    return error_set(err, SMELT_EIO, "the %s worker did not serve (see %s)", w->name, w->log);
}

static int connect_worker(struct worker *w, const struct curve_keypair *keys, int64_t bucket_bytes,
                          struct smelt_error *err) {
    const char *eps[1] = {w->endpoint};
    struct rollout_client_config cc = {.endpoints = eps, .n_endpoints = 1, .bucket_bytes = bucket_bytes,
                                       .curve_keys = keys, .curve_server_key = keys ? keys->public_key : NULL};
    return rollout_client_create(&cc, &w->client, err);
}

static void stop_worker(struct worker *w) {
    rollout_client_free(w->client);
    w->client = NULL;
    if (w->pid <= 0) return;
    kill(w->pid, SIGTERM);
    int status;
    waitpid(w->pid, &status, 0);
    w->pid = 0;
}

/* ---- one size ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One untimed sync to each, then `syncs` timed ones alternating plain and curve. */
static int measure(struct worker *w, const struct model *m, int64_t syncs, struct smelt_error *err) {
    for (int64_t k = 0; k <= syncs; k++)
        for (int i = 0; i < 2; i++) {
            struct weightsync_report rep;
            TRY(error_wrap(err, rollout_client_push_model(w[i].client, m, k + 1, &rep, err), "%s sync", w[i].name));
            if (k > 0) w[i].rate[k - 1] = (double)rep.bytes / rep.seconds;
        }
    return SMELT_OK;
}

static int run_size(const struct options *o, int64_t mib, const char *dir, struct smelt_error *err) {
    struct model *m = NULL;
    struct curve_keypair keys;
    char model_dir[600], key_file[600];
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    snprintf(key_file, sizeof key_file, "%s/rollout.key", dir);
    struct worker w[2] = {{.name = "plain"}, {.name = "curve"}};
    int rc = make_model(mib, &m, err);
    if (!rc) rc = dir_remove_all(model_dir, err);
    if (!rc) rc = model_save(m, model_dir, false, err);
    if (!rc) rc = curve_keypair_new(&keys, err);
    if (!rc) unlink(key_file);
    if (!rc) rc = curve_key_file_write(key_file, &keys, NULL, err);
    if (!rc) rc = start_worker(&w[0], dir, model_dir, NULL, err);
    if (!rc) rc = start_worker(&w[1], dir, model_dir, key_file, err);
    for (int i = 0; !rc && i < 2; i++) rc = wait_serving(&w[i], err);
    for (int i = 0; !rc && i < 2; i++) rc = connect_worker(&w[i], i ? &keys : NULL, o->bucket_mib << 20, err);
    if (!rc) rc = measure(w, m, o->syncs, err);
    if (!rc) {
        double plain = median(w[0].rate, o->syncs), curve = median(w[1].rate, o->syncs);
        printf("{\"bench\": \"weightsync_curve\", \"bytes\": %lld, \"bucket_bytes\": %lld, \"syncs\": %lld, "
               "\"plain_bytes_per_s\": %.0f, \"curve_bytes_per_s\": %.0f, \"plain_over_curve\": %.3f}\n",
               (long long)(m->n_weights * 4), (long long)(o->bucket_mib << 20), (long long)o->syncs, plain, curve,
               plain / curve);
        fflush(stdout);
    }
    for (int i = 0; i < 2; i++) stop_worker(&w[i]);
    model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    struct options o = {0};
    struct smelt_error err = {0};
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "weightsync_curve: %s\n", err.message);
        return 2;
    }
    char dir[] = "/tmp/smelt-weightsync-curve-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("weightsync_curve: mkdtemp");
        return 1;
    }
    int rc = 0;
    for (int64_t i = 0; !rc && i < o.n_sizes; i++) rc = run_size(&o, o.mib[i], dir, &err);
    if (rc) fprintf(stderr, "weightsync_curve: %s\n", err.message);
    struct smelt_error ignore = {0};
    dir_remove_all(dir, &ignore);
    free(o.mib);
    return rc ? 1 : 0;
}
