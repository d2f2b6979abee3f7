#!/usr/bin/env python3
"""rollout_cpu: generation speed on the CPU, smelt's rollout engine against Hugging Face generate.

    python3 bench/rollout_cpu.py [--build build-cpu] [--threads 2]
    taskset -c 0,1 python3 bench/rollout_cpu.py          # pin both to two cores

Builds nothing: it runs BUILD/bench/rollout_cpu (`make CUDA=0` builds it). For each model
(the example tiny model and the ~22M-parameter Llama of sft_cpu.py, same config
overrides) it makes random weights once (transformers LlamaForCausalLM from a fixed seed,
saved as safetensors into a temporary directory) and a fixed list of random prompts of
16..64 tokens, then for batch 1, 8 and 64:

  smelt  bench/rollout_cpu on that directory and prompts, in a subprocess with
         OMP_NUM_THREADS set (OPENBLAS_NUM_THREADS only with --openblas-threads): --batch requests submitted at
         once, greedy, no stop ids, stepped until idle; one untimed warm-up wave.
  HF     model.generate on the same weights and prompts, left-padded, greedy, exactly
         max_new_tokens new tokens, torch.set_num_threads(threads); one untimed
         warm-up call.

Both generate exactly the same number of tokens from the same prompts, prefill included
in the time. The weights are drawn with initializer_range 0.2 instead of 0.02: with the
default, a random model with tied embeddings repeats its last token forever, which makes
the greedy comparison meaningless (the speed does not depend on it). eos is taken out of
HF's generation config so that min_new_tokens does not ban it: smelt ignores eos without
stop ids, and a banned eos would change HF's greedy picks.

The "agree" column counts the sequences whose greedy tokens are identical in smelt and
HF. A random model can have near-ties that float rounding decides either way, so a
mismatch is reported, not treated as a failure.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch
import transformers

from sft_cpu import MODELS as SFT_MODELS, cpu_model

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TINY_DIR = os.path.join(ROOT, "examples", "tiny")

MIN_PROMPT, MAX_PROMPT = 16, 64
N_PROMPTS = 64
WARMUP_NEW_TOKENS = 8  # what bench/rollout_cpu's warm-up wave generates
INIT_RANGE = 0.2
SEED = 1

# name -> {batch: (max_new_tokens, waves)}; waves run one after another, each submitting
# `batch` requests at once. Chosen for a whole run of about 3 minutes on 2 cores.
RUNS = {
    "tiny": {1: (128, 8), 8: (128, 4), 64: (128, 2)},
    "llama-22m": {1: (64, 4), 8: (64, 2), 64: (64, 1)},
}
OVERRIDES = {name: overrides for name, overrides, *_ in SFT_MODELS}


def make_model(path, overrides, max_new_tokens):
    """Random weights for examples/tiny's config with overrides, saved to path; returns
    the transformers model (eval mode) holding the same weights."""
    os.makedirs(path)
    with open(os.path.join(TINY_DIR, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config.update(overrides)
    config["max_position_embeddings"] = max(config["max_position_embeddings"], MAX_PROMPT + max_new_tokens)
    config["initializer_range"] = INIT_RANGE
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(path))
    model.save_pretrained(path, safe_serialization=True)
    # generate fills unset fields of a passed GenerationConfig from this one: without
    # clearing eos here, min_new_tokens would still ban it (see the module docstring).
    model.generation_config.eos_token_id = None
    return model.eval()


def make_prompts(path, vocab_size):
    gen = torch.Generator().manual_seed(SEED)
    lens = torch.randint(MIN_PROMPT, MAX_PROMPT + 1, (N_PROMPTS,), generator=gen).tolist()
    prompts = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lens]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(prompts, f)
    return prompts


def wave_prompts(prompts, wave, batch):
    """The prompts of one wave, indexed as bench/rollout_cpu does (wrapping around)."""
    return [prompts[(wave * batch + r) % len(prompts)] for r in range(batch)]


def kv_memory_mb(config, batch, max_new_tokens):
    """Room for every sequence of a wave at full length, twice over: no preemption."""
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * 4
    need = batch * (MAX_PROMPT + max_new_tokens + 16) * per_token
    return max(16, 2 * need // (1 << 20) + 1)


def head_dim(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def run_smelt(binary, model_dir, prompts_path, batch, max_new_tokens, waves, kv_mb, threads, blas_threads):
    """bench/rollout_cpu's JSON report, or an error text."""
    argv = [binary, "--model", model_dir, "--prompts", prompts_path, "--batch", str(batch),
            "--waves", str(waves), "--max-new-tokens", str(max_new_tokens), "--kv-memory-mb", str(kv_mb),
            "--print-ids"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if blas_threads:  # only when asked: smelt's OpenBLAS shares the OpenMP pool by default
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return None, f"rollout_cpu exited {proc.returncode}: {last[0][:120]}"
    return json.loads(proc.stdout), None


def hf_generate(model, prompts, max_new_tokens, pad_id):
    """Greedy continuations of prompts, left-padded into one batch: a list of id lists."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    gen_config = transformers.GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                               min_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                               eos_token_id=None)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, generation_config=gen_config)
    new = out[:, width:]
    assert new.shape[1] == max_new_tokens, f"HF generated {new.shape[1]} tokens, not {max_new_tokens}"
    return new.tolist()


def run_hf(model, prompts, batch, max_new_tokens, waves, pad_id):
    """(tokens/s, outputs in wave order) of HF generate; the warm-up call is not timed."""
    hf_generate(model, wave_prompts(prompts, 0, batch), WARMUP_NEW_TOKENS, pad_id)
    outputs, wall = [], 0.0
    for w in range(waves):
        start = time.perf_counter()
        outputs += hf_generate(model, wave_prompts(prompts, w, batch), max_new_tokens, pad_id)
        wall += time.perf_counter() - start
    return batch * waves * max_new_tokens / wall, outputs


def agreement(smelt_outputs, hf_outputs):
    same = sum(a == b for a, b in zip(smelt_outputs, hf_outputs))
    return f"{same}/{len(hf_outputs)}"


def bench_model(name, args, blas_threads):
    overrides = OVERRIDES[name]
    longest = max(new for new, _ in RUNS[name].values())
    with tempfile.TemporaryDirectory(prefix="rollout_cpu-") as work:
        model_dir = os.path.join(work, "model")
        prompts_path = os.path.join(work, "prompts.json")
        model = make_model(model_dir, overrides, longest)
        config = model.config
        prompts = make_prompts(prompts_path, config.vocab_size)
        params = sum(p.numel() for p in model.parameters())
        hf_kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * 4
        for batch, (max_new, waves) in RUNS[name].items():
            if args.batch and batch not in args.batch:
                continue
            kv_mb = kv_memory_mb(config, batch, max_new)
            smelt, problem = run_smelt(args.binary, model_dir, prompts_path, batch, max_new, waves, kv_mb,
                                       args.threads, blas_threads)
            hf_rate, hf_outputs = run_hf(model, prompts, batch, max_new, waves, config.pad_token_id)
            row = f"{name:<10} {params:>10} {batch:>5} {waves:>5} {max_new:>7} "
            if smelt is None:
                print(row + f"{'-':>11} {hf_rate:>9.0f} {'-':>10} {'-':>10} {hf_kv:>8} {'-':>6} {'-':>7} {'-':>6}"
                      f"  ({problem})")
            else:
                rate = smelt["tokens_per_s"]
                print(row + f"{rate:>11.0f} {hf_rate:>9.0f} {rate / hf_rate:>10.3f} "
                      f"{smelt['kv_bytes_per_token']:>10} {hf_kv:>8} {smelt['peak_blocks_used']:>6} "
                      f"{smelt['preemptions']:>7} {agreement(smelt['outputs'], hf_outputs):>6}")
            sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build-cpu"),
                   help="build directory holding bench/rollout_cpu (default build-cpu)")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--openblas-threads", type=int, default=None,
                   help="smelt's OPENBLAS_NUM_THREADS (default: unset; OpenBLAS runs in smelt's OpenMP pool)")
    p.add_argument("--only", choices=list(RUNS), help="run one model's rows")
    p.add_argument("--batch", type=int, action="append", choices=[1, 8, 64],
                   help="run only this batch size (repeatable)")
    args = p.parse_args()
    args.binary = os.path.join(args.build, "bench", "rollout_cpu")
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"rollout_cpu: {args.binary} is missing or not executable; build it with `make CUDA=0` "
                 f"(it goes to build-cpu/bench/) or pass --build DIR")

    blas_threads = args.openblas_threads
    torch.set_num_threads(args.threads)
    print(f"rollout_cpu: {cpu_model()} ({platform.machine()}); threads {args.threads} (smelt: OMP_NUM_THREADS "
          f"{args.threads}, OPENBLAS_NUM_THREADS {blas_threads or 'unset'}; HF: set_num_threads); torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"greedy, no stop, f32; {N_PROMPTS} random prompts of {MIN_PROMPT}..{MAX_PROMPT} tokens; a wave submits "
          f"`batch` requests at once; one untimed warm-up each; tok/s = generated tokens / wall time, prefill included")
    print(f"{'model':<10} {'params':>10} {'batch':>5} {'waves':>5} {'new tok':>7} {'smelt tok/s':>11} "
          f"{'HF tok/s':>9} {'smelt/HF':>10} {'smelt KV/t':>10} {'HF KV/t*':>8} {'peak':>6} {'preempt':>7} {'agree':>6}")
    start = time.perf_counter()
    for name in RUNS:
        if args.only and name != args.only:
            continue
        bench_model(name, args, blas_threads)
    print("* HF KV/t is computed from the config (2 x layers x kv heads x head dim x 4 bytes), not measured")
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
