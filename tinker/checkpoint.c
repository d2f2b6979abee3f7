/* save_weights (full state: adapter/, optimizer.safetensors, state.json),
 * save_weights_for_sampler (a PEFT adapter directory) and load_weights. A checkpoint is
 * written into "<path>.partial" and only then replaces what is at path (dir_replace: one
 * atomic swap), so a crash or a failed save never leaves half of one at path, and an
 * overwritten checkpoint stays usable until its replacement is complete. */
#include <stdio.h>
#include <string.h>

#include "common/file.h"
#include "tinker/tinker_internal.h"

static int join(char *dst, const char *dir, const char *name, struct smelt_error *err) {
    return path_join(dst, TINKER_PATH_BYTES, dir, name, err);
}

static json_t *state_json(const struct tinker_worker *w, const struct tinker_model *m) {
    return json_pack("{s:I, s:s, s:{s:i, s:f, s:I, s:b, s:b, s:b}}", "step", (json_int_t)m->opt.step, "base_model",
                     w->base_name, "lora", "rank", m->rank, "alpha", (double)m->alpha, "seed", (json_int_t)m->seed,
                     "train_attn", m->train_attn, "train_mlp", m->train_mlp, "train_unembed", m->train_unembed);
}

static int write_full(const struct tinker_worker *w, const struct tinker_model *m, const char *dir,
                      struct smelt_error *err) {
    char p[TINKER_PATH_BYTES];
    TRY(join(p, dir, "adapter", err));
    TRY(lora_save(m->lora, p, w->base_name, err));
    TRY(join(p, dir, "optimizer.safetensors", err));
    TRY(optimizer_save(&m->opt, p, err));
    TRY(join(p, dir, "state.json", err));
    json_t *st = state_json(w, m);
    if (!st) return error_set(err, SMELT_ENOMEM, "state.json: out of memory");
    int rc = json_save_atomic(st, JSON_INDENT(2) | JSON_SORT_KEYS, p, err);
    json_decref(st);
    return rc;
}

int tinker_op_save_weights(struct tinker_worker *w, const struct msg *msg, bool for_sampler, struct tinker_reply *out,
                           struct smelt_error *err) {
    struct tinker_model *m;
    const char *path;
    TRY(tinker_model_of(w, msg->header, &m, err));
    TRY(json_field_string(msg->header, "path", true, NULL, &path, "request", err));
    TRY(tinker_path_check(path, "path", err));
    bool overwrite = false;
    TRY(json_field_bool(msg->header, "overwrite", false, false, &overwrite, "request", err));
    if (!overwrite && path_exists(path))
        return error_set_field(err, SMELT_EINVAL, "path", "path: %s exists (overwrite: true replaces it)", path);
    char tmp[TINKER_PATH_BYTES];
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    if (path_exists(tmp)) TRY(dir_remove_all(tmp, err));
    int rc = for_sampler ? lora_save(m->lora, tmp, w->base_name, err) : dir_create_all(tmp, err);
    if (!rc && !for_sampler) rc = write_full(w, m, tmp, err);
    if (!rc && dir_replace(tmp, path, err) != 0) {
        char why[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", err->message);
        rc = error_set_field(err, SMELT_EIO, "path", "path: %s", why);
    }
    if (rc) {
        dir_remove_all(tmp, &(struct smelt_error){0});
        return rc;
    }
    if (!(out->result = json_object())) return error_set(err, SMELT_ENOMEM, "save_weights: out of memory");
    return SMELT_OK;
}

/* ---- load_weights ---- */

static int differs(const char *field, const char *what, struct smelt_error *err) {
    return error_set_field(err, SMELT_EINVAL, field, "path: the checkpoint's %s differs from this model's (%s)", field,
                           what);
}

/* state.json against m: same base, rank, alpha and targets. */
static int state_check(const struct tinker_worker *w, const struct tinker_model *m, const char *dir,
                       struct smelt_error *err) {
    char p[TINKER_PATH_BYTES];
    json_t *st = NULL;
    TRY(join(p, dir, "state.json", err));
    int rc = json_load_path(p, &st, err);
    if (rc) {
        char why[SMELT_ERROR_MESSAGE_BYTES];
        snprintf(why, sizeof why, "%s", err->message);
        return error_set_field(err, rc == SMELT_EIO ? SMELT_ENOTFOUND : rc, "path", "path: %s", why);
    }
    const char *base = json_string_value(json_object_get(st, "base_model"));
    const json_t *l = json_object_get(st, "lora");
    if (!base || strcmp(base, w->base_name) != 0) rc = differs("base_model", base ? base : "none", err);
    else if (json_integer_value(json_object_get(l, "rank")) != m->rank) rc = differs("lora.rank", "rank", err);
    else if (json_real_value(json_object_get(l, "alpha")) != (double)m->alpha) rc = differs("lora.alpha", "alpha", err);
    else if (json_is_true(json_object_get(l, "train_attn")) != m->train_attn)
        rc = differs("lora.train_attn", "attention targets", err);
    else if (json_is_true(json_object_get(l, "train_mlp")) != m->train_mlp)
        rc = differs("lora.train_mlp", "MLP targets", err);
    else if (json_is_true(json_object_get(l, "train_unembed")) != m->train_unembed)
        rc = differs("lora.train_unembed", "lm_head target", err);
    json_decref(st);
    return rc;
}

/* The adapter's weights into m's (same layout: state_check agreed on the config). */
static int weights_load(struct tinker_worker *w, struct tinker_model *m, const char *dir, struct smelt_error *err) {
    char p[TINKER_PATH_BYTES];
    struct lora *l = NULL;
    TRY(join(p, dir, "adapter", err));
    int rc = lora_load(w->base, p, &l, err);
    if (!rc && l->n_weights != m->lora->n_weights)
        rc = error_set_field(err, SMELT_EINVAL, "path", "path: the adapter holds %lld weights, this model %lld",
                             (long long)l->n_weights, (long long)m->lora->n_weights);
    if (!rc) rc = tensor_copy(&m->lora->weights, &l->weights, err);
    lora_free(l);
    return rc;
}

int tinker_op_load_weights(struct tinker_worker *w, const struct msg *msg, struct tinker_reply *out,
                           struct smelt_error *err) {
    struct tinker_model *m;
    const char *path;
    bool with_opt;
    TRY(tinker_model_of(w, msg->header, &m, err));
    TRY(json_field_string(msg->header, "path", true, NULL, &path, "request", err));
    TRY(json_field_bool(msg->header, "optimizer", false, false, &with_opt, "request", err));
    TRY(tinker_path_check(path, "path", err));
    TRY(state_check(w, m, path, err));
    char p[TINKER_PATH_BYTES];
    TRY(join(p, path, "optimizer.safetensors", err));
    /* The optimizer first: a file that does not load leaves the model as it was. */
    struct optimizer opt = {0};
    int rc = optimizer_init(&opt, &m->lora->weights, err);
    if (!rc && with_opt) rc = optimizer_load(&opt, p, err);
    if (!rc) rc = weights_load(w, m, path, err);
    if (!rc) rc = tensor_zero(&m->lora->grads, err);
    if (rc) {
        optimizer_free(&opt);
        return rc;
    }
    optimizer_free(&m->opt);
    m->opt = opt;
    if (!(out->result = json_object())) return error_set(err, SMELT_ENOMEM, "load_weights: out of memory");
    return SMELT_OK;
}
