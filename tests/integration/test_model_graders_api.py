"""score_model and label_model graders with a judge that gives real verdicts, through the
API and the official `openai` client: a reinforcement job whose grader is a `multi` of a
score_model (the judge adds a number to the sample) and a label_model (the judge's sum
labelled), every per-sample score and the held-out score checked against sums computed
here by hand.

The policy is tests/data/tinker/addition-base (raw text prompts "93+25=", it writes "118"),
generating 2 tokens: the completion is the sum's first two digits ("11"). The judge is
tests/data/graders/addition-judge (the same recipe trained on smelt's "plain" chat format:
"User: 11+07=\\nAssistant:" -> " 018" or " 18"), so its reply to the score_model's
"{{sample.output_text}}+{{item.k}}=" is int(completion) + k, and to the label_model's
"{{sample.output_text}}+00=" one of "010", "10", "011", "11" (passing: the two of 11).
The sums of the prompts lie in 100..119, so every completion is "10" or "11".

Also here: sampling_params honoured (max_completions_tokens 3 cuts the judge's " 105" to
" 10"), eval_interval (an evaluation on the
validation file after every step, eval_samples prompts, hand-checked at step 0), and the
job object's grader showing no server path (model_dir). About 30 s on 2 cores."""
import json
import os
import random
import shutil
import tempfile
import time

import openai
import pytest

from conftest import ADMIN_KEY, ROOT, Smeltd, make_models_dir

POLICY_DIR = os.path.join(ROOT, "tests", "data", "tinker", "addition-base")
JUDGE_DIR = os.path.join(ROOT, "tests", "data", "graders", "addition-judge")
SUM = {"type": "score_model", "name": "sum", "model": "addition-judge", "range": [0, 200],
       "sampling_params": {"temperature": 0, "max_completions_tokens": 5},
       "input": [{"role": "user", "content": "{{sample.output_text}}+{{item.k}}="}]}
IS11 = {"type": "label_model", "name": "is11", "model": "addition-judge",
        "labels": ["010", "10", "011", "11"], "passing_labels": ["011", "11"],
        "sampling_params": {"temperature": 0},
        "input": [{"role": "user", "content": "{{sample.output_text}}+00="}]}
GRADER = {"type": "multi", "graders": {"sum": SUM, "is11": IS11}, "calculate_output": "sum + is11"}
ITERATIONS = 2
HP = {"n_epochs": 1, "batch_size": 4, "compute_multiplier": 0.25, "learning_rate_multiplier": 0.01,
      "eval_interval": 1, "eval_samples": 4, "max_iterations": ITERATIONS, "max_new_tokens": 2,
      "temperature": 0.05, "kv_memory_mb": 4}


def items(seed, n):
    """n prompts "a+b=" with a + b in 100..119 and a two-digit k for the judge."""
    rng = random.Random(seed)
    out = {}
    while len(out) < n:
        total = rng.randint(100, 119)
        a = rng.randint(total - 99, 99)
        prompt = "%02d+%02d=" % (a, total - a)
        out[prompt] = {"prompt": prompt, "metadata": {"k": "%02d" % rng.randint(1, 60)}}
    return list(out.values())


def expected(prompt_row, completion):
    """The judge's verdicts by hand: (sum, is11)."""
    return int(completion) + int(prompt_row["metadata"]["k"]), 1.0 if completion == "11" else 0.0


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def smeltd():
    tmp = tempfile.mkdtemp(prefix="smelt-it-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    models = make_models_dir(tmp)
    shutil.copytree(POLICY_DIR, os.path.join(models, "addition-base"))
    shutil.copytree(JUDGE_DIR, os.path.join(models, "addition-judge"))
    s = Smeltd(data_dir, models, env={"OMP_NUM_THREADS": "1"}).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def client(smeltd):
    return openai.OpenAI(base_url=smeltd.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture(scope="module")
def files(client):
    train, val = items(1, 4 * ITERATIONS), items(2, 4)
    ids = []
    for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
        f = client.files.create(file=(name, jsonl(rows)), purpose="fine-tune")
        assert f.status == "processed" and f.to_dict()["validation"]["kind"] == "prompts", f
        ids.append(f.id)
    return ids, {r["prompt"]: r for r in train}, val


def run_job(client, smeltd, files, grader, hp=HP):
    job = client.fine_tuning.jobs.create(
        model="addition-base", training_file=files[0][0], validation_file=files[0][1], seed=1,
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}},
        extra_body={"chat_template": "plain"})
    deadline = time.time() + 300
    while time.time() < deadline:
        job = client.fine_tuning.jobs.retrieve(job.id)
        if job.status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert job.status == "succeeded", (job, smeltd.read_log())
    status, lines = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics?limit=1000" % job.id)
    assert status == 200, lines
    return job, [m["data"] for m in lines["data"]]


