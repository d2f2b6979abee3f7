/* common/curve.h, zap.c, secret_fd.h: keys and key files, CURVE sockets admitted or refused
 * by the ZAP handler (with the user id on every message), and secrets handed to a child
 * through an inherited pipe. */
#include "tests/unit/testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/curve.h"
#include "common/msg.h"
#include "common/secret_fd.h"
#include "common/spawn.h"

Test(curve, keys_and_validation) {
    struct smelt_error err;
    struct curve_keypair a, b;
    cr_assert_eq(curve_keypair_new(&a, &err), 0, "%s", err.message);
    cr_assert_eq(curve_keypair_new(&b, &err), 0, "%s", err.message);
    cr_expect(curve_key_valid(a.public_key) && curve_key_valid(a.secret_key));
    cr_expect_str_neq(a.secret_key, b.secret_key);
    char pub[CURVE_KEY_BYTES];
    cr_assert_eq(curve_public_of(a.secret_key, pub, "secret_key", &err), 0);
    cr_expect_str_eq(pub, a.public_key);
    cr_expect(!curve_key_valid(NULL));
    cr_expect(!curve_key_valid(""));
    cr_expect(!curve_key_valid("short"));
    char bad[CURVE_KEY_BYTES];
    memcpy(bad, a.public_key, sizeof bad);
    bad[7] = '"'; /* not in the Z85 alphabet */
    cr_expect(!curve_key_valid(bad));
    cr_expect_eq(curve_public_of(bad, pub, "credential.secret_key", &err), SMELT_EINVAL);
    cr_expect_str_eq(err.field, "credential.secret_key");
}

Test(curve, key_files, .init = test_tmp_setup, .fini = test_tmp_teardown) {
    struct smelt_error err;
    char path[256], other[256];
    snprintf(path, sizeof path, "%s/agent.key", test_tmp_dir);
    snprintf(other, sizeof other, "%s/server.key", test_tmp_dir);
    struct curve_keypair k, back, server, again;
    cr_assert_eq(curve_keypair_new(&k, &err), 0);
    json_t *extra = json_pack("{s:s}", "agent_id", "gpu-node-3");
    cr_assert_eq(curve_key_file_write(path, &k, extra, &err), 0, "%s", err.message);
    json_decref(extra);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600);
    cr_expect_eq(curve_key_file_write(path, &k, NULL, &err), SMELT_EIO, "an existing key file is never overwritten");
    json_t *doc = NULL;
    cr_assert_eq(curve_key_file_read(path, &back, &doc, &err), 0, "%s", err.message);
    cr_expect_str_eq(back.secret_key, k.secret_key);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "agent_id")), "gpu-node-3");
    json_decref(doc);

    chmod(path, 0640);
    cr_expect_eq(curve_key_file_read(path, &back, NULL, &err), SMELT_EINVAL);
    cr_expect(strstr(err.message, "chmod 600"), "%s", err.message);

    /* A public key that is not the secret's: refused, naming it. */
    cr_assert_eq(curve_keypair_new(&server, &err), 0);
    unlink(path);
    struct curve_keypair mixed = k;
    memcpy(mixed.public_key, server.public_key, sizeof mixed.public_key);
    cr_assert_eq(curve_key_file_write(path, &mixed, NULL, &err), 0);
    cr_expect_eq(curve_key_file_read(path, &back, NULL, &err), SMELT_EFORMAT);
    cr_expect_str_eq(err.field, "public_key");

    cr_assert_eq(curve_key_file_load_or_create(other, &server, &err), 0, "%s", err.message);
    cr_assert_eq(curve_key_file_load_or_create(other, &again, &err), 0, "%s", err.message);
    cr_expect_str_eq(server.secret_key, again.secret_key, "made once, then loaded");
}

/* A ROUTER CURVE server admitting only `allowed`'s key, with user id "job-7.1". */
struct curve_fixture {
    void *ctx, *router;
    struct zap_handler *zap;
    struct curve_keypair server, allowed;
    struct curve_single_key single;
    char endpoint[64];
};

