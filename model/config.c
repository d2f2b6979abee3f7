/* Reading a Hugging Face config.json into struct model_config: defaults of each
 * transformers config class, refusals of what smelt does not implement, and the
 * consistency of the dimensions. Writing is in config_write.c. */
#include "model/config_internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[MODEL_TYPE_COUNT] = {
    [MODEL_TYPE_LLAMA] = "llama", [MODEL_TYPE_MISTRAL] = "mistral",
    [MODEL_TYPE_QWEN2] = "qwen2", [MODEL_TYPE_QWEN3] = "qwen3",
    [MODEL_TYPE_GPT2] = "gpt2",
};

static const char *const default_architecture[MODEL_TYPE_COUNT] = {
    [MODEL_TYPE_LLAMA] = "LlamaForCausalLM", [MODEL_TYPE_MISTRAL] = "MistralForCausalLM",
    [MODEL_TYPE_QWEN2] = "Qwen2ForCausalLM", [MODEL_TYPE_QWEN3] = "Qwen3ForCausalLM",
    [MODEL_TYPE_GPT2] = "GPT2LMHeadModel",
};

/* The __init__ defaults of LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config and
 * GPT2Config. kv_heads -1: num_attention_heads. head_dim 0: hidden / heads.
 * intermediate 0: 4 * hidden (GPT-2's n_inner). window 0: none. */
static const struct type_defaults {
    int64_t vocab, hidden, intermediate, layers, heads, kv_heads, max_pos, head_dim;
    double eps;
    bool tie;
    int64_t window, max_window_layers;
} defaults[MODEL_TYPE_COUNT] = {
    [MODEL_TYPE_LLAMA] = {32000, 4096, 11008, 32, 32, -1, 2048, 0, 1e-6, false, 0, 0},
    [MODEL_TYPE_MISTRAL] = {32000, 4096, 14336, 32, 32, 8, 131072, 0, 1e-6, false, 4096, 0},
    [MODEL_TYPE_QWEN2] = {151936, 4096, 22016, 32, 32, 32, 32768, 0, 1e-6, false, 4096, 28},
    [MODEL_TYPE_QWEN3] = {151936, 4096, 22016, 32, 32, 32, 32768, 128, 1e-6, false, 4096, 28},
    [MODEL_TYPE_GPT2] = {50257, 768, 0, 12, 12, -1, 1024, 0, 1e-5, true, 0, 0},
};

const char *model_type_name(enum model_type type) {
    return (unsigned)type < MODEL_TYPE_COUNT ? type_names[type] : "invalid-model-type";
}

/* The fields of config.json being read, and where to report problems. */
struct reader {
    const json_t *root;
    const char *where;
    struct smelt_error *err;
};

static int get_int(const struct reader *r, const char *key, int64_t def, int64_t min,
                   int64_t max, int64_t *out) {
    return json_field_int(r->root, key, false, def, min, max, out, r->where, r->err);
}

/* GPT2Config maps hidden_size → n_embd and so on, so either name may appear. */
static int get_int_alias(const struct reader *r, const char *key, const char *alias,
                         int64_t def, int64_t min, int64_t max, int64_t *out) {
    const json_t *v = json_object_get(r->root, key);
    return get_int(r, v || !json_object_get(r->root, alias) ? key : alias, def, min, max, out);
}

static bool is_null(const json_t *root, const char *key) {
    return json_is_null(json_object_get(root, key));
}

static bool present(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    return v && !json_is_null(v);
}

#define DIM_MAX (INT64_C(1) << 20)
#define COUNT_MAX (INT64_C(1) << 16)

