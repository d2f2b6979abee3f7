"""The trainer owns the job spec; the API only maps OpenAI's names onto it. Through a real
smeltd: "auto" is the trainer's default, the trainer's own hyperparameters are accepted
wherever the request puts them, and a refusal carries the trainer's error with a `param`
naming the request's field (also for "missing required field" and nested sections, which
the old message parsing lost). The exhaustive walk over every field of the trainer's
table is the C test tests/unit/test_jobs.c."""
import copy

import pytest

J = "/v1/fine_tuning/jobs"
WHERES = ["hyperparameters", "method.supervised.hyperparameters"]


def body_with(file_id, where="hyperparameters", hp=None, **extra):
    body = {"model": "tiny", "model_init": "random", "training_file": file_id, "data": {"max_seq_len": 32}}
    hp = dict(hp or {})
    if where == "hyperparameters":
        body["hyperparameters"] = hp
    else:
        body["method"] = {"type": "supervised", "supervised": {"hyperparameters": hp}}
    body.update(copy.deepcopy(extra))
    return body


def refusal(smeltd, body):
    status, resp = smeltd.request("POST", J, body)
    assert status == 400, (status, resp)
    return resp["error"]


def test_auto_is_the_trainers_default(smeltd, train_file_id):
    status, job = smeltd.request("POST", J, body_with(train_file_id, hp={
        "n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto", "max_steps": 1}))
    assert status == 200, job
    try:
        # The trainer's defaults (trainer/job_spec.c): epochs 1, batch_size 8, the base rate.
        assert job["hyperparameters"] == {"n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 1.0}
        assert "epochs" not in job["spec"]["hyperparameters"], job["spec"]
    finally:
        smeltd.request("POST", J + "/" + job["id"] + "/cancel")


@pytest.mark.parametrize("where", WHERES)
def test_trainer_names_pass_through(smeltd, train_file_id, where):
    hp = {"epochs": 2, "warmup_steps": 3, "recompute": True, "lr_schedule": "linear", "max_steps": 1}
    status, job = smeltd.request("POST", J, body_with(train_file_id, where, hp))
    assert status == 200, job
    try:
        assert job["hyperparameters"]["n_epochs"] == 2
        for k, v in hp.items():
            assert job["spec"]["hyperparameters"][k] == v
    finally:
        smeltd.request("POST", J + "/" + job["id"] + "/cancel")


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("name, value, field, says", [
    ("n_epochs", 0, "epochs", "[1, 1000]"),
    ("n_epochs", 1001, "epochs", "[1, 1000]"),
    ("epochs", 0, "epochs", "[1, 1000]"),
    ("batch_size", 0, "batch_size", "[1, 65536]"),
    ("learning_rate_multiplier", 1e9, "learning_rate", "[0, 10]"),
    ("warmup_steps", -1, "warmup_steps", "outside the allowed range"),
    ("grad_accum", 5000, "grad_accum", "[1, 4096]"),
    ("beta2", 1.0, "beta2", "outside the allowed range"),
    ("learning_rate", 0, "learning_rate", "(0, 10]"),
    ("recompute", "yes", "recompute", "true or false"),
    ("lr_schedule", "step", "lr_schedule", "lr_schedule"),
])
def test_refusals_are_the_trainers_with_the_request_param(smeltd, train_file_id, where, name, value, field, says):
    error = refusal(smeltd, body_with(train_file_id, where, {name: value}))
    assert error["param"] == where + "." + name, error
    assert says in error["message"], error
    assert field in error["message"], error


@pytest.mark.parametrize("extra, param", [
    ({"data": {"train": None}}, "data.train"),          # "missing required field"
    ({"data": {"max_seq_len": 1}}, "data.max_seq_len"),
    ({"data": {"loss_on": "nothing"}}, "data.loss_on"),
    ({"lora": {"rank": 0}, "model_init": "pretrained"}, "lora.rank"),
    ({"lora": {"rnak": 4}, "model_init": "pretrained"}, "lora.rnak"),
    ({"checkpoint": {"keep_last": -1}}, "checkpoint.keep_last"),
    ({"save_dtype": "f8"}, "save_dtype"),
])
def test_nested_and_missing_fields_have_their_param(smeltd, train_file_id, extra, param):
    body = body_with(train_file_id)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(body.get(k), dict):
            body[k].update(v)
        else:
            body[k] = v
    error = refusal(smeltd, body)
    assert error["param"] == param, error


def test_openai_name_and_trainer_field_not_both(smeltd, train_file_id):
    error = refusal(smeltd, body_with(train_file_id, hp={"n_epochs": 2, "epochs": 3}))
    assert error["param"] == "hyperparameters.n_epochs", error


def test_schedule_template_names_the_trainer_field(smeltd, train_file_id):
    job = body_with(train_file_id, "method.supervised.hyperparameters", {"warmup_steps": -1})
    status, resp = smeltd.request("POST", "/v1/fine_tuning/schedules",
                                  {"cron": "0 0 1 1 *", "job": job, "suspended": True})
    assert status == 400, resp
    assert resp["error"]["param"] == "job.method.supervised.hyperparameters.warmup_steps", resp
