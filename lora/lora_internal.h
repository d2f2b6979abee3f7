/* Private to lora/: the module kinds of each architecture, the wrapped-module table,
 * and the scratch the hooks share. */
#ifndef SMELT_LORA_INTERNAL_H
#define SMELT_LORA_INTERNAL_H

#include "lora/lora.h"

/* One kind of linear a LoRA pair can wrap in every block of an architecture, with
 * PEFT's names: the module path inside a block ("self_attn.q_proj", "attn.c_attn")
 * and the linears of the model it feeds. GPT-2's c_attn feeds Q, K and V: one A and
 * one B whose row blocks go to each. */
enum lora_dim { LORA_DIM_C, LORA_DIM_QD, LORA_DIM_KD, LORA_DIM_F, LORA_DIM_3C };

struct lora_kind {
    const char *leaf;            /* "q_proj", "c_proj" (ambiguous on GPT-2) */
    const char *path;            /* path inside the block: "self_attn.q_proj" */
    enum lora_dim in, out;
    enum model_linear linears[3];
    int n_linears;
};

#define LORA_MAX_KINDS 8

/* The output projection is no block's linear: its module (when wrapped) has this kind,
 * layer n_layers, input C and output V, and comes after every block's modules. PEFT
 * names it "lm_head" on every architecture smelt loads, tied embeddings included (the
 * adapter is its own; the base weight is the shared one). "all-linear" leaves it out,
 * as PEFT does the output layer. */
#define LORA_HEAD_KIND LORA_MAX_KINDS
#define LORA_HEAD_PATH "lm_head"

/* The kinds of this model's architecture and the prefix of block l's modules
 * ("model.layers.%lld." or "transformer.h.%lld."). */
const struct lora_kind *lora_kinds(const struct model *model, int *n_kinds);
const char *lora_block_prefix(const struct model *model);
int64_t lora_dim(const struct model *model, enum lora_dim dim);

/* Which (layer, kind) pairs are wrapped: wrapped[layer * n_kinds + kind]. */
struct lora_selection {
    int64_t n_layers;
    int n_kinds;
    bool *wrapped; /* malloc'd */
    bool lm_head;  /* the output projection too */
};

/* Resolves target names (PEFT names, short forms, "all-linear", dotted suffixes of a
 * module path such as "attn.c_proj", or full paths such as
 * "model.layers.0.self_attn.q_proj") as PEFT does: a name matches a module when it
 * equals the module's full path or is a "."-separated suffix of it. A name matching
 * nothing is SMELT_EINVAL naming it (prefixed by where). n_names 0 takes PEFT's
 * default (q_proj and v_proj, c_attn for GPT-2). */
int lora_select(const struct model *model, const char *const *names, int n_names,
                const char *where, struct lora_selection *out, struct smelt_error *err);
void lora_selection_free(struct lora_selection *sel);

/* The wrapped kinds in PEFT's names, as few as say the same thing: a leaf name when
 * every module of that leaf is wrapped in every layer where any is ("c_proj" for both
 * GPT-2 c_proj), else the block path ("attn.c_proj"). Names whose kinds are wrapped in
 * only some layers are still listed: *uniform tells whether the names alone give the
 * selection (otherwise the file must list full module paths). */
void lora_selection_names(const struct model *model, const struct lora_selection *sel,
                          char names[][32], int max_names, int *n_names, bool *uniform);

/* Whether a target name can name a linear of some supported architecture (for
 * checking a job spec before any model is loaded). */
bool lora_target_known(const char *name);

#define LORA_MAX_RANK 65536

/* Range checks shared by lora_create and lora_load; where prefixes the message. */
int lora_config_check(const struct lora_config *config, const char *where,
                      struct smelt_error *err);

/* One wrapped module: A is params[param_a], B params[param_a + 1]. */
struct lora_module {
    int64_t layer;
    int kind;
    int param_a;
    int64_t in, out;
};

/* Where a (layer, linear) hook reads: rows [row0, row0 + rows) of the module's B. */
struct lora_hook {
    int module; /* -1: not wrapped */
    int64_t row0, rows;
};

