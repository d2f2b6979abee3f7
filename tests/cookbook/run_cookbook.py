"""tinker-cookbook's own training loops against a real smeltd (`make test-cookbook`).

The pinned cookbook (tests/cookbook/requirements*.txt) runs unchanged through the official
SDK on loopback, offline, with the tiny byte-level base model tests/data/tinker/addition-base
(passed by its smelt name; the cookbook's tokenizer lookup for that name is registered to
load the model's own directory):

1. its supervised loop (tinker_cookbook.supervised.train) on conversations read from a local
   JSONL file by its FromConversationFileBuilder, rendered by its "role_colon" renderer;
2. its RL loop (tinker_cookbook.rl.train) on a custom Env / EnvGroupBuilder / RLDataset:
   two-digit addition in the base model's own prompt form ("12+34="), reward 1 for the exact
   three-digit sum.

It prints the cookbook's metrics (read back from each run's metrics.jsonl): the supervised
losses, the RL reward per iteration and the sampler-trainer mismatch optim/kl_sample_train_v1,
and exits non-zero when a loop fails, does not learn, or the mismatch is not exactly 0 on the
CPU (where sampler and trainer share kernels). --report FILE writes the numbers there too.
Binaries come from $SMELT_BUILD (default build-cpu)."""
import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version

# offline: no hub lookups, no telemetry; set before the libraries read them
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TINKER_TELEMETRY"] = "0"

import chz  # noqa: E402
import tinker  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402
from tinker_cookbook.rl import train as rl_train  # noqa: E402
from tinker_cookbook.rl.types import (  # noqa: E402
    Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult)
from tinker_cookbook.supervised import train as sl_train  # noqa: E402
from tinker_cookbook.supervised.data import FromConversationFileBuilder  # noqa: E402
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smeltd_harness import ADMIN_KEY, ROOT, Smeltd, make_models_dir, processes  # noqa: E402

BASE = "addition-base"
BASE_DIR = os.path.join(ROOT, "tests", "data", "tinker", BASE)
BOS, EOS = 256, 257


def rows(name):
    with open(os.path.join(ROOT, "examples", "data", name)) as f:
        return [json.loads(line) for line in f]


def load_base_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(BASE_DIR)


# ---- the RL task: the cookbook's Env / EnvGroupBuilder / RLDataset interfaces ----

class AdditionEnv(Env):
    """One two-digit sum in the base model's prompt form; reward 1 for the exact three digits."""

    def __init__(self, prompt, completion):
        self.prompt = prompt
        self.completion = completion

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([BOS] + list(self.prompt.encode())), [EOS]

    async def step(self, action, *, extra=None):
        text = bytes(t for t in action if t < 256).decode("utf-8", "replace")
        reward = 1.0 if text == self.completion else 0.0
        return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=[EOS], metrics={"correct": reward})


@dataclass(frozen=True)
class AdditionGroup(EnvGroupBuilder):
    prompt: str
    completion: str
    group_size: int

    async def make_envs(self):
        return [AdditionEnv(self.prompt, self.completion) for _ in range(self.group_size)]

    def logging_tags(self):
        return ["addition"]


class AdditionDataset(RLDataset):
    def __init__(self, examples, batch_size, group_size, n_batches):
        self.examples = examples
        self.batch_size = batch_size
        self.group_size = group_size
        self.n_batches = n_batches

    def get_batch(self, index):
        picked = random.Random(index).sample(self.examples, self.batch_size)
        return [AdditionGroup(r["prompt"], r["completion"], self.group_size) for r in picked]

    def __len__(self):
        return self.n_batches


@chz.chz
class AdditionDatasetBuilder(RLDatasetBuilder):
    file_path: str
    batch_size: int
    group_size: int
    n_batches: int

    async def __call__(self):
        with open(self.file_path) as f:
            examples = [json.loads(line) for line in f]
        return AdditionDataset(examples, self.batch_size, self.group_size, self.n_batches), None


# ---- the runs ----

def read_metrics(log_path):
    with open(os.path.join(log_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_conversations(path, examples):
    with open(path, "w") as f:
        for r in examples:
            f.write(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                             {"role": "assistant", "content": r["completion"]}]}) + "\n")


def run_supervised(base_url, tmp, steps):
    data = os.path.join(tmp, "conversations.jsonl")
    write_conversations(data, rows("addition_train.jsonl")[:32 * steps + 64])
    log_path = os.path.join(tmp, "sl")
    config = sl_train.Config(
        log_path=log_path, model_name=BASE, recipe_name="smelt_test_cookbook_sl", renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(
            file_path=data, test_size=64,
            common_config=ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=BASE, renderer_name="role_colon",
                                                         max_length=64, batch_size=32)),
        learning_rate=3e-3, lr_schedule="constant", lora_rank=8, base_url=base_url,
        save_every=steps // 2, eval_every=max(1, steps // 4), max_steps=steps)
    asyncio.run(sl_train.main(config))
    return read_metrics(log_path)


