"""smelt-trainer as N data-parallel ranks (docs/distributed.md): N processes started
here with --rank/--ranks on a file rendezvous, the tiny example model (random init; LoRA
on a base saved by a one-step run), one OpenMP thread each.

What must hold: 1, 2 and 4 ranks give the same train losses (and validation metrics, the
validation shared over the ranks at stages 0-2) at ZeRO stages 0, 1 and 2
for SFT (full and LoRA), DPO and a reward model, within a relative 1e-5 (the ranks add
the micro-batches' gradients and metric sums in another order than one process does;
measured differences are around 1e-8); the AdamW moments per rank shrink as 1/N from
stage 1 on (the start line's rank_optimizer_bytes); a checkpoint written by 4 ranks
resumes on 2 and then on 1 with the losses of an uninterrupted run (and one of a single
process on 2); bad rank options and specs are refused by name; a killed rank makes the
other exit 3 naming it."""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("SMELT_BUILD", "build-cpu"))
TRAINER = os.path.join(BUILD, "smelt-trainer")
TINY = os.path.join(ROOT, "examples", "tiny")
REL = 1e-5
STEPS = 3
GRAD_ACCUM = 4


def data_folder(prefix, files):
    """A temporary folder holding the first n lines of each examples/data file: [(src, dst, n)]."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    data = os.path.join(ROOT, "examples", "data")
    for src, dst, n in files:
        with open(os.path.join(data, src)) as f, open(os.path.join(tmp, dst), "w") as g:
            for _ in range(n):
                g.write(f.readline())
    return tmp


@pytest.fixture(scope="module")
def work():
    tmp = data_folder("smelt-ranks-", [("addition_train.jsonl", "sft.jsonl", 96),
                                       ("addition_val.jsonl", "sft_val.jsonl", 8),
                                       ("addition_pref_train.jsonl", "pref.jsonl", 64),
                                       ("addition_pref_val.jsonl", "pref_val.jsonl", 8)])
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def env():
    return dict(os.environ, OMP_NUM_THREADS="1")


def make_spec(work, name, kind, stage=1, lora=False, model=None, eval_every=0, **hp):
    pref = kind in ("dpo", "reward_model")
    spec = {
        "type": kind,
        "model": model or TINY,
        "data": {"train": os.path.join(work, "pref.jsonl" if pref else "sft.jsonl"),
                 "validation": os.path.join(work, "pref_val.jsonl" if pref else "sft_val.jsonl"),
                 "max_seq_len": 32},
        "hyperparameters": dict({"max_steps": STEPS, "batch_size": 4, "grad_accum": GRAD_ACCUM,
                                 "learning_rate": 0.003, "zero_stage": stage, "max_grad_norm": 1.0}, **hp),
        "output_dir": os.path.join(work, name),
        "seed": 3,
    }
    if eval_every:
        spec["eval"] = {"every_steps": eval_every}
    if model is None:
        spec["model_init"] = "random"
    if lora:
        spec["lora"] = {"rank": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path, spec["output_dir"]


def launch(spec, ranks, extra=(), timeout=120):
    """Runs every rank of one job; returns [(rc, stdout, stderr)] by rank."""
    if ranks == 1:
        p = subprocess.run([TRAINER, "--spec", spec, "--quiet"] + list(extra), capture_output=True, text=True,
                           env=env(), timeout=timeout)
        return [(p.returncode, p.stdout, p.stderr)]
    procs, rdv = start_ranks(spec, ranks, extra=extra)
    try:
        out = [p.communicate(timeout=timeout) for p in procs]
    finally:
        stop_ranks(procs, rdv)
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, out)]


def start_ranks(spec, ranks, timeout_ms=60000, extra=()):
    """The ranks of one job started on a fresh file rendezvous: (processes, its folder)."""
    rdv = tempfile.mkdtemp(prefix="smelt-rdv-")
    procs = [subprocess.Popen([TRAINER, "--spec", spec, "--quiet", "--rank", str(r), "--ranks", str(ranks),
                               "--rendezvous", "file:" + rdv, "--comm-timeout-ms", str(timeout_ms)] + list(extra),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
             for r in range(ranks)]
    return procs, rdv


def stop_ranks(procs, rdv):
    """Kills the ranks still running, reaps them all, removes the rendezvous."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    shutil.rmtree(rdv, ignore_errors=True)


def run_ok(spec, ranks, extra=()):
    res = launch(spec, ranks, extra)
    for r, (rc, _, err) in enumerate(res):
        assert rc == 0, "rank %d of %d exited %d: %s" % (r, ranks, rc, err[-2000:])
    for r, (_, out, err) in enumerate(res[1:], 1):
        assert out == "" and err == "", "rank %d is not quiet: %r %r" % (r, out, err[-500:])


