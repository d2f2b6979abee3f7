/* Writing struct model_config as a Hugging Face config.json. The object is read back
 * with model_config_from_json before it is returned, so a config that config.json cannot
 * express (llama with q/k/v bias but no o bias, a gpt2 with grouped-query heads) is an
 * error naming the field instead of a file that loads as a different model. */
#include "model/config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *torch_dtype_name(enum dtype d) {
    switch (d) {
    case DTYPE_F32: return "float32";
    case DTYPE_BF16: return "bfloat16";
    case DTYPE_F16: return "float16";
    default: return NULL;
    }
}

/* Collects set failures (allocation) so the writers below read as field lists. */
struct builder {
    json_t *obj;
    bool bad;
};

static void put(struct builder *b, const char *key, json_t *value) {
    if (json_object_set_new(b->obj, key, value) != 0) b->bad = true; /* takes value */
}

static void put_int(struct builder *b, const char *key, int64_t v) {
    put(b, key, json_integer((json_int_t)v));
}

static json_t *window_json(int64_t window) {
    return window > 0 ? json_integer((json_int_t)window) : json_null();
}

static void put_common(struct builder *b, const struct model_config *c) {
    put(b, "architectures", json_pack("[s]", c->architecture));
    put(b, "model_type", json_string(model_type_name(c->type)));
    put_int(b, "vocab_size", c->vocab_size);
    put(b, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    put(b, "torch_dtype", json_string(torch_dtype_name(c->torch_dtype)));
    if (c->bos_token_id >= 0) put_int(b, "bos_token_id", c->bos_token_id);
    if (c->pad_token_id >= 0) put_int(b, "pad_token_id", c->pad_token_id);
    if (c->n_eos_token_ids == 1) put_int(b, "eos_token_id", c->eos_token_ids[0]);
    if (c->n_eos_token_ids > 1) {
        json_t *ids = json_array();
        for (int i = 0; ids && i < c->n_eos_token_ids; i++)
            if (json_array_append_new(ids, json_integer((json_int_t)c->eos_token_ids[i])))
                b->bad = true;
        put(b, "eos_token_id", ids);
    }
}

/* A one-label classifier as transformers saves one (id2label/label2id), plus
 * num_labels for readers that look for that key. */
static void put_labels(struct builder *b, const struct model_config *c) {
    if (!c->score_head) return;
    put_int(b, "num_labels", 1);
    put(b, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
    put(b, "label2id", json_pack("{s:i}", "LABEL_0", 0));
}

static void put_gpt2(struct builder *b, const struct model_config *c) {
    put_int(b, "n_embd", c->hidden_size);
    put_int(b, "n_layer", c->n_layers);
    put_int(b, "n_head", c->n_heads);
    put_int(b, "n_inner", c->intermediate_size);
    put_int(b, "n_positions", c->max_position_embeddings);
    put(b, "layer_norm_epsilon", json_real(c->norm_eps));
    put(b, "activation_function", json_string(c->hidden_act));
}

/* rope_scaling as transformers 4 writes it (transformers 5 reads it as rope_parameters):
 * null when unscaled, else the type and every parameter model/rope.c uses. */
static json_t *rope_scaling_json(const struct model_rope_scaling *s) {
    if (s->type == MODEL_ROPE_DEFAULT) return json_null();
    json_t *o = json_pack("{s:s, s:f}", "rope_type", model_rope_type_name(s->type), "factor", s->factor);
    if (!o || s->type == MODEL_ROPE_LINEAR) return o;
    bool bad = json_object_set_new(o, "original_max_position_embeddings",
                                   json_integer((json_int_t)s->original_max_position_embeddings)) != 0;
    if (s->type == MODEL_ROPE_LLAMA3) {
        bad = bad || json_object_set_new(o, "low_freq_factor", json_real(s->low_freq_factor)) != 0;
        bad = bad || json_object_set_new(o, "high_freq_factor", json_real(s->high_freq_factor)) != 0;
    } else {
        bad = bad || json_object_set_new(o, "beta_fast", json_real(s->beta_fast)) != 0;
        bad = bad || json_object_set_new(o, "beta_slow", json_real(s->beta_slow)) != 0;
        bad = bad || json_object_set_new(o, "truncate", json_boolean(s->truncate)) != 0;
        if (s->attention_factor > 0)
            bad = bad || json_object_set_new(o, "attention_factor", json_real(s->attention_factor)) != 0;
        if (s->mscale != 0) bad = bad || json_object_set_new(o, "mscale", json_real(s->mscale)) != 0;
        if (s->mscale_all_dim != 0)
            bad = bad || json_object_set_new(o, "mscale_all_dim", json_real(s->mscale_all_dim)) != 0;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void put_rope_family(struct builder *b, const struct model_config *c) {
    put_int(b, "hidden_size", c->hidden_size);
    put_int(b, "num_hidden_layers", c->n_layers);
    put_int(b, "num_attention_heads", c->n_heads);
    put_int(b, "num_key_value_heads", c->n_kv_heads);
    /* Qwen2Config has no head_dim field (the model reads one if present): write it only
     * when hidden / heads cannot give it. */
    bool derived = c->hidden_size % c->n_heads == 0 && c->hidden_size / c->n_heads == c->head_dim;
    if (c->type != MODEL_TYPE_QWEN2 || !derived) put_int(b, "head_dim", c->head_dim);
    put_int(b, "intermediate_size", c->intermediate_size);
    put_int(b, "max_position_embeddings", c->max_position_embeddings);
    put(b, "hidden_act", json_string(c->hidden_act));
    put(b, "rms_norm_eps", json_real(c->norm_eps));
    put(b, "rope_theta", json_real(c->rope_theta));
    put(b, "rope_scaling", rope_scaling_json(&c->rope_scaling));
    switch (c->type) {
    case MODEL_TYPE_LLAMA:
        put(b, "attention_bias", json_boolean(c->qkv_bias));
        put(b, "mlp_bias", json_boolean(c->mlp_bias));
        break;
    case MODEL_TYPE_MISTRAL: put(b, "sliding_window", window_json(c->sliding_window)); break;
    case MODEL_TYPE_QWEN2:
    case MODEL_TYPE_QWEN3:
        if (c->type == MODEL_TYPE_QWEN3) put(b, "attention_bias", json_boolean(c->qkv_bias));
        put(b, "use_sliding_window", json_boolean(c->sliding_window > 0));
        put(b, "sliding_window", window_json(c->sliding_window));
        put_int(b, "max_window_layers", c->max_window_layers);
        break;
    default: break;
    }
}

/* The first field where a and b differ, or NULL. */
static const char *first_difference(const struct model_config *a, const struct model_config *b) {
#define DIFF(f) \
    if (a->f != b->f) return #f
    DIFF(type);
    if (strcmp(a->architecture, b->architecture) != 0) return "architecture";
    DIFF(hidden_size); DIFF(n_layers); DIFF(n_heads); DIFF(n_kv_heads); DIFF(head_dim);
    DIFF(intermediate_size); DIFF(vocab_size); DIFF(max_position_embeddings);
    DIFF(max_seq_len); DIFF(norm); DIFF(mlp); DIFF(positions); DIFF(norm_eps);
    DIFF(rope_theta);
    if (!model_rope_scaling_equal(&a->rope_scaling, &b->rope_scaling)) return "rope_scaling";
    if (strcmp(a->hidden_act, b->hidden_act) != 0) return "hidden_act";
    DIFF(qkv_bias); DIFF(o_bias); DIFF(mlp_bias); DIFF(qk_norm); DIFF(tie_word_embeddings);
    DIFF(score_head);
    DIFF(sliding_window); DIFF(max_window_layers); DIFF(torch_dtype);
    DIFF(bos_token_id); DIFF(pad_token_id); DIFF(n_eos_token_ids);
    for (int i = 0; i < a->n_eos_token_ids && i < MODEL_CONFIG_MAX_EOS; i++)
        DIFF(eos_token_ids[i]);
#undef DIFF
    return NULL;
}

int model_config_to_json(const struct model_config *cfg, json_t **out,
                         struct smelt_error *err) {
    if (!cfg || !out) return error_set(err, SMELT_EINVAL, "model_config_to_json: NULL argument");
    *out = NULL;
    if ((unsigned)cfg->type >= MODEL_TYPE_COUNT || !torch_dtype_name(cfg->torch_dtype) ||
        cfg->n_heads < 1 || cfg->n_eos_token_ids < 0 ||
        cfg->n_eos_token_ids > MODEL_CONFIG_MAX_EOS)
        return error_set(err, SMELT_EINVAL,
                         "model_config_to_json: invalid model type, torch_dtype, head count or "
                         "eos count");
    struct builder b = {json_object(), false};
    if (!b.obj) return error_set(err, SMELT_ENOMEM, "model_config_to_json: out of memory");
    put_common(&b, cfg);
    put_labels(&b, cfg);
    if (cfg->type == MODEL_TYPE_GPT2) put_gpt2(&b, cfg);
    else put_rope_family(&b, cfg);
    if (b.bad) {
        json_decref(b.obj);
        return error_set(err, SMELT_ENOMEM, "model_config_to_json: out of memory");
    }
    struct model_config back;
    int rc = model_config_from_json(b.obj, "model_config_to_json", &back, err);
    const char *field = rc ? NULL : first_difference(cfg, &back);
    if (field)
        rc = error_set(err, SMELT_EINVAL,
                       "model_config_to_json: field '%s' cannot be expressed in a %s "
                       "config.json (inconsistent with the other fields)",
                       field, model_type_name(cfg->type));
    if (rc) {
        json_decref(b.obj);
        return rc;
    }
    *out = b.obj;
    return SMELT_OK;
}

/* The config.json text: reals with 15 significant digits when that reads back as the
 * same config (1e-06 rather than 9.9999999999999995e-07), else with all 17. */
static size_t config_dump_flags(const struct model_config *cfg, const json_t *obj) {
    const size_t short_reals = JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15);
    char *text = json_dumps(obj, short_reals);
    json_t *back_json = text ? json_loads(text, 0, NULL) : NULL;
    struct model_config back;
    bool same = back_json && model_config_from_json(back_json, "config.json", &back, NULL) == 0 &&
                first_difference(cfg, &back) == NULL;
    json_decref(back_json);
    free(text);
    return same ? short_reals : JSON_INDENT(2) | JSON_SORT_KEYS;
}

int model_config_save(const struct model_config *cfg, const char *dir,
                      struct smelt_error *err) {
    if (!dir) return error_set(err, SMELT_EINVAL, "model_config_save: NULL dir");
    json_t *obj = NULL;
    int rc = model_config_to_json(cfg, &obj, err);
    if (rc) return rc;
    char path[PATH_MAX];
    rc = dir_create_all(dir, err);
    if (!rc) rc = path_join(path, sizeof path, dir, "config.json", err);
    if (!rc) rc = json_save_atomic(obj, config_dump_flags(cfg, obj), path, err);
    json_decref(obj);
    return rc;
}
