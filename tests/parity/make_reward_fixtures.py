#!/usr/bin/env python3
"""Builds the reward-model parity fixtures under tests/data/parity/<type>-rm/.

For llama, qwen2 and gpt2: a tiny random *ForSequenceClassification with num_labels 1
(fp32, eager attention) from the config of the causal-LM fixture of the same type, saved
with save_pretrained (config.json + model.safetensors: the body and score.weight, no
lm_head), and transformers' outputs for three sequences run as one right-padded batch:

  inputs.json          {"sequences": [[ids...], ...], "score_weights": [w...]}
  expected.safetensors scores [S] (the pooled logits), and grad.<param name> for every
                       parameter, of L = sum_s w[s] * scores[s]

The second sequence ends in the pad token (llama and gpt2: pad = eos, TRL's default;
qwen2: a separate pad id), so the fixture pins transformers' rule of scoring the last
token that is not pad. smelt's test packs the sequences into one row (cu_seqlens).
Regenerate with `python3 tests/parity/make_reward_fixtures.py` (needs torch,
transformers, safetensors); the outputs are committed so `make test` needs no Python.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import widen_weights  # noqa: E402
from make_fixtures import CONFIGS, OUT  # noqa: E402

PAD = {"llama": 2, "qwen2": 95, "gpt2": 95}  # llama: eos; gpt2: eos set to 95 below
LENGTHS = [9, 6, 7]


def build(model_type):
    cls, kwargs = CONFIGS[model_type]
    extra = dict(num_labels=1, pad_token_id=PAD[model_type])
    if model_type == "gpt2":
        extra.update(bos_token_id=95, eos_token_id=95)
    torch.manual_seed(4321)
    config = cls(**kwargs, **extra)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForSequenceClassification.from_config(config, torch_dtype=torch.float32)
    model.eval()
    widen_weights(model)
    return model


def sequences_for(model_type, vocab):
    gen = torch.Generator().manual_seed(77)
    pad = PAD[model_type]
    seqs = []
    for n in LENGTHS:
        ids = torch.randint(3, vocab - 1, (n,), generator=gen)  # never bos/eos/pad
        seqs.append(ids)
    seqs[1][-1] = pad  # a trailing pad (= eos for llama/gpt2): not the scored token
    weights = torch.randn(len(seqs), generator=gen)
    return seqs, weights


def run(model_type):
    model = build(model_type)
    out_dir = os.path.join(OUT, f"{model_type}-rm")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    seqs, weights = sequences_for(model_type, model.config.vocab_size)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD[model_type], dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    model.zero_grad()
    scores = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # [S]
    (weights * scores).sum().backward()
    expected = {"scores": scores.detach().clone()}
    for name, p in model.named_parameters():
        expected[f"grad.{name}"] = p.grad.detach().clone()
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(out_dir, "expected.safetensors"),
              metadata={"transformers_version": transformers.__version__,
                        "torch_version": torch.__version__})
    with open(os.path.join(out_dir, "inputs.json"), "w") as f:
        json.dump({"sequences": [s.tolist() for s in seqs], "score_weights": weights.tolist(),
                   "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__}, f)
    print(f"{model_type}-rm: scores {[round(x, 6) for x in scores.tolist()]} -> {out_dir}")


def main():
    for t in sys.argv[1:] or list(PAD):
        run(t)


if __name__ == "__main__":
    main()
