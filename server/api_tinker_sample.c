/* The Tinker SDK's sampling routes (docs/tinker.md): sampling sessions on a base model or
 * a sampler checkpoint (save_weights_and_get_sampling_client makes its own in
 * api_tinker_train.c), and asample, answered with a future and one sequence id per sample. */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/tinker_api.h"

static int session_ok(struct store_conn *c, const char *project, const char *session, struct smelt_error *err) {
    json_t *row = NULL;
    int rc = session ? store_query_one(c, &row, err, "SELECT id FROM tinker_sessions WHERE id = ? AND project_id = ?",
                                       "ss", session, project)
                     : error_set(err, SMELT_EINVAL, "session_id is required");
    json_decref(row);
    if (rc == SMELT_ENOTFOUND) error_set_field(err, rc, "session_id", "session_id: no such session: %.200s", session);
    return rc;
}

/* model_path: the project's sampler checkpoint (its adapter, base and job); else base_model. */
static int sampler_source(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                          const json_t *body, json_t **ck, char *job_id, size_t cap) {
    const char *tpath = json_string_value(json_object_get(body, "model_path"));
    const char *base = json_string_value(json_object_get(body, "base_model"));
    char base_dir[SERVER_PATH_BYTES];
    *ck = NULL;
    if (!tpath)
        return tinker_job_for_base(s, c, res, project, base, "base_model", base_dir, sizeof base_dir, job_id, cap);
    struct smelt_error err = {0};
    int rc = store_query_one(c, ck, &err, "SELECT k.path, k.model_id, m.base_model, m.base_dir FROM "
                             "tinker_checkpoints k JOIN tinker_models m ON m.id = k.model_id WHERE k.id = ? AND "
                             "k.project_id = ? AND k.kind = 'sampler'", "ss", tpath, project);
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "model_path", "not_found", "model_path: no such sampler checkpoint: %.300s "
                         "(save_weights_for_sampler makes them)", tpath);
    else if (rc) tinker_reply_failure(res, &err, "model_path");
    if (!rc) rc = tinker_session_job(s, c, project, json_string_value(json_object_get(*ck, "base_model")),
                                     json_string_value(json_object_get(*ck, "base_dir")), job_id, cap, &err);
    if (rc && *ck) {
        if (err.code) tinker_reply_failure(res, &err, "model_path");
        json_decref(*ck);
        *ck = NULL;
    }
    return rc;
}

static void create_sampler(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                           const json_t *body) {
    const char *session = json_string_value(json_object_get(body, "session_id"));
    char id[TINKER_ID_BYTES], job_id[HTTP_ID_BYTES];
    struct smelt_error err = {0};
    int64_t n;
    int rc = session_ok(c, project, session, &err);
    if (!rc) rc = json_field_int(body, "sampling_session_seq_id", true, 0, 0, INT32_MAX, &n, "request", &err);
    if (!rc && snprintf(id, sizeof id, "%s:sample:%lld", session, (long long)n) >= (int)sizeof id)
        rc = error_set_field(&err, SMELT_EINVAL, "session_id", "session_id: too long");
    if (rc) {
        tinker_reply_failure(res, &err, NULL);
        return;
    }
    json_t *ck = NULL;
    if (sampler_source(s, c, res, project, body, &ck, job_id, sizeof job_id)) return;
    const char *base = ck ? json_string_value(json_object_get(ck, "base_model"))
                          : json_string_value(json_object_get(body, "base_model"));
    rc = store_exec(c, &err, "INSERT OR REPLACE INTO tinker_samplers (id, project_id, session_id, job_id, base_model, "
                    "model_id, adapter_path, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", "sssssssi", id, project,
                    session, job_id, base, NULL, ck ? json_string_value(json_object_get(ck, "path")) : NULL,
                    server_now());
    json_decref(ck);
    if (rc < 0) tinker_reply_failure(res, &err, NULL);
    else http_reply_json(res, 200, json_pack("{s:s, s:s}", "type", "create_sampling_session", "sampling_session_id", id));
}

void api_tinker_create_sampler(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_CREATE_SAMPLER, create_sampler);
}

