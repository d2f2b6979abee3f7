"""Agents must be enrolled (docs/security.md): a real smeltd with a CURVE agents endpoint on
loopback, real smelt-agent processes with key files from /v1/cluster/agent_credentials, and
pyzmq clients playing the rogue. An agent with no credential, a revoked one, or another
agent's public key cannot register (and smeltd logs the refusal); an enrolled one runs a
job; revoking it loses the agent at once; rotation retires the old file; an enrolled agent
cannot report on another agent's job."""
import json
import os
import signal
import socket
import subprocess
import time

import pytest
import zmq

from conftest import BUILD, SMALL_JOB, TRAIN_FILE

NO_LOCAL = ["--no-local-agent"]
# A job that runs for minutes on one CPU slot: long enough to act on while it runs.
LONG_JOB = dict(SMALL_JOB, hyperparameters={"n_epochs": 50, "batch_size": 16, "max_steps": 100000,
                                            "learning_rate": 0.003}, max_retries=1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_secure(start_smeltd, extra=()):
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    return start_smeltd(extra_args=["--agents", endpoint] + NO_LOCAL + list(extra)), endpoint


def enroll(smeltd, agent_id, directory):
    status, cred = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": agent_id})
    assert status == 200, cred
    return cred, write_key_file(cred["key_file"], os.path.join(directory, agent_id + ".key"))


def write_key_file(doc, path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return path


class Agent:
    """A smelt-agent process; its output in a log file beside smeltd's."""

    def __init__(self, smeltd, name, args, launcher=()):
        self.log_path = os.path.join(smeltd.data_dir, "agent-%s.log" % name)
        self.log = open(self.log_path, "ab")
        argv = list(launcher) + [os.path.join(BUILD, "smelt-agent"), "--cpu", "--cpu-slots", "1", "--heartbeat-ms", "200"] + args
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


@pytest.fixture
def agents():
    started = []

    def start(smeltd, name, args, launcher=()):
        a = Agent(smeltd, name, args, launcher)
        started.append(a)
        return a

    yield start
    for a in started:
        a.stop()


def cluster_agent(smeltd, agent_id):
    status, body = smeltd.request("GET", "/v1/cluster")
    assert status == 200, body
    return next((a for a in body["agents"] if a["id"] == agent_id), None)


def wait_agent(smeltd, agent_id, state, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        a = cluster_agent(smeltd, agent_id)
        if a and a["status"] == state:
            return a
        time.sleep(0.1)
    raise AssertionError("agent %s not %s: %s\n%s" % (agent_id, state, cluster_agent(smeltd, agent_id),
                                                       smeltd.read_log_all()[-4000:]))


def wait_log(smeltd, text, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in smeltd.read_log_all():
            return
        time.sleep(0.1)
    raise AssertionError("smeltd's log lacks %r:\n%s" % (text, smeltd.read_log_all()[-4000:]))


def create_job(smeltd, body):
    status, f = smeltd.upload(TRAIN_FILE)
    assert status == 200, f
    status, job = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(body, training_file=f["id"]))
    assert status == 200, job
    return job


def events(smeltd, job_id):
    status, body = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/events?limit=1000" % job_id)
    assert status == 200, body
    return body["data"]


def wait_event(smeltd, job_id, text, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(text in e["message"] for e in events(smeltd, job_id)):
            return
        time.sleep(0.2)
    raise AssertionError("no event %r: %s" % (text, [e["message"] for e in events(smeltd, job_id)]))


class Rogue:
    """A pyzmq DEALER that speaks the agents' protocol (common/msg.h) with any keys."""

    def __init__(self, endpoint, public, secret, server_public, routing_id=None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if routing_id:
            self.sock.routing_id = routing_id.encode()
        if public:
            self.sock.curve_publickey = public.encode()
            self.sock.curve_secretkey = secret.encode()
            self.sock.curve_serverkey = server_public.encode()
        self.sock.connect(endpoint)

    def send(self, type_, header):
        self.sock.send_multipart([type_.encode(), json.dumps(dict(header, v=1)).encode()])

    def register(self, agent_id):
        self.send("agent.register", {"agent_id": agent_id, "hostname": "rogue", "devices": [
            {"index": 0, "kind": "cpu", "name": "cpu slot 0", "memory_bytes": 1 << 30}], "running": []})

    def recv(self, timeout_ms=3000):
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        return frames[0].decode(), json.loads(frames[1])

    def close(self):
        self.sock.close()
        self.ctx.term()


def test_credentials_api(start_smeltd, tmp_path):
    smeltd, endpoint = start_secure(start_smeltd)
    status, cluster = smeltd.request("GET", "/v1/cluster")
    assert cluster["agents_security"] == "curve"
    cred, _ = enroll(smeltd, "node-a", str(tmp_path))
    key_file = cred["key_file"]
    assert key_file["agent_id"] == "node-a" and key_file["endpoint"] == endpoint
    assert key_file["public_key"] == cred["public_key"] and len(key_file["secret_key"]) == 40
    assert cred["live"] is True and cred["revoked_at"] is None
    # a second live credential of one agent: the agent's state refuses it (409, as the document says)
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": "node-a"})
    assert status == 409 and err["error"]["param"] == "agent_id", err
    assert err["error"]["code"] == "invalid_state", err
    for bad in ("local", "", "a b", "x" * 64):
        status, err = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": bad})
        assert status == 400 and err["error"]["param"] == "agent_id", (bad, err)
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": "n", "secret": "x"})
    assert status == 400, err
    # the endpoint an agent reaches smeltd at, when it is not the bind address
    status, other = smeltd.request("POST", "/v1/cluster/agent_credentials",
                                   {"agent_id": "node-e", "endpoint": "tcp://10.1.2.3:7071"})
    assert status == 200 and other["key_file"]["endpoint"] == "tcp://10.1.2.3:7071", other
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials",
                                 {"agent_id": "node-f", "endpoint": "http://10.1.2.3"})
    assert status == 400 and err["error"]["param"] == "endpoint", err
    status, _ = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/revoke" % other["id"])
    assert status == 200
    status, listed = smeltd.request("GET", "/v1/cluster/agent_credentials")
    assert status == 200 and [c["id"] for c in listed["data"]] == [cred["id"], other["id"]]
    assert "secret_key" not in json.dumps(listed) and "key_file" not in listed["data"][0]
    # admin keys only
    status, key = smeltd.request("POST", "/v1/api_keys", {"project": "p1", "name": "user"})
    assert status == 200, key
    status, err = smeltd.request("GET", "/v1/cluster/agent_credentials", key=key["key"])
    assert status == 403, err
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": "node-z"}, key=key["key"])
    assert status == 403, err
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials/agc-nope/revoke")
    assert status == 404, err
    status, revoked = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/revoke" % cred["id"])
    assert status == 200 and revoked["live"] is False and revoked["revoked_at"], revoked
    status, err = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/revoke" % cred["id"])
    assert status == 409 and err["error"]["param"] == "credential_id", err
    # a revoked agent id may be enrolled again
    status, again = smeltd.request("POST", "/v1/cluster/agent_credentials", {"agent_id": "node-a"})
    assert status == 200 and again["id"] != cred["id"], again


def test_agents_without_a_live_credential_cannot_register(start_smeltd, agents, tmp_path):
    smeltd, endpoint = start_secure(start_smeltd)
    server_public = None
    # no credential at all: a plain smelt-agent
    agents(smeltd, "plain", ["--server", endpoint, "--id", "rogue-plain"])
    # a revoked credential
    cred, path = enroll(smeltd, "node-r", str(tmp_path))
    server_public = cred["key_file"]["server_public_key"]
    status, _ = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/revoke" % cred["id"])
    assert status == 200
    agents(smeltd, "revoked", ["--credential", path])
    # another agent's public key with a secret of its own
    victim, _ = enroll(smeltd, "node-v", str(tmp_path))
    own_public, own_secret = zmq.curve_keypair()
    thief = Rogue(endpoint, victim["public_key"], own_secret.decode(), server_public)
    thief.register("node-v")
    # wrong server key: a man in the middle's
    mitm_public, _ = zmq.curve_keypair()
    wrong = Rogue(endpoint, victim["key_file"]["public_key"], victim["key_file"]["secret_key"], mitm_public.decode())
    wrong.register("node-v")
    try:
        wait_log(smeltd, "no CURVE handshake (not CURVE")
        wait_log(smeltd, "refused a agents connection")  # the ZAP handler: a revoked key
        wait_log(smeltd, "its key is no live agent credential's")
        wait_log(smeltd, "cryptographic failure")
        assert thief.recv(500) is None and wrong.recv(500) is None
        time.sleep(1.0)
        status, body = smeltd.request("GET", "/v1/cluster")
        assert body["agents"] == [], body
    finally:
        thief.close()
        wrong.close()


def test_enrolled_agent_runs_a_job_and_revocation_loses_it(start_smeltd, agents, tmp_path):
    smeltd, endpoint = start_secure(start_smeltd)
    cred, path = enroll(smeltd, "node-a", str(tmp_path))
    agent = agents(smeltd, "a", ["--credential", path])  # the endpoint comes from the key file
    wait_agent(smeltd, "node-a", "online")
    job = create_job(smeltd, SMALL_JOB)
    done = smeltd.wait_job(job["id"], ("succeeded", "failed"))
    assert done["status"] == "succeeded", (done, smeltd.read_log_all()[-3000:])
    assert any("Job started on node-a" in e["message"] for e in events(smeltd, job["id"]))

    long_job = create_job(smeltd, LONG_JOB)
    wait_event(smeltd, long_job["id"], "Step ")
    status, _ = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/revoke" % cred["id"])
    assert status == 200
    wait_agent(smeltd, "node-a", "lost", timeout=5)  # at once, not after --agent-lost-ms of silence
    job = smeltd.wait_job(long_job["id"], ("queued",), timeout=10)
    assert job["status"] == "queued"
    wait_event(smeltd, long_job["id"], "the worker was lost with its agent", timeout=5)
    wait_event(smeltd, long_job["id"], "retrying from the last checkpoint (retry 1 of 1)", timeout=5)
    wait_log(smeltd, "agent node-a's credential was revoked: lost")
    # its worker is stopped on the connection it still had, so the retry never runs beside it
    deadline = time.monotonic() + 10
    while "stopping job %s attempt 1" % long_job["id"] not in agent.read_log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "the agent's credential was revoked" in agent.read_log(), agent.read_log()[-2000:]
    wait_log(smeltd, "dropped a agent.heartbeat from a connection of agent credential %s: revoked" % cred["id"])
    time.sleep(1.0)
    assert cluster_agent(smeltd, "node-a")["status"] == "lost"  # its heartbeats change nothing
    assert agent.proc.poll() is None
    status, _ = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % long_job["id"])
    assert status == 200


def test_rotation_retires_the_old_key_file(start_smeltd, agents, tmp_path):
    smeltd, endpoint = start_secure(start_smeltd)
    cred, old_path = enroll(smeltd, "node-a", str(tmp_path))
    first = agents(smeltd, "first", ["--credential", old_path])
    wait_agent(smeltd, "node-a", "online")
    status, rotated = smeltd.request("POST", "/v1/cluster/agent_credentials/%s/rotate" % cred["id"])
    assert status == 200, rotated
    assert rotated["agent_id"] == "node-a" and rotated["id"] != cred["id"] and rotated["live"]
    new_path = write_key_file(rotated["key_file"], os.path.join(str(tmp_path), "node-a.new.key"))
    wait_agent(smeltd, "node-a", "lost", timeout=5)  # the old key's session ends at once
    first.stop()
    smeltd_log_len = len(smeltd.read_log_all())
    agents(smeltd, "old-again", ["--credential", old_path])
    wait_log(smeltd, "its key is no live agent credential's")
    time.sleep(1.0)
    assert cluster_agent(smeltd, "node-a")["status"] == "lost"
    assert "refused a agents connection" in smeltd.read_log_all()[smeltd_log_len:]
    agents(smeltd, "new", ["--credential", new_path])
    wait_agent(smeltd, "node-a", "online")
    status, listed = smeltd.request("GET", "/v1/cluster/agent_credentials")
    live = [c["id"] for c in listed["data"] if c["live"]]
    assert live == [rotated["id"]], listed


def test_forged_worker_messages_from_another_agent_change_nothing(start_smeltd, agents, tmp_path):
    smeltd, endpoint = start_secure(start_smeltd)
    _, path_a = enroll(smeltd, "node-a", str(tmp_path))
    cred_b, _ = enroll(smeltd, "node-b", str(tmp_path))
    agents(smeltd, "a", ["--credential", path_a])
    wait_agent(smeltd, "node-a", "online")
    job = create_job(smeltd, LONG_JOB)
    wait_event(smeltd, job["id"], "Step ")
    kf = cred_b["key_file"]
    b = Rogue(endpoint, kf["public_key"], kf["secret_key"], kf["server_public_key"])
    try:
        b.register("node-a")  # another agent's id: refused
        kind, header = b.recv()
        assert kind == "agent.error" and header["error"]["field"] == "agent_id", header
        wait_log(smeltd, "refused agent.register as 'node-a' from agent node-b")
        b.register("node-b")  # its own: fine, but it has no devices in use
        kind, header = b.recv()
        assert kind == "agent.registered", header
        wait_agent(smeltd, "node-b", "online")
        before = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job["id"])[1]
        attempt = 1
        b.send("worker.event", {"agent_id": "node-b", "job_id": job["id"], "attempt": attempt, "offset": 1 << 40,
                                "line": {"type": "train", "step": 999999, "loss": 12345.0}})
        b.send("worker.event", {"agent_id": "node-b", "job_id": job["id"], "attempt": attempt, "offset": 1 << 41,
                                "line": {"type": "final", "step": 999999}})
        b.send("worker.exited", {"agent_id": "node-b", "job_id": job["id"], "attempt": attempt, "exit_code": 0,
                                 "signal": 0})
        b.send("worker.started", {"agent_id": "node-b", "job_id": job["id"], "attempt": attempt, "pid": 1})
        wait_log(smeltd, "dropped worker.exited for %s attempt 1 from agent node-b" % job["id"])
        wait_log(smeltd, "dropped worker.event for %s attempt 1 from agent node-b" % job["id"])
        time.sleep(1.0)
        after = smeltd.request("GET", "/v1/fine_tuning/jobs/" + job["id"])[1]
        assert after["status"] == "running" == before["status"], after
        messages = [e["message"] for e in events(smeltd, job["id"])]
        assert not any("999999/" in m or "=12345" in m or "exited" in m or "finished" in m for m in messages), messages
        status, metrics = smeltd.request("GET", "/v1/fine_tuning/jobs/%s/metrics" % job["id"])
        assert status == 200 and metrics["data"], metrics
        assert not [m for m in metrics["data"] if m.get("step") == 999999 or m.get("type") == "final"], metrics
    finally:
        b.close()
    status, _ = smeltd.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % job["id"])
    assert status == 200


def test_insecure_agents_is_explicit(start_smeltd, agents):
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    smeltd = start_smeltd(extra_args=["--agents", endpoint, "--insecure-agents"] + NO_LOCAL)
    wait_log(smeltd, "--insecure-agents: anyone who reaches %s can join" % endpoint)
    status, cluster = smeltd.request("GET", "/v1/cluster")
    assert cluster["agents_security"] == "insecure"
    agents(smeltd, "plain", ["--server", endpoint, "--id", "node-p"])
    wait_agent(smeltd, "node-p", "online")


def run_cli(*args):
    return subprocess.run([os.path.join(BUILD, "smeltd"), "agent-credential"] + list(args),
                          capture_output=True, text=True, timeout=60)


def test_agent_credential_subcommand(tmp_path):
    data, out = str(tmp_path / "data"), str(tmp_path / "node-c.key")
    r = run_cli("create", "--data", data, "--agent-id", "node-c", "--out", out, "--endpoint", "tcp://10.0.0.5:7071")
    assert r.returncode == 0, r.stderr
    created = json.loads(r.stdout)
    assert os.stat(out).st_mode & 0o777 == 0o600
    with open(out) as f:
        key_file = json.load(f)
    with open(os.path.join(data, "server.key")) as f:
        server_key = json.load(f)
    assert key_file["agent_id"] == "node-c" and key_file["credential_id"] == created["id"]
    assert key_file["public_key"] == created["public_key"] and key_file["endpoint"] == "tcp://10.0.0.5:7071"
    assert key_file["server_public_key"] == server_key["public_key"]
    assert "secret_key" not in r.stdout
    r = run_cli("create", "--data", data, "--agent-id", "node-c", "--out", str(tmp_path / "again.key"))
    assert r.returncode == 2 and "already has a live credential" in r.stderr, r
    assert not os.path.exists(str(tmp_path / "again.key"))
    # a key file that cannot be written is refused before the store changes: no credential for node-d,
    # and a rotation onto an existing file leaves node-c's credential live (not revoked with no successor)
    r = run_cli("create", "--data", data, "--agent-id", "node-d", "--out", out)
    assert r.returncode != 0 and out in r.stderr and "never overwritten" in r.stderr, r
    r = run_cli("rotate", "--data", data, "--id", created["id"], "--out", out)
    assert r.returncode != 0 and "never overwritten" in r.stderr, r
    r = run_cli("list", "--data", data)
    listed = json.loads(r.stdout)
    assert [(c["agent_id"], c["live"]) for c in listed] == [("node-c", True)], listed
    r = run_cli("rotate", "--data", data, "--id", created["id"], "--out", str(tmp_path / "node-c.new.key"))
    assert r.returncode == 0, r.stderr
    rotated = json.loads(r.stdout)
    r = run_cli("revoke", "--data", data, "--id", created["id"])
    assert r.returncode == 2 and "already revoked" in r.stderr, r
    r = run_cli("revoke", "--data", data, "--id", rotated["id"])
    assert r.returncode == 0 and json.loads(r.stdout)["live"] is False, r
    r = run_cli("create", "--data", data, "--agent-id", "local", "--out", str(tmp_path / "l.key"))
    assert r.returncode == 2 and "embedded agent" in r.stderr, r
    assert run_cli("bogus", "--data", data).returncode == 2
    assert run_cli("list").returncode == 2  # --data is required


def test_a_restarted_smeltd_places_jobs_only_on_agents_it_can_reach(start_smeltd, agents, tmp_path):
    """After a restart the agents' rows still say online, but smeltd has no connection of
    theirs yet: a job is placed once the agent is heard from, never launched into the void."""
    smeltd, endpoint = start_secure(start_smeltd)
    cred, path = enroll(smeltd, "node-a", str(tmp_path))
    agents(smeltd, "a", ["--credential", path])
    wait_agent(smeltd, "node-a", "online")
    smeltd.kill()
    again = start_smeltd(data_dir=smeltd.data_dir, models_dir=smeltd.models_dir,
                         extra_args=["--agents", endpoint] + NO_LOCAL)
    job = create_job(again, SMALL_JOB)
    done = again.wait_job(job["id"], ("succeeded", "failed"), timeout=120)
    assert done["status"] == "succeeded", (done, again.read_log_all()[-3000:])
    assert "not connected on a live credential" not in again.read_log_all()
