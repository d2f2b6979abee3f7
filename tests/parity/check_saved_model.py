#!/usr/bin/env python3
"""Checks that a model smelt saves loads in Hugging Face transformers unchanged and gives
the same logits. For each model type of the parity fixtures: `smelt-model init` makes a
random model from the fixture's config, `smelt-model logits` prints smelt's logits, and
transformers loads the directory and computes its own.

    python3 tests/parity/check_saved_model.py [BUILD_DIR]

Needs torch and transformers (not part of `make test`, which has no Python
dependencies); exits non-zero on any mismatch. Run by `make test-parity`.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TYPES = ["llama", "mistral", "qwen2", "qwen3", "gpt2", "llama-rope-llama3", "qwen2-rope-yarn", "mistral-rope-linear", "llama-mlp-bias"]
IDS = [3, 17, 42, 5, 77, 9, 0, 63, 31, 12]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    tool = os.path.join(ROOT, build, "smelt-model")
    worst_all = 0.0
    failed = False
    for t in TYPES:
        for bf16 in (False, True):
            with tempfile.TemporaryDirectory() as d:
                cfg = os.path.join(ROOT, "tests", "data", "parity", t, "config.json")
                cmd = [tool, "init", "--config", cfg, "--out", d, "--seed", "3"]
                subprocess.run(cmd + (["--bf16"] if bf16 else []), check=True, capture_output=True)
                out = subprocess.run([tool, "logits", "--model", d, "--ids", ",".join(map(str, IDS))],
                                     check=True, capture_output=True, text=True).stdout
                ours = torch.tensor(json.loads(out)["logits"], dtype=torch.float64)
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    d, attn_implementation="eager", dtype=torch.float32)
                with torch.no_grad():
                    theirs = model(input_ids=torch.tensor([IDS])).logits[0].double()
                scale = theirs.abs().max().item()
                worst = ((ours - theirs).abs().max().item()) / scale
                worst_all = max(worst_all, worst)
                ok = worst < 1e-4
                failed |= not ok
                print(f"{t:8s} {'bf16' if bf16 else 'f32 '}  max |diff| / max |logit| = {worst:.2e}  {'ok' if ok else 'MISMATCH'}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"{'all match' if not failed else 'MISMATCH'} (worst {worst_all:.2e})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
