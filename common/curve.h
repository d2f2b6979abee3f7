/* common/curve.h — ZeroMQ CURVE: keys, key files, secure sockets, and a ZAP handler
 * (docs/security.md).
 *
 * Every ZeroMQ socket that can cross a machine is a CURVE server (the side that binds)
 * or a CURVE client (the side that connects). CURVE encrypts the traffic and proves that
 * each side holds the secret key of the public key it shows; *who may connect* is decided
 * by the server's ZAP handler (RFC 27, libzmq's inproc://zeromq.zap.01 in the server's
 * context), which maps the client's public key to a user id — or refuses the handshake.
 * Every message received on such a connection carries that user id (struct msg's
 * user_id, common/msg.h), so a receiver checks a message against its sender's identity,
 * never against what the message says about itself.
 *
 * Keys are Z85 text, 40 characters (CURVE_KEY_CHARS): what libzmq's options take.
 *
 * Threads: curve_* functions are reentrant. A zap_handler runs one thread; the domain
 * callbacks are called on it, one request at a time, so they must be thread-safe with
 * respect to the rest of the program. */
#ifndef SMELT_COMMON_CURVE_H
#define SMELT_COMMON_CURVE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#define CURVE_KEY_CHARS 40
#define CURVE_KEY_BYTES (CURVE_KEY_CHARS + 1) /* with the terminator */
/* The most a ZAP user id may hold (an agent id, a job attempt). */
#define CURVE_USER_ID_BYTES 128

struct curve_keypair {
    char public_key[CURVE_KEY_BYTES];
    char secret_key[CURVE_KEY_BYTES];
};

/* Whether this libzmq can do CURVE (zmq_has("curve")). */
bool curve_available(void);
/* A fresh keypair from libzmq's CSPRNG. */
int curve_keypair_new(struct curve_keypair *out, struct smelt_error *err);
/* Whether text is a 40-character Z85 key that decodes. */
bool curve_key_valid(const char *text);
/* The public key of a secret key; SMELT_EINVAL naming `field` when secret is not a key. */
int curve_public_of(const char *secret_key, char public_key[CURVE_KEY_BYTES], const char *field,
                    struct smelt_error *err);

/* Before bind: the socket is a CURVE server with keypair `self` whose clients are
 * authenticated by the ZAP handler under `domain` (zap_handler_add_domain). */
int curve_socket_server(void *socket, const struct curve_keypair *self, const char *domain,
                        struct smelt_error *err);
/* Before connect: the socket is a CURVE client with keypair `self` that talks only to
 * the server holding server_public's secret. */
int curve_socket_client(void *socket, const struct curve_keypair *self, const char *server_public,
                        struct smelt_error *err);

/* ---- key files ----
 * A key file is a JSON object written with mode 0600:
 *   {"public_key": Z85, "secret_key": Z85, ...} plus fields its owner adds (an agent
 *   credential adds "agent_id" and "server_public_key").
 * curve_key_file_read checks the mode (a file readable by group or others is refused,
 * as ssh refuses such keys), that the secret matches the public key, and fills
 * *extra_out (owned by the caller, json_decref) with the whole object when not NULL. */
struct json_t;
int curve_key_file_write(const char *path, const struct curve_keypair *keys, struct json_t *extra,
                         struct smelt_error *err);
int curve_key_file_read(const char *path, struct curve_keypair *keys, struct json_t **extra_out,
                        struct smelt_error *err);
/* The keypair in a key file, created (0600; its directory must exist) when the file does
 * not exist: a server's own keys, made on first start. */
int curve_key_file_load_or_create(const char *path, struct curve_keypair *keys, struct smelt_error *err);

/* ---- a job's keys ----
 * smeltd makes a keypair for every attempt of a job and hands it to the attempt's worker
 * in its launch (through the agent, common/secret_fd.h). The worker shows it to smeltd
 * (the Tinker channel) and uses it for the job's own channels: its rollout workers are
 * CURVE servers with this keypair that admit only this public key, so a process without
 * the attempt's secret — of another job, or of none — can reach none of them.
 * As JSON (the launch's "secrets"): {"worker_public_key", "worker_secret_key",
 * "server_public_key"}. */
struct curve_job_keys {
    bool present;                          /* false: started by hand, without a launch's keys */
    struct curve_keypair worker;
    char server_public_key[CURVE_KEY_BYTES]; /* smeltd's */
};
/* New reference; NULL when out of memory. */
struct json_t *curve_job_keys_json(const struct curve_job_keys *keys);
/* From the JSON above, each key checked (SMELT_EINVAL naming the field). */
int curve_job_keys_from_json(const struct json_t *obj, struct curve_job_keys *out, struct smelt_error *err);
/* This process's keys from its launch (secret_fd_take; present false without). */
int curve_job_keys_take(struct curve_job_keys *out, struct smelt_error *err);
/* Hands keys on to a child that is started with *envp (a malloc'd array: secret_fd_for_child):
 * *read_fd is for spawn_plan.pass_fd, closed by the caller after spawning. keys NULL or not
 * present: nothing handed, *read_fd -1. */
int curve_job_keys_for_child(const struct curve_job_keys *keys, char ***envp, int *read_fd,
                             struct smelt_error *err);

/* ---- the ZAP handler ---- */
/* Decides one handshake: return true and fill user_id (a NUL-terminated string of at most
 * CURVE_USER_ID_BYTES - 1 bytes) to let the client in, false to refuse it; why (a short
 * text for the log) may be filled. address: the client's IP address ("" for inproc). */
typedef bool (*zap_authorize_fn)(void *arg, const char *address, const char *client_public_key,
                                 char *user_id, size_t user_id_cap, char *why, size_t why_cap);

struct zap_handler;
/* Starts the handler of zmq_context (one per context; libzmq finds it by its fixed inproc
 * endpoint). Every refused handshake is logged at WARN with the domain, address and the
 * key's first characters. */
int zap_handler_start(void *zmq_context, struct zap_handler **out, struct smelt_error *err);
/* Routes handshakes of sockets whose ZAP domain is `domain` to fn(arg, ...). Handshakes
 * for a domain nobody added are refused. At most ZAP_MAX_DOMAINS domains. */
#define ZAP_MAX_DOMAINS 8
int zap_handler_add_domain(struct zap_handler *h, const char *domain, zap_authorize_fn fn, void *arg,
                           struct smelt_error *err);
/* Counters for tests and the log: handshakes let in and refused. */
void zap_handler_counts(struct zap_handler *h, long *allowed, long *refused);
/* Stops the thread and frees h (NULL: nothing). Call before zmq_ctx_term of its context,
 * after the sockets that use it are closed. */
void zap_handler_stop(struct zap_handler *h);

/* An authorize function for one fixed key: arg is a `struct curve_single_key`; the client
 * is let in when it shows exactly that public key, with user_id `user_id`. For channels
 * where every peer holds the same job key (a job's trainer and rollout workers). */
struct curve_single_key {
    char public_key[CURVE_KEY_BYTES];
    char user_id[CURVE_USER_ID_BYTES];
};
bool curve_authorize_single_key(void *arg, const char *address, const char *client_public_key,
                                char *user_id, size_t user_id_cap, char *why, size_t why_cap);

#endif
