#!/usr/bin/env python3
"""rl_cpu: one GRPO iteration on the CPU, smelt-trainer against TRL's GRPOTrainer.

    python3 bench/rl_cpu.py [--trainer build-cpu/smelt-trainer]
    taskset -c 0,1 python3 bench/rl_cpu.py          # pin both to two cores
    python3 bench/rl_cpu.py --trl-only              # the TRL half alone

For each model — the example tiny model (the GRPO example's own starting model,
runs/sft-mixed/output, when it exists; else, or with --tiny-random, examples/tiny's config
with random weights) and sft_cpu.py's ~22M-parameter Llama (random weights); random
weights are drawn once by transformers and saved as safetensors, so both start from the
same weights — on the GRPO example's task (examples/data/addition_prompts_train.jsonl,
the first 16 x (warm-up + iterations) rows in file order, raw prompt text with bos;
examples/grpo.json's reward, an exact match of a three-digit answer):

  smelt  smelt-trainer runs a generated GRPO job spec (16 prompts x 8 samples per
         iteration, temperature 1, `max_new_tokens` 6 (tiny) / 16 (22m), loss_type dapo,
         beta 0, one optimizer step per iteration, constant learning rate, no
         validation), once per placement: colocated (the engine in the trainer's
         process) and split (one smelt-rollout worker fed the new weights after every
         iteration); no thread variables set unless --threads. Per iteration: the
         difference of consecutive `elapsed_s` of its metrics.jsonl train lines (the
         whole iteration, as smelt-trainer times its step) and the train line's
         time/generate_s, score_s, reference_s, update_s, sync_s.
  TRL    bench/rl_trl.py: GRPOTrainer on the same weights, prompts, reward, group size,
         completion length, loss type, optimizer and schedule, TRL's own generation
         (transformers `generate`, no vLLM), f32, `use_cpu`, in this process, torch's
         default threads unless --threads. Per iteration: the wall time between
         consecutive step ends, and the time inside its `_generate` and
         `_calculate_rewards` (rl_trl.py's docstring says exactly what they hold).

One iteration (not timed) warms up; samples/s is every completion generated in the timed
iterations over their summed wall time; the split columns are means per timed iteration,
in milliseconds. Both sides count the same things: an iteration is one generation batch
(16 prompts x 8 completions) and one optimizer step on it, and the driver checks that
each iteration generated 128 completions on both sides, that both took the same prompts
in the same order, and that TRL tokenized the first prompt to the ids smelt's
datasets/prompts.c gives it ([bos] + the prompt's bytes).

Needs torch, transformers, datasets, trl. Without the trainer binary (and smelt-rollout
next to it) it stops with a message unless --trl-only is given.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common
import rl_trl
from common import OVERRIDES, ROOT, SEED

PROMPTS_FILE = os.path.join(ROOT, "examples", "data", "addition_prompts_train.jsonl")
GRPO_EXAMPLE = os.path.join(ROOT, "examples", "grpo.json")
SFT_MIXED_OUTPUT = os.path.join(ROOT, "runs", "sft-mixed", "output")

# name -> (max new tokens, timed iterations)
MODELS = [("tiny", 6, 10), ("llama-22m", 16, 4)]
PLACEMENTS = ["colocated", "split"]
WARMUP_ITERATIONS = 1
# examples/grpo.json's learning rate and beta2; the rest spelled out so that TRL gets the same.
HYPERPARAMETERS = {"learning_rate": 5e-5, "lr_schedule": "constant", "warmup_steps": 0,
                   "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "max_grad_norm": 1.0}
SMELT_SPLIT = ["generate", "score", "reference", "update", "sync"]


def example_reward():
    """examples/grpo.json's reward spec: the verifier rl_trl.exact_three_digits mirrors."""
    with open(GRPO_EXAMPLE, encoding="utf-8") as f:
        return json.load(f)["rl"]["reward"]


def write_prompts(path, n_rows):
    """The first n_rows prompts rows of the example's training file, as they are."""
    with open(PROMPTS_FILE, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][:n_rows]
    if len(lines) < n_rows:
        raise SystemExit(f"rl_cpu: {PROMPTS_FILE} has {len(lines)} rows, {n_rows} needed")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return [json.loads(line) for line in lines]


def smelt_ids(prompt):
    """The ids smelt's datasets/prompts.c gives a raw-text prompt with the byte tokenizer:
    [bos] + bytes(prompt) (bos 256)."""
    return [256] + list(prompt.encode())


def job_spec(model_dir, prompts_path, out_dir, max_new_tokens, iterations, placement):
    return {
        "type": "grpo", "model": model_dir,
        "data": {"train": prompts_path, "shuffle": False},
        "hyperparameters": {**HYPERPARAMETERS, "batch_size": rl_trl.PROMPTS},
        "rl": {"num_generations": rl_trl.NUM_GENERATIONS, "max_new_tokens": max_new_tokens,
               "max_iterations": iterations, "temperature": 1.0, "loss_type": rl_trl.LOSS_TYPE, "beta": 0.0,
               "ppo_epochs": 1, "minibatches": 1, "placement": placement, "rollout_workers": 1,
               "reward": example_reward()},
        "eval": {"every_steps": 0, "accuracy_examples": 0},
        "output_dir": out_dir, "seed": SEED, "backend": "cpu", "log_every_steps": 1,
    }


