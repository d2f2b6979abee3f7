"""Reward-model jobs through the API, in plain HTTP against a real smeltd and trainer (the
method is smelt's own, so no OpenAI client types it): a preference file with a margin
column is uploaded, a `{"type": "reward_model", ...}` job runs to the end, its events
carry the preference accuracy and margin, and its output is listed in /v1/models with
head "reward"."""
import json

from test_dpo_api import preference_rows

J = "/v1/fine_tuning/jobs"


def with_margins(rows):
    """The rows with TRL's optional margin column on every other one."""
    lines = [json.loads(line) for line in rows.decode().splitlines()]
    for i, row in enumerate(lines):
        if i % 2:
            row["margin"] = 0.5
    return "".join(json.dumps(r) + "\n" for r in lines).encode()


def upload(smeltd, content, name):
    status, f = smeltd.upload_bytes(content, name)
    assert status == 200 and f["status"] == "processed", f
    return f["id"]


def test_reward_model_job_runs_and_registers_a_reward_head(smeltd):
    train = upload(smeltd, with_margins(preference_rows(64, 0)), "rm_train.jsonl")
    val = upload(smeltd, preference_rows(16, 1000), "rm_val.jsonl")
    status, job = smeltd.request("POST", J, {
        "model": "tiny", "training_file": train, "validation_file": val, "seed": 3, "suffix": "rm",
        "method": {"type": "reward_model", "reward_model": {"hyperparameters": {
            "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 10, "max_steps": 6,
            "center_rewards_coefficient": 0.01}}},
        "model_init": "random", "data": {"max_seq_len": 32}, "eval": {"every_steps": 3}})
    assert status == 200, job
    assert job["method"]["type"] == "reward_model", job
    assert job["method"]["reward_model"]["hyperparameters"]["n_epochs"] == 1, job
    status, raw = smeltd.request("GET", J + "/" + job["id"])
    assert raw["spec"]["type"] == "reward_model", raw
    assert raw["spec"]["hyperparameters"]["center_rewards_coefficient"] == 0.01, raw

    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    assert status == 200, events
    events = events["data"]
    steps = [e for e in events if e["type"] == "metrics" and e.get("data") and "train_loss" in e["data"]]
    assert steps, [e["message"] for e in events]
    for e in steps:
        assert isinstance(e["data"].get("rewards/accuracies"), (int, float)), e["data"]
        assert isinstance(e["data"].get("rewards/margins"), (int, float)), e["data"]
        assert "logps/chosen" not in e["data"], e["data"]
        assert "preference accuracy=" in e["message"] and "reward margin=" in e["message"], e["message"]
    finished = [e["message"] for e in events if e["message"].startswith("Training finished")]
    assert finished and "preference accuracy=" in finished[0], finished

    status, models = smeltd.request("GET", "/v1/models")
    assert status == 200, models
    mine = [m for m in models["data"] if m["id"] == job["fine_tuned_model"]]
    assert mine and mine[0]["head"] == "reward", (job["fine_tuned_model"], models)
