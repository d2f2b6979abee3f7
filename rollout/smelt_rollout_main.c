/* smelt-rollout: the generation engine served on a ZeroMQ ROUTER socket (the messages
 * are common/msg.h's gen.* / health.* / stats.* / weights.*; the loop is rollout/worker.c).
 * New weights arrive as weights.* syncs from the trainer: "full" into the model, "lora"
 * into the --adapter's buffer (a worker started without --adapter refuses "lora").
 *
 *   smelt-rollout --model DIR [--adapter DIR] [--tokenizer PATH] [--bind ENDPOINT]
 *                 [--kv-memory-mb N] [--max-batch-tokens N] [--max-seqs N]
 *                 [--prefill-chunk N] [--backend cpu|cuda|auto] [--batch-invariant]
 *                 [--weights-comm file:DIR --weights-comm-name ID --weights-comm-rank R
 *                  --weights-comm-size N] [--key-file FILE]
 *
 * CURVE (docs/security.md "Job channels"): started by a trainer that holds its job's keys,
 * it gets them through an inherited pipe (common/secret_fd.h, read once at start) and its
 * ROUTER is a CURVE server with the job's keypair whose ZAP handler admits only the job's
 * public key: the trainer, holding the job's secret, and no one else. --key-file FILE (a
 * common/curve.h key file) does the same for a worker started by hand: only a client
 * showing the file's key gets in. Neither: a plain socket, open to anyone who reaches it.
 *
 * Prints "smelt-rollout: serving on ENDPOINT" to stderr once bound (the real port when
 * --bind asks for tcp://HOST:*). SIGTERM / SIGINT stop it: requests still in flight get
 * gen.error, everything is freed.
 *
 * Exit status: 0 stopped by a signal, 1 failed (model, adapter, tokenizer, socket),
 * 2 bad usage. */
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
#include "lora/lora.h"
#include "model/model.h"
#include "rollout/rollout.h"

#define DEFAULT_BIND "tcp://127.0.0.1:7080"
/* A client not reading its results gets this many queued before it counts as gone. */
#define SEND_QUEUE_MESSAGES 100000
/* How long closing waits to deliver the last replies (the gen.errors of a stop). */
#define LINGER_MS 1000

static void usage(FILE *f) {
    fprintf(f, "usage: smelt-rollout --model DIR [--adapter DIR] [--tokenizer PATH] [--bind ENDPOINT]\n"
               "         [--kv-memory-mb N] [--max-batch-tokens N] [--max-seqs N] [--prefill-chunk N]\n"
               "         [--backend cpu|cuda|auto] [--batch-invariant]\n"
               "         [--weights-comm file:DIR --weights-comm-name ID --weights-comm-rank R\n"
               "          --weights-comm-size N] [--key-file FILE]\n"
               "  --adapter      a PEFT LoRA adapter directory, applied without merging (and the one\n"
               "                 that \"lora\" weight syncs update)\n"
               "  --tokenizer    tokenizer.json or its folder (default: the model's, when it has one;\n"
               "                 without one, prompts are token ids and results carry no text)\n"
               "  --bind         ZeroMQ endpoint of the ROUTER socket (default " DEFAULT_BIND ";\n"
               "                 tcp://HOST:* picks a free port)\n"
               "  --kv-memory-mb KV cache size (default 1024); --max-batch-tokens tokens per step\n"
               "                 (default 2048); --max-seqs sequences at once (default 64);\n"
               "                 --prefill-chunk prompt tokens of one sequence per step (default 512)\n"
               "  --batch-invariant  logprobs with the bits the trainer computes for the same tokens\n"
               "                 (ops_set_batch_invariant; CPU backend only: refused on cuda)\n"
               "  --weights-comm the rendezvous store of weight syncs by broadcast (comm/: Gloo); with\n"
               "                 --weights-comm-name (the job id in it), --weights-comm-rank (this worker's\n"
               "                 group rank, 1..N-1; the trainer is 0) and --weights-comm-size (N). Without\n"
               "                 them, syncs by broadcast are refused (field \"transport\")\n"
               "  --key-file     a CURVE key file (JSON, mode 0600; docs/security.md): the socket admits\n"
               "                 only clients holding the same key (a worker started by a trainer gets\n"
               "                 its job's keys from it instead)\n"
               "  protocol: common/msg.h (gen.request, gen.abort, health.request, stats.request,\n"
               "            weights.begin / weights.bucket / weights.end)\n");
}

