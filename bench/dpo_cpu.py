#!/usr/bin/env python3
"""dpo_cpu: DPO training speed on the CPU, smelt-trainer against TRL's DPOTrainer.

    python3 bench/dpo_cpu.py [--trainer build-cpu/smelt-trainer]
    taskset -c 0,1 python3 bench/dpo_cpu.py          # pin both to two cores
    python3 bench/dpo_cpu.py --trl-only              # the TRL half alone

For each model (the example tiny model and sft_cpu.py's ~22M-parameter Llama, random
weights drawn once by transformers and saved as safetensors, so both start from the same
weights) and each method (full fine-tune; LoRA rank 8 on q_proj and v_proj), on the
example preference pairs (examples/make_preference.py's near-miss sums, generated from
examples/data/addition_train.jsonl exactly as the committed addition_pref_train.jsonl;
the first pairs x (warm-up + steps) rows):

  smelt  smelt-trainer runs a generated DPO job spec (sigmoid, β 0.1, reference logprobs
         precomputed, `batch_size` pairs, rows in file order, constant learning rate,
         no validation); no thread variables set unless --threads. The number is the
         median tokens_per_s of its metrics.jsonl steps after the warm-up.
  TRL    bench/dpo_trl.py: DPOTrainer on the same weights, rows, pairs per step, max
         length, steps, optimizer and schedule, precompute_ref_log_probs=True, f32, in
         this process, torch's default threads unless --threads. The number is the
         median of the step's tokens / the wall time between consecutive step ends,
         after the same warm-up.

What is timed: the training steps only (forward of chosen and rejected, backward,
clipping, AdamW, and each trainer's batch assembly and metrics). The reference pass
before training is reported apart (`ref s`: smelt's log line, the time TRL spends in
its precompute). Tokens are counted the same way for both: every token of the chosen
and the rejected sequence of each pair in the step (bos + prompt + response + eos), and
the driver checks that the two trainers tokenize the first pair to the same ids. The
loss columns are each trainer's loss (mean pair loss) at the last step; the full rows
start from the same weights on the same batches and should agree closely, the LoRA
rows draw their adapters from different random numbers and agree in range only.

Needs torch, transformers, datasets, trl (and peft for the LoRA rows). Without the
trainer binary it stops with a message unless --trl-only is given.
"""
import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time

import common
import dpo_trl
from common import OVERRIDES, ROOT, SEED

sys.path.insert(0, os.path.join(ROOT, "examples"))
import make_preference  # noqa: E402

