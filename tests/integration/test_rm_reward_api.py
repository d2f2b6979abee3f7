"""A GRPO job rewarded by a reward-model job's output, through the HTTP API (issue 16: "a
GRPO job rewarded by a reward-model job's output learns what the reward model prefers").

Three jobs on one module-scoped server, all in OpenAI's message rows under smelt's
"plain" chat template (the tiny model has none of its own), from sums written half with
their leading zero ("023") and half without ("23"), examples/data's addition task:

1. a short supervised job from random weights (2 epochs of 3,000 rows): the model
   learns to answer with two or three digits, and writes sums below 100 with their
   leading zero by greedy decoding (held-out: every one of 200);
2. a reward-model job from that model on pairs of the same sum, the two-digit form
   chosen over the three-digit one ("23" over "023"): a preference the policy can learn,
   and the opposite of what it does greedily;
3. a grpo job from the supervised model whose reward is a `reward_model` grader naming
   job 2's fine_tuned_model: smeltd resolves the name to the model's directory
   (written into the spec beside the name), the trainer loads the classifier beside
   the policy and scores every sample (prompt messages + completion, through the
   plain template, as the pairs were). The held-out reward (the reward model's score
   of one greedy completion of each of 200 prompts in no training row) at the start
   and at the end is printed and must rise by most of the reward model's margin.

Refusals name the request's field: a model name no one has, a `model_dir` in the
request, a bad field of the grader, a causal LM (the job fails at its start, naming
rl.reward.grader.model).

Cost: about 30 s on 2 idle cores (measured: the supervised job 19 s for 178 steps of
1,024 tokens, the reward model 4 s for 24 steps of 32 pairs, GRPO 4 s for 10 iterations
of 16 prompts x 8 samples and two evaluations); the learning test is skipped under a
sanitizer (minutes there)."""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import BUILD, ROOT, Smeltd, make_models_dir
from smeltd_harness import sanitized

DATA = os.path.join(ROOT, "examples", "data")
J = "/v1/fine_tuning/jobs"
SEED = 1
HELD_OUT = 200
ITERATIONS = 10
SMELT = {"chat_template": "plain"}


def rows(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def jsonl(items):
    return ("".join(json.dumps(x) + "\n" for x in items)).encode()


def user(prompt):
    return [{"role": "user", "content": prompt}]


def below_100(name):
    """The prompts rows of sums below 100 (answer "023": a two-digit form exists)."""
    return [r for r in rows(name) if r["answer"].startswith("0")]


def sft_rows():
    return jsonl({"messages": user(r["prompt"]) + [{"role": "assistant", "content": r["completion"]}]}
                 for r in rows("addition_mixed_train.jsonl")[:3000])


def pairs(prompts):
    """The two-digit form chosen over the three-digit one, for the same sum."""
    return jsonl({"prompt": user(r["prompt"]), "chosen": [{"role": "assistant", "content": r["answer"][1:]}],
                  "rejected": [{"role": "assistant", "content": r["answer"]}]} for r in prompts)


def prompt_rows(prompts):
    return jsonl({"messages": user(r["prompt"])} for r in prompts)


@pytest.fixture(scope="module")
def smeltd():
    """Trainers with 2 OpenMP threads (the jobs' time)."""
    tmp = tempfile.mkdtemp(prefix="smelt-it-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    s = Smeltd(data_dir, make_models_dir(tmp), [], env={"OMP_NUM_THREADS": "2"}).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def upload(smeltd, content, name, kind):
    status, f = smeltd.upload_bytes(content, name)
    assert status == 200 and f["status"] == "processed", f
    assert f["validation"]["kind"] == kind, f
    return f["id"]


def create(smeltd, body, status=200):
    got, job = smeltd.request("POST", J, dict(SMELT, **body))
    assert got == status, job
    return job


def run(smeltd, body, timeout=600):
    """The job of body run to success, and its trainer metrics lines."""
    job = create(smeltd, body)
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=timeout)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, lines = smeltd.request("GET", "%s/%s/metrics?limit=1000" % (J, job["id"]))
    assert status == 200, lines
    return job, lines["data"]


@pytest.fixture(scope="module")
def jobs(smeltd):
    """The supervised start and the reward model trained from it."""
    t0 = time.time()
    sft, _ = run(smeltd, {
        "model": "tiny", "training_file": upload(smeltd, sft_rows(), "sft.jsonl", "sft"), "seed": SEED,
        "model_init": "random", "data": {"max_seq_len": 40},
        "method": {"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 2, "batch_tokens": 1024, "learning_rate": 3e-3, "lr_schedule": "cosine", "warmup_steps": 20,
            "beta2": 0.98, "weight_decay": 0.1}}}})
    t1 = time.time()
    held_out_pairs = below_100("addition_prompts_val.jsonl")[:HELD_OUT]
    rm, lines = run(smeltd, {
        "model": sft["fine_tuned_model"], "seed": SEED, "data": {"max_seq_len": 40},
        "training_file": upload(smeltd, pairs(below_100("addition_prompts_train.jsonl")[:1024]), "pairs.jsonl",
                                "preference"),
        "validation_file": upload(smeltd, pairs(held_out_pairs), "pairs_val.jsonl", "preference"),
        "method": {"type": "reward_model", "reward_model": {"hyperparameters": {
            "batch_size": 32, "max_steps": 24, "learning_rate": 1e-3, "warmup_steps": 4}}},
        "eval": {"every_steps": 12}})
    final = [m["data"] for m in lines if m["type"] == "final"][0]
    print("supervised start %.0f s; reward model %.0f s: held-out pairwise accuracy %.3f, margin %.2f"
          % (t1 - t0, time.time() - t1, final["val_rewards/accuracies"], final["val_rewards/margins"]))
    assert final["val_rewards/accuracies"] >= 0.95, final
    return sft, rm, final


