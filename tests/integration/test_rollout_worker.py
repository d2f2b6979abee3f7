"""smelt-rollout end to end: the real binary on a free loopback port, a pyzmq DEALER
as its client (the protocol is common/msg.h). A tiny random Llama with the byte
tokenizer is written by smelt-model into a temporary directory. The oracles are
smelt-generate (the plain-recompute reference generator and sampler) and, for adapters,
the model smelt-lora merges.

The binaries come from $SMELT_BUILD (default build-cpu). Needs pyzmq and pytest."""
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import pytest

zmq = pytest.importorskip("zmq")

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("SMELT_BUILD", "build-cpu"))
TIMEOUT_S = 10


def tool(name):
    path = os.path.join(BUILD, name)
    if not os.access(path, os.X_OK):
        pytest.fail("%s is not built (set SMELT_BUILD to the build folder)" % path)
    return path


@pytest.fixture(scope="module")
def model_dir():
    with tempfile.TemporaryDirectory(prefix="smelt-rollout-test-") as tmp:
        out = os.path.join(tmp, "tiny")
        subprocess.run([tool("smelt-model"), "init", "--config", os.path.join(ROOT, "tests/data/tiny/config.json"),
                        "--out", out, "--seed", "1", "--byte-tokenizer"], check=True, capture_output=True)
        yield out


@pytest.fixture(scope="module")
def ids_model_dir(model_dir):
    """The same model without its tokenizer: ids in, ids out. smelt-generate --json prints
    nothing for a sample whose text is not valid UTF-8, which random bytes seldom are."""
    with tempfile.TemporaryDirectory(prefix="smelt-rollout-test-") as tmp:
        for name in os.listdir(model_dir):
            if name != "tokenizer.json":
                shutil.copy(os.path.join(model_dir, name), tmp)
        yield tmp


