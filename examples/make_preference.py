#!/usr/bin/env python3
"""Writes the preference pairs of the example DPO job (examples/dpo.json).

The prompts are those of the SFT example's files (examples/data/addition_{train,val}.jsonl,
written by make_addition.py); the chosen response is the right sum, the rejected one a
near miss, the sum with one digit moved up or down by one:

    {"prompt": "22+01=", "chosen": "023", "rejected": "033"}

A near miss is what a model that almost adds gets wrong, so the pairs teach the last
step rather than the format. Which digit, and which way, are drawn from --seed; the
output depends only on the input files and the arguments. Standard library only.

    python3 examples/make_preference.py        # the committed files
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def near_miss(rng, answer):
    """answer with one digit moved by one (9 up wraps to 0, 0 down to 9)."""
    i = rng.randrange(len(answer))
    digit = (int(answer[i]) + rng.choice((-1, 1))) % 10
    return answer[:i] + str(digit) + answer[i + 1:]


def convert(src, dst, rng):
    rows = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8", newline="\n") as out:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            pair = {"prompt": row["prompt"], "chosen": row["completion"],
                    "rejected": near_miss(rng, row["completion"])}
            out.write(json.dumps(pair, separators=(", ", ": ")) + "\n")
            rows += 1
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.path.join(HERE, "data"),
                   help="folder holding addition_{train,val}.jsonl; the pairs are written beside them")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    for split in ("train", "val"):
        src = os.path.join(args.data, f"addition_{split}.jsonl")
        dst = os.path.join(args.data, f"addition_pref_{split}.jsonl")
        print(f"{dst}: {convert(src, dst, rng)} pairs")


if __name__ == "__main__":
    main()
