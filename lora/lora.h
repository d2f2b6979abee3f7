/* lora/: LoRA adapters on a struct model's linear layers (Hu et al. 2021, as PEFT does
 * it): y = W x + scaling * B(A(dropout(x))), A [r, in] ~ kaiming-uniform, B [out, r] = 0
 * at creation, scaling = alpha / r (alpha / sqrt(r) with rslora). The base model stays
 * frozen: it needs no gradient buffer (model_grads_alloc is not called) and no
 * optimizer state; only the adapter's flat buffer trains.
 *
 * Target modules use PEFT's names: q_proj k_proj v_proj o_proj gate_proj up_proj
 * down_proj for Llama/Mistral/Qwen; c_attn c_proj c_fc for GPT-2 (c_proj matches both
 * attn.c_proj and mlp.c_proj, as PEFT's suffix match does); the short forms q k v o
 * gate up down are accepted, and "all-linear" takes every linear of a block (never
 * lm_head). "lm_head" wraps the output projection (A [r, C], B [V, r]; the Tinker
 * API's train_unembed) on every architecture, tied embeddings included: as PEFT does,
 * the adapter is its own while the base weight is the shared embedding, and merging
 * such an adapter is refused (lora_merge_check); a sequence classifier has no lm_head
 * (its score head trains in full, below). Like PEFT, a name matches a module whose full path equals it or ends with
 * "." + name, so "attn.c_proj" or "model.layers.0.self_attn.q_proj" work too. GPT-2's
 * c_attn has one A shared by q, k and v and one B [3C, r] whose row blocks feed q, k
 * and v.
 *
 * Dropout masks come from a hash of (seed, layer, module, element), not from a stream:
 * the same seed gives the same masks, so activation recompute and exact resume need no
 * saved state. lora_set_dropout_seed picks the masks for the next forward; training is
 * off (no dropout) until lora_set_training(l, true).
 *
 * Files (PEFT format): adapter_config.json ({"peft_type": "LORA", "r", "lora_alpha",
 * "lora_dropout", "target_modules", "fan_in_fan_out", "bias": "none", "use_rslora",
 * "task_type": "CAUSAL_LM" (or "SEQ_CLS", below), "base_model_name_or_path", ...}) and
 * adapter_model.safetensors with PEFT's names, e.g.
 * base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight [r, in] and
 * ...lora_B.weight [out, r]; GPT-2: base_model.model.transformer.h.0.attn.c_attn....;
 * the output projection: base_model.model.lm_head.lora_A.weight / .lora_B.weight.
 * Loading refuses what would change the maths silently (use_dora, rank_pattern,
 * alpha_pattern, layers_to_transform, modules_to_save other than a classifier's head,
 * bias other than "none", a tensor missing or of the wrong shape, an unknown tensor).
 * PEFT also saves a targeted lm_head's base weight (base_model.model.lm_head.base_layer.
 * weight); it is accepted when it is the model's own lm_head bit for bit, and refused
 * (SMELT_EUNSUPPORTED) otherwise: an adapter never replaces base weights.
 *
 * Sequence classifiers (reward models, model/score_head.h) are PEFT's task_type
 * "SEQ_CLS": the LoRA pairs train and the head `score` [1, C] trains in full beside them
 * (PEFT's modules_to_save, ["classifier", "score"] for SEQ_CLS). As PEFT's
 * ModulesToSaveWrapper does, the adapter holds its own copy of the head (the last of its
 * params, in the flat buffers like the LoRA matrices, so it trains, checkpoints and
 * syncs with them); while the adapter is attached the model scores with that copy, and
 * the model's own head is never written but by lora_merge. The file holds the copy as
 * base_model.model.score.weight [1, C]: the name PEFT's save writes and its load reads
 * (it maps it to score.modules_to_save.default.weight itself; the longer name in a file
 * would not load in PEFT, so smelt refuses it too). adapter_config.json says
 * "task_type": "SEQ_CLS" and "modules_to_save": ["classifier", "score"]; PEFT loads it
 * with AutoModelForSequenceClassification.from_pretrained(base, num_labels=1,
 * pad_token_id=...) and PeftModel.from_pretrained(model, dir), base being the causal LM
 * (or the classifier) the adapter was trained on.
 *
 * Ownership: lora_create/lora_load return a struct lora freed with lora_free (which
 * detaches it first). The model is borrowed and must outlive the adapter. */
#ifndef SMELT_LORA_H
#define SMELT_LORA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/ops.h"
#include "model/transformer.h"

#define LORA_MAX_TARGETS 16

struct lora_config {
    int rank;                   /* >= 1 */
    float alpha;                /* > 0 */
    float dropout;              /* [0, 1) */
    bool use_rslora;
    int n_targets;
    char targets[LORA_MAX_TARGETS][32]; /* names as given (PEFT or short forms) */
};

/* One adapter tensor: a view into the flat buffers. */
struct lora_param {
    char name[160];             /* PEFT's name in adapter_model.safetensors */
    int64_t shape[2];
    int64_t offset, numel;      /* in elements, into weights/grads */
};

