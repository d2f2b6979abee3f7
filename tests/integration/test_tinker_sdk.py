"""The Tinker training API (docs/tinker.md) driven by the official SDK, unchanged
(tinker==0.38.0, pinned in tests/requirements.txt), against a real smeltd and its session
worker (smelt-tinker): a supervised loop that learns, sampling whose logprobs equal a
forward pass bit for bit, an RL loop that raises its reward, a client-side custom loss,
a resume from save_state, four LoRA models on one base in one worker, bad input
answered with errors that name the field, and long polls that leave the HTTP threads free.

The base model is tests/data/tinker/addition-base (the tiny byte-level model trained by
examples/sft_mixed.json: it writes two-digit sums in the three-digit form about 70% of
the time). Tokens are bytes; 256 is bos, 257 eos."""
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
import tinker  # noqa: E402
from tinker import types  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smeltd_harness import ADMIN_KEY, ROOT, Smeltd, make_models_dir, processes, sanitized  # noqa: E402

BOS, EOS = 256, 257
BASE = "addition-base"
BASE_DIR = os.path.join(ROOT, "tests", "data", "tinker", BASE)
TINKER_KEY = "tml-" + ADMIN_KEY


def rows(name):
    with open(os.path.join(ROOT, "examples", "data", name)) as f:
        return [json.loads(line) for line in f]


TRAIN = rows("addition_train.jsonl")
TEST = rows("addition_test.jsonl")


def prompt_tokens(prompt):
    return [BOS] + list(prompt.encode())


def sft_datum(prompt, completion):
    """The prompt masked out (weight 0), the completion and eos trained."""
    p = prompt_tokens(prompt)
    c = list(completion.encode()) + [EOS]
    tokens = p + c
    weights = [0.0] * (len(p) - 1) + [1.0] * len(c)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


def text_of(tokens):
    return bytes(t for t in tokens if t < 256).decode("utf-8", "replace")


def accuracy(sampler, examples):
    """Greedy exact match of the three-digit sum."""
    params = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[EOS])
    futures = [sampler.sample(prompt=types.ModelInput.from_ints(prompt_tokens(r["prompt"])), num_samples=1,
                              sampling_params=params) for r in examples]
    hits = 0
    for r, f in zip(examples, futures):
        hits += text_of(f.result().sequences[0].tokens) == r["completion"]
    return hits / len(examples)


