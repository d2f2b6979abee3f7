"""OpenAI's reinforcement method through smeltd, driven by the official `openai` client:
OpenAI-style rows (`messages` ending with the user's turn, plus a `reference_answer` field
the grader reads as {{item.reference_answer}}) are uploaded, a job with
`method: {"type": "reinforcement", "reinforcement": {"grader": <multi>, "hyperparameters":
{...}}}` runs on smelt's GRPO loop, and the held-out score rises by a clear, printed amount.
Bad requests are refused with the request's path in `param`.

The task is the README's GRPO demo, in OpenAI's row format. A module-scoped supervised
job (also OpenAI rows: user turn "22+01=", assistant turn "023" or "23") trains the tiny
model from random weights on examples/data/addition_mixed_train.jsonl, whose sums are
written half with their leading zero and half without, so the model learns the sums but
writes each below 100 in either form by chance. The tiny model has no chat template, so
both jobs name smelt's "plain" one (`chat_template`): the model sees "User: 22+01=\\n
Assistant:" and writes " 023". The reinforcement job's grader asks for the three-digit
form: a multi grader of a string_check (the completion equals the reference exactly) and
a text_similarity (fuzzy_match: partial credit, " 37" against " 037" scores 6/7),
0.8 * exact + 0.2 * close. Held-out: the first 300 rows of
examples/data/addition_prompts_val.jsonl, in no training row, one greedy completion each
(eval_samples). The score at the job's step 0 (the SFT model's) and at its end are
printed; the end must be clearly ahead.

The same SFT start serves the README's GRPO demo through the API in the split placement
(test_grpo_in_split_placement_raises_held_out_accuracy: a separate smelt-rollout process
fed the new weights after every iteration; the rows' "answer" is what its exact-match
verifier checks).

Cost: the SFT is examples/sft_mixed.json's (12 epochs, 1,020 steps of 1,024 tokens, lr 3e-3
cosine; trained to convergence, so it learns the sums whatever the CPU's GEMM kernels round
like: shorter SFTs learnt to add for some seeds and not others), run with 2 OpenMP threads
(this module's server); the reinforcement job (10 iterations of 16 prompts x 8 samples,
two evaluations of 300 prompts) about 7 s. Under a sanitizer build the SFT takes many
minutes: the learning test is skipped there (the refusals still run)."""
import json
import os
import shutil
import tempfile
import time

import openai
import pytest

from conftest import ADMIN_KEY, ROOT, Smeltd, make_models_dir
from smeltd_harness import sanitized

DATA = os.path.join(ROOT, "examples", "data")
SEED = 1
HELD_OUT = 300
ITERATIONS = 10
SFT_HYPERPARAMETERS = {"n_epochs": 12, "batch_tokens": 1024, "learning_rate": 3e-3, "lr_schedule": "cosine",
                       "warmup_steps": 20, "beta2": 0.98, "weight_decay": 0.1}  # examples/sft_mixed.json
# OpenAI's seven, then smelt's own names (examples/grpo.json's run, colocated, 10 iterations)
RFT_HYPERPARAMETERS = {"n_epochs": 1, "batch_size": 16, "learning_rate_multiplier": 0.5, "compute_multiplier": 1,
                       "eval_interval": ITERATIONS, "eval_samples": HELD_OUT, "reasoning_effort": "default",
                       "max_iterations": ITERATIONS, "max_new_tokens": 6, "lr_schedule": "constant",
                       "beta2": 0.99, "kv_memory_mb": 16}
# the plain template's assistant turn starts with a space: " 023"
GRADER = {"type": "multi", "graders": {
    "exact": {"type": "string_check", "name": "exact", "operation": "eq",
              "input": "{{sample.output_text}}", "reference": " {{item.reference_answer}}"},
    "close": {"type": "text_similarity", "name": "close", "evaluation_metric": "fuzzy_match",
              "input": "{{sample.output_text}}", "reference": " {{item.reference_answer}}"}},
    "calculate_output": "0.8 * exact + 0.2 * close"}
SMELT = {"chat_template": "plain"}


def rows(name, n=None):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        out = [json.loads(line) for line in f if line.strip()]
    return out[:n] if n else out


