"""A job trained by several ranks (smelt-trainer --ranks N, trainer/launch.c) whose rank
dies or stops answering mid-step: every other rank exits within the communicator's
timeout with an error naming it, the launcher exits with status 3 (the run failed against
its surroundings) naming how the rank ended, and no process is left behind. Through
smeltd the same kill makes the job retry from its last checkpoint and succeed.

Real processes throughout: the launcher, its ranks (found as its children in /proc), and
for the API part a real smeltd with its embedded agent."""
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest
from conftest import BUILD, ROOT
from smeltd_harness import job_processes, smelt_pid, wait_gone

TRAINER = os.path.join(BUILD, "smelt-trainer")
TIMEOUT_MS = 1500
J = "/v1/fine_tuning/jobs"


def spec_of(tmp, steps=400):
    return {"type": "sft", "model": os.path.join(ROOT, "examples", "tiny"), "model_init": "random",
            "data": {"train": os.path.join(ROOT, "examples", "data", "addition_train.jsonl"), "max_seq_len": 32},
            "hyperparameters": {"max_steps": steps, "batch_tokens": 128, "grad_accum": 3, "learning_rate": 0.003,
                                "zero_stage": 1},
            "checkpoint": {"every_steps": 1, "keep_last": 1}, "output_dir": os.path.join(tmp, "out"),
            "seed": 5, "log_every_steps": 1}


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def cmdline(pid):
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        return f.read().split(b"\0")


