#!/usr/bin/env python3
"""Builds tests/data/parity/rope_tables.json: the rotary tables transformers computes for
rope scalings smelt implements (model/rope.c), on the configurations of real checkpoints
(Llama 3.1 and 3.2, Qwen2.5 with YaRN, DeepSeek-style YaRN with mscale, YaRN without
truncation) and on small ones.

Each case: the config.json fields (as a checkpoint writes them), and what
`transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")` returns:
inv_freq (float32 values, written as the doubles they are exactly) and the
attention_scaling factor cos/sin are multiplied by. Regenerate with
`python3 tests/parity/make_rope_fixtures.py` (needs torch and transformers); the output
is committed so `make test` needs no Python packages."""
import json
import os

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "parity", "rope_tables.json")

LLAMA = dict(model_type="llama", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
             num_hidden_layers=2, intermediate_size=64, vocab_size=128)
QWEN2 = dict(model_type="qwen2", hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
             num_hidden_layers=2, intermediate_size=64, vocab_size=128)

CASES = {
    "llama3.1-8b": dict(LLAMA, max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "llama3.2-1b": dict(LLAMA, hidden_size=2048, num_attention_heads=32, head_dim=64,
                        max_position_embeddings=131072, rope_theta=500000.0,
                        rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "llama-linear": dict(LLAMA, max_position_embeddings=16384, rope_theta=10000.0,
                         rope_scaling={"type": "linear", "factor": 4.0}),
    "qwen2.5-yarn": dict(QWEN2, max_position_embeddings=131072, rope_theta=1000000.0,
                         rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}),
    "yarn-mscale": dict(LLAMA, head_dim=64, max_position_embeddings=163840, rope_theta=10000.0,
                        rope_scaling={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}),
    "yarn-no-truncate": dict(LLAMA, head_dim=64, max_position_embeddings=131072, rope_theta=150000.0,
                             rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "original_max_position_embeddings": 4096, "truncate": False}),
    "yarn-attention-factor": dict(QWEN2, max_position_embeddings=65536, rope_theta=1000000.0,
                                  rope_scaling={"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.25,
                                                "original_max_position_embeddings": 32768}),
    "small-llama3": dict(LLAMA, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64,
                         rope_theta=5000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "small-yarn": dict(QWEN2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64,
                       rope_theta=1000000.0,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
}


def table(fields):
    cfg = transformers.AutoConfig.for_model(**fields)
    rope_type = cfg.rope_parameters["rope_type"]
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    assert inv_freq.dtype == torch.float32
    return [float(x) for x in inv_freq.tolist()], float(scaling)


def main():
    out = {"transformers_version": transformers.__version__, "torch_version": torch.__version__, "cases": []}
    for name, fields in CASES.items():
        inv_freq, scaling = table(fields)
        out["cases"].append({"name": name, "config": fields, "inv_freq": inv_freq, "attention_scaling": scaling})
        print(f"{name}: {len(inv_freq)} pairs, attention_scaling {scaling}")
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