struct lora {
    struct lora_config config;  /* targets: the wrapped module kinds in PEFT's names */
    float scaling;
    struct model *model;        /* borrowed */
    struct lora_param *params;  /* [n_params]: A then B for each wrapped module; the head last */
    int n_params;
    int64_t n_weights;
    struct tensor weights;      /* f32 [n_weights], on the model's backend */
    struct tensor grads;        /* f32 [n_weights], zeroed at creation */
    struct model_adapter adapter; /* what lora_attach puts on the model */
    /* A sequence classifier's head, trained in full (task_type SEQ_CLS): views of the
     * last param, "base_model.model.score.weight" [1, C], in weights and grads. data
     * NULL when the adapter carries none (task_type CAUSAL_LM). score_grad is what
     * model_score_backward's dweight takes: the base has no gradient buffer. */
    struct tensor score, score_grad;
    struct lora_state *state;   /* private: module table, scratch, dropout */
};

/* Parses {"rank", "alpha", "dropout", "target_modules", "use_rslora"} (the job spec's
 * "lora" object; rank defaults to 8, alpha to 2 * rank, dropout to 0; without
 * target_modules n_targets is 0 and lora_create uses the architecture's default, PEFT's:
 * q_proj and v_proj, or c_attn for GPT-2). Unknown keys and out-of-range values are
 * SMELT_EINVAL naming "<where>.<field>". json is a jansson json_t *. */
int lora_config_from_json(const void *json, const char *where, struct lora_config *out,
                          struct smelt_error *err);

/* A new adapter for the model: A from a seeded kaiming-uniform (a = sqrt(5), PEFT's
 * init), B zero, so the model's outputs are unchanged until it trains. On a sequence
 * classifier (config.score_head) the adapter also carries the head, a copy of the
 * model's score.weight (task_type SEQ_CLS, PEFT's default for a classifier), so the
 * scores too are unchanged until it trains. A target that names no linear of this
 * architecture is SMELT_EINVAL naming it. */
int lora_create(struct model *model, const struct lora_config *config, uint64_t seed,
                struct lora **out, struct smelt_error *err);

/* Loads a PEFT adapter directory for this model (errors name the file and the field
 * or tensor): SMELT_EINVAL for bad values or targets this model lacks, or a SEQ_CLS
 * adapter on a model without a score head (lora_load_with_base makes the classifier),
 * SMELT_EUNSUPPORTED for features smelt does not implement, SMELT_ENOTFOUND for a
 * missing file or tensor, SMELT_EFORMAT for a tensor the adapter does not have. */
int lora_load(struct model *model, const char *dir, struct lora **out, struct smelt_error *err);

/* What dir/adapter_config.json says about the model the adapter goes on, read before
 * any model is loaded: base_path is base_model_name_or_path, resolved against dir when
 * relative (against the working directory, as PEFT reads it, when dir holds no such
 * directory but the working directory does; "" when the file names none); seq_cls is
 * task_type "SEQ_CLS" (the adapter carries a classifier's head). The file is checked as
 * lora_load checks it. */
struct lora_dir_info {
    char base_path[4096];
    bool seq_cls;
};
int lora_dir_info(const char *dir, struct lora_dir_info *out, struct smelt_error *err);

/* The model an adapter directory goes on, with the adapter loaded onto it (not
 * attached): base_dir (NULL: the adapter's base_model_name_or_path) loaded on backend;
 * for a SEQ_CLS adapter, a causal LM base becomes a classifier first
 * (model_classifier_from_lm with pad_token_id as it takes it: the tokenizer's pad, or
 * -1 for the config's, else its eos). That classifier's own new head is never what
 * scores: the adapter's replaces it while attached and when merged. On success the
 * caller owns both: lora_free(*adapter), then model_free(*model). */
int lora_load_with_base(const char *dir, const char *base_dir, enum backend backend, int64_t pad_token_id,
                        struct model **model, struct lora **adapter, struct smelt_error *err);

/* Writes adapter_config.json and adapter_model.safetensors (f32) into dir (created if
 * needed). base_model_name_or_path is written as given (may be NULL). target_modules
 * lists config.targets, or every wrapped module's full path when the layers differ. */
int lora_save(const struct lora *lora, const char *dir, const char *base_model_name_or_path,
              struct smelt_error *err);

/* Puts the adapter's hooks on the model (model->adapter); one adapter at a time. An
 * adapter with a head also points the model's head view (model->w.score) at its copy
 * while attached, so model_score_forward / _backward score with it; lora_detach
 * points it back at the model's own score.weight. model_save writes the model's own
 * weights (its own head too) whether or not an adapter is attached. */
int lora_attach(struct lora *lora, struct smelt_error *err);
void lora_detach(struct lora *lora);

void lora_set_training(struct lora *lora, bool training);
void lora_set_dropout_seed(struct lora *lora, uint64_t seed);

/* W += scaling * B A for every wrapped module (lm_head too, when untied), in the model's weights, and the
 * adapter's head (if any) copied over the model's score.weight, as PEFT's
 * merge_and_unload keeps the trained copy (detach first: a merged adapter still
 * attached would count twice). */
int lora_merge(const struct lora *lora, struct smelt_error *err);

/* What lora_merge refuses before it touches a weight, for callers that merge only at
 * the end (save_merged): SMELT_EUNSUPPORTED when the adapter wraps lm_head and the
 * model's lm_head is its token embedding (tie_word_embeddings), since merging it would
 * change the input embeddings too. */
int lora_merge_check(const struct lora *lora, struct smelt_error *err);

void lora_free(struct lora *lora);

#endif
