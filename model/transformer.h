/* model/transformer.h — decoder-only transformers (Llama 2/3, Mistral, Qwen2/2.5, Qwen3,
 * GPT-2) on kernels/ops.h: load and save Hugging Face directories, random init, forward
 * to logits / token logprobs / final hidden states, backward to every parameter.
 *
 * Layout (llm.c style): every parameter lives in one flat f32 buffer `weights`, carved
 * into named views; `grads` mirrors it. A flat buffer is what AdamW, ZeRO sharding and
 * weight sync want. GPT-2's fused, transposed Conv1D weights are split into q/k/v and
 * stored as Linear [out, in] on load, and fused back on save, so one forward serves
 * every architecture.
 *
 * A batch is a packed row of T tokens holding S sequences (cu_seqlens); sequences never
 * attend to each other. Positions restart at 0 in each sequence unless given.
 *
 * Ownership: model_* constructors return a struct model the caller frees with
 * model_free; struct model_acts likewise with model_acts_free. Batches are the
 * caller's. */
#ifndef SMELT_MODEL_TRANSFORMER_H
#define SMELT_MODEL_TRANSFORMER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/ops.h"
#include "model/config.h"

/* One named parameter: a view into model.weights (and, at the same offset, grads). */
struct model_param {
    char name[96];          /* smelt's name == the HF name where the layouts agree */
    int ndim;
    int64_t shape[2];
    int64_t offset;         /* in elements, into the flat buffers */
    int64_t numel;
    /* Where it lives in a HF checkpoint: rows [part, part+1) * shape[0] of hf_name
     * (viewed as Linear [out, in]; transposed when the file stores Conv1D [in, out]). */
    char hf_name[96];
    int hf_part, hf_parts;
    bool hf_transposed;
};

struct layer_weights {
    struct tensor attn_norm_w, attn_norm_b;   /* [C]; b only for GPT-2 */
    struct tensor q_w, k_w, v_w, o_w;         /* [Hq*D, C], [Hkv*D, C] x2, [C, Hq*D] */
    struct tensor q_b, k_b, v_b, o_b;         /* biases when the config has them */
    struct tensor q_norm_w, k_norm_w;         /* [D], Qwen3 */
    struct tensor mlp_norm_w, mlp_norm_b;     /* [C] */
    struct tensor gate_w, up_w, down_w;       /* [F, C], [F, C], [C, F] (SwiGLU) */
    struct tensor gate_b, up_b, down_b;       /* [F], [F], [C]: llama's mlp_bias */
    struct tensor fc_w, fc_b, proj_w, proj_b; /* [F, C], [F], [C, F], [C] (GPT-2 GELU MLP) */
};

struct model_weights {
    struct tensor wte;                        /* [V, C] */
    struct tensor wpe;                        /* [P, C], GPT-2 */
    struct tensor final_norm_w, final_norm_b; /* [C] */
    struct tensor lm_head;                    /* [V, C]; a view of wte when tied; absent
                                                 (data NULL) in a sequence classifier */
    struct tensor score;                      /* [1, C]: a sequence classifier's head
                                                 (config.score_head), model/score_head.h */
    struct layer_weights *layers;             /* [n_layers] */
};

/* The linear layers of a block that an adapter (LoRA) can wrap. GPT-2's fused c_attn
 * is seen as Q, K and V with the same input; its attn.c_proj is O, mlp.c_fc is FC and
 * mlp.c_proj is PROJ. */
enum model_linear {
    MODEL_LINEAR_Q, MODEL_LINEAR_K, MODEL_LINEAR_V, MODEL_LINEAR_O,
    MODEL_LINEAR_GATE, MODEL_LINEAR_UP, MODEL_LINEAR_DOWN,
    MODEL_LINEAR_FC, MODEL_LINEAR_PROJ,
    MODEL_LINEAR_COUNT
};

/* A trainable addition to linear layers (LoRA), called by model_forward/model_backward
 * for every linear of every layer, after the base matmul:
 *   forward:  y += delta(x)              (x: [T, in], y: [T, out])
 *   backward: dx += (d delta / dx)^T dy, and the adapter accumulates its own gradients.
 * A hook returns SMELT_OK doing nothing for the linears it does not wrap. With
 * activation recompute the forward hook runs again during the backward, so a hook must
 * give the same result for the same inputs until the next model_forward. */
