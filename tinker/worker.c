/* The worker's life: base model, tokenizer and engine; the request dispatch; replies,
 * metrics lines and path checks the ops share. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/file.h"
#include "common/log.h"
#include "tinker/tinker_internal.h"

static int load_tokenizer(const char *dir, struct tokenizer **out, struct smelt_error *err) {
    char file[TINKER_PATH_BYTES];
    *out = NULL;
    TRY(path_join(file, sizeof file, dir, "tokenizer.json", err));
    if (!path_exists(file)) {
        log_info("%s has no tokenizer.json: stop strings are refused", dir);
        return SMELT_OK;
    }
    return error_wrap(err, tokenizer_load(dir, out, err), "--model %s: tokenizer", dir);
}

int tinker_worker_create_on(struct model *model, const char *base_name, const struct tinker_config *config,
                            struct tinker_worker **out, struct smelt_error *err) {
    *out = NULL;
    if (strlen(base_name) >= TINKER_PATH_BYTES) {
        model_free(model);
        return error_set(err, SMELT_EINVAL, "--model: path longer than %d bytes", TINKER_PATH_BYTES - 1);
    }
    struct tinker_worker *w = calloc(1, sizeof *w);
    if (!w) {
        model_free(model);
        return error_set(err, SMELT_ENOMEM, "tinker worker: out of memory");
    }
    w->base = model;
    snprintf(w->base_name, sizeof w->base_name, "%s", base_name);
    rng_seed(&w->rng, config->seed ? config->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    /* The sampler's logprobs must equal a later forward's: same kernels whatever the
     * batch. CUDA has no such mode; its logprobs then agree only closely. */
    int rc = SMELT_OK;
    if (config->backend == BACKEND_CPU) rc = ops_set_batch_invariant(BACKEND_CPU, true, err);
    if (!rc && config->model_dir) rc = load_tokenizer(config->model_dir, &w->tok, err);
    struct rollout_config ec = {.kv_memory_bytes = config->kv_cache_bytes, .max_batch_tokens = 2048,
                                .max_seqs = 64, .prefill_chunk = 512};
    if (!rc) rc = error_wrap(err, rollout_engine_create(model, w->tok, &ec, &w->engine, err), "--kv-cache-mb");
    if (!rc && config->metrics_path && !(w->metrics = fopen(config->metrics_path, "a")))
        rc = error_set(err, SMELT_EIO, "--metrics %s: %s", config->metrics_path, strerror(errno));
    if (rc) {
        tinker_worker_free(w);
        return rc;
    }
    *out = w;
    return SMELT_OK;
}

int tinker_worker_create(const struct tinker_config *config, struct tinker_worker **out, struct smelt_error *err) {
    struct model *m = NULL;
    TRY(error_wrap(err, model_load(config->model_dir, config->backend, &m, err), "--model %s", config->model_dir));
    return tinker_worker_create_on(m, config->model_dir, config, out, err);
}

static void model_entry_free(struct tinker_model *m) {
    lora_free(m->lora);
    optimizer_free(&m->opt);
    free(m);
}

void tinker_worker_free(struct tinker_worker *w) {
    if (!w) return;
    rollout_engine_free(w->engine);
    while (w->models) {
        struct tinker_model *m = w->models;
        w->models = m->next;
        model_entry_free(m);
    }
    while (w->adapters) {
        struct tinker_cached_adapter *a = w->adapters;
        w->adapters = a->next;
        lora_free(a->lora);
        free(a);
    }
    if (w->metrics) fclose(w->metrics);
    tokenizer_free(w->tok);
    model_free(w->base);
    free(w);
}

const struct model *tinker_worker_model(const struct tinker_worker *w) { return w->base; }
const char *tinker_worker_base_name(const struct tinker_worker *w) { return w->base_name; }

struct tinker_model *tinker_model_find(struct tinker_worker *w, const char *id) {
    for (struct tinker_model *m = w->models; m; m = m->next)
        if (strcmp(m->id, id) == 0) return m;
    return NULL;
}