struct lora_state {
    struct lora_selection selection;
    struct lora_module *modules;    /* [n_modules] */
    int n_modules;
    struct lora_hook *hooks;        /* [n_layers * MODEL_LINEAR_COUNT] */
    int head_module;                /* lm_head's module, -1 when not wrapped */
    int64_t max_in;                 /* widest module input */
    bool training;
    uint64_t dropout_seed;
    /* Scratch on the model's backend, grown when a batch has more rows. */
    int64_t cap_rows, cap_wide_rows;
    struct tensor u, du;            /* [cap_rows * rank] x A^T and its gradient */
    struct tensor x_drop;           /* [cap_wide_rows * max_in] dropout(x) */
    struct tensor dx_drop;          /* [cap_wide_rows * max_in] gradient w.r.t. dropout(x) */
    float *host_a, *host_b;         /* [cap_wide_rows * max_in] staging off the CPU */
};

/* A new adapter over the selection (taken over: freed with the adapter, also on
 * error): parameter table, zeroed weights and grads, hooks; with head, the model's
 * score head as a last parameter (the model must be a sequence classifier). */
int lora_build(struct model *model, const struct lora_config *config,
               struct lora_selection *selection, bool head, struct lora **out,
               struct smelt_error *err);

/* PEFT's name of a classifier head's copy in adapter_model.safetensors. */
#define LORA_SCORE_NAME "base_model.model.score.weight"

/* The model's own head: its score.weight in model->weights, [1, C] (what
 * model->w.score views when no adapter's head stands in for it). */
struct tensor lora_model_score(const struct model *model);

/* Views of a parameter in the flat weights / grads. */
struct tensor lora_param_view(const struct lora *lora, const struct tensor *flat, int param);

/* Makes the scratch hold at least rows rows; wide: the dropout buffers too. */
int lora_scratch_reserve(struct lora *lora, int64_t rows, bool wide, struct smelt_error *err);

/* Dropout of a module's input, masks from a hash of (seed, layer, kind, row, column):
 *   lora_dropout_forward:  out = mask * x / (1 - p)
 *   lora_dropout_backward: dx += mask * dout / (1 - p)
 * x, out, dout, dx: [T, in] on the model's backend, rows row0 .. row0 + T - 1 of the
 * batch (the head sees its rows in chunks). */
int lora_dropout_forward(struct lora *lora, const struct lora_module *module, int64_t row0,
                         const struct tensor *x, struct tensor *out, struct smelt_error *err);
int lora_dropout_backward(struct lora *lora, const struct lora_module *module, int64_t row0,
                          const struct tensor *dout, struct tensor *dx, struct smelt_error *err);
bool lora_dropout_active(const struct lora *lora);

/* The hooks lora_attach installs (ctx is the struct lora). */
int lora_hook_forward(void *ctx, int64_t layer, enum model_linear linear,
                      const struct tensor *x, struct tensor *y, struct smelt_error *err);
int lora_hook_backward(void *ctx, int64_t layer, enum model_linear linear,
                       const struct tensor *x, const struct tensor *dy, struct tensor *dx,
                       struct smelt_error *err);
/* lm_head's (installed only when it is wrapped). */
int lora_hook_head_forward(void *ctx, int64_t row0, const struct tensor *x, struct tensor *y,
                           struct smelt_error *err);
int lora_hook_head_backward(void *ctx, int64_t row0, const struct tensor *x, const struct tensor *dy,
                            struct tensor *dx, struct smelt_error *err);

/* adapter_config.json: what it says, checked (errors name path and field). */
struct lora_file_config {
    struct lora_config config;   /* n_targets unused: see targets */
    bool seq_cls;                /* task_type "SEQ_CLS": the file carries the head */
    const char **targets;        /* [n_targets] borrowed from root */
    int n_targets;
    json_t *root;                /* owned */
};
int lora_file_config_load(const char *path, struct lora_file_config *out,
                          struct smelt_error *err);
void lora_file_config_free(struct lora_file_config *fc);
int lora_file_config_save(const struct lora *lora, const char *path,
                          const char *base_model_name_or_path, struct smelt_error *err);

#endif