@pytest.fixture(scope="module")
def prompt_files(smeltd):
    train = upload(smeltd, prompt_rows(below_100("addition_prompts_train.jsonl")[1024:]), "prompts.jsonl", "prompts")
    # held out: sums of the validation file the reward model's pairs do not hold
    val = upload(smeltd, prompt_rows(below_100("addition_prompts_val.jsonl")[HELD_OUT:2 * HELD_OUT]),
                 "prompts_val.jsonl", "prompts")
    return train, val


GRPO_HYPERPARAMETERS = {"batch_size": 16, "num_generations": 8, "max_new_tokens": 6, "max_iterations": ITERATIONS,
                        "learning_rate": 3e-4, "lr_schedule": "constant", "beta2": 0.99, "kv_memory_mb": 16}


def grpo(model, files, grader, **more):
    body = {"model": model, "training_file": files[0], "validation_file": files[1], "seed": SEED,
            "method": {"type": "grpo", "grpo": {"hyperparameters": GRPO_HYPERPARAMETERS,
                                                "reward": {"grader": grader}}},
            "eval": {"every_steps": ITERATIONS, "accuracy_examples": HELD_OUT}}
    body.update(more)
    return body


def held_out(lines, kind):
    found = [m["data"] for m in lines if m["type"] == kind and (kind == "final" or m["step"] == 0)]
    assert len(found) == 1 and found[0]["val_samples"] == HELD_OUT and found[0]["val_samples_failed"] == 0, lines
    return found[0]["val_reward"]


@pytest.mark.skipif(sanitized(), reason="minutes of training under a sanitizer")
def test_grpo_learns_what_the_reward_model_prefers(smeltd, jobs, prompt_files):
    sft, rm, rm_final = jobs
    t0 = time.time()
    grader = {"type": "reward_model", "name": "prefers two digits", "model": rm["fine_tuned_model"]}
    job, lines = run(smeltd, grpo(sft["fine_tuned_model"], prompt_files, grader))
    seconds = time.time() - t0
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    # the spec keeps the name and the directory smeltd found (the reward-model job's output);
    # the job's method shows the grader without that server path
    written = raw["spec"]["rl"]["reward"]["grader"]
    assert written == dict(grader, model_dir=written["model_dir"]), written
    assert written["model_dir"].endswith(rm["id"] + "/output"), (written, rm["id"])
    assert raw["method"]["grpo"]["reward"]["grader"] == grader, raw["method"]

    train = [m["data"] for m in lines if m["type"] == "train"]
    assert len(train) == ITERATIONS, lines
    for d in train:  # every sample scored by the reward model
        assert d["samples_failed"] == 0 and d["samples"] == 16 * 8, d
        assert abs(d["rewards/reward_model/mean"] - d["reward"]) < 1e-9, d
    before, after = held_out(lines, "eval"), held_out(lines, "final")
    margin = rm_final["val_rewards/margins"]
    print("GRPO rewarded by the reward model %s: held-out reward (%d prompts, greedy) %.3f -> %.3f (%+.3f; the "
          "reward model's held-out margin %.3f), train reward %.3f -> %.3f, %d iterations, %.0f s"
          % (rm["fine_tuned_model"], HELD_OUT, before, after, after - before, margin, train[0]["reward"],
             train[-1]["reward"], ITERATIONS, seconds))
    # Measured (seed 1): -3.033 -> +3.084 (margin 6.11): every greedy answer moved to the two-digit form.
    assert after - before >= 0.5 * margin, (before, after, margin)
    assert train[-1]["reward"] > train[0]["reward"], train


