"""DPO through the API, with the official `openai` client against a real smeltd and
trainer: a preference file is uploaded, a job with OpenAI's DPO method shape
(`method: {"type": "dpo", "dpo": {"hyperparameters": {"beta": ...}}}`, smelt's own DPO
hyperparameters beside OpenAI's) runs to the end, and its events carry the preference
metrics under TRL's names. A file of the wrong kind for the method is refused at create
time, naming the file and its kind. Training helps: on held-out pairs the implicit
reward's accuracy and margin end clearly above the first evaluation's. Bad rows are
refused naming the line and field (at upload, or when the trainer tokenizes them). The
field-by-field checks are tests/unit/test_jobs.c."""
import json
import time

import openai
import pytest

from conftest import ADMIN_KEY, TRAIN_FILE, VAL_FILE

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


def near_miss_pairs(path, n):
    """The first n addition rows of path (examples/data's task) as pairs: chosen the right
    sum, rejected the same sum with its hundreds digit moved by one the only way that keeps
    it a digit a sum of two 2-digit numbers can have (023 -> 123, 118 -> 018). That is a
    near miss of examples/make_preference.py's kind, in the digit that says whether the sum
    reaches 100, which the random tiny model learns from the operands within ~100 steps;
    the examples' near misses in the other digits need the whole addition table, which DPO
    from random weights does not learn in a test's time (held-out accuracy stays near 0.6,
    the share a model gets from the answer's format alone)."""
    rows = []
    with open(path) as f:
        for line in f:
            if len(rows) == n:
                break
            row = json.loads(line)
            total = int(row["completion"])
            rows.append({"prompt": row["prompt"], "chosen": row["completion"],
                         "rejected": "%03d" % (total + 100 if total < 100 else total - 100)})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def first_and_last_eval(events):
    """(the first evaluation's data, the data of the 'Training finished' event), events as
    dicts: both hold the validation preference metrics (val_rewards/accuracies, ...)."""
    evals = sorted((e for e in events if e["type"] == "metrics" and e.get("data") and "valid_loss" in e["data"]),
                   key=lambda e: e["data"]["step"])
    finished = [e for e in events if e["message"].startswith("Training finished")]
    assert evals and finished, [e["message"] for e in events]
    return evals[0]["data"], finished[0]["data"]


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


def test_dpo_raises_held_out_preference_accuracy_and_margin(client, smeltd):
    """DPO from random weights on 1,024 near-miss pairs, evaluated on 200 pairs whose
    prompts are in no training row (examples/data's validation file). The first evaluation
    (step 4, in the warm-up) and the end are compared: the numbers are printed and the end
    must be clearly ahead on both. About 30 s on the 2-core VM at a load average of 8."""
    train = client.files.create(file=("learn_train.jsonl", near_miss_pairs(TRAIN_FILE, 1024)), purpose="fine-tune")
    val = client.files.create(file=("learn_val.jsonl", near_miss_pairs(VAL_FILE, 200)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id, validation_file=val.id, seed=3,
        method={"type": "dpo", "dpo": {"hyperparameters": {
            "beta": 0.1, "batch_size": 64, "learning_rate_multiplier": 30, "max_steps": 96, "warmup_steps": 8}}},
        extra_body={"model_init": "random", "data": {"max_seq_len": 32}, "eval": {"every_steps": 4}})
    job, events = wait_done(client, job.id)
    assert job.status == "succeeded", (job, smeltd.read_log())
    first, last = first_and_last_eval([e.to_dict() for e in events])
    acc0, acc1 = first["val_rewards/accuracies"], last["val_rewards/accuracies"]
    margin0, margin1 = first["val_rewards/margins"], last["val_rewards/margins"]
    print("DPO held-out (200 pairs): preference accuracy %.3f at step %d -> %.3f at step %d; "
          "reward margin %.3f -> %.3f" % (acc0, first["step"], acc1, last["step"], margin0, margin1))
    assert first["step"] == 4 and last["step"] == 96, (first, last)
    # Measured (seeds 1, 3, 5): accuracy 0.51-0.81 -> 0.975-0.995, margin 0.05-0.21 -> 2.7-3.3.
    assert acc1 >= 0.9 and acc1 >= acc0 + 0.1, (acc0, acc1)
    assert margin1 >= margin0 + 1.0 and margin1 >= 3 * margin0, (margin0, margin1)


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
    ({"type": "ppo"}, "training_file"),
    ({"type": "grpo"}, "training_file"),
])
def test_refusals_name_the_request_path(client, pref_files, method, param):
    train, _ = pref_files
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="tiny", training_file=train.id, method=method,
                                       extra_body={"model_init": "random"})
    assert e.value.param == param, e.value.message


