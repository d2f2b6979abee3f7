"""The Python client (clients/python, package `smelt`, imported from the source tree)
against a real smeltd: a job of every method created and cancelled, pagination across
pages, every error status as its exception with the server's param, retries through a
fault-injecting proxy (a 503 with Retry-After, a connection dropped after the server acted)
that create one job under one Idempotency-Key, `wait` and `stream_events` on a real SFT
job with the stream cut mid-event (no event lost or repeated), the package installed with
pip into a fresh venv, and mypy --strict over it."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import ADMIN_KEY, ROOT, SMALL_JOB, TRAIN_FILE, Smeltd, make_models_dir, prompts_rows

CLIENT_DIR = os.path.join(ROOT, "clients", "python")
sys.path.insert(0, CLIENT_DIR)
import smelt  # noqa: E402

PREFERENCE_ROWS = b"".join(json.dumps({"prompt": "1+%d=" % i, "chosen": "%03d" % (i + 1),
                                       "rejected": "999"}).encode() + b"\n" for i in range(8))
REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "full"}}]}
GRADER = {"type": "string_check", "name": "exact", "operation": "eq",
          "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}


class FaultProxy:
    """An HTTP relay on 127.0.0.1 in front of smeltd, one request per connection, that
    records every request's method, path and headers and applies the first matching
    fault of `faults` (each used once): ("503", method, path) answers 503 itself with a
    Retry-After; ("429", ...) answers 429; ("drop", ...) forwards the request, waits for
    the answer to start and closes the client's connection (the server acted, the client
    never hears); ("cut_sse", method, path, n) forwards an event stream and cuts it in
    the middle of its (n+1)th event."""

    def __init__(self, upstream_port, retry_after="1"):
        self.upstream_port = upstream_port
        self.retry_after = retry_after
        self.faults = []
        self.requests = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self.accept, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def close(self):
        self.closed = True
        self.sock.close()

    def accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def fault_for(self, method, path):
        with self.lock:
            for i, f in enumerate(self.faults):
                if f[1] == method and path.split("?")[0].endswith(f[2]):
                    return self.faults.pop(i)
        return None

    def handle(self, client):
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, body = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                body += chunk
            with self.lock:
                self.requests.append((method, path, headers))
            fault = self.fault_for(method, path)
            if fault and fault[0] in ("503", "429"):
                msg = json.dumps({"error": {"message": "injected %s" % fault[0], "type": "server_error" if fault[0] ==
                                            "503" else "rate_limit_error", "param": "proxy", "code": "injected"}})
                client.sendall(("HTTP/1.1 %s Injected\r\nContent-Type: application/json\r\nRetry-After: %s\r\n"
                                "Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                % (fault[0], self.retry_after, len(msg), msg)).encode())
                return
            up = socket.create_connection(("127.0.0.1", self.upstream_port))
            try:
                up.sendall(head + b"\r\n\r\n" + body)
                if fault and fault[0] == "drop":
                    up.recv(1)  # the server has answered: it acted on the request
                    return
                cut_after = fault[3] if fault and fault[0] == "cut_sse" else None
                seen = b""
                marker = b"event: fine_tuning.job.event\ndata: "
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        return
                    if cut_after is not None:
                        seen += chunk
                        # the (n+1)th event's start: send up to a few bytes into its data, then cut
                        at, count = -1, 0
                        while True:
                            at = seen.find(marker, at + 1)
                            if at < 0:
                                break
                            count += 1
                            if count == cut_after + 1:
                                break
                        if at >= 0:
                            already = len(seen) - len(chunk)
                            client.sendall(seen[already:at + len(marker) + 5])
                            return
                    client.sendall(chunk)
            finally:
                up.close()
        except OSError:
            pass
        finally:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()


def start_server(extra_args=()):
    tmp = tempfile.mkdtemp(prefix="smelt-pyc-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    return tmp, Smeltd(data_dir, make_models_dir(tmp), list(extra_args)).start()


@pytest.fixture(scope="module")
def idle():
    """A smeltd without agents: jobs are accepted and stay queued (nothing trains)."""
    tmp, s = start_server(["--no-local-agent"])
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def idle_client(idle):
    return smelt.Client(idle.base_url, ADMIN_KEY, max_retries=0)


@pytest.fixture(scope="module")
def files(idle_client):
    sft = idle_client.files.upload(TRAIN_FILE)
    pref = idle_client.files.upload(PREFERENCE_ROWS, filename="pref.jsonl")
    prompts = idle_client.files.upload(prompts_rows(TRAIN_FILE, 8), filename="prompts.jsonl")
    assert [f["status"] for f in (sft, pref, prompts)] == ["processed"] * 3
    assert [f["validation"]["kind"] for f in (sft, pref, prompts)] == ["sft", "preference", "prompts"]
    return {"sft": sft["id"], "preference": pref["id"], "prompts": prompts["id"]}


def test_defaults_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("SMELT_API_KEY", "sk-from-env")
    c = smelt.Client()
    assert c.base_url == "http://127.0.0.1:1" and c.api_key == "sk-from-env"
    monkeypatch.delenv("SMELT_BASE_URL")
    monkeypatch.delenv("SMELT_API_KEY")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "admin_key").write_text("sk-smelt-from-file\n")
    monkeypatch.chdir(tmp_path)
    c = smelt.Client()
    assert c.base_url == smelt.DEFAULT_BASE_URL == "http://127.0.0.1:8700" and c.api_key == "sk-smelt-from-file"


def test_every_method_creates_and_cancels(idle_client, files):
    methods = [
        (smelt.supervised(n_epochs=1, batch_size=16, learning_rate=0.003), "sft"),
        (smelt.dpo(beta=0.1, loss_type="sigmoid", batch_size=2), "preference"),
        (smelt.reward_model(batch_size=2, center_rewards_coefficient=0.01), "preference"),
        (smelt.grpo(REWARD, batch_size=4, num_generations=4, max_new_tokens=4, max_iterations=2), "prompts"),
        (smelt.ppo(REWARD, batch_size=4, max_new_tokens=4, max_iterations=2), "prompts"),
        (smelt.reinforcement(GRADER, batch_size=4, compute_multiplier=0.5, max_new_tokens=4, max_iterations=2),
         "prompts"),
    ]
    assert sorted(m["type"] for m, _ in methods) == sorted(smelt.METHOD_TYPES)
    for method, kind in methods:
        job = idle_client.jobs.create("tiny", files[kind], method=method, model_init="random",
                                      data={"max_seq_len": 32}, suffix=method["type"].replace("_", "-"))
        assert job["status"] == "queued" and job["method"]["type"] == method["type"], job
        assert idle_client.jobs.retrieve(job["id"])["id"] == job["id"]
        assert idle_client.jobs.cancel(job["id"])["status"] == "cancelled"
    with pytest.raises(TypeError):
        smelt.supervised(batch_size=1, **{"batch_size": 2})  # type: ignore[misc]


def test_pagination_walks_every_page(idle, idle_client, files):
    made = [idle_client.jobs.create("tiny", files["sft"], model_init="random", metadata={"n": str(i)})["id"]
            for i in range(7)]
    for job_id in made:
        idle_client.jobs.cancel(job_id)
    page = idle_client.jobs.list(limit=3)
    assert len(page.data) == 3 and page.has_more and page.has_next_page()
    walked = [j["id"] for j in page]
    status, full = idle.request("GET", "/v1/fine_tuning/jobs?limit=1000")
    assert walked == [j["id"] for j in full["data"]], "every job once, newest first"
    assert walked[:7] == made[::-1]
    cancelled = list(idle_client.jobs.list(limit=2, status="cancelled"))
    assert len(cancelled) == len(full["data"])
    # files: ascending order across pages
    ids = [f["id"] for f in idle_client.files.list(limit=1, order="asc")]
    assert ids == [files["sft"], files["preference"], files["prompts"]]
    # events of a job (newest first)
    events = list(idle_client.jobs.events(made[0], limit=1))
    assert len(events) >= 2 and len({e["id"] for e in events}) == len(events)
    assert [e["id"] for e in events] == [e["id"] for e in idle_client.jobs.events(made[0], limit=100).data]
    # schedules
    sched = [idle_client.schedules.create("0 3 * * *", {"model": "tiny", "training_file": files["sft"],
                                                         "model_init": "random"}, name="s%d" % i,
                                          suspended=True)["id"] for i in range(3)]
    assert [s["id"] for s in idle_client.schedules.list(limit=2)] == sched
    run = idle_client.schedules.trigger(sched[0])
    assert run["outcome"] == "created" and run["job_id"], run
    assert [r["job_id"] for r in idle_client.schedules.runs(sched[0])] == [run["job_id"]]
    idle_client.jobs.cancel(run["job_id"])
    assert idle_client.schedules.delete(sched[2])["deleted"] is True
    assert [s["id"] for s in idle_client.schedules.list()] == sched[:2]


def test_each_error_status_raises_its_exception(idle, idle_client, files):
    with pytest.raises(smelt.BadRequestError) as e:
        idle_client.jobs.create("tiny", files["sft"], method=smelt.supervised(batch_size=0))
    assert e.value.status_code == 400 and e.value.param == "method.supervised.hyperparameters.batch_size"
    assert e.value.type == "invalid_request_error" and "batch_size" in e.value.message
    with pytest.raises(smelt.BadRequestError) as e:
        idle_client.jobs.create("tiny", "file-nope")
    assert e.value.param == "training_file"

    bad = smelt.Client(idle.base_url, "sk-wrong-key-123456", max_retries=0)
    with pytest.raises(smelt.AuthenticationError) as e:
        bad.files.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"

    made = idle_client.api_keys.create("team-b", name="ci")
    assert made["key"] and made["project"] == "team-b"
    team = smelt.Client(idle.base_url, made["key"], max_retries=0)
    with pytest.raises(smelt.PermissionDeniedError) as e:
        team.api_keys.list()
    assert e.value.status_code == 403 and e.value.type == "permission_error"
    with pytest.raises(smelt.NotFoundError) as e:
        team.files.retrieve(files["sft"])  # another project's file is 404
    assert e.value.status_code == 404
    with pytest.raises(smelt.NotFoundError) as e:
        idle_client.jobs.retrieve("ftjob-doesnotexist")
    assert e.value.param == "fine_tuning_job_id"

    job = idle_client.jobs.create("tiny", files["sft"], model_init="random", idempotency_key="pyc-409")
    idle_client.jobs.cancel(job["id"])
    with pytest.raises(smelt.ConflictError) as e:
        idle_client.jobs.cancel(job["id"])
    assert e.value.status_code == 409 and e.value.code == "invalid_state"
    with pytest.raises(smelt.ConflictError) as e:  # the same key for another body
        idle_client.jobs.create("tiny", files["sft"], model_init="random", seed=3, idempotency_key="pyc-409")
    assert e.value.param == "Idempotency-Key"
    keys = idle_client.api_keys.list()
    assert [k for k in keys if k["id"] == made["id"]][0]["revoked"] == 0
    idle_client.api_keys.revoke(made["id"])
    with pytest.raises(smelt.AuthenticationError):
        team.files.list()
    with pytest.raises(smelt.ConflictError) as e:  # a key cannot revoke itself
        idle_client.api_keys.revoke(1)
    assert e.value.param == "key_id"

    with pytest.raises(smelt.RequestTooLargeError) as e:
        idle_client.jobs.create("tiny", files["sft"], metadata={"x": "y" * (1 << 20)})
    assert e.value.status_code == 413

    proxy = FaultProxy(idle.port, retry_after="0")
    try:
        via = smelt.Client(proxy.url, ADMIN_KEY, max_retries=1)
        proxy.faults = [("429", "GET", "/v1/models"), ("429", "GET", "/v1/models")]
        with pytest.raises(smelt.RateLimitError) as e:
            via.models.list()
        assert e.value.status_code == 429 and e.value.param == "proxy" and e.value.type == "rate_limit_error"
        proxy.faults = [("503", "GET", "/v1/cluster"), ("503", "GET", "/v1/cluster")]
        with pytest.raises(smelt.InternalServerError) as e:
            via.cluster.retrieve()
        assert e.value.status_code == 503 and e.value.message == "injected 503"
    finally:
        proxy.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(smelt.APIConnectionError):
        smelt.Client("http://127.0.0.1:%d" % port, ADMIN_KEY, max_retries=0).health()


def test_retries_create_one_job_under_one_idempotency_key(idle, files):
    proxy = FaultProxy(idle.port, retry_after="1")
    try:
        client = smelt.Client(proxy.url, ADMIN_KEY, max_retries=3)
        before = {j["id"] for j in client.jobs.list(limit=1000).data}
        proxy.faults = [("503", "POST", "/v1/fine_tuning/jobs"), ("drop", "POST", "/v1/fine_tuning/jobs")]
        start = time.monotonic()
        job = client.jobs.create("tiny", files["sft"], model_init="random", suffix="retried")
        elapsed = time.monotonic() - start
        posts = [h for m, p, h in proxy.requests if m == "POST" and p == "/v1/fine_tuning/jobs"]
        assert len(posts) == 3, posts
        keys = {h["idempotency-key"] for h in posts}
        assert len(keys) == 1 and next(iter(keys)).startswith("smelt-py-"), posts
        assert elapsed >= 1.0, "the 503's Retry-After: 1 was not honoured (%.2f s)" % elapsed
        after = [j for j in client.jobs.list(limit=1000).data if j["id"] not in before]
        assert [j["id"] for j in after] == [job["id"]], "the retries made one job"
        # a state change whose answer was lost: the retry's 409 is resolved from the job's state
        proxy.faults = [("drop", "POST", "/cancel")]
        assert client.jobs.cancel(job["id"])["status"] == "cancelled"
        # an upload is not repeated after a dropped connection (it could store the file twice)
        proxy.faults = [("drop", "POST", "/v1/files")]
        n_files = len(client.files.list().data)
        with pytest.raises(smelt.APIConnectionError):
            client.files.upload(b'{"prompt": "1+1=", "completion": "002"}\n', filename="once.jsonl")
        assert len(client.files.list().data) == n_files + 1
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def live():
    """A smeltd with its agent: jobs run."""
    tmp, s = start_server()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def test_wait_and_stream_events_across_a_cut_connection(live):
    proxy = FaultProxy(live.port)
    try:
        client = smelt.Client(proxy.url, ADMIN_KEY, max_retries=2)
        sizes = []
        f = client.files.upload(TRAIN_FILE, progress=lambda sent, total: sizes.append((sent, total)))
        assert f["status"] == "processed" and f["bytes"] == os.path.getsize(TRAIN_FILE)
        assert sizes[-1][0] == sizes[-1][1] and sizes == sorted(sizes) and len(sizes) >= 3
        assert client.files.validation(f["id"])["examples"] == 8000
        assert client.files.content(f["id"]) == open(TRAIN_FILE, "rb").read()
        hp = dict(SMALL_JOB["hyperparameters"], max_steps=20)
        job = client.jobs.create("tiny", f["id"], model_init="random", data={"max_seq_len": 32},
                                 method=smelt.supervised(**hp), checkpoint={"every_steps": 10})
        proxy.faults = [("cut_sse", "GET", "/events", 3), ("cut_sse", "GET", "/events", 4)]
        streamed, reconnects = [], []

        def reconnected(failures, error):  # the last event received before each reopening
            reconnects.append((error, streamed[-1]["id"] if streamed else None))

        # read_timeout 2: smeltd may hold a stream's last events back until its 15-s keep-alive
        for event in client.jobs.stream_events(job["id"], read_timeout=2, on_reconnect=reconnected):
            streamed.append(event)
        cuts = [r for r in reconnects if type(r[0]) is smelt.APIConnectionError]
        assert len(cuts) == 2, reconnects
        sse = [h for m, p, h in proxy.requests if m == "GET" and p.endswith("/events")]
        assert len(sse) == len(reconnects) + 1 and "last-event-id" not in sse[0], sse
        assert [h.get("last-event-id") for h in sse[1:]] == [last for _, last in reconnects], (sse, reconnects)
        assert cuts[0][1] == streamed[2]["id"] and cuts[1][1] == streamed[6]["id"], (cuts, streamed[:8])
        ids = [e["id"] for e in streamed]
        listed = [e["id"] for e in reversed(list(client.jobs.events(job["id"], limit=7)))]
        assert ids == listed, "every event exactly once, in order, across the cuts"
        final = client.jobs.wait(job["id"], timeout=60, poll_interval=0.1)
        assert final["status"] == "succeeded", (final, live.read_log())
        assert any(e["type"] == "metrics" and e["data"].get("train_loss") is not None for e in streamed)
        metrics = list(client.jobs.metrics(job["id"], limit=5))
        assert [r["id"] for r in metrics] == sorted({r["id"] for r in metrics}) and len(metrics) > 5
        assert [c["step_number"] for c in client.jobs.checkpoints(job["id"], limit=1)] == [20, 10]
        assert "step" in client.jobs.logs(job["id"], tail=4096).lower()
        assert final["fine_tuned_model"] in [m["id"] for m in client.models.list()]
        assert client.models.retrieve("tiny")["kind"] == "base"
        # a wait that times out says so, with the job as last seen
        queued = client.jobs.create("tiny", f["id"], model_init="random", method=smelt.supervised(max_steps=100000))
        with pytest.raises(smelt.WaitTimeoutError) as e:
            client.jobs.wait(queued["id"], timeout=0.3, poll_interval=0.1)
        assert isinstance(e.value, TimeoutError) and e.value.job["id"] == queued["id"]
        client.jobs.cancel(queued["id"])
        assert client.cluster.retrieve()["agents"][0]["status"] == "online"
        assert client.graders.run(GRADER, "042", item={"answer": "042"})["reward"] == 1.0
    finally:
        proxy.close()


def test_pip_install_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip("python3 -m venv cannot make a venv here: " + made.stderr.strip()[-300:])
    py = str(venv / "bin" / "python")
    # offline, the build runs in the venv's view of the system's setuptools: bdist_wheel comes
    # with setuptools 70.1 and newer, from the `wheel` package before (tests/requirements.txt)
    probe = subprocess.run([py, "-c", "import setuptools, sys\n"
                            "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])\n"
                            "if v < (70, 1): import wheel"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("cannot build a wheel offline: setuptools < 70.1 and no `wheel` package "
                    "(pip install -r tests/requirements.txt): " + probe.stderr.strip()[-200:])
    build = tmp_path / "src"  # a copy: the build writes egg-info and build/ beside the sources
    shutil.copytree(CLIENT_DIR, build, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
                        "--disable-pip-version-check", str(build)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "smelt"), "--help"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0 and "jobs" in r.stdout and "files" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([py, "-c", "import smelt, os; print(smelt.__version__, os.path.dirname(smelt.__file__))"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr
    assert os.path.exists(os.path.join(r.stdout.split()[1], "py.typed"))


def test_mypy_strict():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (tests/requirements.txt pins it; make deps-test installs it)")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", os.devnull,
                        os.path.join(CLIENT_DIR, "smelt")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