struct options {
    const char *model_dir, *adapter_dir, *tokenizer, *bind, *key_file;
    const char *comm, *comm_name;  /* --weights-comm, --weights-comm-name */
    int64_t comm_rank, comm_size;
    enum backend backend;
    bool batch_invariant;
    struct rollout_config engine;
};

static int parse(int argc, char **argv, struct options *o, struct smelt_error *err) {
    *o = (struct options){.bind = DEFAULT_BIND,
                          .engine = {.kv_memory_bytes = 1024ll << 20, .max_batch_tokens = 2048, .max_seqs = 64,
                                     .prefill_chunk = 512}};
    const char *backend = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--batch-invariant") == 0) { /* the one flag without a value */
            o->batch_invariant = true;
            continue;
        }
        int rc = args_value(argc, argv, &i, &v, err);
        if (rc) return rc;
        int64_t n;
        if (strcmp(a, "--model") == 0) o->model_dir = v;
        else if (strcmp(a, "--adapter") == 0) o->adapter_dir = v;
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = v;
        else if (strcmp(a, "--bind") == 0) o->bind = v;
        else if (strcmp(a, "--key-file") == 0) o->key_file = v;
        else if (strcmp(a, "--backend") == 0) backend = v;
        else if (strcmp(a, "--kv-memory-mb") == 0) {
            if (!(rc = args_int(a, v, 1, 1ll << 24, &n, err))) o->engine.kv_memory_bytes = n << 20;
        } else if (strcmp(a, "--max-batch-tokens") == 0) {
            if (!(rc = args_int(a, v, 1, 1 << 24, &n, err))) o->engine.max_batch_tokens = n;
        } else if (strcmp(a, "--max-seqs") == 0) {
            if (!(rc = args_int(a, v, 1, 65536, &n, err))) o->engine.max_seqs = (int)n;
        } else if (strcmp(a, "--prefill-chunk") == 0) {
            if (!(rc = args_int(a, v, 1, 1 << 24, &n, err))) o->engine.prefill_chunk = n;
        } else if (strcmp(a, "--weights-comm") == 0) o->comm = v;
        else if (strcmp(a, "--weights-comm-name") == 0) o->comm_name = v;
        else if (strcmp(a, "--weights-comm-rank") == 0) rc = args_int(a, v, 1, 65535, &o->comm_rank, err);
        else if (strcmp(a, "--weights-comm-size") == 0) rc = args_int(a, v, 2, 65536, &o->comm_size, err);
        else
            return error_set(err, SMELT_EINVAL, "unknown option %s", a);
        if (rc) return rc;
    }
    if (!o->model_dir) return error_set(err, SMELT_EINVAL, "--model is required");
    if (!o->bind[0]) return error_set(err, SMELT_EINVAL, "--bind: empty endpoint");
    bool any = o->comm || o->comm_name || o->comm_rank || o->comm_size;
    if (any && (!o->comm || !o->comm_name || !o->comm_rank || !o->comm_size))
        return error_set(err, SMELT_EINVAL, "--weights-comm, --weights-comm-name, --weights-comm-rank and "
                         "--weights-comm-size go together");
    if (any && o->comm_rank >= o->comm_size)
        return error_set(err, SMELT_EINVAL, "--weights-comm-rank %lld is not below --weights-comm-size %lld",
                         (long long)o->comm_rank, (long long)o->comm_size);
    TRY(error_wrap(err, backend_from_name(backend, &o->backend, err), "--backend"));
    /* Process-wide, before the model exists: every op of this worker runs in the mode.
     * A backend without it (CUDA) refuses, and that is bad usage. */
    if (o->batch_invariant)
        TRY(error_wrap(err, ops_set_batch_invariant(o->backend, true, err), "--batch-invariant"));
    return SMELT_OK;
}