def jsonl(items):
    return ("".join(json.dumps(x) + "\n" for x in items)).encode()


def sft_rows():
    """OpenAI's SFT rows: the sum as the user's turn, the answer (in either form) as the
    assistant's."""
    return jsonl({"messages": [{"role": "user", "content": r["prompt"]},
                               {"role": "assistant", "content": r["completion"]}]}
                 for r in rows("addition_mixed_train.jsonl"))


def rft_rows(split, n=None):
    """OpenAI's reinforcement rows: the messages end with the user's turn; the other
    fields are the grader's {{item.*}}."""
    return jsonl({"messages": [{"role": "user", "content": r["prompt"]}], "reference_answer": r["answer"],
                  "answer": r["answer"]}
                 for r in rows("addition_prompts_%s.jsonl" % split, n))


@pytest.fixture(scope="module")
def smeltd():
    """This module's server runs trainers with 2 OpenMP threads (the SFT start's time) and
    offers 2 CPU slots (a split GRPO job's trainer and its rollout worker)."""
    tmp = tempfile.mkdtemp(prefix="smelt-it-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    s = Smeltd(data_dir, make_models_dir(tmp), ["--cpu-slots", "2"], env={"OMP_NUM_THREADS": "2"}).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def client(smeltd):
    return openai.OpenAI(base_url=smeltd.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def upload(client, content, name, kind, status="processed"):
    f = client.files.create(file=(name, content), purpose="fine-tune")
    assert f.status == status, f
    assert f.to_dict()["validation"]["kind"] == kind, f
    return f


def wait_done(client, smeltd, job_id, timeout):
    """The job at its end (it must have succeeded) and its events, oldest first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            assert job.status == "succeeded", (job, smeltd.read_log())
            events = client.fine_tuning.jobs.list_events(job_id, limit=1000).data
            return job, list(reversed(events))
        time.sleep(0.5)
    raise AssertionError("job %s did not finish in %d s" % (job_id, timeout))


@pytest.fixture(scope="module")
def sft_model(client, smeltd):
    """The start of the reinforcement job: the tiny model fine-tuned on the mixed sums."""
    t0 = time.time()
    train = upload(client, sft_rows(), "sft_mixed.jsonl", "sft")
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id, seed=SEED,
        method={"type": "supervised", "supervised": {"hyperparameters": SFT_HYPERPARAMETERS}},
        extra_body=dict(SMELT, model_init="random", data={"max_seq_len": 40}))
    job, _ = wait_done(client, smeltd, job.id, timeout=900)
    print("SFT start: %.0f s" % (time.time() - t0))
    return job.fine_tuned_model


@pytest.fixture(scope="module")
def rft_files(client):
    train = upload(client, rft_rows("train"), "rft_train.jsonl", "prompts")
    val = upload(client, rft_rows("val", HELD_OUT), "rft_val.jsonl", "prompts")
    return train.id, val.id


def create(client, model, files, grader=GRADER, hp=RFT_HYPERPARAMETERS, extra=None):
    settings = {"hyperparameters": hp}
    if grader is not None:
        settings["grader"] = grader
    return client.fine_tuning.jobs.create(
        model=model, training_file=files[0], validation_file=files[1], seed=SEED,
        method={"type": "reinforcement", "reinforcement": settings}, extra_body=dict(SMELT, **(extra or {})))


def held_out(lines, kind):
    """The held-out evaluation of the trainer's metrics line of this kind: "eval" at step 0
    (the starting model's), "final" (the end's)."""
    found = [m["data"] for m in lines if m["type"] == kind and (kind == "final" or m["step"] == 0)]
    assert len(found) == 1 and "val_reward" in found[0], lines
    assert found[0]["val_samples"] == HELD_OUT and found[0]["val_samples_failed"] == 0, found
    return found[0]


@pytest.mark.skipif(sanitized(), reason="minutes of SFT under a sanitizer")
def test_reinforcement_job_raises_held_out_score(client, smeltd, sft_model, rft_files):
    t0 = time.time()
    job = create(client, sft_model, rft_files)
    assert job.method.type == "reinforcement", job
    # the job object as smeltd sent it (the client's models take a multi grader's
    # sub-graders for one grader)
    status, raw = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job.id)
    assert status == 200, raw
    method = raw["method"]
    assert method["reinforcement"]["grader"] == GRADER, method
    # OpenAI's seven, resolved (compute_multiplier: num_generations / 8)
    assert method["reinforcement"]["hyperparameters"] == {
        "n_epochs": 1, "batch_size": 16, "learning_rate_multiplier": 0.5, "compute_multiplier": 1.0,
        "eval_interval": ITERATIONS, "eval_samples": HELD_OUT, "reasoning_effort": "default"}, method
    assert job.hyperparameters.batch_size == 16, job

    job, events = wait_done(client, smeltd, job.id, timeout=600)
    seconds = time.time() - t0
    status, raw = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job.id)
    assert raw["spec"]["type"] == "grpo" and raw["spec"]["rl"]["num_generations"] == 8, raw["spec"]
    assert raw["spec"]["rl"]["reward"] == {"grader": GRADER}, raw["spec"]["rl"]
    assert raw["spec"]["eval"] == {"every_steps": ITERATIONS, "accuracy_examples": HELD_OUT}, raw["spec"]

    steps = [e.data for e in events if e.type == "metrics" and e.data and "train_loss" in e.data]
    assert [d["step"] for d in steps] == list(range(1, ITERATIONS + 1)), [e.message for e in events]
    for d in steps:  # every sample of 16 prompts x 8 scored by the multi grader
        assert 0 <= d["reward"] <= 1 and d["samples"] == 16 * 8, d
    # the trainer's train lines: the sub-graders' scores beside the reward
    status, lines = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics?limit=1000" % job.id)
    assert status == 200, lines
    train = [m["data"] for m in lines["data"] if m["type"] == "train"]
    assert len(train) == ITERATIONS, lines
    for d in train:
        assert 0 <= d["rewards/exact/mean"] <= 1 and 0 <= d["rewards/close/mean"] <= 1, d
        assert abs(d["reward"] - (0.8 * d["rewards/exact/mean"] + 0.2 * d["rewards/close/mean"])) < 1e-6, d

    before, after = held_out(lines["data"], "eval"), held_out(lines["data"], "final")
    finished = [e.message for e in events if e.message.startswith("Training finished")]
    assert finished and "validation reward=%.4f" % after["val_reward"] in finished[0], finished
    print("reinforcement (multi grader: 0.8 x string_check + 0.2 x fuzzy_match) held-out score (%d prompts, "
          "greedy): %.3f -> %.3f (+%.3f), exact-match share %.3f -> %.3f, in %d iterations, %.0f s"
          % (HELD_OUT, before["val_reward"], after["val_reward"], after["val_reward"] - before["val_reward"],
             before["val_accuracy"], after["val_accuracy"], ITERATIONS, seconds))
    # Measured (2-core VM, seed 1): 0.725 -> 0.911, exact 0.670 -> 0.893, the same on every run.
    assert after["val_reward"] >= before["val_reward"] + 0.1, (before, after)
    assert after["val_accuracy"] > before["val_accuracy"], (before, after)


GRPO_ITERATIONS = 10
GRPO_HYPERPARAMETERS = {"batch_size": 16, "num_generations": 8, "max_new_tokens": 6,
                        "max_iterations": GRPO_ITERATIONS, "learning_rate": 5e-5, "lr_schedule": "constant",
                        "beta2": 0.99, "kv_memory_mb": 16}
# examples/grpo.json's reward: an exact match of the three-digit form
GRPO_REWARD = {"verifiers": [{"type": "exact_match",
                              "extract": {"type": "regex", "pattern": "^\\s*(\\d{3})\\s*$", "group": 1}}]}


@pytest.mark.skipif(sanitized(), reason="minutes of SFT under a sanitizer")
def test_grpo_in_split_placement_raises_held_out_accuracy(client, smeltd, sft_model, rft_files):
    """It learns: the README's GRPO demo through the API, with a separate smelt-rollout
    process (resources.rollout) fed the new weights after every iteration, from the same
    SFT start; the rows' reference_answer is the answer its verifier checks."""
    t0 = time.time()
    status, job = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(SMELT, **{
        "model": sft_model, "training_file": rft_files[0], "validation_file": rft_files[1], "seed": SEED,
        "method": {"type": "grpo", "grpo": {"hyperparameters": GRPO_HYPERPARAMETERS, "reward": GRPO_REWARD}},
        "eval": {"every_steps": GRPO_ITERATIONS, "accuracy_examples": HELD_OUT},
        "resources": {"trainer": {"devices": 1}, "rollout": {"devices": 1}}}))
    assert status == 200, job
    job, events = wait_done(client, smeltd, job["id"], timeout=600)
    seconds = time.time() - t0
    status, raw = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job.id)
    assert raw["spec"]["rl"]["placement"] == "split" and raw["spec"]["rl"]["rollout_workers"] == 1, raw["spec"]
    steps = [e.data for e in events if e.type == "metrics" and e.data and "train_loss" in e.data]
    assert [d["step"] for d in steps] == list(range(1, GRPO_ITERATIONS + 1)), [e.message for e in events]
    for d in steps:  # generated in the worker, which got the whole model (f32) after every update
        assert d["sync_bytes"] > 0 and d["policy_version"] == d["step"], d
        assert d["rollout/logprob_diff_mean"] < 1e-3, d
    status, lines = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics?limit=1000" % job.id)
    before, after = held_out(lines["data"], "eval"), held_out(lines["data"], "final")
    print("GRPO (split placement) held-out exact-match accuracy (%d prompts, greedy): %.3f -> %.3f in %d "
          "iterations, %.0f s" % (HELD_OUT, before["val_accuracy"], after["val_accuracy"], GRPO_ITERATIONS, seconds))
    assert after["val_accuracy"] >= before["val_accuracy"] + 0.15, (before, after)


