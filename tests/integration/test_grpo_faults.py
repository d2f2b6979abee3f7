"""A GRPO job in the split placement whose smelt-rollout worker is SIGKILLed mid-run,
through the API against a real smeltd, agent, trainer and worker: with max_retries 1 the
trainer fails naming the worker (exit status 3: the run's surroundings failed, not its
input), smeltd retries it from its last checkpoint (a checkpoint every iteration) and the
job succeeds, the second attempt's first iteration the one after that checkpoint; with
max_retries 0 the job fails with an error naming the worker and how it ended. Either
way no smelt-trainer or smelt-rollout process of the job is left once it has ended, and
every wait is bounded.

The worker is found by its parent, the job's smelt-trainer (whose working directory is
the job's directory), by reading /proc: Linux only, no psutil needed."""
import os
import signal
import time

import pytest
from conftest import ROOT
from smeltd_harness import job_processes, processes, wait_gone

J = "/v1/fine_tuning/jobs"
PROMPTS_FILE = os.path.join(ROOT, "examples", "data", "addition_prompts_train.jsonl")
ITERATIONS = 40
# Long enough for the kill to land mid-run on a slow machine (sanitizers), short enough to
# finish quickly after the retry: random weights generate all max_new_tokens.
HYPERPARAMETERS = {"batch_size": 4, "num_generations": 4, "max_new_tokens": 8, "max_iterations": ITERATIONS,
                   "learning_rate_multiplier": 10, "kv_memory_mb": 4, "loss_type": "grpo", "beta": 0,
                   "placement": "split", "rollout_workers": 1}
REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "full"}}]}


@pytest.fixture
def smeltd(start_smeltd):
    """A server of 2 CPU slots: a split job with one rollout worker takes one for its
    trainer and one for the worker."""
    return start_smeltd(extra_args=("--cpu-slots", "2"))


def find_worker(smeltd, job_id, timeout=60):
    """(trainer pid, worker pid) of the job's running attempt: the smelt-rollout whose
    parent is the job's smelt-trainer."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        procs = job_processes(smeltd, job_id)
        trainers = [pid for pid, (name, _) in procs.items() if name == "smelt-trainer"]
        workers = [(ppid, pid) for pid, (name, ppid) in procs.items() if name == "smelt-rollout" and ppid in trainers]
        if workers:
            return workers[0]
        time.sleep(0.05)
    raise AssertionError("no smelt-rollout child of the job's trainer within %d s: %s" % (timeout, processes()))


# ---- the job ----

def start_job(smeltd, max_retries):
    with open(PROMPTS_FILE, "rb") as f:
        rows = b"".join(f.readlines()[:64])
    status, up = smeltd.upload_bytes(rows, "grpo_fault_train.jsonl")
    assert status == 200 and up["validation"]["kind"] == "prompts", up
    train = up["id"]
    body = {"model": "tiny", "model_init": "random", "training_file": train, "seed": 3, "max_retries": max_retries,
            "checkpoint": {"every_steps": 1},
            "method": {"type": "grpo", "grpo": {"hyperparameters": HYPERPARAMETERS, "reward": REWARD}}}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    return job["id"]


def train_steps(smeltd, job_id):
    """[(attempt, step)] of the trainer's train lines, oldest first."""
    status, page = smeltd.request("GET", J + "/" + job_id + "/metrics?limit=1000")
    assert status == 200, page
    return [(m["attempt"], m["step"]) for m in page["data"] if m["type"] == "train"]


def kill_worker_mid_run(smeltd, job_id, after_steps=2, timeout=120):
    """SIGKILLs the job's rollout worker once `after_steps` iterations (and so their
    checkpoints) are done; returns (trainer pid, worker pid, the steps done then)."""
    trainer, worker = find_worker(smeltd, job_id)
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = train_steps(smeltd, job_id)
        if len(done) >= after_steps:
            break
        status, job = smeltd.request("GET", J + "/" + job_id)
        assert job["status"] == "running", job
        time.sleep(0.02)
    else:
        raise AssertionError("job %s did no %d iterations in %d s" % (job_id, after_steps, timeout))
    os.kill(worker, signal.SIGKILL)
    assert done[-1][1] < ITERATIONS, "the job ended before the kill: %s" % done
    return trainer, worker, done


def assert_names_the_worker(message):
    """The trainer's last log lines, quoted by smeltd: its exit status for a run that
    failed against its surroundings, the worker and how it ended."""
    assert "exited with code 3" in message and "rollout worker 0" in message, message
    assert "SIGKILL" in message or "stopped answering" in message, message


def events_of(smeltd, job_id):
    status, page = smeltd.request("GET", J + "/" + job_id + "/events?limit=1000")
    assert status == 200, page
    return list(reversed(page["data"]))  # oldest first


def job_with_a_killed_worker(smeltd, max_retries, status, attempts):
    """A job whose worker is killed mid-run, once it has ended with `status` after
    `attempts` attempts and none of its processes is left: (job, the steps done at the
    kill)."""
    job_id = start_job(smeltd, max_retries=max_retries)
    trainer, worker, done = kill_worker_mid_run(smeltd, job_id)
    job = smeltd.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == status, (job, smeltd.read_log())
    assert job["retries"] == attempts - 1 and job["attempt"] == attempts, job
    wait_gone(smeltd, job_id, [trainer, worker])
    return job, done


def test_killed_worker_is_retried_from_the_checkpoint(smeltd):
    job, done = job_with_a_killed_worker(smeltd, max_retries=1, status="succeeded", attempts=2)
    job_id = job["id"]

    # the retry names the worker and how it ended (the trainer's last log lines)
    retried = [e["message"] for e in events_of(smeltd, job_id) if "retrying from the last checkpoint" in e["message"]]
    assert len(retried) == 1, [e["message"] for e in events_of(smeltd, job_id)]
    assert_names_the_worker(retried[0])

    # The second attempt resumed from the first one's last checkpoint: a worker's death
    # fails an iteration before its train line, and every train line is followed by its
    # checkpoint, so the second attempt starts with the iteration after the first one's
    # last (a fresh start would redo iteration 1), and every iteration was trained once.
    steps = train_steps(smeltd, job_id)
    first = [s for a, s in steps if a == 1]
    second = [s for a, s in steps if a == 2]
    assert first == list(range(1, len(first) + 1)) and max(first) >= done[-1][1], (first, done)
    status, page = smeltd.request("GET", J + "/" + job_id + "/checkpoints?limit=100")
    assert status == 200, page
    assert max(first) in [c["step_number"] for c in page["data"]], (first, page["data"])
    assert second == list(range(max(first) + 1, ITERATIONS + 1)), (first, second)
    print("rollout worker killed after iteration %d: attempt 1 trained iterations 1-%d, attempt 2 resumed at %d"
          % (done[-1][1], max(first), second[0]))


def test_killed_worker_without_retries_fails_the_job_naming_it(smeltd):
    job, _ = job_with_a_killed_worker(smeltd, max_retries=0, status="failed", attempts=1)
    assert job["error"]["code"] == "worker_failed", job["error"]
    assert_names_the_worker(job["error"]["message"])
    smeltd.wait_devices_free()
