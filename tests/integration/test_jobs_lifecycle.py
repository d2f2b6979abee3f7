"""Job lifecycle against a real smeltd: SSE delivers every event once (also across a
reconnect with Last-Event-ID), cancel stops the worker and frees its device, pause
checkpoints and resume continues from the checkpoint, and a SIGKILLed smeltd loses
nothing."""
import http.client
import json
import os
import signal
import threading
import time

from conftest import ADMIN_KEY, SMALL_JOB, TRAIN_FILE, Smeltd


def long_job(file_id, steps=400, every=25):
    job = json.loads(json.dumps(SMALL_JOB))
    job["training_file"] = file_id
    job["hyperparameters"].update({"max_steps": steps, "n_epochs": 50})
    job["checkpoint"] = {"every_steps": every}
    return job


def create(server, body):
    status, job = server.request("POST", "/v1/fine_tuning/jobs", body)
    assert status == 200, job
    return job


def wait_event(server, job_id, text, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, page = server.request("GET", "/v1/fine_tuning/jobs/%s/events?limit=1000" % job_id)
        assert status == 200
        for ev in page["data"]:
            if text in ev["message"]:
                return ev
        time.sleep(0.1)
    raise AssertionError("no event containing %r for %s\n%s" % (text, job_id, server.read_log()))


def trainer_pids(job_id):
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"smelt-trainer") and any(job_id.encode() in c for c in cmd):
            pids.append(int(pid))
    return pids