JUDGE_ITERATIONS = 2


@pytest.mark.skipif(sanitized(), reason="minutes of SFT under a sanitizer")
def test_a_score_model_judge_gives_real_scores(client, smeltd, sft_model):
    """A score_model grader whose judge is a model that knows the task: the SFT model, asked
    the row's sum ({{item.question}}) through its own chat template, replies " 023" or " 23",
    read as the number 23. Its scores are the true sums, sample by sample (the iteration's
    listed samples name their prompt), and no reply fails to parse."""
    rows_ = [{"messages": [{"role": "user", "content": r["prompt"]}], "question": r["prompt"]}
             for r in rows("addition_prompts_train.jsonl", 64)]
    train = upload(client, jsonl(rows_), "judged.jsonl", "prompts")
    judge = {"type": "score_model", "name": "judge", "model": sft_model, "range": [0, 200],
             "sampling_params": {"temperature": 0, "max_completions_tokens": 5},
             "input": [{"role": "user", "content": "{{item.question}}"}]}
    grader = {"type": "multi", "graders": {"judge": judge}, "calculate_output": "judge / 200"}
    hp = {"batch_size": 8, "compute_multiplier": 0.25, "max_iterations": JUDGE_ITERATIONS, "max_new_tokens": 4,
          "kv_memory_mb": 16}
    job = client.fine_tuning.jobs.create(
        model=sft_model, training_file=train.id, seed=SEED,
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}},
        extra_body=SMELT)
    job, _ = wait_done(client, smeltd, job.id, timeout=600)
    status, lines = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics?limit=1000" % job.id)
    assert status == 200, lines
    train_lines = [m["data"] for m in lines["data"] if m["type"] == "train"]
    assert len(train_lines) == JUDGE_ITERATIONS, lines
    for d in train_lines:
        assert d["samples_failed"] == 0 and 0 < d["rewards/judge/mean"] <= 198, d
    listed = [x for m in lines["data"] if m["type"] == "samples" for x in m["data"]["samples"]]
    right = 0
    for x in listed:
        a, b = x["prompt"].split("User: ")[1].split("=")[0].split("+")
        right += x["scores"]["judge"] == int(a) + int(b)
    print("score_model judge (the SFT model): %d of %d listed samples scored with their true sum" % (right, len(listed)))
    assert len(listed) >= 2 * JUDGE_ITERATIONS and right >= len(listed) - 1, listed


