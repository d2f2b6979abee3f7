"""Malformed and hostile requests: each gets the right status and OpenAI's error body,
and the server keeps serving."""
import json
import socket

import pytest

from conftest import ADMIN_KEY, SMALL_JOB, TRAIN_FILE


def raw(server, data, timeout=10):
    """Sends raw bytes, returns the status line's code (or None when the server closed)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    finally:
        s.close()
    text = b"".join(chunks)
    if not text.startswith(b"HTTP/1."):
        return None, text
    return int(text.split(b" ", 2)[1]), text


@pytest.fixture(scope="module")
def other_key(smeltd):
    status, body = smeltd.request("POST", "/v1/api_keys", {"project": "other", "name": "intruder"})
    assert status == 200, body
    return body["key"]


@pytest.fixture(scope="module")
def job_id(smeltd, train_file_id):
    status, job = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(SMALL_JOB, training_file=train_file_id))
    assert status == 200, job
    smeltd.wait_job(job["id"], {"succeeded", "failed"})
    return job["id"]


@pytest.fixture(scope="module")
def schedule_id(smeltd, train_file_id):
    status, s = smeltd.request("POST", "/v1/fine_tuning/schedules",
                               {"cron": "0 0 1 1 *", "job": dict(SMALL_JOB, training_file=train_file_id),
                                "suspended": True})
    assert status == 200, s
    return s["id"]


def job_body(file_id, **changes):
    body = json.loads(json.dumps(dict(SMALL_JOB, training_file=file_id)))
    for k, v in changes.items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    return body


def cases(file_id, job_id, schedule_id, other_key):
    J = "/v1/fine_tuning/jobs"
    hp = lambda **kw: dict(SMALL_JOB["hyperparameters"], **kw)
    return [
        # (name, method, path, body or raw bytes, key, headers, status, param)
        ("no key", "GET", J, None, None, None, 401, None),
        ("wrong key", "GET", J, None, "sk-not-a-real-key-000", None, 401, None),
        ("admin route with project key", "GET", "/v1/api_keys", None, other_key, None, 403, None),
        ("bad json", "POST", J, b"{\"model\": ", ADMIN_KEY, None, 400, None),
        ("json array body", "POST", J, b"[1,2]", ADMIN_KEY, None, 400, None),
        ("empty body", "POST", J, b"", ADMIN_KEY, None, 400, None),
        ("duplicate keys", "POST", J, b'{"model":"tiny","model":"x"}', ADMIN_KEY, None, 400, None),
        ("missing model", "POST", J, job_body(file_id, model=None), ADMIN_KEY, None, 400, "model"),
        ("model wrong type", "POST", J, job_body(file_id, model=5), ADMIN_KEY, None, 400, "model"),
        ("unknown model", "POST", J, job_body(file_id, model="gpt-9"), ADMIN_KEY, None, 400, "model"),
        ("model path traversal", "POST", J, job_body(file_id, model="../../etc"), ADMIN_KEY, None, 400, "model"),
        ("missing training_file", "POST", J, job_body(file_id, training_file=None), ADMIN_KEY, None, 400, "training_file"),
        ("unknown training file", "POST", J, job_body("file-0000"), ADMIN_KEY, None, 400, "training_file"),
        ("unknown field", "POST", J, job_body(file_id, colour="red"), ADMIN_KEY, None, 400, "colour"),
        ("negative epochs", "POST", J, job_body(file_id, hyperparameters=hp(n_epochs=-1)), ADMIN_KEY, None, 400,
         "hyperparameters.n_epochs"),
        ("epochs as string", "POST", J, job_body(file_id, hyperparameters=hp(n_epochs="many")), ADMIN_KEY, None, 400,
         "hyperparameters.n_epochs"),
        ("zero batch", "POST", J, job_body(file_id, hyperparameters=hp(batch_size=0)), ADMIN_KEY, None, 400,
         "hyperparameters.batch_size"),
        ("negative lr multiplier", "POST", J, job_body(file_id, hyperparameters=hp(learning_rate_multiplier=-2)),
         ADMIN_KEY, None, 400, "hyperparameters.learning_rate_multiplier"),
        ("unknown hyperparameter", "POST", J, job_body(file_id, hyperparameters=hp(momentum=0.9)), ADMIN_KEY, None,
         400, "hyperparameters.momentum"),
        ("a server path as training data", "POST", J, job_body(file_id, data={"train": "/etc/shadow"}), ADMIN_KEY,
         None, 400, "data.train"),
        ("a server path as validation data", "POST", J, job_body(file_id, data={"validation": "/etc/passwd"}),
         ADMIN_KEY, None, 400, "data.validation"),
        ("huge learning rate", "POST", J, job_body(file_id, hyperparameters=hp(learning_rate=1e9)), ADMIN_KEY, None,
         400, "hyperparameters.learning_rate"),
        ("bad method type", "POST", J, job_body(file_id, method={"type": "magic"}), ADMIN_KEY, None, 400, "method.type"),
        ("ppo on SFT rows", "POST", J, job_body(file_id, method={"type": "ppo"}, hyperparameters=None), ADMIN_KEY,
         None, 400, "training_file"),
        ("dpo on SFT rows", "POST", J, job_body(file_id, method={"type": "dpo"}, hyperparameters=None), ADMIN_KEY,
         None, 400, "training_file"),
        ("dpo with top-level hyperparameters", "POST", J, job_body(file_id, method={"type": "dpo"}), ADMIN_KEY, None,
         400, "hyperparameters"),
        ("suffix with slash", "POST", J, job_body(file_id, suffix="a/b"), ADMIN_KEY, None, 400, "suffix"),
        ("suffix too long", "POST", J, job_body(file_id, suffix="x" * 100), ADMIN_KEY, None, 400, "suffix"),
        ("negative seed", "POST", J, job_body(file_id, seed=-5), ADMIN_KEY, None, 400, "seed"),
        ("metadata not strings", "POST", J, job_body(file_id, metadata={"a": 1}), ADMIN_KEY, None, 400, "metadata"),
        ("priority out of range", "POST", J, job_body(file_id, priority=1000), ADMIN_KEY, None, 400, "priority"),
        ("negative retries", "POST", J, job_body(file_id, max_retries=-1), ADMIN_KEY, None, 400, "max_retries"),
        ("zero devices", "POST", J, job_body(file_id, resources={"devices": 0}), ADMIN_KEY, None, 400,
         "resources.devices"),
        ("lora rank zero", "POST", J, job_body(file_id, model_init=None, lora={"rank": 0}), ADMIN_KEY, None, 400, None),
        ("seq len too long", "POST", J, job_body(file_id, data={"max_seq_len": 10 ** 9}), ADMIN_KEY, None, 400,
         "data.max_seq_len"),
        ("integrations", "POST", J, job_body(file_id, integrations=[{"type": "wandb"}]), ADMIN_KEY, None, 400,
         "integrations"),
        ("empty idempotency key", "POST", J, job_body(file_id), ADMIN_KEY, {"Idempotency-Key": ""}, 400, None),
        ("unknown job", "GET", J + "/ftjob-nope", None, ADMIN_KEY, None, 404, None),
        ("traversal in job id", "GET", J + "/..%2F..%2Fetc%2Fpasswd", None, ADMIN_KEY, None, 404, None),
        ("another project's job", "GET", J + "/" + job_id, None, other_key, None, 404, None),
        ("another project's job cancel", "POST", J + "/" + job_id + "/cancel", None, other_key, None, 404, None),
        ("another project's events", "GET", J + "/" + job_id + "/events", None, other_key, None, 404, None),
        ("another project's file", "GET", "/v1/files/" + file_id, None, other_key, None, 404, None),
        ("another project's file content", "GET", "/v1/files/" + file_id + "/content", None, other_key, None, 404, None),
        ("another project's schedule", "GET", "/v1/fine_tuning/schedules/" + schedule_id, None, other_key, None, 404,
         None),
        ("other project uses my file", "POST", J, job_body(file_id), other_key, None, 400, "training_file"),
        ("cancel finished job", "POST", J + "/" + job_id + "/cancel", None, ADMIN_KEY, None, 409, None),
        ("resume finished job", "POST", J + "/" + job_id + "/resume", None, ADMIN_KEY, None, 409, None),
        ("pause finished job", "POST", J + "/" + job_id + "/pause", None, ADMIN_KEY, None, 409, None),
        ("limit zero", "GET", J + "?limit=0", None, ADMIN_KEY, None, 400, "limit"),
        ("limit negative", "GET", J + "?limit=-3", None, ADMIN_KEY, None, 400, "limit"),
        ("limit not a number", "GET", J + "?limit=ten", None, ADMIN_KEY, None, 400, "limit"),
        ("bad status filter", "GET", J + "?status=exploded", None, ADMIN_KEY, None, 400, "status"),
        ("bad event cursor", "GET", J + "/" + job_id + "/events?after=yesterday", None, ADMIN_KEY, None, 400, "after"),
        ("bad Last-Event-ID", "GET", J + "/" + job_id + "/events", None, ADMIN_KEY,
         {"Accept": "text/event-stream", "Last-Event-ID": "zzz"}, 400, "Last-Event-ID"),
        ("bad log tail", "GET", J + "/" + job_id + "/logs?tail=-1", None, ADMIN_KEY, None, 400, "tail"),
        ("bad cron", "POST", "/v1/fine_tuning/schedules", {"cron": "61 * * * *", "job": job_body(file_id)},
         ADMIN_KEY, None, 400, "cron"),
        ("cron with 4 fields", "POST", "/v1/fine_tuning/schedules", {"cron": "* * * *", "job": job_body(file_id)},
         ADMIN_KEY, None, 400, "cron"),
        ("cron never fires", "POST", "/v1/fine_tuning/schedules", {"cron": "0 0 30 2 *", "job": job_body(file_id)},
         ADMIN_KEY, None, 400, "cron"),
        ("schedule bad template", "POST", "/v1/fine_tuning/schedules",
         {"cron": "* * * * *", "job": job_body(file_id, model="nope")}, ADMIN_KEY, None, 400, "job.model"),
        ("schedule bad policy", "POST", "/v1/fine_tuning/schedules",
         {"cron": "* * * * *", "job": job_body(file_id), "concurrency_policy": "sometimes"}, ADMIN_KEY, None, 400,
         "concurrency_policy"),
        ("unknown route", "GET", "/v1/nothing/here", None, ADMIN_KEY, None, 404, None),
        ("wrong method", "DELETE", J, None, ADMIN_KEY, None, 405, None),
        ("static traversal", "GET", "/../../etc/passwd", None, None, None, 404, None),
        ("static hidden", "GET", "/.git/config", None, None, None, 404, None),
        ("unknown model get", "GET", "/v1/models/none", None, ADMIN_KEY, None, 404, None),
        ("model id traversal", "GET", "/v1/models/..", None, ADMIN_KEY, None, 404, None),
        ("revoke unknown key", "DELETE", "/v1/api_keys/99999", None, ADMIN_KEY, None, 404, None),
        ("key for bad project", "POST", "/v1/api_keys", {"project": "../x"}, ADMIN_KEY, None, 400, "project"),
    ]


def test_malformed_and_hostile_requests(smeltd, train_file_id, job_id, schedule_id, other_key):
    table = cases(train_file_id, job_id, schedule_id, other_key)
    assert len(table) >= 40
    failures = []
    for name, method, path, body, key, headers, want, param in table:
        kwargs = {"key": key, "headers": headers}
        if isinstance(body, (bytes, bytearray)):
            kwargs["raw"] = body
            kwargs["headers"] = dict(headers or {}, **{"Content-Type": "application/json"})
        elif body is not None:
            kwargs["body"] = body
        status, resp = smeltd.request(method, path, **kwargs)
        ok = status == want and isinstance(resp, dict) and set(resp.get("error", {})) >= {"message", "type", "param",
                                                                                           "code"}
        if ok and param is not None:
            ok = resp["error"]["param"] == param
        if not ok:
            failures.append((name, status, want, param, resp))
        # the server is still serving after every case
        assert smeltd.request("GET", "/healthz", key=None)[0] == 200, name
    assert not failures, "\n".join(repr(f) for f in failures)


def test_upload_refusals(smeltd, other_key):
    status, body = smeltd.upload_bytes(b'{"prompt": "a", "completion": "b"}\n', "x.jsonl", purpose="batch")
    assert status == 400 and body["error"]["param"] == "purpose"
    status, body = smeltd.upload_bytes(b'{"prompt": "a", "completion": "b"}\n', "x.jsonl", purpose=None)
    assert status == 400 and body["error"]["param"] == "purpose"
    status, body = smeltd.upload_bytes(b"", "x.jsonl")
    assert status == 400 and body["error"]["param"] == "file"
    # an invalid file is kept with its line-numbered report, and a job cannot use it
    bad = b'{"prompt": "a", "completion": "b"}\n{"prompt": 5}\nnot json\n'
    status, f = smeltd.upload_bytes(bad, "bad.jsonl")
    assert status == 200 and f["status"] == "error", f
    lines = [e["line"] for e in f["validation"]["errors"]]
    assert lines == [2, 3], f["validation"]
    status, body = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(SMALL_JOB, training_file=f["id"]))
    assert status == 400 and body["error"]["param"] == "training_file" and "line 2" in body["error"]["message"]
    # multipart without boundary, garbage multipart
    status, body = smeltd.request("POST", "/v1/files", raw=b"xx", headers={"Content-Type": "multipart/form-data"})
    assert status == 400
    status, body = smeltd.request("POST", "/v1/files", raw=b"--b\r\nnothing", headers={
        "Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400


def test_huge_bodies_are_refused(smeltd, train_file_id):
    auth = b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\n"
    # a JSON body over 1 MiB: refused from its Content-Length, before it is read
    code, text = raw(smeltd, b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\n" + auth +
                     b"Content-Type: application/json\r\nContent-Length: 2097152\r\n\r\n")
    assert code == 413, text
    body = json.loads(text.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["type"] == "invalid_request_error"
    # an upload over the upload limit
    code, _ = raw(smeltd, b"POST /v1/files HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 99999999999\r\n\r\n")
    assert code == 413
    # a chunked JSON body that grows past the limit
    chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
    try:
        code, _ = raw(smeltd, b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\n" + auth +
                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 20 +
                      b"0\r\n\r\n")
        assert code == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before taking the whole body
    assert smeltd.request("GET", "/healthz", key=None)[0] == 200


def test_garbage_bytes_and_half_requests(smeltd):
    for junk in (b"\x00\x01\x02garbage\r\n\r\n", b"GET\r\n\r\n", b"GET /healthz HTTP/9.9\r\n\r\n",
                 b"GET /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"A" * 10000 + b"\r\n\r\n",
                 b"POST /v1/fine_tuning/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a"):
        try:
            raw(smeltd, junk, timeout=3)
        except TimeoutError:
            pass  # libmicrohttpd keeps some broken connections until its idle timeout
        assert smeltd.request("GET", "/healthz", key=None)[0] == 200


def test_idempotency_key_makes_create_safe(smeltd, train_file_id):
    body = dict(SMALL_JOB, training_file=train_file_id, suffix="idem")
    s1, j1 = smeltd.request("POST", "/v1/fine_tuning/jobs", body, headers={"Idempotency-Key": "k-123"})
    s2, j2 = smeltd.request("POST", "/v1/fine_tuning/jobs", body, headers={"Idempotency-Key": "k-123"})
    assert s1 == 200 and s2 == 200 and j1["id"] == j2["id"]
    s3, e = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(body, suffix="other"),
                           headers={"Idempotency-Key": "k-123"})
    assert s3 == 409, e
    smeltd.wait_job(j1["id"], {"succeeded", "failed"})


def test_metrics_endpoint(smeltd):
    status, text = smeltd.request("GET", "/metrics")
    assert status == 200
    for name in ("smelt_jobs{status=\"queued\"}", "smelt_queue_length", "smelt_devices{state=\"free\"}",
                 "smelt_http_requests_total{code=\"2xx\"}", "smelt_http_request_duration_seconds_bucket",
                 "smelt_job_retries_total"):
        assert name in text, name
    assert smeltd.request("GET", "/metrics", key=None)[0] == 401


def test_many_requests_do_not_exhaust_the_store(start_smeltd):
    """More creates, cancels and reads than the store has connections: a connection not
    given back would hang the server here."""
    server = start_smeltd(extra_args=("--no-local-agent",))
    status, f = server.upload(TRAIN_FILE)
    assert status == 200
    ids = []
    for i in range(40):
        status, job = server.request("POST", "/v1/fine_tuning/jobs", dict(SMALL_JOB, training_file=f["id"]),
                                     headers={"Idempotency-Key": "many-%d" % (i % 30)})
        assert status == 200, job
        ids.append(job["id"])
    for job_id in ids[:20]:
        for path in ("", "/events", "/checkpoints", "/metrics", "/logs"):
            assert server.request("GET", "/v1/fine_tuning/jobs/" + job_id + path)[0] == 200
        server.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % job_id)
        assert server.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % job_id)[0] in (409,)
        assert server.request("POST", "/v1/fine_tuning/jobs/%s/resume" % job_id)[0] == 409
    for _ in range(20):
        for path in ("/v1/files", "/v1/models", "/v1/cluster", "/metrics", "/v1/fine_tuning/jobs?limit=5"):
            assert server.request("GET", path)[0] == 200
        assert server.request("GET", "/v1/files/file-nope")[0] == 404
        assert server.request("GET", "/v1/models/nope")[0] == 404
    status, page = server.request("GET", "/v1/fine_tuning/jobs?limit=100&status=queued")
    assert len(page["data"]) == 10  # 30 distinct keys, 20 of them cancelled