int tinker_model_of(struct tinker_worker *w, const json_t *h, struct tinker_model **out, struct smelt_error *err) {
    const char *id;
    TRY(json_field_string(h, "model_id", true, NULL, &id, "request", err));
    if (!(*out = tinker_model_find(w, id)))
        return error_set_field(err, SMELT_ENOTFOUND, "model_id", "model_id: no model \"%s\" in this worker", id);
    return SMELT_OK;
}

/* ---- create_model, unload_model ---- */

/* The targets of the Tinker switches, in this architecture's PEFT names. */
static void lora_targets(const struct model *base, const struct tinker_model *m, struct lora_config *c) {
    bool gpt2 = base->config.mlp == MODEL_MLP_GELU;
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"}, *const mlp[] = {
        "gate_proj", "up_proj", "down_proj"};
    static const char *const attn2[] = {"c_attn", "attn.c_proj"}, *const mlp2[] = {"c_fc", "mlp.c_proj"};
    const char *const *a = gpt2 ? attn2 : attn, *const *f = gpt2 ? mlp2 : mlp;
    int na = gpt2 ? 2 : 4, nf = gpt2 ? 2 : 3;
    for (int i = 0; m->train_attn && i < na; i++) snprintf(c->targets[c->n_targets++], sizeof c->targets[0], "%s", a[i]);
    for (int i = 0; m->train_mlp && i < nf; i++) snprintf(c->targets[c->n_targets++], sizeof c->targets[0], "%s", f[i]);
    if (m->train_unembed) snprintf(c->targets[c->n_targets++], sizeof c->targets[0], "lm_head");
}

static int lora_request(const json_t *h, struct tinker_model *m, struct smelt_error *err) {
    static const char *const keys[] = {"rank", "alpha", "seed", "train_attn", "train_mlp", "train_unembed", NULL};
    const json_t *l = json_object_get(h, "lora");
    if (!json_is_object(l)) return error_set_field(err, SMELT_EINVAL, "lora", "lora: required object");
    int64_t rank, seed;
    double alpha;
    int rc = json_check_keys(l, keys, "lora", err);
    if (!rc) rc = json_field_int(l, "rank", true, 0, 1, 4096, &rank, "lora", err);
    if (!rc) rc = json_field_double(l, "alpha", false, TINKER_LORA_ALPHA, 1e-6, 1e6, &alpha, "lora", err);
    if (!rc) rc = json_field_int(l, "seed", false, 0, 0, INT64_MAX, &seed, "lora", err);
    if (!rc) rc = json_field_bool(l, "train_attn", false, true, &m->train_attn, "lora", err);
    if (!rc) rc = json_field_bool(l, "train_mlp", false, true, &m->train_mlp, "lora", err);
    if (!rc) rc = json_field_bool(l, "train_unembed", false, true, &m->train_unembed, "lora", err);
    if (rc) return error_in_field(err, rc, "lora");
    if (!m->train_attn && !m->train_mlp && !m->train_unembed)
        return error_set_field(err, SMELT_EINVAL, "lora", "lora: train_attn, train_mlp and train_unembed are all false");
    m->rank = (int)rank, m->seed = (uint64_t)seed, m->alpha = (float)alpha;
    return SMELT_OK;
}

/* The adapter and its optimizer for m's config. An lm_head target lora/ refuses is the
 * request's train_unembed. */