def refused(smeltd, files, method, param, says=""):
    """A request with method (from tiny, random weights) refused naming param."""
    status, job = smeltd.request("POST", J, dict(SMELT, model="tiny", training_file=files[0], model_init="random",
                                                 method=method))
    assert status == 400 and job["error"]["param"] == param, job
    assert says in job["error"]["message"], job


def test_reward_model_refusals_name_the_field(smeltd, prompt_files):
    hp = {"batch_size": 4, "max_iterations": 1}
    multi = {"type": "multi", "calculate_output": "rm", "graders": {"rm": {"type": "reward_model",
                                                                             "model": "ft:nobody:rm"}}}
    refused(smeltd, prompt_files, {"type": "reinforcement", "reinforcement": {"hyperparameters": hp, "grader": multi}},
            "method.reinforcement.grader.graders.rm.model", "no such model: ft:nobody:rm")
    for grader, param in (({"model": "tiny", "model_dir": "/etc"}, "model_dir"), ({"model": 3}, "model"),
                          ({"model": "tiny", "normalize": "zscore"}, "normalize")):
        reward = {"grader": dict(grader, type="reward_model")}
        refused(smeltd, prompt_files, {"type": "grpo", "grpo": {"hyperparameters": hp, "reward": reward}},
                "method.grpo.reward.grader." + param, param)

    # a causal LM with weights, listed beside tiny: the job is created, and its trainer refuses
    # the model at the start, naming the field
    lm = os.path.join(smeltd.models_dir, "tiny-lm")
    subprocess.run([os.path.join(BUILD, "smelt-model"), "init", "--config",
                    os.path.join(smeltd.models_dir, "tiny", "config.json"), "--out", lm, "--byte-tokenizer"],
                   check=True, capture_output=True)
    job = create(smeltd, grpo("tiny", prompt_files, {"type": "reward_model", "model": "tiny-lm"},
                              model_init="random"))
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=120)
    assert job["status"] == "failed", job
    message = job["error"]["message"]
    assert "rl.reward.grader.model: %s is a causal LM" % lm in message and "without a score head" in message, message


def test_a_score_model_grader_names_a_model_smelt_has(smeltd, prompt_files):
    """score_model / label_model graders name their model as reward_model graders do:
    smeltd resolves the name to a directory written beside it, refuses a name no one has
    and a model_dir in the request, and the trainer generates the verdicts (a random
    tiny LM's replies are no number: those samples fail as events, the job goes on)."""
    hp = {"batch_size": 4, "num_generations": 2, "max_new_tokens": 4, "max_iterations": 1, "kv_memory_mb": 4}
    judge = {"type": "score_model", "name": "judge", "model": "ft:nobody:judge", "range": [0, 10],
             "sampling_params": {"temperature": 0, "max_completions_tokens": 4},
             "input": [{"role": "user", "content": "Rate 0-10: {{sample.output_text}}"}]}
    method = {"type": "grpo", "grpo": {"hyperparameters": hp, "reward": {"grader": judge}}}
    refused(smeltd, prompt_files, method, "method.grpo.reward.grader.model", "no such model: ft:nobody:judge")
    method["grpo"]["reward"]["grader"] = dict(judge, model="tiny", model_dir="/etc")
    refused(smeltd, prompt_files, method, "method.grpo.reward.grader.model_dir", "not accepted")

    lm = os.path.join(smeltd.models_dir, "tiny-lm")
    if not os.path.isdir(lm):
        subprocess.run([os.path.join(BUILD, "smelt-model"), "init", "--config",
                        os.path.join(smeltd.models_dir, "tiny", "config.json"), "--out", lm, "--byte-tokenizer"],
                       check=True, capture_output=True)
    grader = dict(judge, model="tiny-lm")
    method["grpo"]["reward"]["grader"] = grader
    job, lines = run(smeltd, {"model": "tiny", "training_file": prompt_files[0], "model_init": "random",
                              "method": method}, timeout=300)
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    written = raw["spec"]["rl"]["reward"]["grader"]
    assert written["model"] == "tiny-lm" and written["model_dir"] == lm, written
    train = [m["data"] for m in lines if m["type"] == "train"]
    assert len(train) == 1 and train[0]["samples"] == 8, lines
    errors = json.dumps([m["data"] for m in lines if m["type"] == "sample_errors"])
    assert train[0]["samples_failed"] == 0 or "the grader model's reply" in errors, (train, errors)
