/* model/config.h — the shape and architecture switches of a decoder-only model, read
 * from and written to a Hugging Face config.json.
 *
 * Supported model_type values: llama, mistral, qwen2, qwen3, gpt2. Absent fields take
 * the default of that model's transformers config class, so a config.json means here
 * what it means to transformers; features smelt does not implement (rope scaling other
 * than linear, llama3 and yarn, quantized weights, other activations, GPT-2 attention
 * variants) are refused with an
 * error naming the field, never silently ignored. An active sliding window is honoured
 * by capping max_seq_len at the window, where full causal attention is identical.
 * A "*ForSequenceClassification" architecture with one label is a reward model
 * (score_head); other heads (token classification, question answering) and more than
 * one label are refused.
 * docs/model-formats.md has the table of defaults and refusals. */
#ifndef SMELT_MODEL_CONFIG_H
#define SMELT_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "kernels/ops.h" /* enum dtype */

enum model_type {
    MODEL_TYPE_LLAMA,
    MODEL_TYPE_MISTRAL,
    MODEL_TYPE_QWEN2,
    MODEL_TYPE_QWEN3,
    MODEL_TYPE_GPT2,
    MODEL_TYPE_COUNT
};

enum model_norm { MODEL_NORM_RMSNORM, MODEL_NORM_LAYERNORM };   /* layernorm has a bias */
enum model_mlp { MODEL_MLP_SWIGLU, MODEL_MLP_GELU };             /* gate/up/down; fc/proj */
enum model_positions { MODEL_POS_ROPE, MODEL_POS_LEARNED };      /* learned: GPT-2 wpe */

/* rope_scaling / rope_parameters "rope_type" (model/rope.h computes each one's table). */
enum model_rope_type { MODEL_ROPE_DEFAULT, MODEL_ROPE_LINEAR, MODEL_ROPE_LLAMA3, MODEL_ROPE_YARN };

/* The scaling's parameters as transformers reads them; those a type does not use are 0. */
struct model_rope_scaling {
    enum model_rope_type type;
    double factor;                       /* linear, llama3, yarn */
    double low_freq_factor;              /* llama3 */
    double high_freq_factor;             /* llama3 */
    int64_t original_max_position_embeddings; /* llama3, yarn */
    double attention_factor;             /* yarn: given, or 0 (from factor, mscale) */
    double beta_fast, beta_slow;         /* yarn: 32 and 1 unless given */
    double mscale, mscale_all_dim;       /* yarn: 0 when not given */
    bool truncate;                       /* yarn: the correction range rounded outwards (default) */
};

/* "default", "linear", "llama3", "yarn". */
const char *model_rope_type_name(enum model_rope_type type);
/* Whether a and b are the same scaling, field by field. */
bool model_rope_scaling_equal(const struct model_rope_scaling *a, const struct model_rope_scaling *b);

#define MODEL_CONFIG_MAX_EOS 8
#define MODEL_CONFIG_NAME_BYTES 64

struct model_config {
    enum model_type type;
    char architecture[MODEL_CONFIG_NAME_BYTES]; /* architectures[0]: "Qwen2ForCausalLM" */

    int64_t hidden_size;             /* C: residual stream width */
    int64_t n_layers;
    int64_t n_heads;                 /* query heads */
    int64_t n_kv_heads;              /* divides n_heads (grouped-query attention) */
    int64_t head_dim;                /* D; n_heads * D may differ from C (qwen3) */
    int64_t intermediate_size;       /* MLP width */
    int64_t vocab_size;
    int64_t max_position_embeddings;
    /* Longest sequence smelt computes exactly: max_position_embeddings, capped by an
     * active sliding window (within the window, sliding attention is full causal). */
    int64_t max_seq_len;

    enum model_norm norm;
    enum model_mlp mlp;
    enum model_positions positions;
    double norm_eps;
    double rope_theta;               /* 0 for learned positions */
    struct model_rope_scaling rope_scaling;
    char hidden_act[32];             /* as written: "silu", "gelu_new", ... */

    bool qkv_bias;                   /* q/k/v projections have biases */
    bool o_bias;                     /* attention output projection has a bias */
    bool mlp_bias;                   /* MLP projections have biases */
    bool qk_norm;                    /* per-head RMSNorm of q and k before rope (qwen3) */
    bool tie_word_embeddings;        /* lm_head shares the token embedding */
    /* A sequence classifier with one label (a reward model: architectures[0]
     * "*ForSequenceClassification", num_labels 1): a head score.weight [1, C] instead of
     * lm_head (model/score_head.h). */
    bool score_head;

    int64_t sliding_window;          /* window in tokens when some layer slides, else 0 */
    int64_t max_window_layers;       /* qwen2/3: layers >= this slide when enabled */

    enum dtype torch_dtype;          /* dtype the weights were saved in (f32 if absent) */
    int64_t bos_token_id;            /* -1: not given */
    int64_t pad_token_id;            /* -1: not given */
    int64_t eos_token_ids[MODEL_CONFIG_MAX_EOS];
    int n_eos_token_ids;
};

const char *model_type_name(enum model_type type); /* "llama", ... */

/* Reads path_or_dir (a config.json, or a directory holding one). Errors name the file
 * and the field: SMELT_EIO / SMELT_EFORMAT (unreadable or bad JSON), SMELT_EINVAL (a
 * field of the wrong type, out of range, or inconsistent with another),
 * SMELT_EUNSUPPORTED (a model_type or feature smelt does not implement). */
int model_config_load(const char *path_or_dir, struct model_config *out,
                      struct smelt_error *err);

/* The same from a parsed config object; `where` prefixes error messages. */
int model_config_from_json(const json_t *root, const char *where, struct model_config *out,
                           struct smelt_error *err);

/* A config.json object transformers loads as the same model, with HF's field names
 * for the model_type (GPT-2: n_embd, n_layer, ...). *out is a new reference. */
int model_config_to_json(const struct model_config *cfg, json_t **out,
                         struct smelt_error *err);

/* Writes dir/config.json (indent 2, sorted keys, as transformers does), atomically;
 * creates dir. */
int model_config_save(const struct model_config *cfg, const char *dir,
                      struct smelt_error *err);

#endif
