#!/usr/bin/env python3
"""http_load: smeltd's HTTP API under load, with wrk.

    python3 bench/http_load.py [--build build-cpu] [--seconds 10] [--connections 64] [--threads 2]

Starts smeltd (no agent, so jobs stay queued and nothing else uses the CPU) in a
temporary data directory, uploads a file, creates 200 jobs, then runs wrk against:

  healthz      GET /healthz            (no store access: the HTTP layer's ceiling)
  job          GET /v1/fine_tuning/jobs/{id}
  list         GET /v1/fine_tuning/jobs?limit=20

and prints requests/s and latency percentiles (50/90/99%) for each, with the ratio to
healthz. Needs wrk (Debian package `wrk`).
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
KEY = "sk-smelt-bench-key-0123456789abcdef"


def call(port, method, path, body=None, ctype="application/json"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=body, method=method,
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def wrk(port, path, seconds, connections, threads):
    script = os.path.join(tempfile.gettempdir(), "smelt-wrk-auth.lua")
    with open(script, "w") as f:
        f.write('wrk.headers["Authorization"] = "Bearer %s"\n' % KEY)
    out = subprocess.run(["wrk", "-t%d" % threads, "-c%d" % connections, "-d%ds" % seconds, "--latency",
                          "-s", script, "http://127.0.0.1:%d%s" % (port, path)],
                         check=True, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    pct = {}
    for p in ("50", "90", "99"):
        m = re.search(r"\s%s%%\s+([\d.]+)(us|ms|s)" % p, out)
        v = float(m.group(1))
        pct[p] = v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, pct, int(non2xx.group(1)) if non2xx else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-cpu")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("http_load: wrk is not installed (apt-get install wrk)")
    smeltd = os.path.join(ROOT, args.build, "smeltd")
    if not os.access(smeltd, os.X_OK):
        sys.exit("http_load: %s not built (make CUDA=0 %s/smeltd)" % (smeltd, args.build))
    tmp = tempfile.mkdtemp(prefix="smelt-bench-http-")
    models = os.path.join(tmp, "models")
    os.makedirs(models)
    shutil.copytree(os.path.join(ROOT, "examples", "tiny"), os.path.join(models, "tiny"))
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen([smeltd, "--data", os.path.join(tmp, "data"), "--models", models, "--port", "0",
                             "--port-file", port_file, "--no-local-agent"],
                            env=dict(os.environ, SMELT_ADMIN_KEY=KEY, SMELT_LOG_LEVEL="warn"),
                            stdout=open(os.path.join(tmp, "smeltd.log"), "wb"), stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.05)
        port = int(open(port_file).read())
        boundary = "b0undary"
        with open(os.path.join(ROOT, "examples", "data", "addition_val.jsonl"), "rb") as f:
            data = f.read()
        body = (("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--%s\r\n"
                 "Content-Disposition: form-data; name=\"file\"; filename=\"v.jsonl\"\r\n\r\n")
                % (boundary, boundary)).encode() + data + ("\r\n--%s--\r\n" % boundary).encode()
        fid = call(port, "POST", "/v1/files", body, "multipart/form-data; boundary=" + boundary)["id"]
        job = None
        for i in range(200):
            job = call(port, "POST", "/v1/fine_tuning/jobs", json.dumps(
                {"model": "tiny", "model_init": "random", "training_file": fid, "suffix": "b%d" % i}).encode())
        rows = [("healthz", "/healthz"), ("job", "/v1/fine_tuning/jobs/" + job["id"]),
                ("list", "/v1/fine_tuning/jobs?limit=20")]
        cpu = "unknown CPU"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        print("smeltd HTTP under wrk: %s, %d cores (%s), %d s per row, %d connections, %d wrk threads, "
              "%d HTTP threads" % (cpu, os.cpu_count(), platform.machine(), args.seconds, args.connections,
                                    args.threads, 8))
        print("%-8s %12s %10s %10s %10s %10s %8s" % ("route", "requests/s", "p50 ms", "p90 ms", "p99 ms",
                                                     "vs healthz", "errors"))
        base = None
        for name, path in rows:
            rps, pct, bad = wrk(port, path, args.seconds, args.connections, args.threads)
            base = base or rps
            print("%-8s %12.0f %10.2f %10.2f %10.2f %9.2fx %8d" % (name, rps, pct["50"], pct["90"], pct["99"],
                                                                  rps / base, bad))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        print(open(os.path.join(tmp, "smeltd.log")).read()[-3000:]) if os.environ.get("DEBUG") else None; shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
