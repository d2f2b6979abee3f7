#!/usr/bin/env python3
"""Builds the PEFT fixtures of LoRA reward models under tests/data/parity/<type>-rm-lora/.

A LoRA reward model as PEFT users make one: the causal-LM parity fixture
(tests/data/parity/<type>, make_fixtures.py) loaded with
AutoModelForSequenceClassification (num_labels 1, a pad id: the score head is new), then
get_peft_model with task_type "SEQ_CLS", which wraps the LoRA targets and trains the
head `score` in full (PEFT adds ["classifier", "score"] to modules_to_save for that
task). PEFT's init (B = 0, the head's copy = the new head) is replaced by random values
so the adapter changes every score, and the directory holds:

  adapter_config.json, adapter_model.safetensors   PEFT's save_pretrained, unchanged
                                                   (its model card README.md removed);
                                                   the head is base_model.model.score.weight
  inputs.json           {"sequences", "score_weights", "pad_token_id"}: three sequences
                        (make_reward_fixtures.py's, the second ending in the pad token)
  expected.safetensors  scores [S] of the sequences as one right-padded batch, and
                        grad.<tensor name> for every adapter tensor (LoRA A and B and the
                        head; names as in adapter_model.safetensors) of L = sum_s w[s] * scores[s]

llama takes PEFT's default targets for its architecture (q_proj, v_proj); gpt2 names
its Conv1D modules (c_attn, c_proj, c_fc). base_model_name_or_path is the base's path
from the repository root, as in the other LoRA fixtures.

Regenerate with `python3 tests/parity/make_reward_lora_fixtures.py` (needs torch,
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reward_fixtures import PAD, sequences_for  # noqa: E402

PARITY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "parity")

ADAPTERS = {
    "llama": dict(),
    "gpt2": dict(target_modules=["c_attn", "c_proj", "c_fc"]),
}


def saved_name(param_name):
    """PEFT's parameter name as save_pretrained writes it: no adapter name, and a
    modules_to_save copy under the wrapped module's own name."""
    return param_name.replace(".modules_to_save.default.", ".").replace(".default.", ".")


def run(model_type):
    base_dir = os.path.join(PARITY, model_type)
    out_dir = os.path.join(PARITY, f"{model_type}-rm-lora")
    pad = PAD[model_type]
    base = transformers.AutoModelForSequenceClassification.from_pretrained(
        base_dir, num_labels=1, pad_token_id=pad, attn_implementation="eager", dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, task_type="SEQ_CLS", **ADAPTERS[model_type])
    model = peft.get_peft_model(base, config)
    model.peft_config["default"].base_model_name_or_path = f"tests/data/parity/{model_type}"
    torch.manual_seed(4321)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(0.2 * torch.randn_like(p))
    model.eval()

    seqs, weights = sequences_for(model_type, base.config.vocab_size)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    scores = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    (weights * scores).sum().backward()
    expected = {"scores": scores.detach().clone()}
    for name, p in model.named_parameters():
        if p.requires_grad:
            expected[f"grad.{saved_name(name)}"] = p.grad.detach().clone()

    model.save_pretrained(out_dir)
    card = os.path.join(out_dir, "README.md")
    if os.path.exists(card):
        os.remove(card)
    versions = {"peft_version": peft.__version__, "transformers_version": transformers.__version__,
                "torch_version": torch.__version__}
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(out_dir, "expected.safetensors"),
              metadata=versions)
    with open(os.path.join(out_dir, "inputs.json"), "w") as f:
        json.dump({"sequences": [s.tolist() for s in seqs], "score_weights": weights.tolist(),
                   "pad_token_id": pad, **versions}, f)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{model_type}-rm-lora: {n} trained parameters, scores {[round(x, 6) for x in scores.tolist()]} "
          f"-> {out_dir}")


def main():
    for t in sys.argv[1:] or list(ADAPTERS):
        run(t)


if __name__ == "__main__":
    main()