/* --tokenizer, else the model directory's tokenizer.json, else none. */
static int load_tokenizer(const struct options *o, const struct model *m, struct tokenizer **out,
                          struct smelt_error *err) {
    *out = NULL;
    const char *path = o->tokenizer;
    if (!path) {
        char file[4096];
        int rc = path_join(file, sizeof file, o->model_dir, "tokenizer.json", err);
        if (rc) return rc;
        if (!path_exists(file)) {
            log_info("%s has no tokenizer.json: prompts are token ids, results carry no text", o->model_dir);
            return SMELT_OK;
        }
        path = o->model_dir;
    }
    TRY(error_wrap(err, tokenizer_load(path, out, err), "tokenizer"));
    if (tokenizer_vocab_size(*out) > m->config.vocab_size)
        return error_set(err, SMELT_EINVAL, "tokenizer %s: %d ids do not fit the model's vocab_size %lld", path,
                         tokenizer_vocab_size(*out), (long long)m->config.vocab_size);
    return SMELT_OK;
}

/* Who may connect: with CURVE on, clients showing `admitted`'s public key (the job's).
 * The ZAP handler is this process's context's own. */
struct channel_keys {
    bool curve;
    struct curve_keypair self;
    struct curve_single_key admitted;
    struct zap_handler *zap;
};

/* The launch's keys (taken in main), else --key-file's, else none. */
static int channel_keys_of(const struct options *o, const struct curve_job_keys *job, struct channel_keys *k,
                           struct smelt_error *err) {
    memset(k, 0, sizeof *k);
    if (job->present && o->key_file)
        return error_set_field(err, SMELT_EINVAL, "--key-file", "--key-file: this worker has its job's keys from "
                               "its launch (%s); give one or the other", SECRET_FD_ENV);
    if (job->present) k->self = job->worker;
    else if (o->key_file) TRY(error_wrap(err, curve_key_file_read(o->key_file, &k->self, NULL, err), "--key-file"));
    else return SMELT_OK;
    k->curve = true;
    memcpy(k->admitted.public_key, k->self.public_key, CURVE_KEY_BYTES);
    snprintf(k->admitted.user_id, sizeof k->admitted.user_id, "%s", job->present ? "job" : "key-file");
    return SMELT_OK;
}

/* Before bind: the socket a CURVE server admitting only k's key. */
static int secure_router(void *ctx, void *s, struct channel_keys *k, struct smelt_error *err) {
    if (!k->curve) return SMELT_OK;
    TRY(zap_handler_start(ctx, &k->zap, err));
    TRY(zap_handler_add_domain(k->zap, "rollout", curve_authorize_single_key, &k->admitted, err));
    return curve_socket_server(s, &k->self, "rollout", err);
}

/* A ROUTER bound to endpoint; bound receives the endpoint as ZeroMQ resolved it. */
static int open_router(void *ctx, const char *endpoint, struct channel_keys *k, void **out, char *bound,
                       size_t bound_bytes, struct smelt_error *err) {
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    if (!s) return error_set(err, SMELT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    int linger = LINGER_MS, hwm = SEND_QUEUE_MESSAGES;
    size_t len = bound_bytes;
    int rc = SMELT_OK;
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) || zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm))
        rc = error_set(err, SMELT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    else if (secure_router(ctx, s, k, err))
        rc = error_wrap(err, err->code, "CURVE");
    else if (zmq_bind(s, endpoint))
        rc = error_set(err, SMELT_EIO, "--bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
    else if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, bound, &len))
        rc = error_set(err, SMELT_EIO, "ZMQ_LAST_ENDPOINT: %s", zmq_strerror(zmq_errno()));
    if (rc) {
        zmq_close(s);
        return rc;
    }
    *out = s;
    return SMELT_OK;
}