def tinker_dirs(prefix):
    """A temporary folder with a data directory and a models directory holding the base: (tmp, data_dir, models)."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    models = make_models_dir(tmp)
    shutil.copytree(BASE_DIR, os.path.join(models, BASE))
    return tmp, data_dir, models


@pytest.fixture(scope="module")
def server():
    tmp, data_dir, models = tinker_dirs("smelt-tinker-")
    s = Smeltd(data_dir, models).start()
    yield s
    s.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def service(server, key=TINKER_KEY):
    return tinker.ServiceClient(base_url="http://127.0.0.1:%d" % server.port, api_key=key)


def test_capabilities_list_the_base(server):
    caps = service(server).get_server_capabilities()
    names = [m.model_name for m in caps.supported_models]
    assert BASE in names, names


def test_sft_loop_learns_and_sampling_matches_forward(server):
    rng = random.Random(0)
    svc = service(server)
    before = accuracy(svc.create_sampling_client(base_model=BASE).result(), TEST[:100])
    tc = svc.create_lora_training_client(base_model=BASE, rank=8, seed=0).result()
    losses = []
    for step in range(40):
        batch = [sft_datum(r["prompt"], r["completion"]) for r in rng.sample(TRAIN, 32)]
        fb = tc.forward_backward(batch, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=2e-3))
        out = fb.result()
        opt.result()
        n = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
        losses.append(out.metrics["loss:sum"] / n)
        assert len(out.loss_fn_outputs) == len(batch)
    sampler = tc.save_weights_and_get_sampling_client().result()
    after = accuracy(sampler, TEST[:100])
    print("tinker sft: held-out accuracy %.2f -> %.2f; loss per token %.4f -> %.4f"
          % (before, after, losses[0], losses[-1]))
    assert losses[-1] < losses[0] * 0.5, losses
    assert after >= 0.9 and after > before + 0.1, (before, after)

    # sampled logprobs are what a forward of the same tokens computes, bit for bit
    prompt = prompt_tokens(TEST[0]["prompt"])
    res = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=7)).result()
    data = []
    for seq in res.sequences:
        assert len(seq.logprobs) == len(seq.tokens) > 0
        tokens = prompt + list(seq.tokens)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}))
    fwd = tc.forward(data, "cross_entropy").result()
    for seq, out in zip(res.sequences, fwd.loss_fn_outputs):
        got = out["logprobs"].tolist()[len(prompt) - 1:]
        want = list(seq.logprobs)
        assert struct.pack("<%df" % len(got), *got) == struct.pack("<%df" % len(want), *want), (got, want)


def group_advantages(rewards):
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def test_rl_loop_raises_the_reward(server):
    """importance_sampling with group-relative advantages; reward 1 for the three-digit sum."""
    rng = random.Random(1)
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
    means = []
    for it in range(16):
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompts = rng.sample(TRAIN, 16)
        futures = [sampler.sample(prompt=types.ModelInput.from_ints(prompt_tokens(r["prompt"])), num_samples=8,
                                  sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, stop=[EOS],
                                                                       seed=100 * it + k))
                   for k, r in enumerate(prompts)]
        data, rewards_all = [], []
        for r, f in zip(prompts, futures):
            seqs = f.result().sequences
            rewards = [1.0 if text_of(s.tokens) == r["completion"] else 0.0 for s in seqs]
            rewards_all += rewards
            p = prompt_tokens(r["prompt"])
            for s, adv in zip(seqs, group_advantages(rewards)):
                if adv == 0.0:
                    continue
                tokens = p + list(s.tokens)
                n_prompt = len(p) - 1
                data.append(types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:],
                                    "logprobs": [0.0] * n_prompt + list(s.logprobs),
                                    "advantages": [0.0] * n_prompt + [adv] * len(s.tokens)}))
        means.append(sum(rewards_all) / len(rewards_all))
        if data:
            tc.forward_backward(data, "importance_sampling").result()
            tc.optim_step(types.AdamParams(learning_rate=3e-3)).result()
    first, last = sum(means[:4]) / 4, sum(means[-4:]) / 4
    print("tinker rl: mean reward %.3f (first 4 iterations) -> %.3f (last 4)" % (first, last))
    assert last >= first + 0.1, means


def test_custom_loss_runs_client_side(server):
    torch = pytest.importorskip("torch")
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    batch = [sft_datum(r["prompt"], r["completion"]) for r in TRAIN[:8]]
    ce = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]

    def nll(data, logprobs_list):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].tolist())).sum()
                   for d, lp in zip(data, logprobs_list))
        return loss, {"nll": float(loss)}

    out = tc.forward_backward_custom(batch, nll).result()
    assert abs(out.metrics["nll"] - ce) <= 1e-4 * abs(ce), (out.metrics, ce)
    # 1e-3: one Adam step of 1e-2 overshoots on this small, already good model (loss 3 -> 67)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert after < ce, (ce, after)


def train_steps(tc, batches, lr=1e-3):
    losses = []
    for batch in batches:
        out = tc.forward_backward(batch, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
        losses.append(out.metrics["loss:sum"])
    return losses


def test_save_state_resumes_with_the_same_losses(server):
    rng = random.Random(3)
    batches = [[sft_datum(r["prompt"], r["completion"]) for r in rng.sample(TRAIN, 8)] for _ in range(5)]
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    train_steps(tc, batches[:3])
    path = tc.save_state("mid").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/mid"), path
    want = train_steps(tc, batches[3:])
    resumed = svc.create_training_client_from_state_with_optimizer(path).result()
    got = train_steps(resumed, batches[3:])
    assert got == want, (got, want)
    rest = tinker.RestClient(base_url="http://127.0.0.1:%d" % server.port, api_key=TINKER_KEY)
    runs = rest.list_checkpoints(tc.model_id).result()
    assert any(c.tinker_path == path for c in runs.checkpoints), runs


def test_four_models_on_one_base_train_as_alone(server):
    """Four LoRA models interleaved in one worker give the losses each gives alone."""
    rng = random.Random(4)
    batches = [[[sft_datum(r["prompt"], r["completion"]) for r in rng.sample(TRAIN, 4)] for _ in range(3)]
               for _ in range(4)]
    svc = service(server)
    alone = []
    for k in range(4):
        tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=10 + k).result()
        alone.append(train_steps(tc, batches[k]))
    clients = [svc.create_lora_training_client(base_model=BASE, rank=4, seed=10 + k).result() for k in range(4)]
    together = [[] for _ in range(4)]
    for step in range(3):
        futures = [(k, c.forward_backward(batches[k][step], "cross_entropy")) for k, c in enumerate(clients)]
        opts = [c.optim_step(types.AdamParams(learning_rate=1e-3)) for c in clients]
        for k, f in futures:
            together[k].append(f.result().metrics["loss:sum"])
        for o in opts:
            o.result()
    assert together == alone
    workers = [p for p, (name, _, _) in processes().items() if name == "smelt-tinker"]
    assert len(workers) == 1, workers


def raw(server, path, body, key=TINKER_KEY, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (server.port, path), data=data, method="POST",
                                 headers={"X-API-Key": key, "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def fwdbwd_body(model_id, seq_id, tokens, inputs, loss_fn="cross_entropy"):
    """A ForwardBackwardRequest as the SDK encodes it (its own proto conversion)."""
    from tinker.proto.request_conv import forward_backward_request_to_proto
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)
    req = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(
        data=[datum], loss_fn=loss_fn), model_id=model_id, seq_id=seq_id)
    return forward_backward_request_to_proto(req).SerializeToString()


def test_bad_input_is_refused_by_name(server):
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    short = types.Datum(model_input=types.ModelInput.from_ints([BOS, 49, 50]),
                        loss_fn_inputs={"target_tokens": [49, 50, 51], "weights": [1.0, 1.0]})
    with pytest.raises(Exception) as e:
        tc.forward_backward([short], "cross_entropy").result()
    assert "weights" in str(e.value), e.value
    outside = types.Datum(model_input=types.ModelInput.from_ints([BOS, 49, 5000]),
                          loss_fn_inputs={"target_tokens": [49, 50, 51], "weights": [1.0, 1.0, 1.0]})
    with pytest.raises(Exception) as e:
        tc.forward_backward([outside], "cross_entropy").result()
    assert "5000" in str(e.value) and "vocab" in str(e.value), e.value
    # the model still trains after refused requests
    assert tc.forward_backward([sft_datum("12+34=", "046")], "cross_entropy").result().metrics["loss:sum"] > 0

    ok_inputs = {"target_tokens": types.TensorData(data=[49, 50], dtype="int64", shape=[2]),
                 "weights": types.TensorData(data=[1.0, 1.0], dtype="float32", shape=[2])}
    status, body = raw(server, "/api/v1/forward_backward", fwdbwd_body(tc.model_id, 1000, [BOS, 49], ok_inputs,
                                                                          loss_fn="no_such_loss"),
                       content_type="application/x-protobuf")
    assert status == 400 and "loss_fn" in json.dumps(body), (status, body)
    bad_dtype = {"target_tokens": types.TensorData(data=[49.0, 50.0], dtype="float32", shape=[2]),
                 "weights": types.TensorData(data=[1.0, 1.0], dtype="float32", shape=[2])}
    status, body = raw(server, "/api/v1/forward_backward", fwdbwd_body(tc.model_id, 1001, [BOS, 49], bad_dtype),
                       content_type="application/x-protobuf")
    assert status == 400 and "target_tokens" in json.dumps(body), (status, body)
    status, body = raw(server, "/api/v1/forward_backward", fwdbwd_body("no-such-model", 1, [BOS, 49], ok_inputs),
                       content_type="application/x-protobuf")
    assert status == 404 and "model_id" in json.dumps(body), (status, body)
    status, body = raw(server, "/api/v1/optim_step", {"model_id": tc.model_id, "seq_id": 1002,
                                                      "adam_params": {"learning_rate": -1}})
    assert status == 400 and "learning_rate" in json.dumps(body), (status, body)
    status, body = raw(server, "/api/v1/create_session", {"tags": [], "sdk_version": "0.38.0"}, key="tml-nope")
    assert status == 401, (status, body)


def test_refused_load_state_passes_its_seq_over(server):
    """A load_state refused at submission (no such checkpoint) lets the model's later requests run."""
    tc = service(server).create_lora_training_client(base_model=BASE, rank=4, seed=7).result()
    with pytest.raises(Exception) as e, pytest.warns(FutureWarning):  # the SDK deprecates load_state; still sent
        tc.load_state("tinker://%s/weights/no-such-save" % tc.model_id).result()
    assert "path" in str(e.value), e.value
    assert tc.forward_backward([sft_datum("12+34=", "046")], "cross_entropy").result().metrics["loss:sum"] > 0


