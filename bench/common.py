"""What the drivers that run smelt-trainer next to a TRL trainer share (bench/dpo_cpu.py,
bench/rl_cpu.py): their common command-line options, the models' random weights, one
smelt-trainer run on a generated job spec, the start line of its metrics.jsonl, and the
header line of the table.

  add_arguments()  --trainer, --threads, --openblas-threads, --trl-only
  check_binaries() stop with a message when a program is missing
  make_weights()   examples/tiny's config with overrides + random weights (transformers)
  run_trainer()    smelt-trainer on a spec, with the thread variables asked for
  start_info()     cpu_threads and trainable_params of a metrics.jsonl start line
  print_header()   the machine, the threads and the library versions
"""
import json
import os
import subprocess
import sys

import torch
import transformers

from sft_cpu import MODELS as SFT_MODELS, cpu_model, write_model_dir

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SEED = 1
# name -> config overrides on top of examples/tiny/config.json (sft_cpu.py's models)
OVERRIDES = {name: overrides for name, overrides, *_ in SFT_MODELS}


def add_arguments(p, rollout=False):
    """The options every driver takes; rollout: smelt-rollout must sit next to the trainer."""
    beside = ", smelt-rollout next to it" if rollout else ""
    p.add_argument("--trainer", default=os.path.join(ROOT, "build-cpu", "smelt-trainer"),
                   help=f"the smelt-trainer binary{beside} (default build-cpu/smelt-trainer)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both (default: each one's own; smelt every core, torch its default)")
    p.add_argument("--openblas-threads", type=int, default=None,
                   help="smelt's OPENBLAS_NUM_THREADS (default: unset; OpenBLAS runs in smelt's OpenMP pool)")
    p.add_argument("--trl-only", action="store_true", help="skip smelt (no trainer binary needed)")


def check_binaries(name, args, rollout=False):
    """Stops with a message unless the trainer (and smelt-rollout beside it) can run;
    nothing to check with --trl-only."""
    if args.trl_only:
        return
    binaries = [args.trainer] + ([os.path.join(os.path.dirname(args.trainer), "smelt-rollout")] if rollout else [])
    for binary in binaries:
        if not os.access(binary, os.X_OK):
            sys.exit(f"{name}: {binary} is missing or not executable; build it with `make CUDA=0` "
                     f"(binaries go to build-cpu/), pass --trainer PATH, or run --trl-only")


def make_weights(model_dir, overrides, context):
    """examples/tiny's config with overrides (context at least `context` positions) and the
    byte tokenizer in model_dir, plus random weights (transformers' init, seed SEED) saved
    as safetensors; returns the parameter count."""
    write_model_dir(model_dir, overrides, context)
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(model_dir))
    model.save_pretrained(model_dir, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def run_trainer(trainer, spec, spec_path, threads, blas_threads):
    """Writes spec to spec_path and runs smelt-trainer on it; no thread variables unless
    asked (smelt's default is every core, its OpenBLAS in the same OpenMP pool). Returns
    (the finished process, None), or (None, a one-line error) when it failed."""
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if blas_threads:
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    proc = subprocess.run([trainer, "--spec", spec_path], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return None, f"smelt-trainer exited {proc.returncode}: {last[0][:120]}"
    return proc, None


def start_info(m):
    """(cpu_threads, trainable_params) of a metrics.jsonl start line."""
    return m.get("compute", {}).get("cpu_threads", "?"), m.get("trainable_params")


def print_header(name, args, trl_version):
    """The first line of a driver's output: the CPU, the threads each side runs and the
    library versions."""
    threads = f"{args.threads} (smelt: OMP_NUM_THREADS; torch: set_num_threads)" if args.threads else \
        "each one's default (no thread variables set; smelt's and torch's counts in the thr column)"
    print(f"{name}: {cpu_model()}; threads {threads}; OPENBLAS_NUM_THREADS {args.openblas_threads or 'unset'}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}")