static void fixture_open(struct curve_fixture *f) {
    struct smelt_error err;
    memset(f, 0, sizeof *f);
    f->ctx = zmq_ctx_new();
    cr_assert(f->ctx);
    cr_assert_eq(curve_keypair_new(&f->server, &err), 0);
    cr_assert_eq(curve_keypair_new(&f->allowed, &err), 0);
    memcpy(f->single.public_key, f->allowed.public_key, CURVE_KEY_BYTES);
    snprintf(f->single.user_id, sizeof f->single.user_id, "job-7.1");
    cr_assert_eq(zap_handler_start(f->ctx, &f->zap, &err), 0, "%s", err.message);
    cr_assert_eq(zap_handler_add_domain(f->zap, "rollout", curve_authorize_single_key, &f->single, &err), 0);
    cr_expect_eq(zap_handler_add_domain(f->zap, "rollout", curve_authorize_single_key, &f->single, &err),
                 SMELT_EINVAL, "a domain twice");
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    cr_assert_eq(curve_socket_server(f->router, &f->server, "rollout", &err), 0, "%s", err.message);
    cr_assert_eq(zmq_bind(f->router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof f->endpoint;
    cr_assert_eq(zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &len), 0);
}

static void fixture_close(struct curve_fixture *f) {
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(f->router);
    zap_handler_stop(f->zap);
    zmq_ctx_term(f->ctx);
}

/* A DEALER that sends one "ping" with keys (NULL: no CURVE at all); returns the socket. */
static void *client_ping(struct curve_fixture *f, const struct curve_keypair *keys, const char *server_public) {
    struct smelt_error err;
    void *s = zmq_socket(f->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (keys) cr_assert_eq(curve_socket_client(s, keys, server_public, &err), 0, "%s", err.message);
    cr_assert_eq(zmq_connect(s, f->endpoint), 0);
    json_t *h = json_object();
    msg_send(s, NULL, 0, "ping", h, NULL, 0, &err); /* queued until the handshake */
    json_decref(h);
    return s;
}

Test(curve, zap_admits_the_key_and_stamps_its_user_id) {
    struct curve_fixture f;
    fixture_open(&f);
    struct smelt_error err;
    void *c = client_ping(&f, &f.allowed, f.server.public_key);
    struct msg m;
    cr_assert_eq(msg_recv(f.router, true, 5000, &m, &err), 0, "%s", err.message);
    cr_expect_str_eq(m.type, "ping");
    cr_expect_str_eq(m.user_id, "job-7.1");
    msg_free(&m);
    long allowed, refused;
    zap_handler_counts(f.zap, &allowed, &refused);
    cr_expect_eq(allowed, 1);
    cr_expect_eq(refused, 0);
    zmq_close(c);
    fixture_close(&f);
}

Test(curve, zap_refuses_other_keys_and_plain_clients) {
    struct curve_fixture f;
    fixture_open(&f);
    struct smelt_error err;
    struct curve_keypair stranger;
    cr_assert_eq(curve_keypair_new(&stranger, &err), 0);
    void *a = client_ping(&f, &stranger, f.server.public_key);  /* a valid key, not admitted */
    void *b = client_ping(&f, NULL, NULL);                       /* no CURVE */
    /* Holds the admitted public key but not its secret: the handshake cannot complete. */
    struct curve_keypair forged = stranger;
    memcpy(forged.public_key, f.allowed.public_key, CURVE_KEY_BYTES);
    void *c = client_ping(&f, &forged, f.server.public_key);
    struct msg m;
    cr_expect_eq(msg_recv(f.router, true, 1500, &m, &err), SMELT_ENOTFOUND, "nothing gets through");
    long allowed, refused;
    zap_handler_counts(f.zap, &allowed, &refused);
    cr_expect_eq(allowed, 0);
    cr_expect_geq(refused, 1, "the stranger's handshake reached ZAP and was refused");
    zmq_close(a);
    zmq_close(b);
    zmq_close(c);
    fixture_close(&f);
}

Test(curve, secret_through_a_pipe) {
    struct smelt_error err;
    json_t *secret = json_pack("{s:s}", "job_secret_key", "x"), *back = NULL;
    int fd = -1;
    cr_assert_eq(secret_pipe_new(secret, &fd, &err), 0, "%s", err.message);
    char num[16];
    snprintf(num, sizeof num, "%d", fd);
    setenv(SECRET_FD_ENV, num, 1);
    cr_assert_eq(secret_fd_take(&back, &err), 0, "%s", err.message);
    cr_assert(back);
    cr_expect(json_equal(secret, back));
    cr_expect_null(getenv(SECRET_FD_ENV), "the variable is removed");
    cr_expect_eq(fcntl(fd, F_GETFD), -1, "the descriptor is closed");
    json_decref(back);
    cr_assert_eq(secret_fd_take(&back, &err), 0);
    cr_expect_null(back, "no variable: nothing");
    setenv(SECRET_FD_ENV, "2", 1);
    cr_expect_eq(secret_fd_take(&back, &err), SMELT_EINVAL, "stdio is never a secret's descriptor");
    json_decref(secret);
}

Test(curve, spawn_passes_exactly_the_secret_descriptor) {
    struct smelt_error err;
    json_t *secret = json_pack("{s:i}", "n", 7);
    int fd = -1, other = open("/dev/null", O_RDONLY); /* no O_CLOEXEC: closed by spawn anyway */
    cr_assert_eq(secret_pipe_new(secret, &fd, &err), 0);
    int out[2];
    cr_assert_eq(pipe(out), 0);
    char pass[64], stray[64];
    snprintf(pass, sizeof pass, "/proc/self/fd/%d", fd);
    snprintf(stray, sizeof stray, "/proc/self/fd/%d", other);
    const char *argv[] = {"/bin/readlink", pass, stray, NULL};
    char *envp[] = {NULL};
    struct spawn_plan plan;
    spawn_plan_init(&plan, argv, envp);
    plan.out_fd = out[1];
    plan.pass_fd = fd;
    pid_t pid = spawn_start(&plan);
    cr_assert_gt(pid, 0);
    close(out[1]);
    char buf[256] = "";
    ssize_t n = read(out[0], buf, sizeof buf - 1);
    int status;
    waitpid(pid, &status, 0);
    cr_assert_gt(n, 0);
    cr_expect(strncmp(buf, "pipe:[", 6) == 0, "the passed descriptor is the pipe: %s", buf);
    cr_expect(!strstr(buf, "/dev/null"), "no other descriptor leaks: %s", buf);
    cr_expect_neq(WEXITSTATUS(status), 0, "readlink failed on the closed one");
    close(out[0]);
    close(fd);
    close(other);
    json_decref(secret);
}
