#!/usr/bin/env python3
"""Writes the prompts of the example GRPO job (examples/grpo.json).

The prompts are those of the SFT example's files (examples/data/addition_{train,val}.jsonl,
written by make_addition.py), with the right sum as the row's answer, which the job's
exact_match verifier compares each completion with:

    {"prompt": "22+01=", "answer": "023"}

The output depends only on the input files. Standard library only.

    python3 examples/make_prompts.py        # the committed files
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def convert(src, dst):
    rows = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8", newline="\n") as out:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            out.write(json.dumps({"prompt": row["prompt"], "answer": row["completion"]},
                                 separators=(", ", ": ")) + "\n")
            rows += 1
    return rows


def main():
    data = os.path.join(HERE, "data")
    for split in ("train", "val"):
        n = convert(os.path.join(data, f"addition_{split}.jsonl"),
                    os.path.join(data, f"addition_prompts_{split}.jsonl"))
        print(f"addition_prompts_{split}.jsonl: {n} prompts")


if __name__ == "__main__":
    main()
