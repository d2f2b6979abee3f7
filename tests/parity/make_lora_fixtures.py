#!/usr/bin/env python3
"""Builds the PEFT LoRA parity fixtures under tests/data/parity/<type>-lora/.

For llama, gpt2 and qwen3 it loads the base parity fixture (tests/data/parity/<type>,
made by make_fixtures.py), wraps it with a PEFT LoRA adapter (rank 4, alpha 8, targets
covering attention and MLP), replaces PEFT's init (B = 0) with random A and B so the
adapter changes every output, and writes:

  adapter_config.json, adapter_model.safetensors   PEFT's save_pretrained, unchanged
                                                   (its model card README.md removed)
  expected.safetensors  logits.<s> [L_s, V], logprobs.<s> [L_s - 1] for the sequences of
                        the base fixture's inputs.json, and grad.<tensor name> for every
                        adapter tensor (names as in adapter_model.safetensors) of
                        L = sum_s sum_t w[s][t] * logprobs.<s>[t]

The three adapters differ on purpose: llama lists PEFT names, gpt2 uses the Conv1D
names (c_attn, and c_proj for both attention and MLP) with lora_dropout 0.05 (inactive
in eval), qwen3 uses "all-linear" (which PEFT saves as full module paths) with rsLoRA.
gpt2-head (into gpt2-head-lora/, on the gpt2 base) wraps c_attn and the output
projection "lm_head", tied to the embeddings there; PEFT saves the head's base weight
beside the adapter (lm_head.base_layer.weight) and writes fan_in_fan_out false (its
last module, lm_head, is a Linear).

Regenerate with `python3 tests/parity/make_lora_fixtures.py` (needs torch,
transformers, peft, safetensors); the outputs are committed so `make test` needs no
Python packages.
"""
import json
import os
import sys

import peft
import torch
import transformers
from safetensors.torch import save_file

PARITY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "parity")

ADAPTERS = {
    "llama": dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "gpt2": dict(target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.05),
    "qwen3": dict(target_modules="all-linear", use_rslora=True),
    "gpt2-head": dict(target_modules=["c_attn", "lm_head"]),
}


def saved_name(param_name):
    """PEFT's parameter name without the adapter name, as save_pretrained writes it."""
    return param_name.replace(".default.", ".")


def run(fixture):
    """fixture: a key of ADAPTERS, "<base type>[-<variant>]"."""
    model_type = fixture.split("-")[0]
    base_dir = os.path.join(PARITY, model_type)
    out_dir = os.path.join(PARITY, f"{fixture}-lora")
    base = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, attn_implementation="eager", dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM", **ADAPTERS[fixture])
    model = peft.get_peft_model(base, config)
    # A path relative to the repository root rather than this machine's checkout.
    model.peft_config["default"].base_model_name_or_path = f"tests/data/parity/{model_type}"
    torch.manual_seed(4321)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn_like(p))
    model.eval()

    with open(os.path.join(base_dir, "inputs.json")) as f:
        inputs = json.load(f)
    expected = {}
    total = 0.0
    for s, (seq, w) in enumerate(zip(inputs["sequences"], inputs["loss_weights"])):
        ids = torch.tensor(seq)
        logits = model(input_ids=ids[None]).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1).float()
        token_logp = logp[:-1].gather(1, ids[1:, None])[:, 0]
        total = total + (torch.tensor(w) * token_logp).sum()
        expected[f"logits.{s}"] = logits.detach().clone()
        expected[f"logprobs.{s}"] = token_logp.detach().clone()
    total.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            expected[f"grad.{saved_name(name)}"] = p.grad.detach().clone()

    model.save_pretrained(out_dir)
    card = os.path.join(out_dir, "README.md")
    if os.path.exists(card):
        os.remove(card)
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(out_dir, "expected.safetensors"),
              metadata={"peft_version": peft.__version__, "transformers_version": transformers.__version__,
                        "torch_version": torch.__version__})
    n = sum(p.numel() for name, p in model.named_parameters() if p.requires_grad)
    print(f"{fixture}-lora: {n} adapter parameters -> {out_dir}")


def main():
    for t in sys.argv[1:] or list(ADAPTERS):
        run(t)


if __name__ == "__main__":
    main()
