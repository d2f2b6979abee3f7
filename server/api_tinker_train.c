/* The Tinker SDK's training routes (docs/tinker.md): create_model, get_info,
 * forward_backward (protobuf), optim_step, save_weights, save_weights_for_sampler and
 * load_weights. Each checks its request, naming the field, and answers a future at once;
 * the session job's worker runs it, in the model's seq_id order. */
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

/* The request's seq_id (>= 1), or a 400 reply. */
static int seq_of(const json_t *body, struct http_response *res, int64_t *seq) {
    struct smelt_error err = {0};
    int rc = json_field_int(body, "seq_id", true, 0, 1, INT32_MAX, seq, "request", &err);
    if (rc) tinker_reply_failure(res, &err, "seq_id");
    return rc;
}

/* A request of a live model refused at submission: its seq is passed over and err replied. */
static void refuse(struct server *s, struct store_conn *c, struct http_response *res, const char *model_id,
                   int64_t seq, const struct smelt_error *err, const char *param) {
    tinker_order_skip(tinker_api_order(s), model_id, seq, c);
    tinker_reply_failure(res, err, param);
}

static int lora_of(const json_t *body, json_t **lora, struct smelt_error *err) {
    const json_t *l = json_object_get(body, "lora_config");
    if (!json_is_object(l))
        return error_set_field(err, SMELT_EUNSUPPORTED, "lora_config", "lora_config: required; full fine-tuning "
                               "through the Tinker API is not supported yet (create_lora_training_client)");
    const json_t *opt = json_object_get(body, "optimizer_config");
    const char *type = json_string_value(json_object_get(opt, "type"));
    if (opt && !json_is_null(opt) && (!type || strcmp(type, "adamw") != 0))
        return error_set_field(err, SMELT_EUNSUPPORTED, "optimizer_config.type", "optimizer_config.type: %s is not "
                               "supported; smelt trains with adamw", type ? type : "(none)");
    int64_t rank, seed;
    bool attn, mlp, unembed;
    TRY(json_field_int(l, "rank", false, 32, 1, 4096, &rank, "lora_config", err));
    TRY(json_field_int(l, "seed", false, 0, 0, INT64_MAX, &seed, "lora_config", err));
    TRY(json_field_bool(l, "train_attn", false, true, &attn, "lora_config", err));
    TRY(json_field_bool(l, "train_mlp", false, true, &mlp, "lora_config", err));
    TRY(json_field_bool(l, "train_unembed", false, true, &unembed, "lora_config", err));
    if (!attn && !mlp && !unembed)
        return error_set_field(err, SMELT_EINVAL, "lora_config", "lora_config: train_attn, train_mlp and "
                               "train_unembed are all false");
    *lora = json_pack("{s:I, s:I, s:b, s:b, s:b}", "rank", (json_int_t)rank, "seed", (json_int_t)seed, "train_attn",
                      attn, "train_mlp", mlp, "train_unembed", unembed);
    return *lora ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
}

/* The project's session (404 naming session_id) and the model id "<session>:train:<seq>". */
static int session_model_id(struct store_conn *c, struct http_response *res, const char *project, const json_t *body,
                            const char **session, char *model_id, size_t cap) {
    struct smelt_error err = {0};
    int64_t seq;
    json_t *row = NULL;
    int rc = json_field_string(body, "session_id", true, NULL, session, "request", &err);
    if (!rc) rc = json_field_int(body, "model_seq_id", true, 0, 0, INT32_MAX, &seq, "request", &err);
    if (!rc) rc = store_query_one(c, &row, &err, "SELECT id FROM tinker_sessions WHERE id = ? AND project_id = ?",
                                  "ss", *session, project);
    json_decref(row);
    if (!rc && snprintf(model_id, cap, "%s:train:%lld", *session, (long long)seq) >= (int)cap)
        rc = error_set_field(&err, SMELT_EINVAL, "session_id", "session_id: too long");
    if (rc == SMELT_ENOTFOUND) http_reply_error(res, 404, "session_id", "not_found", "session_id: no such session");
    else if (rc) tinker_reply_failure(res, &err, NULL);
    return rc;
}

