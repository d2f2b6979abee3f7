/* smelt-tinker: the Tinker API's session worker (tinker/tinker.h). smeltd starts one per
 * Tinker session job; it connects a DEALER to smeltd's tinker ROUTER and serves until
 * SIGTERM / SIGINT (the request in hand is finished and answered, then exit 0).
 *
 * Keys (docs/security.md "Job channels"): smeltd's ROUTER is a CURVE server that admits a
 * worker only by the keypair of the job attempt it serves, which the worker gets in its
 * launch through an inherited pipe (common/secret_fd.h, read first thing): the DEALER is a
 * CURVE client with that keypair and smeltd's public key from the launch. Started by hand
 * (no SMELT_SECRETS_FD) it connects without CURVE, and smeltd never lets it in. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/common.h"
#include "common/curve.h"
#include "common/secret_fd.h"
#include "tinker/tinker.h"

#define LINGER_MS 1000

static void usage(FILE *out) {
    fprintf(out,
            "usage: smelt-tinker --model DIR --server ENDPOINT --job ID --attempt N [--metrics PATH]\n"
            "                    [--backend cpu|cuda] [--kv-cache-mb N] [--seed N]\n"
            "  --model DIR        the base model (HF directory; its tokenizer.json serves stop strings)\n"
            "  --server ENDPOINT  smeltd's tinker ROUTER (tcp://HOST:PORT)\n"
            "  --job ID --attempt N  the routing id is \"ID.N\"\n"
            "  --metrics PATH     append one JSON line per forward_backward and optim_step\n"
            "  --backend NAME     cpu, cuda or auto (default auto)\n"
            "  --kv-cache-mb N    the sampler's KV cache (default 256)\n"
            "  --seed N           seeds the seeds of sample requests that give none (default: time)\n");
}

struct options {
    const char *model, *server, *job, *metrics;
    int64_t attempt, kv_mb, seed;
    enum backend backend;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    const char *attempt = NULL, *backend = "auto", *kv = "256", *seed = "0";
    bool help = false;
    *o = (struct options){0};
    const struct args_option opts[] = {{"--model", &o->model, NULL},     {"--server", &o->server, NULL},
                                       {"--job", &o->job, NULL},         {"--attempt", &attempt, NULL},
                                       {"--metrics", &o->metrics, NULL}, {"--backend", &backend, NULL},
                                       {"--kv-cache-mb", &kv, NULL},     {"--seed", &seed, NULL},
                                       {"--help", NULL, &help},          {NULL, NULL, NULL}};
    TRY(args_parse(argc, argv, 1, opts, err));
    if (help) {
        usage(stdout);
        exit(0);
    }
    if (!o->model || !o->server || !o->job || !attempt)
        return error_set(err, SMELT_EINVAL, "--model, --server, --job and --attempt are required");
    if (!o->job[0] || strlen(o->job) > 200) return error_set(err, SMELT_EINVAL, "--job: 1..200 bytes");
    TRY(args_int("--attempt", attempt, 0, INT32_MAX, &o->attempt, err));
    TRY(args_int("--kv-cache-mb", kv, 1, 1ll << 24, &o->kv_mb, err));
    TRY(args_int("--seed", seed, 0, INT64_MAX, &o->seed, err));
    return error_wrap(err, backend_from_name(backend, &o->backend, err), "--backend");
}

/* The job's keys from the launch, read in main (present false: started by hand). */
static struct curve_job_keys job_keys;

static int open_dealer(void *ctx, const struct options *o, void **out, struct smelt_error *err) {
    char route[256];
    snprintf(route, sizeof route, "%s.%lld", o->job, (long long)o->attempt);
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    if (!s) return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = LINGER_MS, rc = SMELT_OK;
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) || zmq_setsockopt(s, ZMQ_ROUTING_ID, route, strlen(route)))
        rc = error_set(err, SMELT_EIO, "--server %s: %s", o->server, zmq_strerror(zmq_errno()));
    else if (job_keys.present &&
             curve_socket_client(s, &job_keys.worker, job_keys.server_public_key, err))
        rc = error_wrap(err, err->code, "--server %s: CURVE", o->server);
    else if (zmq_connect(s, o->server))
        rc = error_set(err, SMELT_EIO, "--server %s: %s", o->server, zmq_strerror(zmq_errno()));
    if (rc) {
        zmq_close(s);
        return rc;
    }
    *out = s;
    return SMELT_OK;
}

static int serve(const struct options *o, struct smelt_error *err) {
    struct tinker_config c = {.model_dir = o->model, .backend = o->backend, .kv_cache_bytes = o->kv_mb << 20,
                              .seed = (uint64_t)o->seed, .metrics_path = o->metrics};
    struct tinker_worker *w = NULL;
    void *ctx = NULL, *dealer = NULL;
    int rc = tinker_worker_create(&c, &w, err);
    if (!rc && !(ctx = zmq_ctx_new())) rc = error_set(err, SMELT_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    if (!rc) rc = open_dealer(ctx, o, &dealer, err);
    if (!rc) {
        log_info("%s on %s: serving %s.%lld at %s%s", o->model, backend_name(o->backend), o->job,
                 (long long)o->attempt, o->server, job_keys.present ? " (curve, the attempt's keys)" : "");
        if (!job_keys.present)
            log_warn("no launch keys (" SECRET_FD_ENV "): connecting without CURVE, which smeltd refuses");
        rc = tinker_serve(w, dealer, o->job, o->attempt, stop_flag(), err);
    }
    if (dealer) zmq_close(dealer);
    while (ctx && zmq_ctx_term(ctx) != 0 && zmq_errno() == EINTR) {
    }
    tinker_worker_free(w);
    return rc;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv); /* may re-execute this program: the keys' pipe survives it */
    struct options o;
    struct smelt_error err = {0};
    /* First: the descriptor and its variable reach no child of this process. */
    if (curve_job_keys_take(&job_keys, &err)) {
        fprintf(stderr, "smelt-tinker: %s\n", err.message);
        return 2;
    }
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "smelt-tinker: %s\n", err.message);
        usage(stderr);
        return 2;
    }
    if (stop_on_signals(&err)) {
        fprintf(stderr, "smelt-tinker: %s\n", err.message);
        return 1;
    }
    if (serve(&o, &err)) {
        fprintf(stderr, "smelt-tinker: %s\n", err.message);
        return 1;
    }
    log_info("stopped");
    return 0;
}
