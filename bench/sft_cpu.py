#!/usr/bin/env python3
"""sft_cpu: SFT training speed on the CPU, smelt-trainer against the same PyTorch loop.

    python3 bench/sft_cpu.py [--trainer build-cpu/smelt-trainer] [--threads 2]
    taskset -c 0,1 python3 bench/sft_cpu.py          # pin both to two cores

For each model (the example tiny model, and a ~22M-parameter Llama with a 32000-token
vocabulary) and one fixed batch shape, every token trained (no padding, no prompt):

  smelt  smelt-trainer runs a generated job spec (random init, max_steps = warmup +
         steps, no validation, constant learning rate) with OMP_NUM_THREADS set (its
         one thread pool; OPENBLAS_NUM_THREADS only with --openblas-threads); the number is the median tokens_per_s of the
         metrics.jsonl lines after the warm-up steps.
  torch  bench/sft_torch.py's train_step (forward, backward, clipping, AdamW) on the
         same model config, batch, sequence length and thread count, in this process;
         the number is batch tokens / the median step time after the same warm-up.

Needs torch and transformers. Without the trainer binary it stops with a message
unless --torch-only is given.
"""
import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import sft_torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TINY_DIR = os.path.join(ROOT, "examples", "tiny")

# name -> (config overrides on top of examples/tiny/config.json, sequences, seq_len, steps)
MODELS = [
    ("tiny", {}, 8, 256, 20),
    ("llama-22m", {"vocab_size": 32000, "hidden_size": 384, "intermediate_size": 1024,
                   "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
                   "head_dim": 64}, 8, 256, 6),
]
WARMUP_STEPS = 2
HYPERPARAMETERS = {"learning_rate": 1e-4, "lr_schedule": "constant", "warmup_steps": 0,
                   "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0}


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write_model_dir(path, overrides, seq_len):
    """A model directory holding config.json (examples/tiny's with overrides, context at
    least seq_len) and the byte tokenizer files: all a "model_init": "random" job reads."""
    os.makedirs(path)
    with open(os.path.join(TINY_DIR, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config.update(overrides)
    config["max_position_embeddings"] = max(config["max_position_embeddings"], seq_len)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TINY_DIR, name), path)


def write_rows(path, n_rows, seq_len, seed):
    """n_rows prompt/completion rows of random letters that tokenize (bos + bytes + eos)
    to exactly seq_len tokens."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"
    half = (seq_len - 2) // 2
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_rows):
            text = "".join(rng.choice(letters) for _ in range(seq_len - 2))
            f.write(json.dumps({"prompt": text[:half], "completion": text[half:]}) + "\n")


def job_spec(model_dir, data_path, out_dir, n_seqs, seq_len, total_steps):
    return {
        "type": "sft", "model": model_dir, "model_init": "random",
        "data": {"train": data_path, "max_seq_len": seq_len, "loss_on": "all", "shuffle": False},
        "hyperparameters": {**HYPERPARAMETERS, "max_steps": total_steps, "batch_size": n_seqs},
        "eval": {"every_steps": 0, "accuracy_examples": 0},
        "output_dir": out_dir, "seed": 1, "backend": "cpu", "log_every_steps": 1,
    }


def smelt_tokens_per_s(trainer, work, model_dir, data_path, n_seqs, seq_len, steps, threads, blas_threads):
    """Median tokens_per_s of smelt-trainer's steps after the warm-up, or an error text."""
    out_dir = os.path.join(work, "smelt-run")
    spec_path = os.path.join(work, "spec.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(job_spec(model_dir, data_path, out_dir, n_seqs, seq_len, WARMUP_STEPS + steps), f, indent=2)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if blas_threads:  # only when asked: smelt's OpenBLAS shares the OpenMP pool by default
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    proc = subprocess.run([trainer, "--spec", spec_path], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return None, f"smelt-trainer exited {proc.returncode}: {last[0][:120]}"
    rates = []
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)
            if m.get("type") == "train" and m["step"] > WARMUP_STEPS:
                rates.append(m["tokens_per_s"])
    if len(rates) < steps:
        return None, f"metrics.jsonl has {len(rates)} timed train lines, expected {steps}"
    return statistics.median(rates), None


def torch_tokens_per_s(model_dir, data_path, n_seqs, seq_len, steps):
    """(median tokens/s, parameters) of the PyTorch loop on the same first batch."""
    bos, eos = sft_torch.byte_specials(model_dir)
    data = {"add_bos": True, "loss_on": "all", "max_seq_len": seq_len, "truncation": "error"}
    examples = sft_torch.load_examples(data_path, bos, eos, data)[:n_seqs]
    ids, labels, n_tokens = sft_torch.collate(examples, range(n_seqs), pad_id=eos)
    assert n_tokens == n_seqs * seq_len, "the rows must fill the batch exactly"
    model = sft_torch.build_model(model_dir, seed=1)
    times = sft_torch.time_train_steps(model, ids, labels, HYPERPARAMETERS, steps, WARMUP_STEPS)
    return n_tokens / statistics.median(times), sft_torch.n_params(model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainer", default=os.path.join(ROOT, "build-cpu", "smelt-trainer"),
                   help="the smelt-trainer binary (default build-cpu/smelt-trainer)")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--openblas-threads", type=int, default=None,
                   help="smelt's OPENBLAS_NUM_THREADS (default: unset; OpenBLAS runs in smelt's OpenMP pool)")
    p.add_argument("--only", choices=[m[0] for m in MODELS], help="run one model's row")
    p.add_argument("--torch-only", action="store_true", help="skip smelt (no trainer binary needed)")
    args = p.parse_args()
    if not args.torch_only and not os.access(args.trainer, os.X_OK):
        sys.exit(f"sft_cpu: {args.trainer} is missing or not executable; build it with `make CUDA=0` "
                 f"(binaries go to build-cpu/), pass --trainer PATH, or run --torch-only")

    blas_threads = args.openblas_threads
    torch.set_num_threads(args.threads)
    print(f"sft_cpu: {cpu_model()}; threads {args.threads} (smelt: OMP_NUM_THREADS {args.threads}, "
          f"OPENBLAS_NUM_THREADS {blas_threads or 'unset'}; torch: set_num_threads); torch {torch.__version__}")
    print(f"each row: {WARMUP_STEPS} warm-up steps, then the median of N timed steps; AdamW, "
          f"constant lr, clipping at 1.0, f32, every token trained")
    print(f"{'model':<10} {'params':>10} {'batch x seq':>12} {'thr':>4} {'steps':>6} "
          f"{'smelt tok/s':>12} {'torch tok/s':>12} {'smelt/torch':>12}")
    start = time.perf_counter()
    for name, overrides, n_seqs, seq_len, steps in MODELS:
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="sft_cpu-") as work:
            model_dir = os.path.join(work, "model")
            data_path = os.path.join(work, "rows.jsonl")
            write_model_dir(model_dir, overrides, seq_len)
            write_rows(data_path, n_seqs * (WARMUP_STEPS + steps), seq_len, seed=1)
            torch_rate, params = torch_tokens_per_s(model_dir, data_path, n_seqs, seq_len, steps)
            smelt_rate, problem = None, "not run (--torch-only)"
            if not args.torch_only:
                smelt_rate, problem = smelt_tokens_per_s(args.trainer, work, model_dir, data_path, n_seqs,
                                                         seq_len, steps, args.threads, blas_threads)
        shape = f"{n_seqs}x{seq_len}"
        row = f"{name:<10} {params:>10} {shape:>12} {args.threads:>4} {steps:>6} "
        if smelt_rate is None:
            print(row + f"{'-':>12} {torch_rate:>12.0f} {'-':>12}  ({problem})")
        else:
            print(row + f"{smelt_rate:>12.0f} {torch_rate:>12.0f} {smelt_rate / torch_rate:>12.3f}")
        sys.stdout.flush()
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