struct model_adapter {
    void *ctx;
    int (*forward)(void *ctx, int64_t layer, enum model_linear linear, const struct tensor *x,
                   struct tensor *y, struct smelt_error *err);
    int (*backward)(void *ctx, int64_t layer, enum model_linear linear, const struct tensor *x,
                    const struct tensor *dy, struct tensor *dx, struct smelt_error *err);
    /* The output projection (lm_head), the same way, called after every lm_head matmul
     * (training, generation, the paged step); NULL when the adapter does not wrap it.
     * x: final-norm hidden states [n, C], y: their logits [n, V]. Logits are computed
     * in chunks of rows: row0 is x's first row in the batch, so that what depends on
     * the row (dropout masks) is the same whatever the chunking. */
    int (*head_forward)(void *ctx, int64_t row0, const struct tensor *x, struct tensor *y,
                        struct smelt_error *err);
    int (*head_backward)(void *ctx, int64_t row0, const struct tensor *x, const struct tensor *dy,
                         struct tensor *dx, struct smelt_error *err);
};

/* Several adapters in one pass (S-LoRA / Punica: adapters applied unmerged, each row
 * through its own): a model_adapter whose hooks call each segment's adapter on that
 * segment's rows only, as views, and no adapter on rows no segment covers. Rows are the
 * pass's token rows for the linears and its lm_head rows for the head (the paged step
 * computes one lm_head row per sequence, so there they are sequence indices). Each
 * segment's adapter sees its rows as a batch of its own (the head's row0 counts from
 * the segment's first head row), so with row-independent kernels (the CPU's
 * batch-invariant mode) every row gets the bits a pass of that adapter alone gives it.
 *
 * Usage: model_segments_init, model_segments_push for each range (in any order,
 * non-overlapping), put &s->adapter on model->adapter for the pass, then restore what
 * was there; model_segments_clear for the next pass, model_segments_free at the end.
 * Ownership: the segment list is the struct's; adapters are borrowed. */
struct model_adapter_segment {
    int64_t row_begin, row_end;    /* token rows [begin, end) */
    int64_t head_begin, head_end;  /* lm_head rows [begin, end) */
    const struct model_adapter *adapter; /* NULL: the base alone */
};

struct model_segmented_adapter {
    struct model_adapter adapter;  /* its hooks; ctx is this struct */
    struct model_adapter_segment *segs;
    int n, cap;
};

void model_segments_init(struct model_segmented_adapter *s);
/* Appends a segment (an empty range is skipped); SMELT_EINVAL for a negative or
 * reversed range, SMELT_ENOMEM. */
int model_segments_push(struct model_segmented_adapter *s, const struct model_adapter_segment *seg,
                        struct smelt_error *err);
void model_segments_clear(struct model_segmented_adapter *s);
void model_segments_free(struct model_segmented_adapter *s);

struct model_param_provider; /* below: parameters served unit by unit (ZeRO-3) */

struct model {
    struct model_config config;
    enum backend backend;
    struct model_param *params;  /* [n_params] */
    int n_params;
    int64_t n_weights;           /* elements in the flat buffers */
    struct tensor weights;       /* f32 [n_weights] */
    struct tensor grads;         /* f32 [n_weights]; data NULL until model_grads_alloc */
    struct model_weights w;      /* views into weights */
    struct model_weights g;      /* the same views into grads */
    /* Borrowed, NULL when none (set by lora_attach). With an adapter and no grads
     * allocated the base is frozen: the backward computes only what flows to the
     * adapter. */
    const struct model_adapter *adapter;
    /* The parameter units (model_unit_range): unit u is the flat range
     * [unit_offsets[u], unit_offsets[u + 1]), n_layers + 3 entries. */
    int64_t *unit_offsets;
    /* Borrowed, NULL when none (model_set_param_provider). */
    const struct model_param_provider *provider;
    /* The rotary table (model_rope_table): head_dim / 2 entries, NULL for learned positions. */
    float *rope_inv_freq;
    float rope_scale;
};

/* config's rotary table as transformers computes it for its rope_type: inv_freq
 * [head_dim / 2] (caller's) and the factor cos and sin are multiplied by. */
int model_rope_table(const struct model_config *config, float *inv_freq, float *scale, struct smelt_error *err);

/* Loads config.json and the safetensors weights of a HF model directory. Every
 * expected tensor must be present with its exact shape (errors name the file and
 * tensor); tensors the model does not use are refused too, so a wrong architecture
 * cannot load silently (rotary inv_freq buffers excepted). */
int model_load(const char *dir, enum backend backend, struct model **out,
               struct smelt_error *err);

/* A model with weights ~ N(0, 0.02), norms 1, biases 0, from a seed (same seed, same
 * weights on every machine). */
int model_init_random(const struct model_config *config, uint64_t seed, enum backend backend,
                      struct model **out, struct smelt_error *err);

/* Writes config.json and model.safetensors (f32, or bf16 when bf16 is true) into dir,
 * in the layout transformers loads unchanged. */
int model_save(const struct model *model, const char *dir, bool bf16, struct smelt_error *err);

