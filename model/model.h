/* model/: everything that turns a Hugging Face model directory into logprobs and
 * gradients, and text into tokens and back. Include this header, not the parts.
 *   chat_template.h  chat templates (ChatML/Qwen3, Llama 3, Llama 2, Mistral, plain) with assistant masks
 *   config.h       config.json: architecture switches and shapes
 *   safetensors.h  safetensors read (mmap, validated) and write
 *   transformer.h  load/save/init, forward (logits, logprobs, hidden) and backward
 *   generate.h     the plain-recompute reference generator and its sampler
 *   tokenizer.h    HF tokenizer.json and GPT-2 encoder.json/vocab.bpe; byte tokenizer */
#ifndef SMELT_MODEL_H
#define SMELT_MODEL_H

#include "model/chat_template.h"
#include "model/config.h"
#include "model/generate.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

#endif
