#!/usr/bin/env python3
"""Builds the Hugging Face parity fixtures under tests/data/parity/.

For each supported model type it creates a tiny random model with `transformers`
(fp32, eager attention), saves it as a model directory (config.json +
model.safetensors), runs two sequences of different lengths through it, and saves:

  inputs.json          {"sequences": [[ids...], ...], "loss_weights": [[w...], ...]}
  expected.safetensors logits.<s> [L_s, V], logprobs.<s> [L_s - 1] (of the next token),
                       grad.<param name> for every parameter, of
                       L = sum_s sum_t w[s][t] * logprobs.<s>[t]

smelt's tests pack both sequences into one row (cu_seqlens) and compare. Regenerate
with `python3 tests/parity/make_fixtures.py` (needs torch, transformers, safetensors);
the outputs are committed so `make test` needs no Python packages.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import widen_weights  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "parity")

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6)

CONFIGS = {
    # GQA, untied, rope_theta != default
    "llama": (transformers.LlamaConfig, dict(COMMON, num_key_value_heads=2, rope_theta=5000.0,
                                            tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, dict(COMMON, num_key_value_heads=1, rope_theta=10000.0,
                                                tie_word_embeddings=False, sliding_window=None)),
    # q/k/v biases, tied embeddings
    "qwen2": (transformers.Qwen2Config, dict(COMMON, num_key_value_heads=2, rope_theta=1000000.0,
                                            tie_word_embeddings=True, use_sliding_window=False)),
    # q/k norms, head_dim not hidden/heads
    "qwen3": (transformers.Qwen3Config, dict(COMMON, num_key_value_heads=2, head_dim=16,
                                            rope_theta=1000000.0, tie_word_embeddings=True,
                                            use_sliding_window=False)),
    # biases on q/k/v/o and on gate/up/down
    "llama-mlp-bias": (transformers.LlamaConfig, dict(COMMON, num_key_value_heads=2, rope_theta=5000.0,
                                                     tie_word_embeddings=False, attention_bias=True,
                                                     mlp_bias=True)),
    # rope scalings (model/rope.c), on positions that reach past original_max_position_embeddings
    "llama-rope-llama3": (transformers.LlamaConfig, dict(
        COMMON, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "qwen2-rope-yarn": (transformers.Qwen2Config, dict(
        COMMON, num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16})),
    "mistral-rope-linear": (transformers.MistralConfig, dict(
        COMMON, num_key_value_heads=1, tie_word_embeddings=False, sliding_window=None,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "gpt2": (transformers.GPT2Config, dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                                          n_positions=64, n_inner=None,
                                          activation_function="gelu_new",
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
}

LENGTHS = [11, 6]


def build(model_type):
    cls, kwargs = CONFIGS[model_type]
    torch.manual_seed(1234)
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.eval()
    widen_weights(model)
    return model


def run(model_type):
    model = build(model_type)
    out_dir = os.path.join(OUT, model_type)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    gen = torch.Generator().manual_seed(99)
    vocab = model.config.vocab_size
    sequences = [torch.randint(0, vocab, (n,), generator=gen) for n in LENGTHS]
    weights = [torch.randn(n - 1, generator=gen) for n in LENGTHS]

    model.zero_grad()
    expected = {}
    total = 0.0
    for s, (ids, w) in enumerate(zip(sequences, weights)):
        logits = model(input_ids=ids[None]).logits[0]  # [L, V]
        logp = torch.log_softmax(logits.double(), dim=-1).float()
        token_logp = logp[:-1].gather(1, ids[1:, None])[:, 0]
        total = total + (w * token_logp).sum()
        expected[f"logits.{s}"] = logits.detach().clone()
        expected[f"logprobs.{s}"] = token_logp.detach().clone()
    total.backward()
    for name, p in model.named_parameters():
        expected[f"grad.{name}"] = p.grad.detach().clone()
    # Tied weights appear once in named_parameters(); state_dict names are what load uses.
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out_dir, "expected.safetensors"))
    with open(os.path.join(out_dir, "inputs.json"), "w") as f:
        json.dump({"sequences": [x.tolist() for x in sequences],
                   "loss_weights": [x.tolist() for x in weights],
                   "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__}, f)
    print(f"{model_type}: {sum(p.numel() for p in model.parameters())} parameters -> {out_dir}")


def main():
    types = sys.argv[1:] or list(CONFIGS)
    for t in types:
        run(t)


if __name__ == "__main__":
    main()
