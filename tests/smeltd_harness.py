"""A real smeltd for the Python tests (integration and browser): started on a free
loopback port in a data directory with the tiny example model, with an admin key from
SMELT_ADMIN_KEY, helpers for requests and uploads, and a stop that fails on sanitizer
reports in smeltd's or a worker's log. Binaries come from $SMELT_BUILD (default
build-cpu)."""
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.path.join(ROOT, os.environ.get("SMELT_BUILD", "build-cpu"))
ADMIN_KEY = "sk-smelt-test-admin-key-0123456789"
TRAIN_FILE = os.path.join(ROOT, "examples", "data", "addition_train.jsonl")
VAL_FILE = os.path.join(ROOT, "examples", "data", "addition_val.jsonl")

# A job that trains the tiny example model for a few steps (a second or two on CPU).
SMALL_JOB = {
    "model": "tiny",
    "model_init": "random",
    "hyperparameters": {"n_epochs": 1, "batch_size": 16, "max_steps": 12, "learning_rate": 0.003},
    "data": {"max_seq_len": 32},
}


class Smeltd:
    def __init__(self, data_dir, models_dir, extra_args=(), env=None, launcher=()):
        self.data_dir = data_dir
        # argv run before smeltd's own (e.g. `ip netns exec NS`: it execs smeltd in place,
        # so proc stays smeltd's pid)
        self.launcher = list(launcher)
        # where the tests reach the HTTP API when not at smeltd's own port (a relay into
        # the network namespace smeltd runs in); None: smeltd's port
        self.http_port = None
        self.models_dir = models_dir
        self.extra_args = list(extra_args)
        self.env = dict(env or {})  # over the defaults below (one OpenMP thread per trainer)
        self.proc = None
        self.port = None
        self.log_path = os.path.join(data_dir, "smeltd.log")

    def start(self):
        port_file = os.path.join(self.data_dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        env = dict(os.environ, SMELT_ADMIN_KEY=ADMIN_KEY, OMP_NUM_THREADS="1")
        env.update(self.env)
        args = self.launcher + [os.path.join(BUILD, "smeltd"), "--data", self.data_dir, "--models", self.models_dir,
                "--port", "0", "--port-file", port_file, "--cpu", "--heartbeat-ms", "200",
                "--agent-lost-ms", "2000", "--stop-grace-ms", "3000"] + self.extra_args
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("smeltd exited with %d: %s" % (self.proc.returncode, self.read_log()))
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError("smeltd did not start: " + self.read_log())
        if "--no-local-agent" in self.extra_args:
            return self
        # wait for the embedded agent to register
        deadline = time.time() + 20
        while time.time() < deadline:
            status, body = self.request("GET", "/v1/cluster")
            if status == 200 and any(a["status"] == "online" for a in body["agents"]):
                return self
            time.sleep(0.05)
        raise RuntimeError("no agent registered: " + self.read_log())

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    @property
    def base_url(self):
        return "http://127.0.0.1:%d" % (self.http_port or self.port)

    def request(self, method, path, body=None, key=ADMIN_KEY, headers=None, raw=None):
        """(status, parsed JSON or text) for one request."""
        data = raw
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        if key is not None:
            hdrs["Authorization"] = "Bearer " + key
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        if "json" in ctype:
            return status, json.loads(payload)
        return status, payload.decode("utf-8", "replace")

    def upload(self, path, key=ADMIN_KEY, purpose="fine-tune", filename=None):
        with open(path, "rb") as f:
            content = f.read()
        return self.upload_bytes(content, filename or os.path.basename(path), key=key, purpose=purpose)

    def upload_bytes(self, content, filename, key=ADMIN_KEY, purpose="fine-tune"):
        boundary = "----smelttest7d1f"
        parts = []
        if purpose is not None:
            parts.append(("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n"
                          % (boundary, purpose)).encode())
        parts.append(("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                      "Content-Type: application/jsonl\r\n\r\n" % (boundary, filename)).encode() + content + b"\r\n")
        body = b"".join(parts) + ("--%s--\r\n" % boundary).encode()
        return self.request("POST", "/v1/files", raw=body, key=key,
                            headers={"Content-Type": "multipart/form-data; boundary=" + boundary})

    def wait_job(self, job_id, statuses, timeout=120, key=ADMIN_KEY):
        deadline = time.time() + timeout
        job = None
        while time.time() < deadline:
            status, job = self.request("GET", "/v1/fine_tuning/jobs/" + job_id, key=key)
            assert status == 200, job
            if job["status"] in statuses:
                return job
            time.sleep(0.1)
        raise AssertionError("job %s did not reach %s; last: %s\n%s" % (job_id, statuses, job, self.read_log()))

    def wait_devices_free(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, body = self.request("GET", "/v1/cluster")
            devices = [d for a in body["agents"] for d in a["devices"]]
            if devices and all(d["state"] == "free" for d in devices):
                return body
            time.sleep(0.1)
        raise AssertionError("devices still allocated: %s" % body)

    def kill(self, sig=signal.SIGTERM):
        if self.proc is None or getattr(self, "stopped", False):
            return
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
            self.log = None
        # a sanitizer build reports memory errors, leaks and data races in the log (make
        # test TSAN=1 sends the races to files instead and checks those): they fail the test
        text = self.read_log_all()
        logs = [("smeltd", text)]
        jobs = os.path.join(self.data_dir, "jobs")
        for job in sorted(os.listdir(jobs)) if os.path.isdir(jobs) else []:
            path = os.path.join(jobs, job, "log.txt")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    logs.append((job, f.read().decode("utf-8", "replace")))
        for name, log in logs:
            for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                           "WARNING: ThreadSanitizer"):
                assert marker not in log, "%s: %s\n%s" % (name, marker, log[-6000:])
        if sig == signal.SIGTERM:
            assert self.proc.returncode == 0, "smeltd exited with %s after SIGTERM\n%s" % (
                self.proc.returncode, text[-3000:])

    def read_log_all(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


def prompts_rows(path, n):
    """The first n sums of an addition file as prompts rows (an RL job's training file)
    with their answer."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            out.append(json.dumps({"prompt": row["prompt"], "answer": row["completion"]}))
            if len(out) == n:
                break
    return ("\n".join(out) + "\n").encode()


def make_models_dir(tmp):
    models = os.path.join(tmp, "models")
    os.makedirs(models, exist_ok=True)
    shutil.copytree(os.path.join(ROOT, "examples", "tiny"), os.path.join(models, "tiny"))
    return models


def sanitized():
    """True when smeltd was built with ASan or TSan (their runtimes' entry points are
    imported by name): tests that train for minutes skip themselves there."""
    try:
        with open(os.path.join(BUILD, "smeltd"), "rb") as f:
            binary = f.read()
    except OSError:  # not built: the fixtures say so
        return False
    return b"__asan_init" in binary or b"__tsan_init" in binary


# ---- a job's processes, from /proc (Linux only, no psutil needed) ----

PROGRAMS = ("smelt-trainer", "smelt-rollout", "smelt-tinker")


def processes():
    """{pid: (program name, parent pid, working directory)} of every process of ours that
    runs a smelt program of this build."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            exe = os.readlink("/proc/%d/exe" % pid)
            with open("/proc/%d/stat" % pid) as f:
                stat = f.read()
            cwd = os.readlink("/proc/%d/cwd" % pid)
        except OSError:  # gone, or not ours
            continue
        name = os.path.basename(exe)
        if name in PROGRAMS and os.path.dirname(exe) == os.path.realpath(BUILD):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            out[pid] = (name, ppid, cwd)
    return out


def job_processes(smeltd, job_id):
    """{pid: (name, parent)} of the job's smelt processes: they run in its directory."""
    job_dir = os.path.realpath(os.path.join(smeltd.data_dir, "jobs", job_id))
    return {pid: (name, ppid) for pid, (name, ppid, cwd) in processes().items() if cwd == job_dir}


def smelt_pid(pid):
    """True while pid is a smelt program, running or a zombie not yet reaped (whose exe
    and cwd can no longer be read, but whose stat still names it)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.index("(") + 1:stat.rindex(")")] in PROGRAMS


def wait_gone(smeltd, job_id, pids, timeout=30):
    """Until none of the job's smelt processes (nor the given pids) is left: a zombie
    counts, so a worker its trainer never reaped shows."""
    deadline = time.time() + timeout
    left = None
    while time.time() < deadline:
        left = job_processes(smeltd, job_id)
        left.update({p: ("zombie or running", None) for p in pids if smelt_pid(p)})
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError("processes of job %s left after it ended: %s" % (job_id, left))
