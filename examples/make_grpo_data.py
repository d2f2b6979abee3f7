#!/usr/bin/env python3
"""Writes the data of the example GRPO run (examples/sft_mixed.json, then examples/grpo.json).

- addition_mixed_train.jsonl: the SFT example's training sums (addition_train.jsonl, written
  by make_addition.py) with half of the answers, drawn from --seed, written without their
  leading zero ("37" for "037"). A model fine-tuned on it learns the sums but writes each
  one in either form, by chance.
- addition_prompts_{train,val}.jsonl: the same prompts as prompts rows whose answer is the
  three-digit form, for GRPO, whose reward (examples/grpo.json) asks for exactly that:

      {"prompt": "22+01=", "answer": "023"}

The output depends only on the input files and the arguments. Standard library only.

    python3 examples/make_grpo_data.py        # the committed files
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def write(path, items):
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        for item in items:
            out.write(json.dumps(item, separators=(", ", ": ")) + "\n")
            n += 1
    print(f"{os.path.basename(path)}: {n} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    data = os.path.join(HERE, "data")
    rng = random.Random(args.seed)
    train = list(rows(os.path.join(data, "addition_train.jsonl")))
    write(os.path.join(data, "addition_mixed_train.jsonl"),
          ({"prompt": r["prompt"], "completion": str(int(r["completion"])) if rng.random() < 0.5 else r["completion"]}
           for r in train))
    for split in ("train", "val"):
        write(os.path.join(data, f"addition_prompts_{split}.jsonl"),
              ({"prompt": r["prompt"], "answer": r["completion"]}
               for r in rows(os.path.join(data, f"addition_{split}.jsonl"))))


if __name__ == "__main__":
    main()