static json_t *sampler_row(struct store_conn *c, struct http_response *res, const char *project, const char *id) {
    json_t *row = NULL;
    struct smelt_error err = {0};
    int rc = id ? store_query_one(c, &row, &err, "SELECT p.*, (SELECT k.id FROM tinker_checkpoints k WHERE k.path = "
                                  "p.adapter_path) AS model_path FROM tinker_samplers p WHERE p.id = ? AND "
                                  "p.project_id = ?", "ss", id, project)
                : SMELT_ENOTFOUND;
    if (rc == SMELT_ENOTFOUND)
        http_reply_error(res, 404, "sampling_session_id", "not_found", "sampling_session_id: no such sampler: %.200s",
                         id ? id : "(none)");
    else if (rc) tinker_reply_failure(res, &err, NULL);
    return rc ? NULL : row;
}

void api_tinker_get_sampler(void *app, struct http_request *req, struct http_response *res) {
    struct server *s = app;
    struct store_conn *c = server_conn(s, res);
    if (!c) return;
    json_t *row = sampler_row(c, res, req->identity.project, req->params[0]);
    store_release(s->store, c);
    if (!row) return;
    json_t *path = json_object_get(row, "model_path");
    http_reply_json(res, 200, json_pack("{s:O, s:O, s:O}", "sampler_id", json_object_get(row, "id"), "base_model",
                                        json_object_get(row, "base_model"), "model_path", path ? path : json_null()));
    json_decref(row);
}

/* prompt.chunks: encoded_text tokens only, as int32. *tokens malloc'd. */
static int prompt_tokens(const json_t *body, int32_t **tokens, size_t *n, struct smelt_error *err) {
    const json_t *chunks = json_object_get(json_object_get(body, "prompt"), "chunks"), *ch, *t;
    size_t i, j, total = 0;
    if (!json_is_array(chunks)) return error_set_field(err, SMELT_EINVAL, "prompt.chunks", "prompt.chunks: required");
    json_array_foreach(chunks, i, ch) {
        const char *type = json_string_value(json_object_get(ch, "type"));
        if (type && strcmp(type, "encoded_text") != 0)
            return error_set_field(err, SMELT_EUNSUPPORTED, "prompt.chunks", "prompt.chunks[%zu]: %s chunks are not "
                                   "supported (text models only)", i, type);
        total += json_array_size(json_object_get(ch, "tokens"));
    }
    if (total == 0) return error_set_field(err, SMELT_EINVAL, "prompt", "prompt: no tokens");
    if (!(*tokens = malloc(total * 4))) return error_set(err, SMELT_ENOMEM, "out of memory");
    *n = 0;
    json_array_foreach(chunks, i, ch) json_array_foreach(json_object_get(ch, "tokens"), j, t) {
        if (!body_integral(t) || json_number_value(t) < 0 || json_number_value(t) > INT32_MAX) {
            free(*tokens);
            return error_set_field(err, SMELT_EINVAL, "prompt.chunks", "prompt.chunks[%zu].tokens[%zu]: a token id "
                                   "is expected", i, j);
        }
        (*tokens)[(*n)++] = (int32_t)json_number_value(t);
    }
    return 0;
}

/* sampling_params.stop: absent (stop at eos), a string, strings, or token ids. */
static int stops_of(const json_t *stop, json_t *header, struct smelt_error *err) {
    if (!stop || json_is_null(stop)) return 0;
    json_t *ids = json_array(), *strs = json_array(), *v;
    size_t i;
    bool bad = !json_is_string(stop) && !json_is_array(stop);
    if (json_is_string(stop)) json_array_append(strs, (json_t *)stop);
    json_array_foreach(json_is_array(stop) ? stop : NULL, i, v) { /* a token id may be written 7.0 */
        if (json_is_string(v)) json_array_append(strs, v);
        else if (body_integral(v)) json_array_append_new(ids, json_integer((json_int_t)json_number_value(v)));
        else bad = true;
    }
    if (bad) {
        json_decref(ids), json_decref(strs);
        return error_set_field(err, SMELT_EINVAL, "sampling_params.stop", "sampling_params.stop: a string, strings "
                               "or token ids are expected");
    }
    json_object_set_new(header, "stop_token_ids", ids);
    json_object_set_new(header, "stop_strings", strs);
    return 0;
}

