/* smelt-rollout's CURVE channel (rollout/smelt_rollout_main.c; docs/security.md "Job
 * channels"): a real smelt-rollout process given a job's keys through its launch pipe
 * (curve_job_keys_for_child, as the trainer starts it) serves the client holding those
 * keys (rollout/client.c with curve_keys) and no one else: not a client with another job's
 * keys, not a plain DEALER. --key-file does the same for a worker started by hand; a
 * malformed secret or a group-readable key file is a start error. */
#include "tests/unit/testutil.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <zmq.h>

#include "common/common.h"
#include "common/curve.h"
#include "common/msg.h"
#include "common/secret_fd.h"
#include "rollout/rollout.h"

#define SERVING "smelt-rollout: serving on "
#define START_MS 60000
#define MAX_NEW 4

struct worker_proc {
    pid_t pid;
    char log[256], endpoint[256];
};

/* Starts smelt-rollout on the parity llama with `extra` arguments (NULL-terminated, may
 * be NULL) and secret (NULL: none) through its launch pipe. */
static void start_worker(struct worker_proc *w, const json_t *secret, const char *const *extra) {
    char prog[700];
    test_built_program("smelt-rollout", prog, sizeof prog);
    const char *argv[16] = {prog, "--model", "tests/data/parity/llama", "--bind", "tcp://127.0.0.1:*",
                            "--kv-memory-mb", "8", "--backend", "cpu"};
    int n = 9;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    struct smelt_error err = {0};
    char **envp = spawn_envp_for_device(0, -1, NULL);
    cr_assert(envp);
    int keys_fd = -1;
    if (secret) TEST_OK(secret_fd_for_child(secret, &envp, &keys_fd, &err), &err);
    memset(w, 0, sizeof *w);
    test_tmp_path(w->log, sizeof w->log, "rollout.log");
    int log_fd = open_above_stdio(w->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(log_fd >= 0);
    struct spawn_plan p;
    spawn_plan_init(&p, argv, envp);
    p.out_fd = p.err_fd = log_fd;
    p.pass_fd = keys_fd;
    w->pid = spawn_start(&p);
    cr_assert_gt(w->pid, 0);
    close(log_fd);
    if (keys_fd >= 0) close(keys_fd);
    spawn_envp_free(envp);
}

/* The whole log (static buffer, for messages). */
static const char *log_text(const struct worker_proc *w) {
    static char text[8192];
    text[0] = 0;
    FILE *f = fopen(w->log, "r");
    if (!f) return text;
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    return text;
}

/* Until the log says where it serves; false when the process ended first (*status). */
static bool wait_serving(struct worker_proc *w, int *status) {
    for (int64_t deadline = mono_ms() + START_MS; mono_ms() < deadline; sleep_ms(20)) {
        const char *at = strstr(log_text(w), SERVING);
        const char *eol = at ? strchr(at, '\n') : NULL;
        if (eol) {
            snprintf(w->endpoint, sizeof w->endpoint, "%.*s", (int)(eol - at - strlen(SERVING)), at + strlen(SERVING));
            return true;
        }
        if (waitpid(w->pid, status, WNOHANG) == w->pid) {
            w->pid = 0;
            return false;
        }
    }
    cr_assert_fail("smelt-rollout did not serve within %d s: %s", START_MS / 1000, log_text(w));
    return false;
}

static void stop_worker(struct worker_proc *w) {
    if (w->pid <= 0) return;
    kill(w->pid, SIGTERM);
    int status;
    waitpid(w->pid, &status, 0);
    w->pid = 0;
}

/* One greedy request through a rollout client showing keys (NULL: plain) and expecting
 * server_key; the client's return code (the results in *n_tokens). */
static int generate(const struct worker_proc *w, const struct curve_keypair *keys, const char *server_key,
                    int64_t timeout_ms, int64_t *n_tokens, struct smelt_error *err) {
    const char *eps[1] = {w->endpoint};
    struct rollout_client_config cfg = {.endpoints = eps, .n_endpoints = 1, .timeout_ms = timeout_ms,
                                        .curve_keys = keys, .curve_server_key = server_key};
    struct rollout_client *c = NULL;
    TEST_OK(rollout_client_create(&cfg, &c, err), err);
    static const int32_t prompt[3] = {5, 9, 11};
    struct rollout_request q = {.prompt = prompt, .n_prompt = 3, .n = 1, .max_new_tokens = MAX_NEW,
                                .sampling = {.temperature = 0, .top_p = 1}};
    int32_t ids[MAX_NEW];
    float logprobs[MAX_NEW];
    int64_t version = -1;
    const char *reason = NULL;
    *n_tokens = -1;
    struct rollout_client_results out = {.max_tokens = MAX_NEW, .ids = ids, .logprobs = logprobs,
                                         .n_tokens = n_tokens, .policy_version = &version, .finish_reason = &reason};
    int rc = rollout_client_generate(c, &q, 1, &out, err);
    rollout_client_free(c);
    return rc;
}

/* A plain DEALER's health.request: whether any answer came within wait_ms. */
static bool plain_dealer_answered(const struct worker_proc *w, int wait_ms) {
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert_eq(zmq_connect(s, w->endpoint), 0);
    struct smelt_error err = {0};
    json_t *h = json_object();
    msg_send(s, NULL, 0, MSG_HEALTH_REQUEST, h, NULL, 0, &err); /* queued until a connection */
    json_decref(h);
    struct msg m;
    bool answered = msg_recv(s, false, wait_ms, &m, &err) == 0;
    if (answered) msg_free(&m);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return answered;
}

TestSuite(rollout_curve, .init = test_tmp_setup, .fini = test_tmp_teardown, .timeout = 120);

Test(rollout_curve, a_worker_with_job_keys_serves_their_holder_only) {
    struct smelt_error err = {0};
    struct curve_job_keys job = {.present = true}, other = {.present = true};
    TEST_OK(curve_keypair_new(&job.worker, &err), &err);
    TEST_OK(curve_keypair_new(&other.worker, &err), &err);
    memcpy(job.server_public_key, other.worker.public_key, CURVE_KEY_BYTES); /* smeltd's: unused here */
    json_t *secret = curve_job_keys_json(&job);
    struct worker_proc w;
    start_worker(&w, secret, NULL);
    json_decref(secret);
    int status = 0;
    cr_assert(wait_serving(&w, &status), "smelt-rollout ended: %s", log_text(&w));
    cr_expect(strstr(log_text(&w), "curve: encrypted"), "the worker says it uses CURVE: %s", log_text(&w));

    int64_t n = -1;
    cr_expect_neq(generate(&w, &other.worker, job.worker.public_key, 1500, &n, &err), 0,
                  "a client with another job's keys was served");
    cr_expect(!plain_dealer_answered(&w, 1000), "a plain DEALER was answered");
    TEST_OK(generate(&w, &job.worker, job.worker.public_key, 30000, &n, &err), &err);
    cr_expect_eq(n, MAX_NEW, "the job's own client gets its samples");
    stop_worker(&w);
}

Test(rollout_curve, key_file_for_a_worker_started_by_hand) {
    struct smelt_error err = {0};
    struct curve_keypair k, stranger;
    TEST_OK(curve_keypair_new(&k, &err), &err);
    TEST_OK(curve_keypair_new(&stranger, &err), &err);
    char path[256];
    TEST_OK(curve_key_file_write(test_tmp_path(path, sizeof path, "rollout.key"), &k, NULL, &err), &err);
    struct worker_proc w;
    start_worker(&w, NULL, (const char *const[]){"--key-file", path, NULL});
    int status = 0;
    cr_assert(wait_serving(&w, &status), "smelt-rollout ended: %s", log_text(&w));
    int64_t n = -1;
    cr_expect_neq(generate(&w, &stranger, k.public_key, 1500, &n, &err), 0, "a stranger was served");
    cr_expect(!plain_dealer_answered(&w, 1000), "a plain DEALER was answered");
    TEST_OK(generate(&w, &k, k.public_key, 30000, &n, &err), &err);
    cr_expect_eq(n, MAX_NEW);
    stop_worker(&w);

    chmod(path, 0644);
    start_worker(&w, NULL, (const char *const[]){"--key-file", path, NULL});
    cr_assert(!wait_serving(&w, &status), "a key file others can read was used");
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
    cr_expect(strstr(log_text(&w), "--key-file") && strstr(log_text(&w), "chmod 600"), "%s", log_text(&w));
}

Test(rollout_curve, without_keys_anyone_is_served) {
    struct worker_proc w;
    start_worker(&w, NULL, NULL);
    int status = 0;
    cr_assert(wait_serving(&w, &status), "smelt-rollout ended: %s", log_text(&w));
    cr_expect(strstr(log_text(&w), "no CURVE keys"), "the worker warns: %s", log_text(&w));
    cr_expect(plain_dealer_answered(&w, 10000), "a worker without keys serves plain clients, as before");
    stop_worker(&w);
}

Test(rollout_curve, a_malformed_secret_is_a_start_error) {
    json_t *secret = json_pack("{s:s, s:s, s:s}", "worker_public_key", "not a key", "worker_secret_key", "x",
                               "server_public_key", "y");
    struct worker_proc w;
    start_worker(&w, secret, NULL);
    json_decref(secret);
    int status = 0;
    cr_assert(!wait_serving(&w, &status), "smelt-rollout served with a malformed secret");
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
    cr_expect(strstr(log_text(&w), "worker_public_key"), "the error names the field: %s", log_text(&w));
}
