"""The torch.distributed (Gloo backend) half of bench/comm_cpu: the same collectives on
the same sizes, ranks and iteration counts, timed the same way.

bench/comm_cpu runs this script (execv, no shell) after its own sweep and reads its
stdout: one JSON object per line, first {"torch": VERSION}, then per op and size
{"op", "bytes", "iters", "seconds"} or {"op", "bytes", "error"}. It can also be run
alone:

    python3 bench/comm_torch.py --ranks 2 --sizes 4096,65536 --iters 100,50

The ranks are processes of this script (multiprocessing, forked after torch is imported, before it runs anything), each with one torch
thread, meeting through a FileStore in a temporary folder. Every row: one untimed call,
a barrier, then `iters` calls, each waited for (async_op=False, as bench/comm_cpu waits
for each of its calls); the row's time per call is the slowest rank's. f32 tensors of
`bytes` / 4 elements; reduce_scatter and all_gather count the whole tensor (the
reduce_scatter input, the all_gather output), as bench/comm_cpu does.
"""
import argparse
import datetime
import json
import multiprocessing
import os
import queue
import sys
import tempfile
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def make_call(op, count, rank, size):
    """The op on fresh f32 tensors of count elements (whole size): a no-argument call."""
    shard = count // size
    if op == "all_reduce":
        buf = torch.full((count,), float(rank + 1))
        return lambda: dist.all_reduce(buf)
    if op == "reduce_scatter":
        send = torch.full((count,), float(rank + 1))
        recv = torch.empty(shard)
        return lambda: dist.reduce_scatter_tensor(recv, send)
    if op == "all_gather":
        send = torch.full((shard,), float(rank + 1))
        recv = torch.empty(count)
        return lambda: dist.all_gather_into_tensor(recv, send)
    buf = torch.full((count,), float(rank + 1))
    return lambda: dist.broadcast(buf, src=0)


def time_row(op, nbytes, iters, rank, size):
    call = make_call(op, nbytes // 4, rank, size)
    call()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    per_call = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    return per_call.item()


def rank_main(rank, size, store_path, sizes, iters, timeout_s, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, size), rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        for op in OPS:
            for nbytes, n in zip(sizes, iters):
                row = {"op": op, "bytes": nbytes}
                try:
                    row.update(iters=n, seconds=time_row(op, nbytes, n, rank, size))
                except Exception as e:  # a failed op is printed in its row, not hidden
                    row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
                if rank == 0:
                    results.put(row)
    finally:
        dist.destroy_process_group()


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--sizes", type=int_list, required=True, help="bytes, comma-separated")
    p.add_argument("--iters", type=int_list, required=True, help="one per size")
    p.add_argument("--timeout-s", type=float, default=120.0)
    a = p.parse_args()
    if a.ranks < 2:
        p.error("--ranks: at least 2")
    if len(a.iters) != len(a.sizes):
        p.error(f"--iters: {len(a.iters)} counts for {len(a.sizes)} sizes")
    bad = [s for s in a.sizes if s <= 0 or s % (4 * a.ranks)]
    if bad:
        p.error(f"--sizes: {bad[0]} is not a multiple of 4 bytes x {a.ranks} ranks")
    print(json.dumps({"torch": torch.__version__}), flush=True)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="comm_torch.") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=rank_main, args=(r, a.ranks, store, a.sizes, a.iters,
                                                     a.timeout_s, results))
                 for r in range(a.ranks)]
        for proc in procs:
            proc.start()
        rows = len(OPS) * len(a.sizes)
        got = 0
        while (got < rows and procs[0].is_alive()) or not results.empty():
            try:
                print(json.dumps(results.get(timeout=0.5)), flush=True)
                got += 1
            except queue.Empty:  # poll rank 0 again
                pass
        for proc in procs:
            proc.join()
        codes = [proc.exitcode for proc in procs]
    if any(codes):
        print(f"comm_torch: rank exit codes {codes}", file=sys.stderr)
        return 1
    return 0 if got == rows else 1


if __name__ == "__main__":
    sys.exit(main())
