"""The official `openai` Python package, pointed at smeltd, runs the whole fine-tuning flow
unchanged: upload, create, follow events to the end, list checkpoints, and train a second
job on the first job's fine-tuned model."""
import os
import time

import openai
import pytest

from conftest import ADMIN_KEY, TRAIN_FILE, VAL_FILE


@pytest.fixture(scope="module")
def client(smeltd):
    return openai.OpenAI(base_url=smeltd.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def wait_done(client, job_id, timeout=180):
    deadline = time.time() + timeout
    seen = {}
    while time.time() < deadline:
        for ev in client.fine_tuning.jobs.list_events(job_id, limit=100).data:
            seen[ev.id] = ev
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            for ev in client.fine_tuning.jobs.list_events(job_id, limit=1000).data:
                seen[ev.id] = ev
            return job, seen
        time.sleep(0.2)
    raise AssertionError("job %s did not finish" % job_id)


def test_upload_create_follow_checkpoints_and_chain(client, smeltd):
    with open(TRAIN_FILE, "rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    assert train.status == "processed"
    assert train.bytes == os.path.getsize(TRAIN_FILE)
    with open(VAL_FILE, "rb") as f:
        val = client.files.create(file=f, purpose="fine-tune")
    assert client.files.retrieve(train.id).filename == "addition_train.jsonl"
    assert train.id in [x.id for x in client.files.list().data]

    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id, validation_file=val.id, suffix="addition", seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 1, "batch_size": 16, "max_steps": 30, "learning_rate": 0.003}}},
        extra_body={"model_init": "random", "data": {"max_seq_len": 32}, "checkpoint": {"every_steps": 10}},
        metadata={"purpose": "integration-test"})
    assert job.status in ("queued", "running")
    assert job.seed == 7
    assert job.hyperparameters.n_epochs == 1
    assert job.metadata == {"purpose": "integration-test"}

    job, events = wait_done(client, job.id)
    assert job.status == "succeeded", (job, smeltd.read_log())
    assert job.fine_tuned_model and job.fine_tuned_model.startswith("ft:tiny:addition:")
    messages = [e.message for e in events.values()]
    assert any(m.startswith("Step ") and "training loss" in m for m in messages)
    assert any("successfully completed" in m for m in messages)
    assert any(e.type == "metrics" for e in events.values())

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert len(checkpoints) >= 2  # every 10 steps and the end
    steps = [c.step_number for c in checkpoints]
    assert steps == sorted(steps, reverse=True)
    assert all(c.fine_tuning_job_id == job.id for c in checkpoints)

    models = [m.id for m in client.models.list().data]
    assert "tiny" in models and job.fine_tuned_model in models

    # the second job starts from the first job's output
    job2 = client.fine_tuning.jobs.create(
        model=job.fine_tuned_model, training_file=train.id,
        extra_body={"data": {"max_seq_len": 32},
                    "hyperparameters": {"n_epochs": 1, "batch_size": 16, "max_steps": 5}})
    job2, _ = wait_done(client, job2.id)
    assert job2.status == "succeeded", (job2, smeltd.read_log())
    assert job2.model == job.fine_tuned_model
    assert job2.fine_tuned_model.startswith("ft:tiny:smelt:")

    listed = client.fine_tuning.jobs.list(limit=10).data
    assert [j.id for j in listed][:2] == [job2.id, job.id]


def test_errors_raise_typed_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-doesnotexist")
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="tiny", training_file="file-nope")
    assert e.value.body["param"] == "training_file"
    bad = openai.OpenAI(base_url=client.base_url, api_key="sk-wrong-key-123456", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.files.list()