static int model_insert(struct store_conn *c, struct http_response *res, const char *project, const char *session,
                        const char *model_id, const char *job_id, const char *base, const char *base_dir,
                        json_t *lora) {
    struct smelt_error err = {0};
    int rc = store_exec(c, &err, "INSERT OR IGNORE INTO tinker_models (id, project_id, session_id, job_id, base_model, "
                        "base_dir, lora, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", "ssssssji", model_id, project,
                        session, job_id, base, base_dir, lora, server_now());
    if (rc == 0)
        http_reply_error(res, 409, "model_seq_id", "model_exists", "model_seq_id: model %s exists already", model_id);
    else if (rc < 0) tinker_reply_failure(res, &err, NULL);
    return rc == 1 ? 0 : -1;
}

/* A model whose create_model never reached its worker: its row and order go (its future was failed). */
static void model_drop(struct server *s, struct store_conn *c, const char *model_id) {
    struct smelt_error err = {0};
    if (store_exec(c, &err, "DELETE FROM tinker_models WHERE id = ?", "s", model_id) < 0)
        log_error("tinker: dropping model %s: %s", model_id, err.message);
    tinker_order_close(tinker_api_order(s), model_id);
}

/* The worker's create_model for model_id (its order starts at seq 1); on failure the model is dropped. */
static int create_on_worker(struct server *s, struct store_conn *c, const char *project, const char *model_id,
                            const char *job_id, json_t *lora, char *fut, size_t cap, struct smelt_error *err) {
    json_t *base = json_pack("{s:s, s:s}", "type", "create_model", "model_id", model_id);
    json_t *header = json_pack("{s:O}", "lora", lora);
    int rc = base && header ? tinker_order_open(tinker_api_order(s), model_id, 1, err)
                            : error_set(err, SMELT_ENOMEM, "out of memory");
    if (!rc) {
        rc = tinker_submit_quiet(s, c, project, model_id, job_id, "create_model", base, header, fut, cap, err);
        header = NULL; /* taken */
    }
    json_decref(header);
    json_decref(base);
    if (rc) model_drop(s, c, model_id);
    return rc;
}

static void create_model(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                         const json_t *body) {
    const char *session, *base_model = json_string_value(json_object_get(body, "base_model"));
    char model_id[TINKER_ID_BYTES], base_dir[SERVER_PATH_BYTES], job_id[HTTP_ID_BYTES], fut[HTTP_ID_BYTES];
    struct smelt_error err = {0};
    json_t *lora = NULL;
    if (session_model_id(c, res, project, body, &session, model_id, sizeof model_id)) return;
    if (lora_of(body, &lora, &err)) {
        tinker_reply_failure(res, &err, NULL);
        return;
    }
    if (!tinker_job_for_base(s, c, res, project, base_model, "base_model", base_dir, sizeof base_dir, job_id,
                             sizeof job_id) &&
        !model_insert(c, res, project, session, model_id, job_id, base_model, base_dir, lora)) {
        if (create_on_worker(s, c, project, model_id, job_id, lora, fut, sizeof fut, &err))
            tinker_reply_failure(res, &err, NULL);
        else http_reply_json(res, 200, json_pack("{s:s, s:s}", "request_id", fut, "model_id", model_id));
    }
    json_decref(lora);
}

void api_tinker_create_model(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_CREATE_MODEL, create_model);
}