def test_too_many_topk_prompt_logprobs_are_refused(server):
    sampler = service(server).create_sampling_client(base_model=BASE).result()
    with pytest.raises(Exception) as e:
        sampler.sample(prompt=types.ModelInput.from_ints(prompt_tokens("1+2=")), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=1), include_prompt_logprobs=True,
                       topk_prompt_logprobs=21).result()
    assert "topk_prompt_logprobs" in str(e.value), e.value
    with pytest.raises(Exception) as e:  # what smelt does not compute is refused by name, not ignored
        sampler.sample(prompt=types.ModelInput.from_ints(prompt_tokens("1+2=")), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=1), topk_sample_logprobs=2).result()
    assert "topk_sample_logprobs" in str(e.value), e.value


def test_another_projects_model_is_not_found(server):
    status, key = server.request("POST", "/v1/api_keys", {"name": "other", "project": "other-project"})
    assert status == 200, key
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=6).result()
    ok_inputs = {"target_tokens": types.TensorData(data=[49, 50], dtype="int64", shape=[2]),
                 "weights": types.TensorData(data=[1.0, 1.0], dtype="float32", shape=[2])}
    status, body = raw(server, "/api/v1/forward_backward", fwdbwd_body(tc.model_id, 1, [BOS, 49], ok_inputs),
                       key="tml-" + key["key"], content_type="application/x-protobuf")
    assert status == 404, (status, body)
    status, body = raw(server, "/api/v1/get_info", {"model_id": tc.model_id}, key="tml-" + key["key"])
    assert status == 404, (status, body)


