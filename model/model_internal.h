/* Private to model/: the pieces the transformer files share. */
#ifndef SMELT_MODEL_INTERNAL_H
#define SMELT_MODEL_INTERNAL_H

#include "model/transformer.h"

/* A model with its parameter table laid out and zeroed weights. */
int model_create(const struct model_config *config, enum backend backend, struct model **out,
                 struct smelt_error *err);
/* (Re)binds the views of w and g (g only when grads are allocated). */
void model_bind_views(struct model *m);

/* What one layer's forward keeps for its backward. Buffers are sized for max_tokens;
 * ops get views of the first T rows. */
struct layer_acts {
    struct tensor x_in;                 /* [T, C] the layer's input (residual stream) */
    struct tensor h1, mean1, rstd1;     /* attention-norm output [T, C], stats [T] */
    struct tensor q_raw, k_raw;         /* [T, Hq*D], [T, Hkv*D] before q/k norm (qk_norm) */
    struct tensor qn_rstd, kn_rstd;     /* [T*Hq], [T*Hkv] (qk_norm) */
    struct tensor q, k, v;              /* [T, Hq*D], [T, Hkv*D] x2, after norm and rope */
    struct tensor att, lse;             /* [T, Hq*D], [T, Hq] */
    struct tensor x_mid;                /* [T, C] residual after attention */
    struct tensor h2, mean2, rstd2;     /* MLP-norm output and stats */
    struct tensor gate, up, act;        /* [T, F]; GPT-2 uses gate (fc output) and act */
};

struct model_acts {
    int64_t max_tokens;
    bool recompute;
    struct layer_acts *layers;          /* [n_layers]; only x_in allocated when recompute */
    int64_t n_layers_allocated;
    struct layer_acts scratch;          /* the recomputed layer (recompute only) */
    struct tensor x_final;              /* [T, C] output of the last layer */
    struct tensor hf, meanf, rstdf;     /* final norm output and stats */
    struct tensor ids, positions, targets; /* i32 [T] on the model's backend */
    struct tensor lse;                  /* f32 [T] log-sum-exp of each row of logits */
    struct tensor logits_chunk;         /* [chunk, V]: logits are computed chunk by chunk */
    int64_t chunk_rows;
    /* gradient scratch */
    struct tensor dres, dh;             /* [T, C] */
    struct tensor dq_a, dq_b, dk_a, dk_b, dv, datt; /* [T, Hq*D] / [T, Hkv*D] */
    struct tensor dgate, dup, dact;     /* [T, F] */
    struct tensor dlogits_chunk;        /* [chunk, V] */
    /* the batch of the last forward */
    int64_t n_tokens;
    int n_seqs;
    struct tensor cu_seqlens;           /* host i32 [S + 1], owned copy */
    bool has_targets;
    bool forward_done;
};

#endif