class Worker:
    """A smelt-rollout process; stderr goes to a file so that it can never fill a pipe."""

    def __init__(self, *args):
        self.log = tempfile.NamedTemporaryFile(prefix="smelt-rollout-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([tool("smelt-rollout"), "--bind", "tcp://127.0.0.1:*", "--kv-memory-mb", "4",
                                      "--max-seqs", "8", *args],
                                     stdout=subprocess.DEVNULL, stderr=self.log, cwd=ROOT,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.endpoint = self._wait_bound()
        self.ctx = zmq.Context()
        self.sockets = []

    def _wait_bound(self):
        deadline = time.time() + TIMEOUT_S
        while time.time() < deadline:
            found = re.search(r"smelt-rollout: serving on (\S+)", self.read_log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError("smelt-rollout exited with %d: %s" % (self.proc.returncode, self.read_log()))
            time.sleep(0.02)
        raise RuntimeError("smelt-rollout did not bind: " + self.read_log())

    def read_log(self):
        with open(self.log.name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def client(self):
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, TIMEOUT_S * 1000)
        s.connect(self.endpoint)
        self.sockets.append(s)
        return s

    def close(self):
        for s in self.sockets:
            s.close()
        self.ctx.term()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture
def worker(model_dir):
    w = Worker("--model", model_dir)
    yield w
    w.close()


def send(sock, msg_type, header, *frames):
    header = dict(header)
    header.setdefault("v", 1)
    sock.send_multipart([msg_type.encode(), json.dumps(header).encode(), *frames])


def recv(sock):
    frames = sock.recv_multipart()
    return frames[0].decode(), json.loads(frames[1]), frames[2:]


def ids_frame(ids):
    return struct.pack("<%di" % len(ids), *ids)


def unpack_result(header, frames):
    n = header["n_tokens"]
    assert len(frames) == 2 and len(frames[0]) == 4 * n and len(frames[1]) == 4 * n
    return list(struct.unpack("<%di" % n, frames[0])), list(struct.unpack("<%df" % n, frames[1]))


def generate(sock, header, *frames):
    """Sends one gen.request with n = 1 and returns (header, ids, logprobs) of its result."""
    send(sock, "gen.request", header, *frames)
    msg_type, h, rest = recv(sock)
    assert msg_type == "gen.result", (msg_type, h)
    assert h["id"] == header["id"] and h["index"] == 0
    ids, logprobs = unpack_result(h, rest)
    return h, ids, logprobs


def reference(model_dir, prompt_ids, max_new_tokens, temperature=0.0, seed=0):
    """smelt-generate's {"ids", "logprobs", "finish_reason"}: what sample 0 of a request
    with this seed should be."""
    ref = subprocess.run([tool("smelt-generate"), "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt_ids)),
                          "--max-new-tokens", str(max_new_tokens), "--temperature", repr(temperature),
                          "--seed", str(seed), "--json"], check=True, capture_output=True, text=True)
    return json.loads(ref.stdout)


def assert_matches(ids, logprobs, finish_reason, want):
    assert ids == want["ids"]
    assert finish_reason == want["finish_reason"]
    assert all(abs(a - b) < 1e-4 for a, b in zip(logprobs, want["logprobs"]))


def test_text_prompt_gives_the_reference_generators_tokens(worker, model_dir):
    s = worker.client()
    h, ids, logprobs = generate(s, {"id": "t1", "prompt": "hello", "temperature": 0, "max_new_tokens": 8})
    assert h["finish_reason"] in ("length", "stop") and h["policy_version"] == 0
    assert 1 <= len(ids) <= 8 and all(lp <= 0 and math.isfinite(lp) for lp in logprobs)
    assert isinstance(h["text"], str)
    # smelt-generate is the oracle: the plain-recompute reference generator.
    ref = subprocess.run([tool("smelt-generate"), "--model", model_dir, "--prompt", "hello", "--max-new-tokens", "8",
                          "--json"], check=True, capture_output=True, text=True)
    want = json.loads(ref.stdout)
    assert ids == want["ids"]
    assert h["finish_reason"] == want["finish_reason"]
    assert all(abs(a - b) < 1e-4 for a, b in zip(logprobs, want["logprobs"]))


def test_ids_prompt_equals_its_text(worker):
    s = worker.client()
    _, by_text, lp_text = generate(s, {"id": "a", "prompt": "hello", "temperature": 0, "max_new_tokens": 6})
    # The byte tokenizer: ids 0-255 are the bytes.
    _, by_ids, lp_ids = generate(s, {"id": "b", "temperature": 0, "max_new_tokens": 6}, ids_frame(b"hello"))
    assert by_text == by_ids and lp_text == lp_ids


def test_seeded_samples_are_reproducible(worker):
    s = worker.client()
    runs = []
    for attempt in range(2):
        send(s, "gen.request", {"id": "s%d" % attempt, "n": 3, "seed": 5, "temperature": 1, "max_new_tokens": 6},
             ids_frame([1, 2, 3]))
        got = {}
        for _ in range(3):
            msg_type, h, frames = recv(s)
            assert msg_type == "gen.result" and h["id"] == "s%d" % attempt
            got[h["index"]] = unpack_result(h, frames)[0]
        assert sorted(got) == [0, 1, 2]
        runs.append(got)
    assert runs[0] == runs[1]
    assert len({tuple(ids) for ids in runs[0].values()}) == 3, "the samples of one request draw from different streams"


# Seeds and temperatures chosen so that the reference's samples differ between every pair
# (checked below): a worker that ignored either would fail.
SAMPLING_CASES = [(5, 1.0), (6, 1.0), (5, 0.1), (6, 0.1)]


def test_seeds_and_temperatures_sample_as_the_reference_sampler(ids_model_dir):
    w = Worker("--model", ids_model_dir)
    try:
        check_sampling(w.client(), ids_model_dir)
    finally:
        w.close()


def check_sampling(s, model_dir):
    prompt = list(b"hel")
    samples = {}
    for seed, temperature in SAMPLING_CASES:
        want = reference(model_dir, prompt, 10, temperature, seed)
        for n in (1, 3):  # sample 0 is the reference's draw, alone or with siblings
            send(s, "gen.request", {"id": "%d-%g-%d" % (seed, temperature, n), "n": n, "seed": seed,
                                    "temperature": temperature, "max_new_tokens": 10}, ids_frame(prompt))
            for _ in range(n):
                msg_type, h, frames = recv(s)
                assert msg_type == "gen.result", h
                if h["index"] == 0:
                    ids, logprobs = unpack_result(h, frames)
                    assert_matches(ids, logprobs, h["finish_reason"], want)
        samples[seed, temperature] = want["ids"]
    distinct = set(map(tuple, samples.values()))
    assert len(distinct) == len(SAMPLING_CASES), "the reference gives the same sample for two settings: %s" % samples


def test_bad_request_is_refused_and_the_worker_goes_on(worker):
    s = worker.client()
    send(s, "gen.request", {"id": "bad", "prompt": "x", "top_p": 2})
    msg_type, h, _ = recv(s)
    assert msg_type == "gen.error" and h["id"] == "bad" and h["error"]["field"] == "top_p", h
    send(s, "gen.request", {"id": "bad2", "prompt": "x", "colour": "red"})
    msg_type, h, _ = recv(s)
    assert msg_type == "gen.error" and h["error"]["field"] == "colour", h
    s.send_multipart([b"gen.request", b"{not json"])
    msg_type, h, _ = recv(s)
    assert msg_type == "gen.error" and h["error"]["field"] == "header", h
    send(s, "gen.request", {"id": "bad3"}, ids_frame([1, 2]), ids_frame([3]))
    msg_type, h, _ = recv(s)
    assert msg_type == "gen.error" and h["error"]["field"] == "prompt", h
    send(s, "health.request", {})
    msg_type, h, _ = recv(s)
    assert msg_type == "health.reply" and h["status"] == "ok", h
    generate(s, {"id": "good", "prompt": "x", "max_new_tokens": 3})
    send(s, "stats.request", {})
    msg_type, h, _ = recv(s)
    assert msg_type == "stats.reply" and h["requests_served"] == 1 and h["requests_in_flight"] == 0, h


def test_sigterm_stops_it_cleanly_with_a_request_in_flight(model_dir):
    w = Worker("--model", model_dir, "--max-seqs", "2")
    try:
        s = w.client()
        send(s, "gen.request", {"id": "long", "n": 64, "max_new_tokens": 100, "ignore_eos": True},
             ids_frame([1, 2, 3]))
        msg_type, h, _ = recv(s)  # it is generating
        assert msg_type == "gen.result", h
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=TIMEOUT_S) == 0, w.read_log()
        # The unfinished request is answered, not left hanging.
        while msg_type == "gen.result":
            msg_type, h, _ = recv(s)
        assert msg_type == "gen.error" and h["id"] == "long" and h["error"]["field"] is None, h
    finally:
        w.close()