static int serve(const struct options *o, const struct curve_job_keys *job, struct smelt_error *err) {
    struct channel_keys keys;
    TRY(channel_keys_of(o, job, &keys, err));
    struct model *m = NULL;
    struct lora *adapter = NULL;
    struct tokenizer *tok = NULL;
    struct rollout_engine *engine = NULL;
    void *ctx = NULL, *router = NULL;
    char bound[512] = "";
    int rc = model_load(o->model_dir, o->backend, &m, err);
    if (rc) error_wrap(err, rc, "--model %s", o->model_dir);
    if (!rc && o->adapter_dir) {
        rc = lora_load(m, o->adapter_dir, &adapter, err);
        if (!rc) rc = lora_attach(adapter, err);
        if (rc) error_wrap(err, rc, "--adapter %s", o->adapter_dir);
    }
    if (!rc) rc = load_tokenizer(o, m, &tok, err);
    if (!rc) rc = rollout_engine_create(m, tok, &o->engine, &engine, err);
    if (!rc && !(ctx = zmq_ctx_new())) rc = error_set(err, SMELT_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    if (!rc) rc = open_router(ctx, o->bind, &keys, &router, bound, sizeof bound, err);
    if (!rc) {
        struct rollout_stats st = rollout_engine_stats(engine);
        log_info("%s on %s%s%s%s: %lld KV blocks of %d tokens, %lld tokens and %d sequences per step", o->model_dir,
                 backend_name(o->backend), o->batch_invariant ? " (batch-invariant)" : "",
                 adapter ? ", adapter " : "", adapter ? o->adapter_dir : "", (long long)st.n_blocks,
                 ROLLOUT_KV_BLOCK_TOKENS, (long long)o->engine.max_batch_tokens, o->engine.max_seqs);
        if (keys.curve)
            log_info("curve: encrypted, and only clients holding the %s key (public %.8s...) are let in",
                     job->present ? "job's" : "--key-file's", keys.self.public_key);
        else
            log_warn("no CURVE keys (no launch keys, no --key-file): anyone who reaches %s may connect", bound);
        fprintf(stderr, "smelt-rollout: serving on %s\n", bound);
        struct rollout_worker_setup setup = {.engine = engine, .model = m, .tok = tok, .adapter = adapter,
                                             .router = router, .stop = stop_flag(), .weights_comm = o->comm,
                                             .weights_comm_name = o->comm_name,
                                             .weights_comm_rank = (int)o->comm_rank,
                                             .weights_comm_size = (int)o->comm_size};
        rc = rollout_worker_run(&setup, err);
    }
    if (router) zmq_close(router);
    zap_handler_stop(keys.zap); /* after its sockets, before the context ends */
    explicit_bzero(&keys, sizeof keys);
    while (ctx && zmq_ctx_term(ctx) != 0 && zmq_errno() == EINTR) {
    }
    rollout_engine_free(engine);
    lora_free(adapter);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    backend_cpu_select_kernels(argv); /* may re-execute this program: the pipe and variable survive it */
    struct options o;
    struct smelt_error err = {0};
    /* First: the descriptor and its variable reach no child of this process. */
    struct curve_job_keys job;
    if (curve_job_keys_take(&job, &err)) {
        fprintf(stderr, "smelt-rollout: %s\n", err.message);
        return 1;
    }
    if (parse(argc, argv, &o, &err)) {
        fprintf(stderr, "smelt-rollout: %s\n", err.message);
        usage(stderr);
        return 2;
    }
    if (stop_on_signals(&err)) {
        fprintf(stderr, "smelt-rollout: %s\n", err.message);
        return 1;
    }
    int rc = serve(&o, &job, &err);
    explicit_bzero(&job, sizeof job);
    if (rc) {
        fprintf(stderr, "smelt-rollout: %s\n", err.message);
        return 1;
    }
    log_info("stopped");
    return 0;
}
