"""A job's own channels under CURVE (docs/security.md "Job channels"), through a real job:
a GRPO job in the split placement runs to `succeeded` while its trainer and
smelt-rollout worker talk over CURVE with the attempt's keys (smeltd made them at launch
and handed them to the trainer through a pipe; the trainer handed them on to its worker
the same way), and while it runs, processes on the same host that reach the worker's
endpoint — with no CURVE at all, or with a key of their own aimed at the worker's real
public key — get no gen.result: the handshake fails and the worker logs the refusal."""
import json
import os
import re
import sqlite3
import time

import zmq
from conftest import TRAIN_FILE, VAL_FILE, prompts_rows

J = "/v1/fine_tuning/jobs"
# Long enough (~80 ms each here) for the intruders to try while the worker serves.
ITERATIONS = 150
REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "full"}}]}


def prompts_file(smeltd, path, n, name):
    status, f = smeltd.upload_bytes(prompts_rows(path, n), name)
    assert status == 200 and f["status"] == "processed", f
    return f["id"]


def wait_for(what, probe, timeout, why=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("waited %d s for %s: %s" % (timeout, what, why()))


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def gen_result_for(endpoint, curve=None, wait_s=1.0):
    """A DEALER (curve: (its keypair, the server's public key), or None: plain) sends one
    gen.request to endpoint; returns whatever came back within wait_s (None: nothing)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if curve:
        (public, secret), server = curve
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = public, secret, server
    s.connect(endpoint)
    header = {"v": 1, "id": "intruder-1", "n": 1, "max_new_tokens": 2}
    s.send_multipart([b"gen.request", json.dumps(header).encode(), bytes(4 * 3)])
    got = s.recv_multipart() if s.poll(int(wait_s * 1000)) else None
    s.close()
    ctx.term()
    return got


def test_split_job_runs_under_curve_and_its_worker_admits_no_one_else(start_smeltd):
    smeltd = start_smeltd(extra_args=["--cpu-slots", "2"])  # the trainer's slot and its worker's
    train = prompts_file(smeltd, TRAIN_FILE, 16, "channels_train.jsonl")
    val = prompts_file(smeltd, VAL_FILE, 4, "channels_val.jsonl")
    body = {"model": "tiny", "training_file": train, "validation_file": val, "seed": 5, "model_init": "random",
            "method": {"type": "grpo", "grpo": {
                "hyperparameters": {"batch_size": 4, "num_generations": 4, "max_new_tokens": 4,
                                    "max_iterations": ITERATIONS, "learning_rate_multiplier": 10, "kv_memory_mb": 4,
                                    "weight_sync": "zmq"},
                "reward": REWARD}},
            "resources": {"trainer": {"devices": 1}, "rollout": {"devices": 1}}}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    job_dir = os.path.join(smeltd.data_dir, "jobs", job["id"])
    worker_log = os.path.join(job_dir, "rollout-0.log")
    serving = wait_for("the worker to serve", lambda: re.search(r"smelt-rollout: serving on (\S+)",
                                                                 read(worker_log)), 120)
    endpoint = serving.group(1)
    assert "curve: encrypted" in read(worker_log), read(worker_log)
    db = sqlite3.connect(os.path.join(smeltd.data_dir, "smelt.db"))
    (worker_public,) = db.execute("SELECT worker_public_key FROM jobs WHERE id = ?", (job["id"],)).fetchone()
    db.close()
    assert worker_public and len(worker_public) == 40

    assert gen_result_for(endpoint) is None, "a plain DEALER got an answer"
    stranger = zmq.curve_keypair()
    assert gen_result_for(endpoint, (stranger, worker_public.encode())) is None, "another key got an answer"
    wait_for("the worker to log the refusal",
             lambda: "curve: refused a rollout connection" in read(worker_log), 10, lambda: read(worker_log))
    status, now = smeltd.request("GET", J + "/" + job["id"])
    assert now["status"] == "running", ("the job ended before the intruders were turned away", now)

    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    lines = [json.loads(line) for line in read(os.path.join(job_dir, "metrics.jsonl")).splitlines()]
    train_lines = [line for line in lines if line.get("type") == "train"]
    assert len(train_lines) == ITERATIONS and all(line["sync_bytes"] > 0 for line in train_lines), train_lines
    assert read(worker_log).count("in use (by zmq)") == ITERATIONS, read(worker_log)
    assert "uses CURVE with the job's keys" in read(os.path.join(job_dir, "log.txt")) + smeltd.read_log()