def refused(client, files, param, *words, model="tiny", **kwargs):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, model, files, **kwargs)
    err = e.value.body
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err
    return err


def test_reinforcement_refusals_name_the_field(client, rft_files):
    hp = {"batch_size": 4, "max_iterations": 2}
    bad = json.loads(json.dumps(GRADER))
    bad["graders"]["exact"]["operation"] = "contains"
    refused(client, rft_files, "method.reinforcement.grader.graders.exact.operation", "contains", "eq, ne, like",
            grader=bad, hp=hp)
    bad = json.loads(json.dumps(GRADER))
    bad["graders"]["close"]["reference"] = "{{row.reference_answer}}"
    refused(client, rft_files, "method.reinforcement.grader.graders.close.reference", "unknown namespace",
            grader=bad, hp=hp)
    refused(client, rft_files, "method.reinforcement.grader.calculate_output", "sin",
            grader=dict(GRADER, calculate_output="sin(exact)"), hp=hp)
    refused(client, rft_files, "method.reinforcement.grader", "required", grader=None, hp=hp)
    refused(client, rft_files, "method.reinforcement.hyperparameters.momentum", "momentum",
            hp=dict(hp, momentum=0.9))
    refused(client, rft_files, "method.reinforcement.hyperparameters.reasoning_effort", "default",
            "not reasoning models", hp=dict(hp, reasoning_effort="high"))
    refused(client, rft_files, "method.reinforcement.hyperparameters.compute_multiplier", "0.1",
            hp=dict(hp, compute_multiplier=0.1))
    refused(client, rft_files, "method.reinforcement.hyperparameters.compute_multiplier", "num_generations",
            "not both", hp=dict(hp, compute_multiplier=2, num_generations=4))
    refused(client, rft_files, "method.reinforcement.hyperparameters.eval_interval", "eval.every_steps",
            hp=dict(hp, eval_interval=2), extra={"eval": {"every_steps": 1}})
    refused(client, rft_files, "method.reinforcement.hyperparameters.n_epochs", "epochs", hp=dict(hp, n_epochs=0))
    refused(client, rft_files, "method.reinforcement.hyperparameters.max_new_tokens", "max_new_tokens",
            hp=dict(hp, max_new_tokens=0))
    # reasoning_effort "auto" is accepted, shown as "default"
    job = create(client, "tiny", rft_files, hp=dict(hp, reasoning_effort="auto"), extra={"model_init": "random"})
    client.fine_tuning.jobs.cancel(job.id)
    assert job.method.reinforcement.hyperparameters.reasoning_effort == "default", job
    assert job.method.reinforcement.hyperparameters.compute_multiplier == 1, job