void model_free(struct model *model);

/* A tensor in Hugging Face checkpoint layout (GPT-2's c_attn fused and Conv1D weights
 * transposed back). */
struct model_hf_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *data; /* owned by the array */
};

/* Converts a flat host buffer laid out like model->weights (the weights, or the
 * gradients) into the checkpoint's tensors, in parameter order. The caller frees the
 * array with model_hf_tensors_free. */
int model_hf_tensors(const struct model *model, const float *flat, struct model_hf_tensor **out,
                     int *n_out, struct smelt_error *err);
void model_hf_tensors_free(struct model_hf_tensor *tensors, int n);

/* Allocates (zeroed) the gradient buffer when absent. */
int model_grads_alloc(struct model *model, struct smelt_error *err);

const struct model_param *model_param_find(const struct model *model, const char *name);

/* A packed batch, host memory owned by the caller. */
struct model_batch {
    int64_t n_tokens;            /* T */
    int n_seqs;                  /* S */
    const int32_t *ids;          /* [T] */
    const int32_t *cu_seqlens;   /* [S + 1] */
    const int32_t *positions;    /* [T] or NULL: 0.. within each sequence */
    const int32_t *targets;      /* [T] or NULL: the token whose logprob is wanted at each
                                    position, negative for none */
};

/* Saved activations of a forward pass, sized for up to max_tokens tokens. With
 * recompute, only each layer's input is kept and the backward re-runs the layer. */
struct model_acts;

int model_acts_alloc(const struct model *model, int64_t max_tokens, bool recompute,
                     struct model_acts **out, struct smelt_error *err);
void model_acts_free(struct model_acts *acts);

/* Runs the forward pass and keeps what the backward needs in acts.
 *   logprobs: f32 [T] or NULL — log p(targets[t] | tokens <= t) (0 where target < 0);
 *             needs batch->targets.
 *   logits:   f32 [T, V] or NULL — every logit (for generation and tests).
 *   hidden:   f32 [T, C] or NULL — the final normed hidden states (value/reward heads).
 * The batch must stay valid until model_backward. */
int model_forward(struct model *model, struct model_acts *acts, const struct model_batch *batch,
                  struct tensor *logprobs, struct tensor *logits, struct tensor *hidden,
                  struct smelt_error *err);

/* Accumulates into model->grads the gradient of a loss given dL/dlogprobs (f32 [T],
 * or NULL) and dL/dhidden (f32 [T, C], or NULL) for the last model_forward on acts.
 * Without grads (model_grads_alloc never called) the model must have an adapter: only
 * the adapter's gradients are produced. */
int model_backward(struct model *model, struct model_acts *acts,
                   const struct tensor *dlogprobs, const struct tensor *dhidden,
                   struct smelt_error *err);

/* Writes {"logits": [[...], ...]} (9 significant digits) for one sequence of ids to out:
 * what the parity tools (smelt-model logits, smelt-lora logits) print. The model runs as
 * it is, adapters attached included. */
int model_write_logits_json(struct model *model, const int32_t *ids, int64_t n, FILE *out,
                            struct smelt_error *err);

/* ---- parameter units and providers (ZeRO-3) ----
 *
 * The flat buffer falls into units, each a contiguous range in parameter order:
 *   MODEL_UNIT_EMBED (0)       wte (and GPT-2's wpe)
 *   model_unit_layer(l)        every parameter of layer l (l + 1)
 *   model_unit_head(m)         the final norm, and lm_head or score (n_layers + 1)
 * A tied lm_head is wte: it is counted once, in the embedding unit, and the head's
 * forward and backward acquire the embedding unit beside the head unit.
 *
 * A provider serves the units' weights to model_forward / model_backward (activation
 * recompute and adapter hooks included) instead of model->weights: the model acquires
 * a unit just before it reads the unit's weights and releases it right after, and the
 * provider points the unit's views (model->w, and model->g when the base trains) at
 * memory it owns with model_unit_bind. Kernels see weights only through those views.
 * After a unit's backward the model calls grads_ready: the unit's gradient views are
 * complete for this backward and the provider may reduce them away. At most two units
 * are held at once (the head and the tied embedding). Every rank of a sharded job must
 * make the same calls in the same order (same outputs asked for), since each acquire
 * may be a collective. With no provider everything is as before, at no cost. */
#define MODEL_UNIT_EMBED 0
static inline int64_t model_unit_layer(int64_t layer) { return layer + 1; }
int64_t model_unit_head(const struct model *model);
int64_t model_unit_count(const struct model *model);
/* Unit u's range [*offset, *offset + *numel) of the flat buffers. */
void model_unit_range(const struct model *model, int64_t unit, int64_t *offset, int64_t *numel);
/* Points the views of unit's parameters in model->w at w (the unit's numel elements, in
 * flat order), and in model->g at g; NULL leaves the views empty (data NULL). A tied
 * lm_head follows wte. While an adapter is attached the score head's views are left
 * alone: they are the adapter's copy (lora_attach). */