def lines(out_dir, kind):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [j for j in map(json.loads, f) if j["type"] == kind]


def losses(out_dir):
    return {j["step"]: j["loss"] for j in lines(out_dir, "train")}


def assert_same(got, want, what):
    assert sorted(got) == sorted(want), "%s: steps %s, want %s" % (what, sorted(got), sorted(want))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=REL), "%s step %d: %r, one rank %r" % (
            what, step, got[step], want[step])


def validation(out_dir):
    """The eval lines' and the final line's validation metrics, by (kind, step)."""
    got = {}
    for kind in ("eval", "final"):
        for j in lines(out_dir, kind):
            got[(kind, j["step"])] = {k: v for k, v in j.items() if k.startswith("val_")}
    return got


def assert_same_validation(got, want, what):
    """Stages 0-2 share the validation's batches over the ranks (stage 3 runs all of it on every
    rank): the same metrics as one process, the counts exactly."""
    assert sorted(got) == sorted(want) and ("eval", 2) in want, "%s: %s, want %s" % (what, sorted(got), sorted(want))
    for key, metrics in want.items():
        assert sorted(got[key]) == sorted(metrics), (what, key, got[key], metrics)
        for name, value in metrics.items():
            if name in ("val_tokens", "val_pairs"):
                assert got[key][name] == value, (what, key, name, got[key][name], value)
            else:
                # a margin is a difference of rewards: its error is relative to theirs (it cancels)
                scale = max([abs(v) for k, v in metrics.items() if k.startswith("val_rewards/")] or [0])
                tol = REL * scale if name.endswith("margins") else 1e-9
                assert got[key][name] == pytest.approx(value, rel=REL, abs=tol), (what, key, name, got[key][name],
                                                                                   value)


@pytest.fixture(scope="module")
def base(work):
    """A pretrained base on disk for the LoRA jobs: one step of SFT from random weights."""
    spec, out = make_spec(work, "base", "sft", max_steps=1, grad_accum=1, lr_schedule="constant")
    run_ok(spec, 1)
    return os.path.join(out, "output")


# (kind, lora, [(ranks, stage)]): 4 ranks where the sharding is uneven and the moments
# split four ways; every stage on 2 ranks.
CASES = [
    ("sft", False, [(2, 0), (2, 1), (2, 2), (4, 1), (4, 2), (1, 3), (2, 3), (4, 3)]),
    ("sft", True, [(2, 0), (2, 1), (2, 2), (4, 2), (2, 3), (4, 3)]),
    ("dpo", False, [(2, 0), (2, 1), (2, 2), (4, 1), (2, 3), (4, 3)]),
    ("reward_model", False, [(2, 0), (2, 2), (4, 1), (2, 3), (4, 3)]),
    ("reward_model", True, [(2, 3), (4, 3)]),  # the head in the adapter, the base sharded
]


def assert_stage3_sizes(start, ranks, model_params, adapter):
    """Stage 3: rank 0 holds its pieces of every parameter unit (the first, largest, of N
    per unit: 1/N of the whole, up to an element per unit) plus two gather buffers of the
    largest unit; a full fine-tune's gradients likewise (plus the reduce-scatter's
    receive buffers); LoRA adds its whole adapter to the base's shard."""
    z = start["zero3"]
    whole = 4 * model_params
    assert abs(z["shard_param_bytes"] - whole / ranks) <= 4 * 64, (ranks, z, whole)
    assert start["rank_param_bytes"] == 4 * adapter + z["shard_param_bytes"] + z["work_param_bytes"], start
    assert z["work_param_bytes"] < whole / 2, z  # two units of several
    if adapter:
        assert z["shard_grad_bytes"] == 0 and z["work_grad_bytes"] == 0, z
        return
    assert z["shard_grad_bytes"] == z["shard_param_bytes"], z
    assert start["rank_grad_bytes"] == z["shard_grad_bytes"] + z["work_grad_bytes"], start
    assert abs(start["rank_optimizer_bytes"] - 2 * whole / ranks) <= 8 * 64, start


