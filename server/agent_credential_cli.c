/* `smeltd agent-credential create|list|revoke|rotate`: enrollment on a data directory, for
 * operators without an admin key at hand or before smeltd's first start (docs/security.md).
 * It works on the store directly, so it may run beside a running smeltd: a revocation takes
 * effect at that smeltd's next control pass. Key files are written with mode 0600, never
 * over an existing file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server_internal.h"

struct cli_options {
    const char *data, *agent_id, *out, *description, *endpoint, *id;
};

static void cli_usage(FILE *f) {
    fprintf(f, "usage: smeltd agent-credential create --data DIR --agent-id ID --out FILE [--description TEXT]\n"
               "                                      [--endpoint tcp://HOST:PORT]\n"
               "       smeltd agent-credential list   --data DIR\n"
               "       smeltd agent-credential revoke --data DIR --id CREDENTIAL\n"
               "       smeltd agent-credential rotate --data DIR --id CREDENTIAL --out FILE [--endpoint ...]\n"
               "The key file (mode 0600) is what `smelt-agent --credential FILE` reads; docs/security.md.\n");
}

static int need(const char *value, const char *flag, struct smelt_error *err) {
    return value ? 0 : error_set_field(err, SMELT_EINVAL, flag, "%s is required", flag);
}

/* The key file's document written to path (0600, refused when it exists). */
static int write_key_file(const char *path, json_t *doc, struct smelt_error *err) {
    struct curve_keypair keys;
    snprintf(keys.public_key, sizeof keys.public_key, "%s", json_string_value(json_object_get(doc, "public_key")));
    snprintf(keys.secret_key, sizeof keys.secret_key, "%s", json_string_value(json_object_get(doc, "secret_key")));
    int rc = curve_key_file_write(path, &keys, doc, err);
    explicit_bzero(&keys, sizeof keys);
    return rc;
}

/* Before the store changes: --out must be a new file smeltd can create (0600), so a
 * rotation never leaves the agent with the old credential revoked and the new one's
 * secret unwritten. The probe file is removed again; the key file is written after. */
static int out_writable(const char *path, struct smelt_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return error_set_field(err, SMELT_EINVAL, "--out", "--out %s: %s%s", path, strerror(errno),
                               errno == EEXIST ? " (a key file is never overwritten: name a new file)" : "");
    close(fd);
    unlink(path);
    return 0;
}

static void print_json(json_t *v) {
    char *text = json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (text) printf("%s\n", text);
    free(text);
}

static int cli_run(const char *verb, const struct cli_options *o, struct store_conn *c, const char *server_public,
                   struct smelt_error *err) {
    struct agent_credential_request r = {.agent_id = o->agent_id, .description = o->description,
                                         .server_public_key = server_public, .endpoint = o->endpoint};
    json_t *object = NULL, *key_file = NULL;
    int rc;
    if (strcmp(verb, "list") == 0) rc = agent_credential_list(c, &object, err);
    else if (strcmp(verb, "create") == 0) {
        if (!(rc = need(o->agent_id, "--agent-id", err)) && !(rc = need(o->out, "--out", err)) &&
            !(rc = out_writable(o->out, err)))
            rc = agent_credential_create(c, &r, &object, &key_file, err);
    } else if (strcmp(verb, "revoke") == 0) {
        if (!(rc = need(o->id, "--id", err))) rc = agent_credential_revoke(c, o->id, &object, err);
    } else if (strcmp(verb, "rotate") == 0) {
        if (!(rc = need(o->id, "--id", err)) && !(rc = need(o->out, "--out", err)) &&
            !(rc = out_writable(o->out, err)))
            rc = agent_credential_rotate(c, o->id, &r, &object, &key_file, err);
    } else rc = error_set(err, SMELT_EINVAL, "unknown command '%s' (create, list, revoke, rotate)", verb);
    /* The store holds the credential now: a key file that cannot be written is revoked again,
     * so no live credential lacks its secret. */
    if (!rc && key_file && (rc = write_key_file(o->out, key_file, err)) != 0) {
        json_t *undone = NULL;
        struct smelt_error ignored = {0};
        agent_credential_revoke(c, json_string_value(json_object_get(object, "id")), &undone, &ignored);
        json_decref(undone);
    }
    if (!rc) print_json(object);
    json_decref(object);
    json_decref(key_file);
    return rc;
}

static int cli_open(const char *data, struct store **store, char server_public[CURVE_KEY_BYTES],
                    struct smelt_error *err) {
    TRY(dir_create_all(data, err));
    char path[SERVER_PATH_BYTES + 16];
    snprintf(path, sizeof path, "%s/server.key", data);
    struct curve_keypair keys;
    int rc = curve_key_file_load_or_create(path, &keys, err); /* smeltd makes it the same way at start */
    memcpy(server_public, keys.public_key, CURVE_KEY_BYTES);
    explicit_bzero(&keys, sizeof keys);
    if (rc) return error_wrap(err, rc, "smeltd's CURVE keys");
    snprintf(path, sizeof path, "%s/smelt.db", data);
    return store_open(path, store, err);
}

int server_agent_credential_main(int argc, char **argv) {
    struct cli_options o = {0};
    bool help = false;
    const struct args_option options[] = {
        {"--data", &o.data, NULL},       {"--agent-id", &o.agent_id, NULL}, {"--out", &o.out, NULL},
        {"--description", &o.description, NULL}, {"--endpoint", &o.endpoint, NULL}, {"--id", &o.id, NULL},
        {"--help", NULL, &help},         {NULL, NULL, NULL}};
    struct smelt_error err = {0};
    if (argc < 3 || args_parse(argc, argv, 3, options, &err) != 0 || help || need(o.data, "--data", &err) != 0) {
        if (err.message[0]) fprintf(stderr, "smeltd agent-credential: %s\n", err.message);
        cli_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    struct store *store = NULL;
    char server_public[CURVE_KEY_BYTES];
    int rc = cli_open(o.data, &store, server_public, &err);
    struct store_conn *c = rc ? NULL : store_acquire(store, &err);
    if (c) {
        rc = cli_run(argv[2], &o, c, server_public, &err);
        store_release(store, c);
    } else if (!rc) rc = err.code;
    store_close(store);
    if (rc) {
        fprintf(stderr, "smeltd agent-credential %s: %s\n", argv[2], err.message);
        return rc == SMELT_EINVAL || rc == SERVER_ESTATE ? 2 : 1; /* the request's fault: 2 */
    }
    return 0;
}