def run_rl(base_url, tmp, iterations):
    data = os.path.join(tmp, "addition_prompts.jsonl")
    with open(data, "w") as f:
        for r in rows("addition_train.jsonl"):
            f.write(json.dumps(r) + "\n")
    log_path = os.path.join(tmp, "rl")
    config = rl_train.Config(
        log_path=log_path, model_name=BASE, recipe_name="smelt_test_cookbook_rl", max_tokens=5,
        dataset_builder=AdditionDatasetBuilder(file_path=data, batch_size=16, group_size=8, n_batches=iterations),
        learning_rate=2e-3, lora_rank=8, base_url=base_url, loss_fn="importance_sampling",
        eval_every=0, save_every=iterations // 2, num_groups_to_log=0)
    asyncio.run(rl_train.main(config))
    return read_metrics(log_path)


def summarize_supervised(metrics):
    train = [m for m in metrics if "train_mean_nll" in m]
    tests = [(m["step"], m["test/nll"]) for m in metrics if "test/nll" in m]
    losses = [m["train_mean_nll"] for m in train]
    lines = ["supervised (tinker_cookbook.supervised.train, role_colon renderer, %d steps of 32 conversations):"
             % len(losses),
             "  train_mean_nll per step: " + " ".join("%.4f" % x for x in losses)]
    if tests:
        lines.append("  test/nll (64 held-out conversations) by step: "
                     + ", ".join("%d: %.4f" % t for t in tests))
    return losses, tests, lines


def summarize_rl(metrics):
    its = [m for m in metrics if "optim/kl_sample_train_v1" in m]
    rewards = [m["env/all/reward/total"] for m in its]
    kls = [m["optim/kl_sample_train_v1"] for m in its]
    kl2 = [m["optim/kl_sample_train_v2"] for m in its]
    lines = ["rl (tinker_cookbook.rl.train, importance_sampling, %d iterations of 16 prompts x 8 samples):" % len(its),
             "  env/all/reward/total per iteration: " + " ".join("%.3f" % x for x in rewards),
             "  optim/kl_sample_train_v1 per iteration: " + " ".join("%g" % x for x in kls),
             "  optim/kl_sample_train_v2 per iteration: " + " ".join("%g" % x for x in kl2)]
    return rewards, kls, kl2, lines


def check(ok, what, failures):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def workers_gone(tmp, timeout=15):
    """True once no smelt program of this build runs in a job directory under tmp; kills
    (by pid) what is left after the timeout, so a failed run leaves nothing behind."""
    def ours():
        return [pid for pid, (_, _, cwd) in processes().items() if cwd.startswith(os.path.realpath(tmp))]
    deadline = time.time() + timeout
    while ours() and time.time() < deadline:
        time.sleep(0.1)
    left = ours()
    for pid in left:
        os.kill(pid, 9)
    return not left


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sl-steps", type=int, default=40)
    ap.add_argument("--rl-iterations", type=int, default=12)
    ap.add_argument("--report", help="write the measured numbers to this file too")
    args = ap.parse_args()

    tokenizer_utils.register_tokenizer(BASE, load_base_tokenizer)
    os.environ["TINKER_API_KEY"] = "tml-" + ADMIN_KEY
    tmp = tempfile.mkdtemp(prefix="smelt-cookbook-")
    failures = []
    server = None
    try:
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        models = make_models_dir(tmp)
        shutil.copytree(BASE_DIR, os.path.join(models, BASE))
        server = Smeltd(data_dir, models).start()
        base_url = server.base_url

        sl_losses, sl_tests, sl_lines = summarize_supervised(run_supervised(base_url, tmp, args.sl_steps))
        rewards, kls, kl2, rl_lines = summarize_rl(run_rl(base_url, tmp, args.rl_iterations))
        # after the cookbook's own (long) per-step tables, where the end of a log shows it
        print("\n== tinker-cookbook %s against smeltd ==" % version("tinker-cookbook"))
        print("\n".join(sl_lines + rl_lines), flush=True)

        check(len(sl_losses) == args.sl_steps, "supervised loop logged every step", failures)
        k = max(1, len(sl_losses) // 5)
        check(bool(sl_losses) and sum(sl_losses[-k:]) / k < 0.5 * sum(sl_losses[:k]) / k,
              "supervised train_mean_nll fell by more than half (mean of the first and last fifth)", failures)
        check(len(sl_tests) >= 2 and sl_tests[-1][1] < sl_tests[0][1], "supervised test/nll fell", failures)
        check(len(rewards) == args.rl_iterations, "rl loop logged every iteration", failures)
        h = max(1, len(rewards) // 3)
        check(bool(rewards) and sum(rewards[-h:]) / h > sum(rewards[:h]) / h,
              "rl reward rose (mean of the first and last third)", failures)
        check(bool(kls) and all(x == 0.0 for x in kls) and all(x == 0.0 for x in kl2),
              "optim/kl_sample_train_v1 and _v2 exactly 0 every iteration", failures)
        if args.report:
            with open(args.report, "w") as f:
                f.write("\n".join(sl_lines + rl_lines) + "\n")
    finally:
        if server is not None:
            server.kill()
            check(workers_gone(tmp), "no smelt worker left running after smeltd stopped", failures)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("test-cookbook: %d check(s) failed" % len(failures))
        return 1
    print("test-cookbook: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
