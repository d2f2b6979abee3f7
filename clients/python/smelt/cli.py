"""The ``smelt`` command line: files, jobs, models, schedules, the cluster and API keys of
one smeltd, through smelt.Client.

Exit statuses: 0 success (``jobs follow``: the job succeeded); 1 an error from the API or
the connection (the server's message and param on one line of stderr); 2 a usage error
(argparse); ``jobs follow`` / ``jobs create --follow``: 3 the job failed, 4 it was
cancelled, 5 ``--timeout`` passed before it ended; 130 interrupted (Ctrl-C)."""
import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from ._errors import APIError, APIStatusError, SmeltError
from ._version import __version__
from .client import Client
from .methods import METHOD_TYPES
from .types import TERMINAL_STATUSES, JobEvent

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_JOB_FAILED", "EXIT_JOB_CANCELLED",
           "EXIT_TIMEOUT", "EXIT_INTERRUPTED", "bash_completion"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_JOB_FAILED = 3
EXIT_JOB_CANCELLED = 4
EXIT_TIMEOUT = 5
EXIT_INTERRUPTED = 130

Handler = Callable[[Client, argparse.Namespace], int]


# ---------------------------------------------------------------- output

def _out(args: argparse.Namespace, value: Any, text: Optional[str] = None) -> None:
    """Prints value as JSON with --json, else text (or the JSON, indented, when no text)."""
    if getattr(args, "json", False):
        print(json.dumps(value, indent=2, sort_keys=False))
    elif text is not None:
        if text:
            print(text)
    else:
        print(json.dumps(value, indent=2))


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or ts <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _table(rows: List[List[str]], header: List[str]) -> str:
    if not rows:
        return "(none)"
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _s(v: Any) -> str:
    return "-" if v is None else str(v)


def _load_json_arg(value: str, what: str) -> Any:
    """A JSON value given inline, or @FILE / a path to a JSON file."""
    text = value
    path = value[1:] if value.startswith("@") else value
    if value.startswith("@") or (not value.lstrip().startswith(("{", "[")) and os.path.isfile(path)):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise SmeltError("%s: cannot read %s: %s" % (what, path, e.strerror))
    try:
        return json.loads(text)
    except ValueError as e:
        raise SmeltError("%s: not JSON: %s" % (what, e))


def _kv(items: Optional[List[str]], what: str) -> Dict[str, Any]:
    """KEY=VALUE pairs, each value read as JSON when it is JSON (3, 0.1, true, "x", {...})
    and as a string otherwise; dotted keys make nested objects."""
    out: Dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SmeltError("%s: KEY=VALUE is expected, got %r" % (what, item))
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise SmeltError("%s: %s is both a value and an object" % (what, key))
            node = child
        node[parts[-1]] = value
    return out


def _merge(dst: Dict[str, Any], src: Dict[str, Any]) -> Dict[str, Any]:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
    return dst


# ---------------------------------------------------------------- files

def _file_row(f: Dict[str, Any]) -> List[str]:
    v = f.get("validation") or {}
    return [_s(f.get("id")), _s(f.get("filename")), _s(f.get("bytes")), _s(f.get("status")), _s(v.get("kind")),
            _s(v.get("examples")), _s(v.get("errors_total")), _when(f.get("created_at"))]


FILE_HEADER = ["ID", "FILENAME", "BYTES", "STATUS", "KIND", "EXAMPLES", "ERRORS", "CREATED"]


def _upload(client: Client, path: str, purpose: str, show_progress: bool) -> Dict[str, Any]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(sent: int, total: int) -> None:
        now = time.monotonic()
        if sent < total and now - last[0] < 0.2:
            return
        last[0] = now
        pct = 100.0 * sent / total if total else 100.0
        line = "uploading %s: %d/%d bytes (%.0f%%)" % (os.path.basename(path), sent, total, pct)
        sys.stderr.write(("\r" + line + ("\n" if sent >= total else "")) if tty else line + "\n")
        sys.stderr.flush()

    f = client.files.upload(path, purpose=purpose, progress=progress if show_progress else None)
    return dict(f)


def cmd_files_upload(client: Client, args: argparse.Namespace) -> int:
    f = _upload(client, args.path, args.purpose, not args.no_progress and not args.json)
    text = _table([_file_row(f)], FILE_HEADER)
    errors = (f.get("validation") or {}).get("errors") or []
    for e in errors:
        text += "\n  line %s: %s: %s" % (e.get("line"), e.get("field"), e.get("message"))
    _out(args, f, text)
    return EXIT_OK if f.get("status") != "error" else EXIT_ERROR


