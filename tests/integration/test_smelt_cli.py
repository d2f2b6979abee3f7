"""The `smelt` command line (clients/python, run as `python -m smelt` from the source tree)
against a real smeltd: upload, create, follow the SFT example to `succeeded` (exit 0) with
its progress line, follow a job that fails (exit 3), --json output that parses, a bad flag
(usage, exit 2), an API error on one line of stderr (exit 1), schedules, keys, models,
cluster and the bash completion script."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ADMIN_KEY, ROOT, TRAIN_FILE

CLIENT_DIR = os.path.join(ROOT, "clients", "python")
PREFERENCE_ROWS = "".join(json.dumps({"prompt": "1+%d=" % i, "chosen": "%03d" % (i + 1), "rejected": "999"}) + "\n"
                          for i in range(8))


@pytest.fixture(scope="module")
def smelt_cmd(smeltd):
    env = dict(os.environ, PYTHONPATH=CLIENT_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SMELT_BASE_URL=smeltd.base_url, SMELT_API_KEY=ADMIN_KEY)

    def run(*args, timeout=120):
        return subprocess.run([sys.executable, "-m", "smelt"] + list(args), capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=ROOT)
    return run


def ok(r):
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r


def test_upload_create_follow_to_succeeded(smelt_cmd, smeltd):
    f = json.loads(ok(smelt_cmd("files", "upload", TRAIN_FILE, "--json")).stdout)
    assert f["status"] == "processed" and f["validation"]["examples"] == 8000
    listed = ok(smelt_cmd("files", "list"))
    assert f["id"] in listed.stdout and "addition_train.jsonl" in listed.stdout
    r = ok(smelt_cmd("jobs", "create", "--model", "tiny", "--model-init", "random", "--training-file", f["id"],
                     "--epochs", "1", "--batch-size", "16", "--max-steps", "12", "--learning-rate", "0.003",
                     "--max-seq-len", "32", "--set", "checkpoint.every_steps=6", "--json"))
    job = json.loads(r.stdout)
    assert job["status"] in ("queued", "running") and job["method"]["type"] == "supervised"
    assert job["spec"]["checkpoint"]["every_steps"] == 6, job["spec"]
    r = smelt_cmd("jobs", "follow", job["id"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "Step 12/12: training loss=" in r.stdout and "succeeded: ft:tiny:smelt:" in r.stdout, r.stdout
    progress = [line for line in r.stderr.splitlines() if line.startswith("progress: ")]
    assert progress and progress[-1].startswith("progress: step 12/12 (100%), ETA 0s, loss "), r.stderr
    got = json.loads(ok(smelt_cmd("jobs", "get", job["id"], "--json")).stdout)
    assert got["status"] == "succeeded"
    assert "succeeded" in ok(smelt_cmd("jobs", "get", job["id"])).stdout
    rows = json.loads(ok(smelt_cmd("jobs", "metrics", job["id"], "--json")).stdout)
    assert any(r["type"] == "train" and r["step"] == 12 for r in rows)
    assert job["id"] in ok(smelt_cmd("jobs", "list")).stdout
    assert [j["id"] for j in json.loads(ok(smelt_cmd("--json", "jobs", "list", "--all")).stdout)][0] == job["id"]
    assert ok(smelt_cmd("jobs", "logs", job["id"], "--tail", "2000")).stdout
    assert "12" in ok(smelt_cmd("jobs", "checkpoints", job["id"])).stdout
    models = json.loads(ok(smelt_cmd("models", "list", "--json")).stdout)
    assert got["fine_tuned_model"] in [m["id"] for m in models]
    # --spec with flags over it, followed at once (json lines, then the result)
    spec = {"model": got["fine_tuned_model"], "training_file": f["id"], "data": {"max_seq_len": 32},
            "hyperparameters": {"n_epochs": 1, "batch_size": 16, "max_steps": 2}}
    r = smelt_cmd("jobs", "create", "--spec", json.dumps(spec), "--max-steps", "3", "--follow", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[-1]["object"] == "smelt.follow.result" and lines[-1]["job"]["status"] == "succeeded"
    assert lines[-1]["job"]["hyperparameters"]["n_epochs"] == 1
    assert any(e.get("message", "").startswith("Step 3/3") for e in lines[:-1]), lines


def test_follow_a_failed_job_exits_3(smelt_cmd, tmp_path):
    pref = tmp_path / "pref.jsonl"
    pref.write_text(PREFERENCE_ROWS)
    # a path is uploaded first; max_seq_len 4 leaves no pair (every row is longer): the job fails
    r = smelt_cmd("jobs", "create", "--model", "tiny", "--model-init", "random", "--method", "dpo",
                  "--training-file", str(pref), "--batch-size", "2", "--max-steps", "1", "--max-seq-len", "4",
                  "--set", "data.truncation=drop", "--follow")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert " failed: " in r.stdout.splitlines()[-1] and "no examples left" in r.stdout, r.stdout


def test_errors_usage_and_other_commands(smelt_cmd):
    r = smelt_cmd("jobs", "create", "--bogus-flag")
    assert r.returncode == 2 and "usage:" in r.stderr and "--bogus-flag" in r.stderr
    r = smelt_cmd("jobs", "get", "ftjob-doesnotexist")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "404" in r.stderr and "No such fine-tuning job" in r.stderr and "(param: fine_tuning_job_id)" in r.stderr
    r = smelt_cmd("jobs", "create", "--model", "tiny", "--training-file", "file-nope")
    assert r.returncode == 1 and "(param: training_file)" in r.stderr, r.stderr
    r = smelt_cmd("--api-key", "sk-wrong-key-123456", "cluster")
    assert r.returncode == 1 and "401" in r.stderr, r.stderr
    cluster = json.loads(ok(smelt_cmd("cluster", "--json")).stdout)
    assert cluster["agents"][0]["status"] == "online"
    assert "agents (" in ok(smelt_cmd("cluster")).stdout

    key = json.loads(ok(smelt_cmd("keys", "create", "--project", "cli-team", "--name", "ci", "--json")).stdout)
    assert key["key"] and key["project"] == "cli-team"
    assert "cli-team" in ok(smelt_cmd("keys", "list")).stdout
    assert json.loads(ok(smelt_cmd("keys", "revoke", str(key["id"]), "--json")).stdout)["deleted"] is True

    job = json.dumps({"model": "tiny", "training_file": "file-nope"})
    r = smelt_cmd("schedules", "create", "--cron", "0 3 * * *", "--job", job)
    assert r.returncode == 1 and "(param: job.training_file)" in r.stderr, r.stderr
    r = smelt_cmd("schedules", "create", "--cron", "61 * * * *", "--job", job)
    assert r.returncode == 1 and "(param: cron)" in r.stderr, r.stderr
    f = json.loads(ok(smelt_cmd("files", "upload", TRAIN_FILE, "--json")).stdout)
    job = json.dumps({"model": "tiny", "model_init": "random", "training_file": f["id"],
                      "hyperparameters": {"max_steps": 100000}, "data": {"max_seq_len": 32}})
    s = json.loads(ok(smelt_cmd("schedules", "create", "--cron", "@daily", "--job", job, "--name", "nightly",
                                "--suspended", "--json")).stdout)
    assert s["suspended"] is True and "nightly" in ok(smelt_cmd("schedules", "list")).stdout
    run = json.loads(ok(smelt_cmd("schedules", "trigger", s["id"], "--json")).stdout)
    assert run["outcome"] == "created", run
    assert "cancelled" in ok(smelt_cmd("jobs", "cancel", run["job_id"])).stdout  # long: still going
    assert ok(smelt_cmd("schedules", "rm", s["id"])).stdout.startswith("deleted")
    r = smelt_cmd("files", "rm", f["id"], "--json")
    assert r.returncode in (0, 1), r.stderr  # 409 while the cancelled job's worker is still going
    script = ok(smelt_cmd("completion", "bash")).stdout
    assert "complete -F _smelt smelt" in script and '"jobs create")' in script
    if os.path.exists("/bin/bash"):
        check = subprocess.run(["/bin/bash", "-n"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