def worker_outputs(*args):
    """Greedy and seeded samples (ids, logprobs) of one worker on two fixed prompts."""
    w = Worker(*args)
    try:
        s = w.client()
        out = []
        for i, (prompt, temperature) in enumerate((([5, 9, 14, 3], 0), ([7, 1, 2], 1.0))):
            h, ids, logprobs = generate(s, {"id": "p%d" % i, "temperature": temperature, "seed": 11,
                                            "max_new_tokens": 8, "ignore_eos": True}, ids_frame(prompt))
            assert "text" not in h  # this model directory has no tokenizer
            out.append((ids, logprobs))
        return out
    finally:
        w.close()


def test_adapter_output_equals_the_merged_models(tmp_path):
    model, adapter = os.path.join(ROOT, "tests/data/parity/llama"), os.path.join(ROOT, "tests/data/parity/llama-lora")
    merged = str(tmp_path / "merged")
    subprocess.run([tool("smelt-lora"), "merge", "--model", model, "--adapter", adapter, "--out", merged],
                   check=True, capture_output=True)
    base = worker_outputs("--model", model)
    attached = worker_outputs("--model", model, "--adapter", adapter)
    want = worker_outputs("--model", merged)
    for (ids, logprobs), (want_ids, want_logprobs) in zip(attached, want):
        assert ids == want_ids
        assert all(abs(a - b) < 1e-4 for a, b in zip(logprobs, want_logprobs)), (logprobs, want_logprobs)
    # The adapter matters here, so the equality above says something.
    assert any(ids != b_ids or any(abs(a - b) > 1e-3 for a, b in zip(lps, b_lps))
               for (ids, lps), (b_ids, b_lps) in zip(attached, base))


@pytest.mark.parametrize("args, says", [
    (["--max-seqs", "0"], "--max-seqs"),
    (["--bogus", "1"], "--bogus"),
    (["--kv-memory-mb"], "--kv-memory-mb"),
    (["--backend", "tpu"], "--backend"),
    ([], "--model"),
    (["--weights-comm", "file:/tmp/x"], "go together"),
    (["--weights-comm", "file:/tmp/x", "--weights-comm-name", "j", "--weights-comm-rank", "2",
      "--weights-comm-size", "2"], "--weights-comm-rank 2 is not below"),
    (["--weights-comm-size", "1"], "--weights-comm-size"),
])
def test_bad_flags_exit_2(model_dir, args, says):
    full = (["--model", model_dir] if says != "--model" else []) + args
    r = subprocess.run([tool("smelt-rollout"), *full], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr


def test_a_missing_model_exits_1(tmp_path):
    r = subprocess.run([tool("smelt-rollout"), "--model", str(tmp_path / "nope")], capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 1 and "nope" in r.stderr, r.stderr
