"""The endpoint grader through the API: GRPO jobs whose reward is
`{"grader": {"type": "endpoint", "url": ...}}`, served by a small Python http.server in
this test on 127.0.0.1 (the trainer, a child of smeltd's local agent, makes the requests).

A service that answers: the job succeeds, every request carried the samples as
docs/rewards.md says (the prompt as the model saw it, the completion, the row's fields as
`item`, finish_reason, n_completion_tokens), and each iteration's reward metrics are the
mean of the rewards the service gave for that iteration's request. A service that
replies garbage, and one slower than `timeout_s`: every sample's reward fails, each
iteration reports it in a warning event naming the grader and the cause (the body's
first bytes, the timeout), nothing crashes, and after 3 such iterations in a row the job
fails saying why. One bad reply among good ones fails that iteration's samples, and the
job goes on. The jobs are
test_grpo_api.py's small ones (a random tiny model, 4 prompts x 4 samples, 3
iterations): a few seconds each."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import TRAIN_FILE, VAL_FILE

J = "/v1/fine_tuning/jobs"
ITERATIONS = 3
GROUP = 4 * 4  # batch_size x num_generations: one request per iteration
VAL_ROWS = 4


def reward_of(sample):
    """Any deterministic function of what was sent, with a spread: the length of the
    completion, and a bonus when it equals the row's answer."""
    exact = sample["completion"].strip() == sample["item"].get("answer")
    return (len(sample["completion"]) % 5) / 4 + (0.5 if exact else 0.0)


class Service:
    """A reward service on 127.0.0.1 (ephemeral port) whose behaviour the test sets:
    "good", "garbage" (200 with HTML), "garbage_once" (the first training request garbage,
    the rest good) or "slow" (good after 3 s). It keeps every request
    it got and the rewards it gave."""

    def __init__(self):
        self.mode = "good"
        self.requests = []  # (headers, body, rewards or None)
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rewards = [reward_of(s) for s in body["samples"]]
                with service.lock:
                    service.requests.append((dict(self.headers), body, rewards))
                    n_train = sum(len(b["samples"]) == GROUP for _, b, _ in service.requests)
                    garbage = service.mode == "garbage" or (service.mode == "garbage_once" and n_train == 1 and
                                                           len(body["samples"]) == GROUP)
                if service.mode == "slow":
                    time.sleep(3)
                out = (b"<html><body>Bad Gateway</body></html>" if garbage
                       else json.dumps({"rewards": rewards}).encode())
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the slow mode's client gave up

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/reward" % self.server.server_address[1]

    def reset(self, mode):
        with self.lock:
            self.mode, self.requests = mode, []

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def service():
    s = Service()
    yield s
    s.stop()