static void get_info(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                     const json_t *body) {
    (void)s;
    json_t *row = tinker_model_row(c, res, project, json_string_value(json_object_get(body, "model_id")), false);
    if (!row) return;
    const char *base = json_string_value(json_object_get(row, "base_model"));
    /* tokenizer_id: the base's directory, which the SDK's AutoTokenizer loads. */
    json_t *o = json_pack("{s:s, s:O, s:{s:s, s:s, s:s}, s:b, s:O, s:s, s:{s:s}}", "type", "get_info", "model_id",
                          json_object_get(row, "id"), "model_data", "arch", "lora", "model_name", base, "tokenizer_id",
                          json_string_value(json_object_get(row, "base_dir")), "is_lora", 1, "lora_rank",
                          json_object_get(json_object_get(row, "lora"), "rank"), "model_name", base,
                          "optimizer_config", "type", "adamw");
    json_decref(row);
    if (!o) http_reply_error(res, 500, NULL, NULL, "out of memory");
    else http_reply_json(res, 200, o);
}

void api_tinker_get_info(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_GET_INFO, get_info);
}

static void forward_backward(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                             const struct http_request *req) {
    struct tinker_fwdbwd r = {0};
    struct smelt_error err = {0};
    int rc = tinker_fwdbwd_decode(req->body, req->body_len, &r, &err);
    json_t *row = r.model_id[0] ? tinker_model_row(c, res, project, r.model_id, true) : NULL;
    if (!row && r.model_id[0]) {
        tinker_fwdbwd_free(&r);
        return;
    }
    int64_t vocab = 0, ctx = 0;
    if (!rc) rc = tinker_base_info(s, json_string_value(json_object_get(row, "base_dir")), &vocab, &ctx, &err);
    if (!rc) rc = tinker_fwdbwd_check_tokens(&r, vocab, &err);
    if (!rc && r.seq_id < 1) /* a seq < 0 would skip the order (tinker_submit) */
        rc = error_set_field(&err, SMELT_EINVAL, "seq_id", "seq_id: %lld; a model's requests count from 1",
                             (long long)r.seq_id);
    if (rc && row && r.seq_id >= 1) refuse(s, c, res, r.model_id, r.seq_id, &err, NULL);
    else if (rc) tinker_reply_failure(res, &err, NULL);
    else {
        const char *op = json_string_value(json_object_get(r.header, "op"));
        char opbuf[32];
        snprintf(opbuf, sizeof opbuf, "%s", op ? op : "forward_backward");
        json_t *header = r.header;
        r.header = NULL;
        tinker_submit(s, c, res, project, r.model_id, r.seq_id, json_string_value(json_object_get(row, "job_id")),
                      opbuf, NULL, header, r.arrays, r.n_arrays, NULL);
    }
    json_decref(row);
    tinker_fwdbwd_free(&r);
}

void api_tinker_forward_backward(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    if (tinker_txn_begin(c, res) == 0) {
        forward_backward(s, c, res, req->identity.project, req);
        tinker_txn_end(c, res);
    }
    store_release(s->store, c);
}

/* A live model's ordered request: its row and seq, or a reply (NULL). */
static json_t *ordered(struct store_conn *c, struct http_response *res, const char *project, const json_t *body,
                       int64_t *seq) {
    json_t *row = tinker_model_row(c, res, project, json_string_value(json_object_get(body, "model_id")), true);
    if (row && seq_of(body, res, seq)) {
        json_decref(row);
        return NULL;
    }
    return row;
}

static int adam_of(const json_t *body, json_t **adam, struct smelt_error *err) {
    const json_t *a = json_object_get(body, "adam_params");
    if (!json_is_object(a)) {
        const char *type = json_string_value(json_object_get(json_object_get(body, "optimizer_params"), "type"));
        return error_set_field(err, SMELT_EUNSUPPORTED, "adam_params", "adam_params: required (optimizer %s is not "
                               "supported; smelt trains with adamw)", type ? type : "(none)");
    }
    double lr, b1, b2, eps, wd, clip;
    TRY(json_field_double(a, "learning_rate", true, 0, 0, 1e3, &lr, "adam_params", err));
    TRY(json_field_double(a, "beta1", false, 0.9, 0, 0.999999, &b1, "adam_params", err));
    TRY(json_field_double(a, "beta2", false, 0.95, 0, 0.999999999, &b2, "adam_params", err));
    TRY(json_field_double(a, "eps", false, 1e-12, 0, 1, &eps, "adam_params", err));
    TRY(json_field_double(a, "weight_decay", false, 0, 0, 1e3, &wd, "adam_params", err));
    TRY(json_field_double(a, "grad_clip_norm", false, 0, 0, 1e12, &clip, "adam_params", err));
    *adam = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "learning_rate", lr, "beta1", b1, "beta2", b2, "eps", eps,
                      "weight_decay", wd, "grad_clip_norm", clip);
    return *adam ? 0 : error_set(err, SMELT_ENOMEM, "out of memory");
}

