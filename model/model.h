/* model/: everything that turns a Hugging Face model directory into logprobs and
 * gradients (text <-> tokens is tokenizer/). Include this header, not the parts.
 *   config.h       config.json: architecture switches and shapes
 *   safetensors.h  safetensors read (mmap, validated) and write
 *   transformer.h  load/save/init, forward (logits, logprobs, hidden) and backward
 *   generate.h     the plain-recompute reference generator and its sampler
 *   score_head.h   a reward model's scalar head (sequence classification) */
#ifndef SMELT_MODEL_H
#define SMELT_MODEL_H

#include "model/config.h"
#include "model/generate.h"
#include "model/safetensors.h"
#include "model/score_head.h"
#include "model/transformer.h"

#endif
