/* model/score_head.h — the scalar head of a reward model: transformers'
 * {Llama,Mistral,Qwen2,Qwen3,GPT2}ForSequenceClassification with num_labels 1.
 *
 *   score[s] = score.weight . h[last(s)]      score.weight [1, C], no bias
 *
 * h is the final normed hidden state model_forward gives (its `hidden` output, f32
 * [T, C]); last(s) is the token of sequence s that transformers reads
 * (model_score_positions).
 *
 * Where the head's weight and gradient live (the decision). The weight is a parameter
 * of the model: "score.weight" in the flat buffer, viewed as model->w.score, so loading,
 * saving, model_hf_tensors and a full fine-tune's optimizer handle it like any other
 * weight. Its gradient goes where the caller says (model_score_backward's dweight):
 *   - full fine-tune: model->g.score, its slot in the flat gradient buffer;
 *   - LoRA: the base is frozen and has no gradient buffer, and the head trains in full
 *     beside the adapter, as PEFT's modules_to_save does for a SEQ_CLS task: the
 *     adapter holds its own copy of the head in its flat buffers (lora/lora.h:
 *     lora->score, lora->score_grad), lora_attach points model->w.score at that copy,
 *     and the trainer hands lora->score_grad here. The base's own score.weight is
 *     never written, so the frozen base hashes the same after training; the adapter
 *     directory carries the trained head, and lora_merge copies it into the model.
 * These functions read the head through model->w.score only, never by its offset. */
#ifndef SMELT_MODEL_SCORE_HEAD_H
#define SMELT_MODEL_SCORE_HEAD_H

#include "model/transformer.h"

/* The token of each sequence whose hidden state is scored, pos[s] (an index into the
 * packed row) in [cu[s], cu[s+1]): the last one whose id is not the config's
 * pad_token_id. This is transformers' rule, so a left- or right-padded batch, and a
 * trailing eos that doubles as the pad token (TRL's default), score as there. A
 * sequence of pad tokens only is scored at its first token (transformers: index 0);
 * without a pad_token_id, at its last token. */
int model_score_positions(const struct model *model, const struct model_batch *batch,
                          int32_t *pos, struct smelt_error *err);

/* scores[s] = score.weight . hidden[pos[s]]. hidden: f32 [T, C] (model_forward's output
 * for this batch); scores: f32 [S]; both on the model's backend. */
int model_score_forward(const struct model *model, const struct model_batch *batch,
                        const struct tensor *hidden, struct tensor *scores,
                        struct smelt_error *err);

/* Given dscores = dL/dscores (f32 [S]) for the same batch and hidden:
 *   dweight += sum_s dscores[s] * hidden[pos[s]]      ([1, C]; NULL: head frozen)
 *   dhidden  = dL/dhidden                             ([T, C], overwritten: zero but at
 *                                                      pos[s]; NULL: not wanted)
 * dhidden is what model_backward takes. All tensors on the model's backend. */
int model_score_backward(const struct model *model, const struct model_batch *batch,
                         const struct tensor *hidden, const struct tensor *dscores,
                         struct tensor *dweight, struct tensor *dhidden,
                         struct smelt_error *err);

/* The value head of PPO's critic: the same head read at every token instead of one
 * per sequence (TRL's value model, OpenRLHF's critic, veRL's critic all read a
 * one-output linear head at every position of a sequence classifier's body):
 *   values[t] = score.weight . hidden[t]      for every t of the T rows of hidden
 * The value at position t is the value of the state after tokens 0..t, i.e. before the
 * token at t + 1: the RL loop reads it where it reads that token's logprob.
 * hidden: f32 [T, C] (model_forward's output); values: f32 with T elements; both on
 * the model's backend. The model must have a score head (config.score_head). */
int model_value_forward(const struct model *model, const struct tensor *hidden, struct tensor *values,
                        struct smelt_error *err);

/* Given dvalues = dL/dvalues (T elements) for the same hidden:
 *   dweight += sum_t dvalues[t] * hidden[t]      ([1, C]; NULL: head frozen)
 *   dhidden  = dvalues[t] * score.weight per row ([T, C], overwritten; NULL: not wanted)
 * dhidden is what model_backward takes. */
int model_value_backward(const struct model *model, const struct tensor *hidden, const struct tensor *dvalues,
                         struct tensor *dweight, struct tensor *dhidden, struct smelt_error *err);

/* The sequence-classification class transformers has for a model type
 * ("LlamaForSequenceClassification", ...), or NULL when there is none. */
const char *model_classifier_architecture(enum model_type type);

/* A reward model made from a causal LM (a new model; lm is unchanged and keeps its
 * adapter, the new model has none): the same body, no lm_head, a score head drawn
 * from N(0, init_std) with seed (transformers draws it from N(0, initializer_range),
 * 0.02 in every supported config class). Its config names the type's classifier class
 * with one label, and a pad_token_id, which transformers needs to find the last token
 * of a batch of more than one: pad_token_id when >= 0 (the tokenizer's pad token), else
 * the config's, else its first eos. Errors: EINVAL when lm already has a score head or
 * no pad id can be found; EUNSUPPORTED naming a type without a classifier class. */
int model_classifier_from_lm(const struct model *lm, int64_t pad_token_id, double init_std,
                             uint64_t seed, struct model **out, struct smelt_error *err);

#endif
