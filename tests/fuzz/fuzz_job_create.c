/* POST /v1/fine_tuning/jobs's body (server/jobs.c, plan_job through jobs_plan_spec): any
 * JSON object, planned as a create request is (the checks of the request's own fields,
 * the method and its hyperparameters under OpenAI's names, the model and file ids
 * against a store, critic and reward-model names, the trainer's parse of the spec),
 * creating nothing. The store, made once in a temporary directory, holds a base model
 * "tiny", a reward model "ft:tiny:rm", and a processed file of each kind (file-sft,
 * file-pref, file-prompts), so requests get past the ids to the spec. A refusal must be
 * SMELT_EINVAL naming the request's field (the reply's `param`: a 400, never a 500 for
 * a client's input) and saying why; a request taken yields a spec object whose model is
 * one of the store's. Anything else than an object is skipped (api_jobs.c refuses it
 * before planning). */
#include <ftw.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "common/common.h"
#include "server/server_internal.h"
#include "tests/fuzz/fuzz.h"

#define PROJECT "default"

static struct server g_s;
static char g_dir[] = "/tmp/smelt-fuzz-job-create-XXXXXX";
static char g_tiny[SERVER_PATH_BYTES + 16];

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The store and its directory go when the process ends. */
static void cleanup(void) {
    if (g_s.store) store_close(g_s.store);
    g_s.store = NULL;
    nftw(g_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
    const char *dir = g_dir;
    char path[SERVER_PATH_BYTES + 64];
    snprintf(g_s.jobs_dir, sizeof g_s.jobs_dir, "%s/jobs", dir);
    snprintf(g_s.models_dir, sizeof g_s.models_dir, "%s/models", dir);
    snprintf(g_tiny, sizeof g_tiny, "%s/tiny", g_s.models_dir);
    if (mkdir(g_s.jobs_dir, 0700) || mkdir(g_s.models_dir, 0700) || mkdir(g_tiny, 0700)) abort();
    snprintf(path, sizeof path, "%s/config.json", g_tiny);
    write_text(path, "{\"architectures\": [\"LlamaForCausalLM\"]}");
    struct smelt_error err = {0};
    snprintf(path, sizeof path, "%s/smelt.db", dir);
    if (store_open(path, &g_s.store, &err) != 0) {
        fprintf(stderr, "store: %s\n", err.message);
        abort();
    }
    struct store_conn *conn = store_acquire(g_s.store, &err);
    if (!conn ||
        store_exec(conn, &err, "INSERT INTO files (id, project_id, filename, purpose, bytes, created_at, path, "
                   "status, kind, report) VALUES "
                   "('file-sft', ?, 'a.jsonl', 'fine-tune', 1, 0, '/nowhere/a.jsonl', 'processed', 'sft', '{}'), "
                   "('file-pref', ?, 'b.jsonl', 'fine-tune', 1, 0, '/nowhere/b.jsonl', 'processed', 'preference', '{}'), "
                   "('file-prompts', ?, 'c.jsonl', 'fine-tune', 1, 0, '/nowhere/c.jsonl', 'processed', 'prompts', '{}'), "
                   "('file-bad', ?, 'd.jsonl', 'fine-tune', 1, 0, '/nowhere/d.jsonl', 'failed', 'sft', "
                   "'{\"errors\": [{\"line\": 2, \"field\": \"messages\", \"message\": \"bad\"}]}')",
                   "ssss", PROJECT, PROJECT, PROJECT, PROJECT) < 0 ||
        store_exec(conn, &err, "INSERT INTO models (id, project_id, job_id, path, kind, base_model, created_at, head) "
                   "VALUES ('ft:tiny:rm', ?, 'ftjob-rm', '/nowhere/rm', 'full', 'tiny', 0, 'reward')", "s",
                   PROJECT) < 0) {
        fprintf(stderr, "store: %s\n", err.message);
        abort();
    }
    store_release(g_s.store, conn);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *request = fuzz_json(data, size);
    if (!json_is_object(request)) {
        json_decref(request);
        return 0;
    }
    json_t *before = json_deep_copy(request), *spec = NULL;
    struct smelt_error err = {0};
    int rc = jobs_plan_spec(&g_s, PROJECT, request, &spec, &err);
    if (rc != 0) {
        if (rc != SMELT_EINVAL || err.code != SMELT_EINVAL || !err.field[0] || !err.message[0] || spec) {
            fprintf(stderr, "refused with code %d (rc %d), field '%s': %s\n", err.code, rc, err.field, err.message);
            abort(); /* a 500, or a 400 naming no field */
        }
    } else {
        const char *model = json_string_value(json_object_get(spec, "model"));
        if (!json_is_object(spec) || !model || (strcmp(model, g_tiny) != 0 && strcmp(model, "/nowhere/rm") != 0)) {
            fprintf(stderr, "taken, but the spec's model is '%s'\n", model ? model : "(none)");
            abort();
        }
    }
    if (!json_equal(before, request)) abort(); /* the request stays as it came (it is stored) */
    json_decref(spec);
    json_decref(before);
    json_decref(request);
    return 0;
}