def cmd_files_list(client: Client, args: argparse.Namespace) -> int:
    page = client.files.list(purpose=args.purpose, limit=args.limit)
    files = [dict(f) for f in (page if args.all else page.data)]
    _out(args, files, _table([_file_row(f) for f in files], FILE_HEADER))
    return EXIT_OK


def cmd_files_get(client: Client, args: argparse.Namespace) -> int:
    _out(args, client.files.retrieve(args.file_id))
    return EXIT_OK


def cmd_files_content(client: Client, args: argparse.Namespace) -> int:
    data = client.files.content(args.file_id)
    if args.output and args.output != "-":
        with open(args.output, "wb") as f:
            f.write(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return EXIT_OK


def cmd_files_rm(client: Client, args: argparse.Namespace) -> int:
    r = client.files.delete(args.file_id)
    _out(args, r, "deleted %s" % r.get("id"))
    return EXIT_OK


# ---------------------------------------------------------------- jobs

def _job_row(j: Dict[str, Any]) -> List[str]:
    method = (j.get("method") or {}).get("type") or "supervised"
    return [_s(j.get("id")), _s(j.get("status")), method, _s(j.get("model")), _s(j.get("fine_tuned_model")),
            _when(j.get("created_at"))]


JOB_HEADER = ["ID", "STATUS", "METHOD", "MODEL", "FINE_TUNED_MODEL", "CREATED"]


def _file_arg(client: Client, value: Optional[str], as_json: bool) -> Optional[str]:
    """A file id, or a local path that is uploaded first."""
    if value is None or value.startswith("file-") or not os.path.isfile(value):
        return value
    f = _upload(client, value, "fine-tune", not as_json)
    if f.get("status") == "error":
        errs = (f.get("validation") or {}).get("errors") or [{}]
        raise SmeltError("%s: invalid rows (%s), line %s: %s" % (value, f.get("id"), errs[0].get("line"),
                                                                   errs[0].get("message")))
    return str(f["id"])


def _job_body(client: Client, args: argparse.Namespace) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if args.spec:
        spec = _load_json_arg(args.spec, "--spec")
        if not isinstance(spec, dict):
            raise SmeltError("--spec: a JSON object (a job create body) is expected")
        body = spec
    for flag, key in (("model", "model"), ("suffix", "suffix"), ("seed", "seed"), ("model_init", "model_init"),
                      ("priority", "priority"), ("chat_template", "chat_template")):
        if getattr(args, flag) is not None:
            body[key] = getattr(args, flag)
    if args.training_file is not None:
        body["training_file"] = _file_arg(client, args.training_file, args.json)
    if args.validation_file is not None:
        body["validation_file"] = _file_arg(client, args.validation_file, args.json)
    hp: Dict[str, Any] = {}
    for flag, key in (("epochs", "n_epochs"), ("batch_size", "batch_size"),
                      ("learning_rate_multiplier", "learning_rate_multiplier"), ("learning_rate", "learning_rate"),
                      ("max_steps", "max_steps"), ("beta", "beta")):
        if getattr(args, flag) is not None:
            hp[key] = getattr(args, flag)
    hp.update(_kv(args.hp, "--hp"))
    method_type = args.method
    if method_type is None and isinstance(body.get("method"), dict):
        method_type = body["method"].get("type")
    if method_type is None and (args.reward or args.grader):
        raise SmeltError("--reward and --grader need --method grpo, ppo or reinforcement")
    if method_type is not None:
        method = body.get("method") if isinstance(body.get("method"), dict) else {}
        assert isinstance(method, dict)
        if method.get("type") not in (None, method_type):
            method = {}
        method["type"] = method_type
        block = method.get(method_type) if isinstance(method.get(method_type), dict) else {}
        assert isinstance(block, dict)
        if hp:
            block["hyperparameters"] = _merge(dict(block.get("hyperparameters") or {}), hp)
        if args.reward:
            if method_type not in ("grpo", "ppo"):
                raise SmeltError("--reward is for --method grpo or ppo")
            block["reward"] = _load_json_arg(args.reward, "--reward")
        if args.grader:
            if method_type != "reinforcement":
                raise SmeltError("--grader is for --method reinforcement")
            block["grader"] = _load_json_arg(args.grader, "--grader")
        method[method_type] = block
        body["method"] = method
    elif hp:
        body["hyperparameters"] = _merge(dict(body.get("hyperparameters") or {}), hp)
    if args.lora_rank is not None or args.lora_alpha is not None:
        lora = dict(body.get("lora") or {})
        if args.lora_rank is not None:
            lora["rank"] = args.lora_rank
        if args.lora_alpha is not None:
            lora["alpha"] = args.lora_alpha
        body["lora"] = lora
    if args.devices is not None:
        body["resources"] = {"devices": args.devices}
    if args.max_seq_len is not None:
        body.setdefault("data", {})["max_seq_len"] = args.max_seq_len
    if args.metadata:
        body["metadata"] = {k: str(v) for k, v in _kv(args.metadata, "--metadata").items()}
    _merge(body, _kv(args.set, "--set"))
    for required in ("model", "training_file"):
        if not body.get(required):
            raise SmeltError("--%s (or the --spec body's %s) is required" % (required.replace("_", "-"), required))
    return body


def cmd_jobs_create(client: Client, args: argparse.Namespace) -> int:
    body = _job_body(client, args)
    if args.dry_run:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    job = client.jobs.create_from_spec(body, idempotency_key=args.idempotency_key)
    if args.follow:
        if not args.json:
            print("created %s (%s)" % (job.get("id"), job.get("status")))
        return _follow(client, str(job["id"]), args)
    _out(args, job, _table([_job_row(dict(job))], JOB_HEADER))
    return EXIT_OK


def cmd_jobs_list(client: Client, args: argparse.Namespace) -> int:
    page = client.jobs.list(limit=args.limit, status=args.status)
    jobs = [dict(j) for j in (page if args.all else page.data)]
    _out(args, jobs, _table([_job_row(j) for j in jobs], JOB_HEADER))
    return EXIT_OK


def _job_text(j: Dict[str, Any]) -> str:
    lines = ["%-17s %s" % (k + ":", _s(j.get(k))) for k in
             ("id", "status", "model", "fine_tuned_model", "training_file", "validation_file", "trained_tokens",
              "agent", "attempt")]
    lines.insert(3, "%-17s %s" % ("method:", (j.get("method") or {}).get("type") or "supervised"))
    lines.append("%-17s %s" % ("created_at:", _when(j.get("created_at"))))
    lines.append("%-17s %s" % ("finished_at:", _when(j.get("finished_at"))))
    err = j.get("error")
    if isinstance(err, dict) and err.get("message"):
        lines.append("%-17s %s%s" % ("error:", err.get("message"), " (param: %s)" % err["param"]
                                     if err.get("param") else ""))
    return "\n".join(lines)


def cmd_jobs_get(client: Client, args: argparse.Namespace) -> int:
    job = dict(client.jobs.retrieve(args.job_id))
    _out(args, job, _job_text(job))
    return EXIT_OK


def _state(action: str) -> Handler:
    def run(client: Client, args: argparse.Namespace) -> int:
        job = dict(getattr(client.jobs, action)(args.job_id))
        _out(args, job, "%s: %s" % (job.get("id"), job.get("status")))
        return EXIT_OK
    return run


def cmd_jobs_logs(client: Client, args: argparse.Namespace) -> int:
    text = client.jobs.logs(args.job_id, tail=args.tail)
    _out(args, {"job_id": args.job_id, "logs": text}, text.rstrip("\n"))
    return EXIT_OK


def cmd_jobs_metrics(client: Client, args: argparse.Namespace) -> int:
    page = client.jobs.metrics(args.job_id, limit=args.limit)
    rows: List[Dict[str, Any]] = [dict(r) for r in page]
    lines = []
    for r in rows:
        line: Dict[str, Any] = {"type": r.get("type"), "step": r.get("step")}
        line.update(r.get("data") or {})
        lines.append(json.dumps(line))
    text = "\n".join(lines)
    _out(args, rows, text or "(none)")
    return EXIT_OK


def cmd_jobs_events(client: Client, args: argparse.Namespace) -> int:
    page = client.jobs.events(args.job_id, limit=args.limit)
    events = [dict(e) for e in (page if args.all else page.data)]
    events.reverse()
    _out(args, events, "\n".join(_event_line(e) for e in events) or "(none)")
    return EXIT_OK


def cmd_jobs_checkpoints(client: Client, args: argparse.Namespace) -> int:
    cps = [dict(c) for c in client.jobs.checkpoints(args.job_id)]
    _out(args, cps, _table([[_s(c.get("id")), _s(c.get("step_number")), _s(c.get("fine_tuned_model_checkpoint")),
                             _when(c.get("created_at"))] for c in cps], ["ID", "STEP", "CHECKPOINT", "CREATED"]))
    return EXIT_OK


def _event_line(e: Dict[str, Any]) -> str:
    level = str(e.get("level") or "info")
    return "%s %-5s %s" % (time.strftime("%H:%M:%S", time.localtime(e.get("created_at") or 0)), level,
                           e.get("message") or "")


class Progress:
    """The follow command's progress line: steps done/total, ETA, last loss or reward."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.first: Optional[tuple] = None  # type: ignore[type-arg]
        self.step = 0
        self.total = 0
        self.loss: Optional[float] = None
        self.reward: Optional[float] = None
        self.shown = False

    def update(self, event: JobEvent) -> None:
        """Takes a metrics event's numbers and redraws the line."""
        data = event.get("data") or {}
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            return
        if not isinstance(data.get("total_steps"), int) and "train_loss" not in data and "reward" not in data:
            return
        self.step = data["step"]
        if isinstance(data.get("total_steps"), int):
            self.total = data["total_steps"]
        if isinstance(data.get("train_loss"), (int, float)):
            self.loss = float(data["train_loss"])
        if isinstance(data.get("reward"), (int, float)):
            self.reward = float(data["reward"])
        now = time.monotonic()
        if self.first is None:
            self.first = (now, self.step)
        self.draw(now)

    def line(self, now: float) -> str:
        """The progress line's text."""
        parts = ["step %d/%s" % (self.step, self.total or "?")]
        if self.total:
            parts[0] += " (%d%%)" % (100 * self.step // self.total)
        eta = "?"
        if self.first and self.total and self.step > self.first[1]:
            rate = (now - self.first[0]) / (self.step - self.first[1])
            eta = "%ds" % round(rate * max(0, self.total - self.step))
        elif self.total and self.step >= self.total:
            eta = "0s"
        parts.append("ETA " + eta)
        if self.reward is not None:
            parts.append("reward %.4f" % self.reward)
        if self.loss is not None:
            parts.append("loss %.4f" % self.loss)
        return "progress: " + ", ".join(parts)

    def draw(self, now: float) -> None:
        """Writes the line: in place on a terminal, as a new line otherwise."""
        if self.tty:
            self.stream.write("\r\033[K" + self.line(now))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Removes the in-place line before other output (terminal only)."""
        if self.tty and self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


class _PastDeadline(Exception):
    """follow's --timeout passed while the stream was quiet."""


def _follow(client: Client, job_id: str, args: argparse.Namespace) -> int:
    deadline = None if not getattr(args, "timeout", None) else time.monotonic() + float(args.timeout)
    progress = Progress(sys.stderr)
    as_json = bool(getattr(args, "json", False))
    # beyond smeltd's 15-s keep-alive: a stream quiet longer than that is reopened
    # (Last-Event-ID); with --timeout, short enough to notice the deadline
    read_timeout = 20.0 if deadline is None else min(20.0, max(0.5, deadline - time.monotonic()))
    def check_deadline(_failures: int, _error: BaseException) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise _PastDeadline()

    try:
        for event in client.jobs.stream_events(job_id, read_timeout=read_timeout, on_reconnect=check_deadline):
            if as_json:
                print(json.dumps(event), flush=True)
            else:
                progress.clear()
                print(_event_line(dict(event)), flush=True)
            if event.get("type") == "metrics" and not as_json:
                progress.update(event)
            if deadline is not None and time.monotonic() > deadline:
                break
    except _PastDeadline:
        pass
    if progress.tty and progress.shown:
        sys.stderr.write("\n")
    job = client.jobs.retrieve(job_id)
    status = job.get("status")
    if status not in TERMINAL_STATUSES and deadline is not None:
        # the stream ends once the worker is gone; a job still running here ran out of time
        try:
            job = client.jobs.wait(job_id, timeout=max(0.0, deadline - time.monotonic()), poll_interval=0.5)
        except SmeltError:
            sys.stderr.write("smelt: job %s is still %s after --timeout %s s\n" % (job_id, status, args.timeout))
            return EXIT_TIMEOUT
    elif status not in TERMINAL_STATUSES:
        job = client.jobs.wait(job_id, poll_interval=0.5)
    status = job.get("status")
    if as_json:
        print(json.dumps({"object": "smelt.follow.result", "job": job}))
    else:
        summary = "job %s %s" % (job_id, status)
        if job.get("fine_tuned_model"):
            summary += ": %s" % job["fine_tuned_model"]
        err = job.get("error")
        if isinstance(err, dict) and err.get("message"):
            summary += ": %s" % " ".join(str(err["message"]).split())
        print(summary)
    return {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_CANCELLED}.get(
        str(status), EXIT_ERROR)


def cmd_jobs_follow(client: Client, args: argparse.Namespace) -> int:
    return _follow(client, args.job_id, args)


# ---------------------------------------------------------------- models, schedules, cluster, keys

def cmd_models_list(client: Client, args: argparse.Namespace) -> int:
    models = [dict(m) for m in client.models.list()]
    _out(args, models, _table([[_s(m.get("id")), _s(m.get("kind")), _s(m.get("head")), _s(m.get("base_model")),
                                _s(m.get("fine_tuning_job_id"))] for m in models],
                              ["ID", "KIND", "HEAD", "BASE_MODEL", "JOB"]))
    return EXIT_OK


def cmd_models_get(client: Client, args: argparse.Namespace) -> int:
    _out(args, client.models.retrieve(args.model))
    return EXIT_OK


def _schedule_row(s: Dict[str, Any]) -> List[str]:
    return [_s(s.get("id")), _s(s.get("name")), _s(s.get("cron")), _s(s.get("concurrency_policy")),
            "yes" if s.get("suspended") else "no", _when(s.get("next_run_at")), _when(s.get("last_run_at"))]


SCHEDULE_HEADER = ["ID", "NAME", "CRON", "POLICY", "SUSPENDED", "NEXT_RUN", "LAST_RUN"]


def cmd_schedules_create(client: Client, args: argparse.Namespace) -> int:
    job = _load_json_arg(args.job, "--job")
    if not isinstance(job, dict):
        raise SmeltError("--job: a JSON object (a job create body) is expected")
    s = dict(client.schedules.create(args.cron, job, name=args.name, concurrency_policy=args.concurrency_policy,
                                     suspended=True if args.suspended else None))
    _out(args, s, _table([_schedule_row(s)], SCHEDULE_HEADER))
    return EXIT_OK


def cmd_schedules_list(client: Client, args: argparse.Namespace) -> int:
    rows = [dict(s) for s in client.schedules.list()]
    _out(args, rows, _table([_schedule_row(s) for s in rows], SCHEDULE_HEADER))
    return EXIT_OK


def cmd_schedules_get(client: Client, args: argparse.Namespace) -> int:
    _out(args, client.schedules.retrieve(args.schedule_id))
    return EXIT_OK


def cmd_schedules_rm(client: Client, args: argparse.Namespace) -> int:
    r = client.schedules.delete(args.schedule_id)
    _out(args, r, "deleted %s" % r.get("id", args.schedule_id))
    return EXIT_OK


def cmd_schedules_trigger(client: Client, args: argparse.Namespace) -> int:
    run = dict(client.schedules.trigger(args.schedule_id))
    _out(args, run, "%s: %s %s%s" % (args.schedule_id, run.get("outcome"), _s(run.get("job_id")),
                                     " (%s)" % run["message"] if run.get("message") else ""))
    return EXIT_OK


def cmd_schedules_runs(client: Client, args: argparse.Namespace) -> int:
    runs = [dict(r) for r in client.schedules.runs(args.schedule_id, limit=args.limit).data]
    _out(args, runs, _table([[_s(r.get("id")), _when(r.get("fired_at")), _s(r.get("trigger")), _s(r.get("outcome")),
                              _s(r.get("job_id")), _s(r.get("message"))] for r in runs],
                            ["ID", "FIRED", "TRIGGER", "OUTCOME", "JOB", "MESSAGE"]))
    return EXIT_OK


def cmd_cluster(client: Client, args: argparse.Namespace) -> int:
    c: Dict[str, Any] = dict(client.cluster.retrieve())
    lines = ["agents (%s):" % c.get("agents_security", "?")]
    for a in c.get("agents") or []:
        lines.append("  %s  %s  %s  last seen %s" % (a.get("id"), a.get("hostname"), a.get("status"),
                                                    _when(a.get("last_seen"))))
        for d in a.get("devices") or []:
            lines.append("    %s:%s  %s  %s%s" % (d.get("kind"), d.get("index"), d.get("name"), d.get("state"),
                                                 "  " + d["job_id"] if d.get("job_id") else ""))
    queue = c.get("queue") or []
    lines.append("queue: %d job(s)" % len(queue))
    for q in queue:
        lines.append("  %s. %s  priority %s  %s device(s)  waiting %ss  %s" % (
            q.get("position"), q.get("job_id") or "(another project)", q.get("priority"), q.get("devices_wanted"),
            q.get("waiting_seconds"), q.get("reason") or ""))
    _out(args, c, "\n".join(lines))
    return EXIT_OK


def cmd_keys_create(client: Client, args: argparse.Namespace) -> int:
    k = dict(client.api_keys.create(args.project, name=args.name, admin=True if args.admin else None))
    _out(args, k, "%s\n(key %s of project %s; it is shown only now)" % (k.get("key"), k.get("id"), k.get("project")))
    return EXIT_OK


def cmd_keys_list(client: Client, args: argparse.Namespace) -> int:
    keys = [dict(k) for k in client.api_keys.list()]
    _out(args, keys, _table([[_s(k.get("id")), _s(k.get("prefix")), _s(k.get("project")), _s(k.get("name")),
                              "yes" if k.get("admin") else "no", "yes" if k.get("revoked") else "no"] for k in keys],
                            ["ID", "PREFIX", "PROJECT", "NAME", "ADMIN", "REVOKED"]))
    return EXIT_OK


def cmd_keys_revoke(client: Client, args: argparse.Namespace) -> int:
    r = dict(client.api_keys.revoke(args.key_id))
    _out(args, r, "revoked key %s" % r.get("id", args.key_id))
    return EXIT_OK


# ---------------------------------------------------------------- completion

def _commands(parser: argparse.ArgumentParser) -> Dict[str, Any]:
    """The command tree: {name: subtree or list of options}."""
    out: Dict[str, Any] = {}
    for action in parser._actions:  # argparse keeps its actions here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = _commands(sub)
    if not out:
        return {"": sorted(o for a in parser._actions for o in a.option_strings)}
    return out


def bash_completion(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for the command tree of parser."""
    tree = _commands(parser)
    top_opts = sorted(o for a in parser._actions for o in a.option_strings)
    cases = []
    for group, sub in sorted(tree.items()):
        if "" in sub:
            cases.append('        "%s") words="%s" ;;' % (group, " ".join(sub[""])))
            continue
        cases.append('        "%s") words="%s" ;;' % (group, " ".join(sorted(sub))))
        for name, leaf in sorted(sub.items()):
            cases.append('        "%s %s") words="%s" ;;' % (group, name, " ".join(leaf.get("", []))))
    return """# bash completion for smelt (smelt completion bash > /etc/bash_completion.d/smelt,
# or: source <(smelt completion bash))
_smelt() {
    local cur path word i
    cur="${COMP_WORDS[COMP_CWORD]}"
    path=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        case "$word" in
            -*) ;;
            *) if [ -z "$path" ]; then path="$word"; elif [[ "$path" != *" "* ]]; then path="$path $word"; fi ;;
        esac
    done
    local words
    case "$path" in
        "") words="%s %s" ;;
%s
        *) words="" ;;
    esac
    if [[ "$cur" == -* || -n "$words" ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
    if [ ${#COMPREPLY[@]} -eq 0 ]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -F _smelt smelt
""" % (" ".join(sorted(tree)), " ".join(top_opts), "\n".join(cases))


def cmd_completion(client: Optional[Client], args: argparse.Namespace) -> int:
    print(bash_completion(build_parser()), end="")
    return EXIT_OK


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the smelt command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the API's JSON instead of text")

    p = argparse.ArgumentParser(
        prog="smelt", description="The command line of smeltd (smelt's fine-tuning and RLHF service).",
        epilog="Exit statuses: 0 ok; 1 an API or connection error (message on stderr); 2 usage; "
               "jobs follow: 0 succeeded, 3 failed, 4 cancelled, 5 --timeout passed; 130 interrupted.")
    p.add_argument("--version", action="version", version="smelt " + __version__)
    p.add_argument("--base-url", help="smeltd's URL ($SMELT_BASE_URL, default http://127.0.0.1:8700)")
    p.add_argument("--api-key", help="the API key ($SMELT_API_KEY, default: the contents of ./var/admin_key)")
    p.add_argument("--timeout-s", type=float, default=60.0, metavar="SECONDS", help="per request (default 60)")
    p.add_argument("--max-retries", type=int, default=2, help="retries after 429/5xx or a broken connection")
    p.add_argument("--json", action="store_true", default=False, help="print the API's JSON instead of text")
    top = p.add_subparsers(dest="group", metavar="COMMAND", required=True)

    def leaf(sub: Any, name: str, handler: Callable[..., int], help: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, parents=[common])
        q.set_defaults(handler=handler)
        return q

    # files
    files = top.add_parser("files", help="upload, list, show and delete files").add_subparsers(
        dest="command", metavar="COMMAND", required=True)
    q = leaf(files, "upload", cmd_files_upload, "upload a JSONL file (validated at once)")
    q.add_argument("path")
    q.add_argument("--purpose", default="fine-tune")
    q.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    q = leaf(files, "list", cmd_files_list, "list the project's files, newest first")
    q.add_argument("--purpose")
    q.add_argument("--limit", type=int)
    q.add_argument("--all", action="store_true", help="every page")
    q = leaf(files, "get", cmd_files_get, "show a file and its validation report")
    q.add_argument("file_id")
    q = leaf(files, "content", cmd_files_content, "write a file's bytes to stdout or -o FILE")
    q.add_argument("file_id")
    q.add_argument("-o", "--output")
    q = leaf(files, "rm", cmd_files_rm, "delete a file")
    q.add_argument("file_id")

    # jobs
    jobs = top.add_parser("jobs", help="create, list, follow and steer fine-tuning jobs").add_subparsers(
        dest="command", metavar="COMMAND", required=True)
    q = leaf(jobs, "create", cmd_jobs_create, "create a job from flags, or from --spec FILE (a JSON body) "
             "with flags over it")
    q.add_argument("--spec", help="a job create body: a JSON file, @FILE or inline JSON")
    q.add_argument("--model", help="a base model or an earlier job's fine_tuned_model")
    q.add_argument("--training-file", "-t", help="a file id, or a local path to upload first")
    q.add_argument("--validation-file", "-v", help="a file id, or a local path to upload first")
    q.add_argument("--method", choices=METHOD_TYPES, help="default supervised")
    q.add_argument("--epochs", type=int, help="n_epochs")
    q.add_argument("--batch-size", type=int)
    q.add_argument("--learning-rate-multiplier", type=float)
    q.add_argument("--learning-rate", type=float)
    q.add_argument("--max-steps", type=int)
    q.add_argument("--beta", type=float, help="dpo's beta (or the RL methods')")
    q.add_argument("--hp", action="append", metavar="KEY=VALUE",
                   help="any hyperparameter by name (value read as JSON when it is JSON); repeatable")
    q.add_argument("--reward", help="grpo/ppo: the reward spec (JSON, @FILE or a file)")
    q.add_argument("--grader", help="reinforcement: the grader (JSON, @FILE or a file)")
    q.add_argument("--lora-rank", type=int)
    q.add_argument("--lora-alpha", type=float)
    q.add_argument("--devices", type=int, help="trainer ranks (resources.devices)")
    q.add_argument("--max-seq-len", type=int, help="data.max_seq_len")
    q.add_argument("--model-init", choices=["random"], help="random: initialise the base model randomly")
    q.add_argument("--chat-template")
    q.add_argument("--suffix")
    q.add_argument("--seed", type=int)
    q.add_argument("--priority", type=int)
    q.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    q.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="any body field by dotted path (checkpoint.every_steps=10); repeatable")
    q.add_argument("--idempotency-key", help="default: one made for this command")
    q.add_argument("--follow", "-f", action="store_true", help="then follow it as `jobs follow` does")
    q.add_argument("--timeout", type=float, help="with --follow: give up after SECONDS (exit 5)")
    q.add_argument("--dry-run", action="store_true", help="print the body and send nothing")
    q = leaf(jobs, "list", cmd_jobs_list, "list jobs, newest first")
    q.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled", "paused"])
    q.add_argument("--limit", type=int)
    q.add_argument("--all", action="store_true", help="every page")
    for name, handler, text in (("get", cmd_jobs_get, "show a job"), ("cancel", _state("cancel"), "cancel a job"),
                                ("pause", _state("pause"), "pause a job (its worker checkpoints)"),
                                ("resume", _state("resume"), "resume a paused job"),
                                ("checkpoints", cmd_jobs_checkpoints, "list a job's checkpoints")):
        q = leaf(jobs, name, handler, text)
        q.add_argument("job_id")
    q = leaf(jobs, "follow", cmd_jobs_follow, "print a job's events live with a progress line until it ends; "
             "exit 0 succeeded, 3 failed, 4 cancelled, 5 --timeout")
    q.add_argument("job_id")
    q.add_argument("--timeout", type=float, help="give up after SECONDS (exit 5)")
    q = leaf(jobs, "events", cmd_jobs_events, "print a job's events, oldest first")
    q.add_argument("job_id")
    q.add_argument("--limit", type=int)
    q.add_argument("--all", action="store_true", help="every page")
    q = leaf(jobs, "logs", cmd_jobs_logs, "print the end of the worker's output")
    q.add_argument("job_id")
    q.add_argument("--tail", type=int, metavar="BYTES")
    q = leaf(jobs, "metrics", cmd_jobs_metrics, "print the trainer's metrics lines")
    q.add_argument("job_id")
    q.add_argument("--limit", type=int)

    # models
    models = top.add_parser("models", help="list models").add_subparsers(dest="command", metavar="COMMAND",
                                                                         required=True)
    leaf(models, "list", cmd_models_list, "list base models and job outputs")
    q = leaf(models, "get", cmd_models_get, "show a model")
    q.add_argument("model")

    # schedules
    sched = top.add_parser("schedules", help="cron schedules of jobs").add_subparsers(
        dest="command", metavar="COMMAND", required=True)
    q = leaf(sched, "create", cmd_schedules_create, "create a schedule")
    q.add_argument("--cron", required=True, help="five fields, UTC, or @hourly-style")
    q.add_argument("--job", required=True, help="the job create body: a JSON file, @FILE or inline JSON")
    q.add_argument("--name")
    q.add_argument("--concurrency-policy", choices=["allow", "forbid", "replace"])
    q.add_argument("--suspended", action="store_true")
    leaf(sched, "list", cmd_schedules_list, "list schedules")
    for name, handler, text in (("get", cmd_schedules_get, "show a schedule"),
                                ("rm", cmd_schedules_rm, "delete a schedule"),
                                ("trigger", cmd_schedules_trigger, "fire a schedule now")):
        q = leaf(sched, name, handler, text)
        q.add_argument("schedule_id")
    q = leaf(sched, "runs", cmd_schedules_runs, "a schedule's firings, newest first")
    q.add_argument("schedule_id")
    q.add_argument("--limit", type=int)

    # cluster
    leaf(top, "cluster", cmd_cluster, "agents, devices and the queue")

    # keys
    keys = top.add_parser("keys", help="API keys (admin keys only)").add_subparsers(
        dest="command", metavar="COMMAND", required=True)
    q = leaf(keys, "create", cmd_keys_create, "create a key of a project (made if new)")
    q.add_argument("--project", required=True)
    q.add_argument("--name")
    q.add_argument("--admin", action="store_true")
    leaf(keys, "list", cmd_keys_list, "list keys (never their text)")
    q = leaf(keys, "revoke", cmd_keys_revoke, "revoke a key")
    q.add_argument("key_id")

    # completion
    comp = top.add_parser("completion", help="print a shell completion script").add_subparsers(
        dest="command", metavar="SHELL", required=True)
    leaf(comp, "bash", cmd_completion, "bash: source <(smelt completion bash)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the smelt command; returns its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        if args.group == "completion":
            return cmd_completion(None, args)
        client = Client(args.base_url, args.api_key, timeout=args.timeout_s, max_retries=args.max_retries)
        result: int = handler(client, args)
        return result
    except APIError as e:
        parts = ["smelt: error:"]
        if isinstance(e, APIStatusError):
            parts.append("%d" % e.status_code)
        parts.append(" ".join(e.message.split()))
        if e.param:
            parts.append("(param: %s)" % e.param)
        if e.code:
            parts.append("[%s]" % e.code)
        sys.stderr.write(" ".join(parts) + "\n")
        return EXIT_ERROR
    except SmeltError as e:
        sys.stderr.write("smelt: error: %s\n" % " ".join(str(e).split()))
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except ValueError as e:
        sys.stderr.write("smelt: error: %s\n" % e)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
