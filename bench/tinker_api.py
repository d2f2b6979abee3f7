"""The Tinker API's overhead per forward_backward: the official SDK (tinker==0.38.0)
against a real smeltd on loopback, the same request as bench/tinker_cpu's (c) — 8
sequences of 32 byte tokens, every target weighted 1, one LoRA model of rank 8 on
attention, MLP and lm_head — timed from the SDK call to its result, beside the worker
handling it in process (bench/tinker_cpu run here on the same base).

    python3 bench/tinker_api.py [--build build-cpu] [--reps 21]

Prints both medians and their difference (the API's overhead: protobuf encoding,
HTTP, the store, ZeroMQ to the worker, the long-poll, the protobuf answer)."""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TINKER_TELEMETRY", "0")
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-cpu")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    os.environ["SMELT_BUILD"] = args.build
    import tinker
    from tinker import types
    from smeltd_harness import ADMIN_KEY, Smeltd, make_models_dir

    base_dir = os.path.join(ROOT, "tests", "data", "tinker", "addition-base")
    out = subprocess.run([os.path.join(ROOT, args.build, "bench", "tinker_cpu"), "--model", base_dir,
                          "--reps", str(args.reps)],
                         check=True, capture_output=True, text=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("(c) forward_backward")][0]
    in_process_ms = float(line.split(":")[-1].split("ms")[0])

    tmp = tempfile.mkdtemp(prefix="smelt-bench-tinker-")
    try:
        data_dir = os.path.join(tmp, "data")
        os.makedirs(data_dir)
        models = make_models_dir(tmp)
        shutil.copytree(base_dir, os.path.join(models, "addition-base"))
        # the harness pins tests to one OpenMP thread; the worker gets OpenMP's own default (every core), as the
        # in-process run has
        server = Smeltd(data_dir, models, env={"OMP_NUM_THREADS": str(os.cpu_count())}).start()
        try:
            svc = tinker.ServiceClient(base_url="http://127.0.0.1:%d" % server.port, api_key="tml-" + ADMIN_KEY)
            tc = svc.create_lora_training_client(base_model="addition-base", rank=8, seed=0).result()
            rng = random.Random(0)
            batch = []
            for _ in range(8):
                tokens = [rng.randrange(256) for _ in range(33)]
                batch.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 32}))
            times = []
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                tc.forward_backward(batch, "cross_entropy").result()
                times.append((time.perf_counter() - t0) * 1000)
            api_ms = statistics.median(times[1:])  # the first starts the worker's buffers
        finally:
            server.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("forward_backward, 8 x 32 tokens, rank 8 (attention, MLP, lm_head), addition-base")
    print("  in process (bench/tinker_cpu, tinker_handle)   %8.2f ms" % in_process_ms)
    print("  through smeltd with the tinker SDK (median %d)  %8.2f ms" % (args.reps, api_ms))
    print("  the API's overhead                             %8.2f ms  (x%.2f)" % (api_ms - in_process_ms,
                                                                             api_ms / in_process_ms))


if __name__ == "__main__":
    main()