static void optim_step(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                       const json_t *body) {
    int64_t seq;
    json_t *row = ordered(c, res, project, body, &seq), *adam = NULL;
    if (!row) return;
    const char *model_id = json_string_value(json_object_get(row, "id"));
    struct smelt_error err = {0};
    if (adam_of(body, &adam, &err)) refuse(s, c, res, model_id, seq, &err, NULL);
    else
        tinker_submit(s, c, res, project, model_id, seq, json_string_value(json_object_get(row, "job_id")),
                      "optim_step", NULL, json_pack("{s:o}", "adam", adam), NULL, 0, NULL);
    json_decref(row);
}

void api_tinker_optim_step(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_OPTIM_STEP, optim_step);
}

/* DATA/tinker/<model>/<segment>/<name> for a save: the parent made, the directory itself
 * left to the worker, which puts its finished copy there (dir_replace). An existing one
 * may be replaced only with overwrite, and stays, with its rows, until the new save has
 * succeeded: a save that fails loses nothing. */
static int save_dir(struct server *s, const json_t *row, const json_t *body, const char *kind, char *tpath,
                    size_t tcap, char *dir, size_t dcap, struct smelt_error *err) {
    const char *name = json_string_value(json_object_get(body, "path"));
    const char *model_id = json_string_value(json_object_get(row, "id"));
    bool overwrite = json_is_true(json_object_get(body, "overwrite"));
    if (!name || !tinker_name_ok(name))
        return error_set_field(err, SMELT_EINVAL, "path", "path: a checkpoint name of 1 to 64 characters from "
                               "A-Z a-z 0-9 . _ - (not starting with '.') is expected");
    TRY(tinker_checkpoint_path(model_id, kind, name, tpath, tcap, err));
    TRY(tinker_checkpoint_dir(s->data_dir, model_id, kind, name, dir, dcap, err));
    if (path_exists(dir) && !overwrite)
        return error_set_field(err, SMELT_EINVAL, "path", "path: checkpoint %s exists (overwrite: true replaces it)",
                               tpath);
    char parent[SERVER_PATH_BYTES];
    snprintf(parent, sizeof parent, "%s", dir);
    *strrchr(parent, '/') = '\0';
    return dir_create_all(parent, err);
}

static void save(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                 const json_t *body, const char *kind) {
    int64_t seq;
    json_t *row = ordered(c, res, project, body, &seq);
    if (!row) return;
    const char *model_id = json_string_value(json_object_get(row, "id"));
    const char *op = strcmp(kind, "training") == 0 ? "save_weights" : "save_weights_for_sampler";
    char tpath[SERVER_PATH_BYTES], dir[SERVER_PATH_BYTES];
    struct smelt_error err = {0};
    const char *name = json_string_value(json_object_get(body, "path"));
    int rc = save_dir(s, row, body, kind, tpath, sizeof tpath, dir, sizeof dir, &err);
    /* The worker checks again when it saves: two saves of one new name both pass the check
     * here, and the second must not replace the first unasked. */
    bool overwrite = json_is_true(json_object_get(body, "overwrite"));
    if (rc) refuse(s, c, res, model_id, seq, &err, NULL);
    else
        tinker_submit(s, c, res, project, model_id, seq, json_string_value(json_object_get(row, "job_id")), op,
                      json_pack("{s:s, s:s, s:{s:s, s:s, s:s, s:s?}}", "type", op, "path", tpath,
                                TINKER_FUTURE_CHECKPOINT, "kind", kind, "name", name, "dir", dir, "base_model",
                                json_string_value(json_object_get(row, "base_model"))),
                      strcmp(kind, "training") == 0
                          ? json_pack("{s:s, s:b, s:b}", "path", dir, "optimizer", 1, "overwrite", overwrite)
                          : json_pack("{s:s, s:b}", "path", dir, "overwrite", overwrite),
                      NULL, 0, NULL);
    json_decref(row);
}

