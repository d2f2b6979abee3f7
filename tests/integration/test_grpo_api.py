"""GRPO jobs through the API, in plain HTTP against a real smeltd and trainer (the method
is smelt's own: `{"type": "grpo", "grpo": {"hyperparameters": {...}, "reward": {...}}}`):
a prompts file is uploaded, the job runs its iterations with the rollout engine in the
trainer's process, its events carry the reward and the rollout/trainer logprob mismatch
every iteration and the held-out reward at each evaluation; the same job in the split
placement (smelt-rollout workers started by the trainer, new weights pushed to them
after every iteration) succeeds with the weight sync's bytes in its events; and a bad
reward spec, an RL hyperparameter out of range or a file of another kind is refused
with the request's path in `param`."""
import json
import os
import shutil
import tempfile

import pytest
from conftest import TRAIN_FILE, VAL_FILE, Smeltd, make_models_dir, prompts_rows

J = "/v1/fine_tuning/jobs"
REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "full"}},
                        {"type": "length_penalty", "max_tokens": 4, "cache_tokens": 1, "weight": 0.5}]}


@pytest.fixture(scope="module")
def smeltd():
    """This module's server offers 3 CPU slots: a split job takes one for its trainer and
    one per rollout worker."""
    tmp = tempfile.mkdtemp(prefix="smelt-it-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    s = Smeltd(data_dir, make_models_dir(tmp), ["--cpu-slots", "3"]).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def upload(smeltd, content, name):
    status, f = smeltd.upload_bytes(content, name)
    assert status == 200 and f["status"] == "processed", f
    assert f["validation"]["kind"] == "prompts", f
    return f["id"]


def grpo_request(train, val, hp=None, reward=None):
    return {"model": "tiny", "training_file": train, "validation_file": val, "seed": 5, "model_init": "random",
            "method": {"type": "grpo", "grpo": {
                "hyperparameters": hp if hp is not None else {
                    "batch_size": 4, "num_generations": 4, "max_new_tokens": 4, "max_iterations": 3,
                    "learning_rate_multiplier": 10, "kv_memory_mb": 4, "loss_type": "grpo", "beta": 0},
                "reward": reward if reward is not None else REWARD}},
            "eval": {"every_steps": 2, "accuracy_examples": 8}}


def test_grpo_job_runs_and_reports_rewards(smeltd):
    train = upload(smeltd, prompts_rows(TRAIN_FILE, 32), "grpo_train.jsonl")
    val = upload(smeltd, prompts_rows(VAL_FILE, 8), "grpo_val.jsonl")
    status, job = smeltd.request("POST", J, grpo_request(train, val))
    assert status == 200, job
    assert job["method"]["type"] == "grpo", job
    assert job["method"]["grpo"]["reward"]["verifiers"][1]["type"] == "length_penalty", job
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    assert raw["spec"]["type"] == "grpo", raw
    assert raw["spec"]["rl"]["num_generations"] == 4 and raw["spec"]["rl"]["loss_type"] == "grpo", raw
    assert "num_generations" not in raw["spec"]["hyperparameters"], raw

    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    assert status == 200, events
    events = events["data"]
    steps = [e for e in events if e["type"] == "metrics" and e.get("data") and "train_loss" in e["data"]]
    assert len(steps) == 3, [e["message"] for e in events]
    for e in steps:
        d = e["data"]
        assert -0.5 <= d["reward"] <= 1 and d["samples"] == 16, d  # exact match + 0.5 x length penalty
        assert d["rollout/logprob_diff_mean"] < 1e-3, d  # the engine and the trainer run the same kernels
        assert "reward=" in e["message"], e["message"]
    evals = [e for e in events if e.get("data") and "val_reward" in e["data"] and e["message"].startswith("Step")]
    assert sorted(e["data"]["step"] for e in evals) == [0, 2], [e["message"] for e in evals]
    assert all("validation reward=" in e["message"] and "accuracy=" in e["message"] for e in evals), evals
    finished = [e["message"] for e in events if e["message"].startswith("Training finished")]
    assert finished and "validation reward=" in finished[0], finished


def train_lines(smeltd, job_id):
    with open(os.path.join(smeltd.data_dir, "jobs", job_id, "metrics.jsonl"), encoding="utf-8") as f:
        return [line for line in map(json.loads, f) if line.get("type") == "train"]


@pytest.mark.parametrize("weight_sync,ranks", [(None, 1), ("zmq", 1), (None, 2)])
def test_grpo_job_in_split_placement_syncs_its_workers(smeltd, weight_sync, ranks):
    """The default transport is the broadcast (comm/'s Gloo group of the trainer and its
    workers); "zmq" sends the buckets as messages. Either way every iteration moves the
    model, and the train lines say how and how long it took. With two trainer ranks
    (docs/distributed.md) rank 0 generates through the one worker and pushes to it."""
    train = upload(smeltd, prompts_rows(TRAIN_FILE, 16), "grpo_split_train.jsonl")
    val = upload(smeltd, prompts_rows(VAL_FILE, 4), "grpo_split_val.jsonl")
    hp = {"batch_size": 4, "num_generations": 4, "max_new_tokens": 4, "max_iterations": 3,
          "learning_rate_multiplier": 10, "kv_memory_mb": 4}
    if weight_sync:
        hp["weight_sync"] = weight_sync
    workers = 3 - ranks
    body = grpo_request(train, val, hp=hp)
    body["resources"] = {"trainer": {"devices": ranks}, "rollout": {"devices": workers}}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    assert job["resources"] == {"devices": 3, "trainer": {"devices": ranks}, "rollout": {"devices": workers}}, job
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    assert raw["spec"]["rl"]["placement"] == "split" and raw["spec"]["rl"]["rollout_workers"] == workers, raw
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    started = [e["message"] for e in events["data"] if e["message"].startswith("Job started")]
    assert started and started[0].endswith("devices 0,1,2"), started  # gang-allocated: trainer ranks + workers
    if ranks > 1:
        assert any("%d ranks, ZeRO stage" % ranks in e["message"] for e in events["data"]), events["data"]
    with open(os.path.join(smeltd.data_dir, "jobs", job["id"], "rollout-%d.log" % (workers - 1)),
              encoding="utf-8") as f:
        log = f.read()
        # the job's keys reached the worker (through rank 0 with two ranks): CURVE on its channel
        assert "serving on" in log and "curve: encrypted" in log, log
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    assert status == 200, events
    steps = [e["data"] for e in events["data"]
             if e["type"] == "metrics" and e.get("data") and "train_loss" in e["data"]]
    assert len(steps) == 3, events["data"]
    for d in steps:
        # model_init random: the workers start on a copy of the trainer's weights, and
        # every iteration pushes the whole model (f32) to each of them
        assert d["sync_bytes"] > 0 and d["time/sync_s"] > 0, d
        assert d["policy_version"] == d["step"] and d["samples"] == 16, d
        assert d["rollout/logprob_diff_mean"] < 1e-3, d
    transport = weight_sync or "broadcast"
    lines = train_lines(smeltd, job["id"])
    assert [line["sync_transport"] for line in lines] == [transport] * 3, lines
    assert all(line["sync_bytes"] > 0 and line["time/sync_s"] > 0 for line in lines), lines
    print("GRPO split, weight sync by %s: %s bytes per worker in %s ms" % (
        transport, lines[0]["sync_bytes"], ", ".join("%.1f" % (1000 * line["time/sync_s"]) for line in lines)))
    for i in range(workers):
        with open(os.path.join(smeltd.data_dir, "jobs", job["id"], "rollout-%d.log" % i), encoding="utf-8") as f:
            assert f.read().count("in use (by %s)" % transport) == 3, i
    assert not os.path.exists(os.path.join(smeltd.data_dir, "jobs", job["id"], "weightsync-rendezvous"))


def test_ppo_job_runs_with_its_critic(smeltd):
    """method ppo: the same prompts and reward, a critic (GAE) instead of groups; its
    numbers in the events, the critic saved beside the model; critic_model names a
    model as `model` does, never a path."""
    train = upload(smeltd, prompts_rows(TRAIN_FILE, 16), "ppo_train.jsonl")
    val = upload(smeltd, prompts_rows(VAL_FILE, 4), "ppo_val.jsonl")
    body = grpo_request(train, val, hp={"batch_size": 4, "max_new_tokens": 4, "max_iterations": 3,
                                        "learning_rate_multiplier": 10, "critic_learning_rate": 1e-3,
                                        "kv_memory_mb": 4})
    body["method"] = {"type": "ppo", "ppo": body["method"]["grpo"]}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    assert job["method"]["type"] == "ppo", job
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    assert raw["spec"]["type"] == "ppo" and raw["spec"]["rl"]["critic_learning_rate"] == 1e-3, raw["spec"]
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    steps = [e["data"] for e in events["data"] if e["type"] == "metrics" and e.get("data") and "train_loss" in e["data"]]
    assert len(steps) == 3, events["data"]
    for d in steps:  # one sample per prompt (PPO has no groups), the critic's numbers beside the reward
        assert d["samples"] == 4 and "critic/vf_loss" in d and "critic/vpred_mean" in d, d
    with open(os.path.join(smeltd.data_dir, "jobs", job["id"], "output", "critic", "config.json")) as f:
        assert "ForSequenceClassification" in f.read()
    body["method"]["ppo"]["hyperparameters"]["critic_model"] = "no-such-model"
    refused(smeltd, body, "method.ppo.hyperparameters.critic_model", "no such model")
    body["method"]["ppo"]["hyperparameters"]["critic_model"] = "/etc"
    refused(smeltd, body, "method.ppo.hyperparameters.critic_model")
    body["method"]["ppo"]["hyperparameters"].pop("critic_model")
    body["method"]["ppo"]["hyperparameters"]["dynamic_sampling"] = True
    refused(smeltd, body, "method.ppo.hyperparameters.dynamic_sampling", "groups")


def refused(smeltd, body, param, *words):
    status, err = smeltd.request("POST", J, body)
    assert status == 400, err
    assert err["error"]["param"] == param, err
    for w in words:
        assert w in err["error"]["message"], err
    return err


def test_grpo_bad_requests_name_the_field(smeltd):
    train = upload(smeltd, prompts_rows(TRAIN_FILE, 8), "grpo_bad_train.jsonl")
    val = upload(smeltd, prompts_rows(VAL_FILE, 4), "grpo_bad_val.jsonl")
    refused(smeltd, grpo_request(train, val, reward={"verifiers": [{"type": "telepathy"}]}),
            "method.grpo.reward.verifiers[0].type", "telepathy")
    refused(smeltd, grpo_request(train, val, reward={}), "method.grpo.reward.verifiers")
    body = grpo_request(train, val)
    del body["method"]["grpo"]["reward"]
    refused(smeltd, body, "method.grpo.reward", "reward")
    refused(smeltd, grpo_request(train, val, hp={"num_generations": 1}),
            "method.grpo.hyperparameters.num_generations")
    refused(smeltd, grpo_request(train, val, hp={"placement": "split", "rollout_workers": 0}),
            "method.grpo.hyperparameters.rollout_workers")
    refused(smeltd, grpo_request(train, val, hp={"placement": "elsewhere"}), "method.grpo.hyperparameters.placement")
    refused(smeltd, grpo_request(train, val, hp={"telepathy": 1}), "method.grpo.hyperparameters.telepathy")
    refused(smeltd, grpo_request(train, val, hp={"placement": "split", "rollout_workers": 3}), "resources",
            "4 devices", "has 3", "--cpu-slots")
    body = grpo_request(train, val)
    body["resources"] = {"trainer": {"devices": 1}, "rollout": {"devices": 1}}
    body["method"]["grpo"]["hyperparameters"]["placement"] = "colocated"
    refused(smeltd, body, "resources.rollout", "split")
    body["method"]["grpo"]["hyperparameters"].pop("placement")
    body["method"]["grpo"]["hyperparameters"]["rollout_workers"] = 2
    refused(smeltd, body, "resources.rollout", "rollout_workers")
    body = grpo_request(train, val)
    body["resources"] = {"trainer": {"devices": 3}, "rollout": {"devices": 1}}  # 4 devices: more than the agent's 3
    refused(smeltd, body, "resources", "4 devices", "has 3")
    body["resources"] = {"rollout": {"devices": 0}}
    refused(smeltd, body, "resources.rollout.devices")
    body["resources"] = {"rollout": {"gpus": 1}}
    refused(smeltd, body, "resources.rollout", "gpus")
    body["resources"] = {"devices": 1, "rollout": {"devices": 1}}
    refused(smeltd, body, "resources.devices", "2 device")
    status, sft = smeltd.upload(TRAIN_FILE)
    assert status == 200, sft
    refused(smeltd, grpo_request(sft["id"], val), "training_file", "prompts")
    body = grpo_request(train, val)
    body["method"]["grpo"]["grader"] = {}
    refused(smeltd, body, "method.grpo", "grader")