def prompts_rows(path, n):
    """The first n sums of an addition file as prompts rows: the answer, and metadata the
    service sees in item."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == n:
                break
            row = json.loads(line)
            out.append(json.dumps({"prompt": row["prompt"], "answer": row["completion"],
                                   "metadata": {"row": i, "task": "addition"}}))
    return ("\n".join(out) + "\n").encode()


def upload(smeltd, content, name):
    status, f = smeltd.upload_bytes(content, name)
    assert status == 200 and f["status"] == "processed", f
    return f["id"]


@pytest.fixture(scope="module")
def files(smeltd):
    return (upload(smeltd, prompts_rows(TRAIN_FILE, 16), "endpoint_train.jsonl"),
            upload(smeltd, prompts_rows(VAL_FILE, VAL_ROWS), "endpoint_val.jsonl"))


def run_job(smeltd, files, grader):
    body = {"model": "tiny", "training_file": files[0], "validation_file": files[1], "seed": 5,
            "model_init": "random",
            "method": {"type": "grpo", "grpo": {
                "hyperparameters": {"batch_size": 4, "num_generations": 4, "max_new_tokens": 4,
                                    "max_iterations": ITERATIONS, "learning_rate_multiplier": 10,
                                    "kv_memory_mb": 4, "beta": 0},
                "reward": {"grader": grader}}},
            "eval": {"every_steps": ITERATIONS, "accuracy_examples": VAL_ROWS}}
    status, job = smeltd.request("POST", J, body)
    assert status == 200, job
    job = smeltd.wait_job(job["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    status, events = smeltd.request("GET", J + "/" + job["id"] + "/events?limit=1000")
    assert status == 200, events
    status, lines = smeltd.request("GET", J + "/" + job["id"] + "/metrics?limit=1000")
    assert status == 200, lines
    return job, events["data"], sorted((m["data"] for m in lines["data"] if m["type"] == "train"),
                                       key=lambda d: d["step"])


def test_an_endpoint_rewards_a_grpo_job(smeltd, service, files):
    service.reset("good")
    grader = {"type": "endpoint", "name": "my service", "url": service.url, "timeout_s": 20,
              "headers": {"Authorization": "Bearer test-token"}}
    job, events, steps = run_job(smeltd, files, grader)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    assert job["method"]["grpo"]["reward"]["grader"]["url"] == service.url, job

    with service.lock:
        requests = list(service.requests)
    train = [(h, b, r) for h, b, r in requests if len(b["samples"]) == GROUP]
    assert len(train) == ITERATIONS, [len(b["samples"]) for _, b, _ in requests]
    assert any(len(b["samples"]) == VAL_ROWS for _, b, _ in requests), "the evaluations are scored by it too"
    for headers, body, _ in requests:
        assert headers["Authorization"] == "Bearer test-token" and headers["Content-Type"] == "application/json"
        for s in body["samples"]:
            assert set(s) == {"prompt", "completion", "item", "finish_reason", "n_completion_tokens"}, s
            assert "+" in s["prompt"] and s["prompt"].endswith("="), s  # the sum, as the model saw it
            assert s["item"]["task"] == "addition" and isinstance(s["item"]["answer"], str), s
            assert s["finish_reason"] in ("stop", "length") and 1 <= s["n_completion_tokens"] <= 4, s

    assert len(steps) == ITERATIONS, [e["message"] for e in events]
    means = sorted(sum(r) / len(r) for _, _, r in train)
    got = sorted(d["reward"] for d in steps)
    assert got == pytest.approx(means, abs=1e-9), (got, means)
    for d in steps:
        assert d["rewards/endpoint/mean"] == pytest.approx(d["reward"], abs=1e-12), d
        assert d["samples_failed"] == 0 and d["samples_trained"] == GROUP, d
    assert not [e for e in events if "failed; they are left out" in e["message"]]


def expect_failed_samples(smeltd, job, events, steps, cause):
    """Every sample of every iteration failed with cause, reported once an iteration;
    after RL_MAX_ALL_FAILED (3) such iterations in a row the job failed, naming it."""
    assert job["status"] == "failed", (job, smeltd.read_log())
    message = job["error"]["message"]
    assert "the reward of every sample failed in 3 iterations in a row" in message, message
    assert "grader (endpoint): " + cause in message, message
    warned = [e["message"] for e in events if "failed; they are left out" in e["message"]]
    assert len(warned) == ITERATIONS, [e["message"] for e in events]
    for m in warned:
        assert "the reward of %d sample(s) failed" % GROUP in m, m
        assert "grader (endpoint): " + cause in m, m
    assert len(steps) == ITERATIONS - 1  # the last one ended the job: its errors, no train line
    for d in steps:
        assert d["samples_failed"] == GROUP and d["samples_trained"] == 0, d


def test_an_endpoint_replying_garbage_fails_the_samples_then_the_job(smeltd, service, files):
    service.reset("garbage")
    job, events, steps = run_job(smeltd, files, {"type": "endpoint", "url": service.url})
    expect_failed_samples(smeltd, job, events, steps, "the reply is not JSON (at byte 1): <html><body>Bad Gateway")
    with service.lock:
        assert len(service.requests) >= 1  # garbage is an answer: never retried


def test_an_endpoint_slower_than_its_timeout_fails_the_samples_then_the_job(smeltd, service, files):
    service.reset("slow")
    t0 = time.monotonic()
    job, events, steps = run_job(smeltd, files, {"type": "endpoint", "url": service.url, "timeout_s": 0.5})
    expect_failed_samples(smeltd, job, events, steps, "no reply within timeout_s 0.5 s (1 attempt)")
    assert time.monotonic() - t0 < 60, "each request gave up after timeout_s"


def test_one_garbage_reply_fails_that_iteration_and_the_job_goes_on(smeltd, service, files):
    service.reset("garbage_once")
    job, events, steps = run_job(smeltd, files, {"type": "endpoint", "url": service.url})
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    assert [d["samples_failed"] for d in steps] == [GROUP, 0, 0], steps
    assert [d["samples_trained"] for d in steps] == [0, GROUP, GROUP], steps
