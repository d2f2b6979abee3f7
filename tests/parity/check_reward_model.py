#!/usr/bin/env python3
"""Checks that a reward model smelt saves loads in transformers'
AutoModelForSequenceClassification unchanged and scores as smelt does.

For each model type of the parity fixtures: `smelt-model init` makes a random causal LM
from the fixture's config, `smelt-model add-score-head` turns it into a reward model
(f32, and bf16), `smelt-model score --ids` scores three sequences one by one (the second
ends in the pad token, which transformers does not score), and transformers scores the
same sequences as one right-padded batch (which needs the pad_token_id smelt wrote).
Then the text path: a llama with smelt's byte tokenizer scores a prompt/response pair
(`score --prompt --response`), and transformers scores [bos] + prompt + response + [eos]
tokenized by the `tokenizers` library from the same tokenizer.json.

    python3 tests/parity/check_reward_model.py [BUILD_DIR]

Needs torch, transformers and tokenizers; exits non-zero on any mismatch. Run by
`make test-parity`.
"""
import json
import os
import subprocess
import sys
import tempfile

import tokenizers
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import finish  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TYPES = ["llama", "mistral", "qwen2", "qwen3", "gpt2"]
IDS = [[3, 17, 42, 5, 77, 9, 0, 63, 31, 12], [8, 22, 61, 4, 90], [45, 7, 19, 33, 70, 11, 6]]
TOL = 1e-4  # of the largest |score|


def smelt(build, *args):
    tool = os.path.join(ROOT, build, "smelt-model")
    return subprocess.run([tool, *args], check=True, capture_output=True, text=True).stdout


def smelt_score(build, model_dir, *args):
    return json.loads(smelt(build, "score", "--model", model_dir, *args))["score"]


def hf_scores(model_dir, sequences):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32)
    pad = model.config.pad_token_id
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].double(), pad


def compare(label, ours, theirs):
    ours = torch.tensor(ours, dtype=torch.float64)
    worst = (ours - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-6)
    ok = worst < TOL
    print(f"{label:22s} smelt {[f'{x:.6f}' for x in ours.tolist()]}  "
          f"transformers {[f'{x:.6f}' for x in theirs.tolist()]}  max |diff|/max|score| = {worst:.2e}  "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok, worst


def check_type(build, t, bf16):
    with tempfile.TemporaryDirectory() as d:
        lm, rm = os.path.join(d, "lm"), os.path.join(d, "rm")
        cfg = os.path.join(ROOT, "tests", "data", "parity", t, "config.json")
        smelt(build, "init", "--config", cfg, "--out", lm, "--seed", "3")
        # llama and mistral fall back to their eos; the qwen fixtures have none, and gpt2's
        # eos (50256) lies outside its 96-token vocabulary. Pad 0 also occurs inside IDS[0].
        pad = {"qwen2": ["--pad-id", "0"], "qwen3": ["--pad-id", "95"],
               "gpt2": ["--pad-id", "95"]}.get(t, [])
        smelt(build, "add-score-head", "--model", lm, "--out", rm, "--seed", "5", *pad,
              *(["--bf16"] if bf16 else []))
        with open(os.path.join(rm, "config.json")) as f:
            pad_id = json.load(f)["pad_token_id"]
        sequences = [IDS[0], IDS[1] + [pad_id], IDS[2]]  # the second ends in pad
        theirs, _ = hf_scores(rm, sequences)
        ours = [smelt_score(build, rm, "--ids", ",".join(map(str, s))) for s in sequences]
        return compare(f"{t} {'bf16' if bf16 else 'f32'} pad={pad_id}", ours, theirs)


def check_text(build):
    with tempfile.TemporaryDirectory() as d:
        lm, rm, cfg = os.path.join(d, "lm"), os.path.join(d, "rm"), os.path.join(d, "config.json")
        with open(os.path.join(ROOT, "tests", "data", "parity", "llama", "config.json")) as f:
            config = json.load(f)
        config.update(vocab_size=320, bos_token_id=None, eos_token_id=None)
        with open(cfg, "w") as f:
            json.dump(config, f)
        smelt(build, "init", "--config", cfg, "--out", lm, "--seed", "4", "--byte-tokenizer")
        smelt(build, "add-score-head", "--model", lm, "--out", rm, "--seed", "6")
        prompt, response = "What is 12+34?", " 46, of course."
        ours = smelt_score(build, rm, "--prompt", prompt, "--response", response)
        tok = tokenizers.Tokenizer.from_file(os.path.join(rm, "tokenizer.json"))
        bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        ids = ([bos] + tok.encode(prompt, add_special_tokens=False).ids
               + tok.encode(response, add_special_tokens=False).ids + [eos])
        theirs, pad_id = hf_scores(rm, [ids])
        return compare(f"llama text pad={pad_id}", [ours], theirs)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    results = [check_type(build, t, bf16) for t in TYPES for bf16 in (False, True)]
    results.append(check_text(build))
    finish(results, f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
