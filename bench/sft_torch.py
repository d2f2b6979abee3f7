#!/usr/bin/env python3
"""A plain PyTorch loop equivalent to a smelt SFT job, for comparison with smelt-trainer.

    python3 bench/sft_torch.py --spec examples/sft.json [--threads 2] [--max-seconds S]

reads the same job spec (docs/job-spec.md) and trains the same model the same way:
`transformers` LlamaForCausalLM built from the model directory's config.json with
random weights (N(0, 0.02), "model_init": "random" only), the byte tokenizer's ids
(ids 0-255 are the UTF-8 bytes; bos, eos from the directory's tokenizer.json), raw
prompt/completion rows tokenized as [bos] + prompt + completion + [eos] with the loss on
the completion and eos, examples packed into micro-batches of at most batch_tokens
tokens (or batch_size examples), AdamW, warmup + cosine/linear/constant schedule,
global-norm clipping, and at the end the validation loss and greedy exact-match
accuracy. It prints metrics lines shaped like smelt's metrics.jsonl.

What is not the same: the random numbers (initial weights, shuffling) come from torch
and Python, not smelt's generator, so losses match smelt's in behaviour, not digits;
a packed micro-batch here is a right-padded [examples, longest] tensor (causal
attention never looks at the padding to the right, so the result is the same as
smelt's cu_seqlens packing, at the cost of computing the padding). LoRA specs are
refused.

bench/sft_cpu.py imports it for the PyTorch half of its benchmark (time_train_steps).
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import transformers

SPEC_DEFAULTS = {
    "model_init": "pretrained",
    "data": {"validation": None, "validation_fraction": 0.0, "max_seq_len": None,
             "truncation": "error", "loss_on": "completion", "add_bos": True, "shuffle": True},
    "hyperparameters": {"epochs": 1, "max_steps": 0, "batch_size": 8, "batch_tokens": 0,
                        "grad_accum": 1, "learning_rate": 1e-4, "lr_schedule": "cosine",
                        "warmup_steps": 0, "min_lr_ratio": 0.0, "weight_decay": 0.0,
                        "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0,
                        "recompute": False},
    "eval": {"every_steps": 0, "accuracy_examples": 0, "max_new_tokens": 64},
    "lora": None,
    "seed": 0,
    "log_every_steps": 1,
}


def load_spec(path):
    """The job spec with docs/job-spec.md's defaults filled in (sections merged)."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    for key, default in SPEC_DEFAULTS.items():
        if isinstance(default, dict):
            spec[key] = {**default, **spec.get(key, {})}
        else:
            spec.setdefault(key, default)
    if spec["type"] != "sft":
        raise SystemExit(f"{path}: only sft jobs have a PyTorch equivalent here")
    if spec["lora"] is not None:
        raise SystemExit(f"{path}: LoRA jobs have no PyTorch equivalent here")
    if spec["model_init"] != "random":
        raise SystemExit(f"{path}: only \"model_init\": \"random\" is supported here")
    return spec


# ---- tokens ----

def byte_specials(model_dir):
    """(bos, eos) ids of the byte tokenizer in model_dir; refuses any other tokenizer,
    since raw bytes are the only encoding this file implements."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("merges") or len(model.get("vocab", {})) != 256:
        raise SystemExit(f"{model_dir}/tokenizer.json: not the byte tokenizer (smelt-model init --byte-tokenizer)")
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    return added["<|bos|>"], added["<|eos|>"]


def encode_row(row, bos, eos, add_bos, loss_on):
    """(ids, mask, n_prompt) as datasets/datasets.h tokenizes a prompt/completion row:
    mask[i] = 1 when ids[i] is trained."""
    prompt = ([bos] if add_bos else []) + list(row["prompt"].encode("utf-8"))
    completion = list(row["completion"].encode("utf-8")) + [eos]
    ids = prompt + completion
    if loss_on == "all":
        mask = [0] + [1] * (len(ids) - 1)
    else:
        mask = [0] * len(prompt) + [1] * len(completion)
    return ids, mask, len(prompt)


def load_examples(path, bos, eos, data):
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            ids, mask, n_prompt = encode_row(json.loads(line), bos, eos, data["add_bos"], data["loss_on"])
            if len(ids) > data["max_seq_len"]:
                if data["truncation"] == "error":
                    raise SystemExit(f"{path}:{line_no}: {len(ids)} tokens, over max_seq_len {data['max_seq_len']}")
                if data["truncation"] == "drop":
                    continue
                ids, mask = ids[:data["max_seq_len"]], mask[:data["max_seq_len"]]
            examples.append((ids, mask, n_prompt))
    return examples


def pack(order, examples, batch_tokens, batch_size):
    """Micro-batches of example indices in `order`: examples added while the batch stays
    within batch_tokens tokens (batch_tokens > 0), else batch_size examples each."""
    batches, current, tokens = [], [], 0
    for i in order:
        n = len(examples[i][0])
        full = (tokens + n > batch_tokens) if batch_tokens > 0 else (len(current) == batch_size)
        if current and full:
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches


def collate(examples, idxs, pad_id):
    """Right-padded input_ids and labels (-100: not trained) of a micro-batch; labels are
    the inputs themselves, as transformers shifts them. Also the real token count."""
    longest = max(len(examples[i][0]) for i in idxs)
    ids = torch.full((len(idxs), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(idxs), longest), -100, dtype=torch.long)
    n_tokens = 0
    for r, i in enumerate(idxs):
        seq, mask, _ = examples[i]
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, :len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, mask)])
        n_tokens += len(seq)
    return ids, labels, n_tokens


# ---- model and optimisation ----

def build_model(model_dir, seed, max_seq_len=None):
    """A randomly initialised LlamaForCausalLM (transformers' N(0, initializer_range)
    init, 0.02 by default, as smelt's) from model_dir/config.json, in f32."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    if max_seq_len and max_seq_len > config.max_position_embeddings:
        raise SystemExit(f"{model_dir}: max_seq_len {max_seq_len} is over the model's context "
                         f"{config.max_position_embeddings}")
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.train()


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model, hp):
    return torch.optim.AdamW(model.parameters(), lr=hp["learning_rate"], betas=(hp["beta1"], hp["beta2"]),
                             eps=hp["eps"], weight_decay=hp["weight_decay"])