def test_a_judge_model_gives_the_scores_computed_by_hand(client, smeltd, files):
    t0 = time.time()
    job, lines = run_job(client, smeltd, files, GRADER)
    by_prompt = files[1]

    # the job object shows the grader as given: no server path (the spec keeps model_dir)
    status, raw = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job.id)
    assert raw["method"]["reinforcement"]["grader"] == GRADER, raw["method"]
    assert raw["spec"]["rl"]["reward"]["grader"]["graders"]["sum"]["model_dir"].endswith("/addition-judge"), raw

    train = [d for d in lines if d["type"] == "train"]
    assert len(train) == ITERATIONS and all(d["samples_failed"] == 0 for d in train), train
    checked = 0
    for d in lines:
        if d["type"] != "samples":
            continue
        for s in d["samples"]:  # the first sample of each group: prompt, completion, scores
            row = by_prompt[s["prompt"].replace("<|bos|>", "")]  # the prompt as the policy read it
            assert len(s["completion"]) == 2 and s["completion"].isdigit(), s
            total, is11 = expected(row, s["completion"])
            assert s["scores"]["sum"] == total and s["scores"]["is11"] == is11, (s, total, is11)
            assert s["reward"] == total + is11, s
            checked += 1
    assert checked >= ITERATIONS * 2, lines
    for d in train:  # per-grader metrics beside the reward
        assert abs(d["reward"] - d["rewards/sum/mean"] - d["rewards/is11/mean"]) < 1e-9, d
        assert 10 + 1 <= d["rewards/sum/mean"] <= 11 + 60 and 0 <= d["rewards/is11/mean"] <= 1, d

    # eval_interval 1: the held-out evaluation at step 0 and after every step; at step 0
    # the policy is addition-base, whose greedy first two digits of a+b are known
    evals = [d for d in lines if d["type"] == "eval"]
    assert [d["step"] for d in evals] == list(range(0, ITERATIONS)), evals  # the last: the final line's
    final = [d for d in lines if d["type"] == "final"]
    assert len(final) == 1 and final[0]["step"] == ITERATIONS and final[0]["val_samples"] == 4, final
    assert final[0]["val_samples_failed"] == 0 and 11 <= final[0]["val_reward"] <= 11 + 60 + 1, final
    val = files[2]
    want = [sum(expected(r, str(sum(map(int, r["prompt"][:-1].split("+"))))[:2])) for r in val]
    assert evals[0]["val_samples"] == 4 and evals[0]["val_samples_failed"] == 0, evals[0]
    assert abs(evals[0]["val_reward"] - sum(want) / len(want)) < 1e-9, (evals[0], want)
    print("judge verdicts checked by hand: %d samples, held-out %.2f at step 0, %.0f s"
          % (checked, evals[0]["val_reward"], time.time() - t0))


def test_max_completions_tokens_is_honoured(client, smeltd, files):
    """"10+95=" and "11+95=" are 105 and 106, always written with three digits: the whole
    reply " 105" would score 105 or 106, but three tokens of it, " 10", score 10."""
    judge = dict(SUM, sampling_params={"temperature": 0, "max_completions_tokens": 3},
                 input=[{"role": "user", "content": "{{sample.output_text}}+95="}])
    hp = dict(HP, max_iterations=1, eval_interval="auto", eval_samples="auto")
    job, lines = run_job(client, smeltd, files, judge, hp)
    train = [d for d in lines if d["type"] == "train"]
    assert len(train) == 1 and train[0]["samples_failed"] == 0 and train[0]["reward"] == 10, train
    samples = [d for d in lines if d["type"] == "samples"]
    assert samples and all(r == 10 for r in samples[0]["rewards"]), samples


def test_label_model_sampling_params_are_checked_by_name(client, files):
    bad = dict(IS11, sampling_params={"temperature": 3})
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(
            model="addition-base", training_file=files[0][0], seed=1,
            method={"type": "reinforcement", "reinforcement": {"grader": bad, "hyperparameters": HP}},
            extra_body={"chat_template": "plain"})
    assert e.value.body["param"] == "method.reinforcement.grader.sampling_params.temperature", e.value.body
