#!/usr/bin/env python3
"""Checks that a LoRA adapter smelt saves loads in PEFT onto the same base model and
gives the logits smelt computes with it.

    python3 tests/parity/check_saved_adapter.py [BUILD_DIR]
        for each PEFT fixture (tests/data/parity/<type>-lora and gpt2-head-lora, from
        make_lora_fixtures.py): `smelt-lora save` loads it in smelt and writes
        it again, then the adapter smelt wrote is checked as below
    python3 tests/parity/check_saved_adapter.py BUILD_DIR --base DIR --adapter DIR [--ids 1,2,3]
        checks one adapter smelt saved (a LoRA job's output/, a checkpoint's adapter/)

The check: PEFT's PeftModel.from_pretrained loads the adapter onto the base, every
tensor of adapter_model.safetensors must arrive in PEFT's state dict unchanged (PEFT
only warns about names it cannot place), and its logits must match those `smelt-lora
logits` prints. Needs torch, transformers and peft (not part of `make test`);
exits non-zero on any mismatch. Run by `make test-parity`.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import peft
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import finish  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# (base, adapter fixture): gpt2-head-lora wraps the tied lm_head too.
FIXTURES = [("llama", "llama-lora"), ("gpt2", "gpt2-lora"), ("qwen3", "qwen3-lora"), ("gpt2", "gpt2-head-lora")]
# PEFT's state dict of a targeted lm_head holds its base weight too (save_embedding_layers
# "auto"); smelt's adapter does not carry base weights.
LM_HEAD_BASE = "base_model.model.lm_head.base_layer.weight"
IDS = [3, 17, 42, 5, 77, 9, 0, 63, 31, 12]


def smelt_logits(bindir, base, adapter, ids):
    cmd = [os.path.join(bindir, "smelt-lora" if adapter else "smelt-model"), "logits", "--model", base,
           "--ids", ",".join(map(str, ids))]
    if adapter:
        cmd += ["--adapter", adapter]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return torch.tensor(json.loads(out)["logits"], dtype=torch.float64)


def check(tool, base, adapter, ids, label):
    """Returns (ok, worst relative difference)."""
    ours = smelt_logits(tool, base, adapter, ids)
    without = smelt_logits(tool, base, None, ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    saved = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    loaded = {k: v for k, v in peft.get_peft_model_state_dict(model).items() if k != LM_HEAD_BASE}
    problems = []
    if set(saved) != set(loaded):
        problems.append(f"tensors PEFT did not place: {sorted(set(saved) ^ set(loaded))[:4]}")
    else:
        for name, t in saved.items():
            if not torch.equal(t, loaded[name].to(t.dtype)):
                problems.append(f"{name} changed on load")
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits[0].double()
    scale = theirs.abs().max().item()
    worst = (ours - theirs).abs().max().item() / scale
    effect = (ours - without).abs().max().item() / scale
    if worst >= 1e-4:
        problems.append("logits differ")
    if effect < 1e-3:
        problems.append("the adapter does not change the logits: nothing is being checked")
    ok = not problems
    print(f"{label:8s} max |diff| / max |logit| = {worst:.2e} (adapter effect {effect:.2e})  "
          f"{'ok' if ok else 'MISMATCH: ' + '; '.join(problems)}")
    return ok, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", nargs="?", default="build")
    parser.add_argument("--base")
    parser.add_argument("--adapter")
    parser.add_argument("--ids", default=",".join(map(str, IDS)))
    args = parser.parse_args()
    tool = os.path.join(ROOT, args.build)
    ids = [int(x) for x in args.ids.split(",")]
    results = []
    if args.base or args.adapter:
        if not (args.base and args.adapter):
            parser.error("--base and --adapter go together")
        results.append(check(tool, args.base, args.adapter, ids, "adapter"))
    else:
        for t, fixture in FIXTURES:
            base = os.path.join(ROOT, "tests", "data", "parity", t)
            adapter = os.path.join(ROOT, "tests", "data", "parity", fixture)
            with tempfile.TemporaryDirectory() as d:
                subprocess.run([os.path.join(tool, "smelt-lora"), "save", "--model", base, "--adapter", adapter, "--out", d],
                               check=True, capture_output=True)
                results.append(check(tool, base, d, ids, fixture.removesuffix("-lora")))
    finish(results, f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