def learning_rate(step, total_steps, hp):
    """The rate of optimizer step `step` (0-based), as trainer/lr_schedule.c computes it
    for its 1-based k = step + 1: linear warmup k / warmup_steps, then the schedule from
    the peak down to min_lr_ratio x peak, reached at the last step."""
    peak, warmup, k = hp["learning_rate"], hp["warmup_steps"], step + 1
    if k <= warmup:
        return peak * k / warmup
    if hp["lr_schedule"] == "constant":
        return peak
    span = total_steps - warmup
    progress = min(1.0, (k - warmup) / span) if span > 0 else 1.0
    floor = hp["min_lr_ratio"]
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if hp["lr_schedule"] == "cosine" else 1 - progress
    return peak * (floor + (1 - floor) * shape)


def summed_loss(model, ids, labels):
    """Sum of token losses over the trained tokens (labels != -100) and their count."""
    logits = model(input_ids=ids).logits
    pred = logits[:, :-1].reshape(-1, logits.shape[-1])
    target = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(pred, target, ignore_index=-100, reduction="sum")
    return loss, int((target != -100).sum())


def train_step(model, optimizer, micro_batches, lr, max_grad_norm):
    """One optimizer step over micro_batches [(ids, labels)]: every trained token weighs
    the same. Returns (mean loss, grad norm before clipping, trained tokens)."""
    total = sum(int((labels[:, 1:] != -100).sum()) for _, labels in micro_batches)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for ids, labels in micro_batches:
        loss, _ = summed_loss(model, ids, labels)
        (loss / total).backward()
        loss_sum += loss.item()
    if max_grad_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
    else:
        grad_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss_sum / total, grad_norm, total


@torch.no_grad()
def validation_loss(model, examples, pad_id, batch_tokens=4096):
    model.eval()
    loss_sum, count = 0.0, 0
    for idxs in pack(range(len(examples)), examples, batch_tokens, 0):
        ids, labels, _ = collate(examples, idxs, pad_id)
        loss, n = summed_loss(model, ids, labels)
        loss_sum, count = loss_sum + loss.item(), count + n
    model.train()
    return loss_sum / max(count, 1)


@torch.no_grad()
def greedy_accuracy(model, examples, eos, max_new_tokens):
    """Share of examples whose greedy continuation of the prompt is exactly the trained
    completion followed by eos. Prompts of equal length run as one batch, without a KV
    cache (the sequences are short)."""
    model.eval()
    by_length = {}
    for ids, _, n_prompt in examples:
        by_length.setdefault(n_prompt, []).append(ids)
    correct = 0
    for n_prompt, seqs in by_length.items():
        x = torch.tensor([s[:n_prompt] for s in seqs])
        done = torch.zeros(len(seqs), dtype=torch.bool)
        for _ in range(max_new_tokens):
            nxt = model(input_ids=x).logits[:, -1].argmax(-1)
            x = torch.cat([x, nxt[:, None]], 1)
            done |= nxt == eos
            if bool(done.all()):
                break
        for row, s in zip(x.tolist(), seqs):
            want = s[n_prompt:]
            correct += row[n_prompt:n_prompt + len(want)] == want
    model.train()
    return correct / max(len(examples), 1)


# ---- a job ----

def metrics_line(obj):
    print(json.dumps(obj, separators=(",", ":")), flush=True)