def rank_pids(launcher, n, timeout=60):
    """{rank: pid} of the launcher's children once all n run."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ranks = {}
        for pid in children(launcher):
            try:
                args = cmdline(pid)
            except OSError:
                continue
            if b"--rank" in args:
                ranks[int(args[args.index(b"--rank") + 1])] = pid
        if len(ranks) == n:
            return ranks
        time.sleep(0.05)
    raise AssertionError("the launcher did not start %d ranks in %d s" % (n, timeout))


def wait_steps(out_dir, steps, proc, timeout=120):
    """Until metrics.jsonl holds a train line at `steps`."""
    path = os.path.join(out_dir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(x) for x in f if x.strip()]
            if any(x["type"] == "train" and x["step"] >= steps for x in lines):
                return
        time.sleep(0.05)
    raise AssertionError("no train line at step %d within %d s" % (steps, timeout))


def launch(tmp, ranks, timeout_in_spec=False):
    """The launcher and its ranks; the collectives' timeout given as --comm-timeout-ms, or as the spec's
    hyperparameters.comm_timeout_s (what a job submitted through the API sets)."""
    spec = spec_of(tmp)
    timeout_args = ["--comm-timeout-ms", str(TIMEOUT_MS)]
    if timeout_in_spec:
        spec["hyperparameters"]["comm_timeout_s"] = TIMEOUT_MS / 1000
        timeout_args = []
    path = os.path.join(tmp, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([TRAINER, "--spec", path, "--ranks", str(ranks)] + timeout_args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    return proc, spec["output_dir"]


def assert_all_gone(pids, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline and any(smelt_pid(p) for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if smelt_pid(p)], "ranks left behind"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_rank_that_dies_or_stops_fails_the_others_naming_it(sig):
    """SIGSTOP: the timeout comes from the spec (hyperparameters.comm_timeout_s), not the flag."""
    with tempfile.TemporaryDirectory(prefix="smelt-ranks-") as tmp:
        proc, out = launch(tmp, 3, timeout_in_spec=sig == signal.SIGSTOP)
        try:
            ranks = rank_pids(proc.pid, 3)
            wait_steps(out, 2, proc)
            os.kill(ranks[1], sig)
            t0 = time.time()
            # each other rank: its timeout, the fault report's grace, then the launcher's kill
            _, stderr = proc.communicate(timeout=4 * TIMEOUT_MS / 1000 + 30)
            took = time.time() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 3, stderr
        assert "rank 1" in stderr and "dead or not answering" in stderr, stderr
        if sig == signal.SIGKILL:
            assert "rank 1 (pid %d) was killed by signal 9" % ranks[1] in stderr, stderr
        else:
            assert "is still there and stopped; killing it" in stderr, stderr
        assert took < 4 * TIMEOUT_MS / 1000 + 20, took
        assert_all_gone(ranks.values())


def test_a_stopped_launcher_stops_its_ranks_after_a_common_step():
    """SIGTERM to the launcher alone: it passes it on, the ranks agree on the step to stop
    after, write one checkpoint and exit 0; --resume on another number of ranks goes on."""
    with tempfile.TemporaryDirectory(prefix="smelt-ranks-") as tmp:
        proc, out = launch(tmp, 2)
        ranks = rank_pids(proc.pid, 2)
        wait_steps(out, 2, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        assert_all_gone(ranks.values())
        steps = sorted(int(d.split("-")[1]) for d in os.listdir(os.path.join(out, "checkpoints")))
        assert steps, stderr
        resumed = subprocess.run([TRAINER, "--spec", os.path.join(tmp, "spec.json"), "--resume", "--ranks", "3",
                                  "--stop-after-step", str(steps[-1] + 2)], capture_output=True, text=True,
                                 timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed from step %d" % steps[-1] in resumed.stderr, resumed.stderr


# ---- through smeltd ----

@pytest.fixture
def smeltd(start_smeltd):
    return start_smeltd(extra_args=("--cpu-slots", "2"))


def test_job_on_two_ranks_retries_from_its_checkpoint_when_a_rank_is_killed(smeltd):
    status, up = smeltd.upload(os.path.join(ROOT, "examples", "data", "addition_train.jsonl"))
    assert status == 200, up
    body = {"model": "tiny", "model_init": "random", "training_file": up["id"], "seed": 2, "max_retries": 1,
            "checkpoint": {"every_steps": 1}, "data": {"max_seq_len": 32},
            "resources": {"trainer": {"devices": 2}},
            "hyperparameters": {"max_steps": 60, "batch_tokens": 128, "grad_accum": 2, "learning_rate": 0.003,
                                "zero_stage": 2}}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    assert job["resources"] == {"devices": 2, "trainer": {"devices": 2}}, job
    job_id = job["id"]
    deadline = time.time() + 120
    victim = None
    while time.time() < deadline and victim is None:
        procs = job_processes(smeltd, job_id)
        launchers = [p for p, (name, parent) in procs.items() if name == "smelt-trainer" and parent not in procs]
        status, page = smeltd.request("GET", J + "/" + job_id + "/metrics?limit=1000")
        trained = [m for m in page["data"] if m["type"] == "train"]
        if launchers and len(trained) >= 2:
            ranks = rank_pids(launchers[0], 2)
            victim = ranks[1]
            os.kill(victim, signal.SIGKILL)
        time.sleep(0.05)
    assert victim, "the job did not train 2 steps on 2 ranks in time"
    job = smeltd.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    assert job["attempt"] == 2, job
    status, page = smeltd.request("GET", J + "/" + job_id + "/events?limit=1000")
    messages = [e["message"] for e in page["data"]]
    assert any("2 ranks, ZeRO stage 2" in m for m in messages), messages
    assert any("rank 1" in m for m in messages), messages
    # both attempts met at smeltd's rendezvous (CURVE, the attempt's keys), not in a folder
    with open(os.path.join(smeltd.data_dir, "jobs", job_id, "log.txt")) as f:
        log = f.read()
    assert log.count("rendezvous smeltd:tcp://127.0.0.1:") == 2, log[-3000:]
    assert "rendezvous file:" not in log, log[-3000:]
    freed = ["rendezvous: attempt %s.%d ended" % (job_id, attempt) for attempt in (1, 2)]
    deadline = time.time() + 10
    while time.time() < deadline and not all(f in smeltd.read_log_all() for f in freed):
        time.sleep(0.1)
    assert all(f in smeltd.read_log_all() for f in freed), smeltd.read_log()
    wait_gone(smeltd, job_id, [victim])