def read_smelt_metrics(path, iterations):
    """(per-iteration dicts, cpu_threads, trainable, first sampled prompt text) from
    smelt-trainer's metrics.jsonl."""
    its, threads, trainable, first_prompt, last_elapsed = [], "?", None, None, 0.0
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)
            if m.get("type") == "start":
                threads, trainable = common.start_info(m)
            elif m.get("type") == "samples" and m["step"] == 1 and m["samples"]:
                first_prompt = m["samples"][0]["prompt"]
            elif m.get("type") == "train":
                its.append({"seconds": m["elapsed_s"] - last_elapsed, "samples": m["samples"],
                            "failed": m["samples_failed"], "length": m["completions/mean_length"],
                            "reward": m["reward"], **{k: m[f"time/{k}_s"] for k in SMELT_SPLIT}})
                last_elapsed = m["elapsed_s"]
    if len(its) != iterations:
        raise ValueError(f"metrics.jsonl has {len(its)} train lines, expected {iterations}")
    return its, threads, trainable, first_prompt


def run_smelt(trainer, work, model_dir, prompts_path, max_new_tokens, iterations, placement, threads,
              blas_threads):
    """dict(rate, split, length, reward, samples, threads, trainable, first_prompt) of
    smelt-trainer over the timed iterations, or (None, error text)."""
    out_dir = os.path.join(work, f"smelt-{placement}")
    total = WARMUP_ITERATIONS + iterations
    spec = job_spec(model_dir, prompts_path, out_dir, max_new_tokens, total, placement)
    _, problem = common.run_trainer(trainer, spec, os.path.join(work, f"spec-{placement}.json"), threads,
                                    blas_threads)
    if problem:
        return None, problem
    try:
        its, cpu_threads, trainable, first_prompt = read_smelt_metrics(os.path.join(out_dir, "metrics.jsonl"), total)
    except (OSError, ValueError, KeyError) as e:
        return None, f"metrics.jsonl: {e}"
    timed = its[WARMUP_ITERATIONS:]
    failed = sum(it["failed"] for it in timed)
    if failed:
        return None, f"{failed} samples failed their reward"
    seconds = sum(it["seconds"] for it in timed)
    return {"rate": sum(it["samples"] for it in timed) / seconds,
            "split": [statistics.fmean(it[k] for it in timed) for k in SMELT_SPLIT],
            "length": statistics.fmean(it["length"] for it in timed),
            "reward": statistics.fmean(it["reward"] for it in timed),
            "samples": {it["samples"] for it in its}, "threads": cpu_threads, "trainable": trainable,
            "first_prompt": first_prompt}, None


def run_trl(work, model_dir, prompts_path, max_new_tokens, iterations, threads, rows):
    """dict(rate, split, length, reward, samples, threads, trainable) of TRL's GRPOTrainer
    over the timed iterations; stops the run when TRL's prompts are not smelt's."""
    r = rl_trl.run_trl(model_dir, prompts_path, WARMUP_ITERATIONS + iterations, HYPERPARAMETERS, max_new_tokens,
                       work, threads, SEED)
    if r["encoded"] != smelt_ids(rows[0]["prompt"]):
        raise SystemExit(f"rl_cpu: TRL tokenized the first prompt as {r['encoded']}, smelt as "
                         f"{smelt_ids(rows[0]['prompt'])}")
    want = [f"<|bos|>{row['prompt']}" for row in rows[:rl_trl.PROMPTS] for _ in range(rl_trl.NUM_GENERATIONS)]
    if r["first_prompts"] != want:
        raise SystemExit(f"rl_cpu: TRL's first iteration did not take the first {rl_trl.PROMPTS} prompts in file "
                         f"order, {rl_trl.NUM_GENERATIONS} times each: {r['first_prompts'][:10]}...")
    t = range(WARMUP_ITERATIONS, len(r["seconds"]))
    seconds = sum(r["seconds"][i] for i in t)
    gen = statistics.fmean(r["generate_s"][i] for i in t)
    score = statistics.fmean(r["score_s"][i] for i in t)
    rest = statistics.fmean(r["seconds"][i] - r["generate_s"][i] - r["score_s"][i] for i in t)
    return {"rate": sum(r["samples"][i] for i in t) / seconds, "split": [gen, score, rest],
            "length": sum(r["completion_tokens"][i] for i in t) / sum(r["samples"][i] for i in t),
            "reward": statistics.fmean(r["rewards"][i] for i in t), "samples": set(r["samples"]),
            "threads": r["threads"], "trainable": r["trainable"]}