static int parse_type(const struct reader *r, struct model_config *c) {
    const char *s = NULL;
    int rc = json_field_string(r->root, "model_type", true, NULL, &s, r->where, r->err);
    if (rc) return rc;
    for (int t = 0; t < MODEL_TYPE_COUNT; t++)
        if (strcmp(s, type_names[t]) == 0) {
            c->type = (enum model_type)t;
            return SMELT_OK;
        }
    return error_set(r->err, SMELT_EUNSUPPORTED,
                     "%s: model_type '%s' is not supported (llama, mistral, qwen2, qwen3, "
                     "gpt2)",
                     r->where, s);
}

static int parse_architecture(const struct reader *r, struct model_config *c) {
    const char *name = default_architecture[c->type];
    const json_t *a = json_object_get(r->root, "architectures");
    if (a && !json_is_null(a)) {
        if (!json_is_array(a) || (json_array_size(a) > 0 && !json_is_string(json_array_get(a, 0))))
            return error_set(r->err, SMELT_EINVAL,
                             "%s: field 'architectures' must be a list of class names", r->where);
        if (json_array_size(a) > 0) name = json_string_value(json_array_get(a, 0));
    }
    if (strlen(name) >= sizeof c->architecture)
        return error_set(r->err, SMELT_EINVAL, "%s: architecture name '%s' is too long",
                         r->where, name);
    snprintf(c->architecture, sizeof c->architecture, "%s", name);
    return SMELT_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* transformers takes the label count from num_labels when given, else from the size
 * of id2label, else 2 (PretrainedConfig's default): a classifier config without either
 * is a two-label one. */
static int parse_labels(const struct reader *r, int64_t *n) {
    const json_t *id2label = json_object_get(r->root, "id2label");
    int64_t def = json_is_object(id2label) ? (int64_t)json_object_size(id2label) : 2;
    return get_int(r, "num_labels", def, 0, INT32_MAX, n);
}

/* The head architectures[0] names: a causal LM's lm_head, or a one-label sequence
 * classifier's score (a reward model). Other heads would load as the wrong model. */
static int parse_head(const struct reader *r, struct model_config *c) {
    static const char *const refused[] = {"ForTokenClassification", "ForQuestionAnswering"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (ends_with(c->architecture, refused[i]))
            return error_set(r->err, SMELT_EUNSUPPORTED,
                             "%s: architecture '%s' is not supported (smelt loads causal LMs "
                             "and one-label *ForSequenceClassification reward models)",
                             r->where, c->architecture);
    c->score_head = ends_with(c->architecture, "ForSequenceClassification");
    if (!c->score_head) return SMELT_OK;
    int64_t n = 0;
    TRY(parse_labels(r, &n));
    if (n != 1)
        return error_set(r->err, SMELT_EUNSUPPORTED,
                         "%s: %s with %lld labels is not supported: smelt's sequence "
                         "classifiers are reward models with one label (num_labels 1)",
                         r->where, c->architecture, (long long)n);
    return SMELT_OK;
}

/* num_key_value_heads: absent → the class default; null → num_attention_heads. */
static int parse_kv_heads(const struct reader *r, struct model_config *c) {
    int64_t def = defaults[c->type].kv_heads;
    if (def < 0 || is_null(r->root, "num_key_value_heads")) def = c->n_heads;
    return get_int(r, "num_key_value_heads", def, 1, COUNT_MAX, &c->n_kv_heads);
}

/* head_dim: given, or the class default (qwen3: 128), or hidden / heads. */
static int parse_head_dim(const struct reader *r, struct model_config *c) {
    bool given = present(r->root, "head_dim");
    if (!given && !is_null(r->root, "head_dim") && defaults[c->type].head_dim > 0) {
        c->head_dim = defaults[c->type].head_dim;
        return SMELT_OK;
    }
    if (given) return get_int(r, "head_dim", 0, 1, COUNT_MAX, &c->head_dim);
    if (c->hidden_size % c->n_heads != 0)
        return error_set(r->err, SMELT_EINVAL,
                         "%s: hidden_size %lld is not divisible by num_attention_heads %lld "
                         "and head_dim is not given",
                         r->where, (long long)c->hidden_size, (long long)c->n_heads);
    c->head_dim = c->hidden_size / c->n_heads;
    return SMELT_OK;
}

static int parse_shapes_rope(const struct reader *r, struct model_config *c) {
    const struct type_defaults *d = &defaults[c->type];
    int rc = get_int(r, "hidden_size", d->hidden, 1, DIM_MAX, &c->hidden_size);
    if (!rc) rc = get_int(r, "num_hidden_layers", d->layers, 1, COUNT_MAX, &c->n_layers);
    if (!rc) rc = get_int(r, "num_attention_heads", d->heads, 1, COUNT_MAX, &c->n_heads);
    if (!rc) rc = parse_kv_heads(r, c);
    if (!rc) rc = parse_head_dim(r, c);
    if (!rc)
        rc = get_int(r, "intermediate_size", d->intermediate, 1, DIM_MAX * 16,
                     &c->intermediate_size);
    if (!rc) rc = get_int(r, "vocab_size", d->vocab, 1, INT32_MAX, &c->vocab_size);
    if (!rc)
        rc = get_int(r, "max_position_embeddings", d->max_pos, 1, INT64_C(1) << 30,
                     &c->max_position_embeddings);
    if (!rc)
        rc = json_field_double(r->root, "rms_norm_eps", false, d->eps, 1e-30, 1.0, &c->norm_eps,
                               r->where, r->err);
    return rc;
}

static int parse_shapes_gpt2(const struct reader *r, struct model_config *c) {
    const struct type_defaults *d = &defaults[c->type];
    int rc = get_int_alias(r, "n_embd", "hidden_size", d->hidden, 1, DIM_MAX, &c->hidden_size);
    if (!rc)
        rc = get_int_alias(r, "n_layer", "num_hidden_layers", d->layers, 1, COUNT_MAX,
                           &c->n_layers);
    if (!rc)
        rc = get_int_alias(r, "n_head", "num_attention_heads", d->heads, 1, COUNT_MAX,
                           &c->n_heads);
    if (!rc && c->hidden_size % c->n_heads != 0)
        rc = error_set(r->err, SMELT_EINVAL, "%s: n_embd %lld is not divisible by n_head %lld",
                       r->where, (long long)c->hidden_size, (long long)c->n_heads);
    if (rc) return rc;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->hidden_size / c->n_heads;
    rc = get_int(r, "n_inner", 4 * c->hidden_size, 1, DIM_MAX * 16, &c->intermediate_size);
    if (!rc) rc = get_int(r, "vocab_size", d->vocab, 1, INT32_MAX, &c->vocab_size);
    if (!rc)
        rc = get_int_alias(r, "n_positions", "max_position_embeddings", d->max_pos, 1,
                           INT64_C(1) << 30, &c->max_position_embeddings);
    if (!rc)
        rc = json_field_double(r->root, "layer_norm_epsilon", false, d->eps, 1e-30, 1.0,
                               &c->norm_eps, r->where, r->err);
    return rc;
}

/* Norm, MLP, positions and biases follow from the model type and two flags. */
static void apply_architecture(struct model_config *c, bool attention_bias, bool mlp_bias) {
    bool gpt2 = c->type == MODEL_TYPE_GPT2;
    c->norm = gpt2 ? MODEL_NORM_LAYERNORM : MODEL_NORM_RMSNORM;
    c->mlp = gpt2 ? MODEL_MLP_GELU : MODEL_MLP_SWIGLU;
    c->positions = gpt2 ? MODEL_POS_LEARNED : MODEL_POS_ROPE;
    c->qk_norm = c->type == MODEL_TYPE_QWEN3;
    switch (c->type) {
    case MODEL_TYPE_LLAMA: /* attention_bias: q, k, v and o; mlp_bias: gate, up, down */
    case MODEL_TYPE_QWEN3: /* attention_bias as llama; no MLP bias */
        c->qkv_bias = c->o_bias = attention_bias;
        c->mlp_bias = c->type == MODEL_TYPE_LLAMA && mlp_bias;
        break;
    case MODEL_TYPE_QWEN2: /* q, k, v always biased; o and MLP never */
        c->qkv_bias = true;
        c->o_bias = c->mlp_bias = false;
        break;
    case MODEL_TYPE_GPT2: c->qkv_bias = c->o_bias = c->mlp_bias = true; break;
    default: c->qkv_bias = c->o_bias = c->mlp_bias = false; break;
    }
}

static int parse_activation(const struct reader *r, struct model_config *c) {
    bool gpt2 = c->type == MODEL_TYPE_GPT2;
    const char *key = gpt2 ? "activation_function" : "hidden_act";
    const char *act = NULL;
    int rc = json_field_string(r->root, key, false, gpt2 ? "gelu_new" : "silu", &act, r->where,
                               r->err);
    if (rc) return rc;
    /* The names transformers maps to the same function as ops_swiglu's silu / ops_gelu. */
    static const char *const silu[] = {"silu", "swish", NULL};
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast", NULL};
    bool ok = false;
    for (const char *const *a = gpt2 ? gelu : silu; *a; a++) ok = ok || strcmp(*a, act) == 0;
    if (!ok)
        return error_set(r->err, SMELT_EUNSUPPORTED,
                         "%s: %s '%s' is not supported for %s (smelt implements %s)", r->where,
                         key, act, type_names[c->type],
                         gpt2 ? "gelu_new / gelu_pytorch_tanh / gelu_fast" : "silu");
    snprintf(c->hidden_act, sizeof c->hidden_act, "%s", act);
    return SMELT_OK;
}

static int parse_switches(const struct reader *r, struct model_config *c) {
    bool attention_bias = false, mlp_bias = false;
    int rc = SMELT_OK;
    if (c->type == MODEL_TYPE_LLAMA || c->type == MODEL_TYPE_QWEN3)
        rc = json_field_bool(r->root, "attention_bias", false, false, &attention_bias, r->where,
                             r->err);
    if (!rc && c->type == MODEL_TYPE_LLAMA)
        rc = json_field_bool(r->root, "mlp_bias", false, false, &mlp_bias, r->where, r->err);
    if (!rc)
        rc = json_field_bool(r->root, "tie_word_embeddings", false, defaults[c->type].tie,
                             &c->tie_word_embeddings, r->where, r->err);
    if (!rc) rc = parse_activation(r, c);
    if (rc) return rc;
    apply_architecture(c, attention_bias, mlp_bias);
    if (c->positions == MODEL_POS_ROPE) return model_config_parse_rope(r->root, r->where, c, r->err);
    c->rope_theta = 0.0;
    return SMELT_OK;
}

/* GPT-2 attention variants that change the math. */
static int check_gpt2_variants(const struct reader *r) {
    bool cross = false, inverse_layer = false, scale = true;
    int rc = json_field_bool(r->root, "add_cross_attention", false, false, &cross, r->where, r->err);
    if (!rc)
        rc = json_field_bool(r->root, "scale_attn_by_inverse_layer_idx", false, false,
                             &inverse_layer, r->where, r->err);
    if (!rc)
        rc = json_field_bool(r->root, "scale_attn_weights", false, true, &scale, r->where, r->err);
    if (rc) return rc;
    const char *bad = cross ? "add_cross_attention true"
                      : inverse_layer ? "scale_attn_by_inverse_layer_idx true"
                      : !scale ? "scale_attn_weights false" : NULL;
    if (bad)
        return error_set(r->err, SMELT_EUNSUPPORTED, "%s: %s is not supported", r->where, bad);
    return SMELT_OK;
}

/* layer_types (transformers >= 4.53): returns whether any layer slides. */
static int parse_layer_types(const struct reader *r, const struct model_config *c,
                             const json_t *lt, bool *any_sliding) {
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->n_layers)
        return error_set(r->err, SMELT_EINVAL,
                         "%s: field 'layer_types' must list one entry per layer (%lld)",
                         r->where, (long long)c->n_layers);
    *any_sliding = false;
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *s = json_string_value(json_array_get(lt, i));
        if (s && strcmp(s, "sliding_attention") == 0) *any_sliding = true;
        else if (!s || strcmp(s, "full_attention") != 0)
            return error_set(r->err, SMELT_EUNSUPPORTED,
                             "%s: layer_types[%zu] '%s' is not supported (full_attention, "
                             "sliding_attention)",
                             r->where, i, s ? s : "(not a string)");
    }
    return SMELT_OK;
}

/* sliding_window: absent → the class default, null → none. */
static int parse_window_size(const struct reader *r, const struct model_config *c,
                             int64_t *window) {
    if (is_null(r->root, "sliding_window")) {
        *window = 0;
        return SMELT_OK;
    }
    return get_int(r, "sliding_window", defaults[c->type].window, 1, INT64_MAX, window);
}

/* Mistral slides in every layer when sliding_window is set. Qwen2/3 slide only with
 * use_sliding_window, in layers >= max_window_layers (or those layer_types marks). */
static int parse_window(const struct reader *r, struct model_config *c) {
    c->sliding_window = 0;
    c->max_window_layers = 0;
    int64_t window = 0;
    int rc = SMELT_OK;
    if (c->type == MODEL_TYPE_MISTRAL) {
        rc = parse_window_size(r, c, &window);
        c->sliding_window = window;
    } else if (c->type == MODEL_TYPE_QWEN2 || c->type == MODEL_TYPE_QWEN3) {
        bool use = false, sliding = false;
        rc = json_field_bool(r->root, "use_sliding_window", false, false, &use, r->where, r->err);
        if (!rc) rc = parse_window_size(r, c, &window);
        if (!rc)
            rc = get_int(r, "max_window_layers", defaults[c->type].max_window_layers, 0,
                         COUNT_MAX, &c->max_window_layers);
        const json_t *lt = json_object_get(r->root, "layer_types");
        if (!rc && lt && !json_is_null(lt)) rc = parse_layer_types(r, c, lt, &sliding);
        else sliding = c->max_window_layers < c->n_layers;
        if (!rc && use && window > 0 && sliding) c->sliding_window = window;
    }
    if (rc) return rc;
    c->max_seq_len = c->max_position_embeddings;
    if (c->sliding_window > 0 && c->sliding_window < c->max_seq_len)
        c->max_seq_len = c->sliding_window;
    return SMELT_OK;
}

static int parse_dtype(const struct reader *r, struct model_config *c) {
    const char *key = present(r->root, "torch_dtype") ? "torch_dtype" : "dtype";
    const char *s = NULL;
    int rc = json_field_string(r->root, key, false, "float32", &s, r->where, r->err);
    if (rc) return rc;
    if (strcmp(s, "float32") == 0) c->torch_dtype = DTYPE_F32;
    else if (strcmp(s, "bfloat16") == 0) c->torch_dtype = DTYPE_BF16;
    else if (strcmp(s, "float16") == 0) c->torch_dtype = DTYPE_F16;
    else
        return error_set(r->err, SMELT_EUNSUPPORTED,
                         "%s: %s '%s' is not supported (float32, bfloat16, float16)", r->where,
                         key, s);
    return SMELT_OK;
}

static int parse_tokens(const struct reader *r, struct model_config *c) {
    int rc = get_int(r, "bos_token_id", -1, 0, INT32_MAX, &c->bos_token_id);
    if (!rc) rc = get_int(r, "pad_token_id", -1, 0, INT32_MAX, &c->pad_token_id);
    if (rc) return rc;
    c->n_eos_token_ids = 0;
    const json_t *eos = json_object_get(r->root, "eos_token_id");
    if (!eos || json_is_null(eos)) return SMELT_OK;
    if (json_is_integer(eos))
        return get_int(r, "eos_token_id", -1, 0, INT32_MAX,
                       &c->eos_token_ids[c->n_eos_token_ids++]);
    if (!json_is_array(eos) || json_array_size(eos) > MODEL_CONFIG_MAX_EOS)
        return error_set(r->err, SMELT_EINVAL,
                         "%s: field 'eos_token_id' must be a token id or a list of at most %d",
                         r->where, MODEL_CONFIG_MAX_EOS);
    for (size_t i = 0; i < json_array_size(eos); i++) {
        const json_t *v = json_array_get(eos, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return error_set(r->err, SMELT_EINVAL, "%s: eos_token_id[%zu] is not a token id",
                             r->where, i);
        c->eos_token_ids[c->n_eos_token_ids++] = (int64_t)json_integer_value(v);
    }
    return SMELT_OK;
}

static int check_consistency(const struct reader *r, const struct model_config *c) {
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return error_set(r->err, SMELT_EINVAL,
                         "%s: num_attention_heads %lld is not a multiple of "
                         "num_key_value_heads %lld",
                         r->where, (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->positions == MODEL_POS_ROPE && c->head_dim % 2 != 0)
        return error_set(r->err, SMELT_EINVAL, "%s: head_dim %lld must be even for rope",
                         r->where, (long long)c->head_dim);
    if (present(r->root, "quantization_config"))
        return error_set(r->err, SMELT_EUNSUPPORTED,
                         "%s: field 'quantization_config' is present: quantized weights are "
                         "not supported",
                         r->where);
    return SMELT_OK;
}

int model_config_from_json(const json_t *root, const char *where, struct model_config *out,
                           struct smelt_error *err) {
    if (!out) return error_set(err, SMELT_EINVAL, "model_config_from_json: NULL output");
    if (!where) where = "config.json";
    if (!json_is_object(root))
        return error_set(err, SMELT_EINVAL, "%s: expected a JSON object", where);
    struct model_config c;
    memset(&c, 0, sizeof c);
    struct reader r = {root, where, err};
    int rc = parse_type(&r, &c);
    if (!rc) rc = parse_architecture(&r, &c);
    if (!rc) rc = parse_head(&r, &c);
    if (!rc) rc = c.type == MODEL_TYPE_GPT2 ? parse_shapes_gpt2(&r, &c) : parse_shapes_rope(&r, &c);
    if (!rc && c.type == MODEL_TYPE_GPT2) rc = check_gpt2_variants(&r);
    if (!rc) rc = parse_switches(&r, &c);
    if (!rc) rc = parse_window(&r, &c);
    if (!rc) rc = parse_dtype(&r, &c);
    if (!rc) rc = parse_tokens(&r, &c);
    if (!rc) rc = check_consistency(&r, &c);
    if (rc) return rc;
    *out = c;
    return SMELT_OK;
}

int model_config_load(const char *path_or_dir, struct model_config *out,
                      struct smelt_error *err) {
    if (!path_or_dir) return error_set(err, SMELT_EINVAL, "model_config_load: NULL path");
    char path[PATH_MAX];
    int rc = SMELT_OK;
    if (path_is_dir(path_or_dir)) rc = path_join(path, sizeof path, path_or_dir, "config.json", err);
    else if ((size_t)snprintf(path, sizeof path, "%s", path_or_dir) >= sizeof path)
        rc = error_set(err, SMELT_EINVAL, "%s: path too long", path_or_dir);
    if (rc) return rc;
    if (!path_exists(path)) return error_set(err, SMELT_ENOTFOUND, "%s: no such file", path);
    json_t *root = NULL;
    rc = json_load_path(path, &root, err);
    if (rc) return rc;
    rc = model_config_from_json(root, path, out, err);
    json_decref(root);
    return rc;
}