static int sample_header(const json_t *body, const json_t *sampler, json_t **out, int64_t *n,
                         struct smelt_error *err) {
    const json_t *sp = json_object_get(body, "sampling_params");
    json_t *h = json_object();
    if (!h) return error_set(err, SMELT_ENOMEM, "out of memory");
    static const char *const copied[] = {"max_tokens", "seed", "temperature", "top_k", "top_p", NULL};
    for (int i = 0; copied[i]; i++) {
        json_t *v = json_object_get(sp, copied[i]);
        if (v && !json_is_null(v)) json_object_set(h, copied[i], v);
    }
    /* what smelt does not compute (topk_sample_logprobs, ...) the rules refused by name */
    int rc = json_field_int(body, "num_samples", false, 1, 1, 256, n, "request", err);
    if (!rc) rc = stops_of(json_object_get(sp, "stop"), h, err);
    json_object_set_new(h, "num_samples", json_integer(*n));
    json_object_set_new(h, "prompt_logprobs", json_boolean(json_is_true(json_object_get(body, "prompt_logprobs"))));
    int64_t topk = 0; /* the worker keeps k logprobs per prompt token: bounded like the SDK's hosted service */
    if (!rc) rc = json_field_int(body, "topk_prompt_logprobs", false, 0, 0, TINKER_MAX_TOPK, &topk, "request", err);
    if (!rc && json_is_number(json_object_get(body, "topk_prompt_logprobs")))
        json_object_set_new(h, "topk_prompt_logprobs", json_integer(topk));
    const char *adapter = json_string_value(json_object_get(sampler, "adapter_path"));
    if (adapter) json_object_set_new(h, "adapter_path", json_string(adapter));
    if (rc) json_decref(h);
    else *out = h;
    return rc;
}

/* The sampler's session job, replaced (and the sampler row updated) when its job ended: idle release or a
 * restart leaves the row pointing at a job whose worker is gone. The old job's spec names the base. */
static int sampler_job(struct server *s, struct store_conn *c, const char *project, const json_t *sampler,
                       char *job_id, size_t cap, struct smelt_error *err) {
    const char *old = json_string_value(json_object_get(sampler, "job_id"));
    json_t *job = NULL;
    TRY(store_query_one(c, &job, err, "SELECT status, desired, json_extract(spec, '$.model') AS base_dir FROM jobs "
                        "WHERE id = ?", "s", old));
    const char *status = json_string_value(json_object_get(job, "status"));
    const char *desired = json_string_value(json_object_get(job, "desired"));
    const char *base_dir = json_string_value(json_object_get(job, "base_dir"));
    int rc = 0;
    if (status && desired && strcmp(desired, "run") == 0 &&
        (strcmp(status, "queued") == 0 || strcmp(status, "running") == 0))
        snprintf(job_id, cap, "%s", old);
    else rc = tinker_session_job(s, c, project, json_string_value(json_object_get(sampler, "base_model")), base_dir,
                                 job_id, cap, err);
    if (!rc && strcmp(job_id, old) != 0 &&
        store_exec(c, err, "UPDATE tinker_samplers SET job_id = ? WHERE id = ?", "ss", job_id,
                   json_string_value(json_object_get(sampler, "id"))) < 0)
        rc = err->code;
    json_decref(job);
    return rc;
}

static void asample(struct server *s, struct store_conn *c, struct http_response *res, const char *project,
                    const json_t *body) {
    const char *id = json_string_value(json_object_get(body, "sampling_session_id"));
    json_t *sampler = sampler_row(c, res, project, id), *header = NULL;
    if (!sampler) return;
    int32_t *tokens = NULL;
    size_t n_tokens = 0;
    int64_t n = 1, seq = (int64_t)json_number_value(json_object_get(body, "seq_id")); /* an integral real too */
    struct smelt_error err = {0};
    char job_id[HTTP_ID_BYTES];
    int rc = prompt_tokens(body, &tokens, &n_tokens, &err);
    if (!rc) rc = sample_header(body, sampler, &header, &n, &err);
    if (!rc) rc = sampler_job(s, c, project, sampler, job_id, sizeof job_id, &err);
    json_t *ids = rc ? NULL : json_array();
    for (int64_t i = 0; ids && i < n; i++)
        json_array_append_new(ids, json_sprintf("%s:%lld:%lld", id, (long long)seq, (long long)i));
    if (rc) {
        json_decref(header);
        tinker_reply_failure(res, &err, NULL);
    } else {
        struct msg_array a = {tokens, n_tokens * 4};
        tinker_submit(s, c, res, project, NULL, -1, job_id, "sample",
                      NULL, header, &a, 1, json_pack("{s:o}", "sample_sequence_ids", ids));
    }
    free(tokens);
    json_decref(sampler);
}

void api_tinker_asample(void *app, struct http_request *req, struct http_response *res) {
    tinker_with_body(app, req, res, TINKER_SAMPLE, asample);
}