def test_cancel_future_takes_back_a_waiting_request(server):
    """An optim_step waiting for the model's earlier seqs is cancelled: its future fails with a message saying so
    (what the SDK raises as RequestFailedError), and the model's own requests go on."""
    tc = service(server).create_lora_training_client(base_model=BASE, rank=4, seed=8).result()
    done = tc.forward_backward([sft_datum("12+34=", "046")], "cross_entropy")
    assert done.result().metrics["loss:sum"] > 0
    status, fut = raw(server, "/api/v1/optim_step", {"model_id": tc.model_id, "seq_id": 500,
                                                     "adam_params": {"learning_rate": 1e-3}})
    assert status == 200, fut
    status, body = raw(server, "/api/v1/cancel_future", {"request_id": fut["request_id"]})
    assert status == 200, body
    status, body = raw(server, "/api/v1/retrieve_future", {"request_id": fut["request_id"]})
    assert status == 200 and "cancel" in body.get("error", "") and body.get("category") == "user", body
    status, body = raw(server, "/api/v1/cancel_future", {"request_id": "fut-no-such"})
    assert status == 404 and "request_id" in json.dumps(body), (status, body)
    assert tc.forward_backward([sft_datum("12+34=", "046")], "cross_entropy").result().metrics["loss:sum"] > 0


def poll_future(server, request_id, out):
    """retrieve_future until the result comes (a slow build outlasts one 25 s long poll and
    gets try_again, as the SDK would), recording (status, content type, when it answered, a JSON body)."""
    deadline = time.monotonic() + 280
    while True:
        req = urllib.request.Request("http://127.0.0.1:%d/api/v1/retrieve_future" % server.port,
                                     data=json.dumps({"request_id": request_id}).encode(), method="POST",
                                     headers={"X-API-Key": TINKER_KEY, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            body = r.read()
            ctype = r.headers.get("Content-Type")
            if ctype == "application/json" and json.loads(body).get("type") == "try_again" \
                    and time.monotonic() < deadline:
                continue
            out.append((r.status, ctype, time.monotonic(), body if ctype == "application/json" else b""))
            return


def test_waiting_polls_leave_the_http_threads_free(server):
    """32 long polls on a forward_backward (smeltd has 8 HTTP threads) while a plain GET comes
    in: it is answered at once, and every poll gets the result. The forward_backward is held
    back by its model's order (seq 2 waits for seq 1), so the polls wait however fast or slow
    the build computes, until the test sends seq 1."""
    svc = service(server)
    tc = svc.create_lora_training_client(base_model=BASE, rank=4, seed=7).result()

    def fwdbwd(seq_id, n):
        from tinker.proto.request_conv import forward_backward_request_to_proto
        data = [sft_datum(r["prompt"], r["completion"]) for r in TRAIN[:n]]
        return forward_backward_request_to_proto(types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
            model_id=tc.model_id, seq_id=seq_id)).SerializeToString()

    status, fut = raw(server, "/api/v1/forward_backward", fwdbwd(2, 64), content_type="application/x-protobuf")
    assert status == 200, fut
    answers = []
    polls = [threading.Thread(target=poll_future, args=(server, fut["request_id"], answers)) for _ in range(32)]
    for t in polls:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    status, models = server.request("GET", "/v1/models")
    answered = time.monotonic()
    assert status == 200, models
    assert answered - t0 < 1.0, "GET /v1/models took %.2f s behind 32 waiting polls" % (answered - t0)
    assert not answers, "the forward_backward ended before its seq 1 was sent: %r" % answers
    status, first = raw(server, "/api/v1/forward_backward", fwdbwd(1, 1), content_type="application/x-protobuf")
    assert status == 200, first
    for t in polls:
        t.join(300)
    assert len(answers) == 32, answers
    assert all(a[0] == 200 and a[1] == "application/x-protobuf" for a in answers), answers
    assert min(a[2] for a in answers) > answered
