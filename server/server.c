/* server_run: folders, store, first admin key, the Tinker dispatcher, control loop (+ embedded
 * agent), HTTP. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/common.h"
#include "server/server_internal.h"
#include "server/tinker_api.h"

static int absolute_dir(const char *path, char *out, size_t cap, struct smelt_error *err) {
    int rc = dir_create_all(path, err);
    if (rc) return rc;
    char real[PATH_MAX];
    if (!realpath(path, real)) return error_set(err, SMELT_EIO, "%s: cannot resolve the path", path);
    size_t len = strlen(real);
    if (len >= cap) return error_set(err, SMELT_EINVAL, "%s: path too long", path);
    memcpy(out, real, len + 1);
    return 0;
}

static int self_dir(char *out, size_t cap, struct smelt_error *err) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return error_set(err, SMELT_EIO, "cannot find this program's folder (/proc/self/exe)");
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    size_t len = strlen(exe);
    if (len >= cap) return error_set(err, SMELT_EINVAL, "program folder path too long");
    memcpy(out, exe, len + 1);
    return 0;
}

static int setup_paths(struct server *s, struct smelt_error *err) {
    const struct server_config *c = &s->config;
    int rc = absolute_dir(c->data_dir ? c->data_dir : "var", s->data_dir, sizeof s->data_dir, err);
    if (rc) return error_wrap(err, rc, "data directory");
    char tmp[SERVER_PATH_BYTES + 32];
    snprintf(tmp, sizeof tmp, "%s/models", s->data_dir);
    rc = absolute_dir(c->models_dir ? c->models_dir : tmp, s->models_dir, sizeof s->models_dir, err);
    if (rc) return error_wrap(err, rc, "models directory");
    snprintf(tmp, sizeof tmp, "%s/files", s->data_dir);
    if ((rc = absolute_dir(tmp, s->files_dir, sizeof s->files_dir, err))) return rc;
    snprintf(tmp, sizeof tmp, "%s/jobs", s->data_dir);
    if ((rc = absolute_dir(tmp, s->jobs_dir, sizeof s->jobs_dir, err))) return rc;

    char bin[SERVER_PATH_BYTES];
    if (c->bin_dir) snprintf(bin, sizeof bin, "%s", c->bin_dir);
    else if ((rc = self_dir(bin, sizeof bin, err))) return rc;
    char real[PATH_MAX];
    if (!realpath(bin, real)) return error_set(err, SMELT_ENOTFOUND, "%s: no such folder (bin_dir)", bin);
    if (snprintf(s->trainer_path, sizeof s->trainer_path, "%s/smelt-trainer", real) >= (int)sizeof s->trainer_path)
        return error_set(err, SMELT_EINVAL, "bin_dir path too long");
    if (access(s->trainer_path, X_OK) != 0)
        log_warn("smeltd: %s is missing or not executable; jobs will fail to start", s->trainer_path);
    if (snprintf(s->tinker_path, sizeof s->tinker_path, "%s/smelt-tinker", real) >= (int)sizeof s->tinker_path)
        return error_set(err, SMELT_EINVAL, "bin_dir path too long");
    if (access(s->tinker_path, X_OK) != 0)
        log_warn("smeltd: %s is missing or not executable; Tinker sessions will fail to start", s->tinker_path);
    char web[PATH_MAX + 32];
    if (c->web_dir) snprintf(web, sizeof web, "%s", c->web_dir);
    else snprintf(web, sizeof web, "%s/../server/web", real);
    if (!realpath(web, real) || strlen(real) >= sizeof s->web_dir) {
        log_warn("smeltd: web page folder %s not found; / answers 404", web);
        s->web_dir[0] = 0;
    } else {
        memcpy(s->web_dir, real, strlen(real) + 1);
    }
    return 0;
}

/* smeltd's CURVE keys, made on the first start and kept in the data directory (only the
 * server reads them), and the ZAP handler of its ZeroMQ context. */
static int server_curve_start(struct server *s, struct smelt_error *err) {
    char path[SERVER_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/server.key", s->data_dir);
    int rc = curve_key_file_load_or_create(path, &s->curve, err);
    if (rc) return error_wrap(err, rc, "smeltd's CURVE keys");
    return zap_handler_start(s->zmq, &s->zap, err);
}

int server_run(const struct server_config *config, struct smelt_error *err) {
    struct server *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, SMELT_ENOMEM, "out of memory");
    s->config = *config;
    s->started_at = server_now();
    int rc = setup_paths(s, err);
    char db[SERVER_PATH_BYTES + 16];
    if (rc == 0) {
        snprintf(db, sizeof db, "%s/smelt.db", s->data_dir);
        rc = store_open(db, &s->store, err);
    }
    if (rc == 0) rc = server_auth_bootstrap(s, err);
    if (rc == 0) {
        s->zmq = zmq_ctx_new();
        if (!s->zmq) rc = error_set(err, SMELT_EIO, "zmq_ctx_new failed");
    }
    if (rc == 0) rc = server_curve_start(s, err);
    /* before the control loop: it launches session workers at this endpoint, and must
     * not see the last run's session jobs as its own */
    if (rc == 0) rc = tinker_dispatch_start(s, err);
    if (rc == 0) rc = rendezvous_start(s, err); /* before the control loop: trainers get its endpoint */
    if (rc == 0) rc = tinker_api_start(s, err);
    if (rc == 0) rc = tinker_jobs_recover(s, err);
    if (rc == 0) rc = control_start(s, err);
    if (rc == 0) {
        struct http_config hc = {
            .listen_address = config->listen_address ? config->listen_address : "127.0.0.1",
            .port = config->port,
            .threads = config->http_threads > 0 ? config->http_threads : 8,
            .max_body_bytes = 1 << 20,
            .max_upload_bytes = config->max_upload_bytes ? config->max_upload_bytes : (size_t)512 << 20,
            .routes = SERVER_ROUTES,
            .n_routes = SERVER_N_ROUTES,
            .auth = server_auth,
            .app = s,
        };
        struct http_server *http = NULL;
        rc = http_server_start(&hc, &http, err);
        if (rc == 0) {
            atomic_store(&s->http, http);
            int port = http_server_port(http);
            log_info("smeltd: listening on http://%s:%d (data in %s, models in %s)", hc.listen_address, port,
                     s->data_dir, s->models_dir);
            if (config->port_file) {
                char text[32];
                int n = snprintf(text, sizeof text, "%d\n", port);
                rc = file_write_atomic(config->port_file, text, (size_t)n, err);
            }
        }
    }
    while (rc == 0 && !(config->stop && atomic_load(config->stop))) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* The control loop first: it wakes the HTTP server's SSE streams, which must outlive it. */
    control_stop(s);
    tinker_dispatch_stop(s); /* before HTTP: its thread wakes the HTTP server's long polls */
    http_server_stop(atomic_exchange(&s->http, NULL));
    tinker_dispatch_free(s); /* after HTTP: handlers submit to it (refused once stopped) */
    tinker_api_stop(s);
    rendezvous_free(s);
    zap_handler_stop(s->zap); /* its socket too must be closed before the context ends */
    if (s->zmq) zmq_ctx_term(s->zmq);
    store_close(s->store);
    free(s);
    return rc;
}
