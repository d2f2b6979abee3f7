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

Then a LoRA reward model: `smelt-trainer` trains a reward_model job with `lora` (and
save_merged) on a random llama with the byte tokenizer, and its output, a PEFT SEQ_CLS
adapter whose base is that causal LM, loads as PEFT users load one:
AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, pad_token_id=the
tokenizer's pad) and PeftModel.from_pretrained(model, adapter). Every tensor of
adapter_model.safetensors must arrive in PEFT's state dict unchanged (the head
base_model.model.score.weight included), and PEFT's scores of a right-padded batch must
equal `smelt-model score` on the adapter directory (ids and text); output/merged must
load in transformers alone with the same scores.

    python3 tests/parity/check_reward_model.py [BUILD_DIR]

Needs torch, transformers and tokenizers, and peft for the LoRA check; exits non-zero on
any mismatch. Run by `make test-parity`.
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
    return hf_scores_of(model, sequences, pad), pad


def hf_scores_of(model, sequences, pad):
    """The model's scores of the sequences as one right-padded batch."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].double()


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


def write_preferences(path, first, n):
    """Three-letter reversal (chosen) against a near miss (rejected), as the unit tests make them."""
    with open(path, "w") as f:
        for i in range(first, first + n):
            s = "".join(chr(ord("a") + x) for x in (i % 7, (i * 3) % 5, (i // 5) % 6))
            good = s[::-1]
            bad = list(good)
            bad[i % 3] = chr(ord("a") + (ord(bad[i % 3]) - ord("a") + 1) % 7)
            f.write(json.dumps({"prompt": s + ">", "chosen": good, "rejected": "".join(bad)}) + "\n")


def train_lora_reward_model(build, d):
    """A LoRA reward_model job on a random llama with the byte tokenizer; returns the LM's
    directory and the job's output (the adapter)."""
    lm, cfg = os.path.join(d, "lm"), os.path.join(d, "config.json")
    with open(os.path.join(ROOT, "tests", "data", "parity", "llama", "config.json")) as f:
        config = json.load(f)
    config.update(vocab_size=320, bos_token_id=None, eos_token_id=None)
    with open(cfg, "w") as f:
        json.dump(config, f)
    smelt(build, "init", "--config", cfg, "--out", lm, "--seed", "8", "--byte-tokenizer")
    write_preferences(os.path.join(d, "train.jsonl"), 0, 64)
    write_preferences(os.path.join(d, "val.jsonl"), 64, 16)
    spec = {"type": "reward_model", "model": lm, "seed": 3, "output_dir": os.path.join(d, "run"),
            "data": {"train": os.path.join(d, "train.jsonl"), "validation": os.path.join(d, "val.jsonl"),
                     "max_seq_len": 16},
            "hyperparameters": {"max_steps": 12, "batch_size": 8, "learning_rate": 0.01},
            "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]},
            "save_merged": True}
    with open(os.path.join(d, "spec.json"), "w") as f:
        json.dump(spec, f)
    run = subprocess.run([os.path.join(ROOT, build, "smelt-trainer"), "--spec", os.path.join(d, "spec.json"),
                          "--quiet"], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"smelt-trainer failed ({run.returncode}): {run.stderr.strip()[-600:]}")
    return lm, os.path.join(d, "run", "output")


def peft_placed(model, adapter):
    """The problems with the adapter's tensors in PEFT's state dict: names PEFT could not
    place, values that changed on load."""
    import peft
    from safetensors.torch import load_file
    saved = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    loaded = peft.get_peft_model_state_dict(model)
    if set(saved) != set(loaded):
        return [f"tensors PEFT did not place: {sorted(set(saved) ^ set(loaded))[:4]}"]
    problems = [f"{n} changed on load" for n, t in saved.items() if not torch.equal(t, loaded[n].to(t.dtype))]
    if "base_model.model.score.weight" not in saved:
        problems.append("the adapter holds no head")
    if all(t.abs().max().item() == 0 for n, t in saved.items() if "lora_B" in n):
        problems.append("every lora_B is zero: the adapter did not train, nothing is being checked")
    return problems


def check_lora(build):
    import peft
    with tempfile.TemporaryDirectory() as d:
        try:
            lm, adapter = train_lora_reward_model(build, d)
        except RuntimeError as e:
            print(f"{'llama lora':22s} MISMATCH: {e}")
            return [(False, float("inf"))]
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            cfg = json.load(f)
        tok = tokenizers.Tokenizer.from_file(os.path.join(adapter, "tokenizer.json"))
        pad, bos, eos = tok.token_to_id("<|pad|>"), tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        prompt, response = "abc>", "cba"
        text_ids = ([bos] + tok.encode(prompt, add_special_tokens=False).ids
                    + tok.encode(response, add_special_tokens=False).ids + [eos])
        sequences = [IDS[0], IDS[1] + [pad], IDS[2], text_ids]
        ours = [smelt_score(build, adapter, "--ids", ",".join(map(str, s))) for s in sequences[:3]]
        ours.append(smelt_score(build, adapter, "--prompt", prompt, "--response", response))
        with_flag = smelt_score(build, lm, "--adapter", adapter, "--ids", ",".join(map(str, IDS[0])))
        base = transformers.AutoModelForSequenceClassification.from_pretrained(
            lm, num_labels=1, pad_token_id=pad, attn_implementation="eager", dtype=torch.float32)
        model = peft.PeftModel.from_pretrained(base, adapter)
        model.eval()
        problems = peft_placed(model, adapter)
        if cfg.get("task_type") != "SEQ_CLS" or cfg.get("base_model_name_or_path") != os.path.realpath(lm):
            problems.append(f"adapter_config.json: task_type {cfg.get('task_type')}, "
                            f"base {cfg.get('base_model_name_or_path')}")
        if with_flag != ours[0]:
            problems.append(f"--model BASE --adapter DIR scores {with_flag}, --model DIR {ours[0]}")
        theirs = hf_scores_of(model, sequences, pad)
        ok, worst = compare(f"llama lora pad={pad}", ours, theirs)
        for p in problems:
            print(f"{'':22s} MISMATCH: {p}")
        merged, _ = hf_scores(os.path.join(adapter, "merged"), sequences)
        ok_m, worst_m = compare("llama lora merged", ours, merged)
        return [(ok and not problems, worst), (ok_m, worst_m)]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    results = [check_type(build, t, bf16) for t in TYPES for bf16 in (False, True)]
    results.append(check_text(build))
    results += check_lora(build)
    finish(results, f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