int tinker_model_build(struct tinker_worker *w, struct tinker_model *m, struct smelt_error *err) {
    struct lora_config c = {.rank = m->rank, .alpha = m->alpha};
    lora_targets(w->base, m, &c);
    int rc = lora_create(w->base, &c, m->seed, &m->lora, err);
    if (rc && m->train_unembed && strstr(err->message, "lm_head")) {
        char why[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", err->message);
        return error_set_field(err, rc, "lora.train_unembed", "lora.train_unembed: %s", why);
    }
    if (rc) return error_in_field(err, rc, "lora");
    return optimizer_init(&m->opt, &m->lora->weights, err);
}

int tinker_op_create_model(struct tinker_worker *w, const struct msg *msg, struct tinker_reply *out,
                           struct smelt_error *err) {
    const char *id;
    TRY(json_field_string(msg->header, "model_id", true, NULL, &id, "request", err));
    if (!id[0] || strlen(id) >= TINKER_ID_BYTES)
        return error_set_field(err, SMELT_EINVAL, "model_id", "model_id: 1..%d bytes", TINKER_ID_BYTES - 1);
    if (tinker_model_find(w, id))
        return error_set_field(err, SMELT_EINVAL, "model_id", "model_id: \"%s\" already exists in this worker", id);
    struct tinker_model *m = calloc(1, sizeof *m);
    if (!m) return error_set(err, SMELT_ENOMEM, "create_model: out of memory");
    snprintf(m->id, sizeof m->id, "%s", id);
    int rc = lora_request(msg->header, m, err);
    if (!rc) rc = tinker_model_build(w, m, err);
    if (!rc && !(out->result = json_object())) rc = error_set(err, SMELT_ENOMEM, "create_model: out of memory");
    if (rc) {
        model_entry_free(m);
        return rc;
    }
    m->next = w->models;
    w->models = m;
    return SMELT_OK;
}

int tinker_op_unload_model(struct tinker_worker *w, const struct msg *msg, struct tinker_reply *out,
                           struct smelt_error *err) {
    struct tinker_model *m;
    TRY(tinker_model_of(w, msg->header, &m, err));
    if (!(out->result = json_object())) return error_set(err, SMELT_ENOMEM, "unload_model: out of memory");
    for (struct tinker_model **p = &w->models; *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            break;
        }
    model_entry_free(m);
    return SMELT_OK;
}

/* ---- shared helpers ---- */

int tinker_path_check(const char *path, const char *field, struct smelt_error *err) {
    size_t n = strlen(path);
    if (n == 0 || n >= TINKER_PATH_BYTES - 64 || path[0] != '/')
        return error_set_field(err, SMELT_EINVAL, field, "%s: must be an absolute path of at most %d bytes", field,
                               TINKER_PATH_BYTES - 65);
    for (const char *p = path; (p = strstr(p, "..")); p += 2)
        if ((p == path || p[-1] == '/') && (p[2] == '/' || p[2] == '\0'))
            return error_set_field(err, SMELT_EINVAL, field, "%s: \"..\" is not allowed in a path", field);
    return SMELT_OK;
}

int tinker_reply_add(struct tinker_reply *r, void *data, size_t bytes, struct smelt_error *err) {
    if (r->n_arrays >= MSG_MAX_ARRAYS) {
        free(data);
        return error_set(err, SMELT_EINVAL, "tinker reply: more than %d arrays", MSG_MAX_ARRAYS);
    }
    r->arrays[r->n_arrays++] = (struct msg_array){data, bytes};
    return SMELT_OK;
}

void tinker_reply_free(struct tinker_reply *r) {
    if (!r) return;
    json_decref(r->result);
    for (int i = 0; i < r->n_arrays; i++) free(r->arrays[i].data);
    *r = (struct tinker_reply){0};
}

void tinker_metrics_write(struct tinker_worker *w, const char *op, const struct tinker_model *m,
                          const json_t *metrics, double ms) {
    if (!w->metrics) return;
    json_t *line = json_pack("{s:s, s:s, s:s, s:I, s:O, s:f}", "type", "tinker", "op", op, "model_id", m->id, "step",
                             (json_int_t)m->opt.step, "metrics", metrics, "ms", ms);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    if (!text || fprintf(w->metrics, "%s\n", text) < 0 || fflush(w->metrics))
        log_warn("tinker metrics: could not write a line for %s", op);
    free(text);
    json_decref(line);
}
