"""DPO through the API, with the official `openai` client against a real smeltd and
trainer: a preference file is uploaded, a job with OpenAI's DPO method shape
(`method: {"type": "dpo", "dpo": {"hyperparameters": {"beta": ...}}}`, smelt's own DPO
hyperparameters beside OpenAI's) runs to the end, and its events carry the preference
metrics under TRL's names. A file of the wrong kind for the method is refused at create
time, naming the file and its kind. The field-by-field checks are tests/unit/test_jobs.c."""
import json
import time

import openai
import pytest

from conftest import ADMIN_KEY, TRAIN_FILE

J = "/v1/fine_tuning/jobs"
PREFERENCE_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                      "logps/chosen", "logps/rejected")


def preference_rows(n, offset):
    """Addition pairs (examples/data's task): the right sum is chosen, a near miss rejected."""
    rows = []
    with open(TRAIN_FILE) as f:
        for i, line in enumerate(f):
            if i < offset:
                continue
            if len(rows) == n:
                break
            row = json.loads(line)
            wrong = "%03d" % ((int(row["completion"]) + 1 + i % 9) % 1000)
            rows.append({"prompt": row["prompt"], "chosen": row["completion"], "rejected": wrong})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def client(smeltd):
    return openai.OpenAI(base_url=smeltd.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


@pytest.fixture(scope="module")
def pref_files(client):
    train = client.files.create(file=("pref_train.jsonl", preference_rows(64, 0)), purpose="fine-tune")
    val = client.files.create(file=("pref_val.jsonl", preference_rows(16, 1000)), purpose="fine-tune")
    return train, val


@pytest.fixture(scope="module")
def sft_file(client):
    with open(TRAIN_FILE, "rb") as f:
        return client.files.create(file=f, purpose="fine-tune")


def wait_done(client, job_id, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job, client.fine_tuning.jobs.list_events(job_id, limit=1000).data
        time.sleep(0.25)
    raise AssertionError("job %s did not finish" % job_id)


def test_preference_upload_is_validated(smeltd, pref_files):
    train, _ = pref_files
    assert train.status == "processed"
    status, f = smeltd.request("GET", "/v1/files/" + train.id)
    assert status == 200 and f["validation"]["kind"] == "preference", f
    assert f["validation"]["examples"] == 64


def test_dpo_job_runs_and_reports_preference_metrics(client, smeltd, pref_files):
    train, val = pref_files
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id, validation_file=val.id, seed=3,
        method={"type": "dpo", "dpo": {"hyperparameters": {
            "beta": 0.1, "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 30,
            "max_steps": 6, "loss_type": "sigmoid"}}},
        extra_body={"model_init": "random", "data": {"max_seq_len": 32}, "eval": {"every_steps": 3}})
    assert job.method.type == "dpo"
    hp = job.method.dpo.hyperparameters
    assert hp.beta == 0.1 and hp.n_epochs == 1 and hp.batch_size == 8 and hp.learning_rate_multiplier == 30
    status, raw = smeltd.request("GET", J + "/" + job.id)
    assert raw["spec"]["type"] == "dpo" and raw["spec"]["hyperparameters"]["loss_type"] == "sigmoid", raw

    job, events = wait_done(client, job.id)
    assert job.status == "succeeded", (job, smeltd.read_log())
    steps = [e for e in events if e.type == "metrics" and e.data and "train_loss" in e.data]
    assert steps, [e.message for e in events]
    for e in steps:
        for name in ("rewards/margins", "rewards/accuracies"):
            assert isinstance(e.data.get(name), (int, float)), e.data
        assert "preference accuracy=" in e.message and "reward margin=" in e.message, e.message
    # evaluations: the trainer's names after val_, as val_loss
    evals = [e for e in events if e.type == "metrics" and e.data and "valid_loss" in e.data]
    assert evals and all("val_rewards/accuracies" in e.data and "val_rewards/margins" in e.data for e in evals), \
        [e.data for e in evals]
    assert all("preference accuracy=" in e.message for e in evals), [e.message for e in evals]
    finished = [e.message for e in events if e.message.startswith("Training finished")]
    assert finished and "preference accuracy=" in finished[0] and "reward margin=" in finished[0], finished

    # the trainer's lines as written, DPO metrics included
    status, page = smeltd.request("GET", J + "/" + job.id + "/metrics?limit=1000")
    assert status == 200, page
    train_rows = [r for r in page["data"] if r["type"] == "train"]
    assert len(train_rows) == 6
    assert all(all(name in r["data"] for name in PREFERENCE_METRICS) for r in train_rows), train_rows[0]
    eval_rows = [r for r in page["data"] if r["type"] == "eval"]
    assert eval_rows and all("val_" + name in r["data"] for name in PREFERENCE_METRICS for r in eval_rows)

    model = client.models.retrieve(job.fine_tuned_model)
    assert model.kind == "full" and model.head == "lm", model


def test_auto_beta_is_the_trainers_default(client, pref_files):
    train, _ = pref_files
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": "auto", "max_steps": 1}}},
        extra_body={"model_init": "random", "data": {"max_seq_len": 32}})
    try:
        assert job.method.dpo.hyperparameters.beta == 0.1  # trainer/job_spec.c's default
        assert "beta" not in job.to_dict()["spec"]["hyperparameters"]
    finally:
        client.fine_tuning.jobs.cancel(job.id)


@pytest.mark.parametrize("method, file_kind, param, says", [
    ("dpo", "sft", "training_file", "holds sft rows; a dpo job needs preference rows"),
    ("supervised", "preference", "training_file", "holds preference rows; a supervised job needs SFT rows"),
    ("dpo", "sft-validation", "validation_file", "holds sft rows"),
])
def test_a_file_of_the_wrong_kind_is_refused(client, pref_files, sft_file, method, file_kind, param, says):
    train, _ = pref_files
    files = {"sft": (sft_file.id, None), "preference": (train.id, None),
             "sft-validation": (train.id, sft_file.id)}[file_kind]
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="tiny", training_file=files[0], validation_file=files[1],
                                       method={"type": method}, extra_body={"model_init": "random"})
    assert e.value.status_code == 400
    assert e.value.param == param
    assert says in e.value.message
    assert (files[1] if param == "validation_file" else files[0]) in e.value.message


@pytest.mark.parametrize("method, param", [
    ({"type": "dpo", "dpo": {"hyperparameters": {"beta": 0}}}, "method.dpo.hyperparameters.beta"),
    ({"type": "dpo", "dpo": {"hyperparameters": {"label_smoothing": 0.5}}},
     "method.dpo.hyperparameters.label_smoothing"),
    ({"type": "dpo", "supervised": {"hyperparameters": {}}}, "method.supervised"),
    ({"type": "reward_model", "reward_model": {"hyperparameters": {"center_rewards_coefficient": -1}}},
     "method.reward_model.hyperparameters.center_rewards_coefficient"),
    ({"type": "ppo"}, "method.type"),
    ({"type": "grpo"}, "method.type"),
])
def test_refusals_name_the_request_path(client, pref_files, method, param):
    train, _ = pref_files
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="tiny", training_file=train.id, method=method,
                                       extra_body={"model_init": "random"})
    assert e.value.param == param, e.value.message
