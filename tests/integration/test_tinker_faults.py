"""The Tinker API under faults, through the official SDK: a session worker killed during
forward_backward fails the request with an error the SDK raises, leaves no process
behind, and the model resumes from its last save_state in a new worker; a smeltd restart
keeps the saved checkpoints, which load with the same losses; a save_state with overwrite
that fails leaves the checkpoint it would have replaced listed and loadable."""
import os
import shutil
import signal
import sys
import time

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
import tinker  # noqa: E402
from tinker import types  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tinker_sdk import BASE, TINKER_KEY, TRAIN, service, sft_datum, tinker_dirs, train_steps  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smeltd_harness import Smeltd, processes  # noqa: E402


@pytest.fixture
def data_dirs():
    tmp, data_dir, models = tinker_dirs("smelt-tinker-faults-")
    servers = []
    yield data_dir, models, servers
    for s in servers:
        s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def tinker_workers():
    return [pid for pid, (name, _, _) in processes().items() if name == "smelt-tinker"]


def wait_no_workers(timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and tinker_workers():
        time.sleep(0.1)
    assert not tinker_workers()


def saved_model(data_dirs, seed, name):
    """A smeltd, its service client, a model trained one step and saved as name: (server, svc, tc, probe data,
    the checkpoint's path, the probe's loss at the save)."""
    data_dir, models, servers = data_dirs
    s = Smeltd(data_dir, models).start()
    servers.append(s)
    svc = service(s)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=seed).result()
    probe = [sft_datum(r["prompt"], r["completion"]) for r in TRAIN[:8]]
    train_steps(tc, [[sft_datum(r["prompt"], r["completion"]) for r in TRAIN[8:16]]])
    path = tc.save_state(name).result().path
    return s, svc, tc, probe, path, tc.forward(probe, "cross_entropy").result().metrics["loss:sum"]


def test_worker_killed_during_forward_backward(data_dirs):
    _, svc, tc, probe, path, saved_loss = saved_model(data_dirs, 0, "before-kill")
    workers = tinker_workers()
    assert len(workers) == 1, workers

    big = [sft_datum(r["prompt"], r["completion"]) for r in TRAIN[:1024]]
    futures = [tc.forward_backward(big, "cross_entropy") for _ in range(4)]
    time.sleep(0.3)
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(Exception) as e:
        for f in futures:
            f.result()
    assert "worker" in str(e.value).lower(), e.value
    wait_no_workers()

    resumed = svc.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.forward(probe, "cross_entropy").result().metrics["loss:sum"] == saved_loss


def test_restart_keeps_checkpoints(data_dirs):
    data_dir, models, servers = data_dirs
    s, svc, tc, probe, path, loss = saved_model(data_dirs, 1, "kept")
    model_id = tc.model_id
    s.kill()
    wait_no_workers()

    s2 = Smeltd(data_dir, models).start()
    servers.append(s2)
    svc2 = service(s2)
    rest = tinker.RestClient(base_url="http://127.0.0.1:%d" % s2.port, api_key=TINKER_KEY)
    listed = rest.list_checkpoints(model_id).result()
    assert any(c.tinker_path == path for c in listed.checkpoints), listed
    resumed = svc2.create_training_client_from_state(path).result()
    assert resumed.forward(probe, "cross_entropy").result().metrics["loss:sum"] == loss


def test_failed_overwrite_keeps_the_old_checkpoint(data_dirs):
    """The worker stopped, a save_state(overwrite=True) onto a checkpoint is submitted, then the
    worker is killed: the save fails, and the old checkpoint is still there, listed, and loads
    with the losses it had (smeltd once removed it at submission)."""
    data_dir = data_dirs[0]
    s, svc, tc, probe, path, loss = saved_model(data_dirs, 2, "kept")
    train_steps(tc, [[sft_datum(r["prompt"], r["completion"]) for r in TRAIN[16:24]]])  # the model moves on
    ck_dir = os.path.join(data_dir, "tinker", tc.model_id, "weights", "kept")
    assert os.path.isfile(os.path.join(ck_dir, "state.json")), ck_dir
    workers = tinker_workers()
    assert len(workers) == 1, workers

    os.kill(workers[0], signal.SIGSTOP)
    again = tc.save_state("kept", overwrite=True)
    time.sleep(1.5)  # submitted: the SDK sends it from its own thread
    assert os.path.isfile(os.path.join(ck_dir, "state.json")), "the old checkpoint went at submission"
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(Exception) as e:
        again.result()
    assert "worker" in str(e.value).lower(), e.value
    wait_no_workers()

    rest = tinker.RestClient(base_url="http://127.0.0.1:%d" % s.port, api_key=TINKER_KEY)
    listed = rest.list_checkpoints(tc.model_id).result()
    assert any(c.tinker_path == path for c in listed.checkpoints), listed
    resumed = svc.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.forward(probe, "cross_entropy").result().metrics["loss:sum"] == loss
