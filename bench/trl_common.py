"""What bench/dpo_trl.py and bench/rl_trl.py share: TRL's trainers set up the way a smelt
job runs (f32, CPU, the optimizer and schedule of the job's hyperparameters), and the
clock of their optimizer steps.

  quiet()          no progress bars or deprecation notes (the drivers print tables)
  load_model()     the model directory as transformers loads it (f32, SDPA), torch's threads
  load_rows()      the first rows of a JSONL file, each through a function
  config_kwargs()  the TrainingArguments both trainers take alike
  StepClock        wall time of every optimizer step, from the previous step's end
  prepare()        a built trainer made quiet, and its trainable parameter count
  cli_hyperparameters()  the hyperparameter dict of the scripts' own command lines
"""
import json
import os
import time
import warnings

import datasets
import torch
import transformers


def quiet():
    """No progress bars or deprecation notes from datasets / transformers / TRL: the
    driver prints a table."""
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ["TQDM_DISABLE"] = "1"


def load_model(model_dir, threads=None):
    """(tokenizer, model) of a model directory with safetensors: f32, SDPA attention.
    threads: torch.set_num_threads (None: torch's default; no thread variables are set)."""
    if threads:
        torch.set_num_threads(threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    return tokenizer, model


def load_rows(path, limit, row_of):
    """row_of(row) of the first `limit` rows of a JSONL file (blank lines skipped); stops
    the run when the file has fewer."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rows.append(row_of(json.loads(line)))
            if len(rows) == limit:
                break
    if len(rows) < limit:
        raise SystemExit(f"{path}: {len(rows)} rows, {limit} needed")
    return rows


def config_kwargs(work, hp, steps, seed):
    """The TrainingArguments of both trainers: `steps` optimizer steps on the CPU in f32
    (TRL's bf16 and gradient-checkpointing defaults off: smelt trains in f32 without
    recompute), AdamW with hp's betas, ε, weight decay and clipping, a constant learning
    rate without warm-up, one batch per step, nothing saved, logged or evaluated."""
    return dict(
        output_dir=os.path.join(work, "trl-run"), report_to="none", save_strategy="no", eval_strategy="no",
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=seed, data_seed=seed,
        gradient_accumulation_steps=1, max_steps=steps,
        learning_rate=hp["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=hp["weight_decay"], adam_beta1=hp["beta1"], adam_beta2=hp["beta2"],
        adam_epsilon=hp["eps"], max_grad_norm=hp["max_grad_norm"], optim="adamw_torch",
        dataloader_num_workers=0, logging_strategy="no", disable_tqdm=True)


class StepClock(transformers.TrainerCallback):
    """Wall time of every optimizer step: from the previous step's end (the first: from
    the start of training) to its own end. Subclasses gather what else a step holds and
    file it in step_done()."""

    def __init__(self):
        self.last = None
        self.seconds = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds.append(now - self.last)
        self.last = now
        self.step_done()

    def step_done(self):
        pass


def prepare(trainer):
    """Removes the trainer's PrinterCallback (its end-of-training line would break the
    driver's table); returns the trainable parameter count."""
    trainer.remove_callback(transformers.PrinterCallback)
    return sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)


def cli_hyperparameters(learning_rate, beta2):
    """The hyperparameters of a script's own command line: AdamW (β1 0.9, ε 1e-8), no
    weight decay, clipping at 1.0."""
    return {"learning_rate": learning_rate, "weight_decay": 0.0, "beta1": 0.9, "beta2": beta2, "eps": 1e-8,
            "max_grad_norm": 1.0}