static void save_weights(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                         const json_t *body) {
    save(s, c, res, project, body, "training");
}

void api_tinker_save_weights(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_SAVE_WEIGHTS, save_weights);
}

/* save_weights_and_get_sampling_client: a snapshot adapter under DATA/tinker/<model>/samplers/<n>
 * and the sampler "<session>:sample:<n>" on it, made here (the SDK asks for no session). */
static void save_for_new_sampler(struct server *s, struct store_conn *c, struct http_response *res,
                                 const char *project, const json_t *body, const json_t *row, int64_t seq) {
    const char *model_id = json_string_value(json_object_get(row, "id"));
    const char *job_id = json_string_value(json_object_get(row, "job_id"));
    int64_t n;
    char id[TINKER_ID_BYTES], dir[SERVER_PATH_BYTES];
    struct smelt_error err = {0};
    int rc = json_field_int(body, "sampling_session_seq_id", true, 0, 0, INT32_MAX, &n, "request", &err);
    if (!rc && (snprintf(id, sizeof id, "%s:sample:%lld", json_string_value(json_object_get(row, "session_id")),
                         (long long)n) >= (int)sizeof id ||
                snprintf(dir, sizeof dir, "%s/tinker/%s/samplers/%lld", s->data_dir, model_id, (long long)n) >=
                    (int)sizeof dir))
        rc = error_set_field(&err, SMELT_EINVAL, "model_id", "model_id: too long");
    char parent[SERVER_PATH_BYTES];
    snprintf(parent, sizeof parent, "%s", rc ? "" : dir);
    if (strrchr(parent, '/')) *strrchr(parent, '/') = '\0';
    if (!rc) rc = dir_create_all(parent, &err);
    if (!rc && store_exec(c, &err, "INSERT OR REPLACE INTO tinker_samplers (id, project_id, session_id, job_id, "
                          "base_model, model_id, adapter_path, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          "sssssssi", id, project, json_string_value(json_object_get(row, "session_id")), job_id,
                          json_string_value(json_object_get(row, "base_model")), model_id, dir, server_now()) < 0)
        rc = err.code;
    if (rc) refuse(s, c, res, model_id, seq, &err, NULL);
    else
        tinker_submit(s, c, res, project, model_id, seq, job_id, "save_weights_for_sampler",
                      json_pack("{s:s, s:s}", "type", "save_weights_for_sampler", "sampling_session_id", id),
                      json_pack("{s:s}", "path", dir), NULL, 0, NULL);
}

static void save_for_sampler(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                             const json_t *body) {
    if (json_string_value(json_object_get(body, "path"))) {
        save(s, c, res, project, body, "sampler");
        return;
    }
    int64_t seq;
    json_t *row = ordered(c, res, project, body, &seq);
    if (!row) return;
    save_for_new_sampler(s, c, res, project, body, row, seq);
    json_decref(row);
}

void api_tinker_save_for_sampler(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_SAVE_FOR_SAMPLER, save_for_sampler);
}