def run_job(spec, threads, max_seconds=None, eval_accuracy=False):
    torch.set_num_threads(threads)
    data, hp, ev = spec["data"], spec["hyperparameters"], spec["eval"]
    bos, eos = byte_specials(spec.get("tokenizer") or spec["model"])
    config = transformers.AutoConfig.from_pretrained(spec["model"])
    data["max_seq_len"] = data["max_seq_len"] or config.max_position_embeddings
    train = load_examples(data["train"], bos, eos, data)
    if data["validation"]:
        val = load_examples(data["validation"], bos, eos, data)
    elif data["validation_fraction"] > 0:
        order = list(range(len(train)))
        random.Random(spec["seed"]).shuffle(order)
        n_val = max(1, round(data["validation_fraction"] * len(train)))
        val, train = [train[i] for i in order[:n_val]], [train[i] for i in order[n_val:]]
    else:
        val = []
    model = build_model(spec["model"], spec["seed"], data["max_seq_len"])
    optimizer = make_optimizer(model, hp)
    rng = random.Random(spec["seed"])

    def epoch_batches():
        order = list(range(len(train)))
        if data["shuffle"]:
            rng.shuffle(order)
        return pack(order, train, hp["batch_tokens"], hp["batch_size"])

    batches = epoch_batches()
    per_epoch = max(1, len(batches) // hp["grad_accum"])
    total_steps = hp["max_steps"] or per_epoch * hp["epochs"]
    print(f"# torch {torch.__version__}, {threads} threads; {n_params(model)} parameters; {len(train)} train "
          f"and {len(val)} validation examples; {total_steps} steps ({per_epoch} per epoch)", flush=True)
    start, seen, cursor = time.perf_counter(), 0, 0
    for step in range(total_steps):
        t0 = time.perf_counter()
        micro, n_tokens = [], 0
        for _ in range(hp["grad_accum"]):
            if cursor == len(batches):
                batches, cursor = epoch_batches(), 0
            ids, labels, n = collate(train, batches[cursor], pad_id=eos)
            micro.append((ids, labels))
            n_tokens, cursor = n_tokens + n, cursor + 1
        lr = learning_rate(step, total_steps, hp)
        loss, grad_norm, trained = train_step(model, optimizer, micro, lr, hp["max_grad_norm"])
        seen += n_tokens
        now = time.perf_counter()
        if (step + 1) % spec["log_every_steps"] == 0 or step + 1 == total_steps:
            metrics_line({"type": "train", "step": step + 1, "epoch": round((step + 1) / per_epoch, 4),
                          "loss": round(loss, 5), "lr": lr, "grad_norm": round(grad_norm, 4), "tokens": seen,
                          "trained_tokens": trained, "tokens_per_s": round(n_tokens / (now - t0)),
                          "elapsed_s": round(now - start, 2)})
        if val and ev["every_steps"] and (step + 1) % ev["every_steps"] == 0 and step + 1 < total_steps:
            line = {"type": "eval", "step": step + 1, "val_loss": round(validation_loss(model, val, eos), 5)}
            if eval_accuracy:
                line["accuracy"] = greedy_accuracy(model, val[:ev["accuracy_examples"]], eos, ev["max_new_tokens"])
            metrics_line(line)
        if max_seconds and now - start > max_seconds:
            print(f"# stopped by --max-seconds after {step + 1} steps", flush=True)
            break
    final = {"type": "final", "step": step + 1, "train_s": round(time.perf_counter() - start, 2)}
    if val:
        final["val_loss"] = round(validation_loss(model, val, eos), 5)
        if ev["accuracy_examples"]:
            subset = val[:ev["accuracy_examples"]]
            final["accuracy"] = greedy_accuracy(model, subset, eos, ev["max_new_tokens"])
            final["accuracy_examples"] = len(subset)
    metrics_line(final)
    return final


# ---- the benchmark (bench/sft_cpu.py) ----

def time_train_steps(model, ids, labels, hp, steps, warmup):
    """Seconds of each of `steps` full optimizer steps (forward, backward, clipping,
    AdamW) on one fixed micro-batch, after `warmup` untimed ones."""
    optimizer = make_optimizer(model, hp)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        train_step(model, optimizer, [(ids, labels)], hp["learning_rate"], hp["max_grad_norm"])
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="an SFT job spec (docs/job-spec.md)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")),
                   help="torch threads (default $OMP_NUM_THREADS, else 2)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop training after this long")
    p.add_argument("--eval-accuracy", action="store_true",
                   help="also measure the accuracy at every eval (smelt measures it at the end only)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                   help="override a spec field, e.g. --set hyperparameters.learning_rate=0.001")
    args = p.parse_args()
    spec = load_spec(args.spec)
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, field = key.rpartition(".")
        (spec[section] if section else spec)[field] = json.loads(value)
    run_job(spec, args.threads, args.max_seconds, args.eval_accuracy)


if __name__ == "__main__":
    sys.exit(main())