# name -> (pairs per step, timed steps); every sequence of the example pairs is 11 tokens
# (bos, "22+01=", "023", eos), so a step holds pairs x 2 x 11 tokens.
MODELS = [("tiny", 64, 20), ("llama-22m", 64, 6)]
METHODS = {"full": None, "lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}}
WARMUP_STEPS = 2
MAX_SEQ_LEN = 32
HYPERPARAMETERS = {"learning_rate": 1e-3, "lr_schedule": "constant", "warmup_steps": 0,
                   "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0}


def write_pairs(path, n_rows):
    """The first n_rows preference pairs, made as examples/make_preference.py makes them."""
    full = path + ".all"
    make_preference.convert(os.path.join(ROOT, "examples", "data", "addition_train.jsonl"), full,
                            random.Random(SEED))
    with open(full, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][:n_rows]
    if len(lines) < n_rows:
        raise SystemExit(f"dpo_cpu: only {len(lines)} pairs, {n_rows} needed")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.unlink(full)
    return [json.loads(line) for line in lines]


def smelt_ids(row, side):
    """The ids smelt's datasets/ gives a raw-text pair's side with the byte tokenizer:
    [bos] + bytes(prompt) + bytes(response) + [eos] (bos 256, eos 257)."""
    return [256] + list(row["prompt"].encode()) + list(row[side].encode()) + [257]


def job_spec(model_dir, data_path, out_dir, pairs, total_steps, lora):
    return {
        "type": "dpo", "model": model_dir,
        "data": {"train": data_path, "max_seq_len": MAX_SEQ_LEN, "shuffle": False},
        "hyperparameters": {**HYPERPARAMETERS, "max_steps": total_steps, "batch_size": pairs,
                            "beta": dpo_trl.BETA, "loss_type": "sigmoid", "precompute_ref": True},
        "lora": lora,
        "eval": {"every_steps": 0, "accuracy_examples": 0},
        "output_dir": out_dir, "seed": SEED, "backend": "cpu", "log_every_steps": 1,
    }


def run_smelt(trainer, work, model_dir, data_path, pairs, steps, lora, threads, blas_threads):
    """dict(rate, loss, ref_s, threads, tokens, trainable) of smelt-trainer, or (None, error text)."""
    out_dir = os.path.join(work, "smelt-run")
    spec = job_spec(model_dir, data_path, out_dir, pairs, WARMUP_STEPS + steps, lora)
    proc, problem = common.run_trainer(trainer, spec, os.path.join(work, "spec.json"), threads, blas_threads)
    if problem:
        return None, problem
    rates, tokens, loss, cpu_threads, trainable = [], set(), None, "?", None
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)
            if m.get("type") == "start":
                cpu_threads, trainable = common.start_info(m)
            if m.get("type") == "train":
                loss = m["loss"]
                if m["step"] > WARMUP_STEPS:
                    rates.append(m["tokens_per_s"])
                    tokens.add(m["tokens"])  # the step's (log_every_steps 1)
    if len(rates) < steps:
        return None, f"metrics.jsonl has {len(rates)} timed train lines, expected {steps}"
    ref = re.search(r"reference logprobs of \d+ pairs in ([0-9.]+) s", proc.stderr)
    return {"rate": statistics.median(rates), "loss": loss, "ref_s": float(ref.group(1)) if ref else None,
            "threads": cpu_threads, "tokens": tokens, "trainable": trainable}, None


def run_trl(work, model_dir, data_path, pairs, steps, lora, threads, first_row):
    """dict(rate, loss, ref_s, threads, tokens, trainable) of TRL's DPOTrainer."""
    r = dpo_trl.run_trl(model_dir, data_path, pairs, WARMUP_STEPS + steps, HYPERPARAMETERS, MAX_SEQ_LEN,
                        work, lora, threads, SEED)
    chosen, rejected = r["encoded"]
    if chosen != smelt_ids(first_row, "chosen") or rejected != smelt_ids(first_row, "rejected"):
        raise SystemExit(f"dpo_cpu: TRL tokenized the first pair as {chosen} / {rejected}, smelt as "
                         f"{smelt_ids(first_row, 'chosen')} / {smelt_ids(first_row, 'rejected')}")
    seconds, n_tokens = r["seconds"][WARMUP_STEPS:], r["tokens"][WARMUP_STEPS:]
    rate = statistics.median(n / s for n, s in zip(n_tokens, seconds))
    return {"rate": rate, "loss": r["losses"][-1], "ref_s": r["ref_s"], "threads": r["threads"],
            "tokens": set(n_tokens), "trainable": r["trainable"]}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p)
    p.add_argument("--only", choices=[m[0] for m in MODELS], help="run one model's rows")
    p.add_argument("--method", choices=list(METHODS), help="run one method's rows (default: both)")
    p.add_argument("--steps", type=int, default=None, help="timed steps of every row (default: per model)")
    args = p.parse_args()
    common.check_binaries("dpo_cpu", args)
    dpo_trl.quiet()

    common.print_header("dpo_cpu", args, dpo_trl.trl.__version__)
    print(f"each row: sigmoid DPO, beta {dpo_trl.BETA}, reference precomputed (not timed: ref s), lr "
          f"{HYPERPARAMETERS['learning_rate']:g} constant, AdamW, clipping at 1.0, f32; {WARMUP_STEPS} warm-up "
          f"steps, then the median of N timed steps; tok/s counts chosen + rejected tokens (prompt + response, "
          f"bos and eos) of the step's pairs; loss = mean pair loss at the last step")
    print(f"{'model':<10} {'method':<6} {'trainable':>10} {'pairs x len':>11} {'thr s/T':>7} {'steps':>5} "
          f"{'smelt tok/s':>11} {'TRL tok/s':>10} {'smelt/TRL':>9} {'smelt loss':>10} {'TRL loss':>9} "
          f"{'ref s s/T':>11}")
    start = time.perf_counter()
    for name, pairs, steps in MODELS:
        if args.only and name != args.only:
            continue
        steps = args.steps or steps
        with tempfile.TemporaryDirectory(prefix="dpo_cpu-") as work:
            model_dir = os.path.join(work, "model")
            data_path = os.path.join(work, "pairs.jsonl")
            common.make_weights(model_dir, OVERRIDES[name], MAX_SEQ_LEN)
            rows = write_pairs(data_path, pairs * (WARMUP_STEPS + steps))
            seq_len = len(smelt_ids(rows[0], "chosen"))
            for method, lora in METHODS.items():
                if args.method and method != args.method:
                    continue
                trl_run = run_trl(work, model_dir, data_path, pairs, steps, lora, args.threads, rows[0])
                smelt, problem = None, "not run (--trl-only)"
                if not args.trl_only:
                    run_dir = os.path.join(work, method)
                    os.makedirs(run_dir)
                    smelt, problem = run_smelt(args.trainer, run_dir, model_dir, data_path, pairs, steps, lora,
                                               args.threads, args.openblas_threads)
                if smelt and smelt["tokens"] != trl_run["tokens"]:
                    problem = (f"tokens per step differ: smelt {sorted(smelt['tokens'])}, "
                               f"TRL {sorted(trl_run['tokens'])}")
                    smelt = None
                if smelt and smelt["trainable"] != trl_run["trainable"]:
                    problem = f"trainable parameters differ: smelt {smelt['trainable']}, TRL {trl_run['trainable']}"
                    smelt = None
                row = (f"{name:<10} {method:<6} {trl_run['trainable']:>10} {f'{pairs}x2x{seq_len}':>11} "
                       f"{(smelt['threads'] if smelt else '-')!s:>3}/{trl_run['threads']:<3} {steps:>5} ")
                if smelt is None:
                    print(row + f"{'-':>11} {trl_run['rate']:>10.0f} {'-':>9} {'-':>10} {trl_run['loss']:>9.4f} "
                          f"{'-':>5}/{trl_run['ref_s']:<5.2f}  ({problem})")
                else:
                    print(row + f"{smelt['rate']:>11.0f} {trl_run['rate']:>10.0f} "
                          f"{smelt['rate'] / trl_run['rate']:>9.3f} {smelt['loss']:>10.4f} {trl_run['loss']:>9.4f} "
                          f"{fmt(smelt['ref_s'], '5.2f'):>5}/{trl_run['ref_s']:<5.2f}")
                sys.stdout.flush()
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
