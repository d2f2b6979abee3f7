#!/usr/bin/env python3
"""TRL's DPOTrainer set up as a smelt DPO job runs, for bench/dpo_cpu.py.

    python3 bench/dpo_trl.py --model DIR --data pairs.jsonl --pairs 64 --steps 12 [--lora]

trains the model directory's weights (a transformers LlamaForCausalLM with safetensors,
f32, SDPA attention) on raw-text preference rows {"prompt", "chosen", "rejected"} the
way a smelt job spec with `"type": "dpo"` does:

  - sigmoid loss, β 0.1 (smelt's defaults), the reference logprobs precomputed once before
    training (`precompute_ref_log_probs=True`; smelt's `precompute_ref: true`) with the
    starting weights (LoRA: the base with the adapter disabled, as smelt does);
  - `per_device_train_batch_size` pairs a step (smelt's `batch_size` counts pairs too;
    both put chosen and rejected of a pair in the same forward), rows in file order
    (`train_sampling_strategy="sequential"`; smelt `shuffle: false`);
  - AdamW (β 0.9/0.999, ε 1e-8, no weight decay), constant learning rate, no warm-up,
    global-norm clipping at 1.0, f32 (TRL's defaults bf16 and gradient checkpointing off:
    smelt trains in f32 without recompute), dropout off (TRL's default; smelt has none);
  - the same token ids: the byte tokenizer adds no bos by itself (its tokenizer.json has
    no post-processor), so the prompt text starts with "<|bos|>", giving TRL's
    [bos] + prompt + response + [eos], which is what smelt's datasets/ builds
    (`add_bos`, default true). `encoded_pairs` returns TRL's ids for the driver to check.

Threads: torch's default unless --threads (no thread variables are set here). Per step,
`StepClock` records the wall time from one `on_step_end` to the next (the whole loop:
collation, forward, backward, clipping, AdamW, TRL's metric bookkeeping), the step's
tokens (the attention mask's sum over chosen and rejected: prompt + response, bos and eos
included, as smelt's `tokens`) and its loss (the mean pair loss of the step's batch, the
number smelt's `loss` is). The precompute is timed apart (`ref_s`).

bench/dpo_cpu.py imports `run_trl`.
"""
import argparse
import json
import math
import statistics
import sys
import tempfile
import time

import datasets
import torch
import trl

import trl_common
from trl_common import quiet

BETA = 0.1


def encoded_pairs(trainer, n):
    """TRL's first n training pairs as (prompt + chosen ids, prompt + rejected ids)."""
    ds = trainer.train_dataset
    return [(ds[i]["prompt_ids"] + ds[i]["chosen_ids"], ds[i]["prompt_ids"] + ds[i]["rejected_ids"])
            for i in range(n)]


class StepClock(trl_common.StepClock):
    """Wall time, tokens and loss of every optimizer step. A step's time runs from the
    previous step's end (the first: from the start of training) to its own end."""

    def __init__(self):
        super().__init__()
        self.tokens, self.losses = [], []
        self.pending_tokens, self.pending_losses = 0, []

    def step_done(self):
        self.tokens.append(self.pending_tokens)
        self.losses.append(sum(self.pending_losses) / max(len(self.pending_losses), 1))
        self.pending_tokens, self.pending_losses = 0, []


class ClockedDPOTrainer(trl.DPOTrainer):
    """DPOTrainer that hands each batch's token count and loss to a StepClock, and times
    the reference precompute."""

    def __init__(self, *args, clock=None, **kwargs):
        self.clock = clock
        self.ref_s = 0.0
        super().__init__(*args, **kwargs)

    def _precompute_ref_logps(self, dataset, name, batch_size):
        t0 = time.perf_counter()
        out = super()._precompute_ref_logps(dataset, name, batch_size)
        self.ref_s += time.perf_counter() - t0
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.clock is not None and model.training:
            loss = result[0] if return_outputs else result
            self.clock.pending_tokens += int(inputs["attention_mask"].sum())
            self.clock.pending_losses.append(float(loss.detach()))
        return result


def lora_config(lora):
    import peft  # only LoRA rows need it
    return peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                           target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM")


def run_trl(model_dir, data_path, pairs, steps, hp, max_seq_len, work, lora=None, threads=None, seed=1):
    """Trains steps optimizer steps of `pairs` pairs on the first pairs x steps rows of
    data_path. Returns a dict: seconds, tokens, losses (per step), ref_s (the precompute),
    params (trainable, total), threads and encoded (TRL's ids of the first pair)."""
    tokenizer, model = trl_common.load_model(model_dir, threads)
    rows = trl_common.load_rows(data_path, pairs * steps, lambda row: {
        "prompt": tokenizer.bos_token + row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"]})
    config = trl.DPOConfig(
        **trl_common.config_kwargs(work, hp, steps, seed), per_device_train_batch_size=pairs,
        beta=BETA, loss_type=["sigmoid"], precompute_ref_log_probs=True, max_length=max_seq_len,
        train_sampling_strategy="sequential")
    clock = StepClock()
    trainer = ClockedDPOTrainer(model=model, args=config, processing_class=tokenizer,
                                train_dataset=datasets.Dataset.from_list(rows),
                                peft_config=lora_config(lora) if lora else None,
                                callbacks=[clock], clock=clock)
    trainable = trl_common.prepare(trainer)
    total = sum(p.numel() for p in trainer.model.parameters())
    encoded = encoded_pairs(trainer, 1)[0]
    trainer.train()
    return {"seconds": clock.seconds, "tokens": clock.tokens, "losses": clock.losses, "ref_s": trainer.ref_s,
            "trainable": trainable, "params": total, "threads": torch.get_num_threads(), "encoded": encoded}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model directory with safetensors and the byte tokenizer")
    p.add_argument("--data", required=True, help="preference rows (prompt, chosen, rejected)")
    p.add_argument("--pairs", type=int, default=64, help="pairs per step (default 64)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--lora", action="store_true", help="LoRA rank 8, alpha 16 on q_proj and v_proj")
    args = p.parse_args()
    quiet()
    hp = trl_common.cli_hyperparameters(args.learning_rate, beta2=0.999)
    lora = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]} if args.lora else None
    with tempfile.TemporaryDirectory(prefix="dpo_trl-") as work:
        r = run_trl(args.model, args.data, args.pairs, args.steps, hp, args.max_seq_len, work, lora, args.threads)
    for i, (s, n, loss) in enumerate(zip(r["seconds"], r["tokens"], r["losses"]), 1):
        print(json.dumps({"step": i, "loss": round(loss, 6), "tokens": n, "tokens_per_s": round(n / s)}))
    timed = list(zip(r["tokens"], r["seconds"]))[1:]  # the first step warms up
    rate = statistics.median(n / s for n, s in timed) if timed else float("nan")
    print(f"# torch {torch.__version__}, trl {trl.__version__}, {r['threads']} threads; reference logprobs "
          f"{r['ref_s']:.2f} s; median of steps 2..{len(r['seconds'])}: {rate:.0f} tokens/s", file=sys.stderr)
    return 0 if all(math.isfinite(x) for x in r["losses"]) else 1


if __name__ == "__main__":
    sys.exit(main())