/* The project's checkpoint row of a tinker:// path (404 naming path), of kind "training". */
static json_t *checkpoint_row(struct store_conn *c, struct http_response *res, const char *project,
                              const char *tpath) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = tpath ? store_query_one(c, &row, &err, "SELECT * FROM tinker_checkpoints WHERE id = ? AND project_id = ?",
                                     "ss", tpath, project)
                   : error_set(&err, SMELT_EINVAL, "path is required");
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "path", "not_found", "path: no such checkpoint: %.300s", tpath);
    else if (rc) tinker_reply_failure(res, &err, "path");
    else if (strcmp(json_string_value(json_object_get(row, "kind")), "training") != 0) {
        http_reply_error(res, 400, "path", "invalid_value", "path: %.300s is a sampler checkpoint (an adapter without "
                         "optimizer state); load_weights takes a save_state path (tinker://.../weights/...)", tpath);
        json_decref(row);
        return NULL;
    }
    return rc ? NULL : row;
}

/* create_training_client_from_state: a new model "<session>:train:<seq>" made like the
 * checkpoint's model, then the checkpoint loaded into it. */
static void load_new(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                     const json_t *body, const json_t *ck) {
    const char *session;
    char model_id[TINKER_ID_BYTES], job_id[HTTP_ID_BYTES], fut[HTTP_ID_BYTES];
    struct smelt_error err = {0};
    if (session_model_id(c, res, project, body, &session, model_id, sizeof model_id)) return;
    json_t *src = tinker_model_row(c, res, project, json_string_value(json_object_get(ck, "model_id")), false);
    if (!src) return;
    const char *base = json_string_value(json_object_get(src, "base_model"));
    const char *base_dir = json_string_value(json_object_get(src, "base_dir"));
    json_t *lora = json_object_get(src, "lora");
    int rc = tinker_session_job(s, c, project, base, base_dir, job_id, sizeof job_id, &err);
    if (rc) tinker_reply_failure(res, &err, "path");
    else if (!model_insert(c, res, project, session, model_id, job_id, base, base_dir, lora)) {
        if (create_on_worker(s, c, project, model_id, job_id, lora, fut, sizeof fut, &err))
            tinker_reply_failure(res, &err, NULL);
        else
            tinker_submit(s, c, res, project, model_id, -1, job_id, "load_weights",
                          json_pack("{s:s, s:O, s:s}", "type", "load_weights", "path", json_object_get(ck, "id"),
                                    "model_id", model_id),
                          json_pack("{s:O, s:b}", "path", json_object_get(ck, "path"), "optimizer",
                                    json_is_true(json_object_get(body, "optimizer"))), NULL, 0, NULL);
    }
    json_decref(src);
}

static void load_weights(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                         const json_t *body) {
    const char *tpath = json_string_value(json_object_get(body, "path"));
    json_t *ck = NULL;
    if (!json_is_string(json_object_get(body, "model_id"))) { /* null: absent, as the rules read it */
        if ((ck = checkpoint_row(c, res, project, tpath))) load_new(s, c, res, project, body, ck);
        json_decref(ck);
        return;
    }
    /* the model's seq first: a refused checkpoint must pass it over, or the model's later requests wait forever */
    int64_t seq;
    json_t *row = ordered(c, res, project, body, &seq);
    if (row && !(ck = checkpoint_row(c, res, project, tpath)))
        tinker_order_skip(tinker_api_order(s), json_string_value(json_object_get(row, "id")), seq, c);
    else if (row)
        tinker_submit(s, c, res, project, json_string_value(json_object_get(row, "id")), seq,
                      json_string_value(json_object_get(row, "job_id")), "load_weights",
                      json_pack("{s:s, s:O}", "type", "load_weights", "path", json_object_get(ck, "id")),
                      json_pack("{s:O, s:b}", "path", json_object_get(ck, "path"), "optimizer",
                                json_is_true(json_object_get(body, "optimizer"))), NULL, 0, NULL);
    json_decref(row);
    json_decref(ck);
}

void api_tinker_load_weights(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_LOAD_WEIGHTS, load_weights);
}