def test_bad_preference_rows_are_refused_naming_line_and_field(smeltd, client):
    """A pair whose sides are the same and empty responses (text, or an assistant turn
    with no content): the upload is kept with a report naming each line and field, and a
    job given the file is refused naming the first line (tests/unit/test_datasets.c holds
    the row-by-row checks)."""
    rows = [{"prompt": "22+01=", "chosen": "023", "rejected": "023"},
            {"prompt": "22+02=", "chosen": "", "rejected": "124"},
            {"prompt": "22+03=", "chosen": "025", "rejected": " "},
            {"prompt": [{"role": "user", "content": "22+04="}],
             "chosen": [{"role": "assistant", "content": ""}], "rejected": [{"role": "assistant", "content": "126"}]},
            {"prompt": "22+05=", "chosen": "027", "rejected": "127"}]
    status, f = smeltd.upload_bytes("".join(json.dumps(r) + "\n" for r in rows).encode(), "bad_pref.jsonl")
    assert status == 200 and f["status"] == "error", f
    errors = [(e["line"], e["field"], e["message"]) for e in f["validation"]["errors"]]
    assert errors == [(1, "rejected", "identical to chosen (a preference pair must differ)"),
                      (2, "chosen", "empty response"),
                      (3, "rejected", "empty response"),
                      (4, "chosen[0].content", "empty assistant turn")], f["validation"]
    assert f["validation"]["kind"] == "preference" and f["validation"]["examples"] == 1, f["validation"]
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model="tiny", training_file=f["id"], method={"type": "dpo"},
                                       extra_body={"model_init": "random"})
    assert e.value.param == "training_file", e.value.message
    assert "line 1" in e.value.message, e.value.message


# One pair of 7 tokens a side (bos, "1+1=", the answer, eos) and one of 11 ("22+01=" and a
# 3-digit answer), against max_seq_len 10 (or less where a policy must leave nothing).
SHORT_AND_LONG = ('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
                  '{"prompt": "22+01=", "chosen": "023", "rejected": "123"}\n').encode()


@pytest.mark.parametrize("truncation, max_seq_len, outcome", [
    ("error", 10, ":2: chosen: sequence of 11 tokens exceeds max_seq_len 10"),
    ("drop", 10, {"train_examples": 1, "train_tokens": 14}),
    ("truncate", 10, {"train_examples": 2, "train_tokens": 14 + 20}),
    ("drop", 6, ": no examples left: all 2 rows were dropped as longer than max_seq_len 6"),
    ("truncate", 4, ": no examples left: all 2 rows were dropped as longer than max_seq_len 4"),
])
def test_rows_over_max_seq_len_under_each_truncation_policy(smeltd, client, truncation, max_seq_len, outcome):
    """error refuses the file naming the line and side; drop skips the long pair; truncate
    cuts it (its answers lose their last tokens: 10 of 11 kept a side); a policy that
    leaves no pair fails the job saying why. Uploads cannot check lengths (no tokenizer
    yet), so these surface when the job's trainer loads the file."""
    train = client.files.create(file=("lengths.jsonl", SHORT_AND_LONG), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="tiny", training_file=train.id, seed=1,
        method={"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 2, "max_steps": 1}}},
        extra_body={"model_init": "random", "data": {"max_seq_len": max_seq_len, "truncation": truncation}})
    job, _ = wait_done(client, job.id)
    if isinstance(outcome, str):
        assert job.status == "failed", job
        assert job.error.message and outcome in job.error.message, job.error
        return
    assert job.status == "succeeded", (job, smeltd.read_log())
    status, page = smeltd.request("GET", J + "/" + job.id + "/metrics?limit=100")
    assert status == 200, page
    start = [r["data"] for r in page["data"] if r["type"] == "start"]
    assert start and {k: start[0][k] for k in outcome} == outcome, start