@pytest.mark.parametrize("kind,lora,layouts", CASES, ids=["sft", "sft_lora", "dpo", "reward_model", "reward_model_lora"])
def test_ranks_match_one_process(work, base, kind, lora, layouts):
    name = kind + ("_lora" if lora else "")
    model = base if lora else None
    spec, out = make_spec(work, name + "-1", kind, lora=lora, model=model, eval_every=2)
    run_ok(spec, 1)
    want = losses(out)
    want_val = validation(out)
    assert len(want) == STEPS
    one = lines(out, "start")[0]
    n = one["trainable_params"]
    assert one["ranks"] == 1 and one["rank_optimizer_bytes"] == 8 * n
    for ranks, stage in layouts:
        spec, out = make_spec(work, "%s-%d-%d" % (name, ranks, stage), kind, stage=stage, lora=lora, model=model,
                              eval_every=2)
        run_ok(spec, ranks)
        assert_same(losses(out), want, "%s on %d ranks, stage %d" % (name, ranks, stage))
        assert_same_validation(validation(out), want_val, "%s on %d ranks, stage %d" % (name, ranks, stage))
        start = lines(out, "start")[0]
        assert start["ranks"] == ranks and start["zero_stage"] == stage
        assert os.path.isdir(os.path.join(out, "output")), "rank 0 saves the outputs"
        assert start["trainable_params"] == n
        if stage == 3 and ranks == 1:  # nothing to shard: the plain run, bit for bit
            assert losses(out) == want and "zero3" not in start, start
            continue
        if stage == 3:
            assert_stage3_sizes(start, ranks, one["model_params"], n if lora else 0)
            if lora:  # the adapter's moments as at stage 2
                assert start["rank_optimizer_bytes"] == 8 * -(-n // ranks), start
            continue
        # Stage >= 1: rank 0 holds the first (largest) of N shards of the moments.
        shard = -(-n // ranks) if stage >= 1 else n
        assert start["rank_optimizer_bytes"] == 8 * shard, start
        assert start["rank_param_bytes"] == 4 * n
        assert start["rank_grad_bytes"] == 4 * n + (4 * shard if stage == 2 else 0)


def train_in_legs(work, name, legs, steps=6):
    """One job run in legs [(ranks, stage)], each resuming the last's checkpoint, the
    first two legs stopping after 2 and 4 steps; the output dir and the first
    checkpoint's world.json."""
    world = None
    for i, (ranks, stage) in enumerate(legs):
        spec, out = make_spec(work, name, "sft", stage=stage, max_steps=steps)
        extra = (["--resume"] if i else []) + (["--stop-after-step", str(2 * (i + 1))] if i < 2 else [])
        run_ok(spec, ranks, extra)
        if i == 0:
            with open(os.path.join(out, "checkpoints", "step-2", "world.json")) as f:
                world = json.load(f)
            assert world["ranks"] == ranks and world["zero_stage"] == stage and len(world["shards"]) == ranks
            assert sum(s["len"] for s in world["shards"]) == world["total"]
            for k in range(ranks):
                assert os.path.exists(os.path.join(out, "checkpoints", "step-2", "optimizer-rank-%d.safetensors" % k))
    return out, world


def test_checkpoint_of_4_ranks_resumes_on_2_then_1(work):
    spec, out = make_spec(work, "straight", "sft", max_steps=6)
    run_ok(spec, 1)
    want = losses(out)
    # The stage may change too.
    out, _ = train_in_legs(work, "resharded", [(4, 2), (2, 1), (1, 1)])
    assert_same(losses(out), want, "4 ranks -> 2 ranks -> 1 rank")


def test_stage3_short_steps_pad_the_ranks(work):
    """Stage 3 gathers every unit on every pass, so a rank with fewer micro-batches in a
    step (grad_accum 5 on 3 ranks: 2, 2, 1) runs padding passes with zero gradients; an
    epoch of 24 micro-batches ends with a short step of 4 (2, 1, 1). The losses and the
    validation (every rank runs it at stage 3) are one process's."""
    hp = dict(max_steps=0, epochs=1, grad_accum=5)
    spec, out = make_spec(work, "short-1", "sft", **hp)
    with open(spec) as f:
        j = json.load(f)
    j["eval"] = {"every_steps": 2}
    with open(spec, "w") as f:
        json.dump(j, f)
    run_ok(spec, 1)
    want = losses(out)
    assert len(want) == 5
    spec3, out3 = make_spec(work, "short-3", "sft", stage=3, **hp)
    j["output_dir"] = out3
    j["hyperparameters"]["zero_stage"] = 3
    with open(spec3, "w") as f:
        json.dump(j, f)
    run_ok(spec3, 3)
    assert_same(losses(out3), want, "stage 3 on 3 ranks, short steps")
    evals = {j["step"]: j["val_loss"] for j in lines(out3, "eval")}
    assert sorted(evals) == [2, 4]
    assert_same(evals, {j["step"]: j["val_loss"] for j in lines(out, "eval")}, "stage 3 validation")
    final, final1 = lines(out3, "final")[0], lines(out, "final")[0]
    assert final["val_loss"] == pytest.approx(final1["val_loss"], rel=REL)


def read_safetensors(path):
    """{name: list of floats} of an f32 safetensors file (no numpy needed)."""
    import array
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a = array.array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        out[name] = a
    return out


def test_stage3_checkpoint_reshards_and_output_is_one_process(work):
    """A 4-rank stage-3 checkpoint resumes on 2 ranks at stage 3 and then on 1 with an
    uninterrupted run's losses; a 2-rank stage-1 one resumes at stage 3 and then on 3
    ranks at stage 2; the final output of stage 3 is one process's model."""
    spec, out = make_spec(work, "z3-straight", "sft", max_steps=6)
    run_ok(spec, 1)
    want = losses(out)
    out3, world = train_in_legs(work, "z3-resharded", [(4, 3), (2, 3), (1, 1)])
    assert all(len(s["pieces"]) > 2 for s in world["shards"]), world  # a piece of every unit
    assert_same(losses(out3), want, "4 ranks stage 3 -> 2 ranks stage 3 -> 1 rank")
    out2, _ = train_in_legs(work, "z3-grow", [(2, 1), (2, 3), (3, 2)])
    assert_same(losses(out2), want, "2 ranks stage 1 -> 2 ranks stage 3 -> 3 ranks stage 2")

    spec, out4 = make_spec(work, "z3-output", "sft", stage=3, max_steps=6)
    run_ok(spec, 4)
    assert_same(losses(out4), want, "stage 3 on 4 ranks")
    got = read_safetensors(os.path.join(out4, "output", "model.safetensors"))
    ref = read_safetensors(os.path.join(out, "output", "model.safetensors"))
    assert sorted(got) == sorted(ref)
    for name in ref:
        diff = max(abs(a - b) for a, b in zip(got[name], ref[name]))
        assert len(got[name]) == len(ref[name]) and diff < 1e-4, (name, diff)
    assert sorted(os.listdir(os.path.join(out4, "output"))) == sorted(os.listdir(os.path.join(out, "output")))


def test_one_rank_checkpoint_resumes_on_two(work):
    spec, out = make_spec(work, "straight2", "sft", max_steps=4)
    run_ok(spec, 1)
    want = losses(out)
    spec, out = make_spec(work, "grow", "sft", max_steps=4)
    run_ok(spec, 1, ["--stop-after-step", "2"])
    run_ok(spec, 2, ["--resume"])
    assert_same(losses(out), want, "1 rank -> 2 ranks")


def refused(args, spec, want_rc, want_text):
    p = subprocess.run([TRAINER, "--spec", spec] + args, capture_output=True, text=True, env=env(), timeout=60)
    assert p.returncode == want_rc, (p.returncode, p.stderr)
    assert want_text in p.stderr, p.stderr


def test_bad_rank_options_and_specs(work):
    spec, _ = make_spec(work, "bad", "sft")
    rdv = "file:" + os.path.join(work, "rdv-bad")
    refused(["--rank", "2", "--ranks", "2", "--rendezvous", rdv], spec, 2, "--rank 2: not below --ranks 2")
    refused(["--rank", "0", "--ranks", "2"], spec, 2, "needs --rendezvous")
    refused(["--ranks", "0"], spec, 2, "--ranks")
    refused(["--rank", "0", "--ranks", "8", "--rendezvous", rdv], spec, 1, "raise hyperparameters.grad_accum")
    # grpo / ppo on several ranks: test_trainer_ranks_rl.py


def test_a_killed_rank_fails_the_others_naming_it(work):
    spec, out = make_spec(work, "killed", "sft", max_steps=400)
    procs, rdv = start_ranks(spec, 2, timeout_ms=3000)
    try:
        deadline = time.time() + 180  # a loaded machine (CI's sanitized pass) is slow to start
        while time.time() < deadline and not os.path.exists(os.path.join(out, "metrics.jsonl")):
            time.sleep(0.05)
        while time.time() < deadline and not lines(out, "train"):
            time.sleep(0.05)
        assert lines(out, "train"), "no step trained"
        assert procs[0].poll() is None and procs[1].poll() is None, "a rank ended before the kill"
        procs[1].kill()
        _, err = procs[0].communicate(timeout=60)
        assert procs[0].returncode == 3, (procs[0].returncode, err)
        assert "rank 1" in err, err
    finally:
        stop_ranks(procs, rdv)