def ms(values):
    return "/".join(f"{1e3 * v:.0f}" if v >= 0.0095 else f"{1e3 * v:.1f}" if v >= 0.00005 else "0"
                    for v in values)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_arguments(p, rollout=True)
    p.add_argument("--only", choices=[m[0] for m in MODELS], help="run one model's rows")
    p.add_argument("--placement", choices=PLACEMENTS, help="run one placement's rows (default: both)")
    p.add_argument("--iterations", type=int, default=None, help="timed iterations of every row (default: per model)")
    p.add_argument("--tiny-random", action="store_true",
                   help="tiny from random weights even when runs/sft-mixed/output exists")
    args = p.parse_args()
    common.check_binaries("rl_cpu", args, rollout=True)
    rl_trl.quiet()
    tiny_trained = os.path.isfile(os.path.join(SFT_MIXED_OUTPUT, "model.safetensors")) and not args.tiny_random

    common.print_header("rl_cpu", args, rl_trl.trl.__version__)
    print(f"each row: GRPO, {rl_trl.PROMPTS} prompts x {rl_trl.NUM_GENERATIONS} samples per iteration, temperature 1, "
          f"loss {rl_trl.LOSS_TYPE}, beta 0, one AdamW step per iteration, lr {HYPERPARAMETERS['learning_rate']:g} "
          f"constant, f32; reward: exact match of a three-digit answer; {WARMUP_ITERATIONS} warm-up iteration, then N "
          f"timed; samples/s = completions / wall time of the timed iterations; split = ms per iteration")
    print(f"tiny: {'runs/sft-mixed/output (the GRPO example starting model)' if tiny_trained else 'random weights'}; "
          f"llama-22m: random weights; smelt ms = generate/score/reference/update/sync; TRL ms = "
          f"generate/score/rest")
    print(f"{'model':<10} {'placement':<9} {'params':>9} {'new':>3} {'thr s/T':>7} {'iters':>5} "
          f"{'smelt smp/s':>11} {'TRL smp/s':>9} {'smelt/TRL':>9} {'smelt ms':>22} {'TRL ms':>15} "
          f"{'len s/T':>11} {'reward s/T':>11}")
    start = time.perf_counter()
    for name, max_new, iterations in MODELS:
        if args.only and name != args.only:
            continue
        iterations = args.iterations or iterations
        with tempfile.TemporaryDirectory(prefix="rl_cpu-") as work:
            prompts_path = os.path.join(work, "prompts.jsonl")
            rows = write_prompts(prompts_path, rl_trl.PROMPTS * (WARMUP_ITERATIONS + iterations))
            if name == "tiny" and tiny_trained:
                model_dir = SFT_MIXED_OUTPUT
            else:
                model_dir = os.path.join(work, "model")
                context = 1 + max(len(r["prompt"].encode()) for r in rows) + max_new
                common.make_weights(model_dir, OVERRIDES[name], context)
            trl_run = run_trl(work, model_dir, prompts_path, max_new, iterations, args.threads, rows)
            want = {rl_trl.PROMPTS * rl_trl.NUM_GENERATIONS}
            if trl_run["samples"] != want:
                raise SystemExit(f"rl_cpu: TRL generated {sorted(trl_run['samples'])} completions per iteration, "
                                 f"expected {sorted(want)}")
            for placement in PLACEMENTS:
                if args.placement and placement != args.placement:
                    continue
                smelt, problem = None, "not run (--trl-only)"
                if not args.trl_only:
                    smelt, problem = run_smelt(args.trainer, work, model_dir, prompts_path, max_new, iterations,
                                               placement, args.threads, args.openblas_threads)
                if smelt and smelt["samples"] != want:
                    problem = (f"smelt generated {sorted(smelt['samples'])} samples per iteration, "
                               f"expected {sorted(want)}")
                    smelt = None
                if smelt and smelt["first_prompt"] != f"<|bos|>{rows[0]['prompt']}":
                    problem = (f"smelt's first sample's prompt is {smelt['first_prompt']!r}, expected "
                               f"'<|bos|>{rows[0]['prompt']}'")
                    smelt = None
                if smelt and smelt["trainable"] != trl_run["trainable"]:
                    problem = f"trainable parameters differ: smelt {smelt['trainable']}, TRL {trl_run['trainable']}"
                    smelt = None
                row = (f"{name:<10} {placement:<9} {trl_run['trainable']:>9} {max_new:>3} "
                       f"{(smelt['threads'] if smelt else '-')!s:>3}/{trl_run['threads']:<3} {iterations:>5} ")
                trl_cols = f"{ms(trl_run['split']):>15}"
                if smelt is None:
                    print(row + f"{'-':>11} {trl_run['rate']:>9.1f} {'-':>9} {'-':>22} {trl_cols} "
                          f"{'-':>5}/{trl_run['length']:<5.2f} {'-':>5}/{trl_run['reward']:<5.3f}  ({problem})")
                else:
                    print(row + f"{smelt['rate']:>11.1f} {trl_run['rate']:>9.1f} "
                          f"{smelt['rate'] / trl_run['rate']:>9.2f} "
                          f"{ms(smelt['split']):>22} {trl_cols} {smelt['length']:>5.2f}/{trl_run['length']:<5.2f} "
                          f"{smelt['reward']:>5.3f}/{trl_run['reward']:<5.3f}")
                sys.stdout.flush()
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
