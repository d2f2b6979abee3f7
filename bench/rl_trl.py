#!/usr/bin/env python3
"""TRL's GRPOTrainer set up as a smelt GRPO job runs, for bench/rl_cpu.py.

    python3 bench/rl_trl.py --model DIR --prompts prompts.jsonl --iterations 6 --max-new-tokens 6

trains the model directory's weights (a transformers LlamaForCausalLM with safetensors,
f32, SDPA attention) with GRPO on raw-text prompts rows {"prompt", "answer"} the way a
smelt job spec with `"type": "grpo"` and examples/grpo.json's reward does:

  - one iteration = one generation batch = one optimizer step: `PROMPTS` prompts x
    `num_generations` completions (`per_device_train_batch_size` = their product, as TRL
    counts completions, `steps_per_generation` 1, `gradient_accumulation_steps` 1,
    `num_iterations` 1: smelt's `batch_size` prompts, `ppo_epochs` 1, `minibatches` 1);
    the ratio is then taken against the policy itself, with no extra logprob pass, in both;
  - prompts in file order (`shuffle_dataset=False`; smelt `data.shuffle: false`);
  - TRL's own generation (`model.generate`, no vLLM, no paged/continuous batching),
    sampling at temperature 1 (top-p 1, top-k off), `max_completion_length` = smelt's
    `max_new_tokens`, stopping at eos;
  - the reward `exact_three_digits`: 1 when the completion is a three-digit number (with
    whitespace around it at most) equal to the row's answer, else 0 — what examples/grpo.json's
    verifier computes (exact_match with the regex `^\\s*(\\d{3})\\s*$`, group 1; smelt's
    PCRE2 runs with UCP, so `\\d` and `\\s` have their Unicode meaning as in Python's `re`
    on str; two three-digit strings are equal as numbers exactly when equal as text);
  - `loss_type` "dapo" (token mean over the generation batch), ε 0.2, rewards scaled by
    the group's standard deviation, β 0 (no reference model), AdamW (β1 0.9, β2 as given,
    ε 1e-8, no weight decay), constant learning rate, no warm-up, global-norm clipping
    at 1.0; f32 (TRL's defaults bf16 and gradient checkpointing off: smelt trains in f32
    without recompute), `use_cpu`;
  - the same token ids: the byte tokenizer adds no bos by itself (its tokenizer.json has
    no post-processor), so each prompt's text starts with "<|bos|>", giving TRL's
    [bos] + prompt, which is what smelt's datasets/prompts.c builds (`add_bos`, default
    true). `encoded` returns TRL's ids of the first prompt for the driver to check.

Threads: torch's default unless --threads (no thread variables are set here).

What is timed, per optimizer step (`IterationClock`):
  seconds   wall time from the previous step's `on_step_end` (the first: `on_train_begin`)
            to this one's: the whole iteration — the data loader's batch, generation,
            rewards, advantages, the loss's forward, backward, clipping, AdamW, the
            scheduler, TRL's metric bookkeeping.
  generate  time inside `GRPOTrainer._generate`: tokenizing the prompts, `model.generate`
            (left padding, KV cache), cutting each completion after its first eos,
            decoding the completions to text, the length metrics.
  score     time inside `GRPOTrainer._calculate_rewards`: the reward function over the
            batch's completions (and TRL's bookkeeping around it).
The rest of the iteration (seconds - generate - score) is everything else, mostly the
update. `samples` counts the completions `_generate` returned, `completion_tokens` their
tokens (eos included, as smelt's `completions/mean_length`).

bench/rl_cpu.py imports `run_trl`.
"""
import argparse
import json
import math
import re
import sys
import tempfile
import time

import datasets
import torch
import trl

import trl_common
from trl_common import quiet

PROMPTS = 16           # prompts per iteration (smelt: hyperparameters.batch_size)
NUM_GENERATIONS = 8    # completions per prompt (smelt: rl.num_generations)
LOSS_TYPE = "dapo"     # smelt: rl.loss_type (smelt's default; TRL's too)
ANSWER = re.compile(r"^\s*(\d{3})\s*$")


def exact_three_digits(prompts, completions, answer, **kwargs):
    """1.0 when the completion is exactly a three-digit answer equal to the row's."""
    del prompts, kwargs
    out = []
    for text, want in zip(completions, answer):
        m = ANSWER.search(text)
        out.append(1.0 if m and m.group(1) == want.strip() else 0.0)
    return out


class IterationClock(trl_common.StepClock):
    """Per optimizer step: wall time, the time in generation and in scoring, the
    completions and their tokens, and the mean reward."""

    def __init__(self):
        super().__init__()
        self.generate_s, self.score_s = [], []
        self.samples, self.completion_tokens, self.rewards = [], [], []
        self.first_prompts = None  # the first generation batch's prompts, in order
        self._reset()

    def _reset(self):
        self.p_generate = self.p_score = 0.0
        self.p_samples = self.p_tokens = 0
        self.p_rewards = []

    def step_done(self):
        self.generate_s.append(self.p_generate)
        self.score_s.append(self.p_score)
        self.samples.append(self.p_samples)
        self.completion_tokens.append(self.p_tokens)
        self.rewards.append(sum(self.p_rewards) / len(self.p_rewards) if self.p_rewards else float("nan"))
        self._reset()