def test_rows_of_the_wrong_shape_are_refused_naming_the_line(client, rft_files):
    # every row ends with the assistant's answer: an SFT file, refused for a reinforcement
    # job with the first row that cannot be a prompt
    shaped = upload(client, jsonl([{"messages": [{"role": "user", "content": "1+2="},
                                                 {"role": "assistant", "content": "003"}]}]), "sft.jsonl", "sft")
    refused(client, (shaped.id, rft_files[1]), "training_file", "holds sft rows", "read as prompts rows, line 1",
            "messages[1].role", "final assistant turn")
    # a prompts file (its first row decides) with a final assistant turn on line 2
    mixed = upload(client, jsonl([{"messages": [{"role": "user", "content": "1+2="}], "reference_answer": "003"},
                                  {"messages": [{"role": "user", "content": "1+3="},
                                                {"role": "assistant", "content": "004"}], "reference_answer": "004"}]),
                   "mixed.jsonl", "prompts", status="error")
    errors = mixed.to_dict()["validation"]["errors"]
    assert errors == [{"line": 2, "field": "messages[1].role", "message": "a prompt ends with a user or system turn "
                       "(the model writes the answer), got a final assistant turn"}], errors
    refused(client, (rft_files[0], mixed.id), "validation_file", "failed validation", "line 2: messages[1].role")
    # tools (OpenAI's other reserved key) cannot be honoured: refused at upload
    tools = upload(client, jsonl([{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]}]),
                   "tools.jsonl", "auto", status="error")  # no valid row decided the kind
    assert tools.to_dict()["validation"]["errors"][0]["field"] == "tools", tools