void model_unit_bind(struct model *model, int64_t unit, float *w, float *g);

struct model_param_provider {
    void *ctx;
    /* The base trains: acquire(for_backward) binds gradient views too, and grads_ready
     * follows each unit's backward. false: a frozen base (an adapter trains). */
    bool base_grads;
    /* A model_forward (backward false) or model_backward begins. The weights may have
     * changed between two forwards (an optimizer step), never between a forward and
     * its backward. */
    int (*begin)(void *ctx, struct model *model, bool backward, struct smelt_error *err);
    /* Acquires nest: each acquire is matched by one release. */
    int (*acquire)(void *ctx, struct model *model, int64_t unit, bool for_backward,
                   struct smelt_error *err);
    int (*release)(void *ctx, struct model *model, int64_t unit, struct smelt_error *err);
    int (*grads_ready)(void *ctx, struct model *model, int64_t unit, struct smelt_error *err);
};

/* Sets (NULL: removes) the provider; borrowed, it must outlive its use. EINVAL when the
 * provider lacks a callback. */
int model_set_param_provider(struct model *model, const struct model_param_provider *provider,
                             struct smelt_error *err);
/* For callers that read a unit's weights outside model_forward / model_backward (the
 * score head: model_score_* read model->w.score): acquire and release through the
 * provider; no-ops without one. */
int model_unit_acquire(struct model *model, int64_t unit, bool for_backward, struct smelt_error *err);
int model_unit_release(struct model *model, int64_t unit, struct smelt_error *err);
/* Whether model_backward produces base gradients: a gradient buffer, or a provider
 * with base_grads. */
bool model_base_trains(const struct model *model);

/* ---- generation with a paged KV cache (the rollout engine) ---- */

/* Per layer, the keys and values of every cached token: k[l], v[l] are
 * [n_blocks, block_size, Hkv, D] on the model's backend (ops_kv_append's layout). */
struct model_kv_cache {
    int64_t n_blocks, block_size;
    int64_t n_layers;
    struct tensor *k, *v;        /* [n_layers] */
};

int model_kv_cache_alloc(const struct model *model, int64_t n_blocks, int64_t block_size,
                         struct model_kv_cache *out, struct smelt_error *err);
void model_kv_cache_free(struct model_kv_cache *cache);
/* Bytes of cache one token takes (keys and values, every layer). */
int64_t model_kv_bytes_per_token(const struct model *model);
/* Block src's keys and values copied to block dst in every layer (copy-on-write). */
int model_kv_cache_copy_block(struct model_kv_cache *cache, int32_t src, int32_t dst,
                              struct smelt_error *err);

/* One engine step: S sequences, each adding its next n_s tokens (a prefill chunk or one
 * decoded token) at positions context_lens[s] - n_s .. context_lens[s] - 1. Host memory
 * owned by the caller. */
struct model_paged_batch {
    int64_t n_tokens;            /* T = sum of n_s */
    int n_seqs;                  /* S */
    const int32_t *ids;          /* [T] */
    const int32_t *cu_q;         /* [S + 1] token offsets of the sequences */
    const int32_t *context_lens; /* [S] tokens of each sequence in the cache after this step */
    const int32_t *slot_mapping; /* [T] cache slot of each new token */
    const int32_t *block_tables; /* [S * max_blocks] */
    int max_blocks;
};

/* Scratch for model_forward_paged, sized for at most max_tokens tokens, max_seqs
 * sequences and max_blocks blocks per sequence. */
struct model_step_buffers;
int model_step_buffers_alloc(const struct model *model, int64_t max_tokens, int max_seqs,
                             int max_blocks, struct model_step_buffers **out,
                             struct smelt_error *err);
void model_step_buffers_free(struct model_step_buffers *b);

/* Writes the batch's keys and values into the cache and computes the next-token logits
 * after each sequence's last new token, left in buffers on the model's backend (so a
 * greedy step can reduce them there): model_step_logits gives them. */
int model_forward_paged(struct model *model, struct model_step_buffers *buffers,
                        struct model_kv_cache *cache, const struct model_paged_batch *batch,
                        struct smelt_error *err);
/* A view of the last model_forward_paged's logits: f32 [S, V] on the model's backend,
 * valid until the next step or model_step_buffers_free ([0, V] after a failed step). */
struct tensor model_step_logits(const struct model_step_buffers *buffers);

#endif