class ClockedGRPOTrainer(trl.GRPOTrainer):
    """GRPOTrainer that times its generation and its reward calls for an IterationClock."""

    def __init__(self, *args, clock=None, **kwargs):
        self.clock = clock
        super().__init__(*args, **kwargs)

    def _generate(self, prompts):
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        self.clock.p_generate += time.perf_counter() - t0
        completion_ids = out[1]
        self.clock.p_samples += len(completion_ids)
        self.clock.p_tokens += sum(len(ids) for ids in completion_ids)
        if self.clock.first_prompts is None:
            self.clock.first_prompts = list(prompts)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        t0 = time.perf_counter()
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.clock.p_score += time.perf_counter() - t0
        self.clock.p_rewards.extend(float(x) for x in out[:, 0])
        return out


def run_trl(model_dir, prompts_path, iterations, hp, max_new_tokens, work, threads=None, seed=1):
    """Runs `iterations` GRPO iterations (one optimizer step each) on the first
    PROMPTS x iterations rows of prompts_path. Returns a dict: seconds, generate_s,
    score_s, samples, completion_tokens, rewards (per iteration), trainable, threads,
    encoded (TRL's ids of the first prompt) and first_prompts (the first iteration's
    prompt texts, bos included, one per completion)."""
    tokenizer, model = trl_common.load_model(model_dir, threads)
    rows = trl_common.load_rows(prompts_path, PROMPTS * iterations, lambda row: {
        "prompt": tokenizer.bos_token + row["prompt"], "answer": row["answer"]})
    config = trl.GRPOConfig(
        **trl_common.config_kwargs(work, hp, iterations, seed),
        per_device_train_batch_size=PROMPTS * NUM_GENERATIONS,
        steps_per_generation=1, num_generations=NUM_GENERATIONS, num_iterations=1,
        max_completion_length=max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, min_p=None,
        repetition_penalty=1.0, use_vllm=False, use_transformers_continuous_batching=False,
        beta=0.0, loss_type=LOSS_TYPE, epsilon=0.2, scale_rewards="group", mask_truncated_completions=False,
        shuffle_dataset=False, log_completions=False)
    clock = IterationClock()
    trainer = ClockedGRPOTrainer(model=model, reward_funcs=[exact_three_digits], args=config,
                                 train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
                                 callbacks=[clock], clock=clock)
    trainable = trl_common.prepare(trainer)
    encoded = list(trainer._tokenize_prompts([rows[0]["prompt"]])[0][0])
    trainer.train()
    return {"seconds": clock.seconds, "generate_s": clock.generate_s, "score_s": clock.score_s,
            "samples": clock.samples, "completion_tokens": clock.completion_tokens, "rewards": clock.rewards,
            "trainable": trainable, "threads": torch.get_num_threads(), "encoded": encoded,
            "first_prompts": clock.first_prompts}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model directory with safetensors and the byte tokenizer")
    p.add_argument("--prompts", required=True, help="prompts rows (prompt, answer)")
    p.add_argument("--iterations", type=int, default=6, help="iterations (optimizer steps; default 6)")
    p.add_argument("--max-new-tokens", type=int, default=6, help="completion limit (default 6)")
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args()
    quiet()
    hp = trl_common.cli_hyperparameters(args.learning_rate, beta2=0.99)
    with tempfile.TemporaryDirectory(prefix="rl_trl-") as work:
        r = run_trl(args.model, args.prompts, args.iterations, hp, args.max_new_tokens, work, args.threads)
    for i in range(len(r["seconds"])):
        s, n = r["seconds"][i], r["samples"][i]
        print(json.dumps({"iteration": i + 1, "samples": n, "samples_per_s": round(n / s, 1),
                          "seconds": round(s, 4), "generate_s": round(r["generate_s"][i], 4),
                          "score_s": round(r["score_s"][i], 5),
                          "mean_length": round(r["completion_tokens"][i] / max(n, 1), 3),
                          "reward": round(r["rewards"][i], 4)}))
    timed = range(1, len(r["seconds"]))  # the first iteration warms up
    rate = sum(r["samples"][i] for i in timed) / sum(r["seconds"][i] for i in timed) if timed else float("nan")
    print(f"# torch {torch.__version__}, trl {trl.__version__}, {r['threads']} threads; iterations "
          f"2..{len(r['seconds'])}: {rate:.1f} samples/s", file=sys.stderr)
    return 0 if all(math.isfinite(x) for x in r["rewards"]) else 1


if __name__ == "__main__":
    sys.exit(main())
