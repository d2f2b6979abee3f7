"""GRPO and PPO learn through the API (issue 15's "it learns"): from the SFT example's
model (tests/data/tinker/addition-base: examples/sft_mixed.json's output, which writes a
two-digit sum in the three-digit form only part of the time), a job submitted over plain
HTTP with the GRPO example's settings (examples/grpo.json) and a separate `smelt-rollout`
worker raises the held-out exact-match accuracy of the three-digit form by a clear,
printed amount within seconds on 2 cores; the same job colocated (the engine in the
trainer's process) gets the same rewards iteration for iteration; and a PPO job
(examples/ppo.json's settings: a critic, GAE, one sample per prompt) learns the same
task. The held-out accuracy is read from the job's metrics through the API."""
import os
import shutil
import tempfile
import time

import pytest
from conftest import ROOT, Smeltd, make_models_dir

J = "/v1/fine_tuning/jobs"
BASE = "addition-base"
DATA = os.path.join(ROOT, "examples", "data")
ITERATIONS = 10
HELD_OUT = 100
# examples/grpo.json's reward: the completion is the sum written with three digits
REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "regex", "pattern": "^\\s*(\\d{3})\\s*$",
                                                            "group": 1}}]}


@pytest.fixture(scope="module")
def smeltd():
    """Two CPU slots: a split job takes one for its trainer and one for its rollout worker."""
    tmp = tempfile.mkdtemp(prefix="smelt-rl-learns-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    models = make_models_dir(tmp)
    shutil.copytree(os.path.join(ROOT, "tests", "data", "tinker", BASE), os.path.join(models, BASE))
    s = Smeltd(data_dir, models, ["--cpu-slots", "2"]).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def files(smeltd):
    def upload(name, n=None):
        with open(os.path.join(DATA, name), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        status, f = smeltd.upload_bytes(b"".join(lines[:n] if n else lines), name)
        assert status == 200 and f["status"] == "processed" and f["validation"]["kind"] == "prompts", f
        return f["id"]
    return upload("addition_prompts_train.jsonl"), upload("addition_prompts_val.jsonl", HELD_OUT)


def request(files, method, hp, rollout_workers):
    train, val = files
    hp = dict({"batch_size": 16, "learning_rate": 5e-5, "lr_schedule": "constant", "beta2": 0.99,
               "max_new_tokens": 6, "max_iterations": ITERATIONS, "kv_memory_mb": 16}, **hp)
    resources = {"trainer": {"devices": 1}}
    if rollout_workers:
        resources["rollout"] = {"devices": rollout_workers}
    return {"model": BASE, "training_file": train, "validation_file": val, "seed": 1,
            "method": {"type": method, method: {"hyperparameters": hp, "reward": REWARD}},
            "resources": resources, "eval": {"every_steps": ITERATIONS, "accuracy_examples": HELD_OUT}}


def run(smeltd, body):
    """Submits body, waits for success; (job, its metrics lines by type, seconds it took)."""
    t0 = time.monotonic()
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=600)
    took = time.monotonic() - t0
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, page = smeltd.request("GET", J + "/" + job["id"] + "/metrics?limit=1000")
    assert status == 200 and not page["has_more"], page
    lines = {}
    for row in page["data"]:
        lines.setdefault(row["data"]["type"], []).append(row["data"])
    return job, lines, took


def accuracy_change(lines):
    """The held-out exact-match accuracy before any update (step 0) and at the end."""
    start = [e for e in lines["eval"] if e["step"] == 0]
    assert len(start) == 1 and len(lines["final"]) == 1, lines.get("eval")
    first, last = start[0], lines["final"][0]
    assert first["val_samples"] == HELD_OUT and last["val_samples"] == HELD_OUT, (first, last)
    return first["val_accuracy"], last["val_accuracy"]


def test_grpo_learns_through_the_api_split_and_colocated_alike(smeltd, files):
    hp = {"num_generations": 8}
    job, split, took = run(smeltd, request(files, "grpo", hp, rollout_workers=1))
    before, after = accuracy_change(split)
    print("GRPO through the API, split placement (1 smelt-rollout worker): held-out exact-match accuracy "
          "%.3f -> %.3f in %d iterations, %.1f s" % (before, after, ITERATIONS, took))
    assert after >= before + 0.15 and after >= 0.95, (before, after)
    assert all(line["sync_bytes"] > 0 for line in split["train"]), split["train"]
    with open(os.path.join(smeltd.data_dir, "jobs", job["id"], "rollout-0.log"), encoding="utf-8") as f:
        assert f.read().count("in use (by broadcast)") == ITERATIONS  # the worker got every iteration's weights

    _, colocated, took = run(smeltd, request(files, "grpo", hp, rollout_workers=0))
    assert "sync_bytes" not in colocated["train"][0] or colocated["train"][0]["sync_bytes"] == 0, colocated["train"]
    rewards = [(line["step"], line["reward"], line["reward_std"]) for line in split["train"]]
    assert len(rewards) == ITERATIONS
    assert rewards == [(line["step"], line["reward"], line["reward_std"]) for line in colocated["train"]]
    assert accuracy_change(colocated) == (before, after)
    print("GRPO colocated: the same rewards in all %d iterations (%.1f s)" % (ITERATIONS, took))


def test_ppo_learns_through_the_api(smeltd, files):
    hp = {"batch_size": 64, "num_generations": 1, "critic_learning_rate": 5e-4, "gamma": 1.0, "lambda": 0.95}
    _, lines, took = run(smeltd, request(files, "ppo", hp, rollout_workers=1))
    before, after = accuracy_change(lines)
    print("PPO through the API, split placement: held-out exact-match accuracy %.3f -> %.3f in %d iterations, "
          "%.1f s" % (before, after, ITERATIONS, took))
    assert after >= before + 0.15 and after >= 0.9, (before, after)
    assert all("critic/vf_loss" in line for line in lines["train"]), lines["train"][0]