def sse_events(server, job_id, last_event_id=None, stop_after=None, timeout=120):
    """Reads the job's SSE stream: (list of (id, event dict), ended)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    headers = {"Authorization": "Bearer " + ADMIN_KEY, "Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    conn.request("GET", "/v1/fine_tuning/jobs/%s/events" % job_id, headers=headers)
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    got, record, ended = [], {}, False
    while True:
        line = resp.fp.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if line == "":
            if record.get("event") == "end":
                ended = True
                break
            if "data" in record:
                got.append((record.get("id"), json.loads(record["data"])))
                if stop_after and len(got) >= stop_after:
                    break
            record = {}
            continue
        key, _, value = line.partition(": ")
        record[key] = value
    conn.close()
    return got, ended


def test_sse_events_arrive_when_committed(smeltd, train_file_id):
    """An open stream gets a job's last events as they are written, not at the next keep-alive
    (15 s): smeltd once woke its streams inside the event's transaction, before the commit, so
    the woken streams read nothing new and slept again."""
    job = create(smeltd, dict(SMALL_JOB, training_file=train_file_id,
                              hyperparameters=dict(SMALL_JOB["hyperparameters"], max_steps=40)))
    done = {}

    def poll():
        while True:
            status, row = smeltd.request("GET", "/v1/fine_tuning/jobs/%s" % job["id"])
            if row.get("status") in ("succeeded", "failed", "cancelled"):
                done["at"] = time.monotonic()
                return
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    got, ended = sse_events(smeltd, job["id"])
    ended_at = time.monotonic()
    poller.join()
    assert ended and got, "the stream ends with the job"
    assert "at" in done and got[0][1]["created_at"] <= got[-1][1]["created_at"]
    assert ended_at - done["at"] < 8, "the stream's end came %.1f s after the job ended" % (ended_at - done["at"])


def test_sse_every_event_exactly_once_across_reconnect(smeltd, train_file_id):
    job = create(smeltd, dict(SMALL_JOB, training_file=train_file_id,
                              hyperparameters=dict(SMALL_JOB["hyperparameters"], max_steps=40)))
    first, ended = sse_events(smeltd, job["id"], stop_after=5)
    assert len(first) == 5 and not ended
    rest, ended = sse_events(smeltd, job["id"], last_event_id=first[-1][0])
    assert ended, "the stream ends with an 'end' event once the job has ended"
    ids = [i for i, _ in first + rest]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    status, page = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/events?limit=1000" % job["id"])
    listed = [e["id"] for e in reversed(page["data"])]
    assert ids == listed, "the stream must deliver every listed event, in order"
    assert all(e["id"] == i for i, e in first + rest)
    final = smeltd.wait_job(job["id"], {"succeeded", "failed"})
    assert final["status"] == "succeeded", smeltd.read_log()
    # the job's first training event says what computes it: backend, BLAS kernels, threads
    started = [e["message"] for e in page["data"] if e["message"].startswith("Training started")]
    assert len(started) == 1 and "cpu backend; CPU: OpenBLAS " in started[0] and " threads)" in started[0], started
    # a reconnect after the end replays nothing and ends at once
    again, ended = sse_events(smeltd, job["id"], last_event_id=ids[-1])
    assert again == [] and ended


def test_cancel_running_job_stops_worker_and_frees_device(smeltd, train_file_id):
    job = create(smeltd, long_job(train_file_id, steps=100000))
    wait_event(smeltd, job["id"], "Step ")
    assert trainer_pids(job["id"]), "a trainer should be running"
    status, body = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % job["id"])
    assert status == 200 and body["status"] == "cancelled", body
    smeltd.wait_devices_free()
    deadline = time.time() + 15
    while trainer_pids(job["id"]) and time.time() < deadline:
        time.sleep(0.1)
    assert not trainer_pids(job["id"]), "the worker process must be gone"
    status, body = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job["id"])
    assert body["status"] == "cancelled" and body["finished_at"]
    # cancelling again is an illegal state change
    status, body = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % job["id"])
    assert status == 409 and body["error"]["code"] == "invalid_state"


def test_pause_then_resume_continues_from_checkpoint(smeltd, train_file_id):
    job = create(smeltd, long_job(train_file_id, steps=300, every=1000))
    wait_event(smeltd, job["id"], "Step 20/")
    status, body = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/pause" % job["id"])
    assert status == 200 and body["status"] == "paused", body
    smeltd.wait_devices_free()
    ck = wait_event(smeltd, job["id"], "Checkpoint saved at step")
    paused_step = int(ck["message"].rsplit(" ", 1)[1])
    assert 20 <= paused_step < 300
    status, body = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job["id"])
    assert body["status"] == "paused"
    status, body = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/resume" % job["id"])
    assert status == 200 and body["status"] in ("queued", "running"), body
    final = smeltd.wait_job(job["id"], {"succeeded", "failed"}, timeout=240)
    assert final["status"] == "succeeded", smeltd.read_log()
    assert final["attempt"] == 2
    status, metrics = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics" % job["id"])
    second = [m["step"] for m in metrics["data"] if m["attempt"] == 2 and m["type"] == "train"]
    assert second and min(second) == paused_step + 1, "the second attempt continues after the checkpoint"
    steps = [m["step"] for m in metrics["data"] if m["type"] == "train"]
    assert steps == list(range(1, 301)), "every step reported once"


def test_sigkill_smeltd_loses_nothing(start_smeltd, tmp_path):
    server = start_smeltd()
    status, f = server.upload(TRAIN_FILE)
    assert status == 200
    running = create(server, long_job(f["id"], steps=250, every=20))
    queued = create(server, dict(SMALL_JOB, training_file=f["id"]))
    wait_event(server, running["id"], "Checkpoint saved at step")
    status, body = server.request("GET", "/v1/fine_tuning/jobs/" + queued["id"])
    assert body["status"] == "queued"
    server.kill(signal.SIGKILL)
    restarted = Smeltd(server.data_dir, server.models_dir).start()
    try:
        a = restarted.wait_job(running["id"], {"succeeded", "failed"}, timeout=240)
        b = restarted.wait_job(queued["id"], {"succeeded", "failed"}, timeout=240)
        assert a["status"] == "succeeded", restarted.read_log()
        assert b["status"] == "succeeded", restarted.read_log()
        assert a["retries"] == 1 and b["retries"] == 0
        status, page = restarted.request("GET", "/v1/fine_tuning/jobs/%s/events?limit=1000" % running["id"])
        assert any("retrying from the last checkpoint" in e["message"] for e in page["data"])
        status, files = restarted.request("GET", "/v1/files")
        assert [x["id"] for x in files["data"]] == [f["id"]]
    finally:
        restarted.kill()
