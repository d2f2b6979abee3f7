#!/usr/bin/env python3
"""Writes the addition dataset of the example SFT job (examples/sft.json).

Rows are raw prompt/completion text for the byte tokenizer, in a fixed-width format:
operands zero-padded to --digits digits, the sum to --digits + 1:

    {"prompt": "07+93=", "completion": "100"}
    {"prompt": "22+01=", "completion": "023"}

By default the operands are 0-99 and the files hold every one of the 10,000 pairs
once, shuffled: 8,000 for training, 1,000 for validation, 1,000 for testing (disjoint,
so the accuracy on validation is on sums the model never saw).

Why this format: the tiny model of examples/tiny/ starts from random weights and has
RoPE (relative) positions, so it must learn which earlier characters each answer digit
depends on. With fixed widths those are always at the same distance and it learns the
task within a few hundred optimizer steps; with unpadded numbers ("7+93=100") the
distances vary and the same model needs about three times as many steps, staying near
chance for the first ~800 (bench/sft_torch.py measured both).

Variants for longer runs: --digits 3 (operands 0-999), --reverse-sum (the sum least
significant digit first, so each digit comes after the digits its carry depends on),
--unpadded (natural numbers).

    python3 examples/make_addition.py                      # the committed files
    python3 examples/make_addition.py --digits 3 --reverse-sum --train 40000 --out /tmp/add3

The output depends only on the arguments: same seed, same bytes. Standard library only.
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def make_row(a, b, digits, reverse_sum, padded):
    width = digits if padded else 0
    total = f"{a + b:0{width + 1 if padded else 0}d}"
    return {"prompt": f"{a:0{width}d}+{b:0{width}d}=", "completion": total[::-1] if reverse_sum else total}


def distinct_pairs(rng, count, digits):
    """count distinct (a, b) pairs of operands below 10**digits, in random order."""
    size = 10 ** digits
    if count > size * size:
        raise SystemExit(f"make_addition: {count} rows, but {digits}-digit operands make only {size * size} pairs")
    return [divmod(i, size) for i in rng.sample(range(size * size), count)]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(", ", ": ")) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--digits", type=int, default=2, help="operands below 10**DIGITS (default 2)")
    p.add_argument("--train", type=int, default=8000, help="training rows (default 8000)")
    p.add_argument("--val", type=int, default=1000, help="validation rows (default 1000)")
    p.add_argument("--test", type=int, default=1000, help="test rows (default 1000; 0: no test file)")
    p.add_argument("--reverse-sum", action="store_true", help="write the sum least significant digit first")
    p.add_argument("--unpadded", action="store_true", help="no leading zeros (\"7+93=100\")")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=os.path.join(HERE, "data"), help="output folder (default examples/data)")
    args = p.parse_args()
    if not 1 <= args.digits <= 6 or min(args.train, args.val) < 1 or args.test < 0:
        raise SystemExit("make_addition: --digits must be in [1, 6], --train and --val >= 1, --test >= 0")

    rng = random.Random(args.seed)
    pairs = distinct_pairs(rng, args.train + args.val + args.test, args.digits)
    rows = [make_row(a, b, args.digits, args.reverse_sum, not args.unpadded) for a, b in pairs]
    splits = {"train": rows[:args.train], "val": rows[args.train:args.train + args.val],
              "test": rows[args.train + args.val:]}
    os.makedirs(args.out, exist_ok=True)
    for name, part in splits.items():
        if not part:
            continue
        path = os.path.join(args.out, f"addition_{name}.jsonl")
        write_jsonl(path, part)
        print(f"{path}: {len(part)} rows")


if __name__ == "__main__":
    main()
